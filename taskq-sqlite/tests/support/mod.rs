//! Shared by the test binaries: a fresh database file per test, and task builders.
#![allow(dead_code)]

use std::path::PathBuf;

pub use taskq_drivertest::fixtures::task;

/// A path for a fresh database file named after the test (old files removed).
pub fn db_path(test: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("taskq-sqlite-tests");
    taskq_drivertest::fixtures::fresh_file(&dir, test)
}
