//! The fault scenarios that apply to SQLite (issue 12), on one database file shared by several
//! worker processes on one host (WAL, busy timeout 5 s): SIGKILL takeover, SIGTERM hand-over,
//! SIGSTOP past the lease (fenced), business+task transactions, poison pills (a panicking
//! handler, a handler that exits its process), and the starvation measurement (several
//! processes, one writer at a time: does a starved process still renew its leases in time?).
//!
//! Handlers run in `taskq-fault-worker` children and in the test process; every execution is
//! recorded in the file's `fault_events` (database clock), so the checks count executions
//! across processes. Scenarios that need a server (database killed, connections cut, heartbeat
//! black-holed) do not apply: there is no server and no connection to cut.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use sqlx::sqlite::SqlitePoolOptions;
use sqlx::{Connection, SqliteConnection};
use taskq::Task as _;
use taskq_tests::backends::SqliteFile;
use taskq_tests::{RunningWorker, fast_worker};

use super::scenarios::{PauseTrial, TakeoverTrial};
use super::*;

const SIDE_TABLES: &str = "
CREATE TABLE fault_events (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id     INTEGER NOT NULL,
    worker_id   TEXT NOT NULL,
    lease_epoch INTEGER NOT NULL,
    attempt     INTEGER NOT NULL,
    event       TEXT NOT NULL,
    at          INTEGER NOT NULL
) STRICT;
CREATE INDEX ix_fault_events_task ON fault_events (task_id);
CREATE TABLE fault_transitions (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id     INTEGER NOT NULL,
    old_state   TEXT NOT NULL,
    new_state   TEXT NOT NULL,
    lease_epoch INTEGER NOT NULL,
    worker_id   TEXT,
    at          INTEGER NOT NULL
) STRICT;
CREATE INDEX ix_fault_transitions_task ON fault_transitions (task_id);
CREATE TABLE fault_orders (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    ref         TEXT NOT NULL UNIQUE
) STRICT;
";

const TRANSITION_TRIGGER: &str = "
CREATE TRIGGER fault_transitions_log AFTER UPDATE OF state ON taskq_tasks
WHEN OLD.state <> NEW.state
BEGIN
    INSERT INTO fault_transitions (task_id, old_state, new_state, lease_epoch, worker_id, at)
    VALUES (NEW.id, OLD.state, NEW.state, NEW.lease_epoch, NEW.worker_id,
            (SELECT us FROM taskq_clock));
END;
";

/// A migrated SQLite file with the side tables, removed (with `-wal`, `-shm`) on drop.
pub struct SqliteFaultDb {
    /// `sqlite://<path>`, for the children.
    pub url: String,
    /// The test process's pool (taskq's settings: WAL, busy timeout 5 s).
    pub pool: SqlitePool,
    pub file: SqliteFile,
}

impl SqliteFaultDb {
    pub async fn create() -> Self {
        let file = SqliteFile::new();
        let pool = taskq::sqlite::open(&file.path)
            .await
            .expect("open the file");
        taskq::migrate(&pool).await.expect("taskq migrations apply");
        sqlx::raw_sql(SIDE_TABLES)
            .execute(&pool)
            .await
            .expect("side tables");
        Self {
            url: format!("sqlite://{}", file.path.display()),
            pool,
            file,
        }
    }

    /// A pool on the file with taskq's settings and busy timeout `busy`, opened lazily (the
    /// scenarios' workers take the longest busy timeout their lease allowed before issue 34,
    /// `lease − heartbeat − min(cancel grace, lease / 2)`; see [`tolerated`]).
    pub fn pool_with_busy_timeout(&self, busy: Duration) -> SqlitePool {
        sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(8)
            .connect_lazy_with(
                taskq::sqlite::tune(
                    sqlx::sqlite::SqliteConnectOptions::new().filename(&self.file.path),
                )
                .busy_timeout(busy),
            )
    }

    /// Logs every task state change into `fault_transitions` (a trigger).
    pub async fn log_transitions(&self) {
        sqlx::raw_sql(TRANSITION_TRIGGER)
            .execute(&self.pool)
            .await
            .expect("transition trigger");
    }

    pub async fn scalar(&self, sql: &str) -> i64 {
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
            .fetch_one(&self.pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// `SELECT COUNT(*) FROM taskq_tasks WHERE <cond>`.
    pub async fn count(&self, cond: &str) -> i64 {
        self.scalar(&format!("SELECT COUNT(*) FROM taskq_tasks WHERE {cond}"))
            .await
    }

    /// Task rows of `ids` (all when empty), by id.
    pub async fn rows(&self, ids: &[u64]) -> Vec<Row> {
        type Raw = (
            i64,
            String,
            String,
            i64,
            i64,
            i64,
            Option<String>,
            Option<String>,
            i64,
            Option<i64>,
        );
        let raw: Vec<Raw> = sqlx::query_as(
            "SELECT id, name, state, attempt, max_attempts, lease_epoch, worker_id, last_error,
                    updated_at, lease_until FROM taskq_tasks ORDER BY id",
        )
        .fetch_all(&self.pool)
        .await
        .expect("task rows");
        let t = |us: i64| chrono::DateTime::from_timestamp_micros(us).unwrap();
        raw.into_iter()
            .map(|r| Row {
                id: r.0 as u64,
                name: r.1,
                state: r.2,
                attempt: r.3 as u32,
                max_attempts: r.4 as u32,
                lease_epoch: r.5 as u64,
                worker_id: r.6,
                last_error: r.7,
                updated_at: t(r.8),
                lease_until: r.9.map(t),
            })
            .filter(|r| ids.is_empty() || ids.contains(&r.id))
            .collect()
    }

    /// Every handler event, by task id, oldest first.
    pub async fn all_events(&self) -> HashMap<u64, Vec<Event>> {
        let raw: Vec<(i64, String, i64, i64, String, i64)> = sqlx::query_as(
            "SELECT task_id, worker_id, lease_epoch, attempt, event, at FROM fault_events
             ORDER BY id",
        )
        .fetch_all(&self.pool)
        .await
        .expect("events");
        let mut out: HashMap<u64, Vec<Event>> = HashMap::new();
        for r in raw {
            out.entry(r.0 as u64).or_default().push(Event {
                task_id: r.0 as u64,
                worker_id: r.1,
                lease_epoch: r.2 as u64,
                attempt: r.3 as u32,
                event: r.4,
                at: chrono::DateTime::from_timestamp_micros(r.5).unwrap(),
            });
        }
        out
    }

    /// Events of task `id`, oldest first.
    pub async fn events(&self, id: u64) -> Vec<Event> {
        self.all_events().await.remove(&id).unwrap_or_default()
    }

    /// Whether the write lock is free now (a `BEGIN IMMEDIATE` with a 100 ms busy timeout on a
    /// fresh connection succeeds).
    pub async fn write_lock_free(&self) -> bool {
        let opts = taskq::sqlite::tune(
            sqlx::sqlite::SqliteConnectOptions::new().filename(&self.file.path),
        )
        .busy_timeout(Duration::from_millis(100));
        let mut c = SqliteConnection::connect_with(&opts)
            .await
            .expect("connect");
        let free = sqlx::raw_sql("BEGIN IMMEDIATE; ROLLBACK;")
            .execute(&mut c)
            .await
            .is_ok();
        let _ = c.close().await;
        free
    }

    async fn wait_state(&self, ids: &[u64], state: &str, timeout: Duration) {
        let list = id_list(ids);
        let cond = format!("state = '{state}' AND id IN ({list})");
        wait_for(timeout, &format!("all tasks {state}"), || async {
            self.count(&cond).await == ids.len() as i64
        })
        .await;
    }

    async fn wait_started_by(&self, ids: &[u64], worker: &str, timeout: Duration) {
        let sql = format!(
            "SELECT COUNT(DISTINCT task_id) FROM fault_events
             WHERE event = 'started' AND worker_id = '{worker}' AND task_id IN ({})",
            id_list(ids)
        );
        wait_for(timeout, &format!("{worker} started all tasks"), || async {
            self.scalar(&sql).await == ids.len() as i64
        })
        .await;
    }
}

fn id_list(ids: &[u64]) -> String {
    ids.iter().map(u64::to_string).collect::<Vec<_>>().join(",")
}

async fn enqueue_holds(pool: &SqlitePool, n: usize) -> Vec<u64> {
    let mut ids = Vec::new();
    for i in 0..n {
        let hold = Hold {
            n: i as u32,
            ignore_cancel: false,
        };
        ids.push(hold.enqueue(pool).await.unwrap().id.0);
    }
    ids
}

/// How long a worker's renewal may wait for the write lock without losing a lease:
/// `lease − heartbeat − min(cancel grace, lease / 2)`, the longest busy timeout
/// `WorkerBuilder::build` accepted for these settings before issue 34.
pub fn tolerated(lease: Duration, heartbeat: Duration, cancel_grace: Duration) -> Duration {
    lease - heartbeat - cancel_grace.min(lease / 2)
}

/// The in-process worker (the test process is another process on the file), on a pool whose
/// busy timeout its lease allows (the default cancel grace of 5 s).
/// `s.busy` when set (the children's pool's busy timeout).
fn other_worker(db: &SqliteFaultDb, id: &str, s: &ChildSettings) -> RunningWorker {
    let busy = s
        .busy
        .unwrap_or_else(|| tolerated(s.lease, s.heartbeat, Duration::from_secs(5)));
    RunningWorker::spawn(
        fast_worker(&db.pool_with_busy_timeout(busy))
            .register::<Hold>()
            .queue("faults", 8)
            .worker_id(id)
            .lease(s.lease)
            .heartbeat(s.heartbeat)
            .reaper_interval(s.reaper)
            .data(db.pool.clone())
            .data(Seen::default()),
    )
}

fn first_event<'a>(events: &'a [Event], worker: &str, event: &str) -> Option<&'a Event> {
    events
        .iter()
        .find(|e| e.worker_id == worker && e.event == event)
}

/// SIGKILL (or, when `graceful`, SIGTERM with a 300 ms shutdown timeout) of a child process
/// holding `tasks` tasks, while the test process's worker runs on the same file (see
/// `scenarios::takeover_trial`). Needs [`SqliteFaultDb::log_transitions`].
pub async fn takeover_trial(
    db: &SqliteFaultDb,
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

/// [`takeover_trial`] with the lease settings (and busy timeout) of `settings`, for the child
/// and the test process's worker alike.
pub async fn takeover_trial_with(
    db: &SqliteFaultDb,
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
    db.wait_started_by(&ids, &a_id, Duration::from_secs(30))
        .await;
    let b_id = format!("other-{trial}");
    let b = other_worker(db, &b_id, &settings);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (t0, report) = if graceful {
        let t0 = Utc::now();
        a.signal("TERM");
        (t0, Some(a.report(Duration::from_secs(30)).await))
    } else {
        (a.sigkill().await, None)
    };
    db.wait_state(&ids, "succeeded", settings.lease + Duration::from_secs(20))
        .await;
    b.stop().await;
    let mut takeover = Vec::new();
    let mut after_release = Vec::new();
    let mut second_epochs = Vec::new();
    let mut not_released = Vec::new();
    for id in &ids {
        let ev = db.events(*id).await;
        let started = first_event(&ev, &b_id, "started")
            .unwrap_or_else(|| panic!("task {id} was not started by {b_id}: {ev:?}"));
        second_epochs.push(started.lease_epoch);
        takeover.push(secs(started.at - t0));
        if graceful {
            let released: Option<i64> = sqlx::query_scalar(
                "SELECT MIN(at) FROM fault_transitions WHERE task_id = ?
                   AND old_state = 'running' AND new_state = 'pending' AND worker_id IS NULL",
            )
            .bind(*id as i64)
            .fetch_one(&db.pool)
            .await
            .unwrap();
            match released {
                Some(us) => after_release.push(secs(
                    started.at - chrono::DateTime::from_timestamp_micros(us).unwrap(),
                )),
                None => not_released.push(*id),
            }
        }
    }
    TakeoverTrial {
        first: a_id,
        second: b_id,
        rows: db.rows(&ids).await,
        takeover,
        after_release,
        report,
        second_epochs,
        not_released,
    }
}

/// The SQLite counterpart of `scenarios::backlog_takeover_trial`: a child process holds `tasks`
/// [`Hold`] tasks, `backlog` [`Busy`] tasks of `busy_ms` are enqueued after them, the test
/// process's worker (concurrency 8) starts draining them, and 300 ms later the child gets
/// SIGKILL. Needs [`SqliteFaultDb::log_transitions`].
pub async fn backlog_takeover_trial(
    db: &SqliteFaultDb,
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
    db.wait_started_by(&ids, &a_id, Duration::from_secs(30))
        .await;
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
            .data(db.pool.clone())
            .data(Seen::default()),
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t0 = a.sigkill().await;
    let mut all = ids.clone();
    all.extend(&busy);
    let drain = Duration::from_millis(busy_ms * backlog as u64 / 8);
    db.wait_state(
        &all,
        "succeeded",
        settings.lease + drain + Duration::from_secs(30),
    )
    .await;
    b.stop().await;
    let busy_list = id_list(&busy);
    let mut out = BacklogTrial {
        all_ok: db
            .rows(&ids)
            .await
            .iter()
            .all(|r| r.state == "succeeded" && r.worker_id.as_deref() == Some(b_id.as_str())),
        ..BacklogTrial::default()
    };
    let at = |us: i64| chrono::DateTime::from_timestamp_micros(us).unwrap();
    for id in &ids {
        let reaped: i64 = db
            .scalar(&format!(
                "SELECT MIN(at) FROM fault_transitions WHERE task_id = {id}
                   AND old_state = 'running' AND new_state = 'pending'"
            ))
            .await;
        let ev = db.events(*id).await;
        let started = first_event(&ev, &b_id, "started")
            .unwrap_or_else(|| panic!("task {id} was not started by {b_id}: {ev:?}"))
            .at;
        let claimed: i64 = db
            .scalar(&format!(
                "SELECT MIN(at) FROM fault_transitions WHERE task_id = {id}
                   AND old_state = 'pending' AND new_state = 'running' AND worker_id = '{b_id}'"
            ))
            .await;
        let started_before = |us: i64| {
            let sql = format!(
                "SELECT COUNT(*) FROM fault_transitions WHERE task_id IN ({busy_list})
                   AND new_state = 'running' AND at < {us}"
            );
            async move { db.scalar(&sql).await }
        };
        let at_reap = started_before(reaped).await;
        out.reaped.push(secs(at(reaped) - t0));
        out.rerun.push(secs(started - t0));
        out.pending_at_reap.push(backlog as i64 - at_reap);
        out.started_between
            .push(started_before(claimed).await - at_reap);
    }
    out
}

/// SIGSTOP a child mid-handler past its lease, let the test process's worker take over and
/// finish, SIGCONT the child, then SIGTERM it (see `scenarios::pause_trial`).
///
/// A process stopped while it holds SQLite's write lock (inside a claim, heartbeat or
/// write-back transaction) stops every writer of the file until it resumes: the other
/// worker's statements wait out their busy timeout and fail. The trial therefore checks that
/// the write lock is free after the SIGSTOP, and if not resumes the child and stops it again;
/// the second value returned counts those retries (`docs/semantics.md`).
pub async fn pause_trial(db: &SqliteFaultDb, exe: &Path, trial: usize) -> (PauseTrial, u32) {
    let settings = ChildSettings::default();
    let ids = enqueue_holds(&db.pool, 1).await;
    let id = ids[0];
    let a_id = format!("paused-{trial}");
    let a = ChildWorker::spawn(exe, &db.url, &a_id, &settings).await;
    db.wait_started_by(&ids, &a_id, Duration::from_secs(30))
        .await;
    let mut restops = 0;
    let stopped = loop {
        a.signal("STOP");
        let stopped = Utc::now();
        if db.write_lock_free().await {
            break stopped;
        }
        restops += 1;
        a.signal("CONT");
        tokio::time::sleep(Duration::from_millis(fastrand::u64(20..80))).await;
    };
    let b_id = format!("taker-{trial}");
    let b = other_worker(db, &b_id, &settings);
    db.wait_state(&ids, "succeeded", settings.lease + Duration::from_secs(20))
        .await;
    b.stop().await;
    let row_before_resume = db.rows(&ids).await.remove(0);
    a.signal("CONT");
    wait_for(
        Duration::from_secs(20),
        "the resumed handler saw its cancel signal",
        || async {
            db.events(id)
                .await
                .iter()
                .any(|e| e.worker_id == a_id && e.event.starts_with("canceled:"))
        },
    )
    .await;
    a.signal("TERM");
    let report = a.report(Duration::from_secs(30)).await;
    let events = db.events(id).await;
    let takeover = first_event(&events, &b_id, "started")
        .map(|e| secs(e.at - stopped))
        .unwrap_or(f64::NAN);
    (
        PauseTrial {
            paused: a_id,
            other: b_id,
            row_before_resume,
            row_after_resume: db.rows(&ids).await.remove(0),
            events,
            report,
            takeover,
        },
        restops,
    )
}

/// Several children on one file; SIGTERM them all and collect their reports.
pub struct Children {
    pub children: Vec<ChildWorker>,
}

impl Children {
    pub async fn spawn(exe: &Path, url: &str, prefix: &str, n: usize, s: &ChildSettings) -> Self {
        let mut children = Vec::new();
        for i in 0..n {
            children.push(ChildWorker::spawn(exe, url, &format!("{prefix}{i}"), s).await);
        }
        Self { children }
    }

    pub async fn stop(self) -> Vec<(String, ChildReport)> {
        for c in &self.children {
            c.signal("TERM");
        }
        let mut out = Vec::new();
        for c in self.children {
            let id = c.id.clone();
            out.push((id, c.report(Duration::from_secs(60)).await));
        }
        out
    }
}

/// Executions (handler starts) by task, read from `fault_events`, and the checks shared by the
/// multi-process scenarios.
#[derive(Debug)]
pub struct Executions {
    pub by_task: HashMap<u64, Vec<Event>>,
    pub rows: Vec<Row>,
}

impl Executions {
    pub async fn read(db: &SqliteFaultDb, ids: &[u64]) -> Self {
        let mut by_task = db.all_events().await;
        let rows = db.rows(ids).await;
        let keep: HashSet<u64> = rows.iter().map(|r| r.id).collect();
        by_task.retain(|id, _| keep.contains(id));
        Self { by_task, rows }
    }
    pub fn total(&self) -> usize {
        self.by_task.values().map(Vec::len).sum()
    }
    pub fn duplicated(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self
            .by_task
            .iter()
            .filter(|(_, e)| e.len() > 1)
            .map(|(id, _)| *id)
            .collect();
        v.sort_unstable();
        v
    }
    /// Tasks whose lease expired at least once (`lease expired` on the row).
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
    /// Every row succeeded and ran at least once; none ran twice under one epoch; a task ran
    /// more than once only after an expired lease.
    pub fn check(&self) -> Result<(), String> {
        if let Some(r) = self.rows.iter().find(|r| r.state != "succeeded") {
            return Err(format!("task not succeeded: {r:?}"));
        }
        if let Some(r) = self.rows.iter().find(|r| !self.by_task.contains_key(&r.id)) {
            return Err(format!("task succeeded but never executed: {r:?}"));
        }
        for (id, ex) in &self.by_task {
            let epochs: HashSet<u64> = ex.iter().map(|e| e.lease_epoch).collect();
            if epochs.len() != ex.len() {
                return Err(format!("task {id} ran twice under one lease epoch: {ex:?}"));
            }
        }
        let reaped = self.reaped();
        if let Some(id) = self
            .duplicated()
            .into_iter()
            .find(|id| !reaped.contains(id))
        {
            return Err(format!(
                "task {id} ran {} times without a lease expiry: {:?}",
                self.by_task[&id].len(),
                self.by_task[&id]
            ));
        }
        Ok(())
    }
}

/// Result of the transaction scenario on SQLite.
#[derive(Debug)]
pub struct SqliteTxRun {
    pub run: super::scenarios::TxRun,
    pub executions: Executions,
    /// `BEGIN IMMEDIATE` that failed with "database is locked" (busy timeout) and were retried
    /// by the producer.
    pub busy_retries: u64,
    pub reports: Vec<(String, ChildReport)>,
    /// From the last commit to the last task succeeded.
    pub drain: Duration,
}

/// `total` transactions from `producers` tasks of the test process, each `BEGIN IMMEDIATE`,
/// insert a business row, enqueue a [`Ship`], then commit (55 %), roll back (15 %), fail on a
/// duplicate business row after the enqueue (15 %) or be dropped (15 %), while `workers`
/// child processes work the `orders` queue on the same file.
pub async fn transactions(
    db: &SqliteFaultDb,
    exe: &Path,
    total: u64,
    producers: u64,
    workers: usize,
) -> SqliteTxRun {
    let settings = ChildSettings {
        queues: Some("orders:8".into()),
        ..ChildSettings::default()
    };
    let children = Children::spawn(exe, &db.url, "tx-", workers, &settings).await;
    let started = Instant::now();
    let next = Arc::new(AtomicU64::new(0));
    let busy = Arc::new(AtomicU64::new(0));
    let mut handles = Vec::new();
    for p in 0..producers {
        let pool = db.pool.clone();
        let next = next.clone();
        let busy = busy.clone();
        handles.push(tokio::spawn(async move {
            let mut out = super::scenarios::TxRun::default();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total {
                    break;
                }
                let reference = format!("p{p}-{i}");
                let mut tx = loop {
                    match taskq::sqlite::begin(&pool).await {
                        Ok(tx) => break tx,
                        Err(e) => {
                            assert!(e.to_string().contains("locked"), "begin: {e}");
                            busy.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                };
                let order = sqlx::query("INSERT INTO fault_orders (ref) VALUES (?)")
                    .bind(&reference)
                    .execute(&mut *tx)
                    .await
                    .unwrap()
                    .last_insert_rowid() as u64;
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
    let mut run = super::scenarios::TxRun::default();
    for h in handles {
        let out = h.await.unwrap();
        run.committed += out.committed;
        run.rolled_back += out.rolled_back;
        run.failed_after_enqueue += out.failed_after_enqueue;
        run.dropped += out.dropped;
        run.expected.extend(out.expected);
    }
    run.elapsed = started.elapsed();
    let committed_at = Instant::now();
    let committed = run.committed as i64;
    wait_for(
        Duration::from_secs(300),
        "committed tasks processed",
        || async { db.count("state IN ('succeeded', 'dead')").await >= committed },
    )
    .await;
    let drain = committed_at.elapsed();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let reports = children.stop().await;
    run.expected.sort_unstable();
    let tasks: Vec<(i64, i64)> = sqlx::query_as(
        "SELECT CAST(json_extract(CAST(payload AS TEXT), '$.order_id') AS INTEGER), id
         FROM taskq_tasks ORDER BY 1, 2",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    run.tasks = tasks.iter().map(|t| (t.0 as u64, t.1 as u64)).collect();
    let orders: Vec<i64> = sqlx::query_scalar("SELECT id FROM fault_orders ORDER BY id")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    run.orders = orders.into_iter().map(|o| o as u64).collect();
    let executions = Executions::read(db, &[]).await;
    let all = executions.by_task.values().flatten();
    run.found = all.clone().filter(|e| e.event == "found").count();
    run.orphans_seen = all.filter(|e| e.event == "orphan").count();
    run.dead = db.count("state = 'dead'").await;
    SqliteTxRun {
        run,
        executions,
        busy_retries: busy.load(Ordering::Relaxed),
        reports,
        drain,
    }
}

/// Result of the poison scenario on SQLite.
#[derive(Debug)]
pub struct SqlitePoisonRun {
    pub panic: Row,
    pub exit: Row,
    pub timed: Row,
    /// Handler starts of each poison task.
    pub panic_runs: usize,
    pub exit_runs: usize,
    pub timed_runs: usize,
    /// The ordinary tasks' executions and rows.
    pub work: Executions,
    /// Child processes that exited on their own (status 3: the exit pill), by id.
    pub exited: Vec<String>,
    pub elapsed: Duration,
    pub reports: Vec<(String, ChildReport)>,
}

/// Poison pills on queue `load` (concurrency 4 per process, `processes` processes, lease 2 s):
/// a handler that panics on every attempt, one that hangs under a 500 ms timeout, and (due
/// 3 s later, once those two are dead) one that exits its process, all at priority -1, among
/// `tasks` ordinary tasks of 100 ms. A child that exits is replaced (as a
/// supervisor would); the scenario ends when the ordinary tasks succeeded and the pills are
/// terminal.
pub async fn poison(
    db: &SqliteFaultDb,
    exe: &Path,
    tasks: u32,
    processes: usize,
) -> SqlitePoisonRun {
    let pool = &db.pool;
    let id = |e: taskq::Enqueued| e.id.0;
    // The pills run first (priority -1): a retry's `run_at` is later than the ordinary tasks',
    // so at the default priority its next attempt would wait behind all of them. The exit
    // pill is due 3 s later, once the panicking and timed-out pills are dead (~0.3 s and
    // ~1.2 s), so the processes it ends hold only ordinary tasks.
    let pill = |mode| Poison { mode }.enqueue_options().with_priority(-1);
    let panic = id(pill(PoisonMode::Panic).enqueue(pool).await.unwrap());
    let exit = id(pill(PoisonMode::Exit)
        .with_delay(Duration::from_secs(3))
        .enqueue(pool)
        .await
        .unwrap());
    let timed = id(PoisonTimed
        .enqueue_options()
        .with_priority(-1)
        .enqueue(pool)
        .await
        .unwrap());
    let mut work = Vec::new();
    let mut tx = taskq::sqlite::begin(pool).await.unwrap();
    for n in 0..tasks {
        work.push(
            Work { n, sleep_ms: 100 }
                .enqueue_tx(&mut tx)
                .await
                .unwrap()
                .id
                .0,
        );
    }
    tx.commit().await.unwrap();
    let settings = ChildSettings {
        queues: Some("load:4".into()),
        ..ChildSettings::default()
    };
    let started = Instant::now();
    let mut children = Children::spawn(exe, &db.url, "poison-", processes, &settings).await;
    let mut exited = Vec::new();
    let mut spawned = processes;
    let done_cond = format!(
        "(name = 'fault_work' AND state = 'succeeded')
         OR (id IN ({panic}, {exit}, {timed}) AND state = 'dead')"
    );
    let want = i64::from(tasks) + 3;
    let deadline = Instant::now() + Duration::from_secs(120);
    while db.count(&done_cond).await < want {
        assert!(Instant::now() < deadline, "poison scenario did not finish");
        for c in &mut children.children {
            if let Some(status) = c.try_exit() {
                assert_eq!(status.code(), Some(3), "a child died otherwise: {status}");
                exited.push(c.id.clone());
                *c =
                    ChildWorker::spawn(exe, &db.url, &format!("poison-{spawned}"), &settings).await;
                spawned += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let elapsed = started.elapsed();
    let reports = children.stop().await;
    let rows = db.rows(&[panic, exit, timed]).await;
    let events = db.all_events().await;
    let runs = |id: u64| events.get(&id).map_or(0, Vec::len);
    SqlitePoisonRun {
        panic: rows[0].clone(),
        exit: rows[1].clone(),
        timed: rows[2].clone(),
        panic_runs: runs(panic),
        exit_runs: runs(exit),
        timed_runs: runs(timed),
        work: Executions::read(db, &work).await,
        exited,
        elapsed,
        reports,
    }
}

/// Settings of the starvation measurement.
#[derive(Debug, Clone)]
pub struct StarveSettings {
    pub processes: usize,
    pub lease: Duration,
    /// How long each long task runs (several leases: it must be renewed).
    pub hold: Duration,
    /// Long tasks per process (its own queue `long-<i>`, so every process holds some).
    pub long_per_process: usize,
    /// Concurrency of the shared `load` queue in each process.
    pub load_concurrency: usize,
    /// Producers in the test process enqueueing one short task per transaction, until the
    /// long tasks are done.
    pub producers: usize,
    /// Busy timeout of every pool: the producers' and the worker processes' (the longest the
    /// lease allows, [`tolerated`], keeps the rule `WorkerBuilder::build` checks).
    pub busy: Duration,
}

/// Result of the starvation measurement.
#[derive(Debug)]
pub struct StarveRun {
    pub settings: StarveSettings,
    /// Per process: `(id, claimed, lost_leases, statement_timeouts, db_errors, fenced)`.
    pub per_process: Vec<(String, u64, u64, u64, u64, u64)>,
    /// Per process: short `load` tasks it ran (from `fault_events`).
    pub load_share: Vec<(String, usize)>,
    /// Long tasks whose lease was lost at least once (epoch moved past the first claim).
    pub long_lost: usize,
    pub long_total: usize,
    /// Smallest time left on a long task's lease seen by the test process (s), per process.
    pub min_slack: Vec<(String, f64)>,
    /// Short tasks enqueued by the producers, and producer `BEGIN`s that hit the busy timeout.
    pub produced: u64,
    pub producer_busy: u64,
    pub executions: Executions,
    pub elapsed: Duration,
}

/// `processes` worker processes on one file under a write-heavy load: each holds
/// `long_per_process` long tasks (its own queue) that must be renewed for `hold`, while all
/// work a shared queue of short tasks fed by `producers` writers of the test process. Reports
/// how the short tasks were shared, whether any long lease was lost, and the closest a lease
/// came to expiring.
pub async fn starvation(db: &SqliteFaultDb, exe: &Path, s: &StarveSettings) -> StarveRun {
    let producer_pool = db.pool_with_busy_timeout(s.busy);
    let pool = &db.pool;
    let mut long = HashMap::new();
    for p in 0..s.processes {
        for n in 0..s.long_per_process {
            let id = Work {
                n: n as u32,
                sleep_ms: s.hold.as_millis() as u64,
            }
            .enqueue_options()
            .with_queue(format!("long-{p}"))
            .enqueue(pool)
            .await
            .unwrap()
            .id
            .0;
            long.insert(id, format!("starve-{p}"));
        }
    }
    let long_ids: Vec<u64> = long.keys().copied().collect();
    let mut tx = taskq::sqlite::begin(pool).await.unwrap();
    for n in 0..2000 {
        Work { n, sleep_ms: 0 }.enqueue_tx(&mut tx).await.unwrap();
    }
    tx.commit().await.unwrap();
    let started = Instant::now();
    let mut children = Vec::new();
    for p in 0..s.processes {
        let cs = ChildSettings {
            lease: s.lease,
            heartbeat: s.lease / 3,
            reaper: Duration::from_millis(200),
            queues: Some(format!(
                "load:{},long-{p}:{}",
                s.load_concurrency, s.long_per_process
            )),
            busy: Some(s.busy),
            ..ChildSettings::default()
        };
        children.push(ChildWorker::spawn(exe, &db.url, &format!("starve-{p}"), &cs).await);
    }
    let children = Children { children };
    // Producers: one short task per transaction, as fast as the write lock allows.
    let stop = Arc::new(AtomicBool::new(false));
    let produced = Arc::new(AtomicU64::new(0));
    let busy = Arc::new(AtomicU64::new(0));
    let mut producers = Vec::new();
    for _ in 0..s.producers {
        let (pool, stop, produced, busy) = (
            producer_pool.clone(),
            stop.clone(),
            produced.clone(),
            busy.clone(),
        );
        producers.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                match taskq::sqlite::begin(&pool).await {
                    Ok(mut tx) => {
                        Work { n: 0, sleep_ms: 0 }
                            .enqueue_tx(&mut tx)
                            .await
                            .unwrap();
                        tx.commit().await.unwrap();
                        produced.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(_) => {
                        busy.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    // Watch the long leases: the least time left seen on each (database clock).
    let mut min_slack: HashMap<String, f64> = HashMap::new();
    let watch = format!(
        "SELECT id, lease_until - (SELECT us FROM taskq_clock) FROM taskq_tasks
         WHERE id IN ({}) AND state = 'running' AND lease_epoch = 1",
        id_list(&long_ids)
    );
    let deadline = Instant::now() + s.hold * 4 + Duration::from_secs(60);
    loop {
        let left: Vec<(i64, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(watch.clone()))
            .fetch_all(pool)
            .await
            .unwrap();
        for (id, us) in left {
            let slot = min_slack
                .entry(long[&(id as u64)].clone())
                .or_insert(f64::INFINITY);
            *slot = slot.min(us as f64 / 1e6);
        }
        let done = db
            .count(&format!(
                "state IN ('succeeded', 'dead') AND id IN ({})",
                id_list(&long_ids)
            ))
            .await;
        if done == long_ids.len() as i64 {
            break;
        }
        assert!(Instant::now() < deadline, "long tasks did not finish");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for p in producers {
        p.await.unwrap();
    }
    wait_for(Duration::from_secs(300), "short tasks drained", || async {
        db.count("state <> 'succeeded'").await == 0
    })
    .await;
    let elapsed = started.elapsed();
    let reports = children.stop().await;
    let executions = Executions::read(db, &[]).await;
    let long_set: HashSet<u64> = long_ids.iter().copied().collect();
    let mut share: HashMap<String, usize> = HashMap::new();
    for (id, ev) in &executions.by_task {
        if long_set.contains(id) {
            continue;
        }
        for e in ev {
            *share.entry(e.worker_id.clone()).or_default() += 1;
        }
    }
    let long_lost = executions
        .rows
        .iter()
        .filter(|r| long_set.contains(&r.id) && r.lease_epoch > 1)
        .count();
    let per_process = reports
        .iter()
        .map(|(id, r)| {
            let st = |k: &str| r.stats.get(k).copied().unwrap_or(0);
            (
                id.clone(),
                st("claimed"),
                st("lost_leases"),
                st("statement_timeouts"),
                st("db_errors"),
                st("fenced"),
            )
        })
        .collect();
    let names: BTreeSet<String> = (0..s.processes).map(|p| format!("starve-{p}")).collect();
    StarveRun {
        settings: s.clone(),
        per_process,
        load_share: names
            .iter()
            .map(|n| (n.clone(), share.get(n).copied().unwrap_or(0)))
            .collect(),
        long_lost,
        long_total: long_ids.len(),
        min_slack: names
            .iter()
            .map(|n| (n.clone(), min_slack.get(n).copied().unwrap_or(f64::NAN)))
            .collect(),
        produced: produced.load(Ordering::Relaxed),
        producer_busy: busy.load(Ordering::Relaxed),
        executions,
        elapsed,
    }
}

/// A drain: `processes` children (all started and idle first) work `tasks` short tasks
/// enqueued in one transaction. Returns the tasks each process ran and the drain time.
pub async fn drain(
    db: &SqliteFaultDb,
    exe: &Path,
    processes: usize,
    tasks: u32,
    concurrency: usize,
) -> (Vec<(String, usize)>, Duration, Executions) {
    let settings = ChildSettings {
        queues: Some(format!("load:{concurrency}")),
        ..ChildSettings::default()
    };
    let children = Children::spawn(exe, &db.url, "drain-", processes, &settings).await;
    // Every child past its first (empty) claim.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = Instant::now();
    let mut tx = taskq::sqlite::begin(&db.pool).await.unwrap();
    for n in 0..tasks {
        Work { n, sleep_ms: 0 }.enqueue_tx(&mut tx).await.unwrap();
    }
    tx.commit().await.unwrap();
    wait_for(Duration::from_secs(120), "drained", || async {
        db.count("state <> 'succeeded'").await == 0
    })
    .await;
    let took = started.elapsed();
    children.stop().await;
    let ex = Executions::read(db, &[]).await;
    let mut share: HashMap<String, usize> =
        (0..processes).map(|p| (format!("drain-{p}"), 0)).collect();
    for e in ex.by_task.values().flatten() {
        *share.entry(e.worker_id.clone()).or_default() += 1;
    }
    let mut share: Vec<_> = share.into_iter().collect();
    share.sort();
    (share, took, ex)
}

/// Result of a write-lock hold trial.
#[derive(Debug)]
pub struct LockHoldTrial {
    pub rows: Vec<Row>,
    /// Events of the trial's tasks, by task.
    pub events: HashMap<u64, Vec<Event>>,
    pub report: ChildReport,
    /// Whether every lease was renewed after the lock was released without being lost: each
    /// task still `running` at epoch 1 with its lease ending at least `lease - heartbeat` after
    /// the release (database clock).
    pub renewed: bool,
    /// The longest outage this setting survives in the worst case:
    /// `lease - heartbeat - min(cancel grace, lease / 2)`.
    pub tolerated: Duration,
    /// When the test process had the write lock, and when it gave it back (database clock).
    pub taken: DateTime<Utc>,
    pub released: DateTime<Utc>,
}

impl LockHoldTrial {
    /// Seconds from the lock being taken to the first start of each task under a new epoch
    /// (its next attempt after a lost lease); `None` for a task that did not run again.
    pub fn rerun_after_taken(&self) -> Vec<Option<f64>> {
        self.rows
            .iter()
            .map(|r| {
                self.events[&r.id]
                    .iter()
                    .filter(|e| e.event == "started" && e.lease_epoch > 1)
                    .map(|e| secs(e.at - self.taken))
                    .reduce(f64::min)
            })
            .collect()
    }
}

/// A child holds `tasks` [`Hold`] tasks with `settings`; the test process takes SQLite's write
/// lock (`BEGIN IMMEDIATE` and a write) and keeps it for `hold`, the way a long application
/// transaction, a checkpoint or a stopped process would: every heartbeat waits. Then the lock
/// is released, and the trial reads whether the leases survived. The lock is taken `phase`
/// after the handlers started (the claim is the first renewal).
pub async fn lock_hold_trial(
    db: &SqliteFaultDb,
    exe: &Path,
    settings: &ChildSettings,
    tasks: usize,
    hold: Duration,
    phase: Duration,
    trial: usize,
) -> LockHoldTrial {
    lock_hold_trial_with(db, exe, settings, tasks, hold, phase, trial, false).await
}

/// [`lock_hold_trial`] whose handlers, with `ignore_cancel`, do not stop when canceled: the
/// worker aborts them at the end of the cancel grace, writes no outcome, and the task stays
/// `running` until its lease ends on the database.
#[allow(clippy::too_many_arguments)]
pub async fn lock_hold_trial_with(
    db: &SqliteFaultDb,
    exe: &Path,
    settings: &ChildSettings,
    tasks: usize,
    hold: Duration,
    phase: Duration,
    trial: usize,
    ignore_cancel: bool,
) -> LockHoldTrial {
    let mut ids = Vec::new();
    for i in 0..tasks {
        let hold = Hold {
            n: i as u32,
            ignore_cancel,
        };
        ids.push(hold.enqueue(&db.pool).await.unwrap().id.0);
    }
    let a_id = format!("locked-{trial}");
    // The handlers record their cancellation during the hold: on a pool that waits it out.
    let settings = &ChildSettings {
        events_busy: Some(Duration::from_secs(5).max(hold)),
        ..settings.clone()
    };
    let a = ChildWorker::spawn(exe, &db.url, &a_id, settings).await;
    db.wait_started_by(&ids, &a_id, Duration::from_secs(30))
        .await;
    tokio::time::sleep(phase).await;
    let mut lock = taskq::sqlite::begin(&db.pool)
        .await
        .expect("take the write lock");
    sqlx::query("INSERT INTO fault_orders (ref) VALUES ('lock')")
        .execute(&mut *lock)
        .await
        .unwrap();
    let taken_us: i64 = sqlx::query_scalar("SELECT us FROM taskq_clock")
        .fetch_one(&mut *lock)
        .await
        .unwrap();
    tokio::time::sleep(hold).await;
    lock.rollback().await.unwrap();
    let released_us = db.scalar("SELECT us FROM taskq_clock").await;
    let list = id_list(&ids);
    let want = released_us + (settings.lease - settings.heartbeat).as_micros() as i64;
    let renewed_sql = format!(
        "SELECT COUNT(*) FROM taskq_tasks WHERE id IN ({list}) AND state = 'running'
           AND lease_epoch = 1 AND lease_until >= {want}"
    );
    // A renewal that went through lands within one heartbeat after the release.
    let deadline = Instant::now() + settings.heartbeat + Duration::from_secs(2);
    let mut renewed = false;
    while Instant::now() < deadline {
        if db.scalar(&renewed_sql).await == ids.len() as i64 {
            renewed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if !renewed {
        // Lost: the child's reaper returns the tasks and its claim loop runs them again.
        db.wait_state(
            &ids,
            "succeeded",
            settings.lease * 3 + Duration::from_secs(20),
        )
        .await;
    }
    a.signal("TERM");
    let report = a.report(Duration::from_secs(60)).await;
    let mut events = db.all_events().await;
    events.retain(|id, _| ids.contains(id));
    let margin = settings.cancel_grace.min(settings.lease / 2);
    LockHoldTrial {
        rows: db.rows(&ids).await,
        events,
        report,
        renewed,
        tolerated: settings
            .lease
            .saturating_sub(settings.heartbeat)
            .saturating_sub(margin),
        taken: DateTime::from_timestamp_micros(taken_us).unwrap(),
        released: DateTime::from_timestamp_micros(released_us).unwrap(),
    }
}

/// Convenience for the tests: a pool on the same file with its own connections.
pub async fn another_pool(db: &SqliteFaultDb, max: u32) -> SqlitePool {
    SqlitePoolOptions::new()
        .max_connections(max)
        .connect_with(taskq::sqlite::tune(
            sqlx::sqlite::SqliteConnectOptions::new().filename(&db.file.path),
        ))
        .await
        .expect("open the file")
}
