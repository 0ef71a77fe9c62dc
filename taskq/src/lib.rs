//! # taskq
//!
//! A durable, transactional background task queue on the MySQL 8 / MariaDB database a service
//! already has — or, with the `sqlite` feature, on an embedded SQLite file. Tasks are enqueued
//! in the caller's own transaction: **they exist if that transaction commits, vanish if it
//! rolls back, and are invisible to workers until commit.** Workers claim them (MySQL: `FOR
//! UPDATE SKIP LOCKED`; SQLite: under the write lock), hold database-clock leases renewed by
//! heartbeat, and fence every write-back with a lease epoch. The backend follows the type of
//! the pool or transaction you pass ([`Backend`]).
//!
//! Delivery is **at-least-once**: a handler can run more than once for the same task (after a
//! crash, a lost lease or a timeout), so handlers must be idempotent. taskq is not a message
//! broker and does not promise exactly-once side effects.
//!
//! ```no_run
//! use taskq::TaskError;
//!
//! #[taskq::task(queue = "orders", max_attempts = 5)]
//! async fn order_export(order_id: i64) -> Result<(), TaskError> {
//!     // idempotent work...
//!     Ok(())
//! }
//!
//! # async fn demo(pool: sqlx::MySqlPool) -> Result<(), Box<dyn std::error::Error>> {
//! taskq::migrate(&pool).await?;
//! let mut tx = pool.begin().await?;
//! // sqlx::query!("INSERT INTO orders ...").execute(&mut *tx).await?;
//! OrderExport { order_id: 42 }.enqueue_tx(&mut tx).await?;
//! tx.commit().await?;
//!
//! taskq::run_registered(pool).await?; // in the worker's main
//! # Ok(()) }
//! ```
//!
//! The crate root holds what a first program names: [`task`], [`Task`], [`TaskError`],
//! [`TaskContext`], [`Data`], [`Enqueue`], [`migrate()`], [`run_registered`], [`Worker`],
//! [`Client`]. The rest is in modules: [`context`] (what a handler can be given, your own
//! extractors), [`enqueue`] (batch enqueue, the connection bound), [`unique`] (unique tasks),
//! [`schedule`] (recurring tasks), [`followup`] (tasks enqueued when one dies or succeeds),
//! [`error`], [`migrate`](mod@migrate) (taskq's migrator), [`worker`] (the builder, reports and
//! health), [`client`] (the operator's inputs and outputs), [`registry`], [`defaults`],
//! [`settings`], [`ordered`] (ordered tasks), [`outbox`] (events and the relay), [`inbox`] (the
//! consumers' inbox), [`prelude`] (`use taskq::prelude::*` for the enqueue options of a task)
//! and, with the `sqlite` feature, `sqlite`.
//!
//! See `docs/` in the repository for the semantics, design and operations guides.

mod backend;
pub mod client;
mod connect;
pub mod context;
pub mod defaults;
pub mod error;
mod history;
pub mod inbox;
mod info;
mod metrics;
pub mod migrate;
mod moved;
pub mod ordered;
pub mod outbox;
pub mod registry;
mod retry;
mod task;
pub use task::{enqueue, followup, schedule};
pub mod batch;
mod trace;
pub mod unique;
mod wake;
pub mod worker;
pub mod workflow;

// The crate root holds what a first program names; the rest is in the modules above
// (`context`, `enqueue`, `error`, `followup`, `migrate`, `schedule`, `unique`, `worker`,
// `client`, `registry`, `defaults`, `settings`).
pub use backend::Backend;
pub use client::Client;
pub use connect::{connect, create_database};
pub use context::{CancelSignal, Data, TaskContext};
pub use enqueue::{Enqueue, Enqueued};
pub use error::{Error, OutputError, Result, ResultExt, TaskError};
pub use followup::{DeadTask, SucceededTask};
pub use migrate::migrate;
pub use retry::Backoff;
pub use task::{Task, TaskId, TaskState};
pub use worker::{Worker, run_registered};

// The old crate-root paths of what moved into modules in 0.2, deprecated (removed in 0.3).
#[allow(deprecated)]
pub use moved::*;

/// SQLite (feature `sqlite`): opening a database file with taskq's settings. Pass the pool
/// to taskq as you would a MySQL one (`taskq::migrate(&pool)`, `Worker::builder(pool)`,
/// `enqueue_tx(&mut tx)`): the backend follows the pool's type.
///
/// ```no_run
/// # async fn f() -> taskq::Result<()> {
/// let pool = taskq::sqlite::connect("sqlite://app.db").await?; // created if missing
/// taskq::migrate(&pool).await?;
/// let mut tx = taskq::sqlite::begin(&pool).await?; // BEGIN IMMEDIATE: see `begin`
/// // sqlx::query("INSERT INTO orders ...").execute(&mut *tx).await?;
/// // OrderExport { order_id }.enqueue_tx(&mut tx).await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
#[cfg(feature = "sqlite")]
pub mod sqlite {
    pub use crate::backend::sqlite::{begin, connect, connect_with, open};
    pub use taskq_sqlite::connect::{DEFAULT_BUSY_TIMEOUT, DEFAULT_MAX_CONNECTIONS, tune};
}

/// The former name of [`defaults`], which holds taskq's defaults and the bounds it checks input
/// against, not queue limits (those are set with
/// [`Client::set_queue_limit`](crate::Client::set_queue_limit)).
#[deprecated(note = "renamed `taskq::defaults`")]
pub mod limits {
    pub use crate::defaults::*;
}

/// The traits whose methods a program calls on its tasks and results: `use taskq::prelude::*;`
/// brings the enqueue options of [`Task`] (`OrderExport { .. }.with_delay(..)`; `#[task]`
/// generates no copies of them) and [`ResultExt`] (`.permanent()`) into scope.
pub mod prelude {
    pub use crate::{ResultExt, Task};
}

/// Process-wide settings: set once at start-up, before the first enqueue.
pub mod settings {
    pub use crate::task::enqueue::{payload_limit, set_payload_limit};
    pub use crate::trace::set_trace_context_hook;
}

/// Marks an `async fn` as a task handler; see the crate docs and `docs/macro.md`.
///
/// The function stays callable as written. The macro adds a payload struct named in
/// PascalCase (one field per payload parameter), its [`Task`] impl, the inherent `enqueue_tx`,
/// `enqueue` and every `with_*` enqueue option (which need no import) and a
/// registration found by [`WorkerBuilder::register_all`](worker::WorkerBuilder::register_all) and [`run_registered`].
///
/// Attributes (all optional): `name` (stable name stored in the row; default: the fn's name),
/// `queue` (default `"default"`), `max_attempts` (default [`DEFAULT_MAX_ATTEMPTS`](defaults::DEFAULT_MAX_ATTEMPTS)), `priority`
/// (default 0, lower runs first), `timeout` (e.g. `"30s"`; default none), `backoff`
/// (`"exponential(1s, 10m)"` or `"constant(5s)"`; default [`Backoff::DEFAULT`]), `max_snoozes`
/// (snoozes that do not count as an attempt, see [`TaskError::snooze`]; default
/// [`DEFAULT_MAX_SNOOZES`](defaults::DEFAULT_MAX_SNOOZES)), `ttl` (e.g. `"1h"`: a task not started within it after its
/// enqueue ends `expired`, never run; default none) and `unique` (at most one live task per
/// identity: `unique`, or `unique(by = [field, ..], while = "pending" | "running", period =
/// "10m")`; see [`Unique`](unique::Unique) and `docs/macro.md`), `on_dead` and `on_success` (the path of another
/// `#[task]` fn whose only payload parameter is a [`DeadTask`], resp. [`SucceededTask`],
/// enqueued in the transaction that records this task's death, resp. success; see
/// [`Task::ON_DEAD`]), `ordered_by` (payload parameter names, e.g. `ordered_by = [account]`:
/// tasks of the queue with equal values run one at a time, in commit order; sets
/// [`Task::ORDERED`]; see [`Ordered`](ordered::Ordered)) and `ordered_dead_after` (with
/// `ordered_by`: the task dies after that many attempts and its death lets its key go on; by
/// default a dead task holds its key). One enqueue gets an order key of its own with
/// [`with_order_key`](Enqueue::with_order_key). For a recurring task without payload
/// parameters: `cron` (`"0 3 * * *"`, or 6 fields with seconds first; see [`Schedule`](schedule::Schedule)),
/// `timezone` (default `"UTC"`) and `missed_ticks` (`"latest"`, the default, `"skip"` or
/// `"all(N)"`; see [`MissedTicks`](schedule::MissedTicks)).
///
/// Parameters of type [`TaskContext`], [`CancelSignal`] or [`Data<T>`](Data), or marked
/// `#[inject]` (any type implementing [`context::FromTaskContext`]), are
/// injected by the worker, each through `FromTaskContext`; every other parameter is payload.
///
/// ```no_run
/// use std::time::Duration;
/// use sqlx::MySqlPool;
/// use taskq::prelude::*; // `.permanent()` (the enqueue options need no import)
/// use taskq::{Data, TaskContext, TaskError};
///
/// #[derive(Debug)]
/// struct ExportError(String);
/// impl std::fmt::Display for ExportError {
///     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
///         f.write_str(&self.0)
///     }
/// }
/// impl std::error::Error for ExportError {}
///
/// /// Exports one order to the warehouse (idempotent: it may run more than once).
/// #[taskq::task(name = "order_export", queue = "orders", max_attempts = 5, timeout = "2m",
///               backoff = "exponential(5s, 10m)")]
/// pub async fn export_order(
///     order_id: i64,
///     format: String,
///     cx: TaskContext,
///     db: Data<MySqlPool>,
/// ) -> Result<(), TaskError> {
///     let version: u32 = format.trim_start_matches('v').parse().permanent()?; // never retried
///     let (_status,): (String,) = sqlx::query_as("SELECT 'ok'").fetch_one(&*db).await?; // retried
///     if version > 2 {
///         return Err(ExportError(format!("attempt {}: unsupported", cx.attempt())).into());
///     }
///     Ok(())
/// }
///
/// # async fn demo(pool: MySqlPool) -> Result<(), Box<dyn std::error::Error>> {
/// let mut tx = pool.begin().await?;
/// let queued = ExportOrder { order_id: 42, format: "v2".into() }
///     .with_delay(Duration::from_secs(30))
///     .enqueue_tx(&mut tx)
///     .await?;
/// tx.commit().await?;
/// println!("queued task {}", queued.id);
///
/// // In the worker process: register the pool the handlers take as `Data<MySqlPool>`.
/// taskq::Worker::builder(pool.clone())
///     .register_all()
///     .data(pool.clone())
///     .build()?
///     .run()
///     .await?;
/// # Ok(()) }
/// ```
pub use taskq_macros::task;

/// Makes a struct a domain event: implements [`outbox::Event`] with the given topic and key.
///
/// `topic = "..."` (required): the subject, topic or stream the event goes to, a string literal
/// of 1 to 255 bytes without control characters or surrounding whitespace. `key = field` or
/// `key = [field, ..]` (required): the field(s) naming the aggregate; its events reach the
/// broker in commit order. `key()` is the field's `Display`, or the fields' `Display`s joined
/// with `':'` (`key = [tenant, order_id]` gives `"acme:42"`). The struct must have named
/// fields and implement `serde::Serialize` (the payload is its JSON). Every misuse is a
/// compile error; see `docs/outbox.md`.
///
/// ```no_run
/// #[derive(serde::Serialize)]
/// #[taskq::event(topic = "orders.placed", key = order_id)]
/// struct OrderPlaced {
///     order_id: i64,
///     total_cents: i64,
/// }
///
/// # async fn f(pool: sqlx::MySqlPool) -> taskq::Result<()> {
/// use taskq::outbox::Event;
/// let mut tx = pool.begin().await?;
/// // sqlx::query!("INSERT INTO orders ...").execute(&mut *tx).await?;
/// OrderPlaced { order_id: 42, total_cents: 1999 }.publish_tx(&mut tx).await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
pub use taskq_macros::event;

/// Support for code generated by `#[task]`. Not public API; not semver-stable.
#[doc(hidden)]
pub mod __private {
    pub use crate::__enqueue_options as enqueue_options;
    pub use crate::context::DataRequirement;
    pub use crate::task::followup::target::FollowUpFrom;
    pub use chrono;
    pub use inventory;
    pub use serde;
    pub use serde_json;
    pub use sqlx;
}
