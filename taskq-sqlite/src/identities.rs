//! Unique identities (`taskq_unique`): freeing the ones a transition ended, pruning windows.
//!
//! Which identity a transition frees is decided in Rust by `taskq_driver::rules`, the same
//! rules the MySQL driver and the worker apply: each statement that moves tasks reads back
//! (`RETURNING`) the state it gave each row with the row's `unique_key` and `unique_while`,
//! keeps the identities the rule frees ([`freed`]), and [`release`] deletes exactly those in
//! the same transaction. On MySQL a statement may defer rows whose identity a producer's open
//! transaction has locked; on SQLite no other transaction can hold anything while a writer
//! runs, so nothing is deferred.

use sqlx::SqliteConnection;
use taskq_driver::rows::hex;
use taskq_driver::state::TaskState;

use crate::conv::json;

/// The identity a row frees by moving to `to`, as `rule` decides for its `unique_while`
/// (`rules::frees_identity` for a claim or a cancel, `rules::run_end_frees_identity` for the
/// end of a run): `(unique_key, task id)`, or `None`.
pub(crate) fn freed(
    id: i64,
    unique_key: Option<Vec<u8>>,
    unique_while: Option<&str>,
    to: TaskState,
    rule: fn(&str, TaskState) -> bool,
) -> Option<(Vec<u8>, i64)> {
    let key = unique_key?;
    unique_while
        .is_some_and(|w| rule(w, to))
        .then_some((key, id))
}

/// Deletes the `taskq_unique` rows `(unique_key, task id)` (one statement; none when `freed`
/// is empty). Only a row naming the task itself is deleted, so an identity another task took
/// since is left alone. Run it in the transaction that made the transitions. Returns how many
/// rows it deleted.
pub(crate) async fn release(
    conn: &mut SqliteConnection,
    freed: &[(Vec<u8>, i64)],
) -> sqlx::Result<u64> {
    if freed.is_empty() {
        return Ok(0);
    }
    let pairs: Vec<(String, i64)> = freed.iter().map(|(k, id)| (hex(k), *id)).collect();
    let json = json(&pairs)?;
    let done = sqlx::query!(
        r#"DELETE FROM taskq_unique
           WHERE (unique_key, task_id) IN (
             SELECT unhex(j.value ->> 0), j.value ->> 1 FROM json_each(?1) AS j)"#,
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
