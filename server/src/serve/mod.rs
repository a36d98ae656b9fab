//! `aubier serve`: the OpenAI-compatible HTTP server (ARCHITECTURE.md § server).
//!
//! Boot, in order: take the exclusive lock file (exit 69 after `--lock-wait-ms`), find the model
//! (`--model`, else the bundled `models/ms4-tiny256-q2k.gguf`), load the engine (`--engine real`,
//! the default, or the scripted `fake`) on its own thread, bind `--host:--port`, print the address,
//! and serve until SIGINT or SIGTERM. Shutdown stops accepting connections, lets the running
//! request (and any open stream) finish, joins the engine thread, then releases the lock.
//!
//! Modules: [`api`] (the wire types of every request and response body, with their JSON
//! Schema), [`params`] (request validation, refused parameters), [`error`] (OpenAI-shaped errors),
//! [`app`] (the router), [`state`] (what the routes share), `connection` (sockets, timeouts, drain), `guard`
//! (Host / Origin / Content-Type guards, admission, request metrics), `generation` (the one
//! generation route, generic over the request kinds `chat`, `completions` and [`responses`]: prompt, budget,
//! grammar, engine job, JSON answer or SSE), `routes` (health, metrics, models, OpenAPI,
//! `/debug/tokens`), `tokenize` (vLLM's `/tokenize` and `/detokenize`), [`engine`] (the single-flight engine thread), [`text`] and [`stop`]
//! (detokenizing, reasoning split, stop strings), [`logprobs`] (their OpenAI shapes), [`fake`]
//! and [`real`] (the two engines), [`lock`], [`metrics`], [`openapi`] (`GET /openapi.json`,
//! generated from [`api`]), [`tools`] (`tools`, `tool_choice`, `response_format` → the grammar),
//! [`responses`] (`POST /v1/responses`, OpenAI's Responses API on the same engine and grammar,
//! with its store of recent responses for `previous_response_id` and `GET` / `DELETE
//! /v1/responses/{id}`, `GET /v1/responses/{id}/input_items`: the last 256, each for at most an
//! hour, 64 MiB together (text and bookkeeping); and `POST /v1/responses/input_tokens`).
#![warn(missing_docs)]

pub mod api;
pub mod app;
mod chat;
mod completions;
mod connection;
pub mod engine;
pub mod error;
pub mod fake;
mod generation;
mod guard;
pub mod lock;
pub mod logprobs;
pub mod metrics;
pub mod openapi;
pub mod params;
pub mod real;
pub mod responses;
mod routes;
pub mod state;
pub mod stop;
pub mod text;
mod tokenize;
pub mod tools;

pub use app::serve;
use aubier_runtime::engine::Model;
use aubier_runtime::gguf::GgufFile;
use clap::{Args, ValueEnum};
use engine::{Engine, EngineHandle};
use fake::{FakeEngine, FakeScript, FakeScriptFile};
use lock::{LockError, LockFile, EXIT_LOCKED};
use metrics::Metrics;
use state::{AppState, HostPolicy, ServerLimits};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;
use text::TextModel;
use tokio::net::TcpListener;

/// KV capacity used when `--kv-max` is not given: `min(context_length, 4096)` tokens for the
/// real engine (as `aubier run`), 4096 for the fake one.
pub const DEFAULT_KV_MAX: usize = 4096;

/// Which engine answers requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum EngineKind {
    /// The model itself (`Session` + the shared decode loop).
    Real,
    /// Scripted tokens, CPU only, for protocol tests (the tokenizer and template are the file's).
    Fake,
}

/// `--prompt-cache`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PromptCache {
    /// Reuse the cached prefix a prompt shares with the previous request's tokens.
    On,
    /// Prefill every prompt whole.
    Off,
}

/// Arguments of `aubier serve`.
#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    /// GGUF file to serve (default: $AUBIER_MODEL, else the bundled
    /// models/ms4-tiny256-q2k.gguf of the binary's workspace, else ./models).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Address to bind.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to bind (0 = any free port; the chosen address is printed).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// KV cache capacity in tokens: prompt + completion of one request (default: min(context
    /// length, 4096)).
    #[arg(long)]
    pub kv_max: Option<usize>,
    /// Most requests in progress at once (from the request head to the end of the response
    /// body; /health and /metrics excluded); later ones get 503 (Retry-After).
    #[arg(long, default_value_t = 64, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub max_requests: usize,
    /// Most open connections, idle ones included; requests on connections beyond it get 503
    /// (Retry-After) and the connection is closed.
    #[arg(long, default_value_t = 256, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub max_conns: usize,
    /// A connection with no request in progress that receives nothing for this long is
    /// closed, ms.
    #[arg(long, default_value_t = 10_000, value_parser = clap::builder::RangedU64ValueParser::<u64>::new().range(1..))]
    pub idle_timeout_ms: u64,
    /// Longest time a request head may take from its first byte, and again its body, ms (the
    /// connection is closed, or the answer is 408).
    #[arg(long, default_value_t = 10_000, value_parser = clap::builder::RangedU64ValueParser::<u64>::new().range(1..))]
    pub read_timeout_ms: u64,
    /// When bound to a loopback address only loopback Host names (localhost, 127.0.0.1, [::1])
    /// are answered, so a web page cannot reach the server through DNS rebinding; this adds a
    /// host name (repeatable; `*` answers any). On another address any Host is answered unless
    /// this names some.
    #[arg(long, value_name = "HOST")]
    pub allow_host: Vec<String>,
    /// Answer browser requests from this origin (`http://localhost:3000`; repeatable; `*` is
    /// any), with CORS headers; other cross-origin requests are refused with 403.
    #[arg(long, value_name = "ORIGIN", value_parser = parse_origin)]
    pub cors_origin: Vec<String>,
    /// Longest wait for the single-flight engine before a 503 (Retry-After), ms.
    #[arg(long, default_value_t = 30_000)]
    pub queue_wait_ms: u64,
    /// Largest request body, bytes (413 beyond).
    #[arg(long, default_value_t = 4 * 1024 * 1024, value_parser = parse_body_limit)]
    pub body_limit: usize,
    /// Exclusive lock file taken at boot (default: $TMPDIR/aubier.lock).
    #[arg(long)]
    pub lock_file: Option<PathBuf>,
    /// How long to wait for the lock file before exiting with status 69, ms.
    #[arg(long, default_value_t = 2_000)]
    pub lock_wait_ms: u64,
    /// Engine: the real model, or scripted tokens for protocol tests.
    #[arg(long, value_enum, default_value_t = EngineKind::Real)]
    pub engine: EngineKind,
    /// Model id clients must send (default: the GGUF file stem).
    #[arg(long)]
    pub model_id: Option<String>,
    /// With --engine fake: a JSON script {"text": ".."} or {"ids": [..]}, optional "step_ms",
    /// "fail_at_step".
    #[arg(long)]
    pub fake_script: Option<PathBuf>,
    /// Reuse the latent KV rows of the prefix a prompt shares with the previous request's prompt
    /// and generated tokens instead of prefilling it again (llama.cpp's `cache_prompt`; the
    /// logits are a cold run's, bit for bit); reported as usage.prompt_tokens_details.
    /// cached_tokens (real engine).
    #[arg(long, value_enum, default_value_t = PromptCache::On)]
    pub prompt_cache: PromptCache,
    /// The split expert store (real engine).
    #[command(flatten)]
    pub store: crate::run::StoreArgs,
    /// The backend (real engine).
    #[command(flatten)]
    pub backend: crate::run::BackendArgs,
}

/// Errors of `aubier serve` before or after serving.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The lock file is held or unusable.
    #[error(transparent)]
    Lock(#[from] LockError),
    /// No model file: none given, `$AUBIER_MODEL` missing or the bundled one not found.
    #[error(transparent)]
    Model(#[from] crate::model_file::ModelFileError),
    /// The model file could not be opened or loaded.
    #[error("loading {path}: {message}")]
    Load {
        /// The file.
        path: String,
        /// What failed.
        message: String,
    },
    /// `--fake-script` with the real engine.
    #[error("--fake-script needs --engine fake")]
    ScriptWithoutFake,
    /// The fake script is unusable.
    #[error(transparent)]
    Script(#[from] fake::FakeScriptError),
    /// Binding, the runtime or the engine thread failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The OS error.
        source: std::io::Error,
    },
}

fn io_err(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> ServeError {
    let context = context.into();
    move |source| ServeError::Io { context, source }
}

/// The default model id: the file stem (`ms4-tiny256-q2k`).
pub fn model_id_of(path: &Path) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string())
}

/// The fake engine's script when no `--fake-script` is given.
pub const DEFAULT_FAKE_TEXT: &str = "This is aubier's fake engine: scripted tokens, no model.";

/// What [`load_engine`] loads: the text side, the engine and, for the real engine, the name of its
/// backend (`cpu (q8x2)`, `oracle`).
type Loaded = (Arc<TextModel>, Box<dyn Engine>, Option<String>);

/// Loads the text side and the chosen engine from `path`.
fn load_engine(path: &Path, args: &ServeArgs) -> Result<Loaded, ServeError> {
    let load_err = |message: String| ServeError::Load {
        path: path.display().to_string(),
        message,
    };
    match args.engine {
        EngineKind::Real => {
            if args.fake_script.is_some() {
                return Err(ServeError::ScriptWithoutFake);
            }
            let backend = args
                .backend
                .spec()
                .and_then(|spec| Ok(spec.make()?))
                .map_err(|e| load_err(crate::error_text::error_text(&e)))?;
            let ahead = args.store.read_ahead(path, backend.target());
            if let Some(note) = &ahead.note {
                tracing::info!("{note}");
            }
            let mut progress = crate::progress::Steps::load(path);
            let predicts = args.store.prediction(false, &ahead);
            let model =
                Model::load_predicting(path, backend, args.store.budget(), predicts, &mut progress)
                    .map_err(|e| load_err(e.to_string()))?;
            progress.done("loaded");
            let text = TextModel::from_gguf(&model.file).map_err(|e| load_err(e.to_string()))?;
            let kv_max = args
                .kv_max
                .unwrap_or_else(|| model.config.n_ctx_train.min(DEFAULT_KV_MAX));
            let store = args
                .store
                .options(&ahead)
                .map_err(|e| load_err(crate::error_text::error_text(&e)))?;
            let name = model.backend_name().to_string();
            let mut engine = real::RealEngine::open(model, kv_max, &store, args.backend.ubatch)
                .map_err(|e| load_err(e.to_string()))?;
            engine.set_prompt_cache(args.prompt_cache == PromptCache::On);
            Ok((Arc::new(text), Box::new(engine), Some(name)))
        }
        EngineKind::Fake => {
            let file = GgufFile::open(path).map_err(|e| load_err(e.to_string()))?;
            let text = TextModel::from_gguf(&file).map_err(|e| load_err(e.to_string()))?;
            let script_file = match &args.fake_script {
                Some(p) => FakeScriptFile::read(p)?,
                None => FakeScriptFile {
                    text: Some(DEFAULT_FAKE_TEXT.to_owned()),
                    ..FakeScriptFile::default()
                },
            };
            let ids = match (&script_file.ids, &script_file.text) {
                (Some(ids), _) => ids.clone(),
                (None, Some(t)) => text
                    .tokenizer()
                    .encode(t)
                    .map_err(|e| load_err(format!("encoding the fake script: {e}")))?,
                (None, None) => Vec::new(),
            };
            let script = FakeScript {
                ids,
                step_delay: Duration::from_millis(script_file.step_ms),
                fail_at_step: script_file.fail_at_step,
            };
            let engine = FakeEngine::new(
                script,
                args.kv_max.unwrap_or(DEFAULT_KV_MAX),
                text.tokenizer().n_vocab(),
                text.tokenizer().eos_id(),
            );
            Ok((Arc::new(text), Box::new(engine), None))
        }
    }
}

/// Resolves on the first SIGINT or SIGTERM. The handlers are installed by this call, not when
/// the future is first polled: the accept loop may serve the first connections before it polls
/// the future, and a signal that came before would take its default action (the process killed,
/// the request not drained). Call it inside the runtime, before printing the listening line.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    let listen = |kind: SignalKind, name: &str| match signal(kind) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!("cannot listen for {name}: {e}");
            None
        }
    };
    let (mut int, mut term) = (
        listen(SignalKind::interrupt(), "SIGINT"),
        listen(SignalKind::terminate(), "SIGTERM"),
    );
    async move {
        tokio::select! {
            () = next(int.as_mut()) => {}
            () = next(term.as_mut()) => {}
        }
        eprintln!("aubier serve: shutting down (draining the running request)");
    }
}

/// The next delivery of `signal`; never, without one.
async fn next(signal: Option<&mut tokio::signal::unix::Signal>) {
    match signal {
        Some(s) => {
            s.recv().await;
        }
        None => std::future::pending::<()>().await,
    }
}

fn serve_blocking(args: ServeArgs) -> Result<(), ServeError> {
    let lock_path = args
        .lock_file
        .clone()
        .unwrap_or_else(lock::default_lock_path);
    let lock = LockFile::acquire(&lock_path, Duration::from_millis(args.lock_wait_ms))?;
    let path = crate::model_file::resolve_model(args.model.as_deref())?;
    let model_id = args.model_id.clone().unwrap_or_else(|| model_id_of(&path));
    let (text, engine, backend) = load_engine(&path, &args)?;
    let metrics = Arc::new(Metrics::default());
    let engine = EngineHandle::spawn(engine, text.clone(), metrics.clone())
        .map_err(io_err("starting the engine thread"))?;
    let kv_max = engine.kv_max();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(io_err("starting the tokio runtime"))?;
    runtime.block_on(async {
        let listener = TcpListener::bind((args.host.as_str(), args.port))
            .await
            .map_err(io_err(format!("binding {}:{}", args.host, args.port)))?;
        let addr = listener
            .local_addr()
            .map_err(io_err("reading the bound address"))?;
        let limits = ServerLimits {
            model_id: model_id.clone(),
            queue_wait: Duration::from_millis(args.queue_wait_ms),
            max_requests: args.max_requests,
            max_conns: args.max_conns,
            body_limit: args.body_limit,
            idle_timeout: Duration::from_millis(args.idle_timeout_ms),
            read_timeout: Duration::from_millis(args.read_timeout_ms),
            tokenizers: std::thread::available_parallelism().map_or(1, |n| n.get()),
            hosts: HostPolicy::for_bind(addr.ip(), &args.allow_host),
            cors_origins: args.cors_origin.clone(),
        };
        let state = Arc::new(AppState::new(limits, text, engine, metrics));
        let shutdown = shutdown_signal();
        eprintln!(
            "aubier serve: listening on http://{addr} (model id {model_id}, {}, engine {:?}, backend {}, kv_max {kv_max}, lock {})",
            path.display(),
            args.engine,
            backend.as_deref().unwrap_or("none"),
            lock.path().display()
        );
        serve(listener, state, shutdown)
            .await
            .map_err(io_err("serving"))
    })?;
    drop(lock);
    eprintln!("aubier serve: stopped");
    Ok(())
}

/// Runs `aubier serve`; exit status 0 after a clean shutdown, 69 when the lock file is held,
/// 1 on any other error (printed to stderr).
pub fn run(args: ServeArgs) -> ExitCode {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .try_init();
    match serve_blocking(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e @ ServeError::Lock(LockError::Busy { .. })) => {
            eprintln!("aubier serve: {e}");
            ExitCode::from(EXIT_LOCKED)
        }
        Err(e) => {
            eprintln!("aubier serve: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `--cors-origin`: `*`, or an origin as a browser sends it in `Origin:`, `scheme://host[:port]`.
/// The scheme and host are lower-cased and a default port (`:80` for http, `:443` for https) is
/// dropped, as browsers do: `HTTP://LocalHost:3000` or `http://localhost:80` never matched the
/// `Origin` a browser sends, so every browser request got 403 or no CORS headers. Refused with a
/// message: no scheme, a path or trailing `/` (`http://localhost:3000/`), a query or fragment,
/// user info, a port that is not a number up to 65535, a `:` in the host outside an IPv6 literal.
fn parse_origin(s: &str) -> Result<String, String> {
    if s == "*" {
        return Ok(s.to_owned());
    }
    let shape = "an origin is scheme://host[:port] as browsers send it (`http://localhost:3000`), \
                 or `*`";
    let Some((scheme, rest)) = s.split_once("://") else {
        return Err(format!("`{s}` has no scheme: {shape}"));
    };
    if scheme.is_empty() || rest.is_empty() {
        return Err(format!("`{s}` is not an origin: {shape}"));
    }
    if rest.contains(['?', '#']) {
        return Err(format!("`{s}` has a query or fragment: {shape}"));
    }
    if rest.contains('/') {
        return Err(format!("`{s}` has a path or a trailing `/`: {shape}"));
    }
    if rest.contains('@') {
        return Err(format!("`{s}` has user info (`user@`): {shape}"));
    }
    let scheme = scheme.to_ascii_lowercase();
    // The port's `:` is the last one, unless it is inside an IPv6 literal (`[::1]`).
    let (host, port) = match rest.rfind(':') {
        Some(i) if !rest[i..].contains(']') => (&rest[..i], Some(&rest[i + 1..])),
        _ => (rest, None),
    };
    if host.is_empty() {
        return Err(format!("`{s}` has no host: {shape}"));
    }
    if host.contains(':') && !(host.starts_with('[') && host.ends_with(']')) {
        return Err(format!(
            "`{s}` has a `:` in its host (only an IPv6 literal in brackets has one): {shape}"
        ));
    }
    let port = match port {
        None => None,
        Some(p) => match p.parse::<u16>() {
            Ok(n) if p.bytes().all(|b| b.is_ascii_digit()) => Some(n),
            _ => {
                return Err(format!(
                    "`{s}` has a port `{p}` that is not 0-65535: {shape}"
                ))
            }
        },
    };
    let default = match scheme.as_str() {
        "http" => Some(80),
        "https" => Some(443),
        _ => None,
    };
    let mut origin = format!("{scheme}://{}", host.to_ascii_lowercase());
    if let Some(n) = port.filter(|&n| Some(n) != default) {
        origin.push_str(&format!(":{n}"));
    }
    if axum::http::HeaderValue::from_str(&origin).is_err() {
        return Err(format!("`{s}` is not a valid header value: {shape}"));
    }
    Ok(origin)
}

/// `--body-limit`: at least 1 byte (0 answered every request with a body 413).
fn parse_body_limit(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("0 would refuse every request body (413); give at least 1".to_owned()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: ServeArgs,
    }

    #[test]
    fn the_prompt_cache_is_on_unless_turned_off() {
        let parse = |flags: &[&str]| {
            Cli::try_parse_from(std::iter::once("serve").chain(flags.iter().copied()))
                .map(|c| c.args.prompt_cache)
        };
        assert_eq!(parse(&[]).expect("defaults"), PromptCache::On);
        assert_eq!(
            parse(&["--prompt-cache", "off"]).expect("off"),
            PromptCache::Off
        );
        assert_eq!(
            parse(&["--prompt-cache", "on"]).expect("on"),
            PromptCache::On
        );
        assert!(parse(&["--prompt-cache", "maybe"]).is_err());
    }

    #[test]
    fn origins_are_stored_as_browsers_send_them_and_malformed_ones_refused() {
        for (given, stored) in [
            ("*", "*"),
            ("HTTP://LocalHost:3000", "http://localhost:3000"),
            ("https://example.com:443", "https://example.com"),
            ("http://[::1]:8080", "http://[::1]:8080"),
            ("http://[::1]", "http://[::1]"),
        ] {
            assert_eq!(parse_origin(given).as_deref(), Ok(stored), "{given}");
        }
        for bad in [
            "http://a:1:2",
            "http://::1",
            "http://a:b:80",
            "localhost:3000",
        ] {
            assert!(parse_origin(bad).is_err(), "{bad}");
        }
    }
}
