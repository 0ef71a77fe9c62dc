//! The claim (`Claims::task_claim`).

use chrono::TimeDelta;
use taskq_driver::driver::Driver;
use taskq_driver::rows::{ClaimRequest, NewTask};
use taskq_driver::state::TaskState;

use crate::support::*;

/// A claim takes due tasks of its queue whose name it asks for, and no others (not a task due
/// later, not another name, not another queue), in order of priority, then due time, then id,
/// up to its limit. Each claimed task starts its first attempt under a fresh lease: attempt
/// 1, epoch 1, running, the claiming worker, `attempted_at` now and `lease_until` one lease
/// later on the database clock; the claim reports how long it waited. A second claim does
/// not take those tasks again.
pub async fn a_claim_takes_due_tasks_by_priority_then_due_time_up_to_the_limit<D: Driver>(d: D) {
    let mut c = conn(&d).await;
    let t0 = ms(now::<D>(&mut c).await) - TimeDelta::seconds(60);
    let at = |s: i64| Some(t0 + TimeDelta::seconds(s));
    let due = |priority, s| NewTask {
        priority,
        run_at: at(s),
        payload: b"{\"due\":1}",
        max_attempts: 4,
        trace_context: Some("00-claim"),
        ..task("q", "a")
    };
    let a = insert::<D>(&mut c, due(5, 1)).await;
    let b = insert::<D>(&mut c, due(0, 3)).await;
    let e = insert::<D>(&mut c, due(0, 2)).await;
    let f = insert::<D>(&mut c, due(0, 2)).await;
    let later = insert::<D>(
        &mut c,
        NewTask {
            delay_us: HOUR_US,
            ..task("q", "a")
        },
    )
    .await;
    let other_name = insert::<D>(&mut c, task("q", "zzz")).await;
    let other_queue = insert::<D>(&mut c, task("other", "a")).await;

    let a_only = names(&["a"]);
    let got = claim(&d, &mut c, &req("q", &a_only, 3)).await;
    assert_eq!(
        claimed_ids(&got),
        vec![e, f, b],
        "{}: priority, then run_at, then id, up to the limit",
        backend::<D>()
    );
    assert!(got.expired.is_empty() && got.canceled.is_empty());
    assert!(got.limited.is_none() && !got.contended && !got.partial);
    for t in &got.tasks {
        assert_eq!((t.attempt, t.lease_epoch), (1, 1), "task {}", t.id);
        assert_eq!((t.max_attempts, t.snoozes), (4, 0));
        assert_eq!(
            (t.name.as_str(), t.payload.as_slice()),
            ("a", &b"{\"due\":1}"[..])
        );
        assert_eq!(t.trace_context.as_deref(), Some("00-claim"));
        assert_eq!((&t.unique_key, &t.unique_while), (&None, &None));
        assert_eq!(t.parked_error, None);
        // Due 57 to 58 s before the claim (more on a slow machine).
        assert!(
            (57_000_000..600_000_000).contains(&t.wait_us),
            "task {} waited {} µs",
            t.id,
            t.wait_us
        );
    }
    let row = get(&d, e).await;
    assert_eq!(row.state, TaskState::Running);
    assert_eq!((row.attempt, row.lease_epoch), (1, 1));
    assert_eq!(row.worker_id.as_deref(), Some(W));
    let started = row.attempted_at.expect("attempted_at set by the claim");
    assert_eq!(row.lease_until, Some(started + micros(LEASE_US)));
    assert_eq!(row.updated_at, started);
    assert_eq!(row.run_at, t0 + TimeDelta::seconds(2), "run_at kept");

    let rest = claim(&d, &mut c, &req("q", &a_only, 10)).await;
    assert_eq!(
        claimed_ids(&rest),
        vec![a],
        "the rest: not the claimed ones, not the later one, not other names or queues"
    );
    assert!(
        claim(&d, &mut c, &req("q", &a_only, 10))
            .await
            .tasks
            .is_empty()
    );
    for id in [later, other_name, other_queue] {
        assert_eq!(get(&d, id).await.state, TaskState::Pending, "task {id}");
    }
    let both = names(&["a", "zzz"]);
    assert_eq!(
        claimed_ids(&claim(&d, &mut c, &req("q", &both, 10)).await),
        vec![other_name]
    );
    assert_eq!(
        claimed_ids(&claim(&d, &mut c, &req("other", &a_only, 10)).await),
        vec![other_queue]
    );

    // The running tasks the worker claimed lately, per queue (what a lost claim took).
    let mut since = d
        .task_running_since(&mut c, "q", W, 600_000_000)
        .await
        .expect("task_running_since");
    since.sort_unstable();
    let mut want: Vec<(u64, u64)> = [a, b, e, f, other_name]
        .iter()
        .map(|id| (id.0, 1))
        .collect();
    want.sort_unstable();
    assert_eq!(since, want);
    assert!(
        d.task_running_since(&mut c, "q", "another worker", 600_000_000)
            .await
            .expect("task_running_since")
            .is_empty()
    );
}

/// Claims on two connections take disjoint tasks: the first takes up to its limit, the
/// second the rest, a third none. Each claimed task is running under the worker that claimed
/// it, with epoch 1.
pub async fn a_second_claim_does_not_take_claimed_tasks_again<D: Driver>(d: D) {
    let mut c1 = conn(&d).await;
    let mut c2 = conn(&d).await;
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(insert::<D>(&mut c1, task("q", "a")).await);
    }
    let a = names(&["a"]);
    let first = claim(&d, &mut c1, &req("q", &a, 2)).await;
    assert_eq!(claimed_ids(&first), ids[..2]);
    let second = claim(
        &d,
        &mut c2,
        &ClaimRequest {
            worker_id: "w2",
            ..req("q", &a, 10)
        },
    )
    .await;
    assert_eq!(claimed_ids(&second), ids[2..]);
    assert_eq!(
        (second.tasks[0].attempt, second.tasks[0].lease_epoch),
        (1, 1)
    );
    assert!(claim(&d, &mut c1, &req("q", &a, 10)).await.tasks.is_empty());
    assert!(claim(&d, &mut c2, &req("q", &a, 10)).await.tasks.is_empty());
    for (id, worker) in [(ids[0], W), (ids[1], W), (ids[2], "w2")] {
        let t = get(&d, id).await;
        assert_eq!(t.state, TaskState::Running);
        assert_eq!((t.attempt, t.lease_epoch), (1, 1));
        assert_eq!(t.worker_id.as_deref(), Some(worker));
    }
}

/// A claim that finds a due task past its deadline does not start it: the task ends
/// `expired` in the claim (finished, attempt and epoch unchanged), reported in
/// `ClaimBatch::expired` with how late it was, and counts towards the limit; a task whose
/// deadline is later starts as usual.
pub async fn a_claim_expires_a_task_past_its_deadline_without_starting_it<D: Driver>(d: D) {
    let mut c = conn(&d).await;
    let now0 = ms(now::<D>(&mut c).await);
    let late = insert::<D>(
        &mut c,
        NewTask {
            run_at: Some(now0 - TimeDelta::seconds(20)),
            deadline: Some(now0 - TimeDelta::seconds(10)),
            ..task("q", "a")
        },
    )
    .await;
    let live = insert::<D>(
        &mut c,
        NewTask {
            ttl_us: Some(HOUR_US),
            ..task("q", "a")
        },
    )
    .await;
    let _third = insert::<D>(&mut c, task("q", "a")).await;
    let a = names(&["a"]);
    let got = claim(&d, &mut c, &req("q", &a, 2)).await;
    assert_eq!(
        claimed_ids(&got),
        vec![live],
        "the expired one counts towards 2"
    );
    assert_eq!(got.expired.len(), 1);
    assert_eq!(
        (got.expired[0].id, got.expired[0].name.as_str()),
        (late.0, "a")
    );
    assert!(
        (9_000_000..600_000_000).contains(&got.expired[0].late_us),
        "{} µs late",
        got.expired[0].late_us
    );
    let r = get(&d, late).await;
    assert_eq!(r.state, TaskState::Expired);
    assert_eq!((r.attempt, r.lease_epoch, r.lease_until), (0, 0, None));
    assert_eq!(r.attempted_at, None, "never started");
    assert!(r.finished_at.is_some());
    assert!(history(&d, late).await.is_empty(), "no attempt ran");
}
