//! The task of the ordered fleet test (`tests/ordered_fleet.rs`), shared with its worker
//! process (`tests/bin/ordered_worker.rs`).
//!
//! `LedgerEntry` is ordered by `account`. Its handler records its start and its end as rows of
//! `ordered_events` (an auto-increment id per event: an event inserted after another one's
//! insert returned has a larger id, whichever process wrote them), so the test can tell from
//! the ids alone whether two runs of one key overlapped and in which order they ran.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use taskq::{Task, TaskContext, TaskError};

/// The queue of the fleet test.
pub const QUEUE: &str = "ledger";

/// One ledger entry of `account`: the `version`-th committed change of the account.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LedgerEntry {
    pub account: i64,
    pub version: i64,
    /// Fail the first attempt (retried after 200 ms).
    pub fail_once: bool,
    /// Sleep this long in the first attempt (the test kills the worker meanwhile).
    pub slow_ms: u64,
}

impl Task for LedgerEntry {
    const NAME: &'static str = "ledger_entry";
    const QUEUE: &'static str = QUEUE;
    const MAX_ATTEMPTS: u32 = 10;
    const ORDERED: Option<taskq::ordered::Ordered> =
        Some(taskq::ordered::Ordered::by(&["account"]));

    async fn run(self, cx: TaskContext) -> Result<(), TaskError> {
        let attempt = cx.attempt();
        event(&cx, &self, "start", attempt).await?;
        if attempt == 1 && self.slow_ms > 0 {
            tokio::time::sleep(Duration::from_millis(self.slow_ms)).await;
        } else {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        event(&cx, &self, "end", attempt).await?;
        if attempt == 1 && self.fail_once {
            return Err(TaskError::retry_after(
                Duration::from_millis(200),
                std::io::Error::other("first attempt fails"),
            ));
        }
        Ok(())
    }
}

async fn event(
    cx: &TaskContext,
    t: &LedgerEntry,
    kind: &str,
    attempt: u32,
) -> Result<(), TaskError> {
    let pid = i64::from(std::process::id());
    let sql =
        "INSERT INTO ordered_events (account, version, kind, attempt, pid) VALUES (?, ?, ?, ?, ?)";
    if let Some(pool) = cx.data::<sqlx::MySqlPool>() {
        sqlx::query(sql)
            .bind(t.account)
            .bind(t.version)
            .bind(kind)
            .bind(attempt)
            .bind(pid)
            .execute(&pool)
            .await?;
    } else {
        let pool = cx.data::<sqlx::SqlitePool>().expect("a pool");
        sqlx::query(sql)
            .bind(t.account)
            .bind(t.version)
            .bind(kind)
            .bind(attempt)
            .bind(pid)
            .execute(&pool)
            .await?;
    }
    Ok(())
}
