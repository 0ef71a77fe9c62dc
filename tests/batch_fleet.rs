//! Batches across a fleet of worker processes, on both backends: four `taskq-workflow-worker`
//! processes (8 slots each, an 8 s lease) run a batch of 1,000 members and a batch of 200 with three members
//! that die, enqueued in one transaction. Every handler records its start and end as rows
//! with auto-increment ids (see `workflow_support`), so the last members end at the same
//! moment on different processes. One process is killed with SIGKILL once 100 members have
//! ended; its members are taken back after their lease. Then: each callback ran exactly once,
//! and only after every member of its batch had ended; the failing batch's `on_success` never ran (it is canceled),
//! its `on_complete` did; the counters are the members' ends.

#[path = "workflow_support/mod.rs"]
mod workflow_support;

use std::collections::HashMap;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use taskq::TaskState;
use taskq::batch::{Batch, BatchState};
use taskq_tests::backends::{Db, TestBackend};
use taskq_tests::wait_until;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;
use workflow_support::FleetMember;

const EVENTS_MYSQL: &str = "CREATE TABLE wf_events (id BIGINT NOT NULL AUTO_INCREMENT \
     PRIMARY KEY, step VARCHAR(16) NOT NULL, kind VARCHAR(8) NOT NULL, attempt INT NOT NULL, \
     pid BIGINT NOT NULL)";
const EVENTS_SQLITE: &str = "CREATE TABLE wf_events (id INTEGER PRIMARY KEY AUTOINCREMENT, \
     step TEXT NOT NULL, kind TEXT NOT NULL, attempt INTEGER NOT NULL, pid INTEGER NOT NULL)";

fn exe() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_taskq-workflow-worker"))
}

async fn start(url: &str, id: &str) -> tokio::process::Child {
    let mut child = Command::new(exe())
        .args(["--url", url, "--id", id])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {}: {e}", exe().display()));
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let ready = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("the worker is ready within 30 s")
        .unwrap()
        .unwrap_or_default();
    assert_eq!(ready, format!("ready {id}"));
    child
}

fn signal(pid: u32, sig: &str) {
    let status = std::process::Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(status.success());
}

fn member(label: String, fail: bool) -> FleetMember {
    FleetMember { label, fail }
}

async fn a_batch_of_1000_on_four_processes_releases_each_callback_once<B: TestBackend>(db: Db<B>) {
    let sqlite = db.label() == "sqlite";
    db.exec(if sqlite { EVENTS_SQLITE } else { EVENTS_MYSQL })
        .await;
    let url = db.url();
    let mut workers = Vec::new();
    for i in 0..4 {
        workers.push(start(&url, &format!("batch-{i}")).await);
    }
    let pool = B::pool_with_busy_timeout(&db, Duration::from_secs(60));
    let mut tx = B::begin(&pool).await;
    let big = Batch::new("big")
        .add_all((0..1000).map(|i| member(format!("a{i:04}"), false)))
        .on_success(member("a:success".into(), false))
        .on_complete(member("a:complete".into(), false))
        .enqueue_tx(&mut tx)
        .await
        .expect("enqueue the big batch");
    let failing = Batch::new("failing")
        .add_all((0..200).map(|i| member(format!("b{i:04}"), [7, 99, 150].contains(&i))))
        .on_success(member("b:success".into(), false))
        .on_complete(member("b:complete".into(), false))
        .enqueue_tx(&mut tx)
        .await
        .expect("enqueue the failing batch");
    tx.commit().await.unwrap();

    wait_until(Duration::from_secs(60), "100 members ended", || async {
        db.scalar("SELECT COUNT(*) FROM wf_events WHERE kind = 'end'")
            .await
            >= 100
    })
    .await;
    let mut victim = workers.remove(0);
    signal(victim.id().unwrap(), "KILL");
    let _ = victim.wait().await;
    let client = taskq::Client::new(pool.clone());
    let a = client
        .wait_batch(big.id, Duration::from_secs(180))
        .await
        .expect("the big batch ends");
    let b = client
        .wait_batch(failing.id, Duration::from_secs(60))
        .await
        .expect("the failing batch ends");
    let ended = "SELECT COUNT(*) FROM wf_events WHERE kind = 'end' AND step IN ('a:success', \
                 'a:complete', 'b:complete')";
    wait_until(Duration::from_secs(60), "the callbacks ran", || async {
        db.scalar(ended).await == 3
    })
    .await;
    // Time for a second release of a callback to show, had there been one.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for c in &workers {
        signal(c.id().unwrap(), "TERM");
    }
    for mut c in workers {
        let _ = tokio::time::timeout(Duration::from_secs(30), c.wait()).await;
    }

    assert_eq!(
        (a.state, a.total, a.succeeded, a.failed, a.pending),
        (BatchState::Succeeded, 1000, 1000, 0, 0),
        "{}",
        B::LABEL
    );
    assert_eq!(
        (b.state, b.total, b.succeeded, b.failed),
        (BatchState::Failed, 200, 197, 3),
        "{}",
        B::LABEL
    );
    let rows = db
        .rows(
            &["step", "kind", "CAST(pid AS CHAR)", "CAST(id AS CHAR)"],
            "FROM wf_events ORDER BY id",
        )
        .await;
    let mut starts: HashMap<String, Vec<i64>> = HashMap::new();
    let mut last_end: HashMap<char, i64> = HashMap::new();
    let mut pids = std::collections::HashSet::new();
    for r in &rows {
        let id: i64 = r[3].parse().unwrap();
        let label = &r[0];
        if r[1] == "start" {
            starts.entry(label.clone()).or_default().push(id);
        } else if !label.contains(':') {
            let e = last_end.entry(label.chars().next().unwrap()).or_default();
            *e = (*e).max(id);
            pids.insert(r[2].clone());
        }
    }
    assert!(
        pids.len() >= 2,
        "{}: members ran on several processes",
        B::LABEL
    );
    for cb in ["a:success", "a:complete", "b:complete"] {
        let s = starts.get(cb).cloned().unwrap_or_default();
        assert_eq!(s.len(), 1, "{}: {cb} ran exactly once: {s:?}", B::LABEL);
        let batch = cb.chars().next().unwrap();
        assert!(
            s[0] > last_end[&batch],
            "{}: {cb} started before the last member of its batch ended",
            B::LABEL
        );
    }
    assert!(
        !starts.contains_key("b:success"),
        "{}: b:success never runs",
        B::LABEL
    );
    let never = client.get(failing.on_success.unwrap()).await.unwrap();
    assert_eq!(never.state, TaskState::Canceled, "{}", B::LABEL);
    let members_started = starts.keys().filter(|l| !l.contains(':')).count();
    assert_eq!(members_started, 1200, "{}: every member ran", B::LABEL);
}

taskq_tests::conformance!(a_batch_of_1000_on_four_processes_releases_each_callback_once);
