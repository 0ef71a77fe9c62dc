use taskq::TaskError;

#[taskq::task]
async fn send_email<T: serde::Serialize>(to: T) -> Result<(), TaskError> {
    let _ = to;
    Ok(())
}

fn main() {}
