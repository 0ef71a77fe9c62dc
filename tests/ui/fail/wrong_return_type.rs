use taskq::TaskError;

#[taskq::task]
async fn count_rows(table: String) -> Result<u64, TaskError> {
    let _ = table;
    Ok(0)
}

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
