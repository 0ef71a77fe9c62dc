//! The MySQL / MariaDB error numbers of a session the server refused, and what to check for
//! each: the driver's half of taskq's connection diagnosis (taskq writes the sentences).

/// MySQL / MariaDB error numbers of failures while opening a session.
mod er {
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
