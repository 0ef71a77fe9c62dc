//! The API routes of the operator's views: scheduled and retrying tasks, schedules, the audit
//! trail, and the task names no live worker handles.

use axum::Json;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;
use taskq::TaskId;
use taskq::client::{AuditFilter, PendingKind};

use crate::AppState;
use crate::api::{TaskJson, bad_request, failure};
use crate::views::{PendingCursor, pending, schedule_views};

#[derive(Deserialize, Default)]
pub(crate) struct PendingParams {
    queue: Option<String>,
    after: Option<String>,
    limit: Option<u32>,
}

pub(crate) async fn scheduled(
    State(st): State<AppState>,
    params: Result<Query<PendingParams>, axum::extract::rejection::QueryRejection>,
) -> Response {
    pending_list(st, params, PendingKind::Scheduled).await
}

pub(crate) async fn retrying(
    State(st): State<AppState>,
    params: Result<Query<PendingParams>, axum::extract::rejection::QueryRejection>,
) -> Response {
    pending_list(st, params, PendingKind::Retrying).await
}

async fn pending_list(
    st: AppState,
    params: Result<Query<PendingParams>, axum::extract::rejection::QueryRejection>,
    kind: PendingKind,
) -> Response {
    let Ok(Query(p)) = params else {
        return bad_request("invalid query: limit is a number");
    };
    let after = match p
        .after
        .as_deref()
        .filter(|s| !s.is_empty())
        .map(str::parse::<PendingCursor>)
        .transpose()
    {
        Ok(a) => a,
        Err(e) => return bad_request(&e),
    };
    let limit = p.limit.unwrap_or(st.page_size).clamp(1, st.max_page_size);
    let queue = p.queue.as_deref().filter(|s| !s.is_empty());
    let (tasks, next) = match pending(&st, kind, queue, after, limit).await {
        Ok(v) => v,
        Err(e) => return failure(&e),
    };
    let items: Vec<TaskJson<'_>> = tasks.iter().map(|t| TaskJson::new(t, false)).collect();
    Json(json!({"tasks": items, "next_after": next.map(|c| c.to_string())})).into_response()
}

pub(crate) async fn schedules(State(st): State<AppState>) -> Response {
    match schedule_views(&st).await {
        Ok((now, rows)) => Json(json!({"now": now, "schedules": rows})).into_response(),
        Err(e) => failure(&e),
    }
}

#[derive(Deserialize, Default)]
pub(crate) struct AuditParams {
    queue: Option<String>,
    task: Option<u64>,
    before: Option<u64>,
    limit: Option<u32>,
}

pub(crate) async fn audit(
    State(st): State<AppState>,
    params: Result<Query<AuditParams>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Ok(Query(p)) = params else {
        return bad_request("invalid query: task, before and limit are numbers");
    };
    let limit = p.limit.unwrap_or(st.page_size).clamp(1, st.max_page_size);
    let filter = AuditFilter {
        task: p.task.map(TaskId),
        queue: p.queue.filter(|s| !s.is_empty()),
        before_id: p.before,
        limit: Some(limit + 1),
    };
    let mut rows = match st.client.audit(&filter).await {
        Ok(r) => r,
        Err(e) => return failure(&e),
    };
    let more = rows.len() > limit as usize;
    rows.truncate(limit as usize);
    let next = if more {
        rows.last().map(|e| e.id)
    } else {
        None
    };
    Json(json!({"entries": rows, "next_before": next})).into_response()
}

pub(crate) async fn unhandled(State(st): State<AppState>) -> Response {
    match crate::stats::unhandled(&st).await {
        Ok(u) => Json(json!({"counted_at": u.at, "unhandled": u.rows})).into_response(),
        Err(e) => failure(&e),
    }
}
