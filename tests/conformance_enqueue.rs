//! The producer path on every backend: the task commits and rolls back with the caller's
//! transaction.

use taskq::{Client, Task, TaskContext, TaskError, TaskState};
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

async fn commit_makes_business_row_and_task_visible_together<B: TestBackend>(db: Db<B>) {
    db.exec("CREATE TABLE orders (id BIGINT PRIMARY KEY, total INT NOT NULL)")
        .await;
    let mut tx = db.begin().await;
    db.exec_in(&mut tx, "INSERT INTO orders VALUES (1, 100)")
        .await;
    let out = note("order 1").enqueue_tx(&mut tx).await.unwrap();
    assert!(!out.duplicate);
    tx.commit().await.unwrap();
    assert_eq!(db.scalar("SELECT COUNT(*) FROM orders").await, 1);
    let info = Client::new(db.pool.clone()).get(out.id).await.unwrap();
    assert_eq!(info.state, TaskState::Pending);
    assert_eq!((info.queue.as_str(), info.name.as_str()), ("notes", "note"));
    assert_eq!((info.max_attempts, info.priority, info.attempt), (7, 3, 0));
    assert_eq!(
        serde_json::from_value::<Note>(info.payload_json().unwrap()).unwrap(),
        note("order 1")
    );
}

async fn rollback_leaves_neither_row<B: TestBackend>(db: Db<B>) {
    db.exec("CREATE TABLE orders (id BIGINT PRIMARY KEY, total INT NOT NULL)")
        .await;
    let mut tx = db.begin().await;
    db.exec_in(&mut tx, "INSERT INTO orders VALUES (1, 100)")
        .await;
    note("order 1").enqueue_tx(&mut tx).await.unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(db.scalar("SELECT COUNT(*) FROM orders").await, 0);
    assert_eq!(db.count("1 = 1").await, 0);
}

taskq_tests::conformance!(
    commit_makes_business_row_and_task_visible_together,
    rollback_leaves_neither_row,
);
