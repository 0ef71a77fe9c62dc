//! Per-queue controls: pause and resume. A paused queue is not claimed from (checked inside
//! the claim statement); running tasks finish normally.

use chrono::{DateTime, Utc};
use sqlx::SqliteConnection;

use crate::clock::time_from_us;

/// Pauses `queue` (idempotent: an already paused queue keeps its first pause time).
pub async fn queue_pause(conn: &mut SqliteConnection, queue: &str) -> sqlx::Result<()> {
    sqlx::query!(
        r#"INSERT INTO taskq_queues (queue, paused_at, updated_at)
           SELECT ?1, c.us, c.us FROM taskq_clock AS c WHERE true
           ON CONFLICT (queue) DO UPDATE
             SET paused_at = COALESCE(paused_at, excluded.paused_at),
                 updated_at = excluded.updated_at"#,
        queue
    )
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Resumes `queue`; returns whether it was paused.
pub async fn queue_resume(conn: &mut SqliteConnection, queue: &str) -> sqlx::Result<bool> {
    let done = sqlx::query!(
        r#"UPDATE taskq_queues AS q SET paused_at = NULL, updated_at = c.us
           FROM taskq_clock AS c
           WHERE q.queue = ?1 AND q.paused_at IS NOT NULL"#,
        queue
    )
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Paused queues with the time they were paused, by name.
pub async fn queues_paused(
    conn: &mut SqliteConnection,
) -> sqlx::Result<Vec<(String, DateTime<Utc>)>> {
    let rows = sqlx::query!(
        r#"SELECT queue AS "queue!: String", paused_at AS "paused_at!: i64"
           FROM taskq_queues WHERE paused_at IS NOT NULL ORDER BY queue"#
    )
    .fetch_all(&mut *conn)
    .await?;
    rows.into_iter()
        .map(|r| Ok((r.queue, time_from_us(r.paused_at)?)))
        .collect()
}
