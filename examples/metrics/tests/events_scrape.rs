//! The events' gauges (`WorkerBuilder::event_metrics`) in a Prometheus scrape: per topic the
//! pending events, the lag and the held keys, on both backends.

use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::Duration;

use example_metrics::{BuildReport, install_exporter, scrape};
use taskq::outbox::{Event, FnSink, Message, Outcome, Relay};
use taskq_tests::RunningWorker;
use taskq_tests::backends::{Db, TestBackend};

/// The exporter is the process's global recorder: installed once, shared by both backends'
/// tests (their topics differ). Its HTTP listener runs on a runtime of its own, which outlives
/// each test's runtime.
fn exporter() -> SocketAddr {
    static ADDR: OnceLock<SocketAddr> = OnceLock::new();
    *ADDR.get_or_init(|| {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                install_exporter(addr).unwrap();
                tx.send(()).unwrap();
                std::future::pending::<()>().await;
            });
        });
        rx.recv().unwrap();
        addr
    })
}

/// An event on a topic chosen at run time (one per backend, so the tests' gauges differ).
#[derive(serde::Serialize)]
struct Note {
    #[serde(skip)]
    topic: String,
    key: String,
    poison: bool,
}

impl Event for Note {
    fn topic(&self) -> &str {
        &self.topic
    }
    fn key(&self) -> String {
        self.key.clone()
    }
}

/// The value of the sample `name{topic="topic"}` in `body`, if there is one.
fn sample(body: &str, name: &str, topic: &str) -> Option<f64> {
    let prefix = format!("{name}{{topic=\"{topic}\"}} ");
    body.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map(|v| v.trim().parse().unwrap())
}

/// (pending, lag seconds, held keys) of `topic` in a scrape.
fn figures(body: &str, topic: &str) -> Option<(f64, f64, f64)> {
    Some((
        sample(body, "taskq_events_pending", topic)?,
        sample(body, "taskq_events_lag_seconds", topic)?,
        sample(body, "taskq_events_held_keys", topic)?,
    ))
}

/// Scrapes every 50 ms until `ready` holds of the body (at most 20 s); the body.
async fn scrape_until(addr: SocketAddr, what: &str, ready: impl Fn(&str) -> bool) -> String {
    let end = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let body = scrape(addr).await.unwrap();
        if ready(&body) {
            return body;
        }
        assert!(
            std::time::Instant::now() < end,
            "{what}: not within 20 s:\n{body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Events on two topics: `orders` (3 pending, on 2 keys, published an hour ago, no relay for
/// it) and `payments` (key p1 held by a rejected event with a second event behind it, key p2
/// delivered; published two hours ago). A worker with `event_metrics` publishes per topic
/// pending 3 / lag about 3,600 s / 0 held keys, and 2 / about 7,200 s / 1. Once p1's event is
/// skipped and the rest delivered, `payments` reads 0 / 0 / 0.
async fn event_gauges_show_pending_lag_and_held_keys_per_topic<B: TestBackend>(db: Db<B>) {
    // The scrape connects to the exporter on 127.0.0.1 (none in `unshare -n`).
    if !taskq_tests::loopback_or_skip() {
        return;
    }
    let addr = exporter();
    let orders = format!("scrape.orders.{}", db.label());
    let payments = format!("scrape.payments.{}", db.label());
    for (topic, key, poison) in [
        (&orders, "o1", false),
        (&orders, "o1", false),
        (&orders, "o2", false),
        (&payments, "p1", true),
        (&payments, "p1", false),
        (&payments, "p2", false),
    ] {
        let mut tx = db.begin().await;
        Note {
            topic: topic.clone(),
            key: key.into(),
            poison,
        }
        .publish_tx(&mut tx)
        .await
        .unwrap();
        tx.commit().await.unwrap();
    }
    for (topic, hours) in [(&orders, 1), (&payments, 2)] {
        db.shift_times(
            "taskq_events",
            &format!("topic = '{topic}'"),
            &["created_at"],
            -hours * 3_600_000_000,
        )
        .await;
    }
    let sink = FnSink::new(|batch: Vec<Message>| async move {
        let mut held: Vec<String> = Vec::new();
        batch
            .into_iter()
            .map(|m| {
                if held.contains(&m.key) {
                    Outcome::Held
                } else if String::from_utf8_lossy(&m.payload).contains("\"poison\":true") {
                    held.push(m.key.clone());
                    Outcome::Rejected("refused".into())
                } else {
                    Outcome::Delivered
                }
            })
            .collect()
    });
    let relay = Relay::builder(db.pool.clone(), sink)
        .topics([payments.clone()])
        .build()
        .unwrap();
    while relay.run_once().await.unwrap().published > 0 {}
    let held = db
        .client()
        .event_keys_held(Some(&payments), 10)
        .await
        .unwrap();
    assert_eq!(held.len(), 1, "{held:?}");

    let w = RunningWorker::spawn(
        db.worker()
            .register::<BuildReport>()
            .event_metrics(Duration::from_millis(100)),
    );
    let body = scrape_until(addr, "the event gauges", |b| {
        figures(b, &orders).is_some() && figures(b, &payments).is_some()
    })
    .await;
    let (pending, lag, held_keys) = figures(&body, &orders).unwrap();
    assert_eq!((pending, held_keys), (3.0, 0.0), "{body}");
    assert!(
        (3_600.0..3_700.0).contains(&lag),
        "orders lag {lag}: {body}"
    );
    let (pending, lag, held_keys) = figures(&body, &payments).unwrap();
    assert_eq!((pending, held_keys), (2.0, 1.0), "{body}");
    assert!(
        (7_200.0..7_300.0).contains(&lag),
        "payments lag {lag}: {body}"
    );

    // The hold skipped and the rest delivered: the topic's figures go to zero.
    assert!(
        db.client()
            .release_event_key(&payments, "p1", true)
            .await
            .unwrap()
    );
    while relay.run_once().await.unwrap().published > 0 {}
    let body = scrape_until(addr, "payments at zero", |b| {
        figures(b, &payments) == Some((0.0, 0.0, 0.0))
    })
    .await;
    let (pending, _, held_keys) = figures(&body, &orders).unwrap();
    assert_eq!((pending, held_keys), (3.0, 0.0), "{body}");
    w.stop().await;
}

taskq_tests::conformance!(event_gauges_show_pending_lag_and_held_keys_per_topic);
