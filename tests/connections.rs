//! The worker's connection footprint (docs/operations.md, "Sizing"): two lanes, control
//! (renewals, presence, pause refresh) and work (claims, write-backs, maintenance, scheduler),
//! `1 + min(queues, concurrency) + (concurrency > 1)` connections by default.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use taskq::worker::Retention;
use taskq::{Schedule, Task, TaskContext, TaskError};
use taskq_tests::backends::{Db, TestBackend};
use taskq_tests::{RunningWorker, wait_until};

const QUEUE: &str = "footprint";

/// Holds its lease for a few heartbeats, then succeeds.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Busy {
    n: u32,
}

impl Task for Busy {
    const NAME: &'static str = "footprint_busy";
    const QUEUE: &'static str = QUEUE;
    async fn run(self, _cx: TaskContext) -> Result<(), TaskError> {
        tokio::time::sleep(Duration::from_millis(15)).await;
        Ok(())
    }
}

/// The recurring task, every second.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Tick {}

impl Task for Tick {
    const NAME: &'static str = "footprint_tick";
    const QUEUE: &'static str = QUEUE;
    async fn run(self, _cx: TaskContext) -> Result<(), TaskError> {
        Ok(())
    }
}

/// On MySQL, samples how many server sessions use the test's database (the sampler's own
/// session is on another pool of the same database and is subtracted) until `stop`.
async fn sample_sessions<B: TestBackend>(db: &Db<B>, stop: Arc<AtomicBool>) -> Arc<AtomicU64> {
    let peak = Arc::new(AtomicU64::new(0));
    if B::LABEL != "mysql" {
        return peak;
    }
    let sampler = db.another_pool(1).await;
    let sql = "SELECT COUNT(*) - 1 FROM information_schema.PROCESSLIST WHERE DB = DATABASE()";
    let p = peak.clone();
    tokio::spawn(async move {
        while !stop.load(Ordering::Relaxed) {
            let n = B::scalar(&sampler, sql).await;
            p.fetch_max(n as u64, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    });
    peak
}

/// A single-slot worker kept busy on every loop at once — short tasks claimed and written
/// back one at a time, leases renewed every 50 ms, a schedule firing every second, the reaper,
/// retention, the pause refresh and the backlog gauge every 100 ms — never holds more than
/// its 2 connections (counted by its pools, and on MySQL by the server's session list).
async fn a_busy_single_slot_worker_with_a_schedule_holds_two_connections<B: TestBackend>(
    db: Db<B>,
) {
    const TASKS: u32 = 120;
    for n in 0..TASKS {
        Busy { n }.enqueue(&db.pool).await.unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let sessions = sample_sessions(&db, stop.clone()).await;
    // Sessions of the test's database before the worker starts (the test pool's idle
    // connections): the worker's are counted above them.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let before = sessions.load(Ordering::Relaxed);
    let w = RunningWorker::spawn(
        db.worker()
            .register::<Busy>()
            .schedule(Schedule::new("* * * * * *", Tick {}))
            .queue(QUEUE, 1)
            .lease(Duration::from_secs(3))
            .heartbeat(Duration::from_millis(50))
            .retention(Retention {
                interval: Duration::from_millis(100),
                ..Retention::default()
            })
            .backlog_metrics(Duration::from_millis(100)),
    );
    wait_until(
        Duration::from_secs(60),
        "the tasks and two ticks",
        || async {
            let s = w.stats.snapshot();
            s.succeeded >= u64::from(TASKS) + 2 && s.scheduled >= 2
        },
    )
    .await;
    let report = w.stop().await;
    stop.store(true, Ordering::Relaxed);
    let s = report.stats;
    assert!(s.claim_queries >= u64::from(TASKS), "{s:?}");
    assert_eq!(s.db_connections_max, 2, "{s:?}");
    if B::LABEL == "mysql" {
        let peak = sessions.load(Ordering::Relaxed);
        assert!(
            peak <= before + 2,
            "server sessions: {before} before the worker, {peak} at the peak"
        );
        assert!(peak > before, "the sampler saw the worker's sessions");
    }
}

/// The default grows with the claim loops that can claim at once, plus one for write-backs
/// when more than one handler can run; `db_connections` sets the total.
async fn the_default_footprint_follows_queues_and_concurrency<B: TestBackend>(db: Db<B>) {
    for (queues, concurrency, explicit, want) in
        [(1, 4, None, 3u64), (2, 1, None, 2), (1, 4, Some(2), 2)]
    {
        for n in 0..40 {
            Busy { n }.enqueue(&db.pool).await.unwrap();
        }
        let mut b = db
            .worker()
            .register::<Busy>()
            .queue(QUEUE, 4)
            .concurrency(concurrency)
            .heartbeat(Duration::from_millis(20));
        if queues == 2 {
            b = b.queue("footprint_other", 1);
        }
        if let Some(n) = explicit {
            b = b.db_connections(n);
        }
        let w = RunningWorker::spawn(b);
        wait_until(Duration::from_secs(30), "the tasks", || async {
            w.stats.snapshot().succeeded >= 40
        })
        .await;
        let s = w.stop().await.stats;
        assert!(
            s.db_connections_max <= want && s.db_connections_max >= 2,
            "queues {queues}, concurrency {concurrency}, db_connections {explicit:?}: {s:?}"
        );
    }
}

taskq_tests::conformance!(
    a_busy_single_slot_worker_with_a_schedule_holds_two_connections,
    the_default_footprint_follows_queues_and_concurrency,
);
