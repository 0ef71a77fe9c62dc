use taskq::TaskError;

#[derive(Clone)]
struct Mailer;

#[taskq::task]
async fn send_email(to: String, #[inject] mailer: Mailer) -> Result<(), TaskError> {
    let _ = (to, mailer);
    Ok(())
}

fn main() {}
