use taskq::{DeadTask, TaskError};

/// Takes a string, not a `DeadTask`.
#[taskq::task]
async fn notify_ops(message: String) -> Result<(), TaskError> {
    let _ = message;
    Ok(())
}

/// Takes a `DeadTask`, but `on_success` hands a `SucceededTask`.
#[taskq::task]
async fn next_step(dead: DeadTask) -> Result<(), TaskError> {
    let _ = dead;
    Ok(())
}

/// Two payload parameters: not a follow-up target.
#[taskq::task]
async fn audit(dead: DeadTask, note: String) -> Result<(), TaskError> {
    let _ = (dead, note);
    Ok(())
}

#[taskq::task(on_dead = notify_ops, on_success = next_step)]
async fn export(order_id: i64) -> Result<(), TaskError> {
    let _ = order_id;
    Ok(())
}

#[taskq::task(on_dead = audit)]
async fn import(order_id: i64) -> Result<(), TaskError> {
    let _ = order_id;
    Ok(())
}

fn main() {}
