//! taskq inside an axum service.
//!
//! - `POST /signups {"email": ...}` inserts a user **and** enqueues its welcome mail in one
//!   transaction (commit = both, rollback = neither).
//! - The worker runs in the same process; handlers receive the pool and an HTTP-client-like
//!   `Mailer` as injected [`State`](taskq::State) (register any `Clone + Send + Sync` value with
//!   `WorkerBuilder::state`, e.g. a `reqwest::Client`).
//! - One shutdown signal stops both: axum stops accepting and drains requests, the worker stops
//!   claiming, finishes in-flight handlers (or releases them after its timeout).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State as AxumState;
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use sqlx::MySqlPool;
use taskq::{ShutdownReport, State, TaskContext, TaskError, Worker};
use tokio::sync::watch;

/// Stand-in for an HTTP client (a `reqwest::Client` is registered the same way): it records
/// what it "sent" so the example and its test can see it.
#[derive(Clone, Default)]
pub struct Mailer {
    /// Messages sent, as `(to, task attempt)`.
    pub sent: Arc<Mutex<Vec<(String, u32)>>>,
}

/// Sends the welcome mail once per user (idempotent: `welcomed_at` is set in the same step).
#[taskq::task(queue = "mail", max_attempts = 5)]
pub async fn welcome_mail(
    user_id: i64,
    cx: TaskContext,
    db: State<MySqlPool>,
    mailer: State<Mailer>,
) -> Result<(), TaskError> {
    let claimed = sqlx::query(
        "UPDATE users SET welcomed_at = UTC_TIMESTAMP(6) WHERE id = ? AND welcomed_at IS NULL",
    )
    .bind(user_id)
    .execute(&*db)
    .await?;
    if claimed.rows_affected() == 1 {
        let email: String = sqlx::query_scalar("SELECT email FROM users WHERE id = ?")
            .bind(user_id)
            .fetch_one(&*db)
            .await?;
        mailer.sent.lock().unwrap().push((email, cx.attempt()));
    }
    Ok(())
}

#[derive(serde::Deserialize)]
struct Signup {
    email: String,
}

async fn signup(
    AxumState(pool): AxumState<MySqlPool>,
    Json(body): Json<Signup>,
) -> Result<Json<serde_json::Value>, (StatusCode, String)> {
    let err = |e: &dyn std::fmt::Display| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string());
    let mut tx = pool.begin().await.map_err(|e| err(&e))?;
    let user = sqlx::query("INSERT INTO users (email) VALUES (?)")
        .bind(&body.email)
        .execute(&mut *tx)
        .await
        .map_err(|e| err(&e))?;
    let user_id = user.last_insert_id() as i64;
    let task = WelcomeMail { user_id }
        .enqueue_tx(&mut tx)
        .await
        .map_err(|e| err(&e))?;
    tx.commit().await.map_err(|e| err(&e))?;
    taskq::notify("mail"); // wake the in-process worker now
    Ok(Json(
        serde_json::json!({ "user_id": user_id, "task_id": task.id }),
    ))
}

/// Creates the example's table (taskq's own tables come from `taskq::migrate`).
pub async fn setup(pool: &MySqlPool) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    taskq::migrate(pool).await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS users (id BIGINT AUTO_INCREMENT PRIMARY KEY,
           email VARCHAR(255) NOT NULL, welcomed_at DATETIME(6) NULL)",
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Serves on `listener` and runs the worker until `shutdown` becomes true; returns the
/// worker's shutdown report after both have stopped.
pub async fn serve(
    pool: MySqlPool,
    mailer: Mailer,
    listener: tokio::net::TcpListener,
    shutdown: watch::Receiver<bool>,
) -> Result<ShutdownReport, Box<dyn std::error::Error + Send + Sync>> {
    let wait = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    let worker = Worker::builder(pool.clone())
        .register::<WelcomeMail>()
        .state(pool.clone())
        .state(mailer)
        .shutdown_timeout(Duration::from_secs(10))
        .shutdown_signal(wait(shutdown.clone()))
        .build()?;
    let worker = tokio::spawn(worker.run());
    let app = Router::new()
        .route("/signups", post(signup))
        .with_state(pool);
    axum::serve(listener, app)
        .with_graceful_shutdown(wait(shutdown))
        .await?;
    Ok(worker.await??)
}
