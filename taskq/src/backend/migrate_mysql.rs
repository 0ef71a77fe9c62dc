//! The MySQL / MariaDB migration run behind [`crate::migrate()`]: taskq's migrator and the
//! migration lock held while it runs (see `migrate()`'s docs for the guarantees).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::migrate::{Migrate, Migrator};
use sqlx::{Connection, MySqlPool};

use super::mysql as store;
use crate::error::{Error, Result};

/// Name of the table taskq records its applied migrations in.
pub const MIGRATIONS_TABLE: &str = "_taskq_migrations";

/// taskq's migrator: versioned, checksummed, with dirty-state detection. Its versions live in
/// `_taskq_migrations`, not in `_sqlx_migrations`, so the application's own migrator never
/// sees them. Prefer [`migrate`](crate::migrate()), which also serializes concurrent runs (see there).
pub fn migrator() -> Migrator {
    // The table name comes from `taskq/sqlx.toml` ([migrate] table-name).
    let m: Migrator = sqlx::migrate!("./migrations");
    debug_assert_eq!(&*m.table_name, MIGRATIONS_TABLE);
    m
}

/// [`migrate`](crate::migrate()) on MySQL / MariaDB.
pub(crate) async fn migrate_mysql(pool: &MySqlPool) -> Result<()> {
    let mut conn = match pool.acquire().await {
        Ok(conn) => conn,
        Err(e) => return Err(super::Store::of(pool.clone()).error(e).await),
    };
    store::migration_lock_table(&mut conn).await?;
    let holder = format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..));
    let started = Instant::now();
    while !store::migration_lock_try(&mut conn, &holder).await? {
        if started.elapsed() >= LOCK_WAIT {
            return Err(Error::Config(
                "could not take the taskq migration lock within 10 minutes".into(),
            ));
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
    if store::migration_unlock(&mut conn, &holder).await.is_err() {
        // The row expires on its own; drop this connection rather than return it to the pool.
        let _ = conn.detach().close().await;
    }
    res
}

/// Runs the pending migrations one at a time, confirming the lock before each: a lock lost
/// meanwhile (see [`keep_lock`]) stops the run with [`Error::MigrationLockLost`] before the
/// next migration. A migration already running when the lock is lost completes (its DDL
/// cannot be taken back).
async fn run_locked(
    conn: &mut sqlx::MySqlConnection,
    lock_pool: &MySqlPool,
    holder: &str,
    lost: &Mutex<Option<String>>,
) -> Result<()> {
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
        let gone = |reason: String| Error::MigrationLockLost { version, reason };
        if let Some(reason) = lost.lock().unwrap_or_else(|e| e.into_inner()).clone() {
            return Err(gone(reason));
        }
        if !store::migration_lock_renew(lock_pool, holder).await? {
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
    let validity = Duration::from_secs(u64::from(store::MIGRATION_LOCK_SECS));
    let mut wait = validity / 3;
    loop {
        tokio::time::sleep(wait).await;
        let sent = Instant::now();
        let reason = match store::migration_lock_renew(&pool, &holder).await {
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

/// How soon a failed renewal of the migration lock is tried again.
const RENEW_RETRY: Duration = Duration::from_secs(2);

/// Longest wait for the migration lock.
const LOCK_WAIT: Duration = Duration::from_secs(600);
/// How often a waiting migrator tries the lock again.
const LOCK_POLL: Duration = Duration::from_millis(250);
