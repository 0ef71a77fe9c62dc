//! The claim as the worker's claim loop sees it: [`MySqlDriver::task_claim`] and the [`ClaimCursor`]
//! it moves on between claims (where the next candidate read starts, how many candidates it
//! reads). The transaction itself is in `claim_raw`.

use std::time::{Duration, Instant};
use taskq_driver::driver::Claims;

use chrono::NaiveDateTime;
use sqlx::MySqlConnection;

use crate::MySqlDriver;
use taskq_driver::rows::{CanceledTask, ClaimBatch, ClaimRequest, Claimed, ExpiredTask, LimitHit};

/// A row's position in claim order, `(priority, run_at, id)`: the order of `ix_taskq_claim`
/// within a queue's pending rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimKey {
    pub priority: i16,
    pub run_at: NaiveDateTime,
    pub id: u64,
}

/// Where a claim looks for due rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimFrom {
    /// Candidates from the head of the queue, locked by primary key.
    Head,
    /// Candidates past this position, locked by primary key.
    After(ClaimKey),
    /// One locking scan of `ix_taskq_claim` from the head (`SELECT … ORDER BY … LIMIT ? FOR
    /// UPDATE SKIP LOCKED`): slower, but it walks past rows others hold however many there are.
    /// Used after a candidate claim locked nothing because others held every candidate.
    LockingScan,
}

/// One claim: up to `limit` due tasks of `queue` whose name is in `names_json`, looked for
/// `from` the head, a position or by locking scan, with `candidates` candidate ids read.
pub(crate) struct MySqlClaim<'a> {
    pub queue: &'a str,
    /// JSON array of the task names the worker handles.
    pub names_json: &'a str,
    pub limit: u32,
    pub candidates: u32,
    pub from: ClaimFrom,
    pub lease_us: i64,
    pub worker_id: &'a str,
    /// The worker saw the queue as limited (a concurrency or rate limit in `taskq_queues`):
    /// the claim locks the queue's row first and claims no more than the limits allow (see
    /// [`MySqlDriver::task_claim`]). Unlimited queues never touch that row.
    pub limited: bool,
}

/// A claim loop's position between claims: where the next claim's candidate read starts and
/// how many candidates it reads per wanted task.
///
/// While draining a backlog the loop seeks past its last full claim (the candidate read then
/// does not step over the delete-marked index entries that claimed rows leave at the head),
/// and rescans from the head at least every `RESCAN_EVERY`. After a claim that others
/// partly beat it to (they held some candidates), it goes on past the candidates, so claimers
/// leapfrog each other; after one where others held every candidate, the next claim is one
/// locking scan. The spread doubles after a contended claim and halves after a short one
/// that was not contended.
#[derive(Debug)]
pub struct ClaimCursor {
    seek: Option<ClaimKey>,
    last_head_scan: Instant,
    locking_scan: bool,
    /// When a claim of one task by candidates last found every candidate held and went on
    /// with a locking scan (`RawBatch::scanned`): while that is under `SCAN_FOR` ago, claims
    /// are locking scans alone.
    scanning_since: Option<Instant>,
    spread: u32,
}

impl Default for ClaimCursor {
    fn default() -> Self {
        Self {
            seek: None,
            last_head_scan: Instant::now(),
            locking_scan: false,
            scanning_since: None,
            spread: MIN_SPREAD,
        }
    }
}

/// Longest time a claim loop draining a backlog goes on seeking past its last claim before
/// it scans its queue from the head again: the most a task that sorts before the seek
/// position (a higher priority, an earlier `run_at`, a released or reaped task) waits for
/// the loop to look at it.
const RESCAN_EVERY: Duration = Duration::from_millis(100);

/// How long after a claim of one task found every candidate held the loop claims by locking
/// scan alone (one statement fewer per claim, and none wasted on candidates others hold, as
/// when many single-slot workers drain one queue), before a claim by candidates looks again:
/// also how long such a loop goes without reading its queue's controls (a pause or limit set
/// meanwhile is seen by the next claim by candidates). Only for claims of one task: for larger
/// claims the locking scan costs more than the candidate reads it saves (measured with 4
/// workers at concurrency 4: 1.31–1.34 statements per task instead of 1.47, but 1,634–1,690
/// tasks/s instead of 1,941–2,033).
const SCAN_FOR: Duration = Duration::from_millis(500);

/// Candidates a claim reads per task it wants, at least and at most.
const MIN_SPREAD: u32 = 2;
const MAX_SPREAD: u32 = 8;

impl Claims for MySqlDriver {
    /// Claims up to `req.limit` due tasks (see `MySqlDriver::claim_raw`), from where `cursor`
    /// (a [`ClaimCursor`]) says, and moves the cursor on.
    async fn task_claim(
        &self,
        conn: &mut MySqlConnection,
        req: &ClaimRequest<'_>,
        cursor: &mut taskq_driver::rows::ClaimCursor,
    ) -> sqlx::Result<ClaimBatch> {
        let cursor: &mut ClaimCursor = cursor.state();
        let started = Instant::now();
        // Contended lately (others held every candidate): the claim is the locking scan alone,
        // for up to `SCAN_FOR`, after which a claim by candidates (which also reads the queue's
        // controls) looks again.
        let scanning = cursor
            .scanning_since
            .is_some_and(|t| t.elapsed() < SCAN_FOR);
        let after = cursor
            .seek
            .take()
            .filter(|_| !scanning && cursor.last_head_scan.elapsed() < RESCAN_EVERY);
        let from = match after {
            Some(k) => ClaimFrom::After(k),
            None if scanning || cursor.locking_scan => ClaimFrom::LockingScan,
            None => ClaimFrom::Head,
        };
        cursor.locking_scan = false;
        if after.is_none() {
            cursor.last_head_scan = started;
        }
        let raw = self
            .claim_raw(
                conn,
                &MySqlClaim {
                    queue: req.queue,
                    names_json: req.names.json(),
                    limit: req.limit,
                    candidates: req.limit.saturating_mul(cursor.spread),
                    from,
                    lease_us: req.lease_us,
                    worker_id: req.worker_id,
                    limited: req.limited,
                },
            )
            .await?;
        let took = raw.tasks.len() + raw.expired.len() + raw.canceled.len();
        if raw.scanned && req.limit == 1 {
            cursor.scanning_since = Some(started);
        } else if from == ClaimFrom::LockingScan && took < req.limit as usize {
            // Short: the queue has no more due rows free, so no contention to go past.
            cursor.scanning_since = None;
        }
        let at_limit = raw.limited.is_some_and(|hit| took >= hit.allowed as usize);
        let mut contended = false;
        let mut partial = false;
        if at_limit {
            // Waiting for room: the next claim starts from the head.
        } else if took == req.limit as usize {
            if cursor.scanning_since.is_none() {
                cursor.seek = raw.last;
            }
        } else {
            cursor.spread = if raw.contended_after.is_some() {
                (cursor.spread * 2).min(MAX_SPREAD)
            } else {
                (cursor.spread / 2).max(MIN_SPREAD)
            };
            if let Some(past) = raw.contended_after {
                contended = true;
                if raw.tasks.is_empty() {
                    cursor.locking_scan = true;
                } else {
                    cursor.seek = Some(past);
                }
            } else if after.is_some() {
                // The seek ran short, but rows sorting before its start may be due.
                partial = true;
            }
        }
        Ok(ClaimBatch {
            tasks: raw.tasks,
            expired: raw.expired,
            canceled: raw.canceled,
            limited: raw.limited,
            contended,
            partial,
            queue_controlled: raw.controlled,
        })
    }
}

/// What one claim transaction took (before the cursor reads it).
pub(crate) struct RawBatch {
    /// The claimed tasks, in claim order.
    pub tasks: Vec<Claimed>,
    /// Tasks the claim locked but found past their deadline: moved to `expired`, not run.
    pub expired: Vec<ExpiredTask>,
    /// Tasks the claim locked but found with a cancel request: moved to `canceled`, not run.
    pub canceled: Vec<CanceledTask>,
    /// Position of the last claimed row (`None` when nothing was claimed).
    pub last: Option<ClaimKey>,
    /// Set when fewer tasks than asked for were claimed although the candidate read was full:
    /// other claimers held some candidates, so more may be due. It is the position of the last
    /// candidate; the next claim goes on from there rather than reading the same candidates.
    pub contended_after: Option<ClaimKey>,
    /// Set when the queue's limits allowed fewer tasks than asked for.
    pub limited: Option<LimitHit>,
    /// The claim by candidates found every candidate held and went on with a locking scan.
    pub scanned: bool,
    /// Nothing claimed: the candidate read of an unlimited claim found the queue paused or
    /// limited (see `ClaimBatch::queue_controlled`).
    pub controlled: bool,
}
