//! Shared by the test binaries: a fresh database file per test, and task builders.
#![allow(dead_code)]

use std::path::PathBuf;

use taskq_driver::rows::NewTask;

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

/// A task of `name` on `queue`, due now, three attempts.
pub fn task<'a>(queue: &'a str, name: &'a str) -> NewTask<'a> {
    NewTask {
        queue,
        name,
        payload: b"{}",
        priority: 0,
        max_attempts: 3,
        delay_us: 0,
        run_at: None,
        deadline: None,
        ttl_us: None,
        idempotency_key: None,
        trace_context: None,
        unique_key: None,
        unique_while: None,
        unique_expires_us: None,
    }
}
