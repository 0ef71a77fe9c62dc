//! `taskq workflows`: list workflows with their state and progress, show one's steps, cancel
//! one (audited).

use taskq::Client;
use taskq::workflow::{StepCounts, WorkflowId, WorkflowInfo};

use crate::args::WorkflowsAction;
use crate::failure::Failure;
use crate::render::{fmt_time, print_json, print_table};

/// Runs one `taskq workflows` subcommand.
pub async fn run(client: &Client, action: &WorkflowsAction, json: bool) -> Result<(), Failure> {
    match action {
        WorkflowsAction::List {
            name,
            before,
            limit,
        } => {
            let rows = client
                .workflows(name.as_deref(), before.map(WorkflowId), *limit)
                .await?;
            if json {
                print_json(&serde_json::json!({ "workflows": rows }));
                return Ok(());
            }
            if rows.is_empty() {
                println!("no workflows");
                return Ok(());
            }
            print_table(
                &["ID", "NAME", "STATE", "STEPS", "PROGRESS", "CREATED AT"],
                rows.iter().map(line).collect(),
            );
            Ok(())
        }
        WorkflowsAction::Show { id } => {
            let wf = client.workflow(WorkflowId(*id)).await?;
            let steps = client.workflow_steps(WorkflowId(*id)).await?;
            if json {
                print_json(&serde_json::json!({ "workflow": wf, "steps": steps }));
                return Ok(());
            }
            print_table(
                &["ID", "NAME", "STATE", "STEPS", "PROGRESS", "CREATED AT"],
                vec![line(&wf)],
            );
            println!();
            print_table(
                &["STEP", "TASK", "NAME", "QUEUE", "STATE", "RUNS AFTER"],
                steps
                    .iter()
                    .map(|s| {
                        let mut state = s.state.to_string();
                        if s.canceled_by_dependency {
                            state.push_str(" (by a dependency)");
                        }
                        let mut after = s.after.join(", ");
                        if s.runs_after_failure {
                            after.push_str(" (cleanup: whatever their end)");
                        }
                        vec![
                            s.step.clone(),
                            s.task_id.to_string(),
                            s.name.clone(),
                            s.queue.clone(),
                            state,
                            after,
                        ]
                    })
                    .collect(),
            );
            Ok(())
        }
        WorkflowsAction::Cancel { id } => {
            let done = client.cancel_workflow(WorkflowId(*id)).await?;
            if json {
                print_json(&serde_json::json!({
                    "workflow_id": id,
                    "canceled": done.canceled,
                    "cancel_requested": done.cancel_requested,
                }));
                return Ok(());
            }
            println!(
                "workflow {id} canceled: {} steps canceled, {} running steps asked to cancel",
                done.canceled, done.cancel_requested
            );
            Ok(())
        }
    }
}

/// A workflow's row of the tables.
fn line(w: &WorkflowInfo) -> Vec<String> {
    vec![
        w.id.to_string(),
        w.name.clone(),
        w.state.to_string(),
        w.counts.total().to_string(),
        progress(&w.counts),
        fmt_time(w.created_at),
    ]
}

/// The non-zero counts, e.g. `3 succeeded, 1 running, 4 waiting`.
fn progress(c: &StepCounts) -> String {
    let parts: Vec<String> = [
        (c.succeeded, "succeeded"),
        (c.running, "running"),
        (c.pending, "pending"),
        (c.waiting, "waiting"),
        (c.dead, "dead"),
        (c.canceled, "canceled"),
        (c.expired, "expired"),
    ]
    .into_iter()
    .filter(|(n, _)| *n > 0)
    .map(|(n, what)| format!("{n} {what}"))
    .collect();
    parts.join(", ")
}
