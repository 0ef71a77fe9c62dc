//! The HTML pages and their form actions.

use std::fmt::Write as _;
use std::time::Duration;

use axum::Extension;
use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use serde::Deserialize;
use taskq::client::{
    AuditFilter, BulkFilter, Canceled, ListFilter, TaskInfo, WorkerInfo, WorkerStatus,
};
use taskq::{Error, TaskId, TaskState};

use crate::AppState;
use crate::auth::{Ctx, FLASH_MARK, SESSION_MARK};
use crate::html::{
    age, button, csrf_field, error_page, esc, opt_time, page, respond, time, time_us, truncate, url,
};

/// The page routes (the guard is added by the caller).
pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/", get(overview))
        .route("/tasks", get(task_list))
        .route("/tasks/{id}", get(task_page))
        .route("/tasks/{id}/retry", post(task_retry))
        .route("/tasks/{id}/cancel", post(task_cancel))
        .route("/queues/pause", post(queue_pause))
        .route("/queues/resume", post(queue_resume))
        .route("/bulk", get(bulk_confirm).post(bulk_run))
        .route("/login", get(login_get).post(login_post))
        .route("/logout", post(logout))
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
        Error::NotFound(_) => StatusCode::NOT_FOUND,
        Error::WrongState { .. } | Error::UniqueHeld { .. } => StatusCode::CONFLICT,
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

fn state_class(s: TaskState) -> String {
    format!("state-{}", s.as_str())
}

// ----------------------------------------------------------------------------- overview

#[derive(Deserialize, Default)]
struct OverviewQuery {
    refresh: Option<String>,
}

async fn overview(
    State(st): State<AppState>,
    Extension(ctx): Extension<Ctx>,
    Query(q): Query<OverviewQuery>,
) -> Response {
    let minutes = st.throughput_minutes;
    let (stats, workers, unhandled) = match tokio::try_join!(
        crate::stats::load(&st),
        st.client.workers(),
        crate::stats::unhandled(&st)
    ) {
        Ok(v) => v,
        Err(e) => return failure(&ctx, &e),
    };
    let now = stats.now;
    let queues = &stats.queues;
    let root = esc(&ctx.root);
    let home = esc(&ctx.home);
    let refresh =
        (st.refresh_secs > 0 && nonblank(&q.refresh) != Some("0")).then_some(st.refresh_secs);
    let mut b = String::new();
    let _ = write!(b, "<h1>Overview</h1><p>Database clock: {} · ", time(&now));
    match refresh {
        Some(secs) => {
            let _ = write!(
                b,
                r#"refreshes every {secs} s · <a href="{home}?refresh=0">stop refreshing</a></p>"#
            );
        }
        None if st.refresh_secs > 0 => {
            let _ = write!(b, r#"<a href="{home}">refresh automatically</a></p>"#);
        }
        None => b.push_str("</p>"),
    }

    // Queues × states.
    b.push_str("<h2>Queues</h2><table id=\"queues\"><tr><th>Queue</th>");
    for s in TaskState::ALL {
        let _ = write!(b, "<th>{s}</th>");
    }
    b.push_str("<th>Oldest pending</th><th>Limits</th><th>Status</th>");
    if !ctx.read_only {
        b.push_str("<th></th>");
    }
    b.push_str("</tr>");
    let mut totals = [0u64; 6];
    for (queue, row) in queues {
        let qe = esc(queue);
        let qu = url(queue);
        let _ = write!(
            b,
            r#"<tr data-queue="{qe}"><td><a href="{root}tasks?queue={qu}">{qe}</a></td>"#
        );
        for (i, s) in TaskState::ALL.into_iter().enumerate() {
            totals[i] += row.counts[i];
            let _ = write!(
                b,
                r#"<td class="n"><a href="{root}tasks?queue={qu}&amp;state={s}">{}</a></td>"#,
                row.counts[i]
            );
        }
        let oldest = match row.oldest_pending {
            Some(t) if t <= now => format!("due for {}", age((now - t).num_seconds())),
            Some(t) => format!("next due in {}", age((t - now).num_seconds())),
            None => "—".into(),
        };
        let _ = write!(b, "<td>{oldest}</td>");
        let mut limits = Vec::new();
        if let Some(n) = row.concurrency_limit {
            limits.push(format!(
                r#"<span class="limit-concurrency">at most {n} running</span>"#
            ));
        }
        if let Some(r) = &row.rate_limit {
            limits.push(format!(
                r#"<span class="limit-rate">{} ({} started in this window)</span>"#,
                crate::stats::rate_text(r),
                row.rate_used
            ));
        }
        if limits.is_empty() {
            b.push_str("<td>—</td>");
        } else {
            let _ = write!(b, "<td>{}</td>", limits.join("<br>"));
        }
        match row.paused_at {
            Some(at) => {
                let _ = write!(
                    b,
                    r#"<td><span class="badge paused">paused</span> since {}</td>"#,
                    time(&at)
                );
            }
            None => b.push_str("<td>active</td>"),
        }
        if !ctx.read_only {
            let action = if row.paused_at.is_some() {
                button(&ctx, "queues/resume", &[("queue", queue)], "Resume", "")
            } else {
                button(&ctx, "queues/pause", &[("queue", queue)], "Pause", "")
            };
            let _ = write!(b, "<td>{action}</td>");
        }
        b.push_str("</tr>");
    }
    b.push_str("<tr><th>all queues</th>");
    for (i, s) in TaskState::ALL.into_iter().enumerate() {
        let _ = write!(
            b,
            r#"<th class="n"><a href="{root}tasks?state={s}">{}</a></th>"#,
            totals[i]
        );
    }
    b.push_str("<th></th><th></th><th></th>");
    if !ctx.read_only {
        b.push_str("<th></th>");
    }
    b.push_str("</tr></table>");
    let _ = write!(
        b,
        r#"<p id="counts-note">Pending and running: exact, now. Succeeded, dead, canceled and expired: exact as of {} (recounted at most every {} s; tasks deleted by retention are not counted).</p>"#,
        time(&stats.terminal_at),
        st.terminal_max_age.as_secs()
    );

    // Throughput.
    let finished = [
        TaskState::Succeeded,
        TaskState::Dead,
        TaskState::Canceled,
        TaskState::Expired,
    ];
    let mut grid = vec![[0u64; 4]; minutes as usize];
    for p in &stats.finished {
        if let (Some(m), Some(i)) = (
            grid.get_mut(p.minutes_ago as usize),
            finished.iter().position(|s| *s == p.state),
        ) {
            m[i] = p.count;
        }
    }
    let failed = crate::stats::failed_grid(&stats.failed, minutes);
    let peak = grid
        .iter()
        .flatten()
        .chain(failed.iter().flatten())
        .copied()
        .max()
        .unwrap_or(0)
        .max(1);
    let _ = write!(
        b,
        "<h2>Per minute</h2><p>Last {minutes} minutes. Tasks finished, by <code>finished_at</code>; failed attempts (<code>failed</code>, <code>timed_out</code>, <code>panicked</code>) and lost leases (the worker stopped renewing; counted when the reaper took the task back), from the attempt histories. Tasks deleted by retention are not counted.</p><table id=\"throughput\"><tr><th>Minute</th>"
    );
    for s in finished {
        let _ = write!(b, "<th>{s}</th>");
    }
    b.push_str("<th>failed attempts</th><th>lease lost</th><th></th></tr>");
    for (ago, counts) in grid.iter().enumerate() {
        let label = if ago == 0 {
            "last 60 s".to_owned()
        } else {
            format!("{ago} min ago")
        };
        let _ = write!(b, "<tr><td>{label}</td>");
        for n in counts {
            let _ = write!(b, r#"<td class="n">{n}</td>"#);
        }
        let [fails, lost] = failed[ago];
        let _ = write!(
            b,
            r#"<td class="n failed">{fails}</td><td class="n lease-lost">{lost}</td>"#
        );
        let bar = |n: u64, class: &str| {
            format!(
                r#"<span class="bar {class}" style="width:{}px"></span>"#,
                n * 200 / peak
            )
        };
        let _ = write!(
            b,
            "<td>{}{}{}{}</td></tr>",
            bar(counts[0], ""),
            bar(counts[1], "dead"),
            bar(counts[2], "canceled"),
            bar(fails, "failed")
        );
    }
    b.push_str("</table>");

    // Due tasks no live worker handles.
    if !unhandled.rows.is_empty() {
        let _ = write!(
            b,
            r#"<h2>Tasks no live worker handles</h2><p class="error">No alive worker works these queues and registers these task names, so their due tasks stay pending. Run a worker that registers them, or cancel them. (Counted at {}.)</p><table id="unhandled"><tr><th>Queue</th><th>Task</th><th>Due</th><th>Due for</th></tr>"#,
            time(&unhandled.at)
        );
        for p in &unhandled.rows {
            let _ = write!(
                b,
                r#"<tr><td>{}</td><td><a href="{root}tasks?queue={}&amp;name={}&amp;state=pending">{}</a></td><td class="n">{}</td><td>{}</td></tr>"#,
                esc(&p.queue),
                url(&p.queue),
                url(&p.name),
                esc(&p.name),
                p.due,
                age((unhandled.at - p.oldest_run_at).num_seconds())
            );
        }
        b.push_str("</table>");
    }

    // Workers.
    b.push_str("<h2>Workers</h2>");
    if workers.is_empty() {
        b.push_str("<p>No worker recorded.</p>");
    } else {
        b.push_str("<table id=\"workers\"><tr><th>Worker</th><th>Host</th><th>PID</th><th>Queues</th><th>Running</th><th>Status</th><th>Last beat</th></tr>");
        for w in &workers {
            let queues: Vec<String> = w
                .queues
                .iter()
                .map(|(q, n)| format!("{}×{n}", esc(q)))
                .collect();
            let status = worker_status_cell(w);
            let _ = write!(
                b,
                r#"<tr data-worker="{}"><td>{}</td><td>{}</td><td class="n">{}</td><td>{}</td><td class="n">{}</td><td>{status}</td><td title="{}">{} ago</td></tr>"#,
                esc(&w.id),
                esc(&w.id),
                esc(&w.host),
                w.pid,
                queues.join(", "),
                w.running,
                time_us(&w.last_seen_at),
                age(w.last_seen_ago.as_secs() as i64)
            );
        }
        b.push_str("</table>");
        if workers.iter().any(|w| w.status == WorkerStatus::Lost) {
            b.push_str("<p>Lost: no heartbeat for two of its heartbeat intervals, and no goodbye (crashed, killed, hung or cut off from the database). Its running tasks stay claimed until their leases end, then return to pending.</p>");
        }
    }

    if !ctx.read_only {
        let _ = write!(
            b,
            r#"<h2>Bulk actions</h2><p>Each shows how many tasks match and asks for confirmation first.</p>
<form method="get" action="{root}bulk" class="filters">
<select name="action" aria-label="action"><option value="retry">Retry dead tasks</option><option value="cancel">Cancel pending/running tasks</option><option value="purge">Purge dead tasks (all queues)</option></select>
<input name="queue" placeholder="queue (any)" aria-label="queue"><input name="name" placeholder="task name (any)" aria-label="task name"><input name="older_than" placeholder="older than (e.g. 1h)" aria-label="older than">
<button type="submit">Review…</button></form>"#
        );
    }
    respond(StatusCode::OK, page(&ctx, "Overview", &b, refresh))
}

// ----------------------------------------------------------------------------- task list

#[derive(Deserialize, Default)]
struct ListQuery {
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

async fn task_list(
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
        b.push_str("<table id=\"tasks\"><tr><th>ID</th><th>Queue</th><th>Name</th><th>State</th><th>Attempt</th><th>Run at</th><th>Created</th><th>Finished</th><th>Last error</th></tr>");
        for t in &tasks {
            let _ = write!(
                b,
                r#"<tr><td><a href="{root}tasks/{id}">{id}</a></td><td>{}</td><td>{}</td><td class="{}">{}</td><td class="n">{}/{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>"#,
                esc(&t.queue),
                esc(&t.name),
                state_class(t.state),
                t.state,
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

// ----------------------------------------------------------------------------- task page

/// The payload as pretty JSON, or as (lossy) text when it is not JSON.
fn pretty_payload(t: &TaskInfo) -> String {
    match t.payload_json() {
        Ok(v) => serde_json::to_string_pretty(&v).unwrap_or_default(),
        Err(_) => String::from_utf8_lossy(&t.payload).into_owned(),
    }
}

async fn task_page(
    State(st): State<AppState>,
    Extension(ctx): Extension<Ctx>,
    Path(id): Path<u64>,
) -> Response {
    let t = match st.client.get(TaskId(id)).await {
        Ok(t) => t,
        Err(e) => return failure(&ctx, &e),
    };
    // The worker holding a running task, to say whether it is alive or lost.
    let holder = if t.state == TaskState::Running {
        match st.client.workers().await {
            Ok(ws) => ws.into_iter().find(|w| Some(&w.id) == t.worker_id.as_ref()),
            Err(e) => return failure(&ctx, &e),
        }
    } else {
        None
    };
    let root = esc(&ctx.root);
    let mut b = format!(
        r#"<h1>Task {} <span class="{}">{}</span></h1>"#,
        t.id,
        state_class(t.state),
        t.state
    );
    // The confirmation of the action that redirected here, meant for this task: shown once.
    let done = ctx
        .flash
        .as_deref()
        .and_then(|f| f.split_once('.'))
        .filter(|(_, for_id)| *for_id == id.to_string())
        .map(|(what, _)| what);
    let flash = match done {
        Some("retried") => Some("Moved back to pending."),
        Some("canceled") => Some("Canceled."),
        Some("cancel_requested") => {
            Some("Cancel requested: the worker stops the task at its next heartbeat at the latest.")
        }
        _ => None,
    };
    if let Some(f) = flash {
        let _ = write!(b, r#"<p class="flash">{f}</p>"#);
    }
    if !ctx.read_only {
        let mut actions = String::new();
        if t.state == TaskState::Dead {
            actions.push_str(&button(
                &ctx,
                &format!("tasks/{}/retry", t.id),
                &[],
                "Retry",
                "",
            ));
        }
        if matches!(t.state, TaskState::Pending | TaskState::Running) {
            actions.push_str(&button(
                &ctx,
                &format!("tasks/{}/cancel", t.id),
                &[],
                "Cancel",
                "danger",
            ));
        }
        if !actions.is_empty() {
            let _ = write!(b, "<p>{actions}</p>");
        }
    }
    b.push_str("<dl>");
    let mut row = |k: &str, v: String| {
        let _ = write!(b, "<dt>{k}</dt><dd>{v}</dd>");
    };
    row("Name", esc(&t.name));
    row(
        "Queue",
        format!(
            r#"<a href="{root}tasks?queue={}">{}</a>"#,
            url(&t.queue),
            esc(&t.queue)
        ),
    );
    row("State", t.state.to_string());
    if let Some(reason) = t.dead_reason() {
        row("Dead because", esc(&reason.to_string()));
    }
    row("Attempts", format!("{} of {}", t.attempt, t.max_attempts));
    row("Snoozes", t.snoozes.to_string());
    row("Priority", t.priority.to_string());
    row("Run at", time_us(&t.run_at));
    row("Created", time_us(&t.created_at));
    row("Updated", time_us(&t.updated_at));
    row("Finished", opt_time(&t.finished_at));
    row("Deadline", opt_time(&t.deadline));
    row("Lease until", opt_time(&t.lease_until));
    row("Lease epoch", t.lease_epoch.to_string());
    row(
        "Worker",
        match (&t.worker_id, &holder) {
            (Some(id), Some(w)) => format!("{} — {}", esc(id), worker_status_cell(w)),
            (Some(id), None) => esc(id),
            (None, _) => "—".into(),
        },
    );
    if let Some(w) = holder.filter(|w| w.status == WorkerStatus::Lost) {
        row(
            "Worker lost",
            format!(
                r#"<span id="worker-lost">worker lost: no heartbeat for {} (it beats every {}). The task stays claimed until its lease ends, then the reaper returns it to pending.</span>"#,
                age(w.last_seen_ago.as_secs() as i64),
                age(w.heartbeat.as_secs() as i64)
            ),
        );
    }
    row(
        "Idempotency key",
        esc(t.idempotency_key.as_deref().unwrap_or("—")),
    );
    row(
        "Unique identity",
        match &t.unique_key {
            Some(k) => format!(
                "{} ({})",
                esc(k),
                if t.unique_held { "held" } else { "not held" }
            ),
            None => "—".into(),
        },
    );
    row(
        "Trace context",
        esc(t.trace_context.as_deref().unwrap_or("—")),
    );
    b.push_str("</dl><p>Times are as stored: the database clock, UTC.</p>");
    let _ = write!(
        b,
        r#"<h2>Payload</h2><pre id="payload">{}</pre>"#,
        esc(&pretty_payload(&t))
    );
    b.push_str("<h2>Last error</h2>");
    match &t.last_error {
        Some(e) => {
            let _ = write!(b, r#"<pre id="last-error">{}</pre>"#, esc(e));
        }
        None => b.push_str("<p>None.</p>"),
    }
    let audit_filter = AuditFilter {
        task: Some(t.id),
        limit: Some(50),
        ..Default::default()
    };
    let (attempts, audit) = tokio::join!(st.client.attempts(t.id), st.client.audit(&audit_filter));
    b.push_str("<h2>Attempts</h2>");
    match attempts {
        Ok(a) if a.is_empty() => b.push_str("<p>No attempt has ended yet.</p>"),
        Ok(a) => {
            b.push_str(r#"<table id="attempts"><tr><th>Attempt</th><th>Epoch</th><th>Worker</th><th>Started</th><th>Ended</th><th>Duration</th><th>Outcome</th><th>Error</th></tr>"#);
            for at in &a {
                let _ = write!(
                    b,
                    r#"<tr><td class="n">{}</td><td class="n">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>"#,
                    at.attempt,
                    at.epoch,
                    esc(at.worker_id.as_deref().unwrap_or("—")),
                    opt_time(&at.started_at),
                    time_us(&at.finished_at),
                    at.duration()
                        .map_or_else(|| "—".into(), |d| format!("{:.3} s", d.as_secs_f64())),
                    esc(at.outcome.as_str()),
                    at.error
                        .as_deref()
                        .map_or_else(|| "—".into(), |e| format!("<pre>{}</pre>", esc(e)))
                );
            }
            b.push_str("</table>");
        }
        Err(e) => {
            let _ = write!(b, r#"<p class="error">{}</p>"#, esc(&e.to_string()));
        }
    }
    b.push_str("<h2>Operator actions</h2>");
    match audit {
        Ok(a) if a.is_empty() => b.push_str("<p>None recorded.</p>"),
        Ok(a) => {
            b.push_str(r#"<table id="audit"><tr><th>When</th><th>Who</th><th>What</th><th>Detail</th></tr>"#);
            for e in &a {
                let _ = write!(
                    b,
                    "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                    time_us(&e.at),
                    esc(&e.actor),
                    esc(&e.action),
                    esc(&if e.detail.is_null() {
                        String::new()
                    } else {
                        e.detail.to_string()
                    })
                );
            }
            b.push_str("</table>");
        }
        Err(e) => {
            let _ = write!(b, r#"<p class="error">{}</p>"#, esc(&e.to_string()));
        }
    }
    let mut r = respond(
        StatusCode::OK,
        page(&ctx, &format!("Task {}", t.id), &b, None),
    );
    if done.is_some() {
        r.headers_mut()
            .insert(FLASH_MARK, HeaderValue::from_static(""));
    }
    r
}

async fn task_retry(
    State(st): State<AppState>,
    Extension(ctx): Extension<Ctx>,
    Path(id): Path<u64>,
) -> Response {
    match st
        .client
        .clone()
        .with_actor(ctx.actor.clone())
        .retry_dead(TaskId(id))
        .await
    {
        Ok(()) => {
            st.terminal.invalidate().await;
            see_task_with_flash(&ctx, id, "retried")
        }
        Err(e) => failure(&ctx, &e),
    }
}

async fn task_cancel(
    State(st): State<AppState>,
    Extension(ctx): Extension<Ctx>,
    Path(id): Path<u64>,
) -> Response {
    match st
        .client
        .clone()
        .with_actor(ctx.actor.clone())
        .cancel(TaskId(id))
        .await
    {
        Ok(Canceled::Now) => {
            st.terminal.invalidate().await;
            see_task_with_flash(&ctx, id, "canceled")
        }
        Ok(Canceled::Requested) => see_task_with_flash(&ctx, id, "cancel_requested"),
        Err(e) => failure(&ctx, &e),
    }
}

// ----------------------------------------------------------------------------- queues

#[derive(Deserialize)]
struct QueueForm {
    queue: String,
}

async fn queue_pause(
    State(st): State<AppState>,
    Extension(ctx): Extension<Ctx>,
    axum::Form(f): axum::Form<QueueForm>,
) -> Response {
    match st
        .client
        .clone()
        .with_actor(ctx.actor.clone())
        .pause_queue(&f.queue)
        .await
    {
        Ok(()) => see_other(&ctx.home),
        Err(e) => failure(&ctx, &e),
    }
}

async fn queue_resume(
    State(st): State<AppState>,
    Extension(ctx): Extension<Ctx>,
    axum::Form(f): axum::Form<QueueForm>,
) -> Response {
    match st
        .client
        .clone()
        .with_actor(ctx.actor.clone())
        .resume_queue(&f.queue)
        .await
    {
        Ok(_) => see_other(&ctx.home),
        Err(e) => failure(&ctx, &e),
    }
}

// ----------------------------------------------------------------------------- bulk

#[derive(Deserialize, Default)]
struct BulkForm {
    action: Option<String>,
    queue: Option<String>,
    name: Option<String>,
    state: Option<String>,
    older_than: Option<String>,
}

enum BulkAction {
    Retry(BulkFilter),
    Cancel(BulkFilter),
    Purge(Duration),
}

impl BulkForm {
    fn parse(&self) -> Result<BulkAction, String> {
        let older = parse_age(nonblank(&self.older_than))?;
        let filter = BulkFilter {
            queue: nonblank(&self.queue).map(str::to_owned),
            name: nonblank(&self.name).map(str::to_owned),
            state: parse_state(nonblank(&self.state))?,
            older_than: (!older.is_zero()).then_some(older),
        };
        match nonblank(&self.action) {
            Some("retry") => Ok(BulkAction::Retry(filter)),
            Some("cancel") => Ok(BulkAction::Cancel(filter)),
            Some("purge") => {
                if filter.queue.is_some() || filter.name.is_some() {
                    return Err("purge deletes dead tasks of every queue and name: leave queue and name empty".into());
                }
                Ok(BulkAction::Purge(older))
            }
            _ => Err("action must be retry, cancel or purge".into()),
        }
    }

    /// The form's fields, to carry from the confirmation page to the POST.
    fn hidden(&self) -> Vec<(&'static str, String)> {
        [
            ("action", &self.action),
            ("queue", &self.queue),
            ("name", &self.name),
            ("state", &self.state),
            ("older_than", &self.older_than),
        ]
        .into_iter()
        .filter_map(|(k, v)| nonblank(v).map(|v| (k, v.to_owned())))
        .collect()
    }
}

/// "queue X, name Y, created more than 1h ago" (escaped).
fn describe(f: &BulkFilter, older: Option<&str>) -> String {
    let mut parts = vec![];
    parts.push(match &f.queue {
        Some(q) => format!("queue <b>{}</b>", esc(q)),
        None => "every queue".into(),
    });
    parts.push(match &f.name {
        Some(n) => format!("task name <b>{}</b>", esc(n)),
        None => "every task name".into(),
    });
    if let Some(o) = older {
        parts.push(format!("enqueued more than {} ago", esc(o)));
    }
    parts.join(", ")
}

async fn bulk_confirm(
    State(st): State<AppState>,
    Extension(ctx): Extension<Ctx>,
    Query(form): Query<BulkForm>,
) -> Response {
    if ctx.read_only {
        return error_page(&ctx, StatusCode::FORBIDDEN, "the dashboard is read-only");
    }
    let action = match form.parse() {
        Ok(a) => a,
        Err(e) => return error_page(&ctx, StatusCode::BAD_REQUEST, &e),
    };
    let older = nonblank(&form.older_than);
    let c = &st.client;
    let (count, what) = match &action {
        BulkAction::Retry(f) => match c.retry_where(f, true).await {
            Ok(n) => (
                n,
                format!("Retry <b>{n}</b> dead tasks of {}", describe(f, older)),
            ),
            Err(e) => return failure(&ctx, &e),
        },
        BulkAction::Cancel(f) => match c.cancel_where(f, true).await {
            Ok(n) => (
                n.canceled + n.requested,
                format!(
                    "Cancel <b>{}</b> pending tasks and request the cancel of <b>{}</b> running tasks of {}",
                    n.canceled,
                    n.requested,
                    describe(f, older)
                ),
            ),
            Err(e) => return failure(&ctx, &e),
        },
        BulkAction::Purge(age) => match c.purge_count(Some(TaskState::Dead), *age).await {
            Ok(n) => (
                n,
                format!(
                    "Delete <b>{n}</b> dead tasks (every queue) that finished more than {} ago",
                    esc(older.unwrap_or("0s"))
                ),
            ),
            Err(e) => return failure(&ctx, &e),
        },
    };
    let mut b = format!("<h1>Confirm</h1><p id=\"bulk-count\" data-count=\"{count}\">{what}?</p>");
    if count == 0 {
        b.push_str("<p>Nothing matches: there is nothing to do.</p>");
    } else {
        let _ = write!(
            b,
            r#"<form method="post" action="{}bulk">{}"#,
            esc(&ctx.root),
            csrf_field(&ctx)
        );
        for (k, v) in form.hidden() {
            let _ = write!(b, r#"<input type="hidden" name="{k}" value="{}">"#, esc(&v));
        }
        b.push_str(r#"<button type="submit" class="danger">Confirm</button></form>"#);
        b.push_str("<p>Counts are taken now; tasks that change state meanwhile may or may not be included. The work runs in batches of 500 rows, each its own short statement.</p>");
    }
    let _ = write!(b, r#"<p><a href="{}">Back</a></p>"#, esc(&ctx.home));
    respond(StatusCode::OK, page(&ctx, "Confirm", &b, None))
}

async fn bulk_run(
    State(st): State<AppState>,
    Extension(ctx): Extension<Ctx>,
    axum::Form(form): axum::Form<BulkForm>,
) -> Response {
    let action = match form.parse() {
        Ok(a) => a,
        Err(e) => return error_page(&ctx, StatusCode::BAD_REQUEST, &e),
    };
    let c = &st.client.clone().with_actor(ctx.actor.clone());
    let done = match &action {
        BulkAction::Retry(f) => c
            .retry_where(f, false)
            .await
            .map(|n| format!("Moved <b>{n}</b> dead tasks back to pending.")),
        BulkAction::Cancel(f) => c.cancel_where(f, false).await.map(|n| {
            format!(
                "Canceled <b>{}</b> pending tasks; requested the cancel of <b>{}</b> running tasks.",
                n.canceled, n.requested
            )
        }),
        BulkAction::Purge(age) => c
            .purge(Some(TaskState::Dead), *age)
            .await
            .map(|n| format!("Deleted <b>{n}</b> dead tasks.")),
    };
    // Even a failed bulk operation may have changed some batches.
    st.terminal.invalidate().await;
    match done {
        Ok(msg) => {
            let b = format!(
                r#"<h1>Done</h1><p class="flash" id="bulk-done">{msg}</p><p><a href="{}">Back to the overview</a></p>"#,
                esc(&ctx.home)
            );
            respond(StatusCode::OK, page(&ctx, "Done", &b, None))
        }
        Err(e) => failure(&ctx, &e),
    }
}

// ----------------------------------------------------------------------------- login

/// The login page (also the body of every 401 of the pages).
pub(crate) fn login_page(ctx: &Ctx, error: Option<&str>, status: StatusCode) -> Response {
    let mut b = String::from("<h1>Sign in</h1>");
    if let Some(e) = error {
        let _ = write!(b, r#"<p class="error">{}</p>"#, esc(e));
    }
    if !ctx.login_token && !ctx.login_basic {
        b.push_str("<p>Authentication is off.</p>");
    } else {
        let _ = write!(
            b,
            r#"<form method="post" action="{}login">{}"#,
            esc(&ctx.root),
            csrf_field(ctx)
        );
        if ctx.login_token {
            b.push_str(r#"<p><label>Token <input type="password" name="token" autocomplete="current-password"></label></p>"#);
        }
        if ctx.login_basic {
            b.push_str(r#"<p><label>User <input name="user" autocomplete="username"></label> <label>Password <input type="password" name="password" autocomplete="current-password"></label></p>"#);
        }
        b.push_str(r#"<p><button type="submit">Sign in</button></p></form>"#);
    }
    respond(status, page(ctx, "Sign in", &b, None))
}

async fn login_get(Extension(ctx): Extension<Ctx>) -> Response {
    login_page(&ctx, None, StatusCode::OK)
}

#[derive(Deserialize, Default)]
struct LoginForm {
    token: Option<String>,
    user: Option<String>,
    password: Option<String>,
}

async fn login_post(
    State(st): State<AppState>,
    Extension(ctx): Extension<Ctx>,
    axum::Form(f): axum::Form<LoginForm>,
) -> Response {
    let ok = st.auth.check_login(
        f.token.as_deref().unwrap_or(""),
        f.user.as_deref().unwrap_or(""),
        f.password.as_deref().unwrap_or(""),
    );
    if !ok {
        return login_page(&ctx, Some("Wrong credentials."), StatusCode::UNAUTHORIZED);
    }
    let mut r = see_other(&ctx.home);
    if let Ok(v) = HeaderValue::from_str(&st.auth.new_session()) {
        r.headers_mut().insert(SESSION_MARK, v);
    }
    r
}

async fn logout(Extension(ctx): Extension<Ctx>) -> Response {
    let mut r = see_other(&format!("{}login", ctx.root));
    r.headers_mut()
        .insert(SESSION_MARK, HeaderValue::from_static(""));
    r
}
