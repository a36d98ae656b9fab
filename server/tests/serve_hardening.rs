//! The defects of the break-it pass (issue 25), one test each, with the fake engine and the
//! bundled model's tokenizer: f32 narrowing of sampling values, header / idle / body timeouts,
//! admission counting requests rather than sockets, /health under load, bounded tokenization,
//! content type, Host and Origin, integer fields, one unknown-field policy, `n`, `max_tokens`
//! messages, unguessable ids, stream outcomes and histograms in /metrics, /openapi.json.

mod serve_common;

use aubier_server::serve::api::request::TokenizeChatRequest;
use aubier_server::serve::state::HostPolicy;
use serde_json::Value;
use serve_common::*;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn post_chat(srv: &TestServer, extra: &str) -> impl std::future::Future<Output = RawResponse> {
    let body = chat_body("hi", extra);
    let addr = srv.addr;
    async move { raw_request(addr, "POST", "/v1/chat/completions", body.as_bytes()).await }
}

fn error_param(resp: &RawResponse) -> Value {
    resp.json()["error"]["param"].clone()
}

async fn metrics_text(srv: &TestServer) -> String {
    String::from_utf8(raw_request(srv.addr, "GET", "/metrics", b"").await.body()).expect("UTF-8")
}

/// Reads from `s` until EOF or `limit`; `true` when the server closed the connection in time.
async fn closed_within(s: &mut TcpStream, limit: Duration) -> bool {
    let mut buf = [0u8; 1024];
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        match tokio::time::timeout(limit.saturating_sub(t0.elapsed()), s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => {}
            Err(_) => return false,
        }
    }
    false
}

/// Asserts that the server closes `s` within 5 s, and not before `at_least` after `t0`.
async fn assert_closed_after(s: &mut TcpStream, t0: Instant, at_least: Duration) {
    assert!(closed_within(s, Duration::from_secs(5)).await, "still open");
    assert!(t0.elapsed() >= at_least, "closed after {:?}", t0.elapsed());
}

#[tokio::test]
async fn a_top_p_that_narrows_to_zero_is_a_400_not_a_500() {
    let srv = start_fake(script(byte_ids("ok")), 4096, limits()).await;
    for top_p in ["5e-324", "1e-46", "7e-46"] {
        let resp = post_chat(&srv, &format!(r#","top_p":{top_p}"#)).await;
        assert_eq!(resp.status, 400, "top_p {top_p}: {:?}", resp.json());
        assert_eq!(error_param(&resp), "top_p");
        let body = format!(r#"{{"model":"{MODEL_ID}","prompt":"p","top_p":{top_p}}}"#);
        let resp = raw_request(srv.addr, "POST", "/v1/completions", body.as_bytes()).await;
        assert_eq!(resp.status, 400, "completions, top_p {top_p}");
    }
    // The smallest value that stays above 0 in f32, and a temperature that narrows to 0
    // (greedy, which the sampler accepts), are answered.
    for extra in [r#","top_p":1e-45"#, r#","temperature":1e-46"#] {
        assert_eq!(post_chat(&srv, extra).await.status, 200, "{extra}");
    }
    srv.stop().await;
}

/// Opens a connection and sends the first half of a request head.
async fn half_head(srv: &TestServer) -> TcpStream {
    let mut s = TcpStream::connect(srv.addr).await.expect("connect");
    s.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Len")
        .await
        .expect("half a head");
    s
}

#[tokio::test]
async fn sockets_with_half_a_head_do_not_lock_requests_out() {
    let l = limits();
    let srv = start_fake(script(byte_ids("ok")), 4096, l.clone()).await;
    let mut held = Vec::new();
    for _ in 0..l.max_requests + 8 {
        held.push(half_head(&srv).await);
    }
    // Every socket is accepted before the probes below.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let models = raw_request(srv.addr, "GET", "/v1/models", b"").await;
    assert_eq!(models.status, 200, "{:?}", models.json());
    assert_eq!(post_chat(&srv, "").await.status, 200);
    let health = raw_request(srv.addr, "GET", "/health", b"").await;
    assert_eq!(health.status, 200);
    drop(held);
    srv.stop().await;
}

#[tokio::test]
async fn a_head_that_never_completes_is_closed_after_the_read_timeout() {
    let mut l = limits();
    l.read_timeout = Duration::from_millis(300);
    let srv = start_fake(script(byte_ids("ok")), 4096, l).await;
    let t0 = Instant::now();
    let mut s = half_head(&srv).await;
    assert_closed_after(&mut s, t0, Duration::from_millis(250)).await;
    srv.stop().await;
}

#[tokio::test]
async fn an_idle_keep_alive_connection_is_closed_after_the_idle_timeout() {
    let mut l = limits();
    l.idle_timeout = Duration::from_millis(400);
    let srv = start_fake(script(byte_ids("ok")), 4096, l).await;
    let s = TcpStream::connect(srv.addr).await.expect("connect");
    let mut reader = HttpReader::new(s);
    let get = format!("GET /v1/models HTTP/1.1\r\nHost: {}\r\n\r\n", srv.addr);
    for _ in 0..2 {
        // Keep-alive: two requests on one connection, the second after a pause shorter than
        // the idle timeout.
        reader.stream.write_all(get.as_bytes()).await.expect("send");
        assert_eq!(reader.read_response().await.status, 200);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let t0 = Instant::now();
    assert_closed_after(&mut reader.stream, t0, Duration::from_millis(200)).await;
    srv.stop().await;
}

#[tokio::test]
async fn a_body_that_does_not_arrive_is_a_408() {
    let mut l = limits();
    l.read_timeout = Duration::from_millis(300);
    let srv = start_fake(script(byte_ids("ok")), 4096, l).await;
    let mut s = TcpStream::connect(srv.addr).await.expect("connect");
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"model\":",
        srv.addr
    );
    s.write_all(head.as_bytes()).await.expect("send");
    let mut reader = HttpReader::new(s);
    let resp = tokio::time::timeout(Duration::from_secs(5), reader.read_response())
        .await
        .expect("an answer within 5 s");
    assert_eq!(resp.status, 408);
    assert_eq!(resp.json()["error"]["code"], "request_timeout");
    srv.stop().await;
}

#[tokio::test]
async fn health_is_503_while_a_request_would_be_refused() {
    let mut l = limits();
    l.max_requests = 1;
    let mut s = script(byte_ids(&"a".repeat(200)));
    s.step_delay = Duration::from_millis(20);
    let srv = start_fake(s, 4096, l).await;
    let health = raw_request(srv.addr, "GET", "/health", b"").await;
    assert_eq!(
        (health.status, health.json()["status"].clone()),
        (200, "ok".into())
    );
    let holder = open_stream(srv.addr).await;
    let health = raw_request(srv.addr, "GET", "/health", b"").await;
    assert_eq!(health.status, 503);
    assert!(health.header("retry-after").is_some());
    let v = health.json();
    assert_eq!(v["status"], "busy");
    assert!(
        v["reason"]
            .as_str()
            .unwrap_or("")
            .contains("--max-requests"),
        "{v}"
    );
    let refused = raw_request(srv.addr, "GET", "/v1/models", b"").await;
    assert_eq!(refused.status, 503);
    for (path, body) in [
        ("/tokenize", &br#"{"prompt":"x"}"#[..]),
        ("/detokenize", br#"{"tokens":[1]}"#),
    ] {
        let refused = raw_request(srv.addr, "POST", path, body).await;
        refused.assert_status(503, path);
    }
    drop(holder);
    let t0 = Instant::now();
    while raw_request(srv.addr, "GET", "/health", b"").await.status != 200 {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the slot never came back"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    srv.stop().await;
}

#[tokio::test]
async fn prompts_far_past_the_context_are_refused_without_tokenizing_them_whole() {
    let mut l = limits();
    l.body_limit = 5 << 20;
    let srv = start_fake(script(byte_ids("ok")), 256, l).await;
    // Just under 4 MiB of varied words: tokenizing it whole takes seconds and hundreds of MiB.
    let words = [
        "lighthouse ",
        "keeper ",
        "Überfahrt ",
        "42 ",
        "naïve, ",
        "\n",
    ];
    let mut long = String::new();
    let mut i = 0usize;
    while long.len() < (4 << 20) - 1024 {
        long.push_str(words[i % words.len()]);
        i = i.wrapping_mul(31).wrapping_add(7) % 1_000_003;
    }
    let chat = chat_body(&long, "");
    let completion = format!(
        r#"{{"model":"{MODEL_ID}","prompt":{}}}"#,
        serde_json::to_string(&long).expect("JSON")
    );
    let t0 = Instant::now();
    let bodies = [
        ("/v1/chat/completions", chat.clone()),
        ("/v1/completions", completion.clone()),
        ("/v1/chat/completions", chat),
        ("/v1/completions", completion),
    ];
    let answers = futures::future::join_all(
        bodies
            .iter()
            .map(|(path, body)| raw_request(srv.addr, "POST", path, body.as_bytes())),
    )
    .await;
    let elapsed = t0.elapsed();
    for resp in &answers {
        assert_eq!(resp.status, 400);
        let v = resp.json();
        assert_eq!(v["error"]["code"], "context_length_exceeded", "{v}");
        assert!(v["error"]["message"].as_str().unwrap_or("").contains("256"));
    }
    assert!(
        elapsed < Duration::from_secs(3),
        "{elapsed:?} for 4 refusals"
    );
    srv.stop().await;
}

#[tokio::test]
async fn a_body_not_declared_json_is_a_415_with_a_hint() {
    let srv = start_fake(script(byte_ids("ok")), 4096, limits()).await;
    let body = chat_body("hi", "");
    let host = srv.addr.to_string();
    for content_type in [
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
        Some("application/json; charset=latin1"),
        None,
    ] {
        let mut headers = vec![("Host", host.as_str())];
        headers.extend(content_type.map(|t| ("Content-Type", t)));
        for path in [
            "/v1/chat/completions",
            "/v1/completions",
            "/tokenize",
            "/detokenize",
            "/debug/tokens",
        ] {
            let resp = raw_request_with(srv.addr, "POST", path, &headers, body.as_bytes()).await;
            assert_eq!(resp.status, 415, "{content_type:?} on {path}");
            let v = resp.json();
            assert_eq!(v["error"]["code"], "unsupported_media_type");
            assert!(
                v["error"]["message"]
                    .as_str()
                    .unwrap_or("")
                    .contains("Content-Type: application/json"),
                "{v}"
            );
        }
    }
    let resp = raw_request_with(
        srv.addr,
        "POST",
        "/v1/chat/completions",
        &[
            ("Host", &host),
            ("Content-Type", "Application/JSON; charset=UTF-8"),
        ],
        body.as_bytes(),
    )
    .await;
    assert_eq!(resp.status, 200);
    srv.stop().await;
}

/// A compressed body is a 415 naming its Content-Encoding, with `Accept-Encoding: identity`: it
/// had been read as JSON and answered 400 "not valid JSON". `identity` is the body as sent.
#[tokio::test]
async fn a_compressed_body_is_a_415_naming_the_encoding() {
    let srv = start_fake(script(byte_ids("ok")), 4096, limits()).await;
    let host = srv.addr.to_string();
    // A gzip member's header, then bytes that are not JSON (the body is never decompressed).
    let gzipped = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff\xab\xae\x05\x00";
    for encoding in ["gzip", "br", "deflate", "GZIP", "identity, gzip"] {
        for path in [
            "/v1/chat/completions",
            "/v1/completions",
            "/v1/responses",
            "/v1/responses/input_tokens",
            "/tokenize",
            "/detokenize",
            "/debug/tokens",
        ] {
            let headers = [
                ("Host", host.as_str()),
                ("Content-Type", "application/json"),
                ("Content-Encoding", encoding),
            ];
            let resp = raw_request_with(srv.addr, "POST", path, &headers, gzipped).await;
            resp.assert_status(415, &format!("{encoding} on {path}"));
            assert_eq!(resp.header("accept-encoding"), Some("identity"));
            let v = resp.json();
            assert_eq!(v["error"]["code"], "unsupported_content_encoding");
            let message = v["error"]["message"].as_str().unwrap_or("");
            assert!(
                message.contains(&format!("Content-Encoding '{encoding}'")),
                "{v}"
            );
        }
    }
    let body = chat_body("hi", "");
    let headers = [
        ("Host", host.as_str()),
        ("Content-Type", "application/json"),
        ("Content-Encoding", "Identity"),
    ];
    let resp = raw_request_with(
        srv.addr,
        "POST",
        "/v1/chat/completions",
        &headers,
        body.as_bytes(),
    )
    .await;
    resp.assert_status(200, "identity");
    srv.stop().await;
}

async fn status_with_host(srv: &TestServer, host: &str) -> u16 {
    raw_request_with(srv.addr, "GET", "/v1/models", &[("Host", host)], b"")
        .await
        .status
}

#[tokio::test]
async fn a_loopback_server_answers_only_loopback_host_names() {
    let srv = start_fake(script(byte_ids("ok")), 4096, limits()).await;
    let port = srv.addr.port();
    for host in [
        "evil.example",
        &format!("evil.example:{port}"),
        "127.0.0.1.evil.example",
    ] {
        let resp = raw_request_with(srv.addr, "GET", "/v1/models", &[("Host", host)], b"").await;
        assert_eq!(resp.status, 403, "{host}");
        let v = resp.json();
        assert_eq!(v["error"]["code"], "host_not_allowed");
        assert!(v["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("--allow-host"));
    }
    for host in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        "LOCALHOST".to_owned(),
        format!("[::1]:{port}"),
        "127.0.0.2".to_owned(),
    ] {
        assert_eq!(status_with_host(&srv, &host).await, 200, "{host}");
    }
    srv.stop().await;
    // --allow-host adds names; a server bound for a load balancer answers any.
    let mut l = limits();
    l.hosts = HostPolicy::for_bind([127, 0, 0, 1].into(), &["API.internal".to_owned()]);
    let srv = start_fake(script(byte_ids("ok")), 4096, l).await;
    assert_eq!(status_with_host(&srv, "api.internal:8080").await, 200);
    assert_eq!(status_with_host(&srv, "evil.example").await, 403);
    srv.stop().await;
    let mut l = limits();
    l.hosts = HostPolicy::for_bind([0, 0, 0, 0].into(), &[]);
    let srv = start_fake(script(byte_ids("ok")), 4096, l).await;
    assert_eq!(status_with_host(&srv, "aubier.example.com").await, 200);
    srv.stop().await;
}

#[tokio::test]
async fn cross_origin_browser_requests_are_refused_unless_listed() {
    let mut l = limits();
    l.cors_origins = vec!["http://localhost:3000".to_owned()];
    let srv = start_fake(script(byte_ids("ok")), 4096, l).await;
    let host = srv.addr.to_string();
    let body = chat_body("hi", "");
    let with_origin = |origin: String| {
        let host = host.clone();
        let body = body.clone();
        let addr = srv.addr;
        async move {
            raw_request_with(
                addr,
                "POST",
                "/v1/chat/completions",
                &[
                    ("Host", &host),
                    ("Origin", &origin),
                    ("Content-Type", "application/json"),
                ],
                body.as_bytes(),
            )
            .await
        }
    };
    for origin in ["http://evil.example", "null", "http://localhost:3001"] {
        let resp = with_origin(origin.to_owned()).await;
        assert_eq!(resp.status, 403, "{origin}");
        assert_eq!(resp.json()["error"]["code"], "origin_not_allowed");
    }
    let resp = with_origin("http://localhost:3000".to_owned()).await;
    assert_eq!(resp.status, 200);
    assert_eq!(
        resp.header("access-control-allow-origin"),
        Some("http://localhost:3000")
    );
    let preflight = raw_request_with(
        srv.addr,
        "OPTIONS",
        "/v1/chat/completions",
        &[
            ("Host", &host),
            ("Origin", "http://localhost:3000"),
            ("Access-Control-Request-Method", "POST"),
            (
                "Access-Control-Request-Headers",
                "content-type,authorization",
            ),
        ],
        b"",
    )
    .await;
    assert_eq!(preflight.status, 200);
    assert_eq!(
        preflight.header("access-control-allow-origin"),
        Some("http://localhost:3000")
    );
    // DELETE /v1/responses/{id} (openai-js's responses.delete in a browser) is allowed too.
    let delete = raw_request_with(
        srv.addr,
        "OPTIONS",
        "/v1/responses/resp_1",
        &[
            ("Host", &host),
            ("Origin", "http://localhost:3000"),
            ("Access-Control-Request-Method", "DELETE"),
        ],
        b"",
    )
    .await;
    assert_eq!(delete.status, 200);
    let methods = delete
        .header("access-control-allow-methods")
        .unwrap_or_default();
    assert!(methods.contains("DELETE"), "{methods}");
    let refused = raw_request_with(
        srv.addr,
        "OPTIONS",
        "/v1/chat/completions",
        &[
            ("Host", &host),
            ("Origin", "http://evil.example"),
            ("Access-Control-Request-Method", "POST"),
        ],
        b"",
    )
    .await;
    assert_eq!(refused.status, 403);
    // A request from the server's own origin is not cross-origin.
    assert_eq!(with_origin(format!("http://{host}")).await.status, 200);
    srv.stop().await;
}

#[tokio::test]
async fn integer_fields_take_integral_floats() {
    let srv = start_fake(script(byte_ids("abcdef")), 4096, limits()).await;
    let v = post_chat(&srv, r#","max_tokens":2.0,"seed":7.0,"top_k":3.0,"n":1.0"#)
        .await
        .json();
    assert_eq!(v["usage"]["completion_tokens"], 2, "{v}");
    let body = format!(r#"{{"model":"{MODEL_ID}","prompt":"p","max_tokens":3.0}}"#);
    let v = raw_request(srv.addr, "POST", "/v1/completions", body.as_bytes())
        .await
        .json();
    assert_eq!(v["choices"][0]["text"], "abc");
    let ids = byte_ids("hi");
    let body = format!(r#"{{"ids":[{}.0,{}],"max_tokens":1.0}}"#, ids[0], ids[1]);
    let resp = raw_request(srv.addr, "POST", "/debug/tokens", body.as_bytes()).await;
    assert_eq!(resp.status, 200, "{:?}", resp.json());
    for (extra, param) in [
        (r#","max_tokens":2.5"#, "max_tokens"),
        (r#","seed":1e20"#, "seed"),
        (r#","top_k":-2.0"#, "top_k"),
    ] {
        let resp = post_chat(&srv, extra).await;
        assert_eq!(
            (resp.status, error_param(&resp)),
            (400, param.into()),
            "{extra}"
        );
    }
    srv.stop().await;
}

#[tokio::test]
async fn unknown_fields_inside_messages_are_refused_by_name_like_top_level_ones() {
    let srv = start_fake(script(byte_ids("ok")), 4096, limits()).await;
    let chat = |messages: &str| format!(r#"{{"model":"{MODEL_ID}","messages":{messages}}}"#);
    for (messages, param, code) in [
        (
            r#"[{"role":"user","content":"hi","colour":"blue"}]"#,
            "messages[0].colour",
            "unknown_parameter",
        ),
        (
            r#"[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"hi","x":1}]}]"#,
            "messages[1].content[0].x",
            "unknown_parameter",
        ),
        (
            r#"[{"role":"user","content":"hi"},{"role":"assistant","content":"no","refusal":"I refuse"},{"role":"user","content":"hi"}]"#,
            "messages[1].refusal",
            "unsupported_parameter",
        ),
        (
            r#"[{"role":"user","content":"hi"},{"role":"assistant","tool_calls":[{"id":"a","type":"function","function":{"name":"f","arguments":"{}","strict":true}}]},{"role":"tool","tool_call_id":"a","content":"1"}]"#,
            "messages[1].tool_calls[0].function.strict",
            "unknown_parameter",
        ),
    ] {
        let resp = raw_request(
            srv.addr,
            "POST",
            "/v1/chat/completions",
            chat(messages).as_bytes(),
        )
        .await;
        assert_eq!(resp.status, 400, "{messages}");
        let v = resp.json();
        assert_eq!(v["error"]["param"], param, "{v}");
        assert_eq!(v["error"]["code"], code, "{v}");
    }
    // OpenAI message fields at their defaults (as openai-python sends a returned message back).
    let ok = r#"[{"role":"user","content":"hi"},{"role":"assistant","content":"yes","refusal":null,"audio":null,"function_call":null,"annotations":[]},{"role":"user","content":"more"}]"#;
    let resp = raw_request(
        srv.addr,
        "POST",
        "/v1/chat/completions",
        chat(ok).as_bytes(),
    )
    .await;
    assert_eq!(resp.status, 200, "{:?}", resp.json());
    srv.stop().await;
}

#[tokio::test]
async fn n_outside_1_to_8_is_invalid_and_max_tokens_has_one_message() {
    let srv = start_fake(script(byte_ids("ok")), 4096, limits()).await;
    for (extra, code) in [
        (r#","n":0"#, "invalid_value"),
        (r#","n":-1"#, "invalid_value"),
        (r#","n":1.5"#, "invalid_value"),
        (r#","n":9"#, "invalid_value"),
    ] {
        let resp = post_chat(&srv, extra).await;
        let v = resp.json();
        assert_eq!(
            (resp.status, v["error"]["param"].clone()),
            (400, "n".into()),
            "{extra}"
        );
        assert_eq!(v["error"]["code"], code, "{extra}");
    }
    let body = format!(r#"{{"model":"{MODEL_ID}","prompt":"p","best_of":0}}"#);
    let v = raw_request(srv.addr, "POST", "/v1/completions", body.as_bytes())
        .await
        .json();
    assert_eq!(v["error"]["code"], "invalid_value");
    let messages: BTreeSet<String> = futures::future::join_all(
        ["-1", "0", "0.5", "\"8\""]
            .iter()
            .map(|m| post_chat(&srv, &format!(r#","max_tokens":{m}"#))),
    )
    .await
    .iter()
    .map(|r| {
        let msg = r.json()["error"]["message"]
            .as_str()
            .unwrap_or("")
            .to_owned();
        // The value sent ends the message; the rest must be the same sentence.
        msg.rsplit_once("got ")
            .map(|(head, _)| head.to_owned())
            .unwrap_or(msg)
    })
    .collect();
    assert_eq!(messages.len(), 1, "{messages:?}");
    assert!(
        messages.iter().all(|m| m.contains("integer >= 1")),
        "{messages:?}"
    );
    srv.stop().await;
}

#[tokio::test]
async fn completion_ids_are_128_random_bits() {
    let srv = start_fake(script(byte_ids("ok")), 4096, limits()).await;
    let mut ids = BTreeSet::new();
    for _ in 0..4 {
        let v = post_chat(&srv, "").await.json();
        ids.insert(v["id"].as_str().unwrap_or("").to_owned());
    }
    let body = format!(r#"{{"model":"{MODEL_ID}","prompt":"p"}}"#);
    let v = raw_request(srv.addr, "POST", "/v1/completions", body.as_bytes())
        .await
        .json();
    let cmpl = v["id"].as_str().unwrap_or("").to_owned();
    let hex = |id: &str, prefix: &str| -> Option<u128> {
        let digits = id.strip_prefix(prefix)?;
        (digits.len() == 32).then(|| u128::from_str_radix(digits, 16).ok())?
    };
    assert!(hex(&cmpl, "cmpl-").is_some(), "{cmpl}");
    let values: Vec<u128> = ids
        .iter()
        .map(|id| hex(id, "chatcmpl-").unwrap_or_else(|| panic!("{id}")))
        .collect();
    assert_eq!(values.len(), 4);
    // Sequential ids differ in a few low bits; random ones in about half of 128.
    for (a, b) in values.iter().zip(&values[1..]) {
        assert!((a ^ b).count_ones() >= 24, "{a:032x} {b:032x}");
    }
    srv.stop().await;
}

/// The count of `aubier_requests_total` for `route` and `status`.
fn requests(text: &str, route: &str, status: u16) -> u64 {
    let prefix = format!("aubier_requests_total{{route=\"{route}\",status=\"{status}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn cancelled_and_failed_streams_are_not_counted_as_200() {
    let mut s = script(byte_ids(&"abcdefghij".repeat(20)));
    s.fail_at_step = Some(4);
    s.step_delay = Duration::from_millis(10);
    let srv = start_fake(s, 4096, limits()).await;
    let route = "/v1/chat/completions";
    // Fails at the engine's step 4: a 200 head, then an error event.
    let payloads = sse_events(srv.addr, route, &chat_body("x", r#","stream":true"#)).await;
    assert!(payloads.iter().any(|p| p.contains("\"error\"")));
    // Completes.
    let payloads = sse_events(
        srv.addr,
        route,
        &chat_body("x", r#","stream":true,"max_tokens":3"#),
    )
    .await;
    assert_eq!(payloads.last().map(String::as_str), Some("[DONE]"));
    // Cancelled: the client leaves after the first chunk.
    drop(open_stream(srv.addr).await);
    let t0 = Instant::now();
    let text = loop {
        let text = metrics_text(&srv).await;
        if requests(&text, route, 499) > 0 {
            break text;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "no 499 in\n{text}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(requests(&text, route, 500), 1, "{text}");
    assert_eq!(requests(&text, route, 200), 1, "{text}");
    assert_eq!(requests(&text, route, 499), 1, "{text}");
    srv.stop().await;
}

/// A HEAD request is answered with its head alone, as HTTP wants, and counted with its status:
/// the body a HEAD answer never sends is not a client that left (499).
#[tokio::test]
async fn head_requests_are_counted_with_their_status() {
    let srv = start_fake(script(byte_ids("ok")), 4096, limits()).await;
    let routes = ["/health", "/v1/models"];
    for route in routes {
        let mut s = TcpStream::connect(srv.addr).await.expect("connect");
        let head = format!(
            "HEAD {route} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            srv.addr
        );
        s.write_all(head.as_bytes()).await.expect("write head");
        let (status, _) = HttpReader::new(s).read_head().await;
        assert_eq!(status, 200, "{route}");
    }
    // Each is counted once its body is done with, shortly after its head was written.
    let t0 = Instant::now();
    let text = loop {
        let text = metrics_text(&srv).await;
        let counted = |r| requests(&text, r, 200) + requests(&text, r, 499);
        if routes.iter().all(|r| counted(r) > 0) {
            break text;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "uncounted in\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    for route in routes {
        assert_eq!(requests(&text, route, 200), 1, "{route}\n{text}");
        assert_eq!(requests(&text, route, 499), 0, "{route}\n{text}");
    }
    srv.stop().await;
}

#[tokio::test]
async fn metrics_have_latency_and_first_token_histograms_and_process_figures() {
    let srv = start_fake(script(byte_ids("abc")), 4096, limits()).await;
    assert_eq!(post_chat(&srv, "").await.status, 200);
    let text = metrics_text(&srv).await;
    for family in [
        "# TYPE aubier_request_duration_seconds histogram",
        "# TYPE aubier_time_to_first_token_seconds histogram",
        "# TYPE aubier_prefill_tokens_per_second histogram",
        "# TYPE aubier_decode_tokens_per_second histogram",
        "# TYPE aubier_expert_served_ratio gauge",
        "# TYPE process_resident_memory_bytes gauge",
        "# TYPE process_open_fds gauge",
    ] {
        assert!(text.contains(family), "{family} missing in\n{text}");
    }
    assert!(!text.contains("aubier_expert_served_fraction"));
    assert!(
        text.contains("aubier_time_to_first_token_seconds_count 1\n"),
        "{text}"
    );
    assert!(
        text.contains("aubier_request_duration_seconds_count{route=\"/v1/chat/completions\"} 1\n"),
        "{text}"
    );
    srv.stop().await;
}

#[tokio::test]
async fn the_openapi_document_describes_every_route_of_the_served_model() {
    let srv = start_fake(script(byte_ids("ok")), 4096, limits()).await;
    let resp = raw_request(srv.addr, "GET", "/openapi.json", b"").await;
    assert_eq!(resp.status, 200);
    assert_eq!(resp.header("content-type"), Some("application/json"));
    let spec = resp.json();
    let paths: BTreeSet<&str> = spec["paths"]
        .as_object()
        .expect("paths")
        .keys()
        .map(String::as_str)
        .collect();
    let routes: BTreeSet<&str> = [
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/responses",
        "/v1/responses/input_tokens",
        "/v1/responses/{response_id}",
        "/v1/responses/{response_id}/input_items",
        "/tokenize",
        "/detokenize",
        "/debug/tokens",
        "/v1/models",
        "/v1/models/{model}",
        "/health",
        "/metrics",
        "/openapi.json",
    ]
    .into_iter()
    .collect();
    assert_eq!(paths, routes);
    let schemas = &spec["components"]["schemas"];
    assert_eq!(schemas["ModelId"]["enum"], serde_json::json!([MODEL_ID]));
    let n_vocab = text_model().tokenizer().n_vocab();
    assert_eq!(schemas["TokenId"]["maximum"], n_vocab - 1);
    // Exactly the refused parameters are described as such, so a client can see which are
    // accepted only at their default.
    let described = |schema: &str| -> BTreeSet<String> {
        schemas[schema]["properties"]
            .as_object()
            .expect("properties")
            .iter()
            .filter(|(_, p)| {
                p["description"]
                    .as_str()
                    .is_some_and(|d| d.contains("Not implemented: accepted only at its default."))
            })
            .map(|(name, _)| name.clone())
            .collect()
    };
    let names = |it: &mut dyn Iterator<Item = &'static str>| -> BTreeSet<String> {
        it.map(str::to_owned).collect()
    };
    assert_eq!(
        described("ChatCompletionRequest"),
        names(&mut aubier_server::serve::params::refused_chat_parameters())
    );
    assert_eq!(
        described("CompletionRequest"),
        names(&mut aubier_server::serve::params::refused_completion_parameters())
    );
    let tokenize = TokenizeChatRequest::default();
    let tokenize = tokenize.refused();
    assert_eq!(
        described("TokenizeChatRequest"),
        names(&mut tokenize.iter().map(|(name, _, _)| *name))
    );
    srv.stop().await;
}

#[test]
fn chunked_tokenization_gives_the_ids_of_the_whole_text_on_the_bundled_vocabulary() {
    let text = text_model();
    let tok = text.tokenizer();
    let pieces = [
        "The ",
        "lighthouse",
        " keeper's",
        " log:",
        " 1987",
        "-",
        "04",
        "\n\n",
        "   ",
        "\t",
        "Überfahrt",
        " naïve",
        " 東京",
        "😀",
        "...",
        "//",
        "\r\n",
        "CamelCase",
        "x",
        "  \n ",
    ];
    for seed in 0..4u64 {
        let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut s = String::new();
        while s.len() < 200_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            s.push_str(pieces[(state % pieces.len() as u64) as usize]);
        }
        let whole = tok.encode(&s).expect("encode");
        let chunked = tok.encode_within(&s, usize::MAX).expect("encode_within");
        assert_eq!(chunked.as_ref(), Some(&whole), "seed {seed}");
        assert_eq!(
            tok.encode_within(&s, whole.len()).expect("at the limit"),
            Some(whole.clone())
        );
        assert_eq!(
            tok.encode_within(&s, whole.len() - 1).expect("past it"),
            None
        );
    }
}
