//! Live workers (`taskq_workers`, `Client::workers`) and the worker's readiness / liveness
//! probe (`Worker::health`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::MySqlPool;
use sqlx::mysql::MySqlPoolOptions;
use taskq::{Client, Task, TaskContext, TaskError, worker::WorkerPhase};
use taskq_tests::backends::{Db, TestBackend};
use taskq_tests::proxy::ChaosProxy;
use taskq_tests::{RunningWorker, TestDb, fast_worker, wait_until};
use tokio::sync::Semaphore;

/// Handlers wait on this gate (state), so tasks stay running as long as the test wants.
#[derive(Clone)]
struct Gate(Arc<Semaphore>);

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Hold {
    n: u32,
}

impl Task for Hold {
    const NAME: &'static str = "hold";
    const QUEUE: &'static str = "holding";
    async fn run(self, cx: TaskContext) -> Result<(), TaskError> {
        let gate = cx.data::<Gate>().expect("Gate data registered");
        let _permit = gate.0.acquire().await.expect("gate open");
        Ok(())
    }
}

async fn row_count(db: &TestDb, cond: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT COUNT(*) FROM taskq_workers WHERE {cond}"
    )))
    .fetch_one(&db.pool)
    .await
    .unwrap()
}

/// A running worker appears with its settings; its `last_seen_at` advances with its
/// heartbeat; `running` counts the tasks it runs; graceful shutdown marks it stopped (and no
/// longer alive) while a second worker's row stays alive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_worker_is_listed_with_its_tasks_and_marked_stopped_at_shutdown() {
    let Some(db) = TestDb::new_or_skip().await else {
        return;
    };
    let client = Client::new(db.pool.clone());
    assert!(client.workers().await.unwrap().is_empty());

    let gate = Gate(Arc::new(Semaphore::new(0)));
    let a = RunningWorker::spawn(
        fast_worker(&db.pool)
            .register::<Hold>()
            .data(gate.clone())
            .queue("holding", 4)
            .queue("other", 2)
            .lease(Duration::from_secs(3))
            .heartbeat(Duration::from_millis(200))
            .worker_id("worker-a"),
    );
    let b = RunningWorker::spawn(
        fast_worker(&db.pool)
            .register::<Hold>()
            .data(gate.clone())
            .queue("other", 1)
            .worker_id("worker-b"),
    );
    for n in 0..3 {
        Hold { n }.enqueue(&db.pool).await.unwrap();
    }
    wait_until(Duration::from_secs(10), "3 tasks running", || async {
        db.count("state = 'running'").await == 3
    })
    .await;

    let workers = client.workers().await.unwrap();
    assert_eq!(workers.len(), 2, "{workers:?}");
    let wa = workers.iter().find(|w| w.id == "worker-a").unwrap();
    let wb = workers.iter().find(|w| w.id == "worker-b").unwrap();
    assert_eq!(wa.pid, std::process::id());
    assert!(!wa.host.is_empty());
    assert_eq!(
        wa.queues
            .iter()
            .map(|(q, n)| (q.as_str(), *n))
            .collect::<Vec<_>>(),
        vec![("holding", 4), ("other", 2)]
    );
    assert_eq!(wa.concurrency, 6);
    assert_eq!(wa.lease, Duration::from_secs(3));
    assert_eq!(wa.heartbeat, Duration::from_millis(200));
    assert!(wa.alive && wb.alive);
    assert!(wa.stopped_at.is_none());
    assert_eq!(wa.running, 3, "worker-a runs the three tasks");
    assert_eq!(wb.running, 0, "worker-b works another queue");
    assert_eq!(wb.concurrency, 1);
    assert!(wa.started_at <= wa.last_seen_at);

    // last_seen_at advances with the heartbeat (200 ms), on the database clock.
    let first_seen = wa.last_seen_at;
    wait_until(Duration::from_secs(5), "last_seen_at advances", || async {
        let w = client.workers().await.unwrap();
        let a = w.iter().find(|w| w.id == "worker-a").unwrap();
        a.last_seen_at > first_seen && a.started_at == wa.started_at
    })
    .await;

    // Let the tasks finish: running drops to 0.
    gate.0.add_permits(100);
    wait_until(Duration::from_secs(10), "running back to 0", || async {
        let w = client.workers().await.unwrap();
        w.iter().all(|w| w.running == 0) && db.count("state = 'succeeded'").await == 3
    })
    .await;

    let report = a.stop().await;
    assert_eq!(report.stats.succeeded, 3);
    let workers = client.workers().await.unwrap();
    let wa = workers.iter().find(|w| w.id == "worker-a").unwrap();
    let wb = workers.iter().find(|w| w.id == "worker-b").unwrap();
    assert!(!wa.alive, "a stopped worker is not alive");
    let stopped = wa.stopped_at.expect("stopped_at set at graceful shutdown");
    assert_eq!(wa.last_seen_at, stopped);
    assert!(wb.alive && wb.stopped_at.is_none());
    // It stays stopped: no late beat revives it.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        row_count(
            &db,
            "worker_id = 'worker-a' AND stopped_at IS NOT NULL AND last_seen_at = stopped_at"
        )
        .await,
        1
    );
    b.stop().await;
}

/// A worker that vanished without a goodbye (no beat for longer than its lease) is listed as
/// not alive and not stopped; a worker id used again starts afresh; rows not seen for
/// `WORKER_ROW_RETENTION` are deleted by a running worker's maintenance, recent ones kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gone_workers_are_not_alive_and_old_rows_are_cleaned_up() {
    let Some(db) = TestDb::new_or_skip().await else {
        return;
    };
    let client = Client::new(db.pool.clone());
    let insert = |id: &'static str, seen_ago_secs: u64| {
        let pool = db.pool.clone();
        async move {
            sqlx::query(
                "INSERT INTO taskq_workers (worker_id, host, pid, queues, concurrency, lease_us,
                   heartbeat_us, started_at, last_seen_at)
                 VALUES (?, 'h', 1, '{\"default\":1}', 1, 30000000, 10000000,
                   UTC_TIMESTAMP(6) - INTERVAL ? SECOND, UTC_TIMESTAMP(6) - INTERVAL ? SECOND)",
            )
            .bind(id)
            .bind(seen_ago_secs + 10)
            .bind(seen_ago_secs)
            .execute(&pool)
            .await
            .unwrap();
        }
    };
    insert("gone-recently", 60).await; // lease 30 s: not alive, kept
    insert("gone-long-ago", 86_400 + 60).await; // older than a day: deleted
    insert("reused", 86_400 + 120).await; // its id is used again by a new worker
    // A running task still carries the gone worker's id until its lease is reaped.
    let workers = client.workers().await.unwrap();
    let gone = workers.iter().find(|w| w.id == "gone-recently").unwrap();
    assert!(!gone.alive && gone.stopped_at.is_none());

    let gate = Gate(Arc::new(Semaphore::new(100)));
    let w = RunningWorker::spawn(
        fast_worker(&db.pool)
            .register::<Hold>()
            .data(gate)
            .retention(taskq::worker::Retention {
                interval: Duration::from_millis(100),
                ..taskq::worker::Retention::disabled()
            })
            .worker_id("reused"),
    );
    wait_until(
        Duration::from_secs(10),
        "the old row is deleted",
        || async { row_count(&db, "worker_id = 'gone-long-ago'").await == 0 },
    )
    .await;
    let workers = client.workers().await.unwrap();
    let ids: Vec<&str> = workers.iter().map(|w| w.id.as_str()).collect();
    assert_eq!(ids, vec!["gone-recently", "reused"], "{workers:?}");
    let reused = &workers[1];
    assert!(reused.alive, "the new worker with a reused id is alive");
    assert_eq!(reused.pid, std::process::id());
    assert!(
        client.db_now().await.unwrap() - reused.started_at < chrono::TimeDelta::seconds(60),
        "started_at is the new start: {reused:?}"
    );
    w.stop().await;
    assert_eq!(row_count(&db, "1=1").await, 2);
}

/// A pool on the test database through `proxy`.
fn pool_through(db: &TestDb, proxy: &ChaosProxy) -> MySqlPool {
    MySqlPoolOptions::new()
        .max_connections(8)
        .connect_lazy_with(db.options.clone().port(proxy.addr().port()))
}

/// The probe: live and ready while running; not ready (still live) once the database does
/// not answer for longer than the lease; ready again after the partition heals; not live
/// after `run` returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_follows_the_database_round_trips() {
    let Some(db) = TestDb::new_or_skip().await else {
        return;
    };
    let upstream: SocketAddr = format!("{}:{}", db.options.get_host(), db.options.get_port())
        .parse()
        .unwrap();
    let proxy = ChaosProxy::start(upstream).await;
    let pool = pool_through(&db, &proxy);
    let lease = Duration::from_secs(1);

    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let worker = fast_worker(&pool)
        .register::<Hold>()
        .data(Gate(Arc::new(Semaphore::new(100))))
        .lease(lease)
        .shutdown_signal(async move {
            let _ = rx.await;
        })
        .build()
        .unwrap();
    let health = worker.health();
    let s = health.status();
    assert_eq!(s.phase, WorkerPhase::Created);
    assert!(!s.live && !s.ready);
    assert_eq!(s.last_db_ok_ago, None);
    assert_eq!(s.max_db_age, lease);
    let id = worker.id().to_owned();
    let run = tokio::spawn(worker.run());

    wait_until(Duration::from_secs(5), "ready", || async {
        health.is_ready()
    })
    .await;
    let s = health.status();
    assert_eq!(s.phase, WorkerPhase::Running);
    assert!(s.live);
    assert_eq!(s.worker_id, id);
    assert!(s.last_db_ok_ago.unwrap() < lease);
    let json = serde_json::to_value(&s).unwrap();
    assert_eq!(json["ready"], true);
    assert_eq!(json["phase"], "running");
    assert_eq!(json["max_db_age_ms"], 1000);
    assert!(json["last_db_ok_ms_ago"].as_u64().unwrap() < 1000);

    // The database becomes unreachable: live connections cut, new ones refused.
    proxy.set_refuse(true);
    proxy.cut_all().await;
    let cut_at = tokio::time::Instant::now();
    wait_until(Duration::from_secs(5), "not ready", || async {
        !health.is_ready()
    })
    .await;
    assert!(
        cut_at.elapsed() >= lease - Duration::from_millis(250),
        "not ready only once no statement succeeded for about a lease ({:?})",
        cut_at.elapsed()
    );
    let s = health.status();
    assert!(s.live, "still live: the worker runs");
    assert!(s.last_db_ok_ago.unwrap() >= lease);

    // Heal: ready again.
    proxy.set_refuse(false);
    wait_until(Duration::from_secs(10), "ready again", || async {
        health.is_ready()
    })
    .await;
    assert!(health.status().last_db_ok_ago.unwrap() < lease);

    let _ = tx.send(());
    run.await.unwrap().unwrap();
    let s = health.status();
    assert_eq!(s.phase, WorkerPhase::Stopped);
    assert!(!s.live && !s.ready);
    // It said goodbye (through the healed proxy).
    assert_eq!(
        row_count(
            &db,
            &format!("worker_id = '{id}' AND stopped_at IS NOT NULL")
        )
        .await,
        1
    );
}

/// The task `taskq-fault-worker` runs (its `fault_hold`): records `started` in `fault_events`
/// and holds its first attempt until canceled.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct FaultHold {
    n: u32,
}

impl Task for FaultHold {
    const NAME: &'static str = "fault_hold";
    const QUEUE: &'static str = "faults";
    async fn run(self, _cx: TaskContext) -> Result<(), TaskError> {
        Ok(())
    }
}

/// A worker process killed with SIGKILL (no goodbye) is listed `lost` within two of its
/// heartbeat intervals, on the database clock, while the task it held is still `running`
/// under its id with most of its 30 s lease left (before, it was listed alive until that
/// lease had passed).
async fn a_killed_worker_is_lost_within_two_heartbeats_while_its_lease_runs<B: TestBackend>(
    db: Db<B>,
) {
    db.exec(
        "CREATE TABLE fault_events (task_id BIGINT NOT NULL, worker_id VARCHAR(128) NOT NULL,
           lease_epoch BIGINT NOT NULL, attempt INT NOT NULL, event VARCHAR(64) NOT NULL,
           at DATETIME(6) NOT NULL)",
    )
    .await;
    let heartbeat = Duration::from_millis(600);
    let id = format!("killed-{}", db.label());
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_taskq-fault-worker"))
        .args(["--url", &db.url(), "--id", &id])
        .args([
            "--lease-ms",
            "30000",
            "--heartbeat-ms",
            "600",
            "--concurrency",
            "2",
        ])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn taskq-fault-worker");
    let mut stdout = tokio::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    tokio::io::AsyncBufReadExt::read_line(&mut stdout, &mut line)
        .await
        .unwrap();
    assert!(line.starts_with("ready "), "{line}");
    let task = FaultHold { n: 1 }.enqueue(&db.pool).await.unwrap().id;
    let client = db.client();
    wait_until(Duration::from_secs(15), "the task runs", || async {
        db.count(&format!(
            "id = {task} AND state = 'running' AND worker_id = '{id}'"
        ))
        .await
            == 1
    })
    .await;
    let before = client.workers().await.unwrap();
    let w = before.iter().find(|w| w.id == id).unwrap();
    assert_eq!(w.status, taskq::client::WorkerStatus::Alive, "{w:?}");
    assert!(w.alive && w.last_seen_ago < 2 * heartbeat, "{w:?}");
    assert!(
        w.names.as_ref().unwrap().contains(&"fault_hold".to_owned()),
        "it records the names it registers: {w:?}"
    );

    child.start_kill().unwrap();
    let killed = std::time::Instant::now();
    child.wait().await.unwrap();
    let lost = loop {
        let workers = client.workers().await.unwrap();
        let w = workers.into_iter().find(|w| w.id == id).unwrap();
        if w.status == taskq::client::WorkerStatus::Lost {
            break w;
        }
        assert!(
            killed.elapsed() < 2 * heartbeat + Duration::from_secs(1),
            "still {} {:?} after the kill: {w:?}",
            w.status,
            killed.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let after = killed.elapsed();
    // (Shown with --nocapture: the figure docs/semantics.md quotes.)
    println!(
        "{}: lost {after:?} after the kill (heartbeat {heartbeat:?}, last seen {:?} before)",
        db.label(),
        lost.last_seen_ago
    );
    assert!(!lost.alive && lost.stopped_at.is_none(), "{lost:?}");
    assert!(lost.last_seen_ago >= 2 * heartbeat, "{lost:?}");
    assert_eq!(lost.running, 1, "it still holds its task: {lost:?}");
    // The task is still claimed under the lost worker's id, its lease far from over.
    let held = db
        .count(&format!(
            "id = {task} AND state = 'running' AND worker_id = '{id}' AND lease_until > {}",
            db.from_now(Duration::from_secs(25))
        ))
        .await;
    assert_eq!(
        held, 1,
        "lost {after:?} after the kill, lease still running"
    );
}

taskq_tests::conformance!(a_killed_worker_is_lost_within_two_heartbeats_while_its_lease_runs);
