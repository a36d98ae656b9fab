//! Routes, handlers and the HTTP plumbing around them: connections and their timeouts,
//! admission, the `Host` / `Origin` / `Content-Type` guards, request metrics, SSE framing.
//!
//! Connections ([`serve`]): hyper's HTTP/1 server on each accepted socket. A watchdog closes a
//! connection that has no request in progress once it has been idle (no byte received) for
//! `--idle-timeout-ms`, or once a request head has been arriving for `--read-timeout-ms`; a body
//! gets `--read-timeout-ms` too (408 past it). Sockets beyond `--max-conns` are answered 503 and
//! closed; admission counts requests in progress (head to the end of the response body), and one
//! beyond `--max-requests` is a 503. `/health` and `/metrics` are outside that count, and
//! `/health` answers 503 whenever a request from that connection would be refused.
//!
//! Guards, in order: a server bound to loopback answers only loopback `Host` names (plus
//! `--allow-host`), 403 otherwise (DNS rebinding); a request with an `Origin` other than its own
//! host is refused 403 unless `--cors-origin` lists it (then the CORS headers and preflights are
//! tower-http's); a POST body must be declared `application/json` (415), which also forces a
//! browser to send a CORS preflight first.
//!
//! Request flow (`/v1/chat/completions`, `/v1/completions`): read the body (413 past the limit),
//! validate it (400 naming the parameter), check the model id (404), build the prompt ids on a
//! blocking thread, at most `tokenizers` at once, stopping as soon as the prompt is longer than
//! the KV cache (400), clamp `max_tokens` to what the cache can still hold (so the answer ends
//! with `finish_reason: "length"` there), wait for the single-flight engine (503 + `Retry-After`
//! past `--queue-wait-ms`), then either stream the engine's events as SSE or collect them into
//! one JSON answer of `n` choices (the engine runs them one after the other). SSE: each chunk is
//! one `data: <json>\n\n` event in its own HTTP chunk, carrying one choice (its `index`, text
//! and log-probability entries, [`super::logprobs`]); the choices follow each other, each closed
//! by its `finish_reason` chunk; the stream always ends with `data: [DONE]`; an engine failure
//! after the stream began is sent as `data: {"error": …}` before it.

use super::api::response::{
    AssistantMessage, ChatChoice, ChatChunkChoice, ChatCompletion, ChatCompletionChunk,
    ChatLogprobs, Completion, CompletionChoice, CompletionChunk, CompletionChunkChoice,
    CompletionLogprobs, CompletionTokensDetails, DebugTokens, Delta, FunctionDelta, Health,
    HealthStatus, Model, ModelList, PromptTokensDetails, ResponseFunction, ResponseToolCall,
    ToolCallDelta as WireToolCallDelta, Usage,
};
use super::engine::{Chunk, EngineHandle, Event, Finish, JobSpec, Summary, TokenEntry};
use super::error::ApiError;
use super::metrics::{Metrics, STATUS_CLIENT_CLOSED};
use super::params::{self, Prompt, Sampling};
use super::text::{TextMode, TextModel, ToolCall, ToolCallDelta};
use super::tools;
use aubier_runtime::generate::GenerateParams;
use aubier_runtime::sampler::SamplingParams;
use aubier_runtime::text::grammar::ContentFormat;
use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{DefaultBodyLimit, Extension, FromRequest, MatchedPath, Path, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::stream::{self, Stream, StreamExt};
use http_body::Frame;
use hyper_util::rt::{TokioIo, TokioTimer};
use serde::Serialize;
use std::convert::Infallible;
use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::sync::Semaphore;
use tower::ServiceExt;
use tower_http::cors::{AllowHeaders, AllowOrigin, CorsLayer};

/// Which `Host` header values the server answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostPolicy {
    /// Any host (bound to a non-loopback address, e.g. behind a load balancer; or
    /// `--allow-host '*'`).
    Any,
    /// Loopback names (`localhost`, `127.0.0.0/8`, `[::1]`, any port) and these extra names
    /// (lower case, without port).
    Loopback(Vec<String>),
}

impl HostPolicy {
    /// The policy of a server bound to `ip` with the `--allow-host` names `allow`: loopback
    /// names only on a loopback address (or when `allow` names hosts), any host otherwise or when
    /// `allow` holds `*`.
    pub fn for_bind(ip: IpAddr, allow: &[String]) -> HostPolicy {
        if allow.iter().any(|h| h == "*") || (!ip.is_loopback() && allow.is_empty()) {
            HostPolicy::Any
        } else {
            HostPolicy::Loopback(allow.iter().map(|h| h.to_ascii_lowercase()).collect())
        }
    }

    /// Whether a request whose `Host` header is `host` (`name[:port]`) is answered.
    pub fn allows(&self, host: Option<&str>) -> bool {
        let extra = match self {
            HostPolicy::Any => return true,
            HostPolicy::Loopback(extra) => extra,
        };
        let Some(name) = host.map(host_name) else {
            return false;
        };
        name == "localhost"
            || name
                .trim_start_matches('[')
                .trim_end_matches(']')
                .parse::<IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
            || extra.contains(&name)
    }
}

/// The name part of a `Host` value, lower case: `[::1]:8080` → `[::1]`, `Example:80` → `example`.
fn host_name(host: &str) -> String {
    let name = match host.rfind(':') {
        Some(i)
            if !host[i + 1..].is_empty() && host[i + 1..].bytes().all(|b| b.is_ascii_digit()) =>
        {
            let name = &host[..i];
            // A bare IPv6 address has colons of its own and no port.
            if name.contains(':') && !name.starts_with('[') {
                host
            } else {
                name
            }
        }
        _ => host,
    };
    name.to_ascii_lowercase()
}

/// Server limits and identity (from the `aubier serve` flags).
#[derive(Clone, Debug, PartialEq)]
pub struct ServerLimits {
    /// The model id served (`--model-id`, default the GGUF file stem).
    pub model_id: String,
    /// Longest wait for the engine (and for a tokenizer slot) before a 503 (`--queue-wait-ms`).
    pub queue_wait: Duration,
    /// Most requests in progress at once; later ones get 503 (`--max-requests`).
    pub max_requests: usize,
    /// Most open connections; requests on later ones get 503 (`--max-conns`).
    pub max_conns: usize,
    /// Largest request body, bytes (`--body-limit`).
    pub body_limit: usize,
    /// A connection with no request in progress and no byte received for this long is closed
    /// (`--idle-timeout-ms`).
    pub idle_timeout: Duration,
    /// Longest time for a request head (from its first byte), and again for its body
    /// (`--read-timeout-ms`).
    pub read_timeout: Duration,
    /// Most prompts tokenized at once.
    pub tokenizers: usize,
    /// Which `Host` values are answered (`--allow-host`).
    pub hosts: HostPolicy,
    /// Origins whose browser requests are answered, with CORS headers (`--cors-origin`; `*` is
    /// any).
    pub cors_origins: Vec<String>,
}

/// Everything the handlers share.
#[derive(Debug)]
pub struct AppState {
    /// Limits and identity.
    pub limits: ServerLimits,
    /// Tokenizer and chat template.
    pub text: Arc<TextModel>,
    /// The single-flight engine.
    pub engine: EngineHandle,
    /// Counters for `/metrics`.
    pub metrics: Arc<Metrics>,
    /// Boot time, Unix seconds (the `created` of the model object).
    pub booted: u64,
    /// Every answer's `system_fingerprint` ([`fingerprint`]).
    pub fingerprint: String,
    /// The stored responses of `/v1/responses` (`previous_response_id`).
    pub responses: super::responses::ResponseStore,
    tokenize: Arc<Semaphore>,
    openapi: String,
}

impl AppState {
    /// Shared state for the router.
    pub fn new(
        limits: ServerLimits,
        text: Arc<TextModel>,
        engine: EngineHandle,
        metrics: Arc<Metrics>,
    ) -> AppState {
        let openapi = super::openapi::spec(
            &limits.model_id,
            text.tokenizer().n_vocab(),
            engine.kv_max(),
        );
        AppState {
            tokenize: Arc::new(Semaphore::new(limits.tokenizers.max(1))),
            fingerprint: fingerprint(&limits.model_id, engine.kv_max()),
            limits,
            text,
            engine,
            metrics,
            booted: unix_now(),
            responses: super::responses::ResponseStore::default(),
            openapi,
        }
    }
}

/// `system_fingerprint`: `fp_` and the FNV-1a hash (64 bits, hex) of the server's version, the
/// served model id and its context, so that answers of one configuration share it.
fn fingerprint(model_id: &str, kv_max: usize) -> String {
    let config = format!("{} {model_id} {kv_max}", env!("CARGO_PKG_VERSION"));
    let hash = config.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("fp_{hash:016x}")
}

/// A completion id no client can guess: the prefix and 128 random bits (from the thread-local
/// generator, seeded from the OS).
fn completion_id(prefix: &str) -> String {
    format!("{prefix}-{:032x}", rand::random::<u128>())
}

pub(super) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// A fresh seed for a request that did not send one (OpenAI sampling is unseeded by default).
fn random_seed() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.finish()
}

/// The router with every route, the guards, admission and metrics.
pub fn router(state: Arc<AppState>) -> Router {
    let limited = Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/responses", post(super::responses::create))
        .route("/debug/tokens", post(debug_tokens))
        .route_layer(middleware::from_fn(require_json))
        .route("/v1/models", get(list_models))
        .route("/v1/models/{id}", get(get_model))
        .route_layer(middleware::from_fn_with_state(state.clone(), admission));
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi))
        .merge(limited)
        .fallback(no_route)
        .method_not_allowed_fallback(wrong_method)
        .layer(cors(&state.limits.cors_origins))
        .layer(middleware::from_fn_with_state(state.clone(), guard))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            count_requests,
        ))
        .layer(DefaultBodyLimit::max(state.limits.body_limit))
        .with_state(state)
}

// ---------------------------------------------------------------------------------------------
// Connections.

/// One accepted connection's state, shared by its socket wrapper, its requests and its
/// watchdog (times are milliseconds since `opened`).
#[derive(Debug)]
pub struct ConnState {
    /// The connection got one of the `--max-conns` slots.
    pub admitted: bool,
    opened: Instant,
    metrics: Arc<Metrics>,
    /// Requests in progress on this connection.
    active: AtomicUsize,
    /// When the connection last became idle (accepted, or a response ended).
    idle_since: AtomicU64,
    /// When the first byte of the next request head arrived; `NO_HEAD` while none has.
    head_since: AtomicU64,
    /// Wakes the watchdog when a head starts, so it can move to the shorter deadline.
    head_started: tokio::sync::Notify,
}

const NO_HEAD: u64 = u64::MAX;

impl ConnState {
    fn open(metrics: &Arc<Metrics>, max_conns: usize) -> Arc<ConnState> {
        let before = metrics.open_connections.fetch_add(1, Ordering::SeqCst);
        Arc::new(ConnState {
            admitted: before < max_conns,
            opened: Instant::now(),
            metrics: metrics.clone(),
            active: AtomicUsize::new(0),
            idle_since: AtomicU64::new(0),
            head_since: AtomicU64::new(NO_HEAD),
            head_started: tokio::sync::Notify::new(),
        })
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.opened.elapsed().as_millis()).unwrap_or(u64::MAX - 1)
    }

    /// Why the watchdog should close the connection now, if it should; else how long to wait
    /// before asking again.
    fn expired(&self, idle: Duration, read: Duration) -> Result<Duration, &'static str> {
        let now = self.now_ms();
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX / 4);
        if self.active.load(Ordering::SeqCst) > 0 {
            return Ok(idle.min(read));
        }
        let (since, limit, why) = match self.head_since.load(Ordering::SeqCst) {
            NO_HEAD => (
                self.idle_since.load(Ordering::SeqCst),
                ms(idle),
                "idle timeout",
            ),
            t => (t, ms(read), "request head timeout"),
        };
        match (since + limit).checked_sub(now) {
            Some(left) if left > 0 => Ok(Duration::from_millis(left)),
            _ => Err(why),
        }
    }
}

impl Drop for ConnState {
    fn drop(&mut self) {
        self.metrics.open_connections.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Marks a request in progress on its connection until dropped (with the response body).
struct Active(Arc<ConnState>);

impl Active {
    fn start(conn: &Arc<ConnState>) -> Active {
        conn.active.fetch_add(1, Ordering::SeqCst);
        conn.head_since.store(NO_HEAD, Ordering::SeqCst);
        Active(conn.clone())
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        let c = &self.0;
        c.idle_since.store(c.now_ms(), Ordering::SeqCst);
        c.active.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The accepted socket: notes when a request head starts arriving.
#[derive(Debug)]
struct TrackedStream {
    stream: TcpStream,
    conn: Arc<ConnState>,
}

impl AsyncRead for TrackedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        if buf.filled().len() > before && self.conn.active.load(Ordering::SeqCst) == 0 {
            let now = self.conn.now_ms();
            let started = self.conn.head_since.compare_exchange(
                NO_HEAD,
                now,
                Ordering::SeqCst,
                Ordering::SeqCst,
            );
            if started.is_ok() {
                self.conn.head_started.notify_one();
            }
        }
        polled
    }
}

impl AsyncWrite for TrackedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// Serves `state` on `listener` until `shutdown` resolves, then drains: the listener closes,
/// idle connections close, requests in progress (and open streams) finish, the engine thread is
/// joined.
///
/// Errors: none from accepting (a failed accept is logged and retried after 50 ms); the engine
/// thread's join failure.
pub async fn serve(
    listener: TcpListener,
    state: Arc<AppState>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = router(state.clone());
    let (closing_tx, closing) = tokio::sync::watch::channel(false);
    let mut conns = tokio::task::JoinSet::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => break,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of descriptors and the like: back off instead of spinning.
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        if let Err(e) = stream.set_nodelay(true) {
            tracing::warn!("TCP_NODELAY: {e}");
        }
        let conn = ConnState::open(&state.metrics, state.limits.max_conns);
        conns.spawn(serve_connection(
            stream,
            conn,
            app.clone(),
            state.limits.clone(),
            closing.clone(),
        ));
        while conns.try_join_next().is_some() {}
    }
    drop(listener);
    let _ = closing_tx.send(true);
    while conns.join_next().await.is_some() {}
    let engine_state = state.clone();
    tokio::task::spawn_blocking(move || engine_state.engine.shutdown())
        .await
        .map_err(std::io::Error::other)
}

/// Serves one connection until the client closes it, the watchdog expires it, or the server
/// drains (`closing` turns true: hyper finishes the request in progress, then closes).
async fn serve_connection(
    stream: TcpStream,
    conn: Arc<ConnState>,
    app: Router,
    limits: ServerLimits,
    mut closing: tokio::sync::watch::Receiver<bool>,
) {
    let io = TokioIo::new(TrackedStream {
        stream,
        conn: conn.clone(),
    });
    let on_conn = conn.clone();
    let service = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
        let active = Active::start(&on_conn);
        let mut req = req.map(Body::new);
        req.extensions_mut().insert(on_conn.clone());
        let app = app.clone();
        async move {
            let resp = app.oneshot(req).await?;
            Ok::<_, Infallible>(on_end(resp, move |_| drop(active)))
        }
    });
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(None);
    let mut served = std::pin::pin!(http.serve_connection(io, service));
    let mut watchdog = std::pin::pin!(async {
        loop {
            match conn.expired(limits.idle_timeout, limits.read_timeout) {
                Ok(wait) => {
                    tokio::select! {
                        () = tokio::time::sleep(wait) => {}
                        () = conn.head_started.notified() => {}
                    }
                }
                Err(why) => return why,
            }
        }
    });
    let mut draining = *closing.borrow();
    if draining {
        served.as_mut().graceful_shutdown();
    }
    loop {
        tokio::select! {
            result = served.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!("connection: {e}");
                }
                return;
            }
            why = &mut watchdog => {
                tracing::debug!("closing a connection: {why}");
                return;
            }
            changed = closing.changed(), if !draining => {
                if changed.is_err() || *closing.borrow() {
                    draining = true;
                    served.as_mut().graceful_shutdown();
                }
            }
        }
    }
}

/// Wraps `resp`'s body so that `done` runs exactly once: with `true` when the body was sent to its
/// end, with `false` when it was dropped before (the client went away).
fn on_end<F>(resp: Response, done: F) -> Response
where
    F: FnOnce(bool) + Send + Unpin + 'static,
{
    resp.map(|inner| {
        Body::new(OnEnd {
            inner,
            done: Some(done),
        })
    })
}

struct OnEnd<F: FnOnce(bool)> {
    inner: Body,
    done: Option<F>,
}

impl<F: FnOnce(bool)> OnEnd<F> {
    fn finish(&mut self, completed: bool) {
        if let Some(done) = self.done.take() {
            done(completed);
        }
    }
}

impl<F: FnOnce(bool) + Unpin> HttpBody for OnEnd<F> {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(None) => self.finish(true),
            Poll::Ready(Some(Err(_))) => self.finish(false),
            Poll::Ready(Some(Ok(_))) if self.inner.is_end_stream() => self.finish(true),
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl<F: FnOnce(bool)> Drop for OnEnd<F> {
    fn drop(&mut self) {
        // A body that is empty from the start is never polled.
        let completed = self.inner.is_end_stream();
        self.finish(completed);
    }
}

/// A slot among the `--max-requests`; released when dropped.
struct Slot(Arc<AppState>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0
            .metrics
            .requests_in_flight
            .fetch_sub(1, Ordering::SeqCst);
    }
}

/// Why a request on `conn` would be refused now, if it would.
fn refusal(app: &AppState, conn: &ConnState) -> Option<String> {
    let l = &app.limits;
    if !conn.admitted {
        Some(format!(
            "Too many connections: the server admits {} at a time (--max-conns).",
            l.max_conns
        ))
    } else if !app.engine.accepting() {
        Some("The engine has shut down.".to_owned())
    } else if app.metrics.requests_in_flight.load(Ordering::SeqCst) >= l.max_requests {
        Some(format!(
            "Too many requests in progress: the server serves {} at a time (--max-requests).",
            l.max_requests
        ))
    } else {
        None
    }
}

async fn admission(
    State(app): State<Arc<AppState>>,
    Extension(conn): Extension<Arc<ConnState>>,
    req: Request,
    next: Next,
) -> Response {
    let max = app.limits.max_requests;
    let took = conn.admitted
        && app
            .metrics
            .requests_in_flight
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < max).then_some(n + 1)
            })
            .is_ok();
    if !took {
        let why = refusal(&app, &conn).unwrap_or_else(|| "The server is busy.".to_owned());
        let mut resp = ApiError::busy(why, 1).into_response();
        if !conn.admitted {
            resp.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        return resp;
    }
    let slot = Slot(app.clone());
    let resp = next.run(req).await;
    on_end(resp, move |_| drop(slot))
}

/// Marks an SSE response whose stream failed after its 200 head (counted as status 500).
#[derive(Clone, Debug, Default)]
pub(super) struct StreamFailed(pub(super) Arc<AtomicBool>);

async fn count_requests(State(app): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| "other".to_owned());
    let started = Instant::now();
    let metrics = app.metrics.clone();
    let pending = PendingCount {
        metrics: metrics.clone(),
        route: route.clone(),
        started,
        armed: true,
    };
    let resp = next.run(req).await;
    pending.disarm();
    let status = resp.status().as_u16();
    let failed = resp.extensions().get::<StreamFailed>().cloned();
    on_end(resp, move |completed| {
        let status = match (completed, failed) {
            (false, _) => STATUS_CLIENT_CLOSED,
            (true, Some(f)) if f.0.load(Ordering::SeqCst) => 500,
            (true, _) => status,
        };
        metrics.count_request(&route, status, started.elapsed());
    })
}

/// Counts a request whose handler was dropped before it answered (the client went away) as 499.
struct PendingCount {
    metrics: Arc<Metrics>,
    route: String,
    started: Instant,
    armed: bool,
}

impl PendingCount {
    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for PendingCount {
    fn drop(&mut self) {
        if self.armed {
            self.metrics
                .count_request(&self.route, STATUS_CLIENT_CLOSED, self.started.elapsed());
        }
    }
}

/// The `Host` and `Origin` guards (module note).
async fn guard(State(app): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let headers = req.headers();
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_owned)
        .or_else(|| req.uri().authority().map(|a| a.to_string()));
    if !app.limits.hosts.allows(host.as_deref()) {
        return ApiError::forbidden(
            "host_not_allowed",
            format!(
                "Host '{}' is not served: this server is bound to a loopback address and answers only loopback names (localhost, 127.0.0.1, [::1]); add others with --allow-host.",
                host.as_deref().unwrap_or("")
            ),
        )
        .into_response();
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let origin = String::from_utf8_lossy(origin.as_bytes()).into_owned();
        if !origin_allowed(&app.limits.cors_origins, &origin, host.as_deref()) {
            return ApiError::forbidden(
                "origin_not_allowed",
                format!(
                    "Cross-origin requests from '{origin}' are refused; allow that origin with --cors-origin."
                ),
            )
            .into_response();
        }
    }
    next.run(req).await
}

/// Whether a browser request from `origin` to `host` is answered: its own origin, or one listed.
fn origin_allowed(listed: &[String], origin: &str, host: Option<&str>) -> bool {
    let own = host.is_some_and(|h| {
        ["http://", "https://"]
            .iter()
            .any(|scheme| origin.eq_ignore_ascii_case(&format!("{scheme}{h}")))
    });
    own || listed
        .iter()
        .any(|o| o == "*" || o.eq_ignore_ascii_case(origin))
}

/// CORS headers and preflight answers for the `--cors-origin` origins (none by default).
fn cors(origins: &[String]) -> CorsLayer {
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        AllowOrigin::list(origins.iter().filter_map(|o| HeaderValue::from_str(o).ok()))
    };
    CorsLayer::new()
        .allow_origin(allow)
        .allow_methods([Method::GET, Method::POST])
        .allow_headers(AllowHeaders::mirror_request())
        .max_age(Duration::from_secs(600))
}

/// 415 unless the body is declared `application/json` (UTF-8, the only charset JSON has).
async fn require_json(req: Request, next: Next) -> Response {
    match json_content_type(req.headers()) {
        Ok(()) => next.run(req).await,
        Err(e) => e.into_response(),
    }
}

fn json_content_type(headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(value) = headers.get(header::CONTENT_TYPE) else {
        return Err(ApiError::not_json(None));
    };
    let text = String::from_utf8_lossy(value.as_bytes());
    let mut parts = text.split(';').map(str::trim);
    let essence = parts.next().unwrap_or("");
    let utf8 = parts.all(|p| match p.split_once('=') {
        Some((k, v)) if k.trim().eq_ignore_ascii_case("charset") => {
            let v = v.trim().trim_matches('"');
            v.eq_ignore_ascii_case("utf-8") || v.eq_ignore_ascii_case("utf8")
        }
        _ => true,
    });
    if essence.eq_ignore_ascii_case("application/json") && utf8 {
        Ok(())
    } else {
        Err(ApiError::not_json(Some(&text)))
    }
}

async fn no_route(method: Method, uri: Uri) -> ApiError {
    ApiError::no_route(method.as_str(), uri.path())
}

async fn wrong_method(method: Method, uri: Uri) -> ApiError {
    ApiError::method_not_allowed(method.as_str(), uri.path())
}

/// Reads the body within `--read-timeout-ms` (408 past it), with axum's rejections turned into
/// OpenAI-shaped errors (413 past `--body-limit`).
pub(super) async fn read_body(app: &AppState, req: Request) -> Result<Bytes, ApiError> {
    let limit = app.limits.read_timeout;
    let body = tokio::time::timeout(limit, Bytes::from_request(req, &()))
        .await
        .map_err(|_| ApiError::body_timeout(limit.as_millis()))?;
    body.map_err(|rej| {
        if rej.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::too_large(app.limits.body_limit)
        } else {
            ApiError::invalid(
                None,
                "invalid_body",
                format!("The request body could not be read: {}.", rej.body_text()),
            )
        }
    })
}

pub(super) fn check_model(app: &AppState, model: &str) -> Result<(), ApiError> {
    if model == app.limits.model_id {
        Ok(())
    } else {
        Err(ApiError::model_not_found(model, &app.limits.model_id))
    }
}

// ---------------------------------------------------------------------------------------------
// Small routes.

async fn health(
    State(app): State<Arc<AppState>>,
    Extension(conn): Extension<Arc<ConnState>>,
) -> Response {
    let model = &app.limits.model_id;
    match refusal(&app, &conn) {
        None => Json(Health {
            status: HealthStatus::Ok,
            model: model.clone(),
            reason: None,
        })
        .into_response(),
        Some(reason) => {
            let mut resp = (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(Health {
                    status: HealthStatus::Busy,
                    model: model.clone(),
                    reason: Some(reason),
                }),
            )
                .into_response();
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(1));
            resp
        }
    }
}

async fn metrics(State(app): State<Arc<AppState>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        )],
        app.metrics.render(),
    )
        .into_response()
}

async fn openapi(State(app): State<Arc<AppState>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        app.openapi.clone(),
    )
        .into_response()
}

fn model_object(app: &AppState) -> Model {
    Model {
        id: app.limits.model_id.clone(),
        object: "model",
        created: app.booted,
        owned_by: "aubier".to_owned(),
    }
}

async fn list_models(State(app): State<Arc<AppState>>) -> Json<ModelList> {
    Json(ModelList {
        object: "list",
        data: vec![model_object(&app)],
    })
}

async fn get_model(
    State(app): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<Model>, ApiError> {
    check_model(&app, &id)?;
    Ok(Json(model_object(&app)))
}

// ---------------------------------------------------------------------------------------------
// Generation routes.

/// Bodies from this size on give their memory back to the OS once the prompt is built.
const TRIM_BYTES: usize = 1 << 20;

/// Returns the allocator's free memory to the OS (glibc keeps freed heap pages mapped otherwise,
/// so the copies a multi-MiB prompt makes would stay in the RSS).
fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim only walks the allocator's own free lists; it has no preconditions.
        unsafe {
            libc::malloc_trim(0);
        }
    }
}

/// Builds the prompt on a blocking thread (template rendering and BPE are CPU work), at most
/// `tokenizers` at once (waiting up to `--queue-wait-ms` for a turn, 503 past it). `build` gets
/// the KV capacity and stops tokenizing past it (`None`), which is a 400 naming `param`. After a
/// body of `body_len` >= 1 MiB, whose text `build` owns and drops, free memory goes back to the OS.
pub(super) async fn prompt_ids<F>(
    app: &Arc<AppState>,
    param: &str,
    body_len: usize,
    build: F,
) -> Result<Vec<u32>, ApiError>
where
    F: FnOnce(&TextModel, usize) -> Result<Option<Vec<u32>>, ApiError> + Send + 'static,
{
    let wait = app.limits.queue_wait;
    let permit = tokio::time::timeout(wait, app.tokenize.clone().acquire_owned())
        .await
        .map_err(|_| {
            ApiError::busy(
                format!(
                    "Every tokenizer is busy with other prompts; waited {} ms (--queue-wait-ms).",
                    wait.as_millis()
                ),
                wait.as_secs().max(1),
            )
        })?
        .map_err(|_| ApiError::busy("The server is shutting down.", 1))?;
    let text = app.text.clone();
    let kv_max = app.engine.kv_max();
    let built = tokio::task::spawn_blocking(move || {
        let _permit = permit;
        let built = build(&text, kv_max);
        if body_len >= TRIM_BYTES {
            release_free_memory();
        }
        built
    })
    .await
    .map_err(|e| ApiError::internal(format!("The tokenizer task failed: {e}.")))??;
    built.ok_or_else(|| too_long(param, &format!("more than {kv_max}"), kv_max))
}

/// 400 `context_length_exceeded` for a prompt of `prompt` tokens.
fn too_long(param: &str, prompt: &str, kv_max: usize) -> ApiError {
    ApiError::invalid(
        Some(param),
        "context_length_exceeded",
        format!(
            "The prompt is {prompt} tokens, but the context (KV cache, --kv-max) holds {kv_max} tokens; shorten the prompt."
        ),
    )
}

/// Refuses a prompt that leaves no room in the context, and clamps `max_tokens` to the room
/// left: prompt and completion together are at most `kv_max` tokens (one limit, as vLLM's
/// `max_model_len`; the last generated token would not need a cache cell, but `usage` counts it).
pub(super) fn budget(
    app: &AppState,
    prompt: usize,
    max_tokens: Option<usize>,
    param: &str,
) -> Result<usize, ApiError> {
    let kv_max = app.engine.kv_max();
    if prompt == 0 {
        return Err(ApiError::bad_value(
            param,
            format!("'{param}' produced no tokens."),
        ));
    }
    if prompt >= kv_max {
        return Err(too_long(param, &prompt.to_string(), kv_max));
    }
    let room = kv_max - prompt;
    Ok(max_tokens.map_or(room, |m| m.min(room)))
}

pub(super) fn generate_params(
    app: &AppState,
    sampling: &Sampling,
    max_tokens: usize,
    logprobs: Option<usize>,
) -> GenerateParams {
    GenerateParams {
        max_tokens,
        sampling: SamplingParams {
            temperature: sampling.temperature,
            top_p: sampling.top_p,
            top_k: sampling.top_k,
            min_p: sampling.min_p,
            presence_penalty: sampling.presence_penalty,
            frequency_penalty: sampling.frequency_penalty,
            repetition_penalty: sampling.repetition_penalty,
            seed: sampling.seed.unwrap_or_else(random_seed),
        },
        ignore_eos: false,
        eos_ids: app.text.eos_ids(),
        keep_prompt_logits: false,
        logprobs,
    }
}

/// Refuses a token id at or past the vocabulary size. Errors: 400 naming `param`.
fn check_vocab(app: &AppState, param: &str, ids: &[u32]) -> Result<(), ApiError> {
    let n_vocab = app.text.tokenizer().n_vocab();
    match ids
        .iter()
        .enumerate()
        .find(|(_, &id)| id as usize >= n_vocab)
    {
        None => Ok(()),
        Some((i, id)) => Err(ApiError::bad_value(
            param,
            format!("'{param}[{i}]' = {id} is not below the vocabulary size {n_vocab}."),
        )),
    }
}

/// One choice of a job, collected: its whole text, its log-probability entries, its summary.
struct Answer {
    reasoning: String,
    content: String,
    tool_calls: Vec<ToolCall>,
    logprobs: Vec<TokenEntry>,
    summary: Summary,
}

/// Collects a job's events into its `choices` answers, in choice order (the engine runs the
/// choices one after the other).
async fn collect(
    mut rx: UnboundedReceiver<Event>,
    choices: usize,
) -> Result<Vec<Answer>, ApiError> {
    let mut answers = Vec::with_capacity(choices);
    let (mut reasoning, mut content, mut logprobs) = (String::new(), String::new(), Vec::new());
    let mut pieces: Vec<ToolCallDelta> = Vec::new();
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Chunk(c) => {
                reasoning.push_str(&c.delta.reasoning);
                content.push_str(&c.delta.content);
                pieces.extend(c.delta.tool_calls);
                logprobs.extend(c.logprobs);
            }
            Event::Done(summary) => {
                answers.push(Answer {
                    reasoning: std::mem::take(&mut reasoning),
                    content: std::mem::take(&mut content),
                    tool_calls: super::text::join_tool_calls(&std::mem::take(&mut pieces)),
                    logprobs: std::mem::take(&mut logprobs),
                    summary,
                });
                if answers.len() == choices {
                    return Ok(answers);
                }
            }
            Event::Failed(e) => return Err(e),
        }
    }
    Err(ApiError::internal(
        "The engine stopped without finishing the request.",
    ))
}

/// The OpenAI `tool_calls` array of a message.
fn response_tool_calls(calls: &[ToolCall]) -> Vec<ResponseToolCall> {
    calls
        .iter()
        .map(|c| ResponseToolCall {
            id: c.id.clone(),
            kind: "function",
            function: ResponseFunction {
                name: c.name.clone(),
                arguments: c.arguments.clone(),
            },
        })
        .collect()
}

/// The OpenAI `delta.tool_calls` array of a streamed chunk.
fn tool_call_deltas(pieces: &[ToolCallDelta]) -> Vec<WireToolCallDelta> {
    pieces
        .iter()
        .map(|p| {
            let (id, name) = match &p.head {
                Some((id, name)) => (Some(id.clone()), Some(name.clone())),
                None => (None, None),
            };
            WireToolCallDelta {
                index: p.index,
                kind: id.is_some().then_some("function"),
                id,
                function: FunctionDelta {
                    name,
                    arguments: p.arguments.clone(),
                },
            }
        })
        .collect()
}

/// The `usage` of a job: the prompt once, the completion tokens of every choice (OpenAI);
/// `prompt_tokens_details.cached_tokens` counts the prompt tokens the prompt cache reused
/// (`--prompt-cache`) for the first choice, as OpenAI and llama.cpp's server report them.
pub(super) fn usage(done: &[Summary]) -> Usage {
    let prompt = done.first().map_or(0, |s| s.prompt_tokens);
    let cached = done.first().map_or(0, |s| s.cached_tokens);
    let completion: usize = done.iter().map(|s| s.ids.len()).sum();
    Usage {
        prompt_tokens: prompt,
        completion_tokens: completion,
        total_tokens: prompt + completion,
        prompt_tokens_details: PromptTokensDetails {
            cached_tokens: cached,
        },
        completion_tokens_details: CompletionTokensDetails {
            reasoning_tokens: done.iter().map(|s| s.reasoning_tokens).sum(),
        },
    }
}

/// One SSE event carrying `v` as JSON, with U+2028 and U+2029 escaped (valid JSON either way,
/// but line splitters that follow Unicode, Python's `str.splitlines` among them, cut an event
/// at them).
pub(super) fn sse_data<T: Serialize>(v: &T) -> SseEvent {
    match serde_json::to_string(v) {
        Ok(json) => SseEvent::default().data(
            json.replace('\u{2028}', "\\u2028")
                .replace('\u{2029}', "\\u2029"),
        ),
        Err(e) => {
            let error = ApiError::internal(format!("A chunk did not serialize: {e}.")).body();
            SseEvent::default().data(serde_json::to_string(&error).unwrap_or_default())
        }
    }
}

/// How a route writes its SSE chunks.
trait ChunkFormat: Send + 'static {
    /// The route's chunk type.
    type Chunk: Serialize;
    /// The chunk that opens choice `choice`, sent before its text (chat: the role delta).
    fn opening(&self, choice: usize) -> Option<Self::Chunk>;
    /// The chunk of a choice's released text.
    fn text(&self, chunk: &Chunk) -> Self::Chunk;
    /// The chunk that closes a choice (its `finish_reason`).
    fn finish(&self, summary: &Summary) -> Self::Chunk;
    /// The usage chunk after the last choice, when the request asked for it.
    fn usage(&self, done: &[Summary]) -> Option<Self::Chunk>;
}

/// Turns a job's events into SSE events: for each choice in turn its opening, a chunk per
/// [`Chunk`], its finish; after the last choice the optional usage chunk, then `[DONE]`. A
/// failure becomes one `{"error": …}` event and sets `failed`.
fn sse_stream<F: ChunkFormat>(
    rx: UnboundedReceiver<Event>,
    choices: usize,
    format: F,
    failed: StreamFailed,
) -> impl Stream<Item = Result<SseEvent, Infallible>> + Send {
    let head = stream::iter(format.opening(0).map(|v| Ok(sse_data(&v))));
    let state = (rx, format, Vec::<Summary>::new());
    let body = stream::unfold(Some(state), move |state| {
        let failed = failed.clone();
        async move {
            let (mut rx, format, mut done) = state?;
            let events: Vec<SseEvent> = match rx.recv().await {
                Some(Event::Chunk(c)) => {
                    let ev = vec![sse_data(&format.text(&c))];
                    return Some((ev, Some((rx, format, done))));
                }
                Some(Event::Done(s)) => {
                    let mut ev = vec![sse_data(&format.finish(&s))];
                    done.push(s);
                    if done.len() < choices {
                        ev.extend(format.opening(done.len()).map(|v| sse_data(&v)));
                        return Some((ev, Some((rx, format, done))));
                    }
                    ev.extend(format.usage(&done).map(|v| sse_data(&v)));
                    ev
                }
                Some(Event::Failed(e)) => {
                    failed.0.store(true, Ordering::SeqCst);
                    vec![sse_data(&e.body())]
                }
                None => {
                    failed.0.store(true, Ordering::SeqCst);
                    vec![sse_data(
                        &ApiError::internal("The engine stopped without finishing the request.")
                            .body(),
                    )]
                }
            };
            Some((events, None))
        }
    })
    .flat_map(|events| stream::iter(events.into_iter().map(Ok)));
    let done = stream::once(async { Ok(SseEvent::default().data("[DONE]")) });
    head.chain(body).chain(done)
}

/// The SSE response of a job (see [`sse_stream`]), marked so that a failed stream is not counted
/// as a 200.
fn sse_response<F: ChunkFormat>(
    rx: UnboundedReceiver<Event>,
    choices: usize,
    format: F,
) -> Response {
    let failed = StreamFailed::default();
    let mut resp = Sse::new(sse_stream(rx, choices, format, failed.clone())).into_response();
    resp.extensions_mut().insert(failed);
    resp
}

/// What every chunk of a stream shares: `id`, `created`, `model`, and whether `usage: null`
/// rides on each (with `stream_options.include_usage`).
struct ChunkHead {
    id: String,
    created: u64,
    model: String,
    fingerprint: String,
    include_usage: bool,
}

impl ChunkHead {
    /// The `usage` of a choice's chunk: `null` with `include_usage`, absent otherwise.
    fn no_usage_yet(&self) -> Option<Option<Usage>> {
        self.include_usage.then_some(None)
    }
}

/// The chat route's chunks.
struct ChatChunks {
    head: ChunkHead,
    text: Arc<TextModel>,
    logprobs: bool,
}

impl ChatChunks {
    fn chunk(
        &self,
        choices: Vec<ChatChunkChoice>,
        usage: Option<Option<Usage>>,
    ) -> ChatCompletionChunk {
        ChatCompletionChunk {
            id: self.head.id.clone(),
            object: "chat.completion.chunk",
            created: self.head.created,
            model: self.head.model.clone(),
            system_fingerprint: self.head.fingerprint.clone(),
            choices,
            usage,
        }
    }

    fn choice(
        &self,
        index: usize,
        delta: Delta,
        logprobs: Option<ChatLogprobs>,
        finish_reason: Option<Finish>,
    ) -> ChatCompletionChunk {
        let choice = ChatChunkChoice {
            index,
            delta,
            logprobs,
            finish_reason,
        };
        self.chunk(vec![choice], self.head.no_usage_yet())
    }
}

/// `s`, or `None` when empty.
fn non_empty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_owned())
}

impl ChunkFormat for ChatChunks {
    type Chunk = ChatCompletionChunk;

    fn opening(&self, choice: usize) -> Option<ChatCompletionChunk> {
        let delta = Delta {
            role: Some("assistant"),
            content: Some(String::new()),
            ..Delta::default()
        };
        Some(self.choice(choice, delta, None, None))
    }

    fn text(&self, c: &Chunk) -> ChatCompletionChunk {
        let delta = Delta {
            role: None,
            content: non_empty(&c.delta.content),
            reasoning_content: non_empty(&c.delta.reasoning),
            tool_calls: tool_call_deltas(&c.delta.tool_calls),
        };
        let logprobs = self
            .logprobs
            .then(|| super::logprobs::chat(&self.text, &c.logprobs));
        self.choice(c.choice, delta, logprobs, None)
    }

    fn finish(&self, s: &Summary) -> ChatCompletionChunk {
        self.choice(s.choice, Delta::default(), None, Some(s.finish))
    }

    fn usage(&self, done: &[Summary]) -> Option<ChatCompletionChunk> {
        self.head
            .include_usage
            .then(|| self.chunk(Vec::new(), Some(Some(usage(done)))))
    }
}

/// The legacy completions route's chunks.
struct CompletionChunks {
    head: ChunkHead,
    text: Arc<TextModel>,
    logprobs: bool,
}

impl CompletionChunks {
    fn chunk(
        &self,
        choices: Vec<CompletionChunkChoice>,
        usage: Option<Option<Usage>>,
    ) -> CompletionChunk {
        CompletionChunk {
            id: self.head.id.clone(),
            object: "text_completion",
            created: self.head.created,
            model: self.head.model.clone(),
            system_fingerprint: self.head.fingerprint.clone(),
            choices,
            usage,
        }
    }

    fn choice(
        &self,
        index: usize,
        text: &str,
        logprobs: Option<CompletionLogprobs>,
        finish_reason: Option<Finish>,
    ) -> CompletionChunk {
        let choice = CompletionChunkChoice {
            index,
            text: text.to_owned(),
            logprobs,
            finish_reason,
        };
        self.chunk(vec![choice], self.head.no_usage_yet())
    }
}

impl ChunkFormat for CompletionChunks {
    type Chunk = CompletionChunk;

    fn opening(&self, _choice: usize) -> Option<CompletionChunk> {
        None
    }

    fn text(&self, c: &Chunk) -> CompletionChunk {
        let logprobs = self
            .logprobs
            .then(|| super::logprobs::completion(&self.text, &c.logprobs));
        self.choice(c.choice, &c.delta.content, logprobs, None)
    }

    fn finish(&self, s: &Summary) -> CompletionChunk {
        self.choice(s.choice, "", None, Some(s.finish))
    }

    fn usage(&self, done: &[Summary]) -> Option<CompletionChunk> {
        self.head
            .include_usage
            .then(|| self.chunk(Vec::new(), Some(Some(usage(done)))))
    }
}

async fn chat_completions(
    State(app): State<Arc<AppState>>,
    req: Request,
) -> Result<Response, ApiError> {
    let received = Instant::now();
    let bytes = read_body(&app, req).await?;
    let body_len = bytes.len();
    let mut p = params::parse_chat(&bytes)?;
    drop(bytes);
    check_model(&app, &p.model)?;
    let chat = std::mem::take(&mut p.chat);
    let prompt = prompt_ids(&app, "messages", body_len, move |t, limit| {
        t.chat_prompt_within(&chat, limit)
    })
    .await?;
    let max_tokens = budget(&app, prompt.len(), p.max_tokens, "messages")?;
    // Stop strings cut free text only: JSON held to `response_format` is never cut, as tool-call
    // arguments are not (a cut value would not parse).
    let json_content = p
        .structured
        .grammar
        .as_ref()
        .is_some_and(|g| g.content != ContentFormat::Text);
    // One fresh matcher per choice, compiled off the async threads.
    let constraints = match p.structured.grammar.take() {
        None => Vec::new(),
        Some(spec) => {
            let text = app.text.clone();
            let n = p.n;
            tokio::task::spawn_blocking(move || {
                (0..n)
                    .map(|_| tools::compile(text.grammar(), &spec))
                    .collect::<Result<Vec<_>, _>>()
            })
            .await
            .map_err(|e| ApiError::internal(format!("The grammar compiler task failed: {e}.")))??
        }
    };
    let spec = JobSpec {
        prompt,
        params: generate_params(&app, &p.sampling, max_tokens, p.logprobs),
        mode: TextMode::Chat {
            stops: if json_content {
                Vec::new()
            } else {
                p.stop.clone()
            },
            tool_calls: p.structured.tool_calls,
        },
        constraints,
        received,
        choices: p.n,
    };
    let rx = app.engine.submit(spec, app.limits.queue_wait).await?;
    let id = completion_id("chatcmpl");
    let created = unix_now();
    let model = app.limits.model_id.clone();
    if !p.stream {
        let answers = collect(rx, p.n).await?;
        let choices = answers
            .iter()
            .map(|a| ChatChoice {
                index: a.summary.choice,
                message: AssistantMessage {
                    role: "assistant",
                    content: (!a.content.is_empty() || a.tool_calls.is_empty())
                        .then(|| a.content.clone()),
                    reasoning_content: non_empty(&a.reasoning),
                    refusal: (),
                    tool_calls: response_tool_calls(&a.tool_calls),
                },
                logprobs: p
                    .logprobs
                    .map(|_| super::logprobs::chat(&app.text, &a.logprobs)),
                finish_reason: a.summary.finish,
            })
            .collect();
        let done: Vec<Summary> = answers.into_iter().map(|a| a.summary).collect();
        return Ok(Json(ChatCompletion {
            id,
            object: "chat.completion",
            created,
            model,
            system_fingerprint: app.fingerprint.clone(),
            choices,
            usage: usage(&done),
        })
        .into_response());
    }
    let format = ChatChunks {
        head: ChunkHead {
            id,
            created,
            model,
            fingerprint: app.fingerprint.clone(),
            include_usage: p.include_usage,
        },
        text: app.text.clone(),
        logprobs: p.logprobs.is_some(),
    };
    Ok(sse_response(rx, p.n, format))
}

async fn completions(State(app): State<Arc<AppState>>, req: Request) -> Result<Response, ApiError> {
    let received = Instant::now();
    let bytes = read_body(&app, req).await?;
    let body_len = bytes.len();
    let mut p = params::parse_completion(&bytes)?;
    drop(bytes);
    check_model(&app, &p.model)?;
    let prompt = match std::mem::replace(&mut p.prompt, Prompt::Ids(Vec::new())) {
        Prompt::Text(text) => {
            prompt_ids(&app, "prompt", body_len, move |t, limit| {
                t.completion_prompt_within(&text, limit)
            })
            .await?
        }
        Prompt::Ids(ids) => {
            check_vocab(&app, "prompt", &ids)?;
            ids
        }
    };
    let max_tokens = budget(&app, prompt.len(), Some(p.max_tokens), "prompt")?;
    let spec = JobSpec {
        prompt,
        params: generate_params(&app, &p.sampling, max_tokens, p.logprobs),
        mode: TextMode::Completion {
            stops: p.stop.clone(),
        },
        constraints: Vec::new(),
        received,
        choices: p.n,
    };
    let rx = app.engine.submit(spec, app.limits.queue_wait).await?;
    let id = completion_id("cmpl");
    let created = unix_now();
    let model = app.limits.model_id.clone();
    if !p.stream {
        let answers = collect(rx, p.n).await?;
        let choices = answers
            .iter()
            .map(|a| CompletionChoice {
                index: a.summary.choice,
                text: a.content.clone(),
                logprobs: p
                    .logprobs
                    .map(|_| super::logprobs::completion(&app.text, &a.logprobs)),
                finish_reason: a.summary.finish,
            })
            .collect();
        let done: Vec<Summary> = answers.into_iter().map(|a| a.summary).collect();
        return Ok(Json(Completion {
            id,
            object: "text_completion",
            created,
            model,
            system_fingerprint: app.fingerprint.clone(),
            choices,
            usage: usage(&done),
        })
        .into_response());
    }
    let format = CompletionChunks {
        head: ChunkHead {
            id,
            created,
            model,
            fingerprint: app.fingerprint.clone(),
            include_usage: p.include_usage,
        },
        text: app.text.clone(),
        logprobs: p.logprobs.is_some(),
    };
    Ok(sse_response(rx, p.n, format))
}

async fn debug_tokens(
    State(app): State<Arc<AppState>>,
    req: Request,
) -> Result<Json<DebugTokens>, ApiError> {
    let received = Instant::now();
    let bytes = read_body(&app, req).await?;
    let p = params::parse_debug_tokens(&bytes)?;
    if let Some(m) = &p.model {
        check_model(&app, m)?;
    }
    check_vocab(&app, "ids", &p.ids)?;
    let max_tokens = budget(&app, p.ids.len(), Some(p.max_tokens), "ids")?;
    let mut params = generate_params(&app, &p.sampling, max_tokens, None);
    params.ignore_eos = p.ignore_eos;
    let prompt_tokens = p.ids.len();
    let spec = JobSpec {
        prompt: p.ids,
        params,
        mode: TextMode::Ids,
        constraints: Vec::new(),
        received,
        choices: 1,
    };
    let rx = app.engine.submit(spec, app.limits.queue_wait).await?;
    let s = collect(rx, 1)
        .await?
        .pop()
        .map(|a| a.summary)
        .ok_or_else(|| ApiError::internal("The engine returned no answer."))?;
    Ok(Json(DebugTokens {
        ids: s.ids,
        finish_reason: s.finish,
        prompt_tokens,
        cached_tokens: s.cached_tokens,
        prefill_tok_s: s.prefill_tok_s,
        decode_tok_s: s.decode_tok_s,
    }))
}
