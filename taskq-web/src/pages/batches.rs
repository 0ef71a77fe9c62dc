//! The batch pages: the list of batches (newest first, with their progress), a batch's page
//! (its counters, its callbacks, a page of its members), and its actions (unless the dashboard
//! is read-only): cancel the batch (audited with the page's actor), seal an open one.

use std::fmt::Write as _;

use axum::Extension;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::Response;
use serde::Deserialize;
use taskq::batch::{BatchId, BatchInfo, BatchState};
use taskq::{Error, TaskId, TaskState};

use super::{failure, nonblank, see_other, state_class};
use crate::AppState;
use crate::auth::FLASH_MARK;
use crate::batches::{BatchAction, BatchDone};
use crate::ctx::Ctx;
use crate::html::{button, error_page, esc, opt_when, page, respond, url, when};

#[derive(Deserialize, Default)]
pub(super) struct BatchesQuery {
    name: Option<String>,
    before: Option<String>,
    limit: Option<String>,
}

#[derive(Deserialize, Default)]
pub(super) struct MembersQuery {
    after: Option<String>,
    limit: Option<String>,
}

/// A batch's state as a highlighted word.
fn state_badge(s: BatchState) -> String {
    format!(r#"<span class="wf-{s}">{s}</span>"#)
}

/// The progress of a batch, from its counters: a bar (succeeded, failed; the rest, pending,
/// is the bar's grey; 120 px for all of them) and `3/5 ended`.
fn progress(b: &BatchInfo) -> String {
    let total = b.total.max(1);
    let mut bar = String::from(r#"<span class="wf-bar">"#);
    for (n, class) in [(b.succeeded, ""), (b.failed, "dead")] {
        if n > 0 {
            let _ = write!(
                bar,
                r#"<span class="bar {class}" style="width:{}px"></span>"#,
                (n * 120).div_ceil(total)
            );
        }
    }
    bar.push_str("</span>");
    format!("{bar} {}/{} ended", b.succeeded + b.failed, b.total)
}

/// A batch's counters, in order.
fn counters(b: &BatchInfo) -> [(&'static str, u64); 4] {
    [
        ("total", b.total),
        ("succeeded", b.succeeded),
        ("failed", b.failed),
        ("pending", b.pending),
    ]
}

/// `GET /batches`: a page of batches, newest first, optionally of one name.
pub(super) async fn batches(
    State(st): State<AppState>,
    Extension(ctx): Extension<Ctx>,
    Query(q): Query<BatchesQuery>,
) -> Response {
    let name = nonblank(&q.name);
    let before = match nonblank(&q.before).map(str::parse::<u64>).transpose() {
        Ok(b) => b,
        Err(_) => return error_page(&ctx, StatusCode::BAD_REQUEST, "before: not a batch id"),
    };
    let limit = match nonblank(&q.limit).map(str::parse::<u32>).transpose() {
        Ok(l) => l.unwrap_or(st.page_size).clamp(1, st.max_page_size),
        Err(_) => return error_page(&ctx, StatusCode::BAD_REQUEST, "limit: not a number"),
    };
    let (rows, next, now) = match tokio::try_join!(
        crate::batches::page(&st, name, before, limit),
        st.client.db_now()
    ) {
        Ok(((rows, next), now)) => (rows, next, now),
        Err(e) => return failure(&ctx, &e),
    };
    let root = esc(&ctx.root);
    let mut b = String::from(
        "<h1>Batches</h1><p>Groups of tasks with callbacks, newest first. A batch is <b>open</b> until it is sealed (members may still be added), <b>running</b> while a member has not ended, then <b>succeeded</b> (every member succeeded: its <code>on_success</code> callback is due), <b>failed</b> (some member did not succeed) or <b>canceled</b> (by an operator); its <code>on_complete</code> callback is due once every member of a sealed batch has ended. The counters are the batch's own.</p>",
    );
    let _ = write!(
        b,
        r#"<form method="get" action="{root}batches" class="filters"><input name="name" placeholder="batch name" value="{}" aria-label="batch name"><button type="submit">Filter</button></form>"#,
        esc(name.unwrap_or(""))
    );
    if rows.is_empty() {
        b.push_str(r#"<p id="none">No batches.</p>"#);
    } else {
        b.push_str(r#"<table id="batches"><tr><th>ID</th><th>Name</th><th>Created</th><th>State</th><th>Progress</th><th>total</th><th>succeeded</th><th>failed</th><th>pending</th></tr>"#);
        for w in &rows {
            let _ = write!(
                b,
                r#"<tr data-id="{id}" data-state="{}"><td><a href="{root}batches/{id}">{id}</a></td><td><a href="{root}batches/{id}">{}</a></td><td class="nw">{}</td><td>{}</td><td class="nw">{}</td>"#,
                w.state,
                esc(&w.name),
                when(&w.created_at, &now),
                state_badge(w.state),
                progress(w),
                id = w.id,
            );
            for (k, n) in counters(w) {
                let class = match k {
                    "succeeded" if n > 0 => "state-succeeded",
                    "failed" if n > 0 => "state-dead",
                    _ => "",
                };
                let _ = write!(b, r#"<td class="n {class}" data-count="{k}">{n}</td>"#);
            }
            b.push_str("</tr>");
        }
        b.push_str("</table>");
    }
    let base = name.map_or(String::new(), |n| format!("name={}&amp;", url(n)));
    let _ = write!(
        b,
        r#"<p class="pager"><a href="{root}batches?{base}">First page</a>"#
    );
    if let Some(n) = next {
        let _ = write!(
            b,
            r#" · <a rel="next" href="{root}batches?{base}before={n}&amp;limit={limit}">Next page →</a>"#
        );
    }
    b.push_str("</p>");
    respond(StatusCode::OK, page(&ctx, "Batches", &b, None))
}

/// A callback's task state: `None` when its task was deleted (or pruned).
async fn callback_state(st: &AppState, id: Option<TaskId>) -> Result<Option<TaskState>, Error> {
    let Some(id) = id else { return Ok(None) };
    match st.client.get(id).await {
        Ok(t) => Ok(Some(t.state)),
        Err(Error::NotFound(_)) => Ok(None),
        Err(e) => Err(e),
    }
}

/// A task's state as a cell: its state, or `deleted` when the task is gone.
fn state_cell(s: Option<TaskState>) -> String {
    match s {
        Some(s) => format!(r#"<td class="{}">{s}</td>"#, state_class(s)),
        None => "<td>deleted</td>".to_owned(),
    }
}

/// `GET /batches/{id}?after=&limit=`: the batch, its actions, its callbacks and a page of its
/// members.
pub(super) async fn batch_page(
    State(st): State<AppState>,
    Extension(ctx): Extension<Ctx>,
    Path(id): Path<u64>,
    Query(q): Query<MembersQuery>,
) -> Response {
    let bid = BatchId(id);
    let after = match nonblank(&q.after).map(str::parse::<u64>).transpose() {
        Ok(a) => a,
        Err(_) => return error_page(&ctx, StatusCode::BAD_REQUEST, "after: not a task id"),
    };
    let limit = match nonblank(&q.limit).map(str::parse::<u32>).transpose() {
        Ok(l) => l.unwrap_or(st.page_size).clamp(1, st.max_page_size),
        Err(_) => return error_page(&ctx, StatusCode::BAD_REQUEST, "limit: not a number"),
    };
    let (w, (members, next), now) = match tokio::try_join!(
        st.client.batch(bid),
        crate::batches::members(&st, bid, after, limit),
        st.client.db_now()
    ) {
        Ok(v) => v,
        Err(e) => return failure(&ctx, &e),
    };
    let (on_success, on_complete) = match tokio::try_join!(
        callback_state(&st, w.on_success),
        callback_state(&st, w.on_complete)
    ) {
        Ok(v) => v,
        Err(e) => return failure(&ctx, &e),
    };
    let root = esc(&ctx.root);
    let mut b = format!(r#"<h1>Batch {} {}</h1>"#, w.id, state_badge(w.state));
    // The confirmation of the action that redirected here, meant for this batch: shown once.
    let done = ctx
        .flash
        .as_deref()
        .and_then(|f| f.split_once('.'))
        .filter(|(_, for_id)| *for_id == id.to_string())
        .map(|(what, _)| what);
    let flash = match done {
        Some("batch_canceled") => Some(
            "Canceled: its waiting and pending members and its callbacks that had not started are canceled, and its running members were asked to stop.",
        ),
        Some("batch_sealed") => Some(
            "Sealed: no member will be added but by a member, and its callbacks are released once every member has ended.",
        ),
        _ => None,
    };
    if let Some(f) = flash {
        let _ = write!(b, r#"<p class="flash" id="batch-done">{f}</p>"#);
    }
    if !ctx.read_only {
        let mut actions = String::new();
        if !w.state.is_ended() && w.canceled_at.is_none() {
            actions.push_str(&button(
                &ctx,
                &format!("batches/{id}/cancel"),
                &[],
                "Cancel batch",
                "danger",
            ));
        }
        if w.state == BatchState::Open {
            actions.push_str(&button(
                &ctx,
                &format!("batches/{id}/seal"),
                &[],
                "Seal batch",
                "",
            ));
        }
        if !actions.is_empty() {
            let _ = write!(b, r#"<p id="actions">{actions}</p>"#);
        }
    }
    summary(&mut b, &w, &now);
    b.push_str(r#"<h2>Callbacks</h2><table id="callbacks"><tr><th>Callback</th><th>Task</th><th>State</th><th>Released</th></tr>"#);
    for (what, task, state, released) in [
        ("on_success", w.on_success, on_success, &w.succeeded_at),
        ("on_complete", w.on_complete, on_complete, &w.completed_at),
    ] {
        let Some(task) = task else { continue };
        let _ = write!(
            b,
            r#"<tr data-callback="{what}"><td>{what}</td><td><a href="{root}tasks/{task}">{task}</a></td>{}<td class="nw">{}</td></tr>"#,
            state_cell(state),
            opt_when(released, &now),
        );
    }
    b.push_str("</table>");
    if w.on_success.is_none() && w.on_complete.is_none() {
        b.push_str(r#"<p id="no-callbacks">No callbacks.</p>"#);
    }
    b.push_str(r#"<h2>Members</h2><table id="members"><tr><th>Task</th><th>Task name</th><th>Queue</th><th>State</th></tr>"#);
    for m in &members {
        let _ = write!(
            b,
            r#"<tr data-task="{id}" data-state="{}"><td><a href="{root}tasks/{id}">{id}</a></td><td>{}</td><td><a href="{root}tasks?queue={}">{}</a></td>{}</tr>"#,
            m.state.map_or("deleted", TaskState::as_str),
            esc(&m.name),
            url(&m.queue),
            esc(&m.queue),
            state_cell(m.state),
            id = m.task_id,
        );
    }
    b.push_str("</table>");
    if members.is_empty() {
        b.push_str(r#"<p id="no-members">No members on this page.</p>"#);
    }
    let _ = write!(
        b,
        r#"<p class="pager"><a href="{root}batches/{id}">First page</a>"#
    );
    if let Some(n) = next {
        let _ = write!(
            b,
            r#" · <a rel="next" href="{root}batches/{id}?after={n}&amp;limit={limit}">Next page →</a>"#
        );
    }
    b.push_str("</p>");
    let _ = write!(
        b,
        r#"<p>The counters are the batch row's: a member's end is counted when it is written back (or by the reaper's sweep), so <b>pending</b> may include a member that has just ended. A member whose task was deleted shows <b>deleted</b>, and counts as failed once the sweep has counted it. <b>Cancel batch</b> cancels its waiting and pending members and its callbacks that have not started, and asks its running members to stop; <b>Seal batch</b> ends an open batch's additions (a seal is not in the audit trail; a cancel is). Operator actions are in the <a href="{root}audit">audit trail</a>.</p>"#
    );
    let mut r = respond(
        StatusCode::OK,
        page(&ctx, &format!("Batch {}", w.id), &b, None),
    );
    if done.is_some() {
        r.headers_mut()
            .insert(FLASH_MARK, HeaderValue::from_static(""));
    }
    r
}

/// The batch's fields and its counters.
fn summary(b: &mut String, w: &BatchInfo, now: &chrono::DateTime<chrono::Utc>) {
    b.push_str("<dl>");
    let mut row = |k: &str, v: String| {
        let _ = write!(b, "<dt>{k}</dt><dd>{v}</dd>");
    };
    row("Name", esc(&w.name));
    row("State", w.state.to_string());
    row("Sealed", if w.sealed { "yes" } else { "no" }.to_owned());
    row("Created", opt_when(&Some(w.created_at), now));
    row("Completed", opt_when(&w.completed_at, now));
    row("Succeeded", opt_when(&w.succeeded_at, now));
    row("Canceled", opt_when(&w.canceled_at, now));
    row("Progress", progress(w));
    b.push_str("</dl>");
    b.push_str(r#"<table id="counts"><tr>"#);
    for (k, _) in counters(w) {
        let _ = write!(b, "<th>{k}</th>");
    }
    b.push_str("</tr><tr>");
    for (k, n) in counters(w) {
        let _ = write!(b, r#"<td class="n" data-count="{k}">{n}</td>"#);
    }
    b.push_str("</tr></table>");
}

pub(super) async fn batch_cancel(
    State(st): State<AppState>,
    Extension(ctx): Extension<Ctx>,
    Path(id): Path<u64>,
) -> Response {
    action(&st, &ctx, id, BatchAction::Cancel).await
}

pub(super) async fn batch_seal(
    State(st): State<AppState>,
    Extension(ctx): Extension<Ctx>,
    Path(id): Path<u64>,
) -> Response {
    action(&st, &ctx, id, BatchAction::Seal).await
}

/// Applies `what` to batch `id` as the page's actor; a `303 See Other` to the batch's page
/// with the confirmation, or an error page.
async fn action(st: &AppState, ctx: &Ctx, id: u64, what: BatchAction) -> Response {
    let c = st.client.clone().with_actor(ctx.actor.clone());
    let flash = match what.apply(&c, BatchId(id)).await {
        Ok(BatchDone::Canceled { .. }) => "batch_canceled",
        Ok(BatchDone::Sealed) => "batch_sealed",
        Err(e) => return failure(ctx, &e),
    };
    st.terminal.invalidate().await;
    let mut r = see_other(&format!("{}batches/{id}", ctx.root));
    if let Ok(v) = HeaderValue::from_str(&format!("{flash}.{id}")) {
        r.headers_mut().insert(FLASH_MARK, v);
    }
    r
}
