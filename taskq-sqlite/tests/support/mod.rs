//! Shared by the test binaries: a fresh database file per test, and task builders.
#![allow(dead_code)]

use std::path::PathBuf;

use sqlx::SqlitePool;
use taskq_sqlite::NewTask;

/// A path for a fresh database file named after the test (old files removed).
pub fn db_path(test: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("taskq-sqlite-tests");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{test}.db"));
    for suffix in ["", "-wal", "-shm", ".go"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    path
}

/// A migrated pool on a fresh file.
pub async fn fresh(test: &str) -> SqlitePool {
    let pool = taskq_sqlite::open(db_path(test), 4).await.unwrap();
    taskq_sqlite::migrate(&pool).await.unwrap();
    pool
}

/// A task of `name` on `queue`, due now, three attempts.
pub fn task<'a>(queue: &'a str, name: &'a str) -> NewTask<'a> {
    NewTask {
        queue,
        name,
        payload: b"{}",
        max_attempts: 3,
        ..NewTask::default()
    }
}
