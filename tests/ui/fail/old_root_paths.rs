// The crate-root paths of what moved into modules in 0.2 warn with the new path (here denied,
// so each warning is an error the .stderr records). Traits cannot carry a deprecation on a
// re-export (rust-lang/rust#30827): their old paths compile silently (tests/ui/pass).
#![deny(deprecated)]

#[taskq::task(queue = "old_paths")]
async fn old_paths(n: i64) -> Result<(), taskq::TaskError> {
    let _ = n;
    Ok(())
}

fn worker(pool: sqlx::MySqlPool) -> taskq::WorkerBuilder {
    taskq::Worker::builder(pool)
}

async fn enqueue_all(tx: &mut sqlx::MySqlConnection) -> taskq::Result<usize> {
    Ok(taskq::enqueue_many(tx, (0..3).map(|n| OldPaths { n })).await?.len())
}

fn main() {
    let _ = (worker, enqueue_all);
    let _: Option<taskq::CancelReason> = None;
    let _: Option<taskq::DataMap> = None;
    let _: Option<taskq::FollowUp> = None;
    let _: Option<taskq::OnDead> = None;
    let _: Option<taskq::OnSuccess> = None;
    let _: Option<taskq::ParseStateError> = None;
    let _: Option<taskq::TaskErrorKind> = None;
    let _: Option<taskq::UniqueBy> = None;
    let _: Option<taskq::UniqueHold> = None;
    let _ = taskq::MissedTicks::Latest;
    let _: Option<taskq::Schedule<OldPaths>> = None;
    let _ = taskq::Unique::payload();
    let _ = taskq::MIGRATIONS_TABLE;
    let _ = taskq::migrator();
    let _ = taskq::schedule_tick_key("s", chrono::Utc::now());
    taskq::notify("old_paths");
}
