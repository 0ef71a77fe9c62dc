//! Workflows against a real database, with running workers: a diamond of 200 steps on two
//! workers where no step starts before every step it runs after has ended and each step runs
//! once; a failing step whose dependents are canceled while the cleanup step runs, the
//! workflow ending `failed`; all or nothing in the caller's transaction, a refused graph
//! writing nothing; a workflow canceled as a whole, audited; a failed workflow's dead step
//! retried, which then succeeds and brings back the steps its failure canceled, audited.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use taskq::workflow::{GraphError, Workflow, WorkflowState};
use taskq::{Data, Error, TaskError, TaskState};
use taskq_tests::backends::{Db, TestBackend};
use taskq_tests::{RunningWorker, wait_until};

/// When each step (by label) started and ended, as its handler saw it.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<(String, Instant, Instant)>>>);

impl Log {
    fn record(&self, label: String, start: Instant, end: Instant) {
        self.0.lock().unwrap().push((label, start, end));
    }
    fn runs(&self) -> Vec<(String, Instant, Instant)> {
        self.0.lock().unwrap().clone()
    }
    fn labels(&self) -> Vec<String> {
        self.runs().into_iter().map(|(l, _, _)| l).collect()
    }
}

/// A step: records its run, taking a few milliseconds.
#[taskq::task(queue = "wf")]
async fn wf_step(label: String, log: Data<Log>) -> Result<(), TaskError> {
    let start = Instant::now();
    tokio::time::sleep(Duration::from_millis(3)).await;
    log.record(label, start, Instant::now());
    Ok(())
}

/// A step that always fails, and dies at its first failure.
#[taskq::task(queue = "wf", max_attempts = 1)]
async fn wf_fail(label: String, log: Data<Log>) -> Result<(), TaskError> {
    let now = Instant::now();
    log.record(label, now, now);
    Err(TaskError::msg("the warehouse is down"))
}

/// Whether [`wf_flaky`] fails: closed (it fails) until opened.
#[derive(Clone, Default)]
struct Gate(Arc<AtomicBool>);

impl Gate {
    fn is_open(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
    fn open(&self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// A step that dies at its first failure while its gate is closed, and succeeds once it is
/// open; records each run.
#[taskq::task(queue = "wf", max_attempts = 1)]
async fn wf_flaky(label: String, log: Data<Log>, gate: Data<Gate>) -> Result<(), TaskError> {
    let now = Instant::now();
    log.record(label, now, now);
    if gate.is_open() {
        Ok(())
    } else {
        Err(TaskError::msg("the printer is out of paper"))
    }
}

fn step(label: &str) -> WfStep {
    WfStep {
        label: label.to_owned(),
    }
}

fn workers<B: TestBackend>(db: &Db<B>, log: &Log, n: usize) -> Vec<RunningWorker> {
    (0..n)
        .map(|_| {
            RunningWorker::spawn(
                db.worker()
                    .queue("wf", 4)
                    .register::<WfStep>()
                    .register::<WfFail>()
                    .data(log.clone()),
            )
        })
        .collect()
}

async fn workflow_state<B: TestBackend>(
    db: &Db<B>,
    id: taskq::workflow::WorkflowId,
) -> WorkflowState {
    db.client().workflow(id).await.expect("the workflow").state
}

/// 200 steps: `start`, 198 middle steps after it, `end` after all of them; on two workers.
/// Every step runs exactly once, none starts before every step it runs after ended, and the
/// workflow ends `succeeded` with 200 steps succeeded.
async fn a_diamond_of_200_steps_runs_each_step_once_after_its_dependencies<B: TestBackend>(
    db: Db<B>,
) {
    let log = Log::default();
    let mut wf = Workflow::new("diamond").step("start", step("start"));
    let middle: Vec<String> = (0..198).map(|i| format!("m{i:03}")).collect();
    for m in &middle {
        wf = wf.step_after(m.clone(), step(m), ["start"]);
    }
    wf = wf.step_after("end", step("end"), middle.clone());
    let mut tx = db.pool.begin().await.unwrap();
    let done = wf.enqueue_tx(&mut tx).await.expect("enqueue the workflow");
    tx.commit().await.unwrap();
    assert_eq!(done.steps.len(), 200);
    assert_eq!(workflow_state(&db, done.id).await, WorkflowState::Running);

    let running = workers(&db, &log, 2);
    let client = db.client();
    wait_until(
        Duration::from_secs(60),
        "the diamond's 200 steps succeeded",
        || {
            let client = client.clone();
            async move {
                client
                    .workflow(done.id)
                    .await
                    .is_ok_and(|w| w.counts.succeeded == 200)
            }
        },
    )
    .await;
    for w in running {
        w.stop().await;
    }
    let runs = log.runs();
    let mut per: HashMap<&str, usize> = HashMap::new();
    for (l, _, _) in &runs {
        *per.entry(l.as_str()).or_default() += 1;
    }
    assert_eq!(runs.len(), 200, "{}: one run per step", B::LABEL);
    assert!(per.values().all(|&n| n == 1));
    let at = |l: &str| {
        runs.iter()
            .find(|(x, _, _)| x == l)
            .map(|(_, s, e)| (*s, *e))
            .unwrap()
    };
    let (_, start_end) = at("start");
    let (end_start, _) = at("end");
    for m in &middle {
        let (s, e) = at(m);
        assert!(
            s >= start_end,
            "{}: {m} started before start ended",
            B::LABEL
        );
        assert!(end_start >= e, "{}: end started before {m} ended", B::LABEL);
    }
    let info = client.workflow(done.id).await.unwrap();
    assert_eq!(info.state, WorkflowState::Succeeded);
    assert_eq!((info.counts.succeeded, info.counts.total()), (200, 200));
}

/// `fetch` succeeds, `render` dies: `mail` (after render) is canceled without running,
/// `tidy` (cleanup after render and mail) runs once, `audit` (after fetch) runs; the workflow
/// ends `failed`, and its steps say which were canceled by a dependency.
async fn a_failed_step_cancels_its_dependents_and_the_cleanup_step_runs<B: TestBackend>(db: Db<B>) {
    let log = Log::default();
    let wf = Workflow::new("failing")
        .step("fetch", step("fetch"))
        .step_after(
            "render",
            WfFail {
                label: "render".into(),
            },
            ["fetch"],
        )
        .step_after("mail", step("mail"), ["render"])
        .cleanup_after("tidy", step("tidy"), ["render", "mail"])
        .step_after("audit", step("audit"), ["fetch"])
        .enqueue(&db.pool)
        .await
        .unwrap();
    let running = workers(&db, &log, 1);
    let client = db.client();
    let info = client
        .wait_workflow(wf.id, Duration::from_secs(30))
        .await
        .expect("the failing workflow ends");
    for w in running {
        w.stop().await;
    }
    let mut labels = log.labels();
    labels.sort();
    assert_eq!(labels, ["audit", "fetch", "render", "tidy"], "{}", B::LABEL);
    assert_eq!(info.state, WorkflowState::Failed);
    assert_eq!(
        (
            info.counts.succeeded,
            info.counts.dead,
            info.counts.canceled
        ),
        (3, 1, 1)
    );
    let steps = client.workflow_steps(wf.id).await.unwrap();
    let mail = steps.iter().find(|s| s.step == "mail").unwrap();
    assert_eq!(mail.state, TaskState::Canceled);
    assert!(mail.canceled_by_dependency);
    assert_eq!(mail.after, ["render"]);
    let tidy = steps.iter().find(|s| s.step == "tidy").unwrap();
    assert!(tidy.runs_after_failure && tidy.state == TaskState::Succeeded);
}

/// Rolled back, a workflow leaves no task; a cycle, an unknown dependency, a duplicate name or
/// no step at all is refused with its typed error before anything is written; a unique step
/// is refused.
async fn a_workflow_is_all_or_nothing_and_a_bad_graph_writes_nothing<B: TestBackend>(db: Db<B>) {
    let mut tx = db.pool.begin().await.unwrap();
    let gone = Workflow::new("gone")
        .step("a", step("a"))
        .step_after("b", step("b"), ["a"])
        .enqueue_tx(&mut tx)
        .await
        .unwrap();
    drop(tx);
    assert_eq!(db.count("1 = 1").await, 0, "{}", B::LABEL);
    assert!(matches!(
        db.client().workflow(gone.id).await,
        Err(Error::WorkflowNotFound(id)) if id == gone.id
    ));

    let cycle = Workflow::new("cycle")
        .step_after("a", step("a"), ["c"])
        .step_after("b", step("b"), ["a"])
        .step_after("c", step("c"), ["b"])
        .enqueue(&db.pool)
        .await;
    match cycle {
        Err(Error::Workflow(GraphError::Cycle { path })) => {
            assert_eq!(path.first(), path.last());
            assert_eq!(path.len(), 4, "{path:?}");
        }
        other => panic!("expected a cycle, got {other:?}"),
    }
    let unknown = Workflow::new("unknown")
        .step_after("a", step("a"), ["nope"])
        .enqueue(&db.pool)
        .await;
    assert!(matches!(
        unknown,
        Err(Error::Workflow(GraphError::UnknownDependency { ref step, ref missing }))
            if step == "a" && missing == "nope"
    ));
    let twice = Workflow::new("twice")
        .step("a", step("a"))
        .step("a", step("a"))
        .enqueue(&db.pool)
        .await;
    assert!(matches!(
        twice,
        Err(Error::Workflow(GraphError::DuplicateStep { .. }))
    ));
    assert!(matches!(
        Workflow::new("empty").enqueue(&db.pool).await,
        Err(Error::Workflow(GraphError::Empty))
    ));
    let keyed = Workflow::new("keyed")
        .step("a", step("a").with_idempotency_key("k"))
        .enqueue(&db.pool)
        .await;
    assert!(matches!(keyed, Err(Error::InvalidOption(m)) if m.contains("workflow step \"a\"")));
    let bad_name = Workflow::new("bad")
        .step("", step("a"))
        .enqueue(&db.pool)
        .await;
    assert!(matches!(
        bad_name,
        Err(Error::InvalidName {
            what: "workflow step",
            ..
        })
    ));
    assert_eq!(db.count("1 = 1").await, 0, "{}: nothing written", B::LABEL);
}

/// A workflow canceled as a whole: its pending and waiting steps end canceled, nothing of it
/// runs, its state becomes `canceled`, and the audit trail has the action with its counts.
async fn a_canceled_workflow_runs_nothing_more_and_is_audited<B: TestBackend>(db: Db<B>) {
    let wf = Workflow::new("doomed")
        .step("a", step("a"))
        .step_after("b", step("b"), ["a"])
        .enqueue(&db.pool)
        .await
        .unwrap();
    let client = db.client().with_actor("ops@example.com");
    let done = client.cancel_workflow(wf.id).await.unwrap();
    assert_eq!(
        (done.canceled, done.cancel_requested),
        (2, 0),
        "{}",
        B::LABEL
    );
    assert_eq!(
        client.workflow(wf.id).await.unwrap().state,
        WorkflowState::Canceled
    );
    let log = Log::default();
    let running = workers(&db, &log, 1);
    tokio::time::sleep(Duration::from_millis(300)).await;
    for w in running {
        w.stop().await;
    }
    assert!(log.runs().is_empty());
    let audit = client
        .audit(&taskq::client::AuditFilter::default())
        .await
        .unwrap();
    let entry = audit
        .iter()
        .find(|a| a.action == "workflow_cancel")
        .expect("audited");
    assert_eq!(entry.actor, "ops@example.com");
    let detail = &entry.detail;
    assert_eq!(detail["workflow_id"], wf.id.0);
    assert_eq!(detail["canceled"], 2);
    assert!(matches!(
        client
            .cancel_workflow(taskq::workflow::WorkflowId(wf.id.0 + 99))
            .await,
        Err(Error::WorkflowNotFound(_))
    ));
}

/// `Client::wait` returns a task once it has ended (woken by this process's write-back), and
/// gives `WaitTimedOut` for one no worker runs, after the timeout, holding no connection
/// meanwhile; an unknown task or workflow is not found.
async fn a_client_waits_for_a_task_or_a_workflow_to_end<B: TestBackend>(db: Db<B>) {
    let client = db.client();
    let lonely = taskq::Task::enqueue(step("lonely"), &db.pool)
        .await
        .unwrap();
    let started = Instant::now();
    let waiter = {
        let client = client.clone();
        tokio::spawn(async move { client.wait(lonely.id, Duration::from_millis(500)).await })
    };
    // It reads at ~0, 10, 30, 70, 150 and 310 ms, each read a moment: sampled every 10 ms
    // while it waits, the pool is all idle nearly always (a waiter holding a connection
    // would make it never so).
    let (mut idle, mut samples) = (0, 0);
    while !waiter.is_finished() {
        samples += 1;
        if db.pool.num_idle() as u32 == db.pool.size() {
            idle += 1;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        samples >= 20 && idle * 10 >= samples * 8,
        "{}: all connections idle in {idle} of {samples} samples while waiting",
        B::LABEL
    );
    let late = waiter.await.unwrap();
    assert!(matches!(late, Err(Error::WaitTimedOut(d)) if d == Duration::from_millis(500)));
    assert!(started.elapsed() >= Duration::from_millis(500));
    let log = Log::default();
    let running = workers(&db, &log, 1);
    let t = client
        .wait(lonely.id, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(t.state, TaskState::Succeeded);
    let wf = Workflow::new("awaited")
        .step("a", step("a"))
        .step_after("b", step("b"), ["a"])
        .enqueue(&db.pool)
        .await
        .unwrap();
    let w = client
        .wait_workflow(wf.id, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!((w.state, w.counts.succeeded), (WorkflowState::Succeeded, 2));
    for w in running {
        w.stop().await;
    }
    assert!(matches!(
        client
            .wait(taskq::TaskId(lonely.id.0 + 1000), Duration::from_secs(1))
            .await,
        Err(Error::NotFound(_))
    ));
    assert!(matches!(
        client
            .wait_workflow(
                taskq::workflow::WorkflowId(wf.id.0 + 1000),
                Duration::from_secs(1)
            )
            .await,
        Err(Error::WorkflowNotFound(_))
    ));
}

/// `render` dies: `mail` after it is canceled, `tidy` (cleanup) runs, the workflow fails.
/// `Client::retry_workflow` moves `render` (the one dead step) back to pending, audited as
/// `workflow_retry`; it succeeds, `mail` comes back and runs, and the workflow ends
/// `succeeded`. A workflow with no dead step retries nothing (still audited); an unknown one
/// is not found and writes no audit entry.
async fn a_retried_workflow_runs_its_failed_steps_and_their_dependents<B: TestBackend>(db: Db<B>) {
    let log = Log::default();
    let gate = Gate::default();
    let flaky = |label: &str| WfFlaky {
        label: label.to_owned(),
    };
    let wf = Workflow::new("flaky")
        .step("fetch", step("fetch"))
        .step_after("render", flaky("render"), ["fetch"])
        .step_after("mail", step("mail"), ["render"])
        .cleanup_after("tidy", step("tidy"), ["render"])
        .enqueue(&db.pool)
        .await
        .unwrap();
    let worker = || {
        RunningWorker::spawn(
            db.worker()
                .queue("wf", 4)
                .register::<WfStep>()
                .register::<WfFlaky>()
                .data(log.clone())
                .data(gate.clone()),
        )
    };
    let client = db.client().with_actor("ops@example.com");
    let running = worker();
    let failed = client
        .wait_workflow(wf.id, Duration::from_secs(30))
        .await
        .expect("the workflow fails");
    running.stop().await;
    assert_eq!(failed.state, WorkflowState::Failed, "{}", B::LABEL);
    let states = |steps: Vec<taskq::workflow::WorkflowStepRow>| -> Vec<(String, TaskState)> {
        steps.into_iter().map(|s| (s.step, s.state)).collect()
    };
    let step_states = || async { states(client.workflow_steps(wf.id).await.unwrap()) };
    use TaskState::*;
    let named = |v: &[(&str, TaskState)]| -> Vec<(String, TaskState)> {
        v.iter().map(|(n, s)| ((*n).to_owned(), *s)).collect()
    };
    assert_eq!(
        step_states().await,
        named(&[
            ("fetch", Succeeded),
            ("render", Dead),
            ("mail", Canceled),
            ("tidy", Succeeded)
        ])
    );

    gate.open();
    assert_eq!(client.retry_workflow(wf.id).await.unwrap(), 1);
    let render = wf.task("render").unwrap();
    let t = client.get(render).await.unwrap();
    assert_eq!((t.state, t.attempt), (Pending, 0), "{}", B::LABEL);
    assert_eq!(
        step_states().await,
        named(&[
            ("fetch", Succeeded),
            ("render", Pending),
            ("mail", Canceled),
            ("tidy", Succeeded)
        ]),
        "{}: mail stays canceled until render succeeds",
        B::LABEL
    );
    let audit = client
        .audit(&taskq::client::AuditFilter::default())
        .await
        .unwrap();
    let entry = audit
        .iter()
        .find(|a| a.action == "workflow_retry")
        .expect("audited");
    assert_eq!(entry.actor, "ops@example.com");
    assert_eq!(
        entry.detail,
        serde_json::json!({"workflow_id": wf.id.0, "retried": 1, "task_ids": [render.0]})
    );

    let running = worker();
    let done = client
        .wait_workflow(wf.id, Duration::from_secs(30))
        .await
        .expect("the retried workflow ends");
    running.stop().await;
    assert_eq!(
        (done.state, done.counts.succeeded, done.counts.total()),
        (WorkflowState::Succeeded, 4, 4),
        "{}",
        B::LABEL
    );
    let steps = client.workflow_steps(wf.id).await.unwrap();
    let mail = steps.iter().find(|s| s.step == "mail").unwrap();
    assert!(!mail.canceled_by_dependency);
    let mut labels = log.labels();
    labels.sort();
    assert_eq!(labels, ["fetch", "mail", "render", "render", "tidy"]);

    // Nothing dead: nothing retried, the call still audited; an unknown workflow: not found.
    assert_eq!(client.retry_workflow(wf.id).await.unwrap(), 0);
    let retries = || async {
        client
            .audit(&taskq::client::AuditFilter::default())
            .await
            .unwrap()
            .into_iter()
            .filter(|a| a.action == "workflow_retry")
            .count()
    };
    assert_eq!(retries().await, 2);
    assert!(matches!(
        client
            .retry_workflow(taskq::workflow::WorkflowId(wf.id.0 + 99))
            .await,
        Err(Error::WorkflowNotFound(_))
    ));
    assert_eq!(retries().await, 2);
}

taskq_tests::conformance!(
    a_retried_workflow_runs_its_failed_steps_and_their_dependents,
    a_client_waits_for_a_task_or_a_workflow_to_end,
    a_diamond_of_200_steps_runs_each_step_once_after_its_dependencies,
    a_failed_step_cancels_its_dependents_and_the_cleanup_step_runs,
    a_workflow_is_all_or_nothing_and_a_bad_graph_writes_nothing,
    a_canceled_workflow_runs_nothing_more_and_is_audited,
);
