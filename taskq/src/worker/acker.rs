//! Batched write-back: outcomes of many handlers are gathered for `ack_delay` and written in
//! one conditional statement (each row still guarded by its own lease epoch).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use super::{Shared, WorkerStats, backoff_sleep};
use crate::metrics;
use crate::store::Finish;
use crate::task::TaskId;

/// Most outcomes per write-back statement.
const MAX_BATCH: usize = 512;

pub(crate) enum AckMsg {
    Finish(Finish),
    /// Flush everything, then stop and report what could not be written.
    Shutdown(oneshot::Sender<Vec<TaskId>>),
}

pub(crate) async fn run(shared: Arc<Shared>, mut rx: mpsc::UnboundedReceiver<AckMsg>) {
    let mut batch: Vec<Finish> = Vec::new();
    loop {
        let Some(first) = rx.recv().await else { return };
        let mut reply = None;
        match first {
            AckMsg::Finish(f) => batch.push(f),
            AckMsg::Shutdown(tx) => reply = Some(tx),
        }
        if reply.is_none() {
            // Gather what else completes within the ack delay.
            let deadline = tokio::time::Instant::now() + shared.cfg.ack_delay;
            while batch.len() < MAX_BATCH {
                match tokio::time::timeout_at(deadline, rx.recv()).await {
                    Ok(Some(AckMsg::Finish(f))) => batch.push(f),
                    Ok(Some(AckMsg::Shutdown(tx))) => {
                        reply = Some(tx);
                        break;
                    }
                    Ok(None) | Err(_) => break,
                }
            }
        }
        if let Some(tx) = reply {
            while let Ok(AckMsg::Finish(f)) = rx.try_recv() {
                batch.push(f);
            }
            let left = flush_with_retries(&shared, &mut batch, 10).await;
            let _ = tx.send(left);
            return;
        }
        flush_with_retries(&shared, &mut batch, u32::MAX).await;
    }
}

/// Asks the acker to flush and stop; returns the ids whose outcome could not be written.
pub(crate) async fn finish(shared: &Shared, acker: JoinHandle<()>) -> Vec<TaskId> {
    let (tx, rx) = oneshot::channel();
    if shared.acks.send(AckMsg::Shutdown(tx)).is_err() {
        return Vec::new();
    }
    let left = rx.await.unwrap_or_default();
    let _ = acker.await;
    left
}

/// Writes `batch` in chunks, retrying database errors up to `tries` times per chunk (the
/// heartbeat keeps the leases alive meanwhile). Returns ids left unwritten.
async fn flush_with_retries(shared: &Shared, batch: &mut Vec<Finish>, tries: u32) -> Vec<TaskId> {
    let mut left = Vec::new();
    while !batch.is_empty() {
        let n = batch.len().min(MAX_BATCH);
        let chunk: Vec<Finish> = batch.drain(..n).collect();
        let mut failures = 0u32;
        loop {
            match flush(shared, &chunk).await {
                Ok(()) => break,
                Err(e) => {
                    WorkerStats::add(&shared.stats.db_errors, 1);
                    failures += 1;
                    tracing::warn!(error = %e, tasks = chunk.len(), failures, "taskq: write-back failed; retrying");
                    if failures >= tries {
                        let mut inflight = shared.inflight();
                        for f in &chunk {
                            inflight.remove(&f.id);
                            left.push(TaskId(f.id));
                        }
                        break;
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
    left
}

async fn flush(shared: &Shared, chunk: &[Finish]) -> sqlx::Result<()> {
    WorkerStats::add(&shared.stats.ack_flushes, 1);
    let written = shared.store.task_finish(chunk).await?;
    let mut fenced: Vec<&Finish> = Vec::new();
    if (written as usize) < chunk.len() {
        // Find which rows were rejected: their epoch moved (or the row is gone).
        let ids = serde_json::to_string(&chunk.iter().map(|f| f.id).collect::<Vec<_>>())
            .expect("ids serialize");
        let epochs = shared.store.task_epochs(&ids).await?;
        fenced = chunk
            .iter()
            .filter(|f| !epochs.iter().any(|(id, ep)| *id == f.id && *ep == f.epoch))
            .collect();
    }
    let mut inflight = shared.inflight();
    let labels: Vec<_> = chunk
        .iter()
        .map(|f| inflight.remove(&f.id).map(|e| (e.queue, e.name)))
        .collect();
    drop(inflight);
    let stats = &shared.stats;
    for (f, label) in chunk.iter().zip(&labels) {
        let is_fenced = fenced.iter().any(|x| x.id == f.id);
        let outcome = match f.state {
            _ if is_fenced => "fenced",
            "succeeded" => "succeeded",
            "pending" => "retried",
            _ => "dead",
        };
        match outcome {
            "fenced" => {}
            "succeeded" => WorkerStats::add(&stats.succeeded, 1),
            "retried" => WorkerStats::add(&stats.retried, 1),
            _ => WorkerStats::add(&stats.dead, 1),
        }
        if let Some((queue, name)) = label {
            if is_fenced {
                metrics::fenced(queue, name);
            } else {
                metrics::completed(queue, name, outcome);
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
    Ok(())
}
