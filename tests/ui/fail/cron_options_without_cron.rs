use taskq::TaskError;

// `timezone` and `missed_ticks` only apply to a recurring task.
#[taskq::task(timezone = "Europe/Paris", missed_ticks = "skip")]
async fn nightly() -> Result<(), TaskError> {
    Ok(())
}

fn main() {}
