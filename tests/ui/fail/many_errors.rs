// Every problem is reported at once, each on its own token.
#[taskq::task(max_attempts = 0, queue = "")]
fn send_email<'a>(to: &'a str) {
    let _ = to;
}

fn main() {}
