use taskq::TaskError;

#[taskq::task(priority = 40000)]
async fn send_email(to: String) -> Result<(), TaskError> {
    let _ = to;
    Ok(())
}

fn main() {}
