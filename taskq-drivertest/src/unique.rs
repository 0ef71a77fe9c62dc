//! Unique identities: held, refused to duplicates, freed when the task stops being live
//! (docs/semantics.md, "Unique tasks"), the same way on every driver.

use chrono::TimeDelta;
use taskq_driver::driver::Driver;
use taskq_driver::rows::{NewTask, RetryDead, TaskFilter, WriteBack};
use taskq_driver::state::{TaskId, TaskState};

use crate::support::*;

const KEY_A: [u8; 32] = [0xaa; 32];
const KEY_B: [u8; 32] = [0xbb; 32];

async fn held<D: Driver>(d: &D, id: TaskId) -> bool {
    get(d, id).await.unique_held
}

/// A task unique while pending holds its identity from its insert (`unique_key` is its hex,
/// `unique_held` true): a duplicate enqueue returns the holder and writes nothing. The claim
/// that starts it frees the identity (the claimed task carries its key and `unique_while`),
/// so a new enqueue of it is a new task, whose identity the first task's outcome leaves
/// alone.
pub async fn an_identity_held_while_pending_is_freed_by_the_claim<D: Driver>(d: D) {
    let mut c = conn(&d).await;
    let a = insert::<D>(&mut c, unique("a", &KEY_A, "pending")).await;
    assert_eq!(
        insert_duplicate::<D>(&mut c, unique("a", &KEY_A, "pending")).await,
        a
    );
    assert_eq!(
        d.task_count(&TaskFilter::default())
            .await
            .expect("task_count"),
        1,
        "the duplicate wrote nothing"
    );
    let t = get(&d, a).await;
    assert!(t.unique_held);
    assert_eq!(t.unique_key.as_deref(), Some("aa".repeat(32).as_str()));
    let ta = claim_one(&d, &mut c, "q", "a", LEASE_US, a).await;
    assert_eq!(ta.unique_key.as_deref(), Some(&KEY_A[..]));
    assert_eq!(ta.unique_while.as_deref(), Some("pending"));
    assert!(!held(&d, a).await, "{}: freed by the claim", backend::<D>());
    let b = insert::<D>(&mut c, unique("a", &KEY_A, "pending")).await;
    assert!(b > a);
    d.task_write_back(&mut c, &[outcome(&ta, "dead", "failed")])
        .await
        .expect("task_write_back");
    assert!(held(&d, b).await, "the first task's death leaves it alone");
}

/// A task unique while running keeps its identity while running and through a retry, and a
/// write-back frees it when the task ends: by a success and by a death (a duplicate enqueued
/// afterwards is a new task). A cancel written back frees it too.
pub async fn an_identity_held_while_running_is_freed_by_the_write_back_that_ends_the_task<
    D: Driver,
>(
    d: D,
) {
    let mut c = conn(&d).await;
    let a = insert::<D>(&mut c, unique("a", &KEY_A, "running")).await;
    let t = claim_one(&d, &mut c, "q", "a", LEASE_US, a).await;
    assert!(held(&d, a).await, "held while running");
    assert_eq!(
        insert_duplicate::<D>(&mut c, unique("a", &KEY_A, "running")).await,
        a
    );
    let retry = outcome(&t, "pending", "failed");
    assert_eq!(retry.frees, None);
    d.task_write_back(&mut c, &[retry])
        .await
        .expect("task_write_back");
    assert!(held(&d, a).await, "a retry keeps it");
    let t = claim_one(&d, &mut c, "q", "a", LEASE_US, a).await;
    let ok = outcome(&t, "succeeded", "succeeded");
    assert_eq!(ok.frees.as_deref(), Some(&KEY_A[..]));
    let done = d
        .task_write_back(&mut c, &[ok])
        .await
        .expect("task_write_back");
    assert_eq!((done.written, done.deferred.len()), (1, 0));
    assert!(
        !held(&d, a).await,
        "{}: freed by the success",
        backend::<D>()
    );
    let again = insert::<D>(&mut c, unique("a", &KEY_A, "running")).await;
    assert_ne!(again, a);

    // Death frees it.
    let b = insert::<D>(&mut c, unique("b", &KEY_B, "running")).await;
    let tb = claim_one(&d, &mut c, "q", "b", LEASE_US, b).await;
    d.task_write_back(&mut c, &[outcome(&tb, "dead", "failed")])
        .await
        .expect("task_write_back");
    assert!(!held(&d, b).await, "freed by the death");
    let b2 = insert::<D>(&mut c, unique("b", &KEY_B, "running")).await;
    // A cancel honoured by the worker frees it.
    let tb2 = claim_one(&d, &mut c, "q", "b", LEASE_US, b2).await;
    assert!(
        d.task_request_cancel(&mut c, b2)
            .await
            .expect("request cancel")
    );
    d.task_write_back(&mut c, &[outcome(&tb2, "canceled", "canceled")])
        .await
        .expect("task_write_back");
    assert_eq!(get(&d, b2).await.state, TaskState::Canceled);
    assert!(!held(&d, b2).await, "freed by the cancel");
    // A fenced write-back frees nothing: the identity of a live task stays held.
    let b3 = insert::<D>(&mut c, unique("b", &KEY_B, "running")).await;
    let tb3 = claim_one(&d, &mut c, "q", "b", LEASE_US, b3).await;
    let stale = WriteBack {
        epoch: 0,
        ..outcome(&tb3, "succeeded", "succeeded")
    };
    assert_eq!(
        d.task_write_back(&mut c, &[stale])
            .await
            .expect("task_write_back")
            .written,
        0
    );
    assert!(held(&d, b3).await, "fenced: still held");
}

/// The reap frees an identity held while running exactly when it ends the task: a reap back
/// to pending keeps it, a reap of the last attempt to `dead` frees it, a reap of a
/// cancel-requested lease to `canceled` frees it (issue 22, point 6: the same on every
/// driver).
pub async fn an_identity_held_while_running_is_freed_by_the_reap_that_ends_the_task<D: Driver>(
    d: D,
) {
    let mut c = conn(&d).await;
    let a = insert::<D>(
        &mut c,
        NewTask {
            max_attempts: 2,
            ..unique("a", &KEY_A, "running")
        },
    )
    .await;
    let an = names(&["a"]);
    // Attempt 1 of 2 expires: back to pending, still held.
    claim_one(&d, &mut c, "q", "a", SHORT_LEASE_US, a).await;
    wait_lease_expired(&d, &mut c, a).await;
    let rows = d.task_lapsed(&mut c, &an, 10).await.expect("task_lapsed");
    assert_eq!(rows.len(), 1);
    // `LapsedRow::frees()` (the rule, `rules::run_end_frees_identity`) names the identity the
    // reap frees: none for a requeue.
    assert_eq!(rows[0].unique_key.as_deref(), Some(&KEY_A[..]));
    assert_eq!(rows[0].unique_while.as_deref(), Some("running"));
    assert_eq!(rows[0].frees(), None, "a requeue frees nothing");
    let done = d
        .task_reap(&mut c, &[reap_row(&rows[0])], true)
        .await
        .expect("task_reap");
    assert_eq!(done.rows, vec![(a.0, TaskState::Pending)]);
    assert!(held(&d, a).await, "a requeue keeps it");
    // Attempt 2 of 2 expires: dead, freed.
    let t2 = claim_one(&d, &mut c, "q", "a", SHORT_LEASE_US, a).await;
    assert_eq!(t2.attempt, 2);
    wait_lease_expired(&d, &mut c, a).await;
    let rows = d.task_lapsed(&mut c, &an, 10).await.expect("task_lapsed");
    assert!(rows[0].goes_dead());
    assert_eq!(
        rows[0].frees().as_deref(),
        Some(&KEY_A[..]),
        "{}: the identity the reap frees",
        backend::<D>()
    );
    let done = d
        .task_reap(&mut c, &[reap_row(&rows[0])], true)
        .await
        .expect("task_reap");
    assert_eq!(done.rows, vec![(a.0, TaskState::Dead)]);
    assert!(
        !held(&d, a).await,
        "{}: freed by the burial",
        backend::<D>()
    );
    let again = insert::<D>(&mut c, unique("a", &KEY_A, "running")).await;
    assert_ne!(again, a);

    // A cancel-requested lease expires: canceled, freed.
    let b = insert::<D>(&mut c, unique("b", &KEY_B, "running")).await;
    claim_one(&d, &mut c, "q", "b", SHORT_LEASE_US, b).await;
    assert!(
        d.task_request_cancel(&mut c, b)
            .await
            .expect("request cancel")
    );
    wait_lease_expired(&d, &mut c, b).await;
    let rows = d
        .task_lapsed(&mut c, &names(&["b"]), 10)
        .await
        .expect("task_lapsed");
    assert!(rows[0].canceled);
    assert_eq!(rows[0].frees().as_deref(), Some(&KEY_B[..]));
    let done = d
        .task_reap(&mut c, &[reap_row(&rows[0])], true)
        .await
        .expect("task_reap");
    assert_eq!(done.rows, vec![(b.0, TaskState::Canceled)]);
    assert!(
        !held(&d, b).await,
        "{}: freed by the reap's cancel",
        backend::<D>()
    );
    insert::<D>(&mut c, unique("b", &KEY_B, "running")).await;
}

/// A cancel request that lands between the reaper's read of an expired lease (no request
/// yet) and its reap: whichever way the reap goes, the task ends `canceled` with its identity
/// freed, at the latest after the next round of read and reap, and a new enqueue of the
/// identity is a new task (docs/semantics.md, "Cancel and retention"; issue 22, point 6).
pub async fn a_cancel_request_racing_the_reap_still_frees_the_identity<D: Driver>(d: D) {
    let mut c = conn(&d).await;
    let an = names(&["a"]);
    let a = insert::<D>(&mut c, unique("a", &KEY_A, "running")).await;
    claim_one(&d, &mut c, "q", "a", SHORT_LEASE_US, a).await;
    wait_lease_expired(&d, &mut c, a).await;
    let read = d.task_lapsed(&mut c, &an, 10).await.expect("task_lapsed");
    assert_eq!(read.len(), 1);
    assert!(!read[0].canceled, "read before the request");
    assert!(
        d.task_request_cancel(&mut c, a)
            .await
            .expect("request cancel")
    );
    let first = d
        .task_reap(&mut c, &[reap_row(&read[0])], false)
        .await
        .expect("task_reap");
    // DRIVERS DIFFER (allowed: "whichever way the reap then goes"): MySQL writes a row only
    // if its cancel request is as the read saw it, so this reap writes nothing and the next
    // round cancels the task; SQLite's reap reads the request in its own statement and
    // cancels the task at once, freeing the identity by the rule applied to the state it
    // gave the row (`rules::run_end_frees_identity` for `canceled`).
    assert!(first.reaped <= 1);
    let mut rounds = 0;
    while get(&d, a).await.state == TaskState::Running {
        rounds += 1;
        assert!(
            rounds <= 3,
            "{}: still running after 3 rounds",
            backend::<D>()
        );
        let rows = d.task_lapsed(&mut c, &an, 10).await.expect("task_lapsed");
        assert_eq!(rows.len(), 1);
        assert!(rows[0].canceled, "the next round reads the request");
        d.task_reap(&mut c, &[reap_row(&rows[0])], false)
            .await
            .expect("task_reap");
    }
    let t = get(&d, a).await;
    assert_eq!(t.state, TaskState::Canceled, "{}", backend::<D>());
    assert_eq!(t.lease_epoch, 2, "reaped once");
    assert!(
        !t.unique_held,
        "{}: the canceled task's identity is freed",
        backend::<D>()
    );
    assert_eq!(history(&d, a).await[0]["outcome"], "canceled");
    let again = insert::<D>(&mut c, unique("a", &KEY_A, "running")).await;
    assert_ne!(again, a, "a new enqueue of the identity is a new task");
}

/// Canceling a pending unique task frees its identity (`task_cancel` and the batch). A manual
/// retry of a dead unique task takes its identity back (`Retried`, held again), unless another
/// task holds it: then `IdentityHeld(holder)` and nothing changes.
pub async fn cancel_frees_an_identity_and_retry_dead_takes_it_back_or_names_the_holder<
    D: Driver,
>(
    d: D,
) {
    let mut c = conn(&d).await;
    let p = insert::<D>(&mut c, unique("p", &KEY_A, "pending")).await;
    assert!(d.task_cancel(&mut c, p).await.expect("task_cancel"));
    assert!(!held(&d, p).await, "{}: cancel frees it", backend::<D>());
    let p2 = insert::<D>(&mut c, unique("p", &KEY_A, "pending")).await;
    assert_eq!(d.task_cancel_batch(&[p2.0]).await.expect("cancel batch"), 1);
    assert!(!held(&d, p2).await, "the batch frees it too");
    insert::<D>(&mut c, unique("p", &KEY_A, "pending")).await;

    let b = insert::<D>(&mut c, unique("b", &KEY_B, "running")).await;
    let tb = claim_one(&d, &mut c, "q", "b", LEASE_US, b).await;
    d.task_write_back(&mut c, &[outcome(&tb, "dead", "failed")])
        .await
        .expect("task_write_back");
    assert!(!held(&d, b).await);
    let other = insert::<D>(&mut c, unique("b", &KEY_B, "running")).await;
    assert_eq!(
        d.task_retry_dead(&mut c, b).await.expect("task_retry_dead"),
        RetryDead::IdentityHeld(other)
    );
    let t = get(&d, b).await;
    assert_eq!(
        (t.state, t.lease_epoch, t.unique_held),
        (TaskState::Dead, 1, false)
    );
    assert!(d.task_cancel(&mut c, other).await.expect("task_cancel"));
    assert_eq!(
        d.task_retry_dead(&mut c, b).await.expect("task_retry_dead"),
        RetryDead::Retried
    );
    let t = get(&d, b).await;
    assert_eq!(
        (t.state, t.attempt, t.lease_epoch, t.unique_held),
        (TaskState::Pending, 0, 2, true)
    );
    assert_eq!(
        insert_duplicate::<D>(&mut c, unique("b", &KEY_B, "running")).await,
        b,
        "held again"
    );
}

/// A window identity (unique per period) outlives its task's success until the window ends:
/// duplicates return the holder meanwhile; `unique_prune_expired` deletes the identities of
/// windows that have ended (and only those), after which the identity is free. A death frees
/// it before the window ends.
pub async fn a_window_identity_outlives_a_success_until_its_window_ends<D: Driver>(d: D) {
    let mut c = conn(&d).await;
    let now_us = D::db_clock_us(&mut c).await.expect("db_clock_us");
    let window = |key, end| NewTask {
        unique_expires_us: Some(end),
        ..unique("w", key, "window")
    };
    let a = insert::<D>(&mut c, window(&KEY_A, now_us + HOUR_US)).await;
    let t = claim_one(&d, &mut c, "q", "w", LEASE_US, a).await;
    let ok = outcome(&t, "succeeded", "succeeded");
    assert_eq!(ok.frees, None, "a window's success frees nothing");
    d.task_write_back(&mut c, &[ok])
        .await
        .expect("task_write_back");
    assert!(held(&d, a).await, "kept after the success");
    assert_eq!(
        d.unique_prune_expired(&mut c, 10)
            .await
            .expect("unique_prune_expired"),
        0
    );
    assert_eq!(
        insert_duplicate::<D>(&mut c, window(&KEY_A, now_us + 2 * HOUR_US)).await,
        a
    );
    // A window that has already ended.
    let b = insert::<D>(&mut c, window(&KEY_B, now_us - 1)).await;
    assert!(held(&d, b).await);
    assert_eq!(
        d.unique_prune_expired(&mut c, 10)
            .await
            .expect("unique_prune_expired"),
        1,
        "{}",
        backend::<D>()
    );
    assert!(!held(&d, b).await);
    assert!(held(&d, a).await);
    let b2 = insert::<D>(&mut c, window(&KEY_B, now_us + HOUR_US)).await;
    assert_ne!(b2, b);
    // A death frees a window's identity before its end.
    assert!(d.task_cancel(&mut c, b).await.expect("task_cancel"));
    let tb2 = claim_one(&d, &mut c, "q", "w", LEASE_US, b2).await;
    let dead = outcome(&tb2, "dead", "failed");
    assert_eq!(dead.frees.as_deref(), Some(&KEY_B[..]));
    d.task_write_back(&mut c, &[dead])
        .await
        .expect("task_write_back");
    assert!(
        !held(&d, b2).await,
        "{}: freed by the death",
        backend::<D>()
    );
    insert::<D>(&mut c, window(&KEY_B, now_us + HOUR_US)).await;
}

/// A claim that finds a unique task past its deadline moves it to `expired` and frees its
/// identity, without starting it.
pub async fn a_claim_that_expires_a_unique_task_frees_its_identity<D: Driver>(d: D) {
    let mut c = conn(&d).await;
    let past = ms(now::<D>(&mut c).await) - TimeDelta::seconds(10);
    let late = insert::<D>(
        &mut c,
        NewTask {
            run_at: Some(past - TimeDelta::seconds(1)),
            deadline: Some(past),
            ..unique("a", &KEY_A, "running")
        },
    )
    .await;
    assert!(held(&d, late).await);
    let got = claim(&d, &mut c, &req("q", &names(&["a"]), 5)).await;
    assert!(got.tasks.is_empty());
    assert_eq!(got.expired.len(), 1);
    let t = get(&d, late).await;
    assert_eq!(
        (t.state, t.attempt, t.lease_epoch),
        (TaskState::Expired, 0, 0)
    );
    assert!(!t.unique_held, "{}: freed by the claim", backend::<D>());
    insert::<D>(&mut c, unique("a", &KEY_A, "running")).await;
}
