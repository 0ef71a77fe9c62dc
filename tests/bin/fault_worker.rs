//! `taskq-fault-worker`: a worker process for the fault tests (scenarios 1 and 2 on MySQL; on
//! SQLite also the transaction, poison and starvation scenarios), to be killed, paused and
//! terminated by its parent.
//!
//! ```text
//! taskq-fault-worker --url mysql://root@127.0.0.1:PORT/faults --id A-1 \
//!     [--lease-ms 2000] [--heartbeat-ms 500] [--reaper-ms 200] [--shutdown-ms 5000] [--concurrency 8] [--grace-ms 500]
//! taskq-fault-worker --url sqlite:///tmp/faults.db --id A-1 [--queues load:4,orders:8] [--busy-ms N] [--events-busy-ms N] ...
//! ```
//!
//! On SQLite the worker's pool's busy timeout is `--busy-ms`, by default the longest the lease
//! allowed before issue 34 (`lease − heartbeat − min(grace, lease / 2)`: 1 s with the defaults); handlers write
//! on that pool too, or on one with `--events-busy-ms`.
//!
//! On MySQL it works the `faults` queue with the [`Hold`] task. On SQLite (a `sqlite:` URL) it
//! handles every scenario task ([`Hold`], [`Ship`], [`Work`], [`Poison`], [`PoisonTimed`]) and
//! works `--queues` (default `faults:<concurrency>`); handlers record their executions in the
//! database's `fault_events`. Prints `ready <id>` once the worker is built, runs until
//! SIGINT/SIGTERM, then prints `report <json>` (released and unacknowledged task ids, final
//! counters) and exits 0.

#[path = "../faults_support/mod.rs"]
mod faults_support;

use std::io::Write as _;
use std::time::Duration;

use faults_support::{Hold, Poison, PoisonTimed, Seen, Ship, Work};
use sqlx::mysql::MySqlPoolOptions;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let opts = taskq_tests::bins::Args::parse();
    let ms = |k: &str, default: u64| opts.ms(k, default);
    let url = opts.required("url");
    let id = opts.required("id");
    let concurrency: usize = opts.num("concurrency", 8);

    let builder = if url.starts_with("sqlite:") {
        // The longest busy timeout the lease allowed before issue 34 (lease − heartbeat −
        // min(grace, lease / 2), then checked by `build`), unless `--busy-ms` says otherwise.
        let (lease, heartbeat) = (ms("lease-ms", 2000), ms("heartbeat-ms", 500));
        let tolerated = lease - heartbeat - ms("grace-ms", 500).min(lease / 2);
        let busy = opts.get("busy-ms").map_or(tolerated, |v| {
            Duration::from_millis(v.parse().expect("a number"))
        });
        let options = taskq_sqlite::connect_options_from_url(url)
            .expect("a sqlite URL")
            .busy_timeout(busy);
        let pool = taskq_sqlite::connect::open_with(options, 8)
            .await
            .expect("open the file");
        // Handlers write on the same pool, or on one with `--events-busy-ms` (so that their
        // records outlast a lock hold the worker's lease does not).
        let events = match opts.get("events-busy-ms") {
            None => pool.clone(),
            Some(v) => {
                let options = taskq_sqlite::connect_options_from_url(url)
                    .expect("a sqlite URL")
                    .busy_timeout(Duration::from_millis(v.parse().expect("a number")));
                taskq_sqlite::connect::open_with(options, 8)
                    .await
                    .expect("open the file")
            }
        };
        let mut b = taskq::Worker::builder(pool)
            .register::<Hold>()
            .register::<Ship>()
            .register::<Work>()
            .register::<Poison>()
            .register::<PoisonTimed>()
            .data(events)
            .data(Seen::default());
        let queues = opts
            .get("queues")
            .map_or_else(|| format!("faults:{concurrency}"), |q| (*q).to_owned());
        for q in queues.split(',') {
            let (name, n) = q.split_once(':').expect("--queues name:n,...");
            b = b.queue(name, n.parse().expect("a concurrency"));
        }
        b
    } else {
        let pool = MySqlPoolOptions::new()
            .max_connections(4)
            .connect(url)
            .await
            .expect("connect");
        taskq::Worker::builder(pool.clone())
            .register::<Hold>()
            .queue("faults", concurrency)
            .data(pool)
    };
    let worker = builder
        .worker_id(id)
        .lease(ms("lease-ms", 2000))
        .heartbeat(ms("heartbeat-ms", 500))
        .reaper_interval(ms("reaper-ms", 200))
        .shutdown_timeout(ms("shutdown-ms", 5000))
        .poll_interval(Duration::from_millis(10), Duration::from_millis(100))
        .cancel_grace(ms("grace-ms", 500))
        .retention(taskq::worker::Retention::disabled())
        .build()
        .expect("valid worker settings");
    taskq_tests::bins::ready(worker.id());
    let report = worker.run().await.expect("worker ran");
    let json = serde_json::json!({
        "released": report.released.iter().map(|t| t.0).collect::<Vec<_>>(),
        "unacknowledged": report.unacknowledged.iter().map(|t| t.0).collect::<Vec<_>>(),
        "stats": report.stats,
    });
    println!("report {json}");
    std::io::stdout().flush().ok();
}
