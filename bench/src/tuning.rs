//! Short runs for tuning, printed and written nowhere: `--targets-only` and `--limits`.

use sqlx::MySqlPool;

use crate::Res;
use crate::args::Sizes;
use crate::drain::{Drain, drain_once, median_by_rate};
use crate::enqueue::insert_rates;
use crate::fleet::drain_fleet;
use crate::raw_claim::{ClaimShape, raw_claim_loop};
use crate::task::QUEUE;

/// `--targets-only`: the two measurements whose ratio targets are tight at 16 connections,
/// printed and not written anywhere. A tuning aid; the full run is the measurement.
pub async fn targets_only(sz: &Sizes, pool: &MySqlPool) -> Res<()> {
    for c in [1, 16] {
        let (raw, tq) = insert_rates(pool, c, sz.insert_secs).await?;
        eprintln!(
            "{c} conns: raw INSERT+COMMIT {raw:.0} tx/s, enqueue_tx {tq:.0} tx/s, ratio {:.3}",
            tq / raw
        );
    }
    let raw_loop = raw_claim_loop(pool, 16, sz.drain, 32, ClaimShape::LockingScan).await?;
    let raw_two = raw_claim_loop(pool, 16, sz.drain, 32, ClaimShape::TwoStep).await?;
    eprintln!("raw loop, two-step claim, 16 conns: {raw_two:.0} rows/s");
    let mut runs = Vec::new();
    for _ in 0..sz.reps {
        let d = drain_once(pool, 16, sz.drain, false).await?;
        eprintln!(
            "  drain c=16: {:.0} tasks/s, {:.3} stmts/task, {} claims, {} flushes",
            d.tasks_per_s, d.statements_per_task, d.claim_queries, d.ack_flushes
        );
        runs.push(d);
    }
    let d = median_by_rate(runs);
    eprintln!(
        "raw loop 16 conns {raw_loop:.0} rows/s, drain c=16 median {:.0} tasks/s, ratio {:.3}",
        d.tasks_per_s,
        d.tasks_per_s / raw_loop
    );
    let fleet = drain_fleet(pool, 4, 4, sz.drain).await?;
    eprintln!(
        "4 workers x concurrency 4: {:.0} tasks/s, {:.3} stmts/task, {:.1} tasks per claim",
        fleet.tasks_per_s, fleet.statements_per_task, fleet.tasks_per_claim
    );
    Ok(())
}

/// Drains at concurrency 16 of the bench queue without a limit, with a concurrency limit of
/// 1000 (the limited claim path, never binding) and with a limit of 8 (binding), interleaved
/// `reps` times; prints each and the medians.
pub async fn limits_only(sz: &Sizes, pool: &MySqlPool) -> Res<()> {
    let client = taskq::Client::new(pool.clone());
    let cases: [(&str, Option<u32>); 3] = [
        ("unlimited", None),
        ("limit 1000", Some(1000)),
        ("limit 8", Some(8)),
    ];
    let mut results: Vec<Vec<Drain>> = cases.iter().map(|_| Vec::new()).collect();
    for _ in 0..sz.reps {
        for (i, (label, limit)) in cases.iter().enumerate() {
            client.set_queue_limit(QUEUE, *limit).await?;
            let d = drain_once(pool, 16, sz.drain, false).await?;
            eprintln!(
                "  {label:>10}: {:.0} tasks/s, {:.3} stmts/task, {} claims",
                d.tasks_per_s, d.statements_per_task, d.claim_queries
            );
            results[i].push(d);
        }
    }
    client.set_queue_limit(QUEUE, None).await?;
    for ((label, _), runs) in cases.iter().zip(results) {
        let d = median_by_rate(runs);
        println!(
            "drain c=16, {label}: median {:.0} tasks/s, {:.3} stmts/task",
            d.tasks_per_s, d.statements_per_task
        );
    }
    Ok(())
}
