use taskq::TaskError;

#[taskq::task]
fn send_email(to: String) -> Result<(), TaskError> {
    let _ = to;
    Ok(())
}

fn main() {}
