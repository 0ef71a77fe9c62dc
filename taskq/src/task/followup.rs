//! Durable follow-ups: the task enqueued, in the same transaction, when a task dies
//! ([`Task::ON_DEAD`]) or succeeds ([`Task::ON_SUCCESS`]).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::defaults::{MAX_DELAY, MAX_NAME_LEN, MAX_QUEUE_LEN, validate_name};
use crate::task::{Task, TaskId};

/// What a task's death hands its follow-up (see [`Task::ON_DEAD`]): the payload of an
/// `on_dead` target.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeadTask {
    /// The task that died.
    pub id: TaskId,
    /// Its name.
    pub name: String,
    /// Its queue.
    pub queue: String,
    /// Attempts it made (the number of its last attempt).
    pub attempts: u32,
    /// Its attempt budget.
    pub max_attempts: u32,
    /// The error its row stores: the last attempt's error, with the note `(attempts exhausted:
    /// n/m)` when it ran out of attempts, or `lease expired (worker …, attempt n)` when the
    /// reaper found its last lease expired.
    pub last_error: String,
    /// Its payload as JSON (a JSON string of the bytes, lossily decoded, when the payload is
    /// not JSON at all).
    pub payload: serde_json::Value,
}

/// What a task's success hands its follow-up (see [`Task::ON_SUCCESS`]): the payload of an
/// `on_success` target, so that a chain can pass data along.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SucceededTask {
    /// The task that succeeded.
    pub id: TaskId,
    /// Its name.
    pub name: String,
    /// Its queue.
    pub queue: String,
    /// Attempts it made (the number of the attempt that succeeded).
    pub attempts: u32,
    /// Its payload as JSON.
    pub payload: serde_json::Value,
}

/// A task's death hook: returns the follow-up to enqueue, or `None` for none.
pub type OnDead = fn(&DeadTask) -> Option<FollowUp>;
/// A task's success hook: returns the follow-up to enqueue, or `None` for none.
pub type OnSuccess = fn(&SucceededTask) -> Option<FollowUp>;

/// A task to enqueue as the follow-up of another task's end; returned by the hooks of
/// [`Task::ON_DEAD`] and [`Task::ON_SUCCESS`].
///
/// The follow-up goes to the target task's own queue, with its own priority, max attempts and
/// time to live, due at once. It is written in the transaction that records the end, with
/// the idempotency key `taskq:on_dead:<id>:<epoch>` (or `taskq:on_success:…`) naming the
/// attempt that ended. The target's [`Task::UNIQUE`] declaration does not apply: a unique
/// identity held by a producer's open transaction would make the write-back wait, so a
/// follow-up is never unique (the key already makes it one per end).
#[derive(Debug, Clone)]
pub struct FollowUp {
    pub(crate) name: &'static str,
    pub(crate) queue: &'static str,
    pub(crate) priority: i16,
    pub(crate) max_attempts: u32,
    pub(crate) ttl: Option<Duration>,
    /// The serialized task, or why it could not be built.
    pub(crate) payload: Result<Vec<u8>, String>,
}

impl FollowUp {
    /// The follow-up that enqueues `task` with its task's settings. A task that does not
    /// serialize (or has an invalid name or queue) is reported when the end is written: the
    /// task still ends, without a follow-up, and the error is logged and counted
    /// ([`StatsSnapshot::follow_up_errors`](crate::worker::StatsSnapshot::follow_up_errors)).
    pub fn new<T: Task>(task: T) -> Self {
        let checked = validate_name("task name", T::NAME, MAX_NAME_LEN)
            .and_then(|()| validate_name("queue name", T::QUEUE, MAX_QUEUE_LEN))
            .map_err(|e| e.to_string());
        let payload = checked.and_then(|()| {
            serde_json::to_vec(&task).map_err(|e| format!("the follow-up does not serialize: {e}"))
        });
        Self {
            name: T::NAME,
            queue: T::QUEUE,
            priority: T::PRIORITY,
            max_attempts: T::MAX_ATTEMPTS.max(1),
            ttl: T::TTL,
            payload,
        }
    }

    /// The follow-up's task name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The follow-up's queue.
    pub fn queue(&self) -> &'static str {
        self.queue
    }

    /// The time to live in microseconds, bounded like an enqueue's.
    pub(crate) fn ttl_us(&self) -> Option<i64> {
        self.ttl.map(|d| d.min(MAX_DELAY).as_micros() as i64)
    }
}

/// A payload as JSON: parsed, or (not JSON at all) a JSON string of the bytes.
pub(crate) fn payload_value(payload: &[u8]) -> serde_json::Value {
    serde_json::from_slice(payload).unwrap_or_else(|_| {
        serde_json::Value::String(String::from_utf8_lossy(payload).into_owned())
    })
}

/// The follow-up target trait, in a private module so that compile errors name it by its
/// only public path, `taskq::__private::FollowUpFrom`.
pub(crate) mod target {
    use crate::task::Task;

    /// Support for `#[taskq::task(on_dead = target)]` / `on_success`: a `#[task]` whose only payload
    /// parameter has type `E` is built from an `E`. Implemented by the macro; not public API.
    #[doc(hidden)]
    #[diagnostic::on_unimplemented(
        message = "`{Self}` is not a task whose only payload parameter is a `{E}`",
        label = "not a follow-up target for `{E}`",
        note = "the target of `on_dead` must be a `#[taskq::task]` fn whose only payload parameter is `taskq::DeadTask`; the target of `on_success`, one whose only payload parameter is `taskq::SucceededTask`",
        note = "for a hand-written `Task`, set `Task::ON_DEAD` / `Task::ON_SUCCESS` to a hook returning `taskq::followup::FollowUp::new(..)`"
    )]
    pub trait FollowUpFrom<E>: Task {
        /// The task with `ended` as its only payload field.
        fn __taskq_follow_up(ended: E) -> Self;
    }
}
