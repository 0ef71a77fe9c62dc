//! The dashboard's reads, statement by statement: ended tasks and failed attempts per minute,
//! pages, counts and their bounds.

use super::{claim, fresh, get, insert, outcome, reap_lapsed, task};
use crate::history::task_failed_attempts_per_minute;
use crate::lease::{task_claim, task_write_back};
use crate::tasks::*;
use taskq_driver::rows::{ClaimRequest, TaskFilter, WriteBack};
use taskq_driver::state::TaskState;

#[tokio::test]
async fn finished_and_failed_attempts_per_minute() {
    let pool = fresh("per_minute").await;
    let mut c = pool.acquire().await.unwrap();
    for _ in 0..6 {
        insert(&mut c, task("q", "a")).await;
    }
    let lost = insert(&mut c, task("q", "b")).await;
    let got = task_claim(&mut c, &claim("q", &["a"], 6)).await.unwrap();
    let t = &got.tasks;
    let batch = vec![
        outcome(&t[0], "succeeded", "succeeded"),
        outcome(&t[1], "succeeded", "succeeded"),
        outcome(&t[2], "dead", "failed"),
        outcome(&t[3], "dead", "panicked"),
        WriteBack {
            delay_us: 3_600_000_000,
            ..outcome(&t[4], "pending", "timed_out")
        },
        outcome(&t[5], "canceled", "canceled"),
    ];
    task_write_back(&mut c, &batch).await.unwrap();
    task_claim(
        &mut c,
        &ClaimRequest {
            lease_us: -1_000,
            ..claim("q", &["b"], 1)
        },
    )
    .await
    .unwrap();
    reap_lapsed(&mut c, &["b"], 10, |_| None).await.unwrap();
    assert_eq!(get(&mut c, lost).await.state.as_str(), "pending");
    // Move t[1] (succeeded) and t[3] (dead, panicked) back 90 s: minute 1. t[5] (canceled)
    // back 10 minutes: outside a 5-minute window.
    for (id, us) in [
        (t[1].id as i64, 90_000_000_i64),
        (t[3].id as i64, 90_000_000),
        (t[5].id as i64, 600_000_000),
    ] {
        sqlx::query(
            "UPDATE taskq_tasks SET finished_at = finished_at - ?2,
               attempts = json_set(attempts, '$[0].finished_at',
                 strftime('%Y-%m-%d %H:%M:%S', (finished_at - ?2) / 1000000, 'unixepoch')
                   || printf('.%06d', (finished_at - ?2) % 1000000))
             WHERE id = ?1",
        )
        .bind(id)
        .bind(us)
        .execute(&mut *c)
        .await
        .unwrap();
    }
    let mut finished: Vec<(&str, u32, u64)> = task_finished_per_minute(&mut c, 5)
        .await
        .unwrap()
        .into_iter()
        .map(|(s, m, n)| (s.as_str(), m, n))
        .collect();
    finished.sort();
    assert_eq!(
        finished,
        vec![
            ("dead", 0, 1),
            ("dead", 1, 1),
            ("succeeded", 0, 1),
            ("succeeded", 1, 1),
        ]
    );
    let mut failed = task_failed_attempts_per_minute(&mut c, 5).await.unwrap();
    failed.sort();
    assert_eq!(
        failed,
        vec![
            ("failed".to_string(), 0, 1),
            ("lease_lost".to_string(), 0, 1),
            ("panicked".to_string(), 1, 1),
            ("timed_out".to_string(), 0, 1),
        ]
    );
    assert!(
        task_finished_per_minute(&mut c, 0)
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn dashboard_reads_page_count_and_bound() {
    let pool = fresh("dashboard_reads").await;
    let mut c = pool.acquire().await.unwrap();
    assert_eq!(task_id_bounds(&mut c).await.unwrap(), (0, 0));
    let mut ids = Vec::new();
    for i in 0..8 {
        let (q, n) = if i % 2 == 0 {
            ("even", "a")
        } else {
            ("odd", "b")
        };
        ids.push(insert(&mut c, task(q, n)).await);
    }
    assert_eq!(task_id_bounds(&mut c).await.unwrap(), (ids[0], ids[7]));
    // Two of "even" end: the queue reads list every state.
    let got = task_claim(&mut c, &claim("even", &["a"], 2)).await.unwrap();
    let batch: Vec<WriteBack> = got
        .tasks
        .iter()
        .map(|t| outcome(t, "succeeded", "succeeded"))
        .collect();
    task_write_back(&mut c, &batch).await.unwrap();

    let all = TaskFilter::default();
    let desc = task_list_desc(&mut c, &all, ids[6], ids[2], 3)
        .await
        .unwrap();
    assert_eq!(
        desc.iter().map(|t| t.id.0).collect::<Vec<_>>(),
        vec![ids[5], ids[4], ids[3]]
    );
    let desc = task_list_desc(&mut c, &all, ids[6], ids[2], 10)
        .await
        .unwrap();
    assert_eq!(desc.last().map(|t| t.id.0), Some(ids[2]));
    let odd = TaskFilter {
        queue: Some("odd"),
        ..TaskFilter::default()
    };
    let page = task_list(&mut c, &odd, 0, ids[5], 10).await.unwrap();
    assert_eq!(
        page.iter().map(|t| t.id.0).collect::<Vec<_>>(),
        vec![ids[1], ids[3], ids[5]]
    );
    let q = task_list_queue_desc(&mut c, "even", None, u64::MAX, 3)
        .await
        .unwrap();
    assert_eq!(
        q.iter()
            .map(|t| (t.id.0, t.state.as_str()))
            .collect::<Vec<_>>(),
        vec![
            (ids[6], "pending"),
            (ids[4], "pending"),
            (ids[2], "succeeded")
        ]
    );
    let q = task_list_queue_asc(&mut c, "even", Some("a"), ids[0], 2)
        .await
        .unwrap();
    assert_eq!(
        q.iter().map(|t| t.id.0).collect::<Vec<_>>(),
        vec![ids[2], ids[4]]
    );
    assert!(
        task_list_queue_asc(&mut c, "even", Some("b"), 0, 10)
            .await
            .unwrap()
            .is_empty()
    );

    let active = task_stats_half(&mut c, false).await.unwrap();
    let got: Vec<(&str, &str, u64)> = active
        .iter()
        .map(|s| (s.queue.as_str(), s.state.as_str(), s.count))
        .collect();
    assert_eq!(got, vec![("even", "pending", 2), ("odd", "pending", 4)]);
    let terminal = task_stats_half(&mut c, true).await.unwrap();
    assert_eq!(terminal.len(), 1);
    assert_eq!(
        (
            terminal[0].queue.as_str(),
            terminal[0].state.as_str(),
            terminal[0].count
        ),
        ("even", "succeeded", 2)
    );
    assert!(terminal[0].oldest_run_at.is_some());

    assert_eq!(
        task_prune_count(&mut c, TaskState::Succeeded, 3600)
            .await
            .unwrap(),
        0
    );
    sqlx::query("UPDATE taskq_tasks SET finished_at = finished_at - 7200000000 WHERE id = ?1")
        .bind(ids[0] as i64)
        .execute(&mut *c)
        .await
        .unwrap();
    assert_eq!(
        task_prune_count(&mut c, TaskState::Succeeded, 3600)
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        task_prune_count(&mut c, TaskState::Dead, 3600)
            .await
            .unwrap(),
        0
    );
}
