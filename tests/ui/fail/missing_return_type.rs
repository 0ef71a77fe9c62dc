#[taskq::task]
async fn send_email(to: String) {
    let _ = to;
}

fn main() {}
