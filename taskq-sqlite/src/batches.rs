//! Batches (`taskq_batches`, `taskq_batch_members`) on SQLite: the same statements as
//! taskq-mysql's `batches.rs` in SQLite's dialect (`json_each`, `UPDATE … FROM`); the
//! database's one writer at a time stands in for MySQL's row locks (so nothing is ever left
//! for the sweep because a batch row is held). How an end is counted and what the counters
//! release is `taskq_driver::rules::batch`'s.

use std::collections::BTreeMap;

use serde::Serialize;
use sqlx::{SqliteConnection, SqlitePool};

use crate::clock::{opt_time, time_from_us};
use crate::connect::begin_write;
use crate::conv::{json, sid, state, uid};
use crate::enqueue::task_insert_many;
use taskq_driver::rows::{
    BatchAdded, BatchCanceled, BatchCounted, BatchInserted, BatchMemberRow, BatchRow, Inserted,
    NewBatch, NewTask,
};
use taskq_driver::rules::batch::{
    AddRefused, BatchCounters, CANCELED_BY_BATCH, Counted, Delta, Success, callbacks, count,
    may_add,
};
use taskq_driver::state::TaskId;

/// Inserts tasks without key or identity; their ids in order.
async fn insert_tasks(
    conn: &mut SqliteConnection,
    rows: &[NewTask<'_>],
) -> sqlx::Result<Vec<TaskId>> {
    Ok(task_insert_many(conn, rows)
        .await?
        .into_iter()
        .map(|i| match i {
            Inserted::New(id) | Inserted::Duplicate(id) => id,
        })
        .collect())
}

/// Sets `batch_id` on the members and makes the callbacks `waiting`, then inserts the member
/// rows.
async fn attach(
    conn: &mut SqliteConnection,
    id: i64,
    members: &[TaskId],
    callbacks: &[TaskId],
) -> sqlx::Result<()> {
    let rows: Vec<(i64, bool)> = members
        .iter()
        .map(|t| (sid(t.0), true))
        .chain(callbacks.iter().map(|t| (sid(t.0), false)))
        .collect();
    if rows.is_empty() {
        return Ok(());
    }
    sqlx::query!(
        r#"UPDATE taskq_tasks AS t
           SET batch_id = CASE WHEN j.value ->> '$[1]' THEN ?2 END,
               state = CASE WHEN j.value ->> '$[1]' THEN t.state ELSE 'waiting' END
           FROM json_each(?1) AS j
           WHERE t.id = j.value ->> '$[0]'"#,
        json(&rows)?,
        id
    )
    .execute(&mut *conn)
    .await?;
    if !members.is_empty() {
        let ids: Vec<i64> = members.iter().map(|t| sid(t.0)).collect();
        sqlx::query!(
            r#"INSERT INTO taskq_batch_members (task_id, batch_id)
               SELECT j.value, ?2 FROM json_each(?1) AS j"#,
            json(&ids)?,
            id
        )
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

/// Inserts a batch atomically (a savepoint of the caller's transaction, or a `BEGIN
/// IMMEDIATE` transaction of its own): its members' and callbacks' tasks, the batch row, the
/// members' batch and the callbacks' `waiting` state, the member rows.
pub(crate) async fn batch_insert(
    conn: &mut SqliteConnection,
    b: &NewBatch<'_>,
) -> sqlx::Result<BatchInserted> {
    let mut tx = begin_write(conn).await?;
    let mut rows: Vec<NewTask<'_>> = b.members.to_vec();
    rows.extend(b.on_success);
    rows.extend(b.on_complete);
    let mut ids = insert_tasks(&mut tx, &rows).await?;
    if ids.len() != rows.len() {
        return Err(sqlx::Error::Protocol(format!(
            "batch insert of {} tasks returned {} ids",
            rows.len(),
            ids.len()
        )));
    }
    let on_complete = b.on_complete.is_some().then(|| ids.pop()).flatten();
    let on_success = b.on_success.is_some().then(|| ids.pop()).flatten();
    let total = ids.len() as i64;
    let id = sqlx::query_scalar!(
        r#"INSERT INTO taskq_batches
             (name, created_at, total, sealed, success_task_id, complete_task_id)
           SELECT ?1, c.us, ?2, ?3, ?4, ?5 FROM taskq_clock AS c
           RETURNING id AS "id!: i64""#,
        b.name,
        total,
        b.sealed,
        on_success.map(|t| sid(t.0)),
        on_complete.map(|t| sid(t.0))
    )
    .fetch_one(&mut *tx)
    .await?;
    let cbs: Vec<TaskId> = on_success.into_iter().chain(on_complete).collect();
    attach(&mut tx, id, &ids, &cbs).await?;
    tx.commit().await?;
    Ok(BatchInserted {
        id: uid(id),
        task_ids: ids,
        on_success,
        on_complete,
    })
}

/// A batch row read by a count, an add or a cancel (in the write transaction).
struct Locked {
    id: i64,
    counters: BatchCounters,
    success: Option<i64>,
    complete: Option<i64>,
}

async fn read_batches(conn: &mut SqliteConnection, ids: &[i64]) -> sqlx::Result<Vec<Locked>> {
    let rows = sqlx::query!(
        r#"SELECT b.id AS "id!: i64", b.total AS "total!: i64", b.succeeded AS "succeeded!: i64",
             b.failed AS "failed!: i64", b.sealed AS "sealed!: bool",
             (b.canceled_at IS NOT NULL) AS "canceled!: bool",
             (b.completed_at IS NOT NULL) AS "completed!: bool",
             (b.succeeded_at IS NOT NULL) AS "success_released!: bool",
             b.success_task_id AS "success_task_id?: i64",
             b.complete_task_id AS "complete_task_id?: i64"
           FROM json_each(?1) AS j JOIN taskq_batches AS b ON b.id = j.value
           ORDER BY b.id"#,
        json(ids)?
    )
    .fetch_all(&mut *conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| Locked {
            id: r.id,
            counters: BatchCounters {
                total: uid(r.total),
                succeeded: uid(r.succeeded),
                failed: uid(r.failed),
                sealed: r.sealed,
                canceled: r.canceled,
                completed: r.completed,
                success_released: r.success_released,
            },
            success: r.success_task_id,
            complete: r.complete_task_id,
        })
        .collect())
}

/// Applies counter changes and releases what they complete (see taskq-mysql's `apply`);
/// the callbacks made due (or brought back) with their queues.
async fn apply(
    conn: &mut SqliteConnection,
    changes: &[(Locked, Delta, u64)],
) -> sqlx::Result<Vec<(TaskId, String)>> {
    #[derive(Serialize)]
    struct BatchJson(i64, u64, u64, u64, bool, bool);
    let mut rows: Vec<BatchJson> = Vec::new();
    // (task id, op): 0 make due, 1 bring back from CANCELED_BY_BATCH, 2 cancel.
    let mut ops: Vec<(i64, u8)> = Vec::new();
    for (b, delta, added) in changes {
        let mut c = b.counters;
        c.total += added;
        c.succeeded = (c.succeeded as i64 + delta.succeeded).max(0) as u64;
        c.failed = (c.failed as i64 + delta.failed).max(0) as u64;
        let cb = callbacks(&c);
        if let (true, Some(t)) = (cb.complete, b.complete) {
            ops.push((t, 0));
        }
        match (cb.success, b.success) {
            (Success::Release, Some(t)) => ops.push((t, 0)),
            (Success::Revive, Some(t)) => ops.push((t, 1)),
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
            r#"UPDATE taskq_batches AS b
               SET total = j.value ->> '$[1]', succeeded = j.value ->> '$[2]',
                   failed = j.value ->> '$[3]',
                   completed_at = CASE WHEN j.value ->> '$[4]' THEN COALESCE(b.completed_at, c.us)
                                       ELSE b.completed_at END,
                   succeeded_at = CASE WHEN j.value ->> '$[5]' THEN COALESCE(b.succeeded_at, c.us)
                                       ELSE b.succeeded_at END
               FROM json_each(?1) AS j, taskq_clock AS c
               WHERE b.id = j.value ->> '$[0]'"#,
            json(&rows)?
        )
        .execute(&mut *conn)
        .await?;
    }
    if ops.is_empty() {
        return Ok(Vec::new());
    }
    let released = sqlx::query!(
        r#"UPDATE taskq_tasks AS t
           SET state = CASE WHEN j.value ->> '$[1]' = 2 THEN 'canceled' ELSE 'pending' END,
               run_at = CASE WHEN j.value ->> '$[1]' = 2 THEN t.run_at ELSE MAX(t.run_at, c.us) END,
               finished_at = CASE WHEN j.value ->> '$[1]' = 2 THEN c.us END,
               last_error = CASE WHEN j.value ->> '$[1]' = 2 THEN ?2 END,
               updated_at = c.us
           FROM json_each(?1) AS j, taskq_clock AS c
           WHERE t.id = j.value ->> '$[0]'
             AND ((j.value ->> '$[1]' IN (0, 2) AND t.state = 'waiting')
               OR (j.value ->> '$[1]' = 1 AND t.state = 'canceled' AND t.last_error = ?2))
           RETURNING id AS "id!: i64", queue AS "queue!: String", state AS "state!: String""#,
        json(&ops)?,
        CANCELED_BY_BATCH
    )
    .fetch_all(&mut *conn)
    .await?;
    Ok(released
        .into_iter()
        .filter(|r| r.state == "pending")
        .map(|r| (TaskId(uid(r.id)), r.queue))
        .collect())
}

/// Counts the ends of the members `ids` (inside the caller's write transaction), as
/// `rules::batch::count` says, and releases the callbacks of the batches they complete.
pub(crate) async fn count_members(
    conn: &mut SqliteConnection,
    ids: &[u64],
) -> sqlx::Result<BatchCounted> {
    let mut out = BatchCounted::default();
    if ids.is_empty() {
        return Ok(out);
    }
    let ids: Vec<i64> = ids.iter().map(|&i| sid(i)).collect();
    let members = sqlx::query!(
        r#"SELECT m.task_id AS "task_id!: i64", m.batch_id AS "batch_id!: i64",
             m.counted AS "counted!: i64", t.state AS "state?: String"
           FROM json_each(?1) AS j
             JOIN taskq_batch_members AS m ON m.task_id = j.value
             LEFT JOIN taskq_tasks AS t ON t.id = m.task_id
           ORDER BY m.task_id"#,
        json(&ids)?
    )
    .fetch_all(&mut *conn)
    .await?;
    let mut per_batch: BTreeMap<i64, (Delta, Vec<(i64, i8)>)> = BTreeMap::new();
    for m in members {
        let st = match m.state.as_deref() {
            Some(s) => Some(state(s)?),
            None => None,
        };
        let prev = Counted::from_i8(m.counted as i8);
        let (next, delta) = count(prev, st);
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
    let batch_ids: Vec<i64> = per_batch.keys().copied().collect();
    let mut member_rows: Vec<(i64, i8)> = Vec::new();
    let mut changes = Vec::new();
    for b in read_batches(conn, &batch_ids).await? {
        if let Some((delta, rows)) = per_batch.remove(&b.id) {
            member_rows.extend(rows);
            changes.push((b, delta, 0));
        }
    }
    if !member_rows.is_empty() {
        sqlx::query!(
            r#"UPDATE taskq_batch_members AS m SET counted = j.value ->> '$[1]'
               FROM json_each(?1) AS j
               WHERE m.task_id = j.value ->> '$[0]'"#,
            json(&member_rows)?
        )
        .execute(&mut *conn)
        .await?;
    }
    out.members = member_rows.len() as u64;
    out.released = apply(conn, &changes).await?;
    Ok(out)
}

/// Adds members to batch `id` and seals it when `seal`, atomically (see taskq-mysql's
/// `batch_add`).
pub(crate) async fn batch_add(
    conn: &mut SqliteConnection,
    id: u64,
    members: &[NewTask<'_>],
    seal: bool,
) -> sqlx::Result<BatchAdded> {
    let mut tx = begin_write(conn).await?;
    // A write first: in a caller's deferred transaction it takes the write lock (waiting the
    // busy timeout) before the read, which could not be upgraded to a write once another
    // connection had written.
    sqlx::query!(
        "UPDATE taskq_batches SET sealed = sealed WHERE id = ?1",
        sid(id)
    )
    .execute(&mut *tx)
    .await?;
    let Some(mut b) = read_batches(&mut tx, &[sid(id)]).await?.pop() else {
        return Ok(BatchAdded::Refused(AddRefused::NotFound));
    };
    if let Err(r) = may_add(&b.counters) {
        return Ok(BatchAdded::Refused(r));
    }
    let task_ids = insert_tasks(&mut tx, members).await?;
    attach(&mut tx, b.id, &task_ids, &[]).await?;
    if seal && !b.counters.sealed {
        sqlx::query!("UPDATE taskq_batches SET sealed = 1 WHERE id = ?1", b.id)
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

/// Up to `limit` members whose count is due (ended or deleted and not counted; counted as
/// failed and running again), counted in one write transaction.
pub(crate) async fn batch_settle_stranded(
    conn: &mut SqliteConnection,
    limit: u32,
) -> sqlx::Result<BatchCounted> {
    let ids = sqlx::query_scalar!(
        r#"SELECT m.task_id AS "id!: i64"
           FROM taskq_batch_members AS m
             LEFT JOIN taskq_tasks AS t ON t.id = m.task_id
           WHERE m.counted IN (0, 2)
             AND ((m.counted = 0 AND (t.id IS NULL
                    OR t.state IN ('succeeded', 'dead', 'canceled', 'expired')))
               OR (m.counted = 2 AND t.state IN ('waiting', 'pending', 'running')))
           LIMIT ?1"#,
        limit
    )
    .fetch_all(&mut *conn)
    .await?;
    if ids.is_empty() {
        return Ok(BatchCounted::default());
    }
    let ids: Vec<u64> = ids.into_iter().map(uid).collect();
    let mut tx = begin_write(conn).await?;
    let out = count_members(&mut tx, &ids).await?;
    tx.commit().await?;
    Ok(out)
}

struct Head {
    id: i64,
    name: String,
    created_at: i64,
    total: i64,
    succeeded: i64,
    failed: i64,
    sealed: bool,
    completed_at: Option<i64>,
    succeeded_at: Option<i64>,
    canceled_at: Option<i64>,
    success_task_id: Option<i64>,
    complete_task_id: Option<i64>,
}

fn row(h: Head) -> sqlx::Result<BatchRow> {
    Ok(BatchRow {
        id: uid(h.id),
        name: h.name,
        created_at: time_from_us(h.created_at)?,
        total: uid(h.total),
        succeeded: uid(h.succeeded),
        failed: uid(h.failed),
        sealed: h.sealed,
        completed_at: opt_time(h.completed_at)?,
        succeeded_at: opt_time(h.succeeded_at)?,
        canceled_at: opt_time(h.canceled_at)?,
        on_success: h.success_task_id.map(|t| TaskId(uid(t))),
        on_complete: h.complete_task_id.map(|t| TaskId(uid(t))),
    })
}

/// A batch with its counters.
pub(crate) async fn batch_get(pool: &SqlitePool, id: u64) -> sqlx::Result<Option<BatchRow>> {
    let head = sqlx::query_as!(
        Head,
        r#"SELECT id AS "id!: i64", name, created_at, total, succeeded, failed,
             sealed AS "sealed!: bool", completed_at, succeeded_at, canceled_at,
             success_task_id, complete_task_id
           FROM taskq_batches WHERE id = ?1"#,
        sid(id)
    )
    .fetch_optional(pool)
    .await?;
    head.map(row).transpose()
}

/// A page of batches, newest first.
pub(crate) async fn batch_list(
    pool: &SqlitePool,
    name: Option<&str>,
    before_id: u64,
    limit: u32,
) -> sqlx::Result<Vec<BatchRow>> {
    let heads = sqlx::query_as!(
        Head,
        r#"SELECT id AS "id!: i64", name, created_at, total, succeeded, failed,
             sealed AS "sealed!: bool", completed_at, succeeded_at, canceled_at,
             success_task_id, complete_task_id
           FROM taskq_batches
           WHERE id < ?1 AND (?2 IS NULL OR name = ?2)
           ORDER BY id DESC
           LIMIT ?3"#,
        sid(before_id),
        name,
        limit
    )
    .fetch_all(pool)
    .await?;
    heads.into_iter().map(row).collect()
}

/// A page of a batch's members by task id.
pub(crate) async fn batch_members(
    pool: &SqlitePool,
    id: u64,
    after_id: u64,
    limit: u32,
) -> sqlx::Result<Vec<BatchMemberRow>> {
    let rows = sqlx::query!(
        r#"SELECT m.task_id AS "task_id!: i64", t.name AS "name?: String",
             t.queue AS "queue?: String", t.state AS "state?: String"
           FROM taskq_batch_members AS m LEFT JOIN taskq_tasks AS t ON t.id = m.task_id
           WHERE m.batch_id = ?1 AND m.task_id > ?2
           ORDER BY m.task_id
           LIMIT ?3"#,
        sid(id),
        sid(after_id),
        limit
    )
    .fetch_all(pool)
    .await?;
    rows.into_iter()
        .map(|r| {
            Ok(BatchMemberRow {
                task_id: TaskId(uid(r.task_id)),
                name: r.name.unwrap_or_default(),
                queue: r.queue.unwrap_or_default(),
                state: r.state.as_deref().map(state).transpose()?,
            })
        })
        .collect()
}

/// Cancels a batch on the caller's transaction: its waiting and pending members and the
/// callbacks that have not started are canceled, its running members asked to cancel, the
/// batch marked canceled, and the members it canceled counted.
pub(crate) async fn batch_cancel(
    conn: &mut SqliteConnection,
    id: u64,
) -> sqlx::Result<BatchCanceled> {
    let Some(b) = read_batches(conn, &[sid(id)]).await?.pop() else {
        return Ok(BatchCanceled::default());
    };
    let canceled = sqlx::query_scalar!(
        r#"UPDATE taskq_tasks AS t
           SET state = 'canceled', finished_at = c.us, updated_at = c.us
           FROM taskq_batch_members AS m, taskq_clock AS c
           WHERE m.batch_id = ?1 AND t.id = m.task_id AND t.state IN ('waiting', 'pending')
           RETURNING id AS "id!: i64""#,
        b.id
    )
    .fetch_all(&mut *conn)
    .await?;
    let cbs: Vec<i64> = [b.success, b.complete].into_iter().flatten().collect();
    let callbacks_canceled = if cbs.is_empty() {
        0
    } else {
        sqlx::query!(
            r#"UPDATE taskq_tasks AS t
               SET state = 'canceled', finished_at = c.us, updated_at = c.us
               FROM json_each(?1) AS j, taskq_clock AS c
               WHERE t.id = j.value AND t.state IN ('waiting', 'pending')"#,
            json(&cbs)?
        )
        .execute(&mut *conn)
        .await?
        .rows_affected()
    };
    let cancel_requested = sqlx::query!(
        r#"UPDATE taskq_tasks AS t
           SET cancel_requested_at = COALESCE(t.cancel_requested_at, c.us), updated_at = c.us
           FROM taskq_batch_members AS m, taskq_clock AS c
           WHERE m.batch_id = ?1 AND t.id = m.task_id AND t.state = 'running'"#,
        b.id
    )
    .execute(&mut *conn)
    .await?
    .rows_affected();
    sqlx::query!(
        r#"UPDATE taskq_batches
           SET canceled_at = COALESCE(canceled_at, (SELECT us FROM taskq_clock))
           WHERE id = ?1"#,
        b.id
    )
    .execute(&mut *conn)
    .await?;
    let ids: Vec<u64> = canceled.iter().map(|&i| uid(i)).collect();
    count_members(conn, &ids).await?;
    Ok(BatchCanceled {
        found: true,
        canceled: ids.len() as u64,
        cancel_requested,
        callbacks_canceled,
    })
}

/// Deletes the batches, among the `scan` oldest, without a member's task left and without a
/// callback still to run, with their member rows, in one write transaction.
pub(crate) async fn batch_prune(conn: &mut SqliteConnection, scan: u32) -> sqlx::Result<u64> {
    let mut tx = begin_write(conn).await?;
    let ids = sqlx::query_scalar!(
        r#"SELECT b.id AS "id!: i64"
           FROM (SELECT id, success_task_id, complete_task_id
                 FROM taskq_batches ORDER BY id LIMIT ?1) AS b
           WHERE NOT EXISTS (
               SELECT 1 FROM taskq_batch_members AS m JOIN taskq_tasks AS t ON t.id = m.task_id
               WHERE m.batch_id = b.id)
             AND NOT EXISTS (
               SELECT 1 FROM taskq_tasks AS c
               WHERE c.id IN (b.success_task_id, b.complete_task_id)
                 AND c.state IN ('waiting', 'pending', 'running'))"#,
        scan
    )
    .fetch_all(&mut *tx)
    .await?;
    if ids.is_empty() {
        return Ok(0);
    }
    let ids = json(&ids)?;
    sqlx::query!(
        r#"DELETE FROM taskq_batch_members WHERE batch_id IN (SELECT value FROM json_each(?1))"#,
        ids
    )
    .execute(&mut *tx)
    .await?;
    let n = sqlx::query!(
        r#"DELETE FROM taskq_batches WHERE id IN (SELECT value FROM json_each(?1))"#,
        ids
    )
    .execute(&mut *tx)
    .await?
    .rows_affected();
    tx.commit().await?;
    Ok(n)
}
