//! taskq on a three-node MariaDB Galera cluster of private servers (see
//! `tests/support/galera.rs`): enqueue on any node, workers on every node, the migration lock
//! across nodes, ordered tasks' per-key commit order with writers on every node, a queue's
//! concurrency limit across nodes, the outbox relay's per-key order with publishers and
//! relays on every node, a node killed mid-drain, a node that loses quorum and rejoins.
//!
//! One cluster serves every scenario, run in sequence by one test (forming a cluster takes
//! seconds; the scenarios leave it whole). Skipped with a message when the machine has no
//! `mariadbd` or no galera-4 provider, unless `TASKQ_REQUIRE_PRIVATE_SERVER` is set (CI).

#[path = "galera_support/mod.rs"]
mod galera_support;

use std::time::{Duration, Instant};

use galera_support::{ClusterDb, Runs, Work, drain, limited_drain, total, worker};
use sqlx::Connection;
use taskq::{Task, TaskId};
use taskq_tests::galera::GaleraCluster;
use taskq_tests::wait_until;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn taskq_on_a_three_node_galera_cluster() {
    let Some(mut cluster) = GaleraCluster::start_or_skip().await else {
        return;
    };
    let t = Instant::now();
    migration_lock_serializes_migrators_on_different_nodes(&cluster).await;
    eprintln!("migration lock: {:?}", t.elapsed());
    let t = Instant::now();
    business_transactions_on_every_node_give_exactly_the_committed_tasks(&cluster).await;
    eprintln!("integrity: {:?}", t.elapsed());
    let t = Instant::now();
    multi_writer_drain_absorbs_certification_conflicts(&cluster).await;
    eprintln!("multi-writer drain: {:?}", t.elapsed());
    let t = Instant::now();
    a_concurrency_limit_holds_across_writer_nodes(&cluster).await;
    eprintln!("limited queue: {:?}", t.elapsed());
    let t = Instant::now();
    ordered_keys_keep_commit_order_with_writers_on_every_node(&cluster).await;
    eprintln!("ordered keys: {:?}", t.elapsed());
    let t = Instant::now();
    outbox_relays_keep_commit_order_with_publishers_on_every_node(&cluster).await;
    eprintln!("outbox relays: {:?}", t.elapsed());
    let t = Instant::now();
    a_killed_node_s_tasks_are_finished_by_the_survivors(&mut cluster).await;
    eprintln!("node kill: {:?}", t.elapsed());
    let t = Instant::now();
    a_node_without_quorum_refuses_work_and_its_worker_backs_off(&cluster).await;
    eprintln!("quorum loss: {:?}", t.elapsed());
}

/// `GET_LOCK` is per server: two sessions on two nodes both get the same name, which is why
/// `migrate` takes a row instead. A lock row taken on node 1 keeps a migrator on node 2
/// waiting until it is gone; two migrators started together on two nodes both succeed and
/// apply each migration once.
async fn migration_lock_serializes_migrators_on_different_nodes(cluster: &GaleraCluster) {
    let mut a = cluster.node(0).connect().await.unwrap();
    let mut b = cluster.node(1).connect().await.unwrap();
    let got = |c| async move {
        let c: &mut sqlx::MySqlConnection = c;
        sqlx::query_scalar::<_, Option<i64>>("SELECT GET_LOCK('taskq_galera_probe', 0)")
            .fetch_one(c)
            .await
            .unwrap()
    };
    assert_eq!(got(&mut a).await, Some(1));
    assert_eq!(
        got(&mut b).await,
        Some(1),
        "GET_LOCK is not replicated: node 2 gets the lock node 1 holds"
    );
    a.close().await.unwrap();
    b.close().await.unwrap();

    // A lock row held (as by a migrator on node 1) keeps a migrator on node 2 out.
    let urls = cluster.create_database("mlock_held").await.unwrap();
    let p1 = sqlx::MySqlPool::connect(&urls[0]).await.unwrap();
    let p2 = sqlx::MySqlPool::connect(&urls[1]).await.unwrap();
    taskq::migrate(&p1).await.unwrap();
    sqlx::raw_sql(
        "INSERT INTO taskq_migration_lock (id, holder, expires_at) \
         VALUES (1, 'test-holder', UTC_TIMESTAMP(6) + INTERVAL 1 MINUTE)",
    )
    .execute(&p1)
    .await
    .unwrap();
    let waiting = tokio::spawn({
        let p2 = p2.clone();
        async move { taskq::migrate(&p2).await }
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        !waiting.is_finished(),
        "a migrator on node 2 must wait for the lock row taken on node 1"
    );
    sqlx::raw_sql("DELETE FROM taskq_migration_lock")
        .execute(&p1)
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the migrator finishes once the lock is free")
        .unwrap()
        .expect("migrate on node 2");

    // Two migrators on fresh database, on two nodes at once: both succeed, each version once.
    let urls = cluster.create_database("mlock_race").await.unwrap();
    let pools: Vec<sqlx::MySqlPool> = futures_join(&urls[..3]).await;
    let (r1, r2, r3) = tokio::join!(
        taskq::migrate(&pools[0]),
        taskq::migrate(&pools[1]),
        taskq::migrate(&pools[2])
    );
    r1.expect("migrate on node 1");
    r2.expect("migrate on node 2");
    r3.expect("migrate on node 3");
    let (versions, distinct): (i64, i64) = sqlx::query_as(
        "SELECT COUNT(*), COUNT(DISTINCT version) FROM _taskq_migrations WHERE success = 1",
    )
    .fetch_one(&pools[2])
    .await
    .unwrap();
    assert_eq!(versions, taskq::migrate::migrator().iter().count() as i64);
    assert_eq!(versions, distinct);
    let left: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM taskq_migration_lock")
        .fetch_one(&pools[1])
        .await
        .unwrap();
    assert_eq!(left, 0, "the lock is released");
}

async fn futures_join(urls: &[String]) -> Vec<sqlx::MySqlPool> {
    let mut out = Vec::new();
    for u in urls {
        out.push(sqlx::MySqlPool::connect(u).await.unwrap());
    }
    out
}

/// Producers on all three nodes run business transactions (an order row plus its task,
/// `enqueue_tx`; every fifth rolled back) and batches (`enqueue_many`, whose ids under
/// `innodb_autoinc_lock_mode=2` are read back); workers on all three nodes drain them. The
/// tasks are exactly the committed orders and batches, ids match payloads, and each task ran
/// once (no lease expired: nothing failed).
async fn business_transactions_on_every_node_give_exactly_the_committed_tasks(
    cluster: &GaleraCluster,
) {
    let db = ClusterDb::new(cluster, "integrity", 24).await;
    let runs = Runs::default();
    let workers: Vec<_> = (0..3)
        .map(|i| worker(&db.pools[i], &runs, 8, &format!("integrity-n{}", i + 1)))
        .collect();
    let mut producers = Vec::new();
    for node in 0..3usize {
        let pool = db.pools[node].clone();
        producers.push(tokio::spawn(async move {
            let mut committed = Vec::new();
            let mut batch_ids = Vec::new();
            // Transactions retried after a conflict (ER_LOCK_DEADLOCK: a certification failure
            // or brute-force abort), as every application on Galera must.
            let mut retries = 0u32;
            for k in 0..60u32 {
                loop {
                    match business_tx(&pool, node, k % 5 != 4).await {
                        Ok(Some(done)) => committed.push(done),
                        Ok(None) => {}
                        Err(e) if e.is_conflict() => {
                            retries += 1;
                            continue;
                        }
                        Err(e) => panic!("business transaction: {e}"),
                    }
                    break;
                }
                if k % 20 == 0 {
                    // A batch whose ids interleave with the other nodes' inserts.
                    let base = 1_000_000 * (node as u64 + 1) + u64::from(k) * 1000;
                    let ids = loop {
                        match batch_tx(&pool, base).await {
                            Ok(ids) => break ids,
                            Err(e) if e.is_conflict() => retries += 1,
                            Err(e) => panic!("batch transaction: {e}"),
                        }
                    };
                    batch_ids.extend(
                        ids.into_iter()
                            .enumerate()
                            .map(|(j, id)| (base + j as u64, id)),
                    );
                }
            }
            (committed, batch_ids, retries)
        }));
    }
    let mut retries = 0;
    let mut expected: Vec<(u64, TaskId)> = Vec::new();
    for p in producers {
        let (c, b, r) = p.await.unwrap();
        retries += r;
        expected.extend(c);
        expected.extend(b);
    }
    let n = expected.len() as i64;
    assert_eq!(n, 3 * (48 + 3 * 50));
    wait_until(
        Duration::from_secs(60),
        "all committed tasks run",
        || async { db.count(0, "state = 'succeeded'").await == n },
    )
    .await;
    let mut stats = Vec::new();
    for w in workers {
        stats.push(w.stop().await.stats);
    }
    // Exactly the committed tasks, with the ids the producers were given.
    assert_eq!(
        db.count(2, "TRUE").await,
        n,
        "no task of a rolled-back transaction"
    );
    let rows: Vec<(u64, Vec<u8>)> = sqlx::query_as("SELECT id, payload FROM taskq_tasks")
        .fetch_all(&db.pools[1])
        .await
        .unwrap();
    let by_id: std::collections::HashMap<u64, u64> = rows
        .into_iter()
        .map(|(id, p)| {
            let w: Work = serde_json::from_slice(&p).unwrap();
            (id, w.order)
        })
        .collect();
    for (order, id) in &expected {
        assert_eq!(
            by_id.get(&id.0),
            Some(order),
            "task {id} carries order {order}"
        );
    }
    let orders: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM orders")
        .fetch_one(&db.pools[2])
        .await
        .unwrap();
    assert_eq!(orders, 3 * 48, "committed orders");
    let (ran, total_runs, dup) = runs.summary();
    assert_eq!(ran as i64, n);
    assert_eq!((total_runs as i64, dup), (n, 0), "each task ran once");
    let t = total(&stats);
    assert_eq!(t.succeeded as i64, n);
    eprintln!(
        "integrity: {n} tasks; producer transactions retried after a conflict: {retries}; \
         worker conflicts absorbed: {} (db_errors {})",
        t.db_conflicts, t.db_errors
    );
}

/// An order and its task in one transaction; committed (returning both ids) or rolled back.
async fn business_tx(
    pool: &sqlx::MySqlPool,
    node: usize,
    commit: bool,
) -> taskq::Result<Option<(u64, TaskId)>> {
    let mut tx = pool.begin().await?;
    let order = sqlx::query("INSERT INTO orders (node) VALUES (?)")
        .bind(node as i64)
        .execute(&mut *tx)
        .await?
        .last_insert_id();
    let task = Work { order, ms: 1 }.enqueue_tx(&mut tx).await?;
    if commit {
        tx.commit().await?;
        Ok(Some((order, task.id)))
    } else {
        tx.rollback().await?;
        Ok(None)
    }
}

/// 50 tasks by `enqueue_many` in one transaction; their ids in input order.
async fn batch_tx(pool: &sqlx::MySqlPool, base: u64) -> taskq::Result<Vec<TaskId>> {
    let mut tx = pool.begin().await?;
    let ids = taskq::enqueue::enqueue_many(
        &mut tx,
        (0..50).map(|j| Work {
            order: base + j,
            ms: 0,
        }),
    )
    .await?;
    tx.commit().await?;
    Ok(ids.into_iter().map(|e| e.id).collect())
}

/// One worker per node claiming from the same queue: claims collide across nodes (row locks
/// are per node; certification decides), the losers are rolled back and claim again. No task
/// is lost or run twice.
async fn multi_writer_drain_absorbs_certification_conflicts(cluster: &GaleraCluster) {
    let d = drain(cluster, "multi_writer", 1500, &[0, 1, 2], 16).await;
    assert_eq!(d.duplicates, 0, "no task ran twice");
    assert_eq!(d.stats.succeeded, 1500);
    assert_eq!(d.stats.fenced, 0);
    eprintln!(
        "multi-writer: {} tasks in {:.2}s = {:.0}/s; conflicts {} of {} claims",
        d.tasks,
        d.secs,
        d.rate(),
        d.stats.db_conflicts,
        d.stats.claim_queries
    );
}

/// A queue limited to 2 running tasks, drained by two workers of four slots on each node. A
/// claim of a limited queue locks the queue's row, but that lock holds on one node only; when
/// the claim wrote nothing to the row, claims on two nodes did not conflict and each node
/// filled the queue to its limit (4 running at once, in every run of this scenario). Now the
/// claim bumps the row's counter with the tasks it starts: claims of the queue on different
/// nodes conflict at certification and the limit holds fleet-wide.
async fn a_concurrency_limit_holds_across_writer_nodes(cluster: &GaleraCluster) {
    const LIMIT: u32 = 2;
    let d = limited_drain(cluster, "limited", 300, LIMIT, 2, 4, 20).await;
    eprintln!(
        "limited queue: at most {} running at once (limit {LIMIT}), {} starts over the limit; \
         300 tasks in {:.2}s; conflicts {} of {} claims",
        d.max_running, d.over, d.secs, d.stats.db_conflicts, d.stats.claim_queries
    );
    assert!(
        d.max_running <= LIMIT as usize,
        "{} tasks of a queue limited to {LIMIT} ran at once ({} starts over the limit)",
        d.max_running,
        d.over
    );
    assert_eq!(d.stats.succeeded, 300);
}

/// SIGKILL node 3 while workers on all three nodes drain: the survivors finish everything,
/// taking over node 3's tasks when their leases expire; node 3 rejoins by IST and holds the
/// same rows; only tasks whose lease expired ran twice, each time with a new epoch.
async fn a_killed_node_s_tasks_are_finished_by_the_survivors(cluster: &mut GaleraCluster) {
    let tasks = 600i64;
    let db = ClusterDb::new(cluster, "node_kill", 24).await;
    let mut tx = db.pools[0].begin().await.unwrap();
    taskq::enqueue::enqueue_many(
        &mut tx,
        (0..tasks as u64).map(|order| Work { order, ms: 20 }),
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let runs = Runs::default();
    let workers: Vec<_> = (0..3)
        .map(|i| worker(&db.pools[i], &runs, 8, &format!("kill-n{}", i + 1)))
        .collect();
    wait_until(Duration::from_secs(30), "a third done", || async {
        db.count(0, "state = 'succeeded'").await >= tasks / 3
    })
    .await;
    let held: i64 = db
        .count(0, "state = 'running' AND worker_id = 'kill-n3'")
        .await;
    let killed = Instant::now();
    cluster.kill(2).await;
    wait_until(
        Duration::from_secs(30),
        "node 3's leases taken over",
        || async {
            db.count(0, "state = 'running' AND worker_id = 'kill-n3'")
                .await
                == 0
        },
    )
    .await;
    let takeover = killed.elapsed();
    wait_until(Duration::from_secs(60), "the survivors finish", || async {
        db.count(0, "state = 'succeeded'").await == tasks
    })
    .await;
    let finished = killed.elapsed();
    cluster.rejoin(2, 3).await.expect("node 3 rejoins");
    assert_eq!(
        db.count(2, "state = 'succeeded'").await,
        tasks,
        "node 3 caught up"
    );
    let mut stats = Vec::new();
    for w in workers {
        stats.push(w.stop().await.stats);
    }
    let t = total(&stats);
    // Every task ran; a task that ran more than once did so under distinct epochs (a lease
    // expired and the task was claimed again), never twice on one lease.
    let (ran, _, dup) = runs.summary();
    assert_eq!(ran as i64, tasks);
    runs.check_duplicates("kill-n3");
    eprintln!(
        "node kill: node 3 held {held} tasks; takeover {:.2}s, all done {:.2}s after the kill; \
         {dup} tasks ran twice; fenced {} reaped {} conflicts {}",
        takeover.as_secs_f64(),
        finished.as_secs_f64(),
        t.fenced,
        t.reaped,
        t.db_conflicts
    );
}

/// Node 3 cut off the group (`gmcast.isolate`): it refuses application statements
/// (non-primary), its worker's claims fail and back off rather than spin, nodes 1 and 2
/// finish the work; node 3 then rejoins by IST, its worker's outcomes are written or fenced,
/// and nothing ran twice except under a new epoch.
async fn a_node_without_quorum_refuses_work_and_its_worker_backs_off(cluster: &GaleraCluster) {
    let tasks = 600i64;
    let db = ClusterDb::new(cluster, "quorum", 24).await;
    let mut tx = db.pools[0].begin().await.unwrap();
    taskq::enqueue::enqueue_many(
        &mut tx,
        (0..tasks as u64).map(|order| Work { order, ms: 20 }),
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let runs = Runs::default();
    let workers: Vec<_> = (0..3)
        .map(|i| worker(&db.pools[i], &runs, 8, &format!("quorum-n{}", i + 1)))
        .collect();
    wait_until(Duration::from_secs(30), "a quarter done", || async {
        db.count(0, "state = 'succeeded'").await >= tasks / 4
    })
    .await;
    cluster.isolate(2, true).await.unwrap();
    cluster
        .wait_not_ready(2, Duration::from_secs(15))
        .await
        .unwrap();
    let status = cluster.status(2).await.unwrap();
    assert_eq!(status.cluster_status, "non-Primary");
    // It refuses work.
    let err = sqlx::query("SELECT COUNT(*) FROM taskq_tasks")
        .execute(&db.pools[2])
        .await
        .expect_err("a non-primary node refuses statements");
    let msg = err.to_string();
    assert!(msg.contains("WSREP has not yet prepared node"), "{msg}");
    let before = workers[2].stats.snapshot();
    let cut = Instant::now();
    wait_until(Duration::from_secs(60), "nodes 1 and 2 finish", || async {
        db.count(0, "state = 'succeeded'").await == tasks
    })
    .await;
    // Stay cut off for at least 4 s to see the back-off.
    let left = Duration::from_secs(4).saturating_sub(cut.elapsed());
    tokio::time::sleep(left).await;
    let during = cut.elapsed();
    let after = workers[2].stats.snapshot();
    let claims = after.claim_queries - before.claim_queries;
    let errors = after.db_errors - before.db_errors;
    assert!(
        claims <= 20,
        "the cut-off worker backs off: {claims} claims in {during:?}"
    );
    cluster.isolate(2, false).await.unwrap();
    cluster.wait_synced(2, 3).await.expect("node 3 rejoins");
    assert_eq!(db.count(2, "state = 'succeeded'").await, tasks);
    // Its worker works again.
    let mut tx = db.pools[2].begin().await.unwrap();
    let late = Work {
        order: 9_999,
        ms: 0,
    }
    .enqueue_tx(&mut tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
    wait_until(Duration::from_secs(20), "a new task runs", || async {
        db.count(0, &format!("id = {} AND state = 'succeeded'", late.id))
            .await
            == 1
    })
    .await;
    let mut stats = Vec::new();
    for w in workers {
        let report = w.stop().await;
        assert!(
            report.unacknowledged.is_empty(),
            "every outcome written or fenced: {:?}",
            report.unacknowledged
        );
        stats.push(report.stats);
    }
    let (ran, _, dup) = runs.summary();
    assert_eq!(ran as i64, tasks + 1);
    runs.check_duplicates("quorum-n3");
    let t = total(&stats);
    eprintln!(
        "quorum loss: cut-off worker made {claims} claims and {errors} errors in {:.1}s; \
         {dup} tasks ran twice (expired leases); fenced {} reaped {} conflicts {}",
        during.as_secs_f64(),
        t.fenced,
        t.reaped,
        t.db_conflicts
    );
}

/// One change of `account`, ordered by it: its run is recorded with a global sequence number
/// at its start and at its end (every worker runs in this process).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct AccountChange {
    account: i64,
    version: i64,
}

/// One run: `(account, version, start seq, end seq)`.
type ChangeRun = (i64, i64, u64, u64);

/// Every run.
#[derive(Clone, Default)]
struct ChangeLog(std::sync::Arc<std::sync::Mutex<Vec<ChangeRun>>>);

static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl Task for AccountChange {
    const NAME: &'static str = "galera_account_change";
    const QUEUE: &'static str = "galera_ordered";
    const MAX_ATTEMPTS: u32 = 25;
    const ORDERED: Option<taskq::ordered::Ordered> =
        Some(taskq::ordered::Ordered::by(&["account"]));
    async fn run(self, cx: taskq::TaskContext) -> Result<(), taskq::TaskError> {
        use std::sync::atomic::Ordering::SeqCst;
        let start = SEQ.fetch_add(1, SeqCst);
        tokio::time::sleep(Duration::from_millis(2)).await;
        let end = SEQ.fetch_add(1, SeqCst);
        let log = cx.data::<ChangeLog>().expect("ChangeLog registered");
        log.0
            .lock()
            .unwrap()
            .push((self.account, self.version, start, end));
        Ok(())
    }
}

/// Producers on all three nodes each commit changes of 6 accounts: a transaction bumps the
/// account's version row and enqueues the change ordered by the account (retried after a
/// certification conflict). Workers on all three nodes drain the queue. Per account the
/// changes run one at a time, in version order, which is the order their transactions
/// committed in (both write the account's row, so certification orders them).
async fn ordered_keys_keep_commit_order_with_writers_on_every_node(cluster: &GaleraCluster) {
    const ACCOUNTS: i64 = 6;
    const PER_NODE: i64 = 30;
    let db = ClusterDb::new(cluster, "ordered", 24).await;
    sqlx::raw_sql(
        "CREATE TABLE accounts (id BIGINT NOT NULL PRIMARY KEY, version BIGINT NOT NULL);
         INSERT INTO accounts (id, version) VALUES (0, 0), (1, 0), (2, 0), (3, 0), (4, 0), (5, 0)",
    )
    .execute(&db.pools[0])
    .await
    .expect("accounts");
    for i in 0..3 {
        db.count(i, "TRUE").await;
    }
    let log = ChangeLog::default();
    let workers: Vec<_> = (0..3)
        .map(|i| {
            taskq_tests::RunningWorker::spawn(
                taskq_tests::fast_worker(&db.pools[i])
                    .register::<AccountChange>()
                    .data(log.clone())
                    .queue(AccountChange::QUEUE, 8)
                    .lease(galera_support::LEASE)
                    .heartbeat(Duration::from_secs(1))
                    .shutdown_timeout(Duration::from_secs(3))
                    .worker_id(format!("ordered-n{}", i + 1)),
            )
        })
        .collect();
    let mut producers = Vec::new();
    for node in 0..3usize {
        let pool = db.pools[node].clone();
        producers.push(tokio::spawn(async move {
            let mut retries = 0u32;
            for k in 0..PER_NODE {
                let account = (k + node as i64) % ACCOUNTS;
                loop {
                    match change_tx(&pool, account).await {
                        Ok(()) => break,
                        Err(e) if e.is_conflict() => retries += 1,
                        Err(e) => panic!("change transaction: {e}"),
                    }
                }
            }
            retries
        }));
    }
    let mut retries = 0;
    for p in producers {
        retries += p.await.unwrap();
    }
    let n = 3 * PER_NODE;
    wait_until(Duration::from_secs(90), "every change ran", || async {
        db.count(0, "state = 'succeeded'").await == n
    })
    .await;
    let mut stats = Vec::new();
    for w in workers {
        stats.push(w.stop().await.stats);
    }
    let runs = log.0.lock().unwrap().clone();
    let versions: Vec<(i64, i64)> = sqlx::query_as("SELECT id, version FROM accounts ORDER BY id")
        .fetch_all(&db.pools[1])
        .await
        .unwrap();
    for (account, last) in versions {
        let mut mine: Vec<_> = runs.iter().filter(|r| r.0 == account).collect();
        mine.sort_by_key(|r| r.2);
        for pair in mine.windows(2) {
            assert!(
                pair[0].3 < pair[1].2,
                "account {account}: two changes ran at once: {pair:?}"
            );
        }
        let mut order: Vec<i64> = mine.iter().map(|r| r.1).collect();
        order.dedup();
        assert_eq!(
            order,
            (1..=last).collect::<Vec<_>>(),
            "account {account}: changes ran in commit (version) order"
        );
    }
    let t = total(&stats);
    eprintln!(
        "ordered keys: {n} changes of {ACCOUNTS} accounts, producers retried {retries} \
         transactions after a conflict; runs {}, worker conflicts absorbed {}",
        runs.len(),
        t.db_conflicts
    );
}

/// Bumps `account`'s version and enqueues that change, in one transaction.
async fn change_tx(pool: &sqlx::MySqlPool, account: i64) -> taskq::Result<()> {
    let mut tx = pool.begin().await?;
    sqlx::query("UPDATE accounts SET version = version + 1 WHERE id = ?")
        .bind(account)
        .execute(&mut *tx)
        .await?;
    let version: i64 = sqlx::query_scalar("SELECT version FROM accounts WHERE id = ?")
        .bind(account)
        .fetch_one(&mut *tx)
        .await?;
    AccountChange { account, version }
        .enqueue_tx(&mut tx)
        .await?;
    tx.commit().await?;
    Ok(())
}

/// A domain event of the outbox scenario: the key's version it records, and the attempt of
/// the transaction that published it (to tell the events of rolled-back attempts).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Bumped {
    key: i64,
    version: i64,
    attempt: u64,
}

impl taskq::outbox::Event for Bumped {
    fn topic(&self) -> &str {
        "galera.bumped"
    }
    fn key(&self) -> String {
        format!("k{}", self.key)
    }
}

/// What the relays' sink was handed and answered `Delivered`: (key, message id, payload).
type Received = std::sync::Arc<std::sync::Mutex<Vec<(String, String, Bumped)>>>;

/// Publishers on all three nodes commit transactions that bump a key's version row and
/// publish an event carrying the new version, one or two events per transaction, some on a
/// second key too, and one in seven rolled back on purpose; a transaction that loses a
/// conflict (1213: a deadlock, or a certification failure against another node's) is run
/// again as a whole. Relays on all three nodes (`taskq::outbox::Relay`, one pool each,
/// driven round by round so their failed rounds are counted) deliver to a function sink that
/// records what it was handed. Per key, after dropping repeated message ids, the sink saw the
/// versions 1, 2, ... up to the key's final version — commit order, no gap — and nothing of
/// a rolled-back attempt; every event row is delivered and every received id is a row's.
async fn outbox_relays_keep_commit_order_with_publishers_on_every_node(cluster: &GaleraCluster) {
    use std::collections::{HashMap, HashSet};
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};
    use taskq::outbox::{FnSink, Message, Outcome, Relay};
    const KEYS: i64 = 6;
    const PER_NODE: u64 = 30;
    let db = ClusterDb::new(cluster, "outbox", 24).await;
    sqlx::raw_sql(
        "CREATE TABLE versions (id BIGINT NOT NULL PRIMARY KEY, version BIGINT NOT NULL);
         INSERT INTO versions (id, version) VALUES (0, 0), (1, 0), (2, 0), (3, 0), (4, 0), (5, 0)",
    )
    .execute(&db.pools[0])
    .await
    .expect("versions");
    for i in 0..3 {
        db.count(i, "TRUE").await;
    }

    let received: Received = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let mut relays = Vec::new();
    for node in 0..3usize {
        let got = received.clone();
        let sink = FnSink::new(move |batch: Vec<Message>| {
            let got = got.clone();
            async move {
                let mut got = got.lock().unwrap();
                batch
                    .into_iter()
                    .map(|m| {
                        let e: Bumped = serde_json::from_slice(&m.payload).expect("payload");
                        got.push((m.key, m.id, e));
                        Outcome::Delivered
                    })
                    .collect::<Vec<_>>()
            }
        });
        let relay = Relay::builder(db.pools[node].clone(), sink)
            .name(format!("relay-n{}", node + 1))
            .batch_size(16)
            .lease(Duration::from_secs(3))
            .poll_interval(Duration::from_millis(20))
            .build()
            .expect("relay");
        let stop = stop.clone();
        relays.push(tokio::spawn(async move {
            // (rounds with keys, failed rounds, of which conflicts (1213), leases lost)
            let (mut rounds, mut failed, mut conflicts, mut lost) = (0u64, 0u64, 0u64, 0usize);
            while !stop.load(Ordering::SeqCst) {
                match relay.run_once().await {
                    Ok(r) if r.keys > 0 => {
                        rounds += 1;
                        lost += r.lost;
                    }
                    Ok(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                    Err(e) => {
                        failed += 1;
                        if e.is_conflict() {
                            conflicts += 1;
                        } else {
                            eprintln!("outbox: {} round failed: {e}", relay.name());
                        }
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
            (rounds, failed, conflicts, lost)
        }));
    }

    // Publishers: attempt numbers are unique across nodes; the attempts that did not commit
    // (rolled back on purpose, or lost a conflict) are recorded.
    let attempts = Arc::new(AtomicU64::new(0));
    let rolled_back: Arc<Mutex<HashSet<u64>>> = Arc::default();
    let mut producers = Vec::new();
    for node in 0..3usize {
        let pool = db.pools[node].clone();
        let attempts = attempts.clone();
        let rolled_back = rolled_back.clone();
        producers.push(tokio::spawn(async move {
            let (mut retries, mut events, mut aborted) = (0u32, 0u64, 0u32);
            for i in 0..PER_NODE {
                let key = (i as i64 + node as i64) % KEYS;
                let mut plan = vec![key];
                if i % 2 == 1 {
                    plan.push(key); // two events of the key in one transaction
                }
                if i % 4 == 3 {
                    plan.push((key + 1) % KEYS); // and one of the next key
                }
                let commit = i % 7 != 6;
                loop {
                    let attempt = attempts.fetch_add(1, Ordering::SeqCst);
                    match bump_tx(&pool, &plan, attempt, commit).await {
                        Ok(()) if commit => {
                            events += plan.len() as u64;
                            break;
                        }
                        Ok(()) => {
                            rolled_back.lock().unwrap().insert(attempt);
                            aborted += 1;
                            break;
                        }
                        Err(e) if e.is_conflict() => {
                            rolled_back.lock().unwrap().insert(attempt);
                            retries += 1;
                        }
                        Err(e) => panic!("publish transaction: {e}"),
                    }
                }
            }
            (retries, events, aborted)
        }));
    }
    let (mut retries, mut committed, mut aborted) = (0, 0, 0);
    for p in producers {
        let (r, e, a) = p.await.unwrap();
        retries += r;
        committed += e;
        aborted += a;
    }
    // Everything delivered, as every node sees it.
    let clients: Vec<taskq::Client> = db.pools.iter().cloned().map(taskq::Client::new).collect();
    wait_until(Duration::from_secs(90), "every event delivered", || async {
        for c in &clients {
            if !c.event_topics().await.unwrap().is_empty() {
                return false;
            }
        }
        true
    })
    .await;
    stop.store(true, Ordering::SeqCst);
    let (mut rounds, mut failed, mut relay_conflicts, mut lost) = (0, 0, 0, 0);
    for r in relays {
        let (a, b, c, d) = r.await.unwrap();
        rounds += a;
        failed += b;
        relay_conflicts += c;
        lost += d;
    }

    let mut conn = db.pools[1].acquire().await.unwrap();
    sqlx::raw_sql("SET SESSION wsrep_sync_wait = 1")
        .execute(&mut *conn)
        .await
        .unwrap();
    let versions: Vec<(i64, i64)> = sqlx::query_as("SELECT id, version FROM versions ORDER BY id")
        .fetch_all(&mut *conn)
        .await
        .unwrap();
    drop(conn);
    let received = received.lock().unwrap().clone();
    let rolled_back = rolled_back.lock().unwrap().clone();
    let mut rows = 0;
    for (key, last) in versions {
        let name = format!("k{key}");
        let stored = clients[1]
            .event_list("galera.bumped", &name, 0, 10_000)
            .await
            .unwrap();
        rows += stored.len();
        assert!(
            stored
                .iter()
                .all(|e| e.state == taskq::outbox::EventState::Delivered),
            "key {name}: every event delivered"
        );
        assert_eq!(
            stored.iter().map(|e| e.seq).collect::<Vec<_>>(),
            (1..=last as u64).collect::<Vec<_>>(),
            "key {name}: one event per committed version"
        );
        let ids: HashMap<&str, u64> = stored
            .iter()
            .map(|e| (e.message_id.as_str(), e.seq))
            .collect();
        let mut seen = HashSet::new();
        let mut order = Vec::new();
        for (k, id, e) in received.iter().filter(|r| r.0 == name) {
            assert_eq!(k, &format!("k{}", e.key));
            assert!(
                !rolled_back.contains(&e.attempt),
                "key {name}: an event of a rolled-back attempt was relayed: {e:?}"
            );
            let seq = *ids
                .get(id.as_str())
                .unwrap_or_else(|| panic!("key {name}: relayed id {id} is no row's"));
            assert_eq!(
                seq, e.version as u64,
                "key {name}: seq {seq} carries version"
            );
            if seen.insert(id.clone()) {
                order.push(e.version);
            }
        }
        assert_eq!(
            order,
            (1..=last).collect::<Vec<_>>(),
            "key {name}: delivered in commit (version) order, without a gap"
        );
    }
    assert_eq!(rows as u64, committed, "every committed event is a row");
    let duplicates = received.len() - rows;
    eprintln!(
        "outbox relays: {committed} events of {KEYS} keys committed on 3 nodes, {aborted} \
         transactions rolled back on purpose, {retries} retried after a conflict (1213); \
         3 relays: {rounds} rounds with keys, {failed} failed rounds ({relay_conflicts} \
         conflicts absorbed), {lost} leases lost; sink handed {} messages, {duplicates} \
         repeats of delivered ids",
        received.len()
    );
}

/// Publishes `plan`'s events (one per entry: the key's version bumped, then an event with the
/// new version) in one transaction on `pool`; commits it, or rolls it back when `!commit`.
async fn bump_tx(
    pool: &sqlx::MySqlPool,
    plan: &[i64],
    attempt: u64,
    commit: bool,
) -> taskq::Result<()> {
    use taskq::outbox::Event;
    let mut tx = pool.begin().await?;
    for &key in plan {
        sqlx::query("UPDATE versions SET version = version + 1 WHERE id = ?")
            .bind(key)
            .execute(&mut *tx)
            .await?;
        let version: i64 = sqlx::query_scalar("SELECT version FROM versions WHERE id = ?")
            .bind(key)
            .fetch_one(&mut *tx)
            .await?;
        Bumped {
            key,
            version,
            attempt,
        }
        .publish_tx(&mut tx)
        .await?;
    }
    if commit {
        tx.commit().await?;
    } else {
        tx.rollback().await?;
    }
    Ok(())
}
