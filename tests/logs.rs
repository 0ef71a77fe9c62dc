//! The worker's log events have the levels `docs/operations.md` lists: an operator filtering at
//! WARN sees every failed attempt.
//!
//! One test in its own binary: a `tracing` subscriber set for one thread while another test's
//! threads register the same callsites can miss events (the callsite interest cache races).

use std::time::Duration;

use taskq::{Task, TaskContext, TaskError};
use taskq_tests::capture::{Capture, Captured};
use taskq_tests::{RunningWorker, TestDb, fast_worker, wait_until};

/// Fails its first attempt with a retryable error, then succeeds.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct FlakyOnce;

impl Task for FlakyOnce {
    const NAME: &'static str = "flaky_once";
    const BACKOFF: taskq::Backoff = taskq::Backoff::constant(Duration::from_millis(20));
    async fn run(self, cx: TaskContext) -> Result<(), TaskError> {
        if cx.attempt() == 1 {
            return Err(TaskError::msg("upstream 503"));
        }
        Ok(())
    }
}

/// Asks for a retry after 20 ms once, then succeeds.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct LaterOnce;

impl Task for LaterOnce {
    const NAME: &'static str = "later_once";
    async fn run(self, cx: TaskContext) -> Result<(), TaskError> {
        if cx.attempt() == 1 {
            return Err(TaskError::retry_after(
                Duration::from_millis(20),
                std::io::Error::other("rate limited"),
            ));
        }
        Ok(())
    }
}

/// Fails permanently.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct BadInput;

impl Task for BadInput {
    const NAME: &'static str = "bad_input";
    async fn run(self, _cx: TaskContext) -> Result<(), TaskError> {
        Err(TaskError::permanent(std::io::Error::other("no such order")))
    }
}

/// Fails its only attempt with a retryable error.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct OneShot;

impl Task for OneShot {
    const NAME: &'static str = "one_shot";
    const MAX_ATTEMPTS: u32 = 1;
    async fn run(self, _cx: TaskContext) -> Result<(), TaskError> {
        Err(TaskError::msg("still down"))
    }
}

// A current-thread runtime: every task of the worker runs on this thread, where the capturing
// subscriber is the default.
#[tokio::test]
async fn failing_attempts_log_at_warn_dead_tasks_at_error_successes_at_debug() {
    let capture = Capture::default();
    let _guard = tracing::subscriber::set_default(capture.clone());
    let Some(db) = TestDb::new_or_skip().await else {
        return;
    };
    FlakyOnce.enqueue(&db.pool).await.unwrap();
    LaterOnce.enqueue(&db.pool).await.unwrap();
    BadInput.enqueue(&db.pool).await.unwrap();
    OneShot.enqueue(&db.pool).await.unwrap();
    let w = RunningWorker::spawn(
        fast_worker(&db.pool)
            .register::<FlakyOnce>()
            .register::<LaterOnce>()
            .register::<BadInput>()
            .register::<OneShot>(),
    );
    wait_until(Duration::from_secs(10), "2 succeeded, 2 dead", || async {
        db.count("state = 'succeeded'").await == 2 && db.count("state = 'dead'").await == 2
    })
    .await;
    w.stop().await;

    let events = capture.events();
    let find = |message: &str| -> Vec<Captured> {
        events
            .iter()
            .filter(|e| e.message == message)
            .cloned()
            .collect()
    };
    let retry = find("attempt failed; will retry");
    assert_eq!(retry.len(), 1, "{events:#?}");
    assert_eq!(retry[0].level, tracing::Level::WARN);
    assert_eq!(retry[0].field("error"), Some("upstream 503"));
    let later = find("attempt failed; retry requested");
    assert_eq!(later.len(), 1, "{events:#?}");
    assert_eq!(later[0].level, tracing::Level::WARN);
    let permanent = find("attempt failed permanently; task is dead");
    assert_eq!(permanent.len(), 1, "{events:#?}");
    assert_eq!(permanent[0].level, tracing::Level::ERROR);
    let exhausted = find("attempt failed; attempts exhausted, task is dead");
    assert_eq!(exhausted.len(), 1, "{events:#?}");
    assert_eq!(exhausted[0].level, tracing::Level::ERROR);
    let succeeded = find("attempt succeeded");
    assert_eq!(succeeded.len(), 2, "{events:#?}");
    assert!(succeeded.iter().all(|e| e.level == tracing::Level::DEBUG));
    // An operator filtering at WARN sees every failed attempt.
    assert!(
        events
            .iter()
            .filter(|e| e.message.contains("attempt failed"))
            .all(|e| e.level <= tracing::Level::WARN),
        "{events:#?}"
    );
    assert!(
        events
            .iter()
            .any(|e| e.message == "taskq worker started" && e.level == tracing::Level::INFO)
    );
    // The span of each attempt (task_id, task, queue, attempt...) is kept by a `warn` filter.
    let spans = capture.spans();
    let attempts: Vec<_> = spans.iter().filter(|s| s.0 == "taskq.task").collect();
    assert_eq!(attempts.len(), 6, "{spans:?}");
    assert!(attempts.iter().all(|s| s.1 == tracing::Level::WARN));
}
