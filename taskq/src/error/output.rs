//! [`OutputError`]: why a task's output could not be recorded, or a step's could not be read.

use taskq_driver::state::TaskId;

/// Why a handler's output was not recorded ([`TaskContext::set_output`]) or a dependency's
/// output could not be read ([`TaskContext::step_output`]). It reaches the worker as the
/// source of a permanent [`TaskError`]: the attempt ends `dead` with this text in
/// `last_error`, since running it again would meet the same problem. Downcast
/// [`TaskError::source`] to tell the cases apart.
///
/// [`TaskContext::set_output`]: crate::TaskContext::set_output
/// [`TaskContext::step_output`]: crate::TaskContext::step_output
/// [`TaskError`]: crate::TaskError
/// [`TaskError::source`]: crate::TaskError::source
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OutputError {
    /// The output's JSON is larger than the worker's limit
    /// ([`WorkerBuilder::output_limit`](crate::worker::WorkerBuilder::output_limit), 64 KiB by
    /// default). It is not stored, and the task does not succeed: a step after it never runs
    /// without it.
    #[error(
        "output of {bytes} bytes of JSON exceeds the worker's output limit of {limit} bytes (WorkerBuilder::output_limit); it was not stored"
    )]
    TooLarge {
        /// Size of the output's JSON.
        bytes: usize,
        /// The worker's limit.
        limit: usize,
    },
    /// The output does not serialize to JSON (serde's message).
    #[error("output does not serialize to JSON: {0}")]
    NotSerializable(String),
    /// The task reading a step's output is not a workflow step.
    #[error("task {0} is not a workflow step: it has no steps to read the output of")]
    NotAStep(TaskId),
    /// The task's workflow has no step of this name.
    #[error("the workflow has no step named {0:?}")]
    UnknownStep(String),
    /// The named step is not one the reading step runs after (`step_after` / `cleanup_after`),
    /// so it may not have ended yet.
    #[error(
        "step {0:?} is not one this step runs after: only the output of a dependency can be read"
    )]
    NotADependency(String),
    /// The step's output does not decode as the type asked for.
    #[error("the output of step {step:?} does not decode as {ty}: {error}")]
    Undecodable {
        /// The step.
        step: String,
        /// The type asked for.
        ty: &'static str,
        /// serde's message.
        error: String,
    },
}
