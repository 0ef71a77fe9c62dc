//! The dashboard's pending views (`Tasks::task_list_pending`): scheduled and retrying tasks.

use chrono::TimeDelta;
use taskq_driver::driver::Driver;
use taskq_driver::rows::{NewTask, PendingKind, WriteBack};
use taskq_driver::state::{TaskId, TaskState};

use crate::support::*;

fn ids_of(v: &[taskq_driver::read::TaskInfo]) -> Vec<TaskId> {
    v.iter().map(|t| t.id).collect()
}

/// `task_list_pending(Scheduled, ..)` lists the pending tasks due later (`run_at` after the
/// database's now), a retry waiting for its next attempt included; `Retrying` lists the
/// pending tasks with at least one attempt (due or not). Both order by `run_at`, then id, go on after a `(run_at,
/// id)` cursor, take an optional queue and stop at `limit`. Due, running and terminal tasks
/// are in neither.
pub async fn pending_views_list_scheduled_and_retrying_tasks_by_due_time<D: Driver>(d: D) {
    let mut c = conn(&d).await;
    let t0 = ms(now::<D>(&mut c).await);
    let later = |h: i64| Some(t0 + TimeDelta::hours(h));
    let due = insert::<D>(&mut c, task("q1", "a")).await;
    let s3 = insert::<D>(
        &mut c,
        NewTask {
            run_at: later(3),
            ..task("q1", "a")
        },
    )
    .await;
    let s1 = insert::<D>(
        &mut c,
        NewTask {
            run_at: later(1),
            ..task("q2", "a")
        },
    )
    .await;
    // Same due time as s1: the id breaks the tie.
    let s1b = insert::<D>(
        &mut c,
        NewTask {
            run_at: later(1),
            ..task("q1", "a")
        },
    )
    .await;
    // Attempted once and written back pending with a 2 h delay: retrying, and scheduled.
    let retry = insert::<D>(&mut c, task("q1", "r")).await;
    let t = claim_one(&d, &mut c, "q1", "r", LEASE_US, retry).await;
    let done = d
        .task_write_back(
            &mut c,
            &[WriteBack {
                error: Some("boom".into()),
                delay_us: 2 * HOUR_US,
                ..outcome(&t, "pending", "failed")
            }],
        )
        .await
        .expect("task_write_back");
    assert_eq!(done.written, 1);
    // Attempted once and written back due at once: retrying (first: due sooner), not scheduled.
    let retry_due = insert::<D>(&mut c, task("q2", "r2")).await;
    let t = claim_one(&d, &mut c, "q2", "r2", LEASE_US, retry_due).await;
    let done = d
        .task_write_back(
            &mut c,
            &[WriteBack {
                error: Some("bang".into()),
                ..outcome(&t, "pending", "failed")
            }],
        )
        .await
        .expect("task_write_back");
    assert_eq!(done.written, 1);
    // Running and dead tasks are in neither list.
    let running = insert::<D>(&mut c, task("q1", "x")).await;
    claim_one(&d, &mut c, "q1", "x", LEASE_US, running).await;

    let list = |kind, queue, after, limit| {
        let d = &d;
        async move {
            d.task_list_pending(kind, queue, after, limit)
                .await
                .expect("task_list_pending")
        }
    };
    let all = list(PendingKind::Scheduled, None, None, 10).await;
    assert_eq!(
        ids_of(&all),
        vec![s1, s1b, retry, s3],
        "{}: by due time, then id",
        backend::<D>()
    );
    assert!(all.iter().all(|t| t.state == TaskState::Pending));
    assert_eq!(all[3].run_at, later(3).unwrap());
    assert_eq!(
        ids_of(&list(PendingKind::Scheduled, Some("q1"), None, 10).await),
        vec![s1b, retry, s3]
    );
    // Keyset: after (run_at, id) of the first.
    let first = &all[0];
    assert_eq!(
        ids_of(
            &list(
                PendingKind::Scheduled,
                None,
                Some((first.run_at, first.id.0)),
                1
            )
            .await
        ),
        vec![s1b]
    );
    assert_eq!(
        ids_of(
            &list(
                PendingKind::Scheduled,
                None,
                Some((all[3].run_at, s3.0)),
                10
            )
            .await
        ),
        Vec::<TaskId>::new()
    );
    let retrying = list(PendingKind::Retrying, None, None, 10).await;
    assert_eq!(ids_of(&retrying), vec![retry_due, retry], "by due time");
    assert_eq!(retrying[1].attempt, 1);
    assert_eq!(retrying[1].last_error.as_deref(), Some("boom"));
    assert_eq!(
        ids_of(&list(PendingKind::Retrying, Some("q2"), None, 10).await),
        vec![retry_due]
    );
    assert_eq!(
        ids_of(&list(PendingKind::Retrying, Some("q1"), None, 10).await),
        vec![retry]
    );
    // Keyset: after (run_at, id) of the first, one per page.
    let r0 = &retrying[0];
    assert_eq!(
        ids_of(&list(PendingKind::Retrying, None, Some((r0.run_at, r0.id.0)), 1).await),
        vec![retry]
    );
    assert!(
        list(
            PendingKind::Retrying,
            None,
            Some((retrying[1].run_at, retry.0)),
            10
        )
        .await
        .is_empty()
    );
    // Claimed again (running), the due retry leaves the view; the other stays.
    claim_one(&d, &mut c, "q2", "r2", LEASE_US, retry_due).await;
    assert_eq!(
        ids_of(&list(PendingKind::Retrying, None, None, 10).await),
        vec![retry]
    );
    assert!(!ids_of(&all).contains(&due) && !ids_of(&all).contains(&running));
}

/// `task_run_times` reads `(name, finished_at - attempted_at)` of the tasks that succeeded in
/// the window, newest first, up to `limit`; other states and tasks finished before the window
/// are not read.
pub async fn run_times_are_read_from_the_successes_of_the_window<D: Driver>(d: D) {
    let mut c = conn(&d).await;
    let mut ids = vec![];
    for name in ["a", "b", "a"] {
        let id = insert::<D>(&mut c, task("q", name)).await;
        let t = claim_one(&d, &mut c, "q", name, LEASE_US, id).await;
        let done = d
            .task_write_back(&mut c, &[outcome(&t, "succeeded", "succeeded")])
            .await
            .expect("task_write_back");
        assert_eq!(done.written, 1);
        ids.push(id);
        wait_clock_past::<D>(&mut c, get(&d, id).await.finished_at.expect("finished")).await;
    }
    let dead = insert::<D>(&mut c, task("q", "x")).await;
    let t = claim_one(&d, &mut c, "q", "x", LEASE_US, dead).await;
    d.task_write_back(&mut c, &[outcome(&t, "dead", "failed")])
        .await
        .expect("task_write_back");

    let got = d.task_run_times(5, 10).await.expect("task_run_times");
    let names: Vec<&str> = got.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["a", "b", "a"], "{}: newest first", backend::<D>());
    for ((_, us), id) in got.iter().zip(ids.iter().rev()) {
        let t = get(&d, *id).await;
        let expect = t.finished_at.expect("finished") - t.attempted_at.expect("attempted");
        assert_eq!(*us, expect.num_microseconds().unwrap(), "{id}");
        assert!(*us >= 0);
    }
    assert_eq!(
        d.task_run_times(5, 2).await.expect("task_run_times").len(),
        2
    );
}
