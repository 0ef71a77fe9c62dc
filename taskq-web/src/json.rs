//! The API's JSON replies shared by its handlers (`api`, `views_api`) and its guard
//! (`auth::api_guard`): the error body `{"error": {"code": .., "message": ..}}` and a task
//! ([`TaskJson`]). A module of its own so that none of those imports another in a circle.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::{Value, json};
use taskq::Error;
use taskq::client::TaskInfo;

/// `{"error": {"code": .., "message": ..}}` with `status`.
pub(crate) fn error(status: StatusCode, code: &str, message: &str) -> Response {
    (
        status,
        Json(json!({"error": {"code": code, "message": message}})),
    )
        .into_response()
}

/// The response for a failed client call.
pub(crate) fn failure(e: &Error) -> Response {
    let (status, code, message) = error_parts(e);
    error(status, code, &message)
}

/// The status, code and message the API answers a failed client call with.
pub(crate) fn error_parts(e: &Error) -> (StatusCode, &'static str, String) {
    let (status, code) = match e {
        Error::NotFound(_) | Error::WorkflowNotFound(_) | Error::BatchNotFound(_) => {
            (StatusCode::NOT_FOUND, "not_found")
        }
        Error::UnknownTask(_) => (StatusCode::NOT_FOUND, "unknown_task"),
        Error::InvalidPayload { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_payload"),
        Error::WrongState { .. } | Error::BatchEnded(_) => (StatusCode::CONFLICT, "wrong_state"),
        Error::UniqueHeld { .. } => (StatusCode::CONFLICT, "unique_held"),
        Error::InvalidName { .. }
        | Error::InvalidOption(_)
        | Error::InvalidSchedule(_)
        | Error::PayloadTooLarge { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "invalid"),
        Error::Timeout(_) => (StatusCode::GATEWAY_TIMEOUT, "timeout"),
        _ => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
    };
    (status, code, e.to_string())
}

/// A 400 with `message`.
pub(crate) fn bad_request(message: &str) -> Response {
    error(StatusCode::BAD_REQUEST, "bad_request", message)
}

/// A task as the API shows it: every stored field, the payload as JSON (a string when it is
/// not JSON), and why a dead task died.
#[derive(Serialize)]
pub(crate) struct TaskJson<'a> {
    #[serde(flatten)]
    info: &'a TaskInfo,
    #[serde(skip_serializing_if = "Option::is_none")]
    payload: Option<Value>,
    payload_bytes: usize,
    dead_reason: Option<String>,
    /// For a running task in a list: whether its worker is `alive`, `lost` or `stopped`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) worker_status: Option<&'static str>,
}

impl<'a> TaskJson<'a> {
    pub(crate) fn new(info: &'a TaskInfo, with_payload: bool) -> Self {
        let payload = with_payload.then(|| {
            info.payload_json().unwrap_or_else(|_| {
                Value::String(String::from_utf8_lossy(&info.payload).into_owned())
            })
        });
        Self {
            info,
            payload,
            payload_bytes: info.payload.len(),
            dead_reason: info.dead_reason().map(|r| r.to_string()),
            worker_status: None,
        }
    }
}
