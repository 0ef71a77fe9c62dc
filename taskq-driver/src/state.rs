//! The vocabulary of a task row: its id and its state.

use std::fmt;
use std::str::FromStr;

use serde::Serialize;

/// Identifier of a task row.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, serde::Deserialize,
)]
#[serde(transparent)]
pub struct TaskId(pub u64);

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl From<u64> for TaskId {
    fn from(v: u64) -> Self {
        Self(v)
    }
}

/// Lifecycle state of a task, as stored in the `state` column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TaskState {
    /// Queued behind the head of its order key (an ordered task): not claimable until the
    /// task ahead of it ends and promotes it to `pending`.
    Waiting,
    /// Waiting for `run_at` or for a worker. Entered by enqueue, retry, snooze, reaping an
    /// expired lease, release at shutdown and manual retry of a dead task.
    Pending,
    /// Claimed by a worker that holds a lease (`lease_until`, `lease_epoch`).
    Running,
    /// The handler returned `Ok` (terminal).
    Succeeded,
    /// Permanent error, undecodable payload or attempts exhausted (terminal, retryable by hand).
    Dead,
    /// Canceled (terminal): while pending by `Client::cancel`, or while running by a cancel
    /// request its worker (or the reaper, once the lease expired) honoured.
    Canceled,
    /// Its deadline passed before an attempt could start, so it was not (or not again) run
    /// (terminal). Set by the claim that finds it due past its deadline.
    Expired,
}

impl TaskState {
    /// All states, in lifecycle order.
    pub const ALL: [TaskState; 7] = [
        Self::Waiting,
        Self::Pending,
        Self::Running,
        Self::Succeeded,
        Self::Dead,
        Self::Canceled,
        Self::Expired,
    ];

    /// The value stored in the database.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Waiting => "waiting",
            Self::Pending => "pending",
            Self::Running => "running",
            Self::Succeeded => "succeeded",
            Self::Dead => "dead",
            Self::Canceled => "canceled",
            Self::Expired => "expired",
        }
    }

    /// Whether the task will never run again on its own.
    pub const fn is_terminal(self) -> bool {
        matches!(
            self,
            Self::Succeeded | Self::Dead | Self::Canceled | Self::Expired
        )
    }
}

impl fmt::Display for TaskState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Error parsing a [`TaskState`] from text. `Debug` prints the same sentence as `Display`
/// (`{:#?}` the structure).
#[derive(Clone, thiserror::Error)]
#[error(
    "unknown task state {0:?} (expected waiting, pending, running, succeeded, dead, canceled or expired)"
)]
pub struct ParseStateError(pub String);

impl fmt::Debug for ParseStateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if f.alternate() {
            f.debug_tuple("ParseStateError").field(&self.0).finish()
        } else {
            fmt::Display::fmt(self, f)
        }
    }
}

impl FromStr for TaskState {
    type Err = ParseStateError;
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| ParseStateError(s.to_owned()))
    }
}

// Decoding from the database (the `state` ENUM column and `id` / `lease_epoch` columns), so
// the store can read rows straight into public types.
impl sqlx::Type<sqlx::MySql> for TaskState {
    fn type_info() -> sqlx::mysql::MySqlTypeInfo {
        <str as sqlx::Type<sqlx::MySql>>::type_info()
    }
    fn compatible(ty: &sqlx::mysql::MySqlTypeInfo) -> bool {
        <str as sqlx::Type<sqlx::MySql>>::compatible(ty)
    }
}

impl<'r> sqlx::Decode<'r, sqlx::MySql> for TaskState {
    fn decode(value: sqlx::mysql::MySqlValueRef<'r>) -> Result<Self, sqlx::error::BoxDynError> {
        Ok(<&str as sqlx::Decode<sqlx::MySql>>::decode(value)?.parse()?)
    }
}

impl sqlx::Type<sqlx::MySql> for TaskId {
    fn type_info() -> sqlx::mysql::MySqlTypeInfo {
        <u64 as sqlx::Type<sqlx::MySql>>::type_info()
    }
    fn compatible(ty: &sqlx::mysql::MySqlTypeInfo) -> bool {
        <u64 as sqlx::Type<sqlx::MySql>>::compatible(ty)
    }
}

impl<'r> sqlx::Decode<'r, sqlx::MySql> for TaskId {
    fn decode(value: sqlx::mysql::MySqlValueRef<'r>) -> Result<Self, sqlx::error::BoxDynError> {
        Ok(TaskId(<u64 as sqlx::Decode<sqlx::MySql>>::decode(value)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_round_trips_through_text() {
        for st in TaskState::ALL {
            assert_eq!(st.as_str().parse::<TaskState>().unwrap(), st);
        }
        assert!("done".parse::<TaskState>().is_err());
        assert!(TaskState::Dead.is_terminal() && !TaskState::Running.is_terminal());
        assert!(TaskState::Expired.is_terminal());
        assert_eq!("expired".parse::<TaskState>().unwrap(), TaskState::Expired);
    }

    #[test]
    fn parse_error_debug_is_the_sentence() {
        let e = "done".parse::<TaskState>().unwrap_err();
        let sentence = "unknown task state \"done\" (expected waiting, pending, running, succeeded, \
                        dead, canceled or expired)";
        assert_eq!(e.to_string(), sentence);
        assert_eq!(format!("{e:?}"), sentence);
        assert_eq!(format!("{e:#?}"), "ParseStateError(\n    \"done\",\n)");
    }
}
