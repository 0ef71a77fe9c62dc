//! `taskq-limit-worker`: a worker process for the fleet test of queue limits
//! (`tests/limits.rs`).
//!
//! ```text
//! taskq-limit-worker --url mysql://root@127.0.0.1:3306/taskq_t_… --id fleet-3 [--concurrency 8]
//! taskq-limit-worker --url sqlite:///tmp/taskq-t-….db --id fleet-3
//! ```
//!
//! Works the `limited` queue with the [`Nap`](limits_support::Nap) task at the given
//! concurrency (default 8), polling every 10 ms to 100 ms (so it re-reads the queue's limits
//! every 100 ms). Prints `ready <id>` once the worker is built, runs until SIGINT/SIGTERM,
//! then prints `report <json>` (final counters) and exits 0.

#[path = "../limits_support/mod.rs"]
mod limits_support;

use std::io::Write as _;
use std::time::Duration;

use taskq_tests::worker_bin::{WorkerArgs, worker_builder};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = WorkerArgs::from_env();
    let (url, id) = (args.required("url"), args.required("id"));
    let concurrency: usize = args.number("concurrency", 8);
    let builder = worker_builder(url, 2, None, false).await;
    let worker = builder
        .register::<limits_support::Nap>()
        .queue(limits_support::QUEUE, concurrency)
        .worker_id(id)
        .poll_interval(Duration::from_millis(10), Duration::from_millis(100))
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
