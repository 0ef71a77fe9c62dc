//! The audit trail (`Enqueue::audit_insert`, `History`), the per-minute counts, the attempt
//! history's bounds, and the follow-ups' backstops.

use taskq_driver::driver::Driver;
use taskq_driver::rows::{AuditRow, FollowUpRow, NewTask, ReapRow, TaskFilter, WriteBack};
use taskq_driver::state::TaskState;

use crate::support::*;

/// Audit entries are inserted at the database clock with increasing ids (a task's entry
/// records the task's queue when none is given) and listed newest first, by task, by queue
/// and by page (`before_id`); `audit_prune` deletes the entries older than `age_secs`,
/// oldest first, up to `limit`.
pub async fn audit_entries_are_listed_newest_first_and_pruned_oldest_first<D: Driver>(d: D) {
    let mut c = conn(&d).await;
    let t = insert::<D>(&mut c, task("emails", "a")).await;
    let before = now::<D>(&mut c).await;
    let mut ids = Vec::new();
    for (action, task_id, queue) in [
        ("cancel", Some(t.0), None),
        ("pause", None, Some("emails")),
        ("pause", None, Some("other")),
        ("retry", Some(t.0), None),
        ("create", None, None),
    ] {
        let entry = AuditRow {
            actor: "cli:me@host",
            action,
            task_id,
            queue,
            detail: Some(r#"{"n":1}"#.into()),
        };
        ids.push(D::audit_insert(&mut c, &entry).await.expect("audit_insert"));
        // One entry per tick of the clock (SQLite's is in milliseconds), so that "oldest
        // first" has one answer.
        let at = now::<D>(&mut c).await;
        wait_clock_past::<D>(&mut c, at).await;
    }
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
    let all = d
        .audit_list(None, None, u64::MAX >> 1, 100)
        .await
        .expect("audit_list");
    let got: Vec<(u64, &str, Option<u64>, Option<&str>)> = all
        .iter()
        .map(|r| (r.id, r.action.as_str(), r.task_id, r.queue.as_deref()))
        .collect();
    assert_eq!(
        got,
        vec![
            (ids[4], "create", None, None),
            (ids[3], "retry", Some(t.0), Some("emails")),
            (ids[2], "pause", None, Some("other")),
            (ids[1], "pause", None, Some("emails")),
            (ids[0], "cancel", Some(t.0), Some("emails")),
        ],
        "{}",
        backend::<D>()
    );
    assert_eq!(all[0].actor, "cli:me@host");
    assert_eq!(all[0].detail.as_deref(), Some(r#"{"n":1}"#));
    assert!(all.iter().all(|r| r.at >= before));
    let of_task = d
        .audit_list(Some(t.0), None, u64::MAX >> 1, 100)
        .await
        .expect("audit_list");
    assert_eq!(
        of_task.iter().map(|r| r.id).collect::<Vec<_>>(),
        vec![ids[3], ids[0]]
    );
    let of_queue = d
        .audit_list(None, Some("emails"), ids[3], 100)
        .await
        .expect("audit_list");
    assert_eq!(
        of_queue.iter().map(|r| r.id).collect::<Vec<_>>(),
        vec![ids[1], ids[0]],
        "before ids[3], of the queue"
    );
    let page = d
        .audit_list(None, None, ids[4], 2)
        .await
        .expect("audit_list");
    assert_eq!(
        page.iter().map(|r| r.id).collect::<Vec<_>>(),
        vec![ids[3], ids[2]]
    );

    assert_eq!(
        d.audit_prune(&mut c, 3_600, 100)
            .await
            .expect("audit_prune"),
        0
    );
    let newest = all[0].at;
    wait_clock_past::<D>(&mut c, newest).await;
    assert_eq!(d.audit_prune(&mut c, 0, 2).await.expect("audit_prune"), 2);
    let left = d
        .audit_list(None, None, u64::MAX >> 1, 100)
        .await
        .expect("audit_list");
    assert_eq!(
        left.iter().map(|r| r.id).collect::<Vec<_>>(),
        vec![ids[4], ids[3], ids[2]],
        "the oldest went first"
    );
    assert_eq!(d.audit_prune(&mut c, 0, 100).await.expect("audit_prune"), 3);
}

/// Tasks that ended in the last minutes are counted per state and minute
/// (`task_finished_per_minute`), failed attempts per outcome and minute from the attempt
/// histories (`task_failed_attempts_per_minute`: `failed`, `timed_out`, `panicked`,
/// `lease_lost`; not successes, snoozes or cancels); all in minute 0 here.
pub async fn ended_tasks_and_failed_attempts_are_counted_per_minute<D: Driver>(d: D) {
    let mut c = conn(&d).await;
    let mut ids = Vec::new();
    for _ in 0..6 {
        ids.push(insert::<D>(&mut c, task("q", "a")).await);
    }
    let lost = insert::<D>(&mut c, task("q", "b")).await;
    let got = claim(&d, &mut c, &req("q", &names(&["a"]), 6)).await;
    let t = &got.tasks;
    let batch = vec![
        outcome(&t[0], "succeeded", "succeeded"),
        outcome(&t[1], "succeeded", "succeeded"),
        outcome(&t[2], "dead", "failed"),
        outcome(&t[3], "dead", "panicked"),
        WriteBack {
            delay_us: HOUR_US,
            ..outcome(&t[4], "pending", "timed_out")
        },
        outcome(&t[5], "canceled", "canceled"),
    ];
    d.task_write_back(&mut c, &batch)
        .await
        .expect("task_write_back");
    claim_one(&d, &mut c, "q", "b", SHORT_LEASE_US, lost).await;
    wait_lease_expired(&d, &mut c, lost).await;
    let rows = d
        .task_lapsed(&mut c, &names(&["b"]), 10)
        .await
        .expect("task_lapsed");
    d.task_reap(&mut c, &[reap_row(&rows[0])], false)
        .await
        .expect("task_reap");
    assert_eq!(get(&d, lost).await.state, TaskState::Pending);

    let mut finished = d
        .task_finished_per_minute(5)
        .await
        .expect("task_finished_per_minute");
    finished.sort_by_key(|(s, m, _)| (s.as_str(), *m));
    assert_eq!(
        finished,
        vec![
            (TaskState::Canceled, 0, 1),
            (TaskState::Dead, 0, 2),
            (TaskState::Succeeded, 0, 2),
        ],
        "{}",
        backend::<D>()
    );
    let mut failed = d
        .task_failed_attempts_per_minute(5)
        .await
        .expect("task_failed_attempts_per_minute");
    failed.sort();
    assert_eq!(
        failed,
        vec![
            ("failed".to_string(), 0, 1),
            ("lease_lost".to_string(), 0, 1),
            ("panicked".to_string(), 0, 1),
            ("timed_out".to_string(), 0, 1),
        ],
        "{}",
        backend::<D>()
    );
    assert!(
        d.task_finished_per_minute(0)
            .await
            .expect("task_finished_per_minute")
            .is_empty()
    );
}

/// The attempt history keeps the latest 100 entries (the oldest go first) and cuts an entry's
/// error to 1,024 characters, the last one `…`; the task's `last_error` keeps the whole error.
pub async fn the_attempt_history_keeps_the_latest_100_entries_and_cuts_long_errors<D: Driver>(
    d: D,
) {
    let mut c = conn(&d).await;
    let id = insert::<D>(&mut c, task("q", "a")).await;
    let an = names(&["a"]);
    for _ in 0..102 {
        let got = claim(&d, &mut c, &req("q", &an, 1)).await;
        assert_eq!(claimed_ids(&got), vec![id]);
        d.task_write_back(&mut c, &[outcome(&got.tasks[0], "snoozed", "snoozed")])
            .await
            .expect("task_write_back");
    }
    let h = history(&d, id).await;
    assert_eq!(h.len(), 100, "{}", backend::<D>());
    // Epochs 1 and 2 were dropped, oldest first.
    assert_eq!((&h[0]["epoch"], &h[99]["epoch"]), (&3.into(), &102.into()));
    assert!(
        h.iter()
            .all(|e| e["attempt"] == 1 && e["outcome"] == "snoozed")
    );

    let long = "é".repeat(2000);
    let got = claim(&d, &mut c, &req("q", &an, 1)).await;
    d.task_write_back(
        &mut c,
        &[WriteBack {
            error: Some(long.clone()),
            ..outcome(&got.tasks[0], "dead", "failed")
        }],
    )
    .await
    .expect("task_write_back");
    let h = history(&d, id).await;
    assert_eq!(h.len(), 100);
    assert_eq!((&h[0]["epoch"], &h[99]["epoch"]), (&4.into(), &103.into()));
    let err = h[99]["error"].as_str().expect("an error");
    assert_eq!(err.chars().count(), 1024, "{}", backend::<D>());
    assert!(err.starts_with("éé") && err.ends_with('…'), "{err}");
    assert_eq!(get(&d, id).await.last_error.as_deref(), Some(long.as_str()));
}

fn follow_up(key: String) -> Box<FollowUpRow> {
    Box::new(FollowUpRow {
        queue: "fq",
        name: "then",
        payload: b"{}".to_vec(),
        priority: 0,
        max_attempts: 3,
        ttl_us: None,
        key,
        trace_context: None,
    })
}

/// A follow-up's idempotency key is its backstop: when a task already holds the key, that task
/// stays the only one and the write-back it follows still lands. A reap planned from a read
/// that a write-back overtook (the task ended between `task_lapsed` and `task_reap`) writes
/// nothing and inserts no follow-up.
pub async fn a_follow_up_whose_key_is_taken_or_whose_reap_was_overtaken_inserts_nothing<
    D: Driver,
>(
    d: D,
) {
    let mut c = conn(&d).await;
    let fq = TaskFilter {
        queue: Some("fq"),
        ..TaskFilter::default()
    };
    let b = insert::<D>(&mut c, task("q", "a")).await;
    let tb = claim_one(&d, &mut c, "q", "a", LEASE_US, b).await;
    let key = format!("taskq:on_dead:{b}:1");
    let holder = insert::<D>(
        &mut c,
        NewTask {
            idempotency_key: Some(&key),
            ..task("fq", "then")
        },
    )
    .await;
    let done = d
        .task_write_back(
            &mut c,
            &[WriteBack {
                follow_up: Some(follow_up(key.clone())),
                ..outcome(&tb, "dead", "failed")
            }],
        )
        .await
        .expect("task_write_back");
    assert_eq!(done.written, 1, "{}: the end lands", backend::<D>());
    assert_eq!(get(&d, b).await.state, TaskState::Dead);
    let made = d
        .task_list(&fq, 0, u64::MAX >> 1, 10)
        .await
        .expect("task_list");
    assert_eq!(
        made.iter().map(|t| t.id).collect::<Vec<_>>(),
        vec![holder],
        "the key's holder stays the only follow-up"
    );

    let u = insert::<D>(
        &mut c,
        NewTask {
            max_attempts: 1,
            ..task("q", "c")
        },
    )
    .await;
    let tu = claim_one(&d, &mut c, "q", "c", SHORT_LEASE_US, u).await;
    wait_lease_expired(&d, &mut c, u).await;
    let rows = d
        .task_lapsed(&mut c, &names(&["c"]), 10)
        .await
        .expect("task_lapsed");
    assert_eq!(rows.len(), 1);
    assert!(rows[0].goes_dead());
    // The late write-back lands first (an expired lease is not a lost one until reaped).
    let late = d
        .task_write_back(&mut c, &[outcome(&tu, "succeeded", "succeeded")])
        .await
        .expect("task_write_back");
    assert_eq!(late.written, 1);
    let plan = [ReapRow {
        follow_up: Some(follow_up("taskq:on_dead:late".into())),
        ..reap_row(&rows[0])
    }];
    let reaped = d.task_reap(&mut c, &plan, true).await.expect("task_reap");
    assert_eq!(
        (reaped.reaped, reaped.rows.len(), reaped.followed.len()),
        (0, 0, 0),
        "{}",
        backend::<D>()
    );
    assert_eq!(get(&d, u).await.state, TaskState::Succeeded);
    assert_eq!(d.task_count(&fq).await.expect("task_count"), 1);
}
