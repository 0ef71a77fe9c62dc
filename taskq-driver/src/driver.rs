//! The driver seam: what taskq's runtime asks of a database, as typed operations grouped by
//! table or job, one trait each ([`Enqueue`], [`Tasks`], [`Actions`], [`Claims`], [`Leases`],
//! [`Identities`], [`Queues`], [`Schedules`], [`Workers`], [`History`], [`Clock`],
//! [`StatementBudget`]). A driver (`taskq-mysql`, `taskq-sqlite`) implements each in the file
//! that holds that table's SQL; [`Driver`] is all of them. [`Enqueue`] (the producer path and
//! audit entries) runs on the caller's own transaction, so its functions take no handle.
//!
//! Operations named `(&self, ..)` run on the driver's pool; those taking `conn` run on a
//! connection the caller took (the worker's lanes and deadlines, the client's transactions).
//! Every time comes from the database clock; every write-back of a claimed task is
//! conditional on the lease epoch it was claimed with.
//!
//! Not semver-stable: taskq's own interface between its runtime and its drivers.

use std::future::Future;

use chrono::{DateTime, Utc};

use crate::budget::Budget;
use crate::read::{PendingNameCount, QueueStateCount, ScheduleInfo, TaskInfo};
use crate::rows::*;
use crate::state::{TaskId, TaskState};

/// A driver's pool handle: cheap to clone, shared by the worker's loops and the client.
pub trait Handle: Clone + Send + Sync + 'static {
    /// The driver's connection type (`sqlx::MySqlConnection`, `sqlx::SqliteConnection`): the
    /// connection of its database, so that code generic over the driver can take one from
    /// [`pool`](Self::pool) (the driver test suite does).
    type Conn: Send + sqlx::Connection<Database = Self::Database>;
    /// The sqlx database of the driver's pool.
    type Database: sqlx::Database<Connection = Self::Conn>;
    /// The pool behind the handle.
    fn pool(&self) -> &sqlx::Pool<Self::Database>;
}

/// The producer path and audit entries: statements on the caller's own connection (its
/// transaction), so they take no handle.
pub trait Enqueue: Handle {
    /// Inserts one task (with its idempotency key or unique identity, if any).
    fn task_insert(
        conn: &mut Self::Conn,
        row: &NewTask<'_>,
    ) -> impl Future<Output = sqlx::Result<Inserted>> + Send;
    /// Inserts tasks without idempotency key or unique identity, in as few statements as the
    /// driver can; their ids in order.
    fn task_insert_rows(
        conn: &mut Self::Conn,
        rows: &[NewTask<'_>],
    ) -> impl Future<Output = sqlx::Result<Vec<TaskId>>> + Send;
    /// The database clock, in microseconds since the Unix epoch.
    fn db_clock_us(conn: &mut Self::Conn) -> impl Future<Output = sqlx::Result<i64>> + Send;
    /// Appends an entry to the audit trail; its id.
    fn audit_insert(
        conn: &mut Self::Conn,
        row: &AuditRow<'_>,
    ) -> impl Future<Output = sqlx::Result<u64>> + Send;
}

/// The claim: up to `req.limit` due tasks of a queue under a lease, going on from where the
/// cursor says (how the driver walks the queue is its own business: MySQL keeps a seek
/// position and candidate spread, SQLite needs nothing).
pub trait Claims: Handle {
    /// What one queue's claim loop keeps between claims.
    type ClaimCursor: Default + Send;
    /// Claims up to `req.limit` due tasks of `req.queue` under a lease.
    fn task_claim(
        &self,
        conn: &mut Self::Conn,
        req: &ClaimRequest<'_>,
        cursor: &mut Self::ClaimCursor,
    ) -> impl Future<Output = sqlx::Result<ClaimBatch>> + Send;
}

/// Reads of `taskq_tasks`: one task, pages, counts, statistics, the targets of bulk actions.
pub trait Tasks: Handle {
    /// One task by id.
    fn task_get(&self, id: TaskId) -> impl Future<Output = sqlx::Result<Option<TaskInfo>>> + Send;
    /// A task's state.
    fn task_state(
        &self,
        id: TaskId,
    ) -> impl Future<Output = sqlx::Result<Option<TaskState>>> + Send;
    /// A page of tasks by ascending id, `after_id < id <= up_to`.
    fn task_list(
        &self,
        f: &TaskFilter<'_>,
        after_id: u64,
        up_to: u64,
        limit: u32,
    ) -> impl Future<Output = sqlx::Result<Vec<TaskInfo>>> + Send;
    /// A page of tasks by descending id, `from >= id > before_id`... (see the backends).
    fn task_list_desc(
        &self,
        f: &TaskFilter<'_>,
        before_id: u64,
        from: u64,
        limit: u32,
    ) -> impl Future<Output = sqlx::Result<Vec<TaskInfo>>> + Send;
    /// The smallest and largest task ids.
    fn task_id_bounds(&self) -> impl Future<Output = sqlx::Result<(u64, u64)>> + Send;
    /// A page of one queue's tasks, newest first.
    fn task_list_queue_desc(
        &self,
        queue: &str,
        name: Option<&str>,
        before_id: u64,
        limit: u32,
    ) -> impl Future<Output = sqlx::Result<Vec<TaskInfo>>> + Send;
    /// A page of one queue's tasks, oldest first.
    fn task_list_queue_asc(
        &self,
        queue: &str,
        name: Option<&str>,
        after_id: u64,
        limit: u32,
    ) -> impl Future<Output = sqlx::Result<Vec<TaskInfo>>> + Send;
    /// Tasks matching a filter.
    fn task_count(&self, f: &TaskFilter<'_>) -> impl Future<Output = sqlx::Result<u64>> + Send;
    /// Pending tasks of `kind`, of `queue` when given, by `run_at` then id, after the keyset
    /// cursor `(run_at, id)` when given; at most `limit`. Reads the pending tasks' claim-index
    /// entries (and, for the attempt count, their rows): bounded by the pending backlog, not
    /// the table.
    fn task_list_pending(
        &self,
        kind: PendingKind,
        queue: Option<&str>,
        after: Option<(DateTime<Utc>, u64)>,
        limit: u32,
    ) -> impl Future<Output = sqlx::Result<Vec<TaskInfo>>> + Send;
    /// Tasks that ended per state and minute, over the last `minutes`.
    fn task_finished_per_minute(
        &self,
        minutes: u32,
    ) -> impl Future<Output = sqlx::Result<Vec<(TaskState, u32, u64)>>> + Send;
    /// `(name, run time in µs)` of the tasks that succeeded in the last `minutes` (their last
    /// attempt: `finished_at - attempted_at`), newest first, at most `limit`: a range of
    /// `ix_taskq_finished`.
    fn task_run_times(
        &self,
        minutes: u32,
        limit: u32,
    ) -> impl Future<Output = sqlx::Result<Vec<(String, i64)>>> + Send;
    /// Tasks retention would prune now.
    fn task_prune_count(
        &self,
        state: TaskState,
        age_secs: u64,
    ) -> impl Future<Output = sqlx::Result<u64>> + Send;
    /// Tasks per queue and state.
    fn task_stats(
        &self,
        conn: &mut Self::Conn,
    ) -> impl Future<Output = sqlx::Result<Vec<QueueStateCount>>> + Send;
    /// Pending and running tasks per queue.
    fn task_stats_active(
        &self,
        conn: &mut Self::Conn,
    ) -> impl Future<Output = sqlx::Result<Vec<QueueStateCount>>> + Send;
    /// Tasks in terminal states per queue.
    fn task_stats_terminal(
        &self,
        conn: &mut Self::Conn,
    ) -> impl Future<Output = sqlx::Result<Vec<QueueStateCount>>> + Send;
    /// Pending tasks per name.
    fn task_pending_by_name(
        &self,
        conn: &mut Self::Conn,
        queue: Option<&str>,
    ) -> impl Future<Output = sqlx::Result<Vec<PendingNameCount>>> + Send;
    /// Ids (and whether running) of a bulk action's tasks, ascending past `after_id`.
    fn task_bulk_ids(
        &self,
        f: &TaskFilter<'_>,
        age_us: i64,
        after_id: u64,
        limit: u32,
    ) -> impl Future<Output = sqlx::Result<Vec<(u64, bool)>>> + Send;
    /// How many tasks a bulk action would touch.
    fn task_bulk_count(
        &self,
        f: &TaskFilter<'_>,
        age_us: i64,
    ) -> impl Future<Output = sqlx::Result<u64>> + Send;
    /// Ids of dead unique tasks (retried one by one).
    fn task_dead_unique_ids(
        &self,
        queue: Option<&str>,
        died_before: DateTime<Utc>,
        after_id: u64,
        limit: u32,
    ) -> impl Future<Output = sqlx::Result<Vec<TaskId>>> + Send;
}

/// The operator's writes to `taskq_tasks` (cancel, retry, reschedule, priority, delete), one task or a batch, and retention.
pub trait Actions: Handle {
    /// Cancels pending tasks by id.
    fn task_cancel_batch(&self, ids: &[u64]) -> impl Future<Output = sqlx::Result<u64>> + Send;
    /// Asks running tasks by id to cancel.
    fn task_request_cancel_batch(
        &self,
        ids: &[u64],
    ) -> impl Future<Output = sqlx::Result<u64>> + Send;
    /// Retries dead tasks by id.
    fn task_retry_dead_ids(&self, ids: &[u64]) -> impl Future<Output = sqlx::Result<u64>> + Send;
    /// Asks one running task to cancel.
    fn task_request_cancel(
        &self,
        conn: &mut Self::Conn,
        id: TaskId,
    ) -> impl Future<Output = sqlx::Result<bool>> + Send;
    /// Cancels one pending task.
    fn task_cancel(
        &self,
        conn: &mut Self::Conn,
        id: TaskId,
    ) -> impl Future<Output = sqlx::Result<bool>> + Send;
    /// Moves a pending task's `run_at`.
    fn task_reschedule(
        &self,
        conn: &mut Self::Conn,
        id: TaskId,
        at: Option<DateTime<Utc>>,
        delay_us: i64,
    ) -> impl Future<Output = sqlx::Result<bool>> + Send;
    /// Changes a pending task's priority.
    fn task_set_priority(
        &self,
        conn: &mut Self::Conn,
        id: TaskId,
        priority: i16,
    ) -> impl Future<Output = sqlx::Result<bool>> + Send;
    /// Deletes a task that is not running (pending or finished), with the unique identity it
    /// holds; whether a row was deleted. On the caller's transaction (with its audit row).
    fn task_delete(
        &self,
        conn: &mut Self::Conn,
        id: TaskId,
    ) -> impl Future<Output = sqlx::Result<bool>> + Send;
    /// Retries one dead task.
    fn task_retry_dead(
        &self,
        conn: &mut Self::Conn,
        id: TaskId,
    ) -> impl Future<Output = sqlx::Result<RetryDead>> + Send;
    /// Retries dead tasks of a queue that died before a time.
    fn task_retry_dead_batch(
        &self,
        queue: Option<&str>,
        died_before: DateTime<Utc>,
        limit: u32,
    ) -> impl Future<Output = sqlx::Result<u64>> + Send;
    /// Deletes tasks of a terminal state older than `age_secs`.
    fn task_prune(
        &self,
        conn: &mut Self::Conn,
        state: TaskState,
        age_secs: u64,
        limit: u32,
    ) -> impl Future<Output = sqlx::Result<u64>> + Send;
}

/// What a worker does under a lease: renew, check, write back, release; and the reap of expired leases, each under its epoch.
pub trait Leases: Handle {
    /// Renews the leases (`(id, epoch)`) this worker holds; how many were renewed.
    fn task_heartbeat(
        &self,
        conn: &mut Self::Conn,
        leases: &[(u64, u64)],
        lease_us: i64,
    ) -> impl Future<Output = sqlx::Result<u64>> + Send;
    /// Which of the leases are still held, and whether cancel was requested on each.
    fn task_leases_held(
        &self,
        conn: &mut Self::Conn,
        leases: &[(u64, u64)],
    ) -> impl Future<Output = sqlx::Result<Vec<(u64, u64, bool)>>> + Send;
    /// Writes back a batch of ended attempts, each under its epoch.
    fn task_write_back(
        &self,
        conn: &mut Self::Conn,
        batch: &[WriteBack],
    ) -> impl Future<Output = sqlx::Result<WrittenBack>> + Send;
    /// Returns held leases to pending (shutdown).
    fn task_release(
        &self,
        conn: &mut Self::Conn,
        leases: &[(u64, u64)],
    ) -> impl Future<Output = sqlx::Result<u64>> + Send;
    /// Leases `(id, epoch)` of `queue`'s running tasks that `worker_id` claimed in the last
    /// `since_us` µs (a claim whose answer was lost may have taken some).
    fn task_running_since(
        &self,
        conn: &mut Self::Conn,
        queue: &str,
        worker_id: &str,
        since_us: i64,
    ) -> impl Future<Output = sqlx::Result<Vec<(u64, u64)>>> + Send;
    /// Lapsed leases (running tasks whose lease ended), with whether each task's name is in
    /// `names`.
    fn task_lapsed(
        &self,
        conn: &mut Self::Conn,
        names: &NameList,
        limit: u32,
    ) -> impl Future<Output = sqlx::Result<Vec<LapsedRow>>> + Send;
    /// Reaps expired leases, each under its epoch.
    fn task_reap(
        &self,
        conn: &mut Self::Conn,
        rows: &[ReapRow],
        exact: bool,
    ) -> impl Future<Output = sqlx::Result<Reaped>> + Send;
    /// Current epochs of the tasks `ids` that are running.
    fn task_epochs(
        &self,
        conn: &mut Self::Conn,
        ids: &[u64],
    ) -> impl Future<Output = sqlx::Result<Vec<(u64, u64)>>> + Send;
}

/// Unique identities (`taskq_unique`).
pub trait Identities: Handle {
    /// Deletes expired unique identities.
    fn unique_prune_expired(
        &self,
        conn: &mut Self::Conn,
        limit: u32,
    ) -> impl Future<Output = sqlx::Result<u64>> + Send;
}

/// Queue controls (`taskq_queues`): pause, limits, the list.
pub trait Queues: Handle {
    /// Pauses a queue.
    fn queue_pause(
        &self,
        conn: &mut Self::Conn,
        queue: &str,
    ) -> impl Future<Output = sqlx::Result<()>> + Send;
    /// Resumes a queue; whether it was paused.
    fn queue_resume(
        &self,
        conn: &mut Self::Conn,
        queue: &str,
    ) -> impl Future<Output = sqlx::Result<bool>> + Send;
    /// Paused queues.
    fn queues_paused(
        &self,
        conn: &mut Self::Conn,
    ) -> impl Future<Output = sqlx::Result<Vec<(String, DateTime<Utc>)>>> + Send;
    /// Paused and limited queues, for the worker's refresh.
    fn queue_controls(
        &self,
        conn: &mut Self::Conn,
    ) -> impl Future<Output = sqlx::Result<Vec<QueueControl>>> + Send;
    /// Sets or clears a queue's concurrency limit, on the caller's transaction (with its audit
    /// row).
    fn queue_set_limit(
        &self,
        conn: &mut Self::Conn,
        queue: &str,
        limit: Option<u32>,
    ) -> impl Future<Output = sqlx::Result<()>> + Send;
    /// Sets or clears a queue's rate limit, on the caller's transaction (with its audit row).
    fn queue_set_rate_limit(
        &self,
        conn: &mut Self::Conn,
        queue: &str,
        rate: Option<(u32, i64)>,
    ) -> impl Future<Output = sqlx::Result<()>> + Send;
    /// Queues with their controls and counts.
    fn queue_list(&self) -> impl Future<Output = sqlx::Result<Vec<QueueRow>>> + Send;
}

/// Recurring schedules (`taskq_schedules`).
pub trait Schedules: Handle {
    /// Declares a schedule (worker start).
    fn schedule_declare(
        &self,
        conn: &mut Self::Conn,
        d: &ScheduleDecl<'_>,
    ) -> impl Future<Output = sqlx::Result<()>> + Send;
    /// The state of the schedules named in `names`.
    fn schedule_states(
        &self,
        conn: &mut Self::Conn,
        names: &NameList,
    ) -> impl Future<Output = sqlx::Result<Vec<ScheduleState>>> + Send;
    /// One compare-and-set step of a schedule, enqueueing its ticks.
    fn schedule_fire(
        &self,
        conn: &mut Self::Conn,
        f: &ScheduleFire<'_>,
    ) -> impl Future<Output = sqlx::Result<Option<Vec<TaskId>>>> + Send;
    /// Every schedule.
    fn schedule_list(&self) -> impl Future<Output = sqlx::Result<Vec<ScheduleInfo>>> + Send;
    /// Deletes a schedule.
    fn schedule_delete(
        &self,
        conn: &mut Self::Conn,
        name: &str,
    ) -> impl Future<Output = sqlx::Result<bool>> + Send;
}

/// Live workers (`taskq_workers`).
pub trait Workers: Handle {
    /// Records a worker's start.
    fn worker_start(
        &self,
        conn: &mut Self::Conn,
        w: &WorkerRow<'_>,
    ) -> impl Future<Output = sqlx::Result<()>> + Send;
    /// Records that a worker is alive.
    fn worker_seen(
        &self,
        conn: &mut Self::Conn,
        w: &WorkerRow<'_>,
    ) -> impl Future<Output = sqlx::Result<()>> + Send;
    /// Records a worker's stop.
    fn worker_stop(
        &self,
        conn: &mut Self::Conn,
        worker_id: &str,
    ) -> impl Future<Output = sqlx::Result<bool>> + Send;
    /// Deletes workers not seen for `age_secs`.
    fn worker_prune(
        &self,
        conn: &mut Self::Conn,
        age_secs: u64,
        limit: u32,
    ) -> impl Future<Output = sqlx::Result<u64>> + Send;
    /// Known workers.
    fn worker_list(
        &self,
        conn: &mut Self::Conn,
    ) -> impl Future<Output = sqlx::Result<Vec<WorkerListRow>>> + Send;
}

/// Attempt history and the audit trail (`taskq_audit`).
pub trait History: Handle {
    /// A task's attempt history (JSON), if the task exists.
    fn task_attempts(
        &self,
        id: TaskId,
    ) -> impl Future<Output = sqlx::Result<Option<Option<String>>>> + Send;
    /// Failed attempts per outcome and minute, over the last `minutes`.
    fn task_failed_attempts_per_minute(
        &self,
        minutes: u32,
    ) -> impl Future<Output = sqlx::Result<Vec<(String, u32, u64)>>> + Send;
    /// A page of the audit trail, newest first.
    fn audit_list(
        &self,
        task_id: Option<u64>,
        queue: Option<&str>,
        before_id: u64,
        limit: u32,
    ) -> impl Future<Output = sqlx::Result<Vec<AuditListRow>>> + Send;
    /// Deletes audit entries older than `age_secs`.
    fn audit_prune(
        &self,
        conn: &mut Self::Conn,
        age_secs: u64,
        limit: u32,
    ) -> impl Future<Output = sqlx::Result<u64>> + Send;
}

/// The database clock.
pub trait Clock: Handle {
    /// The database clock.
    fn db_now(&self) -> impl Future<Output = sqlx::Result<DateTime<Utc>>> + Send;
    /// The database clock, on a connection.
    fn db_now_on(
        &self,
        conn: &mut Self::Conn,
    ) -> impl Future<Output = sqlx::Result<DateTime<Utc>>> + Send;
}

/// The database's limits on one statement.
pub trait StatementBudget: Handle {
    /// The byte limits of the server's multi-row statements (MySQL: its `max_allowed_packet`).
    fn statement_budget(
        &self,
        conn: &mut Self::Conn,
    ) -> impl Future<Output = sqlx::Result<Budget>> + Send;
}

/// Every operation of the seam: what a driver provides.
pub trait Driver:
    Enqueue
    + Tasks
    + Actions
    + Claims
    + Leases
    + Identities
    + Queues
    + Schedules
    + Workers
    + History
    + Clock
    + StatementBudget
{
}

impl<D> Driver for D where
    D: Enqueue
        + Tasks
        + Actions
        + Claims
        + Leases
        + Identities
        + Queues
        + Schedules
        + Workers
        + History
        + Clock
        + StatementBudget
{
}
