//! Handler registry: what `#[task]` registers through `inventory`, and the type-erased
//! handler table a worker runs from.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use crate::context::{StateRequirement, TaskContext};
use crate::error::{Error, Result, TaskError};
use crate::followup::{OnDead, OnSuccess};
use crate::retry::Backoff;
use crate::schedule::{Declared, ScheduleDef};
use crate::task::Task;

/// A boxed handler future.
pub(crate) type BoxFuture = Pin<Box<dyn Future<Output = Result<(), TaskError>> + Send>>;

/// A registered task kind: its settings and a type-erased way to run it from a payload.
///
/// `#[task]` submits one per task to `inventory`; [`WorkerBuilder::register`](crate::WorkerBuilder::register)
/// adds hand-written [`Task`] impls.
#[derive(Clone, Copy)]
pub struct Registration {
    pub(crate) name: &'static str,
    pub(crate) queue: &'static str,
    pub(crate) type_name: fn() -> &'static str,
    pub(crate) timeout: Option<Duration>,
    pub(crate) backoff: Backoff,
    pub(crate) max_snoozes: u32,
    pub(crate) required_state: fn() -> Vec<StateRequirement>,
    pub(crate) run: fn(&[u8], TaskContext) -> std::result::Result<BoxFuture, serde_json::Error>,
    /// The schedule declared with the task ([`Task::schedule`]), validated.
    pub(crate) schedule: fn() -> Option<Result<ScheduleDef>>,
    /// [`Task::ON_DEAD`].
    pub(crate) on_dead: Option<OnDead>,
    /// [`Task::ON_SUCCESS`].
    pub(crate) on_success: Option<OnSuccess>,
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
            required_state: T::required_state,
            run: run_erased::<T>,
            schedule: schedule_erased::<T>,
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
}

inventory::collect!(Registration);

/// Every task registered with `#[task]` in this binary.
pub fn registered() -> Vec<Registration> {
    inventory::iter::<Registration>
        .into_iter()
        .copied()
        .collect()
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
