//! The claim transaction ([`MySqlDriver::claim_raw`]): a limited queue's row lock, the candidate
//! read of `ix_taskq_claim`, the locking read by primary key, and the `UPDATE`s that start the
//! tasks (or end at the claim those past their deadline or canceled).

use chrono::NaiveDateTime;
use sqlx::{Connection, MySqlConnection};
use taskq_driver::rules::{Allowance, claim_allowance, frees_identity};
use taskq_driver::state::TaskState;

use crate::MySqlDriver;
use crate::claim::{ClaimFrom, ClaimKey, MySqlClaim, RawBatch};
use crate::identities::identities_take;
use taskq_driver::rows::{CanceledTask, Claimed, ExpiredTask, LimitHit};

/// The limits of a queue as the claim reads them, its row locked.
struct QueueLimits {
    /// The queue's claim counter (`taskq_queues.claims`), which every claim that starts
    /// tasks of the limited queue bumps.
    claims: u64,
    concurrency_limit: Option<u32>,
    rate_limit: Option<u32>,
    rate_period_us: Option<i64>,
    /// Claims already counted in the current rate window.
    rate_used: i64,
    /// Microseconds until the current rate window ends.
    rate_resets_in_us: Option<i64>,
}

/// A candidate row of a claim (non-locking read of `ix_taskq_claim`, which covers it).
struct Candidate {
    id: u64,
    priority: i16,
    run_at: NaiveDateTime,
    /// The queue has a row in `taskq_queues` with a pause or a limit (read with each
    /// candidate: the same for all).
    controlled: bool,
}

/// A row locked by the claim (values before the claim).
struct ClaimRow {
    id: u64,
    name: String,
    payload: Vec<u8>,
    priority: i16,
    run_at: NaiveDateTime,
    attempt: u32,
    max_attempts: u32,
    lease_epoch: u64,
    wait_us: i64,
    trace_context: Option<String>,
    snoozes: u32,
    /// Time until the deadline on the database clock (µs; zero or less: passed), if any.
    deadline_in_us: Option<i64>,
    unique_key: Option<Vec<u8>>,
    unique_while: Option<String>,
    order_key: Option<Vec<u8>>,
    order_dead_skips: bool,
    workflow_id: Option<u64>,
    batch_id: Option<u64>,
    /// A cancel request is on the row: an earlier attempt's (see [`ClaimRow::ends_at_claim`]).
    canceled: bool,
    /// `last_error` of a task whose attempts were exhausted before this claim (see
    /// `Claimed::parked_error`).
    parked_error: Option<String>,
}

impl ClaimRow {
    /// Whether the deadline has passed (on the database clock, at the claim).
    fn is_expired(&self) -> bool {
        self.deadline_in_us.is_some_and(|us| us <= 0)
    }

    /// Whether the claim ends the task instead of starting it: past its deadline (`expired`),
    /// or carrying a cancel request made while an earlier attempt ran that this attempt's
    /// outcome (a retry or snooze written before the worker saw the request) or a release
    /// left on the row (`canceled`).
    fn ends_at_claim(&self) -> bool {
        self.canceled || self.is_expired()
    }

    /// The identity this claim frees if the task holds it: a task unique while pending (it
    /// starts now), or any unique task the claim ends (`expired` or `canceled`, like a
    /// cancel).
    fn frees_at_claim(&self) -> Option<&[u8]> {
        let to = if self.canceled {
            TaskState::Canceled
        } else if self.is_expired() {
            TaskState::Expired
        } else {
            TaskState::Running
        };
        let frees = self
            .unique_while
            .as_deref()
            .is_some_and(|w| frees_identity(w, to));
        self.unique_key.as_deref().filter(|_| frees)
    }
}

impl MySqlDriver {
    /// Claims up to `limit` due tasks of `queue` whose name is in `names_json`, in one short
    /// transaction of three statements:
    ///
    /// 1. a plain (non-locking) read of up to `candidates` ids (a few times `limit`) from
    ///    `ix_taskq_claim`, in claim order; for an unlimited queue, before the transaction
    ///    begins, so that a claim that finds nothing (an idle queue's poll) is this one
    ///    statement;
    /// 2. `SELECT … FOR UPDATE SKIP LOCKED` of those ids by primary key, re-checking that each
    ///    is still pending and due, stopping at `limit` rows: rows another claimer holds are
    ///    skipped, rows it already took no longer match;
    /// 3. one `UPDATE` that marks the locked rows running with a lease of `lease_us` and
    ///    increments attempt and epoch.
    ///
    /// The locking read also reads each row's `deadline` against the database clock: a row
    /// past it is not started but moved to `expired` by one more `UPDATE` in the same
    /// transaction, issued only when the batch has such rows (tasks without a deadline cost
    /// nothing more). Expired rows count towards `limit`.
    ///
    /// A claim of a limited queue first locks the queue's row and reads its limits, its
    /// running count (with a concurrency limit) and its claim counter `claims`; step 3 is then
    /// one `UPDATE` of the tasks and the queue's row together, which bumps the counter on
    /// condition that it is unchanged (on a Galera cluster, what makes claims of one limited
    /// queue on different nodes conflict: see the comment at that statement).
    ///
    /// Concurrent claimers read the same candidates; when this one locks fewer than `limit`
    /// although the candidate read was full, the batch says so (`contended_after`) and the
    /// next claim reads candidates past the last one, so claimers leapfrog each other instead
    /// of all re-reading rows that one of them holds. When others held every candidate, the
    /// claim goes on in its transaction with one locking scan (as [`ClaimFrom::LockingScan`]),
    /// which walks past held rows however many there are.
    ///
    /// Locking by primary key instead of scanning `ix_taskq_claim` with a locking read is what
    /// makes the claim cheap: a locking read of a secondary index checks every entry it passes
    /// for implicit locks, including the delete-marked entries that claimed rows leave behind
    /// until InnoDB purges them. Measured on one connection draining 20,000 tasks 16 at a time:
    /// 2.3 ms per locking scan (p99 5.9 ms) against 1.1 ms (p99 1.7 ms) for the two reads.
    ///
    /// With [`ClaimFrom::After`], the candidate read starts just past that position instead of at the head
    /// of the queue, so it does not step over those delete-marked entries either. The claim
    /// loop seeks while it drains a backlog and rescans from the head regularly, so rows that
    /// sort earlier are not passed over for long.
    ///
    /// Run it on a READ COMMITTED connection: under REPEATABLE READ the reads would see an old
    /// snapshot and take gap locks.
    pub(crate) async fn claim_raw(
        &self,
        conn: &mut MySqlConnection,
        req: &MySqlClaim<'_>,
    ) -> sqlx::Result<RawBatch> {
        let &MySqlClaim {
            queue,
            names_json,
            limit,
            candidates,
            from,
            lease_us,
            worker_id,
            limited,
        } = req;
        // An unlimited claim reads its candidates before it begins its transaction: the read
        // is a plain one (READ COMMITTED, its own snapshot either way), and when it finds
        // nothing, as every poll of an idle queue does, the claim is that one statement.
        let early = match from {
            ClaimFrom::Head | ClaimFrom::After(_) if !limited => {
                let after = match from {
                    ClaimFrom::After(k) => Some(k),
                    _ => None,
                };
                let found =
                    read_candidates(&mut *conn, queue, names_json, candidates.max(limit), after)
                        .await?;
                // A queue paused or limited since the worker last read its controls: nothing is
                // claimed, and the worker reads them (`ClaimBatch::queue_controlled`).
                let controlled = found.first().is_some_and(|c| c.controlled);
                if found.is_empty() || controlled {
                    return Ok(RawBatch {
                        tasks: Vec::new(),
                        expired: Vec::new(),
                        canceled: Vec::new(),
                        last: None,
                        contended_after: None,
                        limited: None,
                        controlled,
                        scanned: false,
                    });
                }
                Some(found)
            }
            _ => None,
        };
        let mut tx = conn.begin().await?;
        let mut hit = None;
        let mut rate_limited = false;
        // The queue's claim counter as read under the row lock, when a limit bounds the claim.
        let mut claims_seen = None;
        let mut limit = limit;
        if limited && let Some(l) = queue_limits_lock(&mut tx, queue).await? {
            let mut concurrency = None;
            if let Some(max) = l.concurrency_limit {
                claims_seen = Some(l.claims);
                let running = sqlx::query_scalar!(
                    r#"SELECT COUNT(*) AS "n!: i64" FROM taskq_tasks
                       WHERE state = 'running' AND queue = ?"#,
                    queue
                )
                .fetch_one(&mut *tx)
                .await?;
                concurrency = Some((max, running));
            }
            let rate = l
                .rate_limit
                .filter(|_| l.rate_period_us.is_some_and(|p| p > 0))
                .map(|max| (max, l.rate_used));
            if rate.is_some() {
                rate_limited = true;
                claims_seen = Some(l.claims);
            }
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
                return Ok(RawBatch {
                    tasks: Vec::new(),
                    expired: Vec::new(),
                    canceled: Vec::new(),
                    last: None,
                    contended_after: None,
                    limited: hit,
                    controlled: false,
                    scanned: false,
                });
            }
        }
        let (mut rows, freed, contended_after, scanned) = match from {
            ClaimFrom::LockingScan => {
                let (rows, freed) = lock_scan(&mut tx, queue, names_json, limit).await?;
                (rows, freed, None, false)
            }
            ClaimFrom::Head => {
                claim_by_candidates(&mut tx, queue, names_json, limit, candidates, None, early)
                    .await?
            }
            ClaimFrom::After(k) => {
                claim_by_candidates(
                    &mut tx,
                    queue,
                    names_json,
                    limit,
                    candidates,
                    Some(k),
                    early,
                )
                .await?
            }
        };
        if rows.is_empty() {
            tx.commit().await?;
            return Ok(RawBatch {
                tasks: Vec::new(),
                expired: Vec::new(),
                canceled: Vec::new(),
                last: None,
                contended_after,
                limited: hit,
                controlled: false,
                scanned,
            });
        }
        rows.sort_by_key(|r| (r.priority, r.run_at, r.id));
        let last = rows.last().map(|r| ClaimKey {
            priority: r.priority,
            run_at: r.run_at,
            id: r.id,
        });
        // Rows past their deadline, or with a cancel request left by an earlier attempt, are
        // never started: they end `expired` (`canceled`) in this transaction (after the claim's
        // own `UPDATE` below), with one more statement only when there are some.
        let (ended, rows): (Vec<ClaimRow>, Vec<ClaimRow>) =
            rows.into_iter().partition(ClaimRow::ends_at_claim);
        if let Some(seen) = claims_seen.filter(|_| !rows.is_empty()) {
            // A claim bounded by a limit starts its tasks and bumps the queue's claim counter in
            // one statement, on condition that the counter is still the one read under the row
            // lock. On a Galera cluster the row lock holds on this node only: a claim committed
            // on another node meanwhile either conflicts with this write at certification (one
            // of the two is rolled back with 1213, which the claim loop retries), or, applied
            // here, aborts this transaction (brute-force abort). MariaDB 10.11 was seen to
            // report such an abort to no statement at all: the rest of the claim then ran
            // outside any transaction and started tasks on a stale count. The condition on the
            // counter, and on each task's state and epoch, makes this statement claim nothing
            // then, since the claim that aborted it bumped the counter.
            let pairs: Vec<(u64, u64)> = rows.iter().map(|r| (r.id, r.lease_epoch)).collect();
            let pairs = serde_json::to_string(&pairs).expect("pairs serialize");
            let changed = sqlx::query!(
                r#"UPDATE taskq_queues q
                     STRAIGHT_JOIN JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$[0]',
                                                                epoch BIGINT UNSIGNED PATH '$[1]')) AS j
                     STRAIGHT_JOIN taskq_tasks t FORCE INDEX (PRIMARY) ON t.id = j.id
                   SET t.state = 'running', t.attempt = t.attempt + 1, t.lease_epoch = t.lease_epoch + 1,
                       t.lease_until = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, t.worker_id = ?,
                       t.attempted_at = UTC_TIMESTAMP(6), t.updated_at = UTC_TIMESTAMP(6),
                       q.claims = q.claims + 1
                   WHERE q.queue = ? AND q.claims = ?
                     AND t.state = 'pending' AND t.lease_epoch = j.epoch"#,
                pairs,
                lease_us,
                worker_id,
                queue,
                seen
            )
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if changed != rows.len() as u64 + 1 {
                // Only possible when the transaction is gone: nothing is claimed (`0`), or a
                // claim that ran outside it took some rows (they stay `running` under this
                // worker, which does not run them, until the reaper returns them).
                tracing::debug!(
                    queue,
                    changed,
                    wanted = rows.len(),
                    "taskq: claim of a limited queue lost its transaction (a brute-force abort on a Galera cluster that no statement reported); claiming again"
                );
                let _ = tx.rollback().await;
                return Ok(RawBatch {
                    tasks: Vec::new(),
                    expired: Vec::new(),
                    canceled: Vec::new(),
                    last: None,
                    contended_after: last,
                    limited: hit,
                    controlled: false,
                    scanned: false,
                });
            }
        } else if !rows.is_empty() {
            let ids = serde_json::to_string(&rows.iter().map(|r| r.id).collect::<Vec<_>>())
                .expect("ids serialize");
            sqlx::query!(
                r#"UPDATE JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$')) AS j
                     STRAIGHT_JOIN taskq_tasks t FORCE INDEX (PRIMARY) ON t.id = j.id
                   SET t.state = 'running', t.attempt = t.attempt + 1, t.lease_epoch = t.lease_epoch + 1,
                       t.lease_until = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, t.worker_id = ?,
                       t.attempted_at = UTC_TIMESTAMP(6), t.updated_at = UTC_TIMESTAMP(6)"#,
                ids,
                lease_us,
                worker_id
            )
            .execute(&mut *tx)
            .await?;
        }
        let mut skipped = Vec::new();
        if !ended.is_empty() {
            let ids = serde_json::to_string(&ended.iter().map(|r| r.id).collect::<Vec<_>>())
                .expect("ids serialize");
            sqlx::query!(
                r#"UPDATE JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$')) AS j
                     STRAIGHT_JOIN taskq_tasks t FORCE INDEX (PRIMARY) ON t.id = j.id
                   SET t.state = IF(t.cancel_requested_at IS NOT NULL, 'canceled', 'expired'),
                       t.finished_at = UTC_TIMESTAMP(6), t.updated_at = UTC_TIMESTAMP(6)
                   WHERE t.state = 'pending'"#,
                ids
            )
            .execute(&mut *tx)
            .await?;
            // Ordered heads ended here (expired, or canceled) promote their keys' next tasks.
            let heads: Vec<u64> = ended
                .iter()
                .filter(|r| r.order_key.is_some())
                .map(|r| r.id)
                .collect();
            skipped = crate::order::order_advance_ids_or_skip(&mut tx, &heads).await?;
        }
        if rate_limited && !rows.is_empty() {
            // Counted in the window of this statement's clock, not the lock's: a claim that
            // straddles a window boundary counts in the window its tasks' claim time (the
            // `UPDATE` above) falls in, so no window holds more claims than the limit.
            sqlx::query!(
                r#"UPDATE taskq_queues
                   SET rate_window_count = IF(rate_window_start = CAST('1970-01-01' AS DATETIME(6))
                         + INTERVAL (TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6))
                                     DIV rate_period_us * rate_period_us) MICROSECOND,
                         rate_window_count + ?, ?),
                       rate_window_start = CAST('1970-01-01' AS DATETIME(6))
                         + INTERVAL (TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6))
                                     DIV rate_period_us * rate_period_us) MICROSECOND
                   WHERE queue = ? AND rate_period_us > 0"#,
                rows.len() as u32,
                rows.len() as u32,
                queue
            )
            .execute(&mut *tx)
            .await?;
        }
        if !freed.is_empty() {
            // The identities this claim frees (tasks unique while pending, and unique tasks
            // that expired): ours, locked above.
            let pairs: Vec<(String, u64)> = freed
                .iter()
                .map(|(k, id)| (taskq_driver::rows::hex(k), *id))
                .collect();
            let json = serde_json::to_string(&pairs).expect("pairs serialize");
            sqlx::query!(
                r#"DELETE u FROM JSON_TABLE(?, '$[*]' COLUMNS (k VARCHAR(64) PATH '$[0]',
                                                              id BIGINT UNSIGNED PATH '$[1]')) AS j
                     STRAIGHT_JOIN taskq_unique u FORCE INDEX (PRIMARY)
                       ON u.unique_key = UNHEX(j.k) AND u.task_id = j.id"#,
                json
            )
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        crate::order::order_advance_later(&self.pool, skipped);
        let tasks = rows
            .into_iter()
            .map(|r| Claimed {
                id: r.id,
                name: r.name,
                payload: r.payload,
                attempt: r.attempt + 1,
                max_attempts: r.max_attempts,
                snoozes: r.snoozes,
                lease_epoch: r.lease_epoch + 1,
                wait_us: r.wait_us,
                trace_context: r.trace_context,
                unique_key: r.unique_key,
                unique_while: r.unique_while,
                order_key: r.order_key,
                order_dead_skips: r.order_dead_skips,
                workflow_id: r.workflow_id,
                batch_id: r.batch_id,
                parked_error: r.parked_error,
            })
            .collect();
        let (canceled, expired): (Vec<ClaimRow>, Vec<ClaimRow>) =
            ended.into_iter().partition(|r| r.canceled);
        let expired = expired
            .into_iter()
            .map(|r| ExpiredTask {
                id: r.id,
                name: r.name,
                late_us: -r.deadline_in_us.unwrap_or(0),
            })
            .collect();
        let canceled = canceled
            .into_iter()
            .map(|r| CanceledTask {
                id: r.id,
                name: r.name,
            })
            .collect();
        Ok(RawBatch {
            tasks,
            expired,
            canceled,
            last,
            contended_after,
            limited: hit,
            controlled: false,
            scanned,
        })
    }
}

/// First step of a claim of a limited queue: locks the queue's row in `taskq_queues` (claims
/// of this queue serialize here until the claim commits; on a Galera cluster only those of one
/// node, which is why a claim that starts tasks also writes the row, see [`MySqlDriver::claim_raw`])
/// and reads its limits and claim counter, with the
/// claims already counted in the current rate window (windows are multiples of the period
/// since 1970 on the database clock). `None` when the queue has no row.
async fn queue_limits_lock(
    tx: &mut sqlx::Transaction<'_, sqlx::MySql>,
    queue: &str,
) -> sqlx::Result<Option<QueueLimits>> {
    sqlx::query_as!(
        QueueLimits,
        r#"SELECT claims AS "claims: u64", concurrency_limit AS "concurrency_limit: u32",
             rate_limit AS "rate_limit: u32", rate_period_us,
             CAST(IF(rate_window_start = CAST('1970-01-01' AS DATETIME(6))
                       + INTERVAL (TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6))
                                   DIV rate_period_us * rate_period_us) MICROSECOND,
                     rate_window_count, 0) AS SIGNED) AS "rate_used!: i64",
             TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), CAST('1970-01-01' AS DATETIME(6))
                  + INTERVAL ((TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6))
                               DIV rate_period_us + 1) * rate_period_us) MICROSECOND)
               AS "rate_resets_in_us: i64"
           FROM taskq_queues WHERE queue = ?
           FOR UPDATE"#,
        queue
    )
    .fetch_optional(&mut **tx)
    .await
}

/// The locking scan of [`ClaimFrom::LockingScan`]: up to `limit` due rows of the queue in claim
/// order, by one `SELECT … FOR UPDATE SKIP LOCKED` of `ix_taskq_claim` from the head, which
/// walks past rows others hold however many there are. Rows whose unique identity a
/// producer's open transaction holds are given up (see `drop_identities_held_elsewhere`).
async fn lock_scan(
    tx: &mut sqlx::Transaction<'_, sqlx::MySql>,
    queue: &str,
    names_json: &str,
    limit: u32,
) -> sqlx::Result<(Vec<ClaimRow>, Vec<(Vec<u8>, u64)>)> {
    let mut rows = sqlx::query_as!(
        ClaimRow,
        r#"SELECT id AS "id: u64", name, payload, priority, run_at,
             attempt AS "attempt: u32", max_attempts AS "max_attempts: u32",
             lease_epoch AS "lease_epoch: u64",
             TIMESTAMPDIFF(MICROSECOND, run_at, UTC_TIMESTAMP(6)) AS "wait_us!: i64",
             trace_context, snoozes AS "snoozes: u32",
             TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), deadline) AS "deadline_in_us: i64",
             unique_key AS "unique_key: Vec<u8>", unique_while,
             order_key AS "order_key: Vec<u8>", order_dead_skips AS "order_dead_skips: bool",
             workflow_id AS "workflow_id: u64", batch_id AS "batch_id: u64",
             (cancel_requested_at IS NOT NULL) AS "canceled!: bool",
             IF(attempt >= max_attempts, last_error, NULL) AS "parked_error: String"
           FROM taskq_tasks
           WHERE state = 'pending' AND queue = ? AND run_at <= UTC_TIMESTAMP(6)
             AND JSON_CONTAINS(?, JSON_QUOTE(name))
           ORDER BY priority, run_at, id
           LIMIT ?
           FOR UPDATE SKIP LOCKED"#,
        queue,
        names_json,
        limit
    )
    .fetch_all(&mut **tx)
    .await?;
    let mut freed = Vec::new();
    drop_identities_held_elsewhere(tx, &mut rows, 0, &mut freed).await?;
    Ok((rows, freed))
}

/// Step 1 of a claim by candidates: up to `wanted` ids of due rows of the queue in claim
/// order (from the head, or past `after`), by a plain read of `ix_taskq_claim`, which covers it.
async fn read_candidates(
    conn: &mut MySqlConnection,
    queue: &str,
    names_json: &str,
    wanted: u32,
    after: Option<ClaimKey>,
) -> sqlx::Result<Vec<Candidate>> {
    match after {
        None => {
            sqlx::query_as!(
                Candidate,
                r#"SELECT id AS "id: u64", priority, run_at,
                     EXISTS (SELECT 1 FROM taskq_queues q WHERE q.queue = ?
                               AND (q.paused_at IS NOT NULL OR q.concurrency_limit IS NOT NULL
                                    OR q.rate_limit IS NOT NULL)) AS "controlled!: bool"
                   FROM taskq_tasks
                   WHERE state = 'pending' AND queue = ? AND run_at <= UTC_TIMESTAMP(6)
                     AND JSON_CONTAINS(?, JSON_QUOTE(name))
                   ORDER BY priority, run_at, id
                   LIMIT ?"#,
                queue,
                queue,
                names_json,
                wanted
            )
            .fetch_all(conn)
            .await
        }
        Some(k) => {
            // The row-order predicate is spelled out (no row constructor) so that both MySQL
            // and MariaDB turn it into ranges of the index.
            sqlx::query_as!(
                Candidate,
                r#"SELECT id AS "id: u64", priority, run_at,
                     EXISTS (SELECT 1 FROM taskq_queues q WHERE q.queue = ?
                               AND (q.paused_at IS NOT NULL OR q.concurrency_limit IS NOT NULL
                                    OR q.rate_limit IS NOT NULL)) AS "controlled!: bool"
                   FROM taskq_tasks
                   WHERE state = 'pending' AND queue = ? AND run_at <= UTC_TIMESTAMP(6)
                     AND (priority > ?
                          OR (priority = ? AND run_at > ?)
                          OR (priority = ? AND run_at = ? AND id > ?))
                     AND JSON_CONTAINS(?, JSON_QUOTE(name))
                   ORDER BY priority, run_at, id
                   LIMIT ?"#,
                queue,
                queue,
                k.priority,
                k.priority,
                k.run_at,
                k.priority,
                k.run_at,
                k.id,
                names_json,
                wanted
            )
            .fetch_all(conn)
            .await
        }
    }
}

/// Steps 1 and 2 of [`MySqlDriver::task_claim`]: candidates (from the head, or past `after`;
/// `early` when read before the transaction began), then the locking read of them by primary
/// key. Returns the locked rows and, when fewer than `limit` were locked although the
/// candidate read was full, the last candidate's position.
///
/// When others held every candidate (a full read, nothing locked), the claim goes on in the
/// same transaction with one locking scan ([`lock_scan`]) instead of ending empty and leaving
/// the scan to the next claim: under contention (many single-slot workers on one queue) that
/// saves a transaction (`BEGIN`, `COMMIT`) and the next claim's candidate read per such claim.
async fn claim_by_candidates(
    tx: &mut sqlx::Transaction<'_, sqlx::MySql>,
    queue: &str,
    names_json: &str,
    limit: u32,
    wanted_candidates: u32,
    after: Option<ClaimKey>,
    early: Option<Vec<Candidate>>,
) -> sqlx::Result<(Vec<ClaimRow>, Vec<(Vec<u8>, u64)>, Option<ClaimKey>, bool)> {
    let wanted_candidates = wanted_candidates.max(limit);
    let candidates = match early {
        Some(c) => c,
        None => read_candidates(tx, queue, names_json, wanted_candidates, after).await?,
    };
    if candidates.is_empty() {
        return Ok((Vec::new(), Vec::new(), None, false));
    }
    let last_candidate = candidates
        .last()
        .filter(|_| candidates.len() as u32 == wanted_candidates)
        .map(|c| ClaimKey {
            priority: c.priority,
            run_at: c.run_at,
            id: c.id,
        });
    let candidate_ids: Vec<u64> = candidates.iter().map(|c| c.id).collect();
    let mut rows = lock_candidates(tx, &candidate_ids, limit).await?;
    if rows.is_empty() && last_candidate.is_some() {
        let (rows, freed) = lock_scan(tx, queue, names_json, limit).await?;
        return Ok((rows, freed, None, true));
    }
    let contended_after = last_candidate.filter(|_| (rows.len() as u32) < limit);
    // Rows whose unique identity a producer's open transaction holds are given up (see
    // `drop_identities_held_elsewhere`); the candidates after the last row locked replace them.
    let mut freed = Vec::new();
    let mut searched = 0;
    let mut checked = 0;
    while rows[checked..].iter().any(|r| r.frees_at_claim().is_some()) {
        searched = rows
            .iter()
            .filter_map(|r| candidate_ids.iter().position(|&c| c == r.id))
            .max()
            .map_or(searched, |p| p + 1)
            .max(searched);
        let dropped = drop_identities_held_elsewhere(tx, &mut rows, checked, &mut freed).await?;
        checked = rows.len();
        let wanted = limit.saturating_sub(rows.len() as u32);
        if dropped == 0 || wanted == 0 || searched >= candidate_ids.len() {
            break;
        }
        let more = lock_candidates(tx, &candidate_ids[searched..], wanted).await?;
        if more.is_empty() {
            break;
        }
        rows.extend(more);
    }
    Ok((rows, freed, contended_after, false))
}

/// Step 2 of the claim: locks up to `limit` of `ids` (candidates, in claim order) that are
/// still pending and due, by primary key, skipping rows others hold.
async fn lock_candidates(
    tx: &mut sqlx::Transaction<'_, sqlx::MySql>,
    ids: &[u64],
    limit: u32,
) -> sqlx::Result<Vec<ClaimRow>> {
    let ids_json = serde_json::to_string(ids).expect("ids serialize");
    // Driven from the JSON side, so rows are visited (and locked) in claim order and the scan
    // stops at `limit` locked rows.
    sqlx::query_as!(
        ClaimRow,
        r#"SELECT t.id AS "id: u64", t.name, t.payload, t.priority, t.run_at,
             t.attempt AS "attempt: u32", t.max_attempts AS "max_attempts: u32",
             t.lease_epoch AS "lease_epoch: u64",
             TIMESTAMPDIFF(MICROSECOND, t.run_at, UTC_TIMESTAMP(6)) AS "wait_us!: i64",
             t.trace_context, t.snoozes AS "snoozes: u32",
             TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), t.deadline) AS "deadline_in_us: i64",
             t.unique_key AS "unique_key: Vec<u8>", t.unique_while,
             t.order_key AS "order_key: Vec<u8>", t.order_dead_skips AS "order_dead_skips: bool",
             t.workflow_id AS "workflow_id: u64", t.batch_id AS "batch_id: u64",
             (t.cancel_requested_at IS NOT NULL) AS "canceled!: bool",
             IF(t.attempt >= t.max_attempts, t.last_error, NULL) AS "parked_error: String"
           FROM JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$')) AS j
             STRAIGHT_JOIN taskq_tasks t FORCE INDEX (PRIMARY) ON t.id = j.id
           WHERE t.state = 'pending' AND t.run_at <= UTC_TIMESTAMP(6)
           LIMIT ?
           FOR UPDATE SKIP LOCKED"#,
        ids_json,
        limit
    )
    .fetch_all(&mut **tx)
    .await
}

/// Of the rows a claim locked (from index `from` on), those unique while pending free their
/// identity: the ones holding it are added to `freed` (their `taskq_unique` rows, now locked,
/// are deleted with the claim), except those whose identity another transaction holds: a
/// producer whose enqueue was a duplicate of the task and has not committed yet. Deleting
/// that row would wait for that transaction; instead the task is dropped from the claim and
/// stays pending until the transaction ends, so it starts after the producer's writes are
/// visible. Returns how many rows were dropped. No statement when no row frees an identity.
async fn drop_identities_held_elsewhere(
    tx: &mut sqlx::Transaction<'_, sqlx::MySql>,
    rows: &mut Vec<ClaimRow>,
    from: usize,
    freed: &mut Vec<(Vec<u8>, u64)>,
) -> sqlx::Result<usize> {
    let wanted: Vec<(&[u8], u64)> = rows[from..]
        .iter()
        .filter_map(|r| r.frees_at_claim().map(|k| (k, r.id)))
        .collect();
    if wanted.is_empty() {
        return Ok(0);
    }
    let taken = identities_take(tx, &wanted).await?;
    freed.extend(taken.ours.iter().cloned());
    let before = rows.len();
    let mut i = 0;
    rows.retain(|r| {
        i += 1;
        i <= from || !taken.held_elsewhere.contains(&r.id)
    });
    Ok(before - rows.len())
}
