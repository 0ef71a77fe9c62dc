//! [`Client`]: inspect and manage tasks (get, list, count, pending tasks per name, cancel, retry
//! dead tasks).

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::MySqlPool;

use crate::error::{Error, Result};
use crate::store::{RetryDead, Store, TaskFilter};
use crate::task::{TaskId, TaskState};

/// Read and manage tasks in the database. Cheap to clone (it holds a pool handle).
#[derive(Debug, Clone)]
pub struct Client {
    store: Store,
}

/// Everything stored about a task.
#[derive(Debug, Clone, Serialize)]
pub struct TaskInfo {
    /// Task id.
    pub id: TaskId,
    /// Queue name.
    pub queue: String,
    /// Stable task name.
    pub name: String,
    /// The JSON payload as stored (bytes; normally UTF-8 JSON).
    #[serde(skip)]
    pub payload: Vec<u8>,
    /// Current state.
    pub state: TaskState,
    /// Priority (lower runs first).
    pub priority: i16,
    /// Attempts started so far.
    pub attempt: u32,
    /// Attempts allowed.
    pub max_attempts: u32,
    /// When the task is (or was) due, database clock, UTC.
    pub run_at: DateTime<Utc>,
    /// End of the current lease, while running.
    pub lease_until: Option<DateTime<Utc>>,
    /// Fencing token of the latest claim.
    pub lease_epoch: u64,
    /// Worker of the latest claim.
    pub worker_id: Option<String>,
    /// Idempotency key, if any.
    pub idempotency_key: Option<String>,
    /// Trace context of the enqueuing request (e.g. a W3C `traceparent`), if recorded.
    pub trace_context: Option<String>,
    /// A unique task's identity (hex SHA-256; see [`Unique`](crate::Unique)).
    pub unique_key: Option<String>,
    /// Whether the task holds its unique identity now (keeping out enqueues of the same one).
    pub unique_held: bool,
    /// The latest error (kept after a later success).
    pub last_error: Option<String>,
    /// Insert time.
    pub created_at: DateTime<Utc>,
    /// Last change.
    pub updated_at: DateTime<Utc>,
    /// When it reached a terminal state.
    pub finished_at: Option<DateTime<Utc>>,
}

impl TaskInfo {
    /// The payload decoded as JSON.
    pub fn payload_json(&self) -> std::result::Result<serde_json::Value, serde_json::Error> {
        serde_json::from_slice(&self.payload)
    }
}

/// Which tasks [`Client::list`] and [`Client::count`] look at; empty fields match everything.
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    /// Only this queue.
    pub queue: Option<String>,
    /// Only this state.
    pub state: Option<TaskState>,
    /// Only this task name.
    pub name: Option<String>,
    /// Only ids greater than this (paging cursor: pass the last id of the previous page).
    pub after_id: Option<TaskId>,
    /// Page size (default 100, at most 10,000).
    pub limit: Option<u32>,
}

impl ListFilter {
    fn store(&self) -> TaskFilter<'_> {
        TaskFilter {
            queue: self.queue.as_deref(),
            state: self.state,
            name: self.name.as_deref(),
        }
    }
}

/// Count of tasks in one queue and state, with the oldest due time and earliest lease end.
#[derive(Debug, Clone, Serialize)]
pub struct QueueStateCount {
    /// Queue name.
    pub queue: String,
    /// State.
    pub state: TaskState,
    /// Number of tasks.
    pub count: u64,
    /// Earliest `run_at` among them.
    pub oldest_run_at: Option<DateTime<Utc>>,
    /// Earliest `lease_until` among them (running tasks).
    pub earliest_lease_until: Option<DateTime<Utc>>,
}

/// Pending tasks of one task name in one queue: how many, how many are due, and the earliest
/// due time. Workers claim only the names they have a handler for, so the tasks of a name no
/// running worker handles stay pending: their due count and age only grow while the rest of
/// the queue moves.
#[derive(Debug, Clone, Serialize)]
pub struct PendingNameCount {
    /// Queue name.
    pub queue: String,
    /// Stable task name.
    pub name: String,
    /// Pending tasks (due or scheduled).
    pub pending: u64,
    /// Pending tasks that are due (`run_at` not after the database clock).
    pub due: u64,
    /// Earliest `run_at` among them: when the oldest due task became due, if `due > 0`;
    /// otherwise when the next one becomes due.
    pub oldest_run_at: DateTime<Utc>,
}

impl Client {
    /// A client on `pool`.
    pub fn new(pool: MySqlPool) -> Self {
        Self {
            store: Store::new(pool),
        }
    }

    /// The pool this client uses.
    pub fn pool(&self) -> &MySqlPool {
        self.store.pool()
    }

    /// A task by id; [`Error::NotFound`] when it does not exist (or was pruned).
    pub async fn get(&self, id: TaskId) -> Result<TaskInfo> {
        self.store.task_get(id).await?.ok_or(Error::NotFound(id))
    }

    /// Tasks matching `filter`, ordered by id.
    pub async fn list(&self, filter: &ListFilter) -> Result<Vec<TaskInfo>> {
        let limit = filter.limit.unwrap_or(100).clamp(1, 10_000);
        let after = filter.after_id.map_or(0, |i| i.0);
        Ok(self.store.task_list(&filter.store(), after, limit).await?)
    }

    /// Number of tasks matching `filter` (`after_id` and `limit` are ignored).
    pub async fn count(&self, filter: &ListFilter) -> Result<u64> {
        Ok(self.store.task_count(&filter.store()).await?)
    }

    /// Counts per queue and state.
    pub async fn stats(&self) -> Result<Vec<QueueStateCount>> {
        let mut conn = self.store.pool().acquire().await?;
        Ok(self.store.task_stats(&mut conn).await?)
    }

    /// Pending tasks per queue and task name (of `queue` only, when given), ordered by queue and
    /// name: the way to spot tasks whose name no running worker handles (they stay pending).
    /// Reads every pending row's index entry (one covering scan), so it costs in proportion to
    /// the pending backlog.
    pub async fn pending_by_name(&self, queue: Option<&str>) -> Result<Vec<PendingNameCount>> {
        Ok(self.store.task_pending_by_name(queue).await?)
    }

    /// Cancels a task that has not started (a unique task frees its identity). Running and
    /// terminal tasks give [`Error::WrongState`], unknown ids [`Error::NotFound`].
    pub async fn cancel(&self, id: TaskId) -> Result<()> {
        if self.store.task_cancel(id).await? {
            crate::metrics::canceled();
            return Ok(());
        }
        Err(self.state_error(id, "pending").await)
    }

    /// Pauses `queue`: workers stop claiming from it within about a second (running tasks
    /// finish normally; enqueues still work). Idempotent.
    pub async fn pause_queue(&self, queue: &str) -> Result<()> {
        crate::enqueue::validate_name("queue", queue, crate::enqueue::MAX_QUEUE_LEN)?;
        Ok(self.store.queue_pause(queue).await?)
    }

    /// Resumes a paused queue; returns whether it was paused.
    pub async fn resume_queue(&self, queue: &str) -> Result<bool> {
        let was_paused = self.store.queue_resume(queue).await?;
        crate::wake::notify(queue);
        Ok(was_paused)
    }

    /// Paused queues and when each was paused.
    pub async fn paused_queues(&self) -> Result<Vec<(String, DateTime<Utc>)>> {
        let mut conn = self.store.pool().acquire().await?;
        Ok(self.store.queues_paused(&mut conn).await?)
    }

    /// Moves a dead task back to pending with its attempts reset. A unique task takes its
    /// identity back; if another task holds it (enqueued after this one died), nothing changes
    /// and the error is [`Error::UniqueHeld`] naming that task.
    pub async fn retry_dead(&self, id: TaskId) -> Result<()> {
        match self.store.task_retry_dead(id).await? {
            RetryDead::Retried => Ok(()),
            RetryDead::IdentityHeld(holder) => Err(Error::UniqueHeld { id, holder }),
            RetryDead::NotDead => Err(self.state_error(id, "dead").await),
        }
    }

    async fn state_error(&self, id: TaskId, expected: &'static str) -> Error {
        match self.store.task_state(id).await {
            Ok(None) => Error::NotFound(id),
            Ok(Some(state)) => Error::WrongState {
                id,
                state,
                expected,
            },
            Err(e) => e.into(),
        }
    }

    /// Rows changed per statement by the bulk operations ([`Client::retry_all_dead`],
    /// [`Client::purge`]): small, so each statement holds its row locks only briefly.
    pub const BATCH: u32 = 500;

    /// The database clock now (`UTC_TIMESTAMP(6)`): the clock every stored time comes from,
    /// so ages and lease expiries should be computed against it, not the local clock.
    pub async fn db_now(&self) -> Result<DateTime<Utc>> {
        Ok(self.store.db_now().await?)
    }

    /// Moves every dead task (of `queue`, or of all queues when `None`) back to pending with
    /// its attempts reset and its epoch incremented, in batches of [`Client::BATCH`] rows
    /// (one short statement each). Tasks that die again while this runs are left dead. Unique
    /// tasks are retried one statement each, like [`Client::retry_dead`]; one whose identity
    /// another task holds now is left dead (and logged). Returns how many tasks were moved.
    pub async fn retry_all_dead(&self, queue: Option<&str>) -> Result<u64> {
        let started = self.store.db_now().await?;
        let mut total = 0;
        loop {
            let n = self
                .store
                .task_retry_dead_batch(queue, started, Self::BATCH)
                .await?;
            total += n;
            if n < u64::from(Self::BATCH) {
                break;
            }
        }
        let mut after = 0;
        loop {
            let ids = self
                .store
                .task_dead_unique_ids(queue, started, after, Self::BATCH)
                .await?;
            for &id in &ids {
                match self.store.task_retry_dead(id).await? {
                    RetryDead::Retried => total += 1,
                    RetryDead::NotDead => {}
                    RetryDead::IdentityHeld(holder) => tracing::warn!(
                        task_id = %id, holder = %holder,
                        "taskq: dead task left dead: its unique identity is held by a newer task"
                    ),
                }
            }
            match ids.last() {
                Some(last) if ids.len() == Self::BATCH as usize => after = last.0,
                _ => return Ok(total),
            }
        }
    }

    /// Deletes terminal tasks (`succeeded`, `dead`, `canceled`; only `state` when given) that
    /// finished more than `older_than` ago (whole seconds, database clock), in batches of
    /// [`Client::BATCH`] rows. A non-terminal `state` gives [`Error::InvalidOption`]. Returns
    /// how many tasks were deleted.
    pub async fn purge(
        &self,
        state: Option<TaskState>,
        older_than: std::time::Duration,
    ) -> Result<u64> {
        let states: Vec<TaskState> = match state {
            Some(s) if !s.is_terminal() => {
                return Err(Error::InvalidOption(format!(
                    "cannot purge {s} tasks: only terminal states (succeeded, dead, canceled)"
                )));
            }
            Some(s) => vec![s],
            None => TaskState::ALL
                .into_iter()
                .filter(|s| s.is_terminal())
                .collect(),
        };
        let age_secs = older_than.as_secs();
        let mut total = 0;
        let mut conn = self.store.pool().acquire().await?;
        for s in states {
            loop {
                let n = self
                    .store
                    .task_prune(&mut conn, s, age_secs, Self::BATCH)
                    .await?;
                total += n;
                if n < u64::from(Self::BATCH) {
                    break;
                }
            }
        }
        Ok(total)
    }
}
