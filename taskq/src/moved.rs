//! The crate-root paths of items that moved into modules in 0.2 (commit e08aeb4: the crate
//! root holds what a first program names). Each old path still compiles for one release and
//! warns with the new path; they are removed in 0.3. See CHANGELOG.md, "0.2.0".
//!
//! Types are deprecated type aliases and functions deprecated wrappers, so using the old path
//! warns. The three traits (`AsConnection`, `FromTaskContext`, `IntoEnqueue`) are plain hidden
//! re-exports: rustc ignores `#[deprecated]` on a `use` (rust-lang/rust#30827) and a trait
//! cannot be aliased on stable, so their old paths compile without a warning.

#![allow(deprecated)]

use crate::{Result, enqueue, schedule};

/// Moved: [`taskq::context::CancelReason`](crate::context::CancelReason).
#[deprecated(since = "0.2.0", note = "use taskq::context::CancelReason")]
pub type CancelReason = crate::context::CancelReason;

/// Moved: [`taskq::context::DataMap`](crate::context::DataMap).
#[deprecated(since = "0.2.0", note = "use taskq::context::DataMap")]
pub type DataMap = crate::context::DataMap;

/// Moved: [`taskq::error::TaskErrorKind`](crate::error::TaskErrorKind).
#[deprecated(since = "0.2.0", note = "use taskq::error::TaskErrorKind")]
pub type TaskErrorKind = crate::error::TaskErrorKind;

/// Moved: [`taskq::followup::FollowUp`](crate::followup::FollowUp).
#[deprecated(since = "0.2.0", note = "use taskq::followup::FollowUp")]
pub type FollowUp = crate::followup::FollowUp;

/// Moved: [`taskq::followup::OnDead`](crate::followup::OnDead).
#[deprecated(since = "0.2.0", note = "use taskq::followup::OnDead")]
pub type OnDead = crate::followup::OnDead;

/// Moved: [`taskq::followup::OnSuccess`](crate::followup::OnSuccess).
#[deprecated(since = "0.2.0", note = "use taskq::followup::OnSuccess")]
pub type OnSuccess = crate::followup::OnSuccess;

/// Moved: [`taskq::schedule::MissedTicks`](crate::schedule::MissedTicks).
#[deprecated(since = "0.2.0", note = "use taskq::schedule::MissedTicks")]
pub type MissedTicks = schedule::MissedTicks;

/// Moved: [`taskq::schedule::Schedule`](crate::schedule::Schedule).
#[deprecated(since = "0.2.0", note = "use taskq::schedule::Schedule")]
pub type Schedule<T> = schedule::Schedule<T>;

/// Moved: [`taskq::client::ParseStateError`](crate::client::ParseStateError).
#[deprecated(since = "0.2.0", note = "use taskq::client::ParseStateError")]
pub type ParseStateError = crate::client::ParseStateError;

/// Moved: [`taskq::unique::Unique`](crate::unique::Unique).
#[deprecated(since = "0.2.0", note = "use taskq::unique::Unique")]
pub type Unique = crate::unique::Unique;

/// Moved: [`taskq::unique::UniqueBy`](crate::unique::UniqueBy).
#[deprecated(since = "0.2.0", note = "use taskq::unique::UniqueBy")]
pub type UniqueBy = crate::unique::UniqueBy;

/// Moved: [`taskq::unique::UniqueHold`](crate::unique::UniqueHold).
#[deprecated(since = "0.2.0", note = "use taskq::unique::UniqueHold")]
pub type UniqueHold = crate::unique::UniqueHold;

/// Moved: [`taskq::worker::WorkerBuilder`](crate::worker::WorkerBuilder).
#[deprecated(since = "0.2.0", note = "use taskq::worker::WorkerBuilder")]
pub type WorkerBuilder = crate::worker::WorkerBuilder;

/// Moved: [`taskq::migrate::MIGRATIONS_TABLE`](crate::migrate::MIGRATIONS_TABLE).
#[deprecated(since = "0.2.0", note = "use taskq::migrate::MIGRATIONS_TABLE")]
pub const MIGRATIONS_TABLE: &str = crate::migrate::MIGRATIONS_TABLE;

/// Moved: [`taskq::migrate::migrator`](crate::migrate::migrator).
#[deprecated(since = "0.2.0", note = "use taskq::migrate::migrator")]
pub fn migrator() -> sqlx::migrate::Migrator {
    crate::migrate::migrator()
}

/// Moved: [`taskq::schedule::schedule_tick_key`](crate::schedule::schedule_tick_key).
#[deprecated(since = "0.2.0", note = "use taskq::schedule::schedule_tick_key")]
pub fn schedule_tick_key(schedule: &str, tick: chrono::DateTime<chrono::Utc>) -> String {
    schedule::schedule_tick_key(schedule, tick)
}

/// Moved: [`taskq::worker::notify`](crate::worker::notify).
#[deprecated(since = "0.2.0", note = "use taskq::worker::notify")]
pub fn notify(queue: &str) {
    crate::worker::notify(queue)
}

/// Moved: [`taskq::enqueue::enqueue_many`](crate::enqueue::enqueue_many).
#[deprecated(since = "0.2.0", note = "use taskq::enqueue::enqueue_many")]
pub async fn enqueue_many<C, I>(conn: &mut C, tasks: I) -> Result<Vec<crate::Enqueued>>
where
    C: enqueue::AsConnection + ?Sized,
    I: IntoIterator,
    I::Item: enqueue::IntoEnqueue,
{
    enqueue::enqueue_many(conn, tasks).await
}

#[doc(hidden)]
pub use crate::context::FromTaskContext;
#[doc(hidden)]
pub use enqueue::{AsConnection, IntoEnqueue};
