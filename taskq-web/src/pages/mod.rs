//! The HTML pages and their form actions: the routes and the helpers the pages share
//! (redirects, failure pages, form values); one module per page or page family.

mod actions;
mod batches;
mod bulk;
mod events;
mod login;
mod overview;
mod queues;
mod task;
mod task_list;
mod views;
mod workflows;

use std::time::Duration;

use axum::Router;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use taskq::client::{WorkerInfo, WorkerStatus};
use taskq::{Error, TaskState};

use crate::AppState;
use crate::auth::FLASH_MARK;
use crate::ctx::Ctx;
use crate::html::error_page;

use bulk::{bulk_confirm, bulk_run};
pub(crate) use login::login_page;
use login::{login_get, login_post, logout};
use overview::overview;
use queues::{queue_pause, queue_resume};
use task::{task_cancel, task_page, task_retry};
use task_list::task_list;

/// The page routes (the guard is added by the caller).
pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/", get(overview))
        .route("/tasks", get(task_list))
        .route("/tasks/{id}", get(task_page))
        .route("/tasks/{id}/retry", post(task_retry))
        .route("/tasks/{id}/cancel", post(task_cancel))
        .route("/tasks/{id}/run-now", post(actions::task_run_now))
        .route("/tasks/{id}/reschedule", post(actions::task_reschedule))
        .route("/tasks/{id}/priority", post(actions::task_priority))
        .route("/tasks/{id}/delete", post(actions::task_delete))
        .route("/tasks/selected", post(actions::tasks_selected))
        .route("/queues/pause", post(queue_pause))
        .route("/queues/resume", post(queue_resume))
        .route("/bulk", get(bulk_confirm).post(bulk_run))
        .route("/scheduled", get(views::scheduled))
        .route("/retrying", get(views::retrying))
        .route("/schedules", get(views::schedules))
        .route("/audit", get(views::audit))
        .route("/unhandled", get(views::unhandled))
        .route("/workflows", get(workflows::workflows))
        .route("/workflows/{id}", get(workflows::workflow_page))
        .route("/workflows/{id}/cancel", post(workflows::workflow_cancel))
        .route("/workflows/{id}/retry", post(workflows::workflow_retry))
        .route("/batches", get(batches::batches))
        .route("/batches/{id}", get(batches::batch_page))
        .route("/batches/{id}/cancel", post(batches::batch_cancel))
        .route("/batches/{id}/seal", post(batches::batch_seal))
        .route("/events", get(events::events))
        .route("/events/retry", post(events::event_retry))
        .route("/events/skip", post(events::event_skip))
        .route("/events/replay", post(events::event_replay))
        .route("/login", get(login_get).post(login_post))
        .route("/logout", post(logout))
}

/// The 404 of a path the dashboard does not serve (the guard makes it an error page).
pub(crate) async fn not_found() -> Response {
    (StatusCode::NOT_FOUND, "no such page").into_response()
}

/// A `303 See Other` to `location` (relative to the current page).
fn see_other(location: &str) -> Response {
    let mut r = StatusCode::SEE_OTHER.into_response();
    if let Ok(v) = HeaderValue::from_str(location) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    r
}

/// A `303 See Other` to task `id`'s page, which then shows the confirmation of `what` once
/// (through the flash cookie: a reload does not show it again).
fn see_task_with_flash(ctx: &Ctx, id: u64, what: &str) -> Response {
    let mut r = see_other(&format!("{}tasks/{id}", ctx.root));
    if let Ok(v) = HeaderValue::from_str(&format!("{what}.{id}")) {
        r.headers_mut().insert(FLASH_MARK, v);
    }
    r
}

/// Status and sentence for a failed client call.
fn failure(ctx: &Ctx, e: &Error) -> Response {
    let status = match e {
        Error::NotFound(_) | Error::WorkflowNotFound(_) | Error::BatchNotFound(_) => {
            StatusCode::NOT_FOUND
        }
        Error::WrongState { .. } | Error::UniqueHeld { .. } | Error::BatchEnded(_) => {
            StatusCode::CONFLICT
        }
        Error::InvalidName { .. } | Error::InvalidOption(_) => StatusCode::BAD_REQUEST,
        Error::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    error_page(ctx, status, &e.to_string())
}

/// `None` for a missing or blank form/query value.
fn nonblank(s: &Option<String>) -> Option<&str> {
    s.as_deref().map(str::trim).filter(|s| !s.is_empty())
}

fn parse_state(s: Option<&str>) -> Result<Option<TaskState>, String> {
    s.map(|s| s.parse::<TaskState>().map_err(|e| e.to_string()))
        .transpose()
}

/// An age in taskq's duration grammar (`90s`, `15m`, `2h`, `7d`, `1d12h`, as on the command
/// line); blank is zero.
pub(crate) fn parse_age(s: Option<&str>) -> Result<Duration, String> {
    match s {
        None => Ok(Duration::ZERO),
        Some(s) => taskq_grammar::duration::parse(s).map_err(|reason| {
            format!(
                "invalid age {s:?}: {reason}; {}",
                taskq_grammar::duration::HELP
            )
        }),
    }
}

/// A worker's status as a cell: `alive`, `lost` (highlighted) or `stopped`.
fn worker_status_cell(w: &WorkerInfo) -> String {
    match w.status {
        WorkerStatus::Lost => r#"<span class="lost">lost</span>"#.to_owned(),
        s => s.as_str().to_owned(),
    }
}

/// The ids of the lost workers that hold running tasks among `tasks` (no read when none is
/// running).
pub(crate) async fn lost_workers(
    st: &AppState,
    tasks: &[taskq::client::TaskInfo],
) -> Result<std::collections::BTreeSet<String>, Error> {
    if !tasks.iter().any(|t| t.state == TaskState::Running) {
        return Ok(Default::default());
    }
    Ok(st
        .client
        .workers()
        .await?
        .into_iter()
        .filter(|w| w.status == WorkerStatus::Lost)
        .map(|w| w.id)
        .collect())
}

/// ` worker lost` (highlighted) after the state of a running task whose worker is lost.
pub(crate) fn lost_mark(
    t: &taskq::client::TaskInfo,
    lost: &std::collections::BTreeSet<String>,
) -> &'static str {
    match &t.worker_id {
        Some(w) if t.state == TaskState::Running && lost.contains(w) => {
            r#" <span class="lost worker-lost">worker lost</span>"#
        }
        _ => "",
    }
}

fn state_class(s: TaskState) -> String {
    format!("state-{}", s.as_str())
}
