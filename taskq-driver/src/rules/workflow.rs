//! Workflows, the rules every driver follows: a workflow's graph (the steps a caller
//! declares, each with the names of the steps it runs after), checked as a whole before
//! anything is written and planned so that every driver inserts the same thing (the steps in
//! an order where each comes after the steps it waits for, each with the distinct steps it
//! waits for and the steps waiting for it); what a step's end does to the steps after it
//! ([`dependency_end`]); and a workflow's state from its steps' ([`workflow_state`]).
//!
//! A step's name is checked by the caller (taskq's name rules); this module checks the graph:
//! at least one step, no name twice, no dependency on a name that is not a step, no cycle.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use crate::state::TaskState;

/// A workflow's id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(transparent)]
pub struct WorkflowId(pub u64);

impl std::fmt::Display for WorkflowId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.0, f)
    }
}

/// Why a workflow's graph is refused; nothing of it is written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GraphError {
    /// The workflow has no step.
    #[error("a workflow needs at least one step")]
    Empty,
    /// Two steps have one name.
    #[error("step {name:?} is declared twice")]
    DuplicateStep {
        /// The name.
        name: String,
    },
    /// A step runs after a name that is no step of the workflow.
    #[error("step {step:?} runs after {missing:?}, which is not a step of this workflow")]
    UnknownDependency {
        /// The step.
        step: String,
        /// The name it runs after.
        missing: String,
    },
    /// The steps wait for each other in a circle (a step after itself is a circle of one).
    #[error("steps wait for each other in a cycle: {}", path.join(" → "))]
    Cycle {
        /// The cycle, its first step repeated at the end (`a → b → a`).
        path: Vec<String>,
    },
}

/// A checked graph, by the steps' indices in the order they were declared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Every step once, each after all the steps it waits for; among steps free to go next,
    /// the one declared first.
    pub order: Vec<usize>,
    /// Per step: the distinct steps it waits for, in declaration order (its `deps_left` at
    /// enqueue is their number).
    pub deps: Vec<Vec<usize>>,
    /// Per step: the steps that wait for it, in declaration order.
    pub dependents: Vec<Vec<usize>>,
}

/// Checks the graph of `steps` (each a name and the names it runs after) and plans it.
pub fn plan<S: AsRef<str>>(steps: &[(S, Vec<S>)]) -> Result<Plan, GraphError> {
    if steps.is_empty() {
        return Err(GraphError::Empty);
    }
    let mut index: HashMap<&str, usize> = HashMap::with_capacity(steps.len());
    for (i, (name, _)) in steps.iter().enumerate() {
        if index.insert(name.as_ref(), i).is_some() {
            return Err(GraphError::DuplicateStep {
                name: name.as_ref().to_owned(),
            });
        }
    }
    let mut deps = Vec::with_capacity(steps.len());
    let mut dependents = vec![Vec::new(); steps.len()];
    for (i, (name, after)) in steps.iter().enumerate() {
        let mut mine: Vec<usize> = Vec::with_capacity(after.len());
        for d in after {
            let Some(&j) = index.get(d.as_ref()) else {
                return Err(GraphError::UnknownDependency {
                    step: name.as_ref().to_owned(),
                    missing: d.as_ref().to_owned(),
                });
            };
            if !mine.contains(&j) {
                mine.push(j);
            }
        }
        mine.sort_unstable();
        for &j in &mine {
            dependents[j].push(i);
        }
        deps.push(mine);
    }
    // Kahn's algorithm, the lowest declared index first among the steps that are free.
    let mut left: Vec<usize> = deps.iter().map(Vec::len).collect();
    let mut free: BinaryHeap<Reverse<usize>> = (0..steps.len())
        .filter(|&i| left[i] == 0)
        .map(Reverse)
        .collect();
    let mut order = Vec::with_capacity(steps.len());
    while let Some(Reverse(i)) = free.pop() {
        order.push(i);
        for &k in &dependents[i] {
            left[k] -= 1;
            if left[k] == 0 {
                free.push(Reverse(k));
            }
        }
    }
    if order.len() < steps.len() {
        let path = cycle(&deps, &left)
            .into_iter()
            .map(|i| steps[i].0.as_ref().to_owned())
            .collect();
        return Err(GraphError::Cycle { path });
    }
    Ok(Plan {
        order,
        deps,
        dependents,
    })
}

/// A cycle among the steps Kahn's algorithm could not order (`left[i] > 0`), as indices with
/// the first repeated at the end, in the direction a step waits for the next.
fn cycle(deps: &[Vec<usize>], left: &[usize]) -> Vec<usize> {
    // Every unordered step waits for at least one unordered step, so following such a
    // dependency from any of them must come back to a step already on the path.
    let start = (0..left.len())
        .find(|&i| left[i] > 0)
        .expect("a step was left unordered");
    let mut path = vec![start];
    let mut at = HashMap::from([(start, 0usize)]);
    let mut i = start;
    loop {
        let next = deps[i]
            .iter()
            .copied()
            .find(|&d| left[d] > 0)
            .expect("an unordered step waits for an unordered step");
        if let Some(&pos) = at.get(&next) {
            let mut c = path.split_off(pos);
            c.push(next);
            // Reported in the order the steps run after each other: `a → b` means b after a.
            c.reverse();
            return c;
        }
        at.insert(next, path.len());
        path.push(next);
        i = next;
    }
}

/// What the end of a step does to a step that runs after it (`Workflows::workflow_settle`),
/// decided here for every driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DependencyEnd {
    /// The dependency is done for this step: one fewer to wait for (`deps_left - 1`); at
    /// none left, a `waiting` step becomes `pending`.
    Counts,
    /// The dependency failed and the step does not run after a failure: a `waiting` step is
    /// canceled (marked as canceled by its dependencies), and that end is settled in turn.
    Cancels,
}

/// What the end of a dependency in `state` does to a step that runs after it; `None` while
/// the dependency has not ended (waiting, pending, running). A success always counts; a
/// failure (dead, canceled, expired) cancels the step unless it runs after a failure too (a
/// cleanup step), for which it counts.
pub fn dependency_end(state: TaskState, runs_after_failure: bool) -> Option<DependencyEnd> {
    match state {
        TaskState::Waiting | TaskState::Pending | TaskState::Running => None,
        TaskState::Succeeded => Some(DependencyEnd::Counts),
        TaskState::Dead | TaskState::Canceled | TaskState::Expired => Some(if runs_after_failure {
            DependencyEnd::Counts
        } else {
            DependencyEnd::Cancels
        }),
    }
}

/// The states in which a step has ended for the steps after it (those `dependency_end`
/// answers for), as the drivers' SQL lists them.
pub const ENDED_STATES: [TaskState; 4] = [
    TaskState::Succeeded,
    TaskState::Dead,
    TaskState::Canceled,
    TaskState::Expired,
];

/// The error recorded on a step canceled because a step it runs after did not succeed.
pub const CANCELED_BY_DEPENDENCY: &str = "canceled: a step it runs after did not succeed";

/// A workflow's state, derived from its steps' states and whether it was canceled: `running`
/// while any step has not ended; then `succeeded` when every step succeeded, `canceled` when
/// an operator canceled it, `failed` otherwise (a step died, expired, or was canceled, and
/// the steps after it with it).
pub fn workflow_state(canceled: bool, counts: &StepCounts) -> WorkflowState {
    if counts.waiting + counts.pending + counts.running > 0 {
        WorkflowState::Running
    } else if canceled {
        WorkflowState::Canceled
    } else if counts.succeeded == counts.total() {
        WorkflowState::Succeeded
    } else {
        WorkflowState::Failed
    }
}

/// A workflow's state (see [`workflow_state`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkflowState {
    /// Some step has not ended.
    Running,
    /// Every step succeeded.
    Succeeded,
    /// Every step ended and some did not succeed.
    Failed,
    /// Canceled by an operator; every step ended.
    Canceled,
}

impl WorkflowState {
    /// The state's name (`running`, `succeeded`, `failed`, `canceled`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Canceled => "canceled",
        }
    }
}

impl std::fmt::Display for WorkflowState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A workflow's steps per state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct StepCounts {
    /// Waiting for the steps they run after.
    pub waiting: u64,
    /// Due or waiting for a worker.
    pub pending: u64,
    /// Running.
    pub running: u64,
    /// Succeeded.
    pub succeeded: u64,
    /// Dead.
    pub dead: u64,
    /// Canceled (by an operator, or because a step they run after did not succeed).
    pub canceled: u64,
    /// Expired (deadline passed before a start).
    pub expired: u64,
}

impl StepCounts {
    /// Adds `n` steps in `state`.
    pub fn add(&mut self, state: TaskState, n: u64) {
        match state {
            TaskState::Waiting => self.waiting += n,
            TaskState::Pending => self.pending += n,
            TaskState::Running => self.running += n,
            TaskState::Succeeded => self.succeeded += n,
            TaskState::Dead => self.dead += n,
            TaskState::Canceled => self.canceled += n,
            TaskState::Expired => self.expired += n,
        }
    }

    /// Every step.
    pub fn total(&self) -> u64 {
        self.waiting
            + self.pending
            + self.running
            + self.succeeded
            + self.dead
            + self.canceled
            + self.expired
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn steps(spec: &[(&'static str, &[&'static str])]) -> Vec<(&'static str, Vec<&'static str>)> {
        spec.iter().map(|(n, a)| (*n, a.to_vec())).collect()
    }

    #[test]
    fn a_chain_a_fan_out_and_a_fan_in_are_ordered_after_their_dependencies() {
        // fetch → (render, price) → mail; declared out of order.
        let p = plan(&steps(&[
            ("mail", &["render", "price"]),
            ("render", &["fetch"]),
            ("fetch", &[]),
            ("price", &["fetch", "fetch"]),
        ]))
        .unwrap();
        assert_eq!(p.order, [2, 1, 3, 0]);
        assert_eq!(p.deps, [vec![1, 3], vec![2], vec![], vec![2]]);
        assert_eq!(p.dependents, [vec![], vec![0], vec![1, 3], vec![0]]);
        for (pos, &i) in p.order.iter().enumerate() {
            for d in &p.deps[i] {
                assert!(p.order[..pos].contains(d), "{i} before its dependency {d}");
            }
        }
    }

    #[test]
    fn independent_steps_keep_their_declared_order() {
        let p = plan(&steps(&[("b", &[]), ("a", &[]), ("c", &[])])).unwrap();
        assert_eq!(p.order, [0, 1, 2]);
    }

    #[test]
    fn a_wide_diamond_plans_every_step_once() {
        let mut spec: Vec<(String, Vec<String>)> = vec![("start".into(), vec![])];
        let middle: Vec<String> = (0..198).map(|i| format!("m{i}")).collect();
        for m in &middle {
            spec.push((m.clone(), vec!["start".into()]));
        }
        spec.push(("end".into(), middle.clone()));
        let p = plan(&spec).unwrap();
        assert_eq!(p.order.len(), 200);
        assert_eq!(p.order[0], 0);
        assert_eq!(p.order[199], 199);
        assert_eq!(p.deps[199].len(), 198);
        assert_eq!(p.dependents[0].len(), 198);
    }

    #[test]
    fn an_empty_graph_a_duplicate_and_an_unknown_name_are_refused() {
        assert_eq!(plan::<&str>(&[]).unwrap_err(), GraphError::Empty,);
        assert_eq!(
            plan(&steps(&[("a", &[]), ("a", &[])])).unwrap_err(),
            GraphError::DuplicateStep { name: "a".into() }
        );
        let e = plan(&steps(&[("a", &[]), ("b", &["a", "c"])])).unwrap_err();
        assert_eq!(
            e,
            GraphError::UnknownDependency {
                step: "b".into(),
                missing: "c".into()
            }
        );
        assert_eq!(
            e.to_string(),
            r#"step "b" runs after "c", which is not a step of this workflow"#
        );
    }

    #[test]
    fn a_cycle_is_refused_and_named() {
        let e = plan(&steps(&[
            ("a", &["c"]),
            ("b", &["a"]),
            ("c", &["b"]),
            ("d", &[]),
        ]))
        .unwrap_err();
        assert_eq!(
            e,
            GraphError::Cycle {
                path: vec!["a".into(), "b".into(), "c".into(), "a".into()]
            }
        );
        assert_eq!(
            e.to_string(),
            "steps wait for each other in a cycle: a → b → c → a"
        );
        // A step after itself; and a cycle behind a step that is free.
        assert_eq!(
            plan(&steps(&[("a", &["a"])])).unwrap_err(),
            GraphError::Cycle {
                path: vec!["a".into(), "a".into()]
            }
        );
        let e = plan(&steps(&[("x", &[]), ("y", &["x", "z"]), ("z", &["y"])])).unwrap_err();
        assert_eq!(
            e,
            GraphError::Cycle {
                path: vec!["y".into(), "z".into(), "y".into()]
            }
        );
    }

    #[test]
    fn a_success_counts_and_a_failure_cancels_all_but_a_cleanup_step() {
        use DependencyEnd::*;
        for s in [TaskState::Waiting, TaskState::Pending, TaskState::Running] {
            assert_eq!(dependency_end(s, false), None);
            assert_eq!(dependency_end(s, true), None);
        }
        assert_eq!(dependency_end(TaskState::Succeeded, false), Some(Counts));
        assert_eq!(dependency_end(TaskState::Succeeded, true), Some(Counts));
        for s in [TaskState::Dead, TaskState::Canceled, TaskState::Expired] {
            assert_eq!(dependency_end(s, false), Some(Cancels));
            assert_eq!(dependency_end(s, true), Some(Counts));
        }
        for s in TaskState::ALL {
            assert_eq!(
                ENDED_STATES.contains(&s),
                dependency_end(s, false).is_some()
            );
        }
    }

    #[test]
    fn a_workflow_runs_until_every_step_ended_then_succeeds_only_if_all_did() {
        let mut c = StepCounts::default();
        c.add(TaskState::Succeeded, 2);
        c.add(TaskState::Waiting, 1);
        assert_eq!(workflow_state(false, &c), WorkflowState::Running);
        assert_eq!(workflow_state(true, &c), WorkflowState::Running);
        c.waiting = 0;
        c.add(TaskState::Succeeded, 1);
        assert_eq!(workflow_state(false, &c), WorkflowState::Succeeded);
        c.add(TaskState::Canceled, 1);
        assert_eq!(workflow_state(false, &c), WorkflowState::Failed);
        assert_eq!(workflow_state(true, &c), WorkflowState::Canceled);
        assert_eq!(c.total(), 4);
    }
}
