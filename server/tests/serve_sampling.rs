//! `n`, `logprobs` / `top_logprobs`, the penalties and `min_p`, and token-id prompts, end to end:
//! the protocol on the fake engine (indices, usage, one log-probability entry per token, each sent
//! no earlier than its text, the legacy shapes and offsets), the real engine on the bundled model
//! (choices distinct under temperature 1, choice `i` seeded `seed + i`, log-probabilities of the
//! raw distribution whatever the sampling parameters), the oracle backend against the external
//! llama.cpp references of `tests/data/models` (log-probabilities to 1e-4), and async-openai
//! parsing every response into its typed structs.

mod serve_common;

use async_openai::config::OpenAIConfig;
use async_openai::types::chat::{
    ChatCompletionRequestUserMessageArgs, CreateChatCompletionRequestArgs,
};
use async_openai::types::completions::CreateCompletionRequestArgs;
use async_openai::Client;
use aubier_runtime::backend::registry::BackendSpec;
use aubier_runtime::engine::Model;
use aubier_runtime::gguf::GgufFile;
use aubier_runtime::store::expert_store::StoreOptions;
use aubier_server::serve::fake::FLOOR;
use aubier_server::serve::logprobs::token_string;
use aubier_server::serve::real::RealEngine;
use aubier_server::serve::text::TextModel;
use aubier_tests::{data_dir, json_ids, model_path, read_f32, read_i32, read_json};
use futures::StreamExt;
use serde_json::{json, Value};
use serve_common::*;
use std::collections::BTreeMap;
use std::sync::Arc;

async fn post_error(srv: &TestServer, path: &str, body: &Value) -> (u16, Value) {
    let resp = raw_request(srv.addr, "POST", path, body.to_string().as_bytes()).await;
    (resp.status, resp.json())
}

/// Posts `body` to `path` and checks the answer is a 400 naming `param`.
async fn assert_refused(srv: &TestServer, path: &str, body: &Value, param: &str) {
    let (status, e) = post_error(srv, path, body).await;
    assert_eq!(
        (status, &e["error"]["param"]),
        (400, &json!(param)),
        "{body}: {e}"
    );
}

/// The JSON chunks of a stream (`[DONE]` checked and dropped).
async fn stream(srv: &TestServer, path: &str, body: &Value) -> Vec<Value> {
    let mut events = sse_events(srv.addr, path, &body.to_string()).await;
    assert_eq!(events.pop().as_deref(), Some("[DONE]"));
    events
        .iter()
        .map(|e| serde_json::from_str(e).expect("chunk JSON"))
        .collect()
}

fn chat(extra: Value) -> Value {
    let mut body = json!({
        "model": MODEL_ID,
        "messages": [{"role": "user", "content": "Say something."}],
    });
    for (k, v) in extra.as_object().expect("object") {
        body[k] = v.clone();
    }
    body
}

fn completion(prompt: Value, extra: Value) -> Value {
    let mut body = json!({"model": MODEL_ID, "prompt": prompt});
    for (k, v) in extra.as_object().expect("object") {
        body[k] = v.clone();
    }
    body
}

/// The bytes a chat logprobs entry list spells.
fn entry_bytes(entries: &[Value]) -> Vec<u8> {
    entries
        .iter()
        .flat_map(|e| {
            e["bytes"]
                .as_array()
                .expect("bytes")
                .iter()
                .map(|b| u8::try_from(b.as_u64().expect("byte")).expect("u8"))
                .collect::<Vec<_>>()
        })
        .collect()
}

#[tokio::test]
async fn n_choices_are_indexed_streamed_one_after_the_other_and_usage_counts_the_prompt_once() {
    let ids = byte_ids("Hi there.");
    let per_choice = ids.len() as u64;
    let srv = start_fake(script(ids), 4096, limits()).await;

    let v = post_json(&srv, "/v1/chat/completions", &chat(json!({"n": 3}))).await;
    let choices = v["choices"].as_array().expect("choices");
    assert_eq!(choices.len(), 3);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(c["message"]["content"], "Hi there.");
        assert_eq!(c["finish_reason"], "stop");
    }
    let prompt_tokens = v["usage"]["prompt_tokens"].as_u64().expect("prompt tokens");
    assert_eq!(v["usage"]["completion_tokens"], 3 * per_choice);
    assert_eq!(v["usage"]["total_tokens"], prompt_tokens + 3 * per_choice);

    let chunks = stream(
        &srv,
        "/v1/chat/completions",
        &chat(json!({"n": 3, "stream": true, "stream_options": {"include_usage": true}})),
    )
    .await;
    let mut order = Vec::new();
    let mut text: BTreeMap<u64, String> = BTreeMap::new();
    let mut finishes: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    let mut roles: BTreeMap<u64, usize> = BTreeMap::new();
    for c in &chunks[..chunks.len() - 1] {
        let choices = c["choices"].as_array().expect("choices");
        assert_eq!(choices.len(), 1, "{c}");
        let ch = &choices[0];
        let i = ch["index"].as_u64().expect("index");
        if order.last() != Some(&i) {
            order.push(i);
        }
        if ch["delta"]["role"] == "assistant" {
            *roles.entry(i).or_default() += 1;
        }
        let t = text.entry(i).or_default();
        t.push_str(ch["delta"]["content"].as_str().unwrap_or(""));
        if let Some(f) = ch["finish_reason"].as_str() {
            finishes.entry(i).or_default().push(f.to_owned());
        }
    }
    assert_eq!(order, [0, 1, 2], "choices stream one after the other");
    assert!(text.values().all(|t| t == "Hi there."), "{text:?}");
    assert!(finishes.values().all(|f| f == &["stop"]), "{finishes:?}");
    assert!(roles.values().all(|&n| n == 1), "{roles:?}");
    let last = chunks.last().expect("usage chunk");
    assert_eq!(last["choices"], json!([]));
    assert_eq!(last["usage"]["completion_tokens"], 3 * per_choice);
    assert_eq!(last["usage"]["prompt_tokens"], prompt_tokens);

    let v = post_json(
        &srv,
        "/v1/completions",
        &completion(json!("x"), json!({"n": 2})),
    )
    .await;
    let texts: Vec<&str> = v["choices"]
        .as_array()
        .expect("choices")
        .iter()
        .map(|c| c["text"].as_str().expect("text"))
        .collect();
    assert_eq!(texts, ["Hi there.", "Hi there."]);
    assert_eq!(v["choices"][1]["index"], 1);
    assert_eq!(v["usage"]["completion_tokens"], 2 * per_choice);
    let chunks = stream(
        &srv,
        "/v1/completions",
        &completion(json!("x"), json!({"n": 2, "stream": true})),
    )
    .await;
    let finished: Vec<u64> = chunks
        .iter()
        .filter(|c| c["choices"][0]["finish_reason"] == "stop")
        .map(|c| c["choices"][0]["index"].as_u64().expect("index"))
        .collect();
    assert_eq!(finished, [0, 1]);
    srv.stop().await;
}

/// Checks a chat stream's log-probabilities against its text: each entry arrives no earlier than
/// its token's text (the bytes of the entries so far start the text so far), and the entries
/// joined equal `whole`, the non-stream list. Returns whether some chunk carried text but no
/// entries (they waited for held-back text).
fn check_chat_stream(chunks: &[Value], whole: &[Value]) -> bool {
    let mut entries = Vec::new();
    let mut text = String::new();
    let mut waited = false;
    for c in chunks {
        let ch = &c["choices"][0];
        let content = ch["delta"]["content"].as_str().unwrap_or("");
        text.push_str(content);
        let got = ch["logprobs"]["content"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        waited |= !content.is_empty() && got.is_empty();
        entries.extend(got);
        let so_far = entry_bytes(&entries);
        assert!(
            text.as_bytes().starts_with(&so_far),
            "an entry went out before its text: {text:?} vs {:?}",
            String::from_utf8_lossy(&so_far)
        );
    }
    assert_eq!(entries, whole);
    waited
}

#[tokio::test]
async fn chat_logprobs_give_one_entry_per_token_no_earlier_than_its_text() {
    let tok = text_model();
    // Characters split over byte tokens, and a stop string that never matches but holds back
    // its possible starts ("€", "ld").
    let ids = [
        byte_ids("aé€ b"),
        tok.tokenizer().encode(" Hello world!").expect("encode"),
    ]
    .concat();
    let text = "aé€ b Hello world!".to_owned();
    let srv = start_fake(script(ids.clone()), 4096, limits()).await;
    let body = chat(json!({"logprobs": true, "top_logprobs": 2, "stop": ["€x", "ldX"]}));
    let v = post_json(&srv, "/v1/chat/completions", &body).await;
    let choice = &v["choices"][0];
    assert_eq!(choice["message"]["content"], text);
    assert_eq!(choice["logprobs"]["refusal"], Value::Null);
    let entries = choice["logprobs"]["content"]
        .as_array()
        .expect("content")
        .clone();
    assert_eq!(entries.len(), ids.len());
    assert_eq!(v["usage"]["completion_tokens"], ids.len());
    assert_eq!(entry_bytes(&entries), text.as_bytes());
    for (e, &id) in entries.iter().zip(&ids) {
        let bytes = tok.tokenizer().token_bytes(id).expect("bytes");
        assert_eq!(e["token"], token_string(bytes));
        // The fake engine's rows put probability 1 on the scripted id (in f64) and the logit
        // FLOOR on every other id, whose log-probability is then FLOOR - log(1 + …) = FLOOR.
        assert_eq!(e["logprob"], 0.0);
        let top = e["top_logprobs"].as_array().expect("top");
        assert_eq!(top.len(), 2);
        assert_eq!(
            (&top[0]["token"], &top[0]["logprob"]),
            (&e["token"], &json!(0.0))
        );
        assert_eq!(top[1]["logprob"], f64::from(FLOOR));
    }
    assert_eq!(entries[1]["token"], "bytes:\\xc3");

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let chunks = stream(&srv, "/v1/chat/completions", &streamed).await;
    assert_eq!(
        chunks[0]["choices"][0]["logprobs"],
        Value::Null,
        "the role chunk"
    );
    assert!(
        check_chat_stream(&chunks, &entries),
        "no chunk released text while its entries waited"
    );

    // Without logprobs, none are computed or sent.
    let v = post_json(&srv, "/v1/chat/completions", &chat(json!({}))).await;
    assert_eq!(v["choices"][0]["logprobs"], Value::Null);
    srv.stop().await;
}

#[tokio::test]
async fn a_stop_string_cuts_the_text_not_the_entries() {
    let ids = byte_ids("abc STOP def");
    let srv = start_fake(script(ids), 4096, limits()).await;
    let body = completion(json!("x"), json!({"logprobs": 0, "stop": "STOP"}));
    let v = post_json(&srv, "/v1/completions", &body).await;
    let c = &v["choices"][0];
    assert_eq!(c["text"], "abc ");
    // Every generated token through the one completing the stop, as usage counts them.
    let tokens: Vec<&str> = c["logprobs"]["tokens"]
        .as_array()
        .expect("tokens")
        .iter()
        .map(|t| t.as_str().expect("token"))
        .collect();
    assert_eq!(tokens.concat(), "abc STOP");
    assert_eq!(v["usage"]["completion_tokens"], tokens.len());
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let chunks = stream(&srv, "/v1/completions", &streamed).await;
    let joined: Vec<Value> = chunks
        .iter()
        .filter(|c| c["choices"][0]["logprobs"].is_object())
        .flat_map(|c| {
            c["choices"][0]["logprobs"]["tokens"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .collect();
    assert_eq!(
        joined,
        c["logprobs"]["tokens"].as_array().cloned().expect("tokens")
    );
    srv.stop().await;
}

#[tokio::test]
async fn completion_logprobs_have_the_legacy_shape_and_offsets() {
    let srv = start_fake(script(byte_ids("aé b")), 4096, limits()).await;
    for k in [0, 1, 5] {
        let v = post_json(
            &srv,
            "/v1/completions",
            &completion(json!("x"), json!({"logprobs": k})),
        )
        .await;
        let lp = &v["choices"][0]["logprobs"];
        assert_eq!(
            lp["tokens"],
            json!(["a", "bytes:\\xc3", "bytes:\\xa9", " ", "b"])
        );
        assert_eq!(lp["token_logprobs"], json!([0.0, 0.0, 0.0, 0.0, 0.0]));
        // Characters of the text before each token; é starts at 1 for both of its bytes.
        assert_eq!(lp["text_offset"], json!([0, 1, 1, 2, 3]));
        // The k most likely, plus the sampled token when it is not among them: here it is the
        // most likely, so max(k, 1) entries.
        for (m, token) in lp["top_logprobs"]
            .as_array()
            .expect("top")
            .iter()
            .zip(lp["tokens"].as_array().expect("tokens"))
        {
            let m = m.as_object().expect("map");
            assert_eq!(m.len(), k.max(1), "{m:?}");
            assert_eq!(m[token.as_str().expect("token")], 0.0);
        }
    }
    let body = completion(json!("x"), json!({"logprobs": 2, "stream": true}));
    let chunks = stream(&srv, "/v1/completions", &body).await;
    let mut offsets = Vec::new();
    let mut text = String::new();
    for c in &chunks {
        text.push_str(c["choices"][0]["text"].as_str().expect("text"));
        if let Some(o) = c["choices"][0]["logprobs"]["text_offset"].as_array() {
            offsets.extend(o.iter().cloned());
        }
    }
    assert_eq!(text, "aé b");
    assert_eq!(offsets, [0, 1, 1, 2, 3]);
    srv.stop().await;
    // Two bytes of a 3-byte character cut off by a space: the text has U+FFFD for them, and the
    // space starts after it.
    let srv = start_fake(script(raw_byte_ids(b"a\xe5\x86 b")), 4096, limits()).await;
    let v = post_json(
        &srv,
        "/v1/completions",
        &completion(json!("x"), json!({"logprobs": 0})),
    )
    .await;
    let choice = &v["choices"][0];
    assert_eq!(choice["text"], "a\u{fffd} b");
    assert_eq!(choice["logprobs"]["text_offset"], json!([0, 1, 1, 2, 3]));
    srv.stop().await;
}

#[tokio::test]
async fn a_completion_prompt_may_be_token_ids_below_the_vocabulary_size() {
    let srv = start_fake(script(byte_ids("ok")), 64, limits()).await;
    let v = post_json(
        &srv,
        "/v1/completions",
        &completion(json!([1, 1784, 3992]), json!({})),
    )
    .await;
    assert_eq!(v["choices"][0]["text"], "ok");
    assert_eq!(
        v["usage"]["prompt_tokens"], 3,
        "used as given: no BOS added"
    );
    let n_vocab = text_model().tokenizer().n_vocab();
    for (prompt, code) in [
        (json!([1, n_vocab]), "invalid_value"),
        (json!([]), "invalid_value"),
        (json!([-1]), "invalid_value"),
        (json!(vec![5; 65]), "context_length_exceeded"),
        (json!(["a", "b"]), "unsupported_parameter"),
    ] {
        let (status, e) = post_error(
            &srv,
            "/v1/completions",
            &completion(prompt.clone(), json!({})),
        )
        .await;
        assert_eq!(status, 400, "{prompt}");
        assert_eq!(e["error"]["param"], "prompt", "{prompt}: {e}");
        assert_eq!(e["error"]["code"], code, "{prompt}: {e}");
    }
    for (extra, param) in [
        (json!({"n": 9}), "n"),
        (json!({"logprobs": 6}), "logprobs"),
        (json!({"presence_penalty": 2.5}), "presence_penalty"),
        (json!({"repetition_penalty": 0}), "repetition_penalty"),
        (json!({"min_p": 1.5}), "min_p"),
    ] {
        let body = completion(json!("x"), extra);
        assert_refused(&srv, "/v1/completions", &body, param).await;
    }
    let (status, e) = post_error(
        &srv,
        "/v1/chat/completions",
        &chat(json!({"top_logprobs": 2})),
    )
    .await;
    assert_eq!(
        (status, &e["error"]["param"]),
        (400, &json!("top_logprobs"))
    );
    srv.stop().await;
}

fn client(srv: &TestServer) -> Client<OpenAIConfig> {
    Client::with_config(
        OpenAIConfig::new()
            .with_api_base(srv.url("/v1"))
            .with_api_key("unused"),
    )
}

#[tokio::test]
async fn async_openai_parses_n_and_logprobs_streamed_and_not() {
    let ids = byte_ids("Two é.");
    let n_tokens = ids.len();
    let srv = start_fake(script(ids), 4096, limits()).await;
    let c = client(&srv);
    let mut req = CreateChatCompletionRequestArgs::default()
        .model(MODEL_ID)
        .messages([ChatCompletionRequestUserMessageArgs::default()
            .content("Hello")
            .build()
            .expect("message")
            .into()])
        .n(2)
        .logprobs(true)
        .top_logprobs(3)
        .presence_penalty(0.5)
        .frequency_penalty(-0.5)
        .build()
        .expect("request");
    let resp = c.chat().create(req.clone()).await.expect("chat.create");
    assert_eq!(resp.choices.len(), 2);
    for (i, ch) in resp.choices.iter().enumerate() {
        assert_eq!(ch.index as usize, i);
        let content = ch
            .logprobs
            .as_ref()
            .and_then(|l| l.content.as_ref())
            .expect("logprobs");
        assert_eq!(content.len(), n_tokens);
        assert!(content
            .iter()
            .all(|t| t.top_logprobs.len() == 3 && t.logprob == 0.0));
        assert_eq!(ch.message.content.as_deref(), Some("Two é."));
    }
    assert_eq!(
        resp.usage.expect("usage").completion_tokens as usize,
        2 * n_tokens
    );
    req.stream = Some(true);
    let mut s = c
        .chat()
        .create_stream(req)
        .await
        .expect("chat.create_stream");
    let mut per_choice = [0usize; 2];
    while let Some(chunk) = s.next().await {
        for ch in chunk.expect("chunk").choices {
            if let Some(content) = ch.logprobs.and_then(|l| l.content) {
                per_choice[ch.index as usize] += content.len();
            }
        }
    }
    assert_eq!(per_choice, [n_tokens; 2]);

    let mut req = CreateCompletionRequestArgs::default()
        .model(MODEL_ID)
        .prompt(vec![1u32, 1784, 3992])
        .n(2)
        .logprobs(2)
        .max_tokens(64u32)
        .build()
        .expect("completion request");
    let resp = c
        .completions()
        .create(req.clone())
        .await
        .expect("completions.create");
    assert_eq!(resp.choices.len(), 2);
    for (i, ch) in resp.choices.iter().enumerate() {
        assert_eq!(ch.index as usize, i);
        let lp = ch.logprobs.as_ref().expect("logprobs");
        assert_eq!(lp.tokens.len(), n_tokens);
        assert_eq!(lp.text_offset.len(), n_tokens);
        assert!(lp.token_logprobs.iter().all(|l| *l == Some(0.0)));
    }
    req.stream = Some(true);
    let mut s = c
        .completions()
        .create_stream(req)
        .await
        .expect("completions.create_stream");
    let mut per_choice = [0usize; 2];
    while let Some(chunk) = s.next().await {
        for ch in chunk.expect("chunk").choices {
            per_choice[ch.index as usize] += ch.logprobs.map_or(0, |l| l.tokens.len());
        }
    }
    assert_eq!(per_choice, [n_tokens; 2]);
    srv.stop().await;
}

/// A real-engine server on `file` bound to `backend`, with that file's tokenizer.
async fn real_server(file: &std::path::Path, backend: BackendSpec) -> TestServer {
    let model = Model::load_with(file, &backend)
        .unwrap_or_else(|e| panic!("load {} on {backend:?}: {e}", file.display()));
    let kv_max = model.config.n_ctx_train.min(4096);
    let engine = RealEngine::open(model, kv_max, &StoreOptions::default(), 0).expect("session");
    let gguf = GgufFile::open(file).expect("open the GGUF");
    let text = Arc::new(TextModel::from_gguf(&gguf).expect("tokenizer"));
    start_with_text(Box::new(engine), None, limits(), text).await
}

#[tokio::test]
async fn on_the_real_engine_choices_differ_and_choice_i_is_seeded_seed_plus_i() {
    let srv = real_server(&bundled_model(), BackendSpec::default()).await;
    let ask = |n: usize, seed: u64| {
        chat(json!({"n": n, "seed": seed, "temperature": 1.0, "max_tokens": 6, "logprobs": true}))
    };
    let tokens = |c: &Value| -> Vec<Value> {
        c["logprobs"]["content"]
            .as_array()
            .expect("content")
            .iter()
            .map(|e| e["bytes"].clone())
            .collect()
    };
    let v = post_json(&srv, "/v1/chat/completions", &ask(4, 11)).await;
    let choices: Vec<Vec<Value>> = v["choices"]
        .as_array()
        .expect("choices")
        .iter()
        .map(tokens)
        .collect();
    assert_eq!(choices.len(), 4);
    for i in 0..4 {
        assert!(!choices[i].is_empty());
        for j in 0..i {
            assert_ne!(choices[i], choices[j], "choices {i} and {j} are the same");
        }
    }
    let alone = post_json(&srv, "/v1/chat/completions", &ask(1, 13)).await;
    assert_eq!(
        tokens(&alone["choices"][0]),
        choices[2],
        "choice 2 of seed 11 is seed 13"
    );
    let again = post_json(&srv, "/v1/chat/completions", &ask(4, 11)).await;
    assert_eq!(again["choices"], v["choices"], "seeded choices repeat");
    srv.stop().await;
}

#[tokio::test]
async fn logprobs_are_the_raw_distribution_whatever_the_sampling() {
    let srv = real_server(&bundled_model(), BackendSpec::default()).await;
    let prompt = json!([1, 1784, 3992, 1295, 2227]);
    let first = |v: &Value| v["choices"][0]["logprobs"]["top_logprobs"][0].clone();
    let greedy = post_json(
        &srv,
        "/v1/completions",
        &completion(
            prompt.clone(),
            json!({"max_tokens": 1, "logprobs": 5, "temperature": 0}),
        ),
    )
    .await;
    let top = first(&greedy);
    assert_eq!(top.as_object().expect("map").len(), 5);
    // Greedy takes the most likely token: its logprob is the top one.
    let best = top
        .as_object()
        .expect("map")
        .values()
        .map(|v| v.as_f64().expect("lp"))
        .fold(f64::NEG_INFINITY, f64::max);
    assert_eq!(greedy["choices"][0]["logprobs"]["token_logprobs"][0], best);
    for extra in [
        json!({"temperature": 1.5, "seed": 3}),
        json!({"temperature": 1.0, "seed": 4, "top_k": 2, "top_p": 0.5, "min_p": 0.3}),
        json!({"temperature": 0.7, "seed": 5, "presence_penalty": 2, "frequency_penalty": 2, "repetition_penalty": 1.7}),
    ] {
        let mut e = extra.clone();
        e["max_tokens"] = json!(1);
        e["logprobs"] = json!(5);
        let v = post_json(&srv, "/v1/completions", &completion(prompt.clone(), e)).await;
        let got = first(&v);
        // The sampled token may differ (then it joins the map); the top five are the same.
        let m = got.as_object().expect("map");
        for (token, lp) in top.as_object().expect("map") {
            assert_eq!(m.get(token), Some(lp), "{extra}: {token}");
        }
    }
    // Chat, temperature 0 and 1.5: the first position's top_logprobs are the same.
    let at = |t: f64| {
        chat(
            json!({"max_tokens": 1, "logprobs": true, "top_logprobs": 20, "temperature": t, "seed": 9}),
        )
    };
    let a = post_json(&srv, "/v1/chat/completions", &at(0.0)).await;
    let b = post_json(&srv, "/v1/chat/completions", &at(1.5)).await;
    let top20 = |v: &Value| v["choices"][0]["logprobs"]["content"][0]["top_logprobs"].clone();
    assert_eq!(top20(&a).as_array().expect("top").len(), 20);
    assert_eq!(top20(&a), top20(&b));
    srv.stop().await;
}

/// The llama.cpp reference of `ms4-tiny-f32.gguf`: `(ids, top-20 ids, top-20 log-probabilities)`
/// per prompt position, the log-probabilities computed here as `logit − logsumexp`.
struct Reference {
    ids: Vec<u32>,
    top: Vec<Vec<(u32, f64)>>,
}

fn reference() -> Reference {
    let dir = data_dir().join("models");
    let head = read_json(&dir.join("ms4-tiny-f32.llamacpp.logits.json"));
    let ids = json_ids(&head, "token_ids");
    let top_ids = read_i32(&dir.join("ms4-tiny-f32.llamacpp.top20_ids.i32"));
    let top_logits = read_f32(&dir.join("ms4-tiny-f32.llamacpp.top20_logits.f32"));
    let lse = read_f32(&dir.join("ms4-tiny-f32.llamacpp.logsumexp.f32"));
    let top = (0..ids.len())
        .map(|p| {
            (0..20)
                .map(|r| {
                    let k = p * 20 + r;
                    (
                        u32::try_from(top_ids[k]).expect("id"),
                        f64::from(top_logits[k]) - f64::from(lse[p]),
                    )
                })
                .collect()
        })
        .collect();
    Reference { ids, top }
}

/// Largest |ours − reference| over one position: the sampled token's log-probability and each
/// of the top entries (`map`: token string → log-probability), every one looked up by token in
/// the reference's top 20.
fn position_error(
    text: &TextModel,
    reference: &[(u32, f64)],
    sampled: (&str, f64),
    map: &serde_json::Map<String, Value>,
) -> f64 {
    let by_token: BTreeMap<String, f64> = reference
        .iter()
        .map(|&(id, lp)| {
            (
                token_string(text.tokenizer().token_bytes(id).expect("bytes")),
                lp,
            )
        })
        .collect();
    let mut worst: f64 = 0.0;
    let mut check = |token: &str, lp: f64| {
        let r = by_token
            .get(token)
            .unwrap_or_else(|| panic!("{token:?} is not in the reference's top 20"));
        worst = worst.max((lp - r).abs());
    };
    check(sampled.0, sampled.1);
    for (token, lp) in map {
        check(token, lp.as_f64().expect("logprob"));
    }
    // The top entries are the reference's most likely ones: the same values, in order.
    let mut ours: Vec<f64> = map.values().map(|v| v.as_f64().expect("lp")).collect();
    ours.sort_by(|a, b| b.total_cmp(a));
    for (a, (_, b)) in ours.iter().zip(reference) {
        worst = worst.max((a - b).abs());
    }
    worst
}

#[tokio::test]
async fn oracle_logprobs_of_token_id_prompts_match_the_llamacpp_references() {
    let file = model_path("ms4-tiny-f32.gguf");
    let srv = real_server(&file, BackendSpec::named("oracle")).await;
    let gguf = GgufFile::open(&file).expect("open");
    let text = TextModel::from_gguf(&gguf).expect("tokenizer");
    let r = reference();
    let one = |v: &Value| -> (String, f64, serde_json::Map<String, Value>) {
        let lp = &v["choices"][0]["logprobs"];
        (
            lp["tokens"][0].as_str().expect("token").to_owned(),
            lp["token_logprobs"][0].as_f64().expect("logprob"),
            lp["top_logprobs"][0].as_object().expect("map").clone(),
        )
    };
    // Teacher-forced positions: a prompt of the first p ids, one greedy token, whose
    // log-probabilities are the reference's at position p − 1. Positions cross the Llama-4
    // scale steps (every 64) and reach the end of the reference prompt.
    let mut worst: f64 = 0.0;
    for p in [1, 2, 16, 63, 64, 65, 130, 200] {
        let body = completion(
            json!(&r.ids[..p]),
            json!({"max_tokens": 1, "temperature": 0, "logprobs": 5}),
        );
        let v = post_json(&srv, "/v1/completions", &body).await;
        let (token, logprob, map) = one(&v);
        let top1 = r.top[p - 1][0].0;
        assert_eq!(
            token,
            token_string(text.tokenizer().token_bytes(top1).expect("bytes")),
            "position {}",
            p - 1
        );
        let e = position_error(&text, &r.top[p - 1], (&token, logprob), &map);
        assert!(e <= 1e-4, "position {}: |Δ log-prob| {e:.3e}", p - 1);
        worst = worst.max(e);
    }
    // The reference's greedy continuation: its ids, and at each generated position the gap
    // between the two most likely log-probabilities is the reference's top-1 − top-2 logit margin
    // (logsumexp cancels); the first position is also the logits reference's position 15.
    let g = read_json(&data_dir().join("models/ms4-tiny-f32.llamacpp.greedy.json"));
    let prefix = json_ids(&g, "prefix_ids");
    let expected = json_ids(&g, "generated_ids");
    assert_eq!(prefix, r.ids[..prefix.len()]);
    let body = completion(
        json!(prefix),
        json!({"max_tokens": expected.len(), "temperature": 0, "logprobs": 2}),
    );
    let v = post_json(&srv, "/v1/completions", &body).await;
    let lp = &v["choices"][0]["logprobs"];
    let tokens: Vec<String> = expected
        .iter()
        .map(|&id| token_string(text.tokenizer().token_bytes(id).expect("bytes")))
        .collect();
    assert_eq!(lp["tokens"], json!(tokens), "the greedy continuation");
    let margins = g["margin"].as_array().expect("margins");
    for (i, (m, margin)) in lp["top_logprobs"]
        .as_array()
        .expect("top")
        .iter()
        .zip(margins)
        .enumerate()
    {
        let mut values: Vec<f64> = m
            .as_object()
            .expect("map")
            .values()
            .map(|v| v.as_f64().expect("lp"))
            .collect();
        values.sort_by(|a, b| b.total_cmp(a));
        let gap = values[0] - values[1];
        let e = (gap - margin.as_f64().expect("margin")).abs();
        assert!(
            e <= 1e-4,
            "generated position {i}: margin {gap} vs {margin}"
        );
        worst = worst.max(e);
    }
    let first = (
        lp["tokens"][0].as_str().expect("token"),
        lp["token_logprobs"][0].as_f64().expect("lp"),
    );
    let e = position_error(
        &text,
        &r.top[prefix.len() - 1],
        first,
        lp["top_logprobs"][0].as_object().expect("map"),
    );
    assert!(e <= 1e-4, "first generated position: {e:.3e}");
    eprintln!(
        "oracle vs llama.cpp log-probabilities: max |Δ| {:.3e}",
        worst.max(e)
    );
    srv.stop().await;
}

/// The ids `/debug/tokens` generates greedily after `prompt` (EOS ends them).
async fn greedy_ids(srv: &TestServer, prompt: &Value, max_tokens: usize) -> Vec<u64> {
    let body = json!({"ids": prompt, "max_tokens": max_tokens});
    let v = post_json(srv, "/debug/tokens", &body).await;
    v["ids"]
        .as_array()
        .expect("ids")
        .iter()
        .map(|x| x.as_u64().expect("id"))
        .collect()
}

#[tokio::test]
async fn logit_bias_bans_and_forces_tokens_and_logprobs_stay_raw() {
    let srv = real_server(&bundled_model(), BackendSpec::default()).await;
    let prompt = json!([1, 1784, 3992, 1295, 2227]);
    let first = greedy_ids(&srv, &prompt, 1).await[0];
    let ask = |bias: Value| {
        completion(
            prompt.clone(),
            json!({"max_tokens": 1, "logprobs": 5, "temperature": 0, "logit_bias": bias}),
        )
    };
    let plain = post_json(&srv, "/v1/completions", &ask(json!({}))).await;
    let banned = post_json(
        &srv,
        "/v1/completions",
        &ask(json!({first.to_string(): -100})),
    )
    .await;
    let top = |v: &Value| v["choices"][0]["logprobs"]["top_logprobs"][0].clone();
    let picked = |v: &Value| {
        v["choices"][0]["logprobs"]["token_logprobs"][0]
            .as_f64()
            .expect("lp")
    };
    // The raw distribution is the same with the bias: the top five and their log-probabilities.
    assert_eq!(top(&banned), top(&plain));
    let mut lps: Vec<f64> = top(&plain)
        .as_object()
        .expect("map")
        .values()
        .map(|v| v.as_f64().expect("lp"))
        .collect();
    lps.sort_by(|a, b| b.total_cmp(a));
    assert_eq!(picked(&plain), lps[0], "greedy takes the most likely token");
    assert_eq!(
        picked(&banned),
        lps[1],
        "-100 on it turns greedy to the runner-up"
    );
    let token = |v: &Value| v["choices"][0]["logprobs"]["tokens"][0].clone();
    assert_ne!(token(&banned), token(&plain));
    // +100 forces an unlikely token, greedy or sampled; its text is that id's.
    let forced_id = 1784;
    assert_ne!(
        forced_id, first,
        "the forced token is not the greedy one anyway"
    );
    let want = post_json(&srv, "/detokenize", &json!({"tokens": [forced_id]})).await;
    for temperature in [0.0, 1.0] {
        let v = post_json(
            &srv,
            "/v1/completions",
            &completion(
                prompt.clone(),
                json!({"max_tokens": 1, "temperature": temperature, "seed": 1, "logprobs": 0,
                       "logit_bias": {forced_id.to_string(): 100}}),
            ),
        )
        .await;
        assert_eq!(token(&v), want["prompt"], "temperature {temperature}");
    }
    // The chat route takes it too: banning the greedy answer's first token changes it.
    let chat_first = |bias: Value| {
        chat(json!({"max_tokens": 1, "temperature": 0, "logprobs": true, "logit_bias": bias}))
    };
    let a = post_json(&srv, "/v1/chat/completions", &chat_first(json!({}))).await;
    let chat_ids = post_json(
        &srv,
        "/tokenize",
        &json!({"messages": [{"role": "user", "content": "Say something."}]}),
    )
    .await;
    let chat_first_id = greedy_ids(&srv, &chat_ids["tokens"], 1).await[0];
    let b = post_json(
        &srv,
        "/v1/chat/completions",
        &chat_first(json!({chat_first_id.to_string(): -100})),
    )
    .await;
    let bytes = |v: &Value| v["choices"][0]["logprobs"]["content"][0]["bytes"].clone();
    assert_ne!(bytes(&a), bytes(&b));
    // An id past the vocabulary is a 400 naming logit_bias and the key.
    let n_vocab = text_model().tokenizer().n_vocab();
    for path in ["/v1/completions", "/v1/chat/completions"] {
        let bias = json!({"5": 1, n_vocab.to_string(): -1});
        let body = if path == "/v1/completions" {
            ask(bias)
        } else {
            chat_first(bias)
        };
        let (status, e) = post_error(&srv, path, &body).await;
        assert_eq!(status, 400, "{path}: {e}");
        assert_eq!(e["error"]["param"], "logit_bias", "{path}: {e}");
        let message = e["error"]["message"].as_str().expect("message");
        assert!(message.contains(&n_vocab.to_string()), "{message}");
    }
    srv.stop().await;
}

#[tokio::test]
async fn ignore_eos_min_tokens_and_stop_token_ids_decide_where_a_choice_ends() {
    // The fake engine puts all mass on "okay", one byte token each, then on EOS.
    let ids = byte_ids("okay");
    let srv = start_fake(script(ids.clone()), 64, limits()).await;
    let ask = |extra: Value| {
        let mut e = extra;
        e["max_tokens"] = json!(6);
        e["temperature"] = json!(0);
        completion(json!("x"), e)
    };
    let run = |v: Value| {
        (
            v["choices"][0]["text"].as_str().expect("text").to_owned(),
            v["choices"][0]["finish_reason"].clone(),
            v["usage"]["completion_tokens"].clone(),
        )
    };
    let plain = run(post_json(&srv, "/v1/completions", &ask(json!({}))).await);
    assert_eq!(plain, ("okay".to_owned(), json!("stop"), json!(4)));
    // ignore_eos: EOS is generated (no text) up to max_tokens.
    let v = post_json(&srv, "/v1/completions", &ask(json!({"ignore_eos": true}))).await;
    assert_eq!(run(v), ("okay".to_owned(), json!("length"), json!(6)));
    let c = post_json(
        &srv,
        "/v1/chat/completions",
        &chat(json!({"max_tokens": 6, "ignore_eos": true})),
    )
    .await;
    assert_eq!(c["choices"][0]["finish_reason"], "length");
    assert_eq!(c["usage"]["completion_tokens"], 6);
    // min_tokens 5: EOS cannot be sampled for the fifth token, so the choice has five (the
    // fifth is the lowest id, the greedy pick among the equal others); then EOS ends it.
    let v = post_json(&srv, "/v1/completions", &ask(json!({"min_tokens": 5}))).await;
    let (text, finish, tokens) = run(v);
    assert!(text.starts_with("okay"), "{text}");
    assert_eq!((finish, tokens), (json!("stop"), json!(5)));
    // stop_token_ids: "a" ends the choice as EOS does, and is not part of it.
    let a = ids[2];
    let v = post_json(
        &srv,
        "/v1/completions",
        &ask(json!({"stop_token_ids": [a]})),
    )
    .await;
    assert_eq!(run(v), ("ok".to_owned(), json!("stop"), json!(2)));
    // min_tokens holds a stop id too: past it, "y" and then EOS.
    let v = post_json(
        &srv,
        "/v1/completions",
        &ask(json!({"stop_token_ids": [a], "min_tokens": 3})),
    )
    .await;
    let (text, finish, tokens) = run(v);
    assert!(text.starts_with("ok") && text.ends_with('y'), "{text}");
    assert_eq!((finish, tokens), (json!("stop"), json!(4)));
    // Bad values: a 400 naming the parameter.
    let n_vocab = text_model().tokenizer().n_vocab();
    for (extra, param) in [
        (json!({"min_tokens": 7}), "min_tokens"),
        (json!({"min_tokens": -1}), "min_tokens"),
        (json!({"stop_token_ids": [n_vocab]}), "stop_token_ids"),
        (json!({"stop_token_ids": [-1]}), "stop_token_ids"),
        (json!({"ignore_eos": 1}), "ignore_eos"),
    ] {
        assert_refused(&srv, "/v1/completions", &ask(extra), param).await;
    }
    let body = chat(json!({"max_completion_tokens": 2, "min_tokens": 3}));
    assert_refused(&srv, "/v1/chat/completions", &body, "min_tokens").await;
    srv.stop().await;
}

#[tokio::test]
async fn under_min_tokens_a_stop_string_must_end_past_them() {
    // vLLM's test_min_tokens_with_stop, on the fake engine's "a-b-c" (one token a byte).
    let srv = start_fake(script(byte_ids("a-b-c")), 64, limits()).await;
    let text = |min_tokens: u64| {
        completion(
            json!("x"),
            json!({"max_tokens": 8, "stop": "-", "min_tokens": min_tokens}),
        )
    };
    for (min_tokens, want) in [(0, "a"), (1, "a"), (2, "a-b"), (3, "a-b"), (4, "a-b-c")] {
        let v = post_json(&srv, "/v1/completions", &text(min_tokens)).await;
        assert_eq!(v["choices"][0]["text"], want, "min_tokens {min_tokens}");
    }
    srv.stop().await;
}
