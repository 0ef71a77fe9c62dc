//! [`WorkerBuilder`]: every worker setting, validated at [`WorkerBuilder::build`].

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use crate::backend::Store;
use crate::context::DataMap;
use crate::defaults::{MAX_DELAY, MAX_QUEUE_LEN, validate_name};
use crate::error::{Error, Result};
use crate::registry::{self, Registration};
use crate::task::Task;
use crate::task::enqueue::IntoEnqueue;
use crate::task::schedule::{Declared, Schedule, ScheduleDef};

use super::Worker;
use super::observe::Observer;

pub(crate) type ShutdownFuture = Pin<Box<dyn Future<Output = ()> + Send>>;
/// See [`WorkerBuilder::trace_link`].
pub(crate) type TraceLink = std::sync::Arc<dyn Fn(&tracing::Span, &str) + Send + Sync>;

/// How long terminal tasks are kept before retention deletes them; `None` keeps them forever.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Keep succeeded tasks this long (default 1 day).
    pub succeeded: Option<Duration>,
    /// Keep dead tasks this long (default 7 days).
    pub dead: Option<Duration>,
    /// Keep canceled tasks this long (default 1 day).
    pub canceled: Option<Duration>,
    /// Keep expired tasks (deadline passed before they started) this long (default 7 days,
    /// like dead ones: both are work that did not get done).
    pub expired: Option<Duration>,
    /// How often to look (default 60 s).
    pub interval: Duration,
}

impl Default for Retention {
    fn default() -> Self {
        Self {
            succeeded: Some(Duration::from_secs(86_400)),
            dead: Some(Duration::from_secs(7 * 86_400)),
            canceled: Some(Duration::from_secs(86_400)),
            expired: Some(Duration::from_secs(7 * 86_400)),
            interval: Duration::from_secs(60),
        }
    }
}

impl Retention {
    /// Keeps every terminal task forever.
    pub fn disabled() -> Self {
        Self {
            succeeded: None,
            dead: None,
            canceled: None,
            expired: None,
            ..Self::default()
        }
    }
}

/// Validated settings of a worker.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub worker_id: String,
    /// Queue → concurrency.
    pub queues: BTreeMap<String, usize>,
    pub concurrency: usize,
    pub lease: Duration,
    pub heartbeat: Duration,
    /// Deadline of every worker statement (half the lease); see `worker::deadline`.
    pub statement_timeout: Duration,
    pub poll_min: Duration,
    pub poll_max: Duration,
    pub reaper_interval: Duration,
    pub retention: Retention,
    pub shutdown_timeout: Duration,
    pub cancel_grace: Duration,
    pub claim_batch: usize,
    pub write_back_delay: Duration,
    /// Largest output a handler may record, in bytes of JSON (see `TaskContext::set_output`).
    pub output_limit: usize,
    pub db_connections: u32,
    pub backlog_interval: Option<Duration>,
    pub event_metrics_interval: Option<Duration>,
    /// Recurring schedules this worker fires, by name.
    pub schedules: Vec<ScheduleDef>,
}

/// Builds a [`Worker`]. Defaults: every registered queue at concurrency 10, lease 30 s,
/// heartbeat 10 s, polling 25 ms → 1 s when idle, reaper every 5 s, shutdown timeout 20 s,
/// claims of up to 32 tasks, [`Retention::default`].
///
/// ```no_run
/// # use std::time::Duration;
/// # async fn f(pool: sqlx::MySqlPool) -> taskq::Result<()> {
/// let report = taskq::Worker::builder(pool)
///     .register_all()
///     .queue("orders", 4)
///     .lease(Duration::from_secs(10))
///     .heartbeat(Duration::from_secs(3))
///     .data(reqwest_like_client())
///     .shutdown_signal(async { tokio::signal::ctrl_c().await.ok(); })
///     .build()?
///     .run()
///     .await?;
/// println!("released at shutdown: {:?}", report.released);
/// # Ok(()) }
/// # #[derive(Clone)] struct Http; fn reqwest_like_client() -> Http { Http }
/// ```
#[must_use]
pub struct WorkerBuilder {
    store: Store,
    registrations: Vec<Registration>,
    queues: BTreeMap<String, usize>,
    default_concurrency: usize,
    concurrency: Option<usize>,
    lease: Duration,
    heartbeat: Option<Duration>,
    poll_min: Duration,
    poll_max: Duration,
    reaper_interval: Duration,
    retention: Retention,
    shutdown_timeout: Duration,
    cancel_grace: Option<Duration>,
    grace_unchecked: bool,
    claim_batch: usize,
    write_back_delay: Duration,
    output_limit: usize,
    db_connections: Option<u32>,
    backlog_interval: Option<Duration>,
    event_metrics_interval: Option<Duration>,
    worker_id: Option<String>,
    data: DataMap,
    shutdown: Option<ShutdownFuture>,
    trace_link: Option<TraceLink>,
    schedules: Vec<Result<ScheduleDef>>,
    observers: Vec<Observer>,
}

impl WorkerBuilder {
    pub(crate) fn new(store: Store) -> Self {
        Self {
            store,
            registrations: Vec::new(),
            queues: BTreeMap::new(),
            default_concurrency: 10,
            concurrency: None,
            lease: Duration::from_secs(30),
            heartbeat: None,
            poll_min: Duration::from_millis(25),
            poll_max: Duration::from_secs(1),
            reaper_interval: Duration::from_secs(5),
            retention: Retention::default(),
            shutdown_timeout: Duration::from_secs(20),
            cancel_grace: None,
            grace_unchecked: false,
            claim_batch: 32,
            write_back_delay: Duration::from_millis(2),
            output_limit: crate::defaults::DEFAULT_OUTPUT_LIMIT,
            db_connections: None,
            backlog_interval: None,
            event_metrics_interval: None,
            worker_id: None,
            data: DataMap::new(),
            shutdown: None,
            trace_link: None,
            schedules: Vec::new(),
            observers: Vec::new(),
        }
    }

    /// Handles every task registered with `#[task]` in this binary.
    pub fn register_all(mut self) -> Self {
        self.registrations.extend(registry::registered());
        self
    }
    /// Handles task `T` (a hand-written [`Task`] impl or a `#[task]` one).
    pub fn register<T: Task>(mut self) -> Self {
        self.registrations.push(Registration::of::<T>());
        self
    }
    /// Enqueues `task` (a task, or a task with `with_*` options such as a queue or a
    /// priority) at every tick of the cron `expression`, read in UTC, and handles the task
    /// like [`register`](Self::register). The schedule is named after the task; use
    /// [`schedule`](Self::schedule) for a name, a time zone or a [`MissedTicks`](crate::task::schedule::MissedTicks) policy.
    /// A bad expression is an [`Error::InvalidCron`] at [`build`](Self::build).
    ///
    /// ```no_run
    /// # use taskq::{Task, TaskContext, TaskError};
    /// # #[derive(serde::Serialize, serde::Deserialize)] struct NightlyReport { region: String }
    /// # impl Task for NightlyReport { const NAME: &'static str = "nightly_report";
    /// #   async fn run(self, _: TaskContext) -> Result<(), TaskError> { Ok(()) } }
    /// # async fn f(pool: sqlx::MySqlPool) -> taskq::Result<()> {
    /// taskq::Worker::builder(pool)
    ///     .cron("0 3 * * *", NightlyReport { region: "eu".into() })
    ///     .build()?
    ///     .run()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn cron<I: IntoEnqueue>(self, expression: impl Into<String>, task: I) -> Self {
        self.schedule(Schedule::new(expression, task))
    }
    /// Adds a recurring [`Schedule`] (with its name, time zone and missed-tick policy) and
    /// handles its task like [`register`](Self::register). Every worker that declares a
    /// schedule takes part in firing it; each tick is enqueued once however many run. The
    /// schedule's queue must be one this worker works.
    pub fn schedule<T: Task>(mut self, schedule: Schedule<T>) -> Self {
        self.registrations.push(Registration::of::<T>());
        self.schedules.push(schedule.into_def(Declared::Builder));
        self
    }
    /// Works `queue` with at most `concurrency` handlers at once. Once any queue is given,
    /// only the given queues are worked; otherwise every queue of a registered task is.
    pub fn queue(mut self, queue: impl Into<String>, concurrency: usize) -> Self {
        self.queues.insert(queue.into(), concurrency);
        self
    }
    /// Concurrency of queues not configured with [`queue`](Self::queue) (default 10).
    pub fn default_concurrency(mut self, n: usize) -> Self {
        self.default_concurrency = n;
        self
    }
    /// Upper bound of handlers running at once across all queues (default: the sum).
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = Some(n);
        self
    }
    /// Lease length on the database clock (default 30 s; 100 ms to [`MAX_DELAY`]). Every
    /// statement the worker runs must answer within half of it, or its connection is
    /// discarded and the statement retried. On SQLite it must also leave a renewal at least
    /// 200 ms (or the pool's busy timeout, if shorter) between its heartbeat and the lease's
    /// cancel point to get the write lock ([`Error::LeaseBelowBusyTimeout`]).
    pub fn lease(mut self, d: Duration) -> Self {
        self.lease = d;
        self
    }
    /// Heartbeat interval; must be shorter than the lease (default lease / 3).
    pub fn heartbeat(mut self, d: Duration) -> Self {
        self.heartbeat = Some(d);
        self
    }
    /// Adaptive polling bounds: `min` while work is found, growing to `max` when idle. `max`
    /// is also how often the worker re-reads which queues are paused or limited
    /// ([`Client::set_queue_limit`](crate::Client::set_queue_limit)).
    pub fn poll_interval(mut self, min: Duration, max: Duration) -> Self {
        self.poll_min = min;
        self.poll_max = max;
        self
    }
    /// How often this worker reaps expired leases (default 5 s).
    pub fn reaper_interval(mut self, d: Duration) -> Self {
        self.reaper_interval = d;
        self
    }
    /// Retention of terminal tasks.
    pub fn retention(mut self, r: Retention) -> Self {
        self.retention = r;
        self
    }
    /// Grace period for in-flight handlers at shutdown (default 20 s).
    pub fn shutdown_timeout(mut self, d: Duration) -> Self {
        self.shutdown_timeout = d;
        self
    }
    /// How long a canceled handler (lease lost, timeout, cancel request) may keep running
    /// before it is aborted: default 5 s, or half the lease when that is shorter. At most half
    /// the lease ([`build`](Self::build) refuses a longer one): a handler whose lease was not
    /// confirmed is signalled half a lease before its lease can end, so even one that ignores
    /// the signal is aborted before another worker can take the task.
    pub fn cancel_grace(mut self, d: Duration) -> Self {
        self.cancel_grace = Some(d);
        self
    }
    /// Tests only: a cancel grace that [`build`](Self::build) does not check against the lease,
    /// to exercise a handler that outlives its lease (as one blocked in synchronous code does).
    #[doc(hidden)]
    pub fn __unchecked_cancel_grace(mut self, d: Duration) -> Self {
        self.cancel_grace = Some(d);
        self.grace_unchecked = true;
        self
    }
    /// Most tasks one claim transaction takes (default 32).
    pub fn claim_batch(mut self, n: usize) -> Self {
        self.claim_batch = n;
        self
    }
    /// How long completions are gathered before one write-back statement (default 2 ms).
    pub fn write_back_delay(mut self, d: Duration) -> Self {
        self.write_back_delay = d;
        self
    }
    /// The largest output a handler may record ([`TaskContext::set_output`], or a
    /// `#[taskq::task]` fn's `Ok` value), in bytes of its JSON; default
    /// [`DEFAULT_OUTPUT_LIMIT`](crate::defaults::DEFAULT_OUTPUT_LIMIT) (64 KiB), at most
    /// [`MAX_OUTPUT_LIMIT`](crate::defaults::MAX_OUTPUT_LIMIT) (1 MiB; more is an
    /// [`Error::Config`] at [`build`](Self::build)). A larger output is not stored: the attempt
    /// fails permanently with [`OutputError::TooLarge`](crate::OutputError::TooLarge) in
    /// `last_error`, so a step after it never runs without it.
    ///
    /// [`TaskContext::set_output`]: crate::TaskContext::set_output
    pub fn output_limit(mut self, bytes: usize) -> Self {
        self.output_limit = bytes;
        self
    }
    /// Connections of the worker's own pools, in all (default `1 + min(queues, concurrency) +
    /// 1` above one slot; a single-slot worker: 1 on MySQL, 2 on SQLite). One is the control
    /// lane (lease renewals, presence beat, pause refresh), the rest the work lane (claims,
    /// write-backs, reaper and retention, scheduler); with 1 (MySQL only; SQLite takes at
    /// least 2) both lanes share it. Opened as needed.
    pub fn db_connections(mut self, n: u32) -> Self {
        self.db_connections = Some(n);
        self
    }
    /// Publishes the `taskq_backlog{queue, state}` gauge every `interval` (the counts of
    /// [`Client::stats`](crate::Client::stats): a covering read of every task's claim-index
    /// entry, plus the running rows; off by default).
    pub fn backlog_metrics(mut self, interval: Duration) -> Self {
        self.backlog_interval = Some(interval);
        self
    }
    /// Publishes the events' gauges every `interval`: `taskq_events_pending{topic}`,
    /// `taskq_events_lag_seconds{topic}` and `taskq_events_held_keys{topic}` (the figures of
    /// [`Client::event_stats`](crate::Client::event_stats): a read of the pending events'
    /// index entries and of the held keys; a topic that had figures and has none now is set
    /// to 0; off by default). One worker of a fleet is enough: every one reads the same rows.
    pub fn event_metrics(mut self, interval: Duration) -> Self {
        self.event_metrics_interval = Some(interval);
        self
    }
    /// Worker id recorded on claimed rows (default `host-pid-random`). Give each running worker
    /// its own: after a claim whose answer was lost, a worker gives back the tasks of its queue
    /// that carry its id and that it does not hold (see `docs/semantics.md`).
    pub fn worker_id(mut self, id: impl Into<String>) -> Self {
        self.worker_id = Some(id.into());
        self
    }
    /// Registers a shared value (a pool, an HTTP client, settings) handlers receive as
    /// [`Data<T>`](crate::Data), one per type.
    pub fn data<T: Clone + Send + Sync + 'static>(mut self, value: T) -> Self {
        self.data.insert(value);
        self
    }
    /// Called with each task's `taskq.task` span and the trace context recorded at enqueue
    /// (only for tasks that have one), before the handler runs: link the span to the
    /// producer's trace here (e.g. `span.add_link(..)` with `tracing-opentelemetry`).
    pub fn trace_link(
        mut self,
        link: impl Fn(&tracing::Span, &str) + Send + Sync + 'static,
    ) -> Self {
        self.trace_link = Some(std::sync::Arc::new(link));
        self
    }
    /// Calls `observer` with every outcome this worker learns, once its write-back's result
    /// is known: succeeded, retried, dead, canceled, snoozed, fenced, lease lost, rejected,
    /// released at shutdown, and the leases its reaper reaped (see [`TaskOutcome`]). For
    /// metrics and logging integrations. Several observers can be added; they are called in
    /// order.
    ///
    /// **Best-effort**, unlike the durable follow-ups of [`Task::ON_DEAD`]: an observer runs
    /// in this process after the commit, so an outcome written just before a crash is never
    /// observed, and one attempt may be observed by two workers (its fenced write-back here,
    /// its reap there). It runs on the worker's write-back loop, never inside a database
    /// transaction: keep it quick (hand slow work to a channel). A panicking observer is
    /// caught, logged and counted ([`StatsSnapshot::observer_panics`](crate::worker::StatsSnapshot::observer_panics));
    /// the worker goes on.
    ///
    /// [`TaskOutcome`]: crate::worker::TaskOutcome
    pub fn on_outcome(
        mut self,
        observer: impl Fn(&super::OutcomeEvent) + Send + Sync + 'static,
    ) -> Self {
        self.observers.push(std::sync::Arc::new(observer));
        self
    }
    /// Stops the worker gracefully when `signal` completes (instead of SIGINT/SIGTERM).
    pub fn shutdown_signal(mut self, signal: impl Future<Output = ()> + Send + 'static) -> Self {
        self.shutdown = Some(Box::pin(signal));
        self
    }

    /// Validates the settings and the handlers (duplicate names, missing data).
    pub fn build(self) -> Result<Worker> {
        let cfg_err = |m: String| Err(Error::Config(m));
        let handlers = registry::by_name(&self.registrations)?;
        if handlers.is_empty() {
            return cfg_err(
                "no task is registered (use #[taskq::task], register_all or register)".into(),
            );
        }
        let mut queues = self.queues.clone();
        if queues.is_empty() {
            for r in handlers.values() {
                queues.insert(r.queue.to_owned(), self.default_concurrency);
            }
        }
        for (q, n) in &queues {
            validate_name("queue", q, MAX_QUEUE_LEN)?;
            if *n == 0 {
                return cfg_err(format!("queue {q:?} has concurrency 0"));
            }
        }
        let sum: usize = queues.values().sum();
        let concurrency = self.concurrency.unwrap_or(sum);
        if concurrency == 0 {
            return cfg_err("concurrency must be at least 1".into());
        }
        if self.lease < Duration::from_millis(100) || self.lease > MAX_DELAY {
            return cfg_err(format!(
                "lease of {:?} is outside 100 ms ..= {} days",
                self.lease,
                MAX_DELAY.as_secs() / 86_400
            ));
        }
        for (what, keep) in [
            ("succeeded", self.retention.succeeded),
            ("dead", self.retention.dead),
            ("canceled", self.retention.canceled),
            ("expired", self.retention.expired),
        ] {
            if keep.is_some_and(|k| k > MAX_DELAY) {
                return cfg_err(format!(
                    "retention of {what} tasks is longer than {} days (use None to keep them forever)",
                    MAX_DELAY.as_secs() / 86_400
                ));
            }
        }
        let heartbeat = self.heartbeat.unwrap_or(self.lease / 3);
        if heartbeat.is_zero() || heartbeat >= self.lease {
            return cfg_err(format!(
                "heartbeat ({heartbeat:?}) must be non-zero and shorter than the lease ({:?})",
                self.lease
            ));
        }
        let cancel_grace = self
            .cancel_grace
            .unwrap_or(super::lanes::DEFAULT_CANCEL_GRACE.min(self.lease / 2));
        if cancel_grace > self.lease / 2 && !self.grace_unchecked {
            return cfg_err(format!(
                "cancel grace ({cancel_grace:?}) must be at most half the lease ({:?}): a handler \
                 that ignores its cancel signal would keep running after its lease ended, next \
                 to the task's next attempt",
                self.lease
            ));
        }
        if self.poll_min.is_zero() || self.poll_min > self.poll_max {
            return cfg_err("poll interval needs 0 < min <= max".into());
        }
        if self.reaper_interval.is_zero() || self.retention.interval.is_zero() {
            return cfg_err("reaper and retention intervals must be non-zero".into());
        }
        if self.claim_batch == 0 {
            return cfg_err("claim batch must be at least 1".into());
        }
        if self.output_limit > crate::defaults::MAX_OUTPUT_LIMIT {
            return cfg_err(format!(
                "output limit of {} bytes is over the largest, {} bytes (taskq::defaults::MAX_OUTPUT_LIMIT)",
                self.output_limit,
                crate::defaults::MAX_OUTPUT_LIMIT
            ));
        }
        for r in handlers.values() {
            if let Some(problem) = crate::retry::problem(&r.backoff) {
                return cfg_err(format!(
                    "task {:?} has an invalid backoff: {problem}",
                    r.name
                ));
            }
            for req in (r.required_data)() {
                if !self.data.contains(&req) {
                    return Err(Error::MissingData {
                        task: r.name,
                        ty: req.type_name,
                    });
                }
            }
        }
        let schedules = collect_schedules(&handlers, self.schedules, &queues)?;
        let worker_id = match self.worker_id {
            Some(id) => id,
            None => default_worker_id(),
        };
        validate_name("worker id", &worker_id, 128)?;
        let db_connections = self
            .db_connections
            .unwrap_or_else(|| {
                let min = super::lanes::min_connections(&self.store);
                super::lanes::default_connections(queues.len(), concurrency, min)
            })
            .max(super::lanes::min_connections(&self.store));
        if let Some(busy) = self.store.busy_timeout() {
            let grace = (cancel_grace, self.cancel_grace.is_none());
            super::lanes::check_sqlite_lease(self.lease, heartbeat, grace, busy)?;
        }
        let health = std::sync::Arc::new(super::health::HealthInner::new(
            worker_id.clone(),
            self.lease,
        ));
        Ok(Worker {
            user_store: self.store,
            cfg: Config {
                worker_id,
                queues,
                concurrency,
                lease: self.lease,
                heartbeat,
                statement_timeout: self.lease / 2,
                poll_min: self.poll_min,
                poll_max: self.poll_max,
                reaper_interval: self.reaper_interval,
                retention: self.retention,
                shutdown_timeout: self.shutdown_timeout,
                cancel_grace,
                claim_batch: self.claim_batch,
                write_back_delay: self.write_back_delay,
                output_limit: self.output_limit,
                db_connections,
                backlog_interval: self.backlog_interval.filter(|d| !d.is_zero()),
                event_metrics_interval: self.event_metrics_interval.filter(|d| !d.is_zero()),
                schedules,
            },
            handlers,
            data: self.data,
            shutdown: self.shutdown,
            trace_link: self.trace_link,
            observers: self.observers,
            stats: Default::default(),
            health,
        })
    }
}

/// The schedules a worker fires: those declared on its tasks (skipped when the worker does
/// not work the task's queue) and those given to the builder (an error then), sorted by name;
/// a name declared twice is an error.
fn collect_schedules(
    handlers: &HashMap<&'static str, Registration>,
    from_builder: Vec<Result<ScheduleDef>>,
    queues: &BTreeMap<String, usize>,
) -> Result<Vec<ScheduleDef>> {
    let mut out: Vec<ScheduleDef> = Vec::new();
    let mut declared: Vec<Result<ScheduleDef>> =
        handlers.values().filter_map(|r| (r.schedule)()).collect();
    declared.extend(from_builder);
    for def in declared {
        let def = def?;
        if !queues.contains_key(&def.queue) {
            if def.declared_on == Declared::Builder {
                return Err(Error::InvalidCron {
                    schedule: def.name,
                    reason: format!(
                        "it enqueues on queue {:?}, which this worker does not work (add it with WorkerBuilder::queue)",
                        def.queue
                    ),
                });
            }
            tracing::debug!(schedule = %def.name, queue = %def.queue,
                "taskq: schedule of a queue this worker does not work: not fired here");
            continue;
        }
        if let Some(prev) = out.iter().find(|p| p.name == def.name) {
            return Err(Error::InvalidCron {
                schedule: def.name.clone(),
                reason: format!(
                    "the name is declared twice (for task {:?} and for task {:?}); give each schedule its own name with Schedule::name",
                    prev.task_name, def.task_name
                ),
            });
        }
        out.push(def);
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// This machine's host name (`HOSTNAME`, else `/etc/hostname`), at most 64 characters.
pub(crate) fn hostname() -> Option<String> {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().chars().take(64).collect::<String>())
        .filter(|h| !h.is_empty())
}

fn default_worker_id() -> String {
    let host = hostname().unwrap_or_else(|| "worker".into());
    format!("{host}-{}-{:04x}", std::process::id(), fastrand::u16(..))
}
