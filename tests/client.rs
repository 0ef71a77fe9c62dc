//! `Client`: status, list/count, cancel and retry of dead tasks.

use taskq::{Client, Error, ListFilter, Task, TaskContext, TaskError, TaskId, TaskState};
use taskq_tests::TestDb;

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Ping(u32);

impl Task for Ping {
    const NAME: &'static str = "ping";
    async fn run(self, _cx: TaskContext) -> Result<(), TaskError> {
        Ok(())
    }
}

async fn set_state(db: &TestDb, id: TaskId, state: &str) {
    sqlx::query("UPDATE taskq_tasks SET state = ?, finished_at = UTC_TIMESTAMP(6) WHERE id = ?")
        .bind(state)
        .bind(id.0)
        .execute(&db.pool)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_only_touches_pending_tasks() {
    let db = TestDb::new().await;
    let client = Client::new(db.pool.clone());
    let a = Ping(1).enqueue(&db.pool).await.unwrap().id;
    client.cancel(a).await.unwrap();
    let info = client.get(a).await.unwrap();
    assert_eq!(info.state, TaskState::Canceled);
    assert!(info.finished_at.is_some());

    let b = Ping(2).enqueue(&db.pool).await.unwrap().id;
    set_state(&db, b, "running").await;
    match client.cancel(b).await {
        Err(Error::WrongState {
            id,
            state: TaskState::Running,
            expected: "pending",
        }) => assert_eq!(id, b),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        client.cancel(a).await,
        Err(Error::WrongState {
            state: TaskState::Canceled,
            ..
        })
    ));
    assert!(matches!(
        client.cancel(TaskId(999_999)).await,
        Err(Error::NotFound(TaskId(999_999)))
    ));
    assert!(matches!(
        client.get(TaskId(999_999)).await,
        Err(Error::NotFound(_))
    ));
    assert_eq!(client.get(b).await.unwrap().state, TaskState::Running);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_and_count_filter_by_queue_state_and_name() {
    let db = TestDb::new().await;
    let client = Client::new(db.pool.clone());
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(Ping(i).enqueue(&db.pool).await.unwrap().id);
    }
    for i in 0..3 {
        Ping(i)
            .enqueue_options()
            .queue("other")
            .enqueue(&db.pool)
            .await
            .unwrap();
    }
    set_state(&db, ids[0], "dead").await;
    let all = ListFilter::default();
    assert_eq!(client.count(&all).await.unwrap(), 8);
    let default_pending = ListFilter {
        queue: Some("default".into()),
        state: Some(TaskState::Pending),
        ..Default::default()
    };
    assert_eq!(client.count(&default_pending).await.unwrap(), 4);
    let page1 = client
        .list(&ListFilter {
            limit: Some(2),
            ..default_pending.clone()
        })
        .await
        .unwrap();
    assert_eq!(page1.iter().map(|t| t.id).collect::<Vec<_>>(), ids[1..3]);
    let page2 = client
        .list(&ListFilter {
            after_id: Some(page1[1].id),
            ..default_pending.clone()
        })
        .await
        .unwrap();
    assert_eq!(page2.iter().map(|t| t.id).collect::<Vec<_>>(), ids[3..5]);
    let by_name = ListFilter {
        name: Some("nope".into()),
        ..Default::default()
    };
    assert_eq!(client.count(&by_name).await.unwrap(), 0);
    let stats = client.stats().await.unwrap();
    let get = |q: &str, s: TaskState| {
        stats
            .iter()
            .find(|x| x.queue == q && x.state == s)
            .map(|x| x.count)
    };
    assert_eq!(get("default", TaskState::Pending), Some(4));
    assert_eq!(get("default", TaskState::Dead), Some(1));
    assert_eq!(get("other", TaskState::Pending), Some(3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_dead_resets_attempts_and_bumps_the_epoch() {
    let db = TestDb::new().await;
    let client = Client::new(db.pool.clone());
    let id = Ping(1).enqueue(&db.pool).await.unwrap().id;
    assert!(matches!(
        client.retry_dead(id).await,
        Err(Error::WrongState {
            expected: "dead",
            ..
        })
    ));
    sqlx::query(
        "UPDATE taskq_tasks SET state = 'dead', attempt = 20, lease_epoch = 20 WHERE id = ?",
    )
    .bind(id.0)
    .execute(&db.pool)
    .await
    .unwrap();
    client.retry_dead(id).await.unwrap();
    let info = client.get(id).await.unwrap();
    assert_eq!(
        (info.state, info.attempt, info.lease_epoch),
        (TaskState::Pending, 0, 21)
    );
    assert!(info.finished_at.is_none());
}
