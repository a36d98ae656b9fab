//! Routes, handlers and the HTTP plumbing around them: the body limit, connection admission
//! (`--max-conns`), request metrics, SSE framing.
//!
//! Request flow (`/v1/chat/completions`, `/v1/completions`): read the body (413 past the limit),
//! validate it (400 naming the parameter), check the model id (404), build the prompt ids on a
//! blocking thread (chat template / tokenizer), refuse a prompt that alone does not fit the KV
//! cache (400), clamp `max_tokens` to what the cache can still hold (so the answer ends with
//! `finish_reason: "length"` there), wait for the single-flight engine (503 + `Retry-After` past
//! `--queue-wait-ms`), then either stream the engine's events as SSE or collect them into one JSON
//! answer. SSE: each chunk is one `data: <json>\n\n` event in its own HTTP chunk; the stream always
//! ends with `data: [DONE]`; an engine failure after the stream began is sent as
//! `data: {"error": …}` before it.

use super::engine::{EngineHandle, Event, Finish, JobSpec, Summary};
use super::error::ApiError;
use super::metrics::Metrics;
use super::params::{self, Sampling};
use super::text::{TextMode, TextModel};
use aubier_runtime::generate::GenerateParams;
use aubier_runtime::sampler::SamplingParams;
use axum::body::Bytes;
use axum::extract::connect_info::Connected;
use axum::extract::rejection::BytesRejection;
use axum::extract::{ConnectInfo, DefaultBodyLimit, MatchedPath, Path, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode, Uri};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::stream::{self, Stream, StreamExt};
use serde_json::{json, Value};
use std::convert::Infallible;
use std::hash::{BuildHasher, Hasher};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc::UnboundedReceiver;

/// Server limits and identity (from the `aubier serve` flags).
#[derive(Clone, Debug, PartialEq)]
pub struct ServerLimits {
    /// The model id served (`--model-id`, default the GGUF file stem).
    pub model_id: String,
    /// Longest wait for the engine before a 503 (`--queue-wait-ms`).
    pub queue_wait: Duration,
    /// Most open connections admitted; later ones get 503 (`--max-conns`).
    pub max_conns: usize,
    /// Largest request body, bytes (`--body-limit`).
    pub body_limit: usize,
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
    next_id: AtomicU64,
}

impl AppState {
    /// Shared state for the router.
    pub fn new(
        limits: ServerLimits,
        text: Arc<TextModel>,
        engine: EngineHandle,
        metrics: Arc<Metrics>,
    ) -> AppState {
        AppState {
            limits,
            text,
            engine,
            metrics,
            booted: unix_now(),
            next_id: AtomicU64::new(1),
        }
    }

    fn completion_id(&self, prefix: &str) -> String {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        format!("{prefix}-{:x}{n:06x}", self.booted)
    }
}

fn unix_now() -> u64 {
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

/// The router with every route, the body limit, admission and metrics.
pub fn router(state: Arc<AppState>) -> Router {
    let limited = Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(list_models))
        .route("/v1/models/{id}", get(get_model))
        .route("/debug/tokens", post(debug_tokens))
        .route_layer(middleware::from_fn_with_state(state.clone(), admission));
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .merge(limited)
        .fallback(no_route)
        .method_not_allowed_fallback(wrong_method)
        .layer(middleware::from_fn_with_state(
            state.clone(),
            count_requests,
        ))
        .layer(DefaultBodyLimit::max(state.limits.body_limit))
        .with_state(state)
}

// ---------------------------------------------------------------------------------------------
// Connections.

/// Per-connection admission, decided when the connection is accepted: the first `--max-conns`
/// concurrent connections are admitted, any beyond get 503 on every request and are closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Admission {
    /// The connection got one of the `--max-conns` slots.
    pub admitted: bool,
}

/// A TCP listener that counts open connections and marks those beyond the limit (see
/// [`Admission`]).
#[derive(Debug)]
pub struct AdmissionListener {
    inner: TcpListener,
    max_conns: usize,
    metrics: Arc<Metrics>,
}

impl AdmissionListener {
    /// Wraps a bound listener.
    pub fn new(inner: TcpListener, max_conns: usize, metrics: Arc<Metrics>) -> AdmissionListener {
        AdmissionListener {
            inner,
            max_conns,
            metrics,
        }
    }
}

/// An accepted connection; frees its slot when hyper drops it.
#[derive(Debug)]
pub struct CountedStream {
    stream: TcpStream,
    slot: Option<Arc<Metrics>>,
}

impl Drop for CountedStream {
    fn drop(&mut self) {
        if let Some(m) = self.slot.take() {
            m.open_connections.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl AsyncRead for CountedStream {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for CountedStream {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

impl axum::serve::Listener for AdmissionListener {
    type Io = CountedStream;
    type Addr = (SocketAddr, Admission);

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        let (stream, addr) = loop {
            match self.inner.accept().await {
                Ok(pair) => break pair,
                Err(e) => {
                    // Out of descriptors and the like: back off instead of spinning.
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        };
        if let Err(e) = stream.set_nodelay(true) {
            tracing::warn!("TCP_NODELAY: {e}");
        }
        let max = self.max_conns;
        let admitted = self
            .metrics
            .open_connections
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < max).then_some(n + 1)
            })
            .is_ok();
        let slot = admitted.then(|| self.metrics.clone());
        (
            CountedStream { stream, slot },
            (addr, Admission { admitted }),
        )
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok((self.inner.local_addr()?, Admission { admitted: true }))
    }
}

impl Connected<axum::serve::IncomingStream<'_, AdmissionListener>> for Admission {
    fn connect_info(stream: axum::serve::IncomingStream<'_, AdmissionListener>) -> Self {
        stream.remote_addr().1
    }
}

async fn admission(
    State(app): State<Arc<AppState>>,
    ConnectInfo(adm): ConnectInfo<Admission>,
    req: Request,
    next: Next,
) -> Response {
    if adm.admitted {
        return next.run(req).await;
    }
    let mut resp = ApiError::busy(
        format!(
            "Too many connections: the server admits {} at a time (--max-conns).",
            app.limits.max_conns
        ),
        1,
    )
    .into_response();
    resp.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    resp
}

async fn count_requests(State(app): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| "other".to_owned());
    let resp = next.run(req).await;
    app.metrics.count_request(&route, resp.status().as_u16());
    resp
}

async fn no_route(method: Method, uri: Uri) -> ApiError {
    ApiError::no_route(method.as_str(), uri.path())
}

async fn wrong_method(method: Method, uri: Uri) -> ApiError {
    ApiError::method_not_allowed(method.as_str(), uri.path())
}

/// The body bytes, with axum's rejections turned into OpenAI-shaped errors (413 past the limit).
fn body_bytes(app: &AppState, body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
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

fn check_model(app: &AppState, model: &str) -> Result<(), ApiError> {
    if model == app.limits.model_id {
        Ok(())
    } else {
        Err(ApiError::model_not_found(model, &app.limits.model_id))
    }
}

// ---------------------------------------------------------------------------------------------
// Small routes.

async fn health(State(app): State<Arc<AppState>>) -> Json<Value> {
    Json(json!({"status": "ok", "model": app.limits.model_id}))
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

fn model_object(app: &AppState) -> Value {
    json!({
        "id": app.limits.model_id,
        "object": "model",
        "created": app.booted,
        "owned_by": "aubier",
    })
}

async fn list_models(State(app): State<Arc<AppState>>) -> Json<Value> {
    Json(json!({"object": "list", "data": [model_object(&app)]}))
}

async fn get_model(
    State(app): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    check_model(&app, &id)?;
    Ok(Json(model_object(&app)))
}

// ---------------------------------------------------------------------------------------------
// Generation routes.

/// Builds the prompt on a blocking thread (template rendering and BPE are CPU work).
async fn prompt_ids<F>(app: &Arc<AppState>, build: F) -> Result<Vec<u32>, ApiError>
where
    F: FnOnce(&TextModel) -> Result<Vec<u32>, ApiError> + Send + 'static,
{
    let text = app.text.clone();
    tokio::task::spawn_blocking(move || build(&text))
        .await
        .map_err(|e| ApiError::internal(format!("The tokenizer task failed: {e}.")))?
}

/// Refuses a prompt that alone does not fit, and clamps `max_tokens` to the room left: a prompt
/// of `p` tokens in a cache of `kv_max` cells leaves room for `kv_max - p + 1` generated tokens
/// (the last one is sampled but never written to the cache).
fn budget(
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
    if prompt > kv_max {
        return Err(ApiError::invalid(
            Some(param),
            "context_length_exceeded",
            format!(
                "The prompt is {prompt} tokens, but the context (KV cache, --kv-max) holds {kv_max} tokens; shorten the prompt."
            ),
        ));
    }
    let room = kv_max - prompt + 1;
    Ok(max_tokens.map_or(room, |m| m.min(room)))
}

fn generate_params(app: &AppState, sampling: &Sampling, max_tokens: usize) -> GenerateParams {
    GenerateParams {
        max_tokens,
        sampling: SamplingParams {
            temperature: sampling.temperature,
            top_p: sampling.top_p,
            top_k: sampling.top_k,
            seed: sampling.seed.unwrap_or_else(random_seed),
        },
        ignore_eos: false,
        eos_ids: app.text.eos_ids(),
        keep_prompt_logits: false,
    }
}

/// Collects a job's events: the whole text and the summary.
async fn collect(mut rx: UnboundedReceiver<Event>) -> Result<(String, String, Summary), ApiError> {
    let mut reasoning = String::new();
    let mut content = String::new();
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Delta(d) => {
                reasoning.push_str(&d.reasoning);
                content.push_str(&d.content);
            }
            Event::Done(s) => return Ok((reasoning, content, s)),
            Event::Failed(e) => return Err(e),
        }
    }
    Err(ApiError::internal(
        "The engine stopped without finishing the request.",
    ))
}

fn usage(s: &Summary) -> Value {
    json!({
        "prompt_tokens": s.prompt_tokens,
        "completion_tokens": s.ids.len(),
        "total_tokens": s.prompt_tokens + s.ids.len(),
    })
}

fn sse_data(v: &Value) -> SseEvent {
    SseEvent::default().data(v.to_string())
}

/// Turns a job's events into SSE events: `chunk(delta)` for each delta, `last(summary)` for the
/// finish, optional usage chunk, then `[DONE]`; a failure becomes one `{"error": …}` event.
fn sse_stream<C, L>(
    rx: UnboundedReceiver<Event>,
    first: Option<Value>,
    chunk: C,
    last: L,
) -> impl Stream<Item = Result<SseEvent, Infallible>> + Send
where
    C: Fn(&super::text::Delta) -> Value + Send + 'static,
    L: Fn(&Summary) -> Vec<Value> + Send + 'static,
{
    let head = stream::iter(first.map(|v| Ok(sse_data(&v))));
    let body = stream::unfold(Some((rx, chunk, last)), |state| async move {
        let (mut rx, chunk, last) = state?;
        let events: Vec<SseEvent> = match rx.recv().await {
            Some(Event::Delta(d)) => {
                let ev = vec![sse_data(&chunk(&d))];
                return Some((ev, Some((rx, chunk, last))));
            }
            Some(Event::Done(s)) => last(&s).iter().map(sse_data).collect(),
            Some(Event::Failed(e)) => vec![sse_data(&e.to_value())],
            None => vec![sse_data(
                &ApiError::internal("The engine stopped without finishing the request.").to_value(),
            )],
        };
        Some((events, None))
    })
    .flat_map(|events| stream::iter(events.into_iter().map(Ok)));
    let done = stream::once(async { Ok(SseEvent::default().data("[DONE]")) });
    head.chain(body).chain(done)
}

async fn chat_completions(
    State(app): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let bytes = body_bytes(&app, body)?;
    let p = params::parse_chat(&bytes)?;
    check_model(&app, &p.model)?;
    let chat = p.chat.clone();
    let prompt = prompt_ids(&app, move |t| t.chat_prompt(chat)).await?;
    let max_tokens = budget(&app, prompt.len(), p.max_tokens, "messages")?;
    let spec = JobSpec {
        prompt,
        params: generate_params(&app, &p.sampling, max_tokens),
        mode: TextMode::Chat {
            stops: p.stop.clone(),
        },
    };
    let rx = app.engine.submit(spec, app.limits.queue_wait).await?;
    let id = app.completion_id("chatcmpl");
    let created = unix_now();
    let model = app.limits.model_id.clone();
    if !p.stream {
        let (reasoning, content, s) = collect(rx).await?;
        let mut message = json!({"role": "assistant", "content": content});
        message["reasoning_content"] = if reasoning.is_empty() {
            Value::Null
        } else {
            Value::String(reasoning)
        };
        return Ok(Json(json!({
            "id": id,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [{
                "index": 0,
                "message": message,
                "logprobs": null,
                "finish_reason": s.finish.as_str(),
            }],
            "usage": usage(&s),
        }))
        .into_response());
    }
    let include_usage = p.include_usage;
    let base = json!({
        "id": id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
    });
    let with_choice = move |delta: Value, finish: Option<Finish>| {
        let mut v = base.clone();
        v["choices"] = json!([{
            "index": 0,
            "delta": delta,
            "logprobs": null,
            "finish_reason": finish.map(Finish::as_str),
        }]);
        if include_usage {
            v["usage"] = Value::Null;
        }
        v
    };
    let first = with_choice(json!({"role": "assistant", "content": ""}), None);
    let chunk_of = with_choice.clone();
    let chunk = move |d: &super::text::Delta| {
        let mut delta = serde_json::Map::new();
        if !d.reasoning.is_empty() {
            delta.insert(
                "reasoning_content".to_owned(),
                Value::String(d.reasoning.clone()),
            );
        }
        if !d.content.is_empty() {
            delta.insert("content".to_owned(), Value::String(d.content.clone()));
        }
        chunk_of(Value::Object(delta), None)
    };
    let last = move |s: &Summary| {
        let mut out = vec![with_choice(json!({}), Some(s.finish))];
        if include_usage {
            let mut u = out[0].clone();
            u["choices"] = json!([]);
            u["usage"] = usage(s);
            out.push(u);
        }
        out
    };
    Ok(Sse::new(sse_stream(rx, Some(first), chunk, last)).into_response())
}

async fn completions(
    State(app): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let bytes = body_bytes(&app, body)?;
    let p = params::parse_completion(&bytes)?;
    check_model(&app, &p.model)?;
    let text = p.prompt.clone();
    let prompt = prompt_ids(&app, move |t| t.completion_prompt(&text)).await?;
    let max_tokens = budget(&app, prompt.len(), Some(p.max_tokens), "prompt")?;
    let spec = JobSpec {
        prompt,
        params: generate_params(&app, &p.sampling, max_tokens),
        mode: TextMode::Completion {
            stops: p.stop.clone(),
        },
    };
    let rx = app.engine.submit(spec, app.limits.queue_wait).await?;
    let id = app.completion_id("cmpl");
    let created = unix_now();
    let model = app.limits.model_id.clone();
    let base = json!({
        "id": id,
        "object": "text_completion",
        "created": created,
        "model": model,
    });
    if !p.stream {
        let (_, text, s) = collect(rx).await?;
        let mut v = base;
        v["choices"] = json!([{
            "index": 0,
            "text": text,
            "logprobs": null,
            "finish_reason": s.finish.as_str(),
        }]);
        v["usage"] = usage(&s);
        return Ok(Json(v).into_response());
    }
    let include_usage = p.include_usage;
    let with_choice = move |text: &str, finish: Option<Finish>| {
        let mut v = base.clone();
        v["choices"] = json!([{
            "index": 0,
            "text": text,
            "logprobs": null,
            "finish_reason": finish.map(Finish::as_str),
        }]);
        if include_usage {
            v["usage"] = Value::Null;
        }
        v
    };
    let chunk_of = with_choice.clone();
    let chunk = move |d: &super::text::Delta| chunk_of(&d.content, None);
    let last = move |s: &Summary| {
        let mut out = vec![with_choice("", Some(s.finish))];
        if include_usage {
            let mut u = out[0].clone();
            u["choices"] = json!([]);
            u["usage"] = usage(s);
            out.push(u);
        }
        out
    };
    Ok(Sse::new(sse_stream(rx, None, chunk, last)).into_response())
}

async fn debug_tokens(
    State(app): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let bytes = body_bytes(&app, body)?;
    let p = params::parse_debug_tokens(&bytes)?;
    if let Some(m) = &p.model {
        check_model(&app, m)?;
    }
    let n_vocab = app.text.tokenizer().n_vocab();
    if let Some((i, id)) = p
        .ids
        .iter()
        .enumerate()
        .find(|(_, &id)| id as usize >= n_vocab)
    {
        return Err(ApiError::bad_value(
            "ids",
            format!("'ids[{i}]' = {id} is not below the vocabulary size {n_vocab}."),
        ));
    }
    let max_tokens = budget(&app, p.ids.len(), Some(p.max_tokens), "ids")?;
    let mut params = generate_params(&app, &p.sampling, max_tokens);
    params.ignore_eos = p.ignore_eos;
    let prompt_tokens = p.ids.len();
    let spec = JobSpec {
        prompt: p.ids,
        params,
        mode: TextMode::Ids,
    };
    let rx = app.engine.submit(spec, app.limits.queue_wait).await?;
    let (_, _, s) = collect(rx).await?;
    Ok(Json(json!({
        "ids": s.ids,
        "finish_reason": s.finish.as_str(),
        "prompt_tokens": prompt_tokens,
        "prefill_tok_s": s.prefill_tok_s,
        "decode_tok_s": s.decode_tok_s,
    })))
}
