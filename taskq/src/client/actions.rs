//! The client's actions on one task: enqueue by name, cancel, reschedule, run now, priority,
//! delete, retry a dead task; and deleting a schedule. Each is audited in its own transaction.

use super::*;

impl Client {
    /// Enqueues the task `reg` registers from a JSON payload (see
    /// [`Registration::enqueue_json`](crate::registry::Registration::enqueue_json)) and
    /// records it in the audit trail as `enqueue` by this client's actor, with `detail`, in
    /// the same transaction; a duplicate (idempotency key or unique identity) records
    /// nothing. Wakes this process's workers for the queue after the commit.
    pub async fn enqueue_json(
        &self,
        reg: &crate::registry::Registration,
        payload: &[u8],
        options: &crate::registry::JsonEnqueueOptions,
        detail: serde_json::Value,
    ) -> Result<crate::Enqueued> {
        let prepared = (reg.prepare_json)(payload, options)?;
        let mut tx = self.run(self.store.begin()).await?;
        let done = self.bounded(prepared.insert(tx.conn(), &mut None)).await?;
        if done.duplicate {
            drop(tx);
            return Ok(done);
        }
        let queue = options.queue.as_deref().unwrap_or(reg.queue());
        let a = Action {
            action: "enqueue",
            task: Some(done.id),
            queue: Some(queue.to_owned()),
            detail: Some(detail),
        };
        self.commit_audited(tx, &a).await?;
        crate::wake::notify(queue);
        Ok(done)
    }

    /// Cancels a task.
    ///
    /// * Pending: canceled at once (a unique task frees its identity): [`Canceled::Now`].
    /// * Running: a cancel request is recorded: [`Canceled::Requested`]. The worker holding the
    ///   task learns of it at its next heartbeat, fires the handler's
    ///   [`CancelSignal`](crate::CancelSignal) with [`CancelReason::Canceled`](crate::context::CancelReason::Canceled),
    ///   aborts it after the cancel grace, and writes `canceled` (fenced by the lease epoch,
    ///   freeing a unique identity). A handler that returns an error or snoozes within the
    ///   grace still ends `canceled`; one that *succeeds* within the grace is recorded
    ///   `succeeded` (its work is done). If the worker dies meanwhile, the reaper turns the
    ///   expired lease into `canceled`, never `pending`. If the attempt's outcome was a retry
    ///   written just before the worker saw the request, the request stays on the row and the
    ///   claim that next finds the task due ends it `canceled` without running it.
    ///
    /// Terminal tasks give [`Error::WrongState`], unknown ids [`Error::NotFound`].
    pub async fn cancel(&self, id: TaskId) -> Result<Canceled> {
        let mut tx = self.run(self.store.begin()).await?;
        if self.run(self.store.task_cancel(tx.conn(), id)).await? {
            self.commit_audited(tx, &Action::task("cancel", id, None))
                .await?;
            crate::metrics::canceled();
            return Ok(Canceled::Now);
        }
        if self
            .run(self.store.task_request_cancel(tx.conn(), id))
            .await?
        {
            self.commit_audited(tx, &Action::task("cancel_requested", id, None))
                .await?;
            return Ok(Canceled::Requested);
        }
        drop(tx);
        Err(self.state_error(id, "pending or running").await)
    }

    /// Moves the due time of a task that has not started to `delay` from now (database clock):
    /// [`Duration::ZERO`](std::time::Duration::ZERO) makes it due at once. Nothing else
    /// changes (attempts, priority, deadline: a task rescheduled past its deadline expires
    /// when it comes due). A delay over [`MAX_DELAY`](crate::defaults::MAX_DELAY) is
    /// [`Error::InvalidSchedule`]; running and terminal tasks give [`Error::WrongState`],
    /// unknown ids [`Error::NotFound`]. Workers see the change at their next poll.
    pub async fn reschedule(&self, id: TaskId, delay: std::time::Duration) -> Result<()> {
        let delay_us = crate::task::enqueue::validate_schedule(delay, None)?;
        let detail = serde_json::json!({ "delay_ms": delay.as_millis() as u64 });
        self.reschedule_audited("reschedule", id, None, delay_us, detail)
            .await
    }

    /// Makes a task that has not started due now (database clock), like
    /// [`reschedule`](Self::reschedule) with no delay, recorded in the audit trail as `run_now`.
    /// Running and terminal tasks give [`Error::WrongState`], unknown ids
    /// [`Error::NotFound`].
    pub async fn run_now(&self, id: TaskId) -> Result<()> {
        self.reschedule_audited("run_now", id, None, 0, serde_json::Value::Null)
            .await
    }

    /// Deletes a task that is not running (pending, or in a terminal state): its row with its
    /// attempt history, and the unique identity it holds (a later enqueue of the same identity
    /// is then accepted). Recorded in the audit trail as `delete` with the task's queue, name
    /// and state, in the transaction of the delete. A running task gives
    /// [`Error::WrongState`] (cancel it first), an unknown id [`Error::NotFound`].
    pub async fn delete(&self, id: TaskId) -> Result<()> {
        let t = self.get(id).await?;
        let mut tx = self.run(self.store.begin()).await?;
        if self.run(self.store.task_delete(tx.conn(), id)).await? {
            let a = Action {
                action: "delete",
                task: Some(id),
                queue: Some(t.queue.clone()),
                detail: Some(serde_json::json!({ "name": t.name, "state": t.state.as_str() })),
            };
            return self.commit_audited(tx, &a).await;
        }
        drop(tx);
        Err(self.state_error(id, "pending or finished").await)
    }

    /// Like [`reschedule`](Self::reschedule), to an absolute time (between 1970 and 10 years
    /// ahead, else [`Error::InvalidSchedule`]); a time in the past makes the task due at once.
    pub async fn reschedule_at(&self, id: TaskId, at: DateTime<Utc>) -> Result<()> {
        crate::task::enqueue::validate_schedule(std::time::Duration::ZERO, Some(at))?;
        let detail = serde_json::json!({ "at": at });
        self.reschedule_audited("reschedule", id, Some(at), 0, detail)
            .await
    }

    pub(super) async fn reschedule_audited(
        &self,
        action: &'static str,
        id: TaskId,
        at: Option<DateTime<Utc>>,
        delay_us: i64,
        detail: serde_json::Value,
    ) -> Result<()> {
        let mut tx = self.run(self.store.begin()).await?;
        let done = self.store.task_reschedule(tx.conn(), id, at, delay_us);
        if self.run(done).await? {
            return self
                .commit_audited(
                    tx,
                    &Action::task(action, id, Some(detail).filter(|d| !d.is_null())),
                )
                .await;
        }
        drop(tx);
        Err(self.state_error(id, "pending").await)
    }

    /// Sets the priority of a task that has not started (lower runs first). Running and
    /// terminal tasks give [`Error::WrongState`], unknown ids [`Error::NotFound`].
    pub async fn set_priority(&self, id: TaskId, priority: i16) -> Result<()> {
        let mut tx = self.run(self.store.begin()).await?;
        let done = self.store.task_set_priority(tx.conn(), id, priority);
        if self.run(done).await? {
            let detail = serde_json::json!({ "priority": priority });
            return self
                .commit_audited(tx, &Action::task("priority", id, Some(detail)))
                .await;
        }
        drop(tx);
        Err(self.state_error(id, "pending").await)
    }

    /// Deletes a schedule's row (e.g. one removed from the code, whose row stays behind);
    /// returns whether it existed. A worker that still declares the schedule writes it again
    /// within its next wake-up, with its ticks starting afresh from then.
    pub async fn delete_schedule(&self, name: &str) -> Result<bool> {
        let mut tx = self.run(self.store.begin()).await?;
        let deleted = self
            .run(self.store.schedule_delete(tx.conn(), name))
            .await?;
        if deleted {
            let detail = serde_json::json!({ "schedule": name });
            self.commit_audited(tx, &Action::queue("schedule_delete", None, detail))
                .await?;
        }
        Ok(deleted)
    }

    /// Moves a dead task back to pending with its attempts reset. A unique task takes its
    /// identity back; if another task holds it (enqueued after this one died), nothing changes
    /// and the error is [`Error::UniqueHeld`] naming that task.
    pub async fn retry_dead(&self, id: TaskId) -> Result<()> {
        let mut tx = self.run(self.store.begin()).await?;
        match self.run(self.store.task_retry_dead(tx.conn(), id)).await? {
            RetryDead::Retried => {
                self.commit_audited(tx, &Action::task("retry", id, None))
                    .await
            }
            RetryDead::IdentityHeld(holder) => Err(Error::UniqueHeld { id, holder }),
            RetryDead::NotDead => {
                drop(tx);
                Err(self.state_error(id, "dead").await)
            }
        }
    }

    /// [`Store::task_retry_dead`] in a transaction of its own (bulk retries: their audit
    /// entry is the bulk operation's).
    pub(super) async fn retry_dead_one(&self, id: TaskId) -> sqlx::Result<RetryDead> {
        let mut tx = self.store.begin().await?;
        let r = self.store.task_retry_dead(tx.conn(), id).await?;
        tx.commit().await?;
        Ok(r)
    }
}
