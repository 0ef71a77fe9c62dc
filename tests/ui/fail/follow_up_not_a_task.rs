use taskq::{DeadTask, TaskError};

// A plain function, not a `#[taskq::task]`: there is no `NotifyOps` task to enqueue.
#[allow(dead_code)]
fn notify_ops(dead: DeadTask) {
    let _ = dead;
}

#[taskq::task(on_dead = notify_ops)]
async fn export(order_id: i64) -> Result<(), TaskError> {
    let _ = order_id;
    Ok(())
}

fn main() {}
