//! Error types: [`Error`] for the library's own operations and [`TaskError`] for handlers.

use std::fmt;
use std::time::Duration;

use crate::task::{TaskId, TaskState};

/// Result alias for taskq operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything a taskq operation (enqueue, client call, migration, worker start) can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A queue or task name is empty, too long or contains control characters.
    #[error("invalid {what} {value:?}: {reason}")]
    InvalidName {
        /// Which name: `"queue"`, `"task name"` or `"idempotency key"`.
        what: &'static str,
        /// The offending value (truncated to 80 characters).
        value: String,
        /// Why it was rejected.
        reason: String,
    },
    /// The serialized payload is larger than the configured limit.
    #[error("payload of {size} bytes exceeds the limit of {limit} bytes")]
    PayloadTooLarge {
        /// Size of the serialized payload in bytes.
        size: usize,
        /// The configured limit in bytes.
        limit: usize,
    },
    /// The payload could not be serialized to JSON.
    #[error("payload does not serialize to JSON: {0}")]
    Serialize(#[source] serde_json::Error),
    /// A delay or run-at time is outside the accepted range.
    #[error("invalid schedule: {0}")]
    InvalidSchedule(String),
    /// An option such as `max_attempts` is out of range.
    #[error("invalid option: {0}")]
    InvalidOption(String),
    /// No task with this id exists (it may have been pruned by retention).
    #[error("task {0} not found")]
    NotFound(TaskId),
    /// The operation needs a task in another state (e.g. cancel on a running task).
    #[error("task {id} is {state}, expected {expected}")]
    WrongState {
        /// The task.
        id: TaskId,
        /// Its current state.
        state: TaskState,
        /// What the operation needed.
        expected: &'static str,
    },
    /// A dead unique task cannot be retried: another task holds its identity now (it was
    /// enqueued after this one died). The dead task is left as it was.
    #[error(
        "task {id} cannot be retried: its unique identity is held by task {holder}, enqueued since it died"
    )]
    UniqueHeld {
        /// The dead task.
        id: TaskId,
        /// The task that holds the identity.
        holder: TaskId,
    },
    /// Invalid worker configuration (zero concurrency, heartbeat not shorter than the lease...).
    #[error("invalid worker configuration: {0}")]
    Config(String),
    /// Two registered tasks use the same stable name.
    #[error("task name {name:?} is registered twice: by {first} and by {second}")]
    DuplicateTaskName {
        /// The clashing name.
        name: String,
        /// Rust type of the first registration.
        first: &'static str,
        /// Rust type of the second registration.
        second: &'static str,
    },
    /// A task needs application state that was not registered on the worker.
    #[error(
        "task {task:?} needs state of type {ty}, which was not registered on the worker (use WorkerBuilder::state)"
    )]
    MissingState {
        /// Task name.
        task: &'static str,
        /// Rust type name of the missing state.
        ty: &'static str,
    },
    /// A database error.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// Applying taskq's migrations failed.
    #[error("migration error: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
}

type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What a handler returns when it fails: the cause plus what the worker should do next.
///
/// Any `std::error::Error + Send + Sync + 'static` converts into a retryable `TaskError`, so `?`
/// works with your own error types. Use [`TaskError::permanent`] for failures that retrying
/// cannot fix (the task goes straight to `dead`) and [`TaskError::retry_after`] to choose the
/// delay before the next attempt.
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
    /// The error and its source chain as one line, as stored in `last_error`.
    pub fn to_chain_string(&self) -> String {
        let mut out = self.source.to_string();
        let mut cur = self.source.source();
        while let Some(e) = cur {
            out.push_str(": ");
            out.push_str(&e.to_string());
            cur = e.source();
        }
        out
    }
}

impl fmt::Debug for TaskError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TaskError")
            .field("kind", &self.kind)
            .field("source", &self.source)
            .finish()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn question_mark_converts_user_errors_to_retry() {
        fn f() -> Result<(), TaskError> {
            "x".parse::<i32>()?;
            Ok(())
        }
        let e = f().unwrap_err();
        assert_eq!(e.kind(), TaskErrorKind::Retry);
        assert_eq!(e.to_string(), "invalid digit found in string");
    }

    #[test]
    fn permanent_and_retry_after_are_kept() {
        let e = "x".parse::<i32>().permanent().unwrap_err();
        assert_eq!(e.kind(), TaskErrorKind::Permanent);
        let e = "x"
            .parse::<i32>()
            .retry_after(Duration::from_secs(3))
            .unwrap_err();
        assert_eq!(e.kind(), TaskErrorKind::RetryAfter(Duration::from_secs(3)));
        assert_eq!(TaskError::msg("boom").to_string(), "boom");
    }
}
