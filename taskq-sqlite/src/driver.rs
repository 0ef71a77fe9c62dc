//! The SQLite driver: the seam's operations (`taskq_driver::driver`) over this crate's
//! statements, which take and return the seam's rows (`taskq_driver::rows`) themselves; the
//! operations on the driver's pool take a connection of it first.
//!
//! What differs from MySQL (see taskq's docs/semantics.md): one writer at a time per file
//! (claims, write-backs and enqueues take turns on the write lock, waiting up to the busy
//! timeout), one host only, never on a network filesystem; no candidate windows or seek
//! positions (the claim is one `UPDATE … RETURNING` under the write lock, so nothing is ever
//! "held elsewhere").

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};
use sqlx::{Sqlite, SqliteConnection, SqlitePool, Transaction};

use crate::connect::{DEFAULT_BUSY_TIMEOUT, begin_immediate, tune};
use crate::conv::sid;
use crate::{
    batches, clock, enqueue, history, identities, inbox, lease, order, queues, schedules, tasks,
    workers, workflows,
};
use taskq_driver::driver::{
    Actions, Batches, Claims, Clock, Enqueue, Handle, History, Identities, Leases, Queues,
    Schedules, StatementBudget, Tasks, Workers, Workflows,
};
use taskq_driver::dynamic::ErrorClass;
use taskq_driver::read::{PendingNameCount, QueueStateCount, ScheduleInfo, TaskInfo};
use taskq_driver::rows::*;
use taskq_driver::state::{TaskId, TaskState};

/// A SQLite pool handle.
#[derive(Debug, Clone)]
pub struct SqliteDriver {
    pool: SqlitePool,
}

/// Whether a database error is SQLite's "database is locked" (`SQLITE_BUSY`, also
/// `SQLITE_BUSY_SNAPSHOT` and friends): the write lock stayed taken past the busy timeout.
pub fn is_busy(e: &dyn sqlx::error::DatabaseError) -> bool {
    e.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some()
        && e.code()
            .is_some_and(|c| c.parse::<i32>().is_ok_and(|n| n & 0xff == 5))
}

/// The busy timeout set on `opts`. sqlx 0.9 has no getter for it, so it is read from the
/// options' `Debug` text (`busy_timeout: 5s`); `None` if that text has no such field.
fn busy_timeout_of(opts: &SqliteConnectOptions) -> Option<Duration> {
    let text = format!("{opts:?}");
    let rest = &text[text.find("busy_timeout: ")? + "busy_timeout: ".len()..];
    let value = &rest[..rest.find([',', ' ', '}']).unwrap_or(rest.len())];
    let split = value.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let (number, unit) = value.split_at(split);
    let number: f64 = number.parse().ok()?;
    let nanos = match unit {
        "s" => 1e9,
        "ms" => 1e6,
        "µs" | "us" => 1e3,
        "ns" => 1.0,
        _ => return None,
    };
    Some(Duration::from_nanos((number * nanos).round() as u64))
}

/// Whether a database error is SQLite's `SQLITE_TOOBIG` (a string or blob over its length
/// limit) or `SQLITE_CONSTRAINT` (a constraint, or a trigger's `RAISE(ABORT, ..)`): the
/// statement fails the same way every time.
pub fn is_refused(e: &dyn sqlx::error::DatabaseError) -> bool {
    e.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some()
        && e.code()
            .is_some_and(|c| c.parse::<i32>().is_ok_and(|n| matches!(n & 0xff, 18 | 19)))
}

impl SqliteDriver {
    /// A handle on `pool`.
    pub fn new(pool: SqlitePool) -> Self {
        Self { pool }
    }

    /// The pool behind this store.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// A pool of the worker on the same file: taskq's settings (WAL, `synchronous = NORMAL`)
    /// over the user's options, and the user's busy timeout; no ping before each use.
    pub fn worker_store(&self, spec: taskq_driver::pool::WorkerPool) -> Self {
        self.worker_store_waiting(spec, self.busy_timeout())
    }

    /// [`worker_store`](Self::worker_store) with a busy timeout of `busy`, or the user's when
    /// that is shorter.
    pub fn worker_store_waiting(
        &self,
        spec: taskq_driver::pool::WorkerPool,
        busy: Duration,
    ) -> Self {
        let busy = busy.min(self.busy_timeout());
        let opts: SqliteConnectOptions =
            tune((*self.pool.connect_options()).clone()).busy_timeout(busy);
        let pool = SqlitePoolOptions::new()
            .max_connections(spec.connections.max(1))
            .min_connections(0)
            .acquire_timeout(spec.statement_timeout)
            .test_before_acquire(false)
            .connect_lazy_with(opts);
        Self { pool }
    }

    /// The busy timeout of this pool's connections (`SqliteConnectOptions::busy_timeout`;
    /// [`DEFAULT_BUSY_TIMEOUT`] if it cannot be read).
    pub fn busy_timeout(&self) -> Duration {
        busy_timeout_of(&self.pool.connect_options()).unwrap_or(DEFAULT_BUSY_TIMEOUT)
    }

    /// A write transaction (`BEGIN IMMEDIATE`: the write lock at once).
    pub async fn begin(&self) -> sqlx::Result<Transaction<'static, Sqlite>> {
        begin_immediate(&self.pool).await
    }

    async fn conn(&self) -> sqlx::Result<sqlx::pool::PoolConnection<Sqlite>> {
        self.pool.acquire().await
    }
}

impl Handle for SqliteDriver {
    type Conn = SqliteConnection;
    type Database = Sqlite;
    const NAME: &'static str = "SQLite";
    fn from_pool(pool: SqlitePool) -> Self {
        Self::new(pool)
    }
    fn pool(&self) -> &SqlitePool {
        &self.pool
    }
    fn worker_store(&self, spec: taskq_driver::pool::WorkerPool) -> Self {
        Self::worker_store(self, spec)
    }
    fn worker_store_waiting(&self, spec: taskq_driver::pool::WorkerPool, busy: Duration) -> Self {
        Self::worker_store_waiting(self, spec, busy)
    }
    /// `BEGIN IMMEDIATE`: the write lock at once.
    async fn begin(&self) -> sqlx::Result<Transaction<'static, Sqlite>> {
        Self::begin(self).await
    }
    fn busy_timeout(&self) -> Option<Duration> {
        Some(Self::busy_timeout(self))
    }
    /// A conflict: `SQLITE_BUSY` past the busy timeout. Refused: `SQLITE_TOOBIG`,
    /// `SQLITE_CONSTRAINT`.
    fn classify(e: &dyn sqlx::error::DatabaseError) -> ErrorClass {
        ErrorClass {
            conflict: is_busy(e),
            refused: is_refused(e),
        }
    }
}

impl Enqueue for SqliteDriver {
    async fn task_insert(conn: &mut SqliteConnection, row: &NewTask<'_>) -> sqlx::Result<Inserted> {
        enqueue::task_insert(conn, row).await
    }
    /// Ids from `RETURNING`.
    async fn task_insert_rows(
        conn: &mut SqliteConnection,
        rows: &[NewTask<'_>],
    ) -> sqlx::Result<Vec<TaskId>> {
        let done = enqueue::task_insert_many(conn, rows).await?;
        Ok(done
            .into_iter()
            .map(|i| match i {
                Inserted::New(id) | Inserted::Duplicate(id) => id,
            })
            .collect())
    }
    async fn task_insert_ordered(
        conn: &mut SqliteConnection,
        row: &NewTask<'_>,
        order: &taskq_driver::rows::OrderKey<'_>,
    ) -> sqlx::Result<Inserted> {
        order::task_insert_ordered(conn, row, order).await
    }
    async fn db_clock_us(conn: &mut SqliteConnection) -> sqlx::Result<i64> {
        clock::db_clock_us(conn).await
    }
    async fn audit_insert(conn: &mut SqliteConnection, row: &AuditRow<'_>) -> sqlx::Result<u64> {
        history::audit_insert(conn, row).await
    }
    async fn inbox_record(
        conn: &mut SqliteConnection,
        consumer: &str,
        message_id: &str,
    ) -> sqlx::Result<bool> {
        inbox::inbox_record(conn, consumer, message_id).await
    }
    async fn inbox_prune(
        conn: &mut SqliteConnection,
        consumer: &str,
        age_us: i64,
        limit: u32,
    ) -> sqlx::Result<u64> {
        inbox::inbox_prune(conn, consumer, age_us, limit).await
    }
    async fn event_insert(
        conn: &mut SqliteConnection,
        row: &taskq_driver::event::NewEvent<'_>,
    ) -> sqlx::Result<taskq_driver::event::EventInserted> {
        crate::events::event_insert(conn, row).await
    }
    async fn workflow_insert(
        conn: &mut SqliteConnection,
        wf: &taskq_driver::rows::NewWorkflow<'_>,
    ) -> sqlx::Result<taskq_driver::rows::WorkflowInserted> {
        workflows::workflow_insert(conn, wf).await
    }
    async fn batch_insert(
        conn: &mut SqliteConnection,
        b: &NewBatch<'_>,
    ) -> sqlx::Result<BatchInserted> {
        batches::batch_insert(conn, b).await
    }
    async fn batch_add(
        conn: &mut SqliteConnection,
        id: u64,
        members: &[NewTask<'_>],
        seal: bool,
    ) -> sqlx::Result<BatchAdded> {
        batches::batch_add(conn, id, members, seal).await
    }
}

impl Tasks for SqliteDriver {
    async fn task_get(&self, id: TaskId) -> sqlx::Result<Option<TaskInfo>> {
        tasks::task_get(&mut *self.conn().await?, id).await
    }

    async fn task_list(
        &self,
        f: &TaskFilter<'_>,
        after_id: u64,
        up_to: u64,
        limit: u32,
    ) -> sqlx::Result<Vec<TaskInfo>> {
        tasks::task_list(&mut *self.conn().await?, f, after_id, up_to, limit).await
    }

    async fn task_list_pending(
        &self,
        kind: PendingKind,
        queue: Option<&str>,
        after: Option<(DateTime<Utc>, u64)>,
        limit: u32,
    ) -> sqlx::Result<Vec<TaskInfo>> {
        let (at, after_id) = after.map_or((i64::MIN, 0), |(t, i)| (t.timestamp_micros(), i));
        let mut c = self.conn().await?;
        tasks::task_list_pending(&mut c, kind, queue, at, sid(after_id), limit).await
    }

    async fn task_list_desc(
        &self,
        f: &TaskFilter<'_>,
        before_id: u64,
        from: u64,
        limit: u32,
    ) -> sqlx::Result<Vec<TaskInfo>> {
        tasks::task_list_desc(&mut *self.conn().await?, f, before_id, from, limit).await
    }

    async fn task_id_bounds(&self) -> sqlx::Result<(u64, u64)> {
        tasks::task_id_bounds(&mut *self.conn().await?).await
    }

    async fn task_list_queue_desc(
        &self,
        queue: &str,
        name: Option<&str>,
        before_id: u64,
        limit: u32,
    ) -> sqlx::Result<Vec<TaskInfo>> {
        tasks::task_list_queue_desc(&mut *self.conn().await?, queue, name, before_id, limit).await
    }

    async fn task_list_queue_asc(
        &self,
        queue: &str,
        name: Option<&str>,
        after_id: u64,
        limit: u32,
    ) -> sqlx::Result<Vec<TaskInfo>> {
        tasks::task_list_queue_asc(&mut *self.conn().await?, queue, name, after_id, limit).await
    }

    async fn task_finished_per_minute(
        &self,
        minutes: u32,
    ) -> sqlx::Result<Vec<(TaskState, u32, u64)>> {
        tasks::task_finished_per_minute(&mut *self.conn().await?, minutes).await
    }

    async fn task_run_times(&self, minutes: u32, limit: u32) -> sqlx::Result<Vec<(String, i64)>> {
        tasks::task_run_times(&mut *self.conn().await?, minutes, limit).await
    }

    async fn task_prune_count(&self, s: TaskState, age_secs: u64) -> sqlx::Result<u64> {
        tasks::task_prune_count(&mut *self.conn().await?, s, age_secs).await
    }

    async fn task_count(&self, f: &TaskFilter<'_>) -> sqlx::Result<u64> {
        tasks::task_count(&mut *self.conn().await?, f).await
    }

    async fn task_stats(&self, conn: &mut SqliteConnection) -> sqlx::Result<Vec<QueueStateCount>> {
        let mut rows = tasks::task_stats(conn).await?;
        // By queue, then state in lifecycle order (`TaskState::ALL`), as on MySQL.
        rows.sort_by_key(|r| (r.queue.clone(), r.state as u8));
        Ok(rows)
    }

    async fn task_stats_active(
        &self,
        conn: &mut SqliteConnection,
    ) -> sqlx::Result<Vec<QueueStateCount>> {
        tasks::task_stats_half(conn, false).await
    }

    async fn task_stats_terminal(
        &self,
        conn: &mut SqliteConnection,
    ) -> sqlx::Result<Vec<QueueStateCount>> {
        tasks::task_stats_half(conn, true).await
    }

    async fn task_pending_by_name(
        &self,
        conn: &mut SqliteConnection,
        queue: Option<&str>,
    ) -> sqlx::Result<Vec<PendingNameCount>> {
        tasks::task_pending_by_name(conn, queue).await
    }

    async fn task_bulk_ids(
        &self,
        f: &TaskFilter<'_>,
        age_us: i64,
        after_id: u64,
        limit: u32,
    ) -> sqlx::Result<Vec<(u64, bool)>> {
        tasks::task_bulk_ids(&mut *self.conn().await?, f, age_us, after_id, limit).await
    }

    async fn task_bulk_count(&self, f: &TaskFilter<'_>, age_us: i64) -> sqlx::Result<u64> {
        tasks::task_bulk_count(&mut *self.conn().await?, f, age_us).await
    }

    async fn task_state(&self, id: TaskId) -> sqlx::Result<Option<TaskState>> {
        tasks::task_state(&mut *self.conn().await?, id).await
    }

    async fn task_dead_unique_ids(
        &self,
        queue: Option<&str>,
        died_before: DateTime<Utc>,
        after_id: u64,
        limit: u32,
    ) -> sqlx::Result<Vec<TaskId>> {
        let mut c = self.conn().await?;
        tasks::task_dead_unique_ids(&mut c, queue, died_before, after_id, limit).await
    }

    async fn order_keys_held(
        &self,
        queue: Option<&str>,
        limit: u32,
    ) -> sqlx::Result<Vec<taskq_driver::rows::HeldKey>> {
        order::order_keys_held(&self.pool, queue, limit).await
    }
}

impl Actions for SqliteDriver {
    async fn task_cancel_batch(&self, ids: &[u64]) -> sqlx::Result<u64> {
        tasks::task_cancel_batch(&mut *self.conn().await?, ids).await
    }

    async fn task_request_cancel_batch(&self, ids: &[u64]) -> sqlx::Result<u64> {
        tasks::task_request_cancel_batch(&mut *self.conn().await?, ids).await
    }

    async fn task_retry_dead_ids(&self, ids: &[u64]) -> sqlx::Result<u64> {
        tasks::task_retry_dead_ids(&mut *self.conn().await?, ids).await
    }

    async fn task_request_cancel(
        &self,
        conn: &mut SqliteConnection,
        id: TaskId,
    ) -> sqlx::Result<bool> {
        tasks::task_request_cancel(conn, id).await
    }

    async fn task_cancel(&self, conn: &mut SqliteConnection, id: TaskId) -> sqlx::Result<bool> {
        tasks::task_cancel(conn, id).await
    }

    async fn task_delete(&self, conn: &mut SqliteConnection, t: TaskId) -> sqlx::Result<bool> {
        tasks::task_delete(conn, t).await
    }

    async fn task_reschedule(
        &self,
        conn: &mut SqliteConnection,
        id: TaskId,
        at: Option<DateTime<Utc>>,
        delay_us: i64,
    ) -> sqlx::Result<bool> {
        tasks::task_reschedule(conn, id, at, delay_us).await
    }

    async fn task_set_priority(
        &self,
        conn: &mut SqliteConnection,
        id: TaskId,
        priority: i16,
    ) -> sqlx::Result<bool> {
        tasks::task_set_priority(conn, id, priority).await
    }

    async fn task_retry_dead(
        &self,
        conn: &mut SqliteConnection,
        id: TaskId,
    ) -> sqlx::Result<RetryDead> {
        tasks::task_retry_dead(conn, id).await
    }

    async fn task_prune(
        &self,
        conn: &mut SqliteConnection,
        s: TaskState,
        age_secs: u64,
        limit: u32,
    ) -> sqlx::Result<u64> {
        tasks::task_prune(conn, s, age_secs, limit).await
    }

    async fn task_retry_dead_batch(
        &self,
        queue: Option<&str>,
        died_before: DateTime<Utc>,
        limit: u32,
    ) -> sqlx::Result<u64> {
        tasks::task_retry_dead_batch(&mut *self.conn().await?, queue, died_before, limit).await
    }
}

impl Claims for SqliteDriver {
    /// One `UPDATE … RETURNING` under the write lock: the cursor holds nothing.
    async fn task_claim(
        &self,
        conn: &mut SqliteConnection,
        req: &ClaimRequest<'_>,
        _cursor: &mut ClaimCursor,
    ) -> sqlx::Result<ClaimBatch> {
        lease::task_claim(conn, req).await
    }
}

impl Leases for SqliteDriver {
    async fn task_heartbeat(
        &self,
        conn: &mut SqliteConnection,
        leases: &[(u64, u64)],
        lease_us: i64,
    ) -> sqlx::Result<u64> {
        lease::task_heartbeat(conn, leases, lease_us).await
    }

    async fn task_leases_held(
        &self,
        conn: &mut SqliteConnection,
        leases: &[(u64, u64)],
    ) -> sqlx::Result<Vec<(u64, u64, bool)>> {
        lease::task_leases_held(conn, leases).await
    }

    async fn task_write_back(
        &self,
        conn: &mut SqliteConnection,
        batch: &[WriteBack],
    ) -> sqlx::Result<WrittenBack> {
        lease::task_write_back(conn, batch).await
    }

    async fn task_release(
        &self,
        conn: &mut SqliteConnection,
        leases: &[(u64, u64)],
    ) -> sqlx::Result<u64> {
        lease::task_release(conn, leases).await
    }

    async fn task_running_since(
        &self,
        conn: &mut SqliteConnection,
        queue: &str,
        worker_id: &str,
        since_us: i64,
    ) -> sqlx::Result<Vec<(u64, u64)>> {
        lease::task_running_since(conn, queue, worker_id, since_us).await
    }

    async fn task_lapsed(
        &self,
        conn: &mut SqliteConnection,
        names: &NameList,
        limit: u32,
    ) -> sqlx::Result<Vec<LapsedRow>> {
        lease::task_lapsed(conn, names, limit).await
    }

    /// Always lists the rows reaped (`exact` or not: they come from `RETURNING`).
    async fn task_reap(
        &self,
        conn: &mut SqliteConnection,
        rows: &[ReapRow],
        _exact: bool,
    ) -> sqlx::Result<Reaped> {
        lease::task_reap(conn, rows).await
    }

    async fn task_epochs(
        &self,
        conn: &mut SqliteConnection,
        ids: &[u64],
    ) -> sqlx::Result<Vec<(u64, u64)>> {
        lease::task_epochs(conn, ids).await
    }

    /// Nothing to do: SQLite advances every key in the transaction that ends its head (one
    /// writer at a time, so that never waits for a producer holding task rows), so no key is
    /// ever left stranded.
    async fn order_keys_advance_stranded(
        &self,
        _conn: &mut SqliteConnection,
        _limit: u32,
    ) -> sqlx::Result<u64> {
        Ok(0)
    }
}

impl Identities for SqliteDriver {
    async fn unique_prune_expired(
        &self,
        conn: &mut SqliteConnection,
        limit: u32,
    ) -> sqlx::Result<u64> {
        identities::unique_prune_expired(conn, limit).await
    }
}

impl Queues for SqliteDriver {
    async fn queue_pause(&self, conn: &mut SqliteConnection, queue: &str) -> sqlx::Result<()> {
        queues::queue_pause(conn, queue).await
    }

    async fn queue_resume(&self, conn: &mut SqliteConnection, queue: &str) -> sqlx::Result<bool> {
        queues::queue_resume(conn, queue).await
    }

    async fn queues_paused(
        &self,
        conn: &mut SqliteConnection,
    ) -> sqlx::Result<Vec<(String, DateTime<Utc>)>> {
        queues::queues_paused(conn).await
    }

    async fn queue_controls(&self, conn: &mut SqliteConnection) -> sqlx::Result<Vec<QueueControl>> {
        queues::queue_controls(conn).await
    }

    async fn queue_set_limit(
        &self,
        conn: &mut SqliteConnection,
        queue: &str,
        limit: Option<u32>,
    ) -> sqlx::Result<()> {
        queues::queue_set_limit(conn, queue, limit).await
    }

    async fn queue_set_rate_limit(
        &self,
        conn: &mut SqliteConnection,
        queue: &str,
        rate: Option<(u32, i64)>,
    ) -> sqlx::Result<()> {
        queues::queue_set_rate_limit(conn, queue, rate).await
    }

    async fn queue_list(&self) -> sqlx::Result<Vec<QueueRow>> {
        queues::queue_list(&mut *self.conn().await?).await
    }
}

impl Schedules for SqliteDriver {
    async fn schedule_declare(
        &self,
        conn: &mut SqliteConnection,
        d: &ScheduleDecl<'_>,
    ) -> sqlx::Result<()> {
        schedules::schedule_declare(conn, d).await
    }

    async fn schedule_states(
        &self,
        conn: &mut SqliteConnection,
        names: &NameList,
    ) -> sqlx::Result<Vec<ScheduleState>> {
        schedules::schedule_states(conn, names).await
    }

    async fn schedule_fire(
        &self,
        conn: &mut SqliteConnection,
        f: &ScheduleFire<'_>,
    ) -> sqlx::Result<Option<Vec<TaskId>>> {
        schedules::schedule_fire(conn, f).await
    }

    async fn schedule_list(&self) -> sqlx::Result<Vec<ScheduleInfo>> {
        schedules::schedule_list(&mut *self.conn().await?).await
    }

    async fn schedule_delete(&self, conn: &mut SqliteConnection, name: &str) -> sqlx::Result<bool> {
        schedules::schedule_delete(conn, name).await
    }
}

impl Workers for SqliteDriver {
    async fn worker_start(
        &self,
        conn: &mut SqliteConnection,
        w: &WorkerRow<'_>,
    ) -> sqlx::Result<()> {
        workers::worker_start(conn, w).await
    }

    async fn worker_seen(
        &self,
        conn: &mut SqliteConnection,
        w: &WorkerRow<'_>,
    ) -> sqlx::Result<()> {
        workers::worker_seen(conn, w).await
    }

    async fn worker_stop(
        &self,
        conn: &mut SqliteConnection,
        worker_id: &str,
    ) -> sqlx::Result<bool> {
        workers::worker_stop(conn, worker_id).await
    }

    async fn worker_prune(
        &self,
        conn: &mut SqliteConnection,
        age_secs: u64,
        limit: u32,
    ) -> sqlx::Result<u64> {
        workers::worker_prune(conn, age_secs, limit).await
    }

    async fn worker_list(&self, conn: &mut SqliteConnection) -> sqlx::Result<Vec<WorkerListRow>> {
        workers::worker_list(conn).await
    }
}

impl History for SqliteDriver {
    async fn task_failed_attempts_per_minute(
        &self,
        minutes: u32,
    ) -> sqlx::Result<Vec<(String, u32, u64)>> {
        history::task_failed_attempts_per_minute(&mut *self.conn().await?, minutes).await
    }

    async fn task_attempts(&self, id: TaskId) -> sqlx::Result<Option<Option<String>>> {
        history::task_attempts(&mut *self.conn().await?, id).await
    }

    async fn audit_list(
        &self,
        task_id: Option<u64>,
        queue: Option<&str>,
        before_id: u64,
        limit: u32,
    ) -> sqlx::Result<Vec<AuditListRow>> {
        let mut c = self.conn().await?;
        history::audit_list(&mut c, task_id, queue, before_id, limit).await
    }

    async fn audit_prune(
        &self,
        conn: &mut SqliteConnection,
        age_secs: u64,
        limit: u32,
    ) -> sqlx::Result<u64> {
        history::audit_prune(conn, age_secs, limit).await
    }
}

impl Workflows for SqliteDriver {
    async fn workflow_settle_stranded(
        &self,
        conn: &mut SqliteConnection,
        limit: u32,
    ) -> sqlx::Result<taskq_driver::rows::Settled> {
        workflows::workflow_settle_stranded(conn, limit).await
    }
    async fn workflow_get(&self, id: u64) -> sqlx::Result<Option<taskq_driver::rows::WorkflowRow>> {
        workflows::workflow_get(&self.pool, id).await
    }
    async fn workflow_steps(
        &self,
        id: u64,
    ) -> sqlx::Result<Vec<taskq_driver::rows::WorkflowStepRow>> {
        workflows::workflow_steps(&self.pool, id).await
    }
    async fn workflow_step_output(
        &self,
        task: TaskId,
        step: &str,
    ) -> sqlx::Result<taskq_driver::rows::StepOutput> {
        workflows::workflow_step_output(&self.pool, task, step).await
    }
    async fn workflow_list(
        &self,
        name: Option<&str>,
        before_id: u64,
        limit: u32,
    ) -> sqlx::Result<Vec<taskq_driver::rows::WorkflowRow>> {
        workflows::workflow_list(&self.pool, name, before_id, limit).await
    }
    async fn workflow_cancel(
        &self,
        conn: &mut SqliteConnection,
        id: u64,
    ) -> sqlx::Result<taskq_driver::rows::WorkflowCanceled> {
        workflows::workflow_cancel(conn, id).await
    }
    async fn workflow_prune(&self, conn: &mut SqliteConnection, scan: u32) -> sqlx::Result<u64> {
        workflows::workflow_prune(conn, scan).await
    }
}

impl Batches for SqliteDriver {
    async fn batch_settle_stranded(
        &self,
        conn: &mut SqliteConnection,
        limit: u32,
    ) -> sqlx::Result<BatchCounted> {
        batches::batch_settle_stranded(conn, limit).await
    }
    async fn batch_get(&self, id: u64) -> sqlx::Result<Option<BatchRow>> {
        batches::batch_get(&self.pool, id).await
    }
    async fn batch_list(
        &self,
        name: Option<&str>,
        before_id: u64,
        limit: u32,
    ) -> sqlx::Result<Vec<BatchRow>> {
        batches::batch_list(&self.pool, name, before_id, limit).await
    }
    async fn batch_members(
        &self,
        id: u64,
        after_id: u64,
        limit: u32,
    ) -> sqlx::Result<Vec<BatchMemberRow>> {
        batches::batch_members(&self.pool, id, after_id, limit).await
    }
    async fn batch_cancel(
        &self,
        conn: &mut SqliteConnection,
        id: u64,
    ) -> sqlx::Result<BatchCanceled> {
        batches::batch_cancel(conn, id).await
    }
    async fn batch_prune(&self, conn: &mut SqliteConnection, scan: u32) -> sqlx::Result<u64> {
        batches::batch_prune(conn, scan).await
    }
}

impl Clock for SqliteDriver {
    async fn db_now(&self) -> sqlx::Result<DateTime<Utc>> {
        clock::db_now(&mut *self.conn().await?).await
    }

    async fn db_now_on(&self, conn: &mut SqliteConnection) -> sqlx::Result<DateTime<Utc>> {
        clock::db_now(conn).await
    }
}

impl StatementBudget for SqliteDriver {
    /// SQLite has no packet: its statements are bounded by its longest string.
    async fn statement_budget(
        &self,
        _conn: &mut SqliteConnection,
    ) -> sqlx::Result<taskq_driver::budget::Budget> {
        Ok(taskq_driver::budget::Budget::for_packet(
            taskq_driver::budget::SQLITE_MAX_LENGTH,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_busy_timeout_is_read_back_from_the_options() {
        for d in [
            Duration::from_secs(5),
            Duration::from_millis(250),
            Duration::from_millis(1_500),
            Duration::from_micros(2_500),
            Duration::ZERO,
            Duration::from_secs(600),
        ] {
            let opts = crate::connect_options("/tmp/x.db").busy_timeout(d);
            assert_eq!(busy_timeout_of(&opts), Some(d), "{d:?}");
        }
        assert_eq!(
            busy_timeout_of(&SqliteConnectOptions::new()),
            Some(Duration::from_secs(5))
        );
    }
}
