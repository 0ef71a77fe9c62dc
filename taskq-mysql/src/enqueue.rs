//! The producer path, on the caller's connection: one task (with its idempotency key or unique
//! identity), or rows without either in multi-row batches whose ids are derived or read back.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{Connection, MySqlConnection};

use crate::identities::identity_reserve;
use crate::is_conflict_on;
use taskq_driver::budget::Budget;
use taskq_driver::rows::{Inserted, NewTask};
use taskq_driver::state::{TaskId, TaskState};

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
/// first so that a taken key is reported before a taken identity. Those statements belong
/// together, so they run in a savepoint of the caller's transaction (outside one, in a short
/// transaction of its own), as the ordered enqueue does: an error midway, or the future
/// dropped midway (a timeout around the enqueue), rolls back to the savepoint, so a caller that
/// commits anyway never commits a task without its identity, or an identity held by no task
/// (which nothing would release). A duplicate is not rolled back but released (a task row
/// already inserted is deleted): MariaDB releases the row locks taken after a savepoint when
/// rolling back to it, and the lock on the holder's identity must last until the caller's
/// transaction ends (a task is not started while a producer that saw it as the holder is open).
pub async fn task_insert(conn: &mut MySqlConnection, t: &NewTask<'_>) -> sqlx::Result<Inserted> {
    let Some(key) = t.unique_key else {
        return Ok(match insert_row(conn, t, None).await? {
            Ok(id) => Inserted::New(id),
            Err(holder) => Inserted::Duplicate(holder),
        });
    };
    // A SAVEPOINT inside the caller's transaction, a BEGIN outside one; dropped before its
    // commit (an error, or this future dropped), sqlx rolls it back.
    let mut tx = conn.begin().await?;
    let out = insert_unique(&mut tx, t, key).await?;
    tx.commit().await?;
    Ok(out)
}

/// The statements of [`task_insert`] for a unique task, in its savepoint.
async fn insert_unique(
    conn: &mut MySqlConnection,
    t: &NewTask<'_>,
    key: &[u8],
) -> sqlx::Result<Inserted> {
    if t.idempotency_key.is_some() {
        let id = match insert_row(conn, t, None).await? {
            Ok(id) => id,
            Err(holder) => return Ok(Inserted::Duplicate(holder)),
        };
        if let Some(holder) = identity_reserve(conn, key, id.0, t.unique_expires_us).await? {
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
    let id = match insert_row(conn, t, None).await? {
        Ok(id) => id,
        Err(holder) => return Ok(Inserted::Duplicate(holder)),
    };
    sqlx::query!(
        "UPDATE taskq_unique SET task_id = ? WHERE unique_key = ?",
        id.0,
        key
    )
    .execute(&mut *conn)
    .await?;
    Ok(Inserted::New(id))
}

/// An ordered task's place in its key, as the ordered enqueue (`order.rs`) inserts it.
pub(crate) struct Place<'a> {
    /// The order key.
    pub(crate) key: &'a [u8],
    /// Its number in the key (`order_seq`).
    pub(crate) seq: u64,
    /// `order_dead_skips`.
    pub(crate) dead_skips: bool,
    /// `pending` (the key's head) or `waiting`.
    pub(crate) state: TaskState,
}

/// The task row's `INSERT` (an ordered task's with its `place`; any other `pending` with
/// none): the new id, or the holder of its idempotency key.
pub(crate) async fn insert_row(
    conn: &mut MySqlConnection,
    t: &NewTask<'_>,
    place: Option<&Place<'_>>,
) -> sqlx::Result<Result<TaskId, TaskId>> {
    let state = place.map_or(TaskState::Pending, |p| p.state);
    let res = sqlx::query!(
        r#"INSERT INTO taskq_tasks
            (queue, name, payload, state, priority, max_attempts, run_at, deadline,
             idempotency_key, trace_context, unique_key, unique_while,
             order_key, order_seq, order_dead_skips, created_at, updated_at)
           VALUES (?, ?, ?, ?, ?, ?,
             COALESCE(?, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND),
             COALESCE(?, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND), ?, ?, ?, ?, ?, ?, ?,
             UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))"#,
        t.queue,
        t.name,
        t.payload,
        state.as_str(),
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
        place.map(|p| p.key),
        place.map(|p| p.seq),
        place.is_some_and(|p| p.dead_skips),
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

/// How the server numbers the rows of one multi-row insert.
pub struct AutoIncrement {
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
pub async fn autoinc_settings(conn: &mut MySqlConnection) -> sqlx::Result<AutoIncrement> {
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
/// `enqueue_many`), `BATCH_ROWS` per statement at most and within the server's [`Budget`],
/// and returns their ids in order.
/// When the server's auto-increment settings make a multi-row insert's ids consecutive
/// (`innodb_autoinc_lock_mode` 0 or 1) they are derived from the first; otherwise (mode 2,
/// MySQL 8's default and Galera's requirement) the rows carry a random marker in
/// `enqueue_batch` and are read back by it.
pub async fn task_insert_rows(
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
                payload_hex: taskq_driver::rows::hex(r.payload),
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
pub async fn task_insert_batch(
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
pub async fn task_batch_ids(
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
