// An error type that is not `std::error::Error` cannot become a `TaskError`.
#[derive(Debug)]
struct MailError;

#[taskq::task]
async fn send_email(to: String) -> Result<(), MailError> {
    let _ = to;
    Err(MailError)
}

fn main() {}
