//! `taskq-fault-worker`: a worker process for the fault tests (scenarios 1 and 2), to be
//! killed, paused and terminated by its parent.
//!
//! ```text
//! taskq-fault-worker --url mysql://root@127.0.0.1:PORT/faults --id A-1 \
//!     [--lease-ms 2000] [--heartbeat-ms 500] [--reaper-ms 200] [--shutdown-ms 5000] [--concurrency 8]
//! ```
//!
//! Works the `faults` queue with the [`Hold`] task, prints `ready <id>` once the worker is
//! built, runs until SIGINT/SIGTERM, then prints `report <json>` (released and unacknowledged
//! task ids, final counters) and exits 0.

#[path = "../faults_support/mod.rs"]
mod faults_support;

use std::collections::HashMap;
use std::io::Write as _;
use std::time::Duration;

use faults_support::Hold;
use sqlx::mysql::MySqlPoolOptions;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opts: HashMap<&str, &str> = args
        .chunks(2)
        .map(|kv| {
            let key = kv[0].strip_prefix("--").expect("options are --key value");
            (key, kv.get(1).map(String::as_str).expect("a value"))
        })
        .collect();
    let ms = |k: &str, default: u64| {
        Duration::from_millis(
            opts.get(k)
                .map_or(default, |v| v.parse().expect("a number")),
        )
    };
    let url = opts.get("url").expect("--url");
    let id = opts.get("id").expect("--id");
    let concurrency: usize = opts.get("concurrency").map_or(8, |v| v.parse().unwrap());

    let pool = MySqlPoolOptions::new()
        .max_connections(4)
        .connect(url)
        .await
        .expect("connect");
    let worker = taskq::Worker::builder(pool.clone())
        .register::<Hold>()
        .queue("faults", concurrency)
        .worker_id(*id)
        .lease(ms("lease-ms", 2000))
        .heartbeat(ms("heartbeat-ms", 500))
        .reaper_interval(ms("reaper-ms", 200))
        .shutdown_timeout(ms("shutdown-ms", 5000))
        .poll_interval(Duration::from_millis(10), Duration::from_millis(100))
        .cancel_grace(Duration::from_millis(500))
        .retention(taskq::worker::Retention::disabled())
        .data(pool.clone())
        .build()
        .expect("valid worker settings");
    println!("ready {}", worker.id());
    std::io::stdout().flush().ok();
    let report = worker.run().await.expect("worker ran");
    let json = serde_json::json!({
        "released": report.released.iter().map(|t| t.0).collect::<Vec<_>>(),
        "unacknowledged": report.unacknowledged.iter().map(|t| t.0).collect::<Vec<_>>(),
        "stats": report.stats,
    });
    println!("report {json}");
    std::io::stdout().flush().ok();
}
