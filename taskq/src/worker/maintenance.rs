//! Maintenance inside every worker: the reaper (expired leases back to pending, or to dead
//! when attempts are exhausted), retention (deleting old terminal tasks in small batches,
//! the identities of unique windows that have ended, the `taskq_workers` rows of workers
//! not seen for [`WORKER_ROW_RETENTION`](crate::defaults::WORKER_ROW_RETENTION), and audit rows older
//! than the longest terminal-task retention), and the check for due tasks that no live worker
//! handles (logged at WARN).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::observe::{self, OutcomeEvent, TaskOutcome};
use super::{Shared, WorkerStats, follow, within};
use crate::backend::{LapsedRow, ReapRow, Reaped};
use crate::info::WorkerInfo;
use crate::task::followup::{DeadTask, payload_value};
use crate::task::{TaskId, TaskState};
use crate::wake;

/// Rows per reaper or retention statement: small, so no statement holds locks for long.
const BATCH: u32 = 500;

/// How often the unhandled-task check runs (see [`unhandled`]); the first check comes one
/// heartbeat interval after the worker starts, once the workers started with it have
/// recorded themselves.
pub(crate) const UNHANDLED_CHECK_INTERVAL: Duration = Duration::from_secs(60);

pub(crate) async fn run(shared: Arc<Shared>) {
    let mut next_prune = Instant::now();
    let mut next_backlog = Instant::now();
    let mut next_event_metrics = Instant::now();
    let mut event_topics: HashSet<String> = HashSet::new();
    let mut next_unhandled = Instant::now() + shared.cfg.heartbeat;
    // This worker's turn among the alive workers (its rank, and how many), as the last
    // unhandled-task check read them: until then, every pass is its own.
    let mut turn = Turn::default();
    loop {
        if Instant::now() >= next_unhandled {
            if let Some(t) = unhandled(&shared).await {
                turn = t;
            }
            next_unhandled = Instant::now() + UNHANDLED_CHECK_INTERVAL;
        }
        if turn.is_mine(shared.cfg.reaper_interval) {
            reap(&shared).await;
            stranded(&shared).await;
            workflow_steps_stranded(&shared).await;
            batch_members_stranded(&shared).await;
            if Instant::now() >= next_prune {
                prune(&shared).await;
                // Each worker prunes on its turns, once per `of` intervals: the fleet about
                // once per interval.
                next_prune = Instant::now() + shared.cfg.retention.interval * turn.of as u32;
            }
        }
        if let Some(every) = shared.cfg.backlog_interval
            && Instant::now() >= next_backlog
        {
            backlog(&shared).await;
            next_backlog = Instant::now() + every;
        }
        if let Some(every) = shared.cfg.event_metrics_interval
            && Instant::now() >= next_event_metrics
        {
            event_metrics(&shared, &mut event_topics).await;
            next_event_metrics = Instant::now() + every;
        }
        tokio::select! {
            _ = tokio::time::sleep(shared.cfg.reaper_interval) => {}
            _ = shared.stopped() => return,
        }
    }
}

/// A worker's turn at the fleet-wide passes (the reaper, the sweeps of stranded order keys,
/// workflow steps and batch members, retention): the alive workers take turns, one pass per
/// `reaper_interval` for the whole fleet instead of one per worker, so an idle fleet's cost
/// does not grow with its size. The ticks are the wall clock's multiples of the interval;
/// tick `k` is the turn of the worker ranked `k mod of` by id among the alive ones. A worker
/// that stopped without a goodbye keeps its turns (unrun) until the others' next check sees it
/// gone (`WorkerInfo::lost_after`, and up to [`UNHANDLED_CHECK_INTERVAL`]); the passes are
/// idempotent, so two workers whose views differ for a while at most run a tick twice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Turn {
    /// This worker's rank among the alive workers (by id).
    pub rank: usize,
    /// How many workers are alive (this one included).
    pub of: usize,
}

impl Default for Turn {
    fn default() -> Self {
        Self { rank: 0, of: 1 }
    }
}

impl Turn {
    /// This worker's turn among `alive` (the ids of the alive workers, in any order; `me`
    /// counted whether or not it is among them).
    pub(crate) fn among<'a>(alive: impl IntoIterator<Item = &'a str>, me: &str) -> Self {
        let mut ids: Vec<&str> = alive.into_iter().filter(|id| *id != me).collect();
        ids.push(me);
        ids.sort_unstable();
        ids.dedup();
        let rank = ids.iter().position(|id| *id == me).unwrap_or(0);
        Self {
            rank,
            of: ids.len(),
        }
    }

    /// Whether the tick of the wall clock now falls in this worker's turn.
    fn is_mine(&self, interval: std::time::Duration) -> bool {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        self.is_mine_at(now, interval)
    }

    /// Whether tick `since_epoch / interval` is this worker's.
    pub(crate) fn is_mine_at(
        &self,
        since_epoch: std::time::Duration,
        interval: std::time::Duration,
    ) -> bool {
        if self.of <= 1 {
            return true;
        }
        let tick = since_epoch.as_micros() / interval.as_micros().max(1);
        (tick % self.of as u128) as usize == self.rank
    }
}

/// Advances the order keys left stranded by a process that ended between the commit that
/// ended a key's head and the key's deferred advance (see `Store::order_keys_advance_stranded`),
/// up to [`BATCH`] per pass.
async fn stranded(shared: &Shared) {
    match within!(shared, |c| shared
        .store
        .order_keys_advance_stranded(c, BATCH))
    .await
    {
        Ok(0) => {}
        Ok(n) => tracing::info!(keys = n, "taskq: stranded order keys advanced"),
        Err(e) => {
            WorkerStats::add(&shared.stats.db_errors, 1);
            tracing::warn!(error = %e, "taskq: advancing stranded order keys failed");
        }
    }
}

/// Settles the workflow steps that ended without their worker's write-back settling the steps
/// after them (a reap, an expiry at claim, an operator's cancel or delete), up to [`BATCH`]
/// ended steps per pass (see `Store::workflow_settle_stranded`), and wakes the claim loops of
/// the queues of the steps it made due.
async fn workflow_steps_stranded(shared: &Shared) {
    match within!(shared, |c| shared.store.workflow_settle_stranded(c, BATCH)).await {
        Ok(s) if s.released.is_empty() && s.canceled.is_empty() => {}
        Ok(s) => {
            for (_, q) in &s.released {
                crate::wake::notify(q);
            }
            tracing::info!(
                released = s.released.len(),
                canceled = s.canceled.len(),
                "taskq: workflow steps settled after an end the write-back did not settle"
            );
        }
        Err(e) => {
            WorkerStats::add(&shared.stats.db_errors, 1);
            tracing::warn!(error = %e, "taskq: settling ended workflow steps failed");
        }
    }
}

/// Counts the batch members' ends the write-back did not count (a reap, an expiry at claim, an
/// operator's cancel, retry or delete, a member whose batch row a producer held), up to
/// [`BATCH`] members per pass (see `Store::batch_settle_stranded`), and wakes the claim loops
/// of the queues of the callbacks it made due.
async fn batch_members_stranded(shared: &Shared) {
    match within!(shared, |c| shared.store.batch_settle_stranded(c, BATCH)).await {
        Ok(s) if s.members == 0 => {}
        Ok(s) => {
            for (_, q) in &s.released {
                crate::wake::notify(q);
            }
            tracing::info!(
                members = s.members,
                callbacks = s.released.len(),
                "taskq: batch members counted after an end the write-back did not count"
            );
        }
        Err(e) => {
            WorkerStats::add(&shared.stats.db_errors, 1);
            tracing::warn!(error = %e, "taskq: counting batch members failed");
        }
    }
}

/// Reaps expired leases in rounds of [`BATCH`]: a plain read of the expired rows, then the
/// reap of those rows (see `Store::task_reap`). A task whose reap moves it to dead gets its
/// `on_dead` follow-up in the reap's transaction. A last attempt whose name this worker does
/// not register (only a worker that registers it knows its follow-up) is parked back to
/// pending instead: the first worker that registers the name claims it and ends it dead
/// without running it (`executor`), so it neither stays `running` nor counts against its
/// queue's limit meanwhile.
///
/// With follow-ups, a round's reap is split into statements within the server's byte budget
/// (`backend::budget`), and a follow-up too big for any statement is dropped first. A reap the
/// database rejects deterministically is split until the row is alone, which is then reaped
/// without its follow-up (logged and counted as lost, see `follow`): one bad row never stalls
/// the reaper.
async fn reap(shared: &Shared) {
    let mut total = 0;
    // Observers need to know exactly which rows were reaped.
    let exact = !shared.observers.is_empty();
    'rounds: loop {
        let rows = match within!(shared, |c| shared.store.task_lapsed(
            c,
            &shared.names,
            BATCH
        ))
        .await
        {
            Ok(rows) => rows,
            Err(e) => {
                WorkerStats::add(&shared.stats.db_errors, 1);
                tracing::warn!(error = %e, "taskq: reaper failed");
                break;
            }
        };
        if rows.is_empty() {
            break;
        }
        let found = rows.len();
        let mut plan: Vec<ReapRow> = rows.iter().map(|r| plan(shared, r)).collect();
        let name = |id: u64| {
            rows.iter()
                .find(|r| r.id == id)
                .map_or("", |r| r.name.as_str())
        };
        // Chunks still to reap, the first last; a rejected chunk comes back as its halves.
        let mut pending: Vec<Vec<ReapRow>> = Vec::new();
        if plan.iter().any(|r| r.follow_up.is_some()) {
            let budget = match follow::budget(shared).await {
                Ok(b) => b,
                Err(e) => {
                    WorkerStats::add(&shared.stats.db_errors, 1);
                    tracing::warn!(error = %e, "taskq: reaper failed");
                    break;
                }
            };
            for r in plan.iter_mut() {
                follow::fit(shared, &mut r.follow_up, &budget, r.id, name(r.id));
            }
            let sizes = plan
                .iter()
                .map(|r| 48 + r.follow_up.as_ref().map_or(0, |f| f.json_len()));
            for n in budget.chunks(sizes.collect::<Vec<_>>(), BATCH as usize) {
                pending.push(plan.drain(..n).collect());
            }
            pending.reverse();
        } else {
            pending.push(plan);
        }
        while let Some(mut chunk) = pending.pop() {
            match within!(shared, |c| shared.store.task_reap(c, &chunk, exact)).await {
                Ok(done) => total += reaped(shared, &rows, &done),
                Err(e) if e.is_deterministic() && chunk.iter().any(|r| r.follow_up.is_some()) => {
                    WorkerStats::add(&shared.stats.db_errors, 1);
                    if chunk.len() > 1 {
                        tracing::warn!(error = %e, tasks = chunk.len(),
                            "taskq: reap rejected; splitting it to isolate the row");
                        let second = chunk.split_off(chunk.len() / 2);
                        pending.push(second);
                    } else {
                        let r = &mut chunk[0];
                        follow::refused(shared, &mut r.follow_up, r.id, name(r.id), &e);
                    }
                    pending.push(chunk);
                }
                Err(e) => {
                    WorkerStats::add(&shared.stats.db_errors, 1);
                    tracing::warn!(error = %e, "taskq: reaper failed");
                    break 'rounds;
                }
            }
        }
        if found < BATCH as usize {
            break;
        }
    }
    if total > 0 {
        WorkerStats::add(&shared.stats.reaped, total);
        crate::metrics::reaped(total);
        tracing::info!(reaped = total, "taskq: expired leases reaped");
        for q in shared.cfg.queues.keys() {
            wake::notify(q);
        }
    }
}

/// Counts and reports one reap statement's work; returns how many rows it reaped.
fn reaped(shared: &Shared, rows: &[LapsedRow], done: &Reaped) -> u64 {
    WorkerStats::add(&shared.stats.follow_ups, done.followed.len() as u64);
    for id in &done.followed {
        if let Some(r) = rows.iter().find(|r| r.id == *id) {
            crate::metrics::follow_up(&r.name, "on_dead");
        }
    }
    for (id, state) in &done.rows {
        let Some(r) = rows.iter().find(|r| r.id == *id) else {
            continue;
        };
        observe::emit(shared, || OutcomeEvent {
            task_id: TaskId(r.id),
            name: r.name.as_str().into(),
            queue: r.queue.as_str().into(),
            attempt: r.attempt,
            outcome: TaskOutcome::Reaped(*state),
            error: Some(reap_error(r)),
            duration: None,
            follow_up: done.followed.contains(id),
        });
    }
    done.reaped
}

/// Logs (one WARN line) the due pending tasks of this worker's queues that no live worker
/// handles: no alive worker works the queue and registers the task's name, so they stay
/// pending, silently. One worker per queue checks it, the alive one with the smallest id
/// among those that record their names (this worker counting as alive): the live workers'
/// rows (one statement), then per queue it checks, the pending tasks per name (one scan of
/// that queue's pending index entries). Returns this worker's [`Turn`] among the alive
/// workers it read (`None` when the read failed).
async fn unhandled(shared: &Shared) -> Option<Turn> {
    let workers: Vec<WorkerInfo> = match within!(shared, |c| shared.store.worker_list(c)).await {
        Ok(rows) => rows.into_iter().map(WorkerInfo::from_row).collect(),
        Err(e) => {
            WorkerStats::add(&shared.stats.db_errors, 1);
            tracing::warn!(error = %e, "taskq: reading live workers failed");
            return None;
        }
    };
    let me: &str = &shared.worker_id;
    let turn = Turn::among(
        workers.iter().filter(|w| w.alive).map(|w| w.id.as_str()),
        me,
    );
    let mut found = Vec::new();
    for queue in shared.cfg.queues.keys() {
        let checker = workers
            .iter()
            .filter(|w| w.alive && w.names.is_some() && w.queues.contains_key(queue))
            .map(|w| w.id.as_str())
            .chain([me])
            .min();
        if checker != Some(me) {
            continue;
        }
        let pending = match within!(shared, |c| shared
            .store
            .task_pending_by_name(c, Some(queue)))
        .await
        {
            Ok(rows) => rows,
            Err(e) => {
                WorkerStats::add(&shared.stats.db_errors, 1);
                tracing::warn!(error = %e, queue = %queue, "taskq: counting pending tasks per name failed");
                continue;
            }
        };
        // This worker handles its own names, whether or not its row is written yet.
        let pending = pending
            .into_iter()
            .filter(|p| !shared.handlers.contains_key(p.name.as_str()))
            .collect();
        found.extend(crate::info::unhandled(pending, &workers));
    }
    if found.is_empty() {
        return Some(turn);
    }
    let due: u64 = found.iter().map(|p| p.due).sum();
    let tasks = found
        .iter()
        .map(|p| {
            format!(
                "{}/{}: {} due since {}",
                p.queue,
                p.name,
                p.due,
                p.oldest_run_at.format("%Y-%m-%dT%H:%M:%SZ")
            )
        })
        .collect::<Vec<_>>()
        .join(", ");
    tracing::warn!(
        worker_id = %shared.worker_id,
        due,
        tasks = %tasks,
        "taskq: due tasks that no live worker handles (no alive worker works their queue and \
         registers their name), so they stay pending: run a worker that registers them, or \
         cancel them (`taskq cancel --name NAME --state pending`)"
    );
    Some(turn)
}

/// The reap of one expired row, with its `on_dead` follow-up when the reap moves it to dead.
fn plan(shared: &Shared, r: &LapsedRow) -> ReapRow {
    let follow_up = if r.goes_dead() {
        follow::dead(
            shared,
            shared.handlers.get(r.name.as_str()),
            || DeadTask {
                id: TaskId(r.id),
                name: r.name.clone(),
                queue: r.queue.clone(),
                attempts: r.attempt,
                max_attempts: r.max_attempts,
                last_error: reap_error(r),
                payload: payload_value(r.payload.as_deref().unwrap_or_default()),
            },
            r.lease_epoch,
            r.trace_context.as_deref(),
        )
    } else {
        None
    };
    ReapRow {
        id: r.id,
        epoch: r.lease_epoch,
        frees: r.frees(),
        canceled: r.canceled,
        parks: r.parks(),
        order_ends: r.order_ends(),
        follow_up,
    }
}

/// The error the reap stores (the same text as the reap's SQL writes).
fn reap_error(r: &LapsedRow) -> String {
    format!(
        "lease expired (worker {}, attempt {})",
        r.worker_id.as_deref().unwrap_or("?"),
        r.attempt
    )
}

async fn prune(shared: &Shared) {
    // Identities of ended windows: not task retention (their tasks may be kept much longer),
    // but the end of what they stand for; always pruned.
    loop {
        match within!(shared, |c| shared.store.unique_prune_expired(c, BATCH)).await {
            Ok(n) if n < u64::from(BATCH) || shared.stopping() => break,
            Ok(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            Err(e) => {
                WorkerStats::add(&shared.stats.db_errors, 1);
                tracing::warn!(error = %e, "taskq: pruning ended unique windows failed");
                break;
            }
        }
    }
    // Rows of workers not seen for a day (stopped, or gone without a goodbye).
    loop {
        let age = crate::defaults::WORKER_ROW_RETENTION.as_secs();
        match within!(shared, |c| shared.store.worker_prune(c, age, BATCH)).await {
            Ok(n) if n < u64::from(BATCH) || shared.stopping() => break,
            Ok(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            Err(e) => {
                WorkerStats::add(&shared.stats.db_errors, 1);
                tracing::warn!(error = %e, "taskq: pruning old worker rows failed");
                break;
            }
        }
    }
    let r = shared.cfg.retention;
    // Audit rows: kept as long as the longest-kept terminal tasks (forever if any is kept
    // forever), so an operator action outlives the tasks it touched.
    let keep_audit = [r.succeeded, r.dead, r.canceled, r.expired]
        .into_iter()
        .try_fold(Duration::ZERO, |longest, keep| keep.map(|k| longest.max(k)));
    if let Some(keep) = keep_audit {
        loop {
            let age = keep.as_secs();
            match within!(shared, |c| shared.store.audit_prune(c, age, BATCH)).await {
                Ok(n) if n < u64::from(BATCH) || shared.stopping() => break,
                Ok(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                Err(e) => {
                    WorkerStats::add(&shared.stats.db_errors, 1);
                    tracing::warn!(error = %e, "taskq: pruning old audit rows failed");
                    break;
                }
            }
        }
    }
    for (state, keep) in [
        (TaskState::Succeeded, r.succeeded),
        (TaskState::Dead, r.dead),
        (TaskState::Canceled, r.canceled),
        (TaskState::Expired, r.expired),
    ] {
        let Some(keep) = keep else { continue };
        loop {
            let age = keep.as_secs();
            match within!(shared, |c| shared.store.task_prune(c, state, age, BATCH)).await {
                Ok(n) => {
                    WorkerStats::add(&shared.stats.pruned, n);
                    crate::metrics::pruned(n);
                    if n < u64::from(BATCH) || shared.stopping() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Err(e) => {
                    WorkerStats::add(&shared.stats.db_errors, 1);
                    tracing::warn!(error = %e, "taskq: retention failed");
                    break;
                }
            }
        }
    }
    // Workflows whose steps' tasks retention has all pruned: their own rows go too (the
    // oldest BATCH workflows are looked at per pass).
    match within!(shared, |c| shared.store.workflow_prune(c, BATCH)).await {
        Ok(0) => {}
        Ok(n) => tracing::debug!(workflows = n, "taskq: pruned finished workflows"),
        Err(e) => {
            WorkerStats::add(&shared.stats.db_errors, 1);
            tracing::warn!(error = %e, "taskq: pruning finished workflows failed");
        }
    }
    // Batches whose members' tasks retention has all pruned and whose callbacks have ended.
    match within!(shared, |c| shared.store.batch_prune(c, BATCH)).await {
        Ok(0) => {}
        Ok(n) => tracing::debug!(batches = n, "taskq: pruned finished batches"),
        Err(e) => {
            WorkerStats::add(&shared.stats.db_errors, 1);
            tracing::warn!(error = %e, "taskq: pruning finished batches failed");
        }
    }
}

/// Publishes the per queue × state backlog gauges (zero for states with no rows).
async fn backlog(shared: &Shared) {
    match within!(shared, |c| shared.store.task_stats(c)).await {
        Ok(rows) => {
            let mut queues: Vec<&str> = shared.cfg.queues.keys().map(String::as_str).collect();
            queues.extend(rows.iter().map(|r| r.queue.as_str()));
            queues.sort_unstable();
            queues.dedup();
            for q in queues {
                for st in TaskState::ALL {
                    let n = rows
                        .iter()
                        .find(|r| r.queue == q && r.state == st)
                        .map_or(0, |r| r.count);
                    crate::metrics::backlog(q, st.as_str(), n);
                }
            }
        }
        Err(e) => {
            WorkerStats::add(&shared.stats.db_errors, 1);
            tracing::warn!(error = %e, "taskq: backlog metrics query failed");
        }
    }
}

/// Publishes the events' per-topic gauges; topics published before that have no figures now
/// (nothing pending, nothing held) are set to 0.
async fn event_metrics(shared: &Shared, published: &mut HashSet<String>) {
    let limit = shared.cfg.statement_timeout;
    let read = async {
        let rows = shared.store.event_topic_stats().await?;
        let now = shared.store.db_now().await?;
        Ok::<_, sqlx::Error>((rows, now))
    };
    match tokio::time::timeout(limit, read).await {
        Ok(Ok((rows, now))) => {
            let mut current = HashSet::new();
            for r in rows {
                let t = crate::client::EventStats::at(r, now);
                crate::metrics::event_topic(&t.topic, t.pending, t.lag, t.held_keys);
                current.insert(t.topic);
            }
            for gone in published.difference(&current) {
                crate::metrics::event_topic(gone, 0, Duration::ZERO, 0);
            }
            *published = current;
        }
        Ok(Err(e)) => {
            WorkerStats::add(&shared.stats.db_errors, 1);
            tracing::warn!(error = %e, "taskq: event metrics query failed");
        }
        Err(_) => {
            WorkerStats::add(&shared.stats.statement_timeouts, 1);
            tracing::warn!(timeout = ?limit, "taskq: event metrics query timed out");
        }
    }
}

/// Keeps `Shared::paused` and `Shared::limited` in step with `taskq_queues` (one query per
/// `poll_max`); wakes the claim loop of a queue that was resumed or whose limits were cleared.
///
/// Where claims see the controls themselves (`Handle::claims_see_controls`: a claim of a queue
/// paused or limited since this read says so, and the claim loop reads them at once), the
/// query runs only while one of this worker's queues is paused or limited, to see it resumed or
/// its limits cleared: a worker whose queues have none costs no statement here.
pub(crate) async fn watch_controls(shared: Arc<Shared>) {
    let claims_see = shared.store.claims_see_controls();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(shared.cfg.poll_max) => {}
            _ = shared.stopped() => return,
        }
        if claims_see && !shared.any_queue_controlled() {
            continue;
        }
        refresh_controls(&shared).await;
    }
}

/// Reads the paused and limited queues once.
pub(crate) async fn refresh_controls(shared: &Shared) {
    match within!(shared, control, |c| shared.store.queue_controls(c)).await {
        Ok(rows) => {
            let paused_now: HashSet<String> = rows
                .iter()
                .filter(|r| r.paused)
                .map(|r| r.queue.clone())
                .collect();
            let limited_now: HashSet<String> = rows
                .iter()
                .filter(|r| r.limited)
                .map(|r| r.queue.clone())
                .collect();
            let resumed: Vec<String> = {
                let mut paused = shared.paused.lock().unwrap_or_else(|e| e.into_inner());
                let resumed = paused.difference(&paused_now).cloned().collect();
                for q in paused_now.difference(&paused) {
                    tracing::info!(queue = %q, "taskq: queue paused");
                }
                *paused = paused_now;
                resumed
            };
            let unlimited: Vec<String> = {
                let mut limited = shared.limited.lock().unwrap_or_else(|e| e.into_inner());
                let unlimited = limited.difference(&limited_now).cloned().collect();
                for q in limited_now.difference(&limited) {
                    if shared.cfg.queues.contains_key(q) {
                        tracing::info!(queue = %q, "taskq: queue limited: its claims now go through the limit");
                    }
                }
                *limited = limited_now;
                unlimited
            };
            for q in resumed {
                tracing::info!(queue = %q, "taskq: queue resumed");
                wake::notify(&q);
            }
            for q in unlimited {
                if shared.cfg.queues.contains_key(&q) {
                    tracing::info!(queue = %q, "taskq: queue limits cleared");
                }
                if let Some(n) = shared.written.get(&q) {
                    n.notify_waiters();
                }
            }
        }
        Err(e) => {
            WorkerStats::add(&shared.stats.db_errors, 1);
            tracing::warn!(error = %e, "taskq: reading paused and limited queues failed");
        }
    }
}

#[cfg(test)]
mod turn_tests {
    use super::Turn;
    use std::time::Duration;

    #[test]
    fn ranks_by_id_and_counts_this_worker_once() {
        assert_eq!(Turn::among(["c", "a", "b"], "b"), Turn { rank: 1, of: 3 });
        // Not yet among the rows it read (its own row not written yet): counted anyway.
        assert_eq!(Turn::among(["c", "a"], "b"), Turn { rank: 1, of: 3 });
        assert_eq!(Turn::among([], "b"), Turn { rank: 0, of: 1 });
    }

    #[test]
    fn each_tick_is_the_turn_of_exactly_one_worker() {
        let every = Duration::from_secs(5);
        let fleet: Vec<Turn> = ["w1", "w2", "w3"]
            .iter()
            .map(|me| Turn::among(["w1", "w2", "w3"], me))
            .collect();
        let mut turns = [0u32; 3];
        for tick in 0..300u64 {
            let at =
                Duration::from_secs(1_700_000_000) + every * tick as u32 + Duration::from_millis(1);
            let mine: Vec<usize> = (0..3).filter(|&i| fleet[i].is_mine_at(at, every)).collect();
            assert_eq!(mine.len(), 1, "tick {tick}: {mine:?}");
            turns[mine[0]] += 1;
        }
        assert_eq!(turns, [100, 100, 100]);
        // Alone, every tick is its own.
        assert!((0..10).all(|t| Turn::default().is_mine_at(every * t, every)));
    }
}
