//! Workflows: ordinary tasks as the steps of a graph, where a step runs only once the steps it
//! runs after have succeeded (fan-out and fan-in both), enqueued in one call on the caller's
//! transaction: commit = the whole graph, rollback = none of it.
//!
//! ```
//! # use taskq::{Task, TaskContext, TaskError};
//! # #[derive(serde::Serialize, serde::Deserialize)] struct FetchOrders { day: String }
//! # impl Task for FetchOrders { const NAME: &'static str = "fetch_orders";
//! #   async fn run(self, _: TaskContext) -> Result<(), TaskError> { Ok(()) } }
//! # #[derive(serde::Serialize, serde::Deserialize)] struct Render { day: String }
//! # impl Task for Render { const NAME: &'static str = "render";
//! #   async fn run(self, _: TaskContext) -> Result<(), TaskError> { Ok(()) } }
//! # #[derive(serde::Serialize, serde::Deserialize)] struct Mail { to: String }
//! # impl Task for Mail { const NAME: &'static str = "mail";
//! #   async fn run(self, _: TaskContext) -> Result<(), TaskError> { Ok(()) } }
//! # #[derive(serde::Serialize, serde::Deserialize)] struct Tidy {}
//! # impl Task for Tidy { const NAME: &'static str = "tidy";
//! #   async fn run(self, _: TaskContext) -> Result<(), TaskError> { Ok(()) } }
//! use taskq::workflow::Workflow;
//! # async fn f(pool: sqlx::MySqlPool) -> taskq::Result<()> {
//! let day = "2026-12-03".to_string();
//! let mut tx = pool.begin().await?;
//! let wf = Workflow::new("export-2026-12-03")
//!     .step("fetch", FetchOrders { day: day.clone() })
//!     .step_after("render", Render { day }, ["fetch"])
//!     .step_after("mail", Mail { to: "ops@example.com".into() }, ["render"])
//!     .cleanup_after("tidy", Tidy {}, ["render", "mail"])
//!     .enqueue_tx(&mut tx)
//!     .await?;
//! tx.commit().await?;
//! println!("workflow {} with task {:?} first", wf.id, wf.task("fetch"));
//! # Ok(()) }
//! ```
//!
//! When a step dies (or expires, or is canceled), the steps after it are canceled, and those
//! after them, and the workflow ends `failed`; a step declared with
//! [`cleanup_after`](Workflow::cleanup_after) runs anyway once its dependencies have ended.
//! A dead step an operator retries ([`Client::retry_dead`](crate::Client::retry_dead)) and that then
//! succeeds brings back the steps its death canceled. The rules are
//! `taskq_driver::rules::workflow`'s; docs/workflows.md says what is guaranteed.

use std::fmt;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::Pool;

use crate::backend::Backend;
use crate::defaults::{MAX_NAME_LEN, validate_name};
use crate::enqueue::{AsConnection, IntoEnqueue, conn_of};
use crate::error::{Error, Result};
use crate::task::TaskId;
use crate::task::enqueue::Prepared;
use taskq_driver::rows::{NewStep, NewWorkflow};
pub use taskq_driver::rows::{WorkflowCanceled, WorkflowStepRow};
pub use taskq_driver::rules::workflow::{GraphError, StepCounts, WorkflowId, WorkflowState};

/// A step as declared: its name, the steps it runs after, whether it is a cleanup step.
struct StepDecl {
    name: String,
    after: Vec<String>,
    runs_after_failure: bool,
}

/// A declared step with its task, prepared (checked) when it was added.
struct Draft {
    decl: StepDecl,
    task: Result<Prepared>,
}

/// A workflow being built: steps, each a task with the steps it runs after. Nothing is checked
/// or written until [`enqueue_tx`](Self::enqueue_tx) (or [`enqueue`](Self::enqueue)), which
/// refuses a bad graph with [`Error::Workflow`] and a bad step with its own error, writing
/// nothing.
#[must_use = "a workflow is written only by enqueue_tx or enqueue"]
pub struct Workflow {
    name: String,
    steps: Vec<Draft>,
}

impl fmt::Debug for Workflow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Workflow")
            .field("name", &self.name)
            .field(
                "steps",
                &self
                    .steps
                    .iter()
                    .map(|s| (&s.decl.name, &s.decl.after))
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// A workflow whose names, tasks and graph were checked: its steps as declared, each step's
/// prepared task, its dependencies (indices) and the insert order (`rules::workflow::plan`).
struct Checked {
    name: String,
    steps: Vec<StepDecl>,
    tasks: Vec<Prepared>,
    deps: Vec<Vec<usize>>,
    order: Vec<usize>,
}

/// What [`Workflow::enqueue_tx`] inserted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkflowEnqueued {
    /// The workflow's id.
    pub id: WorkflowId,
    /// Each step's name and task, in the order they were declared.
    pub steps: Vec<(String, TaskId)>,
}

impl WorkflowEnqueued {
    /// The task of the step named `step`.
    pub fn task(&self, step: &str) -> Option<TaskId> {
        self.steps.iter().find(|(s, _)| s == step).map(|(_, t)| *t)
    }
}

impl Workflow {
    /// A workflow named `name` (a label for people, e.g. `export-7`; not unique), with no step
    /// yet.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            steps: Vec::new(),
        }
    }

    fn push(
        mut self,
        name: impl Into<String>,
        task: impl IntoEnqueue,
        after: Vec<String>,
        runs_after_failure: bool,
    ) -> Self {
        self.steps.push(Draft {
            decl: StepDecl {
                name: name.into(),
                after,
                runs_after_failure,
            },
            task: task.into_enqueue().prepare(),
        });
        self
    }

    /// Adds a step that runs at once (after no other step). `task` is a task, or a task with
    /// enqueue options ([`Enqueue`](crate::Enqueue)); a step cannot be unique, ordered, or
    /// carry an idempotency key.
    pub fn step(self, name: impl Into<String>, task: impl IntoEnqueue) -> Self {
        self.push(name, task, Vec::new(), false)
    }

    /// Adds a step that runs once every step named in `after` has succeeded; if one of them
    /// does not succeed, this step is canceled.
    pub fn step_after<I, S>(self, name: impl Into<String>, task: impl IntoEnqueue, after: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let after = after.into_iter().map(Into::into).collect();
        self.push(name, task, after, false)
    }

    /// Adds a cleanup step: it runs once every step named in `after` has ended, whether it
    /// succeeded, died, expired or was canceled.
    pub fn cleanup_after<I, S>(
        self,
        name: impl Into<String>,
        task: impl IntoEnqueue,
        after: I,
    ) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let after = after.into_iter().map(Into::into).collect();
        self.push(name, task, after, true)
    }

    /// Checks everything and plans the insert: the names, each step's task, the graph.
    fn prepare(self) -> Result<Checked> {
        validate_name("workflow name", &self.name, MAX_NAME_LEN)?;
        let mut tasks = Vec::with_capacity(self.steps.len());
        let mut steps = Vec::with_capacity(self.steps.len());
        for Draft { decl: s, task } in self.steps {
            validate_name("workflow step", &s.name, MAX_NAME_LEN)?;
            let task = task?;
            if task.keyed() {
                return Err(Error::InvalidOption(format!(
                    "workflow step {:?} ({}) is unique, ordered or has an idempotency key: a \
                     step is none of these (its workflow is enqueued once, as a whole)",
                    s.name, task.name
                )));
            }
            tasks.push(task);
            steps.push(s);
        }
        let graph: Vec<(&str, Vec<&str>)> = steps
            .iter()
            .map(|s| {
                (
                    s.name.as_str(),
                    s.after.iter().map(String::as_str).collect(),
                )
            })
            .collect();
        let plan = taskq_driver::rules::workflow::plan(&graph)?;
        Ok(Checked {
            name: self.name,
            steps,
            tasks,
            deps: plan.deps,
            order: plan.order,
        })
    }

    /// Inserts the workflow on the caller's transaction or connection (never begins, commits
    /// or rolls back it; on a bare connection its statements run in a transaction of their
    /// own): every step's task, those that run after no step due at once, the others waiting.
    /// Workers see it when the caller commits.
    pub async fn enqueue_tx<C: AsConnection + ?Sized>(
        self,
        conn: &mut C,
    ) -> Result<WorkflowEnqueued> {
        let Checked {
            name,
            steps,
            tasks,
            deps,
            order,
        } = self.prepare()?;
        // Inserted in plan order (each after the steps it runs after), reported in declared order.
        let mut at = vec![0usize; steps.len()];
        for (pos, &i) in order.iter().enumerate() {
            at[i] = pos;
        }
        let rows: Vec<NewStep<'_>> = order
            .iter()
            .map(|&i| NewStep {
                step: &steps[i].name,
                task: tasks[i].row(None, None),
                after: deps[i].iter().map(|&d| at[d]).collect(),
                runs_after_failure: steps[i].runs_after_failure,
            })
            .collect();
        let wf = NewWorkflow {
            name: &name,
            steps: &rows,
        };
        let mut c = conn_of(conn);
        let inserted = c.workflow_insert(&wf).await?;
        if inserted.task_ids.len() != rows.len() {
            return Err(Error::Database(sqlx::Error::Protocol(format!(
                "workflow insert of {} steps returned {} ids",
                rows.len(),
                inserted.task_ids.len()
            ))));
        }
        for t in &tasks {
            crate::metrics::enqueued(&t.queue, t.name);
        }
        tracing::debug!(
            workflow_id = inserted.id,
            steps = rows.len(),
            "enqueued a workflow"
        );
        Ok(WorkflowEnqueued {
            id: WorkflowId(inserted.id),
            steps: steps
                .iter()
                .enumerate()
                .map(|(i, s)| (s.name.clone(), inserted.task_ids[at[i]]))
                .collect(),
        })
    }

    /// Inserts the workflow in a transaction of its own and wakes this process's workers for
    /// the queues of its first steps.
    pub async fn enqueue<DB: Backend>(self, pool: &Pool<DB>) -> Result<WorkflowEnqueued> {
        let first: Vec<String> = self
            .steps
            .iter()
            .filter(|s| s.decl.after.is_empty())
            .filter_map(|s| s.task.as_ref().ok().map(|t| t.queue.clone()))
            .collect();
        let mut conn = match pool.acquire().await {
            Ok(c) => c,
            Err(e) => return Err(crate::backend::Store::of(pool.clone()).error(e).await),
        };
        let out = self.enqueue_tx(&mut conn).await?;
        for q in first {
            crate::wake::notify(&q);
        }
        Ok(out)
    }
}

/// A workflow as [`Client::workflow`](crate::Client::workflow) reads it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WorkflowInfo {
    /// Its id.
    pub id: WorkflowId,
    /// Its name.
    pub name: String,
    /// Its state, derived from its steps' ([`WorkflowState`]).
    pub state: WorkflowState,
    /// When it was enqueued (database clock).
    pub created_at: DateTime<Utc>,
    /// When an operator canceled it, if one did.
    pub canceled_at: Option<DateTime<Utc>>,
    /// Its steps per state (its progress).
    pub counts: StepCounts,
}

impl From<taskq_driver::rows::WorkflowRow> for WorkflowInfo {
    fn from(r: taskq_driver::rows::WorkflowRow) -> Self {
        Self {
            id: WorkflowId(r.id),
            state: taskq_driver::rules::workflow::workflow_state(
                r.canceled_at.is_some(),
                &r.counts,
            ),
            name: r.name,
            created_at: r.created_at,
            canceled_at: r.canceled_at,
            counts: r.counts,
        }
    }
}
