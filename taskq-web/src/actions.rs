//! The actions on one task that the pages and the API share (run now, reschedule, change
//! priority, delete, and the cancel / retry of the select-many form), each through the
//! client with the request's actor, so each is audited in its own transaction.

use std::time::Duration;

use chrono::{DateTime, NaiveDateTime, Utc};
use taskq::client::Canceled;
use taskq::{Client, Error, TaskId};

/// What the select-many form (and `POST /api/v1/tasks/selected`) applies to each task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Each {
    Cancel,
    Retry,
    RunNow,
    Delete,
}

impl Each {
    pub(crate) fn parse(s: &str) -> Option<Self> {
        match s {
            "cancel" => Some(Self::Cancel),
            "retry" => Some(Self::Retry),
            "run_now" => Some(Self::RunNow),
            "delete" => Some(Self::Delete),
            _ => None,
        }
    }

    /// Applies it to one task; what happened (`canceled`, `cancel_requested`, `retried`,
    /// `due_now`, `deleted`).
    pub(crate) async fn apply(self, client: &Client, id: TaskId) -> Result<&'static str, Error> {
        match self {
            Self::Cancel => Ok(match client.cancel(id).await? {
                Canceled::Now => "canceled",
                Canceled::Requested => "cancel_requested",
            }),
            Self::Retry => client.retry_dead(id).await.map(|()| "retried"),
            Self::RunNow => client.run_now(id).await.map(|()| "due_now"),
            Self::Delete => client.delete(id).await.map(|()| "deleted"),
        }
    }
}

/// When to run a rescheduled task: at a time, or after a delay from now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum When {
    At(DateTime<Utc>),
    In(Duration),
}

impl When {
    /// A form's value: a UTC time (`2026-12-01 15:00`, `2026-12-01T15:00:00`, RFC 3339), or a
    /// delay in taskq's duration grammar (`90s`, `15m`, `2h`, `1d12h`).
    pub(crate) fn parse(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if let Ok(t) = DateTime::parse_from_rfc3339(s) {
            return Ok(Self::At(t.with_timezone(&Utc)));
        }
        let plain = s.trim_end_matches(" UTC").replace('T', " ");
        for f in ["%Y-%m-%d %H:%M:%S%.f", "%Y-%m-%d %H:%M"] {
            if let Ok(t) = NaiveDateTime::parse_from_str(&plain, f) {
                return Ok(Self::At(t.and_utc()));
            }
        }
        taskq_grammar::duration::parse(s)
            .map(Self::In)
            .map_err(|_| {
                format!(
                    "when: {s:?} is neither a UTC time (2026-12-01 15:00) nor a delay (15m, 2h, 1d)"
                )
            })
    }

    pub(crate) async fn apply(self, client: &Client, id: TaskId) -> Result<(), Error> {
        match self {
            Self::At(t) => client.reschedule_at(id, t).await,
            Self::In(d) => client.reschedule(id, d).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reschedule_reads_times_and_delays() {
        let at = |s: &str| match When::parse(s) {
            Ok(When::At(t)) => t.to_rfc3339(),
            other => panic!("{s}: {other:?}"),
        };
        assert_eq!(at("2026-12-01 15:00"), "2026-12-01T15:00:00+00:00");
        assert_eq!(at("2026-12-01T15:00"), "2026-12-01T15:00:00+00:00");
        assert_eq!(at("2026-12-01 15:00:05 UTC"), "2026-12-01T15:00:05+00:00");
        assert_eq!(at("2026-12-01T16:00:00+01:00"), "2026-12-01T15:00:00+00:00");
        assert_eq!(When::parse("15m"), Ok(When::In(Duration::from_secs(900))));
        assert!(When::parse("tomorrow").is_err());
        assert_eq!(Each::parse("run_now"), Some(Each::RunNow));
        assert_eq!(Each::parse("purge"), None);
    }
}
