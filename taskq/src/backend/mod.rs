//! The backend seam, as the runtime sees it: which driver a pool belongs to, and one call per
//! operation that goes to that driver.
//!
//! [`Backend`] is the public, sealed trait of the databases taskq runs on (`sqlx::MySql`;
//! `sqlx::Sqlite` with the `sqlite` feature). Users never name it: it is inferred from their
//! `Pool<DB>`, `Transaction<'_, DB>` or connection, and turns it into a [`Store`] (a pool
//! handle of one driver) or a [`Conn`] (a borrowed connection of one driver).
//!
//! The operations themselves are typed once, in `taskq_driver::driver` (one trait per table or
//! job, with the rows of `taskq_driver::rows`), and implemented by each driver: the
//! `taskq-mysql` crate (its SQL split by table, checked against MySQL) and the `taskq-sqlite`
//! crate (its `driver` module over its statements). Everything above this
//! module — the worker's loops, the client, enqueue — calls the operations listed on [`Store`]
//! and [`Conn`] below, which forward to the pool's driver. How a driver claims (MySQL's
//! candidate windows and seek positions, SQLite's `BEGIN IMMEDIATE` + `UPDATE … RETURNING`)
//! stays inside it: the claim loop only carries an opaque [`ClaimCursor`].

use std::future::Future;

use chrono::{DateTime, Utc};
use sqlx::pool::PoolConnection;
use sqlx::{MySql, MySqlConnection, MySqlPool, Transaction};

#[allow(unused_imports)] // the driver operations the forwarding macros call
use taskq_driver::driver::{
    Actions as _, Claims as _, Clock as _, History as _, Identities as _, Leases as _, Queues as _,
    Schedules as _, StatementBudget as _, Tasks as _, Workers as _,
};
use taskq_driver::read::{PendingNameCount, QueueStateCount, ScheduleInfo, TaskInfo};
use taskq_driver::state::{TaskId, TaskState};

pub(crate) mod budget;
pub(crate) mod migrate_mysql;
pub(crate) use taskq_mysql as mysql;
mod rows;
#[cfg(feature = "sqlite")]
pub(crate) mod sqlite;

pub(crate) use rows::*;

mod sealed {
    pub trait Sealed {}
    impl Sealed for sqlx::MySql {}
    #[cfg(feature = "sqlite")]
    impl Sealed for sqlx::Sqlite {}
}

/// A database taskq runs on: `sqlx::MySql` (MySQL 8 / MariaDB 10.6+, the default), or
/// `sqlx::Sqlite` (feature `sqlite`). Sealed; inferred from the pool, transaction or connection
/// you pass to taskq, so `taskq::migrate(&pool)`, `Worker::builder(pool)`, `Client::new(pool)`
/// and `enqueue_tx(&mut tx)` read the same on both.
pub trait Backend: sqlx::Database + sealed::Sealed {
    /// The backend's name, as logs and errors print it.
    const NAME: &'static str;

    #[doc(hidden)]
    fn __store(pool: sqlx::Pool<Self>) -> StoreHandle;

    #[doc(hidden)]
    fn __conn(conn: &mut Self::Connection) -> ConnHandle<'_>;

    #[doc(hidden)]
    fn __migrate(pool: &sqlx::Pool<Self>) -> impl Future<Output = crate::Result<()>> + Send;
}

impl Backend for MySql {
    const NAME: &'static str = "MySQL";

    fn __store(pool: MySqlPool) -> StoreHandle {
        StoreHandle(Store::MySql(mysql::MySqlDriver::new(pool)))
    }

    fn __conn(conn: &mut MySqlConnection) -> ConnHandle<'_> {
        ConnHandle(Conn::MySql(conn))
    }

    fn __migrate(pool: &MySqlPool) -> impl Future<Output = crate::Result<()>> + Send {
        migrate_mysql::migrate_mysql(pool)
    }
}

#[cfg(feature = "sqlite")]
impl Backend for sqlx::Sqlite {
    const NAME: &'static str = "SQLite";

    fn __store(pool: sqlx::SqlitePool) -> StoreHandle {
        StoreHandle(Store::Sqlite(sqlite::SqliteDriver::new(pool)))
    }

    fn __conn(conn: &mut sqlx::SqliteConnection) -> ConnHandle<'_> {
        ConnHandle(Conn::Sqlite(conn))
    }

    fn __migrate(pool: &sqlx::SqlitePool) -> impl Future<Output = crate::Result<()>> + Send {
        sqlite::migrate(pool)
    }
}

/// A backend's pool handle, as [`Backend`]'s hidden methods hand it to taskq; nothing to use.
#[doc(hidden)]
pub struct StoreHandle(pub(crate) Store);

/// A backend's borrowed connection, as [`Backend`]'s hidden methods hand it to taskq.
#[doc(hidden)]
pub struct ConnHandle<'c>(pub(crate) Conn<'c>);

pub(crate) use taskq_driver::pool::WorkerPool;

/// A pool handle of one backend. Cheap to clone.
#[derive(Debug, Clone)]
pub(crate) enum Store {
    /// MySQL / MariaDB.
    MySql(mysql::MySqlDriver),
    /// SQLite.
    #[cfg(feature = "sqlite")]
    Sqlite(sqlite::SqliteDriver),
}

/// A borrowed connection of one backend: the caller's transaction (enqueue) or a connection
/// of the worker's pool.
pub(crate) enum Conn<'c> {
    /// MySQL / MariaDB.
    MySql(&'c mut MySqlConnection),
    /// SQLite.
    #[cfg(feature = "sqlite")]
    Sqlite(&'c mut sqlx::SqliteConnection),
}

/// A connection taken from a [`Store`]'s pool.
pub(crate) enum Pooled {
    MySql(PoolConnection<MySql>),
    #[cfg(feature = "sqlite")]
    Sqlite(PoolConnection<sqlx::Sqlite>),
}

impl Pooled {
    /// The connection, borrowed.
    pub(crate) fn conn(&mut self) -> Conn<'_> {
        match self {
            Pooled::MySql(c) => Conn::MySql(c),
            #[cfg(feature = "sqlite")]
            Pooled::Sqlite(c) => Conn::Sqlite(c),
        }
    }

    /// Takes the connection out of the pool without closing it gracefully (a statement on it
    /// timed out: its state is unknown).
    pub(crate) fn discard(self) {
        match self {
            Pooled::MySql(c) => drop(c.detach()),
            #[cfg(feature = "sqlite")]
            Pooled::Sqlite(c) => drop(c.detach()),
        }
    }
}

/// A transaction of a [`Store`] (the client's actions and their audit entries).
pub(crate) enum Tx {
    MySql(Transaction<'static, MySql>),
    #[cfg(feature = "sqlite")]
    Sqlite(Transaction<'static, sqlx::Sqlite>),
}

impl Tx {
    /// The transaction's connection.
    pub(crate) fn conn(&mut self) -> Conn<'_> {
        match self {
            Tx::MySql(t) => Conn::MySql(t),
            #[cfg(feature = "sqlite")]
            Tx::Sqlite(t) => Conn::Sqlite(t),
        }
    }

    /// Commits.
    pub(crate) async fn commit(self) -> sqlx::Result<()> {
        match self {
            Tx::MySql(t) => t.commit().await,
            #[cfg(feature = "sqlite")]
            Tx::Sqlite(t) => t.commit().await,
        }
    }
}

/// Where one queue's claim loop goes on from, kept by the loop between claims; what it holds
/// is the backend's business (MySQL: the seek position and candidate spread).
pub(crate) enum ClaimCursor {
    MySql(mysql::ClaimCursor),
    #[cfg(feature = "sqlite")]
    Sqlite,
}

/// Runs `$body` with `$s` bound to the backend store of `$store`.
macro_rules! on_store {
    ($store:expr, $s:ident => $body:expr) => {
        match $store {
            Store::MySql($s) => $body,
            #[cfg(feature = "sqlite")]
            Store::Sqlite($s) => $body,
        }
    };
}

/// Runs `$body` with `$s` the backend store of `$store` and `$c` the same backend's
/// connection of `$conn`. A connection of another backend than the store's is a bug.
macro_rules! on_conn {
    ($store:expr, $conn:expr, |$s:ident, $c:ident| $body:expr) => {
        match ($store, $conn) {
            (Store::MySql($s), Conn::MySql($c)) => $body,
            #[cfg(feature = "sqlite")]
            (Store::Sqlite($s), Conn::Sqlite($c)) => $body,
            #[cfg(feature = "sqlite")]
            _ => unreachable!("a connection of another backend than its store"),
        }
    };
}

/// Declares operations of [`Store`]: each forwards to the same-named method of the backend's
/// store (`fn name(&self, ..)`: on the store's pool; `fn name(&self, conn, ..)`: on a
/// connection the caller took, for the worker's deadlines and the client's transactions).
macro_rules! operations {
    ($(
        $(#[$m:meta])*
        fn $name:ident(&self $(, $conn:ident)? $(; $arg:ident: $ty:ty)* $(,)?) -> $ret:ty;
    )*) => {
        impl Store {$(
            $(#[$m])*
            pub(crate) async fn $name(&self $(, $conn: Conn<'_>)? $(, $arg: $ty)*) -> sqlx::Result<$ret> {
                operations!(@call self, $name, ($($conn)?), ($($arg),*))
            }
        )*}
    };
    (@call $self:ident, $name:ident, (), ($($arg:ident),*)) => {
        on_store!($self, s => s.$name($($arg),*).await)
    };
    (@call $self:ident, $name:ident, ($conn:ident), ($($arg:ident),*)) => {
        on_conn!($self, $conn, |s, c| s.$name(c $(, $arg)*).await)
    };
}

impl Store {
    /// The backend's name.
    pub(crate) fn backend(&self) -> &'static str {
        match self {
            Store::MySql(_) => MySql::NAME,
            #[cfg(feature = "sqlite")]
            Store::Sqlite(_) => <sqlx::Sqlite as Backend>::NAME,
        }
    }

    /// Takes a connection from the pool.
    pub(crate) async fn acquire(&self) -> sqlx::Result<Pooled> {
        Ok(match self {
            Store::MySql(s) => Pooled::MySql(s.pool().acquire().await?),
            #[cfg(feature = "sqlite")]
            Store::Sqlite(s) => Pooled::Sqlite(s.pool().acquire().await?),
        })
    }

    /// Begins a transaction (on SQLite, one that takes the write lock at once).
    pub(crate) async fn begin(&self) -> sqlx::Result<Tx> {
        Ok(match self {
            Store::MySql(s) => Tx::MySql(s.pool().begin().await?),
            #[cfg(feature = "sqlite")]
            Store::Sqlite(s) => Tx::Sqlite(s.begin().await?),
        })
    }

    /// A pool for the worker (one of its lanes, see `worker::lanes`), with the same connect
    /// options as this one (see the backends' `worker_store`).
    pub(crate) fn worker_store(&self, spec: WorkerPool) -> Store {
        match self {
            Store::MySql(s) => Store::MySql(s.worker_store(spec)),
            #[cfg(feature = "sqlite")]
            Store::Sqlite(s) => Store::Sqlite(s.worker_store(spec)),
        }
    }

    /// Connections open in the pool right now.
    pub(crate) fn size(&self) -> u32 {
        on_store!(self, s => s.pool().size())
    }

    /// The busy timeout of the pool's connections, on SQLite (`None` on MySQL).
    pub(crate) fn busy_timeout(&self) -> Option<std::time::Duration> {
        match self {
            Store::MySql(_) => None,
            #[cfg(feature = "sqlite")]
            Store::Sqlite(s) => Some(s.busy_timeout()),
        }
    }

    /// Closes the pool.
    pub(crate) async fn close(&self) {
        on_store!(self, s => s.pool().close().await)
    }

    /// Turns an error of a call on this store into the error users see (see
    /// [`crate::error::db_error`]).
    pub(crate) async fn error(&self, e: sqlx::Error) -> crate::Error {
        match self {
            Store::MySql(s) => crate::error::db_error(s.pool(), e).await,
            #[cfg(feature = "sqlite")]
            Store::Sqlite(_) => crate::Error::Database(e),
        }
    }

    /// A fresh claim cursor for one queue's claim loop.
    pub(crate) fn claim_cursor(&self) -> ClaimCursor {
        match self {
            Store::MySql(_) => ClaimCursor::MySql(mysql::ClaimCursor::default()),
            #[cfg(feature = "sqlite")]
            Store::Sqlite(_) => ClaimCursor::Sqlite,
        }
    }

    /// Claims up to `req.limit` due tasks of `req.queue` under a lease (see the backends'
    /// `task_claim`), going on from where `cursor` says.
    pub(crate) async fn task_claim(
        &self,
        conn: Conn<'_>,
        req: &ClaimRequest<'_>,
        cursor: &mut ClaimCursor,
    ) -> sqlx::Result<ClaimBatch> {
        match (self, conn, cursor) {
            (Store::MySql(s), Conn::MySql(c), ClaimCursor::MySql(k)) => {
                s.task_claim(c, req, k).await
            }
            #[cfg(feature = "sqlite")]
            (Store::Sqlite(s), Conn::Sqlite(c), ClaimCursor::Sqlite) => {
                s.task_claim(c, req, &mut ()).await
            }
            #[cfg(feature = "sqlite")]
            _ => unreachable!("a connection or cursor of another backend than its store"),
        }
    }
}

operations! {
    /// One task by id.
    fn task_get(&self; id: TaskId) -> Option<TaskInfo>;
    /// A page of tasks by ascending id, `after_id < id <= up_to`.
    fn task_list(&self; f: &TaskFilter<'_>; after_id: u64; up_to: u64; limit: u32) -> Vec<TaskInfo>;
    /// A page of tasks by descending id, `from >= id > before_id`... (see the backends).
    fn task_list_desc(&self; f: &TaskFilter<'_>; before_id: u64; from: u64; limit: u32) -> Vec<TaskInfo>;
    /// The smallest and largest task ids.
    fn task_id_bounds(&self) -> (u64, u64);
    /// A page of one queue's tasks, newest first.
    fn task_list_queue_desc(&self; queue: &str; name: Option<&str>; before_id: u64; limit: u32) -> Vec<TaskInfo>;
    /// A page of one queue's tasks, oldest first.
    fn task_list_queue_asc(&self; queue: &str; name: Option<&str>; after_id: u64; limit: u32) -> Vec<TaskInfo>;
    /// Tasks that ended per state and minute, over the last `minutes`.
    fn task_finished_per_minute(&self; minutes: u32) -> Vec<(TaskState, u32, u64)>;
    /// Failed attempts per outcome and minute, over the last `minutes`.
    fn task_failed_attempts_per_minute(&self; minutes: u32) -> Vec<(String, u32, u64)>;
    /// `(name, run µs)` of the tasks that succeeded in the last `minutes`, newest first.
    fn task_run_times(&self; minutes: u32; limit: u32) -> Vec<(String, i64)>;
    /// Tasks retention would prune now.
    fn task_prune_count(&self; state: TaskState; age_secs: u64) -> u64;
    /// Tasks matching a filter.
    fn task_count(&self; f: &TaskFilter<'_>) -> u64;
    /// Pending tasks of a kind (scheduled, retrying), by due time then id.
    fn task_list_pending(&self; kind: PendingKind; queue: Option<&str>; after: Option<(DateTime<Utc>, u64)>; limit: u32) -> Vec<TaskInfo>;
    /// Tasks per queue and state.
    fn task_stats(&self, conn) -> Vec<QueueStateCount>;
    /// Pending and running tasks per queue.
    fn task_stats_active(&self, conn) -> Vec<QueueStateCount>;
    /// Tasks in terminal states per queue.
    fn task_stats_terminal(&self, conn) -> Vec<QueueStateCount>;
    /// Pending tasks per name.
    fn task_pending_by_name(&self, conn; queue: Option<&str>) -> Vec<PendingNameCount>;
    /// Ids (and whether running) of a bulk action's tasks, ascending past `after_id`.
    fn task_bulk_ids(&self; f: &TaskFilter<'_>; age_us: i64; after_id: u64; limit: u32) -> Vec<(u64, bool)>;
    /// How many tasks a bulk action would touch.
    fn task_bulk_count(&self; f: &TaskFilter<'_>; age_us: i64) -> u64;
    /// Cancels pending tasks by id.
    fn task_cancel_batch(&self; ids: &[u64]) -> u64;
    /// Asks running tasks by id to cancel.
    fn task_request_cancel_batch(&self; ids: &[u64]) -> u64;
    /// Retries dead tasks by id.
    fn task_retry_dead_ids(&self; ids: &[u64]) -> u64;
    /// Asks one running task to cancel.
    fn task_request_cancel(&self, conn; id: TaskId) -> bool;
    /// Cancels one pending task.
    fn task_cancel(&self, conn; id: TaskId) -> bool;
    /// Moves a pending task's `run_at`.
    fn task_reschedule(&self, conn; id: TaskId; at: Option<DateTime<Utc>>; delay_us: i64) -> bool;
    /// Changes a pending task's priority.
    fn task_set_priority(&self, conn; id: TaskId; priority: i16) -> bool;
    /// Deletes a task that is not running, with its unique identity.
    fn task_delete(&self, conn; id: TaskId) -> bool;
    /// Retries one dead task.
    fn task_retry_dead(&self, conn; id: TaskId) -> RetryDead;
    /// A task's state.
    fn task_state(&self; id: TaskId) -> Option<TaskState>;
    /// Renews the leases (`(id, epoch)`) this worker holds; how many were renewed.
    fn task_heartbeat(&self, conn; leases: &[(u64, u64)]; lease_us: i64) -> u64;
    /// Which of the leases are still held, and whether cancel was requested on each.
    fn task_leases_held(&self, conn; leases: &[(u64, u64)]) -> Vec<(u64, u64, bool)>;
    /// Writes back a batch of ended attempts, each under its epoch.
    fn task_write_back(&self, conn; batch: &[WriteBack]) -> WrittenBack;
    /// Returns held leases to pending (shutdown).
    fn task_release(&self, conn; leases: &[(u64, u64)]) -> u64;
    /// Leases `(id, epoch)` of `queue`'s running tasks that `worker_id` claimed in the last
    /// `since_us` µs (a claim whose answer was lost may have taken some).
    fn task_running_since(&self, conn; queue: &str; worker_id: &str; since_us: i64) -> Vec<(u64, u64)>;
    /// Lapsed leases (running tasks whose lease ended).
    fn task_lapsed(&self, conn; names: &NameList; limit: u32) -> Vec<LapsedRow>;
    /// Reaps expired leases, each under its epoch.
    fn task_reap(&self, conn; rows: &[ReapRow]; exact: bool) -> Reaped;
    /// Deletes expired unique identities.
    fn unique_prune_expired(&self, conn; limit: u32) -> u64;
    /// Deletes tasks of a terminal state older than `age_secs`.
    fn task_prune(&self, conn; state: TaskState; age_secs: u64; limit: u32) -> u64;
    /// Current epochs of the tasks `ids` that are running.
    fn task_epochs(&self, conn; ids: &[u64]) -> Vec<(u64, u64)>;
    /// The byte limits of the server's multi-row statements (MySQL: its `max_allowed_packet`).
    fn statement_budget(&self, conn) -> budget::Budget;
    /// The database clock.
    fn db_now(&self) -> DateTime<Utc>;
    /// The database clock, on a connection.
    fn db_now_on(&self, conn) -> DateTime<Utc>;
    /// Retries dead tasks of a queue that died before a time.
    fn task_retry_dead_batch(&self; queue: Option<&str>; died_before: DateTime<Utc>; limit: u32) -> u64;
    /// Ids of dead unique tasks (retried one by one).
    fn task_dead_unique_ids(&self; queue: Option<&str>; died_before: DateTime<Utc>; after_id: u64; limit: u32) -> Vec<TaskId>;
    /// Pauses a queue.
    fn queue_pause(&self, conn; queue: &str) -> ();
    /// Resumes a queue; whether it was paused.
    fn queue_resume(&self, conn; queue: &str) -> bool;
    /// Paused queues.
    fn queues_paused(&self, conn) -> Vec<(String, DateTime<Utc>)>;
    /// Paused and limited queues, for the worker's refresh.
    fn queue_controls(&self, conn) -> Vec<QueueControl>;
    /// Sets or clears a queue's concurrency limit.
    fn queue_set_limit(&self, conn; queue: &str; limit: Option<u32>) -> ();
    /// Sets or clears a queue's rate limit.
    fn queue_set_rate_limit(&self, conn; queue: &str; rate: Option<(u32, i64)>) -> ();
    /// Queues with their controls and counts.
    fn queue_list(&self) -> Vec<QueueRow>;
    /// Declares a schedule (worker start).
    fn schedule_declare(&self, conn; d: &ScheduleDecl<'_>) -> ();
    /// The state of the schedules named in `names`.
    fn schedule_states(&self, conn; names: &NameList) -> Vec<ScheduleState>;
    /// One compare-and-set step of a schedule, enqueueing its ticks.
    fn schedule_fire(&self, conn; f: &ScheduleFire<'_>) -> Option<Vec<TaskId>>;
    /// Every schedule.
    fn schedule_list(&self) -> Vec<ScheduleInfo>;
    /// Deletes a schedule.
    fn schedule_delete(&self, conn; name: &str) -> bool;
    /// Records a worker's start.
    fn worker_start(&self, conn; w: &WorkerRow<'_>) -> ();
    /// Records that a worker is alive.
    fn worker_seen(&self, conn; w: &WorkerRow<'_>) -> ();
    /// Records a worker's stop.
    fn worker_stop(&self, conn; worker_id: &str) -> bool;
    /// Deletes workers not seen for `age_secs`.
    fn worker_prune(&self, conn; age_secs: u64; limit: u32) -> u64;
    /// Known workers.
    fn worker_list(&self, conn) -> Vec<WorkerListRow>;
    /// A task's attempt history (JSON), if the task exists.
    fn task_attempts(&self; id: TaskId) -> Option<Option<String>>;
    /// A page of the audit trail, newest first.
    fn audit_list(&self; task_id: Option<u64>; queue: Option<&str>; before_id: u64; limit: u32) -> Vec<AuditListRow>;
    /// Deletes audit entries older than `age_secs`.
    fn audit_prune(&self, conn; age_secs: u64; limit: u32) -> u64;
}

/// Whether a database error says the statement's transaction lost to a concurrent one (see
/// `StmtError::is_conflict`): MySQL's 1213 (deadlock victim; on Galera a certification
/// failure), SQLite's `SQLITE_BUSY` past the busy timeout.
pub(crate) fn is_conflict(e: &dyn sqlx::error::DatabaseError) -> bool {
    #[cfg(feature = "sqlite")]
    if sqlite::is_busy(e) {
        return true;
    }
    mysql::is_deadlock(e)
}

/// Whether a database error says the statement can never succeed as sent, besides the SQLSTATE
/// classes `StmtError::is_deterministic` reads: MySQL's "packet too large" (1153, 1301, 2020),
/// SQLite's `SQLITE_TOOBIG` and `SQLITE_CONSTRAINT` (a constraint, or a trigger's `RAISE`).
pub(crate) fn is_refused(e: &dyn sqlx::error::DatabaseError) -> bool {
    #[cfg(feature = "sqlite")]
    if sqlite::is_refused(e) {
        return true;
    }
    mysql::is_packet_too_large(e)
}

impl Conn<'_> {
    /// Reborrows.
    pub(crate) fn reborrow(&mut self) -> Conn<'_> {
        match self {
            Conn::MySql(c) => Conn::MySql(c),
            #[cfg(feature = "sqlite")]
            Conn::Sqlite(c) => Conn::Sqlite(c),
        }
    }
}

/// Dispatches a call on a borrowed connection to the same-named function of its backend.
macro_rules! on_caller_conn {
    ($conn:expr, $name:ident($($arg:expr),*)) => {
        match $conn {
            Conn::MySql(c) => mysql::$name(c $(, $arg)*).await,
            #[cfg(feature = "sqlite")]
            Conn::Sqlite(c) => sqlite::$name(c $(, $arg)*).await,
        }
    };
}

/// Operations on a caller's connection (the producer path and audit entries), in the caller's
/// transaction.
impl Conn<'_> {
    /// Inserts one task (with its idempotency key or unique identity, if any).
    pub(crate) async fn task_insert(&mut self, row: &NewTask<'_>) -> sqlx::Result<Inserted> {
        on_caller_conn!(self, task_insert(row))
    }

    /// Inserts tasks without idempotency key or unique identity, in as few statements as the
    /// backend can; their ids in order.
    pub(crate) async fn task_insert_rows(
        &mut self,
        rows: &[NewTask<'_>],
    ) -> sqlx::Result<Vec<TaskId>> {
        on_caller_conn!(self, task_insert_rows(rows))
    }

    /// The database clock in microseconds since the Unix epoch.
    pub(crate) async fn db_clock_us(&mut self) -> sqlx::Result<i64> {
        on_caller_conn!(self, db_clock_us())
    }

    /// Appends an entry to the audit trail.
    pub(crate) async fn audit_insert(&mut self, row: &AuditRow<'_>) -> sqlx::Result<u64> {
        on_caller_conn!(self, audit_insert(row))
    }
}
