//! Cancelling running tasks: `Client::cancel` records a request, the worker learns of it at
//! its next heartbeat, signals the handler with `CancelReason::Canceled`, aborts it after the
//! cancel grace and writes `canceled` (fenced by the epoch); the reaper turns an expired lease
//! of a cancel-requested task into `canceled`, never `pending`.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use taskq::{
    Client, Task, TaskContext, TaskError, TaskId, TaskState, client::Canceled,
    context::CancelReason, unique::Unique,
};
use taskq_tests::backends::{Db, TestBackend};
use taskq_tests::{RunningWorker, wait_until};

/// What the handlers saw.
#[derive(Clone, Default)]
struct Seen {
    reason: Arc<Mutex<Option<CancelReason>>>,
    started: Arc<std::sync::atomic::AtomicBool>,
    dropped: Arc<std::sync::atomic::AtomicBool>,
}

/// How the handler reacts to its cancel signal.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize)]
enum React {
    /// Returns an error once signaled.
    Fail,
    /// Returns Ok once signaled (a success within the grace).
    Succeed,
    /// Ignores the signal: runs until aborted.
    Ignore,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Long(React);

/// Sets `dropped` when the handler's future is dropped (aborted or returned).
struct OnDrop(Arc<std::sync::atomic::AtomicBool>);
impl Drop for OnDrop {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Task for Long {
    const NAME: &'static str = "long";
    const MAX_ATTEMPTS: u32 = 5;
    async fn run(self, cx: TaskContext) -> Result<(), TaskError> {
        let seen = cx.data::<Seen>().unwrap();
        let _guard = OnDrop(seen.dropped.clone());
        seen.started
            .store(true, std::sync::atomic::Ordering::SeqCst);
        if let React::Ignore = self.0 {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            return Ok(());
        }
        let reason = cx.cancel_signal().canceled().await;
        *seen.reason.lock().unwrap() = Some(reason);
        match self.0 {
            React::Fail => Err(TaskError::msg("stopped: canceled")),
            _ => Ok(()),
        }
    }
}

fn worker<B: TestBackend>(db: &Db<B>, seen: &Seen, grace: Duration) -> RunningWorker {
    RunningWorker::spawn(
        db.worker()
            .register::<Long>()
            .data(seen.clone())
            .lease(Duration::from_secs(3))
            .heartbeat(Duration::from_millis(200))
            .cancel_grace(grace),
    )
}

async fn started(client: &Client, seen: &Seen, id: TaskId) {
    wait_until(Duration::from_secs(10), "the handler runs", || async {
        seen.started.load(std::sync::atomic::Ordering::SeqCst)
            && client.get(id).await.unwrap().state == TaskState::Running
    })
    .await;
}

async fn cancel_requested<B: TestBackend>(db: &Db<B>, id: TaskId) -> bool {
    db.count(&format!(
        "id = {} AND cancel_requested_at IS NOT NULL",
        id.0
    ))
    .await
        == 1
}

async fn a_cooperative_handler_that_fails_is_recorded_canceled<B: TestBackend>(db: Db<B>) {
    let client = Client::new(db.pool.clone());
    let seen = Seen::default();
    let id = Long(React::Fail).enqueue(&db.pool).await.unwrap().id;
    let w = worker(&db, &seen, Duration::from_millis(1500));
    started(&client, &seen, id).await;

    let asked = Instant::now();
    assert_eq!(client.cancel(id).await.unwrap(), Canceled::Requested);
    assert!(cancel_requested(&db, id).await);
    // A second request changes nothing.
    assert_eq!(client.cancel(id).await.unwrap(), Canceled::Requested);
    wait_until(Duration::from_secs(10), "the task is canceled", || async {
        client.get(id).await.unwrap().state == TaskState::Canceled
    })
    .await;
    // Learned at the next heartbeat (200 ms), well before the lease (3 s) could run out.
    assert!(
        asked.elapsed() < Duration::from_millis(2500),
        "{:?}",
        asked.elapsed()
    );
    assert_eq!(*seen.reason.lock().unwrap(), Some(CancelReason::Canceled));
    let t = client.get(id).await.unwrap();
    assert_eq!(t.attempt, 1);
    assert_eq!(t.lease_epoch, 1, "written by the attempt's own epoch");
    assert!(t.finished_at.is_some());
    assert!(t.lease_until.is_none());
    // The counter moves just after the write-back the test saw.
    wait_until(Duration::from_secs(5), "the cancel is counted", || async {
        w.stats.snapshot().canceled == 1
    })
    .await;
    let stats = w.stats.snapshot();
    assert_eq!((stats.canceled, stats.lost_leases, stats.fenced), (1, 0, 0));
    w.stop().await;
    assert_eq!(client.get(id).await.unwrap().state, TaskState::Canceled);
    assert_eq!(db.count("state = 'pending'").await, 0);
}

async fn a_success_within_the_grace_is_recorded_succeeded<B: TestBackend>(db: Db<B>) {
    let client = Client::new(db.pool.clone());
    let seen = Seen::default();
    let id = Long(React::Succeed).enqueue(&db.pool).await.unwrap().id;
    let w = worker(&db, &seen, Duration::from_millis(1500));
    started(&client, &seen, id).await;
    assert_eq!(client.cancel(id).await.unwrap(), Canceled::Requested);
    wait_until(Duration::from_secs(10), "the task finished", || async {
        client.get(id).await.unwrap().state.is_terminal()
    })
    .await;
    assert_eq!(*seen.reason.lock().unwrap(), Some(CancelReason::Canceled));
    assert_eq!(client.get(id).await.unwrap().state, TaskState::Succeeded);
    assert!(
        !cancel_requested(&db, id).await,
        "a terminal outcome clears the request"
    );
    w.stop().await;
}

async fn a_handler_that_ignores_the_signal_is_aborted_after_the_grace<B: TestBackend>(db: Db<B>) {
    let client = Client::new(db.pool.clone());
    let seen = Seen::default();
    let id = Long(React::Ignore).enqueue(&db.pool).await.unwrap().id;
    let grace = Duration::from_millis(400);
    let w = worker(&db, &seen, grace);
    started(&client, &seen, id).await;
    let asked = Instant::now();
    assert_eq!(client.cancel(id).await.unwrap(), Canceled::Requested);
    wait_until(Duration::from_secs(10), "the task is canceled", || async {
        client.get(id).await.unwrap().state == TaskState::Canceled
    })
    .await;
    let took = asked.elapsed();
    assert!(
        seen.dropped.load(std::sync::atomic::Ordering::SeqCst),
        "handler aborted"
    );
    assert!(took >= grace, "not before the grace: {took:?}");
    assert!(took < Duration::from_millis(2500), "{took:?}");
    let t = client.get(id).await.unwrap();
    assert_eq!((t.attempt, t.lease_epoch), (1, 1));
    w.stop().await;
    assert_eq!(client.get(id).await.unwrap().state, TaskState::Canceled);
}

async fn the_reaper_cancels_an_expired_cancel_requested_task<B: TestBackend>(db: Db<B>) {
    let client = Client::new(db.pool.clone());
    let id = Long(React::Ignore).enqueue(&db.pool).await.unwrap().id;
    // A worker claimed it and died (attempts left, so without the request it would go back
    // to pending).
    db.exec(&format!("UPDATE taskq_tasks SET state = 'running', attempt = 1, lease_epoch = 1, worker_id = 'gone',
           lease_until = {} WHERE id = {}", db.from_now(Duration::from_secs(3600)), id.0)).await;
    assert_eq!(client.cancel(id).await.unwrap(), Canceled::Requested);
    db.exec(&format!(
        "UPDATE taskq_tasks SET lease_until = {} WHERE id = {}",
        db.ago(Duration::from_secs(1)),
        id.0
    ))
    .await;
    let seen = Seen::default();
    let w = worker(&db, &seen, Duration::from_secs(1));
    wait_until(
        Duration::from_secs(10),
        "the reaper canceled it",
        || async { client.get(id).await.unwrap().state == TaskState::Canceled },
    )
    .await;
    let t = client.get(id).await.unwrap();
    assert_eq!(
        t.lease_epoch, 2,
        "the reap fences the dead worker's attempt"
    );
    assert!(t.finished_at.is_some());
    // Never resurrected: the worker's claim loop does not run it again.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!seen.started.load(std::sync::atomic::Ordering::SeqCst));
    assert_eq!(client.get(id).await.unwrap().state, TaskState::Canceled);
    // The dead worker's late write-back is fenced.
    let late = db.exec(&format!("UPDATE taskq_tasks SET state = 'succeeded' WHERE id = {} AND lease_epoch = 1 AND state = 'running'", id.0)).await;
    assert_eq!(late, 0);
    w.stop().await;
}

/// A cancel request made while an attempt ran, whose outcome (a retry) was written before its
/// worker saw the request: the request stays on the pending row, and the claim that next finds
/// the task ends it `canceled` without running it again (and frees its identity).
async fn a_cancel_request_left_by_an_earlier_attempt_ends_the_task_at_its_next_claim<
    B: TestBackend,
>(
    db: Db<B>,
) {
    let client = Client::new(db.pool.clone());
    let id = Long(React::Fail).enqueue(&db.pool).await.unwrap().id;
    let unique = Solo { account: 11 }.enqueue(&db.pool).await.unwrap().id;
    let ids = format!("{}, {}", id.0, unique.0);
    // Requested on running attempts whose outcome (a retry) then won the race.
    db.exec(&format!(
        "UPDATE taskq_tasks SET state = 'running', attempt = 1, lease_epoch = 1 WHERE id IN ({ids})"
    ))
    .await;
    assert_eq!(client.cancel(id).await.unwrap(), Canceled::Requested);
    assert_eq!(client.cancel(unique).await.unwrap(), Canceled::Requested);
    db.exec(&format!(
        "UPDATE taskq_tasks SET state = 'pending', run_at = {} WHERE id IN ({ids})",
        db.now()
    ))
    .await;
    let seen = Seen::default();
    let w = RunningWorker::spawn(
        db.worker()
            .register::<Long>()
            .register::<Solo>()
            .data(seen.clone())
            .lease(Duration::from_secs(3))
            .heartbeat(Duration::from_millis(200)),
    );
    wait_until(Duration::from_secs(10), "both canceled", || async {
        client.get(id).await.unwrap().state == TaskState::Canceled
            && client.get(unique).await.unwrap().state == TaskState::Canceled
    })
    .await;
    let stats = w.stop().await.stats;
    assert!(
        !seen.started.load(std::sync::atomic::Ordering::SeqCst),
        "the handler never ran again"
    );
    for t in [id, unique] {
        let t = client.get(t).await.unwrap();
        assert_eq!((t.attempt, t.lease_epoch), (1, 1), "no new attempt");
        assert!(t.finished_at.is_some());
    }
    assert_eq!((stats.claimed, stats.canceled), (0, 2));
    assert_eq!(
        identities(&db).await,
        0,
        "the unique task's identity is freed"
    );
    assert!(
        !Solo { account: 11 }
            .enqueue(&db.pool)
            .await
            .unwrap()
            .duplicate
    );
}

/// Unique while running; waits for its cancel signal, then fails.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Solo {
    account: u64,
}

impl Task for Solo {
    const NAME: &'static str = "solo";
    const MAX_ATTEMPTS: u32 = 5;
    const UNIQUE: Option<Unique> = Some(Unique::fields(&["account"]).while_running());
    async fn run(self, cx: TaskContext) -> Result<(), TaskError> {
        cx.cancel_signal().canceled().await;
        Err(TaskError::msg("canceled"))
    }
}

async fn identities<B: TestBackend>(db: &Db<B>) -> i64 {
    db.scalar("SELECT COUNT(*) FROM taskq_unique").await
}

async fn a_canceled_running_unique_task_frees_its_identity<B: TestBackend>(db: Db<B>) {
    let client = Client::new(db.pool.clone());
    let id = Solo { account: 7 }.enqueue(&db.pool).await.unwrap().id;
    let w = RunningWorker::spawn(
        db.worker()
            .register::<Solo>()
            .lease(Duration::from_secs(3))
            .heartbeat(Duration::from_millis(200)),
    );
    wait_until(Duration::from_secs(10), "running", || async {
        client.get(id).await.unwrap().state == TaskState::Running
    })
    .await;
    assert_eq!(identities(&db).await, 1);
    assert_eq!(client.cancel(id).await.unwrap(), Canceled::Requested);
    wait_until(Duration::from_secs(10), "canceled", || async {
        client.get(id).await.unwrap().state == TaskState::Canceled
    })
    .await;
    assert_eq!(identities(&db).await, 0);
    let again = Solo { account: 7 }.enqueue(&db.pool).await.unwrap();
    assert!(!again.duplicate);
    w.stop().await;
}

async fn the_reaper_frees_the_identity_of_a_canceled_unique_task<B: TestBackend>(db: Db<B>) {
    let client = Client::new(db.pool.clone());
    let id = Solo { account: 8 }.enqueue(&db.pool).await.unwrap().id;
    // Claimed by a worker that then died: running, lease in the future, identity held.
    let w = RunningWorker::spawn(
        db.worker()
            .register::<Solo>()
            .lease(Duration::from_secs(60))
            .heartbeat(Duration::from_secs(25))
            .reaper_interval(Duration::from_secs(3600))
            .cancel_grace(Duration::from_secs(30)),
    );
    wait_until(Duration::from_secs(10), "running", || async {
        client.get(id).await.unwrap().state == TaskState::Running
    })
    .await;
    assert_eq!(client.cancel(id).await.unwrap(), Canceled::Requested);
    db.exec(&format!(
        "UPDATE taskq_tasks SET lease_until = {} WHERE id = {}",
        db.ago(Duration::from_secs(1)),
        id.0
    ))
    .await;
    let reaper = RunningWorker::spawn(db.worker().register::<Long>());
    wait_until(Duration::from_secs(10), "reaped to canceled", || async {
        client.get(id).await.unwrap().state == TaskState::Canceled
    })
    .await;
    assert_eq!(identities(&db).await, 0);
    assert_eq!(client.get(id).await.unwrap().lease_epoch, 2);
    // Counted right after the reap's commit, which the state above may have beaten.
    wait_until(Duration::from_secs(5), "the reap counted", || async {
        reaper.stats.snapshot().reaped == 1
    })
    .await;
    assert_eq!(reaper.stop().await.stats.reaped, 1);
    // The first worker never learned (its heartbeat is 50 s away); its shutdown release is
    // fenced by the epoch: the task stays canceled.
    w.stop().await;
    assert_eq!(client.get(id).await.unwrap().state, TaskState::Canceled);
}

/// A cancel request that lands between the reaper's read of an expired lease (no request yet)
/// and its write: whichever way the reap then goes, the identity is freed with the task. (Was a
/// MySQL bug: the reap moved the task to `canceled` but freed nothing, so every later enqueue
/// of the identity was a silent duplicate of a canceled task.) Interleaved by hand: the test
/// holds the task row (MySQL: a row lock; SQLite: the write lock) while the reaper reads, then
/// records the cancel request as `Client::cancel` does and lets the reap go on.
async fn a_cancel_request_racing_the_reap_still_frees_the_identity<B: TestBackend>(db: Db<B>) {
    let client = Client::new(db.pool.clone());
    let first = Solo { account: 9 }.enqueue(&db.pool).await.unwrap();
    let id = first.id;
    assert_eq!(identities(&db).await, 1);
    // Claimed by a worker that died on attempt 1 of 5: running, lease expired.
    db.exec(&format!(
        "UPDATE taskq_tasks SET state = 'running', attempt = 1, lease_epoch = 1,
           worker_id = 'crashed', lease_until = {} WHERE id = {}",
        db.ago(Duration::from_secs(1)),
        id.0
    ))
    .await;
    let mut tx = db.begin().await;
    let cond = format!("id = {} AND state = 'running'", id.0);
    // Takes the row's lock (MySQL) / the write lock (SQLite) and writes nothing yet.
    assert_eq!(
        db.exec_in(
            &mut tx,
            &format!("UPDATE taskq_tasks SET attempt = attempt WHERE {cond}")
        )
        .await,
        1
    );
    // A reaper of a worker that does not register `solo` (so it never claims it again).
    let reaper = RunningWorker::spawn(
        db.worker()
            .register::<Long>()
            .lease(Duration::from_secs(10))
            .reaper_interval(Duration::from_millis(50)),
    );
    if db.label() == "mysql" {
        // The reaper has read the row (a plain read, not blocked) and its write, the reap's
        // `UPDATE` (the only statement with `lease_lost` in its text), waits for the row lock.
        wait_until(
            Duration::from_secs(10),
            "the reap waits for the row",
            || async {
                db.scalar(
                    "SELECT COUNT(*) FROM information_schema.PROCESSLIST
                 WHERE DB = DATABASE() AND ID <> CONNECTION_ID() AND INFO LIKE '%lease_lost%'",
                )
                .await
                    > 0
            },
        )
        .await;
    } else {
        // SQLite cannot show a waiting writer: ten reaper rounds (each reads the row, then
        // waits for the write lock; the busy timeout is 5 s).
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // What `Client::cancel` writes on a running task.
    db.exec_in(
        &mut tx,
        &format!(
            "UPDATE taskq_tasks SET cancel_requested_at = {} WHERE {cond}",
            db.now()
        ),
    )
    .await;
    tx.commit().await.unwrap();
    wait_until(Duration::from_secs(10), "reaped to canceled", || async {
        client.get(id).await.unwrap().state == TaskState::Canceled
    })
    .await;
    reaper.stop().await;
    assert_eq!(
        identities(&db).await,
        0,
        "the canceled task's identity is freed"
    );
    let again = Solo { account: 9 }.enqueue(&db.pool).await.unwrap();
    assert!(
        !again.duplicate,
        "a new enqueue of the identity is a new task"
    );
    assert_ne!(again.id, id);
}

async fn states<B: TestBackend>(db: &Db<B>) -> Vec<(String, String, i64)> {
    db.rows(
        &["name", "state", "COUNT(*)"],
        "FROM taskq_tasks GROUP BY name, state ORDER BY name, CAST(state AS CHAR(16))",
    )
    .await
    .into_iter()
    .map(|r| (r[0].clone(), r[1].clone(), r[2].parse().unwrap()))
    .collect()
}

fn row(name: &str, state: &str, n: i64) -> (String, String, i64) {
    (name.into(), state.into(), n)
}

async fn cancel_where_counts_in_a_dry_run_and_cancels_in_batches<B: TestBackend>(db: Db<B>) {
    let client = Client::new(db.pool.clone());
    // 1,100 pending `long` tasks (more than two batches of 500), one of them running, one
    // enqueued two hours ago; and a pending unique `solo` task.
    let mut conn = db.pool.acquire().await.unwrap();
    let ids: Vec<TaskId> =
        taskq::enqueue::enqueue_many(&mut *conn, (0..1100).map(|_| Long(React::Fail)))
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.id)
            .collect();
    drop(conn);
    let solo = Solo { account: 1 }.enqueue(&db.pool).await.unwrap().id;
    db.exec(&format!("UPDATE taskq_tasks SET state = 'running', attempt = 1, lease_epoch = 1, lease_until = {} WHERE id = {}", db.from_now(Duration::from_secs(3600)), ids[0].0)).await;
    db.exec(&format!(
        "UPDATE taskq_tasks SET created_at = {} WHERE id = {}",
        db.ago(Duration::from_secs(7200)),
        ids[1].0
    ))
    .await;

    let by_name = |name: &str| taskq::client::BulkFilter {
        name: Some(name.into()),
        ..Default::default()
    };
    // Dry runs count and change nothing.
    let dry = client.cancel_where(&by_name("long"), true).await.unwrap();
    assert_eq!((dry.canceled, dry.requested), (1099, 1));
    let old = taskq::client::BulkFilter {
        older_than: Some(Duration::from_secs(3600)),
        ..Default::default()
    };
    assert_eq!(
        client.cancel_where(&old, true).await.unwrap(),
        taskq::client::BulkCanceled {
            canceled: 1,
            requested: 0
        }
    );
    assert_eq!(
        states(&db).await,
        vec![
            row("long", "pending", 1099),
            row("long", "running", 1),
            row("solo", "pending", 1)
        ]
    );
    // Filters that match nothing, and states that cannot be canceled.
    let other_queue = taskq::client::BulkFilter {
        queue: Some("other".into()),
        ..Default::default()
    };
    assert_eq!(
        client.cancel_where(&other_queue, false).await.unwrap(),
        taskq::client::BulkCanceled::default()
    );
    let dead = taskq::client::BulkFilter {
        state: Some(TaskState::Dead),
        ..Default::default()
    };
    assert!(matches!(
        client.cancel_where(&dead, false).await,
        Err(taskq::Error::InvalidOption(_))
    ));

    // Age first: only the old one.
    assert_eq!(client.cancel_where(&old, false).await.unwrap().canceled, 1);
    assert_eq!(client.get(ids[1]).await.unwrap().state, TaskState::Canceled);
    // Then every `long` task: pending ones canceled, the running one asked to stop.
    let done = client.cancel_where(&by_name("long"), false).await.unwrap();
    assert_eq!((done.canceled, done.requested), (1098, 1));
    assert_eq!(
        states(&db).await,
        vec![
            row("long", "canceled", 1099),
            row("long", "running", 1),
            row("solo", "pending", 1)
        ]
    );
    assert!(cancel_requested(&db, ids[0]).await);
    // A pending unique task frees its identity.
    assert_eq!(identities(&db).await, 1);
    let solo_only = taskq::client::BulkFilter {
        name: Some("solo".into()),
        state: Some(TaskState::Pending),
        ..Default::default()
    };
    assert_eq!(
        client
            .cancel_where(&solo_only, false)
            .await
            .unwrap()
            .canceled,
        1
    );
    assert_eq!(client.get(solo).await.unwrap().state, TaskState::Canceled);
    assert_eq!(identities(&db).await, 0);
}

async fn retry_where_counts_in_a_dry_run_and_retries_matching_dead_tasks<B: TestBackend>(
    db: Db<B>,
) {
    let client = Client::new(db.pool.clone());
    let mut ids = Vec::new();
    for _ in 0..4 {
        ids.push(Long(React::Fail).enqueue(&db.pool).await.unwrap().id);
    }
    let solo = Solo { account: 2 }.enqueue(&db.pool).await.unwrap().id;
    db.exec(&format!("UPDATE taskq_tasks SET state = 'dead', attempt = 5, lease_epoch = 3, finished_at = {} WHERE id <> {}", db.now(), ids[3].0)).await;
    db.exec(&format!(
        "UPDATE taskq_tasks SET created_at = {} WHERE id = {}",
        db.ago(Duration::from_secs(7200)),
        ids[0].0
    ))
    .await;
    // The dead unique task gave its identity up when it died.
    db.exec("DELETE FROM taskq_unique").await;

    let all = taskq::client::BulkFilter::default();
    assert_eq!(client.retry_where(&all, true).await.unwrap(), 4);
    let old = taskq::client::BulkFilter {
        older_than: Some(Duration::from_secs(3600)),
        ..Default::default()
    };
    assert_eq!(client.retry_where(&old, true).await.unwrap(), 1);
    assert_eq!(
        db.count("state = 'dead'").await,
        4,
        "a dry run changes nothing"
    );
    let pending = taskq::client::BulkFilter {
        state: Some(TaskState::Pending),
        ..Default::default()
    };
    assert!(matches!(
        client.retry_where(&pending, true).await,
        Err(taskq::Error::InvalidOption(_))
    ));

    assert_eq!(client.retry_where(&old, false).await.unwrap(), 1);
    let t = client.get(ids[0]).await.unwrap();
    assert_eq!(
        (t.state, t.attempt, t.lease_epoch),
        (TaskState::Pending, 0, 4)
    );
    let long = taskq::client::BulkFilter {
        name: Some("long".into()),
        ..Default::default()
    };
    assert_eq!(client.retry_where(&long, false).await.unwrap(), 2);
    assert_eq!(client.get(solo).await.unwrap().state, TaskState::Dead);
    // The unique one is retried one row at a time and takes its identity back.
    assert_eq!(client.retry_where(&all, false).await.unwrap(), 1);
    assert_eq!(client.get(solo).await.unwrap().state, TaskState::Pending);
    assert_eq!(identities(&db).await, 1);
    assert_eq!(db.count("state = 'pending'").await, 5);
}

async fn a_grace_longer_than_the_lease_lets_the_reaper_cancel_and_fences_the_late_write_back<
    B: TestBackend,
>(
    db: Db<B>,
) {
    let client = Client::new(db.pool.clone());
    let seen = Seen::default();
    let id = Long(React::Ignore).enqueue(&db.pool).await.unwrap().id;
    // The lease (2.5 s) runs out long before the grace (5 s, longer than `build` allows: as a
    // handler blocked in synchronous code would): the worker's own reaper cancels the task
    // while the handler is still within its grace. (2.5 s: about the shortest lease that
    // survives a renewal waiting the SQLite test pools' 1 s busy timeout.)
    let w = RunningWorker::spawn(
        db.worker()
            .register::<Long>()
            .data(seen.clone())
            .lease(Duration::from_millis(2500))
            .heartbeat(Duration::from_millis(200))
            .__unchecked_cancel_grace(Duration::from_secs(5)),
    );
    started(&client, &seen, id).await;
    assert_eq!(client.cancel(id).await.unwrap(), Canceled::Requested);
    wait_until(Duration::from_secs(10), "reaped to canceled", || async {
        client.get(id).await.unwrap().state == TaskState::Canceled
    })
    .await;
    assert_eq!(client.get(id).await.unwrap().lease_epoch, 2);
    assert!(
        !seen.dropped.load(std::sync::atomic::Ordering::SeqCst),
        "still in its grace"
    );
    wait_until(Duration::from_secs(10), "the late write-back", || async {
        w.stats.snapshot().fenced == 1
    })
    .await;
    assert!(
        seen.dropped.load(std::sync::atomic::Ordering::SeqCst),
        "aborted"
    );
    let stats = w.stats.snapshot();
    assert_eq!((stats.reaped, stats.lost_leases, stats.canceled), (1, 0, 0));
    let t = client.get(id).await.unwrap();
    assert_eq!(
        (t.state, t.lease_epoch, t.attempt),
        (TaskState::Canceled, 2, 1)
    );
    w.stop().await;
    assert_eq!(client.get(id).await.unwrap().state, TaskState::Canceled);
}

taskq_tests::conformance!(
    a_cooperative_handler_that_fails_is_recorded_canceled,
    a_success_within_the_grace_is_recorded_succeeded,
    a_handler_that_ignores_the_signal_is_aborted_after_the_grace,
    the_reaper_cancels_an_expired_cancel_requested_task,
    a_cancel_request_left_by_an_earlier_attempt_ends_the_task_at_its_next_claim,
    a_canceled_running_unique_task_frees_its_identity,
    the_reaper_frees_the_identity_of_a_canceled_unique_task,
    a_cancel_request_racing_the_reap_still_frees_the_identity,
    cancel_where_counts_in_a_dry_run_and_cancels_in_batches,
    retry_where_counts_in_a_dry_run_and_retries_matching_dead_tasks,
    a_grace_longer_than_the_lease_lets_the_reaper_cancel_and_fences_the_late_write_back,
);
