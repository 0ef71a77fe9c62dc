//! Deadlines on the worker's statements.
//!
//! Every statement the worker runs (claim, heartbeat, write-back, reaper, retention, pause
//! refresh, release, presence) takes a connection from one of the worker's pools (its lanes,
//! see `worker::lanes`) and must answer within the
//! statement timeout (half the lease). One that does not — a connection silently
//! black-holed by a network partition answers nothing and is never closed — is abandoned and
//! its connection discarded without any further I/O, so it cannot pin a loop or a pool slot;
//! the caller treats it like a database error and retries on a fresh connection. Server-side
//! lock waits of the worker's sessions end at the same bound (`innodb_lock_wait_timeout`, see
//! `backend::mysql::session_setup`), and the server itself closes a worker session that stays
//! silent past `lanes::session_timeout` (a frozen process or a black-holed network, which
//! never drop the connection), rolling back its transaction.
//!
//! A statement that timed out may still have been executed by the server: every worker
//! statement is safe to repeat or to lose (claims are reaped when their lease expires,
//! write-backs and renewals are fenced by the lease epoch).

use std::fmt;
use std::time::Duration;

/// Why a worker statement did not complete.
#[derive(Debug)]
pub(crate) enum StmtError {
    /// The database (or the connection) answered with an error, as the driver reads it.
    Db(sqlx::Error, taskq_driver::dynamic::ErrorClass),
    /// No answer within the statement timeout: the connection was discarded.
    Timeout(Duration),
}

impl fmt::Display for StmtError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StmtError::Db(e, _) => e.fmt(f),
            StmtError::Timeout(d) => write!(f, "no answer within {d:?}; connection discarded"),
        }
    }
}

impl StmtError {
    /// A database error of a statement on `store`'s driver, classified by it.
    pub(crate) fn db(store: &crate::backend::Store, e: sqlx::Error) -> Self {
        let class = store.classify(&e);
        StmtError::Db(e, class)
    }

    /// Whether retrying the same statement cannot help: the server rejected the data itself
    /// (SQLSTATE class 22 data exception, 23 constraint violation, 42 syntax or access, 45
    /// raised by a trigger or procedure), or the statement is too big for it (MySQL's packet
    /// too large, 1153 and friends; SQLite's `SQLITE_TOOBIG`: the driver's `ErrorClass`).
    /// Connection errors, timeouts, deadlocks and lock waits are worth retrying.
    pub(crate) fn is_deterministic(&self) -> bool {
        match self {
            StmtError::Db(sqlx::Error::Database(db), class) => {
                db.code().is_some_and(|c| {
                    ["22", "23", "42", "45"]
                        .iter()
                        .any(|class| c.starts_with(class))
                }) || class.refused
            }
            _ => false,
        }
    }

    /// Whether the statement's transaction lost to a concurrent one and was rolled back: an
    /// InnoDB deadlock victim, or on a Galera cluster a certification failure or brute-force
    /// abort (all ER_LOCK_DEADLOCK, 1213). Nothing is wrong with the database; running the
    /// statement again at once is the cure, without the backoff meant for an outage.
    pub(crate) fn is_conflict(&self) -> bool {
        match self {
            StmtError::Db(_, class) => class.conflict,
            _ => false,
        }
    }
}

/// A short random pause before running a statement again after a conflict (1–20 ms), so two
/// claimers that collided do not collide again in lockstep.
pub(crate) async fn conflict_pause() {
    tokio::time::sleep(Duration::from_micros(fastrand::u64(1_000..20_000))).await;
}

/// Runs `$body` (an expression using `$conn`, a [`Conn`](crate::backend::Conn)) on a connection of the
/// worker's work lane (`within!(shared, |c| ..)`) or control lane (`within!(shared, control,
/// |c| ..)`; see `worker::lanes`), within the statement timeout counted from before the
/// connection is taken. Evaluates to `Result<T, StmtError>`.
macro_rules! within {
    ($shared:expr, control, |$conn:ident| $body:expr) => {
        $crate::worker::deadline::within!(@on $shared, control, |$conn| $body)
    };
    ($shared:expr, |$conn:ident| $body:expr) => {
        $crate::worker::deadline::within!(@on $shared, store, |$conn| $body)
    };
    (@on $shared:expr, $lane:ident, |$conn:ident| $body:expr) => {
        async {
            let shared: &$crate::worker::Shared = &$shared;
            let limit = shared.cfg.statement_timeout;
            let deadline = tokio::time::Instant::now() + limit;
            let timed_out = || {
                $crate::worker::WorkerStats::add(&shared.stats.statement_timeouts, 1);
                $crate::worker::deadline::StmtError::Timeout(limit)
            };
            let mut pooled = match tokio::time::timeout_at(deadline, shared.acquire(stringify!($lane) == "control")).await {
                Ok(Ok(c)) => c,
                Ok(Err(e)) => return Err($crate::worker::deadline::StmtError::db(&shared.store, e)),
                Err(_) => return Err(timed_out()),
            };
            // Connections grow only in an acquire, so the peak is seen right after one.
            shared.stats.db_connections_max.fetch_max(
                u64::from(shared.db_connections()),
                std::sync::atomic::Ordering::Relaxed,
            );
            let $conn = pooled.conn();
            let res = tokio::time::timeout_at(deadline, $body).await;
            match res {
                Ok(r) => {
                    if r.is_ok() {
                        // The probe's "last database round trip" (see `worker::health`).
                        shared.health.db_ok();
                    }
                    r.map_err(|e| {
                        let e = $crate::worker::deadline::StmtError::db(&shared.store, e);
                        if e.is_conflict() {
                            $crate::worker::WorkerStats::add(&shared.stats.db_conflicts, 1);
                        }
                        e
                    })
                }
                Err(_) => {
                    // Dropped without a goodbye: the socket closes, the server rolls back.
                    pooled.discard();
                    Err(timed_out())
                }
            }
        }
    };
}
pub(crate) use within;
