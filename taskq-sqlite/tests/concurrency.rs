//! Several pools, and several processes, claiming from one database file at once: every task
//! is claimed exactly once.

mod support;

use std::collections::HashSet;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use support::task;
use taskq_driver::driver::{Claims, Enqueue, Leases, Tasks};
use taskq_driver::rows::{ClaimRequest, NameList, NewTask, WriteBack};
use taskq_driver::state::TaskState;
use taskq_sqlite::{SqliteDriver, migrate, open};

const TASKS: usize = 2_000;
const CHILD_ENV: &str = "TASKQ_SQLITE_TEST_CHILD_DB";

/// Fills a fresh file with `TASKS` tasks.
async fn seeded(test: &str) -> std::path::PathBuf {
    let path = support::db_path(test);
    let pool = open(&path, 1).await.unwrap();
    migrate(&pool).await.unwrap();
    let mut c = pool.acquire().await.unwrap();
    let rows: Vec<NewTask<'_>> = (0..TASKS).map(|_| task("q", "a")).collect();
    <SqliteDriver as Enqueue>::task_insert_rows(&mut c, &rows)
        .await
        .unwrap();
    drop(c);
    pool.close().await;
    path
}

/// Claims (8 at a time) and writes back as succeeded until the queue is empty; returns the
/// ids claimed.
async fn drain(pool: &sqlx::SqlitePool, worker: &str) -> Vec<u64> {
    let d = SqliteDriver::new(pool.clone());
    let names = NameList::new(["a"]);
    let mut c = pool.acquire().await.unwrap();
    let mut mine = Vec::new();
    loop {
        let req = ClaimRequest {
            queue: "q",
            names: &names,
            limit: 8,
            lease_us: 60_000_000,
            worker_id: worker,
            limited: false,
        };
        let got = d
            .task_claim(&mut c, &req, &mut Default::default())
            .await
            .unwrap();
        if got.tasks.is_empty() {
            return mine;
        }
        let batch: Vec<WriteBack> = got
            .tasks
            .iter()
            .map(|t| WriteBack {
                order_ends: None,
                workflow_step_ends: false,
                batch_ends: false,
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
                name: t.name.as_str().into(),
                queue: "q".into(),
                ran: std::time::Duration::ZERO,
            })
            .collect();
        let written = d.task_write_back(&mut c, &batch).await.unwrap();
        assert_eq!(
            written.written,
            batch.len() as u64,
            "our own leases are ours to write"
        );
        mine.extend(got.tasks.iter().map(|t| t.id));
        // A moment off the write lock between rounds: without it, under load, the drainer that
        // took the lock first can win every race for it while the others back off in their
        // busy handlers, and drain every task alone (CI saw "1 claimed some").
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
}

/// Every task succeeded once, after exactly one attempt, and `claimed` has each id once.
async fn assert_each_claimed_once(path: &Path, claimed: &[u64]) {
    let unique: HashSet<u64> = claimed.iter().copied().collect();
    assert_eq!(unique.len(), claimed.len(), "a task was claimed twice");
    assert_eq!(claimed.len(), TASKS);
    let pool = open(path, 1).await.unwrap();
    let mut c = pool.acquire().await.unwrap();
    let stats = SqliteDriver::new(pool.clone())
        .task_stats(&mut c)
        .await
        .unwrap();
    assert_eq!(stats.len(), 1, "{stats:?}");
    assert_eq!(
        (stats[0].state, stats[0].count),
        (TaskState::Succeeded, TASKS as u64)
    );
    let (min, max): (i64, i64) =
        sqlx::query_as("SELECT MIN(attempt), MAX(attempt) FROM taskq_tasks")
            .fetch_one(&mut *c)
            .await
            .unwrap();
    assert_eq!((min, max), (1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_pools_claim_each_task_exactly_once() {
    let path = seeded("four_pools").await;
    let started = Instant::now();
    let mut handles = Vec::new();
    for p in 0..4 {
        // A pool per simulated process, 4 claimers per pool.
        let pool = open(&path, 4).await.unwrap();
        for k in 0..4 {
            let pool = pool.clone();
            handles.push(tokio::spawn(async move {
                drain(&pool, &format!("p{p}-{k}")).await
            }));
        }
    }
    let mut claimed = Vec::new();
    let mut busy_claimers = 0;
    for h in handles {
        let mine = h.await.unwrap();
        busy_claimers += usize::from(!mine.is_empty());
        claimed.extend(mine);
    }
    eprintln!(
        "16 claimers over 4 pools drained {TASKS} tasks in {:?} ({busy_claimers} claimed some)",
        started.elapsed()
    );
    assert!(busy_claimers > 1, "the claimers ran concurrently");
    assert_each_claimed_once(&path, &claimed).await;
}

/// In a child process (spawned by the test below): drains the database named by the
/// environment and prints the ids it claimed. Without the variable it does nothing.
#[tokio::test]
async fn child_process_drain() {
    let Ok(path) = std::env::var(CHILD_ENV) else {
        return;
    };
    let pool = open(&path, 2).await.unwrap();
    // Start together: say this one is ready (its pool open), and wait for the go file, which
    // the parent creates once every child is ready (CI failed when it was created as soon as
    // the children were spawned: under load one child drained every task before another
    // had opened its pool).
    std::fs::write(format!("{path}.ready.{}", std::process::id()), b"").unwrap();
    let go = format!("{path}.go");
    while !Path::new(&go).exists() {
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    let mine = drain(&pool, &format!("pid{}", std::process::id())).await;
    let line: Vec<String> = mine.iter().map(u64::to_string).collect();
    // On a line of its own: libtest prints the test's name on the line before.
    println!("\nCLAIMED {}", line.join(","));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_processes_claim_each_task_exactly_once() {
    let path = seeded("four_processes").await;
    let (dir, name) = (
        path.parent().unwrap().to_path_buf(),
        path.file_name().unwrap().to_string_lossy().into_owned(),
    );
    let ready_files = || {
        std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(Result::ok)
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with(&format!("{name}.ready."))
            })
            .map(|e| e.path())
            .collect::<Vec<_>>()
    };
    for old in ready_files() {
        let _ = std::fs::remove_file(old);
    }
    let exe = std::env::current_exe().unwrap();
    let started = Instant::now();
    let children: Vec<_> = (0..4)
        .map(|_| {
            Command::new(&exe)
                .args([
                    "--exact",
                    "child_process_drain",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(CHILD_ENV, &path)
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let deadline = Instant::now() + std::time::Duration::from_secs(60);
    while ready_files().len() < children.len() {
        assert!(
            Instant::now() < deadline,
            "the children did not all open their pools within 60 s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    std::fs::write(format!("{}.go", path.display()), b"").unwrap();
    let mut claimed = Vec::new();
    let mut busy = 0;
    for child in children {
        let out = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap())
            .await
            .unwrap();
        assert!(out.status.success(), "child failed: {:?}", out.status);
        let stdout = String::from_utf8(out.stdout).unwrap();
        let line = stdout
            .lines()
            .find_map(|l| l.split_once("CLAIMED ").map(|(_, ids)| ids.trim()))
            .expect("the child reports its ids");
        let ids: Vec<u64> = line
            .split(',')
            .filter(|s| !s.is_empty())
            .map(|s| s.parse().unwrap())
            .collect();
        busy += usize::from(!ids.is_empty());
        claimed.extend(ids);
    }
    eprintln!(
        "4 processes drained {TASKS} tasks in {:?} ({busy} claimed some)",
        started.elapsed()
    );
    for f in ready_files() {
        let _ = std::fs::remove_file(f);
    }
    assert!(busy > 1, "the processes ran concurrently");
    assert_each_claimed_once(&path, &claimed).await;
}
