//! The API routes of workflows: a page of them, one with its steps, and the actions (cancel the
//! workflow, retry its dead steps), audited with the request's actor.

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::json;
use taskq::workflow::WorkflowId;

use crate::AppState;
use crate::auth::ApiActor;
use crate::json::{bad_request, failure};
use crate::workflows::{WorkflowAction, WorkflowDone};

/// The largest id the API takes (the databases store signed 64-bit ids).
const MAX_ID: u64 = i64::MAX as u64;

#[derive(Deserialize, Default)]
pub(crate) struct WorkflowsParams {
    name: Option<String>,
    before: Option<u64>,
    limit: Option<u32>,
}

/// `GET /workflows`: `{"workflows": [..], "next_before": id | null}`, newest first.
pub(crate) async fn workflows(
    State(st): State<AppState>,
    params: Result<Query<WorkflowsParams>, QueryRejection>,
) -> Response {
    let Ok(Query(p)) = params else {
        return bad_request("invalid query: before and limit are numbers");
    };
    if p.limit == Some(0) {
        return bad_request("limit must be at least 1");
    }
    if p.before.is_some_and(|b| b > MAX_ID) {
        return bad_request("before is a workflow id: at most 9223372036854775807");
    }
    let limit = p.limit.unwrap_or(st.page_size).min(st.max_page_size);
    let name = p.name.as_deref().filter(|s| !s.is_empty());
    match crate::workflows::page(&st, name, p.before, limit).await {
        Ok((rows, next)) => Json(json!({"workflows": rows, "next_before": next})).into_response(),
        Err(e) => failure(&e),
    }
}

/// The workflow id of the path; `None` when it is not one.
fn workflow_id(id: Result<Path<u64>, PathRejection>) -> Option<WorkflowId> {
    id.ok()
        .map(|Path(id)| id)
        .filter(|id| *id <= MAX_ID)
        .map(WorkflowId)
}

/// `GET /workflows/{id}`: the workflow (state, progress) with its steps.
pub(crate) async fn workflow_get(
    State(st): State<AppState>,
    id: Result<Path<u64>, PathRejection>,
) -> Response {
    let Some(id) = workflow_id(id) else {
        return bad_request("the workflow id is a number from 0 to 9223372036854775807");
    };
    match tokio::try_join!(st.client.workflow(id), st.client.workflow_steps(id)) {
        Ok((w, steps)) => {
            let mut v = serde_json::to_value(w).unwrap_or_default();
            v["steps"] = serde_json::to_value(steps).unwrap_or_default();
            Json(v).into_response()
        }
        Err(e) => failure(&e),
    }
}

/// `POST /workflows/{id}/cancel` and `/retry`: the action as the request's actor.
async fn act(
    st: AppState,
    actor: ApiActor,
    id: Result<Path<u64>, PathRejection>,
    what: WorkflowAction,
) -> Response {
    let Some(id) = workflow_id(id) else {
        return bad_request("the workflow id is a number from 0 to 9223372036854775807");
    };
    let c = st.client.clone().with_actor(actor.0);
    let body = match what.apply(&c, id).await {
        Ok(WorkflowDone::Canceled {
            canceled,
            requested,
        }) => json!({
            "id": id.0, "result": "canceled", "canceled": canceled, "cancel_requested": requested
        }),
        Ok(WorkflowDone::Retried(n)) => json!({"id": id.0, "result": "retried", "retried": n}),
        Err(e) => return failure(&e),
    };
    st.terminal.invalidate().await;
    Json(body).into_response()
}

pub(crate) async fn workflow_cancel(
    State(st): State<AppState>,
    Extension(actor): Extension<ApiActor>,
    id: Result<Path<u64>, PathRejection>,
) -> Response {
    act(st, actor, id, WorkflowAction::Cancel).await
}

pub(crate) async fn workflow_retry(
    State(st): State<AppState>,
    Extension(actor): Extension<ApiActor>,
    id: Result<Path<u64>, PathRejection>,
) -> Response {
    act(st, actor, id, WorkflowAction::Retry).await
}
