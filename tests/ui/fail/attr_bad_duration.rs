use taskq::TaskError;

#[taskq::task(timeout = "30")]
async fn send_email(to: String) -> Result<(), TaskError> {
    let _ = to;
    Ok(())
}

#[taskq::task(timeout = "2 weeks")]
async fn send_sms(to: String) -> Result<(), TaskError> {
    let _ = to;
    Ok(())
}

#[taskq::task(timeout = "0s")]
async fn send_fax(to: String) -> Result<(), TaskError> {
    let _ = to;
    Ok(())
}

fn main() {}
