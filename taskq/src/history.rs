//! Attempt history ([`Attempt`], [`Client::attempts`](crate::Client::attempts)) and the audit trail of operator actions
//! ([`AuditEntry`], [`Client::audit`](crate::Client::audit), [`Client::record_audit`](crate::Client::record_audit)).
//!
//! The history lives on the task row (`taskq_tasks.attempts`, a JSON array): each statement
//! that ends an attempt (the worker's batched write-back, the reaper, the release at shutdown)
//! appends its entry in the same `UPDATE`, so recording it costs no statement. See
//! `docs/semantics.md` ("Attempt history").

use std::fmt;

use chrono::{DateTime, NaiveDateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::backend::{AuditRow, Conn};
use taskq_driver::state::TaskId;

/// Most entries kept in a task's attempt history: an attempt that ends when the history is
/// full drops the oldest entry. Entries carry their attempt number and epoch, so a gap shows.
pub const MAX_ATTEMPT_ENTRIES: usize = 100;

/// Longest error text of one attempt-history entry, in characters (at most 4 KiB of UTF-8);
/// a longer one is cut to `MAX_ATTEMPT_ERROR_CHARS - 1` characters followed by `…`. The task's
/// `last_error` keeps up to 8,000 bytes of the latest error.
pub const MAX_ATTEMPT_ERROR_CHARS: usize = 1024;

/// Longest actor recorded in the audit trail, in characters (see [`Client::with_actor`](crate::Client::with_actor)).
pub const MAX_ACTOR_LEN: usize = 255;

/// The actor of a [`Client`](crate::Client) that was given none.
pub const DEFAULT_ACTOR: &str = "client";

/// How an attempt ended.
///
/// Displayed (and serialized) as its snake_case name: `succeeded`, `failed`, `timed_out`,
/// `panicked`, `canceled`, `snoozed`, `lease_lost`, `released`. A name this version does not
/// know (written by a newer taskq) reads as [`AttemptOutcome::Other`] with that name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AttemptOutcome {
    /// The handler returned `Ok`.
    Succeeded,
    /// The handler returned an error (or the payload did not decode).
    Failed,
    /// The handler ran past its timeout.
    TimedOut,
    /// The handler panicked.
    Panicked,
    /// A cancel was requested ([`Client::cancel`](crate::Client::cancel)) and the handler did not succeed; or the
    /// lease of a task whose cancel was requested ran out (recorded by the reaper).
    Canceled,
    /// The handler snoozed ([`TaskError::snooze`](crate::TaskError::snooze)): the task runs
    /// again later and the attempt is not counted, so the next entry has the same number.
    Snoozed,
    /// The worker stopped renewing the lease (it crashed, was killed, or lost the database)
    /// and the reaper took the task back; `finished_at` is when the reaper did.
    LeaseLost,
    /// The worker shut down before the handler finished and gave the task back (not counted
    /// as an attempt).
    Released,
    /// An outcome this version of taskq does not know.
    Other(String),
}

impl AttemptOutcome {
    /// The stored name.
    pub fn as_str(&self) -> &str {
        match self {
            AttemptOutcome::Succeeded => "succeeded",
            AttemptOutcome::Failed => "failed",
            AttemptOutcome::TimedOut => "timed_out",
            AttemptOutcome::Panicked => "panicked",
            AttemptOutcome::Canceled => "canceled",
            AttemptOutcome::Snoozed => "snoozed",
            AttemptOutcome::LeaseLost => "lease_lost",
            AttemptOutcome::Released => "released",
            AttemptOutcome::Other(s) => s,
        }
    }

    /// The outcome stored as `name`; an unknown name gives [`AttemptOutcome::Other`].
    pub fn from_name(name: &str) -> Self {
        match name {
            "succeeded" => AttemptOutcome::Succeeded,
            "failed" => AttemptOutcome::Failed,
            "timed_out" => AttemptOutcome::TimedOut,
            "panicked" => AttemptOutcome::Panicked,
            "canceled" => AttemptOutcome::Canceled,
            "snoozed" => AttemptOutcome::Snoozed,
            "lease_lost" => AttemptOutcome::LeaseLost,
            "released" => AttemptOutcome::Released,
            other => AttemptOutcome::Other(other.to_owned()),
        }
    }
}

impl fmt::Display for AttemptOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for AttemptOutcome {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// One attempt of a task, as recorded when it ended (see [`Client::attempts`](crate::Client::attempts)).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Attempt {
    /// The attempt number (1 for the first run). A snoozed or released run does not count,
    /// so the run after it has the same number; a retry of a dead task
    /// ([`Client::retry_dead`](crate::Client::retry_dead)) starts again at 1 with a higher epoch.
    pub attempt: u32,
    /// The lease epoch of the run (its fencing token): unique per run of the task.
    pub epoch: u64,
    /// The worker that ran it (`None` if the row carried none).
    pub worker_id: Option<String>,
    /// When the claim started it (database clock). `None` for a run claimed before taskq
    /// recorded start times (schema migration 10).
    pub started_at: Option<DateTime<Utc>>,
    /// When its end was written (database clock): by the write-back (which batches outcomes
    /// for up to the worker's `write_back_delay`), the reaper, or the release at shutdown.
    pub finished_at: DateTime<Utc>,
    /// How it ended.
    pub outcome: AttemptOutcome,
    /// The error, for a failure (cut to [`MAX_ATTEMPT_ERROR_CHARS`] characters).
    pub error: Option<String>,
}

impl Attempt {
    /// `finished_at - started_at`, when the start is known.
    pub fn duration(&self) -> Option<std::time::Duration> {
        let d = self.finished_at - self.started_at?;
        d.to_std().ok()
    }
}

/// An entry of the stored JSON array.
#[derive(Deserialize)]
struct RawAttempt {
    attempt: u32,
    epoch: u64,
    #[serde(default)]
    worker: Option<String>,
    #[serde(default)]
    started_at: Option<String>,
    finished_at: String,
    outcome: String,
    #[serde(default)]
    error: Option<String>,
}

/// Parses a stored time (`YYYY-MM-DD hh:mm:ss.ffffff`, UTC).
fn parse_time(s: &str) -> Option<DateTime<Utc>> {
    NaiveDateTime::parse_from_str(s, "%Y-%m-%d %H:%M:%S%.f")
        .ok()
        .map(|t| t.and_utc())
}

/// Decodes a task's `attempts` column.
pub(crate) fn parse_attempts(json: &str) -> std::result::Result<Vec<Attempt>, String> {
    let raw: Vec<RawAttempt> =
        serde_json::from_str(json).map_err(|e| format!("attempt history does not decode: {e}"))?;
    raw.into_iter()
        .map(|r| {
            Ok(Attempt {
                attempt: r.attempt,
                epoch: r.epoch,
                worker_id: r.worker,
                started_at: r.started_at.as_deref().and_then(parse_time),
                finished_at: parse_time(&r.finished_at).ok_or_else(|| {
                    format!("attempt history: bad finished_at {:?}", r.finished_at)
                })?,
                outcome: AttemptOutcome::from_name(&r.outcome),
                error: r.error,
            })
        })
        .collect()
}

/// An operator action recorded in the audit trail (`taskq_audit`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AuditEntry {
    /// Row id (increasing; the paging cursor of [`AuditFilter::before_id`]).
    pub id: u64,
    /// When it was recorded (database clock), in the transaction of the action.
    pub at: DateTime<Utc>,
    /// Who: the client's actor ([`Client::with_actor`](crate::Client::with_actor)).
    pub actor: String,
    /// What: `cancel`, `cancel_requested`, `retry`, `reschedule`, `run_now`, `priority`,
    /// `delete`, `pause`, `resume`, `limit`, `rate_limit`, `bulk_cancel`, `bulk_retry`, `purge`,
    /// `schedule_delete`, or what
    /// [`Client::record_audit`](crate::Client::record_audit) was given (e.g. `create`).
    pub action: String,
    /// The task acted on, if one.
    pub task_id: Option<TaskId>,
    /// The queue acted on, or the task's queue.
    pub queue: Option<String>,
    /// The action's parameters and effect (new values, a bulk filter and its counts); `null`
    /// when none.
    pub detail: serde_json::Value,
}

/// Which audit entries [`Client::audit`](crate::Client::audit) returns, newest first.
#[derive(Debug, Clone, Default)]
pub struct AuditFilter {
    /// Only entries about this task.
    pub task: Option<TaskId>,
    /// Only entries about this queue (including those of its tasks).
    pub queue: Option<String>,
    /// Only entries with a smaller id (paging cursor: pass the last id of the previous page).
    pub before_id: Option<u64>,
    /// Page size (default 100, at most 10,000).
    pub limit: Option<u32>,
}

/// An action to record, built by the client and written with [`insert`].
pub(crate) struct Action {
    pub action: &'static str,
    pub task: Option<TaskId>,
    pub queue: Option<String>,
    pub detail: Option<serde_json::Value>,
}

impl Action {
    pub(crate) fn task(
        action: &'static str,
        id: TaskId,
        detail: Option<serde_json::Value>,
    ) -> Self {
        Self {
            action,
            task: Some(id),
            queue: None,
            detail,
        }
    }

    pub(crate) fn queue(
        action: &'static str,
        queue: Option<&str>,
        detail: serde_json::Value,
    ) -> Self {
        Self {
            action,
            task: None,
            queue: queue.map(str::to_owned),
            detail: Some(detail),
        }
    }
}

/// Writes `a` by `actor` on `conn`.
pub(crate) async fn insert(mut conn: Conn<'_>, actor: &str, a: &Action) -> sqlx::Result<u64> {
    let detail = a.detail.as_ref().map(serde_json::Value::to_string);
    conn.audit_insert(&AuditRow {
        actor,
        action: a.action,
        task_id: a.task.map(|t| t.0),
        queue: a.queue.as_deref(),
        detail,
    })
    .await
}

/// `s` cut to `max` characters.
pub(crate) fn cut(s: &str, max: usize) -> String {
    s.chars().take(max).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_round_trip_and_unknown_names_are_kept() {
        for o in [
            AttemptOutcome::Succeeded,
            AttemptOutcome::Failed,
            AttemptOutcome::TimedOut,
            AttemptOutcome::Panicked,
            AttemptOutcome::Canceled,
            AttemptOutcome::Snoozed,
            AttemptOutcome::LeaseLost,
            AttemptOutcome::Released,
        ] {
            assert_eq!(AttemptOutcome::from_name(o.as_str()), o);
        }
        assert_eq!(
            AttemptOutcome::from_name("exploded"),
            AttemptOutcome::Other("exploded".into())
        );
        assert_eq!(
            AttemptOutcome::from_name("exploded").to_string(),
            "exploded"
        );
    }

    #[test]
    fn stored_entries_decode() {
        let json = r#"[{"attempt": 1, "epoch": 3, "worker": "w-1",
            "started_at": "2025-01-02 03:04:05.000100", "finished_at": "2025-01-02 03:04:06.500100",
            "outcome": "timed_out", "error": "timed out after 1s"},
            {"attempt": 2, "epoch": 4, "worker": null, "started_at": null,
             "finished_at": "2025-01-02 03:05:00.000000", "outcome": "new_kind", "error": null}]"#;
        let a = parse_attempts(json).unwrap();
        assert_eq!(a.len(), 2);
        assert_eq!(a[0].outcome, AttemptOutcome::TimedOut);
        assert_eq!(a[0].worker_id.as_deref(), Some("w-1"));
        assert_eq!(
            a[0].duration(),
            Some(std::time::Duration::from_millis(1500))
        );
        assert_eq!(a[1].started_at, None);
        assert_eq!(a[1].duration(), None);
        assert_eq!(a[1].outcome, AttemptOutcome::Other("new_kind".into()));
        assert!(parse_attempts("{").is_err());
        assert!(parse_attempts(r#"[{"attempt": 1}]"#).is_err());
    }
}
