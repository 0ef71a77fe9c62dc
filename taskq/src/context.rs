//! What a handler can receive besides its payload: the task's own [`TaskContext`], a
//! [`CancelSignal`], and shared [`Data`] registered on the worker.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde::{Serialize, de::DeserializeOwned};
use tokio::sync::watch;

use crate::backend::Store;
use crate::error::{OutputError, TaskError};
use taskq_driver::rows::StepOutput;
use taskq_driver::state::TaskId;

/// What a handler recorded with [`TaskContext::set_output`]: its JSON, or why it could not be
/// recorded (the attempt then fails whatever the handler returns).
pub(crate) type OutputSlot = Mutex<Option<Result<String, OutputError>>>;

/// Metadata of the attempt being run, handed to every handler.
#[derive(Clone, Debug)]
pub struct TaskContext {
    pub(crate) id: TaskId,
    pub(crate) name: Arc<str>,
    pub(crate) queue: Arc<str>,
    pub(crate) attempt: u32,
    pub(crate) max_attempts: u32,
    pub(crate) snoozes: u32,
    pub(crate) lease_epoch: u64,
    pub(crate) worker_id: Arc<str>,
    pub(crate) cancel: CancelSignal,
    pub(crate) data: Arc<DataMap>,
    pub(crate) trace_context: Option<Arc<str>>,
    /// The store step outputs are read from; `None` when the task is not a workflow step
    /// (or in [`for_test`](Self::for_test)).
    pub(crate) steps: Option<Store>,
    pub(crate) output: Arc<OutputSlot>,
    pub(crate) output_limit: usize,
}

impl TaskContext {
    /// The task's id.
    pub fn id(&self) -> TaskId {
        self.id
    }
    /// The task's stable name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The queue it was claimed from.
    pub fn queue(&self) -> &str {
        &self.queue
    }
    /// This attempt's number, starting at 1.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }
    /// Attempts allowed before the task goes to `dead`.
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }
    /// How many times the task snoozed before this run ([`TaskError::snooze`]; those runs
    /// did not count as attempts).
    pub fn snoozes(&self) -> u32 {
        self.snoozes
    }
    /// The fencing token this attempt holds; every write-back is conditional on it.
    pub fn lease_epoch(&self) -> u64 {
        self.lease_epoch
    }
    /// Id of the worker running this attempt.
    pub fn worker_id(&self) -> &str {
        &self.worker_id
    }
    /// Fires when this attempt should stop: lease lost, timeout, shutdown grace elapsed, or
    /// the task canceled ([`CancelReason`]).
    pub fn cancel_signal(&self) -> &CancelSignal {
        &self.cancel
    }
    /// The trace context recorded when the task was enqueued (see [`crate::settings::set_trace_context_hook`]).
    pub fn trace_context(&self) -> Option<&str> {
        self.trace_context.as_deref()
    }
    /// A clone of the shared data of type `T`, if registered on the worker
    /// ([`WorkerBuilder::data`](crate::worker::WorkerBuilder::data)).
    pub fn data<T: Clone + Send + Sync + 'static>(&self) -> Option<T> {
        self.data.get::<T>()
    }

    /// Records `value` as the task's output, stored with its success (in the write-back's own
    /// statement) for the steps after it in a workflow ([`step_output`](Self::step_output)) and
    /// for [`Client::wait_output`](crate::Client::wait_output). A `#[taskq::task]` fn that
    /// returns `Result<T, E>` calls it with its `Ok` value; a hand-written [`Task`](crate::Task)
    /// calls it before returning `Ok(())`. `()` records no output; a second call replaces the
    /// first; nothing is stored unless the attempt succeeds.
    ///
    /// An output that does not serialize, or whose JSON is larger than the worker's
    /// [`output_limit`](crate::worker::WorkerBuilder::output_limit) (64 KiB by default), is
    /// refused with a permanent [`TaskError`] whose source is an [`OutputError`], and it fails
    /// the attempt (dead, the error in `last_error`) even if the handler then returns `Ok`.
    pub fn set_output<T: Serialize + ?Sized + 'static>(&self, value: &T) -> Result<(), TaskError> {
        let recorded = if TypeId::of::<T>() == TypeId::of::<()>() {
            None
        } else {
            Some(
                serde_json::to_string(value)
                    .map_err(|e| OutputError::NotSerializable(e.to_string()))
                    .and_then(|json| {
                        crate::defaults::check_output(json.len(), self.output_limit).map(|()| json)
                    }),
            )
        };
        let refused = match &recorded {
            Some(Err(e)) => Some(e.clone()),
            _ => None,
        };
        *self.output.lock().unwrap_or_else(|p| p.into_inner()) = recorded;
        match refused {
            Some(e) => Err(TaskError::permanent(e)),
            None => Ok(()),
        }
    }

    /// The output of the step named `step` of this task's workflow, which must be one this
    /// step runs after: `Ok(None)` when that step stored none (it returned `()`; or, for a
    /// cleanup step, it did not succeed). A normal step runs only after its dependencies
    /// succeeded with their outputs stored. One read on the worker's database (the pool it
    /// was built on).
    ///
    /// A task that is not a step, a name that is no step of the workflow, a step this one does
    /// not run after, and an output that does not decode as `T` are permanent errors (their
    /// source an [`OutputError`]); a database error is retried.
    pub async fn step_output<T: DeserializeOwned>(
        &self,
        step: &str,
    ) -> Result<Option<T>, TaskError> {
        let refuse = |e: OutputError| Err(TaskError::permanent(e));
        let Some(store) = &self.steps else {
            return refuse(OutputError::NotAStep(self.id));
        };
        let found = match store.workflow_step_output(self.id, step).await {
            Ok(found) => found,
            Err(e) => return Err(TaskError::retry(store.error(e).await)),
        };
        match found {
            StepOutput::NotAStep => refuse(OutputError::NotAStep(self.id)),
            StepOutput::UnknownStep => refuse(OutputError::UnknownStep(step.to_owned())),
            StepOutput::NotADependency => refuse(OutputError::NotADependency(step.to_owned())),
            StepOutput::Output(None) => Ok(None),
            StepOutput::Output(Some(json)) => match serde_json::from_str(&json) {
                Ok(v) => Ok(Some(v)),
                Err(e) => refuse(OutputError::Undecodable {
                    step: step.to_owned(),
                    ty: std::any::type_name::<T>(),
                    error: e.to_string(),
                }),
            },
        }
    }

    /// What [`set_output`](Self::set_output) recorded: the output's JSON (`Ok(None)`: none),
    /// or why it was refused. For unit tests of a handler run with [`for_test`](Self::for_test).
    pub fn recorded_output(&self) -> Result<Option<String>, OutputError> {
        self.output
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .transpose()
    }

    /// A context for calling a handler directly in unit tests (no worker, no database).
    pub fn for_test(id: u64, data: DataMap) -> Self {
        Self {
            id: TaskId(id),
            name: "test".into(),
            queue: "test".into(),
            attempt: 1,
            max_attempts: 1,
            snoozes: 0,
            lease_epoch: 1,
            worker_id: "test".into(),
            cancel: CancelSignal::never(),
            data: Arc::new(data),
            trace_context: None,
            steps: None,
            output: Arc::default(),
            output_limit: crate::defaults::DEFAULT_OUTPUT_LIMIT,
        }
    }
}

/// Why an attempt was asked to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelReason {
    /// The lease was lost: another worker may already run the task.
    LeaseLost,
    /// The task's timeout elapsed.
    Timeout,
    /// The worker is shutting down and the grace period elapsed.
    Shutdown,
    /// The task was canceled (`Client::cancel` / `taskq cancel` on the running task); the
    /// worker learns of it at its next heartbeat. The task ends `canceled` whatever the handler
    /// returns within the cancel grace, except a success (recorded as `succeeded`); a handler
    /// still running after the grace is aborted.
    Canceled,
}

/// A signal the handler can poll or await to stop early; see [`TaskContext::cancel_signal`].
#[derive(Clone, Debug)]
pub struct CancelSignal(watch::Receiver<Option<CancelReason>>);

/// The sending side of a [`CancelSignal`], held by the worker.
#[derive(Debug)]
pub(crate) struct CancelHandle(watch::Sender<Option<CancelReason>>);

impl CancelHandle {
    pub(crate) fn new() -> (Self, CancelSignal) {
        let (tx, rx) = watch::channel(None);
        (Self(tx), CancelSignal(rx))
    }
    /// Why the attempt was canceled, if it was.
    pub(crate) fn reason(&self) -> Option<CancelReason> {
        *self.0.borrow()
    }
    pub(crate) fn cancel(&self, reason: CancelReason) {
        self.0.send_if_modified(|cur| {
            if cur.is_none() {
                *cur = Some(reason);
                true
            } else {
                false
            }
        });
    }
}

impl CancelSignal {
    /// A signal that never fires.
    pub fn never() -> Self {
        let (tx, rx) = watch::channel(None);
        std::mem::forget(tx);
        Self(rx)
    }
    /// Why the attempt was canceled, if it was.
    pub fn reason(&self) -> Option<CancelReason> {
        *self.0.borrow()
    }
    /// Whether the attempt was canceled.
    pub fn is_canceled(&self) -> bool {
        self.reason().is_some()
    }
    /// Completes when the attempt is canceled (never, if it is not).
    pub async fn canceled(&self) -> CancelReason {
        let mut rx = self.0.clone();
        loop {
            if let Some(r) = *rx.borrow_and_update() {
                return r;
            }
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }
}

/// Type-keyed shared data (one value per type) for all handlers of a worker.
#[derive(Default, Debug)]
pub struct DataMap {
    map: HashMap<TypeId, (Box<dyn Any + Send + Sync>, &'static str)>,
}

impl DataMap {
    /// An empty map.
    pub fn new() -> Self {
        Self::default()
    }
    /// Adds (or replaces) the value of type `T`.
    pub fn insert<T: Clone + Send + Sync + 'static>(&mut self, value: T) {
        self.map.insert(
            TypeId::of::<T>(),
            (Box::new(value), std::any::type_name::<T>()),
        );
    }
    /// A clone of the value of type `T`.
    pub fn get<T: Clone + Send + Sync + 'static>(&self) -> Option<T> {
        self.map
            .get(&TypeId::of::<T>())
            .and_then(|(v, _)| v.downcast_ref::<T>())
            .cloned()
    }
    /// Whether a value of this type is present.
    pub fn contains(&self, req: &DataRequirement) -> bool {
        self.map.contains_key(&req.type_id)
    }
}

/// A data type a task needs; see [`Task::required_data`](crate::Task::required_data).
#[derive(Debug, Clone, Copy)]
#[doc(hidden)]
pub struct DataRequirement {
    /// `TypeId` of the data.
    pub type_id: TypeId,
    /// Its Rust type name, for error messages.
    pub type_name: &'static str,
}

impl DataRequirement {
    /// The requirement for `T`.
    pub fn of<T: 'static>() -> Self {
        Self {
            type_id: TypeId::of::<T>(),
            type_name: std::any::type_name::<T>(),
        }
    }
}

/// Something a `#[task]` handler parameter can be extracted as, instead of payload.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be injected into a taskq handler",
    note = "injected parameters are `TaskContext`, `CancelSignal`, `Data<T>`, or a type of yours marked `#[inject]` that implements `taskq::context::FromTaskContext`; payload parameters must be plain serde types",
    note = "a parameter whose type is named `TaskContext`, `CancelSignal` or `Data` is injected unless it is marked `#[payload]`"
)]
pub trait FromTaskContext: Sized {
    /// Extracts the value for one attempt.
    fn from_task_context(cx: &TaskContext) -> Result<Self, TaskError>;
    /// The data type this extractor needs, checked when the worker starts.
    fn requirement() -> Option<DataRequirement> {
        None
    }
}

impl FromTaskContext for TaskContext {
    fn from_task_context(cx: &TaskContext) -> Result<Self, TaskError> {
        Ok(cx.clone())
    }
}

impl FromTaskContext for CancelSignal {
    fn from_task_context(cx: &TaskContext) -> Result<Self, TaskError> {
        Ok(cx.cancel.clone())
    }
}

/// A shared value (a database pool, an HTTP client, settings) registered with
/// [`WorkerBuilder::data`](crate::worker::WorkerBuilder::data) and injected into handlers, one value
/// per type; derefs to `T`. Like actix-web's and apalis' `Data`.
///
/// ```
/// use taskq::{Data, TaskError};
/// #[derive(Clone)]
/// struct Mailer { from: String }
///
/// #[taskq::task(queue = "mail")]
/// async fn welcome(user_id: i64, mailer: Data<Mailer>) -> Result<(), TaskError> {
///     let _ = (&mailer.from, user_id);
///     Ok(())
/// }
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct Data<T>(pub T);

impl<T> std::ops::Deref for Data<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T: Clone + Send + Sync + 'static> FromTaskContext for Data<T> {
    fn from_task_context(cx: &TaskContext) -> Result<Self, TaskError> {
        cx.data.get::<T>().map(Data).ok_or_else(|| {
            TaskError::permanent(crate::error::Error::MissingData {
                task: "?",
                ty: std::any::type_name::<T>(),
            })
        })
    }
    fn requirement() -> Option<DataRequirement> {
        Some(DataRequirement::of::<T>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn cancel_fires_once_with_the_first_reason() {
        let (h, s) = CancelHandle::new();
        assert!(!s.is_canceled());
        h.cancel(CancelReason::LeaseLost);
        h.cancel(CancelReason::Shutdown);
        assert_eq!(s.canceled().await, CancelReason::LeaseLost);
        assert_eq!(s.reason(), Some(CancelReason::LeaseLost));
    }

    #[test]
    fn data_map_returns_clones_by_type() {
        let mut m = DataMap::new();
        m.insert(7u32);
        m.insert(String::from("x"));
        assert_eq!(m.get::<u32>(), Some(7));
        assert_eq!(m.get::<String>().as_deref(), Some("x"));
        assert_eq!(m.get::<i64>(), None);
        assert!(m.contains(&DataRequirement::of::<u32>()));
    }

    #[test]
    fn set_output_records_json_nothing_for_unit_and_refuses_past_the_limit() {
        let cx = TaskContext::for_test(1, DataMap::new());
        assert_eq!(cx.recorded_output(), Ok(None));
        cx.set_output(&vec![1, 2]).unwrap();
        assert_eq!(cx.recorded_output(), Ok(Some("[1,2]".into())));
        // `()` records none, replacing what was recorded.
        cx.set_output(&()).unwrap();
        assert_eq!(cx.recorded_output(), Ok(None));
        let big = "x".repeat(crate::defaults::DEFAULT_OUTPUT_LIMIT - 2);
        cx.set_output(&big).unwrap();
        let too_big = OutputError::TooLarge {
            bytes: crate::defaults::DEFAULT_OUTPUT_LIMIT + 1,
            limit: crate::defaults::DEFAULT_OUTPUT_LIMIT,
        };
        let e = cx.set_output(&format!("{big}x")).unwrap_err();
        assert_eq!(e.kind(), crate::error::TaskErrorKind::Permanent);
        assert_eq!(e.source().downcast_ref::<OutputError>(), Some(&too_big));
        assert_eq!(cx.recorded_output(), Err(too_big));
        // A map with non-string keys does not serialize to JSON.
        let map: HashMap<(u8, u8), u8> = [((1, 2), 3)].into();
        let e = cx.set_output(&map).unwrap_err();
        assert!(matches!(
            e.source().downcast_ref::<OutputError>(),
            Some(OutputError::NotSerializable(_))
        ));
    }
}
