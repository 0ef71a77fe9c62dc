//! The client's and the operator's statements on tasks. Here the reads: one task, pages of
//! tasks, counts and statistics, and the tasks a bulk action would touch; in `actions` what
//! changes them (cancel, delete, reschedule, set priority, retry, prune).

mod actions;

pub(crate) use actions::{
    task_cancel, task_cancel_batch, task_delete, task_prune, task_request_cancel,
    task_request_cancel_batch, task_reschedule, task_retry_dead, task_retry_dead_batch,
    task_retry_dead_ids, task_set_priority,
};

use chrono::{DateTime, Utc};
use sqlx::SqliteConnection;
use taskq_driver::read::{PendingNameCount, QueueStateCount, TaskInfo};
use taskq_driver::rows::{PendingKind, TaskFilter};
use taskq_driver::rules;
use taskq_driver::state::{TaskId, TaskState};

use crate::clock::{opt_time, time_from_us, time_to_us};
use crate::conv::{sid, state, uid};

/// `sqlx::query_as!(TaskRaw, "SELECT <every column of a TaskRaw> FROM taskq_tasks " + $rest, args..)`:
/// the task columns are written once here (`query_as!` needs literal SQL, and takes
/// `"..." + "..."`); `$rest` is the statement after `FROM taskq_tasks` (`WHERE ..`).
macro_rules! select_tasks {
    ($rest:literal $(, $arg:expr)* $(,)?) => {
        sqlx::query_as!(
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
             deadline AS "deadline?: i64", attempted_at AS "attempted_at?: i64",
             output AS "output?: String"
           FROM taskq_tasks "# + $rest
            $(, $arg)*
        )
    };
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
    output: Option<String>,
}

impl TaskRaw {
    fn into_info(self) -> sqlx::Result<TaskInfo> {
        Ok(TaskInfo {
            id: TaskId(uid(self.id)),
            queue: self.queue,
            name: self.name,
            payload: self.payload,
            state: state(&self.state)?,
            priority: self.priority,
            attempt: self.attempt,
            max_attempts: self.max_attempts,
            run_at: time_from_us(self.run_at)?,
            lease_until: opt_time(self.lease_until)?,
            lease_epoch: uid(self.lease_epoch),
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
            output: self.output,
        })
    }
}

/// One task by id.
pub(crate) async fn task_get(
    conn: &mut SqliteConnection,
    id: TaskId,
) -> sqlx::Result<Option<TaskInfo>> {
    let id = sid(id.0);
    let raw = select_tasks!(r#"WHERE id = ?1"#, id)
        .fetch_optional(&mut *conn)
        .await?;
    raw.map(TaskRaw::into_info).transpose()
}

/// Tasks matching `f` with `after_id < id <= up_to`, by id, at most `limit` (keyset
/// pagination).
pub(crate) async fn task_list(
    conn: &mut SqliteConnection,
    f: &TaskFilter<'_>,
    after_id: u64,
    up_to: u64,
    limit: u32,
) -> sqlx::Result<Vec<TaskInfo>> {
    let (after_id, up_to, st) = (sid(after_id), sid(up_to), f.state.map(TaskState::as_str));
    let raws = select_tasks!(
        r#"WHERE id > ?1 AND id <= ?6 AND (?2 IS NULL OR queue = ?2)
             AND (?3 IS NULL OR state = ?3) AND (?4 IS NULL OR name = ?4)
           ORDER BY id LIMIT ?5"#,
        after_id,
        f.queue,
        st,
        f.name,
        limit,
        up_to,
    )
    .fetch_all(&mut *conn)
    .await?;
    raws.into_iter().map(TaskRaw::into_info).collect()
}

/// Pending tasks of `kind` by `(run_at, id)` after the cursor
/// (`after_at` µs, `after_id`), of `queue` when given. Scheduled: a range of the partial
/// `ix_taskq_claim` (pending rows only), sorted. Retrying: a keyset range of the partial
/// `ix_taskq_retrying` (exactly the pending rows with `attempt > 0`), in order.
pub(crate) async fn task_list_pending(
    conn: &mut SqliteConnection,
    kind: PendingKind,
    queue: Option<&str>,
    after_at: i64,
    after_id: i64,
    limit: u32,
) -> sqlx::Result<Vec<TaskInfo>> {
    let raws = if kind == PendingKind::Retrying {
        select_tasks!(
            r#"INDEXED BY ix_taskq_retrying
           WHERE state = 'pending' AND attempt > 0 AND (?1 IS NULL OR queue = ?1)
             AND (run_at > ?2 OR (run_at = ?2 AND id > ?3))
           ORDER BY run_at, id LIMIT ?4"#,
            queue,
            after_at,
            after_id,
            limit,
        )
        .fetch_all(&mut *conn)
        .await?
    } else {
        select_tasks!(
            r#"WHERE state = 'pending' AND (?1 IS NULL OR queue = ?1)
             AND run_at > (SELECT us FROM taskq_clock)
             AND (run_at > ?2 OR (run_at = ?2 AND id > ?3))
           ORDER BY run_at, id LIMIT ?4"#,
            queue,
            after_at,
            after_id,
            limit,
        )
        .fetch_all(&mut *conn)
        .await?
    };
    raws.into_iter().map(TaskRaw::into_info).collect()
}

/// Tasks matching `f` with `from <= id < before_id`, newest id first (the dashboard's keyset
/// page).
pub(crate) async fn task_list_desc(
    conn: &mut SqliteConnection,
    f: &TaskFilter<'_>,
    before_id: u64,
    from: u64,
    limit: u32,
) -> sqlx::Result<Vec<TaskInfo>> {
    let (before_id, from, st) = (sid(before_id), sid(from), f.state.map(TaskState::as_str));
    let raws = select_tasks!(
        r#"WHERE id < ?1 AND id >= ?6 AND (?2 IS NULL OR queue = ?2)
             AND (?3 IS NULL OR state = ?3) AND (?4 IS NULL OR name = ?4)
           ORDER BY id DESC LIMIT ?5"#,
        before_id,
        f.queue,
        st,
        f.name,
        limit,
        from,
    )
    .fetch_all(&mut *conn)
    .await?;
    raws.into_iter().map(TaskRaw::into_info).collect()
}

/// Smallest and largest task id (`(0, 0)` when there is none): the ends of the rowid.
pub(crate) async fn task_id_bounds(conn: &mut SqliteConnection) -> sqlx::Result<(u64, u64)> {
    let r = sqlx::query!(
        r#"SELECT COALESCE(MIN(id), 0) AS "lo!: i64", COALESCE(MAX(id), 0) AS "hi!: i64"
           FROM taskq_tasks"#
    )
    .fetch_one(&mut *conn)
    .await?;
    Ok((uid(r.lo), uid(r.hi)))
}

/// Tasks of `queue` (and `name`, when given), in every state, with `id < before_id`, newest id
/// first, at most `limit`. (MySQL reads them through `ix_taskq_claim`, which covers every
/// state there; here that index holds pending rows only, so this walks the rowid backwards
/// from `before_id`, reading rows until `limit` match: cheap for a queue with recent tasks,
/// a long walk for a small queue in a big table.)
pub(crate) async fn task_list_queue_desc(
    conn: &mut SqliteConnection,
    queue: &str,
    name: Option<&str>,
    before_id: u64,
    limit: u32,
) -> sqlx::Result<Vec<TaskInfo>> {
    let before_id = sid(before_id);
    let raws = select_tasks!(
        r#"WHERE queue = ?1 AND (?2 IS NULL OR name = ?2) AND id < ?3
           ORDER BY id DESC LIMIT ?4"#,
        queue,
        name,
        before_id,
        limit,
    )
    .fetch_all(&mut *conn)
    .await?;
    raws.into_iter().map(TaskRaw::into_info).collect()
}

/// Like [`task_list_queue_desc`], `id > after_id`, oldest id first.
pub(crate) async fn task_list_queue_asc(
    conn: &mut SqliteConnection,
    queue: &str,
    name: Option<&str>,
    after_id: u64,
    limit: u32,
) -> sqlx::Result<Vec<TaskInfo>> {
    let after_id = sid(after_id);
    let raws = select_tasks!(
        r#"WHERE queue = ?1 AND (?2 IS NULL OR name = ?2) AND id > ?3
           ORDER BY id LIMIT ?4"#,
        queue,
        name,
        after_id,
        limit,
    )
    .fetch_all(&mut *conn)
    .await?;
    raws.into_iter().map(TaskRaw::into_info).collect()
}

/// `(name, run µs)` of the tasks that succeeded in the last `minutes` (`finished_at -
/// attempted_at`), newest first, at most `limit`: a range of `ix_taskq_finished`.
pub(crate) async fn task_run_times(
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
pub(crate) async fn task_finished_per_minute(
    conn: &mut SqliteConnection,
    minutes: u32,
) -> sqlx::Result<Vec<(TaskState, u32, u64)>> {
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
    rows.into_iter()
        .filter(|r| r.ago >= 0 && r.ago < i64::from(minutes))
        .map(|r| Ok((state(&r.state)?, r.ago as u32, r.n.max(0) as u64)))
        .collect()
}

/// How many tasks in terminal `state` finished more than `age_secs` ago (what [`task_prune`]
/// would delete, without its limit).
pub(crate) async fn task_prune_count(
    conn: &mut SqliteConnection,
    state: TaskState,
    age_secs: u64,
) -> sqlx::Result<u64> {
    let state = state.as_str();
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
pub(crate) async fn task_count(
    conn: &mut SqliteConnection,
    f: &TaskFilter<'_>,
) -> sqlx::Result<u64> {
    let st = f.state.map(TaskState::as_str);
    let n = sqlx::query_scalar!(
        r#"SELECT COUNT(*) AS "n!: i64" FROM taskq_tasks
           WHERE (?1 IS NULL OR queue = ?1) AND (?2 IS NULL OR state = ?2)
             AND (?3 IS NULL OR name = ?3)"#,
        f.queue,
        st,
        f.name,
    )
    .fetch_one(&mut *conn)
    .await?;
    Ok(n.max(0) as u64)
}

/// The state of one task, or `None` when the id does not exist.
pub(crate) async fn task_state(
    conn: &mut SqliteConnection,
    id: TaskId,
) -> sqlx::Result<Option<TaskState>> {
    let id = sid(id.0);
    sqlx::query_scalar!(
        r#"SELECT state AS "state!: String" FROM taskq_tasks WHERE id = ?1"#,
        id
    )
    .fetch_optional(&mut *conn)
    .await?
    .map(|s| state(&s))
    .transpose()
}

/// One row of [`task_stats`] and its halves, as SQLite returns it.
struct StatsRow {
    queue: String,
    state: String,
    count: i64,
    oldest_run_at: Option<i64>,
    earliest_lease_until: Option<i64>,
}

/// The seam's counts of [`StatsRow`]s.
fn stats_counts(rows: Vec<StatsRow>) -> sqlx::Result<Vec<QueueStateCount>> {
    rows.into_iter()
        .map(|r| {
            Ok(QueueStateCount {
                queue: r.queue,
                state: state(&r.state)?,
                count: r.count.max(0) as u64,
                oldest_run_at: opt_time(r.oldest_run_at)?,
                earliest_lease_until: opt_time(r.earliest_lease_until)?,
            })
        })
        .collect()
}

/// Counts by queue and state, ordered by queue and state.
pub(crate) async fn task_stats(conn: &mut SqliteConnection) -> sqlx::Result<Vec<QueueStateCount>> {
    let rows = sqlx::query_as!(
        StatsRow,
        r#"SELECT queue AS "queue!: String", state AS "state!: String", COUNT(*) AS "count!: i64",
             MIN(run_at) AS "oldest_run_at?: i64", MIN(lease_until) AS "earliest_lease_until?: i64"
           FROM taskq_tasks GROUP BY queue, state ORDER BY queue, state"#
    )
    .fetch_all(&mut *conn)
    .await?;
    stats_counts(rows)
}

/// Counts by queue of the tasks in the states `rules::stats_states(terminal)` names (the
/// waiting, pending and running ones, or the terminal ones) with the earliest `run_at`,
/// ordered by queue and state; `earliest_lease_until` is `None`, as on MySQL (whose
/// `task_stats` reads the leases apart; [`task_stats`] here has them).
pub(crate) async fn task_stats_half(
    conn: &mut SqliteConnection,
    terminal: bool,
) -> sqlx::Result<Vec<QueueStateCount>> {
    let [a, b, c, d] = rules::stats_states(terminal).map(TaskState::as_str);
    let rows = sqlx::query_as!(
        StatsRow,
        r#"SELECT queue AS "queue!: String", state AS "state!: String", COUNT(*) AS "count!: i64",
             MIN(run_at) AS "oldest_run_at?: i64", NULL AS "earliest_lease_until?: i64"
           FROM taskq_tasks WHERE state IN (?1, ?2, ?3, ?4)
           GROUP BY queue, state ORDER BY queue, state"#,
        a,
        b,
        c,
        d
    )
    .fetch_all(&mut *conn)
    .await?;
    stats_counts(rows)
}

/// Pending tasks per queue and name (of `queue` only, when given): how many, how many are
/// due, the earliest `run_at`. Reads the partial claim index only.
pub(crate) async fn task_pending_by_name(
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

/// Up to `limit` ids above `after_id` of dead tasks unique while pending or running (of
/// `queue`, or of every queue) that died at or before `died_before`, ascending.
pub(crate) async fn task_dead_unique_ids(
    conn: &mut SqliteConnection,
    queue: Option<&str>,
    died_before: DateTime<Utc>,
    after_id: u64,
    limit: u32,
) -> sqlx::Result<Vec<TaskId>> {
    let (died_before, after_id) = (time_to_us(died_before), sid(after_id));
    let ids = sqlx::query_scalar!(
        r#"SELECT id AS "id!: i64" FROM taskq_tasks
           WHERE state = 'dead' AND (finished_at IS NULL OR finished_at <= ?1)
             AND (?2 IS NULL OR queue = ?2)
             AND ((unique_key IS NOT NULL AND unique_while <> 'window') OR order_key IS NOT NULL)
             AND id > ?3
           ORDER BY id
           LIMIT ?4"#,
        died_before,
        queue,
        after_id,
        limit
    )
    .fetch_all(&mut *conn)
    .await?;
    Ok(ids.into_iter().map(|i| TaskId(uid(i))).collect())
}

/// Ids (ascending, `> after_id`, at most `limit`) of tasks in `state` matching `f`'s queue and
/// name, created at least `age_us` ago (database clock); with whether the task holds an
/// identity only a one-row retry can take back (unique, not per window).
pub(crate) async fn task_bulk_ids(
    conn: &mut SqliteConnection,
    f: &TaskFilter<'_>,
    age_us: i64,
    after_id: u64,
    limit: u32,
) -> sqlx::Result<Vec<(u64, bool)>> {
    let (state, after_id) = (f.state.map_or("", TaskState::as_str), sid(after_id));
    let rows = sqlx::query!(
        r#"SELECT id AS "id!: i64",
             ((unique_key IS NOT NULL AND unique_while <> 'window') OR order_key IS NOT NULL)
               AS "held!: bool"
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
    Ok(rows.into_iter().map(|r| (uid(r.id), r.held)).collect())
}

/// How many tasks in `state` match `f`'s queue and name and were created at least `age_us`
/// ago (the dry run of a bulk operation).
pub(crate) async fn task_bulk_count(
    conn: &mut SqliteConnection,
    f: &TaskFilter<'_>,
    age_us: i64,
) -> sqlx::Result<u64> {
    let state = f.state.map_or("", TaskState::as_str);
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
