//! The operator's actions (`Actions`): cancel, cancel request, retry of dead tasks,
//! reschedule, priority, and retention.

use chrono::TimeDelta;
use taskq_driver::driver::Driver;
use taskq_driver::rows::{NewTask, RetryDead, WriteBack};
use taskq_driver::state::{TaskId, TaskState};

use crate::support::*;

/// Claims `id` (named `name` on `q`) and writes it back `dead`; the claimed task.
async fn kill<D: Driver>(d: &D, c: &mut D::Conn, name: &str, id: TaskId) {
    let t = claim_one(d, c, "q", name, LEASE_US, id).await;
    let done = d
        .task_write_back(
            c,
            &[WriteBack {
                error: Some("fatal".into()),
                ..outcome(&t, "dead", "failed")
            }],
        )
        .await
        .expect("task_write_back");
    assert_eq!(done.written, 1);
    assert_eq!(get(d, id).await.state, TaskState::Dead);
}

/// `task_cancel` moves a pending task to `canceled` (finished) and returns true; a task that
/// is not pending (running, already canceled, unknown) is left alone and it returns false.
/// `task_cancel_batch` cancels the pending tasks among its ids and returns how many.
pub async fn cancel_ends_a_pending_task_only<D: Driver>(d: D) {
    let mut c = conn(&d).await;
    let a = insert::<D>(&mut c, task("q", "a")).await;
    let running = insert::<D>(&mut c, task("q", "r")).await;
    claim_one(&d, &mut c, "q", "r", LEASE_US, running).await;
    assert!(d.task_cancel(&mut c, a).await.expect("task_cancel"));
    let t = get(&d, a).await;
    assert_eq!(t.state, TaskState::Canceled);
    assert_eq!(t.finished_at, Some(t.updated_at));
    assert_eq!((t.attempt, t.lease_epoch), (0, 0));
    assert!(
        !d.task_cancel(&mut c, a).await.expect("task_cancel"),
        "already canceled"
    );
    assert!(!d.task_cancel(&mut c, running).await.expect("task_cancel"));
    assert_eq!(get(&d, running).await.state, TaskState::Running);
    assert!(
        !d.task_cancel(&mut c, TaskId(running.0 + 1_000))
            .await
            .expect("task_cancel")
    );

    let p1 = insert::<D>(&mut c, task("q", "a")).await;
    let p2 = insert::<D>(&mut c, task("q", "a")).await;
    let n = d
        .task_cancel_batch(&[p1.0, running.0, a.0, p2.0, p2.0 + 1_000])
        .await
        .expect("task_cancel_batch");
    assert_eq!(n, 2, "{}: the two pending ones", backend::<D>());
    for id in [p1, p2] {
        assert_eq!(get(&d, id).await.state, TaskState::Canceled);
    }
    assert_eq!(get(&d, running).await.state, TaskState::Running);
    assert_eq!(
        d.task_cancel_batch(&[]).await.expect("task_cancel_batch"),
        0
    );
}

/// A cancel request is recorded on a running task only (it stays running; `true`, again
/// `true` with the first request kept), not on a pending one (`false`). A request left on a
/// task whose attempt was written back as a retry ends it `canceled` at its next claim,
/// without starting it (reported in `ClaimBatch::canceled`, attempt and epoch unchanged).
/// `task_request_cancel_batch` records it on the running tasks among its ids.
pub async fn a_cancel_request_is_recorded_on_a_running_task_only<D: Driver>(d: D) {
    let mut c = conn(&d).await;
    let running = insert::<D>(&mut c, task("q", "a")).await;
    let pending = insert::<D>(&mut c, task("q", "p")).await;
    let t = claim_one(&d, &mut c, "q", "a", LEASE_US, running).await;
    assert!(
        !d.task_request_cancel(&mut c, pending)
            .await
            .expect("task_request_cancel")
    );
    assert!(
        d.task_request_cancel(&mut c, running)
            .await
            .expect("task_request_cancel")
    );
    assert!(
        d.task_request_cancel(&mut c, running)
            .await
            .expect("task_request_cancel"),
        "kept from the first request"
    );
    let r = get(&d, running).await;
    assert_eq!((r.state, r.lease_epoch), (TaskState::Running, 1));
    assert_eq!(get(&d, pending).await.state, TaskState::Pending);
    assert_eq!(
        d.task_leases_held(&mut c, &leases(&[(running, 1)]))
            .await
            .expect("task_leases_held"),
        vec![(running.0, 1, true)]
    );

    // The attempt's own outcome was a retry, written before the worker saw the request.
    let retry = WriteBack {
        error: Some("flaky".into()),
        ..outcome(&t, "pending", "failed")
    };
    assert_eq!(
        d.task_write_back(&mut c, &[retry])
            .await
            .expect("task_write_back")
            .written,
        1
    );
    assert_eq!(get(&d, running).await.state, TaskState::Pending);
    let got = claim(&d, &mut c, &req("q", &names(&["a"]), 10)).await;
    assert!(got.tasks.is_empty(), "{}: not started", backend::<D>());
    assert_eq!(got.canceled.len(), 1);
    assert_eq!(
        (got.canceled[0].id, got.canceled[0].name.as_str()),
        (running.0, "a")
    );
    let r = get(&d, running).await;
    assert_eq!(r.state, TaskState::Canceled);
    assert_eq!((r.attempt, r.lease_epoch), (1, 1));
    assert!(r.finished_at.is_some());

    // In a batch: only the running ones.
    let r1 = insert::<D>(&mut c, task("q", "b")).await;
    let r2 = insert::<D>(&mut c, task("q", "b")).await;
    let p = insert::<D>(&mut c, task("q", "z")).await;
    claim(&d, &mut c, &req("q", &names(&["b"]), 2)).await;
    assert_eq!(
        d.task_request_cancel_batch(&[r1.0, p.0, r2.0, running.0])
            .await
            .expect("task_request_cancel_batch"),
        2
    );
    let mut held = d
        .task_leases_held(&mut c, &leases(&[(r1, 1), (r2, 1)]))
        .await
        .expect("task_leases_held");
    held.sort_unstable();
    assert_eq!(held, vec![(r1.0, 1, true), (r2.0, 1, true)]);
    assert_eq!(get(&d, p).await.state, TaskState::Pending);
}

/// `task_retry_dead` moves a dead task back to pending, due now, with its attempts reset and
/// its epoch incremented (`Retried`); a task that is not dead, or unknown, is `NotDead` and
/// unchanged. `task_retry_dead_ids` retries the dead tasks among its ids, and only those.
pub async fn retry_dead_moves_dead_tasks_back_to_pending<D: Driver>(d: D) {
    let mut c = conn(&d).await;
    let a = insert::<D>(&mut c, task("q", "a")).await;
    kill(&d, &mut c, "a", a).await;
    assert_eq!(
        d.task_retry_dead(&mut c, a).await.expect("task_retry_dead"),
        RetryDead::Retried
    );
    let t = get(&d, a).await;
    assert_eq!(t.state, TaskState::Pending);
    assert_eq!((t.attempt, t.lease_epoch), (0, 2));
    assert_eq!((t.finished_at, t.lease_until), (None, None));
    assert_eq!(t.run_at, t.updated_at, "due now");
    assert_eq!(t.last_error.as_deref(), Some("fatal"), "kept");
    assert_eq!(
        d.task_retry_dead(&mut c, a).await.expect("task_retry_dead"),
        RetryDead::NotDead,
        "pending now"
    );
    assert_eq!(
        d.task_retry_dead(&mut c, TaskId(a.0 + 1_000))
            .await
            .expect("task_retry_dead"),
        RetryDead::NotDead
    );
    let again = claim_one(&d, &mut c, "q", "a", LEASE_US, a).await;
    assert_eq!((again.attempt, again.lease_epoch), (1, 3));

    // By ids.
    let x = insert::<D>(&mut c, task("q", "x")).await;
    let y = insert::<D>(&mut c, task("q", "y")).await;
    kill(&d, &mut c, "x", x).await;
    kill(&d, &mut c, "y", y).await;
    let pending = insert::<D>(&mut c, task("q", "p")).await;
    assert_eq!(
        d.task_retry_dead_ids(&[x.0, pending.0, a.0, x.0 + 1_000])
            .await
            .expect("task_retry_dead_ids"),
        1
    );
    assert_eq!(get(&d, x).await.state, TaskState::Pending);
    assert_eq!(get(&d, x).await.lease_epoch, 2);
    assert_eq!(get(&d, y).await.state, TaskState::Dead);
}

/// `task_retry_dead_batch` retries the dead tasks of a queue (or of every queue) that died at
/// or before `died_before`, oldest death first, up to `limit`, and returns how many; a task
/// that died later, or one unique while pending or running, stays dead. The unique ones are
/// listed by `task_dead_unique_ids` for the one-by-one retry.
pub async fn retry_dead_in_bulk_honours_the_queue_the_time_bound_and_the_limit<D: Driver>(d: D) {
    let mut c = conn(&d).await;
    let in_q = |name| task("q", name);
    let x1 = insert::<D>(&mut c, in_q("x1")).await;
    let x2 = insert::<D>(&mut c, in_q("x2")).await;
    let key = [0x42; 32];
    let u = insert::<D>(&mut c, unique("u", &key, "running")).await;
    let y = insert::<D>(&mut c, task("other", "y")).await;
    for (name, id) in [("x1", x1), ("x2", x2), ("u", u)] {
        kill(&d, &mut c, name, id).await;
    }
    let ty = claim_one(&d, &mut c, "other", "y", LEASE_US, y).await;
    d.task_write_back(&mut c, &[outcome(&ty, "dead", "failed")])
        .await
        .expect("task_write_back");
    let cut = now::<D>(&mut c).await;
    wait_clock_past::<D>(&mut c, cut).await;
    let z = insert::<D>(&mut c, in_q("z")).await;
    kill(&d, &mut c, "z", z).await;
    assert!(get(&d, z).await.finished_at.unwrap() > cut);

    assert_eq!(
        d.task_dead_unique_ids(None, cut, 0, 10)
            .await
            .expect("task_dead_unique_ids"),
        vec![u]
    );
    assert!(
        d.task_dead_unique_ids(Some("other"), cut, 0, 10)
            .await
            .expect("task_dead_unique_ids")
            .is_empty()
    );
    assert!(
        d.task_dead_unique_ids(None, cut, u.0, 10)
            .await
            .expect("task_dead_unique_ids")
            .is_empty(),
        "after its id"
    );

    let n = d
        .task_retry_dead_batch(Some("q"), cut, 10)
        .await
        .expect("task_retry_dead_batch");
    assert_eq!(
        n,
        2,
        "{}: x1 and x2, not u (unique), z (later)",
        backend::<D>()
    );
    for id in [x1, x2] {
        let t = get(&d, id).await;
        assert_eq!(
            (t.state, t.attempt, t.lease_epoch),
            (TaskState::Pending, 0, 2)
        );
    }
    for id in [u, z, y] {
        assert_eq!(get(&d, id).await.state, TaskState::Dead, "task {id}");
    }
    // Every queue, one at a time, oldest death first: y died before z.
    let later = now::<D>(&mut c).await;
    assert_eq!(
        d.task_retry_dead_batch(None, later, 1)
            .await
            .expect("task_retry_dead_batch"),
        1
    );
    assert_eq!(get(&d, y).await.state, TaskState::Pending);
    assert_eq!(get(&d, z).await.state, TaskState::Dead);
    assert_eq!(
        d.task_retry_dead_batch(None, later, 10)
            .await
            .expect("task_retry_dead_batch"),
        1
    );
    assert_eq!(get(&d, z).await.state, TaskState::Pending);
    assert_eq!(
        get(&d, u).await.state,
        TaskState::Dead,
        "unique: one by one"
    );
}

/// `task_reschedule` moves a pending task's due time to a given time, or to a delay from the
/// database's now, and returns true; attempts and epoch are unchanged. A running or unknown
/// task is unchanged and it returns false.
pub async fn reschedule_moves_a_pending_task_only<D: Driver>(d: D) {
    let mut c = conn(&d).await;
    let a = insert::<D>(&mut c, task("q", "a")).await;
    let at = ms(now::<D>(&mut c).await) + TimeDelta::days(2);
    assert!(
        d.task_reschedule(&mut c, a, Some(at), 0)
            .await
            .expect("task_reschedule")
    );
    let t = get(&d, a).await;
    assert_eq!(t.run_at, at);
    assert_eq!(
        (t.state, t.attempt, t.lease_epoch),
        (TaskState::Pending, 0, 0)
    );
    assert!(
        claim(&d, &mut c, &req("q", &names(&["a"]), 1))
            .await
            .tasks
            .is_empty(),
        "not due"
    );
    assert!(
        d.task_reschedule(&mut c, a, None, HOUR_US)
            .await
            .expect("task_reschedule")
    );
    let t = get(&d, a).await;
    assert_eq!(t.run_at, t.updated_at + TimeDelta::hours(1));
    assert!(
        d.task_reschedule(&mut c, a, None, -60_000_000)
            .await
            .expect("task_reschedule")
    );
    claim_one(&d, &mut c, "q", "a", LEASE_US, a).await;
    let snap = get(&d, a).await.run_at;
    assert!(
        !d.task_reschedule(&mut c, a, Some(at), 0)
            .await
            .expect("task_reschedule"),
        "running"
    );
    assert_eq!(get(&d, a).await.run_at, snap);
    assert!(
        !d.task_reschedule(&mut c, TaskId(a.0 + 1_000), None, 0)
            .await
            .expect("task_reschedule")
    );
}

/// `task_set_priority` changes a pending task's priority (and so its place in claim order)
/// and returns true; a running or unknown task is unchanged and it returns false.
pub async fn set_priority_changes_a_pending_task_only<D: Driver>(d: D) {
    let mut c = conn(&d).await;
    let a = insert::<D>(&mut c, task("q", "a")).await;
    let b = insert::<D>(&mut c, task("q", "a")).await;
    assert!(
        d.task_set_priority(&mut c, b, -5)
            .await
            .expect("task_set_priority")
    );
    let t = get(&d, b).await;
    assert_eq!(
        (t.priority, t.state, t.lease_epoch),
        (-5, TaskState::Pending, 0)
    );
    let got = claim(&d, &mut c, &req("q", &names(&["a"]), 1)).await;
    assert_eq!(claimed_ids(&got), vec![b], "the lower priority first");
    assert!(
        !d.task_set_priority(&mut c, b, 9)
            .await
            .expect("task_set_priority"),
        "running"
    );
    assert_eq!(get(&d, b).await.priority, -5);
    assert!(
        !d.task_set_priority(&mut c, TaskId(a.0 + 1_000), 1)
            .await
            .expect("task_set_priority")
    );
    assert_eq!(get(&d, a).await.priority, 0);
}

/// Retention: `task_prune` deletes tasks of one terminal state that finished more than
/// `age_secs` ago (on the database clock), up to `limit`, and returns how many;
/// `task_prune_count` counts what it would delete. Tasks of other states, and younger ones,
/// are kept.
pub async fn prune_deletes_old_terminal_tasks_of_the_state_only<D: Driver>(d: D) {
    let mut c = conn(&d).await;
    let done = insert::<D>(&mut c, task("q", "a")).await;
    let t = claim_one(&d, &mut c, "q", "a", LEASE_US, done).await;
    d.task_write_back(&mut c, &[outcome(&t, "succeeded", "succeeded")])
        .await
        .expect("task_write_back");
    let c1 = insert::<D>(&mut c, task("q", "b")).await;
    let c2 = insert::<D>(&mut c, task("q", "b")).await;
    assert_eq!(d.task_cancel_batch(&[c1.0, c2.0]).await.expect("cancel"), 2);
    let pending = insert::<D>(&mut c, task("q", "p")).await;
    let dead = insert::<D>(&mut c, task("q", "x")).await;
    kill(&d, &mut c, "x", dead).await;

    assert_eq!(
        d.task_prune(&mut c, TaskState::Succeeded, 3_600, 10)
            .await
            .expect("task_prune"),
        0,
        "not an hour old"
    );
    assert_eq!(
        d.task_prune_count(TaskState::Succeeded, 3_600)
            .await
            .expect("task_prune_count"),
        0
    );
    let newest = get(&d, dead).await.finished_at.expect("finished");
    wait_clock_past::<D>(&mut c, newest).await;
    assert_eq!(
        d.task_prune_count(TaskState::Canceled, 0)
            .await
            .expect("task_prune_count"),
        2
    );
    assert_eq!(
        d.task_prune(&mut c, TaskState::Canceled, 0, 1)
            .await
            .expect("task_prune"),
        1,
        "up to the limit"
    );
    assert_eq!(
        d.task_prune(&mut c, TaskState::Canceled, 0, 10)
            .await
            .expect("task_prune"),
        1
    );
    assert_eq!(
        d.task_prune(&mut c, TaskState::Succeeded, 0, 10)
            .await
            .expect("task_prune"),
        1
    );
    for id in [done, c1, c2] {
        assert!(
            d.task_get(id).await.expect("task_get").is_none(),
            "task {id}"
        );
    }
    assert_eq!(get(&d, pending).await.state, TaskState::Pending);
    assert_eq!(get(&d, dead).await.state, TaskState::Dead, "another state");
    assert_eq!(
        d.task_prune(&mut c, TaskState::Pending, 0, 10)
            .await
            .expect("task_prune"),
        0,
        "pending is not terminal: no finish time"
    );
    // Ids are not reused after the newest rows are deleted.
    let next = insert::<D>(&mut c, NewTask { ..task("q", "a") }).await;
    assert!(next > dead);
}

/// `task_delete` deletes a pending or finished task and the unique identity it holds (a new
/// task can take it), and returns true; a running or unknown task is left alone and it
/// returns false.
pub async fn delete_removes_a_task_that_is_not_running_and_its_identity<D: Driver>(d: D) {
    let mut c = conn(&d).await;
    let plain = insert::<D>(&mut c, task("q", "a")).await;
    let held = insert::<D>(&mut c, unique("u", &[7u8; 32], "running")).await;
    assert!(get(&d, held).await.unique_held);
    let running = insert::<D>(&mut c, task("q", "r")).await;
    claim_one(&d, &mut c, "q", "r", LEASE_US, running).await;
    let dead = insert::<D>(&mut c, task("q", "x")).await;
    kill(&d, &mut c, "x", dead).await;

    for id in [plain, held, dead] {
        assert!(
            d.task_delete(&mut c, id).await.expect("task_delete"),
            "{id}"
        );
        assert!(d.task_get(id).await.expect("task_get").is_none(), "{id}");
    }
    assert!(
        !d.task_delete(&mut c, plain).await.expect("task_delete"),
        "already gone"
    );
    assert!(
        !d.task_delete(&mut c, running).await.expect("task_delete"),
        "{}: running",
        backend::<D>()
    );
    assert_eq!(get(&d, running).await.state, TaskState::Running);
    // The identity is free again: a new task takes it.
    let again = insert::<D>(&mut c, unique("u", &[7u8; 32], "running")).await;
    assert!(get(&d, again).await.unique_held);
}
