//! Counters of what a worker did, readable while it runs ([`WorkerStats`]).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Event counters of one worker since it started. Cheap to read at any time through
/// [`Worker::stats`](crate::Worker::stats).
#[derive(Debug, Default)]
pub struct WorkerStats {
    pub(crate) claimed: AtomicU64,
    pub(crate) succeeded: AtomicU64,
    pub(crate) retried: AtomicU64,
    pub(crate) dead: AtomicU64,
    pub(crate) snoozed: AtomicU64,
    pub(crate) canceled: AtomicU64,
    pub(crate) expired: AtomicU64,
    pub(crate) fenced: AtomicU64,
    pub(crate) lost_leases: AtomicU64,
    pub(crate) panics: AtomicU64,
    pub(crate) timeouts: AtomicU64,
    pub(crate) reaped: AtomicU64,
    pub(crate) pruned: AtomicU64,
    pub(crate) released: AtomicU64,
    pub(crate) late_starts: AtomicU64,
    pub(crate) lost_claims: AtomicU64,
    pub(crate) db_errors: AtomicU64,
    pub(crate) db_conflicts: AtomicU64,
    pub(crate) claim_queries: AtomicU64,
    pub(crate) ack_flushes: AtomicU64,
    pub(crate) statement_timeouts: AtomicU64,
    pub(crate) writeback_rejected: AtomicU64,
    pub(crate) scheduled: AtomicU64,
    pub(crate) unique_deferred: AtomicU64,
    pub(crate) claims_limited: AtomicU64,
    pub(crate) claims_controlled: AtomicU64,
    pub(crate) follow_ups: AtomicU64,
    pub(crate) follow_up_errors: AtomicU64,
    pub(crate) observer_panics: AtomicU64,
    pub(crate) db_connections_max: AtomicU64,
}

/// A point-in-time copy of [`WorkerStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct StatsSnapshot {
    /// Tasks claimed.
    pub claimed: u64,
    /// Attempts written back as succeeded.
    pub succeeded: u64,
    /// Attempts written back as pending for a retry.
    pub retried: u64,
    /// Attempts written back as dead.
    pub dead: u64,
    /// Snoozes written back: the task is pending again and the attempt was not counted
    /// (snoozes beyond the task's `MAX_SNOOZES` count as `retried` or `dead` instead).
    pub snoozed: u64,
    /// Attempts written back as canceled (a cancel request, `Client::cancel` on the running
    /// task, honoured), and tasks this worker's claims found with a cancel request left by an
    /// earlier attempt and moved to `canceled` without running them.
    pub canceled: u64,
    /// Due tasks this worker's claims found past their deadline and moved to `expired`
    /// instead of running them.
    pub expired: u64,
    /// Write-backs rejected because the lease epoch had moved (stale holder).
    pub fenced: u64,
    /// Attempts whose lease was lost (a heartbeat found it gone, it was not confirmed before
    /// its local end, or this worker claimed the task again): the handler was canceled.
    pub lost_leases: u64,
    /// Handler panics (counted as failures).
    pub panics: u64,
    /// Handler timeouts (counted as failures).
    pub timeouts: u64,
    /// Expired leases this worker's reaper returned to pending or dead.
    pub reaped: u64,
    /// Terminal tasks deleted by retention.
    pub pruned: u64,
    /// Running tasks given back at shutdown.
    pub released: u64,
    /// Claimed tasks whose handler was not started because their lease was over, or about to
    /// be, by the time it could start (the executor started late: a busy or blocked runtime):
    /// given back to pending without running, the attempt not counted.
    pub late_starts: u64,
    /// Tasks a claim took although the worker never got the claim's answer (the connection
    /// failed, or the statement deadline passed, after the claim committed): given back to
    /// pending without running, the attempt not counted, by the next statement of that claim
    /// loop.
    pub lost_claims: u64,
    /// Database errors survived (the worker backed off and retried).
    pub db_errors: u64,
    /// Of `db_errors`, statements whose transaction lost to a concurrent one and was rolled
    /// back (ER_LOCK_DEADLOCK, 1213): an InnoDB deadlock, or on a Galera cluster a
    /// certification failure or brute-force abort. Each was run again after a short pause
    /// (claim, write-back) or at the next beat (heartbeat); none loses work.
    pub db_conflicts: u64,
    /// Claim transactions issued.
    pub claim_queries: u64,
    /// Write-back statements issued.
    pub ack_flushes: u64,
    /// Statements abandoned because they did not answer within the statement timeout (half
    /// the lease); their connections were discarded.
    pub statement_timeouts: u64,
    /// Outcomes the database rejected for their own row (e.g. a trigger or constraint): not
    /// retried; the task's lease is left to expire and the reaper returns it.
    pub writeback_rejected: u64,
    /// Tasks this worker enqueued for the ticks of recurring schedules.
    pub scheduled: u64,
    /// Outcomes whose write-back was put off because a producer's open transaction held the
    /// unique identity they free (its enqueue was a duplicate of the task); each is written
    /// once that transaction ends. Counted per deferral.
    pub unique_deferred: u64,
    /// Claims of a queue with a concurrency or rate limit that the limit cut short (it allowed
    /// fewer tasks than there were free slots, possibly none).
    pub claims_limited: u64,
    /// Claims that found their queue paused or limited since this worker last read the
    /// queues' controls (on MySQL, where claims see them): nothing claimed, the controls read.
    pub claims_controlled: u64,
    /// Follow-up tasks (`on_dead` / `on_success`) this worker enqueued with the ends it wrote
    /// (write-backs and reaps).
    pub follow_ups: u64,
    /// Follow-ups that could not be built (the hook panicked, or the task did not serialize):
    /// the task ended without one; each is logged at error level.
    pub follow_up_errors: u64,
    /// Outcome observers ([`WorkerBuilder::on_outcome`](crate::worker::WorkerBuilder::on_outcome))
    /// that panicked (caught; the worker went on).
    pub observer_panics: u64,
    /// Most connections the worker's own pools held open at once (both lanes; at most
    /// [`WorkerBuilder::db_connections`](crate::worker::WorkerBuilder::db_connections)). Your pool's
    /// connections are not counted.
    pub db_connections_max: u64,
}

impl WorkerStats {
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Relaxed);
    }

    /// A copy of the counters.
    pub fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            claimed: self.claimed.load(Relaxed),
            succeeded: self.succeeded.load(Relaxed),
            retried: self.retried.load(Relaxed),
            dead: self.dead.load(Relaxed),
            snoozed: self.snoozed.load(Relaxed),
            canceled: self.canceled.load(Relaxed),
            expired: self.expired.load(Relaxed),
            fenced: self.fenced.load(Relaxed),
            lost_leases: self.lost_leases.load(Relaxed),
            panics: self.panics.load(Relaxed),
            timeouts: self.timeouts.load(Relaxed),
            reaped: self.reaped.load(Relaxed),
            pruned: self.pruned.load(Relaxed),
            released: self.released.load(Relaxed),
            late_starts: self.late_starts.load(Relaxed),
            lost_claims: self.lost_claims.load(Relaxed),
            db_errors: self.db_errors.load(Relaxed),
            db_conflicts: self.db_conflicts.load(Relaxed),
            claim_queries: self.claim_queries.load(Relaxed),
            ack_flushes: self.ack_flushes.load(Relaxed),
            statement_timeouts: self.statement_timeouts.load(Relaxed),
            writeback_rejected: self.writeback_rejected.load(Relaxed),
            scheduled: self.scheduled.load(Relaxed),
            unique_deferred: self.unique_deferred.load(Relaxed),
            claims_limited: self.claims_limited.load(Relaxed),
            claims_controlled: self.claims_controlled.load(Relaxed),
            follow_ups: self.follow_ups.load(Relaxed),
            follow_up_errors: self.follow_up_errors.load(Relaxed),
            observer_panics: self.observer_panics.load(Relaxed),
            db_connections_max: self.db_connections_max.load(Relaxed),
        }
    }
}
