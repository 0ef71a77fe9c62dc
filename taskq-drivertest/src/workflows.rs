//! Workflows: a graph of steps inserted at once, where a step becomes due only when every step
//! it runs after has succeeded; a failure cancels the steps after it (transitively) except
//! cleanup steps; a retried dead step that succeeds brings those steps back; ends the worker's
//! write-back did not settle are settled by the sweep (docs/workflows.md), the same way on
//! every driver.

use sqlx::Connection;
use taskq_driver::driver::Driver;
use taskq_driver::rows::{
    NewStep, NewWorkflow, RetryDead, StepOutput, WorkflowInserted, WriteBack,
};
use taskq_driver::rules::workflow::CANCELED_BY_DEPENDENCY;
use taskq_driver::state::{TaskId, TaskState};

use crate::support::*;

const Q: &str = "wf";

/// A step running task `name` (each step its own task name, so a claim can pick it).
fn step<'a>(name: &'a str, after: &[usize], cleanup: bool) -> NewStep<'a> {
    NewStep {
        step: name,
        task: task(Q, name),
        after: after.to_vec(),
        runs_after_failure: cleanup,
    }
}

async fn insert_wf<D: Driver>(
    c: &mut D::Conn,
    name: &str,
    steps: &[NewStep<'_>],
) -> WorkflowInserted {
    D::workflow_insert(c, &NewWorkflow { name, steps })
        .await
        .expect("workflow_insert")
}

async fn states<D: Driver>(d: &D, ids: &[TaskId]) -> Vec<TaskState> {
    let mut out = Vec::new();
    for id in ids {
        out.push(get(d, *id).await.state);
    }
    out
}

/// Claims step `name` (task `id`) and writes back `state`, as a worker does.
async fn run_step<D: Driver>(d: &D, c: &mut D::Conn, name: &str, id: TaskId, state: &'static str) {
    let t = claim_one(d, c, Q, name, LEASE_US, id).await;
    assert!(
        t.workflow_id.is_some(),
        "{}: the claim reads the workflow",
        backend::<D>()
    );
    let outcome_name = match state {
        "succeeded" => "succeeded",
        "canceled" => "canceled",
        _ => "failed",
    };
    let done = d
        .task_write_back(c, &[outcome(&t, state, outcome_name)])
        .await
        .expect("task_write_back");
    assert_eq!(done.written, 1, "{}: {name} written", backend::<D>());
}

/// A diamond (fetch → render, price → mail) is inserted with its first step pending and the
/// others waiting, as the steps' rows and the workflow's counts say; each step becomes due
/// only when the last step it runs after succeeded (in the write-back that records that
/// success, which names it), and the workflow's steps all end succeeded.
pub async fn a_step_becomes_due_only_when_every_step_it_runs_after_succeeded<D: Driver>(d: D) {
    use TaskState::*;
    let mut c = conn(&d).await;
    let wf = insert_wf::<D>(
        &mut c,
        "diamond",
        &[
            step("fetch", &[], false),
            step("render", &[0], false),
            step("price", &[0], false),
            step("mail", &[1, 2], false),
        ],
    )
    .await;
    let [fetch, render, price, mail] = <[TaskId; 4]>::try_from(wf.task_ids.clone()).unwrap();
    assert_eq!(
        states(&d, &wf.task_ids).await,
        [Pending, Waiting, Waiting, Waiting]
    );
    let row = d.workflow_get(wf.id).await.unwrap().expect("the workflow");
    assert_eq!(
        (row.name.as_str(), row.counts.pending, row.counts.waiting),
        ("diamond", 1, 3)
    );
    let steps = d.workflow_steps(wf.id).await.unwrap();
    let view: Vec<(&str, Vec<&str>)> = steps
        .iter()
        .map(|s| {
            (
                s.step.as_str(),
                s.after.iter().map(String::as_str).collect(),
            )
        })
        .collect();
    assert_eq!(
        view,
        [
            ("fetch", vec![]),
            ("render", vec!["fetch"]),
            ("price", vec!["fetch"]),
            ("mail", vec!["render", "price"])
        ]
    );
    // A waiting step is not claimed.
    let n = names(&["render", "price", "mail"]);
    assert!(claimed_ids(&claim(&d, &mut c, &req(Q, &n, 10)).await).is_empty());

    let t = claim_one(&d, &mut c, Q, "fetch", LEASE_US, fetch).await;
    let done = d
        .task_write_back(&mut c, &[outcome(&t, "succeeded", "succeeded")])
        .await
        .unwrap();
    let mut released: Vec<TaskId> = done.settled.released.iter().map(|(id, _)| *id).collect();
    released.sort();
    assert_eq!(released, [render, price], "{}", backend::<D>());
    assert!(done.settled.released.iter().all(|(_, q)| q == Q));
    assert_eq!(
        states(&d, &[render, price, mail]).await,
        [Pending, Pending, Waiting]
    );

    run_step(&d, &mut c, "render", render, "succeeded").await;
    assert_eq!(
        get(&d, mail).await.state,
        Waiting,
        "{}: fan-in waits for price",
        backend::<D>()
    );
    run_step(&d, &mut c, "price", price, "succeeded").await;
    assert_eq!(get(&d, mail).await.state, Pending);
    run_step(&d, &mut c, "mail", mail, "succeeded").await;
    let row = d.workflow_get(wf.id).await.unwrap().unwrap();
    assert_eq!((row.counts.succeeded, row.counts.total()), (4, 4));
}

/// A step that dies cancels the steps after it, and the steps after those; a cleanup step
/// after them runs anyway once they ended. The canceled steps are marked as canceled by a
/// dependency, with the error saying so.
pub async fn a_failed_step_cancels_the_steps_after_it_and_a_cleanup_step_still_runs<D: Driver>(
    d: D,
) {
    use TaskState::*;
    let mut c = conn(&d).await;
    let wf = insert_wf::<D>(
        &mut c,
        "failing",
        &[
            step("fetch", &[], false),
            step("render", &[0], false),
            step("mail", &[1], false),
            step("tidy", &[1, 2], true),
            step("audit", &[0], false),
        ],
    )
    .await;
    let [fetch, render, mail, tidy, audit] = <[TaskId; 5]>::try_from(wf.task_ids.clone()).unwrap();
    run_step(&d, &mut c, "fetch", fetch, "succeeded").await;
    assert_eq!(states(&d, &[render, audit]).await, [Pending, Pending]);
    run_step(&d, &mut c, "render", render, "dead").await;
    assert_eq!(
        states(&d, &[render, mail, tidy, audit]).await,
        [Dead, Canceled, Pending, Pending],
        "{}: render's death cancels mail; tidy runs after both ended",
        backend::<D>()
    );
    let m = get(&d, mail).await;
    assert_eq!(m.last_error.as_deref(), Some(CANCELED_BY_DEPENDENCY));
    let steps = d.workflow_steps(wf.id).await.unwrap();
    let by_dep: Vec<&str> = steps
        .iter()
        .filter(|s| s.canceled_by_dependency)
        .map(|s| s.step.as_str())
        .collect();
    assert_eq!(by_dep, ["mail"]);
    run_step(&d, &mut c, "tidy", tidy, "succeeded").await;
    run_step(&d, &mut c, "audit", audit, "succeeded").await;
    let row = d.workflow_get(wf.id).await.unwrap().unwrap();
    assert_eq!(
        (
            row.counts.succeeded,
            row.counts.dead,
            row.counts.canceled,
            row.counts.total()
        ),
        (3, 1, 1, 5)
    );
}

/// A dead step an operator retries, and that then succeeds, brings back the steps its death
/// canceled, one link at a time: each becomes due when what it runs after has succeeded.
pub async fn a_retried_dead_step_that_succeeds_brings_back_the_steps_it_canceled<D: Driver>(d: D) {
    use TaskState::*;
    let mut c = conn(&d).await;
    let wf = insert_wf::<D>(
        &mut c,
        "retried",
        &[
            step("fetch", &[], false),
            step("render", &[0], false),
            step("mail", &[1], false),
        ],
    )
    .await;
    let [fetch, render, mail] = <[TaskId; 3]>::try_from(wf.task_ids.clone()).unwrap();
    run_step(&d, &mut c, "fetch", fetch, "dead").await;
    assert_eq!(states(&d, &wf.task_ids).await, [Dead, Canceled, Canceled]);
    let mut tx = c.begin().await.unwrap();
    assert_eq!(
        d.task_retry_dead(&mut tx, fetch).await.unwrap(),
        RetryDead::Retried
    );
    tx.commit().await.unwrap();
    assert_eq!(
        states(&d, &wf.task_ids).await,
        [Pending, Canceled, Canceled]
    );
    run_step(&d, &mut c, "fetch", fetch, "succeeded").await;
    assert_eq!(
        states(&d, &wf.task_ids).await,
        [Succeeded, Pending, Canceled],
        "{}: render comes back due; mail waits for render's success",
        backend::<D>()
    );
    assert_eq!(get(&d, render).await.last_error, None);
    run_step(&d, &mut c, "render", render, "succeeded").await;
    assert_eq!(get(&d, mail).await.state, Pending);
    run_step(&d, &mut c, "mail", mail, "succeeded").await;
    let row = d.workflow_get(wf.id).await.unwrap().unwrap();
    assert_eq!(row.counts.succeeded, 3);
}

/// Ends the worker's write-back does not write (an operator's cancel of a pending step, the
/// delete of a finished one) are settled by the sweep: the steps after a canceled or deleted
/// step are canceled, a cleanup step after it becomes due; a second sweep finds nothing.
pub async fn the_sweep_settles_the_ends_the_write_back_did_not<D: Driver>(d: D) {
    use TaskState::*;
    let mut c = conn(&d).await;
    let wf = insert_wf::<D>(
        &mut c,
        "swept",
        &[
            step("fetch", &[], false),
            step("render", &[0], false),
            step("tidy", &[0], true),
            step("price", &[], false),
            step("mail", &[3], false),
        ],
    )
    .await;
    let [fetch, render, tidy, price, mail] = <[TaskId; 5]>::try_from(wf.task_ids.clone()).unwrap();
    let mut tx = c.begin().await.unwrap();
    assert!(d.task_cancel(&mut tx, fetch).await.unwrap());
    tx.commit().await.unwrap();
    // A success is settled by its write-back, at once.
    run_step(&d, &mut c, "price", price, "succeeded").await;
    assert_eq!(get(&d, mail).await.state, Pending);
    assert_eq!(states(&d, &[render, tidy]).await, [Waiting, Waiting]);
    let s = d.workflow_settle_stranded(&mut c, 100).await.unwrap();
    assert_eq!(s.canceled, [render], "{}", backend::<D>());
    assert_eq!(
        s.released.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
        [tidy]
    );
    assert_eq!(states(&d, &[render, tidy]).await, [Canceled, Pending]);
    let again = d.workflow_settle_stranded(&mut c, 100).await.unwrap();
    assert!(again.released.is_empty() && again.canceled.is_empty());

    // A dependency deleted before its end was settled counts as canceled.
    let wf2 = insert_wf::<D>(
        &mut c,
        "deleted",
        &[step("fetch", &[], false), step("render", &[0], false)],
    )
    .await;
    let mut tx = c.begin().await.unwrap();
    assert!(d.task_delete(&mut tx, wf2.task_ids[0]).await.unwrap());
    tx.commit().await.unwrap();
    let s = d.workflow_settle_stranded(&mut c, 100).await.unwrap();
    assert_eq!(s.canceled, [wf2.task_ids[1]]);

    // A waiting step deleted by an operator: its dependency's end settles the edge to it (no
    // effect), so the sweep does not find that edge again and again.
    let wf3 = insert_wf::<D>(
        &mut c,
        "child deleted",
        &[step("fetch", &[], false), step("render", &[0], false)],
    )
    .await;
    let mut tx = c.begin().await.unwrap();
    assert!(d.task_delete(&mut tx, wf3.task_ids[1]).await.unwrap());
    assert!(d.task_cancel(&mut tx, wf3.task_ids[0]).await.unwrap());
    tx.commit().await.unwrap();
    let s = d.workflow_settle_stranded(&mut c, 100).await.unwrap();
    assert!(
        s.canceled.is_empty() && s.released.is_empty(),
        "{}",
        backend::<D>()
    );
    assert_eq!(
        s.edges,
        1,
        "{}: the edge to the deleted step is settled",
        backend::<D>()
    );
    let again = d.workflow_settle_stranded(&mut c, 100).await.unwrap();
    assert_eq!(again.edges, 0, "{}: and not found again", backend::<D>());
}

/// A workflow canceled as a whole: its waiting and pending steps are canceled, its running step
/// asked to cancel; the workflow is marked canceled. An unknown id is not found.
pub async fn cancel_of_a_workflow_cancels_its_steps_and_asks_the_running_ones_to_stop<D: Driver>(
    d: D,
) {
    use TaskState::*;
    let mut c = conn(&d).await;
    let wf = insert_wf::<D>(
        &mut c,
        "canceled",
        &[
            step("fetch", &[], false),
            step("price", &[], false),
            step("mail", &[0, 1], false),
        ],
    )
    .await;
    let [fetch, price, mail] = <[TaskId; 3]>::try_from(wf.task_ids.clone()).unwrap();
    let running = claim_one(&d, &mut c, Q, "fetch", LEASE_US, fetch).await;
    let mut tx = c.begin().await.unwrap();
    let done = d.workflow_cancel(&mut tx, wf.id).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(
        (done.found, done.canceled, done.cancel_requested),
        (true, 2, 1),
        "{}",
        backend::<D>()
    );
    assert_eq!(
        states(&d, &[fetch, price, mail]).await,
        [Running, Canceled, Canceled]
    );
    let held = d
        .task_leases_held(&mut c, &[(fetch.0, running.lease_epoch)])
        .await
        .unwrap();
    assert_eq!(held, [(fetch.0, running.lease_epoch, true)]);
    let row = d.workflow_get(wf.id).await.unwrap().unwrap();
    assert!(row.canceled_at.is_some());
    let mut tx = c.begin().await.unwrap();
    let none = d.workflow_cancel(&mut tx, wf.id + 1000).await.unwrap();
    assert!(!none.found);
    drop(tx);
    assert!(d.workflow_get(wf.id + 1000).await.unwrap().is_none());
}

/// The insert is all or nothing in the caller's transaction: rolled back, no workflow, task,
/// step or edge remains; and workflows list newest first, by name when asked.
pub async fn a_rolled_back_workflow_leaves_nothing_and_workflows_list_newest_first<D: Driver>(
    d: D,
) {
    let mut c = conn(&d).await;
    let mut tx = c.begin().await.unwrap();
    let gone = insert_wf::<D>(
        &mut tx,
        "gone",
        &[step("a", &[], false), step("b", &[0], false)],
    )
    .await;
    drop(tx);
    assert!(d.workflow_get(gone.id).await.unwrap().is_none());
    for id in &gone.task_ids {
        assert!(
            d.task_get(*id).await.unwrap().is_none(),
            "{}",
            backend::<D>()
        );
    }
    let one = insert_wf::<D>(&mut c, "nightly", &[step("a", &[], false)]).await;
    let two = insert_wf::<D>(&mut c, "hourly", &[step("a", &[], false)]).await;
    let three = insert_wf::<D>(&mut c, "nightly", &[step("a", &[], false)]).await;
    let all: Vec<u64> = d
        .workflow_list(None, u64::MAX, 10)
        .await
        .unwrap()
        .iter()
        .map(|w| w.id)
        .collect();
    assert_eq!(all, [three.id, two.id, one.id]);
    let nightly: Vec<u64> = d
        .workflow_list(Some("nightly"), three.id, 10)
        .await
        .unwrap()
        .iter()
        .map(|w| w.id)
        .collect();
    assert_eq!(nightly, [one.id]);
}

/// A workflow is pruned with its step rows and edges once retention has pruned every one of its
/// steps' tasks; one with a task left is kept.
pub async fn a_workflow_is_pruned_once_retention_pruned_all_its_tasks<D: Driver>(d: D) {
    let mut c = conn(&d).await;
    let done = insert_wf::<D>(
        &mut c,
        "done",
        &[step("fetch", &[], false), step("render", &[0], false)],
    )
    .await;
    let kept = insert_wf::<D>(&mut c, "kept", &[step("mail", &[], false)]).await;
    run_step(&d, &mut c, "fetch", done.task_ids[0], "succeeded").await;
    run_step(&d, &mut c, "render", done.task_ids[1], "succeeded").await;
    // Retention prunes what finished before the cutoff: past the write-back's instant on the
    // database clock (SQLite's counts milliseconds, so a prune in the write-back's millisecond
    // would keep it).
    let written = now::<D>(&mut c).await;
    wait_clock_past::<D>(&mut c, written).await;
    assert_eq!(
        d.workflow_prune(&mut c, 100).await.unwrap(),
        0,
        "{}: tasks left",
        backend::<D>()
    );
    assert_eq!(
        d.task_prune(&mut c, TaskState::Succeeded, 0, 100)
            .await
            .unwrap(),
        2
    );
    assert_eq!(
        d.workflow_prune(&mut c, 100).await.unwrap(),
        1,
        "{}",
        backend::<D>()
    );
    assert!(d.workflow_get(done.id).await.unwrap().is_none());
    assert!(d.workflow_steps(done.id).await.unwrap().is_empty());
    assert!(d.workflow_get(kept.id).await.unwrap().is_some());
    assert_eq!(d.workflow_prune(&mut c, 100).await.unwrap(), 0);
}

/// A success's output is stored with it by the write-back (a plain task's too, and a success
/// without one stores none), shown by `task_get` and `workflow_steps`; a step reads the output
/// of a step it runs after through `workflow_step_output`, and is refused (typed) the output of
/// a step it does not run after, of a name that is no step, and when it is no step at all.
pub async fn a_success_stores_its_output_for_the_steps_after_it<D: Driver>(d: D) {
    let mut c = conn(&d).await;
    let wf = insert_wf::<D>(
        &mut c,
        "outputs",
        &[
            step("fetch", &[], false),
            step("render", &[0], false),
            step("other", &[], false),
            step("tidy", &[1], true),
        ],
    )
    .await;
    let [fetch, render, other, tidy] = <[TaskId; 4]>::try_from(wf.task_ids.clone()).unwrap();
    let out = r#"{"rows":3,"day":"2026-12-01","note":"é \"quoted\""}"#;

    // Before fetch succeeded, render reads no output yet (it is not due either).
    assert_eq!(
        d.workflow_step_output(render, "fetch").await.unwrap(),
        StepOutput::Output(None)
    );
    let t = claim_one(&d, &mut c, Q, "fetch", LEASE_US, fetch).await;
    let done = d
        .task_write_back(
            &mut c,
            &[WriteBack {
                output: Some(out.into()),
                ..outcome(&t, "succeeded", "succeeded")
            }],
        )
        .await
        .unwrap();
    assert_eq!(done.written, 1);
    let fetched = get(&d, fetch).await;
    assert_eq!(fetched.state, TaskState::Succeeded);
    assert_eq!(fetched.output.as_deref(), Some(out), "{}", backend::<D>());
    assert_eq!(
        fetched.output_json().unwrap().unwrap()["note"],
        "é \"quoted\""
    );
    assert_eq!(
        d.workflow_step_output(render, "fetch").await.unwrap(),
        StepOutput::Output(Some(out.into())),
        "{}",
        backend::<D>()
    );
    // Refused: a step render does not run after (itself included), a name that is no step.
    for name in ["other", "render", "tidy"] {
        assert_eq!(
            d.workflow_step_output(render, name).await.unwrap(),
            StepOutput::NotADependency,
            "{}: {name}",
            backend::<D>()
        );
    }
    assert_eq!(
        d.workflow_step_output(render, "Fetch").await.unwrap(),
        StepOutput::UnknownStep
    );
    // A success without an output (a `()` handler) stores none; the cleanup step after it
    // reads `None`.
    run_step(&d, &mut c, "render", render, "succeeded").await;
    assert_eq!(get(&d, render).await.output, None);
    assert_eq!(
        d.workflow_step_output(tidy, "render").await.unwrap(),
        StepOutput::Output(None)
    );
    // The workflow's steps carry their outputs.
    let steps = d.workflow_steps(wf.id).await.unwrap();
    let outputs: Vec<(&str, Option<&str>)> = steps
        .iter()
        .map(|s| (s.step.as_str(), s.output.as_deref()))
        .collect();
    assert_eq!(
        outputs,
        [
            ("fetch", Some(out)),
            ("render", None),
            ("other", None),
            ("tidy", None)
        ]
    );
    assert_eq!(get(&d, other).await.output, None);

    // A task that is no step: its output is stored all the same; it reads none of a step.
    let plain = insert::<D>(&mut c, crate::fixtures::task(Q, "plain")).await;
    let t = claim_one(&d, &mut c, Q, "plain", LEASE_US, plain).await;
    assert_eq!(t.workflow_id, None);
    let done = d
        .task_write_back(
            &mut c,
            &[WriteBack {
                output: Some("[1,2,3]".into()),
                ..outcome(&t, "succeeded", "succeeded")
            }],
        )
        .await
        .unwrap();
    assert_eq!(done.written, 1);
    assert_eq!(get(&d, plain).await.output.as_deref(), Some("[1,2,3]"));
    assert_eq!(
        d.workflow_step_output(plain, "fetch").await.unwrap(),
        StepOutput::NotAStep
    );
    assert_eq!(
        d.workflow_step_output(TaskId(u64::MAX >> 1), "fetch")
            .await
            .unwrap(),
        StepOutput::NotAStep
    );
}
