//! Ordered tasks (`taskq_order_keys`): the ordered enqueue, the promotion of a key's next
//! task when its head ends, and the keys held back by a failing head. SQLite runs one writer
//! at a time, so the statements of one transaction see and change a key with nothing in
//! between; sequence order is commit order because the enqueue takes its number inside the
//! writing transaction.

use sqlx::{SqliteConnection, SqlitePool};
use taskq_driver::rows::{HeldKey, Inserted, NewTask, OrderKey};
use taskq_driver::rules::{self, OrderEnd, ends_order_head, ordered_enqueue_state};
use taskq_driver::state::{TaskId, TaskState};

use crate::clock::time_to_us;
use crate::connect::begin_write;
use crate::conv::{sid, uid};
use crate::identities::{freed, release};

/// Inserts an ordered task (see `Enqueue::task_insert_ordered`): the key's row is upserted
/// (`next_seq + 1`), then the task inserted `pending` as the key's head when the key has none,
/// `waiting` otherwise. In a savepoint of the caller's transaction, or a `BEGIN IMMEDIATE`
/// transaction of its own; a duplicate idempotency key undoes it all and returns the holder.
pub(crate) async fn task_insert_ordered(
    conn: &mut SqliteConnection,
    t: &NewTask<'_>,
    order: &OrderKey<'_>,
) -> sqlx::Result<Inserted> {
    if t.unique_key.is_some() {
        return Err(sqlx::Error::Protocol(
            "an ordered task has no unique identity".into(),
        ));
    }
    let mut tx = begin_write(conn).await?;
    let (next_seq, head) = key_count_up(&mut tx, order.key).await?;
    let place = ordered_enqueue_state(head.is_some());
    let state = place.as_str();
    let run_at = t.run_at.map(time_to_us);
    let deadline = t.deadline.map(time_to_us);
    let id = sqlx::query_scalar!(
        r#"INSERT INTO taskq_tasks
             (queue, name, payload, state, priority, max_attempts, run_at, deadline,
              idempotency_key, trace_context, order_key, order_seq, order_dead_skips,
              created_at, updated_at)
           SELECT ?1, ?2, ?3, ?4, ?5, ?6, COALESCE(?7, c.us + ?8), COALESCE(?9, c.us + ?10),
             ?11, ?12, ?13, ?14, ?15, c.us, c.us
           FROM taskq_clock AS c WHERE true
           ON CONFLICT (name, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
           RETURNING id AS "id!: i64""#,
        t.queue,
        t.name,
        t.payload,
        state,
        t.priority,
        t.max_attempts,
        run_at,
        t.delay_us,
        deadline,
        t.ttl_us,
        t.idempotency_key,
        t.trace_context,
        order.key,
        next_seq,
        order.dead_skips,
    )
    .fetch_optional(&mut *tx)
    .await?;
    let Some(id) = id else {
        let holder = sqlx::query_scalar!(
            r#"SELECT id AS "id!: i64" FROM taskq_tasks WHERE name = ?1 AND idempotency_key = ?2"#,
            t.name,
            t.idempotency_key,
        )
        .fetch_one(&mut *tx)
        .await?;
        tx.rollback().await?;
        return Ok(Inserted::Duplicate(TaskId(uid(holder))));
    };
    if place == TaskState::Pending {
        sqlx::query!(
            "UPDATE taskq_order_keys SET head_task_id = ?1 WHERE order_key = ?2",
            id,
            order.key
        )
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    Ok(Inserted::New(TaskId(uid(id))))
}

/// Counts `key`'s row up (`next_seq + 1`, inserted at 1 for a new key): the number just
/// taken and the head recorded.
async fn key_count_up(conn: &mut SqliteConnection, key: &[u8]) -> sqlx::Result<(i64, Option<i64>)> {
    let row = sqlx::query!(
        r#"INSERT INTO taskq_order_keys (order_key, next_seq, head_task_id) VALUES (?1, 1, NULL)
           ON CONFLICT (order_key) DO UPDATE SET next_seq = next_seq + 1
           RETURNING next_seq AS "next_seq!: i64", head_task_id AS "head_task_id?: i64""#,
        key
    )
    .fetch_one(&mut *conn)
    .await?;
    Ok((row.next_seq, row.head_task_id))
}

/// After the task `ended` stopped being its key's head, on the transaction that ended it: if
/// it is the head recorded for `key`, promotes the key's next waiting task (lowest number
/// above `ended_seq`) to `pending` and records it as the head, or records none. A task that is
/// not the key's head changes nothing.
pub(crate) async fn order_advance(
    conn: &mut SqliteConnection,
    key: &[u8],
    ended: i64,
    ended_seq: i64,
) -> sqlx::Result<Option<u64>> {
    let done = sqlx::query!(
        r#"UPDATE taskq_order_keys SET head_task_id = NULL
           WHERE order_key = ?1 AND head_task_id = ?2"#,
        key,
        ended
    )
    .execute(&mut *conn)
    .await?;
    if done.rows_affected() == 0 {
        return Ok(None);
    }
    let next = sqlx::query_scalar!(
        r#"UPDATE taskq_tasks SET state = 'pending', updated_at = (SELECT us FROM taskq_clock)
           WHERE id = (SELECT id FROM taskq_tasks
                       WHERE order_key = ?1 AND order_seq > ?2 AND state = 'waiting'
                       ORDER BY order_seq LIMIT 1)
           RETURNING id AS "id!: i64""#,
        key,
        ended_seq
    )
    .fetch_optional(&mut *conn)
    .await?;
    let Some(next) = next else {
        return Ok(None);
    };
    sqlx::query!(
        "UPDATE taskq_order_keys SET head_task_id = ?1 WHERE order_key = ?2",
        next,
        key
    )
    .execute(&mut *conn)
    .await?;
    Ok(Some(uid(next)))
}

/// A task as a statement that moved it returns it: its new state, unique identity and order.
pub(crate) struct Ended {
    pub(crate) id: i64,
    pub(crate) state: TaskState,
    pub(crate) unique_key: Option<Vec<u8>>,
    pub(crate) unique_while: Option<String>,
    pub(crate) order_key: Option<Vec<u8>>,
    pub(crate) order_seq: Option<i64>,
    pub(crate) dead_skips: bool,
}

/// The tail of every statement that moves tasks (cancel, delete, claim, write-back, reap), in
/// its transaction: each ordered head whose new state ends the head
/// (`rules::ends_order_head`) promotes its key's next task ([`order_advance`], keys in
/// `rules::order_ends` order, as on MySQL), then the
/// unique identities `frees` (a rule of `taskq_driver::rules`) says the new states free are
/// released (`identities::release`).
pub(crate) async fn tasks_moved(
    conn: &mut SqliteConnection,
    moved: Vec<Ended>,
    frees: fn(&str, TaskState) -> bool,
) -> sqlx::Result<()> {
    let mut freed_ids = Vec::new();
    let mut ends = Vec::new();
    for e in moved {
        let w = e.unique_while.as_deref();
        freed_ids.extend(freed(e.id, e.unique_key, w, e.state, frees));
        if let (Some(key), Some(seq)) = (e.order_key, e.order_seq)
            && ends_order_head(e.state, e.dead_skips)
        {
            ends.push(OrderEnd {
                key,
                id: uid(e.id),
                seq: uid(seq),
            });
        }
    }
    // In the order every driver advances keys (by key, then number).
    for e in rules::order_ends(ends) {
        order_advance(conn, &e.key, sid(e.id), sid(e.seq)).await?;
    }
    release(conn, &freed_ids).await?;
    Ok(())
}

/// Makes a dead ordered task live again (a retry), on the caller's transaction: the key's row
/// is counted up and read back, and `rules::order_retry` decides what to write. Returns the
/// state to write.
pub(crate) async fn order_retry(
    conn: &mut SqliteConnection,
    key: &[u8],
    id: i64,
) -> sqlx::Result<TaskState> {
    let (next_seq, head) = key_count_up(conn, key).await?;
    let plan = rules::order_retry(uid(id), uid(next_seq), head.map(uid));
    if let Some(seq) = plan.new_seq {
        let seq = sid(seq);
        sqlx::query!(
            "UPDATE taskq_tasks SET order_seq = ?1 WHERE id = ?2",
            seq,
            id
        )
        .execute(&mut *conn)
        .await?;
    }
    if plan.make_head {
        sqlx::query!(
            "UPDATE taskq_order_keys SET head_task_id = ?1 WHERE order_key = ?2",
            id,
            key
        )
        .execute(&mut *conn)
        .await?;
    }
    Ok(plan.state)
}

/// See `Tasks::order_keys_held`.
pub(crate) async fn order_keys_held(
    pool: &SqlitePool,
    queue: Option<&str>,
    limit: u32,
) -> sqlx::Result<Vec<HeldKey>> {
    let rows = sqlx::query!(
        r#"SELECT lower(hex(k.order_key)) AS "order_key!: String", t.queue AS "queue!: String",
             t.id AS "id!: i64", t.name AS "name!: String", t.state AS "state!: String",
             t.attempt AS "attempt!: u32", t.last_error AS "last_error?: String",
             (SELECT COUNT(*) FROM taskq_tasks AS w
               WHERE w.order_key = k.order_key AND w.order_seq > t.order_seq
                 AND w.state = 'waiting') AS "waiting!: i64"
           FROM taskq_order_keys AS k JOIN taskq_tasks AS t ON t.id = k.head_task_id
           WHERE k.head_task_id IS NOT NULL AND (?1 IS NULL OR t.queue = ?1)
             AND (t.state = 'dead' OR (t.state = 'pending' AND t.attempt > 0)
                  OR (t.state = 'running' AND t.attempt > 1))
           ORDER BY 8 DESC, t.id
           LIMIT ?2"#,
        queue,
        limit
    )
    .fetch_all(pool)
    .await?;
    rows.into_iter()
        .map(|r| {
            Ok(HeldKey {
                order_key: r.order_key,
                queue: r.queue,
                head: TaskId(uid(r.id)),
                name: r.name,
                state: r
                    .state
                    .parse()
                    .map_err(|e| sqlx::Error::Decode(Box::new(e)))?,
                attempt: r.attempt,
                last_error: r.last_error,
                waiting: r.waiting.max(0) as u64,
            })
        })
        .collect()
}
