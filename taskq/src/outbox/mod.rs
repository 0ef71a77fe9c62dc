//! The outbox: typed events written in the caller's business transaction
//! ([`Event::publish_tx`]), and the [`Relay`] that delivers them to a broker ([`Sink`]) in
//! per-key commit order, at least once, each with the stable message id of its row.
//!
//! ```no_run
//! # async fn f(pool: sqlx::MySqlPool) -> Result<(), Box<dyn std::error::Error>> {
//! use taskq::outbox::{Event, FnSink, Message, Outcome, Relay};
//!
//! #[derive(serde::Serialize)]
//! struct OrderPlaced { order_id: i64, total_cents: i64 }
//!
//! impl Event for OrderPlaced {
//!     fn topic(&self) -> &str { "orders.placed" }
//!     fn key(&self) -> String { self.order_id.to_string() }
//! }
//!
//! let mut tx = pool.begin().await?;
//! // ... the order's own rows ...
//! OrderPlaced { order_id: 7, total_cents: 1200 }.publish_tx(&mut tx).await?;
//! tx.commit().await?;
//!
//! let sink = FnSink::new(|batch: Vec<Message>| async move {
//!     batch.iter().map(|_| Outcome::Delivered).collect()
//! });
//! let relay = Relay::builder(pool.clone(), sink).build()?;
//! relay.run_until(async { let _ = tokio::signal::ctrl_c().await; }).await?;
//! # Ok(()) }
//! ```
//!
//! The sinks (`nats`, `rabbitmq`, `redis` behind the features of the same names, [`FnSink`],
//! [`PerMessageSink`]) are `taskq-outbox`'s, re-exported here; what "delivered" means for
//! each is in docs/outbox.md.

use std::future::Future;
use std::sync::OnceLock;

use tokio::sync::Notify;

use crate::defaults::validate_name;
use crate::error::{Error, Result};
use crate::task::enqueue::{AsConnection, conn_of, payload_limit};
use taskq_driver::event::{NewEvent, new_message_id};

mod relay;
mod stats;

pub use relay::{OnRejected, Relay, RelayBuilder, Round};
pub use stats::RelayStats;
pub use taskq_driver::event::{EventInfo, EventKeyInfo, EventState, EventTopicStats, HeldEventKey};
pub use taskq_outbox::{
    Bytes, FnSink, KEY_HEADER, Message, Outcome, PerMessageSink, Reconnecting, Sink,
};

/// The NATS JetStream sink (feature `nats`).
#[cfg(feature = "nats")]
pub use taskq_outbox::nats;
/// The RabbitMQ sink (feature `rabbitmq`).
#[cfg(feature = "rabbitmq")]
pub use taskq_outbox::rabbitmq;
/// The Redis Streams sink (feature `redis`).
#[cfg(feature = "redis")]
pub use taskq_outbox::redis;

/// The longest topic and key, in bytes.
pub const MAX_TOPIC_LEN: usize = 255;
/// The longest key, in bytes.
pub const MAX_KEY_LEN: usize = 255;

/// A domain event: published in the caller's transaction, relayed to a broker in per-key
/// commit order.
pub trait Event: serde::Serialize + Send + Sync {
    /// The subject / topic / routing key / stream it goes to (1..=255 bytes, no control
    /// characters, no surrounding whitespace).
    fn topic(&self) -> &str;

    /// The ordering key (an aggregate id), 1..=255 bytes: events of one (topic, key) reach the
    /// broker in commit order.
    fn key(&self) -> String;

    /// Headers published with it (default none).
    fn headers(&self) -> Vec<(String, String)> {
        Vec::new()
    }

    /// Writes the event in the caller's transaction (MySQL or SQLite; the same connections as
    /// `enqueue_tx`): its payload is the event serialized with serde_json. It takes the key's
    /// next sequence number under the key row's lock, so events of one key are relayed in
    /// the order their transactions commit (a second transaction publishing on the same key
    /// waits for the first to end). Bad input (an empty or too long topic or key, control
    /// characters, a payload over taskq's payload limit) is an error and writes nothing.
    /// Nudges this process's relays, which go out at once after the commit.
    fn publish_tx<C: AsConnection + ?Sized>(
        &self,
        conn: &mut C,
    ) -> impl Future<Output = Result<Published>> + Send
    where
        Self: Sized,
    {
        let prepared = prepare(self);
        async move {
            let p = prepared?;
            let row = NewEvent {
                topic: &p.topic,
                key: &p.key,
                message_id: &p.message_id,
                payload: &p.payload,
                headers: &p.headers,
            };
            let ins = conn_of(conn)
                .event_insert(&row)
                .await
                .map_err(Error::Database)?;
            nudge();
            Ok(Published {
                id: ins.id,
                message_id: p.message_id,
                seq: ins.seq,
            })
        }
    }
}

/// What [`Event::publish_tx`] stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    /// The event row's id.
    pub id: u64,
    /// The message id the relay publishes it with (32 hex characters, random).
    pub message_id: String,
    /// Its sequence number within its (topic, key): 1, 2, ... in commit order.
    pub seq: u64,
}

/// An event validated and serialized.
struct Prepared {
    topic: String,
    key: String,
    message_id: String,
    payload: Vec<u8>,
    headers: Vec<(String, String)>,
}

fn prepare<E: Event + ?Sized>(e: &E) -> Result<Prepared> {
    let topic = e.topic().to_owned();
    validate_name("event topic", &topic, MAX_TOPIC_LEN)?;
    let key = e.key();
    validate_key(&key)?;
    let headers = e.headers();
    for (name, _) in &headers {
        validate_name("event header name", name, MAX_TOPIC_LEN)?;
    }
    let payload = serde_json::to_vec(e).map_err(Error::Serialize)?;
    let limit = payload_limit();
    if payload.len() > limit {
        return Err(Error::PayloadTooLarge {
            size: payload.len(),
            limit,
        });
    }
    Ok(Prepared {
        topic,
        key,
        message_id: new_message_id(),
        payload,
        headers,
    })
}

/// A key is 1..=255 bytes; any characters (an aggregate id as it is).
fn validate_key(key: &str) -> Result<()> {
    let reason = if key.is_empty() {
        "must not be empty".to_owned()
    } else if key.len() > MAX_KEY_LEN {
        format!("is {} bytes long, the limit is {MAX_KEY_LEN}", key.len())
    } else {
        return Ok(());
    };
    Err(Error::InvalidName {
        what: "event key",
        value: key.chars().take(80).collect(),
        reason,
    })
}

/// What this process's relays wait on between rounds.
pub(crate) fn notifier() -> &'static Notify {
    static N: OnceLock<Notify> = OnceLock::new();
    N.get_or_init(Notify::new)
}

/// Wakes this process's relays (an event was published; it goes out once its transaction
/// commits). [`Event::publish_tx`] calls it; call it after a commit to skip even the short
/// re-polls that follow a wake-up.
pub fn notify() {
    notifier().notify_waiters();
}

fn nudge() {
    notify();
}
