use std::rc::Rc;

use taskq::TaskError;

async fn deliver() {}

#[taskq::task]
async fn send_email(to: String) -> Result<(), TaskError> {
    let shared = Rc::new(to);
    deliver().await;
    let _ = shared;
    Ok(())
}

fn main() {}
