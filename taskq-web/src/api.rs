//! The JSON API under `api/v1`, and its OpenAPI 3 document.

use std::collections::BTreeMap;

use axum::Extension;
use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, get, post};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use taskq::client::{Canceled, ListFilter};
use taskq::registry::JsonEnqueueOptions;
use taskq::{Error, TaskId, TaskState};

use crate::AppState;
use crate::auth::ApiActor;
use crate::json::{TaskJson, bad_request, error, failure};
use crate::views_api::{fail, task_action};

/// The OpenAPI 3 document of the API (served at `api/v1/openapi.json`).
pub(crate) const OPENAPI: &str = include_str!("openapi.json");

/// The API's routes: (method, path relative to `api/v1`, handler). The router is built from
/// this list, and a test checks it against the OpenAPI document both ways.
fn routes() -> Vec<(Method, &'static str, MethodRouter<AppState>)> {
    vec![
        (Method::GET, "/openapi.json", get(openapi)),
        (Method::GET, "/queues", get(queues)),
        (Method::POST, "/queues/{queue}/pause", post(queue_pause)),
        (Method::POST, "/queues/{queue}/resume", post(queue_resume)),
        (Method::GET, "/tasks", get(task_list)),
        (Method::POST, "/tasks", post(task_enqueue)),
        (Method::GET, "/tasks/{id}", get(task_get)),
        (Method::POST, "/tasks/{id}/cancel", post(task_cancel)),
        (Method::POST, "/tasks/{id}/retry", post(task_retry)),
        (
            Method::POST,
            "/tasks/{id}/run-now",
            post(crate::views_api::task_run_now),
        ),
        (
            Method::POST,
            "/tasks/{id}/reschedule",
            post(crate::views_api::task_reschedule),
        ),
        (
            Method::POST,
            "/tasks/{id}/priority",
            post(crate::views_api::task_priority),
        ),
        (
            Method::POST,
            "/tasks/{id}/delete",
            post(crate::views_api::task_delete),
        ),
        (
            Method::POST,
            "/tasks/selected",
            post(crate::views_api::tasks_selected),
        ),
        (Method::GET, "/task-names", get(task_names)),
        (Method::GET, "/workers", get(workers)),
        (Method::GET, "/scheduled", get(crate::views_api::scheduled)),
        (Method::GET, "/retrying", get(crate::views_api::retrying)),
        (Method::GET, "/schedules", get(crate::views_api::schedules)),
        (Method::GET, "/audit", get(crate::views_api::audit)),
        (Method::GET, "/unhandled", get(crate::views_api::unhandled)),
        (
            Method::GET,
            "/workflows",
            get(crate::workflows_api::workflows),
        ),
        (
            Method::GET,
            "/workflows/{id}",
            get(crate::workflows_api::workflow_get),
        ),
        (
            Method::POST,
            "/workflows/{id}/cancel",
            post(crate::workflows_api::workflow_cancel),
        ),
        (
            Method::POST,
            "/workflows/{id}/retry",
            post(crate::workflows_api::workflow_retry),
        ),
        (Method::GET, "/batches", get(crate::batches_api::batches)),
        (
            Method::GET,
            "/batches/{id}",
            get(crate::batches_api::batch_get),
        ),
        (
            Method::POST,
            "/batches/{id}/cancel",
            post(crate::batches_api::batch_cancel),
        ),
        (
            Method::POST,
            "/batches/{id}/seal",
            post(crate::batches_api::batch_seal),
        ),
        (Method::GET, "/events", get(crate::views_api::events)),
        (
            Method::POST,
            "/events/retry",
            post(crate::views_api::event_retry),
        ),
        (
            Method::POST,
            "/events/skip",
            post(crate::views_api::event_skip),
        ),
        (
            Method::POST,
            "/events/replay",
            post(crate::views_api::event_replay),
        ),
    ]
}

/// Every `(method, path)` the API serves, paths relative to `api/v1` (`/tasks/{id}`), in the
/// form the OpenAPI document uses.
pub fn api_routes() -> Vec<(&'static str, &'static str)> {
    routes()
        .into_iter()
        .map(|(m, p, _)| {
            let m = if m == Method::GET { "get" } else { "post" };
            (m, p)
        })
        .collect()
}

pub(crate) fn router() -> Router<AppState> {
    routes()
        .into_iter()
        .fold(Router::new(), |r, (_, path, handler)| {
            r.route(path, handler)
        })
}

/// The 404 of a path the API does not serve.
pub(crate) async fn not_found() -> Response {
    error(
        StatusCode::NOT_FOUND,
        "not_found",
        "no such endpoint: see api/v1/openapi.json",
    )
}

async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI).into_response()
}

// ----------------------------------------------------------------------------- queues

#[derive(Serialize)]
struct QueueJson {
    queue: String,
    paused: bool,
    paused_at: Option<DateTime<Utc>>,
    concurrency_limit: Option<u32>,
    rate_limit: Option<taskq::client::RateLimit>,
    rate_used: u64,
    counts: BTreeMap<&'static str, u64>,
    oldest_pending_run_at: Option<DateTime<Utc>>,
}

async fn queues(State(st): State<AppState>) -> Response {
    let stats = match crate::stats::load(&st).await {
        Ok(v) => v,
        Err(e) => return failure(&e),
    };
    let queues: Vec<QueueJson> = stats
        .queues
        .into_iter()
        .map(|(queue, row)| QueueJson {
            queue,
            paused: row.paused_at.is_some(),
            paused_at: row.paused_at,
            concurrency_limit: row.concurrency_limit,
            rate_limit: row.rate_limit,
            rate_used: row.rate_used,
            counts: TaskState::ALL
                .iter()
                .zip(row.counts)
                .map(|(s, n)| (s.as_str(), n))
                .collect(),
            oldest_pending_run_at: row.oldest_pending,
        })
        .collect();
    Json(json!({
        "now": stats.now,
        "terminal_counts_at": stats.terminal_at,
        "queues": queues,
        "finished_per_minute": stats.finished,
        "failed_attempts_per_minute": stats.failed,
        "run_times": stats.run_times,
    }))
    .into_response()
}

async fn queue_pause(
    State(st): State<AppState>,
    Extension(actor): Extension<ApiActor>,
    Path(queue): Path<String>,
) -> Response {
    match st.client.queue_exists(&queue).await {
        Ok(true) => {}
        Ok(false) => {
            return error(
                StatusCode::NOT_FOUND,
                "unknown_queue",
                &crate::stats::unknown_queue(&queue),
            );
        }
        Err(e) => return failure(&e),
    }
    match st
        .client
        .clone()
        .with_actor(actor.0)
        .pause_queue(&queue)
        .await
    {
        Ok(()) => Json(json!({"queue": queue, "paused": true})).into_response(),
        Err(e) => failure(&e),
    }
}

async fn queue_resume(
    State(st): State<AppState>,
    Extension(actor): Extension<ApiActor>,
    Path(queue): Path<String>,
) -> Response {
    match st
        .client
        .clone()
        .with_actor(actor.0)
        .resume_queue(&queue)
        .await
    {
        Ok(was) => {
            Json(json!({"queue": queue, "paused": false, "was_paused": was})).into_response()
        }
        Err(e) => failure(&e),
    }
}

// ----------------------------------------------------------------------------- tasks

#[derive(Deserialize, Default)]
struct ListParams {
    queue: Option<String>,
    name: Option<String>,
    state: Option<String>,
    order: Option<String>,
    after: Option<u64>,
    limit: Option<u32>,
}

async fn task_list(
    State(st): State<AppState>,
    params: Result<Query<ListParams>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Ok(Query(p)) = params else {
        return bad_request("invalid query: after and limit are numbers");
    };
    let state = match p.state.as_deref().map(str::parse::<TaskState>) {
        None => None,
        Some(Ok(s)) => Some(s),
        Some(Err(e)) => return bad_request(&e.to_string()),
    };
    let newest = match p.order.as_deref() {
        None | Some("newest") => true,
        Some("oldest") => false,
        Some(_) => return bad_request("order must be newest or oldest"),
    };
    if p.limit == Some(0) {
        return bad_request("limit must be at least 1");
    }
    if p.after.is_some_and(|a| i64::try_from(a).is_err()) {
        return bad_request("after is a task id: at most 9223372036854775807");
    }
    let limit = p.limit.unwrap_or(st.page_size).min(st.max_page_size);
    let filter = ListFilter {
        queue: p.queue.filter(|s| !s.is_empty()),
        name: p.name.filter(|s| !s.is_empty()),
        state,
        after_id: p.after.map(TaskId),
        limit: Some(limit + 1),
        newest_first: newest,
    };
    let mut tasks = match st.client.list(&filter).await {
        Ok(t) => t,
        Err(e) => return failure(&e),
    };
    let more = tasks.len() > limit as usize;
    tasks.truncate(limit as usize);
    let next = if more {
        tasks.last().map(|t| t.id)
    } else {
        None
    };
    // The status of the workers holding the page's running tasks (read only when it has some).
    let workers = if tasks.iter().any(|t| t.state == TaskState::Running) {
        match st.client.workers().await {
            Ok(w) => w,
            Err(e) => return failure(&e),
        }
    } else {
        Vec::new()
    };
    let items: Vec<TaskJson<'_>> = tasks
        .iter()
        .map(|t| {
            let mut j = TaskJson::new(t, false);
            if t.state == TaskState::Running {
                j.worker_status = Some(
                    workers
                        .iter()
                        .find(|w| Some(&w.id) == t.worker_id.as_ref())
                        .map_or("unknown", |w| w.status.as_str()),
                );
            }
            j
        })
        .collect();
    Json(json!({"tasks": items, "next_after": next})).into_response()
}

async fn task_get(
    State(st): State<AppState>,
    id: Result<Path<u64>, axum::extract::rejection::PathRejection>,
) -> Response {
    let Ok(Path(id)) = id else {
        return bad_request("the task id is a number");
    };
    let t = match st.client.get(TaskId(id)).await {
        Ok(t) => t,
        Err(e) => return failure(&e),
    };
    let attempts = match st.client.attempts(TaskId(id)).await {
        Ok(a) => a,
        Err(e) => return failure(&e),
    };
    let mut v = serde_json::to_value(TaskJson::new(&t, true)).unwrap_or_default();
    v["attempts"] = serde_json::to_value(attempts).unwrap_or_default();
    // Whether the worker holding a running task is alive, lost or stopped.
    if t.state == TaskState::Running {
        let workers = match st.client.workers().await {
            Ok(w) => w,
            Err(e) => return failure(&e),
        };
        let holder = workers.iter().find(|w| Some(&w.id) == t.worker_id.as_ref());
        v["worker_status"] = holder.map_or(Value::Null, |w| w.status.as_str().into());
    }
    Json(v).into_response()
}

async fn task_cancel(
    State(st): State<AppState>,
    Extension(actor): Extension<ApiActor>,
    id: Result<Path<u64>, axum::extract::rejection::PathRejection>,
) -> Response {
    let st = &st;
    task_action(st, actor, id, |c, id| async move {
        let result = match c.cancel(id).await.map_err(fail)? {
            Canceled::Now => {
                st.terminal.invalidate().await;
                "canceled"
            }
            Canceled::Requested => "cancel_requested",
        };
        Ok(json!({"id": id.0, "result": result}))
    })
    .await
}

async fn task_retry(
    State(st): State<AppState>,
    Extension(actor): Extension<ApiActor>,
    id: Result<Path<u64>, axum::extract::rejection::PathRejection>,
) -> Response {
    let st = &st;
    task_action(st, actor, id, |c, id| async move {
        c.retry_dead(id).await.map_err(fail)?;
        st.terminal.invalidate().await;
        Ok(json!({"id": id.0, "state": "pending"}))
    })
    .await
}

/// The body of `POST /tasks`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EnqueueBody {
    name: String,
    #[serde(default)]
    payload: Option<Value>,
    queue: Option<String>,
    priority: Option<i16>,
    max_attempts: Option<u32>,
    delay_ms: Option<u64>,
    idempotency_key: Option<String>,
}

async fn task_enqueue(
    State(st): State<AppState>,
    Extension(actor): Extension<ApiActor>,
    body: Bytes,
) -> Response {
    let b: EnqueueBody = match serde_json::from_slice(&body) {
        Ok(b) => b,
        Err(e) => return bad_request(&format!("invalid request body: {e}")),
    };
    let Some(reg) = taskq::registry::registration(&b.name) else {
        return failure(&Error::UnknownTask(b.name));
    };
    let payload = b.payload.unwrap_or_else(|| json!({}));
    let payload = match serde_json::to_vec(&payload) {
        Ok(p) => p,
        Err(e) => return bad_request(&e.to_string()),
    };
    let options = JsonEnqueueOptions {
        queue: b.queue,
        priority: b.priority,
        max_attempts: b.max_attempts,
        delay: b.delay_ms.map(std::time::Duration::from_millis),
        idempotency_key: b.idempotency_key,
    };
    let queue = options
        .queue
        .clone()
        .unwrap_or_else(|| reg.queue().to_owned());
    let client = st.client.clone().with_actor(actor.0);
    let enqueued = client.enqueue_json(
        &reg,
        &payload,
        &options,
        json!({"name": reg.name(), "via": "api"}),
    );
    match enqueued.await {
        Ok(done) => {
            let status = if done.duplicate {
                StatusCode::OK
            } else {
                StatusCode::CREATED
            };
            (
                status,
                Json(json!({
                    "id": done.id,
                    "duplicate": done.duplicate,
                    "name": reg.name(),
                    "queue": queue,
                })),
            )
                .into_response()
        }
        Err(e) => failure(&e),
    }
}

// ----------------------------------------------------------------------------- workers

/// The workers recorded in the database (alive, lost or stopped, with the age of their last
/// heartbeat) and the due tasks no live worker handles (counted at `unhandled_counted_at`,
/// reused like the overview's terminal counts).
async fn workers(State(st): State<AppState>) -> Response {
    let (now, workers, unhandled) = match tokio::try_join!(
        st.client.db_now(),
        st.client.workers(),
        crate::stats::unhandled(&st)
    ) {
        Ok(v) => v,
        Err(e) => return failure(&e),
    };
    Json(json!({
        "now": now,
        "workers": workers,
        "unhandled": unhandled.rows,
        "unhandled_counted_at": unhandled.at,
    }))
    .into_response()
}

async fn task_names() -> Response {
    let mut regs: Vec<Value> = taskq::registry::registered()
        .iter()
        .map(|r| json!({"name": r.name(), "queue": r.queue()}))
        .collect();
    regs.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
    regs.dedup();
    Json(json!({"tasks": regs})).into_response()
}
