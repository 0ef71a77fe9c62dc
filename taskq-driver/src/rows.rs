//! The row types of the seam: what the worker, the client and enqueue pass to a driver and
//! get back. No SQL here; each driver maps them to its own statements.

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::state::{TaskId, TaskState};

/// A row to insert.
#[derive(Debug, Clone, Copy)]
pub struct NewTask<'a> {
    /// Queue name.
    pub queue: &'a str,
    /// Task name.
    pub name: &'a str,
    /// The payload (JSON bytes).
    pub payload: &'a [u8],
    /// Priority (lower runs first).
    pub priority: i16,
    /// Attempts allowed.
    pub max_attempts: u32,
    /// Microseconds from the database's now; ignored when `run_at` is set.
    pub delay_us: i64,
    /// Absolute due time; overrides `delay_us`.
    pub run_at: Option<DateTime<Utc>>,
    /// Absolute deadline; at most one of `deadline` and `ttl_us` is set.
    pub deadline: Option<DateTime<Utc>>,
    /// Deadline as microseconds from the database's now.
    pub ttl_us: Option<i64>,
    /// Idempotency key, if any.
    pub idempotency_key: Option<&'a str>,
    /// Trace context of the enqueuing request, if recorded.
    pub trace_context: Option<&'a str>,
    /// The unique identity, if any (`unique_key`, and the key of its `taskq_unique` row).
    pub unique_key: Option<&'a [u8]>,
    /// `unique_while`: `pending`, `running` or `window`; set with `unique_key`.
    pub unique_while: Option<&'static str>,
    /// For a window: its end, in microseconds since the Unix epoch on the database clock.
    pub unique_expires_us: Option<i64>,
}

/// The order of an ordered task (`Enqueue::task_insert_ordered`): tasks sharing a key run one
/// at a time, in the order their enqueues committed.
#[derive(Debug, Clone, Copy)]
pub struct OrderKey<'a> {
    /// The key: SHA-256 of the queue and the selected payload fields (32 bytes).
    pub key: &'a [u8],
    /// When the task dies, its key goes on with the next task (`ordered_dead_after`); otherwise
    /// the dead task holds its key until an operator retries or deletes it.
    pub dead_skips: bool,
}

/// An order key held back by its head (`Tasks::order_keys_held`): the head has failed at
/// least once and has not ended, or died and holds the key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HeldKey {
    /// The key, lowercase hex.
    pub order_key: String,
    /// The head's queue.
    pub queue: String,
    /// The head task.
    pub head: TaskId,
    /// The head's name.
    pub name: String,
    /// The head's state (`pending` for a retry, `running`, or `dead`).
    pub state: TaskState,
    /// Attempts the head has made.
    pub attempt: u32,
    /// The head's last error.
    pub last_error: Option<String>,
    /// Tasks of the key waiting behind the head.
    pub waiting: u64,
}

/// Outcome of `task_insert`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Inserted {
    /// Inserted; its id.
    New(TaskId),
    /// Not inserted: the task that already holds the key or identity.
    Duplicate(TaskId),
}

/// Filter for `task_list` and `task_count`; `None` matches everything.
#[derive(Default)]
pub struct TaskFilter<'a> {
    /// Only this queue.
    pub queue: Option<&'a str>,
    /// Only this state.
    pub state: Option<TaskState>,
    /// Only this task name.
    pub name: Option<&'a str>,
}

/// Which pending tasks `Tasks::task_list_pending` lists (the dashboard's views).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PendingKind {
    /// Due later (`run_at` after the database's now): enqueued with a delay or a due time,
    /// snoozed, rescheduled, or waiting for a later attempt after a failed one (those are
    /// [`Retrying`](Self::Retrying) too; their attempt count tells them apart). Read from the
    /// claim index alone, so a page costs little however big the backlog.
    Scheduled,
    /// At least one attempt made (`attempt > 0`): waiting for the next one, due or not.
    Retrying,
}

impl PendingKind {
    /// `scheduled` or `retrying`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Scheduled => "scheduled",
            Self::Retrying => "retrying",
        }
    }
}

/// Outcome of `Store::task_retry_dead`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryDead {
    /// Moved back to pending.
    Retried,
    /// The task does not exist or is not dead.
    NotDead,
    /// Another task holds the dead task's unique identity.
    IdentityHeld(TaskId),
}

/// A task as claimed by a worker (values after the claim).
pub struct Claimed {
    /// Task id.
    pub id: u64,
    /// Task name.
    pub name: String,
    /// The payload (JSON bytes).
    pub payload: Vec<u8>,
    /// Attempt number of this run (already incremented).
    pub attempt: u32,
    /// Attempts allowed.
    pub max_attempts: u32,
    /// Snoozes so far (before this run).
    pub snoozes: u32,
    /// Fencing token of this run (already incremented).
    pub lease_epoch: u64,
    /// How long the task waited after it was due, on the database clock (µs).
    pub wait_us: i64,
    /// Trace context of the enqueuing request, if recorded.
    pub trace_context: Option<String>,
    /// The task's unique identity, if it is unique.
    pub unique_key: Option<Vec<u8>>,
    /// Its `unique_while` (`pending`, `running` or `window`).
    pub unique_while: Option<String>,
    /// The task's order key, if it is ordered.
    pub order_key: Option<Vec<u8>>,
    /// Whether its death lets its key go on (see [`OrderKey::dead_skips`]).
    pub order_dead_skips: bool,
    /// The workflow the task is a step of, if any (`Enqueue::workflow_insert`).
    pub workflow_id: Option<u64>,
    /// The batch the task is a member of, if any (`Enqueue::batch_insert`, `batch_add`).
    pub batch_id: Option<u64>,
    /// Set only when the task's attempts were already exhausted before this claim (`attempt >
    /// max_attempts` now): its last attempt's lease expired while no worker that registers its
    /// name was there to bury it, so a reaper that does not parked it back to pending (see
    /// `Store::task_lapsed`). Its `last_error`. The worker ends such a task dead without
    /// running it.
    pub parked_error: Option<String>,
}

/// Why a claim of a limited queue took fewer tasks than it asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitHit {
    /// How many the limits allowed this claim (fewer than asked for; may be zero).
    pub allowed: u32,
    /// The rate limit was the binding one: its window has no starts left after this claim;
    /// the next window opens in this many microseconds (database clock).
    pub rate_resets_in_us: Option<i64>,
}

/// A due task the claim found past its deadline and moved to `expired` instead of running.
pub struct ExpiredTask {
    /// Task id.
    pub id: u64,
    /// Task name.
    pub name: String,
    /// How long ago its deadline passed, on the database clock (µs).
    pub late_us: i64,
}

/// A due task the claim found with a cancel request left by an earlier attempt (see
/// `docs/semantics.md`, "Cancel"): moved to `canceled` instead of running.
pub struct CanceledTask {
    /// Task id.
    pub id: u64,
    /// Task name.
    pub name: String,
}

/// A lapsed lease (a running task whose lease ended: its worker stopped renewing it) as
/// `Leases::task_lapsed` reads it. "Lapsed", not "expired": `expired` is the state of a task
/// whose deadline passed.
pub struct LapsedRow {
    /// Task id.
    pub id: u64,
    /// The lease epoch read (fencing token).
    pub lease_epoch: u64,
    /// Task name.
    pub name: String,
    /// Queue name.
    pub queue: String,
    /// Attempts started so far (this lease's included).
    pub attempt: u32,
    /// Attempts allowed.
    pub max_attempts: u32,
    /// The worker that held the lease.
    pub worker_id: Option<String>,
    /// The task's unique identity, if it is unique (what the reap frees: [`Self::frees`]).
    pub unique_key: Option<Vec<u8>>,
    /// Its `unique_while` (`pending`, `running` or `window`).
    pub unique_while: Option<String>,
    /// The task's order key, if it is ordered.
    pub order_key: Option<Vec<u8>>,
    /// Whether its death lets its key go on (see [`OrderKey::dead_skips`]).
    pub order_dead_skips: bool,
    /// A cancel was requested: the reap cancels the task.
    pub canceled: bool,
    /// The reading worker registers the task's name (so it knows its `on_dead` follow-up).
    pub registered: bool,
    /// The payload, read only for a task the reap moves to dead.
    pub payload: Option<Vec<u8>>,
    /// Trace context of the enqueuing request, if recorded.
    pub trace_context: Option<String>,
}

impl LapsedRow {
    /// Whether the reap moves the task to dead: attempts exhausted, no cancel requested, and
    /// the reading worker registers its name.
    pub fn goes_dead(&self) -> bool {
        !self.canceled && self.attempt >= self.max_attempts && self.registered
    }

    /// Whether the reap parks the task back to pending instead of burying it: attempts
    /// exhausted, no cancel requested, but the reading worker does not register its name, so
    /// it cannot know its `on_dead` follow-up. The first worker that registers the name claims
    /// it and ends it dead without running it (see `Claimed::parked_error`). Pending, it no
    /// longer counts against its queue's concurrency limit.
    pub fn parks(&self) -> bool {
        !self.canceled && self.attempt >= self.max_attempts && !self.registered
    }

    /// The unique identity the reap frees, as `rules::run_end_frees_identity` decides for the
    /// end the reap gives the task: `canceled` on a cancel request, `dead` when it [goes
    /// dead](Self::goes_dead), `pending` otherwise (which frees nothing). An identity held while
    /// pending was freed when the task was claimed.
    pub fn frees(&self) -> Option<Vec<u8>> {
        let to = if self.canceled {
            TaskState::Canceled
        } else if self.goes_dead() {
            TaskState::Dead
        } else {
            TaskState::Pending
        };
        let held = self.unique_while.as_deref()?;
        crate::rules::run_end_frees_identity(held, to)
            .then(|| self.unique_key.clone())
            .flatten()
    }

    /// The order key whose next task the reap promotes, as `rules::ends_order_head` decides
    /// for the end the reap gives the task (a task reaped back to pending stays its key's head).
    pub fn order_ends(&self) -> Option<Vec<u8>> {
        let to = if self.canceled {
            TaskState::Canceled
        } else if self.goes_dead() {
            TaskState::Dead
        } else {
            TaskState::Pending
        };
        crate::rules::ends_order_head(to, self.order_dead_skips)
            .then(|| self.order_key.clone())
            .flatten()
    }
}

/// One expired lease to reap (`Store::task_reap`).
pub struct ReapRow {
    /// Task id.
    pub id: u64,
    /// The epoch read: the row is reaped only if it still has it.
    pub epoch: u64,
    /// The unique identity the reap frees, if any.
    pub frees: Option<Vec<u8>>,
    /// A cancel was requested: the reap cancels the task.
    pub canceled: bool,
    /// Parked back to pending rather than buried (see [`LapsedRow::parks`]).
    pub parks: bool,
    /// The order key whose next task the reap promotes if it writes this row (see
    /// [`LapsedRow::order_ends`]).
    pub order_ends: Option<Vec<u8>>,
    /// The `on_dead` follow-up, inserted if the reap moves the task to dead.
    pub follow_up: Option<Box<FollowUpRow>>,
}

/// What `Store::task_reap` did.
#[derive(Debug, Default)]
pub struct Reaped {
    /// Rows reaped.
    pub reaped: u64,
    /// `(id, new state)` of each row reaped, when the reap locked the rows first (`exact`, or
    /// follow-ups to insert); empty otherwise.
    pub rows: Vec<(u64, TaskState)>,
    /// Ids reaped to dead together with their follow-up.
    pub followed: Vec<u64>,
}

/// The outcome of one attempt, written back by `task_write_back`.
#[derive(Debug, Clone, Serialize)]
pub struct WriteBack {
    /// Task id.
    pub id: u64,
    /// The lease epoch the outcome is written under.
    pub epoch: u64,
    /// `succeeded`, `pending` (retry), `dead`, `canceled` (a cancel request honoured), or
    /// `snoozed`: written as `pending` with the attempt given back and `snoozes` + 1.
    pub state: &'static str,
    /// The attempt number of this run (as claimed), recorded in the attempt history.
    pub attempt: u32,
    /// How the attempt ended, as recorded in the attempt history: `succeeded`, `failed`,
    /// `timed_out`, `panicked`, `canceled` or `snoozed` (see `AttemptOutcome`).
    pub outcome: &'static str,
    /// Delay from the database's now of the next run, for `pending` and `snoozed`.
    pub delay_us: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    /// The error text, for a failed attempt.
    pub error: Option<String>,
    /// The handler's output (JSON text, within the worker's output limit), for a success
    /// that set one: stored in `output` by the same statement as the rest of the outcome.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    /// The unique identity this outcome frees if the task holds it (`running`: a success or
    /// death; `window`: death).
    #[serde(skip)]
    pub frees: Option<Vec<u8>>,
    /// The follow-up to insert if this outcome is written (`on_dead` / `on_success`).
    #[serde(skip)]
    pub follow_up: Option<Box<FollowUpRow>>,
    /// The order key whose next task is promoted if this outcome is written: the task is its
    /// key's head and the outcome ends it (`rules::ends_order_head`).
    #[serde(skip)]
    pub order_ends: Option<Vec<u8>>,
    /// The task is a workflow step and this outcome ends it (succeeded, dead, canceled): the
    /// write-back settles the steps that run after it in its own transaction
    /// (`Workflows::workflow_settle`). A batch without any adds no statement.
    #[serde(skip)]
    pub workflow_step_ends: bool,
    /// The task is a batch member and this outcome ends it (succeeded, dead, canceled): the
    /// write-back counts the end in its batch in its own transaction, releasing the batch's
    /// callbacks when it is the last (`rules::batch`). A batch without any adds no statement.
    #[serde(skip)]
    pub batch_ends: bool,
    /// For outcome observers: the attempt's task name, queue and handler run time.
    #[serde(skip)]
    pub name: std::sync::Arc<str>,
    #[serde(skip)]
    /// Queue name.
    pub queue: std::sync::Arc<str>,
    #[serde(skip)]
    /// How long the handler ran.
    pub ran: std::time::Duration,
}

/// A follow-up task to insert with the end of another (`Store::task_write_back`,
/// `Store::task_reap`), as sent inside a JSON array.
#[derive(Debug, Clone, Serialize)]
pub struct FollowUpRow {
    #[serde(rename = "q")]
    /// Queue name.
    pub queue: &'static str,
    #[serde(rename = "n")]
    /// Task name.
    pub name: &'static str,
    /// The payload bytes (hex-encoded in a JSON array).
    #[serde(rename = "p", serialize_with = "as_hex")]
    pub payload: Vec<u8>,
    #[serde(rename = "pr")]
    /// Priority (lower runs first).
    pub priority: i16,
    #[serde(rename = "m")]
    /// Attempts allowed.
    pub max_attempts: u32,
    /// Deadline as microseconds from the database's now; absent means none.
    #[serde(rename = "tl", skip_serializing_if = "Option::is_none")]
    pub ttl_us: Option<i64>,
    /// Idempotency key naming the attempt that ended: `taskq:on_dead:<id>:<epoch>`.
    #[serde(rename = "k")]
    pub key: String,
    #[serde(rename = "t", skip_serializing_if = "Option::is_none")]
    /// Trace context of the enqueuing request, if recorded.
    pub trace_context: Option<String>,
}

impl FollowUpRow {
    /// Bytes of this row in its statement's JSON (an upper bound; see `budget`).
    pub fn json_len(&self) -> usize {
        use crate::budget::json_str_len;
        96 + json_str_len(self.queue)
            + json_str_len(self.name)
            + 2 * self.payload.len()
            + json_str_len(&self.key)
            + self.trace_context.as_deref().map_or(0, json_str_len)
    }
}

impl WriteBack {
    /// Bytes this outcome adds to its write-back's statements, its row of the `UPDATE` and
    /// its follow-up's row of the `INSERT` (an upper bound; see `budget`).
    pub fn json_len(&self) -> usize {
        160 + self.error.as_deref().map_or(0, crate::budget::json_str_len)
            + self
                .output
                .as_deref()
                .map_or(0, crate::budget::json_str_len)
            + self.follow_up.as_ref().map_or(0, |f| f.json_len())
    }
}

/// What `Store::task_write_back` did with a batch.
#[derive(Debug, Default)]
pub struct WrittenBack {
    /// Rows written.
    pub written: u64,
    /// Ids not written because another transaction holds the unique identity their outcome
    /// would free (a producer that got `duplicate = true` for this task and has not ended):
    /// to be written later, their leases still renewed.
    pub deferred: Vec<u64>,
    /// Ids whose outcome was written together with its follow-up.
    pub followed: Vec<u64>,
    /// What settling the workflow steps the batch ended did (steps made due, canceled).
    pub settled: Settled,
    /// What counting the batch members the batch ended did (callbacks made due).
    pub counted: BatchCounted,
}

/// One row of `Store::queue_controls`.
pub struct QueueControl {
    /// Queue name.
    pub queue: String,
    /// Paused.
    pub paused: bool,
    /// Has a concurrency or rate limit.
    pub limited: bool,
}

/// One queue of `Store::queue_list`.
pub struct QueueRow {
    /// Queue name.
    pub queue: String,
    /// When it was paused, if it is.
    pub paused_at: Option<DateTime<Utc>>,
    /// Its concurrency limit across all workers, if any.
    pub concurrency_limit: Option<u32>,
    /// `(max, period in µs)`.
    pub rate: Option<(u32, i64)>,
    /// Claims counted in the current rate window.
    pub rate_used: u64,
    /// Pending tasks.
    pub pending: u64,
    /// Running tasks.
    pub running: u64,
}

/// A schedule's definition as a worker declares it at start (`Store::schedule_declare`).
pub struct ScheduleDecl<'a> {
    /// The schedule name.
    pub name: &'a str,
    /// The task it enqueues.
    pub task_name: &'a str,
    /// Queue name.
    pub queue: &'a str,
    /// The cron expression.
    pub expression: &'a str,
    /// The time zone the expression is read in.
    pub timezone: &'a str,
    /// The missed-tick policy (`latest`, `skip`, `all(N)`).
    pub missed_ticks: &'a str,
    /// The first tick after the database's now, stored when the row is new or its expression
    /// or time zone changes.
    pub next_tick: Option<DateTime<Utc>>,
}

/// What the scheduler reads of one of its schedules each time it wakes.
pub struct ScheduleState {
    /// The database clock.
    pub now: DateTime<Utc>,
    /// The schedule name.
    pub name: String,
    /// The cron expression.
    pub expression: String,
    /// The time zone the expression is read in.
    pub timezone: String,
    /// Every tick at or before this time is handled.
    pub watermark: DateTime<Utc>,
}

/// One compare-and-set step of a schedule (`Store::schedule_fire`).
pub struct ScheduleFire<'a> {
    /// The schedule name.
    pub name: &'a str,
    /// The cron expression.
    pub expression: &'a str,
    /// The time zone the expression is read in.
    pub timezone: &'a str,
    /// The watermark the worker read: the step applies only if it is still the row's.
    pub old_watermark: DateTime<Utc>,
    /// The watermark to store.
    pub new_watermark: DateTime<Utc>,
    /// The next tick after the new watermark.
    pub next_tick: Option<DateTime<Utc>>,
    /// The worker that fires the ticks.
    pub worker_id: &'a str,
    /// One task per tick to enqueue (each with `run_at` = its tick and the tick's key).
    pub tasks: Vec<NewTask<'a>>,
}

/// A worker's own row in `taskq_workers`, as it writes it.
pub struct WorkerRow<'a> {
    /// The worker.
    pub worker_id: &'a str,
    /// Host name.
    pub host: &'a str,
    /// Process id.
    pub pid: u32,
    /// Its queues, each with its concurrency.
    pub queues: &'a [(String, u32)],
    /// Handlers it runs at once.
    pub concurrency: u32,
    /// Lease length (µs).
    pub lease_us: u64,
    /// Heartbeat interval (µs).
    pub heartbeat_us: u64,
    /// The task names it registers.
    pub names: &'a NameList,
}

/// A row of `taskq_workers` with the count of running tasks claimed under its id.
pub struct WorkerListRow {
    /// The worker.
    pub worker_id: String,
    /// Host name.
    pub host: String,
    /// Process id.
    pub pid: u32,
    /// JSON array of its queues.
    pub queues: String,
    /// Handlers it runs at once.
    pub concurrency: u32,
    /// Lease length (µs).
    pub lease_us: u64,
    /// Heartbeat interval (µs).
    pub heartbeat_us: u64,
    /// When it started.
    pub started_at: DateTime<Utc>,
    /// Its last beat.
    pub last_seen_at: DateTime<Utc>,
    /// When it stopped gracefully, if it did.
    pub stopped_at: Option<DateTime<Utc>>,
    /// JSON array of the task names it registers (`None`: written by an earlier version).
    pub names: Option<String>,
    /// Microseconds since `last_seen_at`, on the database clock.
    pub seen_ago_us: i64,
    /// Tasks it holds running now.
    pub running: i64,
}

impl WorkerListRow {
    /// Not stopped, and seen within [`crate::rules::worker_lost_after_us`] of its heartbeat
    /// and lease (on the database clock): [`crate::rules::worker_alive`].
    pub fn alive(&self) -> bool {
        crate::rules::worker_alive(
            self.stopped_at.is_some(),
            self.seen_ago_us,
            self.heartbeat_us,
            self.lease_us,
        )
    }
}

/// A row of `taskq_audit` as read back.
pub struct AuditListRow {
    /// Task id.
    pub id: u64,
    /// When (database clock).
    pub at: DateTime<Utc>,
    /// Who acted.
    pub actor: String,
    /// What was done.
    pub action: String,
    /// The task acted on, if one.
    pub task_id: Option<u64>,
    /// Queue name.
    pub queue: Option<String>,
    /// Details, a JSON object.
    pub detail: Option<String>,
}

/// An operator action to record in `taskq_audit`.
pub struct AuditRow<'a> {
    /// Who acted.
    pub actor: &'a str,
    /// What was done.
    pub action: &'a str,
    /// The task acted on, if one.
    pub task_id: Option<u64>,
    /// The queue; when `None` and `task_id` is set, the task's queue is recorded.
    pub queue: Option<&'a str>,
    /// A JSON object.
    pub detail: Option<String>,
}

/// What one queue's claim loop keeps between claims (`Claims::task_claim`): a state of the
/// driver's own type, made on the first claim ([`state`](Self::state)), opaque to the runtime.
/// MySQL keeps its seek position and candidate spread in it; SQLite nothing.
#[derive(Default)]
pub struct ClaimCursor(Option<Box<dyn std::any::Any + Send>>);

impl ClaimCursor {
    /// The driver's state, `T::default()` on the first claim. A cursor that holds another
    /// type (a cursor of one driver handed to another) is a bug of the caller: panics.
    pub fn state<T: Default + Send + 'static>(&mut self) -> &mut T {
        let state = self.0.get_or_insert_with(|| Box::new(T::default()));
        match state.downcast_mut::<T>() {
            Some(t) => t,
            None => panic!(
                "a claim cursor of another driver handed to {}",
                std::any::type_name::<T>()
            ),
        }
    }
}

impl std::fmt::Debug for ClaimCursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("ClaimCursor").finish_non_exhaustive()
    }
}

/// One claim: up to `limit` due tasks of `queue` whose name is in `names`, leased for
/// `lease_us` to `worker_id`.
pub struct ClaimRequest<'a> {
    /// Queue name.
    pub queue: &'a str,
    /// The task names the worker handles.
    pub names: &'a NameList,
    /// Most tasks to claim.
    pub limit: u32,
    /// Lease length (µs).
    pub lease_us: i64,
    /// The claiming worker.
    pub worker_id: &'a str,
    /// The worker saw the queue as limited (a concurrency or rate limit in `taskq_queues`):
    /// the claim claims no more than the limits allow. Unlimited queues never read limits.
    pub limited: bool,
}

/// What one claim took.
pub struct ClaimBatch {
    /// The claimed tasks, in claim order.
    pub tasks: Vec<Claimed>,
    /// Tasks the claim found past their deadline: moved to `expired`, not run.
    pub expired: Vec<ExpiredTask>,
    /// Tasks the claim found with a cancel request left by an earlier attempt: moved to
    /// `canceled`, not run.
    pub canceled: Vec<CanceledTask>,
    /// Set when the queue's limits allowed fewer tasks than asked for.
    pub limited: Option<LimitHit>,
    /// Fewer tasks than asked for, but others held some of the due ones: more may be due,
    /// so the loop claims again soon, as for a backlog.
    pub contended: bool,
    /// Fewer tasks than asked for, but the claim looked at part of the queue only: the loop
    /// claims again at once before it goes idle.
    pub partial: bool,
    /// Nothing was claimed because the queue is paused or limited although the request did
    /// not know it as limited: the worker reads the queue's controls and claims again (only
    /// drivers whose [`Handle::claims_see_controls`](crate::driver::Handle::claims_see_controls)
    /// is `true` set it).
    pub queue_controlled: bool,
}

/// A list of names (the task names a worker handles, the schedules it declares), with its
/// JSON array encoded once: a worker asks with the same list on every claim, and drivers bind
/// it as a JSON array.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NameList {
    names: Vec<String>,
    json: String,
}

impl NameList {
    /// The list, in the order given.
    pub fn new<S: Into<String>>(names: impl IntoIterator<Item = S>) -> Self {
        let names: Vec<String> = names.into_iter().map(Into::into).collect();
        let json = serde_json::to_string(&names).expect("names serialize");
        Self { names, json }
    }

    /// The names.
    pub fn as_slice(&self) -> &[String] {
        &self.names
    }

    /// The names as a JSON array of strings.
    pub fn json(&self) -> &str {
        &self.json
    }
}

/// A worker's queues as the JSON object both drivers store in `taskq_workers.queues`
/// (queue → concurrency).
pub fn queues_json(queues: &[(String, u32)]) -> String {
    let map: serde_json::Map<String, serde_json::Value> = queues
        .iter()
        .map(|(q, c)| (q.clone(), serde_json::Value::from(*c)))
        .collect();
    serde_json::Value::Object(map).to_string()
}

/// Serializes bytes as lower-case hex (how payloads travel inside JSON arrays).
fn as_hex<S: serde::Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&hex(bytes))
}

/// Lower-case hex of `bytes` (how payloads and identity keys travel inside JSON arrays).
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_list_keeps_its_order_and_encodes_once() {
        let n = NameList::new(["b", "a\"q"]);
        assert_eq!(n.as_slice(), ["b", "a\"q"]);
        assert_eq!(n.json(), r#"["b","a\"q"]"#);
    }

    #[test]
    fn hex_encodes_every_byte() {
        assert_eq!(hex(&[0, 1, 0x7f, 0x80, 0xff, b'{']), "00017f80ff7b");
        assert_eq!(hex(&[]), "");
    }
}

/// One step of a workflow to insert (`Enqueue::workflow_insert`).
pub struct NewStep<'a> {
    /// The step's name, unique in its workflow.
    pub step: &'a str,
    /// The task the step runs.
    pub task: NewTask<'a>,
    /// The steps it runs after, as indices of earlier steps in the same slice (distinct).
    pub after: Vec<usize>,
    /// It runs once the steps it runs after have ended, whether or not they succeeded (a
    /// cleanup step); otherwise a step after which one fails is canceled.
    pub runs_after_failure: bool,
}

/// A workflow to insert (`Enqueue::workflow_insert`): its steps in an order where each comes
/// after the steps it runs after (`rules::workflow::plan`'s order).
pub struct NewWorkflow<'a> {
    /// The workflow's name (not unique: a label for people, e.g. `export-7`).
    pub name: &'a str,
    /// The steps.
    pub steps: &'a [NewStep<'a>],
}

/// What `Enqueue::workflow_insert` inserted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkflowInserted {
    /// The workflow's id.
    pub id: u64,
    /// Each step's task, in the order of [`NewWorkflow::steps`].
    pub task_ids: Vec<TaskId>,
}

/// What settling ended workflow steps did (`Workflows::workflow_settle`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settled {
    /// Steps made due (`waiting` → `pending`): the last step they ran after ended.
    pub released: Vec<(TaskId, String)>,
    /// Steps canceled because a step they run after did not succeed.
    pub canceled: Vec<TaskId>,
    /// Edges settled (each once: a dependency's end applied to one step after it).
    pub edges: u64,
}

impl Settled {
    /// Adds what another settle did.
    pub fn extend(&mut self, other: Settled) {
        self.released.extend(other.released);
        self.canceled.extend(other.canceled);
        self.edges += other.edges;
    }
}

/// A workflow as `Workflows::workflow_get` and `workflow_list` read it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WorkflowRow {
    /// Its id.
    pub id: u64,
    /// Its name.
    pub name: String,
    /// When it was enqueued (database clock).
    pub created_at: DateTime<Utc>,
    /// When an operator canceled it, if one did.
    pub canceled_at: Option<DateTime<Utc>>,
    /// Its steps per state.
    pub counts: crate::rules::workflow::StepCounts,
}

/// One step of a workflow as `Workflows::workflow_steps` reads it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WorkflowStepRow {
    /// The step's name.
    pub step: String,
    /// Its task.
    pub task_id: TaskId,
    /// The task's name.
    pub name: String,
    /// The task's queue.
    pub queue: String,
    /// The task's state.
    pub state: TaskState,
    /// The steps it runs after, by name (in the order they were declared).
    pub after: Vec<String>,
    /// It runs after its dependencies whether or not they succeeded.
    pub runs_after_failure: bool,
    /// Canceled because a step it runs after did not succeed.
    pub canceled_by_dependency: bool,
    /// The JSON text its handler returned, once it has succeeded with one (migration 31).
    #[serde(skip)]
    pub output: Option<String>,
}

/// What `Workflows::workflow_step_output` found for a step's read of another step's output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepOutput {
    /// The reading task is not a step of a workflow.
    NotAStep,
    /// Its workflow has no step of that name.
    UnknownStep,
    /// The named step is not one the reading step runs after.
    NotADependency,
    /// The dependency's output (JSON text): `None` when it stored none (it returned `()`,
    /// did not succeed, or its task was deleted).
    Output(Option<String>),
}

/// What `Workflows::workflow_cancel` did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkflowCanceled {
    /// The workflow exists.
    pub found: bool,
    /// Steps canceled (they were waiting or pending).
    pub canceled: u64,
    /// Running steps asked to cancel.
    pub cancel_requested: u64,
}

/// A batch to insert (`Enqueue::batch_insert`): its members and callbacks, all plain tasks.
pub struct NewBatch<'a> {
    /// The batch's name (not unique: a label for people, e.g. `import-7`).
    pub name: &'a str,
    /// The members.
    pub members: &'a [NewTask<'a>],
    /// The task made due once every member has succeeded; inserted `waiting`.
    pub on_success: Option<NewTask<'a>>,
    /// The task made due once every member has ended, however; inserted `waiting`.
    pub on_complete: Option<NewTask<'a>>,
    /// Sealed at once (the callbacks may be released); otherwise open until `batch_add` seals
    /// it.
    pub sealed: bool,
}

/// What `Enqueue::batch_insert` inserted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchInserted {
    /// The batch's id.
    pub id: u64,
    /// Each member's task, in the order of [`NewBatch::members`].
    pub task_ids: Vec<TaskId>,
    /// The `on_success` callback's task.
    pub on_success: Option<TaskId>,
    /// The `on_complete` callback's task.
    pub on_complete: Option<TaskId>,
}

/// What `Enqueue::batch_add` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchAdded {
    /// The members were added (and the batch sealed, if asked): their tasks in order, and
    /// what a seal released at once (every member had already ended).
    Added {
        /// The new members' tasks.
        task_ids: Vec<TaskId>,
        /// Callbacks the seal made due.
        counted: BatchCounted,
    },
    /// Nothing was added.
    Refused(crate::rules::batch::AddRefused),
}

/// What counting batch members' ends did (the write-back's, the sweep's, a cancel's, a seal's).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchCounted {
    /// Members whose count changed.
    pub members: u64,
    /// Callbacks made due (or brought back), with their queues.
    pub released: Vec<(TaskId, String)>,
    /// Members left uncounted because another transaction held their batch's row (a
    /// producer adding to it): the sweep counts them.
    pub deferred: Vec<u64>,
}

impl BatchCounted {
    /// Adds what another count did.
    pub fn extend(&mut self, other: BatchCounted) {
        self.members += other.members;
        self.released.extend(other.released);
        self.deferred.extend(other.deferred);
    }
}

/// A batch as `Batches::batch_get` and `batch_list` read it: its row, counters included.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BatchRow {
    /// Its id.
    pub id: u64,
    /// Its name.
    pub name: String,
    /// When it was enqueued (database clock).
    pub created_at: DateTime<Utc>,
    /// Members added.
    pub total: u64,
    /// Members that succeeded.
    pub succeeded: u64,
    /// Members that ended without success (dead, canceled, expired, deleted).
    pub failed: u64,
    /// Sealed: the callbacks are released once every member has ended.
    pub sealed: bool,
    /// When every member had ended (and `on_complete` was made due), if they have.
    pub completed_at: Option<DateTime<Utc>>,
    /// When every member had succeeded (and `on_success` was made due), if they have.
    pub succeeded_at: Option<DateTime<Utc>>,
    /// When an operator canceled it, if one did.
    pub canceled_at: Option<DateTime<Utc>>,
    /// The `on_success` callback's task.
    pub on_success: Option<TaskId>,
    /// The `on_complete` callback's task.
    pub on_complete: Option<TaskId>,
}

impl BatchRow {
    /// Its counters and flags, for `rules::batch`.
    pub fn counters(&self) -> crate::rules::batch::BatchCounters {
        crate::rules::batch::BatchCounters {
            total: self.total,
            succeeded: self.succeeded,
            failed: self.failed,
            sealed: self.sealed,
            canceled: self.canceled_at.is_some(),
            completed: self.completed_at.is_some(),
            success_released: self.succeeded_at.is_some(),
        }
    }
}

/// One member of a batch as `Batches::batch_members` reads it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BatchMemberRow {
    /// Its task.
    pub task_id: TaskId,
    /// The task's name.
    pub name: String,
    /// The task's queue.
    pub queue: String,
    /// The task's state; `None` once the task was deleted (or pruned).
    pub state: Option<TaskState>,
}

/// What `Batches::batch_cancel` did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchCanceled {
    /// The batch exists.
    pub found: bool,
    /// Members canceled (they were waiting or pending).
    pub canceled: u64,
    /// Running members asked to cancel.
    pub cancel_requested: u64,
    /// Its callbacks canceled (they were waiting).
    pub callbacks_canceled: u64,
}
