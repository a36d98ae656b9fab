//! The routes of stored responses (OpenAI API reference, Responses: retrieve, delete, list input
//! items), over [`super::store`]:
//!
//! - `GET /v1/responses/{id}`: the response object as `POST /v1/responses` answered it; while
//!   a stream is still generating it, as `response.in_progress` carried it (status
//!   `in_progress`, no output yet).
//! - `DELETE /v1/responses/{id}`: drops it; `{"id", "object": "response", "deleted": true}`. A
//!   response deleted while in progress is generated to its end and not kept.
//! - `POST /v1/responses/{id}/cancel`: a 400 for a stored response (only background responses
//!   can be cancelled, and aubier runs none), else a 404.
//! - `POST /v1/responses/input_tokens`: the tokens of the prompt `POST /v1/responses` would
//!   render from the same body (validated as that route's; a prompt past the KV capacity is
//!   its 400 `context_length_exceeded`, a schema its grammar cannot enforce its 400 too).
//! - `POST /v1/responses/compact` (conversation compaction) is not implemented: a 404 that
//!   says so.
//! - GET and DELETE on those two POST paths are those of `/v1/responses/{id}` (the 404 of an
//!   id not stored), not 405s that would say the paths have other methods.
//! - `GET /v1/responses/{id}/input_items`: the items before its output (those of the responses
//!   it continues first, each with the id and status it was first stored under: an answer cut
//!   off by `max_output_tokens` stays `incomplete`), one page at a time:
//!   `order` `desc` (the default: the newest first) or `asc`, `limit` 1–100 (default 20), `after`
//!   the id of the item before the page; `has_more` says whether items remain past it.
//!
//! An id the store does not hold (never created, created with `store: false`, dropped past the
//! store's bounds, or deleted) is a 404; one that does not decode to UTF-8 a 400. The query is checked as bodies are: an unknown parameter,
//! a repeated one, a bad value, or one asking for what aubier does not do (`stream=true`: a stored
//! response is not replayed as events; `include`: a stored response is answered as it was made,
//! with reasoning's `encrypted_content` when its request asked for it) is a 400 naming
//! it.

use super::super::api::response::ErrorType;
use super::super::api::responses::{
    InputItemList, InputTokenCount, ListedFunctionCall, ListedFunctionCallOutput, ListedInputText,
    ListedItem, ListedMessage, ListedText, OutputReasoning, ReasoningText, ResponseDeleted,
};
use super::super::error::{unknown_parameter, ApiError};
use super::super::generation::{budget, constraints, prompt_ids, PromptSource, RequestKind};
use super::super::guard::wrong_method;
use super::super::routes::PathId;
use super::super::state::AppState;
use super::store::{Item, Stored, Tag};
use super::{text_part, ResponsesKind, STORE_RESPONSES, STORE_TTL};
use aubier_runtime::text::chat::Role;
use axum::extract::{RawQuery, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use std::collections::HashMap;
use std::sync::Arc;

/// Most items one `input_items` page holds, and how many it holds when `limit` is not sent.
const MAX_LIMIT: usize = 100;
const DEFAULT_LIMIT: usize = 20;

/// 404 for a response id the store does not hold (module note).
fn not_stored(id: &str) -> ApiError {
    ApiError {
        status: StatusCode::NOT_FOUND,
        message: format!(
            "Response with id '{id}' not found: aubier keeps the last {STORE_RESPONSES} \
             responses created with 'store' for {} minutes, until deleted.",
            STORE_TTL.as_secs() / 60
        ),
        kind: ErrorType::InvalidRequestError,
        param: None,
        code: None,
        retry_after_s: None,
    }
}

/// The names of `include`, the one list parameter of these routes, which a client sends once
/// per value (openai-python: `include[]=a&include[]=b`).
const INCLUDE: [&str; 2] = ["include", "include[]"];

/// The query's parameters by name, each of them one of `known` (of a repeated `include`, the
/// last value).
///
/// Errors: 400 naming a parameter not in `known`, or one other than `include` sent twice.
fn query(raw: Option<&str>, known: &[&str]) -> Result<HashMap<String, String>, ApiError> {
    let mut out = HashMap::new();
    for (name, value) in form_urlencoded::parse(raw.unwrap_or_default().as_bytes()) {
        if !known.contains(&&*name) {
            return Err(unknown_parameter(&name));
        }
        let list = INCLUDE.contains(&&*name);
        if out.insert(name.to_string(), value.into_owned()).is_some() && !list {
            return Err(ApiError::bad_value(
                &name,
                format!("'{name}' is given more than once."),
            ));
        }
    }
    Ok(out)
}

/// A boolean query parameter: `true` or `false`. Errors: 400 for another value.
fn flag(q: &HashMap<String, String>, name: &str) -> Result<bool, ApiError> {
    match q.get(name).map(String::as_str) {
        None | Some("false") => Ok(false),
        Some("true") => Ok(true),
        Some(v) => Err(ApiError::bad_value(
            name,
            format!("'{name}' must be true or false, not {v:?}."),
        )),
    }
}

/// Refuses `include`: a stored response is answered as it was made.
fn no_include(q: &HashMap<String, String>) -> Result<(), ApiError> {
    match INCLUDE.iter().any(|name| q.contains_key(*name)) {
        true => Err(ApiError::unsupported(
            "include",
            "adds fields to what is answered; aubier answers a stored response as it was made \
             (reasoning's encrypted_content included when its request asked for it)",
        )),
        false => Ok(()),
    }
}

/// The stored response `id`. Errors: 404 when not stored.
fn stored(app: &AppState, id: &str) -> Result<Arc<Stored>, ApiError> {
    app.responses.get(id).ok_or_else(|| not_stored(id))
}

/// `GET /v1/responses/{id}` (module note).
///
/// Errors: 404 for an id not stored; 400 for `stream=true`, `starting_after`, `include`, a
/// non-boolean `include_obfuscation` or an unknown query parameter.
pub(crate) async fn retrieve(
    State(app): State<Arc<AppState>>,
    PathId(id): PathId,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let q = query(
        raw.as_deref(),
        &[
            "stream",
            "starting_after",
            INCLUDE[0],
            INCLUDE[1],
            "include_obfuscation",
        ],
    )?;
    if flag(&q, "stream")? {
        return Err(ApiError::unsupported(
            "stream",
            "replays a background response's events; aubier runs no background responses, \
             so a stored response is only retrieved whole",
        ));
    }
    if q.contains_key("starting_after") {
        return Err(ApiError::unsupported(
            "starting_after",
            "applies to streamed retrieval, which aubier does not do",
        ));
    }
    no_include(&q)?;
    flag(&q, "include_obfuscation")?;
    let s = stored(&app, &id)?;
    Ok((
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        s.response.clone(),
    )
        .into_response())
}

/// `POST /v1/responses/{id}/cancel` (module note). Errors: always: 400 for a stored response,
/// 404 for another id.
pub(crate) async fn cancel(State(app): State<Arc<AppState>>, PathId(id): PathId) -> ApiError {
    match stored(&app, &id) {
        Ok(_) => ApiError::invalid(
            None,
            "invalid_request",
            format!(
                "Response '{id}' cannot be cancelled: only background responses can be, and \
                 aubier runs none ('background' is not implemented)."
            ),
        ),
        Err(e) => e,
    }
}

/// `POST /v1/responses/compact` (module note): 404 `unknown_url` saying it is not
/// implemented.
pub(crate) async fn compact() -> ApiError {
    ApiError {
        message: "POST /v1/responses/compact (conversation compaction) is not implemented."
            .to_owned(),
        ..ApiError::no_route("POST", "/v1/responses/compact")
    }
}

/// A method other than POST on `/v1/responses/input_tokens` or `/v1/responses/compact`: as on
/// `/v1/responses/{id}` with the path's last segment as the id (GET or HEAD [`retrieve`],
/// DELETE [`delete`]: the 404 of an id not stored), else the router's 405.
pub(crate) async fn as_id(
    state: State<Arc<AppState>>,
    method: Method,
    uri: Uri,
    id: PathId,
    query: RawQuery,
) -> Response {
    match method {
        Method::GET | Method::HEAD => retrieve(state, id, query).await.into_response(),
        Method::DELETE => delete(state, id, query).await.into_response(),
        other => wrong_method(other, uri).await.into_response(),
    }
}

/// `POST /v1/responses/input_tokens` (module note).
///
/// Errors: those of `POST /v1/responses` before generation: 400 for a body it refuses, a
/// prompt past the KV capacity or a tool or `text.format` schema its grammar cannot enforce,
/// 404 for another model, 503 when every tokenizer stays busy.
pub(crate) async fn input_tokens(
    State(app): State<Arc<AppState>>,
    req: Request,
) -> Result<Json<InputTokenCount>, ApiError> {
    let bytes = app.read_body(req).await?;
    let body_len = bytes.len();
    // Parsing checks the model too (its 404 comes before the conversation's 400).
    let mut request = ResponsesKind::parse(&app, &bytes)?;
    drop(bytes);
    let param = ResponsesKind::PROMPT_PARAM;
    let ids = match request.take_prompt() {
        PromptSource::Build(build) => {
            prompt_ids(&app, param, body_len, app.engine.kv_max(), build).await?
        }
        PromptSource::Ids(ids) => ids,
    };
    // The route's own checks: a prompt must leave room for one generated token, and the
    // grammar of its tools and text.format must compile.
    budget(&app, ids.len(), None, param)?;
    constraints(&app, request.take_grammar(), 1)
        .await
        .map_err(ResponsesKind::rename)?;
    Ok(Json(InputTokenCount {
        object: "response.input_tokens",
        input_tokens: ids.len(),
    }))
}

/// `DELETE /v1/responses/{id}` (module note). Errors: 404 for an id not stored; 400 for any
/// query parameter.
pub(crate) async fn delete(
    State(app): State<Arc<AppState>>,
    PathId(id): PathId,
    RawQuery(raw): RawQuery,
) -> Result<Json<ResponseDeleted>, ApiError> {
    query(raw.as_deref(), &[])?;
    match app.responses.delete(&id) {
        true => Ok(Json(ResponseDeleted {
            id,
            object: "response",
            deleted: true,
        })),
        false => Err(not_stored(&id)),
    }
}

/// The wire form of stored item `item`, tagged `tag`.
fn listed(tag: &Tag, item: &Item) -> ListedItem {
    let (id, status) = (tag.id.clone(), tag.status);
    match item {
        Item::Message { role, text } => ListedItem::Message(ListedMessage {
            id,
            kind: "message",
            role: role.name(),
            status,
            content: vec![match role {
                Role::Assistant => ListedText::Output(text_part(text)),
                _ => ListedText::Input(ListedInputText {
                    kind: "input_text",
                    text: text.clone(),
                }),
            }],
        }),
        Item::Reasoning(text) => ListedItem::Reasoning(OutputReasoning {
            id,
            kind: "reasoning",
            summary: Vec::new(),
            content: vec![ReasoningText {
                kind: "reasoning_text",
                text: text.clone(),
            }],
            encrypted_content: None,
            status,
        }),
        Item::Call {
            call_id,
            name,
            arguments,
        } => ListedItem::FunctionCall(ListedFunctionCall {
            id,
            kind: "function_call",
            call_id: call_id.clone(),
            name: name.clone(),
            arguments: arguments.clone(),
            status,
        }),
        Item::Output { call_id, output } => {
            ListedItem::FunctionCallOutput(ListedFunctionCallOutput {
                id,
                kind: "function_call_output",
                call_id: call_id.clone(),
                output: output.clone(),
                status,
            })
        }
    }
}

/// One page of `s`'s input items: `order` (`asc` / `desc`), `after` an item id, `limit`.
///
/// Errors: 400 for an `order` or `limit` out of their values, an `after` that is not one of
/// the input items' ids.
fn page(s: &Stored, q: &HashMap<String, String>) -> Result<InputItemList, ApiError> {
    let descending = match q.get("order").map(String::as_str) {
        None | Some("desc") => true,
        Some("asc") => false,
        Some(v) => {
            return Err(ApiError::bad_value(
                "order",
                format!("'order' must be asc or desc, not {v:?}."),
            ))
        }
    };
    let limit = match q.get("limit") {
        None => DEFAULT_LIMIT,
        Some(v) => v
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=MAX_LIMIT).contains(n))
            .ok_or_else(|| {
                ApiError::bad_value(
                    "limit",
                    format!("'limit' must be an integer from 1 to {MAX_LIMIT}, not {v:?}."),
                )
            })?,
    };
    let inputs = s.inputs.min(s.items.len()).min(s.tags.len());
    let mut order: Vec<usize> = (0..inputs).collect();
    if descending {
        order.reverse();
    }
    let start = match q.get("after") {
        None => 0,
        Some(after) => {
            let at = order.iter().position(|&i| s.tags[i].id == *after);
            at.map(|p| p + 1).ok_or_else(|| {
                ApiError::bad_value(
                    "after",
                    format!("No input item with id '{after}' in this response."),
                )
            })?
        }
    };
    let rest = &order[start..];
    let shown = &rest[..rest.len().min(limit)];
    let id_of = |&i: &usize| s.tags[i].id.clone();
    Ok(InputItemList {
        object: "list",
        data: shown
            .iter()
            .map(|&i| listed(&s.tags[i], &s.items[i]))
            .collect(),
        first_id: shown.first().map(id_of),
        last_id: shown.last().map(id_of),
        has_more: rest.len() > shown.len(),
    })
}

/// `GET /v1/responses/{id}/input_items` (module note).
///
/// Errors: 404 for an id not stored; 400 as [`page`]'s, for `include` or an unknown query
/// parameter.
pub(crate) async fn input_items(
    State(app): State<Arc<AppState>>,
    PathId(id): PathId,
    RawQuery(raw): RawQuery,
) -> Result<Json<InputItemList>, ApiError> {
    let q = query(
        raw.as_deref(),
        &["after", "limit", "order", INCLUDE[0], INCLUDE[1]],
    )?;
    no_include(&q)?;
    let s = stored(&app, &id)?;
    Ok(Json(page(&s, &q)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::api::responses::OutputItemStatus;

    fn conversation() -> Stored {
        let msg = |role, text: &str| Item::Message {
            role,
            text: text.to_owned(),
        };
        Stored {
            response: "{}".to_owned(),
            items: vec![
                msg(Role::User, "a"),
                msg(Role::Assistant, "b"),
                msg(Role::User, "c"),
                msg(Role::Assistant, "output"),
            ],
            tags: ["msg_a", "msg_b", "msg_c", "msg_out"]
                .map(|id| Tag {
                    id: id.to_owned(),
                    status: OutputItemStatus::Completed,
                })
                .to_vec(),
            inputs: 3,
            finished: true,
        }
    }

    fn ids(l: &InputItemList) -> Vec<&str> {
        l.data
            .iter()
            .map(|i| match i {
                ListedItem::Message(m) => m.id.as_str(),
                _ => "",
            })
            .collect()
    }

    fn q(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn pages_walk_the_inputs_newest_first_and_leave_out_the_output() {
        let s = conversation();
        let first = page(&s, &q(&[("limit", "2")])).expect("page");
        assert_eq!(ids(&first), ["msg_c", "msg_b"]);
        assert_eq!(
            (first.first_id.as_deref(), first.last_id.as_deref()),
            (Some("msg_c"), Some("msg_b"))
        );
        assert!(first.has_more);
        let next = page(&s, &q(&[("limit", "2"), ("after", "msg_b")])).expect("page");
        assert_eq!(ids(&next), ["msg_a"]);
        assert!(!next.has_more);
        let asc = page(&s, &q(&[("order", "asc")])).expect("page");
        assert_eq!(ids(&asc), ["msg_a", "msg_b", "msg_c"]);
        let past = page(&s, &q(&[("order", "asc"), ("after", "msg_c")])).expect("page");
        assert!(past.data.is_empty() && !past.has_more);
        assert_eq!((past.first_id, past.last_id), (None, None));
    }

    #[test]
    fn bad_page_parameters_are_named() {
        let s = conversation();
        for (pairs, param) in [
            (&[("limit", "0")][..], "limit"),
            (&[("limit", "101")], "limit"),
            (&[("limit", "-1")], "limit"),
            (&[("order", "up")], "order"),
            (&[("after", "msg_out")], "after"),
        ] {
            let e = page(&s, &q(pairs)).expect_err("refused");
            assert_eq!(e.param.as_deref(), Some(param), "{pairs:?}: {e:?}");
            assert_eq!(e.status, StatusCode::BAD_REQUEST);
        }
    }

    #[test]
    fn the_query_names_unknown_and_repeated_parameters() {
        let e = query(Some("limit=2&x=1"), &["limit"]).expect_err("unknown");
        assert_eq!(e.param.as_deref(), Some("x"));
        let e = query(Some("limit=2&limit=3"), &["limit"]).expect_err("twice");
        assert_eq!(e.param.as_deref(), Some("limit"));
        let ok = query(Some("limit=2&order=asc"), &["limit", "order"]).expect("known");
        assert_eq!(ok.get("order").map(String::as_str), Some("asc"));
        let q = query(Some("include[]=a&include[]=b"), &INCLUDE).expect("a list");
        assert_eq!(
            no_include(&q).expect_err("refused").param.as_deref(),
            Some("include")
        );
    }
}
