//! The backend seam, as the runtime sees it: which driver a pool belongs to, and one call per
//! operation that goes to that driver.
//!
//! [`Backend`] is the public, sealed trait of the databases taskq runs on (`sqlx::MySql`;
//! `sqlx::Sqlite` with the `sqlite` feature). Users never name it: it is inferred from their
//! `Pool<DB>`, `Transaction<'_, DB>` or connection, and turns it into a [`Store`] (a pool
//! handle of one driver) or a [`Conn`] (a borrowed connection of one driver).
//!
//! The operations themselves are typed once, in `taskq_driver::driver` (one trait per table or
//! job, with the rows of `taskq_driver::rows`), and implemented by each driver: the
//! `taskq-mysql` crate (its SQL split by table, checked against MySQL) and the `taskq-sqlite`
//! crate (its `driver` module over its statements). Everything above this
//! module — the worker's loops, the client, enqueue — calls the operations of [`Store`] and
//! [`Conn`], which call the pool's driver through a trait object (`Store` is an
//! `Arc<dyn taskq_driver::dynamic::DynDriver>`, a connection a `&mut dyn Any`): no `match` on
//! the database, no `cfg` arm. They are generated from the seam's one list of operations
//! (`taskq_driver::__seam_operations!`), as are the driver traits and their trait objects, so
//! no signature is written twice; the only per-driver lines are the [`Backend`] impls, which
//! map a pool type to its driver. How a driver claims (MySQL's
//! candidate windows and seek positions, SQLite's `BEGIN IMMEDIATE` + `UPDATE … RETURNING`)
//! stays inside it: the claim loop only carries an opaque `ClaimCursor`.

use std::future::Future;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use sqlx::MySql;

use crate::error::{Error, connect_problem};

use taskq_driver::budget::Budget;
use taskq_driver::driver::{Driver, Handle};
use taskq_driver::dynamic::{
    AnyConn, Args, DynDriver, DynEnqueue, DynPooled, DynTx, ErrorClass, enqueue_ops,
};
use taskq_driver::event::*;
use taskq_driver::read::{PendingNameCount, QueueStateCount, ScheduleInfo, TaskInfo};
use taskq_driver::state::{TaskId, TaskState};

pub(crate) mod budget;
pub(crate) use taskq_mysql as mysql;
mod rows;
#[cfg(feature = "sqlite")]
pub(crate) mod sqlite;

pub(crate) use rows::*;

mod sealed {
    pub trait Sealed {}
    impl Sealed for sqlx::MySql {}
    #[cfg(feature = "sqlite")]
    impl Sealed for sqlx::Sqlite {}
}

/// A database taskq runs on: `sqlx::MySql` (MySQL 8 / MariaDB 10.6+, the default), or
/// `sqlx::Sqlite` (feature `sqlite`). Sealed; inferred from the pool, transaction or connection
/// you pass to taskq, so `taskq::migrate(&pool)`, `Worker::builder(pool)`, `Client::new(pool)`
/// and `enqueue_tx(&mut tx)` read the same on both.
pub trait Backend: sqlx::Database + sealed::Sealed {
    /// The backend's name, as logs and errors print it.
    const NAME: &'static str;

    /// The driver of this database's pools (see `taskq_driver::driver`).
    #[doc(hidden)]
    type __Driver: Driver<Database = Self>;

    #[doc(hidden)]
    fn __migrate(pool: &sqlx::Pool<Self>) -> impl Future<Output = crate::Result<()>> + Send;
}

// The drivers taskq knows: one line each (plus its migration run), nothing else in taskq names
// them.

impl Backend for MySql {
    const NAME: &'static str = <mysql::MySqlDriver as Handle>::NAME;
    type __Driver = mysql::MySqlDriver;

    fn __migrate(pool: &sqlx::MySqlPool) -> impl Future<Output = crate::Result<()>> + Send {
        migrate_mysql(pool)
    }
}

#[cfg(feature = "sqlite")]
impl Backend for sqlx::Sqlite {
    const NAME: &'static str = <taskq_sqlite::SqliteDriver as Handle>::NAME;
    type __Driver = taskq_sqlite::SqliteDriver;

    fn __migrate(pool: &sqlx::SqlitePool) -> impl Future<Output = crate::Result<()>> + Send {
        sqlite::migrate(pool)
    }
}

pub(crate) use taskq_driver::pool::WorkerPool;

/// A pool handle of one driver. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Store(Arc<dyn DynDriver>);

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Store").field(&self.0.name()).finish()
    }
}

/// A borrowed connection of one driver: the caller's transaction (enqueue) or a connection
/// of the worker's pool.
pub(crate) struct Conn<'c> {
    conn: &'c mut AnyConn,
    enqueue: &'static dyn DynEnqueue,
}

impl<'c> Conn<'c> {
    /// A caller's connection of database `DB`.
    pub(crate) fn of<DB: Backend>(conn: &'c mut DB::Connection) -> Self {
        Conn {
            conn,
            enqueue: enqueue_ops::<DB::__Driver>(),
        }
    }

    /// Reborrows.
    pub(crate) fn reborrow(&mut self) -> Conn<'_> {
        Conn {
            conn: &mut *self.conn,
            enqueue: self.enqueue,
        }
    }
}

/// A connection taken from a [`Store`]'s pool.
pub(crate) struct Pooled {
    conn: Box<dyn DynPooled>,
    enqueue: &'static dyn DynEnqueue,
}

impl Pooled {
    /// The connection, borrowed.
    pub(crate) fn conn(&mut self) -> Conn<'_> {
        Conn {
            conn: self.conn.conn(),
            enqueue: self.enqueue,
        }
    }

    /// Takes the connection out of the pool without closing it gracefully (a statement on it
    /// timed out: its state is unknown).
    pub(crate) fn discard(self) {
        self.conn.discard()
    }
}

/// A transaction of a [`Store`] (the client's actions and their audit entries).
pub(crate) struct Tx {
    tx: Box<dyn DynTx>,
    enqueue: &'static dyn DynEnqueue,
}

impl Tx {
    /// The transaction's connection.
    pub(crate) fn conn(&mut self) -> Conn<'_> {
        Conn {
            conn: self.tx.conn(),
            enqueue: self.enqueue,
        }
    }

    /// Commits.
    pub(crate) async fn commit(self) -> sqlx::Result<()> {
        self.tx.commit().await
    }
}

impl Store {
    /// A handle on a user's pool of database `DB`, through its driver.
    pub(crate) fn of<DB: Backend>(pool: sqlx::Pool<DB>) -> Store {
        Store(Arc::new(<DB::__Driver as Handle>::from_pool(pool)))
    }

    /// Whether `other` is a handle on the same pool (a clone of this one).
    pub(crate) fn same(&self, other: &Store) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// The backend's name.
    pub(crate) fn backend(&self) -> &'static str {
        self.0.name()
    }

    /// Takes a connection from the pool.
    pub(crate) async fn acquire(&self) -> sqlx::Result<Pooled> {
        Ok(Pooled {
            conn: self.0.acquire().await?,
            enqueue: self.0.enqueue(),
        })
    }

    /// Begins a transaction (on SQLite, one that takes the write lock at once).
    pub(crate) async fn begin(&self) -> sqlx::Result<Tx> {
        Ok(Tx {
            tx: self.0.begin().await?,
            enqueue: self.0.enqueue(),
        })
    }

    /// A pool for the worker (one of its lanes, see `worker::lanes`), with the same connect
    /// options as this one (see the drivers' `worker_store`).
    pub(crate) fn worker_store(&self, spec: WorkerPool) -> Store {
        Store(self.0.worker_store(spec))
    }

    /// A pool for the worker whose connections wait at most `busy` for the write lock
    /// (SQLite; elsewhere the same as [`worker_store`](Self::worker_store)).
    pub(crate) fn worker_store_waiting(
        &self,
        spec: WorkerPool,
        busy: std::time::Duration,
    ) -> Store {
        Store(self.0.worker_store_waiting(spec, busy))
    }

    /// Connections open in the pool right now.
    pub(crate) fn size(&self) -> u32 {
        self.0.size()
    }

    /// The busy timeout of the pool's connections, on SQLite (`None` on MySQL).
    pub(crate) fn busy_timeout(&self) -> Option<std::time::Duration> {
        self.0.busy_timeout()
    }

    /// Whether claims report a queue's controls (see `Handle::claims_see_controls`).
    pub(crate) fn claims_see_controls(&self) -> bool {
        self.0.claims_see_controls()
    }

    /// Closes the pool.
    pub(crate) async fn close(&self) {
        self.0.close().await
    }

    /// Where the pool connects, for a database on a server (see `Handle::connect_target`).
    pub(crate) fn connect_target(&self) -> Option<String> {
        self.0.connect_target()
    }

    /// Opens one connection outside the pool and closes it (see `DynDriver::probe`).
    pub(crate) async fn probe(&self) -> sqlx::Result<()> {
        self.0.probe().await
    }

    /// How the driver reads an error (nothing for an error that is not the database's).
    pub(crate) fn classify(&self, e: &sqlx::Error) -> ErrorClass {
        match e {
            sqlx::Error::Database(db) => self.0.classify(&**db),
            _ => ErrorClass::default(),
        }
    }

    /// Turns an error of a call on this store into the error users see (see [`db_error`]).
    pub(crate) async fn error(&self, e: sqlx::Error) -> crate::Error {
        db_error(self, e).await
    }
}

/// Declares the operations of [`Store`] and [`Conn`] from the seam's one list
/// (`taskq_driver::__seam_operations!`, which also declares the driver traits and their trait
/// objects): each calls the same-named operation of the pool's driver, through
/// `taskq_driver::dynamic::DynDriver`. `fn name(&self, ..)` runs on the store's pool; `fn
/// name(&self, conn, ..)` on a connection the caller took (the worker's deadlines, the
/// client's transactions); the `enqueue` ones on a caller's connection (the producer path and
/// audit entries, in the caller's transaction).
macro_rules! forward {
    (
        $(#[$em:meta])* enqueue $enqueue:ident {
            $( $(#[$efm:meta])* fn $ename:ident(conn $(; $earg:ident: $ety:ty)* $(,)?) -> $eret:ty; )*
        }
        $(
            $(#[$tm:meta])* trait $trait:ident {
                $(
                    $(#[$m:meta])*
                    fn $name:ident(&self $(, $conn:ident)? $(; $arg:ident: $ty:ty)* $(,)?) -> $ret:ty;
                )*
            }
        )*
    ) => {
        impl Conn<'_> {$(
            $(#[$efm])*
            pub(crate) async fn $ename(&mut self $(, $earg: $ety)*) -> sqlx::Result<$eret> {
                self.enqueue.$ename(&mut *self.conn, Args::new(($($earg,)*))).await
            }
        )*}

        impl Store {$($(
            $(#[$m])*
            pub(crate) async fn $name(&self $(, $conn: Conn<'_>)? $(, $arg: $ty)*) -> sqlx::Result<$ret> {
                self.0.$name($($conn.conn,)? Args::new(($($arg,)*))).await
            }
        )*)*}
    };
}

taskq_driver::__seam_operations!(forward);

/// `taskq::migrate` on MySQL / MariaDB: the driver's run (`taskq_mysql::migrate`), its failures
/// turned into taskq's errors (a pool that gives no connection is diagnosed like any other
/// call on it).
async fn migrate_mysql(pool: &sqlx::MySqlPool) -> crate::Result<()> {
    use taskq_mysql::MigrationError as E;
    match taskq_mysql::migrate(pool).await {
        Ok(()) => Ok(()),
        Err(E::Acquire(e)) => Err(Store::of(pool.clone()).error(e).await),
        Err(E::Database(e)) => Err(Error::Database(e)),
        Err(E::Migrate(e)) => Err(Error::Migrate(e)),
        Err(E::LockWait) => Err(Error::Config(
            "could not take the taskq migration lock within 10 minutes".into(),
        )),
        Err(E::LockLost { version, reason }) => Err(Error::MigrationLockLost { version, reason }),
    }
}

/// How long [`db_error`] waits for its diagnostic connection.
const PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Turns an error of a call on `store` into the error users see: a connection failure of a
/// database on a server becomes [`Error::Connect`] naming the server. A pool only says it timed
/// out (it retries a refused connection until its acquire timeout), so then one direct
/// connection, bounded by [`PROBE_TIMEOUT`], finds the cause; if that connection works, the
/// pool was just busy. A database in a file (no connect target) is never "unreachable".
async fn db_error(store: &Store, e: sqlx::Error) -> Error {
    let Some(target) = store.connect_target() else {
        return Error::Database(e);
    };
    match e {
        sqlx::Error::PoolTimedOut => match tokio::time::timeout(PROBE_TIMEOUT, store.probe()).await
        {
            Ok(Ok(())) => Error::Database(sqlx::Error::PoolTimedOut),
            Ok(Err(cause)) if connect_problem(&cause).is_some() => Error::Connect {
                target,
                source: cause,
            },
            Ok(Err(_)) => Error::Database(sqlx::Error::PoolTimedOut),
            Err(_) => Error::Connect {
                target,
                source: sqlx::Error::PoolTimedOut,
            },
        },
        e if connect_problem(&e).is_some() => Error::Connect { target, source: e },
        e => Error::Database(e),
    }
}
