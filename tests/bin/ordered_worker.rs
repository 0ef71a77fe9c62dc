//! `taskq-ordered-worker`: a worker process for the fleet test of ordered tasks
//! (`tests/ordered_fleet.rs`).
//!
//! ```text
//! taskq-ordered-worker --url mysql://root@127.0.0.1:3306/taskq_t_… --id fleet-3
//! taskq-ordered-worker --url sqlite:///tmp/taskq-t-….db --id fleet-3
//! ```
//!
//! Works the `ledger` queue with [`LedgerEntry`](ordered_support::LedgerEntry) at concurrency
//! 8, with an 8 s lease (SQLite: a 2 s busy timeout; a 4 s lease was lost under load while
//! producers held the write lock) (heartbeat 500 ms, reaper every 250 ms) so that a killed
//! worker's task is taken back within seconds. Prints `ready <id>` once built, runs until SIGINT/SIGTERM, exits 0.

#[path = "../ordered_support/mod.rs"]
mod ordered_support;

use std::io::Write as _;
use std::time::Duration;

use taskq_tests::worker_bin::{WorkerArgs, worker_builder};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = WorkerArgs::from_env();
    let (url, id) = (args.required("url"), args.required("id"));
    // SQLite: a busy timeout the short lease survives.
    let builder = worker_builder(url, 4, Some(Duration::from_secs(2)), true).await;
    let worker = builder
        .register::<ordered_support::LedgerEntry>()
        .queue(ordered_support::QUEUE, 8)
        .worker_id(id)
        .lease(Duration::from_secs(8))
        .heartbeat(Duration::from_millis(500))
        .reaper_interval(Duration::from_millis(250))
        .poll_interval(Duration::from_millis(5), Duration::from_millis(50))
        .retention(taskq::worker::Retention::disabled())
        .shutdown_timeout(Duration::from_secs(5))
        .build()
        .expect("valid worker settings");
    println!("ready {}", worker.id());
    std::io::stdout().flush().ok();
    worker.run().await.expect("worker ran");
}
