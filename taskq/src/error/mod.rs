//! Error types: [`Error`] for the library's own operations and [`TaskError`] for handlers.

use std::fmt;
use std::time::Duration;

use taskq_driver::state::{TaskId, TaskState};

mod diagnose;
mod output;
mod report;
mod retry;
mod task_error;

pub(crate) use diagnose::connect_problem;
use diagnose::*;
pub use output::OutputError;
pub(crate) use report::short_type_name;
use report::*;
pub use task_error::{ResultExt, TaskError, TaskErrorKind};

/// Result alias for taskq operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything a taskq operation (enqueue, client call, migration, worker start) can fail with.
///
/// `Display` is one sentence that includes the cause, and `Debug` (what `main` prints when it
/// returns `Err` through `?`) is the same sentence followed by a `Caused by:` list of the
/// underlying errors whose text it does not already contain. `{:#?}` gives the structure
/// (variant and fields) instead. Rust type names are shown the way code writes them
/// (`Pool<MySql>`, not `sqlx_core::pool::Pool<sqlx_mysql::database::MySql>`); the fields keep
/// the full names.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A queue or task name (or an inbox's consumer name or message id) is empty, too long or
    /// contains control characters.
    #[error("invalid {what} {value:?}: {reason}")]
    InvalidName {
        /// Which name: `"queue"`, `"task name"`, `"idempotency key"`, `"inbox consumer"` or
        /// `"message id"`.
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
    /// No task with this name is registered in this binary ([`registration`](crate::registry::registration)).
    #[error("no task named {0:?} is registered in this binary")]
    UnknownTask(String),
    /// A JSON payload does not decode into the named task's payload type
    /// ([`Registration::enqueue_json`](crate::registry::Registration::enqueue_json)).
    #[error("payload does not decode as task {name:?}: {source}")]
    InvalidPayload {
        /// The task name.
        name: String,
        /// serde's error (what is missing or mistyped, and where).
        #[source]
        source: serde_json::Error,
    },
    /// A delay or run-at time is outside the accepted range.
    #[error("invalid schedule: {0}")]
    InvalidSchedule(String),
    /// A recurring schedule is invalid: a cron expression that does not parse or never fires,
    /// an unknown time zone, an option the scheduler sets itself, a duplicate schedule name.
    #[error("invalid schedule {schedule:?}: {reason}")]
    InvalidCron {
        /// The schedule's name.
        schedule: String,
        /// What is wrong with it.
        reason: String,
    },
    /// An option such as `max_attempts` is out of range.
    #[error("invalid option: {0}")]
    InvalidOption(String),
    /// No task with this id exists (it may have been pruned by retention).
    #[error("task {0} not found")]
    NotFound(TaskId),
    /// A workflow's graph is refused (no step, a name twice, a dependency on no step, a
    /// cycle); nothing of it was written.
    #[error("invalid workflow: {0}")]
    Workflow(#[from] taskq_driver::rules::workflow::GraphError),
    /// A wait ([`Client::wait`](crate::Client::wait),
    /// [`Client::wait_workflow`](crate::Client::wait_workflow)) ended before the task or
    /// workflow did; it goes on regardless.
    #[error("waited {0:?} and it has not ended")]
    WaitTimedOut(std::time::Duration),
    /// A task's stored output does not decode as the type asked for
    /// ([`Client::wait_output`](crate::Client::wait_output)).
    #[error("the output of task {id} does not decode as {ty}: {source}")]
    InvalidOutput {
        /// The task.
        id: TaskId,
        /// The type asked for.
        ty: &'static str,
        /// serde's error.
        #[source]
        source: serde_json::Error,
    },
    /// No workflow with this id exists (it may have been pruned by retention).
    #[error("workflow {0} not found")]
    WorkflowNotFound(taskq_driver::rules::workflow::WorkflowId),
    /// No batch with this id exists (it may have been pruned by retention).
    #[error("batch {0} not found")]
    BatchNotFound(taskq_driver::rules::batch::BatchId),
    /// Members cannot be added to the batch, nor can it be sealed: every member had ended
    /// (its `on_complete` was released) or an operator canceled it. Nothing was written.
    #[error("batch {0} has ended (completed or canceled): nothing can be added to it")]
    BatchEnded(taskq_driver::rules::batch::BatchId),
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
    /// On SQLite, the worker's lease leaves a renewal too little time to get the write lock:
    /// a renewal waits for it in tries of [`busy_timeout`](Self::LeaseBelowBusyTimeout) (the
    /// worker's renewal connection's, 100 ms) until the watchdog's cancel point, and
    /// `lease − heartbeat − min(cancel grace, lease / 2)` must leave at least two tries (or the
    /// pool's busy timeout, if shorter). The pool's busy timeout no longer bounds the lease (see docs/semantics.md, "Leases under
    /// write-lock contention").
    #[error(
        "lease of {lease:?} is too short for lease renewals on SQLite: a renewal waits for the write lock in tries of {busy_timeout:?} until its lease's cancel point, and this lease leaves it {tolerated:?} (lease {lease:?} − heartbeat {heartbeat:?} − min(cancel grace {cancel_grace:?}, lease / 2)), less than two tries (or the pool's busy timeout, if shorter); use a lease of at least {min_lease:?} (with the default heartbeat, a third of it), or a shorter heartbeat or cancel grace. A lease survives the write lock held by another connection for up to that margin, whatever the pool's busy timeout"
    )]
    LeaseBelowBusyTimeout {
        /// The worker's lease.
        lease: Duration,
        /// Its heartbeat interval.
        heartbeat: Duration,
        /// Its cancel grace.
        cancel_grace: Duration,
        /// How long one try of a renewal waits for the write lock (the busy timeout of the
        /// worker's renewal connection, 100 ms; before issue 34, the pool's busy timeout).
        busy_timeout: Duration,
        /// How long a renewal may be held off without losing a lease:
        /// `lease − heartbeat − min(cancel grace, lease / 2)`.
        tolerated: Duration,
        /// The shortest lease that leaves two tries with a heartbeat of a third of it and
        /// this cancel grace.
        min_lease: Duration,
    },
    /// Two registered tasks use the same stable name.
    ///
    /// The message names both types by their last path segment, or by their full paths when
    /// those segments are equal.
    #[error("task name {name:?} is registered twice: by {} and by {}", type_pair(first, second).0, type_pair(first, second).1)]
    DuplicateTaskName {
        /// The clashing name.
        name: String,
        /// Rust type of the first registration (full path, from `std::any::type_name`).
        first: &'static str,
        /// Rust type of the second registration (full path, from `std::any::type_name`).
        second: &'static str,
    },
    /// A task takes [`Data<T>`](crate::Data) of a type that was not registered on the worker.
    #[error(
        "task {task:?} needs data of type {}, which was not registered: call WorkerBuilder::data with a value of that type before build",
        short_type_name(ty)
    )]
    MissingData {
        /// Task name.
        task: &'static str,
        /// Rust type name of the missing data (full path, from `std::any::type_name`).
        ty: &'static str,
    },
    /// The database server at `target` could not be reached or refused the session: connection
    /// refused, unknown host, no answer, TLS failure, access denied, unknown database, too many
    /// connections. The message says which, and what to check.
    ///
    /// Returned by [`migrate`](crate::migrate()) and the [`Client`](crate::Client) methods, which
    /// know the pool's address; when a pool only reports a timeout they open one direct
    /// connection (bounded by 5 s) to find the cause.
    #[error("{}", connect_sentence(Some(target.as_str()), source))]
    Connect {
        /// Where the connection went: `host:port`, or the Unix socket path.
        target: String,
        /// The error from sqlx (the underlying cause).
        source: sqlx::Error,
    },
    /// A SQLite database file could not be opened or created (feature `sqlite`): the path and
    /// what to check.
    #[error(
        "cannot open the SQLite database {path}: {source}: does its directory exist, and may this process read and write there?"
    )]
    Open {
        /// The file.
        path: String,
        /// The error from sqlx.
        source: sqlx::Error,
    },
    /// A database error. Connection failures read like [`Error::Connect`] without the address;
    /// a missing taskq table says to run the migrations.
    #[error("{}", database_sentence(.0))]
    Database(#[from] sqlx::Error),
    /// Applying taskq's migrations failed.
    #[error("migration error: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// The database did not answer within the [`Client`](crate::Client)'s deadline
    /// ([`Client::with_timeout`](crate::Client::with_timeout), 30 s by default): the server or
    /// the network went silent. The statement was abandoned; a change it made may still have
    /// been committed.
    #[error(
        "the database did not answer within {0:?}; the statement was abandoned (is the server reachable?)"
    )]
    Timeout(std::time::Duration),
    /// [`migrate`](crate::migrate()) lost the migration lock while migrating (another migrator
    /// took its row, or no renewal got through before it expired), so another migrator may be
    /// running: it stopped before applying `version`. Migrations before it are applied; run
    /// `migrate` again (it waits for the lock and goes on from there).
    #[error(
        "the taskq migration lock was lost ({reason}): stopped before migration {version}, which was not applied; run taskq::migrate again"
    )]
    MigrationLockLost {
        /// The first migration not applied.
        version: i64,
        /// What the lock's owner found.
        reason: String,
    },
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if f.alternate() {
            return self.fmt_structure(f);
        }
        write_report(f, self)
    }
}

impl Error {
    /// The derived-`Debug`-like form, for `{:#?}`.
    fn fmt_structure(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidName {
                what,
                value,
                reason,
            } => f
                .debug_struct("InvalidName")
                .field("what", what)
                .field("value", value)
                .field("reason", reason)
                .finish(),
            Error::PayloadTooLarge { size, limit } => f
                .debug_struct("PayloadTooLarge")
                .field("size", size)
                .field("limit", limit)
                .finish(),
            Error::Serialize(e) => f.debug_tuple("Serialize").field(e).finish(),
            Error::UnknownTask(name) => f.debug_tuple("UnknownTask").field(name).finish(),
            Error::InvalidPayload { name, source } => f
                .debug_struct("InvalidPayload")
                .field("name", name)
                .field("source", source)
                .finish(),
            Error::InvalidSchedule(m) => f.debug_tuple("InvalidSchedule").field(m).finish(),
            Error::InvalidCron { schedule, reason } => f
                .debug_struct("InvalidCron")
                .field("schedule", schedule)
                .field("reason", reason)
                .finish(),
            Error::InvalidOption(m) => f.debug_tuple("InvalidOption").field(m).finish(),
            Error::NotFound(id) => f.debug_tuple("NotFound").field(id).finish(),
            Error::Workflow(e) => f.debug_tuple("Workflow").field(e).finish(),
            Error::WaitTimedOut(d) => f.debug_tuple("WaitTimedOut").field(d).finish(),
            Error::WorkflowNotFound(id) => f.debug_tuple("WorkflowNotFound").field(id).finish(),
            Error::BatchNotFound(id) => f.debug_tuple("BatchNotFound").field(id).finish(),
            Error::BatchEnded(id) => f.debug_tuple("BatchEnded").field(id).finish(),
            Error::InvalidOutput { id, ty, source } => f
                .debug_struct("InvalidOutput")
                .field("id", id)
                .field("ty", ty)
                .field("source", source)
                .finish(),
            Error::WrongState {
                id,
                state,
                expected,
            } => f
                .debug_struct("WrongState")
                .field("id", id)
                .field("state", state)
                .field("expected", expected)
                .finish(),
            Error::UniqueHeld { id, holder } => f
                .debug_struct("UniqueHeld")
                .field("id", id)
                .field("holder", holder)
                .finish(),
            Error::Config(m) => f.debug_tuple("Config").field(m).finish(),
            Error::LeaseBelowBusyTimeout {
                lease,
                heartbeat,
                cancel_grace,
                busy_timeout,
                tolerated,
                min_lease,
            } => f
                .debug_struct("LeaseBelowBusyTimeout")
                .field("lease", lease)
                .field("heartbeat", heartbeat)
                .field("cancel_grace", cancel_grace)
                .field("busy_timeout", busy_timeout)
                .field("tolerated", tolerated)
                .field("min_lease", min_lease)
                .finish(),
            Error::DuplicateTaskName {
                name,
                first,
                second,
            } => f
                .debug_struct("DuplicateTaskName")
                .field("name", name)
                .field("first", first)
                .field("second", second)
                .finish(),
            Error::MissingData { task, ty } => f
                .debug_struct("MissingData")
                .field("task", task)
                .field("ty", ty)
                .finish(),
            Error::Connect { target, source } => f
                .debug_struct("Connect")
                .field("target", target)
                .field("source", source)
                .finish(),
            Error::Open { path, source } => f
                .debug_struct("Open")
                .field("path", path)
                .field("source", source)
                .finish(),
            Error::Database(e) => f.debug_tuple("Database").field(e).finish(),
            Error::Migrate(e) => f.debug_tuple("Migrate").field(e).finish(),
            Error::Timeout(d) => f.debug_tuple("Timeout").field(d).finish(),
            Error::MigrationLockLost { version, reason } => f
                .debug_struct("MigrationLockLost")
                .field("version", version)
                .field("reason", reason)
                .finish(),
        }
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

    const POOL: &str = "sqlx_core::pool::Pool<sqlx_mysql::database::MySql>";

    #[test]
    fn type_names_lose_their_module_paths() {
        assert_eq!(short_type_name(POOL), "Pool<MySql>");
        assert_eq!(short_type_name("alloc::string::String"), "String");
        assert_eq!(short_type_name("u32"), "u32");
        assert_eq!(
            short_type_name("core::option::Option<alloc::vec::Vec<(u8, alloc::string::String)>>"),
            "Option<Vec<(u8, String)>>"
        );
        assert_eq!(short_type_name("&dyn core::fmt::Debug"), "&dyn Debug");
        assert_eq!(short_type_name("[my_app::Id; 4]"), "[Id; 4]");
        assert_eq!(
            short_type_name("<alloc::vec::Vec<u8> as core::iter::IntoIterator>::Item"),
            "<Vec<u8> as IntoIterator>::Item"
        );
        assert_eq!(short_type_name("my_app::main::{{closure}}"), "{{closure}}");
    }

    #[test]
    fn missing_data_reads_the_same_in_display_and_debug() {
        let e = Error::MissingData {
            task: "send_mail",
            ty: POOL,
        };
        let sentence = "task \"send_mail\" needs data of type Pool<MySql>, which was not \
            registered: call WorkerBuilder::data with a value of that type before build";
        assert_eq!(e.to_string(), sentence);
        assert_eq!(format!("{e:?}"), sentence);
        // `{:#?}` keeps the structure, with the full type name.
        let structure = format!("{e:#?}");
        assert!(structure.starts_with("MissingData {"), "{structure}");
        assert!(structure.contains(POOL), "{structure}");
    }

    #[test]
    fn duplicate_names_are_short_unless_that_makes_them_equal() {
        let e = Error::DuplicateTaskName {
            name: "send".into(),
            first: "app::mail::SendMail",
            second: "app::sms::SendSms",
        };
        assert_eq!(
            e.to_string(),
            "task name \"send\" is registered twice: by SendMail and by SendSms"
        );
        assert_eq!(format!("{e:?}"), e.to_string());
        let e = Error::DuplicateTaskName {
            name: "send".into(),
            first: "app::mail::Send",
            second: "app::sms::Send",
        };
        assert_eq!(
            e.to_string(),
            "task name \"send\" is registered twice: by app::mail::Send and by app::sms::Send"
        );
    }

    /// What sqlx reports for a closed port on Linux.
    fn refused() -> sqlx::Error {
        sqlx::Error::Io(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "Connection refused (os error 111)",
        ))
    }

    #[test]
    fn a_refused_connection_says_what_to_check() {
        let e = Error::Connect {
            target: "127.0.0.1:3306".into(),
            source: refused(),
        };
        let sentence = "cannot connect to the database at 127.0.0.1:3306 (connection refused): \
            is the server running, and are the host and port in the database URL right?";
        assert_eq!(e.to_string(), sentence);
        // Debug: the sentence, then sqlx's error once (its io::Error is part of its text).
        assert_eq!(
            format!("{e:?}"),
            format!(
                "{sentence}\n\nCaused by:\n    \
                 error communicating with database: Connection refused (os error 111)"
            )
        );
        let source = std::error::Error::source(&e).expect("the sqlx error is the source");
        assert!(matches!(
            source.downcast_ref::<sqlx::Error>(),
            Some(sqlx::Error::Io(_))
        ));
        assert!(format!("{e:#?}").starts_with("Connect {"));

        // Without a known address (e.g. from `enqueue(&pool)`): the same sentence.
        let e = Error::Database(refused());
        assert_eq!(
            e.to_string(),
            "cannot connect to the database (connection refused): is the server running, and \
             are the host and port in the database URL right?"
        );
        // Through `?` into `Box<dyn Error>`, which `main` prints with Debug.
        let boxed: Box<dyn std::error::Error> = e.into();
        assert!(format!("{boxed:?}").starts_with("cannot connect to the database ("));
    }

    #[test]
    fn a_pool_timeout_names_both_explanations() {
        let e = Error::Database(sqlx::Error::PoolTimedOut);
        let text = e.to_string();
        assert!(
            text.starts_with("timed out waiting for a database connection from the pool: either"),
            "{text}"
        );
        assert!(
            text.contains("is it running?") && text.contains("busy"),
            "{text}"
        );
        let e = Error::Connect {
            target: "db:3306".into(),
            source: sqlx::Error::PoolTimedOut,
        };
        assert!(
            e.to_string()
                .starts_with("cannot connect to the database at db:3306 (no answer): "),
            "{e}"
        );
    }

    #[test]
    fn other_database_errors_keep_sqlx_text_once() {
        let e = Error::Database(sqlx::Error::Protocol("bad packet".into()));
        assert_eq!(
            e.to_string(),
            "database error: encountered unexpected or invalid data: bad packet"
        );
        assert_eq!(format!("{e:?}"), e.to_string());
    }

    /// An error whose `Display` includes its source, like `sqlx::Error` and `anyhow`'s context.
    #[derive(Debug)]
    struct Including(std::num::ParseIntError);
    impl fmt::Display for Including {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "bad count: {}", self.0)
        }
    }
    impl std::error::Error for Including {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    /// An error whose `Display` leaves its source out.
    #[derive(Debug)]
    struct Excluding(std::num::ParseIntError);
    impl fmt::Display for Excluding {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("bad count")
        }
    }
    impl std::error::Error for Excluding {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn chains_show_each_message_once() {
        let parse = || "x".parse::<u32>().unwrap_err();
        let e = TaskError::from(Including(parse()));
        assert_eq!(
            e.to_chain_string(),
            "bad count: invalid digit found in string"
        );
        let e = TaskError::from(Excluding(parse()));
        assert_eq!(
            e.to_chain_string(),
            "bad count: invalid digit found in string"
        );
        // sqlx's own wrapper: its text already contains the io error.
        let e = TaskError::permanent(refused());
        assert_eq!(
            e.to_chain_string(),
            "error communicating with database: Connection refused (os error 111)"
        );
        assert_eq!(
            format!("{e:?}"),
            "permanent: error communicating with database: Connection refused (os error 111)"
        );
        let e = TaskError::retry_after(Duration::from_secs(3), Excluding(parse()));
        assert_eq!(
            format!("{e:?}"),
            "retry after 3s: bad count: invalid digit found in string"
        );
        assert!(format!("{e:#?}").starts_with("TaskError {"));
    }

    #[test]
    fn snooze_carries_its_delay() {
        let e = TaskError::snooze(Duration::from_millis(1500));
        assert_eq!(e.kind(), TaskErrorKind::Snooze(Duration::from_millis(1500)));
        assert_eq!(e.to_string(), "snoozed for 1.5s");
    }
}
