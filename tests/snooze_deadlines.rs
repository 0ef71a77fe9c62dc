//! Scheduling against a real database: snooze (runs again later without counting the
//! attempt, bounded), reschedule and reprioritize of pending tasks, and deadlines (a task not
//! started by its deadline is never run and ends `expired`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use taskq::{
    Client, Error, Task, TaskContext, TaskError, TaskId, TaskState, client::ListFilter,
    client::TaskInfo, defaults::MAX_DELAY, worker::Retention,
};
use taskq_tests::{RunningWorker, TestDb, fast_worker, wait_until};

/// What a handler does on its k-th run (the last step repeats).
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize)]
enum Step {
    Ok,
    SnoozeMs(u64),
    SnoozeMax,
    Fail,
    RetryAfterMs(u64),
    /// Sleeps, then succeeds; records whether its cancel signal fired meanwhile.
    SleepMs(u64),
}

/// Runs by task number, in order, with the context seen by each; shared as worker state.
#[derive(Clone, Default)]
struct Runs(Arc<Mutex<HashMap<u32, Vec<Seen>>>>);

#[derive(Debug, Clone, Copy, PartialEq)]
struct Seen {
    attempt: u32,
    snoozes: u32,
    canceled: bool,
}

impl Runs {
    fn of(&self, n: u32) -> Vec<Seen> {
        self.0.lock().unwrap().get(&n).cloned().unwrap_or_default()
    }
    fn order(&self) -> Vec<u32> {
        let m = self.0.lock().unwrap();
        let mut v: Vec<u32> = m.keys().copied().collect();
        v.sort_unstable();
        v
    }
}

/// Order in which tasks started (for priority and schedule checks).
#[derive(Clone, Default)]
struct Started(Arc<Mutex<Vec<u32>>>);

async fn run_script(n: u32, steps: &[Step], cx: &TaskContext) -> Result<(), TaskError> {
    let runs = cx.data::<Runs>().expect("Runs data registered");
    if let Some(started) = cx.data::<Started>() {
        started.0.lock().unwrap().push(n);
    }
    let k = {
        let mut m = runs.0.lock().unwrap();
        let v = m.entry(n).or_default();
        v.push(Seen {
            attempt: cx.attempt(),
            snoozes: cx.snoozes(),
            canceled: false,
        });
        v.len() - 1
    };
    let step = steps[k.min(steps.len() - 1)];
    match step {
        Step::Ok => Ok(()),
        Step::SnoozeMs(ms) => Err(TaskError::snooze(Duration::from_millis(ms))),
        Step::SnoozeMax => Err(TaskError::snooze(Duration::MAX)),
        Step::Fail => Err(TaskError::msg(format!("failure on run {}", k + 1))),
        Step::RetryAfterMs(ms) => Err(TaskError::retry_after(
            Duration::from_millis(ms),
            std::io::Error::other(format!("not yet (run {})", k + 1)),
        )),
        Step::SleepMs(ms) => {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            let canceled = cx.cancel_signal().is_canceled();
            runs.0.lock().unwrap().get_mut(&n).unwrap()[k].canceled = canceled;
            Ok(())
        }
    }
}

/// A scripted task that may run once only (`max_attempts = 1`).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Script {
    n: u32,
    steps: Vec<Step>,
}

impl Task for Script {
    const NAME: &'static str = "script";
    const MAX_ATTEMPTS: u32 = 1;
    async fn run(self, cx: TaskContext) -> Result<(), TaskError> {
        run_script(self.n, &self.steps, &cx).await
    }
}

/// A scripted task with a tight snooze bound: 2 snoozes, 2 attempts.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Sleepy {
    n: u32,
    steps: Vec<Step>,
}

impl Task for Sleepy {
    const NAME: &'static str = "sleepy";
    const MAX_ATTEMPTS: u32 = 2;
    const MAX_SNOOZES: u32 = 2;
    async fn run(self, cx: TaskContext) -> Result<(), TaskError> {
        run_script(self.n, &self.steps, &cx).await
    }
}

/// A scripted task whose type carries a time to live of 300 ms.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct ShortLived {
    n: u32,
    steps: Vec<Step>,
}

impl Task for ShortLived {
    const NAME: &'static str = "short_lived";
    const MAX_ATTEMPTS: u32 = 3;
    const TTL: Option<Duration> = Some(Duration::from_millis(300));
    async fn run(self, cx: TaskContext) -> Result<(), TaskError> {
        run_script(self.n, &self.steps, &cx).await
    }
}

fn script(n: u32, steps: &[Step]) -> Script {
    Script {
        n,
        steps: steps.to_vec(),
    }
}

fn worker(db: &TestDb, runs: &Runs) -> taskq::worker::WorkerBuilder {
    fast_worker(&db.pool)
        .register::<Script>()
        .register::<Sleepy>()
        .register::<ShortLived>()
        .data(runs.clone())
}

async fn get(db: &TestDb, id: TaskId) -> TaskInfo {
    Client::new(db.pool.clone()).get(id).await.unwrap()
}

async fn wait_for(db: &TestDb, id: TaskId, what: &str, check: impl Fn(&TaskInfo) -> bool) {
    let client = Client::new(db.pool.clone());
    wait_until(
        Duration::from_secs(20),
        &format!("task {id}: {what}"),
        || {
            let client = client.clone();
            let check = &check;
            async move { client.get(id).await.is_ok_and(|t| check(&t)) }
        },
    )
    .await;
}

async fn wait_state(db: &TestDb, id: TaskId, state: TaskState) -> TaskInfo {
    wait_for(db, id, &state.to_string(), |t| t.state == state).await;
    get(db, id).await
}

async fn db_now(db: &TestDb) -> DateTime<Utc> {
    Client::new(db.pool.clone()).db_now().await.unwrap()
}

/// Seconds from `a` to `b`.
fn secs(a: DateTime<Utc>, b: DateTime<Utc>) -> f64 {
    (b - a).num_microseconds().unwrap() as f64 / 1e6
}

// --- snooze ----------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snooze_does_not_use_up_an_attempt() {
    let Some(db) = TestDb::new_or_skip().await else {
        return;
    };
    let runs = Runs::default();
    // max_attempts = 1: three snoozes, then a success.
    let id = script(
        1,
        &[
            Step::SnoozeMs(30),
            Step::SnoozeMs(30),
            Step::SnoozeMs(30),
            Step::Ok,
        ],
    )
    .enqueue(&db.pool)
    .await
    .unwrap()
    .id;
    let w = RunningWorker::spawn(worker(&db, &runs));
    let t = wait_state(&db, id, TaskState::Succeeded).await;
    let report = w.stop().await;
    assert_eq!((t.attempt, t.max_attempts, t.snoozes), (1, 1, 3));
    assert_eq!(t.last_error, None, "a snooze is not an error");
    assert_eq!(t.lease_epoch, 4, "each run was a claim");
    // Every run was attempt 1 and saw the snoozes so far.
    let seen: Vec<(u32, u32)> = runs.of(1).iter().map(|s| (s.attempt, s.snoozes)).collect();
    assert_eq!(seen, [(1, 0), (1, 1), (1, 2), (1, 3)]);
    let s = report.stats;
    assert_eq!((s.claimed, s.snoozed, s.succeeded), (4, 3, 1));
    assert_eq!((s.retried, s.dead), (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snooze_moves_run_at_by_its_delay_and_keeps_the_last_error() {
    let Some(db) = TestDb::new_or_skip().await else {
        return;
    };
    let runs = Runs::default();
    // Fails once (a real error), then snoozes for an hour.
    let id = Sleepy {
        n: 1,
        steps: vec![Step::RetryAfterMs(10), Step::SnoozeMs(3_600_000)],
    }
    .enqueue(&db.pool)
    .await
    .unwrap()
    .id;
    // Snoozes as long as it can: clamped to MAX_DELAY, not an error.
    let far = script(2, &[Step::SnoozeMax])
        .enqueue(&db.pool)
        .await
        .unwrap()
        .id;
    let w = RunningWorker::spawn(worker(&db, &runs));
    wait_for(&db, id, "snoozed", |t| t.snoozes == 1).await;
    wait_for(&db, far, "snoozed", |t| t.snoozes == 1).await;
    let report = w.stop().await;
    let now = db_now(&db).await;

    let t = get(&db, id).await;
    assert_eq!(t.state, TaskState::Pending);
    assert_eq!(
        t.attempt, 1,
        "the failed attempt counts, the snoozed one does not"
    );
    assert_eq!(t.finished_at, None);
    assert_eq!(t.last_error.as_deref(), Some("not yet (run 1)"));
    let ahead = secs(now, t.run_at);
    assert!((3590.0..=3600.0).contains(&ahead), "run_at {ahead}s ahead");

    let t = get(&db, far).await;
    assert_eq!((t.state, t.attempt, t.snoozes), (TaskState::Pending, 0, 1));
    let ahead = secs(now, t.run_at);
    let max = MAX_DELAY.as_secs_f64();
    assert!((max - 60.0..=max).contains(&ahead), "run_at {ahead}s ahead");
    assert_eq!(report.stats.snoozed, 2);
    assert_eq!(report.stats.retried, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snoozes_beyond_max_snoozes_count_as_failed_attempts() {
    let Some(db) = TestDb::new_or_skip().await else {
        return;
    };
    let runs = Runs::default();
    // MAX_SNOOZES = 2, MAX_ATTEMPTS = 2, snoozes every time.
    let id = Sleepy {
        n: 1,
        steps: vec![Step::SnoozeMs(20)],
    }
    .enqueue(&db.pool)
    .await
    .unwrap()
    .id;
    let w = RunningWorker::spawn(worker(&db, &runs));
    let t = wait_state(&db, id, TaskState::Dead).await;
    let report = w.stop().await;
    let seen: Vec<(u32, u32)> = runs.of(1).iter().map(|s| (s.attempt, s.snoozes)).collect();
    // Two free snoozes, then each snooze uses an attempt: the second one exhausts them.
    assert_eq!(seen, [(1, 0), (1, 1), (1, 2), (2, 2)]);
    assert_eq!((t.attempt, t.snoozes), (2, 2));
    let e = t.last_error.unwrap();
    assert!(
        e.contains("snoozed 2 times, the limit (max_snoozes = 2)"),
        "{e}"
    );
    assert!(e.contains("attempts exhausted: 2/2"), "{e}");
    let s = report.stats;
    assert_eq!((s.snoozed, s.retried, s.dead), (2, 1, 1));
}

// --- reschedule and priority -----------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reschedule_and_priority_change_pending_tasks_only() {
    let Some(db) = TestDb::new_or_skip().await else {
        return;
    };
    let client = Client::new(db.pool.clone());
    let id = script(1, &[Step::Ok]).enqueue(&db.pool).await.unwrap().id;

    client
        .reschedule(id, Duration::from_secs(600))
        .await
        .unwrap();
    let now = db_now(&db).await;
    let t = get(&db, id).await;
    assert!(
        (595.0..=600.0).contains(&secs(now, t.run_at)),
        "{}",
        t.run_at
    );
    assert_eq!(
        (t.state, t.attempt, t.lease_epoch),
        (TaskState::Pending, 0, 0)
    );

    let at = DateTime::parse_from_rfc3339("2031-05-06T07:08:09.123456Z")
        .unwrap()
        .with_timezone(&Utc);
    client.reschedule_at(id, at).await.unwrap();
    assert_eq!(get(&db, id).await.run_at, at);

    client.reschedule(id, Duration::ZERO).await.unwrap();
    let t = get(&db, id).await;
    assert!(t.run_at <= db_now(&db).await, "due now");

    client.set_priority(id, -7).await.unwrap();
    client.set_priority(id, -7).await.unwrap(); // the same value again is fine
    assert_eq!(get(&db, id).await.priority, -7);

    // Out of range: a typed error, the row unchanged.
    let before = get(&db, id).await;
    let e = client
        .reschedule(id, MAX_DELAY + Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::InvalidSchedule(_)), "{e:?}");
    let e = client
        .reschedule_at(id, Utc::now() + chrono::Duration::days(365 * 11))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::InvalidSchedule(_)), "{e:?}");
    assert_eq!(get(&db, id).await.run_at, before.run_at);

    // Running, terminal and unknown tasks.
    for state in ["running", "succeeded", "expired"] {
        sqlx::query("UPDATE taskq_tasks SET state = ? WHERE id = ?")
            .bind(state)
            .bind(id.0)
            .execute(&db.pool)
            .await
            .unwrap();
        let expected: TaskState = state.parse().unwrap();
        for e in [
            client.reschedule(id, Duration::ZERO).await.unwrap_err(),
            client.reschedule_at(id, at).await.unwrap_err(),
            client.set_priority(id, 3).await.unwrap_err(),
        ] {
            match e {
                Error::WrongState {
                    id: got,
                    state,
                    expected: "pending",
                } => assert_eq!((got, state), (id, expected)),
                other => panic!("{other:?}"),
            }
        }
        let t = get(&db, id).await;
        assert_eq!((t.priority, t.run_at), (-7, before.run_at));
    }
    let unknown = TaskId(999_999);
    assert!(matches!(
        client.reschedule(unknown, Duration::ZERO).await,
        Err(Error::NotFound(i)) if i == unknown
    ));
    assert!(matches!(
        client.set_priority(unknown, 1).await,
        Err(Error::NotFound(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rescheduled_or_reprioritized_task_runs_accordingly() {
    let Some(db) = TestDb::new_or_skip().await else {
        return;
    };
    let client = Client::new(db.pool.clone());
    let runs = Runs::default();
    let started = Started::default();
    let x = script(1, &[Step::Ok])
        .with_delay(Duration::from_secs(3600))
        .enqueue(&db.pool)
        .await
        .unwrap()
        .id;
    let _y = script(2, &[Step::Ok]).enqueue(&db.pool).await.unwrap().id;
    let z = script(3, &[Step::Ok]).enqueue(&db.pool).await.unwrap().id;
    let later = script(4, &[Step::Ok]).enqueue(&db.pool).await.unwrap().id;
    client.set_priority(z, -5).await.unwrap();
    client.reschedule(x, Duration::ZERO).await.unwrap(); // due now, after y
    client
        .reschedule(later, Duration::from_secs(3600))
        .await
        .unwrap();
    let w = RunningWorker::spawn(
        worker(&db, &runs)
            .data(started.clone())
            .queue("default", 1)
            .claim_batch(1),
    );
    wait_until(Duration::from_secs(20), "three ran", || async {
        db.count("state = 'succeeded'").await == 3
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    w.stop().await;
    assert_eq!(*started.0.lock().unwrap(), [3, 2, 1]);
    assert_eq!(get(&db, later).await.state, TaskState::Pending);
}

// --- deadlines -------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_past_its_deadline_is_never_started() {
    let Some(db) = TestDb::new_or_skip().await else {
        return;
    };
    let runs = Runs::default();
    let now = db_now(&db).await;
    let past = script(1, &[Step::Ok])
        .with_deadline(now - chrono::Duration::seconds(1))
        .enqueue(&db.pool)
        .await
        .unwrap()
        .id;
    let ttl = script(2, &[Step::Ok])
        .with_ttl(Duration::from_millis(200))
        .enqueue(&db.pool)
        .await
        .unwrap()
        .id;
    // The type's TTL (300 ms) applies without an option.
    let typed = ShortLived {
        n: 3,
        steps: vec![Step::Ok],
    }
    .enqueue(&db.pool)
    .await
    .unwrap()
    .id;
    // Deadlines in the future, and none: these run.
    let future = script(4, &[Step::Ok])
        .with_deadline(now + chrono::Duration::hours(1))
        .enqueue(&db.pool)
        .await
        .unwrap()
        .id;
    let longer = ShortLived {
        n: 5,
        steps: vec![Step::Ok],
    }
    .with_ttl(Duration::from_secs(3600))
    .enqueue(&db.pool)
    .await
    .unwrap()
    .id;
    let plain = script(6, &[Step::Ok]).enqueue(&db.pool).await.unwrap().id;
    tokio::time::sleep(Duration::from_millis(400)).await;

    let w = RunningWorker::spawn(worker(&db, &runs));
    for id in [future, longer, plain] {
        wait_state(&db, id, TaskState::Succeeded).await;
    }
    for id in [past, ttl, typed] {
        wait_state(&db, id, TaskState::Expired).await;
    }
    let report = w.stop().await;
    assert_eq!(
        runs.order(),
        [4, 5, 6],
        "expired tasks never reach a handler"
    );
    for id in [past, ttl, typed] {
        let t = get(&db, id).await;
        assert_eq!((t.attempt, t.lease_epoch), (0, 0), "never claimed");
        assert_eq!(t.worker_id, None);
        let (deadline, finished) = (t.deadline.unwrap(), t.finished_at.unwrap());
        assert!(deadline < finished, "{deadline} < {finished}");
        assert_eq!(t.last_error, None);
    }
    let t = get(&db, longer).await;
    let d = secs(t.created_at, t.deadline.unwrap());
    assert!(
        (3599.9..=3600.1).contains(&d),
        "with_ttl overrides the type's TTL: {d}"
    );
    assert_eq!(get(&db, plain).await.deadline, None);
    let s = report.stats;
    assert_eq!((s.expired, s.claimed, s.succeeded), (3, 3, 3));

    // Visible to the client: state filter, stats, purge.
    let client = Client::new(db.pool.clone());
    let filter = ListFilter {
        state: Some(TaskState::Expired),
        ..Default::default()
    };
    assert_eq!(client.count(&filter).await.unwrap(), 3);
    let stats = client.stats().await.unwrap();
    assert!(
        stats
            .iter()
            .any(|c| c.state == TaskState::Expired && c.count == 3),
        "{stats:?}"
    );
    let n = client
        .purge(Some(TaskState::Expired), Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(n, 3);
    assert_eq!(db.count("state = 'expired'").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_task_is_not_stopped_by_its_deadline() {
    let Some(db) = TestDb::new_or_skip().await else {
        return;
    };
    let runs = Runs::default();
    let id = script(1, &[Step::SleepMs(800)])
        .with_ttl(Duration::from_millis(300))
        .enqueue(&db.pool)
        .await
        .unwrap()
        .id;
    let w = RunningWorker::spawn(worker(&db, &runs));
    let t = wait_state(&db, id, TaskState::Succeeded).await;
    let report = w.stop().await;
    assert!(t.finished_at.unwrap() > t.deadline.unwrap());
    assert_eq!(
        runs.of(1),
        [Seen {
            attempt: 1,
            snoozes: 0,
            canceled: false
        }],
        "ran once, to its end, without a cancel signal"
    );
    assert_eq!((report.stats.expired, report.stats.succeeded), (0, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_or_snooze_due_after_the_deadline_expires() {
    let Some(db) = TestDb::new_or_skip().await else {
        return;
    };
    let runs = Runs::default();
    // Fails, and its retry is due after its deadline.
    let retried = ShortLived {
        n: 1,
        steps: vec![Step::RetryAfterMs(500)],
    }
    .with_ttl(Duration::from_millis(400))
    .enqueue(&db.pool)
    .await
    .unwrap()
    .id;
    // Snoozes past its deadline.
    let snoozed = script(2, &[Step::SnoozeMs(500), Step::Ok])
        .with_ttl(Duration::from_millis(400))
        .enqueue(&db.pool)
        .await
        .unwrap()
        .id;
    let w = RunningWorker::spawn(worker(&db, &runs));
    let a = wait_state(&db, retried, TaskState::Expired).await;
    let b = wait_state(&db, snoozed, TaskState::Expired).await;
    let report = w.stop().await;
    assert_eq!(runs.of(1).len(), 1);
    assert_eq!(runs.of(2).len(), 1);
    assert_eq!(
        (a.attempt, a.last_error.as_deref()),
        (1, Some("not yet (run 1)"))
    );
    assert_eq!((b.attempt, b.snoozes), (0, 1));
    assert_eq!(report.stats.expired, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_and_live_tasks_in_one_claim() {
    let Some(db) = TestDb::new_or_skip().await else {
        return;
    };
    let runs = Runs::default();
    let now = db_now(&db).await;
    let mut tx = db.pool.begin().await.unwrap();
    // Interleaved in claim order: even numbers expired, odd ones live; one batch insert.
    let tasks = (0..20).map(|n| {
        let t = script(n, &[Step::Ok]).enqueue_options();
        if n % 2 == 0 {
            t.with_deadline(now - chrono::Duration::seconds(5))
        } else {
            t
        }
    });
    taskq::enqueue::enqueue_many(&mut tx, tasks).await.unwrap();
    tx.commit().await.unwrap();
    let w = RunningWorker::spawn(worker(&db, &runs).queue("default", 32));
    wait_until(Duration::from_secs(20), "all done", || async {
        db.count("state IN ('succeeded', 'expired')").await == 20
    })
    .await;
    let report = w.stop().await;
    assert_eq!(
        runs.order(),
        (0..20).filter(|n| n % 2 == 1).collect::<Vec<_>>()
    );
    assert_eq!(db.count("state = 'expired' AND attempt = 0").await, 10);
    assert_eq!(db.count("state = 'succeeded' AND attempt = 1").await, 10);
    assert_eq!((report.stats.expired, report.stats.claimed), (10, 10));
    assert_eq!(report.stats.db_errors, 0);
}

/// Locks the rows `ids` in another READ COMMITTED transaction and keeps it open.
async fn hold_rows(db: &TestDb, ids: &[u64]) -> sqlx::pool::PoolConnection<sqlx::MySql> {
    let mut conn = db.pool.acquire().await.unwrap();
    sqlx::query("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        .execute(&mut *conn)
        .await
        .unwrap();
    sqlx::query("BEGIN").execute(&mut *conn).await.unwrap();
    let list = ids.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
    let locked: Vec<u64> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT id FROM taskq_tasks FORCE INDEX (PRIMARY) WHERE id IN ({list}) FOR UPDATE"
    )))
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    assert_eq!(locked.len(), ids.len());
    conn
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_locking_scan_expires_rows_past_their_deadline_too() {
    let Some(db) = TestDb::new_or_skip().await else {
        return;
    };
    let runs = Runs::default();
    let now = db_now(&db).await;
    let mut tx = db.pool.begin().await.unwrap();
    taskq::enqueue::enqueue_many(&mut tx, (0..40).map(|n| script(n, &[Step::Ok])))
        .await
        .unwrap();
    taskq::enqueue::enqueue_many(
        &mut tx,
        (40..43).map(|n| script(n, &[Step::Ok]).with_deadline(now)),
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let ids: Vec<u64> = sqlx::query_scalar("SELECT id FROM taskq_tasks ORDER BY id LIMIT 40")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    // 40 held rows: more than the most candidates a claim at concurrency 4 reads (4 × 8), so
    // only the locking scan that follows an all-held candidate claim reaches the 3 behind.
    let mut holder = hold_rows(&db, &ids).await;
    let w = RunningWorker::spawn(worker(&db, &runs).queue("default", 4));
    wait_until(Duration::from_secs(20), "3 expired", || async {
        db.count("state = 'expired'").await == 3
    })
    .await;
    assert_eq!(db.count("state = 'pending' AND attempt = 0").await, 40);
    sqlx::query("COMMIT").execute(&mut *holder).await.unwrap();
    wait_until(Duration::from_secs(20), "40 succeeded", || async {
        db.count("state = 'succeeded'").await == 40
    })
    .await;
    let report = w.stop().await;
    assert_eq!(runs.order(), (0..40).collect::<Vec<_>>());
    assert_eq!((report.stats.expired, report.stats.claimed), (3, 40));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadlines_are_stored_by_every_enqueue_path_and_checked() {
    let Some(db) = TestDb::new_or_skip().await else {
        return;
    };
    let at = DateTime::parse_from_rfc3339("2030-01-02T03:04:05.678901Z")
        .unwrap()
        .with_timezone(&Utc);
    let deadline_ahead = |t: &TaskInfo| secs(t.created_at, t.deadline.unwrap());

    let mut tx = db.pool.begin().await.unwrap();
    let a = script(1, &[Step::Ok])
        .with_ttl(Duration::from_secs(90))
        .enqueue_tx(&mut tx)
        .await
        .unwrap()
        .id;
    let b = script(2, &[Step::Ok])
        .with_ttl(Duration::from_secs(90))
        .with_deadline(at) // the last of the two wins
        .enqueue_tx(&mut tx)
        .await
        .unwrap()
        .id;
    let many = taskq::enqueue::enqueue_many(
        &mut tx,
        vec![
            script(3, &[Step::Ok]).with_ttl(Duration::from_secs(90)),
            script(4, &[Step::Ok]).with_deadline(at),
            script(5, &[Step::Ok]).enqueue_options(),
            script(6, &[Step::Ok])
                .with_deadline(at)
                .with_idempotency_key("k6"), // the one-row path
        ],
    )
    .await
    .unwrap();
    let typed = taskq::enqueue::enqueue_many(
        &mut tx,
        [ShortLived {
            n: 7,
            steps: vec![],
        }],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let t = get(&db, a).await;
    assert!((89.99..=90.01).contains(&deadline_ahead(&t)), "{t:?}");
    assert_eq!(get(&db, b).await.deadline, Some(at));
    let t = get(&db, many[0].id).await;
    assert!((89.99..=90.01).contains(&deadline_ahead(&t)), "{t:?}");
    assert_eq!(get(&db, many[1].id).await.deadline, Some(at));
    assert_eq!(get(&db, many[2].id).await.deadline, None);
    assert_eq!(get(&db, many[3].id).await.deadline, Some(at));
    let t = get(&db, typed[0].id).await;
    assert!((0.29..=0.31).contains(&deadline_ahead(&t)), "{t:?}");

    // Bad deadlines are typed errors and write nothing.
    let before = db.count("1 = 1").await;
    let now = Utc::now();
    let bad = [
        script(8, &[]).with_ttl(Duration::ZERO),
        script(8, &[]).with_ttl(MAX_DELAY + Duration::from_secs(1)),
        script(8, &[])
            .with_delay(Duration::from_secs(60))
            .with_ttl(Duration::from_secs(60)),
        script(8, &[])
            .with_run_at(now + chrono::Duration::hours(2))
            .with_deadline(now + chrono::Duration::hours(1)),
        script(8, &[]).with_deadline(now + chrono::Duration::days(365 * 11)),
    ];
    for e in bad {
        let err = e.clone().enqueue(&db.pool).await.unwrap_err();
        assert!(matches!(err, Error::InvalidSchedule(_)), "{e:?}: {err:?}");
        let mut tx = db.pool.begin().await.unwrap();
        let err = taskq::enqueue::enqueue_many(&mut tx, [e])
            .await
            .unwrap_err();
        assert!(matches!(err, Error::InvalidSchedule(_)), "{err:?}");
    }
    assert_eq!(db.count("1 = 1").await, before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_tasks_are_pruned_by_their_own_retention() {
    let Some(db) = TestDb::new_or_skip().await else {
        return;
    };
    let runs = Runs::default();
    for n in 0..4 {
        script(n, &[Step::Ok]).enqueue(&db.pool).await.unwrap();
    }
    sqlx::query(
        "UPDATE taskq_tasks SET state = IF(id % 2 = 0, 'expired', 'canceled'),
           finished_at = UTC_TIMESTAMP(6) - INTERVAL 2 HOUR",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let keep_canceled = Retention {
        canceled: None,
        expired: Some(Duration::from_secs(3600)),
        interval: Duration::from_millis(100),
        ..Retention::disabled()
    };
    let w = RunningWorker::spawn(worker(&db, &runs).retention(keep_canceled));
    wait_until(Duration::from_secs(10), "old expired pruned", || async {
        db.count("state = 'expired'").await == 0
    })
    .await;
    let report = w.stop().await;
    assert_eq!(db.count("state = 'canceled'").await, 2);
    assert_eq!(report.stats.pruned, 2);
    assert_eq!(
        Retention::default().expired,
        Some(Duration::from_secs(7 * 86_400))
    );
    assert_eq!(Retention::disabled().expired, None);
}
