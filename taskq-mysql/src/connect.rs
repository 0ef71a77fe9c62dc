//! Opening a pool on a MySQL / MariaDB URL, and creating the database a URL names
//! (`taskq::connect`, `taskq::create_database`). A failure says which URL was wrong or which
//! server could not be reached; taskq turns it into the error users see (with the advice of
//! its connection diagnosis).

use std::time::Duration;

use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
use sqlx::{ConnectOptions, Connection, MySqlPool};

use crate::database::{database_create, database_exists};

/// How long [`connect`] and [`create_database`] wait for the server's first answer.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// What a database URL looks like, for error messages.
const URL_HELP: &str = "expected mysql://user:password@host:3306/database";

/// Why [`connect`] or [`create_database`] failed.
#[derive(Debug)]
pub enum ConnectError {
    /// The URL is not a MySQL URL, does not parse, or names no (or an invalid) database: what
    /// is wrong, with the URL's password hidden.
    Url(String),
    /// A connection to `target` (`host:port` or the socket path) failed.
    Failed {
        /// Where the URL points.
        target: String,
        /// The error from sqlx.
        source: sqlx::Error,
    },
    /// A statement on a connection that opened failed.
    Statement(sqlx::Error),
}

/// Parses `url` and names where it points (`host:port` or the socket path).
fn options(url: &str) -> Result<(MySqlConnectOptions, String), ConnectError> {
    if !(url.starts_with("mysql://") || url.starts_with("mariadb://")) {
        return Err(ConnectError::Url(format!(
            "invalid database URL {:?}: {URL_HELP}",
            redact(url)
        )));
    }
    let opts: MySqlConnectOptions = url.parse().map_err(|e| {
        ConnectError::Url(format!(
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

/// Opens a connection pool on the database at `url`, checking that it answers: one direct
/// connection first (a pool retries a refused connection until its acquire timeout and then
/// only says it timed out; a direct one fails at once with the cause), then the pool. Waits at
/// most 10 s for the server's first answer.
pub async fn connect(url: &str) -> Result<MySqlPool, ConnectError> {
    let (opts, target) = options(url)?;
    probe(&opts, &target).await?.close().await.ok();
    MySqlPoolOptions::new()
        .acquire_timeout(CONNECT_TIMEOUT)
        .connect_with(opts)
        .await
        .map_err(|source| ConnectError::Failed { target, source })
}

/// One connection with `opts`, within [`CONNECT_TIMEOUT`].
async fn probe(
    opts: &MySqlConnectOptions,
    target: &str,
) -> Result<sqlx::MySqlConnection, ConnectError> {
    let failed = |source| ConnectError::Failed {
        target: target.to_owned(),
        source,
    };
    match tokio::time::timeout(CONNECT_TIMEOUT, opts.connect()).await {
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(e)) => Err(failed(e)),
        Err(_) => Err(failed(sqlx::Error::PoolTimedOut)),
    }
}

/// Creates the database named at the end of `url` if it does not exist yet (the user needs the
/// `CREATE` privilege); returns whether it created it.
pub async fn create_database(url: &str) -> Result<bool, ConnectError> {
    let (opts, target) = options(url)?;
    let Some(name) = opts.get_database().map(str::to_owned) else {
        return Err(ConnectError::Url(format!(
            "the database URL {:?} names no database; {URL_HELP}",
            redact(url)
        )));
    };
    if name.contains('`') || name.is_empty() {
        return Err(ConnectError::Url(format!("invalid database name {name:?}")));
    }
    let mut conn = probe(&opts.clone().database(""), &target).await?;
    let created = !database_exists(&mut conn, &name)
        .await
        .map_err(ConnectError::Statement)?;
    if created {
        database_create(&mut conn, &name)
            .await
            .map_err(ConnectError::Statement)?;
    }
    let _ = conn.close().await;
    Ok(created)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url_error(url: &str) -> String {
        match options(url) {
            Err(ConnectError::Url(m)) => m,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn urls_are_checked_and_passwords_hidden() {
        let e = url_error("postgres://u:secret@h/db");
        assert!(
            e.contains("expected mysql://") && !e.contains("secret"),
            "{e}"
        );
        let e = url_error("mysql://u:secret@h:notaport/db");
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
