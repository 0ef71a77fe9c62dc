//! Unknown names (`--unknown-names`, and step 8 of the full run): pending tasks whose name no
//! worker handles, at the head of the queue.

use std::sync::atomic::Ordering;
use std::time::Instant;

use sqlx::types::chrono::NaiveDateTime;
use sqlx::{Connection, MySqlPool, Row};

use crate::Res;
use crate::claim_metrics::{CLAIMS, CLAIMS_ON, ClaimRecorder, percentiles_ms};
use crate::drain::{Drain, drain_once, median_by_rate};
use crate::explain::explain_lines;
use crate::report::fmt_rate;
use crate::scratch::{preload, reset};
use crate::task::{QUEUE, TASK};

/// Pending tasks of a name no worker knows, put at the head of the queue.
pub const UNKNOWN: u64 = 10_000;
/// Known tasks drained behind them.
const UNKNOWN_KNOWN: u64 = 10_000;
/// Name of the tasks nobody handles.
const UNKNOWN_TASK: &str = "bench_unknown";
/// Timed repetitions of a single-connection read.
const UNKNOWN_REPS: usize = 200;

/// taskq's candidate read from the head of the queue, as in
/// `taskq-mysql/src/claim_raw.rs` (`claim_by_candidates`), with 32 candidates: what a
/// worker at concurrency 16 reads.
const HEAD_READ: &str = "SELECT id, priority, run_at
     FROM taskq_tasks
     WHERE state = 'pending' AND queue = ? AND run_at <= UTC_TIMESTAMP(6)
       AND JSON_CONTAINS(?, JSON_QUOTE(name))
     ORDER BY priority, run_at, id
     LIMIT ?";

/// taskq's candidate read past a position (`claim_by_candidates` with `after`).
const SEEK_READ: &str = "SELECT id, priority, run_at
     FROM taskq_tasks
     WHERE state = 'pending' AND queue = ? AND run_at <= UTC_TIMESTAMP(6)
       AND (priority > ?
            OR (priority = ? AND run_at > ?)
            OR (priority = ? AND run_at = ? AND id > ?))
       AND JSON_CONTAINS(?, JSON_QUOTE(name))
     ORDER BY priority, run_at, id
     LIMIT ?";

/// Times [`SEEK_READ`] past the 5,000th known task [`UNKNOWN_REPS`] times on `conn`; durations
/// in seconds, and the plan (`EXPLAIN` type and key length).
async fn time_seek_reads(conn: &mut sqlx::MySqlConnection) -> Res<(Vec<f64>, String)> {
    let (p, r, id): (i16, NaiveDateTime, u64) = sqlx::query_as(
        "SELECT priority, run_at, id FROM taskq_tasks WHERE name = ?
         ORDER BY priority, run_at, id LIMIT 1 OFFSET 5000",
    )
    .bind(TASK)
    .fetch_one(&mut *conn)
    .await?;
    let names = format!("[\"{TASK}\"]");
    // The plan of this execution, from `EXPLAIN` of the prepared statement with the same values.
    let plan = sqlx::query(sqlx::AssertSqlSafe(format!("EXPLAIN {SEEK_READ}")))
        .bind(QUEUE)
        .bind(p)
        .bind(p)
        .bind(r)
        .bind(p)
        .bind(r)
        .bind(id)
        .bind(&names)
        .bind(32u32)
        .fetch_one(&mut *conn)
        .await?;
    let plan = format!(
        "{} {}",
        plan.try_get::<String, _>("type").unwrap_or_default(),
        plan.try_get::<String, _>("key_len").unwrap_or_default()
    );
    let mut took = Vec::with_capacity(UNKNOWN_REPS);
    for _ in 0..UNKNOWN_REPS {
        let t = Instant::now();
        let rows = sqlx::query(SEEK_READ)
            .bind(QUEUE)
            .bind(p)
            .bind(p)
            .bind(r)
            .bind(p)
            .bind(r)
            .bind(id)
            .bind(&names)
            .bind(32u32)
            .fetch_all(&mut *conn)
            .await?;
        took.push(t.elapsed().as_secs_f64());
        if rows.len() != 32 {
            return Err(format!("seek read returned {} rows", rows.len()).into());
        }
    }
    Ok((took, plan))
}

/// One case of the unknown-names scenario: `unknown` pending tasks of [`UNKNOWN_TASK`] at the
/// head of the queue (or none).
#[derive(Clone, serde::Serialize)]
pub struct UnknownCase {
    unknown: u64,
    /// The head candidate read with [`UNKNOWN_KNOWN`] known tasks behind the unknown ones, on
    /// one connection (it returns 32 known rows): p50 / p99 / max, ms.
    head_read_ms: (f64, f64, f64),
    /// One head claim that finds nothing (only the unknown tasks are pending): `BEGIN`, the
    /// candidate read, `COMMIT` on one READ COMMITTED connection, as a polling worker does it:
    /// p50 / p99 / max, ms.
    idle_claim_ms: (f64, f64, f64),
    /// Drain of the known tasks by one worker at concurrency 16 (median of 3 by tasks/s).
    drain: Drain,
    /// Claim transactions of that drain (`taskq_claim_duration_seconds`): p50 / p99 / max, ms.
    drain_claim_ms: (f64, f64, f64),
    /// The candidate read past a position (the 5,000th known task), as a worker draining a
    /// backlog issues it, on one connection: p50 / p99 / max, ms.
    seek_read_ms: (f64, f64, f64),
    /// The seek read's plan in each repetition (`EXPLAIN` of the prepared statement: type and
    /// key length): `range 277` seeks on the whole key; `ref 259` walks from the head of the
    /// queue, checking the seek position entry by entry.
    seek_plans: Vec<String>,
    /// InnoDB buffer pool page requests per head candidate read (`Innodb_buffer_pool_read_requests`,
    /// a global counter: median over the repetitions). A row the read steps over costs a
    /// primary-key lookup (a few pages) unless the index covers the read.
    head_read_pages: f64,
    /// Unknown tasks still pending and never attempted after the drains.
    unknown_untouched: u64,
    /// `EXPLAIN` of the head candidate read.
    explain: Vec<String>,
}

/// Inserts `n` (at most 100,000) pending tasks named [`UNKNOWN_TASK`] in the bench queue, due an
/// hour ago: they sort before anything enqueued now.
async fn insert_unknown(pool: &MySqlPool, n: u64) -> Res<()> {
    sqlx::query("CREATE TABLE IF NOT EXISTS bench_digits (d INT PRIMARY KEY)")
        .execute(pool)
        .await?;
    sqlx::query("INSERT IGNORE INTO bench_digits VALUES (0),(1),(2),(3),(4),(5),(6),(7),(8),(9)")
        .execute(pool)
        .await?;
    sqlx::query(
        "INSERT INTO taskq_tasks (queue, name, payload, state, priority, max_attempts, run_at,
             created_at, updated_at)
         SELECT ?, ?, '{}', 'pending', 0, 20, UTC_TIMESTAMP(6) - INTERVAL 1 HOUR,
             UTC_TIMESTAMP(6), UTC_TIMESTAMP(6)
         FROM (SELECT a.d + 10 * b.d + 100 * c.d + 1000 * e.d + 10000 * f.d AS n
               FROM bench_digits a, bench_digits b, bench_digits c, bench_digits e,
                    bench_digits f) s
         WHERE s.n < ?
         ORDER BY s.n",
    )
    .bind(QUEUE)
    .bind(UNKNOWN_TASK)
    .bind(n)
    .execute(pool)
    .await?;
    Ok(())
}

/// The server's `Innodb_buffer_pool_read_requests` (global).
async fn buffer_pool_requests(pool: &MySqlPool) -> Res<i64> {
    let (_, v): (String, String) =
        sqlx::query_as("SHOW GLOBAL STATUS LIKE 'Innodb_buffer_pool_read_requests'")
            .fetch_one(pool)
            .await?;
    Ok(v.parse()?)
}

/// Times [`HEAD_READ`] (for the known name, 32 candidates) [`UNKNOWN_REPS`] times on `conn`,
/// alone or as a whole empty claim (`BEGIN`, the read, `COMMIT`); durations in seconds.
async fn time_head_reads(conn: &mut sqlx::MySqlConnection, in_transaction: bool) -> Res<Vec<f64>> {
    let names = format!("[\"{TASK}\"]");
    let mut took = Vec::with_capacity(UNKNOWN_REPS);
    for _ in 0..UNKNOWN_REPS {
        let t = Instant::now();
        if in_transaction {
            let mut tx = conn.begin().await?;
            sqlx::query(HEAD_READ)
                .bind(QUEUE)
                .bind(&names)
                .bind(32u32)
                .fetch_all(&mut *tx)
                .await?;
            tx.commit().await?;
        } else {
            sqlx::query(HEAD_READ)
                .bind(QUEUE)
                .bind(&names)
                .bind(32u32)
                .fetch_all(&mut *conn)
                .await?;
        }
        took.push(t.elapsed().as_secs_f64());
    }
    Ok(took)
}

/// Everything measured for one case of the unknown-names scenario, over its repetitions.
#[derive(Default)]
struct UnknownRuns {
    idle: Vec<f64>,
    reads: Vec<f64>,
    pages: Vec<f64>,
    seeks: Vec<f64>,
    seek_plans: Vec<String>,
    claims: Vec<f64>,
    drains: Vec<Drain>,
    untouched: Option<u64>,
    explain: Vec<String>,
}

/// One repetition of one case: `unknown` pending tasks no worker knows at the head of the
/// queue (or none). Idle head claims with only those pending, then the head candidate read
/// over [`UNKNOWN_KNOWN`] known tasks behind them, then a drain of the known tasks at
/// concurrency 16; `conn` is a READ COMMITTED connection.
async fn unknown_rep(
    pool: &MySqlPool,
    conn: &mut sqlx::MySqlConnection,
    unknown: u64,
    acc: &mut UnknownRuns,
) -> Res<()> {
    reset(pool).await?;
    insert_unknown(pool, unknown).await?;
    sqlx::query("ANALYZE TABLE taskq_tasks")
        .execute(pool)
        .await?;
    time_head_reads(conn, true).await?; // warm-up
    acc.idle.extend(time_head_reads(conn, true).await?);
    preload(pool, UNKNOWN_KNOWN).await?;
    sqlx::query("ANALYZE TABLE taskq_tasks")
        .execute(pool)
        .await?;
    if acc.explain.is_empty() {
        // As text with the values inlined (what `EXPLAIN` in a client shows): MariaDB 10.11
        // prints the prepared form's plan as `range` without `Using index` even when the
        // read is index-only, which the page requests below show.
        let sql = HEAD_READ
            .replacen('?', &format!("'{QUEUE}'"), 1)
            .replacen('?', &format!("'[\"{TASK}\"]'"), 1)
            .replacen('?', "32", 1);
        let rows = sqlx::raw_sql(sqlx::AssertSqlSafe(format!("EXPLAIN {sql}")))
            .fetch_all(pool)
            .await?;
        acc.explain = explain_lines(&rows);
    }
    let pages0 = buffer_pool_requests(pool).await?;
    acc.reads.extend(time_head_reads(conn, false).await?);
    let pages = buffer_pool_requests(pool).await? - pages0;
    acc.pages.push(pages as f64 / UNKNOWN_REPS as f64);
    let (seeks, plan) = time_seek_reads(conn).await?;
    acc.seeks.extend(seeks);
    acc.seek_plans.push(plan);
    CLAIMS.lock().unwrap().clear();
    CLAIMS_ON.store(true, Ordering::Relaxed);
    let d = drain_once(pool, 16, UNKNOWN_KNOWN, true).await;
    CLAIMS_ON.store(false, Ordering::Relaxed);
    let d = d?;
    let took = std::mem::take(&mut *CLAIMS.lock().unwrap());
    let mut sorted = took.clone();
    sorted.sort_by(f64::total_cmp);
    eprintln!(
        "    claims: total {:.0} ms of {:.0} ms; slowest 40 {:.0} ms; over 5 ms: {}",
        took.iter().sum::<f64>() * 1000.0,
        d.secs * 1000.0,
        sorted.iter().rev().take(40).sum::<f64>() * 1000.0,
        took.iter().filter(|&&t| t > 0.005).count()
    );
    acc.claims.extend(took);
    let left: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM taskq_tasks WHERE name = ? AND state = 'pending' AND attempt = 0",
    )
    .bind(UNKNOWN_TASK)
    .fetch_one(pool)
    .await?;
    acc.untouched = Some(acc.untouched.unwrap_or(u64::MAX).min(left as u64));
    eprintln!(
        "  {unknown:>5} unknown: drain {:.0} tasks/s, {:.3} stmts/task, {} claims, \
         {:.1} index entries read per task",
        d.tasks_per_s,
        d.statements_per_task,
        d.claim_queries,
        d.com_per_task
            .get("Handler_read_next")
            .copied()
            .unwrap_or(0.0)
    );
    acc.drains.push(d);
    Ok(())
}

/// The unknown-names scenario: the same measurements without and with [`UNKNOWN`] unknown
/// tasks at the head of the queue. Returns both cases and a printable summary.
pub async fn unknown_names(pool: &MySqlPool) -> Res<(Vec<UnknownCase>, String)> {
    // Installed once; it only keeps values while CLAIMS_ON is set.
    let _ = metrics::set_global_recorder(ClaimRecorder);
    let mut conn = pool.acquire().await?;
    sqlx::query("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        .execute(&mut *conn)
        .await?;
    // The two cases alternate, so that drift in the machine's speed falls on both.
    let sizes = [0, UNKNOWN];
    let mut runs: [UnknownRuns; 2] = Default::default();
    for _ in 0..3 {
        for (acc, &unknown) in runs.iter_mut().zip(&sizes) {
            unknown_rep(pool, &mut conn, unknown, acc).await?;
        }
    }
    let cases: Vec<UnknownCase> = runs
        .into_iter()
        .zip(sizes)
        .map(|(r, unknown)| UnknownCase {
            unknown,
            head_read_ms: percentiles_ms(r.reads),
            seek_read_ms: percentiles_ms(r.seeks),
            seek_plans: r.seek_plans,
            idle_claim_ms: percentiles_ms(r.idle),
            drain: median_by_rate(r.drains),
            drain_claim_ms: percentiles_ms(r.claims),
            head_read_pages: {
                let mut p = r.pages;
                p.sort_by(f64::total_cmp);
                p[p.len() / 2]
            },
            unknown_untouched: r.untouched.unwrap_or(0),
            explain: r.explain,
        })
        .collect();
    let ms = |t: (f64, f64, f64)| format!("{:.2} / {:.2} / {:.2}", t.0, t.1, t.2);
    let mut out = format!(
        "\nunknown names: {UNKNOWN} pending tasks no worker knows at the head of the queue, \
         {UNKNOWN_KNOWN} known tasks behind them\n\n\
         | measurement | no unknown tasks | {UNKNOWN} unknown tasks |\n|---|---|---|\n"
    );
    let row = |name: &str, f: &dyn Fn(&UnknownCase) -> String| {
        format!("| {name} | {} | {} |\n", f(&cases[0]), f(&cases[1]))
    };
    out += &row("drain at concurrency 16, tasks/s (median of 3)", &|c| {
        fmt_rate(c.drain.tasks_per_s)
    });
    out += &row("drain: SQL statements per task", &|c| {
        format!("{:.3}", c.drain.statements_per_task)
    });
    out += &row("drain: claim transaction p50 / p99 / max, ms", &|c| {
        ms(c.drain_claim_ms)
    });
    out += &row(
        "head candidate read (32 known rows), p50 / p99 / max, ms",
        &|c| ms(c.head_read_ms),
    );
    out += &row(
        "seek candidate read (past the 5,000th known task), p50 / p99 / max, ms",
        &|c| ms(c.seek_read_ms),
    );
    out += &row("seek candidate read: plan in each repetition", &|c| {
        c.seek_plans.join(", ")
    });
    out += &row("head candidate read: buffer pool page requests", &|c| {
        format!("{:.0}", c.head_read_pages)
    });
    out += &row(
        "idle head claim (finds nothing), p50 / p99 / max, ms",
        &|c| ms(c.idle_claim_ms),
    );
    out += &row("unknown tasks left pending, never attempted", &|c| {
        c.unknown_untouched.to_string()
    });
    out += "\nEXPLAIN of the head candidate read, with the unknown tasks:\n";
    for l in &cases[1].explain {
        out += &format!("    {l}\n");
    }
    Ok((cases, out))
}
