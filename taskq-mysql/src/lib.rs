//! taskq's MySQL / MariaDB driver: every SQL statement taskq issues on MySQL lives in this
//! crate, one file per table or job:
//!
//! - `lib.rs`: [`MySqlDriver`] (the pool handle), the worker's pools and their session setup, the
//!   server's statement budget, and the error numbers taskq reads (duplicate key, deadlock,
//!   packet too large);
//! - `clock.rs`: the database clock;
//! - `enqueue.rs`: the producer path, one task (idempotency key, unique identity) or a
//!   multi-row batch;
//! - `order.rs`: ordered tasks (`taskq_order_keys`): the ordered enqueue, promotion, held keys;
//! - `identities.rs`: unique identities (`taskq_unique`): reserve, take and free, prune;
//! - `tasks.rs`: reads of `taskq_tasks` (one task, pages, counts, statistics, bulk targets);
//! - `actions.rs`: the operator's writes to `taskq_tasks` (cancel, retry, reschedule,
//!   priority) and retention;
//! - `claim.rs`: the claim as the claim loop sees it, with its cursor ([`ClaimCursor`]);
//! - `claim_raw.rs`: the claim transaction itself;
//! - `lease.rs`: heartbeat, write-back, release and reap, under the lease's epoch;
//! - `queues.rs`: queue controls (`taskq_queues`);
//! - `schedules.rs`: recurring schedules (`taskq_schedules`);
//! - `workers.rs`: live workers (`taskq_workers`);
//! - `history.rs`: attempt history and the audit trail (`taskq_audit`);
//! - `events.rs`: events and the relay's keys (`taskq_events`, `taskq_event_keys`): publish,
//!   lease, read, settle, and the operator's reads, retention, replays and releases;
//! - `workflows.rs`: workflows (`taskq_workflows`, `_steps`, `_deps`): the insert, the settle
//!   that lets the steps after an ended step go on, reads, cancel;
//! - `inbox.rs`: the consumers' inbox (`taskq_inbox`): record a message id, prune;
//! - `migrate.rs`: taskq's migrations and their run under the migration lock ([`migrate`]);
//! - `database.rs`: whether the database exists, and creating it;
//! - `connect.rs`: opening a pool on a URL, creating the database it names ([`connect`]);
//! - `diagnose.rs`: the error numbers of a session the server refused ([`diagnose`]).
//!
//! Not semver-stable. Functions are named noun-first (`task_insert`, `task_claim`...). All
//! times come from the database clock (`UTC_TIMESTAMP(6)`); every write-back of a claimed task
//! is conditional on the `lease_epoch` it was claimed with. Statements that touch a batch of
//! rows take the batch as a JSON array and join it with `JSON_TABLE` (MySQL 8 / MariaDB 10.6+),
//! driven from the JSON side (`STRAIGHT_JOIN`) and pinned to the primary key (`FORCE INDEX
//! (PRIMARY)`), so each row is reached, and locked, by primary key whatever the table's
//! statistics say (on a small table the optimizer would otherwise pick a scan of a `state`
//! index and lock rows the statement does not touch).
//!
//! The interface is small: [`MySqlDriver`] (a pool handle) has one method per statement the worker
//! and the `taskq::Client` issue, taking and returning plain row types (`Claimed`,
//! `WriteBack`, `TaskInfo`...); the producer path (`task_insert`, `task_insert_rows`) runs on
//! a caller's connection and is free functions; [`migrate`] and [`connect`] take a pool or a
//! URL. The SQLite driver
//! (the `taskq-sqlite` crate, through taskq's `backend::sqlite`) provides the same methods;
//! nothing outside this crate names MySQL SQL.

mod actions;
mod batches;
mod claim;
mod claim_raw;
mod clock;
pub mod connect;
mod database;
pub mod diagnose;
mod enqueue;
mod events;
mod history;
mod identities;
mod inbox;
mod lease;
mod migrate;
mod order;
mod queues;
mod schedules;
mod tasks;
mod workers;
mod workflows;

pub use batches::{batch_add, batch_insert};
pub use claim::ClaimCursor;
pub use clock::db_clock_us;
pub use enqueue::{task_insert, task_insert_rows};
pub use history::audit_insert;
pub use migrate::{MIGRATIONS_TABLE, MigrationError, migrate, migrator};
pub use order::task_insert_ordered;
pub use workflows::workflow_insert;

use sqlx::{MySqlConnection, MySqlPool};

use taskq_driver::budget::Budget;
use taskq_driver::driver::{Enqueue, Handle, StatementBudget};
use taskq_driver::dynamic::ErrorClass;

/// The MySQL driver's pool handle: the worker and the `taskq::Client` work through it, with
/// the operations of `taskq_driver::driver` (implemented in this crate's files, one per
/// table). The producer path (`task_insert*`) runs on the caller's transaction and stays a
/// free function.
#[derive(Debug, Clone)]
pub struct MySqlDriver {
    pool: MySqlPool,
}

impl Handle for MySqlDriver {
    type Conn = MySqlConnection;
    type Database = sqlx::MySql;
    const NAME: &'static str = "MySQL";

    /// The candidate read of an unlimited claim reads the queue's pause and limits with it
    /// (`claim_raw`), so the worker needs no poll of `taskq_queues` while none is set.
    fn claims_see_controls(&self) -> bool {
        true
    }
    fn from_pool(pool: MySqlPool) -> Self {
        Self::new(pool)
    }
    fn pool(&self) -> &MySqlPool {
        &self.pool
    }
    fn worker_store(&self, spec: taskq_driver::pool::WorkerPool) -> Self {
        Self::worker_store(self, spec)
    }
    /// `host:port`, or the socket path.
    fn connect_target(&self) -> Option<String> {
        let opts = self.pool.connect_options();
        Some(match opts.get_socket() {
            Some(socket) => socket.display().to_string(),
            None => format!("{}:{}", opts.get_host(), opts.get_port()),
        })
    }
    /// A conflict: ER_LOCK_DEADLOCK (1213; on Galera also a certification failure). Refused:
    /// a packet too large (1153, 1301, 2020).
    fn classify(e: &dyn sqlx::error::DatabaseError) -> ErrorClass {
        ErrorClass {
            conflict: is_deadlock(e),
            refused: is_packet_too_large(e),
        }
    }
}

impl Enqueue for MySqlDriver {
    async fn task_insert(
        conn: &mut MySqlConnection,
        row: &taskq_driver::rows::NewTask<'_>,
    ) -> sqlx::Result<taskq_driver::rows::Inserted> {
        task_insert(conn, row).await
    }
    async fn task_insert_rows(
        conn: &mut MySqlConnection,
        rows: &[taskq_driver::rows::NewTask<'_>],
    ) -> sqlx::Result<Vec<taskq_driver::state::TaskId>> {
        task_insert_rows(conn, rows).await
    }
    async fn task_insert_ordered(
        conn: &mut MySqlConnection,
        row: &taskq_driver::rows::NewTask<'_>,
        order: &taskq_driver::rows::OrderKey<'_>,
    ) -> sqlx::Result<taskq_driver::rows::Inserted> {
        task_insert_ordered(conn, row, order).await
    }
    async fn db_clock_us(conn: &mut MySqlConnection) -> sqlx::Result<i64> {
        db_clock_us(conn).await
    }
    async fn audit_insert(
        conn: &mut MySqlConnection,
        row: &taskq_driver::rows::AuditRow<'_>,
    ) -> sqlx::Result<u64> {
        audit_insert(conn, row).await
    }
    async fn inbox_record(
        conn: &mut MySqlConnection,
        consumer: &str,
        message_id: &str,
    ) -> sqlx::Result<bool> {
        inbox::inbox_record(conn, consumer, message_id).await
    }
    async fn inbox_prune(
        conn: &mut MySqlConnection,
        consumer: &str,
        age_us: i64,
        limit: u32,
    ) -> sqlx::Result<u64> {
        inbox::inbox_prune(conn, consumer, age_us, limit).await
    }
    async fn event_insert(
        conn: &mut MySqlConnection,
        row: &taskq_driver::event::NewEvent<'_>,
    ) -> sqlx::Result<taskq_driver::event::EventInserted> {
        events::event_insert(conn, row).await
    }
    async fn workflow_insert(
        conn: &mut MySqlConnection,
        wf: &taskq_driver::rows::NewWorkflow<'_>,
    ) -> sqlx::Result<taskq_driver::rows::WorkflowInserted> {
        workflows::workflow_insert(conn, wf).await
    }
    async fn batch_insert(
        conn: &mut MySqlConnection,
        b: &taskq_driver::rows::NewBatch<'_>,
    ) -> sqlx::Result<taskq_driver::rows::BatchInserted> {
        batches::batch_insert(conn, b).await
    }
    async fn batch_add(
        conn: &mut MySqlConnection,
        id: u64,
        members: &[taskq_driver::rows::NewTask<'_>],
        seal: bool,
    ) -> sqlx::Result<taskq_driver::rows::BatchAdded> {
        batches::batch_add(conn, id, members, seal).await
    }
}

impl StatementBudget for MySqlDriver {
    /// The byte limits of this server's multi-row statements, from its `max_allowed_packet`
    /// (this session's: a server's global setting applies to connections opened after it).
    async fn statement_budget(&self, conn: &mut MySqlConnection) -> sqlx::Result<Budget> {
        let packet = sqlx::query_scalar!(
            r#"SELECT CAST(@@SESSION.max_allowed_packet AS UNSIGNED) AS "packet!: u64""#
        )
        .fetch_one(&mut *conn)
        .await?;
        Ok(Budget::for_packet(packet))
    }
}

impl MySqlDriver {
    /// A handle on `pool`.
    pub fn new(pool: MySqlPool) -> Self {
        Self { pool }
    }

    /// The pool behind this store.
    pub fn pool(&self) -> &MySqlPool {
        &self.pool
    }

    /// A pool of the worker: same connect options as the user's, READ COMMITTED sessions, no
    /// ping before each use (a broken connection fails one statement, which is retried).
    /// Server-side lock waits end at the statement deadline (`innodb_lock_wait_timeout`), and
    /// a session that goes silent (frozen process, black-holed network), in a transaction or
    /// not, is closed by the server after `spec.session_timeout` (`wait_timeout`,
    /// `net_read_timeout`, `net_write_timeout`), which rolls its transaction back and releases
    /// its locks. Idle connections are closed by the pool before that: never handed out past
    /// `spec.idle_limit`, and reaped every half of it.
    pub fn worker_store(&self, spec: taskq_driver::pool::WorkerPool) -> Self {
        let opts = (*self.pool.connect_options()).clone();
        // Whole seconds; the lock wait no later than the statement deadline.
        let lock_wait_secs = spec.statement_timeout.as_secs().max(1);
        let session_secs = spec.session_timeout.as_secs().max(1);
        let idle_limit = spec.idle_limit;
        let pool = sqlx::mysql::MySqlPoolOptions::new()
            .max_connections(spec.connections.max(1))
            .min_connections(0)
            .acquire_timeout(spec.statement_timeout)
            .test_before_acquire(false)
            .idle_timeout(idle_limit / 2)
            .before_acquire(move |_conn, meta| {
                Box::pin(async move { Ok(meta.idle_for < idle_limit) })
            })
            .after_connect(move |conn, _meta| {
                Box::pin(async move { session_setup(conn, lock_wait_secs, session_secs).await })
            })
            .connect_lazy_with(opts);
        Self { pool }
    }
}

/// Per-connection setup of the worker's own pool: READ COMMITTED, so claim scans take no gap
/// locks that would make producers' inserts wait; row-lock waits end after `lock_wait_secs`
/// (the worker's statement deadline) instead of InnoDB's default 50 s; and the server closes
/// the session once it has been silent for `session_secs` (`wait_timeout` between statements,
/// in a transaction or not; `net_read_timeout` / `net_write_timeout` within one packet),
/// instead of 8 hours.
pub async fn session_setup(
    conn: &mut MySqlConnection,
    lock_wait_secs: u64,
    session_secs: u64,
) -> sqlx::Result<()> {
    sqlx::query!("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        .execute(&mut *conn)
        .await?;
    sqlx::query!(
        "SET SESSION innodb_lock_wait_timeout = ?, wait_timeout = ?,
             net_read_timeout = ?, net_write_timeout = ?",
        lock_wait_secs,
        session_secs,
        session_secs,
        session_secs
    )
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// MySQL error number for a duplicate key.
const ER_DUP_ENTRY: u16 = 1062;

/// Whether `e` is a duplicate key error on the unique index `index` (any index for `""`).
fn is_conflict_on(e: &dyn sqlx::error::DatabaseError, index: &str) -> bool {
    let mysql = e.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>();
    mysql.is_some_and(|m| m.number() == ER_DUP_ENTRY) && e.message().contains(index)
}

/// Whether `e` says a packet was too large: ER_NET_PACKET_TOO_LARGE (1153, the statement
/// exceeds `max_allowed_packet`), ER_WARN_ALLOWED_PACKET_OVERFLOWED (1301, a function's result
/// would), CR_NET_PACKET_TOO_LARGE (2020).
pub fn is_packet_too_large(e: &dyn sqlx::error::DatabaseError) -> bool {
    let mysql = e.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>();
    mysql.is_some_and(|m| matches!(m.number(), 1153 | 1301 | 2020))
}

/// Whether `e` is ER_LOCK_DEADLOCK (1213): an InnoDB deadlock victim, or on a Galera cluster a
/// transaction that failed certification or was aborted by a replicated one (brute-force
/// abort). The transaction was rolled back; running it again is safe.
pub fn is_deadlock(e: &dyn sqlx::error::DatabaseError) -> bool {
    let mysql = e.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>();
    mysql.is_some_and(|m| m.number() == diagnose::er::LOCK_DEADLOCK)
}

/// `(id, epoch)` pairs as a JSON array of arrays, sorted by id: every batch statement locks
/// rows in the order of its JSON array, so a common order keeps concurrent batches (heartbeat,
/// write-back, release) from deadlocking each other.
pub(crate) fn leases_json(leases: &[(u64, u64)]) -> String {
    let mut sorted = leases.to_vec();
    sorted.sort_unstable();
    serde_json::to_string(&sorted).expect("leases serialize")
}
