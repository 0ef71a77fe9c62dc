//! Ordered tasks (`taskq_order_keys`): the ordered enqueue, the promotion of a key's next
//! task when its head ends, and the keys held back by a failing head.
//!
//! Lock order, the same in every transaction: the task rows that end (locked by the statement
//! that ends them), then the keys' rows in `taskq_order_keys` **in key order** (the stored
//! 32-byte key's byte order, `rules::order_ends`; never by task id), each followed by its
//! key's next waiting task. The enqueue locks only the key's row before inserting its new row,
//! so it never waits for a task row while holding the key; a producer transaction that
//! enqueues on several keys waits for no worker's transaction in a cycle as long as it takes
//! its keys in that same order (one key per transaction always does).

use std::time::{Duration, Instant};

use sqlx::{Connection, MySqlConnection, MySqlPool};

use crate::enqueue::{Place, insert_row};
use taskq_driver::rows::{HeldKey, Inserted, NewTask, OrderKey};
use taskq_driver::rules::{self, OrderEnd, ordered_enqueue_state};
use taskq_driver::state::{TaskId, TaskState};

/// Inserts an ordered task on `conn`: the key's row is upserted first (`next_seq + 1`), which
/// locks it until the caller's transaction ends, so two enqueues of one key take their
/// numbers in the order they commit; then the task row is inserted `pending` and made the
/// key's head when the key has none, `waiting` otherwise (`rules::ordered_enqueue_state`).
/// All of it runs in a savepoint of the caller's transaction (outside one, in a short
/// transaction of its own), as on SQLite: an error midway, or the future dropped midway (a
/// timeout around the enqueue), rolls back to the savepoint, so a caller that commits anyway
/// never commits a task `pending` without its key recording it as the head (two heads of one
/// key would run at once). A duplicate idempotency key undoes it all and returns the holder.
pub async fn task_insert_ordered(
    conn: &mut MySqlConnection,
    t: &NewTask<'_>,
    order: &OrderKey<'_>,
) -> sqlx::Result<Inserted> {
    if t.unique_key.is_some() {
        return Err(sqlx::Error::Protocol(
            "an ordered task has no unique identity".into(),
        ));
    }
    // A SAVEPOINT inside the caller's transaction, a BEGIN outside one; dropped before its
    // commit (an error, or this future dropped), sqlx rolls it back.
    let mut tx = conn.begin().await?;
    let out = insert(&mut tx, t, order).await?;
    match out {
        Inserted::New(_) => tx.commit().await?,
        Inserted::Duplicate(_) => tx.rollback().await?,
    }
    Ok(out)
}

async fn insert(
    conn: &mut MySqlConnection,
    t: &NewTask<'_>,
    order: &OrderKey<'_>,
) -> sqlx::Result<Inserted> {
    let (next_seq, head) = key_count_up(conn, order.key).await?;
    let state = ordered_enqueue_state(head.is_some());
    let place = Place {
        key: order.key,
        seq: next_seq,
        dead_skips: order.dead_skips,
        state,
    };
    let id = match insert_row(conn, t, Some(&place)).await? {
        Ok(id) => id,
        Err(holder) => return Ok(Inserted::Duplicate(holder)),
    };
    if state == TaskState::Pending {
        sqlx::query!(
            "UPDATE taskq_order_keys SET head_task_id = ? WHERE order_key = ?",
            id.0,
            order.key
        )
        .execute(&mut *conn)
        .await?;
    }
    Ok(Inserted::New(id))
}

/// Counts `key`'s row up (`next_seq + 1`, inserted at 1 for a new key) and reads it back
/// locked until the transaction ends: the number just taken and the head recorded.
async fn key_count_up(conn: &mut MySqlConnection, key: &[u8]) -> sqlx::Result<(u64, Option<u64>)> {
    sqlx::query!(
        r#"INSERT INTO taskq_order_keys (order_key, next_seq, head_task_id) VALUES (?, 1, NULL)
           ON DUPLICATE KEY UPDATE next_seq = next_seq + 1"#,
        key
    )
    .execute(&mut *conn)
    .await?;
    let row = sqlx::query!(
        r#"SELECT next_seq AS "next_seq: u64", head_task_id AS "head_task_id: u64"
           FROM taskq_order_keys WHERE order_key = ? FOR UPDATE"#,
        key
    )
    .fetch_one(&mut *conn)
    .await?;
    Ok((row.next_seq, row.head_task_id))
}

/// After the task `ended` stopped being its key's head (it succeeded, was canceled, was
/// deleted, or died and lets its key go on), on the transaction that ended it: if it is the
/// head recorded for `key`, promotes the key's next waiting task (lowest sequence number above
/// the ended one's) to `pending` and records it as the head, or records none. Returns the
/// promoted task. A task that is not the key's head changes nothing, so this may be called
/// for any ordered task that ended.
pub async fn order_advance(
    conn: &mut MySqlConnection,
    key: &[u8],
    ended: u64,
    ended_seq: u64,
) -> sqlx::Result<Option<u64>> {
    let done = sqlx::query!(
        r#"UPDATE taskq_order_keys SET head_task_id = NULL
           WHERE order_key = ? AND head_task_id = ?"#,
        key,
        ended
    )
    .execute(&mut *conn)
    .await?;
    if done.rows_affected() == 0 {
        return Ok(None);
    }
    // The waiting tasks of a key all come after its head (enqueues append; a retried task
    // takes a new number), so the search starts at the ended head's number. Locking: it reads
    // the latest committed rows, and a cancel of the task found cannot slip in between.
    let next = sqlx::query_scalar!(
        r#"SELECT id AS "id: u64" FROM taskq_tasks FORCE INDEX (ix_taskq_order)
           WHERE order_key = ? AND order_seq > ? AND state = 'waiting'
           ORDER BY order_seq LIMIT 1 FOR UPDATE"#,
        key,
        ended_seq
    )
    .fetch_optional(&mut *conn)
    .await?;
    let Some(next) = next else {
        return Ok(None);
    };
    sqlx::query!(
        r#"UPDATE taskq_tasks SET state = 'pending', updated_at = UTC_TIMESTAMP(6)
           WHERE id = ? AND state = 'waiting'"#,
        next
    )
    .execute(&mut *conn)
    .await?;
    sqlx::query!(
        "UPDATE taskq_order_keys SET head_task_id = ? WHERE order_key = ?",
        next,
        key
    )
    .execute(&mut *conn)
    .await?;
    Ok(Some(next))
}

/// [`order_advance`] for tasks by id: reads each one's key and number (the rows are locked
/// already by the statement that ended them) and advances the ordered ones in
/// `rules::order_ends` order, by key: every transaction that advances keys takes their rows in
/// that one order, never by task id (two write-backs, or a write-back and a producer that
/// takes its keys in that order, never deadlock on key rows).
pub async fn order_advance_ids(conn: &mut MySqlConnection, ids: &[u64]) -> sqlx::Result<()> {
    if ids.is_empty() {
        return Ok(());
    }
    let json = serde_json::to_string(ids).expect("ids serialize");
    let rows = sqlx::query!(
        r#"SELECT t.id AS "id: u64", t.order_key AS "order_key!: Vec<u8>",
             t.order_seq AS "order_seq!: u64"
           FROM JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$')) AS j
             STRAIGHT_JOIN taskq_tasks t FORCE INDEX (PRIMARY) ON t.id = j.id
           WHERE t.order_key IS NOT NULL
           ORDER BY t.id"#,
        json
    )
    .fetch_all(&mut *conn)
    .await?;
    let ends = rows.into_iter().map(|r| OrderEnd {
        key: r.order_key,
        id: r.id,
        seq: r.order_seq,
    });
    order_advance_all(conn, &rules::order_ends(ends)).await
}

/// [`order_advance_ids`] for the transactions that end a run (the write-back, the claim's
/// expiry, the reap), which hold the rows of a batch of tasks that heartbeats renew: a key
/// whose row another transaction holds (a producer enqueueing on it, until its commit) is not
/// waited for; its row is taken `FOR UPDATE SKIP LOCKED` (keys in `rules::order_ends` order),
/// and a key skipped is returned, to be advanced after the commit by
/// [`order_advance_later`], so the transaction never waits for a producer while holding task
/// rows. The ended head stays recorded as its key's head until then: if the process ends
/// first, [`order_keys_advance_stranded`] (the reaper) finds the key and advances it.
pub async fn order_advance_ids_or_skip(
    conn: &mut MySqlConnection,
    ids: &[u64],
) -> sqlx::Result<Vec<OrderEnd>> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let json = serde_json::to_string(ids).expect("ids serialize");
    let rows = sqlx::query!(
        r#"SELECT t.id AS "id: u64", t.order_key AS "order_key!: Vec<u8>",
             t.order_seq AS "order_seq!: u64"
           FROM JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$')) AS j
             STRAIGHT_JOIN taskq_tasks t FORCE INDEX (PRIMARY) ON t.id = j.id
           WHERE t.order_key IS NOT NULL
           ORDER BY t.id"#,
        json
    )
    .fetch_all(&mut *conn)
    .await?;
    let ends = rules::order_ends(rows.into_iter().map(|r| OrderEnd {
        key: r.order_key,
        id: r.id,
        seq: r.order_seq,
    }));
    let mut skipped = Vec::new();
    for e in ends {
        if key_lock_if_free(conn, &e.key).await? {
            order_advance(conn, &e.key, e.id, e.seq).await?;
        } else {
            skipped.push(e);
        }
    }
    Ok(skipped)
}

/// Locks `key`'s row unless another transaction holds it; whether it is locked now.
async fn key_lock_if_free(conn: &mut MySqlConnection, key: &[u8]) -> sqlx::Result<bool> {
    let row = sqlx::query_scalar!(
        r#"SELECT 1 AS "one: i64" FROM taskq_order_keys WHERE order_key = ?
           FOR UPDATE SKIP LOCKED"#,
        key
    )
    .fetch_optional(&mut *conn)
    .await?;
    Ok(row.is_some())
}

/// Advances one key after the transaction that ended its head, in a short transaction of its
/// own, if its row and the ended head's row are free (both `SKIP LOCKED`: it waits for
/// nothing, so it deadlocks with nothing, e.g. an operator's retry of that task, which locks
/// the task's row, then the key's): whether it was done. The head is advanced only if its
/// state still ends it (`rules::ends_order_head`; a dead head an operator retried meanwhile
/// stays the head) and its key still records it (`order_advance`).
async fn order_advance_if_free(conn: &mut MySqlConnection, e: &OrderEnd) -> sqlx::Result<bool> {
    let mut tx = conn.begin().await?;
    if !key_lock_if_free(&mut tx, &e.key).await? {
        tx.rollback().await?;
        return Ok(false);
    }
    let head = sqlx::query!(
        r#"SELECT state AS "state: TaskState", order_dead_skips AS "dead_skips: bool"
           FROM taskq_tasks WHERE id = ? FOR UPDATE SKIP LOCKED"#,
        e.id
    )
    .fetch_optional(&mut *tx)
    .await?;
    let Some(head) = head else {
        // Locked by another transaction (or deleted, which advanced the key itself).
        tx.rollback().await?;
        return Ok(false);
    };
    if rules::ends_order_head(head.state, head.dead_skips) {
        order_advance(&mut tx, &e.key, e.id, e.seq).await?;
    }
    tx.commit().await?;
    Ok(true)
}

/// How long [`order_advance_later`] keeps trying a key before it leaves it to the reaper.
const ADVANCE_LATER_FOR: Duration = Duration::from_secs(600);

/// Advances the keys a committed transaction skipped ([`order_advance_ids_or_skip`]), on a
/// task of its own: each key in a short transaction that takes its row `SKIP LOCKED` once the
/// producer holding it has committed, polled every 5 ms at first, backing off to 200 ms; it
/// holds a connection of `pool` only for each try, never while waiting. Gives a key up to the
/// reaper's [`order_keys_advance_stranded`] after 10 minutes (or when the process ends).
pub fn order_advance_later(pool: &MySqlPool, ends: Vec<OrderEnd>) {
    if ends.is_empty() {
        return;
    }
    let pool = pool.clone();
    tokio::spawn(async move {
        let start = Instant::now();
        let mut left = ends;
        let mut pause = Duration::from_millis(5);
        while !left.is_empty() && start.elapsed() < ADVANCE_LATER_FOR {
            tokio::time::sleep(pause).await;
            let mut still = Vec::new();
            for e in left {
                let tried = match pool.acquire().await {
                    Ok(mut c) => order_advance_if_free(&mut c, &e).await,
                    Err(err) => Err(err),
                };
                match tried {
                    Ok(true) => {}
                    Ok(false) => still.push(e),
                    Err(err) => {
                        tracing::debug!(error = %err, task_id = e.id, "taskq: order key advance failed; trying again");
                        still.push(e);
                    }
                }
            }
            left = still;
            pause = (pause * 2).min(Duration::from_millis(200));
        }
        if !left.is_empty() {
            tracing::warn!(
                keys = left.len(),
                "taskq: order keys not advanced yet; the reaper will"
            );
        }
    });
}

/// See `Leases::order_keys_advance_stranded`: keys whose recorded head has ended (succeeded,
/// canceled, expired, or dead letting its key go on) are advanced, up to `limit`, each in a
/// short transaction of its own that takes its row `SKIP LOCKED` (a key a producer holds is
/// left for the next call). Reads every key that has a head (one row per live key).
pub async fn order_keys_advance_stranded(
    conn: &mut MySqlConnection,
    limit: u32,
) -> sqlx::Result<u64> {
    let rows = sqlx::query!(
        r#"SELECT k.order_key AS "order_key: Vec<u8>", t.id AS "id: u64",
             t.order_seq AS "order_seq!: u64"
           FROM taskq_order_keys k
             STRAIGHT_JOIN taskq_tasks t FORCE INDEX (PRIMARY) ON t.id = k.head_task_id
           WHERE k.head_task_id IS NOT NULL
             AND (t.state IN ('succeeded', 'canceled', 'expired')
                  OR (t.state = 'dead' AND t.order_dead_skips))
           LIMIT ?"#,
        limit
    )
    .fetch_all(&mut *conn)
    .await?;
    let ends = rules::order_ends(rows.into_iter().map(|r| OrderEnd {
        key: r.order_key,
        id: r.id,
        seq: r.order_seq,
    }));
    let mut done = 0;
    for e in ends {
        if order_advance_if_free(conn, &e).await? {
            done += 1;
        }
    }
    Ok(done)
}

/// [`order_advance`] for each of `ends`, in their order.
pub async fn order_advance_all(conn: &mut MySqlConnection, ends: &[OrderEnd]) -> sqlx::Result<()> {
    for e in ends {
        order_advance(conn, &e.key, e.id, e.seq).await?;
    }
    Ok(())
}

/// Makes a dead ordered task live again (the retry of a dead task), on the caller's
/// transaction, with the task's row locked: the key's row is counted up and read, and
/// `rules::order_retry` decides what to write. Returns the state to write.
pub async fn order_retry(
    conn: &mut MySqlConnection,
    key: &[u8],
    id: u64,
) -> sqlx::Result<TaskState> {
    let (next_seq, head) = key_count_up(conn, key).await?;
    let plan = rules::order_retry(id, next_seq, head);
    if let Some(seq) = plan.new_seq {
        sqlx::query!("UPDATE taskq_tasks SET order_seq = ? WHERE id = ?", seq, id)
            .execute(&mut *conn)
            .await?;
    }
    if plan.make_head {
        sqlx::query!(
            "UPDATE taskq_order_keys SET head_task_id = ? WHERE order_key = ?",
            id,
            key
        )
        .execute(&mut *conn)
        .await?;
    }
    Ok(plan.state)
}

/// See `Tasks::order_keys_held`.
pub async fn order_keys_held(
    pool: &sqlx::MySqlPool,
    queue: Option<&str>,
    limit: u32,
) -> sqlx::Result<Vec<HeldKey>> {
    let rows = sqlx::query!(
        r#"SELECT LOWER(HEX(k.order_key)) AS "order_key!: String", t.queue, t.id AS "id: u64",
             t.name, t.state AS "state: TaskState", t.attempt AS "attempt: u32", t.last_error,
             (SELECT COUNT(*) FROM taskq_tasks w FORCE INDEX (ix_taskq_order)
               WHERE w.order_key = k.order_key AND w.order_seq > t.order_seq
                 AND w.state = 'waiting') AS "waiting!: i64"
           FROM taskq_order_keys k
             STRAIGHT_JOIN taskq_tasks t FORCE INDEX (PRIMARY) ON t.id = k.head_task_id
           WHERE k.head_task_id IS NOT NULL AND (? IS NULL OR t.queue = ?)
             AND (t.state = 'dead' OR (t.state = 'pending' AND t.attempt > 0)
                  OR (t.state = 'running' AND t.attempt > 1))
           ORDER BY 8 DESC, t.id
           LIMIT ?"#,
        queue,
        queue,
        limit
    )
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| HeldKey {
            order_key: r.order_key,
            queue: r.queue,
            head: TaskId(r.id),
            name: r.name,
            state: r.state,
            attempt: r.attempt,
            last_error: r.last_error,
            waiting: r.waiting.max(0) as u64,
        })
        .collect())
}
