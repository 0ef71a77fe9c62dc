//! Unique identities (`taskq_unique`): freeing the ones a transition ended, pruning windows.
//!
//! On MySQL each statement that ends a hold deletes the identities it names, and defers the
//! rows whose identity a producer's open transaction has locked. On SQLite no other
//! transaction can hold anything while a writer runs, so there is nothing to defer, and one
//! statement frees by the rule below whatever transition the rows just went through.

use sqlx::SqliteConnection;

/// Deletes the `taskq_unique` rows held by the tasks `ids` whose current state no longer holds
/// them. A task holds its identity while it is `pending`; while `running` unless it was
/// unique only while pending (freed when it started); after `succeeded` only for a window
/// (until the window ends, see [`unique_prune_expired`]); never when `dead`, `canceled` or
/// `expired`. That is MySQL's rule written per transition: the claim frees `pending`
/// identities and those of tasks found expired; a success frees `running` ones; a death
/// (write-back or reaper) frees `running` and `window` ones; a cancel frees any; a retry keeps
/// it. Only rows naming the task itself are deleted, so an identity another task took since is
/// left alone, and a row whose write-back was fenced is left as its current state says.
///
/// Run it in the transaction that made the transitions. Returns how many rows it deleted.
pub(crate) async fn release_ended(conn: &mut SqliteConnection, ids: &[i64]) -> sqlx::Result<u64> {
    if ids.is_empty() {
        return Ok(0);
    }
    let json = serde_json::to_string(ids).map_err(|e| sqlx::Error::Encode(Box::new(e)))?;
    let done = sqlx::query!(
        r#"DELETE FROM taskq_unique
           WHERE (unique_key, task_id) IN (
             SELECT t.unique_key, t.id FROM json_each(?1) AS j
               JOIN taskq_tasks AS t ON t.id = j.value
             WHERE t.unique_key IS NOT NULL
               AND NOT (t.state = 'pending'
                        OR (t.state = 'running' AND t.unique_while <> 'pending')
                        OR (t.state = 'succeeded' AND t.unique_while = 'window')))"#,
        json
    )
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected())
}

/// Deletes up to `limit` identities of windows that have ended (`expires_at` passed):
/// whatever task held one, its window is over. Returns the count.
pub(crate) async fn unique_prune_expired(
    conn: &mut SqliteConnection,
    limit: u32,
) -> sqlx::Result<u64> {
    let done = sqlx::query!(
        r#"DELETE FROM taskq_unique
           WHERE unique_key IN (
             SELECT unique_key FROM taskq_unique
             WHERE expires_at < (SELECT us FROM taskq_clock)
             ORDER BY expires_at
             LIMIT ?1)"#,
        limit
    )
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected())
}
