//! Producer API against a real database: transactional enqueue, options, idempotency and
//! input validation.

use std::collections::HashMap;
use std::time::Duration;

use taskq::{Client, Error, Task, TaskContext, TaskError, TaskState};
use taskq_tests::backends::{Db, TestBackend};

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct Note {
    text: String,
}

impl Task for Note {
    const NAME: &'static str = "note";
    const QUEUE: &'static str = "notes";
    const MAX_ATTEMPTS: u32 = 7;
    const PRIORITY: i16 = 3;
    async fn run(self, _cx: TaskContext) -> Result<(), TaskError> {
        Ok(())
    }
}

fn note(text: &str) -> Note {
    Note { text: text.into() }
}

async fn business_table<B: TestBackend>(db: &Db<B>) {
    db.exec("CREATE TABLE orders (id BIGINT PRIMARY KEY, total INT NOT NULL)")
        .await;
}

async fn count_orders<B: TestBackend>(db: &Db<B>) -> i64 {
    db.scalar("SELECT COUNT(*) FROM orders").await
}

async fn commit_makes_business_row_and_task_visible_together<B: TestBackend>(db: Db<B>) {
    business_table(&db).await;
    let mut tx = db.begin().await;
    db.exec_in(&mut tx, "INSERT INTO orders VALUES (1, 100)")
        .await;
    let out = note("order 1").enqueue_tx(&mut tx).await.unwrap();
    assert!(!out.duplicate);
    // Not visible to others before commit (SQLite: WAL readers see the last commit).
    assert_eq!(db.count("1=1").await, 0);
    assert_eq!(count_orders(&db).await, 0);
    tx.commit().await.unwrap();
    assert_eq!(count_orders(&db).await, 1);
    let info = Client::new(db.pool.clone()).get(out.id).await.unwrap();
    assert_eq!(info.state, TaskState::Pending);
    assert_eq!((info.queue.as_str(), info.name.as_str()), ("notes", "note"));
    assert_eq!((info.max_attempts, info.priority, info.attempt), (7, 3, 0));
    assert_eq!(info.lease_epoch, 0);
    assert_eq!(
        serde_json::from_value::<Note>(info.payload_json().unwrap()).unwrap(),
        note("order 1")
    );
}

async fn rollback_leaves_neither_row<B: TestBackend>(db: Db<B>) {
    business_table(&db).await;
    let mut tx = db.begin().await;
    db.exec_in(&mut tx, "INSERT INTO orders VALUES (1, 100)")
        .await;
    note("x").enqueue_tx(&mut tx).await.unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(count_orders(&db).await, 0);
    assert_eq!(db.count("1=1").await, 0);

    // Dropping the transaction without commit is a rollback too.
    {
        let mut tx = db.begin().await;
        note("y").enqueue_tx(&mut tx).await.unwrap();
    }
    assert_eq!(db.count("1=1").await, 0);
}

async fn a_thousand_mixed_transactions_leave_exactly_the_committed_tasks<B: TestBackend>(
    db: Db<B>,
) {
    business_table(&db).await;
    let mut committed = 0i64;
    let mut handles = Vec::new();
    // Eight writers at once: on SQLite they take turns on the write lock, so they wait for it
    // as long as they need (the tests' 1 s busy timeout is for a lock held by a stalled test).
    let writers = B::pool_with_busy_timeout(&db, Duration::from_secs(60));
    for worker in 0..8i64 {
        let pool = writers.clone();
        handles.push(tokio::spawn(async move {
            let mut committed = 0i64;
            let mut rng = fastrand::Rng::with_seed(worker as u64);
            for i in 0..125i64 {
                let id = worker * 1000 + i;
                let mut tx = B::begin(&pool).await;
                B::exec_in(&mut tx, &format!("INSERT INTO orders VALUES ({id}, 1)")).await;
                Note {
                    text: id.to_string(),
                }
                .enqueue_tx(&mut tx)
                .await
                .unwrap();
                match rng.u8(0..3) {
                    0 => tx.rollback().await.unwrap(),
                    1 => drop(tx), // an error after the enqueue: implicit rollback
                    _ => {
                        tx.commit().await.unwrap();
                        committed += 1;
                    }
                }
            }
            committed
        }));
    }
    for h in handles {
        committed += h.await.unwrap();
    }
    assert!(committed > 200 && committed < 800, "{committed}");
    assert_eq!(count_orders(&db).await, committed);
    assert_eq!(db.count("1=1").await, committed);
    // Zero orphans either way: every task has its order and every order its task.
    let orphans = db
        .scalar(&format!(
            "SELECT COUNT(*) FROM taskq_tasks t LEFT JOIN orders o
               ON CAST(o.id AS CHAR(20)) = {}
             WHERE o.id IS NULL",
            db.json_text("t.payload", "$.text")
        ))
        .await;
    assert_eq!(orphans, 0);
}

async fn enqueue_works_on_pool_connections_and_plain_connections<B: TestBackend>(db: Db<B>) {
    let a = note("pool").enqueue(&db.pool).await.unwrap();
    let mut conn = db.pool.acquire().await.unwrap();
    let b = note("pooled conn").enqueue_tx(&mut conn).await.unwrap();
    let c = note("conn").enqueue_tx(&mut *conn).await.unwrap();
    assert!(a.id < b.id && b.id < c.id);
    assert_eq!(db.count("state = 'pending'").await, 3);
}

async fn options_land_in_the_row<B: TestBackend>(db: Db<B>) {
    let client = Client::new(db.pool.clone());
    let delayed = note("d")
        .enqueue_options()
        .with_delay(Duration::from_secs(3600))
        .with_priority(-5)
        .with_queue("other")
        .with_max_attempts(2)
        .enqueue(&db.pool)
        .await
        .unwrap();
    let info = client.get(delayed.id).await.unwrap();
    assert_eq!(
        (info.priority, info.queue.as_str(), info.max_attempts),
        (-5, "other", 2)
    );
    let wait = info.run_at - info.created_at;
    assert!(
        wait >= chrono::Duration::seconds(3599) && wait <= chrono::Duration::seconds(3601),
        "{wait}"
    );

    let at = chrono::DateTime::parse_from_rfc3339("2030-01-02T03:04:05.123456Z")
        .unwrap()
        .to_utc();
    let scheduled = note("s")
        .enqueue_options()
        .with_run_at(at)
        .enqueue(&db.pool)
        .await
        .unwrap();
    assert_eq!(client.get(scheduled.id).await.unwrap().run_at, at);
}

async fn duplicate_idempotency_key_returns_the_existing_task<B: TestBackend>(db: Db<B>) {
    let first = note("a")
        .enqueue_options()
        .with_idempotency_key("k1")
        .enqueue(&db.pool)
        .await
        .unwrap();
    let mut tx = db.begin().await;
    let again = note("b")
        .enqueue_options()
        .with_idempotency_key("k1")
        .enqueue_tx(&mut tx)
        .await
        .unwrap();
    // The failed insert does not poison the caller's transaction.
    let other = note("c")
        .enqueue_options()
        .with_idempotency_key("k2")
        .enqueue_tx(&mut tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert!(!first.duplicate && again.duplicate && !other.duplicate);
    assert_eq!(again.id, first.id);
    assert_eq!(db.count("1=1").await, 2);
    // The stored payload is the first one's.
    let info = Client::new(db.pool.clone()).get(first.id).await.unwrap();
    assert_eq!(info.payload_json().unwrap()["text"], "a");
    // No key never dedupes.
    note("x").enqueue(&db.pool).await.unwrap();
    note("x").enqueue(&db.pool).await.unwrap();
    assert_eq!(db.count("idempotency_key IS NULL").await, 2);
}

async fn concurrent_duplicates_insert_one_row<B: TestBackend>(db: Db<B>) {
    for round in 0..5 {
        let key = format!("race-{round}");
        let mut handles = Vec::new();
        for i in 0..12 {
            let pool = db.pool.clone();
            let key = key.clone();
            handles.push(tokio::spawn(async move {
                let mut tx = B::begin(&pool).await;
                let out = Note {
                    text: i.to_string(),
                }
                .enqueue_options()
                .with_idempotency_key(key)
                .enqueue_tx(&mut tx)
                .await
                .unwrap();
                tokio::time::sleep(Duration::from_millis(5)).await;
                tx.commit().await.unwrap();
                out
            }));
        }
        let mut outs = Vec::new();
        for h in handles {
            outs.push(h.await.unwrap());
        }
        assert_eq!(outs.iter().filter(|o| !o.duplicate).count(), 1);
        assert!(outs.iter().all(|o| o.id == outs[0].id));
        assert_eq!(db.count(&format!("idempotency_key = '{key}'")).await, 1);
    }
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Unserializable {
    map: HashMap<(u8, u8), u8>,
}
impl Task for Unserializable {
    const NAME: &'static str = "unserializable";
    async fn run(self, _cx: TaskContext) -> Result<(), TaskError> {
        Ok(())
    }
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct LongName;
impl Task for LongName {
    const NAME: &'static str = "a_task_name_that_is_far_too_long_a_task_name_that_is_far_too_long_a_task_name_that_is_far_too_long_a_task_name_that_is_far_too_long_a_task_name_that_is_far_too_long_a_task_name_that_is_far_too_long_a_task_name_that_is_far_too_long_a_task_name_that_is_far_too_long_";
    async fn run(self, _cx: TaskContext) -> Result<(), TaskError> {
        Ok(())
    }
}

async fn bad_input_is_a_typed_error_and_writes_nothing<B: TestBackend>(db: Db<B>) {
    let p = &db.pool;
    let e = note("x")
        .enqueue_options()
        .with_queue("")
        .enqueue(p)
        .await
        .unwrap_err();
    assert!(matches!(e, Error::InvalidName { what: "queue", .. }), "{e}");
    let e = note("x")
        .enqueue_options()
        .with_queue("q".repeat(65))
        .enqueue(p)
        .await
        .unwrap_err();
    assert!(matches!(e, Error::InvalidName { what: "queue", .. }), "{e}");
    let e = note("x")
        .enqueue_options()
        .with_queue("a\tb")
        .enqueue(p)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("control characters"), "{e}");
    let e = LongName.enqueue(p).await.unwrap_err();
    assert!(
        matches!(
            e,
            Error::InvalidName {
                what: "task name",
                ..
            }
        ),
        "{e}"
    );
    let e = note("x")
        .enqueue_options()
        .with_idempotency_key("")
        .enqueue(p)
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::InvalidName {
                what: "idempotency key",
                ..
            }
        ),
        "{e}"
    );
    let big = Note {
        text: "x".repeat(2000),
    };
    let e = big
        .clone()
        .enqueue_options()
        .with_payload_limit(1000)
        .enqueue(p)
        .await
        .unwrap_err();
    assert!(
        matches!(e, Error::PayloadTooLarge { limit: 1000, .. }),
        "{e}"
    );
    let e = big
        .enqueue_options()
        .with_payload_limit(1000)
        .enqueue(p)
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains("exceeds the limit of 1000 bytes"),
        "{e}"
    );
    let e = note("x")
        .enqueue_options()
        .with_delay(Duration::from_secs(u64::MAX / 4))
        .enqueue(p)
        .await
        .unwrap_err();
    assert!(matches!(e, Error::InvalidSchedule(_)), "{e}");
    let e = note("x")
        .enqueue_options()
        .with_run_at(chrono::DateTime::from_timestamp(253_402_300_000, 0).unwrap())
        .enqueue(p)
        .await
        .unwrap_err();
    assert!(matches!(e, Error::InvalidSchedule(_)), "{e}");
    let e = note("x")
        .enqueue_options()
        .with_max_attempts(0)
        .enqueue(p)
        .await
        .unwrap_err();
    assert!(matches!(e, Error::InvalidOption(_)), "{e}");
    let mut map = HashMap::new();
    map.insert((1, 2), 3);
    let mut tx = db.begin().await;
    let e = Unserializable { map }
        .enqueue_tx(&mut tx)
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Serialize(_)), "{e}");
    tx.commit().await.unwrap();
    assert_eq!(db.count("1=1").await, 0);
}

async fn payload_at_the_limit_is_accepted<B: TestBackend>(db: Db<B>) {
    // {"text":"..."} is 11 bytes of framing.
    let exact = Note {
        text: "x".repeat(989),
    };
    let out = exact
        .enqueue_options()
        .with_payload_limit(1000)
        .enqueue(&db.pool)
        .await
        .unwrap();
    let info = Client::new(db.pool.clone()).get(out.id).await.unwrap();
    assert_eq!(info.payload.len(), 1000);
}

taskq_tests::conformance!(
    commit_makes_business_row_and_task_visible_together,
    rollback_leaves_neither_row,
    a_thousand_mixed_transactions_leave_exactly_the_committed_tasks,
    enqueue_works_on_pool_connections_and_plain_connections,
    options_land_in_the_row,
    duplicate_idempotency_key_returns_the_existing_task,
    concurrent_duplicates_insert_one_row,
    bad_input_is_a_typed_error_and_writes_nothing,
    payload_at_the_limit_is_accepted,
);
