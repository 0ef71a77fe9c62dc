//! taskq's schema migrations, tracked in their own table so they coexist with the
//! application's `sqlx::migrate!()` on the same database.

use sqlx::migrate::Migrator;
use sqlx::{Connection, MySqlPool};

use crate::error::{Error, Result};
use crate::store;

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

/// Creates or upgrades taskq's tables on `pool`'s database. Safe to call at every start-up and
/// from several processes at once: it holds a named lock (`GET_LOCK`) while migrating.
///
/// sqlx's own migration lock is `GET_LOCK(name, -1)`, which MariaDB answers with `NULL` at
/// once instead of waiting (measured on MariaDB 10.11), so on MariaDB it does not serialize
/// anything; this function takes a lock that does.
///
/// A database that cannot be reached gives [`Error::Connect`], whose message names the server
/// and what to check (e.g. `cannot connect to the database at 127.0.0.1:3306 (connection
/// refused): is the server running, and are the host and port in the database URL right?`).
pub async fn migrate(pool: &MySqlPool) -> Result<()> {
    let mut conn = match pool.acquire().await {
        Ok(conn) => conn,
        Err(e) => return Err(crate::error::db_error(pool, e).await),
    };
    let mut waited = 0;
    while !store::migration_lock(&mut conn).await? {
        waited += 1;
        if waited >= 10 {
            return Err(Error::Config(
                "could not take the taskq migration lock within 10 minutes".into(),
            ));
        }
    }
    let res = migrator().run_direct(None, &mut *conn, false).await;
    let unlock = store::migration_unlock(&mut conn).await;
    if unlock.is_err() {
        // Closing the session releases the lock too.
        let _ = conn.detach().close().await;
    }
    res?;
    Ok(())
}
