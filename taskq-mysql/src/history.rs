//! Attempt history (the `attempts` JSON array of `taskq_tasks`) and the audit trail
//! (`taskq_audit`).

use chrono::{DateTime, Utc};
use sqlx::MySqlConnection;
use taskq_driver::driver::History;

use crate::MySqlDriver;
use taskq_driver::rows::{AuditListRow, AuditRow};
use taskq_driver::state::TaskId;

/// Inserts an audit row on `conn` (normally the transaction of the action it records), at the
/// database clock. One statement: the task's queue is read by primary key inside it.
pub async fn audit_insert(conn: &mut MySqlConnection, a: &AuditRow<'_>) -> sqlx::Result<u64> {
    let done = sqlx::query!(
        r#"INSERT INTO taskq_audit (at, actor, action, task_id, queue, detail)
           VALUES (UTC_TIMESTAMP(6), ?, ?, ?,
                   COALESCE(?, (SELECT t.queue FROM taskq_tasks t WHERE t.id = ?)), ?)"#,
        a.actor,
        a.action,
        a.task_id,
        a.queue,
        a.task_id,
        a.detail,
    )
    .execute(&mut *conn)
    .await?;
    Ok(done.last_insert_id())
}

impl History for MySqlDriver {
    /// A task's attempt history (the JSON array, `None` when empty); `None` when the task
    /// does not exist.
    async fn task_attempts(&self, id: TaskId) -> sqlx::Result<Option<Option<String>>> {
        let row = sqlx::query!(r#"SELECT attempts FROM taskq_tasks WHERE id = ?"#, id.0)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|r| r.attempts))
    }

    /// Audit rows with `id < before_id`, of `task_id` and of `queue` when given, newest first.
    async fn audit_list(
        &self,
        task_id: Option<u64>,
        queue: Option<&str>,
        before_id: u64,
        limit: u32,
    ) -> sqlx::Result<Vec<AuditListRow>> {
        sqlx::query_as!(
            AuditListRow,
            r#"SELECT id AS "id: u64", at AS "at: DateTime<Utc>", actor, action,
                 task_id AS "task_id: u64", queue, detail
               FROM taskq_audit
               WHERE id < ? AND (? IS NULL OR task_id = ?) AND (? IS NULL OR queue = ?)
               ORDER BY id DESC
               LIMIT ?"#,
            before_id,
            task_id,
            task_id,
            queue,
            queue,
            limit
        )
        .fetch_all(&self.pool)
        .await
    }

    /// Deletes up to `limit` audit rows older than `age_secs` (database clock).
    async fn audit_prune(
        &self,
        conn: &mut MySqlConnection,
        age_secs: u64,
        limit: u32,
    ) -> sqlx::Result<u64> {
        let done = sqlx::query!(
            r#"DELETE FROM taskq_audit
               WHERE at < UTC_TIMESTAMP(6) - INTERVAL ? SECOND
               ORDER BY at
               LIMIT ?"#,
            age_secs,
            limit
        )
        .execute(&mut *conn)
        .await?;
        Ok(done.rows_affected())
    }

    /// Attempts that ended `failed`, `timed_out`, `panicked` or `lease_lost` per outcome and
    /// minute over the last `minutes` minutes (database clock), from the attempt histories:
    /// `(outcome, minutes ago, count)`. Reads only the rows that can hold such an entry, each
    /// through an index: pending rows with an attempt made (`ix_taskq_retrying`) and running
    /// rows (`ix_taskq_claim`), both due after the window's start (an attempt that fails sets
    /// `run_at` to its end plus the backoff, and nothing but `reschedule_at` moves it earlier),
    /// and terminal rows finished in the window (`ix_taskq_finished`). A pending row without an
    /// attempt has no history, and tasks scheduled for later are most of the pending rows due
    /// after the window's start: reading them cost seconds on a million-task table. (A dead
    /// task an operator retried is pending with its attempt count back at 0: its failures in
    /// the window are counted again once it is claimed.)
    /// A reap keeps `run_at`, so the `lease_lost` entry of a task reaped back to pending that
    /// was due before the window is counted only once the task has ended.
    async fn task_failed_attempts_per_minute(
        &self,
        minutes: u32,
    ) -> sqlx::Result<Vec<(String, u32, u64)>> {
        let rows = sqlx::query!(
            r#"SELECT j.outcome AS "outcome!: String",
                 CAST(TIMESTAMPDIFF(MINUTE, j.finished_at, UTC_TIMESTAMP(6)) AS UNSIGNED) AS "ago!: u64",
                 CAST(COUNT(*) AS UNSIGNED) AS "n!: u64"
               FROM (SELECT attempts FROM taskq_tasks FORCE INDEX (ix_taskq_retrying)
                      WHERE retry_at > UTC_TIMESTAMP(6) - INTERVAL ? MINUTE AND attempts IS NOT NULL
                     UNION ALL
                     SELECT attempts FROM taskq_tasks FORCE INDEX (ix_taskq_claim)
                      WHERE state = 'running'
                        AND run_at > UTC_TIMESTAMP(6) - INTERVAL ? MINUTE AND attempts IS NOT NULL
                     UNION ALL
                     SELECT attempts FROM taskq_tasks FORCE INDEX (ix_taskq_finished)
                      WHERE state IN ('succeeded', 'dead', 'canceled', 'expired')
                        AND finished_at > UTC_TIMESTAMP(6) - INTERVAL ? MINUTE AND attempts IS NOT NULL
                    ) AS t,
                    JSON_TABLE(t.attempts, '$[*]' COLUMNS (
                        outcome VARCHAR(32) PATH '$.outcome',
                        finished_at DATETIME(6) PATH '$.finished_at')) AS j
               WHERE j.outcome IN ('failed', 'timed_out', 'panicked', 'lease_lost')
                 AND j.finished_at > UTC_TIMESTAMP(6) - INTERVAL ? MINUTE
               GROUP BY j.outcome, 2"#,
            minutes,
            minutes,
            minutes,
            minutes
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .filter(|r| r.ago < u64::from(minutes))
            .map(|r| (r.outcome, r.ago as u32, r.n))
            .collect())
    }
}
