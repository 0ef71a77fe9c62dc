//! The task list: tasks filtered by queue, name and state, with keyset pagination.

use std::fmt::Write as _;

use axum::Extension;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde::Deserialize;
use taskq::client::ListFilter;
use taskq::{TaskId, TaskState};

use super::{failure, nonblank, parse_state, see_other, state_class};
use crate::AppState;
use crate::ctx::Ctx;
use crate::html::{error_page, esc, page, respond, time, truncate, url};

#[derive(Deserialize, Default)]
pub(super) struct ListQuery {
    queue: Option<String>,
    name: Option<String>,
    state: Option<String>,
    order: Option<String>,
    after: Option<String>,
    limit: Option<String>,
    id: Option<String>,
}

/// The query string of a list page (with `&amp;` separators, ready for an attribute).
fn list_query(
    queue: Option<&str>,
    name: Option<&str>,
    state: Option<TaskState>,
    newest: bool,
) -> String {
    let mut parts = Vec::new();
    if let Some(q) = queue {
        parts.push(format!("queue={}", url(q)));
    }
    if let Some(n) = name {
        parts.push(format!("name={}", url(n)));
    }
    if let Some(s) = state {
        parts.push(format!("state={s}"));
    }
    parts.push(format!(
        "order={}",
        if newest { "newest" } else { "oldest" }
    ));
    parts.join("&amp;")
}

pub(super) async fn task_list(
    State(st): State<AppState>,
    Extension(ctx): Extension<Ctx>,
    Query(q): Query<ListQuery>,
) -> Response {
    if let Some(id) = nonblank(&q.id) {
        return match id.trim_start_matches('#').parse::<u64>() {
            Ok(id) => see_other(&format!("{}tasks/{id}", ctx.root)),
            Err(_) => error_page(
                &ctx,
                StatusCode::BAD_REQUEST,
                &format!("not a task id: {id}"),
            ),
        };
    }
    let queue = nonblank(&q.queue);
    let name = nonblank(&q.name);
    let state = match parse_state(nonblank(&q.state)) {
        Ok(s) => s,
        Err(e) => return error_page(&ctx, StatusCode::BAD_REQUEST, &e),
    };
    let newest = nonblank(&q.order) != Some("oldest");
    let after = match nonblank(&q.after).map(str::parse::<u64>).transpose() {
        Ok(a) => a,
        Err(_) => return error_page(&ctx, StatusCode::BAD_REQUEST, "after: not a task id"),
    };
    let limit = match nonblank(&q.limit).map(str::parse::<u32>).transpose() {
        Ok(l) => l.unwrap_or(st.page_size).clamp(1, st.max_page_size),
        Err(_) => return error_page(&ctx, StatusCode::BAD_REQUEST, "limit: not a number"),
    };
    let filter = ListFilter {
        queue: queue.map(str::to_owned),
        state,
        name: name.map(str::to_owned),
        after_id: after.map(TaskId),
        limit: Some(limit + 1),
        newest_first: newest,
    };
    let mut tasks = match st.client.list(&filter).await {
        Ok(t) => t,
        Err(e) => return failure(&ctx, &e),
    };
    let more = tasks.len() > limit as usize;
    tasks.truncate(limit as usize);
    // The lost workers holding running tasks of this page (read only when it has some).
    let lost = match super::lost_workers(&st, &tasks).await {
        Ok(l) => l,
        Err(e) => return failure(&ctx, &e),
    };

    let root = esc(&ctx.root);
    let mut b = String::from("<h1>Tasks</h1>");
    // Filters (a GET form: the URL is the state of the page).
    let _ = write!(
        b,
        r#"<form method="get" action="{root}tasks" class="filters"><input name="queue" placeholder="queue" value="{}" aria-label="queue"><input name="name" placeholder="task name" value="{}" aria-label="task name"><select name="state" aria-label="state"><option value="">any state</option>"#,
        esc(queue.unwrap_or("")),
        esc(name.unwrap_or(""))
    );
    for s in TaskState::ALL {
        let sel = if state == Some(s) { " selected" } else { "" };
        let _ = write!(b, r#"<option value="{s}"{sel}>{s}</option>"#);
    }
    let (sel_new, sel_old) = if newest {
        (" selected", "")
    } else {
        ("", " selected")
    };
    let _ = write!(
        b,
        r#"</select><select name="order" aria-label="order"><option value="newest"{sel_new}>newest first</option><option value="oldest"{sel_old}>oldest first</option></select><button type="submit">Filter</button></form>"#
    );
    if !ctx.read_only {
        let mut bulk = String::new();
        let common = format!(
            "queue={}&amp;name={}",
            url(queue.unwrap_or("")),
            url(name.unwrap_or(""))
        );
        if matches!(state, Some(TaskState::Dead)) {
            let _ = write!(
                bulk,
                r#"<a href="{root}bulk?action=retry&amp;{common}">Retry all matching dead tasks…</a> "#
            );
        }
        if matches!(
            state,
            None | Some(TaskState::Pending) | Some(TaskState::Running)
        ) {
            let st = state.map_or(String::new(), |s| s.to_string());
            let _ = write!(
                bulk,
                r#"<a href="{root}bulk?action=cancel&amp;{common}&amp;state={st}">Cancel all matching tasks…</a>"#
            );
        }
        if !bulk.is_empty() {
            let _ = write!(b, "<p>{bulk}</p>");
        }
    }
    if tasks.is_empty() {
        b.push_str("<p>No matching tasks.</p>");
    } else {
        if !ctx.read_only {
            let _ = write!(
                b,
                r#"<form method="post" action="{root}tasks/selected" id="select-many">{}"#,
                crate::html::csrf_field(&ctx)
            );
        }
        let check_th = if ctx.read_only { "" } else { "<th>✓</th>" };
        let _ = write!(
            b,
            "<table id=\"tasks\"><tr>{check_th}<th>ID</th><th>Queue</th><th>Name</th><th>State</th><th>Attempt</th><th>Run at</th><th>Created</th><th>Finished</th><th>Last error</th></tr>"
        );
        for t in &tasks {
            if !ctx.read_only {
                let _ = write!(
                    b,
                    r#"<tr><td><input type="checkbox" name="id" value="{}" aria-label="select task {}"></td>"#,
                    t.id, t.id
                );
            } else {
                b.push_str("<tr>");
            }
            let _ = write!(
                b,
                r#"<td><a href="{root}tasks/{id}">{id}</a></td><td>{}</td><td>{}</td><td class="{}">{}{}</td><td class="n">{}/{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>"#,
                esc(&t.queue),
                esc(&t.name),
                state_class(t.state),
                t.state,
                super::lost_mark(t, &lost),
                t.attempt,
                t.max_attempts,
                time(&t.run_at),
                time(&t.created_at),
                t.finished_at.as_ref().map_or_else(|| "—".into(), time),
                truncate(t.last_error.as_deref().unwrap_or(""), 120),
                id = t.id,
            );
        }
        b.push_str("</table>");
        if !ctx.read_only {
            b.push_str(r#"<p>With the checked tasks: <button type="submit" name="action" value="run_now">Run now</button> <button type="submit" name="action" value="retry">Retry</button> <button type="submit" name="action" value="cancel" class="danger">Cancel</button> <button type="submit" name="action" value="delete" class="danger">Delete</button> (one audited action per task; each says what happened)</p></form>"#);
        }
    }
    let base = list_query(queue, name, state, newest);
    let _ = write!(
        b,
        r#"<p class="pager"><a href="{root}tasks?{base}">First page</a>"#
    );
    if let (true, Some(last)) = (more, tasks.last()) {
        let _ = write!(
            b,
            r#" · <a rel="next" href="{root}tasks?{base}&amp;after={}&amp;limit={limit}">Next page →</a>"#,
            last.id
        );
    }
    b.push_str("</p>");
    respond(StatusCode::OK, page(&ctx, "Tasks", &b, None))
}
