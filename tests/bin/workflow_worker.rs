//! `taskq-workflow-worker`: a worker process for the fleet test of workflows
//! (`tests/workflow_fleet.rs`) and of batches (`tests/batch_fleet.rs`).
//!
//! ```text
//! taskq-workflow-worker --url mysql://root@127.0.0.1:3306/taskq_t_… --id graph-2
//! ```
//!
//! Works the `graph` queue with [`FleetStep`](workflow_support::FleetStep) and
//! [`FleetMember`](workflow_support::FleetMember) (the batch fleet test) at concurrency 8,
//! with an 8 s lease (heartbeat 500 ms, reaper every 250 ms) so that a killed worker's step is
//! taken back within seconds; on SQLite a 2 s busy timeout, and the handler's event rows go
//! through a second pool with a 60 s busy timeout (as `taskq-ordered-worker` does). Prints
//! `ready <id>` once built, runs until SIGINT/SIGTERM, exits 0.

#[path = "../workflow_support/mod.rs"]
mod workflow_support;

use std::time::Duration;

use taskq_tests::bins::{AnyPool, open_pool};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    taskq_tests::bins::logs();
    let opts = taskq_tests::bins::Args::parse();
    let url = opts.required("url");
    let id = opts.required("id");
    let events = open_pool(url, 4, Some(Duration::from_secs(60))).await;
    let builder = match (
        open_pool(url, 4, Some(Duration::from_secs(2))).await,
        events,
    ) {
        (AnyPool::Sqlite(pool), AnyPool::Sqlite(events)) => {
            taskq::Worker::builder(pool).data(events)
        }
        (AnyPool::MySql(pool), AnyPool::MySql(events)) => taskq::Worker::builder(pool).data(events),
        _ => unreachable!("both pools come from one URL"),
    };
    let worker = builder
        .register::<workflow_support::FleetStep>()
        .register::<workflow_support::FleetMember>()
        .queue(workflow_support::QUEUE, 8)
        .worker_id(id)
        .lease(Duration::from_secs(8))
        .heartbeat(Duration::from_millis(500))
        .reaper_interval(Duration::from_millis(250))
        .poll_interval(Duration::from_millis(5), Duration::from_millis(50))
        .retention(taskq::worker::Retention::disabled())
        .shutdown_timeout(Duration::from_secs(5))
        .build()
        .expect("valid worker settings");
    taskq_tests::bins::ready(worker.id());
    worker.run().await.expect("worker ran");
}
