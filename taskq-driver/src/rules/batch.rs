//! Batches, the rules every driver follows: how a member's end is counted in its batch's
//! counters (exactly once per end: [`count`]), what the counters then release (the
//! `on_complete` and `on_success` callbacks: [`callbacks`]), and a batch's state
//! ([`batch_state`]).
//!
//! A batch's counters live on its row (`total`, `succeeded`, `failed`), so its progress is
//! read without reading its members. Each member row records how its task's end was counted
//! ([`Counted`]); the driver locks it, reads it, and applies [`count`]'s delta once. The
//! callbacks are ordinary tasks inserted `waiting` with the batch and made due (or canceled)
//! by the count that completes the batch, under the batch row's lock: once, whichever
//! worker's count comes last.

use crate::state::TaskState;

/// A batch's id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(transparent)]
pub struct BatchId(pub u64);

impl std::fmt::Display for BatchId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.0, f)
    }
}

/// How a member's end is counted in its batch (the member row's `counted`, stored as
/// [`as_i8`](Self::as_i8)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counted {
    /// Not counted: the member has not ended (or its end has not been counted yet).
    No,
    /// Counted in `succeeded`.
    Succeeded,
    /// Counted in `failed` (dead, canceled, expired or deleted).
    Failed,
}

impl Counted {
    /// The stored value: 0, 1 or 2.
    pub fn as_i8(self) -> i8 {
        match self {
            Self::No => 0,
            Self::Succeeded => 1,
            Self::Failed => 2,
        }
    }

    /// From the stored value; anything unknown reads as not counted.
    pub fn from_i8(v: i8) -> Self {
        match v {
            1 => Self::Succeeded,
            2 => Self::Failed,
            _ => Self::No,
        }
    }
}

/// What one count changes in its batch's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Delta {
    /// Change of `succeeded`.
    pub succeeded: i64,
    /// Change of `failed`.
    pub failed: i64,
}

impl Delta {
    /// Adds another delta.
    pub fn add(&mut self, other: Delta) {
        self.succeeded += other.succeeded;
        self.failed += other.failed;
    }

    /// Whether it changes nothing.
    pub fn is_zero(&self) -> bool {
        self.succeeded == 0 && self.failed == 0
    }
}

/// How a member counted as `prev` whose task is now in `state` (`None`: the task was deleted)
/// is counted, and the change to its batch's counters. A success counts in `succeeded`, a
/// dead, canceled or expired member in `failed`; a member that has not ended is not counted,
/// so a failed member an operator retried leaves `failed` until its next end. A deleted
/// member keeps what it was counted as, or counts as failed if it was not counted yet.
pub fn count(prev: Counted, state: Option<TaskState>) -> (Counted, Delta) {
    let next = match state {
        None if prev == Counted::No => Counted::Failed,
        None => prev,
        Some(TaskState::Succeeded) => Counted::Succeeded,
        Some(TaskState::Dead | TaskState::Canceled | TaskState::Expired) => Counted::Failed,
        Some(TaskState::Waiting | TaskState::Pending | TaskState::Running) => Counted::No,
    };
    let weight = |c: Counted| match c {
        Counted::No => Delta::default(),
        Counted::Succeeded => Delta {
            succeeded: 1,
            failed: 0,
        },
        Counted::Failed => Delta {
            succeeded: 0,
            failed: 1,
        },
    };
    let (a, b) = (weight(next), weight(prev));
    (
        next,
        Delta {
            succeeded: a.succeeded - b.succeeded,
            failed: a.failed - b.failed,
        },
    )
}

/// A batch's counters and flags, as the count reads them under the batch row's lock (after
/// applying its deltas).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchCounters {
    /// Members added.
    pub total: u64,
    /// Members counted as succeeded.
    pub succeeded: u64,
    /// Members counted as failed.
    pub failed: u64,
    /// No member will be added unless a member adds it: the callbacks may be released.
    pub sealed: bool,
    /// An operator canceled the batch (its callbacks were canceled with it).
    pub canceled: bool,
    /// Every member had ended once: `on_complete` was released (`completed_at`).
    pub completed: bool,
    /// Every member had succeeded once: `on_success` was released (`succeeded_at`).
    pub success_released: bool,
}

impl BatchCounters {
    /// Members not counted as ended.
    pub fn pending(&self) -> u64 {
        self.total.saturating_sub(self.succeeded + self.failed)
    }
}

/// What to do with the `on_success` callback (a task inserted `waiting` with the batch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Success {
    /// Nothing.
    Keep,
    /// Every member succeeded: make it due (`waiting` → `pending`).
    Release,
    /// The batch completed with failures: cancel it with [`CANCELED_BY_BATCH`].
    Cancel,
    /// The members the completion counted as failed were retried and have all succeeded:
    /// bring it back from [`CANCELED_BY_BATCH`] to `pending`.
    Revive,
}

/// What a count's new counters release, once each: `complete` (make `on_complete` due and
/// record `completed_at`) when the batch is sealed and every member has ended for the first
/// time; `success` as [`Success`] says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Callbacks {
    /// Release `on_complete` and record `completed_at`.
    pub complete: bool,
    /// What to do with `on_success`.
    pub success: Success,
}

/// What the counters `b` (after a count or a seal) release. Nothing while the batch is open
/// or after an operator canceled it.
pub fn callbacks(b: &BatchCounters) -> Callbacks {
    let none = Callbacks {
        complete: false,
        success: Success::Keep,
    };
    if !b.sealed || b.canceled || b.pending() > 0 {
        return none;
    }
    let complete = !b.completed;
    let success = if b.failed == 0 && b.succeeded == b.total && !b.success_released {
        if b.completed {
            Success::Revive
        } else {
            Success::Release
        }
    } else if complete && b.failed > 0 {
        Success::Cancel
    } else {
        Success::Keep
    };
    Callbacks { complete, success }
}

/// The error recorded on an `on_success` callback canceled because a member of its batch did
/// not succeed.
pub const CANCELED_BY_BATCH: &str = "canceled: a task of its batch did not succeed";

/// A batch's state, from its counters ([`batch_state`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BatchState {
    /// Not sealed: members may still be added, and the callbacks wait for the seal.
    Open,
    /// Sealed, and some member has not ended.
    Running,
    /// Every member succeeded.
    Succeeded,
    /// Every member ended and some did not succeed.
    Failed,
    /// Canceled by an operator, and every member ended.
    Canceled,
}

impl BatchState {
    /// The state's name (`open`, `running`, `succeeded`, `failed`, `canceled`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Open => "open",
            Self::Running => "running",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Canceled => "canceled",
        }
    }

    /// Whether the batch has ended (succeeded, failed, canceled).
    pub fn is_ended(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed | Self::Canceled)
    }
}

impl std::fmt::Display for BatchState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A batch's state: `open` until sealed (unless canceled), `running` while a member has not
/// ended, then `canceled` if an operator canceled it, `succeeded` if every member succeeded,
/// `failed` if not.
pub fn batch_state(b: &BatchCounters) -> BatchState {
    if !b.sealed && !b.canceled {
        BatchState::Open
    } else if b.pending() > 0 {
        BatchState::Running
    } else if b.canceled {
        BatchState::Canceled
    } else if b.failed == 0 {
        BatchState::Succeeded
    } else {
        BatchState::Failed
    }
}

/// Why members cannot be added to a batch (or it cannot be sealed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddRefused {
    /// No batch has the id.
    NotFound,
    /// Its `on_complete` was released (every member had ended), or an operator canceled it.
    Ended,
}

/// Whether members may be added to a batch with counters `b`: not after it completed or was
/// canceled (a member that is still running may add to its own batch: the batch has not
/// completed while it runs).
pub fn may_add(b: &BatchCounters) -> Result<(), AddRefused> {
    if b.completed || b.canceled {
        Err(AddRefused::Ended)
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use TaskState::*;

    #[test]
    fn each_end_is_counted_once_and_a_retry_uncounts_a_failure() {
        assert_eq!(
            count(Counted::No, Some(Succeeded)),
            (
                Counted::Succeeded,
                Delta {
                    succeeded: 1,
                    failed: 0
                }
            )
        );
        for s in [Dead, Canceled, Expired] {
            assert_eq!(
                count(Counted::No, Some(s)),
                (
                    Counted::Failed,
                    Delta {
                        succeeded: 0,
                        failed: 1
                    }
                )
            );
        }
        // Counted twice: no change.
        assert!(count(Counted::Succeeded, Some(Succeeded)).1.is_zero());
        assert!(count(Counted::Failed, Some(Dead)).1.is_zero());
        // A failed member retried by an operator is pending again: uncounted.
        assert_eq!(
            count(Counted::Failed, Some(Pending)),
            (
                Counted::No,
                Delta {
                    succeeded: 0,
                    failed: -1
                }
            )
        );
        // ... or it already succeeded before the sweep saw it pending.
        assert_eq!(
            count(Counted::Failed, Some(Succeeded)),
            (
                Counted::Succeeded,
                Delta {
                    succeeded: 1,
                    failed: -1
                }
            )
        );
        for s in [Waiting, Pending, Running] {
            assert_eq!(count(Counted::No, Some(s)), (Counted::No, Delta::default()));
        }
        // Deleted: a failure unless it was counted already.
        assert_eq!(count(Counted::No, None).0, Counted::Failed);
        assert_eq!(
            count(Counted::Succeeded, None),
            (Counted::Succeeded, Delta::default())
        );
        for c in [Counted::No, Counted::Succeeded, Counted::Failed] {
            assert_eq!(Counted::from_i8(c.as_i8()), c);
        }
    }

    fn b(total: u64, succeeded: u64, failed: u64) -> BatchCounters {
        BatchCounters {
            total,
            succeeded,
            failed,
            sealed: true,
            ..BatchCounters::default()
        }
    }

    #[test]
    fn the_last_end_releases_the_callbacks_once() {
        // Not yet complete: nothing.
        assert_eq!(
            callbacks(&b(3, 2, 0)),
            Callbacks {
                complete: false,
                success: Success::Keep
            }
        );
        // All succeeded: both.
        assert_eq!(
            callbacks(&b(3, 3, 0)),
            Callbacks {
                complete: true,
                success: Success::Release
            }
        );
        // Once: after they were released, nothing more.
        let done = BatchCounters {
            completed: true,
            success_released: true,
            ..b(3, 3, 0)
        };
        assert!(!callbacks(&done).complete);
        assert_eq!(callbacks(&done).success, Success::Keep);
        // With a failure: on_complete, and on_success canceled.
        assert_eq!(
            callbacks(&b(3, 2, 1)),
            Callbacks {
                complete: true,
                success: Success::Cancel
            }
        );
        // The failure retried (uncounted): pending again, nothing.
        let retried = BatchCounters {
            completed: true,
            ..b(3, 2, 0)
        };
        assert_eq!(callbacks(&retried).success, Success::Keep);
        // It succeeded: on_success comes back, on_complete is not released again.
        let healed = BatchCounters {
            completed: true,
            ..b(3, 3, 0)
        };
        assert_eq!(
            callbacks(&healed),
            Callbacks {
                complete: false,
                success: Success::Revive
            }
        );
    }

    #[test]
    fn an_open_or_canceled_batch_releases_nothing() {
        let open = BatchCounters {
            sealed: false,
            ..b(2, 2, 0)
        };
        assert!(!callbacks(&open).complete);
        assert_eq!(batch_state(&open), BatchState::Open);
        let canceled = BatchCounters {
            canceled: true,
            ..b(2, 1, 1)
        };
        assert!(!callbacks(&canceled).complete);
        assert_eq!(batch_state(&canceled), BatchState::Canceled);
        assert_eq!(may_add(&canceled), Err(AddRefused::Ended));
    }

    #[test]
    fn the_state_follows_the_counters() {
        assert_eq!(batch_state(&b(3, 1, 0)), BatchState::Running);
        assert_eq!(batch_state(&b(3, 3, 0)), BatchState::Succeeded);
        assert_eq!(batch_state(&b(3, 2, 1)), BatchState::Failed);
        assert_eq!(b(3, 1, 1).pending(), 1);
        assert_eq!(may_add(&b(3, 1, 0)), Ok(()));
        let completed = BatchCounters {
            completed: true,
            ..b(3, 3, 0)
        };
        assert_eq!(may_add(&completed), Err(AddRefused::Ended));
    }
}
