use taskq::{DeadTask, TaskError};

#[taskq::task(on_dead = notify_ops)]
async fn notify_ops(dead: DeadTask) -> Result<(), TaskError> {
    let _ = dead;
    Ok(())
}

fn main() {}
