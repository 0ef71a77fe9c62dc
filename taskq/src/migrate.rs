//! taskq's schema migrations, tracked in their own table so they coexist with the
//! application's `sqlx::migrate!()` on the same database.

use sqlx::MySqlPool;
use sqlx::migrate::Migrator;

use crate::error::Result;

/// Name of the table taskq records its applied migrations in.
pub const MIGRATIONS_TABLE: &str = "_taskq_migrations";

/// taskq's migrator (versioned, checksummed, dirty-state detection, and a database-wide lock so
/// concurrent processes serialize). Its versions live in `_taskq_migrations`, not in
/// `_sqlx_migrations`, so the application's own migrator never sees them.
pub fn migrator() -> Migrator {
    // The table name comes from `taskq/sqlx.toml` ([migrate] table-name).
    let m: Migrator = sqlx::migrate!("./migrations");
    debug_assert_eq!(&*m.table_name, MIGRATIONS_TABLE);
    m
}

/// Creates or upgrades taskq's tables on `pool`'s database. Safe to call at every start-up and
/// from several processes at once.
pub async fn migrate(pool: &MySqlPool) -> Result<()> {
    migrator().run(pool).await?;
    Ok(())
}
