//! Queue controls (`taskq_queues`): pause and resume, concurrency and rate limits, and the
//! queue list with its counts.

use chrono::{DateTime, Utc};
use sqlx::MySqlConnection;
use taskq_driver::driver::Queues;

use crate::MySqlDriver;
use taskq_driver::rows::{QueueControl, QueueRow};

impl Queues for MySqlDriver {
    /// Pauses `queue` (idempotent: an already paused queue keeps its first pause time).
    async fn queue_pause(&self, conn: &mut MySqlConnection, queue: &str) -> sqlx::Result<()> {
        sqlx::query!(
            r#"INSERT INTO taskq_queues (queue, paused_at, updated_at)
               VALUES (?, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))
               ON DUPLICATE KEY UPDATE paused_at = COALESCE(paused_at, UTC_TIMESTAMP(6)),
                                       updated_at = UTC_TIMESTAMP(6)"#,
            queue
        )
        .execute(&mut *conn)
        .await?;
        Ok(())
    }

    /// Resumes `queue`; returns whether it was paused.
    async fn queue_resume(&self, conn: &mut MySqlConnection, queue: &str) -> sqlx::Result<bool> {
        let done = sqlx::query!(
            r#"UPDATE taskq_queues SET paused_at = NULL, updated_at = UTC_TIMESTAMP(6)
               WHERE queue = ? AND paused_at IS NOT NULL"#,
            queue
        )
        .execute(&mut *conn)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Paused queues with the time they were paused.
    async fn queues_paused(
        &self,
        conn: &mut MySqlConnection,
    ) -> sqlx::Result<Vec<(String, DateTime<Utc>)>> {
        let rows = sqlx::query!(
            r#"SELECT queue, paused_at AS "paused_at!: DateTime<Utc>"
               FROM taskq_queues WHERE paused_at IS NOT NULL ORDER BY queue"#
        )
        .fetch_all(&mut *conn)
        .await?;
        Ok(rows.into_iter().map(|r| (r.queue, r.paused_at)).collect())
    }

    /// What a worker needs to know about its queues, in one read per refresh: the queues that
    /// are paused, and those with a concurrency or rate limit (whose claims take the limited
    /// path of `MySqlDriver::task_claim`).
    async fn queue_controls(&self, conn: &mut MySqlConnection) -> sqlx::Result<Vec<QueueControl>> {
        sqlx::query_as!(
            QueueControl,
            r#"SELECT queue, paused_at IS NOT NULL AS "paused!: bool",
                 (concurrency_limit IS NOT NULL OR rate_limit IS NOT NULL) AS "limited!: bool"
               FROM taskq_queues
               WHERE paused_at IS NOT NULL OR concurrency_limit IS NOT NULL OR rate_limit IS NOT NULL"#
        )
        .fetch_all(&mut *conn)
        .await
    }

    /// Sets (or, with `None`, clears) the concurrency limit of `queue`. Clearing a queue that
    /// has no row writes nothing.
    async fn queue_set_limit(
        &self,
        conn: &mut MySqlConnection,
        queue: &str,
        limit: Option<u32>,
    ) -> sqlx::Result<()> {
        match limit {
            Some(n) => {
                sqlx::query!(
                    r#"INSERT INTO taskq_queues (queue, concurrency_limit, updated_at)
                       VALUES (?, ?, UTC_TIMESTAMP(6))
                       ON DUPLICATE KEY UPDATE concurrency_limit = ?, updated_at = UTC_TIMESTAMP(6)"#,
                    queue,
                    n,
                    n
                )
                .execute(&mut *conn)
                .await?;
            }
            None => {
                sqlx::query!(
                    r#"UPDATE taskq_queues SET concurrency_limit = NULL, updated_at = UTC_TIMESTAMP(6)
                       WHERE queue = ?"#,
                    queue
                )
                .execute(&mut *conn)
                .await?;
            }
        }
        Ok(())
    }

    /// Sets (or, with `None`, clears) the rate limit of `queue`: `max` claims per window of
    /// `period_us`. The current window's count is kept (it restarts when the period changes,
    /// since the windows move). Clearing a queue that has no row writes nothing.
    async fn queue_set_rate_limit(
        &self,
        conn: &mut MySqlConnection,
        queue: &str,
        rate: Option<(u32, i64)>,
    ) -> sqlx::Result<()> {
        match rate {
            Some((max, period_us)) => {
                sqlx::query!(
                    r#"INSERT INTO taskq_queues (queue, rate_limit, rate_period_us, updated_at)
                       VALUES (?, ?, ?, UTC_TIMESTAMP(6))
                       ON DUPLICATE KEY UPDATE rate_limit = ?, rate_period_us = ?,
                                               updated_at = UTC_TIMESTAMP(6)"#,
                    queue,
                    max,
                    period_us,
                    max,
                    period_us
                )
                .execute(&mut *conn)
                .await?;
            }
            None => {
                sqlx::query!(
                    r#"UPDATE taskq_queues
                       SET rate_limit = NULL, rate_period_us = NULL, rate_window_start = NULL,
                           rate_window_count = 0, updated_at = UTC_TIMESTAMP(6)
                       WHERE queue = ?"#,
                    queue
                )
                .execute(&mut *conn)
                .await?;
            }
        }
        Ok(())
    }

    /// Every queue that has tasks pending or running, or a row in `taskq_queues` (paused or
    /// limited, now or before), by name, with its controls and its pending and running
    /// counts. Two statements: the controls, and one covering read of `ix_taskq_claim`'s
    /// pending and running ranges.
    async fn queue_list(&self) -> sqlx::Result<Vec<QueueRow>> {
        let mut conn = self.pool.acquire().await?;
        let controls = sqlx::query!(
            r#"SELECT queue, paused_at AS "paused_at: DateTime<Utc>",
                 concurrency_limit AS "concurrency_limit: u32",
                 rate_limit AS "rate_limit: u32", rate_period_us,
                 CAST(IF(rate_window_start = CAST('1970-01-01' AS DATETIME(6))
                           + INTERVAL (TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6))
                                       DIV rate_period_us * rate_period_us) MICROSECOND,
                         rate_window_count, 0) AS SIGNED) AS "rate_used!: i64"
               FROM taskq_queues ORDER BY queue"#
        )
        .fetch_all(&mut *conn)
        .await?;
        let counts = sqlx::query!(
            r#"SELECT queue, CAST(SUM(state = 'pending') AS SIGNED) AS "pending!: i64",
                 CAST(SUM(state = 'running') AS SIGNED) AS "running!: i64"
               FROM taskq_tasks FORCE INDEX (ix_taskq_claim) WHERE state IN ('pending', 'running')
               GROUP BY queue ORDER BY queue"#
        )
        .fetch_all(&mut *conn)
        .await?;
        let mut out: Vec<QueueRow> = controls
            .into_iter()
            .map(|c| QueueRow {
                queue: c.queue,
                paused_at: c.paused_at,
                concurrency_limit: c.concurrency_limit,
                rate: c.rate_limit.zip(c.rate_period_us.filter(|&p| p > 0)),
                rate_used: c.rate_used.max(0) as u64,
                pending: 0,
                running: 0,
            })
            .collect();
        for c in counts {
            let i = match out.binary_search_by(|r| r.queue.as_str().cmp(&c.queue)) {
                Ok(i) => i,
                Err(i) => {
                    out.insert(
                        i,
                        QueueRow {
                            queue: c.queue,
                            paused_at: None,
                            concurrency_limit: None,
                            rate: None,
                            rate_used: 0,
                            pending: 0,
                            running: 0,
                        },
                    );
                    i
                }
            };
            out[i].pending = c.pending.max(0) as u64;
            out[i].running = c.running.max(0) as u64;
        }
        Ok(out)
    }
}
