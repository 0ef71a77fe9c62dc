use taskq::TaskError;

#[taskq::task(cron = "0 3 * * *", timezone = "Europe/Pariss")]
async fn nightly() -> Result<(), TaskError> {
    Ok(())
}

#[taskq::task(cron = "0 3 * * *", timezone = "+25:00")]
async fn offset() -> Result<(), TaskError> {
    Ok(())
}

fn main() {}
