//! Scenarios on a three-node Galera cluster, shared by `tests/galera.rs` (small sizes) and
//! the reliability runner's `galera` mode (full sizes).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::MySqlPool;
use sqlx::mysql::MySqlPoolOptions;
use taskq::worker::StatsSnapshot;
use taskq::{Task, TaskContext, TaskError};
use taskq_tests::galera::GaleraCluster;
use taskq_tests::{RunningWorker, fast_worker, wait_until};

/// Handler runs per task id, recorded in-process (every worker of a scenario runs in the
/// test process), with the lease epoch and worker id of each run.
#[derive(Clone, Default)]
pub struct Runs(pub Arc<Mutex<HashMap<u64, Vec<Run>>>>);

/// One handler run: the lease epoch and the worker id.
pub type Run = (u64, String);

impl Runs {
    /// `(tasks run, runs in all, tasks run more than once)`.
    pub fn summary(&self) -> (usize, usize, usize) {
        let m = self.0.lock().unwrap();
        let runs = m.values().map(Vec::len).sum();
        let dup = m.values().filter(|v| v.len() > 1).count();
        (m.len(), runs, dup)
    }
    /// Tasks run more than once, with their runs.
    pub fn duplicates(&self) -> Vec<(u64, Vec<Run>)> {
        let m = self.0.lock().unwrap();
        m.iter()
            .filter(|(_, v)| v.len() > 1)
            .map(|(k, v)| (*k, v.clone()))
            .collect()
    }

    /// Checks that every task run more than once ran under distinct lease epochs (a lease
    /// expired and the task was claimed again; never two runs of one lease) and that every
    /// run but the last was `lost_worker`'s (the only worker whose leases could expire).
    pub fn check_duplicates(&self, lost_worker: &str) {
        for (id, mut runs) in self.duplicates() {
            runs.sort();
            let epochs: std::collections::HashSet<u64> = runs.iter().map(|r| r.0).collect();
            assert_eq!(
                epochs.len(),
                runs.len(),
                "task {id} ran twice on one lease: {runs:?}"
            );
            assert!(
                runs[..runs.len() - 1].iter().all(|r| r.1 == lost_worker),
                "task {id} ran again although its earlier run was not {lost_worker}'s: {runs:?}"
            );
        }
    }
}

/// A task that records its run and sleeps `ms`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Work {
    /// The business row (order) this task belongs to.
    pub order: u64,
    /// Handler time in milliseconds.
    pub ms: u64,
}

impl Task for Work {
    const NAME: &'static str = "galera_work";
    const QUEUE: &'static str = "galera";
    const MAX_ATTEMPTS: u32 = 25;
    async fn run(self, cx: TaskContext) -> Result<(), TaskError> {
        let runs = cx.data::<Runs>().expect("Runs registered");
        runs.0
            .lock()
            .unwrap()
            .entry(cx.id().0)
            .or_default()
            .push((cx.lease_epoch(), cx.worker_id().to_owned()));
        if self.ms > 0 {
            tokio::time::sleep(Duration::from_millis(self.ms)).await;
        }
        Ok(())
    }
}

/// A database on the cluster with a pool on each node; migrated through node 1.
pub struct ClusterDb {
    pub pools: Vec<MySqlPool>,
}

impl ClusterDb {
    pub async fn new(cluster: &GaleraCluster, name: &str, per_node: u32) -> Self {
        let urls = cluster
            .create_database(name)
            .await
            .expect("create database");
        let mut pools = Vec::new();
        for url in &urls {
            let pool = MySqlPoolOptions::new()
                .max_connections(per_node)
                .acquire_timeout(Duration::from_secs(5))
                .connect(url)
                .await
                .expect("connect to a node");
            pools.push(pool);
        }
        taskq::migrate(&pools[0]).await.expect("migrate on node 1");
        sqlx::raw_sql(
            "CREATE TABLE orders (id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY, \
             node TINYINT NOT NULL)",
        )
        .execute(&pools[0])
        .await
        .expect("create orders");
        let db = Self { pools };
        // DDL returns on node 1 before the others have applied it: wait for them.
        for i in 0..db.pools.len() {
            db.count(i, "TRUE").await;
        }
        db
    }

    /// `SELECT COUNT(*) FROM taskq_tasks WHERE cond` on node `i`, after waiting for the node
    /// to have applied everything committed anywhere before (`wsrep_sync_wait`).
    pub async fn count(&self, i: usize, cond: &str) -> i64 {
        let mut conn = self.pools[i].acquire().await.expect("connection");
        sqlx::raw_sql("SET SESSION wsrep_sync_wait = 1")
            .execute(&mut *conn)
            .await
            .expect("sync wait");
        let n = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT COUNT(*) FROM taskq_tasks WHERE {cond}"
        )))
        .fetch_one(&mut *conn)
        .await
        .expect("count");
        sqlx::raw_sql("SET SESSION wsrep_sync_wait = 0")
            .execute(&mut *conn)
            .await
            .expect("sync wait off");
        n
    }
}

/// Worker settings of the scenarios: `concurrency` slots, a lease short enough that a lost
/// node's tasks come back within seconds, yet longer than the cluster's stall while it
/// evicts a failed node (commits on every node wait for the new view: about 3 s with the
/// fixture's `evs` timeouts). A lease shorter than that stall expires on the survivors too.
pub fn worker(pool: &MySqlPool, runs: &Runs, concurrency: usize, id: &str) -> RunningWorker {
    RunningWorker::spawn(
        fast_worker(pool)
            .register::<Work>()
            .data(runs.clone())
            .queue(Work::QUEUE, concurrency)
            .lease(LEASE)
            .heartbeat(Duration::from_secs(1))
            .shutdown_timeout(Duration::from_secs(3))
            .worker_id(id),
    )
}

/// The scenarios' lease.
pub const LEASE: Duration = Duration::from_secs(6);

/// Sum of the counters of several workers' final reports.
pub fn total(stats: &[StatsSnapshot]) -> StatsSnapshot {
    let mut t = StatsSnapshot::default();
    for s in stats {
        t.claimed += s.claimed;
        t.succeeded += s.succeeded;
        t.db_errors += s.db_errors;
        t.db_conflicts += s.db_conflicts;
        t.fenced += s.fenced;
        t.lost_leases += s.lost_leases;
        t.reaped += s.reaped;
        t.claim_queries += s.claim_queries;
        t.claims_limited += s.claims_limited;
    }
    t
}

/// What a drain measured.
#[derive(Debug)]
pub struct Drain {
    pub tasks: u64,
    pub secs: f64,
    pub stats: StatsSnapshot,
    /// Tasks run more than once.
    pub duplicates: usize,
}

impl Drain {
    pub fn rate(&self) -> f64 {
        self.tasks as f64 / self.secs
    }
}

/// Enqueues `tasks` tasks (enqueue_many through node 1), then drains them with one worker of
/// `concurrency` slots on each node listed in `nodes`; checks every task succeeded and ran once.
pub async fn drain(
    cluster: &GaleraCluster,
    name: &str,
    tasks: u64,
    nodes: &[usize],
    concurrency: usize,
) -> Drain {
    let db = ClusterDb::new(cluster, name, (concurrency as u32 + 8).max(16)).await;
    let mut tx = db.pools[0].begin().await.unwrap();
    taskq::enqueue::enqueue_many(&mut tx, (0..tasks).map(|order| Work { order, ms: 0 }))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let runs = Runs::default();
    let started = Instant::now();
    let workers: Vec<RunningWorker> = nodes
        .iter()
        .map(|&i| {
            worker(
                &db.pools[i],
                &runs,
                concurrency,
                &format!("{name}-n{}", i + 1),
            )
        })
        .collect();
    let done = tasks as i64;
    wait_until(Duration::from_secs(300), "the drain to finish", || async {
        db.count(0, "state = 'succeeded'").await == done
    })
    .await;
    let secs = started.elapsed().as_secs_f64();
    let mut stats = Vec::new();
    for w in workers {
        stats.push(w.stop().await.stats);
    }
    let (ran, _, duplicates) = runs.summary();
    assert_eq!(ran as u64, tasks, "every task ran");
    Drain {
        tasks,
        secs,
        stats: total(&stats),
        duplicates,
    }
}

/// Handlers of a limited queue running at this moment, across every worker of the test
/// process (all of a scenario's workers run in it), and the most seen at once.
#[derive(Clone, Default)]
pub struct Gauge(pub Arc<GaugeInner>);

#[derive(Default)]
pub struct GaugeInner {
    now: std::sync::atomic::AtomicUsize,
    max: std::sync::atomic::AtomicUsize,
    /// Handler starts that found `limit` or more others already running (over the limit).
    over: std::sync::atomic::AtomicUsize,
    limit: std::sync::atomic::AtomicUsize,
    starts: std::sync::atomic::AtomicUsize,
}

impl Gauge {
    pub fn new(limit: usize) -> Self {
        let g = Self::default();
        g.0.limit.store(limit, std::sync::atomic::Ordering::SeqCst);
        g
    }
    /// `(most running at once, starts over the limit, starts)`.
    pub fn summary(&self) -> (usize, usize, usize) {
        use std::sync::atomic::Ordering::SeqCst;
        (
            self.0.max.load(SeqCst),
            self.0.over.load(SeqCst),
            self.0.starts.load(SeqCst),
        )
    }
}

/// One running handler on the gauge: counted from `enter` until dropped.
struct Running(Gauge);

impl Running {
    fn enter(g: &Gauge) -> Self {
        use std::sync::atomic::Ordering::SeqCst;
        let now = g.0.now.fetch_add(1, SeqCst) + 1;
        g.0.max.fetch_max(now, SeqCst);
        g.0.starts.fetch_add(1, SeqCst);
        if now > g.0.limit.load(SeqCst) {
            g.0.over.fetch_add(1, SeqCst);
        }
        Self(g.clone())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0
            .0
            .now
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A task of the limited queue: counts itself on the [`Gauge`] while it sleeps `ms`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Capped {
    pub ms: u64,
}

impl Task for Capped {
    const NAME: &'static str = "galera_capped";
    const QUEUE: &'static str = "galera_capped";
    const MAX_ATTEMPTS: u32 = 25;
    async fn run(self, cx: TaskContext) -> Result<(), TaskError> {
        let _running = Running::enter(&cx.data::<Gauge>().expect("Gauge registered"));
        tokio::time::sleep(Duration::from_millis(self.ms)).await;
        Ok(())
    }
}

/// What a drain of a limited queue measured.
#[derive(Debug)]
pub struct LimitedDrain {
    /// Most handlers of the queue running at once, fleet-wide.
    pub max_running: usize,
    /// Handler starts over the limit.
    pub over: usize,
    pub secs: f64,
    pub stats: StatsSnapshot,
}

/// Sets a concurrency limit of `limit` on [`Capped`]'s queue, enqueues `tasks` tasks of
/// `ms` through node 1 and drains them with `per_node` workers of `slots` slots on each node
/// (every worker sees the queue as limited from its start); records the most handlers that
/// ran at once.
pub async fn limited_drain(
    cluster: &GaleraCluster,
    name: &str,
    tasks: u64,
    limit: u32,
    per_node: usize,
    slots: usize,
    ms: u64,
) -> LimitedDrain {
    let db = ClusterDb::new(cluster, name, (per_node * (slots + 8)) as u32 + 8).await;
    taskq::Client::new(db.pools[0].clone())
        .set_queue_limit(Capped::QUEUE, Some(limit))
        .await
        .expect("set the limit");
    let mut tx = db.pools[0].begin().await.unwrap();
    taskq::enqueue::enqueue_many(&mut tx, (0..tasks).map(|_| Capped { ms }))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    // Every node has the limit and the tasks before a worker starts.
    for i in 0..3 {
        db.count(i, "TRUE").await;
    }
    let gauge = Gauge::new(limit as usize);
    let started = Instant::now();
    let mut workers = Vec::new();
    for node in 0..3 {
        for k in 0..per_node {
            workers.push(RunningWorker::spawn(
                fast_worker(&db.pools[node])
                    .register::<Capped>()
                    .data(gauge.clone())
                    .queue(Capped::QUEUE, slots)
                    .lease(LEASE)
                    .heartbeat(Duration::from_secs(1))
                    .shutdown_timeout(Duration::from_secs(3))
                    .worker_id(format!("{name}-n{}-{k}", node + 1)),
            ));
        }
    }
    let done = tasks as i64;
    wait_until(
        Duration::from_secs(300),
        "the limited drain to finish",
        || async { db.count(0, "state = 'succeeded'").await == done },
    )
    .await;
    let secs = started.elapsed().as_secs_f64();
    let mut stats = Vec::new();
    for w in workers {
        stats.push(w.stop().await.stats);
    }
    let (max_running, over, starts) = gauge.summary();
    assert_eq!(starts as u64, tasks, "every task ran once");
    LimitedDrain {
        max_running,
        over,
        secs,
        stats: total(&stats),
    }
}
