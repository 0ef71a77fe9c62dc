//! Commands on tasks: `list`, `show` (with its attempts and the worker holding a running
//! task), `retry`, `cancel` (one or in bulk), `reschedule`, `priority` and `purge`.

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use taskq::{
    Client, TaskId, TaskState, client::ListFilter, client::TaskInfo, client::WorkerInfo,
    client::WorkerStatus,
};

use crate::args::ListArgs;
use crate::duration::format_duration;
use crate::failure::{EXIT_OTHER, Failure};
use crate::render::{fmt_delta, fmt_std, fmt_time, one_line, plural, print_json, print_table};
use crate::text::{clean, clean_lines, json_safe};

pub async fn list(client: &Client, args: &ListArgs, json: bool) -> Result<(), Failure> {
    let filter = ListFilter {
        queue: args.queue.clone(),
        state: args.state.map(Into::into),
        name: args.name.clone(),
        after_id: args.after_id.map(TaskId),
        limit: Some(args.limit),
        ..Default::default()
    };
    let tasks = client.list(&filter).await?;
    if json {
        print_json(&tasks);
        return Ok(());
    }
    if tasks.is_empty() {
        println!("no matching tasks");
        return Ok(());
    }
    let rows = tasks
        .iter()
        .map(|t| {
            vec![
                t.id.to_string(),
                t.queue.clone(),
                t.name.clone(),
                t.state.to_string(),
                format!("{}/{}", t.attempt, t.max_attempts),
                t.snoozes.to_string(),
                fmt_time(t.run_at),
                fmt_time(t.updated_at),
                t.last_error
                    .as_deref()
                    .map_or_else(|| "-".into(), |e| one_line(e, 60)),
            ]
        })
        .collect();
    print_table(
        &[
            ">ID",
            "QUEUE",
            "NAME",
            "STATE",
            ">ATTEMPT",
            ">SNOOZES",
            "RUN AT",
            "UPDATED",
            "LAST ERROR",
        ],
        rows,
    );
    if let Some(last) = tasks.last().filter(|_| tasks.len() == args.limit as usize) {
        eprintln!("(more may follow: next page with --after-id {})", last.id);
    }
    Ok(())
}

pub async fn show(client: &Client, id: TaskId, json: bool) -> Result<(), Failure> {
    let task = client.get(id).await?;
    let attempts = client.attempts(id).await?;
    let payload = payload_value(&task);
    // Whether the worker holding a running task is alive, lost or stopped.
    let workers = if task.state == TaskState::Running {
        client.workers().await?
    } else {
        Vec::new()
    };
    let holder = task
        .worker_id
        .as_deref()
        .and_then(|id| workers.iter().find(|w| w.id == id));
    if json {
        let mut value = serde_json::to_value(&task)
            .map_err(|e| Failure::new(EXIT_OTHER, format!("cannot encode the task: {e}")))?;
        if let Some(obj) = value.as_object_mut() {
            obj.insert("payload".into(), payload);
            obj.insert(
                "attempts".into(),
                serde_json::to_value(&attempts).unwrap_or_default(),
            );
            if let Some(reason) = task.dead_reason() {
                obj.insert("dead_reason".into(), reason.to_string().into());
            }
            if let Some(w) = holder {
                obj.insert("worker_status".into(), w.status.as_str().into());
            }
        }
        print_json(&value);
        return Ok(());
    }
    let opt_time = |t: Option<DateTime<Utc>>| t.map_or_else(|| "-".into(), fmt_time);
    let opt = |s: &Option<String>| s.clone().unwrap_or_else(|| "-".into());
    let mut fields = vec![
        ("id", task.id.to_string()),
        ("queue", task.queue.clone()),
        ("name", task.name.clone()),
        ("state", task.state.to_string()),
        ("priority", task.priority.to_string()),
        (
            "attempt",
            format!("{} of {}", task.attempt, task.max_attempts),
        ),
        ("snoozes", task.snoozes.to_string()),
        ("run_at", fmt_time(task.run_at)),
        ("deadline", opt_time(task.deadline)),
        ("attempted_at", opt_time(task.attempted_at)),
        ("lease_until", opt_time(task.lease_until)),
        ("lease_epoch", task.lease_epoch.to_string()),
        ("worker_id", opt(&task.worker_id)),
        ("idempotency_key", opt(&task.idempotency_key)),
        (
            "unique_key",
            match &task.unique_key {
                Some(k) if task.unique_held => format!("{k} (held)"),
                Some(k) => format!("{k} (not held)"),
                None => "-".into(),
            },
        ),
        ("created_at", fmt_time(task.created_at)),
        ("updated_at", fmt_time(task.updated_at)),
        ("finished_at", opt_time(task.finished_at)),
    ];
    // Why a dead task died, derived from the row (see `TaskInfo::dead_reason`).
    if let Some(reason) = task.dead_reason() {
        fields.insert(4, ("dead", reason.to_string()));
    }
    if task.state == TaskState::Running {
        let now = client.db_now().await?;
        if let Some(line) = holder_line(&task, &workers, now) {
            let at = fields
                .iter()
                .position(|(k, _)| *k == "worker_id")
                .unwrap_or(0)
                + 1;
            fields.insert(at, ("worker", line));
        }
    }
    for (k, v) in fields {
        println!("{:<16} {}", format!("{k}:"), clean(&v));
    }
    // A multi-line error keeps its lines, indented under its first one; every control
    // character in it (ESC, BEL, a lone CR, C1) is escaped.
    match &task.last_error {
        None => println!("{:<16} -", "last_error:"),
        Some(e) => {
            for (i, line) in clean_lines(e).iter().enumerate() {
                let label = if i == 0 { "last_error:" } else { "" };
                println!("{label:<16} {line}");
            }
        }
    }
    println!("payload:");
    let pretty = match &payload {
        serde_json::Value::String(raw) if task.payload_json().is_err() => {
            clean_lines(&format!("(not valid JSON) {raw}")).join("\n")
        }
        v => json_safe(&serde_json::to_string_pretty(v).unwrap_or_default()).into_owned(),
    };
    for line in pretty.lines() {
        println!("  {line}");
    }
    print_attempts(&attempts);
    Ok(())
}

/// The attempt history of `taskq show`, oldest first.
fn print_attempts(attempts: &[taskq::client::Attempt]) {
    if attempts.is_empty() {
        println!("attempts:        none ended yet");
        return;
    }
    println!("attempts:");
    let rows = attempts
        .iter()
        .map(|a| {
            vec![
                a.attempt.to_string(),
                a.epoch.to_string(),
                a.worker_id.clone().unwrap_or_else(|| "-".into()),
                a.started_at.map_or_else(|| "-".into(), fmt_time),
                fmt_time(a.finished_at),
                a.duration().map_or_else(
                    || "-".into(),
                    |d| fmt_delta(TimeDelta::from_std(d).unwrap_or_default()),
                ),
                a.outcome.to_string(),
                a.error
                    .as_deref()
                    .map_or_else(|| "-".into(), |e| one_line(e, 80)),
            ]
        })
        .collect();
    print_table(
        &[
            ">#", ">EPOCH", "WORKER", "STARTED", "FINISHED", ">TOOK", "OUTCOME", "ERROR",
        ],
        rows,
    );
}

/// The payload as JSON, or as a (lossy) string when it is not valid JSON.
fn payload_value(task: &TaskInfo) -> serde_json::Value {
    task.payload_json().unwrap_or_else(|_| {
        serde_json::Value::String(String::from_utf8_lossy(&task.payload).into_owned())
    })
}

pub async fn retry_one(client: &Client, id: TaskId, json: bool) -> Result<(), Failure> {
    client.retry_dead(id).await?;
    if json {
        print_json(&serde_json::json!({ "id": id, "state": TaskState::Pending }));
    } else {
        println!("task {id}: dead -> pending");
    }
    Ok(())
}

pub async fn retry_dead(client: &Client, queue: Option<&str>, json: bool) -> Result<(), Failure> {
    let n = client.retry_all_dead(queue).await?;
    if json {
        print_json(&serde_json::json!({ "retried": n }));
    } else {
        let scope = queue.map_or_else(String::new, |q| format!(" in queue {q}"));
        println!("retried {n} dead task{}{scope}", plural(n));
    }
    Ok(())
}

pub async fn retry_where(
    client: &Client,
    filter: &taskq::client::BulkFilter,
    dry_run: bool,
    json: bool,
) -> Result<(), Failure> {
    let n = client.retry_where(filter, dry_run).await?;
    if json {
        print_json(&serde_json::json!({ "retried": n, "dry_run": dry_run }));
    } else if dry_run {
        println!("dry run: would retry {n} dead task{}", plural(n));
    } else {
        println!("retried {n} dead task{}", plural(n));
    }
    Ok(())
}

pub async fn cancel_where(
    client: &Client,
    filter: &taskq::client::BulkFilter,
    dry_run: bool,
    json: bool,
) -> Result<(), Failure> {
    let c = client.cancel_where(filter, dry_run).await?;
    if json {
        print_json(&serde_json::json!({
            "canceled": c.canceled, "cancel_requested": c.requested, "dry_run": dry_run
        }));
    } else if dry_run {
        println!(
            "dry run: would cancel {} pending task{} and request the cancel of {} running task{}",
            c.canceled,
            plural(c.canceled),
            c.requested,
            plural(c.requested)
        );
    } else {
        println!(
            "canceled {} pending task{}; requested the cancel of {} running task{}",
            c.canceled,
            plural(c.canceled),
            c.requested,
            plural(c.requested)
        );
    }
    Ok(())
}

pub async fn cancel(client: &Client, id: TaskId, json: bool) -> Result<(), Failure> {
    match client.cancel(id).await? {
        taskq::client::Canceled::Now if json => {
            print_json(&serde_json::json!({ "id": id, "state": TaskState::Canceled }));
        }
        taskq::client::Canceled::Now => println!("task {id}: canceled"),
        taskq::client::Canceled::Requested if json => print_json(&serde_json::json!({
            "id": id, "state": TaskState::Running, "cancel_requested": true
        })),
        taskq::client::Canceled::Requested => println!(
            "task {id}: running; cancel requested (its worker stops it at its next heartbeat)"
        ),
    }
    Ok(())
}

pub async fn reschedule(
    client: &Client,
    id: TaskId,
    delay: Option<Duration>,
    at: Option<DateTime<Utc>>,
    json: bool,
) -> Result<(), Failure> {
    match (delay, at) {
        (_, Some(at)) => client.reschedule_at(id, at).await?,
        (Some(delay), None) => client.reschedule(id, delay).await?,
        (None, None) => unreachable!("clap requires --in or --at"),
    }
    let task = client.get(id).await?;
    if json {
        print_json(&serde_json::json!({ "id": id, "state": task.state, "run_at": task.run_at }));
    } else {
        println!("task {id}: due at {}", fmt_time(task.run_at));
    }
    Ok(())
}

pub async fn set_priority(
    client: &Client,
    id: TaskId,
    priority: i16,
    json: bool,
) -> Result<(), Failure> {
    client.set_priority(id, priority).await?;
    if json {
        print_json(&serde_json::json!({ "id": id, "priority": priority }));
    } else {
        println!("task {id}: priority {priority}");
    }
    Ok(())
}

/// What `taskq show` says about the worker holding a running task.
fn holder_line(task: &TaskInfo, workers: &[WorkerInfo], now: DateTime<Utc>) -> Option<String> {
    if task.state != TaskState::Running {
        return None;
    }
    let id = task.worker_id.as_deref()?;
    let lease = match task.lease_until {
        Some(t) if t >= now => format!("its lease ends in {}", fmt_delta(t - now)),
        Some(t) => format!("its lease ended {} ago", fmt_delta(now - t)),
        None => "no lease".to_owned(),
    };
    Some(match workers.iter().find(|w| w.id == id) {
        None => format!("not recorded in taskq_workers; {lease}"),
        Some(w) => match w.status {
            WorkerStatus::Alive => format!("alive (last beat {} ago)", fmt_std(w.last_seen_ago)),
            WorkerStatus::Lost => format!(
                "LOST: worker lost, no heartbeat for {} (heartbeat every {}); {lease}, then \
                 the reaper returns the task to pending",
                fmt_std(w.last_seen_ago),
                fmt_std(w.heartbeat)
            ),
            WorkerStatus::Stopped => format!("stopped; {lease}"),
        },
    })
}

pub async fn purge(
    client: &Client,
    state: Option<TaskState>,
    older_than: Duration,
    json: bool,
) -> Result<(), Failure> {
    let n = client.purge(state, older_than).await?;
    if json {
        print_json(&serde_json::json!({ "purged": n }));
    } else {
        let what = state.map_or_else(|| "terminal".to_owned(), |s| s.to_string());
        println!(
            "purged {n} {what} task{} finished more than {} ago",
            plural(n),
            format_duration(older_than)
        );
    }
    Ok(())
}
