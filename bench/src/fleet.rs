//! Fleets: several workers draining one queue, and (`--fleet`) the server's peak connection
//! count under them.

use std::time::{Duration, Instant};

use sqlx::MySqlPool;
use sqlx::mysql::MySqlPoolOptions;

use crate::Res;
use crate::args::Opts;
use crate::counters::{server_status, status_delta};
use crate::report::{fmt_rate, machine, server_settings};
use crate::scratch::{preload, reset};
use crate::task::{Running, noop, start_worker};

/// A fleet draining one queue: `workers` workers at `concurrency` each, started together.
#[derive(serde::Serialize)]
pub struct FleetDrain {
    pub workers: usize,
    pub concurrency: usize,
    pub tasks: u64,
    pub tasks_per_s: f64,
    pub statements_per_task: f64,
    pub claim_queries: u64,
    /// Tasks per claim transaction: low when claimers keep getting in each other's way.
    pub tasks_per_claim: f64,
}

pub async fn drain_fleet(
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
    /// Statements per second of the whole fleet while idle (the queue empty), over
    /// [`IDLE_WINDOW`] once the claim loops have backed off.
    idle_statements_per_s: f64,
    /// Milliseconds from a task's commit (by the bench's own pool, with no in-process wake) to
    /// its handler's end, for each of [`PICKUP_PROBES`] tasks enqueued into the idle fleet.
    pickup_ms: Vec<f64>,
    /// The statements of the drain (per task) and of the idle window (per second), by
    /// statement, when `TASKQ_BENCH_GENERAL_LOG` is set (see [`general_log_dir`]).
    drain_digests: Vec<(String, f64)>,
    idle_digests: Vec<(String, f64)>,
}

/// How long the idle fleet's statements are counted.
const IDLE_WINDOW: Duration = Duration::from_secs(20);
/// Tasks enqueued one at a time into the idle fleet to time its pickup.
const PICKUP_PROBES: usize = 5;

/// Where the fleet's statements are logged for a breakdown by statement, when
/// `TASKQ_BENCH_GENERAL_LOG` names a directory the server can write to (the server's general
/// log is switched on for the drain and for the idle window, into `drain.log` and
/// `idle.log` there): a profiling aid for a private server, off by default.
fn general_log_dir() -> Option<String> {
    std::env::var("TASKQ_BENCH_GENERAL_LOG")
        .ok()
        .filter(|d| !d.is_empty())
}

/// Starts the server's general log into `dir/file` (emptied first).
async fn log_start(pool: &MySqlPool, dir: &str, file: &str) -> Res<String> {
    let path = format!("{dir}/{file}");
    let _ = std::fs::remove_file(&path);
    sqlx::query("SET GLOBAL general_log_file = ?")
        .bind(&path)
        .execute(pool)
        .await?;
    sqlx::query("SET GLOBAL general_log = ON")
        .execute(pool)
        .await?;
    Ok(path)
}

/// Stops the general log and counts what it holds by command and statement (numbers and
/// quoted strings folded), each count divided by `per`, most frequent first; the bench's own
/// statements left out.
async fn log_stop(pool: &MySqlPool, path: &str, per: f64) -> Res<Vec<(String, f64)>> {
    sqlx::query("SET GLOBAL general_log = OFF")
        .execute(pool)
        .await?;
    let text = std::fs::read_to_string(path)?;
    let mut counts: std::collections::HashMap<String, u64> = Default::default();
    let mut current: Option<String> = None;
    let flush = |stmt: Option<String>, counts: &mut std::collections::HashMap<String, u64>| {
        if let Some(stmt) = stmt {
            let own = stmt.contains("GLOBAL STATUS")
                || stmt.contains("general_log")
                || stmt.contains("Max_used_connections");
            if !own {
                *counts.entry(fold(&stmt)).or_insert(0) += 1;
            }
        }
    };
    for line in text.lines() {
        // A new entry: `YYMMDD HH:MM:SS\t` or `\t\t`, then `<spaces><thread id> <Command>`,
        // then `\t<argument>`; other lines go on the entry before.
        let rest = match line.strip_prefix("\t\t") {
            Some(r) => Some(r),
            None if line.starts_with(|c: char| c.is_ascii_digit()) => {
                line.split_once('\t').map(|x| x.1)
            }
            None => None,
        };
        let entry = rest.and_then(|r| {
            let (head, arg) = r.split_once('\t').unwrap_or((r, ""));
            let (id, command) = head.trim_start().split_once(' ')?;
            (!id.is_empty() && id.chars().all(|c| c.is_ascii_digit()))
                .then(|| (command.trim().to_owned(), arg))
        });
        match entry {
            Some((command, arg)) => {
                flush(current.take(), &mut counts);
                current = Some(format!("{command}: {arg}"));
            }
            None => {
                if let Some(c) = current.as_mut() {
                    c.push(' ');
                    c.push_str(line.trim());
                }
            }
        }
    }
    flush(current.take(), &mut counts);
    let mut out: Vec<(String, f64)> = counts
        .into_iter()
        .map(|(k, n)| (k, n as f64 / per))
        .collect();
    out.sort_by(|a, b| b.1.total_cmp(&a.1));
    Ok(out)
}

/// A statement with its numbers and quoted strings folded, whitespace collapsed, cut short.
fn fold(stmt: &str) -> String {
    let mut out = String::new();
    let mut chars = stmt.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\'' || c == '"' {
            for d in chars.by_ref() {
                if d == c {
                    break;
                }
            }
            out.push('?');
        } else if c.is_ascii_digit() {
            while chars
                .peek()
                .is_some_and(|d| d.is_ascii_digit() || *d == '.')
            {
                chars.next();
            }
            out.push('N');
        } else if c.is_whitespace() {
            if !out.ends_with(' ') {
                out.push(' ');
            }
        } else {
            out.push(c);
        }
    }
    out.chars().take(150).collect()
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
    let log_dir = general_log_dir();
    let drain_log = match &log_dir {
        Some(d) => Some(log_start(pool, d, "drain.log").await?),
        None => None,
    };
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
    let after = server_status(pool).await?;
    let drain_digests = match &drain_log {
        Some(path) => log_stop(pool, path, n as f64).await?,
        None => Vec::new(),
    };
    let (_, peak): (String, String) =
        sqlx::query_as("SHOW GLOBAL STATUS LIKE 'Max_used_connections'")
            .fetch_one(pool)
            .await?;
    let d = status_delta(&before, &after);
    // Idle: wait for the claim loops to back off to `poll_max` (and the heartbeats and reapers
    // of the drain to pass), then count the fleet's statements over the window.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let idle_log = match &log_dir {
        Some(d) => Some(log_start(pool, d, "idle.log").await?),
        None => None,
    };
    let idle_before = server_status(pool).await?;
    let idle_start = Instant::now();
    tokio::time::sleep(IDLE_WINDOW).await;
    let idle_after = server_status(pool).await?;
    let idle_secs = idle_start.elapsed().as_secs_f64();
    let idle_digests = match &idle_log {
        Some(path) => log_stop(pool, path, idle_secs).await?,
        None => Vec::new(),
    };
    // The bench's own two status reads are in the window: left out.
    let idle_statements = status_delta(&idle_before, &idle_after)
        .get("Questions")
        .copied()
        .unwrap_or(0)
        - 1;
    // Pickup: one task at a time, committed by the bench's pool (no in-process wake-up, as
    // from another process), at a random point of the idle fleet's poll cycle.
    let mut pickup_ms = Vec::with_capacity(PICKUP_PROBES);
    for i in 0..PICKUP_PROBES {
        let wait_ms = 1_000 + (i as u64 * 377) % 1_000;
        tokio::time::sleep(Duration::from_millis(wait_ms)).await;
        let done_before: u64 = fleet.iter().map(Running::succeeded).sum();
        let mut tx = pool.begin().await?;
        taskq::enqueue::enqueue_many(&mut tx, std::iter::once(noop(n + i as u64))).await?;
        tx.commit().await?;
        let committed = Instant::now();
        while fleet.iter().map(Running::succeeded).sum::<u64>() == done_before {
            if committed.elapsed() > Duration::from_secs(60) {
                return Err("an idle fleet did not pick up a task in 60 s".into());
            }
            tokio::time::sleep(Duration::from_micros(500)).await;
        }
        pickup_ms.push(committed.elapsed().as_secs_f64() * 1e3);
    }
    let mut db_errors = 0;
    for w in fleet {
        db_errors += w.stop().await?.stats.db_errors;
    }
    Ok(FleetPeak {
        tasks: n,
        secs,
        tasks_per_s: n as f64 / secs,
        statements_per_task: d.get("Questions").copied().unwrap_or(0) as f64 / n as f64,
        peak_connections: peak.parse()?,
        baseline_connections: baseline.parse()?,
        db_errors,
        idle_statements_per_s: idle_statements as f64 / idle_secs,
        pickup_ms,
        drain_digests,
        idle_digests,
    })
}

/// `--fleet`: each fleet of [`fleet_peak`], printed.
pub async fn fleet_only(opts: &Opts, pool: &MySqlPool) -> Res<()> {
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
        let mut sorted = f.pickup_ms.clone();
        sorted.sort_by(f64::total_cmp);
        println!(
            "fleet {workers} x {concurrency} idle: {:.1} statements/s in all ({:.2} per worker) over {:.0} s; \
             pickup of a task enqueued elsewhere: {} ms (sorted)",
            f.idle_statements_per_s,
            f.idle_statements_per_s / workers as f64,
            IDLE_WINDOW.as_secs_f64(),
            sorted
                .iter()
                .map(|ms| format!("{ms:.0}"))
                .collect::<Vec<_>>()
                .join(" / ")
        );
        for (what, list) in [
            ("drain, per task", &f.drain_digests),
            ("idle, per second", &f.idle_digests),
        ] {
            if list.is_empty() {
                continue;
            }
            println!("  statements by kind ({what}; the general log, pings included):");
            for (text, n) in list.iter().take(24) {
                println!("    {n:8.3}  {text}");
            }
        }
    }
    Ok(())
}
