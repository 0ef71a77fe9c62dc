//! The events' figures per topic with their lag on the database clock ([`Client::event_stats`]),
//! as the CLI, the dashboard and the metrics show them.

use super::*;

/// One topic's events: what waits, how late the oldest is, what is held
/// ([`Client::event_stats`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EventStats {
    /// The topic.
    pub topic: String,
    /// Events not delivered (nor dead) yet.
    pub pending: u64,
    /// When the oldest pending event was published (database clock); `None`: none pending.
    pub oldest_pending_at: Option<DateTime<Utc>>,
    /// Its age on the database clock: how far the relays are behind on this topic (zero when
    /// nothing is pending). In JSON: seconds (a number).
    #[serde(serialize_with = "secs")]
    pub lag: Duration,
    /// Keys held back by a rejected event (strict mode), waiting for an operator.
    pub held_keys: u64,
}

fn secs<S: serde::Serializer>(d: &Duration, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

impl EventStats {
    /// A topic's figures, its lag measured at `now` (database clock).
    pub(crate) fn at(row: crate::outbox::EventTopicStats, now: DateTime<Utc>) -> Self {
        Self {
            lag: row
                .oldest_pending_at
                .and_then(|at| (now - at).to_std().ok())
                .unwrap_or_default(),
            topic: row.topic,
            pending: row.pending,
            oldest_pending_at: row.oldest_pending_at,
            held_keys: row.held_keys,
        }
    }
}

impl Client {
    /// [`event_topics`](Self::event_topics) with each topic's lag: the age of its oldest
    /// pending event on the database clock (read right after, on the same client). By topic.
    pub async fn event_stats(&self) -> Result<Vec<EventStats>> {
        let rows = self.event_topics().await?;
        let now = self.db_now().await?;
        Ok(rows.into_iter().map(|r| EventStats::at(r, now)).collect())
    }
}
