//! Work under a lease (`Leases`): heartbeat, leases held, write-back, release, and the reap
//! of expired leases, each conditional on the lease epoch.

use chrono::{DateTime, TimeDelta, Utc};
use serde_json::Value;
use taskq_driver::driver::Driver;
use taskq_driver::read::TaskInfo;
use taskq_driver::rows::{FollowUpRow, NewTask, TaskFilter, WriteBack};
use taskq_driver::state::{TaskId, TaskState};

use crate::support::*;

/// The fields a fenced statement must leave as they were.
type Snapshot = (
    TaskState,
    u32,
    u64,
    Option<DateTime<Utc>>,
    DateTime<Utc>,
    DateTime<Utc>,
    Option<DateTime<Utc>>,
    Option<String>,
    u32,
);

/// The fields of `t` a fenced statement must leave as they were.
fn snapshot(t: &TaskInfo) -> Snapshot {
    (
        t.state,
        t.attempt,
        t.lease_epoch,
        t.lease_until,
        t.run_at,
        t.updated_at,
        t.finished_at,
        t.last_error.clone(),
        t.snoozes,
    )
}

/// A heartbeat renews exactly the leases it names that are still held under their epoch
/// (running, unexpired, no cancel request) to `now + lease` and returns how many: not a lease
/// under a stale or future epoch, not a pending task, not an expired lease, not one asked to
/// cancel. `task_leases_held` reports the leases still held, each with whether a cancel was
/// requested; `task_epochs` the current epoch of each existing id.
pub async fn heartbeat_renews_exactly_the_leases_sent_under_their_epoch<D: Driver>(d: D) {
    let mut c = conn(&d).await;
    let a = insert::<D>(&mut c, task("q", "a")).await;
    let b = insert::<D>(&mut c, task("q", "a")).await;
    let pending = insert::<D>(&mut c, task("q", "p")).await;
    let an = names(&["a"]);
    assert_eq!(
        claimed_ids(&claim(&d, &mut c, &req("q", &an, 2)).await),
        vec![a, b]
    );
    let before_a = get(&d, a).await;

    let renewed = d
        .task_heartbeat(
            &mut c,
            &leases(&[(a, 1), (b, 1), (b, 7), (pending, 0)]),
            2 * LEASE_US,
        )
        .await
        .expect("task_heartbeat");
    assert_eq!(renewed, 2, "{}: a and b under epoch 1", backend::<D>());
    let after_a = get(&d, a).await;
    assert_eq!(
        after_a.lease_until,
        Some(after_a.updated_at + micros(2 * LEASE_US)),
        "renewed to now + lease"
    );
    assert!(after_a.lease_until > before_a.lease_until);
    assert_eq!(get(&d, pending).await.state, TaskState::Pending);

    // A stale epoch is not renewed, and changes nothing.
    let snap = snapshot(&get(&d, a).await);
    assert_eq!(
        d.task_heartbeat(&mut c, &leases(&[(a, 0), (a, 2)]), 3 * LEASE_US)
            .await
            .expect("task_heartbeat"),
        0
    );
    assert_eq!(snapshot(&get(&d, a).await), snap);

    // A lease asked to cancel is no longer renewed, and is reported held with the request.
    assert!(
        d.task_request_cancel(&mut c, b)
            .await
            .expect("task_request_cancel")
    );
    assert_eq!(
        d.task_heartbeat(&mut c, &leases(&[(a, 1), (b, 1)]), LEASE_US)
            .await
            .expect("task_heartbeat"),
        1
    );
    let mut held = d
        .task_leases_held(&mut c, &leases(&[(a, 1), (b, 1), (a, 2), (pending, 0)]))
        .await
        .expect("task_leases_held");
    held.sort_unstable();
    assert_eq!(held, vec![(a.0, 1, false), (b.0, 1, true)]);

    // An expired lease is neither renewed nor held.
    let short = insert::<D>(&mut c, task("q", "s")).await;
    claim_one(&d, &mut c, "q", "s", SHORT_LEASE_US, short).await;
    wait_lease_expired(&d, &mut c, short).await;
    let snap = snapshot(&get(&d, short).await);
    assert_eq!(
        d.task_heartbeat(&mut c, &leases(&[(short, 1)]), LEASE_US)
            .await
            .expect("task_heartbeat"),
        0
    );
    assert_eq!(snapshot(&get(&d, short).await), snap);
    assert!(
        d.task_leases_held(&mut c, &leases(&[(short, 1)]))
            .await
            .expect("task_leases_held")
            .is_empty()
    );

    let ids = [a.0, b.0, short.0, pending.0, pending.0 + 1_000];
    let mut epochs = d.task_epochs(&mut c, &ids).await.expect("task_epochs");
    epochs.sort_unstable();
    assert_eq!(
        epochs,
        vec![(a.0, 1), (b.0, 1), (pending.0, 0), (short.0, 1)],
        "every existing id with its epoch"
    );
}

/// A write-back under the attempt's epoch writes its outcome: `succeeded` and `dead` finish
/// the task, `pending` (a retry) makes it due again after its delay keeping the attempt
/// counted, `snoozed` makes it due after its delay giving the attempt back (`snoozes` + 1),
/// `canceled` finishes it; the error, if any, is the task's `last_error`. A write-back under a
/// stale epoch, or of an attempt already written, is fenced: `written` does not count it and
/// the row does not change. `WrittenBack` reports what was written; nothing is deferred.
pub async fn write_back_under_the_epoch_writes_the_outcome_and_fences_a_stale_one<D: Driver>(d: D) {
    let mut c = conn(&d).await;
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(insert::<D>(&mut c, task("q", "a")).await);
    }
    let an = names(&["a"]);
    let got = claim(&d, &mut c, &req("q", &an, 5)).await;
    assert_eq!(claimed_ids(&got), ids);
    let t = &got.tasks;
    let batch = vec![
        outcome(&t[0], "succeeded", "succeeded"),
        WriteBack {
            delay_us: HOUR_US,
            error: Some("boom".into()),
            ..outcome(&t[1], "pending", "failed")
        },
        WriteBack {
            error: Some("fatal".into()),
            ..outcome(&t[2], "dead", "failed")
        },
        outcome(&t[3], "canceled", "canceled"),
        WriteBack {
            delay_us: HOUR_US,
            ..outcome(&t[4], "snoozed", "snoozed")
        },
        // The same task as the first, under a stale epoch: fenced.
        WriteBack {
            epoch: 0,
            ..outcome(&t[0], "dead", "failed")
        },
    ];
    let done = d
        .task_write_back(&mut c, &batch)
        .await
        .expect("task_write_back");
    assert_eq!(done.written, 5, "{}: {done:?}", backend::<D>());
    assert!(done.deferred.is_empty() && done.followed.is_empty());

    let ok = get(&d, ids[0]).await;
    assert_eq!(ok.state, TaskState::Succeeded, "not the stale dead");
    assert_eq!(ok.finished_at, Some(ok.updated_at));
    assert_eq!((ok.lease_until, ok.attempt, ok.lease_epoch), (None, 1, 1));
    assert_eq!(ok.last_error, None);
    let retry = get(&d, ids[1]).await;
    assert_eq!((retry.state, retry.attempt), (TaskState::Pending, 1));
    assert_eq!(retry.last_error.as_deref(), Some("boom"));
    assert_eq!((retry.finished_at, retry.lease_until), (None, None));
    assert_eq!(retry.run_at, retry.updated_at + TimeDelta::hours(1));
    let dead = get(&d, ids[2]).await;
    assert_eq!(dead.state, TaskState::Dead);
    assert_eq!(dead.last_error.as_deref(), Some("fatal"));
    assert_eq!(dead.finished_at, Some(dead.updated_at));
    let canceled = get(&d, ids[3]).await;
    assert_eq!(canceled.state, TaskState::Canceled);
    assert!(canceled.finished_at.is_some());
    let snoozed = get(&d, ids[4]).await;
    assert_eq!(
        (snoozed.state, snoozed.attempt, snoozed.snoozes),
        (TaskState::Pending, 0, 1),
        "a snooze gives its attempt back"
    );
    assert_eq!(snoozed.run_at, snoozed.updated_at + TimeDelta::hours(1));
    assert_eq!((snoozed.last_error, snoozed.finished_at), (None, None));

    // Written again (stale now: the rows left `running`): nothing changes.
    let before: Vec<_> = snapshots(&d, &ids).await;
    let again = d
        .task_write_back(&mut c, &batch)
        .await
        .expect("task_write_back");
    assert_eq!((again.written, again.followed.len()), (0, 0));
    assert_eq!(snapshots(&d, &ids).await, before);
    for id in &ids {
        assert_eq!(history(&d, *id).await.len(), 1, "task {id}: one entry");
    }

    // A running task under a wrong epoch (stale or future) is fenced.
    let live = insert::<D>(&mut c, task("q", "b")).await;
    let lt = claim_one(&d, &mut c, "q", "b", LEASE_US, live).await;
    let snap = snapshot(&get(&d, live).await);
    for epoch in [0, 2] {
        let stale = WriteBack {
            epoch,
            ..outcome(&lt, "succeeded", "succeeded")
        };
        let done = d
            .task_write_back(&mut c, &[stale])
            .await
            .expect("task_write_back");
        assert_eq!(done.written, 0, "epoch {epoch}");
    }
    assert_eq!(snapshot(&get(&d, live).await), snap);
    assert!(history(&d, live).await.is_empty());
}

/// The snapshots of `ids`.
async fn snapshots<D: Driver>(d: &D, ids: &[TaskId]) -> Vec<Snapshot> {
    let mut out = Vec::new();
    for id in ids {
        out.push(snapshot(&get(d, *id).await));
    }
    out
}

/// Every written outcome appends one entry to the task's attempt history: the attempt, its
/// epoch, the worker, when it started (the claim) and finished (the write-back) on the
/// database clock, the outcome and the error; a fenced write-back appends nothing. A retried
/// task's next attempt appends a second entry.
pub async fn the_attempt_history_records_each_written_outcome<D: Driver>(d: D) {
    let mut c = conn(&d).await;
    let outcomes: [(&'static str, &'static str); 7] = [
        ("succeeded", "succeeded"),
        ("pending", "failed"),
        ("dead", "failed"),
        ("canceled", "canceled"),
        ("snoozed", "snoozed"),
        ("pending", "timed_out"),
        ("pending", "panicked"),
    ];
    let mut ids = Vec::new();
    for _ in outcomes {
        ids.push(insert::<D>(&mut c, task("q", "a")).await);
    }
    assert_eq!(
        d.task_attempts(ids[0]).await.expect("task_attempts"),
        Some(None),
        "no history before an attempt ends"
    );
    let an = names(&["a"]);
    let got = claim(&d, &mut c, &req("q", &an, 10)).await;
    assert_eq!(claimed_ids(&got), ids);
    let batch: Vec<WriteBack> = got
        .tasks
        .iter()
        .zip(outcomes)
        .map(|(t, (state, o))| WriteBack {
            error: (o != "succeeded").then(|| format!("{o} error")),
            // Retries are due in an hour; the snooze at once.
            delay_us: if state == "pending" { HOUR_US } else { 0 },
            ..outcome(t, state, o)
        })
        .collect();
    assert_eq!(
        d.task_write_back(&mut c, &batch)
            .await
            .expect("task_write_back")
            .written,
        7
    );
    for (i, (_, o)) in outcomes.iter().enumerate() {
        let row = get(&d, ids[i]).await;
        let h = history(&d, ids[i]).await;
        assert_eq!(h.len(), 1, "{}: one entry for {o}", backend::<D>());
        let e = &h[0];
        assert_eq!(
            (&e["attempt"], &e["epoch"]),
            (&Value::from(1), &Value::from(1))
        );
        assert_eq!(e["worker"], W);
        assert_eq!(e["outcome"], *o);
        assert_eq!(e["started_at"], history_time(row.attempted_at.unwrap()));
        assert_eq!(e["finished_at"], history_time(row.updated_at));
        if *o == "succeeded" {
            assert!(e["error"].is_null());
        } else {
            assert_eq!(e["error"], format!("{o} error"));
        }
    }
    // Fenced: nothing appended.
    d.task_write_back(&mut c, &batch)
        .await
        .expect("task_write_back");
    for id in &ids {
        assert_eq!(history(&d, *id).await.len(), 1);
    }
    // The snoozed task (index 4) runs again with the same attempt number; the retries are
    // due in an hour.
    let again = claim(&d, &mut c, &req("q", &an, 10)).await;
    assert_eq!(claimed_ids(&again), vec![ids[4]]);
    let t = &again.tasks[0];
    assert_eq!((t.attempt, t.lease_epoch, t.snoozes), (1, 2, 1));
    d.task_write_back(&mut c, &[outcome(t, "succeeded", "succeeded")])
        .await
        .expect("task_write_back");
    let h = history(&d, ids[4]).await;
    let entries: Vec<(&Value, &Value, &Value)> = h
        .iter()
        .map(|e| (&e["attempt"], &e["epoch"], &e["outcome"]))
        .collect();
    assert_eq!(
        entries,
        vec![
            (&Value::from(1), &Value::from(1), &Value::from("snoozed")),
            (&Value::from(1), &Value::from(2), &Value::from("succeeded")),
        ]
    );
    let missing = TaskId(ids[6].0 + 1_000);
    assert_eq!(d.task_attempts(missing).await.expect("task_attempts"), None);
}

/// Release (shutdown) returns the leases it names that are held under their epoch to
/// pending: epoch + 1, the attempt not counted, no lease, no worker, `run_at` kept, a
/// `released` history entry; a stale epoch releases nothing. The next claim starts the same
/// attempt number under a new epoch.
pub async fn release_returns_held_leases_to_pending<D: Driver>(d: D) {
    let mut c = conn(&d).await;
    let due = ms(now::<D>(&mut c).await) - TimeDelta::seconds(30);
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(
            insert::<D>(
                &mut c,
                NewTask {
                    run_at: Some(due),
                    ..task("q", "a")
                },
            )
            .await,
        );
    }
    let an = names(&["a"]);
    claim(&d, &mut c, &req("q", &an, 3)).await;
    let (a, b, kept) = (ids[0], ids[1], ids[2]);
    assert_eq!(
        d.task_release(&mut c, &leases(&[(a, 0), (b, 2)]))
            .await
            .expect("task_release"),
        0,
        "wrong epochs"
    );
    assert_eq!(
        d.task_release(&mut c, &leases(&[(a, 1), (b, 1)]))
            .await
            .expect("task_release"),
        2
    );
    for id in [a, b] {
        let r = get(&d, id).await;
        assert_eq!(r.state, TaskState::Pending);
        assert_eq!((r.attempt, r.lease_epoch), (0, 2), "task {id}");
        assert_eq!((r.lease_until, r.worker_id), (None, None));
        assert_eq!(r.run_at, due, "run_at kept");
        assert_eq!(r.finished_at, None);
        let h = history(&d, id).await;
        assert_eq!(h.len(), 1);
        assert_eq!(h[0]["outcome"], "released");
        assert_eq!(
            (&h[0]["attempt"], &h[0]["epoch"]),
            (&Value::from(1), &Value::from(1))
        );
        assert!(h[0]["error"].is_null());
    }
    assert_eq!(get(&d, kept).await.state, TaskState::Running, "not named");
    // Released again under the old epoch: nothing.
    assert_eq!(
        d.task_release(&mut c, &leases(&[(a, 1)]))
            .await
            .expect("task_release"),
        0
    );
    assert_eq!(history(&d, a).await.len(), 1);
    let again = claim(&d, &mut c, &req("q", &an, 3)).await;
    assert_eq!(claimed_ids(&again), vec![a, b], "sorted where they were");
    assert!(
        again
            .tasks
            .iter()
            .all(|t| (t.attempt, t.lease_epoch) == (1, 3))
    );
}

/// An expired lease is listed by `task_lapsed` (with what the reap needs: epoch, attempts,
/// worker, whether the reader registers the name) and reaped by `task_reap` back to pending
/// while attempts remain: epoch + 1, the attempt counted, `run_at` kept (docs/semantics.md,
/// "Reaper": it sorts where it was), no lease, `last_error` and a `lease_lost` history entry
/// naming the worker. A live lease is not listed; a reap under a stale epoch, or repeated,
/// does nothing; the reaped attempt's write-back and heartbeat are fenced.
pub async fn an_expired_lease_is_reaped_back_to_pending_keeping_its_run_at<D: Driver>(d: D) {
    let mut c = conn(&d).await;
    let due = ms(now::<D>(&mut c).await) - TimeDelta::seconds(10);
    let a = insert::<D>(
        &mut c,
        NewTask {
            run_at: Some(due),
            payload: b"{\"x\":1}",
            trace_context: Some("00-reap"),
            ..task("q", "a")
        },
    )
    .await;
    let live = insert::<D>(&mut c, task("q", "b")).await;
    let ta = claim_one(&d, &mut c, "q", "a", SHORT_LEASE_US, a).await;
    claim_one(&d, &mut c, "q", "b", LEASE_US, live).await;
    wait_lease_expired(&d, &mut c, a).await;

    let rows = d
        .task_lapsed(&mut c, &names(&["a", "b"]), 100)
        .await
        .expect("task_lapsed");
    assert_eq!(rows.len(), 1, "{}: only the expired lease", backend::<D>());
    let r = &rows[0];
    assert_eq!((r.id, r.lease_epoch), (a.0, 1));
    assert_eq!((r.name.as_str(), r.queue.as_str()), ("a", "q"));
    assert_eq!((r.attempt, r.max_attempts), (1, 3));
    assert_eq!(r.worker_id.as_deref(), Some(W));
    assert_eq!((r.frees(), r.canceled, r.registered), (None, false, true));
    assert_eq!(r.payload, None, "read only for a task the reap buries");
    assert_eq!(r.trace_context.as_deref(), Some("00-reap"));
    assert!(!r.goes_dead() && !r.parks());

    // Under a stale epoch: nothing.
    let mut stale = reap_row(r);
    stale.epoch = 0;
    let snap = snapshot(&get(&d, a).await);
    let none = d
        .task_reap(&mut c, &[stale], true)
        .await
        .expect("task_reap");
    assert_eq!(
        (none.reaped, none.rows.len(), none.followed.len()),
        (0, 0, 0)
    );
    assert_eq!(snapshot(&get(&d, a).await), snap);

    let done = d
        .task_reap(&mut c, &[reap_row(r)], true)
        .await
        .expect("task_reap");
    assert_eq!(done.reaped, 1);
    assert_eq!(done.rows, vec![(a.0, TaskState::Pending)]);
    assert!(done.followed.is_empty());
    let t = get(&d, a).await;
    assert_eq!(t.state, TaskState::Pending);
    assert_eq!((t.attempt, t.lease_epoch), (1, 2));
    assert_eq!(t.run_at, due, "run_at kept");
    assert_eq!((t.lease_until, t.finished_at), (None, None));
    let error = format!("lease expired (worker {W}, attempt 1)");
    assert_eq!(t.last_error.as_deref(), Some(error.as_str()));
    let h = history(&d, a).await;
    assert_eq!(h.len(), 1);
    assert_eq!(h[0]["outcome"], "lease_lost");
    assert_eq!(
        (&h[0]["attempt"], &h[0]["epoch"]),
        (&Value::from(1), &Value::from(1))
    );
    assert_eq!(
        (&h[0]["worker"], &h[0]["error"]),
        (&Value::from(W), &Value::from(error))
    );

    // Reaped again: nothing; the old attempt is fenced.
    let again = d
        .task_reap(&mut c, &[reap_row(r)], true)
        .await
        .expect("task_reap");
    assert_eq!((again.reaped, again.rows.len()), (0, 0));
    let late = d
        .task_write_back(&mut c, &[outcome(&ta, "succeeded", "succeeded")])
        .await
        .expect("task_write_back");
    assert_eq!(late.written, 0);
    assert_eq!(
        d.task_heartbeat(&mut c, &leases(&[(a, 1)]), LEASE_US)
            .await
            .expect("task_heartbeat"),
        0
    );
    assert_eq!(get(&d, a).await.state, TaskState::Pending);
    assert!(
        d.task_lapsed(&mut c, &names(&["a", "b"]), 100)
            .await
            .expect("task_lapsed")
            .is_empty()
    );
    assert_eq!(
        get(&d, live).await.state,
        TaskState::Running,
        "live lease kept"
    );

    // Claimed again: the second attempt, a new epoch.
    let next = claim_one(&d, &mut c, "q", "a", SHORT_LEASE_US, a).await;
    assert_eq!((next.attempt, next.lease_epoch), (2, 3));

    // The same reap without `exact` still counts the row.
    wait_lease_expired(&d, &mut c, a).await;
    let rows = d
        .task_lapsed(&mut c, &names(&["a"]), 100)
        .await
        .expect("task_lapsed");
    assert_eq!(rows.len(), 1);
    let plain = d
        .task_reap(&mut c, &[reap_row(&rows[0])], false)
        .await
        .expect("task_reap");
    assert_eq!(plain.reaped, 1);
    // DRIVERS DIFFER: without `exact` (and no follow-up) `Reaped::rows` is documented as
    // empty; MySQL leaves it empty, SQLite fills it anyway (its reap always knows the rows).
    // Only its content is checked.
    assert!(plain.rows.iter().all(|r| *r == (a.0, TaskState::Pending)));
    assert_eq!(
        (get(&d, a).await.attempt, get(&d, a).await.lease_epoch),
        (2, 4)
    );
}

/// An expired lease on its last attempt is reaped to `dead` (finished, epoch + 1) when the
/// reading worker registers the task's name (`task_lapsed` then reads its payload for the
/// `on_dead` follow-up); a worker that does not register the name parks it back to pending
/// instead, and the next claim hands it over with `parked_error` (the reap's error) for the
/// worker to bury without running it.
pub async fn a_reap_buries_a_last_attempt_or_parks_it_for_a_worker_that_knows_its_name<
    D: Driver,
>(
    d: D,
) {
    let mut c = conn(&d).await;
    let last = |name| NewTask {
        max_attempts: 1,
        payload: b"{\"last\":true}",
        ..task("q", name)
    };
    let a = insert::<D>(&mut c, last("a")).await;
    let b = insert::<D>(&mut c, last("b")).await;
    let both = names(&["a", "b"]);
    assert_eq!(
        claimed_ids(
            &claim(
                &d,
                &mut c,
                &taskq_driver::rows::ClaimRequest {
                    lease_us: SHORT_LEASE_US,
                    ..req("q", &both, 2)
                }
            )
            .await
        ),
        vec![a, b]
    );
    wait_lease_expired(&d, &mut c, a).await;
    wait_lease_expired(&d, &mut c, b).await;
    // The reader registers `a` only.
    let mut rows = d
        .task_lapsed(&mut c, &names(&["a"]), 100)
        .await
        .expect("task_lapsed");
    rows.sort_by_key(|r| r.id);
    assert_eq!(rows.len(), 2);
    let (ra, rb) = (&rows[0], &rows[1]);
    assert_eq!(
        (ra.id, ra.registered, ra.goes_dead(), ra.parks()),
        (a.0, true, true, false)
    );
    assert_eq!(ra.payload.as_deref(), Some(&b"{\"last\":true}"[..]));
    assert_eq!(
        (rb.id, rb.registered, rb.goes_dead(), rb.parks()),
        (b.0, false, false, true)
    );
    assert_eq!(rb.payload, None);

    let plan: Vec<_> = rows.iter().map(reap_row).collect();
    let mut done = d.task_reap(&mut c, &plan, true).await.expect("task_reap");
    done.rows.sort_unstable_by_key(|r| r.0);
    assert_eq!(done.reaped, 2);
    assert_eq!(
        done.rows,
        vec![(a.0, TaskState::Dead), (b.0, TaskState::Pending)],
        "{}",
        backend::<D>()
    );
    let error = format!("lease expired (worker {W}, attempt 1)");
    let ta = get(&d, a).await;
    assert_eq!(
        (ta.state, ta.attempt, ta.lease_epoch),
        (TaskState::Dead, 1, 2)
    );
    assert!(ta.finished_at.is_some());
    assert_eq!(ta.last_error.as_deref(), Some(error.as_str()));
    assert_eq!(history(&d, a).await[0]["outcome"], "lease_lost");
    let tb = get(&d, b).await;
    assert_eq!(
        (tb.state, tb.attempt, tb.lease_epoch),
        (TaskState::Pending, 1, 2)
    );
    assert_eq!(tb.finished_at, None, "parked, not finished");

    let parked = claim_one(&d, &mut c, "q", "b", LEASE_US, b).await;
    assert_eq!(
        (parked.attempt, parked.max_attempts, parked.lease_epoch),
        (2, 1, 3)
    );
    assert_eq!(parked.parked_error.as_deref(), Some(error.as_str()));
    // The worker buries it without running it (a write-back of attempt 1, no entry).
    let bury = WriteBack {
        attempt: 1,
        outcome: "",
        error: Some(error.clone()),
        ..outcome(&parked, "dead", "")
    };
    assert_eq!(
        d.task_write_back(&mut c, &[bury])
            .await
            .expect("task_write_back")
            .written,
        1
    );
    let tb = get(&d, b).await;
    assert_eq!(
        (tb.state, tb.attempt),
        (TaskState::Dead, 1),
        "attempt set back"
    );
    assert_eq!(history(&d, b).await.len(), 1, "no entry for the burial");
}

/// An expired lease carrying a cancel request is reaped to `canceled` (finished, epoch + 1,
/// a `canceled` history entry), never back to pending, whatever attempts remain; the old
/// attempt's write-back is then fenced.
pub async fn an_expired_lease_asked_to_cancel_is_reaped_to_canceled<D: Driver>(d: D) {
    let mut c = conn(&d).await;
    let a = insert::<D>(&mut c, task("q", "a")).await;
    let ta = claim_one(&d, &mut c, "q", "a", SHORT_LEASE_US, a).await;
    assert!(
        d.task_request_cancel(&mut c, a)
            .await
            .expect("task_request_cancel")
    );
    wait_lease_expired(&d, &mut c, a).await;
    let rows = d
        .task_lapsed(&mut c, &names(&["a"]), 100)
        .await
        .expect("task_lapsed");
    assert_eq!(rows.len(), 1);
    assert!(rows[0].canceled && !rows[0].goes_dead() && !rows[0].parks());
    assert_eq!(rows[0].payload, None);
    let done = d
        .task_reap(&mut c, &[reap_row(&rows[0])], true)
        .await
        .expect("task_reap");
    assert_eq!(done.rows, vec![(a.0, TaskState::Canceled)]);
    let t = get(&d, a).await;
    assert_eq!(
        (t.state, t.attempt, t.lease_epoch),
        (TaskState::Canceled, 1, 2)
    );
    assert!(t.finished_at.is_some());
    let h = history(&d, a).await;
    assert_eq!(h.len(), 1);
    assert_eq!(h[0]["outcome"], "canceled");
    let late = d
        .task_write_back(&mut c, &[outcome(&ta, "succeeded", "succeeded")])
        .await
        .expect("task_write_back");
    assert_eq!(late.written, 0);
    assert_eq!(get(&d, a).await.state, TaskState::Canceled);
}

fn follow_up(key: String) -> Box<FollowUpRow> {
    Box::new(FollowUpRow {
        queue: "fq",
        name: "then",
        payload: vec![0, 159, b'{', 255],
        priority: -3,
        max_attempts: 7,
        ttl_us: Some(60_000_000),
        key,
        trace_context: Some("00-follow".into()),
    })
}

/// A follow-up (`on_success` / `on_dead`) is inserted in the transaction that writes the end
/// it follows, exactly when that end is written: by a write-back under the right epoch (not a
/// fenced one) and by a reap to dead; `followed` names those ends. The follow-up is pending,
/// due now, with its payload, priority, attempts, deadline (ttl from now), key and trace
/// context.
pub async fn a_follow_up_is_inserted_with_the_end_it_follows_and_never_for_a_fenced_one<
    D: Driver,
>(
    d: D,
) {
    let mut c = conn(&d).await;
    let a = insert::<D>(&mut c, task("q", "a")).await;
    let b = insert::<D>(&mut c, task("q", "a")).await;
    let an = names(&["a"]);
    let got = claim(&d, &mut c, &req("q", &an, 2)).await;
    let (ta, tb) = (&got.tasks[0], &got.tasks[1]);
    let batch = vec![
        WriteBack {
            follow_up: Some(follow_up(format!("taskq:on_success:{a}:1"))),
            ..outcome(ta, "succeeded", "succeeded")
        },
        WriteBack {
            epoch: 0,
            follow_up: Some(follow_up(format!("taskq:on_dead:{b}:0"))),
            ..outcome(tb, "dead", "failed")
        },
    ];
    let done = d
        .task_write_back(&mut c, &batch)
        .await
        .expect("task_write_back");
    assert_eq!(done.written, 1);
    assert_eq!(done.followed, vec![a.0], "{}", backend::<D>());
    let fq = TaskFilter {
        queue: Some("fq"),
        ..TaskFilter::default()
    };
    let made = d
        .task_list(&fq, 0, u64::MAX >> 1, 10)
        .await
        .expect("task_list");
    assert_eq!(made.len(), 1, "one follow-up: not the fenced one's");
    let f = &made[0];
    assert_eq!((f.name.as_str(), f.state), ("then", TaskState::Pending));
    assert_eq!(f.payload, [0, 159, b'{', 255]);
    assert_eq!((f.priority, f.max_attempts), (-3, 7));
    let key = format!("taskq:on_success:{a}:1");
    assert_eq!(f.idempotency_key.as_deref(), Some(key.as_str()));
    assert_eq!(f.trace_context.as_deref(), Some("00-follow"));
    assert_eq!(f.run_at, f.created_at);
    assert_eq!(f.deadline, Some(f.created_at + TimeDelta::seconds(60)));
    // The same batch again: the ends are written, nothing more is inserted.
    let again = d
        .task_write_back(&mut c, &batch)
        .await
        .expect("task_write_back");
    assert_eq!((again.written, again.followed.len()), (0, 0));
    assert_eq!(d.task_count(&fq).await.expect("task_count"), 1);

    // A reap to dead inserts its follow-up; a reap to pending does not.
    d.task_write_back(&mut c, &[outcome(tb, "succeeded", "succeeded")])
        .await
        .expect("task_write_back");
    let last = insert::<D>(
        &mut c,
        NewTask {
            max_attempts: 1,
            ..task("q", "c")
        },
    )
    .await;
    let more = insert::<D>(&mut c, task("q", "c")).await;
    let cn = names(&["c"]);
    claim(
        &d,
        &mut c,
        &taskq_driver::rows::ClaimRequest {
            lease_us: SHORT_LEASE_US,
            ..req("q", &cn, 2)
        },
    )
    .await;
    wait_lease_expired(&d, &mut c, last).await;
    wait_lease_expired(&d, &mut c, more).await;
    let rows = d.task_lapsed(&mut c, &cn, 100).await.expect("task_lapsed");
    assert_eq!(rows.len(), 2);
    let plan: Vec<_> = rows
        .iter()
        .map(|r| taskq_driver::rows::ReapRow {
            follow_up: Some(follow_up(format!(
                "taskq:on_dead:{}:{}",
                r.id, r.lease_epoch
            ))),
            ..reap_row(r)
        })
        .collect();
    let mut reaped = d.task_reap(&mut c, &plan, false).await.expect("task_reap");
    reaped.rows.sort_unstable_by_key(|r| r.0);
    assert_eq!(reaped.reaped, 2);
    assert_eq!(reaped.followed, vec![last.0], "only the one reaped to dead");
    assert_eq!(
        reaped.rows,
        vec![(last.0, TaskState::Dead), (more.0, TaskState::Pending)]
    );
    assert_eq!(d.task_count(&fq).await.expect("task_count"), 2);
    let key = format!("taskq:on_dead:{last}:1");
    let made = d
        .task_list(&fq, 0, u64::MAX >> 1, 10)
        .await
        .expect("task_list");
    assert_eq!(made[1].idempotency_key.as_deref(), Some(key.as_str()));
}
