//! The router: every route, behind the guards and admission of `guard`, served on
//! `connection`'s connections; the generation routes are `generation`'s, `/tokenize` and
//! `/detokenize` `tokenize`'s, the others `routes`'; the state they share is [`super::state`]'s.

use super::connection;
use super::generation::generation;
use super::guard::{admission, cors, count_requests, guard, no_route, require_json, wrong_method};
use super::params::{ChatParams, CompletionParams};
use super::responses::{stored, ResponsesKind};
use super::routes::{debug_tokens, get_model, health, list_models, metrics, openapi};
use super::state::AppState;
use super::tokenize::{detokenize, tokenize};
use axum::extract::DefaultBodyLimit;
use axum::middleware;
use axum::routing::{get, post, MethodRouter};
use axum::Router;
use std::future::Future;
use std::sync::Arc;
use tokio::net::TcpListener;

/// The router with every route, the guards, admission and metrics.
pub fn router(state: Arc<AppState>) -> Router {
    let limited = Router::new()
        .route("/v1/chat/completions", post(generation::<ChatParams>))
        .route("/v1/completions", post(generation::<CompletionParams>))
        .route("/v1/responses", post(generation::<ResponsesKind>))
        .route("/v1/responses/input_tokens", post(stored::input_tokens))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/debug/tokens", post(debug_tokens))
        .route_layer(middleware::from_fn(require_json))
        .route("/v1/models", get(list_models))
        .route("/v1/models/{id}", get(get_model))
        .route(
            "/v1/responses/{id}",
            get(stored::retrieve).delete(stored::delete),
        )
        .route("/v1/responses/{id}/input_items", get(stored::input_items))
        .route("/v1/responses/{id}/cancel", post(stored::cancel))
        // Other methods on the fixed POST paths are those of `{id}` (GET, DELETE: the 404 of an
        // id not stored), without adding to their `Allow`; merged with the POST above, outside
        // its JSON guard.
        .route(
            "/v1/responses/input_tokens",
            MethodRouter::new().fallback(stored::as_id),
        )
        .route(
            "/v1/responses/compact",
            post(stored::compact).fallback(stored::as_id),
        )
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

/// Serves `state`'s router on `listener` until `shutdown` resolves, then drains
/// (`connection::serve`).
///
/// Errors: the engine thread's join failure.
pub async fn serve(
    listener: TcpListener,
    state: Arc<AppState>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    connection::serve(listener, router(state.clone()), state, shutdown).await
}
