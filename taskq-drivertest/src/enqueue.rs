//! The producer path (`Enqueue`) and reading a task back (`task_get`, `task_state`).

use chrono::TimeDelta;
use taskq_driver::driver::Driver;
use taskq_driver::rows::{NewTask, TaskFilter};
use taskq_driver::state::{TaskId, TaskState};

use crate::support::*;

/// A task inserted with every field set is read back by `task_get` with each field as
/// inserted (payload bytes exactly, explicit due time and deadline, key, trace context) and
/// the state of a new task (pending, attempt 0, epoch 0, no lease, no worker, created and
/// updated at the insert on the database clock); a delay and a ttl are counted from the
/// insert's clock. `task_state` reads the state; an unknown id is `None` for both.
pub async fn insert_then_get_returns_every_field_as_inserted<D: Driver>(d: D) {
    let mut c = conn(&d).await;
    let before = now::<D>(&mut c).await;
    let run_at = ms(before) - TimeDelta::seconds(90);
    let deadline = run_at + TimeDelta::hours(1);
    let payload: &[u8] = &[0, 159, b'{', 255, b'"', b'\\'];
    let id = insert::<D>(
        &mut c,
        NewTask {
            payload,
            priority: -7,
            max_attempts: 9,
            // Ignored: `run_at` is set.
            delay_us: 5_000_000,
            run_at: Some(run_at),
            deadline: Some(deadline),
            idempotency_key: Some("key-1"),
            trace_context: Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
            ..task("q1", "full")
        },
    )
    .await;
    let after = now::<D>(&mut c).await;
    let t = get(&d, id).await;
    assert_eq!(t.id, id);
    assert_eq!((t.queue.as_str(), t.name.as_str()), ("q1", "full"));
    assert_eq!(t.payload, payload, "payload bytes round-trip");
    assert_eq!(t.state, TaskState::Pending);
    assert_eq!((t.priority, t.attempt, t.max_attempts), (-7, 0, 9));
    assert_eq!(t.run_at, run_at);
    assert_eq!(t.deadline, Some(deadline));
    assert_eq!((t.lease_until, t.lease_epoch), (None, 0));
    assert_eq!(t.worker_id, None);
    assert_eq!(t.idempotency_key.as_deref(), Some("key-1"));
    assert_eq!(
        t.trace_context.as_deref(),
        Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
    );
    // DISAGREES (before the fix in taskq-sqlite/src/tasks.rs): SQLite read `unique_key` as
    // `lower(hex(unique_key))`, and SQLite's `hex(NULL)` is `''`: a task without identity
    // came back with `Some("")`.
    assert_eq!((t.unique_key.as_deref(), t.unique_held), (None, false));
    assert_eq!(t.last_error, None);
    assert!(
        before <= t.created_at && t.created_at <= after,
        "{}: created at {} on the database clock, between {before} and {after}",
        backend::<D>(),
        t.created_at
    );
    assert_eq!(t.updated_at, t.created_at);
    assert_eq!((t.finished_at, t.attempted_at, t.snoozes), (None, None, 0));

    // Relative times are counted from the insert's own clock.
    let rel = insert::<D>(
        &mut c,
        NewTask {
            delay_us: HOUR_US,
            ttl_us: Some(2 * HOUR_US),
            ..task("q1", "relative")
        },
    )
    .await;
    let r = get(&d, rel).await;
    assert_eq!(r.run_at, r.created_at + TimeDelta::hours(1));
    assert_eq!(r.deadline, Some(r.created_at + TimeDelta::hours(2)));
    assert_eq!(
        (
            r.idempotency_key,
            r.trace_context,
            r.priority,
            r.max_attempts
        ),
        (None, None, 0, 3)
    );
    assert_eq!(r.payload, b"{}");

    assert_eq!(
        d.task_state(id).await.expect("task_state"),
        Some(TaskState::Pending)
    );
    let missing = TaskId(rel.0 + 1_000);
    assert_eq!(d.task_state(missing).await.expect("task_state"), None);
    assert!(d.task_get(missing).await.expect("task_get").is_none());
}

/// An idempotency key is taken per task name: inserting the same (name, key) again writes
/// nothing and returns `Duplicate(first id)`, the first task unchanged; the same key under
/// another name is a new task. With a unique identity as well, a taken key is reported
/// first and the identity is not taken by the duplicate.
pub async fn an_idempotency_key_inserted_twice_returns_the_first_task<D: Driver>(d: D) {
    let mut c = conn(&d).await;
    let keyed = |name, payload| NewTask {
        idempotency_key: Some("k1"),
        payload,
        ..task("q", name)
    };
    let first = insert::<D>(&mut c, keyed("a", b"{\"n\":1}")).await;
    let again = insert_duplicate::<D>(&mut c, keyed("a", b"{\"n\":2}")).await;
    assert_eq!(again, first, "the duplicate returns the first task");
    assert_eq!(
        get(&d, first).await.payload,
        b"{\"n\":1}",
        "first unchanged"
    );
    let all = TaskFilter::default();
    assert_eq!(d.task_count(&all).await.expect("task_count"), 1);
    let other_name = insert::<D>(&mut c, keyed("b", b"{}")).await;
    assert_ne!(other_name, first);
    assert_eq!(d.task_count(&all).await.expect("task_count"), 2);

    // Key and identity: the key is checked first, and the identity stays free.
    let key = [0x11; 32];
    let both = NewTask {
        idempotency_key: Some("k1"),
        ..unique("a", &key, "pending")
    };
    assert_eq!(insert_duplicate::<D>(&mut c, both).await, first);
    assert_eq!(d.task_count(&all).await.expect("task_count"), 2);
    let holder = insert::<D>(&mut c, unique("a", &key, "pending")).await;
    assert!(get(&d, holder).await.unique_held, "the identity was free");
}

/// `task_insert_rows` inserts every row and returns their ids in input order (ascending),
/// each row stored as given; an empty input inserts nothing.
pub async fn insert_rows_returns_the_new_ids_in_input_order<D: Driver>(d: D) {
    let mut c = conn(&d).await;
    assert!(
        D::task_insert_rows(&mut c, &[])
            .await
            .expect("task_insert_rows")
            .is_empty()
    );
    let at = ms(now::<D>(&mut c).await) - TimeDelta::minutes(5);
    let names: Vec<String> = (0..7).map(|i| format!("n{i}")).collect();
    let payloads: Vec<Vec<u8>> = (0..7u8).map(|i| vec![i, 0, 255, b'}']).collect();
    let rows: Vec<NewTask<'_>> = (0..7)
        .map(|i| NewTask {
            payload: &payloads[i],
            priority: i as i16 - 3,
            max_attempts: 1 + i as u32,
            run_at: (i == 2).then_some(at),
            delay_us: if i == 3 { HOUR_US } else { 0 },
            trace_context: (i == 4).then_some("00-trace"),
            ..task(if i % 2 == 0 { "even" } else { "odd" }, &names[i])
        })
        .collect();
    let ids = D::task_insert_rows(&mut c, &rows)
        .await
        .expect("task_insert_rows");
    assert_eq!(ids.len(), 7);
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ascending: {ids:?}");
    for (i, id) in ids.iter().enumerate() {
        let t = get(&d, *id).await;
        assert_eq!(t.name, names[i], "row {i}");
        assert_eq!(t.payload, payloads[i], "row {i}");
        assert_eq!(t.queue, if i % 2 == 0 { "even" } else { "odd" }, "row {i}");
        assert_eq!(
            (t.priority, t.max_attempts),
            (i as i16 - 3, 1 + i as u32),
            "row {i}"
        );
        assert_eq!(t.state, TaskState::Pending, "row {i}");
        assert_eq!(t.idempotency_key, None, "row {i}");
        assert_eq!(
            t.trace_context.as_deref(),
            (i == 4).then_some("00-trace"),
            "row {i}"
        );
        match i {
            2 => assert_eq!(t.run_at, at),
            3 => assert_eq!(t.run_at, t.created_at + TimeDelta::hours(1)),
            _ => assert_eq!(t.run_at, t.created_at, "row {i}: due at its insert"),
        }
    }
    let more = D::task_insert_rows(&mut c, &rows[..2])
        .await
        .expect("task_insert_rows");
    assert_eq!(more.len(), 2);
    assert!(more[0] > ids[6] && more[1] > more[0]);
    assert_eq!(
        d.task_count(&TaskFilter::default())
            .await
            .expect("task_count"),
        9
    );
}
