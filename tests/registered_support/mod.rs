//! Shared by `tests/run_registered.rs` and the `taskq-registered-worker` binary: the one
//! `#[taskq::task]` the binary runs through `taskq::run_registered`, and the table it writes.
//! Including the same source in both crates keeps the task name and payload shape identical
//! on the producer (test) and worker (binary) sides; the test never runs the handler.
#![allow(dead_code)]

use sqlx::MySqlPool;
use taskq::{Data, TaskError};

/// The table [`registered_effect`] writes, one row per run.
pub const EFFECTS_TABLE: &str = "
CREATE TABLE registered_effects (
    id  BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
    n   INT UNSIGNED NOT NULL
) ENGINE = InnoDB";

/// Inserts `n` into `registered_effects` through the pool the worker injects as state
/// (`run_registered` registers the pool it is given).
#[taskq::task(queue = "registered", max_attempts = 3, backoff = "constant(100ms)")]
pub async fn registered_effect(n: u32, db: Data<MySqlPool>) -> Result<(), TaskError> {
    sqlx::query("INSERT INTO registered_effects (n) VALUES (?)")
        .bind(n)
        .execute(&*db)
        .await?;
    Ok(())
}
