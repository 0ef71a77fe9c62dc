//! Batches: a group of ordinary tasks with callbacks, `on_success` (made due once every
//! member has succeeded) and `on_complete` (once every member has ended, however), each
//! released exactly once, by whichever member's end is counted last, even when members end
//! at the same moment on different workers. Enqueued in one call on the caller's transaction
//! (commit = the batch, its members and its callbacks; rollback = none), and added to later
//! while it is open or still running.
//!
//! ```
//! # use taskq::{Task, TaskContext, TaskError};
//! # #[derive(serde::Serialize, serde::Deserialize)] struct ImportRow { row: u32 }
//! # impl Task for ImportRow { const NAME: &'static str = "import_row";
//! #   async fn run(self, _: TaskContext) -> Result<(), TaskError> { Ok(()) } }
//! # #[derive(serde::Serialize, serde::Deserialize)] struct Notify { file: String }
//! # impl Task for Notify { const NAME: &'static str = "notify";
//! #   async fn run(self, _: TaskContext) -> Result<(), TaskError> { Ok(()) } }
//! # #[derive(serde::Serialize, serde::Deserialize)] struct Report { file: String }
//! # impl Task for Report { const NAME: &'static str = "report";
//! #   async fn run(self, _: TaskContext) -> Result<(), TaskError> { Ok(()) } }
//! use taskq::batch::Batch;
//! # async fn f(pool: sqlx::MySqlPool) -> taskq::Result<()> {
//! let mut tx = pool.begin().await?;
//! let batch = Batch::new("import-orders.csv")
//!     .add_all((1..=500).map(|row| ImportRow { row }))
//!     .on_success(Notify { file: "orders.csv".into() })
//!     .on_complete(Report { file: "orders.csv".into() })
//!     .enqueue_tx(&mut tx)
//!     .await?;
//! tx.commit().await?;
//! println!("batch {} of {} tasks", batch.id, batch.tasks.len());
//! # Ok(()) }
//! ```
//!
//! A batch built with [`open`](Batch::open) releases nothing until it is sealed: add to it
//! over several transactions with [`Batch::add_to`], then seal it ([`BatchAdd::seal`],
//! [`Client::seal_batch`](crate::Client::seal_batch)). The rules are
//! `taskq_driver::rules::batch`'s; docs/workflows.md says what is guaranteed.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::Pool;

use crate::backend::Backend;
use crate::defaults::{MAX_NAME_LEN, validate_name};
use crate::enqueue::{AsConnection, IntoEnqueue, conn_of};
use crate::error::{Error, Result};
use crate::task::TaskId;
use crate::task::enqueue::Prepared;
use taskq_driver::rows::{BatchAdded, NewBatch, NewTask};
pub use taskq_driver::rows::{BatchCanceled, BatchMemberRow};
use taskq_driver::rules::batch::{AddRefused, batch_state};
pub use taskq_driver::rules::batch::{BatchId, BatchState};

/// Checks that a task may be a member or a callback of a batch.
fn check(what: &str, t: Result<Prepared>) -> Result<Prepared> {
    let t = t?;
    if t.keyed() {
        return Err(Error::InvalidOption(format!(
            "batch {what} {} is unique, ordered or has an idempotency key: a batch's tasks \
             are none of these",
            t.name
        )));
    }
    Ok(t)
}

fn checked(what: &str, tasks: Vec<Result<Prepared>>) -> Result<Vec<Prepared>> {
    tasks.into_iter().map(|t| check(what, t)).collect()
}

/// A batch being built: its members and callbacks. Nothing is checked or written until
/// [`enqueue_tx`](Self::enqueue_tx) (or [`enqueue`](Self::enqueue)), which refuses a bad task
/// with its own error, writing nothing.
#[must_use = "a batch is written only by enqueue_tx or enqueue"]
pub struct Batch {
    name: String,
    members: Vec<Result<Prepared>>,
    on_success: Option<Result<Prepared>>,
    on_complete: Option<Result<Prepared>>,
    open: bool,
}

impl std::fmt::Debug for Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch")
            .field("name", &self.name)
            .field("members", &self.members.len())
            .field("on_success", &self.on_success.is_some())
            .field("on_complete", &self.on_complete.is_some())
            .field("open", &self.open)
            .finish()
    }
}

/// What [`Batch::enqueue_tx`] inserted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchEnqueued {
    /// The batch's id.
    pub id: BatchId,
    /// Each member's task, in the order they were added.
    pub tasks: Vec<TaskId>,
    /// The `on_success` callback's task (`waiting` until every member has succeeded).
    pub on_success: Option<TaskId>,
    /// The `on_complete` callback's task (`waiting` until every member has ended).
    pub on_complete: Option<TaskId>,
}

impl Batch {
    /// A batch named `name` (a label for people, e.g. `import-7`; not unique), with no member
    /// yet.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            members: Vec::new(),
            on_success: None,
            on_complete: None,
            open: false,
        }
    }

    /// Adds a member: a task, or a task with enqueue options ([`Enqueue`](crate::Enqueue));
    /// not unique, ordered, or with an idempotency key.
    #[allow(clippy::should_implement_trait)] // a builder's `add`, not arithmetic
    pub fn add(mut self, task: impl IntoEnqueue) -> Self {
        self.members.push(task.into_enqueue().prepare());
        self
    }

    /// Adds every task of `tasks` as a member.
    pub fn add_all<T: IntoEnqueue>(mut self, tasks: impl IntoIterator<Item = T>) -> Self {
        self.members
            .extend(tasks.into_iter().map(|t| t.into_enqueue().prepare()));
        self
    }

    /// The task made due once every member has succeeded (a retried dead member that then
    /// succeeds counts). Inserted `waiting` with the batch; canceled, with
    /// `taskq_driver::rules::batch::CANCELED_BY_BATCH`, when the batch completes with a
    /// member that did not succeed, and brought back if those members are retried and succeed.
    pub fn on_success(mut self, task: impl IntoEnqueue) -> Self {
        self.on_success = Some(task.into_enqueue().prepare());
        self
    }

    /// The task made due once every member has ended (succeeded, dead, canceled or
    /// expired), once.
    pub fn on_complete(mut self, task: impl IntoEnqueue) -> Self {
        self.on_complete = Some(task.into_enqueue().prepare());
        self
    }

    /// Keeps the batch open: members may be added over several transactions
    /// ([`Batch::add_to`]) and the callbacks wait until it is sealed, even if every member
    /// added so far has ended. Without it a batch is sealed at once: it needs a member, and a
    /// member may still add to its own batch while it runs.
    pub fn open(mut self) -> Self {
        self.open = true;
        self
    }

    /// Adds members to batch `id` (and seals it, with [`BatchAdd::seal`]), on a caller's
    /// transaction; refused with [`Error::BatchEnded`] once every member had ended or an
    /// operator canceled it.
    pub fn add_to(id: BatchId) -> BatchAdd {
        BatchAdd {
            id,
            members: Vec::new(),
            seal: false,
        }
    }

    /// Inserts the batch on the caller's transaction or connection (never begins, commits or
    /// rolls back it; on a bare connection its statements run in a transaction of their
    /// own): its members, due as their options say, and its callbacks, waiting. Workers see
    /// it when the caller commits.
    pub async fn enqueue_tx<C: AsConnection + ?Sized>(self, conn: &mut C) -> Result<BatchEnqueued> {
        validate_name("batch name", &self.name, MAX_NAME_LEN)?;
        let members = checked("member", self.members)?;
        if members.is_empty() && !self.open {
            return Err(Error::InvalidOption(
                "a batch needs at least one task (or open() it to add its tasks later)".into(),
            ));
        }
        let on_success = self.on_success.map(|t| check("callback", t)).transpose()?;
        let on_complete = self.on_complete.map(|t| check("callback", t)).transpose()?;
        let rows: Vec<NewTask<'_>> = members.iter().map(|t| t.row(None, None)).collect();
        let b = NewBatch {
            name: &self.name,
            members: &rows,
            on_success: on_success.as_ref().map(|t| t.row(None, None)),
            on_complete: on_complete.as_ref().map(|t| t.row(None, None)),
            sealed: !self.open,
        };
        let inserted = conn_of(conn).batch_insert(&b).await?;
        if inserted.task_ids.len() != rows.len() {
            return Err(Error::Database(sqlx::Error::Protocol(format!(
                "batch insert of {} tasks returned {} ids",
                rows.len(),
                inserted.task_ids.len()
            ))));
        }
        for t in &members {
            crate::metrics::enqueued(&t.queue, t.name);
        }
        tracing::debug!(
            batch_id = inserted.id,
            tasks = rows.len(),
            "enqueued a batch"
        );
        Ok(BatchEnqueued {
            id: BatchId(inserted.id),
            tasks: inserted.task_ids,
            on_success: inserted.on_success,
            on_complete: inserted.on_complete,
        })
    }

    /// Inserts the batch in a transaction of its own and wakes this process's workers for
    /// its members' queues.
    pub async fn enqueue<DB: Backend>(self, pool: &Pool<DB>) -> Result<BatchEnqueued> {
        let queues = queues(&self.members);
        let mut conn = match pool.acquire().await {
            Ok(c) => c,
            Err(e) => return Err(crate::backend::Store::of(pool.clone()).error(e).await),
        };
        let out = self.enqueue_tx(&mut conn).await?;
        for q in queues {
            crate::wake::notify(&q);
        }
        Ok(out)
    }
}

fn queues(members: &[Result<Prepared>]) -> Vec<String> {
    let mut q: Vec<String> = members
        .iter()
        .filter_map(|t| t.as_ref().ok().map(|t| t.queue.clone()))
        .collect();
    q.sort_unstable();
    q.dedup();
    q
}

/// Members to add to an existing batch ([`Batch::add_to`]).
#[must_use = "members are added only by enqueue_tx or enqueue"]
pub struct BatchAdd {
    id: BatchId,
    members: Vec<Result<Prepared>>,
    seal: bool,
}

impl std::fmt::Debug for BatchAdd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchAdd")
            .field("id", &self.id)
            .field("members", &self.members.len())
            .field("seal", &self.seal)
            .finish()
    }
}

impl BatchAdd {
    /// Adds a member (as [`Batch::add`]).
    #[allow(clippy::should_implement_trait)] // a builder's `add`, not arithmetic
    pub fn add(mut self, task: impl IntoEnqueue) -> Self {
        self.members.push(task.into_enqueue().prepare());
        self
    }

    /// Adds every task of `tasks` as a member.
    pub fn add_all<T: IntoEnqueue>(mut self, tasks: impl IntoIterator<Item = T>) -> Self {
        self.members
            .extend(tasks.into_iter().map(|t| t.into_enqueue().prepare()));
        self
    }

    /// Seals the batch in the same transaction: no member will be added but by a member, and
    /// its callbacks are released once every member has ended (at once, in this transaction,
    /// if they all have).
    pub fn seal(mut self) -> Self {
        self.seal = true;
        self
    }

    /// Adds the members (and seals) on the caller's transaction or connection, under the
    /// batch row's lock; their tasks, in order. [`Error::BatchNotFound`],
    /// [`Error::BatchEnded`]: nothing was written.
    pub async fn enqueue_tx<C: AsConnection + ?Sized>(self, conn: &mut C) -> Result<Vec<TaskId>> {
        let members = checked("member", self.members)?;
        let rows: Vec<NewTask<'_>> = members.iter().map(|t| t.row(None, None)).collect();
        match conn_of(conn).batch_add(self.id.0, &rows, self.seal).await? {
            BatchAdded::Added { task_ids, counted } => {
                for t in &members {
                    crate::metrics::enqueued(&t.queue, t.name);
                }
                for (_, q) in &counted.released {
                    crate::wake::notify(q);
                }
                Ok(task_ids)
            }
            BatchAdded::Refused(AddRefused::NotFound) => Err(Error::BatchNotFound(self.id)),
            BatchAdded::Refused(AddRefused::Ended) => Err(Error::BatchEnded(self.id)),
        }
    }

    /// Adds the members in a transaction of their own and wakes this process's workers.
    pub async fn enqueue<DB: Backend>(self, pool: &Pool<DB>) -> Result<Vec<TaskId>> {
        let queues = queues(&self.members);
        let mut conn = match pool.acquire().await {
            Ok(c) => c,
            Err(e) => return Err(crate::backend::Store::of(pool.clone()).error(e).await),
        };
        let out = self.enqueue_tx(&mut conn).await?;
        for q in queues {
            crate::wake::notify(&q);
        }
        Ok(out)
    }
}

/// A batch as [`Client::batch`](crate::Client::batch) reads it: its progress is its row's
/// counters, not a scan of its members.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BatchInfo {
    /// Its id.
    pub id: BatchId,
    /// Its name.
    pub name: String,
    /// Its state, from its counters ([`BatchState`]).
    pub state: BatchState,
    /// When it was enqueued (database clock).
    pub created_at: DateTime<Utc>,
    /// Members added.
    pub total: u64,
    /// Members that succeeded.
    pub succeeded: u64,
    /// Members that ended without success (dead, canceled, expired, deleted).
    pub failed: u64,
    /// Members that have not ended (or whose end is not counted yet).
    pub pending: u64,
    /// Sealed: its callbacks are released once every member has ended.
    pub sealed: bool,
    /// When every member had ended and `on_complete` was made due.
    pub completed_at: Option<DateTime<Utc>>,
    /// When every member had succeeded and `on_success` was made due.
    pub succeeded_at: Option<DateTime<Utc>>,
    /// When an operator canceled it.
    pub canceled_at: Option<DateTime<Utc>>,
    /// The `on_success` callback's task.
    pub on_success: Option<TaskId>,
    /// The `on_complete` callback's task.
    pub on_complete: Option<TaskId>,
}

impl From<taskq_driver::rows::BatchRow> for BatchInfo {
    fn from(r: taskq_driver::rows::BatchRow) -> Self {
        let c = r.counters();
        Self {
            id: BatchId(r.id),
            state: batch_state(&c),
            pending: c.pending(),
            name: r.name,
            created_at: r.created_at,
            total: r.total,
            succeeded: r.succeeded,
            failed: r.failed,
            sealed: r.sealed,
            completed_at: r.completed_at,
            succeeded_at: r.succeeded_at,
            canceled_at: r.canceled_at,
            on_success: r.on_success,
            on_complete: r.on_complete,
        }
    }
}
