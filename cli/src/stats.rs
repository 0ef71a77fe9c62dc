//! Counts: `taskq stats` (tasks per queue and state) and `taskq names` (pending tasks per
//! queue and task name, and the live workers that would claim them).

use serde::Serialize;
use taskq::{Client, TaskState, client::PendingNameCount, client::QueueStateCount};

use crate::failure::Failure;
use crate::render::{fmt_delta, fmt_time, plural, print_json, print_table, secs_f64};

/// One line of `stats --json`: the counts plus ages computed on the database clock.
#[derive(Serialize)]
struct StatsLine<'a> {
    #[serde(flatten)]
    counts: &'a QueueStateCount,
    /// Pending only: seconds since the oldest due time (negative: nothing due yet).
    #[serde(skip_serializing_if = "Option::is_none")]
    oldest_pending_age_secs: Option<f64>,
    /// Running only: seconds until the earliest lease ends (negative: already expired).
    #[serde(skip_serializing_if = "Option::is_none")]
    earliest_lease_expires_in_secs: Option<f64>,
}

pub async fn stats(client: &Client, json: bool) -> Result<(), Failure> {
    let counts = client.stats().await?;
    let now = client.db_now().await?;
    let lines: Vec<StatsLine<'_>> = counts
        .iter()
        .map(|c| StatsLine {
            counts: c,
            oldest_pending_age_secs: (c.state == TaskState::Pending)
                .then_some(c.oldest_run_at)
                .flatten()
                .map(|t| secs_f64(now - t)),
            earliest_lease_expires_in_secs: (c.state == TaskState::Running)
                .then_some(c.earliest_lease_until)
                .flatten()
                .map(|t| secs_f64(t - now)),
        })
        .collect();
    if json {
        print_json(&serde_json::json!({ "now": now, "counts": lines }));
        return Ok(());
    }
    println!("database clock: {}", fmt_time(now));
    if lines.is_empty() {
        println!("no tasks");
        return Ok(());
    }
    let rows = lines
        .iter()
        .map(|l| {
            let c = l.counts;
            let oldest = match (c.state, c.oldest_run_at) {
                (TaskState::Pending, Some(t)) if t <= now => fmt_delta(now - t),
                (TaskState::Pending, Some(t)) => format!("due in {}", fmt_delta(t - now)),
                _ => "-".into(),
            };
            let lease = match (c.state, c.earliest_lease_until) {
                (TaskState::Running, Some(t)) if t >= now => format!("in {}", fmt_delta(t - now)),
                (TaskState::Running, Some(t)) => format!("EXPIRED {} ago", fmt_delta(now - t)),
                _ => "-".into(),
            };
            vec![
                c.queue.clone(),
                c.state.to_string(),
                c.count.to_string(),
                oldest,
                lease,
            ]
        })
        .collect();
    print_table(
        &[
            "QUEUE",
            "STATE",
            ">COUNT",
            "OLDEST PENDING",
            "EARLIEST LEASE END",
        ],
        rows,
    );
    Ok(())
}

/// One line of `names --json`: the counts plus the age of the oldest due task and how many
/// live workers would claim them.
#[derive(Serialize)]
struct NameLine<'a> {
    #[serde(flatten)]
    counts: &'a PendingNameCount,
    /// Seconds since the oldest due task became due; absent when none is due yet.
    #[serde(skip_serializing_if = "Option::is_none")]
    oldest_due_age_secs: Option<f64>,
    /// Alive workers that work the queue and register the name (0: its tasks stay pending).
    live_workers: usize,
}

pub async fn names(client: &Client, queue: Option<&str>, json: bool) -> Result<(), Failure> {
    let counts = client.pending_by_name(queue).await?;
    let workers = client.workers().await?;
    let now = client.db_now().await?;
    let due_age = |c: &PendingNameCount| (c.due > 0).then(|| now - c.oldest_run_at);
    let live = |c: &PendingNameCount| {
        workers
            .iter()
            .filter(|w| w.alive && w.handles(&c.queue, &c.name))
            .count()
    };
    if json {
        let lines: Vec<NameLine<'_>> = counts
            .iter()
            .map(|c| NameLine {
                counts: c,
                oldest_due_age_secs: due_age(c).map(secs_f64),
                live_workers: live(c),
            })
            .collect();
        print_json(&serde_json::json!({ "now": now, "names": lines }));
        return Ok(());
    }
    println!("database clock: {}", fmt_time(now));
    if counts.is_empty() {
        println!("no pending tasks");
        return Ok(());
    }
    let rows = counts
        .iter()
        .map(|c| {
            let oldest = match due_age(c) {
                Some(age) => fmt_delta(age),
                None => format!("due in {}", fmt_delta(c.oldest_run_at - now)),
            };
            let handled = match live(c) {
                0 => "NO LIVE WORKER".to_owned(),
                n => format!("{n} live worker{}", plural(n as u64)),
            };
            vec![
                c.queue.clone(),
                c.name.clone(),
                c.pending.to_string(),
                c.due.to_string(),
                oldest,
                handled,
            ]
        })
        .collect();
    print_table(
        &[
            "QUEUE",
            "NAME",
            ">PENDING",
            ">DUE",
            "OLDEST DUE",
            "HANDLED BY",
        ],
        rows,
    );
    if counts.iter().any(|c| c.due > 0 && live(c) == 0) {
        eprintln!(
            "(NO LIVE WORKER: no alive worker works this queue and registers this name, so its \
             due tasks stay pending; workers log them at WARN once a minute. Run a worker that \
             registers it, or cancel them: taskq cancel --name NAME --state pending)"
        );
    }
    Ok(())
}

/// `taskq held-keys`: the order keys held back by their head.
pub async fn held_keys(
    client: &Client,
    queue: Option<&str>,
    limit: u32,
    json: bool,
) -> Result<(), Failure> {
    let keys = client.held_keys(queue, limit).await?;
    if json {
        print_json(&serde_json::json!({ "held_keys": keys }));
        return Ok(());
    }
    if keys.is_empty() {
        println!("no order key is held back");
        return Ok(());
    }
    let rows = keys
        .iter()
        .map(|k| {
            vec![
                k.queue.clone(),
                k.order_key[..16].to_owned(),
                k.head.to_string(),
                k.name.clone(),
                k.state.to_string(),
                k.attempt.to_string(),
                k.waiting.to_string(),
                k.last_error
                    .as_deref()
                    .unwrap_or("")
                    .chars()
                    .take(60)
                    .collect(),
            ]
        })
        .collect();
    print_table(
        &[
            "QUEUE",
            "KEY",
            ">HEAD",
            "NAME",
            "STATE",
            ">ATTEMPT",
            ">WAITING",
            "LAST ERROR",
        ],
        rows,
    );
    if keys.iter().any(|k| k.state == TaskState::Dead) {
        eprintln!(
            "(a dead head holds its key: retry it (taskq retry ID) to run it again first, or \
             delete it (the dashboard, or Client::delete) to let the tasks behind it run)"
        );
    }
    Ok(())
}
