use taskq::{TaskContext, TaskError};

// A cron task is enqueued by the scheduler without arguments: no payload parameters.
#[taskq::task(cron = "0 3 * * *")]
async fn nightly_report(region: String, cx: TaskContext) -> Result<(), TaskError> {
    let _ = (region, cx);
    Ok(())
}

fn main() {}
