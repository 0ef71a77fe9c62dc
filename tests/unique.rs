//! Unique tasks against a real database: one live task per identity while pending, while
//! running or per window; duplicates report the holder without aborting the caller's
//! transaction; concurrent enqueues from many connections make one task; the identity is freed
//! by the statements that end the hold (claim, write-back, reaper, cancel) and taken back by a
//! manual retry; a producer's open transaction defers the claim or write-back that would free
//! it instead of blocking the worker; idempotency keys keep their meaning.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::Connection;
use taskq::{
    Client, Data, Enqueued, Error, Task, TaskContext, TaskError, TaskId, TaskState,
    client::TaskInfo,
    unique::{Unique, UniqueBy, UniqueHold},
};
use taskq_tests::backends::{Db, TestBackend};
use taskq_tests::{RunningWorker, TestDb, wait_until};

// ---------------------------------------------------------------------------------------------
// Tasks

/// Handlers record their runs here and, while the gate is closed, wait for it to open.
#[derive(Clone)]
struct Gate(Arc<GateInner>);

struct GateInner {
    open: tokio::sync::watch::Sender<bool>,
    runs: Mutex<Vec<String>>,
}

impl Gate {
    fn new(open: bool) -> Self {
        Self(Arc::new(GateInner {
            open: tokio::sync::watch::Sender::new(open),
            runs: Mutex::new(Vec::new()),
        }))
    }
    async fn pass(&self, label: String) {
        self.0.runs.lock().unwrap().push(label);
        let mut rx = self.0.open.subscribe();
        let _ = rx.wait_for(|open| *open).await;
    }
    fn open(&self) {
        self.0.open.send_replace(true);
    }
    fn runs(&self, label: &str) -> usize {
        self.0
            .runs
            .lock()
            .unwrap()
            .iter()
            .filter(|r| *r == label)
            .count()
    }
}

/// Unique by the whole payload, held while pending (the default).
#[taskq::task(queue = "u", unique)]
async fn sync_account(account: u64, gate: Data<Gate>) -> Result<(), TaskError> {
    gate.pass(format!("sync {account}")).await;
    Ok(())
}

/// Unique by `account` only, held while pending or running.
#[taskq::task(queue = "u", unique(by = [account], while = "running"))]
async fn rebuild(account: u64, reason: String, gate: Data<Gate>) -> Result<(), TaskError> {
    gate.pass(format!("rebuild {account} {reason}")).await;
    Ok(())
}

/// One per account per hour-long window.
#[taskq::task(queue = "u", unique(by = [account], period = "1h"))]
async fn digest(account: u64, gate: Data<Gate>) -> Result<(), TaskError> {
    gate.pass(format!("digest {account}")).await;
    Ok(())
}

/// Not unique unless an enqueue says so.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Plain {
    account: u64,
    text: String,
}

impl Task for Plain {
    const NAME: &'static str = "plain";
    const QUEUE: &'static str = "u";
    async fn run(self, cx: TaskContext) -> Result<(), TaskError> {
        let gate = cx.data::<Gate>().expect("gate registered");
        gate.pass(format!("plain {} {}", self.account, self.text))
            .await;
        Ok(())
    }
}

fn plain(account: u64, text: &str) -> Plain {
    Plain {
        account,
        text: text.into(),
    }
}

/// Hand-written, unique through the trait constant; dies at its first attempt.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Doomed {
    account: u64,
}

impl Task for Doomed {
    const NAME: &'static str = "doomed";
    const QUEUE: &'static str = "u";
    const UNIQUE: Option<Unique> = Some(Unique::fields(&["account"]).while_running());
    async fn run(self, _cx: TaskContext) -> Result<(), TaskError> {
        Err(TaskError::permanent(std::io::Error::other("doomed")))
    }
}

/// Fails its first attempt (retried 300 ms later), then succeeds. Unique per enqueue.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Flaky {
    account: u64,
}

impl Task for Flaky {
    const NAME: &'static str = "flaky";
    const QUEUE: &'static str = "u";
    async fn run(self, cx: TaskContext) -> Result<(), TaskError> {
        let gate = cx.data::<Gate>().expect("gate registered");
        gate.pass(format!("flaky {}", self.account)).await;
        if cx.attempt() == 1 {
            return Err(TaskError::retry_after(
                Duration::from_millis(300),
                std::io::Error::other("first attempt fails"),
            ));
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Helpers

fn worker<B: TestBackend>(db: &Db<B>, gate: &Gate) -> taskq::worker::WorkerBuilder {
    db.worker()
        .register::<SyncAccount>()
        .register::<Rebuild>()
        .register::<Digest>()
        .register::<Plain>()
        .register::<Doomed>()
        .register::<Flaky>()
        .data(gate.clone())
}

async fn info<B: TestBackend>(db: &Db<B>, id: TaskId) -> TaskInfo {
    Client::new(db.pool.clone()).get(id).await.unwrap()
}

async fn wait_state<B: TestBackend>(db: &Db<B>, id: TaskId, state: TaskState) -> TaskInfo {
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
    info(db, id).await
}

fn new(e: &Enqueued) -> TaskId {
    assert!(
        !e.duplicate,
        "expected a new task, got a duplicate of {}",
        e.id
    );
    e.id
}

fn dup_of(e: &Enqueued, id: TaskId) {
    assert!(
        e.duplicate,
        "expected a duplicate of {id}, got new task {}",
        e.id
    );
    assert_eq!(e.id, id);
}

async fn db_clock_us<B: TestBackend>(db: &Db<B>) -> i64 {
    db.server_now().await.timestamp_micros()
}

// ---------------------------------------------------------------------------------------------
// Tests

async fn a_duplicate_while_pending_returns_the_pending_task_inside_the_callers_transaction<
    B: TestBackend,
>(
    db: Db<B>,
) {
    db.exec("CREATE TABLE orders (id BIGINT PRIMARY KEY)").await;
    let first = new(&SyncAccount { account: 1 }.enqueue(&db.pool).await.unwrap());
    let mut tx = db.begin().await;
    let again = SyncAccount { account: 1 }
        .enqueue_tx(&mut tx)
        .await
        .unwrap();
    dup_of(&again, first);
    // The transaction goes on and commits: the duplicate raised no error that aborts it.
    db.exec_in(&mut tx, "INSERT INTO orders VALUES (1)").await;
    let other = new(&SyncAccount { account: 2 }
        .enqueue_tx(&mut tx)
        .await
        .unwrap());
    tx.commit().await.unwrap();
    let orders = db.scalar("SELECT COUNT(*) FROM orders").await;
    assert_eq!(orders, 1);
    assert_eq!(db.count("name = 'sync_account'").await, 2);
    let (a, b) = (info(&db, first).await, info(&db, other).await);
    assert!(a.unique_held && b.unique_held);
    assert_ne!(a.unique_key, b.unique_key);
    assert_eq!(a.unique_key.as_ref().map(String::len), Some(64));
    // Scheduled tasks are pending too.
    let later = new(&SyncAccount { account: 3 }
        .with_delay(Duration::from_secs(3600))
        .enqueue(&db.pool)
        .await
        .unwrap());
    dup_of(
        &SyncAccount { account: 3 }.enqueue(&db.pool).await.unwrap(),
        later,
    );
    // A duplicate in a transaction that rolls back leaves the holder as it was.
    let mut tx = db.begin().await;
    dup_of(
        &SyncAccount { account: 1 }
            .enqueue_tx(&mut tx)
            .await
            .unwrap(),
        first,
    );
    tx.rollback().await.unwrap();
    assert_eq!(db.count("name = 'sync_account'").await, 3);
    assert!(info(&db, first).await.unique_held);
}

async fn a_finished_task_frees_its_identity<B: TestBackend>(db: Db<B>) {
    let gate = Gate::new(true);
    let first = new(&SyncAccount { account: 1 }.enqueue(&db.pool).await.unwrap());
    let w = RunningWorker::spawn(worker(&db, &gate));
    let done = wait_state(&db, first, TaskState::Succeeded).await;
    assert!(!done.unique_held);
    assert!(done.unique_key.is_some());
    let second = new(&SyncAccount { account: 1 }.enqueue(&db.pool).await.unwrap());
    assert_ne!(second, first);
    wait_state(&db, second, TaskState::Succeeded).await;
    assert_eq!(gate.runs("sync 1"), 2);
    // Same for `while = "running"`.
    let r1 = new(&Rebuild {
        account: 5,
        reason: "a".into(),
    }
    .enqueue(&db.pool)
    .await
    .unwrap());
    wait_state(&db, r1, TaskState::Succeeded).await;
    let r2 = new(&Rebuild {
        account: 5,
        reason: "a".into(),
    }
    .enqueue(&db.pool)
    .await
    .unwrap());
    wait_state(&db, r2, TaskState::Succeeded).await;
    w.stop().await;
}

async fn while_pending_a_started_task_no_longer_holds_its_identity<B: TestBackend>(db: Db<B>) {
    let gate = Gate::new(false);
    let first = new(&SyncAccount { account: 1 }.enqueue(&db.pool).await.unwrap());
    let w = RunningWorker::spawn(worker(&db, &gate));
    let running = wait_state(&db, first, TaskState::Running).await;
    assert!(
        !running.unique_held,
        "the claim frees a while-pending identity"
    );
    // (Scheduled an hour ahead so that the worker does not start it too.)
    let second = new(&SyncAccount { account: 1 }
        .with_delay(Duration::from_secs(3600))
        .enqueue(&db.pool)
        .await
        .unwrap());
    dup_of(
        &SyncAccount { account: 1 }.enqueue(&db.pool).await.unwrap(),
        second,
    );
    gate.open();
    wait_state(&db, first, TaskState::Succeeded).await;
    assert_eq!(info(&db, second).await.state, TaskState::Pending);
    w.stop().await;
}

async fn while_running_a_started_task_holds_its_identity_by_a_subset_of_fields<B: TestBackend>(
    db: Db<B>,
) {
    let gate = Gate::new(false);
    let first = new(&Rebuild {
        account: 1,
        reason: "signup".into(),
    }
    .enqueue(&db.pool)
    .await
    .unwrap());
    // Pending: another reason for the same account is the same identity, another account is not.
    dup_of(
        &Rebuild {
            account: 1,
            reason: "payment".into(),
        }
        .enqueue(&db.pool)
        .await
        .unwrap(),
        first,
    );
    let other = new(&Rebuild {
        account: 2,
        reason: "signup".into(),
    }
    .enqueue(&db.pool)
    .await
    .unwrap());
    let w = RunningWorker::spawn(worker(&db, &gate));
    let running = wait_state(&db, first, TaskState::Running).await;
    assert!(running.unique_held);
    dup_of(
        &Rebuild {
            account: 1,
            reason: "again".into(),
        }
        .enqueue(&db.pool)
        .await
        .unwrap(),
        first,
    );
    assert_eq!(db.count("name = 'rebuild'").await, 2);
    gate.open();
    let done = wait_state(&db, first, TaskState::Succeeded).await;
    assert!(!done.unique_held);
    wait_state(&db, other, TaskState::Succeeded).await;
    let third = new(&Rebuild {
        account: 1,
        reason: "later".into(),
    }
    .enqueue(&db.pool)
    .await
    .unwrap());
    wait_state(&db, third, TaskState::Succeeded).await;
    // The stored payload of a duplicate is the holder's.
    assert_eq!(gate.runs("rebuild 1 signup"), 1);
    assert_eq!(gate.runs("rebuild 1 payment"), 0);
    w.stop().await;
}

async fn a_retry_keeps_a_while_running_identity_and_a_while_pending_one_is_not_taken_back<
    B: TestBackend,
>(
    db: Db<B>,
) {
    let gate = Gate::new(true);
    let w = RunningWorker::spawn(worker(&db, &gate));
    // while = "running": pending again for its retry, it still holds the identity.
    let running = Unique::fields(&["account"]).while_running();
    let a = new(&Flaky { account: 1 }
        .with_unique(running)
        .enqueue(&db.pool)
        .await
        .unwrap());
    let client = Client::new(db.pool.clone());
    wait_until(Duration::from_secs(20), "first attempt failed", || {
        let client = client.clone();
        async move {
            client
                .get(a)
                .await
                .is_ok_and(|t| t.state == TaskState::Pending && t.attempt == 1)
        }
    })
    .await;
    assert!(info(&db, a).await.unique_held);
    dup_of(
        &Flaky { account: 1 }
            .with_unique(running)
            .enqueue(&db.pool)
            .await
            .unwrap(),
        a,
    );
    wait_state(&db, a, TaskState::Succeeded).await;
    // while = "pending": the claim freed it, and the retry does not take it back, so a newer
    // duplicate is accepted and both run.
    let pending = Unique::fields(&["account"]);
    let b = new(&Flaky { account: 2 }
        .with_unique(pending)
        .enqueue(&db.pool)
        .await
        .unwrap());
    wait_until(Duration::from_secs(20), "first attempt failed", || {
        let client = client.clone();
        async move {
            client
                .get(b)
                .await
                .is_ok_and(|t| t.state == TaskState::Pending && t.attempt == 1)
        }
    })
    .await;
    assert!(!info(&db, b).await.unique_held);
    let c = new(&Flaky { account: 2 }
        .with_unique(pending)
        .enqueue(&db.pool)
        .await
        .unwrap());
    wait_state(&db, b, TaskState::Succeeded).await;
    wait_state(&db, c, TaskState::Succeeded).await;
    assert_eq!(gate.runs("flaky 2"), 4);
    w.stop().await;
}

async fn a_window_holds_the_identity_through_success_until_it_ends<B: TestBackend>(db: Db<B>) {
    let gate = Gate::new(true);
    let w = RunningWorker::spawn(worker(&db, &gate));
    let first = new(&Digest { account: 1 }.enqueue(&db.pool).await.unwrap());
    let done = wait_state(&db, first, TaskState::Succeeded).await;
    assert!(done.unique_held, "a success keeps a window's identity");
    dup_of(
        &Digest { account: 1 }.enqueue(&db.pool).await.unwrap(),
        first,
    );
    new(&Digest { account: 2 }.enqueue(&db.pool).await.unwrap());
    w.stop().await;

    // Two-second windows of the database clock, per enqueue: start early in one.
    let two_s = Unique::fields(&["account"]).period(Duration::from_secs(2));
    loop {
        if db_clock_us(&db).await % 2_000_000 < 800_000 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let a = new(&plain(7, "a")
        .with_unique(two_s)
        .enqueue(&db.pool)
        .await
        .unwrap());
    dup_of(
        &plain(7, "b")
            .with_unique(two_s)
            .enqueue(&db.pool)
            .await
            .unwrap(),
        a,
    );
    // The next window: a new task, which its window's duplicates then find.
    let left = 2_000_000 - db_clock_us(&db).await % 2_000_000;
    tokio::time::sleep(Duration::from_micros(left as u64 + 100_000)).await;
    let b = new(&plain(7, "c")
        .with_unique(two_s)
        .enqueue(&db.pool)
        .await
        .unwrap());
    dup_of(
        &plain(7, "d")
            .with_unique(two_s)
            .enqueue(&db.pool)
            .await
            .unwrap(),
        b,
    );
    assert_ne!(info(&db, a).await.unique_key, info(&db, b).await.unique_key);
    // Canceled within its window, a task frees the window's identity.
    Client::new(db.pool.clone()).cancel(b).await.unwrap();
    assert!(!info(&db, b).await.unique_held);
    let c = new(&plain(7, "e")
        .with_unique(two_s)
        .enqueue(&db.pool)
        .await
        .unwrap());
    assert_eq!(info(&db, b).await.unique_key, info(&db, c).await.unique_key);
}

/// 16 connections, each in its own transaction at `isolation`, enqueue the same unique task
/// at once and commit: one task, every caller gets its id, 15 learn they were duplicates.
// MySQL only: InnoDB isolation levels (SQLite's writers never overlap).
async fn concurrent_duplicates(isolation: &str) {
    let Some(db) = TestDb::new_or_skip().await else {
        return;
    };
    let pool = db.pool_with(16).await;
    for round in 0..5u64 {
        let barrier = Arc::new(tokio::sync::Barrier::new(16));
        let mut handles = Vec::new();
        for _ in 0..16 {
            let pool = pool.clone();
            let barrier = barrier.clone();
            let isolation = isolation.to_owned();
            handles.push(tokio::spawn(async move {
                let mut conn = pool.acquire().await.unwrap();
                sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                    "SET SESSION TRANSACTION ISOLATION LEVEL {isolation}"
                )))
                .execute(&mut *conn)
                .await
                .unwrap();
                let mut tx = conn.begin().await.unwrap();
                // A read first, so a REPEATABLE READ snapshot is taken before the race.
                let _: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM taskq_tasks")
                    .fetch_one(&mut *tx)
                    .await
                    .unwrap();
                barrier.wait().await;
                let out = Rebuild {
                    account: round,
                    reason: "race".into(),
                }
                .enqueue_tx(&mut tx)
                .await
                .unwrap();
                tx.commit().await.unwrap();
                out
            }));
        }
        let mut outs = Vec::new();
        for h in handles {
            outs.push(h.await.unwrap());
        }
        assert_eq!(outs.iter().filter(|o| !o.duplicate).count(), 1, "{outs:?}");
        assert_eq!(outs.iter().filter(|o| o.duplicate).count(), 15);
        assert!(outs.iter().all(|o| o.id == outs[0].id), "{outs:?}");
        assert_eq!(
            db.count(&format!(
                "name = 'rebuild' AND payload LIKE '%\"account\":{round},%'"
            ))
            .await,
            1
        );
    }
    assert_eq!(db.count("1=1").await, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_duplicates_from_16_connections_make_one_task_read_committed() {
    concurrent_duplicates("READ COMMITTED").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_duplicates_from_16_connections_make_one_task_repeatable_read() {
    concurrent_duplicates("REPEATABLE READ").await;
}

async fn enqueue_many_makes_one_task_per_identity_and_reports_each_input<B: TestBackend>(
    db: Db<B>,
) {
    let existing = new(&SyncAccount { account: 3 }.enqueue(&db.pool).await.unwrap());
    let mut tx = db.begin().await;
    let outs = taskq::enqueue::enqueue_many(
        &mut tx,
        [
            SyncAccount { account: 1 }.enqueue_options(),
            SyncAccount { account: 2 }.enqueue_options(),
            SyncAccount { account: 1 }.enqueue_options(),
            SyncAccount { account: 3 }.enqueue_options(),
            SyncAccount { account: 4 }.with_unique(None),
            SyncAccount { account: 4 }.with_unique(None),
        ],
    )
    .await
    .unwrap();
    let plains = taskq::enqueue::enqueue_many(
        &mut tx,
        [
            plain(1, "x").enqueue_options(),
            plain(1, "x").with_unique(Unique::payload()),
            plain(1, "x").enqueue_options(),
            plain(1, "x").with_unique(Unique::payload()),
        ],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let a = new(&outs[0]);
    let b = new(&outs[1]);
    dup_of(&outs[2], a);
    dup_of(&outs[3], existing);
    let (c, d) = (new(&outs[4]), new(&outs[5]));
    assert!(a < b && b < c && c < d);
    assert_eq!(db.count("name = 'sync_account'").await, 5);
    let p = new(&plains[1]);
    new(&plains[0]);
    new(&plains[2]);
    dup_of(&plains[3], p);
    assert_eq!(db.count("name = 'plain'").await, 3);
    assert_eq!(db.count("name = 'plain' AND unique_key IS NULL").await, 2);
}

async fn idempotency_keys_keep_their_meaning_next_to_unique_identities<B: TestBackend>(db: Db<B>) {
    let gate = Gate::new(true);
    let rebuild = |account: u64, key: &str| {
        Rebuild {
            account,
            reason: key.into(),
        }
        .with_idempotency_key(key)
    };
    let a = new(&rebuild(1, "k1").enqueue(&db.pool).await.unwrap());
    // The key is taken: a duplicate of its holder, whatever the identity.
    dup_of(&rebuild(2, "k1").enqueue(&db.pool).await.unwrap(), a);
    // The identity is taken: a duplicate of its holder, whatever the key.
    dup_of(&rebuild(1, "k2").enqueue(&db.pool).await.unwrap(), a);
    assert_eq!(db.count("1=1").await, 1);
    let w = RunningWorker::spawn(worker(&db, &gate));
    wait_state(&db, a, TaskState::Succeeded).await;
    w.stop().await;
    // Finished: the identity is free, the key is still taken (until retention deletes the row).
    dup_of(&rebuild(1, "k1").enqueue(&db.pool).await.unwrap(), a);
    let plain_key = new(&plain(1, "x")
        .with_idempotency_key("p1")
        .enqueue(&db.pool)
        .await
        .unwrap());
    let b = new(&rebuild(1, "k3").enqueue(&db.pool).await.unwrap());
    assert!(info(&db, b).await.unique_held);
    // When both are taken by different tasks, the key's holder is the one reported.
    let c = new(&rebuild(2, "k4").enqueue(&db.pool).await.unwrap());
    dup_of(&rebuild(2, "k3").enqueue(&db.pool).await.unwrap(), b);
    dup_of(&rebuild(1, "k4").enqueue(&db.pool).await.unwrap(), c);
    // Keys without uniqueness are unchanged.
    dup_of(
        &plain(9, "y")
            .with_idempotency_key("p1")
            .enqueue(&db.pool)
            .await
            .unwrap(),
        plain_key,
    );
    assert_eq!(db.count("1=1").await, 4);
}

// MySQL only (the four "open duplicate" tests): a producer's open transaction holds a
// duplicate's identity while workers write. On SQLite that transaction holds the only write
// lock: no worker writes meanwhile, so nothing is held elsewhere and no write-back deferred.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_duplicate_keeps_a_pending_task_from_starting_but_not_the_queue() {
    let Some(db) = TestDb::new_or_skip().await else {
        return;
    };
    let db = Db::from_test_db(db);
    let gate = Gate::new(true);
    let held = new(&SyncAccount { account: 1 }.enqueue(&db.pool).await.unwrap());
    // A producer's transaction learns it is a duplicate of `held` and stays open.
    let mut producer = db.begin().await;
    dup_of(
        &SyncAccount { account: 1 }
            .enqueue_tx(&mut producer)
            .await
            .unwrap(),
        held,
    );
    let behind = new(&plain(1, "behind").enqueue(&db.pool).await.unwrap());
    // One handler slot, so the held task at the head of the queue is in every claim.
    let w = RunningWorker::spawn(worker(&db, &gate).queue("u", 1));
    wait_state(&db, behind, TaskState::Succeeded).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t = info(&db, held).await;
    assert_eq!((t.state, t.attempt), (TaskState::Pending, 0));
    assert!(t.unique_held);
    // Once the producer commits, the task starts: after the producer's writes are visible.
    producer.commit().await.unwrap();
    let t = wait_state(&db, held, TaskState::Succeeded).await;
    assert_eq!(t.attempt, 1);
    let stats = w.stop().await.stats;
    assert_eq!(stats.db_errors, 0);
}

// MySQL only: see an_open_duplicate_keeps_a_pending_task_from_starting_but_not_the_queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_duplicate_defers_the_write_back_that_frees_the_identity_not_the_others() {
    let Some(db) = TestDb::new_or_skip().await else {
        return;
    };
    let db = Db::from_test_db(db);
    let gate = Gate::new(false);
    let held = new(&Rebuild {
        account: 1,
        reason: "x".into(),
    }
    .enqueue(&db.pool)
    .await
    .unwrap());
    let w = RunningWorker::spawn(
        worker(&db, &gate)
            .lease(Duration::from_secs(3))
            .heartbeat(Duration::from_millis(300)),
    );
    wait_state(&db, held, TaskState::Running).await;
    let mut producer = db.begin().await;
    dup_of(
        &Rebuild {
            account: 1,
            reason: "y".into(),
        }
        .enqueue_tx(&mut producer)
        .await
        .unwrap(),
        held,
    );
    let lease_before = info(&db, held).await.lease_until.unwrap();
    // The handler finishes; the outcome that frees the identity waits for the producer...
    gate.open();
    let other = new(&plain(2, "other").enqueue(&db.pool).await.unwrap());
    // ...while other outcomes are written,
    wait_state(&db, other, TaskState::Succeeded).await;
    // and the lease of the deferred one is renewed, past the 3 s it started with.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let t = info(&db, held).await;
    assert_eq!(t.state, TaskState::Running);
    assert!(t.unique_held);
    assert!(t.lease_until.unwrap() > lease_before);
    assert!(w.stats.snapshot().unique_deferred > 0);
    producer.commit().await.unwrap();
    let t = wait_state(&db, held, TaskState::Succeeded).await;
    assert!(!t.unique_held);
    assert_eq!(t.attempt, 1);
    assert_eq!(gate.runs("rebuild 1 x"), 1);
    let stats = w.stop().await.stats;
    assert_eq!(
        (stats.db_errors, stats.lost_leases, stats.fenced),
        (0, 0, 0)
    );
}

// MySQL only: see an_open_duplicate_keeps_a_pending_task_from_starting_but_not_the_queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reaper_frees_the_identity_of_a_task_it_buries_and_keeps_a_requeued_ones() {
    let Some(db) = TestDb::new_or_skip().await else {
        return;
    };
    let db = Db::from_test_db(db);
    let gate = Gate::new(false);
    let buried = new(&Rebuild {
        account: 1,
        reason: "x".into(),
    }
    .enqueue(&db.pool)
    .await
    .unwrap());
    let requeued = new(&Rebuild {
        account: 2,
        reason: "x".into(),
    }
    .enqueue(&db.pool)
    .await
    .unwrap());
    // A crashed worker's tasks: running with expired leases, one out of attempts.
    db.exec(&format!("UPDATE taskq_tasks SET state = 'running', attempt = CASE WHEN id = {} THEN 20 ELSE 1 END, lease_epoch = 4,
           worker_id = 'crashed', lease_until = {}", buried.0, db.ago(Duration::from_secs(1)))).await;
    // A producer holds the buried task's identity: the reaper leaves that task for later.
    let mut producer = db.begin().await;
    dup_of(
        &Rebuild {
            account: 1,
            reason: "y".into(),
        }
        .enqueue_tx(&mut producer)
        .await
        .unwrap(),
        buried,
    );
    let w = RunningWorker::spawn(worker(&db, &gate));
    let client = Client::new(db.pool.clone());
    wait_until(Duration::from_secs(20), "reaped and claimed again", || {
        let client = client.clone();
        async move { client.get(requeued).await.is_ok_and(|t| t.lease_epoch == 6) }
    })
    .await;
    let t = info(&db, requeued).await;
    // Reaped to pending (epoch 5), claimed again (6): the identity held all along.
    assert_eq!((t.lease_epoch, t.attempt), (6, 2));
    assert!(t.unique_held);
    dup_of(
        &Rebuild {
            account: 2,
            reason: "z".into(),
        }
        .enqueue(&db.pool)
        .await
        .unwrap(),
        requeued,
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(info(&db, buried).await.state, TaskState::Running);
    producer.commit().await.unwrap();
    let t = wait_state(&db, buried, TaskState::Dead).await;
    assert!(!t.unique_held);
    assert_eq!(t.lease_epoch, 5);
    new(&Rebuild {
        account: 1,
        reason: "again".into(),
    }
    .enqueue(&db.pool)
    .await
    .unwrap());
    gate.open();
    let stats = w.stop().await.stats;
    assert!(stats.reaped >= 2);
    assert_eq!(stats.db_errors, 0);
}

async fn cancel_frees_the_identity_and_retry_dead_takes_it_back_or_names_the_holder<
    B: TestBackend,
>(
    db: Db<B>,
) {
    let gate = Gate::new(true);
    let client = Client::new(db.pool.clone());
    // Cancel frees it.
    let canceled = new(&Doomed { account: 9 }
        .with_delay(Duration::from_secs(3600))
        .enqueue(&db.pool)
        .await
        .unwrap());
    client.cancel(canceled).await.unwrap();
    assert!(!info(&db, canceled).await.unique_held);
    // Death frees it (the trait constant declared it).
    let first = new(&Doomed { account: 1 }.enqueue(&db.pool).await.unwrap());
    let w = RunningWorker::spawn(worker(&db, &gate));
    let dead = wait_state(&db, first, TaskState::Dead).await;
    assert!(!dead.unique_held);
    let second = new(&Doomed { account: 1 }.enqueue(&db.pool).await.unwrap());
    let second_dead = wait_state(&db, second, TaskState::Dead).await;
    w.stop().await;
    // A newer task holds the identity: the retry is refused and changes nothing.
    let holder = new(&Doomed { account: 1 }.enqueue(&db.pool).await.unwrap());
    let e = client.retry_dead(first).await.unwrap_err();
    assert!(
        matches!(e, Error::UniqueHeld { id, holder: h } if id == first && h == holder),
        "{e}"
    );
    assert!(
        e.to_string().contains(&format!("held by task {holder}")),
        "{e}"
    );
    let still = info(&db, first).await;
    assert_eq!(
        (
            still.state,
            still.attempt,
            still.lease_epoch,
            still.unique_held
        ),
        (dead.state, dead.attempt, dead.lease_epoch, false)
    );
    // Bulk retry: tasks whose identity is held stay dead, the others go.
    let plain_dead = new(&plain(1, "p").enqueue(&db.pool).await.unwrap());
    db.exec(&format!(
        "UPDATE taskq_tasks SET state = 'dead', finished_at = {} WHERE id = {}",
        db.now(),
        plain_dead.0
    ))
    .await;
    assert_eq!(client.retry_all_dead(Some("u")).await.unwrap(), 1);
    assert_eq!(info(&db, plain_dead).await.state, TaskState::Pending);
    assert_eq!(info(&db, first).await.state, TaskState::Dead);
    assert_eq!(info(&db, second).await.state, TaskState::Dead);
    // Once the holder is gone, one of the two dead ones takes the identity back.
    client.cancel(holder).await.unwrap();
    assert_eq!(client.retry_all_dead(Some("u")).await.unwrap(), 1);
    let (a, b) = (info(&db, first).await, info(&db, second).await);
    assert_eq!(
        (a.state, a.attempt, a.lease_epoch),
        (TaskState::Pending, 0, dead.lease_epoch + 1)
    );
    assert!(a.unique_held);
    assert_eq!(b.state, TaskState::Dead);
    dup_of(
        &Doomed { account: 1 }.enqueue(&db.pool).await.unwrap(),
        first,
    );
    let e = client.retry_dead(second).await.unwrap_err();
    assert!(
        matches!(e, Error::UniqueHeld { holder: h, .. } if h == first),
        "{e}"
    );
    assert_eq!(info(&db, second).await.lease_epoch, second_dead.lease_epoch);
}

async fn per_enqueue_declarations_and_bad_ones<B: TestBackend>(db: Db<B>) {
    // `with_unique(None)` turns a declaration off; `with_unique(..)` replaces it.
    new(&SyncAccount { account: 1 }
        .with_unique(None)
        .enqueue(&db.pool)
        .await
        .unwrap());
    new(&SyncAccount { account: 1 }
        .with_unique(None)
        .enqueue(&db.pool)
        .await
        .unwrap());
    assert_eq!(db.count("unique_key IS NULL").await, 2);
    let by_name = Unique::fields(&[]);
    let a = new(&plain(1, "a")
        .with_unique(by_name)
        .enqueue(&db.pool)
        .await
        .unwrap());
    dup_of(
        &plain(2, "b")
            .with_unique(by_name)
            .enqueue(&db.pool)
            .await
            .unwrap(),
        a,
    );
    // The declarations the macro generated.
    assert_eq!(SyncAccount::UNIQUE, Some(Unique::payload()));
    let r = Rebuild::UNIQUE.unwrap();
    assert_eq!(r.by(), UniqueBy::Fields(&["account"]));
    assert_eq!(r.hold(), UniqueHold::Running);
    assert_eq!(
        Digest::UNIQUE.unwrap().hold(),
        UniqueHold::Window(Duration::from_secs(3600))
    );
    assert_eq!(Plain::UNIQUE, None);
    // Bad declarations are typed errors and write nothing.
    let before = db.count("1=1").await;
    for bad in [
        Unique::fields(&["acount"]),
        Unique::payload().period(Duration::ZERO),
    ] {
        let e = plain(1, "x")
            .with_unique(bad)
            .enqueue(&db.pool)
            .await
            .unwrap_err();
        assert!(matches!(e, Error::InvalidOption(_)), "{e}");
    }
    let mut tx = db.begin().await;
    let e = taskq::enqueue::enqueue_many(
        &mut tx,
        [
            plain(1, "ok").enqueue_options(),
            plain(1, "x").with_unique(Unique::fields(&["acount"])),
        ],
    )
    .await
    .unwrap_err();
    assert!(e.to_string().contains("\"acount\""), "{e}");
    tx.commit().await.unwrap();
    assert_eq!(db.count("1=1").await, before);
}

async fn the_identities_of_ended_windows_are_pruned<B: TestBackend>(db: Db<B>) {
    let one_s = Unique::fields(&["account"]).period(Duration::from_secs(1));
    let windowed = new(&plain(1, "w")
        .with_unique(one_s)
        .enqueue(&db.pool)
        .await
        .unwrap());
    let pending = new(&SyncAccount { account: 1 }.enqueue(&db.pool).await.unwrap());
    let identities = || async { db.scalar("SELECT COUNT(*) FROM taskq_unique").await };
    assert_eq!(identities().await, 2);
    // One of them is windowed (its 1 s window may already have ended on a loaded machine: the
    // window is aligned to the period, so count the row, not a future end).
    let windowed_rows = db
        .scalar("SELECT COUNT(*) FROM taskq_unique WHERE expires_at IS NOT NULL")
        .await;
    assert_eq!(windowed_rows, 1);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    // A worker that runs none of these tasks (it only works another queue) still prunes.
    let gate = Gate::new(true);
    let w = RunningWorker::spawn(worker(&db, &gate).queue("elsewhere", 1).retention(
        taskq::worker::Retention {
            interval: Duration::from_millis(100),
            ..taskq::worker::Retention::disabled()
        },
    ));
    wait_until(
        Duration::from_secs(10),
        "the ended window pruned",
        || async { identities().await == 1 },
    )
    .await;
    w.stop().await;
    assert!(!info(&db, windowed).await.unique_held);
    assert!(info(&db, pending).await.unique_held);
    assert_eq!(info(&db, windowed).await.state, TaskState::Pending);
}

// MySQL only: InnoDB row and gap locks (see an_open_duplicate_keeps_a_pending_task_...).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_duplicate_blocks_no_other_enqueue() {
    let Some(db) = TestDb::new_or_skip().await else {
        return;
    };
    let db = Db::from_test_db(db);
    let mut held = Vec::new();
    for account in (0..40).step_by(2) {
        held.push(new(&SyncAccount { account }
            .enqueue(&db.pool)
            .await
            .unwrap()));
    }
    // Producers at REPEATABLE READ (the default) hold duplicates of every identity.
    let mut producers = Vec::new();
    for (i, account) in (0..40).step_by(2).enumerate() {
        let mut tx = db.begin().await;
        dup_of(
            &SyncAccount { account }.enqueue_tx(&mut tx).await.unwrap(),
            held[i],
        );
        producers.push(tx);
    }
    // Other identities (sorting anywhere between the held ones), tasks that are not unique and
    // idempotency keys go in at once: a duplicate locks its identity's row only, no gap.
    let mut conn = db.pool.acquire().await.unwrap();
    db.exec_in(&mut conn, "SET SESSION innodb_lock_wait_timeout = 2")
        .await;
    let mut tx = conn.begin().await.unwrap();
    for account in (1..40).step_by(2) {
        new(&SyncAccount { account }.enqueue_tx(&mut tx).await.unwrap());
        new(&plain(account, "x").enqueue_tx(&mut tx).await.unwrap());
        new(&plain(account, "k")
            .with_idempotency_key(format!("k{account}"))
            .enqueue_tx(&mut tx)
            .await
            .unwrap());
    }
    tx.commit().await.unwrap();
    for p in producers {
        p.commit().await.unwrap();
    }
    assert_eq!(db.count("1=1").await, 20 + 20 + 40);
}

async fn a_failed_unique_enqueue_leaves_no_identity_behind<B: TestBackend>(db: Db<B>) {
    // The task row's insert fails (as a constraint or trigger of the application's own would
    // make it), after the identity was reserved.
    // (Trigger syntax is the one place the two dialects differ here.)
    db.exec(match db.label() {
        "mysql" => {
            "CREATE TRIGGER reject_boom BEFORE INSERT ON taskq_tasks FOR EACH ROW
             IF NEW.payload LIKE '%boom%' THEN
               SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'rejected by the test trigger';
             END IF"
        }
        _ => {
            "CREATE TRIGGER reject_boom BEFORE INSERT ON taskq_tasks FOR EACH ROW
             WHEN CAST(NEW.payload AS TEXT) LIKE '%boom%'
             BEGIN SELECT RAISE(ABORT, 'rejected by the test trigger'); END"
        }
    })
    .await;
    let by_account = Unique::fields(&["account"]);
    // On its own (autocommit): the enqueue runs in a transaction of its own.
    let e = plain(1, "boom")
        .with_unique(by_account)
        .enqueue(&db.pool)
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains("rejected by the test trigger"),
        "{e}"
    );
    new(&plain(1, "ok")
        .with_unique(by_account)
        .enqueue(&db.pool)
        .await
        .unwrap());
    // A plain connection (no sqlx transaction) is the same.
    let mut conn = db.pool.acquire().await.unwrap();
    plain(2, "boom")
        .with_unique(by_account)
        .enqueue_tx(&mut conn)
        .await
        .unwrap_err();
    new(&plain(2, "ok")
        .with_unique(by_account)
        .enqueue_tx(&mut conn)
        .await
        .unwrap());
    // In the caller's transaction, which commits anyway: what was written is undone.
    let mut tx = db.begin().await;
    plain(3, "boom")
        .with_unique(by_account)
        .enqueue_tx(&mut tx)
        .await
        .unwrap_err();
    tx.commit().await.unwrap();
    new(&plain(3, "ok")
        .with_unique(by_account)
        .enqueue(&db.pool)
        .await
        .unwrap());
    let identities = db.scalar("SELECT COUNT(*) FROM taskq_unique").await;
    let reservations = db
        .scalar("SELECT COUNT(*) FROM taskq_unique WHERE task_id = 0")
        .await;
    assert_eq!((identities, reservations), (3, 0));
    assert_eq!(db.count("1=1").await, 3);
}

/// A unique task that expires before any worker starts it frees its identity in the claim that
/// expires it, whatever its hold: the next enqueue is a new task, not a duplicate of a task
/// that will never run.
async fn an_expired_task_frees_its_identity<B: TestBackend>(db: Db<B>) {
    let gate = Gate::new(true);
    let short = |reason: &str| {
        Rebuild {
            account: 9,
            reason: reason.into(),
        }
        .with_ttl(Duration::from_millis(50))
    };
    let first = new(&short("late").enqueue(&db.pool).await.unwrap());
    dup_of(&short("again").enqueue(&db.pool).await.unwrap(), first);
    let window = new(&Digest { account: 9 }
        .with_ttl(Duration::from_millis(50))
        .enqueue(&db.pool)
        .await
        .unwrap());
    tokio::time::sleep(Duration::from_millis(100)).await;
    let w = RunningWorker::spawn(worker(&db, &gate));
    let expired = wait_state(&db, first, TaskState::Expired).await;
    assert!(!expired.unique_held, "{expired:?}");
    let expired_window = wait_state(&db, window, TaskState::Expired).await;
    assert!(!expired_window.unique_held, "{expired_window:?}");
    // Never run, and the identities are free again.
    assert_eq!(gate.runs("rebuild 9 late"), 0);
    let second = new(&Rebuild {
        account: 9,
        reason: "fresh".into(),
    }
    .enqueue(&db.pool)
    .await
    .unwrap());
    assert_ne!(second, first);
    wait_state(&db, second, TaskState::Succeeded).await;
    assert_eq!(gate.runs("rebuild 9 fresh"), 1);
    let next_digest = new(&Digest { account: 9 }.enqueue(&db.pool).await.unwrap());
    assert_ne!(next_digest, window);
    w.stop().await;
}

/// Eight producers (two on SQLite) each commit 200 transactions of a business row plus `enqueue_tx` of one
/// identity (held while running, or while pending), while a live worker keeps freeing it: no call fails (InnoDB
/// used to pick deadlock victims among producers waiting on a freed identity, rolling back
/// their business rows), every business row is committed, and every caller got an id that
/// names a task of that identity.
async fn unique_enqueues_under_load_with_a_live_worker_never_fail<B: TestBackend>(db: Db<B>) {
    // SQLite has one writer at a time and the tests' pools wait 1 s for it at most: 8 producers
    // next to the worker on a loaded 2-core machine can exceed that on the business row's
    // INSERT (not the enqueue), so SQLite runs 2. The deadlock this guards against is InnoDB's.
    let producers: usize = if db.label() == "sqlite" { 2 } else { 8 };
    const TXS: usize = 200;
    db.exec("CREATE TABLE biz_rows (producer INTEGER NOT NULL, n INTEGER NOT NULL)")
        .await;
    let gate = Gate::new(true);
    let w = RunningWorker::spawn(worker(&db, &gate).concurrency(4));
    let pool = db.another_pool(producers as u32).await;
    let mut handles = Vec::new();
    for p in 0..producers {
        let pool = pool.clone();
        handles.push(tokio::spawn(async move {
            let mut errors = Vec::new();
            let mut ids = Vec::new();
            for n in 0..TXS {
                let mut tx = pool.begin().await.unwrap();
                B::exec_in(
                    &mut tx,
                    &format!("INSERT INTO biz_rows (producer, n) VALUES ({p}, {n})"),
                )
                .await;
                // Half the producers race for an identity held while running (freed by
                // the write-back), half for one held while pending (freed by the claim).
                let out = if p % 2 == 0 {
                    Rebuild {
                        account: 7,
                        reason: "load".into(),
                    }
                    .enqueue_tx(&mut tx)
                    .await
                } else {
                    SyncAccount { account: 7 }.enqueue_tx(&mut tx).await
                };
                match out {
                    Ok(e) => {
                        ids.push(e.id);
                        if let Err(e) = tx.commit().await {
                            errors.push(format!("commit: {e}"));
                        }
                    }
                    Err(e) => errors.push(e.to_string()),
                }
            }
            (errors, ids)
        }));
    }
    let mut errors = Vec::new();
    let mut ids = Vec::new();
    for h in handles {
        let (e, i) = h.await.unwrap();
        errors.extend(e);
        ids.extend(i);
    }
    assert!(
        errors.is_empty(),
        "{} of {} calls failed: {errors:?}",
        errors.len(),
        producers * TXS
    );
    assert_eq!(
        db.scalar("SELECT COUNT(*) FROM biz_rows").await,
        (producers * TXS) as i64
    );
    ids.sort();
    ids.dedup();
    let tasks = db.count("name IN ('rebuild', 'sync_account')").await;
    assert!(tasks >= 1 && tasks <= (producers * TXS) as i64);
    // Every id a caller got is a task of that name (ids of tasks already pruned cannot be:
    // retention is disabled, so succeeded tasks stay).
    assert_eq!(
        ids.len() as i64,
        tasks,
        "callers saw {} ids, {tasks} tasks exist",
        ids.len()
    );
    w.stop().await;
}

/// A unique enqueue dropped midway in the caller's transaction (a timeout around it, while the
/// task row's insert runs: after the identity was reserved, before the reservation records the
/// task) leaves nothing when the caller commits anyway: no task, no identity held by no task.
/// MySQL only (SQLite runs the enqueue in a savepoint). Before, the reservation stayed with
/// `task_id = 0` next to the task, and the identity was held by a row nothing releases.
#[tokio::test]
async fn a_unique_enqueue_dropped_midway_leaves_nothing_in_the_transaction() {
    let Some(db) = TestDb::new_or_skip().await else {
        return;
    };
    let pool = &db.pool;
    sqlx::raw_sql(
        "CREATE TRIGGER taskq_test_slow_insert AFTER INSERT ON taskq_tasks FOR EACH ROW
         BEGIN
           IF NEW.payload LIKE '%slow%' THEN
             SET @taskq_test_slept = SLEEP(1);
           END IF;
         END",
    )
    .execute(pool)
    .await
    .unwrap();
    let by_account = Unique::fields(&["account"]);
    let mut tx = pool.begin().await.unwrap();
    let dropped = tokio::time::timeout(
        Duration::from_millis(200),
        plain(1, "slow").with_unique(by_account).enqueue_tx(&mut tx),
    )
    .await;
    assert!(dropped.is_err(), "the enqueue timed out: {dropped:?}");
    tx.commit().await.unwrap();
    let count = |sql: &'static str| async move {
        sqlx::query_scalar::<_, i64>(sql)
            .fetch_one(pool)
            .await
            .unwrap()
    };
    assert_eq!(
        (
            count("SELECT COUNT(*) FROM taskq_tasks").await,
            count("SELECT COUNT(*) FROM taskq_unique").await
        ),
        (0, 0),
        "nothing of the dropped enqueue was committed"
    );
    // The identity is free: the next enqueue is a new task, which holds it.
    let next = plain(1, "ok")
        .with_unique(by_account)
        .enqueue(pool)
        .await
        .unwrap();
    assert!(!next.duplicate, "{next:?}");
    let holder: u64 = sqlx::query_scalar("SELECT task_id FROM taskq_unique")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(holder, next.id.0);
}

taskq_tests::conformance!(
    a_duplicate_while_pending_returns_the_pending_task_inside_the_callers_transaction,
    a_finished_task_frees_its_identity,
    while_pending_a_started_task_no_longer_holds_its_identity,
    while_running_a_started_task_holds_its_identity_by_a_subset_of_fields,
    a_retry_keeps_a_while_running_identity_and_a_while_pending_one_is_not_taken_back,
    a_window_holds_the_identity_through_success_until_it_ends,
    enqueue_many_makes_one_task_per_identity_and_reports_each_input,
    idempotency_keys_keep_their_meaning_next_to_unique_identities,
    cancel_frees_the_identity_and_retry_dead_takes_it_back_or_names_the_holder,
    per_enqueue_declarations_and_bad_ones,
    the_identities_of_ended_windows_are_pruned,
    a_failed_unique_enqueue_leaves_no_identity_behind,
    an_expired_task_frees_its_identity,
    unique_enqueues_under_load_with_a_live_worker_never_fail,
);
