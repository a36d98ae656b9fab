//! Guards and admission, the middleware around every route.
//!
//! In order: request metrics ([`count_requests`]); a server bound to loopback answers only
//! loopback `Host` names (plus `--allow-host`), 403 otherwise (DNS rebinding); a request with an
//! `Origin` other than its own host is refused 403 unless `--cors-origin` lists it (then the CORS
//! headers and preflights are tower-http's); admission counts requests in progress (head to the
//! end of the response body), and one beyond `--max-requests`, or on a connection beyond
//! `--max-conns`, is a 503 (`/health` and `/metrics` are outside that count); a POST body must
//! be declared `application/json` (415), which also forces a browser to send a CORS preflight
//! first.

use super::connection::{on_end, ConnState};
use super::error::ApiError;
use super::metrics::{Metrics, STATUS_CLIENT_CLOSED};
use super::state::AppState;
use axum::extract::{Extension, MatchedPath, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tower_http::cors::{AllowHeaders, AllowOrigin, CorsLayer};

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
pub(super) fn refusal(app: &AppState, conn: &ConnState) -> Option<String> {
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

pub(super) async fn admission(
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

pub(super) async fn count_requests(
    State(app): State<Arc<AppState>>,
    req: Request,
    next: Next,
) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| "other".to_owned());
    // A HEAD answer's body is never sent: its end is not the client leaving.
    let head = req.method() == Method::HEAD;
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
        let status = match (completed || head, failed) {
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
pub(super) async fn guard(State(app): State<Arc<AppState>>, req: Request, next: Next) -> Response {
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
pub(super) fn cors(origins: &[String]) -> CorsLayer {
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        AllowOrigin::list(origins.iter().filter_map(|o| HeaderValue::from_str(o).ok()))
    };
    CorsLayer::new()
        .allow_origin(allow)
        .allow_methods([Method::GET, Method::POST, Method::DELETE])
        .allow_headers(AllowHeaders::mirror_request())
        .max_age(Duration::from_secs(600))
}

/// 415 unless the body is declared `application/json` (UTF-8, the only charset JSON has) and is
/// not compressed: a `Content-Encoding` other than `identity` is answered 415 with
/// `Accept-Encoding: identity` (RFC 7694), where it had been read as JSON and refused as invalid.
pub(super) async fn require_json(req: Request, next: Next) -> Response {
    if let Err(e) = json_content_type(req.headers()) {
        return e.into_response();
    }
    if let Err(e) = identity_encoding(req.headers()) {
        let mut resp = e.into_response();
        resp.headers_mut().insert(
            header::ACCEPT_ENCODING,
            HeaderValue::from_static("identity"),
        );
        return resp;
    }
    next.run(req).await
}

/// `Ok` when every `Content-Encoding` header lists only `identity` (or nothing).
fn identity_encoding(headers: &HeaderMap) -> Result<(), ApiError> {
    for value in headers.get_all(header::CONTENT_ENCODING) {
        let text = String::from_utf8_lossy(value.as_bytes());
        let identity = text
            .split(',')
            .map(str::trim)
            .all(|c| c.is_empty() || c.eq_ignore_ascii_case("identity"));
        if !identity {
            return Err(ApiError::unsupported_encoding(&text));
        }
    }
    Ok(())
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

pub(super) async fn no_route(method: Method, uri: Uri) -> ApiError {
    ApiError::no_route(method.as_str(), uri.path())
}

pub(super) async fn wrong_method(method: Method, uri: Uri) -> ApiError {
    ApiError::method_not_allowed(method.as_str(), uri.path())
}
