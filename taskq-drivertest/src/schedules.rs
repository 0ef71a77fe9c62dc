//! Recurring schedules (`Schedules`): declare, read, fire by compare-and-set, list, delete.

use chrono::TimeDelta;
use taskq_driver::driver::Driver;
use taskq_driver::rows::{NewTask, ScheduleDecl, ScheduleFire, TaskFilter};
use taskq_driver::state::TaskState;

use crate::support::*;

/// A declared schedule starts with its watermark at the database's now (no earlier tick
/// fires); declaring it again unchanged keeps the watermark, with another expression moves it
/// to now and stores the new next tick. `schedule_states` reads the named schedules with the
/// database clock. A fire under the current watermark moves it, records the last tick and
/// worker, enqueues one task per tick (due at its tick, keyed) and returns their ids; a second
/// fire under the old watermark, or with another expression, returns `None` and writes
/// nothing. `schedule_delete` removes the row.
pub async fn a_schedule_fire_enqueues_its_ticks_once_by_compare_and_set<D: Driver>(d: D) {
    let mut c = conn(&d).await;
    let t0 = ms(now::<D>(&mut c).await);
    let decl = ScheduleDecl {
        name: "nightly",
        task_name: "a",
        queue: "q",
        expression: "0 3 * * *",
        timezone: "UTC",
        missed_ticks: "latest",
        next_tick: Some(t0 + TimeDelta::hours(3)),
    };
    d.schedule_declare(&mut c, &decl)
        .await
        .expect("schedule_declare");
    let after = now::<D>(&mut c).await;
    let st = d
        .schedule_states(&mut c, &names(&["nightly", "other"]))
        .await
        .expect("schedule_states");
    assert_eq!(st.len(), 1, "only the named ones that exist");
    let s = &st[0];
    assert_eq!(
        (s.name.as_str(), s.expression.as_str(), s.timezone.as_str()),
        ("nightly", "0 3 * * *", "UTC")
    );
    let w0 = s.watermark;
    assert!(
        t0 <= w0 && w0 <= after,
        "{}: the watermark starts at the declaration ({w0})",
        backend::<D>()
    );
    assert!(s.now >= w0 && s.now - w0 < TimeDelta::minutes(5));
    let list = d.schedule_list().await.expect("schedule_list");
    assert_eq!(list.len(), 1);
    let r = &list[0];
    assert_eq!(
        (
            r.task_name.as_str(),
            r.queue.as_str(),
            r.missed_ticks.as_str()
        ),
        ("a", "q", "latest")
    );
    assert_eq!(
        (r.next_tick, r.last_tick, r.last_worker_id.as_deref()),
        (decl.next_tick, None, None)
    );

    // Declared again unchanged: the watermark stays.
    wait_clock_past::<D>(&mut c, w0).await;
    d.schedule_declare(&mut c, &decl)
        .await
        .expect("schedule_declare");
    let st = d
        .schedule_states(&mut c, &names(&["nightly"]))
        .await
        .expect("schedule_states");
    assert_eq!(st[0].watermark, w0);

    let tick1 = w0 + TimeDelta::seconds(1);
    let tick2 = w0 + TimeDelta::seconds(2);
    let (k1, k2) = ("cron:nightly:1", "cron:nightly:2");
    let fire = ScheduleFire {
        name: "nightly",
        expression: "0 3 * * *",
        timezone: "UTC",
        old_watermark: w0,
        new_watermark: tick2,
        next_tick: Some(tick2 + TimeDelta::days(1)),
        worker_id: W,
        tasks: vec![
            NewTask {
                run_at: Some(tick1),
                idempotency_key: Some(k1),
                ..task("q", "a")
            },
            NewTask {
                run_at: Some(tick2),
                idempotency_key: Some(k2),
                ..task("q", "a")
            },
        ],
    };
    let ids = d
        .schedule_fire(&mut c, &fire)
        .await
        .expect("schedule_fire")
        .expect("the first step applies");
    assert_eq!(ids.len(), 2);
    for (id, (tick, key)) in ids.iter().zip([(tick1, k1), (tick2, k2)]) {
        let t = get(&d, *id).await;
        assert_eq!(
            (t.name.as_str(), t.queue.as_str(), t.state),
            ("a", "q", TaskState::Pending)
        );
        assert_eq!(t.run_at, tick);
        assert_eq!(t.idempotency_key.as_deref(), Some(key));
    }
    assert_eq!(
        d.schedule_fire(&mut c, &fire).await.expect("schedule_fire"),
        None,
        "the watermark moved"
    );
    let all = TaskFilter::default();
    assert_eq!(d.task_count(&all).await.expect("task_count"), 2);
    let r = &d.schedule_list().await.expect("schedule_list")[0];
    assert_eq!(
        (r.watermark, r.last_tick, r.last_worker_id.as_deref()),
        (tick2, Some(tick2), Some(W))
    );
    assert_eq!(r.next_tick, Some(tick2 + TimeDelta::days(1)));
    // Under the current watermark but another expression: refused too.
    let other = ScheduleFire {
        expression: "0 4 * * *",
        old_watermark: tick2,
        new_watermark: tick2 + TimeDelta::seconds(1),
        tasks: Vec::new(),
        ..fire
    };
    assert_eq!(
        d.schedule_fire(&mut c, &other)
            .await
            .expect("schedule_fire"),
        None
    );
    // A step without ticks moves the watermark and keeps the last tick and worker.
    let quiet = ScheduleFire {
        expression: "0 3 * * *",
        worker_id: "w2",
        ..other
    };
    assert_eq!(
        d.schedule_fire(&mut c, &quiet)
            .await
            .expect("schedule_fire"),
        Some(Vec::new())
    );
    let r = &d.schedule_list().await.expect("schedule_list")[0];
    assert_eq!(
        (r.watermark, r.last_tick, r.last_worker_id.as_deref()),
        (tick2 + TimeDelta::seconds(1), Some(tick2), Some(W))
    );

    // A changed expression moves the watermark to now and stores the new next tick.
    let changed = ScheduleDecl {
        expression: "0 4 * * *",
        next_tick: None,
        ..decl
    };
    let before = now::<D>(&mut c).await;
    d.schedule_declare(&mut c, &changed)
        .await
        .expect("schedule_declare");
    let r = &d.schedule_list().await.expect("schedule_list")[0];
    let old = tick2 + TimeDelta::seconds(1);
    assert!(
        r.watermark >= before.max(old),
        "moved to now, never back: {}",
        r.watermark
    );
    assert_eq!((r.expression.as_str(), r.next_tick), ("0 4 * * *", None));
    assert!(
        d.schedule_delete(&mut c, "nightly")
            .await
            .expect("schedule_delete")
    );
    assert!(
        !d.schedule_delete(&mut c, "nightly")
            .await
            .expect("schedule_delete")
    );
    assert!(d.schedule_list().await.expect("schedule_list").is_empty());
}
