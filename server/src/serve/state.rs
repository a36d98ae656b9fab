//! The server's shared state ([`AppState`]): limits and identity from the flags, the text model,
//! the engine handle, metrics; and what every route asks of it (the body within its limits, the
//! model id).

use super::engine::EngineHandle;
use super::error::ApiError;
use super::metrics::Metrics;
use super::responses::store::ResponseStore;
use super::text::TextModel;
use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::Semaphore;

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
    /// The stored responses of `/v1/responses` (`previous_response_id`).
    pub responses: Arc<ResponseStore>,
    /// Every answer's `system_fingerprint` (`fp_` and the FNV-1a hash of the version, model id and context).
    pub fingerprint: String,
    /// Turns to tokenize prompts (`tokenizers` at once).
    pub(super) tokenize: Arc<Semaphore>,
    /// The `/openapi.json` document.
    pub(super) openapi: String,
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
            responses: Arc::default(),
            openapi,
        }
    }

    /// Reads the body within `--read-timeout-ms` (408 past it), with axum's rejections turned into
    /// OpenAI-shaped errors (413 past `--body-limit`).
    pub(super) async fn read_body(&self, req: Request) -> Result<Bytes, ApiError> {
        let limit = self.limits.read_timeout;
        let body = tokio::time::timeout(limit, Bytes::from_request(req, &()))
            .await
            .map_err(|_| ApiError::body_timeout(limit.as_millis()))?;
        body.map_err(|rej| {
            if rej.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::too_large(self.limits.body_limit)
            } else {
                ApiError::invalid(
                    None,
                    "invalid_body",
                    format!("The request body could not be read: {}.", rej.body_text()),
                )
            }
        })
    }

    /// 404 unless `model` is the served model id.
    pub(super) fn check_model(&self, model: &str) -> Result<(), ApiError> {
        if model == self.limits.model_id {
            Ok(())
        } else {
            Err(ApiError::model_not_found(model, &self.limits.model_id))
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

/// Seconds since the Unix epoch (0 on a clock before it).
pub(super) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
