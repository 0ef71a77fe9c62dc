//! The database from its URL: a SQLite file (`sqlite:` scheme) or a MySQL / MariaDB server,
//! opened with errors that say what to check.

use std::str::FromStr;
use std::time::Duration;

use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions, Connection, MySqlPool, SqlitePool};
use taskq::Client;

use crate::failure::{EXIT_UNREACHABLE, EXIT_USAGE, Failure};

/// How long to wait for a database connection before giving up.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A pool on either backend: the [`Client`] is backend-neutral; only `migrate` and closing
/// need the concrete pool.
pub enum Pool {
    MySql(MySqlPool),
    Sqlite(SqlitePool),
}

impl Pool {
    pub fn client(&self) -> Client {
        match self {
            Pool::MySql(p) => Client::new(p.clone()),
            Pool::Sqlite(p) => Client::new(p.clone()),
        }
    }

    pub async fn close(&self) {
        match self {
            Pool::MySql(p) => p.close().await,
            Pool::Sqlite(p) => p.close().await,
        }
    }
}

/// Whether `url` names a SQLite database (`sqlite:` scheme, any case).
fn is_sqlite_url(url: &str) -> bool {
    url.get(..7)
        .is_some_and(|s| s.eq_ignore_ascii_case("sqlite:"))
}

/// Opens the database of `url`. A SQLite file must exist unless `create` (`taskq migrate`
/// creates it): a mistyped path is an error naming it rather than a new empty database.
pub async fn connect(url: &str, max_connections: u32, create: bool) -> Result<Pool, Failure> {
    if is_sqlite_url(url) {
        return connect_sqlite(url, create).await.map(Pool::Sqlite);
    }
    connect_mysql(url, max_connections).await.map(Pool::MySql)
}

async fn connect_sqlite(url: &str, create: bool) -> Result<SqlitePool, Failure> {
    // sqlx's parser accepts the `sqlite:` prefix in lower case only.
    let url = format!("sqlite:{}", &url[7..]);
    let options = SqliteConnectOptions::from_str(&url)
        .map_err(|e| Failure::new(EXIT_USAGE, format!("invalid SQLite URL {url:?}: {e}")))?;
    let path = options.get_filename();
    let in_memory = path.as_os_str().is_empty() || path.to_string_lossy().contains(":memory:");
    if !create && !in_memory && !path.exists() {
        return Err(Failure::new(
            EXIT_UNREACHABLE,
            format!(
                "no SQLite database at {}: check the path (relative paths start from the \
                 current directory), or create it with `taskq migrate --database-url {url}`",
                path.display()
            ),
        ));
    }
    Ok(taskq::sqlite::connect(&url).await?)
}

async fn connect_mysql(url: &str, max_connections: u32) -> Result<MySqlPool, Failure> {
    let scheme = url.split_once("://").map(|(s, _)| s.to_ascii_lowercase());
    if !matches!(scheme.as_deref(), Some("mysql" | "mariadb")) {
        return Err(Failure::new(
            EXIT_USAGE,
            "invalid database URL: expected mysql://user:password@host:port/database or \
             sqlite://path/to/app.db",
        ));
    }
    let options = MySqlConnectOptions::from_str(url)
        .map_err(|e| Failure::new(EXIT_USAGE, format!("invalid database URL: {e}")))?;
    let target = match options.get_socket() {
        Some(socket) => socket.display().to_string(),
        None => format!("{}:{}", options.get_host(), options.get_port()),
    };
    // taskq's sentence for the failure: what went wrong and what to check.
    let unreachable = |e: sqlx::Error| {
        Failure::from(taskq::Error::Connect {
            target: target.clone(),
            source: e,
        })
    };
    // One direct connection first: a pool would retry until its timeout and then report only
    // "pool timed out", hiding the cause (connection refused, unknown host, access denied...).
    match tokio::time::timeout(CONNECT_TIMEOUT, options.connect()).await {
        Ok(Ok(conn)) => {
            let _ = conn.close().await;
        }
        Ok(Err(e)) => return Err(unreachable(e)),
        Err(_) => {
            return Err(Failure::new(
                EXIT_UNREACHABLE,
                format!(
                    "cannot connect to the database at {target} (no answer within {}s): is the \
                     host reachable from here (firewall, VPN, container port mapping)?",
                    CONNECT_TIMEOUT.as_secs()
                ),
            ));
        }
    }
    MySqlPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(CONNECT_TIMEOUT)
        .connect_with(options)
        .await
        .map_err(unreachable)
}
