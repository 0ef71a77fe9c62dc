//! The operator's handle, [`Client`] (also at the crate root): inspect and manage tasks (get,
//! list, count, pending tasks per name, attempts, cancel, reschedule and reprioritize pending
//! tasks, retry dead tasks, bulk actions, audit trail) and queues (pause, limits); and the
//! types its methods take and return.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::MySqlPool;

use crate::error::{Error, Result};
use crate::history::{self, Action};
pub use crate::history::{Attempt, AttemptOutcome, AuditEntry, AuditFilter};
use crate::limits::{MAX_QUEUE_LIMIT, MAX_RATE_PERIOD, MIN_RATE_PERIOD};
use crate::store::{RetryDead, Store, TaskFilter};
use crate::task::{TaskId, TaskState};

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

/// Which tasks a bulk operation ([`Client::cancel_where`], [`Client::retry_where`]) touches:
/// every field given must match (`None`: any).
#[derive(Debug, Clone, Default)]
pub struct BulkFilter {
    /// Only this queue.
    pub queue: Option<String>,
    /// Only this task name.
    pub name: Option<String>,
    /// Only this state (`cancel_where`: `pending` or `running`, default both; `retry_where`:
    /// `dead`, the default). Another state is [`Error::InvalidOption`].
    pub state: Option<TaskState>,
    /// Only tasks enqueued (`created_at`) at least this long ago, database clock (capped at
    /// 100 years).
    pub older_than: Option<std::time::Duration>,
}

impl BulkFilter {
    fn store(&self, state: TaskState) -> TaskFilter<'_> {
        TaskFilter {
            queue: self.queue.as_deref(),
            state: Some(state),
            name: self.name.as_deref(),
        }
    }
    /// The filter as recorded in the audit trail.
    fn detail(&self) -> serde_json::Value {
        serde_json::json!({
            "queue": self.queue, "name": self.name, "state": self.state,
            "older_than_secs": self.older_than.map(|d| d.as_secs()),
        })
    }
    fn age_us(&self) -> i64 {
        const CAP_US: u128 = 100 * 366 * 86_400 * 1_000_000;
        self.older_than
            .map_or(0, |d| d.as_micros().min(CAP_US) as i64)
    }
}

/// What [`Client::cancel_where`] did (in a dry run: what it would do, as counts of matching
/// tasks).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct BulkCanceled {
    /// Pending tasks canceled at once.
    pub canceled: u64,
    /// Running tasks whose cancel was requested (their workers stop them at the next beat).
    pub requested: u64,
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
    /// Times a handler snoozed it ([`TaskError::snooze`](crate::TaskError::snooze)): runs that
    /// did not count as an attempt.
    pub snoozes: u32,
    /// No attempt starts at or after this time (database clock); past it the task ends
    /// `expired`. `None`: no deadline.
    pub deadline: Option<DateTime<Utc>>,
    /// When the latest attempt started (database clock); `None` if none has. The attempts
    /// that ended are in [`Client::attempts`].
    pub attempted_at: Option<DateTime<Utc>>,
}

impl TaskInfo {
    /// The payload decoded as JSON.
    pub fn payload_json(&self) -> std::result::Result<serde_json::Value, serde_json::Error> {
        serde_json::from_slice(&self.payload)
    }

    /// Why a `dead` task died (`None` for any other state), derived from the row: the worker
    /// records no reason column, but it writes `last_error` in recognizable forms.
    ///
    /// The rule, in order:
    /// 1. `last_error` ends with `(attempts exhausted: n/m)` (the worker's note when a
    ///    retryable failure used the last attempt) → [`DeadReason::AttemptsExhausted`];
    /// 2. `last_error` starts with `lease expired (` and `attempt >= max_attempts` (the reaper
    ///    took back the last attempt of a worker that crashed or stalled) →
    ///    [`DeadReason::AttemptsExhausted`];
    /// 3. `last_error` starts with `payload does not decode` → [`DeadReason::Undecodable`];
    /// 4. any other `last_error` → [`DeadReason::Permanent`] (the handler returned
    ///    [`TaskError::permanent`](crate::TaskError::permanent), possibly on its last attempt:
    ///    a permanent failure never carries the exhausted note);
    /// 5. no `last_error` (a row changed by hand) → [`DeadReason::Unknown`].
    pub fn dead_reason(&self) -> Option<DeadReason> {
        if self.state != TaskState::Dead {
            return None;
        }
        let Some(error) = self.last_error.as_deref() else {
            return Some(DeadReason::Unknown);
        };
        if let Some((attempts, max_attempts)) = parse_exhausted_note(error) {
            return Some(DeadReason::AttemptsExhausted {
                attempts,
                max_attempts,
            });
        }
        if error.starts_with(LEASE_EXPIRED_PREFIX) && self.attempt >= self.max_attempts {
            return Some(DeadReason::AttemptsExhausted {
                attempts: self.attempt,
                max_attempts: self.max_attempts,
            });
        }
        if error.starts_with(UNDECODABLE_PREFIX) {
            return Some(DeadReason::Undecodable);
        }
        Some(DeadReason::Permanent)
    }
}

/// Why a task is `dead`; see [`TaskInfo::dead_reason`] for how it is derived.
///
/// `Display` is a short phrase: `permanent error`, `attempts exhausted (5/5)`,
/// `payload does not decode`, `reason not recorded`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeadReason {
    /// The handler returned a permanent error: retrying could not fix it.
    Permanent,
    /// Every allowed attempt failed (the last one with a retryable error, a timeout, a panic
    /// or an expired lease).
    AttemptsExhausted {
        /// Attempts made.
        attempts: u32,
        /// Attempts allowed.
        max_attempts: u32,
    },
    /// The payload does not decode as the task's type (e.g. the payload struct changed
    /// incompatibly); never retried.
    Undecodable,
    /// No error was recorded (the row was changed by hand).
    Unknown,
}

impl std::fmt::Display for DeadReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeadReason::Permanent => f.write_str("permanent error"),
            DeadReason::AttemptsExhausted {
                attempts,
                max_attempts,
            } => write!(f, "attempts exhausted ({attempts}/{max_attempts})"),
            DeadReason::Undecodable => f.write_str("payload does not decode"),
            DeadReason::Unknown => f.write_str("reason not recorded"),
        }
    }
}

/// How the worker's error text of an undecodable payload starts.
pub(crate) const UNDECODABLE_PREFIX: &str = "payload does not decode";
/// How the reaper's error text starts (written by SQL in `store::task_reap_expired`).
const LEASE_EXPIRED_PREFIX: &str = "lease expired (";

/// The note the worker appends to the error of a task whose last attempt failed.
pub(crate) fn exhausted_note(attempts: u32, max_attempts: u32) -> String {
    format!(" (attempts exhausted: {attempts}/{max_attempts})")
}

/// The `(attempts, max_attempts)` of an [`exhausted_note`] ending `error`.
fn parse_exhausted_note(error: &str) -> Option<(u32, u32)> {
    let rest = error.strip_suffix(')')?;
    let (_, counts) = rest.rsplit_once(" (attempts exhausted: ")?;
    let (n, m) = counts.split_once('/')?;
    Some((n.parse().ok()?, m.parse().ok()?))
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
    /// Paging cursor: only tasks after this id in the listing order (greater ids oldest
    /// first, smaller ids with `newest_first`); pass the last id of the previous page.
    pub after_id: Option<TaskId>,
    /// Page size (default 100, at most 10,000).
    pub limit: Option<u32>,
    /// List by id descending (newest first) instead of ascending.
    pub newest_first: bool,
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

/// Tasks that reached one terminal state within one minute (see
/// [`Client::finished_per_minute`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct FinishedPerMinute {
    /// The terminal state.
    pub state: TaskState,
    /// Which minute: 0 is the last 60 seconds before the database clock's now, 1 the 60
    /// before those, and so on.
    pub minutes_ago: u32,
    /// Tasks that reached `state` in that minute.
    pub count: u64,
}

/// Attempts with one outcome that ended within one minute (see
/// [`Client::failed_attempts_per_minute`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AttemptsPerMinute {
    /// How they ended: `failed`, `timed_out`, `panicked` or `lease_lost`.
    pub outcome: AttemptOutcome,
    /// Which minute: 0 is the last 60 seconds before the database clock's now, 1 the 60
    /// before those, and so on.
    pub minutes_ago: u32,
    /// Attempts that ended so in that minute.
    pub count: u64,
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

/// A recurring schedule as recorded in `taskq_schedules` by the workers that declare it.
///
/// The row stays after the schedule is removed from the code (or while no worker that declares
/// it runs): its `next_tick` then falls behind the database clock, which is how `taskq
/// schedules` shows it as overdue. [`Client::delete_schedule`] removes such a row.
#[derive(Debug, Clone, Serialize)]
pub struct ScheduleInfo {
    /// The schedule's name (by default the task's name).
    pub name: String,
    /// The task it enqueues.
    pub task_name: String,
    /// The queue it enqueues on.
    pub queue: String,
    /// The cron expression.
    pub expression: String,
    /// The time zone the expression is read in (`UTC`, `+02:00`, `Europe/Paris`).
    pub timezone: String,
    /// The missed-tick policy (`latest`, `skip`, `all(N)`).
    pub missed_ticks: String,
    /// Every tick at or before this time has been handled (enqueued or skipped).
    pub watermark: DateTime<Utc>,
    /// The latest tick enqueued, if any.
    pub last_tick: Option<DateTime<Utc>>,
    /// The worker that enqueued it.
    pub last_worker_id: Option<String>,
    /// The next tick, as computed by the worker that last wrote the row.
    pub next_tick: Option<DateTime<Utc>>,
    /// When a worker last started with this definition.
    pub declared_at: DateTime<Utc>,
    /// When the row was created.
    pub created_at: DateTime<Utc>,
    /// Last change.
    pub updated_at: DateTime<Utc>,
}

/// A worker process as recorded in `taskq_workers` (see [`Client::workers`]).
#[derive(Debug, Clone, Serialize)]
pub struct WorkerInfo {
    /// The worker id (as recorded on the tasks it claims).
    pub id: String,
    /// Host name of the machine it runs on.
    pub host: String,
    /// Its process id on that host.
    pub pid: u32,
    /// The queues it works, with the concurrency of each.
    pub queues: std::collections::BTreeMap<String, usize>,
    /// Handlers it runs at once over all its queues.
    pub concurrency: u32,
    /// Its lease: it is alive while it was seen within this.
    #[serde(rename = "lease_ms", serialize_with = "duration_ms")]
    pub lease: std::time::Duration,
    /// How often it records itself (its heartbeat interval).
    #[serde(rename = "heartbeat_ms", serialize_with = "duration_ms")]
    pub heartbeat: std::time::Duration,
    /// When it started (database clock).
    pub started_at: DateTime<Utc>,
    /// When it last recorded itself (database clock): once per heartbeat interval while it
    /// runs; at shutdown for a stopped worker.
    pub last_seen_at: DateTime<Utc>,
    /// When it shut down gracefully (`None`: running, or gone without a goodbye).
    pub stopped_at: Option<DateTime<Utc>>,
    /// Not stopped, and seen within its lease (on the database clock). A worker that is not
    /// alive and not stopped crashed, was killed or lost the database; its running tasks
    /// return to pending once their leases expire.
    pub alive: bool,
    /// Tasks in state `running` claimed under this worker's id.
    pub running: u64,
}

/// A queue's rate limit: at most `max` tasks start in each window of `period`, across every
/// worker (see [`Client::set_queue_rate_limit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RateLimit {
    /// Most starts per window.
    pub max: u32,
    /// Length of a window. Windows are consecutive multiples of it on the database clock
    /// (since 1970-01-01 UTC): a period of one minute has windows starting on the minute.
    #[serde(rename = "period_ms", serialize_with = "duration_ms")]
    pub period: std::time::Duration,
}

/// A queue as [`Client::queues`] lists it: its controls (pause, limits) and how many of its
/// tasks are pending and running.
#[derive(Debug, Clone, Serialize)]
pub struct QueueInfo {
    /// Queue name.
    pub queue: String,
    /// When it was paused, if it is.
    pub paused_at: Option<DateTime<Utc>>,
    /// Its concurrency limit across all workers, if any ([`Client::set_queue_limit`]).
    pub concurrency_limit: Option<u32>,
    /// Its rate limit across all workers, if any ([`Client::set_queue_rate_limit`]).
    pub rate_limit: Option<RateLimit>,
    /// Tasks started (claimed) in the current rate window; 0 without a rate limit.
    pub rate_used: u64,
    /// Tasks pending (due or scheduled).
    pub pending: u64,
    /// Tasks running (including those whose lease expired and that the reaper has not
    /// returned yet: they still count against the concurrency limit).
    pub running: u64,
}

fn duration_ms<S: serde::Serializer>(
    d: &std::time::Duration,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_u64(d.as_millis() as u64)
}

impl Client {
    /// A client on `pool`.
    pub fn new(pool: MySqlPool) -> Self {
        Self {
            store: Store::new(pool),
            actor: history::DEFAULT_ACTOR.into(),
        }
    }

    /// This client with `actor` as the "who" of the actions it records in the audit trail
    /// (default `"client"`; the CLI uses `cli:<user>@<host>`). Cut to
    /// [`MAX_ACTOR_LEN`](crate::limits::MAX_ACTOR_LEN) characters.
    pub fn with_actor(mut self, actor: impl Into<String>) -> Self {
        self.actor = history::cut(&actor.into(), history::MAX_ACTOR_LEN).into();
        self
    }

    /// The actor recorded with this client's actions.
    pub fn actor(&self) -> &str {
        &self.actor
    }

    /// Runs `a` in the audit trail on `tx` and commits it.
    async fn commit_audited(
        &self,
        mut tx: sqlx::Transaction<'static, sqlx::MySql>,
        a: &Action,
    ) -> Result<()> {
        self.db(history::insert(&mut tx, &self.actor, a).await)
            .await?;
        self.db(tx.commit().await).await
    }

    /// Records `a` in a transaction of its own (bulk operations: one entry with the totals).
    async fn record(&self, a: &Action) -> Result<()> {
        let tx = self.db(self.store.pool().begin().await).await?;
        self.commit_audited(tx, a).await
    }

    /// The pool this client uses.
    pub fn pool(&self) -> &MySqlPool {
        self.store.pool()
    }

    /// A task by id; [`Error::NotFound`] when it does not exist (or was pruned).
    pub async fn get(&self, id: TaskId) -> Result<TaskInfo> {
        self.db(self.store.task_get(id).await)
            .await?
            .ok_or(Error::NotFound(id))
    }

    /// Tasks matching `filter`, ordered by id (ascending, or descending with
    /// [`ListFilter::newest_first`]): a keyset page, never an `OFFSET` scan.
    ///
    /// With a queue but no state, a page first walks at most [`Self::LIST_PROBE_IDS`] ids of
    /// the primary key from the cursor (enough for a big queue, whose tasks come often), then,
    /// if the page is not full, reads the rest through the claim index's entries of that queue
    /// (covering, so a small queue costs little however big the table). Other filters walk
    /// the primary key (with a name, the optimizer may use the `(name, ...)` index instead).
    pub async fn list(&self, filter: &ListFilter) -> Result<Vec<TaskInfo>> {
        let limit = filter.limit.unwrap_or(100).clamp(1, 10_000);
        let f = filter.store();
        if let (Some(queue), None) = (f.queue, f.state) {
            return self.list_queue(&f, queue, filter, limit).await;
        }
        if filter.newest_first {
            let before = filter.after_id.map_or(u64::MAX, |i| i.0);
            return self
                .db(self.store.task_list_desc(&f, before, 0, limit).await)
                .await;
        }
        let after = filter.after_id.map_or(0, |i| i.0);
        self.db(self.store.task_list(&f, after, u64::MAX, limit).await)
            .await
    }

    /// Most ids of the primary key [`list`](Self::list) walks for a queue filter without a
    /// state before it turns to the claim index.
    pub const LIST_PROBE_IDS: u64 = 5_000;

    /// [`list`](Self::list) with a queue and no state: a bounded primary-key walk from the
    /// cursor, then the claim index for the ids beyond it (keyset order kept: every id the
    /// walk covers lies on the cursor's side of every id the index read returns).
    async fn list_queue(
        &self,
        f: &TaskFilter<'_>,
        queue: &str,
        filter: &ListFilter,
        limit: u32,
    ) -> Result<Vec<TaskInfo>> {
        let (lo, hi) = self.db(self.store.task_id_bounds().await).await?;
        if filter.newest_first {
            // Ids below `before`, from the newest existing one down.
            let before = filter
                .after_id
                .map_or(u64::MAX, |i| i.0)
                .min(hi.saturating_add(1));
            let floor = before.saturating_sub(Self::LIST_PROBE_IDS);
            let mut rows = self
                .db(self.store.task_list_desc(f, before, floor, limit).await)
                .await?;
            if (rows.len() as u32) < limit && floor > lo {
                let rest = limit - rows.len() as u32;
                let more = self.store.task_list_queue_desc(queue, f.name, floor, rest);
                rows.extend(self.db(more.await).await?);
            }
            return Ok(rows);
        }
        // Ids above `after`, from the oldest existing one up.
        let after = filter.after_id.map_or(0, |i| i.0).max(lo.saturating_sub(1));
        let up_to = after.saturating_add(Self::LIST_PROBE_IDS);
        let mut rows = self
            .db(self.store.task_list(f, after, up_to, limit).await)
            .await?;
        if (rows.len() as u32) < limit && up_to < hi {
            let rest = limit - rows.len() as u32;
            let more = self.store.task_list_queue_asc(queue, f.name, up_to, rest);
            rows.extend(self.db(more.await).await?);
        }
        Ok(rows)
    }

    /// Tasks that reached a terminal state per minute over the last `minutes` minutes
    /// (1 to 1,440; database clock), from `finished_at`: one entry per state and minute with
    /// at least one task, minute 0 being the last 60 seconds. Tasks already deleted by
    /// retention or purge are not counted. Reads the `(state, finished_at)` index only, so it
    /// costs in proportion to the tasks finished in the window.
    pub async fn finished_per_minute(&self, minutes: u32) -> Result<Vec<FinishedPerMinute>> {
        let minutes = minutes.clamp(1, 1_440);
        let rows = self
            .db(self.store.task_finished_per_minute(minutes).await)
            .await?;
        Ok(rows
            .into_iter()
            .map(|(state, minutes_ago, count)| FinishedPerMinute {
                state,
                minutes_ago,
                count,
            })
            .collect())
    }

    /// Attempts that failed per outcome and minute over the last `minutes` minutes (1 to 60;
    /// database clock), from the attempt history (`finished_at` and `outcome` of each entry):
    /// one entry per outcome and minute with at least one attempt, minute 0 being the last 60
    /// seconds. The outcomes counted are `failed`, `timed_out` and `panicked` (the handler
    /// failed) and `lease_lost` (the worker stopped renewing its lease; the minute is when the
    /// reaper took the task back). Snoozed, released, canceled and succeeded attempts are not
    /// counted.
    ///
    /// Bounded work: it reads the attempt history of the pending and running tasks due after
    /// the window's start (through the claim index; a failed attempt moves its task's
    /// `run_at` to at least its end) and of the tasks finished in the window (through the
    /// `(state, finished_at)` index), not the whole table. Not counted: attempts of tasks
    /// already deleted by retention or purge; attempts dropped from a history longer than
    /// [`MAX_ATTEMPT_ENTRIES`](crate::history::MAX_ATTEMPT_ENTRIES); and those of a pending
    /// task that [`reschedule_at`](Self::reschedule_at) moved to before the window.
    pub async fn failed_attempts_per_minute(&self, minutes: u32) -> Result<Vec<AttemptsPerMinute>> {
        let minutes = minutes.clamp(1, 60);
        let rows = self
            .db(self.store.task_failed_attempts_per_minute(minutes).await)
            .await?;
        Ok(rows
            .into_iter()
            .map(|(outcome, minutes_ago, count)| AttemptsPerMinute {
                outcome: AttemptOutcome::from_name(&outcome),
                minutes_ago,
                count,
            })
            .collect())
    }

    /// Number of tasks matching `filter` (`after_id` and `limit` are ignored).
    pub async fn count(&self, filter: &ListFilter) -> Result<u64> {
        self.db(self.store.task_count(&filter.store()).await).await
    }

    /// Counts per queue and state, ordered by queue then state ([`TaskState::ALL`]'s order),
    /// exact, with the earliest `lease_until` of the running tasks:
    /// [`stats_active`](Self::stats_active), the running rows' leases and
    /// [`stats_terminal`](Self::stats_terminal), on one connection (three consistent reads,
    /// not one snapshot). The terminal counts read every terminal task's index entry, so this
    /// costs in proportion to the table; prefer `stats_active` where pending and running are
    /// enough.
    pub async fn stats(&self) -> Result<Vec<QueueStateCount>> {
        let mut conn = self.db(self.store.pool().acquire().await).await?;
        self.db(self.store.task_stats(&mut conn).await).await
    }

    /// Counts per queue of the `pending` and `running` tasks, exact, with the oldest `run_at`
    /// (`earliest_lease_until` is always `None` here: it needs the running rows; [`stats`](Self::stats)
    /// reads them). Reads only the claim index's entries of those two states, so it costs in
    /// proportion to the backlog, not to the table. Unordered.
    pub async fn stats_active(&self) -> Result<Vec<QueueStateCount>> {
        let mut conn = self.db(self.store.pool().acquire().await).await?;
        self.db(self.store.task_stats_active(&mut conn).await).await
    }

    /// Counts per queue of the tasks in terminal states (`succeeded`, `dead`, `canceled`,
    /// `expired`; those retention has not deleted yet), exact, with the oldest `run_at`. A
    /// covering read of every terminal task's claim-index entry: in proportion to the table
    /// (about 0.2 to 0.5 s per million tasks), so cache it rather than call it per page view.
    /// Unordered.
    pub async fn stats_terminal(&self) -> Result<Vec<QueueStateCount>> {
        let mut conn = self.db(self.store.pool().acquire().await).await?;
        self.db(self.store.task_stats_terminal(&mut conn).await)
            .await
    }

    /// Pending tasks per queue and task name (of `queue` only, when given), ordered by queue and
    /// name: the way to spot tasks whose name no running worker handles (they stay pending).
    /// Reads every pending row's index entry (one covering scan), so it costs in proportion to
    /// the pending backlog.
    pub async fn pending_by_name(&self, queue: Option<&str>) -> Result<Vec<PendingNameCount>> {
        Ok(self.store.task_pending_by_name(queue).await?)
    }

    /// Cancels a task.
    ///
    /// * Pending: canceled at once (a unique task frees its identity): [`Canceled::Now`].
    /// * Running: a cancel request is recorded: [`Canceled::Requested`]. The worker holding the
    ///   task learns of it at its next heartbeat, fires the handler's
    ///   [`CancelSignal`](crate::CancelSignal) with [`CancelReason::Canceled`](crate::CancelReason::Canceled),
    ///   aborts it after the cancel grace, and writes `canceled` (fenced by the lease epoch,
    ///   freeing a unique identity). A handler that returns an error or snoozes within the
    ///   grace still ends `canceled`; one that *succeeds* within the grace is recorded
    ///   `succeeded` (its work is done). If the worker dies meanwhile, the reaper turns the
    ///   expired lease into `canceled`, never `pending`. If the attempt's outcome was a retry
    ///   written just before the worker saw the request, the request stays on the row and the
    ///   next attempt is canceled at its first heartbeat.
    ///
    /// Terminal tasks give [`Error::WrongState`], unknown ids [`Error::NotFound`].
    pub async fn cancel(&self, id: TaskId) -> Result<Canceled> {
        let mut tx = self.db(self.store.pool().begin().await).await?;
        if self.db(self.store.task_cancel(&mut tx, id).await).await? {
            self.commit_audited(tx, &Action::task("cancel", id, None))
                .await?;
            crate::metrics::canceled();
            return Ok(Canceled::Now);
        }
        if self
            .db(self.store.task_request_cancel(&mut tx, id).await)
            .await?
        {
            self.commit_audited(tx, &Action::task("cancel_requested", id, None))
                .await?;
            return Ok(Canceled::Requested);
        }
        drop(tx);
        Err(self.state_error(id, "pending or running").await)
    }

    /// Moves the due time of a task that has not started to `delay` from now (database clock):
    /// [`Duration::ZERO`](std::time::Duration::ZERO) makes it due at once. Nothing else
    /// changes (attempts, priority, deadline: a task rescheduled past its deadline expires
    /// when it comes due). A delay over [`MAX_DELAY`](crate::limits::MAX_DELAY) is
    /// [`Error::InvalidSchedule`]; running and terminal tasks give [`Error::WrongState`],
    /// unknown ids [`Error::NotFound`]. Workers see the change at their next poll.
    pub async fn reschedule(&self, id: TaskId, delay: std::time::Duration) -> Result<()> {
        let delay_us = crate::enqueue::validate_schedule(delay, None)?;
        let detail = serde_json::json!({ "delay_ms": delay.as_millis() as u64 });
        self.reschedule_audited(id, None, delay_us, detail).await
    }

    /// Like [`reschedule`](Self::reschedule), to an absolute time (between 1970 and 10 years
    /// ahead, else [`Error::InvalidSchedule`]); a time in the past makes the task due at once.
    pub async fn reschedule_at(&self, id: TaskId, at: DateTime<Utc>) -> Result<()> {
        crate::enqueue::validate_schedule(std::time::Duration::ZERO, Some(at))?;
        let detail = serde_json::json!({ "at": at });
        self.reschedule_audited(id, Some(at), 0, detail).await
    }

    async fn reschedule_audited(
        &self,
        id: TaskId,
        at: Option<DateTime<Utc>>,
        delay_us: i64,
        detail: serde_json::Value,
    ) -> Result<()> {
        let mut tx = self.db(self.store.pool().begin().await).await?;
        let done = self.store.task_reschedule(&mut tx, id, at, delay_us).await;
        if self.db(done).await? {
            return self
                .commit_audited(tx, &Action::task("reschedule", id, Some(detail)))
                .await;
        }
        drop(tx);
        Err(self.state_error(id, "pending").await)
    }

    /// Sets the priority of a task that has not started (lower runs first). Running and
    /// terminal tasks give [`Error::WrongState`], unknown ids [`Error::NotFound`].
    pub async fn set_priority(&self, id: TaskId, priority: i16) -> Result<()> {
        let mut tx = self.db(self.store.pool().begin().await).await?;
        let done = self.store.task_set_priority(&mut tx, id, priority).await;
        if self.db(done).await? {
            let detail = serde_json::json!({ "priority": priority });
            return self
                .commit_audited(tx, &Action::task("priority", id, Some(detail)))
                .await;
        }
        drop(tx);
        Err(self.state_error(id, "pending").await)
    }

    /// Pauses `queue`: workers stop claiming from it within about a second (running tasks
    /// finish normally; enqueues still work). Idempotent.
    pub async fn pause_queue(&self, queue: &str) -> Result<()> {
        crate::enqueue::validate_name("queue", queue, crate::enqueue::MAX_QUEUE_LEN)?;
        let mut tx = self.db(self.store.pool().begin().await).await?;
        self.db(self.store.queue_pause(&mut tx, queue).await)
            .await?;
        let a = Action::queue("pause", Some(queue), serde_json::Value::Null);
        self.commit_audited(tx, &Action { detail: None, ..a }).await
    }

    /// Resumes a paused queue; returns whether it was paused.
    pub async fn resume_queue(&self, queue: &str) -> Result<bool> {
        let mut tx = self.db(self.store.pool().begin().await).await?;
        let was_paused = self
            .db(self.store.queue_resume(&mut tx, queue).await)
            .await?;
        if was_paused {
            let a = Action::queue("resume", Some(queue), serde_json::Value::Null);
            self.commit_audited(tx, &Action { detail: None, ..a })
                .await?;
        }
        crate::wake::notify(queue);
        Ok(was_paused)
    }

    /// Paused queues and when each was paused.
    pub async fn paused_queues(&self) -> Result<Vec<(String, DateTime<Utc>)>> {
        let mut conn = self.db(self.store.pool().acquire().await).await?;
        self.db(self.store.queues_paused(&mut conn).await).await
    }

    /// Sets the concurrency limit of `queue` across every worker (`Some(n)`, 1 ..=
    /// [`MAX_QUEUE_LIMIT`]), or clears it (`None`). Stored in the database, so it holds for
    /// the whole fleet and changes without restarting workers:
    ///
    /// * a claim of a limited queue locks the queue's row, counts the queue's running tasks
    ///   and claims at most the difference, so the running tasks of the queue never exceed
    ///   the limit. Tasks whose lease expired but which the reaper has not returned yet still
    ///   count (they may still be running).
    /// * Each worker learns that a queue has become limited (or no longer is) when it
    ///   re-reads `taskq_queues`, once per poll ceiling (1 s by default): until then a worker
    ///   that saw the queue unlimited claims without looking at the limit. Set the limit before
    ///   starting workers, or allow that interval, for it to hold from the start. A change of
    ///   the number on an already limited queue is read by the next claim.
    /// * Lowering the limit below the running count stops nothing: those tasks finish, and
    ///   the queue starts nothing new until it is under the limit.
    ///
    /// A limit of 0 or above [`MAX_QUEUE_LIMIT`] is [`Error::InvalidOption`] (to stop a queue,
    /// [`pause_queue`](Self::pause_queue)); nothing is written then. Clearing a queue without
    /// a limit is a no-op.
    pub async fn set_queue_limit(&self, queue: &str, limit: Option<u32>) -> Result<()> {
        crate::enqueue::validate_name("queue", queue, crate::enqueue::MAX_QUEUE_LEN)?;
        if let Some(n) = limit
            && !(1..=MAX_QUEUE_LIMIT).contains(&n)
        {
            return Err(Error::InvalidOption(format!(
                "concurrency limit of queue {queue:?} must be between 1 and {MAX_QUEUE_LIMIT}, got {n} (to stop the queue, pause it)"
            )));
        }
        self.db(self.store.queue_set_limit(queue, limit).await)
            .await
    }

    /// Sets the rate limit of `queue` across every worker: at most `max` tasks start in each
    /// window of `period` (`Some((max, period))`), or clears it (`None`).
    ///
    /// Windows are consecutive multiples of `period` on the database clock (a one-minute
    /// period has windows starting on the minute); a claim counts in the window of its claim
    /// statement and takes no more than the window has left, so no window holds more than
    /// `max` starts. As with any fixed window, up to `2 × max` can start within one period
    /// that straddles a window boundary. A task starts running a few milliseconds after its
    /// claim, so its handler may begin in the next window. Learned by workers like
    /// [`set_queue_limit`](Self::set_queue_limit) (within the poll ceiling). Changing `max`
    /// keeps the current window's count; changing `period` starts counting afresh.
    ///
    /// `max` of 0 or above [`MAX_QUEUE_LIMIT`], or a period shorter than [`MIN_RATE_PERIOD`]
    /// or longer than [`MAX_RATE_PERIOD`], is [`Error::InvalidOption`]; nothing is written.
    pub async fn set_queue_rate_limit(
        &self,
        queue: &str,
        rate: Option<(u32, std::time::Duration)>,
    ) -> Result<()> {
        crate::enqueue::validate_name("queue", queue, crate::enqueue::MAX_QUEUE_LEN)?;
        let rate = match rate {
            None => None,
            Some((max, period)) => {
                if !(1..=MAX_QUEUE_LIMIT).contains(&max) {
                    return Err(Error::InvalidOption(format!(
                        "rate limit of queue {queue:?} must allow between 1 and {MAX_QUEUE_LIMIT} starts per period, got {max}"
                    )));
                }
                if !(MIN_RATE_PERIOD..=MAX_RATE_PERIOD).contains(&period) {
                    return Err(Error::InvalidOption(format!(
                        "rate limit period of queue {queue:?} must be between 1 ms and 366 days, got {period:?}"
                    )));
                }
                Some((max, period.as_micros() as i64))
            }
        };
        self.db(self.store.queue_set_rate_limit(queue, rate).await)
            .await
    }

    /// Every queue that has pending or running tasks, or that was ever paused or limited, by
    /// name: whether it is paused, its limits, the starts counted in its current rate window,
    /// and its pending and running counts. Two statements; the counts read every pending and
    /// running task's index entry, so they cost in proportion to the backlog.
    pub async fn queues(&self) -> Result<Vec<QueueInfo>> {
        let rows = self.db(self.store.queue_list().await).await?;
        Ok(rows
            .into_iter()
            .map(|r| QueueInfo {
                queue: r.queue,
                paused_at: r.paused_at,
                concurrency_limit: r.concurrency_limit,
                rate_limit: r.rate.map(|(max, us)| RateLimit {
                    max,
                    period: std::time::Duration::from_micros(us as u64),
                }),
                rate_used: r.rate_used,
                pending: r.pending,
                running: r.running,
            })
            .collect())
    }

    /// The workers recorded in the database, oldest start first: the live ones (see
    /// [`WorkerInfo::alive`]) and those stopped or gone within
    /// [`WORKER_ROW_RETENTION`](crate::limits::WORKER_ROW_RETENTION), each with the number of tasks it
    /// is running. One statement (a `GROUP BY` over the running tasks).
    pub async fn workers(&self) -> Result<Vec<WorkerInfo>> {
        let rows = self.db(self.store.worker_list().await).await?;
        Ok(rows
            .into_iter()
            .map(|r| WorkerInfo {
                queues: serde_json::from_str(&r.queues).unwrap_or_default(),
                id: r.worker_id,
                host: r.host,
                pid: r.pid,
                concurrency: r.concurrency,
                lease: std::time::Duration::from_micros(r.lease_us),
                heartbeat: std::time::Duration::from_micros(r.heartbeat_us),
                started_at: r.started_at,
                last_seen_at: r.last_seen_at,
                stopped_at: r.stopped_at,
                alive: r.alive,
                running: r.running.max(0) as u64,
            })
            .collect())
    }

    /// Every recurring schedule recorded in the database, by name.
    pub async fn schedules(&self) -> Result<Vec<ScheduleInfo>> {
        Ok(self.store.schedule_list().await?)
    }

    /// Deletes a schedule's row (e.g. one removed from the code, whose row stays behind);
    /// returns whether it existed. A worker that still declares the schedule writes it again
    /// within its next wake-up, with its ticks starting afresh from then.
    pub async fn delete_schedule(&self, name: &str) -> Result<bool> {
        let mut tx = self.db(self.store.pool().begin().await).await?;
        let deleted = self
            .db(self.store.schedule_delete(&mut tx, name).await)
            .await?;
        if deleted {
            let detail = serde_json::json!({ "schedule": name });
            self.commit_audited(tx, &Action::queue("schedule_delete", None, detail))
                .await?;
        }
        Ok(deleted)
    }

    /// Moves a dead task back to pending with its attempts reset. A unique task takes its
    /// identity back; if another task holds it (enqueued after this one died), nothing changes
    /// and the error is [`Error::UniqueHeld`] naming that task.
    pub async fn retry_dead(&self, id: TaskId) -> Result<()> {
        let mut tx = self.db(self.store.pool().begin().await).await?;
        match self
            .db(self.store.task_retry_dead(&mut tx, id).await)
            .await?
        {
            RetryDead::Retried => {
                self.commit_audited(tx, &Action::task("retry", id, None))
                    .await
            }
            RetryDead::IdentityHeld(holder) => Err(Error::UniqueHeld { id, holder }),
            RetryDead::NotDead => {
                drop(tx);
                Err(self.state_error(id, "dead").await)
            }
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
            Err(e) => crate::error::db_error(self.store.pool(), e).await,
        }
    }

    /// A database result with its error made readable (see [`Error::Connect`]).
    pub(crate) async fn db<T>(&self, r: sqlx::Result<T>) -> Result<T> {
        match r {
            Ok(v) => Ok(v),
            Err(e) => Err(crate::error::db_error(self.store.pool(), e).await),
        }
    }

    /// Rows changed per statement by the bulk operations ([`Client::retry_all_dead`],
    /// [`Client::purge`]): small, so each statement holds its row locks only briefly.
    pub const BATCH: u32 = 500;

    /// The database clock now (`UTC_TIMESTAMP(6)`): the clock every stored time comes from,
    /// so ages and lease expiries should be computed against it, not the local clock.
    pub async fn db_now(&self) -> Result<DateTime<Utc>> {
        self.db(self.store.db_now().await).await
    }

    /// Moves every dead task (of `queue`, or of all queues when `None`) back to pending with
    /// its attempts reset and its epoch incremented, in batches of [`Client::BATCH`] rows
    /// (one short statement each). Tasks that die again while this runs are left dead. Unique
    /// tasks are retried one statement each, like [`Client::retry_dead`]; one whose identity
    /// another task holds now is left dead (and logged). Returns how many tasks were moved.
    pub async fn retry_all_dead(&self, queue: Option<&str>) -> Result<u64> {
        let mut total = 0;
        let res = self.retry_all_dead_run(queue, &mut total).await;
        let detail = serde_json::json!({ "queue": queue, "retried": total });
        self.record_bulk("bulk_retry", queue, detail, total, res)
            .await?;
        Ok(total)
    }

    /// The statements of [`Client::retry_all_dead`], counting into `total`.
    async fn retry_all_dead_run(&self, queue: Option<&str>, total: &mut u64) -> Result<()> {
        let started = self.db(self.store.db_now().await).await?;
        loop {
            let n = self
                .db(self
                    .store
                    .task_retry_dead_batch(queue, started, Self::BATCH)
                    .await)
                .await?;
            *total += n;
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
                match self.db(self.retry_dead_one(id).await).await? {
                    RetryDead::Retried => *total += 1,
                    RetryDead::NotDead => {}
                    RetryDead::IdentityHeld(holder) => tracing::warn!(
                        task_id = %id, holder = %holder,
                        "taskq: dead task left dead: its unique identity is held by a newer task"
                    ),
                }
            }
            match ids.last() {
                Some(last) if ids.len() == Self::BATCH as usize => after = last.0,
                _ => return Ok(()),
            }
        }
    }

    /// [`Store::task_retry_dead`] in a transaction of its own (bulk retries: their audit
    /// entry is the bulk operation's).
    async fn retry_dead_one(&self, id: TaskId) -> sqlx::Result<RetryDead> {
        let mut tx = self.store.pool().begin().await?;
        let r = self.store.task_retry_dead(&mut tx, id).await?;
        tx.commit().await?;
        Ok(r)
    }

    /// Records a bulk operation that changed `changed` rows (nothing when none) and returns
    /// `res`: an operation interrupted by an error is recorded with what it did so far and
    /// `"incomplete": true`.
    async fn record_bulk(
        &self,
        action: &'static str,
        queue: Option<&str>,
        mut detail: serde_json::Value,
        changed: u64,
        res: Result<()>,
    ) -> Result<()> {
        if changed == 0 {
            return res;
        }
        if res.is_err() {
            detail["incomplete"] = true.into();
        }
        let recorded = self.record(&Action::queue(action, queue, detail)).await;
        res.and(recorded)
    }

    /// Cancels every task matching `filter`, in batches of [`Client::BATCH`] rows (one short
    /// statement, or transaction, each): pending ones at once (freeing unique identities, like
    /// [`Client::cancel`]), running ones by a cancel request (see [`Client::cancel`]). With
    /// `dry_run`, changes nothing and returns how many tasks match. A `state` other than
    /// `pending`/`running` is [`Error::InvalidOption`]. Tasks enqueued while it runs may or
    /// may not be included.
    pub async fn cancel_where(&self, filter: &BulkFilter, dry_run: bool) -> Result<BulkCanceled> {
        let states: &[TaskState] = match filter.state {
            None => &[TaskState::Pending, TaskState::Running],
            Some(TaskState::Pending) => &[TaskState::Pending],
            Some(TaskState::Running) => &[TaskState::Running],
            Some(s) => {
                return Err(Error::InvalidOption(format!(
                    "cannot cancel {s} tasks: only pending or running ones"
                )));
            }
        };
        let mut out = BulkCanceled::default();
        let res = self
            .cancel_where_run(filter, states, dry_run, &mut out)
            .await;
        if !dry_run {
            crate::metrics::canceled_n(out.canceled);
            let mut detail = filter.detail();
            detail["canceled"] = out.canceled.into();
            detail["cancel_requested"] = out.requested.into();
            let changed = out.canceled + out.requested;
            let queue = filter.queue.as_deref();
            self.record_bulk("bulk_cancel", queue, detail, changed, res)
                .await?;
        } else {
            res?;
        }
        Ok(out)
    }

    /// The statements of [`Client::cancel_where`], counting into `out`.
    async fn cancel_where_run(
        &self,
        filter: &BulkFilter,
        states: &[TaskState],
        dry_run: bool,
        out: &mut BulkCanceled,
    ) -> Result<()> {
        let age_us = filter.age_us();
        for &state in states {
            let f = filter.store(state);
            let n = if dry_run {
                self.db(self.store.task_bulk_count(&f, age_us).await)
                    .await?
            } else {
                let mut after = 0;
                loop {
                    let batch = self
                        .db(self
                            .store
                            .task_bulk_ids(&f, age_us, after, Self::BATCH)
                            .await)
                        .await?;
                    let ids: Vec<u64> = batch.iter().map(|(id, _)| *id).collect();
                    if let Some(&last) = ids.last() {
                        if state == TaskState::Pending {
                            out.canceled +=
                                self.db(self.store.task_cancel_batch(&ids).await).await?;
                        } else {
                            out.requested += self
                                .db(self.store.task_request_cancel_batch(&ids).await)
                                .await?;
                        }
                        after = last;
                    }
                    if ids.len() < Self::BATCH as usize {
                        break;
                    }
                }
                continue;
            };
            if state == TaskState::Pending {
                out.canceled = n;
            } else {
                out.requested = n;
            }
        }
        Ok(())
    }

    /// Moves every dead task matching `filter` back to pending (attempts reset, epoch
    /// incremented), in batches of [`Client::BATCH`] rows; a unique task is retried one
    /// statement each like [`Client::retry_dead`] and left dead (logged) when its identity is
    /// held by another task. With `dry_run`, changes nothing and returns how many dead tasks
    /// match. A `state` other than `dead` is [`Error::InvalidOption`]. Returns how many tasks
    /// were moved.
    pub async fn retry_where(&self, filter: &BulkFilter, dry_run: bool) -> Result<u64> {
        if let Some(s) = filter.state.filter(|s| *s != TaskState::Dead) {
            return Err(Error::InvalidOption(format!(
                "cannot retry {s} tasks: only dead ones"
            )));
        }
        let f = filter.store(TaskState::Dead);
        let age_us = filter.age_us();
        if dry_run {
            return self.db(self.store.task_bulk_count(&f, age_us).await).await;
        }
        let mut total = 0;
        let res = self.retry_where_run(&f, age_us, &mut total).await;
        let mut detail = filter.detail();
        detail["retried"] = total.into();
        let queue = filter.queue.as_deref();
        self.record_bulk("bulk_retry", queue, detail, total, res)
            .await?;
        Ok(total)
    }

    /// The statements of [`Client::retry_where`], counting into `total`.
    async fn retry_where_run(
        &self,
        f: &TaskFilter<'_>,
        age_us: i64,
        total: &mut u64,
    ) -> Result<()> {
        let mut after = 0;
        loop {
            let batch = self
                .db(self
                    .store
                    .task_bulk_ids(f, age_us, after, Self::BATCH)
                    .await)
                .await?;
            let plain: Vec<u64> = batch.iter().filter(|b| !b.1).map(|b| b.0).collect();
            if !plain.is_empty() {
                *total += self
                    .db(self.store.task_retry_dead_ids(&plain).await)
                    .await?;
            }
            for &(id, _) in batch.iter().filter(|b| b.1) {
                match self.db(self.retry_dead_one(TaskId(id)).await).await? {
                    RetryDead::Retried => *total += 1,
                    RetryDead::NotDead => {}
                    RetryDead::IdentityHeld(holder) => tracing::warn!(
                        task_id = id, holder = %holder,
                        "taskq: dead task left dead: its unique identity is held by a newer task"
                    ),
                }
            }
            match batch.last() {
                Some(&(last, _)) if batch.len() == Self::BATCH as usize => after = last,
                _ => return Ok(()),
            }
        }
    }

    /// How many tasks [`purge`](Self::purge) with the same arguments would delete now (its
    /// dry run; a non-terminal `state` gives [`Error::InvalidOption`]).
    pub async fn purge_count(
        &self,
        state: Option<TaskState>,
        older_than: std::time::Duration,
    ) -> Result<u64> {
        let mut total = 0;
        for s in purge_states(state)? {
            total += self
                .db(self.store.task_prune_count(s, older_than.as_secs()).await)
                .await?;
        }
        Ok(total)
    }

    /// Deletes terminal tasks (`succeeded`, `dead`, `canceled`, `expired`; only `state` when given) that
    /// finished more than `older_than` ago (whole seconds, database clock), in batches of
    /// [`Client::BATCH`] rows. A non-terminal `state` gives [`Error::InvalidOption`]. Returns
    /// how many tasks were deleted.
    pub async fn purge(
        &self,
        state: Option<TaskState>,
        older_than: std::time::Duration,
    ) -> Result<u64> {
        let states = purge_states(state)?;
        let age_secs = older_than.as_secs();
        let mut total = 0;
        let res = self.purge_run(&states, age_secs, &mut total).await;
        let detail = serde_json::json!({
            "state": state, "older_than_secs": age_secs, "purged": total
        });
        self.record_bulk("purge", None, detail, total, res).await?;
        Ok(total)
    }

    /// The statements of [`Client::purge`], counting into `total`.
    async fn purge_run(&self, states: &[TaskState], age_secs: u64, total: &mut u64) -> Result<()> {
        let mut conn = self.db(self.store.pool().acquire().await).await?;
        for &s in states {
            loop {
                let n = self
                    .db(self
                        .store
                        .task_prune(&mut conn, s, age_secs, Self::BATCH)
                        .await)
                    .await?;
                *total += n;
                if n < u64::from(Self::BATCH) {
                    break;
                }
            }
        }
        Ok(())
    }
}

/// The states [`Client::purge`] deletes: `state`, which must be terminal, or every terminal one.
fn purge_states(state: Option<TaskState>) -> Result<Vec<TaskState>> {
    match state {
        Some(s) if !s.is_terminal() => Err(Error::InvalidOption(format!(
            "cannot purge {s} tasks: only terminal states (succeeded, dead, canceled, expired)"
        ))),
        Some(s) => Ok(vec![s]),
        None => Ok(TaskState::ALL
            .into_iter()
            .filter(|s| s.is_terminal())
            .collect()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
