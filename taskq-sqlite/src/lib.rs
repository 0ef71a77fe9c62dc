//! taskq's SQLite backend: the schema and every SQL statement (used by taskq's `sqlite`
//! feature).
#![doc = include_str!("../README.md")]

pub mod clock;
pub mod connect;
pub mod driver;
pub mod enqueue;
pub mod history;
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
pub use history::{
    AuditListRow, AuditRow, audit_insert, audit_list, audit_prune, task_attempts,
    task_failed_attempts_per_minute,
};
pub use identities::unique_prune_expired;
pub use lease::{
    CanceledTask, ClaimBatch, ClaimRequest, Claimed, ExpiredTask, FollowUpRow, HeldLease,
    LapsedRow, LimitHit, ReapRow, Reaped, ReapedRow, WriteBack, WrittenBack, task_claim,
    task_epochs, task_heartbeat, task_lapsed, task_leases_held, task_reap, task_reap_expired,
    task_release, task_running_since, task_write_back,
};
pub use migrate::{migrate, migrator};
pub use queues::{
    QueueControl, QueueRow, queue_controls, queue_list, queue_pause, queue_resume, queue_set_limit,
    queue_set_rate_limit, queues_paused,
};
pub use schedules::{
    ScheduleDecl, ScheduleFire, ScheduleRow, ScheduleState, schedule_declare, schedule_delete,
    schedule_fire, schedule_list, schedule_states,
};
pub use tasks::{
    PendingNameCount, QueueStateCount, RetryDead, TaskFilter, TaskRow, task_bulk_count,
    task_bulk_ids, task_cancel, task_cancel_batch, task_count, task_dead_unique_ids, task_delete,
    task_finished_per_minute, task_get, task_id_bounds, task_list, task_list_desc,
    task_list_pending, task_list_queue_asc, task_list_queue_desc, task_pending_by_name, task_prune,
    task_prune_count, task_request_cancel, task_request_cancel_batch, task_reschedule,
    task_retry_dead, task_retry_dead_batch, task_retry_dead_ids, task_run_times, task_set_priority,
    task_state, task_stats, task_stats_active, task_stats_terminal,
};
pub use workers::{
    WorkerListRow, WorkerRow, worker_list, worker_prune, worker_seen, worker_start, worker_stop,
};
