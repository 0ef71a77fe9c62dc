//! The driver seam: what taskq's runtime asks of a database, as typed operations grouped by
//! table or job, one trait each ([`Enqueue`], [`Tasks`], [`Actions`], [`Claims`], [`Leases`],
//! [`Identities`], [`Queues`], [`Schedules`], [`Workers`], [`History`], [`Events`],
//! [`Workflows`], [`Batches`], [`Clock`],
//! [`StatementBudget`]). A driver (`taskq-mysql`, `taskq-sqlite`) implements each in the file
//! that holds that table's SQL; [`Driver`] is all of them. [`Enqueue`] (the producer path and
//! audit entries) runs on the caller's own transaction, so its functions take no handle.
//!
//! Every operation is written once, in the
//! list of `taskq_driver::__seam_operations!`: the traits here are generated from it, and so
//! are their trait objects ([`crate::dynamic`]), through which taskq's runtime calls the pool's
//! driver (`taskq::backend`). A new
//! operation is one entry there and one implementation per driver.
//!
//! Operations named `(&self, ..)` run on the driver's pool; those taking `conn` run on a
//! connection the caller took (the worker's lanes and deadlines, the client's transactions).
//! Every time comes from the database clock; every write-back of a claimed task is
//! conditional on the lease epoch it was claimed with.
//!
//! Not semver-stable: taskq's own interface between its runtime and its drivers.

use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::budget::Budget;
use crate::class::ErrorClass;
use crate::event::*;
use crate::pool::WorkerPool;
use crate::read::{PendingNameCount, QueueStateCount, ScheduleInfo, TaskInfo};
use crate::rows::*;
use crate::state::{TaskId, TaskState};

/// A driver's pool handle: cheap to clone, shared by the worker's loops and the client; and
/// what the runtime asks of the pool itself (a transaction, the worker's pools, how to read an
/// error).
pub trait Handle: Clone + Send + Sync + 'static {
    /// The driver's connection type (`sqlx::MySqlConnection`, `sqlx::SqliteConnection`): the
    /// connection of its database, so that code generic over the driver can take one from
    /// [`pool`](Self::pool) (the driver test suite does).
    type Conn: Send + 'static + sqlx::Connection<Database = Self::Database>;
    /// The sqlx database of the driver's pool.
    type Database: sqlx::Database<Connection = Self::Conn>;
    /// The database's name, as logs and errors print it ("MySQL", "SQLite").
    const NAME: &'static str;
    /// A handle on `pool` (a user's pool: the client's, or the one a worker derives its own
    /// from).
    fn from_pool(pool: sqlx::Pool<Self::Database>) -> Self;
    /// The pool behind the handle.
    fn pool(&self) -> &sqlx::Pool<Self::Database>;
    /// A pool for the worker on the same database, set up as `spec` says (its size, the
    /// statement deadline, how long the server keeps a silent session...).
    fn worker_store(&self, spec: WorkerPool) -> Self;
    /// [`worker_store`](Self::worker_store) whose connections wait at most `busy` for the
    /// database's write lock, where there is one (SQLite: the busy timeout, never longer than
    /// the user's pool's). The worker opens its lanes this way: its lease renewals wait a short
    /// while and try again, its other statements no longer than their deadline. Without a
    /// write lock (the default): `worker_store(spec)`.
    fn worker_store_waiting(&self, spec: WorkerPool, busy: Duration) -> Self {
        let _ = busy;
        self.worker_store(spec)
    }
    /// Begins a transaction of the client (its actions with their audit entries); SQLite's
    /// takes the write lock at once.
    fn begin(
        &self,
    ) -> impl Future<Output = sqlx::Result<sqlx::Transaction<'static, Self::Database>>> + Send {
        self.pool().begin()
    }
    /// How long a statement may wait for the database's write lock, where there is one
    /// (SQLite's busy timeout, which bounds the worker's shortest lease); `None`: row locks.
    fn busy_timeout(&self) -> Option<Duration> {
        None
    }
    /// Whether the driver's claims see a queue's controls: a claim whose request did not know
    /// the queue as limited, of a queue that is paused or limited, claims nothing and says so
    /// ([`ClaimBatch::queue_controlled`]). The worker then reads `taskq_queues` only while one
    /// of its queues is paused or limited, instead of once per `poll_max`. Default: `false`
    /// (the worker reads the controls once per `poll_max`).
    fn claims_see_controls(&self) -> bool {
        false
    }
    /// Where the pool connects (`host:port` or a socket path), for errors that say the server
    /// could not be reached; `None` for a database in a file, which is never "unreachable".
    fn connect_target(&self) -> Option<String> {
        None
    }
    /// How the driver reads an error of its database (a conflict to retry at once, a
    /// statement refused for good).
    fn classify(e: &dyn sqlx::error::DatabaseError) -> ErrorClass;
}

/// The seam's operations, listed once. `__seam_operations!(callback)` calls `callback! { .. }`
/// with the list: first `enqueue Enqueue { .. }` (statements on the caller's connection: `fn
/// name(conn; arg: Type; ..) -> Output;`), then one `trait Name { .. }` per table or job
/// (`fn name(&self; ..)` runs on the handle's pool, `fn name(&self, conn; ..)` on a connection
/// the caller took). Every output is wrapped in `sqlx::Result`. Doc comments come along. Types
/// are named as this module imports them; a callback in another crate imports them too.
///
/// This module generates the traits from it, [`crate::dynamic`] their object-safe mirror
/// (implemented for every driver), and taskq the calls its runtime makes through that
/// (`taskq::backend`). An argument may be of any type. Not semver-stable.
#[doc(hidden)]
#[macro_export]
macro_rules! __seam_operations {
    ($callback:path) => {
        $callback! {
            /// The producer path, audit entries and the inbox: statements on the caller's own
            /// connection (its transaction), so they take no handle.
            enqueue Enqueue {
                /// Inserts one task (with its idempotency key or unique identity, if any).
                fn task_insert(conn; row: &NewTask<'_>) -> Inserted;
                /// Inserts tasks without idempotency key or unique identity, in as few
                /// statements as the driver can; their ids in order.
                fn task_insert_rows(conn; rows: &[NewTask<'_>]) -> Vec<TaskId>;
                /// Inserts one ordered task (no unique identity, no deadline): takes the key's next
                /// sequence number under the key row's lock (held to the caller's commit, so
                /// sequence order is commit order), and inserts the task `pending` as the key's
                /// head when the key has none, `waiting` behind it otherwise.
                fn task_insert_ordered(conn; row: &NewTask<'_>; order: &OrderKey<'_>) -> Inserted;
                /// The database clock, in microseconds since the Unix epoch.
                fn db_clock_us(conn) -> i64;
                /// Appends an entry to the audit trail; its id.
                fn audit_insert(conn; row: &AuditRow<'_>) -> u64;
                /// Records `message_id` as seen by `consumer` (`taskq_inbox`): `true` the first
                /// time, `false` when a record exists. A record another transaction holds
                /// uncommitted is waited for (then `false` if it committed, `true` if not).
                fn inbox_record(conn; consumer: &str; message_id: &str) -> bool;
                /// Deletes up to `limit` of `consumer`'s inbox records first seen more than
                /// `age_us` µs ago, oldest first; how many.
                fn inbox_prune(conn; consumer: &str; age_us: i64; limit: u32) -> u64;
                /// Inserts an event (`taskq_events`) in the caller's transaction: takes the
                /// key's next sequence number under the key row's lock (held to the caller's
                /// commit, so seq order is commit order) and marks the key ready unless held.
                fn event_insert(conn; row: &NewEvent<'_>) -> EventInserted;
                /// Inserts a workflow (`taskq_workflows`) and its steps atomically (a savepoint of
                /// the caller's transaction, or a transaction of its own): each step's task,
                /// `pending` when it runs after no step and `waiting` otherwise, with its step
                /// row and the edges to the steps it runs after. The steps come in an order where
                /// each follows those it runs after (`rules::workflow::plan`).
                fn workflow_insert(conn; wf: &NewWorkflow<'_>) -> WorkflowInserted;
                /// Inserts a batch (`taskq_batches`), its members (each with its member row)
                /// and its callbacks (`waiting`) atomically (a savepoint of the caller's
                /// transaction, or a transaction of its own).
                fn batch_insert(conn; b: &NewBatch<'_>) -> BatchInserted;
                /// Adds members to batch `id` under its row's lock (a savepoint of the caller's
                /// transaction, or its own), and seals it when `seal`; refused once the batch
                /// completed or was canceled (`rules::batch::may_add`). A seal of a batch whose
                /// members have all ended releases its callbacks in the same transaction.
                fn batch_add(conn; id: u64; members: &[NewTask<'_>]; seal: bool) -> BatchAdded;
            }
            /// Reads of `taskq_tasks`: one task, pages, counts, statistics, the targets of bulk actions.
            trait Tasks {
                /// One task by id.
                fn task_get(&self; id: TaskId) -> Option<TaskInfo>;
                /// A task's state.
                fn task_state(&self; id: TaskId) -> Option<TaskState>;
                /// A page of tasks by ascending id, `after_id < id <= up_to`.
                fn task_list(&self; f: &TaskFilter<'_>; after_id: u64; up_to: u64; limit: u32) -> Vec<TaskInfo>;
                /// A page of tasks by descending id, `from >= id > before_id`... (see the backends).
                fn task_list_desc(&self; f: &TaskFilter<'_>; before_id: u64; from: u64; limit: u32) -> Vec<TaskInfo>;
                /// The smallest and largest task ids.
                fn task_id_bounds(&self) -> (u64, u64);
                /// A page of one queue's tasks, newest first.
                fn task_list_queue_desc(&self; queue: &str; name: Option<&str>; before_id: u64; limit: u32) -> Vec<TaskInfo>;
                /// A page of one queue's tasks, oldest first.
                fn task_list_queue_asc(&self; queue: &str; name: Option<&str>; after_id: u64; limit: u32) -> Vec<TaskInfo>;
                /// Tasks matching a filter.
                fn task_count(&self; f: &TaskFilter<'_>) -> u64;
                /// Pending tasks of `kind`, of `queue` when given, by `run_at` then id, after the keyset
                /// cursor `(run_at, id)` when given; at most `limit`. Reads the pending tasks' claim-index
                /// entries (and, for the attempt count, their rows): bounded by the pending backlog, not
                /// the table.
                fn task_list_pending(&self; kind: PendingKind; queue: Option<&str>; after: Option<(DateTime<Utc>, u64)>; limit: u32) -> Vec<TaskInfo>;
                /// Tasks that ended per state and minute, over the last `minutes`.
                fn task_finished_per_minute(&self; minutes: u32) -> Vec<(TaskState, u32, u64)>;
                /// `(name, run time in µs)` of the tasks that succeeded in the last `minutes` (their last
                /// attempt: `finished_at - attempted_at`), newest first, at most `limit`: a range of
                /// `ix_taskq_finished`.
                fn task_run_times(&self; minutes: u32; limit: u32) -> Vec<(String, i64)>;
                /// Tasks retention would prune now.
                fn task_prune_count(&self; state: TaskState; age_secs: u64) -> u64;
                /// Tasks per queue and state.
                fn task_stats(&self, conn) -> Vec<QueueStateCount>;
                /// Pending and running tasks per queue.
                fn task_stats_active(&self, conn) -> Vec<QueueStateCount>;
                /// Tasks in terminal states per queue.
                fn task_stats_terminal(&self, conn) -> Vec<QueueStateCount>;
                /// Pending tasks per name.
                fn task_pending_by_name(&self, conn; queue: Option<&str>) -> Vec<PendingNameCount>;
                /// Ids (and whether running) of a bulk action's tasks, ascending past `after_id`.
                fn task_bulk_ids(&self; f: &TaskFilter<'_>; age_us: i64; after_id: u64; limit: u32) -> Vec<(u64, bool)>;
                /// How many tasks a bulk action would touch.
                fn task_bulk_count(&self; f: &TaskFilter<'_>; age_us: i64) -> u64;
                /// Order keys held back by their head: the head has run at least once and not ended
                /// (pending for a retry, or running a second attempt or later), or it is dead and
                /// holds the key, of `queue` when given,
                /// with how many tasks wait behind it; at most `limit`, most tasks waiting first.
                fn order_keys_held(&self; queue: Option<&str>; limit: u32) -> Vec<HeldKey>;
                /// Ids of dead unique tasks (retried one by one).
                fn task_dead_unique_ids(&self; queue: Option<&str>; died_before: DateTime<Utc>; after_id: u64; limit: u32) -> Vec<TaskId>;
            }
            /// The operator's writes to `taskq_tasks` (cancel, retry, reschedule, priority, delete), one task or a batch, and retention.
            trait Actions {
                /// Cancels pending tasks by id.
                fn task_cancel_batch(&self; ids: &[u64]) -> u64;
                /// Asks running tasks by id to cancel.
                fn task_request_cancel_batch(&self; ids: &[u64]) -> u64;
                /// Retries dead tasks by id.
                fn task_retry_dead_ids(&self; ids: &[u64]) -> u64;
                /// Asks one running task to cancel.
                fn task_request_cancel(&self, conn; id: TaskId) -> bool;
                /// Cancels one pending task.
                fn task_cancel(&self, conn; id: TaskId) -> bool;
                /// Moves a pending task's `run_at`.
                fn task_reschedule(&self, conn; id: TaskId; at: Option<DateTime<Utc>>; delay_us: i64) -> bool;
                /// Changes a pending task's priority.
                fn task_set_priority(&self, conn; id: TaskId; priority: i16) -> bool;
                /// Deletes a task that is not running (pending or finished), with the unique identity it
                /// holds; whether a row was deleted. On the caller's transaction (with its audit row).
                fn task_delete(&self, conn; id: TaskId) -> bool;
                /// Retries one dead task.
                fn task_retry_dead(&self, conn; id: TaskId) -> RetryDead;
                /// Retries dead tasks of a queue that died before a time.
                fn task_retry_dead_batch(&self; queue: Option<&str>; died_before: DateTime<Utc>; limit: u32) -> u64;
                /// Deletes tasks of a terminal state older than `age_secs`.
                fn task_prune(&self, conn; state: TaskState; age_secs: u64; limit: u32) -> u64;
            }
            /// The claim: up to `req.limit` due tasks of a queue under a lease, going on from where
            /// the cursor says (how the driver walks the queue is its own business: MySQL keeps a seek
            /// position and candidate spread in it, SQLite needs nothing).
            trait Claims {
                /// Claims up to `req.limit` due tasks of `req.queue` under a lease; `cursor` is what one
                /// queue's claim loop keeps between claims (see [`ClaimCursor`]).
                fn task_claim(&self, conn; req: &ClaimRequest<'_>; cursor: &mut ClaimCursor) -> ClaimBatch;
            }
            /// What a worker does under a lease: renew, check, write back, release; and the reap of expired leases, each under its epoch.
            trait Leases {
                /// Renews the leases (`(id, epoch)`) this worker holds; how many were renewed.
                fn task_heartbeat(&self, conn; leases: &[(u64, u64)]; lease_us: i64) -> u64;
                /// Which of the leases are still held, and whether cancel was requested on each.
                fn task_leases_held(&self, conn; leases: &[(u64, u64)]) -> Vec<(u64, u64, bool)>;
                /// Writes back a batch of ended attempts, each under its epoch.
                fn task_write_back(&self, conn; batch: &[WriteBack]) -> WrittenBack;
                /// Returns held leases to pending (shutdown).
                fn task_release(&self, conn; leases: &[(u64, u64)]) -> u64;
                /// Leases `(id, epoch)` of `queue`'s running tasks that `worker_id` claimed in the last
                /// `since_us` µs (a claim whose answer was lost may have taken some).
                fn task_running_since(&self, conn; queue: &str; worker_id: &str; since_us: i64) -> Vec<(u64, u64)>;
                /// Lapsed leases (running tasks whose lease ended), with whether each task's name is in
                /// `names`.
                fn task_lapsed(&self, conn; names: &NameList; limit: u32) -> Vec<LapsedRow>;
                /// Reaps expired leases, each under its epoch.
                fn task_reap(&self, conn; rows: &[ReapRow]; exact: bool) -> Reaped;
                /// Current epochs of the tasks `ids` that are running.
                fn task_epochs(&self, conn; ids: &[u64]) -> Vec<(u64, u64)>;
                /// Advances up to `limit` order keys whose recorded head has ended without the key
                /// going on (MySQL defers a key a producer's transaction holds past the commit of
                /// the write-back, claim or reap that ended its head; a process that ended before
                /// the deferred advance leaves it to this, which the reaper runs); how many moved.
                fn order_keys_advance_stranded(&self, conn; limit: u32) -> u64;
            }
            /// Unique identities (`taskq_unique`).
            trait Identities {
                /// Deletes expired unique identities.
                fn unique_prune_expired(&self, conn; limit: u32) -> u64;
            }
            /// Queue controls (`taskq_queues`): pause, limits, the list.
            trait Queues {
                /// Pauses a queue.
                fn queue_pause(&self, conn; queue: &str) -> ();
                /// Resumes a queue; whether it was paused.
                fn queue_resume(&self, conn; queue: &str) -> bool;
                /// Paused queues.
                fn queues_paused(&self, conn) -> Vec<(String, DateTime<Utc>)>;
                /// Paused and limited queues, for the worker's refresh.
                fn queue_controls(&self, conn) -> Vec<QueueControl>;
                /// Sets or clears a queue's concurrency limit, on the caller's transaction (with its
                /// audit row).
                fn queue_set_limit(&self, conn; queue: &str; limit: Option<u32>) -> ();
                /// Sets or clears a queue's rate limit, on the caller's transaction (with its audit row).
                fn queue_set_rate_limit(&self, conn; queue: &str; rate: Option<(u32, i64)>) -> ();
                /// Queues with their controls and counts.
                fn queue_list(&self) -> Vec<QueueRow>;
            }
            /// Recurring schedules (`taskq_schedules`).
            trait Schedules {
                /// Declares a schedule (worker start).
                fn schedule_declare(&self, conn; d: &ScheduleDecl<'_>) -> ();
                /// The state of the schedules named in `names`.
                fn schedule_states(&self, conn; names: &NameList) -> Vec<ScheduleState>;
                /// One compare-and-set step of a schedule, enqueueing its ticks.
                fn schedule_fire(&self, conn; f: &ScheduleFire<'_>) -> Option<Vec<TaskId>>;
                /// Every schedule.
                fn schedule_list(&self) -> Vec<ScheduleInfo>;
                /// Deletes a schedule.
                fn schedule_delete(&self, conn; name: &str) -> bool;
            }
            /// Live workers (`taskq_workers`).
            trait Workers {
                /// Records a worker's start.
                fn worker_start(&self, conn; w: &WorkerRow<'_>) -> ();
                /// Records that a worker is alive.
                fn worker_seen(&self, conn; w: &WorkerRow<'_>) -> ();
                /// Records a worker's stop.
                fn worker_stop(&self, conn; worker_id: &str) -> bool;
                /// Deletes workers not seen for `age_secs`.
                fn worker_prune(&self, conn; age_secs: u64; limit: u32) -> u64;
                /// Known workers.
                fn worker_list(&self, conn) -> Vec<WorkerListRow>;
            }
            /// Attempt history and the audit trail (`taskq_audit`).
            trait History {
                /// A task's attempt history (JSON), if the task exists.
                fn task_attempts(&self; id: TaskId) -> Option<Option<String>>;
                /// Failed attempts per outcome and minute, over the last `minutes`.
                fn task_failed_attempts_per_minute(&self; minutes: u32) -> Vec<(String, u32, u64)>;
                /// A page of the audit trail, newest first.
                fn audit_list(&self; task_id: Option<u64>; queue: Option<&str>; before_id: u64; limit: u32) -> Vec<AuditListRow>;
                /// Deletes audit entries older than `age_secs`.
                fn audit_prune(&self, conn; age_secs: u64; limit: u32) -> u64;
            }
            /// Events and the relay's keys (`taskq_events`, `taskq_event_keys`).
            trait Events {
                /// Leases up to `req.limit` ready keys (of `req.topics` when given), oldest
                /// ready first, skipping keys another relay or a publisher holds: epoch + 1,
                /// lease until now + `req.lease_us` (database clock).
                fn event_key_claim(&self; req: &EventClaim<'_>) -> Vec<EventLease>;
                /// The pending events of each range, by key (in the ranges' order) then seq.
                fn event_read(&self; ranges: &[EventRange]) -> Vec<EventRow>;
                /// Renews the leases `(key hash, epoch)` still held; which are still held. It
                /// never waits for a row lock: a key whose row another transaction holds at
                /// that moment (a publisher's, on MySQL) is not renewed by this call but is
                /// still held when its epoch is (another relay's lease skips the locked row
                /// too); a key whose epoch moved on or whose lease ended is not returned.
                fn event_key_renew(&self; leases: &[([u8; 32], u64)]; lease_us: i64) -> Vec<[u8; 32]>;
                /// Settles leased keys, each only under its epoch: moves `done_seq` (which
                /// records delivery: no event row is written for a delivered event), marks its
                /// dead-lettered events dead, and ends the lease as `next` says. Whether each
                /// key was still held (in order).
                fn event_key_settle(&self; keys: &[EventSettle]) -> Vec<bool>;
                /// Per topic: pending events, the oldest pending one's creation, held keys.
                fn event_topic_stats(&self) -> Vec<EventTopicStats>;
                /// Keys held by a rejected event (of `topic` when given), longest held first.
                fn event_keys_held(&self; topic: Option<&str>; limit: u32) -> Vec<HeldEventKey>;
                /// A key's events with `seq > after_seq`, by seq, at most `limit`.
                fn event_list(&self; topic: &str; key: &str; after_seq: u64; limit: u32) -> Vec<EventInfo>;
                /// A key's relay state.
                fn event_key_get(&self; topic: &str; key: &str) -> Option<EventKeyInfo>;
                /// Deletes up to `limit` delivered events (not dead, at or below their key's
                /// `done_seq`) published more than `age_us` µs ago, oldest first; how many.
                fn event_prune(&self, conn; age_us: i64; limit: u32) -> u64;
                /// Replays a key from `from_seq` (at least its oldest stored event): `done_seq`
                /// goes back to the seq before it and dead marks from it on are cleared, so its
                /// delivered and dead events from there become pending again; the key's hold
                /// is cleared, its lease ended (epoch + 1) and it is ready at once. On the
                /// caller's transaction (with its audit entry). How many events became pending.
                fn event_replay_key(&self, conn; topic: &str; key: &str; from_seq: u64) -> u64;
                /// Replays a topic's delivered and dead events published in `[from, to)`: reads
                /// up to `limit` of them, oldest first, and rewinds each of their keys to its
                /// lowest one read, as [`event_replay_key`](Events::event_replay_key) does (its
                /// later events go out again too, in order), except that a held key stays held.
                /// On the caller's transaction; a rewound key's events are pending, so a next
                /// call reads the rest of the range.
                fn event_replay_range(&self, conn; topic: &str; from: DateTime<Utc>; to: DateTime<Utc>; limit: u32) -> RangeReplayed;
                /// Releases a held key: `skip` marks the held event dead and the key goes on
                /// with the next; otherwise the held event is tried again. Ends any lease
                /// (epoch + 1). On the caller's transaction. Whether the key was held.
                fn event_key_release(&self, conn; topic: &str; key: &str; skip: bool) -> bool;
            }
            /// Workflows (`taskq_workflows`, `taskq_workflow_steps`, `taskq_workflow_deps`): the
            /// settle that lets the steps after an ended step go on, reads, and cancel.
            trait Workflows {
                /// Settles up to `limit` ended steps that still have an unsettled edge, in one
                /// transaction: each edge to a step after them is settled once, as
                /// `rules::workflow::dependency_end` says (a step with no dependency left becomes
                /// `pending`; one a failure cancels is canceled and settled in turn). The
                /// worker's write-back settles the steps it ends in its own transaction; these
                /// are the ends it did not settle (a reap, an expiry at claim, an
                /// operator's cancel or delete, a process that stopped between two statements).
                /// The reaper runs it.
                fn workflow_settle_stranded(&self, conn; limit: u32) -> Settled;
                /// A workflow with its steps per state.
                fn workflow_get(&self; id: u64) -> Option<WorkflowRow>;
                /// A workflow's steps, in the order they were inserted.
                fn workflow_steps(&self; id: u64) -> Vec<WorkflowStepRow>;
                /// The output of the step named `step` of the workflow that task `task` is a step of,
                /// if `task`'s step runs after it (one read by primary and unique keys).
                fn workflow_step_output(&self; task: TaskId; step: &str) -> StepOutput;
                /// A page of workflows, newest first, with ids below `before_id`; of `name` when given.
                fn workflow_list(&self; name: Option<&str>; before_id: u64; limit: u32) -> Vec<WorkflowRow>;
                /// Cancels a workflow on the caller's transaction (with its audit row): its
                /// waiting and pending steps are canceled, its running steps asked to cancel,
                /// and it is marked canceled.
                fn workflow_cancel(&self, conn; id: u64) -> WorkflowCanceled;
                /// Deletes the workflows, among the `scan` oldest, none of whose steps' tasks
                /// exists any more (task retention pruned them all), with their step rows and
                /// edges; how many workflows.
                fn workflow_prune(&self, conn; scan: u32) -> u64;
            }
            /// Batches (`taskq_batches`, `taskq_batch_members`): the count of members' ends the
            /// write-back did not make, reads, cancel and retention.
            trait Batches {
                /// Counts up to `limit` members whose end is not counted yet (ended, or deleted)
                /// or that were counted as failed and are running again (an operator's retry), as
                /// `rules::batch::count` says, releasing the callbacks of the batches that
                /// complete. The worker's write-back counts the ends it writes; these are the
                /// others (a reap, an expiry at claim, an operator's cancel, retry or delete, a
                /// member whose batch row a producer held). The reaper runs it.
                fn batch_settle_stranded(&self, conn; limit: u32) -> BatchCounted;
                /// A batch with its counters.
                fn batch_get(&self; id: u64) -> Option<BatchRow>;
                /// A page of batches, newest first, with ids below `before_id`; of `name` when given.
                fn batch_list(&self; name: Option<&str>; before_id: u64; limit: u32) -> Vec<BatchRow>;
                /// A page of a batch's members by task id, past `after_id`.
                fn batch_members(&self; id: u64; after_id: u64; limit: u32) -> Vec<BatchMemberRow>;
                /// Cancels a batch on the caller's transaction (with its audit row): its waiting
                /// and pending members and its waiting callbacks are canceled, its running members
                /// asked to cancel, and it is marked canceled; the members it canceled are
                /// counted in the same transaction.
                fn batch_cancel(&self, conn; id: u64) -> BatchCanceled;
                /// Deletes the batches, among the `scan` oldest, none of whose members' tasks
                /// exists any more and whose callbacks have ended or are gone, with their member
                /// rows; how many batches.
                fn batch_prune(&self, conn; scan: u32) -> u64;
            }
            /// The database clock.
            trait Clock {
                /// The database clock.
                fn db_now(&self) -> DateTime<Utc>;
                /// The database clock, on a connection.
                fn db_now_on(&self, conn) -> DateTime<Utc>;
            }
            /// The database's limits on one statement.
            trait StatementBudget {
                /// The byte limits of the server's multi-row statements (MySQL: its `max_allowed_packet`).
                fn statement_budget(&self, conn) -> Budget;
            }
        }
    };
}

/// Declares the seam's traits from the list of [`__seam_operations!`](crate::__seam_operations).
macro_rules! declare_traits {
    (
        $(#[$em:meta])* enqueue $enqueue:ident {
            $( $(#[$efm:meta])* fn $ename:ident(conn $(; $earg:ident: $ety:ty)* $(,)?) -> $eret:ty; )*
        }
        $(
            $(#[$tm:meta])* trait $trait:ident {
                $(
                    $(#[$m:meta])*
                    fn $name:ident(&self $(, $conn:ident)? $(; $arg:ident: $ty:ty)* $(,)?) -> $ret:ty;
                )*
            }
        )*
    ) => {
        $(#[$em])*
        pub trait $enqueue: Handle {
            $(
                $(#[$efm])*
                fn $ename(
                    conn: &mut Self::Conn $(, $earg: $ety)*
                ) -> impl Future<Output = sqlx::Result<$eret>> + Send;
            )*
        }
        $(
            $(#[$tm])*
            pub trait $trait: Handle {
                $(
                    $(#[$m])*
                    fn $name(
                        &self $(, $conn: &mut Self::Conn)? $(, $arg: $ty)*
                    ) -> impl Future<Output = sqlx::Result<$ret>> + Send;
                )*
            }
        )*
    };
}

crate::__seam_operations!(declare_traits);

/// Every operation of the seam: what a driver provides.
pub trait Driver:
    Enqueue
    + Tasks
    + Actions
    + Claims
    + Leases
    + Identities
    + Queues
    + Schedules
    + Workers
    + History
    + Events
    + Workflows
    + Batches
    + Clock
    + StatementBudget
{
}

impl<D> Driver for D where
    D: Enqueue
        + Tasks
        + Actions
        + Claims
        + Leases
        + Identities
        + Queues
        + Schedules
        + Workers
        + History
        + Events
        + Workflows
        + Batches
        + Clock
        + StatementBudget
{
}
