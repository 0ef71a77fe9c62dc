//! The claim loop of one queue: batches sized by free handler slots, adaptive polling,
//! in-process wake-ups.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;

use super::deadline::StmtError;
use super::executor::{self, Slot};
use super::lease::AttemptKey;
use super::{Shared, WorkerStats, backoff_sleep, within};
use crate::backend::{ClaimCursor, ClaimRequest};
use crate::wake;

pub(crate) async fn run(shared: Arc<Shared>, queue: Arc<str>, concurrency: usize) {
    let queue_slots = Arc::new(Semaphore::new(concurrency));
    let wake = wake::notifier(&queue);
    let mut idle = shared.cfg.poll_min;
    let mut failures = 0u32;
    // Largest batch this loop can claim, and the low-water mark below which, while the queue
    // has a backlog, it waits a little for more slots so claims stay batched instead of
    // taking one task per freed slot.
    let target = shared
        .cfg
        .claim_batch
        .min(concurrency)
        .min(shared.cfg.concurrency)
        .max(1);
    let low_water = target.div_ceil(2);
    let mut backlog = false;
    // Where the next claim goes on from: the driver's business (see `rows::ClaimCursor`).
    let mut cursor = ClaimCursor::default();
    // While the queue is at its concurrency limit: the next wait (doubles up to
    // `LIMITED_POLL_MAX`, back to `poll_min` after a claim that was not limited).
    let mut limited_wait = shared.cfg.poll_min;
    let written = shared.written.get(&*queue).expect("a notifier per queue");
    // When the claim whose answer never came was sent (see `release_lost_claims`): until the
    // tasks it may have taken are given back, this loop claims nothing more.
    let mut in_doubt: Option<Instant> = None;
    while !shared.stopping() {
        if let Some(sent) = in_doubt {
            if let Err(e) = release_lost_claims(&shared, &queue, sent).await {
                on_error(&shared, &queue, &e, &mut failures).await;
                continue;
            }
            in_doubt = None;
        }
        // Register interest before looking, so a slot freed meanwhile is not missed.
        let slot_freed = shared.slot_freed.notified();
        if shared.is_paused(&queue) {
            tokio::select! {
                _ = tokio::time::sleep(shared.cfg.poll_max) => {}
                // Woken (a resume in this process, or an enqueue): read the controls now
                // rather than at the next refresh.
                _ = wake.notified() => super::maintenance::refresh_controls(&shared).await,
                _ = shared.stopped() => {}
            }
            continue;
        }
        let free = free_slots(&shared, &queue_slots);
        if free == 0 {
            tokio::select! {
                _ = slot_freed => {}
                _ = tokio::time::sleep(shared.cfg.poll_max) => {}
                _ = shared.stopped() => {}
            }
            continue;
        }
        if backlog && free < target {
            gather_slots(&shared, &queue_slots, target, low_water).await;
        }
        let slots = take_slots(&shared, &queue_slots);
        if slots.is_empty() {
            continue;
        }
        let wanted = slots.len();
        let started = Instant::now();
        WorkerStats::add(&shared.stats.claim_queries, 1);
        let request = ClaimRequest {
            queue: &queue,
            names: &shared.names,
            limit: wanted as u32,
            lease_us: shared.lease_us(),
            worker_id: &shared.worker_id,
            limited: shared.is_limited(&queue),
        };
        // Registered before the claim, so a write-back that commits meanwhile is not missed.
        let task_written = written.notified();
        let batch = within!(shared, |c| shared.store.task_claim(
            c,
            &request,
            &mut cursor
        ))
        .await;
        let batch = match batch {
            Ok(b) => b,
            Err(e) => {
                backlog = false;
                // A conflict rolled the claim back; any other failure may have come after it
                // committed (the answer was lost).
                if !e.is_conflict() {
                    in_doubt.get_or_insert(started);
                }
                on_error(&shared, &queue, &e, &mut failures).await;
                continue;
            }
        };
        failures = 0;
        if batch.queue_controlled {
            // Paused or limited since the controls were read: read them, then claim (or wait)
            // as they say. Changed back meanwhile (or the read failed): look again shortly.
            WorkerStats::add(&shared.stats.claims_controlled, 1);
            super::maintenance::refresh_controls(&shared).await;
            if !shared.is_paused(&queue) && !shared.is_limited(&queue) {
                tokio::select! {
                    _ = tokio::time::sleep(shared.cfg.poll_min) => {}
                    _ = shared.stopped() => {}
                }
            }
            continue;
        }
        let expired = batch.expired.len();
        if expired > 0 {
            WorkerStats::add(&shared.stats.expired, expired as u64);
            for t in &batch.expired {
                crate::metrics::expired(&queue, &t.name);
                tracing::info!(queue = %queue, task_id = t.id, task = %t.name,
                    late_ms = t.late_us / 1000, "task expired: its deadline passed before it started; not run");
            }
        }
        // Tasks whose cancel request an earlier attempt left on the row end here, unrun.
        let canceled = batch.canceled.len();
        if canceled > 0 {
            WorkerStats::add(&shared.stats.canceled, canceled as u64);
            for t in &batch.canceled {
                crate::metrics::completed(&queue, &t.name, "canceled");
                tracing::info!(queue = %queue, task_id = t.id, task = %t.name,
                    "task canceled at its claim: a cancel was requested while an earlier attempt ran; not run");
            }
        }
        // Rows the claim ended (expired, canceled) took places in the batch.
        let ended = expired + canceled;
        let claimed = batch.tasks;
        let got = claimed.len();
        WorkerStats::add(&shared.stats.claimed, got as u64);
        crate::metrics::claimed(&queue, got, started.elapsed());
        if got > 0 {
            tracing::debug!(queue = %queue, claimed = got, elapsed_ms = started.elapsed().as_millis() as u64, "claimed");
        }
        let mut slots = slots;
        for task in claimed {
            let slot = slots.pop().expect("a slot per claimed task");
            executor::start(&shared, queue.clone(), task, slot, started);
        }
        drop(slots);
        if let Some(hit) = batch.limited {
            WorkerStats::add(&shared.stats.claims_limited, 1);
            crate::metrics::claim_limited(&queue);
            if got + ended >= hit.allowed as usize {
                // At the limit (the claim took all it was allowed): wait for room rather than
                // claiming again at once.
                backlog = false;
                idle = shared.cfg.poll_min;
                match hit.rate_resets_in_us {
                    Some(us) => {
                        // The rate window is used up: nothing can start before the next one
                        // (looked at again within `poll_max` anyway, for a changed limit).
                        let wait = Duration::from_micros(us.max(0) as u64 + 1_000)
                            .min(shared.cfg.poll_max);
                        tokio::select! {
                            _ = tokio::time::sleep(wait) => {}
                            _ = shared.stopped() => {}
                        }
                    }
                    None => {
                        // Running tasks of the queue hold every place: try again when one of
                        // this worker's ends (its write-back committed), or after a short poll
                        // for those of other workers.
                        let wait = limited_wait;
                        limited_wait =
                            (limited_wait * 2).min(LIMITED_POLL_MAX.max(shared.cfg.poll_min));
                        tokio::select! {
                            _ = tokio::time::sleep(wait) => {}
                            _ = task_written => { limited_wait = shared.cfg.poll_min; }
                            _ = shared.stopped() => {}
                        }
                    }
                }
                continue;
            }
        }
        limited_wait = shared.cfg.poll_min;
        // Ended rows took places in the batch: with them it was full, so more may be due.
        backlog = got + ended == wanted;
        if backlog {
            idle = shared.cfg.poll_min;
            continue; // probably more due: claim again as soon as slots allow
        }
        if batch.contended {
            // Others held some due tasks, so more may be due: treat it as a backlog (gather
            // slots for a batch) and claim again soon.
            idle = shared.cfg.poll_min;
            backlog = true;
            continue;
        } else if batch.partial {
            // The claim looked at part of the queue only: look again at once before idling.
            continue;
        }
        if got > 0 {
            idle = shared.cfg.poll_min;
        }
        let mut wait = idle;
        if idle < shared.cfg.poll_max && idle * 2 >= shared.cfg.poll_max {
            // The last step of the backoff is cut at random, so that the idle polls of workers
            // that started (or went idle) together do not stay in step: spread over the poll
            // interval, one of a fleet's polls comes soon after any enqueue, while each worker
            // still polls once per `poll_max`.
            wait = shared
                .cfg
                .poll_max
                .mul_f64(fastrand::f64())
                .max(shared.cfg.poll_min);
        }
        idle = (idle * 2).min(shared.cfg.poll_max);
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = wake.notified() => { idle = shared.cfg.poll_min; }
            _ = shared.stopped() => {}
        }
    }
    // Stopping with a claim in doubt: one last try (else the reaper returns those tasks).
    if let Some(sent) = in_doubt
        && let Err(e) = release_lost_claims(&shared, &queue, sent).await
    {
        WorkerStats::add(&shared.stats.db_errors, 1);
        tracing::warn!(queue = %queue, error = %e, "taskq: releasing the tasks of a lost claim at shutdown failed");
    }
}

/// Gives back the tasks a claim of this loop may have taken although its answer never came (the
/// connection failed, or the statement deadline passed, after the claim committed): without
/// this the task would stay `running` under this worker until its lease expired, and the
/// reaper would count the attempt although no handler ran.
///
/// No statement is added to the claims that succeed: only after a failed claim, before the
/// loop claims again, one read of the queue's running tasks that this worker claimed since the
/// failed claim was sent (database clock). Every task this worker started is in its lease
/// table from the moment its claim returned (`executor::start`), and this loop claims nothing
/// else meanwhile, so such a task that is not in the table was taken by the lost claim: it is
/// released (pending, epoch + 1, the attempt not counted, `run_at` kept), fenced by its epoch.
/// This relies on worker ids being unique among running workers (the default id is). A claim
/// that commits only after this read (its statement still running on the server) is not
/// seen: the reaper returns those tasks after their lease, counting the attempt.
async fn release_lost_claims(shared: &Shared, queue: &str, sent: Instant) -> Result<(), StmtError> {
    // The read runs after this is computed: its window reaches a little before `sent`, never
    // after it.
    let since_us = i64::try_from(sent.elapsed().as_micros()).unwrap_or(i64::MAX);
    let running = within!(shared, |c| shared.store.task_running_since(
        c,
        queue,
        &shared.worker_id,
        since_us
    ))
    .await?;
    let lost: Vec<(u64, u64)> = {
        let held = shared.inflight();
        running
            .into_iter()
            .filter(|&(id, epoch)| !held.contains_key(&AttemptKey { id, epoch }))
            .collect()
    };
    if lost.is_empty() {
        return Ok(());
    }
    let n = within!(shared, |c| shared.store.task_release(c, &lost)).await?;
    WorkerStats::add(&shared.stats.lost_claims, n);
    tracing::warn!(queue, tasks = ?lost, released = n,
        "taskq: a claim whose answer was lost had taken these tasks; released them without running (the attempt not counted)");
    Ok(())
}

/// Longest wait of a claim loop whose queue is at its concurrency limit before it tries
/// again (unless `poll_min` is longer): the most it adds before a place freed by another
/// worker's task is taken. A place freed by this worker's own task is retried at once.
pub(crate) const LIMITED_POLL_MAX: Duration = Duration::from_millis(100);

/// Conflicts in a row a claim loop retries after a short pause before it backs off.
const CONFLICT_RETRIES: u32 = 3;

/// Longest wait for the slots of a full batch once at least the low-water mark is free.
const GATHER_LOW: Duration = Duration::from_millis(2);
/// Longest wait for the low-water mark once at least one slot is free.
const GATHER_ANY: Duration = Duration::from_millis(10);

/// Free handler slots of this queue (bounded by the worker-wide ones).
fn free_slots(shared: &Shared, queue_slots: &Semaphore) -> usize {
    queue_slots
        .available_permits()
        .min(shared.global.available_permits())
}

/// While the queue has a backlog and only a few slots are free, waits for more to free up:
/// until `target` are free, or `low_water` are free and [`GATHER_LOW`] has passed, or
/// [`GATHER_ANY`] has passed. Handlers that finish together (short tasks) are then claimed
/// for in one transaction; long handlers delay a claim by at most a few milliseconds.
async fn gather_slots(shared: &Shared, queue_slots: &Semaphore, target: usize, low_water: usize) {
    let start = tokio::time::Instant::now();
    loop {
        let slot_freed = shared.slot_freed.notified();
        let free = free_slots(shared, queue_slots);
        let waited = start.elapsed();
        if free >= target
            || (free >= low_water && waited >= GATHER_LOW)
            || waited >= GATHER_ANY
            || shared.stopping()
        {
            return;
        }
        let until = if free >= low_water {
            start + GATHER_LOW
        } else {
            start + GATHER_ANY
        };
        tokio::select! {
            _ = slot_freed => {}
            _ = tokio::time::sleep_until(until) => {}
            _ = shared.stopped() => {}
        }
    }
}

/// Takes up to one claim batch of free slots (queue and global).
fn take_slots(shared: &Shared, queue_slots: &Arc<Semaphore>) -> Vec<Slot> {
    let mut out = Vec::new();
    while out.len() < shared.cfg.claim_batch {
        let Ok(q) = queue_slots.clone().try_acquire_owned() else {
            break;
        };
        let Ok(g) = shared.global.clone().try_acquire_owned() else {
            break;
        };
        out.push(Slot {
            _queue: q,
            _global: g,
        });
    }
    out
}

async fn on_error(shared: &Shared, queue: &str, e: &StmtError, failures: &mut u32) {
    WorkerStats::add(&shared.stats.db_errors, 1);
    if e.is_conflict() && *failures < CONFLICT_RETRIES {
        // Another claimer (on a Galera cluster: another node) took the same rows first: try
        // again at once, past them. Only repeated conflicts back off.
        tracing::debug!(queue, error = %e, "taskq: claim lost to a concurrent one; claiming again");
        *failures += 1;
        super::deadline::conflict_pause().await;
        return;
    }
    tracing::warn!(queue, error = %e, failures = *failures, "taskq: claim failed; backing off");
    *failures += 1;
    backoff_sleep(shared, *failures).await;
}
