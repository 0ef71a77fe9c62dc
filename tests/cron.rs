//! Recurring (cron) tasks against a real database: one task per tick, the missed-tick
//! policies, a changed expression, a removed schedule, old ticks after retention, typed build
//! errors, and the fleet: 8 worker processes firing one schedule, exactly one task per tick.
//!
//! ```text
//! cargo test -p taskq-tests --test cron
//! ```

#[path = "cron_support/mod.rs"]
mod cron_support;

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Timelike, Utc};
use serde::{Deserialize, Serialize};
use sqlx::ConnectOptions;
use taskq::{
    Client, Error, Task, TaskContext, TaskError,
    schedule::{MissedTicks, Schedule, schedule_tick_key},
};
use taskq_tests::{RunningWorker, TestDb, fast_worker, wait_until};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

use cron_support::FleetTick;

/// A task with a payload, scheduled on the worker builder.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Beat {
    tag: String,
}

impl Task for Beat {
    const NAME: &'static str = "cron_beat";
    const QUEUE: &'static str = "cron";
    async fn run(self, _cx: TaskContext) -> Result<(), TaskError> {
        Ok(())
    }
}

fn beat(tag: &str) -> Beat {
    Beat { tag: tag.into() }
}

/// Declared on the task: every second.
#[taskq::task(cron = "* * * * * *", queue = "cron_second")]
async fn every_second() -> Result<(), TaskError> {
    Ok(())
}

/// One task a schedule enqueued.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
struct Tick {
    run_at: DateTime<Utc>,
    key: String,
    payload: String,
    state: String,
}

/// The tasks of schedule `name` (by their idempotency key), by tick.
async fn ticks(db: &TestDb, name: &str) -> Vec<Tick> {
    sqlx::query_as(
        "SELECT run_at, idempotency_key AS `key`, CAST(payload AS CHAR) AS payload,
                CAST(state AS CHAR) AS state
         FROM taskq_tasks WHERE idempotency_key LIKE CONCAT('cron:', ?, ':%') ORDER BY run_at",
    )
    .bind(name)
    .fetch_all(&db.pool)
    .await
    .expect("read ticks")
}

async fn db_now(db: &TestDb) -> DateTime<Utc> {
    Client::new(db.pool.clone()).db_now().await.unwrap()
}

async fn schedule(db: &TestDb, name: &str) -> Option<taskq::client::ScheduleInfo> {
    let all = Client::new(db.pool.clone()).schedules().await.unwrap();
    all.into_iter().find(|s| s.name == name)
}

/// Checks that `ticks` are one task per tick of a one-second schedule named `name`: keys
/// match ticks, run_at on whole seconds, consecutive, none twice.
fn assert_every_second(name: &str, ticks: &[Tick]) {
    for t in ticks {
        assert_eq!(t.key, schedule_tick_key(name, t.run_at), "{t:?}");
        assert_eq!(t.run_at.nanosecond(), 0, "ticks are whole seconds: {t:?}");
    }
    for w in ticks.windows(2) {
        assert_eq!(
            w[1].run_at - w[0].run_at,
            TimeDelta::seconds(1),
            "a tick is missing or duplicated between {:?} and {:?}",
            w[0],
            w[1]
        );
    }
}

/// One worker, a schedule declared on the task (`#[task(cron = "* * * * * *")]`): one task per
/// second, each run, none before the worker started, and the schedule's row tells the last
/// and the next tick.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_worker_enqueues_one_task_per_tick() {
    let Some(db) = TestDb::new_or_skip().await else {
        return;
    };
    let started = db_now(&db).await;
    let w = RunningWorker::spawn(fast_worker(&db.pool).register::<EverySecond>());
    wait_until(Duration::from_secs(20), "5 ticks", || async {
        ticks(&db, "every_second").await.len() >= 5
    })
    .await;
    let report = w.stop().await;
    let ticks = ticks(&db, "every_second").await;
    assert_every_second("every_second", &ticks);
    assert!(
        ticks[0].run_at > started,
        "no tick before the start: {ticks:?}"
    );
    assert!(ticks.iter().all(|t| t.payload == "{}"), "{ticks:?}");
    let succeeded = ticks.iter().filter(|t| t.state == "succeeded").count();
    assert!(
        succeeded + 1 >= ticks.len(),
        "every tick but the one enqueued at the stop ran: {ticks:?}"
    );
    assert_eq!(report.stats.scheduled, ticks.len() as u64, "{report:?}");

    let row = schedule(&db, "every_second").await.expect("schedule row");
    assert_eq!(
        (
            row.task_name.as_str(),
            row.queue.as_str(),
            row.expression.as_str(),
            row.timezone.as_str(),
            row.missed_ticks.as_str()
        ),
        (
            "every_second",
            "cron_second",
            "* * * * * *",
            "UTC",
            "latest"
        )
    );
    let last = ticks.last().unwrap().run_at;
    assert_eq!(row.last_tick, Some(last));
    assert_eq!(row.watermark, last);
    assert_eq!(row.next_tick, Some(last + TimeDelta::seconds(1)));
}

/// Downtime simulated by a watermark three days back, for an hourly 5-field expression: the
/// default policy runs the latest missed tick once, `skip` none, `all(5)` the five latest; all
/// three move the watermark to the latest tick. One schedule is read in a time zone with a
/// half-hour offset, which moves its ticks to half past in UTC.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missed_ticks_follow_the_policy() {
    let Some(db) = TestDb::new_or_skip().await else {
        return;
    };
    // The rows a previous deploy left, with the same definitions (m_all in India, UTC+05:30,
    // so its hourly ticks fall at half past in UTC).
    for (name, tz) in [
        ("m_latest", "UTC"),
        ("m_skip", "UTC"),
        ("m_all", "Asia/Kolkata"),
    ] {
        sqlx::query(
            "INSERT INTO taskq_schedules (name, task_name, queue, expression, timezone,
               missed_ticks, watermark, declared_at, created_at, updated_at)
             VALUES (?, 'cron_beat', 'cron', '0 * * * *', ?, 'latest',
               UTC_TIMESTAMP(6) - INTERVAL 3 DAY, UTC_TIMESTAMP(6) - INTERVAL 3 DAY,
               UTC_TIMESTAMP(6) - INTERVAL 3 DAY, UTC_TIMESTAMP(6) - INTERVAL 3 DAY)",
        )
        .bind(name)
        .bind(tz)
        .execute(&db.pool)
        .await
        .unwrap();
    }
    let old = schedule(&db, "m_latest").await.unwrap().watermark;
    let w = RunningWorker::spawn(
        fast_worker(&db.pool)
            .schedule(Schedule::new("0 * * * *", beat("latest")).name("m_latest"))
            .schedule(
                Schedule::new("0 * * * *", beat("skip"))
                    .name("m_skip")
                    .missed_ticks(MissedTicks::Skip),
            )
            .schedule(
                Schedule::new("0 * * * *", beat("all"))
                    .name("m_all")
                    .timezone("Asia/Kolkata")
                    .missed_ticks(MissedTicks::All(5)),
            ),
    );
    let mut moved = Vec::new();
    for name in ["m_latest", "m_skip", "m_all"] {
        wait_until(Duration::from_secs(10), "the watermark moves", || async {
            schedule(&db, name).await.unwrap().watermark > old
        })
        .await;
        moved.push(schedule(&db, name).await.unwrap());
    }
    w.stop().await;
    let now = db_now(&db).await;
    let hour = TimeDelta::hours(1);
    for row in &moved {
        let wm = row.watermark;
        let minute = if row.name == "m_all" { 30 } else { 0 };
        assert!(
            wm <= now && now - wm < hour && wm.minute() == minute && wm.second() == 0,
            "the watermark is the latest hourly tick: {row:?}"
        );
        // Ticks up to that watermark (an on-time tick could follow if an hour struck meanwhile).
        let fired: Vec<DateTime<Utc>> = ticks(&db, &row.name)
            .await
            .into_iter()
            .map(|t| t.run_at)
            .filter(|t| *t <= wm)
            .collect();
        let expected: Vec<DateTime<Utc>> = match row.name.as_str() {
            "m_latest" => vec![wm],
            "m_skip" => vec![],
            "m_all" => (0..5).rev().map(|k| wm - hour * k).collect(),
            _ => unreachable!(),
        };
        assert_eq!(fired, expected, "{}", row.name);
        assert_eq!(
            row.last_tick,
            expected.last().copied(),
            "{}: last_tick",
            row.name
        );
        assert_eq!(row.next_tick, Some(wm + hour), "{}", row.name);
    }
    let policies: Vec<&str> = moved.iter().map(|r| r.missed_ticks.as_str()).collect();
    assert_eq!(policies, ["latest", "skip", "all(5)"]);
}

/// A deploy with a new expression takes over at once, even while a worker with the old
/// definition still runs: the old one stops firing when the new one declares the schedule,
/// and the new expression's ticks start after that (no old tick re-fired, none twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_expression_takes_effect_on_deploy() {
    let Some(db) = TestDb::new_or_skip().await else {
        return;
    };
    let old = RunningWorker::spawn(
        fast_worker(&db.pool).schedule(Schedule::new("* * * * * *", beat("old")).name("report")),
    );
    wait_until(Duration::from_secs(15), "2 old ticks", || async {
        ticks(&db, "report").await.len() >= 2
    })
    .await;
    let new = RunningWorker::spawn(
        fast_worker(&db.pool).schedule(Schedule::new("*/2 * * * * *", beat("new")).name("report")),
    );
    wait_until(Duration::from_secs(10), "the new definition", || async {
        schedule(&db, "report").await.unwrap().expression == "*/2 * * * * *"
    })
    .await;
    let declared = schedule(&db, "report").await.unwrap().declared_at;
    wait_until(Duration::from_secs(15), "3 new ticks", || async {
        ticks(&db, "report")
            .await
            .iter()
            .filter(|t| t.payload.contains("new"))
            .count()
            >= 3
    })
    .await;
    let old_report = old.stop().await;
    new.stop().await;
    let all = ticks(&db, "report").await;
    let (olds, news): (Vec<&Tick>, Vec<&Tick>) =
        all.iter().partition(|t| t.payload.contains("old"));
    assert!(olds.len() >= 2, "{all:?}");
    assert!(
        olds.iter().all(|t| t.run_at < declared),
        "the old definition stops firing at the new one's declaration ({declared}): {all:?}"
    );
    assert!(
        news.iter()
            .all(|t| t.run_at > declared && t.run_at.second() % 2 == 0),
        "the new expression's ticks start after its declaration: {all:?}"
    );
    assert_eq!(old_report.stats.scheduled, olds.len() as u64);
    let mut run_ats: Vec<_> = all.iter().map(|t| t.run_at).collect();
    run_ats.dedup();
    assert_eq!(run_ats.len(), all.len(), "no tick twice: {all:?}");
}

/// A schedule removed from the code stops firing: the next deploy declares only the other
/// one. Its row stays, overdue, until an operator deletes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_schedule_stops_firing() {
    let Some(db) = TestDb::new_or_skip().await else {
        return;
    };
    let a = RunningWorker::spawn(
        fast_worker(&db.pool)
            .schedule(Schedule::new("* * * * * *", beat("keep")).name("keep"))
            .schedule(Schedule::new("* * * * * *", beat("gone")).name("gone")),
    );
    wait_until(Duration::from_secs(15), "2 ticks of each", || async {
        ticks(&db, "keep").await.len() >= 2 && ticks(&db, "gone").await.len() >= 2
    })
    .await;
    a.stop().await;
    let stopped = db_now(&db).await;
    let gone_before = ticks(&db, "gone").await;
    let b = RunningWorker::spawn(
        fast_worker(&db.pool).schedule(Schedule::new("* * * * * *", beat("keep")).name("keep")),
    );
    wait_until(
        Duration::from_secs(15),
        "2 ticks after the deploy",
        || async {
            ticks(&db, "keep")
                .await
                .iter()
                .filter(|t| t.run_at > stopped)
                .count()
                >= 2
        },
    )
    .await;
    b.stop().await;
    assert_eq!(
        ticks(&db, "gone").await,
        gone_before,
        "no tick after removal"
    );
    assert_every_second("gone", &gone_before);

    let client = Client::new(db.pool.clone());
    let now = db_now(&db).await;
    let gone = schedule(&db, "gone").await.expect("the row stays");
    assert!(
        gone.next_tick.unwrap() < now,
        "a removed schedule's next tick falls behind: {gone:?}"
    );
    assert!(client.delete_schedule("gone").await.unwrap());
    assert!(!client.delete_schedule("gone").await.unwrap());
    let names: Vec<String> = client
        .schedules()
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(names, ["keep"]);
}

/// Retention deleting old ticks' tasks does not make them fire again: the watermark, not the
/// task rows, says which ticks are done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_ticks_do_not_fire_again_after_retention() {
    let Some(db) = TestDb::new_or_skip().await else {
        return;
    };
    let sched = || Schedule::new("* * * * * *", beat("r")).name("retained");
    let a = RunningWorker::spawn(fast_worker(&db.pool).schedule(sched()));
    wait_until(Duration::from_secs(15), "3 ticks", || async {
        ticks(&db, "retained").await.len() >= 3
    })
    .await;
    a.stop().await;
    let before = ticks(&db, "retained").await;
    let last = before.last().unwrap().run_at;
    sqlx::query("DELETE FROM taskq_tasks")
        .execute(&db.pool)
        .await
        .unwrap();
    let b = RunningWorker::spawn(fast_worker(&db.pool).schedule(sched()));
    wait_until(Duration::from_secs(15), "2 new ticks", || async {
        ticks(&db, "retained").await.len() >= 2
    })
    .await;
    b.stop().await;
    let after = ticks(&db, "retained").await;
    assert!(
        after.iter().all(|t| t.run_at > last),
        "no tick at or before {last} again: {after:?}"
    );
    assert_every_second("retained", &after);
}

/// A schedule declared on a task whose queue the worker does not work is not fired there;
/// one given to the builder for such a queue is an error (below).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_fires_only_schedules_of_its_queues() {
    let Some(db) = TestDb::new_or_skip().await else {
        return;
    };
    let w = RunningWorker::spawn(
        fast_worker(&db.pool)
            .register::<EverySecond>()
            .register::<Beat>()
            .queue("cron", 2),
    );
    tokio::time::sleep(Duration::from_millis(2500)).await;
    w.stop().await;
    assert!(ticks(&db, "every_second").await.is_empty());
    assert!(schedule(&db, "every_second").await.is_none());
}

/// Bad schedules are typed errors at `build()`, before anything is written.
#[tokio::test]
async fn bad_schedules_are_typed_errors_at_build() {
    let pool = sqlx::MySqlPool::connect_lazy("mysql://root@127.0.0.1:1/none").unwrap();
    let err = |b: taskq::worker::WorkerBuilder| match b.build() {
        Err(e) => e,
        Ok(_) => panic!("build must fail"),
    };
    let builder = || taskq::Worker::builder(pool.clone());
    let cases: Vec<(taskq::worker::WorkerBuilder, &str, &str)> = vec![
        (
            builder().cron("0 25 * * *", beat("x")),
            "cron_beat",
            "invalid cron expression \"0 25 * * *\"",
        ),
        (
            builder().schedule(Schedule::new("@daily", beat("x")).timezone("Mars/Olympus")),
            "cron_beat",
            "unknown time zone \"Mars/Olympus\"",
        ),
        (
            builder().cron("0 0 30 2 *", beat("x")),
            "cron_beat",
            "has no tick in the next year",
        ),
        (
            builder()
                .cron("@daily", beat("a"))
                .cron("@hourly", beat("b")),
            "cron_beat",
            "declared twice",
        ),
        (
            builder().queue("other", 1).cron("@daily", beat("x")),
            "cron_beat",
            "queue \"cron\", which this worker does not work",
        ),
        (
            builder().cron("@daily", beat("x").with_delay(Duration::from_secs(5))),
            "cron_beat",
            "with_delay cannot be used on a scheduled task",
        ),
        (
            builder().cron("@daily", beat("x").with_idempotency_key("k")),
            "cron_beat",
            "with_idempotency_key cannot be used",
        ),
        (
            builder().schedule(
                Schedule::new("@daily", beat("x"))
                    .name("n")
                    .missed_ticks(MissedTicks::All(0)),
            ),
            "n",
            "MissedTicks::All(0) is out of range",
        ),
    ];
    for (b, schedule, reason) in cases {
        match err(b) {
            Error::InvalidCron {
                schedule: s,
                reason: r,
            } => {
                assert_eq!(s, schedule, "{r}");
                assert!(r.contains(reason), "{r:?} lacks {reason:?}");
            }
            other => panic!("expected InvalidCron({reason}), got {other:?}"),
        }
    }
    match err(builder().schedule(Schedule::new("@daily", beat("x")).name(""))) {
        Error::InvalidName { what, .. } => assert_eq!(what, "schedule name"),
        other => panic!("{other:?}"),
    }
    // The message reads as a sentence.
    let e = err(builder().cron("61 * * * *", beat("x")));
    assert!(
        e.to_string()
            .starts_with("invalid schedule \"cron_beat\": invalid cron expression \"61 * * * *\""),
        "{e}"
    );
}

/// Several workers that read the same due tick race to enqueue it; the watermark's
/// compare-and-set lets one through. The race is made certain by holding the schedule's row
/// lock across two ticks (every worker reads the old watermark and queues on the lock), and
/// the workers' own counters must add up to the rows: with the compare-and-set gone, the
/// unique idempotency key would still keep one row per tick, but the counters would not add up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_workers_enqueue_a_tick_once() {
    let Some(db) = TestDb::new_or_skip().await else {
        return;
    };
    let sched = || Schedule::new("* * * * * *", beat("race")).name("race");
    let workers: Vec<RunningWorker> = (0..4)
        .map(|_| RunningWorker::spawn(fast_worker(&db.pool).schedule(sched())))
        .collect();
    wait_until(Duration::from_secs(15), "a first tick", || async {
        !ticks(&db, "race").await.is_empty()
    })
    .await;
    let mut tx = db.pool.begin().await.unwrap();
    sqlx::query("SELECT watermark FROM taskq_schedules WHERE name = 'race' FOR UPDATE")
        .execute(&mut *tx)
        .await
        .unwrap();
    let held = ticks(&db, "race").await.len();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(
        ticks(&db, "race").await.len(),
        held,
        "no tick while the row is locked"
    );
    tx.commit().await.unwrap();
    wait_until(
        Duration::from_secs(15),
        "the ticks of the hold and 2 more",
        || async { ticks(&db, "race").await.len() >= held + 4 },
    )
    .await;
    let mut scheduled = 0;
    for w in workers {
        scheduled += w.stop().await.stats.scheduled;
    }
    let all = ticks(&db, "race").await;
    assert_every_second("race", &all);
    assert_eq!(scheduled, all.len() as u64, "one enqueue per tick: {all:?}");
}

/// Ticks of the fleet test (one per second): the full minute the issue asks for.
const FLEET_TICKS: usize = 60;
/// Worker processes in the fleet.
const FLEET_PROCESSES: usize = 8;
/// After this many ticks, and twice as many, the process that enqueued the latest tick is
/// stopped (SIGTERM) and a new one started: another takes the schedule over.
const FLEET_HANDOVER_EVERY: usize = 20;

fn cron_worker_exe() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_taskq-cron-worker"))
}

/// Sends `SIG<sig>` to `pid`.
fn send_signal(pid: u32, sig: &str) {
    let status = std::process::Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{sig} {pid} failed");
}

/// A running `taskq-cron-worker`.
struct FleetWorker {
    id: String,
    child: tokio::process::Child,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
}

impl FleetWorker {
    async fn start(url: &str, id: String) -> Self {
        let mut child = Command::new(cron_worker_exe())
            .args(["--url", url, "--id", &id])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", cron_worker_exe().display()));
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let ready = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("the worker is ready within 30 s")
            .unwrap()
            .unwrap_or_default();
        assert_eq!(ready, format!("ready {id}"));
        Self { id, child, lines }
    }

    /// SIGTERM, then the `scheduled` counter of its report.
    async fn stop(mut self) -> u64 {
        send_signal(self.child.id().expect("running"), "TERM");
        let exit = async {
            let mut report = None;
            while let Some(line) = self.lines.next_line().await.expect("read child stdout") {
                if let Some(json) = line.strip_prefix("report ") {
                    report = Some(serde_json::from_str::<serde_json::Value>(json).unwrap());
                }
            }
            (self.child.wait().await.unwrap(), report)
        };
        let (status, report) = tokio::time::timeout(Duration::from_secs(30), exit)
            .await
            .expect("the worker exits within 30 s of SIGTERM");
        assert_eq!(status.code(), Some(0), "{}: exit status {status}", self.id);
        let report = report.expect("the worker printed its report");
        report["stats"]["scheduled"].as_u64().unwrap()
    }
}

/// THE FLEET TEST: 8 worker processes on one queue, each declaring the same one-second
/// schedule (`#[task(cron = "* * * * * *")]`), for a minute of ticks: exactly one task per
/// tick — no tick missing between the first and the last, none twice. Twice during the minute
/// the process that enqueued the latest tick is stopped and replaced, so the schedule changes
/// hands with no election. The processes' own counters add up to the rows: each tick was
/// enqueued by exactly one process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_processes_enqueue_exactly_one_task_per_tick() {
    let Some(db) = TestDb::new_or_skip().await else {
        return;
    };
    let url = db.options.to_url_lossy().to_string();
    let name = FleetTick::NAME;
    let mut fleet = Vec::new();
    for i in 0..FLEET_PROCESSES {
        fleet.push(FleetWorker::start(&url, format!("fleet-{i}")).await);
    }
    let started = db_now(&db).await;
    let t0 = std::time::Instant::now();
    let mut scheduled = Vec::new();
    let mut handed_over = Vec::new();
    for round in 1..=FLEET_TICKS / FLEET_HANDOVER_EVERY {
        let want = round * FLEET_HANDOVER_EVERY;
        wait_until(Duration::from_secs(want as u64 + 30), "ticks", || async {
            ticks(&db, name).await.len() >= want
        })
        .await;
        if want >= FLEET_TICKS {
            break;
        }
        let leader = schedule(&db, name).await.unwrap().last_worker_id.unwrap();
        let i = fleet
            .iter()
            .position(|w| w.id == leader)
            .expect("a fleet worker");
        scheduled.push(fleet.remove(i).stop().await);
        handed_over.push(leader);
        let id = format!("fleet-{}", FLEET_PROCESSES + round - 1);
        fleet.push(FleetWorker::start(&url, id).await);
    }
    for w in fleet {
        scheduled.push(w.stop().await);
    }
    let ticks = ticks(&db, name).await;
    eprintln!(
        "fleet: {} ticks in {:?}; stopped leaders {handed_over:?}; enqueued per process {scheduled:?}",
        ticks.len(),
        t0.elapsed()
    );
    assert!(ticks.len() >= FLEET_TICKS, "{}", ticks.len());
    assert_every_second(name, &ticks);
    assert!(ticks[0].run_at > started - TimeDelta::seconds(30));
    // Each tick was enqueued by exactly one process (the rows are one per tick, checked
    // above); the processes' counters add up to the rows, except that a fire whose commit
    // went through but whose answer did not reach its process (the statement deadline under
    // load, or a process stopped while awaiting it) is not counted. That is rare: a few at most.
    let counted = scheduled.iter().sum::<u64>();
    assert!(
        counted <= ticks.len() as u64 && ticks.len() as u64 - counted <= 3,
        "{} ticks, counted by the processes {scheduled:?}",
        ticks.len()
    );
    assert_eq!(handed_over.len(), 2);
    let ran = ticks.iter().filter(|t| t.state == "succeeded").count();
    assert!(
        ran + 1 >= ticks.len(),
        "the fleet ran every tick: {ticks:?}"
    );
    let row = schedule(&db, name).await.unwrap();
    assert_eq!(row.queue, cron_support::FLEET_QUEUE);
    assert_eq!(row.last_tick, Some(ticks.last().unwrap().run_at));
    assert!(row.last_worker_id.unwrap().starts_with("fleet-"));
}
