use taskq::TaskError;

#[taskq::task(max_attempts = 0)]
async fn send_email(to: String) -> Result<(), TaskError> {
    let _ = to;
    Ok(())
}

fn main() {}
