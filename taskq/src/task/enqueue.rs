//! Producing tasks: [`Enqueue`] (options), validation, and the result [`Enqueued`].

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::{Pool, Transaction, pool::PoolConnection};

use crate::backend::{Backend, Conn, Inserted, NewTask, OrderKey};
use crate::defaults::{
    DEFAULT_PAYLOAD_LIMIT, MAX_DELAY, MAX_NAME_LEN, MAX_QUEUE_LEN, validate_name,
};
use crate::error::{Error, Result};
use crate::task::{Task, TaskId};
use crate::unique::{PreparedUnique, Unique};
use crate::wake;

static PAYLOAD_LIMIT: AtomicUsize = AtomicUsize::new(DEFAULT_PAYLOAD_LIMIT);

/// Sets the process-wide payload size limit in bytes (default [`DEFAULT_PAYLOAD_LIMIT`]).
/// [`Enqueue::with_payload_limit`] overrides it for one enqueue.
pub fn set_payload_limit(bytes: usize) {
    PAYLOAD_LIMIT.store(bytes, Ordering::Relaxed);
}

/// The process-wide payload size limit in bytes.
pub fn payload_limit() -> usize {
    PAYLOAD_LIMIT.load(Ordering::Relaxed)
}

/// Something `enqueue_tx` can write on: a `Transaction`, a connection or a pooled connection,
/// of MySQL or (feature `sqlite`) SQLite; the backend is the connection's. taskq issues its
/// statements on it and never begins, commits or rolls back the caller's transaction. (A
/// unique enqueue is several statements that belong together: on a connection that is not in
/// a transaction it runs them in a short transaction of its own. sqlx only knows about
/// transactions begun through it, with `begin()`: do not pass a connection on which a raw
/// `BEGIN` statement opened one.)
pub trait AsConnection: Send {
    /// The database the connection is of.
    type Database: Backend;

    /// The underlying connection.
    fn as_connection(&mut self) -> &mut <Self::Database as sqlx::Database>::Connection;
}

impl AsConnection for sqlx::MySqlConnection {
    type Database = sqlx::MySql;

    fn as_connection(&mut self) -> &mut sqlx::MySqlConnection {
        self
    }
}

#[cfg(feature = "sqlite")]
impl AsConnection for sqlx::SqliteConnection {
    type Database = sqlx::Sqlite;

    fn as_connection(&mut self) -> &mut sqlx::SqliteConnection {
        self
    }
}

impl<DB: Backend> AsConnection for Transaction<'_, DB> {
    type Database = DB;

    fn as_connection(&mut self) -> &mut DB::Connection {
        self
    }
}

impl<DB: Backend> AsConnection for PoolConnection<DB> {
    type Database = DB;

    fn as_connection(&mut self) -> &mut DB::Connection {
        self
    }
}

/// The backend's view of a caller's connection.
pub(crate) fn conn_of<C: AsConnection + ?Sized>(c: &mut C) -> Conn<'_> {
    Conn::of::<C::Database>(c.as_connection())
}

/// The result of an enqueue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Enqueued {
    /// The task's id (the existing task's id for a duplicate).
    pub id: TaskId,
    /// `true` when nothing was inserted because an existing task holds the idempotency key or
    /// the unique identity ([`Enqueue::with_unique`]); `id` is that task's.
    pub duplicate: bool,
}

/// A task plus per-enqueue options. Start one from the task with any `with_*` option
/// ([`Task::with_delay`], …, or the same methods the `#[task]` macro generates on its struct) or
/// with [`Task::enqueue_options`]; chain the other `with_*` options in any order; finish with
/// [`enqueue_tx`](Self::enqueue_tx) or [`enqueue`](Self::enqueue).
///
/// | option | meaning |
/// |---|---|
/// | `with_delay(Duration)` | runs no earlier than this long after the insert (database clock); replaces `with_run_at` |
/// | `with_run_at(DateTime<Utc>)` | runs no earlier than this time; replaces `with_delay` |
/// | `with_priority(i16)` | overrides the task's priority (lower runs first) |
/// | `with_idempotency_key(impl Into<String>)` | one task per (name, key) while the row is kept; a duplicate returns the existing id |
/// | `with_unique(impl Into<Option<Unique>>)` | one live task per identity ([`Unique`]); replaces the task's declaration, `None` turns it off; a duplicate returns the live task's id |
/// | `with_queue(impl Into<String>)` | overrides the task's queue |
/// | `with_max_attempts(u32)` | overrides the task's max attempts (at least 1), `ordered_dead_after` included (a death still lets the key go on) |
/// | `with_deadline(DateTime<Utc>)` | no attempt starts at or after this time: a task not started by then ends `expired`, never run; replaces `with_ttl` and the task's `TTL` |
/// | `with_ttl(Duration)` | the same, as a time to live from the insert (database clock); replaces `with_deadline` and the task's `TTL` |
/// | `with_trace_context(impl Into<String>)` | records this trace context instead of asking the hook |
/// | `with_payload_limit(usize)` | overrides the payload size limit for this enqueue |
///
/// ```no_run
/// # use std::time::Duration;
/// # use taskq::{Task, TaskContext, TaskError};
/// # #[derive(serde::Serialize, serde::Deserialize)] struct Report { day: u32 }
/// # impl Task for Report { const NAME: &'static str = "report";
/// #   async fn run(self, _: TaskContext) -> Result<(), TaskError> { Ok(()) } }
/// # async fn f(pool: sqlx::MySqlPool) -> taskq::Result<()> {
/// let mut tx = pool.begin().await?;
/// let done = Report { day: 3 }
///     .with_delay(Duration::from_secs(60))
///     .with_priority(-1)
///     .with_idempotency_key("report-3")
///     .enqueue_tx(&mut tx)
///     .await?;
/// tx.commit().await?;
/// println!("task {} (duplicate: {})", done.id, done.duplicate);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
#[must_use = "an Enqueue does nothing until enqueue_tx or enqueue is awaited"]
pub struct Enqueue<T> {
    task: T,
    delay: Duration,
    run_at: Option<DateTime<Utc>>,
    priority: Option<i16>,
    idempotency_key: Option<String>,
    queue: Option<String>,
    max_attempts: Option<u32>,
    payload_limit: Option<usize>,
    trace_context: Option<String>,
    expiry: Option<Expiry>,
    /// `None`: the task's declaration (`T::UNIQUE`).
    unique: Option<Option<Unique>>,
    /// An explicit order key (`with_order_key`); `None`: the task's declaration (`T::ORDERED`).
    order_key: Option<String>,
}

/// A deadline as given to [`Enqueue`]: absolute, or relative to the insert.
#[derive(Debug, Clone, Copy)]
enum Expiry {
    At(DateTime<Utc>),
    Ttl(Duration),
}

impl<T: Task> Enqueue<T> {
    /// Wraps `task` with default options.
    pub fn new(task: T) -> Self {
        Self {
            task,
            delay: Duration::ZERO,
            run_at: None,
            priority: None,
            idempotency_key: None,
            queue: None,
            max_attempts: None,
            payload_limit: None,
            trace_context: None,
            expiry: None,
            unique: None,
            order_key: None,
        }
    }
    /// Runs no earlier than `delay` after the insert, on the database clock.
    pub fn with_delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self.run_at = None;
        self
    }
    /// Runs no earlier than this absolute UTC time.
    pub fn with_run_at(mut self, at: DateTime<Utc>) -> Self {
        self.run_at = Some(at);
        self.delay = Duration::ZERO;
        self
    }
    /// Overrides the task's default priority (lower runs first).
    pub fn with_priority(mut self, priority: i16) -> Self {
        self.priority = Some(priority);
        self
    }
    /// At most one task per (task name, key) exists while its row is kept; a duplicate enqueue
    /// returns the existing task's id with `duplicate = true`.
    pub fn with_idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.idempotency_key = Some(key.into());
        self
    }
    /// Makes this enqueue unique: nothing is inserted while another task holds the same
    /// identity (task name plus the payload fields of `unique`), and the result is that task's
    /// id with `duplicate = true`. Replaces the task's own declaration ([`Task::UNIQUE`],
    /// `#[taskq::task(unique)]`); `None` makes this enqueue not unique. See [`Unique`].
    pub fn with_unique(mut self, unique: impl Into<Option<Unique>>) -> Self {
        self.unique = Some(unique.into());
        self
    }
    /// Runs this task in order with the other tasks of its queue given the same key: tasks
    /// sharing a key run one at a time, in the order their enqueues commit, across every
    /// worker (see [`Ordered`](crate::ordered::Ordered) and docs/semantics.md, "Ordered tasks").
    /// Replaces the key the task's `ordered_by` fields would give; a death lets the key go on
    /// only if the task declares `ordered_dead_after`. An ordered task cannot be unique.
    pub fn with_order_key(mut self, key: impl Into<String>) -> Self {
        self.order_key = Some(key.into());
        self
    }
    /// Overrides the task's queue.
    pub fn with_queue(mut self, queue: impl Into<String>) -> Self {
        self.queue = Some(queue.into());
        self
    }
    /// Overrides the task's max attempts (at least 1).
    pub fn with_max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = Some(n);
        self
    }
    /// No attempt of this task starts at or after `deadline` (compared with the database
    /// clock): a task still pending then — not yet due, waiting behind others, or waiting
    /// for a retry — is not run and ends `expired` when a worker next finds it due. An attempt
    /// already running when the deadline passes is not interrupted (that is what the task's
    /// `timeout` is for). Replaces [`with_ttl`](Self::with_ttl) and the task's
    /// [`TTL`](Task::TTL). Must lie between 1970 and 10 years ahead, and after a
    /// [`with_run_at`](Self::with_run_at) time.
    pub fn with_deadline(mut self, deadline: DateTime<Utc>) -> Self {
        self.expiry = Some(Expiry::At(deadline));
        self
    }
    /// The deadline as a time to live: `insert time + ttl` on the database clock (see
    /// [`with_deadline`](Self::with_deadline)). Replaces `with_deadline` and the task's
    /// [`TTL`](Task::TTL). Must be non-zero, at most [`MAX_DELAY`], and longer than a
    /// [`with_delay`](Self::with_delay).
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.expiry = Some(Expiry::Ttl(ttl));
        self
    }
    /// Records this trace context (e.g. a W3C `traceparent`) instead of asking the hook set
    /// with [`set_trace_context_hook`](crate::settings::set_trace_context_hook).
    pub fn with_trace_context(mut self, context: impl Into<String>) -> Self {
        self.trace_context = Some(context.into());
        self
    }
    /// Overrides the payload size limit for this enqueue.
    pub fn with_payload_limit(mut self, bytes: usize) -> Self {
        self.payload_limit = Some(bytes);
        self
    }

    /// Inserts the task on the caller's transaction or connection; never begins, commits or
    /// rolls back. The task becomes visible to workers when the caller commits.
    pub async fn enqueue_tx<C: AsConnection + ?Sized>(self, conn: &mut C) -> Result<Enqueued> {
        let prepared = self.prepare()?;
        prepared.insert(conn_of(conn), &mut None).await
    }

    /// Inserts the task on its own (autocommit) and wakes this process's workers for its queue.
    pub async fn enqueue<DB: Backend>(self, pool: &Pool<DB>) -> Result<Enqueued> {
        let prepared = self.prepare()?;
        let mut conn = match pool.acquire().await {
            Ok(c) => c,
            Err(e) => return Err(crate::backend::Store::of(pool.clone()).error(e).await),
        };
        let out = prepared.insert(conn_of(&mut conn), &mut None).await?;
        wake::notify(&prepared.queue);
        Ok(out)
    }

    pub(crate) fn prepare(self) -> Result<Prepared> {
        self.prepare_with(crate::trace::capture)
    }

    /// Validates the task for a schedule (`schedule` names it in errors): the scheduler sets
    /// `run_at` and the idempotency key of every tick, so neither a delay, a run-at nor a key
    /// may be set, and no trace context is captured (only an explicit one is kept).
    pub(crate) fn prepare_for_schedule(self, schedule: &str) -> Result<Prepared> {
        let set = [
            ("with_delay", !self.delay.is_zero()),
            ("with_run_at", self.run_at.is_some()),
            ("with_idempotency_key", self.idempotency_key.is_some()),
            ("with_order_key", self.order_key.is_some()),
            ("ordered_by", T::ORDERED.is_some()),
        ];
        if let Some((what, _)) = set.iter().find(|(_, on)| *on) {
            return Err(Error::InvalidCron {
                schedule: schedule.to_owned(),
                reason: format!(
                    "{what} cannot be used on a scheduled task: the scheduler sets run_at and the idempotency key of every tick"
                ),
            });
        }
        self.prepare_with(|explicit| explicit.and_then(|c| crate::trace::capture(Some(c))))
    }

    fn prepare_with(
        self,
        trace: impl FnOnce(Option<String>) -> Option<String>,
    ) -> Result<Prepared> {
        let queue = self.queue.unwrap_or_else(|| T::QUEUE.to_owned());
        validate_name("queue", &queue, MAX_QUEUE_LEN)?;
        validate_name("task name", T::NAME, MAX_NAME_LEN)?;
        if let Some(k) = &self.idempotency_key {
            validate_name("idempotency key", k, MAX_NAME_LEN)?;
        }
        let ordered_dead_after = T::ORDERED.and_then(|o| o.dead_after_attempts());
        let max_attempts = self
            .max_attempts
            .or(ordered_dead_after)
            .unwrap_or(T::MAX_ATTEMPTS);
        if max_attempts == 0 {
            return Err(Error::InvalidOption(
                "max_attempts must be at least 1".into(),
            ));
        }
        let delay_us = validate_schedule(self.delay, self.run_at)?;
        let expiry = self.expiry.or(T::TTL.map(Expiry::Ttl));
        let (deadline, ttl_us) = validate_expiry(expiry, self.delay, self.run_at)?;
        let payload = serde_json::to_vec(&self.task).map_err(Error::Serialize)?;
        let limit = self.payload_limit.unwrap_or_else(payload_limit);
        if payload.len() > limit {
            return Err(Error::PayloadTooLarge {
                size: payload.len(),
                limit,
            });
        }
        let unique = match self.unique.unwrap_or(T::UNIQUE) {
            Some(u) => Some(u.prepare(T::NAME, &payload)?),
            None => None,
        };
        let order = match (&self.order_key, T::ORDERED) {
            (Some(k), _) => {
                validate_name("order key", k, MAX_NAME_LEN)?;
                Some(crate::ordered::explicit_key(&queue, k))
            }
            (None, Some(o)) => Some(o.key(&queue, T::NAME, &payload)?),
            (None, None) => None,
        };
        if order.is_some() && unique.is_some() {
            return Err(Error::InvalidOption(format!(
                "task {:?} is ordered and unique: an ordered task cannot be unique (its place \
                 in its key's order is taken at enqueue)",
                T::NAME
            )));
        }
        let order = order.map(|key| (key, ordered_dead_after.is_some()));
        Ok(Prepared {
            queue,
            name: T::NAME,
            payload,
            priority: self.priority.unwrap_or(T::PRIORITY),
            max_attempts,
            delay_us,
            run_at: self.run_at,
            deadline,
            ttl_us,
            idempotency_key: self.idempotency_key,
            trace_context: trace(self.trace_context),
            unique,
            order,
        })
    }
}

/// A validated task ready to insert.
pub(crate) struct Prepared {
    pub(crate) queue: String,
    pub(crate) name: &'static str,
    pub(crate) payload: Vec<u8>,
    pub(crate) priority: i16,
    pub(crate) max_attempts: u32,
    delay_us: i64,
    run_at: Option<DateTime<Utc>>,
    pub(crate) deadline: Option<DateTime<Utc>>,
    /// Time to live from the insert (µs), when the deadline is relative.
    pub(crate) ttl_us: Option<i64>,
    idempotency_key: Option<String>,
    pub(crate) trace_context: Option<String>,
    unique: Option<PreparedUnique>,
    /// The order key and whether a death lets the key go on, for an ordered task.
    order: Option<([u8; 32], bool)>,
}

impl Prepared {
    /// Whether this row must be inserted on its own (a duplicate is possible).
    pub(crate) fn keyed(&self) -> bool {
        self.idempotency_key.is_some() || self.unique.is_some() || self.order.is_some()
    }

    /// The row to insert, with its unique identity's key and window end when it has one.
    pub(crate) fn row<'a>(
        &'a self,
        unique_key: Option<&'a [u8]>,
        unique_expires_us: Option<i64>,
    ) -> NewTask<'a> {
        NewTask {
            queue: &self.queue,
            name: self.name,
            payload: &self.payload,
            priority: self.priority,
            max_attempts: self.max_attempts,
            delay_us: self.delay_us,
            run_at: self.run_at,
            deadline: self.deadline,
            ttl_us: self.ttl_us,
            idempotency_key: self.idempotency_key.as_deref(),
            trace_context: self.trace_context.as_deref(),
            unique_key,
            unique_while: self.unique.as_ref().map(PreparedUnique::while_value),
            unique_expires_us,
        }
    }

    /// Inserts the row. `clock` caches the database clock (µs since the epoch) for windowed
    /// identities: read on first need, reused by the rest of an `enqueue_many` call.
    pub(crate) async fn insert(
        &self,
        mut conn: Conn<'_>,
        clock: &mut Option<i64>,
    ) -> Result<Enqueued> {
        let (unique_key, unique_expires_us) = match &self.unique {
            Some(u) => {
                if u.needs_clock() && clock.is_none() {
                    *clock = Some(conn.db_clock_us().await?);
                }
                (Some(u.key(*clock)), u.window_end_us(*clock))
            }
            None => (None, None),
        };
        let row = self.row(unique_key.as_ref().map(|k| k.as_slice()), unique_expires_us);
        let inserted = match &self.order {
            Some((key, dead_skips)) => {
                let order = OrderKey {
                    key,
                    dead_skips: *dead_skips,
                };
                conn.task_insert_ordered(&row, &order).await?
            }
            None => conn.task_insert(&row).await?,
        };
        let out = match inserted {
            Inserted::New(id) => Enqueued {
                id,
                duplicate: false,
            },
            Inserted::Duplicate(id) => Enqueued {
                id,
                duplicate: true,
            },
        };
        if !out.duplicate {
            crate::metrics::enqueued(&self.queue, self.name);
        }
        tracing::debug!(task_id = %out.id, task = self.name, queue = %self.queue, duplicate = out.duplicate, "enqueued");
        Ok(out)
    }
}

/// Converts a task, or a task with options ([`Enqueue`]), into an [`Enqueue`] for
/// [`enqueue_many`].
pub trait IntoEnqueue {
    /// The task type.
    type Task: Task;
    /// The task with its options.
    fn into_enqueue(self) -> Enqueue<Self::Task>;
}

impl<T: Task> IntoEnqueue for T {
    type Task = T;
    fn into_enqueue(self) -> Enqueue<T> {
        Enqueue::new(self)
    }
}

impl<T: Task> IntoEnqueue for Enqueue<T> {
    type Task = T;
    fn into_enqueue(self) -> Enqueue<T> {
        self
    }
}

/// Inserts many tasks on the caller's transaction or connection, many rows per statement;
/// never begins, commits or rolls back. Returns one [`Enqueued`] per input task, in input
/// order.
///
/// - **All or nothing on invalid input**: every task is validated (names, options, payload
///   size) before anything is written; the first invalid task's error is returned and no
///   statement is sent.
/// - **Rows without an idempotency key** are written with one `INSERT … SELECT … FROM
///   JSON_TABLE` per run of up to 5,000 consecutive such rows (or 2 MiB). When the server
///   guarantees that one statement's ids are consecutive (`innodb_autoinc_lock_mode` 0 or 1,
///   the MariaDB default; checked once per call) their ids are derived from
///   `LAST_INSERT_ID()`. Under lock mode 2 (MySQL 8's default, and required by Galera) ids
///   may interleave with concurrent inserts: the statement then marks its rows with a random
///   batch marker and reads their ids back (one more primary-key range read per statement).
///   The inserted row count is verified either way.
/// - **Rows with an idempotency key or a unique identity** ([`Enqueue::with_unique`],
///   [`Task::UNIQUE`]) are inserted one statement per row, exactly like
///   [`Enqueue::enqueue_tx`]: a key or identity that is taken (including by a row earlier in
///   the same batch) inserts nothing for that input and returns the holder's id with
///   `duplicate = true`, so each identity yields one task and every input learns which. The
///   window of a windowed identity is computed from one reading of the database clock per
///   call.
/// - New rows get ascending ids in input order.
/// - Like `enqueue_tx`, this does not wake local workers; call [`crate::worker::notify`] for the
///   queue after committing to skip the poll delay.
///
/// ```no_run
/// # use taskq::{Task, TaskContext, TaskError};
/// # #[derive(serde::Serialize, serde::Deserialize)] struct Mail { to: String }
/// # impl Task for Mail { const NAME: &'static str = "mail";
/// #   async fn run(self, _: TaskContext) -> Result<(), TaskError> { Ok(()) } }
/// # async fn f(pool: sqlx::MySqlPool) -> taskq::Result<()> {
/// let mut tx = pool.begin().await?;
/// let mails = (0..1000).map(|i| Mail { to: format!("user{i}@example.com") });
/// let ids = taskq::enqueue::enqueue_many(&mut tx, mails).await?;
/// tx.commit().await?;
/// taskq::worker::notify(Mail::QUEUE);
/// assert_eq!(ids.len(), 1000);
/// # Ok(()) }
/// ```
pub async fn enqueue_many<C, I>(conn: &mut C, tasks: I) -> Result<Vec<Enqueued>>
where
    C: AsConnection + ?Sized,
    I: IntoIterator,
    I::Item: IntoEnqueue,
{
    let prepared = tasks
        .into_iter()
        .map(|t| t.into_enqueue().prepare())
        .collect::<Result<Vec<_>>>()?;
    insert_many(conn_of(conn), &prepared).await
}

async fn insert_many(mut conn: Conn<'_>, rows: &[Prepared]) -> Result<Vec<Enqueued>> {
    let mut out = Vec::with_capacity(rows.len());
    let mut clock = None;
    let mut i = 0;
    while i < rows.len() {
        if rows[i].keyed() {
            out.push(rows[i].insert(conn.reborrow(), &mut clock).await?);
            i += 1;
            continue;
        }
        // A run of rows without a key: as few statements as the backend can.
        let start = i;
        while i < rows.len() && !rows[i].keyed() {
            i += 1;
        }
        let run: Vec<NewTask<'_>> = rows[start..i].iter().map(|r| r.row(None, None)).collect();
        let ids = conn.task_insert_rows(&run).await?;
        if ids.len() != run.len() {
            return Err(Error::Database(sqlx::Error::Protocol(format!(
                "batch enqueue of {} tasks returned {} ids",
                run.len(),
                ids.len()
            ))));
        }
        out.extend(ids.into_iter().map(|id| Enqueued {
            id,
            duplicate: false,
        }));
        for r in &rows[start..i] {
            crate::metrics::enqueued(&r.queue, r.name);
        }
        tracing::debug!(tasks = i - start, "enqueued a batch");
    }
    Ok(out)
}

/// Checks a delay / run-at and returns the delay in microseconds.
pub(crate) fn validate_schedule(delay: Duration, run_at: Option<DateTime<Utc>>) -> Result<i64> {
    if delay > MAX_DELAY {
        return Err(Error::InvalidSchedule(format!(
            "delay of {delay:?} exceeds the maximum of {} days",
            MAX_DELAY.as_secs() / 86_400
        )));
    }
    if let Some(at) = run_at {
        let min = DateTime::<Utc>::UNIX_EPOCH;
        let max = Utc::now() + MAX_DELAY;
        if at < min || at > max {
            return Err(Error::InvalidSchedule(format!(
                "run_at {at} is outside 1970-01-01 ..= now + 10 years"
            )));
        }
    }
    Ok(delay.as_micros() as i64)
}

/// Checks a deadline or time to live against the schedule; returns the absolute deadline or
/// the time to live in microseconds (at most one is set). A task that could only become due at
/// or after its deadline is refused (it could never run); that is checked where both are on
/// the same footing (two durations from the insert, or two absolute times), since the client
/// clock is not the database's.
fn validate_expiry(
    expiry: Option<Expiry>,
    delay: Duration,
    run_at: Option<DateTime<Utc>>,
) -> Result<(Option<DateTime<Utc>>, Option<i64>)> {
    match expiry {
        None => Ok((None, None)),
        Some(Expiry::Ttl(ttl)) => {
            if ttl.is_zero() || ttl > MAX_DELAY {
                return Err(Error::InvalidSchedule(format!(
                    "ttl of {ttl:?} is outside (0, {} days]",
                    MAX_DELAY.as_secs() / 86_400
                )));
            }
            if run_at.is_none() && delay >= ttl {
                return Err(Error::InvalidSchedule(format!(
                    "ttl of {ttl:?} ends before the delay of {delay:?}: the task would expire before it is due"
                )));
            }
            Ok((None, Some(ttl.as_micros() as i64)))
        }
        Some(Expiry::At(at)) => {
            let max = Utc::now() + MAX_DELAY;
            if at < DateTime::<Utc>::UNIX_EPOCH || at > max {
                return Err(Error::InvalidSchedule(format!(
                    "deadline {at} is outside 1970-01-01 ..= now + 10 years"
                )));
            }
            if let Some(due) = run_at
                && due >= at
            {
                return Err(Error::InvalidSchedule(format!(
                    "deadline {at} is not after run_at {due}: the task would expire before it is due"
                )));
            }
            Ok((Some(at), None))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        assert!(validate_name("queue", "orders", 64).is_ok());
        for bad in ["", " x", "x ", "a\nb", &"q".repeat(65)] {
            let e = validate_name("queue", bad, 64).unwrap_err();
            assert!(
                matches!(e, Error::InvalidName { what: "queue", .. }),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn schedules_are_checked() {
        assert_eq!(
            validate_schedule(Duration::from_millis(5), None).unwrap(),
            5000
        );
        assert!(validate_schedule(MAX_DELAY + Duration::from_secs(1), None).is_err());
        let far = Utc::now() + chrono::Duration::days(365 * 11);
        assert!(validate_schedule(Duration::ZERO, Some(far)).is_err());
        let past = DateTime::<Utc>::from_timestamp(-10, 0).unwrap();
        assert!(validate_schedule(Duration::ZERO, Some(past)).is_err());
    }

    #[test]
    fn deadlines_are_checked() {
        let s = Duration::from_secs;
        let ok = |e, d, r| validate_expiry(Some(e), d, r);
        assert_eq!(
            ok(Expiry::Ttl(s(60)), s(59), None).unwrap(),
            (None, Some(60_000_000))
        );
        for (ttl, delay) in [
            (s(0), s(0)),
            (s(60), s(60)),
            (s(60), s(61)),
            (MAX_DELAY + s(1), s(0)),
        ] {
            let e = ok(Expiry::Ttl(ttl), delay, None).unwrap_err();
            assert!(matches!(e, Error::InvalidSchedule(_)), "{ttl:?} {delay:?}");
        }
        let now = Utc::now();
        let at = now + chrono::Duration::minutes(5);
        assert_eq!(
            ok(Expiry::At(at), s(0), Some(now)).unwrap(),
            (Some(at), None)
        );
        // An absolute deadline is not compared with a relative delay (different clocks).
        assert!(ok(Expiry::At(at), s(3600), None).is_ok());
        assert!(ok(Expiry::At(at), s(0), Some(at)).is_err());
        let far = now + chrono::Duration::days(365 * 11);
        assert!(ok(Expiry::At(far), s(0), None).is_err());
        let past = DateTime::<Utc>::from_timestamp(-10, 0).unwrap();
        assert!(ok(Expiry::At(past), s(0), None).is_err());
        // A deadline already in the past (client clock) is accepted: the task expires.
        assert!(ok(Expiry::At(now - chrono::Duration::minutes(1)), s(0), None).is_ok());
        assert_eq!(validate_expiry(None, s(5), None).unwrap(), (None, None));
    }
}
