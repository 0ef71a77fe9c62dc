//! Defaults and limits: the values taskq uses when a task or worker does not say otherwise,
//! and the bounds it checks input against (enqueue options, names, schedules, queue limits,
//! attempt history). Every bound is checked before anything is written: a value past one is a
//! typed [`Error`](crate::Error), never a truncated row.

use std::time::Duration;

pub use crate::enqueue::{DEFAULT_PAYLOAD_LIMIT, MAX_DELAY, MAX_NAME_LEN, MAX_QUEUE_LEN};
pub use crate::history::{
    DEFAULT_ACTOR, MAX_ACTOR_LEN, MAX_ATTEMPT_ENTRIES, MAX_ATTEMPT_ERROR_CHARS,
};
pub use crate::schedule::{
    MAX_CATCH_UP_TICKS, MAX_EXPRESSION_LEN, MAX_SCHEDULE_NAME_LEN, MISSED_TICK_GRACE,
};
pub use crate::task::{DEFAULT_MAX_ATTEMPTS, DEFAULT_MAX_SNOOZES, DEFAULT_QUEUE};
pub use crate::trace::MAX_TRACE_CONTEXT_LEN;

/// Largest concurrency limit, and largest number of starts per period of a rate limit, a
/// queue can have ([`Client::set_queue_limit`](crate::Client::set_queue_limit), [`Client::set_queue_rate_limit`](crate::Client::set_queue_rate_limit)).
pub const MAX_QUEUE_LIMIT: u32 = 1_000_000;
/// Shortest period of a queue's rate limit.
pub const MIN_RATE_PERIOD: Duration = Duration::from_millis(1);
/// Longest period of a queue's rate limit (366 days).
pub const MAX_RATE_PERIOD: Duration = Duration::from_secs(366 * 86_400);

/// Rows of `taskq_workers` not seen for this long (stopped, or gone without a goodbye) are
/// deleted by any worker's maintenance (at the retention interval).
pub const WORKER_ROW_RETENTION: Duration = Duration::from_secs(86_400);
