//! The SQLite backend: the seam's operations over `taskq-sqlite`'s statements.

compile_error!(
    "taskq's `sqlite` feature is not usable yet: its backend lands in the next step of issue 12"
);
