//! The task actions of the pages: run now, reschedule, change priority and delete one task,
//! and the select-many form of the task list (one action over the checked ids).

use std::fmt::Write as _;

use axum::Extension;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use taskq::TaskId;

use super::{failure, see_task_with_flash};
use crate::AppState;
use crate::actions::{Each, When};
use crate::ctx::Ctx;
use crate::html::{error_page, esc, page, respond};

/// The form's fields, repeated ones kept (`id=1&id=2`).
fn fields(body: &[u8]) -> Vec<(String, String)> {
    form_urlencoded::parse(body).into_owned().collect()
}

fn field<'a>(f: &'a [(String, String)], name: &str) -> Option<&'a str> {
    f.iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.trim())
        .filter(|v| !v.is_empty())
}

pub(super) async fn task_run_now(
    State(st): State<AppState>,
    Extension(ctx): Extension<Ctx>,
    Path(id): Path<u64>,
) -> Response {
    let c = st.client.clone().with_actor(ctx.actor.clone());
    match c.run_now(TaskId(id)).await {
        Ok(()) => see_task_with_flash(&ctx, id, "due_now"),
        Err(e) => failure(&ctx, &e),
    }
}

pub(super) async fn task_reschedule(
    State(st): State<AppState>,
    Extension(ctx): Extension<Ctx>,
    Path(id): Path<u64>,
    body: Bytes,
) -> Response {
    let f = fields(&body);
    let when = match field(&f, "when").map(When::parse) {
        Some(Ok(w)) => w,
        Some(Err(e)) => return error_page(&ctx, StatusCode::BAD_REQUEST, &e),
        None => return error_page(&ctx, StatusCode::BAD_REQUEST, "when: required"),
    };
    let c = st.client.clone().with_actor(ctx.actor.clone());
    match when.apply(&c, TaskId(id)).await {
        Ok(()) => see_task_with_flash(&ctx, id, "rescheduled"),
        Err(e) => failure(&ctx, &e),
    }
}

pub(super) async fn task_priority(
    State(st): State<AppState>,
    Extension(ctx): Extension<Ctx>,
    Path(id): Path<u64>,
    body: Bytes,
) -> Response {
    let f = fields(&body);
    let Some(Ok(priority)) = field(&f, "priority").map(str::parse::<i16>) else {
        return error_page(
            &ctx,
            StatusCode::BAD_REQUEST,
            "priority: a whole number from -32768 to 32767 (lower runs first)",
        );
    };
    let c = st.client.clone().with_actor(ctx.actor.clone());
    match c.set_priority(TaskId(id), priority).await {
        Ok(()) => see_task_with_flash(&ctx, id, "priority"),
        Err(e) => failure(&ctx, &e),
    }
}

pub(super) async fn task_delete(
    State(st): State<AppState>,
    Extension(ctx): Extension<Ctx>,
    Path(id): Path<u64>,
) -> Response {
    let c = st.client.clone().with_actor(ctx.actor.clone());
    match c.delete(TaskId(id)).await {
        Ok(()) => {
            st.terminal.invalidate().await;
            let b = format!(
                r#"<h1>Deleted</h1><p class="flash" id="deleted">Deleted task {id}.</p><p><a href="{}tasks">Back to the tasks</a></p>"#,
                esc(&ctx.root)
            );
            respond(StatusCode::OK, page(&ctx, "Deleted", &b, None))
        }
        Err(e) => failure(&ctx, &e),
    }
}

/// `POST /tasks/selected`: `action` (`cancel`, `retry`, `run_now`, `delete`) over every checked
/// `id` (at most the maximum page size), one audited call per task; a page with what happened
/// to each.
pub(super) async fn tasks_selected(
    State(st): State<AppState>,
    Extension(ctx): Extension<Ctx>,
    body: Bytes,
) -> Response {
    let f = fields(&body);
    let Some(each) = field(&f, "action").and_then(Each::parse) else {
        return error_page(
            &ctx,
            StatusCode::BAD_REQUEST,
            "action must be cancel, retry, run_now or delete",
        );
    };
    let mut ids = Vec::new();
    for (k, v) in &f {
        if k == "id" {
            match v.parse::<u64>() {
                Ok(id) if !ids.contains(&id) => ids.push(id),
                Ok(_) => {}
                Err(_) => {
                    return error_page(&ctx, StatusCode::BAD_REQUEST, "id: not a task id");
                }
            }
        }
    }
    if ids.is_empty() {
        return error_page(&ctx, StatusCode::BAD_REQUEST, "no task selected");
    }
    if ids.len() > st.max_page_size as usize {
        return error_page(
            &ctx,
            StatusCode::BAD_REQUEST,
            &format!("at most {} tasks at once", st.max_page_size),
        );
    }
    let c = st.client.clone().with_actor(ctx.actor.clone());
    let root = esc(&ctx.root);
    let mut ok = 0;
    let mut rows = String::new();
    for id in &ids {
        let (class, what) = match each.apply(&c, TaskId(*id)).await {
            Ok(done) => {
                ok += 1;
                ("", done.replace('_', " "))
            }
            Err(e) => ("error", e.to_string()),
        };
        let link = if each == Each::Delete && class.is_empty() {
            id.to_string()
        } else {
            format!(r#"<a href="{root}tasks/{id}">{id}</a>"#)
        };
        let _ = write!(
            rows,
            r#"<tr data-id="{id}" class="{class}"><td>{link}</td><td>{}</td></tr>"#,
            esc(&what)
        );
    }
    st.terminal.invalidate().await;
    let b = format!(
        r#"<h1>Done</h1><p class="flash" id="selected-done" data-ok="{ok}">{ok} of {} selected tasks: {}.</p><table id="selected"><tr><th>Task</th><th>Result</th></tr>{rows}</table><p><a href="{root}tasks">Back to the tasks</a></p>"#,
        ids.len(),
        match each {
            Each::Cancel => "cancel",
            Each::Retry => "retry",
            Each::RunNow => "run now",
            Each::Delete => "delete",
        }
    );
    respond(StatusCode::OK, page(&ctx, "Done", &b, None))
}
