//! The [`Task`] trait and the vocabulary around it: [`TaskId`], [`TaskState`].
//!
//! The trait and the types generic over it are one module tree: the trait's signatures name
//! [`Enqueue<Self>`](enqueue::Enqueue), [`Schedule<Self>`](schedule::Schedule) and the
//! follow-up hooks, and those are bound by `Task`. The children (`enqueue`, `schedule`,
//! `followup`, public as `taskq::enqueue`, `taskq::schedule`, `taskq::followup`) name the
//! trait, not each other in a circle; what they share that does not depend on `Task` (the
//! bounds, name validation) is in `crate::defaults`, and unique identities in `crate::unique`.

pub mod enqueue;
pub mod followup;
pub mod schedule;

use std::future::Future;
use std::time::Duration;

use serde::{Serialize, de::DeserializeOwned};

use self::enqueue::{AsConnection, Enqueue, Enqueued};
#[cfg(doc)]
use self::followup::FollowUp;
use self::followup::{OnDead, OnSuccess};
use self::schedule::Schedule;
use crate::context::{DataRequirement, TaskContext};
use crate::defaults::{DEFAULT_MAX_ATTEMPTS, DEFAULT_MAX_SNOOZES, DEFAULT_QUEUE};
use crate::error::{Result, TaskError};
use crate::retry::Backoff;
use crate::unique::Unique;

/// The enqueue options on a task, forwarding to [`Enqueue`]: `enqueue_options()` and every
/// `with_*` option, each as `Enqueue::new(self).with_*(..)`. Written once, expanded twice per
/// use: as provided methods of [`Task`] (`[]`, for generic code and hand-written impls) and, by
/// `#[taskq::task]`, as inherent `pub` methods of each payload struct (`[pub]`), so that
/// `OrderExport { .. }.with_delay(..)` needs no import (see docs/macro.md, "Enqueue options").
/// Paths go through `$crate` so that the expansion compiles in a user's crate. Not public API.
#[doc(hidden)]
#[macro_export]
macro_rules! __enqueue_options {
    // One option at a time, so that the visibility and the doc lines repeat independently.
    (@options [$($vis:tt)*] $root:literal,) => {};
    (@options [$($vis:tt)*] $root:literal,
        $(#[doc = $doc:literal])* $name:ident($arg:ident: $ty:ty); $($rest:tt)*
    ) => {
        $(#[doc = $doc])*
        #[doc = ""]
        #[doc = concat!(
            "[`Enqueue::", stringify!($name), "`](", $root, "::Enqueue::",
            stringify!($name), ") on this task."
        )]
        $($vis)* fn $name(self, $arg: $ty) -> $crate::Enqueue<Self> {
            $crate::Enqueue::new(self).$name($arg)
        }
        $crate::__enqueue_options! { @options [$($vis)*] $root, $($rest)* }
    };
    ([$($vis:tt)*] links = $root:literal) => {
        #[doc = concat!(
            "Starts an enqueue with options; see [`Enqueue`](", $root, "::Enqueue) for the \
             `with_*` options (each also a method of the task, like this one)."
        )]
        $($vis)* fn enqueue_options(self) -> $crate::Enqueue<Self> {
            $crate::Enqueue::new(self)
        }

        $crate::__enqueue_options! { @options [$($vis)*] $root,
            /// Runs no earlier than `delay` after the insert (database clock).
            with_delay(delay: ::core::time::Duration);
            /// Runs no earlier than this UTC time.
            with_run_at(
                at: $crate::__private::chrono::DateTime<$crate::__private::chrono::Utc>
            );
            /// Overrides the task's default priority (lower runs first).
            with_priority(priority: i16);
            /// At most one task with this name and key exists while its row is kept; a
            /// duplicate enqueue returns the existing task's id.
            with_idempotency_key(key: impl ::core::convert::Into<::std::string::String>);
            /// Makes this enqueue unique (or, with `None`, not unique), replacing the task's
            /// `unique` declaration.
            with_unique(
                unique: impl ::core::convert::Into<::core::option::Option<$crate::unique::Unique>>
            );
            /// Runs this task in order with the other tasks of its queue given the same key: one
            /// at a time, in commit order (replaces the key of the task's `ordered_by`).
            with_order_key(key: impl ::core::convert::Into<::std::string::String>);
            /// Overrides the task's queue.
            with_queue(queue: impl ::core::convert::Into<::std::string::String>);
            /// Overrides the task's max attempts (at least 1).
            with_max_attempts(n: u32);
            /// No attempt starts at or after this time: a task not started by then ends
            /// `expired`, never run (replaces `with_ttl` and the task's `TTL`).
            with_deadline(
                deadline: $crate::__private::chrono::DateTime<$crate::__private::chrono::Utc>
            );
            /// The deadline as a time to live from the insert (database clock; replaces
            /// `with_deadline` and the task's `TTL`).
            with_ttl(ttl: ::core::time::Duration);
            /// Records this trace context instead of asking the trace-context hook.
            with_trace_context(context: impl ::core::convert::Into<::std::string::String>);
            /// Overrides the payload size limit for this enqueue.
            with_payload_limit(bytes: usize);
        }
    };
}

/// A kind of background task: a serializable payload plus the handler that runs it.
///
/// Usually generated by [`#[taskq::task]`](crate::task); implement it by hand when you want
/// full control. `NAME` is stored in every row and is how a worker finds the handler, so it must
/// stay stable across deploys: renaming the Rust type is fine, changing `NAME` orphans queued
/// tasks.
///
/// ```
/// use taskq::{Task, TaskContext, TaskError};
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct SendEmail { to: String }
///
/// impl Task for SendEmail {
///     const NAME: &'static str = "send_email";
///     const QUEUE: &'static str = "mail";
///     async fn run(self, _cx: TaskContext) -> Result<(), TaskError> {
///         // deliver self.to ... (must be idempotent: it may run more than once)
///         Ok(())
///     }
/// }
/// ```
pub trait Task: Serialize + DeserializeOwned + Send + Sync + 'static {
    /// Stable name stored in the row (1–255 bytes).
    const NAME: &'static str;
    /// Queue the task is enqueued on (1–64 bytes).
    const QUEUE: &'static str = DEFAULT_QUEUE;
    /// Attempts (first run included) before the task goes to `dead`; at least 1.
    const MAX_ATTEMPTS: u32 = DEFAULT_MAX_ATTEMPTS;
    /// Default priority; lower runs first.
    const PRIORITY: i16 = 0;
    /// Per-attempt timeout; `None` means the handler may run as long as its lease is renewed.
    const TIMEOUT: Option<Duration> = None;
    /// Delay between failed attempts.
    const BACKOFF: Backoff = Backoff::DEFAULT;
    /// Snoozes ([`TaskError::snooze`]) that do not count as an attempt. Once a task has
    /// snoozed this many times, each further snooze counts as a failed attempt (retried after
    /// the snooze delay, `dead` when attempts are exhausted). Default [`DEFAULT_MAX_SNOOZES`].
    const MAX_SNOOZES: u32 = DEFAULT_MAX_SNOOZES;
    /// Time to live from enqueue: a task not started within it is never run and ends
    /// `expired` (see [`Enqueue::with_ttl`]). `None` (the default): no deadline. An enqueue
    /// with [`Enqueue::with_deadline`] or [`Enqueue::with_ttl`] overrides it.
    const TTL: Option<Duration> = None;
    /// Makes every enqueue of this task unique (at most one live task per identity; see
    /// [`Unique`]); `None` (the default) for none. An enqueue can replace it with
    /// [`Enqueue::with_unique`].
    const UNIQUE: Option<Unique> = None;
    /// Makes every enqueue of this task ordered (one at a time per key, in commit order; see
    /// [`Ordered`](crate::ordered::Ordered)); `None` (the default) for none. An enqueue can give its own
    /// key with [`Enqueue::with_order_key`].
    const ORDERED: Option<crate::ordered::Ordered> = None;
    /// What to enqueue when a task of this kind dies, durably: the hook's [`FollowUp`] is
    /// inserted in the transaction that moves the task to `dead` (by its worker's write-back or
    /// by the reaper), so a death is never recorded without it and never gets two. `None` (the
    /// default) for none; `#[taskq::task(on_dead = notify_ops)]` sets it. See
    /// `docs/semantics.md`.
    ///
    /// ```
    /// use taskq::{DeadTask, Task, TaskContext, TaskError, followup::{FollowUp, OnDead}};
    /// # #[derive(serde::Serialize, serde::Deserialize)] struct NotifyOps { dead: DeadTask }
    /// # impl Task for NotifyOps { const NAME: &'static str = "notify_ops";
    /// #   async fn run(self, _: TaskContext) -> Result<(), TaskError> { Ok(()) } }
    /// #[derive(serde::Serialize, serde::Deserialize)]
    /// struct Export { order_id: i64 }
    ///
    /// impl Task for Export {
    ///     const NAME: &'static str = "export";
    ///     const ON_DEAD: Option<OnDead> =
    ///         Some(|dead| Some(FollowUp::new(NotifyOps { dead: dead.clone() })));
    ///     async fn run(self, _cx: TaskContext) -> Result<(), TaskError> {
    ///         Ok(())
    ///     }
    /// }
    /// ```
    const ON_DEAD: Option<OnDead> = None;
    /// What to enqueue when a task of this kind succeeds, in the transaction that records the
    /// success (chaining); like [`ON_DEAD`](Self::ON_DEAD). `#[taskq::task(on_success =
    /// next_step)]` sets it.
    const ON_SUCCESS: Option<OnSuccess> = None;

    /// Runs one attempt. Must be idempotent: at-least-once delivery may run it again.
    fn run(self, cx: TaskContext) -> impl Future<Output = Result<(), TaskError>> + Send;

    /// Shared data this task extracts from its context, checked at worker start-up.
    /// Written by `#[task]` for its `Data<T>` parameters; not meant to be implemented by hand.
    #[doc(hidden)]
    fn required_data() -> Vec<DataRequirement> {
        Vec::new()
    }

    /// A recurring schedule declared with the task: the workers that register it (and work its
    /// queue) enqueue the returned value at every tick. `None` (the default) declares none;
    /// `#[taskq::task(cron = "..")]` generates it for a task without payload parameters. To
    /// schedule a task with a payload, or several times, use
    /// [`WorkerBuilder::cron`](crate::worker::WorkerBuilder::cron) instead.
    fn schedule() -> Option<Schedule<Self>> {
        None
    }

    crate::__enqueue_options!([] links = "crate");

    /// Inserts the task on the caller's transaction or connection (never commits).
    fn enqueue_tx<C: AsConnection + ?Sized>(
        self,
        conn: &mut C,
    ) -> impl Future<Output = Result<Enqueued>> + Send {
        Enqueue::new(self).enqueue_tx(conn)
    }

    /// Inserts the task outside any caller transaction (autocommit on a pool connection of
    /// MySQL, or with the `sqlite` feature of SQLite).
    fn enqueue<DB: crate::backend::Backend>(
        self,
        pool: &sqlx::Pool<DB>,
    ) -> impl Future<Output = Result<Enqueued>> + Send {
        Enqueue::new(self).enqueue(pool)
    }
}

pub use taskq_driver::state::{TaskId, TaskState};
