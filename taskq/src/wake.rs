//! In-process wake-up: producers in this process tell local workers that a queue has work,
//! so they claim at once instead of waiting for the next poll; and this process's workers tell
//! waiters ([`Client::wait`](crate::Client::wait)) that some task ended.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::Notify;

fn registry() -> &'static Mutex<HashMap<String, Arc<Notify>>> {
    static REG: OnceLock<Mutex<HashMap<String, Arc<Notify>>>> = OnceLock::new();
    REG.get_or_init(Default::default)
}

/// The notifier local workers of `queue` wait on.
pub(crate) fn notifier(queue: &str) -> Arc<Notify> {
    let mut reg = registry().lock().unwrap_or_else(|e| e.into_inner());
    reg.entry(queue.to_owned()).or_default().clone()
}

/// Wakes this process's workers for `queue`. `enqueue(&pool)` calls it; after committing a
/// transaction that used `enqueue_tx`, call it yourself to skip the poll delay.
pub fn notify(queue: &str) {
    let reg = registry().lock().unwrap_or_else(|e| e.into_inner());
    if let Some(n) = reg.get(queue) {
        n.notify_waiters();
        n.notify_one();
    }
}

/// Wakes one of this process's claim loops waiting for `queue` (a task of it became claimable
/// that one claim can take: an ordered key's next task after its head ended).
pub(crate) fn nudge(queue: &str) {
    let reg = registry().lock().unwrap_or_else(|e| e.into_inner());
    if let Some(n) = reg.get(queue) {
        n.notify_one();
    }
}

fn ended_notify() -> &'static Notify {
    static ENDED: OnceLock<Notify> = OnceLock::new();
    ENDED.get_or_init(Notify::new)
}

/// Wakes every waiter of this process ([`Client::wait`](crate::Client::wait)): a worker of this
/// process wrote back outcomes (some task may have ended).
pub(crate) fn ended() {
    ended_notify().notify_waiters();
}

/// Resolves at this process's next [`ended`]; register it before reading the state it
/// waits on, so an end between the read and the wait is not missed.
pub(crate) fn ended_signal() -> tokio::sync::futures::Notified<'static> {
    ended_notify().notified()
}
