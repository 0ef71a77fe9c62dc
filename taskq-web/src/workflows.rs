//! What the workflow pages and their API routes share: a page of workflows with its keyset
//! cursor, each step's level in the graph (for the workflow page's picture of it), and the
//! two actions on a workflow (cancel it, retry its dead steps), each through the client acting
//! as the request's actor, so each is audited (`workflow_cancel`, `workflow_retry`) in the
//! transaction of the change.

use std::collections::HashMap;

use taskq::workflow::{WorkflowId, WorkflowInfo, WorkflowStepRow};
use taskq::{Client, Error};

use crate::AppState;

/// The most workflows `Client::workflows` reads in one call.
const CLIENT_MAX: u32 = 1_000;

/// A page of workflows, newest first (named `name` when given, with ids below `before`), and
/// the cursor of the next page (the last id shown), if there is more.
pub(crate) async fn page(
    st: &AppState,
    name: Option<&str>,
    before: Option<u64>,
    limit: u32,
) -> Result<(Vec<WorkflowInfo>, Option<u64>), Error> {
    let limit = limit.clamp(1, CLIENT_MAX);
    // One more than the page tells whether there is a next page; a page of the client's
    // largest size cannot ask for one more, so a full one says there may be.
    let fetch = (limit + 1).min(CLIENT_MAX);
    let mut rows = st
        .client
        .workflows(name, before.map(WorkflowId), fetch)
        .await?;
    let more = rows.len() > limit as usize || (fetch == limit && rows.len() == limit as usize);
    rows.truncate(limit as usize);
    let next = if more {
        rows.last().map(|w| w.id.0)
    } else {
        None
    };
    Ok((rows, next))
}

/// Each step's level in the graph, in the order of `steps`: 0 for a step that runs after
/// none, else one more than the highest level among the steps it runs after. (The graph has
/// no cycle: enqueue refuses one. A dependency that is no step counts as a step of level 0.)
pub(crate) fn levels(steps: &[WorkflowStepRow]) -> Vec<usize> {
    let index: HashMap<&str, usize> = steps
        .iter()
        .enumerate()
        .map(|(i, s)| (s.step.as_str(), i))
        .collect();
    let mut level: Vec<Option<usize>> = vec![None; steps.len()];
    // Steps come back in insert order, each after the steps it runs after, so one pass
    // usually settles every level; the passes are bounded in any case.
    for _ in 0..=steps.len() {
        let mut changed = false;
        for (i, s) in steps.iter().enumerate() {
            if level[i].is_some() {
                continue;
            }
            let deps: Option<Vec<usize>> = s
                .after
                .iter()
                .map(|d| index.get(d.as_str()).map_or(Some(0), |&j| level[j]))
                .collect();
            if let Some(deps) = deps {
                level[i] = Some(deps.iter().map(|l| l + 1).max().unwrap_or(0));
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    level.into_iter().map(Option::unwrap_or_default).collect()
}

/// What an operator does to a workflow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WorkflowAction {
    /// Cancel its waiting and pending steps, ask its running ones to stop.
    Cancel,
    /// Retry its dead steps.
    Retry,
}

/// What became of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WorkflowDone {
    /// Steps canceled at once, and running steps asked to stop.
    Canceled { canceled: u64, requested: u64 },
    /// Dead steps moved back to pending.
    Retried(u64),
}

impl WorkflowAction {
    /// Applies it to workflow `id` with `client` (acting as the request's actor).
    pub(crate) async fn apply(
        self,
        client: &Client,
        id: WorkflowId,
    ) -> Result<WorkflowDone, Error> {
        match self {
            Self::Cancel => client
                .cancel_workflow(id)
                .await
                .map(|c| WorkflowDone::Canceled {
                    canceled: c.canceled,
                    requested: c.cancel_requested,
                }),
            Self::Retry => client.retry_workflow(id).await.map(WorkflowDone::Retried),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use taskq::{TaskId, TaskState};

    fn step(name: &str, after: &[&str]) -> WorkflowStepRow {
        WorkflowStepRow {
            step: name.into(),
            task_id: TaskId(1),
            name: "t".into(),
            queue: "q".into(),
            state: TaskState::Waiting,
            after: after.iter().map(|s| (*s).to_owned()).collect(),
            runs_after_failure: false,
            canceled_by_dependency: false,
            output: None,
        }
    }

    #[test]
    fn a_step_is_one_level_below_the_deepest_step_it_runs_after() {
        // Declared out of order: mail after render and price, render and price after fetch,
        // tidy after mail and fetch.
        let steps = [
            step("mail", &["render", "price"]),
            step("render", &["fetch"]),
            step("fetch", &[]),
            step("price", &["fetch"]),
            step("tidy", &["mail", "fetch"]),
        ];
        assert_eq!(levels(&steps), [2, 1, 0, 1, 3]);
        assert_eq!(levels(&[step("lone", &["gone"])]), [1]);
        assert!(levels(&[]).is_empty());
    }
}
