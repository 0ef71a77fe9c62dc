#[taskq::task]
async fn send_email(to: String) -> Option<()> {
    let _ = to;
    None
}

#[taskq::task]
async fn send_sms(to: String) -> bool {
    let _ = to;
    true
}

fn main() {}
