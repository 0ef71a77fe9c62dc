//! Shared by `tests/faults.rs`, the `taskq-fault-worker` child binary and the
//! `taskq-reliability` runner: the fault scenarios' task types, a private database with the
//! side tables they write, a child worker process, and each scenario as a function that returns
//! what happened (the tests assert on it, the runner prints it).
#![allow(dead_code)]

pub mod scenarios;
pub mod sqlite;

use std::collections::HashMap;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::mysql::MySqlPoolOptions;
use sqlx::{MySqlPool, SqlitePool};
use taskq::{Backoff, Task, TaskContext, TaskError};
use taskq_tests::server::PrivateServer;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

/// Side tables of the scenarios: handler events (database clock) and business rows.
const SIDE_TABLES: &str = "
CREATE TABLE fault_events (
    id          BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
    task_id     BIGINT UNSIGNED NOT NULL,
    worker_id   VARCHAR(128) NOT NULL,
    lease_epoch BIGINT UNSIGNED NOT NULL,
    attempt     INT UNSIGNED NOT NULL,
    event       VARCHAR(64) NOT NULL,
    at          DATETIME(6) NOT NULL,
    KEY (task_id)
) ENGINE = InnoDB;
CREATE TABLE fault_transitions (
    id          BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
    task_id     BIGINT UNSIGNED NOT NULL,
    old_state   VARCHAR(16) NOT NULL,
    new_state   VARCHAR(16) NOT NULL,
    lease_epoch BIGINT UNSIGNED NOT NULL,
    worker_id   VARCHAR(128) NULL,
    at          DATETIME(6) NOT NULL,
    KEY (task_id)
) ENGINE = InnoDB;
CREATE TABLE fault_orders (
    id          BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
    ref         VARCHAR(64) NOT NULL,
    UNIQUE KEY (ref)
) ENGINE = InnoDB;
";

/// Logs every state change of a task with the database time (scenario 1 only: it costs a
/// write per transition).
const TRANSITION_TRIGGER: &str = "
CREATE TRIGGER fault_transitions_log AFTER UPDATE ON taskq_tasks FOR EACH ROW
  IF OLD.state <> NEW.state THEN
    INSERT INTO fault_transitions (task_id, old_state, new_state, lease_epoch, worker_id, at)
    VALUES (NEW.id, OLD.state, NEW.state, NEW.lease_epoch, NEW.worker_id, UTC_TIMESTAMP(6));
  END IF";

/// A private server with one migrated database (`faults`) and the side tables.
pub struct FaultDb {
    /// The server (killed and its datadir removed on drop).
    pub server: PrivateServer,
    /// `mysql://root@127.0.0.1:PORT/faults`.
    pub url: String,
    /// A direct pool on the database (not through any proxy).
    pub pool: MySqlPool,
}

impl FaultDb {
    /// Starts a private server, or returns `None` when the machine has none (the test is
    /// skipped, unless `TASKQ_REQUIRE_PRIVATE_SERVER` is set).
    pub async fn start_or_skip(extra_args: &[&str]) -> Option<Self> {
        let server = PrivateServer::start_with_args_or_skip(extra_args).await?;
        Some(Self::on(server).await)
    }

    /// Sets up the `faults` database on `server`.
    pub async fn on(server: PrivateServer) -> Self {
        let url = server
            .create_database("faults")
            .await
            .expect("create database");
        let pool = MySqlPoolOptions::new()
            .max_connections(24)
            .connect_with(server.connect_options("faults"))
            .await
            .expect("connect to the private server");
        taskq::migrate(&pool).await.expect("taskq migrations apply");
        sqlx::raw_sql(SIDE_TABLES)
            .execute(&pool)
            .await
            .expect("side tables");
        Self { server, url, pool }
    }

    /// Installs the trigger that logs every task state change into `fault_transitions`.
    pub async fn log_transitions(&self) {
        sqlx::raw_sql(TRANSITION_TRIGGER)
            .execute(&self.pool)
            .await
            .expect("transition trigger");
    }

    /// `SELECT COUNT(*) FROM taskq_tasks WHERE <cond>`.
    pub async fn count(&self, cond: &str) -> i64 {
        count(
            &self.pool,
            &format!("SELECT COUNT(*) FROM taskq_tasks WHERE {cond}"),
        )
        .await
    }
}

/// Runs a `SELECT COUNT(*) ...`.
pub async fn count(pool: &MySqlPool, sql: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
        .fetch_one(pool)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// The columns of a task row the scenarios check.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Row {
    pub id: u64,
    pub name: String,
    pub state: String,
    pub attempt: u32,
    pub max_attempts: u32,
    pub lease_epoch: u64,
    pub worker_id: Option<String>,
    pub last_error: Option<String>,
    pub updated_at: DateTime<Utc>,
    pub lease_until: Option<DateTime<Utc>>,
}

/// Rows of the given ids (all rows when `ids` is empty), by id.
pub async fn rows(pool: &MySqlPool, ids: &[u64]) -> Vec<Row> {
    let all: Vec<Row> = sqlx::query_as(
        "SELECT id, name, CAST(state AS CHAR) AS state, attempt, max_attempts, lease_epoch,
                worker_id, last_error, updated_at, lease_until
         FROM taskq_tasks ORDER BY id",
    )
    .fetch_all(pool)
    .await
    .expect("task rows");
    if ids.is_empty() {
        return all;
    }
    all.into_iter().filter(|r| ids.contains(&r.id)).collect()
}

/// One handler event from `fault_events`.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Event {
    pub task_id: u64,
    pub worker_id: String,
    pub lease_epoch: u64,
    pub attempt: u32,
    pub event: String,
    pub at: DateTime<Utc>,
}

/// Events of task `id`, oldest first.
pub async fn events(pool: &MySqlPool, id: u64) -> Vec<Event> {
    sqlx::query_as(
        "SELECT task_id, worker_id, lease_epoch, attempt, event, at FROM fault_events
         WHERE task_id = ? ORDER BY id",
    )
    .bind(id)
    .fetch_all(pool)
    .await
    .expect("events")
}

async fn record_event(cx: &TaskContext, event: &str) -> Result<(), TaskError> {
    if cx.data::<SqlitePool>().is_some() {
        return sqlite_log(cx, event).await;
    }
    let pool = cx
        .data::<MySqlPool>()
        .ok_or_else(|| TaskError::permanent(std::io::Error::other("no MySqlPool data")))?;
    sqlx::query(
        "INSERT INTO fault_events (task_id, worker_id, lease_epoch, attempt, event, at)
         VALUES (?, ?, ?, ?, ?, UTC_TIMESTAMP(6))",
    )
    .bind(cx.id().0)
    .bind(cx.worker_id())
    .bind(cx.lease_epoch())
    .bind(cx.attempt())
    .bind(event)
    .execute(&pool)
    .await?;
    Ok(())
}

/// On SQLite (a `SqlitePool` registered as data), records the event in `fault_events` with
/// the database clock: the SQLite scenarios run handlers in several processes, so executions
/// are counted from the database, not from memory. Does nothing on MySQL.
async fn sqlite_log(cx: &TaskContext, event: &str) -> Result<(), TaskError> {
    let Some(pool) = cx.data::<SqlitePool>() else {
        return Ok(());
    };
    sqlx::query(
        "INSERT INTO fault_events (task_id, worker_id, lease_epoch, attempt, event, at)
         VALUES (?, ?, ?, ?, ?, (SELECT us FROM taskq_clock))",
    )
    .bind(cx.id().0 as i64)
    .bind(cx.worker_id())
    .bind(cx.lease_epoch() as i64)
    .bind(cx.attempt())
    .bind(event)
    .execute(&pool)
    .await?;
    Ok(())
}

/// Scenarios 1, 2 and 8. Records `started`; on its first claim (epoch 1) it then holds until
/// canceled and records `canceled:<reason>`, then returns (or, with `ignore_cancel`, holds
/// until aborted); any later claim returns at once.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Hold {
    pub n: u32,
    #[serde(default)]
    pub ignore_cancel: bool,
}

impl Task for Hold {
    const NAME: &'static str = "fault_hold";
    const QUEUE: &'static str = "faults";
    const MAX_ATTEMPTS: u32 = 10;
    const BACKOFF: Backoff = Backoff::constant(Duration::from_millis(100));
    async fn run(self, cx: TaskContext) -> Result<(), TaskError> {
        record_event(&cx, "started").await?;
        if cx.lease_epoch() == 1 {
            let reason = tokio::select! {
                r = cx.cancel_signal().canceled() => format!("{r:?}"),
                _ = tokio::time::sleep(Duration::from_secs(120)) => "never".to_owned(),
            };
            record_event(&cx, &format!("canceled:{reason}")).await?;
            if self.ignore_cancel {
                std::future::pending::<()>().await;
            }
        }
        Ok(())
    }
}

/// The backlog of the SIGKILL-with-a-backlog runs (`taskq-reliability kill --backlog N`): a task
/// of the `faults` queue that sleeps `ms` and succeeds. Only the surviving worker registers it
/// (never the child), so the backlog is enqueued after the child's tasks and drained by the
/// worker that takes them over.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Busy {
    pub n: u32,
    pub ms: u64,
}

impl Task for Busy {
    const NAME: &'static str = "fault_busy";
    const QUEUE: &'static str = "faults";
    async fn run(self, _cx: TaskContext) -> Result<(), TaskError> {
        tokio::time::sleep(Duration::from_millis(self.ms)).await;
        Ok(())
    }
}

/// What one SIGKILL-with-a-backlog trial measured (seconds from the kill, database clock).
#[derive(Debug, Clone, Default)]
pub struct BacklogTrial {
    /// Per killed task: kill → reaped (its `running → pending` transition).
    pub reaped: Vec<f64>,
    /// Per killed task: kill → the surviving worker's handler started.
    pub rerun: Vec<f64>,
    /// Per killed task: backlog tasks still pending when it was reaped.
    pub pending_at_reap: Vec<i64>,
    /// Per killed task: backlog tasks claimed after it was reaped and before it was claimed
    /// again (not counting those claimed in the same claim statement).
    pub started_between: Vec<i64>,
    /// Every killed task succeeded on the surviving worker, and the whole backlog succeeded.
    pub all_ok: bool,
}

/// One execution of a handler, recorded in memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exec {
    pub epoch: u64,
    pub attempt: u32,
    pub worker: String,
    pub note: String,
}

/// Executions by task id, shared with in-process handlers as worker state.
#[derive(Clone, Default)]
pub struct Seen(pub Arc<Mutex<HashMap<u64, Vec<Exec>>>>);

impl Seen {
    pub fn record(&self, cx: &TaskContext, note: impl Into<String>) {
        self.0
            .lock()
            .unwrap()
            .entry(cx.id().0)
            .or_default()
            .push(Exec {
                epoch: cx.lease_epoch(),
                attempt: cx.attempt(),
                worker: cx.worker_id().to_owned(),
                note: note.into(),
            });
    }
    pub fn snapshot(&self) -> HashMap<u64, Vec<Exec>> {
        self.0.lock().unwrap().clone()
    }
    pub fn executions(&self) -> usize {
        self.0.lock().unwrap().values().map(Vec::len).sum()
    }
}

fn seen(cx: &TaskContext) -> Seen {
    cx.data::<Seen>().expect("Seen data registered")
}

/// Records an execution in memory and, on SQLite, in `fault_events` (see [`sqlite_log`]).
async fn note(cx: &TaskContext, note: impl Into<String>) -> Result<(), TaskError> {
    let note = note.into();
    sqlite_log(cx, &note).await?;
    seen(cx).record(cx, note);
    Ok(())
}

/// Load of scenarios 3, 4 and 7: records the execution, sleeps, succeeds. No database access,
/// so every failure comes from the worker's own statements.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Work {
    pub n: u32,
    pub sleep_ms: u64,
}

impl Task for Work {
    const NAME: &'static str = "fault_work";
    const QUEUE: &'static str = "load";
    const MAX_ATTEMPTS: u32 = 100;
    const BACKOFF: Backoff = Backoff::constant(Duration::from_millis(100));
    async fn run(self, cx: TaskContext) -> Result<(), TaskError> {
        note(&cx, "").await?;
        tokio::time::sleep(Duration::from_millis(self.sleep_ms)).await;
        Ok(())
    }
}

/// Scenario 7: a handler that misbehaves on the `load` queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum PoisonMode {
    /// Panics on every attempt.
    Panic,
    /// Never returns and ignores its cancel signal.
    Hang,
    /// Ends its whole worker process (`std::process::exit(3)`): the lease expires and another
    /// process's reaper returns the task, counting the attempt.
    Exit,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Poison {
    pub mode: PoisonMode,
}

impl Task for Poison {
    const NAME: &'static str = "fault_poison";
    const QUEUE: &'static str = "load";
    const MAX_ATTEMPTS: u32 = 3;
    const BACKOFF: Backoff = Backoff::constant(Duration::from_millis(100));
    async fn run(self, cx: TaskContext) -> Result<(), TaskError> {
        note(&cx, format!("{:?}", self.mode)).await?;
        match self.mode {
            PoisonMode::Panic => panic!("poison pill {}", cx.id()),
            PoisonMode::Hang => std::future::pending().await,
            PoisonMode::Exit => std::process::exit(3),
        }
    }
}

/// Scenario 7: hangs forever, ignoring its cancel signal, under a 500 ms timeout.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PoisonTimed;

impl Task for PoisonTimed {
    const NAME: &'static str = "fault_poison_timed";
    const QUEUE: &'static str = "load";
    const MAX_ATTEMPTS: u32 = 2;
    const TIMEOUT: Option<Duration> = Some(Duration::from_millis(500));
    const BACKOFF: Backoff = Backoff::constant(Duration::from_millis(100));
    async fn run(self, cx: TaskContext) -> Result<(), TaskError> {
        note(&cx, "hang").await?;
        std::future::pending().await
    }
}

/// Scenario 5: the task enqueued with each business row; fails permanently when its row does
/// not exist (an orphan).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Ship {
    pub order_id: u64,
}

impl Task for Ship {
    const NAME: &'static str = "fault_ship";
    const QUEUE: &'static str = "orders";
    const MAX_ATTEMPTS: u32 = 5;
    const BACKOFF: Backoff = Backoff::constant(Duration::from_millis(100));
    async fn run(self, cx: TaskContext) -> Result<(), TaskError> {
        let n: i64 = if let Some(pool) = cx.data::<SqlitePool>() {
            sqlx::query_scalar("SELECT COUNT(*) FROM fault_orders WHERE id = ?")
                .bind(self.order_id as i64)
                .fetch_one(&pool)
                .await?
        } else {
            let pool = cx.data::<MySqlPool>().expect("MySqlPool data registered");
            sqlx::query_scalar("SELECT COUNT(*) FROM fault_orders WHERE id = ?")
                .bind(self.order_id)
                .fetch_one(&pool)
                .await?
        };
        note(&cx, if n == 1 { "found" } else { "orphan" }).await?;
        if n != 1 {
            return Err(TaskError::permanent(std::io::Error::other(format!(
                "orphan: order {} does not exist",
                self.order_id
            ))));
        }
        Ok(())
    }
}

/// Scenario 6: records the text it received (as the note).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Text {
    pub text: String,
}

impl Task for Text {
    const NAME: &'static str = "fault_text";
    const QUEUE: &'static str = "bad";
    const MAX_ATTEMPTS: u32 = 5;
    const BACKOFF: Backoff = Backoff::constant(Duration::from_millis(50));
    async fn run(self, cx: TaskContext) -> Result<(), TaskError> {
        seen(&cx).record(&cx, self.text);
        Ok(())
    }
}

/// Scenario 6: always fails with `"always fails: "` + `detail` repeated `repeat` times.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AlwaysFails {
    pub detail: String,
    pub repeat: usize,
}

impl Task for AlwaysFails {
    const NAME: &'static str = "fault_fails";
    const QUEUE: &'static str = "bad";
    const MAX_ATTEMPTS: u32 = 5;
    const BACKOFF: Backoff = Backoff::constant(Duration::from_millis(50));
    async fn run(self, cx: TaskContext) -> Result<(), TaskError> {
        seen(&cx).record(&cx, "");
        Err(TaskError::msg(format!(
            "always fails: {}",
            self.detail.repeat(self.repeat)
        )))
    }
}

/// Sends `SIG<sig>` to `pid`.
pub fn send_signal(pid: u32, sig: &str) {
    let status = std::process::Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{sig} {pid} failed");
}

/// Settings of a child worker (`taskq-fault-worker`).
#[derive(Debug, Clone)]
pub struct ChildSettings {
    pub lease: Duration,
    pub heartbeat: Duration,
    pub reaper: Duration,
    pub shutdown_timeout: Duration,
    pub concurrency: usize,
    /// `queue:concurrency,...` to work instead of `faults` (SQLite children only).
    pub queues: Option<String>,
    pub cancel_grace: Duration,
    /// SQLite children: the pool's busy timeout (`--busy-ms`; default: the longest the lease
    /// allows, `lease − heartbeat − min(cancel grace, lease / 2)`).
    pub busy: Option<Duration>,
    /// SQLite children: the busy timeout of the pool handlers record their events on
    /// (`--events-busy-ms`; default: the worker's pool).
    pub events_busy: Option<Duration>,
}

impl Default for ChildSettings {
    fn default() -> Self {
        Self {
            lease: Duration::from_secs(2),
            heartbeat: Duration::from_millis(500),
            reaper: Duration::from_millis(200),
            shutdown_timeout: Duration::from_secs(5),
            concurrency: 8,
            queues: None,
            cancel_grace: Duration::from_millis(500),
            busy: None,
            events_busy: None,
        }
    }
}

/// A `taskq-fault-worker` child process working the `faults` queue (task [`Hold`]).
pub struct ChildWorker {
    child: Child,
    stdout: Lines<BufReader<ChildStdout>>,
    /// Its worker id.
    pub id: String,
    /// Its process id.
    pub pid: u32,
}

/// What a child printed at exit.
#[derive(Debug, Clone, Deserialize)]
pub struct ChildReport {
    pub released: Vec<u64>,
    pub unacknowledged: Vec<u64>,
    pub stats: HashMap<String, u64>,
}

impl ChildWorker {
    /// Starts `exe` on `url` and waits for its `ready <id>` line.
    pub async fn spawn(exe: &Path, url: &str, id: &str, s: &ChildSettings) -> Self {
        let ms = |d: Duration| d.as_millis().to_string();
        let mut child = Command::new(exe)
            .args(["--url", url, "--id", id])
            .args(["--lease-ms", &ms(s.lease)])
            .args(["--heartbeat-ms", &ms(s.heartbeat)])
            .args(["--reaper-ms", &ms(s.reaper)])
            .args(["--shutdown-ms", &ms(s.shutdown_timeout)])
            .args(["--concurrency", &s.concurrency.to_string()])
            .args(["--grace-ms", &ms(s.cancel_grace)])
            .args(s.queues.iter().flat_map(|q| ["--queues", q.as_str()]))
            .args(s.busy.iter().flat_map(|b| ["--busy-ms".to_owned(), ms(*b)]))
            .args(
                s.events_busy
                    .iter()
                    .flat_map(|b| ["--events-busy-ms".to_owned(), ms(*b)]),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", exe.display()));
        let pid = child.id().expect("child pid");
        let mut stdout = BufReader::new(child.stdout.take().expect("piped stdout")).lines();
        let line = tokio::time::timeout(Duration::from_secs(30), stdout.next_line())
            .await
            .expect("child printed ready within 30 s")
            .expect("read child stdout")
            .expect("child printed a line");
        let got = line
            .strip_prefix("ready ")
            .unwrap_or_else(|| panic!("unexpected child line {line:?}"));
        assert_eq!(got, id);
        Self {
            child,
            stdout,
            id: id.to_owned(),
            pid,
        }
    }

    /// SIGKILL; returns the time the signal was sent, once the process is gone.
    pub async fn sigkill(mut self) -> DateTime<Utc> {
        self.child.start_kill().expect("SIGKILL the child");
        let at = Utc::now();
        let _ = self.child.wait().await;
        at
    }

    /// Sends `SIG<sig>` (e.g. `STOP`, `CONT`, `TERM`).
    pub fn signal(&self, sig: &str) {
        send_signal(self.pid, sig);
    }

    /// Whether the child has exited, and how (without waiting).
    pub fn try_exit(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().expect("poll the child")
    }

    /// Waits (up to `timeout`) for the child to exit and returns its report.
    pub async fn report(mut self, timeout: Duration) -> ChildReport {
        let read = async {
            let mut report = None;
            while let Ok(Some(line)) = self.stdout.next_line().await {
                if let Some(json) = line.strip_prefix("report ") {
                    report = Some(serde_json::from_str::<ChildReport>(json).expect("report JSON"));
                }
            }
            let status = self.child.wait().await.expect("wait for the child");
            assert!(status.success(), "child exited with {status}");
            report.expect("child printed its report")
        };
        tokio::time::timeout(timeout, read)
            .await
            .expect("child exited in time")
    }
}

/// Waits until `cond` holds, polling every 20 ms; panics with `what` after `timeout`.
pub async fn wait_for<F, Fut>(timeout: Duration, what: &str, cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    taskq_tests::wait_until(timeout, what, cond).await;
}

/// Seconds of a chrono duration, as `f64`.
pub fn secs(d: chrono::TimeDelta) -> f64 {
    d.num_microseconds().unwrap_or(i64::MAX) as f64 / 1e6
}

/// `(min, median, max)` of samples (seconds).
pub fn min_median_max(samples: &[f64]) -> (f64, f64, f64) {
    let mut v = samples.to_vec();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    if v.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    let mid = if v.len() % 2 == 1 {
        v[v.len() / 2]
    } else {
        (v[v.len() / 2 - 1] + v[v.len() / 2]) / 2.0
    };
    (v[0], mid, v[v.len() - 1])
}
