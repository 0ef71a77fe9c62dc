//! Unique tasks: [`Unique`] (what makes two tasks "the same" and how long a task keeps others
//! out); the derivation of the stored identity is a rule of the bottom layer
//! (`taskq_driver::rules::unique`).
//!
//! A unique task's identity is a SHA-256 of the task name and the selected payload fields
//! (canonical JSON: object keys sorted, no whitespace), plus, for a window, the period and the
//! window's number on the database clock. It is stored in the task's `unique_key`; while the
//! task holds it, a `taskq_unique` row keyed by it names the task. See `docs/semantics.md`
//! ("Unique tasks") for the guarantees and `docs/design.md` for the statements.

use std::time::Duration;

use serde_json::Value;
use taskq_driver::rules::unique as rule;

use crate::defaults::MAX_DELAY;
use crate::error::{Error, Result};

/// Which part of the payload makes two tasks of one name the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum UniqueBy {
    /// The whole payload (every field).
    Payload,
    /// These top-level fields of the payload's JSON object (by their JSON name). An empty list
    /// means the task name alone: at most one such task at a time.
    Fields(&'static [&'static str]),
}

/// How long a unique task holds its identity, keeping out enqueues of the same identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum UniqueHold {
    /// While it is pending (waiting or scheduled): a worker starting it, or a cancel, frees
    /// the identity. The default.
    Pending,
    /// While it is pending or running, retries included: it frees the identity when it
    /// succeeds, dies or is canceled.
    Running,
    /// For the window of this length it was enqueued in: windows are consecutive periods of
    /// the database clock counted from the Unix epoch (`floor(now / period)`), so the identity
    /// is taken at most once per window. Pending, running and succeeded tasks hold it until
    /// the window ends; a task that is canceled or dies frees it.
    Window(Duration),
}

/// Declares a task unique: at most one live task per identity (task name plus all or some
/// payload fields), where "live" is set by [`UniqueHold`]. An enqueue whose identity is held
/// inserts nothing and returns the holder's id with `duplicate = true`, without an error and
/// without aborting the caller's transaction.
///
/// Declared on the task (`#[taskq::task(unique)]`, or [`Task::UNIQUE`](crate::Task::UNIQUE))
/// or per enqueue ([`Enqueue::with_unique`](crate::Enqueue::with_unique)). Build one with
/// [`Unique::payload`] or [`Unique::fields`] and refine it with [`while_running`](Self::while_running)
/// or [`period`](Self::period); every constructor is `const`.
///
/// ```
/// use std::time::Duration;
/// use taskq::unique::Unique;
///
/// // At most one pending task per payload.
/// const DEBOUNCE: Unique = Unique::payload();
/// // At most one pending or running task per `account_id`.
/// const PER_ACCOUNT: Unique = Unique::fields(&["account_id"]).while_running();
/// // At most one task per `account_id` per 10-minute window.
/// const THROTTLE: Unique = Unique::fields(&["account_id"]).period(Duration::from_secs(600));
/// # let _ = (DEBOUNCE, PER_ACCOUNT, THROTTLE);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Unique {
    by: UniqueBy,
    hold: UniqueHold,
}

impl Unique {
    /// Unique by the whole payload, held while pending.
    pub const fn payload() -> Self {
        Self {
            by: UniqueBy::Payload,
            hold: UniqueHold::Pending,
        }
    }

    /// Unique by these top-level payload fields (JSON names), held while pending. An empty
    /// slice makes the task name alone the identity.
    pub const fn fields(fields: &'static [&'static str]) -> Self {
        Self {
            by: UniqueBy::Fields(fields),
            hold: UniqueHold::Pending,
        }
    }

    /// Held while pending: the identity is free again once a worker starts the task.
    pub const fn while_pending(mut self) -> Self {
        self.hold = UniqueHold::Pending;
        self
    }

    /// Held while pending or running (retries included): the identity is free again once the
    /// task succeeds, dies or is canceled.
    pub const fn while_running(mut self) -> Self {
        self.hold = UniqueHold::Running;
        self
    }

    /// At most one task per window of `period` (database clock): see [`UniqueHold::Window`].
    /// Replaces `while_pending` / `while_running`.
    pub const fn period(mut self, period: Duration) -> Self {
        self.hold = UniqueHold::Window(period);
        self
    }

    /// What makes two tasks the same.
    pub const fn by(&self) -> UniqueBy {
        self.by
    }

    /// How long a task holds its identity.
    pub const fn hold(&self) -> UniqueHold {
        self.hold
    }

    /// Checks the declaration and derives the identity of `payload` (the serialized task)
    /// for the task `name`. The window, if any, is applied at insert time
    /// ([`PreparedUnique::key`]), on the database clock.
    pub(crate) fn prepare(&self, name: &str, payload: &[u8]) -> Result<PreparedUnique> {
        let window_us = match self.hold {
            UniqueHold::Window(p) => {
                if p.as_micros() == 0 || p > MAX_DELAY {
                    return Err(Error::InvalidOption(format!(
                        "unique period must be between 1µs and {} days, got {p:?}",
                        MAX_DELAY.as_secs() / 86_400
                    )));
                }
                Some(p.as_micros() as i64)
            }
            _ => None,
        };
        let value: Value = serde_json::from_slice(payload).map_err(Error::Serialize)?;
        let fields = match self.by {
            UniqueBy::Payload => None,
            UniqueBy::Fields(fields) => Some(fields),
        };
        let selected = rule::select(value, fields).map_err(|e| match e {
            rule::SelectError::NotObject => Error::InvalidOption(format!(
                "unique fields {fields:?} of task {name:?} need a payload that is a JSON object",
                fields = fields.unwrap_or_default()
            )),
            rule::SelectError::Missing(f) => Error::InvalidOption(format!(
                "unique field {f:?} is not in the payload of task {name:?} \
                 (a field renamed or skipped by serde is looked up by its JSON name)"
            )),
        })?;
        Ok(PreparedUnique {
            base: rule::base_key(name, &selected),
            hold: self.hold,
            window_us,
        })
    }
}

/// A unique declaration applied to one payload: the identity before the window.
#[derive(Debug, Clone)]
pub(crate) struct PreparedUnique {
    base: [u8; 32],
    hold: UniqueHold,
    window_us: Option<i64>,
}

impl PreparedUnique {
    /// The `unique_while` column value.
    pub(crate) fn while_value(&self) -> &'static str {
        match self.hold {
            UniqueHold::Pending => "pending",
            UniqueHold::Running => "running",
            UniqueHold::Window(_) => "window",
        }
    }

    /// Whether [`key`](Self::key) needs the database clock.
    pub(crate) fn needs_clock(&self) -> bool {
        self.window_us.is_some()
    }

    /// The stored identity; `clock_us` is the database clock in microseconds since the Unix
    /// epoch, required for a window.
    pub(crate) fn key(&self, clock_us: Option<i64>) -> [u8; 32] {
        match self.window_us {
            None => self.base,
            Some(period) => {
                let now = clock_us.expect("the database clock is read for a windowed identity");
                rule::window_key(&self.base, period, now)
            }
        }
    }

    /// For a window: when it ends, in microseconds since the Unix epoch (database clock).
    pub(crate) fn window_end_us(&self, clock_us: Option<i64>) -> Option<i64> {
        Some(rule::window_end_us(self.window_us?, clock_us?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(u: Unique, name: &str, json: &str) -> Result<[u8; 32]> {
        Ok(u.prepare(name, json.as_bytes())?.key(Some(0)))
    }

    #[test]
    fn identity_depends_on_name_and_selected_fields_only() {
        let p = Unique::payload();
        assert_eq!(
            key(p, "t", r#"{"a":1,"b":2}"#).unwrap(),
            key(p, "t", r#"{"b":2,"a":1}"#).unwrap()
        );
        assert_ne!(
            key(p, "t", r#"{"a":1,"b":2}"#).unwrap(),
            key(p, "u", r#"{"a":1,"b":2}"#).unwrap()
        );
        assert_ne!(
            key(p, "t", r#"{"a":1,"b":2}"#).unwrap(),
            key(p, "t", r#"{"a":1,"b":3}"#).unwrap()
        );
        let a = Unique::fields(&["a"]);
        assert_eq!(
            key(a, "t", r#"{"a":1,"b":2}"#).unwrap(),
            key(a, "t", r#"{"a":1,"b":3}"#).unwrap()
        );
        assert_ne!(
            key(a, "t", r#"{"a":1,"b":2}"#).unwrap(),
            key(a, "t", r#"{"a":2,"b":2}"#).unwrap()
        );
        // The hold is not part of the identity.
        assert_eq!(
            key(a, "t", r#"{"a":1}"#).unwrap(),
            key(a.while_running(), "t", r#"{"a":1}"#).unwrap()
        );
        // No fields: the name alone.
        let none = Unique::fields(&[]);
        assert_eq!(
            key(none, "t", r#"{"a":1}"#).unwrap(),
            key(none, "t", r#"{"a":2}"#).unwrap()
        );
    }

    #[test]
    fn windows_are_numbered_on_the_given_clock() {
        let w = Unique::payload().period(Duration::from_secs(10));
        let p = w.prepare("t", b"{}").unwrap();
        assert!(p.needs_clock());
        assert_eq!(p.while_value(), "window");
        assert_eq!(p.key(Some(10_000_000)), p.key(Some(19_999_999)));
        assert_ne!(p.key(Some(19_999_999)), p.key(Some(20_000_000)));
        assert_eq!(p.window_end_us(Some(19_999_999)), Some(20_000_000));
        assert_eq!(p.window_end_us(Some(20_000_000)), Some(30_000_000));
        assert_ne!(
            p.key(Some(10_000_000)),
            Unique::payload().prepare("t", b"{}").unwrap().key(None)
        );
        let other = Unique::payload()
            .period(Duration::from_secs(20))
            .prepare("t", b"{}")
            .unwrap();
        assert_ne!(p.key(Some(0)), other.key(Some(0)));
    }

    #[test]
    fn bad_declarations_are_typed_errors() {
        let e = key(Unique::fields(&["nope"]), "t", r#"{"a":1}"#).unwrap_err();
        assert!(
            matches!(&e, Error::InvalidOption(m) if m.contains("\"nope\"")),
            "{e}"
        );
        let e = key(Unique::fields(&["a"]), "t", "[1]").unwrap_err();
        assert!(
            matches!(&e, Error::InvalidOption(m) if m.contains("JSON object")),
            "{e}"
        );
        let e = key(Unique::payload().period(Duration::ZERO), "t", "{}").unwrap_err();
        assert!(
            matches!(&e, Error::InvalidOption(m) if m.contains("period")),
            "{e}"
        );
        let e = key(Unique::payload().period(MAX_DELAY * 2), "t", "{}").unwrap_err();
        assert!(matches!(e, Error::InvalidOption(_)));
        // A field listed twice is fine.
        assert!(key(Unique::fields(&["a", "a"]), "t", r#"{"a":1}"#).is_ok());
    }
}
