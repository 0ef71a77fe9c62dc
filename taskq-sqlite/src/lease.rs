//! The worker's statements: claim under a lease, renew, write back under the epoch, release,
//! reap, and the epochs of ids.
//!
//! Every write-back of a claimed task is conditional on the `(id, lease_epoch)` its attempt
//! claimed; every statement that moves a task out of `running` behind a worker's back (reap,
//! release) increments the epoch, so a late write-back of that attempt matches nothing.
//! Batches of ids travel as one JSON array bound to one parameter and are read with
//! `json_each` (SQLite's `JSON_TABLE`).

use serde::Serialize;
use sqlx::SqliteConnection;

use crate::connect::begin_write;
use crate::identities::release_ended;

/// One claim: up to `limit` due tasks of `queue` whose name is in `names`.
#[derive(Debug, Clone, Copy)]
pub struct ClaimRequest<'a> {
    /// The queue to claim from.
    pub queue: &'a str,
    /// The task names the worker handles; tasks of other names stay pending.
    pub names: &'a [&'a str],
    /// At most this many tasks (expired ones included).
    pub limit: u32,
    /// Lease length from the database's now (µs).
    pub lease_us: i64,
    /// Recorded in `worker_id`.
    pub worker_id: &'a str,
}

/// A task as claimed (values after the claim).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claimed {
    /// Task id.
    pub id: i64,
    /// Task name.
    pub name: String,
    /// Payload bytes.
    pub payload: Vec<u8>,
    /// Priority (lower first).
    pub priority: i16,
    /// Due time (µs since the epoch).
    pub run_at_us: i64,
    /// Attempt number of this run (already incremented).
    pub attempt: u32,
    /// Attempts allowed.
    pub max_attempts: u32,
    /// Snoozes so far (before this run).
    pub snoozes: u32,
    /// Fencing token of this run (already incremented).
    pub lease_epoch: i64,
    /// How long the task waited after it was due, on the database clock (µs).
    pub wait_us: i64,
    /// Trace context of the enqueuing request.
    pub trace_context: Option<String>,
    /// The unique identity, if the task is unique.
    pub unique_key: Option<Vec<u8>>,
    /// Its `unique_while`.
    pub unique_while: Option<String>,
}

/// A due task the claim found past its deadline and moved to `expired` instead of running.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpiredTask {
    /// Task id.
    pub id: i64,
    /// Task name.
    pub name: String,
    /// How long ago its deadline passed, on the database clock (µs).
    pub late_us: i64,
}

/// What one claim took.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClaimBatch {
    /// The claimed tasks, in claim order (priority, run_at, id).
    pub tasks: Vec<Claimed>,
    /// Tasks found past their deadline: now `expired`, not run. They count towards the limit.
    pub expired: Vec<ExpiredTask>,
}

/// Claims up to `limit` due tasks of `queue` whose name is in `names`, in one `BEGIN
/// IMMEDIATE` transaction (a savepoint if `conn` is in one):
///
/// 1. one `UPDATE … WHERE id IN (SELECT id … ORDER BY priority, run_at, id LIMIT ?)
///    RETURNING …`: the first `limit` pending, due rows of the queue in claim order (read on
///    the partial index `ix_taskq_claim`), unless the queue is paused. Each row past its
///    `deadline` becomes `expired` (attempt and epoch unchanged); every other row becomes
///    `running` with attempt and epoch + 1 and a lease of `lease_us` from now;
/// 2. only when some of those rows are unique while pending, or unique and expired: the
///    deletion of the identities that ends (see `identities::release_ended`).
///
/// The writer lock replaces MySQL's candidate read and `FOR UPDATE SKIP LOCKED`: two claims
/// never overlap in time, so the second sees the first's rows as running. A paused queue is
/// checked inside the statement (on MySQL the worker checks it before claiming).
pub async fn task_claim(
    conn: &mut SqliteConnection,
    req: &ClaimRequest<'_>,
) -> sqlx::Result<ClaimBatch> {
    let names = serde_json::to_string(req.names).map_err(|e| sqlx::Error::Encode(Box::new(e)))?;
    let mut tx = begin_write(conn).await?;
    let mut rows = sqlx::query!(
        r#"UPDATE taskq_tasks AS t
           SET state = CASE WHEN t.deadline <= c.us THEN 'expired' ELSE 'running' END,
               attempt = CASE WHEN t.deadline <= c.us THEN t.attempt ELSE t.attempt + 1 END,
               lease_epoch = CASE WHEN t.deadline <= c.us THEN t.lease_epoch
                                  ELSE t.lease_epoch + 1 END,
               lease_until = CASE WHEN t.deadline <= c.us THEN NULL ELSE c.us + ?4 END,
               worker_id = CASE WHEN t.deadline <= c.us THEN t.worker_id ELSE ?5 END,
               finished_at = CASE WHEN t.deadline <= c.us THEN c.us ELSE NULL END,
               updated_at = c.us
           FROM taskq_clock AS c
           WHERE t.id IN (
             SELECT id FROM taskq_tasks
             WHERE state = 'pending' AND queue = ?1 AND run_at <= (SELECT us FROM taskq_clock)
               AND name IN (SELECT value FROM json_each(?2))
               AND NOT EXISTS (SELECT 1 FROM taskq_queues AS q
                               WHERE q.queue = ?1 AND q.paused_at IS NOT NULL)
             ORDER BY priority, run_at, id
             LIMIT ?3)
           RETURNING id AS "id!: i64", name AS "name!: String", payload AS "payload!: Vec<u8>",
             state AS "state!: String", priority AS "priority!: i16", run_at AS "run_at!: i64",
             attempt AS "attempt!: u32", max_attempts AS "max_attempts!: u32",
             snoozes AS "snoozes!: u32", lease_epoch AS "lease_epoch!: i64",
             updated_at - run_at AS "wait_us!: i64",
             finished_at - deadline AS "late_us?: i64",
             trace_context AS "trace_context?: String",
             unique_key AS "unique_key?: Vec<u8>", unique_while AS "unique_while?: String""#,
        req.queue,
        names,
        req.limit,
        req.lease_us,
        req.worker_id,
    )
    .fetch_all(&mut *tx)
    .await?;
    // RETURNING's order is unspecified: back to claim order.
    rows.sort_by_key(|r| (r.priority, r.run_at, r.id));
    let frees: Vec<i64> = rows
        .iter()
        .filter(|r| {
            r.unique_key.is_some()
                && (r.state == "expired" || r.unique_while.as_deref() == Some("pending"))
        })
        .map(|r| r.id)
        .collect();
    release_ended(&mut tx, &frees).await?;
    tx.commit().await?;
    let mut batch = ClaimBatch::default();
    for r in rows {
        if r.state == "expired" {
            batch.expired.push(ExpiredTask {
                id: r.id,
                name: r.name,
                late_us: r.late_us.unwrap_or(0),
            });
        } else {
            batch.tasks.push(Claimed {
                id: r.id,
                name: r.name,
                payload: r.payload,
                priority: r.priority,
                run_at_us: r.run_at,
                attempt: r.attempt,
                max_attempts: r.max_attempts,
                snoozes: r.snoozes,
                lease_epoch: r.lease_epoch,
                wait_us: r.wait_us,
                trace_context: r.trace_context,
                unique_key: r.unique_key,
                unique_while: r.unique_while,
            });
        }
    }
    Ok(batch)
}

/// `(id, epoch)` pairs as the JSON array of arrays the batch statements read.
fn leases_json(leases: &[(i64, i64)]) -> sqlx::Result<String> {
    serde_json::to_string(leases).map_err(|e| sqlx::Error::Encode(Box::new(e)))
}

/// Renews the leases `(id, epoch)` that are still held (running, same epoch, not expired) and
/// carry no cancel request, to `now + lease_us`. Returns how many were renewed: fewer than
/// sent means some were lost or asked to cancel, which [`task_leases_held`] tells apart (so a
/// beat with nothing to report costs one statement, as on MySQL).
pub async fn task_heartbeat(
    conn: &mut SqliteConnection,
    leases: &[(i64, i64)],
    lease_us: i64,
) -> sqlx::Result<u64> {
    if leases.is_empty() {
        return Ok(0);
    }
    let json = leases_json(leases)?;
    let done = sqlx::query!(
        r#"UPDATE taskq_tasks AS t
           SET lease_until = c.us + ?2, updated_at = c.us
           FROM json_each(?1) AS j, taskq_clock AS c
           WHERE t.id = j.value ->> 0 AND t.lease_epoch = j.value ->> 1
             AND t.state = 'running' AND t.lease_until > c.us
             AND t.cancel_requested_at IS NULL"#,
        json,
        lease_us
    )
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected())
}

/// A lease still held, as [`task_leases_held`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeldLease {
    /// Task id.
    pub id: i64,
    /// Its epoch (the one sent).
    pub epoch: i64,
    /// Whether a cancel of the running task was requested.
    pub cancel_requested: bool,
}

/// Of the leases `(id, epoch)`, those still held (running, same epoch, unexpired), with
/// whether a cancel was requested.
pub async fn task_leases_held(
    conn: &mut SqliteConnection,
    leases: &[(i64, i64)],
) -> sqlx::Result<Vec<HeldLease>> {
    if leases.is_empty() {
        return Ok(Vec::new());
    }
    let json = leases_json(leases)?;
    sqlx::query_as!(
        HeldLease,
        r#"SELECT t.id AS "id!: i64", t.lease_epoch AS "epoch!: i64",
             (t.cancel_requested_at IS NOT NULL) AS "cancel_requested!: bool"
           FROM json_each(?1) AS j
             JOIN taskq_tasks AS t ON t.id = j.value ->> 0 AND t.lease_epoch = j.value ->> 1
           WHERE t.state = 'running' AND t.lease_until > (SELECT us FROM taskq_clock)
           ORDER BY t.id"#,
        json
    )
    .fetch_all(&mut *conn)
    .await
}

/// The outcome of one attempt, written back by [`task_finish`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finish {
    /// Task id.
    pub id: i64,
    /// The epoch its attempt claimed.
    pub epoch: i64,
    /// `succeeded`, `pending` (retry), `dead`, `canceled` (a cancel request honoured), or
    /// `snoozed`: written as `pending` with the attempt given back and `snoozes` + 1.
    pub state: &'static str,
    /// Delay from the database's now of the next run, for `pending` and `snoozed`.
    pub delay_us: i64,
    /// The failure, recorded in `last_error` (kept when `None`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Writes a batch of outcomes and returns the ids written. Each row is written only if it is
/// still running with the epoch its attempt claimed (a row not written was reaped, released or
/// retried behind the worker's back). A snooze is a retry that gives its attempt back
/// (`attempt - 1`) and counts itself in `snoozes`. One `UPDATE … FROM json_each(?)`; when a
/// written row is unique, one more statement frees the identities the outcomes ended (success
/// of a task unique while running, death, cancel), in the same transaction.
///
/// MySQL's `Finished::deferred` does not exist here: no producer can hold an identity's row
/// while this runs (one writer at a time), so nothing is ever deferred.
pub async fn task_finish(conn: &mut SqliteConnection, batch: &[Finish]) -> sqlx::Result<Vec<i64>> {
    if batch.is_empty() {
        return Ok(Vec::new());
    }
    let json = serde_json::to_string(batch).map_err(|e| sqlx::Error::Encode(Box::new(e)))?;
    let mut tx = begin_write(conn).await?;
    let rows = sqlx::query!(
        r#"UPDATE taskq_tasks AS t
           SET state = CASE WHEN j.state = 'snoozed' THEN 'pending' ELSE j.state END,
               run_at = CASE WHEN j.state IN ('pending', 'snoozed') THEN c.us + j.delay_us
                             ELSE t.run_at END,
               finished_at = CASE WHEN j.state IN ('pending', 'snoozed') THEN NULL ELSE c.us END,
               attempt = CASE WHEN j.state = 'snoozed' AND t.attempt > 0 THEN t.attempt - 1
                              ELSE t.attempt END,
               snoozes = CASE WHEN j.state = 'snoozed' THEN t.snoozes + 1 ELSE t.snoozes END,
               last_error = COALESCE(j.error, t.last_error),
               cancel_requested_at = CASE WHEN j.state IN ('succeeded', 'dead') THEN NULL
                                          ELSE t.cancel_requested_at END,
               lease_until = NULL,
               updated_at = c.us
           FROM (SELECT value ->> 'id' AS id, value ->> 'epoch' AS epoch,
                        value ->> 'state' AS state, value ->> 'delay_us' AS delay_us,
                        value ->> 'error' AS error
                 FROM json_each(?1)) AS j,
                taskq_clock AS c
           WHERE t.id = j.id AND t.lease_epoch = j.epoch AND t.state = 'running'
           RETURNING id AS "id!: i64", (unique_key IS NOT NULL) AS "unique!: bool""#,
        json
    )
    .fetch_all(&mut *tx)
    .await?;
    let unique: Vec<i64> = rows.iter().filter(|r| r.unique).map(|r| r.id).collect();
    release_ended(&mut tx, &unique).await?;
    tx.commit().await?;
    let mut written: Vec<i64> = rows.into_iter().map(|r| r.id).collect();
    written.sort_unstable();
    Ok(written)
}

/// Gives running tasks back (shutdown): pending now, epoch + 1, the interrupted attempt not
/// counted. Conditional on each `(id, epoch)`. Returns how many were released. (A pending task
/// holds its identity, so none is freed.)
pub async fn task_release(conn: &mut SqliteConnection, leases: &[(i64, i64)]) -> sqlx::Result<u64> {
    if leases.is_empty() {
        return Ok(0);
    }
    let json = leases_json(leases)?;
    let done = sqlx::query!(
        r#"UPDATE taskq_tasks AS t
           SET state = 'pending', lease_epoch = t.lease_epoch + 1,
               attempt = MAX(t.attempt - 1, 0),
               run_at = c.us, lease_until = NULL, worker_id = NULL, updated_at = c.us
           FROM json_each(?1) AS j, taskq_clock AS c
           WHERE t.id = j.value ->> 0 AND t.lease_epoch = j.value ->> 1 AND t.state = 'running'"#,
        json
    )
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected())
}

/// A task the reaper moved out of `running`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reaped {
    /// Task id.
    pub id: i64,
    /// Task name.
    pub name: String,
    /// `pending` (runs again), `dead` (attempts exhausted) or `canceled` (a cancel was
    /// requested).
    pub state: String,
}

/// Reaps up to `limit` running tasks whose lease has expired, oldest lease first: back to
/// pending (due now), to dead when attempts are exhausted, or to canceled when a cancel was
/// requested; epoch + 1 either way, and `last_error` says `lease expired (worker W, attempt
/// N)`. A task that goes dead or canceled frees the identity it holds, in the same
/// transaction.
///
/// One `UPDATE … WHERE id IN (SELECT … ORDER BY lease_until LIMIT ?) RETURNING` on the partial
/// index `ix_taskq_lease`: with one writer at a time there is no renewal racing it, so every
/// expired lease found is reaped (MySQL reports found and reaped apart).
pub async fn task_reap_expired(
    conn: &mut SqliteConnection,
    limit: u32,
) -> sqlx::Result<Vec<Reaped>> {
    let mut tx = begin_write(conn).await?;
    let rows = sqlx::query!(
        r#"UPDATE taskq_tasks AS t
           SET last_error = 'lease expired (worker ' || COALESCE(t.worker_id, '?')
                            || ', attempt ' || t.attempt || ')',
               finished_at = CASE WHEN t.attempt >= t.max_attempts
                                    OR t.cancel_requested_at IS NOT NULL THEN c.us END,
               state = CASE WHEN t.cancel_requested_at IS NOT NULL THEN 'canceled'
                            WHEN t.attempt >= t.max_attempts THEN 'dead'
                            ELSE 'pending' END,
               lease_epoch = t.lease_epoch + 1, lease_until = NULL,
               run_at = c.us, updated_at = c.us
           FROM taskq_clock AS c
           WHERE t.id IN (SELECT id FROM taskq_tasks
                          WHERE state = 'running' AND lease_until < (SELECT us FROM taskq_clock)
                          ORDER BY lease_until
                          LIMIT ?1)
           RETURNING id AS "id!: i64", name AS "name!: String", state AS "state!: String",
             (unique_key IS NOT NULL) AS "unique!: bool""#,
        limit
    )
    .fetch_all(&mut *tx)
    .await?;
    let unique: Vec<i64> = rows.iter().filter(|r| r.unique).map(|r| r.id).collect();
    release_ended(&mut tx, &unique).await?;
    tx.commit().await?;
    let mut reaped: Vec<Reaped> = rows
        .into_iter()
        .map(|r| Reaped {
            id: r.id,
            name: r.name,
            state: r.state,
        })
        .collect();
    reaped.sort_unstable_by_key(|r| r.id);
    Ok(reaped)
}

/// Current `(id, lease_epoch)` of the given ids, by id; missing ids are absent.
pub async fn task_epochs(
    conn: &mut SqliteConnection,
    ids: &[i64],
) -> sqlx::Result<Vec<(i64, i64)>> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let json = serde_json::to_string(ids).map_err(|e| sqlx::Error::Encode(Box::new(e)))?;
    let rows = sqlx::query!(
        r#"SELECT t.id AS "id!: i64", t.lease_epoch AS "lease_epoch!: i64"
           FROM json_each(?1) AS j JOIN taskq_tasks AS t ON t.id = j.value
           ORDER BY t.id"#,
        json
    )
    .fetch_all(&mut *conn)
    .await?;
    Ok(rows.into_iter().map(|r| (r.id, r.lease_epoch)).collect())
}
