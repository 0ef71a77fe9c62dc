//! The worker on every backend: claims, runs, writes back, retries and dies under leases.

use std::time::Duration;

use taskq::{Task, TaskContext, TaskError};
use taskq_tests::backends::{Db, TestBackend, WAIT};
use taskq_tests::{RunningWorker, wait_until};

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Work {
    n: u32,
}

impl Task for Work {
    const NAME: &'static str = "work";
    const QUEUE: &'static str = "work";
    async fn run(self, _cx: TaskContext) -> Result<(), TaskError> {
        Ok(())
    }
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Flaky {
    n: u32,
}

impl Task for Flaky {
    const NAME: &'static str = "flaky";
    const QUEUE: &'static str = "work";
    const MAX_ATTEMPTS: u32 = 3;
    const BACKOFF: taskq::Backoff = taskq::Backoff::constant(Duration::from_millis(10));
    async fn run(self, cx: TaskContext) -> Result<(), TaskError> {
        if self.n.is_multiple_of(2) && cx.attempt() < 2 {
            return Err(TaskError::msg("first attempt fails"));
        }
        if !self.n.is_multiple_of(2) {
            return Err(TaskError::msg("always fails"));
        }
        Ok(())
    }
}

async fn a_worker_drains_every_task_once<B: TestBackend>(db: Db<B>) {
    let mut tx = db.begin().await;
    taskq::enqueue_many(&mut tx, (0..500).map(|n| Work { n }))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let w = RunningWorker::spawn(db.worker().register::<Work>().queue("work", 16));
    wait_until(WAIT, "every task succeeded", || async {
        db.count("state = 'succeeded'").await == 500
    })
    .await;
    let report = w.stop().await;
    assert_eq!(report.stats.succeeded, 500);
    assert_eq!(db.count("attempt = 1 AND lease_epoch = 1").await, 500);
}

async fn failures_retry_then_die<B: TestBackend>(db: Db<B>) {
    let mut tx = db.begin().await;
    taskq::enqueue_many(&mut tx, (0..20).map(|n| Flaky { n }))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let w = RunningWorker::spawn(db.worker().register::<Flaky>().queue("work", 4));
    wait_until(WAIT, "ten succeeded and ten dead", || async {
        db.count("state = 'succeeded'").await == 10 && db.count("state = 'dead'").await == 10
    })
    .await;
    w.stop().await;
    assert_eq!(db.count("state = 'succeeded' AND attempt = 2").await, 10);
    assert_eq!(db.count("state = 'dead' AND attempt = 3").await, 10);
    let dead = db
        .client()
        .list(&taskq::client::ListFilter {
            state: Some(taskq::TaskState::Dead),
            ..Default::default()
        })
        .await
        .unwrap();
    let attempts = db.client().attempts(dead[0].id).await.unwrap();
    assert_eq!(attempts.len(), 3, "one history entry per attempt");
}

taskq_tests::conformance!(a_worker_drains_every_task_once, failures_retry_then_die);
