//! The inbox (`taskq_inbox`): a consumer records the id of each message it handles, in its
//! own transaction, and learns whether it had recorded it before; retention deletes old
//! records.

use sqlx::SqliteConnection;

/// Records `message_id` as seen by `consumer`, on the caller's connection (its transaction):
/// `true` if this is the first record, `false` if one exists (its `repeats` counted up). One
/// upsert; the write lock the caller's transaction holds (or takes here) keeps any other
/// writer out until it ends, so a concurrent record of the same id comes after its commit or
/// rollback.
pub(crate) async fn inbox_record(
    conn: &mut SqliteConnection,
    consumer: &str,
    message_id: &str,
) -> sqlx::Result<bool> {
    let repeats = sqlx::query_scalar!(
        r#"INSERT INTO taskq_inbox (consumer, message_id, seen_at)
           VALUES (?1, ?2, (SELECT us FROM taskq_clock))
           ON CONFLICT (consumer, message_id) DO UPDATE SET repeats = repeats + 1
           RETURNING repeats AS "repeats!: i64""#,
        consumer,
        message_id,
    )
    .fetch_one(&mut *conn)
    .await?;
    Ok(repeats == 0)
}

/// Deletes up to `limit` of `consumer`'s records first seen more than `age_us` µs ago, oldest
/// first (a range of `ix_taskq_inbox_seen`); how many.
pub(crate) async fn inbox_prune(
    conn: &mut SqliteConnection,
    consumer: &str,
    age_us: i64,
    limit: u32,
) -> sqlx::Result<u64> {
    let done = sqlx::query!(
        r#"DELETE FROM taskq_inbox
           WHERE consumer = ?1 AND message_id IN (
             SELECT message_id FROM taskq_inbox
             WHERE consumer = ?1 AND seen_at < (SELECT us FROM taskq_clock) - ?2
             ORDER BY seen_at
             LIMIT ?3)"#,
        consumer,
        age_us,
        limit,
    )
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected())
}
