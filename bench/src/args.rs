//! Settings: the command line (`--help` prints its usage) and the sizes of a run.

use crate::Res;
use crate::dashboard;
use crate::unknown::UNKNOWN;

pub struct Opts {
    pub url: String,
    pub quick: bool,
    /// `--out`, when given (each mode has its default).
    pub out: Option<String>,
    pub svg: String,
    pub million: bool,
    /// Only the two ratio targets at 16 (enqueue_tx vs raw, drain vs raw loop), for tuning.
    pub targets_only: bool,
    /// Only the unknown-names scenario (pending tasks no worker knows at the head of the
    /// queue), printed.
    pub unknown_only: bool,
    /// Only the queue-limit scenario (drains without a limit, with a limit that never binds,
    /// with one that does), printed.
    pub limits_only: bool,
    /// `--ordered [n]`: only the ordered drains (1, 16, 256 keys) next to an unordered one.
    pub ordered: Option<u64>,
    /// `--workflows [n]`: only a workflow of `n` steps next to a plain drain of `n` tasks, and
    /// the end-to-next-start latency of a chain of each.
    pub workflows: Option<u64>,
    /// `--outbox [n]`: only the relay against a direct publish loop (1, 16, 256 keys), with
    /// commit-to-broker latency and statements per event.
    pub outbox: Option<u64>,
    /// `--outbox-brokers nats,rabbitmq,redis` (default `nats`).
    pub outbox_brokers: Vec<crate::outbox::Broker>,
    /// Only the dashboard's page times on a large table (see `dashboard.rs`).
    pub dashboard: Option<dashboard::DashOpts>,
    /// Leave the scratch database in place (its name is printed).
    pub keep_db: bool,
    /// Only the SQLite measurements, on this file (`--sqlite`, `--sqlite-file PATH`).
    pub sqlite: Option<std::path::PathBuf>,
    /// Only fleets of `workers × concurrency` (`--fleet 32x1,64x1`), each worker with its own
    /// pool, with the server's peak connection count.
    pub fleet: Vec<(usize, usize)>,
    /// Tasks each fleet drains (`--fleet-tasks`).
    pub fleet_tasks: u64,
    /// `--fleet-shared-pool`: the fleet's workers share one pool (Worker instances in one
    /// process) instead of one pool each (as worker processes would have).
    pub fleet_shared_pool: bool,
}

/// The dashboard settings of `o`, created with their defaults by the first `--dashboard*`.
fn dashboard_opts(o: &mut Opts) -> &mut dashboard::DashOpts {
    o.dashboard.get_or_insert(dashboard::DashOpts {
        tasks: 1_000_000,
        requests: 30,
    })
}

pub fn parse_args() -> Res<Opts> {
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
        ordered: None,
        workflows: None,
        outbox: None,
        outbox_brokers: vec![crate::outbox::Broker::Nats],
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
            "--ordered" => o.ordered = Some(2000),
            "--workflows" => o.workflows = Some(1000),
            "--outbox" => {
                o.outbox.get_or_insert(crate::outbox::DEFAULT_EVENTS);
            }
            "--outbox-events" => {
                o.outbox = Some(
                    args.next()
                        .and_then(|v| v.replace('_', "").parse().ok())
                        .filter(|n| *n > 0)
                        .ok_or("--outbox-events needs a positive number")?,
                )
            }
            "--outbox-brokers" => {
                o.outbox_brokers = args
                    .next()
                    .ok_or("--outbox-brokers needs nats,rabbitmq,redis")?
                    .split(',')
                    .map(crate::outbox::Broker::parse)
                    .collect::<Res<_>>()?;
                o.outbox.get_or_insert(crate::outbox::DEFAULT_EVENTS);
            }
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
                     [--keep-db]\n\
                     \x20      taskq-bench --outbox [--outbox-events N] [--outbox-brokers \
                     nats,rabbitmq,redis]\n\n\
                     --outbox         only the relay vs a hand-written publish loop to the same \
                     broker at 1/16/256 keys (N events each, default 5000; --quick: a quarter), \
                     commit-to-broker latency (NATS) and statements per event (global \
                     counters: a server nobody else uses), printed\n\
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
pub struct Sizes {
    /// Seconds of each fixed-duration insert measurement.
    pub insert_secs: f64,
    /// Tasks of each drain (and of the raw claim loop).
    pub drain: u64,
    pub reps: usize,
    /// Tasks of the enqueue_many measurement.
    pub many: u64,
    pub latency_tasks: u64,
    pub backlog: u64,
    pub million: u64,
}

impl Sizes {
    pub fn new(quick: bool) -> Self {
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
