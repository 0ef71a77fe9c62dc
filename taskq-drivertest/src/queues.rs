//! Queue controls (`Queues`): pause, concurrency and rate limits, the queue list; and the
//! limited claim that honours the limits.

use chrono::TimeDelta;
use taskq_driver::driver::Driver;
use taskq_driver::rows::NameList;
use taskq_driver::rows::{ClaimRequest, LimitHit, NewTask, QueueControl, WriteBack};
use taskq_driver::state::TaskState;

use crate::support::*;

fn controls(mut v: Vec<QueueControl>) -> Vec<(String, bool, bool)> {
    v.sort_by(|a, b| a.queue.cmp(&b.queue));
    v.into_iter()
        .map(|q| (q.queue, q.paused, q.limited))
        .collect()
}

/// A pause is recorded with its time on the database clock (a second pause keeps the first
/// time), listed by `queues_paused` and `queue_controls`; `queue_resume` clears it and
/// returns whether the queue was paused. A claim of a paused queue takes nothing: the SQLite
/// claim checks the pause inside its statement; a driver whose claims see the controls
/// (`Handle::claims_see_controls`, MySQL) also says so (`ClaimBatch::queue_controlled`), so the
/// worker reads them (docs/semantics.md, "Pausing a queue").
pub async fn a_pause_is_recorded_listed_and_resumed<D: Driver>(d: D) {
    let mut c = conn(&d).await;
    let a = insert::<D>(&mut c, task("q", "a")).await;
    let before = now::<D>(&mut c).await;
    d.queue_pause(&mut c, "q").await.expect("queue_pause");
    let after = now::<D>(&mut c).await;
    let paused = d.queues_paused(&mut c).await.expect("queues_paused");
    assert_eq!(paused.len(), 1);
    assert_eq!(paused[0].0, "q");
    let at = paused[0].1;
    assert!(before <= at && at <= after, "{at} on the database clock");
    wait_clock_past::<D>(&mut c, at).await;
    d.queue_pause(&mut c, "q").await.expect("queue_pause");
    assert_eq!(
        d.queues_paused(&mut c).await.expect("queues_paused"),
        vec![("q".to_string(), at)],
        "a second pause keeps the first time"
    );
    assert_eq!(
        controls(d.queue_controls(&mut c).await.expect("queue_controls")),
        vec![("q".to_string(), true, false)]
    );
    let listed = d.queue_list().await.expect("queue_list");
    assert_eq!(listed.len(), 1);
    assert_eq!(
        (listed[0].queue.as_str(), listed[0].paused_at),
        ("q", Some(at))
    );
    assert_eq!((listed[0].pending, listed[0].running), (1, 0));

    let got = claim(&d, &mut c, &req("q", &names(&["a"]), 10)).await;
    assert!(
        got.tasks.is_empty(),
        "{}: a paused queue is not claimed",
        backend::<D>()
    );
    assert_eq!(get(&d, a).await.state, TaskState::Pending);
    assert_eq!(
        got.queue_controlled,
        d.claims_see_controls(),
        "{}: a driver whose claims see the controls says the queue is controlled",
        backend::<D>()
    );

    assert!(d.queue_resume(&mut c, "q").await.expect("queue_resume"));
    assert!(
        !d.queue_resume(&mut c, "q").await.expect("queue_resume"),
        "no longer paused"
    );
    assert!(
        !d.queue_resume(&mut c, "never").await.expect("queue_resume"),
        "never paused"
    );
    assert!(
        d.queues_paused(&mut c)
            .await
            .expect("queues_paused")
            .is_empty()
    );
    assert!(
        d.queue_controls(&mut c)
            .await
            .expect("queue_controls")
            .is_empty()
    );
    let got = claim(&d, &mut c, &req("q", &names(&["a"]), 10)).await;
    assert_eq!(claimed_ids(&got), vec![a], "resumed: claimed");
}

/// Concurrency and rate limits are set, listed (`queue_controls` marks the queue limited;
/// `queue_list` shows the limits, what the rate window used, and the pending and running
/// counts of every queue with tasks or controls, by name) and cleared (the queue's row
/// stays, without limits; clearing a queue that has no row writes nothing).
pub async fn queue_limits_are_set_listed_and_cleared<D: Driver>(d: D) {
    let mut c = conn(&d).await;
    let run = insert::<D>(&mut c, task("busy", "a")).await;
    insert::<D>(&mut c, task("busy", "a")).await;
    claim_one(&d, &mut c, "busy", "a", LEASE_US, run).await;
    d.queue_set_limit(&mut c, "lim", Some(2))
        .await
        .expect("queue_set_limit");
    d.queue_set_rate_limit(&mut c, "rate", Some((10, 60_000_000)))
        .await
        .expect("queue_set_rate_limit");
    d.queue_pause(&mut c, "paused").await.expect("queue_pause");
    d.queue_set_limit(&mut c, "nothing", None)
        .await
        .expect("queue_set_limit");
    d.queue_set_rate_limit(&mut c, "nothing", None)
        .await
        .expect("queue_set_rate_limit");
    assert_eq!(
        controls(d.queue_controls(&mut c).await.expect("queue_controls")),
        vec![
            ("lim".to_string(), false, true),
            ("paused".to_string(), true, false),
            ("rate".to_string(), false, true),
        ]
    );
    let list = d.queue_list().await.expect("queue_list");
    let names: Vec<&str> = list.iter().map(|q| q.queue.as_str()).collect();
    assert_eq!(
        names,
        vec!["busy", "lim", "paused", "rate"],
        "{}",
        backend::<D>()
    );
    assert_eq!((list[0].pending, list[0].running), (1, 1));
    assert_eq!(
        (list[0].concurrency_limit, list[0].rate, list[0].paused_at),
        (None, None, None)
    );
    assert_eq!((list[1].concurrency_limit, list[1].rate), (Some(2), None));
    assert!(list[2].paused_at.is_some());
    assert_eq!(
        (list[3].rate, list[3].rate_used),
        (Some((10, 60_000_000)), 0)
    );
    assert_eq!(list[3].concurrency_limit, None);
    // Changed.
    d.queue_set_limit(&mut c, "lim", Some(5))
        .await
        .expect("queue_set_limit");
    assert_eq!(
        d.queue_list().await.expect("queue_list")[1].concurrency_limit,
        Some(5)
    );

    d.queue_set_limit(&mut c, "lim", None)
        .await
        .expect("queue_set_limit");
    d.queue_set_rate_limit(&mut c, "rate", None)
        .await
        .expect("queue_set_rate_limit");
    assert_eq!(
        controls(d.queue_controls(&mut c).await.expect("queue_controls")),
        vec![("paused".to_string(), true, false)]
    );
    let list = d.queue_list().await.expect("queue_list");
    assert_eq!(list.len(), 4, "rows stay");
    assert!(
        list.iter()
            .all(|q| q.concurrency_limit.is_none() && q.rate.is_none())
    );
}

fn limited<'a>(queue: &'a str, names: &'a NameList, limit: u32) -> ClaimRequest<'a> {
    ClaimRequest {
        limited: true,
        ..req(queue, names, limit)
    }
}

/// A limited claim of a queue with a concurrency limit takes no more than the limit minus
/// its running tasks and says so (`LimitHit { allowed, rate_resets_in_us: None }`); once a
/// task ends there is room for one more. A claim not flagged `limited` does not read limits.
pub async fn a_limited_claim_honours_the_concurrency_limit<D: Driver>(d: D) {
    let mut c = conn(&d).await;
    let mut ids = Vec::new();
    for _ in 0..6 {
        ids.push(insert::<D>(&mut c, task("lim", "a")).await);
    }
    d.queue_set_limit(&mut c, "lim", Some(2))
        .await
        .expect("queue_set_limit");
    let an = names(&["a"]);
    let got = claim(&d, &mut c, &limited("lim", &an, 5)).await;
    assert_eq!(claimed_ids(&got), ids[..2], "{}", backend::<D>());
    assert_eq!(
        got.limited,
        Some(LimitHit {
            allowed: 2,
            rate_resets_in_us: None
        })
    );
    let full = claim(&d, &mut c, &limited("lim", &an, 5)).await;
    assert!(full.tasks.is_empty());
    assert_eq!(full.limited.map(|h| h.allowed), Some(0));
    d.task_write_back(&mut c, &[outcome(&got.tasks[0], "succeeded", "succeeded")])
        .await
        .expect("task_write_back");
    let one = claim(&d, &mut c, &limited("lim", &an, 5)).await;
    assert_eq!(claimed_ids(&one), ids[2..3]);
    assert_eq!(one.limited.map(|h| h.allowed), Some(1));
    // Within the limit: no hit.
    d.queue_set_limit(&mut c, "lim", Some(10))
        .await
        .expect("queue_set_limit");
    let within = claim(&d, &mut c, &limited("lim", &an, 1)).await;
    assert_eq!(claimed_ids(&within), ids[3..4]);
    assert!(within.limited.is_none());
    // Unflagged: the limits are not read. A driver whose claims see the controls claims
    // nothing and says the queue is controlled (the worker then reads the controls and claims
    // as limited); the others take the tasks.
    d.queue_set_limit(&mut c, "lim", Some(1))
        .await
        .expect("queue_set_limit");
    let unflagged = claim(&d, &mut c, &req("lim", &an, 5)).await;
    if d.claims_see_controls() {
        assert!(unflagged.tasks.is_empty(), "{}", backend::<D>());
        assert!(unflagged.queue_controlled);
        assert_eq!(
            claim(&d, &mut c, &limited("lim", &an, 5)).await.limited,
            Some(LimitHit {
                allowed: 0,
                rate_resets_in_us: None
            }),
            "claimed as limited: 3 running, the limit 1"
        );
        d.queue_set_limit(&mut c, "lim", None)
            .await
            .expect("queue_set_limit");
    }
    let free = if d.claims_see_controls() {
        claim(&d, &mut c, &req("lim", &an, 5)).await
    } else {
        unflagged
    };
    assert_eq!(claimed_ids(&free), ids[4..]);
    assert!(free.limited.is_none() && !free.queue_controlled);
    let list = d.queue_list().await.expect("queue_list");
    assert_eq!((list[0].queue.as_str(), list[0].running), ("lim", 5));
    // A queue flagged limited without a row has no limits.
    let free = insert::<D>(&mut c, task("norow", "a")).await;
    let got = claim(&d, &mut c, &limited("norow", &an, 5)).await;
    assert_eq!(claimed_ids(&got), vec![free]);
    assert!(got.limited.is_none());
}

/// A task a limited claim finds past its deadline (and moves to `expired`) is no start for
/// either limit (docs/semantics.md, "Queue limits"): it counts towards the claim's own
/// limit, but not in the rate window, and not as running.
pub async fn a_task_a_limited_claim_expires_is_no_start<D: Driver>(d: D) {
    let mut c = conn(&d).await;
    let past = ms(now::<D>(&mut c).await) - TimeDelta::seconds(10);
    let late = insert::<D>(
        &mut c,
        NewTask {
            run_at: Some(past - TimeDelta::seconds(1)),
            deadline: Some(past),
            ..task("rate", "a")
        },
    )
    .await;
    let mut live = Vec::new();
    for _ in 0..3 {
        live.push(insert::<D>(&mut c, task("rate", "a")).await);
    }
    let period: i64 = 10 * 365 * 24 * HOUR_US;
    d.queue_set_rate_limit(&mut c, "rate", Some((2, period)))
        .await
        .expect("queue_set_rate_limit");
    let an = names(&["a"]);
    let got = claim(&d, &mut c, &limited("rate", &an, 5)).await;
    assert_eq!(got.expired.len(), 1);
    assert_eq!(got.expired[0].id, late.0);
    assert_eq!(
        claimed_ids(&got),
        live[..1],
        "{}: the expired one took a place",
        backend::<D>()
    );
    assert_eq!(got.limited.map(|h| h.allowed), Some(2));
    assert_eq!(
        d.queue_list().await.expect("queue_list")[0].rate_used,
        1,
        "one start"
    );
    let next = claim(&d, &mut c, &limited("rate", &an, 5)).await;
    assert_eq!(
        claimed_ids(&next),
        live[1..2],
        "the second start of the window"
    );
    assert_eq!(next.limited.map(|h| h.allowed), Some(1));
    assert_eq!(d.queue_list().await.expect("queue_list")[0].rate_used, 2);
    assert!(
        claim(&d, &mut c, &limited("rate", &an, 5))
            .await
            .tasks
            .is_empty()
    );
}

/// A limited claim of a queue with a rate limit starts no more than the limit per window
/// (windows are multiples of the period on the database clock) and says when the next window
/// opens (`rate_resets_in_us`); a claim asking for less than the window has left is no hit
/// (`limited: None`). `queue_list` shows what the window used. Tasks that end do
/// not give starts back.
pub async fn a_limited_claim_honours_the_rate_limit<D: Driver>(d: D) {
    let mut c = conn(&d).await;
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(insert::<D>(&mut c, task("rate", "a")).await);
    }
    // A window of ten years (the next boundary is 2030-01-01): it does not turn during the
    // test.
    let period: i64 = 10 * 365 * 24 * HOUR_US;
    d.queue_set_rate_limit(&mut c, "rate", Some((3, period)))
        .await
        .expect("queue_set_rate_limit");
    let an = names(&["a"]);
    // Asking for less than the window has left: no hit.
    let first = claim(&d, &mut c, &limited("rate", &an, 2)).await;
    assert_eq!(claimed_ids(&first), ids[..2], "{}", backend::<D>());
    assert_eq!(first.limited, None, "the rate allows more than asked");
    let got = claim(&d, &mut c, &limited("rate", &an, 5)).await;
    assert_eq!(claimed_ids(&got), ids[2..3], "{}", backend::<D>());
    let hit = got.limited.expect("the rate limit binds");
    assert_eq!(hit.allowed, 1);
    let resets = hit.rate_resets_in_us.expect("the rate binds");
    assert!(0 < resets && resets <= period, "{resets}");
    let list = d.queue_list().await.expect("queue_list");
    assert_eq!((list[0].rate, list[0].rate_used), (Some((3, period)), 3));
    let batch: Vec<WriteBack> = first
        .tasks
        .iter()
        .chain(&got.tasks)
        .map(|t| outcome(t, "succeeded", "succeeded"))
        .collect();
    d.task_write_back(&mut c, &batch)
        .await
        .expect("task_write_back");
    let none = claim(&d, &mut c, &limited("rate", &an, 5)).await;
    assert!(none.tasks.is_empty(), "the window is used up");
    assert_eq!(none.limited.map(|h| h.allowed), Some(0));
    for id in &ids[3..] {
        assert_eq!(get(&d, *id).await.state, TaskState::Pending);
    }
    // A larger limit lets the window's rest through.
    d.queue_set_rate_limit(&mut c, "rate", Some((4, period)))
        .await
        .expect("queue_set_rate_limit");
    let more = claim(&d, &mut c, &limited("rate", &an, 5)).await;
    assert_eq!(claimed_ids(&more), ids[3..4]);
    assert_eq!(d.queue_list().await.expect("queue_list")[0].rate_used, 4);
}
