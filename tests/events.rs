//! Events and the relay (`taskq::outbox`): events published in the caller's transaction reach
//! a sink in per-key commit order, with the message id of their row, also with several relays
//! racing; failures back off and retry with the same id; a rejected event holds only its own
//! key (strict) or is dead-lettered (opt-in); a relay that stops mid-batch loses its keys to
//! another after the lease. On both backends, with function sinks that record what they got.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use taskq::Backoff;
use taskq::outbox::{
    Event, FnSink, Message, OnRejected, Outcome, PerMessageSink, Published, Relay, Sink,
};
use taskq_driver::event::{EventSettle, EventState, KeyNext};
use taskq_tests::backends::{Db, TestBackend};
use taskq_tests::drivers::HasDriver;
use taskq_tests::{EVENT_STATE, EVENTS_WITH_KEYS, wait_until};

use taskq_driver::driver::Events as _;

#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, PartialEq)]
struct OrderEvent {
    order: String,
    n: u32,
}

impl Event for OrderEvent {
    fn topic(&self) -> &str {
        "orders.placed"
    }
    fn key(&self) -> String {
        self.order.clone()
    }
    fn headers(&self) -> Vec<(String, String)> {
        vec![("n".into(), self.n.to_string())]
    }
}

fn ev(order: &str, n: u32) -> OrderEvent {
    OrderEvent {
        order: order.into(),
        n,
    }
}

/// Publishes `events` in one committed transaction.
async fn publish<B: TestBackend>(db: &Db<B>, events: &[OrderEvent]) -> Vec<Published> {
    let mut tx = db.begin().await;
    let mut out = Vec::new();
    for e in events {
        out.push(e.publish_tx(&mut tx).await.unwrap());
    }
    tx.commit().await.unwrap();
    out
}

/// What a recording sink got, in the order it was handed.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<Message>>>);

impl Seen {
    fn push(&self, m: &Message) {
        self.0.lock().unwrap().push(m.clone());
    }
    fn all(&self) -> Vec<Message> {
        self.0.lock().unwrap().clone()
    }
    /// `n` of each message of `key`, in the order received.
    fn ns(&self, key: &str) -> Vec<u32> {
        self.all()
            .iter()
            .filter(|m| m.key == key)
            .map(|m| decode(m).n)
            .collect()
    }
}

fn decode(m: &Message) -> OrderEvent {
    serde_json::from_slice(&m.payload).expect("payload is the event's JSON")
}

/// A per-message sink of a closure.
type Recorder = PerMessageSink<Box<dyn Fn(Message) -> std::future::Ready<Outcome> + Send + Sync>>;

/// A sink that records every message and delivers it.
fn recording(seen: &Seen) -> Recorder {
    let seen = seen.clone();
    PerMessageSink::new(Box::new(move |m: Message| {
        seen.push(&m);
        std::future::ready(Outcome::Delivered)
    }))
}

async fn states<B: TestBackend>(db: &Db<B>, key: &str) -> Vec<String> {
    db.strings(&format!(
        "SELECT {EVENT_STATE} FROM {EVENTS_WITH_KEYS} WHERE e.event_key = '{key}' ORDER BY e.seq"
    ))
    .await
}

async fn count_state<B: TestBackend>(db: &Db<B>, state: &str) -> i64 {
    db.scalar(&format!(
        "SELECT COUNT(*) FROM {EVENTS_WITH_KEYS} WHERE {EVENT_STATE} = '{state}'"
    ))
    .await
}

async fn events_publish_rows_with_seq_in_commit_order_and_the_relay_sends_them_with_their_ids<
    B: HasDriver,
>(
    db: Db<B>,
) {
    let p = publish(&db, &[ev("o-1", 1), ev("o-2", 1), ev("o-1", 2)]).await;
    assert_eq!(p.iter().map(|p| p.seq).collect::<Vec<_>>(), [1, 1, 2]);
    assert!(p.iter().all(|p| p.message_id.len() == 32));
    let p2 = publish(&db, &[ev("o-1", 3)]).await;
    assert_eq!(p2[0].seq, 3);
    assert!(p2[0].id > p[2].id);
    assert_eq!(count_state(&db, "pending").await, 4);

    let seen = Seen::default();
    // A relay of other topics leaves them alone.
    let other = Relay::builder(db.pool.clone(), recording(&seen))
        .topics(["payments.captured"])
        .build()
        .unwrap();
    assert_eq!(other.run_once().await.unwrap().keys, 0);
    let relay = Relay::builder(db.pool.clone(), recording(&seen))
        .topics(["payments.captured", "orders.placed"])
        .build()
        .unwrap();
    let r = relay.run_once().await.unwrap();
    assert_eq!((r.keys, r.published, r.delivered, r.lost), (2, 4, 4, 0));
    assert_eq!(seen.ns("o-1"), [1, 2, 3]);
    assert_eq!(seen.ns("o-2"), [1]);
    let all = seen.all();
    let o1: Vec<&Message> = all.iter().filter(|m| m.key == "o-1").collect();
    assert_eq!(o1[0].id, p[0].message_id);
    assert_eq!(o1[2].id, p2[0].message_id);
    assert_eq!(o1[0].subject, "orders.placed");
    assert_eq!(o1[1].headers, [("n".to_owned(), "2".to_owned())]);
    assert_eq!(count_state(&db, "delivered").await, 4);
    // Nothing left: the next round leases nothing, and the keys are idle.
    assert_eq!(relay.run_once().await.unwrap().keys, 0);
    let store = B::store(db.pool.clone());
    let k = store
        .event_key_get("orders.placed", "o-1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (k.next_seq, k.done_seq, k.leased, k.failures),
        (3, 3, false, 0)
    );
    let listed = store
        .event_list("orders.placed", "o-1", 0, 10)
        .await
        .unwrap();
    assert_eq!(listed.iter().map(|e| e.seq).collect::<Vec<_>>(), [1, 2, 3]);
    assert!(
        listed
            .iter()
            .all(|e| e.state == EventState::Delivered && e.dead_at.is_none())
    );
    // A later event of a delivered key goes out alone, next.
    publish(&db, &[ev("o-1", 4)]).await;
    relay.run_once().await.unwrap();
    assert_eq!(seen.ns("o-1"), [1, 2, 3, 4]);
}

async fn a_rolled_back_transaction_publishes_nothing<B: HasDriver>(db: Db<B>) {
    let mut tx = db.begin().await;
    ev("o-1", 100).publish_tx(&mut tx).await.unwrap();
    ev("o-9", 100).publish_tx(&mut tx).await.unwrap();
    tx.rollback().await.unwrap();
    let p = publish(&db, &[ev("o-1", 1)]).await;
    assert_eq!(p[0].seq, 1, "the rolled-back seq was not taken");
    assert_eq!(db.scalar("SELECT COUNT(*) FROM taskq_events").await, 1);
    assert_eq!(
        db.scalar("SELECT COUNT(*) FROM taskq_event_keys WHERE event_key = 'o-9'")
            .await,
        0
    );
    let seen = Seen::default();
    let relay = Relay::builder(db.pool.clone(), recording(&seen))
        .build()
        .unwrap();
    relay.run_once().await.unwrap();
    assert_eq!(seen.all().len(), 1);
    assert_eq!(seen.ns("o-1"), [1]);
}

async fn publish_validation_errors_write_nothing<B: HasDriver>(db: Db<B>) {
    struct Bad(&'static str, String);
    impl serde::Serialize for Bad {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.serialize_unit()
        }
    }
    impl Event for Bad {
        fn topic(&self) -> &str {
            self.0
        }
        fn key(&self) -> String {
            self.1.clone()
        }
    }
    static LONG: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let long: &'static str = LONG.get_or_init(|| "t".repeat(256));
    let cases = [
        Bad("", "k".into()),
        Bad(long, "k".into()),
        Bad("orders\nplaced", "k".into()),
        Bad(" orders", "k".into()),
        Bad("orders", String::new()),
        Bad("orders", "k".repeat(256)),
    ];
    for bad in &cases {
        let mut tx = db.begin().await;
        let err = bad.publish_tx(&mut tx).await.unwrap_err();
        assert!(
            matches!(err, taskq::Error::InvalidName { .. }),
            "{:?}/{:?}: {err}",
            bad.0,
            bad.1
        );
        tx.commit().await.unwrap();
    }
    // 255 bytes each is fine.
    let mut tx = db.begin().await;
    let ok = Bad(&long[..255], "k".repeat(255));
    assert_eq!(ok.publish_tx(&mut tx).await.unwrap().seq, 1);
    tx.rollback().await.unwrap();
    assert_eq!(db.scalar("SELECT COUNT(*) FROM taskq_events").await, 0);
    assert_eq!(db.scalar("SELECT COUNT(*) FROM taskq_event_keys").await, 0);
}

async fn per_key_commit_order_holds_with_many_keys_and_three_relays_racing<B: HasDriver>(
    db: Db<B>,
) {
    const KEYS: usize = 24;
    const PER_KEY: u32 = 12;
    let seen = Seen::default();
    let (stop_tx, _) = tokio::sync::broadcast::channel::<()>(1);
    let mut relays = Vec::new();
    for i in 0..3 {
        let relay = Relay::builder(db.another_pool(3).await, SlowRecorder(seen.clone()))
            .batch_size(16)
            .poll_interval(Duration::from_millis(10))
            .name(format!("relay-{i}"))
            .build()
            .unwrap();
        let mut stop = stop_tx.subscribe();
        relays.push(tokio::spawn(async move {
            relay
                .run_until(async move {
                    let _ = stop.recv().await;
                })
                .await
        }));
    }
    // Four publishers, each owning a quarter of the keys, interleave transactions of one to
    // three events (of their keys, in each key's order) while the relays run; some
    // transactions roll back (their events must never appear).
    let mut publishers = Vec::new();
    for p in 0..4usize {
        // A long busy timeout: on SQLite the publishers queue for the write lock behind three
        // relays polling every 10 ms, which took over the tests' 1 s on a loaded machine (CI:
        // `begin immediate: database is locked`). The relays keep the short one: a refused
        // round gives its keys back and the relay goes on.
        let pool = db
            .another_pool_with_busy_timeout(2, Duration::from_secs(60))
            .await;
        publishers.push(tokio::spawn(async move {
            let keys: Vec<String> = (0..KEYS)
                .filter(|k| k % 4 == p)
                .map(|k| format!("k{k}"))
                .collect();
            let mut next: HashMap<String, u32> = keys.iter().map(|k| (k.clone(), 1)).collect();
            let mut rolled_back = 0;
            loop {
                let open: Vec<&String> = keys.iter().filter(|k| next[*k] <= PER_KEY).collect();
                if open.is_empty() {
                    break;
                }
                let mut tx = B::begin(&pool).await;
                let mut planned = Vec::new();
                for _ in 0..fastrand::usize(1..=3) {
                    let k = open[fastrand::usize(..open.len())].clone();
                    let n = next[&k] + planned.iter().filter(|(pk, _)| *pk == k).count() as u32;
                    if n > PER_KEY {
                        continue;
                    }
                    planned.push((k, n));
                }
                let roll_back = fastrand::u8(..10) == 0;
                for (k, n) in &planned {
                    let e = OrderEvent {
                        order: k.clone(),
                        n: if roll_back { 1000 + n } else { *n },
                    };
                    e.publish_tx(&mut tx).await.unwrap();
                }
                if roll_back {
                    tx.rollback().await.unwrap();
                    rolled_back += 1;
                } else {
                    tx.commit().await.unwrap();
                    for (k, _) in planned {
                        *next.get_mut(&k).unwrap() += 1;
                    }
                }
            }
            rolled_back
        }));
    }
    let mut rolled_back = 0;
    for p in publishers {
        rolled_back += p.await.unwrap();
    }
    let total = (KEYS as u32 * PER_KEY) as i64;
    wait_until(Duration::from_secs(60), "every event delivered", || async {
        count_state(&db, "delivered").await == total
    })
    .await;
    let _ = stop_tx.send(());
    for r in relays {
        r.await.unwrap().unwrap();
    }
    // Per key, after dropping duplicates of ids already received, the order is 1..=PER_KEY;
    // nothing of a rolled-back transaction; every id is its row's.
    let all = seen.all();
    let mut first: HashSet<String> = HashSet::new();
    let mut per_key: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    let mut duplicates = 0;
    for m in &all {
        let e = decode(m);
        assert!(
            e.n <= PER_KEY,
            "an event of a rolled-back transaction: {e:?}"
        );
        if first.insert(m.id.clone()) {
            per_key.entry(m.key.clone()).or_default().push(e.n);
        } else {
            duplicates += 1;
        }
    }
    assert_eq!(per_key.len(), KEYS);
    for (k, ns) in &per_key {
        assert_eq!(*ns, (1..=PER_KEY).collect::<Vec<_>>(), "key {k}");
    }
    let ids = db
        .strings("SELECT message_id FROM taskq_events ORDER BY message_id")
        .await;
    let mut got: Vec<String> = first.into_iter().collect();
    got.sort();
    assert_eq!(got, ids);
    assert_eq!(db.scalar("SELECT COUNT(*) FROM taskq_events").await, total);
    // Every key idle and released, done up to its last seq.
    assert_eq!(
        db.scalar(
            "SELECT COUNT(*) FROM taskq_event_keys WHERE done_seq = next_seq AND ready_at IS NULL \
             AND lease_owner IS NULL AND next_seq = 12"
        )
        .await,
        KEYS as i64
    );
    eprintln!(
        "{}: {} events over {KEYS} keys, {rolled_back} transactions rolled back, {duplicates} duplicates",
        db.label(),
        total
    );
}

async fn a_failed_event_is_retried_with_the_same_id_and_delivered_once_more<B: HasDriver>(
    db: Db<B>,
) {
    publish(
        &db,
        &[ev("a", 1), ev("a", 2), ev("a", 3), ev("b", 1), ev("b", 2)],
    )
    .await;
    let seen = Seen::default();
    let failed_once = Arc::new(Mutex::new(false));
    let sink = {
        let seen = seen.clone();
        let failed_once = failed_once.clone();
        PerMessageSink::new(move |m: Message| {
            seen.push(&m);
            let fail = m.key == "a"
                && decode(&m).n == 2
                && !std::mem::replace(&mut *failed_once.lock().unwrap(), true);
            std::future::ready(if fail {
                Outcome::Failed("connection reset".into())
            } else {
                Outcome::Delivered
            })
        })
    };
    let relay = Relay::builder(db.pool.clone(), sink)
        .retry_backoff(Backoff::constant(Duration::from_millis(300)))
        .build()
        .unwrap();
    let r = relay.run_once().await.unwrap();
    assert_eq!((r.keys, r.delivered), (2, 3), "a1, b1, b2");
    assert_eq!(
        seen.ns("a"),
        [1, 2],
        "a3 held behind the failure, never sent"
    );
    assert_eq!(seen.ns("b"), [1, 2]);
    assert_eq!(states(&db, "a").await, ["delivered", "pending", "pending"]);
    let store = B::store(db.pool.clone());
    let k = store
        .event_key_get("orders.placed", "a")
        .await
        .unwrap()
        .unwrap();
    assert_eq!((k.done_seq, k.failures), (1, 1));
    assert_eq!(k.last_error.as_deref(), Some("connection reset"));
    assert!(k.held_at.is_none());
    // Backing off: not ready yet.
    assert_eq!(relay.run_once().await.unwrap().keys, 0);
    tokio::time::sleep(Duration::from_millis(400)).await;
    let r = relay.run_once().await.unwrap();
    assert_eq!((r.keys, r.delivered), (1, 2));
    assert_eq!(seen.ns("a"), [1, 2, 2, 3]);
    let a: Vec<Message> = seen.all().into_iter().filter(|m| m.key == "a").collect();
    assert_eq!(a[1].id, a[2].id, "the retry carries the same message id");
    assert_eq!(states(&db, "a").await, ["delivered"; 3]);
    let k = store
        .event_key_get("orders.placed", "a")
        .await
        .unwrap()
        .unwrap();
    assert_eq!((k.done_seq, k.failures, k.last_error), (3, 0, None));
}

/// A sink that rejects the events whose `n` is in `poison` (of key "a") and delivers the rest.
fn rejecting(seen: &Seen) -> Recorder {
    let seen = seen.clone();
    PerMessageSink::new(Box::new(move |m: Message| {
        seen.push(&m);
        std::future::ready(if m.key == "a" && decode(&m).n == 2 {
            Outcome::Rejected("message too large".into())
        } else {
            Outcome::Delivered
        })
    }))
}

/// A sink that records every batch after a short random pause (so that relays overlap) and
/// delivers everything.
struct SlowRecorder(Seen);

impl Sink for SlowRecorder {
    async fn publish(&self, batch: &[Message]) -> Vec<Outcome> {
        tokio::time::sleep(Duration::from_millis(fastrand::u64(0..5))).await;
        for m in batch {
            self.0.push(m);
        }
        vec![Outcome::Delivered; batch.len()]
    }
}

async fn a_rejected_event_holds_only_its_key_until_an_operator_skips_or_replays_it<B: HasDriver>(
    db: Db<B>,
) {
    publish(
        &db,
        &[ev("a", 1), ev("a", 2), ev("a", 3), ev("b", 1), ev("b", 2)],
    )
    .await;
    let seen = Seen::default();
    let relay = Relay::builder(db.pool.clone(), rejecting(&seen))
        .build()
        .unwrap();
    relay.run_once().await.unwrap();
    assert_eq!(seen.ns("a"), [1, 2]);
    assert_eq!(seen.ns("b"), [1, 2]);
    assert_eq!(states(&db, "a").await, ["delivered", "pending", "pending"]);
    // Held: later events of the key wait, other keys go on.
    publish(&db, &[ev("a", 4), ev("b", 3)]).await;
    for _ in 0..3 {
        relay.run_once().await.unwrap();
    }
    assert_eq!(seen.ns("a"), [1, 2], "nothing more of the held key");
    assert_eq!(seen.ns("b"), [1, 2, 3]);
    let store = B::store(db.pool.clone());
    let held = store.event_keys_held(None, 10).await.unwrap();
    assert_eq!(held.len(), 1);
    assert_eq!((held[0].key.as_str(), held[0].seq), ("a", 2));
    assert_eq!(held[0].error, "message too large");
    let stats = store.event_topic_stats().await.unwrap();
    assert_eq!(stats.len(), 1);
    assert_eq!((stats[0].pending, stats[0].held_keys), (3, 1));
    assert!(stats[0].oldest_pending_at.is_some());

    // The operator skips it: a2 dead, the key goes on with a3, a4.
    let client = db.client();
    assert!(
        client
            .release_event_key("orders.placed", "a", true)
            .await
            .unwrap()
    );
    assert!(
        !client
            .release_event_key("orders.placed", "a", true)
            .await
            .unwrap(),
        "no longer held"
    );
    relay.run_once().await.unwrap();
    assert_eq!(seen.ns("a"), [1, 2, 3, 4]);
    assert_eq!(
        states(&db, "a").await,
        ["delivered", "dead", "delivered", "delivered"]
    );
    assert!(store.event_keys_held(None, 10).await.unwrap().is_empty());

    // Replay from seq 2: a2 (dead) is tried again and holds the key again; a3, a4 wait.
    assert_eq!(
        client
            .replay_event_key("orders.placed", "a", 2)
            .await
            .unwrap(),
        3
    );
    relay.run_once().await.unwrap();
    assert_eq!(seen.ns("a"), [1, 2, 3, 4, 2]);
    assert_eq!(
        store
            .event_keys_held(Some("orders.placed"), 10)
            .await
            .unwrap()
            .len(),
        1
    );
    // Released without skipping: tried again (still rejected, held again).
    assert!(
        client
            .release_event_key("orders.placed", "a", false)
            .await
            .unwrap()
    );
    relay.run_once().await.unwrap();
    assert_eq!(seen.ns("a"), [1, 2, 3, 4, 2, 2]);
    assert_eq!(store.event_keys_held(None, 10).await.unwrap().len(), 1);
    // Each operator action is in the audit trail.
    assert_eq!(
        db.strings("SELECT action FROM taskq_audit ORDER BY id")
            .await,
        ["event_skip", "event_replay", "event_retry"]
    );
    assert_eq!(client.event_keys_held(None, 10).await.unwrap().len(), 1);
    assert_eq!(client.event_topics().await.unwrap()[0].held_keys, 1);
}

async fn a_rejected_event_is_dead_lettered_in_the_opt_in_mode<B: HasDriver>(db: Db<B>) {
    publish(&db, &[ev("a", 1), ev("a", 2), ev("a", 3), ev("b", 1)]).await;
    let seen = Seen::default();
    let relay = Relay::builder(db.pool.clone(), rejecting(&seen))
        .on_rejected(OnRejected::DeadLetter)
        .build()
        .unwrap();
    relay.run_once().await.unwrap();
    // PerMessageSink holds a3 behind the rejection within the batch; the next round sends it.
    relay.run_once().await.unwrap();
    assert_eq!(seen.ns("a"), [1, 2, 3]);
    assert_eq!(seen.ns("b"), [1]);
    assert_eq!(states(&db, "a").await, ["delivered", "dead", "delivered"]);
    assert_eq!(
        db.text("SELECT last_error FROM taskq_events WHERE event_key = 'a' AND seq = 2")
            .await
            .as_deref(),
        Some("message too large")
    );
    let store = B::store(db.pool.clone());
    assert!(store.event_keys_held(None, 10).await.unwrap().is_empty());
}

async fn a_relay_stopped_mid_batch_loses_its_keys_to_another_after_the_lease<B: HasDriver>(
    db: Db<B>,
) {
    publish(&db, &[ev("a", 1), ev("a", 2), ev("b", 1)]).await;
    // Relay 1's sink never answers: it is stopped (aborted) while its batch is out.
    let handed = Arc::new(tokio::sync::Notify::new());
    let stuck = {
        let handed = handed.clone();
        FnSink::new(move |_batch: Vec<Message>| {
            handed.notify_one();
            std::future::pending::<Vec<Outcome>>()
        })
    };
    // A publish deadline far beyond the test: the sink's silence alone frees nothing.
    let relay1 = Relay::builder(db.pool.clone(), stuck)
        .lease(Duration::from_secs(1))
        .publish_timeout(Duration::from_secs(3600))
        .name("relay-1")
        .build()
        .unwrap();
    let task = tokio::spawn(async move { relay1.run().await });
    handed.notified().await;
    // While relay 1's leases last (renewed every third of the lease while its publish is
    // within its deadline), relay 2 gets nothing.
    let seen = Seen::default();
    let relay2 = Relay::builder(db.pool.clone(), recording(&seen))
        .lease(Duration::from_secs(1))
        .name("relay-2")
        .build()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        relay2.run_once().await.unwrap().keys,
        0,
        "relay 1 renews its leases while its publish is within its deadline"
    );
    task.abort();
    let _ = task.await;
    wait_until(
        Duration::from_secs(10),
        "relay 2 takes the keys over",
        || async {
            relay2.run_once().await.unwrap();
            seen.all().len() == 3
        },
    )
    .await;
    assert_eq!(seen.ns("a"), [1, 2]);
    assert_eq!(count_state(&db, "delivered").await, 3);
    let store = B::store(db.pool.clone());
    let k = store
        .event_key_get("orders.placed", "a")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(k.lease_epoch, 2, "leased by relay 1, then by relay 2");
    // Relay 1's settle under its old epoch would change nothing.
    let stale = EventSettle {
        key_hash: taskq_driver::event::key_hash("orders.placed", "a"),
        epoch: 1,
        done_seq: 2,
        dead: vec![],
        next: KeyNext::Hold {
            seq: 1,
            error: "stale".into(),
        },
    };
    assert_eq!(store.event_key_settle(&[stale]).await.unwrap(), [false]);
    assert!(store.event_keys_held(None, 10).await.unwrap().is_empty());
}

async fn retention_prunes_delivered_events_and_a_time_range_replays<B: HasDriver>(db: Db<B>) {
    publish(&db, &[ev("a", 1), ev("a", 2), ev("b", 1)]).await;
    let seen = Seen::default();
    let relay = Relay::builder(db.pool.clone(), recording(&seen))
        .build()
        .unwrap();
    relay.run_once().await.unwrap();
    assert_eq!(seen.all().len(), 3);
    // Replay everything published in the last minute: all three again, same ids, in order.
    let now = db.server_now().await;
    let client = db.client();
    let n = client
        .replay_events(
            "orders.placed",
            now - chrono::Duration::minutes(1),
            now + chrono::Duration::minutes(1),
        )
        .await
        .unwrap();
    assert_eq!(n, 3);
    assert_eq!(count_state(&db, "pending").await, 3);
    relay.run_once().await.unwrap();
    assert_eq!(seen.ns("a"), [1, 2, 1, 2]);
    assert_eq!(seen.ns("b"), [1, 1]);
    // Prune: nothing is older than an hour; everything delivered is older than 0 s, but not
    // a pending event.
    assert_eq!(
        client
            .prune_events(Duration::from_secs(3600))
            .await
            .unwrap(),
        0
    );
    publish(&db, &[ev("b", 2)]).await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert_eq!(client.prune_events(Duration::ZERO).await.unwrap(), 3);
    assert_eq!(states(&db, "b").await, ["pending"]);
    relay.run_once().await.unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert_eq!(client.prune_events(Duration::ZERO).await.unwrap(), 1);
    assert_eq!(db.scalar("SELECT COUNT(*) FROM taskq_events").await, 0);
    // The keys keep their numbers: the next event of a is seq 3.
    assert_eq!(publish(&db, &[ev("a", 3)]).await[0].seq, 3);
}

async fn a_relay_wakes_on_publish_without_waiting_for_the_poll<B: HasDriver>(db: Db<B>) {
    let seen = Seen::default();
    let relay = Relay::builder(db.pool.clone(), recording(&seen))
        .poll_interval(Duration::from_secs(30))
        .build()
        .unwrap();
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        relay
            .run_until(async move {
                let _ = rx.await;
            })
            .await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = std::time::Instant::now();
    publish(&db, &[ev("a", 1)]).await;
    wait_until(Duration::from_secs(5), "the event delivered", || async {
        seen.all().len() == 1
    })
    .await;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "woken by the publish, not the 30 s poll: {:?}",
        started.elapsed()
    );
    let _ = stop.send(());
    task.await.unwrap().unwrap();
}

async fn relay_settings_out_of_range_are_refused<B: HasDriver>(db: Db<B>) {
    let seen = Seen::default();
    let cases: Vec<(&str, taskq::Result<Relay<Recorder>>)> = vec![
        (
            "batch 0",
            Relay::builder(db.pool.clone(), recording(&seen))
                .batch_size(0)
                .build(),
        ),
        (
            "lease",
            Relay::builder(db.pool.clone(), recording(&seen))
                .lease(Duration::from_millis(999))
                .build(),
        ),
        (
            "poll",
            Relay::builder(db.pool.clone(), recording(&seen))
                .poll_interval(Duration::ZERO)
                .build(),
        ),
        (
            "no topics",
            Relay::builder(db.pool.clone(), recording(&seen))
                .topics(Vec::<String>::new())
                .build(),
        ),
        (
            "bad topic",
            Relay::builder(db.pool.clone(), recording(&seen))
                .topics([""])
                .build(),
        ),
        (
            "publish timeout",
            Relay::builder(db.pool.clone(), recording(&seen))
                .publish_timeout(Duration::ZERO)
                .build(),
        ),
        (
            "jitter",
            Relay::builder(db.pool.clone(), recording(&seen))
                .retry_backoff(Backoff {
                    jitter: 2.0,
                    ..Backoff::DEFAULT
                })
                .build(),
        ),
    ];
    for (what, r) in cases {
        assert!(r.is_err(), "{what}");
    }
}

/// A sink that reports an event of a key delivered after an earlier one of the same key was
/// not (a broker that stored that key out of order): the relay sends that key one event per
/// round from then on (so at most one of its events is ever in flight), delivers it in
/// order, and still sends other keys' events together.
async fn a_sink_that_breaks_a_keys_order_makes_the_relay_send_that_key_one_event_per_round<
    B: HasDriver,
>(
    db: Db<B>,
) {
    publish(
        &db,
        &[
            ev("a", 1),
            ev("a", 2),
            ev("a", 3),
            ev("a", 4),
            ev("b", 1),
            ev("b", 2),
        ],
    )
    .await;
    let batches: Arc<Mutex<Vec<Vec<Message>>>> = Arc::default();
    let sink = {
        let batches = batches.clone();
        FnSink::new(move |batch: Vec<Message>| {
            let first = {
                let mut b = batches.lock().unwrap();
                b.push(batch.clone());
                b.len() == 1
            };
            async move {
                batch
                    .iter()
                    .map(|m| {
                        if first && m.key == "a" && decode(m).n == 1 {
                            Outcome::Failed("ack timeout".into())
                        } else {
                            // Misbehaving: a's later events "delivered" after a1 was not.
                            Outcome::Delivered
                        }
                    })
                    .collect()
            }
        })
    };
    let relay = Relay::builder(db.pool.clone(), sink)
        .retry_backoff(Backoff::constant(Duration::from_millis(20)))
        .build()
        .unwrap();
    let r = relay.run_once().await.unwrap();
    assert_eq!((r.keys, r.published, r.delivered), (2, 6, 2), "b1, b2 only");
    assert_eq!(
        states(&db, "a").await,
        ["pending"; 4],
        "nothing of a marked"
    );
    wait_until(Duration::from_secs(10), "a delivered", || async {
        relay.run_once().await.unwrap();
        states(&db, "a").await == ["delivered"; 4]
    })
    .await;
    let batches = batches.lock().unwrap().clone();
    let later: Vec<Vec<u32>> = batches[1..]
        .iter()
        .map(|b| {
            b.iter()
                .filter(|m| m.key == "a")
                .map(|m| decode(m).n)
                .collect()
        })
        .filter(|a: &Vec<u32>| !a.is_empty())
        .collect();
    assert_eq!(
        later,
        [[1], [2], [3], [4]],
        "one event of a per round, in order"
    );
    // Other keys are not narrowed: three events of c go out in one round.
    publish(
        &db,
        &[ev("c", 1), ev("c", 2), ev("c", 3), ev("a", 5), ev("a", 6)],
    )
    .await;
    let r = relay.run_once().await.unwrap();
    assert_eq!(
        (r.keys, r.published, r.delivered),
        (2, 4, 4),
        "c1..c3 and a5"
    );
    assert_eq!(states(&db, "c").await, ["delivered"; 3]);
}

/// A running relay reads on a key with a long backlog in the round after the one it is
/// publishing (the key keeps its lease: one lease for the whole backlog), and publishes that
/// round only once the key's events of the first were all delivered. A failure stops the key
/// before anything after it goes out: of what the sink answered `Delivered`, each key's
/// events are exactly 1..=N in order, once each, and the failed event went out again with
/// its id. Another key with one event is not kept waiting behind the long one.
async fn a_running_relay_reads_on_a_long_key_and_stops_it_at_a_failure<B: HasDriver>(db: Db<B>) {
    const LONG: u32 = 400;
    let mut tx = db.begin().await;
    for n in 1..=LONG {
        ev("long", n).publish_tx(&mut tx).await.unwrap();
    }
    tx.commit().await.unwrap();
    publish(&db, &[ev("short", 1)]).await;
    // Fails event 150 of the long key once (its round's later events are then `Held`).
    let delivered = Seen::default();
    let failed_once = Arc::new(AtomicBool::new(false));
    let sink = {
        let delivered = delivered.clone();
        let failed_once = failed_once.clone();
        FnSink::new(move |batch: Vec<Message>| {
            let delivered = delivered.clone();
            let failed_once = failed_once.clone();
            async move {
                let mut stopped: HashSet<String> = HashSet::new();
                batch
                    .iter()
                    .map(|m| {
                        if stopped.contains(&m.key) {
                            return Outcome::Held;
                        }
                        if m.key == "long"
                            && decode(m).n == 150
                            && !failed_once.swap(true, Ordering::SeqCst)
                        {
                            stopped.insert(m.key.clone());
                            return Outcome::Failed("broker away".into());
                        }
                        delivered.push(m);
                        Outcome::Delivered
                    })
                    .collect()
            }
        })
    };
    let relay = Relay::builder(db.pool.clone(), sink)
        .batch_size(50)
        .retry_backoff(Backoff::constant(Duration::from_millis(50)))
        .poll_interval(Duration::from_millis(20))
        .build()
        .unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(async move {
        relay
            .run_until(async move {
                let _ = stopped.await;
            })
            .await
    });
    wait_until(Duration::from_secs(60), "every event delivered", || async {
        delivered.all().len() == LONG as usize + 1
    })
    .await;
    stop.send(()).unwrap();
    running.await.unwrap().unwrap();
    assert_eq!(delivered.ns("long"), (1..=LONG).collect::<Vec<_>>());
    assert_eq!(delivered.ns("short"), [1]);
    assert!(failed_once.load(Ordering::SeqCst));
    let store = B::store(db.pool.clone());
    let key = store
        .event_key_get("orders.placed", "long")
        .await
        .unwrap()
        .unwrap();
    assert_eq!((key.done_seq, key.leased, key.failures), (400, false, 0));
    // 400 events in rounds of at most 50: eight rounds or more, on few leases (one before
    // the failure, one after its backoff, give or take a round that found the key released
    // between two others).
    assert!(
        key.lease_epoch <= 4,
        "the key was read on under its lease, not leased again each round: epoch {}",
        key.lease_epoch
    );
    assert_eq!(count_state(&db, "delivered").await, i64::from(LONG) + 1);
}

/// A relay reading on a long key stops at once when it loses the key's lease (here an
/// operator replays the key mid-stream: epoch + 1): it sends at most the round out and the
/// round already read ahead under the old lease, not the rest of the backlog it had leased;
/// the key then goes out again from seq 1 under a new lease and ends delivered.
async fn a_relay_reading_on_a_key_stops_when_it_loses_the_lease<B: HasDriver>(db: Db<B>) {
    const LONG: u32 = 600;
    const BATCH: usize = 40;
    let mut tx = db.begin().await;
    for n in 1..=LONG {
        ev("long", n).publish_tx(&mut tx).await.unwrap();
    }
    tx.commit().await.unwrap();
    let seen = Seen::default();
    let sink = {
        let seen = seen.clone();
        FnSink::new(move |batch: Vec<Message>| {
            let seen = seen.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(15)).await;
                for m in &batch {
                    seen.push(m);
                }
                vec![Outcome::Delivered; batch.len()]
            }
        })
    };
    let relay = Relay::builder(db.pool.clone(), sink)
        .batch_size(BATCH as u32)
        .poll_interval(Duration::from_millis(20))
        .build()
        .unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let counted = relay.clone();
    let running = tokio::spawn(async move {
        relay
            .run_until(async move {
                let _ = stopped.await;
            })
            .await
    });
    wait_until(Duration::from_secs(30), "a few rounds out", || async {
        seen.all().len() >= 3 * BATCH
    })
    .await;
    let replayed = db
        .client()
        .replay_event_key("orders.placed", "long", 1)
        .await
        .unwrap();
    let before = seen.all().len();
    assert!(before < LONG as usize, "the replay came mid-stream");
    // The events recorded delivered when it rewound (the settles trail the sink by a round).
    assert!(
        replayed > 0 && replayed <= before as u64,
        "{replayed} of {before}"
    );
    wait_until(
        Duration::from_secs(60),
        "the key delivered again",
        || async {
            let k = db
                .client()
                .event_key("orders.placed", "long")
                .await
                .unwrap()
                .unwrap();
            k.done_seq == u64::from(LONG) && !k.leased
        },
    )
    .await;
    stop.send(()).unwrap();
    running.await.unwrap().unwrap();
    // The relay counted the lease the replay ended (found by a settle, or by the next round
    // that would have carried the key on).
    let stats = counted.stats();
    assert!(stats.leases_lost >= 1, "{stats:?}");
    assert!(stats.delivered >= u64::from(LONG), "{stats:?}");
    // After the replay: the old lease's last rounds (at most the one out and the one read
    // ahead), then seq 1..=600 again under the new lease.
    let ns = seen.ns("long");
    let after = &ns[before..];
    let restart = after
        .iter()
        .position(|&n| n == 1)
        .expect("the key went out again from seq 1");
    assert!(
        restart <= 2 * BATCH,
        "{restart} events of the old lease after the replay (rounds of {BATCH}): {after:?}"
    );
    assert_eq!(after[restart..], (1..=LONG).collect::<Vec<_>>()[..]);
}

/// A settle that fails on a database error (here: the events table is gone while the batch
/// is out, and the round dead-lettered an event, so the settle writes to it) gives the
/// round's keys back at once instead of leaving them leased until the lease ends; once the
/// database is back, the events go out again and are settled.
async fn a_settle_that_fails_gives_the_keys_back_at_once<B: HasDriver>(db: Db<B>) {
    publish(&db, &[ev("a", 1), ev("a", 2), ev("b", 1)]).await;
    let seen = Seen::default();
    let broken = Arc::new(Mutex::new(false));
    let sink = {
        let pool = db.pool.clone();
        let seen = seen.clone();
        let broken = broken.clone();
        FnSink::new(move |batch: Vec<Message>| {
            let pool = pool.clone();
            let seen = seen.clone();
            let break_now = !std::mem::replace(&mut *broken.lock().unwrap(), true);
            async move {
                for m in &batch {
                    seen.push(m);
                }
                if break_now {
                    B::exec(
                        &pool,
                        "ALTER TABLE taskq_events RENAME TO taskq_events_moved",
                    )
                    .await;
                }
                // The first round rejects b1 (dead-lettered: the settle marks it dead).
                batch
                    .iter()
                    .map(|m| match (break_now, m.key.as_str()) {
                        (true, "b") => Outcome::Rejected("refused".into()),
                        _ => Outcome::Delivered,
                    })
                    .collect()
            }
        })
    };
    let relay = Relay::builder(db.pool.clone(), sink)
        .lease(Duration::from_secs(3600))
        .on_rejected(OnRejected::DeadLetter)
        .build()
        .unwrap();
    let err = relay.run_once().await.expect_err("the settle fails");
    assert!(matches!(err, taskq::Error::Database(_)), "{err}");
    let store = B::store(db.pool.clone());
    for k in ["a", "b"] {
        let key = store
            .event_key_get("orders.placed", k)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (
                key.leased,
                key.lease_owner.as_deref(),
                key.done_seq,
                key.failures
            ),
            (false, None, 0, 0),
            "{k} given back at once (the lease was an hour)"
        );
    }
    db.exec("ALTER TABLE taskq_events_moved RENAME TO taskq_events")
        .await;
    assert_eq!(
        states(&db, "a").await,
        ["pending"; 2],
        "the failed settle changed nothing"
    );
    assert_eq!(states(&db, "b").await, ["pending"]);
    let r = relay.run_once().await.unwrap();
    assert_eq!((r.keys, r.delivered), (2, 3), "ready again at once");
    assert_eq!(states(&db, "a").await, ["delivered"; 2]);
    assert_eq!(states(&db, "b").await, ["delivered"]);
    assert_eq!(seen.ns("a"), [1, 2, 1, 2], "sent again, in order");
}

/// An event of a topic of its own (the relay's key is the pair topic, key).
#[derive(serde::Serialize)]
struct TopicEvent {
    topic: &'static str,
    key: &'static str,
}

impl Event for TopicEvent {
    fn topic(&self) -> &str {
        self.topic
    }
    fn key(&self) -> String {
        self.key.into()
    }
}

/// A key is (topic, key): a sink failing every message of topic `a` holds `a`/"42" only, and
/// `b`/"42" after it in the same round is delivered (no backoff, no failure counted).
async fn a_failure_holds_a_key_of_one_topic_only<B: HasDriver>(db: Db<B>) {
    let mut tx = db.begin().await;
    for topic in ["a", "b"] {
        TopicEvent { topic, key: "42" }
            .publish_tx(&mut tx)
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
    let sink = PerMessageSink::new(|m: Message| async move {
        if m.subject == "a" {
            Outcome::Failed("no stream for a".into())
        } else {
            Outcome::Delivered
        }
    });
    let relay = Relay::builder(db.pool.clone(), sink).build().unwrap();
    let r = relay.run_once().await.unwrap();
    assert_eq!((r.keys, r.published), (2, 2));
    let store = B::store(db.pool.clone());
    let a = store.event_key_get("a", "42").await.unwrap().unwrap();
    let b = store.event_key_get("b", "42").await.unwrap().unwrap();
    assert_eq!(
        (a.done_seq, a.failures),
        (0, 1),
        "a/42 failed and backs off"
    );
    assert_eq!(
        (b.done_seq, b.failures, b.last_error),
        (1, 0, None),
        "b/42 delivered"
    );
    assert_eq!(r.delivered, 1);
}

/// `Relay::stats` counts what the relay did: rounds, events published and delivered, keys
/// backed off, events dead-lettered, keys held; its clones share the counts, and another relay
/// has its own.
async fn a_relay_counts_what_it_did<B: HasDriver>(db: Db<B>) {
    publish(
        &db,
        &[
            ev("a", 1),
            ev("a", 2),
            ev("a", 3),
            ev("b", 1),
            ev("c", 1),
            ev("c", 2),
        ],
    )
    .await;
    let sink = || {
        PerMessageSink::new(|m: Message| async move {
            match m.key.as_str() {
                "b" => Outcome::Failed("broker away".into()),
                "c" | "d" => Outcome::Rejected("refused".into()),
                _ => Outcome::Delivered,
            }
        })
    };
    let relay = Relay::builder(db.pool.clone(), sink())
        .on_rejected(OnRejected::DeadLetter)
        .build()
        .unwrap();
    assert_eq!(relay.stats(), taskq::outbox::RelayStats::default());
    let r = relay.run_once().await.unwrap();
    assert_eq!((r.keys, r.published, r.delivered), (3, 6, 3));
    let s = relay.clone().stats();
    assert_eq!(
        (s.rounds, s.published, s.delivered, s.failed, s.dead, s.held),
        (1, 6, 3, 1, 1, 0),
        "{s:?}"
    );
    assert_eq!((s.leases_lost, s.errors), (0, 0), "{s:?}");
    // c's second event was held behind its first (the sink stops a key at a rejection): the
    // key goes on with it next round.
    assert_eq!(count_state(&db, "dead").await, 1);

    // A strict relay: c's second event and d's first are rejected and hold their keys.
    publish(&db, &[ev("d", 1)]).await;
    let strict = Relay::builder(db.pool.clone(), sink()).build().unwrap();
    strict.run_once().await.unwrap();
    let s = strict.stats();
    assert_eq!(
        (s.rounds, s.published, s.delivered, s.failed, s.dead, s.held),
        (1, 2, 0, 0, 0, 2),
        "{s:?}"
    );
    assert_eq!(
        relay.stats().rounds,
        1,
        "the first relay's counts are its own"
    );
}

/// A sink that never answers does not wedge its keys: the relay gives its publish up at its
/// deadline (by default below the lease), counts the batch `Failed`, stops renewing and backs
/// the keys off; another relay then delivers them, while the first is still running. Without
/// the deadline relay 1 renews its lease for ever and relay 2 delivers nothing. (No bound on
/// how soon: on a loaded machine SQLite's busy waits stretch it; 20 s is far past the 0.67 s
/// deadline plus the 50 ms backoff, and far short of "never".)
async fn a_sink_that_never_answers_does_not_wedge_its_keys<B: HasDriver>(db: Db<B>) {
    publish(&db, &[ev("a", 1), ev("a", 2), ev("b", 1)]).await;
    let handed = Arc::new(tokio::sync::Notify::new());
    let stuck = {
        let handed = handed.clone();
        FnSink::new(move |_batch: Vec<Message>| {
            handed.notify_one();
            std::future::pending::<Vec<Outcome>>()
        })
    };
    let relay1 = Relay::builder(db.pool.clone(), stuck)
        .lease(Duration::from_secs(1))
        .retry_backoff(Backoff::constant(Duration::from_millis(50)))
        .name("relay-1")
        .build()
        .unwrap();
    let task = tokio::spawn(async move { relay1.run().await });
    handed.notified().await;
    let start = std::time::Instant::now();
    let seen = Seen::default();
    let relay2 = Relay::builder(db.pool.clone(), recording(&seen))
        .lease(Duration::from_secs(1))
        .name("relay-2")
        .build()
        .unwrap();
    while seen.all().len() < 3 && start.elapsed() < Duration::from_secs(20) {
        relay2.run_once().await.unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!task.is_finished(), "relay 1 still runs");
    task.abort();
    let _ = task.await;
    assert_eq!(seen.ns("a"), [1, 2]);
    assert_eq!(seen.ns("b"), [1]);
    assert_eq!(count_state(&db, "delivered").await, 3);
}

/// A round whose key is carried on (settled `Keep`) and that dead-lettered an event keeps
/// that dead mark when its settle fails: the mark goes with the next settle of the same lease.
/// A trigger fails the first settle: it refuses a dead mark while the key's `done_seq` (set
/// by the same settle, before the mark) is below 8. Round 1 is seqs 1-4 (seq 3 rejected,
/// dead-lettered; the rest delivered), round 2 seqs 5-8, read on under the same lease. Without
/// the carried mark, round 2's settle moves `done_seq` to 8 and event 3, never delivered,
/// reads `delivered`.
async fn a_failed_keep_settle_keeps_its_dead_letters<B: HasDriver>(db: Db<B>) {
    let mut tx = db.begin().await;
    for n in 1..=8 {
        ev("k", n).publish_tx(&mut tx).await.unwrap();
    }
    tx.commit().await.unwrap();
    if db.label() == "mysql" {
        db.exec(
            "CREATE TRIGGER taskq_t_fail_dead BEFORE UPDATE ON taskq_events FOR EACH ROW \
             BEGIN IF NEW.dead_at IS NOT NULL AND OLD.dead_at IS NULL AND \
               (SELECT done_seq FROM taskq_event_keys WHERE key_hash = NEW.key_hash) < 8 \
             THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'injected settle failure'; \
             END IF; END",
        )
        .await;
    } else {
        db.exec(
            "CREATE TRIGGER taskq_t_fail_dead BEFORE UPDATE OF dead_at ON taskq_events \
             WHEN NEW.dead_at IS NOT NULL AND OLD.dead_at IS NULL AND \
               (SELECT done_seq FROM taskq_event_keys WHERE key_hash = NEW.key_hash) < 8 \
             BEGIN SELECT RAISE(ABORT, 'injected settle failure'); END",
        )
        .await;
    }
    // A pipelining sink: seq 3 rejected, every other event delivered (nothing held).
    let seen = Seen::default();
    let sink = {
        let seen = seen.clone();
        FnSink::new(move |batch: Vec<Message>| {
            let seen = seen.clone();
            async move {
                batch
                    .iter()
                    .map(|m| {
                        seen.push(m);
                        if decode(m).n == 3 {
                            Outcome::Rejected("refused".into())
                        } else {
                            Outcome::Delivered
                        }
                    })
                    .collect()
            }
        })
    };
    let relay = Relay::builder(db.pool.clone(), sink)
        .batch_size(4)
        .on_rejected(OnRejected::DeadLetter)
        .poll_interval(Duration::from_millis(20))
        .build()
        .unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(async move {
        relay
            .run_until(async move {
                let _ = stopped.await;
            })
            .await
    });
    let store = B::store(db.pool.clone());
    wait_until(Duration::from_secs(20), "the key settled to 8", || async {
        let k = store
            .event_key_get("orders.placed", "k")
            .await
            .unwrap()
            .unwrap();
        k.done_seq == 8 && !k.leased
    })
    .await;
    stop.send(()).unwrap();
    running.await.unwrap().unwrap();
    assert_eq!(seen.ns("k"), (1..=8).collect::<Vec<_>>(), "each sent once");
    assert_eq!(
        states(&db, "k").await,
        [
            "delivered",
            "delivered",
            "dead",
            "delivered",
            "delivered",
            "delivered",
            "delivered",
            "delivered"
        ]
    );
    assert_eq!(
        db.text("SELECT last_error FROM taskq_events WHERE event_key = 'k' AND seq = 3")
            .await
            .as_deref(),
        Some("refused")
    );
}

/// A relay holds leases only on keys it reads events of: with rounds of 2 events, three
/// keys with long backlogs (A, B, C) and new keys arriving all the time, every key it leases
/// gets events in its rounds — C is not leased, renewed and carried on with nothing read
/// while the others go — and it never holds more keys than its two rounds in flight can read
/// (2 × 2), so other relays can take the rest.
async fn a_relay_holds_no_more_keys_than_it_reads<B: HasDriver>(db: Db<B>) {
    let mut tx = db.begin().await;
    for k in ["A", "B", "C"] {
        for n in 1..=300 {
            ev(k, n).publish_tx(&mut tx).await.unwrap();
        }
    }
    tx.commit().await.unwrap();
    let sink = FnSink::new(|batch: Vec<Message>| async move {
        tokio::time::sleep(Duration::from_millis(5)).await;
        vec![Outcome::Delivered; batch.len()]
    });
    let relay = Relay::builder(db.pool.clone(), sink)
        .batch_size(2)
        .poll_interval(Duration::from_millis(5))
        .name("hoarder")
        .build()
        .unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(async move {
        relay
            .run_until(async move {
                let _ = stopped.await;
            })
            .await
    });
    let mut most = 0;
    for i in 0..60 {
        publish(&db, &[ev(&format!("new{i}"), 1)]).await;
        tokio::time::sleep(Duration::from_millis(25)).await;
        let leased = db
            .scalar(&format!(
                "SELECT COUNT(*) FROM taskq_event_keys \
                 WHERE lease_owner = 'hoarder' AND lease_until > {}",
                db.now()
            ))
            .await;
        most = most.max(leased);
    }
    stop.send(()).unwrap();
    running.await.unwrap().unwrap();
    let done: Vec<i64> = db
        .ints("SELECT done_seq FROM taskq_event_keys WHERE event_key IN ('A', 'B', 'C') ORDER BY event_key")
        .await;
    assert!(
        done.iter().all(|&d| d > 0),
        "every long key went on while new keys arrived (done_seq of A, B, C): {done:?}"
    );
    assert!(
        most <= 4,
        "the relay held {most} keys at once with rounds of 2 events"
    );
}

taskq_tests::conformance!(
    a_relay_holds_no_more_keys_than_it_reads,
    a_failed_keep_settle_keeps_its_dead_letters,
    a_sink_that_never_answers_does_not_wedge_its_keys,
    a_relay_counts_what_it_did,
    a_failure_holds_a_key_of_one_topic_only,
    relay_settings_out_of_range_are_refused,
    events_publish_rows_with_seq_in_commit_order_and_the_relay_sends_them_with_their_ids,
    a_rolled_back_transaction_publishes_nothing,
    publish_validation_errors_write_nothing,
    per_key_commit_order_holds_with_many_keys_and_three_relays_racing,
    a_failed_event_is_retried_with_the_same_id_and_delivered_once_more,
    a_rejected_event_holds_only_its_key_until_an_operator_skips_or_replays_it,
    a_rejected_event_is_dead_lettered_in_the_opt_in_mode,
    a_relay_stopped_mid_batch_loses_its_keys_to_another_after_the_lease,
    retention_prunes_delivered_events_and_a_time_range_replays,
    a_relay_wakes_on_publish_without_waiting_for_the_poll,
    a_sink_that_breaks_a_keys_order_makes_the_relay_send_that_key_one_event_per_round,
    a_settle_that_fails_gives_the_keys_back_at_once,
    a_running_relay_reads_on_a_long_key_and_stops_it_at_a_failure,
    a_relay_reading_on_a_key_stops_when_it_loses_the_lease,
);

/// MySQL only: row locks. A publisher's open transaction holding one key row must not stop
/// a relay from renewing its other keys (InnoDB makes an `UPDATE` of a locked row wait; SQLite
/// has no row locks, its writers take turns on the file).
mod mysql_only {
    use super::*;
    use taskq_tests::TestDb;

    /// Relay 1 (lease 2 s, publish deadline 10 s) leases 20 keys and its sink takes 3 s. Meanwhile a publisher's
    /// transaction holds 5 of the key rows for 3.2 s (then rolls back). Relay 1's renewals
    /// must renew the 15 others: between its lease's first end (2 s) and the publisher's end,
    /// relay 2 leases nothing, and relay 1's settle finds every key still its own (epoch 1).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_publisher_holding_one_key_row_does_not_stop_the_renewal_of_the_others() {
        let Some(db) = TestDb::new_or_skip().await else {
            return;
        };
        let db = Db::<sqlx::MySql>::from_test_db(db);
        let keys: Vec<String> = (0..20).map(|i| format!("k{i:02}")).collect();
        let mut tx = db.begin().await;
        for k in &keys {
            ev(k, 1).publish_tx(&mut tx).await.unwrap();
        }
        tx.commit().await.unwrap();
        let handed = Arc::new(tokio::sync::Notify::new());
        let slow = {
            let handed = handed.clone();
            FnSink::new(move |batch: Vec<Message>| {
                handed.notify_one();
                async move {
                    tokio::time::sleep(Duration::from_secs(3)).await;
                    vec![Outcome::Delivered; batch.len()]
                }
            })
        };
        let relay1 = Relay::builder(db.pool.clone(), slow)
            .lease(Duration::from_secs(2))
            .publish_timeout(Duration::from_secs(10))
            .name("relay-1")
            .build()
            .unwrap();
        let start = std::time::Instant::now();
        let round = tokio::spawn(async move { relay1.run_once().await });
        handed.notified().await;
        // The publisher locks 5 key rows (it publishes on them) and holds them.
        let mut publisher = db.begin().await;
        for k in &keys[..5] {
            ev(k, 2).publish_tx(&mut publisher).await.unwrap();
        }
        let relay2 = Relay::builder(db.pool.clone(), recording(&Seen::default()))
            .lease(Duration::from_secs(2))
            .name("relay-2")
            .build()
            .unwrap();
        tokio::time::sleep(Duration::from_millis(2200).saturating_sub(start.elapsed())).await;
        let mut taken = 0;
        while start.elapsed() < Duration::from_millis(2900) {
            taken += relay2.run_once().await.unwrap().keys;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(Duration::from_millis(3200).saturating_sub(start.elapsed())).await;
        publisher.rollback().await.unwrap();
        let r = round.await.unwrap().unwrap();
        assert_eq!(taken, 0, "relay 2 leased keys relay 1 should have renewed");
        assert_eq!((r.keys, r.delivered, r.lost), (20, 20, 0));
        let epochs = db
            .ints("SELECT lease_epoch FROM taskq_event_keys ORDER BY event_key")
            .await;
        assert_eq!(epochs, vec![1; 20], "only relay 1 ever leased them");
    }

    /// A relay's database calls have a client-side deadline: a connection black-holed by a
    /// network partition (no answer, no error, no EOF) ends its call at the deadline instead
    /// of hanging the relay, and the keys are given back on a fresh connection. MySQL only:
    /// the partition is a TCP proxy in front of the server (SQLite has no network).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_black_holed_connection_does_not_hang_the_relay() {
        use sqlx::mysql::MySqlPoolOptions;
        use std::str::FromStr;
        use taskq_tests::proxy::ChaosProxy;
        let Some(db) = TestDb::new_or_skip().await else {
            return;
        };
        let server = sqlx::mysql::MySqlConnectOptions::from_str(&taskq_tests::server_url())
            .expect("the test server URL parses");
        let upstream = tokio::net::lookup_host((server.get_host(), server.get_port()))
            .await
            .unwrap()
            .next()
            .unwrap();
        let proxy = Arc::new(ChaosProxy::start(upstream).await);
        let options = db
            .options
            .clone()
            .host(&proxy.addr().ip().to_string())
            .port(proxy.addr().port());
        let db = Db::<sqlx::MySql>::from_test_db(db);
        publish(&db, &[ev("a", 1), ev("b", 1)]).await;
        let pool = MySqlPoolOptions::new()
            .max_connections(2)
            .connect_with(options)
            .await
            .unwrap();
        // The sink black-holes every live connection of the relay and every new one for
        // 1.5 s, then answers: the settle that follows runs on a connection that never
        // answers; the give-back after its deadline on a new one, after the heal.
        let sink = {
            let proxy = proxy.clone();
            FnSink::new(move |batch: Vec<Message>| {
                proxy.set_black_hole(true);
                proxy.black_hole_all();
                let proxy = proxy.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(1500)).await;
                    proxy.heal();
                });
                async move { vec![Outcome::Delivered; batch.len()] }
            })
        };
        let relay = Relay::builder(pool, sink)
            .lease(Duration::from_secs(2))
            .build()
            .unwrap();
        let start = std::time::Instant::now();
        let r = tokio::time::timeout(Duration::from_secs(10), relay.run_once()).await;
        let took = start.elapsed();
        let r = r.expect("the relay's round returned (it hung on the black-holed connection)");
        assert!(r.is_err(), "the settle could not have succeeded: {r:?}");
        assert!(
            took < Duration::from_secs(4),
            "within the deadline: {took:?}"
        );
        // The keys were given back at once on a fresh connection: pending, not leased.
        let store = <sqlx::MySql as taskq_tests::drivers::HasDriver>::store(db.pool.clone());
        for k in ["a", "b"] {
            let key = store
                .event_key_get("orders.placed", k)
                .await
                .unwrap()
                .unwrap();
            assert_eq!((key.leased, key.done_seq), (false, 0), "{k}");
        }
    }
}
