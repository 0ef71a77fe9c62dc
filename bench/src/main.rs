//! taskq's benchmark: throughput, latency and cost per task, each shown next to the database's
//! own ceiling measured in the same run with hand-written SQL.
//!
//! ```text
//! cargo run --release -p taskq-bench -- --database-url mysql://root@127.0.0.1:3306 [--quick]
//!     [--out target/bench.json] [--svg docs/bench-throughput.svg] [--skip-million]
//!     [--targets-only | --unknown-names]
//! cargo run --release -p taskq-bench -- --dashboard [--dashboard-tasks 1000000] [--requests 30]
//!     [--keep-db]
//! cargo run --release -p taskq-bench -- --sqlite [--sqlite-file target/bench-sqlite.db] [--quick]
//!     [--out target/bench-sqlite.json] [--keep-db]
//! cargo run --release -p taskq-bench -- --fleet 32x1,64x1 [--fleet-tasks 10000]
//! ```
//!
//! It creates a scratch database (`taskq_bench_<random>`), runs every measurement in it and
//! drops it. Statement counts come from the server's global `Questions` / `Com_*` counters,
//! so nothing else should use the server meanwhile. `--sqlite` needs no server: it measures
//! taskq against hand-written SQL on an SQLite file (see `sqlite.rs`).

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
use sqlx::types::chrono::NaiveDateTime;
use sqlx::{ConnectOptions, Connection, MySqlPool, Row};
use taskq::{Task, TaskContext, TaskError};

mod dashboard;
mod sqlite;

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const QUEUE: &str = "bench";
const TASK: &str = "bench_noop";
/// Pad so a payload is ~256 bytes of JSON.
const PAD: usize = 233;

// ---------------------------------------------------------------------------------------------
// The task: a no-op handler that can record when it started.

#[derive(serde::Serialize, serde::Deserialize)]
struct Noop {
    seq: u64,
    pad: String,
}

static RECORD: AtomicBool = AtomicBool::new(false);
static STARTS: Mutex<Vec<(u64, Instant)>> = Mutex::new(Vec::new());

impl Task for Noop {
    const NAME: &'static str = TASK;
    const QUEUE: &'static str = QUEUE;
    async fn run(self, _cx: TaskContext) -> Result<(), TaskError> {
        if RECORD.load(Ordering::Relaxed) {
            let now = Instant::now();
            STARTS.lock().unwrap().push((self.seq, now));
        }
        Ok(())
    }
}

fn noop(seq: u64) -> Noop {
    Noop {
        seq,
        pad: "x".repeat(PAD),
    }
}

// ---------------------------------------------------------------------------------------------
// Settings.

struct Opts {
    url: String,
    quick: bool,
    /// `--out`, when given (each mode has its default).
    out: Option<String>,
    svg: String,
    million: bool,
    /// Only the two ratio targets at 16 (enqueue_tx vs raw, drain vs raw loop), for tuning.
    targets_only: bool,
    /// Only the unknown-names scenario (pending tasks no worker knows at the head of the
    /// queue), printed.
    unknown_only: bool,
    /// Only the queue-limit scenario (drains without a limit, with a limit that never binds,
    /// with one that does), printed.
    limits_only: bool,
    /// Only the dashboard's page times on a large table (see `dashboard.rs`).
    dashboard: Option<dashboard::DashOpts>,
    /// Leave the scratch database in place (its name is printed).
    keep_db: bool,
    /// Only the SQLite measurements, on this file (`--sqlite`, `--sqlite-file PATH`).
    sqlite: Option<std::path::PathBuf>,
    /// Only fleets of `workers × concurrency` (`--fleet 32x1,64x1`), each worker with its own
    /// pool, with the server's peak connection count.
    fleet: Vec<(usize, usize)>,
    /// Tasks each fleet drains (`--fleet-tasks`).
    fleet_tasks: u64,
    /// `--fleet-shared-pool`: the fleet's workers share one pool (Worker instances in one
    /// process) instead of one pool each (as worker processes would have).
    fleet_shared_pool: bool,
}

/// The dashboard settings of `o`, created with their defaults by the first `--dashboard*`.
fn dashboard_opts(o: &mut Opts) -> &mut dashboard::DashOpts {
    o.dashboard.get_or_insert(dashboard::DashOpts {
        tasks: 1_000_000,
        requests: 30,
    })
}

fn parse_args() -> Res<Opts> {
    let mut o = Opts {
        url: std::env::var("DATABASE_URL")
            .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306".to_owned()),
        quick: false,
        out: None,
        svg: "docs/bench-throughput.svg".into(),
        million: true,
        targets_only: false,
        unknown_only: false,
        limits_only: false,
        dashboard: None,
        keep_db: false,
        sqlite: None,
        fleet: Vec::new(),
        fleet_tasks: 10_000,
        fleet_shared_pool: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--database-url" => o.url = args.next().ok_or("--database-url needs a value")?,
            "--quick" => o.quick = true,
            "--out" => o.out = Some(args.next().ok_or("--out needs a value")?),
            "--svg" => o.svg = args.next().ok_or("--svg needs a value")?,
            "--skip-million" => o.million = false,
            "--targets-only" => o.targets_only = true,
            "--unknown-names" => o.unknown_only = true,
            "--limits" => o.limits_only = true,
            "--dashboard" => {
                dashboard_opts(&mut o);
            }
            "--dashboard-tasks" => {
                dashboard_opts(&mut o).tasks = args
                    .next()
                    .and_then(|v| v.replace('_', "").parse().ok())
                    .ok_or("--dashboard-tasks needs a number")?
            }
            "--requests" => {
                dashboard_opts(&mut o).requests = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .filter(|n| *n > 0)
                    .ok_or("--requests needs a positive number")?
            }
            "--keep-db" => o.keep_db = true,
            "--sqlite" => {
                o.sqlite
                    .get_or_insert_with(|| "target/bench-sqlite.db".into());
            }
            "--sqlite-file" => {
                o.sqlite = Some(args.next().ok_or("--sqlite-file needs a path")?.into())
            }
            "--fleet" => {
                let spec = args
                    .next()
                    .ok_or("--fleet needs WORKERSxCONCURRENCY[,...]")?;
                for one in spec.split(',') {
                    let (w, c) = one
                        .split_once('x')
                        .and_then(|(w, c)| Some((w.parse().ok()?, c.parse().ok()?)))
                        .filter(|&(w, c): &(usize, usize)| w > 0 && c > 0)
                        .ok_or_else(|| format!("--fleet: {one:?} is not WORKERSxCONCURRENCY"))?;
                    o.fleet.push((w, c));
                }
            }
            "--fleet-shared-pool" => o.fleet_shared_pool = true,
            "--fleet-tasks" => {
                o.fleet_tasks = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .filter(|n| *n > 0)
                    .ok_or("--fleet-tasks needs a positive number")?
            }
            "-h" | "--help" => {
                println!(
                    "usage: taskq-bench [--database-url URL] [--quick] [--out FILE.json] \
                     [--svg FILE.svg] [--skip-million] [--targets-only | --unknown-names | --limits]\n\
                     \x20      taskq-bench --dashboard [--dashboard-tasks N] [--requests N] \
                     [--keep-db]\n\
                     \x20      taskq-bench --fleet 32x1,64x1 [--fleet-tasks N] [--fleet-shared-pool]\n\
                     \x20      taskq-bench --sqlite [--sqlite-file PATH] [--quick] [--out FILE.json] \
                     [--keep-db]\n\n\
                     --targets-only   only the ratio measurements, printed (a tuning aid)\n\
                     --unknown-names  only the claim with {UNKNOWN} pending tasks no worker \
                     knows at the head of the queue vs none, printed\n\
                     --limits         only drains at concurrency 16 without a queue limit, \
                     with a limit of 1000 (never binding) and of 8, interleaved, printed\n\
                     --dashboard      only the dashboard's page times on a table of N tasks \
                     (default 1000000), --requests per page (default 30), printed\n\
                     --sqlite         only taskq on an SQLite file vs hand-written SQL on the \
                     same file (enqueue_tx vs INSERT+COMMIT at 1/4/16 connections, drains at \
                     1/4/16 vs a batched claim loop, statements per task), printed and written \
                     to --out (default target/bench-sqlite.json); no MySQL server needed\n\
                     --sqlite-file    the SQLite file (default target/bench-sqlite.db; \
                     deleted before and after the run); implies --sqlite\n\
                     --keep-db        leave the scratch database (or SQLite file) in place and \
                     print its name\n\
                     --fleet 32x1,64x1  only fleets of W workers at concurrency C, each worker \
                     with its own pool (as W processes would have; --fleet-shared-pool: one \
                     pool for all, as W Worker instances in one process), draining \
                     --fleet-tasks (default 10000) tasks: tasks/s, statements per task and the \
                     server's peak connection count (FLUSH STATUS before each; needs a server \
                     nobody else uses), printed"
                );
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?}").into()),
        }
    }
    Ok(o)
}

/// Sizes of one run.
struct Sizes {
    /// Seconds of each fixed-duration insert measurement.
    insert_secs: f64,
    /// Tasks of each drain (and of the raw claim loop).
    drain: u64,
    reps: usize,
    /// Tasks of the enqueue_many measurement.
    many: u64,
    latency_tasks: u64,
    backlog: u64,
    million: u64,
}

impl Sizes {
    fn new(quick: bool) -> Self {
        if quick {
            Sizes {
                insert_secs: 2.0,
                drain: 2_000,
                reps: 1,
                many: 5_000,
                latency_tasks: 60,
                backlog: 20_000,
                million: 20_000,
            }
        } else {
            Sizes {
                insert_secs: 16.0,
                drain: 20_000,
                reps: 3,
                many: 50_000,
                latency_tasks: 500,
                backlog: 1_000_000,
                million: 1_000_000,
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Process and server counters.

/// User + system CPU seconds of this process.
fn cpu_secs() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let rest = stat.rsplit_once(')').map(|x| x.1).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // Fields 14 and 15 of /proc/<pid>/stat; `rest` starts at field 3. USER_HZ is 100 on Linux.
    (ticks(11) + ticks(12)) / 100.0
}

/// A `VmXXX:` value of /proc/self/status, in KiB.
fn vm_kib(key: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Resets the peak RSS (VmHWM) of this process to its current RSS.
fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

const COUNTERS: &[&str] = &[
    "Questions",
    "Com_select",
    "Com_insert",
    "Com_update",
    "Com_delete",
    "Com_begin",
    "Com_commit",
    "Com_stmt_execute",
    "Handler_read_next",
];

async fn server_status(pool: &MySqlPool) -> Res<HashMap<String, i64>> {
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SHOW GLOBAL STATUS WHERE Variable_name IN ('Questions', 'Com_select', 'Com_insert', \
         'Com_update', 'Com_delete', 'Com_begin', 'Com_commit', 'Com_stmt_execute', \
         'Handler_read_next')",
    )
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(k, v)| (k, v.parse().unwrap_or(0)))
        .collect())
}

/// Counter deltas; `Questions` excludes the second `SHOW STATUS` itself.
fn status_delta(a: &HashMap<String, i64>, b: &HashMap<String, i64>) -> HashMap<String, i64> {
    COUNTERS
        .iter()
        .map(|k| {
            let mut d = b.get(*k).copied().unwrap_or(0) - a.get(*k).copied().unwrap_or(0);
            if *k == "Questions" {
                d -= 1;
            }
            ((*k).to_owned(), d)
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Scratch database.

async fn reset(pool: &MySqlPool) -> Res<()> {
    sqlx::query("TRUNCATE TABLE taskq_tasks")
        .execute(pool)
        .await?;
    Ok(())
}

/// Enqueues `n` no-op tasks with ~256-byte payloads through `enqueue_many`, 1,000 per
/// transaction.
async fn preload(pool: &MySqlPool, n: u64) -> Res<()> {
    let mut seq = 0;
    while seq < n {
        let end = (seq + 1000).min(n);
        let mut tx = pool.begin().await?;
        taskq::enqueue_many(&mut tx, (seq..end).map(noop)).await?;
        tx.commit().await?;
        seq = end;
    }
    Ok(())
}

/// Inserts `n` rows with plain SQL (1 in `due_every` due now, the others due in a day), in
/// statements of 100,000 rows generated from a digits table. Small payloads.
async fn bulk_insert(pool: &MySqlPool, n: u64, due_every: u64) -> Res<()> {
    sqlx::query("CREATE TABLE IF NOT EXISTS bench_digits (d INT PRIMARY KEY)")
        .execute(pool)
        .await?;
    sqlx::query("INSERT IGNORE INTO bench_digits VALUES (0),(1),(2),(3),(4),(5),(6),(7),(8),(9)")
        .execute(pool)
        .await?;
    let chunk = 100_000u64;
    let mut base = 0;
    while base < n {
        let rows = chunk.min(n - base);
        sqlx::query(
            "INSERT INTO taskq_tasks (queue, name, payload, state, priority, max_attempts, run_at,
                 created_at, updated_at)
             SELECT 'bench', 'bench_noop', CONCAT('{\"seq\":', s.n, ',\"pad\":\"\"}'), 'pending',
                 0, 20,
                 IF(s.n % ? = 0, UTC_TIMESTAMP(6) - INTERVAL 1 SECOND, UTC_TIMESTAMP(6) + INTERVAL 1 DAY),
                 UTC_TIMESTAMP(6), UTC_TIMESTAMP(6)
             FROM (SELECT ? + a.d + 10 * b.d + 100 * c.d + 1000 * e.d + 10000 * f.d AS n
                   FROM bench_digits a, bench_digits b, bench_digits c, bench_digits e,
                        bench_digits f) s
             WHERE s.n < ?
             ORDER BY s.n",
        )
        .bind(due_every)
        .bind(base)
        .bind(base + rows)
        .execute(pool)
        .await?;
        base += chunk; // the digits table yields 100,000 numbers per statement
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Raw ceilings.

/// Length of one time slice of [`insert_rates`]: every connection switches between the raw
/// INSERT and `enqueue_tx` at each slice boundary.
const INSERT_SLICE: Duration = Duration::from_millis(100);

/// Hand-written single-row INSERT + COMMIT and `enqueue_tx` + COMMIT on `conns` connections
/// for `secs`, interleaved in 100 ms slices (even slices raw, odd slices taskq, on every
/// connection at once), so that drift in the machine's speed over the run (other load, the
/// disk's fsync latency) falls on both equally. Returns `(raw, taskq)` transactions per second,
/// each over the half of the run it had.
async fn insert_rates(pool: &MySqlPool, conns: usize, secs: f64) -> Res<(f64, f64)> {
    reset(pool).await?;
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(secs);
    let mut set = tokio::task::JoinSet::new();
    for c in 0..conns {
        let pool = pool.clone();
        set.spawn(async move {
            let mut conn = pool.acquire().await?;
            let (mut raw, mut tq) = (0u64, 0u64);
            let payload = serde_json::to_vec(&noop(0))?;
            loop {
                let now = Instant::now();
                if now >= deadline {
                    break;
                }
                let slice = (now - start).as_nanos() / INSERT_SLICE.as_nanos();
                let taskq = slice % 2 == 1;
                let mut tx = conn.begin().await?;
                if taskq {
                    noop(c as u64 * 10_000_000 + tq).enqueue_tx(&mut tx).await?;
                } else {
                    sqlx::query(
                        "INSERT INTO taskq_tasks (queue, name, payload, state, priority,
                             max_attempts, run_at, idempotency_key, created_at, updated_at)
                         VALUES (?, ?, ?, 'pending', ?, ?, UTC_TIMESTAMP(6), NULL,
                             UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))",
                    )
                    .bind(QUEUE)
                    .bind(TASK)
                    .bind(&payload)
                    .bind(0i16)
                    .bind(20u32)
                    .execute(&mut *tx)
                    .await?;
                }
                tx.commit().await?;
                if taskq {
                    tq += 1;
                } else {
                    raw += 1;
                }
            }
            Res::Ok((raw, tq))
        });
    }
    let (mut raw, mut tq) = (0, 0);
    while let Some(r) = set.join_next().await {
        let (r, t) = r??;
        raw += r;
        tq += t;
    }
    let half = start.elapsed().as_secs_f64() / 2.0;
    Ok((raw as f64 / half, tq as f64 / half))
}

/// How a hand-written claim finds and locks its rows.
#[derive(Clone, Copy, PartialEq)]
enum ClaimShape {
    /// `SELECT … ORDER BY … LIMIT n FOR UPDATE SKIP LOCKED` on the claim index: the loop the
    /// performance issue defines as the database's batched ceiling.
    LockingScan,
    /// taskq's claim: a plain read of 2n candidate ids on the claim index, then
    /// `SELECT … FOR UPDATE SKIP LOCKED` of those ids by primary key, stopping at n.
    TwoStep,
}

/// The hand-written batched loop: `conns` connections each repeat { BEGIN; claim up to `batch`
/// rows (see [`ClaimShape`]); UPDATE → running; COMMIT; UPDATE → succeeded } until `n`
/// preloaded tasks are done. Returns rows/s.
async fn raw_claim_loop(
    pool: &MySqlPool,
    conns: usize,
    n: u64,
    batch: u32,
    shape: ClaimShape,
) -> Res<f64> {
    reset(pool).await?;
    preload(pool, n).await?;
    let start = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..conns {
        let pool = pool.clone();
        set.spawn(async move {
            let mut conn = pool.acquire().await?;
            sqlx::query("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                .execute(&mut *conn)
                .await?;
            let mut done = 0u64;
            let mut after: Option<(u64, i16, NaiveDateTime)> = None;
            loop {
                let mut tx = conn.begin().await?;
                let rows = match shape {
                    ClaimShape::LockingScan => {
                        sqlx::query(
                            "SELECT id, name, payload, attempt, max_attempts, lease_epoch
                             FROM taskq_tasks
                             WHERE state = 'pending' AND queue = ? AND run_at <= UTC_TIMESTAMP(6)
                             ORDER BY priority, run_at, id LIMIT ? FOR UPDATE SKIP LOCKED",
                        )
                        .bind(QUEUE)
                        .bind(batch)
                        .fetch_all(&mut *tx)
                        .await?
                    }
                    ClaimShape::TwoStep => {
                        // Like taskq: after a contended claim, read candidates past the last
                        // one instead of re-reading rows other connections hold.
                        let seek = after.take();
                        let was_seek = seek.is_some();
                        let candidates: Vec<(u64, i16, NaiveDateTime)> = match seek {
                            None => sqlx::query_as(
                                "SELECT id, priority, run_at FROM taskq_tasks
                                 WHERE state = 'pending' AND queue = ?
                                   AND run_at <= UTC_TIMESTAMP(6)
                                 ORDER BY priority, run_at, id LIMIT ?",
                            )
                            .bind(QUEUE)
                            .bind(batch * 2)
                            .fetch_all(&mut *tx)
                            .await?,
                            Some((id, p, r)) => sqlx::query_as(
                                "SELECT id, priority, run_at FROM taskq_tasks
                                 WHERE state = 'pending' AND queue = ?
                                   AND run_at <= UTC_TIMESTAMP(6)
                                   AND (priority > ? OR (priority = ? AND run_at > ?)
                                        OR (priority = ? AND run_at = ? AND id > ?))
                                 ORDER BY priority, run_at, id LIMIT ?",
                            )
                            .bind(QUEUE)
                            .bind(p)
                            .bind(p)
                            .bind(r)
                            .bind(p)
                            .bind(r)
                            .bind(id)
                            .bind(batch * 2)
                            .fetch_all(&mut *tx)
                            .await?,
                        };
                        let full = candidates.len() as u32 == batch * 2;
                        let last = candidates.last().copied();
                        let ids: Vec<u64> = candidates.iter().map(|c| c.0).collect();
                        let rows = if ids.is_empty() {
                            Vec::new()
                        } else {
                            sqlx::query(
                                "SELECT t.id, t.name, t.payload, t.attempt, t.max_attempts,
                                     t.lease_epoch
                                 FROM JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$')) AS j
                                   STRAIGHT_JOIN taskq_tasks t FORCE INDEX (PRIMARY) ON t.id = j.id
                                 WHERE t.state = 'pending' AND t.run_at <= UTC_TIMESTAMP(6)
                                 LIMIT ? FOR UPDATE SKIP LOCKED",
                            )
                            .bind(serde_json::to_string(&ids)?)
                            .bind(batch)
                            .fetch_all(&mut *tx)
                            .await?
                        };
                        if (rows.len() as u32) < batch && full {
                            after = last;
                        }
                        if rows.is_empty() && (after.is_some() || was_seek) {
                            // Held by others, or the seek ran out: go on, from the head if
                            // nothing is left past the candidates.
                            tx.commit().await?;
                            continue;
                        }
                        rows
                    }
                };
                if rows.is_empty() {
                    tx.commit().await?;
                    break;
                }
                let leases: Vec<(u64, u64)> = rows
                    .iter()
                    .map(|r| (r.get::<u64, _>(0), r.get::<u64, _>(5) + 1))
                    .collect();
                let ids: Vec<u64> = leases.iter().map(|l| l.0).collect();
                sqlx::query(
                    "UPDATE JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$')) AS j
                       STRAIGHT_JOIN taskq_tasks t FORCE INDEX (PRIMARY) ON t.id = j.id
                     SET t.state = 'running', t.attempt = t.attempt + 1,
                         t.lease_epoch = t.lease_epoch + 1,
                         t.lease_until = UTC_TIMESTAMP(6) + INTERVAL 30 SECOND,
                         t.worker_id = 'raw', t.updated_at = UTC_TIMESTAMP(6)",
                )
                .bind(serde_json::to_string(&ids)?)
                .execute(&mut *tx)
                .await?;
                tx.commit().await?;
                sqlx::query(
                    "UPDATE JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$[0]',
                                                         epoch BIGINT UNSIGNED PATH '$[1]')) AS j
                       STRAIGHT_JOIN taskq_tasks t FORCE INDEX (PRIMARY)
                         ON t.id = j.id AND t.lease_epoch = j.epoch
                     SET t.state = 'succeeded', t.finished_at = UTC_TIMESTAMP(6),
                         t.lease_until = NULL, t.updated_at = UTC_TIMESTAMP(6)
                     WHERE t.state = 'running'",
                )
                .bind(serde_json::to_string(&leases)?)
                .execute(&mut *conn)
                .await?;
                done += rows.len() as u64;
            }
            Res::Ok(done)
        });
    }
    let mut total = 0;
    while let Some(r) = set.join_next().await {
        total += r??;
    }
    if total != n {
        return Err(format!("raw loop finished {total} of {n} tasks").into());
    }
    Ok(n as f64 / start.elapsed().as_secs_f64())
}

// ---------------------------------------------------------------------------------------------
// taskq.

async fn enqueue_many_rate(pool: &MySqlPool, n: u64, per_tx: u64) -> Res<f64> {
    reset(pool).await?;
    let tasks: Vec<Noop> = (0..n).map(noop).collect();
    let start = Instant::now();
    let mut it = tasks.into_iter().peekable();
    while it.peek().is_some() {
        let chunk: Vec<Noop> = it.by_ref().take(per_tx as usize).collect();
        let mut tx = pool.begin().await?;
        taskq::enqueue_many(&mut tx, chunk).await?;
        tx.commit().await?;
    }
    Ok(n as f64 / start.elapsed().as_secs_f64())
}

/// A running worker for the bench queue.
struct Running {
    stop: tokio::sync::oneshot::Sender<()>,
    handle: tokio::task::JoinHandle<taskq::Result<taskq::worker::ShutdownReport>>,
    stats: Arc<taskq::worker::WorkerStats>,
}

fn start_worker<DB: taskq::Backend>(pool: &sqlx::Pool<DB>, concurrency: usize) -> Res<Running> {
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    let worker = taskq::Worker::builder(pool.clone())
        .register::<Noop>()
        .queue(QUEUE, concurrency)
        .retention(taskq::worker::Retention::disabled())
        .shutdown_signal(async move {
            let _ = rx.await;
        })
        .build()?;
    let stats = worker.stats();
    Ok(Running {
        stop,
        handle: tokio::spawn(worker.run()),
        stats,
    })
}

impl Running {
    fn succeeded(&self) -> u64 {
        self.stats.snapshot().succeeded
    }
    async fn wait_for(&self, n: u64, timeout: Duration) -> Res<()> {
        let deadline = Instant::now() + timeout;
        while self.succeeded() < n {
            if Instant::now() > deadline {
                return Err(format!(
                    "worker did {} of {n} tasks in {timeout:?}",
                    self.succeeded()
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        Ok(())
    }
    async fn stop(self) -> Res<taskq::worker::ShutdownReport> {
        let _ = self.stop.send(());
        Ok(self.handle.await??)
    }
}

#[derive(Clone, serde::Serialize)]
struct Drain {
    concurrency: usize,
    tasks: u64,
    secs: f64,
    tasks_per_s: f64,
    statements_per_task: f64,
    com_per_task: HashMap<String, f64>,
    cpu_ms_per_task: f64,
    peak_rss_kib: u64,
    claim_queries: u64,
    ack_flushes: u64,
}

/// Drains `n` preloaded tasks with one worker at `concurrency`.
async fn drain_once(pool: &MySqlPool, concurrency: usize, n: u64, preloaded: bool) -> Res<Drain> {
    if !preloaded {
        reset(pool).await?;
        preload(pool, n).await?;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    reset_peak_rss();
    let before = server_status(pool).await?;
    let cpu0 = cpu_secs();
    let start = Instant::now();
    let w = start_worker(pool, concurrency)?;
    w.wait_for(n, Duration::from_secs(3600)).await?;
    let secs = start.elapsed().as_secs_f64();
    let cpu = cpu_secs() - cpu0;
    let report = w.stop().await?;
    let after = server_status(pool).await?;
    Ok(Drain::new(
        concurrency,
        n,
        secs,
        cpu,
        &report,
        &status_delta(&before, &after),
    ))
}

impl Drain {
    /// The figures of a drain of `n` tasks that took `secs` and `cpu` seconds of CPU, from the
    /// worker's shutdown report and the server's counter deltas.
    fn new(
        concurrency: usize,
        n: u64,
        secs: f64,
        cpu: f64,
        report: &taskq::worker::ShutdownReport,
        delta: &HashMap<String, i64>,
    ) -> Self {
        let per = |k: &str| delta.get(k).copied().unwrap_or(0) as f64 / n as f64;
        Drain {
            concurrency,
            tasks: n,
            secs,
            tasks_per_s: n as f64 / secs,
            statements_per_task: per("Questions"),
            com_per_task: COUNTERS.iter().map(|k| ((*k).to_owned(), per(k))).collect(),
            cpu_ms_per_task: cpu * 1000.0 / n as f64,
            peak_rss_kib: vm_kib("VmHWM:"),
            claim_queries: report.stats.claim_queries,
            ack_flushes: report.stats.ack_flushes,
        }
    }
}

/// A fleet draining one queue: `workers` workers at `concurrency` each, started together.
#[derive(serde::Serialize)]
struct FleetDrain {
    workers: usize,
    concurrency: usize,
    tasks: u64,
    tasks_per_s: f64,
    statements_per_task: f64,
    claim_queries: u64,
    /// Tasks per claim transaction: low when claimers keep getting in each other's way.
    tasks_per_claim: f64,
}

async fn drain_fleet(
    pool: &MySqlPool,
    workers: usize,
    concurrency: usize,
    n: u64,
) -> Res<FleetDrain> {
    reset(pool).await?;
    preload(pool, n).await?;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = server_status(pool).await?;
    let start = Instant::now();
    let fleet: Vec<Running> = (0..workers)
        .map(|_| start_worker(pool, concurrency))
        .collect::<Res<_>>()?;
    let deadline = Instant::now() + Duration::from_secs(3600);
    while fleet.iter().map(Running::succeeded).sum::<u64>() < n {
        if Instant::now() > deadline {
            return Err("fleet drain timed out".into());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let secs = start.elapsed().as_secs_f64();
    let mut claims = 0;
    for w in fleet {
        claims += w.stop().await?.stats.claim_queries;
    }
    let after = server_status(pool).await?;
    let d = status_delta(&before, &after);
    Ok(FleetDrain {
        workers,
        concurrency,
        tasks: n,
        tasks_per_s: n as f64 / secs,
        statements_per_task: d.get("Questions").copied().unwrap_or(0) as f64 / n as f64,
        claim_queries: claims,
        tasks_per_claim: n as f64 / claims.max(1) as f64,
    })
}

/// A fleet run of [`fleet_peak`].
struct FleetPeak {
    tasks: u64,
    secs: f64,
    tasks_per_s: f64,
    statements_per_task: f64,
    /// `Max_used_connections` after the drain (reset by `FLUSH STATUS` before it).
    peak_connections: i64,
    /// `Threads_connected` just before the fleet started (the bench's own connections).
    baseline_connections: i64,
    db_errors: u64,
}

/// `workers` workers at `concurrency`, each on its own pool (one connection opened at once, up
/// to 2, as a worker process's pool would be) or all on `pool` (`shared`), draining `n`
/// preloaded tasks: the server's peak connection count (`Max_used_connections` after `FLUSH
/// STATUS`) and the statements per task (`Questions`, connection set-up included).
async fn fleet_peak(
    pool: &MySqlPool,
    workers: usize,
    concurrency: usize,
    n: u64,
    shared: bool,
) -> Res<FleetPeak> {
    reset(pool).await?;
    preload(pool, n).await?;
    tokio::time::sleep(Duration::from_millis(200)).await;
    sqlx::query("FLUSH STATUS").execute(pool).await?;
    let before = server_status(pool).await?;
    let (_, baseline): (String, String) =
        sqlx::query_as("SHOW GLOBAL STATUS LIKE 'Threads_connected'")
            .fetch_one(pool)
            .await?;
    let start = Instant::now();
    let mut fleet = Vec::with_capacity(workers);
    for _ in 0..workers {
        if shared {
            fleet.push(start_worker(pool, concurrency)?);
            continue;
        }
        let own = MySqlPoolOptions::new()
            .max_connections(2)
            .connect_with((*pool.connect_options()).clone())
            .await?;
        fleet.push(start_worker(&own, concurrency)?);
    }
    let deadline = Instant::now() + Duration::from_secs(3600);
    while fleet.iter().map(Running::succeeded).sum::<u64>() < n {
        if Instant::now() > deadline {
            return Err("fleet drain timed out".into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let secs = start.elapsed().as_secs_f64();
    let mut db_errors = 0;
    for w in fleet {
        db_errors += w.stop().await?.stats.db_errors;
    }
    let after = server_status(pool).await?;
    let (_, peak): (String, String) =
        sqlx::query_as("SHOW GLOBAL STATUS LIKE 'Max_used_connections'")
            .fetch_one(pool)
            .await?;
    let d = status_delta(&before, &after);
    Ok(FleetPeak {
        tasks: n,
        secs,
        tasks_per_s: n as f64 / secs,
        statements_per_task: d.get("Questions").copied().unwrap_or(0) as f64 / n as f64,
        peak_connections: peak.parse()?,
        baseline_connections: baseline.parse()?,
        db_errors,
    })
}

#[derive(serde::Serialize)]
struct Latency {
    wake: bool,
    tasks: u64,
    interval_ms: f64,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
}

/// Enqueue-commit → handler-start at a light steady load (one task every `interval`), with
/// in-process wake-up (`enqueue(&pool)`) or without (`enqueue_tx` on a separate pool: no
/// notify, the worker finds the task by polling at its default 25 ms – 1 s).
async fn latency(pool: &MySqlPool, wake: bool, n: u64, interval: Duration) -> Res<Latency> {
    reset(pool).await?;
    STARTS.lock().unwrap().clear();
    RECORD.store(true, Ordering::Relaxed);
    let w = start_worker(pool, 16)?;
    let other = MySqlPoolOptions::new()
        .max_connections(1)
        .connect_with((*pool.connect_options()).clone())
        .await?;
    tokio::time::sleep(Duration::from_millis(1500)).await; // let the worker go idle
    let mut commits = Vec::with_capacity(n as usize);
    let mut tick = tokio::time::interval(interval);
    for seq in 0..n {
        tick.tick().await;
        if wake {
            noop(seq).enqueue(pool).await?;
        } else {
            let mut conn = other.acquire().await?;
            noop(seq).enqueue_tx(&mut *conn).await?;
        }
        commits.push(Instant::now());
    }
    w.wait_for(n, Duration::from_secs(60)).await?;
    RECORD.store(false, Ordering::Relaxed);
    w.stop().await?;
    other.close().await;
    let starts = std::mem::take(&mut *STARTS.lock().unwrap());
    let mut ms: Vec<f64> = starts
        .iter()
        .map(|(seq, at)| {
            at.saturating_duration_since(commits[*seq as usize])
                .as_secs_f64()
                * 1000.0
        })
        .collect();
    ms.sort_by(f64::total_cmp);
    let q = |p: f64| ms[((ms.len() as f64 - 1.0) * p).round() as usize];
    Ok(Latency {
        wake,
        tasks: n,
        interval_ms: interval.as_secs_f64() * 1000.0,
        p50_ms: q(0.50),
        p99_ms: q(0.99),
        max_ms: q(1.0),
    })
}

/// `EXPLAIN` of taskq's claim query, as text rows.
async fn explain_claim(pool: &MySqlPool) -> Res<Vec<String>> {
    // The three reads of taskq's claim: candidates from the head of the queue, candidates
    // past a seek position (here: the first due row), and the locking read by primary key.
    let first: (i16, NaiveDateTime, u64) = sqlx::query_as(
        "SELECT priority, run_at, id FROM taskq_tasks
         WHERE state = 'pending' AND queue = 'bench' AND run_at <= UTC_TIMESTAMP(6)
         ORDER BY priority, run_at, id LIMIT 1",
    )
    .fetch_one(pool)
    .await?;
    let candidates = "SELECT id FROM taskq_tasks
         WHERE state = 'pending' AND queue = 'bench' AND run_at <= UTC_TIMESTAMP(6)
           AND JSON_CONTAINS('[\"bench_noop\"]', JSON_QUOTE(name))";
    let order = "ORDER BY priority, run_at, id LIMIT 32";
    let mut out = Vec::new();
    for (label, sql) in [
        ("candidates, from the head", format!("EXPLAIN {candidates} {order}")),
        (
            "candidates, past a seek position",
            format!(
                "EXPLAIN {candidates} AND (priority > ? OR (priority = ? AND run_at > ?)
                   OR (priority = ? AND run_at = ? AND id > ?)) {order}"
            ),
        ),
        (
            "lock by primary key",
            "EXPLAIN SELECT t.id FROM JSON_TABLE('[1,2,3]', '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$')) AS j
               STRAIGHT_JOIN taskq_tasks t FORCE INDEX (PRIMARY) ON t.id = j.id
             WHERE t.state = 'pending' AND t.run_at <= UTC_TIMESTAMP(6)
             LIMIT 16 FOR UPDATE SKIP LOCKED"
                .to_owned(),
        ),
    ] {
        let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
        if label.contains("seek") {
            q = q
                .bind(first.0)
                .bind(first.0)
                .bind(first.1)
                .bind(first.0)
                .bind(first.1)
                .bind(first.2);
        }
        let rows = q.fetch_all(pool).await?;
        out.push(format!("-- {label}"));
        out.extend(explain_lines(&rows));
    }
    Ok(out)
}

/// `EXPLAIN` rows as a header line and one ` | `-separated line per row.
fn explain_lines(rows: &[sqlx::mysql::MySqlRow]) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(first) = rows.first() {
        use sqlx::Column;
        out.push(
            first
                .columns()
                .iter()
                .map(|c| c.name().to_owned())
                .collect::<Vec<_>>()
                .join(" | "),
        );
    }
    for r in rows {
        let cells: Vec<String> = (0..r.len())
            .map(|i| {
                if let Ok(v) = r.try_get::<Option<String>, _>(i) {
                    v.unwrap_or_else(|| "NULL".into())
                } else if let Ok(v) = r.try_get::<Option<i64>, _>(i) {
                    v.map_or("NULL".into(), |v| v.to_string())
                } else if let Ok(v) = r.try_get::<Option<u64>, _>(i) {
                    v.map_or("NULL".into(), |v| v.to_string())
                } else if let Ok(v) = r.try_get::<Option<Vec<u8>>, _>(i) {
                    v.map_or("NULL".into(), |v| String::from_utf8_lossy(&v).into_owned())
                } else {
                    "?".into()
                }
            })
            .collect();
        out.push(cells.join(" | "));
    }
    out
}

#[derive(serde::Serialize)]
struct MemSample {
    done: u64,
    rss_kib: u64,
}

/// Drains `n` bulk-inserted due tasks at concurrency 16, sampling RSS once a second.
async fn million_drain(pool: &MySqlPool, n: u64) -> Res<(Drain, Vec<MemSample>)> {
    reset(pool).await?;
    bulk_insert(pool, n, 1).await?;
    sqlx::query("ANALYZE TABLE taskq_tasks")
        .execute(pool)
        .await?;
    reset_peak_rss();
    let cpu0 = cpu_secs();
    let before = server_status(pool).await?;
    let start = Instant::now();
    let w = start_worker(pool, 16)?;
    let mut samples = Vec::new();
    let mut next = Instant::now();
    while w.succeeded() < n {
        if Instant::now() >= next {
            samples.push(MemSample {
                done: w.succeeded(),
                rss_kib: vm_kib("VmRSS:"),
            });
            next += Duration::from_secs(1);
        }
        if start.elapsed() > Duration::from_secs(3600) {
            return Err("million drain timed out".into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let secs = start.elapsed().as_secs_f64();
    let cpu = cpu_secs() - cpu0;
    samples.push(MemSample {
        done: w.succeeded(),
        rss_kib: vm_kib("VmRSS:"),
    });
    let report = w.stop().await?;
    let after = server_status(pool).await?;
    let delta = status_delta(&before, &after);
    Ok((Drain::new(16, n, secs, cpu, &report, &delta), samples))
}

// ---------------------------------------------------------------------------------------------
// Unknown names: pending tasks whose name no worker handles, at the head of the queue.

/// Pending tasks of a name no worker knows, put at the head of the queue.
const UNKNOWN: u64 = 10_000;
/// Known tasks drained behind them.
const UNKNOWN_KNOWN: u64 = 10_000;
/// Name of the tasks nobody handles.
const UNKNOWN_TASK: &str = "bench_unknown";
/// Timed repetitions of a single-connection read.
const UNKNOWN_REPS: usize = 200;

/// taskq's candidate read from the head of the queue, as in
/// `taskq/src/backend/mysql/claim_raw.rs` (`claim_by_candidates`), with 32 candidates: what a
/// worker at concurrency 16 reads.
const HEAD_READ: &str = "SELECT id, priority, run_at
     FROM taskq_tasks
     WHERE state = 'pending' AND queue = ? AND run_at <= UTC_TIMESTAMP(6)
       AND JSON_CONTAINS(?, JSON_QUOTE(name))
     ORDER BY priority, run_at, id
     LIMIT ?";

/// taskq's candidate read past a position (`claim_by_candidates` with `after`).
const SEEK_READ: &str = "SELECT id, priority, run_at
     FROM taskq_tasks
     WHERE state = 'pending' AND queue = ? AND run_at <= UTC_TIMESTAMP(6)
       AND (priority > ?
            OR (priority = ? AND run_at > ?)
            OR (priority = ? AND run_at = ? AND id > ?))
       AND JSON_CONTAINS(?, JSON_QUOTE(name))
     ORDER BY priority, run_at, id
     LIMIT ?";

/// Times [`SEEK_READ`] past the 5,000th known task [`UNKNOWN_REPS`] times on `conn`; durations
/// in seconds, and the plan (`EXPLAIN` type and key length).
async fn time_seek_reads(conn: &mut sqlx::MySqlConnection) -> Res<(Vec<f64>, String)> {
    let (p, r, id): (i16, NaiveDateTime, u64) = sqlx::query_as(
        "SELECT priority, run_at, id FROM taskq_tasks WHERE name = ?
         ORDER BY priority, run_at, id LIMIT 1 OFFSET 5000",
    )
    .bind(TASK)
    .fetch_one(&mut *conn)
    .await?;
    let names = format!("[\"{TASK}\"]");
    // The plan of this execution, from `EXPLAIN` of the prepared statement with the same values.
    let plan = sqlx::query(sqlx::AssertSqlSafe(format!("EXPLAIN {SEEK_READ}")))
        .bind(QUEUE)
        .bind(p)
        .bind(p)
        .bind(r)
        .bind(p)
        .bind(r)
        .bind(id)
        .bind(&names)
        .bind(32u32)
        .fetch_one(&mut *conn)
        .await?;
    let plan = format!(
        "{} {}",
        plan.try_get::<String, _>("type").unwrap_or_default(),
        plan.try_get::<String, _>("key_len").unwrap_or_default()
    );
    let mut took = Vec::with_capacity(UNKNOWN_REPS);
    for _ in 0..UNKNOWN_REPS {
        let t = Instant::now();
        let rows = sqlx::query(SEEK_READ)
            .bind(QUEUE)
            .bind(p)
            .bind(p)
            .bind(r)
            .bind(p)
            .bind(r)
            .bind(id)
            .bind(&names)
            .bind(32u32)
            .fetch_all(&mut *conn)
            .await?;
        took.push(t.elapsed().as_secs_f64());
        if rows.len() != 32 {
            return Err(format!("seek read returned {} rows", rows.len()).into());
        }
    }
    Ok((took, plan))
}

/// Claim transaction durations recorded while [`CLAIMS_ON`] is set, in seconds (from the
/// worker's `taskq_claim_duration_seconds` histogram).
static CLAIMS: Mutex<Vec<f64>> = Mutex::new(Vec::new());
static CLAIMS_ON: AtomicBool = AtomicBool::new(false);

/// A `metrics` recorder that keeps `taskq_claim_duration_seconds` and drops everything else.
struct ClaimRecorder;

struct ClaimHistogram;

impl metrics::HistogramFn for ClaimHistogram {
    fn record(&self, value: f64) {
        if CLAIMS_ON.load(Ordering::Relaxed) {
            CLAIMS.lock().unwrap().push(value);
        }
    }
}

impl metrics::Recorder for ClaimRecorder {
    fn describe_counter(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_gauge(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_histogram(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn register_counter(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        metrics::Counter::noop()
    }
    fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::noop()
    }
    fn register_histogram(
        &self,
        key: &metrics::Key,
        _: &metrics::Metadata<'_>,
    ) -> metrics::Histogram {
        if key.name() == "taskq_claim_duration_seconds" {
            metrics::Histogram::from_arc(Arc::new(ClaimHistogram))
        } else {
            metrics::Histogram::noop()
        }
    }
}

/// p50, p99 and max of `v`, in milliseconds (`v` in seconds).
fn percentiles_ms(mut v: Vec<f64>) -> (f64, f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    v.sort_by(f64::total_cmp);
    let q = |p: f64| v[((v.len() as f64 - 1.0) * p).round() as usize] * 1000.0;
    (q(0.50), q(0.99), q(1.0))
}

/// One case of the unknown-names scenario: `unknown` pending tasks of [`UNKNOWN_TASK`] at the
/// head of the queue (or none).
#[derive(Clone, serde::Serialize)]
struct UnknownCase {
    unknown: u64,
    /// The head candidate read with [`UNKNOWN_KNOWN`] known tasks behind the unknown ones, on
    /// one connection (it returns 32 known rows): p50 / p99 / max, ms.
    head_read_ms: (f64, f64, f64),
    /// One head claim that finds nothing (only the unknown tasks are pending): `BEGIN`, the
    /// candidate read, `COMMIT` on one READ COMMITTED connection, as a polling worker does it:
    /// p50 / p99 / max, ms.
    idle_claim_ms: (f64, f64, f64),
    /// Drain of the known tasks by one worker at concurrency 16 (median of 3 by tasks/s).
    drain: Drain,
    /// Claim transactions of that drain (`taskq_claim_duration_seconds`): p50 / p99 / max, ms.
    drain_claim_ms: (f64, f64, f64),
    /// The candidate read past a position (the 5,000th known task), as a worker draining a
    /// backlog issues it, on one connection: p50 / p99 / max, ms.
    seek_read_ms: (f64, f64, f64),
    /// The seek read's plan in each repetition (`EXPLAIN` of the prepared statement: type and
    /// key length): `range 277` seeks on the whole key; `ref 259` walks from the head of the
    /// queue, checking the seek position entry by entry.
    seek_plans: Vec<String>,
    /// InnoDB buffer pool page requests per head candidate read (`Innodb_buffer_pool_read_requests`,
    /// a global counter: median over the repetitions). A row the read steps over costs a
    /// primary-key lookup (a few pages) unless the index covers the read.
    head_read_pages: f64,
    /// Unknown tasks still pending and never attempted after the drains.
    unknown_untouched: u64,
    /// `EXPLAIN` of the head candidate read.
    explain: Vec<String>,
}

/// Inserts `n` (at most 100,000) pending tasks named [`UNKNOWN_TASK`] in the bench queue, due an
/// hour ago: they sort before anything enqueued now.
async fn insert_unknown(pool: &MySqlPool, n: u64) -> Res<()> {
    sqlx::query("CREATE TABLE IF NOT EXISTS bench_digits (d INT PRIMARY KEY)")
        .execute(pool)
        .await?;
    sqlx::query("INSERT IGNORE INTO bench_digits VALUES (0),(1),(2),(3),(4),(5),(6),(7),(8),(9)")
        .execute(pool)
        .await?;
    sqlx::query(
        "INSERT INTO taskq_tasks (queue, name, payload, state, priority, max_attempts, run_at,
             created_at, updated_at)
         SELECT ?, ?, '{}', 'pending', 0, 20, UTC_TIMESTAMP(6) - INTERVAL 1 HOUR,
             UTC_TIMESTAMP(6), UTC_TIMESTAMP(6)
         FROM (SELECT a.d + 10 * b.d + 100 * c.d + 1000 * e.d + 10000 * f.d AS n
               FROM bench_digits a, bench_digits b, bench_digits c, bench_digits e,
                    bench_digits f) s
         WHERE s.n < ?
         ORDER BY s.n",
    )
    .bind(QUEUE)
    .bind(UNKNOWN_TASK)
    .bind(n)
    .execute(pool)
    .await?;
    Ok(())
}

/// The server's `Innodb_buffer_pool_read_requests` (global).
async fn buffer_pool_requests(pool: &MySqlPool) -> Res<i64> {
    let (_, v): (String, String) =
        sqlx::query_as("SHOW GLOBAL STATUS LIKE 'Innodb_buffer_pool_read_requests'")
            .fetch_one(pool)
            .await?;
    Ok(v.parse()?)
}

/// Times [`HEAD_READ`] (for the known name, 32 candidates) [`UNKNOWN_REPS`] times on `conn`,
/// alone or as a whole empty claim (`BEGIN`, the read, `COMMIT`); durations in seconds.
async fn time_head_reads(conn: &mut sqlx::MySqlConnection, in_transaction: bool) -> Res<Vec<f64>> {
    let names = format!("[\"{TASK}\"]");
    let mut took = Vec::with_capacity(UNKNOWN_REPS);
    for _ in 0..UNKNOWN_REPS {
        let t = Instant::now();
        if in_transaction {
            let mut tx = conn.begin().await?;
            sqlx::query(HEAD_READ)
                .bind(QUEUE)
                .bind(&names)
                .bind(32u32)
                .fetch_all(&mut *tx)
                .await?;
            tx.commit().await?;
        } else {
            sqlx::query(HEAD_READ)
                .bind(QUEUE)
                .bind(&names)
                .bind(32u32)
                .fetch_all(&mut *conn)
                .await?;
        }
        took.push(t.elapsed().as_secs_f64());
    }
    Ok(took)
}

/// Everything measured for one case of the unknown-names scenario, over its repetitions.
#[derive(Default)]
struct UnknownRuns {
    idle: Vec<f64>,
    reads: Vec<f64>,
    pages: Vec<f64>,
    seeks: Vec<f64>,
    seek_plans: Vec<String>,
    claims: Vec<f64>,
    drains: Vec<Drain>,
    untouched: Option<u64>,
    explain: Vec<String>,
}

/// One repetition of one case: `unknown` pending tasks no worker knows at the head of the
/// queue (or none). Idle head claims with only those pending, then the head candidate read
/// over [`UNKNOWN_KNOWN`] known tasks behind them, then a drain of the known tasks at
/// concurrency 16; `conn` is a READ COMMITTED connection.
async fn unknown_rep(
    pool: &MySqlPool,
    conn: &mut sqlx::MySqlConnection,
    unknown: u64,
    acc: &mut UnknownRuns,
) -> Res<()> {
    reset(pool).await?;
    insert_unknown(pool, unknown).await?;
    sqlx::query("ANALYZE TABLE taskq_tasks")
        .execute(pool)
        .await?;
    time_head_reads(conn, true).await?; // warm-up
    acc.idle.extend(time_head_reads(conn, true).await?);
    preload(pool, UNKNOWN_KNOWN).await?;
    sqlx::query("ANALYZE TABLE taskq_tasks")
        .execute(pool)
        .await?;
    if acc.explain.is_empty() {
        // As text with the values inlined (what `EXPLAIN` in a client shows): MariaDB 10.11
        // prints the prepared form's plan as `range` without `Using index` even when the
        // read is index-only, which the page requests below show.
        let sql = HEAD_READ
            .replacen('?', &format!("'{QUEUE}'"), 1)
            .replacen('?', &format!("'[\"{TASK}\"]'"), 1)
            .replacen('?', "32", 1);
        let rows = sqlx::raw_sql(sqlx::AssertSqlSafe(format!("EXPLAIN {sql}")))
            .fetch_all(pool)
            .await?;
        acc.explain = explain_lines(&rows);
    }
    let pages0 = buffer_pool_requests(pool).await?;
    acc.reads.extend(time_head_reads(conn, false).await?);
    let pages = buffer_pool_requests(pool).await? - pages0;
    acc.pages.push(pages as f64 / UNKNOWN_REPS as f64);
    let (seeks, plan) = time_seek_reads(conn).await?;
    acc.seeks.extend(seeks);
    acc.seek_plans.push(plan);
    CLAIMS.lock().unwrap().clear();
    CLAIMS_ON.store(true, Ordering::Relaxed);
    let d = drain_once(pool, 16, UNKNOWN_KNOWN, true).await;
    CLAIMS_ON.store(false, Ordering::Relaxed);
    let d = d?;
    let took = std::mem::take(&mut *CLAIMS.lock().unwrap());
    let mut sorted = took.clone();
    sorted.sort_by(f64::total_cmp);
    eprintln!(
        "    claims: total {:.0} ms of {:.0} ms; slowest 40 {:.0} ms; over 5 ms: {}",
        took.iter().sum::<f64>() * 1000.0,
        d.secs * 1000.0,
        sorted.iter().rev().take(40).sum::<f64>() * 1000.0,
        took.iter().filter(|&&t| t > 0.005).count()
    );
    acc.claims.extend(took);
    let left: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM taskq_tasks WHERE name = ? AND state = 'pending' AND attempt = 0",
    )
    .bind(UNKNOWN_TASK)
    .fetch_one(pool)
    .await?;
    acc.untouched = Some(acc.untouched.unwrap_or(u64::MAX).min(left as u64));
    eprintln!(
        "  {unknown:>5} unknown: drain {:.0} tasks/s, {:.3} stmts/task, {} claims, \
         {:.1} index entries read per task",
        d.tasks_per_s,
        d.statements_per_task,
        d.claim_queries,
        d.com_per_task
            .get("Handler_read_next")
            .copied()
            .unwrap_or(0.0)
    );
    acc.drains.push(d);
    Ok(())
}

/// The unknown-names scenario: the same measurements without and with [`UNKNOWN`] unknown
/// tasks at the head of the queue. Returns both cases and a printable summary.
async fn unknown_names(pool: &MySqlPool) -> Res<(Vec<UnknownCase>, String)> {
    // Installed once; it only keeps values while CLAIMS_ON is set.
    let _ = metrics::set_global_recorder(ClaimRecorder);
    let mut conn = pool.acquire().await?;
    sqlx::query("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        .execute(&mut *conn)
        .await?;
    // The two cases alternate, so that drift in the machine's speed falls on both.
    let sizes = [0, UNKNOWN];
    let mut runs: [UnknownRuns; 2] = Default::default();
    for _ in 0..3 {
        for (acc, &unknown) in runs.iter_mut().zip(&sizes) {
            unknown_rep(pool, &mut conn, unknown, acc).await?;
        }
    }
    let cases: Vec<UnknownCase> = runs
        .into_iter()
        .zip(sizes)
        .map(|(r, unknown)| UnknownCase {
            unknown,
            head_read_ms: percentiles_ms(r.reads),
            seek_read_ms: percentiles_ms(r.seeks),
            seek_plans: r.seek_plans,
            idle_claim_ms: percentiles_ms(r.idle),
            drain: median_by_rate(r.drains),
            drain_claim_ms: percentiles_ms(r.claims),
            head_read_pages: {
                let mut p = r.pages;
                p.sort_by(f64::total_cmp);
                p[p.len() / 2]
            },
            unknown_untouched: r.untouched.unwrap_or(0),
            explain: r.explain,
        })
        .collect();
    let ms = |t: (f64, f64, f64)| format!("{:.2} / {:.2} / {:.2}", t.0, t.1, t.2);
    let mut out = format!(
        "\nunknown names: {UNKNOWN} pending tasks no worker knows at the head of the queue, \
         {UNKNOWN_KNOWN} known tasks behind them\n\n\
         | measurement | no unknown tasks | {UNKNOWN} unknown tasks |\n|---|---|---|\n"
    );
    let row = |name: &str, f: &dyn Fn(&UnknownCase) -> String| {
        format!("| {name} | {} | {} |\n", f(&cases[0]), f(&cases[1]))
    };
    out += &row("drain at concurrency 16, tasks/s (median of 3)", &|c| {
        fmt_rate(c.drain.tasks_per_s)
    });
    out += &row("drain: SQL statements per task", &|c| {
        format!("{:.3}", c.drain.statements_per_task)
    });
    out += &row("drain: claim transaction p50 / p99 / max, ms", &|c| {
        ms(c.drain_claim_ms)
    });
    out += &row(
        "head candidate read (32 known rows), p50 / p99 / max, ms",
        &|c| ms(c.head_read_ms),
    );
    out += &row(
        "seek candidate read (past the 5,000th known task), p50 / p99 / max, ms",
        &|c| ms(c.seek_read_ms),
    );
    out += &row("seek candidate read: plan in each repetition", &|c| {
        c.seek_plans.join(", ")
    });
    out += &row("head candidate read: buffer pool page requests", &|c| {
        format!("{:.0}", c.head_read_pages)
    });
    out += &row(
        "idle head claim (finds nothing), p50 / p99 / max, ms",
        &|c| ms(c.idle_claim_ms),
    );
    out += &row("unknown tasks left pending, never attempted", &|c| {
        c.unknown_untouched.to_string()
    });
    out += "\nEXPLAIN of the head candidate read, with the unknown tasks:\n";
    for l in &cases[1].explain {
        out += &format!("    {l}\n");
    }
    Ok((cases, out))
}

// ---------------------------------------------------------------------------------------------
// Report.

fn machine() -> Value {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|x| x.1.trim().to_owned())
        .unwrap_or_default();
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_kib: u64 = meminfo
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    json!({
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "cpu_model": model,
        "mem_gib": (mem_kib as f64 / 1048576.0 * 10.0).round() / 10.0,
        "loadavg_at_start": load.trim(),
    })
}

async fn server_settings(pool: &MySqlPool) -> Res<Value> {
    let version: String = sqlx::query_scalar("SELECT VERSION()")
        .fetch_one(pool)
        .await?;
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SHOW GLOBAL VARIABLES WHERE Variable_name IN ('innodb_flush_log_at_trx_commit',
           'innodb_buffer_pool_size', 'log_bin', 'sync_binlog', 'innodb_autoinc_lock_mode',
           'innodb_log_file_size', 'max_connections', 'transaction_isolation', 'tx_isolation')",
    )
    .fetch_all(pool)
    .await?;
    let mut m = serde_json::Map::new();
    m.insert("version".into(), json!(version));
    for (k, v) in rows {
        m.insert(k, json!(v));
    }
    Ok(Value::Object(m))
}

fn fmt_rate(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.1}k", v / 1000.0)
    } else if v >= 1000.0 {
        format!("{:.2}k", v / 1000.0)
    } else {
        format!("{v:.0}")
    }
}

/// One bar of the chart.
struct Bar {
    label: String,
    value: f64,
    raw: bool,
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Horizontal bar chart: throughput (left) and pickup latency (right).
fn svg(title: &str, bars: &[Bar], lat: &[(String, f64)]) -> String {
    let row = 22.0;
    let left = 250.0;
    let width = 420.0;
    let top = 60.0;
    let h = top + row * bars.len().max(lat.len()) as f64 + 60.0;
    let total_w = left + width + 60.0 + 200.0 + 280.0;
    let max = bars.iter().map(|b| b.value).fold(1.0, f64::max);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{total_w:.0}\" height=\"{h:.0}\" \
         font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"10\" y=\"22\" font-size=\"15\" font-weight=\"bold\">{}</text>\n\
         <text x=\"10\" y=\"42\" fill=\"#555\">tasks/s (or tx/s); grey = hand-written SQL \
         ceiling, blue = taskq</text>\n",
        esc(title)
    );
    for (i, b) in bars.iter().enumerate() {
        let y = top + row * i as f64;
        let w = (b.value / max * width).max(1.0);
        let color = if b.raw { "#9e9e9e" } else { "#1f77b4" };
        s += &format!(
            "<text x=\"{:.0}\" y=\"{:.0}\" text-anchor=\"end\">{}</text>\
             <rect x=\"{left:.0}\" y=\"{:.0}\" width=\"{w:.1}\" height=\"{:.0}\" fill=\"{color}\"/>\
             <text x=\"{:.1}\" y=\"{:.0}\">{}</text>\n",
            left - 8.0,
            y + 15.0,
            esc(&b.label),
            y + 3.0,
            row - 6.0,
            left + w + 4.0,
            y + 15.0,
            fmt_rate(b.value)
        );
    }
    // Latency panel.
    let lx = left + width + 60.0 + 200.0;
    let lw = 220.0;
    let lmax = lat.iter().map(|l| l.1).fold(1.0, f64::max);
    s += &format!(
        "<text x=\"{:.0}\" y=\"42\" fill=\"#555\">enqueue-commit → handler-start, ms</text>\n",
        lx - 190.0
    );
    for (i, (label, v)) in lat.iter().enumerate() {
        let y = top + row * i as f64;
        let w = (v / lmax * lw).max(1.0);
        s += &format!(
            "<text x=\"{:.0}\" y=\"{:.0}\" text-anchor=\"end\">{}</text>\
             <rect x=\"{lx:.0}\" y=\"{:.0}\" width=\"{w:.1}\" height=\"{:.0}\" fill=\"#ff7f0e\"/>\
             <text x=\"{:.1}\" y=\"{:.0}\">{v:.1}</text>\n",
            lx - 8.0,
            y + 15.0,
            esc(label),
            y + 3.0,
            row - 6.0,
            lx + w + 4.0,
            y + 15.0,
        );
    }
    s += "</svg>\n";
    s
}

fn median_by_rate(mut runs: Vec<Drain>) -> Drain {
    runs.sort_by(|a, b| a.tasks_per_s.total_cmp(&b.tasks_per_s));
    runs[runs.len() / 2].clone()
}

/// `--targets-only`: the two measurements whose ratio targets are tight at 16 connections,
/// printed and not written anywhere. A tuning aid; the full run is the measurement.
async fn targets_only(sz: &Sizes, pool: &MySqlPool) -> Res<()> {
    for c in [1, 16] {
        let (raw, tq) = insert_rates(pool, c, sz.insert_secs).await?;
        eprintln!(
            "{c} conns: raw INSERT+COMMIT {raw:.0} tx/s, enqueue_tx {tq:.0} tx/s, ratio {:.3}",
            tq / raw
        );
    }
    let raw_loop = raw_claim_loop(pool, 16, sz.drain, 32, ClaimShape::LockingScan).await?;
    let raw_two = raw_claim_loop(pool, 16, sz.drain, 32, ClaimShape::TwoStep).await?;
    eprintln!("raw loop, two-step claim, 16 conns: {raw_two:.0} rows/s");
    let mut runs = Vec::new();
    for _ in 0..sz.reps {
        let d = drain_once(pool, 16, sz.drain, false).await?;
        eprintln!(
            "  drain c=16: {:.0} tasks/s, {:.3} stmts/task, {} claims, {} flushes",
            d.tasks_per_s, d.statements_per_task, d.claim_queries, d.ack_flushes
        );
        runs.push(d);
    }
    let d = median_by_rate(runs);
    eprintln!(
        "raw loop 16 conns {raw_loop:.0} rows/s, drain c=16 median {:.0} tasks/s, ratio {:.3}",
        d.tasks_per_s,
        d.tasks_per_s / raw_loop
    );
    let fleet = drain_fleet(pool, 4, 4, sz.drain).await?;
    eprintln!(
        "4 workers x concurrency 4: {:.0} tasks/s, {:.3} stmts/task, {:.1} tasks per claim",
        fleet.tasks_per_s, fleet.statements_per_task, fleet.tasks_per_claim
    );
    Ok(())
}

/// Drains at concurrency 16 of the bench queue without a limit, with a concurrency limit of
/// 1000 (the limited claim path, never binding) and with a limit of 8 (binding), interleaved
/// `reps` times; prints each and the medians.
async fn limits_only(sz: &Sizes, pool: &MySqlPool) -> Res<()> {
    let client = taskq::Client::new(pool.clone());
    let cases: [(&str, Option<u32>); 3] = [
        ("unlimited", None),
        ("limit 1000", Some(1000)),
        ("limit 8", Some(8)),
    ];
    let mut results: Vec<Vec<Drain>> = cases.iter().map(|_| Vec::new()).collect();
    for _ in 0..sz.reps {
        for (i, (label, limit)) in cases.iter().enumerate() {
            client.set_queue_limit(QUEUE, *limit).await?;
            let d = drain_once(pool, 16, sz.drain, false).await?;
            eprintln!(
                "  {label:>10}: {:.0} tasks/s, {:.3} stmts/task, {} claims",
                d.tasks_per_s, d.statements_per_task, d.claim_queries
            );
            results[i].push(d);
        }
    }
    client.set_queue_limit(QUEUE, None).await?;
    for ((label, _), runs) in cases.iter().zip(results) {
        let d = median_by_rate(runs);
        println!(
            "drain c=16, {label}: median {:.0} tasks/s, {:.3} stmts/task",
            d.tasks_per_s, d.statements_per_task
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------

fn main() -> Res<()> {
    let opts = parse_args()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(run(opts))
}

async fn run(opts: Opts) -> Res<()> {
    if let Some(file) = &opts.sqlite {
        let sz = Sizes::new(opts.quick);
        let out = opts.out.as_deref().unwrap_or("target/bench-sqlite.json");
        return sqlite::run(&sz, file, out, opts.keep_db).await;
    }
    let server = MySqlConnectOptions::from_str(&opts.url)?
        .database("")
        .disable_statement_logging();
    let db = format!("taskq_bench_{:08x}", std::process::id() ^ 0x5eed_0000);
    let mut admin = server.connect().await?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE `{db}`")))
        .execute(&mut admin)
        .await?;
    // A fleet run counts the server's connections: the bench itself keeps to one.
    let pool = MySqlPoolOptions::new()
        .max_connections(if opts.fleet.is_empty() { 40 } else { 1 })
        .connect_with(server.clone().database(&db))
        .await?;
    let result = bench(&opts, &pool).await;
    pool.close().await;
    if opts.keep_db {
        eprintln!("kept database {db}");
        return result;
    }
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP DATABASE `{db}`")))
        .execute(&mut admin)
        .await?;
    result
}

async fn bench(opts: &Opts, pool: &MySqlPool) -> Res<()> {
    taskq::migrate(pool).await?;
    let sz = Sizes::new(opts.quick);
    if opts.targets_only {
        return targets_only(&sz, pool).await;
    }
    if let Some(d) = &opts.dashboard {
        eprintln!("machine: {}", machine());
        return dashboard::run(pool, d).await;
    }
    if opts.unknown_only {
        let (_, out) = unknown_names(pool).await?;
        println!("{out}");
        return Ok(());
    }
    if opts.limits_only {
        return limits_only(&sz, pool).await;
    }
    if !opts.fleet.is_empty() {
        eprintln!("machine: {}", machine());
        eprintln!("server: {}", server_settings(pool).await?);
        for &(workers, concurrency) in &opts.fleet {
            let f = fleet_peak(
                pool,
                workers,
                concurrency,
                opts.fleet_tasks,
                opts.fleet_shared_pool,
            )
            .await?;
            println!(
                "fleet {workers} x {concurrency} ({}): {} tasks in {:.1} s, {} tasks/s, {:.2} statements/task, \
                 peak {} server connections (Max_used_connections; {} of them the bench's own \
                 before the fleet started: {:.2} per worker), db errors {}",
                if opts.fleet_shared_pool {
                    "one shared pool"
                } else {
                    "a pool each"
                },
                f.tasks,
                f.secs,
                fmt_rate(f.tasks_per_s),
                f.statements_per_task,
                f.peak_connections,
                f.baseline_connections,
                (f.peak_connections - f.baseline_connections) as f64 / workers as f64,
                f.db_errors
            );
        }
        return Ok(());
    }
    let conns = [1usize, 4, 16];
    let machine = machine();
    let settings = server_settings(pool).await?;
    eprintln!("machine: {machine}\nserver: {settings}");

    eprintln!("[1/8] raw INSERT+COMMIT and enqueue_tx");
    let mut raw_insert = Vec::new();
    let mut enqueue_tx = Vec::new();
    for &c in &conns {
        let (raw, tq) = insert_rates(pool, c, sz.insert_secs).await?;
        raw_insert.push(raw);
        enqueue_tx.push(tq);
        eprintln!(
            "  {c:>2} conns: raw {:.0} tx/s, enqueue_tx {:.0} tx/s",
            raw_insert.last().unwrap(),
            enqueue_tx.last().unwrap()
        );
    }

    eprintln!("[2/8] enqueue_many");
    let many_5000 = enqueue_many_rate(pool, sz.many, 5000).await?;
    let many_1000 = enqueue_many_rate(pool, sz.many, 1000).await?;
    let many_100 = enqueue_many_rate(pool, sz.many / 5, 100).await?;
    eprintln!("  5000/tx: {many_5000:.0}, 1000/tx: {many_1000:.0}, 100/tx: {many_100:.0} tasks/s");

    eprintln!("[3/8] raw batched SKIP LOCKED loops (32 rows per claim)");
    let mut raw_loop = Vec::new();
    let mut raw_two = Vec::new();
    for &c in &conns {
        raw_loop.push(raw_claim_loop(pool, c, sz.drain, 32, ClaimShape::LockingScan).await?);
        raw_two.push(raw_claim_loop(pool, c, sz.drain, 32, ClaimShape::TwoStep).await?);
        eprintln!(
            "  {c:>2} conns: locking scan {:.0} rows/s, two-step {:.0} rows/s",
            raw_loop.last().unwrap(),
            raw_two.last().unwrap()
        );
    }

    eprintln!("[4/8] drain {} tasks, median of {}", sz.drain, sz.reps);
    let mut drains = Vec::new();
    for c in [1usize, 4, 16, 32] {
        let mut runs = Vec::new();
        for _ in 0..sz.reps {
            let d = drain_once(pool, c, sz.drain, false).await?;
            eprintln!(
                "  c={c:>2}: {:.0} tasks/s, {:.3} stmts/task, {:.3} ms CPU/task, peak RSS {} MiB",
                d.tasks_per_s,
                d.statements_per_task,
                d.cpu_ms_per_task,
                d.peak_rss_kib / 1024
            );
            runs.push(d);
        }
        drains.push(median_by_rate(runs));
    }
    let fleet = drain_fleet(pool, 4, 4, sz.drain).await?;
    eprintln!(
        "  4 workers x concurrency 4: {:.0} tasks/s, {:.3} stmts/task, {:.1} tasks per claim",
        fleet.tasks_per_s, fleet.statements_per_task, fleet.tasks_per_claim
    );

    eprintln!("[5/8] pickup latency");
    let interval = Duration::from_millis(10);
    let lat_wake = latency(pool, true, sz.latency_tasks, interval).await?;
    let lat_poll = latency(pool, false, sz.latency_tasks, interval).await?;
    let lat_sparse = latency(
        pool,
        false,
        sz.latency_tasks / 5,
        Duration::from_millis(200),
    )
    .await?;
    for l in [&lat_wake, &lat_poll, &lat_sparse] {
        eprintln!(
            "  wake={} every {} ms: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            l.wake, l.interval_ms, l.p50_ms, l.p99_ms, l.max_ms
        );
    }

    eprintln!("[6/8] backlog: {} pending, 1% due", sz.backlog);
    reset(pool).await?;
    let t = Instant::now();
    bulk_insert(pool, sz.backlog, 100).await?;
    let backlog_insert_s = t.elapsed().as_secs_f64();
    sqlx::query("ANALYZE TABLE taskq_tasks")
        .execute(pool)
        .await?;
    let explain = explain_claim(pool).await?;
    for l in &explain {
        eprintln!("  {l}");
    }
    let due = sz.backlog / 100;
    let backlog = drain_once(pool, 16, due, true).await?;
    eprintln!(
        "  due drain: {:.0} tasks/s, {:.3} stmts/task (bulk insert took {backlog_insert_s:.1} s)",
        backlog.tasks_per_s, backlog.statements_per_task
    );

    let million = if opts.million {
        eprintln!("[7/8] memory over a {}-task drain", sz.million);
        let (d, samples) = million_drain(pool, sz.million).await?;
        eprintln!(
            "  {:.0} tasks/s, {:.3} stmts/task, RSS samples: {}",
            d.tasks_per_s,
            d.statements_per_task,
            samples.len()
        );
        Some((d, samples))
    } else {
        eprintln!("[7/8] memory drain skipped (--skip-million)");
        None
    };

    eprintln!("[8/8] unknown names: {UNKNOWN} pending tasks no worker knows at the head");
    let (unknown, unknown_out) = unknown_names(pool).await?;

    // ---- table
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
    let mut out = String::new();
    out += "\n| measurement | 1 conn | 4 conns | 16 conns | 32 |\n|---|---|---|---|---|\n";
    let line = |name: &str, v: &[f64]| {
        let mut s = format!("| {name} |");
        for i in 0..4 {
            s += &match v.get(i) {
                Some(x) => format!(" {} |", fmt_rate(*x)),
                None => " — |".into(),
            };
        }
        s + "\n"
    };
    out += &line("raw INSERT+COMMIT, tx/s", &raw_insert);
    out += &line("taskq enqueue_tx + COMMIT, tx/s", &enqueue_tx);
    out += &format!(
        "| enqueue_tx / raw | {:.2} | {:.2} | {:.2} | — |\n",
        ratio(enqueue_tx[0], raw_insert[0]),
        ratio(enqueue_tx[1], raw_insert[1]),
        ratio(enqueue_tx[2], raw_insert[2])
    );
    out += &line("raw batched SKIP LOCKED loop (32/claim), rows/s", &raw_loop);
    out += &line(
        "raw batched loop, taskq's two-step claim (32/claim), rows/s",
        &raw_two,
    );
    let drain_rates: Vec<f64> = drains.iter().map(|d| d.tasks_per_s).collect();
    out += &line("taskq drain (concurrency 1/4/16/32), tasks/s", &drain_rates);
    out += &format!(
        "| drain / raw batched loop (same conc.) | {:.2} | {:.2} | {:.2} | — |\n",
        ratio(drain_rates[0], raw_loop[0]),
        ratio(drain_rates[1], raw_loop[1]),
        ratio(drain_rates[2], raw_loop[2])
    );
    out += &format!(
        "| drain / raw two-step loop (same conc.) | {:.2} | {:.2} | {:.2} | — |\n",
        ratio(drain_rates[0], raw_two[0]),
        ratio(drain_rates[1], raw_two[1]),
        ratio(drain_rates[2], raw_two[2])
    );
    // One row per drain figure: the concurrency levels side by side.
    let drain_row = |name: &str, cell: &dyn Fn(&Drain) -> String| {
        let cells: Vec<String> = drains.iter().map(cell).collect();
        format!("| {name} | {} |\n", cells.join(" | "))
    };
    out += &drain_row("drain: SQL statements per task", &|d| {
        format!("{:.3}", d.statements_per_task)
    });
    out += &drain_row("drain: CPU ms per task (bench process)", &|d| {
        format!("{:.3}", d.cpu_ms_per_task)
    });
    out += &drain_row("drain: peak RSS, MiB", &|d| {
        format!("{:.1}", d.peak_rss_kib as f64 / 1024.0)
    });
    out += &format!(
        "\nfleet: {} workers at concurrency {} on one queue: {} tasks/s, {:.3} statements/task, \
         {:.1} tasks per claim\n",
        fleet.workers,
        fleet.concurrency,
        fmt_rate(fleet.tasks_per_s),
        fleet.statements_per_task,
        fleet.tasks_per_claim
    );
    out += &format!(
        "enqueue_many: {} tasks/s (5,000 per transaction), {} tasks/s (1,000 per transaction), \
         {} tasks/s (100 per transaction)\n",
        fmt_rate(many_5000),
        fmt_rate(many_1000),
        fmt_rate(many_100)
    );
    out += &format!(
        "pickup latency, one task every {} ms: wake-up p50 {:.2} ms / p99 {:.2} ms; \
         polling p50 {:.2} ms / p99 {:.2} ms; polling at one task every {} ms: \
         p50 {:.2} ms / p99 {:.2} ms (ceiling 1000 ms)\n",
        lat_wake.interval_ms,
        lat_wake.p50_ms,
        lat_wake.p99_ms,
        lat_poll.p50_ms,
        lat_poll.p99_ms,
        lat_sparse.interval_ms,
        lat_sparse.p50_ms,
        lat_sparse.p99_ms
    );
    out += &format!(
        "backlog {} pending, 1% due: due drain {} tasks/s at concurrency 16, {:.3} statements/task\n",
        sz.backlog,
        fmt_rate(backlog.tasks_per_s),
        backlog.statements_per_task
    );
    let mut mem_json = Value::Null;
    if let Some((d, samples)) = &million {
        let n = samples.len();
        let early = samples
            .iter()
            .find(|s| s.done >= d.tasks / 10)
            .map_or(0, |s| s.rss_kib);
        let late_max = samples[n / 2..]
            .iter()
            .map(|s| s.rss_kib)
            .max()
            .unwrap_or(0);
        let first_half_max = samples[..n / 2]
            .iter()
            .map(|s| s.rss_kib)
            .max()
            .unwrap_or(0);
        out += &format!(
            "{}-task drain at concurrency 16: {} tasks/s, {:.3} statements/task; RSS at 10%: {:.1} MiB, \
             max of first half {:.1} MiB, max of second half {:.1} MiB, end {:.1} MiB\n",
            d.tasks,
            fmt_rate(d.tasks_per_s),
            d.statements_per_task,
            early as f64 / 1024.0,
            first_half_max as f64 / 1024.0,
            late_max as f64 / 1024.0,
            samples.last().map_or(0, |s| s.rss_kib) as f64 / 1024.0
        );
        mem_json = json!({ "drain": d, "rss_samples": samples,
            "rss_at_10pct_kib": early, "first_half_max_kib": first_half_max,
            "second_half_max_kib": late_max });
    }
    out += &unknown_out;
    out += "\nclaim EXPLAIN (backlog):\n";
    for l in &explain {
        out += &format!("    {l}\n");
    }
    // Targets.
    let t_drain = ratio(drains[2].tasks_per_s, raw_loop[2]);
    out += "\ntargets:\n";
    let mut check = |ok: bool, what: String| {
        out += &format!("  [{}] {what}\n", if ok { "met" } else { "MISSED" });
    };
    check(
        t_drain >= 0.5,
        format!("drain at concurrency 16 >= 50% of the raw batched loop at 16: {t_drain:.2}"),
    );
    check(
        drains[2].statements_per_task <= 0.5,
        format!(
            "statements per task at concurrency 16 <= 0.5: {:.3}",
            drains[2].statements_per_task
        ),
    );
    for i in 0..3 {
        let r = ratio(enqueue_tx[i], raw_insert[i]);
        check(
            r >= 0.9,
            format!(
                "enqueue_tx overhead <= 10% at {} conns: {:.1}%",
                conns[i],
                (1.0 - r) * 100.0
            ),
        );
    }
    check(
        many_5000.max(many_1000) >= 20_000.0,
        format!(
            "enqueue_many >= 20k tasks/s: {} (5,000/tx), {} (1,000/tx)",
            fmt_rate(many_5000),
            fmt_rate(many_1000)
        ),
    );
    check(
        lat_wake.p50_ms <= 5.0,
        format!("in-process pickup p50 <= 5 ms: {:.2} ms", lat_wake.p50_ms),
    );
    check(
        lat_poll.p99_ms <= 1000.0 && lat_sparse.p99_ms <= 1000.0,
        format!(
            "polled pickup p99 <= poll ceiling (1 s): {:.1} / {:.1} ms",
            lat_poll.p99_ms, lat_sparse.p99_ms
        ),
    );
    if let Some((_, samples)) = &million {
        let n = samples.len();
        let a = samples[..n / 2]
            .iter()
            .map(|s| s.rss_kib)
            .max()
            .unwrap_or(0);
        let b = samples[n / 2..]
            .iter()
            .map(|s| s.rss_kib)
            .max()
            .unwrap_or(0);
        check(
            b as f64 <= a as f64 * 1.10 + 2048.0,
            format!(
                "memory flat over the long drain (second-half max {:.1} MiB vs first-half max {:.1} MiB)",
                b as f64 / 1024.0,
                a as f64 / 1024.0
            ),
        );
    }
    println!("{out}");

    // ---- JSON and chart
    let report = json!({
        "quick": opts.quick,
        "machine": machine,
        "server": settings,
        "raw_insert_commit_tx_per_s": { "1": raw_insert[0], "4": raw_insert[1], "16": raw_insert[2] },
        "enqueue_tx_per_s": { "1": enqueue_tx[0], "4": enqueue_tx[1], "16": enqueue_tx[2] },
        "enqueue_many_tasks_per_s": { "5000_per_tx": many_5000, "1000_per_tx": many_1000, "100_per_tx": many_100 },
        "raw_batched_loop_rows_per_s": { "1": raw_loop[0], "4": raw_loop[1], "16": raw_loop[2] },
        "raw_two_step_loop_rows_per_s": { "1": raw_two[0], "4": raw_two[1], "16": raw_two[2] },
        "drain": drains,
        "fleet_drain": fleet,
        "latency": [lat_wake, lat_poll, lat_sparse],
        "backlog": { "pending": sz.backlog, "due": due, "insert_secs": backlog_insert_s,
                     "drain": backlog, "explain": explain },
        "memory": mem_json,
        "unknown_names": unknown,
        "summary": out,
    });
    let out_file = opts.out.as_deref().unwrap_or("target/bench.json");
    if let Some(dir) = std::path::Path::new(out_file).parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(out_file, serde_json::to_string_pretty(&report)?)?;
    let mut bars = Vec::new();
    for (i, c) in conns.iter().enumerate() {
        bars.push(Bar {
            label: format!("raw INSERT+COMMIT, {c} conn"),
            value: raw_insert[i],
            raw: true,
        });
        bars.push(Bar {
            label: format!("enqueue_tx, {c} conn"),
            value: enqueue_tx[i],
            raw: false,
        });
    }
    bars.push(Bar {
        label: "enqueue_many (5,000/tx)".into(),
        value: many_5000,
        raw: false,
    });
    bars.push(Bar {
        label: "enqueue_many (1,000/tx)".into(),
        value: many_1000,
        raw: false,
    });
    for (i, c) in conns.iter().enumerate() {
        bars.push(Bar {
            label: format!("raw batched claim loop, {c} conn"),
            value: raw_loop[i],
            raw: true,
        });
        bars.push(Bar {
            label: format!("raw two-step claim loop, {c} conn"),
            value: raw_two[i],
            raw: true,
        });
        bars.push(Bar {
            label: format!("taskq drain, concurrency {c}"),
            value: drains[i].tasks_per_s,
            raw: false,
        });
    }
    bars.push(Bar {
        label: "taskq drain, concurrency 32".into(),
        value: drains[3].tasks_per_s,
        raw: false,
    });
    bars.push(Bar {
        label: "drain of 1% due in backlog, c=16".into(),
        value: backlog.tasks_per_s,
        raw: false,
    });
    let lat = vec![
        ("wake-up p50".to_owned(), lat_wake.p50_ms),
        ("wake-up p99".to_owned(), lat_wake.p99_ms),
        (
            format!("polling p50 ({} ms gap)", lat_poll.interval_ms),
            lat_poll.p50_ms,
        ),
        (
            format!("polling p99 ({} ms gap)", lat_poll.interval_ms),
            lat_poll.p99_ms,
        ),
        (
            format!("polling p50 ({} ms gap)", lat_sparse.interval_ms),
            lat_sparse.p50_ms,
        ),
        (
            format!("polling p99 ({} ms gap)", lat_sparse.interval_ms),
            lat_sparse.p99_ms,
        ),
    ];
    let title = format!(
        "taskq benchmark{} — {} CPUs, {}",
        if opts.quick { " (--quick)" } else { "" },
        report["machine"]["cpus"],
        report["server"]["version"].as_str().unwrap_or("?")
    );
    if let Some(dir) = std::path::Path::new(&opts.svg).parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&opts.svg, svg(&title, &bars, &lat))?;
    eprintln!("wrote {out_file} and {}", opts.svg);
    Ok(())
}
