//! Task rows written and read with plain SQL, for pages that must show any value the database
//! can hold (names, queues, payloads and errors no taskq API would produce).

use taskq_tests::TestDb;

/// A task row to insert with [`insert_row`]; `Default` is a pending `t` task in queue `q`
/// with payload `{}`.
#[derive(Debug, Clone)]
pub struct Row<'a> {
    pub queue: &'a str,
    pub name: &'a str,
    /// Stored as bytes, as is (need not be JSON).
    pub payload: &'a str,
    /// `pending`, `running`, `succeeded`, `dead` or `canceled`; terminal states get
    /// `finished_at` = now.
    pub state: &'a str,
    pub last_error: Option<&'a str>,
    pub worker_id: Option<&'a str>,
}

impl Default for Row<'_> {
    fn default() -> Self {
        Row {
            queue: "q",
            name: "t",
            payload: "{}",
            state: "pending",
            last_error: None,
            worker_id: None,
        }
    }
}

/// Inserts `row` (attempt 1 of 3, due now) and returns its id.
pub async fn insert_row(db: &TestDb, row: Row<'_>) -> u64 {
    sqlx::query(
        "INSERT INTO taskq_tasks (queue, name, payload, state, max_attempts, attempt, run_at,
             created_at, updated_at, finished_at, last_error, worker_id)
         VALUES (?, ?, ?, ?, 3, 1, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6),
                 IF(? IN ('succeeded', 'dead', 'canceled'), UTC_TIMESTAMP(6), NULL), ?, ?)",
    )
    .bind(row.queue)
    .bind(row.name)
    .bind(row.payload.as_bytes())
    .bind(row.state)
    .bind(row.state)
    .bind(row.last_error)
    .bind(row.worker_id)
    .execute(&db.pool)
    .await
    .expect("insert a task row")
    .last_insert_id()
}

/// The state of task `id` (`None` when there is no such row).
pub async fn state_of_row(db: &TestDb, id: u64) -> Option<String> {
    sqlx::query_scalar("SELECT CAST(state AS CHAR) FROM taskq_tasks WHERE id = ?")
        .bind(id)
        .fetch_optional(&db.pool)
        .await
        .expect("read a task's state")
}
