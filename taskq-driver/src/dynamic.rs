//! The seam as trait objects: how taskq's runtime, compiled once, calls whichever driver a
//! pool belongs to.
//!
//! [`DynDriver`] is object-safe and implemented for every [`Driver`]: each of the seam's
//! operations, generated from the same list as the driver traits
//! (`taskq_driver::__seam_operations!`), returns a boxed future and takes the connection as
//! `&mut` [`AnyConn`], which it downcasts to the driver's own connection type; its arguments
//! come as one tuple in [`Args`]. [`DynEnqueue`] does the same for the producer path, which
//! runs on a caller's connection with no pool handle: [`enqueue_ops`] gives a driver's, as a
//! `&'static` object. A connection taken from a driver's pool ([`DynPooled`]) or a transaction
//! of it ([`DynTx`]) is boxed too.
//!
//! The runtime holds an `Arc<dyn DynDriver>` and nothing of a driver's types, so adding a
//! driver changes nothing in it but the line that maps a pool type to the driver; adding an
//! operation is still one entry in the list and one implementation per driver. A boxed future
//! per statement is one allocation next to a database round trip (measured in taskq's
//! docs/benchmarks.md).
//!
//! Not semver-stable.

use std::any::Any;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::pool::PoolConnection;
use sqlx::{ConnectOptions, Connection, Transaction};

use crate::budget::Budget;
pub use crate::class::ErrorClass;
use crate::driver::{
    Actions, Batches, Claims, Clock, Driver, Enqueue, Events, Handle, History, Identities, Leases,
    Queues, Schedules, StatementBudget, Tasks, Workers, Workflows,
};
use crate::event::*;
use crate::pool::WorkerPool;
use crate::read::{PendingNameCount, QueueStateCount, ScheduleInfo, TaskInfo};
use crate::rows::*;
use crate::state::{TaskId, TaskState};

/// A boxed future, `Send`, living for `'a`.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A connection of some driver (its [`Handle::Conn`]), type-erased.
pub type AnyConn = dyn Any + Send;

/// An operation's arguments, as one tuple that outlives `'a` (the future the operation
/// returns borrows them for `'a`).
pub struct Args<'a, T: 'a>(pub T, PhantomData<&'a ()>);

impl<'a, T: 'a> Args<'a, T> {
    /// Wraps the arguments.
    pub fn new(args: T) -> Self {
        Args(args, PhantomData)
    }
}

/// `conn` as driver `D`'s connection. A connection of another driver than the one it is
/// handed to is a bug of the caller.
fn downcast<D: Handle>(conn: &mut AnyConn) -> &mut D::Conn {
    match conn.downcast_mut::<D::Conn>() {
        Some(c) => c,
        None => panic!(
            "a connection of another driver handed to the {} driver",
            D::NAME
        ),
    }
}

/// A connection taken from a driver's pool, boxed.
pub trait DynPooled: Send {
    /// The connection.
    fn conn(&mut self) -> &mut AnyConn;
    /// Takes the connection out of the pool without closing it gracefully (a statement on it
    /// timed out: its state is unknown).
    fn discard(self: Box<Self>);
}

impl<DB: sqlx::Database> DynPooled for PoolConnection<DB> {
    fn conn(&mut self) -> &mut AnyConn {
        let c: &mut DB::Connection = self;
        c
    }

    fn discard(self: Box<Self>) {
        drop((*self).detach());
    }
}

/// A transaction of a driver's pool, boxed.
pub trait DynTx: Send {
    /// The transaction's connection.
    fn conn(&mut self) -> &mut AnyConn;
    /// Commits.
    fn commit(self: Box<Self>) -> BoxFuture<'static, sqlx::Result<()>>;
}

impl<DB: sqlx::Database> DynTx for Transaction<'static, DB> {
    fn conn(&mut self) -> &mut AnyConn {
        let c: &mut DB::Connection = self;
        c
    }

    fn commit(self: Box<Self>) -> BoxFuture<'static, sqlx::Result<()>> {
        Box::pin((*self).commit())
    }
}

/// Declares [`DynEnqueue`] and [`DynOperations`] and their implementations from the list of
/// [`__seam_operations!`](crate::__seam_operations).
macro_rules! declare_dyn {
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
        /// The producer path of one driver ([`Enqueue`]) as a trait object; see [`enqueue_ops`].
        pub trait DynEnqueue: Send + Sync {
            $(
                $(#[$efm])*
                fn $ename<'a>(
                    &'a self,
                    conn: &'a mut AnyConn,
                    args: Args<'a, ($($ety,)*)>,
                ) -> BoxFuture<'a, sqlx::Result<$eret>>;
            )*
        }

        impl<D: Driver> DynEnqueue for EnqueueOf<D> {
            $(
                fn $ename<'a>(
                    &'a self,
                    conn: &'a mut AnyConn,
                    args: Args<'a, ($($ety,)*)>,
                ) -> BoxFuture<'a, sqlx::Result<$eret>> {
                    let ($($earg,)*) = args.0;
                    Box::pin(<D as Enqueue>::$ename(downcast::<D>(conn) $(, $earg)*))
                }
            )*
        }

        /// The seam's operations on a driver's pool handle, as a trait object.
        pub trait DynOperations: Send + Sync {
            $($(
                $(#[$m])*
                fn $name<'a>(
                    &'a self,
                    $($conn: &'a mut AnyConn,)?
                    args: Args<'a, ($($ty,)*)>,
                ) -> BoxFuture<'a, sqlx::Result<$ret>>;
            )*)*
        }

        impl<D: Driver> DynOperations for D {
            $($(
                fn $name<'a>(
                    &'a self,
                    $($conn: &'a mut AnyConn,)?
                    args: Args<'a, ($($ty,)*)>,
                ) -> BoxFuture<'a, sqlx::Result<$ret>> {
                    let ($($arg,)*) = args.0;
                    Box::pin(<D as $trait>::$name(self $(, downcast::<D>($conn))? $(, $arg)*))
                }
            )*)*
        }
    };
}

crate::__seam_operations!(declare_dyn);

/// Driver `D`'s [`Enqueue`] as a [`DynEnqueue`] (see [`enqueue_ops`]).
pub struct EnqueueOf<D>(PhantomData<fn() -> D>);

impl<D: 'static> EnqueueOf<D> {
    const OPS: &'static Self = &EnqueueOf(PhantomData);
}

/// Driver `D`'s producer path, for a connection of its database that came without a pool
/// handle (a caller's transaction).
pub fn enqueue_ops<D: Driver>() -> &'static dyn DynEnqueue {
    EnqueueOf::<D>::OPS
}

/// A driver's pool handle as a trait object: the seam's operations ([`DynOperations`]) and
/// what the runtime asks of the pool itself. Implemented for every [`Driver`].
pub trait DynDriver: DynOperations + Send + Sync + 'static {
    /// The database's name, as logs and errors print it.
    fn name(&self) -> &'static str;
    /// The driver's producer path (for the connections of its pool).
    fn enqueue(&self) -> &'static dyn DynEnqueue;
    /// Takes a connection from the pool.
    fn acquire(&self) -> BoxFuture<'_, sqlx::Result<Box<dyn DynPooled>>>;
    /// Begins a transaction (see [`Handle::begin`]).
    fn begin(&self) -> BoxFuture<'_, sqlx::Result<Box<dyn DynTx>>>;
    /// A pool for the worker (see [`Handle::worker_store`]).
    fn worker_store(&self, spec: WorkerPool) -> Arc<dyn DynDriver>;
    /// A pool for the worker whose connections wait at most `busy` for the write lock (see
    /// [`Handle::worker_store_waiting`]).
    fn worker_store_waiting(&self, spec: WorkerPool, busy: Duration) -> Arc<dyn DynDriver> {
        let _ = busy;
        self.worker_store(spec)
    }
    /// Connections open in the pool right now.
    fn size(&self) -> u32;
    /// See [`Handle::busy_timeout`].
    fn busy_timeout(&self) -> Option<Duration>;
    /// See [`Handle::claims_see_controls`].
    fn claims_see_controls(&self) -> bool;
    /// See [`Handle::connect_target`].
    fn connect_target(&self) -> Option<String>;
    /// Opens one connection with the pool's options outside the pool, and closes it: whether
    /// the database can be reached right now (a connection error's diagnosis).
    fn probe(&self) -> BoxFuture<'_, sqlx::Result<()>>;
    /// Closes the pool.
    fn close(&self) -> BoxFuture<'_, ()>;
    /// How the driver reads a database error.
    fn classify(&self, e: &dyn sqlx::error::DatabaseError) -> ErrorClass;
}

impl<D: Driver> DynDriver for D {
    fn name(&self) -> &'static str {
        D::NAME
    }

    fn enqueue(&self) -> &'static dyn DynEnqueue {
        enqueue_ops::<D>()
    }

    fn acquire(&self) -> BoxFuture<'_, sqlx::Result<Box<dyn DynPooled>>> {
        Box::pin(async move {
            let c = self.pool().acquire().await?;
            Ok(Box::new(c) as Box<dyn DynPooled>)
        })
    }

    fn begin(&self) -> BoxFuture<'_, sqlx::Result<Box<dyn DynTx>>> {
        Box::pin(async move {
            let t = Handle::begin(self).await?;
            Ok(Box::new(t) as Box<dyn DynTx>)
        })
    }

    fn worker_store(&self, spec: WorkerPool) -> Arc<dyn DynDriver> {
        Arc::new(Handle::worker_store(self, spec))
    }

    fn worker_store_waiting(&self, spec: WorkerPool, busy: Duration) -> Arc<dyn DynDriver> {
        Arc::new(Handle::worker_store_waiting(self, spec, busy))
    }

    fn size(&self) -> u32 {
        self.pool().size()
    }

    fn busy_timeout(&self) -> Option<Duration> {
        Handle::busy_timeout(self)
    }

    fn claims_see_controls(&self) -> bool {
        Handle::claims_see_controls(self)
    }

    fn connect_target(&self) -> Option<String> {
        Handle::connect_target(self)
    }

    fn probe(&self) -> BoxFuture<'_, sqlx::Result<()>> {
        Box::pin(async move {
            let options = self.pool().connect_options();
            let conn = options.connect().await?;
            conn.close().await
        })
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.pool().close())
    }

    fn classify(&self, e: &dyn sqlx::error::DatabaseError) -> ErrorClass {
        D::classify(e)
    }
}
