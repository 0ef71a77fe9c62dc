//! Fencing with a forced interleaving: worker A claims, A's lease expires, worker B reclaims
//! and finishes, then A's late write-back (success or failure) is rejected by the epoch and
//! the row keeps B's outcome.

use std::sync::Arc;
use std::time::Duration;

use taskq::{Client, Task, TaskContext, TaskError, TaskId, TaskState};
use taskq_tests::backends::{Db, TestBackend};
use taskq_tests::{RunningWorker, wait_until};
use tokio::sync::Semaphore;

/// Worker A's handlers wait here until the test opens the gate.
#[derive(Clone)]
struct Gate(Arc<Semaphore>);

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Fenced {
    /// What A's handler returns once released.
    a_fails: bool,
}

impl Task for Fenced {
    const NAME: &'static str = "fenced";
    const MAX_ATTEMPTS: u32 = 5;
    async fn run(self, cx: TaskContext) -> Result<(), TaskError> {
        if cx.worker_id() == "A" {
            let gate = cx.data::<Gate>().unwrap();
            let _permit = gate.0.acquire().await.unwrap(); // ignores its cancel signal on purpose
            if self.a_fails {
                return Err(TaskError::msg("A failed late"));
            }
        }
        Ok(())
    }
}

async fn interleave<B: TestBackend>(db: Db<B>, a_fails: bool) {
    let client = Client::new(db.pool.clone());
    let gate = Gate(Arc::new(Semaphore::new(0)));
    let id: TaskId = Fenced { a_fails }.enqueue(&db.pool).await.unwrap().id;

    // A: long lease and heartbeat, so nothing but the test moves its lease; one slot, which
    // its blocked handler keeps, so A cannot claim the task back after B's reaper frees it.
    let a = RunningWorker::spawn(
        db.worker()
            .worker_id("A")
            .queue("default", 1)
            .register::<Fenced>()
            .data(gate.clone())
            .lease(Duration::from_secs(60))
            .heartbeat(Duration::from_secs(25))
            .reaper_interval(Duration::from_secs(3600))
            .cancel_grace(Duration::from_secs(30)),
    );
    wait_until(Duration::from_secs(10), "A holds the task", || async {
        client.get(id).await.unwrap().worker_id.as_deref() == Some("A")
    })
    .await;
    assert_eq!(client.get(id).await.unwrap().lease_epoch, 1);

    // A's lease expires (as if A were paused), B reaps, reclaims and finishes.
    db.set_ago(
        &format!("id = {}", id.0),
        "lease_until",
        Duration::from_secs(1),
    )
    .await;
    let b = RunningWorker::spawn(
        db.worker()
            .worker_id("B")
            .register::<Fenced>()
            .data(gate.clone()),
    );
    wait_until(Duration::from_secs(10), "B finished the task", || async {
        client.get(id).await.unwrap().state == TaskState::Succeeded
    })
    .await;
    let after_b = client.get(id).await.unwrap();
    assert_eq!(
        (
            after_b.worker_id.as_deref(),
            after_b.lease_epoch,
            after_b.attempt
        ),
        (Some("B"), 3, 2)
    );
    b.stop().await;

    // A's handler now returns; its write-back carries epoch 1 and must change nothing.
    gate.0.add_permits(1);
    wait_until(
        Duration::from_secs(10),
        "A's write-back was fenced",
        || async { a.stats.snapshot().fenced == 1 },
    )
    .await;
    let stats = a.stop().await.stats;
    assert_eq!(
        (stats.fenced, stats.succeeded, stats.retried, stats.dead),
        (1, 0, 0, 0)
    );
    let now = client.get(id).await.unwrap();
    assert_eq!(now.state, TaskState::Succeeded);
    assert_eq!(
        (now.worker_id.as_deref(), now.lease_epoch, now.attempt),
        (Some("B"), 3, 2)
    );
    assert_eq!(
        now.updated_at, after_b.updated_at,
        "the row was not written again"
    );
    assert_eq!(now.finished_at, after_b.finished_at);
    assert!(!now.last_error.unwrap_or_default().contains("A failed late"));
}

async fn a_stale_success_is_rejected<B: TestBackend>(db: Db<B>) {
    interleave(db, false).await;
}

async fn a_stale_failure_is_rejected<B: TestBackend>(db: Db<B>) {
    interleave(db, true).await;
}

taskq_tests::conformance!(a_stale_success_is_rejected, a_stale_failure_is_rejected);
