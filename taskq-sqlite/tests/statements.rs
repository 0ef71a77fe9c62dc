//! Every statement of taskq-sqlite against a real database file, with the rows it leaves.

mod support;

use std::time::Duration;

use chrono::{TimeDelta, Utc};
use sqlx::SqliteConnection;
use support::{fresh, task};
use taskq_sqlite::*;

const W: &str = "w1";

fn claim<'a>(queue: &'a str, names: &'a [&'a str], limit: u32) -> ClaimRequest<'a> {
    ClaimRequest {
        queue,
        names,
        limit,
        lease_us: 30_000_000,
        worker_id: W,
        limited: false,
    }
}

async fn insert(c: &mut SqliteConnection, t: NewTask<'_>) -> i64 {
    match task_insert(c, &t).await.unwrap() {
        Inserted::New(id) => id,
        Inserted::Duplicate(id) => panic!("unexpected duplicate of {id}"),
    }
}

async fn get(c: &mut SqliteConnection, id: i64) -> TaskRow {
    task_get(c, id).await.unwrap().expect("task exists")
}

/// A write-back of attempt 1 (the outcome named after the state).
fn finish(id: i64, epoch: i64, state: &'static str) -> WriteBack {
    let outcome = match state {
        "pending" | "dead" => "failed",
        s => s,
    };
    WriteBack {
        id,
        epoch,
        state,
        attempt: 1,
        outcome,
        delay_us: 0,
        error: None,
        follow_up: None,
    }
}

const KEY_A: [u8; 32] = [0xaa; 32];
const KEY_B: [u8; 32] = [0xbb; 32];

fn unique<'a>(name: &'a str, key: &'a [u8], while_: &'static str) -> NewTask<'a> {
    NewTask {
        unique_key: Some(key),
        unique_while: Some(while_),
        ..task("q", name)
    }
}

#[tokio::test]
async fn migrate_is_idempotent_and_serialized_across_pools() {
    let path = support::db_path("migrate");
    let mut handles = Vec::new();
    for _ in 0..4 {
        let path = path.clone();
        handles.push(tokio::spawn(async move {
            let pool = open(&path, 2).await.unwrap();
            migrate(&pool).await.unwrap();
            migrate(&pool).await.unwrap();
            pool
        }));
    }
    let mut pools = Vec::new();
    for h in handles {
        pools.push(h.await.unwrap());
    }
    let mut c = pools[0].acquire().await.unwrap();
    let applied: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM _taskq_migrations")
        .fetch_one(&mut *c)
        .await
        .unwrap();
    assert_eq!(applied, migrator().iter().count() as i64);
    let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(&mut *c)
        .await
        .unwrap();
    assert_eq!(mode, "wal");
    // STRICT and CHECK: a state outside the set is refused.
    let bad = sqlx::query(
        "INSERT INTO taskq_tasks (queue, name, payload, state, max_attempts, run_at, created_at, updated_at)
         VALUES ('q', 'n', x'', 'bogus', 1, 0, 0, 0)",
    )
    .execute(&mut *c)
    .await;
    assert!(bad.is_err());
}

#[tokio::test]
async fn clock_is_the_databases_in_microseconds() {
    let pool = fresh("clock").await;
    let mut c = pool.acquire().await.unwrap();
    let before = Utc::now();
    let now = db_now(&mut c).await.unwrap();
    let us = db_clock_us(&mut c).await.unwrap();
    assert!(
        (now - before).abs() < TimeDelta::seconds(2),
        "{now} vs {before}"
    );
    assert_eq!(us % 1000, 0, "millisecond resolution, stored in µs");
    assert!(us >= time_to_us(now));
}

#[tokio::test]
async fn claim_order_is_priority_run_at_id_and_skips_not_due_other_names_and_paused() {
    let pool = fresh("claim_order").await;
    let mut c = pool.acquire().await.unwrap();
    let t0 = Utc::now() - TimeDelta::seconds(60);
    let at = |s: i64| Some(t0 + TimeDelta::seconds(s));
    let a = insert(
        &mut c,
        NewTask {
            priority: 5,
            run_at: at(1),
            ..task("q", "a")
        },
    )
    .await;
    let b = insert(
        &mut c,
        NewTask {
            priority: 0,
            run_at: at(3),
            ..task("q", "a")
        },
    )
    .await;
    let d = insert(
        &mut c,
        NewTask {
            priority: 0,
            run_at: at(2),
            ..task("q", "a")
        },
    )
    .await;
    let e = insert(
        &mut c,
        NewTask {
            priority: 0,
            run_at: at(2),
            ..task("q", "a")
        },
    )
    .await;
    let _later = insert(
        &mut c,
        NewTask {
            delay_us: 3_600_000_000,
            ..task("q", "a")
        },
    )
    .await;
    let other_name = insert(&mut c, task("q", "zzz")).await;
    let _other_queue = insert(&mut c, task("other", "a")).await;

    queue_pause(&mut c, "q").await.unwrap();
    assert_eq!(queues_paused(&mut c).await.unwrap().len(), 1);
    let got = task_claim(&mut c, &claim("q", &["a"], 10)).await.unwrap();
    assert!(got.tasks.is_empty(), "a paused queue is not claimed from");
    assert!(queue_resume(&mut c, "q").await.unwrap());
    assert!(!queue_resume(&mut c, "q").await.unwrap());

    let got = task_claim(&mut c, &claim("q", &["a"], 3)).await.unwrap();
    let ids: Vec<i64> = got.tasks.iter().map(|t| t.id).collect();
    assert_eq!(ids, vec![d, e, b], "priority, then run_at, then id");
    let got = task_claim(&mut c, &claim("q", &["a"], 10)).await.unwrap();
    let ids: Vec<i64> = got.tasks.iter().map(|t| t.id).collect();
    assert_eq!(ids, vec![a], "the delayed task and other names/queues stay");
    assert_eq!(get(&mut c, other_name).await.state, "pending");

    let row = get(&mut c, a).await;
    assert_eq!(row.state, "running");
    assert_eq!((row.attempt, row.lease_epoch), (1, 1));
    assert_eq!(row.worker_id.as_deref(), Some(W));
    let lease = row.lease_until.unwrap() - row.updated_at;
    assert_eq!(lease, TimeDelta::seconds(30));
    let t = &got.tasks[0];
    assert_eq!((t.attempt, t.lease_epoch, t.max_attempts), (1, 1, 3));
    assert!(
        t.wait_us >= 58_000_000,
        "waited about a minute: {}",
        t.wait_us
    );
    let both = task_claim(&mut c, &claim("q", &["a", "zzz"], 10))
        .await
        .unwrap();
    assert_eq!(
        both.tasks.iter().map(|t| t.id).collect::<Vec<_>>(),
        vec![other_name]
    );
}

#[tokio::test]
async fn finish_writes_each_outcome_and_the_epoch_fences_a_stale_one() {
    let pool = fresh("finish").await;
    let mut c = pool.acquire().await.unwrap();
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(insert(&mut c, task("q", "a")).await);
    }
    let got = task_claim(&mut c, &claim("q", &["a"], 5)).await.unwrap();
    assert_eq!(got.tasks.len(), 5);
    let batch = vec![
        finish(ids[0], 1, "succeeded"),
        WriteBack {
            delay_us: 3_600_000_000,
            error: Some("boom".into()),
            ..finish(ids[1], 1, "pending")
        },
        WriteBack {
            error: Some("fatal".into()),
            ..finish(ids[2], 1, "dead")
        },
        finish(ids[3], 1, "canceled"),
        WriteBack {
            delay_us: 3_600_000_000,
            ..finish(ids[4], 1, "snoozed")
        },
        // Stale epoch: fenced.
        finish(ids[0], 0, "dead"),
    ];
    let written = task_write_back(&mut c, &batch).await.unwrap();
    assert_eq!(written.written, ids);
    assert!(written.followed.is_empty());

    let ok = get(&mut c, ids[0]).await;
    assert_eq!(ok.state, "succeeded");
    assert!(ok.finished_at.is_some() && ok.lease_until.is_none());
    let retry = get(&mut c, ids[1]).await;
    assert_eq!((retry.state.as_str(), retry.attempt), ("pending", 1));
    assert_eq!(retry.last_error.as_deref(), Some("boom"));
    assert!(retry.finished_at.is_none());
    assert!(retry.run_at - retry.updated_at == TimeDelta::hours(1));
    let dead = get(&mut c, ids[2]).await;
    assert_eq!(
        (dead.state.as_str(), dead.last_error.as_deref()),
        ("dead", Some("fatal"))
    );
    assert_eq!(get(&mut c, ids[3]).await.state, "canceled");
    let snoozed = get(&mut c, ids[4]).await;
    assert_eq!(
        (snoozed.state.as_str(), snoozed.attempt, snoozed.snoozes),
        ("pending", 0, 1)
    );

    // A second write-back of the same attempt finds nothing running.
    assert!(
        task_write_back(&mut c, &[finish(ids[0], 1, "dead")])
            .await
            .unwrap()
            .written
            .is_empty()
    );
    assert_eq!(get(&mut c, ids[0]).await.state, "succeeded");
    // The retried task is not due.
    assert!(
        task_claim(&mut c, &claim("q", &["a"], 5))
            .await
            .unwrap()
            .tasks
            .is_empty()
    );
}

#[tokio::test]
async fn reaper_requeues_kills_or_cancels_expired_leases_and_fences_the_old_attempt() {
    let pool = fresh("reaper").await;
    let mut c = pool.acquire().await.unwrap();
    let requeue = insert(&mut c, task("q", "a")).await;
    let last = insert(
        &mut c,
        NewTask {
            max_attempts: 1,
            ..task("q", "a")
        },
    )
    .await;
    let cancel = insert(&mut c, task("q", "a")).await;
    let fresh_lease = insert(&mut c, task("q", "b")).await;
    // A negative lease: expired at once.
    let expired = ClaimRequest {
        lease_us: -1_000,
        ..claim("q", &["a"], 10)
    };
    assert_eq!(task_claim(&mut c, &expired).await.unwrap().tasks.len(), 3);
    task_claim(&mut c, &claim("q", &["b"], 10)).await.unwrap();
    assert!(task_request_cancel(&mut c, cancel).await.unwrap());

    let reaped = task_reap_expired(&mut c, &["a"], 100, |_| None)
        .await
        .unwrap();
    assert!(reaped.followed.is_empty());
    let states: Vec<(i64, &str)> = reaped
        .rows
        .iter()
        .map(|r| (r.id, r.state.as_str()))
        .collect();
    assert_eq!(
        states,
        vec![(requeue, "pending"), (last, "dead"), (cancel, "canceled")]
    );
    let r = get(&mut c, requeue).await;
    assert_eq!(
        (r.state.as_str(), r.lease_epoch, r.attempt),
        ("pending", 2, 1)
    );
    assert_eq!(
        r.last_error.as_deref(),
        Some("lease expired (worker w1, attempt 1)")
    );
    assert!(get(&mut c, last).await.finished_at.is_some());
    assert_eq!(get(&mut c, fresh_lease).await.state, "running");
    // The reaped attempt's write-back and heartbeat are fenced.
    assert!(
        task_write_back(&mut c, &[finish(requeue, 1, "succeeded")])
            .await
            .unwrap()
            .written
            .is_empty()
    );
    assert_eq!(
        task_heartbeat(&mut c, &[(requeue, 1)], 1_000_000)
            .await
            .unwrap(),
        0
    );
    // The next claim runs it again with a new epoch.
    let again = task_claim(&mut c, &claim("q", &["a"], 10)).await.unwrap();
    assert_eq!(again.tasks.len(), 1);
    assert_eq!((again.tasks[0].attempt, again.tasks[0].lease_epoch), (2, 3));
    assert!(
        task_reap_expired(&mut c, &["a"], 100, |_| None)
            .await
            .unwrap()
            .rows
            .is_empty()
    );
}

#[tokio::test]
async fn heartbeat_renews_held_leases_and_reports_cancel_requests() {
    let pool = fresh("heartbeat").await;
    let mut c = pool.acquire().await.unwrap();
    let a = insert(&mut c, task("q", "a")).await;
    let b = insert(&mut c, task("q", "a")).await;
    let short = ClaimRequest {
        lease_us: 1_000_000,
        ..claim("q", &["a"], 10)
    };
    task_claim(&mut c, &short).await.unwrap();
    let before = get(&mut c, a).await.lease_until.unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert_eq!(
        task_heartbeat(&mut c, &[(a, 1), (b, 1), (b, 7)], 60_000_000)
            .await
            .unwrap(),
        2
    );
    assert!(get(&mut c, a).await.lease_until.unwrap() > before + TimeDelta::seconds(50));

    assert!(task_request_cancel(&mut c, b).await.unwrap());
    let first = get(&mut c, b).await.updated_at;
    assert!(
        task_request_cancel(&mut c, b).await.unwrap(),
        "kept from the first request"
    );
    assert_eq!(
        task_heartbeat(&mut c, &[(a, 1), (b, 1)], 60_000_000)
            .await
            .unwrap(),
        1
    );
    let held = task_leases_held(&mut c, &[(a, 1), (b, 1), (a, 2)])
        .await
        .unwrap();
    assert_eq!(
        held,
        vec![
            HeldLease {
                id: a,
                epoch: 1,
                cancel_requested: false
            },
            HeldLease {
                id: b,
                epoch: 1,
                cancel_requested: true
            },
        ]
    );
    assert!(get(&mut c, b).await.updated_at >= first);
    assert_eq!(
        task_epochs(&mut c, &[a, b, 999]).await.unwrap(),
        vec![(a, 1), (b, 1)]
    );
    // A canceled write-back keeps the request; a success clears it.
    task_write_back(&mut c, &[finish(b, 1, "canceled")])
        .await
        .unwrap();
    assert_eq!(get(&mut c, b).await.state, "canceled");
}

#[tokio::test]
async fn release_gives_the_attempt_back() {
    let pool = fresh("release").await;
    let mut c = pool.acquire().await.unwrap();
    let a = insert(&mut c, task("q", "a")).await;
    task_claim(&mut c, &claim("q", &["a"], 1)).await.unwrap();
    assert_eq!(
        task_release(&mut c, &[(a, 0)]).await.unwrap(),
        0,
        "wrong epoch"
    );
    assert_eq!(task_release(&mut c, &[(a, 1)]).await.unwrap(), 1);
    let r = get(&mut c, a).await;
    assert_eq!(
        (r.state.as_str(), r.attempt, r.lease_epoch),
        ("pending", 0, 2)
    );
    assert!(r.worker_id.is_none() && r.lease_until.is_none());
    let again = task_claim(&mut c, &claim("q", &["a"], 1)).await.unwrap();
    assert_eq!((again.tasks[0].attempt, again.tasks[0].lease_epoch), (1, 3));
}

#[tokio::test]
async fn idempotency_keys_return_the_holder() {
    let pool = fresh("idempotency").await;
    let mut c = pool.acquire().await.unwrap();
    let keyed = |name| NewTask {
        idempotency_key: Some("k1"),
        ..task("q", name)
    };
    let first = task_insert(&mut c, &keyed("a")).await.unwrap();
    let Inserted::New(id) = first else {
        panic!("{first:?}")
    };
    assert_eq!(
        task_insert(&mut c, &keyed("a")).await.unwrap(),
        Inserted::Duplicate(id)
    );
    assert!(matches!(
        task_insert(&mut c, &keyed("b")).await.unwrap(),
        Inserted::New(_)
    ));
    assert_eq!(task_count(&mut c, &TaskFilter::default()).await.unwrap(), 2);
    // A key taken is reported before an identity taken.
    let both = NewTask {
        idempotency_key: Some("k1"),
        ..unique("a", &KEY_A, "pending")
    };
    assert_eq!(
        task_insert(&mut c, &both).await.unwrap(),
        Inserted::Duplicate(id)
    );
    assert_eq!(task_count(&mut c, &TaskFilter::default()).await.unwrap(), 2);
}

#[tokio::test]
async fn unique_while_pending_is_freed_by_the_claim() {
    let pool = fresh("unique_pending").await;
    let mut c = pool.acquire().await.unwrap();
    let a = insert(&mut c, unique("a", &KEY_A, "pending")).await;
    assert_eq!(
        task_insert(&mut c, &unique("a", &KEY_A, "pending"))
            .await
            .unwrap(),
        Inserted::Duplicate(a)
    );
    assert_eq!(
        task_count(&mut c, &TaskFilter::default()).await.unwrap(),
        1,
        "duplicate undone"
    );
    assert!(get(&mut c, a).await.unique_held);
    assert_eq!(get(&mut c, a).await.unique_key.unwrap(), "aa".repeat(32));
    task_claim(&mut c, &claim("q", &["a"], 1)).await.unwrap();
    assert!(!get(&mut c, a).await.unique_held);
    let b = insert(&mut c, unique("a", &KEY_A, "pending")).await;
    assert!(b > a);
    // The first task's outcome leaves the second's identity alone.
    task_write_back(&mut c, &[finish(a, 1, "dead")])
        .await
        .unwrap();
    assert!(get(&mut c, b).await.unique_held);
}

#[tokio::test]
async fn unique_while_running_is_kept_by_a_retry_and_freed_by_success_or_death() {
    let pool = fresh("unique_running").await;
    let mut c = pool.acquire().await.unwrap();
    let a = insert(&mut c, unique("a", &KEY_A, "running")).await;
    task_claim(&mut c, &claim("q", &["a"], 1)).await.unwrap();
    assert!(get(&mut c, a).await.unique_held, "held while running");
    task_write_back(&mut c, &[finish(a, 1, "pending")])
        .await
        .unwrap();
    assert!(get(&mut c, a).await.unique_held, "a retry keeps it");
    task_claim(&mut c, &claim("q", &["a"], 1)).await.unwrap();
    task_write_back(&mut c, &[finish(a, 2, "succeeded")])
        .await
        .unwrap();
    assert!(!get(&mut c, a).await.unique_held);

    // Death frees it; a manual retry takes it back, unless another task took it.
    let b = insert(&mut c, unique("a", &KEY_B, "running")).await;
    task_claim(&mut c, &claim("q", &["a"], 1)).await.unwrap();
    task_write_back(&mut c, &[finish(b, 1, "dead")])
        .await
        .unwrap();
    assert!(!get(&mut c, b).await.unique_held);
    let other = insert(&mut c, unique("a", &KEY_B, "running")).await;
    assert_eq!(
        task_retry_dead(&mut c, b).await.unwrap(),
        RetryDead::IdentityHeld(other)
    );
    assert_eq!(get(&mut c, b).await.state, "dead", "nothing changed");
    assert!(task_cancel(&mut c, other).await.unwrap());
    assert!(!get(&mut c, other).await.unique_held, "cancel frees it");
    assert_eq!(
        task_retry_dead(&mut c, b).await.unwrap(),
        RetryDead::Retried
    );
    let r = get(&mut c, b).await;
    assert_eq!(
        (r.state.as_str(), r.attempt, r.lease_epoch, r.unique_held),
        ("pending", 0, 2, true)
    );
    assert_eq!(
        task_retry_dead(&mut c, b).await.unwrap(),
        RetryDead::NotDead
    );
}

#[tokio::test]
async fn unique_window_survives_success_until_it_expires() {
    let pool = fresh("unique_window").await;
    let mut c = pool.acquire().await.unwrap();
    let now = db_clock_us(&mut c).await.unwrap();
    let window = |end| NewTask {
        unique_expires_us: Some(end),
        ..unique("a", &KEY_A, "window")
    };
    let a = insert(&mut c, window(now + 3_600_000_000)).await;
    task_claim(&mut c, &claim("q", &["a"], 1)).await.unwrap();
    task_write_back(&mut c, &[finish(a, 1, "succeeded")])
        .await
        .unwrap();
    assert!(get(&mut c, a).await.unique_held, "kept after success");
    assert_eq!(unique_prune_expired(&mut c, 10).await.unwrap(), 0);
    assert_eq!(
        task_insert(&mut c, &window(now)).await.unwrap(),
        Inserted::Duplicate(a)
    );
    // A window that has ended is pruned.
    let b = insert(
        &mut c,
        NewTask {
            unique_expires_us: Some(now - 1),
            ..unique("a", &KEY_B, "window")
        },
    )
    .await;
    assert_eq!(unique_prune_expired(&mut c, 10).await.unwrap(), 1);
    assert!(!get(&mut c, b).await.unique_held);
    assert!(get(&mut c, a).await.unique_held);
}

#[tokio::test]
async fn deadline_passed_expires_at_claim_and_frees_the_identity() {
    let pool = fresh("deadline").await;
    let mut c = pool.acquire().await.unwrap();
    let past = Some(Utc::now() - TimeDelta::seconds(10));
    let late = insert(
        &mut c,
        NewTask {
            deadline: past,
            ..unique("a", &KEY_A, "running")
        },
    )
    .await;
    let ttl = insert(
        &mut c,
        NewTask {
            ttl_us: Some(3_600_000_000),
            ..task("q", "a")
        },
    )
    .await;
    let got = task_claim(&mut c, &claim("q", &["a"], 10)).await.unwrap();
    assert_eq!(
        got.tasks.iter().map(|t| t.id).collect::<Vec<_>>(),
        vec![ttl]
    );
    assert_eq!(got.expired.len(), 1);
    assert_eq!(got.expired[0].id, late);
    assert!(
        got.expired[0].late_us >= 9_000_000,
        "{}",
        got.expired[0].late_us
    );
    let r = get(&mut c, late).await;
    assert_eq!(
        (r.state.as_str(), r.attempt, r.lease_epoch),
        ("expired", 0, 0)
    );
    assert!(r.finished_at.is_some() && !r.unique_held);
    let t = get(&mut c, ttl).await;
    assert_eq!(t.deadline.unwrap() - t.created_at, TimeDelta::hours(1));
}

#[tokio::test]
async fn enqueue_in_the_callers_transaction_commits_or_rolls_back_with_it() {
    let pool = fresh("transactional").await;
    let mut c = pool.acquire().await.unwrap();
    sqlx::query("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
        .execute(&mut *c)
        .await
        .unwrap();
    drop(c);
    let mut tx = begin_immediate(&pool).await.unwrap();
    sqlx::query("INSERT INTO orders (id) VALUES (1)")
        .execute(&mut *tx)
        .await
        .unwrap();
    insert(&mut tx, unique("a", &KEY_A, "pending")).await;
    tx.rollback().await.unwrap();
    let mut c = pool.acquire().await.unwrap();
    assert_eq!(task_count(&mut c, &TaskFilter::default()).await.unwrap(), 0);
    drop(c);

    let mut tx = begin_immediate(&pool).await.unwrap();
    sqlx::query("INSERT INTO orders (id) VALUES (1)")
        .execute(&mut *tx)
        .await
        .unwrap();
    let a = insert(&mut tx, unique("a", &KEY_A, "pending")).await;
    // A duplicate inside the same transaction undoes only its own insert.
    assert_eq!(
        task_insert(&mut tx, &unique("a", &KEY_A, "pending"))
            .await
            .unwrap(),
        Inserted::Duplicate(a)
    );
    tx.commit().await.unwrap();
    let mut c = pool.acquire().await.unwrap();
    assert_eq!(task_count(&mut c, &TaskFilter::default()).await.unwrap(), 1);
    assert!(get(&mut c, a).await.unique_held);
}

#[tokio::test]
async fn insert_many_keeps_row_order_and_bytes_and_handles_keyed_rows() {
    let pool = fresh("insert_many").await;
    let mut c = pool.acquire().await.unwrap();
    let payloads: Vec<Vec<u8>> = (0..1200u32)
        .map(|i| vec![(i % 256) as u8, 0, 0xff, 1])
        .collect();
    let names: Vec<String> = (0..1200).map(|i| format!("n{i}")).collect();
    let mut rows: Vec<NewTask<'_>> = (0..1200)
        .map(|i| NewTask {
            payload: &payloads[i],
            ..task("q", &names[i])
        })
        .collect();
    rows[700].idempotency_key = Some("k");
    let dup = NewTask {
        idempotency_key: Some("k"),
        ..task("q", "n700")
    };
    rows.push(dup);
    let out = task_insert_many(&mut c, &rows).await.unwrap();
    assert_eq!(out.len(), 1201);
    assert_eq!(out[1200], Inserted::Duplicate(out[700].id()));
    for (i, o) in out.iter().take(1200).enumerate() {
        let Inserted::New(id) = *o else {
            panic!("row {i}: {o:?}")
        };
        let r = get(&mut c, id).await;
        assert_eq!(
            (r.name.as_str(), &r.payload),
            (names[i].as_str(), &payloads[i]),
            "row {i}"
        );
    }
    assert_eq!(
        task_count(&mut c, &TaskFilter::default()).await.unwrap(),
        1200
    );
}

#[tokio::test]
async fn ids_are_never_reused_after_the_newest_rows_are_deleted() {
    let pool = fresh("autoincrement").await;
    let mut c = pool.acquire().await.unwrap();
    let a = insert(&mut c, task("q", "a")).await;
    task_cancel(&mut c, a).await.unwrap();
    assert_eq!(
        task_prune(&mut c, "canceled", 3600, 10).await.unwrap(),
        0,
        "not an hour old"
    );
    tokio::time::sleep(Duration::from_millis(2)).await;
    assert_eq!(task_prune(&mut c, "canceled", 0, 10).await.unwrap(), 1);
    let b = insert(&mut c, task("q", "a")).await;
    assert!(b > a, "{b} > {a}");
}

#[tokio::test]
async fn list_count_stats_and_pending_by_name() {
    let pool = fresh("inspect").await;
    let mut c = pool.acquire().await.unwrap();
    let mut ids = Vec::new();
    for (q, n) in [("q", "a"), ("q", "b"), ("r", "a"), ("q", "a")] {
        ids.push(insert(&mut c, task(q, n)).await);
    }
    insert(
        &mut c,
        NewTask {
            delay_us: 3_600_000_000,
            ..task("q", "a")
        },
    )
    .await;
    task_claim(&mut c, &claim("r", &["a"], 1)).await.unwrap();
    let f = TaskFilter {
        queue: Some("q"),
        state: Some("pending"),
        name: Some("a"),
    };
    assert_eq!(task_count(&mut c, &f).await.unwrap(), 3);
    let page1 = task_list(&mut c, &f, 0, i64::MAX, 2).await.unwrap();
    let page2 = task_list(&mut c, &f, page1[1].id, i64::MAX, 2)
        .await
        .unwrap();
    assert_eq!(
        page1.iter().map(|t| t.id).collect::<Vec<_>>(),
        vec![ids[0], ids[3]]
    );
    assert_eq!(page2.len(), 1);
    assert_eq!(
        task_state(&mut c, ids[2]).await.unwrap().as_deref(),
        Some("running")
    );
    assert_eq!(task_state(&mut c, 999).await.unwrap(), None);
    let stats = task_stats(&mut c).await.unwrap();
    let brief: Vec<(&str, &str, u64)> = stats
        .iter()
        .map(|s| (s.queue.as_str(), s.state.as_str(), s.count))
        .collect();
    assert_eq!(brief, vec![("q", "pending", 4), ("r", "running", 1)]);
    assert!(stats[1].earliest_lease_until.is_some() && stats[0].earliest_lease_until.is_none());
    let pending = task_pending_by_name(&mut c, Some("q")).await.unwrap();
    let brief: Vec<(&str, u64, u64)> = pending
        .iter()
        .map(|p| (p.name.as_str(), p.pending, p.due))
        .collect();
    assert_eq!(brief, vec![("a", 3, 2), ("b", 1, 1)]);
    assert!(
        task_reschedule(&mut c, ids[1], None, 3_600_000_000)
            .await
            .unwrap()
    );
    assert!(task_set_priority(&mut c, ids[0], -5).await.unwrap());
    assert!(
        !task_set_priority(&mut c, ids[2], -5).await.unwrap(),
        "running"
    );
    assert_eq!(get(&mut c, ids[0]).await.priority, -5);
    let at = Utc::now() + TimeDelta::days(1);
    assert!(task_reschedule(&mut c, ids[0], Some(at), 0).await.unwrap());
    assert_eq!(
        get(&mut c, ids[0]).await.run_at,
        at.with_timezone(&Utc).trunc_us()
    );
}

trait TruncUs {
    fn trunc_us(self) -> Self;
}
impl TruncUs for chrono::DateTime<Utc> {
    fn trunc_us(self) -> Self {
        time_from_us(time_to_us(self)).unwrap()
    }
}

#[tokio::test]
async fn bulk_operations_by_filter() {
    let pool = fresh("bulk").await;
    let mut c = pool.acquire().await.unwrap();
    let mut ids = Vec::new();
    for _ in 0..4 {
        ids.push(insert(&mut c, task("q", "a")).await);
    }
    let u = insert(
        &mut c,
        NewTask {
            max_attempts: 1,
            ..unique("a", &KEY_A, "running")
        },
    )
    .await;
    let f = TaskFilter {
        queue: Some("q"),
        name: Some("a"),
        ..TaskFilter::default()
    };
    assert_eq!(task_bulk_count(&mut c, "pending", &f, 0).await.unwrap(), 5);
    assert_eq!(
        task_bulk_count(&mut c, "pending", &f, 3_600_000_000)
            .await
            .unwrap(),
        0,
        "too young"
    );
    let listed = task_bulk_ids(&mut c, "pending", &f, 0, ids[0], 10)
        .await
        .unwrap();
    assert_eq!(
        listed,
        vec![(ids[1], false), (ids[2], false), (ids[3], false), (u, true)]
    );
    assert_eq!(
        task_cancel_batch(&mut c, &[ids[0], ids[1], 999])
            .await
            .unwrap(),
        2
    );
    // The rest run and die.
    task_claim(&mut c, &claim("q", &["a"], 10)).await.unwrap();
    assert_eq!(
        task_request_cancel_batch(&mut c, &[ids[2], ids[0]])
            .await
            .unwrap(),
        1
    );
    let deaths: Vec<WriteBack> = [ids[2], ids[3], u]
        .iter()
        .map(|&id| finish(id, 1, "dead"))
        .collect();
    task_write_back(&mut c, &deaths).await.unwrap();
    assert!(get(&mut c, ids[2]).await.last_error.is_none());
    let later = Utc::now() + TimeDelta::seconds(5);
    assert_eq!(
        task_dead_unique_ids(&mut c, Some("q"), later, 0, 10)
            .await
            .unwrap(),
        vec![u]
    );
    assert_eq!(
        task_retry_dead_ids(&mut c, &[ids[2], u]).await.unwrap(),
        1,
        "unique goes alone"
    );
    assert_eq!(
        task_retry_dead_batch(&mut c, None, later, 10)
            .await
            .unwrap(),
        1
    );
    assert_eq!(get(&mut c, ids[3]).await.state, "pending");
    assert_eq!(get(&mut c, u).await.state, "dead");
    let old = Utc::now() - TimeDelta::hours(1);
    assert_eq!(
        task_retry_dead_batch(&mut c, None, old, 10).await.unwrap(),
        0
    );
}

#[tokio::test]
async fn schedules_declare_and_fire_by_compare_and_set() {
    let pool = fresh("schedules").await;
    let mut c = pool.acquire().await.unwrap();
    let decl = ScheduleDecl {
        name: "nightly",
        task_name: "a",
        queue: "q",
        expression: "0 3 * * *",
        timezone: "UTC",
        missed_ticks: "latest",
        next_tick: Some(Utc::now() + TimeDelta::hours(3)),
    };
    schedule_declare(&mut c, &decl).await.unwrap();
    let st = schedule_states(&mut c, &["nightly", "other"])
        .await
        .unwrap();
    assert_eq!(st.len(), 1);
    let w0 = st[0].watermark;
    assert!((st[0].now - w0) < TimeDelta::seconds(2));
    // Declared again unchanged: the watermark stays.
    tokio::time::sleep(Duration::from_millis(3)).await;
    schedule_declare(&mut c, &decl).await.unwrap();
    assert_eq!(
        schedule_states(&mut c, &["nightly"]).await.unwrap()[0].watermark,
        w0
    );

    let tick = w0 + TimeDelta::seconds(1);
    let key = "cron:nightly:1";
    let fire = ScheduleFire {
        name: "nightly",
        expression: "0 3 * * *",
        timezone: "UTC",
        old_watermark: w0,
        new_watermark: tick,
        next_tick: Some(tick + TimeDelta::days(1)),
        worker_id: W,
        tasks: vec![NewTask {
            run_at: Some(tick),
            idempotency_key: Some(key),
            ..task("q", "a")
        }],
    };
    let ids = schedule_fire(&mut c, &fire)
        .await
        .unwrap()
        .expect("first step applies");
    assert_eq!(ids.len(), 1);
    assert_eq!(
        schedule_fire(&mut c, &fire).await.unwrap(),
        None,
        "the watermark moved"
    );
    assert_eq!(task_count(&mut c, &TaskFilter::default()).await.unwrap(), 1);
    let row = &schedule_list(&mut c).await.unwrap()[0];
    assert_eq!(
        (row.watermark, row.last_tick, row.last_worker_id.as_deref()),
        (tick, Some(tick), Some(W))
    );

    // A changed expression moves the watermark to now and stores the new next tick.
    let changed = ScheduleDecl {
        expression: "0 4 * * *",
        next_tick: None,
        ..decl
    };
    schedule_declare(&mut c, &changed).await.unwrap();
    let row = &schedule_list(&mut c).await.unwrap()[0];
    assert!(row.watermark >= tick && row.next_tick.is_none());
    assert_eq!(row.expression, "0 4 * * *");
    assert!(schedule_delete(&mut c, "nightly").await.unwrap());
    assert!(!schedule_delete(&mut c, "nightly").await.unwrap());
}

#[tokio::test]
async fn workers_register_beat_stop_and_are_pruned() {
    let pool = fresh("workers").await;
    let mut c = pool.acquire().await.unwrap();
    let row = WorkerRow {
        worker_id: W,
        host: "h",
        pid: 42,
        queues_json: r#"{"q":4}"#,
        concurrency: 4,
        lease_us: 30_000_000,
        heartbeat_us: 10_000_000,
        names_json: r#"["a"]"#,
    };
    worker_start(&mut c, &row).await.unwrap();
    insert(&mut c, task("q", "a")).await;
    task_claim(&mut c, &claim("q", &["a"], 1)).await.unwrap();
    worker_seen(&mut c, &row).await.unwrap();
    let list = worker_list(&mut c).await.unwrap();
    assert_eq!(list.len(), 1);
    assert!(list[0].alive() && list[0].stopped_at.is_none());
    assert_eq!(list[0].names.as_deref(), Some(r#"["a"]"#));
    assert!((0..1_000_000).contains(&list[0].seen_ago_us), "{list:?}");
    assert_eq!(
        (list[0].running, list[0].pid, list[0].lease_us),
        (1, 42, 30_000_000)
    );
    assert!(worker_stop(&mut c, W).await.unwrap());
    let stopped = worker_list(&mut c).await.unwrap()[0].clone();
    assert!(!stopped.alive() && stopped.stopped_at.is_some());
    tokio::time::sleep(Duration::from_millis(3)).await;
    worker_seen(&mut c, &row).await.unwrap();
    assert_eq!(
        worker_list(&mut c).await.unwrap()[0].last_seen_at,
        stopped.last_seen_at,
        "not revived"
    );
    worker_start(&mut c, &row).await.unwrap();
    assert!(
        worker_list(&mut c).await.unwrap()[0].alive(),
        "a restart revives it"
    );
    assert_eq!(worker_prune(&mut c, 3600, 10).await.unwrap(), 0);
    tokio::time::sleep(Duration::from_millis(3)).await;
    assert_eq!(worker_prune(&mut c, 0, 10).await.unwrap(), 1);
    assert!(worker_list(&mut c).await.unwrap().is_empty());
}

#[tokio::test]
async fn prune_deletes_only_old_terminal_rows_of_the_state() {
    let pool = fresh("prune").await;
    let mut c = pool.acquire().await.unwrap();
    let done = insert(&mut c, task("q", "a")).await;
    let pending = insert(&mut c, task("q", "b")).await;
    task_claim(&mut c, &claim("q", &["a"], 1)).await.unwrap();
    task_write_back(&mut c, &[finish(done, 1, "succeeded")])
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(3)).await;
    assert_eq!(task_prune(&mut c, "succeeded", 3600, 10).await.unwrap(), 0);
    assert_eq!(task_prune(&mut c, "dead", 0, 10).await.unwrap(), 0);
    assert_eq!(task_prune(&mut c, "succeeded", 0, 10).await.unwrap(), 1);
    assert!(task_get(&mut c, done).await.unwrap().is_none());
    assert!(task_get(&mut c, pending).await.unwrap().is_some());
}

#[tokio::test]
async fn a_writer_waits_for_another_connections_write_lock_within_the_busy_timeout() {
    let pool = fresh("busy").await;
    let mut tx = begin_immediate(&pool).await.unwrap();
    insert(&mut tx, task("q", "a")).await;
    let pool2 = pool.clone();
    let waiter = tokio::spawn(async move {
        let mut c = pool2.acquire().await.unwrap();
        let started = std::time::Instant::now();
        task_claim(&mut c, &claim("q", &["a"], 10)).await.unwrap();
        started.elapsed()
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    tx.commit().await.unwrap();
    let waited = waiter.await.unwrap();
    assert!(waited >= Duration::from_millis(150), "{waited:?}");
    let mut c = pool.acquire().await.unwrap();
    assert_eq!(
        task_count(
            &mut c,
            &TaskFilter {
                state: Some("running"),
                ..Default::default()
            }
        )
        .await
        .unwrap(),
        1
    );
}
