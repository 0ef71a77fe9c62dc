//! taskq's schema migrations, tracked in their own table so they coexist with the
//! application's `sqlx::migrate!()` on the same database.

use crate::backend::Backend;
use crate::error::Result;

pub use taskq_mysql::{MIGRATIONS_TABLE, migrator};

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
/// tries again every 250 ms for up to 10 minutes. The holder renews the row every 20 s, and
/// again before each migration it applies; a migrator that dies holding it blocks others for
/// at most a minute. A migrator that loses the lock (another took its row after it expired,
/// or no renewal got through for a minute) stops before its next migration with
/// [`Error::MigrationLockLost`](crate::Error::MigrationLockLost), so two migrators never go on side by side.
///
/// A database that cannot be reached gives [`Error::Connect`](crate::Error::Connect), whose message names the server
/// and what to check (e.g. `cannot connect to the database at 127.0.0.1:3306 (connection
/// refused): is the server running, and are the host and port in the database URL right?`).
pub async fn migrate<DB: Backend>(pool: &sqlx::Pool<DB>) -> Result<()> {
    DB::__migrate(pool).await
}
