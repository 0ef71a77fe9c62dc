//! `taskq::run_registered(pool)` in a real process: the `taskq-registered-worker` binary runs
//! its `#[taskq::task]` (which takes the pool as `Data<MySqlPool>`) until SIGTERM, then shuts
//! down gracefully, prints its report and exits 0.

#[path = "registered_support/mod.rs"]
mod registered_support;

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde::Deserialize;
use sqlx::ConnectOptions;
use taskq::{Client, TaskState};
use taskq_tests::TestDb;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

use registered_support::{EFFECTS_TABLE, RegisteredEffect};

/// Tasks enqueued.
const N: u32 = 20;

fn registered_worker_exe() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_taskq-registered-worker"))
}

/// What the binary prints at exit (`report <json>`).
#[derive(Debug, Deserialize)]
struct Report {
    released: Vec<u64>,
    unacknowledged: Vec<u64>,
    stats: std::collections::HashMap<String, u64>,
}

/// Sends `SIG<sig>` to `pid`.
fn send_signal(pid: u32, sig: &str) {
    let status = std::process::Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{sig} {pid} failed");
}

/// The child runs every enqueued task through the injected pool, keeps running once idle,
/// and on SIGTERM exits 0 with a report of the final counters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_registered_process_runs_tasks_with_injected_pool_until_sigterm() {
    let Some(db) = TestDb::new_or_skip().await else {
        return;
    };
    sqlx::raw_sql(EFFECTS_TABLE)
        .execute(&db.pool)
        .await
        .expect("effects table");
    let mut ids = Vec::new();
    for n in 0..N {
        ids.push(RegisteredEffect { n }.enqueue(&db.pool).await.unwrap().id);
    }
    assert_eq!(db.count("state = 'pending'").await, i64::from(N));

    let url = db.options.to_url_lossy().to_string();
    let mut child = Command::new(registered_worker_exe())
        .arg(&url)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {}: {e}", registered_worker_exe().display()));
    let pid = child.id().expect("child pid");
    let mut stdout = BufReader::new(child.stdout.take().expect("piped stdout")).lines();

    let effects = || async {
        sqlx::query_scalar::<_, u32>("SELECT n FROM registered_effects ORDER BY n")
            .fetch_all(&db.pool)
            .await
            .expect("read effects")
    };
    // Polls like `wait_until`, but fails at once if the worker exits (e.g. on a start-up error).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = child.try_wait().expect("child status") {
            panic!("the worker exited with {status} before finishing the tasks");
        }
        if effects().await.len() == N as usize
            && db.count("state = 'succeeded'").await == i64::from(N)
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after 60 s waiting for every task to succeed and write its effect"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        effects().await,
        (0..N).collect::<Vec<_>>(),
        "one effect per task"
    );
    let client = Client::new(db.pool.clone());
    for id in &ids {
        let task = client.get(*id).await.unwrap();
        assert_eq!(
            (task.state, task.attempt),
            (TaskState::Succeeded, 1),
            "{task:?}"
        );
    }

    // Idle for longer than the default poll ceiling (1 s): the worker does not exit on its own.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        child.try_wait().expect("child status").is_none(),
        "the worker exited before SIGTERM"
    );

    send_signal(pid, "TERM");
    let exit = async {
        let mut report = None;
        while let Some(line) = stdout.next_line().await.expect("read child stdout") {
            if let Some(json) = line.strip_prefix("report ") {
                report = Some(serde_json::from_str::<Report>(json).expect("report JSON"));
            }
        }
        (child.wait().await.expect("wait for the child"), report)
    };
    let (status, report) = tokio::time::timeout(Duration::from_secs(30), exit)
        .await
        .expect("the worker exited within 30 s of SIGTERM");
    assert_eq!(status.code(), Some(0), "exit status {status}");
    let report = report.expect("the worker printed its report");
    assert!(report.released.is_empty(), "{report:?}");
    assert!(report.unacknowledged.is_empty(), "{report:?}");
    let s = &report.stats;
    assert_eq!(
        (
            s["claimed"],
            s["succeeded"],
            s["retried"],
            s["dead"],
            s["released"]
        ),
        (u64::from(N), u64::from(N), 0, 0, 0),
        "{report:?}"
    );
    assert_eq!(effects().await.len(), N as usize, "no run after the report");
}
