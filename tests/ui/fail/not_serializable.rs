use taskq::TaskError;

#[derive(Debug, Clone)]
struct Recipient {
    address: String,
}

#[taskq::task]
async fn send_email(to: Recipient) -> Result<(), TaskError> {
    let _ = to.address;
    Ok(())
}

fn main() {}
