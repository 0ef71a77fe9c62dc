//! `--ordered`: ordered drains next to an unordered one, in the same run (issue 25). For each
//! of: unordered, ordered over 1 key, 16 keys, 256 keys: enqueue `n` no-op tasks one
//! autocommit enqueue each (the ordered ones with `with_order_key(i % keys)`), counting the
//! server's statements per enqueue, then drain them with one worker at concurrency 16,
//! counting tasks/s and statements per task (`Questions`, global: run it on a server nothing
//! else uses).

use std::time::{Duration, Instant};

use sqlx::MySqlPool;

use crate::Res;
use crate::counters::{server_status, status_delta};
use crate::scratch::reset;
use crate::task::{noop, start_worker};

/// Runs the four drains of `n` tasks and prints a Markdown table.
pub async fn run(pool: &MySqlPool, n: u64) -> Res<()> {
    let mut rows = Vec::new();
    for keys in [0u64, 1, 16, 256] {
        reset(pool).await?;
        sqlx::query("DELETE FROM taskq_order_keys")
            .execute(pool)
            .await?;
        let before = server_status(pool).await?;
        for i in 0..n {
            let t = noop(i);
            if keys == 0 {
                taskq::Task::enqueue(t, pool).await?;
            } else {
                taskq::Task::with_order_key(t, (i % keys).to_string())
                    .enqueue(pool)
                    .await?;
            }
        }
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
        let label = if keys == 0 {
            "unordered".to_owned()
        } else {
            format!("ordered, {keys} key{}", if keys == 1 { "" } else { "s" })
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
        "| drain | tasks | tasks/s (concurrency 16) | statements per enqueue | statements per task drained |"
    );
    println!("|---|---|---|---|---|");
    for r in rows {
        println!("{r}");
    }
    Ok(())
}
