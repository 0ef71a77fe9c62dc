//! The workflow pages: the list of workflows (newest first, with their progress), a workflow's
//! page (its steps as a table and as a picture of the graph, level by level), and its actions
//! (unless the dashboard is read-only): cancel the workflow, retry its failed steps, each
//! audited with the page's actor.

use std::fmt::Write as _;

use axum::Extension;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::Response;
use serde::Deserialize;
use taskq::TaskState;
use taskq::workflow::{StepCounts, WorkflowId, WorkflowInfo, WorkflowState, WorkflowStepRow};

use super::{failure, nonblank, see_other, state_class};
use crate::AppState;
use crate::auth::FLASH_MARK;
use crate::ctx::Ctx;
use crate::html::{button, error_page, esc, opt_when, page, respond, url, when};
use crate::workflows::{WorkflowAction, levels};

#[derive(Deserialize, Default)]
pub(super) struct WorkflowsQuery {
    name: Option<String>,
    before: Option<String>,
    limit: Option<String>,
}

/// A workflow's steps per state, in lifecycle order.
fn per_state(c: &StepCounts) -> [(TaskState, u64); 7] {
    [
        (TaskState::Waiting, c.waiting),
        (TaskState::Pending, c.pending),
        (TaskState::Running, c.running),
        (TaskState::Succeeded, c.succeeded),
        (TaskState::Dead, c.dead),
        (TaskState::Canceled, c.canceled),
        (TaskState::Expired, c.expired),
    ]
}

/// A workflow's state as a highlighted word.
fn state_badge(s: WorkflowState) -> String {
    format!(r#"<span class="wf-{s}">{s}</span>"#)
}

/// The progress of a workflow: a bar of its steps (succeeded, dead, canceled or expired,
/// running; 120 px for all of them) and `3/5 ended`.
fn progress(c: &StepCounts) -> String {
    let total = c.total().max(1);
    let ended = c.succeeded + c.dead + c.canceled + c.expired;
    let mut bar = String::from(r#"<span class="wf-bar">"#);
    for (n, class) in [
        (c.succeeded, ""),
        (c.dead, "dead"),
        (c.canceled + c.expired, "canceled"),
        (c.running, "running"),
    ] {
        if n > 0 {
            let _ = write!(
                bar,
                r#"<span class="bar {class}" style="width:{}px"></span>"#,
                (n * 120).div_ceil(total)
            );
        }
    }
    bar.push_str("</span>");
    format!("{bar} {ended}/{} ended", c.total())
}

/// `GET /workflows`: a page of workflows, newest first, optionally of one name.
pub(super) async fn workflows(
    State(st): State<AppState>,
    Extension(ctx): Extension<Ctx>,
    Query(q): Query<WorkflowsQuery>,
) -> Response {
    let name = nonblank(&q.name);
    let before = match nonblank(&q.before).map(str::parse::<u64>).transpose() {
        Ok(b) => b,
        Err(_) => return error_page(&ctx, StatusCode::BAD_REQUEST, "before: not a workflow id"),
    };
    let limit = match nonblank(&q.limit).map(str::parse::<u32>).transpose() {
        Ok(l) => l.unwrap_or(st.page_size).clamp(1, st.max_page_size),
        Err(_) => return error_page(&ctx, StatusCode::BAD_REQUEST, "limit: not a number"),
    };
    let (rows, next, now) = match tokio::try_join!(
        crate::workflows::page(&st, name, before, limit),
        st.client.db_now()
    ) {
        Ok(((rows, next), now)) => (rows, next, now),
        Err(e) => return failure(&ctx, &e),
    };
    let root = esc(&ctx.root);
    let mut b = String::from(
        "<h1>Workflows</h1><p>Graphs of steps enqueued together, newest first. A step runs once the steps it runs after have succeeded; a workflow is <b>running</b> while any step has not ended, then <b>succeeded</b>, <b>failed</b> (a step died, expired or was canceled) or <b>canceled</b> (by an operator).</p>",
    );
    let _ = write!(
        b,
        r#"<form method="get" action="{root}workflows" class="filters"><input name="name" placeholder="workflow name" value="{}" aria-label="workflow name"><button type="submit">Filter</button></form>"#,
        esc(name.unwrap_or(""))
    );
    if rows.is_empty() {
        b.push_str(r#"<p id="none">No workflows.</p>"#);
    } else {
        b.push_str(r#"<table id="workflows"><tr><th>ID</th><th>Name</th><th>Created</th><th>State</th><th>Progress</th>"#);
        for (s, _) in per_state(&StepCounts::default()) {
            let _ = write!(b, "<th>{s}</th>");
        }
        b.push_str("</tr>");
        for w in &rows {
            let _ = write!(
                b,
                r#"<tr data-id="{id}" data-state="{}"><td><a href="{root}workflows/{id}">{id}</a></td><td><a href="{root}workflows/{id}">{}</a></td><td class="nw">{}</td><td>{}</td><td class="nw">{}</td>"#,
                w.state,
                esc(&w.name),
                when(&w.created_at, &now),
                state_badge(w.state),
                progress(&w.counts),
                id = w.id,
            );
            for (s, n) in per_state(&w.counts) {
                // Only a non-zero count takes its state's colour.
                let class = if n > 0 { state_class(s) } else { String::new() };
                let _ = write!(b, r#"<td class="n {class}" data-count="{s}">{n}</td>"#);
            }
            b.push_str("</tr>");
        }
        b.push_str("</table>");
    }
    let base = name.map_or(String::new(), |n| format!("name={}&amp;", url(n)));
    let _ = write!(
        b,
        r#"<p class="pager"><a href="{root}workflows?{base}">First page</a>"#
    );
    if let Some(n) = next {
        let _ = write!(
            b,
            r#" · <a rel="next" href="{root}workflows?{base}before={n}&amp;limit={limit}">Next page →</a>"#
        );
    }
    b.push_str("</p>");
    respond(StatusCode::OK, page(&ctx, "Workflows", &b, None))
}

/// The markers of a step: a cleanup step, one canceled by a dependency.
fn markers(s: &WorkflowStepRow) -> String {
    let mut m = String::new();
    if s.runs_after_failure {
        m.push_str(r#"<span class="badge cleanup">cleanup</span> "#);
    }
    if s.canceled_by_dependency {
        m.push_str(r#"<span class="badge by-dep">canceled by a dependency</span>"#);
    }
    m
}

/// The graph, level by level: each level a row of boxes, one per step (its name linking to its
/// task, its state, what it runs after, its markers).
fn graph(ctx: &Ctx, steps: &[WorkflowStepRow]) -> String {
    let root = esc(&ctx.root);
    let lv = levels(steps);
    let depth = lv.iter().copied().max().map_or(0, |m| m + 1);
    let mut g = String::from(r#"<div class="wf-graph" id="graph">"#);
    for level in 0..depth {
        let _ = write!(
            g,
            r#"<div class="wf-level" data-level="{level}"><span class="wf-level-n">{}</span>"#,
            level + 1
        );
        for (s, _) in steps.iter().zip(&lv).filter(|(_, l)| **l == level) {
            let after = if s.after.is_empty() {
                String::new()
            } else {
                let names: Vec<String> = s.after.iter().map(|a| esc(a)).collect();
                format!(r#"<span class="ago">after {}</span>"#, names.join(", "))
            };
            let _ = write!(
                g,
                r#"<div class="wf-step wf-step-{state}" data-step="{name}"><a href="{root}tasks/{id}"><b>{name}</b></a> <span class="{cls}">{state}</span>{after} {}</div>"#,
                markers(s),
                cls = state_class(s.state),
                name = esc(&s.step),
                id = s.task_id,
                state = s.state,
            );
        }
        g.push_str("</div>");
    }
    g.push_str("</div>");
    g
}

/// `GET /workflows/{id}`: the workflow, its actions, its graph and its steps.
pub(super) async fn workflow_page(
    State(st): State<AppState>,
    Extension(ctx): Extension<Ctx>,
    Path(id): Path<u64>,
) -> Response {
    let wid = WorkflowId(id);
    let (w, steps, now) = match tokio::try_join!(
        st.client.workflow(wid),
        st.client.workflow_steps(wid),
        st.client.db_now()
    ) {
        Ok(v) => v,
        Err(e) => return failure(&ctx, &e),
    };
    let root = esc(&ctx.root);
    let mut b = format!(r#"<h1>Workflow {} {}</h1>"#, w.id, state_badge(w.state));
    // The confirmation of the action that redirected here, meant for this workflow: shown once.
    let done = ctx
        .flash
        .as_deref()
        .and_then(|f| f.split_once('.'))
        .filter(|(_, for_id)| *for_id == id.to_string())
        .map(|(what, _)| what);
    let flash = match done {
        Some("workflow_canceled") => Some(
            "Canceled: its waiting and pending steps are canceled, and its running steps were asked to stop.",
        ),
        Some("workflow_retried") => Some(
            "Retried: its dead steps are pending again. Once one succeeds, the steps its failure canceled run again.",
        ),
        Some("workflow_nothing_retried") => Some("No step was dead: nothing to retry."),
        _ => None,
    };
    if let Some(f) = flash {
        let _ = write!(b, r#"<p class="flash" id="workflow-done">{f}</p>"#);
    }
    if !ctx.read_only {
        let mut actions = String::new();
        if w.state == WorkflowState::Running {
            actions.push_str(&button(
                &ctx,
                &format!("workflows/{id}/cancel"),
                &[],
                "Cancel workflow",
                "danger",
            ));
        }
        if w.counts.dead > 0 {
            actions.push_str(&button(
                &ctx,
                &format!("workflows/{id}/retry"),
                &[],
                "Retry failed steps",
                "",
            ));
        }
        if !actions.is_empty() {
            let _ = write!(b, r#"<p id="actions">{actions}</p>"#);
        }
    }
    summary(&mut b, &w, &now);
    b.push_str(
        "<h2>Graph</h2><p>Level by level: each step runs after steps of the levels above it.</p>",
    );
    b.push_str(&graph(&ctx, &steps));
    b.push_str(r#"<h2>Steps</h2><table id="steps"><tr><th>Step</th><th>Task</th><th>Task name</th><th>Queue</th><th>State</th><th>Runs after</th><th>Notes</th></tr>"#);
    for s in &steps {
        let after: Vec<String> = s.after.iter().map(|a| esc(a)).collect();
        let _ = write!(
            b,
            r#"<tr data-step="{}" data-state="{}"><td>{}</td><td><a href="{root}tasks/{id}">{id}</a></td><td>{}</td><td><a href="{root}tasks?queue={}">{}</a></td><td class="{}">{}</td><td>{}</td><td>{}</td></tr>"#,
            esc(&s.step),
            s.state,
            esc(&s.step),
            esc(&s.name),
            url(&s.queue),
            esc(&s.queue),
            state_class(s.state),
            s.state,
            if after.is_empty() {
                "—".to_owned()
            } else {
                after.join(", ")
            },
            markers(s),
            id = s.task_id,
        );
    }
    b.push_str("</table>");
    let _ = write!(
        b,
        r#"<p>A cleanup step runs once the steps it runs after have ended, however they ended. A step whose dependency died, expired or was canceled is canceled with it; <b>Retry failed steps</b> moves the dead steps back to pending, and when one of them succeeds the steps its failure canceled wait for their dependencies again. Operator actions are in the <a href="{root}audit">audit trail</a>.</p>"#
    );
    let mut r = respond(
        StatusCode::OK,
        page(&ctx, &format!("Workflow {}", w.id), &b, None),
    );
    if done.is_some() {
        r.headers_mut()
            .insert(FLASH_MARK, HeaderValue::from_static(""));
    }
    r
}

/// The workflow's fields and its steps per state.
fn summary(b: &mut String, w: &WorkflowInfo, now: &chrono::DateTime<chrono::Utc>) {
    b.push_str("<dl>");
    let mut row = |k: &str, v: String| {
        let _ = write!(b, "<dt>{k}</dt><dd>{v}</dd>");
    };
    row("Name", esc(&w.name));
    row("State", w.state.to_string());
    row("Created", opt_when(&Some(w.created_at), now));
    row("Canceled", opt_when(&w.canceled_at, now));
    row("Progress", progress(&w.counts));
    b.push_str("</dl>");
    b.push_str(r#"<table id="counts"><tr>"#);
    for (s, _) in per_state(&w.counts) {
        let _ = write!(b, "<th>{s}</th>");
    }
    b.push_str("<th>total</th></tr><tr>");
    for (s, n) in per_state(&w.counts) {
        let _ = write!(b, r#"<td class="n" data-count="{s}">{n}</td>"#);
    }
    let _ = write!(b, r#"<td class="n">{}</td></tr></table>"#, w.counts.total());
}

pub(super) async fn workflow_cancel(
    State(st): State<AppState>,
    Extension(ctx): Extension<Ctx>,
    Path(id): Path<u64>,
) -> Response {
    action(&st, &ctx, id, WorkflowAction::Cancel).await
}

pub(super) async fn workflow_retry(
    State(st): State<AppState>,
    Extension(ctx): Extension<Ctx>,
    Path(id): Path<u64>,
) -> Response {
    action(&st, &ctx, id, WorkflowAction::Retry).await
}

/// Applies `what` to workflow `id` as the page's actor; a `303 See Other` to the workflow's
/// page with the confirmation, or an error page.
async fn action(st: &AppState, ctx: &Ctx, id: u64, what: WorkflowAction) -> Response {
    let c = st.client.clone().with_actor(ctx.actor.clone());
    let flash = match what.apply(&c, WorkflowId(id)).await {
        Ok(crate::workflows::WorkflowDone::Canceled { .. }) => "workflow_canceled",
        Ok(crate::workflows::WorkflowDone::Retried(0)) => "workflow_nothing_retried",
        Ok(crate::workflows::WorkflowDone::Retried(_)) => "workflow_retried",
        Err(e) => return failure(ctx, &e),
    };
    st.terminal.invalidate().await;
    let mut r = see_other(&format!("{}workflows/{id}", ctx.root));
    if let Ok(v) = HeaderValue::from_str(&format!("{flash}.{id}")) {
        r.headers_mut().insert(FLASH_MARK, v);
    }
    r
}
