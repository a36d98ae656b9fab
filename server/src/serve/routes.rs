//! The routes that are not [`super::generation`]'s: `/health`, `/metrics`, `/openapi.json`,
//! `/v1/models`, `/debug/tokens` (token ids in and out, no tokenizer), and the body reading and
//! model check every route shares; [`PathId`], the `{id}` of a route's path.

use super::api::response::{DebugTokens, Health, HealthStatus, Model, ModelList};
use super::connection::ConnState;
use super::engine::JobSpec;
use super::error::ApiError;
use super::generation::{budget, check_vocab, collect, generate_params};
use super::guard::refusal;
use super::params;
use super::state::AppState;
use super::text::TextMode;
use axum::extract::{Extension, FromRequestParts, OptionalFromRequestParts, Path, Request, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use std::sync::Arc;
use std::time::Instant;

pub(super) async fn health(
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

pub(super) async fn metrics(State(app): State<Arc<AppState>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        )],
        app.metrics.render(),
    )
        .into_response()
}

pub(super) async fn openapi(State(app): State<Arc<AppState>>) -> Response {
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
        max_model_len: app.engine.kv_max(),
    }
}

pub(super) async fn list_models(State(app): State<Arc<AppState>>) -> Json<ModelList> {
    Json(ModelList {
        object: "list",
        data: vec![model_object(&app)],
    })
}

/// The `{id}` segment of a route's path, percent-decoded; on a fixed path that shadows an
/// `{id}` route for other methods (`/v1/responses/input_tokens` is POST, its GET is
/// `/v1/responses/{id}`'s), the path's last segment.
///
/// Rejection: 400 `invalid_url` in OpenAI's error shape when it does not decode to UTF-8
/// (axum's own rejection is a plain-text body).
pub(crate) struct PathId(pub String);

impl<S: Send + Sync> FromRequestParts<S> for PathId {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<PathId, ApiError> {
        match <Path<String> as OptionalFromRequestParts<S>>::from_request_parts(parts, state).await
        {
            Ok(Some(Path(id))) => Ok(PathId(id)),
            Ok(None) => {
                let path = parts.uri.path();
                Ok(PathId(path.rsplit('/').next().unwrap_or(path).to_owned()))
            }
            Err(e) if e.status().is_client_error() => Err(ApiError::invalid(
                None,
                "invalid_url",
                format!("{}.", e.body_text()),
            )),
            Err(e) => Err(ApiError::internal(e.body_text())),
        }
    }
}

pub(super) async fn get_model(
    State(app): State<Arc<AppState>>,
    PathId(id): PathId,
) -> Result<Json<Model>, ApiError> {
    app.check_model(&id)?;
    Ok(Json(model_object(&app)))
}

/// `POST /debug/tokens`: token ids in, token ids and timings out (no tokenizer, no template).
pub(super) async fn debug_tokens(
    State(app): State<Arc<AppState>>,
    req: Request,
) -> Result<Json<DebugTokens>, ApiError> {
    let received = Instant::now();
    let bytes = app.read_body(req).await?;
    let p = params::parse_debug_tokens(&bytes)?;
    if let Some(m) = &p.model {
        app.check_model(m)?;
    }
    check_vocab(&app, "ids", &p.ids)?;
    let max_tokens = budget(&app, p.ids.len(), Some(p.max_tokens), "ids")?;
    let mut params = generate_params(&app, p.sampling, max_tokens, None);
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
