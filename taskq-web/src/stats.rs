//! What the overview and `GET /api/v1/queues` show: counts per queue and state, queue
//! controls, the per-minute counts, with the terminal counts cached between requests.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use taskq::client::{
    AttemptsPerMinute, FinishedPerMinute, PendingNameCount, QueueStateCount, RateLimit, RunTimes,
};
use taskq::{Error, TaskState};

use crate::AppState;

/// Held event keys the Events page and `GET /api/v1/events` show (longest held first).
pub(crate) const EVENTS_HELD_SHOWN: u32 = 100;

/// The terminal counts of the last [`taskq::Client::stats_terminal`] call, shared by every
/// request until they are older than the configured maximum age.
#[derive(Debug, Default)]
pub(crate) struct TerminalCache(tokio::sync::Mutex<Option<Terminal>>);

impl TerminalCache {
    /// Forgets the cached counts, so the next request counts again (after an action of the
    /// dashboard that changed tasks: its effect shows at once).
    pub(crate) async fn invalidate(&self) {
        self.0.lock().await.take();
    }
}

#[derive(Debug, Clone)]
struct Terminal {
    /// When they were counted (this process's clock, for the maximum age).
    taken: Instant,
    /// When they were counted (the database clock, for display).
    at: DateTime<Utc>,
    rows: Vec<QueueStateCount>,
}

/// One queue's row.
#[derive(Debug, Default)]
pub(crate) struct QueueRow {
    /// Tasks per state, in [`TaskState::ALL`]'s order.
    pub counts: [u64; TaskState::ALL.len()],
    pub oldest_pending: Option<DateTime<Utc>>,
    pub paused_at: Option<DateTime<Utc>>,
    pub concurrency_limit: Option<u32>,
    pub rate_limit: Option<RateLimit>,
    pub rate_used: u64,
}

/// Everything the overview and the queue-stats API show.
#[derive(Debug)]
pub(crate) struct QueueStats {
    pub queues: BTreeMap<String, QueueRow>,
    /// The database clock.
    pub now: DateTime<Utc>,
    /// When the terminal counts were taken (database clock).
    pub terminal_at: DateTime<Utc>,
    pub finished: Vec<FinishedPerMinute>,
    pub failed: Vec<AttemptsPerMinute>,
    /// Run-time percentiles per task name over the same minutes.
    pub run_times: Vec<RunTimes>,
}

pub(crate) fn state_index(s: TaskState) -> usize {
    TaskState::ALL.iter().position(|x| *x == s).unwrap_or(0)
}

/// Loads the stats: pending and running counts, queue controls and per-minute counts exactly
/// on every call; the terminal counts from the cache (counted again, by one request while
/// the others wait, once older than `terminal_max_age`).
pub(crate) async fn load(st: &AppState) -> Result<QueueStats, Error> {
    let c = &st.client;
    let minutes = st.throughput_minutes;
    let (active, controls, now, finished, failed, terminal, run_times) = tokio::try_join!(
        c.stats_active(),
        c.queues(),
        c.db_now(),
        c.finished_per_minute(minutes),
        c.failed_attempts_per_minute(minutes),
        terminal(st),
        c.run_times(minutes)
    )?;
    let mut queues: BTreeMap<String, QueueRow> = BTreeMap::new();
    for s in active.iter().chain(terminal.rows.iter()) {
        let row = queues.entry(s.queue.clone()).or_default();
        row.counts[state_index(s.state)] = s.count;
        if s.state == TaskState::Pending {
            row.oldest_pending = s.oldest_run_at;
        }
    }
    for q in controls {
        let row = queues.entry(q.queue).or_default();
        row.paused_at = q.paused_at;
        row.concurrency_limit = q.concurrency_limit;
        row.rate_limit = q.rate_limit;
        row.rate_used = q.rate_used;
    }
    Ok(QueueStats {
        queues,
        now,
        terminal_at: terminal.at,
        finished,
        failed,
        run_times,
    })
}

async fn terminal(st: &AppState) -> Result<Terminal, Error> {
    let mut cached = st.terminal.0.lock().await;
    if let Some(t) = cached.as_ref()
        && t.taken.elapsed() < st.terminal_max_age
    {
        return Ok(t.clone());
    }
    let taken = Instant::now();
    let (at, rows) = tokio::try_join!(st.client.db_now(), st.client.stats_terminal())?;
    let t = Terminal { taken, at, rows };
    *cached = Some(t.clone());
    Ok(t)
}

/// The last [`taskq::Client::unhandled`] result, shared by every request until it is older
/// than the terminal counts' maximum age (it reads the whole pending backlog's index entries).
#[derive(Debug, Default)]
pub(crate) struct UnhandledCache(tokio::sync::Mutex<Option<Unhandled>>);

/// Due tasks per queue and name that no live worker would claim, and when they were counted.
#[derive(Debug, Clone)]
pub(crate) struct Unhandled {
    taken: Instant,
    /// When they were counted (database clock).
    pub at: DateTime<Utc>,
    pub rows: Vec<PendingNameCount>,
}

/// The due tasks no live worker handles: from the cache, counted again (by one request while
/// the others wait) once older than `terminal_max_age`.
pub(crate) async fn unhandled(st: &AppState) -> Result<Unhandled, Error> {
    let mut cached = st.unhandled.0.lock().await;
    if let Some(u) = cached.as_ref()
        && u.taken.elapsed() < st.terminal_max_age
    {
        return Ok(u.clone());
    }
    let taken = Instant::now();
    let (at, rows) = tokio::try_join!(st.client.db_now(), st.client.unhandled())?;
    let u = Unhandled { taken, at, rows };
    *cached = Some(u.clone());
    Ok(u)
}

/// `failed` (failed, timed out, panicked) and `lease lost` attempts per minute ago.
pub(crate) fn failed_grid(failed: &[AttemptsPerMinute], minutes: u32) -> Vec<[u64; 2]> {
    let mut grid = vec![[0u64; 2]; minutes as usize];
    for p in failed {
        let col = match p.outcome.as_str() {
            "lease_lost" => 1,
            _ => 0,
        };
        if let Some(m) = grid.get_mut(p.minutes_ago as usize) {
            m[col] += p.count;
        }
    }
    grid
}

/// A rate limit as text: `100 per 1 min`.
pub(crate) fn rate_text(r: &RateLimit) -> String {
    format!("{} per {}", r.max, duration_text(r.period))
}

fn duration_text(d: Duration) -> String {
    let ms = d.as_millis();
    if ms.is_multiple_of(3_600_000) {
        format!("{} h", ms / 3_600_000)
    } else if ms.is_multiple_of(60_000) {
        format!("{} min", ms / 60_000)
    } else if ms.is_multiple_of(1_000) {
        format!("{} s", ms / 1_000)
    } else {
        format!("{ms} ms")
    }
}

/// The sentence of a refused pause of an unknown queue.
pub(crate) fn unknown_queue(queue: &str) -> String {
    format!(
        "no queue named {queue:?}: no task, worker, limit or earlier pause names it (check the spelling; `taskq queues pause` pauses a queue before it is used)"
    )
}
