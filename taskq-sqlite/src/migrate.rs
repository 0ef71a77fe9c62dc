//! The schema's migrations, tracked in `_taskq_migrations` like taskq's MySQL ones.

use std::time::Duration;

use sqlx::migrate::{MigrateError, Migrator};
use sqlx::{ConnectOptions, Connection, SqliteConnection, SqlitePool};

/// Name of the table the applied migrations are recorded in (from `sqlx.toml`).
pub const MIGRATIONS_TABLE: &str = "_taskq_migrations";

/// How long [`migrate`] waits for another process's write lock (a concurrent migration, or a
/// long transaction) before failing: longer than the pool's busy timeout, since a migration
/// of a big table can hold the lock for a while.
pub const MIGRATE_BUSY_TIMEOUT: Duration = Duration::from_secs(120);

/// How many times [`migrate`] runs the migrator again after an error that says another
/// process got there first.
const MIGRATE_RETRIES: u32 = 5;

/// The migrator of `taskq-sqlite/migrations`. Prefer [`migrate`], which also serializes
/// concurrent runs.
pub fn migrator() -> Migrator {
    let m: Migrator = sqlx::migrate!("./migrations");
    debug_assert_eq!(&*m.table_name, MIGRATIONS_TABLE);
    m
}

/// Creates or upgrades the schema of `pool`'s database. Safe from several processes (and
/// pools) at once on one file, although sqlx's migration lock is a no-op on SQLite:
///
/// - the whole run is one `BEGIN IMMEDIATE` transaction (each migration a savepoint in it),
///   on a connection of its own with [`MIGRATE_BUSY_TIMEOUT`]: a second migrator waits for
///   the first's write lock, then reads the versions it recorded and finds nothing to do;
/// - a run that fails because another process recorded the same version anyway (a
///   migrator outside this function, e.g. `sqlx migrate run`, which takes no lock) or because
///   the lock could not be had at once (`SQLITE_BUSY`) is rolled back and run again, up to
///   five times: it then finds that version applied.
pub async fn migrate(pool: &SqlitePool) -> Result<(), MigrateError> {
    let opts = pool
        .connect_options()
        .as_ref()
        .clone()
        .busy_timeout(MIGRATE_BUSY_TIMEOUT);
    let mut conn = opts.connect().await?;
    let mut tries = 0;
    let res = loop {
        match migrate_once(&mut conn).await {
            Err(e) if tries < MIGRATE_RETRIES && lost_a_race(&e) => tries += 1,
            res => break res,
        }
    };
    conn.close().await?;
    res
}

/// One run of the migrator in one `BEGIN IMMEDIATE` transaction.
async fn migrate_once(conn: &mut SqliteConnection) -> Result<(), MigrateError> {
    let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
    migrator().run_direct(None, &mut *tx, false).await?;
    tx.commit().await?;
    Ok(())
}

/// Whether `e` says another migrator got there first: a unique violation (the version row,
/// or a table or index another run created: "already exists"), or the write lock busy.
fn lost_a_race(e: &MigrateError) -> bool {
    let err = match e {
        MigrateError::Execute(err) | MigrateError::ExecuteMigration(err, _) => err,
        _ => return false,
    };
    let sqlx::Error::Database(db) = err else {
        return false;
    };
    let busy = db
        .code()
        .and_then(|c| c.parse::<i32>().ok())
        .is_some_and(|c| c & 0xff == 5);
    busy || db.is_unique_violation() || db.message().contains("already exists")
}
