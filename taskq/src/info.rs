//! What the [`Client`] reads: tasks, queues, schedules, workers, counts. Plain data, shared
//! by the client and the backends that produce it.

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::backend::TaskFilter;
#[allow(unused_imports)] // doc links
use crate::client::Client;
use crate::history::AttemptOutcome;
use crate::task::{TaskId, TaskState};

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
/// How the reaper's error text starts (written by SQL in `the reap statements`).
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
    pub(crate) fn store(&self) -> TaskFilter<'_> {
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
    /// Its lease: how long its tasks stay claimed after its last heartbeat.
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
    /// How long ago it last recorded itself (its last heartbeat, or its shutdown), on the
    /// database clock, when the list was read.
    #[serde(rename = "last_seen_ago_ms", serialize_with = "duration_ms")]
    pub last_seen_ago: std::time::Duration,
    /// Not stopped, and seen within two of its heartbeat intervals (and within 1 s at least),
    /// on the database clock: [`WorkerStatus::Alive`].
    pub alive: bool,
    /// Alive, lost (not stopped and not seen within two heartbeat intervals: it crashed, was
    /// killed, hangs, or cannot reach the database) or stopped.
    pub status: WorkerStatus,
    /// The task names it registers (`None`: recorded by a worker of an earlier version, taken
    /// as registering every name).
    pub names: Option<Vec<String>>,
    /// Tasks in state `running` claimed under this worker's id.
    pub running: u64,
}

impl WorkerInfo {
    pub(crate) fn from_row(r: crate::backend::WorkerListRow) -> Self {
        let status = if r.alive {
            WorkerStatus::Alive
        } else if r.stopped_at.is_some() {
            WorkerStatus::Stopped
        } else {
            WorkerStatus::Lost
        };
        Self {
            queues: serde_json::from_str(&r.queues).unwrap_or_default(),
            names: r.names.and_then(|n| serde_json::from_str(&n).ok()),
            id: r.worker_id,
            host: r.host,
            pid: r.pid,
            concurrency: r.concurrency,
            lease: std::time::Duration::from_micros(r.lease_us),
            heartbeat: std::time::Duration::from_micros(r.heartbeat_us),
            started_at: r.started_at,
            last_seen_at: r.last_seen_at,
            stopped_at: r.stopped_at,
            last_seen_ago: std::time::Duration::from_micros(r.seen_ago_us.max(0) as u64),
            alive: r.alive,
            status,
            running: r.running.max(0) as u64,
        }
    }

    /// Whether this worker would claim a task named `name` in `queue`: it works the queue
    /// and registers the name (a worker that recorded no names is taken to register all).
    pub fn handles(&self, queue: &str, name: &str) -> bool {
        self.queues.contains_key(queue)
            && self
                .names
                .as_ref()
                .is_none_or(|names| names.iter().any(|n| n == name))
    }
}

/// Where a worker recorded in `taskq_workers` stands (see [`WorkerInfo::status`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkerStatus {
    /// Not stopped, and seen within two heartbeat intervals.
    Alive,
    /// Not stopped, and not seen within two heartbeat intervals: crashed, killed, hung, or cut
    /// off from the database. Its running tasks stay claimed until their leases expire; then
    /// the reaper returns them to pending.
    Lost,
    /// Shut down gracefully.
    Stopped,
}

impl WorkerStatus {
    /// `alive`, `lost` or `stopped`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Alive => "alive",
            Self::Lost => "lost",
            Self::Stopped => "stopped",
        }
    }
}

impl std::fmt::Display for WorkerStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The rows of `pending` with due tasks that none of the alive `workers` would claim (see
/// [`WorkerInfo::handles`]).
pub(crate) fn unhandled(
    pending: Vec<PendingNameCount>,
    workers: &[WorkerInfo],
) -> Vec<PendingNameCount> {
    pending
        .into_iter()
        .filter(|p| {
            p.due > 0
                && !workers
                    .iter()
                    .any(|w| w.alive && w.handles(&p.queue, &p.name))
        })
        .collect()
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
