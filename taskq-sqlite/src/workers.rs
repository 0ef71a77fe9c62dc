//! Live workers (`taskq_workers`): one row per worker process, written by the worker itself.

use sqlx::SqliteConnection;
use taskq_driver::rows::{WorkerListRow, WorkerRow, queues_json};

use crate::clock::{opt_time, time_from_us};

/// Records a starting worker: inserts its row, or (a worker id used again) overwrites it with
/// `started_at = last_seen_at = now` and `stopped_at = NULL`.
pub(crate) async fn worker_start(
    conn: &mut SqliteConnection,
    w: &WorkerRow<'_>,
) -> sqlx::Result<()> {
    let lease_us = w.lease_us as i64;
    let heartbeat_us = w.heartbeat_us as i64;
    let (queues, names) = (queues_json(w.queues), w.names.json());
    sqlx::query!(
        r#"INSERT INTO taskq_workers (worker_id, host, pid, queues, concurrency, lease_us,
             heartbeat_us, names, started_at, last_seen_at, stopped_at)
           SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, c.us, c.us, NULL FROM taskq_clock AS c WHERE true
           ON CONFLICT (worker_id) DO UPDATE
             SET host = excluded.host, pid = excluded.pid, queues = excluded.queues,
                 concurrency = excluded.concurrency, lease_us = excluded.lease_us,
                 heartbeat_us = excluded.heartbeat_us, names = excluded.names,
                 started_at = excluded.started_at,
                 last_seen_at = excluded.last_seen_at, stopped_at = NULL"#,
        w.worker_id,
        w.host,
        w.pid,
        queues,
        w.concurrency,
        lease_us,
        heartbeat_us,
        names,
    )
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// A running worker's beat: `last_seen_at = now`. The row is inserted again if it is missing;
/// a row marked stopped is left alone (a beat under way at shutdown must not revive it).
pub(crate) async fn worker_seen(
    conn: &mut SqliteConnection,
    w: &WorkerRow<'_>,
) -> sqlx::Result<()> {
    let lease_us = w.lease_us as i64;
    let heartbeat_us = w.heartbeat_us as i64;
    let (queues, names) = (queues_json(w.queues), w.names.json());
    sqlx::query!(
        r#"INSERT INTO taskq_workers (worker_id, host, pid, queues, concurrency, lease_us,
             heartbeat_us, names, started_at, last_seen_at, stopped_at)
           SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, c.us, c.us, NULL FROM taskq_clock AS c WHERE true
           ON CONFLICT (worker_id) DO UPDATE
             SET last_seen_at = CASE WHEN stopped_at IS NULL THEN excluded.last_seen_at
                                     ELSE last_seen_at END"#,
        w.worker_id,
        w.host,
        w.pid,
        queues,
        w.concurrency,
        lease_us,
        heartbeat_us,
        names,
    )
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Marks a worker stopped (graceful shutdown): `stopped_at = last_seen_at = now`. Returns
/// whether its row exists.
pub(crate) async fn worker_stop(
    conn: &mut SqliteConnection,
    worker_id: &str,
) -> sqlx::Result<bool> {
    let done = sqlx::query!(
        r#"UPDATE taskq_workers AS w SET stopped_at = c.us, last_seen_at = c.us
           FROM taskq_clock AS c WHERE w.worker_id = ?1"#,
        worker_id
    )
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Deletes up to `limit` rows of workers not seen for `age_secs` (stopped or gone).
pub(crate) async fn worker_prune(
    conn: &mut SqliteConnection,
    age_secs: u64,
    limit: u32,
) -> sqlx::Result<u64> {
    let age_us = i64::try_from(age_secs.saturating_mul(1_000_000)).unwrap_or(i64::MAX);
    let done = sqlx::query!(
        r#"DELETE FROM taskq_workers
           WHERE worker_id IN (
             SELECT worker_id FROM taskq_workers
             WHERE last_seen_at < (SELECT us FROM taskq_clock) - ?1
             ORDER BY last_seen_at
             LIMIT ?2)"#,
        age_us,
        limit
    )
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected())
}

/// Every worker row, oldest start first, with how long ago it was seen (on the database clock;
/// whether that makes it alive is `taskq_driver::rules::worker_alive`) and how many running
/// tasks carry its id.
pub(crate) async fn worker_list(conn: &mut SqliteConnection) -> sqlx::Result<Vec<WorkerListRow>> {
    let rows = sqlx::query!(
        r#"SELECT w.worker_id AS "worker_id!: String", w.host AS "host!: String",
             w.pid AS "pid!: u32", w.queues AS "queues!: String",
             w.concurrency AS "concurrency!: u32", w.lease_us AS "lease_us!: i64",
             w.heartbeat_us AS "heartbeat_us!: i64", w.started_at AS "started_at!: i64",
             w.last_seen_at AS "last_seen_at!: i64", w.stopped_at AS "stopped_at?: i64",
             w.names AS "names?: String",
             (SELECT us FROM taskq_clock) - w.last_seen_at AS "seen_ago_us!: i64",
             COALESCE(r.running, 0) AS "running!: i64"
           FROM taskq_workers AS w
             LEFT JOIN (SELECT worker_id, COUNT(*) AS running FROM taskq_tasks
                        WHERE state = 'running' GROUP BY worker_id) AS r
               ON r.worker_id = w.worker_id
           ORDER BY w.started_at, w.worker_id"#
    )
    .fetch_all(&mut *conn)
    .await?;
    rows.into_iter()
        .map(|r| {
            Ok(WorkerListRow {
                worker_id: r.worker_id,
                host: r.host,
                pid: r.pid,
                queues: r.queues,
                concurrency: r.concurrency,
                lease_us: r.lease_us.max(0) as u64,
                heartbeat_us: r.heartbeat_us.max(0) as u64,
                started_at: time_from_us(r.started_at)?,
                last_seen_at: time_from_us(r.last_seen_at)?,
                stopped_at: opt_time(r.stopped_at)?,
                names: r.names,
                seen_ago_us: r.seen_ago_us,
                running: r.running,
            })
        })
        .collect()
}
