use taskq::TaskError;

#[taskq::task(backoff = "linear(1s)")]
async fn send_email(to: String) -> Result<(), TaskError> {
    let _ = to;
    Ok(())
}

#[taskq::task(backoff = "exponential(10m, 1s)")]
async fn send_sms(to: String) -> Result<(), TaskError> {
    let _ = to;
    Ok(())
}

#[taskq::task(backoff = "constant(5)")]
async fn send_fax(to: String) -> Result<(), TaskError> {
    let _ = to;
    Ok(())
}

#[taskq::task(backoff = "exponential(1s, 3661d)")]
async fn send_letter(to: String) -> Result<(), TaskError> {
    let _ = to;
    Ok(())
}

#[taskq::task(backoff = "constant(4000d)")]
async fn send_pigeon(to: String) -> Result<(), TaskError> {
    let _ = to;
    Ok(())
}

fn main() {}
