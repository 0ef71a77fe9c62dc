//! The orders example runs end to end on both backends: by default on a SQLite file in the
//! temp directory (no server), and on MySQL/MariaDB with `--database-url` (skipped, with a
//! `SKIPPED mysql:` line, when no server answers). The crash-recovery demo of its README runs
//! as separate processes on each backend: a worker is killed mid-export, a second one reaps
//! its task and exports the order.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use sqlx::Pool;
use taskq_tests::backends::TestBackend;
use taskq_tests::{TestDb, server_url};

const BIN: &str = env!("CARGO_BIN_EXE_example-orders");

/// The example with `args` on `url` (`None`: its default database), its environment cleared
/// of `DATABASE_URL` so the default is really the default.
fn example(url: Option<&str>, args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.env_remove("DATABASE_URL");
    if let Some(url) = url {
        cmd.args(["--database-url", url]);
    }
    cmd.args(args);
    cmd
}

/// Runs the example to completion and returns its stdout; panics with its output on failure.
fn run_ok(mut cmd: Command) -> String {
    let out = cmd.output().expect("run example-orders");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// After `demo`: five orders exported, each with its task succeeded at the first attempt.
async fn assert_demo_done<B: TestBackend>(pool: &Pool<B>, stdout: &str) {
    assert!(stdout.contains("all 5 orders exported"), "{stdout}");
    let exported = B::scalar(
        pool,
        "SELECT COUNT(*) FROM orders WHERE exported_at IS NOT NULL AND exported_by IS NOT NULL",
    )
    .await;
    assert_eq!(exported, 5, "{stdout}");
    let tasks = B::scalar(
        pool,
        "SELECT COUNT(*) FROM taskq_tasks
         WHERE name = 'order_export' AND state = 'succeeded' AND attempt = 1",
    )
    .await;
    assert_eq!(tasks, 5, "{stdout}");
}

/// A fresh directory under the temp directory, removed when dropped.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(format!("taskq-orders-{:016x}", fastrand_u64()));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn fastrand_u64() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(std::process::id())
}

/// The SQLite file a run's first line names.
fn file_of(stdout: &str) -> std::path::PathBuf {
    let first = stdout.lines().next().unwrap_or_default();
    let rest = first
        .strip_prefix("database: SQLite file ")
        .unwrap_or_else(|| panic!("the first line names the file:\n{stdout}"));
    rest.split(" (embedded").next().unwrap().into()
}

/// By default the demo runs on a SQLite file of its own in the temp directory, named on its
/// first line; `--keep` keeps it (without, see the next test).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_runs_on_a_sqlite_file_by_default() {
    let dir = TempDir::new();
    let mut cmd = example(None, &["--keep"]);
    cmd.env("TMPDIR", &dir.0);
    let stdout = run_ok(cmd);
    let file = file_of(&stdout);
    assert_eq!(file.parent(), Some(dir.0.as_path()), "{stdout}");
    assert!(
        stdout.contains("this run's own file: kept at the end"),
        "{stdout}"
    );
    let pool = taskq::sqlite::open(&file).await.unwrap();
    assert_demo_done(&pool, &stdout).await;
    pool.close().await;
}

/// The rows of the table a demo printed: (order, worker).
fn table_rows(stdout: &str) -> Vec<(i64, String)> {
    stdout
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("order  task"))
        .skip(1)
        .take_while(|l| !l.starts_with("all "))
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (w[0].parse().unwrap(), w[4].to_owned())
        })
        .collect()
}

/// Two default runs at once, in one temp directory: each has its own file (created new,
/// deleted at its end), places and exports its own five orders with its own worker, and its
/// table shows those five only.
#[test]
fn two_runs_at_once_do_not_see_each_others_orders() {
    let dir = TempDir::new();
    let start = || {
        let mut cmd = example(None, &["demo", "5"]);
        cmd.env("TMPDIR", &dir.0);
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        cmd.spawn().expect("spawn example-orders")
    };
    let (a, b) = (start(), start());
    let outs: Vec<String> = [a, b]
        .into_iter()
        .map(|c| {
            let out = c.wait_with_output().unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
            assert!(
                out.status.success(),
                "{stdout}\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            stdout
        })
        .collect();
    let files: Vec<_> = outs.iter().map(|o| file_of(o)).collect();
    assert_ne!(files[0], files[1], "each run names its own file");
    for (stdout, file) in outs.iter().zip(&files) {
        assert!(stdout.contains("all 5 orders exported"), "{stdout}");
        // The handler prints `[worker] exporting order N`: this run's worker.
        let worker = stdout
            .lines()
            .find_map(|l| l.strip_prefix('[')?.split_once("] exporting order "))
            .map(|(w, _)| w.to_owned())
            .unwrap_or_else(|| panic!("no export line:\n{stdout}"));
        let rows = table_rows(stdout);
        assert_eq!(
            rows,
            (1..=5)
                .rev()
                .map(|id| (id, worker.clone()))
                .collect::<Vec<_>>(),
            "the table shows this run's five orders, exported by its worker:\n{stdout}"
        );
        assert!(!file.exists(), "{} is deleted at the end", file.display());
    }
    let left: Vec<_> = std::fs::read_dir(&dir.0)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(
        left.is_empty(),
        "nothing is left in the temp directory: {left:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_runs_on_mysql_with_database_url() {
    let Some(db) = TestDb::empty_or_skip().await else {
        return;
    };
    let url = format!("{}/{}", server_url().trim_end_matches('/'), db.name);
    let stdout = run_ok(example(Some(&url), &[]));
    assert!(stdout.starts_with("database: mysql://"), "{stdout}");
    assert_demo_done(&db.pool, &stdout).await;
}

#[test]
fn an_unopenable_sqlite_file_is_a_readable_error() {
    let out = example(Some("sqlite:///nonexistent-dir/sub/orders.db"), &[])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("cannot open the SQLite database /nonexistent-dir/sub/orders.db")
            && stderr.contains("does its directory exist"),
        "{stderr}"
    );
}

/// A spawned example process whose stdout lines arrive on a channel; killed when dropped.
struct Proc {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Proc {
    fn spawn(mut cmd: Command) -> Self {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn example-orders");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// The first line (from now on) containing `needle`; panics after 30 s.
    fn wait_for(&mut self, needle: &str) -> String {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(_) => panic!(
                    "no line containing {needle:?}; output so far: {:?}",
                    self.seen
                ),
            }
        }
    }

    /// `worker <id> running …` → the id.
    fn worker_id(&mut self) -> String {
        let line = self.wait_for(" running (Ctrl-C");
        line.split_whitespace().nth(1).unwrap().to_owned()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The README's crash recovery, as processes: worker A (slow, 2 s lease) claims the order's
/// task and is killed (SIGKILL) mid-export; the order stays unexported and the task `running`
/// under A; worker B reaps it after the lease (epoch 2), claims it (epoch 3, attempt 2) and
/// exports the order once.
async fn crash_recovery<B: TestBackend>(url: &str, pool_for: impl AsyncFnOnce() -> Pool<B>) {
    let mut a = Proc::spawn(example(
        Some(url),
        &["worker", "--slow", "60s", "--lease", "2s"],
    ));
    let a_id = a.worker_id();
    // A has migrated and created the orders table; the test may look now.
    let pool = pool_for().await;
    let placed = run_ok(example(Some(url), &["place", "1"]));
    let order: i64 = placed
        .lines()
        .find_map(|l| l.strip_prefix("placed order "))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|id| id.parse().ok())
        .unwrap_or_else(|| panic!("no order placed: {placed}"));
    a.wait_for(&format!("exporting order {order} (attempt 1)"));
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    let task_cond = format!(
        "name = 'order_export' AND CAST(json_extract(CAST(payload AS CHAR), '$.order_id') AS SIGNED) = {order}"
    );
    let running = B::scalar(
        &pool,
        &format!(
            "SELECT COUNT(*) FROM taskq_tasks WHERE {task_cond} AND state = 'running'
             AND attempt = 1 AND lease_epoch = 1 AND worker_id = '{a_id}'"
        ),
    )
    .await;
    assert_eq!(running, 1, "A's claim is left behind as it died");
    let exported =
        format!("SELECT COUNT(*) FROM orders WHERE id = {order} AND exported_at IS NOT NULL");
    assert_eq!(
        B::scalar(&pool, &exported).await,
        0,
        "A died before exporting"
    );

    let mut b = Proc::spawn(example(Some(url), &["worker", "--lease", "2s"]));
    let b_id = b.worker_id();
    assert_ne!(a_id, b_id);
    b.wait_for(&format!("exporting order {order} (attempt 2)"));
    taskq_tests::wait_until(Duration::from_secs(20), "B exports the order", || async {
        B::scalar(&pool, &exported).await == 1
    })
    .await;
    taskq_tests::wait_until(
        Duration::from_secs(20),
        "B's success is written",
        || async {
            B::scalar(
                &pool,
                &format!(
                    "SELECT COUNT(*) FROM taskq_tasks WHERE {task_cond} AND state = 'succeeded'
                 AND attempt = 2 AND lease_epoch = 3"
                ),
            )
            .await
                == 1
        },
    )
    .await;
    let by_b = B::scalar(
        &pool,
        &format!("SELECT COUNT(*) FROM orders WHERE id = {order} AND exported_by = '{b_id}'"),
    )
    .await;
    assert_eq!(by_b, 1, "B exported the order");
    drop(b);
    pool.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_recovery_across_processes_on_sqlite() {
    let dir = TempDir::new();
    let file = dir.0.join("orders.db");
    let url = format!("sqlite://{}", file.display());
    crash_recovery(&url, async || taskq::sqlite::open(&file).await.unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_recovery_across_processes_on_mysql() {
    let Some(db) = TestDb::empty_or_skip().await else {
        return;
    };
    let url = format!("{}/{}", server_url().trim_end_matches('/'), db.name);
    let pool = db.pool.clone();
    crash_recovery(&url, async || pool).await;
}
