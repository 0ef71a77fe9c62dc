//! The worker ([`Worker`], built by [`WorkerBuilder`]; both also at the crate root): claims
//! due tasks, runs their handlers, renews leases, writes outcomes back, reaps expired leases,
//! prunes old tasks and shuts down gracefully; and what it reports (stats, health, outcomes,
//! the shutdown report).
//!
//! One [`Worker`] runs these cooperating loops on the tokio runtime:
//! - `claim`: one loop per queue, claiming batches sized by free handler slots;
//! - `executor`: one tokio task per claimed task (panics and timeouts are caught there);
//! - `writeback`: gathers outcomes for a few milliseconds and writes them in one statement;
//! - `heartbeat`: renews every held lease with one statement per beat, and records the worker
//!   as alive in `taskq_workers` (one statement per heartbeat interval);
//! - `lease`: the in-memory lease table (one record per attempt) and the watchdog that
//!   cancels a handler whose lease was not confirmed in time;
//! - `maintenance`: reaper of expired leases and retention;
//! - `schedule`: the scheduler, which enqueues the ticks of recurring (cron) schedules;
//! - `lanes`: the worker's connections, a control lane (renewals, presence, pause refresh)
//!   and a work lane (everything else).
//!
//! Every statement runs within a deadline (`deadline`); each one that succeeds refreshes the
//! worker's probe (`health`).

mod claim;
mod config;
pub(crate) mod deadline;
mod executor;
mod follow;
mod health;
mod heartbeat;
mod lanes;
mod lease;
mod maintenance;
mod observe;
mod schedule;
mod stats;
mod writeback;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, Semaphore, mpsc, watch};

pub use crate::wake::notify;
pub use config::{Retention, WorkerBuilder};
pub use health::{HealthStatus, WorkerHealth, WorkerPhase};
pub use observe::{OutcomeEvent, TaskOutcome};
pub use stats::{StatsSnapshot, WorkerStats};

use crate::backend::{Backend, NameList, Store};
use crate::context::{CancelReason, DataMap};
use crate::error::Result;
use crate::registry::Registration;
use crate::task::TaskId;
use config::{Config, ShutdownFuture, TraceLink};
use deadline::within;
use lease::{Leases, Phase};

/// A configured worker; see [`Worker::builder`] and [`run_registered`].
pub struct Worker {
    user_store: Store,
    cfg: Config,
    handlers: HashMap<&'static str, Registration>,
    data: DataMap,
    shutdown: Option<ShutdownFuture>,
    trace_link: Option<TraceLink>,
    observers: Vec<observe::Observer>,
    stats: Arc<WorkerStats>,
    health: Arc<health::HealthInner>,
}

/// What happened at shutdown.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShutdownReport {
    /// Tasks still running when the shutdown timeout elapsed: their handlers were aborted and
    /// the tasks returned to pending (epoch incremented, `run_at` kept) for another worker to start
    /// at its next free slot.
    pub released: Vec<TaskId>,
    /// Tasks whose outcome or release could not be written (database unreachable): they run
    /// again after their lease expires.
    pub unacknowledged: Vec<TaskId>,
    /// Final counters.
    pub stats: StatsSnapshot,
}

/// Runs a worker for every `#[task]` registered in this binary, with the default settings,
/// until SIGINT or SIGTERM; then shuts down gracefully and returns.
///
/// `pool` (a `MySqlPool`, or with the `sqlite` feature a `SqlitePool`) is also registered as
/// data, so handlers can take `Data<MySqlPool>` (resp. `Data<SqlitePool>`).
pub async fn run_registered<DB: Backend>(pool: sqlx::Pool<DB>) -> Result<ShutdownReport> {
    Worker::builder(pool.clone())
        .register_all()
        .data(pool)
        .build()?
        .run()
        .await
}

impl Worker {
    /// Starts configuring a worker that uses `pool`'s connection settings (a `MySqlPool`, or
    /// with the `sqlite` feature a `SqlitePool`). The worker opens two small pools of its own
    /// with the same options, one connection for a single-slot worker on MySQL, two on SQLite
    /// (see [`WorkerBuilder::db_connections`]; on MySQL: READ COMMITTED sessions that the server
    /// closes once silent for half the lease + 1 s, at least 5 s), and never changes `pool`'s
    /// sessions.
    pub fn builder<DB: Backend>(pool: sqlx::Pool<DB>) -> WorkerBuilder {
        WorkerBuilder::new(Store::of(pool))
    }

    /// This worker's id, as recorded on the rows it claims.
    pub fn id(&self) -> &str {
        &self.cfg.worker_id
    }

    /// Live counters of this worker.
    pub fn stats(&self) -> Arc<WorkerStats> {
        self.stats.clone()
    }

    /// A handle on this worker's health, for a readiness or liveness probe; see
    /// [`WorkerHealth`]. Take it before calling [`run`](Self::run).
    pub fn health(&self) -> WorkerHealth {
        WorkerHealth::new(self.health.clone())
    }

    /// Runs until the shutdown signal (the one given to the builder, else SIGINT/SIGTERM),
    /// then stops claiming, waits up to the shutdown timeout for running handlers, releases
    /// what is still running, and returns a report.
    pub async fn run(self) -> Result<ShutdownReport> {
        let Worker {
            user_store,
            cfg,
            handlers,
            data,
            shutdown,
            trace_link,
            observers,
            stats,
            health,
        } = self;
        let _stopped = health::StoppedOnDrop(health.clone());
        let lanes = lanes::Lanes::open(&user_store, cfg.db_connections, cfg.statement_timeout);
        let (stop_tx, stop_rx) = watch::channel(false);
        let (write_back_tx, write_back_rx) = mpsc::unbounded_channel();
        let names = NameList::new(handlers.keys().copied());
        let presence = heartbeat::Presence::new(&cfg, handlers.keys().copied());
        let cfg_queues: Vec<String> = cfg.queues.keys().cloned().collect();
        let shared = Arc::new(Shared {
            user_store,
            store: lanes.work.clone(),
            control: lanes.control.clone(),
            lanes_shared: lanes.shared,
            renewal_busy: lanes.renewal_busy,
            control_waiting: AtomicUsize::new(0),
            control_served: Notify::new(),
            overflow_after: lanes::overflow_after(
                cfg.lease,
                cfg.heartbeat,
                cfg.cancel_grace.min(cfg.lease / 2),
            ),
            worker_id: cfg.worker_id.as_str().into(),
            global: Arc::new(Semaphore::new(cfg.concurrency)),
            cfg,
            handlers,
            names,
            data: Arc::new(data),
            inflight: Mutex::default(),
            executing: AtomicUsize::new(0),
            slot_freed: Notify::new(),
            stats,
            stop: stop_rx,
            write_backs: write_back_tx,
            trace_link,
            observers,
            paused: Mutex::default(),
            limited: Mutex::default(),
            written: cfg_queues_notifiers(&cfg_queues),
            presence,
            health,
            budget: std::sync::OnceLock::new(),
        });
        tracing::info!(worker_id = %shared.worker_id, queues = ?shared.cfg.queues, "taskq worker started");

        maintenance::refresh_controls(&shared).await;
        shared.health.set_phase(WorkerPhase::Running);
        let mut loops = tokio::task::JoinSet::new();
        for (queue, n) in &shared.cfg.queues {
            loops.spawn(claim::run(shared.clone(), queue.as_str().into(), *n));
        }
        let heartbeat = tokio::spawn(heartbeat::run(shared.clone()));
        let presence = tokio::spawn(heartbeat::presence(shared.clone()));
        let watchdog = tokio::spawn(lease::watchdog(shared.clone()));
        let maintenance = tokio::spawn(maintenance::run(shared.clone()));
        let controls = tokio::spawn(maintenance::watch_controls(shared.clone()));
        let scheduler = tokio::spawn(schedule::run(shared.clone()));
        let writer = tokio::spawn(writeback::run(shared.clone(), write_back_rx));

        match shutdown {
            Some(signal) => signal.await,
            None => default_signal().await,
        }
        tracing::info!(worker_id = %shared.worker_id, "taskq worker stopping: no new claims");
        shared.health.set_phase(WorkerPhase::Stopping);
        let _ = stop_tx.send(true);
        while loops.join_next().await.is_some() {}
        maintenance.abort();
        controls.abort();
        // A step under way finishes (it is bounded by the statement deadline), so a tick it
        // committed is counted; the loop returns at its next look at the stop signal. One
        // that does not finish in time is cut short: it rolls back, or committed unseen.
        let mut scheduler = scheduler;
        let step = shared.cfg.statement_timeout + std::time::Duration::from_millis(100);
        if tokio::time::timeout(step, &mut scheduler).await.is_err() {
            scheduler.abort();
        }

        // Grace period for handlers in flight.
        let deadline = Instant::now() + shared.cfg.shutdown_timeout;
        loop {
            let notified = shared.slot_freed.notified();
            if shared.executing.load(Ordering::Acquire) == 0 {
                break;
            }
            if tokio::time::timeout_at(deadline.into(), notified)
                .await
                .is_err()
            {
                break;
            }
        }
        // Abort what is left; executors mark those tasks abandoned and write nothing.
        let left: Vec<_> = shared
            .inflight()
            .values()
            .filter(|f| f.phase == Phase::Running)
            .map(|f| (f.cancel.clone(), f.abort.clone()))
            .collect();
        for (cancel, abort) in left {
            cancel.cancel(CancelReason::Shutdown);
            if let Some(a) = abort {
                a.abort();
            }
        }
        while shared.executing.load(Ordering::Acquire) > 0 {
            let notified = shared.slot_freed.notified();
            if shared.executing.load(Ordering::Acquire) == 0 {
                break;
            }
            let _ = tokio::time::timeout(Duration::from_millis(50), notified).await;
        }
        // Flush outcomes, then give abandoned tasks back.
        let unwritten = writeback::stop(&shared, writer).await;
        let released = release_abandoned(&shared).await;
        heartbeat.abort();
        presence.abort();
        watchdog.abort();
        heartbeat::deregister(&shared).await;
        let mut unacknowledged = unwritten;
        unacknowledged.extend(released.1);
        let report = ShutdownReport {
            released: released.0,
            unacknowledged,
            stats: shared.stats.snapshot(),
        };
        if !report.released.is_empty() || !report.unacknowledged.is_empty() {
            tracing::warn!(released = ?report.released, unacknowledged = ?report.unacknowledged,
                "taskq worker abandoned tasks at shutdown");
        }
        tracing::info!(worker_id = %shared.worker_id, "taskq worker stopped");
        lanes.close().await;
        Ok(report)
    }
}

/// Gives the abandoned tasks back; returns (released, not released).
async fn release_abandoned(shared: &Shared) -> (Vec<TaskId>, Vec<TaskId>) {
    // (lease, name, queue, attempt) of each abandoned attempt.
    type Abandoned = ((u64, u64), Arc<str>, Arc<str>, u32);
    let abandoned: Vec<Abandoned> = shared
        .inflight()
        .iter()
        .filter(|(_, f)| f.phase == Phase::Abandoned)
        .map(|(k, f)| ((k.id, k.epoch), f.name.clone(), f.queue.clone(), f.attempt))
        .collect();
    let leases: Vec<(u64, u64)> = abandoned.iter().map(|a| a.0).collect();
    if leases.is_empty() {
        return (Vec::new(), Vec::new());
    }
    let ids: Vec<TaskId> = leases.iter().map(|l| TaskId(l.0)).collect();
    for attempt in 0..5 {
        match within!(shared, |c| shared.store.task_release(c, &leases)).await {
            Ok(n) => {
                WorkerStats::add(&shared.stats.released, n);
                // Best-effort, like every observation: a lease given back here that another
                // worker had already reaped is reported released too.
                for ((id, _), name, queue, attempt) in abandoned {
                    observe::emit(shared, || OutcomeEvent {
                        task_id: TaskId(id),
                        name,
                        queue,
                        attempt,
                        outcome: TaskOutcome::Released,
                        error: None,
                        duration: None,
                        follow_up: false,
                    });
                }
                return (ids, Vec::new());
            }
            Err(e) => {
                tracing::warn!(error = %e, attempt, "taskq: releasing tasks at shutdown failed");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    (Vec::new(), ids)
}

async fn default_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// State shared by a worker's loops.
pub(crate) struct Shared {
    /// The work lane: claims, write-backs, maintenance, the scheduler (see `lanes`).
    pub store: Store,
    /// The user's pool the worker was built on: handlers' reads (`TaskContext::step_output`)
    /// run on it, not on the worker's lanes.
    pub user_store: Store,
    /// The control lane: lease renewals, presence, the pause/limit refresh (see `lanes`).
    pub control: Store,
    /// The two lanes share the work pool, control operations first (a single-connection
    /// worker on MySQL); `control` is then the overflow (see `lanes`).
    pub lanes_shared: bool,
    /// With shared lanes: how long a control operation waits for the shared connection before
    /// it takes the overflow (`lanes::overflow_after`).
    pub overflow_after: Duration,
    /// On SQLite, how long one try of a control statement waits for the write lock (see
    /// `lanes::RENEWAL_BUSY_TIMEOUT`): a try that finds the lock taken is repeated until the
    /// statement's deadline. `None` on MySQL.
    pub renewal_busy: Option<Duration>,
    /// With shared lanes: control operations (renewals) waiting for the connection; work
    /// operations do not ask for it while there are any, so a renewal waits behind at most
    /// the operation that holds the connection (see `lanes`).
    pub control_waiting: AtomicUsize,
    /// Notified when a control operation got the connection (or gave up waiting).
    pub control_served: Notify,
    pub cfg: Config,
    pub worker_id: Arc<str>,
    pub handlers: HashMap<&'static str, Registration>,
    /// The task names this worker handles.
    pub names: NameList,
    pub data: Arc<DataMap>,
    /// The lease table: one record per attempt this worker holds.
    pub inflight: Mutex<Leases>,
    /// Executors currently running a handler.
    pub executing: AtomicUsize,
    /// Notified whenever a handler slot frees up.
    pub slot_freed: Notify,
    pub global: Arc<Semaphore>,
    pub stats: Arc<WorkerStats>,
    pub stop: watch::Receiver<bool>,
    pub write_backs: mpsc::UnboundedSender<writeback::WriteBackMsg>,
    pub trace_link: Option<TraceLink>,
    /// Outcome observers (`WorkerBuilder::on_outcome`).
    pub observers: Vec<observe::Observer>,
    /// Queues paused in the database (refreshed every `poll_max`).
    pub paused: Mutex<std::collections::HashSet<String>>,
    /// Queues with a concurrency or rate limit in the database (refreshed with `paused`):
    /// their claims take the limited path (see `Store::task_claim`).
    pub limited: Mutex<std::collections::HashSet<String>>,
    /// Per queue of this worker: notified after a write-back of some of its tasks committed
    /// (a claim loop waiting at its queue's concurrency limit tries again).
    pub written: HashMap<String, Notify>,
    /// What this worker records about itself in `taskq_workers`.
    pub presence: heartbeat::Presence,
    /// The probe's state; `within!` records each successful statement in it.
    pub health: Arc<health::HealthInner>,
    /// The server's statement budget, read once when first needed (`follow::budget`).
    pub budget: std::sync::OnceLock<crate::backend::budget::Budget>,
}

impl Shared {
    /// A connection of the control lane (`control`) or of the work lane. When the lanes
    /// share one connection, control operations go first (a work operation waits while one
    /// is waiting), and one that has waited [`overflow_after`](Self::overflow_after) for it
    /// runs on the overflow connection instead.
    pub async fn acquire(&self, control: bool) -> sqlx::Result<crate::backend::Pooled> {
        if !self.lanes_shared {
            return if control {
                self.control.acquire().await
            } else {
                self.store.acquire().await
            };
        }
        if control {
            /// Counts a waiting control operation until it is served or given up.
            struct Waiting<'a>(&'a Shared);
            impl Drop for Waiting<'_> {
                fn drop(&mut self) {
                    self.0.control_waiting.fetch_sub(1, Ordering::SeqCst);
                    self.0.control_served.notify_waiters();
                }
            }
            self.control_waiting.fetch_add(1, Ordering::SeqCst);
            let _waiting = Waiting(self);
            return match tokio::time::timeout(self.overflow_after, self.store.acquire()).await {
                Ok(c) => c,
                Err(_) => {
                    // A work statement holds the connection past this operation's budget (a
                    // schedule's fire or a reaper step waiting on a row lock).
                    tracing::debug!(
                        waited = ?self.overflow_after,
                        "taskq: a lease renewal waited for the shared connection; using the overflow connection"
                    );
                    self.control.acquire().await
                }
            };
        }
        loop {
            let served = self.control_served.notified();
            tokio::pin!(served);
            served.as_mut().enable();
            if self.control_waiting.load(Ordering::SeqCst) == 0 {
                break;
            }
            served.await;
        }
        self.store.acquire().await
    }

    /// Connections open in the worker's lanes right now.
    pub fn db_connections(&self) -> u32 {
        self.store.size() + self.control.size()
    }

    pub fn inflight(&self) -> MutexGuard<'_, Leases> {
        self.inflight.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn stopping(&self) -> bool {
        *self.stop.borrow()
    }

    /// Completes when the worker starts stopping.
    pub async fn stopped(&self) {
        let mut rx = self.stop.clone();
        let _ = rx.wait_for(|s| *s).await;
    }

    pub fn is_paused(&self, queue: &str) -> bool {
        self.paused
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(queue)
    }

    pub fn is_limited(&self, queue: &str) -> bool {
        self.limited
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(queue)
    }

    /// Whether one of this worker's queues is paused or limited, as last read.
    pub fn any_queue_controlled(&self) -> bool {
        self.cfg
            .queues
            .keys()
            .any(|q| self.is_paused(q) || self.is_limited(q))
    }

    pub fn lease_us(&self) -> i64 {
        self.cfg.lease.as_micros() as i64
    }
}

fn cfg_queues_notifiers(queues: &[String]) -> HashMap<String, Notify> {
    queues.iter().map(|q| (q.clone(), Notify::new())).collect()
}

/// Sleeps for an error backoff step, returning early when the worker stops.
pub(crate) async fn backoff_sleep(shared: &Shared, failures: u32) {
    let d = Duration::from_millis(100u64 << failures.min(6)).min(Duration::from_secs(5));
    tokio::select! {
        _ = tokio::time::sleep(d) => {}
        _ = shared.stopped() => {}
    }
}
