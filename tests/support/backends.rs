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
//!
//! Raw SQL in a test stays in the two dialects' common subset; what differs goes through a
//! [`Db`] helper instead of a branch in the test: times ([`Db::now`], [`Db::ago`],
//! [`Db::from_now`], [`Db::set_ago`], [`Db::backdate`], [`Db::shift_times`],
//! [`Db::server_now`], [`Db::time`]: MySQL `DATETIME(6)` from `UTC_TIMESTAMP(6)`, SQLite µs
//! from the view `taskq_clock`), JSON ([`Db::json_text`]), binary literals ([`blob`]), reads
//! ([`Db::scalar`], [`Db::ints`], [`Db::text`], [`Db::strings`], [`Db::blobs`], [`Db::rows`])
//! and the schema ([`Db::tables`], [`TestBackend::taskq_migrator`]). A test that is
//! InnoDB/MySQL-specific stays a plain `#[tokio::test]` in the same file, with a comment
//! saying why, and may wrap its [`TestDb`](crate::TestDb) in [`Db::from_test_db`] to share
//! the file's helpers.

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use sqlx::{MySql, Pool, Sqlite};

use crate::TestDb;

/// A backend the conformance tests run on.
pub trait TestBackend:
    taskq::Backend<Connection: taskq::enqueue::AsConnection<Database = Self>> + Sized
{
    /// `"mysql"` or `"sqlite"`.
    const LABEL: &'static str;

    /// What keeps the database alive (and removes it when dropped).
    type Guard: Send + Sync + 'static;

    /// A fresh database with taskq's schema, or `None` when this backend is not available
    /// here (the reason printed as a `SKIPPED` line).
    fn create() -> impl Future<Output = Option<Db<Self>>> + Send;

    /// A fresh database without any table, or `None` like [`create`](Self::create).
    fn create_empty() -> impl Future<Output = Option<Db<Self>>> + Send;

    /// taskq's migrator for this backend.
    fn taskq_migrator() -> sqlx::migrate::Migrator;

    /// Runs `migrator` (all of it, or up to `target` included) on `pool`.
    fn run_migrator<'a>(
        migrator: &'a sqlx::migrate::Migrator,
        pool: &'a Pool<Self>,
        target: Option<i64>,
    ) -> impl Future<Output = Result<(), sqlx::migrate::MigrateError>> + Send + 'a;

    /// The names of the database's tables, sorted (SQLite's own `sqlite_*` tables left out).
    fn tables(pool: &Pool<Self>) -> impl Future<Output = Vec<String>> + Send;

    /// A URL another process can open the database with (`mysql://…` or `sqlite://…`).
    fn url(db: &Db<Self>) -> String;

    /// A second pool on the same database (another "process").
    fn another_pool(db: &Db<Self>, max: u32) -> impl Future<Output = Pool<Self>> + Send;

    /// [`another_pool`](Self::another_pool) whose SQLite busy timeout is `busy` (MySQL has
    /// none): for producers that contend for SQLite's write lock with relays or workers and
    /// must not fail on a busy machine.
    fn another_pool_with_busy_timeout(
        db: &Db<Self>,
        max: u32,
        busy: Duration,
    ) -> impl Future<Output = Pool<Self>> + Send;

    /// On SQLite a pool on the same file whose busy timeout is `busy` (opened lazily); on
    /// MySQL the test's pool (no busy timeout there).
    fn pool_with_busy_timeout(db: &Db<Self>, busy: Duration) -> Pool<Self>;

    /// Runs `sql` and returns the rows it changed.
    fn exec(pool: &Pool<Self>, sql: &str) -> impl Future<Output = u64> + Send;

    /// Runs a query returning one integer.
    fn scalar(pool: &Pool<Self>, sql: &str) -> impl Future<Output = i64> + Send;

    /// Runs `sql` on a connection (a transaction's) and returns the rows it changed.
    fn exec_in<'c>(
        conn: &'c mut Self::Connection,
        sql: &'c str,
    ) -> impl Future<Output = u64> + Send + 'c;

    /// Runs a query returning one integer on a connection (a transaction's).
    fn scalar_in<'c>(
        conn: &'c mut Self::Connection,
        sql: &'c str,
    ) -> impl Future<Output = i64> + Send + 'c;

    /// Begins a transaction meant to write (SQLite: `BEGIN IMMEDIATE`, see
    /// `taskq::sqlite::begin`).
    fn begin(pool: &Pool<Self>) -> impl Future<Output = sqlx::Transaction<'static, Self>> + Send;

    /// SQL for the database clock's now, in the type of taskq's time columns (MySQL:
    /// `UTC_TIMESTAMP(6)`, a `DATETIME(6)`; SQLite: µs since the Unix epoch from the view
    /// `taskq_clock`).
    const NOW: &'static str;

    /// SQL for the time `expr` (a time column or [`NOW`](Self::NOW)) moved by `us`
    /// microseconds (negative: earlier).
    fn shift_sql(expr: &str, us: i64) -> String;

    /// SQL for the text at JSON `path` of `expr`, a JSON column or the (binary) payload.
    fn json_text_sql(expr: &str, path: &str) -> String;

    /// Runs a query returning one time (one of taskq's time columns, or NULL).
    fn time(
        pool: &Pool<Self>,
        sql: &str,
    ) -> impl Future<Output = Option<chrono::DateTime<chrono::Utc>>> + Send;

    /// Runs a query returning one text value (or NULL).
    fn text(pool: &Pool<Self>, sql: &str) -> impl Future<Output = Option<String>> + Send;

    /// SQL for the text of `parts` (SQL expressions) joined by `|`.
    fn concat_sql(parts: &[&str]) -> String;

    /// Runs a query returning one text column, all rows.
    fn strings(pool: &Pool<Self>, sql: &str) -> impl Future<Output = Vec<String>> + Send;

    /// Runs a query returning one binary column (e.g. the payload), all rows.
    fn blobs(pool: &Pool<Self>, sql: &str) -> impl Future<Output = Vec<Vec<u8>>> + Send;

    /// Runs a query returning one integer column, all rows.
    fn ints(pool: &Pool<Self>, sql: &str) -> impl Future<Output = Vec<i64>> + Send;
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

    /// Runs a query returning one integer on a connection (a transaction's).
    pub async fn scalar_in(&self, conn: &mut B::Connection, sql: &str) -> i64 {
        B::scalar_in(conn, sql).await
    }

    /// Begins a transaction meant to write (SQLite: `BEGIN IMMEDIATE`).
    pub async fn begin(&self) -> sqlx::Transaction<'static, B> {
        B::begin(&self.pool).await
    }

    /// SQL for the database clock's now (see [`TestBackend::NOW`]).
    pub fn now(&self) -> &'static str {
        B::NOW
    }

    /// SQL for the database clock's now minus `d`.
    pub fn ago(&self, d: Duration) -> String {
        B::shift_sql(B::NOW, -micros(d))
    }

    /// SQL for the database clock's now plus `d`.
    pub fn from_now(&self, d: Duration) -> String {
        B::shift_sql(B::NOW, micros(d))
    }

    /// SQL for the text at JSON `path` of `expr` (a JSON column or the payload).
    pub fn json_text(&self, expr: &str, path: &str) -> String {
        B::json_text_sql(expr, path)
    }

    /// Moves the time columns `cols` of `table`'s rows matching `cond` by `us` microseconds
    /// (negative: into the past) and returns the rows changed. NULL times stay NULL.
    pub async fn shift_times(&self, table: &str, cond: &str, cols: &[&str], us: i64) -> u64 {
        let set = cols
            .iter()
            .map(|c| format!("{c} = {}", B::shift_sql(c, us)))
            .collect::<Vec<_>>()
            .join(", ");
        self.exec(&format!("UPDATE {table} SET {set} WHERE {cond}"))
            .await
    }

    /// Moves the time columns `cols` of the tasks matching `cond` `d` into the past.
    pub async fn backdate(&self, cond: &str, cols: &[&str], d: Duration) -> u64 {
        self.shift_times("taskq_tasks", cond, cols, -micros(d))
            .await
    }

    /// Sets the time column `col` of the tasks matching `cond` to now minus `d`.
    pub async fn set_ago(&self, cond: &str, col: &str, d: Duration) -> u64 {
        self.exec(&format!(
            "UPDATE taskq_tasks SET {col} = {} WHERE {cond}",
            self.ago(d)
        ))
        .await
    }

    /// The database clock's now.
    pub async fn server_now(&self) -> chrono::DateTime<chrono::Utc> {
        self.time(&format!("SELECT {}", B::NOW))
            .await
            .expect("now is not NULL")
    }

    /// Runs a query returning one time (or NULL).
    pub async fn time(&self, sql: &str) -> Option<chrono::DateTime<chrono::Utc>> {
        B::time(&self.pool, sql).await
    }

    /// Runs a query returning one text value (or NULL).
    pub async fn text(&self, sql: &str) -> Option<String> {
        B::text(&self.pool, sql).await
    }

    /// Runs `SELECT <parts joined by '|'> <rest>` (`rest`: `FROM ... WHERE ... ORDER BY ...`)
    /// and returns each row's parts as text, e.g.
    /// `db.rows(&["name", "state", "COUNT(*)"], "FROM taskq_tasks GROUP BY name, state")`.
    pub async fn rows(&self, parts: &[&str], rest: &str) -> Vec<Vec<String>> {
        let sql = format!("SELECT {} {rest}", B::concat_sql(parts));
        B::strings(&self.pool, &sql)
            .await
            .into_iter()
            .map(|r| r.split('|').map(str::to_owned).collect())
            .collect()
    }

    /// Runs a query returning one text column, all rows.
    pub async fn strings(&self, sql: &str) -> Vec<String> {
        B::strings(&self.pool, sql).await
    }

    /// Runs a query returning one binary column (e.g. the payload), all rows.
    pub async fn blobs(&self, sql: &str) -> Vec<Vec<u8>> {
        B::blobs(&self.pool, sql).await
    }

    /// Runs a query returning one integer column, all rows.
    pub async fn ints(&self, sql: &str) -> Vec<i64> {
        B::ints(&self.pool, sql).await
    }

    /// The names of the database's tables, sorted (SQLite's own `sqlite_*` tables left out).
    pub async fn tables(&self) -> Vec<String> {
        B::tables(&self.pool).await
    }

    /// Runs `migrator` (all of it, or up to `target` included) on this database.
    pub async fn run_migrator(
        &self,
        migrator: &sqlx::migrate::Migrator,
        target: Option<i64>,
    ) -> Result<(), sqlx::migrate::MigrateError> {
        B::run_migrator(migrator, &self.pool, target).await
    }

    /// A URL another process can open the database with (`mysql://…` or `sqlite://…`).
    pub fn url(&self) -> String {
        B::url(self)
    }

    /// A second pool on the same database.
    pub async fn another_pool(&self, max: u32) -> Pool<B> {
        B::another_pool(self, max).await
    }

    /// A second pool on the same database whose SQLite busy timeout is `busy`.
    pub async fn another_pool_with_busy_timeout(&self, max: u32, busy: Duration) -> Pool<B> {
        B::another_pool_with_busy_timeout(self, max, busy).await
    }

    /// A client on this database.
    pub fn client(&self) -> taskq::Client {
        taskq::Client::new(self.pool.clone())
    }

    /// A worker builder with the test-friendly intervals of [`fast_worker`](crate::fast_worker).
    pub fn worker(&self) -> taskq::worker::WorkerBuilder {
        crate::fast_worker(&self.pool)
    }

    /// [`worker`](Self::worker) on a pool whose SQLite busy timeout is `busy`: for a lease too
    /// short for [`SQLITE_TEST_BUSY_TIMEOUT`] under the rule before issue 34 (`lease −
    /// heartbeat − min(cancel grace, lease / 2) ≥ busy timeout`; `build` no longer asks it).
    pub fn worker_with_busy_timeout(&self, busy: Duration) -> taskq::worker::WorkerBuilder {
        crate::fast_worker(&B::pool_with_busy_timeout(self, busy))
    }
}

impl Db<MySql> {
    /// A MySQL [`Db`] of a [`TestDb`], for the MySQL-only tests of a conformance file.
    pub fn from_test_db(db: TestDb) -> Self {
        Self {
            pool: db.pool.clone(),
            _guard: db,
        }
    }

    /// The [`TestDb`] it wraps.
    pub fn test_db(&self) -> &TestDb {
        &self._guard
    }
}

/// SQL for a blob literal of `bytes` (`X'..'`, on both backends): the payload column is
/// binary, and SQLite's STRICT table refuses text there.
pub fn blob(bytes: &[u8]) -> String {
    let hex: String = bytes.iter().map(|b| format!("{b:02X}")).collect();
    format!("X'{hex}'")
}

fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).expect("a test duration fits in i64 microseconds")
}

impl TestBackend for MySql {
    const LABEL: &'static str = "mysql";
    type Guard = TestDb;
    const NOW: &'static str = "UTC_TIMESTAMP(6)";

    fn shift_sql(expr: &str, us: i64) -> String {
        format!("({expr} + INTERVAL {us} MICROSECOND)")
    }

    fn json_text_sql(expr: &str, path: &str) -> String {
        format!("JSON_UNQUOTE(JSON_EXTRACT(CONVERT({expr} USING utf8mb4), '{path}'))")
    }

    async fn time(pool: &Pool<Self>, sql: &str) -> Option<chrono::DateTime<chrono::Utc>> {
        sqlx::query_scalar::<_, Option<chrono::NaiveDateTime>>(sqlx::AssertSqlSafe(sql.to_owned()))
            .fetch_one(pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
            .map(|t| t.and_utc())
    }

    async fn text(pool: &Pool<Self>, sql: &str) -> Option<String> {
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
            .fetch_one(pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    fn concat_sql(parts: &[&str]) -> String {
        format!(
            "CONVERT(CONCAT_WS('|', {}) USING utf8mb4)",
            parts.join(", ")
        )
    }

    async fn strings(pool: &Pool<Self>, sql: &str) -> Vec<String> {
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
            .fetch_all(pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    async fn blobs(pool: &Pool<Self>, sql: &str) -> Vec<Vec<u8>> {
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
            .fetch_all(pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    async fn ints(pool: &Pool<Self>, sql: &str) -> Vec<i64> {
        use sqlx::Row as _;
        // Ids are BIGINT UNSIGNED on MySQL.
        sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()))
            .fetch_all(pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
            .iter()
            .map(|r| {
                r.try_get::<i64, _>(0)
                    .or_else(|_| r.try_get::<u64, _>(0).map(|v| v as i64))
                    .unwrap_or_else(|e| panic!("{sql}: {e}"))
            })
            .collect()
    }

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

    async fn another_pool_with_busy_timeout(
        db: &Db<Self>,
        max: u32,
        _busy: Duration,
    ) -> Pool<Self> {
        db._guard.pool_with(max).await
    }

    fn pool_with_busy_timeout(db: &Db<Self>, _busy: Duration) -> Pool<Self> {
        db.pool.clone()
    }

    async fn create_empty() -> Option<Db<Self>> {
        TestDb::empty_or_skip().await.map(Db::from_test_db)
    }

    fn url(db: &Db<Self>) -> String {
        use sqlx::ConnectOptions as _;
        db._guard.options.to_url_lossy().to_string()
    }

    fn taskq_migrator() -> sqlx::migrate::Migrator {
        taskq::migrate::migrator()
    }

    async fn run_migrator(
        migrator: &sqlx::migrate::Migrator,
        pool: &Pool<Self>,
        target: Option<i64>,
    ) -> Result<(), sqlx::migrate::MigrateError> {
        match target {
            Some(v) => migrator.run_to(v, pool).await,
            None => migrator.run(pool).await,
        }
    }

    async fn tables(pool: &Pool<Self>) -> Vec<String> {
        let mut t: Vec<String> = sqlx::query_scalar(
            "SELECT CAST(table_name AS CHAR) FROM information_schema.tables
             WHERE table_schema = DATABASE()",
        )
        .fetch_all(pool)
        .await
        .expect("list tables");
        t.sort();
        t
    }

    async fn exec(pool: &Pool<Self>, sql: &str) -> u64 {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
            .execute(pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
            .rows_affected()
    }

    async fn scalar(pool: &Pool<Self>, sql: &str) -> i64 {
        let ints = Self::ints(pool, sql).await;
        assert_eq!(ints.len(), 1, "{sql}: one row");
        ints[0]
    }

    async fn exec_in(conn: &mut Self::Connection, sql: &str) -> u64 {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
            .execute(conn)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
            .rows_affected()
    }

    async fn scalar_in(conn: &mut Self::Connection, sql: &str) -> i64 {
        sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(sql.to_owned()))
            .fetch_one(conn)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
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

/// Busy timeout of the SQLite test databases' pools. Before issue 34 it had to be short
/// enough for the test leases (`WorkerBuilder::build` required `lease − heartbeat −
/// min(cancel grace, lease / 2) ≥ busy timeout`); since then a renewal waits 100 ms per try
/// whatever the pool's busy timeout, and this only bounds how long the tests' other writers
/// and the workers' claims and write-backs wait for the write lock.
pub const SQLITE_TEST_BUSY_TIMEOUT: Duration = Duration::from_secs(1);

/// A pool on the test database file at `path` with taskq's settings and
/// [`SQLITE_TEST_BUSY_TIMEOUT`].
async fn open_test_file(path: &std::path::Path) -> Pool<Sqlite> {
    let opts = taskq_sqlite::connect::connect_options(path).busy_timeout(SQLITE_TEST_BUSY_TIMEOUT);
    taskq_sqlite::connect::open_with(opts, taskq_sqlite::connect::DEFAULT_MAX_CONNECTIONS)
        .await
        .expect("open a SQLite file in the temp directory")
}

impl TestBackend for Sqlite {
    const LABEL: &'static str = "sqlite";
    type Guard = SqliteFile;
    const NOW: &'static str = "(SELECT us FROM taskq_clock)";

    fn shift_sql(expr: &str, us: i64) -> String {
        format!("({expr} + {us})")
    }

    fn json_text_sql(expr: &str, path: &str) -> String {
        // A BLOB would be read as JSONB (SQLite 3.45+): the payload is JSON text as bytes.
        format!("json_extract(CAST({expr} AS TEXT), '{path}')")
    }

    async fn time(pool: &Pool<Self>, sql: &str) -> Option<chrono::DateTime<chrono::Utc>> {
        sqlx::query_scalar::<_, Option<i64>>(sqlx::AssertSqlSafe(sql.to_owned()))
            .fetch_one(pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
            .map(|us| chrono::DateTime::from_timestamp_micros(us).expect("a time in range"))
    }

    async fn text(pool: &Pool<Self>, sql: &str) -> Option<String> {
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
            .fetch_one(pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    fn concat_sql(parts: &[&str]) -> String {
        let parts: Vec<String> = parts.iter().map(|p| format!("({p})")).collect();
        format!("CAST({} AS TEXT)", parts.join(" || '|' || "))
    }

    async fn strings(pool: &Pool<Self>, sql: &str) -> Vec<String> {
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
            .fetch_all(pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    async fn blobs(pool: &Pool<Self>, sql: &str) -> Vec<Vec<u8>> {
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
            .fetch_all(pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    async fn ints(pool: &Pool<Self>, sql: &str) -> Vec<i64> {
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
            .fetch_all(pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    fn url(db: &Db<Self>) -> String {
        format!("sqlite://{}", db._guard.path.display())
    }

    async fn create_empty() -> Option<Db<Self>> {
        let file = SqliteFile::new();
        let pool = open_test_file(&file.path).await;
        Some(Db { pool, _guard: file })
    }

    fn taskq_migrator() -> sqlx::migrate::Migrator {
        taskq_sqlite::migrate::migrator()
    }

    async fn run_migrator(
        migrator: &sqlx::migrate::Migrator,
        pool: &Pool<Self>,
        target: Option<i64>,
    ) -> Result<(), sqlx::migrate::MigrateError> {
        match target {
            Some(v) => migrator.run_to(v, pool).await,
            None => migrator.run(pool).await,
        }
    }

    async fn tables(pool: &Pool<Self>) -> Vec<String> {
        sqlx::query_scalar(
            "SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite_%'
             ORDER BY name",
        )
        .fetch_all(pool)
        .await
        .expect("list tables")
    }

    async fn create() -> Option<Db<Self>> {
        let file = SqliteFile::new();
        let pool = open_test_file(&file.path).await;
        taskq::migrate(&pool)
            .await
            .expect("taskq migrations apply on SQLite");
        Some(Db { pool, _guard: file })
    }

    async fn another_pool(db: &Db<Self>, max: u32) -> Pool<Self> {
        Self::another_pool_with_busy_timeout(db, max, SQLITE_TEST_BUSY_TIMEOUT).await
    }

    async fn another_pool_with_busy_timeout(db: &Db<Self>, max: u32, busy: Duration) -> Pool<Self> {
        sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(max)
            .connect_with(
                taskq::sqlite::tune(
                    sqlx::sqlite::SqliteConnectOptions::new().filename(&db._guard.path),
                )
                .busy_timeout(busy),
            )
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

    async fn scalar_in(conn: &mut Self::Connection, sql: &str) -> i64 {
        sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(sql.to_owned()))
            .fetch_one(conn)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    async fn begin(pool: &Pool<Self>) -> sqlx::Transaction<'static, Self> {
        taskq::sqlite::begin(pool).await.expect("begin immediate")
    }

    fn pool_with_busy_timeout(db: &Db<Self>, busy: Duration) -> Pool<Self> {
        sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(4)
            .connect_lazy_with(
                taskq_sqlite::connect::connect_options(&db._guard.path).busy_timeout(busy),
            )
    }
}

/// How long conformance tests wait for a worker by default.
pub const WAIT: Duration = Duration::from_secs(20);

/// Runs each listed `async fn name<B: TestBackend>(db: Db<B>)` as two tests, `name::mysql`
/// and `name::sqlite`, each on a fresh database of its backend (`conformance!(empty: ..)`:
/// a fresh database without taskq's tables).
///
/// ```ignore
/// async fn commit_makes_the_task_visible<B: TestBackend>(db: Db<B>) { .. }
/// taskq_tests::conformance!(commit_makes_the_task_visible);
/// ```
#[macro_export]
macro_rules! conformance {
    (empty: $($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn mysql() {
                if let Some(db) =
                    <sqlx::MySql as $crate::backends::TestBackend>::create_empty().await
                {
                    super::$name(db).await;
                }
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                if let Some(db) =
                    <sqlx::Sqlite as $crate::backends::TestBackend>::create_empty().await
                {
                    super::$name(db).await;
                }
            }
        }
    )*};
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
