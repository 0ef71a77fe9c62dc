//! taskq metrics through the Prometheus exporter.
//!
//! Run with: `cargo run -p example-metrics` then `curl http://127.0.0.1:9464/metrics`
//! (uses `DATABASE_URL`, default `mysql://root@127.0.0.1:3306/taskq_example`; Ctrl-C stops).

use std::time::Duration;

use example_metrics::{BuildReport, install_exporter};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/taskq_example".into());
    let pool = taskq::connect(&url).await?;
    taskq::migrate(&pool).await?;
    let addr = "127.0.0.1:9464".parse()?;
    install_exporter(addr)?;
    for day in 1..=10 {
        BuildReport {
            day,
            fail_first: day % 3 == 0,
        }
        .enqueue(&pool)
        .await?;
    }
    println!("metrics at http://{addr}/metrics — Ctrl-C to stop");
    taskq::Worker::builder(pool)
        .register_all()
        .backlog_metrics(Duration::from_secs(5))
        .build()?
        .run()
        .await?;
    Ok(())
}
