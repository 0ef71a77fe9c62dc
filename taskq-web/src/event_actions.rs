//! The actions on one event key that the Events page and the API share: retry or skip the
//! event that holds the key, replay the key from a seq. Each goes through the client acting
//! as the request's actor, so each is audited (`event_retry`, `event_skip`, `event_replay`)
//! in the transaction of the change.

use taskq::{Client, Error};

/// What an operator does to an event key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyAction {
    /// Try the held (rejected) event again.
    Retry,
    /// Mark the held event dead; the key goes on with its next event.
    Skip,
    /// Make the key's delivered and dead events from this seq on pending again (0: all
    /// stored ones); a hold ends.
    Replay(u64),
}

/// What became of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyDone {
    Retried,
    Skipped,
    /// How many events became pending.
    Replayed(u64),
    /// Retry or skip of a key that is not held: nothing changed, nothing audited.
    NotHeld,
    /// Nothing was ever published on the key (or it was typed wrong): nothing changed.
    NoSuchKey,
}

/// The largest `from_seq` a replay takes (seqs are stored as signed 64-bit numbers).
pub(crate) const MAX_SEQ: u64 = i64::MAX as u64;

impl KeyAction {
    /// Applies it to `(topic, key)` with `client` (acting as the request's actor).
    pub(crate) async fn apply(
        self,
        client: &Client,
        topic: &str,
        key: &str,
    ) -> Result<KeyDone, Error> {
        // An unknown key is told apart from one that is not held (and a replay of an unknown
        // key writes no audit entry).
        if client.event_key(topic, key).await?.is_none() {
            return Ok(KeyDone::NoSuchKey);
        }
        match self {
            Self::Retry | Self::Skip => {
                let skip = self == Self::Skip;
                Ok(match client.release_event_key(topic, key, skip).await? {
                    false => KeyDone::NotHeld,
                    true if skip => KeyDone::Skipped,
                    true => KeyDone::Retried,
                })
            }
            Self::Replay(from_seq) => client
                .replay_event_key(topic, key, from_seq.min(MAX_SEQ))
                .await
                .map(KeyDone::Replayed),
        }
    }
}
