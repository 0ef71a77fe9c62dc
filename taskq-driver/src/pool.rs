//! How a pool of a worker is set up: what the runtime asks of a driver's worker pools.

/// How a pool of the worker is set up (see taskq's `worker::lanes`).
#[derive(Debug, Clone, Copy)]
pub struct WorkerPool {
    /// Most connections.
    pub connections: u32,
    /// Deadline of every worker statement (half the lease); also bounds server-side lock waits.
    pub statement_timeout: std::time::Duration,
    /// How long the server keeps a silent session (MySQL).
    pub session_timeout: std::time::Duration,
    /// Idle connections are not handed out, and are closed, past this (MySQL).
    pub idle_limit: std::time::Duration,
}
