//! The producer path: inserting tasks on the caller's connection or transaction.

use serde::Serialize;
use sqlx::SqliteConnection;
use taskq_driver::rows::{Inserted, NewTask, hex};
use taskq_driver::state::TaskId;

use crate::clock::time_to_us;
use crate::connect::begin_write;
use crate::conv::{sid, uid};

/// Whether the row may turn out a duplicate (an idempotency key or a unique identity), so it
/// cannot go into a multi-row insert.
fn keyed(t: &NewTask<'_>) -> bool {
    t.idempotency_key.is_some() || t.unique_key.is_some()
}

/// Inserts a task on `conn` (the caller's transaction, if any). A duplicate idempotency key,
/// or a unique identity another task holds, returns the holder's id instead of failing, and
/// writes nothing.
///
/// A task without a unique identity is one statement: `INSERT … ON CONFLICT (name,
/// idempotency_key) DO NOTHING RETURNING id`, plus a read of the holder when the key was
/// taken. A unique task inserts the task row, then its `taskq_unique` row (`ON CONFLICT DO
/// NOTHING`); when the identity is taken, the holder is read and the insert undone. Those
/// statements run in a savepoint of the caller's transaction, or in a `BEGIN IMMEDIATE`
/// transaction of their own, so an error leaves nothing half-written. A key taken is reported
/// before an identity taken, as on MySQL.
///
/// Unlike MySQL there is no lock to wait for: the statement holds the database's write lock,
/// so a conflicting row is committed (or is the caller's own).
pub(crate) async fn task_insert(
    conn: &mut SqliteConnection,
    t: &NewTask<'_>,
) -> sqlx::Result<Inserted> {
    let Some(key) = t.unique_key else {
        return insert_row(conn, t).await;
    };
    let mut tx = begin_write(conn).await?;
    let id = match insert_row(&mut tx, t).await? {
        Inserted::New(id) => sid(id.0),
        dup @ Inserted::Duplicate(_) => return Ok(dup),
    };
    let reserved = sqlx::query!(
        r#"INSERT INTO taskq_unique (unique_key, task_id, expires_at) VALUES (?1, ?2, ?3)
           ON CONFLICT (unique_key) DO NOTHING"#,
        key,
        id,
        t.unique_expires_us,
    )
    .execute(&mut *tx)
    .await?;
    if reserved.rows_affected() == 1 {
        tx.commit().await?;
        return Ok(Inserted::New(TaskId(uid(id))));
    }
    let holder = sqlx::query_scalar!(
        r#"SELECT task_id AS "task_id!: i64" FROM taskq_unique WHERE unique_key = ?1"#,
        key
    )
    .fetch_one(&mut *tx)
    .await?;
    // Undoes the task row (and its id: AUTOINCREMENT's counter is rolled back with it).
    tx.rollback().await?;
    Ok(Inserted::Duplicate(TaskId(uid(holder))))
}

/// The task row's `INSERT`: the new id, or the holder of its idempotency key.
async fn insert_row(conn: &mut SqliteConnection, t: &NewTask<'_>) -> sqlx::Result<Inserted> {
    let run_at = t.run_at.map(time_to_us);
    let deadline = t.deadline.map(time_to_us);
    // `WHERE true`: an INSERT … SELECT with an upsert clause needs a WHERE to parse.
    let id = sqlx::query_scalar!(
        r#"INSERT INTO taskq_tasks
             (queue, name, payload, state, priority, max_attempts, run_at, deadline,
              idempotency_key, trace_context, unique_key, unique_while, created_at, updated_at)
           SELECT ?1, ?2, ?3, 'pending', ?4, ?5, COALESCE(?6, c.us + ?7), COALESCE(?8, c.us + ?9),
             ?10, ?11, ?12, ?13, c.us, c.us
           FROM taskq_clock AS c WHERE true
           ON CONFLICT (name, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
           RETURNING id AS "id!: i64""#,
        t.queue,
        t.name,
        t.payload,
        t.priority,
        t.max_attempts,
        run_at,
        t.delay_us,
        deadline,
        t.ttl_us,
        t.idempotency_key,
        t.trace_context,
        t.unique_key,
        t.unique_while,
    )
    .fetch_optional(&mut *conn)
    .await?;
    if let Some(id) = id {
        return Ok(Inserted::New(TaskId(uid(id))));
    }
    let holder = sqlx::query_scalar!(
        r#"SELECT id AS "id!: i64" FROM taskq_tasks WHERE name = ?1 AND idempotency_key = ?2"#,
        t.name,
        t.idempotency_key,
    )
    .fetch_one(&mut *conn)
    .await?;
    Ok(Inserted::Duplicate(TaskId(uid(holder))))
}

/// Rows per multi-row `INSERT` of [`task_insert_many`].
pub(crate) const BATCH_ROWS: usize = 500;

/// One row of a multi-row insert inside its JSON array.
#[derive(Serialize)]
struct BatchRow<'a> {
    q: &'a str,
    n: &'a str,
    /// Payload, hex (decoded by `unhex`, so any bytes round-trip).
    p: String,
    pr: i16,
    m: u32,
    d: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    r: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dl: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tl: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    t: Option<&'a str>,
}

/// Inserts `rows` in order, atomically (a savepoint of the caller's transaction, or a
/// `BEGIN IMMEDIATE` transaction of its own), and returns one outcome per row. Runs of rows
/// without a key or identity go in multi-row statements of up to [`BATCH_ROWS`] (one
/// `INSERT … SELECT … FROM json_each(?)` each); the others go one by one through
/// [`task_insert`].
///
/// The ids of a multi-row statement come from its `RETURNING`, sorted: the rows are inserted
/// in array order, and AUTOINCREMENT numbers them consecutively since the statement holds the
/// write lock (no other insert can interleave), so the ascending ids are the rows' ids in
/// order. (MySQL needs `innodb_autoinc_lock_mode` to tell; here the ids are always known.)
pub(crate) async fn task_insert_many(
    conn: &mut SqliteConnection,
    rows: &[NewTask<'_>],
) -> sqlx::Result<Vec<Inserted>> {
    let mut tx = begin_write(conn).await?;
    let mut out = Vec::with_capacity(rows.len());
    let mut i = 0;
    while i < rows.len() {
        if keyed(&rows[i]) {
            out.push(task_insert(&mut tx, &rows[i]).await?);
            i += 1;
            continue;
        }
        let mut end = i;
        while end < rows.len() && end - i < BATCH_ROWS && !keyed(&rows[end]) {
            end += 1;
        }
        let ids = insert_batch(&mut tx, &rows[i..end]).await?;
        out.extend(ids.into_iter().map(|id| Inserted::New(TaskId(uid(id)))));
        i = end;
    }
    tx.commit().await?;
    Ok(out)
}

/// One multi-row `INSERT` of rows without a key or identity; their ids in row order.
async fn insert_batch(conn: &mut SqliteConnection, rows: &[NewTask<'_>]) -> sqlx::Result<Vec<i64>> {
    let batch: Vec<BatchRow<'_>> = rows
        .iter()
        .map(|r| BatchRow {
            q: r.queue,
            n: r.name,
            p: hex(r.payload),
            pr: r.priority,
            m: r.max_attempts,
            d: r.delay_us,
            r: r.run_at.map(time_to_us),
            dl: r.deadline.map(time_to_us),
            tl: r.ttl_us,
            t: r.trace_context,
        })
        .collect();
    let json = serde_json::to_string(&batch).map_err(|e| sqlx::Error::Encode(Box::new(e)))?;
    let mut ids = sqlx::query_scalar!(
        r#"INSERT INTO taskq_tasks
             (queue, name, payload, state, priority, max_attempts, run_at, deadline,
              trace_context, created_at, updated_at)
           SELECT j.value ->> 'q', j.value ->> 'n', unhex(j.value ->> 'p'), 'pending',
             j.value ->> 'pr', j.value ->> 'm',
             COALESCE(j.value ->> 'r', c.us + (j.value ->> 'd')),
             COALESCE(j.value ->> 'dl', c.us + (j.value ->> 'tl')),
             j.value ->> 't', c.us, c.us
           FROM json_each(?1) AS j, taskq_clock AS c
           ORDER BY j.key
           RETURNING id AS "id!: i64""#,
        json
    )
    .fetch_all(&mut *conn)
    .await?;
    if ids.len() != rows.len() {
        return Err(sqlx::Error::Protocol(format!(
            "batch enqueue inserted {} rows for {} tasks",
            ids.len(),
            rows.len()
        )));
    }
    ids.sort_unstable();
    Ok(ids)
}
