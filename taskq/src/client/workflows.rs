//! The client's workflows: read one with its steps, list them, cancel one or retry its dead
//! steps (both audited); and waiting for a task or a workflow to end.

use super::*;
use crate::workflow::{WorkflowCanceled, WorkflowId, WorkflowInfo, WorkflowStepRow};

/// How many retried steps' task ids the `workflow_retry` audit entry lists at most.
const AUDITED_STEP_IDS: usize = 100;

impl Client {
    /// A workflow with its state and its steps per state (its progress), read from its steps'
    /// index entries; [`Error::WorkflowNotFound`] when there is none.
    pub async fn workflow(&self, id: WorkflowId) -> Result<WorkflowInfo> {
        match self.run(self.store.workflow_get(id.0)).await? {
            Some(w) => Ok(w.into()),
            None => Err(Error::WorkflowNotFound(id)),
        }
    }

    /// A workflow's steps in the order they were declared, each with its task's state and the
    /// steps it runs after; [`Error::WorkflowNotFound`] when there is none.
    pub async fn workflow_steps(&self, id: WorkflowId) -> Result<Vec<WorkflowStepRow>> {
        let steps = self.run(self.store.workflow_steps(id.0)).await?;
        if steps.is_empty() && self.run(self.store.workflow_get(id.0)).await?.is_none() {
            return Err(Error::WorkflowNotFound(id));
        }
        Ok(steps)
    }

    /// A page of workflows, newest first: those with ids below `before` (all when `None`),
    /// named `name` when given, at most `limit` (1–1,000).
    pub async fn workflows(
        &self,
        name: Option<&str>,
        before: Option<WorkflowId>,
        limit: u32,
    ) -> Result<Vec<WorkflowInfo>> {
        if !(1..=1000).contains(&limit) {
            return Err(Error::InvalidOption(format!(
                "a page of workflows holds 1 to 1000, not {limit}"
            )));
        }
        let before = before.map_or(u64::MAX, |b| b.0);
        let rows = self
            .run(self.store.workflow_list(name, before, limit))
            .await?;
        Ok(rows.into_iter().map(Into::into).collect())
    }

    /// Cancels a workflow as a whole: its waiting and pending steps are canceled at once, its
    /// running steps get the cancel request running tasks get from [`Client::cancel`], and it
    /// is marked canceled (its state is `canceled` once every step has ended). Recorded in the
    /// audit trail as `workflow_cancel`, with the workflow's id and the counts, in the same
    /// transaction. [`Error::WorkflowNotFound`] when there is none.
    pub async fn cancel_workflow(&self, id: WorkflowId) -> Result<WorkflowCanceled> {
        let mut tx = self.run(self.store.begin()).await?;
        let done = self
            .run(self.store.workflow_cancel(tx.conn(), id.0))
            .await?;
        if !done.found {
            drop(tx);
            return Err(Error::WorkflowNotFound(id));
        }
        let a = Action {
            action: "workflow_cancel",
            task: None,
            queue: None,
            detail: Some(serde_json::json!({
                "workflow_id": id.0,
                "canceled": done.canceled,
                "cancel_requested": done.cancel_requested,
            })),
        };
        self.commit_audited(tx, &a).await?;
        Ok(done)
    }

    /// Retries a workflow's dead steps: each goes back to pending with its attempts reset, as
    /// [`Client::retry_dead`] does for a task, all in one transaction with one audit entry,
    /// `workflow_retry` (the workflow's id, how many steps were retried and the tasks of the
    /// first 100), written even when no step was dead. Nothing else is written: when a
    /// retried step then succeeds, the steps its death canceled come back by themselves and
    /// wait again for the steps they run after (steps an operator canceled stay canceled).
    /// Returns how many steps were retried; [`Error::WorkflowNotFound`] when there is none.
    pub async fn retry_workflow(&self, id: WorkflowId) -> Result<u64> {
        let dead: Vec<TaskId> = self
            .workflow_steps(id)
            .await?
            .into_iter()
            .filter(|s| s.state == TaskState::Dead)
            .map(|s| s.task_id)
            .collect();
        let mut tx = self.run(self.store.begin()).await?;
        let mut retried = Vec::with_capacity(dead.len());
        for task in dead {
            // Each step is locked and checked dead again: one that a worker or an operator
            // moved on meanwhile is left alone.
            match self
                .run(self.store.task_retry_dead(tx.conn(), task))
                .await?
            {
                RetryDead::Retried => retried.push(task.0),
                RetryDead::NotDead => {}
                // Steps cannot be unique (refused at enqueue): a held identity is not theirs.
                RetryDead::IdentityHeld(holder) => {
                    drop(tx);
                    return Err(Error::UniqueHeld { id: task, holder });
                }
            }
        }
        let a = Action {
            action: "workflow_retry",
            task: None,
            queue: None,
            detail: Some(serde_json::json!({
                "workflow_id": id.0,
                "retried": retried.len(),
                "task_ids": &retried[..retried.len().min(AUDITED_STEP_IDS)],
            })),
        };
        self.commit_audited(tx, &a).await?;
        Ok(retried.len() as u64)
    }

    /// Waits until task `id` has ended (succeeded, dead, canceled or expired) and returns it;
    /// [`Error::WaitTimedOut`] after `timeout`, [`Error::NotFound`] for an unknown id.
    ///
    /// No connection is held while it waits: it reads the task, then sleeps until a worker of
    /// this process writes back an outcome (it reads again at once) or a poll interval passes
    /// (10 ms, doubling to 1 s: a task ended by another process is seen within a second).
    pub async fn wait(&self, id: TaskId, timeout: Duration) -> Result<TaskInfo> {
        self.wait_until(timeout, || async move {
            let t = self.get(id).await?;
            Ok(t.state.is_terminal().then_some(t))
        })
        .await
    }

    /// Waits until task `id` has ended, as [`wait`](Self::wait) does, and returns the output
    /// its handler recorded with its success, decoded as `T` (`None`: it returned `()`).
    /// [`Error::WrongState`] when it ended otherwise (dead, canceled, expired: its state and
    /// `last_error` are in [`get`](Self::get)); [`Error::InvalidOutput`] when the output does
    /// not decode as `T`; [`Error::WaitTimedOut`] and [`Error::NotFound`] as for `wait`.
    pub async fn wait_output<T: serde::de::DeserializeOwned>(
        &self,
        id: TaskId,
        timeout: Duration,
    ) -> Result<Option<T>> {
        let t = self.wait(id, timeout).await?;
        if t.state != TaskState::Succeeded {
            return Err(Error::WrongState {
                id,
                state: t.state,
                expected: "succeeded",
            });
        }
        t.output
            .as_deref()
            .map(|json| {
                serde_json::from_str(json).map_err(|source| Error::InvalidOutput {
                    id,
                    ty: std::any::type_name::<T>(),
                    source,
                })
            })
            .transpose()
    }

    /// Waits until workflow `id` has ended (every step ended: `succeeded`, `failed` or
    /// `canceled`) and returns it, as [`wait`](Self::wait) does for a task;
    /// [`Error::WorkflowNotFound`] for an unknown id.
    pub async fn wait_workflow(&self, id: WorkflowId, timeout: Duration) -> Result<WorkflowInfo> {
        self.wait_until(timeout, || async move {
            let w = self.workflow(id).await?;
            Ok((w.state != crate::workflow::WorkflowState::Running).then_some(w))
        })
        .await
    }

    /// Reads `read` until it returns a value, woken by this process's write-backs or by a
    /// backing-off poll, up to `timeout`.
    pub(super) async fn wait_until<T, F, Fut>(&self, timeout: Duration, mut read: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<Option<T>>>,
    {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut poll = Duration::from_millis(10);
        loop {
            let woken = crate::wake::ended_signal();
            tokio::pin!(woken);
            woken.as_mut().enable();
            if let Some(v) = read().await? {
                return Ok(v);
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Err(Error::WaitTimedOut(timeout));
            }
            let nap = poll.min(deadline - now);
            tokio::select! {
                _ = woken => {}
                _ = tokio::time::sleep(nap) => poll = (poll * 2).min(Duration::from_secs(1)),
            }
        }
    }
}
