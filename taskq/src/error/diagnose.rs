//! Connection diagnosis: which errors mean the server could not be reached or refused the
//! session (the MySQL / MariaDB error numbers are the driver's, `taskq_mysql::diagnose`), and
//! the sentence that says what to check.

/// Whether `e` says one of taskq's tables does not exist (MySQL error 1146, as the driver reads
/// it; SQLite has no number for it, only `SQLITE_ERROR` with the message `no such table:
/// <name>`, which no other database writes).
pub(super) fn is_missing_taskq_table(e: &sqlx::Error) -> bool {
    let sqlx::Error::Database(db) = e else {
        return false;
    };
    if taskq_mysql::diagnose::is_no_such_table(e) {
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
            // The driver's reading of its error numbers (a session the server refused).
            let advice = taskq_mysql::diagnose::refusal_advice(e)?;
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
