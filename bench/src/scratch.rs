//! The scratch database's task table: emptied before a measurement, filled through taskq or
//! with plain SQL.

use sqlx::MySqlPool;

use crate::Res;
use crate::task::noop;

pub async fn reset(pool: &MySqlPool) -> Res<()> {
    // The workflow and batch tables too: their rows name task ids that the truncate hands out
    // again.
    for truncate in [
        "TRUNCATE TABLE taskq_tasks",
        "TRUNCATE TABLE taskq_workflows",
        "TRUNCATE TABLE taskq_workflow_steps",
        "TRUNCATE TABLE taskq_workflow_deps",
        "TRUNCATE TABLE taskq_batches",
        "TRUNCATE TABLE taskq_batch_members",
    ] {
        sqlx::query(truncate).execute(pool).await?;
    }
    Ok(())
}

/// Enqueues `n` no-op tasks with ~256-byte payloads through `enqueue_many`, 1,000 per
/// transaction.
pub async fn preload(pool: &MySqlPool, n: u64) -> Res<()> {
    let mut seq = 0;
    while seq < n {
        let end = (seq + 1000).min(n);
        let mut tx = pool.begin().await?;
        taskq::enqueue::enqueue_many(&mut tx, (seq..end).map(noop)).await?;
        tx.commit().await?;
        seq = end;
    }
    Ok(())
}

/// Inserts `n` rows with plain SQL (1 in `due_every` due now, the others due in a day), in
/// statements of 100,000 rows generated from a digits table. Small payloads.
pub async fn bulk_insert(pool: &MySqlPool, n: u64, due_every: u64) -> Res<()> {
    sqlx::query("CREATE TABLE IF NOT EXISTS bench_digits (d INT PRIMARY KEY)")
        .execute(pool)
        .await?;
    sqlx::query("INSERT IGNORE INTO bench_digits VALUES (0),(1),(2),(3),(4),(5),(6),(7),(8),(9)")
        .execute(pool)
        .await?;
    let chunk = 100_000u64;
    let mut base = 0;
    while base < n {
        let rows = chunk.min(n - base);
        sqlx::query(
            "INSERT INTO taskq_tasks (queue, name, payload, state, priority, max_attempts, run_at,
                 created_at, updated_at)
             SELECT 'bench', 'bench_noop', CONCAT('{\"seq\":', s.n, ',\"pad\":\"\"}'), 'pending',
                 0, 20,
                 IF(s.n % ? = 0, UTC_TIMESTAMP(6) - INTERVAL 1 SECOND, UTC_TIMESTAMP(6) + INTERVAL 1 DAY),
                 UTC_TIMESTAMP(6), UTC_TIMESTAMP(6)
             FROM (SELECT ? + a.d + 10 * b.d + 100 * c.d + 1000 * e.d + 10000 * f.d AS n
                   FROM bench_digits a, bench_digits b, bench_digits c, bench_digits e,
                        bench_digits f) s
             WHERE s.n < ?
             ORDER BY s.n",
        )
        .bind(due_every)
        .bind(base)
        .bind(base + rows)
        .execute(pool)
        .await?;
        base += chunk; // the digits table yields 100,000 numbers per statement
    }
    Ok(())
}
