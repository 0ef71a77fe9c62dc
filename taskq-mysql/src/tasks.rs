//! Reads of `taskq_tasks`: one task, pages of tasks, counts and statistics, and the tasks a
//! bulk action would touch.

use chrono::{DateTime, Utc};
use sqlx::MySqlConnection;
use taskq_driver::driver::Tasks;

use crate::MySqlDriver;
use taskq_driver::read::{PendingNameCount, QueueStateCount, TaskInfo};
use taskq_driver::rows::{PendingKind, TaskFilter};
use taskq_driver::rules;
use taskq_driver::state::{TaskId, TaskState};

/// `sqlx::query_as!(TaskInfo, "SELECT <every column of a TaskInfo> " + $rest, args..)`: the
/// task columns are written once here (`query_as!` needs literal SQL, and takes `"..." +
/// "..."`), read from `taskq_tasks` under the alias `t`; `$rest` is the statement from its
/// `FROM` on (`FROM taskq_tasks t WHERE ..`, or a join that names the row `t`).
macro_rules! select_tasks {
    ($rest:literal $(, $arg:expr)* $(,)?) => {
        sqlx::query_as!(
            TaskInfo,
            r#"SELECT t.id AS "id: TaskId", t.queue, t.name, t.payload, t.state AS "state: TaskState",
                 t.priority AS "priority: i16", t.attempt AS "attempt: u32",
                 t.max_attempts AS "max_attempts: u32", t.run_at AS "run_at: DateTime<Utc>",
                 t.lease_until AS "lease_until: DateTime<Utc>", t.lease_epoch AS "lease_epoch: u64",
                 t.worker_id, t.idempotency_key, t.trace_context, t.last_error,
                 LOWER(HEX(t.unique_key)) AS "unique_key: String",
                 EXISTS (SELECT 1 FROM taskq_unique u WHERE u.unique_key = t.unique_key
                           AND u.task_id = t.id) AS "unique_held!: bool",
                 t.created_at AS "created_at: DateTime<Utc>", t.updated_at AS "updated_at: DateTime<Utc>",
                 t.finished_at AS "finished_at: DateTime<Utc>", t.snoozes AS "snoozes: u32",
                 t.deadline AS "deadline: DateTime<Utc>", t.attempted_at AS "attempted_at: DateTime<Utc>",
                 t.output
               "# + $rest
            $(, $arg)*
        )
    };
}

impl Tasks for MySqlDriver {
    /// One task by id.
    async fn task_get(&self, id: TaskId) -> sqlx::Result<Option<TaskInfo>> {
        select_tasks!(r#"FROM taskq_tasks t WHERE id = ?"#, id.0)
            .fetch_optional(&self.pool)
            .await
    }

    /// The state of one task, or `None` when the id does not exist.
    async fn task_state(&self, id: TaskId) -> sqlx::Result<Option<TaskState>> {
        sqlx::query_scalar!(
            r#"SELECT state AS "state: TaskState" FROM taskq_tasks WHERE id = ?"#,
            id.0
        )
        .fetch_optional(&self.pool)
        .await
    }

    /// Tasks matching `f` with `after_id < id <= up_to`, oldest id first.
    async fn task_list(
        &self,
        f: &TaskFilter<'_>,
        after_id: u64,
        up_to: u64,
        limit: u32,
    ) -> sqlx::Result<Vec<TaskInfo>> {
        let state = f.state.map(TaskState::as_str);
        select_tasks!(
            r#"FROM taskq_tasks t
               WHERE id > ? AND id <= ? AND (? IS NULL OR queue = ?) AND (? IS NULL OR state = ?)
                 AND (? IS NULL OR name = ?)
               ORDER BY id LIMIT ?"#,
            after_id,
            up_to,
            f.queue,
            f.queue,
            state,
            state,
            f.name,
            f.name,
            limit,
        )
        .fetch_all(&self.pool)
        .await
    }

    /// Pending tasks of `kind` by `(run_at, id)` after the cursor. Scheduled: the page's ids
    /// from a covering range of `ix_taskq_claim` (`state = 'pending'`, `run_at` after now,
    /// top-N sorted without reading a row), then those rows. Retrying: a keyset range of
    /// `ix_taskq_retrying` (the generated `retry_at`: `run_at` of exactly the pending rows with
    /// `attempt > 0`), in order, stopping at the page (a queue filter reads rows until the page
    /// is full).
    async fn task_list_pending(
        &self,
        kind: PendingKind,
        queue: Option<&str>,
        after: Option<(DateTime<Utc>, u64)>,
        limit: u32,
    ) -> sqlx::Result<Vec<TaskInfo>> {
        let (after_at, after_id) = after.unwrap_or((DateTime::<Utc>::UNIX_EPOCH, 0));
        let after_at = after_at.naive_utc();
        match kind {
            PendingKind::Scheduled => {
                select_tasks!(
                    r#"FROM (SELECT id FROM taskq_tasks FORCE INDEX (ix_taskq_claim)
                             WHERE state = 'pending' AND (? IS NULL OR queue = ?)
                               AND run_at > UTC_TIMESTAMP(6)
                               AND (run_at > ? OR (run_at = ? AND id > ?))
                             ORDER BY run_at, id LIMIT ?) AS c
                         STRAIGHT_JOIN taskq_tasks t ON t.id = c.id
                       WHERE t.state = 'pending'
                       ORDER BY t.run_at, t.id"#,
                    queue,
                    queue,
                    after_at,
                    after_at,
                    after_id,
                    limit,
                )
                .fetch_all(&self.pool)
                .await
            }
            PendingKind::Retrying => {
                select_tasks!(
                    r#"FROM taskq_tasks t FORCE INDEX (ix_taskq_retrying)
                       WHERE (retry_at > ? OR (retry_at = ? AND id > ?))
                         AND (? IS NULL OR queue = ?)
                       ORDER BY retry_at, id LIMIT ?"#,
                    after_at,
                    after_at,
                    after_id,
                    queue,
                    queue,
                    limit,
                )
                .fetch_all(&self.pool)
                .await
            }
        }
    }

    /// Tasks matching `f` with `from <= id < before_id`, newest id first (the dashboard's
    /// keyset page).
    async fn task_list_desc(
        &self,
        f: &TaskFilter<'_>,
        before_id: u64,
        from: u64,
        limit: u32,
    ) -> sqlx::Result<Vec<TaskInfo>> {
        let state = f.state.map(TaskState::as_str);
        select_tasks!(
            r#"FROM taskq_tasks t
               WHERE id < ? AND id >= ? AND (? IS NULL OR queue = ?) AND (? IS NULL OR state = ?)
                 AND (? IS NULL OR name = ?)
               ORDER BY id DESC LIMIT ?"#,
            before_id,
            from,
            f.queue,
            f.queue,
            state,
            state,
            f.name,
            f.name,
            limit,
        )
        .fetch_all(&self.pool)
        .await
    }

    /// Smallest and largest task id (0, 0 when there is none): the ends of the primary key.
    async fn task_id_bounds(&self) -> sqlx::Result<(u64, u64)> {
        let r = sqlx::query!(
            r#"SELECT CAST(COALESCE(MIN(id), 0) AS UNSIGNED) AS "lo!: u64",
                 CAST(COALESCE(MAX(id), 0) AS UNSIGNED) AS "hi!: u64" FROM taskq_tasks"#
        )
        .fetch_one(&self.pool)
        .await?;
        Ok((r.lo, r.hi))
    }

    /// Tasks of `queue` (and `name`, when given) with `id < before_id`, newest id first, found
    /// through `ix_taskq_claim` (whose entries hold state, queue, id and name) rather than by
    /// walking the primary key: a covering read of the queue's entries in every state, the top
    /// `limit` ids sorted, then those rows by id. Costs in proportion to the queue's size.
    async fn task_list_queue_desc(
        &self,
        queue: &str,
        name: Option<&str>,
        before_id: u64,
        limit: u32,
    ) -> sqlx::Result<Vec<TaskInfo>> {
        select_tasks!(
            r#"FROM (SELECT id FROM taskq_tasks FORCE INDEX (ix_taskq_claim)
                      WHERE state IN ('waiting', 'pending', 'running', 'succeeded', 'dead', 'canceled', 'expired')
                        AND queue = ? AND (? IS NULL OR name = ?) AND id < ?
                      ORDER BY id DESC LIMIT ?) AS k
               JOIN taskq_tasks t ON t.id = k.id
               ORDER BY t.id DESC"#,
            queue,
            name,
            name,
            before_id,
            limit
        )
        .fetch_all(&self.pool)
        .await
    }

    /// Like [`task_list_queue_desc`](Self::task_list_queue_desc), `id > after_id`, oldest id
    /// first.
    async fn task_list_queue_asc(
        &self,
        queue: &str,
        name: Option<&str>,
        after_id: u64,
        limit: u32,
    ) -> sqlx::Result<Vec<TaskInfo>> {
        select_tasks!(
            r#"FROM (SELECT id FROM taskq_tasks FORCE INDEX (ix_taskq_claim)
                      WHERE state IN ('waiting', 'pending', 'running', 'succeeded', 'dead', 'canceled', 'expired')
                        AND queue = ? AND (? IS NULL OR name = ?) AND id > ?
                      ORDER BY id LIMIT ?) AS k
               JOIN taskq_tasks t ON t.id = k.id
               ORDER BY t.id"#,
            queue,
            name,
            name,
            after_id,
            limit
        )
        .fetch_all(&self.pool)
        .await
    }

    /// Number of tasks matching `f`.
    async fn task_count(&self, f: &TaskFilter<'_>) -> sqlx::Result<u64> {
        let state = f.state.map(TaskState::as_str);
        let n = sqlx::query_scalar!(
            r#"SELECT COUNT(*) AS "n: i64" FROM taskq_tasks
               WHERE (? IS NULL OR queue = ?) AND (? IS NULL OR state = ?) AND (? IS NULL OR name = ?)"#,
            f.queue,
            f.queue,
            state,
            state,
            f.name,
            f.name,
        )
        .fetch_one(&self.pool)
        .await?;
        Ok(n.max(0) as u64)
    }

    /// Terminal tasks per state and minute over the last `minutes` minutes (database clock):
    /// `(state, minutes ago, count)`, minute 0 being the last 60 seconds. A covering range read
    /// of `ix_taskq_finished` per state.
    async fn task_finished_per_minute(
        &self,
        minutes: u32,
    ) -> sqlx::Result<Vec<(TaskState, u32, u64)>> {
        let rows = sqlx::query!(
            r#"SELECT state AS "state!: TaskState",
                 CAST(TIMESTAMPDIFF(MINUTE, finished_at, UTC_TIMESTAMP(6)) AS UNSIGNED) AS "ago!: u64",
                 CAST(COUNT(*) AS UNSIGNED) AS "n!: u64"
               FROM taskq_tasks FORCE INDEX (ix_taskq_finished)
               WHERE state IN ('succeeded', 'dead', 'canceled', 'expired')
                 AND finished_at > UTC_TIMESTAMP(6) - INTERVAL ? MINUTE
               GROUP BY state, 2"#,
            minutes
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .filter(|r| r.ago < u64::from(minutes))
            .map(|r| (r.state, r.ago as u32, r.n))
            .collect())
    }

    /// Run times of the tasks that succeeded in the last `minutes`, newest first: a range of
    /// `ix_taskq_finished` (`state = 'succeeded'`, `finished_at` in the window), read backwards,
    /// stopping at `limit` rows.
    async fn task_run_times(&self, minutes: u32, limit: u32) -> sqlx::Result<Vec<(String, i64)>> {
        let rows = sqlx::query!(
            r#"SELECT name,
                 CAST(TIMESTAMPDIFF(MICROSECOND, attempted_at, finished_at) AS SIGNED) AS "run_us!: i64"
               FROM taskq_tasks FORCE INDEX (ix_taskq_finished)
               WHERE state = 'succeeded' AND finished_at > UTC_TIMESTAMP(6) - INTERVAL ? MINUTE
                 AND attempted_at IS NOT NULL
               ORDER BY finished_at DESC LIMIT ?"#,
            minutes,
            limit
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(|r| (r.name, r.run_us)).collect())
    }

    /// How many tasks in terminal `state` finished more than `age_secs` ago (what
    /// `task_prune` would delete).
    async fn task_prune_count(&self, state: TaskState, age_secs: u64) -> sqlx::Result<u64> {
        let n = sqlx::query_scalar!(
            r#"SELECT COUNT(*) AS "n: i64" FROM taskq_tasks
               WHERE state = ? AND finished_at < UTC_TIMESTAMP(6) - INTERVAL ? SECOND"#,
            state.as_str(),
            age_secs
        )
        .fetch_one(&self.pool)
        .await?;
        Ok(n.max(0) as u64)
    }

    /// Counts by queue and state (ordered so), with the earliest `run_at` and `lease_until`:
    /// [`task_stats_active`](Self::task_stats_active), the running leases, then
    /// [`task_stats_terminal`](Self::task_stats_terminal), on one connection.
    async fn task_stats(&self, conn: &mut MySqlConnection) -> sqlx::Result<Vec<QueueStateCount>> {
        let mut rows = self.task_stats_active(&mut *conn).await?;
        for (queue, earliest) in self.task_running_leases(&mut *conn).await? {
            if let Some(r) = rows
                .iter_mut()
                .find(|r| r.state == TaskState::Running && r.queue == queue)
            {
                r.earliest_lease_until = earliest;
            }
        }
        rows.extend(self.task_stats_terminal(&mut *conn).await?);
        let rank = |s: TaskState| TaskState::ALL.iter().position(|x| *x == s);
        rows.sort_by(|a, b| (&a.queue, rank(a.state)).cmp(&(&b.queue, rank(b.state))));
        Ok(rows)
    }

    /// Counts by queue of the waiting, pending and running tasks, with the earliest `run_at`
    /// (`earliest_lease_until` is `None`): a covering range read of `ix_taskq_claim` over
    /// those states.
    async fn task_stats_active(
        &self,
        conn: &mut MySqlConnection,
    ) -> sqlx::Result<Vec<QueueStateCount>> {
        stats_half(conn, false).await
    }

    /// Counts by queue of the tasks in terminal states, with the earliest `run_at`: a covering
    /// read of `ix_taskq_claim`'s terminal ranges (every terminal task's index entry, but not
    /// the rows).
    async fn task_stats_terminal(
        &self,
        conn: &mut MySqlConnection,
    ) -> sqlx::Result<Vec<QueueStateCount>> {
        stats_half(conn, true).await
    }

    /// Pending tasks per queue and name (of `queue` only, when given): how many, how many are
    /// due, the earliest `run_at`. A covering read of `ix_taskq_claim`'s pending range (every
    /// column it needs is in the index since migration 4), grouped in a temporary table.
    async fn task_pending_by_name(
        &self,
        conn: &mut MySqlConnection,
        queue: Option<&str>,
    ) -> sqlx::Result<Vec<PendingNameCount>> {
        sqlx::query_as!(
            PendingNameCount,
            r#"SELECT queue, name, CAST(COUNT(*) AS UNSIGNED) AS "pending!: u64",
                 CAST(SUM(run_at <= UTC_TIMESTAMP(6)) AS UNSIGNED) AS "due!: u64",
                 MIN(run_at) AS "oldest_run_at!: DateTime<Utc>"
               FROM taskq_tasks
               WHERE state = 'pending' AND (? IS NULL OR queue = ?)
               GROUP BY queue, name ORDER BY queue, name"#,
            queue,
            queue
        )
        .fetch_all(&mut *conn)
        .await
    }

    /// Ids (ascending, `> after_id`, at most `limit`) of tasks in `state` matching the bulk
    /// filter, created at least `age_us` ago (database clock; 0: any age, and `created_at` is
    /// not read); with whether the task holds a unique identity that only a one-row retry can
    /// take back (see `task_retry_dead`).
    async fn task_bulk_ids(
        &self,
        f: &TaskFilter<'_>,
        age_us: i64,
        after_id: u64,
        limit: u32,
    ) -> sqlx::Result<Vec<(u64, bool)>> {
        let state = f.state.map(TaskState::as_str);
        if age_us <= 0 {
            let rows = sqlx::query!(
                r#"SELECT id AS "id: u64",
                     ((unique_key IS NOT NULL AND unique_while <> 'window') OR order_key IS NOT NULL) AS "held!: bool"
                   FROM taskq_tasks
                   WHERE state = ? AND (? IS NULL OR queue = ?) AND (? IS NULL OR name = ?)
                     AND id > ?
                   ORDER BY id
                   LIMIT ?"#,
                state,
                f.queue,
                f.queue,
                f.name,
                f.name,
                after_id,
                limit
            )
            .fetch_all(&self.pool)
            .await?;
            return Ok(rows.into_iter().map(|r| (r.id, r.held)).collect());
        }
        let rows = sqlx::query!(
            r#"SELECT id AS "id: u64",
                 ((unique_key IS NOT NULL AND unique_while <> 'window') OR order_key IS NOT NULL) AS "held!: bool"
               FROM taskq_tasks
               WHERE state = ? AND (? IS NULL OR queue = ?) AND (? IS NULL OR name = ?)
                 AND created_at <= UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND AND id > ?
               ORDER BY id
               LIMIT ?"#,
            state,
            f.queue,
            f.queue,
            f.name,
            f.name,
            age_us,
            after_id,
            limit
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(|r| (r.id, r.held)).collect())
    }

    /// How many tasks in `state` match the bulk filter (the dry run of a bulk operation).
    /// Without an age (`age_us` 0) it reads no row, only `ix_taskq_claim` (whose columns
    /// include `queue` and `name`).
    async fn task_bulk_count(&self, f: &TaskFilter<'_>, age_us: i64) -> sqlx::Result<u64> {
        let state = f.state.map(TaskState::as_str);
        let n = if age_us <= 0 {
            sqlx::query_scalar!(
                r#"SELECT COUNT(*) AS "n: i64" FROM taskq_tasks
                   WHERE state = ? AND (? IS NULL OR queue = ?) AND (? IS NULL OR name = ?)"#,
                state,
                f.queue,
                f.queue,
                f.name,
                f.name,
            )
            .fetch_one(&self.pool)
            .await?
        } else {
            sqlx::query_scalar!(
                r#"SELECT COUNT(*) AS "n: i64" FROM taskq_tasks
                   WHERE state = ? AND (? IS NULL OR queue = ?) AND (? IS NULL OR name = ?)
                     AND created_at <= UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND"#,
                state,
                f.queue,
                f.queue,
                f.name,
                f.name,
                age_us
            )
            .fetch_one(&self.pool)
            .await?
        };
        Ok(n.max(0) as u64)
    }

    /// Order keys held back by a failing head (see `crate::order::order_keys_held`).
    async fn order_keys_held(
        &self,
        queue: Option<&str>,
        limit: u32,
    ) -> sqlx::Result<Vec<taskq_driver::rows::HeldKey>> {
        crate::order::order_keys_held(&self.pool, queue, limit).await
    }

    /// Up to `limit` ids above `after_id` of dead tasks unique while pending or running, or
    /// ordered (of
    /// `queue`, or of every queue) that died at or before `died_before`, ascending.
    async fn task_dead_unique_ids(
        &self,
        queue: Option<&str>,
        died_before: DateTime<Utc>,
        after_id: u64,
        limit: u32,
    ) -> sqlx::Result<Vec<TaskId>> {
        sqlx::query_scalar!(
            r#"SELECT id AS "id: TaskId" FROM taskq_tasks
               WHERE state = 'dead' AND (finished_at IS NULL OR finished_at <= ?)
                 AND (? IS NULL OR queue = ?)
                 AND ((unique_key IS NOT NULL AND unique_while <> 'window') OR order_key IS NOT NULL)
                 AND id > ?
               ORDER BY id
               LIMIT ?"#,
            died_before.naive_utc(),
            queue,
            queue,
            after_id,
            limit
        )
        .fetch_all(&self.pool)
        .await
    }
}

impl MySqlDriver {
    /// The earliest `lease_until` of the running tasks per queue (reads the running rows).
    async fn task_running_leases(
        &self,
        conn: &mut MySqlConnection,
    ) -> sqlx::Result<Vec<(String, Option<DateTime<Utc>>)>> {
        let rows = sqlx::query!(
            r#"SELECT queue, MIN(lease_until) AS "earliest: DateTime<Utc>"
               FROM taskq_tasks FORCE INDEX (ix_taskq_claim)
               WHERE state = 'running' GROUP BY queue"#
        )
        .fetch_all(&mut *conn)
        .await?;
        Ok(rows.into_iter().map(|r| (r.queue, r.earliest)).collect())
    }
}

/// Counts by queue of the states `rules::stats_states(terminal)` names, with the earliest
/// `run_at` (`earliest_lease_until` is `None`): a covering read of `ix_taskq_claim`'s ranges
/// of those states (the server plans the `IN` list with the values bound).
async fn stats_half(
    conn: &mut MySqlConnection,
    terminal: bool,
) -> sqlx::Result<Vec<QueueStateCount>> {
    let [a, b, c, d] = rules::stats_states(terminal).map(TaskState::as_str);
    sqlx::query_as!(
        QueueStateCount,
        r#"SELECT queue, state AS "state!: TaskState", CAST(COUNT(*) AS UNSIGNED) AS "count!: u64",
             MIN(run_at) AS "oldest_run_at: DateTime<Utc>",
             CAST(NULL AS DATETIME(6)) AS "earliest_lease_until: DateTime<Utc>"
           FROM taskq_tasks FORCE INDEX (ix_taskq_claim)
           WHERE state IN (?, ?, ?, ?)
           GROUP BY state, queue"#,
        a,
        b,
        c,
        d
    )
    .fetch_all(&mut *conn)
    .await
}
