//! What a relay has done since it was built: [`RelayStats`], read with
//! [`Relay::stats`](super::Relay::stats), and the same counts as metrics (`taskq::metrics`).

use std::sync::atomic::{AtomicU64, Ordering};

/// A relay's counts since it was built (its clones share them), from
/// [`Relay::stats`](super::Relay::stats). The same counts go to the metrics facade as
/// `taskq_relay_rounds_total`, `taskq_relay_events_total{outcome}`,
/// `taskq_relay_leases_lost_total` and `taskq_relay_errors_total`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RelayStats {
    /// Rounds settled: published to the sink and recorded.
    pub rounds: u64,
    /// Events handed to the sink (an event sent again after a failure counts again).
    pub published: u64,
    /// Events recorded as delivered (their keys' `done_seq` moved past them).
    pub delivered: u64,
    /// Keys that backed off: the sink did not deliver one of their events for now
    /// (`Outcome::Failed` or `Outcome::Held`, a publish past its deadline included). One per
    /// key and round: the key's later events in the round are not counted.
    pub failed: u64,
    /// Keys held by an event the sink rejected (`OnRejected::Hold`), until an operator acts.
    pub held: u64,
    /// Events the sink rejected that were dead-lettered (`OnRejected::DeadLetter`).
    pub dead: u64,
    /// Key leases found lost (by a settle or a renewal): another relay or an operator took
    /// the key; its events in flight go out again, with their ids.
    pub leases_lost: u64,
    /// Rounds that failed on a database error (logged; the relay goes on).
    pub errors: u64,
}

/// What the sink's answer for one event counts as.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Counted {
    Failed,
    Held,
    Dead,
}

/// The live counters behind [`RelayStats`]; every count also goes to the metrics facade.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    rounds: AtomicU64,
    published: AtomicU64,
    delivered: AtomicU64,
    failed: AtomicU64,
    held: AtomicU64,
    dead: AtomicU64,
    leases_lost: AtomicU64,
    errors: AtomicU64,
}

impl Counters {
    /// A settled round: `published` events handed to the sink, `delivered` recorded.
    pub(crate) fn round(&self, published: usize, delivered: usize) {
        self.rounds.fetch_add(1, Ordering::Relaxed);
        self.published
            .fetch_add(published as u64, Ordering::Relaxed);
        self.delivered
            .fetch_add(delivered as u64, Ordering::Relaxed);
        crate::metrics::relay_round(published as u64, delivered as u64);
    }

    /// An event the sink did not deliver.
    pub(crate) fn event(&self, what: Counted) {
        let (counter, outcome) = match what {
            Counted::Failed => (&self.failed, "failed"),
            Counted::Held => (&self.held, "held"),
            Counted::Dead => (&self.dead, "dead"),
        };
        counter.fetch_add(1, Ordering::Relaxed);
        crate::metrics::relay_events(outcome, 1);
    }

    /// `n` key leases found lost.
    pub(crate) fn leases_lost(&self, n: usize) {
        if n > 0 {
            self.leases_lost.fetch_add(n as u64, Ordering::Relaxed);
            crate::metrics::relay_leases_lost(n as u64);
        }
    }

    /// A round that failed on a database error.
    pub(crate) fn error(&self) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        crate::metrics::relay_error();
    }

    /// The counts now.
    pub(crate) fn snapshot(&self) -> RelayStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        RelayStats {
            rounds: get(&self.rounds),
            published: get(&self.published),
            delivered: get(&self.delivered),
            failed: get(&self.failed),
            held: get(&self.held),
            dead: get(&self.dead),
            leases_lost: get(&self.leases_lost),
            errors: get(&self.errors),
        }
    }
}
