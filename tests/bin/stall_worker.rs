//! `taskq-stall-worker`: a worker process for `tests/abandoned.rs`, stopped (SIGSTOP) by its
//! parent while one of its transactions holds a lock.
//!
//! ```text
//! taskq-stall-worker --url mysql://root@127.0.0.1:PORT/stall --id frozen \
//!     --kind limited|schedule|unique [--lease-ms 4000]
//! ```
//!
//! `limited` works the limited queue ([`StallNap`](stall_support::StallNap)), `schedule`
//! fires [`StallTick`](stall_support::StallTick) every second, `unique` works
//! [`StallUnique`](stall_support::StallUnique). Prints `ready <id>` once the worker is built
//! and runs until killed.

#[path = "../stall_support/mod.rs"]
mod stall_support;

use std::io::Write as _;
use std::time::Duration;

use stall_support::*;
use taskq_tests::worker_bin::{WorkerArgs, worker_builder};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = WorkerArgs::from_env();
    let (url, id) = (args.required("url"), args.required("id"));
    let lease = args.millis("lease-ms", 4000);
    let builder = worker_builder(url, 2, None, false).await;
    let builder = match args.required("kind") {
        "limited" => builder.register::<StallNap>().queue(LIMITED_QUEUE, 1),
        "schedule" => builder.register::<StallTick>().queue(CRON_QUEUE, 1),
        "unique" => builder.register::<StallUnique>().queue(UNIQUE_QUEUE, 1),
        other => panic!("unknown --kind {other}"),
    };
    let worker = builder
        .worker_id(id)
        .lease(lease)
        .poll_interval(Duration::from_millis(10), Duration::from_millis(100))
        .retention(taskq::worker::Retention::disabled())
        .build()
        .expect("valid worker settings");
    println!("ready {}", worker.id());
    std::io::stdout().flush().ok();
    worker.run().await.expect("worker ran");
}
