//! The worker's in-memory lease table: one record per attempt (task id and lease epoch), the
//! local end of each lease, and the watchdog that cancels a handler whose lease was not
//! confirmed in time.
//!
//! A record is keyed by [`AttemptKey`], never by task id alone: when this worker's own reaper
//! requeues a task whose handler still runs (its lease expired because renewals did not get
//! through) and its claim loop claims the task again, the new attempt gets a record of its
//! own, the old handler is canceled at once, and nothing the old attempt does afterwards (its
//! fenced write-back, its abandonment) can touch the new attempt's record, lease or slot.
//!
//! The local end of a lease is `renewed_at + lease`, where `renewed_at` is when the claim or
//! the last confirmed renewal was *sent* (local monotonic clock): the database set the lease
//! end to its own now plus the lease, which is no earlier. The watchdog signals
//! [`CancelReason::LeaseLost`] a margin before that local end (the cancel grace, at most half
//! the lease), so a handler that honours the signal, or is aborted after the grace, has
//! stopped by the time the lease can end on the database. It runs on its own timer, so a
//! heartbeat statement that never answers cannot stretch a lease.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::AbortHandle;

use super::{Shared, WorkerStats};
use crate::context::{CancelHandle, CancelReason};

/// One attempt of a task: its id and the lease epoch its claim set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct AttemptKey {
    pub id: u64,
    pub epoch: u64,
}

/// The lease table: every attempt this worker holds a lease for.
pub(crate) type Leases = BTreeMap<AttemptKey, InFlight>;

/// Where a claimed attempt is in this worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Its handler runs.
    Running,
    /// Its outcome waits to be written.
    WritingBack,
    /// Aborted at shutdown; to be released.
    Abandoned,
}

/// An attempt this worker holds a lease for.
pub(crate) struct InFlight {
    pub queue: Arc<str>,
    pub name: Arc<str>,
    /// The attempt's number (for outcome observers).
    pub attempt: u32,
    pub phase: Phase,
    pub cancel: Arc<CancelHandle>,
    pub abort: Option<AbortHandle>,
    /// When the claim or the last confirmed renewal was sent (local monotonic clock): the
    /// lease ends no earlier than this plus the lease length.
    pub renewed_at: Instant,
    /// Canceled as lost (by a heartbeat, the watchdog, or a newer claim of the same task).
    pub lost: bool,
}

/// How long before the local lease end the watchdog cancels a handler: the cancel grace,
/// at most half the lease.
pub(crate) fn cancel_margin(shared: &Shared) -> Duration {
    shared.cfg.cancel_grace.min(shared.cfg.lease / 2)
}

/// Records a new attempt. Older attempts of the same task that this worker still holds (its
/// own reaper requeued the task, its claim loop took it again) are canceled at once.
pub(crate) fn insert(shared: &Shared, key: AttemptKey, record: InFlight) {
    let mut leases = shared.inflight();
    let older = AttemptKey {
        id: key.id,
        epoch: 0,
    }..key;
    for (k, f) in leases.range_mut(older) {
        if !f.lost && f.phase == Phase::Running {
            mark_lost(shared, *k, f, "claimed again under a newer epoch");
        }
    }
    leases.insert(key, record);
}

/// Cancels the handlers whose lease was not confirmed by their cancel point; returns the
/// earliest cancel point still ahead.
pub(crate) fn expire_locally(shared: &Shared) -> Option<Instant> {
    let now = Instant::now();
    let ahead = shared.cfg.lease - cancel_margin(shared);
    let mut next: Option<Instant> = None;
    let mut leases = shared.inflight();
    for (key, f) in leases.iter_mut() {
        // A canceled attempt's lease is no longer renewed on purpose: the task ends canceled
        // (by this worker's write-back or the reaper), never run elsewhere.
        if f.lost || f.phase != Phase::Running || f.cancel.reason() == Some(CancelReason::Canceled)
        {
            continue;
        }
        let cancel_at = f.renewed_at + ahead;
        if now >= cancel_at {
            mark_lost(shared, *key, f, "lease not confirmed before its local end");
        } else {
            next = Some(next.map_or(cancel_at, |n| n.min(cancel_at)));
        }
    }
    next
}

/// Whether it is too late to start the handler of `key`: its lease was given up (marked lost),
/// or the watchdog's cancel point (`lease - cancel margin` after the last confirmed renewal,
/// see [`expire_locally`]) has passed, so the lease may be over on the database clock or
/// would be before the handler could be told. Called when the handler's task first runs,
/// which on a busy runtime can be long after the claim. An attempt no longer in the table is
/// too late as well.
pub(crate) fn too_late_to_start(shared: &Shared, key: AttemptKey) -> bool {
    let leases = shared.inflight();
    let Some(f) = leases.get(&key) else {
        return true;
    };
    f.lost || Instant::now() >= f.renewed_at + (shared.cfg.lease - cancel_margin(shared))
}

/// The watchdog: cancels handlers whose lease would end locally, independently of whether
/// the heartbeat statement answers.
pub(crate) async fn watchdog(shared: Arc<Shared>) {
    // New records are at least `lease - margin` ahead; looking at least this often catches
    // them in time.
    let every = (shared.cfg.lease / 4).max(Duration::from_millis(5));
    loop {
        let next = expire_locally(&shared);
        let now = Instant::now();
        let until = next.map_or(now + every, |n| n.min(now + every));
        tokio::time::sleep_until(until.into()).await;
    }
}

/// Marks an attempt lost and cancels its handler.
pub(crate) fn mark_lost(shared: &Shared, key: AttemptKey, f: &mut InFlight, why: &'static str) {
    f.lost = true;
    f.cancel.cancel(CancelReason::LeaseLost);
    WorkerStats::add(&shared.stats.lost_leases, 1);
    crate::metrics::lost_lease(&f.queue, &f.name);
    tracing::warn!(
        task_id = key.id,
        lease_epoch = key.epoch,
        why,
        "taskq: lease lost; handler canceled"
    );
}
