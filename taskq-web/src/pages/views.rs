//! The operator's views beyond the task list: scheduled tasks (pending, due later, never
//! attempted), retrying tasks (pending after a failed attempt), the cron schedules, the audit
//! trail, and the task names no live worker handles.

use std::fmt::Write as _;

use axum::Extension;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde::Deserialize;
use taskq::TaskId;
use taskq::client::{AuditFilter, PendingKind};

use super::{failure, lost_mark, lost_workers, nonblank};
use crate::AppState;
use crate::ctx::Ctx;
use crate::html::{age, error_page, esc, page, respond, time, truncate, url, when};
use crate::views::{PendingCursor, schedule_views};

#[derive(Deserialize, Default)]
pub(super) struct PendingQuery {
    queue: Option<String>,
    after: Option<String>,
    limit: Option<String>,
}

pub(super) async fn scheduled(
    State(st): State<AppState>,
    Extension(ctx): Extension<Ctx>,
    Query(q): Query<PendingQuery>,
) -> Response {
    pending_page(st, ctx, q, PendingKind::Scheduled).await
}

pub(super) async fn retrying(
    State(st): State<AppState>,
    Extension(ctx): Extension<Ctx>,
    Query(q): Query<PendingQuery>,
) -> Response {
    pending_page(st, ctx, q, PendingKind::Retrying).await
}

async fn pending_page(st: AppState, ctx: Ctx, q: PendingQuery, kind: PendingKind) -> Response {
    let queue = nonblank(&q.queue);
    let after = match nonblank(&q.after)
        .map(str::parse::<PendingCursor>)
        .transpose()
    {
        Ok(a) => a,
        Err(e) => return error_page(&ctx, StatusCode::BAD_REQUEST, &e),
    };
    let limit = match nonblank(&q.limit).map(str::parse::<u32>).transpose() {
        Ok(l) => l.unwrap_or(st.page_size).clamp(1, st.max_page_size),
        Err(_) => return error_page(&ctx, StatusCode::BAD_REQUEST, "limit: not a number"),
    };
    let (page_rows, now) = match tokio::try_join!(
        crate::views::pending(&st, kind, queue, after, limit),
        st.client.db_now()
    ) {
        Ok(v) => v,
        Err(e) => return failure(&ctx, &e),
    };
    let (tasks, next) = page_rows;
    let root = esc(&ctx.root);
    let (title, path, what) = match kind {
        PendingKind::Scheduled => (
            "Scheduled",
            "scheduled",
            "Pending tasks due later (enqueued with a delay or a <code>run_at</code>, snoozed, rescheduled, or waiting for their next attempt after a failed one: those show their attempt count and are under Retrying too), soonest first.",
        ),
        PendingKind::Retrying => (
            "Retrying",
            "retrying",
            "Pending tasks with at least one failed attempt, waiting for their next one (due now or later), soonest first.",
        ),
    };
    let mut b = format!("<h1>{title}</h1><p>{what}</p>");
    let _ = write!(
        b,
        r#"<form method="get" action="{root}{path}" class="filters"><input name="queue" placeholder="queue" value="{}" aria-label="queue"><button type="submit">Filter</button></form>"#,
        esc(queue.unwrap_or(""))
    );
    if tasks.is_empty() {
        b.push_str(r#"<p id="none">No matching tasks.</p>"#);
    } else {
        let lost = match lost_workers(&st, &tasks).await {
            Ok(l) => l,
            Err(e) => return failure(&ctx, &e),
        };
        let _ = write!(
            b,
            r#"<table id="{path}"><tr><th>ID</th><th>Queue</th><th>Name</th><th>Due</th><th>Attempt</th><th>Priority</th><th>Created</th><th>Last error</th></tr>"#
        );
        for t in &tasks {
            let _ = write!(
                b,
                r#"<tr><td><a href="{root}tasks/{id}">{id}</a>{}</td><td>{}</td><td>{}</td><td>{}</td><td class="n">{}/{}</td><td class="n">{}</td><td>{}</td><td>{}</td></tr>"#,
                lost_mark(t, &lost),
                esc(&t.queue),
                esc(&t.name),
                when(&t.run_at, &now),
                t.attempt,
                t.max_attempts,
                t.priority,
                when(&t.created_at, &now),
                truncate(t.last_error.as_deref().unwrap_or(""), 120),
                id = t.id,
            );
        }
        b.push_str("</table>");
    }
    let qpart = queue.map_or(String::new(), |q| format!("queue={}&amp;", url(q)));
    let _ = write!(
        b,
        r#"<p class="pager"><a href="{root}{path}?{qpart}">First page</a>"#
    );
    if let Some(n) = next {
        let _ = write!(
            b,
            r#" · <a rel="next" href="{root}{path}?{qpart}after={n}&amp;limit={limit}">Next page →</a>"#
        );
    }
    b.push_str("</p>");
    respond(StatusCode::OK, page(&ctx, title, &b, None))
}

pub(super) async fn schedules(
    State(st): State<AppState>,
    Extension(ctx): Extension<Ctx>,
) -> Response {
    let (now, rows) = match schedule_views(&st).await {
        Ok(v) => v,
        Err(e) => return failure(&ctx, &e),
    };
    let root = esc(&ctx.root);
    let mut b = format!(
        "<h1>Schedules</h1><p>Recurring (cron) schedules, as the workers that declare them recorded them. Database clock: {}. A schedule is <b>overdue</b> when its next fire is more than the missed-tick grace ({} s) past: no running worker fires it. <b>paused</b> means its queue is paused: ticks are still enqueued, but no task of the queue starts until it is resumed.</p>",
        time(&now),
        taskq::limits::MISSED_TICK_GRACE.as_secs()
    );
    if rows.is_empty() {
        b.push_str(r#"<p id="none">No schedules (workers record theirs when they start).</p>"#);
    } else {
        b.push_str(r#"<table id="schedules"><tr><th>Name</th><th>Queue</th><th>Task</th><th>Expression</th><th>Zone</th><th>Missed ticks</th><th>Last fire</th><th>Next fire</th><th>Status</th></tr>"#);
        for v in &rows {
            let s = &v.info;
            let status = match (v.paused, v.overdue) {
                (true, true) => {
                    r#"<span class="badge paused">paused</span> <span class="lost">overdue</span>"#
                }
                (true, false) => r#"<span class="badge paused">paused</span>"#,
                (false, true) => r#"<span class="lost">overdue</span>"#,
                (false, false) => "active",
            };
            let _ = write!(
                b,
                r#"<tr data-schedule="{}"><td>{}</td><td><a href="{root}tasks?queue={}">{}</a></td><td><a href="{root}tasks?name={}">{}</a></td><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{status}</td></tr>"#,
                esc(&s.name),
                esc(&s.name),
                url(&s.queue),
                esc(&s.queue),
                url(&s.task_name),
                esc(&s.task_name),
                esc(&s.expression),
                esc(&s.timezone),
                esc(&s.missed_ticks),
                s.last_tick
                    .as_ref()
                    .map_or_else(|| "—".into(), |t| when(t, &now)),
                s.next_tick
                    .as_ref()
                    .map_or_else(|| "—".into(), |t| when(t, &now)),
            );
        }
        b.push_str("</table>");
    }
    respond(StatusCode::OK, page(&ctx, "Schedules", &b, None))
}

#[derive(Deserialize, Default)]
pub(super) struct AuditQuery {
    queue: Option<String>,
    task: Option<String>,
    before: Option<String>,
    limit: Option<String>,
}

pub(super) async fn audit(
    State(st): State<AppState>,
    Extension(ctx): Extension<Ctx>,
    Query(q): Query<AuditQuery>,
) -> Response {
    let queue = nonblank(&q.queue);
    let parse = |v: &Option<String>, what: &str| {
        nonblank(v)
            .map(|s| s.trim_start_matches('#').parse::<u64>())
            .transpose()
            .map_err(|_| format!("{what}: not a number"))
    };
    let (task, before, limit) = match (
        parse(&q.task, "task"),
        parse(&q.before, "before"),
        parse(&q.limit, "limit"),
    ) {
        (Ok(t), Ok(b), Ok(l)) => (t, b, l),
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => {
            return error_page(&ctx, StatusCode::BAD_REQUEST, &e);
        }
    };
    let limit = limit
        .map_or(st.page_size, |l| l.min(u64::from(st.max_page_size)) as u32)
        .max(1);
    let filter = AuditFilter {
        task: task.map(TaskId),
        queue: queue.map(str::to_owned),
        before_id: before,
        limit: Some(limit + 1),
    };
    let (mut rows, now) = match tokio::try_join!(st.client.audit(&filter), st.client.db_now()) {
        Ok(v) => v,
        Err(e) => return failure(&ctx, &e),
    };
    let more = rows.len() > limit as usize;
    rows.truncate(limit as usize);
    let root = esc(&ctx.root);
    let mut b = String::from(
        "<h1>Audit trail</h1><p>Every change made by an operator (dashboard, API, CLI, or a <code>Client</code> with an actor), newest first, recorded in the transaction of the change.</p>",
    );
    let _ = write!(
        b,
        r#"<form method="get" action="{root}audit" class="filters"><input name="queue" placeholder="queue" value="{}" aria-label="queue"><input name="task" placeholder="task id" value="{}" aria-label="task id"><button type="submit">Filter</button></form>"#,
        esc(queue.unwrap_or("")),
        task.map_or(String::new(), |t| t.to_string())
    );
    if rows.is_empty() {
        b.push_str(r#"<p id="none">No entries.</p>"#);
    } else {
        b.push_str(r#"<table id="audit"><tr><th>#</th><th>When</th><th>Who</th><th>What</th><th>Task</th><th>Queue</th><th>Detail</th></tr>"#);
        for e in &rows {
            let task = e.task_id.map_or_else(
                || "—".into(),
                |t| format!(r#"<a href="{root}tasks/{t}">{t}</a>"#),
            );
            let _ = write!(
                b,
                r#"<tr data-action="{}"><td class="n">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{task}</td><td>{}</td><td>{}</td></tr>"#,
                esc(&e.action),
                e.id,
                when(&e.at, &now),
                esc(&e.actor),
                esc(&e.action),
                esc(e.queue.as_deref().unwrap_or("—")),
                if e.detail.is_null() {
                    String::new()
                } else {
                    truncate(&e.detail.to_string(), 300)
                }
            );
        }
        b.push_str("</table>");
    }
    let mut base = String::new();
    if let Some(q) = queue {
        let _ = write!(base, "queue={}&amp;", url(q));
    }
    if let Some(t) = task {
        let _ = write!(base, "task={t}&amp;");
    }
    let _ = write!(
        b,
        r#"<p class="pager"><a href="{root}audit?{base}">First page</a>"#
    );
    if let (true, Some(last)) = (more, rows.last()) {
        let _ = write!(
            b,
            r#" · <a rel="next" href="{root}audit?{base}before={}&amp;limit={limit}">Next page →</a>"#,
            last.id
        );
    }
    b.push_str("</p>");
    respond(StatusCode::OK, page(&ctx, "Audit trail", &b, None))
}

pub(super) async fn unhandled(
    State(st): State<AppState>,
    Extension(ctx): Extension<Ctx>,
) -> Response {
    let (u, workers) = match tokio::try_join!(crate::stats::unhandled(&st), st.client.workers()) {
        Ok(v) => v,
        Err(e) => return failure(&ctx, &e),
    };
    let root = esc(&ctx.root);
    let mut b = format!(
        "<h1>Tasks no live worker handles</h1><p>Due pending tasks, per queue and task name, that no alive worker would claim: none works the queue <i>and</i> registers the name (a lost or stopped worker does not count). They stay pending until such a worker runs, or until they are canceled. Counted at {} (reused for up to {} s).</p>",
        when(&u.at, &u.at),
        st.terminal_max_age.as_secs()
    );
    if u.rows.is_empty() {
        b.push_str(r#"<p id="none">None: every due task has a live worker that handles it.</p>"#);
    } else {
        b.push_str(r#"<table id="unhandled"><tr><th>Queue</th><th>Task</th><th>Due</th><th>Pending</th><th>Due for</th><th>Alive workers of the queue</th></tr>"#);
        for p in &u.rows {
            let alive: Vec<String> = workers
                .iter()
                .filter(|w| w.alive && w.queues.contains_key(&p.queue))
                .map(|w| esc(&w.id))
                .collect();
            let _ = write!(
                b,
                r#"<tr data-name="{}"><td><a href="{root}tasks?queue={}">{}</a></td><td><a href="{root}tasks?queue={}&amp;name={}&amp;state=pending">{}</a></td><td class="n">{}</td><td class="n">{}</td><td>{}</td><td>{}</td></tr>"#,
                esc(&p.name),
                url(&p.queue),
                esc(&p.queue),
                url(&p.queue),
                url(&p.name),
                esc(&p.name),
                p.due,
                p.pending,
                age((u.at - p.oldest_run_at).num_seconds()),
                if alive.is_empty() {
                    "none".to_owned()
                } else {
                    format!("{} (not registering this name)", alive.join(", "))
                }
            );
        }
        b.push_str("</table>");
    }
    respond(StatusCode::OK, page(&ctx, "Unhandled", &b, None))
}
