//! Tasks whose name no live worker registers: workers say so at WARN (once a minute, the first
//! time one heartbeat interval after they start), and `Client::unhandled` lists them.
//!
//! In its own binary, with a process-wide capturing `tracing` subscriber: the worker logs from
//! the runtime's worker threads. Each test picks out its own worker's events by `worker_id`.

use std::time::Duration;

use taskq::{Task, TaskContext, TaskError};
use taskq_tests::backends::{Db, TestBackend};
use taskq_tests::capture::{Capture, Captured};
use taskq_tests::{RunningWorker, fast_worker, wait_until};

/// The WARN events about unhandled tasks logged by worker `id`.
fn warnings_of(id: &str) -> Vec<Captured> {
    Capture::global()
        .events()
        .into_iter()
        .filter(|e| {
            e.field("worker_id") == Some(id) && e.message.contains("no live worker handles")
        })
        .collect()
}

/// The task the workers register.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Known;

impl Task for Known {
    const NAME: &'static str = "known";
    const QUEUE: &'static str = "orders";
    async fn run(self, _cx: TaskContext) -> Result<(), TaskError> {
        Ok(())
    }
}

/// A task of a name the first worker does not register (a worker not deployed yet, or a
/// renamed task).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Ghost;

impl Task for Ghost {
    const NAME: &'static str = "ghost";
    const QUEUE: &'static str = "orders";
    async fn run(self, _cx: TaskContext) -> Result<(), TaskError> {
        Ok(())
    }
}

/// A worker of `orders` that registers only `known` logs one WARN line naming the due `ghost`
/// tasks of its queue, with their count (not the scheduled one, nor the tasks of a queue it
/// does not work), one heartbeat interval after it starts; `Client::unhandled` lists the
/// queue × name pairs no alive worker handles, in every queue. Once a worker that registers
/// `ghost` runs, `ghost` is handled.
async fn a_name_no_live_worker_registers_is_logged_at_warn<B: TestBackend>(db: Db<B>) {
    Capture::global();
    for _ in 0..3 {
        Ghost.enqueue(&db.pool).await.unwrap();
    }
    Ghost
        .with_delay(Duration::from_secs(3600))
        .enqueue(&db.pool)
        .await
        .unwrap();
    Known.enqueue(&db.pool).await.unwrap();
    Ghost
        .with_queue("elsewhere")
        .enqueue(&db.pool)
        .await
        .unwrap();
    let client = db.client();
    let id = format!("only-known-{}", db.label());
    let a = RunningWorker::spawn(
        fast_worker(&db.pool)
            .register::<Known>()
            .heartbeat(Duration::from_millis(200))
            .worker_id(&id),
    );
    wait_until(Duration::from_secs(10), "the WARN line", || async {
        !warnings_of(&id).is_empty()
    })
    .await;
    let w = warnings_of(&id);
    assert_eq!(w.len(), 1, "one line per check: {w:#?}");
    assert_eq!(w[0].level, tracing::Level::WARN);
    assert_eq!(w[0].fields["due"], "3", "{w:#?}");
    let tasks = &w[0].fields["tasks"];
    assert!(tasks.starts_with("orders/ghost: 3 due since "), "{tasks}");
    assert!(
        !tasks.contains("known") && !tasks.contains("elsewhere"),
        "{tasks}"
    );
    assert_eq!(db.count("name = 'known' AND state = 'succeeded'").await, 1);

    let unhandled: Vec<(String, String, u64)> = client
        .unhandled()
        .await
        .unwrap()
        .into_iter()
        .map(|p| (p.queue, p.name, p.due))
        .collect();
    assert_eq!(
        unhandled,
        [
            ("elsewhere".to_owned(), "ghost".to_owned(), 1),
            ("orders".to_owned(), "ghost".to_owned(), 3)
        ]
    );
    let workers = client.workers().await.unwrap();
    assert_eq!(
        workers[0].names,
        Some(vec!["known".to_owned()]),
        "the worker records the names it registers"
    );

    // A worker that registers `ghost` in `orders` handles it: only `elsewhere` is left.
    let b = RunningWorker::spawn(
        fast_worker(&db.pool)
            .register::<Known>()
            .register::<Ghost>()
            .worker_id(format!("both-{}", db.label())),
    );
    wait_until(Duration::from_secs(10), "the ghosts run", || async {
        db.count("name = 'ghost' AND state = 'succeeded'").await == 3
    })
    .await;
    let left: Vec<(String, String)> = client
        .unhandled()
        .await
        .unwrap()
        .into_iter()
        .map(|p| (p.queue, p.name))
        .collect();
    assert_eq!(left, [("elsewhere".to_owned(), "ghost".to_owned())]);
    b.stop().await;
    a.stop().await;
    // Stopped workers handle nothing.
    Known.enqueue(&db.pool).await.unwrap();
    let left: Vec<(String, String)> = client
        .unhandled()
        .await
        .unwrap()
        .into_iter()
        .map(|p| (p.queue, p.name))
        .collect();
    assert_eq!(
        left,
        [
            ("elsewhere".to_owned(), "ghost".to_owned()),
            ("orders".to_owned(), "known".to_owned())
        ]
    );
    assert!(
        warnings_of(&id).len() == 1,
        "no second line within a minute"
    );
}

taskq_tests::conformance!(a_name_no_live_worker_registers_is_logged_at_warn);
