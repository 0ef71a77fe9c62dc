//! The task page (fields, payload, last error, attempts, operator actions) and its actions:
//! retry a dead task, cancel a pending or running one.

use std::fmt::Write as _;

use axum::Extension;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::Response;
use taskq::client::{AuditFilter, Canceled, TaskInfo, WorkerStatus};
use taskq::{TaskId, TaskState};

use super::{failure, see_task_with_flash, state_class, worker_status_cell};
use crate::AppState;
use crate::auth::FLASH_MARK;
use crate::ctx::Ctx;
use crate::html::{age, button, esc, opt_time, opt_when, page, respond, time_us, url};

/// The payload as pretty JSON, or as (lossy) text when it is not JSON.
fn pretty_payload(t: &TaskInfo) -> String {
    match t.payload_json() {
        Ok(v) => serde_json::to_string_pretty(&v).unwrap_or_default(),
        Err(_) => String::from_utf8_lossy(&t.payload).into_owned(),
    }
}

pub(super) async fn task_page(
    State(st): State<AppState>,
    Extension(ctx): Extension<Ctx>,
    Path(id): Path<u64>,
) -> Response {
    let (t, now) = match tokio::try_join!(st.client.get(TaskId(id)), st.client.db_now()) {
        Ok(v) => v,
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
        Some("due_now") => Some("Due now: a worker of the queue claims it at its next poll."),
        Some("rescheduled") => Some("Rescheduled."),
        Some("priority") => Some("Priority changed."),
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
        if t.state == TaskState::Pending {
            actions.push_str(&button(
                &ctx,
                &format!("tasks/{}/run-now", t.id),
                &[],
                "Run now",
                "",
            ));
        }
        if t.state != TaskState::Running {
            actions.push_str(&button(
                &ctx,
                &format!("tasks/{}/delete", t.id),
                &[],
                "Delete",
                "danger",
            ));
        }
        if !actions.is_empty() {
            let _ = write!(b, "<p id=\"actions\">{actions}</p>");
        }
        if t.state == TaskState::Pending {
            let _ = write!(
                b,
                r#"<form method="post" action="{root}tasks/{id}/reschedule" class="filters" id="reschedule">{csrf}<input name="when" placeholder="2026-12-01 15:00 (UTC) or 15m" aria-label="run at" size="30"><button type="submit">Reschedule</button></form><form method="post" action="{root}tasks/{id}/priority" class="filters" id="priority">{csrf}<input name="priority" type="number" min="-32768" max="32767" value="{}" aria-label="priority"><button type="submit">Set priority</button></form>"#,
                t.priority,
                id = t.id,
                csrf = crate::html::csrf_field(&ctx),
            );
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
    row("Run at", opt_when(&Some(t.run_at), &now));
    row("Created", opt_when(&Some(t.created_at), &now));
    row("Updated", opt_when(&Some(t.updated_at), &now));
    row("Attempted at", opt_when(&t.attempted_at, &now));
    row("Finished", opt_when(&t.finished_at, &now));
    row("Deadline", opt_when(&t.deadline, &now));
    row("Lease until", opt_when(&t.lease_until, &now));
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
    b.push_str("</dl><p>Times are as stored (the database clock, UTC), each with how long ago it was, or how far off. <i>Attempted at</i> is when the latest attempt started.</p>");
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

pub(super) async fn task_retry(
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

pub(super) async fn task_cancel(
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
