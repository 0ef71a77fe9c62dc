//! SQLite's own behaviour, against a real database file: migrations serialized across pools
//! (WAL, STRICT tables with CHECKs), the clock's millisecond resolution, an enqueue in the
//! caller's `BEGIN IMMEDIATE` transaction (a duplicate undoes only its own insert, by a
//! savepoint), a batch insert larger than one statement's parameters, `AUTOINCREMENT` ids, and
//! a writer waiting for another connection's write lock. What both drivers must do is the
//! driver suite's (`taskq-drivertest`, run on both by `tests/driver.rs`); the statement tests
//! that repeated it were removed (docs/design.md, "The driver test suite").

use std::time::Duration;

use chrono::{TimeDelta, Utc};
use taskq_driver::rows::{Inserted, NewTask, TaskFilter};
use taskq_driver::state::{TaskId, TaskState};

use super::{claim, db_path, fresh, get, id_of, insert, task};
use crate::clock::{db_clock_us, db_now, time_to_us};
use crate::connect::begin_immediate;
use crate::enqueue::{task_insert, task_insert_many};
use crate::lease::task_claim;
use crate::tasks::*;
use crate::{migrate, migrator, open};

const KEY_A: [u8; 32] = [0xaa; 32];

fn unique<'a>(name: &'a str, key: &'a [u8], while_: &'static str) -> NewTask<'a> {
    NewTask {
        unique_key: Some(key),
        unique_while: Some(while_),
        ..task("q", name)
    }
}

#[tokio::test]
async fn migrate_is_idempotent_and_serialized_across_pools() {
    let path = db_path("migrate");
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
        Inserted::Duplicate(TaskId(a))
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
    assert_eq!(out[1200], Inserted::Duplicate(TaskId(id_of(out[700]))));
    for (i, o) in out.iter().take(1200).enumerate() {
        let Inserted::New(id) = *o else {
            panic!("row {i}: {o:?}")
        };
        let r = get(&mut c, id.0).await;
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
    task_cancel(&mut c, TaskId(a)).await.unwrap();
    assert_eq!(
        task_prune(&mut c, TaskState::Canceled, 3600, 10)
            .await
            .unwrap(),
        0,
        "not an hour old"
    );
    tokio::time::sleep(Duration::from_millis(2)).await;
    assert_eq!(
        task_prune(&mut c, TaskState::Canceled, 0, 10)
            .await
            .unwrap(),
        1
    );
    let b = insert(&mut c, task("q", "a")).await;
    assert!(b > a, "{b} > {a}");
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
                state: Some(TaskState::Running),
                ..Default::default()
            }
        )
        .await
        .unwrap(),
        1
    );
}
