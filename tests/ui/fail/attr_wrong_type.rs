use taskq::TaskError;

const MAIL_QUEUE: &str = "mail";

#[taskq::task(max_attempts = "5")]
async fn send_email(to: String) -> Result<(), TaskError> {
    let _ = to;
    Ok(())
}

#[taskq::task(queue = MAIL_QUEUE)]
async fn send_sms(to: String) -> Result<(), TaskError> {
    let _ = to;
    Ok(())
}

#[taskq::task(timeout = 30, priority = 1.5)]
async fn send_fax(to: String) -> Result<(), TaskError> {
    let _ = to;
    Ok(())
}

fn main() {}
