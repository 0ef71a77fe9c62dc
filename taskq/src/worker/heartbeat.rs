//! Lease renewal: one statement per beat renews every lease this worker holds. A lease that
//! could not be renewed (epoch moved, lease expired) cancels its handler. A beat that fails
//! or does not answer within the statement deadline changes nothing: the watchdog
//! (`lease::watchdog`) cancels handlers whose lease was not confirmed in time.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use super::lease::{self, AttemptKey, Phase};
use super::{Shared, WorkerStats, within};
use crate::store;

pub(crate) async fn run(shared: Arc<Shared>) {
    let mut tick = tokio::time::interval(shared.cfg.heartbeat);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        beat(&shared).await;
    }
}

/// One heartbeat.
pub(crate) async fn beat(shared: &Shared) {
    let leases: Vec<(u64, u64)> = shared
        .inflight()
        .iter()
        .filter(|(_, f)| !f.lost)
        .map(|(k, _)| (k.id, k.epoch))
        .collect();
    if leases.is_empty() {
        return;
    }
    let sent = Instant::now();
    let json = store::leases_json(&leases);
    let lease_us = shared.lease_us();
    let renewed = match within!(shared, |c| shared.store.task_heartbeat(c, &json, lease_us)).await {
        Ok(n) => n,
        Err(e) => {
            WorkerStats::add(&shared.stats.db_errors, 1);
            tracing::warn!(error = %e, leases = leases.len(), "taskq: heartbeat failed");
            return;
        }
    };
    let held: HashSet<(u64, u64)> = if renewed as usize == leases.len() {
        leases.iter().copied().collect()
    } else {
        match within!(shared, |c| shared.store.task_leases_held(c, &json)).await {
            Ok(held) => held.into_iter().collect(),
            Err(e) => {
                WorkerStats::add(&shared.stats.db_errors, 1);
                tracing::warn!(error = %e, "taskq: heartbeat check failed");
                return;
            }
        }
    };
    let mut inflight = shared.inflight();
    for (id, epoch) in leases {
        let key = AttemptKey { id, epoch };
        let Some(f) = inflight.get_mut(&key) else {
            continue;
        };
        if held.contains(&(id, epoch)) {
            f.renewed_at = sent;
        } else if f.phase != Phase::Acking && !f.lost {
            // (An Acking task's outcome may simply have been written meanwhile; the write-back
            // itself reports it if it was fenced.)
            lease::mark_lost(shared, key, f, "heartbeat found the lease gone");
        }
    }
}
