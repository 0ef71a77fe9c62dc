//! The operator's handle, [`Client`] (also at the crate root): inspect and manage tasks (get,
//! list, count, pending tasks per name, attempts, cancel, reschedule and reprioritize pending
//! tasks, retry dead tasks, bulk actions, audit trail), queues (pause, limits) and events
//! (per-topic backlog and lag, held keys, replay, retention); and the types its methods take
//! and return.

use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::backend::{Backend, RetryDead, Store, TaskFilter, Tx};
use crate::defaults::{MAX_QUEUE_LIMIT, MAX_RATE_PERIOD, MIN_RATE_PERIOD};
use crate::error::{Error, Result};
use crate::history::{self, Action};
pub use crate::history::{Attempt, AttemptOutcome, AuditEntry, AuditFilter};
use crate::task::{TaskId, TaskState};

mod actions;
mod audit;
mod batches;
mod bulk;
mod event_stats;
mod events;
mod queues;
mod reads;
mod workflows;

pub use bulk::{BulkCanceled, BulkFilter};
pub use event_stats::EventStats;
pub use taskq_driver::state::ParseStateError;

/// What [`Client::cancel`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Canceled {
    /// The task was pending: it is `canceled` now.
    Now,
    /// The task was running: a cancel request is recorded; the worker holding it stops it at
    /// its next heartbeat at the latest, and the task ends `canceled` (or `succeeded`, if the
    /// handler completed successfully within the cancel grace).
    Requested,
}

/// Read and manage tasks in the database. Cheap to clone (it holds a pool handle).
///
/// Every operator action it takes (cancel, retry, reschedule, priority, pause, resume, bulk
/// operations, purge, schedule deletion) is recorded in the audit trail with this client's
/// actor ([`Client::with_actor`]), in the transaction of the action; see [`Client::audit`].
#[derive(Debug, Clone)]
pub struct Client {
    pub(crate) store: Store,
    actor: std::sync::Arc<str>,
    timeout: Duration,
}

/// Which pending tasks [`Client::list_pending`] lists.
pub use taskq_driver::rows::{HeldKey, PendingKind};

pub use crate::info::{
    AttemptsPerMinute, DeadReason, FinishedPerMinute, ListFilter, PendingNameCount, QueueInfo,
    QueueStateCount, RateLimit, RunTimes, ScheduleInfo, TaskInfo, WorkerInfo, WorkerStatus,
};
impl Client {
    /// A client on `pool`: a `MySqlPool`, or with the `sqlite` feature a `SqlitePool`.
    pub fn new<DB: Backend>(pool: sqlx::Pool<DB>) -> Self {
        Self {
            store: Store::of(pool),
            actor: history::DEFAULT_ACTOR.into(),
            timeout: Self::DEFAULT_TIMEOUT,
        }
    }

    /// How long a client statement may take by default (see [`with_timeout`](Self::with_timeout)).
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

    /// This client with another deadline (default [`DEFAULT_TIMEOUT`](Self::DEFAULT_TIMEOUT),
    /// 30 s) for each database round it makes: taking a connection, each statement, a commit
    /// (a bulk operation's batches each have their own). One that has not answered by then —
    /// a server or network that went silent answers nothing, and sqlx waits forever — is
    /// abandoned and the method returns [`Error::Timeout`]; a change it made may still have
    /// been committed. Statements on a connection you pass in
    /// ([`record_audit`](Self::record_audit)) are not bounded. At least 1 ms.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// The deadline of each database round of this client.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// `fut` (a database round), within this client's deadline.
    pub(crate) async fn run<T>(&self, fut: impl Future<Output = sqlx::Result<T>>) -> Result<T> {
        match tokio::time::timeout(self.timeout, fut).await {
            Ok(r) => self.db(r).await,
            Err(_) => Err(Error::Timeout(self.timeout)),
        }
    }

    /// `fut` (database rounds that report taskq errors), within this client's deadline.
    async fn bounded<T>(&self, fut: impl Future<Output = Result<T>>) -> Result<T> {
        tokio::time::timeout(self.timeout, fut)
            .await
            .unwrap_or(Err(Error::Timeout(self.timeout)))
    }

    /// This client with `actor` as the "who" of the actions it records in the audit trail
    /// (default `"client"`; the CLI uses `cli:<user>@<host>`). Cut to
    /// [`MAX_ACTOR_LEN`](crate::defaults::MAX_ACTOR_LEN) characters.
    pub fn with_actor(mut self, actor: impl Into<String>) -> Self {
        self.actor = history::cut(&actor.into(), history::MAX_ACTOR_LEN).into();
        self
    }

    /// The actor recorded with this client's actions.
    pub fn actor(&self) -> &str {
        &self.actor
    }

    /// Runs `a` in the audit trail on `tx` and commits it.
    async fn commit_audited(&self, mut tx: Tx, a: &Action) -> Result<()> {
        self.run(history::insert(tx.conn(), &self.actor, a)).await?;
        self.run(tx.commit()).await
    }

    /// Records `a` in a transaction of its own (bulk operations: one entry with the totals).
    async fn record(&self, a: &Action) -> Result<()> {
        let tx = self.run(self.store.begin()).await?;
        self.commit_audited(tx, a).await
    }

    /// The backend this client works on: `"MySQL"` or `"SQLite"`.
    pub fn backend(&self) -> &'static str {
        self.store.backend()
    }

    async fn state_error(&self, id: TaskId, expected: &'static str) -> Error {
        match self.run(self.store.task_state(id)).await {
            Ok(None) => Error::NotFound(id),
            Ok(Some(state)) => Error::WrongState {
                id,
                state,
                expected,
            },
            Err(e) => e,
        }
    }

    /// A database result with its error made readable (see [`Error::Connect`]).
    pub(crate) async fn db<T>(&self, r: sqlx::Result<T>) -> Result<T> {
        match r {
            Ok(v) => Ok(v),
            Err(e) => Err(self.store.error(e).await),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::info::exhausted_note;

    fn dead(attempt: u32, max_attempts: u32, last_error: Option<&str>) -> TaskInfo {
        let now = Utc::now();
        TaskInfo {
            id: TaskId(1),
            queue: "default".into(),
            name: "t".into(),
            payload: b"{}".to_vec(),
            state: TaskState::Dead,
            priority: 0,
            attempt,
            max_attempts,
            run_at: now,
            lease_until: None,
            lease_epoch: attempt.into(),
            worker_id: None,
            idempotency_key: None,
            trace_context: None,
            last_error: last_error.map(str::to_owned),
            snoozes: 0,
            deadline: None,
            attempted_at: None,
            unique_key: None,
            unique_held: false,
            created_at: now,
            updated_at: now,
            finished_at: Some(now),
            output: None,
        }
    }

    #[test]
    fn dead_reasons_come_from_the_row() {
        let reason = |t: TaskInfo| t.dead_reason().map(|r| r.to_string());
        let exhausted = format!("HTTP 503{}", exhausted_note(5, 5));
        assert_eq!(
            reason(dead(5, 5, Some(&exhausted))).as_deref(),
            Some("attempts exhausted (5/5)")
        );
        // A permanent error on the last attempt carries no note.
        assert_eq!(
            reason(dead(5, 5, Some("bad input"))).as_deref(),
            Some("permanent error")
        );
        assert_eq!(
            dead(1, 5, Some("bad input")).dead_reason(),
            Some(DeadReason::Permanent)
        );
        assert_eq!(
            dead(3, 3, Some("lease expired (worker w-1, attempt 3)")).dead_reason(),
            Some(DeadReason::AttemptsExhausted {
                attempts: 3,
                max_attempts: 3
            })
        );
        assert_eq!(
            reason(dead(
                1,
                5,
                Some("payload does not decode as Ping: missing field `n`")
            ))
            .as_deref(),
            Some("payload does not decode")
        );
        assert_eq!(
            reason(dead(2, 5, None)).as_deref(),
            Some("reason not recorded")
        );
        let mut pending = dead(1, 5, Some(&exhausted));
        pending.state = TaskState::Pending;
        assert_eq!(pending.dead_reason(), None);
    }
}
