//! Commands on queues: `pause`, `resume`, `paused`, `limit`, `rate-limit` and `queues`.

use std::time::Duration;

use taskq::Client;

use crate::duration::format_duration;
use crate::failure::Failure;
use crate::render::{fmt_rate, fmt_time, print_json, print_table};
use crate::text::clean;

pub async fn pause(client: &Client, queue: &str, pause: bool, json: bool) -> Result<(), Failure> {
    let changed = if pause {
        client.pause_queue(queue).await?;
        true
    } else {
        client.resume_queue(queue).await?
    };
    let state = if pause { "paused" } else { "running" };
    let shown = clean(queue);
    if json {
        print_json(&serde_json::json!({ "queue": queue, "state": state, "changed": changed }));
    } else if changed {
        println!(
            "queue {shown}: {state} (workers notice within their poll interval, 1 s by default)"
        );
    } else {
        println!("queue {shown}: was not paused");
    }
    Ok(())
}

pub async fn paused(client: &Client, json: bool) -> Result<(), Failure> {
    let rows = client.paused_queues().await?;
    if json {
        let v: Vec<_> = rows
            .iter()
            .map(|(q, at)| serde_json::json!({ "queue": q, "paused_at": at }))
            .collect();
        print_json(&v);
    } else if rows.is_empty() {
        println!("no queue is paused");
    } else {
        for (q, at) in rows {
            println!(
                "{}\tpaused since {}",
                clean(&q),
                at.format("%Y-%m-%d %H:%M:%S UTC")
            );
        }
    }
    Ok(())
}

pub async fn set_limit(
    client: &Client,
    queue: &str,
    limit: Option<u32>,
    json: bool,
) -> Result<(), Failure> {
    client.set_queue_limit(queue, limit).await?;
    let shown = clean(queue);
    if json {
        print_json(&serde_json::json!({ "queue": queue, "concurrency_limit": limit }));
    } else if let Some(n) = limit {
        println!(
            "queue {shown}: at most {n} running at once over all workers (workers read it within their poll interval, 1 s by default)"
        );
    } else {
        println!("queue {shown}: no concurrency limit");
    }
    Ok(())
}

pub async fn set_rate_limit(
    client: &Client,
    queue: &str,
    rate: Option<(u32, Duration)>,
    json: bool,
) -> Result<(), Failure> {
    client.set_queue_rate_limit(queue, rate).await?;
    let rate = rate.map(|(max, period)| taskq::client::RateLimit { max, period });
    let shown = clean(queue);
    if json {
        print_json(&serde_json::json!({ "queue": queue, "rate_limit": rate }));
    } else if let Some(r) = rate {
        println!(
            "queue {shown}: at most {} starts per {} over all workers (workers read it within their poll interval, 1 s by default)",
            r.max,
            format_duration(r.period)
        );
    } else {
        println!("queue {shown}: no rate limit");
    }
    Ok(())
}

pub async fn queues(client: &Client, json: bool) -> Result<(), Failure> {
    let rows = client.queues().await?;
    if json {
        print_json(&rows);
        return Ok(());
    }
    if rows.is_empty() {
        println!("no queues: no task pending or running, none paused or limited");
        return Ok(());
    }
    let table = rows
        .iter()
        .map(|q| {
            vec![
                q.queue.clone(),
                match q.paused_at {
                    Some(t) => format!("paused since {}", fmt_time(t)),
                    None => "active".into(),
                },
                q.concurrency_limit
                    .map_or_else(|| "-".into(), |n| n.to_string()),
                q.rate_limit.as_ref().map_or_else(
                    || "-".into(),
                    |r| format!("{} ({} used)", fmt_rate(r), q.rate_used),
                ),
                match q.concurrency_limit {
                    Some(n) => format!("{}/{n}", q.running),
                    None => q.running.to_string(),
                },
                q.pending.to_string(),
            ]
        })
        .collect();
    print_table(
        &[
            "QUEUE",
            "STATE",
            ">LIMIT",
            "RATE LIMIT",
            ">RUNNING",
            ">PENDING",
        ],
        table,
    );
    Ok(())
}
