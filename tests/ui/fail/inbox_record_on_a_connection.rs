// `Inbox::record_tx` takes a transaction (issue 34 E7): on a bare connection the record would
// autocommit on its own, and a crash before the message's effects commit would lose the
// message (its redelivery answers `Seen::Again`).
async fn handle(pool: sqlx::MySqlPool) -> Result<(), Box<dyn std::error::Error>> {
    let inbox = taskq::inbox::Inbox::new("billing");
    let mut conn = pool.acquire().await?;
    inbox.record_tx(&mut conn, "m-1").await?;
    Ok(())
}

fn main() {
    let _ = handle;
}
