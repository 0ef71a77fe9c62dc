//! Opening a pool on a database URL with errors a newcomer can act on: a server that is not
//! running, a wrong password or a missing database each get a sentence that says what to check,
//! instead of sqlx's `Io(Os { code: 111, .. })`. The connecting is the MySQL driver's
//! (`taskq_mysql::connect`); here its failures become taskq's errors.

use sqlx::MySqlPool;
use taskq_mysql::connect::ConnectError;

use crate::error::{Error, Result, connect_problem};

/// The error users see of a failure of the driver's connect: [`Error::Config`] for a wrong
/// URL; [`Error::Connect`] when the server could not be reached or refused the session (with
/// the advice), else the database error.
fn failed(e: ConnectError) -> Error {
    match e {
        ConnectError::Url(m) => Error::Config(m),
        ConnectError::Failed { target, source } if connect_problem(&source).is_some() => {
            Error::Connect { target, source }
        }
        ConnectError::Failed { source, .. } | ConnectError::Statement(source) => {
            Error::Database(source)
        }
    }
}

/// Opens a connection pool on the MySQL / MariaDB database at `url`
/// (`mysql://user:password@host:3306/database`), checking that it answers.
///
/// The same as `MySqlPool::connect(url)`, with errors that say what to do: an invalid URL is
/// [`Error::Config`]; a server that is not running or not reachable, a wrong password or an
/// unknown database is [`Error::Connect`] (for example "cannot connect to the database at
/// 127.0.0.1:3306 (connection refused): is the server running, and are the host and port in the
/// database URL right?"). Waits at most 10 s for the server's first answer.
///
/// ```no_run
/// # async fn f() -> taskq::Result<()> {
/// let pool = taskq::connect("mysql://root@127.0.0.1:3306/app").await?;
/// taskq::migrate(&pool).await?;
/// # Ok(()) }
/// ```
pub async fn connect(url: &str) -> Result<MySqlPool> {
    taskq_mysql::connect::connect(url).await.map_err(failed)
}

/// Creates the database named at the end of `url` if it does not exist yet (the user needs the
/// `CREATE` privilege); returns whether it created it. For examples, tests and first runs —
/// production databases are usually created by whoever provisions the server. Errors read like
/// [`connect`]'s.
///
/// ```no_run
/// # async fn f() -> taskq::Result<()> {
/// let url = "mysql://root@127.0.0.1:3306/taskq_getting_started";
/// taskq::create_database(url).await?;
/// let pool = taskq::connect(url).await?;
/// # Ok(()) }
/// ```
pub async fn create_database(url: &str) -> Result<bool> {
    taskq_mysql::connect::create_database(url)
        .await
        .map_err(failed)
}
