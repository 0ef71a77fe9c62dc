//! Live workers (`Workers`): start, beat, stop, list, prune.

use chrono::TimeDelta;
use taskq_driver::driver::Driver;
use taskq_driver::rows::NameList;
use taskq_driver::rows::{WorkerListRow, WorkerRow};

use crate::support::*;

/// The names and queues every test worker records.
static NAMES: std::sync::LazyLock<NameList> =
    std::sync::LazyLock::new(|| NameList::new(["a", "b"]));
static QUEUES: std::sync::LazyLock<Vec<(String, u32)>> =
    std::sync::LazyLock::new(|| vec![("q".to_owned(), 4)]);

fn row(worker_id: &str) -> WorkerRow<'_> {
    WorkerRow {
        worker_id,
        host: "host-1",
        pid: 4242,
        queues: &QUEUES,
        concurrency: 4,
        lease_us: 30_000_000,
        heartbeat_us: 10_000_000,
        names: &NAMES,
    }
}

async fn list<D: Driver>(d: &D, c: &mut D::Conn) -> Vec<WorkerListRow> {
    d.worker_list(c).await.expect("worker_list")
}

/// A started worker is listed with what it wrote (host, pid, queues, concurrency, lease,
/// heartbeat, names), its start and last beat on the database clock, alive, and the count of
/// running tasks claimed under its id. A beat moves `last_seen_at`; a stop marks it stopped
/// and not alive (`true`; an unknown id `false`), and a late beat does not revive it, a new
/// start does. A beat of a worker without a row inserts it.
pub async fn workers_are_recorded_listed_and_stopped<D: Driver>(d: D) {
    let mut c = conn(&d).await;
    let before = now::<D>(&mut c).await;
    d.worker_start(&mut c, &row(W)).await.expect("worker_start");
    let a = insert::<D>(&mut c, task("q", "a")).await;
    claim_one(&d, &mut c, "q", "a", LEASE_US, a).await;
    let l = list(&d, &mut c).await;
    assert_eq!(l.len(), 1);
    let w = &l[0];
    assert_eq!(
        (w.worker_id.as_str(), w.host.as_str(), w.pid),
        (W, "host-1", 4242)
    );
    assert_eq!(
        (w.concurrency, w.lease_us, w.heartbeat_us),
        (4, 30_000_000, 10_000_000)
    );
    assert_eq!(w.names.as_deref(), Some(r#"["a","b"]"#));
    let queues: serde_json::Value = serde_json::from_str(&w.queues).expect("queues is JSON");
    assert_eq!(queues, serde_json::json!({"q": 4}));
    assert!(
        before <= w.started_at,
        "{}: started on the database clock",
        backend::<D>()
    );
    assert_eq!(w.last_seen_at, w.started_at);
    assert_eq!(w.stopped_at, None);
    assert!(w.alive());
    assert!(
        (0..60_000_000).contains(&w.seen_ago_us),
        "seen {} µs ago",
        w.seen_ago_us
    );
    assert_eq!(w.running, 1, "the task it claimed");

    wait_clock_past::<D>(&mut c, w.last_seen_at).await;
    d.worker_seen(&mut c, &row(W)).await.expect("worker_seen");
    let seen = list(&d, &mut c).await[0].last_seen_at;
    assert!(seen > w.last_seen_at, "the beat moves last_seen_at");
    assert_eq!(list(&d, &mut c).await[0].started_at, w.started_at);

    assert!(d.worker_stop(&mut c, W).await.expect("worker_stop"));
    assert!(!d.worker_stop(&mut c, "nobody").await.expect("worker_stop"));
    let stopped = &list(&d, &mut c).await[0];
    assert!(!stopped.alive());
    let stopped_at = stopped.stopped_at.expect("stopped_at");
    assert_eq!(stopped.last_seen_at, stopped_at);
    wait_clock_past::<D>(&mut c, stopped_at).await;
    d.worker_seen(&mut c, &row(W)).await.expect("worker_seen");
    let l = list(&d, &mut c).await;
    assert_eq!(
        (l[0].last_seen_at, l[0].stopped_at, l[0].alive()),
        (stopped_at, Some(stopped_at), false),
        "a late beat does not revive it"
    );
    d.worker_start(&mut c, &row(W)).await.expect("worker_start");
    let l = list(&d, &mut c).await;
    assert!(
        l[0].alive() && l[0].stopped_at.is_none(),
        "a restart revives it"
    );
    assert!(l[0].started_at > w.started_at);

    // A beat without a row inserts it.
    d.worker_seen(&mut c, &row("w2"))
        .await
        .expect("worker_seen");
    let l = list(&d, &mut c).await;
    let ids: Vec<&str> = l.iter().map(|w| w.worker_id.as_str()).collect();
    assert_eq!(ids, vec![W, "w2"], "oldest start first");
    assert!(l[1].alive());
    assert_eq!(l[1].running, 0);
}

/// A worker not seen for two of its heartbeat intervals (at least 1 s) is no longer alive,
/// though not stopped. `worker_prune` deletes the rows not seen for `age_secs` (oldest beat
/// first, up to `limit`) and keeps the others.
pub async fn gone_workers_are_not_alive_and_old_rows_are_pruned<D: Driver>(d: D) {
    let mut c = conn(&d).await;
    let fast = WorkerRow {
        heartbeat_us: 1_000,
        ..row("gone")
    };
    d.worker_start(&mut c, &fast).await.expect("worker_start");
    let started = list(&d, &mut c).await[0].last_seen_at;
    assert!(list(&d, &mut c).await[0].alive());
    // Two heartbeats are 2 ms; the floor is 1 s.
    wait_clock_past::<D>(&mut c, started + TimeDelta::milliseconds(1_001)).await;
    let l = list(&d, &mut c).await;
    assert!(!l[0].alive(), "{}: lost after 1 s", backend::<D>());
    assert_eq!(l[0].stopped_at, None, "lost, not stopped");
    assert!(l[0].seen_ago_us > 1_000_000);

    d.worker_start(&mut c, &row("second"))
        .await
        .expect("worker_start");
    d.worker_start(&mut c, &row("third"))
        .await
        .expect("worker_start");
    assert_eq!(
        d.worker_prune(&mut c, 3_600, 10)
            .await
            .expect("worker_prune"),
        0,
        "none an hour old"
    );
    let newest = list(&d, &mut c).await[2].last_seen_at;
    wait_clock_past::<D>(&mut c, newest).await;
    assert_eq!(d.worker_prune(&mut c, 0, 1).await.expect("worker_prune"), 1);
    let ids: Vec<String> = list(&d, &mut c)
        .await
        .into_iter()
        .map(|w| w.worker_id)
        .collect();
    assert_eq!(ids, vec!["second", "third"], "the oldest beat first");
    assert_eq!(
        d.worker_prune(&mut c, 0, 10).await.expect("worker_prune"),
        2
    );
    assert!(list(&d, &mut c).await.is_empty());
}
