//! The operator's handle, [`Client`] (also at the crate root): inspect and manage tasks (get,
//! list, count, pending tasks per name, attempts, cancel, reschedule and reprioritize pending
//! tasks, retry dead tasks, bulk actions, audit trail) and queues (pause, limits); and the
//! types its methods take and return.

use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::backend::{Backend, RetryDead, Store, TaskFilter, Tx};
use crate::error::{Error, Result};
use crate::history::{self, Action};
pub use crate::history::{Attempt, AttemptOutcome, AuditEntry, AuditFilter};
use crate::limits::{MAX_QUEUE_LIMIT, MAX_RATE_PERIOD, MIN_RATE_PERIOD};
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
    timeout: Duration,
}

pub use crate::info::{
    AttemptsPerMinute, DeadReason, FinishedPerMinute, ListFilter, PendingNameCount, QueueInfo,
    QueueStateCount, RateLimit, ScheduleInfo, TaskInfo, WorkerInfo, WorkerStatus,
};

impl Client {
    /// A client on `pool`: a `MySqlPool`, or with the `sqlite` feature a `SqlitePool`.
    pub fn new<DB: Backend>(pool: sqlx::Pool<DB>) -> Self {
        Self {
            store: DB::__store(pool).0,
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

    /// Enqueues the task `reg` registers from a JSON payload (see
    /// [`Registration::enqueue_json`](crate::registry::Registration::enqueue_json)) and
    /// records it in the audit trail as `enqueue` by this client's actor, with `detail`, in
    /// the same transaction; a duplicate (idempotency key or unique identity) records
    /// nothing. Wakes this process's workers for the queue after the commit.
    pub async fn enqueue_json(
        &self,
        reg: &crate::registry::Registration,
        payload: &[u8],
        options: &crate::registry::JsonEnqueueOptions,
        detail: serde_json::Value,
    ) -> Result<crate::Enqueued> {
        let prepared = (reg.prepare_json)(payload, options)?;
        let mut tx = self.run(self.store.begin()).await?;
        let done = self.bounded(prepared.insert(tx.conn(), &mut None)).await?;
        if done.duplicate {
            drop(tx);
            return Ok(done);
        }
        let queue = options.queue.as_deref().unwrap_or(reg.queue());
        let a = Action {
            action: "enqueue",
            task: Some(done.id),
            queue: Some(queue.to_owned()),
            detail: Some(detail),
        };
        self.commit_audited(tx, &a).await?;
        crate::wake::notify(queue);
        Ok(done)
    }

    /// A task by id; [`Error::NotFound`] when it does not exist (or was pruned).
    pub async fn get(&self, id: TaskId) -> Result<TaskInfo> {
        self.run(self.store.task_get(id))
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
                .run(self.store.task_list_desc(&f, before, 0, limit))
                .await;
        }
        let after = filter.after_id.map_or(0, |i| i.0);
        self.run(self.store.task_list(&f, after, u64::MAX, limit))
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
        let (lo, hi) = self.run(self.store.task_id_bounds()).await?;
        if filter.newest_first {
            // Ids below `before`, from the newest existing one down.
            let before = filter
                .after_id
                .map_or(u64::MAX, |i| i.0)
                .min(hi.saturating_add(1));
            let floor = before.saturating_sub(Self::LIST_PROBE_IDS);
            let mut rows = self
                .run(self.store.task_list_desc(f, before, floor, limit))
                .await?;
            if (rows.len() as u32) < limit && floor > lo {
                let rest = limit - rows.len() as u32;
                let more = self.store.task_list_queue_desc(queue, f.name, floor, rest);
                rows.extend(self.run(more).await?);
            }
            return Ok(rows);
        }
        // Ids above `after`, from the oldest existing one up.
        let after = filter.after_id.map_or(0, |i| i.0).max(lo.saturating_sub(1));
        let up_to = after.saturating_add(Self::LIST_PROBE_IDS);
        let mut rows = self
            .run(self.store.task_list(f, after, up_to, limit))
            .await?;
        if (rows.len() as u32) < limit && up_to < hi {
            let rest = limit - rows.len() as u32;
            let more = self.store.task_list_queue_asc(queue, f.name, up_to, rest);
            rows.extend(self.run(more).await?);
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
            .run(self.store.task_finished_per_minute(minutes))
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
            .run(self.store.task_failed_attempts_per_minute(minutes))
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
        self.run(self.store.task_count(&filter.store())).await
    }

    /// Counts per queue and state, ordered by queue then state ([`TaskState::ALL`]'s order),
    /// exact, with the earliest `lease_until` of the running tasks:
    /// [`stats_active`](Self::stats_active), the running rows' leases and
    /// [`stats_terminal`](Self::stats_terminal), on one connection (three consistent reads,
    /// not one snapshot). The terminal counts read every terminal task's index entry, so this
    /// costs in proportion to the table; prefer `stats_active` where pending and running are
    /// enough.
    pub async fn stats(&self) -> Result<Vec<QueueStateCount>> {
        let mut conn = self.run(self.store.acquire()).await?;
        self.run(self.store.task_stats(conn.conn())).await
    }

    /// Counts per queue of the `pending` and `running` tasks, exact, with the oldest `run_at`
    /// (`earliest_lease_until` is always `None` here: it needs the running rows; [`stats`](Self::stats)
    /// reads them). Reads only the claim index's entries of those two states, so it costs in
    /// proportion to the backlog, not to the table. Unordered.
    pub async fn stats_active(&self) -> Result<Vec<QueueStateCount>> {
        let mut conn = self.run(self.store.acquire()).await?;
        self.run(self.store.task_stats_active(conn.conn())).await
    }

    /// Counts per queue of the tasks in terminal states (`succeeded`, `dead`, `canceled`,
    /// `expired`; those retention has not deleted yet), exact, with the oldest `run_at`. A
    /// covering read of every terminal task's claim-index entry: in proportion to the table
    /// (about 0.2 to 0.5 s per million tasks), so cache it rather than call it per page view.
    /// Unordered.
    pub async fn stats_terminal(&self) -> Result<Vec<QueueStateCount>> {
        let mut conn = self.run(self.store.acquire()).await?;
        self.run(self.store.task_stats_terminal(conn.conn())).await
    }

    /// Pending tasks per queue and task name (of `queue` only, when given), ordered by queue and
    /// name: the way to spot tasks whose name no running worker handles (they stay pending).
    /// Reads every pending row's index entry (one covering scan), so it costs in proportion to
    /// the pending backlog.
    pub async fn pending_by_name(&self, queue: Option<&str>) -> Result<Vec<PendingNameCount>> {
        let mut conn = self.run(self.store.acquire()).await?;
        self.run(self.store.task_pending_by_name(conn.conn(), queue))
            .await
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
    ///   claim that next finds the task due ends it `canceled` without running it.
    ///
    /// Terminal tasks give [`Error::WrongState`], unknown ids [`Error::NotFound`].
    pub async fn cancel(&self, id: TaskId) -> Result<Canceled> {
        let mut tx = self.run(self.store.begin()).await?;
        if self.run(self.store.task_cancel(tx.conn(), id)).await? {
            self.commit_audited(tx, &Action::task("cancel", id, None))
                .await?;
            crate::metrics::canceled();
            return Ok(Canceled::Now);
        }
        if self
            .run(self.store.task_request_cancel(tx.conn(), id))
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
        let mut tx = self.run(self.store.begin()).await?;
        let done = self.store.task_reschedule(tx.conn(), id, at, delay_us);
        if self.run(done).await? {
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
        let mut tx = self.run(self.store.begin()).await?;
        let done = self.store.task_set_priority(tx.conn(), id, priority);
        if self.run(done).await? {
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
        let mut tx = self.run(self.store.begin()).await?;
        self.run(self.store.queue_pause(tx.conn(), queue)).await?;
        let a = Action::queue("pause", Some(queue), serde_json::Value::Null);
        self.commit_audited(tx, &Action { detail: None, ..a }).await
    }

    /// Resumes a paused queue; returns whether it was paused.
    pub async fn resume_queue(&self, queue: &str) -> Result<bool> {
        let mut tx = self.run(self.store.begin()).await?;
        let was_paused = self.run(self.store.queue_resume(tx.conn(), queue)).await?;
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
        let mut conn = self.run(self.store.acquire()).await?;
        self.run(self.store.queues_paused(conn.conn())).await
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
        self.run(self.store.queue_set_limit(queue, limit)).await
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
        self.run(self.store.queue_set_rate_limit(queue, rate)).await
    }

    /// Every queue that has pending or running tasks, or that was ever paused or limited, by
    /// name: whether it is paused, its limits, the starts counted in its current rate window,
    /// and its pending and running counts. Two statements; the counts read every pending and
    /// running task's index entry, so they cost in proportion to the backlog.
    pub async fn queues(&self) -> Result<Vec<QueueInfo>> {
        let rows = self.run(self.store.queue_list()).await?;
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

    /// The workers recorded in the database, oldest start first: alive, lost (no heartbeat for
    /// two of their heartbeat intervals) or stopped (see [`WorkerInfo::status`]), kept for
    /// [`WORKER_ROW_RETENTION`](crate::limits::WORKER_ROW_RETENTION) after their last beat, each
    /// with the age of that beat and the number of tasks it is running. One statement (a
    /// `GROUP BY` over the running tasks).
    pub async fn workers(&self) -> Result<Vec<WorkerInfo>> {
        let mut conn = self.run(self.store.acquire()).await?;
        let rows = self.run(self.store.worker_list(conn.conn())).await?;
        Ok(rows.into_iter().map(WorkerInfo::from_row).collect())
    }

    /// The due pending tasks, per queue and task name, that no live worker would claim: no
    /// alive worker (see [`WorkerInfo::status`]) both works the queue and registers the name.
    /// They stay pending, silently, until such a worker runs (or they are canceled); workers
    /// also log them at WARN once a minute for their own queues. Two statements:
    /// [`pending_by_name`](Self::pending_by_name) (a scan of the pending backlog's index
    /// entries) and [`workers`](Self::workers).
    pub async fn unhandled(&self) -> Result<Vec<PendingNameCount>> {
        let pending = self.pending_by_name(None).await?;
        if pending.iter().all(|p| p.due == 0) {
            return Ok(Vec::new());
        }
        let workers = self.workers().await?;
        Ok(crate::info::unhandled(pending, &workers))
    }

    /// Every recurring schedule recorded in the database, by name.
    pub async fn schedules(&self) -> Result<Vec<ScheduleInfo>> {
        self.run(self.store.schedule_list()).await
    }

    /// Deletes a schedule's row (e.g. one removed from the code, whose row stays behind);
    /// returns whether it existed. A worker that still declares the schedule writes it again
    /// within its next wake-up, with its ticks starting afresh from then.
    pub async fn delete_schedule(&self, name: &str) -> Result<bool> {
        let mut tx = self.run(self.store.begin()).await?;
        let deleted = self
            .run(self.store.schedule_delete(tx.conn(), name))
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
        let mut tx = self.run(self.store.begin()).await?;
        match self.run(self.store.task_retry_dead(tx.conn(), id)).await? {
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

    /// Rows changed per statement by the bulk operations ([`Client::retry_all_dead`],
    /// [`Client::purge`]): small, so each statement holds its row locks only briefly.
    pub const BATCH: u32 = 500;

    /// The database clock now (`UTC_TIMESTAMP(6)`): the clock every stored time comes from,
    /// so ages and lease expiries should be computed against it, not the local clock.
    pub async fn db_now(&self) -> Result<DateTime<Utc>> {
        self.run(self.store.db_now()).await
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
        let started = self.run(self.store.db_now()).await?;
        loop {
            let n = self
                .run(
                    self.store
                        .task_retry_dead_batch(queue, started, Self::BATCH),
                )
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
                match self.run(self.retry_dead_one(id)).await? {
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
        let mut tx = self.store.begin().await?;
        let r = self.store.task_retry_dead(tx.conn(), id).await?;
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
                self.run(self.store.task_bulk_count(&f, age_us)).await?
            } else {
                let mut after = 0;
                loop {
                    let batch = self
                        .run(self.store.task_bulk_ids(&f, age_us, after, Self::BATCH))
                        .await?;
                    let ids: Vec<u64> = batch.iter().map(|(id, _)| *id).collect();
                    if let Some(&last) = ids.last() {
                        if state == TaskState::Pending {
                            out.canceled += self.run(self.store.task_cancel_batch(&ids)).await?;
                        } else {
                            out.requested +=
                                self.run(self.store.task_request_cancel_batch(&ids)).await?;
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
            return self.run(self.store.task_bulk_count(&f, age_us)).await;
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
                .run(self.store.task_bulk_ids(f, age_us, after, Self::BATCH))
                .await?;
            let plain: Vec<u64> = batch.iter().filter(|b| !b.1).map(|b| b.0).collect();
            if !plain.is_empty() {
                *total += self.run(self.store.task_retry_dead_ids(&plain)).await?;
            }
            for &(id, _) in batch.iter().filter(|b| b.1) {
                match self.run(self.retry_dead_one(TaskId(id))).await? {
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
                .run(self.store.task_prune_count(s, older_than.as_secs()))
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
        let mut conn = self.run(self.store.acquire()).await?;
        for &s in states {
            loop {
                let n = self
                    .run(self.store.task_prune(conn.conn(), s, age_secs, Self::BATCH))
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
