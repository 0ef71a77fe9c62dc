//! Connection diagnosis: which database errors mean the server could not be reached or refused
//! the session (MySQL / MariaDB error numbers), and the sentence that says what to check.

use std::time::Duration;

use super::*;

/// MySQL / MariaDB error numbers of failures while opening a session.
pub(super) mod er {
    /// Too many connections.
    pub const CON_COUNT: u16 = 1040;
    /// Access denied for user to database.
    pub const DBACCESS_DENIED: u16 = 1044;
    /// Access denied for user (wrong user or password).
    pub const ACCESS_DENIED: u16 = 1045;
    /// Unknown database.
    pub const BAD_DB: u16 = 1049;
    /// Access denied, no password given (MariaDB's unix_socket authentication for root).
    pub const ACCESS_DENIED_NO_PASSWORD: u16 = 1698;
    /// Table doesn't exist.
    pub const NO_SUCH_TABLE: u16 = 1146;
}

/// The MySQL error number of a database error, if it is one.
pub(super) fn error_number(e: &sqlx::Error) -> Option<u16> {
    match e {
        sqlx::Error::Database(db) => db
            .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
            .map(|m| m.number()),
        _ => None,
    }
}

/// Whether `e` says one of taskq's tables does not exist (MySQL error 1146; SQLite has no
/// number for it, only `SQLITE_ERROR` with the message `no such table: <name>`, which no
/// other database writes).
pub(super) fn is_missing_taskq_table(e: &sqlx::Error) -> bool {
    let sqlx::Error::Database(db) = e else {
        return false;
    };
    if error_number(e) == Some(er::NO_SUCH_TABLE) {
        return db.message().contains("taskq_");
    }
    db.message().starts_with("no such table: taskq_")
}

/// For an error that means the database could not be reached or refused the session: what
/// happened (short, for parentheses) and what to check. `None` for any other error.
pub(crate) fn connect_problem(e: &sqlx::Error) -> Option<(String, &'static str)> {
    use std::io::ErrorKind;
    const CHECK_SERVER: &str =
        "is the server running, and are the host and port in the database URL right?";
    let problem = match e {
        sqlx::Error::Io(io) => match io.kind() {
            ErrorKind::ConnectionRefused => ("connection refused".to_owned(), CHECK_SERVER),
            ErrorKind::TimedOut => (
                "no answer".to_owned(),
                "is the host reachable from here (firewall, VPN, container port mapping)?",
            ),
            _ => (io.to_string(), CHECK_SERVER),
        },
        sqlx::Error::Tls(tls) => (
            format!("TLS failed: {tls}"),
            "check the URL's ssl-mode and the server's TLS settings",
        ),
        sqlx::Error::PoolTimedOut => (
            "no answer".to_owned(),
            "is the server running and reachable from here (firewall, VPN, container port mapping)?",
        ),
        sqlx::Error::Database(db) => {
            let advice = match error_number(e)? {
                er::ACCESS_DENIED | er::ACCESS_DENIED_NO_PASSWORD => {
                    "check the user name and password in the database URL"
                }
                er::DBACCESS_DENIED => {
                    "grant this user access to the database, or fix the database name in the URL"
                }
                er::BAD_DB => {
                    "create it (CREATE DATABASE), or fix the database name at the end of the URL"
                }
                er::CON_COUNT => {
                    "the server's max_connections is reached: use smaller pools or raise the limit"
                }
                _ => return None,
            };
            // With its number, like every other database error taskq shows; this also keeps
            // `Debug` from repeating sqlx's text (which is "error returned from database: " and
            // this) under `Caused by:`.
            (db.to_string(), advice)
        }
        _ => return None,
    };
    Some(problem)
}

/// The message of a connection failure, with the server's address when known.
pub(super) fn connect_sentence(target: Option<&str>, e: &sqlx::Error) -> String {
    let at = target.map_or_else(String::new, |t| format!(" at {t}"));
    match connect_problem(e) {
        Some((problem, advice)) => {
            format!("cannot connect to the database{at} ({problem}): {advice}")
        }
        None => format!("cannot connect to the database{at}: {e}"),
    }
}

/// The message of [`Error::Database`].
pub(super) fn database_sentence(e: &sqlx::Error) -> String {
    match e {
        sqlx::Error::PoolTimedOut => "timed out waiting for a database connection from the pool: \
             either the server cannot be reached (is it running? are the host and port in the \
             database URL right?) or every connection of the pool is busy (raise the pool's \
             max_connections or acquire_timeout)"
            .to_owned(),
        e if connect_problem(e).is_some() => connect_sentence(None, e),
        sqlx::Error::Database(db) if is_missing_taskq_table(e) => {
            format!(
                "database error: {db} (taskq's tables are missing: run taskq::migrate(&pool) \
                 at start-up, or `taskq migrate`)"
            )
        }
        sqlx::Error::Database(db) => format!("database error: {db}"),
        e => format!("database error: {e}"),
    }
}

/// How long [`db_error`] waits for its diagnostic connection.
pub(super) const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Turns an error of a call on `store` into the error users see: a connection failure of a
/// database on a server becomes [`Error::Connect`] naming the server. A pool only says it timed
/// out (it retries a refused connection until its acquire timeout), so then one direct
/// connection, bounded by [`PROBE_TIMEOUT`], finds the cause; if that connection works, the
/// pool was just busy. A database in a file (no connect target) is never "unreachable".
pub(crate) async fn db_error(store: &crate::backend::Store, e: sqlx::Error) -> Error {
    let Some(target) = store.connect_target() else {
        return Error::Database(e);
    };
    match e {
        sqlx::Error::PoolTimedOut => match tokio::time::timeout(PROBE_TIMEOUT, store.probe()).await
        {
            Ok(Ok(())) => Error::Database(sqlx::Error::PoolTimedOut),
            Ok(Err(cause)) if connect_problem(&cause).is_some() => Error::Connect {
                target,
                source: cause,
            },
            Ok(Err(_)) => Error::Database(sqlx::Error::PoolTimedOut),
            Err(_) => Error::Connect {
                target,
                source: sqlx::Error::PoolTimedOut,
            },
        },
        e if connect_problem(&e).is_some() => Error::Connect { target, source: e },
        e => Error::Database(e),
    }
}
