//! What the runtime reads back from a driver and hands to users as it is: a task row, counts
//! per queue and state or per name, a schedule row. Plain data; the rules that derive more
//! from a row (why a task is dead) are here too, once for every driver.

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::state::{TaskId, TaskState};

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
    /// A unique task's identity (hex SHA-256; see `taskq::unique::Unique`).
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
    /// Times a handler snoozed it (`TaskError::snooze`): runs that
    /// did not count as an attempt.
    pub snoozes: u32,
    /// No attempt starts at or after this time (database clock); past it the task ends
    /// `expired`. `None`: no deadline.
    pub deadline: Option<DateTime<Utc>>,
    /// When the latest attempt started (database clock); `None` if none has. The attempts
    /// that ended are in `Client::attempts`.
    pub attempted_at: Option<DateTime<Utc>>,
    /// The JSON text its handler returned with its success (`TaskContext::set_output`, or a
    /// `#[taskq::task]` fn's `Ok` value); `None` for `()`, and before it succeeded.
    #[serde(skip)]
    pub output: Option<String>,
}

impl TaskInfo {
    /// The payload decoded as JSON.
    pub fn payload_json(&self) -> std::result::Result<serde_json::Value, serde_json::Error> {
        serde_json::from_slice(&self.payload)
    }

    /// The output decoded as JSON; `None` when the task stored none.
    pub fn output_json(&self) -> Option<std::result::Result<serde_json::Value, serde_json::Error>> {
        self.output.as_deref().map(serde_json::from_str)
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
    ///    `TaskError::permanent`, possibly on its last attempt:
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
pub const UNDECODABLE_PREFIX: &str = "payload does not decode";
/// How the reaper's error text starts (written by SQL in `the reap statements`).
const LEASE_EXPIRED_PREFIX: &str = "lease expired (";

/// The note the worker appends to the error of a task whose last attempt failed.
pub fn exhausted_note(attempts: u32, max_attempts: u32) -> String {
    format!(" (attempts exhausted: {attempts}/{max_attempts})")
}

/// The `(attempts, max_attempts)` of an [`exhausted_note`] ending `error`.
fn parse_exhausted_note(error: &str) -> Option<(u32, u32)> {
    let rest = error.strip_suffix(')')?;
    let (_, counts) = rest.rsplit_once(" (attempts exhausted: ")?;
    let (n, m) = counts.split_once('/')?;
    Some((n.parse().ok()?, m.parse().ok()?))
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
/// schedules` shows it as overdue. `Client::delete_schedule` removes such a row.
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
