//! The full run: every measurement (steps 1 to 8), then the summary table with the targets,
//! the JSON report (`--out`) and the chart (`--svg`).

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sqlx::MySqlPool;

use crate::Res;
use crate::args::{Opts, Sizes};
use crate::drain::{Drain, drain_once, median_by_rate, million_drain};
use crate::enqueue::{enqueue_many_rate, insert_rates};
use crate::explain::explain_claim;
use crate::fleet::drain_fleet;
use crate::latency::latency;
use crate::raw_claim::{ClaimShape, raw_claim_loop};
use crate::report::{Bar, fmt_rate, machine, server_settings, svg};
use crate::scratch::{bulk_insert, reset};
use crate::unknown::{UNKNOWN, unknown_names};

/// The full run: enqueue, claim loops, drains, latency, backlog, memory and unknown names,
/// then the summary table with the targets, the JSON report and the chart.
pub async fn run(opts: &Opts, sz: &Sizes, pool: &MySqlPool) -> Res<()> {
    let conns = [1usize, 4, 16];
    let machine = machine();
    let settings = server_settings(pool).await?;
    eprintln!("machine: {machine}\nserver: {settings}");

    eprintln!("[1/8] raw INSERT+COMMIT and enqueue_tx");
    let mut raw_insert = Vec::new();
    let mut enqueue_tx = Vec::new();
    for &c in &conns {
        let (raw, tq) = insert_rates(pool, c, sz.insert_secs).await?;
        raw_insert.push(raw);
        enqueue_tx.push(tq);
        eprintln!(
            "  {c:>2} conns: raw {:.0} tx/s, enqueue_tx {:.0} tx/s",
            raw_insert.last().unwrap(),
            enqueue_tx.last().unwrap()
        );
    }

    eprintln!("[2/8] enqueue_many");
    let many_5000 = enqueue_many_rate(pool, sz.many, 5000).await?;
    let many_1000 = enqueue_many_rate(pool, sz.many, 1000).await?;
    let many_100 = enqueue_many_rate(pool, sz.many / 5, 100).await?;
    eprintln!("  5000/tx: {many_5000:.0}, 1000/tx: {many_1000:.0}, 100/tx: {many_100:.0} tasks/s");

    eprintln!("[3/8] raw batched SKIP LOCKED loops (32 rows per claim)");
    let mut raw_loop = Vec::new();
    let mut raw_two = Vec::new();
    for &c in &conns {
        raw_loop.push(raw_claim_loop(pool, c, sz.drain, 32, ClaimShape::LockingScan).await?);
        raw_two.push(raw_claim_loop(pool, c, sz.drain, 32, ClaimShape::TwoStep).await?);
        eprintln!(
            "  {c:>2} conns: locking scan {:.0} rows/s, two-step {:.0} rows/s",
            raw_loop.last().unwrap(),
            raw_two.last().unwrap()
        );
    }

    eprintln!("[4/8] drain {} tasks, median of {}", sz.drain, sz.reps);
    let mut drains = Vec::new();
    for c in [1usize, 4, 16, 32] {
        let mut runs = Vec::new();
        for _ in 0..sz.reps {
            let d = drain_once(pool, c, sz.drain, false).await?;
            eprintln!(
                "  c={c:>2}: {:.0} tasks/s, {:.3} stmts/task, {:.3} ms CPU/task, peak RSS {} MiB",
                d.tasks_per_s,
                d.statements_per_task,
                d.cpu_ms_per_task,
                d.peak_rss_kib / 1024
            );
            runs.push(d);
        }
        drains.push(median_by_rate(runs));
    }
    let fleet = drain_fleet(pool, 4, 4, sz.drain).await?;
    eprintln!(
        "  4 workers x concurrency 4: {:.0} tasks/s, {:.3} stmts/task, {:.1} tasks per claim",
        fleet.tasks_per_s, fleet.statements_per_task, fleet.tasks_per_claim
    );

    eprintln!("[5/8] pickup latency");
    let interval = Duration::from_millis(10);
    let lat_wake = latency(pool, true, sz.latency_tasks, interval).await?;
    let lat_poll = latency(pool, false, sz.latency_tasks, interval).await?;
    let lat_sparse = latency(
        pool,
        false,
        sz.latency_tasks / 5,
        Duration::from_millis(200),
    )
    .await?;
    for l in [&lat_wake, &lat_poll, &lat_sparse] {
        eprintln!(
            "  wake={} every {} ms: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            l.wake, l.interval_ms, l.p50_ms, l.p99_ms, l.max_ms
        );
    }

    eprintln!("[6/8] backlog: {} pending, 1% due", sz.backlog);
    reset(pool).await?;
    let t = Instant::now();
    bulk_insert(pool, sz.backlog, 100).await?;
    let backlog_insert_s = t.elapsed().as_secs_f64();
    sqlx::query("ANALYZE TABLE taskq_tasks")
        .execute(pool)
        .await?;
    let explain = explain_claim(pool).await?;
    for l in &explain {
        eprintln!("  {l}");
    }
    let due = sz.backlog / 100;
    let backlog = drain_once(pool, 16, due, true).await?;
    eprintln!(
        "  due drain: {:.0} tasks/s, {:.3} stmts/task (bulk insert took {backlog_insert_s:.1} s)",
        backlog.tasks_per_s, backlog.statements_per_task
    );

    let million = if opts.million {
        eprintln!("[7/8] memory over a {}-task drain", sz.million);
        let (d, samples) = million_drain(pool, sz.million).await?;
        eprintln!(
            "  {:.0} tasks/s, {:.3} stmts/task, RSS samples: {}",
            d.tasks_per_s,
            d.statements_per_task,
            samples.len()
        );
        Some((d, samples))
    } else {
        eprintln!("[7/8] memory drain skipped (--skip-million)");
        None
    };

    eprintln!("[8/8] unknown names: {UNKNOWN} pending tasks no worker knows at the head");
    let (unknown, unknown_out) = unknown_names(pool).await?;

    // ---- table
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
    let mut out = String::new();
    out += "\n| measurement | 1 conn | 4 conns | 16 conns | 32 |\n|---|---|---|---|---|\n";
    let line = |name: &str, v: &[f64]| {
        let mut s = format!("| {name} |");
        for i in 0..4 {
            s += &match v.get(i) {
                Some(x) => format!(" {} |", fmt_rate(*x)),
                None => " — |".into(),
            };
        }
        s + "\n"
    };
    out += &line("raw INSERT+COMMIT, tx/s", &raw_insert);
    out += &line("taskq enqueue_tx + COMMIT, tx/s", &enqueue_tx);
    out += &format!(
        "| enqueue_tx / raw | {:.2} | {:.2} | {:.2} | — |\n",
        ratio(enqueue_tx[0], raw_insert[0]),
        ratio(enqueue_tx[1], raw_insert[1]),
        ratio(enqueue_tx[2], raw_insert[2])
    );
    out += &line("raw batched SKIP LOCKED loop (32/claim), rows/s", &raw_loop);
    out += &line(
        "raw batched loop, taskq's two-step claim (32/claim), rows/s",
        &raw_two,
    );
    let drain_rates: Vec<f64> = drains.iter().map(|d| d.tasks_per_s).collect();
    out += &line("taskq drain (concurrency 1/4/16/32), tasks/s", &drain_rates);
    out += &format!(
        "| drain / raw batched loop (same conc.) | {:.2} | {:.2} | {:.2} | — |\n",
        ratio(drain_rates[0], raw_loop[0]),
        ratio(drain_rates[1], raw_loop[1]),
        ratio(drain_rates[2], raw_loop[2])
    );
    out += &format!(
        "| drain / raw two-step loop (same conc.) | {:.2} | {:.2} | {:.2} | — |\n",
        ratio(drain_rates[0], raw_two[0]),
        ratio(drain_rates[1], raw_two[1]),
        ratio(drain_rates[2], raw_two[2])
    );
    // One row per drain figure: the concurrency levels side by side.
    let drain_row = |name: &str, cell: &dyn Fn(&Drain) -> String| {
        let cells: Vec<String> = drains.iter().map(cell).collect();
        format!("| {name} | {} |\n", cells.join(" | "))
    };
    out += &drain_row("drain: SQL statements per task", &|d| {
        format!("{:.3}", d.statements_per_task)
    });
    out += &drain_row("drain: CPU ms per task (bench process)", &|d| {
        format!("{:.3}", d.cpu_ms_per_task)
    });
    out += &drain_row("drain: peak RSS, MiB", &|d| {
        format!("{:.1}", d.peak_rss_kib as f64 / 1024.0)
    });
    out += &format!(
        "\nfleet: {} workers at concurrency {} on one queue: {} tasks/s, {:.3} statements/task, \
         {:.1} tasks per claim\n",
        fleet.workers,
        fleet.concurrency,
        fmt_rate(fleet.tasks_per_s),
        fleet.statements_per_task,
        fleet.tasks_per_claim
    );
    out += &format!(
        "enqueue_many: {} tasks/s (5,000 per transaction), {} tasks/s (1,000 per transaction), \
         {} tasks/s (100 per transaction)\n",
        fmt_rate(many_5000),
        fmt_rate(many_1000),
        fmt_rate(many_100)
    );
    out += &format!(
        "pickup latency, one task every {} ms: wake-up p50 {:.2} ms / p99 {:.2} ms; \
         polling p50 {:.2} ms / p99 {:.2} ms; polling at one task every {} ms: \
         p50 {:.2} ms / p99 {:.2} ms (ceiling 1000 ms)\n",
        lat_wake.interval_ms,
        lat_wake.p50_ms,
        lat_wake.p99_ms,
        lat_poll.p50_ms,
        lat_poll.p99_ms,
        lat_sparse.interval_ms,
        lat_sparse.p50_ms,
        lat_sparse.p99_ms
    );
    out += &format!(
        "backlog {} pending, 1% due: due drain {} tasks/s at concurrency 16, {:.3} statements/task\n",
        sz.backlog,
        fmt_rate(backlog.tasks_per_s),
        backlog.statements_per_task
    );
    let mut mem_json = Value::Null;
    if let Some((d, samples)) = &million {
        let n = samples.len();
        let early = samples
            .iter()
            .find(|s| s.done >= d.tasks / 10)
            .map_or(0, |s| s.rss_kib);
        let late_max = samples[n / 2..]
            .iter()
            .map(|s| s.rss_kib)
            .max()
            .unwrap_or(0);
        let first_half_max = samples[..n / 2]
            .iter()
            .map(|s| s.rss_kib)
            .max()
            .unwrap_or(0);
        out += &format!(
            "{}-task drain at concurrency 16: {} tasks/s, {:.3} statements/task; RSS at 10%: {:.1} MiB, \
             max of first half {:.1} MiB, max of second half {:.1} MiB, end {:.1} MiB\n",
            d.tasks,
            fmt_rate(d.tasks_per_s),
            d.statements_per_task,
            early as f64 / 1024.0,
            first_half_max as f64 / 1024.0,
            late_max as f64 / 1024.0,
            samples.last().map_or(0, |s| s.rss_kib) as f64 / 1024.0
        );
        mem_json = json!({ "drain": d, "rss_samples": samples,
            "rss_at_10pct_kib": early, "first_half_max_kib": first_half_max,
            "second_half_max_kib": late_max });
    }
    out += &unknown_out;
    out += "\nclaim EXPLAIN (backlog):\n";
    for l in &explain {
        out += &format!("    {l}\n");
    }
    // Targets.
    let t_drain = ratio(drains[2].tasks_per_s, raw_loop[2]);
    out += "\ntargets:\n";
    let mut check = |ok: bool, what: String| {
        out += &format!("  [{}] {what}\n", if ok { "met" } else { "MISSED" });
    };
    check(
        t_drain >= 0.5,
        format!("drain at concurrency 16 >= 50% of the raw batched loop at 16: {t_drain:.2}"),
    );
    check(
        drains[2].statements_per_task <= 0.5,
        format!(
            "statements per task at concurrency 16 <= 0.5: {:.3}",
            drains[2].statements_per_task
        ),
    );
    for i in 0..3 {
        let r = ratio(enqueue_tx[i], raw_insert[i]);
        check(
            r >= 0.9,
            format!(
                "enqueue_tx overhead <= 10% at {} conns: {:.1}%",
                conns[i],
                (1.0 - r) * 100.0
            ),
        );
    }
    check(
        many_5000.max(many_1000) >= 20_000.0,
        format!(
            "enqueue_many >= 20k tasks/s: {} (5,000/tx), {} (1,000/tx)",
            fmt_rate(many_5000),
            fmt_rate(many_1000)
        ),
    );
    check(
        lat_wake.p50_ms <= 5.0,
        format!("in-process pickup p50 <= 5 ms: {:.2} ms", lat_wake.p50_ms),
    );
    check(
        lat_poll.p99_ms <= 1000.0 && lat_sparse.p99_ms <= 1000.0,
        format!(
            "polled pickup p99 <= poll ceiling (1 s): {:.1} / {:.1} ms",
            lat_poll.p99_ms, lat_sparse.p99_ms
        ),
    );
    if let Some((_, samples)) = &million {
        let n = samples.len();
        let a = samples[..n / 2]
            .iter()
            .map(|s| s.rss_kib)
            .max()
            .unwrap_or(0);
        let b = samples[n / 2..]
            .iter()
            .map(|s| s.rss_kib)
            .max()
            .unwrap_or(0);
        check(
            b as f64 <= a as f64 * 1.10 + 2048.0,
            format!(
                "memory flat over the long drain (second-half max {:.1} MiB vs first-half max {:.1} MiB)",
                b as f64 / 1024.0,
                a as f64 / 1024.0
            ),
        );
    }
    println!("{out}");

    // ---- JSON and chart
    let report = json!({
        "quick": opts.quick,
        "machine": machine,
        "server": settings,
        "raw_insert_commit_tx_per_s": { "1": raw_insert[0], "4": raw_insert[1], "16": raw_insert[2] },
        "enqueue_tx_per_s": { "1": enqueue_tx[0], "4": enqueue_tx[1], "16": enqueue_tx[2] },
        "enqueue_many_tasks_per_s": { "5000_per_tx": many_5000, "1000_per_tx": many_1000, "100_per_tx": many_100 },
        "raw_batched_loop_rows_per_s": { "1": raw_loop[0], "4": raw_loop[1], "16": raw_loop[2] },
        "raw_two_step_loop_rows_per_s": { "1": raw_two[0], "4": raw_two[1], "16": raw_two[2] },
        "drain": drains,
        "fleet_drain": fleet,
        "latency": [lat_wake, lat_poll, lat_sparse],
        "backlog": { "pending": sz.backlog, "due": due, "insert_secs": backlog_insert_s,
                     "drain": backlog, "explain": explain },
        "memory": mem_json,
        "unknown_names": unknown,
        "summary": out,
    });
    let out_file = opts.out.as_deref().unwrap_or("target/bench.json");
    if let Some(dir) = std::path::Path::new(out_file).parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(out_file, serde_json::to_string_pretty(&report)?)?;
    let mut bars = Vec::new();
    for (i, c) in conns.iter().enumerate() {
        bars.push(Bar {
            label: format!("raw INSERT+COMMIT, {c} conn"),
            value: raw_insert[i],
            raw: true,
        });
        bars.push(Bar {
            label: format!("enqueue_tx, {c} conn"),
            value: enqueue_tx[i],
            raw: false,
        });
    }
    bars.push(Bar {
        label: "enqueue_many (5,000/tx)".into(),
        value: many_5000,
        raw: false,
    });
    bars.push(Bar {
        label: "enqueue_many (1,000/tx)".into(),
        value: many_1000,
        raw: false,
    });
    for (i, c) in conns.iter().enumerate() {
        bars.push(Bar {
            label: format!("raw batched claim loop, {c} conn"),
            value: raw_loop[i],
            raw: true,
        });
        bars.push(Bar {
            label: format!("raw two-step claim loop, {c} conn"),
            value: raw_two[i],
            raw: true,
        });
        bars.push(Bar {
            label: format!("taskq drain, concurrency {c}"),
            value: drains[i].tasks_per_s,
            raw: false,
        });
    }
    bars.push(Bar {
        label: "taskq drain, concurrency 32".into(),
        value: drains[3].tasks_per_s,
        raw: false,
    });
    bars.push(Bar {
        label: "drain of 1% due in backlog, c=16".into(),
        value: backlog.tasks_per_s,
        raw: false,
    });
    let lat = vec![
        ("wake-up p50".to_owned(), lat_wake.p50_ms),
        ("wake-up p99".to_owned(), lat_wake.p99_ms),
        (
            format!("polling p50 ({} ms gap)", lat_poll.interval_ms),
            lat_poll.p50_ms,
        ),
        (
            format!("polling p99 ({} ms gap)", lat_poll.interval_ms),
            lat_poll.p99_ms,
        ),
        (
            format!("polling p50 ({} ms gap)", lat_sparse.interval_ms),
            lat_sparse.p50_ms,
        ),
        (
            format!("polling p99 ({} ms gap)", lat_sparse.interval_ms),
            lat_sparse.p99_ms,
        ),
    ];
    let title = format!(
        "taskq benchmark{} — {} CPUs, {}",
        if opts.quick { " (--quick)" } else { "" },
        report["machine"]["cpus"],
        report["server"]["version"].as_str().unwrap_or("?")
    );
    if let Some(dir) = std::path::Path::new(&opts.svg).parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&opts.svg, svg(&title, &bars, &lat))?;
    eprintln!("wrote {out_file} and {}", opts.svg);
    Ok(())
}
