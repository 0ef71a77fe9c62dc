//! The orders example: a service writes an order and its export task in one transaction; a
//! worker exports orders with an idempotent handler; the crash-recovery path is visible in a
//! few seconds.
//!
//! Run with: `cargo run -p example-orders` (end to end: places orders, runs a worker until
//! every order is exported, prints the table, exits 0). It uses `DATABASE_URL` (default
//! `mysql://root@127.0.0.1:3306/taskq_example`) and creates that database if needed.
//!
//! Crash-recovery demo (three terminals):
//! ```text
//! cargo run -p example-orders -- worker --slow 5s --lease 2s     # A: interrupt it with Ctrl-\ (SIGQUIT) mid-export
//! cargo run -p example-orders -- worker --lease 2s               # B: takes over A's task once A's lease expires
//! cargo run -p example-orders -- place 5 && cargo run -p example-orders -- watch
//! ```

use std::time::Duration;

use sqlx::MySqlPool;

use taskq::{Data, TaskContext, TaskError, Worker};

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
    db: Data<MySqlPool>,
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
    let done = sqlx::query(
        "UPDATE orders SET exported_at = UTC_TIMESTAMP(6), exported_by = ? WHERE id = ? AND exported_at IS NULL",
    )
    .bind(cx.worker_id())
    .bind(order_id)
    .execute(&*db)
    .await?;
    if done.rows_affected() == 1 {
        return Ok(());
    }
    let exists: Option<i64> = sqlx::query_scalar("SELECT id FROM orders WHERE id = ?")
        .bind(order_id)
        .fetch_optional(&*db)
        .await?;
    match exists {
        Some(_) => Ok(()), // already exported by an earlier attempt: success
        None => Err(TaskError::permanent(std::io::Error::other(format!(
            "order {order_id} does not exist"
        )))),
    }
}

/// Places `n` orders, each with its export task, each in one transaction.
async fn place(pool: &MySqlPool, n: u32) -> Result<Vec<i64>, Box<dyn std::error::Error>> {
    let mut ids = Vec::new();
    for i in 0..n {
        let mut tx = pool.begin().await?;
        let res = sqlx::query("INSERT INTO orders (customer, total_cents, created_at) VALUES (?, ?, UTC_TIMESTAMP(6))")
            .bind(format!("customer-{i}"))
            .bind(1000 + i64::from(i))
            .execute(&mut *tx)
            .await?;
        let order_id = res.last_insert_id() as i64;
        let task = OrderExport { order_id }.enqueue_tx(&mut tx).await?;
        tx.commit().await?;
        taskq::notify("orders"); // wake this process's workers now instead of at the next poll
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
    Option<u32>,
    Option<u64>,
    Option<String>,
);

async fn print_table(pool: &MySqlPool) -> Result<(), sqlx::Error> {
    let rows: Vec<OrderRow> =
        sqlx::query_as(
            "SELECT o.id, CAST(o.exported_at AS CHAR), o.exported_by, CAST(t.state AS CHAR), t.attempt,
                    t.lease_epoch, t.worker_id
             FROM orders o
             LEFT JOIN taskq_tasks t ON t.name = 'order_export'
                  AND CAST(JSON_EXTRACT(CONVERT(t.payload USING utf8mb4), '$.order_id') AS SIGNED) = o.id
             ORDER BY o.id DESC LIMIT 15",
        )
        .fetch_all(pool)
        .await?;
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

struct Args {
    command: String,
    count: u32,
    slow: Duration,
    lease: Duration,
}

fn args() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let mut a = Args {
        command: "demo".into(),
        count: 5,
        slow: Duration::ZERO,
        lease: Duration::from_secs(2),
    };
    let mut positional = Vec::new();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--slow" => a.slow = parse_duration(&it.next().ok_or("--slow needs a value")?)?,
            "--lease" => a.lease = parse_duration(&it.next().ok_or("--lease needs a value")?)?,
            "-h" | "--help" => return Err("usage: example-orders [demo [N] | place N | worker [--slow 5s] [--lease 2s] | watch]".into()),
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

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = args().map_err(|e| {
        eprintln!("{e}");
        std::process::exit(2)
    })?;
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/taskq_example".into());
    // Errors say what to check when no server answers (not sqlx's `Io(Os { .. })`).
    taskq::create_database(&url).await?;
    let pool = taskq::connect(&url).await?;
    taskq::migrate(&pool).await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS orders (
            id BIGINT AUTO_INCREMENT PRIMARY KEY, customer VARCHAR(100) NOT NULL,
            total_cents BIGINT NOT NULL, created_at DATETIME(6) NOT NULL,
            exported_at DATETIME(6) NULL, exported_by VARCHAR(128) NULL)",
    )
    .execute(&pool)
    .await?;

    let worker = |slow: Duration, lease: Duration| {
        Worker::builder(pool.clone())
            .register_all()
            .data(pool.clone())
            .data(Settings { slow })
            .lease(lease)
            .heartbeat(lease / 4)
            .reaper_interval(Duration::from_millis(200))
            .shutdown_timeout(Duration::from_secs(2))
    };
    match args.command.as_str() {
        "place" => {
            place(&pool, args.count).await?;
        }
        "watch" => loop {
            print!("\x1b[2J\x1b[H");
            print_table(&pool).await?;
            tokio::time::sleep(Duration::from_millis(500)).await;
        },
        "worker" => {
            let w = worker(args.slow, args.lease).build()?;
            println!("worker {} running (Ctrl-C to stop gracefully)", w.id());
            let report = w.run().await?;
            println!("stopped; released at shutdown: {:?}", report.released);
        }
        "demo" => {
            let ids = place(&pool, args.count).await?;
            let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
            let w = worker(args.slow, args.lease)
                .shutdown_signal(async move {
                    let _ = stop_rx.await;
                })
                .build()?;
            let running = tokio::spawn(w.run());
            let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
            loop {
                let left: i64 = sqlx::query_scalar(
                    "SELECT COUNT(*) FROM orders WHERE exported_at IS NULL AND id BETWEEN ? AND ?",
                )
                .bind(ids[0])
                .bind(ids[ids.len() - 1])
                .fetch_one(&pool)
                .await?;
                if left == 0 {
                    break;
                }
                if tokio::time::Instant::now() > deadline {
                    return Err(format!("{left} orders still not exported after 60 s").into());
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let _ = stop_tx.send(());
            let report = running.await??;
            print_table(&pool).await?;
            println!(
                "all {} orders exported; worker stats: {:?}",
                ids.len(),
                report.stats
            );
        }
        other => {
            eprintln!("unknown command {other:?}; try --help");
            std::process::exit(2);
        }
    }
    Ok(())
}
