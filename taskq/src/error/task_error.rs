//! [`TaskError`]: what a handler returns when it fails, and [`ResultExt`] to say how.

use std::fmt;
use std::time::Duration;

use super::report::chain_messages;

pub(super) type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What a handler returns when it fails: the cause plus what the worker should do next.
///
/// Any `std::error::Error + Send + Sync + 'static` converts into a retryable `TaskError`, so `?`
/// works with your own error types. Use [`TaskError::permanent`] for failures that retrying
/// cannot fix (the task goes straight to `dead`) and [`TaskError::retry_after`] to choose the
/// delay before the next attempt. [`TaskError::snooze`] is not a failure: the task runs again
/// later without the attempt being counted.
///
/// `TaskError` deliberately does not implement `std::error::Error` (like `anyhow::Error`), which
/// is what makes the blanket `From` possible.
pub struct TaskError {
    kind: TaskErrorKind,
    source: BoxError,
}

/// How the worker treats a [`TaskError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TaskErrorKind {
    /// Retry with the task's backoff, until attempts are exhausted.
    Retry,
    /// Retry after exactly this delay (still bounded by max attempts).
    RetryAfter(Duration),
    /// Do not retry: the task goes to `dead` with this error.
    Permanent,
    /// Not a failure: run again after this delay, without counting the attempt (up to the
    /// task's [`MAX_SNOOZES`](crate::Task::MAX_SNOOZES); see [`TaskError::snooze`]).
    Snooze(Duration),
}

#[derive(Debug)]
struct Message(String);
impl fmt::Display for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for Message {}

impl TaskError {
    fn new(kind: TaskErrorKind, source: impl Into<BoxError>) -> Self {
        Self {
            kind,
            source: source.into(),
        }
    }
    /// A failure worth retrying with the task's backoff.
    pub fn retry(source: impl Into<BoxError>) -> Self {
        Self::new(TaskErrorKind::Retry, source)
    }
    /// A failure retrying cannot fix: the task goes to `dead` with this error.
    pub fn permanent(source: impl Into<BoxError>) -> Self {
        Self::new(TaskErrorKind::Permanent, source)
    }
    /// Retry after `delay` instead of the backoff (counts as an attempt).
    pub fn retry_after(delay: Duration, source: impl Into<BoxError>) -> Self {
        Self::new(TaskErrorKind::RetryAfter(delay), source)
    }
    /// Not a failure: asks to run the task again after `delay` **without counting this
    /// attempt** (the task goes back to `pending` with `run_at = now + delay` on the database
    /// clock, `attempt` unchanged, `snoozes` + 1, `last_error` untouched). For a handler that
    /// finds it is too early (a resource not ready yet, a rate limit of its own), unlike
    /// [`TaskError::retry_after`], which records a failure and uses up an attempt.
    ///
    /// Bounded: once the task has snoozed [`Task::MAX_SNOOZES`](crate::Task::MAX_SNOOZES)
    /// times (default 100), a further snooze counts as a failed attempt (retried after
    /// `delay`, `dead` when attempts are exhausted), with the reason in `last_error`. The delay
    /// is clamped to [`MAX_DELAY`](crate::defaults::MAX_DELAY).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use taskq::TaskError;
    /// # fn report_ready() -> bool { false }
    /// fn handler_body() -> Result<(), TaskError> {
    ///     if !report_ready() {
    ///         return Err(TaskError::snooze(Duration::from_secs(30)));
    ///     }
    ///     Ok(())
    /// }
    /// # assert!(handler_body().is_err());
    /// ```
    pub fn snooze(delay: Duration) -> Self {
        Self::new(
            TaskErrorKind::Snooze(delay),
            Message(format!("snoozed for {delay:?}")),
        )
    }
    /// A retryable error from a plain message.
    pub fn msg(message: impl fmt::Display) -> Self {
        Self::retry(Message(message.to_string()))
    }
    /// What the worker will do with this error.
    pub fn kind(&self) -> TaskErrorKind {
        self.kind
    }
    /// The underlying error.
    pub fn source(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.source
    }
    /// The error and its source chain as one line, as stored in `last_error`: the messages
    /// joined by `": "`, each piece of text once (a source whose message the text already
    /// contains, as with `sqlx::Error` and most wrappers, is not repeated).
    pub fn to_chain_string(&self) -> String {
        chain_messages(self.source.to_string(), self.source.source()).join(": ")
    }
}

/// `{:?}` is what [`TaskError::kind`] the worker sees and the one-line chain
/// (`permanent: invalid digit found in string`); `{:#?}` the structure.
impl fmt::Debug for TaskError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if f.alternate() {
            return f
                .debug_struct("TaskError")
                .field("kind", &self.kind)
                .field("source", &self.source)
                .finish();
        }
        match self.kind {
            TaskErrorKind::Retry => f.write_str("retry: ")?,
            TaskErrorKind::RetryAfter(d) => write!(f, "retry after {d:?}: ")?,
            TaskErrorKind::Permanent => f.write_str("permanent: ")?,
            TaskErrorKind::Snooze(d) => write!(f, "snooze {d:?}: ")?,
        }
        f.write_str(&self.to_chain_string())
    }
}

impl fmt::Display for TaskError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_chain_string())
    }
}

impl<E: std::error::Error + Send + Sync + 'static> From<E> for TaskError {
    fn from(e: E) -> Self {
        Self::retry(e)
    }
}

/// Marks the error of a `Result` as permanent or as retry-after, for use with `?`.
///
/// ```
/// use taskq::{ResultExt, TaskError};
/// fn parse(s: &str) -> Result<i64, TaskError> {
///     let n = s.parse::<i64>().permanent()?; // bad input never gets better
///     Ok(n)
/// }
/// assert!(parse("x").is_err());
/// ```
pub trait ResultExt<T> {
    /// Turns the error into a permanent [`TaskError`].
    fn permanent(self) -> Result<T, TaskError>;
    /// Turns the error into a [`TaskError`] that retries after `delay`.
    fn retry_after(self, delay: Duration) -> Result<T, TaskError>;
}

impl<T, E: Into<BoxError>> ResultExt<T> for std::result::Result<T, E> {
    fn permanent(self) -> Result<T, TaskError> {
        self.map_err(TaskError::permanent)
    }
    fn retry_after(self, delay: Duration) -> Result<T, TaskError> {
        self.map_err(|e| TaskError::retry_after(delay, e))
    }
}
