//! Attempt history (`taskq_tasks.attempts`, appended by the statements that end an attempt:
//! `lease::task_write_back`, `task_reap`, `task_release`, which keep the latest 100 entries
//! and cut an error to 1,023 characters and `…`, as MySQL does) and the audit trail of
//! operator actions (`taskq_audit`).

use sqlx::SqliteConnection;
use taskq_driver::rows::{AuditListRow, AuditRow};
use taskq_driver::state::TaskId;

use crate::clock::time_from_us;
use crate::conv::{sid, uid};

/// A task's attempt history: the JSON array (`None` when no attempt has ended yet), in MySQL's
/// format (`taskq::history` parses both); `None` when the task does not exist.
pub(crate) async fn task_attempts(
    conn: &mut SqliteConnection,
    id: TaskId,
) -> sqlx::Result<Option<Option<String>>> {
    let id = sid(id.0);
    let row = sqlx::query!(
        r#"SELECT attempts AS "attempts?: String" FROM taskq_tasks WHERE id = ?1"#,
        id
    )
    .fetch_optional(&mut *conn)
    .await?;
    Ok(row.map(|r| r.attempts))
}

/// Inserts an audit row on `conn` (normally the transaction of the action it records), at the
/// database clock; returns its id. One statement: the task's queue is read by primary key
/// inside it.
pub(crate) async fn audit_insert(
    conn: &mut SqliteConnection,
    a: &AuditRow<'_>,
) -> sqlx::Result<u64> {
    let task_id = a.task_id.map(sid);
    let id = sqlx::query_scalar!(
        r#"INSERT INTO taskq_audit (at, actor, action, task_id, queue, detail)
           SELECT c.us, ?1, ?2, ?3,
             COALESCE(?4, (SELECT t.queue FROM taskq_tasks AS t WHERE t.id = ?3)), ?5
           FROM taskq_clock AS c
           RETURNING id AS "id!: i64""#,
        a.actor,
        a.action,
        task_id,
        a.queue,
        a.detail
    )
    .fetch_one(&mut *conn)
    .await?;
    Ok(uid(id))
}

/// Audit rows with `id < before_id`, of `task_id` and of `queue` when given, newest first.
pub(crate) async fn audit_list(
    conn: &mut SqliteConnection,
    task_id: Option<u64>,
    queue: Option<&str>,
    before_id: u64,
    limit: u32,
) -> sqlx::Result<Vec<AuditListRow>> {
    let (task_id, before_id) = (task_id.map(sid), sid(before_id));
    let rows = sqlx::query!(
        r#"SELECT id AS "id!: i64", at AS "at!: i64", actor AS "actor!: String",
             action AS "action!: String", task_id AS "task_id?: i64", queue AS "queue?: String",
             detail AS "detail?: String"
           FROM taskq_audit
           WHERE id < ?1 AND (?2 IS NULL OR task_id = ?2) AND (?3 IS NULL OR queue = ?3)
           ORDER BY id DESC
           LIMIT ?4"#,
        before_id,
        task_id,
        queue,
        limit
    )
    .fetch_all(&mut *conn)
    .await?;
    rows.into_iter()
        .map(|r| {
            Ok(AuditListRow {
                id: uid(r.id),
                at: time_from_us(r.at)?,
                actor: r.actor,
                action: r.action,
                task_id: r.task_id.map(uid),
                queue: r.queue,
                detail: r.detail,
            })
        })
        .collect()
}

/// Deletes up to `limit` audit rows older than `age_secs` (database clock), oldest first.
/// Returns the count.
pub(crate) async fn audit_prune(
    conn: &mut SqliteConnection,
    age_secs: u64,
    limit: u32,
) -> sqlx::Result<u64> {
    let age_us = i64::try_from(age_secs.saturating_mul(1_000_000)).unwrap_or(i64::MAX);
    let done = sqlx::query!(
        r#"DELETE FROM taskq_audit
           WHERE id IN (
             SELECT id FROM taskq_audit
             WHERE at < (SELECT us FROM taskq_clock) - ?1
             ORDER BY at
             LIMIT ?2)"#,
        age_us,
        limit
    )
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected())
}

/// Attempts that ended `failed`, `timed_out`, `panicked` or `lease_lost` per outcome and
/// minute over the last `minutes` minutes (database clock), from the attempt histories:
/// `(outcome, minutes ago, count)`, minute 0 being the last 60 seconds. Reads only the rows
/// that can hold such an entry, like MySQL's: pending rows with an attempt made (on
/// `ix_taskq_retrying`) and running rows, both due after the window's start (a failed attempt
/// sets `run_at` to its end plus the backoff), and terminal rows finished in the window (on
/// `ix_taskq_finished`). (A dead task an operator retried is pending with its attempt count
/// back at 0: its failures in the window are counted again once it is claimed.) A reap keeps `run_at`, so the `lease_lost`
/// entry of a task reaped back to pending that was due before the window is counted only once
/// the task has ended.
pub(crate) async fn task_failed_attempts_per_minute(
    conn: &mut SqliteConnection,
    minutes: u32,
) -> sqlx::Result<Vec<(String, u32, u64)>> {
    let window_us = i64::from(minutes) * 60_000_000;
    let rows = sqlx::query!(
        r#"WITH now AS (SELECT us FROM taskq_clock),
           t AS (
             SELECT attempts FROM taskq_tasks INDEXED BY ix_taskq_retrying
             WHERE state = 'pending' AND attempt > 0
               AND run_at > (SELECT us FROM now) - ?1 AND attempts IS NOT NULL
             UNION ALL
             SELECT attempts FROM taskq_tasks
             WHERE state = 'running'
               AND run_at > (SELECT us FROM now) - ?1 AND attempts IS NOT NULL
             UNION ALL
             SELECT attempts FROM taskq_tasks
             WHERE state IN ('succeeded', 'dead', 'canceled', 'expired')
               AND finished_at > (SELECT us FROM now) - ?1 AND attempts IS NOT NULL),
           e AS (
             SELECT j.value ->> 'outcome' AS outcome,
               CAST(strftime('%s', substr(j.value ->> 'finished_at', 1, 19)) AS INTEGER) * 1000000
                 + CAST(substr(j.value ->> 'finished_at', 21) AS INTEGER) AS fin
             FROM t, json_each(t.attempts) AS j)
           SELECT e.outcome AS "outcome!: String",
             ((SELECT us FROM now) - e.fin) / 60000000 AS "ago!: i64",
             COUNT(*) AS "n!: i64"
           FROM e
           WHERE e.outcome IN ('failed', 'timed_out', 'panicked', 'lease_lost')
             AND e.fin > (SELECT us FROM now) - ?1
           GROUP BY 1, 2
           ORDER BY 1, 2"#,
        window_us
    )
    .fetch_all(&mut *conn)
    .await?;
    Ok(rows
        .into_iter()
        .filter(|r| r.ago >= 0 && r.ago < i64::from(minutes))
        .map(|r| (r.outcome, r.ago as u32, r.n.max(0) as u64))
        .collect())
}
