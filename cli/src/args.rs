//! The command line: `taskq`'s global options, its commands and their arguments (clap), and
//! the parsers of the values clap cannot parse itself (times, rates).

use std::time::Duration;

use chrono::{DateTime, Utc};
use clap::{Args, Parser, Subcommand, ValueEnum};
use taskq::TaskState;

use crate::duration::parse_duration;

#[derive(Debug, Parser)]
#[command(
    name = "taskq",
    version,
    about = "Inspect and manage a taskq database",
    after_help = "Exit codes: 0 ok, 1 other error, 2 bad input, 3 task (or schedule) not found \
                  or in the wrong state, 4 database unreachable."
)]
pub struct Cli {
    /// Database URL: mysql://user:password@host:3306/app, or a SQLite file: sqlite://path/to/app.db
    /// (also sqlite:app.db, sqlite:///abs/path.db)
    #[arg(
        long,
        env = "DATABASE_URL",
        global = true,
        hide_env_values = true,
        value_name = "URL"
    )]
    pub database_url: Option<String>,

    /// Print JSON (for scripts) instead of tables
    #[arg(long, global = true)]
    pub json: bool,

    /// Who is acting, as recorded in the audit trail (default: cli:$USER@<host name>)
    #[arg(long, global = true, env = "TASKQ_ACTOR", value_name = "NAME")]
    pub actor: Option<String>,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Apply taskq's schema migrations
    Migrate,
    /// Task counts per queue and state, oldest pending age, earliest lease expiry
    Stats,
    /// Pending tasks per queue and task name: count, due count, age of the oldest due one, and
    /// how many live workers would claim them (`NO LIVE WORKER`: no alive worker works the
    /// queue and registers the name, so its due tasks stay pending)
    Names {
        /// Only this queue
        #[arg(long)]
        queue: Option<String>,
    },
    /// Order keys held back by their head (ordered tasks): a head that failed and is waiting
    /// for its next attempt or running again, or a dead head that holds its key until it is
    /// retried or deleted; with how many tasks wait behind each
    HeldKeys {
        /// Only this queue
        #[arg(long)]
        queue: Option<String>,
        /// At most this many keys
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
    /// List tasks, oldest id first (paged: pass the last id shown as --after-id)
    List(ListArgs),
    /// Show every field of one task, its last error, its payload, why a dead task died and
    /// its attempts (worker, start, end, outcome, error of each)
    Show {
        /// Task id
        id: u64,
    },
    /// Move a dead task (or all dead tasks) back to pending with attempts reset
    #[command(group = clap::ArgGroup::new("target").required(true).args(["id", "dead"]))]
    Retry {
        /// Task id of a dead task
        id: Option<u64>,
        /// Retry every dead task (of --queue, or of all queues)
        #[arg(long, conflicts_with = "id")]
        dead: bool,
        /// With --dead: only this queue
        #[arg(long, requires = "dead", conflicts_with = "id")]
        queue: Option<String>,
        /// With --dead: only this task name
        #[arg(long, requires = "dead", conflicts_with = "id")]
        name: Option<String>,
        /// With --dead: only tasks enqueued at least this long ago, e.g. 1h, 7d
        #[arg(long, value_name = "AGE", value_parser = parse_duration, requires = "dead", conflicts_with = "id")]
        older_than: Option<Duration>,
        /// With --dead: only count the tasks that would be retried
        #[arg(long, requires = "dead", conflicts_with = "id")]
        dry_run: bool,
    },
    /// Cancel a task: a pending one at once; a running one is asked to stop (its worker
    /// cancels it at its next heartbeat). Finished tasks cannot be canceled. Without an id,
    /// cancels every task matching the filters (at least one), 500 rows per statement
    #[command(group = clap::ArgGroup::new("target").required(true).multiple(true)
        .args(["id", "queue", "name", "state", "older_than"]))]
    Cancel {
        /// Task id
        id: Option<u64>,
        /// Bulk: only this queue
        #[arg(long, conflicts_with = "id")]
        queue: Option<String>,
        /// Bulk: only this task name
        #[arg(long, conflicts_with = "id")]
        name: Option<String>,
        /// Bulk: only this state (default: pending, waiting and running; pending includes the
        /// ordered tasks waiting behind their key's head)
        #[arg(long, value_enum, conflicts_with = "id")]
        state: Option<CancelState>,
        /// Bulk: only tasks enqueued at least this long ago, e.g. 1h, 7d
        #[arg(long, value_name = "AGE", value_parser = parse_duration, conflicts_with = "id")]
        older_than: Option<Duration>,
        /// Bulk: only count the tasks that would be canceled
        #[arg(long, conflicts_with = "id")]
        dry_run: bool,
    },
    /// Move the due time of a pending task (running and finished tasks are refused)
    #[command(group = clap::ArgGroup::new("when").required(true).args(["delay", "at"]))]
    Reschedule {
        /// Task id
        id: u64,
        /// Due this long from now (database clock), e.g. 10m, 2h, 0s for now
        #[arg(long = "in", value_name = "DELAY", value_parser = parse_duration)]
        delay: Option<Duration>,
        /// Due at this time, RFC 3339, e.g. 2025-03-14T09:30:00Z
        #[arg(long, value_name = "TIME", value_parser = parse_time)]
        at: Option<DateTime<Utc>>,
    },
    /// Set the priority of a pending task (lower runs first; running and finished tasks are
    /// refused)
    Priority {
        /// Task id
        id: u64,
        /// New priority, -32768..=32767
        #[arg(allow_negative_numbers = true)]
        priority: i16,
    },
    /// Delete terminal tasks (succeeded, dead, canceled, expired) that finished more than a given
    /// age ago
    Purge {
        /// Minimum age since the task finished, e.g. 7d, 12h, 30m, 45s
        #[arg(long, value_name = "AGE", value_parser = parse_duration)]
        older_than: Duration,
        /// Only this terminal state (default: all four)
        #[arg(long, value_enum)]
        state: Option<TerminalState>,
    },
    /// Stop workers from claiming tasks of a queue (running tasks finish; enqueues still work)
    Pause {
        /// Queue name
        queue: String,
    },
    /// Let workers claim from a paused queue again
    Resume {
        /// Queue name
        queue: String,
    },
    /// List paused queues
    Paused,
    /// Queues with tasks pending or running, or paused or limited: state, concurrency limit,
    /// rate limit (and starts in the current window), running and pending counts
    Queues,
    /// Set a queue's concurrency limit across all workers (live: workers read it within their
    /// poll ceiling, 1 s by default), or clear it with --clear
    #[command(group = clap::ArgGroup::new("value").required(true).args(["limit", "clear"]))]
    Limit {
        /// Queue name
        queue: String,
        /// Most tasks of the queue running at once, over all workers (1..=1000000)
        limit: Option<u32>,
        /// Remove the limit
        #[arg(long, conflicts_with = "limit")]
        clear: bool,
    },
    /// Set a queue's rate limit across all workers: at most N starts per window, e.g. 10/1m,
    /// 5/s, 1000/1h (windows aligned on the database clock), or clear it with --clear
    #[command(name = "rate-limit", group = clap::ArgGroup::new("value").required(true).args(["rate", "clear"]))]
    RateLimit {
        /// Queue name
        queue: String,
        /// N/PERIOD: at most N starts per PERIOD (s, m, h, d, w; e.g. 10/1m or 10/m)
        #[arg(value_parser = parse_rate)]
        rate: Option<(u32, Duration)>,
        /// Remove the rate limit
        #[arg(long, conflicts_with = "rate")]
        clear: bool,
    },
    /// Workers that have not shut down: id, host, pid, queues, how many tasks each is
    /// running, when it started, the age of its last heartbeat (database clock), and its
    /// status: alive, or LOST (no heartbeat for two of its intervals: crashed, killed, hung
    /// or cut off from the database). `--all` adds stopped workers; rows are kept for a day
    Workers {
        /// Also list stopped workers
        #[arg(long)]
        all: bool,
    },
    /// The audit trail of operator actions (cancel, retry, reschedule, pause, bulk
    /// operations...), newest first: when (database clock), who, what
    Audit {
        /// Only actions on this task
        #[arg(long, value_name = "ID")]
        task: Option<u64>,
        /// Only actions on this queue or its tasks
        #[arg(long)]
        queue: Option<String>,
        /// Only entries older than this id (the last id of the previous page)
        #[arg(long, value_name = "ID")]
        before_id: Option<u64>,
        /// Page size
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=10_000))]
        limit: u32,
    },
    /// Recurring (cron) schedules: expression, time zone, last and next tick (database clock).
    /// A schedule whose next tick is well past is not being fired: no running worker declares
    /// it (stopped, or removed from the code)
    Schedules {
        #[command(subcommand)]
        action: Option<SchedulesAction>,
    },
    /// Events (the outbox): per-topic backlog and lag, keys held back by a rejected event,
    /// replay (audited), retention of delivered events
    Events {
        #[command(subcommand)]
        action: EventsAction,
    },
    /// Workflows (docs/workflows.md): list them with their state and progress, show one's
    /// steps, cancel one (audited)
    Workflows {
        #[command(subcommand)]
        action: WorkflowsAction,
    },
    /// Batches (docs/workflows.md, "Batches"): list them with their state and progress, show
    /// one with its members, cancel one (audited)
    Batches {
        #[command(subcommand)]
        action: BatchesAction,
    },
    /// Serve the web dashboard and JSON API (docs/dashboard.md) until Ctrl-C. Authentication is
    /// required: --token and/or --basic (or TASKQ_WEB_TOKEN / TASKQ_WEB_BASIC), or
    /// --insecure-no-auth. This binary registers no tasks, so the API's enqueue-by-name
    /// answers 404 for every name: mount the dashboard in your own app for that
    Web(WebArgs),
}

#[derive(Debug, Args)]
pub struct WebArgs {
    /// Address to listen on
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8080")]
    pub listen: std::net::SocketAddr,
    /// Bearer token (Authorization: Bearer, or on the login page); at least 8 characters.
    /// Prefer TASKQ_WEB_TOKEN or --token-file: a flag's value shows in the process list
    #[arg(long, env = "TASKQ_WEB_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Read the bearer token from this file (trailing newline ignored)
    #[arg(long, value_name = "PATH", conflicts_with = "token")]
    pub token_file: Option<std::path::PathBuf>,
    /// Basic credentials (the browser asks for them, or the login page)
    #[arg(
        long,
        env = "TASKQ_WEB_BASIC",
        hide_env_values = true,
        value_name = "USER:PASSWORD"
    )]
    pub basic: Option<String>,
    /// Serve without authentication (only behind something that authenticates); refused on
    /// a non-loopback --listen address unless --allow-public-no-auth is given too
    #[arg(long, conflicts_with_all = ["token", "token_file", "basic"])]
    pub insecure_no_auth: bool,
    /// Allow --insecure-no-auth on a non-loopback address (anyone who reaches it can change tasks)
    #[arg(long, requires = "insecure_no_auth")]
    pub allow_public_no_auth: bool,
    /// A Host name the dashboard answers (repeat, or comma-separate in the variable);
    /// default: the --listen address (with localhost for a loopback one), any name when
    /// listening on every interface with authentication on
    #[arg(
        long = "allowed-host",
        env = "TASKQ_WEB_ALLOWED_HOSTS",
        value_delimiter = ',',
        value_name = "HOST[:PORT]"
    )]
    pub allowed_hosts: Vec<String>,
    /// Read the secret that signs sessions from this file (at least 32 bytes; replicas behind
    /// one load balancer share it); default: a random secret per process
    #[arg(long, env = "TASKQ_WEB_SESSION_SECRET_FILE", value_name = "PATH")]
    pub session_secret_file: Option<std::path::PathBuf>,
    /// Refuse every change and hide the controls that make them
    #[arg(long)]
    pub read_only: bool,
    /// Serve under this path prefix, e.g. /taskq (default: at the root)
    #[arg(long, value_name = "PATH")]
    pub prefix: Option<String>,
    /// Mark the cookies Secure (when served over HTTPS, e.g. behind a TLS proxy)
    #[arg(long)]
    pub secure_cookies: bool,
}

#[derive(Debug, Subcommand)]
pub enum BatchesAction {
    /// Batches, newest first: id, name, state, total, succeeded, failed, pending, when enqueued
    List {
        /// Only batches of this name
        #[arg(long)]
        name: Option<String>,
        /// Only batches with an id below this one (the last id of the previous page)
        #[arg(long, value_name = "ID")]
        before: Option<u64>,
        /// Page size
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=1000))]
        limit: u32,
    },
    /// One batch: its state, progress and callbacks, and a page of its members with their states
    Show {
        /// The batch's id
        id: u64,
        /// Members per page
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=1000))]
        limit: u32,
        /// Only members with a task id above this one (the last id of the previous page)
        #[arg(long, value_name = "TASK_ID")]
        after: Option<u64>,
    },
    /// Cancel a batch: its waiting and pending members and its callbacks now, its running
    /// members at their next heartbeat (recorded in the audit trail)
    Cancel {
        /// The batch's id
        id: u64,
    },
}

#[derive(Debug, Subcommand)]
pub enum WorkflowsAction {
    /// Workflows, newest first: id, name, state, steps per state, when enqueued
    List {
        /// Only workflows of this name
        #[arg(long)]
        name: Option<String>,
        /// Only workflows with an id below this one (the last id of the previous page)
        #[arg(long, value_name = "ID")]
        before: Option<u64>,
        /// Page size
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=1000))]
        limit: u32,
    },
    /// One workflow: its state and progress, and each step with its task, state and the steps
    /// it runs after
    Show {
        /// The workflow's id
        id: u64,
    },
    /// Cancel a workflow: its waiting and pending steps now, its running steps at their next
    /// heartbeat (recorded in the audit trail)
    Cancel {
        /// The workflow's id
        id: u64,
    },
}

#[derive(Debug, Subcommand)]
pub enum EventsAction {
    /// Per topic: events not delivered yet, the age of the oldest (the lag, database clock)
    /// and the keys held back by a rejected event
    Stats,
    /// Keys held back by a rejected event (strict mode), longest held first: topic, key, the
    /// event's seq, since when, the broker's error. Act with `retry`, `skip` or `replay`
    Held {
        /// Only this topic
        #[arg(long)]
        topic: Option<String>,
        /// At most this many keys
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=10_000))]
        limit: u32,
    },
    /// One key: its relay state (seqs delivered up to, lease, failures, the event holding it)
    /// and its stored events by seq (paged: pass the last seq shown as --after-seq)
    Show {
        /// The topic
        topic: String,
        /// The key
        key: String,
        /// Only events with a seq greater than this (the last seq of the previous page)
        #[arg(long, value_name = "SEQ", default_value_t = 0)]
        after_seq: u64,
        /// Page size
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=10_000))]
        limit: u32,
    },
    /// Send events again, with their original message ids (recorded in the audit trail):
    /// a key's events from --from-seq on (default: every stored one; a held key is released),
    /// or a topic's events published in [--since, --until)
    #[command(group = clap::ArgGroup::new("what").required(true).args(["key", "since"]))]
    Replay {
        /// The topic
        #[arg(long)]
        topic: String,
        /// The key whose events to send again
        #[arg(long, conflicts_with_all = ["since", "until"])]
        key: Option<String>,
        /// With --key: from this sequence number on (default 0: every stored event)
        #[arg(long, value_name = "SEQ", requires = "key")]
        from_seq: Option<u64>,
        /// Events published at or after this time (RFC 3339, database clock)
        #[arg(long, value_name = "TIME", value_parser = parse_time, requires = "until")]
        since: Option<DateTime<Utc>>,
        /// Events published before this time (RFC 3339)
        #[arg(long, value_name = "TIME", value_parser = parse_time, requires = "since")]
        until: Option<DateTime<Utc>>,
    },
    /// Try a held key's rejected event again (after fixing the cause)
    Retry {
        /// The topic
        #[arg(long)]
        topic: String,
        /// The key
        #[arg(long)]
        key: String,
    },
    /// Give up on a held key's rejected event: it is marked dead and the key goes on
    Skip {
        /// The topic
        #[arg(long)]
        topic: String,
        /// The key
        #[arg(long)]
        key: String,
    },
    /// Delete delivered events published more than --older-than ago (pending and dead ones
    /// are kept)
    Prune {
        /// e.g. 7d, 12h
        #[arg(long, value_name = "AGE", value_parser = parse_duration)]
        older_than: Duration,
    },
}

#[derive(Debug, Subcommand)]
pub enum SchedulesAction {
    /// Delete a schedule's row (one removed from the code); a worker that still declares it
    /// writes it again, its ticks starting afresh
    Delete {
        /// Schedule name
        name: String,
    },
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// Only this queue
    #[arg(long)]
    pub queue: Option<String>,
    /// Only this state
    #[arg(long, value_enum)]
    pub state: Option<StateArg>,
    /// Only this task name
    #[arg(long)]
    pub name: Option<String>,
    /// Only ids greater than this (the last id of the previous page)
    #[arg(long, value_name = "ID")]
    pub after_id: Option<u64>,
    /// Page size
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub limit: u32,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum StateArg {
    Pending,
    Running,
    Succeeded,
    Dead,
    Canceled,
    Expired,
}

impl From<StateArg> for TaskState {
    fn from(s: StateArg) -> Self {
        match s {
            StateArg::Pending => TaskState::Pending,
            StateArg::Running => TaskState::Running,
            StateArg::Succeeded => TaskState::Succeeded,
            StateArg::Dead => TaskState::Dead,
            StateArg::Canceled => TaskState::Canceled,
            StateArg::Expired => TaskState::Expired,
        }
    }
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum CancelState {
    Pending,
    Waiting,
    Running,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum TerminalState {
    Succeeded,
    Dead,
    Canceled,
    Expired,
}

impl From<TerminalState> for TaskState {
    fn from(s: TerminalState) -> Self {
        match s {
            TerminalState::Succeeded => TaskState::Succeeded,
            TerminalState::Dead => TaskState::Dead,
            TerminalState::Canceled => TaskState::Canceled,
            TerminalState::Expired => TaskState::Expired,
        }
    }
}

/// Parses `N/PERIOD` (`10/1m`, `10/m`, `5/30s`) for `rate-limit`.
fn parse_rate(input: &str) -> Result<(u32, Duration), String> {
    let (n, period) = input
        .split_once('/')
        .ok_or_else(|| format!("invalid rate {input:?}: expected N/PERIOD, e.g. 10/1m"))?;
    let n: u32 = n
        .trim()
        .parse()
        .map_err(|_| format!("invalid rate {input:?}: {n:?} is not a whole number"))?;
    let period = period.trim();
    let period = if period.starts_with(|c: char| c.is_ascii_digit()) {
        parse_duration(period)?
    } else {
        parse_duration(&format!("1{period}"))?
    };
    Ok((n, period))
}

/// An RFC 3339 time (`2025-03-14T09:30:00Z`, any offset), as UTC. Used as a clap value parser.
fn parse_time(input: &str) -> Result<DateTime<Utc>, String> {
    DateTime::parse_from_rfc3339(input.trim())
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| {
            format!("invalid time {input:?}: {e} (expected RFC 3339, e.g. 2025-03-14T09:30:00Z)")
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::{fmt_rate, fmt_time};
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn times_are_rfc3339() {
        let t = parse_time("2025-03-14T10:30:00+01:00").unwrap();
        assert_eq!(fmt_time(t), "2025-03-14 09:30:00.000Z");
        let e = parse_time("tomorrow").unwrap_err();
        assert!(e.contains("expected RFC 3339"), "{e}");
    }

    #[test]
    fn rates_parse_with_or_without_a_period_count() {
        assert_eq!(parse_rate("10/1m").unwrap(), (10, Duration::from_secs(60)));
        assert_eq!(parse_rate("10/m").unwrap(), (10, Duration::from_secs(60)));
        assert_eq!(parse_rate("5/30s").unwrap(), (5, Duration::from_secs(30)));
        assert_eq!(
            parse_rate("1000/1h").unwrap(),
            (1000, Duration::from_secs(3600))
        );
        assert!(parse_rate("10").unwrap_err().contains("expected N/PERIOD"));
        assert!(
            parse_rate("x/1m")
                .unwrap_err()
                .contains("not a whole number")
        );
        assert!(parse_rate("10/1y").unwrap_err().contains("unknown unit"));
        assert_eq!(
            fmt_rate(&taskq::client::RateLimit {
                max: 10,
                period: Duration::from_secs(90)
            }),
            "10/1m30s"
        );
    }
}
