//! Building the durable follow-ups of `on_dead` / `on_success` (see `crate::followup`) into the
//! rows the write-back and the reaper insert.
//!
//! A follow-up that cannot be built (its hook panicked, its task does not serialize, its name or
//! queue is invalid) never holds the end back: the task ends without it, and the failure is
//! logged at error level and counted (`follow_up_errors`, `taskq_follow_up_errors_total`).

use std::panic::{AssertUnwindSafe, catch_unwind};

use super::{Shared, WorkerStats};
use crate::backend::FollowUpRow;
use crate::followup::{DeadTask, FollowUp, SucceededTask};
use crate::registry::Registration;

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
                    payload_hex: crate::enqueue::hex(payload),
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
    WorkerStats::add(&shared.stats.follow_up_errors, 1);
    crate::metrics::follow_up_error(task, kind);
    tracing::error!(task_id = id, task, kind, error = %error,
        "taskq: the follow-up could not be built; the task ends without it");
    None
}
