//! The step task of the workflow fleet test (`tests/workflow_fleet.rs`), shared with its
//! worker process (`tests/bin/workflow_worker.rs`).
//!
//! `FleetStep`'s handler records its start and its end as rows of `wf_events` (an
//! auto-increment id per event: an event inserted after another one's insert returned has a
//! larger id, whichever process wrote them), so the test can tell from the ids alone whether a
//! step started before a step it runs after had ended.

// Each test binary that includes this module uses some of its tasks.
#![allow(dead_code)]

use std::time::Duration;

use serde::{Deserialize, Serialize};
use taskq::{Task, TaskContext, TaskError};

/// The queue of the fleet test.
pub const QUEUE: &str = "graph";

/// One step of the fleet's graph.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FleetStep {
    /// The step's name (also recorded with its events).
    pub step: String,
    /// Sleep this long in the first attempt (the test kills the worker meanwhile).
    pub slow_ms: u64,
}

impl Task for FleetStep {
    const NAME: &'static str = "fleet_step";
    const QUEUE: &'static str = QUEUE;
    const MAX_ATTEMPTS: u32 = 10;

    async fn run(self, cx: TaskContext) -> Result<(), TaskError> {
        let attempt = cx.attempt();
        event(&cx, &self.step, "start", attempt).await?;
        if attempt == 1 && self.slow_ms > 0 {
            tokio::time::sleep(Duration::from_millis(self.slow_ms)).await;
        } else {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        event(&cx, &self.step, "end", attempt).await?;
        Ok(())
    }
}

async fn event(cx: &TaskContext, step: &str, kind: &str, attempt: u32) -> Result<(), TaskError> {
    let pid = i64::from(std::process::id());
    let sql = "INSERT INTO wf_events (step, kind, attempt, pid) VALUES (?, ?, ?, ?)";
    if let Some(pool) = cx.data::<sqlx::MySqlPool>() {
        sqlx::query(sql)
            .bind(step)
            .bind(kind)
            .bind(attempt)
            .bind(pid)
            .execute(&pool)
            .await?;
    } else {
        let pool = cx.data::<sqlx::SqlitePool>().expect("a pool");
        sqlx::query(sql)
            .bind(step)
            .bind(kind)
            .bind(attempt)
            .bind(pid)
            .execute(&pool)
            .await?;
    }
    Ok(())
}

/// A member of the batch fleet test (`tests/batch_fleet.rs`): records its start and end as
/// `wf_events` rows (step = its label); fails for good when `fail`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FleetMember {
    /// The member's label.
    pub label: String,
    /// Dies at its first attempt.
    pub fail: bool,
}

impl Task for FleetMember {
    const NAME: &'static str = "fleet_member";
    const QUEUE: &'static str = QUEUE;
    const MAX_ATTEMPTS: u32 = 10;

    async fn run(self, cx: TaskContext) -> Result<(), TaskError> {
        let attempt = cx.attempt();
        event(&cx, &self.label, "start", attempt).await?;
        tokio::time::sleep(Duration::from_millis(1)).await;
        event(&cx, &self.label, "end", attempt).await?;
        if self.fail {
            return Err(TaskError::permanent(format!("{} fails", self.label)));
        }
        Ok(())
    }
}
