//! Queue limits under SQLite's single writer: rate windows on its millisecond clock hold
//! exactly the limit, and limited claimers on several pools at once never run more than the
//! concurrency limit. Setting, listing and the limited claim itself are the driver suite's.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use taskq_driver::rows::{ClaimRequest, NewTask, WriteBack};

use super::{claim, db_path, fresh, outcome, task};
use crate::enqueue::task_insert_many;
use crate::lease::{task_claim, task_write_back};
use crate::queues::{queue_set_limit, queue_set_rate_limit};
use crate::{migrate, open};

fn limited<'a>(queue: &'a str, limit: u32) -> ClaimRequest<'a> {
    ClaimRequest {
        limited: true,
        ..claim(queue, &["a"], limit)
    }
}

#[tokio::test]
async fn rate_windows_hold_exactly_the_limit() {
    const PERIOD_US: i64 = 250_000;
    const RATE: u32 = 4;
    let pool = fresh("rate_windows").await;
    let mut c = pool.acquire().await.unwrap();
    let rows: Vec<NewTask<'_>> = (0..200).map(|_| task("q", "a")).collect();
    task_insert_many(&mut c, &rows).await.unwrap();
    queue_set_rate_limit(&mut c, "q", Some((RATE, PERIOD_US)))
        .await
        .unwrap();
    let until = std::time::Instant::now() + Duration::from_millis(1_600);
    while std::time::Instant::now() < until {
        let got = task_claim(&mut c, &limited("q", 3)).await.unwrap();
        if got.tasks.is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    let starts: Vec<i64> =
        sqlx::query_scalar("SELECT attempted_at FROM taskq_tasks WHERE attempted_at IS NOT NULL")
            .fetch_all(&mut *c)
            .await
            .unwrap();
    let mut per_window: BTreeMap<i64, u32> = BTreeMap::new();
    for s in starts {
        *per_window.entry(s / PERIOD_US).or_default() += 1;
    }
    assert!(per_window.values().all(|&n| n <= RATE), "{per_window:?}");
    let full = per_window.values().filter(|&&n| n == RATE).count();
    assert!(full >= 5, "windows filled to the limit: {per_window:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_limited_claimers_never_run_more_than_the_limit() {
    const LIMIT: i64 = 3;
    const TASKS: usize = 120;
    let path = db_path("limit_pools");
    {
        let pool = open(&path, 1).await.unwrap();
        migrate(&pool).await.unwrap();
        let mut c = pool.acquire().await.unwrap();
        let rows: Vec<NewTask<'_>> = (0..TASKS).map(|_| task("q", "a")).collect();
        task_insert_many(&mut c, &rows).await.unwrap();
        queue_set_limit(&mut c, "q", Some(LIMIT as u32))
            .await
            .unwrap();
        drop(c);
        pool.close().await;
    }
    // Held in memory: raised after a claim commits, lowered before the write-back, so it is
    // never above the running count in the database.
    let held = Arc::new(AtomicI64::new(0));
    let peak = Arc::new(AtomicI64::new(0));
    let mut handles = Vec::new();
    for p in 0..4 {
        let pool = open(&path, 2).await.unwrap();
        for k in 0..2 {
            let (pool, held, peak) = (pool.clone(), held.clone(), peak.clone());
            handles.push(tokio::spawn(async move {
                let worker = format!("p{p}-{k}");
                let mut c = pool.acquire().await.unwrap();
                let mut mine = Vec::new();
                let mut idle = 0;
                loop {
                    let req = ClaimRequest {
                        worker_id: &worker,
                        ..limited("q", 2)
                    };
                    let got = task_claim(&mut c, &req).await.unwrap();
                    if got.tasks.is_empty() {
                        let left: i64 = sqlx::query_scalar(
                            "SELECT COUNT(*) FROM taskq_tasks WHERE state != 'succeeded'",
                        )
                        .fetch_one(&mut *c)
                        .await
                        .unwrap();
                        if left == 0 {
                            return mine;
                        }
                        idle += 1;
                        assert!(idle < 5_000, "stuck");
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        continue;
                    }
                    let n = got.tasks.len() as i64;
                    let now = held.fetch_add(n, Ordering::SeqCst) + n;
                    peak.fetch_max(now, Ordering::SeqCst);
                    let running: i64 = sqlx::query_scalar(
                        "SELECT COUNT(*) FROM taskq_tasks WHERE state = 'running'",
                    )
                    .fetch_one(&mut *c)
                    .await
                    .unwrap();
                    assert!(running <= LIMIT, "{running} running");
                    tokio::time::sleep(Duration::from_millis(3)).await;
                    held.fetch_sub(n, Ordering::SeqCst);
                    let batch: Vec<WriteBack> = got
                        .tasks
                        .iter()
                        .map(|t| outcome(t, "succeeded", "succeeded"))
                        .collect();
                    task_write_back(&mut c, &batch).await.unwrap();
                    mine.extend(got.tasks.iter().map(|t| t.id));
                }
            }));
        }
    }
    let mut claimed = Vec::new();
    for h in handles {
        claimed.extend(h.await.unwrap());
    }
    let unique: HashSet<u64> = claimed.iter().copied().collect();
    assert_eq!((claimed.len(), unique.len()), (TASKS, TASKS));
    let peak = peak.load(Ordering::SeqCst);
    assert!(peak <= LIMIT, "peak {peak}");
    // Whether the claimers' 3 ms holds ever overlapped up to the limit depends on the
    // machine's load (CI saw a peak of 2 once): that the limit is reached, not only kept, is
    // the driver suite's deterministic `a_limited_claim_honours_the_concurrency_limit`.
    assert!(peak >= 1, "nothing was held: peak {peak}");
}
