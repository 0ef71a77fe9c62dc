//! The client's bulk actions: cancel or retry every task a filter matches, retry every dead
//! task, purge terminal tasks; each in batches, audited.

use super::*;
use taskq_driver::rules;

/// Which tasks a bulk operation ([`Client::cancel_where`], [`Client::retry_where`]) touches:
/// every field given must match (`None`: any).
#[derive(Debug, Clone, Default)]
pub struct BulkFilter {
    /// Only this queue.
    pub queue: Option<String>,
    /// Only this task name.
    pub name: Option<String>,
    /// Only this state (`cancel_where`: `pending` (with the `waiting` tasks behind their key's
    /// head), `waiting` or `running`, default all; `retry_where`: `dead`, the default).
    /// Another state is [`Error::InvalidOption`].
    pub state: Option<TaskState>,
    /// Only tasks enqueued (`created_at`) at least this long ago, database clock (capped at
    /// 100 years).
    pub older_than: Option<std::time::Duration>,
}

impl BulkFilter {
    fn store(&self, state: TaskState) -> TaskFilter<'_> {
        TaskFilter {
            queue: self.queue.as_deref(),
            state: Some(state),
            name: self.name.as_deref(),
        }
    }
    /// The filter as recorded in the audit trail.
    fn detail(&self) -> serde_json::Value {
        serde_json::json!({
            "queue": self.queue, "name": self.name, "state": self.state,
            "older_than_secs": self.older_than.map(|d| d.as_secs()),
        })
    }
    fn age_us(&self) -> i64 {
        const CAP_US: u128 = 100 * 366 * 86_400 * 1_000_000;
        self.older_than
            .map_or(0, |d| d.as_micros().min(CAP_US) as i64)
    }
}

/// What [`Client::cancel_where`] did (in a dry run: what it would do, as counts of matching
/// tasks).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct BulkCanceled {
    /// Pending and waiting tasks canceled at once.
    pub canceled: u64,
    /// Running tasks whose cancel was requested (their workers stop them at the next beat).
    pub requested: u64,
}

/// The states [`Client::purge`] deletes: `state`, which must be terminal, or every terminal one.
pub(super) fn purge_states(state: Option<TaskState>) -> Result<Vec<TaskState>> {
    match state {
        Some(s) if !s.is_terminal() => Err(Error::InvalidOption(format!(
            "cannot purge {s} tasks: only terminal states (succeeded, dead, canceled, expired)"
        ))),
        Some(s) => Ok(vec![s]),
        None => Ok(TaskState::ALL
            .into_iter()
            .filter(|s| s.is_terminal())
            .collect()),
    }
}

impl Client {
    /// Moves every dead task (of `queue`, or of all queues when `None`) back to pending with
    /// its attempts reset and its epoch incremented, in batches of [`Client::BATCH`] rows
    /// (one short statement each). Tasks that die again while this runs are left dead. Unique
    /// tasks are retried one statement each, like [`Client::retry_dead`]; one whose identity
    /// another task holds now is left dead (and logged). Returns how many tasks were moved.
    pub async fn retry_all_dead(&self, queue: Option<&str>) -> Result<u64> {
        let mut total = 0;
        let res = self.retry_all_dead_run(queue, &mut total).await;
        let detail = serde_json::json!({ "queue": queue, "retried": total });
        self.record_bulk("bulk_retry", queue, detail, total, res)
            .await?;
        Ok(total)
    }

    /// The statements of [`Client::retry_all_dead`], counting into `total`.
    pub(super) async fn retry_all_dead_run(
        &self,
        queue: Option<&str>,
        total: &mut u64,
    ) -> Result<()> {
        let started = self.run(self.store.db_now()).await?;
        loop {
            let n = self
                .run(
                    self.store
                        .task_retry_dead_batch(queue, started, Self::BATCH),
                )
                .await?;
            *total += n;
            if n < u64::from(Self::BATCH) {
                break;
            }
        }
        let mut after = 0;
        loop {
            let ids = self
                .store
                .task_dead_unique_ids(queue, started, after, Self::BATCH)
                .await?;
            for &id in &ids {
                match self.run(self.retry_dead_one(id)).await? {
                    RetryDead::Retried => *total += 1,
                    RetryDead::NotDead => {}
                    RetryDead::IdentityHeld(holder) => tracing::warn!(
                        task_id = %id, holder = %holder,
                        "taskq: dead task left dead: its unique identity is held by a newer task"
                    ),
                }
            }
            match ids.last() {
                Some(last) if ids.len() == Self::BATCH as usize => after = last.0,
                _ => return Ok(()),
            }
        }
    }

    /// Records a bulk operation that changed `changed` rows (nothing when none) and returns
    /// `res`: an operation interrupted by an error is recorded with what it did so far and
    /// `"incomplete": true`.
    pub(super) async fn record_bulk(
        &self,
        action: &'static str,
        queue: Option<&str>,
        mut detail: serde_json::Value,
        changed: u64,
        res: Result<()>,
    ) -> Result<()> {
        if changed == 0 {
            return res;
        }
        if res.is_err() {
            detail["incomplete"] = true.into();
        }
        let recorded = self.record(&Action::queue(action, queue, detail)).await;
        res.and(recorded)
    }

    /// Cancels every task matching `filter`, in batches of [`Client::BATCH`] rows (one short
    /// statement, or transaction, each): pending and waiting ones at once (freeing unique
    /// identities, like [`Client::cancel`]; a canceled key's head promotes its key's next
    /// task), running ones by a cancel request (see [`Client::cancel`]). The waiting tasks
    /// (ordered tasks behind their key's head) are canceled first, then the pending ones, so
    /// a canceled head never promotes a task the filter matches. With `dry_run`, changes
    /// nothing and returns how many tasks match. `state: pending` includes the waiting tasks;
    /// `waiting` is only those; a `state` other than `pending`/`waiting`/`running` is
    /// [`Error::InvalidOption`]. Tasks enqueued while it runs may or may not be included.
    pub async fn cancel_where(&self, filter: &BulkFilter, dry_run: bool) -> Result<BulkCanceled> {
        use TaskState::{Pending, Running, Waiting};
        let states: &[TaskState] = match filter.state {
            None => &[Waiting, Pending, Running],
            Some(Pending) => &[Waiting, Pending],
            Some(Waiting) => &[Waiting],
            Some(Running) => &[Running],
            Some(s) => {
                return Err(Error::InvalidOption(format!(
                    "cannot cancel {s} tasks: only pending, waiting or running ones"
                )));
            }
        };
        let mut out = BulkCanceled::default();
        let res = self
            .cancel_where_run(filter, states, dry_run, &mut out)
            .await;
        if !dry_run {
            crate::metrics::canceled_n(out.canceled);
            let mut detail = filter.detail();
            detail["canceled"] = out.canceled.into();
            detail["cancel_requested"] = out.requested.into();
            let changed = out.canceled + out.requested;
            let queue = filter.queue.as_deref();
            self.record_bulk("bulk_cancel", queue, detail, changed, res)
                .await?;
        } else {
            res?;
        }
        Ok(out)
    }

    /// The statements of [`Client::cancel_where`], counting into `out`.
    pub(super) async fn cancel_where_run(
        &self,
        filter: &BulkFilter,
        states: &[TaskState],
        dry_run: bool,
        out: &mut BulkCanceled,
    ) -> Result<()> {
        let age_us = filter.age_us();
        for &state in states {
            let f = filter.store(state);
            let n = if dry_run {
                self.run(self.store.task_bulk_count(&f, age_us)).await?
            } else {
                let mut after = 0;
                loop {
                    let batch = self
                        .run(self.store.task_bulk_ids(&f, age_us, after, Self::BATCH))
                        .await?;
                    let ids: Vec<u64> = batch.iter().map(|(id, _)| *id).collect();
                    if let Some(&last) = ids.last() {
                        if rules::cancels_at_once(state) {
                            out.canceled += self.run(self.store.task_cancel_batch(&ids)).await?;
                        } else {
                            out.requested +=
                                self.run(self.store.task_request_cancel_batch(&ids)).await?;
                        }
                        after = last;
                    }
                    if ids.len() < Self::BATCH as usize {
                        break;
                    }
                }
                continue;
            };
            if rules::cancels_at_once(state) {
                out.canceled += n;
            } else {
                out.requested += n;
            }
        }
        Ok(())
    }

    /// Moves every dead task matching `filter` back to pending (attempts reset, epoch
    /// incremented), in batches of [`Client::BATCH`] rows; a unique task is retried one
    /// statement each like [`Client::retry_dead`] and left dead (logged) when its identity is
    /// held by another task. With `dry_run`, changes nothing and returns how many dead tasks
    /// match. A `state` other than `dead` is [`Error::InvalidOption`]. Returns how many tasks
    /// were moved.
    pub async fn retry_where(&self, filter: &BulkFilter, dry_run: bool) -> Result<u64> {
        if let Some(s) = filter.state.filter(|s| *s != TaskState::Dead) {
            return Err(Error::InvalidOption(format!(
                "cannot retry {s} tasks: only dead ones"
            )));
        }
        let f = filter.store(TaskState::Dead);
        let age_us = filter.age_us();
        if dry_run {
            return self.run(self.store.task_bulk_count(&f, age_us)).await;
        }
        let mut total = 0;
        let res = self.retry_where_run(&f, age_us, &mut total).await;
        let mut detail = filter.detail();
        detail["retried"] = total.into();
        let queue = filter.queue.as_deref();
        self.record_bulk("bulk_retry", queue, detail, total, res)
            .await?;
        Ok(total)
    }

    /// The statements of [`Client::retry_where`], counting into `total`.
    pub(super) async fn retry_where_run(
        &self,
        f: &TaskFilter<'_>,
        age_us: i64,
        total: &mut u64,
    ) -> Result<()> {
        let mut after = 0;
        loop {
            let batch = self
                .run(self.store.task_bulk_ids(f, age_us, after, Self::BATCH))
                .await?;
            let plain: Vec<u64> = batch.iter().filter(|b| !b.1).map(|b| b.0).collect();
            if !plain.is_empty() {
                *total += self.run(self.store.task_retry_dead_ids(&plain)).await?;
            }
            for &(id, _) in batch.iter().filter(|b| b.1) {
                match self.run(self.retry_dead_one(TaskId(id))).await? {
                    RetryDead::Retried => *total += 1,
                    RetryDead::NotDead => {}
                    RetryDead::IdentityHeld(holder) => tracing::warn!(
                        task_id = id, holder = %holder,
                        "taskq: dead task left dead: its unique identity is held by a newer task"
                    ),
                }
            }
            match batch.last() {
                Some(&(last, _)) if batch.len() == Self::BATCH as usize => after = last,
                _ => return Ok(()),
            }
        }
    }

    /// How many tasks [`purge`](Self::purge) with the same arguments would delete now (its
    /// dry run; a non-terminal `state` gives [`Error::InvalidOption`]).
    pub async fn purge_count(
        &self,
        state: Option<TaskState>,
        older_than: std::time::Duration,
    ) -> Result<u64> {
        let mut total = 0;
        for s in purge_states(state)? {
            total += self
                .run(self.store.task_prune_count(s, older_than.as_secs()))
                .await?;
        }
        Ok(total)
    }

    /// Deletes terminal tasks (`succeeded`, `dead`, `canceled`, `expired`; only `state` when given) that
    /// finished more than `older_than` ago (whole seconds, database clock), in batches of
    /// [`Client::BATCH`] rows. A non-terminal `state` gives [`Error::InvalidOption`]. Returns
    /// how many tasks were deleted.
    pub async fn purge(
        &self,
        state: Option<TaskState>,
        older_than: std::time::Duration,
    ) -> Result<u64> {
        let states = purge_states(state)?;
        let age_secs = older_than.as_secs();
        let mut total = 0;
        let res = self.purge_run(&states, age_secs, &mut total).await;
        let detail = serde_json::json!({
            "state": state, "older_than_secs": age_secs, "purged": total
        });
        self.record_bulk("purge", None, detail, total, res).await?;
        Ok(total)
    }

    /// The statements of [`Client::purge`], counting into `total`.
    pub(super) async fn purge_run(
        &self,
        states: &[TaskState],
        age_secs: u64,
        total: &mut u64,
    ) -> Result<()> {
        let mut conn = self.run(self.store.acquire()).await?;
        for &s in states {
            loop {
                let n = self
                    .run(self.store.task_prune(conn.conn(), s, age_secs, Self::BATCH))
                    .await?;
                *total += n;
                if n < u64::from(Self::BATCH) {
                    break;
                }
            }
        }
        Ok(())
    }
}
