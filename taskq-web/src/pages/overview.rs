//! The overview page: tasks per queue and state, tasks finished and attempts failed per
//! minute, due tasks no live worker handles, the workers, and the bulk-action form.

use std::fmt::Write as _;

use axum::Extension;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde::Deserialize;
use taskq::TaskState;
use taskq::client::WorkerStatus;

use super::{failure, nonblank, worker_status_cell};
use crate::AppState;
use crate::ctx::Ctx;
use crate::html::{age, button, esc, page, rel, respond, run_time, time, url, when};

#[derive(Deserialize, Default)]
pub(super) struct OverviewQuery {
    refresh: Option<String>,
}

pub(super) async fn overview(
    State(st): State<AppState>,
    Extension(ctx): Extension<Ctx>,
    Query(q): Query<OverviewQuery>,
) -> Response {
    let minutes = st.throughput_minutes;
    let (stats, workers, unhandled, held) = match tokio::try_join!(
        crate::stats::load(&st),
        st.client.workers(),
        crate::stats::unhandled(&st),
        st.client.held_keys(None, 20)
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
    let mut totals = [0u64; TaskState::ALL.len()];
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
                    r#"<td><span class="badge paused">paused</span> since {} {}</td>"#,
                    time(&at),
                    rel(&at, &now)
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
        when(&stats.terminal_at, &now),
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
    b.push_str(r#"<th>failed attempts</th><th>lease lost</th><th>bars</th></tr>"#);
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
    b.push_str(r#"<p class="legend" id="legend">Bars, scaled to the busiest cell: <span><span class="bar"></span>succeeded</span><span><span class="bar dead"></span>dead</span><span><span class="bar canceled"></span>canceled</span><span><span class="bar failed"></span>failed attempts</span> (expired and lease lost: their columns only)</p>"#);

    // Run times.
    let _ = write!(
        b,
        r#"<h2>Run time per task name</h2><p>Tasks that succeeded in the last {minutes} minutes: the run time of their last attempt (<code>finished_at</code> − <code>attempted_at</code>, database clock), nearest-rank percentiles over the newest {} successes of the window.</p>"#,
        taskq::Client::RUN_TIMES_SAMPLE
    );
    if stats.run_times.is_empty() {
        b.push_str(r#"<p id="run-times-none">No task succeeded in the window.</p>"#);
    } else {
        b.push_str(r#"<table id="run-times"><tr><th>Task</th><th>Runs</th><th>p50</th><th>p95</th><th>Longest</th></tr>"#);
        for r in &stats.run_times {
            let _ = write!(
                b,
                r#"<tr data-name="{}"><td><a href="{root}tasks?name={}&amp;state=succeeded">{}</a></td><td class="n">{}</td><td class="n">{}</td><td class="n">{}</td><td class="n">{}</td></tr>"#,
                esc(&r.name),
                url(&r.name),
                esc(&r.name),
                r.count,
                run_time(r.p50),
                run_time(r.p95),
                run_time(r.max)
            );
        }
        b.push_str("</table>");
    }

    // Due tasks no live worker handles.
    if !unhandled.rows.is_empty() {
        let _ = write!(
            b,
            r#"<h2>Tasks no live worker handles</h2><p class="error">No alive worker works these queues and registers these task names, so their due tasks stay pending. Run a worker that registers them, or cancel them. (Counted at {}; <a href="{root}unhandled">details</a>.)</p><table id="unhandled"><tr><th>Queue</th><th>Task</th><th>Due</th><th>Due for</th></tr>"#,
            when(&unhandled.at, &now)
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

    // Order keys held back by their head (ordered tasks).
    if !held.is_empty() {
        b.push_str(
            r#"<h2>Held order keys</h2><p>Ordered tasks wait behind these heads: a head that failed and waits for its next attempt (or runs again), or a dead head, which holds its key until it is retried or deleted.</p><table id="held-keys"><tr><th>Queue</th><th>Key</th><th>Head</th><th>Task</th><th>State</th><th>Attempts</th><th>Waiting</th><th>Last error</th></tr>"#,
        );
        for k in &held {
            let _ = write!(
                b,
                r#"<tr><td>{}</td><td><code>{}</code></td><td><a href="{root}tasks/{}">{}</a></td><td>{}</td><td>{}</td><td class="n">{}</td><td class="n">{}</td><td>{}</td></tr>"#,
                esc(&k.queue),
                esc(&k.order_key[..16]),
                k.head,
                k.head,
                esc(&k.name),
                k.state,
                k.attempt,
                k.waiting,
                esc(k.last_error.as_deref().unwrap_or(""))
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
                r#"<tr data-worker="{}"><td>{}</td><td>{}</td><td class="n">{}</td><td>{}</td><td class="n">{}</td><td>{status}</td><td>{} <span class="ago">{} ago</span></td></tr>"#,
                esc(&w.id),
                esc(&w.id),
                esc(&w.host),
                w.pid,
                queues.join(", "),
                w.running,
                time(&w.last_seen_at),
                age(w.last_seen_ago.as_secs() as i64)
            );
        }
        b.push_str("</table>");
        if workers.iter().any(|w| w.status == WorkerStatus::Lost) {
            b.push_str("<p>Lost: no heartbeat for two of its heartbeat intervals (at most its lease, at least 1 s), and no goodbye (crashed, killed, hung or cut off from the database). Its running tasks stay claimed until their leases end, then return to pending; the task list and the task pages mark them <span class=\"lost\">worker lost</span>.</p>");
        }
    }

    // The bulk form is on its own page: this one reloads itself, which would wipe a form
    // being filled in.
    if !ctx.read_only {
        let _ = write!(
            b,
            r#"<h2>Bulk actions</h2><p><a href="{root}bulk" id="bulk-link">Retry, cancel or purge by filter…</a> (each shows how many tasks match and asks for confirmation first)</p>"#
        );
    }
    respond(StatusCode::OK, page(&ctx, "Overview", &b, refresh))
}
