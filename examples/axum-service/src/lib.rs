//! taskq inside an axum service.
//!
//! - `POST /signups {"email": ...}` inserts a user **and** enqueues its welcome mail in one
//!   transaction (commit = both, rollback = neither).
//! - The worker runs in the same process. The handler receives the database pool, a
//!   `reqwest::Client` and the mail API's address as injected [`Data`](taskq::Data): register
//!   any `Clone + Send + Sync` value with `WorkerBuilder::data`. Routes take axum's `State`,
//!   task handlers taskq's `Data`: the two names do not clash.
//! - The "mail provider" is a route of the same app (`POST /provider/messages`), so the example
//!   runs without anything else; it de-duplicates by `Idempotency-Key`, as real providers do.
//! - One shutdown signal stops both: axum stops accepting and drains requests, the worker stops
//!   claiming and finishes in-flight handlers (or releases them after its timeout).
//! - `GET /healthz` is the probe an orchestrator polls: `200` with the worker's
//!   [`HealthStatus`](taskq::worker::HealthStatus) as JSON while the worker runs and its last database
//!   round trip is recent, `503` (same body) otherwise.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use axum::{Json, Router};
use sqlx::MySqlPool;
use taskq::{Data, TaskContext, TaskError, Worker, worker::ShutdownReport, worker::WorkerHealth};
use tokio::sync::watch;

/// Where the mail API lives (injected into handlers next to the HTTP client).
#[derive(Clone, Debug)]
pub struct MailApi {
    /// Base URL, e.g. `http://127.0.0.1:3000/provider`.
    pub base_url: String,
}

/// The fake provider's mailbox: messages by idempotency key.
#[derive(Clone, Default)]
pub struct Outbox {
    /// Delivered messages, `key → (to, deliveries received for that key)`.
    pub messages: Arc<Mutex<BTreeMap<String, (String, u32)>>>,
}

/// Sends the welcome mail. At-least-once safe: the provider call carries an idempotency key,
/// so a retry after a crash between "sent" and "marked" cannot mail twice; `welcomed_at` then
/// records it.
#[taskq::task(queue = "mail", max_attempts = 5, timeout = "30s")]
pub async fn welcome_mail(
    user_id: i64,
    cx: TaskContext,
    db: Data<MySqlPool>,
    http: Data<reqwest::Client>,
    api: Data<MailApi>,
) -> Result<(), TaskError> {
    let user: Option<(String, Option<String>)> =
        sqlx::query_as("SELECT email, CAST(welcomed_at AS CHAR) FROM users WHERE id = ?")
            .bind(user_id)
            .fetch_optional(&*db)
            .await?;
    let Some((email, welcomed)) = user else {
        return Err(TaskError::permanent(std::io::Error::other(format!(
            "user {user_id} does not exist"
        ))));
    };
    if welcomed.is_some() {
        return Ok(()); // done by an earlier attempt
    }
    http.post(format!("{}/messages", api.base_url))
        .header("Idempotency-Key", format!("welcome-{user_id}"))
        .json(&serde_json::json!({ "to": email, "template": "welcome", "attempt": cx.attempt() }))
        .send()
        .await?
        .error_for_status()?; // 5xx/4xx: retried with backoff
    sqlx::query("UPDATE users SET welcomed_at = UTC_TIMESTAMP(6) WHERE id = ?")
        .bind(user_id)
        .execute(&*db)
        .await?;
    Ok(())
}

#[derive(serde::Deserialize)]
struct Signup {
    email: String,
}

async fn signup(
    State(app): State<App>,
    Json(body): Json<Signup>,
) -> Result<Json<serde_json::Value>, (StatusCode, String)> {
    let err = |e: &dyn std::fmt::Display| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string());
    let mut tx = app.pool.begin().await.map_err(|e| err(&e))?;
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
    taskq::worker::notify("mail"); // wake the in-process worker now
    Ok(Json(
        serde_json::json!({ "user_id": user_id, "task_id": task.id }),
    ))
}

#[derive(serde::Deserialize)]
struct Message {
    to: String,
}

/// The fake mail provider: accepts a message once per idempotency key.
async fn provider_messages(
    State(app): State<App>,
    headers: HeaderMap,
    Json(msg): Json<Message>,
) -> StatusCode {
    let Some(key) = headers.get("idempotency-key").and_then(|v| v.to_str().ok()) else {
        return StatusCode::BAD_REQUEST;
    };
    let mut messages = app.outbox.messages.lock().unwrap();
    messages.entry(key.to_owned()).or_insert((msg.to, 0)).1 += 1;
    StatusCode::ACCEPTED
}

/// The readiness probe: `200` when the in-process worker is ready (running, and its last
/// database round trip is younger than its lease), `503` otherwise; the body is the worker's
/// health as JSON either way, e.g.
/// `{"worker_id":"web-1-4242-0a1b","phase":"running","live":true,"ready":true,
/// "last_db_ok_ms_ago":112,"max_db_age_ms":30000}`.
async fn healthz(
    State(health): State<WorkerHealth>,
) -> (StatusCode, Json<taskq::worker::HealthStatus>) {
    let status = health.status();
    let code = if status.ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, Json(status))
}

/// The probe route alone, `GET /healthz`, for `health` (take it with [`Worker::health`]
/// before running the worker); merge it into the service's router.
pub fn health_routes(health: WorkerHealth) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .with_state(health)
}

#[derive(Clone)]
struct App {
    pool: MySqlPool,
    outbox: Outbox,
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
    outbox: Outbox,
    listener: tokio::net::TcpListener,
    shutdown: watch::Receiver<bool>,
) -> Result<ShutdownReport, Box<dyn std::error::Error + Send + Sync>> {
    let wait = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    let api = MailApi {
        base_url: format!("http://{}/provider", listener.local_addr()?),
    };
    let worker = Worker::builder(pool.clone())
        .register::<WelcomeMail>()
        .data(pool.clone())
        .data(
            reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()?,
        )
        .data(api)
        .shutdown_timeout(Duration::from_secs(10))
        .shutdown_signal(wait(shutdown.clone()))
        .build()?;
    // Taken before `run`: a cheap handle the probe route reads.
    let health = worker.health();
    let worker = tokio::spawn(worker.run());
    let app = Router::new()
        .route("/signups", post(signup))
        .route("/provider/messages", post(provider_messages))
        .with_state(App { pool, outbox })
        .merge(health_routes(health));
    axum::serve(listener, app)
        .with_graceful_shutdown(wait(shutdown))
        .await?;
    Ok(worker.await??)
}

/// The Rust snippets of README.md, docs/macro.md and docs/operations.md, compiled and run as
/// doctests of this crate, which has every dependency they use (docs/getting-started.md is the
/// `example-getting-started` crate itself).
#[cfg(doctest)]
pub mod doc_snippets {
    #[doc = include_str!("../../../README.md")]
    pub struct Readme;
    #[doc = include_str!("../../../docs/macro.md")]
    pub struct MacroGuide;
    #[doc = include_str!("../../../docs/operations.md")]
    pub struct Operations;
}
