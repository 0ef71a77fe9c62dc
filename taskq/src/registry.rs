//! Handler registry: what `#[task]` registers through `inventory`, and the type-erased
//! handler table a worker runs from.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use crate::context::{DataRequirement, TaskContext};
use crate::error::{Error, Result, TaskError};
use crate::retry::Backoff;
use crate::task::Task;
use crate::task::enqueue::{AsConnection, Enqueue, Enqueued, Prepared};
use crate::task::followup::{OnDead, OnSuccess};
use crate::task::schedule::{Declared, ScheduleDef};

/// A boxed handler future.
pub(crate) type BoxFuture = Pin<Box<dyn Future<Output = Result<(), TaskError>> + Send>>;

/// A registered task kind: its settings and a type-erased way to run it from a payload.
///
/// `#[task]` submits one per task to `inventory`; [`WorkerBuilder::register`](crate::worker::WorkerBuilder::register)
/// adds hand-written [`Task`] impls.
#[derive(Clone, Copy)]
pub struct Registration {
    pub(crate) name: &'static str,
    pub(crate) queue: &'static str,
    pub(crate) type_name: fn() -> &'static str,
    pub(crate) timeout: Option<Duration>,
    pub(crate) backoff: Backoff,
    pub(crate) max_snoozes: u32,
    pub(crate) required_data: fn() -> Vec<DataRequirement>,
    pub(crate) run: fn(&[u8], TaskContext) -> std::result::Result<BoxFuture, serde_json::Error>,
    /// The schedule declared with the task ([`Task::schedule`]), validated.
    pub(crate) schedule: fn() -> Option<Result<ScheduleDef>>,
    /// [`Task::ON_DEAD`].
    pub(crate) on_dead: Option<OnDead>,
    /// [`Task::ON_SUCCESS`].
    pub(crate) on_success: Option<OnSuccess>,
    /// Decodes a JSON payload as the task and validates it for an enqueue.
    pub(crate) prepare_json: fn(&[u8], &JsonEnqueueOptions) -> Result<Prepared>,
}

/// Per-enqueue overrides for [`Registration::enqueue_json`]; `None` keeps the task's own
/// setting (its queue, priority, max attempts; no delay, no idempotency key).
#[derive(Debug, Clone, Default)]
pub struct JsonEnqueueOptions {
    /// Another queue than the task's.
    pub queue: Option<String>,
    /// Another priority (lower runs first).
    pub priority: Option<i16>,
    /// Another number of attempts (at least 1).
    pub max_attempts: Option<u32>,
    /// Runs no earlier than this long after the insert (database clock).
    pub delay: Option<Duration>,
    /// At most one task per (task name, key); see [`Enqueue::with_idempotency_key`].
    pub idempotency_key: Option<String>,
}

impl std::fmt::Debug for Registration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registration")
            .field("name", &self.name)
            .field("queue", &self.queue)
            .field("type", &(self.type_name)())
            .finish()
    }
}

fn run_erased<T: Task>(
    payload: &[u8],
    cx: TaskContext,
) -> std::result::Result<BoxFuture, serde_json::Error> {
    let task: T = serde_json::from_slice(payload)?;
    Ok(Box::pin(task.run(cx)))
}

fn prepare_json_erased<T: Task>(payload: &[u8], o: &JsonEnqueueOptions) -> Result<Prepared> {
    let task: T = serde_json::from_slice(payload).map_err(|source| Error::InvalidPayload {
        name: T::NAME.to_owned(),
        source,
    })?;
    let mut e = Enqueue::new(task);
    if let Some(q) = &o.queue {
        e = e.with_queue(q.clone());
    }
    if let Some(p) = o.priority {
        e = e.with_priority(p);
    }
    if let Some(n) = o.max_attempts {
        e = e.with_max_attempts(n);
    }
    if let Some(d) = o.delay {
        e = e.with_delay(d);
    }
    if let Some(k) = &o.idempotency_key {
        e = e.with_idempotency_key(k.clone());
    }
    e.prepare()
}

fn schedule_erased<T: Task>() -> Option<Result<ScheduleDef>> {
    T::schedule().map(|s| s.into_def(Declared::Task))
}

impl Registration {
    /// The registration of `T` (usable in `const` and `inventory::submit!`).
    pub const fn of<T: Task>() -> Self {
        Self {
            name: T::NAME,
            queue: T::QUEUE,
            type_name: std::any::type_name::<T>,
            timeout: T::TIMEOUT,
            backoff: T::BACKOFF,
            max_snoozes: T::MAX_SNOOZES,
            required_data: T::required_data,
            run: run_erased::<T>,
            schedule: schedule_erased::<T>,
            prepare_json: prepare_json_erased::<T>,
            on_dead: T::ON_DEAD,
            on_success: T::ON_SUCCESS,
        }
    }
    /// The stable task name.
    pub fn name(&self) -> &'static str {
        self.name
    }
    /// The task's default queue.
    pub fn queue(&self) -> &'static str {
        self.queue
    }
    /// The Rust type implementing the task.
    pub fn type_name(&self) -> &'static str {
        (self.type_name)()
    }

    /// Enqueues this task from a JSON payload (e.g. one received over HTTP from a service in
    /// another language), on its own (autocommit), and wakes this process's workers for its
    /// queue.
    ///
    /// The payload is first decoded into the task's payload type, so one that does not fit
    /// gives [`Error::InvalidPayload`] with serde's message and inserts nothing; the row then
    /// stores the task's own serialization of the decoded value (unknown fields dropped,
    /// defaults filled), with the task's declared options (queue, priority, max attempts,
    /// TTL, unique identity) unless `options` overrides them. Every check of
    /// [`Enqueue::enqueue`] applies (names, payload size, options).
    pub async fn enqueue_json<DB: crate::backend::Backend>(
        &self,
        pool: &sqlx::Pool<DB>,
        payload: &[u8],
        options: &JsonEnqueueOptions,
    ) -> Result<Enqueued> {
        let mut conn = match pool.acquire().await {
            Ok(c) => c,
            Err(e) => return Err(crate::backend::Store::of(pool.clone()).error(e).await),
        };
        let out = self.enqueue_json_tx(&mut conn, payload, options).await?;
        crate::wake::notify(options.queue.as_deref().unwrap_or(self.queue));
        Ok(out)
    }

    /// Like [`enqueue_json`](Self::enqueue_json), on the caller's transaction or connection
    /// (never begins, commits or rolls back; see [`Enqueue::enqueue_tx`]). Call
    /// [`notify`](crate::worker::notify) for the queue after committing to wake this process's
    /// workers at once.
    pub async fn enqueue_json_tx<C: AsConnection + ?Sized>(
        &self,
        conn: &mut C,
        payload: &[u8],
        options: &JsonEnqueueOptions,
    ) -> Result<Enqueued> {
        let prepared = (self.prepare_json)(payload, options)?;
        prepared
            .insert(crate::task::enqueue::conn_of(conn), &mut None)
            .await
    }
}

inventory::collect!(Registration);

/// Every task registered with `#[task]` in this binary.
pub fn registered() -> Vec<Registration> {
    inventory::iter::<Registration>
        .into_iter()
        .copied()
        .collect()
}

/// The task registered with `#[task]` in this binary under `name`, if any (the first one found
/// if several types share the name; a worker refuses to start in that case).
///
/// ```no_run
/// # async fn f(pool: sqlx::MySqlPool) -> taskq::Result<()> {
/// let task = taskq::registry::registration("order_export")
///     .ok_or_else(|| taskq::Error::UnknownTask("order_export".into()))?;
/// let queued = task
///     .enqueue_json(&pool, br#"{"order_id": 42}"#, &Default::default())
///     .await?;
/// println!("task {} on queue {}", queued.id, task.queue());
/// # Ok(()) }
/// ```
pub fn registration(name: &str) -> Option<Registration> {
    inventory::iter::<Registration>
        .into_iter()
        .find(|r| r.name == name)
        .copied()
}

/// Handlers by name; fails when two registrations share a name (naming both types).
pub(crate) fn by_name(regs: &[Registration]) -> Result<HashMap<&'static str, Registration>> {
    let mut map: HashMap<&'static str, Registration> = HashMap::new();
    for r in regs {
        if let Some(prev) = map.get(r.name) {
            if prev.type_name() == r.type_name() {
                continue; // the same type registered twice (inventory + builder): harmless
            }
            return Err(Error::DuplicateTaskName {
                name: r.name.to_owned(),
                first: prev.type_name(),
                second: r.type_name(),
            });
        }
        map.insert(r.name, *r);
    }
    Ok(map)
}
