//! Test support for taskq: a fresh database per test on a real MySQL/MariaDB server.
//!
//! The server is `TASKQ_TEST_DATABASE_URL` when set (any database path is ignored), else the
//! local server at `mysql://root@127.0.0.1:3306`, started with
//! `start-stop-daemon --start --background --exec /usr/sbin/mariadbd` if it does not answer.
//! Each [`TestDb`] creates its own `taskq_t_<random>` database, applies taskq's migrations, and
//! drops it when dropped.
//!
//! With no server, tests skip: `TestDb::new_or_skip()` prints `SKIPPED mysql: <test>: no
//! server at <url> (...)` to stderr and returns `None`, and the test returns and passes. Set
//! `TASKQ_REQUIRE_MYSQL=1` (or `TASKQ_REQUIRE_PRIVATE_SERVER=1`, as CI does) to make that a
//! failure instead.

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

/// Whether a test without a server fails instead of skipping: `TASKQ_REQUIRE_MYSQL` or
/// `TASKQ_REQUIRE_PRIVATE_SERVER` is set (to anything, like the private-server check; CI sets
/// both to 1).
pub fn mysql_required() -> bool {
    ["TASKQ_REQUIRE_MYSQL", "TASKQ_REQUIRE_PRIVATE_SERVER"]
        .iter()
        .any(|v| std::env::var_os(v).is_some())
}

/// How long [`server_check`] waits for a local MariaDB it started itself.
const STARTED_SERVER_WAIT: Duration = Duration::from_secs(15);
/// How long it waits when a `mariadbd` process already exists but does not answer (it may be
/// starting, or be another network namespace's server).
const RUNNING_SERVER_WAIT: Duration = Duration::from_secs(3);
/// Bound of one connection attempt.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

async fn answers() -> bool {
    matches!(
        tokio::time::timeout(CONNECT_TIMEOUT, server_options().connect()).await,
        Ok(Ok(_))
    )
}

/// Whether the server answers, checked once per test binary (every test of the binary gets the
/// same answer). Without `TASKQ_TEST_DATABASE_URL` and no answer, it starts the local MariaDB
/// (`start-stop-daemon --start --background --exec /usr/sbin/mariadbd`) and waits for it, at
/// most [`STARTED_SERVER_WAIT`]; every wait is bounded, so no test hangs on a missing server.
fn server_check() -> &'static Result<(), String> {
    static CHECK: OnceLock<Result<(), String>> = OnceLock::new();
    CHECK.get_or_init(|| {
        // Its own thread and runtime: callers are on different tests' runtimes, and the
        // first caller blocks the others until the answer is known.
        std::thread::spawn(|| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime for the server check")
                .block_on(check_server())
        })
        .join()
        .expect("the server check does not panic")
    })
}

async fn check_server() -> Result<(), String> {
    if answers().await {
        return Ok(());
    }
    let mut wait = Duration::ZERO;
    let daemon = "/usr/sbin/mariadbd";
    if std::env::var_os("TASKQ_TEST_DATABASE_URL").is_none()
        && std::path::Path::new(daemon).exists()
    {
        let sss = |args: &[&str]| {
            std::process::Command::new("start-stop-daemon")
                .args(args)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        // Exit 0 from `--stop --test`: a mariadbd process exists (maybe still starting).
        wait = if sss(&["--stop", "--test", "--exec", daemon]) {
            RUNNING_SERVER_WAIT
        } else if sss(&["--start", "--background", "--exec", daemon]) {
            STARTED_SERVER_WAIT
        } else {
            Duration::ZERO
        };
    }
    let deadline = tokio::time::Instant::now() + wait;
    while tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        if answers().await {
            return Ok(());
        }
    }
    Err(format!(
        "no server at {} (set TASKQ_TEST_DATABASE_URL or install MariaDB)",
        server_url()
    ))
}

/// Whether the MySQL/MariaDB server answers; if not, prints
/// `SKIPPED mysql: <test>: no server at <url> (...)` to stderr and returns `false`, or panics
/// when [`mysql_required`]. For tests that need the server but no [`TestDb`]:
///
/// ```ignore
/// if !taskq_tests::mysql_or_skip() { return; }
/// ```
pub fn mysql_or_skip() -> bool {
    match server_check() {
        Ok(()) => true,
        Err(why) if mysql_required() => panic!(
            "{why}; TASKQ_REQUIRE_MYSQL / TASKQ_REQUIRE_PRIVATE_SERVER is set, so this fails \
             instead of skipping"
        ),
        Err(why) => {
            // libtest runs each test on its own thread, named after the test: one line per
            // test, however many databases it asks for.
            thread_local!(static REPORTED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) });
            if !REPORTED.replace(true) {
                let thread = std::thread::current();
                let test = thread.name().unwrap_or("?");
                // Written to stderr directly so libtest's output capture does not hide it.
                use std::io::Write as _;
                let _ = writeln!(std::io::stderr(), "SKIPPED mysql: {test}: {why}");
            }
            false
        }
    }
}

/// `Ok` when a socket connects to a listener on `127.0.0.1`; else why not (for a skip
/// message). A network namespace without `lo` up (`unshare -n`) has no usable loopback:
/// binding 127.0.0.1 still works there, connecting fails.
pub fn loopback_check() -> Result<(), String> {
    let reachable = std::net::TcpListener::bind("127.0.0.1:0").and_then(|listener| {
        let addr = listener.local_addr()?;
        std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2))
    });
    reachable.map(drop).map_err(|e| {
        format!(
            "no usable loopback interface (connecting to a listener on 127.0.0.1: {e}); in a \
             network namespace, run `ip link set lo up`"
        )
    })
}

/// Whether this machine has a usable loopback interface (a socket connects to a listener on
/// `127.0.0.1`);
/// if not, prints `SKIPPED loopback: <test>: ...` to stderr and returns `false`, or panics
/// when [`mysql_required`] (CI has a loopback). For tests that need 127.0.0.1 but no server:
/// a network namespace without `lo` up (`unshare -n`) has none, and connecting to a closed
/// local port there is "network unreachable", not "connection refused".
///
/// ```ignore
/// if !taskq_tests::loopback_or_skip() { return; }
/// ```
pub fn loopback_or_skip() -> bool {
    let Err(why) = loopback_check() else {
        return true;
    };
    if mysql_required() {
        panic!("{why}; TASKQ_REQUIRE_MYSQL / TASKQ_REQUIRE_PRIVATE_SERVER is set, so this fails");
    }
    let thread = std::thread::current();
    use std::io::Write as _;
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED loopback: {}: {why}",
        thread.name().unwrap_or("?")
    );
    false
}

/// A fresh database with taskq's schema, dropped when this value is dropped.
///
/// There is no constructor that panics without a server: every test starts with
///
/// ```ignore
/// let Some(db) = TestDb::new_or_skip().await else { return };
/// ```
///
/// which, on a machine with no MySQL/MariaDB server, prints one `SKIPPED mysql: ...` line and
/// passes (fails with `TASKQ_REQUIRE_MYSQL=1` or `TASKQ_REQUIRE_PRIVATE_SERVER=1`).
pub struct TestDb {
    /// Pool on the test database.
    pub pool: MySqlPool,
    /// The database name.
    pub name: String,
    /// Connect options of the test database.
    pub options: MySqlConnectOptions,
}

impl TestDb {
    /// A new database with taskq's migrations applied, or `None` when no server answers
    /// (see [`mysql_or_skip`]).
    pub async fn new_or_skip() -> Option<Self> {
        let db = Self::empty_or_skip().await?;
        taskq::migrate(&db.pool)
            .await
            .expect("taskq migrations apply");
        Some(db)
    }

    /// A new empty database without any migration, or `None` when no server answers (see
    /// [`mysql_or_skip`]).
    pub async fn empty_or_skip() -> Option<Self> {
        if !mysql_or_skip() {
            return None;
        }
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
        Some(Self {
            pool,
            name,
            options,
        })
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

/// SQL (MySQL and SQLite alike) for an event row's state, `'pending'`, `'delivered'` or
/// `'dead'`, over [`EVENTS_WITH_KEYS`]: derived as `EventState::of` derives it (a delivered
/// event's row is never written; its key's `done_seq` records delivery).
pub const EVENT_STATE: &str = "CASE WHEN e.dead_at IS NOT NULL THEN 'dead' \
     WHEN e.seq <= k.done_seq THEN 'delivered' ELSE 'pending' END";

/// `taskq_events e` joined to its key row `k`, for [`EVENT_STATE`].
pub const EVENTS_WITH_KEYS: &str =
    "taskq_events e JOIN taskq_event_keys k ON k.key_hash = e.key_hash";

pub mod backends;
pub mod bins;
pub mod brokers;
pub mod capture;
pub mod drivers;
pub mod galera;
pub mod nats_server;
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
    pub fn spawn(builder: taskq::worker::WorkerBuilder) -> Self {
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
pub fn fast_worker<B: taskq::Backend>(pool: &sqlx::Pool<B>) -> taskq::worker::WorkerBuilder {
    taskq::Worker::builder(pool.clone())
        .poll_interval(Duration::from_millis(10), Duration::from_millis(100))
        .reaper_interval(Duration::from_millis(100))
        .retention(taskq::worker::Retention::disabled())
        .shutdown_timeout(Duration::from_secs(5))
}
