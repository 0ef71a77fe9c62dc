//! Per-queue controls: pause and resume, concurrency and rate limits, the queue list. A paused
//! queue is not claimed from (checked inside the claim statement); running tasks finish
//! normally. A limited queue's claims take no more than its limits allow (see
//! `lease::task_claim`).

use chrono::{DateTime, Utc};
use sqlx::SqliteConnection;

use taskq_driver::rows::{QueueControl, QueueRow};

use crate::clock::time_from_us;

/// Pauses `queue` (idempotent: an already paused queue keeps its first pause time).
pub(crate) async fn queue_pause(conn: &mut SqliteConnection, queue: &str) -> sqlx::Result<()> {
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
pub(crate) async fn queue_resume(conn: &mut SqliteConnection, queue: &str) -> sqlx::Result<bool> {
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
pub(crate) async fn queues_paused(
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

/// What a worker needs to know about its queues, in one read per refresh: the queues that
/// are paused, and those with a concurrency or rate limit, by name.
pub(crate) async fn queue_controls(conn: &mut SqliteConnection) -> sqlx::Result<Vec<QueueControl>> {
    sqlx::query_as!(
        QueueControl,
        r#"SELECT queue AS "queue!: String", (paused_at IS NOT NULL) AS "paused!: bool",
             (concurrency_limit IS NOT NULL OR rate_limit IS NOT NULL) AS "limited!: bool"
           FROM taskq_queues
           WHERE paused_at IS NOT NULL OR concurrency_limit IS NOT NULL OR rate_limit IS NOT NULL
           ORDER BY queue"#
    )
    .fetch_all(&mut *conn)
    .await
}

/// Sets (or, with `None`, clears) the concurrency limit of `queue`: at most that many of its
/// tasks running at once across all workers. Clearing a queue that has no row writes nothing.
pub(crate) async fn queue_set_limit(
    conn: &mut SqliteConnection,
    queue: &str,
    limit: Option<u32>,
) -> sqlx::Result<()> {
    match limit {
        Some(n) => {
            sqlx::query!(
                r#"INSERT INTO taskq_queues (queue, concurrency_limit, updated_at)
                   SELECT ?1, ?2, c.us FROM taskq_clock AS c WHERE true
                   ON CONFLICT (queue) DO UPDATE
                     SET concurrency_limit = excluded.concurrency_limit,
                         updated_at = excluded.updated_at"#,
                queue,
                n
            )
            .execute(&mut *conn)
            .await?;
        }
        None => {
            sqlx::query!(
                r#"UPDATE taskq_queues AS q SET concurrency_limit = NULL, updated_at = c.us
                   FROM taskq_clock AS c WHERE q.queue = ?1"#,
                queue
            )
            .execute(&mut *conn)
            .await?;
        }
    }
    Ok(())
}

/// Sets (or, with `None`, clears) the rate limit of `queue`: `max` claims per window of
/// `period_us` (windows aligned to multiples of the period on the database clock). The current
/// window's count is kept (it restarts when the period changes, since the windows move).
/// Clearing a queue that has no row writes nothing.
pub(crate) async fn queue_set_rate_limit(
    conn: &mut SqliteConnection,
    queue: &str,
    rate: Option<(u32, i64)>,
) -> sqlx::Result<()> {
    match rate {
        Some((max, period_us)) => {
            sqlx::query!(
                r#"INSERT INTO taskq_queues (queue, rate_limit, rate_period_us, updated_at)
                   SELECT ?1, ?2, ?3, c.us FROM taskq_clock AS c WHERE true
                   ON CONFLICT (queue) DO UPDATE
                     SET rate_limit = excluded.rate_limit,
                         rate_period_us = excluded.rate_period_us,
                         updated_at = excluded.updated_at"#,
                queue,
                max,
                period_us
            )
            .execute(&mut *conn)
            .await?;
        }
        None => {
            sqlx::query!(
                r#"UPDATE taskq_queues AS q
                   SET rate_limit = NULL, rate_period_us = NULL, rate_window_start = NULL,
                       rate_window_count = 0, updated_at = c.us
                   FROM taskq_clock AS c WHERE q.queue = ?1"#,
                queue
            )
            .execute(&mut *conn)
            .await?;
        }
    }
    Ok(())
}

/// Every queue that has tasks pending or running, or a row in `taskq_queues` (paused or
/// limited, now or before), by name, with its controls and its pending and running counts.
/// One statement (a full outer join of the controls and the counts, written as a union).
pub(crate) async fn queue_list(conn: &mut SqliteConnection) -> sqlx::Result<Vec<QueueRow>> {
    let rows = sqlx::query!(
        r#"WITH counts AS (
             SELECT queue, SUM(state = 'pending') AS pending, SUM(state = 'running') AS running
             FROM taskq_tasks WHERE state IN ('pending', 'running') GROUP BY queue),
           names AS (SELECT queue FROM taskq_queues UNION SELECT queue FROM counts)
           SELECT n.queue AS "queue!: String", q.paused_at AS "paused_at?: i64",
             q.concurrency_limit AS "concurrency_limit?: u32",
             q.rate_limit AS "rate_limit?: u32", q.rate_period_us AS "rate_period_us?: i64",
             CASE WHEN q.rate_period_us > 0
                   AND q.rate_window_start = c.us / q.rate_period_us * q.rate_period_us
                  THEN q.rate_window_count ELSE 0 END AS "rate_used!: i64",
             COALESCE(k.pending, 0) AS "pending!: i64", COALESCE(k.running, 0) AS "running!: i64"
           FROM names AS n
             JOIN taskq_clock AS c
             LEFT JOIN taskq_queues AS q ON q.queue = n.queue
             LEFT JOIN counts AS k ON k.queue = n.queue
           ORDER BY n.queue"#
    )
    .fetch_all(&mut *conn)
    .await?;
    rows.into_iter()
        .map(|r| {
            Ok(QueueRow {
                queue: r.queue,
                paused_at: r.paused_at.map(time_from_us).transpose()?,
                concurrency_limit: r.concurrency_limit,
                rate: r.rate_limit.zip(r.rate_period_us.filter(|&p| p > 0)),
                rate_used: r.rate_used.max(0) as u64,
                pending: r.pending.max(0) as u64,
                running: r.running.max(0) as u64,
            })
        })
        .collect()
}
