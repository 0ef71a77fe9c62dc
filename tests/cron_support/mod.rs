//! The recurring task shared by `tests/cron.rs` and the `taskq-cron-worker` binary.

use taskq::TaskError;

/// Queue of the fleet test.
pub const FLEET_QUEUE: &str = "cron_fleet";

/// Declared on the task: every second, in UTC, on the fleet queue. Each worker process that
/// registers it takes part in firing it.
#[taskq::task(cron = "* * * * * *", queue = "cron_fleet")]
pub async fn fleet_tick() -> Result<(), TaskError> {
    Ok(())
}
