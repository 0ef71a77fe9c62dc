//! Connection setup: WAL, a busy timeout, `synchronous = NORMAL`, and `BEGIN IMMEDIATE` for
//! every transaction that writes.
//!
//! SQLite lets one writer at a time into a database file. In WAL mode readers never wait for
//! the writer nor block it; writers queue on the file's write lock, each waiting up to the
//! busy timeout. A transaction that writes is begun with `BEGIN IMMEDIATE`, which takes the
//! write lock at once (waiting for it under the busy timeout): a plain `BEGIN` takes it at the
//! first write, and if another writer committed since the transaction's first read, that
//! upgrade fails at once with `SQLITE_BUSY` instead of waiting. Single statements in
//! autocommit mode take the lock at their start, so they wait like `BEGIN IMMEDIATE`.

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Connection, Sqlite, SqliteConnection, SqlitePool, Transaction};

/// How long a statement waits for another connection's write lock before failing with
/// `SQLITE_BUSY` ("database is locked").
pub const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Connections of a pool from [`open`] unless told otherwise: readers run in parallel in WAL
/// mode, writers take turns.
pub const DEFAULT_MAX_CONNECTIONS: u32 = 8;

/// Applies taskq's settings to `opts`: WAL journal, `synchronous = NORMAL` (in WAL mode a
/// commit survives a process crash; a power loss can lose the last commits but never corrupts
/// the file), [`DEFAULT_BUSY_TIMEOUT`], and the file created if missing.
pub fn tune(opts: SqliteConnectOptions) -> SqliteConnectOptions {
    opts.journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Normal)
        .busy_timeout(DEFAULT_BUSY_TIMEOUT)
        .create_if_missing(true)
}

/// Options for the database file at `path`, with [`tune`]'s settings.
pub fn connect_options(path: impl AsRef<Path>) -> SqliteConnectOptions {
    tune(SqliteConnectOptions::new().filename(path))
}

/// Options for a `sqlite:` URL (`sqlite://path/to/file.db`, `sqlite:///abs/path.db`), with
/// [`tune`]'s settings applied on top of the URL's.
pub fn connect_options_from_url(url: &str) -> sqlx::Result<SqliteConnectOptions> {
    Ok(tune(SqliteConnectOptions::from_str(url)?))
}

/// A pool on the database file at `path` (created if missing) with [`tune`]'s settings and up
/// to `max_connections` connections.
pub async fn open(path: impl AsRef<Path>, max_connections: u32) -> sqlx::Result<SqlitePool> {
    open_with(connect_options(path), max_connections).await
}

/// A pool with `opts` and up to `max_connections` connections, opened with retries: a new
/// connection switches the file to WAL, and while another connection holds the write lock
/// (several processes opening a new file at once, one of them already migrating) that switch
/// fails at once with "database is locked" instead of waiting for the busy timeout. It is tried
/// again every 50 ms for up to the busy timeout ([`DEFAULT_BUSY_TIMEOUT`]).
pub async fn open_with(
    opts: SqliteConnectOptions,
    max_connections: u32,
) -> sqlx::Result<SqlitePool> {
    let started = std::time::Instant::now();
    loop {
        let res = SqlitePoolOptions::new()
            .max_connections(max_connections.max(1))
            .connect_with(opts.clone())
            .await;
        match res {
            Err(sqlx::Error::Database(db))
                if started.elapsed() < DEFAULT_BUSY_TIMEOUT
                    && db
                        .code()
                        .and_then(|c| c.parse::<i32>().ok())
                        .is_some_and(|c| c & 0xff == 5) =>
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            res => return res,
        }
    }
}

/// Begins a write transaction on a connection of `pool` with `BEGIN IMMEDIATE` (see the
/// module docs). Use it for a transaction that enqueues tasks next to business rows.
pub async fn begin_immediate(pool: &SqlitePool) -> sqlx::Result<Transaction<'static, Sqlite>> {
    pool.begin_with("BEGIN IMMEDIATE").await
}

/// A write transaction on `conn`: `BEGIN IMMEDIATE`, or a savepoint when `conn` is already in
/// a transaction (the caller's, whose lock mode is the caller's choice).
pub(crate) async fn begin_write(
    conn: &mut SqliteConnection,
) -> sqlx::Result<Transaction<'_, Sqlite>> {
    if conn.is_in_transaction() {
        conn.begin().await
    } else {
        conn.begin_with("BEGIN IMMEDIATE").await
    }
}
