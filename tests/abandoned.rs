//! A worker frozen inside a transaction (SIGSTOP) does not hold its locks for hours: the server
//! closes its silent session after `session_timeout` (half the lease + 1 s, at least 5 s: the
//! worker sets `wait_timeout`, `net_read_timeout` and `net_write_timeout` on its sessions),
//! which rolls the transaction back, and the other workers go on.
//!
//! Each test starts a private server (the frozen sessions must not outlive the test on a
//! shared one), a `taskq-stall-worker` child connected through a [`ChaosProxy`] that swallows
//! the statement that follows the lock (so the child is inside its transaction, the lock
//! taken, waiting for an answer), stops the child with SIGSTOP, and times what the lock held
//! up: another worker's claim of a limited queue, another worker's fire of the schedule, a
//! producer's enqueue of the unique identity being freed.
//!
//! MySQL only: SQLite has no server session to close; a process stopped while it holds the
//! file's write lock blocks every writer until it resumes (docs/semantics.md, "SQLite").

#[path = "stall_support/mod.rs"]
mod stall_support;

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use sqlx::MySqlPool;
use sqlx::mysql::MySqlPoolOptions;
use stall_support::*;
use taskq::{Client, Task};
use taskq_tests::proxy::ChaosProxy;
use taskq_tests::server::PrivateServer;
use taskq_tests::{RunningWorker, fast_worker, wait_until};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// The frozen worker's lease: statement timeout 2 s, so its sessions are closed by the
/// server after 5 s of silence (the floor).
const LEASE: Duration = Duration::from_secs(4);
/// `session_timeout` for [`LEASE`].
const SESSION_TIMEOUT: Duration = Duration::from_secs(5);
/// Most the others may wait past [`SESSION_TIMEOUT`]: their own retry after a lock wait
/// that timed out (at most their backoff step), scheduling on a busy machine.
const SLACK: Duration = Duration::from_secs(5);

struct Setup {
    server: PrivateServer,
    pool: MySqlPool,
    proxy: ChaosProxy,
}

async fn setup() -> Option<Setup> {
    let server = PrivateServer::start_or_skip().await?;
    server.create_database("stall").await.expect("database");
    let pool = MySqlPoolOptions::new()
        .max_connections(8)
        .connect_with(server.connect_options("stall"))
        .await
        .expect("connect");
    taskq::migrate(&pool).await.expect("migrations");
    let proxy = ChaosProxy::start(server.addr()).await;
    Some(Setup {
        server,
        pool,
        proxy,
    })
}

/// Starts a `taskq-stall-worker` of `kind` through the proxy, which black-holes its
/// connection when it sends `needle` (the statement after the lock); once it has, stops the
/// child. Returns the child and when its connection was black-holed.
async fn freeze(s: &Setup, kind: &str, needle: &str) -> (Child, Instant) {
    s.proxy.black_hole_matching(needle.as_bytes());
    let mut child = Command::new(Path::new(env!("CARGO_BIN_EXE_taskq-stall-worker")))
        .args(["--url", &format!("mysql://root@{}/stall", s.proxy.addr())])
        .args(["--id", "frozen", "--kind", kind])
        .args(["--lease-ms", &LEASE.as_millis().to_string()])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn taskq-stall-worker");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let ready = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("the child starts")
        .unwrap()
        .unwrap_or_default();
    assert!(ready.starts_with("ready"), "{ready}");
    wait_until(
        Duration::from_secs(20),
        "the statement after the lock",
        || async { s.proxy.stats().black_holed >= 1 },
    )
    .await;
    let at = Instant::now();
    signal(&child, "STOP");
    (child, at)
}

fn signal(child: &Child, sig: &str) {
    let status = std::process::Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(child.id().expect("running").to_string())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{sig}");
}

async fn status(pool: &MySqlPool, name: &str) -> i64 {
    let (_, v): (String, String) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SHOW GLOBAL STATUS LIKE '{name}'"
    )))
    .fetch_one(pool)
    .await
    .unwrap();
    v.parse().unwrap()
}

/// The session of the one open transaction of another session than the one asking: the
/// frozen worker's (nothing else runs yet).
async fn frozen_session(pool: &MySqlPool) -> u64 {
    let ids: Vec<u64> = sqlx::query_scalar(
        "SELECT trx_mysql_thread_id FROM information_schema.INNODB_TRX
         WHERE trx_mysql_thread_id <> CONNECTION_ID()",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    assert_eq!(ids.len(), 1, "one transaction open, the frozen worker's");
    ids[0]
}

/// Checks what the freeze held up went on between `SESSION_TIMEOUT - 2 s` (it really waited
/// for the frozen transaction) and `SESSION_TIMEOUT + SLACK` after the freeze, and that the
/// server closed the frozen session.
async fn went_on(
    s: &Setup,
    what: &str,
    frozen_at: Instant,
    went_on_at: Instant,
    session: u64,
    aborted: i64,
) {
    let waited = went_on_at - frozen_at;
    eprintln!("{what}: went on {waited:?} after the worker froze in its transaction");
    assert!(
        waited >= SESSION_TIMEOUT - Duration::from_secs(2),
        "{what} did not wait for the frozen transaction ({waited:?}): no lock was held"
    );
    assert!(
        waited <= SESSION_TIMEOUT + SLACK,
        "{what} waited {waited:?}"
    );
    assert!(
        status(&s.pool, "Aborted_clients").await > aborted,
        "the server closed the frozen session"
    );
    // (Its locks are released by the rollback, just before the session's thread ends.)
    wait_until(
        Duration::from_secs(2),
        "the frozen session gone",
        || async {
            let alive: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = ?",
            )
            .bind(session)
            .fetch_one(&s.pool)
            .await
            .unwrap();
            alive == 0
        },
    )
    .await;
}

/// A claim of a limited queue locks the queue's row: frozen there, it held up every claim of
/// that queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_frozen_in_a_limited_claim_holds_the_queue_only_until_the_server_closes_it() {
    let Some(s) = setup().await else { return };
    Client::new(s.pool.clone())
        .set_queue_limit(LIMITED_QUEUE, Some(2))
        .await
        .unwrap();
    let aborted = status(&s.pool, "Aborted_clients").await;
    let (mut child, frozen_at) = freeze(
        &s,
        "limited",
        "WHERE state = 'running' AND queue = ?", // the running count, after the row lock
    )
    .await;
    let session = frozen_session(&s.pool).await; // frozen in its claim
    for _ in 0..3 {
        StallNap { ms: 10 }.enqueue(&s.pool).await.unwrap();
    }
    let other = RunningWorker::spawn(
        fast_worker(&s.pool)
            .register::<StallNap>()
            .queue(LIMITED_QUEUE, 2),
    );
    wait_until(
        SESSION_TIMEOUT + SLACK * 2,
        "the other worker's claim",
        || async { other.stats.snapshot().claimed >= 1 },
    )
    .await;
    let at = Instant::now();
    went_on(
        &s,
        "another worker's claim",
        frozen_at,
        at,
        session,
        aborted,
    )
    .await;
    wait_until(Duration::from_secs(20), "the tasks", || async {
        other.stats.snapshot().succeeded >= 3
    })
    .await;
    other.stop().await;
    signal(&child, "KILL");
    let _ = child.wait().await;
    drop(s.server);
}

/// A schedule's fire locks the schedule's row: frozen there, it held up every other worker's
/// fire of that schedule.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_frozen_in_a_schedule_fire_holds_the_schedule_only_until_the_server_closes_it() {
    let Some(s) = setup().await else { return };
    let aborted = status(&s.pool, "Aborted_clients").await;
    let (mut child, frozen_at) = freeze(
        &s,
        "schedule",
        "order_key, order_seq, order_dead_skips, created_at", // the tick's task, after the schedule's UPDATE
    )
    .await;
    let session = frozen_session(&s.pool).await; // frozen in its fire
    let other = RunningWorker::spawn(
        fast_worker(&s.pool)
            .register::<StallTick>()
            .queue(CRON_QUEUE, 1),
    );
    wait_until(
        SESSION_TIMEOUT + SLACK * 2,
        "the other worker's fire",
        || async { other.stats.snapshot().scheduled >= 1 },
    )
    .await;
    let at = Instant::now();
    went_on(&s, "another worker's fire", frozen_at, at, session, aborted).await;
    other.stop().await;
    signal(&child, "KILL");
    let _ = child.wait().await;
    drop(s.server);
}

/// A unique task's write-back locks its identity first: frozen there, it held up a producer's
/// enqueue of that identity (and with it the producer's transaction).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_frozen_in_a_write_back_holds_the_identity_only_until_the_server_closes_it() {
    let Some(s) = setup().await else { return };
    let first = StallUnique { account: 7 }.enqueue(&s.pool).await.unwrap();
    assert!(!first.duplicate);
    let aborted = status(&s.pool, "Aborted_clients").await;
    let (mut child, frozen_at) = freeze(
        &s,
        "unique",
        "outcome VARCHAR(16) PATH '$.outcome'", // the row's UPDATE, after the identity's lock
    )
    .await;
    let session = frozen_session(&s.pool).await; // frozen in its write-back
    let mut tx = s.pool.begin().await.unwrap();
    let again = tokio::time::timeout(
        SESSION_TIMEOUT + SLACK * 2,
        StallUnique { account: 7 }.enqueue_tx(&mut tx),
    )
    .await
    .expect("the producer's enqueue waited past the bound")
    .expect("the producer's enqueue succeeded");
    let at = Instant::now();
    tx.commit().await.unwrap();
    // The frozen write-back was rolled back: the task still runs (its lease will expire) and
    // holds the identity, so the enqueue found it.
    assert!(again.duplicate);
    assert_eq!(again.id, first.id);
    went_on(
        &s,
        "a producer's unique enqueue",
        frozen_at,
        at,
        session,
        aborted,
    )
    .await;
    signal(&child, "KILL");
    let _ = child.wait().await;
    drop(s.server);
}

/// The worker's own pools close idle connections before the server's `session_timeout`
/// would: a worker whose work connection sits idle past it (polling every 8 s, lease 4 s:
/// the server closes silent sessions after 5 s) claims again on a fresh connection, without
/// a failed statement, and the server never had to close one of its sessions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_worker_connections_are_closed_by_the_pool_before_the_server_would() {
    let Some(s) = setup().await else { return };
    let aborted = status(&s.pool, "Aborted_clients").await;
    let w = RunningWorker::spawn(
        fast_worker(&s.pool)
            .register::<StallNap>()
            .queue(LIMITED_QUEUE, 1)
            .lease(LEASE)
            .poll_interval(Duration::from_millis(10), Duration::from_secs(8))
            .reaper_interval(Duration::from_secs(60)),
    );
    StallNap { ms: 1 }.enqueue(&s.pool).await.unwrap();
    wait_until(Duration::from_secs(10), "the first task", || async {
        w.stats.snapshot().succeeded >= 1
    })
    .await;
    // Idle past the session timeout (the claim loop polls every 8 s by now).
    tokio::time::sleep(SESSION_TIMEOUT * 2 + Duration::from_secs(2)).await;
    StallNap { ms: 1 }.enqueue(&s.pool).await.unwrap(); // wakes the claim loop at once
    wait_until(Duration::from_secs(10), "the second task", || async {
        w.stats.snapshot().succeeded >= 2
    })
    .await;
    let stats = w.stop().await.stats;
    assert_eq!(
        (stats.db_errors, stats.statement_timeouts),
        (0, 0),
        "{stats:?}"
    );
    assert_eq!(
        status(&s.pool, "Aborted_clients").await,
        aborted,
        "the server closed none of the worker's sessions"
    );
    drop(s.server);
}
