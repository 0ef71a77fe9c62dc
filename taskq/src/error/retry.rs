//! Which errors a caller cures by doing the same thing again: [`Error::is_conflict`] and
//! [`Error::is_retryable`]. The error numbers are the drivers' (`taskq_mysql::diagnose`,
//! `taskq_sqlite::is_busy`); this only combines them.

use super::Error;

impl Error {
    /// Whether the operation's transaction lost to a concurrent one: on MySQL / MariaDB a
    /// deadlock victim (error 1213; on Galera also a failed certification) or a lock wait
    /// timeout (1205), on SQLite "database is locked" (the write lock stayed taken past the
    /// busy timeout); also a transaction the server ended under the caller, which sqlx reports
    /// as `BeginFailed` when taskq opens its savepoint in it (on Galera, a transaction aborted
    /// by another node's write between two of its statements). Roll the transaction back and
    /// run it again, from its start.
    ///
    /// An inbox consumer meets it when two deliveries of one message wait on a first handling
    /// that rolls back (see [`Inbox`](crate::inbox::Inbox)): roll back and let the broker
    /// redeliver.
    pub fn is_conflict(&self) -> bool {
        match self {
            Error::Database(e) => is_conflict(e),
            _ => false,
        }
    }

    /// Whether the same call, made again unchanged (a transaction: run again from its
    /// start), may succeed: a [conflict](Self::is_conflict); the database not reachable or
    /// not answering for now (connection refused, reset or lost, no answer within the
    /// deadline, the pool's wait timed out, too many connections, a server shutting down or
    /// a Galera node not ready); a lost migration lock. Not a mistake in the call (an invalid
    /// name or option, a payload too large, a task in another state), not a refused session
    /// that needs a change (wrong password, unknown database, a TLS failure), not a
    /// constraint or SQL error.
    ///
    /// A timeout or a lost connection may come after the server committed: the call made
    /// again must be one that can run twice (an enqueue with a unique key, an inbox record).
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Database(e) | Error::Connect { source: e, .. } => {
                is_conflict(e) || is_transient(e)
            }
            Error::Timeout(_) | Error::MigrationLockLost { .. } => true,
            _ => false,
        }
    }
}

/// A conflict, as the driver that produced `e` reads it.
fn is_conflict(e: &sqlx::Error) -> bool {
    // `BEGIN` or `SAVEPOINT` answered, but the session is in no transaction: the server ended
    // the caller's transaction (rolled back) before taskq's savepoint in it.
    if matches!(e, sqlx::Error::BeginFailed) {
        return true;
    }
    #[cfg(feature = "sqlite")]
    if let sqlx::Error::Database(db) = e
        && taskq_sqlite::is_busy(&**db)
    {
        return true;
    }
    taskq_mysql::diagnose::is_conflict(e)
}

/// The database unreachable or unable to answer for now.
fn is_transient(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(_) => taskq_mysql::diagnose::is_transient(e),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::time::Duration;

    use super::*;

    fn io(kind: io::ErrorKind) -> sqlx::Error {
        sqlx::Error::Io(io::Error::new(kind, "x"))
    }

    #[test]
    fn an_unreachable_or_silent_database_is_retryable_but_no_conflict() {
        for e in [
            Error::Database(io(io::ErrorKind::ConnectionRefused)),
            Error::Database(io(io::ErrorKind::ConnectionReset)),
            Error::Database(sqlx::Error::PoolTimedOut),
            Error::Connect {
                target: "db:3306".into(),
                source: io(io::ErrorKind::ConnectionRefused),
            },
            Error::Timeout(Duration::from_secs(30)),
            Error::MigrationLockLost {
                version: 3,
                reason: "taken".into(),
            },
        ] {
            assert!(e.is_retryable(), "{e:#?}");
            assert!(!e.is_conflict(), "{e:#?}");
        }
    }

    #[test]
    fn a_transaction_the_server_ended_under_the_caller_is_a_conflict() {
        // Seen on Galera: the producer's transaction aborted by another node's write before
        // the ordered enqueue's SAVEPOINT (tests/galera.rs, ordered keys with writers on
        // every node).
        let e = Error::Database(sqlx::Error::BeginFailed);
        assert!(e.is_conflict());
        assert!(e.is_retryable());
    }

    #[test]
    fn mistakes_and_refusals_are_not_retryable() {
        for e in [
            Error::InvalidOption("max_attempts 0".into()),
            Error::PayloadTooLarge { size: 2, limit: 1 },
            Error::UnknownTask("x".into()),
            Error::Database(sqlx::Error::RowNotFound),
            Error::Database(sqlx::Error::PoolClosed),
            Error::Database(sqlx::Error::Protocol("bad packet".into())),
            Error::Connect {
                target: "db:3306".into(),
                source: sqlx::Error::Tls("bad certificate".into()),
            },
        ] {
            assert!(!e.is_retryable(), "{e:#?}");
            assert!(!e.is_conflict(), "{e:#?}");
        }
    }
}
