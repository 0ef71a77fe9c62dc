//! Maintenance inside every worker: the reaper (expired leases back to pending, or to dead
//! when attempts are exhausted) and retention (deleting old terminal tasks in small batches,
//! the identities of unique windows that have ended, the `taskq_workers` rows of workers
//! not seen for [`WORKER_ROW_RETENTION`](super::WORKER_ROW_RETENTION), and audit rows older
//! than the longest terminal-task retention).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Shared, WorkerStats, within};
use crate::task::TaskState;
use crate::wake;

/// Rows per reaper or retention statement: small, so no statement holds locks for long.
const BATCH: u32 = 500;

pub(crate) async fn run(shared: Arc<Shared>) {
    let mut next_prune = Instant::now();
    let mut next_backlog = Instant::now();
    loop {
        reap(&shared).await;
        if Instant::now() >= next_prune {
            prune(&shared).await;
            next_prune = Instant::now() + shared.cfg.retention.interval;
        }
        if let Some(every) = shared.cfg.backlog_interval
            && Instant::now() >= next_backlog
        {
            backlog(&shared).await;
            next_backlog = Instant::now() + every;
        }
        tokio::select! {
            _ = tokio::time::sleep(shared.cfg.reaper_interval) => {}
            _ = shared.stopped() => return,
        }
    }
}

async fn reap(shared: &Shared) {
    let mut total = 0;
    loop {
        match within!(shared, |c| shared.store.task_reap_expired(c, BATCH)).await {
            Ok((found, reaped)) => {
                total += reaped;
                if found < u64::from(BATCH) {
                    break;
                }
            }
            Err(e) => {
                WorkerStats::add(&shared.stats.db_errors, 1);
                tracing::warn!(error = %e, "taskq: reaper failed");
                break;
            }
        }
    }
    if total > 0 {
        WorkerStats::add(&shared.stats.reaped, total);
        crate::metrics::reaped(total);
        tracing::info!(reaped = total, "taskq: expired leases reaped");
        for q in shared.cfg.queues.keys() {
            wake::notify(q);
        }
    }
}

async fn prune(shared: &Shared) {
    // Identities of ended windows: not task retention (their tasks may be kept much longer),
    // but the end of what they stand for; always pruned.
    loop {
        match within!(shared, |c| shared.store.unique_prune_expired(c, BATCH)).await {
            Ok(n) if n < u64::from(BATCH) || shared.stopping() => break,
            Ok(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            Err(e) => {
                WorkerStats::add(&shared.stats.db_errors, 1);
                tracing::warn!(error = %e, "taskq: pruning ended unique windows failed");
                break;
            }
        }
    }
    // Rows of workers not seen for a day (stopped, or gone without a goodbye).
    loop {
        let age = super::WORKER_ROW_RETENTION.as_secs();
        match within!(shared, |c| shared.store.worker_prune(c, age, BATCH)).await {
            Ok(n) if n < u64::from(BATCH) || shared.stopping() => break,
            Ok(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            Err(e) => {
                WorkerStats::add(&shared.stats.db_errors, 1);
                tracing::warn!(error = %e, "taskq: pruning old worker rows failed");
                break;
            }
        }
    }
    let r = shared.cfg.retention;
    // Audit rows: kept as long as the longest-kept terminal tasks (forever if any is kept
    // forever), so an operator action outlives the tasks it touched.
    let keep_audit = [r.succeeded, r.dead, r.canceled, r.expired]
        .into_iter()
        .try_fold(Duration::ZERO, |longest, keep| keep.map(|k| longest.max(k)));
    if let Some(keep) = keep_audit {
        loop {
            let age = keep.as_secs();
            match within!(shared, |c| shared.store.audit_prune(c, age, BATCH)).await {
                Ok(n) if n < u64::from(BATCH) || shared.stopping() => break,
                Ok(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                Err(e) => {
                    WorkerStats::add(&shared.stats.db_errors, 1);
                    tracing::warn!(error = %e, "taskq: pruning old audit rows failed");
                    break;
                }
            }
        }
    }
    for (state, keep) in [
        (TaskState::Succeeded, r.succeeded),
        (TaskState::Dead, r.dead),
        (TaskState::Canceled, r.canceled),
        (TaskState::Expired, r.expired),
    ] {
        let Some(keep) = keep else { continue };
        loop {
            let age = keep.as_secs();
            match within!(shared, |c| shared.store.task_prune(c, state, age, BATCH)).await {
                Ok(n) => {
                    WorkerStats::add(&shared.stats.pruned, n);
                    crate::metrics::pruned(n);
                    if n < u64::from(BATCH) || shared.stopping() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Err(e) => {
                    WorkerStats::add(&shared.stats.db_errors, 1);
                    tracing::warn!(error = %e, "taskq: retention failed");
                    break;
                }
            }
        }
    }
}

/// Publishes the per queue × state backlog gauges (zero for states with no rows).
async fn backlog(shared: &Shared) {
    match within!(shared, |c| shared.store.task_stats(c)).await {
        Ok(rows) => {
            let mut queues: Vec<&str> = shared.cfg.queues.keys().map(String::as_str).collect();
            queues.extend(rows.iter().map(|r| r.queue.as_str()));
            queues.sort_unstable();
            queues.dedup();
            for q in queues {
                for st in TaskState::ALL {
                    let n = rows
                        .iter()
                        .find(|r| r.queue == q && r.state == st)
                        .map_or(0, |r| r.count);
                    crate::metrics::backlog(q, st.as_str(), n);
                }
            }
        }
        Err(e) => {
            WorkerStats::add(&shared.stats.db_errors, 1);
            tracing::warn!(error = %e, "taskq: backlog metrics query failed");
        }
    }
}

/// Keeps `Shared::paused` in step with `taskq_queues` (one query per `poll_max`); wakes the
/// claim loop of a queue that was resumed.
pub(crate) async fn watch_pauses(shared: Arc<Shared>) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(shared.cfg.poll_max) => {}
            _ = shared.stopped() => return,
        }
        refresh_pauses(&shared).await;
    }
}

/// Reads the paused queues once.
pub(crate) async fn refresh_pauses(shared: &Shared) {
    match within!(shared, |c| shared.store.queues_paused(c)).await {
        Ok(rows) => {
            let now: std::collections::HashSet<String> = rows.into_iter().map(|r| r.0).collect();
            let resumed: Vec<String> = {
                let mut paused = shared.paused.lock().unwrap_or_else(|e| e.into_inner());
                let resumed = paused.difference(&now).cloned().collect();
                for q in now.difference(&paused) {
                    tracing::info!(queue = %q, "taskq: queue paused");
                }
                *paused = now;
                resumed
            };
            for q in resumed {
                tracing::info!(queue = %q, "taskq: queue resumed");
                wake::notify(&q);
            }
        }
        Err(e) => {
            WorkerStats::add(&shared.stats.db_errors, 1);
            tracing::warn!(error = %e, "taskq: reading paused queues failed");
        }
    }
}
