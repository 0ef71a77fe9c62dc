//! `taskq workers`: the workers that have not shut down (or all, with `--all`), alive or LOST.

use serde::Serialize;
use taskq::{Client, client::WorkerInfo, client::WorkerStatus};

use crate::failure::Failure;
use crate::render::{fmt_delta, fmt_std, fmt_time, print_json, print_table, secs_f64};

/// One line of `workers --json`: the row plus ages on the database clock.
#[derive(Serialize)]
struct WorkerLine<'a> {
    #[serde(flatten)]
    info: &'a WorkerInfo,
    /// Seconds since it was last seen.
    last_seen_secs_ago: f64,
    /// Seconds since it started.
    uptime_secs: f64,
}

pub async fn workers(client: &Client, all: bool, json: bool) -> Result<(), Failure> {
    let mut rows = client.workers().await?;
    let now = client.db_now().await?;
    if !all {
        rows.retain(|w| w.status != WorkerStatus::Stopped);
    }
    if json {
        let lines: Vec<WorkerLine<'_>> = rows
            .iter()
            .map(|w| WorkerLine {
                info: w,
                last_seen_secs_ago: w.last_seen_ago.as_secs_f64(),
                uptime_secs: secs_f64(now - w.started_at),
            })
            .collect();
        print_json(&serde_json::json!({ "now": now, "workers": lines }));
        return Ok(());
    }
    println!("database clock: {}", fmt_time(now));
    if rows.is_empty() {
        println!(
            "{}",
            if all {
                "no workers recorded"
            } else {
                "no live workers (`taskq workers --all` also lists stopped ones)"
            }
        );
        return Ok(());
    }
    let table = rows
        .iter()
        .map(|w| {
            let status = match w.status {
                WorkerStatus::Alive => "alive".to_owned(),
                WorkerStatus::Lost => "LOST".to_owned(),
                WorkerStatus::Stopped => format!(
                    "stopped {} ago",
                    fmt_delta(now - w.stopped_at.unwrap_or(w.last_seen_at))
                ),
            };
            let queues = w
                .queues
                .iter()
                .map(|(q, n)| format!("{q}:{n}"))
                .collect::<Vec<_>>()
                .join(",");
            vec![
                w.id.clone(),
                w.host.clone(),
                w.pid.to_string(),
                queues,
                format!("{}/{}", w.running, w.concurrency),
                fmt_time(w.started_at),
                format!("{} ago", fmt_std(w.last_seen_ago)),
                status,
            ]
        })
        .collect();
    print_table(
        &[
            "WORKER",
            "HOST",
            ">PID",
            "QUEUES",
            ">RUNNING",
            "STARTED",
            "LAST BEAT",
            "STATUS",
        ],
        table,
    );
    if rows.iter().any(|w| w.status == WorkerStatus::Lost) {
        eprintln!(
            "(LOST: no heartbeat for two of its heartbeat intervals, and no goodbye: crashed, \
             killed, hung or cut off from the database. Its running tasks stay claimed until \
             their leases end, then return to pending)"
        );
    }
    Ok(())
}
