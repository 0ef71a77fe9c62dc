//! Events (the outbox, issue 26): the rows the runtime and the drivers exchange for
//! `taskq_events` and `taskq_event_keys`, and the rules both drivers apply (a key's hash, what
//! a settled key becomes).
//!
//! A key (`topic`, `key`) is identified in both tables by [`key_hash`]. Each key row counts
//! the key's sequence numbers (`next_seq`, taken under the row's lock by the publishing
//! transaction, so seq order is commit order) and how far the relays got (`done_seq`: every
//! event up to it is delivered or dead). A relay leases keys ([`EventLease`]), reads their
//! pending events in seq order ([`EventRow`]), publishes them and settles each key
//! ([`EventSettle`]) under the lease's epoch.
//!
//! **The key's `done_seq` is the record of delivery**: an event row is never written when it
//! is delivered. Its state is derived ([`EventState::of`]): dead when marked dead
//! (`dead_at`), else delivered when its seq is at most its key's `done_seq`, else pending. A
//! dead mark is only ever on an event at or below its key's `done_seq` (a settle moves
//! `done_seq` past the events it dead-letters, a skip past the held event, and a replay
//! that rewinds `done_seq` clears the marks above it), so a key's pending events are exactly
//! `done_seq + 1 ..= next_seq` and a topic's pending count is the sum of its keys'
//! `next_seq - done_seq`. One exception: an operator's skip of a held key that a range replay
//! had rewound below the held event (`taskq_driver::rules::event_key_release`) marks that
//! event dead above `done_seq`, so the replayed events before it are still sent; the relay
//! reads no dead event ([`EventRange`]) and its settle moves `done_seq` past it, and until
//! then it counts as pending.

use chrono::{DateTime, Utc};
use sha2::{Digest, Sha256};

/// The identity of a key in `taskq_events` and `taskq_event_keys`: SHA-256 of the topic, a
/// zero byte and the key.
pub fn key_hash(topic: &str, key: &str) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(topic.as_bytes());
    h.update([0u8]);
    h.update(key.as_bytes());
    h.finalize().into()
}

/// A fresh message id: 32 lower-case hex characters of 128 random bits from the operating
/// system's CSPRNG (`getrandom`), so ids are neither predictable nor tied to a seedable
/// generator's state.
pub fn new_message_id() -> String {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).expect("the operating system's random source");
    format!("{:032x}", u128::from_be_bytes(bytes))
}

/// State of an event, derived from its row and its key's row (see the module's doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EventState {
    /// Not delivered yet (or replayed).
    Pending,
    /// The sink said delivered.
    Delivered,
    /// Rejected and dead-lettered, or skipped by an operator.
    Dead,
}

impl EventState {
    /// The state of event `seq` of a key whose `done_seq` is given, `dead` when the row
    /// carries a dead mark: the one place both drivers derive it.
    pub fn of(seq: u64, done_seq: u64, dead: bool) -> Self {
        if dead {
            EventState::Dead
        } else if seq <= done_seq {
            EventState::Delivered
        } else {
            EventState::Pending
        }
    }

    /// The state as stored.
    pub fn as_str(self) -> &'static str {
        match self {
            EventState::Pending => "pending",
            EventState::Delivered => "delivered",
            EventState::Dead => "dead",
        }
    }

    /// Parses a stored state.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "pending" => EventState::Pending,
            "delivered" => EventState::Delivered,
            "dead" => EventState::Dead,
            _ => return None,
        })
    }
}

/// An event to insert in the caller's transaction.
#[derive(Debug, Clone)]
pub struct NewEvent<'a> {
    /// Topic (subject, routing key, stream), 1..=255 bytes.
    pub topic: &'a str,
    /// Ordering key, 1..=255 bytes.
    pub key: &'a str,
    /// The message id (see [`new_message_id`]).
    pub message_id: &'a str,
    /// Payload bytes.
    pub payload: &'a [u8],
    /// Headers, in order.
    pub headers: &'a [(String, String)],
}

/// What a replay of a time range did, per statement batch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RangeReplayed {
    /// Delivered or dead events of the range read (at most the batch's limit; fewer: the
    /// range is done).
    pub read: u64,
    /// Events that became pending: for each key among them, every stored event from its
    /// lowest replayed seq up to its old `done_seq`.
    pub events: u64,
}

/// What [`NewEvent`]'s insert stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventInserted {
    /// The event row's id.
    pub id: u64,
    /// Its sequence number within its key (1, 2, ... in commit order).
    pub seq: u64,
}

/// A relay's request for keys to lease.
#[derive(Debug, Clone)]
pub struct EventClaim<'a> {
    /// The relay (`lease_owner`).
    pub owner: &'a str,
    /// Only keys of these topics; `None`: every topic.
    pub topics: Option<&'a crate::rows::NameList>,
    /// Most keys.
    pub limit: u32,
    /// Most events: keys are leased in ready order until their backlogs (`next_seq -
    /// done_seq` each) reach this many; the key that reaches it is the last one leased (so at
    /// least one key is leased when any is ready). `u64::MAX`: up to `limit` keys whatever
    /// their backlogs.
    pub events: u64,
    /// Lease length (µs).
    pub lease_us: i64,
    /// Few or no keys are expected to be ready (the relay reads on keys it holds and its last
    /// claim found none): a driver may first look for ready keys with one plain statement and
    /// open the claim's transaction only when there are some (on MySQL one statement instead
    /// of three when there are none, one more when there are). The same keys are leased
    /// either way.
    pub probe: bool,
}

/// How many of `backlogs` (in ready order) a claim of at most `events` events leases: keys up
/// to and including the first at which the running sum of backlogs reaches `events` (at
/// least one key when there is any).
pub fn keys_for_events(backlogs: impl IntoIterator<Item = u64>, events: u64) -> usize {
    let mut sum = 0u64;
    let mut n = 0;
    for b in backlogs {
        if n > 0 && sum >= events {
            break;
        }
        sum = sum.saturating_add(b);
        n += 1;
    }
    n
}

/// Shares a round's event `budget` among leased keys by their backlogs (water-filling): a
/// key with a short backlog gets all of it, and what it leaves goes to keys with longer ones,
/// evenly. Each key with a backlog gets at least one event when `budget` is at least the
/// number of keys; the shares never add up to more than `budget` otherwise. `caps` limits a
/// key further (`None`: its backlog only).
pub fn share_budget(backlogs: &[u64], caps: &[Option<u64>], budget: u64) -> Vec<u64> {
    let want: Vec<u64> = backlogs
        .iter()
        .zip(caps.iter().chain(std::iter::repeat(&None)))
        .map(|(b, c)| c.map_or(*b, |c| c.min(*b)))
        .collect();
    let mut order: Vec<usize> = (0..want.len()).collect();
    order.sort_by_key(|&i| want[i]);
    let mut out = vec![0; want.len()];
    let mut left = budget;
    for (done, &i) in order.iter().enumerate() {
        let keys_left = (want.len() - done) as u64;
        // An even share of what is left, rounded up for the first keys (so the budget is
        // used up), never more than the key wants.
        let share = left.div_ceil(keys_left).min(want[i]);
        out[i] = share;
        left -= share;
    }
    out
}

/// A key a relay leased.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventLease {
    /// The key's hash.
    pub key_hash: [u8; 32],
    /// Topic.
    pub topic: String,
    /// Key.
    pub key: String,
    /// The lease's epoch (every settle and renewal is conditional on it).
    pub epoch: u64,
    /// Every event up to this seq is delivered or dead.
    pub done_seq: u64,
    /// The key's last seq (as of the lease).
    pub next_seq: u64,
    /// Failed rounds in a row before this lease.
    pub failures: u32,
}

/// The events of one key to read: the events with `after_seq < seq <= up_to` (none of them
/// dead: see the module's doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventRange {
    /// The key's hash.
    pub key_hash: [u8; 32],
    /// Exclusive lower bound.
    pub after_seq: u64,
    /// Inclusive upper bound.
    pub up_to: u64,
}

/// A pending event as the relay reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventRow {
    /// Row id.
    pub id: u64,
    /// The key's hash.
    pub key_hash: [u8; 32],
    /// Sequence number within the key.
    pub seq: u64,
    /// Topic.
    pub topic: String,
    /// Key.
    pub key: String,
    /// Message id.
    pub message_id: String,
    /// Payload bytes.
    pub payload: Vec<u8>,
    /// Headers.
    pub headers: Vec<(String, String)>,
}

/// What a settled key becomes.
#[derive(Debug, Clone, PartialEq)]
pub enum KeyNext {
    /// Everything read went out (or was dead-lettered): the lease ends, the key is ready at
    /// once if it has more (`done_seq < next_seq`), idle otherwise; failures reset.
    Release,
    /// Everything read went out (or was dead-lettered) and the relay goes on with the key's
    /// next events in its next round: `done_seq` moves and failures reset, as with
    /// `Release`, but the lease stays (same owner, epoch and end).
    Keep,
    /// A transient failure: the lease ends, the key is ready again after `delay_us`; failures
    /// + 1, the error kept.
    Backoff {
        /// Backoff (µs).
        delay_us: i64,
        /// The failure.
        error: String,
    },
    /// A rejected event holds the key (strict mode) at `seq`, with the error, until an
    /// operator acts.
    Hold {
        /// The rejected event's seq.
        seq: u64,
        /// The rejection.
        error: String,
    },
}

impl KeyNext {
    /// How both drivers' settle statements carry what a key becomes, per key in JSON:
    /// `(code, backoff µs, error, held seq)`, code 0 release, 1 backoff, 2 hold, 3 keep (the
    /// `CASE`s of `event_key_settle` on MySQL and SQLite read these codes).
    pub fn encode(&self) -> (u8, i64, Option<&str>, Option<u64>) {
        match self {
            KeyNext::Release => (0, 0, None, None),
            KeyNext::Backoff { delay_us, error } => (1, *delay_us, Some(error.as_str()), None),
            KeyNext::Hold { seq, error } => (2, 0, Some(error.as_str()), Some(*seq)),
            KeyNext::Keep => (3, 0, None, None),
        }
    }
}

/// How a relay settles one leased key, conditional on its epoch.
#[derive(Debug, Clone, PartialEq)]
pub struct EventSettle {
    /// The key's hash.
    pub key_hash: [u8; 32],
    /// The lease's epoch.
    pub epoch: u64,
    /// The key's new `done_seq` (never lowered): every event up to it is delivered or in
    /// `dead`. Nothing else is written per event.
    pub done_seq: u64,
    /// Events dead-lettered (ids, with the rejection), all at or below `done_seq`.
    pub dead: Vec<(u64, String)>,
    /// What the key becomes.
    pub next: KeyNext,
}

/// Per topic: pending events, the oldest one's creation, held keys.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct EventTopicStats {
    /// Topic.
    pub topic: String,
    /// Events not delivered (nor dead): the sum of the topic's keys' `next_seq - done_seq`.
    pub pending: u64,
    /// When the oldest pending event was published (database clock): the earliest of the
    /// keys' first pending events; `None`: none pending.
    pub oldest_pending_at: Option<DateTime<Utc>>,
    /// Keys held by a rejected event.
    pub held_keys: u64,
}

/// A key held by a rejected event.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct HeldEventKey {
    /// Topic.
    pub topic: String,
    /// Key.
    pub key: String,
    /// The rejected event's seq.
    pub seq: u64,
    /// The rejection.
    pub error: String,
    /// Held since (database clock).
    pub since: DateTime<Utc>,
}

/// One event row, for operators and tests.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct EventInfo {
    /// Row id.
    pub id: u64,
    /// Topic.
    pub topic: String,
    /// Key.
    pub key: String,
    /// Sequence number within the key.
    pub seq: u64,
    /// Message id.
    pub message_id: String,
    /// State (derived: see [`EventState::of`]).
    pub state: EventState,
    /// Published (database clock).
    pub created_at: DateTime<Utc>,
    /// When it was dead-lettered or skipped; `None` unless dead. (No time is kept per
    /// delivered event: the key's `done_seq` records delivery.)
    pub dead_at: Option<DateTime<Utc>>,
    /// The rejection of a dead event.
    pub last_error: Option<String>,
}

/// One key's relay state, for operators and tests.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct EventKeyInfo {
    /// Topic.
    pub topic: String,
    /// Key.
    pub key: String,
    /// The key's last seq.
    pub next_seq: u64,
    /// Every event up to it is delivered or dead.
    pub done_seq: u64,
    /// The lease's epoch.
    pub lease_epoch: u64,
    /// The relay holding a lease (it may have expired).
    pub lease_owner: Option<String>,
    /// Until when the lease runs (database clock); `None`: no lease.
    pub lease_until: Option<DateTime<Utc>>,
    /// Whether a lease is held now (database clock).
    pub leased: bool,
    /// Failed rounds in a row.
    pub failures: u32,
    /// The latest failure or rejection.
    pub last_error: Option<String>,
    /// Held by a rejected event since; `None`: not held.
    pub held_at: Option<DateTime<Utc>>,
    /// The seq of the rejected event that holds the key; `None`: not held.
    pub held_seq: Option<u64>,
}

/// Headers as stored (a JSON array of `[name, value]`; `None` for none).
pub fn headers_json(headers: &[(String, String)]) -> Option<String> {
    (!headers.is_empty()).then(|| serde_json::to_string(headers).expect("headers serialize"))
}

/// Headers as read back (an unreadable value reads as none).
pub fn headers_parse(json: Option<&str>) -> Vec<(String, String)> {
    json.and_then(|j| serde_json::from_str(j).ok())
        .unwrap_or_default()
}

/// A key hash read back from the database (a wrong length reads as zeros, which matches no
/// key).
pub fn hash_of(bytes: &[u8]) -> [u8; 32] {
    bytes.try_into().unwrap_or([0; 32])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_hashes_separate_topic_and_key() {
        assert_ne!(key_hash("ab", "c"), key_hash("a", "bc"));
        assert_eq!(key_hash("t", "k"), key_hash("t", "k"));
    }

    #[test]
    fn message_ids_are_32_hex_chars() {
        let id = new_message_id();
        assert_eq!(id.len(), 32);
        assert!(id.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(id, new_message_id());
    }

    /// Issue 34 (nit): ids come from the operating system's CSPRNG, not from the thread's
    /// fastrand generator, whose state anyone seeding it (or reading a few ids) can predict.
    #[test]
    fn message_ids_do_not_follow_the_threads_fastrand_state() {
        fastrand::seed(7);
        let a = new_message_id();
        fastrand::seed(7);
        let b = new_message_id();
        assert_ne!(a, b);
    }

    #[test]
    fn a_claim_leases_keys_until_their_backlogs_reach_the_events() {
        assert_eq!(keys_for_events([100, 100, 100], 150), 2);
        assert_eq!(keys_for_events([100, 100, 100], 100), 1);
        assert_eq!(keys_for_events([600], 512), 1);
        assert_eq!(keys_for_events([1, 1, 1], 512), 3);
        assert_eq!(keys_for_events([1, 1, 1], u64::MAX), 3);
        assert_eq!(keys_for_events([], 10), 0);
    }

    #[test]
    fn the_budget_goes_to_long_backlogs_without_exceeding_it() {
        assert_eq!(share_budget(&[2, 1000, 1000], &[], 512), [2, 255, 255]);
        assert_eq!(share_budget(&[1, 1], &[], 512), [1, 1]);
        assert_eq!(share_budget(&[78; 4], &[], 100), [25; 4]);
        let s = share_budget(&[78; 7], &[], 512);
        assert_eq!(s.iter().sum::<u64>(), 512);
        assert!(s.iter().all(|&n| n == 73 || n == 74));
        // A capped key (one event per round) leaves the rest to the others.
        assert_eq!(share_budget(&[50, 50], &[Some(1), None], 20), [1, 19]);
        // More keys than budget: never more than the budget.
        assert_eq!(share_budget(&[5, 5, 5], &[], 2).iter().sum::<u64>(), 2);
    }

    #[test]
    fn an_events_state_comes_from_its_dead_mark_and_its_keys_done_seq() {
        assert_eq!(EventState::of(3, 5, false), EventState::Delivered);
        assert_eq!(EventState::of(5, 5, false), EventState::Delivered);
        assert_eq!(EventState::of(6, 5, false), EventState::Pending);
        assert_eq!(EventState::of(3, 5, true), EventState::Dead);
    }

    #[test]
    fn what_a_key_becomes_is_encoded_once_for_both_drivers() {
        assert_eq!(KeyNext::Release.encode(), (0, 0, None, None));
        let e = "x".to_owned();
        assert_eq!(
            KeyNext::Backoff {
                delay_us: 5,
                error: e.clone()
            }
            .encode(),
            (1, 5, Some("x"), None)
        );
        assert_eq!(
            KeyNext::Hold { seq: 7, error: e }.encode(),
            (2, 0, Some("x"), Some(7))
        );
        assert_eq!(KeyNext::Keep.encode(), (3, 0, None, None));
    }

    #[test]
    fn headers_round_trip() {
        let h = vec![("a".to_owned(), "1".to_owned())];
        assert_eq!(headers_parse(headers_json(&h).as_deref()), h);
        assert_eq!(headers_json(&[]), None);
        assert!(headers_parse(None).is_empty());
    }
}
