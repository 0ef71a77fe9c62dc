//! Writes to `taskq_tasks` outside a lease: the operator's actions (cancel, cancel request,
//! retry, reschedule, priority; one task or a batch) and retention (`task_prune`).

use chrono::{DateTime, Utc};
use sqlx::MySqlConnection;
use taskq_driver::driver::Actions;
use taskq_driver::rules::{self, OrderEnd, retry_retakes_identity};

use crate::MySqlDriver;
use crate::identities::identity_reserve;
use crate::order::{order_advance, order_advance_all, order_advance_ids, order_retry};
use taskq_driver::rows::RetryDead;
use taskq_driver::state::{TaskId, TaskState};

impl Actions for MySqlDriver {
    /// Cancels the pending and waiting tasks among `ids` (freeing their unique identities; an
    /// ordered key's head promotes the key's next task), in one short transaction; returns
    /// how many. As on every driver (`rules::cancels_at_once`): one locking read of the rows
    /// still pending or waiting (ascending id), one `UPDATE` of exactly those, and only then
    /// the keys of the canceled heads go on, so a canceled head never promotes a task the same
    /// batch cancels.
    async fn task_cancel_batch(&self, ids: &[u64]) -> sqlx::Result<u64> {
        let json = serde_json::to_string(ids).expect("ids serialize");
        let mut tx = self.pool.begin().await?;
        let rows = sqlx::query!(
            r#"SELECT t.id AS "id: u64", t.order_key AS "order_key: Vec<u8>",
                 t.order_seq AS "order_seq: u64", (t.unique_key IS NOT NULL) AS "unique!: bool"
               FROM JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$')) AS j
                 STRAIGHT_JOIN taskq_tasks t FORCE INDEX (PRIMARY) ON t.id = j.id
               WHERE t.state IN ('pending', 'waiting')
               ORDER BY t.id
               FOR UPDATE"#,
            json
        )
        .fetch_all(&mut *tx)
        .await?;
        if rows.is_empty() {
            tx.commit().await?;
            return Ok(0);
        }
        let locked: Vec<u64> = rows.iter().map(|r| r.id).collect();
        let locked = serde_json::to_string(&locked).expect("ids serialize");
        let canceled = sqlx::query!(
            r#"UPDATE JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$')) AS j
                 STRAIGHT_JOIN taskq_tasks t FORCE INDEX (PRIMARY) ON t.id = j.id
               SET t.state = 'canceled', t.finished_at = UTC_TIMESTAMP(6), t.updated_at = UTC_TIMESTAMP(6)
               WHERE t.state IN ('pending', 'waiting')"#,
            locked
        )
        .execute(&mut *tx)
        .await?
        .rows_affected();
        let ends = rows.iter().filter_map(|r| {
            Some(OrderEnd {
                key: r.order_key.clone()?,
                id: r.id,
                seq: r.order_seq?,
            })
        });
        order_advance_all(&mut tx, &rules::order_ends(ends)).await?;
        if rows.iter().any(|r| r.unique) {
            sqlx::query!(
                r#"DELETE u FROM JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$')) AS j
                     STRAIGHT_JOIN taskq_tasks t FORCE INDEX (PRIMARY) ON t.id = j.id
                     STRAIGHT_JOIN taskq_unique u FORCE INDEX (PRIMARY) ON u.unique_key = t.unique_key
                   WHERE t.state = 'canceled' AND u.task_id = t.id"#,
                locked
            )
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(canceled)
    }

    /// Records a cancel request on the running tasks among `ids`; returns how many were
    /// running.
    async fn task_request_cancel_batch(&self, ids: &[u64]) -> sqlx::Result<u64> {
        let json = serde_json::to_string(ids).expect("ids serialize");
        let done = sqlx::query!(
            r#"UPDATE JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$')) AS j
                 STRAIGHT_JOIN taskq_tasks t FORCE INDEX (PRIMARY) ON t.id = j.id
               SET t.cancel_requested_at = COALESCE(t.cancel_requested_at, UTC_TIMESTAMP(6)),
                   t.updated_at = UTC_TIMESTAMP(6)
               WHERE t.state = 'running'"#,
            json
        )
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }

    /// Retries the dead tasks among `ids` that hold no identity to take back (not unique, or
    /// unique per window, like `task_retry_dead_batch`); returns how many.
    async fn task_retry_dead_ids(&self, ids: &[u64]) -> sqlx::Result<u64> {
        let json = serde_json::to_string(ids).expect("ids serialize");
        let done = sqlx::query!(
            r#"UPDATE JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$')) AS j
                 STRAIGHT_JOIN taskq_tasks t FORCE INDEX (PRIMARY) ON t.id = j.id
               SET t.state = 'pending', t.attempt = 0, t.lease_epoch = t.lease_epoch + 1,
                   t.run_at = UTC_TIMESTAMP(6), t.finished_at = NULL, t.lease_until = NULL,
                   t.updated_at = UTC_TIMESTAMP(6)
               WHERE t.state = 'dead' AND (t.unique_key IS NULL OR t.unique_while = 'window')
                 AND t.order_key IS NULL"#,
            json
        )
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }

    /// Records a cancel request on a running task (kept from the first request); returns
    /// whether the task was running. On the caller's transaction (with its audit row).
    async fn task_request_cancel(
        &self,
        conn: &mut MySqlConnection,
        id: TaskId,
    ) -> sqlx::Result<bool> {
        let done = sqlx::query!(
            r#"UPDATE taskq_tasks
               SET cancel_requested_at = COALESCE(cancel_requested_at, UTC_TIMESTAMP(6)),
                   updated_at = UTC_TIMESTAMP(6)
               WHERE id = ? AND state = 'running'"#,
            id.0
        )
        .execute(&mut *conn)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Cancels a pending or waiting task (freeing the unique identity it holds; an ordered
    /// key's head, which is pending, promotes the key's next task); returns whether a row
    /// changed. On the caller's transaction: three statements for a pending task, one more
    /// for an ordered head, two for a waiting one.
    async fn task_cancel(&self, tx: &mut MySqlConnection, id: TaskId) -> sqlx::Result<bool> {
        let done = sqlx::query!(
            r#"UPDATE taskq_tasks
               SET state = 'canceled', finished_at = UTC_TIMESTAMP(6), updated_at = UTC_TIMESTAMP(6)
               WHERE id = ? AND state = 'pending'"#,
            id.0
        )
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() == 1 {
            sqlx::query!(
                r#"DELETE u FROM taskq_tasks t
                     STRAIGHT_JOIN taskq_unique u FORCE INDEX (PRIMARY) ON u.unique_key = t.unique_key
                   WHERE t.id = ? AND u.task_id = t.id"#,
                id.0
            )
            .execute(&mut *tx)
            .await?;
            order_advance_ids(tx, &[id.0]).await?;
            return Ok(true);
        }
        let waiting = sqlx::query!(
            r#"UPDATE taskq_tasks
               SET state = 'canceled', finished_at = UTC_TIMESTAMP(6), updated_at = UTC_TIMESTAMP(6)
               WHERE id = ? AND state = 'waiting'"#,
            id.0
        )
        .execute(&mut *tx)
        .await?;
        Ok(waiting.rows_affected() == 1)
    }

    /// Moves a pending task's due time to `at`, or to `delay_us` from the database's now when
    /// `at` is `None`; returns whether a row matched.
    async fn task_reschedule(
        &self,
        conn: &mut MySqlConnection,
        id: TaskId,
        at: Option<DateTime<Utc>>,
        delay_us: i64,
    ) -> sqlx::Result<bool> {
        let done = sqlx::query!(
            r#"UPDATE taskq_tasks
               SET run_at = COALESCE(?, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND),
                   updated_at = UTC_TIMESTAMP(6)
               WHERE id = ? AND state = 'pending'"#,
            at.map(|d| d.naive_utc()),
            delay_us,
            id.0
        )
        .execute(&mut *conn)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Sets a pending task's priority; returns whether a row matched.
    async fn task_set_priority(
        &self,
        conn: &mut MySqlConnection,
        id: TaskId,
        priority: i16,
    ) -> sqlx::Result<bool> {
        let done = sqlx::query!(
            r#"UPDATE taskq_tasks SET priority = ?, updated_at = UTC_TIMESTAMP(6)
               WHERE id = ? AND state = 'pending'"#,
            priority,
            id.0
        )
        .execute(&mut *conn)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Deletes a task that is not running, and the unique identity it holds (its
    /// `taskq_unique` row, if the row names this task): the row locked first, so a claim
    /// cannot start it in between. Three statements on the caller's transaction.
    async fn task_delete(&self, tx: &mut MySqlConnection, id: TaskId) -> sqlx::Result<bool> {
        let row = sqlx::query!(
            r#"SELECT unique_key AS "unique_key: Vec<u8>", order_key AS "order_key: Vec<u8>",
                 order_seq AS "order_seq: u64", state AS "state: TaskState"
               FROM taskq_tasks
               WHERE id = ? AND state <> 'running' FOR UPDATE"#,
            id.0
        )
        .fetch_optional(&mut *tx)
        .await?;
        let Some(row) = row else {
            return Ok(false);
        };
        if let Some(key) = row.unique_key {
            sqlx::query!(
                r#"DELETE FROM taskq_unique WHERE unique_key = ? AND task_id = ?"#,
                key,
                id.0
            )
            .execute(&mut *tx)
            .await?;
        }
        // A deleted head (pending, or dead and holding its key) lets its key go on; a waiting
        // or finished task is no head, and its key is left alone.
        if let (Some(key), Some(seq)) = (&row.order_key, row.order_seq)
            && matches!(row.state, TaskState::Pending | TaskState::Dead)
        {
            order_advance(tx, key, id.0, seq).await?;
        }
        let done = sqlx::query!(
            r#"DELETE FROM taskq_tasks WHERE id = ? AND state <> 'running'"#,
            id.0
        )
        .execute(&mut *tx)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Moves a dead task back to pending with attempts reset and its epoch incremented. A task
    /// unique while pending or running takes its identity back, which fails (and changes
    /// nothing) when another task holds it meanwhile; a windowed one does not (see
    /// `docs/semantics.md`). On the caller's transaction: it writes only when it returns
    /// `Retried` (an `IdentityHeld` leaves the identity's row locked until the caller ends).
    async fn task_retry_dead(
        &self,
        tx: &mut MySqlConnection,
        id: TaskId,
    ) -> sqlx::Result<RetryDead> {
        let row = sqlx::query!(
            r#"SELECT unique_key AS "unique_key: Vec<u8>", unique_while,
                 order_key AS "order_key: Vec<u8>"
               FROM taskq_tasks
               WHERE id = ? AND state = 'dead' FOR UPDATE"#,
            id.0
        )
        .fetch_optional(&mut *tx)
        .await?;
        let Some(row) = row else {
            return Ok(RetryDead::NotDead);
        };
        let retake = row.unique_key.filter(|_| {
            row.unique_while
                .as_deref()
                .is_some_and(retry_retakes_identity)
        });
        if let Some(key) = retake
            && let Some(holder) = identity_reserve(tx, &key, id.0, None).await?
        {
            return Ok(RetryDead::IdentityHeld(holder));
        }
        // An ordered task: its key's head stays the head; any other goes to the end of its key.
        let state = match &row.order_key {
            Some(key) => order_retry(tx, key, id.0).await?,
            None => TaskState::Pending,
        };
        sqlx::query!(
            r#"UPDATE taskq_tasks
               SET state = ?, attempt = 0, lease_epoch = lease_epoch + 1, run_at = UTC_TIMESTAMP(6),
                   finished_at = NULL, lease_until = NULL, updated_at = UTC_TIMESTAMP(6)
               WHERE id = ? AND state = 'dead'"#,
            state.as_str(),
            id.0
        )
        .execute(&mut *tx)
        .await?;
        Ok(RetryDead::Retried)
    }

    /// Moves up to `limit` dead tasks that take no identity back (not unique, or windowed; of
    /// `queue`, or of every queue) that died at or before `died_before` back to pending, with attempts reset and epochs
    /// incremented, like `task_retry_dead`. Walks `ix_taskq_finished`; the `died_before` bound
    /// keeps a bulk retry from picking up tasks that die again while it runs. Returns the count.
    /// (Unique tasks go one by one, see `MySqlDriver::task_dead_unique_ids`: one identity taken
    /// meanwhile must not fail the whole statement.)
    async fn task_retry_dead_batch(
        &self,
        queue: Option<&str>,
        died_before: DateTime<Utc>,
        limit: u32,
    ) -> sqlx::Result<u64> {
        let done = sqlx::query!(
            r#"UPDATE taskq_tasks
               SET state = 'pending', attempt = 0, lease_epoch = lease_epoch + 1, run_at = UTC_TIMESTAMP(6),
                   finished_at = NULL, lease_until = NULL, updated_at = UTC_TIMESTAMP(6)
               WHERE state = 'dead' AND (finished_at IS NULL OR finished_at <= ?)
                 AND (? IS NULL OR queue = ?) AND (unique_key IS NULL OR unique_while = 'window')
                 AND order_key IS NULL
               ORDER BY finished_at, id
               LIMIT ?"#,
            died_before.naive_utc(),
            queue,
            queue,
            limit
        )
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }

    /// Deletes up to `limit` tasks in terminal `state` that finished more than `age_secs` ago,
    /// except a dead ordered task that holds its key (deleting it is an operator's decision:
    /// `task_delete`).
    async fn task_prune(
        &self,
        conn: &mut MySqlConnection,
        state: TaskState,
        age_secs: u64,
        limit: u32,
    ) -> sqlx::Result<u64> {
        let done = sqlx::query!(
            r#"DELETE FROM taskq_tasks
               WHERE state = ? AND finished_at < UTC_TIMESTAMP(6) - INTERVAL ? SECOND
                 AND (order_key IS NULL OR NOT EXISTS (
                       SELECT 1 FROM taskq_order_keys k
                       WHERE k.order_key = taskq_tasks.order_key AND k.head_task_id = taskq_tasks.id))
               ORDER BY finished_at
               LIMIT ?"#,
            state.as_str(),
            age_secs,
            limit
        )
        .execute(&mut *conn)
        .await?;
        Ok(done.rows_affected())
    }
}
