//! Enqueue: a hand-written INSERT + COMMIT against `enqueue_tx` + COMMIT (interleaved), and
//! `enqueue_many`.

use std::time::{Duration, Instant};

use sqlx::{Connection, MySqlPool};
use taskq::Task;

use crate::Res;
use crate::scratch::reset;
use crate::task::{Noop, QUEUE, TASK, noop};

/// Length of one time slice of [`insert_rates`]: every connection switches between the raw
/// INSERT and `enqueue_tx` at each slice boundary.
pub const INSERT_SLICE: Duration = Duration::from_millis(100);

/// Hand-written single-row INSERT + COMMIT and `enqueue_tx` + COMMIT on `conns` connections
/// for `secs`, interleaved in 100 ms slices (even slices raw, odd slices taskq, on every
/// connection at once), so that drift in the machine's speed over the run (other load, the
/// disk's fsync latency) falls on both equally. Returns `(raw, taskq)` transactions per second,
/// each over the half of the run it had.
pub async fn insert_rates(pool: &MySqlPool, conns: usize, secs: f64) -> Res<(f64, f64)> {
    reset(pool).await?;
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(secs);
    let mut set = tokio::task::JoinSet::new();
    for c in 0..conns {
        let pool = pool.clone();
        set.spawn(async move {
            let mut conn = pool.acquire().await?;
            let (mut raw, mut tq) = (0u64, 0u64);
            let payload = serde_json::to_vec(&noop(0))?;
            loop {
                let now = Instant::now();
                if now >= deadline {
                    break;
                }
                let slice = (now - start).as_nanos() / INSERT_SLICE.as_nanos();
                let taskq = slice % 2 == 1;
                let mut tx = conn.begin().await?;
                if taskq {
                    noop(c as u64 * 10_000_000 + tq).enqueue_tx(&mut tx).await?;
                } else {
                    sqlx::query(
                        "INSERT INTO taskq_tasks (queue, name, payload, state, priority,
                             max_attempts, run_at, idempotency_key, created_at, updated_at)
                         VALUES (?, ?, ?, 'pending', ?, ?, UTC_TIMESTAMP(6), NULL,
                             UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))",
                    )
                    .bind(QUEUE)
                    .bind(TASK)
                    .bind(&payload)
                    .bind(0i16)
                    .bind(20u32)
                    .execute(&mut *tx)
                    .await?;
                }
                tx.commit().await?;
                if taskq {
                    tq += 1;
                } else {
                    raw += 1;
                }
            }
            Res::Ok((raw, tq))
        });
    }
    let (mut raw, mut tq) = (0, 0);
    while let Some(r) = set.join_next().await {
        let (r, t) = r??;
        raw += r;
        tq += t;
    }
    let half = start.elapsed().as_secs_f64() / 2.0;
    Ok((raw as f64 / half, tq as f64 / half))
}

pub async fn enqueue_many_rate(pool: &MySqlPool, n: u64, per_tx: u64) -> Res<f64> {
    reset(pool).await?;
    let tasks: Vec<Noop> = (0..n).map(noop).collect();
    let start = Instant::now();
    let mut it = tasks.into_iter().peekable();
    while it.peek().is_some() {
        let chunk: Vec<Noop> = it.by_ref().take(per_tx as usize).collect();
        let mut tx = pool.begin().await?;
        taskq::enqueue::enqueue_many(&mut tx, chunk).await?;
        tx.commit().await?;
    }
    Ok(n as f64 / start.elapsed().as_secs_f64())
}
