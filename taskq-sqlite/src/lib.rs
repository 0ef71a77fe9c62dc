//! taskq's SQLite backend: the schema and every SQL statement (issue 12, step 1).
#![doc = include_str!("../README.md")]

pub mod clock;
pub mod connect;
pub mod enqueue;
pub mod identities;
pub mod lease;
pub mod migrate;
pub mod queues;
pub mod schedules;
pub mod tasks;
pub mod workers;

pub use clock::{db_clock_us, db_now, time_from_us, time_to_us};
pub use connect::{begin_immediate, connect_options, connect_options_from_url, open, tune};
pub use enqueue::{Inserted, NewTask, task_insert, task_insert_many};
pub use identities::unique_prune_expired;
pub use lease::{
    ClaimBatch, ClaimRequest, Claimed, ExpiredTask, Finish, HeldLease, Reaped, task_claim,
    task_epochs, task_finish, task_heartbeat, task_leases_held, task_reap_expired, task_release,
};
pub use migrate::{migrate, migrator};
pub use queues::{queue_pause, queue_resume, queues_paused};
pub use schedules::{
    ScheduleDecl, ScheduleFire, ScheduleRow, ScheduleState, schedule_declare, schedule_delete,
    schedule_fire, schedule_list, schedule_states,
};
pub use tasks::{
    PendingNameCount, QueueStateCount, RetryDead, TaskFilter, TaskRow, task_bulk_count,
    task_bulk_ids, task_cancel, task_cancel_batch, task_count, task_dead_unique_ids, task_get,
    task_list, task_pending_by_name, task_prune, task_request_cancel, task_request_cancel_batch,
    task_reschedule, task_retry_dead, task_retry_dead_batch, task_retry_dead_ids,
    task_set_priority, task_state, task_stats,
};
pub use workers::{
    WorkerListRow, WorkerRow, worker_list, worker_prune, worker_seen, worker_start, worker_stop,
};
