//! Ordered tasks: [`Ordered`] (which payload fields make the order key, and what a death does
//! to the key), and the derivation of the stored key.
//!
//! Tasks of one queue with the same order key run one at a time, in the order their enqueues
//! committed, across every worker; tasks of other keys run in parallel. The key is a SHA-256
//! of the queue and the selected payload fields (canonical JSON, as for unique tasks), so
//! different task names of one queue with the same field values are ordered together; or of
//! the queue and a key given at enqueue ([`Enqueue::with_order_key`](crate::Enqueue::with_order_key)).
//! See `docs/semantics.md` ("Ordered tasks") for the guarantees.

use serde_json::Value;

use crate::error::{Error, Result};

/// Declares a task ordered: tasks of one queue whose selected payload fields are equal run one
/// at a time, in commit order. Declared on the task (`#[taskq::task(ordered_by = [account])]`,
/// or [`Task::ORDERED`](crate::Task::ORDERED)).
///
/// A task that fails holds its key back while it retries (the tasks behind it wait). When it
/// dies (attempts exhausted, or a permanent error) it holds the key until an operator retries
/// or deletes it (a dead task cannot be canceled) — unless [`dead_after`](Self::dead_after)
/// says otherwise.
///
/// ```
/// use taskq::ordered::Ordered;
///
/// // One at a time per account, in commit order; a dead task holds its account back.
/// const PER_ACCOUNT: Ordered = Ordered::by(&["account"]);
/// // The same, but a task that fails 5 times dies and the account goes on.
/// const LENIENT: Ordered = Ordered::by(&["account"]).dead_after(5);
/// # let _ = (PER_ACCOUNT, LENIENT);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ordered {
    fields: &'static [&'static str],
    dead_after: Option<u32>,
}

impl Ordered {
    /// Ordered by these top-level payload fields (JSON names). An empty slice orders every
    /// task of the queue declared so, one at a time.
    pub const fn by(fields: &'static [&'static str]) -> Self {
        Self {
            fields,
            dead_after: None,
        }
    }

    /// The task's death lets its key go on with the next task, instead of holding the key until
    /// an operator acts; and `attempts` (at least 1) is the task's default number of attempts,
    /// in place of its declared `max_attempts` ([`Task::MAX_ATTEMPTS`](crate::Task::MAX_ATTEMPTS)).
    /// Like every declaration of a task, it is a default: an enqueue's
    /// [`with_max_attempts`](crate::Enqueue::with_max_attempts) overrides it for that task
    /// (as Oban's `max_attempts:` at insert overrides the worker's, and Sidekiq's
    /// `set(retry: n)` its `sidekiq_options`), and its death still lets the key go on.
    pub const fn dead_after(mut self, attempts: u32) -> Self {
        self.dead_after = Some(attempts);
        self
    }

    /// The payload fields that make the key.
    pub const fn fields(&self) -> &'static [&'static str] {
        self.fields
    }

    /// The attempts after which a death lets the key go on, if opted in.
    pub const fn dead_after_attempts(&self) -> Option<u32> {
        self.dead_after
    }

    /// The key of `payload` (the serialized task `name`) in `queue`.
    pub(crate) fn key(&self, queue: &str, name: &str, payload: &[u8]) -> Result<[u8; 32]> {
        let value: Value = serde_json::from_slice(payload).map_err(Error::Serialize)?;
        let Value::Object(mut obj) = value else {
            return Err(Error::InvalidOption(format!(
                "ordered_by fields {:?} of task {name:?} need a payload that is a JSON object",
                self.fields
            )));
        };
        let mut picked = serde_json::Map::new();
        for f in self.fields {
            match obj.remove(*f) {
                Some(v) => {
                    picked.insert((*f).to_owned(), v);
                }
                None if picked.contains_key(*f) => {}
                None => {
                    return Err(Error::InvalidOption(format!(
                        "ordered_by field {f:?} is not in the payload of task {name:?} \
                         (a field renamed or skipped by serde is looked up by its JSON name)"
                    )));
                }
            }
        }
        Ok(taskq_driver::rules::order::fields_key(queue, picked))
    }
}

pub(crate) use taskq_driver::rules::order::explicit_key;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_is_the_queue_and_the_selected_fields() {
        let by = Ordered::by(&["account"]);
        let a = by
            .key("ledger", "debit", br#"{"account":7,"amount":1}"#)
            .unwrap();
        let b = by
            .key("ledger", "credit", br#"{"amount":9,"account":7}"#)
            .unwrap();
        assert_eq!(a, b, "task names of one queue share a key");
        let other = by
            .key("ledger", "debit", br#"{"account":8,"amount":1}"#)
            .unwrap();
        assert_ne!(a, other);
        let queue = by
            .key("ledger2", "debit", br#"{"account":7,"amount":1}"#)
            .unwrap();
        assert_ne!(a, queue, "the queue is part of the key");
        let e = by.key("ledger", "debit", br#"{"amount":1}"#).unwrap_err();
        assert!(e.to_string().contains("\"account\""), "{e}");
        assert_ne!(explicit_key("ledger", "7"), explicit_key("ledger2", "7"));
        assert_eq!(by.dead_after(3).dead_after_attempts(), Some(3));
    }
}
