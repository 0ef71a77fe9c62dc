//! The worker's statements: claim under a lease, renew, write back under the epoch, release,
//! reap, and the epochs of ids.
//!
//! Every write-back of a claimed task is conditional on the `(id, lease_epoch)` its attempt
//! claimed; every statement that moves a task out of `running` behind a worker's back (reap,
//! release) increments the epoch, so a late write-back of that attempt matches nothing.
//! Batches of ids travel as one JSON array bound to one parameter and are read with
//! `json_each` (SQLite's `JSON_TABLE`).

use sqlx::SqliteConnection;
use taskq_driver::rows::{
    CanceledTask, ClaimBatch, ClaimRequest, Claimed, ExpiredTask, FollowUpRow, LapsedRow, LimitHit,
    NameList, ReapRow, Reaped, Settled, WriteBack, WrittenBack,
};
use taskq_driver::rules::{Allowance, claim_allowance, frees_identity, run_end_frees_identity};

use crate::connect::begin_write;
use crate::conv::{json, sids, signed, state, uid};
use crate::order::{Ended, tasks_moved};

/// A limited queue's limits as the claim reads them (inside its write transaction).
struct QueueLimits {
    concurrency_limit: Option<u32>,
    rate_limit: Option<u32>,
    rate_period_us: Option<i64>,
    /// Claims already counted in the current rate window.
    rate_used: i64,
    /// Microseconds until the current rate window ends.
    rate_resets_in_us: Option<i64>,
}

/// Claims up to `limit` due tasks of `queue` whose name is in `names`, in one `BEGIN
/// IMMEDIATE` transaction (a savepoint if `conn` is in one):
///
/// 0. only when `limited` is set (the worker saw the queue as limited): the queue's row of
///    `taskq_queues` and the count of its running tasks are read, and the claim takes no more
///    than the concurrency limit (minus running) and the rate limit (minus the claims counted
///    in the current window) allow; [`ClaimBatch::limited`] says when that was fewer than
///    `limit` (MySQL's `LimitHit`). The write lock replaces MySQL's lock of the queue's row:
///    no other claim runs between this count and this claim's commit;
/// 1. one `UPDATE … WHERE id IN (SELECT id … ORDER BY priority, run_at, id LIMIT ?)
///    RETURNING …`: the first `limit` pending, due rows of the queue in claim order (read on
///    the partial index `ix_taskq_claim`), unless the queue is paused. Each row past its
///    `deadline` becomes `expired` (attempt and epoch unchanged); every other row becomes
///    `running` with attempt and epoch + 1, `attempted_at` = now and a lease of `lease_us`
///    from now. Expired rows count towards the limit;
/// 2. with a rate limit and rows started: the count of the window the claim's clock falls in
///    (`rate_window_start`, `rate_window_count`), so no window counts more than the limit;
/// 3. only when some of those rows free their identity by the state they got
///    (`rules::frees_identity`: a task unique while pending that starts, a unique task that
///    ends expired or canceled): the deletion of those identities (`identities::release`).
///
/// The writer lock replaces MySQL's candidate read and `FOR UPDATE SKIP LOCKED`: two claims
/// never overlap in time, so the second sees the first's rows as running. A paused queue is
/// checked inside the statement (on MySQL the worker checks it before claiming).
pub(crate) async fn task_claim(
    conn: &mut SqliteConnection,
    req: &ClaimRequest<'_>,
) -> sqlx::Result<ClaimBatch> {
    let names = req.names.json();
    let mut tx = begin_write(conn).await?;
    let mut limit = req.limit;
    let mut hit = None;
    let mut rate_limited = false;
    if req.limited
        && let Some(l) = queue_limits(&mut tx, req.queue).await?
    {
        let mut concurrency = None;
        if let Some(max) = l.concurrency_limit {
            let running = sqlx::query_scalar!(
                r#"SELECT COUNT(*) AS "n!: i64" FROM taskq_tasks
                   WHERE state = 'running' AND queue = ?1"#,
                req.queue
            )
            .fetch_one(&mut *tx)
            .await?;
            concurrency = Some((max, running));
        }
        let rate = l
            .rate_limit
            .filter(|_| l.rate_period_us.is_some_and(|p| p > 0))
            .map(|max| (max, l.rate_used));
        rate_limited = rate.is_some();
        let Allowance {
            allowed,
            rate_binds,
        } = claim_allowance(limit, concurrency, rate);
        if allowed < limit {
            hit = Some(LimitHit {
                allowed,
                // The rate is what binds: the window is used up once this claim is full.
                rate_resets_in_us: l.rate_resets_in_us.filter(|_| rate_binds),
            });
        }
        limit = allowed;
        if limit == 0 {
            tx.commit().await?;
            return Ok(batch(hit));
        }
    }
    // A row past its deadline ends `expired`, one with a cancel request left by an earlier
    // attempt ends `canceled`; neither starts (attempt, epoch, lease and worker unchanged).
    let mut rows = sqlx::query!(
        r#"UPDATE taskq_tasks AS t
           SET state = CASE WHEN t.cancel_requested_at IS NOT NULL THEN 'canceled'
                            WHEN t.deadline <= c.us THEN 'expired' ELSE 'running' END,
               attempt = CASE WHEN t.deadline <= c.us OR t.cancel_requested_at IS NOT NULL
                              THEN t.attempt ELSE t.attempt + 1 END,
               lease_epoch = CASE WHEN t.deadline <= c.us OR t.cancel_requested_at IS NOT NULL
                                  THEN t.lease_epoch ELSE t.lease_epoch + 1 END,
               lease_until = CASE WHEN t.deadline <= c.us OR t.cancel_requested_at IS NOT NULL
                                  THEN NULL ELSE c.us + ?4 END,
               worker_id = CASE WHEN t.deadline <= c.us OR t.cancel_requested_at IS NOT NULL
                                THEN t.worker_id ELSE ?5 END,
               attempted_at = CASE WHEN t.deadline <= c.us OR t.cancel_requested_at IS NOT NULL
                                   THEN t.attempted_at ELSE c.us END,
               finished_at = CASE WHEN t.deadline <= c.us OR t.cancel_requested_at IS NOT NULL
                                  THEN c.us ELSE NULL END,
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
             updated_at AS "claimed_at!: i64",
             updated_at - run_at AS "wait_us!: i64",
             finished_at - deadline AS "late_us?: i64",
             trace_context AS "trace_context?: String",
             unique_key AS "unique_key?: Vec<u8>", unique_while AS "unique_while?: String",
             order_key AS "order_key?: Vec<u8>", order_seq AS "order_seq?: i64",
             order_dead_skips AS "order_dead_skips!: bool", workflow_id AS "workflow_id?: i64",
             batch_id AS "batch_id?: i64",
             CASE WHEN attempt > max_attempts THEN last_error END AS "parked_error?: String""#,
        req.queue,
        names,
        limit,
        req.lease_us,
        req.worker_id,
    )
    .fetch_all(&mut *tx)
    .await?;
    // RETURNING's order is unspecified: back to claim order.
    rows.sort_by_key(|r| (r.priority, r.run_at, r.id));
    let started = rows.iter().filter(|r| r.state == "running").count() as i64;
    if rate_limited && started > 0 {
        // Counted in the window of the claim's own clock (every row of the UPDATE has the
        // same `updated_at`), so no window holds more claims than the limit even when the
        // window turned between the limits read and the claim.
        let claimed_at = rows[0].claimed_at;
        sqlx::query!(
            r#"UPDATE taskq_queues
               SET rate_window_count =
                     CASE WHEN rate_window_start = ?2 / rate_period_us * rate_period_us
                          THEN rate_window_count + ?3 ELSE ?3 END,
                   rate_window_start = ?2 / rate_period_us * rate_period_us
               WHERE queue = ?1 AND rate_period_us > 0"#,
            req.queue,
            claimed_at,
            started
        )
        .execute(&mut *tx)
        .await?;
    }
    // Identities held while pending are freed by the start; ordered heads the claim ended
    // (expired, or canceled) let their keys go on.
    let mut moved = Vec::new();
    for r in rows
        .iter()
        .filter(|r| r.unique_key.is_some() || r.order_key.is_some())
    {
        moved.push(Ended {
            id: r.id,
            state: state(&r.state)?,
            unique_key: r.unique_key.clone(),
            unique_while: r.unique_while.clone(),
            order_key: r.order_key.clone(),
            order_seq: r.order_seq,
            dead_skips: r.order_dead_skips,
        });
    }
    tasks_moved(&mut tx, moved, frees_identity).await?;
    tx.commit().await?;
    let mut batch = batch(hit);
    for r in rows {
        if r.state == "canceled" {
            batch.canceled.push(CanceledTask {
                id: uid(r.id),
                name: r.name,
            });
        } else if r.state == "expired" {
            batch.expired.push(ExpiredTask {
                id: uid(r.id),
                name: r.name,
                late_us: r.late_us.unwrap_or(0),
            });
        } else {
            batch.tasks.push(Claimed {
                id: uid(r.id),
                name: r.name,
                payload: r.payload,
                attempt: r.attempt,
                max_attempts: r.max_attempts,
                snoozes: r.snoozes,
                lease_epoch: uid(r.lease_epoch),
                wait_us: r.wait_us,
                trace_context: r.trace_context,
                unique_key: r.unique_key,
                unique_while: r.unique_while,
                order_key: r.order_key,
                order_dead_skips: r.order_dead_skips,
                workflow_id: r.workflow_id.map(uid),
                batch_id: r.batch_id.map(uid),
                parked_error: r.parked_error,
            });
        }
    }
    Ok(batch)
}

/// An empty claim batch (SQLite's claim is never contended nor partial: it holds the write
/// lock and reads the whole queue).
fn batch(limited: Option<LimitHit>) -> ClaimBatch {
    ClaimBatch {
        tasks: Vec::new(),
        expired: Vec::new(),
        canceled: Vec::new(),
        limited,
        contended: false,
        partial: false,
        queue_controlled: false,
    }
}

/// Step 0 of a limited claim: the queue's limits, with the claims already counted in the
/// current rate window (windows are multiples of the period since the Unix epoch on the
/// database clock) and the time until it ends. `None` when the queue has no row.
async fn queue_limits(
    conn: &mut SqliteConnection,
    queue: &str,
) -> sqlx::Result<Option<QueueLimits>> {
    sqlx::query_as!(
        QueueLimits,
        r#"SELECT q.concurrency_limit AS "concurrency_limit?: u32",
             q.rate_limit AS "rate_limit?: u32", q.rate_period_us AS "rate_period_us?: i64",
             CASE WHEN q.rate_period_us > 0
                   AND q.rate_window_start = c.us / q.rate_period_us * q.rate_period_us
                  THEN q.rate_window_count ELSE 0 END AS "rate_used!: i64",
             CASE WHEN q.rate_period_us > 0
                  THEN (c.us / q.rate_period_us + 1) * q.rate_period_us - c.us END
               AS "rate_resets_in_us?: i64"
           FROM taskq_queues AS q, taskq_clock AS c
           WHERE q.queue = ?1"#,
        queue
    )
    .fetch_optional(&mut *conn)
    .await
}

/// `(id, epoch)` pairs as the JSON array of arrays the batch statements read.
fn leases_json(leases: &[(u64, u64)]) -> sqlx::Result<String> {
    json(&signed(leases))
}

/// Renews the leases `(id, epoch)` that are still held (running, same epoch, not expired) and
/// carry no cancel request, to `now + lease_us`. Returns how many were renewed: fewer than
/// sent means some were lost or asked to cancel, which [`task_leases_held`] tells apart (so a
/// beat with nothing to report costs one statement, as on MySQL).
pub(crate) async fn task_heartbeat(
    conn: &mut SqliteConnection,
    leases: &[(u64, u64)],
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

/// A lease still held, as [`task_leases_held`] reads it.
struct HeldLease {
    id: i64,
    epoch: i64,
    cancel_requested: bool,
}

/// Of the leases `(id, epoch)`, those still held (running, same epoch, unexpired), with
/// whether a cancel was requested.
pub(crate) async fn task_leases_held(
    conn: &mut SqliteConnection,
    leases: &[(u64, u64)],
) -> sqlx::Result<Vec<(u64, u64, bool)>> {
    if leases.is_empty() {
        return Ok(Vec::new());
    }
    let json = leases_json(leases)?;
    let held = sqlx::query_as!(
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
    .await?;
    Ok(held
        .into_iter()
        .map(|h| (uid(h.id), uid(h.epoch), h.cancel_requested))
        .collect())
}

/// Inserts follow-up tasks (`on_dead` / `on_success`, see `FollowUpRow`), pending and due now,
/// with `idempotency_key = key`, by the transaction that writes the end they follow, in order (one statement; none when `rows` is empty), pending and
/// due now. One whose idempotency key is already taken (which the fencing of the end makes
/// impossible unless a row with that key was inserted by hand) is left as it is rather than
/// failing the end's transaction. Returns how many were inserted.
async fn follow_ups_insert(
    conn: &mut SqliteConnection,
    rows: &[&FollowUpRow],
) -> sqlx::Result<u64> {
    if rows.is_empty() {
        return Ok(0);
    }
    // `FollowUpRow` serializes as `{q, n, p (hex), pr, m, tl?, k, t?}`.
    let json = json(rows)?;
    let done = sqlx::query!(
        r#"INSERT INTO taskq_tasks
             (queue, name, payload, state, priority, max_attempts, run_at, deadline,
              idempotency_key, trace_context, created_at, updated_at)
           SELECT j.value ->> 'q', j.value ->> 'n', unhex(j.value ->> 'p'), 'pending',
             j.value ->> 'pr', j.value ->> 'm', c.us, c.us + (j.value ->> 'tl'),
             j.value ->> 'k', j.value ->> 't', c.us, c.us
           FROM json_each(?1) AS j, taskq_clock AS c
           WHERE true
           ORDER BY j.key
           ON CONFLICT (name, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING"#,
        json
    )
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected())
}

/// Writes a batch of outcomes. Each row is written only if it is still running with the
/// epoch its attempt claimed (a row not written was reaped, released or retried behind the
/// worker's back). A snooze is a retry that gives its attempt back (`attempt - 1`) and counts
/// itself in `snoozes`. Every written row gets its attempt-history entry appended in the same
/// `UPDATE` (the latest 100 kept, the error cut to 1,024 characters), like MySQL's.
///
/// One `UPDATE … FROM json_each(?) RETURNING` in a write transaction; then, in it, the
/// follow-ups of exactly the rows it returned (a fenced outcome inserts nothing), and the
/// deletion of the identities the written rows free by the state they got, as
/// `rules::run_end_frees_identity` decides (a success of a task unique while running, a death,
/// a cancel; never a retry or snooze). `WriteBack::frees` is not read: the rule is applied to
/// the rows the statement wrote.
///
/// MySQL's `WrittenBack::deferred` does not exist here: no producer can hold an identity's row
/// while this runs (one writer at a time), so nothing is ever deferred.
pub(crate) async fn task_write_back(
    conn: &mut SqliteConnection,
    batch: &[WriteBack],
) -> sqlx::Result<WrittenBack> {
    if batch.is_empty() {
        return Ok(WrittenBack::default());
    }
    // `WriteBack` serializes as `{id, epoch, state, attempt, outcome, delay_us, error?,
    // output?}`: a success's output rides in the same statement.
    let json = json(batch)?;
    let mut tx = begin_write(conn).await?;
    let rows = sqlx::query!(
        r#"UPDATE taskq_tasks AS t
           SET attempts = CASE WHEN j.outcome = '' THEN t.attempts ELSE json_insert(
                 CASE WHEN json_array_length(COALESCE(t.attempts, '[]')) >= 100
                      THEN json_remove(t.attempts, '$[0]') ELSE COALESCE(t.attempts, '[]') END,
                 '$[#]',
                 json_object('attempt', j.attempt, 'epoch', j.epoch, 'worker', t.worker_id,
                   'started_at', strftime('%Y-%m-%d %H:%M:%S', t.attempted_at / 1000000, 'unixepoch')
                                 || printf('.%06d', t.attempted_at % 1000000),
                   'finished_at', strftime('%Y-%m-%d %H:%M:%S', c.us / 1000000, 'unixepoch')
                                  || printf('.%06d', c.us % 1000000),
                   'outcome', j.outcome,
                   'error', CASE WHEN length(j.error) > 1024 THEN substr(j.error, 1, 1023) || '…'
                                 ELSE j.error END)) END,
               state = CASE WHEN j.state = 'snoozed' THEN 'pending' ELSE j.state END,
               run_at = CASE WHEN j.state IN ('pending', 'snoozed') THEN c.us + j.delay_us
                             ELSE t.run_at END,
               finished_at = CASE WHEN j.state IN ('pending', 'snoozed') THEN NULL ELSE c.us END,
               attempt = CASE WHEN j.state = 'snoozed' AND t.attempt > 0 THEN t.attempt - 1
                              ELSE MIN(t.attempt, j.attempt) END,
               snoozes = CASE WHEN j.state = 'snoozed' THEN t.snoozes + 1 ELSE t.snoozes END,
               last_error = COALESCE(j.error, t.last_error),
               output = COALESCE(j.output, t.output),
               cancel_requested_at = CASE WHEN j.state IN ('succeeded', 'dead') THEN NULL
                                          ELSE t.cancel_requested_at END,
               lease_until = NULL,
               updated_at = c.us
           FROM (SELECT value ->> 'id' AS id, value ->> 'epoch' AS epoch,
                        value ->> 'state' AS state, value ->> 'attempt' AS attempt,
                        value ->> 'outcome' AS outcome, value ->> 'delay_us' AS delay_us,
                        value ->> 'error' AS error, value ->> 'output' AS output
                 FROM json_each(?1)) AS j,
                taskq_clock AS c
           WHERE t.id = j.id AND t.lease_epoch = j.epoch AND t.state = 'running'
           RETURNING id AS "id!: i64", state AS "state!: String",
             unique_key AS "unique_key?: Vec<u8>", unique_while AS "unique_while?: String",
             order_key AS "order_key?: Vec<u8>", order_seq AS "order_seq?: i64",
             order_dead_skips AS "order_dead_skips!: bool", workflow_id AS "workflow_id?: i64",
             batch_id AS "batch_id?: i64""#,
        json
    )
    .fetch_all(&mut *tx)
    .await?;
    let mut written: Vec<u64> = rows.iter().map(|r| uid(r.id)).collect();
    // Workflow steps this write-back ended settle the steps after them in the same transaction.
    let steps_ended: Vec<u64> = rows
        .iter()
        .filter(|r| r.workflow_id.is_some() && r.state != "pending" && r.state != "running")
        .map(|r| uid(r.id))
        .collect();
    // Batch members this write-back ended are counted in their batches in the same transaction.
    let members_ended: Vec<u64> = rows
        .iter()
        .filter(|r| r.batch_id.is_some() && r.state != "pending" && r.state != "running")
        .map(|r| uid(r.id))
        .collect();
    written.sort_unstable();
    let mut followed = Vec::new();
    let mut inserts = Vec::new();
    for f in batch {
        if let Some(row) = f.follow_up.as_deref()
            && written.binary_search(&f.id).is_ok()
            && !followed.contains(&f.id)
        {
            inserts.push(row);
            followed.push(f.id);
        }
    }
    follow_ups_insert(&mut tx, &inserts).await?;
    let mut moved = Vec::new();
    for r in rows {
        moved.push(Ended {
            id: r.id,
            state: state(&r.state)?,
            unique_key: r.unique_key,
            unique_while: r.unique_while,
            order_key: r.order_key,
            order_seq: r.order_seq,
            dead_skips: r.order_dead_skips,
        });
    }
    // Ordered heads this write-back ended let their keys go on, in the same transaction.
    tasks_moved(&mut tx, moved, run_end_frees_identity).await?;
    let settled = if steps_ended.is_empty() {
        Settled::default()
    } else {
        crate::workflows::settle(&mut tx, &steps_ended).await?
    };
    let counted = crate::batches::count_members(&mut tx, &members_ended).await?;
    tx.commit().await?;
    followed.sort_unstable();
    Ok(WrittenBack {
        written: written.len() as u64,
        deferred: Vec::new(),
        followed,
        settled,
        counted,
    })
}

/// Gives running tasks back (shutdown): pending (`run_at` kept), epoch + 1, the interrupted attempt not
/// counted, and a `released` entry appended to its attempt history. Conditional on each
/// `(id, epoch)`. Returns how many were released. (A pending task holds its identity, so none
/// is freed.)
pub(crate) async fn task_release(
    conn: &mut SqliteConnection,
    leases: &[(u64, u64)],
) -> sqlx::Result<u64> {
    if leases.is_empty() {
        return Ok(0);
    }
    let json = leases_json(leases)?;
    let done = sqlx::query!(
        r#"UPDATE taskq_tasks AS t
           SET attempts = json_insert(
                 CASE WHEN json_array_length(COALESCE(t.attempts, '[]')) >= 100
                      THEN json_remove(t.attempts, '$[0]') ELSE COALESCE(t.attempts, '[]') END,
                 '$[#]',
                 json_object('attempt', t.attempt, 'epoch', t.lease_epoch, 'worker', t.worker_id,
                   'started_at', strftime('%Y-%m-%d %H:%M:%S', t.attempted_at / 1000000, 'unixepoch')
                                 || printf('.%06d', t.attempted_at % 1000000),
                   'finished_at', strftime('%Y-%m-%d %H:%M:%S', c.us / 1000000, 'unixepoch')
                                  || printf('.%06d', c.us % 1000000),
                   'outcome', 'released', 'error', NULL)),
               state = 'pending', lease_epoch = t.lease_epoch + 1,
               attempt = MAX(t.attempt - 1, 0),
               lease_until = NULL, worker_id = NULL, updated_at = c.us
           FROM json_each(?1) AS j, taskq_clock AS c
           WHERE t.id = j.value ->> 0 AND t.lease_epoch = j.value ->> 1 AND t.state = 'running'"#,
        json
    )
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected())
}

/// The leases `(id, epoch)` of `queue`'s running tasks that `worker_id` claimed (database
/// clock) in the last `since_us` µs, by id: what a claim whose answer was lost may have taken
/// (MySQL's `task_running_since`).
pub(crate) async fn task_running_since(
    conn: &mut SqliteConnection,
    queue: &str,
    worker_id: &str,
    since_us: i64,
) -> sqlx::Result<Vec<(u64, u64)>> {
    let rows = sqlx::query!(
        r#"SELECT id AS "id!: i64", lease_epoch AS "lease_epoch!: i64"
           FROM taskq_tasks
           WHERE state = 'running' AND queue = ?1 AND worker_id = ?2
             AND attempted_at >= (SELECT us FROM taskq_clock) - ?3
           ORDER BY id"#,
        queue,
        worker_id,
        since_us
    )
    .fetch_all(&mut *conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| (uid(r.id), uid(r.lease_epoch)))
        .collect())
}

/// A lapsed lease as [`task_lapsed`] reads it.
struct LapsedRaw {
    id: i64,
    lease_epoch: i64,
    name: String,
    queue: String,
    attempt: u32,
    max_attempts: u32,
    worker_id: Option<String>,
    unique_key: Option<Vec<u8>>,
    unique_while: Option<String>,
    order_key: Option<Vec<u8>>,
    order_dead_skips: bool,
    canceled: bool,
    registered: bool,
    payload: Option<Vec<u8>>,
    trace_context: Option<String>,
}

/// Up to `limit` running tasks whose lease has expired, oldest lease first (a read of the
/// partial index `ix_taskq_lease`): the first half of a reap, [`task_reap`] the second, with
/// whether each task's name is in `names` (the names the reading worker registers). Only such
/// a worker knows a task's `on_dead` follow-up: a last attempt of a name it registers goes dead
/// (its payload is read for the follow-up), one of another name is parked back to pending
/// ([`LapsedRow::parks`]).
pub(crate) async fn task_lapsed(
    conn: &mut SqliteConnection,
    names: &NameList,
    limit: u32,
) -> sqlx::Result<Vec<LapsedRow>> {
    let names = names.json();
    let rows = sqlx::query_as!(
        LapsedRaw,
        r#"SELECT id AS "id!: i64", lease_epoch AS "lease_epoch!: i64", name AS "name!: String",
             queue AS "queue!: String", attempt AS "attempt!: u32",
             max_attempts AS "max_attempts!: u32", worker_id AS "worker_id?: String",
             unique_key AS "unique_key?: Vec<u8>", unique_while AS "unique_while?: String",
             order_key AS "order_key?: Vec<u8>", order_dead_skips AS "order_dead_skips!: bool",
             (cancel_requested_at IS NOT NULL) AS "canceled!: bool",
             (name IN (SELECT value FROM json_each(?1))) AS "registered!: bool",
             CASE WHEN attempt >= max_attempts AND cancel_requested_at IS NULL
                   AND name IN (SELECT value FROM json_each(?1)) THEN payload END
               AS "payload?: Vec<u8>",
             trace_context AS "trace_context?: String"
           FROM taskq_tasks
           WHERE state = 'running' AND lease_until < (SELECT us FROM taskq_clock)
           ORDER BY lease_until
           LIMIT ?2"#,
        names,
        limit
    )
    .fetch_all(&mut *conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| LapsedRow {
            id: uid(r.id),
            lease_epoch: uid(r.lease_epoch),
            name: r.name,
            queue: r.queue,
            attempt: r.attempt,
            max_attempts: r.max_attempts,
            worker_id: r.worker_id,
            unique_key: r.unique_key,
            unique_while: r.unique_while,
            order_key: r.order_key,
            order_dead_skips: r.order_dead_skips,
            canceled: r.canceled,
            registered: r.registered,
            payload: r.payload,
            trace_context: r.trace_context,
        })
        .collect())
}

/// Reaps expired leases read by [`task_lapsed`]: back to pending (`run_at` kept, so it sorts
/// where it was, ahead of the backlog enqueued after it), to dead when
/// attempts are exhausted (back to pending when the row is to be parked, `ReapRow::parks`),
/// or to canceled when a cancel was requested; epoch + 1 either way,
/// `last_error` says `lease expired (worker W, attempt N)`, and the attempt history gets a
/// `lease_lost` (or `canceled`) entry. Each row is reaped only if it is still running with the
/// epoch read and its lease still expired (a late write-back or heartbeat may have landed in
/// between).
///
/// One `UPDATE … FROM json_each(?) RETURNING` in a write transaction; then, in it, the
/// `on_dead` follow-ups of exactly the rows it moved to dead, and the deletion of the
/// identities the rows free by the state the reap gave them, as `rules::run_end_frees_identity`
/// decides (dead or canceled frees; a requeue or a parked row keeps it). That is what
/// `LapsedRow::frees()` named from the read, unless a cancel request landed in between: this
/// statement reads the request itself and cancels the task at once, and the rule frees the
/// identity of the canceled task (`ReapRow::frees` and `canceled`, the read's decision, are
/// not used here).
pub(crate) async fn task_reap(
    conn: &mut SqliteConnection,
    rows: &[ReapRow],
) -> sqlx::Result<Reaped> {
    if rows.is_empty() {
        return Ok(Reaped::default());
    }
    let reap: Vec<(u64, u64, u8)> = rows
        .iter()
        .map(|r| (r.id, r.epoch, u8::from(r.parks)))
        .collect();
    let json = json(&reap)?;
    let mut tx = begin_write(conn).await?;
    let reaped = sqlx::query!(
        r#"UPDATE taskq_tasks AS t
           SET attempts = json_insert(
                 CASE WHEN json_array_length(COALESCE(t.attempts, '[]')) >= 100
                      THEN json_remove(t.attempts, '$[0]') ELSE COALESCE(t.attempts, '[]') END,
                 '$[#]',
                 json_object('attempt', t.attempt, 'epoch', t.lease_epoch, 'worker', t.worker_id,
                   'started_at', strftime('%Y-%m-%d %H:%M:%S', t.attempted_at / 1000000, 'unixepoch')
                                 || printf('.%06d', t.attempted_at % 1000000),
                   'finished_at', strftime('%Y-%m-%d %H:%M:%S', c.us / 1000000, 'unixepoch')
                                  || printf('.%06d', c.us % 1000000),
                   'outcome', CASE WHEN t.cancel_requested_at IS NOT NULL THEN 'canceled'
                                   ELSE 'lease_lost' END,
                   'error', 'lease expired (worker ' || COALESCE(t.worker_id, '?')
                            || ', attempt ' || t.attempt || ')')),
               last_error = 'lease expired (worker ' || COALESCE(t.worker_id, '?')
                            || ', attempt ' || t.attempt || ')',
               finished_at = CASE WHEN (t.attempt >= t.max_attempts AND j.value ->> 2 = 0)
                                    OR t.cancel_requested_at IS NOT NULL THEN c.us END,
               state = CASE WHEN t.cancel_requested_at IS NOT NULL THEN 'canceled'
                            WHEN t.attempt >= t.max_attempts AND j.value ->> 2 = 0 THEN 'dead'
                            ELSE 'pending' END,
               lease_epoch = t.lease_epoch + 1, lease_until = NULL, updated_at = c.us
           FROM json_each(?1) AS j, taskq_clock AS c
           WHERE t.id = j.value ->> 0 AND t.lease_epoch = j.value ->> 1
             AND t.state = 'running' AND t.lease_until < c.us
           RETURNING id AS "id!: i64", state AS "state!: String",
             unique_key AS "unique_key?: Vec<u8>", unique_while AS "unique_while?: String",
             order_key AS "order_key?: Vec<u8>", order_seq AS "order_seq?: i64",
             order_dead_skips AS "order_dead_skips!: bool""#,
        json
    )
    .fetch_all(&mut *tx)
    .await?;
    let mut out = Reaped::default();
    let mut inserts = Vec::new();
    for r in &reaped {
        if r.state != "dead" {
            continue;
        }
        if let Some(f) = rows
            .iter()
            .find(|x| x.id == uid(r.id))
            .and_then(|x| x.follow_up.as_deref())
        {
            inserts.push(f);
            out.followed.push(uid(r.id));
        }
    }
    follow_ups_insert(&mut tx, &inserts).await?;
    let mut moved = Vec::new();
    for r in reaped {
        let to = state(&r.state)?;
        out.rows.push((uid(r.id), to));
        moved.push(Ended {
            id: r.id,
            state: to,
            unique_key: r.unique_key,
            unique_while: r.unique_while,
            order_key: r.order_key,
            order_seq: r.order_seq,
            dead_skips: r.order_dead_skips,
        });
    }
    // Ordered heads the reap ended (canceled, or dead letting their key go on).
    tasks_moved(&mut tx, moved, run_end_frees_identity).await?;
    tx.commit().await?;
    out.followed.sort_unstable();
    out.rows.sort_unstable_by_key(|r| r.0);
    out.reaped = out.rows.len() as u64;
    Ok(out)
}

/// Current `(id, lease_epoch)` of the given ids, by id; missing ids are absent.
pub(crate) async fn task_epochs(
    conn: &mut SqliteConnection,
    ids: &[u64],
) -> sqlx::Result<Vec<(u64, u64)>> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let json = json(&sids(ids))?;
    let rows = sqlx::query!(
        r#"SELECT t.id AS "id!: i64", t.lease_epoch AS "lease_epoch!: i64"
           FROM json_each(?1) AS j JOIN taskq_tasks AS t ON t.id = j.value
           ORDER BY t.id"#,
        json
    )
    .fetch_all(&mut *conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| (uid(r.id), uid(r.lease_epoch)))
        .collect())
}
