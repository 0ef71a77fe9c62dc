use taskq::TaskError;

struct Mailer;

impl Mailer {
    #[taskq::task]
    async fn send_email(&self, to: String) -> Result<(), TaskError> {
        let _ = to;
        Ok(())
    }
}

fn main() {}
