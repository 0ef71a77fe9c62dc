use taskq::TaskError;

#[taskq::task("mail")]
async fn send_email(to: String) -> Result<(), TaskError> {
    let _ = to;
    Ok(())
}

#[taskq::task(queue)]
async fn send_sms(to: String) -> Result<(), TaskError> {
    let _ = to;
    Ok(())
}

fn main() {}
