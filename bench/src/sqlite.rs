//! `--sqlite`: taskq on an SQLite file next to hand-written SQL on the same file, in the same
//! run (issue 12's performance targets):
//!
//! - `enqueue_tx` (`taskq::sqlite::begin` + `enqueue_tx` + `COMMIT`) against a hand-written
//!   `BEGIN IMMEDIATE; INSERT …; COMMIT` of an equivalent row, interleaved in 100 ms slices on
//!   1 / 4 / 16 connections, like the MySQL measurement;
//! - the drain of 20,000 no-op tasks by one `Worker::builder(sqlite_pool)` at concurrency
//!   1 / 4 / 16 against a hand-written batched claim loop on as many connections
//!   (`BEGIN IMMEDIATE; UPDATE … WHERE id IN (SELECT … ORDER BY priority, run_at, id LIMIT 32)
//!   RETURNING …; COMMIT`, then one `UPDATE … FROM json_each(?)` to `succeeded` fenced by
//!   `(id, lease_epoch)`), alternated raw / taskq `reps` times per concurrency;
//! - statements per task of both.
//!
//! SQLite has no server-wide statement counter. Statements are counted from sqlx's own
//! statement log: every statement a connection executes ends with an event on the tracing
//! target `sqlx::query` (level DEBUG unless the connect options change it; the worker's pool
//! inherits the bench pool's options). A tracing subscriber in this process counts those
//! events while a measurement runs, and nothing else (other targets are disabled outright).
//! sqlx does not log `BEGIN` / `COMMIT` / `ROLLBACK` (its connection worker issues them
//! without the logger), so transactions are added: 2 per claim transaction and per write-back
//! flush of the worker (its own counters), 2 per claim transaction of the raw loop. The
//! breakdown by statement shows that no other transaction ran (no reap, no release).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};
use sqlx::{Row, SqlitePool};
use taskq::Task;

use crate::Res;
use crate::args::Sizes;
use crate::counters::cpu_secs;
use crate::enqueue::INSERT_SLICE;
use crate::report::machine;
use crate::task::{QUEUE, TASK, noop, start_worker};

// ---------------------------------------------------------------------------------------------
// Statement counting (see the module docs).

static COUNTING: AtomicBool = AtomicBool::new(false);
static STATEMENTS: AtomicU64 = AtomicU64::new(0);
static BY_STATEMENT: Mutex<Option<HashMap<String, u64>>> = Mutex::new(None);

/// A tracing subscriber that counts sqlx's statement events (target `sqlx::query`) while
/// [`COUNTING`] is set, keyed by the statement's first words; every other event and span is
/// disabled.
struct StatementCounter;

/// Reads the `db.statement` (full SQL, when longer than the summary) and `summary` fields.
#[derive(Default)]
struct Fields {
    summary: String,
    statement: String,
}

impl tracing::field::Visit for Fields {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        match field.name() {
            "summary" => self.summary = value.to_owned(),
            "db.statement" => self.statement = value.to_owned(),
            _ => {}
        }
    }
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "summary" && self.summary.is_empty() {
            self.summary = format!("{value:?}");
        }
    }
}

impl tracing::Subscriber for StatementCounter {
    fn register_callsite(
        &self,
        m: &'static tracing::Metadata<'static>,
    ) -> tracing::subscriber::Interest {
        if m.target() == "sqlx::query" {
            tracing::subscriber::Interest::sometimes()
        } else {
            tracing::subscriber::Interest::never()
        }
    }
    fn enabled(&self, m: &tracing::Metadata<'_>) -> bool {
        m.target() == "sqlx::query" && COUNTING.load(Ordering::Relaxed)
    }
    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        Some(tracing::level_filters::LevelFilter::TRACE)
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, e: &tracing::Event<'_>) {
        if !COUNTING.load(Ordering::Relaxed) {
            return;
        }
        STATEMENTS.fetch_add(1, Ordering::Relaxed);
        let mut f = Fields::default();
        e.record(&mut f);
        let sql = if f.statement.trim().is_empty() {
            f.summary
        } else {
            f.statement
        };
        let key = statement_key(&sql);
        let mut by = BY_STATEMENT.lock().unwrap();
        *by.get_or_insert_with(HashMap::new).entry(key).or_insert(0) += 1;
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// A short name for a statement: its first words, and for the `UPDATE`s of `taskq_tasks`
/// (claim, write-back, heartbeat, reap, release) the first assignment, which tells them apart.
fn statement_key(sql: &str) -> String {
    let words: Vec<&str> = sql.split_whitespace().collect();
    let mut key = words.iter().take(4).copied().collect::<Vec<_>>().join(" ");
    if let Some(set) = words.iter().position(|w| *w == "SET") {
        key.push_str(" SET ");
        key.push_str(
            &words[set + 1..]
                .iter()
                .take(3)
                .copied()
                .collect::<Vec<_>>()
                .join(" "),
        );
    }
    key.chars().take(90).collect()
}

/// Statements counted between [`Count::start`] and [`Count::stop`], by statement.
struct Count {
    total: u64,
    by: Vec<(String, u64)>,
}

impl Count {
    fn start() {
        *BY_STATEMENT.lock().unwrap() = Some(HashMap::new());
        STATEMENTS.store(0, Ordering::SeqCst);
        COUNTING.store(true, Ordering::SeqCst);
    }
    fn stop() -> Count {
        COUNTING.store(false, Ordering::SeqCst);
        let mut by: Vec<(String, u64)> = BY_STATEMENT
            .lock()
            .unwrap()
            .take()
            .unwrap_or_default()
            .into_iter()
            .collect();
        by.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        Count {
            total: STATEMENTS.load(Ordering::SeqCst),
            by,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The file.

/// Deletes the database file and its WAL / shared-memory files.
fn remove_db(path: &Path) {
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let mut p = path.as_os_str().to_owned();
        p.push(suffix);
        let _ = std::fs::remove_file(PathBuf::from(p));
    }
}

/// Empties the task table and checkpoints the WAL into the file (truncating it), so every
/// measurement starts from the same empty table and an empty WAL.
async fn reset(pool: &SqlitePool) -> Res<()> {
    sqlx::query("DELETE FROM taskq_tasks").execute(pool).await?;
    checkpoint(pool).await
}

async fn checkpoint(pool: &SqlitePool) -> Res<()> {
    sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
        .execute(pool)
        .await?;
    Ok(())
}

/// Enqueues `n` no-op tasks through `enqueue_many`, 1,000 per transaction (as for MySQL).
async fn preload(pool: &SqlitePool, n: u64) -> Res<()> {
    let mut seq = 0;
    while seq < n {
        let end = (seq + 1000).min(n);
        let mut tx = taskq::sqlite::begin(pool).await?;
        taskq::enqueue::enqueue_many(&mut tx, (seq..end).map(noop)).await?;
        tx.commit().await?;
        seq = end;
    }
    checkpoint(pool).await
}

// ---------------------------------------------------------------------------------------------
// Enqueue.

/// The hand-written insert: the row `enqueue_tx` writes for a task without options (queue,
/// name, payload, state, priority, max_attempts, run_at = created_at = updated_at = the
/// database clock), in one `INSERT … SELECT` from the clock view taskq's statements use.
const RAW_INSERT: &str = "INSERT INTO taskq_tasks (queue, name, payload, state, priority,
     max_attempts, run_at, created_at, updated_at)
 SELECT ?1, ?2, ?3, 'pending', 0, 20, c.us, c.us, c.us FROM taskq_clock AS c";

/// Like the MySQL `insert_rates`: `conns` connections for `secs`, switching every 100 ms (all
/// at once) between the hand-written `BEGIN IMMEDIATE; INSERT; COMMIT` and
/// `taskq::sqlite::begin` + `enqueue_tx` + `COMMIT`. Returns `(raw, taskq)` tx/s.
async fn insert_rates(pool: &SqlitePool, conns: usize, secs: f64) -> Res<(f64, f64)> {
    reset(pool).await?;
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(secs);
    let mut set = tokio::task::JoinSet::new();
    for c in 0..conns {
        let pool = pool.clone();
        set.spawn(async move {
            let (mut raw, mut tq) = (0u64, 0u64);
            let payload = serde_json::to_vec(&noop(0))?;
            loop {
                let now = Instant::now();
                if now >= deadline {
                    break;
                }
                let slice = (now - start).as_nanos() / INSERT_SLICE.as_nanos();
                if slice % 2 == 1 {
                    let mut tx = taskq::sqlite::begin(&pool).await?;
                    noop(c as u64 * 10_000_000 + tq).enqueue_tx(&mut tx).await?;
                    tx.commit().await?;
                    tq += 1;
                } else {
                    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
                    sqlx::query(RAW_INSERT)
                        .bind(QUEUE)
                        .bind(TASK)
                        .bind(&payload)
                        .execute(&mut *tx)
                        .await?;
                    tx.commit().await?;
                    raw += 1;
                }
            }
            Res::Ok((raw, tq))
        });
    }
    let (mut raw, mut tq) = (0, 0);
    while let Some(r) = set.join_next().await {
        let (r, t) = r??;
        raw += r;
        tq += t;
    }
    let half = start.elapsed().as_secs_f64() / 2.0;
    Ok((raw as f64 / half, tq as f64 / half))
}

/// Statements of `n` transactions of each kind on one connection (counted; not timed).
async fn insert_statements(pool: &SqlitePool, n: u64) -> Res<(Count, Count)> {
    reset(pool).await?;
    let payload = serde_json::to_vec(&noop(0))?;
    Count::start();
    for _ in 0..n {
        let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
        sqlx::query(RAW_INSERT)
            .bind(QUEUE)
            .bind(TASK)
            .bind(&payload)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
    }
    let raw = Count::stop();
    Count::start();
    for i in 0..n {
        let mut tx = taskq::sqlite::begin(pool).await?;
        noop(i).enqueue_tx(&mut tx).await?;
        tx.commit().await?;
    }
    let tq = Count::stop();
    Ok((raw, tq))
}

// ---------------------------------------------------------------------------------------------
// Drain.

/// Rows per claim of the hand-written loop (as in the MySQL raw loops).
const RAW_BATCH: u32 = 32;

/// One run of the hand-written batched loop or of a taskq worker over `n` preloaded tasks.
#[derive(Clone, serde::Serialize)]
struct Run {
    tasks_per_s: f64,
    /// Statements per task: counted statements plus `BEGIN` and `COMMIT` of every transaction.
    statements_per_task: f64,
    /// Statements sqlx logged (without `BEGIN` / `COMMIT`).
    logged: u64,
    /// Write transactions (claims, and write-back flushes for taskq).
    transactions: u64,
    claims: u64,
    flushes: u64,
    cpu_ms_per_task: f64,
    #[serde(skip)]
    by: Vec<(String, u64)>,
}

/// The hand-written loop: `conns` connections each repeat { `BEGIN IMMEDIATE`; claim up to
/// [`RAW_BATCH`] due rows in claim order with one `UPDATE … RETURNING`; `COMMIT`; one
/// `UPDATE` of those rows to `succeeded`, each conditional on its `(id, lease_epoch)` } until
/// the queue is empty. No handler, no lease bookkeeping, no waiting: the file's ceiling for
/// this claim/finish shape.
async fn raw_loop(pool: &SqlitePool, conns: usize, n: u64) -> Res<Run> {
    reset(pool).await?;
    preload(pool, n).await?;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let claims = std::sync::Arc::new(AtomicU64::new(0));
    Count::start();
    let cpu0 = cpu_secs();
    let start = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..conns {
        let pool = pool.clone();
        let claims = claims.clone();
        set.spawn(async move {
            let mut conn = pool.acquire().await?;
            let mut done = 0u64;
            loop {
                let mut tx = sqlx::Connection::begin_with(&mut *conn, "BEGIN IMMEDIATE").await?;
                let rows = sqlx::query(
                    "UPDATE taskq_tasks AS t
                     SET state = 'running', attempt = t.attempt + 1,
                         lease_epoch = t.lease_epoch + 1, lease_until = c.us + 30000000,
                         worker_id = 'raw', attempted_at = c.us, updated_at = c.us
                     FROM taskq_clock AS c
                     WHERE t.id IN (
                       SELECT id FROM taskq_tasks
                       WHERE state = 'pending' AND queue = ?1
                         AND run_at <= (SELECT us FROM taskq_clock)
                       ORDER BY priority, run_at, id
                       LIMIT ?2)
                     RETURNING id, name, payload, attempt, max_attempts, lease_epoch",
                )
                .bind(QUEUE)
                .bind(RAW_BATCH)
                .fetch_all(&mut *tx)
                .await?;
                tx.commit().await?;
                claims.fetch_add(1, Ordering::Relaxed);
                if rows.is_empty() {
                    break;
                }
                let leases: Vec<(i64, i64)> = rows
                    .iter()
                    .map(|r| (r.get::<i64, _>(0), r.get::<i64, _>(5)))
                    .collect();
                let finished = sqlx::query(
                    "UPDATE taskq_tasks AS t
                     SET state = 'succeeded', finished_at = c.us, lease_until = NULL,
                         updated_at = c.us
                     FROM json_each(?1) AS j, taskq_clock AS c
                     WHERE t.id = j.value ->> 0 AND t.lease_epoch = j.value ->> 1
                       AND t.state = 'running'",
                )
                .bind(serde_json::to_string(&leases)?)
                .execute(&mut *conn)
                .await?;
                if finished.rows_affected() != rows.len() as u64 {
                    return Err(format!(
                        "raw loop finished {} of {} claimed rows",
                        finished.rows_affected(),
                        rows.len()
                    )
                    .into());
                }
                done += rows.len() as u64;
            }
            Res::Ok(done)
        });
    }
    let mut total = 0;
    while let Some(r) = set.join_next().await {
        total += r??;
    }
    let secs = start.elapsed().as_secs_f64();
    let cpu = cpu_secs() - cpu0;
    let count = Count::stop();
    if total != n {
        return Err(format!("raw loop finished {total} of {n} tasks").into());
    }
    let claims = claims.load(Ordering::Relaxed);
    Ok(Run::new(n, secs, cpu, count, claims, claims, 0))
}

/// One taskq worker at `concurrency` drains `n` preloaded tasks; timed until its `succeeded`
/// counter reads `n` (the last outcome written), counted until it has shut down.
async fn drain(pool: &SqlitePool, concurrency: usize, n: u64) -> Res<Run> {
    reset(pool).await?;
    preload(pool, n).await?;
    tokio::time::sleep(Duration::from_millis(200)).await;
    Count::start();
    let cpu0 = cpu_secs();
    let start = Instant::now();
    let w = start_worker(pool, concurrency)?;
    w.wait_for(n, Duration::from_secs(3600)).await?;
    let secs = start.elapsed().as_secs_f64();
    let cpu = cpu_secs() - cpu0;
    let report = w.stop().await?;
    let count = Count::stop();
    let (claims, flushes) = (report.stats.claim_queries, report.stats.ack_flushes);
    let done: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM taskq_tasks WHERE state = 'succeeded'")
            .fetch_one(pool)
            .await?;
    if done as u64 != n {
        return Err(format!("drain left {done} of {n} tasks succeeded").into());
    }
    Ok(Run::new(
        n,
        secs,
        cpu,
        count,
        claims + flushes,
        claims,
        flushes,
    ))
}

impl Run {
    fn new(
        n: u64,
        secs: f64,
        cpu: f64,
        count: Count,
        transactions: u64,
        claims: u64,
        flushes: u64,
    ) -> Self {
        Run {
            tasks_per_s: n as f64 / secs,
            statements_per_task: (count.total + 2 * transactions) as f64 / n as f64,
            logged: count.total,
            transactions,
            claims,
            flushes,
            cpu_ms_per_task: cpu * 1000.0 / n as f64,
            by: count.by,
        }
    }
}

fn median(mut runs: Vec<Run>) -> Run {
    runs.sort_by(|a, b| a.tasks_per_s.total_cmp(&b.tasks_per_s));
    runs[runs.len() / 2].clone()
}

fn print_breakdown(label: &str, r: &Run, n: u64) {
    eprintln!(
        "    {label}: BEGIN + COMMIT {:.4} per task ({} transactions)",
        2.0 * r.transactions as f64 / n as f64,
        r.transactions
    );
    for (k, c) in &r.by {
        eprintln!("    {label}: {:.4}  {k}", *c as f64 / n as f64);
    }
}

// ---------------------------------------------------------------------------------------------

/// `--sqlite`: everything above on the file at `path` (deleted first and at the end unless
/// `keep`), printed, and the figures written to `out` as JSON.
pub(crate) async fn run(sz: &Sizes, path: &Path, out: &str, keep: bool) -> Res<()> {
    // Counting subscriber for sqlx's statement events (disabled outside measurements).
    tracing::subscriber::set_global_default(StatementCounter)?;
    remove_db(path);
    let opts = taskq::sqlite::tune(SqliteConnectOptions::new().filename(path));
    let pool = SqlitePoolOptions::new()
        .max_connections(40)
        .connect_with(opts)
        .await?;
    let version: String = sqlx::query_scalar("SELECT sqlite_version()")
        .fetch_one(&pool)
        .await?;
    let machine = machine();
    eprintln!(
        "machine: {machine}\nSQLite {version}, file {} (WAL, synchronous = NORMAL, busy timeout {:?})",
        path.display(),
        taskq::sqlite::DEFAULT_BUSY_TIMEOUT
    );
    taskq::migrate(&pool).await?;
    let result = measure(sz, &pool, &machine, &version, out).await;
    pool.close().await;
    if keep {
        eprintln!("kept {}", path.display());
    } else {
        remove_db(path);
    }
    result
}

async fn measure(
    sz: &Sizes,
    pool: &SqlitePool,
    machine: &serde_json::Value,
    version: &str,
    out: &str,
) -> Res<()> {
    let conns = [1usize, 4, 16];
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };

    eprintln!(
        "[1/3] raw BEGIN IMMEDIATE + INSERT + COMMIT vs taskq::sqlite::begin + enqueue_tx + COMMIT (interleaved)"
    );
    let mut enqueue = Vec::new();
    for &c in &conns {
        let (raw, tq) = insert_rates(pool, c, sz.insert_secs).await?;
        eprintln!(
            "  {c:>2} conns: raw {raw:.0} tx/s, enqueue_tx {tq:.0} tx/s, ratio {:.3}",
            ratio(tq, raw)
        );
        enqueue.push(
            json!({"conns": c, "raw_tx_per_s": raw, "enqueue_tx_per_s": tq,
            "ratio": ratio(tq, raw)}),
        );
    }
    let (raw_st, tq_st) = insert_statements(pool, 1000).await?;
    eprintln!(
        "  statements per transaction (1,000 each, + BEGIN and COMMIT): raw {:.2}, enqueue_tx {:.2}",
        raw_st.total as f64 / 1000.0 + 2.0,
        tq_st.total as f64 / 1000.0 + 2.0
    );

    eprintln!(
        "[2/3] drains of {} tasks: raw batched loop ({RAW_BATCH} per claim) and taskq worker, alternated {} times",
        sz.drain, sz.reps
    );
    let mut drains = Vec::new();
    for &c in &conns {
        let (mut raws, mut tqs) = (Vec::new(), Vec::new());
        for _ in 0..sz.reps {
            let r = raw_loop(pool, c, sz.drain).await?;
            eprintln!(
                "  raw   {c:>2} conns: {:.0} rows/s, {:.3} stmts/task, {} claims",
                r.tasks_per_s, r.statements_per_task, r.claims
            );
            raws.push(r);
            let d = drain(pool, c, sz.drain).await?;
            eprintln!(
                "  taskq c={c:>2}: {:.0} tasks/s, {:.3} stmts/task, {} claims, {} flushes, {:.3} ms CPU/task",
                d.tasks_per_s, d.statements_per_task, d.claims, d.flushes, d.cpu_ms_per_task
            );
            tqs.push(d);
        }
        let (r, d) = (median(raws), median(tqs));
        eprintln!(
            "  c={c:>2}: raw median {:.0} rows/s, taskq median {:.0} tasks/s, ratio {:.3}",
            r.tasks_per_s,
            d.tasks_per_s,
            ratio(d.tasks_per_s, r.tasks_per_s)
        );
        drains.push((c, r, d));
    }

    eprintln!("[3/3] statements per task, by statement (median runs)");
    for (c, r, d) in &drains {
        eprintln!("  c={c}:");
        print_breakdown("raw  ", r, sz.drain);
        print_breakdown("taskq", d, sz.drain);
    }

    let best_raw = drains
        .iter()
        .map(|(_, r, _)| r.tasks_per_s)
        .fold(0.0, f64::max);
    let (_, r16, d16) = drains.last().expect("three concurrencies");
    eprintln!(
        "\ntargets: enqueue_tx / raw insert {} (≥ 0.9); drain c=16 / raw loop 16 conns {:.3}, / best raw loop {:.3} (≥ 0.5)",
        enqueue
            .iter()
            .map(|e| format!("{:.3}", e["ratio"].as_f64().unwrap_or(0.0)))
            .collect::<Vec<_>>()
            .join(" / "),
        ratio(d16.tasks_per_s, r16.tasks_per_s),
        ratio(d16.tasks_per_s, best_raw)
    );
    let report = json!({
        "backend": "sqlite",
        "sqlite_version": version,
        "machine": machine,
        "enqueue": enqueue,
        "enqueue_statements_per_tx": {
            "raw": raw_st.total as f64 / 1000.0 + 2.0,
            "enqueue_tx": tq_st.total as f64 / 1000.0 + 2.0,
        },
        "drains": drains.iter().map(|(c, r, d)| json!({
            "concurrency": c,
            "raw": r,
            "taskq": d,
            "ratio": ratio(d.tasks_per_s, r.tasks_per_s),
            "taskq_by_statement": d.by.iter().map(|(k, v)| json!({"statement": k, "per_task": *v as f64 / sz.drain as f64})).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    });
    if let Some(dir) = Path::new(out).parent() {
        std::fs::create_dir_all(dir).ok();
    }
    std::fs::write(out, serde_json::to_string_pretty(&report)?)?;
    eprintln!("wrote {out}");
    Ok(())
}
