//! The worker's connections: two lanes, each its own small pool opened lazily from the user's
//! pool's connect options (`min_connections` 0), so a worker holds only what it uses at once.
//!
//! - **control** (1 connection): lease renewals and their check, the presence beat, the
//!   pause/limit refresh, marking the worker stopped. Short single statements, so a renewal
//!   waits behind at most one of them, never behind a claim, a write-back or a reaper pass.
//! - **work** (the rest): claims, write-backs, the reaper and retention, the scheduler, the
//!   release at shutdown. One connection per claim loop that can claim at once
//!   (`min(queues, concurrency)`), plus one so write-backs need not wait for a claim when more
//!   than one handler can run.
//!
//! A **single-slot worker on MySQL** has one connection that both lanes share: with one slot,
//! nothing is claimed while its task runs, and control operations go first (a work operation
//! does not ask for the connection while a renewal waits for it: `Shared::acquire`), so a
//! renewal waits for at most the statement that holds the connection (a reaper or retention
//! step, a schedule's fire). A renewal that has waited [`overflow_after`] for it (half the
//! lease's margin; a fire waiting on a locked schedule row can hold the connection up to the
//! statement timeout, half the lease, which is longer than the margin below a 30 s lease:
//! finding L1 of issue 34) runs on a connection of its own instead, from a one-connection
//! overflow pool that is opened only then and closed when idle. That keeps a fleet of
//! single-slot worker processes at about 2 server connections each (its own and one of the
//! user's pool), 3 for a worker while its overflow is open. On SQLite a connection costs
//! the server nothing, and a renewal must wait for nothing but the write lock, so the control
//! lane keeps its own connection there, with a busy timeout of its own
//! ([`RENEWAL_BUSY_TIMEOUT`]): a renewal tries again until its leases' cancel point, so a hold
//! of the write lock shorter than the lease's margin never costs a lease, whatever the user's
//! busy timeout, and no renewal lands after the watchdog gave a lease up (the rule below,
//! [`check_sqlite_lease`]). The work lane waits the user's busy timeout, at most the
//! statement timeout.
//!
//! Default: `1 + min(queues, concurrency) + (concurrency > 1)` connections, except 1 for a
//! single-slot worker on MySQL: 2 for a single-slot worker on SQLite, 3 for one queue at any
//! concurrency above 1; [`WorkerBuilder::db_connections`](super::WorkerBuilder::db_connections)
//! sets the total (1 on MySQL: both lanes on one connection; else control 1 + work the rest).
//!
//! On MySQL the server also bounds a worker session that goes silent (a frozen process, a
//! black-holed network) in the middle of a transaction: `wait_timeout`, `net_read_timeout`
//! and `net_write_timeout` are set to [`session_timeout`], after which the server closes the
//! session, rolling back its transaction and releasing its row locks. The pools close their
//! own idle connections before that ([`idle_limit`]), so a healthy worker never uses a
//! connection the server has closed.

use std::time::Duration;

use crate::backend::{Store, WorkerPool};

/// The cancel grace when none is given (and the lease is at least twice as long).
pub(crate) const DEFAULT_CANCEL_GRACE: Duration = Duration::from_secs(5);

/// On SQLite, how long one try of a control statement (a lease renewal, the presence beat)
/// waits for the write lock (the control lane's busy timeout, or the user's when shorter);
/// a try that finds it still taken is repeated at once, up to the statement's deadline (for
/// a renewal: the watchdog's cancel point of its leases, less one try).
pub(crate) const RENEWAL_BUSY_TIMEOUT: Duration = Duration::from_millis(100);

/// The worker's two lanes: two pools, or one pool both use (`shared`).
#[derive(Debug, Clone)]
pub(crate) struct Lanes {
    pub control: Store,
    pub work: Store,
    /// Both lanes use the work pool, control operations first (a single-connection worker on
    /// MySQL); `control` is then the overflow a renewal turns to after [`overflow_after`].
    pub shared: bool,
    /// On SQLite, the control lane's busy timeout (see [`RENEWAL_BUSY_TIMEOUT`]); `None` on
    /// MySQL (row locks: a lock wait ends at the statement timeout on the server).
    pub renewal_busy: Option<Duration>,
}

impl Lanes {
    /// Opens (lazily) the lanes of a worker with `connections` in all: 1 on MySQL shares one
    /// connection between the lanes; otherwise at least 2 (control 1, work the rest).
    pub(crate) fn open(user: &Store, connections: u32, statement_timeout: Duration) -> Self {
        let spec = |connections| WorkerPool {
            connections,
            statement_timeout,
            session_timeout: session_timeout(statement_timeout),
            idle_limit: idle_limit(statement_timeout),
        };
        let connections = connections.max(min_connections(user));
        if connections == 1 {
            // The control pool opens a connection only when a renewal has waited
            // `overflow_after` for the shared one.
            return Self {
                control: user.worker_store(spec(1)),
                work: user.worker_store(spec(1)),
                shared: true,
                renewal_busy: None,
            };
        }
        match user.busy_timeout() {
            // SQLite: the control lane waits for the write lock a short while per try and tries
            // again (so a renewal waits until its leases' cancel point, not the busy timeout,
            // and never renews after it); the work lane at most its statement deadline, as a
            // MySQL lock wait ends at the statement timeout on the server.
            Some(busy) => {
                let renewal_busy = busy.min(RENEWAL_BUSY_TIMEOUT);
                Self {
                    control: user.worker_store_waiting(spec(1), renewal_busy),
                    work: user
                        .worker_store_waiting(spec(connections - 1), busy.min(statement_timeout)),
                    shared: false,
                    renewal_busy: Some(renewal_busy),
                }
            }
            None => Self {
                control: user.worker_store(spec(1)),
                work: user.worker_store(spec(connections - 1)),
                shared: false,
                renewal_busy: None,
            },
        }
    }

    pub(crate) async fn close(&self) {
        self.control.close().await;
        self.work.close().await;
    }
}

/// The fewest connections a worker on this backend runs with: 1 on MySQL (both lanes on one
/// connection), 2 on SQLite (a renewal never waits behind a write; see the module docs).
pub(crate) fn min_connections(user: &Store) -> u32 {
    if user.busy_timeout().is_some() { 2 } else { 1 }
}

/// The default number of connections of a worker (see the module docs): `minimum` (from
/// [`min_connections`]) for a single-slot worker.
pub(crate) fn default_connections(queues: usize, concurrency: usize, minimum: u32) -> u32 {
    if concurrency <= 1 {
        return minimum;
    }
    let claimers = queues.min(concurrency).max(1);
    let n = 1 + claimers + 1;
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// With shared lanes (a single-slot worker on MySQL), how long a control operation (a lease
/// renewal) waits for the shared connection before it takes the overflow connection instead:
/// half the lease's margin, `lease − heartbeat − cancel margin`, the time a renewal has between
/// its beat and the watchdog's cancel point. The other half is for opening the overflow
/// connection and the renewal itself.
pub(crate) fn overflow_after(
    lease: Duration,
    heartbeat: Duration,
    cancel_margin: Duration,
) -> Duration {
    lease
        .saturating_sub(heartbeat)
        .saturating_sub(cancel_margin)
        / 2
}

/// How long the server keeps a silent worker session (MySQL `wait_timeout`,
/// `net_read_timeout`, `net_write_timeout`): the statement timeout rounded up to whole
/// seconds, plus 1 s, and at least 5 s. A live worker never leaves a transaction silent that
/// long: each of its operations, transaction included, is abandoned (its connection dropped)
/// at the statement timeout.
pub(crate) fn session_timeout(statement_timeout: Duration) -> Duration {
    let secs = statement_timeout.as_secs() + u64::from(statement_timeout.subsec_nanos() > 0);
    Duration::from_secs((secs + 1).max(5))
}

/// Idle connections are not handed out after this long, and are closed by the pool within
/// it: 1 s short of [`session_timeout`], so the server never closes one first.
pub(crate) fn idle_limit(statement_timeout: Duration) -> Duration {
    session_timeout(statement_timeout) - Duration::from_secs(1)
}

/// The least time a lease must leave a renewal on SQLite between its heartbeat and the
/// watchdog's cancel point: two tries of [`RENEWAL_BUSY_TIMEOUT`] (or the pool's busy timeout
/// when that is shorter, see [`check_sqlite_lease`]).
pub(crate) const RENEWAL_WINDOW: Duration = Duration::from_millis(200);

/// On SQLite, the rule of docs/semantics.md ("Leases under write-lock contention"): a
/// renewal waits for the write lock in tries of [`RENEWAL_BUSY_TIMEOUT`] (the pool's busy
/// timeout `busy` when shorter) until the watchdog's cancel point of its leases, so a lease
/// survives a hold of the lock of up to its margin, `lease − heartbeat − min(cancel grace,
/// lease / 2)`, whatever the pool's busy timeout; that margin must be at least
/// `min(busy, RENEWAL_WINDOW)` (two tries, or the busy timeout: every lease the rule before
/// issue 34 accepted, margin ≥ busy timeout, still passes). `grace` is the cancel grace and
/// whether it is the default (`min(5 s, lease / 2)`, which grows with the lease).
pub(crate) fn check_sqlite_lease(
    lease: Duration,
    heartbeat: Duration,
    (cancel_grace, default_grace): (Duration, bool),
    busy: Duration,
) -> crate::Result<()> {
    let window = busy.min(RENEWAL_WINDOW);
    let tolerated = lease
        .saturating_sub(heartbeat)
        .saturating_sub(cancel_grace.min(lease / 2));
    if tolerated >= window {
        return Ok(());
    }
    // The shortest lease with heartbeat = lease / 3: lease·2/3 − grace ≥ window while grace ≤
    // lease / 2, else lease / 6 ≥ window. The default grace is lease / 2 up to a 10 s lease.
    let grace_cap = if default_grace {
        DEFAULT_CANCEL_GRACE
    } else {
        cancel_grace
    };
    let min_lease = if window * 6 <= grace_cap * 2 {
        window * 6
    } else {
        (window + grace_cap) * 3 / 2
    };
    Err(crate::Error::LeaseBelowBusyTimeout {
        lease,
        heartbeat,
        cancel_grace,
        busy_timeout: busy.min(RENEWAL_BUSY_TIMEOUT),
        tolerated,
        min_lease,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_connections_follow_the_formula() {
        for min in [1, 2] {
            assert_eq!(default_connections(1, 1, min), min);
            assert_eq!(default_connections(3, 1, min), min);
            assert_eq!(default_connections(1, 16, min), 3);
            assert_eq!(default_connections(3, 10, min), 5);
            assert_eq!(default_connections(3, 2, min), 4);
        }
    }

    #[test]
    fn a_renewal_turns_to_the_overflow_after_half_its_margin() {
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        // The defaults at a 30 s lease: heartbeat 10 s, cancel margin 5 s.
        assert_eq!(overflow_after(s(30), s(10), s(5)), ms(7_500));
        // Lease 6 s: heartbeat 2 s, cancel margin 3 s (half the lease), 1 s of margin.
        assert_eq!(overflow_after(s(6), s(2), s(3)), ms(500));
        // Shorter than the statement timeout (half the lease) below a 30 s lease.
        for lease in [4, 6, 10, 20] {
            let l = s(lease);
            assert!(overflow_after(l, l / 3, s(5).min(l / 2)) < l / 2);
        }
        assert_eq!(overflow_after(s(2), s(2), s(1)), Duration::ZERO);
    }

    #[test]
    fn the_suggested_lease_passes_the_sqlite_rule() {
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        let default_grace = |lease: Duration| (s(5).min(lease / 2), true);
        let busy = s(5);
        assert!(check_sqlite_lease(s(30), s(10), default_grace(s(30)), busy).is_ok());
        assert!(check_sqlite_lease(s(2), ms(667), default_grace(s(2)), busy).is_ok());
        assert!(check_sqlite_lease(ms(1_200), ms(400), default_grace(ms(1_200)), busy).is_ok());
        assert!(check_sqlite_lease(ms(1_100), ms(367), default_grace(ms(1_100)), busy).is_err());
        // A busy timeout under two tries: the margin need only cover it, as before issue 34.
        assert!(check_sqlite_lease(ms(100), ms(30), default_grace(ms(100)), ms(10)).is_ok());
        for busy in [s(5), ms(150), ms(10)] {
            for grace in [None, Some(s(5)), Some(ms(100)), Some(s(1))] {
                let at = |lease: Duration| match grace {
                    None => default_grace(lease),
                    Some(g) => (g, false),
                };
                let Err(crate::Error::LeaseBelowBusyTimeout { min_lease, .. }) =
                    check_sqlite_lease(ms(1), ms(0), at(ms(1)), busy)
                else {
                    panic!("a 1 ms lease passed");
                };
                let ok = check_sqlite_lease(min_lease, min_lease / 3, at(min_lease), busy);
                assert!(ok.is_ok(), "{busy:?} {grace:?}: {ok:?}");
                let shorter = min_lease - ms(1);
                assert!(
                    check_sqlite_lease(shorter, shorter / 3, at(shorter), busy).is_err(),
                    "{busy:?} {grace:?}"
                );
            }
        }
    }

    #[test]
    fn sessions_outlive_statements_and_idle_connections() {
        for (lease_ms, want_s) in [
            (200, 5),
            (2_000, 5),
            (10_000, 6),
            (30_000, 16),
            (31_000, 17),
        ] {
            let st = Duration::from_millis(lease_ms) / 2;
            let w = session_timeout(st);
            assert_eq!(w, Duration::from_secs(want_s), "lease {lease_ms} ms");
            assert!(w > st && idle_limit(st) < w);
        }
    }
}
