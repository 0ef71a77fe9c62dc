//! `--outbox [n]`: the relay (issue 26) against a hand-written publish loop, in the same run.
//!
//! For each broker of `--outbox-brokers` (default `nats`) and each of 1, 16 and 256 keys:
//! 1. `n` events (~256 bytes of JSON each) are published with `publish_tx`, one transaction
//!    each (`BEGIN`, `publish_tx`, `COMMIT`), round-robin over the keys: statements per publish
//!    (the server's `Questions`, global: run it on a server nothing else uses);
//! 2. the **direct loop** publishes the same messages (same subject, key, payload; ids with a
//!    `d-` prefix) straight to a fresh destination of the same broker, in batches of the
//!    relay's batch size, pipelined like the sinks (a window of acks or confirms; Redis:
//!    one pipeline per batch), with the broker's client crate directly, with the message id
//!    and the key header the sinks send;
//! 3. the **hand-written relay** (`hand_written`: the least a relay must do, straight against
//!    the tables and the broker's client, no leases) publishes the `n` events to its own fresh
//!    destination: read the keys with pending events and up to 512 of their events, publish
//!    them pipelined as the direct loop does, move each key's `done_seq` (three statements a
//!    round), overlapping rounds as taskq's relay does (the settle of the round before and the
//!    read of the next while one is published); its clock stops at the `n`-th ack. The keys'
//!    `done_seq` is then set back to 0 for the relay;
//! 4. the **relay** (one `Relay` in this process, batch 512) publishes the `n` events to its
//!    own fresh destination. Like the direct loop, its sink is connected and the relay built
//!    before its clock starts; the clock stops when its sink has had the `n`-th publish
//!    acknowledged (a wrapper counting the sink's `Delivered` outcomes, as the direct loop
//!    stops at its last ack: no polling of the broker while it runs), and the destination is
//!    then checked to hold `n` messages. Rounds (the sink's `publish` calls) and statements per
//!    event until every event is marked delivered (the polls that wait for it subtracted).
//!
//! For both relays a second table splits the time to the last ack by the publish calls' start
//! and end: to the first publish, in the sink per round, between publishes per round (what the
//! publish did not overlap); and the bytes the server sent per event (`Bytes_sent`, global)
//! and this process's CPU per event.
//!
//! Then, over 16 keys with the relay running idle: commit-to-broker latency of 300 events
//! committed one at a time (the time from `COMMIT` returning to a subscriber receiving the
//! message; NATS: a core subscription on the subject, Redis: `XREAD BLOCK`, RabbitMQ: a
//! consumer), which measures the in-process wake-up (`publish_tx` nudges the relay).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::MySqlPool;
use taskq::outbox::{Event, Relay};
use taskq_outbox::nats::async_nats;
use taskq_outbox::rabbitmq::lapin;
use taskq_outbox::redis::client as redis;
use taskq_outbox::{Bytes, Message, Outcome, Sink};

use crate::Res;
use crate::counters::{cpu_secs, server_status, status_delta};

/// Events per measurement when `--outbox-events` is not given: enough that the fixed costs
/// (connections, the first round) are small against the run.
pub const DEFAULT_EVENTS: u64 = 20_000;
const PAD: usize = 200;
const BATCH: usize = 512;
const LATENCY_EVENTS: usize = 300;

#[derive(serde::Serialize)]
struct BenchEvent {
    #[serde(skip)]
    topic: String,
    key: String,
    n: u64,
    pad: String,
}

impl Event for BenchEvent {
    fn topic(&self) -> &str {
        &self.topic
    }
    fn key(&self) -> String {
        self.key.clone()
    }
}

/// A broker of the run: its URL and how to make destinations on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Broker {
    Nats,
    RabbitMq,
    Redis,
}

impl Broker {
    pub fn parse(s: &str) -> Res<Self> {
        Ok(match s {
            "nats" => Broker::Nats,
            "rabbitmq" => Broker::RabbitMq,
            "redis" => Broker::Redis,
            other => return Err(format!("unknown broker {other} (nats, rabbitmq, redis)").into()),
        })
    }

    fn label(self) -> &'static str {
        match self {
            Broker::Nats => "NATS JetStream",
            Broker::RabbitMq => "RabbitMQ",
            Broker::Redis => "Redis Streams",
        }
    }

    fn url(self) -> String {
        let (var, default) = match self {
            Broker::Nats => ("TASKQ_BENCH_NATS_URL", taskq_outbox::local::NATS_URL),
            Broker::RabbitMq => ("TASKQ_BENCH_AMQP_URL", taskq_outbox::local::AMQP_URL),
            Broker::Redis => ("TASKQ_BENCH_REDIS_URL", taskq_outbox::local::REDIS_URL),
        };
        std::env::var(var).unwrap_or_else(|_| default.to_owned())
    }
}

/// A fresh stream / queue / stream key and a client on it.
enum Dest {
    Nats {
        js: async_nats::jetstream::Context,
        stream: String,
        subject: String,
    },
    Rabbit {
        _conn: lapin::Connection,
        channel: lapin::Channel,
        queue: String,
    },
    Redis {
        conn: redis::aio::MultiplexedConnection,
        key: String,
    },
}

impl Dest {
    async fn create(broker: Broker) -> Res<Self> {
        let name = format!("taskq_bench_{:012x}", fastrand::u64(..) >> 16);
        let url = broker.url();
        Ok(match broker {
            Broker::Nats => {
                let js = async_nats::jetstream::new(async_nats::connect(url).await?);
                js.create_stream(async_nats::jetstream::stream::Config {
                    name: name.clone(),
                    subjects: vec![format!("{name}.>")],
                    ..Default::default()
                })
                .await?;
                Dest::Nats {
                    js,
                    subject: format!("{name}.events"),
                    stream: name,
                }
            }
            Broker::RabbitMq => {
                let conn = lapin::Connection::connect(&url, lapin::ConnectionProperties::default())
                    .await?;
                let channel = conn.create_channel().await?;
                channel
                    .queue_declare(
                        name.as_str().into(),
                        lapin::options::QueueDeclareOptions {
                            durable: true,
                            ..Default::default()
                        },
                        Default::default(),
                    )
                    .await?;
                Dest::Rabbit {
                    _conn: conn,
                    channel,
                    queue: name,
                }
            }
            Broker::Redis => Dest::Redis {
                conn: redis::Client::open(url)?
                    .get_multiplexed_async_connection()
                    .await?,
                key: name,
            },
        })
    }

    fn topic(&self) -> String {
        match self {
            Dest::Nats { subject, .. } => subject.clone(),
            Dest::Rabbit { queue, .. } => queue.clone(),
            Dest::Redis { key, .. } => key.clone(),
        }
    }

    async fn count(&self) -> Res<u64> {
        Ok(match self {
            Dest::Nats { js, stream, .. } => {
                js.get_stream(stream).await?.info().await?.state.messages
            }
            Dest::Rabbit { channel, queue, .. } => channel
                .queue_declare(
                    queue.as_str().into(),
                    lapin::options::QueueDeclareOptions {
                        passive: true,
                        durable: true,
                        ..Default::default()
                    },
                    Default::default(),
                )
                .await?
                .message_count()
                .into(),
            Dest::Redis { conn, key } => {
                let mut conn = conn.clone();
                redis::cmd("XLEN").arg(key).query_async(&mut conn).await?
            }
        })
    }

    async fn delete(self) {
        match self {
            Dest::Nats { js, stream, .. } => {
                js.delete_stream(&stream).await.ok();
            }
            Dest::Rabbit { channel, queue, .. } => {
                channel
                    .queue_delete(queue.as_str().into(), Default::default())
                    .await
                    .ok();
            }
            Dest::Redis { mut conn, key } => {
                let _: Result<(), _> = redis::cmd("DEL").arg(&key).query_async(&mut conn).await;
            }
        }
    }
}

/// A broker client connected for the hand-written loops, publishing the way the sinks do:
/// the message id (JetStream's `Nats-Msg-Id`, RabbitMQ's `message_id`, a Redis field) and the
/// key ([`taskq_outbox::KEY_HEADER`] on NATS and RabbitMQ, `key` and `h:Taskq-Key` on Redis),
/// a batch pipelined (a window of acks or confirms; Redis: one pipeline).
enum Publisher {
    Nats(async_nats::jetstream::Context),
    Rabbit(lapin::Connection, lapin::Channel),
    Redis(redis::aio::MultiplexedConnection),
}

impl Publisher {
    async fn connect(broker: Broker) -> Res<Self> {
        let url = broker.url();
        Ok(match broker {
            Broker::Nats => {
                Publisher::Nats(async_nats::jetstream::new(async_nats::connect(url).await?))
            }
            Broker::RabbitMq => {
                let conn = lapin::Connection::connect(&url, lapin::ConnectionProperties::default())
                    .await?;
                let channel = conn.create_channel().await?;
                channel
                    .confirm_select(lapin::options::ConfirmSelectOptions::default())
                    .await?;
                Publisher::Rabbit(conn, channel)
            }
            Broker::Redis => Publisher::Redis(
                redis::Client::open(url)?
                    .get_multiplexed_async_connection()
                    .await?,
            ),
        })
    }

    /// Publishes `batch` and waits for every ack.
    async fn send(&mut self, batch: &[Message]) -> Res<()> {
        match self {
            Publisher::Nats(js) => {
                let mut acks = VecDeque::with_capacity(batch.len());
                for m in batch {
                    let mut h = async_nats::HeaderMap::new();
                    h.insert("Nats-Msg-Id", m.id.as_str());
                    h.insert(taskq_outbox::KEY_HEADER, m.key.as_str());
                    acks.push_back(
                        js.publish_with_headers(m.subject.clone(), h, m.payload.clone())
                            .await?,
                    );
                }
                for ack in acks {
                    ack.await?;
                }
            }
            Publisher::Rabbit(_, channel) => {
                let mut confirms = VecDeque::with_capacity(batch.len());
                for m in batch {
                    let mut table = lapin::types::FieldTable::default();
                    table.insert(
                        taskq_outbox::KEY_HEADER.into(),
                        lapin::types::AMQPValue::LongString(m.key.as_str().into()),
                    );
                    let props = lapin::BasicProperties::default()
                        .with_delivery_mode(2)
                        .with_message_id(m.id.as_str().into())
                        .with_headers(table);
                    confirms.push_back(
                        channel
                            .basic_publish(
                                "".into(),
                                m.subject.as_str().into(),
                                lapin::options::BasicPublishOptions {
                                    mandatory: true,
                                    ..Default::default()
                                },
                                &m.payload,
                                props,
                            )
                            .await?,
                    );
                }
                for c in confirms {
                    c.await?;
                }
            }
            Publisher::Redis(conn) => {
                let mut pipe = redis::pipe();
                for m in batch {
                    pipe.cmd("XADD")
                        .arg(&m.subject)
                        .arg("*")
                        .arg("id")
                        .arg(&m.id)
                        .arg("key")
                        .arg(&m.key)
                        .arg("payload")
                        .arg(m.payload.as_ref())
                        .arg(format!("h:{}", taskq_outbox::KEY_HEADER))
                        .arg(&m.key);
                }
                let _: Vec<String> = pipe.query_async(conn).await?;
            }
        }
        Ok(())
    }

    async fn close(self) {
        if let Publisher::Rabbit(conn, _) = self {
            conn.close(0, "done".into()).await.ok();
        }
    }
}

/// The direct loop: `msgs` straight to the broker, in batches of [`BATCH`], pipelined.
async fn direct(broker: Broker, msgs: &[Message]) -> Res<Duration> {
    let mut publisher = Publisher::connect(broker).await?;
    let start = Instant::now();
    for batch in msgs.chunks(BATCH) {
        publisher.send(batch).await?;
    }
    let took = start.elapsed();
    publisher.close().await;
    Ok(took)
}

/// What the hand-written relay did: the time to its last ack, rounds, the statements it
/// sent (reads and settles), and the time it spent in its publishes.
struct HandWritten {
    took: Duration,
    rounds: u64,
    statements: u64,
    spans: Spans,
}

/// A round of the hand-written relay, read: its messages and the last seq of each key in it.
struct HandRound {
    batch: Vec<Message>,
    ends: Vec<(Vec<u8>, u64)>,
}

/// The hand-written relay's read: up to [`BATCH`] keys of `topic` with pending events, then up
/// to [`BATCH`] of their events (an equal share per key, by primary-key ranges), each key read
/// from past the last seq it has handed to the broker already (`sent`: the round being
/// published is not settled yet). Two statements.
async fn hand_read(
    conn: &mut sqlx::MySqlConnection,
    topic: &str,
    dest: &str,
    sent: &std::collections::HashMap<Vec<u8>, u64>,
) -> Res<HandRound> {
    let keys: Vec<(Vec<u8>, u64, u64)> = sqlx::query_as(
        "SELECT key_hash, done_seq, next_seq FROM taskq_event_keys
         WHERE topic = ? AND done_seq < next_seq LIMIT ?",
    )
    .bind(topic)
    .bind(BATCH as u64)
    .fetch_all(&mut *conn)
    .await?;
    let keys: Vec<(Vec<u8>, u64, u64)> = keys
        .into_iter()
        .map(|(h, done, next)| {
            let from = sent.get(&h).copied().unwrap_or(0).max(done);
            (h, from, next)
        })
        .filter(|(_, from, next)| from < next)
        .collect();
    if keys.is_empty() {
        return Ok(HandRound {
            batch: Vec::new(),
            ends: Vec::new(),
        });
    }
    let share = (BATCH / keys.len()).max(1) as u64;
    let mut sql = String::from(
        "SELECT key_hash, seq, message_id, event_key, payload FROM taskq_events
         WHERE dead_at IS NULL AND (",
    );
    sql.push_str(&vec!["(key_hash = ? AND seq > ? AND seq <= ?)"; keys.len()].join(" OR "));
    sql.push_str(") ORDER BY key_hash, seq");
    // Only placeholders are added to it.
    let mut q =
        sqlx::query_as::<_, (Vec<u8>, u64, String, String, Vec<u8>)>(sqlx::AssertSqlSafe(sql));
    for (hash, from, next) in &keys {
        q = q.bind(hash).bind(*from).bind((*from + share).min(*next));
    }
    let rows = q.fetch_all(&mut *conn).await?;
    // The last seq read per key (rows are in key order).
    let mut ends: Vec<(Vec<u8>, u64)> = Vec::new();
    let mut batch = Vec::with_capacity(rows.len());
    for (hash, seq, id, key, payload) in rows {
        match ends.last_mut() {
            Some((h, s)) if *h == hash => *s = seq,
            _ => ends.push((hash, seq)),
        }
        batch.push(Message::new(id, dest.to_owned(), key, Bytes::from(payload)));
    }
    Ok(HandRound { batch, ends })
}

/// The hand-written relay's settle: each key's `done_seq` to its last seq published, one
/// `UPDATE`.
async fn hand_settle(conn: &mut sqlx::MySqlConnection, ends: &[(Vec<u8>, u64)]) -> Res<()> {
    if ends.is_empty() {
        return Ok(());
    }
    let mut sql = String::from("UPDATE taskq_event_keys SET done_seq = CASE key_hash");
    for _ in ends {
        sql.push_str(" WHEN ? THEN ?");
    }
    sql.push_str(" END WHERE key_hash IN (");
    sql.push_str(&vec!["?"; ends.len()].join(", "));
    sql.push(')');
    // Only placeholders are added to it.
    let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
    for (h, s) in ends {
        q = q.bind(h.as_slice()).bind(*s);
    }
    for (h, _) in ends {
        q = q.bind(h.as_slice());
    }
    q.execute(&mut *conn).await?;
    Ok(())
}

/// The hand-written relay: the least a relay must do, written straight against the tables and
/// the broker's client, one process, no leases (so not safe beside another relay): read a
/// round ([`hand_read`]), publish it to `dest` pipelined, move each key's `done_seq` to its
/// last event published ([`hand_settle`]); three statements a round. Like taskq's relay it
/// overlaps rounds: while one round is published, the one before is settled and the next
/// read (on one connection, one statement after the other), so its round takes the longer of
/// the publish and those three statements. It stops once `n` events have been published; its
/// clock stops at the `n`-th ack, as the relay's does (the last settle after it).
async fn hand_written(
    pool: &MySqlPool,
    broker: Broker,
    topic: &str,
    dest: &str,
    n: u64,
) -> Res<HandWritten> {
    let mut publisher = Publisher::connect(broker).await?;
    let mut conn = pool.acquire().await?;
    let mut sent_seq = std::collections::HashMap::new();
    let start = Instant::now();
    let (mut sent, mut rounds, mut statements) = (0u64, 0u64, 0u64);
    let mut took = Duration::ZERO;
    let mut calls = Vec::new();
    let mut next = hand_read(&mut conn, topic, dest, &sent_seq).await?;
    statements += 2;
    let mut settling: Vec<(Vec<u8>, u64)> = Vec::new();
    while sent < n {
        let current = next;
        if current.batch.is_empty() {
            return Err(format!("hand-written relay: {sent} of {n} events found").into());
        }
        for (h, s) in &current.ends {
            sent_seq.insert(h.clone(), *s);
        }
        let more = sent + (current.batch.len() as u64) < n;
        let previous = std::mem::take(&mut settling);
        let settles = u64::from(!previous.is_empty());
        let conn = &mut *conn;
        let sent_seq = &sent_seq;
        let db = async move {
            hand_settle(conn, &previous).await?;
            if more {
                hand_read(conn, topic, dest, sent_seq).await
            } else {
                Ok(HandRound {
                    batch: Vec::new(),
                    ends: Vec::new(),
                })
            }
        };
        let publish = async {
            let started = Instant::now();
            let r = publisher.send(&current.batch).await;
            (started, Instant::now(), r)
        };
        let ((started, ended, published), read) = tokio::join!(publish, db);
        published?;
        calls.push((started, ended));
        statements += settles + if more { 2 } else { 0 };
        next = read?;
        rounds += 1;
        sent += current.batch.len() as u64;
        if sent >= n {
            took = ended - start;
        }
        settling = current.ends;
    }
    hand_settle(&mut conn, &settling).await?;
    statements += 1;
    publisher.close().await;
    Ok(HandWritten {
        took,
        rounds,
        statements,
        spans: Spans::of(start, &calls),
    })
}

async fn sink(broker: Broker) -> Res<SinkKind> {
    let url = broker.url();
    Ok(match broker {
        Broker::Nats => SinkKind::Nats(taskq_outbox::nats::NatsSink::connect(&url).await?),
        Broker::RabbitMq => {
            SinkKind::Rabbit(taskq_outbox::rabbitmq::RabbitSink::connect(&url, "").await?)
        }
        Broker::Redis => SinkKind::Redis(taskq_outbox::redis::RedisSink::connect(&url).await?),
    })
}

enum SinkKind {
    Nats(taskq_outbox::nats::NatsSink),
    Rabbit(taskq_outbox::rabbitmq::RabbitSink),
    Redis(taskq_outbox::redis::RedisSink),
}

/// What a relay's sink saw: rounds (publish calls), events delivered, when the `target`-th
/// was, and when each publish call started and ended (see [`Spans`]).
#[derive(Default)]
struct Tally {
    rounds: AtomicU64,
    delivered: AtomicU64,
    target: AtomicU64,
    done_at: Mutex<Option<Instant>>,
    done: tokio::sync::Notify,
    calls: Mutex<Vec<(Instant, Instant)>>,
}

/// Where a relay's time to its last ack went, from the start and end of each publish call
/// (the broker's client's own time included): before its first publish (the first lease
/// and read), in the sink, and between one publish's end and the next one's start (what the
/// relay did that the publish did not overlap).
#[derive(Clone, Copy, Default)]
struct Spans {
    first: Duration,
    in_sink: Duration,
    between: Duration,
}

impl Spans {
    /// From the publish calls (start, end) of a run whose clock started at `start`.
    fn of(start: Instant, calls: &[(Instant, Instant)]) -> Self {
        let mut s = Spans::default();
        let mut last_end: Option<Instant> = None;
        for &(a, b) in calls {
            match last_end {
                None => s.first = a.saturating_duration_since(start),
                Some(e) => s.between += a.saturating_duration_since(e),
            }
            s.in_sink += b - a;
            last_end = Some(b);
        }
        s
    }

    /// `first / sink per round / between per round`, in ms.
    fn cells(&self, rounds: u64) -> String {
        let r = rounds.max(1) as f64;
        format!(
            "{:.1} | {:.2} | {:.2}",
            self.first.as_secs_f64() * 1e3,
            self.in_sink.as_secs_f64() * 1e3 / r,
            self.between.as_secs_f64() * 1e3 / r
        )
    }
}

/// A sink that counts what the sink it wraps delivered (see [`Tally`]).
struct Counting<S> {
    inner: S,
    tally: Arc<Tally>,
}

impl<S: Sink> Sink for Counting<S> {
    async fn publish(&self, batch: &[Message]) -> Vec<Outcome> {
        let started = Instant::now();
        let out = self.inner.publish(batch).await;
        self.tally
            .calls
            .lock()
            .unwrap()
            .push((started, Instant::now()));
        let n = out.iter().filter(|o| o.is_delivered()).count() as u64;
        self.tally.rounds.fetch_add(1, Ordering::Relaxed);
        let total = self.tally.delivered.fetch_add(n, Ordering::Relaxed) + n;
        if total >= self.tally.target.load(Ordering::Relaxed) {
            let mut at = self.tally.done_at.lock().unwrap();
            if at.is_none() {
                *at = Some(Instant::now());
                self.tally.done.notify_one();
            }
        }
        out
    }
}

type Stop = (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<taskq::Result<()>>,
);

/// A relay built (its sink connected) but not started.
type Starter = Box<dyn FnOnce() -> Stop + Send>;

/// Builds a relay on `topic` over a counting `sink`; run it with the returned starter.
fn build_relay<S: Sink + 'static>(
    pool: &MySqlPool,
    sink: S,
    topic: &str,
    tally: Arc<Tally>,
) -> Res<Starter> {
    let relay = Relay::builder(pool.clone(), Counting { inner: sink, tally })
        .topics([topic.to_owned()])
        .batch_size(BATCH as u32)
        .build()?;
    Ok(Box::new(move || {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let handle = tokio::spawn(async move {
            relay
                .run_until(async move {
                    let _ = rx.await;
                })
                .await
        });
        (tx, handle)
    }))
}

/// Connects a sink of `broker` and builds a relay on `topic` with it (not started).
async fn relay_for(
    pool: &MySqlPool,
    broker: Broker,
    topic: &str,
    tally: Arc<Tally>,
) -> Res<Starter> {
    match sink(broker).await? {
        SinkKind::Nats(s) => build_relay(pool, s, topic, tally),
        SinkKind::Rabbit(s) => build_relay(pool, s, topic, tally),
        SinkKind::Redis(s) => build_relay(pool, s, topic, tally),
    }
}

async fn start_relay(pool: &MySqlPool, broker: Broker, topic: &str) -> Res<Stop> {
    Ok(relay_for(pool, broker, topic, Arc::default()).await?())
}

/// The server's `Bytes_sent` (global: every byte it sent to any client).
async fn bytes_sent(pool: &MySqlPool) -> Res<i64> {
    let (_, v): (String, String) = sqlx::query_as("SHOW GLOBAL STATUS LIKE 'Bytes_sent'")
        .fetch_one(pool)
        .await?;
    Ok(v.parse()?)
}

async fn pending(pool: &MySqlPool, topic: &str) -> Res<i64> {
    Ok(sqlx::query_scalar(
        "SELECT CAST(COALESCE(SUM(next_seq - done_seq), 0) AS SIGNED) FROM taskq_event_keys WHERE topic = ?",
    )
    .bind(topic)
    .fetch_one(pool)
    .await?)
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

/// Runs the measurements for each broker and prints Markdown tables.
pub async fn run(pool: &MySqlPool, n: u64, brokers: &[Broker]) -> Res<()> {
    let mut rows = Vec::new();
    let mut latency_rows = Vec::new();
    let mut spans = Vec::new();
    for &broker in brokers {
        for keys in [1u64, 16, 256] {
            let relay_dest = Dest::create(broker).await?;
            let topic = relay_dest.topic();
            // 1. Publish.
            let before = server_status(pool).await?;
            let mut msgs = Vec::with_capacity(n as usize);
            for i in 0..n {
                let ev = BenchEvent {
                    topic: topic.clone(),
                    key: format!("key-{}", i % keys),
                    n: i,
                    pad: "x".repeat(PAD),
                };
                let mut tx = pool.begin().await?;
                let stored = ev.publish_tx(&mut tx).await?;
                tx.commit().await?;
                msgs.push(Message::new(
                    format!("d-{}", stored.message_id),
                    topic.clone(),
                    ev.key.clone(),
                    Bytes::from(serde_json::to_vec(&ev)?),
                ));
            }
            let after = server_status(pool).await?;
            let per_publish = status_delta(&before, &after)["Questions"] as f64 / n as f64;
            // 2. The direct loop, to its own destination.
            let direct_dest = Dest::create(broker).await?;
            let direct_topic = direct_dest.topic();
            for m in &mut msgs {
                m.subject = direct_topic.clone();
            }
            let direct_took = direct(broker, &msgs).await?;
            direct_dest.delete().await;
            let direct_rate = n as f64 / direct_took.as_secs_f64();
            // 3. The hand-written relay, to its own destination; then the keys are rewound
            //    for taskq's relay.
            let hand_dest = Dest::create(broker).await?;
            let (bytes0, cpu0) = (bytes_sent(pool).await?, cpu_secs());
            let hand = hand_written(pool, broker, &topic, &hand_dest.topic(), n).await?;
            let hand_cpu = cpu_secs() - cpu0;
            let hand_bytes = (bytes_sent(pool).await? - bytes0) as f64 / n as f64;
            let hand_stored = hand_dest.count().await?;
            hand_dest.delete().await;
            if hand_stored < n {
                return Err(format!(
                    "{}: the hand-written relay's destination holds {hand_stored} of {n} messages",
                    broker.label()
                )
                .into());
            }
            sqlx::query("UPDATE taskq_event_keys SET done_seq = 0 WHERE topic = ?")
                .bind(&topic)
                .execute(pool)
                .await?;
            let hand_rate = n as f64 / hand.took.as_secs_f64();
            // 4. The relay: sink connected and relay built before the clock starts.
            let tally = Arc::new(Tally::default());
            tally.target.store(n, Ordering::Relaxed);
            let starter = relay_for(pool, broker, &topic, tally.clone()).await?;
            tokio::time::sleep(Duration::from_millis(200)).await;
            let before = server_status(pool).await?;
            let (bytes0, cpu0) = (bytes_sent(pool).await?, cpu_secs());
            let start = Instant::now();
            let (stop, handle) = starter();
            let done_at = loop {
                let done = tally.done.notified();
                if let Some(at) = *tally.done_at.lock().unwrap() {
                    break at;
                }
                done.await;
            };
            let relay_took = done_at - start;
            let mut polls = 0;
            while pending(pool, &topic).await? > 0 {
                polls += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            polls += 1;
            let relay_cpu = cpu_secs() - cpu0;
            let relay_bytes = (bytes_sent(pool).await? - bytes0) as f64 / n as f64;
            let after = server_status(pool).await?;
            let _ = stop.send(());
            handle.await??;
            let per_event = (status_delta(&before, &after)["Questions"] - polls) as f64 / n as f64;
            let relay_rate = n as f64 / relay_took.as_secs_f64();
            let rounds = tally.rounds.load(Ordering::Relaxed);
            let relay_spans = Spans::of(start, &tally.calls.lock().unwrap());
            // The destination holds every event (a relay that lost a lease may send some
            // twice: RabbitMQ and Redis keep both copies).
            let stored = relay_dest.count().await?;
            if stored < n {
                return Err(format!(
                    "{}: the relay's destination holds {stored} of {n} messages",
                    broker.label()
                )
                .into());
            }
            relay_dest.delete().await;
            eprintln!(
                "{} {keys} keys: relay {relay_rate:.0}/s, hand-written {hand_rate:.0}/s, direct {direct_rate:.0}/s",
                broker.label()
            );
            rows.push(format!(
                "| {} | {keys} | {n} | {relay_rate:.0} | {hand_rate:.0} | {direct_rate:.0} | {:.2} | {:.2} | {per_publish:.2} | {per_event:.3} | {:.3} | {rounds} | {} |",
                broker.label(),
                relay_rate / hand_rate,
                relay_rate / direct_rate,
                hand.statements as f64 / n as f64,
                hand.rounds,
            ));
            spans.push(format!(
                "| {} | {keys} | {} | {} | {relay_bytes:.0} | {hand_bytes:.0} | {:.1} | {:.1} |",
                broker.label(),
                relay_spans.cells(rounds),
                hand.spans.cells(hand.rounds),
                relay_cpu * 1e6 / n as f64,
                hand_cpu * 1e6 / n as f64,
            ));
        }
        if let Some(row) = latency(pool, broker).await? {
            latency_rows.push(row);
        }
    }
    println!(
        "| broker | keys | events | relay events/s | hand-written relay events/s | direct loop msgs/s | relay / hand-written | relay / direct | statements per publish (own transaction) | relay statements per event | hand-written statements per event | relay rounds | hand-written rounds |"
    );
    println!("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
    for r in rows {
        println!("{r}");
    }
    println!();
    println!(
        "| broker | keys | relay: ms to first publish | relay: ms in the sink per round | relay: ms between publishes per round | hand-written: ms to first publish | hand-written: ms publishing per round | hand-written: ms between publishes per round | relay bytes read per event | hand-written bytes read per event | relay: this process's CPU µs per event | hand-written: this process's CPU µs per event |"
    );
    println!("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
    for r in spans {
        println!("{r}");
    }
    println!();
    println!(
        "| broker | events (16 keys, one at a time) | commit-to-broker p50 ms | p99 ms | max ms |"
    );
    println!("|---|--:|--:|--:|--:|");
    for r in latency_rows {
        println!("{r}");
    }
    Ok(())
}

/// Commit-to-broker latency with the relay running idle (NATS only: a core subscription sees
/// each JetStream publish when the stream stores it; the others print nothing).
async fn latency(pool: &MySqlPool, broker: Broker) -> Res<Option<String>> {
    if broker != Broker::Nats {
        return Ok(None);
    }
    let dest = Dest::create(broker).await?;
    let topic = dest.topic();
    let client = async_nats::connect(broker.url()).await?;
    let mut sub = client.subscribe(topic.clone()).await?;
    client.flush().await?;
    let (stop, handle) = start_relay(pool, broker, &topic).await?;
    // Warm-up (connections, prepared statements).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut ms = Vec::with_capacity(LATENCY_EVENTS);
    use futures_util::StreamExt as _;
    for i in 0..LATENCY_EVENTS as u64 {
        let ev = BenchEvent {
            topic: topic.clone(),
            key: format!("key-{}", i % 16),
            n: i,
            pad: "x".repeat(PAD),
        };
        let mut tx = pool.begin().await?;
        ev.publish_tx(&mut tx).await?;
        tx.commit().await?;
        let committed = Instant::now();
        tokio::time::timeout(Duration::from_secs(10), sub.next())
            .await?
            .ok_or("the subscription ended")?;
        ms.push(committed.elapsed().as_secs_f64() * 1000.0);
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    let _ = stop.send(());
    handle.await??;
    dest.delete().await;
    ms.sort_by(f64::total_cmp);
    Ok(Some(format!(
        "| {} | {} | {:.2} | {:.2} | {:.2} |",
        broker.label(),
        ms.len(),
        pct(&ms, 0.5),
        pct(&ms, 0.99),
        ms.last().copied().unwrap_or(0.0)
    )))
}
