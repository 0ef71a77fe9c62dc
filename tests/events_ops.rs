//! The operator's view of events (`taskq::Client`): per-topic pending counts and lag, keys
//! held back by a rejected event, a key's events, retry / skip of a held key, replay of a key
//! from a seq and of a time range (audited), retention of delivered events. On both backends,
//! with a relay on a function sink that records what it got. (The seam operations themselves
//! are tested in tests/events.rs and the driver suite; these test what an operator sees.)

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use taskq::client::AuditFilter;
use taskq::outbox::{Event, EventState, FnSink, Message, Outcome, Relay, Sink};
use taskq_tests::backends::{Db, TestBackend};

#[derive(serde::Serialize, Debug, Clone)]
#[taskq::event(topic = "orders.placed", key = order)]
struct OrderPlaced {
    order: String,
    n: u32,
    poison: bool,
}

#[derive(serde::Serialize, Debug, Clone)]
#[taskq::event(topic = "users.created", key = user)]
struct UserCreated {
    user: u32,
}

fn placed(order: &str, n: u32) -> OrderPlaced {
    OrderPlaced {
        order: order.into(),
        n,
        poison: false,
    }
}

/// Publishes each event in a committed transaction of its own.
async fn publish<B: TestBackend, E: Event>(db: &Db<B>, events: &[E]) {
    for e in events {
        let mut tx = db.begin().await;
        e.publish_tx(&mut tx).await.unwrap();
        tx.commit().await.unwrap();
    }
}

/// A sink that records every message; it rejects the poison ones while `reject` is set.
#[derive(Clone, Default)]
struct Recording {
    got: Arc<Mutex<Vec<Message>>>,
    reject: Arc<AtomicBool>,
}

impl Recording {
    fn sink(&self) -> impl Sink + 'static {
        let me = self.clone();
        FnSink::new(move |batch: Vec<Message>| {
            let me = me.clone();
            async move {
                let mut out = Vec::new();
                let mut stopped: Vec<String> = Vec::new();
                for m in batch {
                    if stopped.contains(&m.key) {
                        out.push(Outcome::Held);
                        continue;
                    }
                    let poison = serde_json::from_slice::<serde_json::Value>(&m.payload)
                        .ok()
                        .and_then(|v| v["poison"].as_bool())
                        .unwrap_or(false);
                    if poison && me.reject.load(Ordering::SeqCst) {
                        stopped.push(m.key.clone());
                        out.push(Outcome::Rejected("message too large".into()));
                        continue;
                    }
                    me.got.lock().unwrap().push(m);
                    out.push(Outcome::Delivered);
                }
                out
            }
        })
    }

    fn ids_of(&self, key: &str) -> Vec<String> {
        self.got
            .lock()
            .unwrap()
            .iter()
            .filter(|m| m.key == key)
            .map(|m| m.id.clone())
            .collect()
    }
}

/// Relay rounds until one publishes nothing.
async fn relay_all<B: TestBackend>(db: &Db<B>, rec: &Recording) {
    let relay = Relay::builder(db.pool.clone(), rec.sink()).build().unwrap();
    for _ in 0..50 {
        if relay.run_once().await.unwrap().published == 0 {
            return;
        }
    }
    panic!("the relay did not settle in 50 rounds");
}

async fn stats_count_pending_events_and_their_lag_per_topic<B: TestBackend>(db: Db<B>) {
    let client = db.client();
    assert!(client.event_stats().await.unwrap().is_empty());
    publish(&db, &[placed("a", 1), placed("a", 2), placed("b", 1)]).await;
    publish(&db, &[UserCreated { user: 7 }]).await;
    // The oldest order event was published an hour ago.
    db.exec(&format!(
        "UPDATE taskq_events SET created_at = {} WHERE topic = 'orders.placed' AND event_key = 'a' AND seq = 1",
        db.ago(Duration::from_secs(3600))
    ))
    .await;
    let stats = client.event_stats().await.unwrap();
    assert_eq!(
        stats
            .iter()
            .map(|t| (t.topic.as_str(), t.pending, t.held_keys))
            .collect::<Vec<_>>(),
        [("orders.placed", 3, 0), ("users.created", 1, 0)],
        "{stats:?}"
    );
    let lag = stats[0].lag.as_secs();
    assert!((3599..3700).contains(&lag), "{stats:?}");
    assert!(stats[1].lag < Duration::from_secs(60), "{stats:?}");
    assert!(stats[0].oldest_pending_at.is_some());

    let rec = Recording::default();
    relay_all(&db, &rec).await;
    let after = client.event_stats().await.unwrap();
    assert!(
        after.iter().all(|t| t.pending == 0 && t.lag.is_zero()),
        "{after:?}"
    );
    let json = serde_json::to_value(&stats[0]).unwrap();
    assert_eq!(json["topic"], "orders.placed");
    assert!(json["lag"].as_f64().unwrap() >= 3599.0, "{json}");
}

async fn a_held_key_is_listed_until_it_is_skipped_or_retried<B: TestBackend>(db: Db<B>) {
    let client = db.client().with_actor("ops:test");
    let rec = Recording::default();
    rec.reject.store(true, Ordering::SeqCst);
    let mut bad = placed("a", 1);
    bad.poison = true;
    let mut bad_c = placed("c", 1);
    bad_c.poison = true;
    publish(
        &db,
        &[bad, placed("a", 2), placed("b", 1), bad_c, placed("c", 2)],
    )
    .await;
    relay_all(&db, &rec).await;
    assert_eq!(rec.ids_of("b").len(), 1, "other keys go on");
    assert!(rec.ids_of("a").is_empty());

    let held = client.event_keys_held(None, 10).await.unwrap();
    let mut keys: Vec<_> = held
        .iter()
        .map(|k| (k.topic.as_str(), k.key.as_str(), k.seq, k.error.as_str()))
        .collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            ("orders.placed", "a", 1, "message too large"),
            ("orders.placed", "c", 1, "message too large")
        ]
    );
    let now = db.server_now().await;
    assert!(
        held.iter()
            .all(|k| (now - k.since).num_seconds().abs() < 60)
    );
    assert!(
        client
            .event_keys_held(Some("users.created"), 10)
            .await
            .unwrap()
            .is_empty()
    );
    let stats = client.event_stats().await.unwrap();
    assert_eq!((stats[0].pending, stats[0].held_keys), (4, 2), "{stats:?}");
    let key = client
        .event_key("orders.placed", "a")
        .await
        .unwrap()
        .unwrap();
    assert!(
        key.held_at.is_some() && key.next_seq == 2 && key.done_seq == 0,
        "{key:?}"
    );

    // Skip a's poison: it is dead, a2 goes out.
    assert!(
        client
            .release_event_key("orders.placed", "a", true)
            .await
            .unwrap()
    );
    relay_all(&db, &rec).await;
    assert_eq!(rec.ids_of("a").len(), 1);
    let events = client
        .event_list("orders.placed", "a", 0, 10)
        .await
        .unwrap();
    assert_eq!(
        events.iter().map(|e| (e.seq, e.state)).collect::<Vec<_>>(),
        [(1, EventState::Dead), (2, EventState::Delivered)]
    );
    // Retry c's poison once the broker takes it: c1 then c2, in order.
    rec.reject.store(false, Ordering::SeqCst);
    assert!(
        client
            .release_event_key("orders.placed", "c", false)
            .await
            .unwrap()
    );
    relay_all(&db, &rec).await;
    let cs = client
        .event_list("orders.placed", "c", 0, 10)
        .await
        .unwrap();
    assert_eq!(
        rec.ids_of("c"),
        [cs[0].message_id.clone(), cs[1].message_id.clone()]
    );
    assert!(client.event_keys_held(None, 10).await.unwrap().is_empty());
    // Neither key is held now.
    assert!(
        !client
            .release_event_key("orders.placed", "a", true)
            .await
            .unwrap()
    );
    assert!(
        !client
            .release_event_key("orders.placed", "nope", false)
            .await
            .unwrap()
    );

    let audit = client.audit(&AuditFilter::default()).await.unwrap();
    let acts: Vec<_> = audit
        .iter()
        .map(|e| {
            (
                e.action.as_str(),
                e.actor.as_str(),
                e.detail["key"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        acts,
        [
            ("event_retry", "ops:test", "c"),
            ("event_skip", "ops:test", "a")
        ]
    );
}

async fn replays_send_a_key_or_a_range_again_with_the_same_ids_audited<B: TestBackend>(db: Db<B>) {
    let client = db.client().with_actor("ops:replay");
    let rec = Recording::default();
    publish(
        &db,
        &[
            placed("k", 1),
            placed("k", 2),
            placed("k", 3),
            placed("j", 1),
        ],
    )
    .await;
    relay_all(&db, &rec).await;
    let first = rec.ids_of("k");
    assert_eq!(first.len(), 3);

    // A key from seq 2: seqs 2 and 3 again, in order, with their ids.
    assert_eq!(
        client
            .replay_event_key("orders.placed", "k", 2)
            .await
            .unwrap(),
        2
    );
    let states: Vec<_> = client
        .event_list("orders.placed", "k", 0, 10)
        .await
        .unwrap()
        .iter()
        .map(|e| e.state)
        .collect();
    assert_eq!(
        states,
        [
            EventState::Delivered,
            EventState::Pending,
            EventState::Pending
        ]
    );
    assert_eq!(client.event_stats().await.unwrap()[0].pending, 2);
    relay_all(&db, &rec).await;
    assert_eq!(rec.ids_of("k")[3..], first[1..]);

    // A time range: the events published in it (k1..k3 an hour ago, j1 now).
    db.exec(&format!(
        "UPDATE taskq_events SET created_at = {} WHERE event_key = 'k'",
        db.ago(Duration::from_secs(3600))
    ))
    .await;
    let now = db.server_now().await;
    let since = now - chrono::Duration::hours(2);
    let until = now - chrono::Duration::minutes(30);
    assert_eq!(
        client
            .replay_events("orders.placed", since, until)
            .await
            .unwrap(),
        3
    );
    relay_all(&db, &rec).await;
    assert_eq!(rec.ids_of("k")[5..], first[..]);
    assert_eq!(rec.ids_of("j").len(), 1, "j1 is outside the range");
    assert_eq!(
        client
            .replay_events("users.created", since, until)
            .await
            .unwrap(),
        0
    );

    let audit = client.audit(&AuditFilter::default()).await.unwrap();
    let acts: Vec<_> = audit
        .iter()
        .map(|e| (e.action.as_str(), e.actor.as_str()))
        .collect();
    assert_eq!(
        acts,
        [
            ("event_replay_range", "ops:replay"),
            ("event_replay_range", "ops:replay"),
            ("event_replay", "ops:replay")
        ]
    );
    let replay = &audit[2].detail;
    assert_eq!(
        (
            replay["topic"].as_str(),
            replay["key"].as_str(),
            replay["from_seq"].as_u64(),
            replay["events"].as_u64()
        ),
        (Some("orders.placed"), Some("k"), Some(2), Some(2)),
        "{replay}"
    );
    assert_eq!(audit[1].detail["events"], 3);
}

/// A range replay rewinds each key to its first event in the range: the key's later events,
/// published after the range, go out again too, after it and in seq order (a consumer never
/// sees a key's replayed event after a later one); a key replayed from before its oldest
/// stored event (retention deleted the first ones) starts at the oldest stored one, and the
/// pending counts stay exact.
async fn a_range_replay_rewinds_each_key_so_its_later_events_follow_in_order<B: TestBackend>(
    db: Db<B>,
) {
    let client = db.client();
    let rec = Recording::default();
    publish(&db, &[placed("k", 1), placed("k", 2), placed("k", 3)]).await;
    relay_all(&db, &rec).await;
    let first = rec.ids_of("k");
    // k1 three hours ago, k2 one hour ago, k3 now.
    db.exec(&format!(
        "UPDATE taskq_events SET created_at = {} WHERE seq = 1",
        db.ago(Duration::from_secs(3 * 3600))
    ))
    .await;
    db.exec(&format!(
        "UPDATE taskq_events SET created_at = {} WHERE seq = 2",
        db.ago(Duration::from_secs(3600))
    ))
    .await;
    let now = db.server_now().await;
    let (since, until) = (
        now - chrono::Duration::hours(2),
        now - chrono::Duration::minutes(30),
    );
    assert_eq!(
        client
            .replay_events("orders.placed", since, until)
            .await
            .unwrap(),
        2,
        "k2 (in the range) and k3 (after it)"
    );
    assert_eq!(client.event_stats().await.unwrap()[0].pending, 2);
    relay_all(&db, &rec).await;
    assert_eq!(rec.ids_of("k")[3..], first[1..], "k2 then k3, again");

    // Retention deletes k1 and k2: a replay of the whole key starts at k3.
    db.exec(&format!(
        "UPDATE taskq_events SET created_at = {} WHERE seq < 3",
        db.ago(Duration::from_secs(3 * 86_400))
    ))
    .await;
    assert_eq!(
        client
            .prune_events(Duration::from_secs(86_400))
            .await
            .unwrap(),
        2
    );
    assert_eq!(
        client
            .replay_event_key("orders.placed", "k", 0)
            .await
            .unwrap(),
        1
    );
    let stats = client.event_stats().await.unwrap();
    assert_eq!(stats[0].pending, 1, "k3 only: {stats:?}");
    assert!(stats[0].oldest_pending_at.is_some(), "{stats:?}");
    let key = client
        .event_key("orders.placed", "k")
        .await
        .unwrap()
        .unwrap();
    assert_eq!((key.done_seq, key.next_seq), (2, 3));
    relay_all(&db, &rec).await;
    assert_eq!(rec.ids_of("k")[5..], first[2..]);
}

async fn prune_deletes_old_delivered_events_only<B: TestBackend>(db: Db<B>) {
    let client = db.client();
    let rec = Recording::default();
    publish(&db, &[placed("a", 1), placed("a", 2), placed("b", 1)]).await;
    relay_all(&db, &rec).await;
    publish(&db, &[placed("b", 2)]).await; // pending
    // Published three days ago: a1, a2 (delivered) and b2 (pending); b1 (delivered) now.
    db.exec(&format!(
        "UPDATE taskq_events SET created_at = {} WHERE event_key = 'a' OR seq = 2",
        db.ago(Duration::from_secs(3 * 86_400))
    ))
    .await;
    assert_eq!(
        client
            .prune_events(Duration::from_secs(86_400))
            .await
            .unwrap(),
        2
    );
    assert_eq!(
        db.rows(
            &["event_key", "seq"],
            "FROM taskq_events ORDER BY event_key, seq"
        )
        .await,
        [["b", "1"], ["b", "2"]],
        "the young delivered event and the old pending one stay"
    );
    assert_eq!(
        client
            .prune_events(Duration::from_secs(86_400))
            .await
            .unwrap(),
        0
    );
}

taskq_tests::conformance!(
    stats_count_pending_events_and_their_lag_per_topic,
    a_held_key_is_listed_until_it_is_skipped_or_retried,
    replays_send_a_key_or_a_range_again_with_the_same_ids_audited,
    a_range_replay_rewinds_each_key_so_its_later_events_follow_in_order,
    prune_deletes_old_delivered_events_only,
);

// MySQL only: the race is between the statements of MySQL's prune (a read of delivered
// events, then a delete), made deterministic with an InnoDB row lock; SQLite prunes in one
// statement under its write lock, which no replay can come between.
mod mysql {
    use super::*;
    use sqlx::MySqlPool;
    use taskq_tests::{TestDb, wait_until};

    /// Statements running (not idle) on this test's database, other than this one, whose SQL
    /// is `LIKE pattern`.
    async fn running(pool: &MySqlPool, pattern: &str) -> i64 {
        sqlx::query_scalar(
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST
             WHERE DB = DATABASE() AND ID <> CONNECTION_ID() AND INFO LIKE ?",
        )
        .bind(pattern)
        .fetch_one(pool)
        .await
        .unwrap()
    }

    /// Issue 34 E5: a replay that rewinds a key while a prune is between its read of the
    /// delivered events and its delete does not lose the events it made pending: every
    /// event the key counts as pending is still stored, and is sent again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_replay_racing_a_prune_keeps_every_pending_event() {
        let Some(db) = TestDb::new_or_skip().await else {
            return;
        };
        let db = Db::from_test_db(db);
        let rec = Recording::default();
        publish(&db, &[placed("a", 1), placed("a", 2)]).await;
        relay_all(&db, &rec).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        // Another transaction holds a1's row, so the prune's delete waits on it.
        let mut holder = db.pool.begin().await.unwrap();
        sqlx::query("SELECT id FROM taskq_events WHERE event_key = 'a' AND seq = 1 FOR UPDATE")
            .fetch_all(&mut *holder)
            .await
            .unwrap();
        let client = db.client();
        let prune = tokio::spawn({
            let c = client.clone();
            async move { c.prune_events(Duration::ZERO).await }
        });
        wait_until(
            Duration::from_secs(20),
            "the prune's delete waits",
            || async { running(&db.pool, "DELETE%").await == 1 },
        )
        .await;
        let replay = tokio::spawn({
            let c = client.clone();
            async move { c.replay_event_key("orders.placed", "a", 1).await }
        });
        wait_until(
            Duration::from_secs(20),
            "the replay waits or is done",
            || async { replay.is_finished() || running(&db.pool, "%").await == 2 },
        )
        .await;
        holder.rollback().await.unwrap();
        prune.await.unwrap().unwrap();
        replay.await.unwrap().unwrap();

        let k = client
            .event_key("orders.placed", "a")
            .await
            .unwrap()
            .unwrap();
        let stored: i64 = db
            .scalar(&format!(
                "SELECT COUNT(*) FROM taskq_events WHERE event_key = 'a' AND seq > {}",
                k.done_seq
            ))
            .await;
        assert_eq!(
            k.next_seq - k.done_seq,
            stored as u64,
            "every event the key counts as pending is stored ({k:?})"
        );
        let before = rec.got.lock().unwrap().len();
        relay_all(&db, &rec).await;
        assert_eq!(rec.got.lock().unwrap().len() - before, stored as usize);
    }
}
