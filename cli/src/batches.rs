//! `taskq batches`: list batches with their state and progress, show one with its members,
//! cancel one (audited).

use taskq::Client;
use taskq::batch::{BatchId, BatchInfo};

use crate::args::BatchesAction;
use crate::failure::Failure;
use crate::render::{fmt_time, print_json, print_table};

const HEAD: [&str; 8] = [
    "ID",
    "NAME",
    "STATE",
    "TOTAL",
    "SUCCEEDED",
    "FAILED",
    "PENDING",
    "CREATED AT",
];

/// Runs one `taskq batches` subcommand.
pub async fn run(client: &Client, action: &BatchesAction, json: bool) -> Result<(), Failure> {
    match action {
        BatchesAction::List {
            name,
            before,
            limit,
        } => {
            let rows = client
                .batches(name.as_deref(), before.map(BatchId), *limit)
                .await?;
            if json {
                print_json(&serde_json::json!({ "batches": rows }));
                return Ok(());
            }
            if rows.is_empty() {
                println!("no batches");
                return Ok(());
            }
            print_table(&HEAD, rows.iter().map(line).collect());
            Ok(())
        }
        BatchesAction::Show { id, limit, after } => {
            let b = client.batch(BatchId(*id)).await?;
            let members = client
                .batch_members(BatchId(*id), after.map(taskq::TaskId), *limit)
                .await?;
            if json {
                print_json(&serde_json::json!({ "batch": b, "members": members }));
                return Ok(());
            }
            print_table(&HEAD, vec![line(&b)]);
            let cb = |t: Option<taskq::TaskId>| t.map_or("-".to_string(), |t| t.to_string());
            println!(
                "\non_success task: {}   on_complete task: {}   sealed: {}",
                cb(b.on_success),
                cb(b.on_complete),
                if b.sealed { "yes" } else { "no (open)" }
            );
            println!();
            print_table(
                &["TASK", "NAME", "QUEUE", "STATE"],
                members
                    .iter()
                    .map(|m| {
                        vec![
                            m.task_id.to_string(),
                            m.name.clone(),
                            m.queue.clone(),
                            m.state.map_or("deleted".to_string(), |s| s.to_string()),
                        ]
                    })
                    .collect(),
            );
            Ok(())
        }
        BatchesAction::Cancel { id } => {
            let done = client.cancel_batch(BatchId(*id)).await?;
            if json {
                print_json(&serde_json::json!({
                    "batch_id": id,
                    "canceled": done.canceled,
                    "cancel_requested": done.cancel_requested,
                    "callbacks_canceled": done.callbacks_canceled,
                }));
                return Ok(());
            }
            println!(
                "batch {id} canceled: {} members canceled, {} running members asked to cancel, \
                 {} callbacks canceled",
                done.canceled, done.cancel_requested, done.callbacks_canceled
            );
            Ok(())
        }
    }
}

/// A batch's row of the tables.
fn line(b: &BatchInfo) -> Vec<String> {
    vec![
        b.id.to_string(),
        b.name.clone(),
        b.state.to_string(),
        b.total.to_string(),
        b.succeeded.to_string(),
        b.failed.to_string(),
        b.pending.to_string(),
        fmt_time(b.created_at),
    ]
}
