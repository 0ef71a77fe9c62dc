//! The worker's connection footprint (docs/operations.md, "Sizing"): two lanes, control
//! (renewals, presence, pause refresh) and work (claims, write-backs, maintenance, scheduler),
//! `1 + min(queues, concurrency) + 1` connections by default above one slot; a single-slot
//! worker holds 1 on MySQL (both lanes share it) and 2 on SQLite.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use taskq::worker::Retention;
use taskq::{Task, TaskContext, TaskError, schedule::Schedule};
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

/// A single-slot worker's connections: 1 on MySQL, 2 on SQLite.
fn single_slot_footprint<B: TestBackend>() -> u64 {
    if B::LABEL == "mysql" { 1 } else { 2 }
}

/// A single-slot worker kept busy on every loop at once — short tasks claimed and written
/// back one at a time, leases renewed every 50 ms, a schedule firing every second, the reaper,
/// retention, the pause refresh and the backlog gauge every 100 ms — never holds more than
/// its connections, 1 on MySQL and 2 on SQLite (counted by its pools, and on MySQL by the
/// server's session list).
async fn a_busy_single_slot_worker_with_a_schedule_holds_its_connections<B: TestBackend>(
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
    assert_eq!(s.db_connections_max, single_slot_footprint::<B>(), "{s:?}");
    if B::LABEL == "mysql" {
        let peak = sessions.load(Ordering::Relaxed);
        assert!(
            peak <= before + 1,
            "server sessions: {before} before the worker, {peak} at the peak"
        );
        assert!(peak > before, "the sampler saw the worker's sessions");
    }
}

/// The default grows with the claim loops that can claim at once, plus one for write-backs
/// when more than one handler can run; `db_connections` sets the total (at least 1 on MySQL,
/// 2 on SQLite).
async fn the_default_footprint_follows_queues_and_concurrency<B: TestBackend>(db: Db<B>) {
    let single = single_slot_footprint::<B>();
    for (queues, concurrency, explicit, want) in [
        (1, 4, None, 3u64),
        (2, 1, None, single),
        (1, 4, Some(2), 2),
        (1, 4, Some(1), single),
    ] {
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
            s.db_connections_max <= want && s.db_connections_max >= single,
            "queues {queues}, concurrency {concurrency}, db_connections {explicit:?}: {s:?}"
        );
    }
}

/// SQLite: `build` refuses a lease that leaves a renewal less than two tries of its 100 ms
/// busy timeout between its heartbeat and the watchdog's cancel point (`lease − heartbeat −
/// min(cancel grace, lease / 2) < 200 ms`), with the numbers and the shortest lease that
/// fits, whatever the pool's busy timeout (issue 34; before, that margin had to be at least
/// the pool's busy timeout: 15 s with the default 5 s). MySQL has no such rule.
async fn a_lease_that_leaves_a_renewal_no_time_is_refused_on_sqlite<B: TestBackend>(db: Db<B>) {
    let build = |pool: &sqlx::Pool<B>, lease: u64| {
        taskq::Worker::builder(pool.clone())
            .register::<Busy>()
            .lease(Duration::from_millis(lease))
            .build()
    };
    if B::LABEL == "mysql" {
        assert!(build(&db.pool, 1_000).is_ok());
        return;
    }
    // taskq's own settings: a 5 s busy timeout. With the default heartbeat (a third) and
    // cancel grace (half the lease up to 5 s) a lease leaves a sixth of itself: 2 s (refused
    // before issue 34) and 1.2 s fit, 1.1 s does not.
    let url = B::url(&db);
    let sqlite = taskq::sqlite::connect(&url).await.unwrap();
    let default_busy = |lease| {
        taskq::Worker::builder(sqlite.clone())
            .register::<Busy>()
            .lease(Duration::from_millis(lease))
            .build()
    };
    assert!(default_busy(2_000).is_ok());
    assert!(default_busy(1_200).is_ok());
    let err = default_busy(1_100).err().expect("a 1.1 s lease is refused");
    let taskq::Error::LeaseBelowBusyTimeout {
        lease,
        busy_timeout,
        tolerated,
        min_lease,
        ..
    } = &err
    else {
        panic!("{err:?}");
    };
    assert_eq!(
        (*lease, *busy_timeout, *min_lease),
        (
            Duration::from_millis(1_100),
            Duration::from_millis(100),
            Duration::from_millis(1_200)
        )
    );
    assert!(*tolerated < Duration::from_millis(200), "{tolerated:?}");
    let text = err.to_string();
    assert!(
        text.contains("tries of 100ms") && text.contains("at least 1.2s"),
        "{text}"
    );
    // The test pools' 1 s busy timeout: the same floor.
    assert!(build(&db.pool, 1_200).is_ok());
    assert!(matches!(
        build(&db.pool, 1_100),
        Err(taskq::Error::LeaseBelowBusyTimeout { .. })
    ));
}

/// Holds its slot for `ms`, several leases long, then succeeds.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Long {
    ms: u64,
}

impl Task for Long {
    const NAME: &'static str = "footprint_long";
    const QUEUE: &'static str = QUEUE;
    async fn run(self, cx: TaskContext) -> Result<(), TaskError> {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(self.ms)) => Ok(()),
            r = cx.cancel_signal().canceled() => Err(TaskError::retry(format!("canceled: {r:?}"))),
        }
    }
}

/// The renewals of a single-slot worker go first on the connection the lanes share (MySQL),
/// ahead of the other loops — a schedule firing every second, the reaper, retention and
/// the backlog gauge every 100 ms — and still keep a lease of 3 s alive through tasks of 7 s
/// (seven renewals each): each succeeds at its first attempt, no lease is lost.
async fn a_single_slot_worker_keeps_long_leases_while_its_loops_run<B: TestBackend>(db: Db<B>) {
    if B::LABEL != "mysql" {
        return; // The lanes are apart on SQLite (2 connections): nothing is shared.
    }
    for _ in 0..3 {
        Long { ms: 7_000 }.enqueue(&db.pool).await.unwrap();
    }
    let w = RunningWorker::spawn(
        db.worker()
            .register::<Long>()
            .schedule(Schedule::new("* * * * * *", Tick {}))
            .queue(QUEUE, 1)
            .lease(Duration::from_secs(3))
            .retention(Retention {
                interval: Duration::from_millis(100),
                ..Retention::default()
            })
            .backlog_metrics(Duration::from_millis(100)),
    );
    let done =
        "SELECT COUNT(*) FROM taskq_tasks WHERE name = 'footprint_long' AND state = 'succeeded'";
    wait_until(Duration::from_secs(60), "the three long tasks", || async {
        B::scalar(&db.pool, done).await == 3
    })
    .await;
    let s = w.stop().await.stats;
    assert_eq!(s.db_connections_max, 1, "{s:?}");
    assert_eq!((s.lost_leases, s.retried, s.fenced), (0, 0, 0), "{s:?}");
    assert!(
        s.scheduled >= 2,
        "the schedule fired while the tasks ran: {s:?}"
    );
    let again = B::scalar(
        &db.pool,
        "SELECT COUNT(*) FROM taskq_tasks WHERE name = 'footprint_long' AND attempt > 1",
    )
    .await;
    assert_eq!(again, 0, "long tasks that ran more than one attempt");
}

/// Finding L1 of issue 34, MySQL only (a row lock held by another session; on SQLite the
/// lanes are apart): a single-slot worker (both lanes on one connection), lease 6 s (default
/// heartbeat 2 s and cancel grace 3 s: a renewal must be confirmed within 1 s of its beat), a
/// schedule firing every second on its queue, a 10 s task. Another session holds the
/// schedule's row `FOR UPDATE` for 4 s, so each fire waits on it while holding the worker's
/// only connection. The renewals still get through in time, on the overflow connection: no
/// lease lost, the task runs once, and the worker had at most 2 connections. Before the fix
/// the fire held the connection up to its statement timeout (half the lease, 3 s) and the
/// renewal behind it was confirmed too late: `LeaseLost`, a second attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_slot_worker_keeps_its_lease_while_a_fire_waits_on_a_locked_schedule_row() {
    let Some(db) = taskq_tests::TestDb::new_or_skip().await else {
        return;
    };
    Long { ms: 10_000 }.enqueue(&db.pool).await.unwrap();
    let w = RunningWorker::spawn(
        taskq_tests::fast_worker(&db.pool)
            .register::<Long>()
            .schedule(Schedule::new("* * * * * *", Tick {}).name("l1_every_second"))
            .queue(QUEUE, 1)
            .lease(Duration::from_secs(6)),
    );
    wait_until(
        Duration::from_secs(20),
        "the task and a first fire",
        || async {
            let s = w.stats.snapshot();
            s.claimed >= 1 && s.scheduled >= 1
        },
    )
    .await;
    // Hold the schedule's row: every fire waits on it.
    let holder = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(1)
        .connect_with(db.options.clone())
        .await
        .unwrap();
    let mut tx = holder.begin().await.unwrap();
    sqlx::query("SELECT name FROM taskq_schedules WHERE name = ? FOR UPDATE")
        .bind("l1_every_second")
        .execute(&mut *tx)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(4)).await;
    tx.commit().await.unwrap();
    let done =
        "SELECT COUNT(*) FROM taskq_tasks WHERE name = 'footprint_long' AND state = 'succeeded'";
    wait_until(Duration::from_secs(30), "the long task", || async {
        sqlx::query_scalar::<_, i64>(done)
            .fetch_one(&db.pool)
            .await
            .unwrap()
            == 1
    })
    .await;
    let s = w.stop().await.stats;
    eprintln!("single slot, lease 6 s, schedule row held 4 s: {s:?}");
    assert_eq!(
        s.db_connections_max, 2,
        "the shared connection and the overflow a renewal turned to: {s:?}"
    );
    assert_eq!((s.lost_leases, s.retried, s.fenced), (0, 0, 0), "{s:?}");
    let attempts: i64 = sqlx::query_scalar(
        "SELECT CAST(attempt AS SIGNED) FROM taskq_tasks WHERE name = 'footprint_long'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        attempts, 1,
        "the long task ran more than one attempt: {s:?}"
    );
}

taskq_tests::conformance!(
    a_lease_that_leaves_a_renewal_no_time_is_refused_on_sqlite,
    a_busy_single_slot_worker_with_a_schedule_holds_its_connections,
    a_single_slot_worker_keeps_long_leases_while_its_loops_run,
    the_default_footprint_follows_queues_and_concurrency,
);

/// SQLite: the worker's statements wait for the write lock as long as the busy timeout of
/// the pool it was built with, not taskq's default 5 s. The pool here waits 300 ms; another
/// connection holds the lock for 1.2 s (under the worker's 1.5 s statement deadline): the
/// worker's claims fail with "database is locked" meanwhile, and it goes on after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_the_worker_keeps_the_pools_busy_timeout() {
    use sqlx::Sqlite;
    let db = <Sqlite as TestBackend>::create()
        .await
        .expect("a SQLite file");
    let url = <Sqlite as TestBackend>::url(&db);
    let opts = taskq_sqlite::connect_options_from_url(&url)
        .unwrap()
        .busy_timeout(Duration::from_millis(300));
    let pool = taskq_sqlite::connect::open_with(opts, 2).await.unwrap();
    for n in 0..4 {
        Busy { n }.enqueue(&db.pool).await.unwrap();
    }
    let w = RunningWorker::spawn(
        taskq_tests::fast_worker(&pool)
            .register::<Busy>()
            .queue(QUEUE, 1)
            .lease(Duration::from_secs(3))
            .heartbeat(Duration::from_millis(500))
            .cancel_grace(Duration::from_millis(500)),
    );
    wait_until(Duration::from_secs(20), "the first tasks", || async {
        w.stats.snapshot().succeeded >= 4
    })
    .await;
    let errors_before = w.stats.snapshot().db_errors;
    // `BEGIN IMMEDIATE` takes the write lock until the commit.
    let holder = taskq::sqlite::begin(&db.pool).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    holder.commit().await.unwrap();
    let s = w.stats.snapshot();
    assert!(
        s.db_errors > errors_before,
        "no statement gave up within the 300 ms busy timeout: {s:?}"
    );
    assert_eq!(s.statement_timeouts, 0, "{s:?}");
    for n in 4..8 {
        Busy { n }.enqueue(&db.pool).await.unwrap();
    }
    wait_until(
        Duration::from_secs(20),
        "the tasks after the hold",
        || async { w.stats.snapshot().succeeded >= 8 },
    )
    .await;
    w.stop().await;
}
