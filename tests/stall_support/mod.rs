//! Shared by `tests/abandoned.rs` and the `taskq-stall-worker` binary: one task per kind of
//! lock a worker holds inside a transaction (a limited queue's claim, a schedule's fire, a
//! unique task's write-back).
#![allow(dead_code)]

use std::time::Duration;

use serde::{Deserialize, Serialize};
use taskq::{Task, TaskContext, TaskError};

/// Queue of [`StallNap`], given a concurrency limit by the test.
pub const LIMITED_QUEUE: &str = "stall_limited";
/// Queue of the recurring [`StallTick`].
pub const CRON_QUEUE: &str = "stall_cron";
/// Queue of [`StallUnique`].
pub const UNIQUE_QUEUE: &str = "stall_unique";

/// Sleeps `ms`, then succeeds; on a queue with a concurrency limit, so every claim locks the
/// queue's row in `taskq_queues` first.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StallNap {
    pub ms: u64,
}

impl Task for StallNap {
    const NAME: &'static str = "stall_nap";
    const QUEUE: &'static str = LIMITED_QUEUE;
    async fn run(self, _cx: TaskContext) -> Result<(), TaskError> {
        tokio::time::sleep(Duration::from_millis(self.ms)).await;
        Ok(())
    }
}

/// Every second: each worker that registers it takes part in firing the schedule.
#[taskq::task(cron = "* * * * * *", queue = "stall_cron")]
pub async fn stall_tick() -> Result<(), TaskError> {
    Ok(())
}

/// Unique by account while pending or running: its write-back frees the identity, locking
/// the identity's row in `taskq_unique` first.
#[taskq::task(queue = "stall_unique", unique(by = [account], while = "running"))]
pub async fn stall_unique(account: u64) -> Result<(), TaskError> {
    let _ = account;
    Ok(())
}
