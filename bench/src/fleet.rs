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
use crate::task::{Running, start_worker};

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
    }
    Ok(())
}
