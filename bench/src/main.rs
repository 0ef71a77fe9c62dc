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
//! cargo run --release -p taskq-bench -- --database-url mysql://… --ordered [--quick]
//! cargo run --release -p taskq-bench -- --database-url mysql://… --workflows [--quick]
//! cargo run --release -p taskq-bench -- --database-url mysql://… --outbox [--outbox-events N]
//!     [--outbox-brokers nats,rabbitmq,redis] [--quick]
//! ```
//!
//! It creates a scratch database (`taskq_bench_<random>`), runs every measurement in it and
//! drops it. Statement counts come from the server's global `Questions` / `Com_*` counters,
//! so nothing else should use the server meanwhile. `--sqlite` needs no server: it measures
//! taskq against hand-written SQL on an SQLite file (see `sqlite.rs`).
//!
//! Modules: `args` (options and run sizes), `task` (the no-op task and its worker), `scratch`
//! (emptying and filling the task table), `counters` (the process's CPU and memory, the
//! server's statement counters); one per measurement: `enqueue` (hand-written INSERT vs
//! `enqueue_tx`, `enqueue_many`), `raw_claim` (the hand-written claim loops), `drain`,
//! `fleet`, `latency`, `explain`, `unknown` (unknown names, with `claim_metrics`); `tuning`
//! (`--targets-only`, `--limits`), `full_run` (the full run and its summary), `report`
//! (machine, server settings, chart); `dashboard` (`--dashboard`) and `sqlite` (`--sqlite`).

use std::str::FromStr;

use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
use sqlx::{ConnectOptions, MySqlPool};

use crate::args::{Opts, Sizes, parse_args};
use crate::fleet::fleet_only;
use crate::report::machine;
use crate::tuning::{limits_only, targets_only};
use crate::unknown::unknown_names;

mod args;
mod claim_metrics;
mod counters;
mod dashboard;
mod drain;
mod enqueue;
mod explain;
mod fleet;
mod full_run;
mod latency;
mod ordered;
mod outbox;
mod raw_claim;
mod report;
mod scratch;
mod sqlite;
mod task;
mod tuning;
mod unknown;
mod workflows;

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

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

/// The mode the options ask for, in the scratch database: the full run unless another is named.
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
    if let Some(n) = opts.ordered {
        eprintln!("machine: {}", machine());
        return ordered::run(pool, if opts.quick { n / 4 } else { n }).await;
    }
    if let Some(n) = opts.workflows {
        eprintln!("machine: {}", machine());
        return workflows::run(pool, if opts.quick { n / 4 } else { n }).await;
    }
    if let Some(n) = opts.outbox {
        eprintln!("machine: {}", machine());
        let n = if opts.quick { n / 4 } else { n };
        return outbox::run(pool, n, &opts.outbox_brokers).await;
    }
    if !opts.fleet.is_empty() {
        return fleet_only(opts, pool).await;
    }
    full_run::run(opts, &sz, pool).await
}
