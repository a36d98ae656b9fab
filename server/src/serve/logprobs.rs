//! The OpenAI shapes of log-probabilities, from the decode loop's [`TokenEntry`]s: chat's
//! `logprobs = {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}],
//! "refusal": null}` and the legacy completions' `logprobs = {tokens, token_logprobs,
//! top_logprobs: [{token: logprob}], text_offset}` (OpenAI API reference, Chat Completions and
//! Completions objects).
//!
//! The values are the model's raw distribution (`log_softmax` of the logits, before temperature,
//! penalties or truncation; `aubier_runtime::sampler::token_logprobs`). JSON has no −∞: a token of
//! probability 0 gets [`UNLIKELY`], the value OpenAI documents for that case (vLLM clamps the
//! same way). A token's `token` string is its text when its bytes are valid UTF-8, else `bytes:`
//! and `\xHH` per byte (OpenAI's form for a token holding part of a character); `bytes` has the
//! exact bytes; a control token is its text (`[THINK]`). The legacy `top_logprobs` map holds the
//! `k` most likely tokens plus the sampled one when it is not among them (up to `k + 1`, as the
//! OpenAI reference says and vLLM does), most likely first.

use super::api::response::{ChatLogprobs, ChatTokenLogprob, ChatTopLogprob, CompletionLogprobs};
use super::engine::TokenEntry;
use super::text::TextModel;
use serde_json::{Map, Value};
use std::fmt::Write;

/// The log-probability written for a token of probability 0 (OpenAI's "very unlikely").
pub const UNLIKELY: f64 = -9999.0;

fn value(logprob: f64) -> f64 {
    if logprob.is_finite() {
        logprob
    } else {
        UNLIKELY
    }
}

fn bytes(text: &TextModel, id: u32) -> &[u8] {
    text.tokenizer().token_bytes(id).unwrap_or_default()
}

/// The `token` string of a token whose text is `bytes` (module note).
pub fn token_string(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(s) => s.to_owned(),
        Err(_) => bytes.iter().fold("bytes:".to_owned(), |mut s, b| {
            let _ = write!(s, "\\x{b:02x}");
            s
        }),
    }
}

/// The `token` string of token `id` (module note); `/tokenize`'s `token_strs` too.
pub fn token_text(text: &TextModel, id: u32) -> String {
    token_string(bytes(text, id))
}

/// One `{token, logprob, bytes}` object.
fn chat_top(text: &TextModel, id: u32, logprob: f64) -> ChatTopLogprob {
    let b = bytes(text, id);
    ChatTopLogprob {
        token: token_string(b),
        logprob: value(logprob),
        bytes: b.to_vec(),
    }
}

/// The chat `logprobs` object of `entries`.
pub fn chat(text: &TextModel, entries: &[TokenEntry]) -> ChatLogprobs {
    let content = entries
        .iter()
        .map(|e| {
            let ChatTopLogprob {
                token,
                logprob,
                bytes,
            } = chat_top(text, e.id, e.logprobs.logprob);
            ChatTokenLogprob {
                token,
                logprob,
                bytes,
                top_logprobs: e
                    .logprobs
                    .top
                    .iter()
                    .map(|&(id, lp)| chat_top(text, id, lp))
                    .collect(),
            }
        })
        .collect();
    ChatLogprobs {
        content,
        refusal: (),
    }
}

/// The legacy completions `logprobs` object of `entries`.
pub fn completion(text: &TextModel, entries: &[TokenEntry]) -> CompletionLogprobs {
    let tokens: Vec<String> = entries.iter().map(|e| token_text(text, e.id)).collect();
    let top_logprobs = entries
        .iter()
        .zip(&tokens)
        .map(|(e, sampled)| {
            let mut m = Map::new();
            for &(id, lp) in &e.logprobs.top {
                m.insert(token_text(text, id), Value::from(value(lp)));
            }
            if !e.logprobs.top.iter().any(|&(id, _)| id == e.id) {
                m.insert(sampled.clone(), Value::from(value(e.logprobs.logprob)));
            }
            m
        })
        .collect();
    CompletionLogprobs {
        token_logprobs: entries.iter().map(|e| value(e.logprobs.logprob)).collect(),
        top_logprobs,
        text_offset: entries.iter().map(|e| e.text_offset).collect(),
        tokens,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_strings_name_partial_characters_by_their_bytes() {
        assert_eq!(token_string(b" the"), " the");
        assert_eq!(token_string("é".as_bytes()), "é");
        assert_eq!(token_string(&[0xc3]), "bytes:\\xc3");
        assert_eq!(token_string(&[0xe2, 0x80]), "bytes:\\xe2\\x80");
        assert_eq!(value(f64::NEG_INFINITY), UNLIKELY);
        assert_eq!(value(-0.5), -0.5);
    }
}
