//! Recurring tasks: a [`Schedule`] is a cron expression, a task value, a time zone and a
//! [`MissedTicks`] policy. Declare one on the task (`#[taskq::task(cron = "..")]`, or
//! [`Task::schedule`]) or on the worker ([`WorkerBuilder::cron`](crate::worker::WorkerBuilder::cron),
//! [`WorkerBuilder::schedule`](crate::worker::WorkerBuilder::schedule)).
//!
//! This module holds the public definition and the pure tick arithmetic; the worker's scheduler
//! loop (`worker::schedule`) applies it against the database clock.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, TimeDelta, TimeZone, Utc};
use croner::Cron;

use crate::defaults::{
    MAX_CATCH_UP_TICKS, MAX_NAME_LEN, MAX_SCHEDULE_NAME_LEN, MISSED_TICK_GRACE, validate_name,
};
use crate::error::{Error, Result};
use crate::task::Task;
use crate::task::enqueue::{Enqueue, IntoEnqueue};

/// What happens to ticks that passed while no worker ran the schedule (ticks found due more
/// than [`MISSED_TICK_GRACE`] after their time). The default is [`MissedTicks::Latest`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum MissedTicks {
    /// Run the latest missed tick once; skip the older ones (the default).
    #[default]
    Latest,
    /// Run none of them: the schedule resumes with its next tick.
    Skip,
    /// Run each missed tick, oldest first, but at most this many (the most recent ones; at
    /// most [`MAX_CATCH_UP_TICKS`]).
    All(u32),
}

impl fmt::Display for MissedTicks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Latest => f.write_str("latest"),
            Self::Skip => f.write_str("skip"),
            Self::All(n) => write!(f, "all({n})"),
        }
    }
}

impl FromStr for MissedTicks {
    type Err = String;
    /// Parses `latest`, `skip` or `all(N)` (1 ≤ N ≤ [`MAX_CATCH_UP_TICKS`]): the spelling of
    /// `#[task(missed_ticks = "..")]`.
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        use taskq_grammar::missed::{Missed, parse};
        Ok(match parse(s)? {
            Missed::Latest => Self::Latest,
            Missed::Skip => Self::Skip,
            Missed::All(n) => Self::All(n),
        })
    }
}

/// A recurring task: the task value to enqueue at every tick of a cron expression.
///
/// - **Expression**: 5 fields (`minute hour day-of-month month day-of-week`), or 6 with a
///   leading seconds field, or 7 with a trailing year; names (`MON`, `JAN`), ranges, lists,
///   steps, `L`, `W`, `#` and the nicknames `@yearly`, `@monthly`, `@weekly`, `@daily`,
///   `@hourly`. Day of week 0–7 (0 and 7 are Sunday); when both day fields are restricted a
///   day matching either runs (Vixie cron). Parsed by the [`croner`] crate.
/// - **Name** (default: the task's name): the schedule's identity in `taskq_schedules` and in
///   each tick's idempotency key (`cron:<name>:<tick>`); give each schedule of one task type a
///   name of its own.
/// - **Time zone** (default `UTC`): an IANA name (`Europe/Paris`, daylight saving handled: a
///   wall-clock time that does not exist runs at the next one that does, a repeated one runs
///   once) or a fixed offset (`+02:00`).
/// - **Missed ticks**: see [`MissedTicks`].
///
/// The task is enqueued with the options of the [`Enqueue`] given (queue, priority, max
/// attempts); its `run_at` is the tick, and delay, run-at and idempotency key cannot be set.
///
/// ```no_run
/// use taskq::{Task, TaskContext, TaskError, schedule::{MissedTicks, Schedule}};
///
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct NightlyReport { region: String }
/// impl Task for NightlyReport {
///     const NAME: &'static str = "nightly_report";
///     async fn run(self, _cx: TaskContext) -> Result<(), TaskError> { Ok(()) }
/// }
///
/// # async fn f(pool: sqlx::MySqlPool) -> taskq::Result<()> {
/// taskq::Worker::builder(pool)
///     .cron("0 3 * * *", NightlyReport { region: "eu".into() }) // 03:00 UTC
///     .schedule(
///         Schedule::new("0 3 * * *", NightlyReport { region: "us".into() })
///             .name("nightly_report_us")
///             .timezone("America/New_York")
///             .missed_ticks(MissedTicks::Skip),
///     )
///     .build()?
///     .run()
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
#[must_use = "a Schedule does nothing until it is given to WorkerBuilder::schedule"]
pub struct Schedule<T> {
    enqueue: Enqueue<T>,
    expression: String,
    name: Option<String>,
    timezone: String,
    missed: MissedTicks,
}

impl<T: Task> Schedule<T> {
    /// Enqueues `task` (a task, or a task with `with_*` options) at every tick of
    /// `expression`, in UTC, named after the task, missing ticks by [`MissedTicks::Latest`].
    pub fn new(expression: impl Into<String>, task: impl IntoEnqueue<Task = T>) -> Self {
        Self {
            enqueue: task.into_enqueue(),
            expression: expression.into(),
            name: None,
            timezone: "UTC".to_owned(),
            missed: MissedTicks::Latest,
        }
    }
    /// The schedule's name (default: the task's name); at most [`MAX_SCHEDULE_NAME_LEN`]
    /// bytes.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }
    /// The time zone the expression is read in: `UTC` (the default), an IANA name such as
    /// `Europe/Paris`, or a fixed offset such as `+02:00`.
    pub fn timezone(mut self, timezone: impl Into<String>) -> Self {
        self.timezone = timezone.into();
        self
    }
    /// What happens to ticks missed while no worker ran (default [`MissedTicks::Latest`]).
    pub fn missed_ticks(mut self, policy: MissedTicks) -> Self {
        self.missed = policy;
        self
    }

    /// Validates the schedule and erases its task type.
    pub(crate) fn into_def(self, declared_on: Declared) -> Result<ScheduleDef> {
        let name = self.name.unwrap_or_else(|| T::NAME.to_owned());
        validate_name("schedule name", &name, MAX_SCHEDULE_NAME_LEN)?;
        let bad = |reason: String| Error::InvalidCron {
            schedule: name.clone(),
            reason,
        };
        let (cron, expression) = parse_expression(&self.expression).map_err(bad)?;
        let (zone, timezone) = taskq_grammar::zone::parse(&self.timezone).map_err(bad)?;
        if let MissedTicks::All(n) = self.missed
            && (n == 0 || n > MAX_CATCH_UP_TICKS)
        {
            return Err(bad(format!(
                "MissedTicks::All({n}) is out of range: 1 ..= {MAX_CATCH_UP_TICKS} (use MissedTicks::Skip to run none)"
            )));
        }
        let ticks = Ticks { cron, zone };
        if ticks.next_after(Utc::now()).is_none() {
            return Err(bad(format!(
                "the expression {expression:?} has no tick in the next year"
            )));
        }
        let prepared = self.enqueue.prepare_for_schedule(&name)?;
        Ok(ScheduleDef {
            name,
            task_name: T::NAME,
            queue: prepared.queue,
            priority: prepared.priority,
            max_attempts: prepared.max_attempts,
            deadline: prepared.deadline,
            ttl_us: prepared.ttl_us,
            payload: prepared.payload,
            trace_context: prepared.trace_context,
            expression,
            timezone,
            ticks,
            missed: self.missed,
            declared_on,
        })
    }
}

/// Where a schedule was declared (decides what a queue the worker does not work means).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Declared {
    /// On the task (`#[task(cron)]` or [`Task::schedule`]): skipped by workers that do not
    /// work its queue.
    Task,
    /// On the worker builder: its queue must be one the worker works.
    Builder,
}

/// Parses a cron expression; returns it with surrounding whitespace trimmed.
pub(crate) fn parse_expression(expression: &str) -> std::result::Result<(Cron, String), String> {
    taskq_grammar::cron::parse(expression)
        .map_err(|reason| format!("invalid cron expression {:?}: {reason}", expression.trim()))
}

/// A time zone a schedule is read in (parsed by `taskq_grammar::zone::parse`, which also
/// returns its canonical spelling, stored in `taskq_schedules.timezone`).
pub(crate) use taskq_grammar::zone::Zone;

/// A parsed expression read in a time zone: the tick arithmetic.
#[derive(Debug, Clone)]
pub(crate) struct Ticks {
    cron: Cron,
    zone: Zone,
}

impl Ticks {
    /// The first tick strictly after `t`.
    pub(crate) fn next_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        match self.zone {
            Zone::Utc => next_in(&self.cron, &t),
            Zone::Fixed(o) => next_in(&self.cron, &t.with_timezone(&o)),
            Zone::Named(tz) => next_in(&self.cron, &t.with_timezone(&tz)),
        }
    }

    /// The latest tick at or before `t`.
    pub(crate) fn latest_at_or_before(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        match self.zone {
            Zone::Utc => prev_in(&self.cron, &t),
            Zone::Fixed(o) => prev_in(&self.cron, &t.with_timezone(&o)),
            Zone::Named(tz) => prev_in(&self.cron, &t.with_timezone(&tz)),
        }
    }

    /// The latest tick strictly before `t`.
    fn latest_before(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        // Ticks are whole seconds: "at or before t minus a microsecond", but croner reads
        // whole seconds, so step back to the previous second when `t` is on a second.
        let back = if t.timestamp_subsec_micros() == 0 {
            t - TimeDelta::seconds(1)
        } else {
            t
        };
        self.latest_at_or_before(back)
    }

    /// Which due ticks to enqueue, given the schedule's watermark (every tick at or before it
    /// is handled) and the database clock; `None` when no tick is due.
    pub(crate) fn plan(
        &self,
        watermark: DateTime<Utc>,
        now: DateTime<Utc>,
        missed: MissedTicks,
    ) -> Option<Plan> {
        let first = self.next_after(watermark)?;
        if first > now {
            return None;
        }
        let last = self.latest_at_or_before(now).filter(|l| *l >= first)?;
        let grace = TimeDelta::from_std(MISSED_TICK_GRACE).expect("grace fits");
        let missed_some = now - first > grace;
        let fire = if !missed_some {
            // On time (or a little behind): every due tick, oldest first.
            let mut fire = vec![first];
            while let Some(t) = self.next_after(*fire.last().expect("non-empty")) {
                if t > last || fire.len() >= MAX_CATCH_UP_TICKS as usize {
                    break;
                }
                fire.push(t);
            }
            fire
        } else {
            match missed {
                MissedTicks::Skip => Vec::new(),
                MissedTicks::Latest => vec![last],
                MissedTicks::All(n) => {
                    let n = n.min(MAX_CATCH_UP_TICKS) as usize;
                    let mut fire = vec![last];
                    while fire.len() < n {
                        match self.latest_before(*fire.last().expect("non-empty")) {
                            Some(t) if t > watermark => fire.push(t),
                            _ => break,
                        }
                    }
                    fire.reverse();
                    fire
                }
            }
        };
        Some(Plan {
            fire,
            watermark: last,
            missed: missed_some,
            next: self.next_after(last),
        })
    }
}

fn next_in<Tz: TimeZone>(cron: &Cron, t: &DateTime<Tz>) -> Option<DateTime<Utc>> {
    cron.find_next_occurrence(t, false)
        .ok()
        .map(|d| d.with_timezone(&Utc))
}

fn prev_in<Tz: TimeZone>(cron: &Cron, t: &DateTime<Tz>) -> Option<DateTime<Utc>> {
    cron.find_previous_occurrence(t, true)
        .ok()
        .map(|d| d.with_timezone(&Utc))
}

/// The outcome of [`Ticks::plan`].
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Plan {
    /// Ticks to enqueue, oldest first (empty: the policy skips every due tick).
    pub fire: Vec<DateTime<Utc>>,
    /// The new watermark: the latest due tick.
    pub watermark: DateTime<Utc>,
    /// Whether the due ticks were missed (found later than [`MISSED_TICK_GRACE`]).
    pub missed: bool,
    /// The first tick after the new watermark.
    pub next: Option<DateTime<Utc>>,
}

/// A validated schedule with its task type erased: what the worker's scheduler runs.
#[derive(Debug, Clone)]
pub(crate) struct ScheduleDef {
    pub name: String,
    pub task_name: &'static str,
    pub queue: String,
    pub priority: i16,
    pub max_attempts: u32,
    /// The task's deadline (absolute, or a time to live from each tick's insert).
    pub deadline: Option<DateTime<Utc>>,
    pub ttl_us: Option<i64>,
    pub payload: Vec<u8>,
    pub trace_context: Option<String>,
    /// The expression as stored (trimmed).
    pub expression: String,
    /// The time zone as stored (canonical spelling).
    pub timezone: String,
    pub ticks: Ticks,
    pub missed: MissedTicks,
    pub declared_on: Declared,
}

impl ScheduleDef {
    /// The idempotency key of one tick's task: `cron:<schedule>:<tick, RFC 3339 UTC>`.
    pub(crate) fn tick_key(&self, tick: DateTime<Utc>) -> String {
        schedule_tick_key(&self.name, tick)
    }
}

/// The idempotency key of the task a schedule enqueues for `tick`:
/// `cron:<schedule name>:<tick as YYYY-MM-DDTHH:MM:SSZ>`. Tasks enqueued by a schedule can be
/// found by it (`taskq list --name <task>` shows it in `idempotency_key`).
pub fn schedule_tick_key(schedule: &str, tick: DateTime<Utc>) -> String {
    format!("cron:{schedule}:{}", tick.format("%Y-%m-%dT%H:%M:%SZ"))
}

const _: () = assert!(MAX_SCHEDULE_NAME_LEN + "cron::YYYY-MM-DDTHH:MM:SSZ".len() <= MAX_NAME_LEN);

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn ticks(expr: &str, tz: &str) -> Ticks {
        Ticks {
            cron: parse_expression(expr).unwrap().0,
            zone: taskq_grammar::zone::parse(tz).unwrap().0,
        }
    }

    #[test]
    fn five_six_and_seven_fields() {
        let t = ticks("0 3 * * *", "UTC");
        assert_eq!(
            t.next_after(at("2026-01-01T03:00:00Z")),
            Some(at("2026-01-02T03:00:00Z"))
        );
        let t = ticks("*/5 * * * * *", "UTC");
        assert_eq!(
            t.next_after(at("2026-01-01T00:00:01.5Z")),
            Some(at("2026-01-01T00:00:05Z"))
        );
        let t = ticks("0 0 12 1 1 * 2030", "UTC");
        assert_eq!(
            t.next_after(at("2026-01-01T00:00:00Z")),
            Some(at("2030-01-01T12:00:00Z"))
        );
        let e = parse_expression("61 * * * *").unwrap_err();
        assert!(e.contains("its minute field \"61\" is invalid"), "{e}");
        let e = parse_expression("0 0 25 * * *").unwrap_err();
        assert!(e.contains("its hour field \"25\" is invalid"), "{e}");
        assert!(parse_expression("* * *").is_err());
        assert!(parse_expression("").is_err());
    }

    #[test]
    fn zones_and_daylight_saving() {
        // Paris is UTC+1 in winter, UTC+2 in summer.
        let t = ticks("0 3 * * *", "Europe/Paris");
        assert_eq!(
            t.next_after(at("2026-01-10T00:00:00Z")),
            Some(at("2026-01-10T02:00:00Z"))
        );
        assert_eq!(
            t.next_after(at("2026-07-10T00:00:00Z")),
            Some(at("2026-07-10T01:00:00Z"))
        );
        // 02:30 does not exist on 2026-03-29 in Paris (02:00 CET jumps to 03:00 CEST): it
        // runs at 03:00 CEST, the first valid time after the gap.
        let t = ticks("30 2 * * *", "Europe/Paris");
        let spring = t.next_after(at("2026-03-28T12:00:00Z")).unwrap();
        assert_eq!(spring, at("2026-03-29T01:00:00Z"));
        // 02:30 happens twice on 2026-10-25 (03:00 CEST goes back to 02:00 CET): it runs
        // once, at the first.
        let fall: Vec<_> = std::iter::successors(t.next_after(at("2026-10-24T12:00:00Z")), |x| {
            t.next_after(*x)
        })
        .take_while(|x| *x < at("2026-10-26T00:00:00Z"))
        .collect();
        assert_eq!(fall, vec![at("2026-10-25T00:30:00Z")]);
        let t = ticks("0 9 * * *", "+05:30");
        assert_eq!(
            t.next_after(at("2026-01-01T00:00:00Z")),
            Some(at("2026-01-01T03:30:00Z"))
        );
    }

    #[test]
    fn missed_tick_policies_parse_and_print() {
        for p in [MissedTicks::Latest, MissedTicks::Skip, MissedTicks::All(7)] {
            assert_eq!(p.to_string().parse::<MissedTicks>().unwrap(), p);
        }
        assert!("all(0)".parse::<MissedTicks>().is_err());
        assert!("all(x)".parse::<MissedTicks>().is_err());
        assert!("none".parse::<MissedTicks>().is_err());
    }

    #[test]
    fn on_time_ticks_all_fire() {
        let t = ticks("* * * * * *", "UTC");
        let w = at("2026-01-01T00:00:00Z");
        assert_eq!(
            t.plan(w, at("2026-01-01T00:00:00.900Z"), MissedTicks::Skip),
            None
        );
        let p = t
            .plan(w, at("2026-01-01T00:00:03.2Z"), MissedTicks::Skip)
            .unwrap();
        assert_eq!(
            p.fire,
            vec![
                at("2026-01-01T00:00:01Z"),
                at("2026-01-01T00:00:02Z"),
                at("2026-01-01T00:00:03Z")
            ]
        );
        assert_eq!(p.watermark, at("2026-01-01T00:00:03Z"));
        assert_eq!(p.next, Some(at("2026-01-01T00:00:04Z")));
        assert!(!p.missed);
    }

    #[test]
    fn missed_ticks_follow_the_policy() {
        let t = ticks("*/10 * * * * *", "UTC");
        let w = at("2026-01-01T00:00:00Z");
        let now = at("2026-01-01T00:10:05Z");
        let latest = t.plan(w, now, MissedTicks::Latest).unwrap();
        assert!(latest.missed);
        assert_eq!(latest.fire, vec![at("2026-01-01T00:10:00Z")]);
        assert_eq!(latest.watermark, at("2026-01-01T00:10:00Z"));
        let skip = t.plan(w, now, MissedTicks::Skip).unwrap();
        assert!(skip.fire.is_empty());
        assert_eq!(skip.watermark, latest.watermark);
        let all = t.plan(w, now, MissedTicks::All(3)).unwrap();
        assert_eq!(
            all.fire,
            vec![
                at("2026-01-01T00:09:40Z"),
                at("2026-01-01T00:09:50Z"),
                at("2026-01-01T00:10:00Z")
            ]
        );
        // All(n) never goes back past the watermark.
        let all = t
            .plan(at("2026-01-01T00:08:55Z"), now, MissedTicks::All(1000))
            .unwrap();
        assert_eq!(all.fire.first(), Some(&at("2026-01-01T00:09:00Z")));
        assert_eq!(all.fire.len(), 7);
    }

    #[test]
    fn tick_keys_fit_the_idempotency_key() {
        let name = "n".repeat(MAX_SCHEDULE_NAME_LEN);
        let key = schedule_tick_key(&name, at("2026-01-01T00:00:00Z"));
        assert!(key.len() <= MAX_NAME_LEN);
        assert_eq!(
            schedule_tick_key("nightly", at("2026-01-01T03:00:00Z")),
            "cron:nightly:2026-01-01T03:00:00Z"
        );
    }
}
