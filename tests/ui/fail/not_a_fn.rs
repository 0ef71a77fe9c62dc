#[taskq::task]
struct SendEmail {
    to: String,
}

fn main() {}
