//! Batches: members counted in their batch's row as they end (by the write-back that ends
//! them, or by the sweep), callbacks released once by the count that completes the batch, an
//! open batch waiting for its seal, cancel and retention, the same way on every driver
//! (docs/workflows.md, "Batches").

use sqlx::Connection;
use taskq_driver::driver::Driver;
use taskq_driver::rows::{BatchAdded, BatchInserted, BatchRow, NewBatch, NewTask, RetryDead};
use taskq_driver::rules::batch::{AddRefused, CANCELED_BY_BATCH};
use taskq_driver::state::{TaskId, TaskState};

use crate::support::*;

const Q: &str = "batch";

async fn insert_batch<D: Driver>(
    c: &mut D::Conn,
    name: &str,
    members: &[NewTask<'_>],
    callbacks: bool,
    sealed: bool,
) -> BatchInserted {
    D::batch_insert(
        c,
        &NewBatch {
            name,
            members,
            on_success: callbacks.then(|| task(Q, "on_success")),
            on_complete: callbacks.then(|| task(Q, "on_complete")),
            sealed,
        },
    )
    .await
    .expect("batch_insert")
}

async fn row<D: Driver>(d: &D, id: u64) -> BatchRow {
    d.batch_get(id).await.unwrap().expect("the batch")
}

fn progress(b: &BatchRow) -> (u64, u64, u64) {
    (b.total, b.succeeded, b.failed)
}

/// Claims member `id` (task name `name`) and writes back `state`; the callbacks the write-back
/// released.
async fn end<D: Driver>(
    d: &D,
    c: &mut D::Conn,
    name: &str,
    id: TaskId,
    state: &'static str,
) -> Vec<TaskId> {
    let t = claim_one(d, c, Q, name, LEASE_US, id).await;
    assert!(
        t.batch_id.is_some(),
        "{}: the claim reads the batch",
        backend::<D>()
    );
    let o = match state {
        "succeeded" => "succeeded",
        "canceled" => "canceled",
        _ => "failed",
    };
    let done = d
        .task_write_back(c, &[outcome(&t, state, o)])
        .await
        .expect("task_write_back");
    assert_eq!(done.written, 1, "{}: {name} written", backend::<D>());
    let mut r: Vec<TaskId> = done.counted.released.iter().map(|(t, _)| *t).collect();
    r.sort();
    r
}

fn members<'a>(names: &[&'a str]) -> Vec<NewTask<'a>> {
    names.iter().map(|n| task(Q, n)).collect()
}

/// A batch's members are inserted due and its callbacks waiting; each member's end is counted
/// in the batch's row by the write-back that writes it; the write-back of the last releases
/// both callbacks, once; a callback is not a member.
pub async fn a_batch_releases_its_callbacks_once_when_its_last_member_ends<D: Driver>(d: D) {
    use TaskState::*;
    let mut c = conn(&d).await;
    let b = insert_batch::<D>(&mut c, "import", &members(&["a", "b", "c"]), true, true).await;
    let [a, bb, cc] = <[TaskId; 3]>::try_from(b.task_ids.clone()).unwrap();
    let (ok, done) = (b.on_success.unwrap(), b.on_complete.unwrap());
    assert_eq!(get(&d, a).await.state, Pending);
    assert_eq!(
        (get(&d, ok).await.state, get(&d, done).await.state),
        (Waiting, Waiting)
    );
    let r = row(&d, b.id).await;
    assert_eq!(
        (progress(&r), r.sealed, r.name.as_str()),
        ((3, 0, 0), true, "import")
    );
    // Waiting callbacks are not claimed.
    let n = names(&["on_success", "on_complete"]);
    assert!(claimed_ids(&claim(&d, &mut c, &req(Q, &n, 10)).await).is_empty());

    assert!(end(&d, &mut c, "a", a, "succeeded").await.is_empty());
    assert!(end(&d, &mut c, "b", bb, "succeeded").await.is_empty());
    assert_eq!(progress(&row(&d, b.id).await), (3, 2, 0));
    assert_eq!(get(&d, done).await.state, Waiting);
    let mut both = vec![ok, done];
    both.sort();
    assert_eq!(
        end(&d, &mut c, "c", cc, "succeeded").await,
        both,
        "{}: the last end releases both callbacks",
        backend::<D>()
    );
    let r = row(&d, b.id).await;
    assert_eq!(progress(&r), (3, 3, 0));
    assert!(r.completed_at.is_some() && r.succeeded_at.is_some());
    assert_eq!(
        (get(&d, ok).await.state, get(&d, done).await.state),
        (Pending, Pending)
    );
    // The callbacks run as plain tasks: their ends count nowhere.
    let t = claim_one(&d, &mut c, Q, "on_complete", LEASE_US, done).await;
    assert_eq!(t.batch_id, None, "{}", backend::<D>());
    let w = d
        .task_write_back(&mut c, &[outcome(&t, "succeeded", "succeeded")])
        .await
        .unwrap();
    assert_eq!(w.counted.members, 0);
    assert_eq!(progress(&row(&d, b.id).await), (3, 3, 0));
    // A second count of the same ends (the sweep) finds nothing.
    let s = d.batch_settle_stranded(&mut c, 100).await.unwrap();
    assert_eq!((s.members, s.released.len()), (0, 0));
}

/// A member that dies is counted as failed; the batch completes with it: `on_complete` is
/// released and `on_success` canceled. Retried by an operator, the member is uncounted by the
/// sweep; its success then brings `on_success` back, and `on_complete` is not released again.
pub async fn a_failed_member_cancels_on_success_until_its_retry_succeeds<D: Driver>(d: D) {
    use TaskState::*;
    let mut c = conn(&d).await;
    let b = insert_batch::<D>(&mut c, "flaky", &members(&["a", "b"]), true, true).await;
    let [a, bb] = <[TaskId; 2]>::try_from(b.task_ids.clone()).unwrap();
    let (ok, done) = (b.on_success.unwrap(), b.on_complete.unwrap());
    assert!(end(&d, &mut c, "a", a, "dead").await.is_empty());
    assert_eq!(progress(&row(&d, b.id).await), (2, 0, 1));
    assert_eq!(end(&d, &mut c, "b", bb, "succeeded").await, [done]);
    let s = get(&d, ok).await;
    assert_eq!(
        (s.state, s.last_error.as_deref()),
        (Canceled, Some(CANCELED_BY_BATCH)),
        "{}",
        backend::<D>()
    );
    let r = row(&d, b.id).await;
    assert!(r.completed_at.is_some() && r.succeeded_at.is_none());
    // The complete callback runs.
    let t = claim_one(&d, &mut c, Q, "on_complete", LEASE_US, done).await;
    d.task_write_back(&mut c, &[outcome(&t, "succeeded", "succeeded")])
        .await
        .unwrap();

    let mut tx = c.begin().await.unwrap();
    assert_eq!(
        d.task_retry_dead(&mut tx, a).await.unwrap(),
        RetryDead::Retried
    );
    tx.commit().await.unwrap();
    let s = d.batch_settle_stranded(&mut c, 100).await.unwrap();
    assert_eq!(
        s.members,
        1,
        "{}: the retried member is uncounted",
        backend::<D>()
    );
    assert_eq!(progress(&row(&d, b.id).await), (2, 1, 0));
    assert_eq!(end(&d, &mut c, "a", a, "succeeded").await, [ok]);
    assert_eq!(get(&d, ok).await.state, Pending);
    assert_eq!(get(&d, ok).await.last_error, None);
    assert_eq!(get(&d, done).await.state, Succeeded, "not released again");
    let r = row(&d, b.id).await;
    assert_eq!(progress(&r), (2, 2, 0));
    assert!(r.succeeded_at.is_some());
}

/// Ends the write-back does not write (an operator's cancel of a pending member, the delete of
/// one) are counted by the sweep, which releases the callbacks; a second sweep finds nothing.
/// A retried member that succeeds before the sweep saw it pending is counted once.
pub async fn the_sweep_counts_the_ends_the_write_back_did_not<D: Driver>(d: D) {
    use TaskState::*;
    let mut c = conn(&d).await;
    let b = insert_batch::<D>(&mut c, "swept", &members(&["a", "b", "c"]), true, true).await;
    let [a, bb, cc] = <[TaskId; 3]>::try_from(b.task_ids.clone()).unwrap();
    let done = b.on_complete.unwrap();
    let mut tx = c.begin().await.unwrap();
    assert!(d.task_cancel(&mut tx, a).await.unwrap());
    assert!(d.task_delete(&mut tx, bb).await.unwrap());
    tx.commit().await.unwrap();
    assert_eq!(progress(&row(&d, b.id).await), (3, 0, 0));
    let s = d.batch_settle_stranded(&mut c, 100).await.unwrap();
    assert_eq!((s.members, s.released.len()), (2, 0), "{}", backend::<D>());
    assert_eq!(progress(&row(&d, b.id).await), (3, 0, 2));
    // The last member dies; its retry succeeds before any sweep: counted once as a success.
    assert_eq!(end(&d, &mut c, "c", cc, "dead").await, [done]);
    let mut tx = c.begin().await.unwrap();
    assert_eq!(
        d.task_retry_dead(&mut tx, cc).await.unwrap(),
        RetryDead::Retried
    );
    tx.commit().await.unwrap();
    assert!(end(&d, &mut c, "c", cc, "succeeded").await.is_empty());
    assert_eq!(progress(&row(&d, b.id).await), (3, 1, 2));
    let again = d.batch_settle_stranded(&mut c, 100).await.unwrap();
    assert_eq!(again.members, 0, "{}", backend::<D>());
    assert_eq!(get(&d, done).await.state, Pending);
}

/// An open batch releases nothing, even with every member ended, until it is sealed; members
/// are added to it in later transactions; the seal of a batch whose members have all ended
/// releases its callbacks in its own transaction; once complete, additions are refused, and
/// an unknown batch is not found. A rolled-back insert leaves nothing.
pub async fn an_open_batch_waits_for_its_seal_and_refuses_additions_once_complete<D: Driver>(d: D) {
    use TaskState::*;
    let mut c = conn(&d).await;
    let b = insert_batch::<D>(&mut c, "open", &members(&["a"]), true, false).await;
    let (ok, done) = (b.on_success.unwrap(), b.on_complete.unwrap());
    assert!(
        end(&d, &mut c, "a", b.task_ids[0], "succeeded")
            .await
            .is_empty()
    );
    assert_eq!(get(&d, done).await.state, Waiting, "{}", backend::<D>());
    let added = D::batch_add(&mut c, b.id, &members(&["b", "c"]), false)
        .await
        .unwrap();
    let BatchAdded::Added { task_ids, .. } = added else {
        panic!("{}: added", backend::<D>());
    };
    assert_eq!(task_ids.len(), 2);
    assert_eq!(progress(&row(&d, b.id).await), (3, 1, 0));
    assert!(
        end(&d, &mut c, "b", task_ids[0], "succeeded")
            .await
            .is_empty()
    );
    assert!(
        end(&d, &mut c, "c", task_ids[1], "succeeded")
            .await
            .is_empty()
    );
    assert_eq!(get(&d, ok).await.state, Waiting, "still open");
    // The seal, in a caller's transaction, releases both: every member has ended.
    let mut tx = c.begin().await.unwrap();
    let sealed = D::batch_add(&mut tx, b.id, &[], true).await.unwrap();
    tx.commit().await.unwrap();
    let BatchAdded::Added { counted, .. } = sealed else {
        panic!("sealed");
    };
    assert_eq!(counted.released.len(), 2, "{}", backend::<D>());
    assert_eq!(
        (get(&d, ok).await.state, get(&d, done).await.state),
        (Pending, Pending)
    );
    let r = row(&d, b.id).await;
    assert!(r.sealed && r.completed_at.is_some());
    assert_eq!(
        D::batch_add(&mut c, b.id, &members(&["late"]), false)
            .await
            .unwrap(),
        BatchAdded::Refused(AddRefused::Ended)
    );
    assert_eq!(
        D::batch_add(&mut c, b.id + 1000, &[], true).await.unwrap(),
        BatchAdded::Refused(AddRefused::NotFound)
    );
    assert_eq!(progress(&row(&d, b.id).await), (3, 3, 0), "nothing added");

    let mut tx = c.begin().await.unwrap();
    let gone = insert_batch::<D>(&mut tx, "gone", &members(&["x"]), true, true).await;
    drop(tx);
    assert!(d.batch_get(gone.id).await.unwrap().is_none());
    for id in gone.task_ids.iter().chain(&gone.on_success) {
        assert!(
            d.task_get(*id).await.unwrap().is_none(),
            "{}",
            backend::<D>()
        );
    }
}

/// A batch canceled as a whole: its pending members and its callbacks are canceled and
/// counted, its running member asked to cancel; the member's canceled end is counted by its
/// write-back, and nothing is released. Batches list newest first; members page by id.
pub async fn cancel_of_a_batch_cancels_its_members_and_callbacks<D: Driver>(d: D) {
    use TaskState::*;
    let mut c = conn(&d).await;
    let b = insert_batch::<D>(&mut c, "canceled", &members(&["a", "b", "c"]), true, true).await;
    let [a, bb, cc] = <[TaskId; 3]>::try_from(b.task_ids.clone()).unwrap();
    let running = claim_one(&d, &mut c, Q, "a", LEASE_US, a).await;
    let mut tx = c.begin().await.unwrap();
    let done = d.batch_cancel(&mut tx, b.id).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(
        (
            done.found,
            done.canceled,
            done.cancel_requested,
            done.callbacks_canceled
        ),
        (true, 2, 1, 2),
        "{}",
        backend::<D>()
    );
    assert_eq!(
        (get(&d, bb).await.state, get(&d, cc).await.state),
        (Canceled, Canceled)
    );
    assert_eq!(progress(&row(&d, b.id).await), (3, 0, 2));
    let held = d
        .task_leases_held(&mut c, &[(a.0, running.lease_epoch)])
        .await
        .unwrap();
    assert_eq!(held, [(a.0, running.lease_epoch, true)]);
    let w = d
        .task_write_back(&mut c, &[outcome(&running, "canceled", "canceled")])
        .await
        .unwrap();
    assert!(w.counted.released.is_empty(), "{}", backend::<D>());
    let r = row(&d, b.id).await;
    assert_eq!(progress(&r), (3, 0, 3));
    assert!(r.canceled_at.is_some());
    assert_eq!(get(&d, b.on_complete.unwrap()).await.state, Canceled);
    let mut tx = c.begin().await.unwrap();
    assert!(!d.batch_cancel(&mut tx, b.id + 1000).await.unwrap().found);
    drop(tx);

    let page = d.batch_members(b.id, 0, 2).await.unwrap();
    assert_eq!(
        page.iter()
            .map(|m| (m.task_id, m.state))
            .collect::<Vec<_>>(),
        [(a, Some(Canceled)), (bb, Some(Canceled))]
    );
    let rest = d.batch_members(b.id, bb.0, 10).await.unwrap();
    assert_eq!(rest.len(), 1);
    assert_eq!((rest[0].task_id, rest[0].name.as_str()), (cc, "c"));
    let other = insert_batch::<D>(&mut c, "nightly", &members(&["z"]), false, true).await;
    let all: Vec<u64> = d
        .batch_list(None, u64::MAX, 10)
        .await
        .unwrap()
        .iter()
        .map(|b| b.id)
        .collect();
    assert_eq!(all, [other.id, b.id]);
    let named: Vec<u64> = d
        .batch_list(Some("canceled"), u64::MAX, 10)
        .await
        .unwrap()
        .iter()
        .map(|b| b.id)
        .collect();
    assert_eq!(named, [b.id]);
}

/// A batch is pruned with its member rows once retention pruned every member's task and its
/// callbacks ended; one with a callback still to run is kept.
pub async fn a_batch_is_pruned_once_its_tasks_are_gone_and_its_callbacks_ended<D: Driver>(d: D) {
    let mut c = conn(&d).await;
    let b = insert_batch::<D>(&mut c, "done", &members(&["a"]), true, true).await;
    end(&d, &mut c, "a", b.task_ids[0], "succeeded").await;
    assert_eq!(
        d.task_prune(&mut c, TaskState::Succeeded, 0, 100)
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        d.batch_prune(&mut c, 100).await.unwrap(),
        0,
        "{}: its callbacks are pending",
        backend::<D>()
    );
    for (name, id) in [
        ("on_success", b.on_success.unwrap()),
        ("on_complete", b.on_complete.unwrap()),
    ] {
        let t = claim_one(&d, &mut c, Q, name, LEASE_US, id).await;
        d.task_write_back(&mut c, &[outcome(&t, "succeeded", "succeeded")])
            .await
            .unwrap();
    }
    assert_eq!(
        d.batch_prune(&mut c, 100).await.unwrap(),
        1,
        "{}",
        backend::<D>()
    );
    assert!(d.batch_get(b.id).await.unwrap().is_none());
    assert!(d.batch_members(b.id, 0, 10).await.unwrap().is_empty());
    assert_eq!(d.batch_prune(&mut c, 100).await.unwrap(), 0);
}
