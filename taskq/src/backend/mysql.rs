//! The MySQL / MariaDB backend: every SQL statement taskq's runtime issues lives in this file.
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
//! The interface is small: [`Store`] (a pool handle) has one method per statement the worker
//! and the [`Client`](crate::Client) issue, taking and returning plain row types (`Claimed`,
//! `WriteBack`, `TaskInfo`...); the producer path (`task_insert`, `task_insert_batch`) and the
//! migration lock run on a caller's connection and are free functions. A second backend
//! (SQLite is planned) provides the same methods; nothing outside this file names SQL.

use std::time::{Duration, Instant};

use chrono::{DateTime, NaiveDateTime, Utc};
use serde::Serialize;
use sqlx::{Connection, MySqlConnection, MySqlPool};

use super::budget::Budget;
use super::rows::*;
use crate::info::{PendingNameCount, QueueStateCount, ScheduleInfo, TaskInfo};
use crate::task::{TaskId, TaskState};

/// The backend handle the worker and the [`Client`](crate::Client) work through: every
/// statement that does not run on a caller's own connection is a method here. (The producer
/// path, `task_insert*`, runs on the caller's transaction and stays a free function.) A second
/// backend would provide the same methods.
#[derive(Debug, Clone)]
pub(crate) struct Store {
    pool: MySqlPool,
}

impl Store {
    pub(crate) fn new(pool: MySqlPool) -> Self {
        Self { pool }
    }

    /// The pool behind this store.
    pub(crate) fn pool(&self) -> &MySqlPool {
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
    pub(crate) fn worker_store(&self, spec: super::WorkerPool) -> Self {
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

/// MySQL error number for a duplicate key.
const ER_DUP_ENTRY: u16 = 1062;
/// MySQL error number for a deadlock victim (and, on Galera, a certification failure).
const ER_LOCK_DEADLOCK: u16 = 1213;
/// Name of the unique index behind idempotency keys (see the migration).
const IDEMPOTENCY_INDEX: &str = "uq_taskq_idempotency";

/// Inserts a task on `conn` (the caller's transaction, if any). A duplicate idempotency key, or
/// a unique identity another task holds, returns the holder's id instead of failing.
///
/// Every `INSERT` is attempted plainly: a duplicate key error rolls back only the statement,
/// not the caller's transaction, and leaves a shared lock on the row it collided with, so the
/// holder found by the locking read that follows keeps its key (or identity) until the
/// caller's transaction ends.
///
/// A unique task first reserves its identity (`INSERT INTO taskq_unique`), so a duplicate
/// writes nothing to `taskq_tasks`; a new one then inserts the task and records its id in the
/// reservation (three statements). With an idempotency key as well, the task is inserted
/// first so that a taken key is reported before a taken identity; if the identity then turns
/// out to be taken, the row just inserted is deleted again. Those statements belong together:
/// on a connection that is not in a transaction (sqlx's `Connection::is_in_transaction`) they
/// run in a short one of their own; in the caller's transaction, an error after the first
/// undoes what was written, so that committing anyway leaves no half-enqueued task.
pub(crate) async fn task_insert(
    conn: &mut MySqlConnection,
    t: &NewTask<'_>,
) -> sqlx::Result<Inserted> {
    let Some(key) = t.unique_key else {
        return Ok(match insert_row(conn, t).await? {
            Ok(id) => Inserted::New(id),
            Err(holder) => Inserted::Duplicate(holder),
        });
    };
    if conn.is_in_transaction() {
        return insert_unique(conn, t, key).await;
    }
    let mut tx = conn.begin().await?;
    let out = insert_unique(&mut tx, t, key).await?;
    tx.commit().await?;
    Ok(out)
}

/// The statements of [`task_insert`] for a unique task, on a transaction.
async fn insert_unique(
    conn: &mut MySqlConnection,
    t: &NewTask<'_>,
    key: &[u8],
) -> sqlx::Result<Inserted> {
    if t.idempotency_key.is_some() {
        let id = match insert_row(conn, t).await? {
            Ok(id) => id,
            Err(holder) => return Ok(Inserted::Duplicate(holder)),
        };
        let taken = match identity_reserve(conn, key, id.0, t.unique_expires_us).await {
            Ok(taken) => taken,
            Err(e) => return Err(undo(conn, Some(id), None, e).await),
        };
        if let Some(holder) = taken {
            sqlx::query!("DELETE FROM taskq_tasks WHERE id = ?", id.0)
                .execute(&mut *conn)
                .await?;
            return Ok(Inserted::Duplicate(holder));
        }
        return Ok(Inserted::New(id));
    }
    if let Some(holder) = identity_reserve(conn, key, 0, t.unique_expires_us).await? {
        return Ok(Inserted::Duplicate(holder));
    }
    let id = match insert_row(conn, t).await {
        Ok(Ok(id)) => id,
        Ok(Err(holder)) => return Ok(Inserted::Duplicate(holder)),
        Err(e) => return Err(undo(conn, None, Some(key), e).await),
    };
    let done = sqlx::query!(
        "UPDATE taskq_unique SET task_id = ? WHERE unique_key = ?",
        id.0,
        key
    )
    .execute(&mut *conn)
    .await;
    match done {
        Ok(_) => Ok(Inserted::New(id)),
        Err(e) => Err(undo(conn, Some(id), Some(key), e).await),
    }
}

/// After `e` in the middle of a unique enqueue on the caller's transaction, deletes the task
/// row and the reservation written so far (best effort: if the connection is gone, so is the
/// transaction) and returns `e`.
async fn undo(
    conn: &mut MySqlConnection,
    task: Option<TaskId>,
    reservation: Option<&[u8]>,
    e: sqlx::Error,
) -> sqlx::Error {
    if let Some(id) = task {
        let _ = sqlx::query!("DELETE FROM taskq_tasks WHERE id = ?", id.0)
            .execute(&mut *conn)
            .await;
    }
    if let Some(key) = reservation {
        let _ = sqlx::query!(
            "DELETE FROM taskq_unique WHERE unique_key = ? AND task_id IN (0, ?)",
            key,
            task.map_or(0, |t| t.0)
        )
        .execute(&mut *conn)
        .await;
    }
    e
}

/// The task row's `INSERT`: the new id, or the holder of its idempotency key.
async fn insert_row(
    conn: &mut MySqlConnection,
    t: &NewTask<'_>,
) -> sqlx::Result<Result<TaskId, TaskId>> {
    let res = sqlx::query!(
        r#"INSERT INTO taskq_tasks
            (queue, name, payload, state, priority, max_attempts, run_at, deadline,
             idempotency_key, trace_context, unique_key, unique_while, created_at, updated_at)
           VALUES (?, ?, ?, 'pending', ?, ?,
             COALESCE(?, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND),
             COALESCE(?, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND), ?, ?, ?, ?,
             UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))"#,
        t.queue,
        t.name,
        t.payload,
        t.priority,
        t.max_attempts,
        t.run_at.map(|d| d.naive_utc()),
        t.delay_us,
        t.deadline.map(|d| d.naive_utc()),
        t.ttl_us,
        t.idempotency_key,
        t.trace_context,
        t.unique_key,
        t.unique_while,
    )
    .execute(&mut *conn)
    .await;
    match res {
        Ok(done) => Ok(Ok(TaskId(done.last_insert_id()))),
        Err(sqlx::Error::Database(e))
            if is_conflict_on(&*e, IDEMPOTENCY_INDEX) && t.idempotency_key.is_some() =>
        {
            // A locking read sees the latest committed row even inside the caller's
            // REPEATABLE READ snapshot; it reads the unique index only.
            let id = sqlx::query_scalar!(
                r#"SELECT id AS "id: u64" FROM taskq_tasks
                   WHERE name = ? AND idempotency_key = ? LOCK IN SHARE MODE"#,
                t.name,
                t.idempotency_key,
            )
            .fetch_one(&mut *conn)
            .await?;
            Ok(Err(TaskId(id)))
        }
        Err(e) => Err(e),
    }
}

/// Takes the identity `key` for `task_id` (0: the id follows), or returns the task holding it.
///
/// One `INSERT … ON DUPLICATE KEY UPDATE`: on a taken identity InnoDB locks the existing row
/// *exclusively* (a plain `INSERT` would take a shared lock), and the update reports the holder
/// through `LAST_INSERT_ID(expr)` in the statement's OK packet. Shared locks are what made
/// concurrent enqueuers of one identity deadlock: when a worker freed the identity (deleting
/// its row), every producer waiting with a shared lock on it tried to upgrade to insert, and
/// InnoDB rolled back all but one caller's transaction. With exclusive locks the waiters queue
/// one behind the other: the first inserts, the next ones see it as the holder. A duplicate
/// keeps the row locked until the caller's transaction ends, so the holder cannot let go of
/// the identity in between (the worker's statements that free it skip locked rows).
///
/// A reservation left with `task_id = 0` (an enqueue whose undo could not run, committed
/// anyway) names no task: it is taken over.
async fn identity_reserve(
    conn: &mut MySqlConnection,
    key: &[u8],
    task_id: u64,
    expires_us: Option<i64>,
) -> sqlx::Result<Option<TaskId>> {
    let done = sqlx::query!(
        r#"INSERT INTO taskq_unique (unique_key, task_id, expires_at)
           VALUES (?, ?, TIMESTAMPADD(MICROSECOND, ?, '1970-01-01 00:00:00'))
           ON DUPLICATE KEY UPDATE task_id = LAST_INSERT_ID(IF(task_id = 0, ?, task_id))"#,
        key,
        task_id,
        expires_us,
        task_id,
    )
    .execute(&mut *conn)
    .await?;
    // 0: a new row (the table has no AUTO_INCREMENT column); otherwise the row's task after
    // the update, which is `task_id` itself when an orphaned reservation was taken over.
    Ok(match done.last_insert_id() {
        0 => None,
        id if id == task_id => None,
        holder => Some(TaskId(holder)),
    })
}

/// The database clock in microseconds since the Unix epoch (no time zone involved), for the
/// window of a unique task.
pub(crate) async fn db_clock_us(conn: &mut MySqlConnection) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        r#"SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) AS "us!: i64""#
    )
    .fetch_one(conn)
    .await
}

/// Whether `e` is a duplicate key error on the unique index `index` (any index for `""`).
fn is_conflict_on(e: &dyn sqlx::error::DatabaseError, index: &str) -> bool {
    let mysql = e.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>();
    mysql.is_some_and(|m| m.number() == ER_DUP_ENTRY) && e.message().contains(index)
}

impl Store {
    /// One task by id.
    pub(crate) async fn task_get(&self, id: TaskId) -> sqlx::Result<Option<TaskInfo>> {
        sqlx::query_as!(
            TaskInfo,
            r#"SELECT id AS "id: TaskId", queue, name, payload, state AS "state: TaskState", priority AS "priority: i16",
                 attempt AS "attempt: u32", max_attempts AS "max_attempts: u32",
                 run_at AS "run_at: DateTime<Utc>", lease_until AS "lease_until: DateTime<Utc>",
                 lease_epoch AS "lease_epoch: u64", worker_id, idempotency_key, trace_context, last_error,
                 LOWER(HEX(unique_key)) AS "unique_key: String",
                 EXISTS (SELECT 1 FROM taskq_unique u WHERE u.unique_key = taskq_tasks.unique_key
                           AND u.task_id = taskq_tasks.id) AS "unique_held!: bool",
                 created_at AS "created_at: DateTime<Utc>", updated_at AS "updated_at: DateTime<Utc>",
                 finished_at AS "finished_at: DateTime<Utc>", snoozes AS "snoozes: u32",
                 deadline AS "deadline: DateTime<Utc>", attempted_at AS "attempted_at: DateTime<Utc>"
               FROM taskq_tasks WHERE id = ?"#,
            id.0
        )
        .fetch_optional(&self.pool)
        .await
    }
}

impl Store {
    /// Tasks matching `f` with `after_id < id <= up_to`, oldest id first.
    pub(crate) async fn task_list(
        &self,
        f: &TaskFilter<'_>,
        after_id: u64,
        up_to: u64,
        limit: u32,
    ) -> sqlx::Result<Vec<TaskInfo>> {
        let state = f.state.map(TaskState::as_str);
        sqlx::query_as!(
            TaskInfo,
            r#"SELECT id AS "id: TaskId", queue, name, payload, state AS "state: TaskState", priority AS "priority: i16",
                 attempt AS "attempt: u32", max_attempts AS "max_attempts: u32",
                 run_at AS "run_at: DateTime<Utc>", lease_until AS "lease_until: DateTime<Utc>",
                 lease_epoch AS "lease_epoch: u64", worker_id, idempotency_key, trace_context, last_error,
                 LOWER(HEX(unique_key)) AS "unique_key: String",
                 EXISTS (SELECT 1 FROM taskq_unique u WHERE u.unique_key = taskq_tasks.unique_key
                           AND u.task_id = taskq_tasks.id) AS "unique_held!: bool",
                 created_at AS "created_at: DateTime<Utc>", updated_at AS "updated_at: DateTime<Utc>",
                 finished_at AS "finished_at: DateTime<Utc>", snoozes AS "snoozes: u32",
                 deadline AS "deadline: DateTime<Utc>", attempted_at AS "attempted_at: DateTime<Utc>"
               FROM taskq_tasks
               WHERE id > ? AND id <= ? AND (? IS NULL OR queue = ?) AND (? IS NULL OR state = ?)
                 AND (? IS NULL OR name = ?)
               ORDER BY id LIMIT ?"#,
            after_id,
            up_to,
            f.queue,
            f.queue,
            state,
            state,
            f.name,
            f.name,
            limit,
        )
        .fetch_all(&self.pool)
        .await
    }

    /// Tasks matching `f` with `from <= id < before_id`, newest id first (the dashboard's
    /// keyset page).
    pub(crate) async fn task_list_desc(
        &self,
        f: &TaskFilter<'_>,
        before_id: u64,
        from: u64,
        limit: u32,
    ) -> sqlx::Result<Vec<TaskInfo>> {
        let state = f.state.map(TaskState::as_str);
        sqlx::query_as!(
            TaskInfo,
            r#"SELECT id AS "id: TaskId", queue, name, payload, state AS "state: TaskState", priority AS "priority: i16",
                 attempt AS "attempt: u32", max_attempts AS "max_attempts: u32",
                 run_at AS "run_at: DateTime<Utc>", lease_until AS "lease_until: DateTime<Utc>",
                 lease_epoch AS "lease_epoch: u64", worker_id, idempotency_key, trace_context, last_error,
                 LOWER(HEX(unique_key)) AS "unique_key: String",
                 EXISTS (SELECT 1 FROM taskq_unique u WHERE u.unique_key = taskq_tasks.unique_key
                           AND u.task_id = taskq_tasks.id) AS "unique_held!: bool",
                 created_at AS "created_at: DateTime<Utc>", updated_at AS "updated_at: DateTime<Utc>",
                 finished_at AS "finished_at: DateTime<Utc>", snoozes AS "snoozes: u32",
                 deadline AS "deadline: DateTime<Utc>", attempted_at AS "attempted_at: DateTime<Utc>"
               FROM taskq_tasks
               WHERE id < ? AND id >= ? AND (? IS NULL OR queue = ?) AND (? IS NULL OR state = ?)
                 AND (? IS NULL OR name = ?)
               ORDER BY id DESC LIMIT ?"#,
            before_id,
            from,
            f.queue,
            f.queue,
            state,
            state,
            f.name,
            f.name,
            limit,
        )
        .fetch_all(&self.pool)
        .await
    }

    /// Smallest and largest task id (0, 0 when there is none): the ends of the primary key.
    pub(crate) async fn task_id_bounds(&self) -> sqlx::Result<(u64, u64)> {
        let r = sqlx::query!(
            r#"SELECT CAST(COALESCE(MIN(id), 0) AS UNSIGNED) AS "lo!: u64",
                 CAST(COALESCE(MAX(id), 0) AS UNSIGNED) AS "hi!: u64" FROM taskq_tasks"#
        )
        .fetch_one(&self.pool)
        .await?;
        Ok((r.lo, r.hi))
    }

    /// Tasks of `queue` (and `name`, when given) with `id < before_id`, newest id first, found
    /// through `ix_taskq_claim` (whose entries hold state, queue, id and name) rather than by
    /// walking the primary key: a covering read of the queue's entries in every state, the top
    /// `limit` ids sorted, then those rows by id. Costs in proportion to the queue's size.
    pub(crate) async fn task_list_queue_desc(
        &self,
        queue: &str,
        name: Option<&str>,
        before_id: u64,
        limit: u32,
    ) -> sqlx::Result<Vec<TaskInfo>> {
        sqlx::query_as!(
            TaskInfo,
            r#"SELECT t.id AS "id: TaskId", t.queue, t.name, t.payload, t.state AS "state: TaskState", t.priority AS "priority: i16",
                 t.attempt AS "attempt: u32", t.max_attempts AS "max_attempts: u32",
                 t.run_at AS "run_at: DateTime<Utc>", t.lease_until AS "lease_until: DateTime<Utc>",
                 t.lease_epoch AS "lease_epoch: u64", t.worker_id, t.idempotency_key, t.trace_context, t.last_error,
                 LOWER(HEX(t.unique_key)) AS "unique_key: String",
                 EXISTS (SELECT 1 FROM taskq_unique u WHERE u.unique_key = t.unique_key
                           AND u.task_id = t.id) AS "unique_held!: bool",
                 t.created_at AS "created_at: DateTime<Utc>", t.updated_at AS "updated_at: DateTime<Utc>",
                 t.finished_at AS "finished_at: DateTime<Utc>", t.snoozes AS "snoozes: u32",
                 t.deadline AS "deadline: DateTime<Utc>", t.attempted_at AS "attempted_at: DateTime<Utc>"
               FROM (SELECT id FROM taskq_tasks FORCE INDEX (ix_taskq_claim)
                      WHERE state IN ('pending', 'running', 'succeeded', 'dead', 'canceled', 'expired')
                        AND queue = ? AND (? IS NULL OR name = ?) AND id < ?
                      ORDER BY id DESC LIMIT ?) AS k
               JOIN taskq_tasks t ON t.id = k.id
               ORDER BY t.id DESC"#,
            queue,
            name,
            name,
            before_id,
            limit
        )
        .fetch_all(&self.pool)
        .await
    }

    /// Like [`task_list_queue_desc`](Self::task_list_queue_desc), `id > after_id`, oldest id
    /// first.
    pub(crate) async fn task_list_queue_asc(
        &self,
        queue: &str,
        name: Option<&str>,
        after_id: u64,
        limit: u32,
    ) -> sqlx::Result<Vec<TaskInfo>> {
        sqlx::query_as!(
            TaskInfo,
            r#"SELECT t.id AS "id: TaskId", t.queue, t.name, t.payload, t.state AS "state: TaskState", t.priority AS "priority: i16",
                 t.attempt AS "attempt: u32", t.max_attempts AS "max_attempts: u32",
                 t.run_at AS "run_at: DateTime<Utc>", t.lease_until AS "lease_until: DateTime<Utc>",
                 t.lease_epoch AS "lease_epoch: u64", t.worker_id, t.idempotency_key, t.trace_context, t.last_error,
                 LOWER(HEX(t.unique_key)) AS "unique_key: String",
                 EXISTS (SELECT 1 FROM taskq_unique u WHERE u.unique_key = t.unique_key
                           AND u.task_id = t.id) AS "unique_held!: bool",
                 t.created_at AS "created_at: DateTime<Utc>", t.updated_at AS "updated_at: DateTime<Utc>",
                 t.finished_at AS "finished_at: DateTime<Utc>", t.snoozes AS "snoozes: u32",
                 t.deadline AS "deadline: DateTime<Utc>", t.attempted_at AS "attempted_at: DateTime<Utc>"
               FROM (SELECT id FROM taskq_tasks FORCE INDEX (ix_taskq_claim)
                      WHERE state IN ('pending', 'running', 'succeeded', 'dead', 'canceled', 'expired')
                        AND queue = ? AND (? IS NULL OR name = ?) AND id > ?
                      ORDER BY id LIMIT ?) AS k
               JOIN taskq_tasks t ON t.id = k.id
               ORDER BY t.id"#,
            queue,
            name,
            name,
            after_id,
            limit
        )
        .fetch_all(&self.pool)
        .await
    }

    /// Terminal tasks per state and minute over the last `minutes` minutes (database clock):
    /// `(state, minutes ago, count)`, minute 0 being the last 60 seconds. A covering range read
    /// of `ix_taskq_finished` per state.
    pub(crate) async fn task_finished_per_minute(
        &self,
        minutes: u32,
    ) -> sqlx::Result<Vec<(TaskState, u32, u64)>> {
        let rows = sqlx::query!(
            r#"SELECT state AS "state!: TaskState",
                 CAST(TIMESTAMPDIFF(MINUTE, finished_at, UTC_TIMESTAMP(6)) AS UNSIGNED) AS "ago!: u64",
                 CAST(COUNT(*) AS UNSIGNED) AS "n!: u64"
               FROM taskq_tasks FORCE INDEX (ix_taskq_finished)
               WHERE state IN ('succeeded', 'dead', 'canceled', 'expired')
                 AND finished_at > UTC_TIMESTAMP(6) - INTERVAL ? MINUTE
               GROUP BY state, 2"#,
            minutes
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .filter(|r| r.ago < u64::from(minutes))
            .map(|r| (r.state, r.ago as u32, r.n))
            .collect())
    }

    /// Attempts that ended `failed`, `timed_out`, `panicked` or `lease_lost` per outcome and
    /// minute over the last `minutes` minutes (database clock), from the attempt histories:
    /// `(outcome, minutes ago, count)`. Reads only the rows that can hold such an entry: pending
    /// and running rows due after the window's start (an attempt that fails sets `run_at` to its
    /// end plus the backoff, and nothing but `reschedule_at` moves it earlier), through
    /// `ix_taskq_claim`, and terminal rows finished in the window, through `ix_taskq_finished`.
    /// A reap keeps `run_at`, so the `lease_lost` entry of a task reaped back to pending that
    /// was due before the window is counted only once the task has ended.
    pub(crate) async fn task_failed_attempts_per_minute(
        &self,
        minutes: u32,
    ) -> sqlx::Result<Vec<(String, u32, u64)>> {
        let rows = sqlx::query!(
            r#"SELECT j.outcome AS "outcome!: String",
                 CAST(TIMESTAMPDIFF(MINUTE, j.finished_at, UTC_TIMESTAMP(6)) AS UNSIGNED) AS "ago!: u64",
                 CAST(COUNT(*) AS UNSIGNED) AS "n!: u64"
               FROM (SELECT attempts FROM taskq_tasks FORCE INDEX (ix_taskq_claim)
                      WHERE state IN ('pending', 'running')
                        AND run_at > UTC_TIMESTAMP(6) - INTERVAL ? MINUTE AND attempts IS NOT NULL
                     UNION ALL
                     SELECT attempts FROM taskq_tasks FORCE INDEX (ix_taskq_finished)
                      WHERE state IN ('succeeded', 'dead', 'canceled', 'expired')
                        AND finished_at > UTC_TIMESTAMP(6) - INTERVAL ? MINUTE AND attempts IS NOT NULL
                    ) AS t,
                    JSON_TABLE(t.attempts, '$[*]' COLUMNS (
                        outcome VARCHAR(32) PATH '$.outcome',
                        finished_at DATETIME(6) PATH '$.finished_at')) AS j
               WHERE j.outcome IN ('failed', 'timed_out', 'panicked', 'lease_lost')
                 AND j.finished_at > UTC_TIMESTAMP(6) - INTERVAL ? MINUTE
               GROUP BY j.outcome, 2"#,
            minutes,
            minutes,
            minutes
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .filter(|r| r.ago < u64::from(minutes))
            .map(|r| (r.outcome, r.ago as u32, r.n))
            .collect())
    }

    /// How many tasks in terminal `state` finished more than `age_secs` ago (what
    /// [`task_prune`](Self::task_prune) would delete).
    pub(crate) async fn task_prune_count(
        &self,
        state: TaskState,
        age_secs: u64,
    ) -> sqlx::Result<u64> {
        let n = sqlx::query_scalar!(
            r#"SELECT COUNT(*) AS "n: i64" FROM taskq_tasks
               WHERE state = ? AND finished_at < UTC_TIMESTAMP(6) - INTERVAL ? SECOND"#,
            state.as_str(),
            age_secs
        )
        .fetch_one(&self.pool)
        .await?;
        Ok(n.max(0) as u64)
    }

    /// Number of tasks matching `f`.
    pub(crate) async fn task_count(&self, f: &TaskFilter<'_>) -> sqlx::Result<u64> {
        let state = f.state.map(TaskState::as_str);
        let n = sqlx::query_scalar!(
            r#"SELECT COUNT(*) AS "n: i64" FROM taskq_tasks
               WHERE (? IS NULL OR queue = ?) AND (? IS NULL OR state = ?) AND (? IS NULL OR name = ?)"#,
            f.queue,
            f.queue,
            state,
            state,
            f.name,
            f.name,
        )
        .fetch_one(&self.pool)
        .await?;
        Ok(n.max(0) as u64)
    }
}

impl Store {
    /// Counts by queue and state (ordered so), with the earliest `run_at` and `lease_until`:
    /// [`task_stats_active`](Self::task_stats_active), the running leases, then
    /// [`task_stats_terminal`](Self::task_stats_terminal), on one connection.
    pub(crate) async fn task_stats(
        &self,
        conn: &mut MySqlConnection,
    ) -> sqlx::Result<Vec<QueueStateCount>> {
        let mut rows = self.task_stats_active(&mut *conn).await?;
        for (queue, earliest) in self.task_running_leases(&mut *conn).await? {
            if let Some(r) = rows
                .iter_mut()
                .find(|r| r.state == TaskState::Running && r.queue == queue)
            {
                r.earliest_lease_until = earliest;
            }
        }
        rows.extend(self.task_stats_terminal(&mut *conn).await?);
        let rank = |s: TaskState| TaskState::ALL.iter().position(|x| *x == s);
        rows.sort_by(|a, b| (&a.queue, rank(a.state)).cmp(&(&b.queue, rank(b.state))));
        Ok(rows)
    }

    /// Counts by queue of the pending and running tasks, with the earliest `run_at`
    /// (`earliest_lease_until` is `None`): a covering range read of `ix_taskq_claim` over
    /// those two states.
    pub(crate) async fn task_stats_active(
        &self,
        conn: &mut MySqlConnection,
    ) -> sqlx::Result<Vec<QueueStateCount>> {
        sqlx::query_as!(
            QueueStateCount,
            r#"SELECT queue, state AS "state!: TaskState", CAST(COUNT(*) AS UNSIGNED) AS "count!: u64",
                 MIN(run_at) AS "oldest_run_at: DateTime<Utc>",
                 CAST(NULL AS DATETIME(6)) AS "earliest_lease_until: DateTime<Utc>"
               FROM taskq_tasks FORCE INDEX (ix_taskq_claim)
               WHERE state IN ('pending', 'running')
               GROUP BY state, queue"#
        )
        .fetch_all(&mut *conn)
        .await
    }

    /// The earliest `lease_until` of the running tasks per queue (reads the running rows).
    async fn task_running_leases(
        &self,
        conn: &mut MySqlConnection,
    ) -> sqlx::Result<Vec<(String, Option<DateTime<Utc>>)>> {
        let rows = sqlx::query!(
            r#"SELECT queue, MIN(lease_until) AS "earliest: DateTime<Utc>"
               FROM taskq_tasks FORCE INDEX (ix_taskq_claim)
               WHERE state = 'running' GROUP BY queue"#
        )
        .fetch_all(&mut *conn)
        .await?;
        Ok(rows.into_iter().map(|r| (r.queue, r.earliest)).collect())
    }

    /// Counts by queue of the tasks in terminal states, with the earliest `run_at`: a covering
    /// read of `ix_taskq_claim`'s terminal ranges (every terminal task's index entry, but not
    /// the rows).
    pub(crate) async fn task_stats_terminal(
        &self,
        conn: &mut MySqlConnection,
    ) -> sqlx::Result<Vec<QueueStateCount>> {
        sqlx::query_as!(
            QueueStateCount,
            r#"SELECT queue, state AS "state!: TaskState", CAST(COUNT(*) AS UNSIGNED) AS "count!: u64",
                 MIN(run_at) AS "oldest_run_at: DateTime<Utc>",
                 CAST(NULL AS DATETIME(6)) AS "earliest_lease_until: DateTime<Utc>"
               FROM taskq_tasks FORCE INDEX (ix_taskq_claim)
               WHERE state IN ('succeeded', 'dead', 'canceled', 'expired')
               GROUP BY state, queue"#
        )
        .fetch_all(&mut *conn)
        .await
    }

    /// Pending tasks per queue and name (of `queue` only, when given): how many, how many are
    /// due, the earliest `run_at`. A covering read of `ix_taskq_claim`'s pending range (every
    /// column it needs is in the index since migration 4), grouped in a temporary table.
    pub(crate) async fn task_pending_by_name(
        &self,
        conn: &mut MySqlConnection,
        queue: Option<&str>,
    ) -> sqlx::Result<Vec<PendingNameCount>> {
        sqlx::query_as!(
            PendingNameCount,
            r#"SELECT queue, name, CAST(COUNT(*) AS UNSIGNED) AS "pending!: u64",
                 CAST(SUM(run_at <= UTC_TIMESTAMP(6)) AS UNSIGNED) AS "due!: u64",
                 MIN(run_at) AS "oldest_run_at!: DateTime<Utc>"
               FROM taskq_tasks
               WHERE state = 'pending' AND (? IS NULL OR queue = ?)
               GROUP BY queue, name ORDER BY queue, name"#,
            queue,
            queue
        )
        .fetch_all(&mut *conn)
        .await
    }

    /// Ids (ascending, `> after_id`, at most `limit`) of tasks in `state` matching the bulk
    /// filter, created at least `age_us` ago (database clock; 0: any age, and `created_at` is
    /// not read); with whether the task holds a unique identity that only a one-row retry can
    /// take back (see `task_retry_dead`).
    pub(crate) async fn task_bulk_ids(
        &self,
        f: &TaskFilter<'_>,
        age_us: i64,
        after_id: u64,
        limit: u32,
    ) -> sqlx::Result<Vec<(u64, bool)>> {
        let state = f.state.map(TaskState::as_str);
        if age_us <= 0 {
            let rows = sqlx::query!(
                r#"SELECT id AS "id: u64",
                     (unique_key IS NOT NULL AND unique_while <> 'window') AS "held!: bool"
                   FROM taskq_tasks
                   WHERE state = ? AND (? IS NULL OR queue = ?) AND (? IS NULL OR name = ?)
                     AND id > ?
                   ORDER BY id
                   LIMIT ?"#,
                state,
                f.queue,
                f.queue,
                f.name,
                f.name,
                after_id,
                limit
            )
            .fetch_all(&self.pool)
            .await?;
            return Ok(rows.into_iter().map(|r| (r.id, r.held)).collect());
        }
        let rows = sqlx::query!(
            r#"SELECT id AS "id: u64",
                 (unique_key IS NOT NULL AND unique_while <> 'window') AS "held!: bool"
               FROM taskq_tasks
               WHERE state = ? AND (? IS NULL OR queue = ?) AND (? IS NULL OR name = ?)
                 AND created_at <= UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND AND id > ?
               ORDER BY id
               LIMIT ?"#,
            state,
            f.queue,
            f.queue,
            f.name,
            f.name,
            age_us,
            after_id,
            limit
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(|r| (r.id, r.held)).collect())
    }

    /// How many tasks in `state` match the bulk filter (the dry run of a bulk operation).
    /// Without an age (`age_us` 0) it reads no row, only `ix_taskq_claim` (whose columns
    /// include `queue` and `name`).
    pub(crate) async fn task_bulk_count(
        &self,
        f: &TaskFilter<'_>,
        age_us: i64,
    ) -> sqlx::Result<u64> {
        let state = f.state.map(TaskState::as_str);
        let n = if age_us <= 0 {
            sqlx::query_scalar!(
                r#"SELECT COUNT(*) AS "n: i64" FROM taskq_tasks
                   WHERE state = ? AND (? IS NULL OR queue = ?) AND (? IS NULL OR name = ?)"#,
                state,
                f.queue,
                f.queue,
                f.name,
                f.name,
            )
            .fetch_one(&self.pool)
            .await?
        } else {
            sqlx::query_scalar!(
                r#"SELECT COUNT(*) AS "n: i64" FROM taskq_tasks
                   WHERE state = ? AND (? IS NULL OR queue = ?) AND (? IS NULL OR name = ?)
                     AND created_at <= UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND"#,
                state,
                f.queue,
                f.queue,
                f.name,
                f.name,
                age_us
            )
            .fetch_one(&self.pool)
            .await?
        };
        Ok(n.max(0) as u64)
    }

    /// Cancels the pending tasks among `ids` (freeing their unique identities), in one short
    /// transaction; returns how many.
    pub(crate) async fn task_cancel_batch(&self, ids: &[u64]) -> sqlx::Result<u64> {
        let json = serde_json::to_string(ids).expect("ids serialize");
        let mut tx = self.pool.begin().await?;
        let done = sqlx::query!(
            r#"UPDATE JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$')) AS j
                 STRAIGHT_JOIN taskq_tasks t FORCE INDEX (PRIMARY) ON t.id = j.id
               SET t.state = 'canceled', t.finished_at = UTC_TIMESTAMP(6), t.updated_at = UTC_TIMESTAMP(6)
               WHERE t.state = 'pending'"#,
            json
        )
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() > 0 {
            sqlx::query!(
                r#"DELETE u FROM JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$')) AS j
                     STRAIGHT_JOIN taskq_tasks t FORCE INDEX (PRIMARY) ON t.id = j.id
                     STRAIGHT_JOIN taskq_unique u FORCE INDEX (PRIMARY) ON u.unique_key = t.unique_key
                   WHERE t.state = 'canceled' AND u.task_id = t.id"#,
                json
            )
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(done.rows_affected())
    }

    /// Records a cancel request on the running tasks among `ids`; returns how many were
    /// running.
    pub(crate) async fn task_request_cancel_batch(&self, ids: &[u64]) -> sqlx::Result<u64> {
        let json = serde_json::to_string(ids).expect("ids serialize");
        let done = sqlx::query!(
            r#"UPDATE JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$')) AS j
                 STRAIGHT_JOIN taskq_tasks t FORCE INDEX (PRIMARY) ON t.id = j.id
               SET t.cancel_requested_at = COALESCE(t.cancel_requested_at, UTC_TIMESTAMP(6)),
                   t.updated_at = UTC_TIMESTAMP(6)
               WHERE t.state = 'running'"#,
            json
        )
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }

    /// Retries the dead tasks among `ids` that hold no identity to take back (not unique, or
    /// unique per window, like `task_retry_dead_batch`); returns how many.
    pub(crate) async fn task_retry_dead_ids(&self, ids: &[u64]) -> sqlx::Result<u64> {
        let json = serde_json::to_string(ids).expect("ids serialize");
        let done = sqlx::query!(
            r#"UPDATE JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$')) AS j
                 STRAIGHT_JOIN taskq_tasks t FORCE INDEX (PRIMARY) ON t.id = j.id
               SET t.state = 'pending', t.attempt = 0, t.lease_epoch = t.lease_epoch + 1,
                   t.run_at = UTC_TIMESTAMP(6), t.finished_at = NULL, t.lease_until = NULL,
                   t.updated_at = UTC_TIMESTAMP(6)
               WHERE t.state = 'dead' AND (t.unique_key IS NULL OR t.unique_while = 'window')"#,
            json
        )
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }

    /// Records a cancel request on a running task (kept from the first request); returns
    /// whether the task was running. On the caller's transaction (with its audit row).
    pub(crate) async fn task_request_cancel(
        &self,
        conn: &mut MySqlConnection,
        id: TaskId,
    ) -> sqlx::Result<bool> {
        let done = sqlx::query!(
            r#"UPDATE taskq_tasks
               SET cancel_requested_at = COALESCE(cancel_requested_at, UTC_TIMESTAMP(6)),
                   updated_at = UTC_TIMESTAMP(6)
               WHERE id = ? AND state = 'running'"#,
            id.0
        )
        .execute(&mut *conn)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Cancels a pending task (freeing the unique identity it holds); returns whether a row
    /// changed. Two statements on the caller's transaction.
    pub(crate) async fn task_cancel(
        &self,
        tx: &mut MySqlConnection,
        id: TaskId,
    ) -> sqlx::Result<bool> {
        let done = sqlx::query!(
            r#"UPDATE taskq_tasks
               SET state = 'canceled', finished_at = UTC_TIMESTAMP(6), updated_at = UTC_TIMESTAMP(6)
               WHERE id = ? AND state = 'pending'"#,
            id.0
        )
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() == 1 {
            sqlx::query!(
                r#"DELETE u FROM taskq_tasks t
                     STRAIGHT_JOIN taskq_unique u FORCE INDEX (PRIMARY) ON u.unique_key = t.unique_key
                   WHERE t.id = ? AND u.task_id = t.id"#,
                id.0
            )
            .execute(&mut *tx)
            .await?;
        }
        Ok(done.rows_affected() == 1)
    }

    /// Moves a pending task's due time to `at`, or to `delay_us` from the database's now when
    /// `at` is `None`; returns whether a row matched.
    pub(crate) async fn task_reschedule(
        &self,
        conn: &mut MySqlConnection,
        id: TaskId,
        at: Option<DateTime<Utc>>,
        delay_us: i64,
    ) -> sqlx::Result<bool> {
        let done = sqlx::query!(
            r#"UPDATE taskq_tasks
               SET run_at = COALESCE(?, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND),
                   updated_at = UTC_TIMESTAMP(6)
               WHERE id = ? AND state = 'pending'"#,
            at.map(|d| d.naive_utc()),
            delay_us,
            id.0
        )
        .execute(&mut *conn)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Sets a pending task's priority; returns whether a row matched.
    pub(crate) async fn task_set_priority(
        &self,
        conn: &mut MySqlConnection,
        id: TaskId,
        priority: i16,
    ) -> sqlx::Result<bool> {
        let done = sqlx::query!(
            r#"UPDATE taskq_tasks SET priority = ?, updated_at = UTC_TIMESTAMP(6)
               WHERE id = ? AND state = 'pending'"#,
            priority,
            id.0
        )
        .execute(&mut *conn)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Moves a dead task back to pending with attempts reset and its epoch incremented. A task
    /// unique while pending or running takes its identity back, which fails (and changes
    /// nothing) when another task holds it meanwhile; a windowed one does not (see
    /// `docs/semantics.md`). On the caller's transaction: it writes only when it returns
    /// `Retried` (an `IdentityHeld` leaves the identity's row locked until the caller ends).
    pub(crate) async fn task_retry_dead(
        &self,
        tx: &mut MySqlConnection,
        id: TaskId,
    ) -> sqlx::Result<RetryDead> {
        let row = sqlx::query!(
            r#"SELECT unique_key AS "unique_key: Vec<u8>", unique_while FROM taskq_tasks
               WHERE id = ? AND state = 'dead' FOR UPDATE"#,
            id.0
        )
        .fetch_optional(&mut *tx)
        .await?;
        let Some(row) = row else {
            return Ok(RetryDead::NotDead);
        };
        let retake = row
            .unique_key
            .filter(|_| row.unique_while.as_deref() != Some("window"));
        if let Some(key) = retake
            && let Some(holder) = identity_reserve(tx, &key, id.0, None).await?
        {
            return Ok(RetryDead::IdentityHeld(holder));
        }
        sqlx::query!(
            r#"UPDATE taskq_tasks
               SET state = 'pending', attempt = 0, lease_epoch = lease_epoch + 1, run_at = UTC_TIMESTAMP(6),
                   finished_at = NULL, lease_until = NULL, updated_at = UTC_TIMESTAMP(6)
               WHERE id = ? AND state = 'dead'"#,
            id.0
        )
        .execute(&mut *tx)
        .await?;
        Ok(RetryDead::Retried)
    }
    /// The state of one task, or `None` when the id does not exist.
    pub(crate) async fn task_state(&self, id: TaskId) -> sqlx::Result<Option<TaskState>> {
        sqlx::query_scalar!(
            r#"SELECT state AS "state: TaskState" FROM taskq_tasks WHERE id = ?"#,
            id.0
        )
        .fetch_optional(&self.pool)
        .await
    }
}

/// A row's position in claim order, `(priority, run_at, id)`: the order of `ix_taskq_claim`
/// within a queue's pending rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ClaimKey {
    pub priority: i16,
    pub run_at: NaiveDateTime,
    pub id: u64,
}

/// Where a claim looks for due rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ClaimFrom {
    /// Candidates from the head of the queue, locked by primary key.
    Head,
    /// Candidates past this position, locked by primary key.
    After(ClaimKey),
    /// One locking scan of `ix_taskq_claim` from the head (`SELECT … ORDER BY … LIMIT ? FOR
    /// UPDATE SKIP LOCKED`): slower, but it walks past rows others hold however many there are.
    /// Used after a candidate claim locked nothing because others held every candidate.
    LockingScan,
}

/// One claim: up to `limit` due tasks of `queue` whose name is in `names_json`, looked for
/// `from` the head, a position or by locking scan, with `candidates` candidate ids read.
struct MySqlClaim<'a> {
    pub queue: &'a str,
    /// JSON array of the task names the worker handles.
    pub names_json: &'a str,
    pub limit: u32,
    pub candidates: u32,
    pub from: ClaimFrom,
    pub lease_us: i64,
    pub worker_id: &'a str,
    /// The worker saw the queue as limited (a concurrency or rate limit in `taskq_queues`):
    /// the claim locks the queue's row first and claims no more than the limits allow (see
    /// [`Store::task_claim`]). Unlimited queues never touch that row.
    pub limited: bool,
}

/// A claim loop's position between claims: where the next claim's candidate read starts and
/// how many candidates it reads per wanted task.
///
/// While draining a backlog the loop seeks past its last full claim (the candidate read then
/// does not step over the delete-marked index entries that claimed rows leave at the head),
/// and rescans from the head at least every [`RESCAN_EVERY`]. After a claim that others
/// partly beat it to (they held some candidates), it goes on past the candidates, so claimers
/// leapfrog each other; after one where others held every candidate, the next claim is one
/// locking scan. The spread doubles after a contended claim and halves after a short one
/// that was not contended.
#[derive(Debug)]
pub(crate) struct ClaimCursor {
    seek: Option<ClaimKey>,
    last_head_scan: Instant,
    locking_scan: bool,
    spread: u32,
}

impl Default for ClaimCursor {
    fn default() -> Self {
        Self {
            seek: None,
            last_head_scan: Instant::now(),
            locking_scan: false,
            spread: MIN_SPREAD,
        }
    }
}

/// Longest time a claim loop draining a backlog goes on seeking past its last claim before
/// it scans its queue from the head again: the most a task that sorts before the seek
/// position (a higher priority, an earlier `run_at`, a released or reaped task) waits for
/// the loop to look at it.
const RESCAN_EVERY: Duration = Duration::from_millis(100);

/// Candidates a claim reads per task it wants, at least and at most.
const MIN_SPREAD: u32 = 2;
const MAX_SPREAD: u32 = 8;

impl Store {
    /// Claims up to `req.limit` due tasks (see [`Store::claim_raw`]), from where `cursor`
    /// says, and moves the cursor on.
    pub(crate) async fn task_claim(
        &self,
        conn: &mut MySqlConnection,
        req: &ClaimRequest<'_>,
        cursor: &mut ClaimCursor,
    ) -> sqlx::Result<ClaimBatch> {
        let started = Instant::now();
        let after = cursor
            .seek
            .take()
            .filter(|_| cursor.last_head_scan.elapsed() < RESCAN_EVERY);
        let from = match after {
            Some(k) => ClaimFrom::After(k),
            None if cursor.locking_scan => ClaimFrom::LockingScan,
            None => ClaimFrom::Head,
        };
        cursor.locking_scan = false;
        if after.is_none() {
            cursor.last_head_scan = started;
        }
        let raw = self
            .claim_raw(
                conn,
                &MySqlClaim {
                    queue: req.queue,
                    names_json: req.names_json,
                    limit: req.limit,
                    candidates: req.limit.saturating_mul(cursor.spread),
                    from,
                    lease_us: req.lease_us,
                    worker_id: req.worker_id,
                    limited: req.limited,
                },
            )
            .await?;
        let took = raw.tasks.len() + raw.expired.len() + raw.canceled.len();
        let at_limit = raw.limited.is_some_and(|hit| took >= hit.allowed as usize);
        let mut contended = false;
        let mut partial = false;
        if at_limit {
            // Waiting for room: the next claim starts from the head.
        } else if took == req.limit as usize {
            cursor.seek = raw.last;
        } else {
            cursor.spread = if raw.contended_after.is_some() {
                (cursor.spread * 2).min(MAX_SPREAD)
            } else {
                (cursor.spread / 2).max(MIN_SPREAD)
            };
            if let Some(past) = raw.contended_after {
                contended = true;
                if raw.tasks.is_empty() {
                    cursor.locking_scan = true;
                } else {
                    cursor.seek = Some(past);
                }
            } else if after.is_some() {
                // The seek ran short, but rows sorting before its start may be due.
                partial = true;
            }
        }
        Ok(ClaimBatch {
            tasks: raw.tasks,
            expired: raw.expired,
            canceled: raw.canceled,
            limited: raw.limited,
            contended,
            partial,
        })
    }
}

/// The limits of a queue as the claim reads them, its row locked.
struct QueueLimits {
    /// The queue's claim counter (`taskq_queues.claims`), which every claim that starts
    /// tasks of the limited queue bumps.
    claims: u64,
    concurrency_limit: Option<u32>,
    rate_limit: Option<u32>,
    rate_period_us: Option<i64>,
    /// Claims already counted in the current rate window.
    rate_used: i64,
    /// Microseconds until the current rate window ends.
    rate_resets_in_us: Option<i64>,
}

/// What one claim transaction took (before the cursor reads it).
struct RawBatch {
    /// The claimed tasks, in claim order.
    pub tasks: Vec<Claimed>,
    /// Tasks the claim locked but found past their deadline: moved to `expired`, not run.
    pub expired: Vec<ExpiredTask>,
    /// Tasks the claim locked but found with a cancel request: moved to `canceled`, not run.
    pub canceled: Vec<CanceledTask>,
    /// Position of the last claimed row (`None` when nothing was claimed).
    pub last: Option<ClaimKey>,
    /// Set when fewer tasks than asked for were claimed although the candidate read was full:
    /// other claimers held some candidates, so more may be due. It is the position of the last
    /// candidate; the next claim goes on from there rather than reading the same candidates.
    pub contended_after: Option<ClaimKey>,
    /// Set when the queue's limits allowed fewer tasks than asked for.
    pub limited: Option<LimitHit>,
}

/// A candidate row of a claim (non-locking read of `ix_taskq_claim`, which covers it).
struct Candidate {
    id: u64,
    priority: i16,
    run_at: NaiveDateTime,
}

/// A row locked by the claim (values before the claim).
struct ClaimRow {
    id: u64,
    name: String,
    payload: Vec<u8>,
    priority: i16,
    run_at: NaiveDateTime,
    attempt: u32,
    max_attempts: u32,
    lease_epoch: u64,
    wait_us: i64,
    trace_context: Option<String>,
    snoozes: u32,
    /// Time until the deadline on the database clock (µs; zero or less: passed), if any.
    deadline_in_us: Option<i64>,
    unique_key: Option<Vec<u8>>,
    unique_while: Option<String>,
    /// A cancel request is on the row: an earlier attempt's (see [`ClaimRow::ends_at_claim`]).
    canceled: bool,
    /// `last_error` of a task whose attempts were exhausted before this claim (see
    /// `Claimed::parked_error`).
    parked_error: Option<String>,
}

impl ClaimRow {
    /// Whether the deadline has passed (on the database clock, at the claim).
    fn is_expired(&self) -> bool {
        self.deadline_in_us.is_some_and(|us| us <= 0)
    }

    /// Whether the claim ends the task instead of starting it: past its deadline (`expired`),
    /// or carrying a cancel request made while an earlier attempt ran that this attempt's
    /// outcome (a retry or snooze written before the worker saw the request) or a release
    /// left on the row (`canceled`).
    fn ends_at_claim(&self) -> bool {
        self.canceled || self.is_expired()
    }

    /// The identity this claim frees if the task holds it: a task unique while pending (it
    /// starts now), or any unique task the claim ends (`expired` or `canceled`, like a
    /// cancel).
    fn frees_at_claim(&self) -> Option<&[u8]> {
        let frees = match self.unique_while.as_deref() {
            Some("pending") => true,
            Some(_) => self.ends_at_claim(),
            None => false,
        };
        self.unique_key.as_deref().filter(|_| frees)
    }
}

impl Store {
    /// Claims up to `limit` due tasks of `queue` whose name is in `names_json`, in one short
    /// transaction of three statements:
    ///
    /// 1. a plain (non-locking) read of up to `candidates` ids (a few times `limit`) from
    ///    `ix_taskq_claim`, in claim order;
    /// 2. `SELECT … FOR UPDATE SKIP LOCKED` of those ids by primary key, re-checking that each
    ///    is still pending and due, stopping at `limit` rows: rows another claimer holds are
    ///    skipped, rows it already took no longer match;
    /// 3. one `UPDATE` that marks the locked rows running with a lease of `lease_us` and
    ///    increments attempt and epoch.
    ///
    /// The locking read also reads each row's `deadline` against the database clock: a row
    /// past it is not started but moved to `expired` by one more `UPDATE` in the same
    /// transaction, issued only when the batch has such rows (tasks without a deadline cost
    /// nothing more). Expired rows count towards `limit`.
    ///
    /// A claim of a limited queue first locks the queue's row and reads its limits, its
    /// running count (with a concurrency limit) and its claim counter `claims`; step 3 is then
    /// one `UPDATE` of the tasks and the queue's row together, which bumps the counter on
    /// condition that it is unchanged (on a Galera cluster, what makes claims of one limited
    /// queue on different nodes conflict: see the comment at that statement).
    ///
    /// Concurrent claimers read the same candidates; when this one locks fewer than `limit`
    /// although the candidate read was full, the batch says so (`contended_after`) and the
    /// next claim reads candidates past the last one, so claimers leapfrog each other instead
    /// of all re-reading rows that one of them holds. When others held every candidate, the
    /// loop's next claim is one [`ClaimFrom::LockingScan`], which walks past held rows however
    /// many there are.
    ///
    /// Locking by primary key instead of scanning `ix_taskq_claim` with a locking read is what
    /// makes the claim cheap: a locking read of a secondary index checks every entry it passes
    /// for implicit locks, including the delete-marked entries that claimed rows leave behind
    /// until InnoDB purges them. Measured on one connection draining 20,000 tasks 16 at a time:
    /// 2.3 ms per locking scan (p99 5.9 ms) against 1.1 ms (p99 1.7 ms) for the two reads.
    ///
    /// With [`ClaimFrom::After`], the candidate read starts just past that position instead of at the head
    /// of the queue, so it does not step over those delete-marked entries either. The claim
    /// loop seeks while it drains a backlog and rescans from the head regularly, so rows that
    /// sort earlier are not passed over for long.
    ///
    /// Run it on a READ COMMITTED connection: under REPEATABLE READ the reads would see an old
    /// snapshot and take gap locks.
    async fn claim_raw(
        &self,
        conn: &mut MySqlConnection,
        req: &MySqlClaim<'_>,
    ) -> sqlx::Result<RawBatch> {
        let &MySqlClaim {
            queue,
            names_json,
            limit,
            candidates,
            from,
            lease_us,
            worker_id,
            limited,
        } = req;
        let mut tx = conn.begin().await?;
        let mut hit = None;
        let mut rate_limited = false;
        // The queue's claim counter as read under the row lock, when a limit bounds the claim.
        let mut claims_seen = None;
        let mut limit = limit;
        if limited && let Some(l) = queue_limits_lock(&mut tx, queue).await? {
            let mut by_running = limit;
            if let Some(max) = l.concurrency_limit {
                claims_seen = Some(l.claims);
                let running = sqlx::query_scalar!(
                    r#"SELECT COUNT(*) AS "n!: i64" FROM taskq_tasks
                       WHERE state = 'running' AND queue = ?"#,
                    queue
                )
                .fetch_one(&mut *tx)
                .await?;
                by_running = by_running.min((i64::from(max) - running).clamp(0, 1 << 31) as u32);
            }
            let mut by_rate = limit;
            if let Some(max) = l
                .rate_limit
                .filter(|_| l.rate_period_us.is_some_and(|p| p > 0))
            {
                rate_limited = true;
                claims_seen = Some(l.claims);
                by_rate = by_rate.min((i64::from(max) - l.rate_used).clamp(0, 1 << 31) as u32);
            }
            let allowed = by_running.min(by_rate);
            if allowed < limit {
                hit = Some(LimitHit {
                    allowed,
                    // The rate is what binds: the window is used up once this claim is full.
                    rate_resets_in_us: l.rate_resets_in_us.filter(|_| by_rate <= by_running),
                });
            }
            limit = allowed;
            if limit == 0 {
                tx.commit().await?;
                return Ok(RawBatch {
                    tasks: Vec::new(),
                    expired: Vec::new(),
                    canceled: Vec::new(),
                    last: None,
                    contended_after: None,
                    limited: hit,
                });
            }
        }
        let (mut rows, freed, contended_after) = match from {
            ClaimFrom::LockingScan => {
                let rows = sqlx::query_as!(
                    ClaimRow,
                    r#"SELECT id AS "id: u64", name, payload, priority, run_at,
                         attempt AS "attempt: u32", max_attempts AS "max_attempts: u32",
                         lease_epoch AS "lease_epoch: u64",
                         TIMESTAMPDIFF(MICROSECOND, run_at, UTC_TIMESTAMP(6)) AS "wait_us!: i64",
                         trace_context, snoozes AS "snoozes: u32",
                         TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), deadline) AS "deadline_in_us: i64",
                         unique_key AS "unique_key: Vec<u8>", unique_while,
                         (cancel_requested_at IS NOT NULL) AS "canceled!: bool",
                         IF(attempt >= max_attempts, last_error, NULL) AS "parked_error: String"
                       FROM taskq_tasks
                       WHERE state = 'pending' AND queue = ? AND run_at <= UTC_TIMESTAMP(6)
                         AND JSON_CONTAINS(?, JSON_QUOTE(name))
                       ORDER BY priority, run_at, id
                       LIMIT ?
                       FOR UPDATE SKIP LOCKED"#,
                    queue,
                    names_json,
                    limit
                )
                .fetch_all(&mut *tx)
                .await?;
                let mut rows = rows;
                let mut freed = Vec::new();
                drop_identities_held_elsewhere(&mut tx, &mut rows, 0, &mut freed).await?;
                (rows, freed, None)
            }
            ClaimFrom::Head => {
                claim_by_candidates(&mut tx, queue, names_json, limit, candidates, None).await?
            }
            ClaimFrom::After(k) => {
                claim_by_candidates(&mut tx, queue, names_json, limit, candidates, Some(k)).await?
            }
        };
        if rows.is_empty() {
            tx.commit().await?;
            return Ok(RawBatch {
                tasks: Vec::new(),
                expired: Vec::new(),
                canceled: Vec::new(),
                last: None,
                contended_after,
                limited: hit,
            });
        }
        rows.sort_by_key(|r| (r.priority, r.run_at, r.id));
        let last = rows.last().map(|r| ClaimKey {
            priority: r.priority,
            run_at: r.run_at,
            id: r.id,
        });
        // Rows past their deadline, or with a cancel request left by an earlier attempt, are
        // never started: they end `expired` (`canceled`) in this transaction (after the claim's
        // own `UPDATE` below), with one more statement only when there are some.
        let (ended, rows): (Vec<ClaimRow>, Vec<ClaimRow>) =
            rows.into_iter().partition(ClaimRow::ends_at_claim);
        if let Some(seen) = claims_seen.filter(|_| !rows.is_empty()) {
            // A claim bounded by a limit starts its tasks and bumps the queue's claim counter in
            // one statement, on condition that the counter is still the one read under the row
            // lock. On a Galera cluster the row lock holds on this node only: a claim committed
            // on another node meanwhile either conflicts with this write at certification (one
            // of the two is rolled back with 1213, which the claim loop retries), or, applied
            // here, aborts this transaction (brute-force abort). MariaDB 10.11 was seen to
            // report such an abort to no statement at all: the rest of the claim then ran
            // outside any transaction and started tasks on a stale count. The condition on the
            // counter, and on each task's state and epoch, makes this statement claim nothing
            // then, since the claim that aborted it bumped the counter.
            let pairs: Vec<(u64, u64)> = rows.iter().map(|r| (r.id, r.lease_epoch)).collect();
            let pairs = serde_json::to_string(&pairs).expect("pairs serialize");
            let changed = sqlx::query!(
                r#"UPDATE taskq_queues q
                     STRAIGHT_JOIN JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$[0]',
                                                                epoch BIGINT UNSIGNED PATH '$[1]')) AS j
                     STRAIGHT_JOIN taskq_tasks t FORCE INDEX (PRIMARY) ON t.id = j.id
                   SET t.state = 'running', t.attempt = t.attempt + 1, t.lease_epoch = t.lease_epoch + 1,
                       t.lease_until = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, t.worker_id = ?,
                       t.attempted_at = UTC_TIMESTAMP(6), t.updated_at = UTC_TIMESTAMP(6),
                       q.claims = q.claims + 1
                   WHERE q.queue = ? AND q.claims = ?
                     AND t.state = 'pending' AND t.lease_epoch = j.epoch"#,
                pairs,
                lease_us,
                worker_id,
                queue,
                seen
            )
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if changed != rows.len() as u64 + 1 {
                // Only possible when the transaction is gone: nothing is claimed (`0`), or a
                // claim that ran outside it took some rows (they stay `running` under this
                // worker, which does not run them, until the reaper returns them).
                tracing::debug!(
                    queue,
                    changed,
                    wanted = rows.len(),
                    "taskq: claim of a limited queue lost its transaction (a brute-force abort on a Galera cluster that no statement reported); claiming again"
                );
                let _ = tx.rollback().await;
                return Ok(RawBatch {
                    tasks: Vec::new(),
                    expired: Vec::new(),
                    canceled: Vec::new(),
                    last: None,
                    contended_after: last,
                    limited: hit,
                });
            }
        } else if !rows.is_empty() {
            let ids = serde_json::to_string(&rows.iter().map(|r| r.id).collect::<Vec<_>>())
                .expect("ids serialize");
            sqlx::query!(
                r#"UPDATE JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$')) AS j
                     STRAIGHT_JOIN taskq_tasks t FORCE INDEX (PRIMARY) ON t.id = j.id
                   SET t.state = 'running', t.attempt = t.attempt + 1, t.lease_epoch = t.lease_epoch + 1,
                       t.lease_until = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, t.worker_id = ?,
                       t.attempted_at = UTC_TIMESTAMP(6), t.updated_at = UTC_TIMESTAMP(6)"#,
                ids,
                lease_us,
                worker_id
            )
            .execute(&mut *tx)
            .await?;
        }
        if !ended.is_empty() {
            let ids = serde_json::to_string(&ended.iter().map(|r| r.id).collect::<Vec<_>>())
                .expect("ids serialize");
            sqlx::query!(
                r#"UPDATE JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$')) AS j
                     STRAIGHT_JOIN taskq_tasks t FORCE INDEX (PRIMARY) ON t.id = j.id
                   SET t.state = IF(t.cancel_requested_at IS NOT NULL, 'canceled', 'expired'),
                       t.finished_at = UTC_TIMESTAMP(6), t.updated_at = UTC_TIMESTAMP(6)
                   WHERE t.state = 'pending'"#,
                ids
            )
            .execute(&mut *tx)
            .await?;
        }
        if rate_limited && !rows.is_empty() {
            // Counted in the window of this statement's clock, not the lock's: a claim that
            // straddles a window boundary counts in the window its tasks' claim time (the
            // `UPDATE` above) falls in, so no window holds more claims than the limit.
            sqlx::query!(
                r#"UPDATE taskq_queues
                   SET rate_window_count = IF(rate_window_start = CAST('1970-01-01' AS DATETIME(6))
                         + INTERVAL (TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6))
                                     DIV rate_period_us * rate_period_us) MICROSECOND,
                         rate_window_count + ?, ?),
                       rate_window_start = CAST('1970-01-01' AS DATETIME(6))
                         + INTERVAL (TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6))
                                     DIV rate_period_us * rate_period_us) MICROSECOND
                   WHERE queue = ? AND rate_period_us > 0"#,
                rows.len() as u32,
                rows.len() as u32,
                queue
            )
            .execute(&mut *tx)
            .await?;
        }
        if !freed.is_empty() {
            // The identities this claim frees (tasks unique while pending, and unique tasks
            // that expired): ours, locked above.
            let pairs: Vec<(String, u64)> = freed
                .iter()
                .map(|(k, id)| (crate::enqueue::hex(k), *id))
                .collect();
            let json = serde_json::to_string(&pairs).expect("pairs serialize");
            sqlx::query!(
                r#"DELETE u FROM JSON_TABLE(?, '$[*]' COLUMNS (k VARCHAR(64) PATH '$[0]',
                                                              id BIGINT UNSIGNED PATH '$[1]')) AS j
                     STRAIGHT_JOIN taskq_unique u FORCE INDEX (PRIMARY)
                       ON u.unique_key = UNHEX(j.k) AND u.task_id = j.id"#,
                json
            )
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        let tasks = rows
            .into_iter()
            .map(|r| Claimed {
                id: r.id,
                name: r.name,
                payload: r.payload,
                attempt: r.attempt + 1,
                max_attempts: r.max_attempts,
                snoozes: r.snoozes,
                lease_epoch: r.lease_epoch + 1,
                wait_us: r.wait_us,
                trace_context: r.trace_context,
                unique_key: r.unique_key,
                unique_while: r.unique_while,
                parked_error: r.parked_error,
            })
            .collect();
        let (canceled, expired): (Vec<ClaimRow>, Vec<ClaimRow>) =
            ended.into_iter().partition(|r| r.canceled);
        let expired = expired
            .into_iter()
            .map(|r| ExpiredTask {
                id: r.id,
                name: r.name,
                late_us: -r.deadline_in_us.unwrap_or(0),
            })
            .collect();
        let canceled = canceled
            .into_iter()
            .map(|r| CanceledTask {
                id: r.id,
                name: r.name,
            })
            .collect();
        Ok(RawBatch {
            tasks,
            expired,
            canceled,
            last,
            contended_after,
            limited: hit,
        })
    }
}

/// First step of a claim of a limited queue: locks the queue's row in `taskq_queues` (claims
/// of this queue serialize here until the claim commits; on a Galera cluster only those of one
/// node, which is why a claim that starts tasks also writes the row, see [`Store::claim_raw`])
/// and reads its limits and claim counter, with the
/// claims already counted in the current rate window (windows are multiples of the period
/// since 1970 on the database clock). `None` when the queue has no row.
async fn queue_limits_lock(
    tx: &mut sqlx::Transaction<'_, sqlx::MySql>,
    queue: &str,
) -> sqlx::Result<Option<QueueLimits>> {
    sqlx::query_as!(
        QueueLimits,
        r#"SELECT claims AS "claims: u64", concurrency_limit AS "concurrency_limit: u32",
             rate_limit AS "rate_limit: u32", rate_period_us,
             CAST(IF(rate_window_start = CAST('1970-01-01' AS DATETIME(6))
                       + INTERVAL (TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6))
                                   DIV rate_period_us * rate_period_us) MICROSECOND,
                     rate_window_count, 0) AS SIGNED) AS "rate_used!: i64",
             TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), CAST('1970-01-01' AS DATETIME(6))
                  + INTERVAL ((TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6))
                               DIV rate_period_us + 1) * rate_period_us) MICROSECOND)
               AS "rate_resets_in_us: i64"
           FROM taskq_queues WHERE queue = ?
           FOR UPDATE"#,
        queue
    )
    .fetch_optional(&mut **tx)
    .await
}

/// Steps 1 and 2 of [`Store::task_claim`]: candidates (from the head, or past `after`), then
/// the locking read of them by primary key. Returns the locked rows and, when fewer than
/// `limit` were locked although the candidate read was full, the last candidate's position.
async fn claim_by_candidates(
    tx: &mut sqlx::Transaction<'_, sqlx::MySql>,
    queue: &str,
    names_json: &str,
    limit: u32,
    wanted_candidates: u32,
    after: Option<ClaimKey>,
) -> sqlx::Result<(Vec<ClaimRow>, Vec<(Vec<u8>, u64)>, Option<ClaimKey>)> {
    let wanted_candidates = wanted_candidates.max(limit);
    let candidates = match after {
        None => {
            sqlx::query_as!(
                Candidate,
                r#"SELECT id AS "id: u64", priority, run_at
                   FROM taskq_tasks
                   WHERE state = 'pending' AND queue = ? AND run_at <= UTC_TIMESTAMP(6)
                     AND JSON_CONTAINS(?, JSON_QUOTE(name))
                   ORDER BY priority, run_at, id
                   LIMIT ?"#,
                queue,
                names_json,
                wanted_candidates
            )
            .fetch_all(&mut **tx)
            .await?
        }
        Some(k) => {
            // The row-order predicate is spelled out (no row constructor) so that both MySQL
            // and MariaDB turn it into ranges of the index.
            sqlx::query_as!(
                Candidate,
                r#"SELECT id AS "id: u64", priority, run_at
                   FROM taskq_tasks
                   WHERE state = 'pending' AND queue = ? AND run_at <= UTC_TIMESTAMP(6)
                     AND (priority > ?
                          OR (priority = ? AND run_at > ?)
                          OR (priority = ? AND run_at = ? AND id > ?))
                     AND JSON_CONTAINS(?, JSON_QUOTE(name))
                   ORDER BY priority, run_at, id
                   LIMIT ?"#,
                queue,
                k.priority,
                k.priority,
                k.run_at,
                k.priority,
                k.run_at,
                k.id,
                names_json,
                wanted_candidates
            )
            .fetch_all(&mut **tx)
            .await?
        }
    };
    if candidates.is_empty() {
        return Ok((Vec::new(), Vec::new(), None));
    }
    let last_candidate = candidates
        .last()
        .filter(|_| candidates.len() as u32 == wanted_candidates)
        .map(|c| ClaimKey {
            priority: c.priority,
            run_at: c.run_at,
            id: c.id,
        });
    let candidate_ids: Vec<u64> = candidates.iter().map(|c| c.id).collect();
    let mut rows = lock_candidates(tx, &candidate_ids, limit).await?;
    let contended_after = last_candidate.filter(|_| (rows.len() as u32) < limit);
    // Rows whose unique identity a producer's open transaction holds are given up (see
    // `drop_identities_held_elsewhere`); the candidates after the last row locked replace them.
    let mut freed = Vec::new();
    let mut searched = 0;
    let mut checked = 0;
    while rows[checked..].iter().any(|r| r.frees_at_claim().is_some()) {
        searched = rows
            .iter()
            .filter_map(|r| candidate_ids.iter().position(|&c| c == r.id))
            .max()
            .map_or(searched, |p| p + 1)
            .max(searched);
        let dropped = drop_identities_held_elsewhere(tx, &mut rows, checked, &mut freed).await?;
        checked = rows.len();
        let wanted = limit.saturating_sub(rows.len() as u32);
        if dropped == 0 || wanted == 0 || searched >= candidate_ids.len() {
            break;
        }
        let more = lock_candidates(tx, &candidate_ids[searched..], wanted).await?;
        if more.is_empty() {
            break;
        }
        rows.extend(more);
    }
    Ok((rows, freed, contended_after))
}

/// Step 2 of the claim: locks up to `limit` of `ids` (candidates, in claim order) that are
/// still pending and due, by primary key, skipping rows others hold.
async fn lock_candidates(
    tx: &mut sqlx::Transaction<'_, sqlx::MySql>,
    ids: &[u64],
    limit: u32,
) -> sqlx::Result<Vec<ClaimRow>> {
    let ids_json = serde_json::to_string(ids).expect("ids serialize");
    // Driven from the JSON side, so rows are visited (and locked) in claim order and the scan
    // stops at `limit` locked rows.
    sqlx::query_as!(
        ClaimRow,
        r#"SELECT t.id AS "id: u64", t.name, t.payload, t.priority, t.run_at,
             t.attempt AS "attempt: u32", t.max_attempts AS "max_attempts: u32",
             t.lease_epoch AS "lease_epoch: u64",
             TIMESTAMPDIFF(MICROSECOND, t.run_at, UTC_TIMESTAMP(6)) AS "wait_us!: i64",
             t.trace_context, t.snoozes AS "snoozes: u32",
             TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), t.deadline) AS "deadline_in_us: i64",
             t.unique_key AS "unique_key: Vec<u8>", t.unique_while,
             (t.cancel_requested_at IS NOT NULL) AS "canceled!: bool",
             IF(t.attempt >= t.max_attempts, t.last_error, NULL) AS "parked_error: String"
           FROM JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$')) AS j
             STRAIGHT_JOIN taskq_tasks t FORCE INDEX (PRIMARY) ON t.id = j.id
           WHERE t.state = 'pending' AND t.run_at <= UTC_TIMESTAMP(6)
           LIMIT ?
           FOR UPDATE SKIP LOCKED"#,
        ids_json,
        limit
    )
    .fetch_all(&mut **tx)
    .await
}

/// Of the rows a claim locked (from index `from` on), those unique while pending free their
/// identity: the ones holding it are added to `freed` (their `taskq_unique` rows, now locked,
/// are deleted with the claim), except those whose identity another transaction holds: a
/// producer whose enqueue was a duplicate of the task and has not committed yet. Deleting
/// that row would wait for that transaction; instead the task is dropped from the claim and
/// stays pending until the transaction ends, so it starts after the producer's writes are
/// visible. Returns how many rows were dropped. No statement when no row frees an identity.
async fn drop_identities_held_elsewhere(
    tx: &mut sqlx::Transaction<'_, sqlx::MySql>,
    rows: &mut Vec<ClaimRow>,
    from: usize,
    freed: &mut Vec<(Vec<u8>, u64)>,
) -> sqlx::Result<usize> {
    let wanted: Vec<(&[u8], u64)> = rows[from..]
        .iter()
        .filter_map(|r| r.frees_at_claim().map(|k| (k, r.id)))
        .collect();
    if wanted.is_empty() {
        return Ok(0);
    }
    let taken = identities_take(tx, &wanted).await?;
    freed.extend(taken.ours.iter().cloned());
    let before = rows.len();
    let mut i = 0;
    rows.retain(|r| {
        i += 1;
        i <= from || !taken.held_elsewhere.contains(&r.id)
    });
    Ok(before - rows.len())
}

/// What [`identities_take`] found.
#[derive(Default)]
struct Taken {
    /// `(identity, task)` pairs the task holds, now locked by this transaction.
    ours: Vec<(Vec<u8>, u64)>,
    /// Tasks that hold their identity while another transaction has its row locked.
    held_elsewhere: Vec<u64>,
}

/// For `(identity, task)` pairs about to be freed, locks the `taskq_unique` rows that no
/// other transaction holds (`FOR UPDATE SKIP LOCKED`: it never waits, so the order does not
/// matter for deadlocks) and sorts the pairs out: held by that task and now locked here, held
/// by that task but locked elsewhere (a plain read tells, only for rows the lock skipped), or
/// not held by that task at all (nothing to free).
async fn identities_take(
    conn: &mut MySqlConnection,
    wanted: &[(&[u8], u64)],
) -> sqlx::Result<Taken> {
    let mut hex_keys: Vec<String> = wanted.iter().map(|(k, _)| crate::enqueue::hex(k)).collect();
    hex_keys.sort_unstable();
    hex_keys.dedup();
    let json = serde_json::to_string(&hex_keys).expect("keys serialize");
    let locked = sqlx::query!(
        r#"SELECT u.unique_key AS "unique_key: Vec<u8>", u.task_id AS "task_id: u64"
           FROM JSON_TABLE(?, '$[*]' COLUMNS (k VARCHAR(64) PATH '$')) AS j
             STRAIGHT_JOIN taskq_unique u FORCE INDEX (PRIMARY) ON u.unique_key = UNHEX(j.k)
           FOR UPDATE SKIP LOCKED"#,
        json
    )
    .fetch_all(&mut *conn)
    .await?;
    let mut taken = Taken {
        ours: Vec::new(),
        held_elsewhere: Vec::new(),
    };
    let mut skipped: Vec<String> = Vec::new();
    for (k, id) in wanted {
        match locked.iter().find(|l| l.unique_key == *k) {
            Some(l) if l.task_id == *id => taken.ours.push((k.to_vec(), *id)),
            Some(_) => {}
            None => skipped.push(crate::enqueue::hex(k)),
        }
    }
    if !skipped.is_empty() {
        let json = serde_json::to_string(&skipped).expect("keys serialize");
        let rows = sqlx::query!(
            r#"SELECT u.unique_key AS "unique_key: Vec<u8>", u.task_id AS "task_id: u64"
               FROM JSON_TABLE(?, '$[*]' COLUMNS (k VARCHAR(64) PATH '$')) AS j
                 STRAIGHT_JOIN taskq_unique u FORCE INDEX (PRIMARY) ON u.unique_key = UNHEX(j.k)"#,
            json
        )
        .fetch_all(&mut *conn)
        .await?;
        for (k, id) in wanted {
            if rows.iter().any(|r| r.unique_key == *k && r.task_id == *id)
                && !locked.iter().any(|l| l.unique_key == *k)
            {
                taken.held_elsewhere.push(*id);
            }
        }
    }
    Ok(taken)
}

/// Deletes the `taskq_unique` rows of `(identity, task, epoch, state)` whose task row has that
/// epoch and state: the rows written by the write-back (or reap) just before in the same
/// transaction, not those it was fenced from.
async fn identities_free_written(
    conn: &mut MySqlConnection,
    rows: &[(String, u64, u64, &str)],
) -> sqlx::Result<()> {
    if rows.is_empty() {
        return Ok(());
    }
    let json = serde_json::to_string(rows).expect("rows serialize");
    sqlx::query!(
        r#"DELETE u FROM JSON_TABLE(?, '$[*]' COLUMNS (k VARCHAR(64) PATH '$[0]',
                                                      id BIGINT UNSIGNED PATH '$[1]',
                                                      epoch BIGINT UNSIGNED PATH '$[2]',
                                                      state VARCHAR(16) PATH '$[3]')) AS j
             STRAIGHT_JOIN taskq_tasks t FORCE INDEX (PRIMARY)
               ON t.id = j.id AND t.lease_epoch = j.epoch AND t.state = j.state
             STRAIGHT_JOIN taskq_unique u FORCE INDEX (PRIMARY)
               ON u.unique_key = UNHEX(j.k) AND u.task_id = j.id"#,
        json
    )
    .execute(&mut *conn)
    .await?;
    Ok(())
}

impl Store {
    /// Renews the leases `(id, epoch)` that are still held (running, same epoch, not expired)
    /// and carry no cancel request to `now + lease_us`. Returns how many were renewed: fewer
    /// than sent makes the worker read [`task_leases_held`](Self::task_leases_held), which
    /// also reports the cancel requests (so a beat with none costs one statement).
    pub(crate) async fn task_heartbeat(
        &self,
        conn: &mut MySqlConnection,
        leases_json: &str,
        lease_us: i64,
    ) -> sqlx::Result<u64> {
        let done = sqlx::query!(
            r#"UPDATE JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$[0]',
                                                   epoch BIGINT UNSIGNED PATH '$[1]')) AS j
                 STRAIGHT_JOIN taskq_tasks t FORCE INDEX (PRIMARY) ON t.id = j.id AND t.lease_epoch = j.epoch
               SET t.lease_until = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, t.updated_at = UTC_TIMESTAMP(6)
               WHERE t.state = 'running' AND t.lease_until > UTC_TIMESTAMP(6)
                 AND t.cancel_requested_at IS NULL"#,
            leases_json,
            lease_us
        )
        .execute(&mut *conn)
        .await?;
        Ok(done.rows_affected())
    }

    /// Of the leases `(id, epoch)`, those still held: running, same epoch, unexpired; with
    /// whether a cancel was requested (`Client::cancel` on the running task).
    pub(crate) async fn task_leases_held(
        &self,
        conn: &mut MySqlConnection,
        leases_json: &str,
    ) -> sqlx::Result<Vec<(u64, u64, bool)>> {
        let rows = sqlx::query!(
            r#"SELECT t.id AS "id: u64", t.lease_epoch AS "lease_epoch: u64",
                 (t.cancel_requested_at IS NOT NULL) AS "cancel_requested!: bool"
               FROM JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$[0]',
                                                 epoch BIGINT UNSIGNED PATH '$[1]')) AS j
                 STRAIGHT_JOIN taskq_tasks t FORCE INDEX (PRIMARY) ON t.id = j.id AND t.lease_epoch = j.epoch
               WHERE t.state = 'running' AND t.lease_until > UTC_TIMESTAMP(6)"#,
            leases_json
        )
        .fetch_all(&mut *conn)
        .await?;
        Ok(rows
            .into_iter()
            .map(|r| (r.id, r.lease_epoch, r.cancel_requested))
            .collect())
    }
}

impl Store {
    /// Writes a batch of outcomes. Each row is written only if it is still running with the
    /// epoch its attempt claimed. A snooze is a retry that gives its attempt back (`attempt - 1`,
    /// like a release) and counts itself in `snoozes`. One statement, unless some outcomes free
    /// a unique identity: then one short transaction that locks those identities `SKIP LOCKED`,
    /// writes the outcomes, and deletes the identities of the rows it wrote. An outcome whose
    /// identity another transaction holds (a producer that got `duplicate = true` for this task
    /// and has not ended) is deferred, see [`WrittenBack::deferred`]: deleting the identity would
    /// wait for that transaction while holding the batch's rows, on which the heartbeat of every
    /// lease in the batch would then wait too.
    ///
    /// Outcomes carrying a follow-up (`on_dead` / `on_success`) make it a transaction as well:
    /// a locking read of the batch's rows by primary key (ascending id) tells which are still
    /// running with their attempt's epoch, the `UPDATE` writes exactly those, and one `INSERT`
    /// adds the follow-ups of those among them, before the commit. A fenced outcome inserts
    /// nothing; a batch without follow-ups keeps the single statement.
    pub(crate) async fn task_write_back(
        &self,
        conn: &mut MySqlConnection,
        batch: &[WriteBack],
    ) -> sqlx::Result<WrittenBack> {
        let wanted: Vec<(&[u8], u64)> = batch
            .iter()
            .filter_map(|f| f.frees.as_deref().map(|k| (k, f.id)))
            .collect();
        let follow = batch.iter().any(|f| f.follow_up.is_some());
        if wanted.is_empty() && !follow {
            return Ok(WrittenBack {
                written: write_back_rows(conn, batch.iter()).await?,
                ..WrittenBack::default()
            });
        }
        let mut tx = conn.begin().await?;
        let taken = if wanted.is_empty() {
            Taken::default()
        } else {
            identities_take(&mut tx, &wanted).await?
        };
        let deferred = taken.held_elsewhere;
        let rows: Vec<&WriteBack> = batch.iter().filter(|f| !deferred.contains(&f.id)).collect();
        // With follow-ups, first lock the batch's rows (ascending id, like every batch
        // statement) and learn which are still running with their attempt's epoch: exactly
        // those the `UPDATE` writes, so exactly their follow-ups are inserted.
        let written_ids = if rows.iter().any(|f| f.follow_up.is_some()) {
            let leases: Vec<(u64, u64)> = rows.iter().map(|f| (f.id, f.epoch)).collect();
            Some(lock_running(&mut tx, &leases_json(&leases)).await?)
        } else {
            None
        };
        let written = write_back_rows(&mut tx, rows.iter().copied()).await?;
        let mut followed = Vec::new();
        if let Some(ids) = written_ids {
            let mut inserts: Vec<&FollowUpRow> = Vec::new();
            for f in rows.iter().filter(|f| ids.contains(&f.id)) {
                if let Some(row) = f.follow_up.as_deref() {
                    inserts.push(row);
                    followed.push(f.id);
                }
            }
            follow_ups_insert(&mut tx, &inserts).await?;
        }
        let free: Vec<(String, u64, u64, &str)> = rows
            .iter()
            .filter(|f| taken.ours.iter().any(|(_, id)| *id == f.id))
            .filter_map(|f| {
                let k = f.frees.as_deref()?;
                Some((crate::enqueue::hex(k), f.id, f.epoch, f.state))
            })
            .collect();
        identities_free_written(&mut tx, &free).await?;
        tx.commit().await?;
        Ok(WrittenBack {
            written,
            deferred,
            followed,
        })
    }

    /// Gives running tasks back (shutdown): pending, epoch incremented, the interrupted
    /// attempt not counted, `run_at` kept (so the task sorts where it was, ahead of tasks
    /// enqueued after it). Conditional on each `(id, epoch)`.
    pub(crate) async fn task_release(
        &self,
        conn: &mut MySqlConnection,
        leases_json: &str,
    ) -> sqlx::Result<u64> {
        let done = sqlx::query!(
            r#"UPDATE JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$[0]',
                                                   epoch BIGINT UNSIGNED PATH '$[1]')) AS j
                 STRAIGHT_JOIN taskq_tasks t FORCE INDEX (PRIMARY) ON t.id = j.id AND t.lease_epoch = j.epoch
               SET t.attempts = JSON_ARRAY_APPEND(
                     IF(JSON_LENGTH(COALESCE(t.attempts, '[]')) >= 100, JSON_REMOVE(t.attempts, '$[0]'),
                        COALESCE(t.attempts, '[]')), '$',
                     JSON_OBJECT('attempt', t.attempt, 'epoch', j.epoch, 'worker', t.worker_id,
                       'started_at', DATE_FORMAT(t.attempted_at, '%Y-%m-%d %H:%i:%s.%f'),
                       'finished_at', DATE_FORMAT(UTC_TIMESTAMP(6), '%Y-%m-%d %H:%i:%s.%f'),
                       'outcome', 'released', 'error', NULL)),
                   t.state = 'pending', t.lease_epoch = t.lease_epoch + 1,
                   t.attempt = IF(t.attempt > 0, t.attempt - 1, 0),
                   t.lease_until = NULL, t.worker_id = NULL,
                   t.updated_at = UTC_TIMESTAMP(6)
               WHERE t.state = 'running'"#,
            leases_json
        )
        .execute(&mut *conn)
        .await?;
        Ok(done.rows_affected())
    }

    /// The leases `(id, epoch)` of `queue`'s running tasks that `worker_id` claimed (on the
    /// database clock) in the last `since_us` µs: a plain read of `ix_taskq_claim`'s running
    /// range for the queue (the running tasks of a queue are few: at most the fleet's slots).
    /// Issued only after a claim whose answer was lost (see `worker::claim`).
    pub(crate) async fn task_running_since(
        &self,
        conn: &mut MySqlConnection,
        queue: &str,
        worker_id: &str,
        since_us: i64,
    ) -> sqlx::Result<Vec<(u64, u64)>> {
        let rows = sqlx::query!(
            r#"SELECT id AS "id: u64", lease_epoch AS "lease_epoch: u64"
               FROM taskq_tasks
               WHERE state = 'running' AND queue = ? AND worker_id = ?
                 AND attempted_at >= UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND"#,
            queue,
            worker_id,
            since_us
        )
        .fetch_all(&mut *conn)
        .await?;
        Ok(rows.into_iter().map(|r| (r.id, r.lease_epoch)).collect())
    }

    /// Up to `limit` running tasks whose lease has expired, oldest lease first: a plain read of
    /// `ix_taskq_lease`, the first half of a reap ([`task_reap`](Self::task_reap) is the
    /// second), with whether each task's name is in `names_json` (the names this worker
    /// registers). Only such a worker knows a task's `on_dead` follow-up: a last attempt of a
    /// name it registers goes dead (its payload is read for the follow-up), one of another
    /// name is parked back to pending (see `ExpiredRow::parks`).
    pub(crate) async fn task_expired(
        &self,
        conn: &mut MySqlConnection,
        names_json: &str,
        limit: u32,
    ) -> sqlx::Result<Vec<ExpiredRow>> {
        sqlx::query_as!(
            ExpiredRow,
            r#"SELECT id AS "id: u64", lease_epoch AS "lease_epoch: u64", name, queue,
                 attempt AS "attempt: u32", max_attempts AS "max_attempts: u32", worker_id,
                 IF((cancel_requested_at IS NOT NULL
                     OR (attempt >= max_attempts AND JSON_CONTAINS(?, JSON_QUOTE(name))))
                      AND unique_while IN ('running', 'window'), unique_key, NULL)
                   AS "frees: Vec<u8>",
                 (cancel_requested_at IS NOT NULL) AS "canceled!: bool",
                 (JSON_CONTAINS(?, JSON_QUOTE(name)) = 1) AS "registered!: bool",
                 IF(attempt >= max_attempts AND cancel_requested_at IS NULL
                      AND JSON_CONTAINS(?, JSON_QUOTE(name)), payload, NULL)
                   AS "payload: Vec<u8>",
                 trace_context
               FROM taskq_tasks
               WHERE state = 'running' AND lease_until < UTC_TIMESTAMP(6)
               ORDER BY lease_until
               LIMIT ?"#,
            names_json,
            names_json,
            names_json,
            limit
        )
        .fetch_all(&mut *conn)
        .await
    }

    /// Reaps expired leases read by [`task_expired`](Self::task_expired): back to pending
    /// with its `run_at` kept (like Oban's Lifeline: it sorts where it was in its queue, ahead
    /// of the tasks enqueued after it, instead of behind the whole backlog), to dead when attempts are exhausted, or to canceled when a cancel was requested (a
    /// reclaim never resurrects a canceled task); epoch incremented either way. Each row is
    /// reaped only if it is still running with the epoch read, its lease still expired (a
    /// late write-back may have landed in between) and its cancel request as read (a request
    /// that landed in between is left for the next round, see [`reap_rows`]). Returns how many were reaped and, when
    /// `exact` is set or follow-ups were inserted, which rows (and their new state).
    ///
    /// Two statements in all, like the claim: the plain read of expired ids on
    /// `ix_taskq_lease`, then one `UPDATE` by primary key in id order that re-checks the
    /// expiry. A single `UPDATE … WHERE state = 'running' AND lease_until < now ORDER BY
    /// lease_until` locks `ix_taskq_lease` entries before the rows (including, briefly, the
    /// first entry past the range: a lease that is not expired), while a write-back holds the
    /// row and then needs that entry: the no-fault reliability baseline counted such deadlocks.
    /// Now every statement that locks running rows locks them by primary key first, in
    /// ascending id order.
    ///
    /// A task that goes dead or canceled frees the unique identity it holds. When some do, the
    /// `UPDATE` runs in a transaction that first locks those identities `SKIP LOCKED` and then
    /// deletes them, and it leaves for a later round the tasks whose identity a producer's open
    /// transaction holds, like the write-back. When a row carries a follow-up (or `exact` is
    /// asked), the transaction first locks the rows by primary key (ascending id) and reads
    /// which are still expired and whether each goes dead; the follow-ups of exactly the rows
    /// it moves to dead are inserted before it commits.
    pub(crate) async fn task_reap(
        &self,
        conn: &mut MySqlConnection,
        rows: &[ReapRow],
        exact: bool,
    ) -> sqlx::Result<Reaped> {
        if rows.is_empty() {
            return Ok(Reaped::default());
        }
        let wanted: Vec<(&[u8], u64)> = rows
            .iter()
            .filter_map(|r| r.frees.as_deref().map(|k| (k, r.id)))
            .collect();
        let follow = rows.iter().any(|r| r.follow_up.is_some());
        if wanted.is_empty() && !follow && !exact {
            let all: Vec<&ReapRow> = rows.iter().collect();
            let reaped = reap_rows(conn, &reap_json(&all)).await?;
            return Ok(Reaped {
                reaped,
                ..Reaped::default()
            });
        }
        let mut tx = conn.begin().await?;
        let taken = if wanted.is_empty() {
            Taken::default()
        } else {
            identities_take(&mut tx, &wanted).await?
        };
        let kept: Vec<&ReapRow> = rows
            .iter()
            .filter(|r| !taken.held_elsewhere.contains(&r.id))
            .collect();
        let (json, locked) = if follow || exact {
            let locked = lock_expired(&mut tx, &reap_json(&kept)).await?;
            let kept: Vec<&ReapRow> = kept
                .into_iter()
                .filter(|r| locked.iter().any(|l| l.id == r.id && l.epoch == r.epoch))
                .collect();
            (reap_json(&kept), Some(locked))
        } else {
            (reap_json(&kept), None)
        };
        let reaped = reap_rows(&mut tx, &json).await?;
        let mut out = Reaped {
            reaped,
            ..Reaped::default()
        };
        if let Some(locked) = &locked {
            let mut inserts = Vec::new();
            for l in locked {
                let state = match (l.canceled, l.goes_dead) {
                    (true, _) => TaskState::Canceled,
                    (false, true) => TaskState::Dead,
                    (false, false) => TaskState::Pending,
                };
                out.rows.push((l.id, state));
                let row = rows.iter().find(|r| r.id == l.id);
                if let Some(f) = row.and_then(|r| r.follow_up.as_deref())
                    && state == TaskState::Dead
                {
                    inserts.push(f);
                    out.followed.push(l.id);
                }
            }
            follow_ups_insert(&mut tx, &inserts).await?;
        }
        // Those reaped to dead or canceled, with the epoch the reap gave them.
        let free: Vec<(String, u64, u64, &str)> = rows
            .iter()
            .filter(|r| taken.ours.iter().any(|(_, id)| *id == r.id))
            .filter_map(|r| {
                let k = r.frees.as_deref()?;
                let state = if r.canceled { "canceled" } else { "dead" };
                Some((crate::enqueue::hex(k), r.id, r.epoch + 1, state))
            })
            .collect();
        identities_free_written(&mut tx, &free).await?;
        tx.commit().await?;
        Ok(out)
    }

    /// Deletes up to `limit` identities of windows that have ended (`expires_at` passed):
    /// whatever task held one, its window is over. Returns the count.
    pub(crate) async fn unique_prune_expired(
        &self,
        conn: &mut MySqlConnection,
        limit: u32,
    ) -> sqlx::Result<u64> {
        let done = sqlx::query!(
            r#"DELETE FROM taskq_unique
               WHERE expires_at < UTC_TIMESTAMP(6)
               ORDER BY expires_at
               LIMIT ?"#,
            limit
        )
        .execute(&mut *conn)
        .await?;
        Ok(done.rows_affected())
    }

    /// Deletes up to `limit` tasks in terminal `state` that finished more than `age_secs` ago.
    pub(crate) async fn task_prune(
        &self,
        conn: &mut MySqlConnection,
        state: TaskState,
        age_secs: u64,
        limit: u32,
    ) -> sqlx::Result<u64> {
        let done = sqlx::query!(
            r#"DELETE FROM taskq_tasks
               WHERE state = ? AND finished_at < UTC_TIMESTAMP(6) - INTERVAL ? SECOND
               ORDER BY finished_at
               LIMIT ?"#,
            state.as_str(),
            age_secs,
            limit
        )
        .execute(&mut *conn)
        .await?;
        Ok(done.rows_affected())
    }

    /// The byte limits of this server's multi-row statements, from its `max_allowed_packet`
    /// (this session's: a server's global setting applies to connections opened after it).
    pub(crate) async fn statement_budget(
        &self,
        conn: &mut MySqlConnection,
    ) -> sqlx::Result<Budget> {
        let packet = sqlx::query_scalar!(
            r#"SELECT CAST(@@SESSION.max_allowed_packet AS UNSIGNED) AS "packet!: u64""#
        )
        .fetch_one(&mut *conn)
        .await?;
        Ok(Budget::for_packet(packet))
    }

    /// Current `(id, lease_epoch)` of the given ids (a JSON array); missing ids are absent.
    pub(crate) async fn task_epochs(
        &self,
        conn: &mut MySqlConnection,
        ids_json: &str,
    ) -> sqlx::Result<Vec<(u64, u64)>> {
        let rows = sqlx::query!(
            r#"SELECT t.id AS "id: u64", t.lease_epoch AS "lease_epoch: u64"
               FROM JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$')) AS j
                 STRAIGHT_JOIN taskq_tasks t FORCE INDEX (PRIMARY) ON t.id = j.id"#,
            ids_json
        )
        .fetch_all(&mut *conn)
        .await?;
        Ok(rows.into_iter().map(|r| (r.id, r.lease_epoch)).collect())
    }
}

/// The rows of a reap as the JSON its statements read: `[[id, epoch, canceled, park], ..]`
/// sorted by id (locked in ascending order), `canceled` 1 when the read saw a cancel request,
/// `park` 1 for a last attempt parked back to pending (see `ExpiredRow::parks`).
fn reap_json(rows: &[&ReapRow]) -> String {
    let mut out: Vec<(u64, u64, u8, u8)> = rows
        .iter()
        .map(|r| (r.id, r.epoch, u8::from(r.canceled), u8::from(r.parks)))
        .collect();
    out.sort_unstable();
    serde_json::to_string(&out).expect("reap rows serialize")
}

/// The `UPDATE` of [`Store::task_reap`], on the rows of `reap_json` (see [`reap_json`]).
///
/// A row is written only if its cancel request is as [`Store::task_expired`] read it: which
/// identity the reap frees (and whether it frees one at all) was decided from that read, so a
/// cancel request that landed in between (`Client::cancel` on a task whose lease had just
/// expired) would otherwise move the task to `canceled` with its identity still held. Such a
/// row is left running and expired for the next round, which reads the request.
async fn reap_rows(conn: &mut MySqlConnection, reap_json: &str) -> sqlx::Result<u64> {
    let done = sqlx::query!(
        r#"UPDATE JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$[0]',
                                               epoch BIGINT UNSIGNED PATH '$[1]',
                                               canceled INT PATH '$[2]',
                                               park INT PATH '$[3]')) AS j
             STRAIGHT_JOIN taskq_tasks t FORCE INDEX (PRIMARY) ON t.id = j.id AND t.lease_epoch = j.epoch
           SET t.attempts = JSON_ARRAY_APPEND(
                 IF(JSON_LENGTH(COALESCE(t.attempts, '[]')) >= 100, JSON_REMOVE(t.attempts, '$[0]'),
                    COALESCE(t.attempts, '[]')), '$',
                 JSON_OBJECT('attempt', t.attempt, 'epoch', t.lease_epoch, 'worker', t.worker_id,
                   'started_at', DATE_FORMAT(t.attempted_at, '%Y-%m-%d %H:%i:%s.%f'),
                   'finished_at', DATE_FORMAT(UTC_TIMESTAMP(6), '%Y-%m-%d %H:%i:%s.%f'),
                   'outcome', IF(t.cancel_requested_at IS NOT NULL, 'canceled', 'lease_lost'),
                   'error', CONCAT('lease expired (worker ', COALESCE(t.worker_id, '?'),
                                   ', attempt ', t.attempt, ')'))),
               t.last_error = CONCAT('lease expired (worker ', COALESCE(t.worker_id, '?'),
                                     ', attempt ', t.attempt, ')'),
               t.finished_at = IF((t.attempt >= t.max_attempts AND j.park = 0)
                                    OR t.cancel_requested_at IS NOT NULL, UTC_TIMESTAMP(6), NULL),
               t.state = IF(t.cancel_requested_at IS NOT NULL, 'canceled',
                            IF(t.attempt >= t.max_attempts AND j.park = 0, 'dead', 'pending')),
               t.lease_epoch = t.lease_epoch + 1, t.lease_until = NULL,
               t.updated_at = UTC_TIMESTAMP(6)
           WHERE t.state = 'running' AND t.lease_until < UTC_TIMESTAMP(6)
             AND (t.cancel_requested_at IS NOT NULL) = (j.canceled = 1)"#,
        reap_json
    )
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected())
}

/// Locks the rows of the leases `(id, epoch)` in `leases_json` (sorted by id) and returns the
/// ids of those still running with that epoch: the rows a write-back in the same transaction
/// writes.
async fn lock_running(conn: &mut MySqlConnection, leases_json: &str) -> sqlx::Result<Vec<u64>> {
    sqlx::query_scalar!(
        r#"SELECT t.id AS "id: u64"
           FROM JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$[0]',
                                             epoch BIGINT UNSIGNED PATH '$[1]')) AS j
             STRAIGHT_JOIN taskq_tasks t FORCE INDEX (PRIMARY) ON t.id = j.id AND t.lease_epoch = j.epoch
           WHERE t.state = 'running'
           FOR UPDATE"#,
        leases_json
    )
    .fetch_all(&mut *conn)
    .await
}

/// A row [`lock_expired`] locked.
struct LockedExpired {
    id: u64,
    epoch: u64,
    goes_dead: bool,
    canceled: bool,
}

/// Locks the rows of `reap_json` (see [`reap_json`]) and returns those still running with
/// that epoch, an expired lease and the cancel request as read, with where the reap sends
/// each: the rows [`reap_rows`] in the same transaction writes.
async fn lock_expired(
    conn: &mut MySqlConnection,
    reap_json: &str,
) -> sqlx::Result<Vec<LockedExpired>> {
    sqlx::query_as!(
        LockedExpired,
        r#"SELECT t.id AS "id: u64", t.lease_epoch AS "epoch: u64",
             (t.attempt >= t.max_attempts AND t.cancel_requested_at IS NULL AND j.park = 0)
               AS "goes_dead!: bool",
             (t.cancel_requested_at IS NOT NULL) AS "canceled!: bool"
           FROM JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$[0]',
                                             epoch BIGINT UNSIGNED PATH '$[1]',
                                             canceled INT PATH '$[2]',
                                             park INT PATH '$[3]')) AS j
             STRAIGHT_JOIN taskq_tasks t FORCE INDEX (PRIMARY) ON t.id = j.id AND t.lease_epoch = j.epoch
           WHERE t.state = 'running' AND t.lease_until < UTC_TIMESTAMP(6)
             AND (t.cancel_requested_at IS NOT NULL) = (j.canceled = 1)
           FOR UPDATE"#,
        reap_json
    )
    .fetch_all(&mut *conn)
    .await
}

/// Inserts follow-up tasks (one statement, none when `rows` is empty), pending and due now.
/// Each carries the idempotency key of the end it follows; one already there (which the
/// locking of the write-back makes impossible) is left as it is rather than failing the
/// write-back.
async fn follow_ups_insert(conn: &mut MySqlConnection, rows: &[&FollowUpRow]) -> sqlx::Result<u64> {
    if rows.is_empty() {
        return Ok(0);
    }
    let json = serde_json::to_string(rows).expect("follow-ups serialize");
    let done = sqlx::query!(
        r#"INSERT INTO taskq_tasks
            (queue, name, payload, state, priority, max_attempts, run_at, deadline,
             idempotency_key, trace_context, created_at, updated_at)
           SELECT j.queue, j.name, UNHEX(j.payload), 'pending', j.priority, j.max_attempts,
             UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL j.ttl_us MICROSECOND, j.k,
             j.trace_context, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6)
           FROM JSON_TABLE(?, '$[*]' COLUMNS (
                 ord FOR ORDINALITY,
                 queue VARCHAR(64) PATH '$.q',
                 name VARCHAR(255) PATH '$.n',
                 payload LONGTEXT PATH '$.p',
                 priority SMALLINT PATH '$.pr',
                 max_attempts INT UNSIGNED PATH '$.m',
                 ttl_us BIGINT PATH '$.tl',
                 k VARCHAR(255) PATH '$.k',
                 trace_context VARCHAR(512) PATH '$.t')) AS j
           ORDER BY j.ord
           ON DUPLICATE KEY UPDATE taskq_tasks.updated_at = taskq_tasks.updated_at"#,
        json
    )
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected())
}

/// The write-back statement of [`Store::task_write_back`]: one `UPDATE` for every outcome, each row
/// written only while running with the epoch its attempt claimed. An outcome with an empty
/// `outcome` appends no attempt-history entry, and one whose `attempt` is below the row's sets
/// it back (a parked task ended without running: see `Claimed::parked_error`).
async fn write_back_rows<'f>(
    conn: &mut MySqlConnection,
    batch: impl Iterator<Item = &'f WriteBack>,
) -> sqlx::Result<u64> {
    // Sorted by id, like `leases_json`, so batches lock rows in one global order.
    let mut sorted: Vec<&WriteBack> = batch.collect();
    if sorted.is_empty() {
        return Ok(0);
    }
    sorted.sort_unstable_by_key(|f| f.id);
    let json = serde_json::to_string(&sorted).expect("finish batch serializes");
    let done = sqlx::query!(
        r#"UPDATE JSON_TABLE(?, '$[*]' COLUMNS (
                 id BIGINT UNSIGNED PATH '$.id',
                 epoch BIGINT UNSIGNED PATH '$.epoch',
                 state VARCHAR(16) PATH '$.state',
                 attempt INT UNSIGNED PATH '$.attempt',
                 outcome VARCHAR(16) PATH '$.outcome',
                 delay_us BIGINT PATH '$.delay_us',
                 error TEXT CHARACTER SET utf8mb4 PATH '$.error')) AS j
             STRAIGHT_JOIN taskq_tasks t FORCE INDEX (PRIMARY) ON t.id = j.id AND t.lease_epoch = j.epoch
           SET t.attempts = IF(j.outcome = '', t.attempts, JSON_ARRAY_APPEND(
                 IF(JSON_LENGTH(COALESCE(t.attempts, '[]')) >= 100, JSON_REMOVE(t.attempts, '$[0]'),
                    COALESCE(t.attempts, '[]')), '$',
                 JSON_OBJECT('attempt', j.attempt, 'epoch', j.epoch, 'worker', t.worker_id,
                   'started_at', DATE_FORMAT(t.attempted_at, '%Y-%m-%d %H:%i:%s.%f'),
                   'finished_at', DATE_FORMAT(UTC_TIMESTAMP(6), '%Y-%m-%d %H:%i:%s.%f'),
                   'outcome', j.outcome,
                   'error', IF(CHAR_LENGTH(j.error) > 1024, CONCAT(LEFT(j.error, 1023), '…'), j.error)))),
               t.state = IF(j.state = 'snoozed', 'pending', j.state),
               t.run_at = IF(j.state IN ('pending', 'snoozed'),
                             UTC_TIMESTAMP(6) + INTERVAL j.delay_us MICROSECOND, t.run_at),
               t.finished_at = IF(j.state IN ('pending', 'snoozed'), NULL, UTC_TIMESTAMP(6)),
               t.attempt = IF(j.state = 'snoozed' AND t.attempt > 0, t.attempt - 1,
                              LEAST(t.attempt, j.attempt)),
               t.snoozes = IF(j.state = 'snoozed', t.snoozes + 1, t.snoozes),
               t.last_error = IF(j.error IS NULL, t.last_error, j.error),
               t.cancel_requested_at = IF(j.state IN ('succeeded', 'dead'), NULL, t.cancel_requested_at),
               t.lease_until = NULL,
               t.updated_at = UTC_TIMESTAMP(6)
           WHERE t.state = 'running'"#,
        json
    )
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected())
}

/// Per-connection setup of the worker's own pool: READ COMMITTED, so claim scans take no gap
/// locks that would make producers' inserts wait; row-lock waits end after `lock_wait_secs`
/// (the worker's statement deadline) instead of InnoDB's default 50 s; and the server closes
/// the session once it has been silent for `session_secs` (`wait_timeout` between statements,
/// in a transaction or not; `net_read_timeout` / `net_write_timeout` within one packet),
/// instead of 8 hours.
pub(crate) async fn session_setup(
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

/// How long a taken migration lock is valid without renewal: a migrator that died holding it
/// stops blocking others after this long. The holder renews it every third of this.
pub(crate) const MIGRATION_LOCK_SECS: u32 = 60;

/// Creates the migration lock's table if it is missing (it must exist before the first
/// migration runs; migration 13 records the same definition). DDL: on a Galera cluster it is
/// replicated in total order, so concurrent creators on different nodes do not conflict.
pub(crate) async fn migration_lock_table(conn: &mut MySqlConnection) -> sqlx::Result<()> {
    sqlx::query!(
        r#"CREATE TABLE IF NOT EXISTS taskq_migration_lock (
            id         TINYINT UNSIGNED NOT NULL,
            holder     VARCHAR(64)      NOT NULL,
            expires_at DATETIME(6)      NOT NULL,
            PRIMARY KEY (id)
        ) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin"#
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// Tries once to take the database-wide migration lock for `holder` (autocommit): removes a
/// lock whose holder let it expire, then inserts the lock row. Returns whether this call took
/// it. Another holder's row (a duplicate key), or a concurrent taker on another Galera node
/// (a certification failure, error 1213), means not taken. Unlike `GET_LOCK`, which each
/// server keeps to itself, the row is replicated, so this serializes migrators on every node
/// of a cluster.
pub(crate) async fn migration_lock_try(
    conn: &mut MySqlConnection,
    holder: &str,
) -> sqlx::Result<bool> {
    sqlx::query!("DELETE FROM taskq_migration_lock WHERE id = 1 AND expires_at < UTC_TIMESTAMP(6)")
        .execute(&mut *conn)
        .await?;
    let res = sqlx::query!(
        r#"INSERT INTO taskq_migration_lock (id, holder, expires_at)
           VALUES (1, ?, UTC_TIMESTAMP(6) + INTERVAL ? SECOND)"#,
        holder,
        MIGRATION_LOCK_SECS
    )
    .execute(&mut *conn)
    .await;
    match res {
        Ok(_) => Ok(true),
        Err(sqlx::Error::Database(e)) if is_conflict_on(&*e, "") || is_deadlock(&*e) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Extends `holder`'s migration lock by [`MIGRATION_LOCK_SECS`]; returns whether it still held it.
pub(crate) async fn migration_lock_renew(pool: &MySqlPool, holder: &str) -> sqlx::Result<bool> {
    let done = sqlx::query!(
        r#"UPDATE taskq_migration_lock SET expires_at = UTC_TIMESTAMP(6) + INTERVAL ? SECOND
           WHERE id = 1 AND holder = ?"#,
        MIGRATION_LOCK_SECS,
        holder
    )
    .execute(pool)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Releases `holder`'s migration lock.
pub(crate) async fn migration_unlock(conn: &mut MySqlConnection, holder: &str) -> sqlx::Result<()> {
    sqlx::query!(
        "DELETE FROM taskq_migration_lock WHERE id = 1 AND holder = ?",
        holder
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// Whether `e` says a packet was too large: ER_NET_PACKET_TOO_LARGE (1153, the statement
/// exceeds `max_allowed_packet`), ER_WARN_ALLOWED_PACKET_OVERFLOWED (1301, a function's result
/// would), CR_NET_PACKET_TOO_LARGE (2020).
pub(crate) fn is_packet_too_large(e: &dyn sqlx::error::DatabaseError) -> bool {
    let mysql = e.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>();
    mysql.is_some_and(|m| matches!(m.number(), 1153 | 1301 | 2020))
}

/// Whether `e` is ER_LOCK_DEADLOCK (1213): an InnoDB deadlock victim, or on a Galera cluster a
/// transaction that failed certification or was aborted by a replicated one (brute-force
/// abort). The transaction was rolled back; running it again is safe.
pub(crate) fn is_deadlock(e: &dyn sqlx::error::DatabaseError) -> bool {
    let mysql = e.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>();
    mysql.is_some_and(|m| m.number() == ER_LOCK_DEADLOCK)
}

// --- operator functions (CLI) ---

impl Store {
    /// The database clock (`UTC_TIMESTAMP(6)`), against which every stored time is written.
    pub(crate) async fn db_now(&self) -> sqlx::Result<DateTime<Utc>> {
        sqlx::query_scalar!(r#"SELECT UTC_TIMESTAMP(6) AS "now!: DateTime<Utc>""#)
            .fetch_one(&self.pool)
            .await
    }

    /// The database clock, read on `conn`.
    pub(crate) async fn db_now_on(
        &self,
        conn: &mut MySqlConnection,
    ) -> sqlx::Result<DateTime<Utc>> {
        sqlx::query_scalar!(r#"SELECT UTC_TIMESTAMP(6) AS "now!: DateTime<Utc>""#)
            .fetch_one(&mut *conn)
            .await
    }

    /// Moves up to `limit` dead tasks that take no identity back (not unique, or windowed; of
    /// `queue`, or of every queue) that died at or before `died_before` back to pending, with attempts reset and epochs
    /// incremented, like [`task_retry_dead`]. Walks `ix_taskq_finished`; the `died_before` bound
    /// keeps a bulk retry from picking up tasks that die again while it runs. Returns the count.
    /// (Unique tasks go one by one, see [`Store::task_dead_unique_ids`]: one identity taken
    /// meanwhile must not fail the whole statement.)
    pub(crate) async fn task_retry_dead_batch(
        &self,
        queue: Option<&str>,
        died_before: DateTime<Utc>,
        limit: u32,
    ) -> sqlx::Result<u64> {
        let done = sqlx::query!(
            r#"UPDATE taskq_tasks
               SET state = 'pending', attempt = 0, lease_epoch = lease_epoch + 1, run_at = UTC_TIMESTAMP(6),
                   finished_at = NULL, lease_until = NULL, updated_at = UTC_TIMESTAMP(6)
               WHERE state = 'dead' AND (finished_at IS NULL OR finished_at <= ?)
                 AND (? IS NULL OR queue = ?) AND (unique_key IS NULL OR unique_while = 'window')
               ORDER BY finished_at, id
               LIMIT ?"#,
            died_before.naive_utc(),
            queue,
            queue,
            limit
        )
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }

    /// Up to `limit` ids above `after_id` of dead tasks unique while pending or running (of
    /// `queue`, or of every queue) that died at or before `died_before`, ascending.
    pub(crate) async fn task_dead_unique_ids(
        &self,
        queue: Option<&str>,
        died_before: DateTime<Utc>,
        after_id: u64,
        limit: u32,
    ) -> sqlx::Result<Vec<TaskId>> {
        sqlx::query_scalar!(
            r#"SELECT id AS "id: TaskId" FROM taskq_tasks
               WHERE state = 'dead' AND (finished_at IS NULL OR finished_at <= ?)
                 AND (? IS NULL OR queue = ?) AND unique_key IS NOT NULL AND unique_while <> 'window'
                 AND id > ?
               ORDER BY id
               LIMIT ?"#,
            died_before.naive_utc(),
            queue,
            queue,
            after_id,
            limit
        )
        .fetch_all(&self.pool)
        .await
    }
}

// --- queue controls ---

impl Store {
    /// Pauses `queue` (idempotent: an already paused queue keeps its first pause time).
    pub(crate) async fn queue_pause(
        &self,
        conn: &mut MySqlConnection,
        queue: &str,
    ) -> sqlx::Result<()> {
        sqlx::query!(
            r#"INSERT INTO taskq_queues (queue, paused_at, updated_at)
               VALUES (?, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))
               ON DUPLICATE KEY UPDATE paused_at = COALESCE(paused_at, UTC_TIMESTAMP(6)),
                                       updated_at = UTC_TIMESTAMP(6)"#,
            queue
        )
        .execute(&mut *conn)
        .await?;
        Ok(())
    }

    /// Resumes `queue`; returns whether it was paused.
    pub(crate) async fn queue_resume(
        &self,
        conn: &mut MySqlConnection,
        queue: &str,
    ) -> sqlx::Result<bool> {
        let done = sqlx::query!(
            r#"UPDATE taskq_queues SET paused_at = NULL, updated_at = UTC_TIMESTAMP(6)
               WHERE queue = ? AND paused_at IS NOT NULL"#,
            queue
        )
        .execute(&mut *conn)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Paused queues with the time they were paused.
    pub(crate) async fn queues_paused(
        &self,
        conn: &mut MySqlConnection,
    ) -> sqlx::Result<Vec<(String, DateTime<Utc>)>> {
        let rows = sqlx::query!(
            r#"SELECT queue, paused_at AS "paused_at!: DateTime<Utc>"
               FROM taskq_queues WHERE paused_at IS NOT NULL ORDER BY queue"#
        )
        .fetch_all(&mut *conn)
        .await?;
        Ok(rows.into_iter().map(|r| (r.queue, r.paused_at)).collect())
    }

    /// What a worker needs to know about its queues, in one read per refresh: the queues that
    /// are paused, and those with a concurrency or rate limit (whose claims take the limited
    /// path of [`Store::task_claim`]).
    pub(crate) async fn queue_controls(
        &self,
        conn: &mut MySqlConnection,
    ) -> sqlx::Result<Vec<QueueControl>> {
        sqlx::query_as!(
            QueueControl,
            r#"SELECT queue, paused_at IS NOT NULL AS "paused!: bool",
                 (concurrency_limit IS NOT NULL OR rate_limit IS NOT NULL) AS "limited!: bool"
               FROM taskq_queues
               WHERE paused_at IS NOT NULL OR concurrency_limit IS NOT NULL OR rate_limit IS NOT NULL"#
        )
        .fetch_all(&mut *conn)
        .await
    }

    /// Sets (or, with `None`, clears) the concurrency limit of `queue`. Clearing a queue that
    /// has no row writes nothing.
    pub(crate) async fn queue_set_limit(
        &self,
        queue: &str,
        limit: Option<u32>,
    ) -> sqlx::Result<()> {
        match limit {
            Some(n) => {
                sqlx::query!(
                    r#"INSERT INTO taskq_queues (queue, concurrency_limit, updated_at)
                       VALUES (?, ?, UTC_TIMESTAMP(6))
                       ON DUPLICATE KEY UPDATE concurrency_limit = ?, updated_at = UTC_TIMESTAMP(6)"#,
                    queue,
                    n,
                    n
                )
                .execute(&self.pool)
                .await?;
            }
            None => {
                sqlx::query!(
                    r#"UPDATE taskq_queues SET concurrency_limit = NULL, updated_at = UTC_TIMESTAMP(6)
                       WHERE queue = ?"#,
                    queue
                )
                .execute(&self.pool)
                .await?;
            }
        }
        Ok(())
    }

    /// Sets (or, with `None`, clears) the rate limit of `queue`: `max` claims per window of
    /// `period_us`. The current window's count is kept (it restarts when the period changes,
    /// since the windows move). Clearing a queue that has no row writes nothing.
    pub(crate) async fn queue_set_rate_limit(
        &self,
        queue: &str,
        rate: Option<(u32, i64)>,
    ) -> sqlx::Result<()> {
        match rate {
            Some((max, period_us)) => {
                sqlx::query!(
                    r#"INSERT INTO taskq_queues (queue, rate_limit, rate_period_us, updated_at)
                       VALUES (?, ?, ?, UTC_TIMESTAMP(6))
                       ON DUPLICATE KEY UPDATE rate_limit = ?, rate_period_us = ?,
                                               updated_at = UTC_TIMESTAMP(6)"#,
                    queue,
                    max,
                    period_us,
                    max,
                    period_us
                )
                .execute(&self.pool)
                .await?;
            }
            None => {
                sqlx::query!(
                    r#"UPDATE taskq_queues
                       SET rate_limit = NULL, rate_period_us = NULL, rate_window_start = NULL,
                           rate_window_count = 0, updated_at = UTC_TIMESTAMP(6)
                       WHERE queue = ?"#,
                    queue
                )
                .execute(&self.pool)
                .await?;
            }
        }
        Ok(())
    }

    /// Every queue that has tasks pending or running, or a row in `taskq_queues` (paused or
    /// limited, now or before), by name, with its controls and its pending and running
    /// counts. Two statements: the controls, and one covering read of `ix_taskq_claim`'s
    /// pending and running ranges.
    pub(crate) async fn queue_list(&self) -> sqlx::Result<Vec<QueueRow>> {
        let mut conn = self.pool.acquire().await?;
        let controls = sqlx::query!(
            r#"SELECT queue, paused_at AS "paused_at: DateTime<Utc>",
                 concurrency_limit AS "concurrency_limit: u32",
                 rate_limit AS "rate_limit: u32", rate_period_us,
                 CAST(IF(rate_window_start = CAST('1970-01-01' AS DATETIME(6))
                           + INTERVAL (TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6))
                                       DIV rate_period_us * rate_period_us) MICROSECOND,
                         rate_window_count, 0) AS SIGNED) AS "rate_used!: i64"
               FROM taskq_queues ORDER BY queue"#
        )
        .fetch_all(&mut *conn)
        .await?;
        let counts = sqlx::query!(
            r#"SELECT queue, CAST(SUM(state = 'pending') AS SIGNED) AS "pending!: i64",
                 CAST(SUM(state = 'running') AS SIGNED) AS "running!: i64"
               FROM taskq_tasks FORCE INDEX (ix_taskq_claim) WHERE state IN ('pending', 'running')
               GROUP BY queue ORDER BY queue"#
        )
        .fetch_all(&mut *conn)
        .await?;
        let mut out: Vec<QueueRow> = controls
            .into_iter()
            .map(|c| QueueRow {
                queue: c.queue,
                paused_at: c.paused_at,
                concurrency_limit: c.concurrency_limit,
                rate: c.rate_limit.zip(c.rate_period_us.filter(|&p| p > 0)),
                rate_used: c.rate_used.max(0) as u64,
                pending: 0,
                running: 0,
            })
            .collect();
        for c in counts {
            let i = match out.binary_search_by(|r| r.queue.as_str().cmp(&c.queue)) {
                Ok(i) => i,
                Err(i) => {
                    out.insert(
                        i,
                        QueueRow {
                            queue: c.queue,
                            paused_at: None,
                            concurrency_limit: None,
                            rate: None,
                            rate_used: 0,
                            pending: 0,
                            running: 0,
                        },
                    );
                    i
                }
            };
            out[i].pending = c.pending.max(0) as u64;
            out[i].running = c.running.max(0) as u64;
        }
        Ok(out)
    }
}

// --- batch enqueue ---

/// How the server numbers the rows of one multi-row insert.
pub(crate) struct AutoIncrement {
    /// `innodb_autoinc_lock_mode`: 0 or 1 guarantee consecutive ids within one statement;
    /// 2 (MySQL 8's default) may interleave them with concurrent inserts.
    pub lock_mode: i64,
    /// `auto_increment_increment` of this session (the step between consecutive ids).
    pub increment: i64,
    /// `max_allowed_packet` of this session: what bounds one batch insert (see [`Budget`]).
    pub max_packet: u64,
}

/// Reads the auto-increment settings that decide whether a multi-row insert's ids can be
/// derived from `LAST_INSERT_ID()`, and the packet size that bounds the insert.
pub(crate) async fn autoinc_settings(conn: &mut MySqlConnection) -> sqlx::Result<AutoIncrement> {
    let row = sqlx::query!(
        r#"SELECT CAST(@@GLOBAL.innodb_autoinc_lock_mode AS SIGNED) AS "lock_mode: i64",
                  CAST(@@SESSION.auto_increment_increment AS SIGNED) AS "increment: i64",
                  CAST(@@SESSION.max_allowed_packet AS UNSIGNED) AS "max_packet: u64""#
    )
    .fetch_one(&mut *conn)
    .await?;
    Ok(AutoIncrement {
        lock_mode: row.lock_mode.unwrap_or(2),
        increment: row.increment.unwrap_or(1).max(1),
        max_packet: row.max_packet.unwrap_or(16 << 20),
    })
}

/// One row of a batch insert, as [`task_insert_batch`] sends it inside a JSON array.
#[derive(Serialize)]
struct BatchRow<'a> {
    #[serde(rename = "q")]
    pub queue: &'a str,
    #[serde(rename = "n")]
    pub name: &'a str,
    /// The payload bytes, hex-encoded (decoded by `UNHEX`, so any bytes round-trip exactly).
    #[serde(rename = "p")]
    pub payload_hex: String,
    #[serde(rename = "pr")]
    pub priority: i16,
    #[serde(rename = "m")]
    pub max_attempts: u32,
    /// Microseconds from the database's now; ignored when `run_at` is set.
    #[serde(rename = "d")]
    pub delay_us: i64,
    /// `YYYY-MM-DD HH:MM:SS.ffffff` (UTC); absent means "now + delay".
    #[serde(rename = "r", skip_serializing_if = "Option::is_none")]
    pub run_at: Option<String>,
    /// Absolute deadline, `YYYY-MM-DD HH:MM:SS.ffffff` (UTC); absent means none or `ttl_us`.
    #[serde(rename = "dl", skip_serializing_if = "Option::is_none")]
    pub deadline: Option<String>,
    /// Deadline as microseconds from the database's now; absent means none or `deadline`.
    #[serde(rename = "tl", skip_serializing_if = "Option::is_none")]
    pub ttl_us: Option<i64>,
    #[serde(rename = "t", skip_serializing_if = "Option::is_none")]
    pub trace_context: Option<&'a str>,
}

/// Most rows one batch `INSERT` carries; larger inputs are split into several statements
/// (also by bytes, see [`Budget`]).
const BATCH_ROWS: usize = 5_000;

/// `YYYY-MM-DD HH:MM:SS.ffffff` (UTC), as `JSON_TABLE` reads a `DATETIME(6)`.
fn datetime_text(d: DateTime<Utc>) -> String {
    d.naive_utc().format("%Y-%m-%d %H:%M:%S%.6f").to_string()
}

/// Inserts rows without idempotency key or unique identity (the unkeyed runs of
/// `enqueue_many`), [`BATCH_ROWS`] per statement at most and within the server's [`Budget`],
/// and returns their ids in order.
/// When the server's auto-increment settings make a multi-row insert's ids consecutive
/// (`innodb_autoinc_lock_mode` 0 or 1) they are derived from the first; otherwise (mode 2,
/// MySQL 8's default and Galera's requirement) the rows carry a random marker in
/// `enqueue_batch` and are read back by it.
pub(crate) async fn task_insert_rows(
    conn: &mut MySqlConnection,
    rows: &[NewTask<'_>],
) -> sqlx::Result<Vec<TaskId>> {
    let mut out = Vec::with_capacity(rows.len());
    if rows.is_empty() {
        return Ok(out);
    }
    let ai = autoinc_settings(conn).await?;
    let step = (ai.lock_mode <= 1).then_some(ai.increment as u64);
    let json_rows = rows
        .iter()
        .map(|r| {
            serde_json::to_string(&BatchRow {
                queue: r.queue,
                name: r.name,
                payload_hex: crate::enqueue::hex(r.payload),
                priority: r.priority,
                max_attempts: r.max_attempts,
                delay_us: r.delay_us,
                run_at: r.run_at.map(datetime_text),
                deadline: r.deadline.map(datetime_text),
                ttl_us: r.ttl_us,
                trace_context: r.trace_context,
            })
            .map_err(|e| sqlx::Error::Encode(e.into()))
        })
        .collect::<sqlx::Result<Vec<String>>>()?;
    let chunks =
        Budget::for_packet(ai.max_packet).chunks(json_rows.iter().map(|j| j.len() + 1), BATCH_ROWS);
    let mut i = 0;
    for len in chunks {
        let start = i;
        i += len;
        let json = format!("[{}]", json_rows[start..i].join(","));
        let n = (i - start) as u64;
        // Without consecutive ids the rows carry a marker to be read back by.
        let marker = step.is_none().then(|| fastrand::u64(1..));
        let (first, inserted) = task_insert_batch(conn, &json, marker).await?;
        let mismatch =
            |what: String| sqlx::Error::Protocol(format!("batch enqueue of {n} tasks: {what}"));
        if inserted != n || first == 0 {
            return Err(mismatch(format!(
                "inserted {inserted} rows (first id {first})"
            )));
        }
        match (step, marker) {
            (Some(step), _) => out.extend((0..n).map(|k| TaskId(first + k * step))),
            (None, Some(marker)) => {
                let ids = task_batch_ids(conn, first, marker, n).await?;
                if ids.len() as u64 != n || ids[0] != first {
                    return Err(mismatch(format!(
                        "read back {} ids (first {:?}, expected {first})",
                        ids.len(),
                        ids.first()
                    )));
                }
                out.extend(ids.into_iter().map(TaskId));
            }
            (None, None) => unreachable!("a marker whenever ids are not consecutive"),
        }
    }
    Ok(out)
}

/// Inserts every row of `rows_json` (a JSON array of [`BatchRow`]) in one statement, in array
/// order, with no idempotency key, each row marked with `batch` (`enqueue_batch`). Returns
/// `(first id, rows inserted)`. The ids of the other rows can be derived when
/// [`autoinc_settings`] says they are consecutive; otherwise [`task_batch_ids`] reads them back.
pub(crate) async fn task_insert_batch(
    conn: &mut MySqlConnection,
    rows_json: &str,
    batch: Option<u64>,
) -> sqlx::Result<(u64, u64)> {
    let done = sqlx::query!(
        r#"INSERT INTO taskq_tasks
            (queue, name, payload, state, priority, max_attempts, run_at, deadline,
             idempotency_key, trace_context, enqueue_batch, created_at, updated_at)
           SELECT j.queue, j.name, UNHEX(j.payload), 'pending', j.priority, j.max_attempts,
             COALESCE(j.run_at, UTC_TIMESTAMP(6) + INTERVAL j.delay_us MICROSECOND),
             COALESCE(j.deadline, UTC_TIMESTAMP(6) + INTERVAL j.ttl_us MICROSECOND), NULL,
             j.trace_context, ?, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6)
           FROM JSON_TABLE(?, '$[*]' COLUMNS (
                 ord FOR ORDINALITY,
                 queue VARCHAR(64) PATH '$.q',
                 name VARCHAR(255) PATH '$.n',
                 payload LONGTEXT PATH '$.p',
                 priority SMALLINT PATH '$.pr',
                 max_attempts INT UNSIGNED PATH '$.m',
                 delay_us BIGINT PATH '$.d',
                 run_at DATETIME(6) PATH '$.r',
                 deadline DATETIME(6) PATH '$.dl',
                 ttl_us BIGINT PATH '$.tl',
                 trace_context VARCHAR(512) PATH '$.t')) AS j
           ORDER BY j.ord"#,
        batch,
        rows_json
    )
    .execute(&mut *conn)
    .await?;
    Ok((done.last_insert_id(), done.rows_affected()))
}

/// The ids of the `n` rows one [`task_insert_batch`] statement inserted with marker `batch`,
/// ascending (which is input order: the statement inserts in array order, and each row takes
/// the next value of the auto-increment counter, even when other statements' values fall in
/// between). Read on the inserting connection, which sees its own uncommitted rows; a
/// primary-key range scan from the statement's first id that stops after `n` matches, so it
/// walks only this batch's ids and those other inserts took in between.
pub(crate) async fn task_batch_ids(
    conn: &mut MySqlConnection,
    first: u64,
    batch: u64,
    n: u64,
) -> sqlx::Result<Vec<u64>> {
    sqlx::query_scalar!(
        r#"SELECT id AS "id: u64" FROM taskq_tasks FORCE INDEX (PRIMARY)
           WHERE id >= ? AND enqueue_batch = ? ORDER BY id LIMIT ?"#,
        first,
        batch,
        n
    )
    .fetch_all(&mut *conn)
    .await
}

// --- recurring schedules ---

impl Store {
    /// Creates or updates a schedule's row with this worker's definition. A new row, or one
    /// whose expression or time zone differs, gets `watermark = now` (so ticks before this
    /// deploy never fire) and the given `next_tick`; an unchanged one keeps its watermark.
    /// The assignments run in order and read the old row until they overwrite a column, so
    /// `watermark` and `next_tick` compare against the old expression and time zone.
    pub(crate) async fn schedule_declare(
        &self,
        conn: &mut MySqlConnection,
        d: &ScheduleDecl<'_>,
    ) -> sqlx::Result<()> {
        let next_tick = d.next_tick.map(|t| t.naive_utc());
        sqlx::query!(
            r#"INSERT INTO taskq_schedules
                 (name, task_name, queue, expression, timezone, missed_ticks, watermark, next_tick,
                  declared_at, created_at, updated_at)
               VALUES (?, ?, ?, ?, ?, ?, UTC_TIMESTAMP(6), ?,
                  UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))
               ON DUPLICATE KEY UPDATE
                 watermark = IF(expression = ? AND timezone = ?, watermark,
                                GREATEST(watermark, UTC_TIMESTAMP(6))),
                 next_tick = IF(expression = ? AND timezone = ?, next_tick, ?),
                 expression = ?, timezone = ?, task_name = ?, queue = ?, missed_ticks = ?,
                 declared_at = UTC_TIMESTAMP(6), updated_at = UTC_TIMESTAMP(6)"#,
            d.name,
            d.task_name,
            d.queue,
            d.expression,
            d.timezone,
            d.missed_ticks,
            next_tick,
            d.expression,
            d.timezone,
            d.expression,
            d.timezone,
            next_tick,
            d.expression,
            d.timezone,
            d.task_name,
            d.queue,
            d.missed_ticks,
        )
        .execute(&mut *conn)
        .await?;
        Ok(())
    }

    /// The database clock and the rows of the schedules named in `names_json` (a JSON array
    /// of strings): one plain read of the (small) schedules table.
    pub(crate) async fn schedule_states(
        &self,
        conn: &mut MySqlConnection,
        names_json: &str,
    ) -> sqlx::Result<Vec<ScheduleState>> {
        sqlx::query_as!(
            ScheduleState,
            r#"SELECT UTC_TIMESTAMP(6) AS "now!: DateTime<Utc>", name, expression, timezone,
                 watermark AS "watermark: DateTime<Utc>"
               FROM taskq_schedules
               WHERE JSON_CONTAINS(?, JSON_QUOTE(name))"#,
            names_json
        )
        .fetch_all(&mut *conn)
        .await
    }

    /// One step of a schedule, in one transaction: moves the watermark from `old_watermark`
    /// to `new_watermark` — only if the row still has `old_watermark` and this worker's
    /// expression and time zone — and inserts the tasks of the ticks in between. Returns the
    /// task ids, or `None` when the compare-and-set found the row changed (another worker took
    /// the step, or declared another definition): then nothing is written.
    ///
    /// Workers that race for the same step queue on the row lock of the `UPDATE`; the first
    /// moves the watermark, the others re-read the committed row and match nothing. So each
    /// tick is enqueued once however many workers run, and an old tick never fires again even
    /// after retention deleted its task (the idempotency key `cron:<name>:<tick>` guards the
    /// row as well while it is kept).
    pub(crate) async fn schedule_fire(
        &self,
        conn: &mut MySqlConnection,
        f: &ScheduleFire<'_>,
    ) -> sqlx::Result<Option<Vec<TaskId>>> {
        let mut tx = conn.begin().await?;
        let last_tick = f.tasks.last().and_then(|t| t.run_at).map(|t| t.naive_utc());
        let worker_id = (!f.tasks.is_empty()).then_some(f.worker_id);
        let moved = sqlx::query!(
            r#"UPDATE taskq_schedules
               SET watermark = ?, next_tick = ?, last_tick = COALESCE(?, last_tick),
                   last_worker_id = COALESCE(?, last_worker_id), updated_at = UTC_TIMESTAMP(6)
               WHERE name = ? AND watermark = ? AND expression = ? AND timezone = ?"#,
            f.new_watermark.naive_utc(),
            f.next_tick.map(|t| t.naive_utc()),
            last_tick,
            worker_id,
            f.name,
            f.old_watermark.naive_utc(),
            f.expression,
            f.timezone,
        )
        .execute(&mut *tx)
        .await?;
        if moved.rows_affected() != 1 {
            tx.rollback().await?;
            return Ok(None);
        }
        let mut ids = Vec::with_capacity(f.tasks.len());
        for t in &f.tasks {
            ids.push(match task_insert(&mut tx, t).await? {
                Inserted::New(id) | Inserted::Duplicate(id) => id,
            });
        }
        tx.commit().await?;
        Ok(Some(ids))
    }

    /// Every schedule row, by name.
    pub(crate) async fn schedule_list(&self) -> sqlx::Result<Vec<ScheduleInfo>> {
        sqlx::query_as!(
            ScheduleInfo,
            r#"SELECT name, task_name, queue, expression, timezone, missed_ticks,
                 watermark AS "watermark: DateTime<Utc>", last_tick AS "last_tick: DateTime<Utc>",
                 last_worker_id, next_tick AS "next_tick: DateTime<Utc>",
                 declared_at AS "declared_at: DateTime<Utc>", created_at AS "created_at: DateTime<Utc>",
                 updated_at AS "updated_at: DateTime<Utc>"
               FROM taskq_schedules ORDER BY name"#
        )
        .fetch_all(&self.pool)
        .await
    }

    /// Deletes a schedule's row; returns whether it existed.
    pub(crate) async fn schedule_delete(
        &self,
        conn: &mut MySqlConnection,
        name: &str,
    ) -> sqlx::Result<bool> {
        let done = sqlx::query!("DELETE FROM taskq_schedules WHERE name = ?", name)
            .execute(&mut *conn)
            .await?;
        Ok(done.rows_affected() == 1)
    }
}

// --- live workers ---

impl Store {
    /// Records a starting worker: inserts its row, or (a worker id used again) overwrites it
    /// with `started_at = last_seen_at = now` and `stopped_at = NULL`.
    pub(crate) async fn worker_start(
        &self,
        conn: &mut MySqlConnection,
        w: &WorkerRow<'_>,
    ) -> sqlx::Result<()> {
        sqlx::query!(
            r#"INSERT INTO taskq_workers (worker_id, host, pid, queues, concurrency, lease_us,
                 heartbeat_us, names, started_at, last_seen_at, stopped_at)
               VALUES (?, ?, ?, ?, ?, ?, ?, ?, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), NULL)
               ON DUPLICATE KEY UPDATE host = ?, pid = ?, queues = ?, concurrency = ?,
                 lease_us = ?, heartbeat_us = ?, names = ?,
                 started_at = UTC_TIMESTAMP(6), last_seen_at = UTC_TIMESTAMP(6), stopped_at = NULL"#,
            w.worker_id,
            w.host,
            w.pid,
            w.queues_json,
            w.concurrency,
            w.lease_us,
            w.heartbeat_us,
            w.names_json,
            w.host,
            w.pid,
            w.queues_json,
            w.concurrency,
            w.lease_us,
            w.heartbeat_us,
            w.names_json,
        )
        .execute(&mut *conn)
        .await?;
        Ok(())
    }

    /// A running worker's beat: `last_seen_at = now` (one primary-key upsert). The row is
    /// inserted again if it is missing (the start's insert failed, or cleanup deleted it
    /// during a long partition); a row marked stopped is left alone (a beat that was under way
    /// at shutdown must not bring its worker back to life).
    pub(crate) async fn worker_seen(
        &self,
        conn: &mut MySqlConnection,
        w: &WorkerRow<'_>,
    ) -> sqlx::Result<()> {
        sqlx::query!(
            r#"INSERT INTO taskq_workers (worker_id, host, pid, queues, concurrency, lease_us,
                 heartbeat_us, names, started_at, last_seen_at, stopped_at)
               VALUES (?, ?, ?, ?, ?, ?, ?, ?, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), NULL)
               ON DUPLICATE KEY UPDATE
                 last_seen_at = IF(stopped_at IS NULL, UTC_TIMESTAMP(6), last_seen_at)"#,
            w.worker_id,
            w.host,
            w.pid,
            w.queues_json,
            w.concurrency,
            w.lease_us,
            w.heartbeat_us,
            w.names_json,
        )
        .execute(&mut *conn)
        .await?;
        Ok(())
    }

    /// Marks a worker stopped (graceful shutdown): `stopped_at = last_seen_at = now`.
    pub(crate) async fn worker_stop(
        &self,
        conn: &mut MySqlConnection,
        worker_id: &str,
    ) -> sqlx::Result<bool> {
        let done = sqlx::query!(
            r#"UPDATE taskq_workers SET stopped_at = UTC_TIMESTAMP(6), last_seen_at = UTC_TIMESTAMP(6)
               WHERE worker_id = ?"#,
            worker_id
        )
        .execute(&mut *conn)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Deletes up to `limit` rows of workers not seen for `age_secs` (stopped or gone).
    pub(crate) async fn worker_prune(
        &self,
        conn: &mut MySqlConnection,
        age_secs: u64,
        limit: u32,
    ) -> sqlx::Result<u64> {
        let done = sqlx::query!(
            r#"DELETE FROM taskq_workers
               WHERE last_seen_at < UTC_TIMESTAMP(6) - INTERVAL ? SECOND
               ORDER BY last_seen_at
               LIMIT ?"#,
            age_secs,
            limit
        )
        .execute(&mut *conn)
        .await?;
        Ok(done.rows_affected())
    }

    /// Every worker row, oldest start first, with how long ago it was seen and whether it is
    /// alive (not stopped, seen within two of its heartbeat intervals and at least 1 s, on the
    /// database clock), and how many running tasks carry its id (one `GROUP BY` over the
    /// running rows, read through `ix_taskq_lease`).
    pub(crate) async fn worker_list(
        &self,
        conn: &mut MySqlConnection,
    ) -> sqlx::Result<Vec<WorkerListRow>> {
        sqlx::query_as!(
            WorkerListRow,
            r#"SELECT w.worker_id, w.host, w.pid AS "pid: u32", w.queues,
                 w.concurrency AS "concurrency: u32", w.lease_us AS "lease_us: u64",
                 w.heartbeat_us AS "heartbeat_us: u64",
                 w.started_at AS "started_at: DateTime<Utc>",
                 w.last_seen_at AS "last_seen_at: DateTime<Utc>",
                 w.stopped_at AS "stopped_at: DateTime<Utc>",
                 w.names,
                 CAST(TIMESTAMPDIFF(MICROSECOND, w.last_seen_at, UTC_TIMESTAMP(6)) AS SIGNED)
                   AS "seen_ago_us!: i64",
                 (w.stopped_at IS NULL
                  AND w.last_seen_at >= UTC_TIMESTAMP(6)
                        - INTERVAL GREATEST(2 * w.heartbeat_us, 1000000) MICROSECOND)
                   AS "alive!: bool",
                 CAST(COALESCE(r.running, 0) AS SIGNED) AS "running!: i64"
               FROM taskq_workers w
                 LEFT JOIN (SELECT worker_id, COUNT(*) AS running FROM taskq_tasks
                            WHERE state = 'running' GROUP BY worker_id) r
                   ON r.worker_id = w.worker_id
               ORDER BY w.started_at, w.worker_id"#
        )
        .fetch_all(&mut *conn)
        .await
    }
}

// --- attempt history and audit trail ---

/// Inserts an audit row on `conn` (normally the transaction of the action it records), at the
/// database clock. One statement: the task's queue is read by primary key inside it.
pub(crate) async fn audit_insert(
    conn: &mut MySqlConnection,
    a: &AuditRow<'_>,
) -> sqlx::Result<u64> {
    let done = sqlx::query!(
        r#"INSERT INTO taskq_audit (at, actor, action, task_id, queue, detail)
           VALUES (UTC_TIMESTAMP(6), ?, ?, ?,
                   COALESCE(?, (SELECT t.queue FROM taskq_tasks t WHERE t.id = ?)), ?)"#,
        a.actor,
        a.action,
        a.task_id,
        a.queue,
        a.task_id,
        a.detail,
    )
    .execute(&mut *conn)
    .await?;
    Ok(done.last_insert_id())
}

impl Store {
    /// A task's attempt history (the JSON array, `None` when empty); `None` when the task
    /// does not exist.
    pub(crate) async fn task_attempts(&self, id: TaskId) -> sqlx::Result<Option<Option<String>>> {
        let row = sqlx::query!(r#"SELECT attempts FROM taskq_tasks WHERE id = ?"#, id.0)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|r| r.attempts))
    }

    /// Audit rows with `id < before_id`, of `task_id` and of `queue` when given, newest first.
    pub(crate) async fn audit_list(
        &self,
        task_id: Option<u64>,
        queue: Option<&str>,
        before_id: u64,
        limit: u32,
    ) -> sqlx::Result<Vec<AuditListRow>> {
        sqlx::query_as!(
            AuditListRow,
            r#"SELECT id AS "id: u64", at AS "at: DateTime<Utc>", actor, action,
                 task_id AS "task_id: u64", queue, detail
               FROM taskq_audit
               WHERE id < ? AND (? IS NULL OR task_id = ?) AND (? IS NULL OR queue = ?)
               ORDER BY id DESC
               LIMIT ?"#,
            before_id,
            task_id,
            task_id,
            queue,
            queue,
            limit
        )
        .fetch_all(&self.pool)
        .await
    }

    /// Deletes up to `limit` audit rows older than `age_secs` (database clock).
    pub(crate) async fn audit_prune(
        &self,
        conn: &mut MySqlConnection,
        age_secs: u64,
        limit: u32,
    ) -> sqlx::Result<u64> {
        let done = sqlx::query!(
            r#"DELETE FROM taskq_audit
               WHERE at < UTC_TIMESTAMP(6) - INTERVAL ? SECOND
               ORDER BY at
               LIMIT ?"#,
            age_secs,
            limit
        )
        .execute(&mut *conn)
        .await?;
        Ok(done.rows_affected())
    }
}

/// Whether a database (schema) named `name` exists on the server of `conn`.
pub(crate) async fn database_exists(conn: &mut MySqlConnection, name: &str) -> sqlx::Result<bool> {
    let n = sqlx::query_scalar!(
        r#"SELECT COUNT(*) AS "n!: i64" FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = ?"#,
        name
    )
    .fetch_one(&mut *conn)
    .await?;
    Ok(n > 0)
}

/// `CREATE DATABASE IF NOT EXISTS` for `name` (`taskq::create_database`). The one statement
/// built as text: an identifier cannot be a bound parameter. The caller rejects names with a
/// backtick, so the quoted identifier cannot be closed early.
pub(crate) async fn database_create(conn: &mut MySqlConnection, name: &str) -> sqlx::Result<()> {
    debug_assert!(!name.contains('`'));
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE DATABASE IF NOT EXISTS `{name}`"
    )))
    .execute(&mut *conn)
    .await?;
    Ok(())
}
