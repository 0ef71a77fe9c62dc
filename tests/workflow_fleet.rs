//! Workflows across a fleet of worker processes, on both backends: three
//! `taskq-workflow-worker` processes run a diamond of 200 steps (`start`, 198 steps after it,
//! `end` after all of them). Every handler records its start and end as rows with
//! auto-increment ids (see `workflow_support`). One middle step is slow, and the worker running
//! it is killed with SIGKILL mid-step: the step is taken back after its lease, and the graph
//! finishes. Then: no step started before every step it runs after had ended (a run that
//! ended); each step succeeded, and only runs on the killed worker ran again.

#[path = "workflow_support/mod.rs"]
mod workflow_support;

use std::collections::HashMap;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use taskq::workflow::{Workflow, WorkflowState};
use taskq_tests::backends::{Db, TestBackend};
use taskq_tests::wait_until;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;
use workflow_support::FleetStep;

const EVENTS_MYSQL: &str = "CREATE TABLE wf_events (id BIGINT NOT NULL AUTO_INCREMENT \
     PRIMARY KEY, step VARCHAR(16) NOT NULL, kind VARCHAR(8) NOT NULL, attempt INT NOT NULL, \
     pid BIGINT NOT NULL)";
const EVENTS_SQLITE: &str = "CREATE TABLE wf_events (id INTEGER PRIMARY KEY AUTOINCREMENT, \
     step TEXT NOT NULL, kind TEXT NOT NULL, attempt INTEGER NOT NULL, pid INTEGER NOT NULL)";

const MIDDLE: usize = 198;
const SLOW: &str = "m042";

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

fn step(name: &str) -> FleetStep {
    FleetStep {
        step: name.to_owned(),
        slow_ms: if name == SLOW { 30_000 } else { 0 },
    }
}

async fn a_diamond_of_200_steps_finishes_on_three_processes_through_a_sigkill<B: TestBackend>(
    db: Db<B>,
) {
    let sqlite = db.label() == "sqlite";
    db.exec(if sqlite { EVENTS_SQLITE } else { EVENTS_MYSQL })
        .await;
    let url = db.url();
    let mut workers = Vec::new();
    for i in 0..3 {
        workers.push(start(&url, &format!("graph-{i}")).await);
    }
    let middle: Vec<String> = (0..MIDDLE).map(|i| format!("m{i:03}")).collect();
    let mut wf = Workflow::new("fleet").step("start", step("start"));
    for m in &middle {
        wf = wf.step_after(m.clone(), step(m), ["start"]);
    }
    wf = wf.step_after("end", step("end"), middle.clone());
    let pool = B::pool_with_busy_timeout(&db, Duration::from_secs(60));
    let mut tx = B::begin(&pool).await;
    let done = wf.enqueue_tx(&mut tx).await.expect("enqueue the workflow");
    tx.commit().await.unwrap();

    // The slow step starts: kill the process running it.
    let started =
        format!("SELECT COUNT(*) FROM wf_events WHERE step = '{SLOW}' AND kind = 'start'");
    wait_until(Duration::from_secs(60), "the slow step started", || async {
        db.scalar(&started).await == 1
    })
    .await;
    let pid = db
        .scalar(&format!(
            "SELECT pid FROM wf_events WHERE step = '{SLOW}' AND kind = 'start'"
        ))
        .await as u32;
    let victim = workers
        .iter()
        .position(|c| c.id() == Some(pid))
        .expect("the slow step runs in one of the workers");
    signal(pid, "KILL");
    let _ = workers[victim].wait().await;
    let client = taskq::Client::new(pool.clone());
    wait_until(Duration::from_secs(120), "the workflow ended", || {
        let client = client.clone();
        async move {
            client
                .workflow(done.id)
                .await
                .is_ok_and(|w| w.state != WorkflowState::Running)
        }
    })
    .await;
    for (i, c) in workers.iter().enumerate() {
        if i != victim {
            signal(c.id().unwrap(), "TERM");
        }
    }
    for mut c in workers {
        let _ = tokio::time::timeout(Duration::from_secs(30), c.wait()).await;
    }
    let info = client.workflow(done.id).await.unwrap();
    assert_eq!(
        info.state,
        WorkflowState::Succeeded,
        "{}: {info:?}",
        B::LABEL
    );
    assert_eq!(info.counts.succeeded, 200);

    // The events in id order: per step, its starts and the id of the end of its last run.
    let rows = db
        .rows(
            &["step", "kind", "CAST(pid AS CHAR)", "CAST(id AS CHAR)"],
            "FROM wf_events ORDER BY id",
        )
        .await;
    let mut starts: HashMap<String, Vec<(i64, i64)>> = HashMap::new();
    let mut ends: HashMap<String, Vec<i64>> = HashMap::new();
    for r in &rows {
        let id: i64 = r[3].parse().unwrap();
        let pid: i64 = r[2].parse().unwrap();
        match r[1].as_str() {
            "start" => starts.entry(r[0].clone()).or_default().push((id, pid)),
            _ => ends.entry(r[0].clone()).or_default().push(id),
        }
    }
    assert_eq!(starts.len(), 200, "{}: every step started", B::LABEL);
    let victim = i64::from(pid);
    for (st, runs) in &starts {
        // Only the killed worker's runs were cut short (or ended without their outcome
        // written back) and ran again: every run but the last was the victim's.
        let (last, earlier) = runs.split_last().unwrap();
        assert!(
            earlier.iter().all(|r| r.1 == victim),
            "{}: {st} ran again after a run outside the killed worker: {runs:?}",
            B::LABEL
        );
        assert!(
            ends[st].iter().any(|&e| e > last.0),
            "{}: the last run of {st} ended",
            B::LABEL
        );
    }
    assert!(
        starts[SLOW].len() >= 2,
        "the killed step ran again after its lease"
    );
    assert_eq!(starts[SLOW][0].1, victim, "the killed run was the victim's");
    // A step is released by the write-back of its dependencies' last (successful) runs: it
    // starts after every run of each of them ended.
    let first_start = |st: &str| starts[st].iter().map(|r| r.0).min().unwrap();
    let end = |st: &str| *ends[st].iter().max().unwrap();
    for m in &middle {
        assert!(
            first_start(m) > end("start"),
            "{}: {m} started before start ended",
            B::LABEL
        );
        assert!(
            first_start("end") > end(m),
            "{}: end started before {m} ended",
            B::LABEL
        );
    }
}

taskq_tests::conformance!(a_diamond_of_200_steps_finishes_on_three_processes_through_a_sigkill);
