use taskq::TaskError;

// Hour 25 does not exist.
#[taskq::task(cron = "0 25 * * *")]
async fn nightly() -> Result<(), TaskError> {
    Ok(())
}

// Three fields are not a cron expression.
#[taskq::task(cron = "*/5 * *")]
async fn often() -> Result<(), TaskError> {
    Ok(())
}

// Parses, but no day is ever the 30th of February.
#[taskq::task(cron = "0 0 30 2 *")]
async fn never() -> Result<(), TaskError> {
    Ok(())
}

// Not a string literal.
#[taskq::task(cron = 5)]
async fn number() -> Result<(), TaskError> {
    Ok(())
}

fn main() {}
