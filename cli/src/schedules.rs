//! `taskq schedules`: the recurring (cron) schedules and whether a worker fires them, and
//! `taskq schedules delete`.

use chrono::{DateTime, TimeDelta, Utc};
use serde::Serialize;
use taskq::{Client, client::ScheduleInfo};

use crate::failure::{EXIT_TASK, Failure};
use crate::render::{fmt_delta, fmt_time, print_json, print_table, secs_f64};
use crate::text::clean;

/// How long past its next tick a schedule must be before it is shown as overdue: the
/// workers' missed-tick grace (a tick reached later than that counts as missed).
const OVERDUE_AFTER: TimeDelta =
    TimeDelta::seconds(taskq::defaults::MISSED_TICK_GRACE.as_secs() as i64);

/// One line of `schedules --json`: the row plus what it means on the database clock.
#[derive(Serialize)]
struct ScheduleLine<'a> {
    #[serde(flatten)]
    info: &'a ScheduleInfo,
    /// Seconds until the next tick (negative: past).
    #[serde(skip_serializing_if = "Option::is_none")]
    next_tick_in_secs: Option<f64>,
    /// The next tick is more than the missed-tick grace past: no worker is firing it.
    overdue: bool,
}

fn overdue(s: &ScheduleInfo, now: DateTime<Utc>) -> bool {
    s.next_tick.is_some_and(|t| now - t > OVERDUE_AFTER)
}

pub async fn schedules(client: &Client, json: bool) -> Result<(), Failure> {
    let rows = client.schedules().await?;
    let now = client.db_now().await?;
    if json {
        let lines: Vec<ScheduleLine<'_>> = rows
            .iter()
            .map(|s| ScheduleLine {
                info: s,
                next_tick_in_secs: s.next_tick.map(|t| secs_f64(t - now)),
                overdue: overdue(s, now),
            })
            .collect();
        print_json(&serde_json::json!({ "now": now, "schedules": lines }));
        return Ok(());
    }
    println!("database clock: {}", fmt_time(now));
    if rows.is_empty() {
        println!("no schedules (workers record theirs when they start)");
        return Ok(());
    }
    let table = rows
        .iter()
        .map(|s| {
            let last = s.last_tick.map_or_else(|| "-".into(), fmt_time);
            let next = match s.next_tick {
                None => "-".into(),
                Some(t) if overdue(s, now) => {
                    format!("{} (OVERDUE {} ago)", fmt_time(t), fmt_delta(now - t))
                }
                Some(t) if t >= now => format!("{} (in {})", fmt_time(t), fmt_delta(t - now)),
                Some(t) => format!("{} ({} ago)", fmt_time(t), fmt_delta(now - t)),
            };
            vec![
                s.name.clone(),
                s.queue.clone(),
                s.task_name.clone(),
                s.expression.clone(),
                s.timezone.clone(),
                s.missed_ticks.clone(),
                last,
                next,
            ]
        })
        .collect();
    print_table(
        &[
            "NAME",
            "QUEUE",
            "TASK",
            "EXPRESSION",
            "TIMEZONE",
            "MISSED",
            "LAST TICK",
            "NEXT TICK",
        ],
        table,
    );
    if rows.iter().any(|s| overdue(s, now)) {
        eprintln!(
            "(OVERDUE: no running worker fires it — all its workers are stopped, or it was \
             removed from the code: `taskq schedules delete NAME` removes its row)"
        );
    }
    Ok(())
}

pub async fn delete_schedule(client: &Client, name: &str, json: bool) -> Result<(), Failure> {
    let deleted = client.delete_schedule(name).await?;
    if json {
        print_json(&serde_json::json!({ "name": name, "deleted": deleted }));
        return Ok(());
    }
    if !deleted {
        return Err(Failure::new(
            EXIT_TASK,
            format!("no schedule named {name:?}"),
        ));
    }
    println!("schedule {}: deleted", clean(name));
    Ok(())
}
