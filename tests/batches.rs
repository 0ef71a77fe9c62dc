//! Batches through taskq's API against a real database, with running workers: a batch whose
//! callbacks run once its members ended (a failing member canceling `on_success`); an open
//! batch added to over several transactions and sealed through the client; refused batches
//! writing nothing; a batch canceled as a whole, audited; waiting for a batch.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use taskq::batch::{Batch, BatchId, BatchState};
use taskq::{Data, Error, TaskError, TaskState};
use taskq_tests::backends::{Db, TestBackend};
use taskq_tests::{RunningWorker, wait_until};

/// The labels of the runs, in order.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<String>>>);

impl Log {
    fn push(&self, label: String) {
        self.0.lock().unwrap().push(label);
    }
    fn runs(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
    fn count(&self, label: &str) -> usize {
        self.runs().iter().filter(|l| *l == label).count()
    }
}

/// A member or callback: records its run; dies at once when `fail`.
#[taskq::task(queue = "batch", max_attempts = 1)]
async fn batch_job(label: String, fail: bool, log: Data<Log>) -> Result<(), TaskError> {
    log.push(label.clone());
    if fail {
        return Err(TaskError::msg(format!("{label} fails")));
    }
    Ok(())
}

fn job(label: &str) -> BatchJob {
    BatchJob {
        label: label.to_owned(),
        fail: false,
    }
}

fn failing(label: &str) -> BatchJob {
    BatchJob {
        label: label.to_owned(),
        fail: true,
    }
}

fn worker<B: TestBackend>(db: &Db<B>, log: &Log) -> RunningWorker {
    RunningWorker::spawn(
        db.worker()
            .queue("batch", 4)
            .register::<BatchJob>()
            .data(log.clone()),
    )
}

/// Ten members, one of them dies: `on_complete` runs once after all ten ended, `on_success`
/// never runs and ends canceled; the batch is `failed` with its counters; a batch whose
/// members all succeed runs both callbacks once.
async fn callbacks_run_once_after_the_members_and_a_failure_cancels_on_success<B: TestBackend>(
    db: Db<B>,
) {
    let log = Log::default();
    let w = worker(&db, &log);
    let bad = Batch::new("bad")
        .add_all((0..9).map(|i| job(&format!("m{i}"))))
        .add(failing("broken"))
        .on_success(job("bad:success"))
        .on_complete(job("bad:complete"))
        .enqueue(&db.pool)
        .await
        .unwrap();
    let good = Batch::new("good")
        .add_all((0..5).map(|i| job(&format!("g{i}"))))
        .on_success(job("good:success"))
        .on_complete(job("good:complete"))
        .enqueue(&db.pool)
        .await
        .unwrap();
    let client = db.client();
    let b = client
        .wait_batch(bad.id, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(
        (b.state, b.total, b.succeeded, b.failed, b.pending),
        (BatchState::Failed, 10, 9, 1, 0),
        "{}",
        B::LABEL
    );
    let g = client
        .wait_batch(good.id, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!((g.state, g.succeeded), (BatchState::Succeeded, 5));
    wait_until(Duration::from_secs(10), "the callbacks ran", || async {
        log.count("bad:complete") == 1
            && log.count("good:success") == 1
            && log.count("good:complete") == 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    w.stop().await;
    let runs = log.runs();
    let pos = |l: &str| runs.iter().position(|r| r == l).unwrap();
    let last_member = (0..9)
        .map(|i| pos(&format!("m{i}")))
        .max()
        .unwrap()
        .max(pos("broken"));
    assert!(pos("bad:complete") > last_member, "{}: {runs:?}", B::LABEL);
    assert_eq!(log.count("bad:success"), 0);
    assert_eq!(
        (log.count("bad:complete"), log.count("good:complete")),
        (1, 1)
    );
    let s = client.get(bad.on_success.unwrap()).await.unwrap();
    assert_eq!(s.state, TaskState::Canceled, "{}", B::LABEL);
    assert_eq!(
        s.last_error.as_deref(),
        Some(taskq_driver::rules::batch::CANCELED_BY_BATCH)
    );
    let members = client.batch_members(bad.id, None, 100).await.unwrap();
    assert_eq!(members.len(), 10);
    assert_eq!(
        members
            .iter()
            .filter(|m| m.state == Some(TaskState::Dead))
            .count(),
        1
    );
}

/// An open batch: its members run, its callbacks wait; members are added in a later
/// transaction; the client seals it, and the callbacks run once the added members ended.
/// Once complete, an addition or a seal is refused with `BatchEnded`; an unknown batch is
/// `BatchNotFound`.
async fn an_open_batch_is_added_to_and_sealed_through_the_client<B: TestBackend>(db: Db<B>) {
    let log = Log::default();
    let w = worker(&db, &log);
    let open = Batch::new("paged")
        .add(job("p1"))
        .on_complete(job("paged:complete"))
        .open()
        .enqueue(&db.pool)
        .await
        .unwrap();
    let client = db.client();
    wait_until(Duration::from_secs(10), "p1 ran", || async {
        log.count("p1") == 1
    })
    .await;
    let mut tx = B::begin(&db.pool).await;
    let added = Batch::add_to(open.id)
        .add(job("p2"))
        .add(job("p3"))
        .enqueue_tx(&mut tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(added.len(), 2);
    wait_until(Duration::from_secs(10), "p2 and p3 ran", || async {
        log.count("p2") == 1 && log.count("p3") == 1
    })
    .await;
    let b = client.batch(open.id).await.unwrap();
    wait_until(Duration::from_secs(10), "the ends are counted", || {
        let client = client.clone();
        async move { client.batch(open.id).await.unwrap().succeeded == 3 }
    })
    .await;
    assert_eq!(b.state, BatchState::Open, "{}", B::LABEL);
    assert_eq!(log.count("paged:complete"), 0, "open: nothing released");
    client.seal_batch(open.id).await.unwrap();
    wait_until(Duration::from_secs(10), "the callback ran", || async {
        log.count("paged:complete") == 1
    })
    .await;
    let b = client.batch(open.id).await.unwrap();
    assert_eq!(
        (b.state, b.total, b.succeeded),
        (BatchState::Succeeded, 3, 3)
    );
    assert!(b.completed_at.is_some());
    assert!(matches!(
        Batch::add_to(open.id).add(job("late")).enqueue(&db.pool).await,
        Err(Error::BatchEnded(id)) if id == open.id
    ));
    assert!(matches!(
        client.seal_batch(open.id).await,
        Err(Error::BatchEnded(_))
    ));
    let unknown = BatchId(open.id.0 + 1000);
    assert!(matches!(
        client.seal_batch(unknown).await,
        Err(Error::BatchNotFound(_))
    ));
    assert!(matches!(
        client.batch(unknown).await,
        Err(Error::BatchNotFound(_))
    ));
    w.stop().await;
    assert_eq!(log.count("late"), 0);
}

/// Rolled back, a batch leaves nothing; a sealed batch without a member, a unique member, a
/// callback with an idempotency key and a bad name are refused before anything is written.
async fn a_refused_or_rolled_back_batch_writes_nothing<B: TestBackend>(db: Db<B>) {
    let mut tx = db.pool.begin().await.unwrap();
    let gone = Batch::new("gone")
        .add(job("a"))
        .on_complete(job("c"))
        .enqueue_tx(&mut tx)
        .await
        .unwrap();
    drop(tx);
    assert_eq!(db.count("1 = 1").await, 0, "{}", B::LABEL);
    assert!(matches!(
        db.client().batch(gone.id).await,
        Err(Error::BatchNotFound(_))
    ));
    assert!(matches!(
        Batch::new("empty").on_complete(job("c")).enqueue(&db.pool).await,
        Err(Error::InvalidOption(m)) if m.contains("at least one task")
    ));
    assert!(matches!(
        Batch::new("unique")
            .add(job("a").with_unique(taskq::unique::Unique::payload()))
            .enqueue(&db.pool)
            .await,
        Err(Error::InvalidOption(m)) if m.contains("batch member")
    ));
    assert!(matches!(
        Batch::new("keyed")
            .add(job("a"))
            .on_success(job("s").with_idempotency_key("k"))
            .enqueue(&db.pool)
            .await,
        Err(Error::InvalidOption(m)) if m.contains("batch callback")
    ));
    assert!(matches!(
        Batch::new("").add(job("a")).enqueue(&db.pool).await,
        Err(Error::InvalidName {
            what: "batch name",
            ..
        })
    ));
    assert_eq!(db.count("1 = 1").await, 0, "{}: nothing written", B::LABEL);
    assert!(
        db.client()
            .batches(None, None, 10)
            .await
            .unwrap()
            .is_empty()
    );
}

/// A batch canceled as a whole before any worker ran it: its members and callbacks end
/// canceled and nothing runs; its state is `canceled`, `wait_batch` returns it, the list shows
/// it, and the audit trail has the action with its counts.
async fn a_canceled_batch_runs_nothing_and_is_audited<B: TestBackend>(db: Db<B>) {
    let b = Batch::new("doomed")
        .add_all([job("a"), job("b"), job("c")])
        .on_success(job("s"))
        .on_complete(job("c"))
        .enqueue(&db.pool)
        .await
        .unwrap();
    let client = db.client().with_actor("ops@example.com");
    let done = client.cancel_batch(b.id).await.unwrap();
    assert_eq!(
        (
            done.canceled,
            done.cancel_requested,
            done.callbacks_canceled
        ),
        (3, 0, 2),
        "{}",
        B::LABEL
    );
    let info = client
        .wait_batch(b.id, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!((info.state, info.failed), (BatchState::Canceled, 3));
    let log = Log::default();
    let w = worker(&db, &log);
    tokio::time::sleep(Duration::from_millis(300)).await;
    w.stop().await;
    assert!(log.runs().is_empty(), "{}: {:?}", B::LABEL, log.runs());
    let listed = client.batches(Some("doomed"), None, 10).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].state, BatchState::Canceled);
    let audit = client
        .audit(&taskq::client::AuditFilter::default())
        .await
        .unwrap();
    let entry = audit
        .iter()
        .find(|a| a.action == "batch_cancel")
        .expect("audited");
    assert_eq!(entry.actor, "ops@example.com");
    assert_eq!(entry.detail["batch_id"], b.id.0);
    assert_eq!(entry.detail["canceled"], 3);
    assert!(matches!(
        client.cancel_batch(BatchId(b.id.0 + 99)).await,
        Err(Error::BatchNotFound(_))
    ));
    assert!(matches!(
        client
            .wait_batch(BatchId(b.id.0 + 99), Duration::from_secs(1))
            .await,
        Err(Error::BatchNotFound(_))
    ));
}

taskq_tests::conformance!(
    callbacks_run_once_after_the_members_and_a_failure_cancels_on_success,
    an_open_batch_is_added_to_and_sealed_through_the_client,
    a_refused_or_rolled_back_batch_writes_nothing,
    a_canceled_batch_runs_nothing_and_is_audited,
);
