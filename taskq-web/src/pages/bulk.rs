//! The bulk actions: retry, cancel or purge by filter, behind a confirmation page that shows
//! the count first.

use std::fmt::Write as _;
use std::time::Duration;

use axum::Extension;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde::Deserialize;
use taskq::TaskState;
use taskq::client::BulkFilter;

use super::{failure, nonblank, parse_age, parse_state};
use crate::AppState;
use crate::ctx::Ctx;
use crate::html::{csrf_field, error_page, esc, page, respond};

#[derive(Deserialize, Default)]
pub(super) struct BulkForm {
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

pub(super) async fn bulk_confirm(
    State(st): State<AppState>,
    Extension(ctx): Extension<Ctx>,
    Query(form): Query<BulkForm>,
) -> Response {
    if ctx.read_only {
        return error_page(&ctx, StatusCode::FORBIDDEN, "the dashboard is read-only");
    }
    if nonblank(&form.action).is_none() {
        return bulk_form(&ctx);
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

/// The bulk form (moved off the overview, which reloads itself).
fn bulk_form(ctx: &Ctx) -> Response {
    let b = format!(
        r#"<h1>Bulk actions</h1><p>Each shows how many tasks match and asks for confirmation first.</p>
<form method="get" action="{}bulk" class="filters" id="bulk-form">
<select name="action" aria-label="action"><option value="retry">Retry dead tasks</option><option value="cancel">Cancel pending/running tasks</option><option value="purge">Purge dead tasks (all queues)</option></select>
<input name="queue" placeholder="queue (any)" aria-label="queue"><input name="name" placeholder="task name (any)" aria-label="task name"><input name="older_than" placeholder="older than (e.g. 1h)" aria-label="older than">
<button type="submit">Review…</button></form>"#,
        esc(&ctx.root)
    );
    respond(StatusCode::OK, page(ctx, "Bulk actions", &b, None))
}

pub(super) async fn bulk_run(
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
