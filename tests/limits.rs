//! Fleet-wide queue limits against a real database: a concurrency limit held across worker
//! processes and raised live, a rate limit held across workers, clearing and lowering limits,
//! validation, and that claims of unlimited queues never touch the queue's row.

#[path = "limits_support/mod.rs"]
mod limits_support;

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use limits_support::{Nap, QUEUE};
use taskq::{Client, Error, Task, TaskContext, TaskError, defaults::MAX_QUEUE_LIMIT};
use taskq_tests::backends::{Db, TestBackend};
use taskq_tests::{RunningWorker, TestDb, wait_until};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

/// Worker processes of the fleet test, and handler slots in each.
const PROCESSES: usize = 4;
const SLOTS: usize = 8;

fn limit_worker_exe() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_taskq-limit-worker"))
}

/// A running `taskq-limit-worker`.
struct FleetWorker {
    id: String,
    child: tokio::process::Child,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
}

impl FleetWorker {
    async fn start(url: &str, id: String) -> Self {
        let mut child = Command::new(limit_worker_exe())
            .args([
                "--url",
                url,
                "--id",
                &id,
                "--concurrency",
                &SLOTS.to_string(),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", limit_worker_exe().display()));
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let ready = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("the worker is ready within 30 s")
            .unwrap()
            .unwrap_or_default();
        assert_eq!(ready, format!("ready {id}"));
        Self { id, child, lines }
    }

    /// SIGTERM, then the counters of its report.
    async fn stop(mut self) -> serde_json::Value {
        let status = std::process::Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().expect("running").to_string())
            .status()
            .expect("run kill");
        assert!(status.success());
        let exit = async {
            let mut report = None;
            while let Some(line) = self.lines.next_line().await.expect("read child stdout") {
                if let Some(json) = line.strip_prefix("report ") {
                    report = Some(serde_json::from_str::<serde_json::Value>(json).unwrap());
                }
            }
            (self.child.wait().await.unwrap(), report)
        };
        let (status, report) = tokio::time::timeout(Duration::from_secs(30), exit)
            .await
            .expect("the worker exits within 30 s of SIGTERM");
        assert_eq!(status.code(), Some(0), "{}: exit status {status}", self.id);
        report.expect("the worker printed its report")["stats"].clone()
    }
}

/// Counts the running tasks of `queue` every 5 ms on its own connection until stopped.
struct Sampler {
    stop: Arc<AtomicBool>,
    handle: tokio::task::JoinHandle<Vec<i64>>,
}

impl Sampler {
    async fn start<B: TestBackend>(db: &Db<B>, queue: &'static str) -> Self {
        let pool = db.another_pool(1).await;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = tokio::spawn(async move {
            let mut samples = Vec::new();
            while !flag.load(Ordering::Acquire) {
                let sql = format!(
                    "SELECT COUNT(*) FROM taskq_tasks WHERE state = 'running' AND queue = '{queue}'"
                );
                samples.push(B::scalar(&pool, &sql).await);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            samples
        });
        Self { stop, handle }
    }

    async fn finish(self) -> Vec<i64> {
        self.stop.store(true, Ordering::Release);
        self.handle.await.expect("sampler did not panic")
    }
}

async fn running<B: TestBackend>(db: &Db<B>, queue: &str) -> i64 {
    db.count(&format!("state = 'running' AND queue = '{queue}'"))
        .await
}

/// Enqueues `n` naps of `ms` milliseconds each (jittered by up to half) in one transaction.
async fn enqueue_naps<B: TestBackend>(db: &Db<B>, n: usize, ms: u64) {
    let mut tx = db.begin().await;
    let naps = (0..n).map(|_| Nap {
        ms: ms + fastrand::u64(..=ms / 2),
    });
    taskq::enqueue::enqueue_many(&mut tx, naps).await.unwrap();
    tx.commit().await.unwrap();
}

async fn succeeded<B: TestBackend>(db: &Db<B>, queue: &str) -> i64 {
    db.count(&format!("state = 'succeeded' AND queue = '{queue}'"))
        .await
}

fn mean(samples: &[i64]) -> f64 {
    samples.iter().sum::<i64>() as f64 / samples.len().max(1) as f64
}

/// THE FLEET TEST: 4 worker processes of 8 slots each on a queue limited to 3. Throughout the
/// drain, the running count sampled every 5 ms on its own connection never exceeds 3, and is
/// reached. Then the limit is raised to 32 without restarting anything, and a second batch
/// runs with many more tasks at once.
async fn four_processes_never_run_more_than_the_limit_and_scale_up_when_it_is_raised<
    B: TestBackend,
>(
    db: Db<B>,
) {
    let client = Client::new(db.pool.clone());
    let url = db.url();
    client.set_queue_limit(QUEUE, Some(3)).await.unwrap();
    let mut fleet = Vec::new();
    for i in 0..PROCESSES {
        fleet.push(FleetWorker::start(&url, format!("limit-{i}")).await);
    }

    // Batch 1 at limit 3.
    const FIRST: usize = 60;
    let sampler = Sampler::start(&db, QUEUE).await;
    let t1 = Instant::now();
    enqueue_naps(&db, FIRST, 60).await;
    wait_until(Duration::from_secs(120), "first batch drained", || async {
        succeeded(&db, QUEUE).await == FIRST as i64
    })
    .await;
    let took1 = t1.elapsed();
    let samples1 = sampler.finish().await;
    let max1 = *samples1.iter().max().unwrap();
    let at_limit = samples1.iter().filter(|&&n| n == 3).count();

    // Raise the limit live; batch 2.
    const SECOND: usize = 256;
    client.set_queue_limit(QUEUE, Some(32)).await.unwrap();
    let sampler = Sampler::start(&db, QUEUE).await;
    let t2 = Instant::now();
    enqueue_naps(&db, SECOND, 60).await;
    wait_until(Duration::from_secs(120), "second batch drained", || async {
        succeeded(&db, QUEUE).await == (FIRST + SECOND) as i64
    })
    .await;
    let took2 = t2.elapsed();
    let samples2 = sampler.finish().await;
    let max2 = *samples2.iter().max().unwrap();
    // The concurrency while the second batch was being worked (from the first sample with a
    // running task to the last one).
    let busy2: Vec<i64> = {
        let first = samples2.iter().position(|&n| n > 0).unwrap_or(0);
        let last = samples2.iter().rposition(|&n| n > 0).unwrap_or(0);
        samples2[first..=last].to_vec()
    };

    let mut limited = 0;
    let mut claimed = 0;
    for w in fleet {
        let stats = w.stop().await;
        limited += stats["claims_limited"].as_u64().unwrap();
        claimed += stats["claimed"].as_u64().unwrap();
    }
    eprintln!(
        "limit 3: {FIRST} tasks in {took1:?} ({:.0}/s), {} samples, max {max1}, {at_limit} at 3, mean {:.2}; \
         limit 32: {SECOND} tasks in {took2:?} ({:.0}/s), {} samples, max {max2}, mean while busy {:.2}; \
         claims cut short by the limit: {limited}",
        FIRST as f64 / took1.as_secs_f64(),
        samples1.len(),
        mean(&samples1),
        SECOND as f64 / took2.as_secs_f64(),
        samples2.len(),
        mean(&busy2),
    );
    assert!(
        max1 <= 3,
        "running count exceeded the limit of 3: max {max1}"
    );
    assert!(at_limit >= 1, "the limit of 3 was never reached");
    assert!(samples1.len() >= 20, "too few samples: {}", samples1.len());
    assert!(
        max2 >= 12,
        "raising the limit to 32 did not raise the concurrency: max {max2}"
    );
    assert!(max2 <= 32, "running count exceeded the limit of 32: {max2}");
    assert!(
        mean(&busy2) > 6.0,
        "mean concurrency with limit 32 stayed low: {:.2}",
        mean(&busy2)
    );
    assert!(limited > 0, "no claim was cut short by the limit");
    assert_eq!(claimed, (FIRST + SECOND) as u64, "each task claimed once");
}

/// Records when each task of queue `rated` was claimed (the claim statement's database
/// clock), by a trigger on the claim's state change; and the SQL of a claim's one-second
/// window (seconds since the Unix epoch). Triggers and time types are the two dialects' own.
const CLAIM_LOG_MYSQL: [&str; 3] = [
    "CREATE TABLE limit_claims (
         task_id BIGINT UNSIGNED NOT NULL PRIMARY KEY,
         at      DATETIME(6) NOT NULL
     ) ENGINE = InnoDB",
    "CREATE TRIGGER limit_claims_log AFTER UPDATE ON taskq_tasks FOR EACH ROW
       IF OLD.state = 'pending' AND NEW.state = 'running' AND NEW.queue = 'rated' THEN
         INSERT INTO limit_claims (task_id, at) VALUES (NEW.id, UTC_TIMESTAMP(6));
       END IF",
    "TIMESTAMPDIFF(MICROSECOND, '1970-01-01', at) DIV 1000000",
];
const CLAIM_LOG_SQLITE: [&str; 3] = [
    "CREATE TABLE limit_claims (task_id INTEGER NOT NULL PRIMARY KEY, at INTEGER NOT NULL)",
    "CREATE TRIGGER limit_claims_log AFTER UPDATE ON taskq_tasks FOR EACH ROW
       WHEN OLD.state = 'pending' AND NEW.state = 'running' AND NEW.queue = 'rated'
       BEGIN
         INSERT INTO limit_claims (task_id, at) VALUES (NEW.id, (SELECT us FROM taskq_clock));
       END",
    "at / 1000000",
];

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Quick(u32);

impl Task for Quick {
    const NAME: &'static str = "limit_quick";
    const QUEUE: &'static str = "rated";
    async fn run(self, _cx: TaskContext) -> Result<(), TaskError> {
        Ok(())
    }
}

/// A rate limit of 5 per second across three workers: no one-second window of the database
/// clock holds more than 5 claims, so 20 tasks take at least 4 windows.
async fn a_rate_limit_holds_per_window_across_workers<B: TestBackend>(db: Db<B>) {
    let [table, trigger, window] = match db.label() {
        "mysql" => CLAIM_LOG_MYSQL,
        _ => CLAIM_LOG_SQLITE,
    };
    db.exec(table).await;
    db.exec(trigger).await;
    let client = Client::new(db.pool.clone());
    client
        .set_queue_rate_limit("rated", Some((5, Duration::from_secs(1))))
        .await
        .unwrap();
    let workers: Vec<RunningWorker> = (0..3)
        .map(|_| RunningWorker::spawn(db.worker().register::<Quick>().queue("rated", 8)))
        .collect();
    const N: u32 = 20;
    let mut tx = db.begin().await;
    taskq::enqueue::enqueue_many(&mut tx, (0..N).map(Quick))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    wait_until(Duration::from_secs(60), "all rated tasks done", || async {
        succeeded(&db, "rated").await == i64::from(N)
    })
    .await;
    let info = client.queues().await.unwrap();
    let rated = info.iter().find(|q| q.queue == "rated").unwrap();
    assert_eq!(
        rated.rate_limit,
        Some(taskq::client::RateLimit {
            max: 5,
            period: Duration::from_secs(1)
        })
    );
    assert!(rated.rate_used <= 5, "{rated:?}");
    let mut limited = 0;
    for w in workers {
        limited += w.stop().await.stats.claims_limited;
    }
    let windows: Vec<(i64, i64)> = db
        .rows(
            &[window, "COUNT(*)"],
            &format!("FROM limit_claims GROUP BY {window} ORDER BY {window}"),
        )
        .await
        .iter()
        .map(|r| (r[0].parse().unwrap(), r[1].parse().unwrap()))
        .collect();
    eprintln!("claims per one-second window: {windows:?}; claims cut short: {limited}");
    assert_eq!(
        windows.iter().map(|w| w.1).sum::<i64>(),
        i64::from(N),
        "every task claimed once"
    );
    assert!(
        windows.iter().all(|w| w.1 <= 5),
        "a window held more than 5 claims: {windows:?}"
    );
    assert!(windows.len() >= 4, "{windows:?}");
    assert!(limited > 0);
}

/// Invalid limits are typed errors and write nothing.
async fn invalid_limits_are_rejected_and_write_nothing<B: TestBackend>(db: Db<B>) {
    let client = Client::new(db.pool.clone());
    let invalid = |e: Error| {
        assert!(matches!(e, Error::InvalidOption(_)), "{e:?}");
        e.to_string()
    };
    let msg = invalid(client.set_queue_limit("q", Some(0)).await.unwrap_err());
    assert!(msg.contains("between 1 and 1000000"), "{msg}");
    invalid(
        client
            .set_queue_limit("q", Some(MAX_QUEUE_LIMIT + 1))
            .await
            .unwrap_err(),
    );
    invalid(
        client
            .set_queue_rate_limit("q", Some((0, Duration::from_secs(1))))
            .await
            .unwrap_err(),
    );
    invalid(
        client
            .set_queue_rate_limit("q", Some((MAX_QUEUE_LIMIT + 1, Duration::from_secs(1))))
            .await
            .unwrap_err(),
    );
    let msg = invalid(
        client
            .set_queue_rate_limit("q", Some((5, Duration::ZERO)))
            .await
            .unwrap_err(),
    );
    assert!(msg.contains("period"), "{msg}");
    invalid(
        client
            .set_queue_rate_limit(
                "q",
                Some((5, taskq::defaults::MAX_RATE_PERIOD + Duration::from_secs(1))),
            )
            .await
            .unwrap_err(),
    );
    let e = client.set_queue_limit("", Some(3)).await.unwrap_err();
    assert!(matches!(e, Error::InvalidName { .. }), "{e:?}");
    let rows = db.scalar("SELECT COUNT(*) FROM taskq_queues").await;
    assert_eq!(rows, 0, "nothing written");
    assert!(client.queues().await.unwrap().is_empty());

    // Valid ones are stored, and listed; clearing one keeps the other.
    client.set_queue_limit("q", Some(7)).await.unwrap();
    client
        .set_queue_rate_limit("q", Some((100, Duration::from_secs(60))))
        .await
        .unwrap();
    client.set_queue_limit("q", None).await.unwrap();
    // Clearing a queue that was never limited writes nothing.
    client.set_queue_limit("other", None).await.unwrap();
    client.set_queue_rate_limit("other", None).await.unwrap();
    let queues = client.queues().await.unwrap();
    assert_eq!(queues.len(), 1, "{queues:?}");
    assert_eq!(queues[0].queue, "q");
    assert_eq!(queues[0].concurrency_limit, None);
    assert_eq!(
        queues[0].rate_limit.map(|r| (r.max, r.period)),
        Some((100, Duration::from_secs(60)))
    );
    assert!(queues[0].paused_at.is_none());
}

/// A limit set while a worker runs holds once the worker re-read the queue controls; clearing
/// it lets the worker fill its slots again; `Client::queues` shows the limit and the counts.
async fn a_limit_set_live_holds_and_clearing_it_lifts_it<B: TestBackend>(db: Db<B>) {
    let client = Client::new(db.pool.clone());
    // poll_max 100 ms: the worker re-reads the queue controls every 100 ms.
    let worker = RunningWorker::spawn(db.worker().register::<Nap>().queue(QUEUE, 8));
    tokio::time::sleep(Duration::from_millis(200)).await;
    client.set_queue_limit(QUEUE, Some(2)).await.unwrap();
    // Ten times the refresh interval.
    tokio::time::sleep(Duration::from_secs(1)).await;
    enqueue_naps(&db, 12, 300).await;
    let sampler = Sampler::start(&db, QUEUE).await;
    wait_until(Duration::from_secs(30), "two running", || async {
        running(&db, QUEUE).await == 2
    })
    .await;
    let info = client.queues().await.unwrap();
    assert_eq!(info.len(), 1, "{info:?}");
    assert_eq!(info[0].queue, QUEUE);
    assert_eq!(info[0].concurrency_limit, Some(2));
    assert!((1..=2).contains(&info[0].running), "{info:?}");
    assert!(info[0].pending >= 6, "{info:?}");
    tokio::time::sleep(Duration::from_millis(700)).await;
    let limited = sampler.finish().await;
    assert!(
        limited.iter().all(|&n| n <= 2),
        "more than 2 running: {limited:?}"
    );
    client.set_queue_limit(QUEUE, None).await.unwrap();
    wait_until(
        Duration::from_secs(30),
        "slots filled once cleared",
        || async { running(&db, QUEUE).await >= 4 },
    )
    .await;
    wait_until(Duration::from_secs(30), "all done", || async {
        succeeded(&db, QUEUE).await == 12
    })
    .await;
    let report = worker.stop().await;
    assert!(report.stats.claims_limited > 0);
}

/// Lowering a limit below the running count stops nothing, and starts nothing new until the
/// queue is under the new limit.
async fn lowering_a_limit_lets_running_tasks_finish_and_starts_nothing_above_it<B: TestBackend>(
    db: Db<B>,
) {
    let client = Client::new(db.pool.clone());
    client.set_queue_limit(QUEUE, Some(4)).await.unwrap();
    let worker = RunningWorker::spawn(db.worker().register::<Nap>().queue(QUEUE, 8));
    enqueue_naps(&db, 8, 800).await;
    wait_until(Duration::from_secs(30), "four running", || async {
        running(&db, QUEUE).await == 4
    })
    .await;
    client.set_queue_limit(QUEUE, Some(1)).await.unwrap();
    let sampler = Sampler::start(&db, QUEUE).await;
    wait_until(Duration::from_secs(30), "the first four done", || async {
        succeeded(&db, QUEUE).await >= 4
    })
    .await;
    wait_until(Duration::from_secs(30), "one more running", || async {
        running(&db, QUEUE).await == 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let samples = sampler.finish().await;
    // Never up while above the new limit: non-increasing until at most 1, then at most 1.
    let under = samples.iter().position(|&n| n <= 1).expect("went under");
    assert!(
        samples[..under].windows(2).all(|w| w[1] <= w[0]),
        "a task started while above the lowered limit: {samples:?}"
    );
    assert!(
        samples[under..].iter().all(|&n| n <= 1),
        "more than 1 running after the limit was lowered: {samples:?}"
    );
    assert!(
        samples[0] >= 2,
        "the running tasks were not stopped: {samples:?}"
    );
    let _ = worker.stop().await;
}

/// Claims of a queue without limits never lock its row (a worker drains it while another
/// transaction holds that row), while claims of a limited queue wait for it.
// MySQL only: InnoDB row locks (SQLite's claims never overlap another writer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_limited_queues_take_the_queue_row_lock() {
    #[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
    struct Free(u32);
    impl Task for Free {
        const NAME: &'static str = "limit_free";
        const QUEUE: &'static str = "free";
        async fn run(self, _cx: TaskContext) -> Result<(), TaskError> {
            Ok(())
        }
    }
    #[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
    struct Capped(u32);
    impl Task for Capped {
        const NAME: &'static str = "limit_capped";
        const QUEUE: &'static str = "capped";
        async fn run(self, _cx: TaskContext) -> Result<(), TaskError> {
            Ok(())
        }
    }
    let Some(db) = TestDb::new_or_skip().await else {
        return;
    };
    let db = Db::from_test_db(db);
    let client = Client::new(db.pool.clone());
    // Both queues have a row; only `capped` has a limit.
    client.set_queue_limit("free", Some(5)).await.unwrap();
    client.set_queue_limit("free", None).await.unwrap();
    client.set_queue_limit("capped", Some(5)).await.unwrap();
    let mut tx = db.pool.begin().await.unwrap();
    taskq::enqueue::enqueue_many(&mut tx, (0..20).map(Free))
        .await
        .unwrap();
    taskq::enqueue::enqueue_many(&mut tx, (0..20).map(Capped))
        .await
        .unwrap();
    tx.commit().await.unwrap();

    let mut holder = db.pool.begin().await.unwrap();
    let locked: Vec<String> =
        sqlx::query_scalar("SELECT queue FROM taskq_queues ORDER BY queue FOR UPDATE")
            .fetch_all(&mut *holder)
            .await
            .unwrap();
    assert_eq!(locked, ["capped", "free"]);
    let worker = RunningWorker::spawn(
        db.worker()
            .register::<Free>()
            .register::<Capped>()
            .queue("free", 8)
            .queue("capped", 8)
            // Statement deadline (half the lease) 2 s: a claim waiting for the lock gives up
            // and retries.
            .lease(Duration::from_secs(4))
            .heartbeat(Duration::from_secs(1)),
    );
    wait_until(
        Duration::from_secs(10),
        "free drained under the lock",
        || async { succeeded(&db, "free").await == 20 },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        db.count("queue = 'capped' AND state <> 'pending'").await,
        0,
        "a claim of the limited queue went past the locked row"
    );
    holder.commit().await.unwrap();
    wait_until(Duration::from_secs(30), "capped drained", || async {
        succeeded(&db, "capped").await == 20
    })
    .await;
    let report = worker.stop().await;
    assert_eq!(report.stats.succeeded, 40);
}

taskq_tests::conformance!(
    four_processes_never_run_more_than_the_limit_and_scale_up_when_it_is_raised,
    a_rate_limit_holds_per_window_across_workers,
    invalid_limits_are_rejected_and_write_nothing,
    a_limit_set_live_holds_and_clearing_it_lifts_it,
    lowering_a_limit_lets_running_tasks_finish_and_starts_nothing_above_it,
);
