//! What the suite and the drivers' own tests build their cases from (taskq-sqlite's unit and
//! integration tests use these too, so a driver's tests and the suite insert the same tasks).

use std::path::{Path, PathBuf};

use taskq_driver::rows::NewTask;

/// A task of `name` on `queue`: payload `{}`, priority 0, three attempts, due now, nothing else.
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

/// A path in `dir` (created if missing) for a fresh database file named after `test`: the
/// file and its `-wal`, `-shm` and `.go` companions of an earlier run are removed.
pub fn fresh_file(dir: &Path, test: &str) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join(format!("{test}.db"));
    for suffix in ["", "-wal", "-shm", ".go"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    path
}
