//! What the [`Client`](crate::Client) reads: tasks, queues, schedules, workers, counts. Plain data, shared
//! by the client and the backends that produce it.

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::history::AttemptOutcome;
use crate::task::{TaskId, TaskState};
use taskq_driver::rows::TaskFilter;

pub use taskq_driver::read::{
    DeadReason, PendingNameCount, QueueStateCount, ScheduleInfo, TaskInfo,
};
pub(crate) use taskq_driver::read::{UNDECODABLE_PREFIX, exhausted_note};

/// Which tasks [`Client::list`](crate::Client::list) and [`Client::count`](crate::Client::count) look at; empty fields match everything.
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    /// Only this queue.
    pub queue: Option<String>,
    /// Only this state.
    pub state: Option<TaskState>,
    /// Only this task name.
    pub name: Option<String>,
    /// Paging cursor: only tasks after this id in the listing order (greater ids oldest
    /// first, smaller ids with `newest_first`); pass the last id of the previous page.
    pub after_id: Option<TaskId>,
    /// Page size (default 100, at most 10,000).
    pub limit: Option<u32>,
    /// List by id descending (newest first) instead of ascending.
    pub newest_first: bool,
}

impl ListFilter {
    pub(crate) fn store(&self) -> TaskFilter<'_> {
        TaskFilter {
            queue: self.queue.as_deref(),
            state: self.state,
            name: self.name.as_deref(),
        }
    }
}

/// Tasks that reached one terminal state within one minute (see
/// [`Client::finished_per_minute`](crate::Client::finished_per_minute)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct FinishedPerMinute {
    /// The terminal state.
    pub state: TaskState,
    /// Which minute: 0 is the last 60 seconds before the database clock's now, 1 the 60
    /// before those, and so on.
    pub minutes_ago: u32,
    /// Tasks that reached `state` in that minute.
    pub count: u64,
}

/// Attempts with one outcome that ended within one minute (see
/// [`Client::failed_attempts_per_minute`](crate::Client::failed_attempts_per_minute)).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AttemptsPerMinute {
    /// How they ended: `failed`, `timed_out`, `panicked` or `lease_lost`.
    pub outcome: AttemptOutcome,
    /// Which minute: 0 is the last 60 seconds before the database clock's now, 1 the 60
    /// before those, and so on.
    pub minutes_ago: u32,
    /// Attempts that ended so in that minute.
    pub count: u64,
}

/// A worker process as recorded in `taskq_workers` (see [`Client::workers`](crate::Client::workers)).
#[derive(Debug, Clone, Serialize)]
pub struct WorkerInfo {
    /// The worker id (as recorded on the tasks it claims).
    pub id: String,
    /// Host name of the machine it runs on.
    pub host: String,
    /// Its process id on that host.
    pub pid: u32,
    /// The queues it works, with the concurrency of each.
    pub queues: std::collections::BTreeMap<String, usize>,
    /// Handlers it runs at once over all its queues.
    pub concurrency: u32,
    /// Its lease: how long its tasks stay claimed after its last heartbeat.
    #[serde(rename = "lease_ms", serialize_with = "duration_ms")]
    pub lease: std::time::Duration,
    /// How often it records itself (its heartbeat interval).
    #[serde(rename = "heartbeat_ms", serialize_with = "duration_ms")]
    pub heartbeat: std::time::Duration,
    /// When it started (database clock).
    pub started_at: DateTime<Utc>,
    /// When it last recorded itself (database clock): once per heartbeat interval while it
    /// runs; at shutdown for a stopped worker.
    pub last_seen_at: DateTime<Utc>,
    /// When it shut down gracefully (`None`: running, or gone without a goodbye).
    pub stopped_at: Option<DateTime<Utc>>,
    /// How long ago it last recorded itself (its last heartbeat, or its shutdown), on the
    /// database clock, when the list was read.
    #[serde(rename = "last_seen_ago_ms", serialize_with = "duration_ms")]
    pub last_seen_ago: std::time::Duration,
    /// Not stopped, and seen within [`lost_after`](Self::lost_after), on the database clock:
    /// [`WorkerStatus::Alive`].
    pub alive: bool,
    /// How long after its last beat it counts as lost: two of its heartbeat intervals, at most
    /// its lease, at least 1 s (`taskq_driver::rules::worker_lost_after_us`).
    #[serde(rename = "lost_after_ms", serialize_with = "duration_ms")]
    pub lost_after: std::time::Duration,
    /// Alive, lost (not stopped and not seen within [`lost_after`](Self::lost_after): it
    /// crashed, was killed, hangs, or cannot reach the database) or stopped.
    pub status: WorkerStatus,
    /// The task names it registers (`None`: recorded by a worker of an earlier version, taken
    /// as registering every name).
    pub names: Option<Vec<String>>,
    /// Tasks in state `running` claimed under this worker's id.
    pub running: u64,
}

impl WorkerInfo {
    pub(crate) fn from_row(r: crate::backend::WorkerListRow) -> Self {
        let alive = r.alive();
        let lost_after = std::time::Duration::from_micros(
            taskq_driver::rules::worker_lost_after_us(r.heartbeat_us, r.lease_us),
        );
        let status = if alive {
            WorkerStatus::Alive
        } else if r.stopped_at.is_some() {
            WorkerStatus::Stopped
        } else {
            WorkerStatus::Lost
        };
        Self {
            queues: serde_json::from_str(&r.queues).unwrap_or_default(),
            names: r.names.and_then(|n| serde_json::from_str(&n).ok()),
            id: r.worker_id,
            host: r.host,
            pid: r.pid,
            concurrency: r.concurrency,
            lease: std::time::Duration::from_micros(r.lease_us),
            heartbeat: std::time::Duration::from_micros(r.heartbeat_us),
            started_at: r.started_at,
            last_seen_at: r.last_seen_at,
            stopped_at: r.stopped_at,
            last_seen_ago: std::time::Duration::from_micros(r.seen_ago_us.max(0) as u64),
            alive,
            lost_after,
            status,
            running: r.running.max(0) as u64,
        }
    }

    /// Whether this worker would claim a task named `name` in `queue`: it works the queue
    /// and registers the name (a worker that recorded no names is taken to register all).
    pub fn handles(&self, queue: &str, name: &str) -> bool {
        self.queues.contains_key(queue)
            && self
                .names
                .as_ref()
                .is_none_or(|names| names.iter().any(|n| n == name))
    }
}

/// Where a worker recorded in `taskq_workers` stands (see [`WorkerInfo::status`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkerStatus {
    /// Not stopped, and seen within two heartbeat intervals (at most its lease, at least 1 s).
    Alive,
    /// Not stopped, and not seen for two heartbeat intervals (at most its lease, at least 1 s):
    /// crashed, killed, hung, or cut
    /// off from the database. Its running tasks stay claimed until their leases expire; then
    /// the reaper returns them to pending.
    Lost,
    /// Shut down gracefully.
    Stopped,
}

impl WorkerStatus {
    /// `alive`, `lost` or `stopped`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Alive => "alive",
            Self::Lost => "lost",
            Self::Stopped => "stopped",
        }
    }
}

impl std::fmt::Display for WorkerStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The rows of `pending` with due tasks that none of the alive `workers` would claim (see
/// [`WorkerInfo::handles`]).
pub(crate) fn unhandled(
    pending: Vec<PendingNameCount>,
    workers: &[WorkerInfo],
) -> Vec<PendingNameCount> {
    pending
        .into_iter()
        .filter(|p| {
            p.due > 0
                && !workers
                    .iter()
                    .any(|w| w.alive && w.handles(&p.queue, &p.name))
        })
        .collect()
}

/// A queue's rate limit: at most `max` tasks start in each window of `period`, across every
/// worker (see [`Client::set_queue_rate_limit`](crate::Client::set_queue_rate_limit)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RateLimit {
    /// Most starts per window.
    pub max: u32,
    /// Length of a window. Windows are consecutive multiples of it on the database clock
    /// (since 1970-01-01 UTC): a period of one minute has windows starting on the minute.
    #[serde(rename = "period_ms", serialize_with = "duration_ms")]
    pub period: std::time::Duration,
}

/// A queue as [`Client::queues`](crate::Client::queues) lists it: its controls (pause, limits) and how many of its
/// tasks are pending and running.
#[derive(Debug, Clone, Serialize)]
pub struct QueueInfo {
    /// Queue name.
    pub queue: String,
    /// When it was paused, if it is.
    pub paused_at: Option<DateTime<Utc>>,
    /// Its concurrency limit across all workers, if any ([`Client::set_queue_limit`](crate::Client::set_queue_limit)).
    pub concurrency_limit: Option<u32>,
    /// Its rate limit across all workers, if any ([`Client::set_queue_rate_limit`](crate::Client::set_queue_rate_limit)).
    pub rate_limit: Option<RateLimit>,
    /// Tasks started (claimed) in the current rate window; 0 without a rate limit.
    pub rate_used: u64,
    /// Tasks pending (due or scheduled).
    pub pending: u64,
    /// Tasks running (including those whose lease expired and that the reaper has not
    /// returned yet: they still count against the concurrency limit).
    pub running: u64,
}

/// Run-time percentiles of one task name (see [`Client::run_times`](crate::Client::run_times)).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RunTimes {
    /// Task name.
    pub name: String,
    /// Successes read for it.
    pub count: u64,
    /// Median run time (nearest rank).
    #[serde(rename = "p50_ms", serialize_with = "duration_ms_f64")]
    pub p50: std::time::Duration,
    /// 95th percentile run time (nearest rank).
    #[serde(rename = "p95_ms", serialize_with = "duration_ms_f64")]
    pub p95: std::time::Duration,
    /// Longest run time.
    #[serde(rename = "max_ms", serialize_with = "duration_ms_f64")]
    pub max: std::time::Duration,
}

/// The nearest-rank `p`-th percentile (0 < p <= 100) of `sorted` (ascending, not empty): the
/// smallest value with at least `p` % of the values at or below it.
pub(crate) fn percentile(sorted: &[i64], p: u32) -> i64 {
    let n = sorted.len();
    let rank = (n * p as usize).div_ceil(100).clamp(1, n);
    sorted[rank - 1]
}

/// Percentiles per name of `(name, run µs)` rows, by name. Negative run times (a clock step
/// between start and end) count as zero.
pub(crate) fn run_times(rows: Vec<(String, i64)>) -> Vec<RunTimes> {
    let mut by_name: std::collections::BTreeMap<String, Vec<i64>> = Default::default();
    for (name, us) in rows {
        by_name.entry(name).or_default().push(us.max(0));
    }
    let us = |v: i64| std::time::Duration::from_micros(v as u64);
    by_name
        .into_iter()
        .map(|(name, mut v)| {
            v.sort_unstable();
            RunTimes {
                name,
                count: v.len() as u64,
                p50: us(percentile(&v, 50)),
                p95: us(percentile(&v, 95)),
                max: us(v[v.len() - 1]),
            }
        })
        .collect()
}

fn duration_ms_f64<S: serde::Serializer>(
    d: &std::time::Duration,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_f64((d.as_micros() as f64) / 1_000.0)
}

fn duration_ms<S: serde::Serializer>(
    d: &std::time::Duration,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_u64(d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank_per_name() {
        let v: Vec<i64> = (1..=100).collect();
        assert_eq!((percentile(&v, 50), percentile(&v, 95)), (50, 95));
        assert_eq!((percentile(&[7], 50), percentile(&[7], 95)), (7, 7));
        assert_eq!(percentile(&[1, 2], 50), 1);
        assert_eq!(percentile(&[1, 2, 3], 95), 3);
        let rows = vec![
            ("b".to_owned(), 3_000),
            ("a".to_owned(), 2_000),
            ("b".to_owned(), -5),
            ("b".to_owned(), 1_000),
        ];
        let r = run_times(rows);
        let ms = std::time::Duration::from_millis;
        assert_eq!(r[0].name, "a");
        assert_eq!((r[0].count, r[0].p50, r[0].p95), (1, ms(2), ms(2)));
        assert_eq!(
            (r[1].count, r[1].p50, r[1].p95, r[1].max),
            (3, ms(1), ms(3), ms(3))
        );
        assert_eq!(
            serde_json::to_value(&r[1]).unwrap()["p50_ms"],
            serde_json::json!(1.0)
        );
    }
}
