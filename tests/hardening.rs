//! Hardening of the worker's edges: a success that arrives within the cancel grace after a
//! timeout, values beyond what the schema holds, and a write-back batch with a row the
//! database rejects.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use taskq::{Client, Enqueue, Error, Task, TaskContext, TaskError, TaskState, worker::Retention};
use taskq_tests::{RunningWorker, TestDb, fast_worker, wait_until};

/// What the handlers of this file do.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
enum Mode {
    /// Waits for its cancel signal (the timeout), then returns this result.
    AfterTimeout { ok: bool },
    /// Fails asking for a retry after `secs` seconds.
    RetryAfterSecs(u64),
    /// Succeeds.
    Ok,
    /// Fails on its first attempt with an error the test trigger rejects, then succeeds.
    RejectedOnce,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Edge {
    mode: Mode,
}

/// Cancel reasons the handlers saw.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<taskq::context::CancelReason>>>);

impl Task for Edge {
    const NAME: &'static str = "edge";
    const MAX_ATTEMPTS: u32 = 3;
    const TIMEOUT: Option<Duration> = Some(Duration::from_millis(300));
    async fn run(self, cx: TaskContext) -> Result<(), TaskError> {
        match self.mode {
            Mode::AfterTimeout { ok } => {
                let reason = cx.cancel_signal().canceled().await;
                cx.data::<Seen>().unwrap().0.lock().unwrap().push(reason);
                if ok {
                    Ok(())
                } else {
                    Err(TaskError::msg("gave up"))
                }
            }
            Mode::RetryAfterSecs(s) => Err(TaskError::retry_after(
                Duration::from_secs(s),
                std::io::Error::other("much later"),
            )),
            Mode::Ok => Ok(()),
            Mode::RejectedOnce if cx.attempt() == 1 => Err(TaskError::msg("reject me")),
            Mode::RejectedOnce => Ok(()),
        }
    }
}

fn worker(db: &TestDb, seen: &Seen) -> taskq::worker::WorkerBuilder {
    fast_worker(&db.pool)
        .register::<Edge>()
        .data(seen.clone())
        .cancel_grace(Duration::from_secs(5))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_within_the_grace_after_a_timeout_is_the_result() {
    let Some(db) = TestDb::new_or_skip().await else {
        return;
    };
    let client = Client::new(db.pool.clone());
    let seen = Seen::default();
    let ok = Edge {
        mode: Mode::AfterTimeout { ok: true },
    }
    .enqueue(&db.pool)
    .await
    .unwrap()
    .id;
    let failed = Edge {
        mode: Mode::AfterTimeout { ok: false },
    }
    .enqueue(&db.pool)
    .await
    .unwrap()
    .id;
    let w = RunningWorker::spawn(worker(&db, &seen));
    wait_until(
        Duration::from_secs(10),
        "the success is written",
        || async { client.get(ok).await.unwrap().state == TaskState::Succeeded },
    )
    .await;
    wait_until(
        Duration::from_secs(10),
        "the failure is written",
        || async {
            let t = client.get(failed).await.unwrap();
            t.attempt >= 1 && t.last_error.is_some()
        },
    )
    .await;
    let stats = w.stop().await.stats;

    // The handler that succeeded after its timeout fired is a success, on its first attempt.
    let t = client.get(ok).await.unwrap();
    assert_eq!(
        (t.state, t.attempt, t.last_error),
        (TaskState::Succeeded, 1, None)
    );
    // The one that failed keeps its own error, saying it timed out first.
    let t = client.get(failed).await.unwrap();
    let err = t.last_error.unwrap();
    assert!(
        err.starts_with("timed out after 300ms, then failed: gave up"),
        "{err}"
    );
    assert!(
        seen.0
            .lock()
            .unwrap()
            .iter()
            .all(|r| *r == taskq::context::CancelReason::Timeout)
    );
    assert!(stats.timeouts >= 2, "{stats:?}");
    assert_eq!(stats.succeeded, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durations_beyond_the_schema_are_rejected_or_clamped() {
    let Some(db) = TestDb::new_or_skip().await else {
        return;
    };
    let client = Client::new(db.pool.clone());
    let seen = Seen::default();

    // Enqueue: a delay or run_at past the bound is a typed error and inserts nothing.
    let too_far = taskq::defaults::MAX_DELAY + Duration::from_secs(1);
    let e = Enqueue::new(Edge { mode: Mode::Ok })
        .with_delay(too_far)
        .enqueue(&db.pool)
        .await
        .unwrap_err();
    assert!(matches!(e, Error::InvalidSchedule(_)), "{e:?}");
    let e = Enqueue::new(Edge { mode: Mode::Ok })
        .with_delay(Duration::MAX)
        .enqueue(&db.pool)
        .await
        .unwrap_err();
    assert!(matches!(e, Error::InvalidSchedule(_)), "{e:?}");
    let year_10000 = chrono::DateTime::parse_from_rfc3339("9999-12-31T23:59:59Z")
        .unwrap()
        .to_utc();
    let e = Enqueue::new(Edge { mode: Mode::Ok })
        .with_run_at(year_10000)
        .enqueue(&db.pool)
        .await
        .unwrap_err();
    assert!(matches!(e, Error::InvalidSchedule(_)), "{e:?}");
    assert_eq!(db.count("1").await, 0);

    // Worker settings: a lease or retention past the bound is a configuration error.
    let e = worker(&db, &seen)
        .lease(Duration::MAX)
        .build()
        .err()
        .unwrap();
    assert!(
        matches!(e, Error::Config(ref m) if m.contains("lease")),
        "{e:?}"
    );
    let e = worker(&db, &seen)
        .retention(Retention {
            dead: Some(Duration::MAX),
            ..Retention::default()
        })
        .build()
        .err()
        .unwrap();
    assert!(
        matches!(e, Error::Config(ref m) if m.contains("retention")),
        "{e:?}"
    );

    // A handler's retry_after beyond the bound is clamped to MAX_DELAY, and the other
    // outcomes of its write-back batch are written with it.
    let huge = Edge {
        mode: Mode::RetryAfterSecs(u64::MAX),
    }
    .enqueue(&db.pool)
    .await
    .unwrap()
    .id;
    let mut others = Vec::new();
    for _ in 0..5 {
        others.push(Edge { mode: Mode::Ok }.enqueue(&db.pool).await.unwrap().id);
    }
    let w = RunningWorker::spawn(worker(&db, &seen).write_back_delay(Duration::from_millis(300)));
    wait_until(Duration::from_secs(10), "all outcomes written", || async {
        db.count("state = 'succeeded'").await == 5
            && db.count("state = 'pending' AND attempt = 1").await == 1
    })
    .await;
    let stats = w.stop().await.stats;
    assert_eq!(
        (stats.retried, stats.succeeded, stats.writeback_rejected),
        (1, 5, 0)
    );
    let t = client.get(huge).await.unwrap();
    let ahead = (t.run_at - client.db_now().await.unwrap()).num_days();
    let max_days = (taskq::defaults::MAX_DELAY.as_secs() / 86_400) as i64;
    assert!(
        (max_days - 1..=max_days).contains(&ahead),
        "retry clamped to {max_days} days, got {ahead}"
    );
    for id in others {
        assert_eq!(client.get(id).await.unwrap().state, TaskState::Succeeded);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_the_database_rejects_does_not_hold_back_its_batch() {
    let Some(db) = TestDb::new_or_skip().await else {
        return;
    };
    let client = Client::new(db.pool.clone());
    let seen = Seen::default();
    // A deterministic failure for one row of the write-back (as a constraint or trigger of
    // the application's own would be).
    sqlx::raw_sql(
        "CREATE TRIGGER reject_writeback BEFORE UPDATE ON taskq_tasks FOR EACH ROW
         IF NEW.last_error LIKE '%reject me%' THEN
           SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'rejected by the test trigger';
         END IF",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let rejected = Edge {
        mode: Mode::RejectedOnce,
    }
    .enqueue(&db.pool)
    .await
    .unwrap()
    .id;
    let mut ids = Vec::new();
    for _ in 0..9 {
        ids.push(Edge { mode: Mode::Ok }.enqueue(&db.pool).await.unwrap().id);
    }
    // One batch for all ten outcomes; a short lease so the dropped outcome's task comes back.
    let w = RunningWorker::spawn(
        worker(&db, &seen)
            .write_back_delay(Duration::from_millis(300))
            .lease(Duration::from_secs(1))
            .cancel_grace(Duration::from_millis(500)),
    );
    wait_until(
        Duration::from_secs(10),
        "the nine others are written",
        || async { db.count("state = 'succeeded'").await >= 9 },
    )
    .await;
    assert_eq!(w.stats.snapshot().writeback_rejected, 1);
    // The rejected outcome was not retried forever: its lease expired, the reaper returned
    // the task, and its second attempt succeeded.
    wait_until(
        Duration::from_secs(15),
        "the rejected task ran again",
        || async { client.get(rejected).await.unwrap().state == TaskState::Succeeded },
    )
    .await;
    let stats = w.stop().await.stats;
    let t = client.get(rejected).await.unwrap();
    assert_eq!((t.attempt, t.lease_epoch), (2, 3));
    assert!(t.last_error.unwrap().contains("lease expired"));
    assert_eq!(
        (stats.succeeded, stats.writeback_rejected, stats.reaped),
        (10, 1, 1)
    );
    for id in ids {
        let t = client.get(id).await.unwrap();
        assert_eq!((t.state, t.attempt), (TaskState::Succeeded, 1));
    }
}
