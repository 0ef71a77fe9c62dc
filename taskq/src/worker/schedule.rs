//! The scheduler: enqueues the ticks of this worker's recurring schedules.
//!
//! At start it writes each schedule's definition to `taskq_schedules` (`schedule_declare`).
//! Then it loops: one read of its schedules' rows, which also gives the database clock; for
//! each schedule with a due tick, one transaction that moves the row's watermark by
//! compare-and-set and inserts the tick's task (`schedule_fire`); then it sleeps until the next
//! tick. Every worker that declares a schedule runs this, and the compare-and-set makes exactly
//! one of them enqueue each tick; no leader is elected. To keep the race small, the worker that
//! took a schedule's last step wakes at the tick and the others
//! [`FOLLOWER_DELAY`] (plus jitter) later: normally they find the step taken and only read. If
//! the usual worker is gone, another takes over within that delay.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use tokio::time::Instant;

use super::{Shared, WorkerStats, backoff_sleep, within};
use crate::backend::{NewTask, ScheduleDecl, ScheduleFire, ScheduleState};
use crate::task::schedule::ScheduleDef;
use crate::wake;

/// How much later than a tick a worker that did not take the schedule's last step wakes.
const FOLLOWER_DELAY: Duration = Duration::from_millis(100);
/// Upper bound of the random part added to [`FOLLOWER_DELAY`].
const FOLLOWER_JITTER_MS: u64 = 100;
/// Longest sleep between two reads, so a long wait (a daily schedule) re-reads the database
/// clock and notices a row deleted or redefined meanwhile.
const MAX_SLEEP: Duration = Duration::from_secs(60);

/// What this worker remembers about one schedule between iterations.
#[derive(Debug, Default, Clone)]
struct Local {
    /// This worker took the schedule's last step: it wakes at the tick, not after it.
    leader: bool,
    /// A warning about another definition in the database was logged (once per mismatch).
    warned: bool,
}

pub(crate) async fn run(shared: Arc<Shared>) {
    let defs = &shared.cfg.schedules;
    if defs.is_empty() {
        return;
    }
    let names: Vec<&str> = defs.iter().map(|d| d.name.as_str()).collect();
    let name_list = crate::backend::NameList::new(names.iter().copied());
    let mut local = vec![Local::default(); defs.len()];
    let mut failures = 0u32;
    let mut pending_declare: Vec<usize> = (0..defs.len()).collect();
    tracing::info!(schedules = ?names, "taskq: scheduler started");
    while !shared.stopping() {
        if !pending_declare.is_empty() {
            match declare(&shared, &pending_declare).await {
                Ok(()) => pending_declare.clear(),
                Err(()) => {
                    failures += 1;
                    backoff_sleep(&shared, failures).await;
                    continue;
                }
            }
        }
        let rows = match within!(shared, |c| shared.store.schedule_states(c, &name_list)).await {
            Ok(rows) => rows,
            Err(e) => {
                WorkerStats::add(&shared.stats.db_errors, 1);
                tracing::warn!(error = %e, "taskq: reading schedules failed");
                failures += 1;
                backoff_sleep(&shared, failures).await;
                continue;
            }
        };
        let read_at = Instant::now();
        let Some(now) = rows.first().map(|r| r.now) else {
            // Every row is gone (deleted by an operator): write them again.
            pending_declare = (0..defs.len()).collect();
            continue;
        };
        let mut wake_at = now + TimeDelta::from_std(MAX_SLEEP).expect("fits");
        let mut step_failed = false;
        for (i, def) in defs.iter().enumerate() {
            let Some(row) = rows.iter().find(|r| r.name == def.name) else {
                tracing::info!(schedule = %def.name, "taskq: schedule row missing; declaring it again");
                pending_declare.push(i);
                continue;
            };
            match step(&shared, def, &mut local[i], row, now).await {
                Ok(Some(next)) => wake_at = wake_at.min(next),
                Ok(None) => {}
                Err(()) => step_failed = true,
            }
        }
        if step_failed {
            failures += 1;
            backoff_sleep(&shared, failures).await;
            continue;
        }
        failures = 0;
        if !pending_declare.is_empty() {
            continue;
        }
        let sleep = (wake_at - now)
            .to_std()
            .unwrap_or(Duration::ZERO)
            .min(MAX_SLEEP);
        tokio::select! {
            _ = tokio::time::sleep_until(read_at + sleep) => {}
            _ = shared.stopped() => return,
        }
    }
}

/// Writes the definitions of `which` schedules.
async fn declare(shared: &Shared, which: &[usize]) -> Result<(), ()> {
    let now = match within!(shared, |c| shared.store.db_now_on(c)).await {
        Ok(now) => now,
        Err(e) => {
            WorkerStats::add(&shared.stats.db_errors, 1);
            tracing::warn!(error = %e, "taskq: declaring schedules failed");
            return Err(());
        }
    };
    for &i in which {
        let def = &shared.cfg.schedules[i];
        let missed = def.missed.to_string();
        let decl = ScheduleDecl {
            name: &def.name,
            task_name: def.task_name,
            queue: &def.queue,
            expression: &def.expression,
            timezone: &def.timezone,
            missed_ticks: &missed,
            next_tick: def.ticks.next_after(now),
        };
        if let Err(e) = within!(shared, |c| shared.store.schedule_declare(c, &decl)).await {
            WorkerStats::add(&shared.stats.db_errors, 1);
            tracing::warn!(error = %e, schedule = %def.name, "taskq: declaring a schedule failed");
            return Err(());
        }
        tracing::debug!(schedule = %def.name, expression = %def.expression,
            timezone = %def.timezone, "taskq: schedule declared");
    }
    Ok(())
}

/// Takes one schedule's due step, if any. Returns when (database clock) this worker should
/// look at the schedule again, or `None` when it has no future tick.
async fn step(
    shared: &Shared,
    def: &ScheduleDef,
    local: &mut Local,
    row: &ScheduleState,
    now: DateTime<Utc>,
) -> Result<Option<DateTime<Utc>>, ()> {
    if row.expression != def.expression || row.timezone != def.timezone {
        // A worker that started later declared another definition: it is the one that fires
        // the schedule now (a rolling deploy; or this process runs old code).
        if !local.warned {
            tracing::warn!(schedule = %def.name, ours = %def.expression, our_timezone = %def.timezone,
                theirs = %row.expression, their_timezone = %row.timezone,
                "taskq: another worker declared this schedule differently since this one started; \
                 this worker does not fire it");
            local.warned = true;
        }
        local.leader = false;
        return Ok(None);
    }
    local.warned = false;
    let delay = if local.leader {
        TimeDelta::zero()
    } else {
        TimeDelta::from_std(FOLLOWER_DELAY).expect("fits")
            + TimeDelta::milliseconds(fastrand::u64(0..=FOLLOWER_JITTER_MS) as i64)
    };
    let Some(plan) = def.ticks.plan(row.watermark, now - delay, def.missed) else {
        return Ok(def
            .ticks
            .next_after(row.watermark.max(now - delay))
            .map(|t| t + delay));
    };
    let keys: Vec<String> = plan.fire.iter().map(|t| def.tick_key(*t)).collect();
    let tasks: Vec<NewTask<'_>> = plan
        .fire
        .iter()
        .zip(&keys)
        .map(|(tick, key)| NewTask {
            queue: &def.queue,
            name: def.task_name,
            payload: &def.payload,
            priority: def.priority,
            max_attempts: def.max_attempts,
            delay_us: 0,
            run_at: Some(*tick),
            deadline: def.deadline,
            ttl_us: def.ttl_us,
            // A tick is made unique by its idempotency key, not by `Task::UNIQUE`.
            unique_key: None,
            unique_while: None,
            unique_expires_us: None,
            idempotency_key: Some(key),
            trace_context: def.trace_context.as_deref(),
        })
        .collect();
    let fire = ScheduleFire {
        name: &def.name,
        expression: &def.expression,
        timezone: &def.timezone,
        old_watermark: row.watermark,
        new_watermark: plan.watermark,
        next_tick: plan.next,
        worker_id: &shared.worker_id,
        tasks,
    };
    match within!(shared, |c| shared.store.schedule_fire(c, &fire)).await {
        Ok(Some(ids)) => {
            local.leader = true;
            let n = ids.len() as u64;
            WorkerStats::add(&shared.stats.scheduled, n);
            for _ in &ids {
                crate::metrics::enqueued(&def.queue, def.task_name);
            }
            if plan.missed {
                tracing::info!(schedule = %def.name, policy = %def.missed, enqueued = n,
                    ticks = ?plan.fire, through = %plan.watermark,
                    "taskq: schedule had missed ticks (no worker ran it); applied its missed-tick policy");
            } else {
                tracing::debug!(schedule = %def.name, ticks = ?plan.fire, task_ids = ?ids,
                    "taskq: schedule ticks enqueued");
            }
            if n > 0 {
                wake::notify(&def.queue);
            }
        }
        Ok(None) => {
            // Another worker took the step (or redefined the schedule): it is the leader.
            local.leader = false;
        }
        Err(e) => {
            WorkerStats::add(&shared.stats.db_errors, 1);
            tracing::warn!(error = %e, schedule = %def.name, "taskq: enqueuing a schedule's tick failed");
            return Err(());
        }
    }
    let delay = if local.leader {
        TimeDelta::zero()
    } else {
        TimeDelta::from_std(FOLLOWER_DELAY).expect("fits")
    };
    Ok(plan.next.map(|t| t + delay))
}
