use taskq::TaskError;

#[taskq::task(on_dead = notify_ops, on_dead = page_someone, on_success = "next_step")]
async fn export(order_id: i64) -> Result<(), TaskError> {
    let _ = order_id;
    Ok(())
}

fn main() {}
