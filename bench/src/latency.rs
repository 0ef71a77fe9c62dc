//! Pickup latency: enqueue-commit to handler-start, with and without in-process wake-up.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use sqlx::MySqlPool;
use sqlx::mysql::MySqlPoolOptions;
use taskq::Task;

use crate::Res;
use crate::scratch::reset;
use crate::task::{RECORD, STARTS, noop, start_worker};

#[derive(serde::Serialize)]
pub struct Latency {
    pub wake: bool,
    pub tasks: u64,
    pub interval_ms: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

/// Enqueue-commit → handler-start at a light steady load (one task every `interval`), with
/// in-process wake-up (`enqueue(&pool)`) or without (`enqueue_tx` on a separate pool: no
/// notify, the worker finds the task by polling at its default 25 ms – 1 s).
pub async fn latency(pool: &MySqlPool, wake: bool, n: u64, interval: Duration) -> Res<Latency> {
    reset(pool).await?;
    STARTS.lock().unwrap().clear();
    RECORD.store(true, Ordering::Relaxed);
    let w = start_worker(pool, 16)?;
    let other = MySqlPoolOptions::new()
        .max_connections(1)
        .connect_with((*pool.connect_options()).clone())
        .await?;
    tokio::time::sleep(Duration::from_millis(1500)).await; // let the worker go idle
    let mut commits = Vec::with_capacity(n as usize);
    let mut tick = tokio::time::interval(interval);
    for seq in 0..n {
        tick.tick().await;
        if wake {
            noop(seq).enqueue(pool).await?;
        } else {
            let mut conn = other.acquire().await?;
            noop(seq).enqueue_tx(&mut *conn).await?;
        }
        commits.push(Instant::now());
    }
    w.wait_for(n, Duration::from_secs(60)).await?;
    RECORD.store(false, Ordering::Relaxed);
    w.stop().await?;
    other.close().await;
    let starts = std::mem::take(&mut *STARTS.lock().unwrap());
    let mut ms: Vec<f64> = starts
        .iter()
        .map(|(seq, at)| {
            at.saturating_duration_since(commits[*seq as usize])
                .as_secs_f64()
                * 1000.0
        })
        .collect();
    ms.sort_by(f64::total_cmp);
    let q = |p: f64| ms[((ms.len() as f64 - 1.0) * p).round() as usize];
    Ok(Latency {
        wake,
        tasks: n,
        interval_ms: interval.as_secs_f64() * 1000.0,
        p50_ms: q(0.50),
        p99_ms: q(0.99),
        max_ms: q(1.0),
    })
}
