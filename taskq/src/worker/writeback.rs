//! Batched write-back: outcomes of many handlers are gathered for `write_back_delay` and written in
//! one conditional statement (each row still guarded by its own lease epoch).
//!
//! A batch is written in chunks of at most [`MAX_BATCH`] outcomes whose statements stay within
//! the server's byte budget (`backend::budget`: error texts and follow-up rows count); a
//! follow-up too big for any statement is dropped before (see `follow`).
//!
//! A batch the database rejects for the data of one of its rows (a deterministic error: a
//! trigger, a constraint, a packet too large) must not hold the others back: it is split in
//! halves until the rejected rows are alone. A rejected row with a follow-up is written again
//! without it (the follow-up is logged and counted as lost); one without is logged, counted
//! (`writeback_rejected`) and dropped, its lease left to expire so the reaper returns the
//! task. Transient errors (connection, timeout, deadlock or Galera certification failure)
//! retry the whole chunk; a conflict (1213) is retried after a short pause rather than the
//! backoff.
//!
//! An outcome that would free a unique identity which a producer's open transaction holds
//! (that producer's enqueue was a duplicate of this task) is deferred rather than waited for:
//! it is written by a later flush, at least every [`DEFER_RETRY`], once that transaction has
//! ended; its lease is renewed meanwhile like any other.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use super::deadline::StmtError;
use super::lease::AttemptKey;
use super::observe::{self, OutcomeEvent, TaskOutcome};
use super::{Shared, WorkerStats, backoff_sleep, follow, within};
use crate::backend::WriteBack;
use crate::backend::budget::Budget;
use crate::metrics;
use crate::task::TaskId;

/// Most outcomes per write-back statement.
const MAX_BATCH: usize = 512;

/// How often deferred outcomes are tried again while nothing else is written.
const DEFER_RETRY: Duration = Duration::from_millis(50);

/// At shutdown, how many more times (every 200 ms) deferred outcomes are tried before they are
/// reported as not written.
const SHUTDOWN_DEFER_TRIES: u32 = 10;

// Nearly every message is an outcome, moved once into the batch it is written with: boxing it
// would add an allocation per outcome to save bytes in a queue of outcomes.
#[allow(clippy::large_enum_variant)]
pub(crate) enum WriteBackMsg {
    Outcome(WriteBack),
    /// Flush everything, then stop and report what could not be written.
    Shutdown(oneshot::Sender<Vec<TaskId>>),
}

pub(crate) async fn run(shared: Arc<Shared>, mut rx: mpsc::UnboundedReceiver<WriteBackMsg>) {
    let mut batch: Vec<WriteBack> = Vec::new();
    // Outcomes whose unique identity another transaction holds: tried again with every flush.
    let mut deferred: Vec<WriteBack> = Vec::new();
    loop {
        let first = if deferred.is_empty() {
            match rx.recv().await {
                Some(m) => Some(m),
                None => return,
            }
        } else {
            match tokio::time::timeout(DEFER_RETRY, rx.recv()).await {
                Ok(Some(m)) => Some(m),
                Ok(None) => return,
                Err(_) => None,
            }
        };
        let mut reply = None;
        match first {
            Some(WriteBackMsg::Outcome(f)) => batch.push(f),
            Some(WriteBackMsg::Shutdown(tx)) => reply = Some(tx),
            None => {}
        }
        if reply.is_none() && !batch.is_empty() {
            // Gather what else completes within the write-back delay.
            let deadline = tokio::time::Instant::now() + shared.cfg.write_back_delay;
            while batch.len() < MAX_BATCH {
                match tokio::time::timeout_at(deadline, rx.recv()).await {
                    Ok(Some(WriteBackMsg::Outcome(f))) => batch.push(f),
                    Ok(Some(WriteBackMsg::Shutdown(tx))) => {
                        reply = Some(tx);
                        break;
                    }
                    Ok(None) | Err(_) => break,
                }
            }
        }
        batch.append(&mut deferred);
        if let Some(tx) = reply {
            while let Ok(WriteBackMsg::Outcome(f)) = rx.try_recv() {
                batch.push(f);
            }
            let mut left = flush_with_retries(&shared, &mut batch, 10, &mut deferred).await;
            for _ in 0..SHUTDOWN_DEFER_TRIES {
                if deferred.is_empty() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
                batch.append(&mut deferred);
                left.extend(flush_with_retries(&shared, &mut batch, 10, &mut deferred).await);
            }
            let mut inflight = shared.inflight();
            for f in deferred.drain(..) {
                tracing::warn!(
                    task_id = f.id,
                    lease_epoch = f.epoch,
                    outcome = f.state,
                    "taskq: outcome not written at shutdown: a transaction still holds the task's unique identity; the lease will expire and the task run again"
                );
                inflight.remove(&key(&f));
                left.push(TaskId(f.id));
            }
            drop(inflight);
            let _ = tx.send(left);
            return;
        }
        flush_with_retries(&shared, &mut batch, u32::MAX, &mut deferred).await;
    }
}

/// Asks the write-back loop to flush and stop; returns the ids whose outcome could not be written.
pub(crate) async fn stop(shared: &Shared, writer: JoinHandle<()>) -> Vec<TaskId> {
    let (tx, rx) = oneshot::channel();
    if shared.write_backs.send(WriteBackMsg::Shutdown(tx)).is_err() {
        return Vec::new();
    }
    let left = rx.await.unwrap_or_default();
    let _ = writer.await;
    left
}

/// Writes `batch` in chunks, retrying transient errors up to `tries` times per chunk (the
/// heartbeat keeps the leases alive meanwhile) and isolating rows the database rejects.
/// Returns ids left unwritten after transient errors; outcomes deferred because a transaction
/// holds the unique identity they would free are appended to `deferred`.
async fn flush_with_retries(
    shared: &Shared,
    batch: &mut Vec<WriteBack>,
    tries: u32,
    deferred: &mut Vec<WriteBack>,
) -> Vec<TaskId> {
    let mut left = Vec::new();
    if batch.is_empty() {
        return left;
    }
    let Some(budget) = budget_with_retries(shared, tries).await else {
        let mut inflight = shared.inflight();
        for f in batch.drain(..) {
            inflight.remove(&key(&f));
            left.push(TaskId(f.id));
        }
        return left;
    };
    for f in batch.iter_mut() {
        follow::fit(shared, &mut f.follow_up, &budget, f.id, &f.name);
    }
    // Chunks still to write; a rejected chunk comes back as its two halves.
    let mut pending: Vec<Vec<WriteBack>> = Vec::new();
    for n in budget.chunks(batch.iter().map(WriteBack::json_len), MAX_BATCH) {
        pending.push(batch.drain(..n).collect());
    }
    pending.reverse();
    while let Some(mut chunk) = pending.pop() {
        let mut failures = 0u32;
        loop {
            let e = match flush(shared, &chunk).await {
                Ok(later) => {
                    deferred.extend(later);
                    break;
                }
                Err(e) => e,
            };
            WorkerStats::add(&shared.stats.db_errors, 1);
            if e.is_deterministic() {
                if chunk.len() == 1 && chunk[0].follow_up.is_some() {
                    let f = &mut chunk[0];
                    follow::refused(shared, &mut f.follow_up, f.id, &f.name, &e);
                    pending.push(chunk);
                } else if chunk.len() == 1 {
                    reject(shared, &chunk[0], &e);
                } else {
                    tracing::warn!(error = %e, tasks = chunk.len(),
                        "taskq: write-back rejected; splitting the batch to isolate the row");
                    let second = chunk.split_off(chunk.len() / 2);
                    pending.push(second);
                    pending.push(chunk);
                }
                break;
            }
            failures += 1;
            tracing::warn!(error = %e, tasks = chunk.len(), failures, "taskq: write-back failed; retrying");
            if failures >= tries {
                let mut inflight = shared.inflight();
                for f in &chunk {
                    inflight.remove(&key(f));
                    left.push(TaskId(f.id));
                }
                break;
            }
            if e.is_conflict() && failures <= 3 {
                // Lost to a concurrent transaction (on Galera: failed certification); the
                // chunk was rolled back as a whole and each row stays fenced by its epoch.
                super::deadline::conflict_pause().await;
            } else if shared.stopping() {
                tokio::time::sleep(Duration::from_millis(200)).await;
            } else {
                backoff_sleep(shared, failures).await;
            }
        }
    }
    left
}

/// The server's statement budget, tried up to `tries` times (it is read once per worker).
async fn budget_with_retries(shared: &Shared, tries: u32) -> Option<Budget> {
    let mut failures = 0u32;
    loop {
        match follow::budget(shared).await {
            Ok(b) => return Some(b),
            Err(e) => {
                WorkerStats::add(&shared.stats.db_errors, 1);
                failures += 1;
                tracing::warn!(error = %e, failures, "taskq: reading the database's packet size failed; retrying");
                if failures >= tries {
                    return None;
                }
                if shared.stopping() {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                } else {
                    backoff_sleep(shared, failures).await;
                }
            }
        }
    }
}

/// The lease-table key of an outcome's attempt.
fn key(f: &WriteBack) -> AttemptKey {
    AttemptKey {
        id: f.id,
        epoch: f.epoch,
    }
}

/// Drops an outcome the database rejected for its own row: logged and counted; the lease is
/// no longer renewed, so it expires and the reaper returns the task (attempt counted).
fn reject(shared: &Shared, f: &WriteBack, e: &StmtError) {
    let label = shared.inflight().remove(&key(f));
    WorkerStats::add(&shared.stats.writeback_rejected, 1);
    if let Some(l) = &label {
        metrics::writeback_rejected(&l.queue, &l.name);
    }
    tracing::error!(task_id = f.id, lease_epoch = f.epoch, outcome = f.state, error = %e,
        "taskq: the database rejected this outcome; not retried, the lease will expire and the reaper returns the task");
    observe::emit(shared, || event(f, TaskOutcome::Rejected, false));
}

/// The observers' view of a written (or rejected) outcome.
fn event(f: &WriteBack, outcome: TaskOutcome, follow_up: bool) -> OutcomeEvent {
    OutcomeEvent {
        task_id: TaskId(f.id),
        name: f.name.clone(),
        queue: f.queue.clone(),
        attempt: f.attempt,
        outcome,
        error: f.error.clone(),
        duration: Some(f.ran),
        follow_up,
    }
}

/// Writes one chunk; returns the outcomes deferred (see the module docs).
async fn flush(shared: &Shared, chunk: &[WriteBack]) -> Result<Vec<WriteBack>, StmtError> {
    WorkerStats::add(&shared.stats.ack_flushes, 1);
    let done = within!(shared, |c| shared.store.task_write_back(c, chunk)).await?;
    if done.written > 0 {
        // Waiters in this process (`Client::wait`) read again.
        crate::wake::ended();
    }
    // Workflow steps and batch callbacks made due by this chunk's ends: wake this process's
    // claim loops.
    let mut woken: Vec<&str> = done
        .settled
        .released
        .iter()
        .chain(&done.counted.released)
        .map(|(_, q)| q.as_str())
        .collect();
    woken.sort_unstable();
    woken.dedup();
    for q in woken {
        crate::wake::notify(q);
    }
    let (later, chunk): (Vec<&WriteBack>, Vec<&WriteBack>) =
        chunk.iter().partition(|f| done.deferred.contains(&f.id));
    if !later.is_empty() {
        WorkerStats::add(&shared.stats.unique_deferred, later.len() as u64);
        tracing::debug!(
            tasks = later.len(),
            "taskq: outcomes deferred: a transaction holds their unique identity"
        );
    }
    let mut fenced: Vec<&WriteBack> = Vec::new();
    if (done.written as usize) < chunk.len() {
        // Find which rows were rejected: their epoch moved (or the row is gone).
        let ids: Vec<u64> = chunk.iter().map(|f| f.id).collect();
        let epochs = within!(shared, |c| shared.store.task_epochs(c, &ids)).await?;
        fenced = chunk
            .iter()
            .copied()
            .filter(|f| !epochs.iter().any(|(id, ep)| *id == f.id && *ep == f.epoch))
            .collect();
    }
    let mut inflight = shared.inflight();
    let labels: Vec<_> = chunk
        .iter()
        .map(|f| inflight.remove(&key(f)).map(|e| (e.queue, e.name)))
        .collect();
    drop(inflight);
    // A claim loop waiting at its queue's concurrency limit tries again now that these
    // tasks no longer count as running.
    let mut last: Option<&str> = None;
    for (queue, _) in labels.iter().flatten() {
        if last != Some(&**queue) {
            last = Some(queue);
            if let Some(n) = shared.written.get(&**queue) {
                n.notify_waiters();
            }
        }
    }
    // An ordered head that ended promoted its key's next task in the same transaction: one
    // of this process's claim loops of its queue takes it now instead of at its next poll (one
    // key otherwise runs one task per poll interval).
    for (f, label) in chunk.iter().zip(&labels) {
        if let Some((queue, _)) = label
            && f.order_ends.is_some()
            && !fenced.iter().any(|x| x.id == f.id)
        {
            crate::wake::nudge(queue);
        }
    }
    let stats = &shared.stats;
    for (f, label) in chunk.iter().zip(&labels) {
        let is_fenced = fenced.iter().any(|x| x.id == f.id);
        let outcome = match f.state {
            _ if is_fenced => "fenced",
            "succeeded" => "succeeded",
            "pending" => "retried",
            "snoozed" => "snoozed",
            "canceled" => "canceled",
            _ => "dead",
        };
        let observed = match outcome {
            "fenced" => TaskOutcome::Fenced,
            "succeeded" => {
                WorkerStats::add(&stats.succeeded, 1);
                TaskOutcome::Succeeded
            }
            "retried" => {
                WorkerStats::add(&stats.retried, 1);
                TaskOutcome::Retried
            }
            "snoozed" => {
                WorkerStats::add(&stats.snoozed, 1);
                TaskOutcome::Snoozed
            }
            "canceled" => {
                WorkerStats::add(&stats.canceled, 1);
                TaskOutcome::Canceled
            }
            _ => {
                WorkerStats::add(&stats.dead, 1);
                TaskOutcome::Dead
            }
        };
        let followed = done.followed.contains(&f.id);
        if followed {
            WorkerStats::add(&stats.follow_ups, 1);
            let kind = if f.state == "dead" {
                "on_dead"
            } else {
                "on_success"
            };
            metrics::follow_up(&f.name, kind);
        }
        observe::emit(shared, || event(f, observed, followed));
        if let Some((queue, name)) = label {
            match outcome {
                "fenced" => metrics::fenced(queue, name),
                "snoozed" => metrics::snoozed(queue, name),
                _ => metrics::completed(queue, name, outcome),
            }
        }
    }
    for f in fenced {
        WorkerStats::add(&stats.fenced, 1);
        tracing::warn!(
            task_id = f.id,
            lease_epoch = f.epoch,
            outcome = f.state,
            "taskq: stale write-back rejected (lease epoch moved; another worker owns the task)"
        );
    }
    Ok(later.into_iter().cloned().collect())
}
