//! The client's reads: one task, pages, counts, statistics, workers, schedules, the clock.

use super::*;

impl Client {
    /// A task by id; [`Error::NotFound`] when it does not exist (or was pruned).
    pub async fn get(&self, id: TaskId) -> Result<TaskInfo> {
        self.run(self.store.task_get(id))
            .await?
            .ok_or(Error::NotFound(id))
    }

    /// Tasks matching `filter`, ordered by id (ascending, or descending with
    /// [`ListFilter::newest_first`]): a keyset page, never an `OFFSET` scan.
    ///
    /// With a queue but no state, a page first walks at most [`Self::LIST_PROBE_IDS`] ids of
    /// the primary key from the cursor (enough for a big queue, whose tasks come often), then,
    /// if the page is not full, reads the rest through the claim index's entries of that queue
    /// (covering, so a small queue costs little however big the table). Other filters walk
    /// the primary key (with a name, the optimizer may use the `(name, ...)` index instead).
    pub async fn list(&self, filter: &ListFilter) -> Result<Vec<TaskInfo>> {
        let limit = filter.limit.unwrap_or(100).clamp(1, 10_000);
        let f = filter.store();
        if let (Some(queue), None) = (f.queue, f.state) {
            return self.list_queue(&f, queue, filter, limit).await;
        }
        if filter.newest_first {
            let before = filter.after_id.map_or(u64::MAX, |i| i.0);
            return self
                .run(self.store.task_list_desc(&f, before, 0, limit))
                .await;
        }
        let after = filter.after_id.map_or(0, |i| i.0);
        self.run(self.store.task_list(&f, after, u64::MAX, limit))
            .await
    }

    /// Pending tasks of `kind` ([`PendingKind::Scheduled`]: due later;
    /// [`PendingKind::Retrying`]: at least one attempt made, due or not), of `queue` when given,
    /// soonest `run_at` first (then by id), after the keyset cursor `(run_at, id)` of the
    /// previous page's last task; at most `limit` (1 to 10,000). Scheduled sorts the pending
    /// tasks' claim-index entries due later (no row read but the page's); retrying reads every
    /// pending row for its attempt count: both cost in proportion to the pending backlog, not
    /// the table.
    pub async fn list_pending(
        &self,
        kind: PendingKind,
        queue: Option<&str>,
        after: Option<(DateTime<Utc>, TaskId)>,
        limit: u32,
    ) -> Result<Vec<TaskInfo>> {
        let limit = limit.clamp(1, 10_000);
        let after = after.map(|(at, id)| (at, id.0));
        self.run(self.store.task_list_pending(kind, queue, after, limit))
            .await
    }

    /// Run-time percentiles per task name of the tasks that succeeded in the last `minutes`
    /// (1 to 60): p50, p95 and the longest of their last attempt (`finished_at -
    /// attempted_at`, database clock), over at most the newest [`RUN_TIMES_SAMPLE`](Self::RUN_TIMES_SAMPLE)
    /// successes of the window, by name. One statement, a range of the `(state, finished_at)`
    /// index read newest first and stopped at the sample size: its cost is bounded whatever
    /// the throughput.
    pub async fn run_times(&self, minutes: u32) -> Result<Vec<RunTimes>> {
        let minutes = minutes.clamp(1, 60);
        let rows = self
            .run(self.store.task_run_times(minutes, Self::RUN_TIMES_SAMPLE))
            .await?;
        Ok(crate::info::run_times(rows))
    }

    /// Most successes [`run_times`](Self::run_times) reads.
    pub const RUN_TIMES_SAMPLE: u32 = 10_000;

    /// Most ids of the primary key [`list`](Self::list) walks for a queue filter without a
    /// state before it turns to the claim index.
    pub const LIST_PROBE_IDS: u64 = 5_000;

    /// [`list`](Self::list) with a queue and no state: a bounded primary-key walk from the
    /// cursor, then the claim index for the ids beyond it (keyset order kept: every id the
    /// walk covers lies on the cursor's side of every id the index read returns).
    pub(super) async fn list_queue(
        &self,
        f: &TaskFilter<'_>,
        queue: &str,
        filter: &ListFilter,
        limit: u32,
    ) -> Result<Vec<TaskInfo>> {
        let (lo, hi) = self.run(self.store.task_id_bounds()).await?;
        if filter.newest_first {
            // Ids below `before`, from the newest existing one down.
            let before = filter
                .after_id
                .map_or(u64::MAX, |i| i.0)
                .min(hi.saturating_add(1));
            let floor = before.saturating_sub(Self::LIST_PROBE_IDS);
            let mut rows = self
                .run(self.store.task_list_desc(f, before, floor, limit))
                .await?;
            if (rows.len() as u32) < limit && floor > lo {
                let rest = limit - rows.len() as u32;
                let more = self.store.task_list_queue_desc(queue, f.name, floor, rest);
                rows.extend(self.run(more).await?);
            }
            return Ok(rows);
        }
        // Ids above `after`, from the oldest existing one up.
        let after = filter.after_id.map_or(0, |i| i.0).max(lo.saturating_sub(1));
        let up_to = after.saturating_add(Self::LIST_PROBE_IDS);
        let mut rows = self
            .run(self.store.task_list(f, after, up_to, limit))
            .await?;
        if (rows.len() as u32) < limit && up_to < hi {
            let rest = limit - rows.len() as u32;
            let more = self.store.task_list_queue_asc(queue, f.name, up_to, rest);
            rows.extend(self.run(more).await?);
        }
        Ok(rows)
    }

    /// Tasks that reached a terminal state per minute over the last `minutes` minutes
    /// (1 to 1,440; database clock), from `finished_at`: one entry per state and minute with
    /// at least one task, minute 0 being the last 60 seconds. Tasks already deleted by
    /// retention or purge are not counted. Reads the `(state, finished_at)` index only, so it
    /// costs in proportion to the tasks finished in the window.
    pub async fn finished_per_minute(&self, minutes: u32) -> Result<Vec<FinishedPerMinute>> {
        let minutes = minutes.clamp(1, 1_440);
        let rows = self
            .run(self.store.task_finished_per_minute(minutes))
            .await?;
        Ok(rows
            .into_iter()
            .map(|(state, minutes_ago, count)| FinishedPerMinute {
                state,
                minutes_ago,
                count,
            })
            .collect())
    }

    /// Attempts that failed per outcome and minute over the last `minutes` minutes (1 to 60;
    /// database clock), from the attempt history (`finished_at` and `outcome` of each entry):
    /// one entry per outcome and minute with at least one attempt, minute 0 being the last 60
    /// seconds. The outcomes counted are `failed`, `timed_out` and `panicked` (the handler
    /// failed) and `lease_lost` (the worker stopped renewing its lease; the minute is when the
    /// reaper took the task back). Snoozed, released, canceled and succeeded attempts are not
    /// counted.
    ///
    /// Bounded work: it reads the attempt history of the pending and running tasks due after
    /// the window's start (through the claim index; a failed attempt moves its task's
    /// `run_at` to at least its end) and of the tasks finished in the window (through the
    /// `(state, finished_at)` index), not the whole table. Not counted: attempts of tasks
    /// already deleted by retention or purge; attempts dropped from a history longer than
    /// [`MAX_ATTEMPT_ENTRIES`](crate::history::MAX_ATTEMPT_ENTRIES); and those of a pending
    /// task that [`reschedule_at`](Self::reschedule_at) moved to before the window.
    pub async fn failed_attempts_per_minute(&self, minutes: u32) -> Result<Vec<AttemptsPerMinute>> {
        let minutes = minutes.clamp(1, 60);
        let rows = self
            .run(self.store.task_failed_attempts_per_minute(minutes))
            .await?;
        Ok(rows
            .into_iter()
            .map(|(outcome, minutes_ago, count)| AttemptsPerMinute {
                outcome: AttemptOutcome::from_name(&outcome),
                minutes_ago,
                count,
            })
            .collect())
    }

    /// Order keys held back by their head (see [`Ordered`](crate::ordered::Ordered)): the head has
    /// failed at least once and is waiting for its next attempt or running again, or it died
    /// and holds its key until an operator retries or deletes it. Of `queue` when
    /// given, most tasks waiting first, at most `limit`. Reads every key that has a head (one
    /// row per key in `taskq_order_keys`), so it costs in proportion to the live keys.
    pub async fn held_keys(&self, queue: Option<&str>, limit: u32) -> Result<Vec<HeldKey>> {
        self.run(self.store.order_keys_held(queue, limit)).await
    }

    /// Number of tasks matching `filter` (`after_id` and `limit` are ignored).
    pub async fn count(&self, filter: &ListFilter) -> Result<u64> {
        self.run(self.store.task_count(&filter.store())).await
    }

    /// Counts per queue and state, ordered by queue then state ([`TaskState::ALL`]'s order),
    /// exact, with the earliest `lease_until` of the running tasks:
    /// [`stats_active`](Self::stats_active), the running rows' leases and
    /// [`stats_terminal`](Self::stats_terminal), on one connection (three consistent reads,
    /// not one snapshot). The terminal counts read every terminal task's index entry, so this
    /// costs in proportion to the table; prefer `stats_active` where pending and running are
    /// enough.
    pub async fn stats(&self) -> Result<Vec<QueueStateCount>> {
        let mut conn = self.run(self.store.acquire()).await?;
        self.run(self.store.task_stats(conn.conn())).await
    }

    /// Counts per queue of the `pending` and `running` tasks, exact, with the oldest `run_at`
    /// (`earliest_lease_until` is always `None` here: it needs the running rows; [`stats`](Self::stats)
    /// reads them). Reads only the claim index's entries of those two states, so it costs in
    /// proportion to the backlog, not to the table. Unordered.
    pub async fn stats_active(&self) -> Result<Vec<QueueStateCount>> {
        let mut conn = self.run(self.store.acquire()).await?;
        self.run(self.store.task_stats_active(conn.conn())).await
    }

    /// Counts per queue of the tasks in terminal states (`succeeded`, `dead`, `canceled`,
    /// `expired`; those retention has not deleted yet), exact, with the oldest `run_at`. A
    /// covering read of every terminal task's claim-index entry: in proportion to the table
    /// (about 0.2 to 0.5 s per million tasks), so cache it rather than call it per page view.
    /// Unordered.
    pub async fn stats_terminal(&self) -> Result<Vec<QueueStateCount>> {
        let mut conn = self.run(self.store.acquire()).await?;
        self.run(self.store.task_stats_terminal(conn.conn())).await
    }

    /// Pending tasks per queue and task name (of `queue` only, when given), ordered by queue and
    /// name: the way to spot tasks whose name no running worker handles (they stay pending).
    /// Reads every pending row's index entry (one covering scan), so it costs in proportion to
    /// the pending backlog.
    pub async fn pending_by_name(&self, queue: Option<&str>) -> Result<Vec<PendingNameCount>> {
        let mut conn = self.run(self.store.acquire()).await?;
        self.run(self.store.task_pending_by_name(conn.conn(), queue))
            .await
    }

    /// The workers recorded in the database, oldest start first: alive, lost (no heartbeat for
    /// two of their heartbeat intervals) or stopped (see [`WorkerInfo::status`]), kept for
    /// [`WORKER_ROW_RETENTION`](crate::defaults::WORKER_ROW_RETENTION) after their last beat, each
    /// with the age of that beat and the number of tasks it is running. One statement (a
    /// `GROUP BY` over the running tasks).
    pub async fn workers(&self) -> Result<Vec<WorkerInfo>> {
        let mut conn = self.run(self.store.acquire()).await?;
        let rows = self.run(self.store.worker_list(conn.conn())).await?;
        Ok(rows.into_iter().map(WorkerInfo::from_row).collect())
    }

    /// The due pending tasks, per queue and task name, that no live worker would claim: no
    /// alive worker (see [`WorkerInfo::status`]) both works the queue and registers the name.
    /// They stay pending, silently, until such a worker runs (or they are canceled); workers
    /// also log them at WARN once a minute for their own queues. Two statements:
    /// [`pending_by_name`](Self::pending_by_name) (a scan of the pending backlog's index
    /// entries) and [`workers`](Self::workers).
    pub async fn unhandled(&self) -> Result<Vec<PendingNameCount>> {
        let pending = self.pending_by_name(None).await?;
        if pending.iter().all(|p| p.due == 0) {
            return Ok(Vec::new());
        }
        let workers = self.workers().await?;
        Ok(crate::info::unhandled(pending, &workers))
    }

    /// Every recurring schedule recorded in the database, by name.
    pub async fn schedules(&self) -> Result<Vec<ScheduleInfo>> {
        self.run(self.store.schedule_list()).await
    }

    /// Rows changed per statement by the bulk operations ([`Client::retry_all_dead`],
    /// [`Client::purge`]): small, so each statement holds its row locks only briefly.
    pub const BATCH: u32 = 500;

    /// The database clock now (`UTC_TIMESTAMP(6)`): the clock every stored time comes from,
    /// so ages and lease expiries should be computed against it, not the local clock.
    pub async fn db_now(&self) -> Result<DateTime<Utc>> {
        self.run(self.store.db_now()).await
    }
}
