use taskq::TaskError;

#[taskq::task]
async fn send_email(to: &str, attachment: &[u8]) -> Result<(), TaskError> {
    let _ = (to, attachment);
    Ok(())
}

fn main() {}
