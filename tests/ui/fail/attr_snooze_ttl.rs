use taskq::TaskError;

#[taskq::task(ttl = "0s")]
async fn never_alive(to: String) -> Result<(), TaskError> {
    let _ = to;
    Ok(())
}

#[taskq::task(ttl = 3600)]
async fn ttl_without_unit(to: String) -> Result<(), TaskError> {
    let _ = to;
    Ok(())
}

#[taskq::task(ttl = "4000d")]
async fn ttl_too_long(to: String) -> Result<(), TaskError> {
    let _ = to;
    Ok(())
}

#[taskq::task(ttl = "1 hour")]
async fn ttl_bad_text(to: String) -> Result<(), TaskError> {
    let _ = to;
    Ok(())
}

#[taskq::task(max_snoozes = -1)]
async fn negative_snoozes(to: String) -> Result<(), TaskError> {
    let _ = to;
    Ok(())
}

#[taskq::task(max_snoozes = "10")]
async fn snoozes_as_text(to: String) -> Result<(), TaskError> {
    let _ = to;
    Ok(())
}

fn main() {}
