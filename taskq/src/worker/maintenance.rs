//! Maintenance inside every worker: the reaper (expired leases back to pending, or to dead
//! when attempts are exhausted) and retention (deleting old terminal tasks in small batches,
//! the identities of unique windows that have ended, the `taskq_workers` rows of workers
//! not seen for [`WORKER_ROW_RETENTION`](crate::limits::WORKER_ROW_RETENTION), and audit rows older
//! than the longest terminal-task retention).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::observe::{self, OutcomeEvent, TaskOutcome};
use super::{Shared, WorkerStats, follow, within};
use crate::backend::{ExpiredRow, ReapRow};
use crate::followup::{DeadTask, payload_value};
use crate::task::{TaskId, TaskState};
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

/// Reaps expired leases in rounds of [`BATCH`]: a plain read of the expired rows, then the
/// reap of those rows (see `Store::task_reap`). A task whose reap moves it to dead gets its
/// `on_dead` follow-up in the reap's transaction; one whose name this worker does not
/// register is not even read (only a worker that registers it knows its follow-up), so it
/// waits for such a worker's reaper.
async fn reap(shared: &Shared) {
    let mut total = 0;
    // Observers need to know exactly which rows were reaped.
    let exact = !shared.observers.is_empty();
    loop {
        let rows = match within!(shared, |c| shared.store.task_expired(
            c,
            &shared.names_json,
            BATCH
        ))
        .await
        {
            Ok(rows) => rows,
            Err(e) => {
                WorkerStats::add(&shared.stats.db_errors, 1);
                tracing::warn!(error = %e, "taskq: reaper failed");
                break;
            }
        };
        if rows.is_empty() {
            break;
        }
        let found = rows.len();
        let plan: Vec<ReapRow> = rows.iter().map(|r| plan(shared, r)).collect();
        match within!(shared, |c| shared.store.task_reap(c, &plan, exact)).await {
            Ok(done) => {
                total += done.reaped;
                WorkerStats::add(&shared.stats.follow_ups, done.followed.len() as u64);
                for id in &done.followed {
                    if let Some(r) = rows.iter().find(|r| r.id == *id) {
                        crate::metrics::follow_up(&r.name, "on_dead");
                    }
                }
                for (id, state) in &done.rows {
                    let Some(r) = rows.iter().find(|r| r.id == *id) else {
                        continue;
                    };
                    observe::emit(shared, || OutcomeEvent {
                        task_id: TaskId(r.id),
                        name: r.name.as_str().into(),
                        queue: r.queue.as_str().into(),
                        attempt: r.attempt,
                        outcome: TaskOutcome::Reaped(*state),
                        error: Some(reap_error(r)),
                        duration: None,
                        follow_up: done.followed.contains(id),
                    });
                }
            }
            Err(e) => {
                WorkerStats::add(&shared.stats.db_errors, 1);
                tracing::warn!(error = %e, "taskq: reaper failed");
                break;
            }
        }
        if found < BATCH as usize {
            break;
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

/// The reap of one expired row, with its `on_dead` follow-up when the reap moves it to dead.
fn plan(shared: &Shared, r: &ExpiredRow) -> ReapRow {
    let follow_up = if r.goes_dead() {
        follow::dead(
            shared,
            shared.handlers.get(r.name.as_str()),
            || DeadTask {
                id: TaskId(r.id),
                name: r.name.clone(),
                queue: r.queue.clone(),
                attempts: r.attempt,
                max_attempts: r.max_attempts,
                last_error: reap_error(r),
                payload: payload_value(r.payload.as_deref().unwrap_or_default()),
            },
            r.lease_epoch,
            r.trace_context.as_deref(),
        )
    } else {
        None
    };
    ReapRow {
        id: r.id,
        epoch: r.lease_epoch,
        frees: r.frees.clone(),
        canceled: r.canceled,
        follow_up,
    }
}

/// The error the reap stores (the same text as the reap's SQL writes).
fn reap_error(r: &ExpiredRow) -> String {
    format!(
        "lease expired (worker {}, attempt {})",
        r.worker_id.as_deref().unwrap_or("?"),
        r.attempt
    )
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
        let age = crate::limits::WORKER_ROW_RETENTION.as_secs();
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

/// Keeps `Shared::paused` and `Shared::limited` in step with `taskq_queues` (one query per
/// `poll_max`); wakes the claim loop of a queue that was resumed or whose limits were cleared.
pub(crate) async fn watch_controls(shared: Arc<Shared>) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(shared.cfg.poll_max) => {}
            _ = shared.stopped() => return,
        }
        refresh_controls(&shared).await;
    }
}

/// Reads the paused and limited queues once.
pub(crate) async fn refresh_controls(shared: &Shared) {
    match within!(shared, control, |c| shared.store.queue_controls(c)).await {
        Ok(rows) => {
            let paused_now: HashSet<String> = rows
                .iter()
                .filter(|r| r.paused)
                .map(|r| r.queue.clone())
                .collect();
            let limited_now: HashSet<String> = rows
                .iter()
                .filter(|r| r.limited)
                .map(|r| r.queue.clone())
                .collect();
            let resumed: Vec<String> = {
                let mut paused = shared.paused.lock().unwrap_or_else(|e| e.into_inner());
                let resumed = paused.difference(&paused_now).cloned().collect();
                for q in paused_now.difference(&paused) {
                    tracing::info!(queue = %q, "taskq: queue paused");
                }
                *paused = paused_now;
                resumed
            };
            let unlimited: Vec<String> = {
                let mut limited = shared.limited.lock().unwrap_or_else(|e| e.into_inner());
                let unlimited = limited.difference(&limited_now).cloned().collect();
                for q in limited_now.difference(&limited) {
                    if shared.cfg.queues.contains_key(q) {
                        tracing::info!(queue = %q, "taskq: queue limited: its claims now go through the limit");
                    }
                }
                *limited = limited_now;
                unlimited
            };
            for q in resumed {
                tracing::info!(queue = %q, "taskq: queue resumed");
                wake::notify(&q);
            }
            for q in unlimited {
                if shared.cfg.queues.contains_key(&q) {
                    tracing::info!(queue = %q, "taskq: queue limits cleared");
                }
                if let Some(n) = shared.written.get(&q) {
                    n.notify_waiters();
                }
            }
        }
        Err(e) => {
            WorkerStats::add(&shared.stats.db_errors, 1);
            tracing::warn!(error = %e, "taskq: reading paused and limited queues failed");
        }
    }
}
