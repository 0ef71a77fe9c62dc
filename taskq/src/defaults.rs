//! Defaults and limits: the values taskq uses when a task or worker does not say otherwise,
//! and the bounds it checks input against (enqueue options, names, schedules, queue limits,
//! attempt history). Every bound is checked before anything is written: a value past one is a
//! typed [`Error`], never a truncated row.

use std::time::Duration;

use crate::error::{Error, Result};

pub use crate::history::{
    DEFAULT_ACTOR, MAX_ACTOR_LEN, MAX_ATTEMPT_ENTRIES, MAX_ATTEMPT_ERROR_CHARS,
};
pub use crate::trace::MAX_TRACE_CONTEXT_LEN;

/// Longest queue name, in bytes (the column is `VARCHAR(64)`).
pub const MAX_QUEUE_LEN: usize = 64;
/// Longest task name or idempotency key, in bytes.
pub const MAX_NAME_LEN: usize = 255;
/// Longest accepted delay, and how far in the future `run_at` may be: 10 years.
pub const MAX_DELAY: Duration = Duration::from_secs(10 * 366 * 24 * 3600);
/// Default payload size limit: 1 MiB of JSON.
pub const DEFAULT_PAYLOAD_LIMIT: usize = 1 << 20;

/// Default limit of a task's output: 64 KiB of JSON
/// ([`WorkerBuilder::output_limit`](crate::worker::WorkerBuilder::output_limit)).
pub const DEFAULT_OUTPUT_LIMIT: usize = 64 << 10;
/// Largest output limit a worker accepts: 1 MiB of JSON (the column holds 16 MiB; a
/// write-back batch carries many outcomes in one statement).
pub const MAX_OUTPUT_LIMIT: usize = 1 << 20;

/// Default number of attempts (first run included) before a failing task goes to `dead`.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 20;
/// Default queue name.
pub const DEFAULT_QUEUE: &str = "default";
/// Default number of snoozes (`TaskError::snooze`) that do not count as an attempt; see
/// [`Task::MAX_SNOOZES`](crate::Task::MAX_SNOOZES).
pub const DEFAULT_MAX_SNOOZES: u32 = 100;

/// Longest schedule name, in bytes (the tick's idempotency key `cron:<name>:<tick>` must fit
/// in [`MAX_NAME_LEN`]).
pub const MAX_SCHEDULE_NAME_LEN: usize = 200;
/// Longest cron expression, in bytes.
pub const MAX_EXPRESSION_LEN: usize = taskq_grammar::cron::MAX_EXPRESSION_LEN;

/// How late a tick may be reached and still count as on time. When the oldest tick a worker
/// finds due is later than this (no worker ran the schedule for a while), the due ticks are
/// *missed* and the schedule's [`MissedTicks`](crate::task::schedule::MissedTicks) policy decides which of them run; otherwise
/// every due tick runs (a worker that fell a few seconds behind catches up).
pub const MISSED_TICK_GRACE: Duration = Duration::from_secs(60);

/// Most ticks enqueued for one schedule in one step (bounds [`MissedTicks::All`](crate::task::schedule::MissedTicks::All)).
pub const MAX_CATCH_UP_TICKS: u32 = taskq_grammar::missed::MAX_CATCH_UP_TICKS;

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

/// Checks the size of a task's output (its JSON, `bytes` long) against a worker's limit: the
/// rule of [`OutputError::TooLarge`](crate::OutputError::TooLarge).
pub(crate) fn check_output(
    bytes: usize,
    limit: usize,
) -> std::result::Result<(), crate::OutputError> {
    if bytes > limit {
        return Err(crate::OutputError::TooLarge { bytes, limit });
    }
    Ok(())
}

/// Checks a queue name, task name or idempotency key.
pub(crate) fn validate_name(what: &'static str, value: &str, max: usize) -> Result<()> {
    let reason = if value.is_empty() {
        Some("must not be empty".to_owned())
    } else if value.len() > max {
        Some(format!("is {} bytes long, the limit is {max}", value.len()))
    } else if value.chars().any(char::is_control) {
        Some("must not contain control characters".to_owned())
    } else if value.trim() != value {
        Some("must not start or end with whitespace".to_owned())
    } else {
        None
    };
    match reason {
        None => Ok(()),
        Some(reason) => Err(Error::InvalidName {
            what,
            value: value.chars().take(80).collect(),
            reason,
        }),
    }
}
