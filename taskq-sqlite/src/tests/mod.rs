//! The statements against a real database file, for what is SQLite's own: the write lock,
//! `BEGIN IMMEDIATE` and savepoints, the schema's constraints, `AUTOINCREMENT`, migrations run
//! by several processes, limited claimers on several pools, the clock's resolution. What both
//! drivers must do is the driver suite's (`taskq-drivertest`, run by `tests/driver.rs` on
//! both).

mod limits;
mod migrations;
mod reads;
mod statements;

use std::path::PathBuf;
use std::time::Duration;

use sqlx::{SqliteConnection, SqlitePool};
use taskq_driver::read::TaskInfo;
use taskq_driver::rows::{
    ClaimRequest, Claimed, FollowUpRow, Inserted, LapsedRow, NameList, NewTask, ReapRow, Reaped,
    WriteBack,
};
use taskq_driver::state::TaskId;
use taskq_drivertest::fixtures::{fresh_file, task};

use crate::connect::begin_write;
use crate::{enqueue, lease, tasks};

/// The worker id the tests claim as.
const W: &str = "w1";

/// A path for a fresh database file named after the test, next to the test binary (under the
/// target directory, so nothing is left in `$TMPDIR`).
fn db_path(test: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().and_then(|deps| deps.parent()).unwrap();
    fresh_file(&deps.join("tmp").join("taskq-sqlite-unit"), test)
}

/// A migrated pool on a fresh file.
async fn fresh(test: &str) -> SqlitePool {
    let pool = crate::open(db_path(test), 4).await.unwrap();
    crate::migrate(&pool).await.unwrap();
    pool
}

/// A claim of up to `limit` tasks of `queue` named in `names`, 30 s leases, by [`W`].
fn claim<'a>(queue: &'a str, names: &[&str], limit: u32) -> ClaimRequest<'a> {
    // Leaked: a test's handful of name lists.
    let names: &'static NameList = Box::leak(Box::new(NameList::new(names.iter().copied())));
    ClaimRequest {
        queue,
        names,
        limit,
        lease_us: 30_000_000,
        worker_id: W,
        limited: false,
    }
}

/// The id of an insert's outcome, new or the holder's.
fn id_of(i: Inserted) -> u64 {
    match i {
        Inserted::New(id) | Inserted::Duplicate(id) => id.0,
    }
}

/// Inserts a task that is not a duplicate; its id.
async fn insert(c: &mut SqliteConnection, t: NewTask<'_>) -> u64 {
    match enqueue::task_insert(c, &t).await.unwrap() {
        Inserted::New(id) => id.0,
        Inserted::Duplicate(id) => panic!("unexpected duplicate of {id}"),
    }
}

/// A task that exists.
async fn get(c: &mut SqliteConnection, id: u64) -> TaskInfo {
    tasks::task_get(c, TaskId(id))
        .await
        .unwrap()
        .expect("task exists")
}

/// A write-back of `attempt` under `epoch`.
fn write_back(
    id: u64,
    epoch: u64,
    attempt: u32,
    state: &'static str,
    outcome: &'static str,
) -> WriteBack {
    WriteBack {
        order_ends: None,
        workflow_step_ends: false,
        batch_ends: false,
        id,
        epoch,
        state,
        attempt,
        outcome,
        delay_us: 0,
        error: None,
        frees: None,
        follow_up: None,
        output: None,
        name: "".into(),
        queue: "".into(),
        ran: Duration::ZERO,
    }
}

/// The write-back of a claimed task's attempt.
fn outcome(t: &Claimed, state: &'static str, outcome: &'static str) -> WriteBack {
    write_back(t.id, t.lease_epoch, t.attempt, state, outcome)
}

/// A whole reap in one write transaction, as the worker's reaper does it: the lapsed leases
/// (names in `names` registered), `plan` called for each row that goes dead to build its
/// `on_dead` follow-up, then the reap.
async fn reap_lapsed(
    conn: &mut SqliteConnection,
    names: &[&str],
    limit: u32,
    mut plan: impl FnMut(&LapsedRow) -> Option<Box<FollowUpRow>>,
) -> sqlx::Result<Reaped> {
    let names = NameList::new(names.iter().copied());
    let mut tx = begin_write(conn).await?;
    let lapsed = lease::task_lapsed(&mut tx, &names, limit).await?;
    let rows: Vec<ReapRow> = lapsed
        .iter()
        .map(|r| ReapRow {
            order_ends: None,
            id: r.id,
            epoch: r.lease_epoch,
            frees: r.frees(),
            canceled: r.canceled,
            parks: r.parks(),
            follow_up: if r.goes_dead() { plan(r) } else { None },
        })
        .collect();
    let reaped = lease::task_reap(&mut tx, &rows).await?;
    tx.commit().await?;
    Ok(reaped)
}
