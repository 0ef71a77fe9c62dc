//! Batches (`taskq_batches`, `taskq_batch_members`): the insert of a batch and the addition of
//! members on the caller's connection, the count of members' ends (in the worker's write-back
//! transaction, in a cancel or a seal, or on its own for the reaper's sweep), reads, cancel and
//! retention. How an end is counted and what the counters release is
//! `taskq_driver::rules::batch`'s.
//!
//! Locks, in this order only: task rows, member rows, batch rows. The write-back and the sweep
//! lock batch rows `SKIP LOCKED` (a producer adding to a batch holds its row until it commits:
//! a member that ends meanwhile is left for the sweep, never waited for with the write-back's
//! rows locked). A cancel or an add locks its batch row first and waits.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use chrono::{DateTime, NaiveDateTime, Utc};
use serde::Serialize;
use sqlx::{Connection, MySqlConnection, MySqlPool};

use crate::MySqlDriver;
use crate::enqueue::task_insert_rows;
use taskq_driver::driver::Batches;
use taskq_driver::rows::{
    BatchAdded, BatchCanceled, BatchCounted, BatchInserted, BatchMemberRow, BatchRow, NewBatch,
    NewTask,
};
use taskq_driver::rules::batch::{
    AddRefused, BatchCounters, CANCELED_BY_BATCH, Counted, Delta, Success, callbacks, count,
    may_add,
};
use taskq_driver::state::{TaskId, TaskState};

fn json<T: Serialize>(v: &T) -> sqlx::Result<String> {
    serde_json::to_string(v).map_err(|e| sqlx::Error::Encode(Box::new(e)))
}

fn utc(t: NaiveDateTime) -> DateTime<Utc> {
    t.and_utc()
}

/// Sets `batch_id` on the members and makes the callbacks `waiting`, then inserts the member
/// rows: two statements.
async fn attach(
    conn: &mut MySqlConnection,
    id: u64,
    members: &[TaskId],
    callbacks: &[TaskId],
) -> sqlx::Result<()> {
    let rows: Vec<(u64, bool)> = members
        .iter()
        .map(|t| (t.0, true))
        .chain(callbacks.iter().map(|t| (t.0, false)))
        .collect();
    if rows.is_empty() {
        return Ok(());
    }
    sqlx::query!(
        r#"UPDATE JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$[0]',
                                             m TINYINT PATH '$[1]')) AS j
             STRAIGHT_JOIN taskq_tasks t FORCE INDEX (PRIMARY) ON t.id = j.id
           SET t.batch_id = IF(j.m, ?, NULL), t.state = IF(j.m, t.state, 'waiting')"#,
        json(&rows)?,
        id
    )
    .execute(&mut *conn)
    .await?;
    if !members.is_empty() {
        let ids: Vec<u64> = members.iter().map(|t| t.0).collect();
        sqlx::query!(
            r#"INSERT INTO taskq_batch_members (task_id, batch_id)
               SELECT j.id, ? FROM JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$')) AS j"#,
            id,
            json(&ids)?
        )
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

/// Inserts a batch in a savepoint of the caller's transaction (a transaction of its own
/// outside one): its members' and callbacks' tasks (one multi-row batch), the batch row, the
/// members' batch and the callbacks' `waiting` state, the member rows.
pub async fn batch_insert(
    conn: &mut MySqlConnection,
    b: &NewBatch<'_>,
) -> sqlx::Result<BatchInserted> {
    let mut tx = conn.begin().await?;
    let mut rows: Vec<NewTask<'_>> = b.members.to_vec();
    rows.extend(b.on_success);
    rows.extend(b.on_complete);
    let mut ids = task_insert_rows(&mut tx, &rows).await?;
    if ids.len() != rows.len() {
        return Err(sqlx::Error::Protocol(format!(
            "batch insert of {} tasks returned {} ids",
            rows.len(),
            ids.len()
        )));
    }
    let on_complete = b.on_complete.is_some().then(|| ids.pop()).flatten();
    let on_success = b.on_success.is_some().then(|| ids.pop()).flatten();
    let id = sqlx::query!(
        r#"INSERT INTO taskq_batches
             (name, created_at, total, sealed, success_task_id, complete_task_id)
           VALUES (?, UTC_TIMESTAMP(6), ?, ?, ?, ?)"#,
        b.name,
        ids.len() as u64,
        b.sealed,
        on_success.map(|t| t.0),
        on_complete.map(|t| t.0)
    )
    .execute(&mut *tx)
    .await?
    .last_insert_id();
    let cbs: Vec<TaskId> = on_success.into_iter().chain(on_complete).collect();
    attach(&mut tx, id, &ids, &cbs).await?;
    tx.commit().await?;
    Ok(BatchInserted {
        id,
        task_ids: ids,
        on_success,
        on_complete,
    })
}

/// A batch row locked by a count, an add or a cancel.
struct Locked {
    id: u64,
    counters: BatchCounters,
    success: Option<u64>,
    complete: Option<u64>,
}

struct LockedRow {
    id: u64,
    total: u64,
    succeeded: u64,
    failed: u64,
    sealed: bool,
    canceled: bool,
    completed: bool,
    success_released: bool,
    success_task_id: Option<u64>,
    complete_task_id: Option<u64>,
}

impl From<LockedRow> for Locked {
    fn from(r: LockedRow) -> Self {
        Self {
            id: r.id,
            counters: BatchCounters {
                total: r.total,
                succeeded: r.succeeded,
                failed: r.failed,
                sealed: r.sealed,
                canceled: r.canceled,
                completed: r.completed,
                success_released: r.success_released,
            },
            success: r.success_task_id,
            complete: r.complete_task_id,
        }
    }
}

/// Locks the batch rows `ids` (ascending), waiting for them, or skipping those another
/// transaction holds when `skip_locked`.
async fn lock_batches(
    conn: &mut MySqlConnection,
    ids: &[u64],
    skip_locked: bool,
) -> sqlx::Result<Vec<Locked>> {
    let ids = json(&ids)?;
    let rows = if skip_locked {
        sqlx::query_as!(
            LockedRow,
            r#"SELECT b.id AS "id: u64", b.total AS "total: u64", b.succeeded AS "succeeded: u64",
                 b.failed AS "failed: u64", b.sealed AS "sealed: bool",
                 (b.canceled_at IS NOT NULL) AS "canceled!: bool",
                 (b.completed_at IS NOT NULL) AS "completed!: bool",
                 (b.succeeded_at IS NOT NULL) AS "success_released!: bool",
                 b.success_task_id AS "success_task_id: u64",
                 b.complete_task_id AS "complete_task_id: u64"
               FROM JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$')) AS j
                 STRAIGHT_JOIN taskq_batches b FORCE INDEX (PRIMARY) ON b.id = j.id
               ORDER BY b.id
               FOR UPDATE SKIP LOCKED"#,
            ids
        )
        .fetch_all(&mut *conn)
        .await?
    } else {
        sqlx::query_as!(
            LockedRow,
            r#"SELECT b.id AS "id: u64", b.total AS "total: u64", b.succeeded AS "succeeded: u64",
                 b.failed AS "failed: u64", b.sealed AS "sealed: bool",
                 (b.canceled_at IS NOT NULL) AS "canceled!: bool",
                 (b.completed_at IS NOT NULL) AS "completed!: bool",
                 (b.succeeded_at IS NOT NULL) AS "success_released!: bool",
                 b.success_task_id AS "success_task_id: u64",
                 b.complete_task_id AS "complete_task_id: u64"
               FROM JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$')) AS j
                 STRAIGHT_JOIN taskq_batches b FORCE INDEX (PRIMARY) ON b.id = j.id
               ORDER BY b.id
               FOR UPDATE"#,
            ids
        )
        .fetch_all(&mut *conn)
        .await?
    };
    Ok(rows.into_iter().map(Locked::from).collect())
}

/// Applies counter changes to locked batches and releases what they complete: one `UPDATE`
/// of the batch rows, and one of the callbacks' tasks when some are made due, brought back or
/// canceled. Returns the callbacks made due (or brought back) with their queues.
async fn apply(
    conn: &mut MySqlConnection,
    changes: &[(Locked, Delta, u64)],
) -> sqlx::Result<Vec<(TaskId, String)>> {
    #[derive(Serialize)]
    struct BatchJson(u64, u64, u64, u64, bool, bool);
    let mut rows: Vec<BatchJson> = Vec::new();
    // (task id, op): 0 make due, 1 bring back from CANCELED_BY_BATCH, 2 cancel.
    let mut ops: Vec<(u64, u8)> = Vec::new();
    let mut released: Vec<u64> = Vec::new();
    for (b, delta, added) in changes {
        let mut c = b.counters;
        c.total += added;
        c.succeeded = (c.succeeded as i64 + delta.succeeded).max(0) as u64;
        c.failed = (c.failed as i64 + delta.failed).max(0) as u64;
        let cb = callbacks(&c);
        if let (true, Some(t)) = (cb.complete, b.complete) {
            ops.push((t, 0));
            released.push(t);
        }
        match (cb.success, b.success) {
            (Success::Release, Some(t)) => {
                ops.push((t, 0));
                released.push(t);
            }
            (Success::Revive, Some(t)) => {
                ops.push((t, 1));
                released.push(t);
            }
            (Success::Cancel, Some(t)) => ops.push((t, 2)),
            _ => {}
        }
        let success_now = matches!(cb.success, Success::Release | Success::Revive);
        if delta.is_zero() && *added == 0 && !cb.complete && !success_now {
            continue;
        }
        rows.push(BatchJson(
            b.id,
            c.total,
            c.succeeded,
            c.failed,
            cb.complete,
            success_now,
        ));
    }
    if !rows.is_empty() {
        sqlx::query!(
            r#"UPDATE JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$[0]',
                                                 total INT UNSIGNED PATH '$[1]',
                                                 s INT UNSIGNED PATH '$[2]',
                                                 f INT UNSIGNED PATH '$[3]',
                                                 c TINYINT PATH '$[4]',
                                                 r TINYINT PATH '$[5]')) AS j
                 STRAIGHT_JOIN taskq_batches b FORCE INDEX (PRIMARY) ON b.id = j.id
               SET b.total = j.total, b.succeeded = j.s, b.failed = j.f,
                   b.completed_at = IF(j.c, COALESCE(b.completed_at, UTC_TIMESTAMP(6)), b.completed_at),
                   b.succeeded_at = IF(j.r, COALESCE(b.succeeded_at, UTC_TIMESTAMP(6)), b.succeeded_at)"#,
            json(&rows)?
        )
        .execute(&mut *conn)
        .await?;
    }
    if !ops.is_empty() {
        sqlx::query!(
            r#"UPDATE JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$[0]',
                                                 op TINYINT PATH '$[1]')) AS j
                 STRAIGHT_JOIN taskq_tasks t FORCE INDEX (PRIMARY) ON t.id = j.id
               SET t.state = IF(j.op = 2, 'canceled', 'pending'),
                   t.run_at = IF(j.op = 2, t.run_at, GREATEST(t.run_at, UTC_TIMESTAMP(6))),
                   t.finished_at = IF(j.op = 2, UTC_TIMESTAMP(6), NULL),
                   t.last_error = IF(j.op = 2, ?, NULL),
                   t.updated_at = UTC_TIMESTAMP(6)
               WHERE (j.op IN (0, 2) AND t.state = 'waiting')
                  OR (j.op = 1 AND t.state = 'canceled' AND t.last_error = ?)"#,
            json(&ops)?,
            CANCELED_BY_BATCH,
            CANCELED_BY_BATCH
        )
        .execute(&mut *conn)
        .await?;
    }
    if released.is_empty() {
        return Ok(Vec::new());
    }
    // The released callbacks' queues, for waking this process's claim loops.
    let rows = sqlx::query!(
        r#"SELECT t.id AS "id: u64", t.queue
           FROM JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$')) AS j
             STRAIGHT_JOIN taskq_tasks t FORCE INDEX (PRIMARY) ON t.id = j.id
           WHERE t.state = 'pending'"#,
        json(&released)?
    )
    .fetch_all(&mut *conn)
    .await?;
    Ok(rows.into_iter().map(|r| (TaskId(r.id), r.queue)).collect())
}

/// Counts the ends of the members `ids` (inside the caller's transaction), as
/// `rules::batch::count` says: locks their member rows (ascending), reads their tasks' states,
/// locks their batches (`skip_locked`: those another transaction holds are left, their
/// members in [`BatchCounted::deferred`]), then writes the members' `counted`, the counters,
/// and the callbacks the counts release.
pub(crate) async fn count_members(
    conn: &mut MySqlConnection,
    ids: &[u64],
    skip_locked: bool,
) -> sqlx::Result<BatchCounted> {
    let mut out = BatchCounted::default();
    if ids.is_empty() {
        return Ok(out);
    }
    let mut ids = ids.to_vec();
    ids.sort_unstable();
    ids.dedup();
    let ids_json = json(&ids)?;
    let members = sqlx::query!(
        r#"SELECT m.task_id AS "task_id: u64", m.batch_id AS "batch_id: u64", m.counted
           FROM JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$')) AS j
             STRAIGHT_JOIN taskq_batch_members m FORCE INDEX (PRIMARY) ON m.task_id = j.id
           ORDER BY m.task_id
           FOR UPDATE"#,
        ids_json
    )
    .fetch_all(&mut *conn)
    .await?;
    if members.is_empty() {
        return Ok(out);
    }
    // A plain read: the write-back holds its tasks' rows already, and the sweep must not wait
    // for a write-back's (which waits for the member rows this holds).
    let states: BTreeMap<u64, String> = sqlx::query!(
        r#"SELECT t.id AS "id: u64", t.state AS "state: String"
           FROM JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$')) AS j
             STRAIGHT_JOIN taskq_tasks t FORCE INDEX (PRIMARY) ON t.id = j.id"#,
        ids_json
    )
    .fetch_all(&mut *conn)
    .await?
    .into_iter()
    .map(|r| (r.id, r.state))
    .collect();
    let mut per_batch: BTreeMap<u64, (Delta, Vec<(u64, i8)>)> = BTreeMap::new();
    for m in members {
        let state = match states.get(&m.task_id) {
            Some(s) => Some(
                s.parse::<TaskState>()
                    .map_err(|e| sqlx::Error::Decode(Box::new(e)))?,
            ),
            None => None,
        };
        let prev = Counted::from_i8(m.counted);
        let (next, delta) = count(prev, state);
        if next == prev {
            continue;
        }
        let e = per_batch.entry(m.batch_id).or_default();
        e.0.add(delta);
        e.1.push((m.task_id, next.as_i8()));
    }
    if per_batch.is_empty() {
        return Ok(out);
    }
    let batch_ids: Vec<u64> = per_batch.keys().copied().collect();
    let locked = lock_batches(conn, &batch_ids, skip_locked).await?;
    let mut member_rows: Vec<(u64, i8)> = Vec::new();
    let mut changes = Vec::new();
    for b in locked {
        if let Some((delta, rows)) = per_batch.remove(&b.id) {
            member_rows.extend(rows);
            changes.push((b, delta, 0));
        }
    }
    // Batches another transaction holds (or deleted ones): their members wait for the sweep.
    for (_, (_, rows)) in per_batch {
        out.deferred.extend(rows.iter().map(|(id, _)| *id));
    }
    if !member_rows.is_empty() {
        sqlx::query!(
            r#"UPDATE JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$[0]',
                                                 c TINYINT PATH '$[1]')) AS j
                 STRAIGHT_JOIN taskq_batch_members m FORCE INDEX (PRIMARY) ON m.task_id = j.id
               SET m.counted = j.c"#,
            json(&member_rows)?
        )
        .execute(&mut *conn)
        .await?;
    }
    out.members = member_rows.len() as u64;
    out.released = apply(conn, &changes).await?;
    Ok(out)
}

/// How long [`count_later`] keeps trying before it leaves the members to the reaper's sweep.
const COUNT_LATER_FOR: Duration = Duration::from_secs(60);

/// Counts, on a task of its own, the members a committed write-back left uncounted because
/// another transaction held their batch's row ([`BatchCounted::deferred`]): most often
/// another worker's write-back counting members of the same batch, which commits within
/// milliseconds; or a producer adding members. Each try is a short transaction that locks the
/// batch rows `SKIP LOCKED`, polled every 2 ms at first, backing off to 200 ms; it holds a
/// connection only for each try. Gives up to the reaper's sweep after a minute (or when the
/// process ends). The callbacks it makes due are seen by the claim loops' next poll.
pub(crate) fn count_later(pool: &MySqlPool, ids: Vec<u64>) {
    if ids.is_empty() {
        return;
    }
    let pool = pool.clone();
    tokio::spawn(async move {
        let start = Instant::now();
        let mut left = ids;
        let mut pause = Duration::from_millis(2);
        while !left.is_empty() && start.elapsed() < COUNT_LATER_FOR {
            tokio::time::sleep(pause).await;
            let tried: sqlx::Result<Vec<u64>> = async {
                let mut c = pool.acquire().await?;
                let mut tx = c.begin().await?;
                let out = count_members(&mut tx, &left, true).await?;
                tx.commit().await?;
                Ok(out.deferred)
            }
            .await;
            match tried {
                Ok(still) => left = still,
                Err(e) => {
                    tracing::debug!(error = %e, members = left.len(), "taskq: batch count failed; trying again");
                }
            }
            pause = (pause * 2).min(Duration::from_millis(200));
        }
        if !left.is_empty() {
            tracing::info!(
                members = left.len(),
                "taskq: batch members not counted yet (their batch row is held); the reaper will"
            );
        }
    });
}

/// Adds members to batch `id` and seals it when `seal`, in a savepoint of the caller's
/// transaction: locks the batch row, refuses as `rules::batch::may_add` says, inserts and
/// attaches the members, and writes the counters (a seal of a batch whose members have all
/// ended releases its callbacks here).
pub async fn batch_add(
    conn: &mut MySqlConnection,
    id: u64,
    members: &[NewTask<'_>],
    seal: bool,
) -> sqlx::Result<BatchAdded> {
    let mut tx = conn.begin().await?;
    let Some(mut b) = lock_batches(&mut tx, &[id], false).await?.pop() else {
        return Ok(BatchAdded::Refused(AddRefused::NotFound));
    };
    if let Err(r) = may_add(&b.counters) {
        return Ok(BatchAdded::Refused(r));
    }
    let task_ids = task_insert_rows(&mut tx, members).await?;
    attach(&mut tx, id, &task_ids, &[]).await?;
    if seal && !b.counters.sealed {
        sqlx::query!("UPDATE taskq_batches SET sealed = 1 WHERE id = ?", id)
            .execute(&mut *tx)
            .await?;
        b.counters.sealed = true;
    }
    let added = task_ids.len() as u64;
    let released = apply(&mut tx, &[(b, Delta::default(), added)]).await?;
    tx.commit().await?;
    Ok(BatchAdded::Added {
        task_ids,
        counted: BatchCounted {
            members: 0,
            released,
            deferred: Vec::new(),
        },
    })
}

struct BatchHead {
    id: u64,
    name: String,
    created_at: NaiveDateTime,
    total: u64,
    succeeded: u64,
    failed: u64,
    sealed: bool,
    completed_at: Option<NaiveDateTime>,
    succeeded_at: Option<NaiveDateTime>,
    canceled_at: Option<NaiveDateTime>,
    success_task_id: Option<u64>,
    complete_task_id: Option<u64>,
}

impl From<BatchHead> for BatchRow {
    fn from(h: BatchHead) -> Self {
        BatchRow {
            id: h.id,
            name: h.name,
            created_at: utc(h.created_at),
            total: h.total,
            succeeded: h.succeeded,
            failed: h.failed,
            sealed: h.sealed,
            completed_at: h.completed_at.map(utc),
            succeeded_at: h.succeeded_at.map(utc),
            canceled_at: h.canceled_at.map(utc),
            on_success: h.success_task_id.map(TaskId),
            on_complete: h.complete_task_id.map(TaskId),
        }
    }
}

impl Batches for MySqlDriver {
    /// Reads up to `limit` members through `ix_taskq_batch_member_counted` (the uncounted
    /// ones: the active batches' members; and those counted as failed) whose count is due,
    /// then counts them in one transaction.
    async fn batch_settle_stranded(
        &self,
        conn: &mut MySqlConnection,
        limit: u32,
    ) -> sqlx::Result<BatchCounted> {
        let ids = sqlx::query_scalar!(
            r#"SELECT m.task_id AS "id: u64"
               FROM taskq_batch_members m FORCE INDEX (ix_taskq_batch_member_counted)
                 LEFT JOIN taskq_tasks t FORCE INDEX (PRIMARY) ON t.id = m.task_id
               WHERE m.counted IN (0, 2)
                 AND ((m.counted = 0 AND (t.id IS NULL
                        OR t.state IN ('succeeded', 'dead', 'canceled', 'expired')))
                   OR (m.counted = 2 AND t.state IN ('waiting', 'pending', 'running')))
               LIMIT ?"#,
            limit
        )
        .fetch_all(&mut *conn)
        .await?;
        if ids.is_empty() {
            return Ok(BatchCounted::default());
        }
        let mut tx = conn.begin().await?;
        let out = count_members(&mut tx, &ids, true).await?;
        tx.commit().await?;
        Ok(out)
    }

    async fn batch_get(&self, id: u64) -> sqlx::Result<Option<BatchRow>> {
        let head = sqlx::query_as!(
            BatchHead,
            r#"SELECT id AS "id: u64", name, created_at AS "created_at: NaiveDateTime",
                 total AS "total: u64", succeeded AS "succeeded: u64", failed AS "failed: u64",
                 sealed AS "sealed: bool", completed_at AS "completed_at: NaiveDateTime",
                 succeeded_at AS "succeeded_at: NaiveDateTime",
                 canceled_at AS "canceled_at: NaiveDateTime",
                 success_task_id AS "success_task_id: u64",
                 complete_task_id AS "complete_task_id: u64"
               FROM taskq_batches WHERE id = ?"#,
            id
        )
        .fetch_optional(&self.pool)
        .await?;
        Ok(head.map(Into::into))
    }

    async fn batch_list(
        &self,
        name: Option<&str>,
        before_id: u64,
        limit: u32,
    ) -> sqlx::Result<Vec<BatchRow>> {
        let heads = sqlx::query_as!(
            BatchHead,
            r#"SELECT id AS "id: u64", name, created_at AS "created_at: NaiveDateTime",
                 total AS "total: u64", succeeded AS "succeeded: u64", failed AS "failed: u64",
                 sealed AS "sealed: bool", completed_at AS "completed_at: NaiveDateTime",
                 succeeded_at AS "succeeded_at: NaiveDateTime",
                 canceled_at AS "canceled_at: NaiveDateTime",
                 success_task_id AS "success_task_id: u64",
                 complete_task_id AS "complete_task_id: u64"
               FROM taskq_batches
               WHERE id < ? AND (? IS NULL OR name = ?)
               ORDER BY id DESC
               LIMIT ?"#,
            before_id,
            name,
            name,
            limit
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(heads.into_iter().map(Into::into).collect())
    }

    async fn batch_members(
        &self,
        id: u64,
        after_id: u64,
        limit: u32,
    ) -> sqlx::Result<Vec<BatchMemberRow>> {
        let rows = sqlx::query!(
            r#"SELECT m.task_id AS "task_id: u64", t.name AS "name: String",
                 t.queue AS "queue: String", t.state AS "state: String"
               FROM taskq_batch_members m FORCE INDEX (ix_taskq_batch_member)
                 LEFT JOIN taskq_tasks t FORCE INDEX (PRIMARY) ON t.id = m.task_id
               WHERE m.batch_id = ? AND m.task_id > ?
               ORDER BY m.task_id
               LIMIT ?"#,
            id,
            after_id,
            limit
        )
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter()
            .map(|r| {
                Ok(BatchMemberRow {
                    task_id: TaskId(r.task_id),
                    name: r.name.unwrap_or_default(),
                    queue: r.queue.unwrap_or_default(),
                    state: match r.state {
                        Some(s) => Some(
                            s.parse::<TaskState>()
                                .map_err(|e| sqlx::Error::Decode(Box::new(e)))?,
                        ),
                        None => None,
                    },
                })
            })
            .collect()
    }

    /// Locks the batch row, reads its members' states (a plain read), cancels the waiting
    /// and pending ones and the callbacks that have not started, asks the running ones to cancel, marks the
    /// batch canceled, and counts the members it canceled.
    async fn batch_cancel(
        &self,
        conn: &mut MySqlConnection,
        id: u64,
    ) -> sqlx::Result<BatchCanceled> {
        let Some(b) = lock_batches(conn, &[id], false).await?.pop() else {
            return Ok(BatchCanceled::default());
        };
        let members = sqlx::query!(
            r#"SELECT m.task_id AS "id: u64", t.state AS "state: String"
               FROM taskq_batch_members m FORCE INDEX (ix_taskq_batch_member)
                 STRAIGHT_JOIN taskq_tasks t FORCE INDEX (PRIMARY) ON t.id = m.task_id
               WHERE m.batch_id = ? AND t.state IN ('waiting', 'pending', 'running')"#,
            id
        )
        .fetch_all(&mut *conn)
        .await?;
        let (running, idle): (Vec<_>, Vec<_>) =
            members.into_iter().partition(|m| m.state == "running");
        let idle: Vec<u64> = idle.into_iter().map(|m| m.id).collect();
        let running: Vec<u64> = running.into_iter().map(|m| m.id).collect();
        let cbs: Vec<u64> = [b.success, b.complete].into_iter().flatten().collect();
        let mut out = BatchCanceled {
            found: true,
            ..BatchCanceled::default()
        };
        if !idle.is_empty() {
            out.canceled = sqlx::query!(
                r#"UPDATE JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$')) AS j
                     STRAIGHT_JOIN taskq_tasks t FORCE INDEX (PRIMARY) ON t.id = j.id
                   SET t.state = 'canceled', t.finished_at = UTC_TIMESTAMP(6),
                       t.updated_at = UTC_TIMESTAMP(6)
                   WHERE t.state IN ('waiting', 'pending')"#,
                json(&idle)?
            )
            .execute(&mut *conn)
            .await?
            .rows_affected();
        }
        if !cbs.is_empty() {
            out.callbacks_canceled = sqlx::query!(
                r#"UPDATE JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$')) AS j
                     STRAIGHT_JOIN taskq_tasks t FORCE INDEX (PRIMARY) ON t.id = j.id
                   SET t.state = 'canceled', t.finished_at = UTC_TIMESTAMP(6),
                       t.updated_at = UTC_TIMESTAMP(6)
                   WHERE t.state IN ('waiting', 'pending')"#,
                json(&cbs)?
            )
            .execute(&mut *conn)
            .await?
            .rows_affected();
        }
        if !running.is_empty() {
            out.cancel_requested = sqlx::query!(
                r#"UPDATE JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$')) AS j
                     STRAIGHT_JOIN taskq_tasks t FORCE INDEX (PRIMARY) ON t.id = j.id
                   SET t.cancel_requested_at = COALESCE(t.cancel_requested_at, UTC_TIMESTAMP(6)),
                       t.updated_at = UTC_TIMESTAMP(6)
                   WHERE t.state = 'running'"#,
                json(&running)?
            )
            .execute(&mut *conn)
            .await?
            .rows_affected();
        }
        sqlx::query!(
            r#"UPDATE taskq_batches SET canceled_at = COALESCE(canceled_at, UTC_TIMESTAMP(6))
               WHERE id = ?"#,
            id
        )
        .execute(&mut *conn)
        .await?;
        count_members(conn, &idle, false).await?;
        Ok(out)
    }

    /// Reads the `scan` oldest batches without a member's task left and without a callback
    /// still to run, then deletes their member rows and rows in one transaction.
    async fn batch_prune(&self, conn: &mut MySqlConnection, scan: u32) -> sqlx::Result<u64> {
        let ids = sqlx::query_scalar!(
            r#"SELECT b.id AS "id: u64"
               FROM (SELECT id, success_task_id, complete_task_id
                     FROM taskq_batches ORDER BY id LIMIT ?) AS b
               WHERE NOT EXISTS (
                   SELECT 1 FROM taskq_batch_members m FORCE INDEX (ix_taskq_batch_member)
                     STRAIGHT_JOIN taskq_tasks t FORCE INDEX (PRIMARY) ON t.id = m.task_id
                   WHERE m.batch_id = b.id)
                 AND NOT EXISTS (
                   SELECT 1 FROM taskq_tasks c FORCE INDEX (PRIMARY)
                   WHERE c.id IN (b.success_task_id, b.complete_task_id)
                     AND c.state IN ('waiting', 'pending', 'running'))"#,
            scan
        )
        .fetch_all(&mut *conn)
        .await?;
        if ids.is_empty() {
            return Ok(0);
        }
        let ids = json(&ids)?;
        let mut tx = conn.begin().await?;
        sqlx::query!(
            r#"DELETE m FROM JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$')) AS j
                 STRAIGHT_JOIN taskq_batch_members m FORCE INDEX (ix_taskq_batch_member)
                   ON m.batch_id = j.id"#,
            ids
        )
        .execute(&mut *tx)
        .await?;
        let n = sqlx::query!(
            r#"DELETE b FROM JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$')) AS j
                 STRAIGHT_JOIN taskq_batches b FORCE INDEX (PRIMARY) ON b.id = j.id"#,
            ids
        )
        .execute(&mut *tx)
        .await?
        .rows_affected();
        tx.commit().await?;
        Ok(n)
    }
}
