//! Shared helpers of the `serve_*` tests: start an in-process server on 127.0.0.1:0 with the fake
//! (or real) engine and the bundled model's tokenizer, and talk raw HTTP/1.1 to it.
#![allow(dead_code)]

pub mod process;

use aubier_runtime::gguf::GgufFile;
use aubier_server::serve::engine::{Engine, EngineHandle};
use aubier_server::serve::fake::{FakeEngine, FakeScript};
use aubier_server::serve::metrics::Metrics;
use aubier_server::serve::state::{AppState, HostPolicy, ServerLimits};
use aubier_server::serve::text::TextModel;
use serde_json::Value;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The bundled model, from the repository (never from /work/shared).
pub fn bundled_model() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("models")
        .join("ms4-tiny256-q2k.gguf")
}

/// The bundled model's tokenizer and chat template, loaded once.
pub fn text_model() -> Arc<TextModel> {
    static TEXT: OnceLock<Arc<TextModel>> = OnceLock::new();
    TEXT.get_or_init(|| {
        let file = GgufFile::open(bundled_model()).expect("open the bundled model");
        Arc::new(TextModel::from_gguf(&file).expect("tokenizer and template"))
    })
    .clone()
}

/// One token per UTF-8 byte of `s`: the id of each byte's single-byte token, so that every
/// multi-byte character spans several tokens.
pub fn byte_ids(s: &str) -> Vec<u32> {
    raw_byte_ids(s.as_bytes())
}

/// One token per byte of `bytes` (UTF-8 or not), as [`byte_ids`].
pub fn raw_byte_ids(bytes: &[u8]) -> Vec<u32> {
    let text = text_model();
    let tok = text.tokenizer();
    bytes
        .iter()
        .copied()
        .map(|b| {
            (0..tok.n_vocab() as u32)
                .find(|&id| !tok.is_control(id) && tok.token_bytes(id) == Some(&[b][..]))
                .unwrap_or_else(|| panic!("no single-byte token for {b:#04x}"))
        })
        .collect()
}

/// The served model id of the test servers.
pub const MODEL_ID: &str = "ms4-tiny256-q2k";

/// Limits of a test server: the `aubier serve` defaults (a 1 MiB body limit), overridden per
/// test.
pub fn limits() -> ServerLimits {
    ServerLimits {
        model_id: MODEL_ID.to_owned(),
        queue_wait: Duration::from_secs(30),
        max_requests: 64,
        max_conns: 256,
        body_limit: 1 << 20,
        idle_timeout: Duration::from_secs(10),
        read_timeout: Duration::from_secs(10),
        tokenizers: 2,
        hosts: HostPolicy::for_bind([127, 0, 0, 1].into(), &[]),
        cors_origins: Vec::new(),
    }
}

/// An in-process server.
pub struct TestServer {
    /// Bound address (127.0.0.1, an OS-chosen port).
    pub addr: SocketAddr,
    /// The server's metrics.
    pub metrics: Arc<Metrics>,
    /// The fake engine's step counter (None for the real engine).
    pub steps: Option<Arc<AtomicU64>>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    join: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

impl TestServer {
    /// `http://127.0.0.1:port`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Shuts down (draining) and waits for the server to stop.
    pub async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(j) = self.join.take() {
            j.await.expect("server task").expect("server result");
        }
    }
}

/// Starts a server with `engine` and `limits` (the bundled model's tokenizer and template).
pub async fn start(
    engine: Box<dyn Engine>,
    steps: Option<Arc<AtomicU64>>,
    limits: ServerLimits,
) -> TestServer {
    start_with_text(engine, steps, limits, text_model()).await
}

/// Starts a server with `engine`, `limits` and the text side `text`.
pub async fn start_with_text(
    engine: Box<dyn Engine>,
    steps: Option<Arc<AtomicU64>>,
    limits: ServerLimits,
    text: Arc<TextModel>,
) -> TestServer {
    let metrics = Arc::new(Metrics::default());
    let handle = EngineHandle::spawn(engine, text.clone(), metrics.clone()).expect("engine thread");
    let state = Arc::new(AppState::new(limits, text, handle, metrics.clone()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let join = tokio::spawn(aubier_server::serve::serve(listener, state, async {
        let _ = rx.await;
    }));
    TestServer {
        addr,
        metrics,
        steps,
        shutdown: Some(tx),
        join: Some(join),
    }
}

/// Starts a fake-engine server.
pub async fn start_fake(script: FakeScript, kv_max: usize, limits: ServerLimits) -> TestServer {
    let tok = text_model();
    let engine = FakeEngine::new(
        script,
        kv_max,
        tok.tokenizer().n_vocab(),
        tok.tokenizer().eos_id(),
    );
    let steps = engine.step_counter();
    start(Box::new(engine), Some(steps), limits).await
}

/// Starts a server with the real engine on the bundled model (default backend, the file's
/// context up to 4096 tokens) and the prompt cache on or off.
pub async fn start_real(prompt_cache: bool) -> TestServer {
    use aubier_runtime::backend::registry::BackendSpec;
    use aubier_runtime::engine::Model;
    use aubier_runtime::store::expert_store::StoreOptions;
    use aubier_server::serve::real::RealEngine;
    let model = Model::load_with(&bundled_model(), &BackendSpec::default()).expect("model");
    let kv_max = model.config.n_ctx_train.min(4096);
    let ubatch = aubier_server::run::BackendArgs::default().ubatch;
    let mut engine =
        RealEngine::open(model, kv_max, &StoreOptions::default(), ubatch).expect("session");
    engine.set_prompt_cache(prompt_cache);
    start(Box::new(engine), None, limits()).await
}

/// A fake script producing `ids` with no delay.
pub fn script(ids: Vec<u32>) -> FakeScript {
    FakeScript {
        ids,
        step_delay: Duration::ZERO,
        fail_at_step: None,
    }
}

/// A chat body for the served model with one user message and `extra` JSON fields
/// (`,"k":v,...` or empty).
pub fn chat_body(user: &str, extra: &str) -> String {
    format!(
        r#"{{"model":"{MODEL_ID}","messages":[{{"role":"user","content":{}}}]{extra}}}"#,
        serde_json::to_string(user).expect("json string")
    )
}

/// A raw HTTP/1.1 response: status, lower-cased headers, and the body split into its
/// transfer-encoding chunks (one element when not chunked).
#[derive(Debug)]
pub struct RawResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub chunks: Vec<Vec<u8>>,
}

impl RawResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn body(&self) -> Vec<u8> {
        self.chunks.concat()
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body()).expect("JSON body")
    }

    /// Asserts the status, showing `context` and the body otherwise.
    pub fn assert_status(&self, status: u16, context: &str) {
        assert_eq!(
            self.status,
            status,
            "{context}: {}",
            String::from_utf8_lossy(&self.body())
        );
    }
}

/// POSTs the JSON `body` to `path` and returns the response JSON, asserting status 200.
pub async fn post_json(srv: &TestServer, path: &str, body: &Value) -> Value {
    let resp = raw_request(srv.addr, "POST", path, body.to_string().as_bytes()).await;
    assert_eq!(
        resp.status,
        200,
        "{}",
        String::from_utf8_lossy(&resp.body())
    );
    resp.json()
}

/// Sends one raw request on a fresh connection (`Connection: close`).
pub async fn raw_request(addr: SocketAddr, method: &str, path: &str, body: &[u8]) -> RawResponse {
    raw_request_with(
        addr,
        method,
        path,
        &[
            ("Host", &addr.to_string()),
            ("Content-Type", "application/json"),
        ],
        body,
    )
    .await
}

/// Sends one raw request with exactly `headers` (plus `Content-Length` and `Connection: close`)
/// on a fresh connection.
pub async fn raw_request_with(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> RawResponse {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    let mut head = format!("{method} {path} HTTP/1.1\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str(&format!(
        "Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    ));
    s.write_all(head.as_bytes()).await.expect("write head");
    s.write_all(body).await.expect("write body");
    let mut reader = HttpReader::new(s);
    reader.read_response().await
}

/// Starts a streaming chat request on its own connection and returns the reader after the
/// 200 head and the first SSE chunk.
pub async fn open_stream(addr: SocketAddr) -> HttpReader {
    let body = chat_body("x", r#","stream":true"#);
    let mut conn = TcpStream::connect(addr).await.expect("connect");
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(head.as_bytes()).await.expect("send");
    let mut reader = HttpReader::new(conn);
    let (status, _) = reader.read_head().await;
    assert_eq!(status, 200);
    reader.read_chunk().await.expect("first chunk");
    reader
}

/// Incremental reader of one HTTP/1.1 response (for streaming tests).
pub struct HttpReader {
    pub stream: TcpStream,
    buf: Vec<u8>,
}

impl HttpReader {
    pub fn new(stream: TcpStream) -> HttpReader {
        HttpReader {
            stream,
            buf: Vec::new(),
        }
    }

    async fn fill(&mut self) -> bool {
        let mut tmp = [0u8; 4096];
        let n = self.stream.read(&mut tmp).await.expect("read");
        self.buf.extend_from_slice(&tmp[..n]);
        n > 0
    }

    async fn line(&mut self) -> String {
        loop {
            if let Some(i) = self.buf.windows(2).position(|w| w == b"\r\n") {
                let line = String::from_utf8(self.buf[..i].to_vec()).expect("ASCII line");
                self.buf.drain(..i + 2);
                return line;
            }
            assert!(self.fill().await, "connection closed inside a line");
        }
    }

    async fn exact(&mut self, n: usize) -> Vec<u8> {
        while self.buf.len() < n {
            assert!(self.fill().await, "connection closed inside a body");
        }
        self.buf.drain(..n).collect()
    }

    /// Reads the status line and headers.
    pub async fn read_head(&mut self) -> (u16, Vec<(String, String)>) {
        let status_line = self.line().await;
        let status: u16 = status_line
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("bad status line {status_line:?}"));
        let mut headers = Vec::new();
        loop {
            let l = self.line().await;
            if l.is_empty() {
                break;
            }
            let (k, v) = l.split_once(':').expect("header");
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_owned()));
        }
        (status, headers)
    }

    /// Reads the next transfer-encoding chunk; `None` after the last (zero-size) chunk.
    pub async fn read_chunk(&mut self) -> Option<Vec<u8>> {
        let size_line = self.line().await;
        let size = usize::from_str_radix(size_line.split(';').next().unwrap_or("").trim(), 16)
            .unwrap_or_else(|_| panic!("bad chunk size {size_line:?}"));
        if size == 0 {
            let _ = self.line().await;
            return None;
        }
        let data = self.exact(size).await;
        assert_eq!(self.exact(2).await, b"\r\n", "chunk not followed by CRLF");
        Some(data)
    }

    /// Reads a whole response (chunked or with Content-Length).
    pub async fn read_response(&mut self) -> RawResponse {
        let (status, headers) = self.read_head().await;
        let get = |name: &str| {
            headers
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        };
        let mut chunks = Vec::new();
        if get("transfer-encoding").as_deref() == Some("chunked") {
            while let Some(c) = self.read_chunk().await {
                chunks.push(c);
            }
        } else if let Some(len) = get("content-length") {
            let n: usize = len.parse().expect("content-length");
            chunks.push(self.exact(n).await);
        } else {
            while self.fill().await {}
            chunks.push(std::mem::take(&mut self.buf));
        }
        RawResponse {
            status,
            headers,
            chunks,
        }
    }
}

/// Parses one SSE frame `data: <payload>\n\n` and returns the payload; panics on anything else
/// (two events in one frame, a missing blank line, another field).
pub fn sse_payload(frame: &[u8]) -> String {
    let text = std::str::from_utf8(frame).expect("SSE frame is UTF-8");
    let body = text
        .strip_prefix("data: ")
        .unwrap_or_else(|| panic!("frame does not start with 'data: ': {text:?}"));
    let payload = body
        .strip_suffix("\n\n")
        .unwrap_or_else(|| panic!("frame does not end with a blank line: {text:?}"));
    assert!(
        !payload.contains('\n'),
        "more than one line in a frame: {text:?}"
    );
    payload.to_owned()
}

/// Runs a streaming request over raw HTTP and returns the SSE payloads, checking that every
/// transfer chunk is exactly one event.
pub async fn sse_events(addr: SocketAddr, path: &str, body: &str) -> Vec<String> {
    let resp = raw_request(addr, "POST", path, body.as_bytes()).await;
    assert_eq!(
        resp.status,
        200,
        "{}",
        String::from_utf8_lossy(&resp.body())
    );
    assert_eq!(resp.header("content-type"), Some("text/event-stream"));
    resp.chunks.iter().map(|c| sse_payload(c)).collect()
}

/// The concatenated `content` (and `reasoning_content`) deltas of chat chunk payloads, plus the
/// finish reason.
pub fn chat_stream_text(payloads: &[String]) -> (String, String, Option<String>) {
    let mut content = String::new();
    let mut reasoning = String::new();
    let mut finish = None;
    for p in payloads.iter().filter(|p| p.as_str() != "[DONE]") {
        let v: Value = serde_json::from_str(p).expect("chunk JSON");
        let Some(choices) = v["choices"].as_array() else {
            continue;
        };
        for c in choices {
            if let Some(t) = c["delta"]["content"].as_str() {
                content.push_str(t);
            }
            if let Some(t) = c["delta"]["reasoning_content"].as_str() {
                reasoning.push_str(t);
            }
            if let Some(f) = c["finish_reason"].as_str() {
                finish = Some(f.to_owned());
            }
        }
    }
    (content, reasoning, finish)
}
