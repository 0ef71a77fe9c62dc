use taskq::TaskError;

#[taskq::task(queu = "mail")]
async fn send_email(to: String) -> Result<(), TaskError> {
    let _ = to;
    Ok(())
}

#[taskq::task(retries = 3)]
async fn send_sms(to: String) -> Result<(), TaskError> {
    let _ = to;
    Ok(())
}

fn main() {}
