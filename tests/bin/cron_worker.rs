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

use std::io::Write as _;
use std::time::Duration;

use taskq_tests::worker_bin::{WorkerArgs, worker_builder};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = WorkerArgs::from_env();
    let (url, id) = (args.required("url"), args.required("id"));
    let worker = worker_builder(url, 2, None, false)
        .await
        .register_all()
        .queue(cron_support::FLEET_QUEUE, 8)
        .worker_id(id)
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
