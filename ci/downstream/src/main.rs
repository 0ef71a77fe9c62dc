//! A user's service: a task defined with the macro, enqueued in a transaction, a worker.

#[taskq::task(queue = "orders", max_attempts = 5)]
async fn order_export(order_id: i64) -> Result<(), taskq::TaskError> {
    let _ = order_id;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let Ok(url) = std::env::var("DOWNSTREAM_DATABASE_URL") else {
        println!("built; set DOWNSTREAM_DATABASE_URL to run");
        return Ok(());
    };
    #[cfg(feature = "sqlite")]
    if url.starts_with("sqlite:") {
        let pool = taskq::sqlite::connect(&url).await?;
        taskq::migrate(&pool).await?;
        let mut tx = taskq::sqlite::begin(&pool).await?;
        let out = OrderExport { order_id: 1 }.enqueue_tx(&mut tx).await?;
        tx.commit().await?;
        println!("enqueued task {} (SQLite)", out.id);
        return Ok(());
    }
    let pool = sqlx::MySqlPool::connect(&url).await?;
    taskq::migrate(&pool).await?;
    let mut tx = pool.begin().await?;
    let out = OrderExport { order_id: 1 }.enqueue_tx(&mut tx).await?;
    tx.commit().await?;
    println!("enqueued task {}", out.id);
    Ok(())
}
