//! What the operator's views read, shared by their pages and their API routes: pending tasks
//! of one kind with their keyset cursor, and the schedules with whether their queue is paused
//! and whether they are overdue.

use std::str::FromStr;

use chrono::{DateTime, TimeDelta, Utc};
use serde::Serialize;
use taskq::client::{PendingKind, ScheduleInfo, TaskInfo};
use taskq::{Error, TaskId};

use crate::AppState;

/// The keyset cursor of a pending view: the last row's `run_at` (µs since the Unix epoch) and
/// id, written `<µs>:<id>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PendingCursor {
    pub at: DateTime<Utc>,
    pub id: u64,
}

impl FromStr for PendingCursor {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("after: expected <microseconds>:<task id>, got {s:?}");
        let (us, id) = s.split_once(':').ok_or_else(bad)?;
        // As the API document's pattern: 1 to 18 digits each (an id fits i64).
        let digits = |p: &str| (1..=18).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_digit());
        if !digits(us) || !digits(id) {
            return Err(bad());
        }
        let us: i64 = us.parse().map_err(|_| bad())?;
        let id: u64 = id.parse().map_err(|_| bad())?;
        // A time past what the databases store (year 9999) means "after everything".
        let at =
            DateTime::from_timestamp_micros(us.min(253_402_300_799_999_999)).ok_or_else(bad)?;
        Ok(Self { at, id })
    }
}

impl std::fmt::Display for PendingCursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.at.timestamp_micros(), self.id)
    }
}

/// A page of pending tasks of `kind` (soonest first) and the cursor of the next page, if any.
pub(crate) async fn pending(
    st: &AppState,
    kind: PendingKind,
    queue: Option<&str>,
    after: Option<PendingCursor>,
    limit: u32,
) -> Result<(Vec<TaskInfo>, Option<PendingCursor>), Error> {
    let mut tasks = st
        .client
        .list_pending(kind, queue, after.map(|c| (c.at, TaskId(c.id))), limit + 1)
        .await?;
    let more = tasks.len() > limit as usize;
    tasks.truncate(limit as usize);
    let next = more
        .then(|| {
            tasks.last().map(|t| PendingCursor {
                at: t.run_at,
                id: t.id.0,
            })
        })
        .flatten();
    Ok((tasks, next))
}

/// A schedule as the views show it.
#[derive(Debug, Serialize)]
pub(crate) struct ScheduleView {
    #[serde(flatten)]
    pub info: ScheduleInfo,
    /// Its queue is paused: ticks are enqueued, but none of the queue's tasks starts.
    pub paused: bool,
    /// Its next tick is more than the missed-tick grace past: no running worker fires it.
    pub overdue: bool,
}

/// The database clock and every schedule (by name) with its queue's pause and whether it is
/// overdue (as `taskq schedules` says).
pub(crate) async fn schedule_views(
    st: &AppState,
) -> Result<(DateTime<Utc>, Vec<ScheduleView>), Error> {
    let c = &st.client;
    let (rows, paused, now) = tokio::try_join!(c.schedules(), c.paused_queues(), c.db_now())?;
    let grace = TimeDelta::from_std(taskq::limits::MISSED_TICK_GRACE).unwrap_or(TimeDelta::MAX);
    let views = rows
        .into_iter()
        .map(|info| ScheduleView {
            paused: paused.iter().any(|(q, _)| *q == info.queue),
            overdue: info.next_tick.is_some_and(|t| now - t > grace),
            info,
        })
        .collect();
    Ok((now, views))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pending_cursor_reads_back_what_it_writes() {
        let c = PendingCursor {
            at: DateTime::from_timestamp_micros(1_764_590_400_123_456).unwrap(),
            id: 42,
        };
        assert_eq!(c.to_string(), "1764590400123456:42");
        assert_eq!(c.to_string().parse::<PendingCursor>(), Ok(c));
        for bad in ["", "1", "a:1", "1:b", "1:-2", "99999999999999999999:1"] {
            assert!(bad.parse::<PendingCursor>().is_err(), "{bad}");
        }
    }
}
