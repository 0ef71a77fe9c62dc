//! Ordered tasks against a real database, through the public API: tasks sharing a key run one
//! at a time, in commit order, while other keys run alongside; a failing task holds back only
//! its own key; a dead task holds its key until an operator retries or deletes it, unless the
//! task opted in to `ordered_dead_after`; `with_order_key` orders any task; the held keys are
//! listed by `Client::held_keys`. The same on both backends (`conformance!`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use taskq::{Client, Data, Task, TaskContext, TaskError, TaskId, TaskState};
use taskq_tests::backends::{Db, TestBackend};
use taskq_tests::{RunningWorker, wait_until};

// ---------------------------------------------------------------------------------------------
// Tasks

/// What the handlers record: per run, the key, the task's place in its key's commit order,
/// and when it started and ended (a monotonic clock of this process).
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<Run>>>);

#[derive(Debug, Clone)]
struct Run {
    key: u64,
    version: u64,
    start: Instant,
    end: Instant,
    ok: bool,
}

impl Log {
    fn runs(&self) -> Vec<Run> {
        self.0.lock().unwrap().clone()
    }
}

/// How the `post_entry` handler fails, per `(account, version)`: failures left before success
/// (`u32::MAX`: a permanent error at once).
#[derive(Clone, Default)]
struct Failures(Arc<Mutex<HashMap<(u64, u64), u32>>>);

impl Failures {
    fn set(&self, account: u64, version: u64, n: u32) {
        self.0.lock().unwrap().insert((account, version), n);
    }
    fn take(&self, account: u64, version: u64) -> Option<bool> {
        let mut m = self.0.lock().unwrap();
        let left = m.get_mut(&(account, version))?;
        if *left == u32::MAX {
            return Some(true);
        }
        if *left == 0 {
            return None;
        }
        *left -= 1;
        Some(false)
    }
}

async fn record(
    log: &Log,
    failures: &Failures,
    account: u64,
    version: u64,
) -> Result<(), TaskError> {
    let start = Instant::now();
    tokio::time::sleep(Duration::from_millis(3)).await;
    let fail = failures.take(account, version);
    log.0.lock().unwrap().push(Run {
        key: account,
        version,
        start,
        end: Instant::now(),
        ok: fail.is_none(),
    });
    match fail {
        None => Ok(()),
        Some(true) => Err(TaskError::permanent(std::io::Error::other("rejected"))),
        Some(false) => Err(TaskError::retry_after(
            Duration::from_millis(50),
            std::io::Error::other("try again"),
        )),
    }
}

/// A ledger entry: ordered by account, held back while it fails (the default).
#[taskq::task(queue = "ledger", ordered_by = [account], max_attempts = 3)]
async fn post_entry(
    account: u64,
    version: u64,
    log: Data<Log>,
    failures: Data<Failures>,
) -> Result<(), TaskError> {
    record(&log, &failures, account, version).await
}

/// Another task name of the same queue and key field: ordered together with `post_entry`.
#[taskq::task(queue = "ledger", ordered_by = [account])]
async fn close_account(
    account: u64,
    version: u64,
    log: Data<Log>,
    failures: Data<Failures>,
) -> Result<(), TaskError> {
    record(&log, &failures, account, version).await
}

/// Ordered, and a death after two attempts lets its key go on.
#[taskq::task(queue = "ledger", ordered_by = [account], ordered_dead_after = 2)]
async fn notify(
    account: u64,
    version: u64,
    log: Data<Log>,
    failures: Data<Failures>,
) -> Result<(), TaskError> {
    record(&log, &failures, account, version).await
}

/// Not ordered unless an enqueue gives a key.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Plain {
    account: u64,
    version: u64,
}

impl Task for Plain {
    const NAME: &'static str = "plain";
    const QUEUE: &'static str = "ledger";
    async fn run(self, cx: TaskContext) -> Result<(), TaskError> {
        let log = cx.data::<Log>().expect("log");
        let failures = cx.data::<Failures>().expect("failures");
        record(&log, &failures, self.account, self.version).await
    }
}

fn worker<B: TestBackend>(
    db: &Db<B>,
    log: &Log,
    failures: &Failures,
) -> taskq::worker::WorkerBuilder {
    db.worker()
        .register::<PostEntry>()
        .register::<CloseAccount>()
        .register::<Notify>()
        .register::<Plain>()
        .queue("ledger", 16)
        .poll_interval(Duration::from_millis(5), Duration::from_millis(20))
        .data(log.clone())
        .data(failures.clone())
}

async fn wait_state<B: TestBackend>(db: &Db<B>, id: TaskId, state: TaskState) {
    let client = Client::new(db.pool.clone());
    wait_until(
        Duration::from_secs(30),
        &format!("task {id} {state}"),
        || {
            let client = client.clone();
            async move { client.get(id).await.is_ok_and(|t| t.state == state) }
        },
    )
    .await;
}

async fn state<B: TestBackend>(db: &Db<B>, id: TaskId) -> TaskState {
    Client::new(db.pool.clone()).get(id).await.unwrap().state
}

/// Per key, the runs in start order: no two overlap, and the successful ones come in
/// `version` order (the key's commit order).
fn check_runs(runs: &[Run]) -> HashMap<u64, Vec<u64>> {
    let mut by_key: HashMap<u64, Vec<&Run>> = HashMap::new();
    for r in runs {
        by_key.entry(r.key).or_default().push(r);
    }
    let mut order = HashMap::new();
    for (key, mut rs) in by_key {
        rs.sort_by_key(|r| r.start);
        for w in rs.windows(2) {
            assert!(
                w[0].end <= w[1].start,
                "key {key}: version {} started before version {} ended",
                w[1].version,
                w[0].version
            );
        }
        let ok: Vec<u64> = rs.iter().filter(|r| r.ok).map(|r| r.version).collect();
        let mut sorted = ok.clone();
        sorted.sort_unstable();
        assert_eq!(ok, sorted, "key {key}: ran out of commit order");
        order.insert(key, ok);
    }
    order
}

// ---------------------------------------------------------------------------------------------
// Tests

/// Eight keys, 25 tasks each, enqueued interleaved in separate transactions (two task names
/// on one key field), drained by a worker running 16 at a time: per key no overlap and commit
/// order, and every task ran once.
async fn tasks_of_one_key_run_one_at_a_time_in_commit_order<B: TestBackend>(db: Db<B>) {
    let (log, failures) = (Log::default(), Failures::default());
    for version in 0..25u64 {
        for account in 0..8u64 {
            let mut tx = db.begin().await;
            if version % 5 == 4 {
                CloseAccount { account, version }
                    .enqueue_tx(&mut tx)
                    .await
                    .unwrap();
            } else {
                PostEntry { account, version }
                    .enqueue_tx(&mut tx)
                    .await
                    .unwrap();
            }
            tx.commit().await.unwrap();
        }
    }
    assert_eq!(db.count("state = 'pending'").await, 8, "one head per key");
    assert_eq!(db.count("state = 'waiting'").await, 8 * 24);
    let w = RunningWorker::spawn(worker(&db, &log, &failures));
    wait_until(Duration::from_secs(60), "200 tasks succeeded", || async {
        db.count("state = 'succeeded'").await == 200
    })
    .await;
    w.stop().await;
    let order = check_runs(&log.runs());
    assert_eq!(order.len(), 8);
    for (key, versions) in order {
        assert_eq!(versions, (0..25).collect::<Vec<_>>(), "key {key}");
    }
}

/// The first task of key 1 fails twice before it succeeds: the rest of key 1 waits for it,
/// while key 2 drains.
async fn a_failing_task_holds_back_only_its_key<B: TestBackend>(db: Db<B>) {
    let (log, failures) = (Log::default(), Failures::default());
    failures.set(1, 0, 2);
    for version in 0..5u64 {
        for account in [1u64, 2] {
            PostEntry { account, version }
                .enqueue(&db.pool)
                .await
                .unwrap();
        }
    }
    let w = RunningWorker::spawn(worker(&db, &log, &failures));
    wait_until(Duration::from_secs(30), "10 tasks succeeded", || async {
        db.count("state = 'succeeded'").await == 10
    })
    .await;
    w.stop().await;
    let runs = log.runs();
    let order = check_runs(&runs);
    assert_eq!(order[&1], vec![0, 1, 2, 3, 4]);
    assert_eq!(order[&2], vec![0, 1, 2, 3, 4]);
    let fails: Vec<&Run> = runs.iter().filter(|r| !r.ok).collect();
    assert_eq!(fails.len(), 2);
    assert!(fails.iter().all(|r| (r.key, r.version) == (1, 0)));
}

/// A task that dies holds its key (strict, the default): the next waits, `held_keys` names the
/// key, until an operator deletes the dead task; the key then goes on in order. A task that
/// declares `ordered_dead_after` dies after that many attempts and lets its key go on.
async fn a_dead_task_holds_its_key_unless_it_opted_out<B: TestBackend>(db: Db<B>) {
    let (log, failures) = (Log::default(), Failures::default());
    let client = Client::new(db.pool.clone());
    failures.set(1, 0, u32::MAX);
    failures.set(2, 0, 5);
    let dead = PostEntry {
        account: 1,
        version: 0,
    }
    .enqueue(&db.pool)
    .await
    .unwrap()
    .id;
    let after_dead = PostEntry {
        account: 1,
        version: 1,
    }
    .enqueue(&db.pool)
    .await
    .unwrap()
    .id;
    let skipped = Notify {
        account: 2,
        version: 0,
    }
    .enqueue(&db.pool)
    .await
    .unwrap()
    .id;
    let after_skipped = Notify {
        account: 2,
        version: 1,
    }
    .enqueue(&db.pool)
    .await
    .unwrap()
    .id;
    let w = RunningWorker::spawn(worker(&db, &log, &failures));
    wait_state(&db, dead, TaskState::Dead).await;
    wait_state(&db, skipped, TaskState::Dead).await;
    wait_state(&db, after_skipped, TaskState::Succeeded).await;
    assert_eq!(state(&db, after_dead).await, TaskState::Waiting);
    let held = client.held_keys(Some("ledger"), 10).await.unwrap();
    assert_eq!(held.len(), 1, "{held:?}");
    assert_eq!(
        (held[0].head, held[0].state, held[0].waiting),
        (dead, TaskState::Dead, 1)
    );
    client.delete(dead).await.unwrap();
    wait_state(&db, after_dead, TaskState::Succeeded).await;
    assert!(client.held_keys(None, 10).await.unwrap().is_empty());
    w.stop().await;
    check_runs(&log.runs());
}

/// `with_order_key` orders tasks of a type that declares no order; canceling a waiting task
/// takes it out of the order, and canceling the head lets the next run.
async fn an_enqueue_order_key_orders_any_task<B: TestBackend>(db: Db<B>) {
    let (log, failures) = (Log::default(), Failures::default());
    let client = Client::new(db.pool.clone());
    let mut ids = Vec::new();
    for version in 0..4u64 {
        let e = Plain {
            account: 9,
            version,
        }
        .with_order_key("account-9")
        .enqueue(&db.pool)
        .await
        .unwrap();
        ids.push(e.id);
    }
    assert_eq!(state(&db, ids[0]).await, TaskState::Pending);
    assert_eq!(state(&db, ids[1]).await, TaskState::Waiting);
    client.cancel(ids[1]).await.unwrap();
    client.cancel(ids[0]).await.unwrap();
    assert_eq!(state(&db, ids[2]).await, TaskState::Pending);
    let w = RunningWorker::spawn(worker(&db, &log, &failures));
    wait_state(&db, ids[3], TaskState::Succeeded).await;
    w.stop().await;
    assert_eq!(check_runs(&log.runs())[&9], vec![2, 3]);
    // An ordered task cannot also be unique.
    let e = Plain {
        account: 9,
        version: 9,
    }
    .with_order_key("k")
    .with_unique(taskq::unique::Unique::payload())
    .enqueue(&db.pool)
    .await
    .unwrap_err();
    assert!(e.to_string().contains("cannot be unique"), "{e}");
}

/// A bulk cancel of a queue cancels every task of a key, the `waiting` ones too: nothing of the
/// key is left to run (issue 34, O1: it used to cancel the head, promote the next task and
/// leave it `pending` to run). Its dry run counts the waiting tasks with the pending ones, and
/// a filter on `pending` includes them (they are pending behind their key's head). Another
/// queue's key is left alone.
async fn a_bulk_cancel_cancels_a_keys_waiting_tasks_too<B: TestBackend>(db: Db<B>) {
    use TaskState::*;
    use taskq::client::BulkFilter;
    let client = Client::new(db.pool.clone());
    let enqueue = |account: u64, version: u64, queue: &'static str| {
        let pool = db.pool.clone();
        async move {
            PostEntry { account, version }
                .with_queue(queue)
                .enqueue(&pool)
                .await
                .unwrap()
                .id
        }
    };
    let mut ids = Vec::new();
    for version in 0..3 {
        ids.push(enqueue(1, version, "ledger").await);
    }
    let other = [enqueue(1, 0, "other").await, enqueue(1, 1, "other").await];
    let mut got = Vec::new();
    for id in &ids {
        got.push(state(&db, *id).await);
    }
    assert_eq!(got, [Pending, Waiting, Waiting]);
    let filter = BulkFilter {
        queue: Some("ledger".into()),
        ..BulkFilter::default()
    };
    let dry = client.cancel_where(&filter, true).await.unwrap();
    assert_eq!((dry.canceled, dry.requested), (3, 0), "dry run");
    let done = client.cancel_where(&filter, false).await.unwrap();
    let mut got = Vec::new();
    for id in &ids {
        got.push(state(&db, *id).await);
    }
    assert_eq!(got, [Canceled, Canceled, Canceled], "every task of the key");
    assert_eq!((done.canceled, done.requested), (3, 0));
    assert_eq!(
        (state(&db, other[0]).await, state(&db, other[1]).await),
        (Pending, Waiting),
        "another queue's key is untouched"
    );
    // `state: pending` covers the tasks waiting behind a head.
    let pending = BulkFilter {
        queue: Some("other".into()),
        state: Some(Pending),
        ..BulkFilter::default()
    };
    let done = client.cancel_where(&pending, false).await.unwrap();
    assert_eq!(done.canceled, 2);
    assert_eq!(
        (state(&db, other[0]).await, state(&db, other[1]).await),
        (Canceled, Canceled)
    );
}

/// `ordered_dead_after = 2` is a default, like any declaration of a task: an enqueue's
/// `with_max_attempts(1)` overrides it for that task (it dies after one attempt) and its death
/// still lets the key go on; without the override the task has 2 attempts.
async fn an_enqueues_max_attempts_overrides_ordered_dead_after<B: TestBackend>(db: Db<B>) {
    let (log, failures) = (Log::default(), Failures::default());
    failures.set(3, 0, 5);
    let once = Notify {
        account: 3,
        version: 0,
    }
    .with_max_attempts(1)
    .enqueue(&db.pool)
    .await
    .unwrap()
    .id;
    let next = Notify {
        account: 3,
        version: 1,
    }
    .enqueue(&db.pool)
    .await
    .unwrap()
    .id;
    let attempts = |id: TaskId| format!("SELECT max_attempts FROM taskq_tasks WHERE id = {id}");
    assert_eq!(db.scalar(&attempts(once)).await, 1);
    assert_eq!(db.scalar(&attempts(next)).await, 2, "ordered_dead_after");
    let w = RunningWorker::spawn(worker(&db, &log, &failures));
    wait_state(&db, next, TaskState::Succeeded).await;
    w.stop().await;
    assert_eq!(state(&db, once).await, TaskState::Dead);
    let runs: Vec<(u64, bool)> = log.runs().iter().map(|r| (r.version, r.ok)).collect();
    assert_eq!(
        runs,
        [(0, false), (1, true)],
        "one attempt, then the key goes on"
    );
}

taskq_tests::conformance!(
    tasks_of_one_key_run_one_at_a_time_in_commit_order,
    a_failing_task_holds_back_only_its_key,
    a_dead_task_holds_its_key_unless_it_opted_out,
    an_enqueue_order_key_orders_any_task,
    a_bulk_cancel_cancels_a_keys_waiting_tasks_too,
    an_enqueues_max_attempts_overrides_ordered_dead_after,
);

// MySQL only: what follows is about InnoDB's row locks on `taskq_order_keys` (lock waits,
// deadlocks, error 1213) and MySQL's statements inside a caller's transaction. SQLite runs one
// writer at a time: a producer's open transaction holds the whole database, no two writers
// ever wait for each other's rows, and its ordered insert is a savepoint already.
mod mysql_locks {
    use super::*;
    use sqlx::{Acquire, MySqlPool};
    use taskq_driver::driver::{Actions, Claims, Enqueue, Leases};
    use taskq_driver::rows::{
        ClaimCursor, ClaimRequest, Claimed, Inserted, NameList, NewTask, OrderKey, WriteBack,
    };
    use taskq_drivertest::fixtures::task;
    use taskq_mysql::MySqlDriver;
    use taskq_tests::TestDb;

    /// Inserts an ordered task named `a` on queue `q` with `key`, on `conn` (a connection or the
    /// caller's transaction); its id.
    pub(super) async fn insert_ordered(conn: &mut sqlx::MySqlConnection, key: &[u8]) -> u64 {
        let t: NewTask<'_> = task("q", "a");
        let order = OrderKey {
            key,
            dead_skips: false,
        };
        match MySqlDriver::task_insert_ordered(conn, &t, &order)
            .await
            .expect("task_insert_ordered")
        {
            Inserted::New(id) => id.0,
            Inserted::Duplicate(id) => panic!("unexpected duplicate of {id}"),
        }
    }

    /// Claims every due task named `a` of queue `q` (an hour's lease).
    pub(super) async fn claim_all(d: &MySqlDriver, pool: &MySqlPool) -> Vec<Claimed> {
        let names = NameList::new(["a"]);
        let req = ClaimRequest {
            queue: "q",
            names: &names,
            limit: 10,
            lease_us: 3_600_000_000,
            worker_id: "w1",
            limited: false,
        };
        let mut c = pool.acquire().await.unwrap();
        d.task_claim(&mut c, &req, &mut ClaimCursor::default())
            .await
            .expect("task_claim")
            .tasks
    }

    /// The success of `t`, as the worker writes it back (it ends its key's head).
    pub(super) fn succeeded(t: &Claimed) -> WriteBack {
        WriteBack {
            id: t.id,
            epoch: t.lease_epoch,
            state: "succeeded",
            attempt: t.attempt,
            outcome: "succeeded",
            delay_us: 0,
            error: None,
            frees: None,
            follow_up: None,
            output: None,
            order_ends: t.order_key.clone(),
            workflow_step_ends: false,
            batch_ends: false,
            name: std::sync::Arc::from(t.name.as_str()),
            queue: std::sync::Arc::from("q"),
            ran: Duration::ZERO,
        }
    }

    /// The server's id of `conn`'s session.
    pub(super) async fn session(conn: &mut sqlx::MySqlConnection) -> u64 {
        sqlx::query_scalar("SELECT CONNECTION_ID()")
            .fetch_one(conn)
            .await
            .unwrap()
    }

    async fn state_of(pool: &MySqlPool, id: u64) -> String {
        sqlx::query_scalar("SELECT CAST(state AS CHAR) FROM taskq_tasks WHERE id = ?")
            .bind(id)
            .fetch_one(pool)
            .await
            .unwrap()
    }

    /// A producer that locks its keys in ascending order (K1 then K2) never deadlocks with a
    /// transaction that ends both keys' heads: a write-back takes the key rows it can in the
    /// same order and leaves a key the producer holds for after its commit (O2); a batch
    /// cancel waits for it, taking the key rows in key order, whatever the order of its tasks'
    /// ids (issue 34, O3: they were taken by task id, so with K2's head the lower id the
    /// write-back held K2 while waiting for the producer's K1, and the producer's K2 was a
    /// deadlock, 1213, often rolling back the producer).
    #[tokio::test]
    async fn a_producer_taking_keys_in_order_and_a_write_back_of_their_heads_do_not_deadlock() {
        producer_and_ender(Ender::WriteBack).await;
    }

    /// [`a_producer_taking_keys_in_order_and_a_write_back_of_their_heads_do_not_deadlock`] with a
    /// batch cancel of the two pending heads, which waits for the producer's key.
    #[tokio::test]
    async fn a_producer_taking_keys_in_order_and_a_cancel_of_their_heads_do_not_deadlock() {
        producer_and_ender(Ender::Cancel).await;
    }

    #[derive(Clone, Copy, PartialEq)]
    enum Ender {
        WriteBack,
        Cancel,
    }

    async fn producer_and_ender(ender: Ender) {
        let Some(db) = TestDb::new_or_skip().await else {
            return;
        };
        const K1: [u8; 32] = [0x11; 32];
        const K2: [u8; 32] = [0x22; 32];
        let d = MySqlDriver::new(db.pool.clone());
        let mut c = db.pool.acquire().await.unwrap();
        let h2 = insert_ordered(&mut c, &K2).await;
        let h1 = insert_ordered(&mut c, &K1).await;
        assert!(h2 < h1, "K2's head has the lower id");
        let claimed = match ender {
            Ender::WriteBack => claim_all(&d, &db.pool).await,
            Ender::Cancel => Vec::new(),
        };
        // The producer takes K1 and keeps its transaction open.
        let mut p = db.pool.acquire().await.unwrap();
        let mut tx = p.begin().await.unwrap();
        let p1 = insert_ordered(&mut tx, &K1).await;
        // The heads end (K2's first, by id): what waits, waits for the producer's K1.
        let mut conn = db.pool.acquire().await.unwrap();
        let ender_session = session(&mut conn).await;
        let outcomes: Vec<WriteBack> = claimed.iter().map(succeeded).collect();
        let d2 = d.clone();
        let ending = tokio::spawn(async move {
            let r = match ender {
                Ender::WriteBack => d2
                    .task_write_back(&mut conn, &outcomes)
                    .await
                    .map(|w| w.written),
                Ender::Cancel => {
                    drop(conn);
                    d2.task_cancel_batch(&[h2, h1]).await
                }
            };
            r.map_err(|e| e.to_string())
        });
        wait_until(
            Duration::from_secs(20),
            "the heads' end is done or waits for K1",
            || async {
                if ending.is_finished() {
                    return true;
                }
                let n: i64 = sqlx::query_scalar(
                    "SELECT COUNT(*) FROM information_schema.PROCESSLIST
                     WHERE (ID = ? OR DB = DATABASE() AND ID <> CONNECTION_ID())
                       AND INFO LIKE 'UPDATE taskq_order_keys%'",
                )
                .bind(ender_session)
                .fetch_one(&db.pool)
                .await
                .unwrap();
                n >= 1
            },
        )
        .await;
        // The producer goes on to K2 and commits.
        let p2 = MySqlDriver::task_insert_ordered(
            &mut tx,
            &task("q", "a"),
            &OrderKey {
                key: &K2,
                dead_skips: false,
            },
        )
        .await;
        let p2 = match p2 {
            Ok(Inserted::New(id)) => id.0,
            other => panic!("the producer's enqueue on K2: {other:?}"),
        };
        tx.commit().await.expect("the producer commits");
        let ended = ending.await.unwrap();
        assert_eq!(ended, Ok(2), "both heads ended");
        let done = match ender {
            Ender::WriteBack => "succeeded",
            Ender::Cancel => "canceled",
        };
        assert_eq!(state_of(&db.pool, h1).await, done);
        assert_eq!(state_of(&db.pool, h2).await, done);
        wait_until(Duration::from_secs(20), "both keys go on", || async {
            state_of(&db.pool, p1).await == "pending" && state_of(&db.pool, p2).await == "pending"
        })
        .await;
    }

    /// An ordered enqueue that fails after its insert (a trigger makes the statement that records
    /// the key's head fail once) leaves nothing in the caller's transaction, which commits
    /// anyway: the next enqueue on the key is its only head. Likewise an enqueue dropped while
    /// that statement runs (a timeout around it). Issue 34, O4: the task stayed `pending` with no
    /// head recorded, so the next enqueue was `pending` too and the key ran two tasks at once.
    #[tokio::test]
    async fn an_ordered_enqueue_that_fails_or_is_dropped_midway_leaves_nothing_in_the_transaction()
    {
        let Some(db) = TestDb::new_or_skip().await else {
            return;
        };
        let pool = &db.pool;
        let check = |account: u64| async move {
            let rows: Vec<(u64, String)> = sqlx::query_as(
                "SELECT t.id, CAST(t.state AS CHAR) FROM taskq_tasks t
                 WHERE JSON_VALUE(t.payload, '$.account') = ? ORDER BY t.id",
            )
            .bind(account)
            .fetch_all(pool)
            .await
            .unwrap();
            let heads: Vec<Option<u64>> = sqlx::query_scalar(
                "SELECT k.head_task_id FROM taskq_order_keys k
                 WHERE k.order_key = (SELECT order_key FROM taskq_tasks
                                      WHERE JSON_VALUE(payload, '$.account') = ? LIMIT 1)",
            )
            .bind(account)
            .fetch_all(pool)
            .await
            .unwrap();
            (rows, heads)
        };
        // Fails: the head's statement signals an error once.
        sqlx::raw_sql(
            "CREATE TRIGGER taskq_test_fail_head BEFORE UPDATE ON taskq_order_keys FOR EACH ROW
             BEGIN
               IF NEW.head_task_id IS NOT NULL THEN
                 SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'injected: head not recorded';
               END IF;
             END",
        )
        .execute(pool)
        .await
        .unwrap();
        let mut tx = pool.begin().await.unwrap();
        let e = PostEntry {
            account: 1,
            version: 0,
        }
        .enqueue_tx(&mut tx)
        .await
        .unwrap_err();
        assert!(e.to_string().contains("injected"), "{e}");
        tx.commit().await.unwrap();
        sqlx::raw_sql("DROP TRIGGER taskq_test_fail_head")
            .execute(pool)
            .await
            .unwrap();
        let mut tx = pool.begin().await.unwrap();
        let second = PostEntry {
            account: 1,
            version: 1,
        }
        .enqueue_tx(&mut tx)
        .await
        .unwrap()
        .id;
        tx.commit().await.unwrap();
        let (rows, heads) = check(1).await;
        assert_eq!(
            rows,
            [(second.0, "pending".to_owned())],
            "only the second enqueue is there, the key's head"
        );
        assert_eq!(heads, [Some(second.0)]);
        // Dropped: the insert of the task takes a second, the enqueue is given 200 ms, so it
        // is dropped before it records the head.
        sqlx::raw_sql(
            "CREATE TRIGGER taskq_test_slow_insert AFTER INSERT ON taskq_tasks FOR EACH ROW
             BEGIN
               IF NEW.order_key IS NOT NULL THEN
                 SET @taskq_test_slept = SLEEP(1);
               END IF;
             END",
        )
        .execute(pool)
        .await
        .unwrap();
        let mut tx = pool.begin().await.unwrap();
        let dropped = tokio::time::timeout(
            Duration::from_millis(200),
            PostEntry {
                account: 2,
                version: 0,
            }
            .enqueue_tx(&mut tx),
        )
        .await;
        assert!(dropped.is_err(), "the enqueue timed out: {dropped:?}");
        tx.commit().await.unwrap();
        sqlx::raw_sql("DROP TRIGGER taskq_test_slow_insert")
            .execute(pool)
            .await
            .unwrap();
        let mut tx = pool.begin().await.unwrap();
        let next = PostEntry {
            account: 2,
            version: 1,
        }
        .enqueue_tx(&mut tx)
        .await
        .unwrap()
        .id;
        tx.commit().await.unwrap();
        let (rows, heads) = check(2).await;
        assert_eq!(rows, [(next.0, "pending".to_owned())]);
        assert_eq!(heads, [Some(next.0)]);
    }

    async fn head_of(pool: &MySqlPool, key: &[u8]) -> Option<u64> {
        sqlx::query_scalar("SELECT head_task_id FROM taskq_order_keys WHERE order_key = ?")
            .bind(key)
            .fetch_one(pool)
            .await
            .unwrap()
    }

    /// The write-back that ends a key's head does not wait for a producer's open transaction
    /// on the key (which would hold the batch's task rows, and every heartbeat of the batch
    /// behind them, until the producer commits): it commits the outcome at once and the key
    /// goes on once the producer has committed (issue 34, O2: it waited on the key row; here
    /// the producer stays open until the write-back returns, so it waited for the server's
    /// lock wait timeout).
    #[tokio::test]
    async fn a_write_back_ending_a_head_does_not_wait_for_a_producer_holding_its_key() {
        let Some(db) = TestDb::new_or_skip().await else {
            return;
        };
        const K: [u8; 32] = [0x33; 32];
        let d = MySqlDriver::new(db.pool.clone());
        let mut c = db.pool.acquire().await.unwrap();
        let head = insert_ordered(&mut c, &K).await;
        let next = insert_ordered(&mut c, &K).await;
        let claimed = claim_all(&d, &db.pool).await;
        assert_eq!(claimed.len(), 1);
        // A producer enqueues on the key and keeps its transaction open.
        let mut p = db.pool.acquire().await.unwrap();
        let mut tx = p.begin().await.unwrap();
        let late = insert_ordered(&mut tx, &K).await;
        let written = tokio::time::timeout(
            Duration::from_secs(10),
            d.task_write_back(&mut c, &[succeeded(&claimed[0])]),
        )
        .await
        .expect("the write-back does not wait for the producer")
        .expect("task_write_back");
        assert_eq!(written.written, 1);
        assert_eq!(state_of(&db.pool, head).await, "succeeded");
        assert_eq!(
            state_of(&db.pool, next).await,
            "waiting",
            "the producer holds the key"
        );
        tx.commit().await.unwrap();
        wait_until(Duration::from_secs(20), "the key goes on", || async {
            state_of(&db.pool, next).await == "pending"
        })
        .await;
        assert_eq!(state_of(&db.pool, late).await, "waiting");
        assert_eq!(head_of(&db.pool, &K).await, Some(next));
    }

    /// A key whose head ended without the key going on (what a process that ended between the
    /// write-back's commit and the key's deferred advance leaves) is advanced by
    /// `order_keys_advance_stranded` (the reaper runs it); a key a producer holds is left for a
    /// later pass, and a dead head that holds its key is not touched.
    #[tokio::test]
    async fn a_key_left_stranded_by_a_crash_is_advanced_by_the_reapers_pass() {
        let Some(db) = TestDb::new_or_skip().await else {
            return;
        };
        const K1: [u8; 32] = [0x44; 32];
        const K2: [u8; 32] = [0x55; 32];
        const K3: [u8; 32] = [0x66; 32];
        let d = MySqlDriver::new(db.pool.clone());
        let mut c = db.pool.acquire().await.unwrap();
        let mut ids = Vec::new();
        for k in [&K1, &K1, &K2, &K2, &K3, &K3] {
            ids.push(insert_ordered(&mut c, k).await);
        }
        // The heads end without their keys going on: K1's and K2's succeeded, K3's dead.
        sqlx::query(
            "UPDATE taskq_tasks SET state = IF(id = ?, 'dead', 'succeeded'),
               finished_at = UTC_TIMESTAMP(6) WHERE id IN (?, ?, ?)",
        )
        .bind(ids[4])
        .bind(ids[0])
        .bind(ids[2])
        .bind(ids[4])
        .execute(&db.pool)
        .await
        .unwrap();
        // A producer holds K2.
        let mut p = db.pool.acquire().await.unwrap();
        let mut tx = p.begin().await.unwrap();
        insert_ordered(&mut tx, &K2).await;
        let n = d.order_keys_advance_stranded(&mut c, 10).await.unwrap();
        assert_eq!(n, 1, "K1 only");
        assert_eq!(state_of(&db.pool, ids[1]).await, "pending");
        assert_eq!(head_of(&db.pool, &K1).await, Some(ids[1]));
        assert_eq!(state_of(&db.pool, ids[3]).await, "waiting", "K2 is held");
        assert_eq!(
            state_of(&db.pool, ids[5]).await,
            "waiting",
            "a dead head holds"
        );
        tx.commit().await.unwrap();
        let n = d.order_keys_advance_stranded(&mut c, 10).await.unwrap();
        assert_eq!(n, 1, "K2 now");
        assert_eq!(state_of(&db.pool, ids[3]).await, "pending");
        assert_eq!(d.order_keys_advance_stranded(&mut c, 10).await.unwrap(), 0);
    }

    /// An ordered task of key K, on queue `locks`, that returns at once.
    #[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
    struct Quick {
        k: u64,
    }

    impl Task for Quick {
        const NAME: &'static str = "quick";
        const QUEUE: &'static str = "locks";
        const ORDERED: Option<taskq::ordered::Ordered> = Some(taskq::ordered::Ordered::by(&["k"]));
        async fn run(self, _cx: TaskContext) -> Result<(), TaskError> {
            Ok(())
        }
    }

    /// What `Slow`'s runs saw: `ok`, or the cancel reason that stopped them.
    static SLOW_RUNS: Mutex<Vec<String>> = Mutex::new(Vec::new());

    /// A plain task that runs 8 s, unless its worker cancels it.
    #[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
    struct Slow;

    impl Task for Slow {
        const NAME: &'static str = "slow";
        const QUEUE: &'static str = "locks";
        async fn run(self, cx: TaskContext) -> Result<(), TaskError> {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(8)) => {
                    SLOW_RUNS.lock().unwrap().push("ok".into());
                    Ok(())
                }
                r = cx.cancel_signal().canceled() => {
                    SLOW_RUNS.lock().unwrap().push(format!("{r:?}"));
                    Err(TaskError::retry_after(Duration::ZERO, std::io::Error::other("canceled")))
                }
            }
        }
    }

    /// The scenario of issue 34, O2, through a worker: lease 4 s, two slots; `Quick` (ordered on
    /// K) returns at once while a producer's transaction holds K for 6 s, and `Slow` runs 8 s
    /// beside it. `Quick`'s outcome is written within a second (it used to wait for the
    /// producer, holding its row, which `Slow`'s heartbeats then waited behind), `Slow` never
    /// sees `LeaseLost`, and the producer's task runs once it has committed.
    #[tokio::test]
    async fn an_open_producer_on_a_key_delays_neither_its_heads_outcome_nor_the_batchs_leases() {
        let Some(db) = TestDb::new_or_skip().await else {
            return;
        };
        let pool = db.pool.clone();
        let a = Quick { k: 1 }.enqueue(&pool).await.unwrap().id;
        let b = Slow.enqueue(&pool).await.unwrap().id;
        let mut tx = pool.begin().await.unwrap();
        let late = Quick { k: 1 }.enqueue_tx(&mut tx).await.unwrap().id;
        let producer = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(6)).await;
            tx.commit().await.unwrap();
        });
        let w = RunningWorker::spawn(
            taskq_tests::fast_worker(&pool)
                .register::<Quick>()
                .register::<Slow>()
                .queue("locks", 2)
                .lease(Duration::from_secs(4)),
        );
        let start = Instant::now();
        let written = |id: TaskId| {
            let pool = pool.clone();
            async move {
                sqlx::query_scalar::<_, String>(
                    "SELECT CAST(state AS CHAR) FROM taskq_tasks WHERE id = ?",
                )
                .bind(id.0)
                .fetch_one(&pool)
                .await
                .unwrap()
                    == "succeeded"
            }
        };
        wait_until(Duration::from_secs(20), "the head's outcome", || written(a)).await;
        let took = start.elapsed();
        assert!(!producer.is_finished(), "the producer is still open");
        assert!(took < Duration::from_secs(2), "written after {took:?}");
        wait_until(Duration::from_secs(30), "the slow task", || written(b)).await;
        wait_until(Duration::from_secs(30), "the producer's task", || {
            written(late)
        })
        .await;
        w.stop().await;
        producer.await.unwrap();
        assert_eq!(
            *SLOW_RUNS.lock().unwrap(),
            ["ok"],
            "one run, never canceled"
        );
    }
}
