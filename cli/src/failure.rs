//! Failures: the exit codes and the message printed on stderr, and how taskq's errors map
//! to them.

/// Exit code: anything else failed (e.g. a query error).
pub const EXIT_OTHER: u8 = 1;
/// Exit code: bad input, including no database URL (clap's usage errors use the same code).
pub const EXIT_USAGE: u8 = 2;
/// Exit code: the task does not exist or is in the wrong state for the operation.
pub const EXIT_TASK: u8 = 3;
/// Exit code: the database cannot be reached.
pub const EXIT_UNREACHABLE: u8 = 4;

/// A failure with its exit code and the message printed on stderr.
#[derive(Debug)]
pub struct Failure {
    pub code: u8,
    pub message: String,
}

impl Failure {
    pub fn new(code: u8, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

impl From<taskq::Error> for Failure {
    /// The message is the error's `Display` alone: taskq's errors already include their cause
    /// (`database error: 1146 (42S02): …`), so printing the source chain too would repeat it.
    fn from(e: taskq::Error) -> Self {
        let code = match &e {
            taskq::Error::NotFound(_)
            | taskq::Error::WorkflowNotFound(_)
            | taskq::Error::BatchNotFound(_)
            | taskq::Error::BatchEnded(_)
            | taskq::Error::WrongState { .. }
            | taskq::Error::UniqueHeld { .. } => EXIT_TASK,
            taskq::Error::InvalidName { .. }
            | taskq::Error::InvalidOption(_)
            | taskq::Error::InvalidSchedule(_) => EXIT_USAGE,
            taskq::Error::Connect { .. } | taskq::Error::Open { .. } | taskq::Error::Timeout(_) => {
                EXIT_UNREACHABLE
            }
            taskq::Error::Database(db) if is_connection_error(db) => EXIT_UNREACHABLE,
            _ => EXIT_OTHER,
        };
        Self::new(code, e.to_string())
    }
}

/// Errors that mean the server could not be reached (as opposed to a failing statement).
fn is_connection_error(e: &sqlx::Error) -> bool {
    matches!(
        e,
        sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed
    )
}
