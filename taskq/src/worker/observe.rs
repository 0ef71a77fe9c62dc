//! In-process outcome observers ([`WorkerBuilder::on_outcome`](crate::worker::WorkerBuilder::on_outcome)):
//! best-effort callbacks for metrics and logging, unlike the durable follow-ups.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::Duration;

use super::{Shared, WorkerStats};
use crate::task::{TaskId, TaskState};

/// An observer callback.
pub(crate) type Observer = Arc<dyn Fn(&OutcomeEvent) + Send + Sync>;

/// How an attempt ended, as an observer sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TaskOutcome {
    /// Written back as succeeded.
    Succeeded,
    /// Written back as pending for a retry (the attempt failed; attempts remain).
    Retried,
    /// Written back as dead (permanent error, undecodable payload or attempts exhausted).
    Dead,
    /// Written back as canceled (a cancel request honoured).
    Canceled,
    /// Written back as a snooze: pending again, the attempt not counted.
    Snoozed,
    /// The write-back was rejected because the lease epoch had moved: another worker (or the
    /// reaper) owns the task now; nothing was written.
    Fenced,
    /// The lease was lost while the handler ran: it was canceled and nothing was written.
    LeaseLost,
    /// The database rejected this outcome for its own row; the lease will expire and the
    /// reaper returns the task.
    Rejected,
    /// Still running at shutdown: given back (pending, the attempt not counted).
    Released,
    /// This worker's reaper found the lease expired and moved the task to this state
    /// (`Pending`, `Dead` or `Canceled`). The attempt may have been another worker's.
    Reaped(TaskState),
}

impl TaskOutcome {
    /// A short lowercase label (`succeeded`, `retried`, … `reaped`), e.g. for a metric label.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Succeeded => "succeeded",
            Self::Retried => "retried",
            Self::Dead => "dead",
            Self::Canceled => "canceled",
            Self::Snoozed => "snoozed",
            Self::Fenced => "fenced",
            Self::LeaseLost => "lease_lost",
            Self::Rejected => "rejected",
            Self::Released => "released",
            Self::Reaped(_) => "reaped",
        }
    }
}

/// One outcome, handed to the observers of [`WorkerBuilder::on_outcome`](crate::worker::WorkerBuilder::on_outcome)
/// once its write-back's result is known (after the commit).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct OutcomeEvent {
    /// The task.
    pub task_id: TaskId,
    /// Its name.
    pub name: Arc<str>,
    /// Its queue.
    pub queue: Arc<str>,
    /// The attempt's number (1 for the first run).
    pub attempt: u32,
    /// How it ended.
    pub outcome: TaskOutcome,
    /// The error text written with the outcome (a failed, dead or reaped attempt), if any.
    pub error: Option<String>,
    /// How long the handler ran (`None` for reaped tasks).
    pub duration: Option<Duration>,
    /// Whether a follow-up (`on_dead` / `on_success`) was enqueued in the same transaction.
    pub follow_up: bool,
}

/// Calls every observer with `ev`, catching panics (logged and counted); nothing when no
/// observer is registered. Never called inside a database transaction.
pub(crate) fn emit(shared: &Shared, ev: impl FnOnce() -> OutcomeEvent) {
    if shared.observers.is_empty() {
        return;
    }
    let ev = ev();
    for obs in &shared.observers {
        if catch_unwind(AssertUnwindSafe(|| obs(&ev))).is_err() {
            WorkerStats::add(&shared.stats.observer_panics, 1);
            tracing::error!(
                task_id = ev.task_id.0,
                outcome = ev.outcome.as_str(),
                "taskq: an outcome observer panicked; the worker goes on"
            );
        }
    }
}
