//! The SQLite backend's public side in taskq (`taskq::sqlite`: opening a file with taskq's
//! settings, write transactions) and its migration; the driver itself (the seam's operations
//! over SQLite's statements) is `taskq_sqlite::SqliteDriver`.

use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{Sqlite, SqlitePool, Transaction};
use taskq_sqlite as q;

/// Creates or upgrades the schema (see `taskq_sqlite::migrate`).
pub(crate) async fn migrate(pool: &SqlitePool) -> crate::Result<()> {
    q::migrate(pool).await.map_err(crate::Error::from)
}

/// A pool on the SQLite database of `url` (`sqlite://path/to/app.db`, `sqlite:app.db`,
/// `sqlite:///abs/path.db`, or a plain path), created if missing, with taskq's settings: WAL
/// journal (readers never wait for the writer), a 5 s busy timeout, `synchronous = NORMAL`,
/// foreign keys on. Up to [`DEFAULT_MAX_CONNECTIONS`](taskq_sqlite::connect::DEFAULT_MAX_CONNECTIONS)
/// connections. A file that cannot be opened gives [`Error::Open`](crate::Error::Open) naming it.
pub async fn connect(url: &str) -> crate::Result<SqlitePool> {
    let opts = if url.starts_with("sqlite:") {
        q::connect_options_from_url(url).map_err(|e| crate::Error::Open {
            path: url.to_owned(),
            source: e,
        })?
    } else {
        q::connect_options(url)
    };
    connect_with(opts).await
}

/// [`connect`] on a file path.
pub async fn open(path: impl AsRef<std::path::Path>) -> crate::Result<SqlitePool> {
    connect_with(q::connect_options(path)).await
}

/// [`connect`] with your options, e.g. taskq's settings and a busy timeout that suits a short
/// lease (`WorkerBuilder::build` requires `lease − heartbeat − min(cancel grace, lease / 2) ≥
/// busy timeout`):
///
/// ```no_run
/// # async fn f() -> taskq::Result<()> {
/// use std::{str::FromStr, time::Duration};
/// let opts = sqlx::sqlite::SqliteConnectOptions::from_str("sqlite://app.db").unwrap();
/// let pool = taskq::sqlite::connect_with(
///     taskq::sqlite::tune(opts).busy_timeout(Duration::from_millis(500)),
/// )
/// .await?;
/// # Ok(()) }
/// ```
pub async fn connect_with(opts: SqliteConnectOptions) -> crate::Result<SqlitePool> {
    let path = opts.get_filename().display().to_string();
    q::connect::open_with(opts, q::connect::DEFAULT_MAX_CONNECTIONS)
        .await
        .map_err(|source| crate::Error::Open { path, source })
}

/// Begins a transaction that writes, with `BEGIN IMMEDIATE`: it takes the database's write
/// lock at once (waiting up to the busy timeout). Use it for the transaction that inserts a
/// business row and enqueues its task: a plain `pool.begin()` takes the lock at the first
/// write, and if another connection committed since the transaction's first read, that write
/// fails at once with "database is locked" instead of waiting.
pub async fn begin(pool: &SqlitePool) -> crate::Result<Transaction<'static, Sqlite>> {
    q::begin_immediate(pool)
        .await
        .map_err(crate::Error::Database)
}
