//! Statements on running tasks, each under the lease epoch its attempt claimed: heartbeat, the
//! leases still held, the write-back of outcomes (with their follow-ups), release at shutdown,
//! and the reap of expired leases.

use sqlx::{Connection, MySqlConnection};
use taskq_driver::driver::Leases;

use crate::MySqlDriver;
use crate::identities::{Taken, identities_free_written, identities_take};
use crate::order::{order_advance_ids_or_skip, order_advance_later, order_keys_advance_stranded};
use taskq_driver::rows::{
    BatchCounted, FollowUpRow, LapsedRow, NameList, ReapRow, Reaped, Settled, WriteBack,
    WrittenBack,
};
use taskq_driver::state::TaskState;

impl Leases for MySqlDriver {
    /// Renews the leases `(id, epoch)` that are still held (running, same epoch, not expired)
    /// and carry no cancel request to `now + lease_us`. Returns how many were renewed: fewer
    /// than sent makes the worker read [`task_leases_held`](Self::task_leases_held), which
    /// also reports the cancel requests (so a beat with none costs one statement).
    async fn task_heartbeat(
        &self,
        conn: &mut MySqlConnection,
        leases: &[(u64, u64)],
        lease_us: i64,
    ) -> sqlx::Result<u64> {
        let leases_json = crate::leases_json(leases);
        let done = sqlx::query!(
            r#"UPDATE JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$[0]',
                                                   epoch BIGINT UNSIGNED PATH '$[1]')) AS j
                 STRAIGHT_JOIN taskq_tasks t FORCE INDEX (PRIMARY) ON t.id = j.id AND t.lease_epoch = j.epoch
               SET t.lease_until = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, t.updated_at = UTC_TIMESTAMP(6)
               WHERE t.state = 'running' AND t.lease_until > UTC_TIMESTAMP(6)
                 AND t.cancel_requested_at IS NULL"#,
            leases_json,
            lease_us
        )
        .execute(&mut *conn)
        .await?;
        Ok(done.rows_affected())
    }

    /// Of the leases `(id, epoch)`, those still held: running, same epoch, unexpired; with
    /// whether a cancel was requested (`Client::cancel` on the running task).
    async fn task_leases_held(
        &self,
        conn: &mut MySqlConnection,
        leases: &[(u64, u64)],
    ) -> sqlx::Result<Vec<(u64, u64, bool)>> {
        let leases_json = crate::leases_json(leases);
        let rows = sqlx::query!(
            r#"SELECT t.id AS "id: u64", t.lease_epoch AS "lease_epoch: u64",
                 (t.cancel_requested_at IS NOT NULL) AS "cancel_requested!: bool"
               FROM JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$[0]',
                                                 epoch BIGINT UNSIGNED PATH '$[1]')) AS j
                 STRAIGHT_JOIN taskq_tasks t FORCE INDEX (PRIMARY) ON t.id = j.id AND t.lease_epoch = j.epoch
               WHERE t.state = 'running' AND t.lease_until > UTC_TIMESTAMP(6)"#,
            leases_json
        )
        .fetch_all(&mut *conn)
        .await?;
        Ok(rows
            .into_iter()
            .map(|r| (r.id, r.lease_epoch, r.cancel_requested))
            .collect())
    }

    /// Writes a batch of outcomes. Each row is written only if it is still running with the
    /// epoch its attempt claimed. A snooze is a retry that gives its attempt back (`attempt - 1`,
    /// like a release) and counts itself in `snoozes`. One statement, unless some outcomes free
    /// a unique identity: then one short transaction that locks those identities `SKIP LOCKED`,
    /// writes the outcomes, and deletes the identities of the rows it wrote. An outcome whose
    /// identity another transaction holds (a producer that got `duplicate = true` for this task
    /// and has not ended) is deferred, see [`WrittenBack::deferred`]: deleting the identity would
    /// wait for that transaction while holding the batch's rows, on which the heartbeat of every
    /// lease in the batch would then wait too.
    ///
    /// Outcomes carrying a follow-up (`on_dead` / `on_success`) make it a transaction as well:
    /// a locking read of the batch's rows by primary key (ascending id) tells which are still
    /// running with their attempt's epoch, the `UPDATE` writes exactly those, and one `INSERT`
    /// adds the follow-ups of those among them, before the commit. A fenced outcome inserts
    /// nothing; a batch without follow-ups keeps the single statement.
    ///
    /// Outcomes that end a workflow step (`WriteBack::workflow_step_ends`) make it a
    /// transaction the same way: the steps after those written are settled in it
    /// (`workflows::settle`), so a step's end and its effect on the steps after it commit
    /// together.
    async fn task_write_back(
        &self,
        conn: &mut MySqlConnection,
        batch: &[WriteBack],
    ) -> sqlx::Result<WrittenBack> {
        let wanted: Vec<(&[u8], u64)> = batch
            .iter()
            .filter_map(|f| f.frees.as_deref().map(|k| (k, f.id)))
            .collect();
        let follow = batch.iter().any(|f| f.follow_up.is_some());
        // Outcomes that end an ordered key's head promote the key's next task in the same
        // transaction when the key's row is free, or right after the commit when a producer's
        // transaction holds it (`order::order_advance_ids_or_skip`: like a held identity, a
        // held key is never waited for while the batch's rows are locked); a batch without
        // any keeps its single statement.
        let ordered = batch.iter().any(|f| f.order_ends.is_some());
        // Outcomes that end a workflow step settle the steps after it in the same
        // transaction (`workflows::settle`); a batch without any keeps its single statement.
        let steps = batch.iter().any(|f| f.workflow_step_ends);
        // Outcomes that end a batch member are counted in its batch in the same transaction
        // (`batches::count_members`); a batch without any keeps its single statement.
        let members = batch.iter().any(|f| f.batch_ends);
        if wanted.is_empty() && !follow && !ordered && !steps && !members {
            return Ok(WrittenBack {
                written: write_back_rows(conn, batch.iter()).await?,
                ..WrittenBack::default()
            });
        }
        let mut tx = conn.begin().await?;
        let taken = if wanted.is_empty() {
            Taken::default()
        } else {
            identities_take(&mut tx, &wanted).await?
        };
        let deferred = taken.held_elsewhere;
        let rows: Vec<&WriteBack> = batch.iter().filter(|f| !deferred.contains(&f.id)).collect();
        // With follow-ups, first lock the batch's rows (ascending id, like every batch
        // statement) and learn which are still running with their attempt's epoch: exactly
        // those the `UPDATE` writes, so exactly their follow-ups are inserted.
        let written_ids = if rows.iter().any(|f| {
            f.follow_up.is_some() || f.order_ends.is_some() || f.workflow_step_ends || f.batch_ends
        }) {
            let leases: Vec<(u64, u64)> = rows.iter().map(|f| (f.id, f.epoch)).collect();
            Some(lock_running(&mut tx, &crate::leases_json(&leases)).await?)
        } else {
            None
        };
        let written = write_back_rows(&mut tx, rows.iter().copied()).await?;
        let mut followed = Vec::new();
        let mut skipped = Vec::new();
        let mut settled = Settled::default();
        let mut counted = BatchCounted::default();
        if let Some(ids) = &written_ids {
            let ended: Vec<u64> = rows
                .iter()
                .filter(|f| f.order_ends.is_some() && ids.contains(&f.id))
                .map(|f| f.id)
                .collect();
            skipped = order_advance_ids_or_skip(&mut tx, &ended).await?;
            let steps_ended: Vec<u64> = rows
                .iter()
                .filter(|f| f.workflow_step_ends && ids.contains(&f.id))
                .map(|f| f.id)
                .collect();
            if !steps_ended.is_empty() {
                settled = crate::workflows::settle(&mut tx, &steps_ended).await?;
            }
            let members_ended: Vec<u64> = rows
                .iter()
                .filter(|f| f.batch_ends && ids.contains(&f.id))
                .map(|f| f.id)
                .collect();
            if !members_ended.is_empty() {
                counted = crate::batches::count_members(&mut tx, &members_ended, true).await?;
            }
        }
        if let Some(ids) = written_ids {
            let mut inserts: Vec<&FollowUpRow> = Vec::new();
            for f in rows.iter().filter(|f| ids.contains(&f.id)) {
                if let Some(row) = f.follow_up.as_deref() {
                    inserts.push(row);
                    followed.push(f.id);
                }
            }
            follow_ups_insert(&mut tx, &inserts).await?;
        }
        let free: Vec<(String, u64, u64, &str)> = rows
            .iter()
            .filter(|f| taken.ours.iter().any(|(_, id)| *id == f.id))
            .filter_map(|f| {
                let k = f.frees.as_deref()?;
                Some((taskq_driver::rows::hex(k), f.id, f.epoch, f.state))
            })
            .collect();
        identities_free_written(&mut tx, &free).await?;
        tx.commit().await?;
        order_advance_later(&self.pool, skipped);
        crate::batches::count_later(&self.pool, counted.deferred.clone());
        Ok(WrittenBack {
            written,
            deferred,
            followed,
            settled,
            counted,
        })
    }

    /// Gives running tasks back (shutdown): pending, epoch incremented, the interrupted
    /// attempt not counted, `run_at` kept (so the task sorts where it was, ahead of tasks
    /// enqueued after it). Conditional on each `(id, epoch)`.
    async fn task_release(
        &self,
        conn: &mut MySqlConnection,
        leases: &[(u64, u64)],
    ) -> sqlx::Result<u64> {
        let leases_json = crate::leases_json(leases);
        let done = sqlx::query!(
            r#"UPDATE JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$[0]',
                                                   epoch BIGINT UNSIGNED PATH '$[1]')) AS j
                 STRAIGHT_JOIN taskq_tasks t FORCE INDEX (PRIMARY) ON t.id = j.id AND t.lease_epoch = j.epoch
               SET t.attempts = JSON_ARRAY_APPEND(
                     IF(JSON_LENGTH(COALESCE(t.attempts, '[]')) >= 100, JSON_REMOVE(t.attempts, '$[0]'),
                        COALESCE(t.attempts, '[]')), '$',
                     JSON_OBJECT('attempt', t.attempt, 'epoch', j.epoch, 'worker', t.worker_id,
                       'started_at', DATE_FORMAT(t.attempted_at, '%Y-%m-%d %H:%i:%s.%f'),
                       'finished_at', DATE_FORMAT(UTC_TIMESTAMP(6), '%Y-%m-%d %H:%i:%s.%f'),
                       'outcome', 'released', 'error', NULL)),
                   t.state = 'pending', t.lease_epoch = t.lease_epoch + 1,
                   t.attempt = IF(t.attempt > 0, t.attempt - 1, 0),
                   t.lease_until = NULL, t.worker_id = NULL,
                   t.updated_at = UTC_TIMESTAMP(6)
               WHERE t.state = 'running'"#,
            leases_json
        )
        .execute(&mut *conn)
        .await?;
        Ok(done.rows_affected())
    }

    /// The leases `(id, epoch)` of `queue`'s running tasks that `worker_id` claimed (on the
    /// database clock) in the last `since_us` µs: a plain read of `ix_taskq_claim`'s running
    /// range for the queue (the running tasks of a queue are few: at most the fleet's slots).
    /// Issued only after a claim whose answer was lost (see `worker::claim`).
    async fn task_running_since(
        &self,
        conn: &mut MySqlConnection,
        queue: &str,
        worker_id: &str,
        since_us: i64,
    ) -> sqlx::Result<Vec<(u64, u64)>> {
        let rows = sqlx::query!(
            r#"SELECT id AS "id: u64", lease_epoch AS "lease_epoch: u64"
               FROM taskq_tasks
               WHERE state = 'running' AND queue = ? AND worker_id = ?
                 AND attempted_at >= UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND"#,
            queue,
            worker_id,
            since_us
        )
        .fetch_all(&mut *conn)
        .await?;
        Ok(rows.into_iter().map(|r| (r.id, r.lease_epoch)).collect())
    }

    /// Up to `limit` running tasks whose lease has expired, oldest lease first: a plain read of
    /// `ix_taskq_lease`, the first half of a reap ([`task_reap`](Self::task_reap) is the
    /// second), with whether each task's name is in `names` (the names this worker
    /// registers). Only such a worker knows a task's `on_dead` follow-up: a last attempt of a
    /// name it registers goes dead (its payload is read for the follow-up), one of another
    /// name is parked back to pending (see `LapsedRow::parks`).
    async fn task_lapsed(
        &self,
        conn: &mut MySqlConnection,
        names: &NameList,
        limit: u32,
    ) -> sqlx::Result<Vec<LapsedRow>> {
        let names_json = names.json();
        sqlx::query_as!(
            LapsedRow,
            r#"SELECT id AS "id: u64", lease_epoch AS "lease_epoch: u64", name, queue,
                 attempt AS "attempt: u32", max_attempts AS "max_attempts: u32", worker_id,
                 unique_key AS "unique_key: Vec<u8>", unique_while,
                 order_key AS "order_key: Vec<u8>", order_dead_skips AS "order_dead_skips: bool",
                 (cancel_requested_at IS NOT NULL) AS "canceled!: bool",
                 (JSON_CONTAINS(?, JSON_QUOTE(name)) = 1) AS "registered!: bool",
                 IF(attempt >= max_attempts AND cancel_requested_at IS NULL
                      AND JSON_CONTAINS(?, JSON_QUOTE(name)), payload, NULL)
                   AS "payload: Vec<u8>",
                 trace_context
               FROM taskq_tasks
               WHERE state = 'running' AND lease_until < UTC_TIMESTAMP(6)
               ORDER BY lease_until
               LIMIT ?"#,
            names_json,
            names_json,
            limit
        )
        .fetch_all(&mut *conn)
        .await
    }

    /// Reaps expired leases read by [`task_lapsed`](Self::task_lapsed): back to pending
    /// with its `run_at` kept (like Oban's Lifeline: it sorts where it was in its queue, ahead
    /// of the tasks enqueued after it, instead of behind the whole backlog), to dead when attempts are exhausted, or to canceled when a cancel was requested (a
    /// reclaim never resurrects a canceled task); epoch incremented either way. Each row is
    /// reaped only if it is still running with the epoch read, its lease still expired (a
    /// late write-back may have landed in between) and its cancel request as read (a request
    /// that landed in between is left for the next round, see `reap_rows`). Returns how many were reaped and, when
    /// `exact` is set or follow-ups were inserted, which rows (and their new state).
    ///
    /// Two statements in all, like the claim: the plain read of expired ids on
    /// `ix_taskq_lease`, then one `UPDATE` by primary key in id order that re-checks the
    /// expiry. A single `UPDATE … WHERE state = 'running' AND lease_until < now ORDER BY
    /// lease_until` locks `ix_taskq_lease` entries before the rows (including, briefly, the
    /// first entry past the range: a lease that is not expired), while a write-back holds the
    /// row and then needs that entry: the no-fault reliability baseline counted such deadlocks.
    /// Now every statement that locks running rows locks them by primary key first, in
    /// ascending id order.
    ///
    /// A task that goes dead or canceled frees the unique identity it holds. When some do, the
    /// `UPDATE` runs in a transaction that first locks those identities `SKIP LOCKED` and then
    /// deletes them, and it leaves for a later round the tasks whose identity a producer's open
    /// transaction holds, like the write-back. When a row carries a follow-up (or `exact` is
    /// asked), the transaction first locks the rows by primary key (ascending id) and reads
    /// which are still expired and whether each goes dead; the follow-ups of exactly the rows
    /// it moves to dead are inserted before it commits.
    async fn task_reap(
        &self,
        conn: &mut MySqlConnection,
        rows: &[ReapRow],
        exact: bool,
    ) -> sqlx::Result<Reaped> {
        if rows.is_empty() {
            return Ok(Reaped::default());
        }
        let wanted: Vec<(&[u8], u64)> = rows
            .iter()
            .filter_map(|r| r.frees.as_deref().map(|k| (k, r.id)))
            .collect();
        let follow = rows.iter().any(|r| r.follow_up.is_some());
        let ordered = rows.iter().any(|r| r.order_ends.is_some());
        let exact = exact || ordered;
        if wanted.is_empty() && !follow && !exact {
            let all: Vec<&ReapRow> = rows.iter().collect();
            let reaped = reap_rows(conn, &reap_json(&all)).await?;
            return Ok(Reaped {
                reaped,
                ..Reaped::default()
            });
        }
        let mut tx = conn.begin().await?;
        let taken = if wanted.is_empty() {
            Taken::default()
        } else {
            identities_take(&mut tx, &wanted).await?
        };
        let kept: Vec<&ReapRow> = rows
            .iter()
            .filter(|r| !taken.held_elsewhere.contains(&r.id))
            .collect();
        let (json, locked) = if follow || exact {
            let locked = lock_expired(&mut tx, &reap_json(&kept)).await?;
            let kept: Vec<&ReapRow> = kept
                .into_iter()
                .filter(|r| locked.iter().any(|l| l.id == r.id && l.epoch == r.epoch))
                .collect();
            (reap_json(&kept), Some(locked))
        } else {
            (reap_json(&kept), None)
        };
        let reaped = reap_rows(&mut tx, &json).await?;
        let mut out = Reaped {
            reaped,
            ..Reaped::default()
        };
        let mut skipped = Vec::new();
        if let Some(locked) = &locked {
            let mut inserts = Vec::new();
            for l in locked {
                let state = match (l.canceled, l.goes_dead) {
                    (true, _) => TaskState::Canceled,
                    (false, true) => TaskState::Dead,
                    (false, false) => TaskState::Pending,
                };
                out.rows.push((l.id, state));
                let row = rows.iter().find(|r| r.id == l.id);
                if let Some(f) = row.and_then(|r| r.follow_up.as_deref())
                    && state == TaskState::Dead
                {
                    inserts.push(f);
                    out.followed.push(l.id);
                }
            }
            follow_ups_insert(&mut tx, &inserts).await?;
            // Ordered heads the reap ended (canceled, or dead and letting their key go on).
            let ended: Vec<u64> = out
                .rows
                .iter()
                .filter(|(id, state)| {
                    *state != TaskState::Pending
                        && rows.iter().any(|r| r.id == *id && r.order_ends.is_some())
                })
                .map(|(id, _)| *id)
                .collect();
            skipped = order_advance_ids_or_skip(&mut tx, &ended).await?;
        }
        // Those reaped to dead or canceled, with the epoch the reap gave them.
        let free: Vec<(String, u64, u64, &str)> = rows
            .iter()
            .filter(|r| taken.ours.iter().any(|(_, id)| *id == r.id))
            .filter_map(|r| {
                let k = r.frees.as_deref()?;
                let state = if r.canceled { "canceled" } else { "dead" };
                Some((taskq_driver::rows::hex(k), r.id, r.epoch + 1, state))
            })
            .collect();
        identities_free_written(&mut tx, &free).await?;
        tx.commit().await?;
        order_advance_later(&self.pool, skipped);
        Ok(out)
    }

    /// See `order::order_keys_advance_stranded`.
    async fn order_keys_advance_stranded(
        &self,
        conn: &mut MySqlConnection,
        limit: u32,
    ) -> sqlx::Result<u64> {
        order_keys_advance_stranded(conn, limit).await
    }

    /// Current `(id, lease_epoch)` of the given ids; missing ids are absent.
    async fn task_epochs(
        &self,
        conn: &mut MySqlConnection,
        ids: &[u64],
    ) -> sqlx::Result<Vec<(u64, u64)>> {
        let ids_json = serde_json::to_string(ids).expect("ids serialize");
        let rows = sqlx::query!(
            r#"SELECT t.id AS "id: u64", t.lease_epoch AS "lease_epoch: u64"
               FROM JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$')) AS j
                 STRAIGHT_JOIN taskq_tasks t FORCE INDEX (PRIMARY) ON t.id = j.id"#,
            ids_json
        )
        .fetch_all(&mut *conn)
        .await?;
        Ok(rows.into_iter().map(|r| (r.id, r.lease_epoch)).collect())
    }
}

/// The rows of a reap as the JSON its statements read: `[[id, epoch, canceled, park], ..]`
/// sorted by id (locked in ascending order), `canceled` 1 when the read saw a cancel request,
/// `park` 1 for a last attempt parked back to pending (see `LapsedRow::parks`).
fn reap_json(rows: &[&ReapRow]) -> String {
    let mut out: Vec<(u64, u64, u8, u8)> = rows
        .iter()
        .map(|r| (r.id, r.epoch, u8::from(r.canceled), u8::from(r.parks)))
        .collect();
    out.sort_unstable();
    serde_json::to_string(&out).expect("reap rows serialize")
}

/// The `UPDATE` of [`MySqlDriver::task_reap`], on the rows of `reap_json` (see [`reap_json`]).
///
/// A row is written only if its cancel request is as [`MySqlDriver::task_lapsed`] read it: which
/// identity the reap frees (and whether it frees one at all) was decided from that read, so a
/// cancel request that landed in between (`Client::cancel` on a task whose lease had just
/// expired) would otherwise move the task to `canceled` with its identity still held. Such a
/// row is left running and expired for the next round, which reads the request.
async fn reap_rows(conn: &mut MySqlConnection, reap_json: &str) -> sqlx::Result<u64> {
    let done = sqlx::query!(
        r#"UPDATE JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$[0]',
                                               epoch BIGINT UNSIGNED PATH '$[1]',
                                               canceled INT PATH '$[2]',
                                               park INT PATH '$[3]')) AS j
             STRAIGHT_JOIN taskq_tasks t FORCE INDEX (PRIMARY) ON t.id = j.id AND t.lease_epoch = j.epoch
           SET t.attempts = JSON_ARRAY_APPEND(
                 IF(JSON_LENGTH(COALESCE(t.attempts, '[]')) >= 100, JSON_REMOVE(t.attempts, '$[0]'),
                    COALESCE(t.attempts, '[]')), '$',
                 JSON_OBJECT('attempt', t.attempt, 'epoch', t.lease_epoch, 'worker', t.worker_id,
                   'started_at', DATE_FORMAT(t.attempted_at, '%Y-%m-%d %H:%i:%s.%f'),
                   'finished_at', DATE_FORMAT(UTC_TIMESTAMP(6), '%Y-%m-%d %H:%i:%s.%f'),
                   'outcome', IF(t.cancel_requested_at IS NOT NULL, 'canceled', 'lease_lost'),
                   'error', CONCAT('lease expired (worker ', COALESCE(t.worker_id, '?'),
                                   ', attempt ', t.attempt, ')'))),
               t.last_error = CONCAT('lease expired (worker ', COALESCE(t.worker_id, '?'),
                                     ', attempt ', t.attempt, ')'),
               t.finished_at = IF((t.attempt >= t.max_attempts AND j.park = 0)
                                    OR t.cancel_requested_at IS NOT NULL, UTC_TIMESTAMP(6), NULL),
               t.state = IF(t.cancel_requested_at IS NOT NULL, 'canceled',
                            IF(t.attempt >= t.max_attempts AND j.park = 0, 'dead', 'pending')),
               t.lease_epoch = t.lease_epoch + 1, t.lease_until = NULL,
               t.updated_at = UTC_TIMESTAMP(6)
           WHERE t.state = 'running' AND t.lease_until < UTC_TIMESTAMP(6)
             AND (t.cancel_requested_at IS NOT NULL) = (j.canceled = 1)"#,
        reap_json
    )
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected())
}

/// Locks the rows of the leases `(id, epoch)` in `leases_json` (sorted by id) and returns the
/// ids of those still running with that epoch: the rows a write-back in the same transaction
/// writes.
async fn lock_running(conn: &mut MySqlConnection, leases_json: &str) -> sqlx::Result<Vec<u64>> {
    sqlx::query_scalar!(
        r#"SELECT t.id AS "id: u64"
           FROM JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$[0]',
                                             epoch BIGINT UNSIGNED PATH '$[1]')) AS j
             STRAIGHT_JOIN taskq_tasks t FORCE INDEX (PRIMARY) ON t.id = j.id AND t.lease_epoch = j.epoch
           WHERE t.state = 'running'
           FOR UPDATE"#,
        leases_json
    )
    .fetch_all(&mut *conn)
    .await
}

/// A row [`lock_expired`] locked.
struct LockedExpired {
    id: u64,
    epoch: u64,
    goes_dead: bool,
    canceled: bool,
}

/// Locks the rows of `reap_json` (see [`reap_json`]) and returns those still running with
/// that epoch, an expired lease and the cancel request as read, with where the reap sends
/// each: the rows [`reap_rows`] in the same transaction writes.
async fn lock_expired(
    conn: &mut MySqlConnection,
    reap_json: &str,
) -> sqlx::Result<Vec<LockedExpired>> {
    sqlx::query_as!(
        LockedExpired,
        r#"SELECT t.id AS "id: u64", t.lease_epoch AS "epoch: u64",
             (t.attempt >= t.max_attempts AND t.cancel_requested_at IS NULL AND j.park = 0)
               AS "goes_dead!: bool",
             (t.cancel_requested_at IS NOT NULL) AS "canceled!: bool"
           FROM JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$[0]',
                                             epoch BIGINT UNSIGNED PATH '$[1]',
                                             canceled INT PATH '$[2]',
                                             park INT PATH '$[3]')) AS j
             STRAIGHT_JOIN taskq_tasks t FORCE INDEX (PRIMARY) ON t.id = j.id AND t.lease_epoch = j.epoch
           WHERE t.state = 'running' AND t.lease_until < UTC_TIMESTAMP(6)
             AND (t.cancel_requested_at IS NOT NULL) = (j.canceled = 1)
           FOR UPDATE"#,
        reap_json
    )
    .fetch_all(&mut *conn)
    .await
}

/// Inserts follow-up tasks (one statement, none when `rows` is empty), pending and due now.
/// Each carries the idempotency key of the end it follows; one already there (which the
/// locking of the write-back makes impossible) is left as it is rather than failing the
/// write-back.
async fn follow_ups_insert(conn: &mut MySqlConnection, rows: &[&FollowUpRow]) -> sqlx::Result<u64> {
    if rows.is_empty() {
        return Ok(0);
    }
    let json = serde_json::to_string(rows).expect("follow-ups serialize");
    let done = sqlx::query!(
        r#"INSERT INTO taskq_tasks
            (queue, name, payload, state, priority, max_attempts, run_at, deadline,
             idempotency_key, trace_context, created_at, updated_at)
           SELECT j.queue, j.name, UNHEX(j.payload), 'pending', j.priority, j.max_attempts,
             UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL j.ttl_us MICROSECOND, j.k,
             j.trace_context, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6)
           FROM JSON_TABLE(?, '$[*]' COLUMNS (
                 ord FOR ORDINALITY,
                 queue VARCHAR(64) PATH '$.q',
                 name VARCHAR(255) PATH '$.n',
                 payload LONGTEXT PATH '$.p',
                 priority SMALLINT PATH '$.pr',
                 max_attempts INT UNSIGNED PATH '$.m',
                 ttl_us BIGINT PATH '$.tl',
                 k VARCHAR(255) PATH '$.k',
                 trace_context VARCHAR(512) PATH '$.t')) AS j
           ORDER BY j.ord
           ON DUPLICATE KEY UPDATE taskq_tasks.updated_at = taskq_tasks.updated_at"#,
        json
    )
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected())
}

/// The write-back statement of [`MySqlDriver::task_write_back`]: one `UPDATE` for every outcome, each row
/// written only while running with the epoch its attempt claimed; a success's output
/// (`WriteBack::output`) travels in the same JSON row. An outcome with an empty
/// `outcome` appends no attempt-history entry, and one whose `attempt` is below the row's sets
/// it back (a parked task ended without running: see `Claimed::parked_error`).
async fn write_back_rows<'f>(
    conn: &mut MySqlConnection,
    batch: impl Iterator<Item = &'f WriteBack>,
) -> sqlx::Result<u64> {
    // Sorted by id, like `leases_json`, so batches lock rows in one global order.
    let mut sorted: Vec<&WriteBack> = batch.collect();
    if sorted.is_empty() {
        return Ok(0);
    }
    sorted.sort_unstable_by_key(|f| f.id);
    let json = serde_json::to_string(&sorted).expect("finish batch serializes");
    let done = sqlx::query!(
        r#"UPDATE JSON_TABLE(?, '$[*]' COLUMNS (
                 id BIGINT UNSIGNED PATH '$.id',
                 epoch BIGINT UNSIGNED PATH '$.epoch',
                 state VARCHAR(16) PATH '$.state',
                 attempt INT UNSIGNED PATH '$.attempt',
                 outcome VARCHAR(16) PATH '$.outcome',
                 delay_us BIGINT PATH '$.delay_us',
                 error TEXT CHARACTER SET utf8mb4 PATH '$.error',
                 output MEDIUMTEXT CHARACTER SET utf8mb4 PATH '$.output')) AS j
             STRAIGHT_JOIN taskq_tasks t FORCE INDEX (PRIMARY) ON t.id = j.id AND t.lease_epoch = j.epoch
           SET t.attempts = IF(j.outcome = '', t.attempts, JSON_ARRAY_APPEND(
                 IF(JSON_LENGTH(COALESCE(t.attempts, '[]')) >= 100, JSON_REMOVE(t.attempts, '$[0]'),
                    COALESCE(t.attempts, '[]')), '$',
                 JSON_OBJECT('attempt', j.attempt, 'epoch', j.epoch, 'worker', t.worker_id,
                   'started_at', DATE_FORMAT(t.attempted_at, '%Y-%m-%d %H:%i:%s.%f'),
                   'finished_at', DATE_FORMAT(UTC_TIMESTAMP(6), '%Y-%m-%d %H:%i:%s.%f'),
                   'outcome', j.outcome,
                   'error', IF(CHAR_LENGTH(j.error) > 1024, CONCAT(LEFT(j.error, 1023), '…'), j.error)))),
               t.state = IF(j.state = 'snoozed', 'pending', j.state),
               t.run_at = IF(j.state IN ('pending', 'snoozed'),
                             UTC_TIMESTAMP(6) + INTERVAL j.delay_us MICROSECOND, t.run_at),
               t.finished_at = IF(j.state IN ('pending', 'snoozed'), NULL, UTC_TIMESTAMP(6)),
               t.attempt = IF(j.state = 'snoozed' AND t.attempt > 0, t.attempt - 1,
                              LEAST(t.attempt, j.attempt)),
               t.snoozes = IF(j.state = 'snoozed', t.snoozes + 1, t.snoozes),
               t.last_error = IF(j.error IS NULL, t.last_error, j.error),
               t.output = IF(j.output IS NULL, t.output, j.output),
               t.cancel_requested_at = IF(j.state IN ('succeeded', 'dead'), NULL, t.cancel_requested_at),
               t.lease_until = NULL,
               t.updated_at = UTC_TIMESTAMP(6)
           WHERE t.state = 'running'"#,
        json
    )
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected())
}
