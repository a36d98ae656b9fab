//! `aubier serve` as a process: the lock file (exit 69), SIGTERM draining the running stream and
//! releasing the lock, the bundled model as the default, a clear error for a missing model.

mod serve_common;

use serde_json::Value;
use serve_common::process::{scratch_dir, Proc};
use serve_common::{sse_payload, HttpReader, MODEL_ID};
use std::path::Path;
use std::time::{Duration, Instant};

/// `aubier serve --engine fake --port 0 --lock-file DIR/serve.lock ARGS` in `dir`, with `env`.
fn serve_fake(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Proc {
    let lock = dir.join("serve.lock");
    let head = ["--engine", "fake", "--port", "0", "--lock-file"];
    let lock = [lock.to_str().expect("path")];
    Proc::serve(&[&head[..], &lock, args].concat(), dir, env)
}

/// SIGINT to a serving `p`, which exits 0 within 30 s.
fn stop(mut p: Proc) {
    p.signal(libc::SIGINT);
    let (code, lines) = p.wait(Duration::from_secs(30));
    assert_eq!(code, Some(0), "{lines:?}");
}

#[test]
fn a_held_lock_file_makes_serve_exit_69_after_the_wait() {
    let dir = scratch_dir("serve-cli", "lock");
    let lock = dir.join("held.lock");
    let holder = std::fs::File::create(&lock).expect("lock file");
    holder.try_lock().expect("take the lock");
    let t0 = Instant::now();
    let mut p = Proc::serve(
        &[
            "--engine",
            "fake",
            "--port",
            "0",
            "--lock-file",
            lock.to_str().expect("path"),
            "--lock-wait-ms",
            "300",
        ],
        &dir,
        &[],
    );
    let (code, lines) = p.wait(Duration::from_secs(30));
    assert_eq!(code, Some(69), "{lines:?}");
    assert!(t0.elapsed() >= Duration::from_millis(300));
    let text = lines.join("\n");
    assert!(
        text.contains("held.lock") && text.contains("--lock-wait-ms"),
        "{text}"
    );
    drop(holder);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn sigterm_drains_the_running_stream_then_releases_the_lock() {
    let dir = scratch_dir("serve-cli", "drain");
    let lock = dir.join("serve.lock");
    let script = dir.join("script.json");
    let text = "draining is polite";
    std::fs::write(&script, format!(r#"{{"text":"{text}","step_ms":40}}"#)).expect("script");
    let mut p = Proc::serve(
        &[
            "--engine",
            "fake",
            "--port",
            "0",
            "--lock-file",
            lock.to_str().expect("path"),
            "--fake-script",
            script.to_str().expect("path"),
        ],
        &dir,
        &[],
    );
    let addr = p.address();
    // The lock is held while serving.
    let probe = std::fs::File::open(&lock).expect("lock file exists");
    assert!(probe.try_lock().is_err(), "lock not held while serving");
    let body = format!(
        r#"{{"model":"{MODEL_ID}","messages":[{{"role":"user","content":"hi"}}],"stream":true}}"#
    );
    let mut conn = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    tokio::io::AsyncWriteExt::write_all(&mut conn, head.as_bytes())
        .await
        .expect("send");
    let mut reader = HttpReader::new(conn);
    assert_eq!(reader.read_head().await.0, 200);
    let mut payloads = vec![sse_payload(&reader.read_chunk().await.expect("role chunk"))];
    p.signal(libc::SIGTERM);
    while let Some(frame) = reader.read_chunk().await {
        payloads.push(sse_payload(&frame));
    }
    assert_eq!(payloads.last().map(String::as_str), Some("[DONE]"));
    let mut content = String::new();
    for pl in &payloads[..payloads.len() - 1] {
        let v: Value = serde_json::from_str(pl).expect("chunk");
        content.push_str(v["choices"][0]["delta"]["content"].as_str().unwrap_or(""));
    }
    assert_eq!(content, text, "the running request was cut");
    let (code, lines) = p.wait(Duration::from_secs(30));
    assert_eq!(code, Some(0), "{lines:?}");
    // Released: we can take it now.
    probe.try_lock().expect("lock released on shutdown");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn with_no_model_flag_the_bundled_model_is_served() {
    let dir = scratch_dir("serve-cli", "bundled");
    let p = serve_fake(&dir, &[], &[]);
    let addr = p.address();
    let resp = serve_common::raw_request(addr, "GET", "/v1/models", b"").await;
    assert_eq!(resp.json()["data"][0]["id"], MODEL_ID);
    // The README's default context on the bundled model: min(context_length, 4096).
    assert_eq!(resp.json()["data"][0]["max_model_len"], 4096);
    stop(p);
    let p = serve_fake(&dir, &["--kv-max", "1000"], &[]);
    let resp = serve_common::raw_request(p.address(), "GET", "/v1/models", b"").await;
    assert_eq!(resp.json()["data"][0]["max_model_len"], 1000, "--kv-max");
    stop(p);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_missing_model_is_a_clear_error() {
    let dir = scratch_dir("serve-cli", "missing");
    let mut p = serve_fake(&dir, &[], &[("AUBIER_MODEL", "/nonexistent/model.gguf")]);
    let (code, lines) = p.wait(Duration::from_secs(30));
    assert_eq!(code, Some(1));
    assert!(
        lines.join("\n").contains("/nonexistent/model.gguf"),
        "{lines:?}"
    );
    let mut p = serve_fake(&dir, &["--model", "nope.gguf"], &[]);
    let (code, lines) = p.wait(Duration::from_secs(30));
    assert_eq!(code, Some(1));
    assert!(lines.join("\n").contains("nope.gguf"), "{lines:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// An --cors-origin no browser sends (a trailing `/`, no scheme, a query or fragment, a port
/// past 65535) and a --body-limit of 0 are refused when parsed: the first refused every browser
/// request with 403, the second every request body with 413, and nothing said why. A flag that
/// is accepted starts a server (fake engine), which the wait stops instead of hanging the test.
#[test]
fn an_origin_no_browser_sends_and_a_zero_body_limit_are_refused() {
    let dir = scratch_dir("serve-cli", "refused-flags");
    for (args, what) in [
        (
            ["--cors-origin", "http://localhost:3000/"],
            "has a path or a trailing `/`",
        ),
        (["--cors-origin", "localhost:3000"], "has no scheme"),
        (
            ["--cors-origin", "http://localhost:3000?x=1"],
            "has a query or fragment",
        ),
        (
            ["--cors-origin", "http://localhost:3000#top"],
            "has a query or fragment",
        ),
        (
            ["--cors-origin", "http://localhost:99999"],
            "that is not 0-65535",
        ),
        (["--body-limit", "0"], "0 would refuse every request body"),
    ] {
        let mut p = serve_fake(&dir, &args, &[]);
        let (code, lines) = p.wait(Duration::from_secs(30));
        let err = lines.join("\n");
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert!(
            err.contains(what) && err.contains(args[0]),
            "{args:?}: {err}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// An --cors-origin spelled with upper case or a default port is answered as the origin a browser
/// sends (lower case, no `:80` / `:443`): it had been kept as typed, so `http://localhost:80` got
/// 403 and `HTTP://LocalHost:3000` an answer with no CORS header, which the browser refuses.
#[tokio::test]
async fn an_origin_in_upper_case_or_with_a_default_port_matches_what_browsers_send() {
    let dir = scratch_dir("serve-cli", "cors-spelling");
    let p = serve_fake(
        &dir,
        &[
            "--cors-origin",
            "HTTP://LocalHost:3000",
            "--cors-origin",
            "http://localhost:80",
            "--cors-origin",
            "https://Example.COM:443",
        ],
        &[],
    );
    let addr = p.address();
    for origin in [
        "http://localhost:3000",
        "http://localhost",
        "https://example.com",
    ] {
        let resp = serve_common::raw_request_with(
            addr,
            "GET",
            "/v1/models",
            &[("Host", &addr.to_string()), ("Origin", origin)],
            b"",
        )
        .await;
        resp.assert_status(200, origin);
        assert_eq!(
            resp.header("access-control-allow-origin"),
            Some(origin),
            "{:?}",
            resp.headers
        );
    }
    stop(p);
    let _ = std::fs::remove_dir_all(&dir);
}
