//! Opening a pool on a database URL with errors a newcomer can act on: a server that is not
//! running, a wrong password or a missing database each get a sentence that says what to check,
//! instead of sqlx's `Io(Os { code: 111, .. })`.

use std::time::Duration;

use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
use sqlx::{ConnectOptions, Connection, MySqlPool};

use crate::error::{Error, Result, connect_problem};

/// How long [`connect`] and [`create_database`] wait for the server's first answer.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// What a database URL looks like, for error messages.
const URL_HELP: &str = "expected mysql://user:password@host:3306/database";

/// Parses `url` and names where it points (`host:port` or the socket path).
fn options(url: &str) -> Result<(MySqlConnectOptions, String)> {
    if !(url.starts_with("mysql://") || url.starts_with("mariadb://")) {
        return Err(Error::Config(format!(
            "invalid database URL {:?}: {URL_HELP}",
            redact(url)
        )));
    }
    let opts: MySqlConnectOptions = url.parse().map_err(|e| {
        Error::Config(format!(
            "invalid database URL {:?}: {e}; {URL_HELP}",
            redact(url)
        ))
    })?;
    let target = match opts.get_socket() {
        Some(socket) => socket.display().to_string(),
        None => format!("{}:{}", opts.get_host(), opts.get_port()),
    };
    Ok((opts, target))
}

/// `url` with its password replaced by `***`, for messages.
fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    match rest.split_once('@') {
        Some((user_info, host)) if user_info.contains(':') => {
            let user = user_info.split(':').next().unwrap_or_default();
            format!("{scheme}://{user}:***@{host}")
        }
        _ => url.to_owned(),
    }
}

/// The error of a failed connection to `target`: [`Error::Connect`] when the server could not
/// be reached or refused the session (with the advice), else the database error.
fn failed(target: String, e: sqlx::Error) -> Error {
    if connect_problem(&e).is_some() {
        Error::Connect { target, source: e }
    } else {
        Error::Database(e)
    }
}

/// Opens a connection pool on the MySQL / MariaDB database at `url`
/// (`mysql://user:password@host:3306/database`), checking that it answers.
///
/// The same as `MySqlPool::connect(url)`, with errors that say what to do: an invalid URL is
/// [`Error::Config`]; a server that is not running or not reachable, a wrong password or an
/// unknown database is [`Error::Connect`] (for example "cannot connect to the database at
/// 127.0.0.1:3306 (connection refused): is the server running, and are the host and port in the
/// database URL right?"). Waits at most 10 s for the server's first answer.
///
/// ```no_run
/// # async fn f() -> taskq::Result<()> {
/// let pool = taskq::connect("mysql://root@127.0.0.1:3306/app").await?;
/// taskq::migrate(&pool).await?;
/// # Ok(()) }
/// ```
pub async fn connect(url: &str) -> Result<MySqlPool> {
    let (opts, target) = options(url)?;
    // One direct connection first: a pool retries a refused connection until its acquire
    // timeout and then only says it timed out; a direct one fails at once with the cause.
    probe(&opts, &target).await?.close().await.ok();
    MySqlPoolOptions::new()
        .acquire_timeout(CONNECT_TIMEOUT)
        .connect_with(opts)
        .await
        .map_err(|e| failed(target, e))
}

/// One connection with `opts`, within [`CONNECT_TIMEOUT`].
async fn probe(opts: &MySqlConnectOptions, target: &str) -> Result<sqlx::MySqlConnection> {
    match tokio::time::timeout(CONNECT_TIMEOUT, opts.connect()).await {
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(e)) => Err(failed(target.to_owned(), e)),
        Err(_) => Err(failed(target.to_owned(), sqlx::Error::PoolTimedOut)),
    }
}

/// Creates the database named at the end of `url` if it does not exist yet (the user needs the
/// `CREATE` privilege); returns whether it created it. For examples, tests and first runs —
/// production databases are usually created by whoever provisions the server. Errors read like
/// [`connect`]'s.
///
/// ```no_run
/// # async fn f() -> taskq::Result<()> {
/// let url = "mysql://root@127.0.0.1:3306/taskq_getting_started";
/// taskq::create_database(url).await?;
/// let pool = taskq::connect(url).await?;
/// # Ok(()) }
/// ```
pub async fn create_database(url: &str) -> Result<bool> {
    let (opts, target) = options(url)?;
    let Some(name) = opts.get_database().map(str::to_owned) else {
        return Err(Error::Config(format!(
            "the database URL {:?} names no database; {URL_HELP}",
            redact(url)
        )));
    };
    if name.contains('`') || name.is_empty() {
        return Err(Error::Config(format!("invalid database name {name:?}")));
    }
    let mut conn = probe(&opts.clone().database(""), &target).await?;
    let created = !crate::backend::mysql::database_exists(&mut conn, &name).await?;
    if created {
        crate::backend::mysql::database_create(&mut conn, &name).await?;
    }
    let _ = conn.close().await;
    Ok(created)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked_and_passwords_hidden() {
        let e = options("postgres://u:secret@h/db").unwrap_err().to_string();
        assert!(
            e.contains("expected mysql://") && !e.contains("secret"),
            "{e}"
        );
        let e = options("mysql://u:secret@h:notaport/db")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("invalid database URL") && !e.contains("secret"),
            "{e}"
        );
        assert_eq!(
            options("mysql://u@db.example:3307/x").unwrap().1,
            "db.example:3307"
        );
        assert_eq!(redact("mysql://u:p@h/d"), "mysql://u:***@h/d");
        assert_eq!(redact("mysql://u@h/d"), "mysql://u@h/d");
    }
}
