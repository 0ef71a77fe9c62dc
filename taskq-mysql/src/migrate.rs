//! The database-wide migration lock (`taskq_migration_lock`): a replicated row, so it holds
//! across the nodes of a Galera cluster.

use sqlx::{MySqlConnection, MySqlPool};

use crate::{is_conflict_on, is_deadlock};

/// How long a taken migration lock is valid without renewal: a migrator that died holding it
/// stops blocking others after this long. The holder renews it every third of this.
pub const MIGRATION_LOCK_SECS: u32 = 60;

/// Creates the migration lock's table if it is missing (it must exist before the first
/// migration runs; migration 13 records the same definition). DDL: on a Galera cluster it is
/// replicated in total order, so concurrent creators on different nodes do not conflict.
pub async fn migration_lock_table(conn: &mut MySqlConnection) -> sqlx::Result<()> {
    sqlx::query!(
        r#"CREATE TABLE IF NOT EXISTS taskq_migration_lock (
            id         TINYINT UNSIGNED NOT NULL,
            holder     VARCHAR(64)      NOT NULL,
            expires_at DATETIME(6)      NOT NULL,
            PRIMARY KEY (id)
        ) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin"#
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// Tries once to take the database-wide migration lock for `holder` (autocommit): removes a
/// lock whose holder let it expire, then inserts the lock row. Returns whether this call took
/// it. Another holder's row (a duplicate key), or a concurrent taker on another Galera node
/// (a certification failure, error 1213), means not taken. Unlike `GET_LOCK`, which each
/// server keeps to itself, the row is replicated, so this serializes migrators on every node
/// of a cluster.
pub async fn migration_lock_try(conn: &mut MySqlConnection, holder: &str) -> sqlx::Result<bool> {
    sqlx::query!("DELETE FROM taskq_migration_lock WHERE id = 1 AND expires_at < UTC_TIMESTAMP(6)")
        .execute(&mut *conn)
        .await?;
    let res = sqlx::query!(
        r#"INSERT INTO taskq_migration_lock (id, holder, expires_at)
           VALUES (1, ?, UTC_TIMESTAMP(6) + INTERVAL ? SECOND)"#,
        holder,
        MIGRATION_LOCK_SECS
    )
    .execute(&mut *conn)
    .await;
    match res {
        Ok(_) => Ok(true),
        Err(sqlx::Error::Database(e)) if is_conflict_on(&*e, "") || is_deadlock(&*e) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Extends `holder`'s migration lock by [`MIGRATION_LOCK_SECS`]; returns whether it still held it.
pub async fn migration_lock_renew(pool: &MySqlPool, holder: &str) -> sqlx::Result<bool> {
    let done = sqlx::query!(
        r#"UPDATE taskq_migration_lock SET expires_at = UTC_TIMESTAMP(6) + INTERVAL ? SECOND
           WHERE id = 1 AND holder = ?"#,
        MIGRATION_LOCK_SECS,
        holder
    )
    .execute(pool)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Releases `holder`'s migration lock.
pub async fn migration_unlock(conn: &mut MySqlConnection, holder: &str) -> sqlx::Result<()> {
    sqlx::query!(
        "DELETE FROM taskq_migration_lock WHERE id = 1 AND holder = ?",
        holder
    )
    .execute(conn)
    .await?;
    Ok(())
}
