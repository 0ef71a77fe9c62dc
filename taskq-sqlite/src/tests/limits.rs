//! Queue limits, statement by statement: set, listed and cleared; a limited claim honours the
//! concurrency limit and the rate window, exactly, also with claimers running at once.

use super::{claim, db_path, fresh, insert, outcome, task, write_back};
use crate::enqueue::task_insert_many;
use crate::lease::{task_claim, task_write_back};
use crate::queues::{
    queue_controls, queue_list, queue_pause, queue_set_limit, queue_set_rate_limit,
};
use crate::tasks::*;
use crate::{migrate, open};
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;
use taskq_driver::rows::{ClaimRequest, LimitHit, NewTask, TaskFilter, WriteBack};
use taskq_driver::state::TaskState;

fn limited<'a>(queue: &'a str, limit: u32) -> ClaimRequest<'a> {
    ClaimRequest {
        limited: true,
        ..claim(queue, &["a"], limit)
    }
}

#[tokio::test]
async fn queue_limits_are_set_listed_and_cleared() {
    let pool = fresh("queue_limits").await;
    let mut c = pool.acquire().await.unwrap();
    insert(&mut c, task("busy", "a")).await;
    queue_set_limit(&mut c, "lim", Some(2)).await.unwrap();
    queue_set_rate_limit(&mut c, "rate", Some((10, 60_000_000)))
        .await
        .unwrap();
    queue_pause(&mut c, "paused").await.unwrap();
    // Clearing a queue without a row writes nothing.
    queue_set_limit(&mut c, "nothing", None).await.unwrap();
    queue_set_rate_limit(&mut c, "nothing", None).await.unwrap();
    let controls = queue_controls(&mut c).await.unwrap();
    let got: Vec<(&str, bool, bool)> = controls
        .iter()
        .map(|q| (q.queue.as_str(), q.paused, q.limited))
        .collect();
    assert_eq!(
        got,
        vec![
            ("lim", false, true),
            ("paused", true, false),
            ("rate", false, true)
        ]
    );
    let list = queue_list(&mut c).await.unwrap();
    let names: Vec<&str> = list.iter().map(|q| q.queue.as_str()).collect();
    assert_eq!(names, vec!["busy", "lim", "paused", "rate"]);
    assert_eq!((list[0].pending, list[0].running), (1, 0));
    assert_eq!(list[1].concurrency_limit, Some(2));
    assert!(list[2].paused_at.is_some());
    assert_eq!(
        (list[3].rate, list[3].rate_used),
        (Some((10, 60_000_000)), 0)
    );

    queue_set_limit(&mut c, "lim", None).await.unwrap();
    queue_set_rate_limit(&mut c, "rate", None).await.unwrap();
    let controls = queue_controls(&mut c).await.unwrap();
    assert_eq!(controls.len(), 1);
    let list = queue_list(&mut c).await.unwrap();
    // Rows stay (queues once limited are listed), without limits.
    assert_eq!(list.len(), 4);
    assert!(
        list.iter()
            .all(|q| q.concurrency_limit.is_none() && q.rate.is_none())
    );
}

#[tokio::test]
async fn a_limited_claim_honours_the_concurrency_limit_and_the_rate_window() {
    let pool = fresh("limited_claim").await;
    let mut c = pool.acquire().await.unwrap();
    for _ in 0..10 {
        insert(&mut c, task("q", "a")).await;
    }
    queue_set_limit(&mut c, "q", Some(2)).await.unwrap();
    // Not marked limited (the worker has not seen the limit yet): the limit is not read.
    let got = task_claim(&mut c, &claim("q", &["a"], 1)).await.unwrap();
    assert_eq!((got.tasks.len(), got.limited), (1, None));
    let got = task_claim(&mut c, &limited("q", 5)).await.unwrap();
    assert_eq!(got.tasks.len(), 1);
    assert_eq!(
        got.limited,
        Some(LimitHit {
            allowed: 1,
            rate_resets_in_us: None
        })
    );
    let got = task_claim(&mut c, &limited("q", 5)).await.unwrap();
    assert!(got.tasks.is_empty());
    assert_eq!(got.limited.map(|h| h.allowed), Some(0));
    // A slot frees: one more.
    let running = task_list(
        &mut c,
        &TaskFilter {
            state: Some(TaskState::Running),
            ..TaskFilter::default()
        },
        0,
        u64::MAX,
        10,
    )
    .await
    .unwrap();
    assert_eq!(running.len(), 2);
    let r = &running[0];
    let f = write_back(r.id.0, r.lease_epoch, r.attempt, "succeeded", "succeeded");
    task_write_back(&mut c, &[f]).await.unwrap();
    assert_eq!(
        task_claim(&mut c, &limited("q", 5))
            .await
            .unwrap()
            .tasks
            .len(),
        1
    );

    // Rate: 3 per hour on another queue.
    for _ in 0..5 {
        insert(&mut c, task("r", "a")).await;
    }
    queue_set_rate_limit(&mut c, "r", Some((3, 3_600_000_000)))
        .await
        .unwrap();
    let got = task_claim(&mut c, &limited("r", 2)).await.unwrap();
    assert_eq!((got.tasks.len(), got.limited), (2, None));
    let got = task_claim(&mut c, &limited("r", 2)).await.unwrap();
    assert_eq!(got.tasks.len(), 1);
    let hit = got.limited.unwrap();
    assert_eq!(hit.allowed, 1);
    let resets = hit.rate_resets_in_us.unwrap();
    assert!(resets > 0 && resets <= 3_600_000_000, "{resets}");
    let got = task_claim(&mut c, &limited("r", 2)).await.unwrap();
    assert!(got.tasks.is_empty());
    assert_eq!(got.limited.map(|h| h.allowed), Some(0));
    let list = queue_list(&mut c).await.unwrap();
    let r = list.iter().find(|q| q.queue == "r").unwrap();
    assert_eq!((r.rate_used, r.pending, r.running), (3, 2, 3));
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
    assert_eq!(
        peak, LIMIT,
        "the claimers used the whole limit at some point"
    );
}
