//! A worker whose heartbeat connection is silently black-holed (a network partition that
//! drops packets without a reset), through the test proxy: the heartbeat statement never
//! answers while every other statement works.
//!
//! - The watchdog cancels the handler before its lease ends on the database clock; another
//!   worker takes over after it; nothing is written twice; the worker recovers on heal.
//! - The worker's own reaper requeues a task it still runs and its claim loop claims it again:
//!   the two attempts have separate lease records, the old one is canceled, and its late
//!   (fenced) completion leaves the new attempt's lease alone.
//! - A claim that commits but whose answer is lost does not use up an attempt.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::NaiveDateTime;
use sqlx::MySqlPool;
use sqlx::mysql::MySqlPoolOptions;
use taskq::{Client, Task, TaskContext, TaskError, TaskState, context::CancelReason};
use taskq_tests::proxy::{CLAIM_SQL, ChaosProxy, HEARTBEAT_SQL};
use taskq_tests::{RunningWorker, TestDb, fast_worker, wait_until};
use tokio::sync::Semaphore;

/// What a handler saw, in order.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    worker: String,
    attempt: u32,
    epoch: u64,
    event: Event,
}

#[derive(Debug, Clone, PartialEq)]
enum Event {
    Started {
        db_now: NaiveDateTime,
    },
    /// The cancel signal fired; the row as it was then (read around the proxy).
    Canceled {
        reason: CancelReason,
        db_now: NaiveDateTime,
        lease_until: Option<NaiveDateTime>,
        row_epoch: u64,
    },
    Finished,
}

/// Data shared with the handlers (`WorkerBuilder::data`).
#[derive(Clone)]
struct Ctl {
    /// A pool that does not go through the proxy.
    direct: MySqlPool,
    log: Arc<Mutex<Vec<Seen>>>,
    /// Held-back first attempts wait here after their cancel signal.
    gate: Arc<Semaphore>,
}

impl Ctl {
    fn new(direct: MySqlPool) -> Self {
        Self {
            direct,
            log: Arc::default(),
            gate: Arc::new(Semaphore::new(0)),
        }
    }
    fn push(&self, cx: &TaskContext, event: Event) {
        self.log.lock().unwrap().push(Seen {
            worker: cx.worker_id().to_owned(),
            attempt: cx.attempt(),
            epoch: cx.lease_epoch(),
            event,
        });
    }
    fn events(&self) -> Vec<Seen> {
        self.log.lock().unwrap().clone()
    }
    fn canceled(&self) -> Vec<Seen> {
        self.events()
            .into_iter()
            .filter(|s| matches!(s.event, Event::Canceled { .. }))
            .collect()
    }
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Partitioned {
    /// What the first attempt does after its cancel signal: wait for the gate (`true`) or
    /// ignore it until aborted (`false`).
    first_waits_for_gate: bool,
    /// Whether the first attempt stalls at all (otherwise every attempt just works).
    stall_first: bool,
    /// How long a working attempt takes.
    work_ms: u64,
}

impl Task for Partitioned {
    const NAME: &'static str = "partitioned";
    const MAX_ATTEMPTS: u32 = 5;
    async fn run(self, cx: TaskContext) -> Result<(), TaskError> {
        let ctl = cx.data::<Ctl>().unwrap();
        let db_now: NaiveDateTime = sqlx::query_scalar("SELECT UTC_TIMESTAMP(6)")
            .fetch_one(&ctl.direct)
            .await
            .unwrap();
        ctl.push(&cx, Event::Started { db_now });
        if self.stall_first && cx.attempt() == 1 {
            let reason = cx.cancel_signal().canceled().await;
            let (db_now, lease_until, row_epoch): (NaiveDateTime, Option<NaiveDateTime>, u64) =
                sqlx::query_as(
                    "SELECT UTC_TIMESTAMP(6), lease_until, lease_epoch FROM taskq_tasks WHERE id = ?",
                )
                .bind(cx.id().0)
                .fetch_one(&ctl.direct)
                .await
                .unwrap();
            ctl.push(
                &cx,
                Event::Canceled {
                    reason,
                    db_now,
                    lease_until,
                    row_epoch,
                },
            );
            if self.first_waits_for_gate {
                let _permit = ctl.gate.acquire().await.unwrap();
            } else {
                std::future::pending::<()>().await;
            }
        } else {
            tokio::time::sleep(Duration::from_millis(self.work_ms)).await;
        }
        ctl.push(&cx, Event::Finished);
        Ok(())
    }
}

/// A pool on the test database through `proxy`.
fn pool_through(db: &TestDb, proxy: &ChaosProxy) -> MySqlPool {
    MySqlPoolOptions::new()
        .max_connections(8)
        .connect_lazy_with(db.options.clone().port(proxy.addr().port()))
}

async fn proxy_for(db: &TestDb) -> ChaosProxy {
    let upstream: SocketAddr = format!("{}:{}", db.options.get_host(), db.options.get_port())
        .parse()
        .expect("the test server is addressed by IP");
    ChaosProxy::start(upstream).await
}

/// A test database, its handlers' state and a proxy that black-holes the heartbeat.
struct Partition {
    db: TestDb,
    client: Client,
    ctl: Ctl,
    proxy: ChaosProxy,
}

/// Lease of the partitioned worker.
const LEASE: Duration = Duration::from_secs(1);

impl Partition {
    /// `None` (the test skips) when no MySQL server answers.
    async fn new() -> Option<Self> {
        let db = TestDb::new_or_skip().await?;
        let proxy = proxy_for(&db).await;
        proxy.black_hole_matching(HEARTBEAT_SQL);
        Some(Self {
            client: Client::new(db.pool.clone()),
            ctl: Ctl::new(db.pool.clone()),
            db,
            proxy,
        })
    }

    /// Worker "A", reaching the database through the proxy: its heartbeat never answers.
    fn worker_a(&self, cancel_grace: Duration) -> taskq::worker::WorkerBuilder {
        fast_worker(&pool_through(&self.db, &self.proxy))
            .worker_id("A")
            .register::<Partitioned>()
            .data(self.ctl.clone())
            .lease(LEASE)
            .cancel_grace(cancel_grace)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_black_holed_heartbeat_cancels_the_handler_before_its_lease_ends() {
    let Some(p) = Partition::new().await else {
        return;
    };
    let (db, client, ctl, proxy, lease) = (&p.db, &p.client, &p.ctl, &p.proxy, LEASE);
    let a = RunningWorker::spawn(p.worker_a(Duration::from_millis(200)));
    let id = Partitioned {
        first_waits_for_gate: false,
        stall_first: true,
        work_ms: 0,
    }
    .enqueue(&db.pool)
    .await
    .unwrap()
    .id;
    wait_until(
        Duration::from_secs(10),
        "A's handler is canceled",
        || async { !ctl.canceled().is_empty() },
    )
    .await;
    // B works directly; it takes over once A's lease has expired on the database.
    let b = RunningWorker::spawn(
        fast_worker(&db.pool)
            .worker_id("B")
            .register::<Partitioned>()
            .data(ctl.clone())
            .lease(lease),
    );
    wait_until(Duration::from_secs(15), "the task is finished", || async {
        client.get(id).await.unwrap().state == TaskState::Succeeded
    })
    .await;
    b.stop().await;

    let canceled = ctl.canceled();
    assert_eq!(canceled.len(), 1, "{canceled:?}");
    let Event::Canceled {
        reason,
        db_now,
        lease_until,
        row_epoch,
    } = canceled[0].event.clone()
    else {
        unreachable!()
    };
    assert_eq!(
        (canceled[0].worker.as_str(), reason),
        ("A", CancelReason::LeaseLost)
    );
    let lease_until = lease_until.expect("still running when canceled");
    assert!(
        db_now < lease_until,
        "canceled at {db_now}, before the lease ended at {lease_until}"
    );
    assert_eq!(row_epoch, canceled[0].epoch, "nobody else held it yet");
    // The second attempt started (on either worker) only after A's lease had ended.
    let second = ctl
        .events()
        .into_iter()
        .find(|s| s.attempt == 2)
        .expect("a second attempt ran");
    let Event::Started { db_now: started } = second.event else {
        panic!("{second:?}")
    };
    assert!(started >= lease_until, "{started} >= {lease_until}");
    let t = client.get(id).await.unwrap();
    assert_eq!((t.attempt, t.lease_epoch), (2, 3), "exactly one takeover");
    // A's aborted attempt wrote nothing; its heartbeat statements were abandoned.
    let a_stats = a.stats.snapshot();
    assert_eq!((a_stats.fenced, a_stats.lost_leases), (0, 1), "{a_stats:?}");
    assert!(a_stats.statement_timeouts >= 1, "{a_stats:?}");
    assert!(
        !ctl.events()
            .iter()
            .any(|s| s.worker == "A" && s.attempt == 1 && s.event == Event::Finished)
    );

    // Healed: A's heartbeat works again (on fresh connections), so a task running for three
    // leases keeps its one attempt.
    proxy.heal();
    let long = Partitioned {
        first_waits_for_gate: false,
        stall_first: false,
        work_ms: 3 * lease.as_millis() as u64,
    }
    .enqueue(&db.pool)
    .await
    .unwrap()
    .id;
    wait_until(Duration::from_secs(15), "A runs the long task", || async {
        client.get(long).await.unwrap().state == TaskState::Succeeded
    })
    .await;
    let stats = a.stop().await.stats;
    let t = client.get(long).await.unwrap();
    assert_eq!(
        (t.worker_id.as_deref(), t.attempt, t.lease_epoch),
        (Some("A"), 1, 1)
    );
    assert_eq!(stats.lost_leases, 1, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_claimed_again_by_its_own_worker_keeps_one_lease_per_attempt() {
    let Some(p) = Partition::new().await else {
        return;
    };
    let (db, client, ctl, proxy, lease) = (&p.db, &p.client, &p.ctl, &p.proxy, LEASE);
    // One worker with several slots; a cancel grace long enough that the first handler is
    // still running (ignoring its signal) when the worker claims the task again (longer than
    // `build` allows: as a handler blocked in synchronous code would).
    let a = RunningWorker::spawn(
        p.worker_a(LEASE / 2)
            .__unchecked_cancel_grace(Duration::from_secs(30))
            .queue("default", 4),
    );
    let id = Partitioned {
        first_waits_for_gate: true,
        stall_first: true,
        work_ms: 3 * lease.as_millis() as u64,
    }
    .enqueue(&db.pool)
    .await
    .unwrap()
    .id;
    wait_until(
        Duration::from_secs(10),
        "the first attempt is canceled",
        || async { !ctl.canceled().is_empty() },
    )
    .await;
    // The partition heals: renewals work again, but the first attempt is lost already; its
    // lease expires, this worker's reaper requeues the task and its claim loop takes it again.
    proxy.heal();
    wait_until(
        Duration::from_secs(10),
        "A claims the task again",
        || async {
            let t = client.get(id).await.unwrap();
            t.state == TaskState::Running && t.lease_epoch == 3
        },
    )
    .await;
    // Now the first handler returns (a success, written under the old epoch: fenced) while the
    // second runs for three leases on renewals.
    ctl.gate.add_permits(1);
    wait_until(Duration::from_secs(15), "the task is finished", || async {
        client.get(id).await.unwrap().state == TaskState::Succeeded
    })
    .await;
    let stats = a.stop().await.stats;

    let t = client.get(id).await.unwrap();
    assert_eq!(
        (t.worker_id.as_deref(), t.attempt, t.lease_epoch),
        (Some("A"), 2, 3),
        "the second attempt kept its lease: no further reap"
    );
    let canceled = ctl.canceled();
    assert_eq!(
        canceled.len(),
        1,
        "only the first attempt was canceled: {canceled:?}"
    );
    assert_eq!((canceled[0].attempt, canceled[0].epoch), (1, 1));
    assert!(matches!(
        canceled[0].event,
        Event::Canceled {
            reason: CancelReason::LeaseLost,
            ..
        }
    ));
    let finished: Vec<(u32, u64)> = ctl
        .events()
        .into_iter()
        .filter(|s| s.event == Event::Finished)
        .map(|s| (s.attempt, s.epoch))
        .collect();
    assert_eq!(finished.len(), 2, "{finished:?}");
    assert!(finished.contains(&(1, 1)) && finished.contains(&(2, 3)));
    assert_eq!(
        (
            stats.succeeded,
            stats.fenced,
            stats.lost_leases,
            stats.reaped
        ),
        (1, 1, 1, 1),
        "{stats:?}"
    );
}

/// Runs once per attempt; a task of one attempt only, so a lost attempt would kill it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct OneShot;

impl Task for OneShot {
    const NAME: &'static str = "one_shot";
    const MAX_ATTEMPTS: u32 = 1;
    async fn run(self, cx: TaskContext) -> Result<(), TaskError> {
        let ctl = cx.data::<Ctl>().unwrap();
        ctl.push(&cx, Event::Finished);
        Ok(())
    }
}

/// A claim that commits but whose answer never reaches the worker (the proxy lets its `COMMIT`
/// through and drops everything after: the statement deadline ends the wait) took a task no
/// handler runs. The worker gives it back before it claims again: the task runs once, on its
/// one and only attempt, instead of waiting for its lease to expire and being reaped dead
/// (attempts exhausted) without ever having run. MySQL only: SQLite has no connection whose
/// answer can be lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_whose_answer_is_lost_does_not_use_up_an_attempt() {
    let Some(db) = TestDb::new_or_skip().await else {
        return;
    };
    let proxy = proxy_for(&db).await;
    proxy.lose_reply_after(CLAIM_SQL, &b"COMMIT"[..]);
    let ctl = Ctl::new(db.pool.clone());
    let client = Client::new(db.pool.clone());
    let id = OneShot.enqueue(&db.pool).await.unwrap().id;
    let w = RunningWorker::spawn(
        fast_worker(&pool_through(&db, &proxy))
            .worker_id("A")
            .register::<OneShot>()
            .data(ctl.clone())
            .lease(Duration::from_secs(2)),
    );
    wait_until(Duration::from_secs(20), "the task ends", || async {
        let s = client.get(id).await.unwrap().state;
        s == TaskState::Succeeded || s == TaskState::Dead
    })
    .await;
    let stats = w.stop().await.stats;
    assert_eq!(proxy.stats().black_holed, 1, "the claim's answer was lost");
    let t = client.get(id).await.unwrap();
    assert_eq!(
        (t.state, t.attempt, t.lease_epoch),
        (TaskState::Succeeded, 1, 3),
        "claimed (lost), released, claimed again and run: {:?}",
        t.last_error
    );
    let runs: Vec<(u32, u64)> = ctl.events().iter().map(|s| (s.attempt, s.epoch)).collect();
    assert_eq!(runs, vec![(1, 3)]);
    assert_eq!(
        (stats.lost_claims, stats.statement_timeouts >= 1),
        (1, true)
    );
    let history = client.attempts(id).await.unwrap();
    assert_eq!(
        history
            .iter()
            .map(|a| a.outcome.clone())
            .collect::<Vec<_>>(),
        vec![
            taskq::client::AttemptOutcome::Released,
            taskq::client::AttemptOutcome::Succeeded
        ]
    );
}
