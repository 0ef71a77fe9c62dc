//! Building the durable follow-ups of `on_dead` / `on_success` (see `crate::task::followup`) into the
//! rows the write-back and the reaper insert.
//!
//! A follow-up that cannot be built (its hook panicked, its task does not serialize, its name or
//! queue is invalid), cannot be sent (its row is bigger than any statement the server takes,
//! see `backend::budget`) or that the database refuses (a deterministic error of the statement
//! that inserts it alone) never holds the end back: the task ends without it, and the failure
//! is logged at error level and counted (`follow_up_errors`, `taskq_follow_up_errors_total`).

use std::panic::{AssertUnwindSafe, catch_unwind};

use super::deadline::StmtError;
use super::{Shared, WorkerStats, within};
use crate::backend::FollowUpRow;
use crate::backend::budget::Budget;
use crate::registry::Registration;
use crate::task::followup::{DeadTask, FollowUp, SucceededTask};

/// The follow-up row of a death, if the task declares one (`on_dead`); `epoch` is the attempt's.
pub(crate) fn dead(
    shared: &Shared,
    reg: Option<&Registration>,
    dead: impl FnOnce() -> DeadTask,
    epoch: u64,
    trace_context: Option<&str>,
) -> Option<Box<FollowUpRow>> {
    let hook = reg?.on_dead?;
    let dead = dead();
    let built = catch_unwind(AssertUnwindSafe(|| hook(&dead)));
    row(
        shared,
        "on_dead",
        &dead.name,
        dead.id.0,
        epoch,
        built,
        trace_context,
    )
}

/// The follow-up row of a success, if the task declares one (`on_success`).
pub(crate) fn succeeded(
    shared: &Shared,
    reg: Option<&Registration>,
    done: impl FnOnce() -> SucceededTask,
    epoch: u64,
    trace_context: Option<&str>,
) -> Option<Box<FollowUpRow>> {
    let hook = reg?.on_success?;
    let done = done();
    let built = catch_unwind(AssertUnwindSafe(|| hook(&done)));
    row(
        shared,
        "on_success",
        &done.name,
        done.id.0,
        epoch,
        built,
        trace_context,
    )
}

fn row(
    shared: &Shared,
    kind: &'static str,
    task: &str,
    id: u64,
    epoch: u64,
    built: std::thread::Result<Option<FollowUp>>,
    trace_context: Option<&str>,
) -> Option<Box<FollowUpRow>> {
    let error = match built {
        Ok(None) => return None,
        Ok(Some(f)) => match &f.payload {
            Ok(payload) => {
                return Some(Box::new(FollowUpRow {
                    queue: f.queue,
                    name: f.name,
                    payload: payload.to_vec(),
                    priority: f.priority,
                    max_attempts: f.max_attempts,
                    ttl_us: f.ttl_us(),
                    key: format!("taskq:{kind}:{id}:{epoch}"),
                    trace_context: trace_context.map(str::to_owned),
                }));
            }
            Err(e) => format!("follow-up {:?}: {e}", f.name),
        },
        Err(_) => format!("the {kind} hook panicked"),
    };
    lost(shared, kind, task, id, &error, "could not be built");
    None
}

/// The server's statement budget (see `backend::budget`), read from it once.
pub(crate) async fn budget(shared: &Shared) -> Result<Budget, StmtError> {
    if let Some(b) = shared.budget.get() {
        return Ok(*b);
    }
    let b = within!(shared, |c| shared.store.statement_budget(c)).await?;
    Ok(*shared.budget.get_or_init(|| b))
}

/// Drops the follow-up of task `id` (named `task`) when its row is bigger than any statement
/// the server takes: it could never be sent. Returns whether it did.
pub(crate) fn fit(
    shared: &Shared,
    follow_up: &mut Option<Box<FollowUpRow>>,
    budget: &Budget,
    id: u64,
    task: &str,
) -> bool {
    let Some(f) = follow_up.as_deref() else {
        return false;
    };
    let bytes = f.json_len();
    if bytes <= budget.row {
        return false;
    }
    let error = format!(
        "follow-up {:?} is {bytes} bytes in its statement, more than the database takes in one \
         ({} bytes: its max_allowed_packet less room for the statement)",
        f.name, budget.row
    );
    lost(
        shared,
        kind_of(f),
        task,
        id,
        &error,
        "is too big to be sent",
    );
    *follow_up = None;
    true
}

/// Drops the follow-up of task `id` (named `task`) that the database refused (`e`, a
/// deterministic error of a statement carrying this one end only), so that the end is written
/// again without it.
pub(crate) fn refused(
    shared: &Shared,
    follow_up: &mut Option<Box<FollowUpRow>>,
    id: u64,
    task: &str,
    e: &StmtError,
) {
    if let Some(f) = follow_up.take() {
        let error = format!("follow-up {:?}: {e}", f.name);
        lost(
            shared,
            kind_of(&f),
            task,
            id,
            &error,
            "was refused by the database",
        );
    }
}

/// `on_dead` or `on_success`, from the follow-up's key (`taskq:<kind>:<id>:<epoch>`).
fn kind_of(f: &FollowUpRow) -> &'static str {
    if f.key.starts_with("taskq:on_dead:") {
        "on_dead"
    } else {
        "on_success"
    }
}

/// Logs and counts a follow-up the task ends without.
fn lost(shared: &Shared, kind: &'static str, task: &str, id: u64, error: &str, why: &str) {
    WorkerStats::add(&shared.stats.follow_up_errors, 1);
    crate::metrics::follow_up_error(task, kind);
    tracing::error!(task_id = id, task, kind, error = %error,
        "taskq: the follow-up {why}; the task ends without it");
}
