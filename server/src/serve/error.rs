//! OpenAI-shaped errors: every failure the server reports is an HTTP status plus the body
//! `{"error": {"message", "type", "param", "code"}}` that the OpenAI API returns (openai-openapi
//! `ErrorResponse`), so OpenAI clients raise their usual exception with our message in it.

use super::api::response::{ErrorBody, ErrorObject, ErrorType};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

/// One API error: the HTTP status, the OpenAI `type` / `param` / `code` fields and a message that
/// names what was wrong. `retry_after_s` adds a `Retry-After` header (seconds) to 503 answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status of the answer.
    pub status: StatusCode,
    /// Human-readable message naming the parameter, model or limit at fault.
    pub message: String,
    /// OpenAI error type: `invalid_request_error` or `server_error`.
    pub kind: ErrorType,
    /// The request parameter at fault, when there is one.
    pub param: Option<String>,
    /// Machine-readable code (`unsupported_parameter`, `model_not_found`, ...).
    pub code: Option<&'static str>,
    /// Seconds for the `Retry-After` header.
    pub retry_after_s: Option<u64>,
}

impl ApiError {
    /// 400 `invalid_request_error` about `param` (or about the request as a whole when `None`).
    pub fn invalid(
        param: Option<&str>,
        code: &'static str,
        message: impl Into<String>,
    ) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: ErrorType::InvalidRequestError,
            param: param.map(str::to_owned),
            code: Some(code),
            retry_after_s: None,
        }
    }

    /// 400 for a parameter we recognise but do not implement, sent with a non-default value.
    pub fn unsupported(param: &str, why: &str) -> ApiError {
        ApiError::invalid(
            Some(param),
            "unsupported_parameter",
            format!(
                "Unsupported parameter: '{param}' {why}; aubier accepts it only at its default."
            ),
        )
    }

    /// 400 for a parameter with a value of the wrong type or out of range.
    pub fn bad_value(param: &str, message: impl Into<String>) -> ApiError {
        ApiError::invalid(Some(param), "invalid_value", message)
    }

    /// 404 for a model id other than the one served.
    pub fn model_not_found(asked: &str, served: &str) -> ApiError {
        ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!(
                "The model '{asked}' does not exist; this server serves only '{served}'."
            ),
            kind: ErrorType::InvalidRequestError,
            param: Some("model".to_owned()),
            code: Some("model_not_found"),
            retry_after_s: None,
        }
    }

    /// 404 for a path that is not a route.
    pub fn no_route(method: &str, path: &str) -> ApiError {
        ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!("No route for {method} {path}."),
            kind: ErrorType::InvalidRequestError,
            param: None,
            code: Some("unknown_url"),
            retry_after_s: None,
        }
    }

    /// 405 for a known path with the wrong method.
    pub fn method_not_allowed(method: &str, path: &str) -> ApiError {
        ApiError {
            status: StatusCode::METHOD_NOT_ALLOWED,
            message: format!("Method {method} is not allowed on {path}."),
            kind: ErrorType::InvalidRequestError,
            param: None,
            code: Some("method_not_allowed"),
            retry_after_s: None,
        }
    }

    /// 413 for a body over `--body-limit` bytes.
    pub fn too_large(limit: usize) -> ApiError {
        ApiError {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            message: format!(
                "The request body is larger than the limit of {limit} bytes (--body-limit)."
            ),
            kind: ErrorType::InvalidRequestError,
            param: None,
            code: Some("request_too_large"),
            retry_after_s: None,
        }
    }

    /// 403 for a request the server refuses to answer for whoever sent it: a `Host` or `Origin`
    /// it does not serve (`code` says which).
    pub fn forbidden(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::FORBIDDEN,
            message: message.into(),
            kind: ErrorType::InvalidRequestError,
            param: None,
            code: Some(code),
            retry_after_s: None,
        }
    }

    /// 415 for a body that is not declared as JSON (`got`: the `Content-Type` sent, if any).
    pub fn not_json(got: Option<&str>) -> ApiError {
        let sent = match got {
            Some(t) => format!("Content-Type '{t}'"),
            None => "no Content-Type".to_owned(),
        };
        ApiError {
            status: StatusCode::UNSUPPORTED_MEDIA_TYPE,
            message: format!(
                "The request body must be JSON, but the request has {sent}; send the header 'Content-Type: application/json'."
            ),
            kind: ErrorType::InvalidRequestError,
            param: None,
            code: Some("unsupported_media_type"),
            retry_after_s: None,
        }
    }

    /// 415 for a body sent with a `Content-Encoding` other than `identity` (`got`: the header
    /// as sent): bodies are read as they arrive, never decompressed.
    pub fn unsupported_encoding(got: &str) -> ApiError {
        ApiError {
            status: StatusCode::UNSUPPORTED_MEDIA_TYPE,
            message: format!(
                "The request body has Content-Encoding '{got}', which is not supported; send the body uncompressed, with no Content-Encoding header."
            ),
            kind: ErrorType::InvalidRequestError,
            param: None,
            code: Some("unsupported_content_encoding"),
            retry_after_s: None,
        }
    }

    /// 408 when the request body did not arrive within `--read-timeout-ms`.
    pub fn body_timeout(limit_ms: u128) -> ApiError {
        ApiError {
            status: StatusCode::REQUEST_TIMEOUT,
            message: format!(
                "The request body did not arrive within {limit_ms} ms (--read-timeout-ms)."
            ),
            kind: ErrorType::InvalidRequestError,
            param: None,
            code: Some("request_timeout"),
            retry_after_s: None,
        }
    }

    /// 503 with `Retry-After` when the server cannot take the request now.
    pub fn busy(message: impl Into<String>, retry_after_s: u64) -> ApiError {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: message.into(),
            kind: ErrorType::ServerError,
            param: None,
            code: Some("server_busy"),
            retry_after_s: Some(retry_after_s),
        }
    }

    /// 500 for a failure inside the engine or the tokenizer.
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            kind: ErrorType::ServerError,
            param: None,
            code: Some("engine_error"),
            retry_after_s: None,
        }
    }

    /// The body `{"error": {"message", "type", "param", "code"}}`.
    pub fn body(&self) -> ErrorBody {
        ErrorBody {
            error: ErrorObject {
                message: self.message.clone(),
                kind: self.kind,
                param: self.param.clone(),
                code: self.code,
            },
        }
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.message, self.status)
    }
}

impl std::error::Error for ApiError {}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut resp = (self.status, axum::Json(self.body())).into_response();
        if let Some(s) = self.retry_after_s {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        resp
    }
}

/// 400 `missing_required_parameter` for `name`.
pub(super) fn missing_parameter(name: &str) -> ApiError {
    ApiError::invalid(
        Some(name),
        "missing_required_parameter",
        format!("Missing required parameter: '{name}'."),
    )
}

/// 400 `unknown_parameter` for `name`.
pub(super) fn unknown_parameter(name: &str) -> ApiError {
    ApiError::invalid(
        Some(name),
        "unknown_parameter",
        format!("Unrecognized request argument supplied: '{name}'."),
    )
}
