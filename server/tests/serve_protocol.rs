//! Protocol tests of `aubier serve` with the fake engine (scripted tokens, real tokenizer and chat
//! template of the bundled model): SSE framing, mid-stream errors, UTF-8 across tokens, stop
//! strings across tokens, context limits, cancellation, OpenAI-shaped errors, admission.

mod serve_common;

use aubier_server::serve::fake::FakeScript;
use serde_json::Value;
use serve_common::*;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

#[tokio::test]
async fn each_sse_event_is_its_own_chunk_and_the_stream_ends_with_done() {
    let srv = start_fake(script(byte_ids("Hi there, friend.")), 4096, limits()).await;
    let body = chat_body(
        "hello",
        r#","stream":true,"stream_options":{"include_usage":true}"#,
    );
    let payloads = sse_events(srv.addr, "/v1/chat/completions", &body).await;
    assert_eq!(payloads.last().map(String::as_str), Some("[DONE]"));
    assert_eq!(payloads.iter().filter(|p| *p == "[DONE]").count(), 1);
    // One JSON object per event, every one a chat chunk of the same id.
    let chunks: Vec<Value> = payloads[..payloads.len() - 1]
        .iter()
        .map(|p| serde_json::from_str(p).expect("one JSON object per event"))
        .collect();
    let id = chunks[0]["id"].clone();
    for c in &chunks {
        assert_eq!(c["object"], "chat.completion.chunk");
        assert_eq!(c["id"], id);
    }
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let (content, reasoning, finish) = chat_stream_text(&payloads);
    assert_eq!(content, "Hi there, friend.");
    assert_eq!(reasoning, "");
    assert_eq!(finish.as_deref(), Some("stop"));
    // include_usage: a last chunk with no choices and the counts.
    let usage_chunk = chunks.last().expect("usage chunk");
    assert_eq!(usage_chunk["choices"].as_array().map(Vec::len), Some(0));
    assert_eq!(usage_chunk["usage"]["completion_tokens"], 17);
    let prompt = text_model()
        .chat_prompt(&chat_request(
            r#"{"messages":[{"role":"user","content":"hello"}]}"#,
        ))
        .expect("prompt");
    assert_eq!(usage_chunk["usage"]["prompt_tokens"], prompt.len());
    srv.stop().await;
}

#[tokio::test]
async fn an_error_mid_stream_is_an_error_event_and_the_stream_ends_cleanly() {
    let mut s = script(byte_ids("abcdefghij"));
    s.fail_at_step = Some(4);
    let srv = start_fake(s, 4096, limits()).await;
    let body = chat_body("hello", r#","stream":true"#);
    // raw_request parses the chunked body to its terminating zero-size chunk: a clean end.
    let payloads = sse_events(srv.addr, "/v1/chat/completions", &body).await;
    assert_eq!(payloads.last().map(String::as_str), Some("[DONE]"));
    let err: Value = serde_json::from_str(&payloads[payloads.len() - 2]).expect("error JSON");
    let e = &err["error"];
    assert!(
        e["message"].as_str().unwrap_or("").contains("step 4"),
        "{err}"
    );
    assert_eq!(e["type"], "server_error");
    assert!(e.get("param").is_some() && e.get("code").is_some());
    // Steps 1..3 produced "abc" before the failure.
    let (content, _, finish) = chat_stream_text(&payloads);
    assert_eq!(content, "abc");
    assert_eq!(finish, None);
    // The engine is still usable afterwards (step 4 of the engine's life has passed).
    let ok = raw_request(
        srv.addr,
        "POST",
        "/v1/chat/completions",
        chat_body("again", r#","max_tokens":2"#).as_bytes(),
    )
    .await;
    assert_eq!(ok.status, 200);
    assert_eq!(ok.json()["choices"][0]["message"]["content"], "ab");
    srv.stop().await;
}

#[tokio::test]
async fn characters_split_over_tokens_are_emitted_whole() {
    let text = "é€😀 ok ü";
    let ids = byte_ids(text);
    assert_eq!(ids.len(), text.len(), "one token per byte");
    let srv = start_fake(script(ids), 4096, limits()).await;
    let payloads = sse_events(
        srv.addr,
        "/v1/chat/completions",
        &chat_body("x", r#","stream":true"#),
    )
    .await;
    let mut deltas = Vec::new();
    for p in payloads.iter().filter(|p| p.as_str() != "[DONE]") {
        let v: Value = serde_json::from_str(p).expect("chunk");
        match v["choices"][0]["delta"]["content"].as_str() {
            Some(t) if !t.is_empty() => deltas.push(t.to_owned()),
            _ => {}
        }
    }
    assert!(deltas.iter().all(|d| !d.contains('\u{FFFD}')), "{deltas:?}");
    assert_eq!(deltas.concat(), text);
    // 'é' (2 bytes) arrives as one delta after its second token, never as a half.
    assert_eq!(deltas[0], "é");
    let resp = raw_request(
        srv.addr,
        "POST",
        "/v1/chat/completions",
        chat_body("x", "").as_bytes(),
    )
    .await;
    assert_eq!(resp.json()["choices"][0]["message"]["content"], text);
    let completion = raw_request(
        srv.addr,
        "POST",
        "/v1/completions",
        format!(r#"{{"model":"{MODEL_ID}","prompt":"p","max_tokens":50}}"#).as_bytes(),
    )
    .await;
    assert_eq!(completion.json()["choices"][0]["text"], text);
    srv.stop().await;
}

#[tokio::test]
async fn stop_strings_spanning_tokens_match_and_never_leak() {
    let srv = start_fake(script(byte_ids("abc ST xyz STOP tail")), 4096, limits()).await;
    for stream in [true, false] {
        let extra = format!(r#","stop":["STOP"],"stream":{stream}"#);
        let body = chat_body("x", &extra);
        let (content, finish) = if stream {
            let payloads = sse_events(srv.addr, "/v1/chat/completions", &body).await;
            let (c, _, f) = chat_stream_text(&payloads);
            (c, f)
        } else {
            let v = raw_request(srv.addr, "POST", "/v1/chat/completions", body.as_bytes())
                .await
                .json();
            (
                v["choices"][0]["message"]["content"]
                    .as_str()
                    .unwrap_or("")
                    .to_owned(),
                v["choices"][0]["finish_reason"].as_str().map(str::to_owned),
            )
        };
        assert_eq!(content, "abc ST xyz ", "stream={stream}");
        assert_eq!(finish.as_deref(), Some("stop"));
    }
    // Four stops: the earliest match wins; generation ends at the token that completes it.
    let before = srv
        .steps
        .as_ref()
        .map(|s| s.load(Ordering::SeqCst))
        .unwrap_or(0);
    let body = chat_body("x", r#","stop":["never","nope","ST xyz","tail"]"#);
    let v = raw_request(srv.addr, "POST", "/v1/chat/completions", body.as_bytes())
        .await
        .json();
    assert_eq!(v["choices"][0]["message"]["content"], "abc ");
    assert_eq!(v["usage"]["completion_tokens"], "abc ST xyz".len());
    let after = srv
        .steps
        .as_ref()
        .map(|s| s.load(Ordering::SeqCst))
        .unwrap_or(0);
    assert_eq!(
        after - before,
        "abc ST xyz".len() as u64,
        "no step after the stop"
    );
    // Completions: same matcher.
    let body = format!(r#"{{"model":"{MODEL_ID}","prompt":"p","max_tokens":50,"stop":"xyz"}}"#);
    let v = raw_request(srv.addr, "POST", "/v1/completions", body.as_bytes())
        .await
        .json();
    assert_eq!(v["choices"][0]["text"], "abc ST ");
    // Stop strings cut free text only: JSON held to response_format runs whole, as tool-call
    // arguments do.
    srv.stop().await;
    let srv = start_fake(script(byte_ids(r#"{"a": 1, "b": 2}"#)), 4096, limits()).await;
    let body = chat_body(
        "x",
        r#","stop":[","],"response_format":{"type":"json_object"}"#,
    );
    let v = raw_request(srv.addr, "POST", "/v1/chat/completions", body.as_bytes())
        .await
        .json();
    assert_eq!(
        v["choices"][0]["message"]["content"], r#"{"a": 1, "b": 2}"#,
        "{v}"
    );
    let v = raw_request(
        srv.addr,
        "POST",
        "/v1/chat/completions",
        chat_body("x", r#","stop":[","]"#).as_bytes(),
    )
    .await
    .json();
    assert_eq!(v["choices"][0]["message"]["content"], r#"{"a": 1"#, "{v}");
    // A fifth stop is refused by name.
    let body = chat_body("x", r#","stop":["a","b","c","d","e"]"#);
    let resp = raw_request(srv.addr, "POST", "/v1/chat/completions", body.as_bytes()).await;
    assert_eq!(resp.status, 400);
    assert_eq!(resp.json()["error"]["param"], "stop");
    srv.stop().await;
}

/// The non-streamed answer to a chat request of one user message "x".
async fn chat_x(addr: std::net::SocketAddr) -> Value {
    raw_request(
        addr,
        "POST",
        "/v1/chat/completions",
        chat_body("x", "").as_bytes(),
    )
    .await
    .json()
}

#[tokio::test]
async fn reasoning_is_streamed_as_reasoning_content() {
    let text = text_model();
    let tok = text.tokenizer();
    let think = tok
        .special_id("[THINK]")
        .expect("[THINK] in the vocabulary");
    let end = tok
        .special_id("[/THINK]")
        .expect("[/THINK] in the vocabulary");
    let mut ids = vec![think];
    ids.extend(byte_ids("plan"));
    ids.push(end);
    ids.extend(byte_ids("answer"));
    let srv = start_fake(script(ids), 4096, limits()).await;
    let payloads = sse_events(
        srv.addr,
        "/v1/chat/completions",
        &chat_body("x", r#","stream":true,"reasoning_effort":"high""#),
    )
    .await;
    let (content, reasoning, _) = chat_stream_text(&payloads);
    assert_eq!((content.as_str(), reasoning.as_str()), ("answer", "plan"));
    let v = chat_x(srv.addr).await;
    assert_eq!(v["choices"][0]["message"]["content"], "answer");
    assert_eq!(v["choices"][0]["message"]["reasoning_content"], "plan");
    // [THINK], the 4 bytes of "plan" and [/THINK] are reasoning tokens; "answer" is not.
    assert_eq!(
        v["usage"]["completion_tokens_details"]["reasoning_tokens"],
        6
    );
    assert_eq!(v["usage"]["completion_tokens"], 6 + 6);
    srv.stop().await;
}

#[tokio::test]
async fn answers_carry_openais_shapes_and_streams_escape_unicode_line_separators() {
    let srv = start_fake(script(byte_ids("a\u{2028}b\u{2029}c")), 4096, limits()).await;
    let v = chat_x(srv.addr).await;
    let message = &v["choices"][0]["message"];
    assert!(message.get("refusal").is_some_and(Value::is_null), "{v}");
    assert_eq!(message["content"], "a\u{2028}b\u{2029}c");
    assert_eq!(
        v["usage"]["completion_tokens_details"]["reasoning_tokens"],
        0
    );
    let fingerprint = v["system_fingerprint"]
        .as_str()
        .expect("a fingerprint")
        .to_owned();
    assert!(
        fingerprint.len() == 19
            && fingerprint.starts_with("fp_")
            && fingerprint[3..].bytes().all(|b| b.is_ascii_hexdigit()),
        "{fingerprint}"
    );
    for (path, body) in [
        ("/v1/chat/completions", chat_body("x", r#","stream":true"#)),
        (
            "/v1/completions",
            format!(r#"{{"model":"{MODEL_ID}","prompt":"x","stream":true}}"#),
        ),
    ] {
        let resp = raw_request(srv.addr, "POST", path, body.as_bytes()).await;
        let raw = String::from_utf8(resp.body()).expect("UTF-8");
        assert!(
            !raw.contains(['\u{2028}', '\u{2029}']),
            "{path}: a raw line separator in the stream: {raw:?}"
        );
        let mut text = String::new();
        for line in raw.lines().filter_map(|l| l.strip_prefix("data: ")) {
            if line == "[DONE]" {
                continue;
            }
            let chunk: Value = serde_json::from_str(line).expect("a JSON chunk");
            assert_eq!(chunk["system_fingerprint"], fingerprint.as_str(), "{chunk}");
            let choice = &chunk["choices"][0];
            let piece = choice["delta"]["content"]
                .as_str()
                .or(choice["text"].as_str());
            text.push_str(piece.unwrap_or(""));
        }
        assert_eq!(text, "a\u{2028}b\u{2029}c", "{path}");
    }
    srv.stop().await;
}

#[tokio::test]
async fn a_prompt_longer_than_the_context_is_a_400_and_max_tokens_is_clamped() {
    let kv_max = 40;
    let srv = start_fake(script(byte_ids(&"z".repeat(200))), kv_max, limits()).await;
    let long = "many words ".repeat(50);
    for stream in [false, true] {
        let body = chat_body(&long, &format!(r#","stream":{stream}"#));
        let resp = raw_request(srv.addr, "POST", "/v1/chat/completions", body.as_bytes()).await;
        assert_eq!(resp.status, 400, "stream={stream}");
        let e = resp.json();
        assert_eq!(e["error"]["code"], "context_length_exceeded");
        assert!(e["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains(&kv_max.to_string()));
    }
    let body = format!(
        r#"{{"model":"{MODEL_ID}","prompt":{},"max_tokens":5}}"#,
        serde_json::to_string(&long).unwrap()
    );
    let resp = raw_request(srv.addr, "POST", "/v1/completions", body.as_bytes()).await;
    assert_eq!(resp.status, 400);
    assert_eq!(resp.json()["error"]["param"], "prompt");
    // A prompt that fits, with max_tokens past the room left: clamped, finish "length". Prompt
    // and completion together are at most the context: usage.total_tokens is kv_max.
    let prompt = text_model()
        .chat_prompt(&chat_request(
            r#"{"messages":[{"role":"user","content":"hi"}]}"#,
        ))
        .expect("prompt")
        .len();
    assert!(prompt < kv_max);
    let v = raw_request(
        srv.addr,
        "POST",
        "/v1/chat/completions",
        chat_body("hi", r#","max_tokens":1000"#).as_bytes(),
    )
    .await
    .json();
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], kv_max - prompt);
    assert_eq!(v["usage"]["total_tokens"], kv_max);
    srv.stop().await;
}

#[tokio::test]
async fn a_client_that_disconnects_mid_stream_stops_generation_within_one_step() {
    let mut s = script(byte_ids(&"a".repeat(1000)));
    s.step_delay = Duration::from_millis(40);
    let srv = start_fake(s, 4096, limits()).await;
    let steps = srv.steps.clone().expect("fake step counter");
    let body = chat_body("x", r#","stream":true"#);
    let mut conn = tokio::net::TcpStream::connect(srv.addr)
        .await
        .expect("connect");
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    tokio::io::AsyncWriteExt::write_all(&mut conn, head.as_bytes())
        .await
        .expect("send");
    let mut reader = HttpReader::new(conn);
    let (status, _) = reader.read_head().await;
    assert_eq!(status, 200);
    let mut contents = 0;
    while contents < 3 {
        let frame = reader.read_chunk().await.expect("a chunk");
        let v: Value = serde_json::from_str(&sse_payload(&frame)).expect("chunk");
        if v["choices"][0]["delta"]["content"] == "a" {
            contents += 1;
        }
    }
    let at_disconnect = steps.load(Ordering::SeqCst);
    drop(reader);
    // Wait for the engine to go idle, then count.
    let t0 = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(20)).await;
        if srv.metrics.running.load(Ordering::SeqCst) == 0 {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "generation did not stop"
        );
    }
    let total = steps.load(Ordering::SeqCst);
    // 3 tokens were read (steps 1..3); at most the step in flight when the client left may finish.
    assert!(at_disconnect >= 3);
    assert!(
        total <= at_disconnect + 1,
        "{total} steps in all, {at_disconnect} when the client left"
    );
    srv.stop().await;
}

#[tokio::test]
async fn errors_are_openai_shaped() {
    let mut l = limits();
    l.body_limit = 2048;
    let srv = start_fake(script(byte_ids("ok")), 4096, l).await;
    let check = |resp: &RawResponse, status: u16| {
        assert_eq!(
            resp.status,
            status,
            "{}",
            String::from_utf8_lossy(&resp.body())
        );
        let v = resp.json();
        let e = v["error"].as_object().expect("error object");
        for k in ["message", "type", "param", "code"] {
            assert!(e.contains_key(k), "missing {k} in {v}");
        }
        v
    };
    // Any other model id: 404.
    let body = r#"{"model":"gpt-4o","messages":[{"role":"user","content":"x"}]}"#;
    let v = check(
        &raw_request(srv.addr, "POST", "/v1/chat/completions", body.as_bytes()).await,
        404,
    );
    assert_eq!(v["error"]["code"], "model_not_found");
    let v = check(
        &raw_request(srv.addr, "GET", "/v1/models/gpt-4o", b"").await,
        404,
    );
    assert_eq!(v["error"]["param"], "model");
    // An id in the path that is not UTF-8 once percent-decoded: 400 in the same shape (axum's
    // own rejection is plain text).
    for (method, path) in [
        ("GET", "/v1/models/%FF"),
        ("GET", "/v1/responses/%FF"),
        ("DELETE", "/v1/responses/%FF"),
        ("GET", "/v1/responses/%C3%28/input_items"),
    ] {
        let v = check(&raw_request(srv.addr, method, path, b"").await, 400);
        assert_eq!(v["error"]["code"], "invalid_url", "{method} {path}");
        let message = v["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("UTF-8"), "{method} {path}: {message}");
    }
    // Malformed JSON: 400.
    let v = check(
        &raw_request(srv.addr, "POST", "/v1/chat/completions", b"{\"model\":").await,
        400,
    );
    assert_eq!(v["error"]["code"], "invalid_json");
    let v = check(
        &raw_request(srv.addr, "POST", "/v1/completions", b"[1,2]").await,
        400,
    );
    assert_eq!(v["error"]["code"], "invalid_json");
    // Past the body limit: 413.
    let big = chat_body(&"x".repeat(4000), "");
    let v = check(
        &raw_request(srv.addr, "POST", "/v1/chat/completions", big.as_bytes()).await,
        413,
    );
    assert!(v["error"]["message"]
        .as_str()
        .unwrap_or("")
        .contains("2048"));
    // Unknown route and wrong method.
    check(&raw_request(srv.addr, "GET", "/v2/nothing", b"").await, 404);
    check(
        &raw_request(srv.addr, "GET", "/v1/chat/completions", b"").await,
        405,
    );
    // Refused and out-of-range parameters, by name; accepted at their defaults.
    for (extra, param) in [
        (r#","n":9"#, "n"),
        (r#","tool_choice":"required""#, "tool_choice"),
        (r#","logprobs":"yes""#, "logprobs"),
        (r#","logit_bias":{"7":300}"#, "logit_bias"),
        (r#","presence_penalty":3"#, "presence_penalty"),
        (r#","frequency_penalty":-3"#, "frequency_penalty"),
        (r#","repetition_penalty":0"#, "repetition_penalty"),
        (r#","bogus":1"#, "bogus"),
    ] {
        let resp = raw_request(
            srv.addr,
            "POST",
            "/v1/chat/completions",
            chat_body("x", extra).as_bytes(),
        )
        .await;
        let v = check(&resp, 400);
        assert_eq!(v["error"]["param"], param);
    }
    let defaults = r#","n":1,"tools":[],"tool_choice":"none","logprobs":false,"logit_bias":null,"response_format":{"type":"text"},"presence_penalty":0,"frequency_penalty":0,"repetition_penalty":1"#;
    let resp = raw_request(
        srv.addr,
        "POST",
        "/v1/chat/completions",
        chat_body("x", defaults).as_bytes(),
    )
    .await;
    assert_eq!(resp.status, 200);
    for (extra, param) in [
        (r#","echo":true"#, "echo"),
        (r#","best_of":3"#, "best_of"),
        (r#","suffix":"s""#, "suffix"),
        (r#","logprobs":6"#, "logprobs"),
    ] {
        let body = format!(r#"{{"model":"{MODEL_ID}","prompt":"p"{extra}}}"#);
        let v = check(
            &raw_request(srv.addr, "POST", "/v1/completions", body.as_bytes()).await,
            400,
        );
        assert_eq!(v["error"]["param"], param);
    }
    // A malformed conversation is a 400 naming messages.
    let body = format!(r#"{{"model":"{MODEL_ID}","messages":[]}}"#);
    let v = check(
        &raw_request(srv.addr, "POST", "/v1/chat/completions", body.as_bytes()).await,
        400,
    );
    assert_eq!(v["error"]["param"], "messages");
    srv.stop().await;
}

/// Starts a slow stream on its own connection and returns the reader once the stream is running.
async fn hold_engine(srv: &TestServer) -> HttpReader {
    open_stream(srv.addr).await
}

/// A chat request for the template, from its JSON.
fn chat_request(json: &str) -> aubier_runtime::text::chat::ChatRequest {
    serde_json::from_str(json).expect("a chat request")
}

fn slow_script() -> FakeScript {
    let mut s = script(byte_ids(&"a".repeat(50)));
    s.step_delay = Duration::from_millis(20);
    s
}

#[tokio::test]
async fn a_request_that_waits_past_queue_wait_gets_503_with_retry_after() {
    let mut l = limits();
    l.queue_wait = Duration::from_millis(100);
    let srv = start_fake(slow_script(), 4096, l).await;
    let holder = hold_engine(&srv).await;
    let t0 = Instant::now();
    let resp = raw_request(
        srv.addr,
        "POST",
        "/v1/chat/completions",
        chat_body("y", "").as_bytes(),
    )
    .await;
    assert!(t0.elapsed() >= Duration::from_millis(100));
    assert_eq!(resp.status, 503);
    assert!(resp.header("retry-after").is_some());
    assert_eq!(resp.json()["error"]["type"], "server_error");
    drop(holder);
    srv.stop().await;
}

#[tokio::test]
async fn connections_past_max_conns_get_503() {
    let mut l = limits();
    l.max_conns = 1;
    let srv = start_fake(slow_script(), 4096, l).await;
    let holder = hold_engine(&srv).await;
    let resp = raw_request(srv.addr, "GET", "/v1/models", b"").await;
    assert_eq!(resp.status, 503);
    assert!(resp.header("retry-after").is_some());
    assert_eq!(resp.header("connection"), Some("close"));
    assert!(resp.json()["error"]["message"]
        .as_str()
        .unwrap_or("")
        .contains("--max-conns"));
    // Health and metrics stay reachable for probes; health says the server cannot admit.
    let health = raw_request(srv.addr, "GET", "/health", b"").await;
    assert_eq!(health.status, 503);
    assert_eq!(health.json()["status"], "busy");
    assert!(health.json()["reason"]
        .as_str()
        .unwrap_or("")
        .contains("--max-conns"));
    let metrics = raw_request(srv.addr, "GET", "/metrics", b"").await;
    assert_eq!(metrics.status, 200);
    drop(holder);
    // Once the slot is free again, a new connection is admitted.
    let t0 = Instant::now();
    loop {
        let resp = raw_request(srv.addr, "GET", "/v1/models", b"").await;
        if resp.status == 200 {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "slot never freed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    srv.stop().await;
}

#[tokio::test]
async fn models_health_and_metrics() {
    let srv = start_fake(script(byte_ids("abc")), 4096, limits()).await;
    let v = raw_request(srv.addr, "GET", "/v1/models", b"").await.json();
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["id"], MODEL_ID);
    let v = raw_request(srv.addr, "GET", &format!("/v1/models/{MODEL_ID}"), b"")
        .await
        .json();
    assert_eq!(v["object"], "model");
    let v = raw_request(srv.addr, "GET", "/health", b"").await.json();
    assert_eq!(v["status"], "ok");
    let answer = raw_request(
        srv.addr,
        "POST",
        "/v1/chat/completions",
        chat_body("x", "").as_bytes(),
    )
    .await
    .json();
    let prompt = answer["usage"]["prompt_tokens"]
        .as_u64()
        .expect("prompt_tokens");
    let m = raw_request(srv.addr, "GET", "/metrics", b"").await;
    assert!(m
        .header("content-type")
        .unwrap_or("")
        .starts_with("text/plain"));
    let text = String::from_utf8(m.body()).expect("UTF-8");
    assert!(
        text.contains("aubier_requests_total{route=\"/v1/chat/completions\",status=\"200\"} 1"),
        "{text}"
    );
    assert!(text.contains("aubier_completion_tokens_total 3"), "{text}");
    // 3 tokens, then the step whose output is the end of the script (EOS).
    assert!(text.contains("aubier_engine_steps_total 4"), "{text}");
    // The cache holds the prompt and the 3 tokens stepped after it, of 4096 rows.
    let usage = format!(
        "aubier_kv_cache_usage_ratio {}\n",
        (prompt + 3) as f64 / 4096.0
    );
    assert!(text.contains(&usage), "{usage} missing in\n{text}");
    for family in [
        "aubier_queue_depth",
        "aubier_decode_tokens_per_second",
        "aubier_prompt_tokens_total",
    ] {
        assert!(text.contains(&format!("# TYPE {family} ")), "{family}");
    }
    srv.stop().await;
}
