//! Lease renewal: one statement per beat renews every lease this worker holds. A lease that
//! could not be renewed (epoch moved, lease expired) cancels its handler. A lease whose task
//! has a cancel request is not renewed either; the follow-up read (only when fewer leases were
//! renewed than sent) says so, and its handler gets [`CancelReason::Canceled`]. A beat that fails
//! or does not answer within the statement deadline changes nothing: the watchdog
//! (`lease::watchdog`) cancels handlers whose lease was not confirmed in time.
//!
//! Presence: the worker's row in `taskq_workers` (with its queues and the task names it
//! registers) — inserted when its loop starts
//! (`register`), its `last_seen_at` refreshed once per heartbeat interval (`presence`: one
//! primary-key upsert per worker, whatever the number of tasks), marked stopped at graceful
//! shutdown (`deregister`). It runs on its own timer.
//!
//! Renewals, presence and the pause refresh share the worker's control lane (one connection,
//! see `worker::lanes`): a renewal waits behind at most one of those short statements, never
//! behind a claim or a write-back (a single-slot worker on MySQL runs both lanes on one
//! connection; its renewals go first, behind at most the statement that holds it, and take an
//! overflow connection once they have waited half the lease's margin: `lanes::overflow_after`). A presence statement that does not answer holds the lane
//! until the statement deadline; the renewal behind it then runs on a fresh connection within
//! what is left of its own deadline.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use super::config::Config;
use super::deadline::StmtError;
use super::lease::{self, AttemptKey, Phase};
use super::{Shared, WorkerStats, within};
use crate::backend::{NameList, WorkerRow};
use crate::context::CancelReason;

/// What a worker records about itself in `taskq_workers`.
pub(crate) struct Presence {
    host: String,
    pid: u32,
    queues: Vec<(String, u32)>,
    concurrency: u32,
    lease_us: u64,
    heartbeat_us: u64,
    /// The task names it registers, sorted.
    names: NameList,
}

impl Presence {
    pub(crate) fn new<'a>(cfg: &Config, names: impl Iterator<Item = &'a str>) -> Self {
        let mut names: Vec<&str> = names.collect();
        names.sort_unstable();
        Self {
            names: NameList::new(names),
            host: super::config::hostname().unwrap_or_else(|| "unknown".into()),
            pid: std::process::id(),
            queues: cfg
                .queues
                .iter()
                .map(|(q, c)| (q.clone(), u32::try_from(*c).unwrap_or(u32::MAX)))
                .collect(),
            concurrency: u32::try_from(cfg.concurrency).unwrap_or(u32::MAX),
            lease_us: cfg.lease.as_micros() as u64,
            heartbeat_us: cfg.heartbeat.as_micros() as u64,
        }
    }

    fn row<'a>(&'a self, worker_id: &'a str) -> WorkerRow<'a> {
        WorkerRow {
            worker_id,
            host: &self.host,
            pid: self.pid,
            queues: &self.queues,
            concurrency: self.concurrency,
            lease_us: self.lease_us,
            heartbeat_us: self.heartbeat_us,
            names: &self.names,
        }
    }
}

/// Whether a control statement whose try failed with `e` is tried again: on SQLite, when the
/// write lock was still taken at the end of the control lane's short busy timeout (a
/// conflict) and another try, started after a short pause, ends by `until`.
async fn try_again(shared: &Shared, e: &StmtError, until: Instant) -> bool {
    let Some(busy) = shared.renewal_busy else {
        return false;
    };
    // The pause (1–20 ms) keeps a lock that fails at once (a busy timeout of 0) from
    // spinning; SQLite's busy handler sleeps 1, 2, 5, 10 … ms within a try.
    let pause = std::time::Duration::from_millis(20);
    if !e.is_conflict() || Instant::now() + pause + busy > until {
        return false;
    }
    super::deadline::conflict_pause().await;
    true
}

/// The end of a control statement's tries when it started `at` (the statement deadline).
fn control_deadline(shared: &Shared, at: Instant) -> Instant {
    at + shared.cfg.statement_timeout
}

/// Records the starting worker (a failure is logged: the first presence beat inserts the
/// row instead).
async fn register(shared: &Shared) {
    let row = shared.presence.row(&shared.worker_id);
    let until = control_deadline(shared, Instant::now());
    loop {
        match within!(shared, control, |c| shared.store.worker_start(c, &row)).await {
            Ok(_) => return,
            Err(e) => {
                WorkerStats::add(&shared.stats.db_errors, 1);
                if try_again(shared, &e, until).await {
                    continue;
                }
                tracing::warn!(error = %e, "taskq: recording the worker in taskq_workers failed");
                return;
            }
        }
    }
}

/// The presence loop: records the worker at start (on this loop, so a database that does not
/// answer delays no other loop), then `last_seen_at = now` once per heartbeat interval.
pub(crate) async fn presence(shared: Arc<Shared>) {
    let mut tick = tokio::time::interval(shared.cfg.heartbeat);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    register(&shared).await;
    loop {
        tick.tick().await;
        let row = shared.presence.row(&shared.worker_id);
        let until = control_deadline(&shared, Instant::now());
        loop {
            match within!(shared, control, |c| shared.store.worker_seen(c, &row)).await {
                Ok(_) => break,
                Err(e) => {
                    WorkerStats::add(&shared.stats.db_errors, 1);
                    if try_again(&shared, &e, until).await {
                        continue;
                    }
                    tracing::warn!(error = %e, "taskq: worker presence beat failed");
                    break;
                }
            }
        }
    }
}

/// Marks the worker stopped at graceful shutdown (a few tries; a worker that cannot say
/// goodbye is listed lost two heartbeat intervals after its last beat).
pub(crate) async fn deregister(shared: &Shared) {
    let until = control_deadline(shared, Instant::now());
    let mut attempt = 0;
    while attempt < 3 {
        match within!(shared, control, |c| shared
            .store
            .worker_stop(c, &shared.worker_id))
        .await
        {
            Ok(_) => return,
            Err(e) => {
                if try_again(shared, &e, until).await {
                    continue;
                }
                attempt += 1;
                tracing::warn!(error = %e, attempt, "taskq: marking the worker stopped failed");
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
        }
    }
}

pub(crate) async fn run(shared: Arc<Shared>) {
    let mut tick = tokio::time::interval(shared.cfg.heartbeat);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        beat(&shared).await;
    }
}

/// One heartbeat.
///
/// On SQLite the renewal waits for the write lock in short tries (the control lane's busy
/// timeout, `lanes::RENEWAL_BUSY_TIMEOUT`), repeated until the watchdog's cancel point of the
/// earliest of its leases less one try: a hold of the lock shorter than the lease's margin
/// never costs the lease, whatever the pool's busy timeout, and no renewal lands after the
/// watchdog gave a lease up (which would keep the task `running`, unworked, for another lease).
pub(crate) async fn beat(shared: &Shared) {
    let (leases, oldest): (Vec<(u64, u64)>, Option<Instant>) = {
        let inflight = shared.inflight();
        let live = inflight.iter().filter(|(_, f)| !f.lost);
        let oldest = live.clone().map(|(_, f)| f.renewed_at).min();
        (live.map(|(k, _)| (k.id, k.epoch)).collect(), oldest)
    };
    let Some(oldest) = oldest else {
        return;
    };
    // The watchdog cancels the earliest lease at this point (`lease::expire_locally`).
    let cancel_at = oldest + (shared.cfg.lease - lease::cancel_margin(shared));
    let lease_us = shared.lease_us();
    let mut tries = 0;
    let (renewed, sent) = loop {
        let sent = Instant::now();
        match within!(shared, control, |c| shared
            .store
            .task_heartbeat(c, &leases, lease_us))
        .await
        {
            Ok(n) => break (n, sent),
            Err(e) => {
                WorkerStats::add(&shared.stats.db_errors, 1);
                tries += 1;
                if try_again(shared, &e, cancel_at).await {
                    // SQLite: the write lock stayed taken for a whole try; nothing was
                    // renewed. Try again at once.
                    continue;
                }
                if shared.renewal_busy.is_none() && e.is_conflict() && tries < 3 {
                    // Lost to a concurrent write of one of the rows (on Galera: failed
                    // certification); nothing was renewed. Try again at once.
                    super::deadline::conflict_pause().await;
                    continue;
                }
                tracing::warn!(error = %e, leases = leases.len(), "taskq: heartbeat failed");
                return;
            }
        }
    };
    // Leases with a cancel request are held but not renewed (the heartbeat skips them).
    let mut cancel_requested: HashSet<(u64, u64)> = HashSet::new();
    let held: HashSet<(u64, u64)> = if renewed as usize == leases.len() {
        leases.iter().copied().collect()
    } else {
        match within!(shared, control, |c| shared
            .store
            .task_leases_held(c, &leases))
        .await
        {
            Ok(held) => held
                .into_iter()
                .map(|(id, epoch, cancel)| {
                    if cancel {
                        cancel_requested.insert((id, epoch));
                    }
                    (id, epoch)
                })
                .collect(),
            Err(e) => {
                WorkerStats::add(&shared.stats.db_errors, 1);
                tracing::warn!(error = %e, "taskq: heartbeat check failed");
                return;
            }
        }
    };
    let mut inflight = shared.inflight();
    for (id, epoch) in leases {
        let key = AttemptKey { id, epoch };
        let Some(f) = inflight.get_mut(&key) else {
            continue;
        };
        if cancel_requested.contains(&(id, epoch)) {
            // Not renewed: the lease runs out on its own, and the reaper then cancels the task
            // if this worker has not written `canceled` first.
            if f.phase == Phase::Running && f.cancel.reason().is_none() {
                f.cancel.cancel(CancelReason::Canceled);
                tracing::info!(
                    task_id = id,
                    lease_epoch = epoch,
                    "taskq: cancel requested; handler signaled"
                );
            }
        } else if held.contains(&(id, epoch)) {
            f.renewed_at = sent;
        } else if f.phase != Phase::WritingBack
            && !f.lost
            && f.cancel.reason() != Some(CancelReason::Canceled)
        {
            // (A canceled attempt's lease was left to run out on purpose: the reaper may have
            // moved the task to `canceled` already; its handler is stopping anyway.)
            // (An WritingBack task's outcome may simply have been written meanwhile; the write-back
            // itself reports it if it was fenced.)
            lease::mark_lost(shared, key, f, "heartbeat found the lease gone");
        }
    }
}
