//! The database's ceiling for a drain: hand-written batched claim loops (`SKIP LOCKED`).

use std::time::Instant;

use sqlx::types::chrono::NaiveDateTime;
use sqlx::{Connection, MySqlPool, Row};

use crate::Res;
use crate::scratch::{preload, reset};
use crate::task::QUEUE;

/// How a hand-written claim finds and locks its rows.
#[derive(Clone, Copy, PartialEq)]
pub enum ClaimShape {
    /// `SELECT … ORDER BY … LIMIT n FOR UPDATE SKIP LOCKED` on the claim index: the loop the
    /// performance issue defines as the database's batched ceiling.
    LockingScan,
    /// taskq's claim: a plain read of 2n candidate ids on the claim index, then
    /// `SELECT … FOR UPDATE SKIP LOCKED` of those ids by primary key, stopping at n.
    TwoStep,
}

/// The hand-written batched loop: `conns` connections each repeat { BEGIN; claim up to `batch`
/// rows (see [`ClaimShape`]); UPDATE → running; COMMIT; UPDATE → succeeded } until `n`
/// preloaded tasks are done. Returns rows/s.
pub async fn raw_claim_loop(
    pool: &MySqlPool,
    conns: usize,
    n: u64,
    batch: u32,
    shape: ClaimShape,
) -> Res<f64> {
    reset(pool).await?;
    preload(pool, n).await?;
    let start = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..conns {
        let pool = pool.clone();
        set.spawn(async move {
            let mut conn = pool.acquire().await?;
            sqlx::query("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                .execute(&mut *conn)
                .await?;
            let mut done = 0u64;
            let mut after: Option<(u64, i16, NaiveDateTime)> = None;
            loop {
                let mut tx = conn.begin().await?;
                let rows = match shape {
                    ClaimShape::LockingScan => {
                        sqlx::query(
                            "SELECT id, name, payload, attempt, max_attempts, lease_epoch
                             FROM taskq_tasks
                             WHERE state = 'pending' AND queue = ? AND run_at <= UTC_TIMESTAMP(6)
                             ORDER BY priority, run_at, id LIMIT ? FOR UPDATE SKIP LOCKED",
                        )
                        .bind(QUEUE)
                        .bind(batch)
                        .fetch_all(&mut *tx)
                        .await?
                    }
                    ClaimShape::TwoStep => {
                        // Like taskq: after a contended claim, read candidates past the last
                        // one instead of re-reading rows other connections hold.
                        let seek = after.take();
                        let was_seek = seek.is_some();
                        let candidates: Vec<(u64, i16, NaiveDateTime)> = match seek {
                            None => sqlx::query_as(
                                "SELECT id, priority, run_at FROM taskq_tasks
                                 WHERE state = 'pending' AND queue = ?
                                   AND run_at <= UTC_TIMESTAMP(6)
                                 ORDER BY priority, run_at, id LIMIT ?",
                            )
                            .bind(QUEUE)
                            .bind(batch * 2)
                            .fetch_all(&mut *tx)
                            .await?,
                            Some((id, p, r)) => sqlx::query_as(
                                "SELECT id, priority, run_at FROM taskq_tasks
                                 WHERE state = 'pending' AND queue = ?
                                   AND run_at <= UTC_TIMESTAMP(6)
                                   AND (priority > ? OR (priority = ? AND run_at > ?)
                                        OR (priority = ? AND run_at = ? AND id > ?))
                                 ORDER BY priority, run_at, id LIMIT ?",
                            )
                            .bind(QUEUE)
                            .bind(p)
                            .bind(p)
                            .bind(r)
                            .bind(p)
                            .bind(r)
                            .bind(id)
                            .bind(batch * 2)
                            .fetch_all(&mut *tx)
                            .await?,
                        };
                        let full = candidates.len() as u32 == batch * 2;
                        let last = candidates.last().copied();
                        let ids: Vec<u64> = candidates.iter().map(|c| c.0).collect();
                        let rows = if ids.is_empty() {
                            Vec::new()
                        } else {
                            sqlx::query(
                                "SELECT t.id, t.name, t.payload, t.attempt, t.max_attempts,
                                     t.lease_epoch
                                 FROM JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$')) AS j
                                   STRAIGHT_JOIN taskq_tasks t FORCE INDEX (PRIMARY) ON t.id = j.id
                                 WHERE t.state = 'pending' AND t.run_at <= UTC_TIMESTAMP(6)
                                 LIMIT ? FOR UPDATE SKIP LOCKED",
                            )
                            .bind(serde_json::to_string(&ids)?)
                            .bind(batch)
                            .fetch_all(&mut *tx)
                            .await?
                        };
                        if (rows.len() as u32) < batch && full {
                            after = last;
                        }
                        if rows.is_empty() && (after.is_some() || was_seek) {
                            // Held by others, or the seek ran out: go on, from the head if
                            // nothing is left past the candidates.
                            tx.commit().await?;
                            continue;
                        }
                        rows
                    }
                };
                if rows.is_empty() {
                    tx.commit().await?;
                    break;
                }
                let leases: Vec<(u64, u64)> = rows
                    .iter()
                    .map(|r| (r.get::<u64, _>(0), r.get::<u64, _>(5) + 1))
                    .collect();
                let ids: Vec<u64> = leases.iter().map(|l| l.0).collect();
                sqlx::query(
                    "UPDATE JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$')) AS j
                       STRAIGHT_JOIN taskq_tasks t FORCE INDEX (PRIMARY) ON t.id = j.id
                     SET t.state = 'running', t.attempt = t.attempt + 1,
                         t.lease_epoch = t.lease_epoch + 1,
                         t.lease_until = UTC_TIMESTAMP(6) + INTERVAL 30 SECOND,
                         t.worker_id = 'raw', t.updated_at = UTC_TIMESTAMP(6)",
                )
                .bind(serde_json::to_string(&ids)?)
                .execute(&mut *tx)
                .await?;
                tx.commit().await?;
                sqlx::query(
                    "UPDATE JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$[0]',
                                                         epoch BIGINT UNSIGNED PATH '$[1]')) AS j
                       STRAIGHT_JOIN taskq_tasks t FORCE INDEX (PRIMARY)
                         ON t.id = j.id AND t.lease_epoch = j.epoch
                     SET t.state = 'succeeded', t.finished_at = UTC_TIMESTAMP(6),
                         t.lease_until = NULL, t.updated_at = UTC_TIMESTAMP(6)
                     WHERE t.state = 'running'",
                )
                .bind(serde_json::to_string(&leases)?)
                .execute(&mut *conn)
                .await?;
                done += rows.len() as u64;
            }
            Res::Ok(done)
        });
    }
    let mut total = 0;
    while let Some(r) = set.join_next().await {
        total += r??;
    }
    if total != n {
        return Err(format!("raw loop finished {total} of {n} tasks").into());
    }
    Ok(n as f64 / start.elapsed().as_secs_f64())
}
