//! The API routes of batches: a page of them, one with a page of its members, and the actions
//! (cancel the batch, audited with the request's actor; seal it).

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::json;
use taskq::batch::BatchId;

use crate::AppState;
use crate::auth::ApiActor;
use crate::batches::{BatchAction, BatchDone};
use crate::json::{bad_request, failure};

/// The largest id the API takes (the databases store signed 64-bit ids).
const MAX_ID: u64 = i64::MAX as u64;

#[derive(Deserialize, Default)]
pub(crate) struct BatchesParams {
    name: Option<String>,
    before: Option<u64>,
    limit: Option<u32>,
}

/// `GET /batches`: `{"batches": [..], "next_before": id | null}`, newest first.
pub(crate) async fn batches(
    State(st): State<AppState>,
    params: Result<Query<BatchesParams>, QueryRejection>,
) -> Response {
    let Ok(Query(p)) = params else {
        return bad_request("invalid query: before and limit are numbers");
    };
    if p.limit == Some(0) {
        return bad_request("limit must be at least 1");
    }
    if p.before.is_some_and(|b| b > MAX_ID) {
        return bad_request("before is a batch id: at most 9223372036854775807");
    }
    let limit = p.limit.unwrap_or(st.page_size).min(st.max_page_size);
    let name = p.name.as_deref().filter(|s| !s.is_empty());
    match crate::batches::page(&st, name, p.before, limit).await {
        Ok((rows, next)) => Json(json!({"batches": rows, "next_before": next})).into_response(),
        Err(e) => failure(&e),
    }
}

/// The batch id of the path; `None` when it is not one.
fn batch_id(id: Result<Path<u64>, PathRejection>) -> Option<BatchId> {
    id.ok()
        .map(|Path(id)| id)
        .filter(|id| *id <= MAX_ID)
        .map(BatchId)
}

#[derive(Deserialize, Default)]
pub(crate) struct MembersParams {
    after: Option<u64>,
    limit: Option<u32>,
}

/// `GET /batches/{id}?after=&limit=`: the batch (state, counters, callbacks) with a page of
/// its members by task id (`members`, `next_after`).
pub(crate) async fn batch_get(
    State(st): State<AppState>,
    id: Result<Path<u64>, PathRejection>,
    params: Result<Query<MembersParams>, QueryRejection>,
) -> Response {
    let Some(id) = batch_id(id) else {
        return bad_request("the batch id is a number from 0 to 9223372036854775807");
    };
    let Ok(Query(p)) = params else {
        return bad_request("invalid query: after and limit are numbers");
    };
    if p.limit == Some(0) {
        return bad_request("limit must be at least 1");
    }
    if p.after.is_some_and(|a| a > MAX_ID) {
        return bad_request("after is a task id: at most 9223372036854775807");
    }
    let limit = p.limit.unwrap_or(st.page_size).min(st.max_page_size);
    match tokio::try_join!(
        st.client.batch(id),
        crate::batches::members(&st, id, p.after, limit)
    ) {
        Ok((b, (members, next))) => {
            let mut v = serde_json::to_value(b).unwrap_or_default();
            v["members"] = serde_json::to_value(members).unwrap_or_default();
            v["next_after"] = json!(next);
            Json(v).into_response()
        }
        Err(e) => failure(&e),
    }
}

/// `POST /batches/{id}/cancel` and `/seal`: the action as the request's actor.
async fn act(
    st: AppState,
    actor: ApiActor,
    id: Result<Path<u64>, PathRejection>,
    what: BatchAction,
) -> Response {
    let Some(id) = batch_id(id) else {
        return bad_request("the batch id is a number from 0 to 9223372036854775807");
    };
    let c = st.client.clone().with_actor(actor.0);
    let body = match what.apply(&c, id).await {
        Ok(BatchDone::Canceled {
            canceled,
            requested,
            callbacks,
        }) => json!({
            "id": id.0, "result": "canceled", "canceled": canceled,
            "cancel_requested": requested, "callbacks_canceled": callbacks
        }),
        Ok(BatchDone::Sealed) => json!({"id": id.0, "result": "sealed"}),
        Err(e) => return failure(&e),
    };
    st.terminal.invalidate().await;
    Json(body).into_response()
}

pub(crate) async fn batch_cancel(
    State(st): State<AppState>,
    Extension(actor): Extension<ApiActor>,
    id: Result<Path<u64>, PathRejection>,
) -> Response {
    act(st, actor, id, BatchAction::Cancel).await
}

pub(crate) async fn batch_seal(
    State(st): State<AppState>,
    Extension(actor): Extension<ApiActor>,
    id: Result<Path<u64>, PathRejection>,
) -> Response {
    act(st, actor, id, BatchAction::Seal).await
}
