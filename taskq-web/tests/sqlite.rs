//! The dashboard and its API on a SQLite database (taskq's `sqlite` feature): the same
//! router over a `SqlitePool`, every page answering, an operator action and the API reading
//! and writing the SQLite file.

mod support;

use axum::Router;
use axum::http::Method;
use axum::http::StatusCode;
use sqlx::Sqlite;
use support::{Cred, Resp, TOKEN, send};
use taskq::{Task, TaskContext, TaskError, TaskState};
use taskq_tests::backends::TestBackend;
use taskq_web::Dashboard;

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Mail {
    to: String,
}

impl Task for Mail {
    const NAME: &'static str = "sqlite_web_mail";
    const QUEUE: &'static str = "mail";
    const MAX_ATTEMPTS: u32 = 1;
    async fn run(self, _cx: TaskContext) -> Result<(), TaskError> {
        Err(TaskError::msg("gateway down"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_reads_and_acts_on_a_sqlite_database() {
    let db = <Sqlite as TestBackend>::create()
        .await
        .expect("SQLite needs no server");
    let router = Dashboard::builder(db.pool.clone())
        .bearer_token(TOKEN)
        .build()
        .expect("valid configuration")
        .router();
    let app = Http { router };
    let mut tx = db.begin().await;
    let ids: Vec<u64> = taskq::enqueue::enqueue_many(
        &mut tx,
        (0..3).map(|i| Mail {
            to: format!("user{i}@example.com"),
        }),
    )
    .await
    .unwrap()
    .into_iter()
    .map(|e| e.id.0)
    .collect();
    tx.commit().await.unwrap();
    // One task runs and dies (max_attempts = 1).
    let w = taskq_tests::RunningWorker::spawn(
        db.worker()
            .register::<Mail>()
            .queue("mail", 1)
            .claim_batch(1),
    );
    taskq_tests::wait_until(
        std::time::Duration::from_secs(20),
        "a dead task",
        || async { db.count("state = 'dead'").await >= 1 },
    )
    .await;
    w.stop().await;
    let dead = db
        .scalar("SELECT MIN(id) FROM taskq_tasks WHERE state = 'dead'")
        .await as u64;
    assert!(ids.contains(&dead));

    for page in [
        "/",
        "/tasks",
        "/tasks?state=dead",
        "/api/v1/queues",
        "/api/v1/tasks",
    ] {
        let r = app.get(page).await;
        assert_eq!(r.status, StatusCode::OK, "{page}: {}", r.body);
    }
    let overview = app.get("/").await.body;
    assert!(overview.contains("mail"), "the overview names the queue");
    let task = app.get(&format!("/tasks/{dead}")).await.body;
    assert!(
        task.contains("gateway down"),
        "the task page shows the error"
    );
    assert!(task.contains("user"), "and the payload");

    // Retry it from the dashboard: pending again, audited with the actor.
    let r = app.post_form(&format!("/tasks/{dead}/retry"), &[]).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
    let info = db.client().get(taskq::TaskId(dead)).await.unwrap();
    assert_eq!(info.state, TaskState::Pending);
    let trail = db
        .client()
        .audit(&taskq::client::AuditFilter {
            task: Some(taskq::TaskId(dead)),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        (trail[0].actor.as_str(), trail[0].action.as_str()),
        ("web:token", "retry")
    );

    // The API counts the queue's tasks from the SQLite file.
    let queues = app.get("/api/v1/queues").await.json();
    let text = queues.to_string();
    assert!(text.contains("\"mail\""), "{text}");
    let paused = app
        .api_post("/api/v1/queues/mail/pause", serde_json::json!({}))
        .await;
    assert!(paused.status.is_success(), "{}", paused.body);
    assert_eq!(
        db.scalar(
            "SELECT COUNT(*) FROM taskq_queues WHERE queue = 'mail' AND paused_at IS NOT NULL"
        )
        .await,
        1
    );
}

/// Requests through the router with the bearer token (the MySQL tests' `App`, without its
/// MySQL database).
struct Http {
    router: Router,
}

impl Http {
    async fn get(&self, path: &str) -> Resp {
        send(
            &self.router,
            Method::GET,
            path,
            Cred::Bearer(TOKEN),
            &[],
            None,
        )
        .await
    }

    async fn post_form(&self, path: &str, fields: &[(&str, &str)]) -> Resp {
        support::post_form(&self.router, &["/"], path, fields).await
    }

    async fn api_post(&self, path: &str, body: serde_json::Value) -> Resp {
        send(
            &self.router,
            Method::POST,
            path,
            Cred::Bearer(TOKEN),
            &[],
            Some(("application/json", body.to_string())),
        )
        .await
    }
}
