//! The API routes of the operator's views (scheduled and retrying tasks, schedules, the audit
//! trail, the task names no live worker handles, events), of the event key actions (retry,
//! skip, replay) and of the task actions (run now, reschedule, priority, delete, one action
//! over selected ids).

use std::future::Future;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::{Value, json};
use taskq::client::{AuditFilter, PendingKind};
use taskq::{Client, TaskId};

use crate::AppState;
use crate::actions::{Each, When};
use crate::auth::ApiActor;
use crate::event_actions::{KeyAction, KeyDone, MAX_SEQ};
use crate::json::{TaskJson, bad_request, failure};
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
        .map(str::parse::<PendingCursor>)
        .transpose()
    {
        Ok(a) => a,
        Err(e) => return bad_request(&e),
    };
    if p.limit == Some(0) {
        return bad_request("limit must be at least 1");
    }
    let limit = p.limit.unwrap_or(st.page_size).min(st.max_page_size);
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
    if p.limit == Some(0) {
        return bad_request("limit must be at least 1");
    }
    if [p.task, p.before]
        .iter()
        .flatten()
        .any(|&v| i64::try_from(v).is_err())
    {
        return bad_request("task and before are ids: at most 9223372036854775807");
    }
    let limit = p.limit.unwrap_or(st.page_size).min(st.max_page_size);
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

/// `GET events`: per topic the pending events and the lag, and the held keys.
pub(crate) async fn events(State(st): State<AppState>) -> Response {
    match tokio::try_join!(
        st.client.event_stats(),
        st.client
            .event_keys_held(None, crate::stats::EVENTS_HELD_SHOWN)
    ) {
        Ok((topics, held)) => Json(json!({"topics": topics, "held_keys": held})).into_response(),
        Err(e) => failure(&e),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EventKeyBody {
    topic: String,
    key: String,
    from_seq: Option<u64>,
}

/// `POST /events/retry`, `/events/skip`, `/events/replay`: one action on an event key
/// (`{"topic", "key"}`, and `from_seq` for a replay), audited with the request's actor.
async fn event_key_action(
    st: AppState,
    actor: ApiActor,
    body: Bytes,
    action: fn(u64) -> KeyAction,
) -> Response {
    let b: EventKeyBody = match body_json(&body) {
        Ok(b) => b,
        Err(e) => return bad_request(&e),
    };
    let replay = matches!(action(0), KeyAction::Replay(_));
    if b.from_seq.is_some() && !replay {
        return bad_request("from_seq is for a replay only");
    }
    if b.from_seq.is_some_and(|n| n > MAX_SEQ) {
        return bad_request(&format!("from_seq: at most {MAX_SEQ}"));
    }
    let fits = |s: &str| !s.is_empty() && s.chars().count() <= 255;
    if !fits(&b.topic) || !fits(&b.key) {
        return bad_request("topic and key: 1 to 255 characters");
    }
    let c = st.client.clone().with_actor(actor.0);
    let (topic, key) = (b.topic.as_str(), b.key.as_str());
    match action(b.from_seq.unwrap_or(0)).apply(&c, topic, key).await {
        Ok(KeyDone::Retried) => Json(json!({"topic": topic, "key": key, "result": "retried"})),
        Ok(KeyDone::Skipped) => Json(json!({"topic": topic, "key": key, "result": "skipped"})),
        Ok(KeyDone::Replayed(n)) => Json(json!({
            "topic": topic, "key": key, "result": "replayed", "events": n
        })),
        Ok(KeyDone::NotHeld) => {
            return crate::json::error(
                axum::http::StatusCode::CONFLICT,
                "not_held",
                &format!("key {key:?} of topic {topic:?} is not held: nothing to retry or skip"),
            );
        }
        Ok(KeyDone::NoSuchKey) => {
            return crate::json::error(
                axum::http::StatusCode::NOT_FOUND,
                "not_found",
                &format!("no event was published on key {key:?} of topic {topic:?}"),
            );
        }
        Err(e) => return failure(&e),
    }
    .into_response()
}

pub(crate) async fn event_retry(
    State(st): State<AppState>,
    Extension(actor): Extension<ApiActor>,
    body: Bytes,
) -> Response {
    event_key_action(st, actor, body, |_| KeyAction::Retry).await
}

pub(crate) async fn event_skip(
    State(st): State<AppState>,
    Extension(actor): Extension<ApiActor>,
    body: Bytes,
) -> Response {
    event_key_action(st, actor, body, |_| KeyAction::Skip).await
}

pub(crate) async fn event_replay(
    State(st): State<AppState>,
    Extension(actor): Extension<ApiActor>,
    body: Bytes,
) -> Response {
    event_key_action(st, actor, body, KeyAction::Replay).await
}

// ----------------------------------------------------------------------------- task actions

/// The JSON body of an action, `{}` when empty.
/// The JSON body of an action decoded as `T` (an empty body is `{}`).
fn body_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, String> {
    let body: &[u8] = if body.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        body
    };
    let value: Value =
        serde_json::from_slice(body).map_err(|e| format!("invalid request body: {e}"))?;
    // An explicit `null` is not "left out": the documented fields are never nullable.
    if let Some((k, _)) = value
        .as_object()
        .and_then(|o| o.iter().find(|(_, v)| v.is_null()))
    {
        return Err(format!("invalid request body: {k} must not be null"));
    }
    serde_json::from_value(value).map_err(|e| format!("invalid request body: {e}"))
}

fn task_id(id: Result<Path<u64>, PathRejection>) -> Option<u64> {
    id.ok().map(|Path(id)| id)
}

/// One task action, the shape of every `POST /tasks/{id}/...`: the id from the path (400 when
/// it is not a number), then `call` with the client acting as the request's actor and the id;
/// the JSON it returns, or its failure (`Err` of [`fail`], or a 400 of its own).
pub(crate) async fn task_action<F, Fut>(
    st: &AppState,
    actor: ApiActor,
    id: Result<Path<u64>, PathRejection>,
    call: F,
) -> Response
where
    F: FnOnce(Client, TaskId) -> Fut,
    Fut: Future<Output = Result<Value, Response>>,
{
    let Some(id) = task_id(id) else {
        return bad_request("the task id is a number");
    };
    match call(st.client.clone().with_actor(actor.0), TaskId(id)).await {
        Ok(v) => Json(v).into_response(),
        Err(r) => r,
    }
}

/// The response of a failed client call, for `?` in a [`task_action`].
pub(crate) fn fail(e: taskq::Error) -> Response {
    failure(&e)
}

pub(crate) async fn task_run_now(
    State(st): State<AppState>,
    Extension(actor): Extension<ApiActor>,
    id: Result<Path<u64>, PathRejection>,
) -> Response {
    task_action(&st, actor, id, |c, id| async move {
        c.run_now(id).await.map_err(fail)?;
        Ok(json!({"id": id.0, "result": "due_now"}))
    })
    .await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RescheduleBody {
    run_at: Option<DateTime<Utc>>,
    delay_ms: Option<u64>,
}

pub(crate) async fn task_reschedule(
    State(st): State<AppState>,
    Extension(actor): Extension<ApiActor>,
    id: Result<Path<u64>, PathRejection>,
    body: Bytes,
) -> Response {
    let Some(id) = task_id(id) else {
        return bad_request("the task id is a number");
    };
    let b: RescheduleBody = match body_json(&body) {
        Ok(b) => b,
        Err(e) => return bad_request(&e),
    };
    let when = match (b.run_at, b.delay_ms) {
        (Some(t), None) => When::At(t),
        (None, Some(ms)) => When::In(Duration::from_millis(ms)),
        _ => return bad_request("give exactly one of run_at and delay_ms"),
    };
    let c = st.client.clone().with_actor(actor.0);
    if let Err(e) = when.apply(&c, TaskId(id)).await {
        return failure(&e);
    }
    match st.client.get(TaskId(id)).await {
        Ok(t) => Json(json!({"id": id, "run_at": t.run_at})).into_response(),
        Err(e) => failure(&e),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PriorityBody {
    priority: i16,
}

pub(crate) async fn task_priority(
    State(st): State<AppState>,
    Extension(actor): Extension<ApiActor>,
    id: Result<Path<u64>, PathRejection>,
    body: Bytes,
) -> Response {
    task_action(&st, actor, id, |c, id| async move {
        let b: PriorityBody = serde_json::from_slice(&body)
            .map_err(|e| bad_request(&format!("invalid request body: {e}")))?;
        c.set_priority(id, b.priority).await.map_err(fail)?;
        Ok(json!({"id": id.0, "priority": b.priority}))
    })
    .await
}

pub(crate) async fn task_delete(
    State(st): State<AppState>,
    Extension(actor): Extension<ApiActor>,
    id: Result<Path<u64>, PathRejection>,
) -> Response {
    let st = &st;
    task_action(st, actor, id, |c, id| async move {
        c.delete(id).await.map_err(fail)?;
        st.terminal.invalidate().await;
        Ok(json!({"id": id.0, "result": "deleted"}))
    })
    .await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SelectedBody {
    action: String,
    ids: Vec<u64>,
}

/// `POST /tasks/selected`: one action over a list of ids, one audited call per task.
pub(crate) async fn tasks_selected(
    State(st): State<AppState>,
    Extension(actor): Extension<ApiActor>,
    body: Bytes,
) -> Response {
    let b: SelectedBody = match serde_json::from_slice(&body) {
        Ok(b) => b,
        Err(e) => return bad_request(&format!("invalid request body: {e}")),
    };
    let Some(each) = Each::parse(&b.action) else {
        return bad_request("action must be cancel, retry, run_now or delete");
    };
    if b.ids.is_empty() || b.ids.len() > crate::MAX_PAGE_SIZE as usize {
        return bad_request(&format!("ids: 1 to {} task ids", crate::MAX_PAGE_SIZE));
    }
    if b.ids.iter().any(|&id| i64::try_from(id).is_err()) {
        return bad_request("ids are task ids: at most 9223372036854775807");
    }
    let c = st.client.clone().with_actor(actor.0);
    let mut done = Vec::new();
    let mut failed = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for id in b.ids.into_iter().filter(|id| seen.insert(*id)) {
        match each.apply(&c, TaskId(id)).await {
            Ok(result) => done.push(json!({"id": id, "result": result})),
            Err(e) => {
                let (_, code, message) = crate::json::error_parts(&e);
                failed.push(json!({"id": id, "code": code, "message": message}));
            }
        }
    }
    st.terminal.invalidate().await;
    Json(json!({"done": done, "failed": failed})).into_response()
}
