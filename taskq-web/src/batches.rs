//! What the batch pages and their API routes share: a page of batches and a page of a batch's
//! members, each with its keyset cursor, and the two actions on a batch (cancel it, seal it),
//! each through the client acting as the request's actor. A cancel is audited
//! (`batch_cancel`) by `Client::cancel_batch` in the transaction of the change; a seal is not
//! audited (`Client::seal_batch` writes no audit entry, and the dashboard adds none outside its
//! transaction).

use taskq::batch::{BatchId, BatchInfo, BatchMemberRow};
use taskq::{Client, Error, TaskId};

use crate::AppState;

/// The most rows `Client::batches` and `Client::batch_members` read in one call.
const CLIENT_MAX: u32 = 1_000;

/// One more row than `limit` (capped at the client's largest page), to tell whether there is
/// a next page; and, from the rows read, whether there is one (a page of the client's largest
/// size cannot ask for one more, so a full one says there may be).
fn fetch_size(limit: u32) -> (u32, u32) {
    let limit = limit.clamp(1, CLIENT_MAX);
    (limit, (limit + 1).min(CLIENT_MAX))
}

fn more(limit: u32, fetch: u32, read: usize) -> bool {
    read > limit as usize || (fetch == limit && read == limit as usize)
}

/// A page of batches, newest first (named `name` when given, with ids below `before`), and
/// the cursor of the next page (the last id shown), if there is more.
pub(crate) async fn page(
    st: &AppState,
    name: Option<&str>,
    before: Option<u64>,
    limit: u32,
) -> Result<(Vec<BatchInfo>, Option<u64>), Error> {
    let (limit, fetch) = fetch_size(limit);
    let mut rows = st.client.batches(name, before.map(BatchId), fetch).await?;
    let more = more(limit, fetch, rows.len());
    rows.truncate(limit as usize);
    let next = if more {
        rows.last().map(|b| b.id.0)
    } else {
        None
    };
    Ok((rows, next))
}

/// A page of batch `id`'s members by task id (after task `after`), and the cursor of the next
/// page (the last task id shown), if there is more. [`Error::BatchNotFound`] for an unknown id.
pub(crate) async fn members(
    st: &AppState,
    id: BatchId,
    after: Option<u64>,
    limit: u32,
) -> Result<(Vec<BatchMemberRow>, Option<u64>), Error> {
    let (limit, fetch) = fetch_size(limit);
    let mut rows = st
        .client
        .batch_members(id, after.map(TaskId), fetch)
        .await?;
    let more = more(limit, fetch, rows.len());
    rows.truncate(limit as usize);
    let next = if more {
        rows.last().map(|m| m.task_id.0)
    } else {
        None
    };
    Ok((rows, next))
}

/// What an operator does to a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BatchAction {
    /// Cancel its waiting and pending members and its callbacks, ask its running members to
    /// stop (audited as `batch_cancel`).
    Cancel,
    /// Seal an open batch: its callbacks are released once every member has ended.
    Seal,
}

/// What became of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BatchDone {
    /// Members canceled at once, running members asked to stop, callbacks canceled.
    Canceled {
        canceled: u64,
        requested: u64,
        callbacks: u64,
    },
    /// Sealed.
    Sealed,
}

impl BatchAction {
    /// Applies it to batch `id` with `client` (acting as the request's actor).
    pub(crate) async fn apply(self, client: &Client, id: BatchId) -> Result<BatchDone, Error> {
        match self {
            Self::Cancel => client.cancel_batch(id).await.map(|c| BatchDone::Canceled {
                canceled: c.canceled,
                requested: c.cancel_requested,
                callbacks: c.callbacks_canceled,
            }),
            Self::Seal => client.seal_batch(id).await.map(|()| BatchDone::Sealed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_reads_one_more_row_unless_it_is_the_clients_largest() {
        assert_eq!(fetch_size(50), (50, 51));
        assert_eq!(fetch_size(0), (1, 2));
        assert_eq!(fetch_size(5_000), (1_000, 1_000));
        assert!(more(50, 51, 51));
        assert!(!more(50, 51, 50));
        assert!(more(1_000, 1_000, 1_000));
        assert!(!more(1_000, 1_000, 999));
    }
}
