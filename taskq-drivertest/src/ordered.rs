//! Ordered tasks: one at a time per key, in enqueue order; a key's head ends by success,
//! cancel, delete, or (opted in) death, and promotes the next task of its key
//! (docs/semantics.md, "Ordered tasks"), the same way on every driver.

use taskq_driver::driver::Driver;
use taskq_driver::rows::{Inserted, NewTask, OrderKey, RetryDead};
use taskq_driver::state::{TaskId, TaskState};

use crate::support::*;

const KEY_A: [u8; 32] = [0xa1; 32];
const KEY_B: [u8; 32] = [0xb1; 32];

/// Inserts `t` ordered by `key` (which must be new); its id.
async fn ordered<D: Driver>(c: &mut D::Conn, t: NewTask<'_>, key: &[u8], skips: bool) -> TaskId {
    let order = OrderKey {
        key,
        dead_skips: skips,
    };
    match D::task_insert_ordered(c, &t, &order)
        .await
        .expect("task_insert_ordered")
    {
        Inserted::New(id) => id,
        Inserted::Duplicate(id) => panic!("unexpected duplicate of task {id}"),
    }
}

async fn state<D: Driver>(d: &D, id: TaskId) -> TaskState {
    get(d, id).await.state
}

async fn states<D: Driver>(d: &D, ids: &[TaskId]) -> Vec<TaskState> {
    let mut out = Vec::new();
    for id in ids {
        out.push(state(d, *id).await);
    }
    out
}

/// The first task of a key is its head (`pending`), those after it `waiting`; a claim takes
/// only heads, so one task per key runs while other keys run alongside. A success promotes
/// the next task of the key; a retry keeps the head the head; a death (by default) holds the
/// key, which the held keys list names, until a retry of the dead head, whose success lets
/// the key go on.
pub async fn ordered_tasks_run_one_at_a_time_per_key_in_enqueue_order<D: Driver>(d: D) {
    use TaskState::*;
    let mut c = conn(&d).await;
    let a1 = ordered::<D>(&mut c, task("q", "a"), &KEY_A, false).await;
    let a2 = ordered::<D>(&mut c, task("q", "b"), &KEY_A, false).await;
    let a3 = ordered::<D>(&mut c, task("q", "a"), &KEY_A, false).await;
    let b1 = ordered::<D>(&mut c, task("q", "a"), &KEY_B, false).await;
    assert_eq!(
        states(&d, &[a1, a2, a3, b1]).await,
        [Pending, Waiting, Waiting, Pending]
    );
    let n = names(&["a", "b"]);
    let got = claim(&d, &mut c, &req("q", &n, 10)).await;
    assert_eq!(
        claimed_ids(&got),
        vec![a1, b1],
        "{}: one head per key",
        backend::<D>()
    );
    let t1 = got.tasks.into_iter().find(|t| t.id == a1.0).expect("a1");
    assert_eq!(t1.order_key.as_deref(), Some(&KEY_A[..]));
    assert!(claimed_ids(&claim(&d, &mut c, &req("q", &n, 10)).await).is_empty());
    d.task_write_back(&mut c, &[outcome(&t1, "succeeded", "succeeded")])
        .await
        .expect("task_write_back");
    assert_eq!(
        states(&d, &[a1, a2, a3]).await,
        [Succeeded, Pending, Waiting]
    );
    // The head fails: a retry keeps it the head.
    let t2 = claim_one(&d, &mut c, "q", "b", LEASE_US, a2).await;
    d.task_write_back(&mut c, &[outcome(&t2, "pending", "failed")])
        .await
        .expect("task_write_back");
    assert_eq!(states(&d, &[a2, a3]).await, [Pending, Waiting]);
    let held = d.order_keys_held(None, 10).await.expect("order_keys_held");
    assert_eq!(held.len(), 1, "{held:?}");
    assert_eq!(
        (held[0].head, held[0].state, held[0].waiting),
        (a2, Pending, 1)
    );
    assert_eq!(held[0].order_key, "a1".repeat(32));
    // It dies: the key stays held.
    let t2 = claim_one(&d, &mut c, "q", "b", LEASE_US, a2).await;
    d.task_write_back(&mut c, &[outcome(&t2, "dead", "failed")])
        .await
        .expect("task_write_back");
    assert_eq!(states(&d, &[a2, a3]).await, [Dead, Waiting]);
    assert!(claimed_ids(&claim(&d, &mut c, &req("q", &n, 10)).await).is_empty());
    let held = d
        .order_keys_held(Some("q"), 10)
        .await
        .expect("order_keys_held");
    assert_eq!((held[0].head, held[0].state), (a2, Dead));
    assert!(
        d.order_keys_held(Some("other"), 10)
            .await
            .unwrap()
            .is_empty()
    );
    // Retention keeps a dead head that holds its key.
    assert_eq!(d.task_prune(&mut c, Dead, 0, 100).await.expect("prune"), 0);
    // An operator retries it: still the head, runs, succeeds, the key goes on.
    assert_eq!(
        d.task_retry_dead(&mut c, a2).await.expect("retry"),
        RetryDead::Retried
    );
    assert_eq!(states(&d, &[a2, a3]).await, [Pending, Waiting]);
    let t2 = claim_one(&d, &mut c, "q", "b", LEASE_US, a2).await;
    d.task_write_back(&mut c, &[outcome(&t2, "succeeded", "succeeded")])
        .await
        .expect("task_write_back");
    assert_eq!(states(&d, &[a2, a3]).await, [Succeeded, Pending]);
    assert!(d.order_keys_held(None, 10).await.unwrap().is_empty());
    // The last one succeeds: the key has no head, and the next enqueue is its head at once.
    let t3 = claim_one(&d, &mut c, "q", "a", LEASE_US, a3).await;
    d.task_write_back(&mut c, &[outcome(&t3, "succeeded", "succeeded")])
        .await
        .expect("task_write_back");
    let a4 = ordered::<D>(&mut c, task("q", "a"), &KEY_A, false).await;
    assert_eq!(state(&d, a4).await, Pending);
}

/// A task that opted in (`dead_skips`) lets its key go on when it dies, by its write-back or
/// by the reap of its last attempt; a reap with attempts left keeps it the head.
pub async fn a_dead_head_that_skips_lets_its_key_go_on<D: Driver>(d: D) {
    use TaskState::*;
    let mut c = conn(&d).await;
    let last = |name| NewTask {
        max_attempts: 1,
        ..task("q", name)
    };
    let a1 = ordered::<D>(&mut c, last("a"), &KEY_A, true).await;
    let a2 = ordered::<D>(&mut c, task("q", "a"), &KEY_A, true).await;
    let a3 = ordered::<D>(&mut c, task("q", "a"), &KEY_A, true).await;
    let t1 = claim_one(&d, &mut c, "q", "a", LEASE_US, a1).await;
    assert!(t1.order_dead_skips);
    d.task_write_back(&mut c, &[outcome(&t1, "dead", "failed")])
        .await
        .expect("task_write_back");
    assert_eq!(states(&d, &[a1, a2, a3]).await, [Dead, Pending, Waiting]);
    // A lease that lapses with attempts left: back to pending, still the head.
    let t2 = claim_one(&d, &mut c, "q", "a", SHORT_LEASE_US, a2).await;
    wait_lease_expired::<D>(&d, &mut c, a2).await;
    let lapsed = d
        .task_lapsed(&mut c, &names(&["a"]), 10)
        .await
        .expect("task_lapsed");
    let rows: Vec<_> = lapsed.iter().map(reap_row).collect();
    d.task_reap(&mut c, &rows, false).await.expect("task_reap");
    assert_eq!(states(&d, &[a2, a3]).await, [Pending, Waiting]);
    drop(t2);
    // Retrying the dead a1 (no longer the head) queues it at the end of its key.
    assert_eq!(
        d.task_retry_dead(&mut c, a1).await.expect("retry"),
        RetryDead::Retried
    );
    assert_eq!(states(&d, &[a1, a2, a3]).await, [Waiting, Pending, Waiting]);
    let t2 = claim_one(&d, &mut c, "q", "a", LEASE_US, a2).await;
    d.task_write_back(&mut c, &[outcome(&t2, "succeeded", "succeeded")])
        .await
        .expect("task_write_back");
    assert_eq!(
        states(&d, &[a1, a2, a3]).await,
        [Waiting, Succeeded, Pending]
    );
}

/// Canceling a waiting task leaves its key's head alone; canceling the head promotes the
/// next task still waiting; deleting a head lets the key go on; canceling a task asked to
/// cancel while running, by the reap of its lapsed lease, promotes the next as well.
pub async fn cancel_and_delete_keep_a_keys_order<D: Driver>(d: D) {
    use TaskState::*;
    let mut c = conn(&d).await;
    let a1 = ordered::<D>(&mut c, task("q", "a"), &KEY_A, false).await;
    let a2 = ordered::<D>(&mut c, task("q", "a"), &KEY_A, false).await;
    let a3 = ordered::<D>(&mut c, task("q", "a"), &KEY_A, false).await;
    let a4 = ordered::<D>(&mut c, task("q", "a"), &KEY_A, false).await;
    let a5 = ordered::<D>(&mut c, task("q", "a"), &KEY_A, false).await;
    assert!(d.task_cancel(&mut c, a2).await.expect("cancel"));
    assert_eq!(
        states(&d, &[a1, a2, a3]).await,
        [Pending, Canceled, Waiting]
    );
    assert_eq!(d.task_cancel_batch(&[a1.0]).await.expect("cancel"), 1);
    assert_eq!(
        states(&d, &[a1, a3, a4]).await,
        [Canceled, Pending, Waiting]
    );
    assert!(d.task_delete(&mut c, a3).await.expect("delete"));
    assert_eq!(state(&d, a4).await, Pending);
    // The head runs, is asked to cancel, its lease lapses: the reap cancels it, a5 goes on.
    claim_one(&d, &mut c, "q", "a", SHORT_LEASE_US, a4).await;
    assert!(d.task_request_cancel(&mut c, a4).await.expect("request"));
    wait_lease_expired::<D>(&d, &mut c, a4).await;
    let lapsed = d
        .task_lapsed(&mut c, &names(&["a"]), 10)
        .await
        .expect("task_lapsed");
    let rows: Vec<_> = lapsed.iter().map(reap_row).collect();
    d.task_reap(&mut c, &rows, false).await.expect("task_reap");
    assert_eq!(states(&d, &[a4, a5]).await, [Canceled, Pending]);
}

/// A batch cancel that holds a key's head and the task after it cancels both, and the task
/// after them becomes the head: a canceled head never promotes a task the same batch cancels
/// (issue 34, O1: MySQL canceled the pending tasks, promoted, then canceled the waiting ones,
/// so the promoted one stayed `pending`). The count is of the tasks canceled.
pub async fn a_batch_cancel_of_a_head_and_the_tasks_behind_it_cancels_them_all<D: Driver>(d: D) {
    use TaskState::*;
    let mut c = conn(&d).await;
    let a1 = ordered::<D>(&mut c, task("q", "a"), &KEY_A, false).await;
    let a2 = ordered::<D>(&mut c, task("q", "a"), &KEY_A, false).await;
    let a3 = ordered::<D>(&mut c, task("q", "a"), &KEY_A, false).await;
    let a4 = ordered::<D>(&mut c, task("q", "a"), &KEY_A, false).await;
    let b1 = ordered::<D>(&mut c, task("q", "a"), &KEY_B, false).await;
    let b2 = ordered::<D>(&mut c, task("q", "a"), &KEY_B, false).await;
    let n = d
        .task_cancel_batch(&[a1.0, a2.0, b1.0, b2.0])
        .await
        .expect("task_cancel_batch");
    assert_eq!(
        states(&d, &[a1, a2, a3, a4, b1, b2]).await,
        [Canceled, Canceled, Pending, Waiting, Canceled, Canceled],
        "{}",
        backend::<D>()
    );
    assert_eq!(n, 4);
    // The key's next enqueue waits behind a3 (the head); key B has none, so its next is the head.
    let a5 = ordered::<D>(&mut c, task("q", "a"), &KEY_A, false).await;
    let b3 = ordered::<D>(&mut c, task("q", "a"), &KEY_B, false).await;
    assert_eq!(states(&d, &[a5, b3]).await, [Waiting, Pending]);
    // A batch of waiting tasks only changes no head.
    assert_eq!(d.task_cancel_batch(&[a4.0, a5.0]).await.expect("cancel"), 2);
    assert_eq!(
        states(&d, &[a3, a4, a5]).await,
        [Pending, Canceled, Canceled]
    );
}
