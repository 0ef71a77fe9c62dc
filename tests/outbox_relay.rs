//! The relay with real brokers and real processes (issue 26): events committed by concurrent
//! producers (some transactions rolled back) are relayed by three `taskq-relay-worker`
//! processes to NATS JetStream, RabbitMQ or Redis Streams, and what a consumer of the
//! destination receives is checked per key against what the producers committed
//! (`taskq_tests::brokers::Ledger::check`): after dedup by message id, commit order with no
//! gap, nothing of a rolled-back transaction, duplicates only of ids already delivered.
//!
//! - `order_*`: 50 keys × 20 events, four producers, no fault.
//! - `outage_*`: the broker is unreachable for 10 s mid-stream (NATS: a private `nats-server`
//!   stopped and started again on the same port and store; RabbitMQ, Redis: the proxy cuts
//!   every connection and refuses new ones), then comes back.
//! - `black_hole_*`: every connection to the broker goes silent for 5 s (the proxy
//!   black-holes live and new connections), then new connections work again.
//! - `kill_*`: one relay process is SIGKILLed mid-stream; the other two take its keys over
//!   once its leases end.
//! - `poison_*`: an event over NATS's `max_payload` holds only its own key (strict), or is
//!   dead-lettered and its key goes on (opt-in).
//!
//! Each fault test prints, to stderr (not captured), how long after the fault ended the first
//! and the last key with pending events resumed, and how long until everything was delivered.
//! A broker that does not answer: `SKIPPED <broker>: ...`, unless `TASKQ_REQUIRE_BROKERS` is
//! set.

use std::collections::HashMap;
use std::io::Write as _;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::Path;
use std::time::{Duration, Instant};

use serde::Serialize;
use taskq::outbox::Event;
use taskq_tests::backends::{Db, TestBackend};
use taskq_tests::bins::spawn_ready;
use taskq_tests::brokers::{self, Broker, Destination, Ledger, Received};
use taskq_tests::nats_server::PrivateNats;
use taskq_tests::proxy::ChaosProxy;
use taskq_tests::{EVENT_STATE, EVENTS_WITH_KEYS, wait_until};

/// The event the producers publish: its key and its place in its producer's run, in the
/// payload (so a consumer of any broker knows the key), and padding.
#[derive(Debug, Clone, Serialize)]
struct Ev {
    #[serde(skip)]
    topic: String,
    key: String,
    producer: usize,
    n: usize,
    pad: String,
}

impl Event for Ev {
    fn topic(&self) -> &str {
        &self.topic
    }

    fn key(&self) -> String {
        self.key.clone()
    }
}

fn key_of(m: &Received) -> String {
    m.json()["key"]
        .as_str()
        .unwrap_or_else(|| panic!("{} has a key in its payload", m.id))
        .to_owned()
}

/// How much the producers publish.
#[derive(Debug, Clone, Copy)]
struct Load {
    keys: usize,
    /// Events committed per key on average (keys × per_key committed in all).
    per_key: usize,
    producers: usize,
    /// Pause between a producer's transactions.
    pace: Duration,
}

const ORDER: Load = Load {
    keys: 50,
    per_key: 20,
    producers: 4,
    pace: Duration::ZERO,
};

const FAULT: Load = Load {
    keys: 20,
    per_key: 15,
    producers: 3,
    pace: Duration::from_millis(25),
};

/// A fault injected mid-stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    None,
    /// The broker unreachable for 10 s.
    Outage,
    /// Every connection to the broker silent for 5 s.
    BlackHole,
    /// One relay process SIGKILLed.
    Kill,
}

const OUTAGE: Duration = Duration::from_secs(10);
const BLACK_HOLE: Duration = Duration::from_secs(5);
/// The relays' key lease (and the SIGKILLed relay's keys wait at most that long).
const LEASE_MS: &str = "2000";
/// The relays' bound of a batch (then its connection is replaced).
const TIMEOUT_MS: &str = "2000";

fn exe() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_taskq-relay-worker"))
}

fn say(line: String) {
    // Straight to stderr: libtest does not capture it.
    let _ = writeln!(std::io::stderr(), "{line}");
}

async fn start_relay(
    db_url: &str,
    broker: Broker,
    address: &str,
    topic: &str,
    id: &str,
    extra: &[&str],
) -> tokio::process::Child {
    let label = broker.label();
    let mut args = vec![
        "--url",
        db_url,
        "--broker",
        label,
        "--address",
        address,
        "--topic",
        topic,
        "--id",
        id,
        "--lease-ms",
        LEASE_MS,
        "--timeout-ms",
        TIMEOUT_MS,
    ];
    args.extend_from_slice(extra);
    spawn_ready(exe(), &args, id).await.0
}

/// `url` with its `host:port` replaced by `addr` (to go through a proxy).
fn via(url: &str, broker: Broker, addr: SocketAddr) -> String {
    url.replacen(&broker.address(), &addr.to_string(), 1)
}

fn resolve(address: &str) -> SocketAddr {
    address
        .to_socket_addrs()
        .expect("resolve the broker's address")
        .next()
        .expect("an address")
}

/// Spawns the producers; each returns its ledger. Producer `p` commits its share of
/// `keys × per_key` events in transactions of 1 to 3 events on random keys, and rolls back
/// about one transaction in eight (after publishing in it).
fn spawn_producers<B: TestBackend>(
    db: &Db<B>,
    topic: &str,
    load: Load,
) -> Vec<tokio::task::JoinHandle<Ledger>> {
    let total = load.keys * load.per_key;
    (0..load.producers)
        .map(|p| {
            let pool = B::pool_with_busy_timeout(db, Duration::from_secs(60));
            let topic = topic.to_owned();
            let share = total / load.producers + usize::from(p < total % load.producers);
            tokio::spawn(async move {
                let mut rng = fastrand::Rng::with_seed(p as u64 + 1);
                let mut ledger = Ledger::new();
                let mut committed = 0;
                let mut n = 0;
                while committed < share {
                    let rollback = rng.u8(..8) == 0;
                    let size = rng.usize(1..=3).min(share - committed);
                    let mut tx = B::begin(&pool).await;
                    let mut published = Vec::new();
                    let mut failed = false;
                    for _ in 0..size {
                        let ev = Ev {
                            topic: topic.clone(),
                            key: format!("k{}", rng.usize(..load.keys)),
                            producer: p,
                            n,
                            pad: "x".repeat(rng.usize(0..200)),
                        };
                        n += 1;
                        match ev.publish_tx(&mut tx).await {
                            Ok(stored) => published.push((ev.key, stored)),
                            // A deadlock between producers (MySQL): the transaction is
                            // rolled back, like an application's would be.
                            Err(_) => {
                                failed = true;
                                break;
                            }
                        }
                    }
                    let committed_ok = !rollback && !failed && tx_commit(tx).await;
                    if !committed_ok {
                        for (_, stored) in published {
                            ledger.rolled_back(stored.message_id);
                        }
                    } else {
                        committed += size;
                        for (key, stored) in published {
                            ledger.committed(key, stored.seq, stored.message_id);
                        }
                    }
                    if !load.pace.is_zero() {
                        tokio::time::sleep(load.pace).await;
                    }
                }
                ledger
            })
        })
        .collect()
}

/// Commits `tx`; `false` when the commit fails (then nothing of it is stored). A transaction
/// not committed is rolled back when dropped.
async fn tx_commit<B: TestBackend>(tx: sqlx::Transaction<'static, B>) -> bool {
    tx.commit().await.is_ok()
}

/// Per key: (done_seq, next_seq) of `taskq_event_keys`.
async fn progress<B: TestBackend>(db: &Db<B>) -> HashMap<String, (u64, u64)> {
    db.rows(
        &["event_key", "done_seq", "next_seq"],
        "FROM taskq_event_keys",
    )
    .await
    .into_iter()
    .map(|r| (r[0].clone(), (r[1].parse().unwrap(), r[2].parse().unwrap())))
    .collect()
}

async fn delivered<B: TestBackend>(db: &Db<B>) -> i64 {
    db.scalar(&format!(
        "SELECT COUNT(*) FROM {EVENTS_WITH_KEYS} WHERE {EVENT_STATE} = 'delivered'"
    ))
    .await
}

async fn undelivered<B: TestBackend>(db: &Db<B>) -> i64 {
    db.scalar(&format!(
        "SELECT COUNT(*) FROM {EVENTS_WITH_KEYS} WHERE {EVENT_STATE} <> 'delivered'"
    ))
    .await
}

/// From `end` (the fault's end), how long until the first and until the last of the keys that
/// had undelivered events then delivered again (their `done_seq` went up).
async fn resumed<B: TestBackend>(db: &Db<B>, end: Instant) -> (Duration, Duration) {
    let at_end = progress(db).await;
    let mut waiting: HashMap<String, u64> = at_end
        .into_iter()
        .filter(|(_, (done, next))| done < next)
        .map(|(k, (done, _))| (k, done))
        .collect();
    let waited = waiting.len();
    let mut first = None;
    let deadline = Instant::now() + Duration::from_secs(90);
    while !waiting.is_empty() {
        assert!(
            Instant::now() < deadline,
            "{} keys did not resume within 90 s: {waiting:?}",
            waiting.len()
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
        let now = progress(db).await;
        waiting.retain(|k, done| now.get(k).is_none_or(|(d, _)| d <= done));
        if first.is_none() && waiting.len() < waited {
            first = Some(end.elapsed());
        }
    }
    let all = end.elapsed();
    (first.unwrap_or(all), all)
}

/// The scenario: destination, three relays, producers, the fault, then the check.
async fn scenario<B: TestBackend>(db: Db<B>, broker: Broker, fault: Fault, load: Load) {
    let test = format!("{}/{}/{:?}", db.label(), broker.label(), fault);
    // A NATS outage needs a server of our own to stop; everything else the shared broker.
    let mut nats = None;
    let url = if broker == Broker::Nats && fault == Fault::Outage {
        let Some(server) = PrivateNats::start_or_skip() else {
            return;
        };
        let url = server.url();
        nats = Some(server);
        url
    } else {
        let Some(url) = brokers::or_skip(broker) else {
            return;
        };
        url
    };
    let dest = Destination::create(broker, &url).await;
    let proxied = fault == Fault::BlackHole || (fault == Fault::Outage && nats.is_none());
    let proxy = if proxied {
        Some(ChaosProxy::start(resolve(&broker.address())).await)
    } else {
        None
    };
    let relay_url = proxy
        .as_ref()
        .map_or_else(|| url.clone(), |p| via(&url, broker, p.addr()));
    let db_url = db.url();
    let mut relays = Vec::new();
    for i in 0..3 {
        relays.push(
            start_relay(
                &db_url,
                broker,
                &relay_url,
                &dest.topic,
                &format!("relay-{i}"),
                &[],
            )
            .await,
        );
    }
    let started = Instant::now();
    let producers = spawn_producers(&db, &dest.topic, load);
    let total = (load.keys * load.per_key) as i64;

    let mut recovery = None;
    let mut victim_keys = 0;
    if fault != Fault::None {
        // Mid-stream: once a fifth of the events went out.
        wait_until(
            Duration::from_secs(60),
            "a fifth of the events delivered",
            || async { delivered(&db).await >= total / 5 },
        )
        .await;
        let begin = Instant::now();
        match fault {
            Fault::Outage => {
                if let Some(server) = nats.as_mut() {
                    tokio::task::block_in_place(|| server.stop());
                    tokio::time::sleep(OUTAGE).await;
                    tokio::task::block_in_place(|| server.start());
                } else {
                    let p = proxy.as_ref().unwrap();
                    p.set_refuse(true);
                    p.cut_all().await;
                    tokio::time::sleep(OUTAGE).await;
                    p.set_refuse(false);
                }
            }
            Fault::BlackHole => {
                let p = proxy.as_ref().unwrap();
                p.set_black_hole(true);
                p.black_hole_all();
                tokio::time::sleep(BLACK_HOLE).await;
                p.heal();
            }
            Fault::Kill => {
                // Mid-batch: while relay-0 holds a key lease (between its claim and its
                // settle), polled as fast as the database answers.
                let held = "SELECT COUNT(*) FROM taskq_event_keys WHERE lease_owner = 'relay-0'";
                let deadline = Instant::now() + Duration::from_secs(20);
                while db.scalar(held).await == 0 {
                    assert!(Instant::now() < deadline, "relay-0 never held a key lease");
                }
                relays[0].start_kill().expect("SIGKILL relay-0");
                relays[0].wait().await.ok();
                victim_keys = db.scalar(held).await;
            }
            Fault::None => unreachable!(),
        }
        let end = Instant::now();
        let down = end - begin;
        let (first, all) = resumed(&db, end).await;
        recovery = Some((down, first, all, end));
    }

    let mut ledger = Ledger::new();
    for p in producers {
        ledger.extend(p.await.expect("a producer"));
    }
    assert_eq!(ledger.committed_count() as i64, total);
    wait_until(
        Duration::from_secs(120),
        "every committed event delivered",
        || async { undelivered(&db).await == 0 },
    )
    .await;
    let drained = started.elapsed();
    for r in &mut relays {
        if let Some(pid) = r.id() {
            taskq_tests::bins::signal(pid, "TERM");
        }
    }
    for r in &mut relays {
        let _ = tokio::time::timeout(Duration::from_secs(10), r.wait()).await;
    }
    let received = dest.read_all().await;
    let verdict = ledger.check(&received, key_of);
    dest.delete().await;
    let d = verdict.unwrap_or_else(|e| panic!("{test}: {e}"));
    let mut line = format!(
        "outbox_relay {test}: {} committed over {} keys, {} rolled back; received {} ({} duplicates); all delivered {:.1} s after the start",
        ledger.committed_count(),
        d.keys,
        ledger.rolled_back_count(),
        d.received,
        d.duplicates,
        drained.as_secs_f64()
    );
    if let Some((down, first, all, end)) = recovery {
        line += &format!(
            "; fault {:.1} s, then first key resumed after {:.2} s, every waiting key after {:.2} s, all delivered after {:.2} s",
            down.as_secs_f64(),
            first.as_secs_f64(),
            all.as_secs_f64(),
            drained.saturating_sub(end - started).as_secs_f64()
        );
        if fault == Fault::Kill {
            line += &format!(" (the killed relay held {victim_keys} key leases)");
        }
    }
    say(line);
}

macro_rules! scenarios {
    ($($name:ident: $broker:expr, $fault:expr, $load:expr;)*) => {
        $(
            async fn $name<B: TestBackend>(db: Db<B>) {
                scenario(db, $broker, $fault, $load).await;
            }
            taskq_tests::conformance!($name);
        )*
    };
}

scenarios! {
    order_nats: Broker::Nats, Fault::None, ORDER;
    order_rabbitmq: Broker::RabbitMq, Fault::None, ORDER;
    order_redis: Broker::Redis, Fault::None, ORDER;
    outage_nats: Broker::Nats, Fault::Outage, FAULT;
    outage_rabbitmq: Broker::RabbitMq, Fault::Outage, FAULT;
    outage_redis: Broker::Redis, Fault::Outage, FAULT;
    black_hole_nats: Broker::Nats, Fault::BlackHole, FAULT;
    black_hole_rabbitmq: Broker::RabbitMq, Fault::BlackHole, FAULT;
    black_hole_redis: Broker::Redis, Fault::BlackHole, FAULT;
    kill_nats: Broker::Nats, Fault::Kill, FAULT;
    kill_rabbitmq: Broker::RabbitMq, Fault::Kill, FAULT;
    kill_redis: Broker::Redis, Fault::Kill, FAULT;
}

/// Keys a, b, c with five events each; a's third event is larger than the (private) NATS
/// server's `max_payload` (64 KiB). One relay process, strict (`hold`) or `dead-letter`.
async fn poison<B: TestBackend>(db: Db<B>, dead_letter: bool) {
    // A server of our own with a small max_payload: taskq's own payload limit (1 MiB) is
    // NATS's default.
    const MAX: usize = 64 * 1024;
    let Some(nats) = PrivateNats::start_with_or_skip(Some(MAX as u32)) else {
        return;
    };
    let url = nats.url();
    let max = taskq_outbox::nats::async_nats::connect(url.as_str())
        .await
        .expect("connect to NATS")
        .server_info()
        .max_payload;
    assert_eq!(max, MAX);
    let dest = Destination::create(Broker::Nats, &url).await;
    let mut expect = Ledger::new();
    let mut poison_id = String::new();
    for n in 0..5 {
        for key in ["a", "b", "c"] {
            let poison = key == "a" && n == 2;
            let ev = Ev {
                topic: dest.topic.clone(),
                key: key.to_owned(),
                producer: 0,
                n,
                pad: if poison {
                    "x".repeat(max + 1)
                } else {
                    String::new()
                },
            };
            let mut tx = db.begin().await;
            let stored = ev.publish_tx(&mut tx).await.expect("publish_tx");
            tx.commit().await.expect("commit");
            if poison {
                poison_id = stored.message_id;
            } else if key != "a" || n < 2 || dead_letter {
                expect.committed(key, stored.seq, stored.message_id);
            }
        }
    }
    let mode = if dead_letter { "dead-letter" } else { "hold" };
    let mut relay = start_relay(
        &db.url(),
        Broker::Nats,
        &url,
        &dest.topic,
        "relay-poison",
        &["--on-rejected", mode],
    )
    .await;
    let want = expect.committed_count() as u64;
    wait_until(
        Duration::from_secs(30),
        "b, c (and a) delivered",
        || async { dest.count().await >= want },
    )
    .await;
    if dead_letter {
        wait_until(Duration::from_secs(10), "the poison event dead", || async {
            db.scalar(&format!(
                "SELECT COUNT(*) FROM {EVENTS_WITH_KEYS} WHERE e.message_id = '{poison_id}' AND {EVENT_STATE} = 'dead'"
            ))
            .await
                == 1
        })
        .await;
    } else {
        wait_until(Duration::from_secs(10), "key a held", || async {
            db.scalar("SELECT COUNT(*) FROM taskq_event_keys WHERE held_at IS NOT NULL")
                .await
                == 1
        })
        .await;
        // Held, not retried into the stream: still nothing of a after a while.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(
            db.text("SELECT event_key FROM taskq_event_keys WHERE held_at IS NOT NULL")
                .await
                .as_deref(),
            Some("a")
        );
        assert_eq!(
            db.scalar(&format!(
                "SELECT COUNT(*) FROM {EVENTS_WITH_KEYS} WHERE e.event_key = 'a' AND {EVENT_STATE} = 'pending'"
            ))
            .await,
            3,
            "a's rejected event and the two after it stay pending"
        );
    }
    if let Some(pid) = relay.id() {
        taskq_tests::bins::signal(pid, "TERM");
    }
    let _ = tokio::time::timeout(Duration::from_secs(10), relay.wait()).await;
    let received = dest.read_all().await;
    let verdict = expect.check(&received, key_of);
    dest.delete().await;
    let d = verdict.unwrap_or_else(|e| panic!("poison {mode}: {e}"));
    say(format!(
        "outbox_relay {}/poison {mode}: received {} ({} duplicates) of keys a, b, c",
        db.label(),
        d.received,
        d.duplicates
    ));
}

async fn poison_holds_only_its_key<B: TestBackend>(db: Db<B>) {
    poison(db, false).await;
}

async fn poison_is_dead_lettered_when_asked<B: TestBackend>(db: Db<B>) {
    poison(db, true).await;
}

taskq_tests::conformance!(
    poison_holds_only_its_key,
    poison_is_dead_lettered_when_asked
);
