//! taskq's migrations coexist with the application's own sqlx migrations on one database, and
//! upgrade a database that already holds tasks.

use std::time::Duration;

use sqlx::migrate::Migrator;
use taskq_tests::backends::{Db, TestBackend};
use taskq_tests::{TestDb, wait_until};

static APP_V1: Migrator = sqlx::migrate!("app_migrations/v1");
static APP_V2: Migrator = sqlx::migrate!("app_migrations/v2");

async fn versions<B: TestBackend>(db: &Db<B>, table: &str) -> Vec<i64> {
    db.ints(&format!("SELECT version FROM {table} ORDER BY version"))
        .await
}

async fn taskq_then_app_then_both_again_with_a_later_app_migration<B: TestBackend>(db: Db<B>) {
    taskq::migrate(&db.pool).await.unwrap();
    db.run_migrator(&APP_V1, None).await.unwrap();
    taskq::migrate(&db.pool).await.unwrap();
    db.run_migrator(&APP_V1, None).await.unwrap();
    // The application ships a new migration later.
    db.run_migrator(&APP_V2, None).await.unwrap();
    taskq::migrate(&db.pool).await.unwrap();
    db.run_migrator(&APP_V2, None).await.unwrap();
    let mut expected = vec![
        "_sqlx_migrations",
        "_taskq_migrations",
        "app_orders",
        "app_users",
        "taskq_audit",
        "taskq_batch_members",
        "taskq_batches",
        "taskq_event_keys",
        "taskq_events",
        "taskq_inbox",
        "taskq_migration_lock",
        "taskq_order_keys",
        "taskq_queues",
        "taskq_schedules",
        "taskq_tasks",
        "taskq_unique",
        "taskq_workers",
        "taskq_workflow_deps",
        "taskq_workflow_steps",
        "taskq_workflows",
    ];
    if db.label() == "sqlite" {
        // SQLite serializes migrations with its write lock (BEGIN IMMEDIATE): no lock table.
        expected.retain(|t| *t != "taskq_migration_lock");
    }
    assert_eq!(db.tables().await, expected);
    assert_eq!(
        versions(&db, "_sqlx_migrations").await,
        [20250101000000, 20250201000000]
    );
    let taskq_versions: Vec<i64> = B::taskq_migrator().iter().map(|m| m.version).collect();
    assert_eq!(versions(&db, "_taskq_migrations").await, taskq_versions);
}

async fn app_first_then_taskq<B: TestBackend>(db: Db<B>) {
    db.run_migrator(&APP_V1, None).await.unwrap();
    db.run_migrator(&B::taskq_migrator(), None).await.unwrap();
    db.run_migrator(&APP_V2, None).await.unwrap();
    taskq::migrate(&db.pool).await.unwrap();
    assert!(db.tables().await.contains(&"taskq_tasks".to_owned()));
    assert_eq!(versions(&db, "_sqlx_migrations").await.len(), 2);
}

async fn concurrent_migrations_from_several_processes_serialize<B: TestBackend>(db: Db<B>) {
    let mut handles = Vec::new();
    for i in 0..4 {
        let pool = db.another_pool(2).await;
        // Several processes run taskq's migrations at once, and the application's once
        // alongside (sqlx's own lock does not serialize on MariaDB, so only one app migrator).
        handles.push(tokio::spawn(async move {
            if i < 3 {
                taskq::migrate(&pool).await.map_err(|e| e.to_string())
            } else {
                B::run_migrator(&APP_V2, &pool, None)
                    .await
                    .map_err(|e| e.to_string())
            }
        }));
    }
    for h in handles {
        h.await.unwrap().unwrap();
    }
    assert_eq!(versions(&db, "_sqlx_migrations").await.len(), 2);
    assert_eq!(
        versions(&db, "_taskq_migrations").await.len(),
        B::taskq_migrator().iter().count()
    );
}

async fn a_modified_applied_migration_is_detected<B: TestBackend>(db: Db<B>) {
    db.exec("UPDATE _taskq_migrations SET checksum = x'00'")
        .await;
    let e = taskq::migrate(&db.pool).await.unwrap_err();
    assert!(matches!(e, taskq::Error::Migrate(_)), "{e}");
    assert!(e.to_string().contains("modified"), "{e}");
}

async fn a_dirty_migration_is_detected<B: TestBackend>(db: Db<B>) {
    db.exec("UPDATE _taskq_migrations SET success = FALSE")
        .await;
    let e = taskq::migrate(&db.pool).await.unwrap_err();
    assert!(e.to_string().contains("partially applied"), "{e}");
}

/// Columns of `ix_taskq_claim`, in key order.
async fn claim_index_columns(db: &Db<sqlx::MySql>) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT CAST(column_name AS CHAR) FROM information_schema.statistics
         WHERE table_schema = DATABASE() AND table_name = 'taskq_tasks'
           AND index_name = 'ix_taskq_claim'
         ORDER BY seq_in_index",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap()
}

// MySQL only: SQLite's schema starts at version 9 (it has no migrations 1 to 8).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migration_4_adds_name_to_the_claim_index_of_a_database_with_tasks() {
    let Some(db) = TestDb::empty_or_skip().await else {
        return;
    };
    let db = Db::from_test_db(db);
    let all: Vec<i64> = taskq::migrate::migrator()
        .iter()
        .map(|m| m.version)
        .collect();
    // A database at schema v3 that already holds tasks.
    taskq::migrate::migrator()
        .run_to(all[2], &db.pool)
        .await
        .unwrap();
    assert_eq!(
        claim_index_columns(&db).await,
        ["state", "queue", "priority", "run_at", "id"]
    );
    for name in ["known", "nobody_handles_this", "known"] {
        sqlx::query(
            "INSERT INTO taskq_tasks (queue, name, payload, state, max_attempts, run_at, created_at, updated_at)
             VALUES ('default', ?, '{}', 'pending', 5, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))",
        )
        .bind(name)
        .execute(&db.pool)
        .await
        .unwrap();
    }
    taskq::migrate(&db.pool).await.unwrap();
    assert_eq!(versions(&db, "_taskq_migrations").await, all);
    assert_eq!(
        claim_index_columns(&db).await,
        ["state", "queue", "priority", "run_at", "id", "name"]
    );
    assert_eq!(db.count("state = 'pending'").await, 3);
    // The claim's candidate read is now answered from the index alone.
    let plan: Vec<(Option<String>, Option<String>)> = sqlx::raw_sql(
        "EXPLAIN SELECT id, priority, run_at FROM taskq_tasks
         WHERE state = 'pending' AND queue = 'default' AND run_at <= UTC_TIMESTAMP(6)
           AND JSON_CONTAINS('[\"known\"]', JSON_QUOTE(name))
         ORDER BY priority, run_at, id LIMIT 32",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap()
    .iter()
    .map(|r| {
        use sqlx::Row;
        (r.get("key"), r.get("Extra"))
    })
    .collect();
    assert_eq!(plan.len(), 1, "{plan:?}");
    assert_eq!(plan[0].0.as_deref(), Some("ix_taskq_claim"), "{plan:?}");
    let extra = plan[0].1.clone().unwrap_or_default();
    assert!(extra.contains("Using index"), "{plan:?}");
    assert!(!extra.contains("filesort"), "{plan:?}");
}

/// A pool that connects only when used, giving up after one second.
fn lazy_pool(options: sqlx::mysql::MySqlConnectOptions) -> sqlx::MySqlPool {
    sqlx::mysql::MySqlPoolOptions::new()
        .acquire_timeout(std::time::Duration::from_secs(1))
        .connect_lazy_with(options)
}

fn server_options() -> sqlx::mysql::MySqlConnectOptions {
    taskq_tests::server_url().parse().unwrap()
}

// MySQL only: connecting to a server (a SQLite file has no port, user or database name).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_against_a_closed_port_says_what_to_do() {
    if !taskq_tests::loopback_or_skip() {
        return;
    }
    let pool = lazy_pool("mysql://root@127.0.0.1:1/x".parse().unwrap());
    let e = taskq::migrate(&pool).await.unwrap_err();
    let sentence = "cannot connect to the database at 127.0.0.1:1 (connection refused): is the \
                    server running, and are the host and port in the database URL right?";
    assert_eq!(e.to_string(), sentence);
    // What `main` prints for `Err(e)` returned through `?`: the sentence, then sqlx's error.
    let debug = format!("{e:?}");
    assert!(
        debug.starts_with(&format!(
            "{sentence}\n\nCaused by:\n    error communicating with database: "
        )),
        "{debug}"
    );
    assert!(debug.contains("Connection refused"), "{debug}");
    assert!(!debug.contains("Os {"), "{debug}");
    match &e {
        taskq::Error::Connect { target, source } => {
            assert_eq!(target, "127.0.0.1:1");
            assert!(matches!(source, sqlx::Error::Io(_)), "{source:?}");
        }
        other => panic!("expected Error::Connect, got {other:#?}"),
    }
    let source = std::error::Error::source(&e).expect("the sqlx error is the source");
    assert!(source.downcast_ref::<sqlx::Error>().is_some());
}

// MySQL only: the server's refusals (unknown database, login).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_names_an_unknown_database_and_a_refused_login() {
    // Needs the server (to refuse the database and the login), not a `TestDb`.
    if !taskq_tests::mysql_or_skip() {
        return;
    }
    let opts = server_options();
    let target = format!("{}:{}", opts.get_host(), opts.get_port());

    let pool = lazy_pool(opts.clone().database("taskq_no_such_database"));
    let e = taskq::migrate(&pool).await.unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "cannot connect to the database at {target} (1049 (42000): Unknown database \
             'taskq_no_such_database'): create it (CREATE DATABASE), or fix the database name \
             at the end of the URL"
        )
    );
    assert!(matches!(e, taskq::Error::Connect { .. }), "{e:#?}");
    assert_eq!(format!("{e:?}"), e.to_string());

    let pool = lazy_pool(
        opts.username("taskq_no_such_user")
            .password("wrong")
            .database("x"),
    );
    let e = taskq::migrate(&pool).await.unwrap_err();
    let text = e.to_string();
    assert!(
        text.starts_with(&format!(
            "cannot connect to the database at {target} (1045 (28000): Access denied for user \
             'taskq_no_such_user'@"
        )),
        "{text}"
    );
    assert!(
        text.ends_with("): check the user name and password in the database URL"),
        "{text}"
    );
    // Debug adds nothing: sqlx's error would only repeat the text.
    assert_eq!(format!("{e:?}"), text);
}

// MySQL only: SQLite's schema starts at version 9 (it has no migrations 1 to 8).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migration_5_adds_unique_tasks_to_a_database_with_tasks() {
    let Some(db) = TestDb::empty_or_skip().await else {
        return;
    };
    let db = Db::from_test_db(db);
    let all: Vec<i64> = taskq::migrate::migrator()
        .iter()
        .map(|m| m.version)
        .collect();
    // A database at schema v4 that already holds tasks, one of them running.
    taskq::migrate::migrator()
        .run_to(all[3], &db.pool)
        .await
        .unwrap();
    for state in ["pending", "running", "succeeded"] {
        sqlx::query(
            "INSERT INTO taskq_tasks (queue, name, payload, state, max_attempts, run_at, created_at, updated_at)
             VALUES ('default', 'old', '{}', ?, 5, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))",
        )
        .bind(state)
        .execute(&db.pool)
        .await
        .unwrap();
    }
    taskq::migrate(&db.pool).await.unwrap();
    assert_eq!(versions(&db, "_taskq_migrations").await, all);
    assert!(db.tables().await.contains(&"taskq_unique".to_owned()));
    // Existing tasks are not unique and hold nothing.
    assert_eq!(
        db.count("unique_key IS NULL AND unique_while IS NULL")
            .await,
        3
    );
    let held: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM taskq_unique")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(held, 0);
}

/// `taskq::create_database` and `taskq::connect`: the newcomer's path, with errors that say
/// what to check.
// MySQL only: taskq::connect and taskq::create_database take MySQL URLs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_and_create_database_explain_what_failed() {
    let Some(db) = TestDb::new_or_skip().await else {
        return;
    };
    let name = format!("{}_made", db.name);
    let url = format!("{}/{name}", taskq_tests::server_url().trim_end_matches('/'));

    assert!(taskq::create_database(&url).await.unwrap(), "created");
    assert!(
        !taskq::create_database(&url).await.unwrap(),
        "already there"
    );
    let pool = taskq::connect(&url).await.unwrap();
    let current: String = sqlx::query_scalar("SELECT CAST(DATABASE() AS CHAR)")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(current, name);
    taskq::migrate(&pool).await.unwrap();
    pool.close().await;
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP DATABASE `{name}`")))
        .execute(&db.pool)
        .await
        .unwrap();

    // No server on the port: a sentence naming it and what to check.
    let e = taskq::connect("mysql://root@127.0.0.1:1/x")
        .await
        .unwrap_err();
    assert!(matches!(e, taskq::Error::Connect { .. }), "{e:?}");
    let text = e.to_string();
    assert!(
        text.contains("127.0.0.1:1")
            && text.contains("connection refused")
            && text.contains("is the server running"),
        "{text}"
    );
    let e = taskq::create_database("mysql://root@127.0.0.1:1/x")
        .await
        .unwrap_err();
    assert!(matches!(e, taskq::Error::Connect { .. }), "{e:?}");

    // A database that does not exist: say how to create it.
    let missing = format!(
        "{}/{}_missing",
        taskq_tests::server_url().trim_end_matches('/'),
        db.name
    );
    let e = taskq::connect(&missing).await.unwrap_err();
    assert!(e.to_string().contains("CREATE DATABASE"), "{e}");

    // Not a MySQL URL: a typed error, with the password hidden.
    let e = taskq::connect("postgres://me:hunter2@localhost/db")
        .await
        .unwrap_err();
    assert!(matches!(e, taskq::Error::Config(_)), "{e:?}");
    assert!(!e.to_string().contains("hunter2"), "{e}");
}

/// A task enqueued before migration 31.
#[taskq::task]
async fn before_outputs(n: u32) -> Result<(), taskq::TaskError> {
    let _ = n;
    Ok(())
}

/// Migration 31 on a database that holds tasks: `taskq_tasks.output` is a nullable text column
/// at the end of the table (MySQL: `MEDIUMTEXT`, added in place), `NULL` in the rows before it.
async fn migration_31_adds_the_output_column_to_a_database_with_tasks<B: TestBackend>(db: Db<B>) {
    let before: Vec<i64> = B::taskq_migrator()
        .iter()
        .map(|m| m.version)
        .filter(|v| *v < 20261204000031)
        .collect();
    db.run_migrator(&B::taskq_migrator(), before.last().copied())
        .await
        .unwrap();
    let old = taskq::Task::enqueue(BeforeOutputs { n: 1 }, &db.pool)
        .await
        .unwrap();
    taskq::migrate(&db.pool).await.unwrap();
    let column = if db.label() == "sqlite" {
        db.rows(
            &[
                "type",
                "CASE WHEN \"notnull\" = 0 THEN 'YES' ELSE 'NO' END",
                "cid = (SELECT MAX(cid) FROM pragma_table_info('taskq_tasks'))",
            ],
            "FROM pragma_table_info('taskq_tasks') WHERE name = 'output'",
        )
        .await
    } else {
        db.rows(
            &[
                "COLUMN_TYPE",
                "IS_NULLABLE",
                "ORDINAL_POSITION = (SELECT MAX(ORDINAL_POSITION) FROM information_schema.columns \
                 WHERE table_schema = DATABASE() AND table_name = 'taskq_tasks')",
            ],
            "FROM information_schema.columns WHERE table_schema = DATABASE() \
             AND table_name = 'taskq_tasks' AND column_name = 'output'",
        )
        .await
    };
    let ty = if db.label() == "sqlite" {
        "TEXT"
    } else {
        "mediumtext"
    };
    assert_eq!(column, [[ty, "YES", "1"]], "{}", db.label());
    assert_eq!(
        db.ints(&format!(
            "SELECT COUNT(*) FROM taskq_tasks WHERE id = {} AND output IS NULL",
            old.id.0
        ))
        .await,
        [1]
    );
}

taskq_tests::conformance!(
    empty: taskq_then_app_then_both_again_with_a_later_app_migration,
    app_first_then_taskq,
    concurrent_migrations_from_several_processes_serialize,
);

taskq_tests::conformance!(empty: migration_31_adds_the_output_column_to_a_database_with_tasks);

taskq_tests::conformance!(
    a_modified_applied_migration_is_detected,
    a_dirty_migration_is_detected,
);

// MySQL only: SQLite runs every migration in one `BEGIN IMMEDIATE` transaction, whose write
// lock cannot be lost while its connection lives; here the lock is a row that expires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_migration_lock_stops_the_migration_before_the_next_one() {
    let Some(db) = TestDb::empty_or_skip().await else {
        return;
    };
    let db = Db::from_test_db(db);
    let all: Vec<i64> = taskq::migrate::migrator()
        .iter()
        .map(|m| m.version)
        .collect();
    // The migration that alters `taskq_queues` (v11), and at least one after it.
    let slow = all
        .iter()
        .position(|v| *v == 20261130000011)
        .expect("the queue limits migration");
    assert!(slow + 1 < all.len());
    taskq::migrate::migrator()
        .run_to(all[slow - 1], &db.pool)
        .await
        .unwrap();
    // An open transaction that read `taskq_queues` holds its metadata lock: the migration's
    // ALTER waits for it.
    let mut blocker = db.pool.begin().await.unwrap();
    sqlx::query("SELECT COUNT(*) FROM taskq_queues")
        .execute(&mut *blocker)
        .await
        .unwrap();
    let pool = db.pool.clone();
    let migrating = tokio::spawn(async move { taskq::migrate(&pool).await });
    wait_until(Duration::from_secs(10), "the ALTER waits", || async {
        db.scalar(
            "SELECT COUNT(*) FROM information_schema.processlist
             WHERE db = DATABASE() AND state LIKE 'Waiting for table metadata lock%'",
        )
        .await
            == 1
    })
    .await;
    // Meanwhile the lock row is taken over, as by another migrator after it expired (say on
    // another Galera node, while this one's renewals did not get through).
    assert_eq!(
        db.exec("UPDATE taskq_migration_lock SET holder = 'another migrator'")
            .await,
        1
    );
    blocker.commit().await.unwrap();
    let e = tokio::time::timeout(Duration::from_secs(30), migrating)
        .await
        .expect("migrate returns")
        .unwrap()
        .unwrap_err();
    match &e {
        taskq::Error::MigrationLockLost { version, reason } => {
            assert_eq!(*version, all[slow + 1], "{e}");
            assert!(reason.contains("another migrator took it"), "{e}");
        }
        other => panic!("expected MigrationLockLost, got {other:#?}"),
    }
    assert!(e.to_string().contains("run taskq::migrate again"), "{e}");
    // The running migration completed; the next one did not start.
    assert_eq!(versions(&db, "_taskq_migrations").await, all[..=slow]);
    // The other migrator's lock is left alone.
    assert_eq!(
        db.strings("SELECT holder FROM taskq_migration_lock").await,
        ["another migrator"]
    );
}

/// A pool of one connection migrates an empty database: the migration lock's renewals do not
/// wait for a second connection of the caller's pool (they did, and `migrate` failed with a
/// pool timeout after 30 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_of_one_connection_migrates() {
    let Some(db) = TestDb::empty_or_skip().await else {
        return;
    };
    let one = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_secs(5))
        .connect_with(db.options.clone())
        .await
        .unwrap();
    let all: Vec<i64> = taskq::migrate::migrator()
        .iter()
        .map(|m| m.version)
        .collect();
    tokio::time::timeout(Duration::from_secs(60), taskq::migrate(&one))
        .await
        .expect("migrate returns")
        .unwrap();
    let db = Db::from_test_db(db);
    assert_eq!(versions(&db, "_taskq_migrations").await, all);
    // And again, with nothing to do.
    taskq::migrate(&one).await.unwrap();
}
