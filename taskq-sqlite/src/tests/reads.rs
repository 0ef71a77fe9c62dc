//! Ended tasks and failed attempts per minute over several minutes and the window's cut: rows
//! are aged with SQL, which the driver suite does not write (its
//! `ended_tasks_and_failed_attempts_are_counted_per_minute` checks minute 0 on both drivers).

use super::{claim, fresh, get, insert, outcome, reap_lapsed, task};
use crate::history::task_failed_attempts_per_minute;
use crate::lease::{task_claim, task_write_back};
use crate::tasks::*;
use taskq_driver::rows::{ClaimRequest, WriteBack};

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
