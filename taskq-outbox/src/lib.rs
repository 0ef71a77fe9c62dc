//! taskq's outbox side: **sinks**, what publishes a batch of messages to a broker and says, for
//! each message, whether the broker has it.
//!
//! - [`Message`]: one message (id, subject or topic, key, payload bytes, headers). The broker
//!   sinks send its key as the header [`KEY_HEADER`] (`Taskq-Key`) too.
//! - [`Sink`]: publishes a batch and returns one [`Outcome`] per message: [`Delivered`],
//!   [`Rejected`] (never will be: too large, refused), [`Failed`] (transient: try again) or
//!   [`Held`] (not sent, because an earlier message of its key in the batch was not delivered).
//! - Sinks: `nats::NatsSink` (feature `nats`, JetStream), `rabbitmq::RabbitSink` (feature
//!   `rabbitmq`), `redis::RedisSink` (feature `redis`, Streams), and [`FnSink`] /
//!   [`PerMessageSink`] for your own.
//! - [`Reconnecting`]: wraps a sink made by a connect function, and connects again after a
//!   failed batch or one with no answer in time (a closed channel, a dropped or black-holed
//!   connection).
//!
//! - [`local`]: the brokers' URLs on their standard local ports (the tests' and the
//!   benchmark's defaults).
//!
//! What "delivered" means for each broker, and how Kafka fits the same trait, is in
//! `docs/outbox.md`. The events that feed sinks and the relay that drives them (in per-key
//! commit order) are taskq's (`taskq::outbox`, which re-exports this crate).
//!
//! [`Delivered`]: Outcome::Delivered
//! [`Rejected`]: Outcome::Rejected
//! [`Failed`]: Outcome::Failed
//! [`Held`]: Outcome::Held

#[cfg(any(feature = "nats", feature = "rabbitmq", feature = "redis"))]
use std::collections::HashSet;
use std::future::Future;

pub use bytes::Bytes;

pub mod local;
#[cfg(feature = "nats")]
pub mod nats;
#[cfg(feature = "rabbitmq")]
pub mod rabbitmq;
pub mod reconnect;
#[cfg(feature = "redis")]
pub mod redis;

pub use reconnect::Reconnecting;

/// The header every broker sink (NATS, RabbitMQ, Redis) puts on each message it publishes, set
/// to the message's [`Message::key`], so that a consumer can partition or route by key without
/// parsing the payload: a NATS header, an entry of the AMQP header table, and on Redis Streams
/// the field `h:Taskq-Key` (besides the field `key`, kept as it was).
///
/// The sink's value wins: a header of the message with this name (compared ignoring ASCII
/// case) is not published, so a message never carries two (see [`Message::headers_to_publish`]).
pub const KEY_HEADER: &str = "Taskq-Key";

/// One message to publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// The message id: stable across re-publishes of the same message, so that the broker
    /// (JetStream's duplicate window) or the consumer (an inbox) can drop a second copy.
    pub id: String,
    /// Where it goes: a NATS subject, a RabbitMQ routing key, a Redis stream, a Kafka topic.
    pub subject: String,
    /// The ordering key (an aggregate's id) within the subject: a sink publishes the messages
    /// of one (subject, key) in batch order, and a message not delivered holds the later ones
    /// of its subject and key only; messages of other pairs (the same key on another subject
    /// included) may interleave and go on. The relay's key is the pair (topic, key), and the
    /// topic is the subject. See [`Message::order_key`].
    pub key: String,
    /// The payload, as bytes.
    pub payload: Bytes,
    /// Headers (name, value), published as the broker's headers (NATS headers, AMQP header
    /// table, extra stream fields on Redis). The broker sinks add [`KEY_HEADER`] with the key,
    /// and leave out a header of that name given here.
    pub headers: Vec<(String, String)>,
}

impl Message {
    /// A message without headers.
    pub fn new(
        id: impl Into<String>,
        subject: impl Into<String>,
        key: impl Into<String>,
        payload: impl Into<Bytes>,
    ) -> Self {
        Self {
            id: id.into(),
            subject: subject.into(),
            key: key.into(),
            payload: payload.into(),
            headers: Vec::new(),
        }
    }

    /// What a sink keeps in order and holds after a failure: the pair (subject, key), the
    /// relay's key (its topic and key).
    pub fn order_key(&self) -> (&str, &str) {
        (&self.subject, &self.key)
    }

    /// The headers a broker sink publishes, in order: [`KEY_HEADER`] with [`key`](Self::key),
    /// then [`headers`](Self::headers) except any named `Taskq-Key` (ignoring ASCII case): the
    /// key's header is always the message's own key, and there is only one. For a sink of your
    /// own that should send the key the same way.
    pub fn headers_to_publish(&self) -> impl Iterator<Item = (&str, &str)> {
        std::iter::once((KEY_HEADER, self.key.as_str())).chain(
            self.headers
                .iter()
                .filter(|(name, _)| !name.eq_ignore_ascii_case(KEY_HEADER))
                .map(|(name, value)| (name.as_str(), value.as_str())),
        )
    }

    /// Adds a header.
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }
}

/// What became of one message of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The broker has it, in the broker's own sense (see each sink and `docs/outbox.md`).
    Delivered,
    /// The broker will never take it as it is (too large, refused): publishing it again
    /// gives the same answer. The reason, for logs and operators.
    Rejected(String),
    /// It may or may not have reached the broker (connection lost, no answer in time, broker
    /// temporarily unable to store it): publish it again, with the same id. The reason.
    Failed(String),
    /// Not sent: an earlier message of the same key in this batch was not delivered (sending
    /// it would have put it ahead of that one).
    Held,
}

impl Outcome {
    /// Whether the broker has the message.
    pub fn is_delivered(&self) -> bool {
        matches!(self, Outcome::Delivered)
    }
}

/// Publishes batches of messages to a broker.
///
/// The contract every implementation keeps:
///
/// - `publish` returns exactly one [`Outcome`] per message, in the order of `batch`.
/// - A key is the pair (subject, key) ([`Message::order_key`]): the same key string on two
///   subjects is two keys.
/// - Messages of one key are **sent in batch order**, on one connection whose order the broker
///   keeps (a NATS connection, an AMQP channel, a Redis connection; for Kafka, one producer
///   with `max.in.flight.requests.per.connection` ≤ 5 and idempotence on), so what the
///   broker stores of one key is in batch order. Different keys may interleave.
/// - Publishes are pipelined: the sink does not wait for a message's answer before sending
///   the next one, up to its window.
/// - Once a message of a key is known not delivered when the next message of that key is to
///   be sent (a too-large message checked before sending, a send error, an answer already in),
///   that next message and every later one of the key is not sent: [`Outcome::Held`]. A
///   later message of the key that was already in flight keeps its own outcome: a
///   `Delivered` after a `Rejected` or `Failed` of the same key means the broker stored it
///   out of order (only for a refusal the sink could not see coming, or an answer lost in a
///   broken connection; see `docs/outbox.md`).
/// - A message of another key is never held because of it.
pub trait Sink: Send + Sync {
    /// Publishes `batch`; one outcome per message, in order.
    fn publish(&self, batch: &[Message]) -> impl Future<Output = Vec<Outcome>> + Send;
}

/// Keys ([`Message::order_key`]: subject and key) of a batch that have a message not
/// delivered: later messages of such a key are held. (Used by the broker sinks only.)
#[cfg(any(feature = "nats", feature = "rabbitmq", feature = "redis"))]
#[derive(Default)]
pub(crate) struct Stopped<'a> {
    keys: HashSet<(&'a str, &'a str)>,
}

#[cfg(any(feature = "nats", feature = "rabbitmq", feature = "redis"))]
impl<'a> Stopped<'a> {
    /// Whether `m`'s key has a message not delivered.
    pub(crate) fn has(&self, m: &Message) -> bool {
        self.keys.contains(&m.order_key())
    }

    /// Records the outcome of `m`.
    pub(crate) fn record(&mut self, m: &'a Message, outcome: &Outcome) {
        if !outcome.is_delivered() {
            self.keys.insert(m.order_key());
        }
    }
}

/// How often at most a broker sink logs the same setup warning (a missing stream, exchange or
/// binding), per name: the relay retries such messages, and each retry would log again.
#[cfg(any(feature = "nats", feature = "rabbitmq"))]
pub(crate) const WARN_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

/// Whether the setup warning named `what` is due: `true` at most once per [`WARN_EVERY`] for
/// each `what`, in this process (so a sink connected again by [`Reconnecting`] does not log it
/// again either).
#[cfg(any(feature = "nats", feature = "rabbitmq"))]
pub(crate) fn warning_due(what: String) -> bool {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    use std::time::Instant;
    static LAST: OnceLock<Mutex<HashMap<String, Instant>>> = OnceLock::new();
    let mut last = LAST
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let now = Instant::now();
    if last.len() >= 1024 {
        last.retain(|_, at| now.duration_since(*at) < WARN_EVERY);
    }
    match last.get(&what) {
        Some(at) if now.duration_since(*at) < WARN_EVERY => false,
        _ => {
            last.insert(what, now);
            true
        }
    }
}

/// A sink that is a function of yours, for a broker taskq has no sink for: the whole batch
/// goes to an async closure, which must keep the [`Sink`] contract itself (see
/// [`PerMessageSink`] for a closure that publishes one message and leaves the contract to
/// the sink).
pub struct FnSink<F>(F);

impl<F, Fut> FnSink<F>
where
    F: Fn(Vec<Message>) -> Fut + Send + Sync,
    Fut: Future<Output = Vec<Outcome>> + Send,
{
    /// A sink that hands each batch (owned) to `f`, which returns one outcome per message.
    /// A result of another length is padded with [`Outcome::Failed`] or cut.
    pub fn new(f: F) -> Self {
        Self(f)
    }
}

impl<F, Fut> Sink for FnSink<F>
where
    F: Fn(Vec<Message>) -> Fut + Send + Sync,
    Fut: Future<Output = Vec<Outcome>> + Send,
{
    async fn publish(&self, batch: &[Message]) -> Vec<Outcome> {
        let n = batch.len();
        let mut out = (self.0)(batch.to_vec()).await;
        out.resize_with(n, || {
            Outcome::Failed("the sink function returned fewer outcomes than messages".into())
        });
        out
    }
}

/// A sink that publishes each message with a function of yours, and keeps the [`Sink`]
/// contract for it: the messages of one key go one after the other, in batch order, and stop
/// at the first one not delivered (the rest are [`Outcome::Held`], never handed to the
/// function); keys (subject and key, see [`Message::order_key`]) run concurrently.
pub struct PerMessageSink<F>(F);

impl<F, Fut> PerMessageSink<F>
where
    F: Fn(Message) -> Fut + Send + Sync,
    Fut: Future<Output = Outcome> + Send,
{
    /// A sink that publishes each message with `f`.
    pub fn new(f: F) -> Self {
        Self(f)
    }
}

/// Groups `batch`'s indexes by key ([`Message::order_key`]: subject and key), keys in order of
/// first appearance.
fn by_key(batch: &[Message]) -> Vec<Vec<usize>> {
    let mut lanes: Vec<Vec<usize>> = Vec::new();
    let mut lane_of: std::collections::HashMap<(&str, &str), usize> = Default::default();
    for (i, m) in batch.iter().enumerate() {
        let lane = *lane_of.entry(m.order_key()).or_insert_with(|| {
            lanes.push(Vec::new());
            lanes.len() - 1
        });
        lanes[lane].push(i);
    }
    lanes
}

impl<F, Fut> Sink for PerMessageSink<F>
where
    F: Fn(Message) -> Fut + Send + Sync,
    Fut: Future<Output = Outcome> + Send,
{
    async fn publish(&self, batch: &[Message]) -> Vec<Outcome> {
        let f = &self.0;
        let lanes = by_key(batch);
        let done = futures_util::future::join_all(lanes.into_iter().map(|lane| async move {
            let mut outs = Vec::with_capacity(lane.len());
            let mut stopped = false;
            for i in lane {
                let o = if stopped {
                    Outcome::Held
                } else {
                    f(batch[i].clone()).await
                };
                stopped |= !o.is_delivered();
                outs.push((i, o));
            }
            outs
        }))
        .await;
        let mut out = vec![Outcome::Held; batch.len()];
        for (i, o) in done.into_iter().flatten() {
            out[i] = o;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    fn msg(id: &str, key: &str) -> Message {
        Message::new(id, "s", key, Bytes::from_static(b"x"))
    }

    #[tokio::test]
    async fn a_per_message_sink_holds_a_key_after_its_first_failure_and_runs_the_others() {
        let seen = Mutex::new(Vec::new());
        let sink = PerMessageSink::new(|m: Message| {
            seen.lock().unwrap().push(m.id.clone());
            async move {
                if m.id == "a2" {
                    Outcome::Rejected("too large".into())
                } else {
                    Outcome::Delivered
                }
            }
        });
        let batch = [
            msg("a1", "a"),
            msg("b1", "b"),
            msg("a2", "a"),
            msg("b2", "b"),
            msg("a3", "a"),
        ];
        let out = sink.publish(&batch).await;
        assert_eq!(
            out,
            [
                Outcome::Delivered,
                Outcome::Delivered,
                Outcome::Rejected("too large".into()),
                Outcome::Delivered,
                Outcome::Held
            ]
        );
        let mut seen = seen.into_inner().unwrap();
        // a3 was never handed to the function; a's messages went in order.
        assert!(!seen.contains(&"a3".to_owned()));
        seen.retain(|id| id.starts_with('a'));
        assert_eq!(seen, ["a1", "a2"]);
    }

    /// A key is (subject, key): a failure of key "42" on subject `a` does not hold key "42"
    /// on subject `b`.
    #[tokio::test]
    async fn a_per_message_sink_holds_a_key_of_one_subject_only() {
        let sink = PerMessageSink::new(|m: Message| async move {
            if m.subject == "a" {
                Outcome::Failed("no stream".into())
            } else {
                Outcome::Delivered
            }
        });
        let batch = [
            Message::new("a1", "a", "42", Bytes::from_static(b"x")),
            Message::new("b1", "b", "42", Bytes::from_static(b"x")),
            Message::new("a2", "a", "42", Bytes::from_static(b"x")),
        ];
        let out = sink.publish(&batch).await;
        assert!(matches!(out[0], Outcome::Failed(_)), "{out:?}");
        assert_eq!(out[1], Outcome::Delivered, "{out:?}");
        assert_eq!(out[2], Outcome::Held, "{out:?}");
    }

    #[test]
    fn the_key_header_comes_first_and_a_header_of_its_name_is_left_out() {
        let m = msg("1", "order-7")
            .with_header("trace", "t1")
            .with_header("taskq-key", "forged")
            .with_header(KEY_HEADER, "forged too");
        let published: Vec<(&str, &str)> = m.headers_to_publish().collect();
        assert_eq!(published, [(KEY_HEADER, "order-7"), ("trace", "t1")]);
        assert_eq!(
            msg("2", "").headers_to_publish().collect::<Vec<_>>(),
            [(KEY_HEADER, "")]
        );
    }

    #[cfg(any(feature = "nats", feature = "rabbitmq"))]
    #[test]
    fn a_setup_warning_is_due_once_per_name_and_interval() {
        let name = format!("test-{:?}", std::time::Instant::now());
        assert!(warning_due(name.clone()));
        assert!(!warning_due(name.clone()));
        assert!(warning_due(format!("{name}-other")));
    }

    #[tokio::test]
    async fn a_batch_sink_gets_the_batch_and_short_answers_are_padded_as_failed() {
        let sink = FnSink::new(|b: Vec<Message>| async move {
            assert_eq!(b.len(), 3);
            vec![Outcome::Delivered]
        });
        let out = sink
            .publish(&[msg("1", "k"), msg("2", "k"), msg("3", "j")])
            .await;
        assert_eq!(out[0], Outcome::Delivered);
        assert!(matches!(out[1], Outcome::Failed(_)));
        assert!(matches!(out[2], Outcome::Failed(_)));
    }
}
