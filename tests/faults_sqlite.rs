//! The fault scenarios of `docs/reliability.md` that apply to SQLite (issue 12), on one
//! database file shared by several worker processes on one host (WAL, busy timeout 5 s). No
//! server is needed:
//!
//! ```text
//! cargo test -p taskq-tests --test faults_sqlite
//! ```
//!
//! The children are `taskq-fault-worker` processes; the test process runs a worker too, and
//! every handler records its executions in the file's `fault_events`, so the checks count
//! executions across processes. The scenario code lives in `faults_support/sqlite.rs`; the
//! `taskq-reliability` binary runs the same scenarios at full size (`sqlite-*`) and prints the
//! figures. Tests assert outcomes (row states, counts, epochs), never timings, except a
//! generous bound on the SIGKILL takeover.

#[path = "faults_support/mod.rs"]
mod faults_support;

use std::path::Path;
use std::time::Duration;

use faults_support::Row;
use faults_support::sqlite::{self as sq, SqliteFaultDb, StarveSettings};

fn fault_worker_exe() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_taskq-fault-worker"))
}

/// SIGKILL of a worker process mid-handler: every task is completed by the other process
/// after the lease (2 s) expired and its reaper returned it: the row shows the reap
/// (`lease expired (worker child-…)`), epoch 3 (claim, reap, claim), attempt 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_sigkill_mid_handler_another_process_completes_every_task() {
    let db = SqliteFaultDb::create().await;
    db.log_transitions().await;
    for trial in 0..2 {
        let t = sq::takeover_trial(&db, fault_worker_exe(), 3, false, trial).await;
        eprintln!("SIGKILL trial {trial}: takeover {:?} s", t.takeover);
        assert_eq!(t.rows.len(), 3);
        for r in &t.rows {
            assert_eq!(r.state, "succeeded", "{r:?}");
            assert_eq!(r.worker_id.as_deref(), Some(t.second.as_str()), "{r:?}");
            assert_eq!((r.lease_epoch, r.attempt), (3, 2), "{r:?}");
            let err = r.last_error.as_deref().unwrap_or_default();
            assert!(
                err.starts_with(&format!("lease expired (worker {}, attempt 1)", t.first)),
                "{r:?}"
            );
        }
        assert_eq!(t.second_epochs, vec![3; 3]);
        for s in &t.takeover {
            // After the lease (last renewed up to a heartbeat, 500 ms, before the kill; more on
            // a loaded machine), within a generous bound.
            assert!(*s > 0.5 && *s < 4.0, "takeover {s} s with a 2 s lease");
        }
        // Each task ran exactly twice: once in the killed process, once after the reap.
        for r in &t.rows {
            let ev = db.events(r.id).await;
            let starts: Vec<_> = ev
                .iter()
                .filter(|e| e.event == "started")
                .map(|e| (e.worker_id.as_str(), e.lease_epoch))
                .collect();
            assert_eq!(starts, vec![(t.first.as_str(), 1), (t.second.as_str(), 3)]);
        }
    }
}

/// SIGTERM with a long-running handler and a 300 ms shutdown timeout: the child releases its
/// tasks (pending, epoch + 1, attempt not counted, no lease expiry) and reports them; the
/// other process starts them without waiting for the lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_sigterm_releases_running_tasks_to_another_process() {
    let db = SqliteFaultDb::create().await;
    db.log_transitions().await;
    let t = sq::takeover_trial(&db, fault_worker_exe(), 2, true, 0).await;
    eprintln!(
        "SIGTERM: takeover {:?} s, after release {:?} s",
        t.takeover, t.after_release
    );
    assert!(t.not_released.is_empty(), "{t:?}");
    let report = t.report.expect("child report");
    let mut released = report.released.clone();
    released.sort_unstable();
    assert_eq!(released, t.rows.iter().map(|r| r.id).collect::<Vec<_>>());
    assert!(report.unacknowledged.is_empty(), "{report:?}");
    assert_eq!(report.stats["released"], 2, "{report:?}");
    for r in &t.rows {
        assert_eq!(r.state, "succeeded", "{r:?}");
        assert_eq!(r.worker_id.as_deref(), Some(t.second.as_str()), "{r:?}");
        assert_eq!((r.lease_epoch, r.attempt), (3, 1), "{r:?}");
        assert_eq!(r.last_error, None, "handed over, not reaped: {r:?}");
    }
    // Handed over without waiting for the 2 s lease.
    for s in &t.after_release {
        assert!(*s < 2.0, "released task started {s} s after its release");
    }
}

/// SIGSTOP a worker process past its lease; the other process reaps, runs and finishes the
/// task; the stopped one is resumed: its handler sees `LeaseLost`, its late success
/// write-back is rejected by the epoch (counted `fenced`), and the row is unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_sigstop_past_the_lease_late_write_back_is_fenced() {
    let db = SqliteFaultDb::create().await;
    let (t, restops) = sq::pause_trial(&db, fault_worker_exe(), 0).await;
    eprintln!(
        "SIGSTOP: takeover {} s (stopped again {restops}× to avoid the write lock); events {:#?}",
        t.takeover, t.events
    );
    let b: &Row = &t.row_before_resume;
    assert_eq!(b.state, "succeeded");
    assert_eq!(b.worker_id.as_deref(), Some(t.other.as_str()));
    assert_eq!(b.lease_epoch, 3);
    assert_eq!(&t.row_after_resume, b, "the resumed worker changed the row");
    let canceled: Vec<_> = t
        .events
        .iter()
        .filter(|e| e.worker_id == t.paused && e.event.starts_with("canceled:"))
        .collect();
    assert_eq!(canceled.len(), 1, "{:?}", t.events);
    assert_eq!(canceled[0].event, "canceled:LeaseLost");
    assert_eq!(canceled[0].lease_epoch, 1);
    let s = &t.report.stats;
    assert_eq!(
        (s["lost_leases"], s["fenced"], s["succeeded"]),
        (1, 1, 0),
        "{s:?}"
    );
}

/// 10,000 transactions, each inserting a business row and enqueueing a task, a random share
/// rolled back (explicitly, by an error after the enqueue, or by dropping the transaction),
/// while three worker processes run the tasks. Tasks and committed rows match one to one;
/// every committed task ran and found its row; none ran twice except after an expired lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_transactions_commit_or_discard_the_task_with_the_business_row() {
    let db = SqliteFaultDb::create().await;
    let total = 10_000;
    let t = sq::transactions(&db, fault_worker_exe(), total, 8, 3).await;
    let run = &t.run;
    eprintln!(
        "transactions: committed {} rolled back {} failed after enqueue {} dropped {} in {:?}; \
         busy retries {}; drained {:?} after the last commit; executions {}; per process {:?}",
        run.committed,
        run.rolled_back,
        run.failed_after_enqueue,
        run.dropped,
        run.elapsed,
        t.busy_retries,
        t.drain,
        t.executions.total(),
        t.reports
            .iter()
            .map(|(id, r)| (id, r.stats["succeeded"]))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        run.committed + run.rolled_back + run.failed_after_enqueue + run.dropped,
        total
    );
    assert!(run.rolled_back > 0 && run.failed_after_enqueue > 0 && run.dropped > 0);
    assert_eq!(
        run.tasks, run.expected,
        "tasks = committed (order, task) pairs"
    );
    let mut committed_orders: Vec<u64> = run.expected.iter().map(|e| e.0).collect();
    committed_orders.sort_unstable();
    assert_eq!(run.orders, committed_orders, "business rows = committed");
    assert_eq!(run.orphans_seen, 0);
    assert_eq!(run.dead, 0);
    t.executions.check().unwrap();
    assert_eq!(t.executions.rows.len() as u64, run.committed);
    let reruns = t.executions.total() - t.executions.rows.len();
    assert_eq!(run.found, run.committed as usize + reruns);
    let succeeded: u64 = t.reports.iter().map(|(_, r)| r.stats["succeeded"]).sum();
    assert_eq!(succeeded, run.committed, "one success per committed task");
}

/// Poison pills on a queue worked by two processes (concurrency 4 each): a handler that
/// panics on every attempt ends dead after 3 attempts (its process keeps working); one that
/// hangs under a 500 ms timeout ends dead after 2; one that exits its process ends dead after
/// 3 attempts, each one reaped by the lease (the process is replaced each time, as a
/// supervisor would). The 400 ordinary tasks (100 ms each) all succeed; one ran twice only if
/// its lease expired because it was running in a process the exit pill ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_poison_pills_end_dead_and_others_are_unaffected() {
    let db = SqliteFaultDb::create().await;
    let run = sq::poison(&db, fault_worker_exe(), 400, 2).await;
    eprintln!(
        "poison: {:?}; exited {:?}; ordinary executions {} of {} tasks, {} reaped",
        run.elapsed,
        run.exited,
        run.work.total(),
        run.work.rows.len(),
        run.work.reaped().len()
    );
    let p = &run.panic;
    assert_eq!(
        (p.state.as_str(), p.attempt, run.panic_runs),
        ("dead", 3, 3),
        "{p:?}"
    );
    assert!(
        p.last_error
            .as_deref()
            .unwrap()
            .starts_with("handler panicked: poison pill"),
        "{p:?}"
    );
    let x = &run.exit;
    assert_eq!(
        (x.state.as_str(), x.attempt, run.exit_runs),
        ("dead", 3, 3),
        "{x:?}"
    );
    assert!(
        x.last_error
            .as_deref()
            .unwrap()
            .starts_with("lease expired (worker poison-"),
        "{x:?}"
    );
    assert_eq!(x.lease_epoch, 6, "three claims, three reaps: {x:?}");
    assert_eq!(
        run.exited.len(),
        3,
        "the exit pill ended a process on each attempt"
    );
    let tm = &run.timed;
    assert_eq!(
        (tm.state.as_str(), tm.attempt, run.timed_runs),
        ("dead", 2, 2),
        "{tm:?}"
    );
    assert!(
        tm.last_error
            .as_deref()
            .unwrap()
            .starts_with("timed out after 500ms"),
        "{tm:?}"
    );
    assert_eq!(run.work.rows.len(), 400);
    run.work.check().unwrap();
    // The only ordinary tasks that ran again were in a process the exit pill ended.
    for r in run.work.rows.iter().filter(|r| r.last_error.is_some()) {
        let e = r.last_error.as_deref().unwrap();
        assert!(
            run.exited
                .iter()
                .any(|w| e.starts_with(&format!("lease expired (worker {w}, attempt "))),
            "{r:?}"
        );
    }
    let panics: u64 = run.reports.iter().map(|(_, r)| r.stats["panics"]).sum();
    assert!(panics <= 3, "{:?}", run.reports);
}

/// Four worker processes on one file under a write-heavy load (producers enqueueing one task
/// per transaction, handlers logging every run): each process holds two long tasks (6 s, three
/// 2 s leases, heartbeat every 667 ms) on its own queue while all share a queue of short
/// tasks. Whatever the share each process gets, the invariants hold: every task succeeded,
/// none ran twice under one epoch, none twice except after an expired lease. The figures
/// (share per process, leases lost, least time left on a lease) are printed; the runner
/// (`taskq-reliability sqlite-starve`) measures them at several lease lengths.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_four_processes_under_write_load_keep_their_leases_or_are_fenced() {
    let db = SqliteFaultDb::create().await;
    let s = StarveSettings {
        processes: 4,
        lease: Duration::from_secs(2),
        hold: Duration::from_secs(6),
        long_per_process: 2,
        load_concurrency: 4,
        producers: 4,
        busy: sq::tolerated(
            Duration::from_secs(2),
            Duration::from_secs(2) / 3,
            Duration::from_millis(500),
        ),
    };
    let run = sq::starvation(&db, fault_worker_exe(), &s).await;
    eprintln!(
        "starvation: share {:?}; per process (claimed, lost, stmt timeouts, db errors, fenced) {:?}; \
         long leases lost {} of {}; least lease time left {:?}; produced {} (busy {}); {:?}",
        run.load_share,
        run.per_process,
        run.long_lost,
        run.long_total,
        run.min_slack,
        run.produced,
        run.producer_busy,
        run.elapsed
    );
    run.executions.check().unwrap();
    assert_eq!(run.long_total, 8);
}

/// SQLite's write lock held (by a long transaction of another process) for 2.5 s, longer than
/// a 2 s lease can survive (heartbeat 500 ms, cancel grace 500 ms: at worst 1 s without a
/// renewal): every heartbeat waits, the child's leases are lost, its handlers are canceled
/// with `LeaseLost`, and once the lock is free the tasks run again under a new epoch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_write_lock_held_past_the_lease_loses_it_and_the_task_runs_again() {
    let db = SqliteFaultDb::create().await;
    let s = faults_support::ChildSettings::default();
    let t = sq::lock_hold_trial(
        &db,
        fault_worker_exe(),
        &s,
        2,
        Duration::from_millis(2500),
        Duration::ZERO,
        0,
    )
    .await;
    eprintln!("lock held 2.5 s, lease 2 s: {t:?}");
    assert!(!t.renewed);
    assert_eq!(t.tolerated, Duration::from_secs(1));
    for r in &t.rows {
        assert_eq!(r.state, "succeeded", "{r:?}");
        assert!(r.lease_epoch >= 3, "ran again under a new epoch: {r:?}");
        let ev = &t.events[&r.id];
        assert!(
            ev.iter()
                .any(|e| e.lease_epoch == 1 && e.event == "canceled:LeaseLost"),
            "{ev:?}"
        );
        let epochs: Vec<u64> = ev
            .iter()
            .filter(|e| e.event == "started")
            .map(|e| e.lease_epoch)
            .collect();
        assert_eq!(
            epochs.len(),
            epochs
                .iter()
                .collect::<std::collections::HashSet<_>>()
                .len()
        );
    }
    assert_eq!(t.report.stats["lost_leases"], 2, "{:?}", t.report);
}

/// The same hold (4.5 s, under the 5 s busy timeout) with a 15 s lease (heartbeat 5 s, cancel
/// grace 5 s: the defaults' proportions, lease = 3 × busy timeout): the waiting heartbeat gets
/// the lock when it is released and renews every lease; nothing is canceled or run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_write_lock_held_under_the_busy_timeout_keeps_a_three_busy_timeout_lease() {
    let db = SqliteFaultDb::create().await;
    let s = faults_support::ChildSettings {
        lease: Duration::from_secs(15),
        heartbeat: Duration::from_secs(5),
        cancel_grace: Duration::from_secs(5),
        ..Default::default()
    };
    let t = sq::lock_hold_trial(
        &db,
        fault_worker_exe(),
        &s,
        2,
        Duration::from_millis(4500),
        Duration::ZERO,
        0,
    )
    .await;
    eprintln!("lock held 4.5 s, lease 15 s: {t:?}");
    assert!(t.renewed, "{t:?}");
    assert_eq!(t.tolerated, Duration::from_secs(5));
    for r in &t.rows {
        assert_eq!(
            (r.state.as_str(), r.lease_epoch, r.attempt),
            ("pending", 2, 0),
            "released at SIGTERM (the attempt not counted): {r:?}"
        );
        assert!(
            t.events[&r.id]
                .iter()
                .all(|e| !e.event.starts_with("canceled:LeaseLost")),
            "{:?}",
            t.events
        );
    }
    assert_eq!(t.report.stats["lost_leases"], 0, "{:?}", t.report);
}

/// The settings of issue 34's short SQLite lease on taskq's default 5 s busy timeout: lease
/// 2 s, heartbeat 667 ms (a third), cancel grace 500 ms, so a renewal has 833 ms between its
/// heartbeat and the watchdog's cancel point. Before issue 34 `build` refused it (the rule was
/// lease − heartbeat − grace ≥ the busy timeout, 5 s, "use a lease of at least 15s").
fn short_lease_on_the_default_busy_timeout() -> faults_support::ChildSettings {
    faults_support::ChildSettings {
        lease: Duration::from_secs(2),
        heartbeat: Duration::from_millis(667),
        cancel_grace: Duration::from_millis(500),
        busy: Some(taskq::sqlite::DEFAULT_BUSY_TIMEOUT),
        shutdown_timeout: Duration::from_millis(300),
        ..Default::default()
    }
}

/// Issue 34: a 2 s lease on a pool with the default 5 s busy timeout, and another connection
/// holding the write lock for 600 ms, under the 833 ms the lease leaves a renewal (at two
/// points of the heartbeat): the renewal, tried in 100 ms tries on its own connection, gets
/// the lock once it is released and every lease is kept: nothing canceled, lost_leases 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_short_lease_on_the_default_busy_timeout_survives_a_hold_under_its_margin() {
    let s = short_lease_on_the_default_busy_timeout();
    for (trial, phase) in [Duration::ZERO, Duration::from_millis(350)]
        .into_iter()
        .enumerate()
    {
        let db = SqliteFaultDb::create().await;
        let t = sq::lock_hold_trial(
            &db,
            fault_worker_exe(),
            &s,
            2,
            Duration::from_millis(600),
            phase,
            trial,
        )
        .await;
        eprintln!("lock held 0.6 s at {phase:?}, lease 2 s, busy timeout 5 s: {t:?}");
        assert_eq!(t.tolerated, Duration::from_millis(833));
        assert!(t.renewed, "{t:?}");
        for r in &t.rows {
            assert_eq!(
                (r.state.as_str(), r.lease_epoch, r.attempt),
                ("pending", 2, 0),
                "released at SIGTERM (the attempt not counted): {r:?}"
            );
            assert!(
                t.events[&r.id]
                    .iter()
                    .all(|e| !e.event.starts_with("canceled:LeaseLost")),
                "{:?}",
                t.events
            );
        }
        assert_eq!(t.report.stats["lost_leases"], 0, "{:?}", t.report);
    }
}

/// Issue 34: a hold longer than the lease's margin (lease 3 s, heartbeat 1 s, cancel grace
/// 1.5 s: 0.5 s; the lock held 1.7 s) on a pool with the default 5 s busy timeout, handlers
/// that ignore their cancel signal (aborted at the end of the grace, no outcome written). The
/// leases are lost, and no renewal lands after the watchdog gave them up: the database lease
/// is not renewed after the release, so the tasks run again within a lease + the reaper
/// interval (+ 1 s for the machine) of the lock being taken. A renewal that waited the 5 s
/// busy timeout got the lock at the release and renewed leases its worker had given up,
/// leaving the tasks `running`, unworked, for another lease (seen with the rule relaxed
/// alone, before renewals got their own short tries).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_renewal_never_lands_after_its_lease_was_given_up() {
    let db = SqliteFaultDb::create().await;
    let s = faults_support::ChildSettings {
        lease: Duration::from_secs(3),
        heartbeat: Duration::from_secs(1),
        cancel_grace: Duration::from_millis(1500),
        busy: Some(taskq::sqlite::DEFAULT_BUSY_TIMEOUT),
        ..Default::default()
    };
    let t = sq::lock_hold_trial_with(
        &db,
        fault_worker_exe(),
        &s,
        2,
        Duration::from_millis(1700),
        Duration::ZERO,
        0,
        true,
    )
    .await;
    let rerun = t.rerun_after_taken();
    eprintln!(
        "lock held 1.7 s, lease 3 s, busy timeout 5 s: rerun {rerun:?} s after the take; {t:?}"
    );
    assert_eq!(t.tolerated, Duration::from_millis(500));
    assert!(
        !t.renewed,
        "a lease given up was renewed after the release: {t:?}"
    );
    assert_eq!(t.report.stats["lost_leases"], 2, "{:?}", t.report);
    for r in &t.rows {
        assert_eq!(r.state, "succeeded", "{r:?}");
        assert!(r.lease_epoch >= 3, "ran again under a new epoch: {r:?}");
        assert!(
            t.events[&r.id]
                .iter()
                .any(|e| e.lease_epoch == 1 && e.event == "canceled:LeaseLost"),
            "{:?}",
            t.events[&r.id]
        );
    }
    let bound = (s.lease + s.reaper).as_secs_f64() + 1.0;
    for at in rerun {
        let at = at.expect("every task ran again");
        assert!(
            at < bound,
            "ran again {at} s after the lock was taken (bound {bound} s)"
        );
    }
}

/// Issue 34: SIGKILL of a process holding 2 tasks under the short lease (2 s) on the default
/// 5 s busy timeout: the other process completes both after the lease, within the documented
/// bound (lease + reaper interval; + 1.5 s here for the machine).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_sigkill_takeover_under_a_short_lease_on_the_default_busy_timeout() {
    let db = SqliteFaultDb::create().await;
    db.log_transitions().await;
    let s = short_lease_on_the_default_busy_timeout();
    let t = sq::takeover_trial_with(&db, fault_worker_exe(), &s, 2, false, 0).await;
    eprintln!(
        "SIGKILL, lease 2 s, busy timeout 5 s: takeover {:?} s",
        t.takeover
    );
    for r in &t.rows {
        assert_eq!(r.state, "succeeded", "{r:?}");
        assert_eq!(r.worker_id.as_deref(), Some(t.second.as_str()), "{r:?}");
        assert_eq!((r.lease_epoch, r.attempt), (3, 2), "{r:?}");
    }
    let bound = (s.lease + s.reaper).as_secs_f64() + 1.5;
    for at in &t.takeover {
        assert!(*at < bound, "takeover {at} s (bound {bound} s)");
    }
}
