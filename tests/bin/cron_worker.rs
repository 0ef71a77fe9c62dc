//! `taskq-cron-worker`: a worker process for the cron fleet test (`tests/cron.rs`).
//!
//! ```text
//! taskq-cron-worker --url mysql://root@127.0.0.1:3306/taskq_t_… --id fleet-3
//! ```
//!
//! Works the `cron_fleet` queue with every `#[taskq::task]` of this binary — the [`fleet_tick`](cron_support::fleet_tick)
//! task, declared with `cron = "* * * * * *"` — so it fires that schedule along with every
//! other process running it. Prints `ready <id>` once the worker is built, runs until
//! SIGINT/SIGTERM, then prints `report <json>` (final counters, `scheduled` among them) and
//! exits 0.

#[path = "../cron_support/mod.rs"]
mod cron_support;

use std::collections::HashMap;
use std::io::Write as _;
use std::time::Duration;

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
    let url = opts.get("url").expect("--url");
    let id = opts.get("id").expect("--id");
    let pool = MySqlPoolOptions::new()
        .max_connections(2)
        .connect(url)
        .await
        .expect("connect");
    let worker = taskq::Worker::builder(pool)
        .register_all()
        .queue(cron_support::FLEET_QUEUE, 8)
        .worker_id(*id)
        .poll_interval(Duration::from_millis(20), Duration::from_millis(200))
        .retention(taskq::worker::Retention::disabled())
        .shutdown_timeout(Duration::from_secs(5))
        .build()
        .expect("valid worker settings");
    println!("ready {}", worker.id());
    std::io::stdout().flush().ok();
    let report = worker.run().await.expect("worker ran");
    let json = serde_json::json!({ "stats": report.stats });
    println!("report {json}");
    std::io::stdout().flush().ok();
}
