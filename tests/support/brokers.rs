//! The message brokers the outbox's sink tests publish to: NATS with JetStream, RabbitMQ and
//! Redis, on this machine's default ports (`taskq_outbox::local`) unless `TASKQ_TEST_NATS_URL`, `TASKQ_TEST_AMQP_URL`
//! or `TASKQ_TEST_REDIS_URL` say otherwise.
//!
//! Like the MySQL tests: a test starts with
//!
//! ```ignore
//! let Some(url) = taskq_tests::brokers::or_skip(Broker::Nats) else { return };
//! ```
//!
//! and, when nothing answers at the broker's address, prints `SKIPPED <broker>: <test>: no
//! broker at <address> (...)` to stderr and passes, unless `TASKQ_REQUIRE_BROKERS` is set (CI
//! sets it to 1): then it fails.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// A broker the sink tests use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Broker {
    /// NATS with JetStream.
    Nats,
    /// RabbitMQ.
    RabbitMq,
    /// Redis.
    Redis,
}

impl Broker {
    /// Its name in `SKIPPED` lines.
    pub fn label(self) -> &'static str {
        match self {
            Broker::Nats => "nats",
            Broker::RabbitMq => "rabbitmq",
            Broker::Redis => "redis",
        }
    }

    /// The URL tests connect to: the variable's value, else the local default.
    pub fn url(self) -> String {
        let (var, default) = match self {
            Broker::Nats => ("TASKQ_TEST_NATS_URL", taskq_outbox::local::NATS_URL),
            Broker::RabbitMq => ("TASKQ_TEST_AMQP_URL", taskq_outbox::local::AMQP_URL),
            Broker::Redis => ("TASKQ_TEST_REDIS_URL", taskq_outbox::local::REDIS_URL),
        };
        std::env::var(var).unwrap_or_else(|_| default.to_owned())
    }

    /// `host:port` of [`url`](Self::url).
    pub fn address(self) -> String {
        let url = self.url();
        let rest = url.split_once("://").map_or(url.as_str(), |(_, r)| r);
        let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
        rest.split('/').next().unwrap_or(rest).to_owned()
    }
}

/// Whether a test without its broker fails instead of skipping: `TASKQ_REQUIRE_BROKERS` is
/// set (to anything).
pub fn required() -> bool {
    std::env::var_os("TASKQ_REQUIRE_BROKERS").is_some()
}

/// Whether something accepts a TCP connection at the broker's address (checked once per test
/// binary and broker, within 3 s).
fn check(broker: Broker) -> Result<(), String> {
    static CHECKS: OnceLock<Mutex<HashMap<Broker, Result<(), String>>>> = OnceLock::new();
    let checks = CHECKS.get_or_init(Default::default);
    let mut checks = checks.lock().unwrap_or_else(|e| e.into_inner());
    checks
        .entry(broker)
        .or_insert_with(|| {
            let address = broker.address();
            let mut last = format!("{address} does not resolve");
            for addr in std::net::ToSocketAddrs::to_socket_addrs(&address)
                .map_err(|e| format!("no broker at {address} ({e})"))?
            {
                match std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(3)) {
                    Ok(_) => return Ok(()),
                    Err(e) => last = e.to_string(),
                }
            }
            Err(format!("no broker at {address} ({last})"))
        })
        .clone()
}

/// The broker's URL when it answers; else prints `SKIPPED <broker>: <test>: ...` and returns
/// `None`, or panics when [`required`].
pub fn or_skip(broker: Broker) -> Option<String> {
    match check(broker) {
        Ok(()) => Some(broker.url()),
        Err(why) => {
            skip(broker.label(), &why);
            None
        }
    }
}

/// A broker test that cannot run: panics when [`required`], else prints `SKIPPED <what>:
/// <test>: <why>` to stderr (past libtest's capture, like the other SKIPPED lines).
pub fn skip(what: &str, why: &str) {
    if required() {
        panic!("{what}: {why}; TASKQ_REQUIRE_BROKERS is set, so this fails instead of skipping");
    }
    let thread = std::thread::current();
    use std::io::Write as _;
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED {what}: {}: {why}",
        thread.name().unwrap_or("?")
    );
}

/// A fresh name for a stream, queue or key: `taskq_t_<16 hex digits>`.
pub fn fresh_name() -> String {
    format!("taskq_t_{:016x}", fastrand::u64(..))
}

// ---------------------------------------------------------------------------------------------
// A fresh destination per test, what its consumers receive, and the delivery checker.

use std::collections::{BTreeMap, HashSet};

use taskq_outbox::nats::async_nats;
use taskq_outbox::nats::async_nats::jetstream;
use taskq_outbox::rabbitmq::lapin;
use taskq_outbox::redis::client as redis;

/// One message as a consumer of the destination received it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    /// The message id: `Nats-Msg-Id`, the AMQP `message_id`, the Redis entry's `id` field.
    pub id: String,
    /// The Redis entry's `key` field (the other brokers do not carry the key by themselves).
    pub key: Option<String>,
    /// The key as the header `Taskq-Key` carried it (`taskq_outbox::KEY_HEADER`: a NATS header,
    /// an AMQP header-table entry, the Redis field `h:Taskq-Key`), when there was one.
    pub key_header: Option<String>,
    /// The payload bytes.
    pub payload: Vec<u8>,
}

impl Received {
    /// The payload as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.payload)
            .unwrap_or_else(|e| panic!("payload of {} is not JSON: {e}", self.id))
    }
}

enum Reader {
    Nats(jetstream::Context),
    Rabbit(lapin::Connection, lapin::Channel),
    Redis(redis::aio::MultiplexedConnection),
}

/// Creates a JetStream stream, retried up to five times a second apart: the shared server has
/// refused a creation under load (a request timeout, and once "error creating store for
/// stream", code 10049); creating a stream with the same config again is not an error.
pub async fn create_nats_stream(
    js: &jetstream::Context,
    config: jetstream::stream::Config,
) -> jetstream::stream::Stream {
    let mut tries = 0;
    loop {
        match js.create_stream(config.clone()).await {
            Ok(stream) => return stream,
            Err(e) => {
                tries += 1;
                assert!(
                    tries < 5,
                    "create a JetStream stream (is JetStream enabled?): {e}"
                );
                eprintln!(
                    "creating JetStream stream {} failed ({e}); trying again",
                    config.name
                );
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
        }
    }
}

/// A fresh place on a broker for one test to publish to: a JetStream stream taking
/// `<name>.>` (file storage, so it survives a restart of its server), a durable RabbitMQ
/// queue (reached through the default exchange), or a Redis stream key. Deleted by
/// [`delete`](Self::delete).
pub struct Destination {
    /// The broker.
    pub broker: Broker,
    /// The stream, queue or stream key name (`taskq_t_<hex>`).
    pub name: String,
    /// What the relay publishes to: the NATS subject `<name>.events`, the queue name (the
    /// routing key on the default exchange), the Redis stream key.
    pub topic: String,
    reader: Reader,
}

impl Destination {
    /// Creates a fresh destination on the broker at `url`.
    pub async fn create(broker: Broker, url: &str) -> Self {
        let name = fresh_name();
        let (topic, reader) = match broker {
            Broker::Nats => {
                let client = async_nats::connect(url).await.expect("connect to NATS");
                let js = jetstream::new(client);
                let config = jetstream::stream::Config {
                    name: name.clone(),
                    subjects: vec![format!("{name}.>")],
                    storage: jetstream::stream::StorageType::File,
                    ..Default::default()
                };
                create_nats_stream(&js, config).await;
                (format!("{name}.events"), Reader::Nats(js))
            }
            Broker::RabbitMq => {
                let conn = lapin::Connection::connect(url, lapin::ConnectionProperties::default())
                    .await
                    .expect("connect to RabbitMQ");
                let channel = conn.create_channel().await.expect("open a channel");
                channel
                    .queue_declare(
                        name.as_str().into(),
                        lapin::options::QueueDeclareOptions {
                            durable: true,
                            ..Default::default()
                        },
                        lapin::types::FieldTable::default(),
                    )
                    .await
                    .expect("declare a queue");
                (name.clone(), Reader::Rabbit(conn, channel))
            }
            Broker::Redis => {
                let conn = redis::Client::open(url)
                    .expect("a Redis URL")
                    .get_multiplexed_async_connection()
                    .await
                    .expect("connect to Redis");
                (name.clone(), Reader::Redis(conn))
            }
        };
        Self {
            broker,
            name,
            topic,
            reader,
        }
    }

    /// How many messages the destination holds now (duplicates included).
    pub async fn count(&self) -> u64 {
        match &self.reader {
            Reader::Nats(js) => {
                let mut stream = js.get_stream(&self.name).await.expect("the stream");
                stream.info().await.expect("stream info").state.messages
            }
            Reader::Rabbit(_, channel) => channel
                .queue_declare(
                    self.name.as_str().into(),
                    lapin::options::QueueDeclareOptions {
                        passive: true,
                        durable: true,
                        ..Default::default()
                    },
                    lapin::types::FieldTable::default(),
                )
                .await
                .expect("passive queue.declare")
                .message_count()
                .into(),
            Reader::Redis(conn) => {
                let mut conn = conn.clone();
                redis::cmd("XLEN")
                    .arg(&self.name)
                    .query_async(&mut conn)
                    .await
                    .expect("XLEN")
            }
        }
    }

    /// Everything a consumer receives, in the order it receives it: the stream's messages in
    /// stream order (NATS, Redis), or the queue drained with `basic.get` (RabbitMQ: destructive,
    /// so call it once, when the publishing is over).
    pub async fn read_all(&self) -> Vec<Received> {
        match &self.reader {
            Reader::Nats(js) => {
                let mut stream = js.get_stream(&self.name).await.expect("the stream");
                let state = stream.info().await.expect("stream info").state.clone();
                let mut got = Vec::new();
                if state.messages == 0 {
                    return got;
                }
                for seq in state.first_sequence..=state.last_sequence {
                    let m = stream.get_raw_message(seq).await.expect("stored message");
                    let id = m
                        .headers
                        .get("Nats-Msg-Id")
                        .expect("Nats-Msg-Id header")
                        .to_string();
                    let key_header = m
                        .headers
                        .get(taskq_outbox::KEY_HEADER)
                        .map(|v| v.to_string());
                    got.push(Received {
                        id,
                        key: None,
                        key_header,
                        payload: m.payload.to_vec(),
                    });
                }
                got
            }
            Reader::Rabbit(_, channel) => {
                let mut got = Vec::new();
                while let Some(m) = channel
                    .basic_get(
                        self.name.as_str().into(),
                        lapin::options::BasicGetOptions { no_ack: true },
                    )
                    .await
                    .expect("basic.get")
                {
                    let id = m
                        .delivery
                        .properties
                        .message_id()
                        .as_ref()
                        .expect("message_id property")
                        .to_string();
                    let key_header =
                        m.delivery.properties.headers().as_ref().and_then(|h| {
                            match h
                                .inner()
                                .iter()
                                .find(|(k, _)| k.as_str() == taskq_outbox::KEY_HEADER)
                            {
                                Some((_, lapin::types::AMQPValue::LongString(v))) => {
                                    Some(v.to_string())
                                }
                                _ => None,
                            }
                        });
                    got.push(Received {
                        id,
                        key: None,
                        key_header,
                        payload: m.delivery.data.clone(),
                    });
                }
                got
            }
            Reader::Redis(conn) => {
                let mut conn = conn.clone();
                let mut got = Vec::new();
                let mut from = "-".to_owned();
                loop {
                    let entries: redis::Value = redis::cmd("XRANGE")
                        .arg(&self.name)
                        .arg(&from)
                        .arg("+")
                        .arg("COUNT")
                        .arg(1000)
                        .query_async(&mut conn)
                        .await
                        .expect("XRANGE");
                    let redis::Value::Array(entries) = entries else {
                        panic!("XRANGE answered {entries:?}")
                    };
                    let n = entries.len();
                    for e in entries {
                        let redis::Value::Array(parts) = e else {
                            panic!("an entry: {e:?}")
                        };
                        let entry_id = String::from_utf8(redis_bytes(&parts[0])).unwrap();
                        let redis::Value::Array(fields) = &parts[1] else {
                            panic!("entry fields: {parts:?}")
                        };
                        let mut map = BTreeMap::new();
                        for kv in fields.chunks(2) {
                            map.insert(
                                String::from_utf8(redis_bytes(&kv[0])).unwrap(),
                                redis_bytes(&kv[1]),
                            );
                        }
                        got.push(Received {
                            id: String::from_utf8(map.remove("id").expect("an id field")).unwrap(),
                            key: map.remove("key").map(|k| String::from_utf8(k).unwrap()),
                            key_header: map
                                .remove(&format!("h:{}", taskq_outbox::KEY_HEADER))
                                .map(|k| String::from_utf8(k).unwrap()),
                            payload: map.remove("payload").expect("a payload field"),
                        });
                        from = format!("({entry_id}");
                    }
                    if n < 1000 {
                        break;
                    }
                }
                got
            }
        }
    }

    /// Deletes the stream, queue or key (errors ignored).
    pub async fn delete(self) {
        match self.reader {
            Reader::Nats(js) => {
                js.delete_stream(&self.name).await.ok();
            }
            Reader::Rabbit(conn, channel) => {
                channel
                    .queue_delete(self.name.as_str().into(), Default::default())
                    .await
                    .ok();
                conn.close(0, "done".into()).await.ok();
            }
            Reader::Redis(mut conn) => {
                let _: Result<(), _> = redis::cmd("DEL")
                    .arg(&self.name)
                    .query_async(&mut conn)
                    .await;
            }
        }
    }
}

fn redis_bytes(v: &redis::Value) -> Vec<u8> {
    match v {
        redis::Value::BulkString(b) => b.clone(),
        redis::Value::SimpleString(s) => s.clone().into_bytes(),
        other => panic!("not a string: {other:?}"),
    }
}

/// What producers did: per key, the committed events (sequence number, message id), and the
/// message ids of events whose transaction rolled back.
#[derive(Debug, Clone, Default)]
pub struct Ledger {
    committed: BTreeMap<String, Vec<(u64, String)>>,
    rolled_back: HashSet<String>,
}

impl Ledger {
    /// An empty ledger.
    pub fn new() -> Self {
        Self::default()
    }

    /// An event of `key` with sequence number `seq` (its commit order) was committed.
    pub fn committed(&mut self, key: impl Into<String>, seq: u64, id: impl Into<String>) {
        self.committed
            .entry(key.into())
            .or_default()
            .push((seq, id.into()));
    }

    /// An event with this message id was written in a transaction that rolled back.
    pub fn rolled_back(&mut self, id: impl Into<String>) {
        self.rolled_back.insert(id.into());
    }

    /// Adds another ledger's records (one per producer).
    pub fn extend(&mut self, other: Ledger) {
        for (key, events) in other.committed {
            self.committed.entry(key).or_default().extend(events);
        }
        self.rolled_back.extend(other.rolled_back);
    }

    /// How many events were committed.
    pub fn committed_count(&self) -> usize {
        self.committed.values().map(Vec::len).sum()
    }

    /// How many were rolled back.
    pub fn rolled_back_count(&self) -> usize {
        self.rolled_back.len()
    }

    /// Checks what consumers received (in arrival order; `key_of` tells a message's key)
    /// against the ledger, per key: after dropping every message whose id came before (the
    /// dedup a consumer does), the ids are exactly the key's committed events in sequence
    /// order (commit order, no gap, nothing extra); no id of a rolled-back event appears; a
    /// duplicate only carries an id already delivered for that key. Returns the counts, or
    /// every violation found (at most 20 listed).
    pub fn check(
        &self,
        received: &[Received],
        key_of: impl Fn(&Received) -> String,
    ) -> Result<Delivery, String> {
        let mut problems = Vec::new();
        let mut firsts: BTreeMap<String, Vec<&str>> = BTreeMap::new();
        let mut seen: HashSet<&str> = HashSet::new();
        let mut key_of_id: BTreeMap<&str, &str> = BTreeMap::new();
        for (key, events) in &self.committed {
            for (_, id) in events {
                key_of_id.insert(id, key);
            }
        }
        let mut duplicates = 0;
        for (i, m) in received.iter().enumerate() {
            let key = key_of(m);
            if self.rolled_back.contains(&m.id) {
                problems.push(format!("#{i}: {} of a rolled-back transaction", m.id));
                continue;
            }
            match key_of_id.get(m.id.as_str()) {
                None => problems.push(format!("#{i}: {} was never committed", m.id)),
                Some(k) if *k != key => problems.push(format!(
                    "#{i}: {} arrived as key {key}, committed as {k}",
                    m.id
                )),
                Some(_) => {}
            }
            if seen.insert(&m.id) {
                firsts.entry(key).or_default().push(&m.id);
            } else {
                // Already delivered: a consumer drops it (the duplicate's id came before).
                duplicates += 1;
            }
        }
        for (key, events) in &self.committed {
            let mut events = events.clone();
            events.sort();
            let want: Vec<&str> = events.iter().map(|(_, id)| id.as_str()).collect();
            let got = firsts.get(key.as_str()).cloned().unwrap_or_default();
            if got != want {
                let at = got
                    .iter()
                    .zip(&want)
                    .position(|(g, w)| g != w)
                    .unwrap_or(got.len().min(want.len()));
                problems.push(format!(
                    "key {key}: {} distinct received, {} committed; first difference at #{at}: \
                     got {:?}, want {:?}",
                    got.len(),
                    want.len(),
                    got.get(at),
                    want.get(at)
                ));
            }
        }
        if problems.is_empty() {
            Ok(Delivery {
                received: received.len(),
                distinct: seen.len(),
                duplicates,
                keys: self.committed.len(),
            })
        } else {
            let n = problems.len();
            problems.truncate(20);
            Err(format!("{n} violation(s):\n  {}", problems.join("\n  ")))
        }
    }
}

/// The counts of a [`Ledger::check`] that passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivery {
    /// Messages received, duplicates included.
    pub received: usize,
    /// Distinct message ids received (= events committed).
    pub distinct: usize,
    /// Messages whose id was received before.
    pub duplicates: usize,
    /// Keys.
    pub keys: usize,
}

#[cfg(test)]
mod ledger_tests {
    use super::*;

    fn got(ids: &[&str]) -> Vec<Received> {
        ids.iter()
            .map(|id| Received {
                id: (*id).to_owned(),
                key: Some(id[..1].to_owned()),
                key_header: None,
                payload: Vec::new(),
            })
            .collect()
    }

    fn ledger() -> Ledger {
        let mut l = Ledger::new();
        // Committed out of order across producers: the sequence numbers give the order.
        l.committed("a", 2, "a2");
        l.committed("a", 1, "a1");
        l.committed("b", 1, "b1");
        l.committed("a", 3, "a3");
        l.rolled_back("ax");
        l
    }

    fn key(m: &Received) -> String {
        m.key.clone().unwrap()
    }

    #[test]
    fn per_key_commit_order_with_duplicates_of_delivered_ids_passes() {
        let d = ledger()
            .check(&got(&["a1", "b1", "a2", "a1", "a2", "a3", "b1"]), key)
            .unwrap();
        assert_eq!((d.received, d.distinct, d.duplicates, d.keys), (7, 4, 3, 2));
    }

    #[test]
    fn a_gap_a_swap_a_rolled_back_or_unknown_id_fails() {
        let l = ledger();
        assert!(
            l.check(&got(&["a1", "a3", "b1"]), key).is_err(),
            "a2 missing"
        );
        assert!(
            l.check(&got(&["a2", "a1", "a3", "b1"]), key).is_err(),
            "swapped"
        );
        let rolled = l.check(&got(&["a1", "a2", "a3", "b1", "ax"]), key);
        assert!(rolled.unwrap_err().contains("rolled-back"));
        assert!(l.check(&got(&["a1", "a2", "a3", "b1", "a9"]), key).is_err());
        // A later event delivered before an earlier one, then the earlier one: out of order.
        assert!(l.check(&got(&["a1", "a3", "a2", "a3", "b1"]), key).is_err());
    }
}
