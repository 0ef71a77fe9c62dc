//! Run with: `cargo run -p example-axum-service`, then
//! `curl -XPOST localhost:3000/signups -H 'content-type: application/json' -d '{"email":"a@example.com"}'`;
//! Ctrl-C stops the HTTP server and the worker together. Uses `DATABASE_URL`
//! (default `mysql://root@127.0.0.1:3306/taskq_example`).

use example_axum_service::{Outbox, serve, setup};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/taskq_example".into());
    let pool = taskq::connect(&url).await?;
    setup(&pool).await?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        let _ = stop_tx.send(true);
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!("listening on http://127.0.0.1:3000 (Ctrl-C to stop)");
    let report = serve(pool, Outbox::default(), listener, stop_rx).await?;
    println!("stopped; worker stats: {:?}", report.stats);
    Ok(())
}
