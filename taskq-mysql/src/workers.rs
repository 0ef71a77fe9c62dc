//! Live workers (`taskq_workers`): start, beat, stop, prune, list.

use chrono::{DateTime, Utc};
use sqlx::MySqlConnection;
use taskq_driver::driver::Workers;

use crate::MySqlDriver;
use taskq_driver::rows::{WorkerListRow, WorkerRow};

impl Workers for MySqlDriver {
    /// Records a starting worker: inserts its row, or (a worker id used again) overwrites it
    /// with `started_at = last_seen_at = now` and `stopped_at = NULL`.
    async fn worker_start(
        &self,
        conn: &mut MySqlConnection,
        w: &WorkerRow<'_>,
    ) -> sqlx::Result<()> {
        let queues_json = taskq_driver::rows::queues_json(w.queues);
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
            queues_json,
            w.concurrency,
            w.lease_us,
            w.heartbeat_us,
            w.names.json(),
            w.host,
            w.pid,
            queues_json,
            w.concurrency,
            w.lease_us,
            w.heartbeat_us,
            w.names.json(),
        )
        .execute(&mut *conn)
        .await?;
        Ok(())
    }

    /// A running worker's beat: `last_seen_at = now` (one primary-key upsert). The row is
    /// inserted again if it is missing (the start's insert failed, or cleanup deleted it
    /// during a long partition); a row marked stopped is left alone (a beat that was under way
    /// at shutdown must not bring its worker back to life).
    async fn worker_seen(&self, conn: &mut MySqlConnection, w: &WorkerRow<'_>) -> sqlx::Result<()> {
        let queues_json = taskq_driver::rows::queues_json(w.queues);
        sqlx::query!(
            r#"INSERT INTO taskq_workers (worker_id, host, pid, queues, concurrency, lease_us,
                 heartbeat_us, names, started_at, last_seen_at, stopped_at)
               VALUES (?, ?, ?, ?, ?, ?, ?, ?, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), NULL)
               ON DUPLICATE KEY UPDATE
                 last_seen_at = IF(stopped_at IS NULL, UTC_TIMESTAMP(6), last_seen_at)"#,
            w.worker_id,
            w.host,
            w.pid,
            queues_json,
            w.concurrency,
            w.lease_us,
            w.heartbeat_us,
            w.names.json(),
        )
        .execute(&mut *conn)
        .await?;
        Ok(())
    }

    /// Marks a worker stopped (graceful shutdown): `stopped_at = last_seen_at = now`.
    async fn worker_stop(&self, conn: &mut MySqlConnection, worker_id: &str) -> sqlx::Result<bool> {
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
    async fn worker_prune(
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

    /// Every worker row, oldest start first, with how long ago it was seen (on the database
    /// clock; whether that makes it alive is `rules::worker_alive`), and how many running tasks
    /// carry its id (one `GROUP BY` over the
    /// running rows, read through `ix_taskq_lease`).
    async fn worker_list(&self, conn: &mut MySqlConnection) -> sqlx::Result<Vec<WorkerListRow>> {
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
