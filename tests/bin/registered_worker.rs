//! `taskq-registered-worker`: a worker process built with the one-liner
//! `taskq::run_registered(pool)`, for `tests/run_registered.rs`.
//!
//! ```text
//! taskq-registered-worker mysql://root@127.0.0.1:3306/taskq_t_…
//! TASKQ_REGISTERED_WORKER_URL=mysql://… taskq-registered-worker
//! ```
//!
//! Connects a pool to the database given as the first argument (else
//! `TASKQ_REGISTERED_WORKER_URL`) and runs every `#[taskq::task]` of this binary (the
//! [`registered_effect`](registered_support::registered_effect) task, which takes the pool as
//! `Data<MySqlPool>`) with the default settings until SIGINT/SIGTERM. Then it prints
//! `report <json>` (released and unacknowledged task ids, final counters) and exits 0; it exits
//! 1 if the worker fails and 2 without a database URL.

#[path = "../registered_support/mod.rs"]
mod registered_support;

use std::io::Write as _;

use sqlx::mysql::MySqlPoolOptions;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let Some(url) = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("TASKQ_REGISTERED_WORKER_URL").ok())
    else {
        eprintln!("usage: taskq-registered-worker <mysql://…> (or TASKQ_REGISTERED_WORKER_URL)");
        std::process::exit(2);
    };
    let pool = MySqlPoolOptions::new()
        .max_connections(4)
        .connect(&url)
        .await
        .expect("connect");
    let report = match taskq::run_registered(pool).await {
        Ok(report) => report,
        Err(e) => {
            eprintln!("taskq-registered-worker: {e}");
            std::process::exit(1);
        }
    };
    let json = serde_json::json!({
        "released": report.released.iter().map(|t| t.0).collect::<Vec<_>>(),
        "unacknowledged": report.unacknowledged.iter().map(|t| t.0).collect::<Vec<_>>(),
        "stats": report.stats,
    });
    println!("report {json}");
    std::io::stdout().flush().ok();
}
