//! Durable follow-ups and outcome observers against a real database: a death enqueues exactly
//! one `on_dead` task in the write-back's (or the reaper's) transaction, a fenced write-back
//! enqueues none, `on_success` chains pass the payload along, a follow-up that cannot be built
//! does not hold the death back, a reaper that does not register a task's name leaves its
//! last attempt to one that does, and observers see every outcome (a panicking one included).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use taskq::{
    Client, Data, DeadTask, SucceededTask, Task, TaskContext, TaskError, TaskId, TaskState,
    followup::{FollowUp, OnDead, OnSuccess},
    worker::OutcomeEvent,
    worker::TaskOutcome,
};
use taskq_tests::backends::{Db, TestBackend, blob};
use taskq_tests::{RunningWorker, wait_until};
use tokio::sync::Semaphore;

/// What the follow-up handlers received, in order.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<(String, Value)>>>);

impl Seen {
    fn push(&self, who: &str, v: impl serde::Serialize) {
        let v = serde_json::to_value(v).unwrap();
        self.0.lock().unwrap().push((who.to_owned(), v));
    }
    fn of(&self, who: &str) -> Vec<Value> {
        let all = self.0.lock().unwrap();
        all.iter()
            .filter(|(w, _)| w == who)
            .map(|(_, v)| v.clone())
            .collect()
    }
}

/// Handlers of `Gated` wait here until the test adds permits.
#[derive(Clone)]
struct Gate(Arc<Semaphore>);

// ---------------------------------------------------------------------------------------------
// Tasks

/// Always fails: dies once its two attempts are used up.
#[taskq::task(queue = "exports", max_attempts = 2, backoff = "constant(10ms)", on_dead = notify_ops)]
async fn flaky_export(order_id: i64) -> Result<(), TaskError> {
    Err(TaskError::msg(format!(
        "warehouse down for order {order_id}"
    )))
}

/// The `on_dead` target: records what it was handed.
#[taskq::task(queue = "ops", priority = -5, max_attempts = 3)]
async fn notify_ops(dead: DeadTask, seen: Data<Seen>) -> Result<(), TaskError> {
    seen.push("notify_ops", &dead);
    Ok(())
}

/// First step of a chain.
#[taskq::task(on_success = step_two)]
async fn step_one(n: i64) -> Result<(), TaskError> {
    let _ = n;
    Ok(())
}

/// Second step: gets the first step's payload, and is itself chained.
#[taskq::task(on_success = self::step_three)]
async fn step_two(prev: SucceededTask, seen: Data<Seen>) -> Result<(), TaskError> {
    seen.push("step_two", &prev);
    Ok(())
}

/// Last step.
#[taskq::task]
async fn step_three(prev: SucceededTask, seen: Data<Seen>) -> Result<(), TaskError> {
    seen.push("step_three", &prev);
    Ok(())
}

/// Waits at the gate, then fails; one attempt only, so the failure is a death.
#[taskq::task(max_attempts = 1, on_dead = notify_ops)]
async fn gated(n: i64, gate: Data<Gate>) -> Result<(), TaskError> {
    let _permit = gate.0.0.acquire().await.unwrap(); // ignores its cancel signal on purpose
    Err(TaskError::msg(format!("gated {n} failed")))
}

/// Like `gated` but with attempts left: the reaper sends it back to pending.
#[taskq::task(max_attempts = 5, on_dead = notify_ops)]
async fn gated_retry(n: i64, gate: Data<Gate>) -> Result<(), TaskError> {
    let _permit = gate.0.0.acquire().await.unwrap();
    Err(TaskError::msg(format!("gated_retry {n} failed")))
}

/// Unique while running: its death frees its identity in the same transaction as the
/// follow-up is inserted.
#[taskq::task(unique(while = "running"), max_attempts = 1, on_dead = notify_ops)]
async fn unique_export(order_id: i64) -> Result<(), TaskError> {
    Err(TaskError::msg(format!("order {order_id} failed")))
}

/// A task the worker of a reaper test registers instead of the dying task.
#[taskq::task]
async fn unrelated() -> Result<(), TaskError> {
    Ok(())
}

/// A hand-written task with an `ON_DEAD` hook; its payload may not decode.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Hand {
    fail: String,
}

impl Task for Hand {
    const NAME: &'static str = "hand";
    const ON_DEAD: Option<OnDead> =
        Some(|dead| Some(FollowUp::new(NotifyOps { dead: dead.clone() })));
    async fn run(self, _cx: TaskContext) -> Result<(), TaskError> {
        Err(TaskError::permanent(self.fail))
    }
}

/// A hand-written task whose `ON_DEAD` hook panics.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct BadHook;

impl Task for BadHook {
    const NAME: &'static str = "bad_hook";
    const ON_DEAD: Option<OnDead> = Some(|_| panic!("the hook is broken"));
    async fn run(self, _cx: TaskContext) -> Result<(), TaskError> {
        Err(TaskError::permanent("no"))
    }
}

/// Succeeds, fails once then succeeds, snoozes once then succeeds, or fails permanently.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
enum Mixed {
    Ok,
    FailOnce,
    SnoozeOnce,
    Permanent,
}

impl Task for Mixed {
    const NAME: &'static str = "mixed";
    const BACKOFF: taskq::Backoff = taskq::Backoff::constant(Duration::from_millis(10));
    async fn run(self, cx: TaskContext) -> Result<(), TaskError> {
        match self {
            Mixed::Ok => Ok(()),
            Mixed::FailOnce if cx.attempt() == 1 => Err(TaskError::msg("first try fails")),
            Mixed::SnoozeOnce if cx.snoozes() == 0 => {
                Err(TaskError::snooze(Duration::from_millis(10)))
            }
            Mixed::Permanent => Err(TaskError::permanent("never")),
            _ => Ok(()),
        }
    }
}

/// Succeeds; its `on_success` follow-up carries `size` bytes of filler: a follow-up as big as
/// a test wants, whatever the task's own payload.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Big {
    n: u32,
    size: usize,
}

impl Task for Big {
    const NAME: &'static str = "big";
    const ON_SUCCESS: Option<OnSuccess> = Some(|done| {
        let size = done.payload["size"].as_u64()? as usize;
        Some(FollowUp::new(Filler {
            from: done.id.0,
            fill: "x".repeat(size),
        }))
    });
    async fn run(self, _cx: TaskContext) -> Result<(), TaskError> {
        Ok(())
    }
}

/// Its last attempt is reaped to dead (the tests plant it running with an expired lease); its
/// `on_dead` follow-up carries `size` bytes of filler.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct BigDead {
    n: u32,
    size: usize,
}

impl Task for BigDead {
    const NAME: &'static str = "big_dead";
    const MAX_ATTEMPTS: u32 = 1;
    const ON_DEAD: Option<OnDead> = Some(|dead| {
        let size = dead.payload["size"].as_u64()? as usize;
        Some(FollowUp::new(Filler {
            from: dead.id.0,
            fill: "x".repeat(size),
        }))
    });
    async fn run(self, _cx: TaskContext) -> Result<(), TaskError> {
        Err(TaskError::permanent("never runs here"))
    }
}

/// The follow-up of `Big` and `BigDead`; no worker of these tests runs it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Filler {
    from: u64,
    fill: String,
}

impl Task for Filler {
    const NAME: &'static str = "filler";
    async fn run(self, _cx: TaskContext) -> Result<(), TaskError> {
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Helpers

/// A row of `taskq_tasks` as the tests look at it.
#[derive(Debug)]
struct Row {
    queue: String,
    priority: i16,
    max_attempts: u32,
    state: String,
    key: Option<String>,
    payload: Value,
}

async fn rows<B: TestBackend>(db: &Db<B>, name: &str) -> Vec<Row> {
    let ids = db
        .ints(&format!(
            "SELECT id FROM taskq_tasks WHERE name = '{name}' ORDER BY id"
        ))
        .await;
    let mut rows = Vec::new();
    for id in ids {
        let col = |c: &str| format!("SELECT {c} FROM taskq_tasks WHERE id = {id}");
        let text = |c: &str| col(&format!("CAST({c} AS CHAR(255))"));
        rows.push(Row {
            queue: db.text(&text("queue")).await.unwrap(),
            priority: db.scalar(&col("priority")).await.try_into().unwrap(),
            max_attempts: db.scalar(&col("max_attempts")).await.try_into().unwrap(),
            state: db.text(&text("state")).await.unwrap(),
            key: db.text(&text("idempotency_key")).await,
            payload: serde_json::from_slice(&db.blobs(&col("payload")).await[0]).unwrap(),
        });
    }
    rows
}

async fn epoch<B: TestBackend>(db: &Db<B>, id: TaskId) -> u64 {
    db.scalar(&format!(
        "SELECT lease_epoch FROM taskq_tasks WHERE id = {}",
        id.0
    ))
    .await
    .try_into()
    .unwrap()
}

async fn expire_leases<B: TestBackend>(db: &Db<B>) {
    db.exec(&format!(
        "UPDATE taskq_tasks SET lease_until = {}
         WHERE state = 'running'",
        db.ago(Duration::from_secs(1))
    ))
    .await;
}

/// A worker that holds what it claims: long lease, rare heartbeat, no reaper, long grace.
fn holding_worker<B: TestBackend>(db: &Db<B>, id: &str) -> taskq::worker::WorkerBuilder {
    db.worker()
        .worker_id(id)
        .lease(Duration::from_secs(60))
        .heartbeat(Duration::from_secs(25))
        .reaper_interval(Duration::from_secs(3600))
        .cancel_grace(Duration::from_secs(30))
        .write_back_delay(Duration::from_millis(300))
        .shutdown_timeout(Duration::from_millis(200))
}

// ---------------------------------------------------------------------------------------------
// Tests

async fn a_death_enqueues_exactly_one_follow_up_with_the_dead_tasks_fields<B: TestBackend>(
    db: Db<B>,
) {
    let client = Client::new(db.pool.clone());
    let seen = Seen::default();
    let id = FlakyExport { order_id: 7 }
        .enqueue(&db.pool)
        .await
        .unwrap()
        .id;
    let w = RunningWorker::spawn(
        db.worker()
            .register::<FlakyExport>()
            .register::<NotifyOps>()
            .data(seen.clone()),
    );
    wait_until(Duration::from_secs(15), "notify_ops ran", || async {
        !seen.of("notify_ops").is_empty()
    })
    .await;
    let dead = client.get(id).await.unwrap();
    assert_eq!(dead.state, TaskState::Dead);
    let follow = rows(&db, "notify_ops").await;
    assert_eq!(follow.len(), 1, "{follow:?}");
    let f = &follow[0];
    // The target's own queue, priority and attempts; the key names the attempt that died.
    assert_eq!(
        (f.queue.as_str(), f.priority, f.max_attempts),
        ("ops", -5, 3)
    );
    assert_eq!(
        f.key.as_deref(),
        Some(format!("taskq:on_dead:{}:{}", id.0, dead.lease_epoch).as_str())
    );
    let expected = json!({
        "id": id.0,
        "name": "flaky_export",
        "queue": "exports",
        "attempts": 2,
        "max_attempts": 2,
        "last_error": "warehouse down for order 7 (attempts exhausted: 2/2)",
        "payload": {"order_id": 7},
    });
    assert_eq!(f.payload, json!({ "dead": expected }));
    assert_eq!(seen.of("notify_ops"), vec![expected]);
    assert_eq!(
        dead.last_error.as_deref(),
        Some("warehouse down for order 7 (attempts exhausted: 2/2)")
    );
    let stats = w.stop().await.stats;
    assert_eq!(
        (stats.dead, stats.follow_ups, stats.follow_up_errors),
        (1, 1, 0)
    );
    assert_eq!(
        db.count("name = 'notify_ops' AND state = 'succeeded'")
            .await,
        1
    );
}

async fn hand_written_hooks_follow_permanent_and_undecodable_deaths<B: TestBackend>(db: Db<B>) {
    let seen = Seen::default();
    let a = Hand {
        fail: "bad input".into(),
    }
    .enqueue(&db.pool)
    .await
    .unwrap()
    .id;
    // A payload that is not JSON at all: the task dies undecodable, its follow-up gets the
    // bytes as a JSON string.
    let now = db.now();
    db.exec(&format!(
        "INSERT INTO taskq_tasks (queue, name, payload, state, max_attempts, run_at, created_at, updated_at)
         VALUES ('default', 'hand', {}, 'pending', 5, {now}, {now}, {now})",
        blob(b"not json")
    ))
    .await;
    let b = db.scalar("SELECT MAX(id) FROM taskq_tasks").await as u64;
    let w = RunningWorker::spawn(
        db.worker()
            .register::<Hand>()
            .register::<NotifyOps>()
            .data(seen.clone()),
    );
    wait_until(Duration::from_secs(15), "both follow-ups ran", || async {
        seen.of("notify_ops").len() == 2
    })
    .await;
    let mut got = seen.of("notify_ops");
    got.sort_by_key(|v| v["id"].as_u64());
    assert_eq!(got[0]["id"], json!(a.0));
    assert_eq!(got[0]["last_error"], json!("bad input"));
    assert_eq!(got[0]["attempts"], json!(1));
    assert_eq!(got[0]["payload"], json!({"fail": "bad input"}));
    assert_eq!(got[1]["id"], json!(b));
    assert_eq!(got[1]["payload"], json!("not json"));
    assert!(
        got[1]["last_error"]
            .as_str()
            .unwrap()
            .contains("does not decode"),
        "{got:?}"
    );
    let stats = w.stop().await.stats;
    assert_eq!((stats.dead, stats.follow_ups), (2, 2));
    assert_eq!(rows(&db, "notify_ops").await.len(), 2);
}

async fn a_follow_up_that_cannot_be_built_does_not_hold_the_death_back<B: TestBackend>(db: Db<B>) {
    let client = Client::new(db.pool.clone());
    let id = BadHook.enqueue(&db.pool).await.unwrap().id;
    let w = RunningWorker::spawn(db.worker().register::<BadHook>());
    wait_until(Duration::from_secs(10), "the task died", || async {
        client.get(id).await.unwrap().state == TaskState::Dead
    })
    .await;
    let stats = w.stop().await.stats;
    assert_eq!(
        (stats.dead, stats.follow_ups, stats.follow_up_errors),
        (1, 0, 1)
    );
    assert_eq!(db.count("id <> 0").await, 1, "nothing else was enqueued");
}

async fn a_fenced_write_back_enqueues_no_follow_up<B: TestBackend>(db: Db<B>) {
    let client = Client::new(db.pool.clone());
    let gate = Gate(Arc::new(Semaphore::new(0)));
    let stale = Gated { n: 1 }.enqueue(&db.pool).await.unwrap().id;
    let live = Gated { n: 2 }.enqueue(&db.pool).await.unwrap().id;
    // Holds both; its write-backs of the two deaths go out in one batch (300 ms write-back delay).
    let a = RunningWorker::spawn(
        holding_worker(&db, "A")
            .register::<Gated>()
            .data(gate.clone()),
    );
    wait_until(Duration::from_secs(10), "A holds both tasks", || async {
        db.count("state = 'running'").await == 2
    })
    .await;
    // Another holder took `stale` over meanwhile (its epoch moved, still running).
    db.exec(&format!(
        "UPDATE taskq_tasks SET lease_epoch = lease_epoch + 1 WHERE id = {}",
        stale.0
    ))
    .await;
    gate.0.add_permits(2);
    wait_until(Duration::from_secs(10), "both write-backs done", || async {
        let s = a.stats.snapshot();
        s.fenced + s.dead == 2
    })
    .await;
    let stats = a.stop().await.stats;
    assert_eq!(
        (
            stats.fenced,
            stats.dead,
            stats.follow_ups,
            stats.ack_flushes
        ),
        (1, 1, 1, 1),
        "both outcomes in one batch"
    );
    assert_eq!(client.get(stale).await.unwrap().state, TaskState::Running);
    assert_eq!(client.get(live).await.unwrap().state, TaskState::Dead);
    let follow = rows(&db, "notify_ops").await;
    assert_eq!(follow.len(), 1, "{follow:?}");
    assert_eq!(follow[0].payload["dead"]["id"], json!(live.0));
    assert_eq!(
        follow[0].state, "pending",
        "no worker handles notify_ops here"
    );
}

async fn a_reaped_last_attempt_gets_one_follow_up_from_a_reaper_that_registers_it<
    B: TestBackend,
>(
    db: Db<B>,
) {
    let client = Client::new(db.pool.clone());
    let gate = Gate(Arc::new(Semaphore::new(0)));
    let last = Gated { n: 1 }.enqueue(&db.pool).await.unwrap().id;
    let retry = GatedRetry { n: 2 }.enqueue(&db.pool).await.unwrap().id;
    // Two slots, both kept by the blocked handlers: A cannot claim a reaped task back.
    let a = RunningWorker::spawn(
        holding_worker(&db, "A")
            .queue("default", 2)
            .register::<Gated>()
            .register::<GatedRetry>()
            .data(gate.clone()),
    );
    wait_until(Duration::from_secs(10), "A holds both tasks", || async {
        db.count("state = 'running'").await == 2
    })
    .await;
    let epoch_last = epoch(&db, last).await;
    expire_leases(&db).await; // as if A were paused

    // B registers `gated`: it reaps the last attempt to dead with its follow-up, and runs it.
    let seen = Seen::default();
    let b_events: Arc<Mutex<Vec<OutcomeEvent>>> = Arc::default();
    let sink = b_events.clone();
    let b = RunningWorker::spawn(
        db.worker()
            .worker_id("B")
            .queue("ops", 2)
            .register::<Gated>()
            .register::<NotifyOps>()
            .data(seen.clone())
            .data(gate.clone())
            .on_outcome(move |e| sink.lock().unwrap().push(e.clone())),
    );
    wait_until(Duration::from_secs(10), "the follow-up ran", || async {
        !seen.of("notify_ops").is_empty()
    })
    .await;
    let dead = client.get(last).await.unwrap();
    assert_eq!(dead.state, TaskState::Dead);
    // The task with attempts left goes back to pending (B does not register its name).
    assert_eq!(client.get(retry).await.unwrap().state, TaskState::Pending);
    assert_eq!(
        seen.of("notify_ops"),
        vec![json!({
            "id": last.0,
            "name": "gated",
            "queue": "default",
            "attempts": 1,
            "max_attempts": 1,
            "last_error": "lease expired (worker A, attempt 1)",
            "payload": {"n": 1},
        })]
    );
    let follow = rows(&db, "notify_ops").await;
    assert_eq!(follow.len(), 1);
    assert_eq!(
        follow[0].key.as_deref(),
        Some(format!("taskq:on_dead:{}:{epoch_last}", last.0).as_str())
    );
    {
        let events = b_events.lock().unwrap();
        let reaped: Vec<_> = events.iter().filter(|e| e.task_id == last).collect();
        assert_eq!(reaped.len(), 1, "{events:?}");
        assert_eq!(reaped[0].outcome, TaskOutcome::Reaped(TaskState::Dead));
        assert!(reaped[0].follow_up);
    }

    // A's late write-back of the same death is fenced: still one follow-up.
    gate.0.add_permits(2);
    wait_until(
        Duration::from_secs(10),
        "A's write-backs were fenced",
        || async { a.stats.snapshot().fenced == 2 },
    )
    .await;
    let a_stats = a.stop().await.stats;
    assert_eq!((a_stats.follow_ups, a_stats.dead), (0, 0));
    let b_stats = b.stop().await.stats;
    assert_eq!(b_stats.follow_ups, 1);
    assert_eq!(rows(&db, "notify_ops").await.len(), 1);
}

/// A last attempt whose lease expired while no live worker registers its name: a reaper that
/// does not register it cannot know its `on_dead` follow-up, so it parks the task back to
/// pending (it no longer stays `running`, nor counts against its queue's limit); the first
/// worker that registers the name claims it and ends it dead with its follow-up, without
/// running the handler again.
async fn a_last_attempt_no_live_worker_registers_is_parked_then_buried_unrun<B: TestBackend>(
    db: Db<B>,
) {
    let client = Client::new(db.pool.clone());
    let gate = Gate(Arc::new(Semaphore::new(0))); // a handler that ran would block here
    let last = Gated { n: 1 }.enqueue(&db.pool).await.unwrap().id;
    let retry = GatedRetry { n: 2 }.enqueue(&db.pool).await.unwrap().id;
    // Worker A claimed both (attempt 1; `gated` has one attempt) and died.
    db.exec(&format!(
        "UPDATE taskq_tasks SET state = 'running', attempt = 1, lease_epoch = 1,
           worker_id = 'A', lease_until = {}",
        db.ago(Duration::from_secs(1))
    ))
    .await;
    // C registers neither name: the task with attempts left goes back to pending as usual, the
    // last attempt is parked (pending, attempt still 1 of 1).
    let c_events: Arc<Mutex<Vec<OutcomeEvent>>> = Arc::default();
    let sink = c_events.clone();
    let c = RunningWorker::spawn(
        db.worker()
            .worker_id("C")
            .register::<Unrelated>()
            .on_outcome(move |e| sink.lock().unwrap().push(e.clone())),
    );
    wait_until(Duration::from_secs(10), "C reaped both", || async {
        db.count("state = 'pending'").await == 2
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await; // more reaper rounds: nothing else
    assert_eq!(c.stop().await.stats.reaped, 2);
    let parked = client.get(last).await.unwrap();
    assert_eq!(
        (parked.state, parked.attempt, parked.lease_epoch),
        (TaskState::Pending, 1, 2)
    );
    assert!(parked.finished_at.is_none());
    assert_eq!(
        parked.last_error.as_deref(),
        Some("lease expired (worker A, attempt 1)")
    );
    assert_eq!(db.count("state = 'running'").await, 0);
    {
        let events = c_events.lock().unwrap();
        assert_eq!(events.len(), 2, "{events:?}");
        assert!(
            events
                .iter()
                .all(|e| e.outcome == TaskOutcome::Reaped(TaskState::Pending))
        );
    }
    assert_eq!(client.get(retry).await.unwrap().state, TaskState::Pending);

    // B registers `gated`: it claims the parked task and ends it dead with its follow-up,
    // without running the handler (which would wait at the closed gate forever).
    let seen = Seen::default();
    let b_events: Arc<Mutex<Vec<OutcomeEvent>>> = Arc::default();
    let sink = b_events.clone();
    let b = RunningWorker::spawn(
        db.worker()
            .worker_id("B")
            .queue("default", 2)
            .queue("ops", 2)
            .register::<Gated>()
            .register::<NotifyOps>()
            .data(seen.clone())
            .data(gate.clone())
            .on_outcome(move |e| sink.lock().unwrap().push(e.clone())),
    );
    wait_until(Duration::from_secs(10), "the follow-up ran", || async {
        !seen.of("notify_ops").is_empty()
    })
    .await;
    let b_stats = b.stop().await.stats;
    let dead = client.get(last).await.unwrap();
    assert_eq!(
        (dead.state, dead.attempt, dead.lease_epoch),
        (TaskState::Dead, 1, 3),
        "one attempt, as before the claim"
    );
    assert_eq!(
        dead.last_error.as_deref(),
        Some("lease expired (worker A, attempt 1)")
    );
    assert_eq!(
        seen.of("notify_ops"),
        vec![json!({
            "id": last.0,
            "name": "gated",
            "queue": "default",
            "attempts": 1,
            "max_attempts": 1,
            "last_error": "lease expired (worker A, attempt 1)",
            "payload": {"n": 1},
        })]
    );
    let follow = rows(&db, "notify_ops").await;
    assert_eq!(follow.len(), 1);
    assert_eq!(
        follow[0].key.as_deref(),
        Some(format!("taskq:on_dead:{}:3", last.0).as_str())
    );
    {
        let events = b_events.lock().unwrap();
        let ended: Vec<_> = events.iter().filter(|e| e.task_id == last).collect();
        assert_eq!(ended.len(), 1, "{events:?}");
        assert_eq!(ended[0].outcome, TaskOutcome::Dead);
        assert!(ended[0].follow_up);
    }
    assert_eq!((b_stats.dead, b_stats.follow_ups), (1, 1));
    // The history holds the one lost attempt, recorded by C's reap; the burial adds nothing.
    let history = client.attempts(last).await.unwrap();
    assert_eq!(history.len(), 1, "{history:?}");
    assert_eq!(history[0].outcome, taskq::client::AttemptOutcome::LeaseLost);
}

async fn on_success_chains_pass_the_payload_along<B: TestBackend>(db: Db<B>) {
    let seen = Seen::default();
    let id = StepOne { n: 5 }.enqueue(&db.pool).await.unwrap().id;
    let w = RunningWorker::spawn(
        db.worker()
            .register::<StepOne>()
            .register::<StepTwo>()
            .register::<StepThree>()
            .data(seen.clone()),
    );
    wait_until(Duration::from_secs(10), "the chain ran", || async {
        !seen.of("step_three").is_empty()
    })
    .await;
    let two = seen.of("step_two");
    assert_eq!(
        two,
        vec![
            json!({"id": id.0, "name": "step_one", "queue": "default", "attempts": 1,
                    "payload": {"n": 5}})
        ]
    );
    let three = seen.of("step_three");
    assert_eq!(three.len(), 1);
    assert_eq!(three[0]["name"], json!("step_two"));
    assert_eq!(three[0]["payload"], json!({ "prev": two[0] }));
    let step_two_rows = rows(&db, "step_two").await;
    assert_eq!(step_two_rows.len(), 1);
    assert_eq!(
        step_two_rows[0].key.as_deref(),
        Some(format!("taskq:on_success:{}:1", id.0).as_str())
    );
    let stats = w.stop().await.stats;
    assert_eq!((stats.succeeded, stats.follow_ups), (3, 2));
    assert_eq!(rows(&db, "step_three").await.len(), 1);
}

async fn observers_see_every_outcome_and_a_panicking_one_does_not_stop_the_worker<
    B: TestBackend,
>(
    db: Db<B>,
) {
    let client = Client::new(db.pool.clone());
    let mut ids = Vec::new();
    for m in [
        Mixed::Ok,
        Mixed::FailOnce,
        Mixed::SnoozeOnce,
        Mixed::Permanent,
    ] {
        ids.push(m.enqueue(&db.pool).await.unwrap().id);
    }
    let events: Arc<Mutex<Vec<OutcomeEvent>>> = Arc::default();
    let sink = events.clone();
    let w = RunningWorker::spawn(
        db.worker()
            .register::<Mixed>()
            .on_outcome(|_| panic!("a broken observer"))
            .on_outcome(move |e| sink.lock().unwrap().push(e.clone())),
    );
    wait_until(Duration::from_secs(10), "every task ended", || async {
        let mut done = 0;
        for id in &ids {
            done += u32::from(client.get(*id).await.unwrap().state.is_terminal());
        }
        done == 4
    })
    .await;
    // The worker still works after the panics.
    let late = Mixed::Ok.enqueue(&db.pool).await.unwrap().id;
    wait_until(Duration::from_secs(10), "a later task ran", || async {
        client.get(late).await.unwrap().state == TaskState::Succeeded
    })
    .await;
    let stats = w.stop().await.stats;
    let events = events.lock().unwrap();
    let of = |id: TaskId| -> Vec<(TaskOutcome, u32)> {
        events
            .iter()
            .filter(|e| e.task_id == id)
            .map(|e| (e.outcome, e.attempt))
            .collect()
    };
    assert_eq!(of(ids[0]), vec![(TaskOutcome::Succeeded, 1)]);
    assert_eq!(
        of(ids[1]),
        vec![(TaskOutcome::Retried, 1), (TaskOutcome::Succeeded, 2)]
    );
    assert_eq!(
        of(ids[2]),
        vec![(TaskOutcome::Snoozed, 1), (TaskOutcome::Succeeded, 1)]
    );
    assert_eq!(of(ids[3]), vec![(TaskOutcome::Dead, 1)]);
    assert_eq!(of(late), vec![(TaskOutcome::Succeeded, 1)]);
    let failed = events
        .iter()
        .find(|e| e.outcome == TaskOutcome::Retried)
        .unwrap();
    assert_eq!(failed.error.as_deref(), Some("first try fails"));
    assert!(failed.duration.is_some());
    assert_eq!((&*failed.name, &*failed.queue), ("mixed", "default"));
    assert!(events.iter().all(|e| !e.follow_up));
    assert_eq!(events.len(), 7);
    assert_eq!(
        stats.observer_panics, 7,
        "the broken observer was called for each"
    );
}

async fn a_unique_tasks_death_frees_its_identity_and_enqueues_its_follow_up_together<
    B: TestBackend,
>(
    db: Db<B>,
) {
    let client = Client::new(db.pool.clone());
    let seen = Seen::default();
    let id = UniqueExport { order_id: 3 }
        .enqueue(&db.pool)
        .await
        .unwrap()
        .id;
    let w = RunningWorker::spawn(
        db.worker()
            .register::<UniqueExport>()
            .register::<NotifyOps>()
            .data(seen.clone()),
    );
    wait_until(Duration::from_secs(10), "notify_ops ran", || async {
        !seen.of("notify_ops").is_empty()
    })
    .await;
    let stats = w.stop().await.stats;
    assert_eq!(client.get(id).await.unwrap().state, TaskState::Dead);
    assert_eq!((stats.dead, stats.follow_ups), (1, 1));
    let held = db.scalar("SELECT COUNT(*) FROM taskq_unique").await;
    assert_eq!(held, 0, "the identity was freed");
    assert_eq!(rows(&db, "notify_ops").await.len(), 1);
    assert_eq!(
        seen.of("notify_ops")[0]["last_error"],
        json!("order 3 failed (attempts exhausted: 1/1)")
    );
    let again = UniqueExport { order_id: 3 }
        .enqueue(&db.pool)
        .await
        .unwrap();
    assert!(!again.duplicate);
}

/// Enqueues `BigDead` tasks and makes each a last attempt running under an expired lease, as
/// if its worker had died.
async fn plant_expired_last_attempts<B: TestBackend>(db: &Db<B>, sizes: &[usize]) -> Vec<TaskId> {
    let mut ids = Vec::new();
    for (n, size) in sizes.iter().enumerate() {
        let id = BigDead {
            n: n as u32,
            size: *size,
        }
        .enqueue(&db.pool)
        .await
        .unwrap()
        .id;
        db.exec(&format!(
            "UPDATE taskq_tasks SET state = 'running', attempt = 1, lease_epoch = 1,
               worker_id = 'gone', lease_until = {} WHERE id = {}",
            db.ago(Duration::from_secs(1)),
            id.0
        ))
        .await;
        ids.push(id);
    }
    ids
}

/// Sizes of the `filler` follow-ups' fills, by the id of the task they follow.
async fn fillers<B: TestBackend>(db: &Db<B>) -> Vec<(u64, usize)> {
    let mut out: Vec<(u64, usize)> = db
        .blobs("SELECT payload FROM taskq_tasks WHERE name = 'filler'")
        .await
        .iter()
        .map(|p| {
            let f: Filler = serde_json::from_slice(p).unwrap();
            (f.from, f.fill.len())
        })
        .collect();
    out.sort_unstable();
    out
}

async fn a_follow_up_the_database_refuses_does_not_hold_back_the_end<B: TestBackend>(db: Db<B>) {
    let client = Client::new(db.pool.clone());
    // The database refuses big fillers, as it would refuse a statement over its size limit
    // (or an application's trigger or constraint would refuse a row).
    db.exec(if db.label() == "mysql" {
        "CREATE TRIGGER refuse_big_fillers BEFORE INSERT ON taskq_tasks FOR EACH ROW
         IF NEW.name = 'filler' AND LENGTH(NEW.payload) > 1000 THEN
           SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'refused by the test trigger';
         END IF"
    } else {
        "CREATE TRIGGER refuse_big_fillers BEFORE INSERT ON taskq_tasks
         WHEN NEW.name = 'filler' AND length(NEW.payload) > 1000
         BEGIN SELECT RAISE(ABORT, 'refused by the test trigger'); END"
    })
    .await;
    let mut done = Vec::new();
    for (n, size) in [(1, 10), (2, 5000), (3, 20)] {
        done.push(Big { n, size }.enqueue(&db.pool).await.unwrap().id);
    }
    let dead = plant_expired_last_attempts(&db, &[5000, 30]).await;
    // The three outcomes go out in one write-back; the two deaths in one reap.
    let w = RunningWorker::spawn(
        db.worker()
            .register::<Big>()
            .register::<BigDead>()
            .write_back_delay(Duration::from_millis(300)),
    );
    wait_until(Duration::from_secs(15), "every task ended", || async {
        db.count("state = 'succeeded'").await == 3 && db.count("state = 'dead'").await == 2
    })
    .await;
    let stats = w.stop().await.stats;
    // Each end is written; only the refused follow-ups are missing, logged and counted.
    assert_eq!(
        (
            stats.succeeded,
            stats.reaped,
            stats.follow_ups,
            stats.follow_up_errors,
            stats.writeback_rejected
        ),
        (3, 2, 3, 2, 0)
    );
    assert_eq!(
        fillers(&db).await,
        [(done[0].0, 10), (done[2].0, 20), (dead[1].0, 30)]
    );
    for id in done {
        let t = client.get(id).await.unwrap();
        assert_eq!((t.state, t.attempt), (TaskState::Succeeded, 1));
    }
}

// MySQL only: `max_allowed_packet` (a SQLite statement's JSON argument may be up to 1 GB, its
// longest string; the same byte budget bounds its statements).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follow_ups_near_the_servers_packet_size_are_written_in_bounded_statements() {
    use taskq_tests::server::PrivateServer;
    let Some(server) = PrivateServer::start_with_args_or_skip(&["--max-allowed-packet=4M"]).await
    else {
        return;
    };
    // A fresh name: dropping the `TestDb` drops that name on the shared server, which has none.
    let name = format!("taskq_t_{:016x}", fastrand::u64(..));
    let url = server.create_database(&name).await.unwrap();
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(8)
        .connect(&url)
        .await
        .unwrap();
    taskq::migrate(&pool).await.unwrap();
    let options = server.connect_options(&name);
    let db = Db::from_test_db(taskq_tests::TestDb {
        pool,
        name,
        options,
    });
    let client = Client::new(db.pool.clone());
    // Six follow-ups of 0.7 MB (1.4 MB in their statement, as hex): 8.4 MB together, over the
    // 4 MiB packet. One of 1.5 MB (3 MB): over the 2 MiB a statement takes, under the packet,
    // so alone in its statement. One of 2.5 MB (5 MB): over the packet, so never sent.
    let sizes = [
        700_000, 700_000, 700_000, 700_000, 700_000, 700_000, 1_500_000, 2_500_000,
    ];
    let mut done = Vec::new();
    for (n, size) in sizes.iter().enumerate() {
        let big = Big {
            n: n as u32,
            size: *size,
        };
        done.push(big.enqueue(&db.pool).await.unwrap().id);
    }
    // Four deaths the reaper finds at once, with follow-ups of 0.7 MB.
    let dead = plant_expired_last_attempts(&db, &[700_000; 4]).await;
    let w = RunningWorker::spawn(
        db.worker()
            .register::<Big>()
            .register::<BigDead>()
            .write_back_delay(Duration::from_millis(500)),
    );
    wait_until(Duration::from_secs(30), "every task ended", || async {
        db.count("state = 'succeeded'").await == 8 && db.count("state = 'dead'").await == 4
    })
    .await;
    let stats = w.stop().await.stats;
    assert_eq!(
        (
            stats.succeeded,
            stats.reaped,
            stats.follow_ups,
            stats.follow_up_errors,
            stats.writeback_rejected
        ),
        (8, 4, 11, 1, 0)
    );
    let mut expected: Vec<(u64, usize)> = done[..7]
        .iter()
        .zip(sizes)
        .map(|(id, s)| (id.0, s))
        .collect();
    expected.extend(dead.iter().map(|id| (id.0, 700_000)));
    expected.sort_unstable();
    assert_eq!(fillers(&db).await, expected);
    let t = client.get(done[7]).await.unwrap();
    assert_eq!(
        t.state,
        TaskState::Succeeded,
        "written without its follow-up"
    );
}

taskq_tests::conformance!(
    a_death_enqueues_exactly_one_follow_up_with_the_dead_tasks_fields,
    hand_written_hooks_follow_permanent_and_undecodable_deaths,
    a_follow_up_that_cannot_be_built_does_not_hold_the_death_back,
    a_fenced_write_back_enqueues_no_follow_up,
    a_reaped_last_attempt_gets_one_follow_up_from_a_reaper_that_registers_it,
    a_last_attempt_no_live_worker_registers_is_parked_then_buried_unrun,
    on_success_chains_pass_the_payload_along,
    observers_see_every_outcome_and_a_panicking_one_does_not_stop_the_worker,
    a_unique_tasks_death_frees_its_identity_and_enqueues_its_follow_up_together,
    a_follow_up_the_database_refuses_does_not_hold_back_the_end,
);
