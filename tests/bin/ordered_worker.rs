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
    let builder = if url.starts_with("sqlite:") {
        // A busy timeout the short lease survives (see `WorkerBuilder::build`).
        let opts: sqlx::sqlite::SqliteConnectOptions = url.parse().expect("a SQLite URL");
        let opts = taskq::sqlite::tune(opts).busy_timeout(Duration::from_secs(2));
        let pool = taskq::sqlite::connect_with(opts).await.expect("open");
        taskq::Worker::builder(pool.clone()).data(pool)
    } else {
        let pool = MySqlPoolOptions::new()
            .max_connections(4)
            .connect(url)
            .await
            .expect("connect");
        taskq::Worker::builder(pool.clone()).data(pool)
    };
    let worker = builder
        .register::<ordered_support::LedgerEntry>()
        .queue(ordered_support::QUEUE, 8)
        .worker_id(*id)
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
