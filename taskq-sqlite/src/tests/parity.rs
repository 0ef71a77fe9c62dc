//! The statements of MySQL migrations 10, 11 and 13's era: attempt history, audit trail,
//! follow-ups, queue limits, the dashboard's reads, and migrations run by several processes
//! at once. Each test asserts the rows the statements leave.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use serde_json::Value;
use sqlx::SqliteConnection;
use taskq_driver::rows::{
    AuditRow, ClaimRequest, Claimed, FollowUpRow, LimitHit, NameList, NewTask, ReapRow, TaskFilter,
    WriteBack,
};
use taskq_driver::state::{TaskId, TaskState};

use super::{W, claim, db_path, fresh, get, insert, reap_lapsed, task, write_back};
use crate::enqueue::task_insert_many;
use crate::history::{
    audit_insert, audit_list, audit_prune, task_attempts, task_failed_attempts_per_minute,
};
use crate::lease::{task_claim, task_lapsed, task_reap, task_release, task_write_back};
use crate::queues::{
    queue_controls, queue_list, queue_pause, queue_set_limit, queue_set_rate_limit,
};
use crate::tasks::*;
use crate::{migrate, migrator, open};

const CHILD_ENV: &str = "TASKQ_SQLITE_TEST_MIGRATE_DB";

fn limited<'a>(queue: &'a str, limit: u32) -> ClaimRequest<'a> {
    ClaimRequest {
        limited: true,
        ..claim(queue, &["a"], limit)
    }
}

/// The write-back of a claimed task's attempt.
fn outcome(t: &Claimed, state: &'static str, outcome: &'static str) -> WriteBack {
    write_back(t.id, t.lease_epoch, t.attempt, state, outcome)
}

/// The attempt history of `id`, parsed (empty when none).
async fn history(c: &mut SqliteConnection, id: u64) -> Vec<Value> {
    match task_attempts(c, TaskId(id))
        .await
        .unwrap()
        .expect("task exists")
    {
        None => Vec::new(),
        Some(json) => serde_json::from_str(&json).unwrap(),
    }
}

/// A stored time as the history writes it.
fn fmt(t: chrono::DateTime<chrono::Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S%.6f").to_string()
}

fn follow_up(key: &str) -> Box<FollowUpRow> {
    Box::new(FollowUpRow {
        queue: "fq",
        name: "then",
        payload: vec![0, 159, b'{', 255],
        priority: -3,
        max_attempts: 7,
        ttl_us: Some(60_000_000),
        key: key.into(),
        trace_context: Some("00-trace".into()),
    })
}

async fn count_key(c: &mut SqliteConnection, key: &str) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM taskq_tasks WHERE idempotency_key = ?1")
        .bind(key)
        .fetch_one(&mut *c)
        .await
        .unwrap()
}

#[tokio::test]
async fn history_records_every_outcome_and_a_fenced_write_back_appends_nothing() {
    let pool = fresh("history_outcomes").await;
    let mut c = pool.acquire().await.unwrap();
    let outcomes: [(&str, &str); 7] = [
        ("succeeded", "succeeded"),
        ("pending", "failed"),
        ("dead", "failed"),
        ("canceled", "canceled"),
        ("snoozed", "snoozed"),
        ("pending", "timed_out"),
        ("pending", "panicked"),
    ];
    let mut ids = Vec::new();
    for _ in outcomes {
        ids.push(insert(&mut c, task("q", "a")).await);
    }
    let got = task_claim(&mut c, &claim("q", &["a"], 10)).await.unwrap();
    let claimed_row = get(&mut c, ids[0]).await;
    assert_eq!(claimed_row.attempted_at, Some(claimed_row.updated_at));
    let batch: Vec<WriteBack> = got
        .tasks
        .iter()
        .zip(outcomes)
        .map(|(t, (state, o))| WriteBack {
            error: (o != "succeeded").then(|| format!("{o} error")),
            ..outcome(t, state, o)
        })
        .collect();
    let done = task_write_back(&mut c, &batch).await.unwrap();
    assert_eq!(done.written, ids.len() as u64);
    for (i, (_, o)) in outcomes.iter().enumerate() {
        let row = get(&mut c, ids[i]).await;
        let h = history(&mut c, ids[i]).await;
        assert_eq!(h.len(), 1, "one entry for {o}");
        let e = &h[0];
        assert_eq!(e["attempt"], 1);
        assert_eq!(e["epoch"], 1);
        assert_eq!(e["worker"], W);
        assert_eq!(e["outcome"], *o);
        assert_eq!(e["started_at"], fmt(row.attempted_at.unwrap()));
        assert_eq!(e["finished_at"], fmt(row.updated_at));
        if *o == "succeeded" {
            assert!(e["error"].is_null());
        } else {
            assert_eq!(e["error"], format!("{o} error"));
        }
    }
    // The same write-backs again (their epochs are stale or the rows ended): nothing written,
    // nothing appended.
    let again = task_write_back(&mut c, &batch).await.unwrap();
    assert_eq!(again.written, 0);
    for id in &ids {
        assert_eq!(history(&mut c, *id).await.len(), 1);
    }
}

#[tokio::test]
async fn history_keeps_the_latest_100_entries_and_cuts_errors_to_1024_chars() {
    let pool = fresh("history_bounds").await;
    let mut c = pool.acquire().await.unwrap();
    let id = insert(&mut c, task("q", "a")).await;
    for _ in 0..102 {
        let got = task_claim(&mut c, &claim("q", &["a"], 1)).await.unwrap();
        task_write_back(&mut c, &[outcome(&got.tasks[0], "snoozed", "snoozed")])
            .await
            .unwrap();
    }
    let h = history(&mut c, id).await;
    assert_eq!(h.len(), 100);
    // Epochs 1 and 2 were dropped, oldest first.
    assert_eq!(h[0]["epoch"], 3);
    assert_eq!(h[99]["epoch"], 102);
    assert!(h.iter().all(|e| e["attempt"] == 1));

    let long: String = "é".repeat(2000);
    let got = task_claim(&mut c, &claim("q", &["a"], 1)).await.unwrap();
    task_write_back(
        &mut c,
        &[WriteBack {
            error: Some(long.clone()),
            ..outcome(&got.tasks[0], "dead", "failed")
        }],
    )
    .await
    .unwrap();
    let h = history(&mut c, id).await;
    assert_eq!(h.len(), 100);
    let err = h[99]["error"].as_str().unwrap();
    assert_eq!(err.chars().count(), 1024);
    assert!(err.ends_with('…') && err.starts_with("éé"));
    assert_eq!(get(&mut c, id).await.last_error.as_deref(), Some(&*long));
}

#[tokio::test]
async fn reaper_and_release_append_their_entries() {
    let pool = fresh("history_reap_release").await;
    let mut c = pool.acquire().await.unwrap();
    let lost = insert(&mut c, task("q", "a")).await;
    let cancel = insert(&mut c, task("q", "a")).await;
    let expired = ClaimRequest {
        lease_us: -1_000,
        ..claim("q", &["a"], 2)
    };
    task_claim(&mut c, &expired).await.unwrap();
    task_request_cancel(&mut c, TaskId(cancel)).await.unwrap();
    let reaped = reap_lapsed(&mut c, &["a"], 10, |_| None).await.unwrap();
    assert_eq!(reaped.rows.len(), 2);
    let h = history(&mut c, lost).await;
    assert_eq!(h.len(), 1);
    assert_eq!(
        (&h[0]["outcome"], &h[0]["epoch"], &h[0]["attempt"]),
        (&Value::from("lease_lost"), &Value::from(1), &Value::from(1))
    );
    assert_eq!(h[0]["error"], "lease expired (worker w1, attempt 1)");
    let h = history(&mut c, cancel).await;
    assert_eq!(h[0]["outcome"], "canceled");

    // `lost` runs again (attempt 2, epoch 3) and is released at shutdown.
    let got = task_claim(&mut c, &claim("q", &["a"], 1)).await.unwrap();
    let t = &got.tasks[0];
    assert_eq!((t.id, t.attempt, t.lease_epoch), (lost, 2, 3));
    assert_eq!(task_release(&mut c, &[(lost, 3)]).await.unwrap(), 1);
    // A stale release appends nothing.
    assert_eq!(task_release(&mut c, &[(lost, 3)]).await.unwrap(), 0);
    let h = history(&mut c, lost).await;
    assert_eq!(h.len(), 2);
    assert_eq!(
        (&h[1]["outcome"], &h[1]["epoch"], &h[1]["attempt"]),
        (&Value::from("released"), &Value::from(3), &Value::from(2))
    );
    assert!(h[1]["error"].is_null());
    assert!(h[1]["started_at"].is_string());
}

#[tokio::test]
async fn write_back_follow_ups_are_inserted_once_and_never_for_fenced_outcomes() {
    let pool = fresh("follow_write_back").await;
    let mut c = pool.acquire().await.unwrap();
    let a = insert(&mut c, task("q", "a")).await;
    let b = insert(&mut c, task("q", "a")).await;
    let got = task_claim(&mut c, &claim("q", &["a"], 2)).await.unwrap();
    let (ta, tb) = (&got.tasks[0], &got.tasks[1]);
    let ka = format!("taskq:on_success:{a}:1");
    let kb = format!("taskq:on_dead:{b}:0");
    let batch = [
        WriteBack {
            follow_up: Some(follow_up(&ka)),
            ..outcome(ta, "succeeded", "succeeded")
        },
        // Stale epoch: fenced, so its follow-up is not inserted.
        WriteBack {
            epoch: 0,
            follow_up: Some(follow_up(&kb)),
            ..outcome(tb, "dead", "failed")
        },
    ];
    let done = task_write_back(&mut c, &batch).await.unwrap();
    assert_eq!((done.written, done.followed), (1, vec![a]));
    assert_eq!(count_key(&mut c, &kb).await, 0);
    let f = task_list(
        &mut c,
        &TaskFilter {
            queue: Some("fq"),
            ..TaskFilter::default()
        },
        0,
        u64::MAX,
        10,
    )
    .await
    .unwrap();
    assert_eq!(f.len(), 1);
    let f = &f[0];
    assert_eq!(
        (
            f.name.as_str(),
            f.state.as_str(),
            f.priority,
            f.max_attempts
        ),
        ("then", "pending", -3, 7)
    );
    assert_eq!(f.payload, vec![0, 159, b'{', 255]);
    assert_eq!(f.idempotency_key.as_deref(), Some(&*ka));
    assert_eq!(f.trace_context.as_deref(), Some("00-trace"));
    assert_eq!(f.run_at, f.created_at);
    assert_eq!(
        f.deadline,
        Some(f.created_at + chrono::TimeDelta::seconds(60))
    );
    // The same write-back again is fenced: no second follow-up.
    let again = task_write_back(&mut c, &batch[..1]).await.unwrap();
    assert!(again.written == 0 && again.followed.is_empty());
    assert_eq!(count_key(&mut c, &ka).await, 1);

    // The key is the backstop: a row already holding it stays the only one, and the
    // write-back still lands.
    let kb1 = format!("taskq:on_dead:{b}:1");
    insert(
        &mut c,
        NewTask {
            idempotency_key: Some(&kb1),
            ..task("fq", "then")
        },
    )
    .await;
    let done = task_write_back(
        &mut c,
        &[WriteBack {
            follow_up: Some(follow_up(&kb1)),
            ..outcome(tb, "dead", "failed")
        }],
    )
    .await
    .unwrap();
    assert_eq!(done.written, 1);
    assert_eq!(count_key(&mut c, &kb1).await, 1);
    assert_eq!(get(&mut c, b).await.state.as_str(), "dead");
}

#[tokio::test]
async fn reap_follow_ups_only_for_rows_reaped_to_dead() {
    let pool = fresh("follow_reap").await;
    let mut c = pool.acquire().await.unwrap();
    let dies = insert(
        &mut c,
        NewTask {
            max_attempts: 1,
            ..task("q", "a")
        },
    )
    .await;
    let requeued = insert(&mut c, task("q", "a")).await;
    let unknown = insert(
        &mut c,
        NewTask {
            max_attempts: 1,
            ..task("q", "other")
        },
    )
    .await;
    let expired = ClaimRequest {
        lease_us: -1_000,
        ..claim("q", &["a", "other"], 3)
    };
    task_claim(&mut c, &expired).await.unwrap();
    let mut planned = Vec::new();
    // This worker registers "a" only: the dying "other" task is parked back to pending for a
    // worker that knows its follow-up.
    let reaped = reap_lapsed(&mut c, &["a"], 10, |r| {
        planned.push(r.id);
        assert_eq!(r.payload.as_deref(), Some(&b"{}"[..]));
        Some(follow_up(&format!(
            "taskq:on_dead:{}:{}",
            r.id, r.lease_epoch
        )))
    })
    .await
    .unwrap();
    assert_eq!(planned, vec![dies]);
    let states: Vec<(u64, &str)> = reaped.rows.iter().map(|r| (r.0, r.1.as_str())).collect();
    assert_eq!(
        states,
        vec![(dies, "dead"), (requeued, "pending"), (unknown, "pending")]
    );
    assert_eq!(reaped.followed, vec![dies]);
    assert_eq!(
        count_key(&mut c, &format!("taskq:on_dead:{dies}:1")).await,
        1
    );
    let parked = get(&mut c, unknown).await;
    assert_eq!((parked.state.as_str(), parked.attempt), ("pending", 1));
    assert!(parked.finished_at.is_none());
    // A worker that registers "other" claims it back: marked as parked (attempt past the
    // maximum, the lost attempt's error), here with an expired lease again.
    let again = task_claim(
        &mut c,
        &ClaimRequest {
            lease_us: -1_000,
            ..claim("q", &["other"], 1)
        },
    )
    .await
    .unwrap();
    assert_eq!(again.tasks.len(), 1);
    assert_eq!(again.tasks[0].attempt, 2);
    assert!(
        again.tasks[0]
            .parked_error
            .as_deref()
            .is_some_and(|e| e.starts_with("lease expired"))
    );

    // Read, then fenced before the reap (a late write-back lands): the reap writes nothing
    // and inserts no follow-up.
    let rows = task_lapsed(&mut c, &NameList::new(["other"]), 10)
        .await
        .unwrap();
    assert_eq!(rows.len(), 1);
    assert!(rows[0].goes_dead());
    let late = write_back(unknown, rows[0].lease_epoch, 1, "succeeded", "succeeded");
    assert_eq!(task_write_back(&mut c, &[late]).await.unwrap().written, 1);
    let plan = [ReapRow {
        order_ends: None,
        id: unknown,
        epoch: rows[0].lease_epoch,
        frees: None,
        canceled: false,
        parks: false,
        follow_up: Some(follow_up("taskq:on_dead:late")),
    }];
    let reaped = task_reap(&mut c, &plan).await.unwrap();
    assert!(reaped.rows.is_empty() && reaped.followed.is_empty());
    assert_eq!(count_key(&mut c, "taskq:on_dead:late").await, 0);
    assert_eq!(get(&mut c, unknown).await.state.as_str(), "succeeded");
}

#[tokio::test]
async fn audit_rows_are_listed_newest_first_and_pruned_oldest_first() {
    let pool = fresh("audit").await;
    let mut c = pool.acquire().await.unwrap();
    let t = insert(&mut c, task("emails", "a")).await;
    let mut ids = Vec::new();
    for (action, task_id, queue) in [
        ("cancel", Some(t), None),
        ("pause", None, Some("emails")),
        ("pause", None, Some("other")),
        ("retry", Some(t), None),
        ("create", None, None),
    ] {
        let row = AuditRow {
            actor: "cli:me@host",
            action,
            task_id,
            queue,
            detail: Some(r#"{"n":1}"#.to_owned()),
        };
        ids.push(audit_insert(&mut c, &row).await.unwrap());
    }
    assert!(ids.windows(2).all(|w| w[0] < w[1]));
    let all = audit_list(&mut c, None, None, u64::MAX, 100).await.unwrap();
    let got: Vec<(u64, &str, Option<&str>)> = all
        .iter()
        .map(|r| (r.id, r.action.as_str(), r.queue.as_deref()))
        .collect();
    assert_eq!(
        got,
        vec![
            (ids[4], "create", None),
            (ids[3], "retry", Some("emails")),
            (ids[2], "pause", Some("other")),
            (ids[1], "pause", Some("emails")),
            (ids[0], "cancel", Some("emails")),
        ]
    );
    assert_eq!(all[0].actor, "cli:me@host");
    assert_eq!(all[0].detail.as_deref(), Some(r#"{"n":1}"#));
    let of_task = audit_list(&mut c, Some(t), None, u64::MAX, 100)
        .await
        .unwrap();
    assert_eq!(
        of_task.iter().map(|r| r.id).collect::<Vec<_>>(),
        vec![ids[3], ids[0]]
    );
    let of_queue = audit_list(&mut c, None, Some("emails"), ids[3], 100)
        .await
        .unwrap();
    assert_eq!(
        of_queue.iter().map(|r| r.id).collect::<Vec<_>>(),
        vec![ids[1], ids[0]]
    );
    let page = audit_list(&mut c, None, None, ids[4], 2).await.unwrap();
    assert_eq!(
        page.iter().map(|r| r.id).collect::<Vec<_>>(),
        vec![ids[3], ids[2]]
    );

    assert_eq!(audit_prune(&mut c, 3600, 100).await.unwrap(), 0);
    // Age the first three rows by an hour.
    sqlx::query("UPDATE taskq_audit SET at = at - 3700000000 WHERE id <= ?1")
        .bind(ids[2] as i64)
        .execute(&mut *c)
        .await
        .unwrap();
    assert_eq!(audit_prune(&mut c, 3600, 2).await.unwrap(), 2);
    let left = audit_list(&mut c, None, None, u64::MAX, 100).await.unwrap();
    assert_eq!(
        left.iter().map(|r| r.id).collect::<Vec<_>>(),
        vec![ids[4], ids[3], ids[2]]
    );
    assert_eq!(audit_prune(&mut c, 3600, 100).await.unwrap(), 1);
}

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

    let active = task_stats_active(&mut c).await.unwrap();
    let got: Vec<(&str, &str, u64)> = active
        .iter()
        .map(|s| (s.queue.as_str(), s.state.as_str(), s.count))
        .collect();
    assert_eq!(got, vec![("even", "pending", 2), ("odd", "pending", 4)]);
    let terminal = task_stats_terminal(&mut c).await.unwrap();
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

/// In a child process (spawned by the test below): migrates the database named by the
/// environment once every sibling is ready. Without the variable it does nothing.
#[tokio::test]
async fn child_migrate() {
    let Ok(path) = std::env::var(CHILD_ENV) else {
        return;
    };
    let go = format!("{path}.go");
    while !Path::new(&go).exists() {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let pool = open(&path, 2).await.unwrap();
    migrate(&pool).await.unwrap();
    println!("\nMIGRATED");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_from_several_processes_at_once_on_a_new_file() {
    let path = db_path("migrate_processes");
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..6)
        .map(|_| {
            Command::new(&exe)
                .args([
                    "--exact",
                    "tests::parity::child_migrate",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(CHILD_ENV, &path)
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    std::fs::write(format!("{}.go", path.display()), b"").unwrap();
    for child in children {
        let out = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap())
            .await
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "child failed: {stdout}");
        assert!(stdout.contains("MIGRATED"), "{stdout}");
    }
    let pool = open(&path, 1).await.unwrap();
    let mut c = pool.acquire().await.unwrap();
    let versions: Vec<i64> =
        sqlx::query_scalar("SELECT version FROM _taskq_migrations ORDER BY version")
            .fetch_all(&mut *c)
            .await
            .unwrap();
    let expected: Vec<i64> = migrator().iter().map(|m| m.version).collect();
    assert_eq!(versions, expected);
    let audit: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM taskq_audit")
        .fetch_one(&mut *c)
        .await
        .unwrap();
    assert_eq!(audit, 0);
    // And once more, on the migrated file: nothing to do.
    migrate(&pool).await.unwrap();
}
