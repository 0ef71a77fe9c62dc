//! The orders example: a service writes an order and its export task in one transaction; a
//! worker exports orders with an idempotent handler; the crash-recovery path is visible in a
//! few seconds. One handler, two backends: an embedded SQLite file by default (no server to
//! install), MySQL / MariaDB with `--database-url mysql://…`.
//!
//! Run with: `cargo run -p example-orders` (end to end: places orders, runs a worker until
//! every order is exported, prints the table, exits 0). The database is, in order: the
//! `--database-url URL` argument, `DATABASE_URL`, or a SQLite file in the temp directory (the
//! first line printed names it). A MySQL database named in the URL is created if needed.
//!
//! The end-to-end run's default file is its own: `taskq-example-orders-<pid>-<time>.db`,
//! created anew (never an existing file) and deleted when the run ends (`--keep` keeps it),
//! so two runs at once never see each other's orders. The commands of the crash-recovery demo
//! share one file per user, `taskq-example-orders-$USER.db`, since they are meant to.
//!
//! Crash-recovery demo (three terminals; on SQLite the processes share the one file):
//! ```text
//! cargo run -p example-orders -- worker --slow 5s --lease 2s     # A: interrupt it with Ctrl-\ (SIGQUIT) mid-export
//! cargo run -p example-orders -- worker --lease 2s               # B: takes over A's task once A's lease expires
//! cargo run -p example-orders -- place 5 && cargo run -p example-orders -- watch
//! ```

use std::str::FromStr;
use std::time::Duration;

use sqlx::{MySqlPool, SqlitePool};

use taskq::{Data, TaskContext, TaskError, Worker, worker::WorkerBuilder};

/// The application's database: the handler and the service code take this one type and say
/// what differs per backend (here only the SQL for "now" and the new order's id).
#[derive(Clone, Debug)]
enum Db {
    MySql(MySqlPool),
    Sqlite(SqlitePool),
}

/// Settings the handler reads (`Data<Settings>`, injected by the worker).
#[derive(Clone, Debug)]
struct Settings {
    slow: Duration,
}

/// Exports one order: marks it exported unless it already is. Idempotent: running it twice
/// exports once; "already exported" is success; a missing order can never succeed (permanent).
#[taskq::task(queue = "orders", max_attempts = 5, backoff = "exponential(1s, 30s)")]
async fn order_export(
    order_id: i64,
    cx: TaskContext,
    db: Data<Db>,
    settings: Data<Settings>,
) -> Result<(), TaskError> {
    println!(
        "[{}] exporting order {order_id} (attempt {})",
        cx.worker_id(),
        cx.attempt()
    );
    if !settings.slow.is_zero() {
        tokio::select! {
            _ = tokio::time::sleep(settings.slow) => {}
            reason = cx.cancel_signal().canceled() => {
                return Err(TaskError::msg(format!("canceled: {reason:?}")));
            }
        }
    }
    let (exported, exists) = match &*db {
        Db::MySql(pool) => {
            let done = sqlx::query(
                "UPDATE orders SET exported_at = UTC_TIMESTAMP(6), exported_by = ?
                 WHERE id = ? AND exported_at IS NULL",
            )
            .bind(cx.worker_id())
            .bind(order_id)
            .execute(pool)
            .await?;
            let exists: Option<i64> = sqlx::query_scalar("SELECT id FROM orders WHERE id = ?")
                .bind(order_id)
                .fetch_optional(pool)
                .await?;
            (done.rows_affected() == 1, exists.is_some())
        }
        Db::Sqlite(pool) => {
            let done = sqlx::query(
                "UPDATE orders SET exported_at = strftime('%Y-%m-%d %H:%M:%f', 'now'), exported_by = ?
                 WHERE id = ? AND exported_at IS NULL",
            )
            .bind(cx.worker_id())
            .bind(order_id)
            .execute(pool)
            .await?;
            let exists: Option<i64> = sqlx::query_scalar("SELECT id FROM orders WHERE id = ?")
                .bind(order_id)
                .fetch_optional(pool)
                .await?;
            (done.rows_affected() == 1, exists.is_some())
        }
    };
    if exported || exists {
        // Exported now, or already exported by an earlier attempt: success either way.
        return Ok(());
    }
    Err(TaskError::permanent(std::io::Error::other(format!(
        "order {order_id} does not exist"
    ))))
}

/// Places `n` orders, each with its export task, each in one transaction: the order row and
/// the task commit together or not at all, on either backend.
async fn place(db: &Db, n: u32) -> Result<Vec<i64>, Box<dyn std::error::Error>> {
    let mut ids = Vec::new();
    for i in 0..n {
        let customer = format!("customer-{i}");
        let total = 1000 + i64::from(i);
        let (order_id, task) = match db {
            Db::MySql(pool) => {
                let mut tx = pool.begin().await?;
                let res = sqlx::query(
                    "INSERT INTO orders (customer, total_cents, created_at)
                     VALUES (?, ?, UTC_TIMESTAMP(6))",
                )
                .bind(&customer)
                .bind(total)
                .execute(&mut *tx)
                .await?;
                let order_id = res.last_insert_id() as i64;
                let task = OrderExport { order_id }.enqueue_tx(&mut tx).await?;
                tx.commit().await?;
                (order_id, task)
            }
            Db::Sqlite(pool) => {
                // BEGIN IMMEDIATE: takes the file's write lock now (waiting up to the busy
                // timeout) rather than failing at the first write if a worker wrote meanwhile.
                let mut tx = taskq::sqlite::begin(pool).await?;
                let order_id: i64 = sqlx::query_scalar(
                    "INSERT INTO orders (customer, total_cents, created_at)
                     VALUES (?, ?, strftime('%Y-%m-%d %H:%M:%f', 'now')) RETURNING id",
                )
                .bind(&customer)
                .bind(total)
                .fetch_one(&mut *tx)
                .await?;
                let task = OrderExport { order_id }.enqueue_tx(&mut tx).await?;
                tx.commit().await?;
                (order_id, task)
            }
        };
        taskq::worker::notify("orders"); // wake this process's workers now instead of at the next poll
        println!("placed order {order_id} with export task {}", task.id);
        ids.push(order_id);
    }
    Ok(ids)
}

/// order id, exported at, exported by, task state, attempt, epoch, worker.
type OrderRow = (
    i64,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<i64>,
    Option<i64>,
    Option<String>,
);

async fn print_table(db: &Db) -> Result<(), sqlx::Error> {
    let rows: Vec<OrderRow> = match db {
        Db::MySql(pool) => {
            sqlx::query_as(
                "SELECT o.id, CAST(o.exported_at AS CHAR), o.exported_by, CAST(t.state AS CHAR),
                        CAST(t.attempt AS SIGNED), CAST(t.lease_epoch AS SIGNED), t.worker_id
                 FROM orders o
                 LEFT JOIN taskq_tasks t ON t.name = 'order_export'
                      AND CAST(JSON_EXTRACT(CONVERT(t.payload USING utf8mb4), '$.order_id') AS SIGNED) = o.id
                 ORDER BY o.id DESC LIMIT 15",
            )
            .fetch_all(pool)
            .await?
        }
        Db::Sqlite(pool) => {
            // The payload is JSON text stored as a BLOB: cast it, or json_extract reads JSONB.
            sqlx::query_as(
                "SELECT o.id, o.exported_at, o.exported_by, t.state, t.attempt, t.lease_epoch,
                        t.worker_id
                 FROM orders o
                 LEFT JOIN taskq_tasks t ON t.name = 'order_export'
                      AND json_extract(CAST(t.payload AS TEXT), '$.order_id') = o.id
                 ORDER BY o.id DESC LIMIT 15",
            )
            .fetch_all(pool)
            .await?
        }
    };
    println!(
        "{:>6}  {:<10} {:>7} {:>5}  {:<28} {:<26}",
        "order", "task", "attempt", "epoch", "worker", "exported at"
    );
    for (id, at, by, state, attempt, epoch, worker) in rows {
        println!(
            "{:>6}  {:<10} {:>7} {:>5}  {:<28} {:<26}",
            id,
            state.unwrap_or_else(|| "-".into()),
            attempt.map_or("-".into(), |a| a.to_string()),
            epoch.map_or("-".into(), |e| e.to_string()),
            worker.or(by).unwrap_or_else(|| "-".into()),
            at.unwrap_or_else(|| "-".into()),
        );
    }
    Ok(())
}

/// How many of the orders `first..=last` are not exported yet.
async fn unexported(db: &Db, first: i64, last: i64) -> Result<i64, sqlx::Error> {
    let sql = "SELECT COUNT(*) FROM orders WHERE exported_at IS NULL AND id BETWEEN ? AND ?";
    match db {
        Db::MySql(pool) => {
            sqlx::query_scalar(sql)
                .bind(first)
                .bind(last)
                .fetch_one(pool)
                .await
        }
        Db::Sqlite(pool) => {
            sqlx::query_scalar(sql)
                .bind(first)
                .bind(last)
                .fetch_one(pool)
                .await
        }
    }
}

/// Opens the database of `url` (creating a MySQL database or a SQLite file if missing),
/// applies taskq's migrations and creates the `orders` table.
async fn open(url: &str, lease: Duration) -> Result<Db, Box<dyn std::error::Error>> {
    // Errors say what to check when no server answers or the file cannot be opened (not
    // sqlx's `Io(Os { .. })`).
    if url.starts_with("sqlite:") {
        // The busy timeout a worker's renewal may wait out without losing the demo's short
        // lease (`WorkerBuilder::build` checks it): lease − heartbeat (lease / 4) −
        // min(cancel grace (5 s), lease / 2); 0.5 s for the default 2 s lease.
        let busy = (lease - lease / 4 - (lease / 2).min(Duration::from_secs(5)))
            .min(taskq::sqlite::DEFAULT_BUSY_TIMEOUT);
        let opts = sqlx::sqlite::SqliteConnectOptions::from_str(url)?;
        let pool =
            taskq::sqlite::connect_with(taskq::sqlite::tune(opts).busy_timeout(busy)).await?;
        taskq::migrate(&pool).await?;
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS orders (
                id INTEGER PRIMARY KEY AUTOINCREMENT, customer TEXT NOT NULL,
                total_cents INTEGER NOT NULL, created_at TEXT NOT NULL,
                exported_at TEXT NULL, exported_by TEXT NULL)",
        )
        .execute(&pool)
        .await?;
        Ok(Db::Sqlite(pool))
    } else {
        taskq::create_database(url).await?;
        let pool = taskq::connect(url).await?;
        taskq::migrate(&pool).await?;
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS orders (
                id BIGINT AUTO_INCREMENT PRIMARY KEY, customer VARCHAR(100) NOT NULL,
                total_cents BIGINT NOT NULL, created_at DATETIME(6) NOT NULL,
                exported_at DATETIME(6) NULL, exported_by VARCHAR(128) NULL)",
        )
        .execute(&pool)
        .await?;
        Ok(Db::MySql(pool))
    }
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num.parse().map_err(|_| format!("bad duration {s:?}"))?;
    Ok(match unit {
        "ms" => Duration::from_millis(n),
        "s" | "" => Duration::from_secs(n),
        "m" => Duration::from_secs(n * 60),
        _ => return Err(format!("bad duration unit in {s:?} (use ms, s or m)")),
    })
}

const USAGE: &str = "usage: example-orders [--database-url URL] [demo [N] [--keep] | place N | worker [--slow 5s] [--lease 2s] | watch]
  URL: sqlite://path/to/file.db or mysql://user:password@host:3306/database
  (default: $DATABASE_URL, else a SQLite file in the temp directory: for demo, a new file of
  its own, deleted at the end unless --keep; for place, worker and watch, the file
  taskq-example-orders-$USER.db, which they share)";

struct Args {
    command: String,
    count: u32,
    slow: Duration,
    lease: Duration,
    database_url: Option<String>,
    keep: bool,
}

fn args() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let mut a = Args {
        command: "demo".into(),
        count: 5,
        slow: Duration::ZERO,
        lease: Duration::from_secs(2),
        database_url: None,
        keep: false,
    };
    let mut positional = Vec::new();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--slow" => a.slow = parse_duration(&it.next().ok_or("--slow needs a value")?)?,
            "--lease" => a.lease = parse_duration(&it.next().ok_or("--lease needs a value")?)?,
            "--database-url" => {
                a.database_url = Some(it.next().ok_or("--database-url needs a value")?)
            }
            s if s.starts_with("--database-url=") => {
                a.database_url = Some(s["--database-url=".len()..].to_owned())
            }
            "--keep" => a.keep = true,
            "-h" | "--help" => return Err(USAGE.into()),
            _ => positional.push(arg),
        }
    }
    if let Some(c) = positional.first() {
        a.command = c.clone();
    }
    if let Some(n) = positional.get(1) {
        a.count = n.parse().map_err(|_| format!("not a count: {n}"))?;
    }
    Ok(a)
}

/// The database URL: `--database-url`, else `DATABASE_URL`, else a SQLite file in the temp
/// directory: for `demo`, a file of its own ([`OwnFile`]); for `worker`, `place` and `watch`,
/// one file per user, which they share (three terminals of the crash-recovery demo).
fn database_url(arg: Option<String>, command: &str) -> Result<(String, Option<OwnFile>), String> {
    if let Some(url) = arg.or_else(|| std::env::var("DATABASE_URL").ok()) {
        return Ok((url, None));
    }
    if command == "demo" {
        let own = OwnFile::create()?;
        return Ok((format!("sqlite://{}", own.0.display()), Some(own)));
    }
    let user: String = std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .unwrap_or_default()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        .collect();
    let user = if user.is_empty() {
        "shared".into()
    } else {
        user
    };
    let file = std::env::temp_dir().join(format!("taskq-example-orders-{user}.db"));
    Ok((format!("sqlite://{}", file.display()), None))
}

/// A run's own SQLite file in the temp directory, created here (so no other run has it: the
/// name carries the pid and the time, and creation fails rather than reuse an existing file);
/// deleted, with its WAL and shared-memory files, when dropped, unless kept.
struct OwnFile(std::path::PathBuf, bool);

impl OwnFile {
    fn create() -> Result<Self, String> {
        let dir = std::env::temp_dir();
        for attempt in 0..100u32 {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            let path = dir.join(format!(
                "taskq-example-orders-{}-{nanos:x}{attempt}.db",
                std::process::id()
            ));
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
            {
                Ok(_) => return Ok(Self(path, false)),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => {
                    return Err(format!(
                        "cannot create a SQLite file in {} ({e}); pass --database-url sqlite://path/to/file.db",
                        dir.display()
                    ));
                }
            }
        }
        Err(format!("cannot find a free file name in {}", dir.display()))
    }
}

impl Drop for OwnFile {
    fn drop(&mut self) {
        if self.1 {
            return;
        }
        let path = self.0.display().to_string();
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{path}{suffix}"));
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = args().map_err(|e| {
        eprintln!("{e}");
        std::process::exit(2)
    })?;
    let (url, mut own) = database_url(args.database_url.clone(), &args.command).map_err(|e| {
        eprintln!("{e}");
        std::process::exit(1)
    })?;
    match url
        .strip_prefix("sqlite://")
        .or(url.strip_prefix("sqlite:"))
    {
        Some(file) => println!(
            "database: SQLite file {file} (embedded, no server; --database-url mysql://… for MySQL/MariaDB)"
        ),
        None => println!("database: {}", redact(&url)),
    }
    if let Some(own) = &mut own {
        own.1 = args.keep;
        println!(
            "(this run's own file: {}; --keep keeps it, --database-url sqlite://FILE names one)",
            if args.keep {
                "kept at the end"
            } else {
                "deleted at the end"
            }
        );
    }
    let db = open(&url, args.lease).await?;

    let worker = |slow: Duration, lease: Duration| -> WorkerBuilder {
        let builder = match &db {
            Db::MySql(pool) => Worker::builder(pool.clone()),
            Db::Sqlite(pool) => Worker::builder(pool.clone()),
        };
        builder
            .register_all()
            .data(db.clone())
            .data(Settings { slow })
            .lease(lease)
            .heartbeat(lease / 4)
            .reaper_interval(Duration::from_millis(200))
            .shutdown_timeout(Duration::from_secs(2))
    };
    match args.command.as_str() {
        "place" => {
            place(&db, args.count).await?;
        }
        "watch" => loop {
            print!("\x1b[2J\x1b[H");
            print_table(&db).await?;
            tokio::time::sleep(Duration::from_millis(500)).await;
        },
        "worker" => {
            let w = worker(args.slow, args.lease).build()?;
            println!("worker {} running (Ctrl-C to stop gracefully)", w.id());
            let report = w.run().await?;
            println!("stopped; released at shutdown: {:?}", report.released);
        }
        "demo" => {
            let ids = place(&db, args.count).await?;
            let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
            let w = worker(args.slow, args.lease)
                .shutdown_signal(async move {
                    let _ = stop_rx.await;
                })
                .build()?;
            let running = tokio::spawn(w.run());
            let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
            if let (Some(&first), Some(&last)) = (ids.first(), ids.last()) {
                loop {
                    let left = unexported(&db, first, last).await?;
                    if left == 0 {
                        break;
                    }
                    if tokio::time::Instant::now() > deadline {
                        return Err(format!("{left} orders still not exported after 60 s").into());
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
            let _ = stop_tx.send(());
            let report = running.await??;
            print_table(&db).await?;
            println!(
                "all {} orders exported; worker stats: {:?}",
                ids.len(),
                report.stats
            );
            match &db {
                Db::MySql(pool) => pool.close().await,
                Db::Sqlite(pool) => pool.close().await,
            }
        }
        other => {
            eprintln!("unknown command {other:?}; try --help");
            std::process::exit(2);
        }
    }
    Ok(())
}

/// `url` with its password replaced by `***`, for printing.
fn redact(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => match rest.split_once('@') {
            Some((user_info, host)) if user_info.contains(':') => {
                let user = user_info.split(':').next().unwrap_or_default();
                format!("{scheme}://{user}:***@{host}")
            }
            _ => url.to_owned(),
        },
        None => url.to_owned(),
    }
}
