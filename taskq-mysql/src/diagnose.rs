//! The MySQL / MariaDB error numbers of a session the server refused, and what to check for
//! each: the driver's half of taskq's connection diagnosis (taskq writes the sentences); and
//! which errors a caller cures by running its transaction again (`taskq::Error::is_retryable`).

/// MySQL / MariaDB error numbers of failures while opening a session.
pub(crate) mod er {
    /// Too many connections.
    pub const CON_COUNT: u16 = 1040;
    /// Access denied for user to database.
    pub const DBACCESS_DENIED: u16 = 1044;
    /// Access denied for user (wrong user or password).
    pub const ACCESS_DENIED: u16 = 1045;
    /// Unknown database.
    pub const BAD_DB: u16 = 1049;
    /// Access denied, no password given (MariaDB's unix_socket authentication for root).
    pub const ACCESS_DENIED_NO_PASSWORD: u16 = 1698;
    /// Table doesn't exist.
    pub const NO_SUCH_TABLE: u16 = 1146;
    /// Lock wait timeout exceeded (`innodb_lock_wait_timeout`).
    pub const LOCK_WAIT_TIMEOUT: u16 = 1205;
    /// Deadlock found when trying to get lock (on Galera also a failed certification).
    pub const LOCK_DEADLOCK: u16 = 1213;
    /// Unknown command: what a Galera node answers while it is not ready (`WSREP has not yet
    /// prepared node for application use`).
    pub const UNKNOWN_COM: u16 = 1047;
    /// Server shutdown in progress.
    pub const SERVER_SHUTDOWN: u16 = 1053;
    /// Connection was killed (MariaDB).
    pub const CONNECTION_KILLED: u16 = 1927;
    /// MySQL server has gone away (client side).
    pub const SERVER_GONE: u16 = 2006;
    /// Lost connection to MySQL server during query (client side).
    pub const SERVER_LOST: u16 = 2013;
}

/// The MySQL error number of a database error, if it is one.
pub fn error_number(e: &sqlx::Error) -> Option<u16> {
    match e {
        sqlx::Error::Database(db) => db
            .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
            .map(|m| m.number()),
        _ => None,
    }
}

/// For a MySQL error that means the server refused the session (wrong user or password, no
/// access to the database, an unknown database, too many connections): what to check. `None`
/// for any other error.
pub fn refusal_advice(e: &sqlx::Error) -> Option<&'static str> {
    Some(match error_number(e)? {
        er::ACCESS_DENIED | er::ACCESS_DENIED_NO_PASSWORD => {
            "check the user name and password in the database URL"
        }
        er::DBACCESS_DENIED => {
            "grant this user access to the database, or fix the database name in the URL"
        }
        er::BAD_DB => "create it (CREATE DATABASE), or fix the database name at the end of the URL",
        er::CON_COUNT => {
            "the server's max_connections is reached: use smaller pools or raise the limit"
        }
        _ => return None,
    })
}

/// Whether `e` is MySQL's "table doesn't exist" (error 1146).
pub fn is_no_such_table(e: &sqlx::Error) -> bool {
    error_number(e) == Some(er::NO_SUCH_TABLE)
}

/// Whether `e` says the transaction lost to a concurrent one: a deadlock victim (1213, on
/// Galera also a failed certification or a brute-force abort; the transaction was rolled
/// back) or a lock wait timeout (1205: the statement was rolled back; roll the transaction
/// back too). Running the transaction again is the cure.
pub fn is_conflict(e: &sqlx::Error) -> bool {
    matches!(
        error_number(e),
        Some(er::LOCK_DEADLOCK | er::LOCK_WAIT_TIMEOUT)
    )
}

/// Whether `e` is a server error that passes by itself: too many connections (1040), a Galera
/// node not ready (1047), a server shutting down (1053), a killed or lost connection (1927,
/// 2006, 2013). Not a refusal that needs a change (access denied, an unknown database).
pub fn is_transient(e: &sqlx::Error) -> bool {
    matches!(
        error_number(e),
        Some(
            er::CON_COUNT
                | er::UNKNOWN_COM
                | er::SERVER_SHUTDOWN
                | er::CONNECTION_KILLED
                | er::SERVER_GONE
                | er::SERVER_LOST
        )
    )
}
