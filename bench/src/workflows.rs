//! `--workflows [n]`: workflow steps next to a plain drain, in the same run (issue 35). Each
//! row drains `n` no-op tasks with one worker at concurrency 16 and counts the server's
//! statements (`Questions`, global: run it on a server nothing else uses):
//! - plain: `n` tasks, enqueued in one transaction (`enqueue_many`);
//! - workflow: one fan-out/fan-in graph of `n` steps (`start`, `n − 2` steps after it, `end`
//!   after all of them), enqueued in one transaction;
//! - batch: one batch of `n − 1` members with an `on_complete` callback (`n` tasks), enqueued in
//!   one transaction; and the gap from the last member's recorded end to the callback's start.
//!
//! Then the latency from a task's recorded end to the start of the next, on the database clock
//! (`finished_at` of one, `attempted_at` of the next), over a chain of 50: as workflow steps
//! (each step after the one before), and as plain tasks each enqueued once the one before has
//! succeeded (autocommit enqueue, the in-process wake).

use std::time::{Duration, Instant};

use sqlx::MySqlPool;
use taskq::batch::Batch;
use taskq::workflow::Workflow;

use crate::Res;
use crate::counters::{server_status, status_delta};
use crate::scratch::reset;
use crate::task::{noop, start_worker};

const CHAIN: u64 = 50;

/// Runs the drains and the chains, and prints two Markdown tables.
pub async fn run(pool: &MySqlPool, n: u64) -> Res<()> {
    let n = n.max(3);
    let mut rows = Vec::new();
    let mut callback_gap_ms = None;
    for kind in [Kind::Plain, Kind::Graph, Kind::Batch] {
        let graph = kind == Kind::Graph;
        reset(pool).await?;
        let before = server_status(pool).await?;
        let mut tx = pool.begin().await?;
        let mut batch = None;
        if kind == Kind::Batch {
            batch = Some(
                Batch::new("bench")
                    .add_all((0..n - 1).map(noop))
                    .on_complete(noop(n - 1))
                    .enqueue_tx(&mut tx)
                    .await?,
            );
        } else if graph {
            let mut wf = Workflow::new("bench").step("start", noop(0));
            let middle: Vec<String> = (1..n - 1).map(|i| format!("s{i}")).collect();
            for (i, m) in middle.iter().enumerate() {
                wf = wf.step_after(m.clone(), noop(i as u64 + 1), ["start"]);
            }
            wf.step_after("end", noop(n - 1), middle)
                .enqueue_tx(&mut tx)
                .await?;
        } else {
            taskq::enqueue::enqueue_many(&mut tx, (0..n).map(noop)).await?;
        }
        tx.commit().await?;
        let mid = server_status(pool).await?;
        let enq = status_delta(&before, &mid);
        tokio::time::sleep(Duration::from_millis(200)).await;
        let before = server_status(pool).await?;
        let start = Instant::now();
        let w = start_worker(pool, 16)?;
        w.wait_for(n, Duration::from_secs(3600)).await?;
        let secs = start.elapsed().as_secs_f64();
        w.stop().await?;
        let after = server_status(pool).await?;
        let drain = status_delta(&before, &after);
        let per = |d: &std::collections::HashMap<String, i64>| {
            d.get("Questions").copied().unwrap_or(0) as f64 / n as f64
        };
        if let Some(b) = &batch {
            let us: i64 = sqlx::query_scalar(
                "SELECT TIMESTAMPDIFF(MICROSECOND, MAX(m.finished_at), MAX(c.attempted_at))
                 FROM taskq_tasks m, taskq_tasks c WHERE m.batch_id = ? AND c.id = ?",
            )
            .bind(b.id.0)
            .bind(b.on_complete.expect("a callback").0)
            .fetch_one(pool)
            .await?;
            callback_gap_ms = Some(us as f64 / 1000.0);
        }
        let label = match kind {
            Kind::Graph => "workflow: start → n − 2 steps → end",
            Kind::Batch => "batch: n − 1 members → on_complete",
            Kind::Plain => "plain tasks",
        };
        eprintln!("{label}: {:.0} tasks/s", n as f64 / secs);
        rows.push(format!(
            "| {label} | {n} | {:.0} | {:.2} | {:.2} |",
            n as f64 / secs,
            per(&enq),
            per(&drain)
        ));
    }
    println!(
        "| drain | tasks | tasks/s (concurrency 16) | statements per task enqueued | statements per task drained |"
    );
    println!("|---|---|---|---|---|");
    for r in rows {
        println!("{r}");
    }
    if let Some(ms) = callback_gap_ms {
        println!();
        println!("batch: last member's end → on_complete's start: {ms:.1} ms");
    }
    println!();
    println!("| chain of {CHAIN} | end → next start, p50 | p90 | max |");
    println!("|---|---|---|---|");
    for graph in [true, false] {
        let gaps = chain(pool, graph).await?;
        let q = |p: f64| gaps[((gaps.len() - 1) as f64 * p).round() as usize];
        println!(
            "| {} | {:.1} ms | {:.1} ms | {:.1} ms |",
            if graph {
                "workflow steps (released by the write-back)"
            } else {
                "plain tasks (enqueued after the one before succeeded)"
            },
            q(0.5),
            q(0.9),
            gaps[gaps.len() - 1]
        );
    }
    Ok(())
}

/// What a drain enqueues.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Plain,
    Graph,
    Batch,
}

/// The gaps (ms, sorted) between a task's `finished_at` and the next one's `attempted_at`.
async fn chain(pool: &MySqlPool, graph: bool) -> Res<Vec<f64>> {
    reset(pool).await?;
    let w = start_worker(pool, 16)?;
    let mut ids = Vec::new();
    if graph {
        let mut wf = Workflow::new("chain").step("c0", noop(0));
        for i in 1..CHAIN {
            wf = wf.step_after(format!("c{i}"), noop(i), [format!("c{}", i - 1)]);
        }
        let done = wf.enqueue(pool).await?;
        ids.extend(done.steps.iter().map(|(_, t)| t.0));
        w.wait_for(CHAIN, Duration::from_secs(600)).await?;
    } else {
        for i in 0..CHAIN {
            ids.push(taskq::Task::enqueue(noop(i), pool).await?.id.0);
            w.wait_for(i + 1, Duration::from_secs(60)).await?;
        }
    }
    w.stop().await?;
    let mut gaps = Vec::new();
    for pair in ids.windows(2) {
        let us: i64 = sqlx::query_scalar(
            "SELECT TIMESTAMPDIFF(MICROSECOND, a.finished_at, b.attempted_at)
             FROM taskq_tasks a, taskq_tasks b WHERE a.id = ? AND b.id = ?",
        )
        .bind(pair[0])
        .bind(pair[1])
        .fetch_one(pool)
        .await?;
        gaps.push(us as f64 / 1000.0);
    }
    gaps.sort_by(f64::total_cmp);
    Ok(gaps)
}
