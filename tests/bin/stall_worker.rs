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

use std::time::Duration;

use sqlx::mysql::MySqlPoolOptions;
use stall_support::*;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let opts = taskq_tests::bins::Args::parse();
    let url = opts.required("url");
    let id = opts.required("id");
    let lease = opts.ms("lease-ms", 4000);
    let pool = MySqlPoolOptions::new()
        .max_connections(2)
        .connect(url)
        .await
        .expect("connect");
    let builder = taskq::Worker::builder(pool);
    let builder = match opts.required("kind") {
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
    taskq_tests::bins::ready(worker.id());
    worker.run().await.expect("worker ran");
}
