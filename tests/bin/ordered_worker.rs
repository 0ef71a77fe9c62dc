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
//! producers held the write lock; the handler's event rows go through a second pool with a
//! 60 s busy timeout) (heartbeat 500 ms, reaper every 250 ms) so that a killed
//! worker's task is taken back within seconds. Prints `ready <id>` once built, runs until SIGINT/SIGTERM, exits 0.

#[path = "../ordered_support/mod.rs"]
mod ordered_support;

use std::time::Duration;

use taskq_tests::bins::{AnyPool, open_pool};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    taskq_tests::bins::logs();
    let opts = taskq_tests::bins::Args::parse();
    let url = opts.required("url");
    let id = opts.required("id");
    // SQLite: a busy timeout the short lease survives (see `WorkerBuilder::build`). The
    // handler records its events through a pool of its own with a long busy timeout: with the
    // worker's 2 s, an event's INSERT was refused ("database is locked") under load, the
    // handler failed and ran again, and the check saw a start without its end.
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
    taskq_tests::bins::ready(worker.id());
    worker.run().await.expect("worker ran");
}
