//! taskq's MySQL / MariaDB migrations (the workspace's top-level `migrations/`) and their run
//! ([`migrate`], behind `taskq::migrate`), under the database-wide migration lock
//! (`taskq_migration_lock`): a replicated row, so it holds across the nodes of a Galera
//! cluster (see `taskq::migrate`'s docs for the guarantees).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::migrate::{Migrate, MigrateError, Migrator};
use sqlx::{Connection, MySqlConnection, MySqlPool};

use crate::{is_conflict_on, is_deadlock};

/// Name of the table taskq records its applied migrations in.
pub const MIGRATIONS_TABLE: &str = "_taskq_migrations";

/// taskq's migrator: versioned, checksummed, with dirty-state detection. Its versions live in
/// `_taskq_migrations`, not in `_sqlx_migrations`, so the application's own migrator never
/// sees them. Prefer [`migrate`], which also serializes concurrent runs.
pub fn migrator() -> Migrator {
    // The table name comes from `taskq-mysql/sqlx.toml` ([migrate] table-name).
    let m: Migrator = sqlx::migrate!("./migrations");
    debug_assert_eq!(&*m.table_name, MIGRATIONS_TABLE);
    m
}

/// Why [`migrate`] failed.
#[derive(Debug)]
pub enum MigrationError {
    /// No connection could be taken from the pool (for the caller's connection diagnosis).
    Acquire(sqlx::Error),
    /// A statement of the lock failed.
    Database(sqlx::Error),
    /// The migrator failed.
    Migrate(MigrateError),
    /// The lock could not be taken within 10 minutes.
    LockWait,
    /// The lock was lost while migrating: the run stopped before migration `version`.
    LockLost {
        /// The first migration not applied.
        version: i64,
        /// What the lock's owner found.
        reason: String,
    },
}

impl From<sqlx::Error> for MigrationError {
    fn from(e: sqlx::Error) -> Self {
        MigrationError::Database(e)
    }
}

impl From<MigrateError> for MigrationError {
    fn from(e: MigrateError) -> Self {
        MigrationError::Migrate(e)
    }
}

/// How long a taken migration lock is valid without renewal: a migrator that died holding it
/// stops blocking others after this long. The holder renews it every third of this.
pub const MIGRATION_LOCK_SECS: u32 = 60;

/// Creates the migration lock's table if it is missing (it must exist before the first
/// migration runs; migration 13 records the same definition). DDL: on a Galera cluster it is
/// replicated in total order, so concurrent creators on different nodes do not conflict.
pub async fn migration_lock_table(conn: &mut MySqlConnection) -> sqlx::Result<()> {
    sqlx::query!(
        r#"CREATE TABLE IF NOT EXISTS taskq_migration_lock (
            id         TINYINT UNSIGNED NOT NULL,
            holder     VARCHAR(64)      NOT NULL,
            expires_at DATETIME(6)      NOT NULL,
            PRIMARY KEY (id)
        ) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin"#
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// Tries once to take the database-wide migration lock for `holder` (autocommit): removes a
/// lock whose holder let it expire, then inserts the lock row. Returns whether this call took
/// it. Another holder's row (a duplicate key), or a concurrent taker on another Galera node
/// (a certification failure, error 1213), means not taken. Unlike `GET_LOCK`, which each
/// server keeps to itself, the row is replicated, so this serializes migrators on every node
/// of a cluster.
///
/// On Galera a statement on the lock table can also be aborted with 1213 by another node's
/// DDL on it (the `CREATE TABLE IF NOT EXISTS` of [`migration_lock_table`], replicated in
/// total order, aborts what runs on the table meanwhile): the removal of an expired lock
/// answers "not taken" then too, and the caller tries again.
pub async fn migration_lock_try(conn: &mut MySqlConnection, holder: &str) -> sqlx::Result<bool> {
    let expired = sqlx::query!(
        "DELETE FROM taskq_migration_lock WHERE id = 1 AND expires_at < UTC_TIMESTAMP(6)"
    )
    .execute(&mut *conn)
    .await;
    match expired {
        Ok(_) => {}
        Err(sqlx::Error::Database(e)) if is_deadlock(&*e) => return Ok(false),
        Err(e) => return Err(e),
    }
    let res = sqlx::query!(
        r#"INSERT INTO taskq_migration_lock (id, holder, expires_at)
           VALUES (1, ?, UTC_TIMESTAMP(6) + INTERVAL ? SECOND)"#,
        holder,
        MIGRATION_LOCK_SECS
    )
    .execute(&mut *conn)
    .await;
    match res {
        Ok(_) => Ok(true),
        Err(sqlx::Error::Database(e)) if is_conflict_on(&*e, "") || is_deadlock(&*e) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Extends `holder`'s migration lock by `MIGRATION_LOCK_SECS` (60 s); returns whether it still held it.
pub async fn migration_lock_renew(pool: &MySqlPool, holder: &str) -> sqlx::Result<bool> {
    let done = sqlx::query!(
        r#"UPDATE taskq_migration_lock SET expires_at = UTC_TIMESTAMP(6) + INTERVAL ? SECOND
           WHERE id = 1 AND holder = ?"#,
        MIGRATION_LOCK_SECS,
        holder
    )
    .execute(pool)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Releases `holder`'s migration lock.
pub async fn migration_unlock(conn: &mut MySqlConnection, holder: &str) -> sqlx::Result<()> {
    sqlx::query!(
        "DELETE FROM taskq_migration_lock WHERE id = 1 AND holder = ?",
        holder
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// Creates or upgrades taskq's tables on `pool`'s database, holding the migration lock while
/// migrating: waits for it up to 10 minutes, renews it every third of
/// `MIGRATION_LOCK_SECS` (60 s) on a connection of its own and before each migration, and stops
/// with [`MigrationError::LockLost`] before the next migration once it is lost.
pub async fn migrate(pool: &MySqlPool) -> Result<(), MigrationError> {
    let mut conn = pool.acquire().await.map_err(MigrationError::Acquire)?;
    migration_lock_table(&mut conn).await?;
    let holder = format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..));
    let started = Instant::now();
    while !migration_lock_try(&mut conn, &holder).await? {
        if started.elapsed() >= LOCK_WAIT {
            return Err(MigrationError::LockWait);
        }
        tokio::time::sleep(LOCK_POLL).await;
    }
    let taken = Instant::now();
    // Renewed on a connection of its own while the migrations run on this one: not one of
    // `pool`'s, which may have no second connection to give (a pool of one would wait for
    // the connection the migration holds).
    let lock_pool = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(1)
        .min_connections(0)
        .connect_lazy_with((*pool.connect_options()).clone());
    let lost: Arc<Mutex<Option<String>>> = Arc::default();
    let renewer = tokio::spawn(keep_lock(
        lock_pool.clone(),
        holder.clone(),
        taken,
        lost.clone(),
    ));
    let res = run_locked(&mut conn, &lock_pool, &holder, &lost).await;
    renewer.abort();
    lock_pool.close().await;
    if migration_unlock(&mut conn, &holder).await.is_err() {
        // The row expires on its own; drop this connection rather than return it to the pool.
        let _ = conn.detach().close().await;
    }
    res
}

/// Runs the pending migrations one at a time, confirming the lock before each: a lock lost
/// meanwhile (see [`keep_lock`]) stops the run with [`MigrationError::LockLost`] before the
/// next migration. A migration already running when the lock is lost completes (its DDL
/// cannot be taken back).
async fn run_locked(
    conn: &mut MySqlConnection,
    lock_pool: &MySqlPool,
    holder: &str,
    lost: &Mutex<Option<String>>,
) -> Result<(), MigrationError> {
    let m = migrator();
    conn.ensure_migrations_table(MIGRATIONS_TABLE).await?;
    let applied: Vec<i64> = conn
        .list_applied_migrations(MIGRATIONS_TABLE)
        .await?
        .into_iter()
        .map(|a| a.version)
        .collect();
    let pending: Vec<i64> = m
        .iter()
        .filter(|x| !x.migration_type.is_down_migration() && !applied.contains(&x.version))
        .map(|x| x.version)
        .collect();
    if pending.is_empty() {
        // Still checks for a dirty or modified applied migration.
        m.run_direct(None, &mut *conn, false).await?;
        return Ok(());
    }
    for version in pending {
        let gone = |reason: String| MigrationError::LockLost { version, reason };
        if let Some(reason) = lost.lock().unwrap_or_else(|e| e.into_inner()).clone() {
            return Err(gone(reason));
        }
        if !renew_before_migration(lock_pool, holder).await? {
            return Err(gone(LOCK_TAKEN.into()));
        }
        m.run_direct(Some(version), &mut *conn, false).await?;
    }
    Ok(())
}

/// What [`keep_lock`] and [`run_locked`] report when the lock row is no longer this migrator's.
const LOCK_TAKEN: &str =
    "its row is no longer this migrator's: another migrator took it after it expired";

/// Renews `holder`'s lock every third of its validity until aborted. Sets `lost` when a
/// renewal finds the row no longer `holder`'s, or when no renewal got through for the lock's
/// whole validity (it may have expired and been taken); a failed renewal is tried again after
/// [`RENEW_RETRY`].
async fn keep_lock(
    pool: MySqlPool,
    holder: String,
    mut confirmed: Instant,
    lost: Arc<Mutex<Option<String>>>,
) {
    let validity = Duration::from_secs(u64::from(MIGRATION_LOCK_SECS));
    let mut wait = validity / 3;
    loop {
        tokio::time::sleep(wait).await;
        let sent = Instant::now();
        let reason = match migration_lock_renew(&pool, &holder).await {
            Ok(true) => {
                confirmed = sent;
                wait = validity / 3;
                continue;
            }
            Ok(false) => LOCK_TAKEN.to_owned(),
            Err(e) if confirmed.elapsed() < validity => {
                tracing::warn!(error = %e, "taskq: renewing the migration lock failed; trying again");
                wait = RENEW_RETRY;
                continue;
            }
            Err(e) => format!("no renewal got through for {validity:?}, the last: {e}"),
        };
        tracing::error!(%reason, "taskq: the migration lock was lost; migration stops before the next migration");
        *lost.lock().unwrap_or_else(|e| e.into_inner()) = Some(reason);
        return;
    }
}

/// The renewal before a migration, tried up to five times when Galera aborts it with 1213
/// (another node's DDL on the lock table; the lock row is still this migrator's until it
/// expires, 60 s after the last renewal). Any other error, or a sixth 1213, ends the run.
async fn renew_before_migration(pool: &MySqlPool, holder: &str) -> sqlx::Result<bool> {
    let mut aborted = 0;
    loop {
        match migration_lock_renew(pool, holder).await {
            Err(sqlx::Error::Database(e)) if is_deadlock(&*e) && aborted < 5 => {
                aborted += 1;
                tracing::warn!(error = %e, aborted, "taskq: renewing the migration lock was aborted; trying again");
                tokio::time::sleep(Duration::from_millis(100 * aborted)).await;
            }
            other => return other,
        }
    }
}

/// How soon a failed renewal of the migration lock is tried again.
const RENEW_RETRY: Duration = Duration::from_secs(2);

/// Longest wait for the migration lock.
const LOCK_WAIT: Duration = Duration::from_secs(600);
/// How often a waiting migrator tries the lock again.
const LOCK_POLL: Duration = Duration::from_millis(250);
