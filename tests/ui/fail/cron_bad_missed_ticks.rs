use taskq::TaskError;

#[taskq::task(cron = "0 3 * * *", missed_ticks = "never")]
async fn nightly() -> Result<(), TaskError> {
    Ok(())
}

#[taskq::task(cron = "0 3 * * *", missed_ticks = "all(0)")]
async fn catch_up() -> Result<(), TaskError> {
    Ok(())
}

fn main() {}
