use taskq::TaskError;

#[taskq::task(queue = "mail", max_attempts = 3, queue = "email")]
async fn send_email(to: String) -> Result<(), TaskError> {
    let _ = to;
    Ok(())
}

fn main() {}
