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
//! [`Conn`], which forward to the pool's driver; they are generated from the seam's one list
//! of operations (`taskq_driver::__seam_operations!`), so no signature is written twice. How a driver claims (MySQL's
//! candidate windows and seek positions, SQLite's `BEGIN IMMEDIATE` + `UPDATE … RETURNING`)
//! stays inside it: the claim loop only carries an opaque [`ClaimCursor`].

use std::future::Future;

use chrono::{DateTime, Utc};
use sqlx::pool::PoolConnection;
use sqlx::{MySql, MySqlConnection, MySqlPool, Transaction};

use taskq_driver::budget::Budget;
#[allow(unused_imports)] // the driver operations the forwarding macro calls
use taskq_driver::driver::{
    Actions as _, Claims as _, Clock as _, Enqueue, History as _, Identities as _, Leases as _,
    Queues as _, Schedules as _, StatementBudget as _, Tasks as _, Workers as _,
};
use taskq_driver::read::{PendingNameCount, QueueStateCount, ScheduleInfo, TaskInfo};
use taskq_driver::state::{TaskId, TaskState};

pub(crate) mod budget;
pub(crate) mod migrate_mysql;
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

    #[doc(hidden)]
    fn __store(pool: sqlx::Pool<Self>) -> StoreHandle;

    #[doc(hidden)]
    fn __conn(conn: &mut Self::Connection) -> ConnHandle<'_>;

    #[doc(hidden)]
    fn __migrate(pool: &sqlx::Pool<Self>) -> impl Future<Output = crate::Result<()>> + Send;
}

impl Backend for MySql {
    const NAME: &'static str = "MySQL";

    fn __store(pool: MySqlPool) -> StoreHandle {
        StoreHandle(Store::MySql(mysql::MySqlDriver::new(pool)))
    }

    fn __conn(conn: &mut MySqlConnection) -> ConnHandle<'_> {
        ConnHandle(Conn::MySql(conn))
    }

    fn __migrate(pool: &MySqlPool) -> impl Future<Output = crate::Result<()>> + Send {
        migrate_mysql::migrate_mysql(pool)
    }
}

#[cfg(feature = "sqlite")]
impl Backend for sqlx::Sqlite {
    const NAME: &'static str = "SQLite";

    fn __store(pool: sqlx::SqlitePool) -> StoreHandle {
        StoreHandle(Store::Sqlite(sqlite::SqliteDriver::new(pool)))
    }

    fn __conn(conn: &mut sqlx::SqliteConnection) -> ConnHandle<'_> {
        ConnHandle(Conn::Sqlite(conn))
    }

    fn __migrate(pool: &sqlx::SqlitePool) -> impl Future<Output = crate::Result<()>> + Send {
        sqlite::migrate(pool)
    }
}

/// A backend's pool handle, as [`Backend`]'s hidden methods hand it to taskq; nothing to use.
#[doc(hidden)]
pub struct StoreHandle(pub(crate) Store);

/// A backend's borrowed connection, as [`Backend`]'s hidden methods hand it to taskq.
#[doc(hidden)]
pub struct ConnHandle<'c>(pub(crate) Conn<'c>);

pub(crate) use taskq_driver::pool::WorkerPool;

/// A pool handle of one backend. Cheap to clone.
#[derive(Debug, Clone)]
pub(crate) enum Store {
    /// MySQL / MariaDB.
    MySql(mysql::MySqlDriver),
    /// SQLite.
    #[cfg(feature = "sqlite")]
    Sqlite(sqlite::SqliteDriver),
}

/// A borrowed connection of one backend: the caller's transaction (enqueue) or a connection
/// of the worker's pool.
pub(crate) enum Conn<'c> {
    /// MySQL / MariaDB.
    MySql(&'c mut MySqlConnection),
    /// SQLite.
    #[cfg(feature = "sqlite")]
    Sqlite(&'c mut sqlx::SqliteConnection),
}

/// A connection taken from a [`Store`]'s pool.
pub(crate) enum Pooled {
    MySql(PoolConnection<MySql>),
    #[cfg(feature = "sqlite")]
    Sqlite(PoolConnection<sqlx::Sqlite>),
}

impl Pooled {
    /// The connection, borrowed.
    pub(crate) fn conn(&mut self) -> Conn<'_> {
        match self {
            Pooled::MySql(c) => Conn::MySql(c),
            #[cfg(feature = "sqlite")]
            Pooled::Sqlite(c) => Conn::Sqlite(c),
        }
    }

    /// Takes the connection out of the pool without closing it gracefully (a statement on it
    /// timed out: its state is unknown).
    pub(crate) fn discard(self) {
        match self {
            Pooled::MySql(c) => drop(c.detach()),
            #[cfg(feature = "sqlite")]
            Pooled::Sqlite(c) => drop(c.detach()),
        }
    }
}

/// A transaction of a [`Store`] (the client's actions and their audit entries).
pub(crate) enum Tx {
    MySql(Transaction<'static, MySql>),
    #[cfg(feature = "sqlite")]
    Sqlite(Transaction<'static, sqlx::Sqlite>),
}

impl Tx {
    /// The transaction's connection.
    pub(crate) fn conn(&mut self) -> Conn<'_> {
        match self {
            Tx::MySql(t) => Conn::MySql(t),
            #[cfg(feature = "sqlite")]
            Tx::Sqlite(t) => Conn::Sqlite(t),
        }
    }

    /// Commits.
    pub(crate) async fn commit(self) -> sqlx::Result<()> {
        match self {
            Tx::MySql(t) => t.commit().await,
            #[cfg(feature = "sqlite")]
            Tx::Sqlite(t) => t.commit().await,
        }
    }
}

/// Where one queue's claim loop goes on from, kept by the loop between claims; what it holds
/// is the backend's business (MySQL: the seek position and candidate spread).
pub(crate) enum ClaimCursor {
    MySql(mysql::ClaimCursor),
    #[cfg(feature = "sqlite")]
    Sqlite,
}

/// Runs `$body` with `$s` bound to the backend store of `$store`.
macro_rules! on_store {
    ($store:expr, $s:ident => $body:expr) => {
        match $store {
            Store::MySql($s) => $body,
            #[cfg(feature = "sqlite")]
            Store::Sqlite($s) => $body,
        }
    };
}

/// Runs `$body` with `$s` the backend store of `$store` and `$c` the same backend's
/// connection of `$conn`. A connection of another backend than the store's is a bug.
macro_rules! on_conn {
    ($store:expr, $conn:expr, |$s:ident, $c:ident| $body:expr) => {
        match ($store, $conn) {
            (Store::MySql($s), Conn::MySql($c)) => $body,
            #[cfg(feature = "sqlite")]
            (Store::Sqlite($s), Conn::Sqlite($c)) => $body,
            #[cfg(feature = "sqlite")]
            _ => unreachable!("a connection of another backend than its store"),
        }
    };
}

impl Store {
    /// The backend's name.
    pub(crate) fn backend(&self) -> &'static str {
        match self {
            Store::MySql(_) => MySql::NAME,
            #[cfg(feature = "sqlite")]
            Store::Sqlite(_) => <sqlx::Sqlite as Backend>::NAME,
        }
    }

    /// Takes a connection from the pool.
    pub(crate) async fn acquire(&self) -> sqlx::Result<Pooled> {
        Ok(match self {
            Store::MySql(s) => Pooled::MySql(s.pool().acquire().await?),
            #[cfg(feature = "sqlite")]
            Store::Sqlite(s) => Pooled::Sqlite(s.pool().acquire().await?),
        })
    }

    /// Begins a transaction (on SQLite, one that takes the write lock at once).
    pub(crate) async fn begin(&self) -> sqlx::Result<Tx> {
        Ok(match self {
            Store::MySql(s) => Tx::MySql(s.pool().begin().await?),
            #[cfg(feature = "sqlite")]
            Store::Sqlite(s) => Tx::Sqlite(s.begin().await?),
        })
    }

    /// A pool for the worker (one of its lanes, see `worker::lanes`), with the same connect
    /// options as this one (see the backends' `worker_store`).
    pub(crate) fn worker_store(&self, spec: WorkerPool) -> Store {
        match self {
            Store::MySql(s) => Store::MySql(s.worker_store(spec)),
            #[cfg(feature = "sqlite")]
            Store::Sqlite(s) => Store::Sqlite(s.worker_store(spec)),
        }
    }

    /// Connections open in the pool right now.
    pub(crate) fn size(&self) -> u32 {
        on_store!(self, s => s.pool().size())
    }

    /// The busy timeout of the pool's connections, on SQLite (`None` on MySQL).
    pub(crate) fn busy_timeout(&self) -> Option<std::time::Duration> {
        match self {
            Store::MySql(_) => None,
            #[cfg(feature = "sqlite")]
            Store::Sqlite(s) => Some(s.busy_timeout()),
        }
    }

    /// Closes the pool.
    pub(crate) async fn close(&self) {
        on_store!(self, s => s.pool().close().await)
    }

    /// Turns an error of a call on this store into the error users see (see
    /// [`crate::error::db_error`]).
    pub(crate) async fn error(&self, e: sqlx::Error) -> crate::Error {
        match self {
            Store::MySql(s) => crate::error::db_error(s.pool(), e).await,
            #[cfg(feature = "sqlite")]
            Store::Sqlite(_) => crate::Error::Database(e),
        }
    }

    /// A fresh claim cursor for one queue's claim loop.
    pub(crate) fn claim_cursor(&self) -> ClaimCursor {
        match self {
            Store::MySql(_) => ClaimCursor::MySql(mysql::ClaimCursor::default()),
            #[cfg(feature = "sqlite")]
            Store::Sqlite(_) => ClaimCursor::Sqlite,
        }
    }

    /// Claims up to `req.limit` due tasks of `req.queue` under a lease (see the backends'
    /// `task_claim`), going on from where `cursor` says.
    pub(crate) async fn task_claim(
        &self,
        conn: Conn<'_>,
        req: &ClaimRequest<'_>,
        cursor: &mut ClaimCursor,
    ) -> sqlx::Result<ClaimBatch> {
        match (self, conn, cursor) {
            (Store::MySql(s), Conn::MySql(c), ClaimCursor::MySql(k)) => {
                s.task_claim(c, req, k).await
            }
            #[cfg(feature = "sqlite")]
            (Store::Sqlite(s), Conn::Sqlite(c), ClaimCursor::Sqlite) => {
                s.task_claim(c, req, &mut ()).await
            }
            #[cfg(feature = "sqlite")]
            _ => unreachable!("a connection or cursor of another backend than its store"),
        }
    }
}

/// Declares the operations of [`Store`] and [`Conn`] from the seam's one list
/// (`taskq_driver::__seam_operations!`, which also declares the driver traits): each forwards
/// to the same-named operation of the backend's driver. `fn name(&self, ..)` runs on the
/// store's pool; `fn name(&self, conn, ..)` on a connection the caller took (the worker's
/// deadlines, the client's transactions); the `enqueue` ones on a caller's connection (the
/// producer path and audit entries, in the caller's transaction). Only the claim, whose cursor
/// is each driver's own, is written out below.
macro_rules! forward {
    (@call $self:ident, $name:ident, (), ($($arg:ident),*)) => {
        on_store!($self, s => s.$name($($arg),*).await)
    };
    (@call $self:ident, $name:ident, ($conn:ident), ($($arg:ident),*)) => {
        on_conn!($self, $conn, |s, c| s.$name(c $(, $arg)*).await)
    };
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
                match self {
                    Conn::MySql(c) => <mysql::MySqlDriver as Enqueue>::$ename(c $(, $earg)*).await,
                    #[cfg(feature = "sqlite")]
                    Conn::Sqlite(c) => <sqlite::SqliteDriver as Enqueue>::$ename(c $(, $earg)*).await,
                }
            }
        )*}

        impl Store {$($(
            $(#[$m])*
            pub(crate) async fn $name(&self $(, $conn: Conn<'_>)? $(, $arg: $ty)*) -> sqlx::Result<$ret> {
                forward!(@call self, $name, ($($conn)?), ($($arg),*))
            }
        )*)*}
    };
}

taskq_driver::__seam_operations!(forward);

/// Whether a database error says the statement's transaction lost to a concurrent one (see
/// `StmtError::is_conflict`): MySQL's 1213 (deadlock victim; on Galera a certification
/// failure), SQLite's `SQLITE_BUSY` past the busy timeout.
pub(crate) fn is_conflict(e: &dyn sqlx::error::DatabaseError) -> bool {
    #[cfg(feature = "sqlite")]
    if sqlite::is_busy(e) {
        return true;
    }
    mysql::is_deadlock(e)
}

/// Whether a database error says the statement can never succeed as sent, besides the SQLSTATE
/// classes `StmtError::is_deterministic` reads: MySQL's "packet too large" (1153, 1301, 2020),
/// SQLite's `SQLITE_TOOBIG` and `SQLITE_CONSTRAINT` (a constraint, or a trigger's `RAISE`).
pub(crate) fn is_refused(e: &dyn sqlx::error::DatabaseError) -> bool {
    #[cfg(feature = "sqlite")]
    if sqlite::is_refused(e) {
        return true;
    }
    mysql::is_packet_too_large(e)
}

impl Conn<'_> {
    /// Reborrows.
    pub(crate) fn reborrow(&mut self) -> Conn<'_> {
        match self {
            Conn::MySql(c) => Conn::MySql(c),
            #[cfg(feature = "sqlite")]
            Conn::Sqlite(c) => Conn::Sqlite(c),
        }
    }
}
