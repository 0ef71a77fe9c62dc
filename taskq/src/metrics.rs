//! Metrics through the [`metrics`] facade: install any recorder (e.g.
//! `metrics-exporter-prometheus`) and these appear; without one they cost next to nothing.
//!
//! Labels are only `queue`, `task` (the stable name), `outcome` and, for events, `topic` —
//! never task ids, event keys or payloads, so cardinality stays bounded.
//!
//! | name | kind | labels |
//! |---|---|---|
//! | `taskq_enqueued_total` | counter | queue, task |
//! | `taskq_claimed_total` | counter | queue |
//! | `taskq_completed_total` | counter | queue, task, outcome = succeeded / retried / dead |
//! | `taskq_snoozed_total` | counter | queue, task (snoozes written back; not in `taskq_completed_total`) |
//! | `taskq_expired_total` | counter | queue, task (due tasks found past their deadline: not run) |
//! | `taskq_canceled_total` | counter | — |
//! | `taskq_lost_leases_total` | counter | queue, task |
//! | `taskq_fenced_total` | counter | queue, task |
//! | `taskq_writeback_rejected_total` | counter | queue, task (outcomes the database rejected for their own row) |
//! | `taskq_panics_total` | counter | queue, task |
//! | `taskq_timeouts_total` | counter | queue, task |
//! | `taskq_reaped_total` | counter | — |
//! | `taskq_follow_ups_total` | counter | task (the task that ended), kind = on_dead / on_success |
//! | `taskq_follow_up_errors_total` | counter | task, kind (follow-ups that could not be built: the task ended without one) |
//! | `taskq_pruned_total` | counter | — |
//! | `taskq_handler_duration_seconds` | histogram | queue, task, outcome |
//! | `taskq_queue_wait_seconds` | histogram | queue, task (due time → claim, database clock) |
//! | `taskq_claim_duration_seconds` | histogram | queue |
//! | `taskq_claims_limited_total` | counter | queue (claims a queue's concurrency or rate limit cut short) |
//! | `taskq_in_flight` | gauge | queue |
//! | `taskq_backlog` | gauge | queue, state (only with `WorkerBuilder::backlog_metrics`) |
//! | `taskq_events_pending` | gauge | topic (events not delivered yet; only with `WorkerBuilder::event_metrics`) |
//! | `taskq_events_lag_seconds` | gauge | topic (age of the oldest pending event, database clock; 0 when none; same) |
//! | `taskq_events_held_keys` | gauge | topic (keys held back by a rejected event; same) |
//! | `taskq_relay_rounds_total` | counter | — (rounds a relay settled; see `outbox::RelayStats`) |
//! | `taskq_relay_events_total` | counter | outcome = published / delivered / failed / held / dead |
//! | `taskq_relay_leases_lost_total` | counter | — (key leases a relay found lost) |
//! | `taskq_relay_errors_total` | counter | — (relay rounds that failed on a database error) |

use std::time::Duration;

use metrics::{counter, gauge, histogram};

pub(crate) fn enqueued(queue: &str, task: &'static str) {
    counter!("taskq_enqueued_total", "queue" => queue.to_owned(), "task" => task).increment(1);
}

pub(crate) fn claimed(queue: &str, n: usize, took: Duration) {
    counter!("taskq_claimed_total", "queue" => queue.to_owned()).increment(n as u64);
    histogram!("taskq_claim_duration_seconds", "queue" => queue.to_owned())
        .record(took.as_secs_f64());
}

pub(crate) fn claim_limited(queue: &str) {
    counter!("taskq_claims_limited_total", "queue" => queue.to_owned()).increment(1);
}

pub(crate) fn completed(queue: &str, task: &str, outcome: &'static str) {
    counter!("taskq_completed_total", "queue" => queue.to_owned(), "task" => task.to_owned(), "outcome" => outcome)
        .increment(1);
}

pub(crate) fn snoozed(queue: &str, task: &str) {
    counter!("taskq_snoozed_total", "queue" => queue.to_owned(), "task" => task.to_owned())
        .increment(1);
}

pub(crate) fn expired(queue: &str, task: &str) {
    counter!("taskq_expired_total", "queue" => queue.to_owned(), "task" => task.to_owned())
        .increment(1);
}

pub(crate) fn canceled() {
    canceled_n(1);
}

pub(crate) fn canceled_n(n: u64) {
    counter!("taskq_canceled_total").increment(n);
}

pub(crate) fn lost_lease(queue: &str, task: &str) {
    counter!("taskq_lost_leases_total", "queue" => queue.to_owned(), "task" => task.to_owned())
        .increment(1);
}

pub(crate) fn writeback_rejected(queue: &str, task: &str) {
    counter!("taskq_writeback_rejected_total", "queue" => queue.to_owned(), "task" => task.to_owned())
        .increment(1);
}

pub(crate) fn fenced(queue: &str, task: &str) {
    counter!("taskq_fenced_total", "queue" => queue.to_owned(), "task" => task.to_owned())
        .increment(1);
}

pub(crate) fn panicked(queue: &str, task: &str) {
    counter!("taskq_panics_total", "queue" => queue.to_owned(), "task" => task.to_owned())
        .increment(1);
}

pub(crate) fn timed_out(queue: &str, task: &str) {
    counter!("taskq_timeouts_total", "queue" => queue.to_owned(), "task" => task.to_owned())
        .increment(1);
}

pub(crate) fn reaped(n: u64) {
    counter!("taskq_reaped_total").increment(n);
}

pub(crate) fn follow_up(task: &str, kind: &'static str) {
    counter!("taskq_follow_ups_total", "task" => task.to_owned(), "kind" => kind).increment(1);
}

pub(crate) fn follow_up_error(task: &str, kind: &'static str) {
    counter!("taskq_follow_up_errors_total", "task" => task.to_owned(), "kind" => kind)
        .increment(1);
}

pub(crate) fn relay_round(published: u64, delivered: u64) {
    counter!("taskq_relay_rounds_total").increment(1);
    relay_events("published", published);
    relay_events("delivered", delivered);
}

pub(crate) fn relay_events(outcome: &'static str, n: u64) {
    counter!("taskq_relay_events_total", "outcome" => outcome).increment(n);
}

pub(crate) fn relay_leases_lost(n: u64) {
    counter!("taskq_relay_leases_lost_total").increment(n);
}

pub(crate) fn relay_error() {
    counter!("taskq_relay_errors_total").increment(1);
}

pub(crate) fn pruned(n: u64) {
    counter!("taskq_pruned_total").increment(n);
}

pub(crate) fn handler_finished(queue: &str, task: &str, outcome: &'static str, took: Duration) {
    histogram!("taskq_handler_duration_seconds", "queue" => queue.to_owned(), "task" => task.to_owned(), "outcome" => outcome)
        .record(took.as_secs_f64());
}

pub(crate) fn queue_wait(queue: &str, task: &str, wait_us: i64) {
    histogram!("taskq_queue_wait_seconds", "queue" => queue.to_owned(), "task" => task.to_owned())
        .record(wait_us.max(0) as f64 / 1e6);
}

pub(crate) fn in_flight(queue: &str, delta: f64) {
    gauge!("taskq_in_flight", "queue" => queue.to_owned()).increment(delta);
}

pub(crate) fn backlog(queue: &str, state: &str, count: u64) {
    gauge!("taskq_backlog", "queue" => queue.to_owned(), "state" => state.to_owned())
        .set(count as f64);
}

pub(crate) fn event_topic(topic: &str, pending: u64, lag: Duration, held_keys: u64) {
    gauge!("taskq_events_pending", "topic" => topic.to_owned()).set(pending as f64);
    gauge!("taskq_events_lag_seconds", "topic" => topic.to_owned()).set(lag.as_secs_f64());
    gauge!("taskq_events_held_keys", "topic" => topic.to_owned()).set(held_keys as f64);
}
