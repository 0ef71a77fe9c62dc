//! Migrations run by several processes at once on a new file (each a child process running
//! this test binary's `child_migrate`).

use super::db_path;
use crate::{migrate, migrator, open};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const CHILD_ENV: &str = "TASKQ_SQLITE_TEST_MIGRATE_DB";

/// In a child process (spawned by the test below): migrates the database named by the
/// environment once every sibling is ready. Without the variable it does nothing.
#[tokio::test]
async fn child_migrate() {
    let Ok(path) = std::env::var(CHILD_ENV) else {
        return;
    };
    let go = format!("{path}.go");
    while !Path::new(&go).exists() {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let pool = open(&path, 2).await.unwrap();
    migrate(&pool).await.unwrap();
    println!("\nMIGRATED");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_from_several_processes_at_once_on_a_new_file() {
    let path = db_path("migrate_processes");
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..6)
        .map(|_| {
            Command::new(&exe)
                .args([
                    "--exact",
                    "tests::migrations::child_migrate",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(CHILD_ENV, &path)
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    std::fs::write(format!("{}.go", path.display()), b"").unwrap();
    for child in children {
        let out = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap())
            .await
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "child failed: {stdout}");
        assert!(stdout.contains("MIGRATED"), "{stdout}");
    }
    let pool = open(&path, 1).await.unwrap();
    let mut c = pool.acquire().await.unwrap();
    let versions: Vec<i64> =
        sqlx::query_scalar("SELECT version FROM _taskq_migrations ORDER BY version")
            .fetch_all(&mut *c)
            .await
            .unwrap();
    let expected: Vec<i64> = migrator().iter().map(|m| m.version).collect();
    assert_eq!(versions, expected);
    let audit: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM taskq_audit")
        .fetch_one(&mut *c)
        .await
        .unwrap();
    assert_eq!(audit, 0);
    // And once more, on the migrated file: nothing to do.
    migrate(&pool).await.unwrap();
}
