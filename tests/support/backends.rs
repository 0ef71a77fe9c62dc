//! The conformance harness: one behaviour test, written once, run on every backend.
//!
//! A test is an `async fn name<B: TestBackend>(db: Db<B>)` that uses only what both backends
//! share: `db.pool` (a `sqlx::Pool<B>`, so `pool.begin()`, `enqueue_tx(&mut tx)`,
//! `Worker::builder(pool)` and `Client::new(pool)` infer the backend), and the raw helpers of
//! [`Db`] for assertions on rows. [`conformance!`](crate::conformance) turns a list of such
//! functions into `name::mysql` and `name::sqlite` tests, the way River runs one driver test
//! suite over each of its drivers.
//!
//! MySQL databases come from [`TestDb`](crate::TestDb) (skipped, with a `SKIPPED mysql:` line,
//! when no server answers); SQLite databases are fresh files in the temp directory, deleted
//! when the [`Db`] is dropped. Both have taskq's migrations applied.

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use sqlx::{MySql, Pool, Sqlite};

use crate::TestDb;

/// A backend the conformance tests run on.
pub trait TestBackend: taskq::Backend + Sized {
    /// `"mysql"` or `"sqlite"`.
    const LABEL: &'static str;

    /// What keeps the database alive (and removes it when dropped).
    type Guard: Send + Sync + 'static;

    /// A fresh database with taskq's schema, or `None` when this backend is not available
    /// here (the reason printed as a `SKIPPED` line).
    fn create() -> impl Future<Output = Option<Db<Self>>> + Send;

    /// A second pool on the same database (another "process").
    fn another_pool(db: &Db<Self>, max: u32) -> impl Future<Output = Pool<Self>> + Send;

    /// Runs `sql` and returns the rows it changed.
    fn exec(pool: &Pool<Self>, sql: &str) -> impl Future<Output = u64> + Send;

    /// Runs a query returning one integer.
    fn scalar(pool: &Pool<Self>, sql: &str) -> impl Future<Output = i64> + Send;

    /// Runs `sql` on a connection (a transaction's) and returns the rows it changed.
    fn exec_in<'c>(
        conn: &'c mut Self::Connection,
        sql: &'c str,
    ) -> impl Future<Output = u64> + Send + 'c;

    /// Begins a transaction meant to write (SQLite: `BEGIN IMMEDIATE`, see
    /// `taskq::sqlite::begin`).
    fn begin(pool: &Pool<Self>) -> impl Future<Output = sqlx::Transaction<'static, Self>> + Send;
}

/// A database of backend `B` for one test.
pub struct Db<B: TestBackend> {
    /// A pool on it.
    pub pool: Pool<B>,
    _guard: B::Guard,
}

impl<B: TestBackend> Db<B> {
    /// `"mysql"` or `"sqlite"`.
    pub fn label(&self) -> &'static str {
        B::LABEL
    }

    /// `SELECT COUNT(*) FROM taskq_tasks WHERE <cond>`.
    pub async fn count(&self, cond: &str) -> i64 {
        B::scalar(
            &self.pool,
            &format!("SELECT COUNT(*) FROM taskq_tasks WHERE {cond}"),
        )
        .await
    }

    /// Runs a query returning one integer.
    pub async fn scalar(&self, sql: &str) -> i64 {
        B::scalar(&self.pool, sql).await
    }

    /// Runs `sql` and returns the rows it changed.
    pub async fn exec(&self, sql: &str) -> u64 {
        B::exec(&self.pool, sql).await
    }

    /// Runs `sql` on a transaction's connection (`&mut *tx`) and returns the rows it changed.
    pub async fn exec_in(&self, conn: &mut B::Connection, sql: &str) -> u64 {
        B::exec_in(conn, sql).await
    }

    /// Begins a transaction meant to write (SQLite: `BEGIN IMMEDIATE`).
    pub async fn begin(&self) -> sqlx::Transaction<'static, B> {
        B::begin(&self.pool).await
    }

    /// A second pool on the same database.
    pub async fn another_pool(&self, max: u32) -> Pool<B> {
        B::another_pool(self, max).await
    }

    /// A client on this database.
    pub fn client(&self) -> taskq::Client {
        taskq::Client::new(self.pool.clone())
    }

    /// A worker builder with the test-friendly intervals of [`fast_worker`](crate::fast_worker).
    pub fn worker(&self) -> taskq::WorkerBuilder {
        crate::fast_worker(&self.pool)
    }
}

impl TestBackend for MySql {
    const LABEL: &'static str = "mysql";
    type Guard = TestDb;

    async fn create() -> Option<Db<Self>> {
        let db = TestDb::new_or_skip().await?;
        Some(Db {
            pool: db.pool.clone(),
            _guard: db,
        })
    }

    async fn another_pool(db: &Db<Self>, max: u32) -> Pool<Self> {
        db._guard.pool_with(max).await
    }

    async fn exec(pool: &Pool<Self>, sql: &str) -> u64 {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
            .execute(pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
            .rows_affected()
    }

    async fn scalar(pool: &Pool<Self>, sql: &str) -> i64 {
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
            .fetch_one(pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    async fn exec_in(conn: &mut Self::Connection, sql: &str) -> u64 {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
            .execute(conn)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
            .rows_affected()
    }

    async fn begin(pool: &Pool<Self>) -> sqlx::Transaction<'static, Self> {
        pool.begin().await.expect("begin")
    }
}

/// A SQLite database file, deleted (with its WAL and shared-memory files) when dropped.
pub struct SqliteFile {
    /// Its path.
    pub path: PathBuf,
}

impl SqliteFile {
    /// A fresh path in the temp directory (no file yet).
    pub fn new() -> Self {
        let path = std::env::temp_dir().join(format!("taskq-t-{:016x}.db", fastrand::u64(..)));
        Self { path }
    }
}

impl Default for SqliteFile {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for SqliteFile {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm"] {
            let mut p = self.path.clone().into_os_string();
            p.push(suffix);
            let _ = std::fs::remove_file(p);
        }
    }
}

impl TestBackend for Sqlite {
    const LABEL: &'static str = "sqlite";
    type Guard = SqliteFile;

    async fn create() -> Option<Db<Self>> {
        let file = SqliteFile::new();
        let pool = taskq::sqlite::open(&file.path)
            .await
            .expect("open a SQLite file in the temp directory");
        taskq::migrate(&pool)
            .await
            .expect("taskq migrations apply on SQLite");
        Some(Db { pool, _guard: file })
    }

    async fn another_pool(db: &Db<Self>, max: u32) -> Pool<Self> {
        sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(max)
            .connect_with(taskq::sqlite::tune(
                sqlx::sqlite::SqliteConnectOptions::new().filename(&db._guard.path),
            ))
            .await
            .expect("open the test's SQLite file")
    }

    async fn exec(pool: &Pool<Self>, sql: &str) -> u64 {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
            .execute(pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
            .rows_affected()
    }

    async fn scalar(pool: &Pool<Self>, sql: &str) -> i64 {
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
            .fetch_one(pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    async fn exec_in(conn: &mut Self::Connection, sql: &str) -> u64 {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
            .execute(conn)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
            .rows_affected()
    }

    async fn begin(pool: &Pool<Self>) -> sqlx::Transaction<'static, Self> {
        taskq::sqlite::begin(pool).await.expect("begin immediate")
    }
}

/// How long conformance tests wait for a worker by default.
pub const WAIT: Duration = Duration::from_secs(20);

/// Runs each listed `async fn name<B: TestBackend>(db: Db<B>)` as two tests, `name::mysql`
/// and `name::sqlite`, each on a fresh database of its backend.
///
/// ```ignore
/// async fn commit_makes_the_task_visible<B: TestBackend>(db: Db<B>) { .. }
/// taskq_tests::conformance!(commit_makes_the_task_visible);
/// ```
#[macro_export]
macro_rules! conformance {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn mysql() {
                if let Some(db) = <sqlx::MySql as $crate::backends::TestBackend>::create().await {
                    super::$name(db).await;
                }
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                if let Some(db) = <sqlx::Sqlite as $crate::backends::TestBackend>::create().await {
                    super::$name(db).await;
                }
            }
        }
    )*};
}
