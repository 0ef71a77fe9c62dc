//! Test support for taskq: a fresh database per test on a real MySQL/MariaDB server.
//!
//! The server is `TASKQ_TEST_DATABASE_URL` when set (any database path is ignored), else the
//! local server at `mysql://root@127.0.0.1:3306`, started with
//! `start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd` if it does not
//! answer. Each [`TestDb`] creates its own `taskq_t_<random>` database, applies taskq's
//! migrations, and drops it when dropped.

use std::str::FromStr;
use std::sync::OnceLock;
use std::time::Duration;

use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
use sqlx::{ConnectOptions, Connection, MySqlPool};

/// Default server when `TASKQ_TEST_DATABASE_URL` is not set.
pub const DEFAULT_SERVER_URL: &str = "mysql://root@127.0.0.1:3306";

/// The server URL tests use (without a database).
pub fn server_url() -> String {
    std::env::var("TASKQ_TEST_DATABASE_URL").unwrap_or_else(|_| DEFAULT_SERVER_URL.to_owned())
}

fn server_options() -> MySqlConnectOptions {
    MySqlConnectOptions::from_str(&server_url())
        .expect("TASKQ_TEST_DATABASE_URL is a valid mysql:// URL")
        .database("")
        .disable_statement_logging()
}

/// Makes sure the server answers, starting the local MariaDB once if needed.
async fn ensure_server() {
    static STARTED: OnceLock<()> = OnceLock::new();
    if server_options().connect().await.is_ok() {
        return;
    }
    if std::env::var_os("TASKQ_TEST_DATABASE_URL").is_none() && STARTED.set(()).is_ok() {
        let _ = std::process::Command::new("start-stop-daemon")
            .args([
                "--start",
                "--oknodo",
                "--background",
                "--exec",
                "/usr/sbin/mariadbd",
            ])
            .status();
    }
    for _ in 0..100 {
        if server_options().connect().await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!(
        "no MySQL/MariaDB server answers at {} (set TASKQ_TEST_DATABASE_URL)",
        server_url()
    );
}

/// A fresh database with taskq's schema, dropped when this value is dropped.
pub struct TestDb {
    /// Pool on the test database.
    pub pool: MySqlPool,
    /// The database name.
    pub name: String,
    /// Connect options of the test database.
    pub options: MySqlConnectOptions,
}

impl TestDb {
    /// A new empty database with taskq's migrations applied.
    pub async fn new() -> Self {
        let db = Self::empty().await;
        taskq::migrate(&db.pool)
            .await
            .expect("taskq migrations apply");
        db
    }

    /// A new empty database without any migration.
    pub async fn empty() -> Self {
        ensure_server().await;
        let name = format!("taskq_t_{:016x}", fastrand::u64(..));
        let mut admin = server_options()
            .connect()
            .await
            .expect("connect to the test server");
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE `{name}`")))
            .execute(&mut admin)
            .await
            .expect("create test database");
        admin.close().await.ok();
        let options = server_options().database(&name);
        let pool = MySqlPoolOptions::new()
            .max_connections(32)
            .connect_with(options.clone())
            .await
            .expect("connect to the test database");
        Self {
            pool,
            name,
            options,
        }
    }

    /// A pool on the same database with its own settings.
    pub async fn pool_with(&self, max: u32) -> MySqlPool {
        MySqlPoolOptions::new()
            .max_connections(max)
            .connect_with(self.options.clone())
            .await
            .expect("connect to the test database")
    }

    /// `SELECT COUNT(*) FROM taskq_tasks WHERE <cond>`.
    pub async fn count(&self, cond: &str) -> i64 {
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT COUNT(*) FROM taskq_tasks WHERE {cond}"
        )))
        .fetch_one(&self.pool)
        .await
        .expect("count query")
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let name = self.name.clone();
        // Drop the database on a separate thread with its own runtime: Drop cannot await.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            if let Ok(rt) = rt {
                rt.block_on(async {
                    if let Ok(mut c) = server_options().connect().await {
                        // A panicking test may leave a transaction open in its pool (the
                        // pool is dropped after this): do not wait for its locks forever.
                        let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                            "SET SESSION lock_wait_timeout = 5; DROP DATABASE IF EXISTS `{name}`"
                        )))
                        .execute(&mut c)
                        .await;
                    }
                });
            }
        })
        .join();
    }
}

pub mod galera;
pub mod proxy;
pub mod server;

/// A worker running in the background of a test, stopped by [`RunningWorker::stop`].
pub struct RunningWorker {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    handle: tokio::task::JoinHandle<taskq::Result<taskq::worker::ShutdownReport>>,
    /// Live counters.
    pub stats: std::sync::Arc<taskq::worker::WorkerStats>,
    /// The worker id.
    pub id: String,
}

impl RunningWorker {
    /// Builds `builder` with a shutdown signal and spawns it.
    pub fn spawn(builder: taskq::WorkerBuilder) -> Self {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let worker = builder
            .shutdown_signal(async move {
                let _ = rx.await;
            })
            .build()
            .expect("worker configuration is valid");
        let stats = worker.stats();
        let id = worker.id().to_owned();
        Self {
            stop: Some(tx),
            handle: tokio::spawn(worker.run()),
            stats,
            id,
        }
    }

    /// Signals shutdown and waits for the report.
    pub async fn stop(mut self) -> taskq::worker::ShutdownReport {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        (&mut self.handle)
            .await
            .expect("worker task did not panic")
            .expect("worker returned Ok")
    }
}

/// Polls `cond` every 20 ms until it is true; panics with `what` after `timeout`.
pub async fn wait_until<F, Fut>(timeout: Duration, what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if cond().await {
            return;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting for: {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A worker builder with test-friendly intervals (fast polling, short reaper, no retention).
pub fn fast_worker(pool: &MySqlPool) -> taskq::WorkerBuilder {
    taskq::Worker::builder(pool.clone())
        .poll_interval(Duration::from_millis(10), Duration::from_millis(100))
        .reaper_interval(Duration::from_millis(100))
        .retention(taskq::worker::Retention::disabled())
        .shutdown_timeout(Duration::from_secs(5))
}
