//! `taskq-reliability`: runs the fault scenarios of `docs/reliability.md` at full size on
//! private database servers and prints the figures as Markdown.
//!
//! ```text
//! cargo build --release -p taskq-tests --bins
//! target/release/taskq-reliability all            # or: env | kill | graceful | pause |
//!                                                 #     outage | chaos | tx | bad | poison |
//!                                                 #     blackhole
//! target/release/taskq-reliability galera         # 3-node Galera cluster (galera-4)
//! target/release/taskq-reliability galera-limit   # a limited queue, workers on 3 nodes
//! target/release/taskq-reliability sqlite         # the SQLite scenarios, no server needed:
//!                                                 # sqlite-env | sqlite-kill | sqlite-graceful |
//!                                                 # sqlite-pause | sqlite-tx | sqlite-poison |
//!                                                 # sqlite-drain | sqlite-starve | sqlite-lock
//! ```
//!
//! Options (all optional): `--trials N` (kill: 20, graceful: 10, pause: 5), `--tasks N`
//! (outage/chaos: 5000, poison: 2000), `--outage-s S` (10), `--lease-ms MS` (outage: 2000),
//! `--total N` (tx: 10000), `--backlog N` (kill and sqlite-kill: SIGKILL while the surviving
//! worker drains N tasks of `--busy-ms` (100) enqueued after the killed ones; 5 trials);
//! kill and sqlite-kill without `--backlog` also take `--lease-ms` (2000), `--heartbeat-ms` (500),
//! `--grace-ms` (500), `--reaper-ms` (200) and, on SQLite, `--busy-timeout-ms` (the pools' busy
//! timeout). Needs `taskq-fault-worker` next to this binary (built by the
//! command above) and a MariaDB/MySQL server binary (see `tests/support/server.rs`).

#[path = "../faults_support/mod.rs"]
mod faults_support;
#[allow(dead_code)]
#[path = "../galera_support/mod.rs"]
mod galera_support;

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use faults_support::scenarios::{self, LoadRun, LoadSettings, PoisonKind};
use faults_support::sqlite::{self as sq, SqliteFaultDb, StarveSettings};
use faults_support::{FaultDb, min_median_max};
use taskq_tests::server::PrivateServer;

struct Args {
    opts: HashMap<String, String>,
}

impl Args {
    fn num(&self, k: &str, default: u64) -> u64 {
        self.opts
            .get(k)
            .map_or(default, |v| v.parse().expect("a number"))
    }

    /// The lease settings of the kill scenarios: `--lease-ms` (2000), `--heartbeat-ms` (500),
    /// `--grace-ms` (500), `--reaper-ms` (200) and, on SQLite, `--busy-timeout-ms` (the pools'
    /// busy timeout; by default the longest the lease allowed before issue 34).
    fn kill_settings(&self) -> faults_support::ChildSettings {
        let ms = |k: &str, d: u64| Duration::from_millis(self.num(k, d));
        faults_support::ChildSettings {
            lease: ms("lease-ms", 2000),
            heartbeat: ms("heartbeat-ms", 500),
            cancel_grace: ms("grace-ms", 500),
            reaper: ms("reaper-ms", 200),
            shutdown_timeout: Duration::from_millis(300),
            busy: self
                .opts
                .get("busy-timeout-ms")
                .map(|_| ms("busy-timeout-ms", 0)),
            ..Default::default()
        }
    }
}

/// "lease 2 s, heartbeat 500 ms, cancel grace 500 ms, reaper 200 ms[, busy timeout 1 s]".
fn describe(s: &faults_support::ChildSettings) -> String {
    let f = |d: Duration| {
        if d.subsec_millis() == 0 {
            format!("{} s", d.as_secs())
        } else {
            format!("{} ms", d.as_millis())
        }
    };
    let mut out = format!(
        "lease {}, heartbeat {}, cancel grace {}, reaper {}",
        f(s.lease),
        f(s.heartbeat),
        f(s.cancel_grace),
        f(s.reaper)
    );
    if let Some(b) = s.busy {
        out.push_str(&format!(", busy timeout {}", f(b)));
    }
    out
}

async fn fresh_db() -> FaultDb {
    let server = PrivateServer::start()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    FaultDb::on(server).await
}

fn exe() -> PathBuf {
    let p = std::env::current_exe()
        .expect("own path")
        .with_file_name("taskq-fault-worker");
    assert!(
        p.exists(),
        "{} not found: build it with `cargo build [--release] -p taskq-tests --bins`",
        p.display()
    );
    p
}

fn mmm(samples: &[f64]) -> String {
    let (lo, mid, hi) = min_median_max(samples);
    format!("{lo:.2} / {mid:.2} / {hi:.2}")
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let what = argv.first().cloned().unwrap_or_else(|| "all".into());
    let opts = argv[1..]
        .chunks(2)
        .map(|kv| {
            (
                kv[0].trim_start_matches("--").to_owned(),
                kv.get(1).cloned().expect("--key value"),
            )
        })
        .collect();
    let args = Args { opts };
    let all = what == "all";
    let run = |name: &str| all || what == name;
    if run("env") {
        env().await;
    }
    if run("kill") {
        if args.opts.contains_key("backlog") {
            kill_backlog(&args, false).await;
        } else {
            kill(&args, false).await;
        }
    }
    if run("graceful") {
        kill(&args, true).await;
    }
    if run("pause") {
        pause(&args).await;
    }
    if run("outage") {
        outage(&args).await;
    }
    if run("chaos") {
        chaos(&args).await;
    }
    if run("tx") {
        tx(&args).await;
    }
    if run("bad") {
        bad().await;
    }
    if run("poison") {
        poison(&args).await;
    }
    if run("blackhole") {
        black_hole(&args).await;
    }
    // Not part of `all`: needs galera-4.
    if what == "galera" {
        galera(&args).await;
    }
    if what == "galera-limit" {
        galera_limit(&args).await;
    }
    // Not part of `all` (which is MySQL): `sqlite` runs every SQLite scenario.
    let sq = |name: &str| what == "sqlite" || what == format!("sqlite-{name}");
    if sq("env") {
        sqlite_env().await;
    }
    if sq("kill") {
        if args.opts.contains_key("backlog") {
            kill_backlog(&args, true).await;
        } else {
            sqlite_kill(&args, false).await;
        }
    }
    if sq("graceful") {
        sqlite_kill(&args, true).await;
    }
    if sq("pause") {
        sqlite_pause(&args).await;
    }
    if sq("tx") {
        sqlite_tx(&args).await;
    }
    if sq("poison") {
        sqlite_poison(&args).await;
    }
    if sq("drain") {
        sqlite_drain(&args).await;
    }
    if sq("starve") {
        sqlite_starve(&args).await;
    }
    if sq("lock") {
        sqlite_lock(&args).await;
    }
}

/// The write lock held by another process for a while, at a random phase of the heartbeat:
/// which holds each lease setting survives.
async fn sqlite_lock(args: &Args) {
    let trials = args.num("trials", 3) as usize;
    let exe = exe();
    let ms = Duration::from_millis;
    let settings: [(Duration, Duration, Duration, &[u64]); 2] = [
        (ms(2000), ms(667), ms(500), &[500, 800, 1200, 2500]),
        (ms(15000), ms(5000), ms(5000), &[4500, 8000, 12000]),
    ];
    println!(
        "## SQLite: write lock held by another process, taken at a random point of the heartbeat ({trials} trials each, 2 tasks)\n"
    );
    println!(
        "| lease / heartbeat / cancel grace | tolerated at worst | lock held | trials with no lease lost | leases lost (all trials) | trials where the database lease was renewed after the release |\n|---|---|---|---|---|---|"
    );
    for (lease, heartbeat, grace, holds) in settings {
        let cs = faults_support::ChildSettings {
            lease,
            heartbeat,
            cancel_grace: grace,
            ..Default::default()
        };
        for &hold in holds {
            let (mut kept, mut renewed, mut lost, mut tolerated) = (0, 0, 0, Duration::ZERO);
            for trial in 0..trials {
                let db = SqliteFaultDb::create().await;
                let phase = ms(fastrand::u64(0..heartbeat.as_millis() as u64));
                let t = sq::lock_hold_trial(&db, &exe, &cs, 2, ms(hold), phase, trial).await;
                renewed += usize::from(t.renewed);
                kept += usize::from(t.report.stats["lost_leases"] == 0);
                lost += t.report.stats["lost_leases"];
                tolerated = t.tolerated;
            }
            println!(
                "| {:.1} / {:.2} / {:.1} s | {:.2} s | {:.1} s | {kept} of {trials} | {lost} | {renewed} of {trials} |",
                lease.as_secs_f64(),
                heartbeat.as_secs_f64(),
                grace.as_secs_f64(),
                tolerated.as_secs_f64(),
                hold as f64 / 1000.0
            );
        }
    }
    println!();
}

async fn sqlite_drain(args: &Args) {
    let processes = args.num("processes", 4) as usize;
    let tasks = args.num("tasks", 2000) as u32;
    let trials = args.num("trials", 5);
    println!(
        "## SQLite: {tasks} short tasks (one transaction) drained by {processes} idle processes × concurrency 8\n"
    );
    println!("| trial | tasks run per process | drain time | invariants |\n|---|---|---|---|");
    for trial in 0..trials {
        let db = SqliteFaultDb::create().await;
        let (share, took, ex) = sq::drain(&db, &exe(), processes, tasks, 8).await;
        println!(
            "| {trial} | {} | {:.2} s | {} |",
            share
                .iter()
                .map(|(_, n)| n.to_string())
                .collect::<Vec<_>>()
                .join(" / "),
            took.as_secs_f64(),
            match ex.check() {
                Ok(()) => "hold".to_owned(),
                Err(e) => format!("VIOLATED: {e}"),
            }
        );
    }
    println!();
}

async fn sqlite_env() {
    let db = SqliteFaultDb::create().await;
    let (version, journal, sync, busy): (String, String, i64, i64) = sqlx::query_as(
        "SELECT sqlite_version(), (SELECT journal_mode FROM pragma_journal_mode),
                (SELECT synchronous FROM pragma_synchronous), (SELECT timeout FROM pragma_busy_timeout)",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let dir = db.file.path.parent().unwrap().display().to_string();
    let fs = std::process::Command::new("df")
        .args(["-T", &dir])
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .nth(1)
                .unwrap_or("")
                .to_owned()
        })
        .unwrap_or_default();
    println!("## SQLite environment\n");
    println!("| | |\n|---|---|");
    println!("| SQLite (bundled with sqlx) | {version} |");
    println!("| journal_mode / synchronous / busy_timeout | {journal} / {sync} / {busy} ms |");
    println!(
        "| file | {dir} ({}) |",
        fs.split_whitespace().nth(1).unwrap_or("?")
    );
    println!(
        "| cpus | {} |",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!(
        "| build | {} |\n",
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
    );
}

async fn sqlite_kill(args: &Args, graceful: bool) {
    let trials = args.num("trials", if graceful { 10 } else { 20 }) as usize;
    let tasks = args.num("tasks-per-trial", 2) as usize;
    let settings = args.kill_settings();
    let db = SqliteFaultDb::create().await;
    db.log_transitions().await;
    let exe = exe();
    let (mut takeover, mut after_release, mut per_trial_max) = (Vec::new(), Vec::new(), Vec::new());
    let (mut all_ok, mut not_released) = (true, 0);
    for trial in 0..trials {
        let t = sq::takeover_trial_with(&db, &exe, &settings, tasks, graceful, trial).await;
        eprintln!("trial {trial}: {:?}", t.takeover);
        let want = if graceful { (3, 1) } else { (3, 2) };
        all_ok &= t.rows.iter().all(|r| {
            r.state == "succeeded"
                && r.worker_id.as_deref() == Some(t.second.as_str())
                && (r.lease_epoch, r.attempt) == want
        });
        per_trial_max.push(t.takeover.iter().cloned().fold(0.0, f64::max));
        takeover.extend(t.takeover);
        after_release.extend(t.after_release);
        not_released += t.not_released.len();
    }
    if graceful {
        println!(
            "## SQLite 1b: SIGTERM with a 300 ms shutdown timeout, two processes on one file ({trials} trials × {tasks} tasks)\n"
        );
        println!("| measure (s) | min / median / max |\n|---|---|");
        println!(
            "| SIGTERM → other process's handler started | {} |",
            mmm(&takeover)
        );
        println!(
            "| release written → other process's handler started | {} |",
            mmm(&after_release)
        );
        println!(
            "| tasks not released (waited for lease expiry instead) | {not_released} of {} |",
            trials * tasks
        );
        println!(
            "\nevery task released (epoch 2), run by the other process at epoch 3, attempt 1: {all_ok}\n"
        );
    } else {
        println!(
            "## SQLite 1: SIGKILL mid-handler, {}, two processes on one file ({trials} trials × {tasks} tasks)\n",
            describe(&settings)
        );
        println!("| measure (s) | min / median / max |\n|---|---|");
        println!(
            "| kill → other process's handler started (per task) | {} |",
            mmm(&takeover)
        );
        println!(
            "| kill → last task of the trial started | {} |",
            mmm(&per_trial_max)
        );
        println!(
            "\nevery task completed by the other process at epoch 3, attempt 2 (reaped once): {all_ok}\n"
        );
    }
}

async fn sqlite_pause(args: &Args) {
    let trials = args.num("trials", 5) as usize;
    let db = SqliteFaultDb::create().await;
    let exe = exe();
    println!(
        "## SQLite 2: SIGSTOP past the 2 s lease, SIGCONT after the takeover ({trials} trials)\n"
    );
    println!(
        "| trial | SIGSTOP → takeover (s) | re-stopped (held the write lock) | row kept (worker, state, epoch) | resumed handler saw | paused process: lost_leases / fenced / succeeded |"
    );
    println!("|---|---|---|---|---|---|");
    for trial in 0..trials {
        let (t, restops) = sq::pause_trial(&db, &exe, trial).await;
        let r = &t.row_after_resume;
        let kept = t.row_after_resume == t.row_before_resume;
        let saw: Vec<_> = t
            .events
            .iter()
            .filter(|e| e.worker_id == t.paused && e.event.starts_with("canceled:"))
            .map(|e| e.event.clone())
            .collect();
        let s = &t.report.stats;
        println!(
            "| {trial} | {:.2} | {restops} | {} ({}, {}, {}) | {} | {} / {} / {} |",
            t.takeover,
            if kept { "unchanged" } else { "CHANGED" },
            r.worker_id.as_deref().unwrap_or("-"),
            r.state,
            r.lease_epoch,
            saw.join(", "),
            s["lost_leases"],
            s["fenced"],
            s["succeeded"]
        );
    }
    println!();
}

async fn sqlite_tx(args: &Args) {
    let total = args.num("total", 10_000);
    let workers = args.num("processes", 3) as usize;
    let db = SqliteFaultDb::create().await;
    let t = sq::transactions(&db, &exe(), total, 8, workers).await;
    let run = &t.run;
    let committed_orders: std::collections::BTreeSet<u64> =
        run.expected.iter().map(|e| e.0).collect();
    let task_orders: std::collections::BTreeSet<u64> = run.tasks.iter().map(|t| t.0).collect();
    let orders: std::collections::BTreeSet<u64> = run.orders.iter().copied().collect();
    println!(
        "## SQLite 5: {total} transactions (`BEGIN IMMEDIATE`) from 8 producers, {workers} worker processes on the file\n"
    );
    println!("| | |\n|---|---|");
    println!("| committed | {} |", run.committed);
    println!("| rolled back explicitly | {} |", run.rolled_back);
    println!(
        "| failed after the enqueue (duplicate key), dropped | {} |",
        run.failed_after_enqueue
    );
    println!("| dropped without commit | {} |", run.dropped);
    println!(
        "| business rows / task rows | {} / {} |",
        run.orders.len(),
        run.tasks.len()
    );
    println!(
        "| tasks without a business row | {} |",
        task_orders.difference(&orders).count()
    );
    println!(
        "| business rows without a task | {} |",
        orders.difference(&task_orders).count()
    );
    println!(
        "| (order, task) pairs equal to the committed ones | {} |",
        run.tasks == run.expected
    );
    println!(
        "| committed rows = business rows | {} |",
        committed_orders == orders
    );
    println!(
        "| handler runs (all processes) / found their row / missed it | {} / {} / {} |",
        t.executions.total(),
        run.found,
        run.orphans_seen
    );
    println!(
        "| tasks run more than once / of them after an expired lease | {} / {} |",
        t.executions.duplicated().len(),
        t.executions.reaped().len()
    );
    println!(
        "| invariants (each committed task ran; no epoch twice; duplicates ⊆ reaped) | {} |",
        match t.executions.check() {
            Ok(()) => "hold".to_owned(),
            Err(e) => format!("VIOLATED: {e}"),
        }
    );
    println!(
        "| succeeded per process | {} |",
        t.reports
            .iter()
            .map(|(id, r)| format!("{id}: {}", r.stats["succeeded"]))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "| producer `BEGIN IMMEDIATE` past the busy timeout (retried) | {} |",
        t.busy_retries
    );
    println!(
        "| producer time | {:.1} s ({:.0} tx/s) |",
        run.elapsed.as_secs_f64(),
        total as f64 / run.elapsed.as_secs_f64()
    );
    println!(
        "| last commit → all tasks done | {:.2} s |\n",
        t.drain.as_secs_f64()
    );
}

async fn sqlite_poison(args: &Args) {
    let tasks = args.num("tasks", 2000) as u32;
    let db = SqliteFaultDb::create().await;
    let run = sq::poison(&db, &exe(), tasks, 2).await;
    println!(
        "## SQLite 7: poison pills among {tasks} ordinary tasks (100 ms), 2 processes × concurrency 4, lease 2 s\n"
    );
    println!("| pill | end state | attempt | handler runs | last error |\n|---|---|---|---|---|");
    for (label, r, n) in [
        ("panics every attempt", &run.panic, run.panic_runs),
        ("hangs, 500 ms timeout", &run.timed, run.timed_runs),
        ("exits its process", &run.exit, run.exit_runs),
    ] {
        println!(
            "| {label} | {} | {} | {n} | {} |",
            r.state,
            r.attempt,
            r.last_error.as_deref().unwrap_or("")
        );
    }
    println!(
        "\nprocesses ended by the exit pill (replaced): {}; ordinary tasks: {} succeeded of {}, {} handler runs, {} run twice (all after an expired lease in an ended process); invariants: {}; {:.1} s\n",
        run.exited.len(),
        run.work
            .rows
            .iter()
            .filter(|r| r.state == "succeeded")
            .count(),
        run.work.rows.len(),
        run.work.total(),
        run.work.duplicated().len(),
        match run.work.check() {
            Ok(()) => "hold".to_owned(),
            Err(e) => format!("VIOLATED: {e}"),
        },
        run.elapsed.as_secs_f64()
    );
}

async fn sqlite_starve(args: &Args) {
    let processes = args.num("processes", 4) as usize;
    let leases: Vec<u64> = args
        .opts
        .get("lease-ms")
        .map_or("2000,6000,15000".to_owned(), |v| v.clone())
        .split(',')
        .map(|v| v.parse().expect("lease-ms: a list of numbers"))
        .collect();
    let exe = exe();
    println!(
        "## SQLite: {processes} processes on one file under write load (heartbeat = lease / 3, cancel grace 0.5 s; busy timeout of every pool: --busy-ms, else the longest the lease allows)\n"
    );
    println!(
        "| lease | busy timeout | short tasks run per process | long leases lost | least lease time left per process (s) | statement timeouts / db errors per process | producer tx (busy) | time |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for lease_ms in leases {
        let db = SqliteFaultDb::create().await;
        let lease = Duration::from_millis(lease_ms);
        let s = StarveSettings {
            processes,
            lease,
            hold: lease * 3,
            long_per_process: 2,
            load_concurrency: args.num("concurrency", 8) as usize,
            producers: args.num("producers", 4) as usize,
            busy: args.opts.get("busy-ms").map_or_else(
                || sq::tolerated(lease, lease / 3, Duration::from_millis(500)),
                |v| Duration::from_millis(v.parse().expect("busy-ms: a number")),
            ),
        };
        let run = sq::starvation(&db, &exe, &s).await;
        let check = run.executions.check();
        println!(
            "| {:.0} s | {:.2} s | {} | {} of {} | {} | {} | {} ({}) | {:.0} s{} |",
            lease.as_secs_f64(),
            s.busy.as_secs_f64(),
            run.load_share
                .iter()
                .map(|(_, n)| n.to_string())
                .collect::<Vec<_>>()
                .join(" / "),
            run.long_lost,
            run.long_total,
            run.min_slack
                .iter()
                .map(|(_, v)| format!("{v:.2}"))
                .collect::<Vec<_>>()
                .join(" / "),
            run.per_process
                .iter()
                .map(|p| format!("{}/{}", p.3, p.4))
                .collect::<Vec<_>>()
                .join(" "),
            run.produced,
            run.producer_busy,
            run.elapsed.as_secs_f64(),
            match check {
                Ok(()) => String::new(),
                Err(e) => format!(" VIOLATED: {e}"),
            }
        );
    }
    println!();
}

/// Drains on a three-node Galera cluster: all workers on one node (single writer) against one
/// worker per node (multi-writer), and `enqueue_many` under `innodb_autoinc_lock_mode=2`
/// against one `enqueue_tx` per task.
async fn galera(args: &Args) {
    use galera_support::{Work, drain};
    let tasks = args.num("tasks", 5000);
    let trials = args.num("trials", 3);
    let cluster = taskq_tests::galera::GaleraCluster::start()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    println!("\n### Galera: {tasks}-task drains, 3 nodes ({trials} trials each)\n");
    println!(
        "| layout | tasks/s min / median / max | certification conflicts (claims) | ran twice |\n|---|---|---|---|"
    );
    let layouts: [(&str, &[usize], usize); 3] = [
        ("one worker x 48 on node 1", &[0], 48),
        ("single writer: 3 workers x 16 on node 1", &[0, 0, 0], 16),
        ("multi-writer: 1 worker x 16 on each node", &[0, 1, 2], 16),
    ];
    for (k, (label, nodes, conc)) in layouts.iter().enumerate() {
        let mut rates = Vec::new();
        let mut conflicts = Vec::new();
        let mut dups = 0;
        for t in 0..trials {
            let d = drain(&cluster, &format!("rel_{k}_{t}"), tasks, nodes, *conc).await;
            rates.push(d.rate());
            conflicts.push(format!(
                "{} ({})",
                d.stats.db_conflicts, d.stats.claim_queries
            ));
            dups += d.duplicates;
        }
        println!(
            "| {label} | {} | {} | {dups} |",
            mmm_int(&rates),
            conflicts.join(", ")
        );
    }
    // enqueue_many (batched, ids read back under mode 2) against one statement per task.
    let urls = cluster.create_database("rel_enqueue").await.unwrap();
    let pool = sqlx::MySqlPool::connect(&urls[0]).await.unwrap();
    taskq::migrate(&pool).await.unwrap();
    let mut batched = Vec::new();
    let mut single = Vec::new();
    for _ in 0..trials {
        let t = Instant::now();
        let mut tx = pool.begin().await.unwrap();
        taskq::enqueue::enqueue_many(&mut tx, (0..tasks).map(|order| Work { order, ms: 0 }))
            .await
            .unwrap();
        tx.commit().await.unwrap();
        batched.push(tasks as f64 / t.elapsed().as_secs_f64());
        let t = Instant::now();
        let mut tx = pool.begin().await.unwrap();
        for order in 0..tasks {
            taskq::Task::enqueue_tx(Work { order, ms: 0 }, &mut tx)
                .await
                .unwrap();
        }
        tx.commit().await.unwrap();
        single.push(tasks as f64 / t.elapsed().as_secs_f64());
    }
    println!(
        "\n| enqueue of {tasks} tasks in one transaction on node 1 (lock mode 2) | tasks/s min / median / max |\n|---|---|"
    );
    println!(
        "| `enqueue_many` (one statement per 5,000 rows, ids read back) | {} |",
        mmm_int(&batched)
    );
    println!(
        "| `enqueue_tx` per task (what `enqueue_many` did under mode 2 before) | {} |",
        mmm_int(&single)
    );
}

/// A queue with a concurrency limit drained by workers on all three nodes of a Galera
/// cluster: the most handlers that ran at once against the limit, per trial.
/// Options: `--tasks` (300), `--trials` (5), `--limit` (2), `--per-node` workers (2) of
/// `--slots` (4), handlers of `--ms` (20).
async fn galera_limit(args: &Args) {
    let tasks = args.num("tasks", 300);
    let trials = args.num("trials", 5);
    let limit = args.num("limit", 2) as u32;
    let per_node = args.num("per-node", 2) as usize;
    let slots = args.num("slots", 4) as usize;
    let ms = args.num("ms", 20);
    let cluster = taskq_tests::galera::GaleraCluster::start()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    println!(
        "\n### Galera: concurrency limit {limit}, {tasks} tasks of {ms} ms, {per_node} workers \
         x {slots} slots on each of 3 nodes\n"
    );
    println!(
        "| trial | most running at once | starts over the limit | tasks/s | conflicts (claims) |\n|---|---|---|---|---|"
    );
    for t in 0..trials {
        let d = galera_support::limited_drain(
            &cluster,
            &format!("rel_limit_{t}"),
            tasks,
            limit,
            per_node,
            slots,
            ms,
        )
        .await;
        println!(
            "| {} | {} | {} | {:.0} | {} ({}) |",
            t + 1,
            d.max_running,
            d.over,
            tasks as f64 / d.secs,
            d.stats.db_conflicts,
            d.stats.claim_queries
        );
    }
}

/// Scenario 1 with a backlog (`kill --backlog N`, `sqlite-kill --backlog N`): how long the
/// killed worker's tasks wait once reaped, while the surviving worker drains N tasks enqueued
/// after them.
async fn kill_backlog(args: &Args, sqlite: bool) {
    let trials = args.num("trials", 5) as usize;
    let tasks = args.num("tasks-per-trial", 2) as usize;
    let backlog = args.num("backlog", 300) as usize;
    let busy_ms = args.num("busy-ms", 100);
    let exe = exe();
    let mut runs = Vec::new();
    if sqlite {
        let db = SqliteFaultDb::create().await;
        db.log_transitions().await;
        for trial in 0..trials {
            runs.push(sq::backlog_takeover_trial(&db, &exe, tasks, backlog, busy_ms, trial).await);
            eprintln!("trial {trial}: {:?}", runs.last());
        }
    } else {
        let db = fresh_db().await;
        db.log_transitions().await;
        for trial in 0..trials {
            runs.push(
                scenarios::backlog_takeover_trial(&db, &exe, tasks, backlog, busy_ms, trial).await,
            );
            eprintln!("trial {trial}: {:?}", runs.last());
        }
    }
    let all = |f: fn(&faults_support::BacklogTrial) -> Vec<f64>| -> Vec<f64> {
        runs.iter().flat_map(f).collect()
    };
    let reaped = all(|r| r.reaped.clone());
    let rerun = all(|r| r.rerun.clone());
    let after_reap: Vec<f64> = runs
        .iter()
        .flat_map(|r| r.rerun.iter().zip(&r.reaped).map(|(a, b)| a - b))
        .collect();
    let pending = all(|r| r.pending_at_reap.iter().map(|n| *n as f64).collect());
    let between = all(|r| r.started_between.iter().map(|n| *n as f64).collect());
    println!(
        "## {}SIGKILL mid-handler with a backlog: {backlog} tasks of {busy_ms} ms enqueued after the killed ones, drained by the surviving worker (concurrency 8); lease 2 s, heartbeat 500 ms, reaper 200 ms ({trials} trials × {tasks} tasks)\n",
        if sqlite { "SQLite: " } else { "" }
    );
    println!("| measure | min / median / max |\n|---|---|");
    println!("| kill → reaped (s) | {} |", mmm(&reaped));
    println!(
        "| kill → surviving worker's handler started (s) | {} |",
        mmm(&rerun)
    );
    println!("| reaped → started (s) | {} |", mmm(&after_reap));
    println!(
        "| backlog tasks still pending at the reap | {} |",
        mmm_int(&pending)
    );
    println!(
        "| backlog tasks claimed between the reap and the killed task's claim | {} |",
        mmm_int(&between)
    );
    println!(
        "\nevery killed task completed by the surviving worker, every backlog task succeeded: {}\n",
        runs.iter().all(|r| r.all_ok)
    );
}

fn mmm_int(samples: &[f64]) -> String {
    let (lo, mid, hi) = min_median_max(samples);
    format!("{lo:.0} / {mid:.0} / {hi:.0}")
}

async fn env() {
    let db = fresh_db().await;
    let row: (String, String, String, u64, String, String, String) = sqlx::query_as(
        "SELECT VERSION(), CAST(@@innodb_flush_log_at_trx_commit AS CHAR), CAST(@@log_bin AS CHAR),
                @@innodb_buffer_pool_size, @@tx_isolation, @@character_set_server,
                CAST(@@innodb_doublewrite AS CHAR)",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    println!("## Environment\n");
    println!("| | |\n|---|---|");
    println!("| server | {} |", row.0);
    println!("| innodb_flush_log_at_trx_commit | {} |", row.1);
    println!("| log_bin | {} |", row.2);
    println!("| innodb_buffer_pool_size | {} MiB |", row.3 >> 20);
    println!("| transaction_isolation (default) | {} |", row.4);
    println!("| character_set_server | {} |", row.5);
    println!("| innodb_doublewrite | {} |", row.6);
    println!(
        "| cpus | {} |",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!(
        "| build | {} |\n",
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
    );
}

async fn kill(args: &Args, graceful: bool) {
    let trials = args.num("trials", if graceful { 10 } else { 20 }) as usize;
    let tasks = args.num("tasks-per-trial", 2) as usize;
    let settings = args.kill_settings();
    let db = fresh_db().await;
    db.log_transitions().await;
    let exe = exe();
    let mut takeover = Vec::new();
    let mut after_release = Vec::new();
    let mut per_trial_max = Vec::new();
    let mut all_ok = true;
    let mut not_released = 0;
    for trial in 0..trials {
        let t = scenarios::takeover_trial_with(&db, &exe, &settings, tasks, graceful, trial).await;
        all_ok &= t
            .rows
            .iter()
            .all(|r| r.state == "succeeded" && r.worker_id.as_deref() == Some(t.second.as_str()));
        per_trial_max.push(t.takeover.iter().cloned().fold(0.0, f64::max));
        takeover.extend(t.takeover);
        after_release.extend(t.after_release);
        not_released += t.not_released.len();
        eprintln!("trial {trial}: {:?}", per_trial_max.last());
    }
    if graceful {
        println!(
            "## Scenario 1b: SIGTERM with a 300 ms shutdown timeout ({trials} trials × {tasks} tasks)\n"
        );
        println!("| measure (s) | min / median / max |\n|---|---|");
        println!(
            "| SIGTERM → other worker's handler started | {} |",
            mmm(&takeover)
        );
        println!(
            "| release written → other worker's handler started | {} |",
            mmm(&after_release)
        );
        println!(
            "| tasks not released (waited for lease expiry instead) | {not_released} of {} |",
            trials * tasks
        );
    } else {
        println!(
            "## Scenario 1: SIGKILL mid-handler, {} ({trials} trials × {tasks} tasks)\n",
            describe(&settings)
        );
        println!("| measure (s) | min / median / max |\n|---|---|");
        println!(
            "| kill → other worker's handler started (per task) | {} |",
            mmm(&takeover)
        );
        println!(
            "| kill → last task of the trial started | {} |",
            mmm(&per_trial_max)
        );
    }
    println!("\nevery task completed by the other worker: {all_ok}\n");
}

async fn pause(args: &Args) {
    let trials = args.num("trials", 5) as usize;
    let db = fresh_db().await;
    let exe = exe();
    println!(
        "## Scenario 2: SIGSTOP past the 2 s lease, SIGCONT after the takeover ({trials} trials)\n"
    );
    println!(
        "| trial | SIGSTOP → takeover (s) | row kept (worker, state, epoch) | resumed handler saw | paused worker: lost_leases / fenced / succeeded |"
    );
    println!("|---|---|---|---|---|");
    for trial in 0..trials {
        let t = scenarios::pause_trial(&db, &exe, trial).await;
        let r = &t.row_after_resume;
        let kept = t.row_after_resume == t.row_before_resume;
        let saw: Vec<_> = t
            .events
            .iter()
            .filter(|e| e.worker_id == t.paused && e.event.starts_with("canceled:"))
            .map(|e| e.event.clone())
            .collect();
        let s = &t.report.stats;
        println!(
            "| {trial} | {:.2} | {} ({}, {}, {}) | {} | {} / {} / {} |",
            t.takeover,
            if kept { "unchanged" } else { "CHANGED" },
            r.worker_id.as_deref().unwrap_or("-"),
            r.state,
            r.lease_epoch,
            saw.join(", "),
            s["lost_leases"],
            s["fenced"],
            s["succeeded"]
        );
    }
    println!();
}

fn load_table(title: &str, s: &LoadSettings, run: &LoadRun) {
    let st = run.stats();
    let check = run.check();
    println!("## {title}\n");
    println!("| | |\n|---|---|");
    println!(
        "| load | {} tasks, {} workers × concurrency {}, handler {} ms, lease {:?} |",
        s.tasks, s.workers, s.concurrency, s.sleep_ms, s.lease
    );
    println!("| succeeded when the fault began | {} |", run.done_at_fault);
    println!(
        "| rows / succeeded at the end | {} / {} |",
        run.rows.len(),
        run.rows.iter().filter(|r| r.state == "succeeded").count()
    );
    println!("| handler executions | {} |", run.executions());
    println!(
        "| tasks executed more than once | {} |",
        run.duplicated().len()
    );
    println!(
        "| tasks whose lease expired (reaped) | {} |",
        run.reaped().len()
    );
    println!(
        "| worker counters: db_errors / lost_leases / fenced / reaped | {} / {} / {} / {} |",
        st.db_errors, st.lost_leases, st.fenced, st.reaped
    );
    if run.cuts > 0 {
        println!("| connections cut by the proxy | {} |", run.cuts);
    }
    println!("| total time | {:.1} s |", run.elapsed.as_secs_f64());
    println!(
        "| fault over → all done | {:.1} s |",
        run.recovery.as_secs_f64()
    );
    println!(
        "| invariants (none lost, all terminal, no epoch ran twice, duplicates ⊆ reaped) | {} |\n",
        match check {
            Ok(()) => "hold".to_owned(),
            Err(e) => format!("VIOLATED: {e}"),
        }
    );
}

async fn outage(args: &Args) {
    for lease_ms in [args.num("lease-ms", 2000), 30_000] {
        let mut db = fresh_db().await;
        let s = LoadSettings {
            tasks: args.num("tasks", 5000) as u32,
            workers: 4,
            concurrency: 8,
            sleep_ms: 10,
            lease: Duration::from_millis(lease_ms),
            outage: Duration::from_secs(args.num("outage-s", 10)),
            kill_at: 0.3,
            ..LoadSettings::small()
        };
        let run = scenarios::db_outage(&mut db, &s).await;
        load_table(
            &format!(
                "Scenario 3: database SIGKILLed for {} s under load (lease {} s)",
                s.outage.as_secs(),
                lease_ms / 1000
            ),
            &s,
            &run,
        );
    }
}

async fn chaos(args: &Args) {
    let tasks = args.num("tasks", 5000) as u32;
    for (title, p) in [
        ("no chaos (baseline)", 0.0),
        ("connections cut at random", 0.25),
    ] {
        let db = fresh_db().await;
        let s = LoadSettings {
            tasks,
            workers: 4,
            concurrency: 8,
            sleep_ms: 10,
            outage: Duration::ZERO,
            chaos_every: Duration::from_millis(50)..Duration::from_millis(250),
            chaos_probability: p,
            ..LoadSettings::small()
        };
        let run = scenarios::connection_chaos(&db, &s).await;
        load_table(
            &format!("Scenario 4: {title} (every 50–250 ms each live connection cut with p = {p})"),
            &s,
            &run,
        );
    }
}

async fn tx(args: &Args) {
    let total = args.num("total", 10_000);
    let db = fresh_db().await;
    let run = scenarios::transactions(&db, total, 8).await;
    let committed_orders: std::collections::BTreeSet<u64> =
        run.expected.iter().map(|e| e.0).collect();
    let task_orders: std::collections::BTreeSet<u64> = run.tasks.iter().map(|t| t.0).collect();
    let orders: std::collections::BTreeSet<u64> = run.orders.iter().copied().collect();
    println!("## Scenario 5: {total} transactions from 8 producers, a worker running\n");
    println!("| | |\n|---|---|");
    println!("| committed | {} |", run.committed);
    println!("| rolled back explicitly | {} |", run.rolled_back);
    println!(
        "| failed after the enqueue (duplicate key), dropped | {} |",
        run.failed_after_enqueue
    );
    println!("| dropped without commit | {} |", run.dropped);
    println!(
        "| business rows / task rows | {} / {} |",
        run.orders.len(),
        run.tasks.len()
    );
    println!(
        "| tasks without a business row | {} |",
        task_orders.difference(&orders).count()
    );
    println!(
        "| business rows without a task | {} |",
        orders.difference(&task_orders).count()
    );
    println!(
        "| (order, task) pairs equal to the committed ones | {} |",
        run.tasks == run.expected
    );
    println!(
        "| committed rows = business rows | {} |",
        committed_orders == orders
    );
    println!(
        "| handler runs that found / missed their row | {} / {} |",
        run.found, run.orphans_seen
    );
    println!(
        "| producer time | {:.1} s ({:.0} tx/s) |\n",
        run.elapsed.as_secs_f64(),
        total as f64 / run.elapsed.as_secs_f64()
    );
}

async fn black_hole(args: &Args) {
    let trials = args.num("trials", 5) as usize;
    let tasks = args.num("tasks-per-trial", 4) as usize;
    let db = fresh_db().await;
    let exe = exe();
    let (mut margin, mut takeover) = (Vec::new(), Vec::new());
    let (mut all_ok, mut recovered, mut reasons_ok, mut by_other) = (true, 0, true, 0);
    let mut stats: HashMap<String, u64> = HashMap::new();
    for trial in 0..trials {
        let t = scenarios::black_hole_trial(&db, &exe, tasks, trial).await;
        all_ok &= t
            .rows
            .iter()
            .all(|r| r.state == "succeeded" && r.attempt == 2 && r.lease_epoch == 3);
        reasons_ok &= t.reasons.iter().all(|r| r == "canceled:LeaseLost");
        by_other += t
            .rows
            .iter()
            .filter(|r| r.worker_id.as_deref() == Some(&format!("other-{trial}")))
            .count();
        recovered += usize::from(t.recovered);
        margin.extend(t.cancel_margin);
        takeover.extend(t.takeover);
        for (k, v) in t.report.stats {
            *stats.entry(k).or_default() += v;
        }
        eprintln!("trial {trial}: recovered {}", t.recovered);
    }
    let stat = |k: &str| stats.get(k).copied().unwrap_or(0);
    println!(
        "## Scenario 8: heartbeat black-holed, lease 2 s, heartbeat 500 ms, cancel grace 500 ms ({trials} trials × {tasks} tasks)\n"
    );
    println!("| measure (s) | min / median / max |\n|---|---|");
    println!(
        "| handler canceled → its lease end (database clock; > 0 = before) | {} |",
        mmm(&margin)
    );
    println!(
        "| lease end → other attempt's handler started | {} |",
        mmm(&takeover)
    );
    println!(
        "\nevery task finished once more, on attempt 2 / epoch 3: {all_ok} ({by_other} of {} by the other worker, the rest by the partitioned one after its reaper returned them); every cancel was LeaseLost: {reasons_ok}",
        trials * tasks
    );
    println!(
        "partitioned worker: lost leases {}, statements abandoned past the deadline {}, fenced {}, succeeded {}",
        stat("lost_leases"),
        stat("statement_timeouts"),
        stat("fenced"),
        stat("succeeded")
    );
    println!("healed worker kept a new lease for 3 lease lengths: {recovered} of {trials}\n");
}

async fn bad() {
    let db = fresh_db().await;
    let run = scenarios::bad_data(&db, 1000).await;
    println!("## Scenario 6: bad data among 1000 good tasks\n");
    println!(
        "| case | end state | attempt | handler runs | error (first 120 chars) |\n|---|---|---|---|---|"
    );
    for c in &run.cases {
        let (state, attempt, err) = match &c.row {
            Some(r) => (
                r.state.clone(),
                r.attempt.to_string(),
                r.last_error.clone().unwrap_or_default(),
            ),
            None => (
                "not inserted".into(),
                "-".into(),
                c.enqueue_error.clone().unwrap_or_default(),
            ),
        };
        let err: String = err
            .chars()
            .take(120)
            .collect::<String>()
            .replace('|', "\\|");
        println!(
            "| {} | {state} | {attempt} | {} | {err} |",
            c.case,
            c.executions.len()
        );
    }
    let good_ok = run
        .good_rows
        .iter()
        .filter(|r| r.state == "succeeded")
        .count();
    println!(
        "\ngood tasks succeeded: {good_ok} / {}; worker counters: {:?}\n",
        run.good.len(),
        run.report.stats
    );
}

async fn poison(args: &Args) {
    let tasks = args.num("tasks", 2000) as u32;
    println!(
        "## Scenario 7: poison pills on a queue of concurrency 4 ({tasks} ordinary tasks of 5 ms)\n"
    );
    println!("| run | ordinary tasks/s | time | poison outcome |\n|---|---|---|---|");
    for with in [false, true] {
        let db = fresh_db().await;
        let started = Instant::now();
        let run = scenarios::poison(&db, tasks, 5, 4, with).await;
        let _ = started;
        let outcome = if with {
            let find = |k: PoisonKind| {
                let id = run.poison.iter().find(|p| p.0 == k).unwrap().1;
                let before = run.before_stop.iter().find(|r| r.id == id).unwrap();
                format!("{:?}: {} (attempt {})", k, before.state, before.attempt)
            };
            format!(
                "{}; {}; {}; released at shutdown: {:?}",
                find(PoisonKind::Panic),
                find(PoisonKind::HangWithTimeout),
                find(PoisonKind::HangNoTimeout),
                run.report.released
            )
        } else {
            "-".into()
        };
        println!(
            "| {} | {:.0} | {:.2} s | {} |",
            if with {
                "with panic + 2 hangs"
            } else {
                "baseline"
            },
            run.throughput,
            run.elapsed.as_secs_f64(),
            outcome
        );
    }
    println!();
}
