//! The inbox (`taskq_inbox`): a consumer records the id of each message it handles, in its
//! own transaction, and learns whether it had recorded it before; retention deletes old
//! records.

use sqlx::MySqlConnection;

/// Records `message_id` as seen by `consumer`, on the caller's connection (its transaction):
/// `true` if this is the first record, `false` if one exists (its `repeats` counted up).
///
/// One `INSERT … ON DUPLICATE KEY UPDATE`: a second record of an id that another transaction
/// has inserted but not committed waits for that transaction's row lock; then it finds the row
/// (the first committed: `false`, `repeats` + 1) or inserts it (the first rolled back:
/// `true`). When the first rolls back while two or more records of the id wait, InnoDB may
/// roll one of them back as a deadlock victim (error 1213, seen on MariaDB 10.11; the other
/// inserts): its caller's transaction fails and the message is redelivered, never handled
/// twice.
///
/// Affected rows: 1 for the insert, 2 for the update (sqlx connects with `CLIENT_FOUND_ROWS`,
/// under which an update that changes nothing would also say 1: `repeats + 1` always changes
/// the row).
pub(crate) async fn inbox_record(
    conn: &mut MySqlConnection,
    consumer: &str,
    message_id: &str,
) -> sqlx::Result<bool> {
    let done = sqlx::query!(
        r#"INSERT INTO taskq_inbox (consumer, message_id, seen_at)
           VALUES (?, ?, UTC_TIMESTAMP(6))
           ON DUPLICATE KEY UPDATE repeats = repeats + 1"#,
        consumer,
        message_id,
    )
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Deletes up to `limit` of `consumer`'s records first seen more than `age_us` µs ago, oldest
/// first (a range of `ix_taskq_inbox_seen`); how many.
pub(crate) async fn inbox_prune(
    conn: &mut MySqlConnection,
    consumer: &str,
    age_us: i64,
    limit: u32,
) -> sqlx::Result<u64> {
    let done = sqlx::query!(
        r#"DELETE FROM taskq_inbox
           WHERE consumer = ? AND seen_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND
           ORDER BY seen_at
           LIMIT ?"#,
        consumer,
        age_us,
        limit,
    )
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected())
}
