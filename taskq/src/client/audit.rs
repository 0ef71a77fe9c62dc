//! The client's reads of attempt history and audit trail, and recording an audit entry in the
//! caller's transaction.

use super::*;
use crate::backend::AuditRow;
use crate::history::parse_attempts;
use crate::task::enqueue::AsConnection;

impl Client {
    /// The attempt history of a task, oldest first: one [`Attempt`] per run that ended (the
    /// latest [`MAX_ATTEMPT_ENTRIES`](crate::history::MAX_ATTEMPT_ENTRIES)). A run in progress
    /// has no entry yet (its start is
    /// [`TaskInfo::attempted_at`](crate::client::TaskInfo::attempted_at)). [`Error::NotFound`] when
    /// the task does not exist (or was pruned: its history goes with it).
    pub async fn attempts(&self, id: TaskId) -> Result<Vec<Attempt>> {
        let row = self.run(self.store.task_attempts(id)).await?;
        match row {
            None => Err(Error::NotFound(id)),
            Some(None) => Ok(Vec::new()),
            Some(Some(json)) => {
                parse_attempts(&json).map_err(|e| Error::Database(sqlx::Error::Decode(e.into())))
            }
        }
    }

    /// Entries of the audit trail matching `filter`, newest first.
    pub async fn audit(&self, filter: &AuditFilter) -> Result<Vec<AuditEntry>> {
        let limit = filter.limit.unwrap_or(100).clamp(1, 10_000);
        let before = filter.before_id.unwrap_or(u64::MAX);
        let rows = self
            .run(self.store.audit_list(
                filter.task.map(|t| t.0),
                filter.queue.as_deref(),
                before,
                limit,
            ))
            .await?;
        Ok(rows
            .into_iter()
            .map(|r| AuditEntry {
                id: r.id,
                at: r.at,
                actor: r.actor,
                action: r.action,
                task_id: r.task_id.map(TaskId),
                queue: r.queue,
                detail: r
                    .detail
                    .as_deref()
                    .map(|d| serde_json::from_str(d).unwrap_or_else(|_| serde_json::Value::from(d)))
                    .unwrap_or(serde_json::Value::Null),
            })
            .collect())
    }

    /// Records an action of your own in the audit trail, by this client's actor, on `conn`:
    /// pass the transaction of the action so that both commit or neither does. For example a
    /// dashboard that enqueues a task records `create` with the new task's id.
    ///
    /// `action` is a name of up to 64 characters, `queue` a queue name, `detail` any JSON
    /// (`Null` for none). Returns the entry's id. Application enqueues are not recorded by
    /// taskq (that would cost every enqueue a statement): the task row's `created_at` is
    /// their record.
    ///
    /// ```no_run
    /// # async fn f(client: taskq::Client, pool: sqlx::MySqlPool) -> taskq::Result<()> {
    /// let mut tx = pool.begin().await?;
    /// // ... enqueue_tx(&mut tx) ...
    /// let id = taskq::TaskId(42);
    /// client
    ///     .record_audit(&mut tx, "create", Some(id), None, serde_json::json!({ "via": "web" }))
    ///     .await?;
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    pub async fn record_audit<C: AsConnection + ?Sized>(
        &self,
        conn: &mut C,
        action: &str,
        task: Option<TaskId>,
        queue: Option<&str>,
        detail: serde_json::Value,
    ) -> Result<u64> {
        crate::defaults::validate_name("audit action", action, 64)?;
        if let Some(q) = queue {
            crate::defaults::validate_name("queue", q, crate::defaults::MAX_QUEUE_LEN)?;
        }
        let detail = (!detail.is_null()).then(|| detail.to_string());
        let row = AuditRow {
            actor: self.actor(),
            action,
            task_id: task.map(|t| t.0),
            queue,
            detail,
        };
        let done = crate::task::enqueue::conn_of(conn).audit_insert(&row).await;
        self.db(done).await
    }
}
