//! The schema's migrations, tracked in `_taskq_migrations` like taskq's MySQL ones.

use sqlx::migrate::{MigrateError, Migrator};
use sqlx::{Connection, SqlitePool};

/// Name of the table the applied migrations are recorded in (from `sqlx.toml`).
pub const MIGRATIONS_TABLE: &str = "_taskq_migrations";

/// The migrator of `taskq-sqlite/migrations`. Prefer [`migrate`], which also serializes
/// concurrent runs.
pub fn migrator() -> Migrator {
    let m: Migrator = sqlx::migrate!("./migrations");
    debug_assert_eq!(&*m.table_name, MIGRATIONS_TABLE);
    m
}

/// Creates or upgrades the schema of `pool`'s database. Safe from several processes at once:
/// sqlx's migration lock is a no-op on SQLite, so the whole run is one `BEGIN IMMEDIATE`
/// transaction (each migration a savepoint in it); a second process waits for the write lock
/// (busy timeout) and then finds every migration applied.
pub async fn migrate(pool: &SqlitePool) -> Result<(), MigrateError> {
    let mut conn = pool.acquire().await?;
    let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
    migrator().run_direct(None, &mut *tx, false).await?;
    tx.commit().await?;
    Ok(())
}
