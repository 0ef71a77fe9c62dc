//! Unique identities (`taskq_unique`): reserved at enqueue (and by a retry), locked and freed
//! when a task starts or ends, pruned once their window is over.

use sqlx::MySqlConnection;
use taskq_driver::driver::Identities;

use crate::MySqlDriver;
use taskq_driver::state::TaskId;

/// Takes the identity `key` for `task_id` (0: the id follows), or returns the task holding it.
///
/// One `INSERT … ON DUPLICATE KEY UPDATE`: on a taken identity InnoDB locks the existing row
/// *exclusively* (a plain `INSERT` would take a shared lock), and the update reports the holder
/// through `LAST_INSERT_ID(expr)` in the statement's OK packet. Shared locks are what made
/// concurrent enqueuers of one identity deadlock: when a worker freed the identity (deleting
/// its row), every producer waiting with a shared lock on it tried to upgrade to insert, and
/// InnoDB rolled back all but one caller's transaction. With exclusive locks the waiters queue
/// one behind the other: the first inserts, the next ones see it as the holder. A duplicate
/// keeps the row locked until the caller's transaction ends, so the holder cannot let go of
/// the identity in between (the worker's statements that free it skip locked rows).
///
/// A reservation left with `task_id = 0` (an enqueue whose undo could not run, committed
/// anyway) names no task: it is taken over.
pub(crate) async fn identity_reserve(
    conn: &mut MySqlConnection,
    key: &[u8],
    task_id: u64,
    expires_us: Option<i64>,
) -> sqlx::Result<Option<TaskId>> {
    let done = sqlx::query!(
        r#"INSERT INTO taskq_unique (unique_key, task_id, expires_at)
           VALUES (?, ?, TIMESTAMPADD(MICROSECOND, ?, '1970-01-01 00:00:00'))
           ON DUPLICATE KEY UPDATE task_id = LAST_INSERT_ID(IF(task_id = 0, ?, task_id))"#,
        key,
        task_id,
        expires_us,
        task_id,
    )
    .execute(&mut *conn)
    .await?;
    // 0: a new row (the table has no AUTO_INCREMENT column); otherwise the row's task after
    // the update, which is `task_id` itself when an orphaned reservation was taken over.
    Ok(match done.last_insert_id() {
        0 => None,
        id if id == task_id => None,
        holder => Some(TaskId(holder)),
    })
}

/// What [`identities_take`] found.
#[derive(Default)]
pub(crate) struct Taken {
    /// `(identity, task)` pairs the task holds, now locked by this transaction.
    pub(crate) ours: Vec<(Vec<u8>, u64)>,
    /// Tasks that hold their identity while another transaction has its row locked.
    pub(crate) held_elsewhere: Vec<u64>,
}

/// For `(identity, task)` pairs about to be freed, locks the `taskq_unique` rows that no
/// other transaction holds (`FOR UPDATE SKIP LOCKED`: it never waits, so the order does not
/// matter for deadlocks) and sorts the pairs out: held by that task and now locked here, held
/// by that task but locked elsewhere (a plain read tells, only for rows the lock skipped), or
/// not held by that task at all (nothing to free).
pub(crate) async fn identities_take(
    conn: &mut MySqlConnection,
    wanted: &[(&[u8], u64)],
) -> sqlx::Result<Taken> {
    let mut hex_keys: Vec<String> = wanted
        .iter()
        .map(|(k, _)| taskq_driver::rows::hex(k))
        .collect();
    hex_keys.sort_unstable();
    hex_keys.dedup();
    let json = serde_json::to_string(&hex_keys).expect("keys serialize");
    let locked = sqlx::query!(
        r#"SELECT u.unique_key AS "unique_key: Vec<u8>", u.task_id AS "task_id: u64"
           FROM JSON_TABLE(?, '$[*]' COLUMNS (k VARCHAR(64) PATH '$')) AS j
             STRAIGHT_JOIN taskq_unique u FORCE INDEX (PRIMARY) ON u.unique_key = UNHEX(j.k)
           FOR UPDATE SKIP LOCKED"#,
        json
    )
    .fetch_all(&mut *conn)
    .await?;
    let mut taken = Taken {
        ours: Vec::new(),
        held_elsewhere: Vec::new(),
    };
    let mut skipped: Vec<String> = Vec::new();
    for (k, id) in wanted {
        match locked.iter().find(|l| l.unique_key == *k) {
            Some(l) if l.task_id == *id => taken.ours.push((k.to_vec(), *id)),
            Some(_) => {}
            None => skipped.push(taskq_driver::rows::hex(k)),
        }
    }
    if !skipped.is_empty() {
        let json = serde_json::to_string(&skipped).expect("keys serialize");
        let rows = sqlx::query!(
            r#"SELECT u.unique_key AS "unique_key: Vec<u8>", u.task_id AS "task_id: u64"
               FROM JSON_TABLE(?, '$[*]' COLUMNS (k VARCHAR(64) PATH '$')) AS j
                 STRAIGHT_JOIN taskq_unique u FORCE INDEX (PRIMARY) ON u.unique_key = UNHEX(j.k)"#,
            json
        )
        .fetch_all(&mut *conn)
        .await?;
        for (k, id) in wanted {
            if rows.iter().any(|r| r.unique_key == *k && r.task_id == *id)
                && !locked.iter().any(|l| l.unique_key == *k)
            {
                taken.held_elsewhere.push(*id);
            }
        }
    }
    Ok(taken)
}

/// Deletes the `taskq_unique` rows of `(identity, task, epoch, state)` whose task row has that
/// epoch and state: the rows written by the write-back (or reap) just before in the same
/// transaction, not those it was fenced from.
pub(crate) async fn identities_free_written(
    conn: &mut MySqlConnection,
    rows: &[(String, u64, u64, &str)],
) -> sqlx::Result<()> {
    if rows.is_empty() {
        return Ok(());
    }
    let json = serde_json::to_string(rows).expect("rows serialize");
    sqlx::query!(
        r#"DELETE u FROM JSON_TABLE(?, '$[*]' COLUMNS (k VARCHAR(64) PATH '$[0]',
                                                      id BIGINT UNSIGNED PATH '$[1]',
                                                      epoch BIGINT UNSIGNED PATH '$[2]',
                                                      state VARCHAR(16) PATH '$[3]')) AS j
             STRAIGHT_JOIN taskq_tasks t FORCE INDEX (PRIMARY)
               ON t.id = j.id AND t.lease_epoch = j.epoch AND t.state = j.state
             STRAIGHT_JOIN taskq_unique u FORCE INDEX (PRIMARY)
               ON u.unique_key = UNHEX(j.k) AND u.task_id = j.id"#,
        json
    )
    .execute(&mut *conn)
    .await?;
    Ok(())
}

impl Identities for MySqlDriver {
    /// Deletes up to `limit` identities of windows that have ended (`expires_at` passed):
    /// whatever task held one, its window is over. Returns the count.
    async fn unique_prune_expired(
        &self,
        conn: &mut MySqlConnection,
        limit: u32,
    ) -> sqlx::Result<u64> {
        let done = sqlx::query!(
            r#"DELETE FROM taskq_unique
               WHERE expires_at < UTC_TIMESTAMP(6)
               ORDER BY expires_at
               LIMIT ?"#,
            limit
        )
        .execute(&mut *conn)
        .await?;
        Ok(done.rows_affected())
    }
}
