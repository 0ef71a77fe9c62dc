//! The claim against a real database: rows another transaction holds are skipped, not waited
//! for, however many of them sort first; held candidates do not make the claim loop spin; a
//! backlog drained by seeking past the last claim still picks up a task that sorts before the
//! seek position.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::MySql;
use taskq::{Client, Task, TaskContext, TaskError, TaskState};
use taskq_tests::backends::{Db, TestBackend};
use taskq_tests::{RunningWorker, TestDb, wait_until};

/// Start order of handlers, shared with them as worker state.
#[derive(Clone, Default)]
struct Started(Arc<Mutex<Vec<u32>>>);

impl Started {
    fn list(&self) -> Vec<u32> {
        self.0.lock().unwrap().clone()
    }
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Step {
    n: u32,
    sleep_ms: u64,
}

impl Task for Step {
    const NAME: &'static str = "step";
    async fn run(self, cx: TaskContext) -> Result<(), TaskError> {
        cx.data::<Started>()
            .expect("Started data registered")
            .0
            .lock()
            .unwrap()
            .push(self.n);
        tokio::time::sleep(Duration::from_millis(self.sleep_ms)).await;
        Ok(())
    }
}

async fn enqueue_steps<B: TestBackend>(db: &Db<B>, range: std::ops::Range<u32>, sleep_ms: u64) {
    let mut tx = db.begin().await;
    taskq::enqueue::enqueue_many(&mut tx, range.map(|n| Step { n, sleep_ms }))
        .await
        .unwrap();
    tx.commit().await.unwrap();
}

/// Opens a transaction that locks the task rows `ids` by primary key and keeps it open.
async fn hold_rows(db: &Db<MySql>, ids: &[u64]) -> sqlx::pool::PoolConnection<sqlx::MySql> {
    let mut conn = db.pool.acquire().await.unwrap();
    // READ COMMITTED and the primary key: lock exactly these rows (a REPEATABLE READ scan of
    // an index would lock every row it passes).
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

async fn ids_by_n<B: TestBackend>(db: &Db<B>) -> Vec<u64> {
    db.ints("SELECT id FROM taskq_tasks ORDER BY id")
        .await
        .into_iter()
        .map(|id| id as u64)
        .collect()
}

/// A worker at concurrency 4 (a claim reads 8 candidates) for `Step` tasks.
fn spawn_worker<B: TestBackend>(db: &Db<B>, started: &Started) -> RunningWorker {
    RunningWorker::spawn(
        db.worker()
            .register::<Step>()
            .data(started.clone())
            .queue("default", 4),
    )
}

async fn wait_succeeded<B: TestBackend>(db: &Db<B>, n: i64) {
    wait_until(
        Duration::from_secs(20),
        &format!("{n} tasks succeeded"),
        || async { db.count("state = 'succeeded'").await == n },
    )
    .await;
}

/// Enqueues `total` tasks and holds the first `held` in claim order in another transaction:
/// the worker runs all the others meanwhile, skipping the held ones without waiting for or
/// touching them, and runs those once they are released.
async fn held_rows_are_skipped(total: u32, held: usize) {
    let Some(db) = TestDb::new_or_skip().await else {
        return;
    };
    let db = Db::from_test_db(db);
    let started = Started::default();
    enqueue_steps(&db, 0..total, 0).await;
    let ids = ids_by_n(&db).await;
    let mut holder = hold_rows(&db, &ids[..held]).await;
    let w = spawn_worker(&db, &started);
    let free = i64::from(total) - held as i64;
    wait_succeeded(&db, free).await;
    assert_eq!(
        db.count("state = 'pending' AND attempt = 0 AND lease_epoch = 0")
            .await,
        held as i64,
        "the held rows are untouched"
    );
    assert!(started.list().iter().all(|n| *n as usize >= held));
    sqlx::query("COMMIT").execute(&mut *holder).await.unwrap();
    wait_succeeded(&db, i64::from(total)).await;
    let report = w.stop().await;
    assert_eq!(report.stats.claimed, u64::from(total));
    assert_eq!(report.stats.db_errors, 0);
    assert_eq!(
        db.count("attempt = 1 AND lease_epoch = 1").await,
        i64::from(total)
    );
}

// MySQL only (these three): rows locked by another InnoDB transaction. On SQLite a claim
// never meets a held row: one writer at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_held_by_another_transaction_are_skipped_not_waited_for() {
    held_rows_are_skipped(20, 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_held_beyond_the_candidate_window_do_not_stop_the_worker() {
    // 20 held rows fill the 8-candidate window several times over: only a claim that walks
    // past them (the locking scan after an all-held candidate claim) reaches the free ones.
    held_rows_are_skipped(40, 20).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_candidates_do_not_make_the_claim_loop_spin() {
    let Some(db) = TestDb::new_or_skip().await else {
        return;
    };
    let db = Db::from_test_db(db);
    let started = Started::default();
    enqueue_steps(&db, 0..40, 0).await;
    let ids = ids_by_n(&db).await;
    // Every due task is held: each claim reads a full set of candidates and locks none.
    let mut holder = hold_rows(&db, &ids).await;
    let w = spawn_worker(&db, &started);
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let claims = w.stats.snapshot().claim_queries;
    // Each round is a candidate claim (every candidate held) and one locking scan (nothing
    // free), then the shortest poll (10 ms here): about 200 claims a second, not thousands.
    assert!(
        (3..=300).contains(&claims),
        "{claims} claims in one second while every candidate was held"
    );
    assert_eq!(db.count("state = 'pending' AND attempt = 0").await, 40);
    sqlx::query("COMMIT").execute(&mut *holder).await.unwrap();
    wait_succeeded(&db, 40).await;
    let report = w.stop().await;
    assert_eq!(report.stats.claimed, 40);
    assert!(started.list().len() == 40);
}

async fn a_task_sorting_before_the_seek_position_is_not_left_for_the_end_of_a_backlog<
    B: TestBackend,
>(
    db: Db<B>,
) {
    let started = Started::default();
    let backlog = 600u32;
    // ~5 ms per task at concurrency 4: the backlog takes the better part of a second.
    enqueue_steps(&db, 0..backlog, 5).await;
    let w = spawn_worker(&db, &started);
    wait_until(
        Duration::from_secs(20),
        "50 backlog tasks started",
        || async { started.list().len() >= 50 },
    )
    .await;
    // Priority -1 sorts it before every backlog row, i.e. before where the claim loop's seek
    // starts; only a rescan from the head of the queue finds it.
    let urgent = Step {
        n: 9_999,
        sleep_ms: 0,
    }
    .enqueue_options()
    .with_priority(-1)
    .enqueue(&db.pool)
    .await
    .unwrap()
    .id;
    let client = Client::new(db.pool.clone());
    wait_until(Duration::from_secs(30), "urgent task done", || {
        let client = client.clone();
        async move { client.get(urgent).await.unwrap().state == TaskState::Succeeded }
    })
    .await;
    let order = started.list();
    let at = order.iter().position(|n| *n == 9_999).unwrap();
    // It runs within a rescan interval (100 ms, ~80 tasks here), long before the backlog ends.
    assert!(
        at < (backlog as usize) - 150,
        "the urgent task started {at}th of {}",
        backlog + 1
    );
    wait_until(Duration::from_secs(30), "backlog done", || async {
        db.count("state = 'succeeded'").await == i64::from(backlog) + 1
    })
    .await;
    let report = w.stop().await;
    assert_eq!(report.stats.claimed, u64::from(backlog) + 1);
}

taskq_tests::conformance!(
    a_task_sorting_before_the_seek_position_is_not_left_for_the_end_of_a_backlog
);
