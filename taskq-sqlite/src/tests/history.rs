//! The attempt history, the audit trail and follow-ups, statement by statement: every
//! outcome recorded (and none for a fenced write-back), the history's bounds, the reaper's and
//! release's entries, follow-ups inserted once and never for a fenced outcome, the audit
//! trail's order and pruning. Each test asserts the rows the statements leave.

use super::{W, claim, fresh, get, insert, outcome, reap_lapsed, task, write_back};
use crate::history::{audit_insert, audit_list, audit_prune, task_attempts};
use crate::lease::{task_claim, task_lapsed, task_reap, task_release, task_write_back};
use crate::tasks::*;
use serde_json::Value;
use sqlx::SqliteConnection;
use taskq_driver::rows::{
    AuditRow, ClaimRequest, FollowUpRow, NameList, NewTask, ReapRow, TaskFilter, WriteBack,
};
use taskq_driver::state::TaskId;

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
