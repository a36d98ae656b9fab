//! The server's prompt cache (`--prompt-cache`, on by default) with the real engine on the
//! bundled model (default backend): a second chat request that extends the first conversation,
//! and a completion whose prompt extends the previous one, report
//! `usage.prompt_tokens_details.cached_tokens > 0` (non-stream and in the stream's usage chunk),
//! and so does `/debug/tokens` (`cached_tokens`) for token ids extending the previous ones; a
//! first request and every request with the cache off report 0, and the greedy text of every
//! request is the same with the cache on and off.

mod serve_common;

use serde_json::{json, Value};
use serve_common::*;

/// The usage's `(prompt_tokens, cached_tokens)`.
fn cached(usage: &Value) -> (u64, u64) {
    let prompt = usage["prompt_tokens"].as_u64().expect("prompt_tokens");
    let cached = usage["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or_else(|| panic!("no prompt_tokens_details.cached_tokens: {usage}"));
    assert!(cached < prompt, "{usage}");
    (prompt, cached)
}

/// The stream's text and its usage chunk's `(prompt_tokens, cached_tokens)`.
async fn stream(srv: &TestServer, path: &str, body: &Value, chat: bool) -> (String, (u64, u64)) {
    let mut body = body.clone();
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let events = sse_events(srv.addr, path, &body.to_string()).await;
    let text = if chat {
        chat_stream_text(&events).0
    } else {
        events
            .iter()
            .filter(|e| e.as_str() != "[DONE]")
            .filter_map(|e| {
                let v: Value = serde_json::from_str(e).expect("chunk");
                v["choices"][0]["text"].as_str().map(str::to_owned)
            })
            .collect()
    };
    let usage = events
        .iter()
        .filter(|e| e.as_str() != "[DONE]")
        .map(|e| serde_json::from_str::<Value>(e).expect("chunk"))
        .find(|v| v["usage"].is_object())
        .expect("a usage chunk");
    (text, cached(&usage["usage"]))
}

/// The conversation of the test: per request, its text and `(prompt_tokens, cached_tokens)`.
async fn conversation(prompt_cache: bool) -> Vec<(String, (u64, u64))> {
    let srv = start_real(prompt_cache).await;
    let mut out = Vec::new();
    let user = json!({"role": "user", "content": "Tell me about the lighthouse."});
    let first = json!({
        "model": MODEL_ID, "messages": [user], "max_tokens": 12, "temperature": 0,
    });
    let v = post_json(&srv, "/v1/chat/completions", &first).await;
    let reply = v["choices"][0]["message"]["content"]
        .as_str()
        .expect("content")
        .to_owned();
    out.push((reply.clone(), cached(&v["usage"])));
    let second = json!({
        "model": MODEL_ID,
        "messages": [
            user,
            {"role": "assistant", "content": reply},
            {"role": "user", "content": "And who kept it?"},
        ],
        "max_tokens": 12,
        "temperature": 0,
    });
    let v = post_json(&srv, "/v1/chat/completions", &second).await;
    let text = v["choices"][0]["message"]["content"]
        .as_str()
        .expect("content");
    out.push((text.to_owned(), cached(&v["usage"])));
    out.push(stream(&srv, "/v1/chat/completions", &second, true).await);

    let completion = |prompt: &str| json!({"model": MODEL_ID, "prompt": prompt, "max_tokens": 8, "temperature": 0});
    for prompt in [
        "The old lighthouse",
        "The old lighthouse stood on the cliff",
    ] {
        let v = post_json(&srv, "/v1/completions", &completion(prompt)).await;
        let text = v["choices"][0]["text"].as_str().expect("text");
        out.push((text.to_owned(), cached(&v["usage"])));
    }
    out.push(
        stream(
            &srv,
            "/v1/completions",
            &completion("The old lighthouse stood"),
            false,
        )
        .await,
    );
    // Token ids in: the second prompt extends the first.
    let ids = [1u32, 1784, 3937, 1044, 1278, 2036, 1307];
    for n in [5, 7] {
        let body = json!({"ids": &ids[..n], "max_tokens": 4, "ignore_eos": true});
        let v = post_json(&srv, "/debug/tokens", &body).await;
        let count = |k: &str| v[k].as_u64().unwrap_or_else(|| panic!("no {k}: {v}"));
        out.push((
            v["ids"].to_string(),
            (count("prompt_tokens"), count("cached_tokens")),
        ));
    }
    srv.stop().await;
    out
}

#[tokio::test]
async fn a_continued_conversation_reuses_its_prefix_with_the_same_output() {
    let on = conversation(true).await;
    let off = conversation(false).await;
    for (i, ((text_on, (prompt_on, _)), (text_off, (prompt_off, cached_off)))) in
        on.iter().zip(&off).enumerate()
    {
        assert_eq!(
            text_on, text_off,
            "request {i}: the cache changed the greedy text"
        );
        assert_eq!(prompt_on, prompt_off, "request {i}");
        assert_eq!(*cached_off, 0, "request {i}: the cache is off");
    }
    let cached: Vec<u64> = on.iter().map(|(_, (_, c))| *c).collect();
    eprintln!("cached tokens per request: {cached:?} (prompts {:?})", {
        on.iter().map(|(_, (p, _))| *p).collect::<Vec<_>>()
    });
    assert_eq!(cached[0], 0, "the first request has nothing cached");
    // The continued conversation (twice), the longer completion prompt and the shorter one
    // after it, the longer /debug/tokens prompt; the first completion shares at most the BOS
    // with the chat before it.
    for i in [1, 2, 4, 5, 7] {
        assert!(cached[i] > 1, "request {i} reused nothing: {cached:?}");
    }
}
