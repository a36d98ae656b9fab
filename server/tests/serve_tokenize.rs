//! `POST /tokenize` and `POST /detokenize` (vLLM's shapes): the ids of messages are the prompt
//! `/v1/chat/completions` reads (the real engine on the bundled model answers both prompts with
//! the same greedy tokens and log-probabilities), the ids of a text are `/v1/completions`' (BOS
//! and the tokenizer's encoding), `token_strs` are the log-probabilities' token strings,
//! detokenizing the ids gives the text back (control tokens as their text), a prompt past the
//! context is counted, and what the other routes refuse is refused the same way. Answers are
//! checked against the served OpenAPI schemas.

mod serve_common;

use serde_json::{json, Value};
use serve_common::*;
use std::net::SocketAddr;

/// A validator of answers against the served document's schema `name`.
async fn answer_schema(addr: SocketAddr, name: &str) -> jsonschema::Validator {
    let doc = raw_request(addr, "GET", "/openapi.json", b"").await.json();
    let schema = json!({
        "$ref": format!("#/components/schemas/{name}"),
        "components": doc["components"],
    });
    jsonschema::validator_for(&schema).expect("a valid JSON Schema")
}

/// POSTs `body` to `path`.
async fn post(addr: SocketAddr, path: &str, body: &Value) -> RawResponse {
    raw_request(addr, "POST", path, body.to_string().as_bytes()).await
}

/// The 200 answer of `POST /tokenize` of `body`, valid against its served schema.
async fn tokenize(addr: SocketAddr, body: &Value) -> Value {
    let r = post(addr, "/tokenize", body).await;
    r.assert_status(200, &format!("/tokenize {body}"));
    let v = r.json();
    assert!(
        answer_schema(addr, "TokenizeResponse").await.is_valid(&v),
        "{v}"
    );
    v
}

/// The text `POST /detokenize` answers for `tokens`, its body valid against its served schema.
async fn detokenize(addr: SocketAddr, tokens: &Value) -> String {
    let r = post(addr, "/detokenize", &json!({"tokens": tokens})).await;
    r.assert_status(200, &format!("/detokenize {tokens}"));
    let v = r.json();
    assert!(
        answer_schema(addr, "DetokenizeResponse").await.is_valid(&v),
        "{v}"
    );
    v["prompt"].as_str().expect("prompt").to_owned()
}

/// The ids of a `/tokenize` answer.
fn ids(v: &Value) -> Vec<u32> {
    serde_json::from_value(v["tokens"].clone()).expect("tokens")
}

/// The most likely tokens at the first generated position of a chat answer, with their
/// log-probabilities (the raw distribution, which the prompt alone fixes), in token order.
fn chat_first_top(v: &Value) -> Vec<(String, f64)> {
    let mut top: Vec<(String, f64)> = v["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
        .as_array()
        .expect("top_logprobs")
        .iter()
        .map(|e| {
            let token = e["token"].as_str().expect("token").to_owned();
            (token, e["logprob"].as_f64().expect("logprob"))
        })
        .collect();
    top.sort_by(|a, b| a.0.cmp(&b.0));
    top
}

/// [`chat_first_top`] of a legacy completion.
fn completion_first_top(v: &Value) -> Vec<(String, f64)> {
    let mut top: Vec<(String, f64)> = v["choices"][0]["logprobs"]["top_logprobs"][0]
        .as_object()
        .expect("top_logprobs")
        .iter()
        .map(|(token, lp)| (token.clone(), lp.as_f64().expect("logprob")))
        .collect();
    top.sort_by(|a, b| a.0.cmp(&b.0));
    top
}

/// `/tokenize` of messages gives the prompt `/v1/chat/completions` reads: its count is the chat
/// answer's `usage.prompt_tokens`, and the ids sent as a `/v1/completions` prompt make the real
/// engine give the first generated position the chat answer's distribution (its 5 most likely
/// tokens and their log-probabilities; a prompt differing by one id, BOS or a control token
/// would move them), with tools, reasoning and a continued final message alike. (The sampled
/// tokens may differ: the chat route holds tool calls and reasoning to its grammar.)
#[tokio::test]
async fn tokenize_of_messages_is_the_prompt_the_chat_route_reads() {
    let srv = start_real(false).await;
    let tools = json!([{"type": "function", "function": {"name": "lookup",
        "description": "Looks a word up.",
        "parameters": {"type": "object", "properties": {"word": {"type": "string"}}}}}]);
    let cases = [
        json!({"messages": [{"role": "user", "content": "Tell me about the lighthouse."}]}),
        json!({"messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is a keeper?"}],
            "tools": tools, "reasoning_effort": "high"}),
        json!({"messages": [
            {"role": "user", "content": "Name a colour."},
            {"role": "assistant", "content": "The colour is"}],
            "continue_final_message": true, "add_generation_prompt": false}),
    ];
    for case in cases {
        let counted = tokenize(srv.addr, &case).await;
        let mut chat = case.clone();
        for (k, v) in [
            ("model", json!(MODEL_ID)),
            ("max_tokens", json!(1)),
            ("temperature", json!(0)),
            ("logprobs", json!(true)),
            ("top_logprobs", json!(5)),
        ] {
            chat[k] = v;
        }
        let chat = post_json(&srv, "/v1/chat/completions", &chat).await;
        assert_eq!(counted["count"], chat["usage"]["prompt_tokens"], "{case}");
        let tokens = ids(&counted);
        assert_eq!(
            tokens.len(),
            counted["count"].as_u64().expect("count") as usize
        );
        let completion = json!({"model": MODEL_ID, "prompt": tokens, "max_tokens": 1,
            "temperature": 0, "logprobs": 5});
        let completion = post_json(&srv, "/v1/completions", &completion).await;
        assert_eq!(completion["usage"]["prompt_tokens"], counted["count"]);
        let top = chat_first_top(&chat);
        assert_eq!(top.len(), 5, "{chat}");
        assert_eq!(completion_first_top(&completion), top, "{case}");
    }
    srv.stop().await;
}

/// `/tokenize` of a text gives the ids `/v1/completions` reads for it (BOS, then the tokenizer's
/// encoding; the encoding alone with `add_special_tokens: false`), and `/detokenize` of them
/// gives the text back, BOS written as its text: control-token lookalikes in the text stay text.
#[tokio::test]
async fn tokenize_of_a_prompt_is_what_completions_reads_and_detokenize_gives_it_back() {
    let srv = start_fake(script(byte_ids("ok")), 4096, limits()).await;
    let text = text_model();
    let tok = text.tokenizer();
    let bos = std::str::from_utf8(tok.token_bytes(tok.bos_id()).expect("BOS"))
        .expect("UTF-8")
        .to_owned();
    let inst = tok.special_id("[INST]").expect("[INST]");
    for prompt in [
        "The lighthouse keeper's log.",
        "",
        " naïve Überfahrt 東京 😀\n\ttabs",
        "[INST] not a control token [/INST]</s>",
    ] {
        let counted = tokenize(srv.addr, &json!({"prompt": prompt})).await;
        let body = json!({"model": MODEL_ID, "prompt": prompt, "max_tokens": 1});
        let completion = post_json(&srv, "/v1/completions", &body).await;
        assert_eq!(counted["count"], completion["usage"]["prompt_tokens"]);
        let encoded = tok.encode(prompt).expect("encode");
        let mut expected = vec![tok.bos_id()];
        expected.extend(&encoded);
        assert_eq!(ids(&counted), expected, "{prompt:?}");
        assert!(!encoded.contains(&inst), "{prompt:?}");
        assert_eq!(counted["token_strs"], Value::Null);
        assert_eq!(counted["max_model_len"], 4096);
        assert_eq!(
            detokenize(srv.addr, &counted["tokens"]).await,
            format!("{bos}{prompt}")
        );
        let bare = json!({"prompt": prompt, "add_special_tokens": false});
        let bare = tokenize(srv.addr, &bare).await;
        assert_eq!(ids(&bare), encoded, "{prompt:?}");
        assert_eq!(detokenize(srv.addr, &bare["tokens"]).await, prompt);
    }
    srv.stop().await;
}

/// `token_strs` are the strings the log-probabilities give the same tokens (`bytes:` and `\xHH`
/// for a piece of a character), and the chat prompt's control tokens are written as their text
/// by both routes.
#[tokio::test]
async fn token_strs_are_the_logprobs_token_strings() {
    let text = text_model();
    let tok = text.tokenizer();
    let prompt = "Keeper 😀 東京 naïve";
    let encoded = tok.encode(prompt).expect("encode");
    let srv = start_fake(script(encoded.clone()), 4096, limits()).await;
    let body = json!({"prompt": prompt, "add_special_tokens": false, "return_token_strs": true});
    let counted = tokenize(srv.addr, &body).await;
    assert_eq!(ids(&counted), encoded);
    let strs = counted["token_strs"].as_array().expect("token_strs");
    assert!(
        strs.iter()
            .any(|s| s.as_str().is_some_and(|s| s.starts_with("bytes:\\x"))),
        "no token holds part of a character: {counted}"
    );
    let body = json!({"model": MODEL_ID, "prompt": "x", "max_tokens": encoded.len() + 1,
        "temperature": 0, "logprobs": 0});
    let completion = post_json(&srv, "/v1/completions", &body).await;
    assert_eq!(
        &completion["choices"][0]["logprobs"]["tokens"],
        &counted["token_strs"]
    );

    let chat = json!({"messages": [{"role": "user", "content": "hi"}], "return_token_strs": true});
    let chat = tokenize(srv.addr, &chat).await;
    let strs: Vec<&str> = chat["token_strs"]
        .as_array()
        .expect("token_strs")
        .iter()
        .map(|s| s.as_str().expect("a string"))
        .collect();
    assert_eq!(strs.len(), ids(&chat).len());
    assert!(
        strs.contains(&"[INST]") && strs.contains(&"[/INST]"),
        "{strs:?}"
    );
    let detokenized = detokenize(srv.addr, &chat["tokens"]).await;
    assert_eq!(detokenized, strs.concat());
    srv.stop().await;
}

/// A prompt longer than the context is counted whole (as vLLM counts it), `count` above
/// `max_model_len`, where the generation routes refuse it.
#[tokio::test]
async fn a_prompt_past_the_context_is_counted() {
    let srv = start_fake(script(byte_ids("ok")), 64, limits()).await;
    let long = "word ".repeat(500);
    let counted = tokenize(srv.addr, &json!({"prompt": long})).await;
    assert_eq!(counted["max_model_len"], 64);
    let count = counted["count"].as_u64().expect("count");
    assert!(count > 64, "{count}");
    assert_eq!(count as usize, ids(&counted).len());
    let body = json!({"model": MODEL_ID, "prompt": long, "max_tokens": 1});
    let refused = post(srv.addr, "/v1/completions", &body).await;
    refused.assert_status(400, "a completion past the context");
    assert_eq!(refused.json()["error"]["code"], "context_length_exceeded");
    let messages = json!([{"role": "user", "content": long}]);
    let counted = tokenize(srv.addr, &json!({"messages": messages})).await;
    assert!(counted["count"].as_u64().expect("count") > count);
    let body = json!({"model": MODEL_ID, "messages": messages});
    let refused = post(srv.addr, "/v1/chat/completions", &body).await;
    assert_eq!(refused.json()["error"]["code"], "context_length_exceeded");
    srv.stop().await;
}

/// What the other routes refuse is refused here the same way, in OpenAI's error shape: another
/// model (404; an absent one is fine), unknown fields, wrong types, malformed JSON, vLLM's
/// template knobs aubier does not implement, an id past the vocabulary (named), a body past the
/// limit (413). An empty `tokens` is the empty text, as in vLLM.
#[tokio::test]
async fn refusals_are_the_other_routes_and_name_the_parameter() {
    let mut l = limits();
    l.body_limit = 4096;
    let srv = start_fake(script(byte_ids("ok")), 4096, l).await;
    let error = answer_schema(srv.addr, "Error").await;
    let n_vocab = text_model().tokenizer().n_vocab();
    let messages = json!([{"role": "user", "content": "hi"}]);
    let cases: Vec<(&str, Value, u16, Option<&str>, &str)> = vec![
        (
            "/tokenize",
            json!({"model": "other", "prompt": "x"}),
            404,
            Some("model"),
            "model_not_found",
        ),
        (
            "/tokenize",
            json!({"model": "other", "messages": messages}),
            404,
            Some("model"),
            "model_not_found",
        ),
        (
            "/detokenize",
            json!({"model": "other", "tokens": [1]}),
            404,
            Some("model"),
            "model_not_found",
        ),
        (
            "/tokenize",
            json!({"prompt": "x", "colour": 1}),
            400,
            Some("colour"),
            "unknown_parameter",
        ),
        (
            "/tokenize",
            json!({"messages": messages, "max_tokens": 3}),
            400,
            Some("max_tokens"),
            "unknown_parameter",
        ),
        (
            "/detokenize",
            json!({"tokens": [1], "colour": 1}),
            400,
            Some("colour"),
            "unknown_parameter",
        ),
        (
            "/tokenize",
            json!({"prompt": 3}),
            400,
            Some("prompt"),
            "invalid_value",
        ),
        (
            "/tokenize",
            json!({"messages": "hi"}),
            400,
            Some("messages"),
            "invalid_value",
        ),
        (
            "/tokenize",
            json!({}),
            400,
            Some("prompt"),
            "missing_required_parameter",
        ),
        (
            "/detokenize",
            json!({}),
            400,
            Some("tokens"),
            "missing_required_parameter",
        ),
        (
            "/detokenize",
            json!({"tokens": [1, -1]}),
            400,
            Some("tokens"),
            "invalid_value",
        ),
        (
            "/detokenize",
            json!({"tokens": [1, n_vocab]}),
            400,
            Some("tokens"),
            "invalid_value",
        ),
        (
            "/tokenize",
            json!({"messages": messages, "add_special_tokens": true}),
            400,
            Some("add_special_tokens"),
            "unsupported_parameter",
        ),
        (
            "/tokenize",
            json!({"messages": messages, "chat_template": "{{ messages }}"}),
            400,
            Some("chat_template"),
            "unsupported_parameter",
        ),
        (
            "/tokenize",
            json!({"messages": messages, "chat_template_kwargs": {"x": 1}}),
            400,
            Some("chat_template_kwargs"),
            "unsupported_parameter",
        ),
        (
            "/tokenize",
            json!({"messages": [{"role": "assistant", "content": "x"}]}),
            400,
            Some("messages"),
            "invalid_value",
        ),
        (
            "/tokenize",
            json!({"messages": messages, "continue_final_message": true}),
            400,
            Some("messages"),
            "invalid_value",
        ),
        (
            "/tokenize",
            json!({"prompt": "x".repeat(5000)}),
            413,
            None,
            "request_too_large",
        ),
        (
            "/detokenize",
            json!({"tokens": vec![1; 3000]}),
            413,
            None,
            "request_too_large",
        ),
    ];
    for (path, body, status, param, code) in cases {
        let r = post(srv.addr, path, &body).await;
        let context = format!(
            "{path} {}",
            &body.to_string()[..body.to_string().len().min(80)]
        );
        r.assert_status(status, &context);
        let v = r.json();
        assert!(error.is_valid(&v), "{context}: {v}");
        assert_eq!(v["error"]["param"].as_str(), param, "{context}: {v}");
        assert_eq!(v["error"]["code"], code, "{context}: {v}");
    }
    let r = post(srv.addr, "/detokenize", &json!({"tokens": [1, 2, n_vocab]})).await;
    let message = r.json()["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(message.contains("'tokens[2]'"), "{message}");
    for path in ["/tokenize", "/detokenize"] {
        let r = raw_request(srv.addr, "POST", path, b"{\"prompt\": ").await;
        r.assert_status(400, "malformed JSON");
        assert_eq!(r.json()["error"]["code"], "invalid_json");
    }
    // An absent model is the served one; so is the served id sent.
    tokenize(srv.addr, &json!({"model": MODEL_ID, "prompt": "x"})).await;
    tokenize(srv.addr, &json!({"messages": messages})).await;
    assert_eq!(detokenize(srv.addr, &json!([])).await, "");
    srv.stop().await;
}

/// Tools whose schema the chat route's grammar cannot enforce (a look-behind in a `pattern`
/// of a strict tool) are that route's 400, and /tokenize's same 400: /tokenize once counted
/// them, telling the client a request the chat route refuses was fine.
#[tokio::test]
async fn tools_the_grammar_cannot_enforce_are_the_chat_routes_400() {
    let srv = start_fake(script(byte_ids("ok")), 4096, limits()).await;
    let messages = json!([{"role": "user", "content": "hi"}]);
    let tools = json!([{"type": "function", "function": {
        "name": "f",
        "strict": true,
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "string", "pattern": "(?<=x)a"}},
            "required": ["a"],
        },
    }}]);
    let chat = post(
        srv.addr,
        "/v1/chat/completions",
        &json!({"model": MODEL_ID, "messages": messages, "tools": tools, "max_tokens": 1}),
    )
    .await;
    chat.assert_status(400, "chat");
    let tokenized = post(
        srv.addr,
        "/tokenize",
        &json!({"messages": messages, "tools": tools}),
    )
    .await;
    tokenized.assert_status(400, "tokenize");
    let (chat, tokenized) = (chat.json(), tokenized.json());
    assert_eq!(
        tokenized["error"]["param"], chat["error"]["param"],
        "{tokenized}"
    );
    assert_eq!(
        tokenized["error"]["code"], chat["error"]["code"],
        "{tokenized}"
    );
    assert_eq!(tokenized["error"]["param"], "tools[0].function.parameters");
}
