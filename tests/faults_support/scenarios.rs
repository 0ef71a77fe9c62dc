//! Each scenario of issue 5 as a function returning what happened. The tests in
//! `tests/faults.rs` assert on the results with small sizes; `taskq-reliability` runs them at
//! full size and prints the figures.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use sqlx::MySqlPool;
use sqlx::mysql::MySqlPoolOptions;
use taskq::{Task, worker::StatsSnapshot};
use taskq_tests::proxy::{ChaosProxy, HEARTBEAT_SQL};
use taskq_tests::{RunningWorker, fast_worker};

use super::*;

/// Enqueues `n` [`Hold`] tasks; returns their ids.
async fn enqueue_holds(pool: &MySqlPool, n: usize) -> Vec<u64> {
    enqueue_holds_with(pool, n, false).await
}

async fn enqueue_holds_with(pool: &MySqlPool, n: usize, ignore_cancel: bool) -> Vec<u64> {
    let mut ids = Vec::new();
    for i in 0..n {
        let hold = Hold {
            n: i as u32,
            ignore_cancel,
        };
        ids.push(hold.enqueue(pool).await.unwrap().id.0);
    }
    ids
}

/// Waits until every task in `ids` has a `started` event by `worker`.
async fn wait_started_by(pool: &MySqlPool, ids: &[u64], worker: &str, timeout: Duration) {
    let list = ids.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
    let sql = format!(
        "SELECT COUNT(DISTINCT task_id) FROM fault_events
         WHERE event = 'started' AND worker_id = '{worker}' AND task_id IN ({list})"
    );
    wait_for(timeout, &format!("{worker} started all tasks"), || async {
        count(pool, &sql).await == ids.len() as i64
    })
    .await;
}

async fn wait_all_state(pool: &MySqlPool, ids: &[u64], state: &str, timeout: Duration) {
    let list = ids.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
    let sql =
        format!("SELECT COUNT(*) FROM taskq_tasks WHERE state = '{state}' AND id IN ({list})");
    wait_for(timeout, &format!("all tasks {state}"), || async {
        count(pool, &sql).await == ids.len() as i64
    })
    .await;
}

/// The in-process "other worker" of scenarios 1 and 2, with the child's intervals.
fn other_worker(db: &FaultDb, id: &str, s: &ChildSettings) -> RunningWorker {
    RunningWorker::spawn(
        fast_worker(&db.pool)
            .register::<Hold>()
            .queue("faults", 8)
            .worker_id(id)
            .lease(s.lease)
            .heartbeat(s.heartbeat)
            .reaper_interval(s.reaper)
            .data(db.pool.clone()),
    )
}

fn first_event<'a>(events: &'a [Event], worker: &str, event: &str) -> Option<&'a Event> {
    events
        .iter()
        .find(|e| e.worker_id == worker && e.event == event)
}

/// Result of one SIGKILL (or SIGTERM) trial.
#[derive(Debug)]
pub struct TakeoverTrial {
    /// The killed (or terminated) child's id.
    pub first: String,
    /// The in-process worker that took over.
    pub second: String,
    /// Final rows.
    pub rows: Vec<Row>,
    /// Per task: kill (or SIGTERM) → the second worker's handler started (s).
    pub takeover: Vec<f64>,
    /// Per task (SIGTERM only): release written → the second worker's handler started (s).
    pub after_release: Vec<f64>,
    /// The child's report (SIGTERM only).
    pub report: Option<ChildReport>,
    /// Epochs of the second worker's runs.
    pub second_epochs: Vec<u64>,
    /// SIGTERM only: tasks the child did not release (they waited for their lease to expire).
    pub not_released: Vec<u64>,
}

/// Scenario 1: a child worker holds `tasks` tasks; it is killed with SIGKILL (or, when
/// `graceful`, sent SIGTERM with a short shutdown timeout) while an in-process worker runs.
/// Needs [`FaultDb::log_transitions`] for the release times.
pub async fn takeover_trial(
    db: &FaultDb,
    exe: &Path,
    tasks: usize,
    graceful: bool,
    trial: usize,
) -> TakeoverTrial {
    let settings = ChildSettings {
        shutdown_timeout: Duration::from_millis(300),
        ..ChildSettings::default()
    };
    takeover_trial_with(db, exe, &settings, tasks, graceful, trial).await
}

/// [`takeover_trial`] with the lease settings of `settings`, for the child and the test
/// process's worker alike.
pub async fn takeover_trial_with(
    db: &FaultDb,
    exe: &Path,
    settings: &ChildSettings,
    tasks: usize,
    graceful: bool,
    trial: usize,
) -> TakeoverTrial {
    let settings = settings.clone();
    let ids = enqueue_holds(&db.pool, tasks).await;
    let a_id = format!("child-{trial}");
    let a = ChildWorker::spawn(exe, &db.url, &a_id, &settings).await;
    wait_started_by(&db.pool, &ids, &a_id, Duration::from_secs(30)).await;
    let b_id = format!("other-{trial}");
    let b = other_worker(db, &b_id, &settings);
    // Let the other worker finish its start-up (first empty claim) and the child beat once.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (t0, report) = if graceful {
        let t0 = Utc::now();
        a.signal("TERM");
        (t0, Some(a.report(Duration::from_secs(30)).await))
    } else {
        (a.sigkill().await, None)
    };
    wait_all_state(
        &db.pool,
        &ids,
        "succeeded",
        settings.lease + Duration::from_secs(20),
    )
    .await;
    b.stop().await;
    let mut takeover = Vec::new();
    let mut after_release = Vec::new();
    let mut second_epochs = Vec::new();
    let mut not_released = Vec::new();
    for id in &ids {
        let ev = events(&db.pool, *id).await;
        let started = first_event(&ev, &b_id, "started")
            .unwrap_or_else(|| panic!("task {id} was not started by {b_id}: {ev:?}"));
        second_epochs.push(started.lease_epoch);
        takeover.push(secs(started.at - t0));
        if graceful {
            let released: Option<DateTime<Utc>> = sqlx::query_scalar(
                "SELECT MIN(at) FROM fault_transitions WHERE task_id = ?
                   AND old_state = 'running' AND new_state = 'pending' AND worker_id IS NULL",
            )
            .bind(id)
            .fetch_one(&db.pool)
            .await
            .unwrap();
            match released {
                Some(released) => after_release.push(secs(started.at - released)),
                None => not_released.push(*id),
            }
        }
    }
    TakeoverTrial {
        first: a_id,
        second: b_id,
        rows: rows(&db.pool, &ids).await,
        takeover,
        after_release,
        report,
        second_epochs,
        not_released,
    }
}

/// Scenario 1 with a backlog: a child holds `tasks` [`Hold`] tasks; `backlog` [`Busy`] tasks of
/// `busy_ms` each are enqueued after them (the child does not register `Busy`), an in-process
/// worker (concurrency 8) starts draining them, and 300 ms later the child gets SIGKILL. The
/// killed tasks are reaped after their lease while the backlog is still pending: this measures
/// how long they then wait. Needs [`FaultDb::log_transitions`].
pub async fn backlog_takeover_trial(
    db: &FaultDb,
    exe: &Path,
    tasks: usize,
    backlog: usize,
    busy_ms: u64,
    trial: usize,
) -> BacklogTrial {
    let settings = ChildSettings::default();
    let ids = enqueue_holds(&db.pool, tasks).await;
    let a_id = format!("child-{trial}");
    let a = ChildWorker::spawn(exe, &db.url, &a_id, &settings).await;
    wait_started_by(&db.pool, &ids, &a_id, Duration::from_secs(30)).await;
    let mut busy = Vec::new();
    for n in 0..backlog {
        let task = Busy {
            n: n as u32,
            ms: busy_ms,
        };
        busy.push(task.enqueue(&db.pool).await.unwrap().id.0);
    }
    let b_id = format!("busy-{trial}");
    let b = RunningWorker::spawn(
        fast_worker(&db.pool)
            .register::<Hold>()
            .register::<Busy>()
            .queue("faults", 8)
            .worker_id(&b_id)
            .lease(settings.lease)
            .heartbeat(settings.heartbeat)
            .reaper_interval(settings.reaper)
            .data(db.pool.clone()),
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t0 = a.sigkill().await;
    let mut all = ids.clone();
    all.extend(&busy);
    let drain = Duration::from_millis(busy_ms * backlog as u64 / 8);
    wait_all_state(
        &db.pool,
        &all,
        "succeeded",
        settings.lease + drain + Duration::from_secs(30),
    )
    .await;
    b.stop().await;
    let busy_list = busy
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let mut out = BacklogTrial {
        all_ok: rows(&db.pool, &ids)
            .await
            .iter()
            .all(|r| r.state == "succeeded" && r.worker_id.as_deref() == Some(b_id.as_str())),
        ..BacklogTrial::default()
    };
    for id in &ids {
        let reaped: DateTime<Utc> = sqlx::query_scalar(
            "SELECT MIN(at) FROM fault_transitions WHERE task_id = ?
               AND old_state = 'running' AND new_state = 'pending'",
        )
        .bind(id)
        .fetch_one(&db.pool)
        .await
        .unwrap();
        let ev = events(&db.pool, *id).await;
        let started = first_event(&ev, &b_id, "started")
            .unwrap_or_else(|| panic!("task {id} was not started by {b_id}: {ev:?}"))
            .at;
        let started_before = |at: DateTime<Utc>| {
            let busy_list = busy_list.clone();
            async move {
                count(
                    &db.pool,
                    &format!(
                        "SELECT COUNT(*) FROM fault_transitions WHERE task_id IN ({busy_list})
                           AND new_state = 'running'
                           AND at < '{}'",
                        at.format("%Y-%m-%d %H:%M:%S%.6f")
                    ),
                )
                .await
            }
        };
        let claimed: DateTime<Utc> = sqlx::query_scalar(
            "SELECT MIN(at) FROM fault_transitions WHERE task_id = ?
               AND old_state = 'pending' AND new_state = 'running' AND worker_id = ?",
        )
        .bind(id)
        .bind(&b_id)
        .fetch_one(&db.pool)
        .await
        .unwrap();
        let at_reap = started_before(reaped).await;
        out.reaped.push(secs(reaped - t0));
        out.rerun.push(secs(started - t0));
        out.pending_at_reap.push(backlog as i64 - at_reap);
        out.started_between
            .push(started_before(claimed).await - at_reap);
    }
    out
}

/// Result of scenario 2.
#[derive(Debug)]
pub struct PauseTrial {
    pub paused: String,
    pub other: String,
    /// The row once the other worker finished it, and after the paused worker resumed.
    pub row_before_resume: Row,
    pub row_after_resume: Row,
    /// Events of the task (both workers).
    pub events: Vec<Event>,
    /// The paused child's exit report.
    pub report: ChildReport,
    /// SIGSTOP → the other worker's handler started (s).
    pub takeover: f64,
}

/// Scenario 2: SIGSTOP a child mid-handler past its lease, let an in-process worker take over
/// and finish, SIGCONT the child, then SIGTERM it and read its counters.
pub async fn pause_trial(db: &FaultDb, exe: &Path, trial: usize) -> PauseTrial {
    let settings = ChildSettings::default();
    let ids = enqueue_holds(&db.pool, 1).await;
    let id = ids[0];
    let a_id = format!("paused-{trial}");
    let a = ChildWorker::spawn(exe, &db.url, &a_id, &settings).await;
    wait_started_by(&db.pool, &ids, &a_id, Duration::from_secs(30)).await;
    a.signal("STOP");
    let stopped = Utc::now();
    let b_id = format!("taker-{trial}");
    let b = other_worker(db, &b_id, &settings);
    wait_all_state(
        &db.pool,
        &ids,
        "succeeded",
        settings.lease + Duration::from_secs(20),
    )
    .await;
    b.stop().await;
    let row_before_resume = rows(&db.pool, &ids).await.remove(0);
    a.signal("CONT");
    wait_for(
        Duration::from_secs(20),
        "the resumed handler saw its cancel signal",
        || async {
            let ev = events(&db.pool, id).await;
            ev.iter()
                .any(|e| e.worker_id == a_id && e.event.starts_with("canceled:"))
        },
    )
    .await;
    a.signal("TERM");
    let report = a.report(Duration::from_secs(30)).await;
    let events = events(&db.pool, id).await;
    let takeover = first_event(&events, &b_id, "started")
        .map(|e| secs(e.at - stopped))
        .unwrap_or(f64::NAN);
    PauseTrial {
        paused: a_id,
        other: b_id,
        row_before_resume,
        row_after_resume: rows(&db.pool, &ids).await.remove(0),
        events,
        report,
        takeover,
    }
}

/// Settings of the load scenarios (3 and 4).
#[derive(Debug, Clone)]
pub struct LoadSettings {
    pub tasks: u32,
    pub workers: usize,
    pub concurrency: usize,
    pub sleep_ms: u64,
    pub lease: Duration,
    /// Scenario 3: server down this long. Scenario 4: chaos this long (zero: until done).
    pub outage: Duration,
    /// Scenario 3: kill the server when this share of tasks succeeded.
    pub kill_at: f64,
    /// Scenario 4: chaos pause range and cut probability.
    pub chaos_every: std::ops::Range<Duration>,
    pub chaos_probability: f64,
}

impl LoadSettings {
    pub fn small() -> Self {
        Self {
            tasks: 1200,
            workers: 3,
            concurrency: 8,
            sleep_ms: 20,
            lease: Duration::from_secs(2),
            outage: Duration::from_secs(4),
            kill_at: 0.25,
            chaos_every: Duration::from_millis(50)..Duration::from_millis(200),
            chaos_probability: 0.25,
        }
    }
}

/// Result of scenarios 3 and 4: every execution and every final row.
#[derive(Debug)]
pub struct LoadRun {
    pub tasks: u32,
    pub rows: Vec<Row>,
    pub seen: HashMap<u64, Vec<Exec>>,
    pub reports: Vec<taskq::worker::ShutdownReport>,
    /// Succeeded when the fault was injected.
    pub done_at_fault: i64,
    /// Total wall time, and from the end of the fault until the last task succeeded.
    pub elapsed: Duration,
    pub recovery: Duration,
    /// Scenario 4: connections the proxy cut.
    pub cuts: u64,
}

impl LoadRun {
    /// Tasks executed more than once.
    pub fn duplicated(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self
            .seen
            .iter()
            .filter(|(_, e)| e.len() > 1)
            .map(|(id, _)| *id)
            .collect();
        v.sort_unstable();
        v
    }
    /// Tasks whose lease expired at least once (the reaper wrote `lease expired` and bumped the
    /// epoch): the only ones allowed to run more than once.
    pub fn reaped(&self) -> HashSet<u64> {
        self.rows
            .iter()
            .filter(|r| {
                r.last_error
                    .as_deref()
                    .is_some_and(|e| e.starts_with("lease expired"))
            })
            .map(|r| r.id)
            .collect()
    }
    pub fn executions(&self) -> usize {
        self.seen.values().map(Vec::len).sum()
    }
    pub fn stats(&self) -> StatsSnapshot {
        let mut t = StatsSnapshot::default();
        for r in &self.reports {
            let s = r.stats;
            t.claimed += s.claimed;
            t.succeeded += s.succeeded;
            t.retried += s.retried;
            t.fenced += s.fenced;
            t.lost_leases += s.lost_leases;
            t.reaped += s.reaped;
            t.db_errors += s.db_errors;
        }
        t
    }

    /// The invariants of scenarios 3 and 4; returns a description of the first violation.
    pub fn check(&self) -> Result<(), String> {
        if self.rows.len() != self.tasks as usize {
            return Err(format!(
                "{} rows for {} tasks enqueued",
                self.rows.len(),
                self.tasks
            ));
        }
        if let Some(r) = self.rows.iter().find(|r| r.state != "succeeded") {
            return Err(format!("task not succeeded: {r:?}"));
        }
        if let Some(r) = self.rows.iter().find(|r| !self.seen.contains_key(&r.id)) {
            return Err(format!("task succeeded but never executed: {r:?}"));
        }
        for (id, ex) in &self.seen {
            let epochs: HashSet<u64> = ex.iter().map(|e| e.epoch).collect();
            if epochs.len() != ex.len() {
                return Err(format!("task {id} ran twice under one lease epoch: {ex:?}"));
            }
        }
        let reaped = self.reaped();
        for id in self.duplicated() {
            if !reaped.contains(&id) {
                let row = self.rows.iter().find(|r| r.id == id);
                return Err(format!(
                    "task {id} ran {} times without a lease expiry: {:?} {row:?}",
                    self.seen[&id].len(),
                    self.seen[&id]
                ));
            }
        }
        Ok(())
    }
}

async fn enqueue_work(pool: &MySqlPool, tasks: u32, sleep_ms: u64) {
    let mut n = 0;
    while n < tasks {
        let mut tx = pool.begin().await.unwrap();
        for _ in 0..500.min(tasks - n) {
            Work { n, sleep_ms }.enqueue_tx(&mut tx).await.unwrap();
            n += 1;
        }
        tx.commit().await.unwrap();
    }
}

fn load_workers(pool: &MySqlPool, s: &LoadSettings, seen: &Seen) -> Vec<RunningWorker> {
    (0..s.workers)
        .map(|i| {
            RunningWorker::spawn(
                fast_worker(pool)
                    .register::<Work>()
                    .queue("load", s.concurrency)
                    .worker_id(format!("w{i}"))
                    .lease(s.lease)
                    .heartbeat(s.lease / 4)
                    .reaper_interval(Duration::from_millis(200))
                    .data(seen.clone()),
            )
        })
        .collect()
}

#[allow(clippy::too_many_arguments)]
async fn finish_load(
    db: &FaultDb,
    s: &LoadSettings,
    seen: Seen,
    workers: Vec<RunningWorker>,
    started: Instant,
    fault_over: Instant,
    done_at_fault: i64,
    cuts: u64,
) -> LoadRun {
    let want = i64::from(s.tasks);
    wait_for(Duration::from_secs(120), "every task succeeded", || async {
        db.count("state = 'succeeded'").await == want
    })
    .await;
    let elapsed = started.elapsed();
    let recovery = fault_over.elapsed();
    let mut reports = Vec::new();
    for w in workers {
        reports.push(w.stop().await);
    }
    LoadRun {
        tasks: s.tasks,
        rows: rows(&db.pool, &[]).await,
        seen: seen.snapshot(),
        reports,
        done_at_fault,
        elapsed,
        recovery,
        cuts,
    }
}

/// Scenario 3: kill the database server under load, keep it down for `outage`, restart it.
pub async fn db_outage(db: &mut FaultDb, s: &LoadSettings) -> LoadRun {
    enqueue_work(&db.pool, s.tasks, s.sleep_ms).await;
    let seen = Seen::default();
    let started = Instant::now();
    let workers = load_workers(&db.pool, s, &seen);
    let threshold = (f64::from(s.tasks) * s.kill_at) as i64;
    wait_for(Duration::from_secs(60), "some tasks done", || async {
        db.count("state = 'succeeded'").await >= threshold
    })
    .await;
    let done_at_fault = db.count("state = 'succeeded'").await;
    db.server.kill().await;
    tokio::time::sleep(s.outage).await;
    db.server
        .restart()
        .await
        .unwrap_or_else(|e| panic!("restart: {e}\n{}", db.server.log_tail(30)));
    let fault_over = Instant::now();
    finish_load(db, s, seen, workers, started, fault_over, done_at_fault, 0).await
}

/// Scenario 4: the workers reach the server through a proxy that cuts connections at random.
pub async fn connection_chaos(db: &FaultDb, s: &LoadSettings) -> LoadRun {
    enqueue_work(&db.pool, s.tasks, s.sleep_ms).await;
    let proxy = ChaosProxy::start(db.server.addr()).await;
    let opts = db
        .server
        .connect_options("faults")
        .port(proxy.addr().port());
    let worker_pool = MySqlPoolOptions::new()
        .max_connections(4)
        .connect_lazy_with(opts);
    let seen = Seen::default();
    let started = Instant::now();
    proxy.start_chaos(s.chaos_every.clone(), s.chaos_probability);
    let workers = load_workers(&worker_pool, s, &seen);
    if s.outage.is_zero() {
        wait_for(Duration::from_secs(120), "every task succeeded", || async {
            db.count("state = 'succeeded'").await == i64::from(s.tasks)
        })
        .await;
    } else {
        tokio::time::sleep(s.outage).await;
    }
    proxy.stop_chaos();
    let cuts = proxy.stats().cut;
    let done = db.count("state = 'succeeded'").await;
    let fault_over = Instant::now();
    finish_load(db, s, seen, workers, started, fault_over, done, cuts).await
}

/// Result of scenario 5.
#[derive(Debug, Default)]
pub struct TxRun {
    pub committed: u64,
    pub rolled_back: u64,
    pub failed_after_enqueue: u64,
    pub dropped: u64,
    /// `(order id, task id)` of committed transactions.
    pub expected: Vec<(u64, u64)>,
    /// `(order id from the payload, task id)` of every task row.
    pub tasks: Vec<(u64, u64)>,
    pub orders: Vec<u64>,
    pub elapsed: Duration,
    /// Handler runs that found their order / did not.
    pub found: usize,
    pub orphans_seen: usize,
    pub dead: i64,
}

/// Scenario 5: `total` transactions from `producers` concurrent producers, each inserting a
/// business row and enqueueing a [`Ship`] task, then committing (55 %), rolling back (15 %),
/// failing on a business statement after the enqueue (15 %) or being dropped (15 %), while a
/// worker processes the committed tasks.
pub async fn transactions(db: &FaultDb, total: u64, producers: u64) -> TxRun {
    let seen = Seen::default();
    let worker = RunningWorker::spawn(
        fast_worker(&db.pool)
            .register::<Ship>()
            .queue("orders", 8)
            .data(db.pool.clone())
            .data(seen.clone()),
    );
    let started = Instant::now();
    let next = Arc::new(AtomicU64::new(0));
    let mut handles = Vec::new();
    for p in 0..producers {
        let pool = db.pool.clone();
        let next = next.clone();
        handles.push(tokio::spawn(async move {
            let mut out = TxRun::default();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total {
                    break;
                }
                let reference = format!("p{p}-{i}");
                let mut tx = pool.begin().await.unwrap();
                let order = sqlx::query("INSERT INTO fault_orders (ref) VALUES (?)")
                    .bind(&reference)
                    .execute(&mut *tx)
                    .await
                    .unwrap()
                    .last_insert_id();
                let task = Ship { order_id: order }
                    .enqueue_tx(&mut tx)
                    .await
                    .unwrap()
                    .id
                    .0;
                match fastrand::u32(0..100) {
                    0..55 => {
                        tx.commit().await.unwrap();
                        out.committed += 1;
                        out.expected.push((order, task));
                    }
                    55..70 => {
                        tx.rollback().await.unwrap();
                        out.rolled_back += 1;
                    }
                    70..85 => {
                        // A business rule fails after the enqueue (duplicate reference): the
                        // application returns the error and the transaction is dropped.
                        let res: Result<(), sqlx::Error> = async {
                            sqlx::query("INSERT INTO fault_orders (ref) VALUES (?)")
                                .bind(&reference)
                                .execute(&mut *tx)
                                .await?;
                            tx.commit().await
                        }
                        .await;
                        assert!(res.is_err(), "the duplicate insert must fail");
                        out.failed_after_enqueue += 1;
                    }
                    _ => {
                        drop(tx);
                        out.dropped += 1;
                    }
                }
            }
            out
        }));
    }
    let mut run = TxRun::default();
    for h in handles {
        let out = h.await.unwrap();
        run.committed += out.committed;
        run.rolled_back += out.rolled_back;
        run.failed_after_enqueue += out.failed_after_enqueue;
        run.dropped += out.dropped;
        run.expected.extend(out.expected);
    }
    run.elapsed = started.elapsed();
    let committed = run.committed as i64;
    wait_for(
        Duration::from_secs(120),
        "committed tasks processed",
        || async { db.count("state IN ('succeeded', 'dead')").await >= committed },
    )
    .await;
    // Give a stray (orphan) task the time to be claimed too, if one existed.
    tokio::time::sleep(Duration::from_millis(300)).await;
    worker.stop().await;
    run.expected.sort_unstable();
    run.tasks = sqlx::query_as::<_, (u64, u64)>(
        "SELECT CAST(JSON_UNQUOTE(JSON_EXTRACT(CONVERT(payload USING utf8mb4), '$.order_id'))
                     AS UNSIGNED), id
         FROM taskq_tasks ORDER BY 1, 2",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    run.orders = sqlx::query_scalar("SELECT id FROM fault_orders ORDER BY id")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    let s = seen.snapshot();
    run.found = s.values().flatten().filter(|e| e.note == "found").count();
    run.orphans_seen = s.values().flatten().filter(|e| e.note == "orphan").count();
    run.dead = db.count("state = 'dead'").await;
    run
}

/// One case of scenario 6 and how it ended.
#[derive(Debug, Clone)]
pub struct BadCase {
    pub case: &'static str,
    pub id: Option<u64>,
    /// Enqueue error, for cases rejected before insert.
    pub enqueue_error: Option<String>,
    pub row: Option<Row>,
    pub executions: Vec<Exec>,
}

/// Result of scenario 6.
#[derive(Debug)]
pub struct BadRun {
    pub cases: Vec<BadCase>,
    pub good: Vec<u64>,
    pub good_rows: Vec<Row>,
    pub report: taskq::worker::ShutdownReport,
}

impl BadRun {
    pub fn case(&self, name: &str) -> &BadCase {
        self.cases
            .iter()
            .find(|c| c.case == name)
            .unwrap_or_else(|| panic!("no case {name}"))
    }
}

async fn raw_task(pool: &MySqlPool, name: &str, payload: &[u8], max_attempts: u32) -> u64 {
    sqlx::query(
        "INSERT INTO taskq_tasks (queue, name, payload, state, max_attempts, run_at, created_at, updated_at)
         VALUES ('bad', ?, ?, 'pending', ?, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))",
    )
    .bind(name)
    .bind(payload)
    .bind(max_attempts)
    .execute(pool)
    .await
    .unwrap()
    .last_insert_id()
}

/// The exotic but valid text of case `unicode_text`.
pub const UNICODE_TEXT: &str = "nul\u{0} esc\u{1b} é 漢字 🦀 \u{fffd} \"quoted\" \\ end";

/// Scenario 6: bad rows and edge-case payloads interleaved with `good` ordinary tasks on one
/// worker (queue `bad`, concurrency 4).
pub async fn bad_data(db: &FaultDb, good: u32) -> BadRun {
    let pool = &db.pool;
    let mut cases: Vec<BadCase> = Vec::new();
    let mut add = |case: &'static str, id: Option<u64>, err: Option<String>| {
        cases.push(BadCase {
            case,
            id,
            enqueue_error: err,
            row: None,
            executions: Vec::new(),
        });
    };
    let mut goods = Vec::new();
    let mut enqueue_good = async |k: u32| {
        for i in 0..k {
            let id = Text {
                text: format!("good {i}"),
            }
            .enqueue(pool)
            .await
            .unwrap()
            .id
            .0;
            goods.push(id);
        }
    };
    enqueue_good(good / 4).await;
    add(
        "wrong_type",
        Some(raw_task(pool, Text::NAME, br#"{"text": 5}"#, 5).await),
        None,
    );
    add(
        "missing_field",
        Some(raw_task(pool, Text::NAME, br#"{"txt": "x"}"#, 5).await),
        None,
    );
    add(
        "not_json",
        Some(raw_task(pool, Text::NAME, b"\x00\xff\xfegarbage", 5).await),
        None,
    );
    add(
        "non_utf8_in_string",
        Some(raw_task(pool, Text::NAME, b"{\"text\": \"caf\xe9 \xff\"}", 5).await),
        None,
    );
    add(
        "json_null",
        Some(raw_task(pool, Text::NAME, b"null", 5).await),
        None,
    );
    add(
        "unknown_name",
        Some(raw_task(pool, "fault_nobody_handles_this", b"{}", 5).await),
        None,
    );
    enqueue_good(good / 4).await;
    // {"text":"..."} is 11 bytes of framing.
    let limit = taskq::settings::payload_limit();
    add(
        "payload_at_limit",
        Some(
            Text {
                text: "x".repeat(limit - 11),
            }
            .enqueue(pool)
            .await
            .unwrap()
            .id
            .0,
        ),
        None,
    );
    let over = Text {
        text: "x".repeat(limit - 10),
    }
    .enqueue(pool)
    .await;
    add(
        "payload_over_limit",
        over.as_ref().ok().map(|e| e.id.0),
        over.err().map(|e| e.to_string()),
    );
    add(
        "unicode_text",
        Some(
            Text {
                text: UNICODE_TEXT.into(),
            }
            .enqueue(pool)
            .await
            .unwrap()
            .id
            .0,
        ),
        None,
    );
    enqueue_good(good / 4).await;
    add(
        "max_attempts_1",
        Some(
            AlwaysFails {
                detail: "boom".into(),
                repeat: 1,
            }
            .enqueue_options()
            .with_max_attempts(1)
            .enqueue(pool)
            .await
            .unwrap()
            .id
            .0,
        ),
        None,
    );
    add(
        "max_attempts_1_raw_huge_error",
        Some(
            raw_task(
                pool,
                AlwaysFails::NAME,
                br#"{"detail": "\u00e9\ud83e\udd80", "repeat": 4000}"#,
                1,
            )
            .await,
        ),
        None,
    );
    enqueue_good(good - 3 * (good / 4)).await;

    let seen = Seen::default();
    let worker = RunningWorker::spawn(
        fast_worker(pool)
            .register::<Text>()
            .register::<AlwaysFails>()
            .queue("bad", 4)
            .data(seen.clone()),
    );
    let settled: Vec<u64> = cases
        .iter()
        .filter(|c| c.case != "unknown_name")
        .filter_map(|c| c.id)
        .chain(goods.iter().copied())
        .collect();
    let list = settled
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let sql = format!(
        "SELECT COUNT(*) FROM taskq_tasks WHERE state IN ('succeeded', 'dead') AND id IN ({list})"
    );
    wait_for(
        Duration::from_secs(60),
        "every handled task terminal",
        || async { count(pool, &sql).await == settled.len() as i64 },
    )
    .await;
    // The unknown name stays pending: give the worker time to (not) touch it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let report = worker.stop().await;
    if report.stats.db_errors > 0 {
        let st: Vec<(String, String, String)> = sqlx::query_as("SHOW ENGINE INNODB STATUS")
            .fetch_all(pool)
            .await
            .unwrap_or_default();
        let text = st.first().map(|r| r.2.clone()).unwrap_or_default();
        if let Some(i) = text.find("LATEST DETECTED DEADLOCK") {
            eprintln!("{}", &text[i..(i + 4000).min(text.len())]);
        }
    }
    let all = rows(pool, &[]).await;
    let s = seen.snapshot();
    for c in &mut cases {
        if let Some(id) = c.id {
            c.row = all.iter().find(|r| r.id == id).cloned();
            c.executions = s.get(&id).cloned().unwrap_or_default();
        }
    }
    BadRun {
        cases,
        good_rows: all.into_iter().filter(|r| goods.contains(&r.id)).collect(),
        good: goods,
        report,
    }
}

/// Result of scenario 7.
#[derive(Debug)]
pub struct PoisonRun {
    pub poison: Vec<(PoisonKind, u64)>,
    /// Rows of the poison tasks when the ordinary ones were done (before the worker stopped).
    pub before_stop: Vec<Row>,
    /// Rows after the worker stopped.
    pub rows: Vec<Row>,
    pub work: Vec<u64>,
    /// Ordinary tasks per second while the poison misbehaved.
    pub throughput: f64,
    pub elapsed: Duration,
    pub report: taskq::worker::ShutdownReport,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoisonKind {
    Panic,
    HangNoTimeout,
    HangWithTimeout,
}

/// Scenario 7: on queue `load` (concurrency `concurrency`), enqueue the poison tasks (when
/// `with_poison`) first, then `tasks` ordinary [`Work`] tasks, and measure how fast the
/// ordinary ones complete.
pub async fn poison(
    db: &FaultDb,
    tasks: u32,
    sleep_ms: u64,
    concurrency: usize,
    with_poison: bool,
) -> PoisonRun {
    let pool = &db.pool;
    let mut poison = Vec::new();
    if with_poison {
        let id = |e: taskq::Enqueued| e.id.0;
        poison.push((
            PoisonKind::Panic,
            id(Poison {
                mode: PoisonMode::Panic,
            }
            .enqueue(pool)
            .await
            .unwrap()),
        ));
        poison.push((
            PoisonKind::HangNoTimeout,
            id(Poison {
                mode: PoisonMode::Hang,
            }
            .enqueue(pool)
            .await
            .unwrap()),
        ));
        poison.push((
            PoisonKind::HangWithTimeout,
            id(PoisonTimed.enqueue(pool).await.unwrap()),
        ));
    }
    let first: u64 = count(
        pool,
        "SELECT CAST(COALESCE(MAX(id), 0) AS SIGNED) FROM taskq_tasks",
    )
    .await as u64;
    enqueue_work(pool, tasks, sleep_ms).await;
    let work: Vec<u64> = sqlx::query_scalar("SELECT id FROM taskq_tasks WHERE id > ? ORDER BY id")
        .bind(first)
        .fetch_all(pool)
        .await
        .unwrap();
    let seen = Seen::default();
    let started = Instant::now();
    let worker = RunningWorker::spawn(
        fast_worker(pool)
            .register::<Work>()
            .register::<Poison>()
            .register::<PoisonTimed>()
            .queue("load", concurrency)
            .lease(Duration::from_secs(2))
            .heartbeat(Duration::from_millis(500))
            .cancel_grace(Duration::from_millis(200))
            .shutdown_timeout(Duration::from_millis(500))
            .data(seen.clone()),
    );
    let sql = format!(
        "SELECT COUNT(*) FROM taskq_tasks WHERE state = 'succeeded' AND id > {first} AND name = 'fault_work'"
    );
    wait_for(Duration::from_secs(120), "ordinary tasks done", || async {
        count(pool, &sql).await == i64::from(tasks)
    })
    .await;
    let elapsed = started.elapsed();
    if with_poison {
        // The panicking and the timed-out task end dead; the hanging one is still running.
        let ids = [poison[0].1, poison[2].1];
        wait_all_state(pool, &ids, "dead", Duration::from_secs(30)).await;
    }
    if with_poison {
        // Past the 2 s lease: the hanging task keeps its lease only because it is renewed.
        tokio::time::sleep(Duration::from_secs(3).saturating_sub(started.elapsed())).await;
    }
    let before_stop = rows(pool, &poison.iter().map(|p| p.1).collect::<Vec<_>>()).await;
    let report = worker.stop().await;
    let mut ids: Vec<u64> = poison.iter().map(|p| p.1).collect();
    ids.extend(&work);
    PoisonRun {
        poison,
        before_stop,
        rows: rows(pool, &ids).await,
        work,
        throughput: f64::from(tasks) / elapsed.as_secs_f64(),
        elapsed,
        report,
    }
}

/// Result of one black-hole trial (scenario 8).
#[derive(Debug)]
pub struct BlackHoleTrial {
    /// Final rows of the trial's tasks.
    pub rows: Vec<Row>,
    /// Per task: the child's lease end (database clock) minus the moment its handler saw the
    /// cancel signal (s); positive = canceled before the lease could end.
    pub cancel_margin: Vec<f64>,
    /// Per task: the other worker's handler start minus the child's lease end (s).
    pub takeover: Vec<f64>,
    /// Cancel reasons the child's handlers recorded.
    pub reasons: Vec<String>,
    /// After heal: whether the child renewed a new task's lease past three lease lengths.
    pub recovered: bool,
    /// The child's report (SIGTERM at the end).
    pub report: ChildReport,
}

/// Scenario 8: a child worker reaches the database through a proxy that black-holes its
/// heartbeat statement (a silent partition: no answer, no reset); its `tasks` handlers hold
/// until canceled. An in-process worker runs beside it. Then the proxy heals and the child
/// must renew a new task's lease again.
pub async fn black_hole_trial(
    db: &FaultDb,
    exe: &Path,
    tasks: usize,
    trial: usize,
) -> BlackHoleTrial {
    let proxy = ChaosProxy::start(db.server.addr()).await;
    proxy.black_hole_matching(HEARTBEAT_SQL);
    let url = format!("{}/faults", proxy.mysql_url());
    // The child's cancel grace is 500 ms, a quarter of its 2 s lease: its handlers, which
    // ignore the signal, are aborted by the local end of their lease.
    let settings = ChildSettings::default();
    let ids = enqueue_holds_with(&db.pool, tasks, true).await;
    let a_id = format!("partitioned-{trial}");
    let a = ChildWorker::spawn(exe, &url, &a_id, &settings).await;
    wait_started_by(&db.pool, &ids, &a_id, Duration::from_secs(30)).await;
    // The child's leases are never renewed: their ends stay what the claim set.
    let list = ids.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
    let lease_ends: HashMap<u64, DateTime<Utc>> =
        sqlx::query_as::<_, (u64, DateTime<Utc>)>(sqlx::AssertSqlSafe(format!(
            "SELECT id, lease_until FROM taskq_tasks WHERE id IN ({list}) AND lease_epoch = 1"
        )))
        .fetch_all(&db.pool)
        .await
        .unwrap()
        .into_iter()
        .collect();
    assert_eq!(lease_ends.len(), ids.len(), "every task held by the child");
    let b_id = format!("other-{trial}");
    let b = other_worker(db, &b_id, &settings);
    wait_all_state(&db.pool, &ids, "succeeded", settings.lease * 10).await;
    b.stop().await;
    let mut cancel_margin = Vec::new();
    let mut takeover = Vec::new();
    let mut reasons = Vec::new();
    for id in &ids {
        let ev = events(&db.pool, *id).await;
        let end = lease_ends[id];
        let canceled = ev
            .iter()
            .find(|e| e.worker_id == a_id && e.event.starts_with("canceled:"))
            .unwrap_or_else(|| panic!("task {id}: the child's handler was not canceled: {ev:?}"));
        reasons.push(canceled.event.clone());
        cancel_margin.push(secs(end - canceled.at));
        if let Some(started) = ev
            .iter()
            .find(|e| e.event == "started" && e.lease_epoch > 1)
        {
            takeover.push(secs(started.at - end));
        }
    }
    let rows = rows(&db.pool, &ids).await;

    // Heal: the child's next task must keep its first lease for three lease lengths.
    proxy.heal();
    let probe = enqueue_holds(&db.pool, 1).await;
    wait_started_by(&db.pool, &probe, &a_id, Duration::from_secs(30)).await;
    tokio::time::sleep(settings.lease * 3).await;
    let recovered = count(
        &db.pool,
        &format!(
            "SELECT COUNT(*) FROM taskq_tasks WHERE id = {} AND state = 'running'
               AND lease_epoch = 1 AND lease_until > UTC_TIMESTAMP(6)",
            probe[0]
        ),
    )
    .await
        == 1;
    a.signal("TERM");
    let report = a.report(Duration::from_secs(30)).await;
    BlackHoleTrial {
        rows,
        cancel_margin,
        takeover,
        reasons,
        recovered,
        report,
    }
}
