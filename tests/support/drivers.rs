//! Each test backend's driver (`taskq_mysql::MySqlDriver`, `taskq_sqlite::SqliteDriver`), for
//! tests that call the seam directly: the driver suite (`tests/driver.rs`) and the operator's
//! operations and row states of `tests/events.rs`.

use sqlx::{MySql, Pool, Sqlite};
use taskq_driver::driver::Driver;

use crate::backends::TestBackend;

/// A test backend's driver.
pub trait HasDriver: TestBackend {
    /// The driver handle over a pool of this backend.
    type Store: Driver<Database = Self>;
    /// The driver on `pool`.
    fn store(pool: Pool<Self>) -> Self::Store;
}

impl HasDriver for MySql {
    type Store = taskq_mysql::MySqlDriver;
    fn store(pool: Pool<Self>) -> Self::Store {
        taskq_mysql::MySqlDriver::new(pool)
    }
}

impl HasDriver for Sqlite {
    type Store = taskq_sqlite::SqliteDriver;
    fn store(pool: Pool<Self>) -> Self::Store {
        taskq_sqlite::SqliteDriver::new(pool)
    }
}
