use std::time::Duration;

use sqlx::SqlitePool;
use taskq::{Data, ResultExt, TaskError};

/// Sends the welcome mail of one user. Idempotent: a user already welcomed is a success, so
/// running it twice (at-least-once delivery) sends one mail.
#[taskq::task(queue = "mail", max_attempts = 8, timeout = "30s")]
async fn send_welcome(user_id: i64, db: Data<SqlitePool>) -> Result<(), TaskError> {
    // A user that does not exist never will: a permanent error sends the task to `dead`.
    let email: String = sqlx::query_scalar("SELECT email FROM users WHERE id = ?")
        .bind(user_id)
        .fetch_one(&*db)
        .await
        .permanent()?;
    // Your mail API call goes here; any other error (`?`) is retried with backoff.
    println!("sending the welcome mail to {email}");
    sqlx::query(
        "UPDATE users SET welcomed_at = strftime('%Y-%m-%d %H:%M:%f', 'now')
         WHERE id = ? AND welcomed_at IS NULL",
    )
    .bind(user_id)
    .execute(&*db)
    .await?;
    Ok(())
}

/// Writes a user and its welcome task in one transaction: both or neither.
async fn sign_up(pool: &SqlitePool, email: &str) -> Result<i64, Box<dyn std::error::Error>> {
    // BEGIN IMMEDIATE: waits for the file's write lock now, not at the first write.
    let mut tx = taskq::sqlite::begin(pool).await?;
    let user_id: i64 = sqlx::query_scalar("INSERT INTO users (email) VALUES (?) RETURNING id")
        .bind(email)
        .fetch_one(&mut *tx)
        .await?;
    SendWelcome { user_id }.enqueue_tx(&mut tx).await?;
    tx.commit().await?;
    Ok(user_id)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Without a subscriber taskq logs nothing, failures included. RUST_LOG=debug shows more.
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();

    let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| "sqlite://welcome.db".into());
    // Creates the file if missing (WAL mode, a 5 s busy timeout); an error names the file.
    let pool = taskq::sqlite::connect(&url).await?;
    taskq::migrate(&pool).await?; // taskq's tables; safe at every start
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS users (
             id INTEGER PRIMARY KEY AUTOINCREMENT,
             email TEXT NOT NULL,
             welcomed_at TEXT NULL)",
    )
    .execute(&pool)
    .await?;

    let ids = [
        sign_up(&pool, "ada@example.com").await?,
        sign_up(&pool, "grace@example.com").await?,
    ];
    println!("signed up users {ids:?}");

    // A worker for every #[taskq::task] in this binary. A service runs it until SIGTERM with
    // `taskq::run_registered(pool).await?`; this program stops it once every user is welcomed.
    let report = taskq::Worker::builder(pool.clone())
        .register_all()
        .data(pool.clone()) // what `Data<SqlitePool>` receives
        .shutdown_signal(all_welcomed(pool.clone()))
        .build()?
        .run()
        .await?;
    println!("worker stopped: {} tasks succeeded", report.stats.succeeded);
    Ok(())
}

/// Completes once no user is waiting for the welcome mail.
async fn all_welcomed(pool: SqlitePool) {
    loop {
        let waiting: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM users WHERE welcomed_at IS NULL")
                .fetch_one(&pool)
                .await
                .unwrap_or(1);
        if waiting == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
