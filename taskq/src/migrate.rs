//! taskq's schema migrations, tracked in their own table so they coexist with the
//! application's `sqlx::migrate!()` on the same database.

use std::time::{Duration, Instant};

use sqlx::migrate::Migrator;
use sqlx::{Connection, MySqlPool};

use crate::backend::Backend;

use crate::backend::mysql as store;
use crate::error::{Error, Result};

/// Name of the table taskq records its applied migrations in.
pub const MIGRATIONS_TABLE: &str = "_taskq_migrations";

/// taskq's migrator: versioned, checksummed, with dirty-state detection. Its versions live in
/// `_taskq_migrations`, not in `_sqlx_migrations`, so the application's own migrator never
/// sees them. Prefer [`migrate`], which also serializes concurrent runs (see there).
pub fn migrator() -> Migrator {
    // The table name comes from `taskq/sqlx.toml` ([migrate] table-name).
    let m: Migrator = sqlx::migrate!("./migrations");
    debug_assert_eq!(&*m.table_name, MIGRATIONS_TABLE);
    m
}

/// Creates or upgrades taskq's tables on `pool`'s database (MySQL / MariaDB, or with the
/// `sqlite` feature a SQLite file). Safe to call at every start-up and
/// from several processes at once, also on different nodes of a Galera cluster: it holds the
/// migration lock, a row of `taskq_migration_lock`, while migrating.
///
/// The lock is a row rather than `GET_LOCK`: a named lock lives in one server only (Galera
/// does not replicate it, so two migrators on two nodes would both get it), and sqlx's own
/// `GET_LOCK(name, -1)` is answered with `NULL` at once by MariaDB instead of waiting
/// (measured on MariaDB 10.11). The row is taken with a plain insert, which a cluster
/// certifies like any write: of two concurrent takers only one commits. A waiting migrator
/// tries again every 250 ms for up to 10 minutes. The holder renews the row every 20 s; a
/// migrator that dies holding it blocks others for at most a minute.
///
/// A database that cannot be reached gives [`Error::Connect`], whose message names the server
/// and what to check (e.g. `cannot connect to the database at 127.0.0.1:3306 (connection
/// refused): is the server running, and are the host and port in the database URL right?`).
pub async fn migrate<DB: Backend>(pool: &sqlx::Pool<DB>) -> Result<()> {
    DB::__migrate(pool).await
}

/// [`migrate`] on MySQL / MariaDB.
pub(crate) async fn migrate_mysql(pool: &MySqlPool) -> Result<()> {
    let mut conn = match pool.acquire().await {
        Ok(conn) => conn,
        Err(e) => return Err(crate::error::db_error(pool, e).await),
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
    // Renewed on another connection of the pool while the migrations run on this one.
    let renew_pool = pool.clone();
    let renew_holder = holder.clone();
    let renewer = tokio::spawn(async move {
        let every = Duration::from_secs(u64::from(store::MIGRATION_LOCK_SECS) / 3);
        loop {
            tokio::time::sleep(every).await;
            if let Err(e) = store::migration_lock_renew(&renew_pool, &renew_holder).await {
                tracing::warn!(error = %e, "taskq: renewing the migration lock failed");
            }
        }
    });
    let res = migrator().run_direct(None, &mut *conn, false).await;
    renewer.abort();
    if store::migration_unlock(&mut conn, &holder).await.is_err() {
        // The row expires on its own; drop this connection rather than return it to the pool.
        let _ = conn.detach().close().await;
    }
    res?;
    Ok(())
}

/// Longest wait for the migration lock.
const LOCK_WAIT: Duration = Duration::from_secs(600);
/// How often a waiting migrator tries the lock again.
const LOCK_POLL: Duration = Duration::from_millis(250);
