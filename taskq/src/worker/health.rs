//! The readiness / liveness probe of a running worker ([`WorkerHealth`]).
//!
//! Every worker statement runs through `within!` (see `deadline`), which records the time of
//! each one that succeeded: that is the "last database round trip". An idle worker still
//! talks to the database at least once per heartbeat interval (its presence beat in
//! `taskq_workers`), and more often through its claim polls, so a recent round trip means the
//! database answers this worker now.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use serde::Serialize;

/// Where a worker is in its life, as seen by [`WorkerHealth`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkerPhase {
    /// Built, [`Worker::run`](crate::Worker::run) not called yet.
    Created,
    /// Its loops run: it claims and runs tasks.
    Running,
    /// Shutting down: no new claims, handlers in flight finishing.
    Stopping,
    /// `run` returned.
    Stopped,
}

impl WorkerPhase {
    fn from_u8(v: u8) -> Self {
        match v {
            0 => WorkerPhase::Created,
            1 => WorkerPhase::Running,
            2 => WorkerPhase::Stopping,
            _ => WorkerPhase::Stopped,
        }
    }
}

#[derive(Debug)]
pub(crate) struct HealthInner {
    worker_id: String,
    /// Readiness needs a successful statement younger than this (the worker's lease).
    max_db_age: Duration,
    base: Instant,
    /// Microseconds after `base` of the last successful statement, plus 1 (0: none yet).
    last_db_ok: AtomicU64,
    phase: AtomicU8,
}

impl HealthInner {
    pub(crate) fn new(worker_id: String, max_db_age: Duration) -> Self {
        Self {
            worker_id,
            max_db_age,
            base: Instant::now(),
            last_db_ok: AtomicU64::new(0),
            phase: AtomicU8::new(0),
        }
    }

    /// Records a successful database round trip (called by `within!`).
    pub(crate) fn db_ok(&self) {
        let us = self.base.elapsed().as_micros() as u64 + 1;
        self.last_db_ok.fetch_max(us, Relaxed);
    }

    pub(crate) fn set_phase(&self, phase: WorkerPhase) {
        self.phase.store(phase as u8, Relaxed);
    }
}

/// Marks the worker stopped when `run` ends, however it ends (returned, or its future dropped).
pub(crate) struct StoppedOnDrop(pub Arc<HealthInner>);

impl Drop for StoppedOnDrop {
    fn drop(&mut self) {
        self.0.set_phase(WorkerPhase::Stopped);
    }
}

/// A cheap, clonable handle on a worker's health, for a readiness or liveness probe: obtain it
/// with [`Worker::health`](crate::Worker::health) before calling `run`, and keep it in the
/// service's state (see the `/healthz` route of `examples/axum-service`).
///
/// - **live** ([`is_live`](Self::is_live)): `run` was called and has not returned (its loops
///   run, or it is shutting down gracefully). A liveness probe that fails should restart the
///   process.
/// - **ready** ([`is_ready`](Self::is_ready)): running (not stopping) *and* the last
///   successful database round trip of any worker statement is younger than the worker's
///   lease. An idle worker still makes one every heartbeat interval, so an old one means the
///   database does not answer this worker (down, partitioned, pool exhausted): it can neither
///   claim nor keep its leases. A readiness probe that fails should take the instance out of
///   rotation; it becomes ready again by itself once statements succeed.
///
/// Reading it takes no lock and does no I/O.
#[derive(Debug, Clone)]
pub struct WorkerHealth {
    inner: Arc<HealthInner>,
}

/// A point-in-time reading of [`WorkerHealth`]; serializes to JSON with durations in
/// milliseconds (`last_db_ok_ms_ago`, `max_db_age_ms`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HealthStatus {
    /// The worker's id.
    pub worker_id: String,
    /// Where the worker is in its life.
    pub phase: WorkerPhase,
    /// `run` was called and has not returned.
    pub live: bool,
    /// Running, and the last successful database round trip is younger than `max_db_age`.
    pub ready: bool,
    /// Time since the last successful worker statement (`None`: none yet).
    #[serde(rename = "last_db_ok_ms_ago", serialize_with = "opt_ms")]
    pub last_db_ok_ago: Option<Duration>,
    /// The bound readiness applies to `last_db_ok_ago`: the worker's lease.
    #[serde(rename = "max_db_age_ms", serialize_with = "ms")]
    pub max_db_age: Duration,
}

fn ms<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(d.as_millis() as u64)
}

fn opt_ms<S: serde::Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => ms(d, s),
        None => s.serialize_none(),
    }
}

impl WorkerHealth {
    pub(crate) fn new(inner: Arc<HealthInner>) -> Self {
        Self { inner }
    }

    /// Reads the current health.
    pub fn status(&self) -> HealthStatus {
        let i = &self.inner;
        let phase = WorkerPhase::from_u8(i.phase.load(Relaxed));
        let last = i.last_db_ok.load(Relaxed);
        let last_db_ok_ago = (last > 0).then(|| {
            let at = i.base + Duration::from_micros(last - 1);
            Instant::now().saturating_duration_since(at)
        });
        let live = matches!(phase, WorkerPhase::Running | WorkerPhase::Stopping);
        let ready =
            phase == WorkerPhase::Running && last_db_ok_ago.is_some_and(|age| age < i.max_db_age);
        HealthStatus {
            worker_id: i.worker_id.clone(),
            phase,
            live,
            ready,
            last_db_ok_ago,
            max_db_age: i.max_db_age,
        }
    }

    /// Whether the worker is ready: see [`WorkerHealth`].
    pub fn is_ready(&self) -> bool {
        self.status().ready
    }

    /// Whether the worker is live: see [`WorkerHealth`].
    pub fn is_live(&self) -> bool {
        self.status().live
    }
}
