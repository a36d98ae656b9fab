//! `POST /tokenize` and `POST /detokenize`, as vLLM's OpenAI server has them
//! (`vllm/entrypoints/openai/protocol.py`, `serving_tokenization.py`).
//!
//! - `/tokenize` of `{"prompt": text}` answers the ids `/v1/completions` reads for that string,
//!   built by that route's builder (`text_prompt`: BOS first, unless `add_special_tokens` is
//!   false); of `{"messages": [...], "tools"?, ...}` the ids `/v1/chat/completions` reads for the
//!   same messages, the body validated as that route's ([`params::parse_tokenize`]) and rendered
//!   by its builder (`ChatParams::take_build`), both through [`prompt_ids`]; its tools' grammar
//!   is compiled as that route compiles it, so that a schema it cannot enforce is the same 400.
//!   The answer is `{count, max_model_len, tokens, token_strs}`, `max_model_len` the KV
//!   capacity. As in vLLM, a prompt longer than the context is counted whole (the body limit
//!   bounds the work), not refused: `count` above `max_model_len` tells the client the
//!   generation routes refuse it.
//! - `/detokenize` of `{"tokens": [ids]}` answers `{"prompt": text}`, control tokens written as
//!   their text (`<s>`, `[INST]`), as vLLM's decode with `skip_special_tokens=False` does; an id
//!   not below the vocabulary size is a 400 (`param` `tokens`, the message naming `tokens[i]`).
//!
//! Both check `model` when sent (404 for another), and refuse what the other routes refuse
//! (unknown fields, wrong types) with a 400. Their CPU work (building the prompt, `token_strs`,
//! decoding) runs on the tokenizer pool ([`on_tokenizer`]), off the async workers.

use super::api::response::{DetokenizeResponse, TokenizeResponse};
use super::completions::text_prompt;
use super::error::ApiError;
use super::generation::{
    check_vocab, constraints, on_tokenizer, prompt_ids, BuildPrompt, RequestKind,
};
use super::logprobs::token_text;
use super::params::{self, ChatParams, CompletionParams, TokenizePrompt};
use super::state::AppState;
use axum::extract::{Request, State};
use axum::Json;
use std::sync::Arc;

/// `POST /tokenize` (module note).
///
/// Errors: 400 for a body [`params::parse_tokenize`] refuses, a conversation the chat
/// template refuses, or tools whose schema the chat route's grammar cannot enforce; 404 for
/// another model; 413 past the body limit; 503 when every tokenizer stays busy for
/// `--queue-wait-ms`.
pub(super) async fn tokenize(
    State(app): State<Arc<AppState>>,
    req: Request,
) -> Result<Json<TokenizeResponse>, ApiError> {
    let bytes = app.read_body(req).await?;
    let body_len = bytes.len();
    let request = params::parse_tokenize(&bytes)?;
    drop(bytes);
    if let Some(m) = &request.model {
        app.check_model(m)?;
    }
    let (param, build, grammar): (&str, BuildPrompt, _) = match request.prompt {
        TokenizePrompt::Text { text, bos } => {
            (CompletionParams::PROMPT_PARAM, text_prompt(text, bos), None)
        }
        TokenizePrompt::Chat(mut chat) => {
            let grammar = chat.structured.grammar.take();
            (ChatParams::PROMPT_PARAM, chat.take_build(), grammar)
        }
    };
    let tokens = prompt_ids(&app, param, body_len, usize::MAX, build).await?;
    // Tools whose schema the grammar cannot enforce are the chat route's 400 after the prompt
    // is built: here too.
    constraints(&app, grammar, 1).await?;
    let (tokens, token_strs) = match request.token_strs {
        false => (tokens, None),
        true => {
            on_tokenizer(&app, body_len, move |text| {
                let strs = tokens.iter().map(|&id| token_text(text, id)).collect();
                (tokens, Some(strs))
            })
            .await?
        }
    };
    Ok(Json(TokenizeResponse {
        count: tokens.len(),
        max_model_len: app.engine.kv_max(),
        tokens,
        token_strs,
    }))
}

/// `POST /detokenize` (module note).
///
/// Errors: 400 for a body [`params::parse_detokenize`] refuses or an id not below the
/// vocabulary size; 404 for another model; 413 past the body limit; 503 when every tokenizer
/// stays busy for `--queue-wait-ms`.
pub(super) async fn detokenize(
    State(app): State<Arc<AppState>>,
    req: Request,
) -> Result<Json<DetokenizeResponse>, ApiError> {
    let bytes = app.read_body(req).await?;
    let body_len = bytes.len();
    let request = params::parse_detokenize(&bytes)?;
    drop(bytes);
    if let Some(m) = &request.model {
        app.check_model(m)?;
    }
    check_vocab(&app, "tokens", &request.tokens)?;
    let tokens = request.tokens;
    let prompt = on_tokenizer(&app, body_len, move |text| {
        text.tokenizer().decode_keep_special(&tokens)
    })
    .await?;
    Ok(Json(DetokenizeResponse { prompt }))
}
