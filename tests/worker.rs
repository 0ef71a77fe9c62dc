//! The worker against a real database: execution, retries, dead letters, panics, timeouts,
//! reaping, lease loss, shutdown, retention, several workers at once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use taskq::{
    Backoff, Client, Error, ResultExt, Task, TaskContext, TaskError, TaskId, TaskState,
    client::DeadReason,
};
use taskq_tests::backends::{Db, TestBackend, blob};
use taskq_tests::{RunningWorker, TestDb, wait_until};

/// Execution counts by task number, shared with handlers as worker state.
#[derive(Clone, Default)]
struct Runs(Arc<Mutex<HashMap<u32, u32>>>);

impl Runs {
    fn get(&self, n: u32) -> u32 {
        self.0.lock().unwrap().get(&n).copied().unwrap_or(0)
    }
    fn total(&self) -> usize {
        self.0.lock().unwrap().len()
    }
    fn all_once(&self) -> bool {
        self.0.lock().unwrap().values().all(|c| *c == 1)
    }
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
enum Mode {
    Ok,
    FailTimes(u32),
    Permanent,
    Panic,
    Sleep(u64),
    RetryAfterMs(u64),
    /// Query a table that does not exist; the error is permanent.
    MissingTable,
    /// Wait for the cancel signal, then record it and return Ok.
    WaitCancel,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Job {
    n: u32,
    mode: Mode,
}

impl Task for Job {
    const NAME: &'static str = "job";
    const MAX_ATTEMPTS: u32 = 3;
    const BACKOFF: Backoff = Backoff::constant(Duration::from_millis(50));
    async fn run(self, cx: TaskContext) -> Result<(), TaskError> {
        let runs = cx.data::<Runs>().expect("Runs data registered");
        let count = {
            let mut m = runs.0.lock().unwrap();
            let c = m.entry(self.n).or_default();
            *c += 1;
            *c
        };
        match self.mode {
            Mode::Ok => Ok(()),
            Mode::FailTimes(k) if count <= k => Err(TaskError::msg(format!("failure {count}"))),
            Mode::FailTimes(_) => Ok(()),
            Mode::Permanent => Err(TaskError::permanent(std::io::Error::other("bad input"))),
            Mode::Panic => panic!("boom {}", self.n),
            Mode::Sleep(ms) => {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                Ok(())
            }
            Mode::RetryAfterMs(ms) => Err(TaskError::retry_after(
                Duration::from_millis(ms),
                std::io::Error::other("not yet"),
            )),
            Mode::MissingTable => {
                let sql = "SELECT 1 FROM no_such_table";
                match cx.data::<sqlx::MySqlPool>() {
                    Some(pool) => sqlx::query(sql).execute(&pool).await.map(drop),
                    None => {
                        let pool = cx.data::<sqlx::SqlitePool>().expect("pool data registered");
                        sqlx::query(sql).execute(&pool).await.map(drop)
                    }
                }
                .permanent()?;
                Ok(())
            }
            Mode::WaitCancel => {
                let reason = cx.cancel_signal().canceled().await;
                runs.0.lock().unwrap().insert(1000 + self.n, reason as u32);
                Ok(())
            }
        }
    }
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Slow;
impl Task for Slow {
    const NAME: &'static str = "slow";
    const MAX_ATTEMPTS: u32 = 2;
    const TIMEOUT: Option<Duration> = Some(Duration::from_millis(200));
    async fn run(self, _cx: TaskContext) -> Result<(), TaskError> {
        tokio::time::sleep(Duration::from_secs(30)).await;
        Ok(())
    }
}

async fn job<B: TestBackend>(db: &Db<B>, n: u32, mode: Mode) -> TaskId {
    Job { n, mode }.enqueue(&db.pool).await.unwrap().id
}

async fn state_of<B: TestBackend>(db: &Db<B>, id: TaskId) -> taskq::client::TaskInfo {
    Client::new(db.pool.clone()).get(id).await.unwrap()
}

async fn wait_state<B: TestBackend>(
    db: &Db<B>,
    id: TaskId,
    state: TaskState,
) -> taskq::client::TaskInfo {
    let client = Client::new(db.pool.clone());
    wait_until(
        Duration::from_secs(20),
        &format!("task {id} {state}"),
        || {
            let client = client.clone();
            async move { client.get(id).await.is_ok_and(|t| t.state == state) }
        },
    )
    .await;
    state_of(db, id).await
}

fn worker<B: TestBackend>(db: &Db<B>, runs: &Runs) -> taskq::worker::WorkerBuilder {
    db.worker()
        .register::<Job>()
        .register::<Slow>()
        .data(runs.clone())
        .data(db.pool.clone())
}

async fn runs_tasks_and_records_success<B: TestBackend>(db: Db<B>) {
    let runs = Runs::default();
    let ids: Vec<TaskId> = futures_lite_join(&db, 0..50, Mode::Ok).await;
    let w = RunningWorker::spawn(worker(&db, &runs));
    wait_until(Duration::from_secs(20), "50 succeeded", || async {
        db.count("state = 'succeeded'").await == 50
    })
    .await;
    let report = w.stop().await;
    assert!(runs.all_once() && runs.total() == 50);
    let t = state_of(&db, ids[0]).await;
    assert_eq!((t.attempt, t.lease_epoch), (1, 1));
    assert!(t.finished_at.is_some() && t.lease_until.is_none() && t.last_error.is_none());
    assert_eq!(report.stats.succeeded, 50);
    assert_eq!(report.stats.claimed, 50);
    assert!(report.released.is_empty());
}

async fn futures_lite_join<B: TestBackend>(
    db: &Db<B>,
    range: std::ops::Range<u32>,
    mode: Mode,
) -> Vec<TaskId> {
    let mut ids = Vec::new();
    for n in range {
        ids.push(job(db, n, mode.clone()).await);
    }
    ids
}

async fn failures_retry_with_backoff_then_succeed_or_go_dead<B: TestBackend>(db: Db<B>) {
    let runs = Runs::default();
    let flaky = job(&db, 1, Mode::FailTimes(2)).await;
    let hopeless = job(&db, 2, Mode::FailTimes(99)).await;
    let permanent = job(&db, 3, Mode::Permanent).await;
    let missing_table = job(&db, 4, Mode::MissingTable).await;
    let w = RunningWorker::spawn(worker(&db, &runs));
    let t = wait_state(&db, flaky, TaskState::Succeeded).await;
    assert_eq!(t.attempt, 3);
    assert_eq!(
        t.last_error.as_deref(),
        Some("failure 2"),
        "the last error is kept after success"
    );
    let t = wait_state(&db, hopeless, TaskState::Dead).await;
    assert_eq!((t.attempt, runs.get(2)), (3, 3));
    assert_eq!(
        t.last_error.as_deref(),
        Some("failure 3 (attempts exhausted: 3/3)")
    );
    assert_eq!(
        t.dead_reason(),
        Some(DeadReason::AttemptsExhausted {
            attempts: 3,
            max_attempts: 3
        })
    );
    let t = wait_state(&db, permanent, TaskState::Dead).await;
    assert_eq!((t.attempt, runs.get(3)), (1, 1));
    assert_eq!(t.last_error.as_deref(), Some("bad input"));
    assert_eq!(t.dead_reason(), Some(DeadReason::Permanent));
    // sqlx's error includes its source's text: stored once, not "X: X".
    let t = wait_state(&db, missing_table, TaskState::Dead).await;
    let e = t.last_error.unwrap();
    // The database's own error text differs by backend.
    let (prefix, tail) = match db.label() {
        "mysql" => (
            "error returned from database: 1146 (42S02): Table '",
            "doesn't exist",
        ),
        _ => (
            "error returned from database: (code: 1) no such table: no_such_table",
            "no such table",
        ),
    };
    assert!(e.starts_with(prefix), "{e}");
    assert_eq!(e.matches(tail).count(), 1, "{e}");
    let stats = w.stop().await.stats;
    assert_eq!((stats.retried, stats.dead, stats.succeeded), (4, 3, 1));
}

async fn retry_after_is_honoured<B: TestBackend>(db: Db<B>) {
    let runs = Runs::default();
    let id = job(&db, 1, Mode::RetryAfterMs(60_000)).await;
    let w = RunningWorker::spawn(worker(&db, &runs));
    wait_until(
        Duration::from_secs(10),
        "first attempt written back",
        || async {
            state_of(&db, id).await.attempt == 1
                && state_of(&db, id).await.state == TaskState::Pending
        },
    )
    .await;
    w.stop().await;
    let t = state_of(&db, id).await;
    let delay = t.run_at - t.updated_at;
    assert!(
        delay > chrono::Duration::seconds(59) && delay <= chrono::Duration::seconds(60),
        "{delay}"
    );
    assert_eq!(t.last_error.as_deref(), Some("not yet"));
}

async fn a_panic_is_a_failure_not_a_crash<B: TestBackend>(db: Db<B>) {
    let runs = Runs::default();
    let bad = Job {
        n: 1,
        mode: Mode::Panic,
    }
    .enqueue_options()
    .with_max_attempts(1)
    .enqueue(&db.pool)
    .await
    .unwrap()
    .id;
    let good = job(&db, 2, Mode::Ok).await;
    let w = RunningWorker::spawn(worker(&db, &runs));
    let t = wait_state(&db, bad, TaskState::Dead).await;
    assert!(
        t.last_error
            .unwrap()
            .starts_with("handler panicked: boom 1")
    );
    wait_state(&db, good, TaskState::Succeeded).await;
    // The worker still works after the panic.
    let later = job(&db, 3, Mode::Ok).await;
    wait_state(&db, later, TaskState::Succeeded).await;
    assert_eq!(w.stop().await.stats.panics, 1);
}

async fn a_timeout_cancels_the_handler_and_counts_as_a_failure<B: TestBackend>(db: Db<B>) {
    let runs = Runs::default();
    let id = Slow.enqueue(&db.pool).await.unwrap().id;
    let w = RunningWorker::spawn(worker(&db, &runs).cancel_grace(Duration::from_millis(50)));
    let t = wait_state(&db, id, TaskState::Dead).await;
    assert_eq!(t.attempt, 2);
    assert!(t.last_error.unwrap().starts_with("timed out after 200ms"));
    assert_eq!(w.stop().await.stats.timeouts, 2);
}

async fn undecodable_payloads_and_unknown_names<B: TestBackend>(db: Db<B>) {
    let runs = Runs::default();
    for (name, payload) in [
        ("job", &b"{\"n\": \"not a number\"}"[..]),
        ("job", &b"\xff\xfe"[..]),
        ("nobody_handles_this", &b"{}"[..]),
    ] {
        let now = db.now();
        db.exec(&format!(
            "INSERT INTO taskq_tasks (queue, name, payload, state, max_attempts, run_at, created_at, updated_at)
             VALUES ('default', '{name}', {}, 'pending', 5, {now}, {now}, {now})",
            blob(payload)
        ))
        .await;
    }
    let ok = job(&db, 1, Mode::Ok).await;
    let w = RunningWorker::spawn(worker(&db, &runs));
    wait_state(&db, ok, TaskState::Succeeded).await;
    wait_until(Duration::from_secs(10), "2 dead", || async {
        db.count("state = 'dead'").await == 2
    })
    .await;
    let mut errors = Vec::new();
    for id in db
        .ints("SELECT id FROM taskq_tasks WHERE state = 'dead' ORDER BY id")
        .await
    {
        let sql = format!("SELECT last_error FROM taskq_tasks WHERE id = {id}");
        errors.push(db.text(&sql).await.unwrap());
    }
    // The type is named as code writes it, without its module path.
    assert!(
        errors[0].starts_with("payload does not decode as Job: "),
        "{}",
        errors[0]
    );
    assert!(errors.iter().all(|e| e.contains("payload does not decode")));
    // Exactly one attempt each: undecodable payloads are never retried.
    assert_eq!(db.count("state = 'dead' AND attempt = 1").await, 2);
    let dead = Client::new(db.pool.clone())
        .list(&taskq::client::ListFilter {
            state: Some(TaskState::Dead),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(
        dead.iter()
            .all(|t| t.dead_reason() == Some(DeadReason::Undecodable)),
        "{dead:?}"
    );
    // Unknown names stay pending and untouched.
    assert_eq!(
        db.count("name = 'nobody_handles_this' AND state = 'pending' AND attempt = 0")
            .await,
        1
    );
    w.stop().await;
}

async fn the_reaper_requeues_expired_leases_and_buries_exhausted_ones<B: TestBackend>(db: Db<B>) {
    let runs = Runs::default();
    let again = job(&db, 1, Mode::Ok).await;
    let exhausted = job(&db, 2, Mode::Ok).await;
    // Simulate a crashed worker: running with an expired lease.
    db.exec(&format!(
        "UPDATE taskq_tasks SET state = 'running', attempt = CASE WHEN id = {} THEN 1 ELSE 3 END,
           lease_epoch = 7, worker_id = 'crashed', lease_until = {}",
        again.0,
        db.ago(Duration::from_secs(1))
    ))
    .await;
    let w = RunningWorker::spawn(worker(&db, &runs));
    let t = wait_state(&db, again, TaskState::Succeeded).await;
    // Reaped (epoch 8) then claimed (epoch 9), second attempt.
    assert_eq!((t.lease_epoch, t.attempt), (9, 2));
    assert!(
        t.last_error
            .unwrap()
            .contains("lease expired (worker crashed, attempt 1)")
    );
    let t = wait_state(&db, exhausted, TaskState::Dead).await;
    assert_eq!((t.lease_epoch, t.attempt, runs.get(2)), (8, 3, 0));
    assert_eq!(
        t.dead_reason().map(|r| r.to_string()).as_deref(),
        Some("attempts exhausted (3/3)")
    );
    assert!(w.stop().await.stats.reaped >= 2);
}

/// A reaped task keeps its `run_at` (Oban's Lifeline): it sorts where it was in its queue, so
/// a worker busy with a backlog enqueued after it takes it at its next free slot instead of
/// after the whole backlog.
async fn a_reaped_task_runs_before_the_backlog_enqueued_after_it<B: TestBackend>(db: Db<B>) {
    let runs = Runs::default();
    let reaped = job(&db, 0, Mode::Ok).await;
    // A crashed worker's task: running with an expired lease.
    db.exec(&format!(
        "UPDATE taskq_tasks SET state = 'running', attempt = 1, lease_epoch = 1,
           worker_id = 'crashed', lease_until = {} WHERE id = {}",
        db.ago(Duration::from_secs(1)),
        reaped.0
    ))
    .await;
    let due_before = db
        .time(&format!(
            "SELECT run_at FROM taskq_tasks WHERE id = {}",
            reaped.0
        ))
        .await;
    // The backlog, enqueued after it: 40 tasks of 50 ms for 2 slots (about 1 s of work).
    let backlog: Vec<TaskId> = {
        let mut v = Vec::new();
        for n in 1..=40 {
            v.push(job(&db, n, Mode::Sleep(50)).await);
        }
        v
    };
    let w = RunningWorker::spawn(worker(&db, &runs).concurrency(2).claim_batch(2));
    let t = wait_state(&db, reaped, TaskState::Succeeded).await;
    assert_eq!(
        (t.lease_epoch, t.attempt),
        (3, 2),
        "reaped once, then claimed"
    );
    // Backlog tasks claimed before the reaped task's second claim: a few at most (those claimed
    // before the reaper's first round, and on MySQL up to one head rescan, 100 ms), not all 40.
    let ahead = db
        .count(&format!(
            "id IN ({}) AND attempted_at < (SELECT attempted_at FROM taskq_tasks WHERE id = {})",
            backlog
                .iter()
                .map(|i| i.0.to_string())
                .collect::<Vec<_>>()
                .join(","),
            reaped.0
        ))
        .await;
    assert!(
        ahead < 15,
        "{ahead} of 40 backlog tasks ran before the reaped task"
    );
    assert_eq!(
        db.time(&format!(
            "SELECT run_at FROM taskq_tasks WHERE id = {}",
            reaped.0
        ))
        .await,
        due_before,
        "the reap kept the task's run_at"
    );
    wait_until(Duration::from_secs(20), "backlog drained", || async {
        db.count("state = 'succeeded'").await == 41
    })
    .await;
    w.stop().await;
}

/// One run of [`Blocking`]: `(n, epoch, whether it blocked)`.
type BlockRun = (u32, u64, bool);

/// Runs of [`Blocking`], and whether one already blocked.
#[derive(Clone, Default)]
struct BlockLog(Arc<Mutex<(Vec<BlockRun>, bool)>>);

/// The first run in the process blocks its thread (synchronous sleep) for 2.5 s, longer than
/// the worker's 2 s lease; later runs return at once.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Blocking {
    n: u32,
}

impl Task for Blocking {
    const NAME: &'static str = "blocking";
    async fn run(self, cx: TaskContext) -> Result<(), TaskError> {
        let log = cx.data::<BlockLog>().expect("BlockLog data registered");
        let block = {
            let mut l = log.0.lock().unwrap();
            let block = !l.1;
            l.1 = true;
            l.0.push((self.n, cx.lease_epoch(), block));
            block
        };
        if block {
            std::thread::sleep(Duration::from_millis(2500));
        }
        Ok(())
    }
}

/// A handler does not start on a lease that is over, or about to be, when its executor gets
/// to it late: two tasks claimed together on a worker whose runtime is one thread; the first
/// handler blocks that thread past the lease, so the second one's turn comes after its lease
/// (and the watchdog's cancel point) has passed. It is not run under that lease: the worker
/// releases it (counted in `late_starts`) and it runs later under a new one.
async fn a_handler_does_not_start_on_a_lease_that_ran_out_before_its_turn<B: TestBackend>(
    db: Db<B>,
) {
    let log = BlockLog::default();
    let a = Blocking { n: 1 }.enqueue(&db.pool).await.unwrap().id;
    let b = Blocking { n: 2 }.enqueue(&db.pool).await.unwrap().id;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    // (A 2 s lease survives a renewal waiting 333 ms for SQLite's write lock.)
    let worker = db
        .worker_with_busy_timeout(Duration::from_millis(250))
        .register::<Blocking>()
        .data(log.clone())
        .concurrency(2)
        .claim_batch(2)
        .lease(Duration::from_secs(2))
        .shutdown_signal(async move {
            let _ = stopped.await;
        })
        .build()
        .unwrap();
    let stats = worker.stats();
    // The worker on a runtime of its own with one thread, so a blocked handler blocks it all.
    let thread = std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(worker.run())
    });
    wait_until(Duration::from_secs(20), "both succeeded", || async {
        db.count(&format!("id IN ({}, {}) AND state = 'succeeded'", a.0, b.0))
            .await
            == 2
    })
    .await;
    let _ = stop.send(());
    tokio::task::spawn_blocking(move || thread.join().unwrap().unwrap())
        .await
        .unwrap();
    let runs = log.0.lock().unwrap().0.clone();
    let blocker = runs.iter().find(|r| r.2).expect("one run blocked");
    assert_eq!(
        blocker.1, 1,
        "the blocking run had the first lease: {runs:?}"
    );
    let late: Vec<_> = runs.iter().filter(|r| r.0 != blocker.0).collect();
    assert_eq!(late.len(), 1, "the other task ran once: {runs:?}");
    assert!(
        late[0].1 >= 3,
        "not under the lease that ran out while it waited: {runs:?}"
    );
    assert_eq!(stats.snapshot().late_starts, 1);
}

async fn a_lost_lease_cancels_the_handler_and_its_write_back_is_fenced<B: TestBackend>(db: Db<B>) {
    let runs = Runs::default();
    let id = job(&db, 1, Mode::WaitCancel).await;
    let w = RunningWorker::spawn(
        worker(&db, &runs)
            .lease(Duration::from_secs(3))
            .heartbeat(Duration::from_millis(100))
            .reaper_interval(Duration::from_secs(3600)),
    );
    wait_state(&db, id, TaskState::Running).await;
    // Another holder takes the task over: its epoch moves on.
    db.exec(&format!(
        "UPDATE taskq_tasks SET lease_epoch = lease_epoch + 1, worker_id = 'other' WHERE id = {}",
        id.0
    ))
    .await;
    wait_until(
        Duration::from_secs(10),
        "handler saw its cancel signal",
        || async {
            runs.get(1001) == taskq::context::CancelReason::LeaseLost as u32
                && runs.0.lock().unwrap().contains_key(&1001)
        },
    )
    .await;
    wait_until(Duration::from_secs(10), "fenced write-back", || async {
        w.stats.snapshot().fenced == 1
    })
    .await;
    let t = state_of(&db, id).await;
    assert_eq!(
        (t.state, t.lease_epoch, t.worker_id.as_deref()),
        (TaskState::Running, 2, Some("other"))
    );
    let stats = w.stop().await.stats;
    assert_eq!(
        (stats.lost_leases, stats.fenced, stats.succeeded),
        (1, 1, 0)
    );
}

async fn shutdown_waits_for_handlers_then_releases_the_rest<B: TestBackend>(db: Db<B>) {
    let runs = Runs::default();
    let quick = job(&db, 1, Mode::Sleep(300)).await;
    let stuck = job(&db, 2, Mode::Sleep(60_000)).await;
    let w = RunningWorker::spawn(worker(&db, &runs).shutdown_timeout(Duration::from_secs(1)));
    wait_until(Duration::from_secs(10), "both running", || async {
        db.count("state = 'running'").await == 2
    })
    .await;
    let started = std::time::Instant::now();
    let report = w.stop().await;
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(4),
        "{took:?}"
    );
    assert_eq!(report.released, vec![stuck]);
    assert!(report.unacknowledged.is_empty());
    assert_eq!(state_of(&db, quick).await.state, TaskState::Succeeded);
    let t = state_of(&db, stuck).await;
    // Released: pending now, epoch bumped, the interrupted attempt not counted.
    assert_eq!(
        (t.state, t.lease_epoch, t.attempt),
        (TaskState::Pending, 2, 0)
    );
    assert!(t.run_at <= chrono::Utc::now() + chrono::Duration::seconds(1));
    // Another worker starts it at once.
    db.exec(&format!(
        "UPDATE taskq_tasks SET payload = {} WHERE id = {}",
        blob(br#"{"n":2,"mode":"Ok"}"#),
        stuck.0
    ))
    .await;
    let w2 = RunningWorker::spawn(worker(&db, &runs));
    wait_state(&db, stuck, TaskState::Succeeded).await;
    w2.stop().await;
}

async fn retention_prunes_old_terminal_tasks_only<B: TestBackend>(db: Db<B>) {
    let runs = Runs::default();
    for n in 0..6 {
        job(&db, n, Mode::Ok).await;
    }
    db.exec(&format!(
        "UPDATE taskq_tasks SET
           state = CASE id % 3 WHEN 0 THEN 'succeeded' WHEN 1 THEN 'dead' ELSE 'canceled' END,
           finished_at = CASE WHEN id <= 3 THEN {} ELSE {} END",
        db.ago(Duration::from_secs(7200)),
        db.now()
    ))
    .await;
    let hour_ago = db.ago(Duration::from_secs(3600));
    let keep_dead = taskq::worker::Retention {
        succeeded: Some(Duration::from_secs(3600)),
        dead: None,
        canceled: Some(Duration::from_secs(3600)),
        expired: Some(Duration::from_secs(3600)),
        interval: Duration::from_millis(100),
    };
    let w = RunningWorker::spawn(worker(&db, &runs).retention(keep_dead));
    wait_until(
        Duration::from_secs(10),
        "old succeeded/canceled pruned",
        || async { db.count("1=1").await == 4 },
    )
    .await;
    w.stop().await;
    // The old dead task is kept (dead retention disabled), recent ones are kept.
    assert_eq!(db.count(&format!("finished_at < {hour_ago}")).await, 1);
    assert_eq!(
        db.count(&format!("finished_at < {hour_ago} AND state = 'dead'"))
            .await,
        1
    );
}

async fn several_workers_run_each_task_exactly_once<B: TestBackend>(db: Db<B>) {
    let runs = Runs::default();
    let n = 600;
    let mut tx = db.begin().await;
    for i in 0..n {
        Job {
            n: i,
            mode: Mode::Ok,
        }
        .enqueue_tx(&mut tx)
        .await
        .unwrap();
    }
    tx.commit().await.unwrap();
    let workers: Vec<RunningWorker> = (0..4)
        .map(|i| {
            RunningWorker::spawn(
                worker(&db, &runs)
                    .worker_id(format!("w{i}"))
                    .queue("default", 8)
                    .claim_batch(4),
            )
        })
        .collect();
    wait_until(Duration::from_secs(60), "all succeeded", || async {
        db.count("state = 'succeeded'").await == i64::from(n)
    })
    .await;
    let mut claimed_by = Vec::new();
    for w in workers {
        claimed_by.push(w.stop().await.stats.claimed);
    }
    assert_eq!(runs.total(), n as usize);
    assert!(runs.all_once(), "some task ran twice");
    assert_eq!(claimed_by.iter().sum::<u64>(), u64::from(n));
    assert_eq!(
        db.count("attempt = 1 AND lease_epoch = 1").await,
        i64::from(n)
    );
    let distinct = db
        .scalar("SELECT COUNT(DISTINCT worker_id) FROM taskq_tasks")
        .await;
    assert!(
        distinct >= 2,
        "work was spread over workers: {claimed_by:?}"
    );
}

async fn in_process_enqueue_wakes_an_idle_worker<B: TestBackend>(db: Db<B>) {
    let runs = Runs::default();
    let w = RunningWorker::spawn(
        worker(&db, &runs).poll_interval(Duration::from_secs(30), Duration::from_secs(30)),
    );
    tokio::time::sleep(Duration::from_millis(300)).await; // the first (empty) poll is done
    let id = job(&db, 1, Mode::Ok).await;
    wait_until(
        Duration::from_secs(5),
        "woken worker ran the task",
        || async { state_of(&db, id).await.state == TaskState::Succeeded },
    )
    .await;
    w.stop().await;
}

async fn invalid_settings_are_typed_errors<B: TestBackend>(db: Db<B>) {
    let cfg = |b: taskq::worker::WorkerBuilder| match b.build() {
        Err(Error::Config(m)) => m,
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("accepted"),
    };
    let base = || taskq::Worker::builder(db.pool.clone()).register::<Job>();
    assert!(cfg(taskq::Worker::builder(db.pool.clone())).contains("no task is registered"));
    assert!(cfg(base().queue("default", 0)).contains("concurrency 0"));
    assert!(cfg(base().concurrency(0)).contains("concurrency must be at least 1"));
    assert!(
        cfg(base()
            .lease(Duration::from_secs(5))
            .heartbeat(Duration::from_secs(5)))
        .contains("shorter than the lease")
    );
    assert!(
        cfg(base().poll_interval(Duration::from_secs(2), Duration::from_secs(1)))
            .contains("poll interval")
    );
    assert!(cfg(base().claim_batch(0)).contains("claim batch"));
    assert!(matches!(
        base().queue("", 1).build(),
        Err(Error::InvalidName { .. })
    ));
    // Job reads Runs through cx.data() (not an injected Data<T>), so this builds.
    assert!(base().build().is_ok());
}

/// The worker's locking read: up to ten of `candidates` by primary key, skipping held rows.
async fn lock_ten_candidates(conn: &mut sqlx::MySqlConnection, candidates: &[u64]) -> Vec<u64> {
    sqlx::query_scalar(
        "SELECT t.id FROM JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$')) AS j
           STRAIGHT_JOIN taskq_tasks t FORCE INDEX (PRIMARY) ON t.id = j.id
         WHERE t.state = 'pending' AND t.run_at <= UTC_TIMESTAMP(6)
         LIMIT 10 FOR UPDATE SKIP LOCKED",
    )
    .bind(serde_json::to_string(candidates).unwrap())
    .fetch_all(conn)
    .await
    .unwrap()
}

// MySQL only: InnoDB's SKIP LOCKED locking read of candidates and its next-key locks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_in_progress_never_blocks_producers() {
    let Some(tdb) = TestDb::new_or_skip().await else {
        return;
    };
    let db = Db::<sqlx::MySql>::from_test_db(tdb);
    for n in 0..20 {
        job(&db, n, Mode::Ok).await;
    }
    // Hold a claim open on a READ COMMITTED session, with the worker's statements: a plain
    // read of candidates on the claim index, then a locking read of them by primary key.
    let mut claimer = db.pool.acquire().await.unwrap();
    sqlx::query("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        .execute(&mut *claimer)
        .await
        .unwrap();
    sqlx::query("BEGIN").execute(&mut *claimer).await.unwrap();
    let candidates: Vec<u64> = sqlx::query_scalar(
        "SELECT id FROM taskq_tasks WHERE state = 'pending' AND queue = 'default' AND run_at <= UTC_TIMESTAMP(6)
         ORDER BY priority, run_at, id LIMIT 20",
    )
    .fetch_all(&mut *claimer)
    .await
    .unwrap();
    let locked = lock_ten_candidates(&mut claimer, &candidates).await;
    assert_eq!(locked.len(), 10);
    // A producer (default REPEATABLE READ) inserts new due tasks meanwhile, with a short lock wait.
    let mut producer = db.pool.acquire().await.unwrap();
    sqlx::query("SET SESSION innodb_lock_wait_timeout = 1")
        .execute(&mut *producer)
        .await
        .unwrap();
    let mut tx = sqlx::Connection::begin(&mut *producer).await.unwrap();
    // Priority -1 sorts them before the locked rows, where a locking scan of the claim index
    // under REPEATABLE READ would hold next-key locks and make these inserts wait and fail.
    for n in 100..110 {
        Job { n, mode: Mode::Ok }
            .enqueue_options()
            .with_priority(-1)
            .enqueue_tx(&mut tx)
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
    // And a second claimer, reading the same candidates, gets the ten unlocked ones without
    // waiting.
    let mut other = db.pool.acquire().await.unwrap();
    let theirs = lock_ten_candidates(&mut other, &candidates).await;
    assert_eq!(
        theirs.len(),
        10,
        "candidates {candidates:?}, locked {locked:?}"
    );
    assert!(theirs.iter().all(|id| !locked.contains(id)));
    sqlx::query("ROLLBACK")
        .execute(&mut *claimer)
        .await
        .unwrap();
}

async fn a_paused_queue_is_not_claimed_until_resumed<B: TestBackend>(db: Db<B>) {
    let runs = Runs::default();
    let client = Client::new(db.pool.clone());
    client.pause_queue("default").await.unwrap();
    client.pause_queue("default").await.unwrap(); // idempotent
    assert_eq!(client.paused_queues().await.unwrap().len(), 1);
    let id = job(&db, 1, Mode::Ok).await;
    let other = Job {
        n: 2,
        mode: Mode::Ok,
    }
    .enqueue_options()
    .with_queue("other")
    .enqueue(&db.pool)
    .await
    .unwrap()
    .id;
    let w = RunningWorker::spawn(worker(&db, &runs).queue("default", 2).queue("other", 2));
    // The other queue keeps flowing while "default" is paused.
    wait_state(&db, other, TaskState::Succeeded).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let t = state_of(&db, id).await;
    assert_eq!((t.state, t.attempt), (TaskState::Pending, 0));
    assert!(client.resume_queue("default").await.unwrap());
    assert!(!client.resume_queue("default").await.unwrap());
    wait_state(&db, id, TaskState::Succeeded).await;
    assert!(client.paused_queues().await.unwrap().is_empty());
    w.stop().await;
    assert!(matches!(
        client.pause_queue("").await,
        Err(Error::InvalidName { .. })
    ));
}

/// A queue paused while a worker idles is not claimed when a task arrives before the worker
/// would read the paused queues again (its poll ceiling here is 30 s): on MySQL the claim's
/// candidate read sees the pause, claims nothing and the worker reads the controls
/// (`claims_controlled`); on SQLite the claim checks the pause itself. A resume in this
/// process wakes the worker, which reads the controls at once and runs the task.
async fn a_queue_paused_while_the_worker_idles_is_not_claimed_before_its_next_controls_read<
    B: TestBackend,
>(
    db: Db<B>,
) {
    let runs = Runs::default();
    let client = Client::new(db.pool.clone());
    let w = RunningWorker::spawn(
        worker(&db, &runs).poll_interval(Duration::from_millis(10), Duration::from_secs(30)),
    );
    let warm = job(&db, 0, Mode::Ok).await;
    wait_state(&db, warm, TaskState::Succeeded).await;
    client.pause_queue("default").await.unwrap();
    // `enqueue(&pool)` wakes the idle claim loop at once.
    let id = job(&db, 1, Mode::Ok).await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    let t = state_of(&db, id).await;
    assert_eq!(
        (t.state, t.attempt),
        (TaskState::Pending, 0),
        "{}: paused, not claimed",
        B::LABEL
    );
    let controlled = w.stats.snapshot().claims_controlled;
    if B::LABEL == "mysql" {
        assert!(controlled >= 1, "the claim saw the pause: {controlled}");
    } else {
        assert_eq!(controlled, 0, "SQLite's claim checks the pause itself");
    }
    let resumed = Instant::now();
    assert!(client.resume_queue("default").await.unwrap());
    wait_state(&db, id, TaskState::Succeeded).await;
    assert!(
        resumed.elapsed() < Duration::from_secs(10),
        "a resume in this process is seen at once, not at the 30 s refresh: {:?}",
        resumed.elapsed()
    );
    w.stop().await;
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Work {
    n: u32,
}

impl Task for Work {
    const NAME: &'static str = "work";
    const QUEUE: &'static str = "work";
    async fn run(self, _cx: TaskContext) -> Result<(), TaskError> {
        Ok(())
    }
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Flaky {
    n: u32,
}

impl Task for Flaky {
    const NAME: &'static str = "flaky";
    const QUEUE: &'static str = "work";
    const MAX_ATTEMPTS: u32 = 3;
    const BACKOFF: taskq::Backoff = taskq::Backoff::constant(Duration::from_millis(10));
    async fn run(self, cx: TaskContext) -> Result<(), TaskError> {
        if self.n.is_multiple_of(2) && cx.attempt() < 2 {
            return Err(TaskError::msg("first attempt fails"));
        }
        if !self.n.is_multiple_of(2) {
            return Err(TaskError::msg("always fails"));
        }
        Ok(())
    }
}

async fn a_worker_drains_every_task_once<B: TestBackend>(db: Db<B>) {
    let mut tx = db.begin().await;
    taskq::enqueue::enqueue_many(&mut tx, (0..500).map(|n| Work { n }))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let w = RunningWorker::spawn(db.worker().register::<Work>().queue("work", 16));
    wait_until(Duration::from_secs(20), "every task succeeded", || async {
        db.count("state = 'succeeded'").await == 500
    })
    .await;
    let report = w.stop().await;
    assert_eq!(report.stats.succeeded, 500);
    assert_eq!(db.count("attempt = 1 AND lease_epoch = 1").await, 500);
}

async fn failures_retry_then_die<B: TestBackend>(db: Db<B>) {
    let mut tx = db.begin().await;
    taskq::enqueue::enqueue_many(&mut tx, (0..20).map(|n| Flaky { n }))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let w = RunningWorker::spawn(db.worker().register::<Flaky>().queue("work", 4));
    wait_until(
        Duration::from_secs(20),
        "ten succeeded and ten dead",
        || async {
            db.count("state = 'succeeded'").await == 10 && db.count("state = 'dead'").await == 10
        },
    )
    .await;
    w.stop().await;
    assert_eq!(db.count("state = 'succeeded' AND attempt = 2").await, 10);
    assert_eq!(db.count("state = 'dead' AND attempt = 3").await, 10);
    let dead = db
        .client()
        .list(&taskq::client::ListFilter {
            state: Some(taskq::TaskState::Dead),
            ..Default::default()
        })
        .await
        .unwrap();
    let attempts = db.client().attempts(dead[0].id).await.unwrap();
    assert_eq!(attempts.len(), 3, "one history entry per attempt");
}

/// A backoff whose jitter is out of range (the fields are public, so nothing stops this const).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Jittery;
impl Task for Jittery {
    const NAME: &'static str = "jittery";
    const BACKOFF: Backoff = Backoff {
        base: Duration::from_secs(1),
        max: Duration::from_secs(10),
        jitter: 2.0,
    };
    async fn run(self, _cx: TaskContext) -> Result<(), TaskError> {
        Err(TaskError::msg("retry me"))
    }
}

/// The same with a NaN jitter.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct NanJitter;
impl Task for NanJitter {
    const NAME: &'static str = "nan_jitter";
    const BACKOFF: Backoff = Backoff {
        jitter: f64::NAN,
        ..Backoff::DEFAULT
    };
    async fn run(self, _cx: TaskContext) -> Result<(), TaskError> {
        Err(TaskError::msg("retry me"))
    }
}

async fn an_invalid_backoff_or_a_grace_past_half_the_lease_is_refused_at_build<B: TestBackend>(
    db: Db<B>,
) {
    let cfg = |b: taskq::worker::WorkerBuilder| match b.build() {
        Err(Error::Config(m)) => m,
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("accepted"),
    };
    let m = cfg(db.worker().register::<Jittery>());
    assert!(
        m.contains("\"jittery\" has an invalid backoff: jitter 2 is outside 0.0..=1.0"),
        "{m}"
    );
    let m = cfg(db.worker().register::<NanJitter>());
    assert!(m.contains("jitter NaN is outside"), "{m}");
    // The cancel grace: at most half the lease.
    // (On SQLite, on a pool whose busy timeout these short leases survive.)
    let short = || db.worker_with_busy_timeout(Duration::from_millis(10));
    let base = || short().register::<Job>().lease(Duration::from_secs(2));
    let m = cfg(base().cancel_grace(Duration::from_millis(1001)));
    assert!(m.contains("must be at most half the lease (2s)"), "{m}");
    assert!(base().cancel_grace(Duration::from_secs(1)).build().is_ok());
    // The default (5 s) is cut to half of a shorter lease rather than refused.
    assert!(base().build().is_ok());
    assert!(
        short()
            .register::<Job>()
            .lease(Duration::from_millis(100))
            .heartbeat(Duration::from_millis(30))
            .build()
            .is_ok()
    );
}

async fn the_default_cancel_grace_is_half_a_short_lease<B: TestBackend>(db: Db<B>) {
    let runs = Runs::default();
    let id = Slow.enqueue(&db.pool).await.unwrap().id;
    let spawned = std::time::Instant::now();
    // Slow times out after 200 ms and ignores its signal: it is aborted after the grace, which
    // with a 1 s lease is 500 ms (a 5 s grace would outlive the lease).
    // (On SQLite, on a pool whose busy timeout a 1 s lease survives: 100 ms.)
    let w = RunningWorker::spawn(
        db.worker_with_busy_timeout(Duration::from_millis(100))
            .register::<Job>()
            .register::<Slow>()
            .data(runs.clone())
            .data(db.pool.clone())
            .lease(Duration::from_secs(1)),
    );
    wait_until(
        Duration::from_secs(20),
        "the first attempt timed out",
        || async {
            state_of(&db, id)
                .await
                .last_error
                .is_some_and(|e| e.starts_with("timed out after 200ms"))
        },
    )
    .await;
    let took = spawned.elapsed();
    assert!(took < Duration::from_secs(4), "{took:?}");
    w.stop().await;
}

/// An error whose `Display` panics: formatting it, after the handler has returned, panics in
/// the worker's executor.
#[derive(Debug)]
struct Unprintable;
impl std::fmt::Display for Unprintable {
    fn fmt(&self, _: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        panic!("this error cannot be printed")
    }
}
impl std::error::Error for Unprintable {}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct FailsUnprintably;
impl Task for FailsUnprintably {
    const NAME: &'static str = "fails_unprintably";
    const MAX_ATTEMPTS: u32 = 1;
    async fn run(self, _cx: TaskContext) -> Result<(), TaskError> {
        Err(TaskError::retry(Unprintable))
    }
}

async fn a_panic_after_the_handler_returned_lets_the_lease_end<B: TestBackend>(db: Db<B>) {
    let id = FailsUnprintably.enqueue(&db.pool).await.unwrap().id;
    let w = RunningWorker::spawn(
        db.worker_with_busy_timeout(Duration::from_millis(100))
            .register::<FailsUnprintably>()
            .lease(Duration::from_secs(1)),
    );
    // The lease is no longer renewed: the reaper buries the task (its only attempt used).
    let t = wait_state(&db, id, TaskState::Dead).await;
    assert_eq!(t.attempt, 1);
    assert!(
        t.last_error
            .as_deref()
            .is_some_and(|e| e.starts_with("lease expired")),
        "{:?}",
        t.last_error
    );
    // Counted once the reap's answer is read (the test may see its commit first).
    wait_until(Duration::from_secs(10), "the reap is counted", || async {
        w.stats.snapshot().reaped == 1
    })
    .await;
    // And shutdown does not wait for the executor that panicked.
    let report = tokio::time::timeout(Duration::from_secs(15), w.stop())
        .await
        .expect("shutdown finishes");
    assert!(report.released.is_empty() && report.unacknowledged.is_empty());
}

taskq_tests::conformance!(
    a_worker_drains_every_task_once,
    failures_retry_then_die,
    runs_tasks_and_records_success,
    failures_retry_with_backoff_then_succeed_or_go_dead,
    retry_after_is_honoured,
    a_panic_is_a_failure_not_a_crash,
    a_timeout_cancels_the_handler_and_counts_as_a_failure,
    undecodable_payloads_and_unknown_names,
    the_reaper_requeues_expired_leases_and_buries_exhausted_ones,
    a_reaped_task_runs_before_the_backlog_enqueued_after_it,
    a_handler_does_not_start_on_a_lease_that_ran_out_before_its_turn,
    a_lost_lease_cancels_the_handler_and_its_write_back_is_fenced,
    shutdown_waits_for_handlers_then_releases_the_rest,
    retention_prunes_old_terminal_tasks_only,
    several_workers_run_each_task_exactly_once,
    in_process_enqueue_wakes_an_idle_worker,
    invalid_settings_are_typed_errors,
    a_paused_queue_is_not_claimed_until_resumed,
    a_queue_paused_while_the_worker_idles_is_not_claimed_before_its_next_controls_read,
    an_invalid_backoff_or_a_grace_past_half_the_lease_is_refused_at_build,
    the_default_cancel_grace_is_half_a_short_lease,
    a_panic_after_the_handler_returned_lets_the_lease_end,
);
