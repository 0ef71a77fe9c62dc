//! Attempt history and the audit trail: every attempt that ends leaves an entry on its task
//! row (written by the statement that ends it: write-back, reaper, release), bounded and pruned
//! with the task; operator actions leave an audit row with their actor.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use taskq::{
    Client, Error, Task, TaskContext, TaskError, TaskId, TaskState, client::Attempt,
    client::AttemptOutcome, client::AuditEntry, client::AuditFilter, client::BulkFilter,
    client::Canceled, worker::Retention,
};
use taskq_tests::backends::{Db, TestBackend};
use taskq_tests::{RunningWorker, wait_until};
use tokio::sync::Semaphore;

/// Fails its first two attempts, then succeeds.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Flaky;

impl Task for Flaky {
    const NAME: &'static str = "flaky";
    const MAX_ATTEMPTS: u32 = 5;
    async fn run(self, cx: TaskContext) -> Result<(), TaskError> {
        if cx.attempt() < 3 {
            let msg = format!("boom {}", cx.attempt());
            return Err(TaskError::retry_after(Duration::from_millis(10), msg));
        }
        Ok(())
    }
}

/// Runs past its timeout.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Slow;

impl Task for Slow {
    const NAME: &'static str = "slow";
    const MAX_ATTEMPTS: u32 = 1;
    const TIMEOUT: Option<Duration> = Some(Duration::from_millis(100));
    async fn run(self, _cx: TaskContext) -> Result<(), TaskError> {
        tokio::time::sleep(Duration::from_secs(30)).await;
        Ok(())
    }
}

/// Panics.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Boom;

impl Task for Boom {
    const NAME: &'static str = "boom";
    const MAX_ATTEMPTS: u32 = 1;
    async fn run(self, _cx: TaskContext) -> Result<(), TaskError> {
        panic!("kaboom");
    }
}

/// Fails permanently with an error of `0` repetitions of `é` (2 bytes each).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Verbose(usize);

impl Task for Verbose {
    const NAME: &'static str = "verbose";
    async fn run(self, _cx: TaskContext) -> Result<(), TaskError> {
        Err(TaskError::permanent("é".repeat(self.0)))
    }
}

/// Snoozes once, then succeeds.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Sleepy;

impl Task for Sleepy {
    const NAME: &'static str = "sleepy";
    async fn run(self, cx: TaskContext) -> Result<(), TaskError> {
        if cx.snoozes() == 0 {
            return Err(TaskError::snooze(Duration::from_millis(10)));
        }
        Ok(())
    }
}

/// Succeeds at once.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Quick;

impl Task for Quick {
    const NAME: &'static str = "quick";
    async fn run(self, _cx: TaskContext) -> Result<(), TaskError> {
        Ok(())
    }
}

/// Waits for the gate (ignoring its cancel signal unless `on_cancel`), then returns an error.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Gated {
    on_cancel: bool,
}

#[derive(Clone)]
struct Gate(Arc<Semaphore>);

impl Task for Gated {
    const NAME: &'static str = "gated";
    const MAX_ATTEMPTS: u32 = 5;
    async fn run(self, cx: TaskContext) -> Result<(), TaskError> {
        if self.on_cancel {
            cx.cancel_signal().canceled().await;
            return Err(TaskError::msg("stopped"));
        }
        if cx.worker_id() == "B" {
            return Ok(());
        }
        let gate = cx.data::<Gate>().unwrap();
        let _permit = gate.0.acquire().await.unwrap();
        Err(TaskError::msg("A failed late"))
    }
}

async fn wait_state(client: &Client, id: TaskId, state: TaskState) {
    wait_until(
        Duration::from_secs(15),
        &format!("task {id} is {state}"),
        || async { client.get(id).await.unwrap().state == state },
    )
    .await;
}

async fn db_now(client: &Client) -> DateTime<Utc> {
    client.db_now().await.unwrap()
}

/// `(attempt, epoch, outcome)` of each entry.
fn summary(attempts: &[Attempt]) -> Vec<(u32, u64, AttemptOutcome)> {
    attempts
        .iter()
        .map(|a| (a.attempt, a.epoch, a.outcome.clone()))
        .collect()
}

async fn a_task_that_fails_twice_then_succeeds_has_three_entries<B: TestBackend>(db: Db<B>) {
    let client = Client::new(db.pool.clone());
    let id = Flaky.enqueue(&db.pool).await.unwrap().id;
    assert_eq!(client.attempts(id).await.unwrap(), vec![]);
    assert_eq!(client.get(id).await.unwrap().attempted_at, None);
    let before = db_now(&client).await;
    let w = RunningWorker::spawn(db.worker().register::<Flaky>());
    let worker_id = w.id.clone();
    wait_state(&client, id, TaskState::Succeeded).await;
    w.stop().await;
    let after = db_now(&client).await;

    let attempts = client.attempts(id).await.unwrap();
    use AttemptOutcome::*;
    assert_eq!(
        summary(&attempts),
        vec![(1, 1, Failed), (2, 2, Failed), (3, 3, Succeeded)]
    );
    let errors: Vec<Option<&str>> = attempts.iter().map(|a| a.error.as_deref()).collect();
    assert_eq!(errors, vec![Some("boom 1"), Some("boom 2"), None]);
    let mut last_end = before;
    for a in &attempts {
        assert_eq!(a.worker_id.as_deref(), Some(worker_id.as_str()));
        let started = a.started_at.expect("start recorded");
        assert!(last_end <= started, "{a:?} starts after the previous end");
        assert!(started <= a.finished_at, "{a:?}");
        assert!(a.duration().is_some());
        last_end = a.finished_at;
    }
    assert!(last_end <= after);
    let t = client.get(id).await.unwrap();
    assert_eq!(t.attempted_at, attempts[2].started_at);
    assert_eq!(t.last_error.as_deref(), Some("boom 2"));
}

async fn timeouts_and_panics_are_recorded_as_such<B: TestBackend>(db: Db<B>) {
    let client = Client::new(db.pool.clone());
    let slow = Slow.enqueue(&db.pool).await.unwrap().id;
    let boom = Boom.enqueue(&db.pool).await.unwrap().id;
    let w = RunningWorker::spawn(
        db.worker()
            .register::<Slow>()
            .register::<Boom>()
            .cancel_grace(Duration::from_millis(50)),
    );
    wait_state(&client, slow, TaskState::Dead).await;
    wait_state(&client, boom, TaskState::Dead).await;
    w.stop().await;

    let slow_attempts = client.attempts(slow).await.unwrap();
    assert_eq!(
        summary(&slow_attempts),
        vec![(1, 1, AttemptOutcome::TimedOut)]
    );
    let e = slow_attempts[0].error.as_deref().unwrap();
    assert!(e.starts_with("timed out after 100ms"), "{e}");
    let boom_attempts = client.attempts(boom).await.unwrap();
    assert_eq!(
        summary(&boom_attempts),
        vec![(1, 1, AttemptOutcome::Panicked)]
    );
    let e = boom_attempts[0].error.as_deref().unwrap();
    assert!(e.starts_with("handler panicked: kaboom"), "{e}");
}

/// Worker A claims, its lease runs out; B's reaper records `lease_lost` with A's id, B runs the
/// task to success; A's late write-back is fenced and appends nothing.
async fn a_lost_lease_is_recorded_by_the_reaper_and_a_fenced_write_back_appends_nothing<
    B: TestBackend,
>(
    db: Db<B>,
) {
    let client = Client::new(db.pool.clone());
    let gate = Gate(Arc::new(Semaphore::new(0)));
    let id = Gated { on_cancel: false }
        .enqueue(&db.pool)
        .await
        .unwrap()
        .id;
    let a = RunningWorker::spawn(
        db.worker()
            .worker_id("A")
            .queue("default", 1)
            .register::<Gated>()
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
    let a_started = client.get(id).await.unwrap().attempted_at.unwrap();
    db.exec(&format!(
        "UPDATE taskq_tasks SET lease_until = {} WHERE id = {}",
        db.ago(Duration::from_secs(1)),
        id.0
    ))
    .await;
    let b = RunningWorker::spawn(
        db.worker()
            .worker_id("B")
            .register::<Gated>()
            .data(gate.clone()),
    );
    wait_state(&client, id, TaskState::Succeeded).await;
    b.stop().await;
    let attempts = client.attempts(id).await.unwrap();
    assert_eq!(
        summary(&attempts),
        vec![
            (1, 1, AttemptOutcome::LeaseLost),
            (2, 3, AttemptOutcome::Succeeded)
        ]
    );
    assert_eq!(attempts[0].worker_id.as_deref(), Some("A"));
    assert_eq!(attempts[0].started_at, Some(a_started));
    assert_eq!(
        attempts[0].error.as_deref(),
        Some("lease expired (worker A, attempt 1)")
    );
    assert_eq!(attempts[1].worker_id.as_deref(), Some("B"));

    gate.0.add_permits(1);
    wait_until(
        Duration::from_secs(10),
        "A's write-back was fenced",
        || async { a.stats.snapshot().fenced == 1 },
    )
    .await;
    a.stop().await;
    assert_eq!(
        client.attempts(id).await.unwrap(),
        attempts,
        "nothing appended"
    );
}

async fn the_reaper_records_canceled_for_a_cancel_requested_lease<B: TestBackend>(db: Db<B>) {
    let client = Client::new(db.pool.clone());
    let id = Quick.enqueue(&db.pool).await.unwrap().id;
    // Claimed by a worker that died; a cancel was requested meanwhile.
    db.exec(&format!("UPDATE taskq_tasks SET state = 'running', attempt = 1, lease_epoch = 1, worker_id = 'gone',
           attempted_at = {},
           lease_until = {},
           cancel_requested_at = {} WHERE id = {}", db.ago(Duration::from_secs(60)), db.ago(Duration::from_secs(1)), db.now(), id.0)).await;
    // A worker that does not handle the task: only its reaper acts.
    let w = RunningWorker::spawn(db.worker().register::<Flaky>());
    wait_state(&client, id, TaskState::Canceled).await;
    w.stop().await;
    let attempts = client.attempts(id).await.unwrap();
    assert_eq!(summary(&attempts), vec![(1, 1, AttemptOutcome::Canceled)]);
    assert_eq!(attempts[0].worker_id.as_deref(), Some("gone"));
    let took = attempts[0].duration().unwrap();
    assert!(took >= Duration::from_secs(60), "{took:?}");
}

/// A task claimed before migration 10 (no `attempted_at`) gets an entry without a start.
async fn an_attempt_started_before_the_upgrade_has_no_start<B: TestBackend>(db: Db<B>) {
    let client = Client::new(db.pool.clone());
    let id = Quick.enqueue(&db.pool).await.unwrap().id;
    db.exec(&format!(
        "UPDATE taskq_tasks SET state = 'running', attempt = 1, lease_epoch = 1, worker_id = 'old',
           lease_until = {} WHERE id = {}",
        db.ago(Duration::from_secs(1)),
        id.0
    ))
    .await;
    let w = RunningWorker::spawn(db.worker().register::<Flaky>());
    wait_state(&client, id, TaskState::Pending).await;
    w.stop().await;
    let attempts = client.attempts(id).await.unwrap();
    assert_eq!(summary(&attempts), vec![(1, 1, AttemptOutcome::LeaseLost)]);
    assert_eq!(
        (attempts[0].started_at, attempts[0].duration()),
        (None, None)
    );
}

async fn a_task_given_back_at_shutdown_is_recorded_released<B: TestBackend>(db: Db<B>) {
    let client = Client::new(db.pool.clone());
    let gate = Gate(Arc::new(Semaphore::new(0)));
    let id = Gated { on_cancel: false }
        .enqueue(&db.pool)
        .await
        .unwrap()
        .id;
    let w = RunningWorker::spawn(
        db.worker()
            .worker_id("A")
            .register::<Gated>()
            .data(gate)
            .shutdown_timeout(Duration::from_millis(200)),
    );
    wait_state(&client, id, TaskState::Running).await;
    let report = w.stop().await;
    assert_eq!(report.released, vec![id]);
    let t = client.get(id).await.unwrap();
    assert_eq!(
        (t.state, t.attempt, t.lease_epoch),
        (TaskState::Pending, 0, 2)
    );
    let attempts = client.attempts(id).await.unwrap();
    assert_eq!(summary(&attempts), vec![(1, 1, AttemptOutcome::Released)]);
    assert_eq!(attempts[0].worker_id.as_deref(), Some("A"));
    assert_eq!(attempts[0].error, None);
}

async fn a_canceled_running_task_is_recorded_canceled_and_audited<B: TestBackend>(db: Db<B>) {
    let client = Client::new(db.pool.clone()).with_actor("ops:alice");
    let id = Gated { on_cancel: true }
        .enqueue(&db.pool)
        .await
        .unwrap()
        .id;
    let w = RunningWorker::spawn(
        db.worker()
            .register::<Gated>()
            .heartbeat(Duration::from_millis(200))
            .lease(Duration::from_secs(3)),
    );
    wait_state(&client, id, TaskState::Running).await;
    assert_eq!(client.cancel(id).await.unwrap(), Canceled::Requested);
    wait_state(&client, id, TaskState::Canceled).await;
    w.stop().await;
    let attempts = client.attempts(id).await.unwrap();
    assert_eq!(summary(&attempts), vec![(1, 1, AttemptOutcome::Canceled)]);
    assert_eq!(attempts[0].error, None);
    let audit = client
        .audit(&AuditFilter {
            task: Some(id),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(actions(&audit), vec![("ops:alice", "cancel_requested")]);
    assert_eq!(audit[0].queue.as_deref(), Some("default"));
}

async fn a_snooze_is_recorded_and_the_attempt_number_does_not_advance<B: TestBackend>(db: Db<B>) {
    let client = Client::new(db.pool.clone());
    let id = Sleepy.enqueue(&db.pool).await.unwrap().id;
    let w = RunningWorker::spawn(db.worker().register::<Sleepy>());
    wait_state(&client, id, TaskState::Succeeded).await;
    w.stop().await;
    assert_eq!(
        summary(&client.attempts(id).await.unwrap()),
        vec![
            (1, 1, AttemptOutcome::Snoozed),
            (1, 2, AttemptOutcome::Succeeded)
        ]
    );
    assert_eq!(client.get(id).await.unwrap().attempt, 1);
}

async fn error_texts_are_cut_and_the_history_keeps_the_latest_entries<B: TestBackend>(db: Db<B>) {
    let client = Client::new(db.pool.clone());
    let verbose = Verbose(3000).enqueue(&db.pool).await.unwrap().id;
    let quick = Quick.enqueue(&db.pool).await.unwrap().id;
    // A full history: entries for attempts 1..=100.
    let full: Vec<serde_json::Value> = (1..=taskq::defaults::MAX_ATTEMPT_ENTRIES as u64)
        .map(|n| {
            serde_json::json!({"attempt": n, "epoch": n, "worker": "old",
                "started_at": "2020-01-01 00:00:00.000000",
                "finished_at": "2020-01-01 00:00:01.000000", "outcome": "failed", "error": "x"})
        })
        .collect();
    db.exec(&format!(
        "UPDATE taskq_tasks SET attempts = '{}', lease_epoch = 100 WHERE id = {}",
        serde_json::Value::from(full),
        quick.0
    ))
    .await;
    let w = RunningWorker::spawn(db.worker().register::<Verbose>().register::<Quick>());
    wait_state(&client, verbose, TaskState::Dead).await;
    wait_state(&client, quick, TaskState::Succeeded).await;
    w.stop().await;

    let a = client.attempts(verbose).await.unwrap();
    assert_eq!(summary(&a), vec![(1, 1, AttemptOutcome::Failed)]);
    let e = a[0].error.as_deref().unwrap();
    assert_eq!(e.chars().count(), taskq::defaults::MAX_ATTEMPT_ERROR_CHARS);
    assert!(
        e.ends_with("é…"),
        "cut on a character: {}",
        &e[e.len() - 8..]
    );
    let last_error = client.get(verbose).await.unwrap().last_error.unwrap();
    assert_eq!(last_error, "é".repeat(3000), "last_error keeps more");

    let a = client.attempts(quick).await.unwrap();
    assert_eq!(a.len(), taskq::defaults::MAX_ATTEMPT_ENTRIES);
    assert_eq!((a[0].attempt, a[0].epoch), (2, 2), "the oldest entry went");
    assert_eq!(
        summary(&a[a.len() - 1..]),
        vec![(1, 101, AttemptOutcome::Succeeded)]
    );
}

async fn retention_deletes_the_task_with_its_history_and_old_audit_rows<B: TestBackend>(db: Db<B>) {
    let client = Client::new(db.pool.clone());
    let id = Flaky.enqueue(&db.pool).await.unwrap().id;
    let w = RunningWorker::spawn(db.worker().register::<Flaky>());
    wait_state(&client, id, TaskState::Succeeded).await;
    w.stop().await;
    assert_eq!(client.attempts(id).await.unwrap().len(), 3);
    db.exec(&format!(
        "UPDATE taskq_tasks SET finished_at = {} WHERE id = {}",
        db.ago(Duration::from_secs(7200)),
        id.0
    ))
    .await;
    // Two audit rows: one older than the longest retention (1 day), one newer.
    let mut tx = db.begin().await;
    let old = client
        .record_audit(&mut tx, "create", Some(id), None, serde_json::Value::Null)
        .await
        .unwrap();
    let new = client
        .record_audit(
            &mut tx,
            "note",
            None,
            Some("default"),
            serde_json::json!({"n": 1}),
        )
        .await
        .unwrap();
    tx.commit().await.unwrap();
    db.exec(&format!(
        "UPDATE taskq_audit SET at = {} WHERE id = {}",
        db.ago(Duration::from_secs(172800)),
        old
    ))
    .await;

    let w = RunningWorker::spawn(db.worker().register::<Flaky>().retention(Retention {
        succeeded: Some(Duration::from_secs(3600)),
        dead: Some(Duration::from_secs(3600)),
        canceled: Some(Duration::from_secs(3600)),
        expired: Some(Duration::from_secs(86_400)),
        interval: Duration::from_millis(50),
    }));
    wait_until(
        Duration::from_secs(10),
        "retention deleted the task",
        || async { matches!(client.get(id).await, Err(Error::NotFound(_))) },
    )
    .await;
    wait_until(
        Duration::from_secs(10),
        "the old audit row is gone",
        || async {
            let ids: Vec<u64> = client
                .audit(&AuditFilter::default())
                .await
                .unwrap()
                .iter()
                .map(|e| e.id)
                .collect();
            ids == vec![new]
        },
    )
    .await;
    w.stop().await;
    assert!(matches!(client.attempts(id).await, Err(Error::NotFound(t)) if t == id));
    let n = db.count("1 = 1").await;
    assert_eq!(n, 0, "the history went with its row");
}

fn actions(entries: &[AuditEntry]) -> Vec<(&str, &str)> {
    entries
        .iter()
        .map(|e| (e.actor.as_str(), e.action.as_str()))
        .collect()
}

async fn operator_actions_are_audited_with_their_actor<B: TestBackend>(db: Db<B>) {
    let plain = Client::new(db.pool.clone());
    assert_eq!(plain.actor(), taskq::defaults::DEFAULT_ACTOR);
    let client = plain.clone().with_actor("cli:bob@ops-1");
    let before = db_now(&client).await;

    let a = Quick.enqueue(&db.pool).await.unwrap().id;
    let b = Quick.enqueue(&db.pool).await.unwrap().id;
    let dead = Quick.enqueue(&db.pool).await.unwrap().id;
    db.exec(&format!(
        "UPDATE taskq_tasks SET state = 'dead', finished_at = {} WHERE id = {}",
        db.now(),
        dead.0
    ))
    .await;
    client.reschedule(a, Duration::from_secs(60)).await.unwrap();
    client.set_priority(a, -5).await.unwrap();
    assert_eq!(client.cancel(a).await.unwrap(), Canceled::Now);
    client.retry_dead(dead).await.unwrap();
    // Refused actions change nothing and are not recorded.
    assert!(matches!(
        client.cancel(a).await,
        Err(Error::WrongState { .. })
    ));
    assert!(matches!(
        client.retry_dead(b).await,
        Err(Error::WrongState { .. })
    ));
    assert!(matches!(
        client.cancel(TaskId(987_654)).await,
        Err(Error::NotFound(_))
    ));
    client.pause_queue("mail").await.unwrap();
    assert!(client.resume_queue("mail").await.unwrap());
    assert!(
        !client.resume_queue("mail").await.unwrap(),
        "not paused: not recorded"
    );
    plain.pause_queue("other").await.unwrap();

    let all = client.audit(&AuditFilter::default()).await.unwrap();
    assert_eq!(
        actions(&all),
        vec![
            ("client", "pause"),
            ("cli:bob@ops-1", "resume"),
            ("cli:bob@ops-1", "pause"),
            ("cli:bob@ops-1", "retry"),
            ("cli:bob@ops-1", "cancel"),
            ("cli:bob@ops-1", "priority"),
            ("cli:bob@ops-1", "reschedule"),
        ],
        "newest first"
    );
    let after = db_now(&client).await;
    for e in &all {
        assert!(before <= e.at && e.at <= after, "{e:?}");
    }
    let reschedule = &all[6];
    assert_eq!(reschedule.task_id, Some(a));
    assert_eq!(
        reschedule.queue.as_deref(),
        Some("default"),
        "the task's queue"
    );
    assert_eq!(reschedule.detail, serde_json::json!({ "delay_ms": 60_000 }));
    assert_eq!(all[5].detail, serde_json::json!({ "priority": -5 }));
    assert_eq!(all[4].detail, serde_json::Value::Null);
    assert_eq!(all[3].task_id, Some(dead));
    assert_eq!(
        (all[2].task_id, all[2].queue.as_deref()),
        (None, Some("mail"))
    );

    // Filters and paging.
    let of_a = client
        .audit(&AuditFilter {
            task: Some(a),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(of_a.len(), 3);
    let mail = client
        .audit(&AuditFilter {
            queue: Some("mail".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        actions(&mail),
        vec![("cli:bob@ops-1", "resume"), ("cli:bob@ops-1", "pause")]
    );
    let page = client
        .audit(&AuditFilter {
            before_id: Some(all[1].id),
            limit: Some(2),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        page.iter().map(|e| e.id).collect::<Vec<_>>(),
        vec![all[2].id, all[3].id]
    );

    // Bulk operations: one entry with the filter and the counts; a dry run is not recorded.
    for _ in 0..3 {
        Quick.with_queue("bulk").enqueue(&db.pool).await.unwrap();
    }
    let filter = BulkFilter {
        queue: Some("bulk".into()),
        ..Default::default()
    };
    assert_eq!(
        client.cancel_where(&filter, true).await.unwrap().canceled,
        3
    );
    assert_eq!(
        client.cancel_where(&filter, false).await.unwrap().canceled,
        3
    );
    assert_eq!(
        client.cancel_where(&filter, false).await.unwrap().canceled,
        0
    );
    let n = client
        .purge(Some(TaskState::Canceled), Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(n, 4);
    let latest = client
        .audit(&AuditFilter {
            limit: Some(2),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        actions(&latest),
        vec![("cli:bob@ops-1", "purge"), ("cli:bob@ops-1", "bulk_cancel")]
    );
    assert_eq!(
        latest[0].detail,
        serde_json::json!({ "state": "canceled", "older_than_secs": 0, "purged": 4 })
    );
    assert_eq!(latest[1].queue.as_deref(), Some("bulk"));
    assert_eq!(latest[1].detail["canceled"], 3);
    assert_eq!(latest[1].detail["cancel_requested"], 0);
    assert_eq!(latest[1].detail["queue"], "bulk");

    // An application's own entry commits or rolls back with its transaction.
    let mut tx = db.begin().await;
    client
        .record_audit(&mut tx, "create", Some(b), None, serde_json::Value::Null)
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    let mut tx = db.begin().await;
    client
        .record_audit(
            &mut tx,
            "create",
            Some(b),
            None,
            serde_json::json!({"via": "web"}),
        )
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let of_b = client
        .audit(&AuditFilter {
            task: Some(b),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(actions(&of_b), vec![("cli:bob@ops-1", "create")]);
    assert_eq!(of_b[0].detail, serde_json::json!({"via": "web"}));
    let mut conn = db.pool.acquire().await.unwrap();
    assert!(matches!(
        client
            .record_audit(&mut conn, "", None, None, serde_json::Value::Null)
            .await,
        Err(Error::InvalidName { .. })
    ));
    assert!(matches!(
        client.attempts(TaskId(987_654)).await,
        Err(Error::NotFound(_))
    ));
}

/// Sets task `id` to `state`, due `run_at_s` seconds from now (negative: ago), finished
/// `finished_ago_s` seconds ago (terminal states), with one history entry per
/// `(outcome, ended seconds ago)`.
async fn craft<B: TestBackend>(
    db: &Db<B>,
    id: TaskId,
    state: &str,
    run_at_s: i64,
    finished_ago_s: Option<i64>,
    entries: &[(&str, i64)],
) {
    // The history in the stored format (the same JSON text on both backends), its times
    // from the database clock.
    let now = db.server_now().await;
    let at = |ago: i64| {
        (now - chrono::Duration::seconds(ago))
            .format("%Y-%m-%d %H:%M:%S%.6f")
            .to_string()
    };
    // Every entry is an attempt the task started (its count, as a claim keeps it).
    let attempts = entries.len();
    let entries: Vec<serde_json::Value> = entries
        .iter()
        .enumerate()
        .map(|(i, (outcome, ago))| {
            serde_json::json!({
                "attempt": i + 1, "epoch": i + 1, "worker": "w",
                "started_at": at(ago + 1), "finished_at": at(*ago),
                "outcome": outcome, "error": null,
            })
        })
        .collect();
    let secs = |s: i64| B::shift_sql(db.now(), s * 1_000_000);
    let finished = finished_ago_s.map_or("NULL".to_owned(), |s| secs(-s));
    let lease = if state == "running" {
        secs(60)
    } else {
        "NULL".to_owned()
    };
    db.exec(&format!(
        "UPDATE taskq_tasks SET state = '{state}', run_at = {},
           finished_at = {finished}, lease_until = {lease}, attempts = '{}', attempt = {}
         WHERE id = {}",
        secs(run_at_s),
        serde_json::Value::from(entries),
        attempts,
        id.0
    ))
    .await;
}

/// `(outcome, minutes ago, count)`, sorted.
async fn failed_per_minute(client: &Client, minutes: u32) -> Vec<(String, u32, u64)> {
    let mut v: Vec<(String, u32, u64)> = client
        .failed_attempts_per_minute(minutes)
        .await
        .unwrap()
        .into_iter()
        .map(|p| (p.outcome.to_string(), p.minutes_ago, p.count))
        .collect();
    v.sort();
    v
}

async fn failed_attempts_per_minute_counts_the_histories_in_the_window<B: TestBackend>(db: Db<B>) {
    let client = Client::new(db.pool.clone());
    // Real attempts: two failures then a success, a timeout, a panic (all in the last minute).
    let flaky = Flaky.enqueue(&db.pool).await.unwrap().id;
    let slow = Slow.enqueue(&db.pool).await.unwrap().id;
    let boom = Boom.enqueue(&db.pool).await.unwrap().id;
    let w = RunningWorker::spawn(
        db.worker()
            .register::<Flaky>()
            .register::<Slow>()
            .register::<Boom>()
            .cancel_grace(Duration::from_millis(50)),
    );
    wait_state(&client, flaky, TaskState::Succeeded).await;
    wait_state(&client, slow, TaskState::Dead).await;
    wait_state(&client, boom, TaskState::Dead).await;
    w.stop().await;
    assert_eq!(
        failed_per_minute(&client, 15).await,
        vec![
            ("failed".into(), 0, 2),
            ("panicked".into(), 0, 1),
            ("timed_out".into(), 0, 1)
        ]
    );

    // Crafted histories, minutes from the database clock (each entry 10 s into its minute).
    let mut ids = Vec::new();
    for _ in 0..6 {
        ids.push(Quick.enqueue(&db.pool).await.unwrap().id);
    }
    // Pending again after a failure 3 min ago (its backoff ended 2 min ago): counted.
    craft(&db, ids[0], "pending", -120, None, &[("failed", 190)]).await;
    // Running its third attempt: a lease lost 5 min ago and a failure 1 min ago; snoozes and
    // releases are not failures.
    craft(
        &db,
        ids[1],
        "running",
        -60,
        None,
        &[
            ("lease_lost", 310),
            ("snoozed", 250),
            ("released", 200),
            ("failed", 70),
        ],
    )
    .await;
    // Dead 4 min ago after a timeout 20 min ago (outside 15 min) and a failure 4 min ago.
    craft(
        &db,
        ids[2],
        "dead",
        -1300,
        Some(250),
        &[("timed_out", 1210), ("failed", 250)],
    )
    .await;
    // Succeeded 30 min ago after a failure 31 min ago: outside 15 min, inside 60.
    craft(
        &db,
        ids[3],
        "succeeded",
        -1900,
        Some(1810),
        &[("failed", 1870), ("succeeded", 1810)],
    )
    .await;
    // Canceled 2 min ago; its failure 7 min ago counts.
    craft(
        &db,
        ids[4],
        "canceled",
        -400,
        Some(130),
        &[("panicked", 430)],
    )
    .await;
    // A scheduled task that never ran: read (due in the future) but nothing to count.
    craft(&db, ids[5], "pending", 3600, None, &[]).await;

    let mut want: Vec<(String, u32, u64)> = vec![
        ("failed".into(), 0, 2),
        ("panicked".into(), 0, 1),
        ("timed_out".into(), 0, 1),
        ("failed".into(), 3, 1),
        ("lease_lost".into(), 5, 1),
        ("failed".into(), 1, 1),
        ("failed".into(), 4, 1),
        ("panicked".into(), 7, 1),
    ];
    want.sort();
    assert_eq!(failed_per_minute(&client, 15).await, want);
    let mut wider = want.clone();
    wider.extend([("timed_out".into(), 20, 1), ("failed".into(), 31, 1)]);
    wider.sort();
    assert_eq!(failed_per_minute(&client, 60).await, wider);
    // A 2-minute window: minutes 0 and 1 only.
    assert_eq!(
        failed_per_minute(&client, 2).await,
        vec![
            ("failed".into(), 0, 2),
            ("failed".into(), 1, 1),
            ("panicked".into(), 0, 1),
            ("timed_out".into(), 0, 1)
        ]
    );
}

taskq_tests::conformance!(
    a_task_that_fails_twice_then_succeeds_has_three_entries,
    timeouts_and_panics_are_recorded_as_such,
    a_lost_lease_is_recorded_by_the_reaper_and_a_fenced_write_back_appends_nothing,
    the_reaper_records_canceled_for_a_cancel_requested_lease,
    an_attempt_started_before_the_upgrade_has_no_start,
    a_task_given_back_at_shutdown_is_recorded_released,
    a_canceled_running_task_is_recorded_canceled_and_audited,
    a_snooze_is_recorded_and_the_attempt_number_does_not_advance,
    error_texts_are_cut_and_the_history_keeps_the_latest_entries,
    retention_deletes_the_task_with_its_history_and_old_audit_rows,
    operator_actions_are_audited_with_their_actor,
    failed_attempts_per_minute_counts_the_histories_in_the_window,
);
