//! Runs one claimed task: decode, call the handler in its own tokio task (so a panic is a
//! failure, not a crash), enforce the timeout, react to cancellation, decide the outcome.

use std::any::Any;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use taskq_driver::rules::{ends_order_head, run_end_frees_identity};
use taskq_driver::state::TaskState;

use tracing::Instrument;

use super::lease::{self, AttemptKey, InFlight, Phase};
use super::observe::{self, OutcomeEvent, TaskOutcome};
use super::writeback::WriteBackMsg;
use super::{Shared, WorkerStats, follow, within};
use crate::backend::{Claimed, WriteBack};
use crate::context::{CancelHandle, CancelReason, OutputSlot, TaskContext};
use crate::defaults::MAX_DELAY;
use crate::error::{TaskError, TaskErrorKind, short_type_name};
use crate::info::{UNDECODABLE_PREFIX, exhausted_note};
use crate::metrics;
use crate::task::TaskId;
use crate::task::followup::{DeadTask, SucceededTask, payload_value};

/// Handler slots held by one claimed task (its queue's and the worker's).
pub(crate) struct Slot {
    pub(super) _queue: tokio::sync::OwnedSemaphorePermit,
    pub(super) _global: tokio::sync::OwnedSemaphorePermit,
}

/// Longest error text stored in `last_error`.
const MAX_ERROR_LEN: usize = 8_000;

/// How an attempt ended, before it is turned into a write-back.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// The handler succeeded, with the output it recorded (JSON), if any.
    Succeeded(Option<String>),
    /// The handler asked to run again after this delay without counting the attempt.
    Snoozed(Duration),
    Failed(TaskErrorKind, String, Cause),
    /// The payload does not decode for this task: never retried.
    Undecodable(String),
    /// Aborted without a result (lease lost, or shutdown): nothing is written.
    Abandoned(CancelReason),
    /// A cancel was requested and the handler did not succeed: written as `canceled`.
    Canceled,
    /// The task's last attempt had already ended (its lease expired and a reaper that does not
    /// register its name parked it, see `Claimed::parked_error`): not run, written as `dead`
    /// with that attempt's error and its `on_dead` follow-up.
    Parked,
    /// The lease was over, or about to be, before the handler could start: not run, the task
    /// is released (see `give_back_unstarted`).
    NotStarted,
}

/// What made an attempt fail: the `outcome` of its attempt-history entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cause {
    /// The handler returned an error.
    Error,
    /// The handler ran past its timeout.
    TimedOut,
    /// The handler panicked.
    Panicked,
}

impl Cause {
    fn outcome(self) -> &'static str {
        match self {
            Cause::Error => "failed",
            Cause::TimedOut => "timed_out",
            Cause::Panicked => "panicked",
        }
    }
}

impl Outcome {
    /// The `outcome` label of the handler duration histogram.
    fn label(&self) -> &'static str {
        match self {
            Outcome::Succeeded(_) => "succeeded",
            Outcome::Snoozed(_) => "snoozed",
            Outcome::Failed(..) | Outcome::Undecodable(_) => "failed",
            Outcome::Abandoned(_) => "abandoned",
            Outcome::Canceled => "canceled",
            Outcome::Parked => "parked",
            Outcome::NotStarted => "not_started",
        }
    }
}

/// Starts a claimed task: records its lease in the lease table at once (before the claim loop
/// runs its next statement, which relies on it: see `claim::release_lost_claims`), then
/// spawns its executor.
pub(crate) fn start(
    shared: &Arc<Shared>,
    queue: Arc<str>,
    task: Claimed,
    slot: Slot,
    claim_sent: Instant,
) {
    let (cancel, signal) = CancelHandle::new();
    let cancel = Arc::new(cancel);
    lease::insert(
        shared,
        key(&task),
        InFlight {
            queue: queue.clone(),
            name: task.name.as_str().into(),
            attempt: task.attempt,
            phase: Phase::Running,
            cancel: cancel.clone(),
            abort: None,
            renewed_at: claim_sent,
            lost: false,
        },
    );
    shared.executing.fetch_add(1, Ordering::AcqRel);
    tokio::spawn(run(shared.clone(), queue, task, slot, cancel, signal));
}

async fn run(
    shared: Arc<Shared>,
    queue: Arc<str>,
    task: Claimed,
    slot: Slot,
    cancel: Arc<CancelHandle>,
    signal: crate::context::CancelSignal,
) {
    let id = task.id;
    let name: Arc<str> = task.name.as_str().into();
    // At WARN level, so that a `warn` filter keeps it: failure events then say which task.
    let span = tracing::warn_span!("taskq.task", task_id = id, task = %task.name, queue = %queue,
        attempt = task.attempt, lease_epoch = task.lease_epoch, worker_id = %shared.worker_id,
        queue_wait_ms = task.wait_us / 1000, trace_context = task.trace_context.as_deref());
    if let (Some(link), Some(ctx)) = (&shared.trace_link, &task.trace_context) {
        link(&span, ctx);
    }
    let started = Instant::now();
    // Only when this guard drops, with the outcome queued for write-back (or the task marked
    // abandoned), does this executor stop counting: shutdown waits for `executing == 0`
    // before the final flush. It also drops the lease if the executor panics.
    let mut guard = Done {
        shared: &shared,
        key: key(&task),
        queue: &queue,
        in_flight: true,
        handed_over: false,
    };
    metrics::queue_wait(&queue, &name, task.wait_us);
    metrics::in_flight(&queue, 1.0);
    let outcome = attempt(&shared, &queue, &task, cancel, signal)
        .instrument(span.clone())
        .await;
    metrics::in_flight(&queue, -1.0);
    guard.in_flight = false;
    metrics::handler_finished(&queue, &name, outcome.label(), started.elapsed());
    drop(slot);
    shared.slot_freed.notify_waiters();
    if let Outcome::NotStarted = outcome {
        give_back_unstarted(&shared, &task, &queue, &name)
            .instrument(span)
            .await;
    } else {
        hand_over(&shared, &task, &queue, &name, &span, outcome, started);
    }
    guard.handed_over = true;
}

/// Ends an executor's count, on return or on a panic. A panic after the handler returned
/// (formatting its error, computing the outcome) would otherwise leave the attempt's lease in
/// the lease table, renewed forever by the heartbeat, and shutdown waiting for it: the record
/// is removed (and the handler, if still running, aborted) so the lease ends and the reaper
/// returns the task, as after a crash.
struct Done<'a> {
    shared: &'a Shared,
    key: AttemptKey,
    queue: &'a str,
    in_flight: bool,
    handed_over: bool,
}

impl Drop for Done<'_> {
    fn drop(&mut self) {
        if !self.handed_over {
            if self.in_flight {
                metrics::in_flight(self.queue, -1.0);
            }
            let removed = self.shared.inflight().remove(&self.key);
            if let Some(abort) = removed.and_then(|f| f.abort) {
                abort.abort();
            }
            tracing::error!(
                task_id = self.key.id,
                lease_epoch = self.key.epoch,
                "taskq: the executor panicked; the lease is no longer renewed, and the reaper returns the task once it ends"
            );
        }
        self.shared.executing.fetch_sub(1, Ordering::AcqRel);
        self.shared.slot_freed.notify_waiters();
    }
}

/// A task whose handler was not started because its lease was over, or about to be, when it
/// could start: its record leaves the lease table (no more renewals) and the task is released
/// (pending, epoch + 1, the attempt not counted) with one statement, fenced by the epoch. If
/// that fails, the reaper returns the task once its lease expires (attempt counted).
async fn give_back_unstarted(shared: &Shared, task: &Claimed, queue: &Arc<str>, name: &Arc<str>) {
    shared.inflight().remove(&key(task));
    WorkerStats::add(&shared.stats.late_starts, 1);
    tracing::warn!(
        "taskq: the lease was over, or about to be, before the handler could start (the \
         executor started late: a busy or blocked runtime); releasing the task without running it"
    );
    let lease = [(task.id, task.lease_epoch)];
    match within!(shared, |c| shared.store.task_release(c, &lease)).await {
        Ok(n) if n > 0 => observe::emit(shared, || OutcomeEvent {
            task_id: TaskId(task.id),
            name: name.clone(),
            queue: queue.clone(),
            attempt: task.attempt,
            outcome: TaskOutcome::Released,
            error: None,
            duration: None,
            follow_up: false,
        }),
        Ok(_) => {}
        Err(e) => {
            WorkerStats::add(&shared.stats.db_errors, 1);
            tracing::warn!(error = %e, "taskq: releasing an unstarted task failed; the reaper will return it");
        }
    }
}

/// The lease-table key of this attempt.
fn key(task: &Claimed) -> AttemptKey {
    AttemptKey {
        id: task.id,
        epoch: task.lease_epoch,
    }
}

/// Turns the outcome into a write-back for the write-back loop (`writeback.rs`), or marks the task abandoned.
fn hand_over(
    shared: &Shared,
    task: &Claimed,
    queue: &Arc<str>,
    name: &Arc<str>,
    span: &tracing::Span,
    outcome: Outcome,
    started: Instant,
) {
    let key = key(task);
    let write_back = |state: &'static str,
                      outcome: &'static str,
                      delay: Duration,
                      error: Option<String>| WriteBack {
        name: name.clone(),
        queue: queue.clone(),
        ran: started.elapsed(),
        ..write_back(task, state, outcome, delay, error)
    };
    let _enter = span.enter();
    let elapsed_ms = started.elapsed().as_millis() as u64;
    let handler = shared.handlers.get(task.name.as_str());
    // A snooze beyond the task's bound is a failed attempt that retries after the snooze delay.
    let max_snoozes = handler.map_or(crate::defaults::DEFAULT_MAX_SNOOZES, |h| h.max_snoozes);
    let outcome = match outcome {
        Outcome::Snoozed(d) if task.snoozes >= max_snoozes => Outcome::Failed(
            TaskErrorKind::RetryAfter(d),
            format!(
                "snoozed {} times, the limit (max_snoozes = {max_snoozes}); this snooze counts as a failed attempt",
                task.snoozes
            ),
            Cause::Error,
        ),
        other => other,
    };
    let mut out = match outcome {
        Outcome::Abandoned(reason) => {
            let mut inflight = shared.inflight();
            if reason == CancelReason::Shutdown {
                if let Some(f) = inflight.get_mut(&key) {
                    f.phase = Phase::Abandoned;
                }
            } else {
                inflight.remove(&key);
            }
            drop(inflight);
            tracing::warn!(?reason, elapsed_ms, "attempt abandoned without a result");
            if reason != CancelReason::Shutdown {
                observe::emit(shared, || OutcomeEvent {
                    task_id: TaskId(task.id),
                    name: name.clone(),
                    queue: queue.clone(),
                    attempt: task.attempt,
                    outcome: TaskOutcome::LeaseLost,
                    error: None,
                    duration: Some(started.elapsed()),
                    follow_up: false,
                });
            }
            return;
        }
        Outcome::NotStarted => {
            // Handled by `give_back_unstarted` before this is called; nothing to write.
            shared.inflight().remove(&key);
            return;
        }
        Outcome::Canceled => {
            tracing::info!(elapsed_ms, "attempt canceled on request");
            write_back("canceled", "canceled", Duration::ZERO, None)
        }
        Outcome::Parked => {
            tracing::warn!(
                last_error = task.parked_error.as_deref().unwrap_or(""),
                "the last attempt's lease expired while no worker that registers this task was \
                 there to bury it; ending it dead now, without running it"
            );
            // No new attempt: the attempt count goes back to the last one, no history entry is
            // added (the reaper recorded the lost lease), and `last_error` stays.
            WriteBack {
                attempt: task.max_attempts,
                ..write_back("dead", "", Duration::ZERO, None)
            }
        }
        Outcome::Succeeded(output) => {
            tracing::debug!(elapsed_ms, "attempt succeeded");
            WriteBack {
                output,
                ..write_back("succeeded", "succeeded", Duration::ZERO, None)
            }
        }
        Outcome::Snoozed(d) => {
            tracing::info!(
                elapsed_ms,
                snooze_ms = d.as_millis() as u64,
                snoozes = task.snoozes + 1,
                "attempt snoozed; it does not count as an attempt"
            );
            write_back("snoozed", "snoozed", d, None)
        }
        Outcome::Undecodable(e) => {
            tracing::error!(error = %e, elapsed_ms, "payload does not decode; task is dead");
            write_back("dead", "failed", Duration::ZERO, Some(e))
        }
        Outcome::Failed(kind, e, cause) => {
            let outcome = cause.outcome();
            let backoff = handler.map(|h| h.backoff).unwrap_or_default();
            let exhausted = task.attempt >= task.max_attempts;
            match kind {
                TaskErrorKind::Permanent => {
                    tracing::error!(error = %e, elapsed_ms, "attempt failed permanently; task is dead");
                    write_back("dead", outcome, Duration::ZERO, Some(e))
                }
                _ if exhausted => {
                    tracing::error!(error = %e, elapsed_ms, "attempt failed; attempts exhausted, task is dead");
                    let error = with_exhausted_note(e, task.attempt, task.max_attempts);
                    write_back("dead", outcome, Duration::ZERO, Some(error))
                }
                TaskErrorKind::RetryAfter(d) => {
                    tracing::warn!(error = %e, elapsed_ms, retry_in_ms = d.as_millis() as u64, "attempt failed; retry requested");
                    write_back("pending", outcome, d, Some(e))
                }
                _ => {
                    let d = backoff.delay_random(task.attempt);
                    tracing::warn!(error = %e, elapsed_ms, retry_in_ms = d.as_millis() as u64, "attempt failed; will retry");
                    write_back("pending", outcome, d, Some(e))
                }
            }
        }
    };
    out.follow_up = match out.state {
        "dead" => follow::dead(
            shared,
            handler,
            || DeadTask {
                id: TaskId(task.id),
                name: task.name.clone(),
                queue: queue.to_string(),
                attempts: out.attempt,
                max_attempts: task.max_attempts,
                last_error: out
                    .error
                    .clone()
                    .or_else(|| task.parked_error.clone())
                    .unwrap_or_default(),
                payload: payload_value(&task.payload),
            },
            task.lease_epoch,
            task.trace_context.as_deref(),
        ),
        "succeeded" => follow::succeeded(
            shared,
            handler,
            || SucceededTask {
                id: TaskId(task.id),
                name: task.name.clone(),
                queue: queue.to_string(),
                attempts: task.attempt,
                payload: payload_value(&task.payload),
            },
            task.lease_epoch,
            task.trace_context.as_deref(),
        ),
        _ => None,
    };
    if let Some(f) = shared.inflight().get_mut(&key) {
        f.phase = Phase::WritingBack;
    }
    if shared.write_backs.send(WriteBackMsg::Outcome(out)).is_err() {
        shared.inflight().remove(&key);
    }
}

fn write_back(
    task: &Claimed,
    state: &'static str,
    outcome: &'static str,
    delay: Duration,
    error: Option<String>,
) -> WriteBack {
    let to = match state {
        "succeeded" => TaskState::Succeeded,
        "dead" => TaskState::Dead,
        "canceled" => TaskState::Canceled,
        _ => TaskState::Pending, // a retry or a snooze
    };
    WriteBack {
        id: task.id,
        epoch: task.lease_epoch,
        state,
        attempt: task.attempt,
        outcome,
        // A retry delay is clamped to what the schema holds (`retry_after` and backoff
        // ceilings are user input): `now + delay` must stay a valid DATETIME.
        delay_us: delay.min(MAX_DELAY).as_micros() as i64,
        error: error.map(|e| truncate(e, MAX_ERROR_LEN)),
        // Freed as `taskq_driver::rules::run_end_frees_identity` says (a running task's, or a
        // window's, by the end it reaches; one held while pending was freed by the claim).
        frees: task.unique_key.clone().filter(|_| {
            task.unique_while
                .as_deref()
                .is_some_and(|w| run_end_frees_identity(w, to))
        }),
        // An ordered head that ends lets its key go on (`rules::ends_order_head`).
        order_ends: task
            .order_key
            .clone()
            .filter(|_| ends_order_head(to, task.order_dead_skips)),
        // A workflow step that ends settles the steps after it in the write-back's transaction.
        workflow_step_ends: task.workflow_id.is_some()
            && taskq_driver::rules::workflow::ENDED_STATES.contains(&to),
        // A batch member that ends is counted in its batch in the write-back's transaction.
        batch_ends: task.batch_id.is_some()
            && taskq_driver::rules::workflow::ENDED_STATES.contains(&to),
        follow_up: None,
        output: None,
        name: task.name.as_str().into(),
        queue: Arc::from(""),
        ran: Duration::ZERO,
    }
}

/// The stored error of a task whose last attempt failed: the error, cut so that the note
/// always fits within [`MAX_ERROR_LEN`] (`TaskInfo::dead_reason` reads the note back).
fn with_exhausted_note(e: String, attempt: u32, max_attempts: u32) -> String {
    let note = exhausted_note(attempt, max_attempts);
    let mut error = truncate(e, MAX_ERROR_LEN - note.len() - '…'.len_utf8());
    error.push_str(&note);
    error
}

fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push('…');
    }
    s
}

/// Runs the attempt; a success takes the output its handler recorded, and one whose output
/// was refused (`OutputError`: too large, not serializable) fails for good, so a step after it
/// never runs without its output.
async fn attempt(
    shared: &Arc<Shared>,
    queue: &Arc<str>,
    task: &Claimed,
    cancel: Arc<CancelHandle>,
    signal: crate::context::CancelSignal,
) -> Outcome {
    let output = Arc::<OutputSlot>::default();
    match run_handler(shared, queue, task, cancel, signal, output.clone()).await {
        Outcome::Succeeded(_) => match output.lock().unwrap_or_else(|p| p.into_inner()).take() {
            None => Outcome::Succeeded(None),
            Some(Ok(json)) => Outcome::Succeeded(Some(json)),
            Some(Err(e)) => Outcome::Failed(TaskErrorKind::Permanent, e.to_string(), Cause::Error),
        },
        other => other,
    }
}

async fn run_handler(
    shared: &Arc<Shared>,
    queue: &Arc<str>,
    task: &Claimed,
    cancel: Arc<CancelHandle>,
    signal: crate::context::CancelSignal,
    output: Arc<OutputSlot>,
) -> Outcome {
    if task.attempt > task.max_attempts {
        return Outcome::Parked;
    }
    let Some(handler) = shared.handlers.get(task.name.as_str()) else {
        // Cannot happen: the claim only takes names this worker handles.
        return Outcome::Undecodable(format!("no handler for task {:?}", task.name));
    };
    let cx = TaskContext {
        id: TaskId(task.id),
        name: task.name.as_str().into(),
        queue: queue.clone(),
        attempt: task.attempt,
        max_attempts: task.max_attempts,
        snoozes: task.snoozes,
        lease_epoch: task.lease_epoch,
        worker_id: shared.worker_id.clone(),
        cancel: signal.clone(),
        data: shared.data.clone(),
        trace_context: task.trace_context.as_deref().map(Arc::from),
        steps: task.workflow_id.map(|_| shared.user_store.clone()),
        output,
        output_limit: shared.cfg.output_limit,
    };
    let fut = match (handler.run)(&task.payload, cx) {
        Ok(f) => f,
        Err(e) => {
            return Outcome::Undecodable(format!(
                "{UNDECODABLE_PREFIX} as {}: {e}",
                short_type_name(handler.type_name())
            ));
        }
    };
    // Checked when the handler's task first runs, not when it is spawned: on a busy runtime
    // that can be much later.
    let gate = shared.clone();
    let attempt_key = key(task);
    let fut = async move {
        if lease::too_late_to_start(&gate, attempt_key) {
            return None;
        }
        Some(fut.await)
    };
    let mut join = tokio::spawn(fut.in_current_span());
    if let Some(f) = shared.inflight().get_mut(&key(task)) {
        f.abort = Some(join.abort_handle());
    }
    let timeout = handler.timeout;
    let sleep = async {
        match timeout {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
    };
    let interrupted = tokio::select! {
        res = &mut join => {
            let outcome = joined(shared, queue, &task.name, res);
            // A handler that returned on its cancel signal before this select saw it.
            if cancel.reason() == Some(CancelReason::Canceled) {
                return on_cancel(outcome);
            }
            return outcome;
        }
        _ = sleep => {
            WorkerStats::add(&shared.stats.timeouts, 1);
            metrics::timed_out(queue, &task.name);
            cancel.cancel(CancelReason::Timeout);
            CancelReason::Timeout
        }
        reason = signal.canceled() => reason,
    };
    if interrupted == CancelReason::Shutdown {
        join.abort();
        let _ = join.await;
        return Outcome::Abandoned(CancelReason::Shutdown);
    }
    // Give a cooperative handler the grace period to notice its signal.
    let late = tokio::time::timeout(shared.cfg.cancel_grace, &mut join).await;
    if late.is_err() {
        join.abort();
    }
    match (interrupted, late) {
        // The handler came back within the grace after its timeout: its own result counts
        // (a success is a success; an error keeps its kind and says it timed out first).
        (CancelReason::Timeout, Ok(res)) => match joined(shared, queue, &task.name, res) {
            Outcome::Failed(kind, e, _) => Outcome::Failed(
                kind,
                format!(
                    "timed out after {:?}, then failed: {e}",
                    timeout.unwrap_or_default()
                ),
                Cause::TimedOut,
            ),
            other => other,
        },
        (CancelReason::Timeout, Err(_)) => Outcome::Failed(
            TaskErrorKind::Retry,
            format!("timed out after {:?}", timeout.unwrap_or_default()),
            Cause::TimedOut,
        ),
        // Canceled on request: a success that completed within the grace is recorded as such;
        // anything else (an error, a snooze, an abort after the grace) ends `canceled`.
        (CancelReason::Canceled, Ok(res)) => on_cancel(joined(shared, queue, &task.name, res)),
        (CancelReason::Canceled, Err(_)) => Outcome::Canceled,
        // Lease lost but the handler finished: write its result; fencing will reject it.
        (_, Ok(res)) => joined(shared, queue, &task.name, res),
        (reason, Err(_)) => Outcome::Abandoned(reason),
    }
}

/// The outcome of a handler that returned after a cancel request: a success stands (its work
/// is done); anything else (an error, a snooze, a panic) ends `canceled`.
fn on_cancel(outcome: Outcome) -> Outcome {
    match outcome {
        Outcome::Succeeded(o) => Outcome::Succeeded(o),
        _ => Outcome::Canceled,
    }
}

fn joined(
    shared: &Shared,
    queue: &str,
    name: &str,
    res: Result<Option<Result<(), TaskError>>, tokio::task::JoinError>,
) -> Outcome {
    match res {
        Ok(None) => Outcome::NotStarted,
        Ok(Some(Ok(()))) => Outcome::Succeeded(None),
        Ok(Some(Err(e))) => match e.kind() {
            TaskErrorKind::Snooze(d) => Outcome::Snoozed(d),
            kind => Outcome::Failed(kind, e.to_chain_string(), Cause::Error),
        },
        Err(e) if e.is_panic() => {
            WorkerStats::add(&shared.stats.panics, 1);
            metrics::panicked(queue, name);
            Outcome::Failed(
                TaskErrorKind::Retry,
                format!("handler panicked: {}", panic_message(e.into_panic())),
                Cause::Panicked,
            )
        }
        Err(_) => Outcome::Abandoned(CancelReason::Shutdown),
    }
}

fn panic_message(p: Box<dyn Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exhausted_note_survives_truncation() {
        let short = with_exhausted_note("boom".into(), 5, 5);
        assert_eq!(short, "boom (attempts exhausted: 5/5)");
        let long = with_exhausted_note("é".repeat(MAX_ERROR_LEN), 20, 20);
        assert!(long.len() <= MAX_ERROR_LEN, "{}", long.len());
        assert!(long.ends_with("é… (attempts exhausted: 20/20)"), "{long}");
        // What `write_back` stores is unchanged by its own truncation.
        assert_eq!(truncate(long.clone(), MAX_ERROR_LEN), long);
    }
}
