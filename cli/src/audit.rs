//! The audit trail: who the CLI records as acting (the default of `--actor`), and
//! `taskq audit`, which lists the trail.

use taskq::Client;

use crate::failure::Failure;
use crate::render::{fmt_time, one_line, print_json, print_table};

/// The actor of the audit trail when `--actor` is not given: `cli:<user>@<host>`.
pub fn default_actor() -> String {
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .unwrap_or_else(|_| "unknown".into());
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown".into());
    format!("cli:{user}@{host}")
}

pub async fn audit(
    client: &Client,
    filter: &taskq::client::AuditFilter,
    json: bool,
) -> Result<(), Failure> {
    let entries = client.audit(filter).await?;
    if json {
        print_json(&entries);
        return Ok(());
    }
    if entries.is_empty() {
        println!("no audit entries");
        return Ok(());
    }
    let rows = entries
        .iter()
        .map(|e| {
            vec![
                e.id.to_string(),
                fmt_time(e.at),
                e.actor.clone(),
                e.action.clone(),
                e.task_id.map_or_else(|| "-".into(), |t| t.to_string()),
                e.queue.clone().unwrap_or_else(|| "-".into()),
                if e.detail.is_null() {
                    "-".into()
                } else {
                    one_line(&e.detail.to_string(), 100)
                },
            ]
        })
        .collect();
    print_table(
        &[">ID", "AT", "ACTOR", "ACTION", ">TASK", "QUEUE", "DETAIL"],
        rows,
    );
    if let Some(last) = entries
        .last()
        .filter(|_| Some(entries.len() as u32) == filter.limit)
    {
        eprintln!("(more may follow: next page with --before-id {})", last.id);
    }
    Ok(())
}
