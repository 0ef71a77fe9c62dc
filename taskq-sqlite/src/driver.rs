//! The SQLite driver: the seam's operations (`taskq_driver::driver`) over this crate's
//! statements. This module only converts: ids (`INTEGER` is `i64`), states (stored as text),
//! times (µs integers), names (JSON arrays), and the row types of both sides.
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

use crate as q;
use taskq_driver::driver::{
    Actions, Claims, Clock, Enqueue, Handle, History, Identities, Leases, Queues, Schedules,
    StatementBudget, Tasks, Workers,
};
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

fn id(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn ids(v: &[u64]) -> Vec<i64> {
    v.iter().map(|&x| id(x)).collect()
}

fn uid(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

fn state(s: &str) -> sqlx::Result<TaskState> {
    s.parse()
        .map_err(|e: taskq_driver::state::ParseStateError| sqlx::Error::Decode(e.into()))
}

fn filter<'a>(f: &'a TaskFilter<'a>) -> q::TaskFilter<'a> {
    q::TaskFilter {
        queue: f.queue,
        state: f.state.map(TaskState::as_str),
        name: f.name,
    }
}

fn task_info(r: q::TaskRow) -> sqlx::Result<TaskInfo> {
    Ok(TaskInfo {
        id: TaskId(uid(r.id)),
        queue: r.queue,
        name: r.name,
        payload: r.payload,
        state: state(&r.state)?,
        priority: r.priority,
        attempt: r.attempt,
        max_attempts: r.max_attempts,
        run_at: r.run_at,
        lease_until: r.lease_until,
        lease_epoch: uid(r.lease_epoch),
        worker_id: r.worker_id,
        idempotency_key: r.idempotency_key,
        trace_context: r.trace_context,
        unique_key: r.unique_key,
        unique_held: r.unique_held,
        last_error: r.last_error,
        created_at: r.created_at,
        updated_at: r.updated_at,
        finished_at: r.finished_at,
        snoozes: r.snoozes,
        deadline: r.deadline,
        attempted_at: r.attempted_at,
    })
}

fn task_infos(rows: Vec<q::TaskRow>) -> sqlx::Result<Vec<TaskInfo>> {
    rows.into_iter().map(task_info).collect()
}

fn new_task<'a>(t: &'a NewTask<'a>) -> q::NewTask<'a> {
    q::NewTask {
        queue: t.queue,
        name: t.name,
        payload: t.payload,
        priority: t.priority,
        max_attempts: t.max_attempts,
        delay_us: t.delay_us,
        run_at: t.run_at,
        deadline: t.deadline,
        ttl_us: t.ttl_us,
        idempotency_key: t.idempotency_key,
        trace_context: t.trace_context,
        unique_key: t.unique_key,
        unique_while: t.unique_while,
        unique_expires_us: t.unique_expires_us,
    }
}

fn queue_state_counts(rows: Vec<q::QueueStateCount>) -> sqlx::Result<Vec<QueueStateCount>> {
    rows.into_iter()
        .map(|r| {
            Ok(QueueStateCount {
                queue: r.queue,
                state: state(&r.state)?,
                count: r.count,
                oldest_run_at: r.oldest_run_at,
                earliest_lease_until: r.earliest_lease_until,
            })
        })
        .collect()
}

/// Inserts one task on the caller's connection.
pub async fn task_insert(conn: &mut SqliteConnection, row: &NewTask<'_>) -> sqlx::Result<Inserted> {
    Ok(match q::task_insert(conn, &new_task(row)).await? {
        q::Inserted::New(i) => Inserted::New(TaskId(uid(i))),
        q::Inserted::Duplicate(i) => Inserted::Duplicate(TaskId(uid(i))),
    })
}

/// Inserts unkeyed rows (ids from `RETURNING`).
pub async fn task_insert_rows(
    conn: &mut SqliteConnection,
    rows: &[NewTask<'_>],
) -> sqlx::Result<Vec<TaskId>> {
    let rows: Vec<q::NewTask<'_>> = rows.iter().map(new_task).collect();
    let done = q::task_insert_many(conn, &rows).await?;
    Ok(done.into_iter().map(|i| TaskId(uid(i.id()))).collect())
}

/// The database clock (µs since the epoch).
pub async fn db_clock_us(conn: &mut SqliteConnection) -> sqlx::Result<i64> {
    q::db_clock_us(conn).await
}

/// Appends an entry to the audit trail.
pub async fn audit_insert(conn: &mut SqliteConnection, a: &AuditRow<'_>) -> sqlx::Result<u64> {
    let id = q::audit_insert(
        conn,
        &q::AuditRow {
            actor: a.actor,
            action: a.action,
            task_id: a.task_id.map(id),
            queue: a.queue,
            detail: a.detail.as_deref(),
        },
    )
    .await?;
    Ok(uid(id))
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
        let busy = self.busy_timeout();
        let opts: SqliteConnectOptions =
            q::tune((*self.pool.connect_options()).clone()).busy_timeout(busy);
        let pool = SqlitePoolOptions::new()
            .max_connections(spec.connections.max(1))
            .min_connections(0)
            .acquire_timeout(spec.statement_timeout)
            .test_before_acquire(false)
            .connect_lazy_with(opts);
        Self { pool }
    }

    /// The busy timeout of this pool's connections (`SqliteConnectOptions::busy_timeout`;
    /// [`DEFAULT_BUSY_TIMEOUT`](q::connect::DEFAULT_BUSY_TIMEOUT) if it cannot be read).
    pub fn busy_timeout(&self) -> Duration {
        busy_timeout_of(&self.pool.connect_options()).unwrap_or(q::connect::DEFAULT_BUSY_TIMEOUT)
    }

    /// A write transaction (`BEGIN IMMEDIATE`: the write lock at once).
    pub async fn begin(&self) -> sqlx::Result<Transaction<'static, Sqlite>> {
        q::begin_immediate(&self.pool).await
    }

    async fn conn(&self) -> sqlx::Result<sqlx::pool::PoolConnection<Sqlite>> {
        self.pool.acquire().await
    }
}

impl Handle for SqliteDriver {
    type Conn = SqliteConnection;
    type Database = Sqlite;
    fn pool(&self) -> &SqlitePool {
        &self.pool
    }
}

impl Enqueue for SqliteDriver {
    async fn task_insert(conn: &mut SqliteConnection, row: &NewTask<'_>) -> sqlx::Result<Inserted> {
        task_insert(conn, row).await
    }
    async fn task_insert_rows(
        conn: &mut SqliteConnection,
        rows: &[NewTask<'_>],
    ) -> sqlx::Result<Vec<TaskId>> {
        task_insert_rows(conn, rows).await
    }
    async fn db_clock_us(conn: &mut SqliteConnection) -> sqlx::Result<i64> {
        db_clock_us(conn).await
    }
    async fn audit_insert(conn: &mut SqliteConnection, row: &AuditRow<'_>) -> sqlx::Result<u64> {
        audit_insert(conn, row).await
    }
}

impl Tasks for SqliteDriver {
    async fn task_get(&self, id_: TaskId) -> sqlx::Result<Option<TaskInfo>> {
        let mut c = self.conn().await?;
        q::task_get(&mut c, id(id_.0))
            .await?
            .map(task_info)
            .transpose()
    }

    async fn task_list(
        &self,
        f: &TaskFilter<'_>,
        after_id: u64,
        up_to: u64,
        limit: u32,
    ) -> sqlx::Result<Vec<TaskInfo>> {
        let mut c = self.conn().await?;
        task_infos(q::task_list(&mut c, &filter(f), id(after_id), id(up_to), limit).await?)
    }

    async fn task_list_pending(
        &self,
        kind: PendingKind,
        queue: Option<&str>,
        after: Option<(DateTime<Utc>, u64)>,
        limit: u32,
    ) -> sqlx::Result<Vec<TaskInfo>> {
        let (at, after_id) = after.map_or((i64::MIN, 0), |(t, i)| (t.timestamp_micros(), id(i)));
        let mut c = self.conn().await?;
        task_infos(q::task_list_pending(&mut c, kind.as_str(), queue, at, after_id, limit).await?)
    }

    async fn task_list_desc(
        &self,
        f: &TaskFilter<'_>,
        before_id: u64,
        from: u64,
        limit: u32,
    ) -> sqlx::Result<Vec<TaskInfo>> {
        let mut c = self.conn().await?;
        task_infos(q::task_list_desc(&mut c, &filter(f), id(before_id), id(from), limit).await?)
    }

    async fn task_id_bounds(&self) -> sqlx::Result<(u64, u64)> {
        let mut c = self.conn().await?;
        let (lo, hi) = q::task_id_bounds(&mut c).await?;
        Ok((uid(lo), uid(hi)))
    }

    async fn task_list_queue_desc(
        &self,
        queue: &str,
        name: Option<&str>,
        before_id: u64,
        limit: u32,
    ) -> sqlx::Result<Vec<TaskInfo>> {
        let mut c = self.conn().await?;
        task_infos(q::task_list_queue_desc(&mut c, queue, name, id(before_id), limit).await?)
    }

    async fn task_list_queue_asc(
        &self,
        queue: &str,
        name: Option<&str>,
        after_id: u64,
        limit: u32,
    ) -> sqlx::Result<Vec<TaskInfo>> {
        let mut c = self.conn().await?;
        task_infos(q::task_list_queue_asc(&mut c, queue, name, id(after_id), limit).await?)
    }

    async fn task_finished_per_minute(
        &self,
        minutes: u32,
    ) -> sqlx::Result<Vec<(TaskState, u32, u64)>> {
        let mut c = self.conn().await?;
        q::task_finished_per_minute(&mut c, minutes)
            .await?
            .into_iter()
            .map(|(s, m, n)| Ok((state(&s)?, m, n)))
            .collect()
    }

    async fn task_run_times(&self, minutes: u32, limit: u32) -> sqlx::Result<Vec<(String, i64)>> {
        let mut c = self.conn().await?;
        q::task_run_times(&mut c, minutes, limit).await
    }

    async fn task_prune_count(&self, s: TaskState, age_secs: u64) -> sqlx::Result<u64> {
        let mut c = self.conn().await?;
        q::task_prune_count(&mut c, s.as_str(), age_secs).await
    }

    async fn task_count(&self, f: &TaskFilter<'_>) -> sqlx::Result<u64> {
        let mut c = self.conn().await?;
        q::task_count(&mut c, &filter(f)).await
    }

    async fn task_stats(&self, conn: &mut SqliteConnection) -> sqlx::Result<Vec<QueueStateCount>> {
        let mut rows = queue_state_counts(q::task_stats(conn).await?)?;
        // By queue, then state in lifecycle order (`TaskState::ALL`), as on MySQL.
        rows.sort_by_key(|r| (r.queue.clone(), r.state as u8));
        Ok(rows)
    }

    async fn task_stats_active(
        &self,
        conn: &mut SqliteConnection,
    ) -> sqlx::Result<Vec<QueueStateCount>> {
        queue_state_counts(q::task_stats_active(conn).await?)
    }

    async fn task_stats_terminal(
        &self,
        conn: &mut SqliteConnection,
    ) -> sqlx::Result<Vec<QueueStateCount>> {
        queue_state_counts(q::task_stats_terminal(conn).await?)
    }

    async fn task_pending_by_name(
        &self,
        conn: &mut SqliteConnection,
        queue: Option<&str>,
    ) -> sqlx::Result<Vec<PendingNameCount>> {
        Ok(q::task_pending_by_name(conn, queue)
            .await?
            .into_iter()
            .map(|r| PendingNameCount {
                queue: r.queue,
                name: r.name,
                pending: r.pending,
                due: r.due,
                oldest_run_at: r.oldest_run_at,
            })
            .collect())
    }

    async fn task_bulk_ids(
        &self,
        f: &TaskFilter<'_>,
        age_us: i64,
        after_id: u64,
        limit: u32,
    ) -> sqlx::Result<Vec<(u64, bool)>> {
        let mut c = self.conn().await?;
        let s = f.state.map_or("", TaskState::as_str);
        Ok(
            q::task_bulk_ids(&mut c, s, &filter(f), age_us, id(after_id), limit)
                .await?
                .into_iter()
                .map(|(i, r)| (uid(i), r))
                .collect(),
        )
    }

    async fn task_bulk_count(&self, f: &TaskFilter<'_>, age_us: i64) -> sqlx::Result<u64> {
        let mut c = self.conn().await?;
        let s = f.state.map_or("", TaskState::as_str);
        q::task_bulk_count(&mut c, s, &filter(f), age_us).await
    }

    async fn task_state(&self, t: TaskId) -> sqlx::Result<Option<TaskState>> {
        let mut c = self.conn().await?;
        q::task_state(&mut c, id(t.0))
            .await?
            .map(|s| state(&s))
            .transpose()
    }

    async fn task_dead_unique_ids(
        &self,
        queue: Option<&str>,
        died_before: DateTime<Utc>,
        after_id: u64,
        limit: u32,
    ) -> sqlx::Result<Vec<TaskId>> {
        let mut c = self.conn().await?;
        Ok(
            q::task_dead_unique_ids(&mut c, queue, died_before, id(after_id), limit)
                .await?
                .into_iter()
                .map(|i| TaskId(uid(i)))
                .collect(),
        )
    }
}

impl Actions for SqliteDriver {
    async fn task_cancel_batch(&self, v: &[u64]) -> sqlx::Result<u64> {
        let mut c = self.conn().await?;
        q::task_cancel_batch(&mut c, &ids(v)).await
    }

    async fn task_request_cancel_batch(&self, v: &[u64]) -> sqlx::Result<u64> {
        let mut c = self.conn().await?;
        q::task_request_cancel_batch(&mut c, &ids(v)).await
    }

    async fn task_retry_dead_ids(&self, v: &[u64]) -> sqlx::Result<u64> {
        let mut c = self.conn().await?;
        q::task_retry_dead_ids(&mut c, &ids(v)).await
    }

    async fn task_request_cancel(
        &self,
        conn: &mut SqliteConnection,
        t: TaskId,
    ) -> sqlx::Result<bool> {
        q::task_request_cancel(conn, id(t.0)).await
    }

    async fn task_cancel(&self, conn: &mut SqliteConnection, t: TaskId) -> sqlx::Result<bool> {
        q::task_cancel(conn, id(t.0)).await
    }

    async fn task_delete(&self, conn: &mut SqliteConnection, t: TaskId) -> sqlx::Result<bool> {
        q::task_delete(conn, id(t.0)).await
    }

    async fn task_reschedule(
        &self,
        conn: &mut SqliteConnection,
        t: TaskId,
        at: Option<DateTime<Utc>>,
        delay_us: i64,
    ) -> sqlx::Result<bool> {
        q::task_reschedule(conn, id(t.0), at, delay_us).await
    }

    async fn task_set_priority(
        &self,
        conn: &mut SqliteConnection,
        t: TaskId,
        priority: i16,
    ) -> sqlx::Result<bool> {
        q::task_set_priority(conn, id(t.0), priority).await
    }

    async fn task_retry_dead(
        &self,
        conn: &mut SqliteConnection,
        t: TaskId,
    ) -> sqlx::Result<RetryDead> {
        Ok(match q::task_retry_dead(conn, id(t.0)).await? {
            q::RetryDead::Retried => RetryDead::Retried,
            q::RetryDead::NotDead => RetryDead::NotDead,
            q::RetryDead::IdentityHeld(other) => RetryDead::IdentityHeld(TaskId(uid(other))),
        })
    }

    async fn task_prune(
        &self,
        conn: &mut SqliteConnection,
        s: TaskState,
        age_secs: u64,
        limit: u32,
    ) -> sqlx::Result<u64> {
        q::task_prune(conn, s.as_str(), age_secs, limit).await
    }

    async fn task_retry_dead_batch(
        &self,
        queue: Option<&str>,
        died_before: DateTime<Utc>,
        limit: u32,
    ) -> sqlx::Result<u64> {
        let mut c = self.conn().await?;
        q::task_retry_dead_batch(&mut c, queue, died_before, limit).await
    }
}

impl Claims for SqliteDriver {
    type ClaimCursor = ();

    async fn task_claim(
        &self,
        conn: &mut SqliteConnection,
        req: &ClaimRequest<'_>,
        _cursor: &mut (),
    ) -> sqlx::Result<ClaimBatch> {
        let names: Vec<&str> = req.names.as_slice().iter().map(String::as_str).collect();
        let b = q::task_claim(
            conn,
            &q::ClaimRequest {
                queue: req.queue,
                names: &names,
                limit: req.limit,
                lease_us: req.lease_us,
                worker_id: req.worker_id,
                limited: req.limited,
            },
        )
        .await?;
        Ok(ClaimBatch {
            tasks: b
                .tasks
                .into_iter()
                .map(|t| Claimed {
                    id: uid(t.id),
                    name: t.name,
                    payload: t.payload,
                    attempt: t.attempt,
                    max_attempts: t.max_attempts,
                    snoozes: t.snoozes,
                    lease_epoch: uid(t.lease_epoch),
                    wait_us: t.wait_us,
                    trace_context: t.trace_context,
                    unique_key: t.unique_key,
                    unique_while: t.unique_while,
                    parked_error: t.parked_error,
                })
                .collect(),
            expired: b
                .expired
                .into_iter()
                .map(|e| ExpiredTask {
                    id: uid(e.id),
                    name: e.name,
                    late_us: e.late_us,
                })
                .collect(),
            canceled: b
                .canceled
                .into_iter()
                .map(|c| CanceledTask {
                    id: uid(c.id),
                    name: c.name,
                })
                .collect(),
            limited: b.limited.map(|h| LimitHit {
                allowed: h.allowed,
                rate_resets_in_us: h.rate_resets_in_us,
            }),
            contended: false,
            partial: false,
        })
    }
}

impl Leases for SqliteDriver {
    async fn task_heartbeat(
        &self,
        conn: &mut SqliteConnection,
        leases: &[(u64, u64)],
        lease_us: i64,
    ) -> sqlx::Result<u64> {
        q::task_heartbeat(conn, &signed(leases), lease_us).await
    }

    async fn task_leases_held(
        &self,
        conn: &mut SqliteConnection,
        leases: &[(u64, u64)],
    ) -> sqlx::Result<Vec<(u64, u64, bool)>> {
        Ok(q::task_leases_held(conn, &signed(leases))
            .await?
            .into_iter()
            .map(|h| (uid(h.id), uid(h.epoch), h.cancel_requested))
            .collect())
    }

    async fn task_write_back(
        &self,
        conn: &mut SqliteConnection,
        batch: &[WriteBack],
    ) -> sqlx::Result<WrittenBack> {
        let rows: Vec<q::WriteBack> = batch
            .iter()
            .map(|w| q::WriteBack {
                id: id(w.id),
                epoch: id(w.epoch),
                state: w.state,
                attempt: w.attempt,
                outcome: w.outcome,
                delay_us: w.delay_us,
                error: w.error.clone(),
                follow_up: w.follow_up.as_deref().map(follow_up),
            })
            .collect();
        let done = q::task_write_back(conn, &rows).await?;
        Ok(WrittenBack {
            written: done.written.len() as u64,
            deferred: Vec::new(),
            followed: done.followed.into_iter().map(uid).collect(),
        })
    }

    async fn task_release(
        &self,
        conn: &mut SqliteConnection,
        leases: &[(u64, u64)],
    ) -> sqlx::Result<u64> {
        q::task_release(conn, &signed(leases)).await
    }

    async fn task_running_since(
        &self,
        conn: &mut SqliteConnection,
        queue: &str,
        worker_id: &str,
        since_us: i64,
    ) -> sqlx::Result<Vec<(u64, u64)>> {
        Ok(q::task_running_since(conn, queue, worker_id, since_us)
            .await?
            .into_iter()
            .map(|(i, e)| (uid(i), uid(e)))
            .collect())
    }

    async fn task_lapsed(
        &self,
        conn: &mut SqliteConnection,
        names: &NameList,
        limit: u32,
    ) -> sqlx::Result<Vec<LapsedRow>> {
        let names: Vec<&str> = names.as_slice().iter().map(String::as_str).collect();
        Ok(q::task_lapsed(conn, &names, limit)
            .await?
            .into_iter()
            .map(|r| LapsedRow {
                id: uid(r.id),
                lease_epoch: uid(r.lease_epoch),
                name: r.name,
                queue: r.queue,
                attempt: r.attempt,
                max_attempts: r.max_attempts,
                worker_id: r.worker_id,
                // Not read: the reap frees identities by the state it leaves (see
                // `identities::release_ended`), so `frees()` is `None` here.
                unique_key: None,
                unique_while: None,
                canceled: r.canceled,
                registered: r.registered,
                payload: r.payload,
                trace_context: r.trace_context,
            })
            .collect())
    }

    async fn task_reap(
        &self,
        conn: &mut SqliteConnection,
        rows: &[ReapRow],
        _exact: bool,
    ) -> sqlx::Result<Reaped> {
        let plan: Vec<q::ReapRow> = rows
            .iter()
            .map(|r| q::ReapRow {
                id: id(r.id),
                epoch: id(r.epoch),
                park: r.parks,
                follow_up: r.follow_up.as_deref().map(follow_up),
            })
            .collect();
        let done = q::task_reap(conn, &plan).await?;
        Ok(Reaped {
            reaped: done.rows.len() as u64,
            rows: done
                .rows
                .into_iter()
                .map(|r| Ok((uid(r.id), state(&r.state)?)))
                .collect::<sqlx::Result<_>>()?,
            followed: done.followed.into_iter().map(uid).collect(),
        })
    }

    async fn task_epochs(
        &self,
        conn: &mut SqliteConnection,
        ids: &[u64],
    ) -> sqlx::Result<Vec<(u64, u64)>> {
        Ok(q::task_epochs(conn, &self::ids(ids))
            .await?
            .into_iter()
            .map(|(i, e)| (uid(i), uid(e)))
            .collect())
    }
}

impl Identities for SqliteDriver {
    async fn unique_prune_expired(
        &self,
        conn: &mut SqliteConnection,
        limit: u32,
    ) -> sqlx::Result<u64> {
        q::unique_prune_expired(conn, limit).await
    }
}

impl Queues for SqliteDriver {
    async fn queue_pause(&self, conn: &mut SqliteConnection, queue: &str) -> sqlx::Result<()> {
        q::queue_pause(conn, queue).await
    }

    async fn queue_resume(&self, conn: &mut SqliteConnection, queue: &str) -> sqlx::Result<bool> {
        q::queue_resume(conn, queue).await
    }

    async fn queues_paused(
        &self,
        conn: &mut SqliteConnection,
    ) -> sqlx::Result<Vec<(String, DateTime<Utc>)>> {
        q::queues_paused(conn).await
    }

    async fn queue_controls(&self, conn: &mut SqliteConnection) -> sqlx::Result<Vec<QueueControl>> {
        Ok(q::queue_controls(conn)
            .await?
            .into_iter()
            .map(|r| QueueControl {
                queue: r.queue,
                paused: r.paused,
                limited: r.limited,
            })
            .collect())
    }

    async fn queue_set_limit(
        &self,
        conn: &mut SqliteConnection,
        queue: &str,
        limit: Option<u32>,
    ) -> sqlx::Result<()> {
        q::queue_set_limit(conn, queue, limit).await
    }

    async fn queue_set_rate_limit(
        &self,
        conn: &mut SqliteConnection,
        queue: &str,
        rate: Option<(u32, i64)>,
    ) -> sqlx::Result<()> {
        q::queue_set_rate_limit(conn, queue, rate).await
    }

    async fn queue_list(&self) -> sqlx::Result<Vec<QueueRow>> {
        let mut c = self.conn().await?;
        Ok(q::queue_list(&mut c)
            .await?
            .into_iter()
            .map(|r| QueueRow {
                queue: r.queue,
                paused_at: r.paused_at,
                concurrency_limit: r.concurrency_limit,
                rate: r.rate,
                rate_used: r.rate_used,
                pending: r.pending,
                running: r.running,
            })
            .collect())
    }
}

impl Schedules for SqliteDriver {
    async fn schedule_declare(
        &self,
        conn: &mut SqliteConnection,
        d: &ScheduleDecl<'_>,
    ) -> sqlx::Result<()> {
        q::schedule_declare(
            conn,
            &q::ScheduleDecl {
                name: d.name,
                task_name: d.task_name,
                queue: d.queue,
                expression: d.expression,
                timezone: d.timezone,
                missed_ticks: d.missed_ticks,
                next_tick: d.next_tick,
            },
        )
        .await
    }

    async fn schedule_states(
        &self,
        conn: &mut SqliteConnection,
        names: &NameList,
    ) -> sqlx::Result<Vec<ScheduleState>> {
        let names: Vec<&str> = names.as_slice().iter().map(String::as_str).collect();
        Ok(q::schedule_states(conn, &names)
            .await?
            .into_iter()
            .map(|s| ScheduleState {
                now: s.now,
                name: s.name,
                expression: s.expression,
                timezone: s.timezone,
                watermark: s.watermark,
            })
            .collect())
    }

    async fn schedule_fire(
        &self,
        conn: &mut SqliteConnection,
        f: &ScheduleFire<'_>,
    ) -> sqlx::Result<Option<Vec<TaskId>>> {
        let done = q::schedule_fire(
            conn,
            &q::ScheduleFire {
                name: f.name,
                expression: f.expression,
                timezone: f.timezone,
                old_watermark: f.old_watermark,
                new_watermark: f.new_watermark,
                next_tick: f.next_tick,
                worker_id: f.worker_id,
                tasks: f.tasks.iter().map(new_task).collect(),
            },
        )
        .await?;
        Ok(done.map(|v| v.into_iter().map(|i| TaskId(uid(i))).collect()))
    }

    async fn schedule_list(&self) -> sqlx::Result<Vec<ScheduleInfo>> {
        let mut c = self.conn().await?;
        Ok(q::schedule_list(&mut c)
            .await?
            .into_iter()
            .map(|r| ScheduleInfo {
                name: r.name,
                task_name: r.task_name,
                queue: r.queue,
                expression: r.expression,
                timezone: r.timezone,
                missed_ticks: r.missed_ticks,
                watermark: r.watermark,
                last_tick: r.last_tick,
                last_worker_id: r.last_worker_id,
                next_tick: r.next_tick,
                declared_at: r.declared_at,
                created_at: r.created_at,
                updated_at: r.updated_at,
            })
            .collect())
    }

    async fn schedule_delete(&self, conn: &mut SqliteConnection, name: &str) -> sqlx::Result<bool> {
        q::schedule_delete(conn, name).await
    }
}

impl Workers for SqliteDriver {
    async fn worker_start(
        &self,
        conn: &mut SqliteConnection,
        w: &WorkerRow<'_>,
    ) -> sqlx::Result<()> {
        q::worker_start(
            conn,
            &worker_row(w, &taskq_driver::rows::queues_json(w.queues)),
        )
        .await
    }

    async fn worker_seen(
        &self,
        conn: &mut SqliteConnection,
        w: &WorkerRow<'_>,
    ) -> sqlx::Result<()> {
        q::worker_seen(
            conn,
            &worker_row(w, &taskq_driver::rows::queues_json(w.queues)),
        )
        .await
    }

    async fn worker_stop(
        &self,
        conn: &mut SqliteConnection,
        worker_id: &str,
    ) -> sqlx::Result<bool> {
        q::worker_stop(conn, worker_id).await
    }

    async fn worker_prune(
        &self,
        conn: &mut SqliteConnection,
        age_secs: u64,
        limit: u32,
    ) -> sqlx::Result<u64> {
        q::worker_prune(conn, age_secs, limit).await
    }

    async fn worker_list(&self, conn: &mut SqliteConnection) -> sqlx::Result<Vec<WorkerListRow>> {
        Ok(q::worker_list(conn)
            .await?
            .into_iter()
            .map(|r| WorkerListRow {
                worker_id: r.worker_id,
                host: r.host,
                pid: r.pid,
                queues: r.queues,
                concurrency: r.concurrency,
                lease_us: r.lease_us,
                heartbeat_us: r.heartbeat_us,
                started_at: r.started_at,
                last_seen_at: r.last_seen_at,
                stopped_at: r.stopped_at,
                names: r.names,
                seen_ago_us: r.seen_ago_us,
                running: r.running,
            })
            .collect())
    }
}

impl History for SqliteDriver {
    async fn task_failed_attempts_per_minute(
        &self,
        minutes: u32,
    ) -> sqlx::Result<Vec<(String, u32, u64)>> {
        let mut c = self.conn().await?;
        q::task_failed_attempts_per_minute(&mut c, minutes).await
    }

    async fn task_attempts(&self, t: TaskId) -> sqlx::Result<Option<Option<String>>> {
        let mut c = self.conn().await?;
        q::task_attempts(&mut c, id(t.0)).await
    }

    async fn audit_list(
        &self,
        task_id: Option<u64>,
        queue: Option<&str>,
        before_id: u64,
        limit: u32,
    ) -> sqlx::Result<Vec<AuditListRow>> {
        let mut c = self.conn().await?;
        Ok(
            q::audit_list(&mut c, task_id.map(id), queue, id(before_id), limit)
                .await?
                .into_iter()
                .map(|r| AuditListRow {
                    id: uid(r.id),
                    at: r.at,
                    actor: r.actor,
                    action: r.action,
                    task_id: r.task_id.map(uid),
                    queue: r.queue,
                    detail: r.detail,
                })
                .collect(),
        )
    }

    async fn audit_prune(
        &self,
        conn: &mut SqliteConnection,
        age_secs: u64,
        limit: u32,
    ) -> sqlx::Result<u64> {
        q::audit_prune(conn, age_secs, limit).await
    }
}

impl Clock for SqliteDriver {
    async fn db_now(&self) -> sqlx::Result<DateTime<Utc>> {
        let mut c = self.conn().await?;
        q::db_now(&mut c).await
    }

    async fn db_now_on(&self, conn: &mut SqliteConnection) -> sqlx::Result<DateTime<Utc>> {
        q::db_now(conn).await
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

fn worker_row<'a>(w: &'a WorkerRow<'a>, queues_json: &'a str) -> q::WorkerRow<'a> {
    q::WorkerRow {
        worker_id: w.worker_id,
        host: w.host,
        pid: w.pid,
        queues_json,
        concurrency: w.concurrency,
        lease_us: w.lease_us,
        heartbeat_us: w.heartbeat_us,
        names_json: w.names.json(),
    }
}

/// `(id, epoch)` pairs as SQLite's signed integers.
fn signed(leases: &[(u64, u64)]) -> Vec<(i64, i64)> {
    leases.iter().map(|&(i, e)| (id(i), id(e))).collect()
}

fn follow_up(f: &FollowUpRow) -> q::FollowUpRow {
    q::FollowUpRow {
        queue: f.queue.to_owned(),
        name: f.name.to_owned(),
        payload: f.payload.clone(),
        priority: f.priority,
        max_attempts: f.max_attempts,
        ttl_us: f.ttl_us,
        key: f.key.clone(),
        trace_context: f.trace_context.clone(),
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
            let opts = q::connect_options("/tmp/x.db").busy_timeout(d);
            assert_eq!(busy_timeout_of(&opts), Some(d), "{d:?}");
        }
        assert_eq!(
            busy_timeout_of(&SqliteConnectOptions::new()),
            Some(Duration::from_secs(5))
        );
    }
}
