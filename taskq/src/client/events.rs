//! The client's view of events and the relay (`taskq::outbox`): per-topic statistics, held
//! keys, a key's events and relay state; retention of delivered events; replays and the
//! release of a held key, each recorded in the audit trail in the transaction of the change.

use super::*;
use crate::outbox::{EventInfo, EventKeyInfo, EventTopicStats, HeldEventKey, MAX_TOPIC_LEN};

/// Events deleted or replayed per statement.
const EVENT_BATCH: u32 = 1_000;

impl Client {
    /// Per topic with pending events or held keys, by topic: how many events are pending
    /// (not delivered, not dead), when the oldest pending one was published (the relay's
    /// lag), and how many keys a rejected event holds.
    pub async fn event_topics(&self) -> Result<Vec<EventTopicStats>> {
        self.run(self.store.event_topic_stats()).await
    }

    /// Keys held by a rejected event (of `topic` when given), longest held first, at most
    /// `limit`: topic, key, the held event's seq, the rejection, since when.
    pub async fn event_keys_held(
        &self,
        topic: Option<&str>,
        limit: u32,
    ) -> Result<Vec<HeldEventKey>> {
        self.run(self.store.event_keys_held(topic, limit)).await
    }

    /// The events of `(topic, key)` with a seq above `after_seq`, by seq, at most `limit`.
    pub async fn event_list(
        &self,
        topic: &str,
        key: &str,
        after_seq: u64,
        limit: u32,
    ) -> Result<Vec<EventInfo>> {
        self.run(self.store.event_list(topic, key, after_seq, limit))
            .await
    }

    /// The relay state of `(topic, key)`: its last seq, how far the relays got, the lease,
    /// failures, the hold. `None`: nothing was ever published on it.
    pub async fn event_key(&self, topic: &str, key: &str) -> Result<Option<EventKeyInfo>> {
        self.run(self.store.event_key_get(topic, key)).await
    }

    /// Deletes the delivered events published more than `age` ago (database clock), up to
    /// 1,000 per statement (each autocommitted); how many. Pending and dead events are kept; a
    /// key keeps its numbers (its next event continues the sequence). No time is kept per
    /// delivered event (the key's `done_seq` records delivery), so age is counted from the
    /// publish.
    pub async fn prune_events(&self, age: Duration) -> Result<u64> {
        let age_us = i64::try_from(age.as_micros()).unwrap_or(i64::MAX);
        let mut conn = self.run(self.store.acquire()).await?;
        let mut total = 0;
        loop {
            let n = self
                .run(self.store.event_prune(conn.conn(), age_us, EVENT_BATCH))
                .await?;
            total += n;
            if n < u64::from(EVENT_BATCH) {
                return Ok(total);
            }
        }
    }

    /// Replays `(topic, key)` from `from_seq` (0: from the start; a seq before the key's
    /// oldest stored event counts as that one): its delivered and dead events from there
    /// become pending and are relayed again, in seq order, with their message ids; a hold is
    /// cleared and a lease ended. How many events became pending. Recorded in the
    /// audit trail as `event_replay` (detail `{"topic", "key", "from_seq", "events"}`).
    pub async fn replay_event_key(&self, topic: &str, key: &str, from_seq: u64) -> Result<u64> {
        crate::defaults::validate_name("event topic", topic, MAX_TOPIC_LEN)?;
        let mut tx = self.run(self.store.begin()).await?;
        let n = self
            .run(self.store.event_replay_key(tx.conn(), topic, key, from_seq))
            .await?;
        let detail = serde_json::json!({
            "topic": topic, "key": key, "from_seq": from_seq, "events": n
        });
        self.commit_audited(tx, &Action::queue("event_replay", None, detail))
            .await?;
        Ok(n)
    }

    /// Replays `topic`'s delivered and dead events published in `[from, to)` (database
    /// clock): each key they belong to goes back to its lowest such event, so those events
    /// and the key's later ones become pending and are sent again, in order (a consumer sees
    /// the key's events in seq order again; the inbox drops ids it has seen). A held key
    /// stays held. One transaction (reads of up to 1,000 events each), so a relay cannot
    /// send part of the range before the rest is rewound, and recorded in the audit trail as
    /// one `event_replay_range` entry (detail `{"topic", "from", "to", "events"}`); how many
    /// events became pending.
    /// Until it commits, publishers of the range's keys wait for their key rows: replay a
    /// very large range in several calls over shorter time ranges.
    pub async fn replay_events(
        &self,
        topic: &str,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<u64> {
        crate::defaults::validate_name("event topic", topic, MAX_TOPIC_LEN)?;
        let mut tx = self.run(self.store.begin()).await?;
        let mut total = 0;
        // Events of keys rewound by an earlier statement are pending and no longer read (this
        // transaction sees its own changes, and no relay can deliver them before it commits).
        loop {
            let n = self
                .run(
                    self.store
                        .event_replay_range(tx.conn(), topic, from, to, EVENT_BATCH),
                )
                .await?;
            total += n.events;
            if n.read < u64::from(EVENT_BATCH) {
                break;
            }
        }
        let detail = serde_json::json!({
            "topic": topic, "from": from.to_rfc3339(), "to": to.to_rfc3339(), "events": total
        });
        self.commit_audited(tx, &Action::queue("event_replay_range", None, detail))
            .await?;
        Ok(total)
    }

    /// Releases a key held by a rejected event: `skip` marks that event dead and the key
    /// goes on with its next event; otherwise the held event is tried again. Whether the key
    /// was held. Recorded in the audit trail as `event_skip` or `event_retry` (detail
    /// `{"topic", "key"}`) when it was.
    pub async fn release_event_key(&self, topic: &str, key: &str, skip: bool) -> Result<bool> {
        let mut tx = self.run(self.store.begin()).await?;
        let held = self
            .run(self.store.event_key_release(tx.conn(), topic, key, skip))
            .await?;
        if !held {
            self.run(tx.commit()).await?;
            return Ok(false);
        }
        let action = if skip { "event_skip" } else { "event_retry" };
        let detail = serde_json::json!({ "topic": topic, "key": key });
        self.commit_audited(tx, &Action::queue(action, None, detail))
            .await?;
        Ok(true)
    }
}
