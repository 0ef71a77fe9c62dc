//! The operator's actions on tasks: cancel, request a cancel, delete, reschedule, set
//! priority, retry dead tasks (one, by ids, in bulk), and retention (prune).

use chrono::{DateTime, Utc};
use sqlx::SqliteConnection;
use taskq_driver::rows::RetryDead;
use taskq_driver::rules::{frees_identity, retry_retakes_identity};
use taskq_driver::state::{TaskId, TaskState};

use crate::clock::time_to_us;
use crate::connect::begin_write;
use crate::conv::{json, sid, sids, uid};
use crate::order::{Ended, order_retry, tasks_moved};

/// Cancels a pending task (freeing the unique identity it holds); returns whether it was
/// pending.
pub(crate) async fn task_cancel(conn: &mut SqliteConnection, id: TaskId) -> sqlx::Result<bool> {
    Ok(task_cancel_batch(conn, &[id.0]).await? == 1)
}

/// Cancels the pending and waiting tasks among `ids` (freeing their unique identities; an
/// ordered key's head promotes the key's next task) in one transaction; returns how many.
pub(crate) async fn task_cancel_batch(
    conn: &mut SqliteConnection,
    ids: &[u64],
) -> sqlx::Result<u64> {
    if ids.is_empty() {
        return Ok(0);
    }
    let json = json(&sids(ids))?;
    let mut tx = begin_write(conn).await?;
    let rows = sqlx::query!(
        r#"UPDATE taskq_tasks AS t
           SET state = 'canceled', finished_at = c.us, updated_at = c.us
           FROM taskq_clock AS c
           WHERE t.id IN (SELECT value FROM json_each(?1)) AND t.state IN ('pending', 'waiting')
           RETURNING id AS "id!: i64", unique_key AS "unique_key?: Vec<u8>",
             unique_while AS "unique_while?: String", order_key AS "order_key?: Vec<u8>",
             order_seq AS "order_seq?: i64""#,
        json
    )
    .fetch_all(&mut *tx)
    .await?;
    let count = rows.len() as u64;
    // A canceled head lets its key go on (a waiting task is no head: nothing changes).
    let moved = rows
        .into_iter()
        .map(|r| Ended {
            id: r.id,
            state: TaskState::Canceled,
            unique_key: r.unique_key,
            unique_while: r.unique_while,
            order_key: r.order_key,
            order_seq: r.order_seq,
            dead_skips: false,
        })
        .collect();
    tasks_moved(&mut tx, moved, frees_identity).await?;
    tx.commit().await?;
    Ok(count)
}

/// Deletes a task that is not running, and the unique identity it holds; whether a row was
/// deleted.
pub(crate) async fn task_delete(conn: &mut SqliteConnection, id: TaskId) -> sqlx::Result<bool> {
    let id = sid(id.0);
    let mut tx = begin_write(conn).await?;
    sqlx::query!(
        r#"DELETE FROM taskq_unique
           WHERE task_id = ?1
             AND unique_key = (SELECT unique_key FROM taskq_tasks WHERE id = ?1 AND state <> 'running')"#,
        id
    )
    .execute(&mut *tx)
    .await?;
    let done = sqlx::query!(
        r#"DELETE FROM taskq_tasks WHERE id = ?1 AND state <> 'running'
           RETURNING order_key AS "order_key?: Vec<u8>", order_seq AS "order_seq?: i64""#,
        id
    )
    .fetch_optional(&mut *tx)
    .await?;
    // A deleted head (pending, or dead holding its key) lets its key go on; for any other
    // task `order_advance` changes nothing.
    if let Some(r) = &done {
        let moved = Ended {
            id,
            state: TaskState::Canceled,
            unique_key: None,
            unique_while: None,
            order_key: r.order_key.clone(),
            order_seq: r.order_seq,
            dead_skips: false,
        };
        tasks_moved(&mut tx, vec![moved], frees_identity).await?;
    }
    tx.commit().await?;
    Ok(done.is_some())
}

/// Records a cancel request on a running task (kept from the first request); returns whether
/// the task was running. The worker's heartbeat stops renewing it and reports the request.
pub(crate) async fn task_request_cancel(
    conn: &mut SqliteConnection,
    id: TaskId,
) -> sqlx::Result<bool> {
    Ok(task_request_cancel_batch(conn, &[id.0]).await? == 1)
}

/// Records a cancel request on the running tasks among `ids`; returns how many were running.
pub(crate) async fn task_request_cancel_batch(
    conn: &mut SqliteConnection,
    ids: &[u64],
) -> sqlx::Result<u64> {
    if ids.is_empty() {
        return Ok(0);
    }
    let json = json(&sids(ids))?;
    let done = sqlx::query!(
        r#"UPDATE taskq_tasks AS t
           SET cancel_requested_at = COALESCE(t.cancel_requested_at, c.us), updated_at = c.us
           FROM taskq_clock AS c
           WHERE t.id IN (SELECT value FROM json_each(?1)) AND t.state = 'running'"#,
        json
    )
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected())
}

/// Moves a pending task's due time to `at`, or to `delay_us` from the database's now when
/// `at` is `None`; returns whether it was pending.
pub(crate) async fn task_reschedule(
    conn: &mut SqliteConnection,
    id: TaskId,
    at: Option<DateTime<Utc>>,
    delay_us: i64,
) -> sqlx::Result<bool> {
    let (id, at) = (sid(id.0), at.map(time_to_us));
    let done = sqlx::query!(
        r#"UPDATE taskq_tasks AS t
           SET run_at = COALESCE(?2, c.us + ?3), updated_at = c.us
           FROM taskq_clock AS c
           WHERE t.id = ?1 AND t.state = 'pending'"#,
        id,
        at,
        delay_us
    )
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Sets a pending task's priority; returns whether it was pending.
pub(crate) async fn task_set_priority(
    conn: &mut SqliteConnection,
    id: TaskId,
    priority: i16,
) -> sqlx::Result<bool> {
    let id = sid(id.0);
    let done = sqlx::query!(
        r#"UPDATE taskq_tasks AS t SET priority = ?2, updated_at = c.us
           FROM taskq_clock AS c
           WHERE t.id = ?1 AND t.state = 'pending'"#,
        id,
        priority
    )
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Moves a dead task back to pending (due now) with attempts reset and epoch + 1. A task
/// unique while pending or running takes its identity back, which fails (and changes nothing)
/// when another task holds it meanwhile; a windowed one does not (as on MySQL).
pub(crate) async fn task_retry_dead(
    conn: &mut SqliteConnection,
    id: TaskId,
) -> sqlx::Result<RetryDead> {
    let id = sid(id.0);
    let mut tx = begin_write(conn).await?;
    let row = sqlx::query!(
        r#"SELECT unique_key AS "unique_key?: Vec<u8>", unique_while AS "unique_while?: String",
             order_key AS "order_key?: Vec<u8>"
           FROM taskq_tasks WHERE id = ?1 AND state = 'dead'"#,
        id
    )
    .fetch_optional(&mut *tx)
    .await?;
    let Some(row) = row else {
        return Ok(RetryDead::NotDead);
    };
    let retake = row.unique_key.filter(|_| {
        row.unique_while
            .as_deref()
            .is_some_and(retry_retakes_identity)
    });
    if let Some(key) = retake {
        let taken = sqlx::query!(
            r#"INSERT INTO taskq_unique (unique_key, task_id, expires_at) VALUES (?1, ?2, NULL)
               ON CONFLICT (unique_key) DO NOTHING"#,
            key,
            id
        )
        .execute(&mut *tx)
        .await?;
        if taken.rows_affected() == 0 {
            let holder = sqlx::query_scalar!(
                r#"SELECT task_id AS "task_id!: i64" FROM taskq_unique WHERE unique_key = ?1"#,
                key
            )
            .fetch_one(&mut *tx)
            .await?;
            if holder != id {
                return Ok(RetryDead::IdentityHeld(TaskId(uid(holder))));
            }
        }
    }
    // An ordered task: its key's head stays the head; any other goes to the end of its key.
    let state = match &row.order_key {
        Some(key) => order_retry(&mut tx, key, id).await?,
        None => TaskState::Pending,
    }
    .as_str();
    sqlx::query!(
        r#"UPDATE taskq_tasks AS t
           SET state = ?2, attempt = 0, lease_epoch = t.lease_epoch + 1, run_at = c.us,
               finished_at = NULL, lease_until = NULL, updated_at = c.us
           FROM taskq_clock AS c
           WHERE t.id = ?1 AND t.state = 'dead'"#,
        id,
        state
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(RetryDead::Retried)
}

/// Retries the dead tasks among `ids` that hold no identity to take back (not unique, or
/// unique per window); returns how many. (Unique ones go one by one, [`task_retry_dead`].)
pub(crate) async fn task_retry_dead_ids(
    conn: &mut SqliteConnection,
    ids: &[u64],
) -> sqlx::Result<u64> {
    if ids.is_empty() {
        return Ok(0);
    }
    let json = json(&sids(ids))?;
    let done = sqlx::query!(
        r#"UPDATE taskq_tasks AS t
           SET state = 'pending', attempt = 0, lease_epoch = t.lease_epoch + 1, run_at = c.us,
               finished_at = NULL, lease_until = NULL, updated_at = c.us
           FROM taskq_clock AS c
           WHERE t.id IN (SELECT value FROM json_each(?1)) AND t.state = 'dead'
             AND (t.unique_key IS NULL OR t.unique_while = 'window') AND t.order_key IS NULL"#,
        json
    )
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected())
}

/// Moves up to `limit` dead tasks that take no identity back (of `queue`, or of every queue)
/// that died at or before `died_before` back to pending, like [`task_retry_dead_ids`], oldest
/// death first. The bound keeps a bulk retry from picking up tasks that die again while it
/// runs. Returns the count.
pub(crate) async fn task_retry_dead_batch(
    conn: &mut SqliteConnection,
    queue: Option<&str>,
    died_before: DateTime<Utc>,
    limit: u32,
) -> sqlx::Result<u64> {
    let died_before = time_to_us(died_before);
    let done = sqlx::query!(
        r#"UPDATE taskq_tasks AS t
           SET state = 'pending', attempt = 0, lease_epoch = t.lease_epoch + 1, run_at = c.us,
               finished_at = NULL, lease_until = NULL, updated_at = c.us
           FROM taskq_clock AS c
           WHERE t.id IN (
             SELECT id FROM taskq_tasks
             WHERE state = 'dead' AND (finished_at IS NULL OR finished_at <= ?1)
               AND (?2 IS NULL OR queue = ?2)
               AND (unique_key IS NULL OR unique_while = 'window') AND order_key IS NULL
             ORDER BY finished_at, id
             LIMIT ?3)"#,
        died_before,
        queue,
        limit
    )
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected())
}

/// Deletes up to `limit` tasks in terminal `state` that finished more than `age_secs` ago,
/// oldest first (on the partial index `ix_taskq_finished`). Returns the count.
pub(crate) async fn task_prune(
    conn: &mut SqliteConnection,
    state: TaskState,
    age_secs: u64,
    limit: u32,
) -> sqlx::Result<u64> {
    let state = state.as_str();
    let age_us = i64::try_from(age_secs.saturating_mul(1_000_000)).unwrap_or(i64::MAX);
    let done = sqlx::query!(
        r#"DELETE FROM taskq_tasks
           WHERE id IN (
             SELECT id FROM taskq_tasks
             WHERE state = ?1 AND finished_at < (SELECT us FROM taskq_clock) - ?2
               AND (order_key IS NULL OR NOT EXISTS (
                     SELECT 1 FROM taskq_order_keys AS k
                     WHERE k.order_key = taskq_tasks.order_key AND k.head_task_id = taskq_tasks.id))
             ORDER BY finished_at
             LIMIT ?3)"#,
        state,
        age_us,
        limit
    )
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected())
}
