//! Drains: one worker draining preloaded tasks (throughput, statements, CPU and memory per
//! task), and the long drain whose memory is sampled.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use sqlx::MySqlPool;

use crate::Res;
use crate::counters::{COUNTERS, cpu_secs, reset_peak_rss, server_status, status_delta, vm_kib};
use crate::scratch::{bulk_insert, preload, reset};
use crate::task::start_worker;

#[derive(Clone, serde::Serialize)]
pub struct Drain {
    pub concurrency: usize,
    pub tasks: u64,
    pub secs: f64,
    pub tasks_per_s: f64,
    pub statements_per_task: f64,
    pub com_per_task: HashMap<String, f64>,
    pub cpu_ms_per_task: f64,
    pub peak_rss_kib: u64,
    pub claim_queries: u64,
    pub ack_flushes: u64,
}

/// Drains `n` preloaded tasks with one worker at `concurrency`.
pub async fn drain_once(
    pool: &MySqlPool,
    concurrency: usize,
    n: u64,
    preloaded: bool,
) -> Res<Drain> {
    if !preloaded {
        reset(pool).await?;
        preload(pool, n).await?;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    reset_peak_rss();
    let before = server_status(pool).await?;
    let cpu0 = cpu_secs();
    let start = Instant::now();
    let w = start_worker(pool, concurrency)?;
    w.wait_for(n, Duration::from_secs(3600)).await?;
    let secs = start.elapsed().as_secs_f64();
    let cpu = cpu_secs() - cpu0;
    let report = w.stop().await?;
    let after = server_status(pool).await?;
    Ok(Drain::new(
        concurrency,
        n,
        secs,
        cpu,
        &report,
        &status_delta(&before, &after),
    ))
}

impl Drain {
    /// The figures of a drain of `n` tasks that took `secs` and `cpu` seconds of CPU, from the
    /// worker's shutdown report and the server's counter deltas.
    fn new(
        concurrency: usize,
        n: u64,
        secs: f64,
        cpu: f64,
        report: &taskq::worker::ShutdownReport,
        delta: &HashMap<String, i64>,
    ) -> Self {
        let per = |k: &str| delta.get(k).copied().unwrap_or(0) as f64 / n as f64;
        Drain {
            concurrency,
            tasks: n,
            secs,
            tasks_per_s: n as f64 / secs,
            statements_per_task: per("Questions"),
            com_per_task: COUNTERS.iter().map(|k| ((*k).to_owned(), per(k))).collect(),
            cpu_ms_per_task: cpu * 1000.0 / n as f64,
            peak_rss_kib: vm_kib("VmHWM:"),
            claim_queries: report.stats.claim_queries,
            ack_flushes: report.stats.ack_flushes,
        }
    }
}

#[derive(serde::Serialize)]
pub struct MemSample {
    pub done: u64,
    pub rss_kib: u64,
}

/// Drains `n` bulk-inserted due tasks at concurrency 16, sampling RSS once a second.
pub async fn million_drain(pool: &MySqlPool, n: u64) -> Res<(Drain, Vec<MemSample>)> {
    reset(pool).await?;
    bulk_insert(pool, n, 1).await?;
    sqlx::query("ANALYZE TABLE taskq_tasks")
        .execute(pool)
        .await?;
    reset_peak_rss();
    let cpu0 = cpu_secs();
    let before = server_status(pool).await?;
    let start = Instant::now();
    let w = start_worker(pool, 16)?;
    let mut samples = Vec::new();
    let mut next = Instant::now();
    while w.succeeded() < n {
        if Instant::now() >= next {
            samples.push(MemSample {
                done: w.succeeded(),
                rss_kib: vm_kib("VmRSS:"),
            });
            next += Duration::from_secs(1);
        }
        if start.elapsed() > Duration::from_secs(3600) {
            return Err("million drain timed out".into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let secs = start.elapsed().as_secs_f64();
    let cpu = cpu_secs() - cpu0;
    samples.push(MemSample {
        done: w.succeeded(),
        rss_kib: vm_kib("VmRSS:"),
    });
    let report = w.stop().await?;
    let after = server_status(pool).await?;
    let delta = status_delta(&before, &after);
    Ok((Drain::new(16, n, secs, cpu, &report, &delta), samples))
}

pub fn median_by_rate(mut runs: Vec<Drain>) -> Drain {
    runs.sort_by(|a, b| a.tasks_per_s.total_cmp(&b.tasks_per_s));
    runs[runs.len() / 2].clone()
}
