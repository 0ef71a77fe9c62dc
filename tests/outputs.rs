//! Task outputs against a real database, with running workers: a handler's `Ok` value is
//! stored with its success (`taskq_tasks.output`), a step reads the output of the step it runs
//! after, `Client::wait_output` returns it; a `()` task stores nothing; an output over the
//! worker's limit fails its step for good (the steps after it canceled, the cleanup step run),
//! even when the handler ignores the refusal; a step reading what it may not is refused.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use taskq::workflow::{Workflow, WorkflowState};
use taskq::{Error, OutputError, Task, TaskContext, TaskError, TaskState};
use taskq_tests::RunningWorker;
use taskq_tests::backends::{Db, TestBackend};

/// What `fetch` returns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Orders {
    day: String,
    count: u32,
}

/// What `report` returns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Report {
    title: String,
    lines: Vec<String>,
}

/// Fetches a day's orders; its output is what the steps after it read.
#[taskq::task(queue = "out")]
async fn out_fetch(day: String) -> Result<Orders, TaskError> {
    Ok(Orders { day, count: 3 })
}

/// Reads `fetch`'s output and returns a report built from it.
#[taskq::task(queue = "out")]
async fn out_report(cx: TaskContext) -> Result<Report, TaskError> {
    let orders: Orders = cx
        .step_output("fetch")
        .await?
        .expect("fetch stored its orders");
    Ok(Report {
        title: format!("orders of {}", orders.day),
        lines: (1..=orders.count).map(|i| format!("order {i}")).collect(),
    })
}

/// A task that returns nothing: it stores no output.
#[taskq::task(queue = "out")]
async fn out_plain(n: u32) -> Result<(), TaskError> {
    let _ = n;
    Ok(())
}

/// Returns a string of `len` bytes (its JSON: `len + 2`).
#[taskq::task(queue = "out")]
async fn out_big(len: usize) -> Result<String, TaskError> {
    Ok("x".repeat(len))
}

/// Reads the output of `step`, which it may not (the test says why).
#[taskq::task(queue = "out", max_attempts = 3)]
async fn out_nosy(step: String, cx: TaskContext) -> Result<(), TaskError> {
    let _: Option<Orders> = cx.step_output(&step).await?;
    Ok(())
}

/// A hand-written task that records an output too large and ignores the refusal: it still
/// fails, so a step after it never runs without its output.
#[derive(Serialize, Deserialize)]
struct OutSwallow {
    len: usize,
}

impl Task for OutSwallow {
    const NAME: &'static str = "out_swallow";
    const QUEUE: &'static str = "out";
    async fn run(self, cx: TaskContext) -> Result<(), TaskError> {
        let refused = cx.set_output(&"y".repeat(self.len)).unwrap_err();
        assert!(matches!(
            refused.source().downcast_ref::<OutputError>(),
            Some(OutputError::TooLarge { .. })
        ));
        Ok(())
    }
}

fn worker<B: TestBackend>(db: &Db<B>, limit: Option<usize>) -> RunningWorker {
    let mut b = db
        .worker()
        .queue("out", 4)
        .register::<OutFetch>()
        .register::<OutReport>()
        .register::<OutPlain>()
        .register::<OutBig>()
        .register::<OutNosy>()
        .register::<OutSwallow>();
    if let Some(limit) = limit {
        b = b.output_limit(limit);
    }
    RunningWorker::spawn(b)
}

async fn output<B: TestBackend>(db: &Db<B>, id: taskq::TaskId) -> Option<String> {
    db.text(&format!(
        "SELECT output FROM taskq_tasks WHERE id = {}",
        id.0
    ))
    .await
}

const WAIT: Duration = Duration::from_secs(30);

/// fetch → report: report reads fetch's output through its context and returns its own; both
/// are stored as JSON in `taskq_tasks.output` and returned by `Client::wait_output`,
/// `Client::get` and `workflow_steps`; a `()` task stores NULL; a mistyped read is
/// `Error::InvalidOutput`.
async fn a_step_reads_the_output_of_the_step_it_runs_after<B: TestBackend>(db: Db<B>) {
    let wf = Workflow::new("outputs")
        .step(
            "fetch",
            OutFetch {
                day: "2026-12-01".into(),
            },
        )
        .step_after("report", OutReport {}, ["fetch"])
        .enqueue(&db.pool)
        .await
        .unwrap();
    let plain = OutPlain { n: 7 }.enqueue(&db.pool).await.unwrap();
    let running = worker(&db, None);
    let client = db.client();
    let report: Option<Report> = client
        .wait_output(wf.task("report").unwrap(), WAIT)
        .await
        .expect("report succeeds with an output");
    assert_eq!(
        report,
        Some(Report {
            title: "orders of 2026-12-01".into(),
            lines: vec!["order 1".into(), "order 2".into(), "order 3".into()],
        }),
        "{}",
        B::LABEL
    );
    let none: Option<Orders> = client.wait_output(plain.id, WAIT).await.unwrap();
    assert_eq!(none, None);
    running.stop().await;

    let fetch = wf.task("fetch").unwrap();
    assert_eq!(
        output(&db, fetch).await.as_deref(),
        Some(r#"{"day":"2026-12-01","count":3}"#),
        "{}",
        B::LABEL
    );
    assert_eq!(
        output(&db, wf.task("report").unwrap()).await.as_deref(),
        Some(r#"{"title":"orders of 2026-12-01","lines":["order 1","order 2","order 3"]}"#)
    );
    assert_eq!(output(&db, plain.id).await, None, "a `()` task stores NULL");
    let info = client.get(fetch).await.unwrap();
    assert_eq!(info.output_json().unwrap().unwrap()["count"], 3);
    let steps = client.workflow_steps(wf.id).await.unwrap();
    assert_eq!(
        steps[0].output.as_deref(),
        Some(r#"{"day":"2026-12-01","count":3}"#)
    );
    assert_eq!(
        client.workflow(wf.id).await.unwrap().state,
        WorkflowState::Succeeded
    );
    let wrong = client
        .wait_output::<Vec<u8>>(fetch, WAIT)
        .await
        .unwrap_err();
    assert!(
        matches!(&wrong, Error::InvalidOutput { id, .. } if *id == fetch),
        "{wrong:#?}"
    );
}

/// With an output limit of 1,000 bytes: a step whose output's JSON is 1,001 bytes dies at its
/// first attempt (a permanent error, `OutputError::TooLarge`'s text in `last_error`, nothing
/// stored), the step after it is canceled and the cleanup step runs; 998 bytes (1,000 of JSON)
/// pass. A hand-written task that ignores the refusal and returns `Ok` dies the same way.
/// `wait_output` of the dead step is `Error::WrongState`. A limit over 1 MiB is refused at
/// build.
async fn an_oversized_output_fails_the_step_and_cancels_the_steps_after_it<B: TestBackend>(
    db: Db<B>,
) {
    let wf = Workflow::new("too big")
        .step("big", OutBig { len: 999 })
        .step_after("after", OutPlain { n: 1 }, ["big"])
        .cleanup_after("tidy", OutPlain { n: 2 }, ["big"])
        .enqueue(&db.pool)
        .await
        .unwrap();
    let fits = OutBig { len: 998 }.enqueue(&db.pool).await.unwrap();
    let swallowed = Workflow::new("swallowed")
        .step("swallow", OutSwallow { len: 5_000 })
        .step_after("after", OutPlain { n: 3 }, ["swallow"])
        .enqueue(&db.pool)
        .await
        .unwrap();
    let running = worker(&db, Some(1_000));
    let client = db.client();
    let ended = client.wait_workflow(wf.id, WAIT).await.unwrap();
    let ended_swallowed = client.wait_workflow(swallowed.id, WAIT).await.unwrap();
    let fitted: Option<String> = client.wait_output(fits.id, WAIT).await.unwrap();
    running.stop().await;
    assert_eq!(fitted.map(|s| s.len()), Some(998), "{}", B::LABEL);

    assert_eq!(ended.state, WorkflowState::Failed, "{}", B::LABEL);
    let big = client.get(wf.task("big").unwrap()).await.unwrap();
    assert_eq!(
        (big.state, big.attempt),
        (TaskState::Dead, 1),
        "{}",
        B::LABEL
    );
    assert_eq!(
        big.last_error.as_deref(),
        Some(
            "output of 1001 bytes of JSON exceeds the worker's output limit of 1000 bytes \
             (WorkerBuilder::output_limit); it was not stored"
        )
    );
    assert_eq!(output(&db, big.id).await, None);
    let states: Vec<(String, TaskState)> = client
        .workflow_steps(wf.id)
        .await
        .unwrap()
        .into_iter()
        .map(|s| (s.step, s.state))
        .collect();
    assert_eq!(
        states,
        [
            ("big".to_owned(), TaskState::Dead),
            ("after".to_owned(), TaskState::Canceled),
            ("tidy".to_owned(), TaskState::Succeeded),
        ]
    );
    let dead = client
        .wait_output::<String>(big.id, WAIT)
        .await
        .unwrap_err();
    assert!(
        matches!(
            dead,
            Error::WrongState {
                state: TaskState::Dead,
                expected: "succeeded",
                ..
            }
        ),
        "{dead:#?}"
    );

    assert_eq!(ended_swallowed.state, WorkflowState::Failed);
    let swallow = client
        .get(swallowed.task("swallow").unwrap())
        .await
        .unwrap();
    assert_eq!(swallow.state, TaskState::Dead);
    assert!(
        swallow
            .last_error
            .as_deref()
            .is_some_and(|e| e.starts_with("output of 5002 bytes of JSON exceeds")),
        "{:?}",
        swallow.last_error
    );
    assert_eq!(
        client
            .get(swallowed.task("after").unwrap())
            .await
            .unwrap()
            .state,
        TaskState::Canceled
    );

    let too_high = db
        .worker()
        .register::<OutBig>()
        .output_limit((1 << 20) + 1)
        .build();
    assert!(
        matches!(too_high, Err(Error::Config(_))),
        "{:?}",
        too_high.err()
    );
}

/// A step reading a step it does not run after, a name that is no step, or reading at all
/// when it is no step dies at its first attempt (permanent), the typed refusal's text in
/// `last_error`.
async fn a_step_may_read_only_the_outputs_of_its_dependencies<B: TestBackend>(db: Db<B>) {
    let wf = Workflow::new("nosy")
        .step(
            "fetch",
            OutFetch {
                day: "2026-12-02".into(),
            },
        )
        .step(
            "sibling",
            OutNosy {
                step: "fetch".into(),
            },
        )
        .step_after(
            "unknown",
            OutNosy {
                step: "fecth".into(),
            },
            ["fetch"],
        )
        .enqueue(&db.pool)
        .await
        .unwrap();
    let lone = OutNosy {
        step: "fetch".into(),
    }
    .enqueue(&db.pool)
    .await
    .unwrap();
    let running = worker(&db, None);
    let client = db.client();
    client.wait_workflow(wf.id, WAIT).await.unwrap();
    client.wait(lone.id, WAIT).await.unwrap();
    running.stop().await;
    for (id, error) in [
        (
            wf.task("sibling").unwrap(),
            "step \"fetch\" is not one this step runs after: only the output of a dependency \
             can be read"
                .to_owned(),
        ),
        (
            wf.task("unknown").unwrap(),
            "the workflow has no step named \"fecth\"".to_owned(),
        ),
        (
            lone.id,
            format!(
                "task {} is not a workflow step: it has no steps to read the output of",
                lone.id
            ),
        ),
    ] {
        let t = client.get(id).await.unwrap();
        assert_eq!(
            (t.state, t.attempt, t.last_error.as_deref()),
            (TaskState::Dead, 1, Some(error.as_str())),
            "{}",
            B::LABEL
        );
    }
}

taskq_tests::conformance!(
    a_step_reads_the_output_of_the_step_it_runs_after,
    an_oversized_output_fails_the_step_and_cancels_the_steps_after_it,
    a_step_may_read_only_the_outputs_of_its_dependencies,
);
