// The crate-root paths of what moved into modules in 0.2 still compile (deprecated: the
// companion tests/ui/fail/old_root_paths.rs shows each warning).
#![allow(deprecated)]

use std::time::Duration;

use taskq::{
    AsConnection, CancelReason, DataMap, FollowUp, FromTaskContext, IntoEnqueue, MissedTicks,
    OnDead, OnSuccess, ParseStateError, Schedule, TaskErrorKind, Unique, UniqueBy, UniqueHold,
    WorkerBuilder,
};

#[taskq::task(queue = "old_paths")]
async fn old_paths(n: i64) -> Result<(), taskq::TaskError> {
    let _ = n;
    Ok(())
}

#[allow(dead_code)]
fn worker(pool: sqlx::MySqlPool) -> WorkerBuilder {
    taskq::Worker::builder(pool)
}

#[allow(dead_code)]
async fn enqueue_all<C: AsConnection + ?Sized>(conn: &mut C) -> taskq::Result<usize> {
    let ids = taskq::enqueue_many(conn, (0..3).map(|n| OldPaths { n })).await?;
    Ok(ids.len())
}

#[allow(dead_code)]
fn into_enqueue<T: IntoEnqueue>(t: T) -> T {
    t
}

#[allow(dead_code)]
struct Tenant;

impl FromTaskContext for Tenant {
    fn from_task_context(_cx: &taskq::TaskContext) -> Result<Self, taskq::TaskError> {
        Ok(Tenant)
    }
}

fn main() {
    let _: Option<CancelReason> = None;
    let _: Option<DataMap> = None;
    let _: Option<FollowUp> = None;
    let _: Option<OnDead> = None;
    let _: Option<OnSuccess> = None;
    let _: Option<ParseStateError> = None;
    let _: Option<TaskErrorKind> = None;
    let _: Option<UniqueBy> = None;
    let _: Option<UniqueHold> = None;
    let _ = MissedTicks::Latest;
    let _: Schedule<OldPaths> = Schedule::new("* * * * *", OldPaths { n: 1 });
    let _ = Unique::payload();
    let _ = taskq::MIGRATIONS_TABLE;
    let _ = taskq::migrator();
    let _ = taskq::schedule_tick_key("s", chrono::Utc::now());
    taskq::notify("old_paths");
    let _ = Duration::from_secs(1);
}
