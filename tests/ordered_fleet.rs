//! Ordered tasks across a fleet of worker processes, on both backends: three
//! `taskq-ordered-worker` processes drain 600 ledger entries of 30 accounts, enqueued by four
//! concurrent producers, each entry in the transaction that bumps its account's version (so the
//! version is the account's commit order). Every handler records its start and end as rows
//! with auto-increment ids (see `ordered_support`). Then, per account: no two runs overlap,
//! the entries succeed in version order, and every one succeeds once. One entry fails its first
//! attempt (its account waits for its retry); one is slow, and the worker running it is killed
//! with SIGKILL mid-task: its account resumes after the lease expires, still in order.

#[path = "ordered_support/mod.rs"]
mod ordered_support;

use std::collections::HashMap;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use ordered_support::LedgerEntry;
use taskq::Task as _;
use taskq_tests::backends::{Db, TestBackend};
use taskq_tests::wait_until;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

/// The events table, per backend.
pub const EVENTS_MYSQL: &str = "CREATE TABLE ordered_events (id BIGINT NOT NULL AUTO_INCREMENT \
     PRIMARY KEY, account BIGINT NOT NULL, version BIGINT NOT NULL, kind VARCHAR(8) NOT NULL, \
     attempt INT NOT NULL, pid BIGINT NOT NULL)";
/// The events table on SQLite.
pub const EVENTS_SQLITE: &str = "CREATE TABLE ordered_events (id INTEGER PRIMARY KEY \
     AUTOINCREMENT, account INTEGER NOT NULL, version INTEGER NOT NULL, kind TEXT NOT NULL, \
     attempt INTEGER NOT NULL, pid INTEGER NOT NULL)";

const ACCOUNTS: i64 = 30;
const PER_PRODUCER: i64 = 150;
const PRODUCERS: i64 = 4;
const FAILING: (i64, i64) = (3, 2);
const SLOW: (i64, i64) = (7, 4);

fn exe() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_taskq-ordered-worker"))
}

async fn start(url: &str, id: &str) -> tokio::process::Child {
    let mut child = Command::new(exe())
        .args(["--url", url, "--id", id])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {}: {e}", exe().display()));
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let ready = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("the worker is ready within 30 s")
        .unwrap()
        .unwrap_or_default();
    assert_eq!(ready, format!("ready {id}"));
    child
}

fn signal(pid: u32, sig: &str) {
    let status = std::process::Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(status.success());
}

async fn the_fleet_runs_each_key_one_at_a_time_in_commit_order_through_a_sigkill<B: TestBackend>(
    db: Db<B>,
) {
    let sqlite = db.label() == "sqlite";
    db.exec(if sqlite { EVENTS_SQLITE } else { EVENTS_MYSQL })
        .await;
    db.exec("CREATE TABLE accounts (id BIGINT NOT NULL PRIMARY KEY, version BIGINT NOT NULL)")
        .await;
    for a in 0..ACCOUNTS {
        db.exec(&format!("INSERT INTO accounts VALUES ({a}, 0)"))
            .await;
    }
    let url = db.url();
    let mut workers = Vec::new();
    for i in 0..3 {
        workers.push(start(&url, &format!("ordered-{i}")).await);
    }
    // Producers: each entry is enqueued in the transaction that bumps its account's version.
    let mut producers = Vec::new();
    for p in 0..PRODUCERS {
        let pool = B::pool_with_busy_timeout(&db, Duration::from_secs(60));
        producers.push(tokio::spawn(async move {
            let mut rng = fastrand::Rng::with_seed(p as u64);
            for _ in 0..PER_PRODUCER {
                let account = rng.i64(0..ACCOUNTS);
                let mut tx = B::begin(&pool).await;
                B::exec_in(
                    &mut tx,
                    &format!("UPDATE accounts SET version = version + 1 WHERE id = {account}"),
                )
                .await;
                let version = B::scalar_in(
                    &mut tx,
                    &format!("SELECT version FROM accounts WHERE id = {account}"),
                )
                .await;
                LedgerEntry {
                    account,
                    version,
                    fail_once: (account, version) == FAILING,
                    slow_ms: if (account, version) == SLOW {
                        30_000
                    } else {
                        0
                    },
                }
                .enqueue_tx(&mut tx)
                .await
                .unwrap();
                tx.commit().await.unwrap();
            }
        }));
    }
    // The slow entry starts: kill the process running it.
    let started = format!(
        "SELECT COUNT(*) FROM ordered_events WHERE account = {} AND version = {} AND kind = 'start'",
        SLOW.0, SLOW.1
    );
    wait_until(
        Duration::from_secs(60),
        "the slow entry started",
        || async { db.scalar(&started).await == 1 },
    )
    .await;
    let pid = db
        .scalar(&format!(
            "SELECT pid FROM ordered_events WHERE account = {} AND version = {} AND kind = 'start'",
            SLOW.0, SLOW.1
        ))
        .await as u32;
    let victim = workers
        .iter()
        .position(|c| c.id() == Some(pid))
        .expect("the slow entry runs in one of the workers");
    signal(pid, "KILL");
    let _ = workers[victim].wait().await;
    for p in producers {
        p.await.unwrap();
    }
    let total = PRODUCERS * PER_PRODUCER;
    wait_until(
        Duration::from_secs(120),
        "every entry succeeded",
        || async { db.count("state = 'succeeded'").await == total },
    )
    .await;
    for (i, c) in workers.iter().enumerate() {
        if i != victim {
            signal(c.id().unwrap(), "TERM");
        }
    }
    for mut c in workers {
        let _ = tokio::time::timeout(Duration::from_secs(30), c.wait()).await;
    }
    check_events(&db, total, i64::from(pid)).await;
}

/// The events of `account` (kind, version, attempt, pid), in id order: for failure messages.
fn history(rows: &[Vec<String>], account: i64) -> Vec<String> {
    rows.iter()
        .filter(|r| r[0] == account.to_string())
        .map(|r| format!("{} v{} a{} p{}", r[2], r[1], r[3], r[4]))
        .collect()
}

/// Checks the events in id order. A run of the killed worker (`victim`) may never have ended,
/// and a run of it that ended may run again (its outcome was not written back before the
/// kill: at-least-once); every other run must end before the next run of its key starts.
async fn check_events<B: TestBackend>(db: &Db<B>, total: i64, victim: i64) {
    let rows = db
        .rows(
            &[
                "CAST(account AS CHAR)",
                "CAST(version AS CHAR)",
                "kind",
                "CAST(attempt AS CHAR)",
                "CAST(pid AS CHAR)",
            ],
            "FROM ordered_events ORDER BY id",
        )
        .await;
    // Per account: the run started last and not ended (version, attempt, pid).
    let mut open: HashMap<i64, (i64, i64, i64)> = HashMap::new();
    // Per account: the versions that succeeded, in order, with the process that ran them.
    let mut done: HashMap<i64, Vec<(i64, i64)>> = HashMap::new();
    let mut starts: HashMap<(i64, i64), u32> = HashMap::new();
    // The failing entry's starts: (attempt, pid).
    let mut failing_attempts: Vec<(i64, i64)> = Vec::new();
    for r in &rows {
        let n = |i: usize| -> i64 { r[i].parse().unwrap() };
        let (account, version, attempt, pid) = (n(0), n(1), n(3), n(4));
        match r[2].as_str() {
            "start" => {
                *starts.entry((account, version)).or_default() += 1;
                if (account, version) == FAILING {
                    failing_attempts.push((attempt, pid));
                }
                if let Some(prev) = open.get(&account) {
                    assert_eq!(
                        prev.2,
                        victim,
                        "account {account}: version {version} attempt {attempt} (pid {pid}) \
                         started while {prev:?} (version, attempt, pid) ran; the account's \
                         events: {:?}",
                        history(&rows, account)
                    );
                }
                open.insert(account, (version, attempt, pid));
            }
            _ => {
                assert_eq!(
                    open.remove(&account),
                    Some((version, attempt, pid)),
                    "account {account}"
                );
                if (account, version) == FAILING && attempt == 1 {
                    continue;
                }
                let list = done.entry(account).or_default();
                match list.last() {
                    Some(&(v, p)) if v == version && p == victim => {
                        list.pop();
                    }
                    _ => {}
                }
                list.push((version, pid));
            }
        }
    }
    assert!(
        open.values().all(|o| o.2 == victim),
        "runs without an end: {open:?}"
    );
    let mut n = 0;
    for (account, runs) in &done {
        let versions: Vec<i64> = runs.iter().map(|r| r.0).collect();
        let expected: Vec<i64> = (1..=versions.len() as i64).collect();
        assert_eq!(
            versions, expected,
            "account {account}: commit order, each once"
        );
        n += versions.len() as i64;
    }
    assert_eq!(n, total);
    // The failing entry fails its first attempt and succeeds a later one. Only the killed
    // worker adds to that, once: it may have claimed an attempt and died before its handler
    // started (that attempt number is never recorded: attempt 1, or a gap), or died while
    // running one (a start between the first and the last, on the victim).
    let attempts: Vec<i64> = failing_attempts.iter().map(|a| a.0).collect();
    let (first, last) = (
        attempts.first().copied().unwrap_or(0),
        attempts.last().copied().unwrap_or(0),
    );
    let increasing = attempts.windows(2).all(|w| w[1] > w[0]);
    let skipped = (first - 1) + attempts.windows(2).map(|w| w[1] - w[0] - 1).sum::<i64>();
    let middle = if failing_attempts.len() > 2 {
        &failing_attempts[1..failing_attempts.len() - 1]
    } else {
        &[][..]
    };
    assert!(
        first >= 1
            && last >= 2
            && increasing
            && skipped + middle.len() as i64 <= 1
            && middle.iter().all(|a| a.1 == victim),
        "the failing entry ran its first attempt, failed, and ran again (an extra attempt only \
         on the killed worker {victim}): (attempt, pid) {failing_attempts:?}; its account's \
         events: {:?}",
        history(&rows, FAILING.0)
    );
    assert_eq!(
        starts[&SLOW], 2,
        "the killed entry ran again after its lease"
    );
}

taskq_tests::conformance!(the_fleet_runs_each_key_one_at_a_time_in_commit_order_through_a_sigkill);
