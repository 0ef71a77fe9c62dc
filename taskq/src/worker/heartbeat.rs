//! Lease renewal: one statement per beat renews every lease this worker holds. A lease that
//! could not be renewed (epoch moved, lease expired) cancels its handler.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use super::{Shared, WorkerStats};
use crate::context::CancelReason;
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
        .map(|(id, f)| (*id, f.epoch))
        .collect();
    if leases.is_empty() {
        return;
    }
    let sent = Instant::now();
    let json = store::leases_json(&leases);
    let renewed = match shared.store.task_heartbeat(&json, shared.lease_us()).await {
        Ok(n) => n,
        Err(e) => {
            WorkerStats::add(&shared.stats.db_errors, 1);
            tracing::warn!(error = %e, leases = leases.len(), "taskq: heartbeat failed");
            expire_locally(shared);
            return;
        }
    };
    let held: HashSet<u64> = if renewed as usize == leases.len() {
        leases.iter().map(|l| l.0).collect()
    } else {
        match shared.store.task_leases_held(&json).await {
            Ok(ids) => ids.into_iter().collect(),
            Err(e) => {
                WorkerStats::add(&shared.stats.db_errors, 1);
                tracing::warn!(error = %e, "taskq: heartbeat check failed");
                expire_locally(shared);
                return;
            }
        }
    };
    let mut inflight = shared.inflight();
    for (id, epoch) in leases {
        let Some(f) = inflight.get_mut(&id) else {
            continue;
        };
        if f.epoch != epoch {
            continue;
        }
        if held.contains(&id) {
            f.renewed_at = sent;
        } else if f.phase != super::Phase::Acking {
            // (An Acking task's outcome may simply have been written meanwhile; the write-back
            // itself reports it if it was fenced.)
            mark_lost(shared, id, f);
        }
    }
}

/// Without a database answer, a lease whose last renewal is older than the lease length has
/// certainly expired on the database clock: treat it as lost.
fn expire_locally(shared: &Shared) {
    let now = Instant::now();
    let mut inflight = shared.inflight();
    for (id, f) in inflight.iter_mut() {
        if !f.lost
            && f.phase != super::Phase::Acking
            && now.duration_since(f.renewed_at) >= shared.cfg.lease
        {
            mark_lost(shared, *id, f);
        }
    }
}

fn mark_lost(shared: &Shared, id: u64, f: &mut super::InFlight) {
    f.lost = true;
    f.cancel.cancel(CancelReason::LeaseLost);
    WorkerStats::add(&shared.stats.lost_leases, 1);
    crate::metrics::lost_lease(&f.queue, &f.name);
    tracing::warn!(
        task_id = id,
        lease_epoch = f.epoch,
        "taskq: lease lost; handler canceled"
    );
}
