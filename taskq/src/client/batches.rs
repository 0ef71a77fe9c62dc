//! The client's batches: read one (its progress is its row), list them and their members,
//! seal one, cancel one (audited), wait for one to end.

use super::*;
use crate::batch::{BatchCanceled, BatchId, BatchInfo, BatchMemberRow};
use taskq_driver::rows::BatchAdded;
use taskq_driver::rules::batch::AddRefused;

impl Client {
    /// A batch with its state and progress (total, succeeded, failed, pending), read from its
    /// own row; [`Error::BatchNotFound`] when there is none.
    pub async fn batch(&self, id: BatchId) -> Result<BatchInfo> {
        match self.run(self.store.batch_get(id.0)).await? {
            Some(b) => Ok(b.into()),
            None => Err(Error::BatchNotFound(id)),
        }
    }

    /// A page of batches, newest first: those with ids below `before` (all when `None`),
    /// named `name` when given, at most `limit` (1–1,000).
    pub async fn batches(
        &self,
        name: Option<&str>,
        before: Option<BatchId>,
        limit: u32,
    ) -> Result<Vec<BatchInfo>> {
        page_limit("batches", limit)?;
        let before = before.map_or(u64::MAX, |b| b.0);
        let rows = self.run(self.store.batch_list(name, before, limit)).await?;
        Ok(rows.into_iter().map(Into::into).collect())
    }

    /// A page of a batch's members by task id, those after `after` (from the first when
    /// `None`), at most `limit` (1–1,000); a member whose task was deleted has no state.
    /// [`Error::BatchNotFound`] when there is no such batch.
    pub async fn batch_members(
        &self,
        id: BatchId,
        after: Option<TaskId>,
        limit: u32,
    ) -> Result<Vec<BatchMemberRow>> {
        page_limit("batch members", limit)?;
        let after = after.map_or(0, |t| t.0);
        let rows = self
            .run(self.store.batch_members(id.0, after, limit))
            .await?;
        if rows.is_empty() && self.run(self.store.batch_get(id.0)).await?.is_none() {
            return Err(Error::BatchNotFound(id));
        }
        Ok(rows)
    }

    /// Seals an open batch ([`Batch::open`](crate::batch::Batch::open)): its callbacks are
    /// released once every member has ended, at once if they all have.
    /// [`Error::BatchNotFound`], [`Error::BatchEnded`] (completed or canceled).
    pub async fn seal_batch(&self, id: BatchId) -> Result<()> {
        let mut tx = self.run(self.store.begin()).await?;
        let added = self.run(tx.conn().batch_add(id.0, &[], true)).await?;
        match added {
            BatchAdded::Added { counted, .. } => {
                self.run(tx.commit()).await?;
                for (_, q) in &counted.released {
                    crate::wake::notify(q);
                }
                Ok(())
            }
            BatchAdded::Refused(AddRefused::NotFound) => Err(Error::BatchNotFound(id)),
            BatchAdded::Refused(AddRefused::Ended) => Err(Error::BatchEnded(id)),
        }
    }

    /// Cancels a batch as a whole: its waiting and pending members and its callbacks that
    /// have not started are canceled at once, its running members get the cancel request
    /// running tasks get from [`Client::cancel`], and it is marked canceled (its state is
    /// `canceled` once every member has ended). Recorded in the audit trail as
    /// `batch_cancel`, with the batch's id and the counts, in the same transaction.
    /// [`Error::BatchNotFound`] when there is none.
    pub async fn cancel_batch(&self, id: BatchId) -> Result<BatchCanceled> {
        let mut tx = self.run(self.store.begin()).await?;
        let done = self.run(self.store.batch_cancel(tx.conn(), id.0)).await?;
        if !done.found {
            drop(tx);
            return Err(Error::BatchNotFound(id));
        }
        let a = Action {
            action: "batch_cancel",
            task: None,
            queue: None,
            detail: Some(serde_json::json!({
                "batch_id": id.0,
                "canceled": done.canceled,
                "cancel_requested": done.cancel_requested,
                "callbacks_canceled": done.callbacks_canceled,
            })),
        };
        self.commit_audited(tx, &a).await?;
        Ok(done)
    }

    /// Waits until batch `id` has ended (`succeeded`, `failed` or `canceled`: every member
    /// ended and was counted) and returns it, as [`wait`](Self::wait) does for a task;
    /// [`Error::BatchNotFound`] for an unknown id.
    pub async fn wait_batch(&self, id: BatchId, timeout: Duration) -> Result<BatchInfo> {
        self.wait_until(timeout, || async move {
            let b = self.batch(id).await?;
            Ok(b.state.is_ended().then_some(b))
        })
        .await
    }
}

/// Refuses a page size outside 1–1,000.
fn page_limit(what: &str, limit: u32) -> Result<()> {
    if (1..=1000).contains(&limit) {
        Ok(())
    } else {
        Err(Error::InvalidOption(format!(
            "a page of {what} holds 1 to 1000, not {limit}"
        )))
    }
}
