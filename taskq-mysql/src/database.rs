//! Whether a database exists on the server, and creating it (`taskq::create_database`).

use sqlx::MySqlConnection;

/// Whether a database (schema) named `name` exists on the server of `conn`.
pub async fn database_exists(conn: &mut MySqlConnection, name: &str) -> sqlx::Result<bool> {
    let n = sqlx::query_scalar!(
        r#"SELECT COUNT(*) AS "n!: i64" FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = ?"#,
        name
    )
    .fetch_one(&mut *conn)
    .await?;
    Ok(n > 0)
}

/// `CREATE DATABASE IF NOT EXISTS` for `name` (`taskq::create_database`). The one statement
/// built as text: an identifier cannot be a bound parameter. The caller rejects names with a
/// backtick, so the quoted identifier cannot be closed early.
pub async fn database_create(conn: &mut MySqlConnection, name: &str) -> sqlx::Result<()> {
    debug_assert!(!name.contains('`'));
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE DATABASE IF NOT EXISTS `{name}`"
    )))
    .execute(&mut *conn)
    .await?;
    Ok(())
}
