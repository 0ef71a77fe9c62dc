use taskq::TaskError;

#[taskq::task(queue = "")]
async fn send_email(to: String) -> Result<(), TaskError> {
    let _ = to;
    Ok(())
}

#[taskq::task(queue = "a queue name that is far too long to fit in the sixty-four byte column")]
async fn send_sms(to: String) -> Result<(), TaskError> {
    let _ = to;
    Ok(())
}

#[taskq::task(name = "")]
async fn send_fax(to: String) -> Result<(), TaskError> {
    let _ = to;
    Ok(())
}

fn main() {}
