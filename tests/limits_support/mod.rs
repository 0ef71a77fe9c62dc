//! The task shared by `tests/limits.rs` and the `taskq-limit-worker` binary.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use taskq::{Task, TaskContext, TaskError};

/// Queue of the fleet test.
pub const QUEUE: &str = "limited";

/// Sleeps `ms` milliseconds, then succeeds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Nap {
    pub ms: u64,
}

impl Task for Nap {
    const NAME: &'static str = "limit_nap";
    const QUEUE: &'static str = QUEUE;
    async fn run(self, _cx: TaskContext) -> Result<(), TaskError> {
        tokio::time::sleep(Duration::from_millis(self.ms)).await;
        Ok(())
    }
}
