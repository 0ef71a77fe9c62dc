//! What the tests share: rows to insert, claims, outcomes and reaps built the way taskq's
//! runtime builds them, and waits on the database clock.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, TimeDelta, Utc};
use serde_json::Value;
use taskq_driver::driver::{Driver, Handle};
use taskq_driver::read::TaskInfo;
use taskq_driver::rows::NameList;
use taskq_driver::rows::{
    ClaimBatch, ClaimCursor, ClaimRequest, Claimed, Inserted, LapsedRow, NewTask, ReapRow,
    WriteBack,
};
use taskq_driver::state::{TaskId, TaskState};

/// The worker id of the tests' claims.
pub(crate) const W: &str = "w1";

/// The lease of a claim that is not meant to expire during a test (1 hour).
pub(crate) const LEASE_US: i64 = 3_600_000_000;

/// The lease of a claim meant to expire: one microsecond (see [`wait_lease_expired`]).
pub(crate) const SHORT_LEASE_US: i64 = 1;

/// An hour, in microseconds.
pub(crate) const HOUR_US: i64 = 3_600_000_000;

/// A connection of the driver's pool.
pub(crate) type Conn<D> = sqlx::pool::PoolConnection<<D as Handle>::Database>;

/// A connection from the driver's pool.
pub(crate) async fn conn<D: Driver>(d: &D) -> Conn<D> {
    d.pool().acquire().await.expect("a connection of the pool")
}

/// The driver's database (`"MySQL"`, `"SQLite"`), for messages and the few documented
/// differences.
pub(crate) fn backend<D: Driver>() -> &'static str {
    <D::Database as sqlx::Database>::NAME
}

pub(crate) use crate::fixtures::task;

/// A unique task of `name` on queue `q`, holding `key` while `while_` (`pending`, `running`).
pub(crate) fn unique<'a>(name: &'a str, key: &'a [u8], while_: &'static str) -> NewTask<'a> {
    NewTask {
        unique_key: Some(key),
        unique_while: Some(while_),
        ..task("q", name)
    }
}

/// Inserts `t` (through `Enqueue::task_insert`), which must be new; its id.
pub(crate) async fn insert<D: Driver>(c: &mut D::Conn, t: NewTask<'_>) -> TaskId {
    match D::task_insert(c, &t).await.expect("task_insert") {
        Inserted::New(id) => id,
        Inserted::Duplicate(id) => panic!("unexpected duplicate of task {id}"),
    }
}

/// Inserts `t`, which must be a duplicate; the holder's id.
pub(crate) async fn insert_duplicate<D: Driver>(c: &mut D::Conn, t: NewTask<'_>) -> TaskId {
    match D::task_insert(c, &t).await.expect("task_insert") {
        Inserted::New(id) => panic!("expected a duplicate, got the new task {id}"),
        Inserted::Duplicate(id) => id,
    }
}

/// The task `id`, which must exist.
pub(crate) async fn get<D: Driver>(d: &D, id: TaskId) -> TaskInfo {
    d.task_get(id)
        .await
        .expect("task_get")
        .unwrap_or_else(|| panic!("task {id} exists"))
}

/// A list of task names, as the claim and the reaper take them.
pub(crate) fn names(names: &[&str]) -> NameList {
    NameList::new(names.iter().copied())
}

/// `(id, epoch)` pairs, as the heartbeat, release and leases-held operations take them.
pub(crate) fn leases(l: &[(TaskId, u64)]) -> Vec<(u64, u64)> {
    l.iter().map(|(id, e)| (id.0, *e)).collect()
}

/// A claim of up to `limit` tasks of `queue` named in `names`, by worker [`W`] with a
/// lease of [`LEASE_US`], unlimited.
pub(crate) fn req<'a>(queue: &'a str, names: &'a NameList, limit: u32) -> ClaimRequest<'a> {
    ClaimRequest {
        queue,
        names,
        limit,
        lease_us: LEASE_US,
        worker_id: W,
        limited: false,
    }
}

/// Claims with a fresh cursor (a claim loop's first claim: from the head of the queue).
pub(crate) async fn claim<D: Driver>(d: &D, c: &mut D::Conn, r: &ClaimRequest<'_>) -> ClaimBatch {
    let mut cursor = ClaimCursor::default();
    d.task_claim(c, r, &mut cursor).await.expect("task_claim")
}

/// The ids of the tasks a claim started, in claim order.
pub(crate) fn claimed_ids(b: &ClaimBatch) -> Vec<TaskId> {
    b.tasks.iter().map(|t| TaskId(t.id)).collect()
}

/// Claims exactly the task `id` (the only due task of `queue` named `name`), leased `lease_us`.
pub(crate) async fn claim_one<D: Driver>(
    d: &D,
    c: &mut D::Conn,
    queue: &str,
    name: &str,
    lease_us: i64,
    id: TaskId,
) -> Claimed {
    let n = names(&[name]);
    let got = claim(
        d,
        c,
        &ClaimRequest {
            lease_us,
            ..req(queue, &n, 1)
        },
    )
    .await;
    assert_eq!(
        claimed_ids(&got),
        vec![id],
        "{}: the claim takes {id}",
        backend::<D>()
    );
    got.tasks.into_iter().next().expect("one task")
}

/// The identity an outcome frees, by taskq's rule (the worker's `write_back`): a task unique
/// while running frees it by a success or death, a window's by death, any unique task by a
/// cancel; a retry or snooze keeps it.
pub(crate) fn frees(t: &Claimed, state: &str) -> Option<Vec<u8>> {
    match (t.unique_while.as_deref(), state) {
        (Some("running"), "succeeded" | "dead") | (Some("window"), "dead") => t.unique_key.clone(),
        (Some(_), "canceled") => t.unique_key.clone(),
        _ => None,
    }
}

/// The write-back of `t`'s attempt ending in `state` with `outcome`, as the worker builds it
/// (its epoch and attempt, the identity it frees, no delay, no error, no follow-up).
pub(crate) fn outcome(t: &Claimed, state: &'static str, outcome: &'static str) -> WriteBack {
    let to = match state {
        "succeeded" => TaskState::Succeeded,
        "dead" => TaskState::Dead,
        "canceled" => TaskState::Canceled,
        _ => TaskState::Pending,
    };
    WriteBack {
        order_ends: t
            .order_key
            .clone()
            .filter(|_| taskq_driver::rules::ends_order_head(to, t.order_dead_skips)),
        workflow_step_ends: t.workflow_id.is_some()
            && taskq_driver::rules::workflow::ENDED_STATES.contains(&to),
        batch_ends: t.batch_id.is_some()
            && taskq_driver::rules::workflow::ENDED_STATES.contains(&to),
        id: t.id,
        epoch: t.lease_epoch,
        state,
        attempt: t.attempt,
        outcome,
        delay_us: 0,
        error: None,
        frees: frees(t, state),
        follow_up: None,
        output: None,
        name: Arc::from(t.name.as_str()),
        queue: Arc::from(""),
        ran: Duration::ZERO,
    }
}

/// The reap of an expired lease as the reaper plans it from what `task_lapsed` read.
pub(crate) fn reap_row(r: &LapsedRow) -> ReapRow {
    ReapRow {
        order_ends: r.order_ends(),
        id: r.id,
        epoch: r.lease_epoch,
        frees: r.frees(),
        canceled: r.canceled,
        parks: r.parks(),
        follow_up: None,
    }
}

/// The database clock.
pub(crate) async fn now<D: Driver>(c: &mut D::Conn) -> DateTime<Utc> {
    let us = D::db_clock_us(c).await.expect("db_clock_us");
    DateTime::from_timestamp_micros(us).expect("a clock in range")
}

/// `t` truncated to whole milliseconds (a time both clocks can store as it is).
pub(crate) fn ms(t: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(t.timestamp_millis()).expect("a time in range")
}

/// Waits until the database clock is past `t` (SQLite's clock moves in milliseconds), polling
/// it; panics after a minute.
pub(crate) async fn wait_clock_past<D: Driver>(c: &mut D::Conn, t: DateTime<Utc>) {
    let start = Instant::now();
    loop {
        if now::<D>(c).await > t {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{}: the database clock did not pass {t} within a minute",
            backend::<D>()
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Waits until the lease of running task `id` has expired on the database clock.
pub(crate) async fn wait_lease_expired<D: Driver>(d: &D, c: &mut D::Conn, id: TaskId) {
    let until = get(d, id)
        .await
        .lease_until
        .unwrap_or_else(|| panic!("task {id} holds a lease"));
    wait_clock_past::<D>(c, until).await;
}

/// The attempt history of `id`, parsed (empty when none).
pub(crate) async fn history<D: Driver>(d: &D, id: TaskId) -> Vec<Value> {
    match d
        .task_attempts(id)
        .await
        .expect("task_attempts")
        .unwrap_or_else(|| panic!("task {id} exists"))
    {
        None => Vec::new(),
        Some(json) => serde_json::from_str(&json).expect("the history is a JSON array"),
    }
}

/// A stored time as the attempt history writes it (`YYYY-MM-DD HH:MM:SS.ffffff`).
pub(crate) fn history_time(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S%.6f").to_string()
}

/// `us` microseconds.
pub(crate) fn micros(us: i64) -> TimeDelta {
    TimeDelta::microseconds(us)
}
