//! The client's and the operator's statements on tasks: read one, list, count, stats, cancel,
//! request a cancel, retry dead tasks, reschedule, set priority, bulk operations by filter,
//! retention.

use chrono::{DateTime, Utc};
use sqlx::SqliteConnection;
use taskq_driver::rules::retry_retakes_identity;

use crate::clock::{opt_time, time_from_us, time_to_us};
use crate::connect::begin_write;
use crate::identities::release_ended;

/// One task row (MySQL: `client::TaskInfo`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskRow {
    /// Task id.
    pub id: i64,
    /// Queue.
    pub queue: String,
    /// Task name.
    pub name: String,
    /// Payload bytes.
    pub payload: Vec<u8>,
    /// `pending`, `running`, `succeeded`, `dead`, `canceled` or `expired`.
    pub state: String,
    /// Priority (lower first).
    pub priority: i16,
    /// Attempts started.
    pub attempt: u32,
    /// Attempts allowed.
    pub max_attempts: u32,
    /// Due time.
    pub run_at: DateTime<Utc>,
    /// End of the current lease while running.
    pub lease_until: Option<DateTime<Utc>>,
    /// Fencing token.
    pub lease_epoch: i64,
    /// Worker of the latest claim.
    pub worker_id: Option<String>,
    /// Idempotency key.
    pub idempotency_key: Option<String>,
    /// Trace context of the enqueuing request.
    pub trace_context: Option<String>,
    /// Latest failure.
    pub last_error: Option<String>,
    /// The unique identity, lowercase hex.
    pub unique_key: Option<String>,
    /// Whether the task holds its identity now.
    pub unique_held: bool,
    /// Database clock at insert.
    pub created_at: DateTime<Utc>,
    /// Database clock at the latest change.
    pub updated_at: DateTime<Utc>,
    /// When it reached a terminal state.
    pub finished_at: Option<DateTime<Utc>>,
    /// Snoozes so far.
    pub snoozes: u32,
    /// No attempt starts at or after it.
    pub deadline: Option<DateTime<Utc>>,
    /// When the latest attempt started (database clock).
    pub attempted_at: Option<DateTime<Utc>>,
}

/// A task row as read (times as stored).
struct TaskRaw {
    id: i64,
    queue: String,
    name: String,
    payload: Vec<u8>,
    state: String,
    priority: i16,
    attempt: u32,
    max_attempts: u32,
    run_at: i64,
    lease_until: Option<i64>,
    lease_epoch: i64,
    worker_id: Option<String>,
    idempotency_key: Option<String>,
    trace_context: Option<String>,
    last_error: Option<String>,
    unique_key: Option<String>,
    unique_held: bool,
    created_at: i64,
    updated_at: i64,
    finished_at: Option<i64>,
    snoozes: u32,
    deadline: Option<i64>,
    attempted_at: Option<i64>,
}

impl TaskRaw {
    fn into_row(self) -> sqlx::Result<TaskRow> {
        Ok(TaskRow {
            id: self.id,
            queue: self.queue,
            name: self.name,
            payload: self.payload,
            state: self.state,
            priority: self.priority,
            attempt: self.attempt,
            max_attempts: self.max_attempts,
            run_at: time_from_us(self.run_at)?,
            lease_until: opt_time(self.lease_until)?,
            lease_epoch: self.lease_epoch,
            worker_id: self.worker_id,
            idempotency_key: self.idempotency_key,
            trace_context: self.trace_context,
            last_error: self.last_error,
            // SQLite's `hex(NULL)` is `''`: a task without identity has none.
            unique_key: self.unique_key.filter(|k| !k.is_empty()),
            unique_held: self.unique_held,
            created_at: time_from_us(self.created_at)?,
            updated_at: time_from_us(self.updated_at)?,
            finished_at: opt_time(self.finished_at)?,
            snoozes: self.snoozes,
            deadline: opt_time(self.deadline)?,
            attempted_at: opt_time(self.attempted_at)?,
        })
    }
}

/// One task by id.
pub async fn task_get(conn: &mut SqliteConnection, id: i64) -> sqlx::Result<Option<TaskRow>> {
    let raw = sqlx::query_as!(
        TaskRaw,
        r#"SELECT id AS "id!: i64", queue AS "queue!: String", name AS "name!: String",
             payload AS "payload!: Vec<u8>", state AS "state!: String",
             priority AS "priority!: i16", attempt AS "attempt!: u32",
             max_attempts AS "max_attempts!: u32", run_at AS "run_at!: i64",
             lease_until AS "lease_until?: i64", lease_epoch AS "lease_epoch!: i64",
             worker_id AS "worker_id?: String", idempotency_key AS "idempotency_key?: String",
             trace_context AS "trace_context?: String", last_error AS "last_error?: String",
             lower(hex(unique_key)) AS "unique_key?: String",
             EXISTS (SELECT 1 FROM taskq_unique AS u WHERE u.unique_key = taskq_tasks.unique_key
                       AND u.task_id = taskq_tasks.id) AS "unique_held!: bool",
             created_at AS "created_at!: i64", updated_at AS "updated_at!: i64",
             finished_at AS "finished_at?: i64", snoozes AS "snoozes!: u32",
             deadline AS "deadline?: i64", attempted_at AS "attempted_at?: i64"
           FROM taskq_tasks WHERE id = ?1"#,
        id
    )
    .fetch_optional(&mut *conn)
    .await?;
    raw.map(TaskRaw::into_row).transpose()
}

/// Filter of [`task_list`], [`task_count`] and the bulk operations; `None` matches everything.
#[derive(Debug, Clone, Copy, Default)]
pub struct TaskFilter<'a> {
    /// Queue.
    pub queue: Option<&'a str>,
    /// State.
    pub state: Option<&'a str>,
    /// Task name.
    pub name: Option<&'a str>,
}

/// Tasks matching `f` with `after_id < id <= up_to`, by id, at most `limit` (keyset
/// pagination).
pub async fn task_list(
    conn: &mut SqliteConnection,
    f: &TaskFilter<'_>,
    after_id: i64,
    up_to: i64,
    limit: u32,
) -> sqlx::Result<Vec<TaskRow>> {
    let raws = sqlx::query_as!(
        TaskRaw,
        r#"SELECT id AS "id!: i64", queue AS "queue!: String", name AS "name!: String",
             payload AS "payload!: Vec<u8>", state AS "state!: String",
             priority AS "priority!: i16", attempt AS "attempt!: u32",
             max_attempts AS "max_attempts!: u32", run_at AS "run_at!: i64",
             lease_until AS "lease_until?: i64", lease_epoch AS "lease_epoch!: i64",
             worker_id AS "worker_id?: String", idempotency_key AS "idempotency_key?: String",
             trace_context AS "trace_context?: String", last_error AS "last_error?: String",
             lower(hex(unique_key)) AS "unique_key?: String",
             EXISTS (SELECT 1 FROM taskq_unique AS u WHERE u.unique_key = taskq_tasks.unique_key
                       AND u.task_id = taskq_tasks.id) AS "unique_held!: bool",
             created_at AS "created_at!: i64", updated_at AS "updated_at!: i64",
             finished_at AS "finished_at?: i64", snoozes AS "snoozes!: u32",
             deadline AS "deadline?: i64", attempted_at AS "attempted_at?: i64"
           FROM taskq_tasks
           WHERE id > ?1 AND id <= ?6 AND (?2 IS NULL OR queue = ?2)
             AND (?3 IS NULL OR state = ?3) AND (?4 IS NULL OR name = ?4)
           ORDER BY id LIMIT ?5"#,
        after_id,
        f.queue,
        f.state,
        f.name,
        limit,
        up_to,
    )
    .fetch_all(&mut *conn)
    .await?;
    raws.into_iter().map(TaskRaw::into_row).collect()
}

/// Pending tasks (`kind`: `scheduled` or `retrying`) by `(run_at, id)` after the cursor
/// (`after_at` µs, `after_id`), of `queue` when given: a range of the partial `ix_taskq_claim`
/// (pending rows only), sorted.
pub async fn task_list_pending(
    conn: &mut SqliteConnection,
    kind: &str,
    queue: Option<&str>,
    after_at: i64,
    after_id: i64,
    limit: u32,
) -> sqlx::Result<Vec<TaskRow>> {
    let raws = sqlx::query_as!(
        TaskRaw,
        r#"SELECT id AS "id!: i64", queue AS "queue!: String", name AS "name!: String",
             payload AS "payload!: Vec<u8>", state AS "state!: String",
             priority AS "priority!: i16", attempt AS "attempt!: u32",
             max_attempts AS "max_attempts!: u32", run_at AS "run_at!: i64",
             lease_until AS "lease_until?: i64", lease_epoch AS "lease_epoch!: i64",
             worker_id AS "worker_id?: String", idempotency_key AS "idempotency_key?: String",
             trace_context AS "trace_context?: String", last_error AS "last_error?: String",
             lower(hex(unique_key)) AS "unique_key?: String",
             EXISTS (SELECT 1 FROM taskq_unique AS u WHERE u.unique_key = taskq_tasks.unique_key
                       AND u.task_id = taskq_tasks.id) AS "unique_held!: bool",
             created_at AS "created_at!: i64", updated_at AS "updated_at!: i64",
             finished_at AS "finished_at?: i64", snoozes AS "snoozes!: u32",
             deadline AS "deadline?: i64", attempted_at AS "attempted_at?: i64"
           FROM taskq_tasks
           WHERE state = 'pending' AND (?2 IS NULL OR queue = ?2)
             AND CASE WHEN ?1 = 'retrying' THEN attempt > 0
                      ELSE run_at > (SELECT us FROM taskq_clock) END
             AND (run_at > ?3 OR (run_at = ?3 AND id > ?4))
           ORDER BY run_at, id LIMIT ?5"#,
        kind,
        queue,
        after_at,
        after_id,
        limit,
    )
    .fetch_all(&mut *conn)
    .await?;
    raws.into_iter().map(TaskRaw::into_row).collect()
}

/// Tasks matching `f` with `from <= id < before_id`, newest id first (the dashboard's keyset
/// page).
pub async fn task_list_desc(
    conn: &mut SqliteConnection,
    f: &TaskFilter<'_>,
    before_id: i64,
    from: i64,
    limit: u32,
) -> sqlx::Result<Vec<TaskRow>> {
    let raws = sqlx::query_as!(
        TaskRaw,
        r#"SELECT id AS "id!: i64", queue AS "queue!: String", name AS "name!: String",
             payload AS "payload!: Vec<u8>", state AS "state!: String",
             priority AS "priority!: i16", attempt AS "attempt!: u32",
             max_attempts AS "max_attempts!: u32", run_at AS "run_at!: i64",
             lease_until AS "lease_until?: i64", lease_epoch AS "lease_epoch!: i64",
             worker_id AS "worker_id?: String", idempotency_key AS "idempotency_key?: String",
             trace_context AS "trace_context?: String", last_error AS "last_error?: String",
             lower(hex(unique_key)) AS "unique_key?: String",
             EXISTS (SELECT 1 FROM taskq_unique AS u WHERE u.unique_key = taskq_tasks.unique_key
                       AND u.task_id = taskq_tasks.id) AS "unique_held!: bool",
             created_at AS "created_at!: i64", updated_at AS "updated_at!: i64",
             finished_at AS "finished_at?: i64", snoozes AS "snoozes!: u32",
             deadline AS "deadline?: i64", attempted_at AS "attempted_at?: i64"
           FROM taskq_tasks
           WHERE id < ?1 AND id >= ?6 AND (?2 IS NULL OR queue = ?2)
             AND (?3 IS NULL OR state = ?3) AND (?4 IS NULL OR name = ?4)
           ORDER BY id DESC LIMIT ?5"#,
        before_id,
        f.queue,
        f.state,
        f.name,
        limit,
        from,
    )
    .fetch_all(&mut *conn)
    .await?;
    raws.into_iter().map(TaskRaw::into_row).collect()
}

/// Smallest and largest task id (`(0, 0)` when there is none): the ends of the rowid.
pub async fn task_id_bounds(conn: &mut SqliteConnection) -> sqlx::Result<(i64, i64)> {
    let r = sqlx::query!(
        r#"SELECT COALESCE(MIN(id), 0) AS "lo!: i64", COALESCE(MAX(id), 0) AS "hi!: i64"
           FROM taskq_tasks"#
    )
    .fetch_one(&mut *conn)
    .await?;
    Ok((r.lo, r.hi))
}

/// Tasks of `queue` (and `name`, when given), in every state, with `id < before_id`, newest id
/// first, at most `limit`. (MySQL reads them through `ix_taskq_claim`, which covers every
/// state there; here that index holds pending rows only, so this walks the rowid backwards
/// from `before_id`, reading rows until `limit` match: cheap for a queue with recent tasks,
/// a long walk for a small queue in a big table.)
pub async fn task_list_queue_desc(
    conn: &mut SqliteConnection,
    queue: &str,
    name: Option<&str>,
    before_id: i64,
    limit: u32,
) -> sqlx::Result<Vec<TaskRow>> {
    let raws = sqlx::query_as!(
        TaskRaw,
        r#"SELECT id AS "id!: i64", queue AS "queue!: String", name AS "name!: String",
             payload AS "payload!: Vec<u8>", state AS "state!: String",
             priority AS "priority!: i16", attempt AS "attempt!: u32",
             max_attempts AS "max_attempts!: u32", run_at AS "run_at!: i64",
             lease_until AS "lease_until?: i64", lease_epoch AS "lease_epoch!: i64",
             worker_id AS "worker_id?: String", idempotency_key AS "idempotency_key?: String",
             trace_context AS "trace_context?: String", last_error AS "last_error?: String",
             lower(hex(unique_key)) AS "unique_key?: String",
             EXISTS (SELECT 1 FROM taskq_unique AS u WHERE u.unique_key = taskq_tasks.unique_key
                       AND u.task_id = taskq_tasks.id) AS "unique_held!: bool",
             created_at AS "created_at!: i64", updated_at AS "updated_at!: i64",
             finished_at AS "finished_at?: i64", snoozes AS "snoozes!: u32",
             deadline AS "deadline?: i64", attempted_at AS "attempted_at?: i64"
           FROM taskq_tasks
           WHERE queue = ?1 AND (?2 IS NULL OR name = ?2) AND id < ?3
           ORDER BY id DESC LIMIT ?4"#,
        queue,
        name,
        before_id,
        limit,
    )
    .fetch_all(&mut *conn)
    .await?;
    raws.into_iter().map(TaskRaw::into_row).collect()
}

/// Like [`task_list_queue_desc`], `id > after_id`, oldest id first.
pub async fn task_list_queue_asc(
    conn: &mut SqliteConnection,
    queue: &str,
    name: Option<&str>,
    after_id: i64,
    limit: u32,
) -> sqlx::Result<Vec<TaskRow>> {
    let raws = sqlx::query_as!(
        TaskRaw,
        r#"SELECT id AS "id!: i64", queue AS "queue!: String", name AS "name!: String",
             payload AS "payload!: Vec<u8>", state AS "state!: String",
             priority AS "priority!: i16", attempt AS "attempt!: u32",
             max_attempts AS "max_attempts!: u32", run_at AS "run_at!: i64",
             lease_until AS "lease_until?: i64", lease_epoch AS "lease_epoch!: i64",
             worker_id AS "worker_id?: String", idempotency_key AS "idempotency_key?: String",
             trace_context AS "trace_context?: String", last_error AS "last_error?: String",
             lower(hex(unique_key)) AS "unique_key?: String",
             EXISTS (SELECT 1 FROM taskq_unique AS u WHERE u.unique_key = taskq_tasks.unique_key
                       AND u.task_id = taskq_tasks.id) AS "unique_held!: bool",
             created_at AS "created_at!: i64", updated_at AS "updated_at!: i64",
             finished_at AS "finished_at?: i64", snoozes AS "snoozes!: u32",
             deadline AS "deadline?: i64", attempted_at AS "attempted_at?: i64"
           FROM taskq_tasks
           WHERE queue = ?1 AND (?2 IS NULL OR name = ?2) AND id > ?3
           ORDER BY id LIMIT ?4"#,
        queue,
        name,
        after_id,
        limit,
    )
    .fetch_all(&mut *conn)
    .await?;
    raws.into_iter().map(TaskRaw::into_row).collect()
}

/// `(name, run µs)` of the tasks that succeeded in the last `minutes` (`finished_at -
/// attempted_at`), newest first, at most `limit`: a range of `ix_taskq_finished`.
pub async fn task_run_times(
    conn: &mut SqliteConnection,
    minutes: u32,
    limit: u32,
) -> sqlx::Result<Vec<(String, i64)>> {
    let rows = sqlx::query!(
        r#"SELECT name AS "name!: String", finished_at - attempted_at AS "run_us!: i64"
           FROM taskq_tasks
           WHERE state = 'succeeded' AND finished_at IS NOT NULL
             AND finished_at > (SELECT us FROM taskq_clock) - ?1 * 60000000
             AND attempted_at IS NOT NULL
           ORDER BY finished_at DESC LIMIT ?2"#,
        minutes,
        limit
    )
    .fetch_all(&mut *conn)
    .await?;
    Ok(rows.into_iter().map(|r| (r.name, r.run_us)).collect())
}

/// Terminal tasks per state and minute over the last `minutes` minutes (database clock):
/// `(state, minutes ago, count)`, minute 0 being the last 60 seconds. A range read of
/// `ix_taskq_finished` per state.
pub async fn task_finished_per_minute(
    conn: &mut SqliteConnection,
    minutes: u32,
) -> sqlx::Result<Vec<(String, u32, u64)>> {
    let window_us = i64::from(minutes) * 60_000_000;
    let rows = sqlx::query!(
        r#"SELECT state AS "state!: String",
             ((SELECT us FROM taskq_clock) - finished_at) / 60000000 AS "ago!: i64",
             COUNT(*) AS "n!: i64"
           FROM taskq_tasks
           WHERE state IN ('succeeded', 'dead', 'canceled', 'expired')
             AND finished_at > (SELECT us FROM taskq_clock) - ?1
           GROUP BY 1, 2
           ORDER BY 1, 2"#,
        window_us
    )
    .fetch_all(&mut *conn)
    .await?;
    Ok(rows
        .into_iter()
        .filter(|r| r.ago >= 0 && r.ago < i64::from(minutes))
        .map(|r| (r.state, r.ago as u32, r.n.max(0) as u64))
        .collect())
}

/// How many tasks in terminal `state` finished more than `age_secs` ago (what [`task_prune`]
/// would delete, without its limit).
pub async fn task_prune_count(
    conn: &mut SqliteConnection,
    state: &str,
    age_secs: u64,
) -> sqlx::Result<u64> {
    let age_us = i64::try_from(age_secs.saturating_mul(1_000_000)).unwrap_or(i64::MAX);
    let n = sqlx::query_scalar!(
        r#"SELECT COUNT(*) AS "n!: i64" FROM taskq_tasks
           WHERE state = ?1 AND finished_at < (SELECT us FROM taskq_clock) - ?2"#,
        state,
        age_us
    )
    .fetch_one(&mut *conn)
    .await?;
    Ok(n.max(0) as u64)
}

/// Number of tasks matching `f`.
pub async fn task_count(conn: &mut SqliteConnection, f: &TaskFilter<'_>) -> sqlx::Result<u64> {
    let n = sqlx::query_scalar!(
        r#"SELECT COUNT(*) AS "n!: i64" FROM taskq_tasks
           WHERE (?1 IS NULL OR queue = ?1) AND (?2 IS NULL OR state = ?2)
             AND (?3 IS NULL OR name = ?3)"#,
        f.queue,
        f.state,
        f.name,
    )
    .fetch_one(&mut *conn)
    .await?;
    Ok(n.max(0) as u64)
}

/// The state of one task, or `None` when the id does not exist.
pub async fn task_state(conn: &mut SqliteConnection, id: i64) -> sqlx::Result<Option<String>> {
    sqlx::query_scalar!(
        r#"SELECT state AS "state!: String" FROM taskq_tasks WHERE id = ?1"#,
        id
    )
    .fetch_optional(&mut *conn)
    .await
}

/// Count of one queue × state (MySQL: `client::QueueStateCount`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueStateCount {
    /// Queue.
    pub queue: String,
    /// State.
    pub state: String,
    /// Tasks.
    pub count: u64,
    /// Earliest `run_at` among them.
    pub oldest_run_at: Option<DateTime<Utc>>,
    /// Earliest `lease_until` among them.
    pub earliest_lease_until: Option<DateTime<Utc>>,
}

/// Counts by queue and state, ordered by queue and state.
pub async fn task_stats(conn: &mut SqliteConnection) -> sqlx::Result<Vec<QueueStateCount>> {
    let rows = sqlx::query!(
        r#"SELECT queue AS "queue!: String", state AS "state!: String", COUNT(*) AS "count!: i64",
             MIN(run_at) AS "oldest_run_at?: i64", MIN(lease_until) AS "earliest_lease_until?: i64"
           FROM taskq_tasks GROUP BY queue, state ORDER BY queue, state"#
    )
    .fetch_all(&mut *conn)
    .await?;
    rows.into_iter()
        .map(|r| {
            Ok(QueueStateCount {
                queue: r.queue,
                state: r.state,
                count: r.count.max(0) as u64,
                oldest_run_at: opt_time(r.oldest_run_at)?,
                earliest_lease_until: opt_time(r.earliest_lease_until)?,
            })
        })
        .collect()
}

/// Counts by queue of the pending and running tasks with the earliest `run_at`, ordered by
/// queue and state; `earliest_lease_until` is `None`, as on MySQL (whose `task_stats` reads
/// the leases apart; [`task_stats`] here has them).
pub async fn task_stats_active(conn: &mut SqliteConnection) -> sqlx::Result<Vec<QueueStateCount>> {
    let rows = sqlx::query!(
        r#"SELECT queue AS "queue!: String", state AS "state!: String", COUNT(*) AS "count!: i64",
             MIN(run_at) AS "oldest_run_at?: i64"
           FROM taskq_tasks WHERE state IN ('pending', 'running')
           GROUP BY queue, state ORDER BY queue, state"#
    )
    .fetch_all(&mut *conn)
    .await?;
    rows.into_iter()
        .map(|r| {
            Ok(QueueStateCount {
                queue: r.queue,
                state: r.state,
                count: r.count.max(0) as u64,
                oldest_run_at: opt_time(r.oldest_run_at)?,
                earliest_lease_until: None,
            })
        })
        .collect()
}

/// Counts by queue of the tasks in terminal states with the earliest `run_at`, ordered by
/// queue and state (`earliest_lease_until` is `None`).
pub async fn task_stats_terminal(
    conn: &mut SqliteConnection,
) -> sqlx::Result<Vec<QueueStateCount>> {
    let rows = sqlx::query!(
        r#"SELECT queue AS "queue!: String", state AS "state!: String", COUNT(*) AS "count!: i64",
             MIN(run_at) AS "oldest_run_at?: i64"
           FROM taskq_tasks WHERE state IN ('succeeded', 'dead', 'canceled', 'expired')
           GROUP BY queue, state ORDER BY queue, state"#
    )
    .fetch_all(&mut *conn)
    .await?;
    rows.into_iter()
        .map(|r| {
            Ok(QueueStateCount {
                queue: r.queue,
                state: r.state,
                count: r.count.max(0) as u64,
                oldest_run_at: opt_time(r.oldest_run_at)?,
                earliest_lease_until: None,
            })
        })
        .collect()
}

/// Pending tasks of one queue × name (MySQL: `client::PendingNameCount`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingNameCount {
    /// Queue.
    pub queue: String,
    /// Task name.
    pub name: String,
    /// Pending tasks.
    pub pending: u64,
    /// Of which due now.
    pub due: u64,
    /// Earliest `run_at`.
    pub oldest_run_at: DateTime<Utc>,
}

/// Pending tasks per queue and name (of `queue` only, when given): how many, how many are
/// due, the earliest `run_at`. Reads the partial claim index only.
pub async fn task_pending_by_name(
    conn: &mut SqliteConnection,
    queue: Option<&str>,
) -> sqlx::Result<Vec<PendingNameCount>> {
    let rows = sqlx::query!(
        r#"SELECT queue AS "queue!: String", name AS "name!: String", COUNT(*) AS "pending!: i64",
             SUM(run_at <= (SELECT us FROM taskq_clock)) AS "due!: i64",
             MIN(run_at) AS "oldest_run_at!: i64"
           FROM taskq_tasks
           WHERE state = 'pending' AND (?1 IS NULL OR queue = ?1)
           GROUP BY queue, name ORDER BY queue, name"#,
        queue
    )
    .fetch_all(&mut *conn)
    .await?;
    rows.into_iter()
        .map(|r| {
            Ok(PendingNameCount {
                queue: r.queue,
                name: r.name,
                pending: r.pending.max(0) as u64,
                due: r.due.max(0) as u64,
                oldest_run_at: time_from_us(r.oldest_run_at)?,
            })
        })
        .collect()
}

/// Cancels a pending task (freeing the unique identity it holds); returns whether it was
/// pending.
pub async fn task_cancel(conn: &mut SqliteConnection, id: i64) -> sqlx::Result<bool> {
    Ok(task_cancel_batch(conn, &[id]).await? == 1)
}

/// Cancels the pending tasks among `ids` (freeing their unique identities) in one
/// transaction; returns how many.
pub async fn task_cancel_batch(conn: &mut SqliteConnection, ids: &[i64]) -> sqlx::Result<u64> {
    if ids.is_empty() {
        return Ok(0);
    }
    let json = serde_json::to_string(ids).map_err(|e| sqlx::Error::Encode(Box::new(e)))?;
    let mut tx = begin_write(conn).await?;
    let rows = sqlx::query!(
        r#"UPDATE taskq_tasks AS t
           SET state = 'canceled', finished_at = c.us, updated_at = c.us
           FROM taskq_clock AS c
           WHERE t.id IN (SELECT value FROM json_each(?1)) AND t.state = 'pending'
           RETURNING id AS "id!: i64", (unique_key IS NOT NULL) AS "unique!: bool""#,
        json
    )
    .fetch_all(&mut *tx)
    .await?;
    let unique: Vec<i64> = rows.iter().filter(|r| r.unique).map(|r| r.id).collect();
    release_ended(&mut tx, &unique).await?;
    tx.commit().await?;
    Ok(rows.len() as u64)
}

/// Deletes a task that is not running, and the unique identity it holds; whether a row was
/// deleted.
pub async fn task_delete(conn: &mut SqliteConnection, id: i64) -> sqlx::Result<bool> {
    let mut tx = begin_write(conn).await?;
    sqlx::query!(
        r#"DELETE FROM taskq_unique
           WHERE task_id = ?1
             AND unique_key = (SELECT unique_key FROM taskq_tasks WHERE id = ?1 AND state <> 'running')"#,
        id
    )
    .execute(&mut *tx)
    .await?;
    let done = sqlx::query!(
        r#"DELETE FROM taskq_tasks WHERE id = ?1 AND state <> 'running'"#,
        id
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(done.rows_affected() == 1)
}

/// Records a cancel request on a running task (kept from the first request); returns whether
/// the task was running. The worker's heartbeat stops renewing it and reports the request.
pub async fn task_request_cancel(conn: &mut SqliteConnection, id: i64) -> sqlx::Result<bool> {
    Ok(task_request_cancel_batch(conn, &[id]).await? == 1)
}

/// Records a cancel request on the running tasks among `ids`; returns how many were running.
pub async fn task_request_cancel_batch(
    conn: &mut SqliteConnection,
    ids: &[i64],
) -> sqlx::Result<u64> {
    if ids.is_empty() {
        return Ok(0);
    }
    let json = serde_json::to_string(ids).map_err(|e| sqlx::Error::Encode(Box::new(e)))?;
    let done = sqlx::query!(
        r#"UPDATE taskq_tasks AS t
           SET cancel_requested_at = COALESCE(t.cancel_requested_at, c.us), updated_at = c.us
           FROM taskq_clock AS c
           WHERE t.id IN (SELECT value FROM json_each(?1)) AND t.state = 'running'"#,
        json
    )
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected())
}

/// Moves a pending task's due time to `at`, or to `delay_us` from the database's now when
/// `at` is `None`; returns whether it was pending.
pub async fn task_reschedule(
    conn: &mut SqliteConnection,
    id: i64,
    at: Option<DateTime<Utc>>,
    delay_us: i64,
) -> sqlx::Result<bool> {
    let at = at.map(time_to_us);
    let done = sqlx::query!(
        r#"UPDATE taskq_tasks AS t
           SET run_at = COALESCE(?2, c.us + ?3), updated_at = c.us
           FROM taskq_clock AS c
           WHERE t.id = ?1 AND t.state = 'pending'"#,
        id,
        at,
        delay_us
    )
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Sets a pending task's priority; returns whether it was pending.
pub async fn task_set_priority(
    conn: &mut SqliteConnection,
    id: i64,
    priority: i16,
) -> sqlx::Result<bool> {
    let done = sqlx::query!(
        r#"UPDATE taskq_tasks AS t SET priority = ?2, updated_at = c.us
           FROM taskq_clock AS c
           WHERE t.id = ?1 AND t.state = 'pending'"#,
        id,
        priority
    )
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Outcome of [`task_retry_dead`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryDead {
    /// Pending again.
    Retried,
    /// The task does not exist or is not dead.
    NotDead,
    /// Another task holds the dead task's unique identity; nothing changed.
    IdentityHeld(i64),
}

/// Moves a dead task back to pending (due now) with attempts reset and epoch + 1. A task
/// unique while pending or running takes its identity back, which fails (and changes nothing)
/// when another task holds it meanwhile; a windowed one does not (as on MySQL).
pub async fn task_retry_dead(conn: &mut SqliteConnection, id: i64) -> sqlx::Result<RetryDead> {
    let mut tx = begin_write(conn).await?;
    let row = sqlx::query!(
        r#"SELECT unique_key AS "unique_key?: Vec<u8>", unique_while AS "unique_while?: String"
           FROM taskq_tasks WHERE id = ?1 AND state = 'dead'"#,
        id
    )
    .fetch_optional(&mut *tx)
    .await?;
    let Some(row) = row else {
        return Ok(RetryDead::NotDead);
    };
    let retake = row.unique_key.filter(|_| {
        row.unique_while
            .as_deref()
            .is_some_and(retry_retakes_identity)
    });
    if let Some(key) = retake {
        let taken = sqlx::query!(
            r#"INSERT INTO taskq_unique (unique_key, task_id, expires_at) VALUES (?1, ?2, NULL)
               ON CONFLICT (unique_key) DO NOTHING"#,
            key,
            id
        )
        .execute(&mut *tx)
        .await?;
        if taken.rows_affected() == 0 {
            let holder = sqlx::query_scalar!(
                r#"SELECT task_id AS "task_id!: i64" FROM taskq_unique WHERE unique_key = ?1"#,
                key
            )
            .fetch_one(&mut *tx)
            .await?;
            if holder != id {
                return Ok(RetryDead::IdentityHeld(holder));
            }
        }
    }
    sqlx::query!(
        r#"UPDATE taskq_tasks AS t
           SET state = 'pending', attempt = 0, lease_epoch = t.lease_epoch + 1, run_at = c.us,
               finished_at = NULL, lease_until = NULL, updated_at = c.us
           FROM taskq_clock AS c
           WHERE t.id = ?1 AND t.state = 'dead'"#,
        id
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(RetryDead::Retried)
}

/// Retries the dead tasks among `ids` that hold no identity to take back (not unique, or
/// unique per window); returns how many. (Unique ones go one by one, [`task_retry_dead`].)
pub async fn task_retry_dead_ids(conn: &mut SqliteConnection, ids: &[i64]) -> sqlx::Result<u64> {
    if ids.is_empty() {
        return Ok(0);
    }
    let json = serde_json::to_string(ids).map_err(|e| sqlx::Error::Encode(Box::new(e)))?;
    let done = sqlx::query!(
        r#"UPDATE taskq_tasks AS t
           SET state = 'pending', attempt = 0, lease_epoch = t.lease_epoch + 1, run_at = c.us,
               finished_at = NULL, lease_until = NULL, updated_at = c.us
           FROM taskq_clock AS c
           WHERE t.id IN (SELECT value FROM json_each(?1)) AND t.state = 'dead'
             AND (t.unique_key IS NULL OR t.unique_while = 'window')"#,
        json
    )
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected())
}

/// Moves up to `limit` dead tasks that take no identity back (of `queue`, or of every queue)
/// that died at or before `died_before` back to pending, like [`task_retry_dead_ids`], oldest
/// death first. The bound keeps a bulk retry from picking up tasks that die again while it
/// runs. Returns the count.
pub async fn task_retry_dead_batch(
    conn: &mut SqliteConnection,
    queue: Option<&str>,
    died_before: DateTime<Utc>,
    limit: u32,
) -> sqlx::Result<u64> {
    let died_before = time_to_us(died_before);
    let done = sqlx::query!(
        r#"UPDATE taskq_tasks AS t
           SET state = 'pending', attempt = 0, lease_epoch = t.lease_epoch + 1, run_at = c.us,
               finished_at = NULL, lease_until = NULL, updated_at = c.us
           FROM taskq_clock AS c
           WHERE t.id IN (
             SELECT id FROM taskq_tasks
             WHERE state = 'dead' AND (finished_at IS NULL OR finished_at <= ?1)
               AND (?2 IS NULL OR queue = ?2)
               AND (unique_key IS NULL OR unique_while = 'window')
             ORDER BY finished_at, id
             LIMIT ?3)"#,
        died_before,
        queue,
        limit
    )
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected())
}

/// Up to `limit` ids above `after_id` of dead tasks unique while pending or running (of
/// `queue`, or of every queue) that died at or before `died_before`, ascending.
pub async fn task_dead_unique_ids(
    conn: &mut SqliteConnection,
    queue: Option<&str>,
    died_before: DateTime<Utc>,
    after_id: i64,
    limit: u32,
) -> sqlx::Result<Vec<i64>> {
    let died_before = time_to_us(died_before);
    sqlx::query_scalar!(
        r#"SELECT id AS "id!: i64" FROM taskq_tasks
           WHERE state = 'dead' AND (finished_at IS NULL OR finished_at <= ?1)
             AND (?2 IS NULL OR queue = ?2) AND unique_key IS NOT NULL
             AND unique_while <> 'window' AND id > ?3
           ORDER BY id
           LIMIT ?4"#,
        died_before,
        queue,
        after_id,
        limit
    )
    .fetch_all(&mut *conn)
    .await
}

/// Ids (ascending, `> after_id`, at most `limit`) of tasks in `state` matching `f`'s queue and
/// name, created at least `age_us` ago (database clock); with whether the task holds an
/// identity only a one-row retry can take back (unique, not per window).
pub async fn task_bulk_ids(
    conn: &mut SqliteConnection,
    state: &str,
    f: &TaskFilter<'_>,
    age_us: i64,
    after_id: i64,
    limit: u32,
) -> sqlx::Result<Vec<(i64, bool)>> {
    let rows = sqlx::query!(
        r#"SELECT id AS "id!: i64",
             (unique_key IS NOT NULL AND unique_while <> 'window') AS "held!: bool"
           FROM taskq_tasks
           WHERE state = ?1 AND (?2 IS NULL OR queue = ?2) AND (?3 IS NULL OR name = ?3)
             AND created_at <= (SELECT us FROM taskq_clock) - ?4 AND id > ?5
           ORDER BY id
           LIMIT ?6"#,
        state,
        f.queue,
        f.name,
        age_us,
        after_id,
        limit
    )
    .fetch_all(&mut *conn)
    .await?;
    Ok(rows.into_iter().map(|r| (r.id, r.held)).collect())
}

/// How many tasks in `state` match `f`'s queue and name and were created at least `age_us`
/// ago (the dry run of a bulk operation).
pub async fn task_bulk_count(
    conn: &mut SqliteConnection,
    state: &str,
    f: &TaskFilter<'_>,
    age_us: i64,
) -> sqlx::Result<u64> {
    let n = sqlx::query_scalar!(
        r#"SELECT COUNT(*) AS "n!: i64" FROM taskq_tasks
           WHERE state = ?1 AND (?2 IS NULL OR queue = ?2) AND (?3 IS NULL OR name = ?3)
             AND created_at <= (SELECT us FROM taskq_clock) - ?4"#,
        state,
        f.queue,
        f.name,
        age_us
    )
    .fetch_one(&mut *conn)
    .await?;
    Ok(n.max(0) as u64)
}

/// Deletes up to `limit` tasks in terminal `state` that finished more than `age_secs` ago,
/// oldest first (on the partial index `ix_taskq_finished`). Returns the count.
pub async fn task_prune(
    conn: &mut SqliteConnection,
    state: &str,
    age_secs: u64,
    limit: u32,
) -> sqlx::Result<u64> {
    let age_us = i64::try_from(age_secs.saturating_mul(1_000_000)).unwrap_or(i64::MAX);
    let done = sqlx::query!(
        r#"DELETE FROM taskq_tasks
           WHERE id IN (
             SELECT id FROM taskq_tasks
             WHERE state = ?1 AND finished_at < (SELECT us FROM taskq_clock) - ?2
             ORDER BY finished_at
             LIMIT ?3)"#,
        state,
        age_us,
        limit
    )
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected())
}
