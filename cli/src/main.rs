//! `taskq`: the operator command-line tool for a taskq database.
//!
//! Shows queue statistics and pending tasks per name, lists and shows tasks, retries dead tasks,
//! cancels, reschedules and reprioritizes pending ones, purges old terminal tasks, pauses and
//! limits queues, lists recurring schedules and live workers, shows the audit trail of operator
//! actions (which it records with `--actor`, default `cli:$USER@<host>`), applies migrations,
//! and serves the web dashboard (`taskq web`), without writing SQL. Human-readable tables by
//! default, `--json` for scripts. Exit codes: 0 success, 1 other error, 2 bad input, 3 task not
//! found or in the wrong state, 4 database unreachable.
//! See `docs/operations.md`.

mod duration;
mod text;

use std::process::ExitCode;
use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use clap::{Args, Parser, Subcommand, ValueEnum};
use serde::Serialize;
use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions, Connection, MySqlPool, SqlitePool};
use taskq::{
    Client, TaskId, TaskState, client::ListFilter, client::PendingNameCount,
    client::QueueStateCount, client::ScheduleInfo, client::TaskInfo, client::WorkerInfo,
    client::WorkerStatus,
};

use crate::duration::{format_duration, parse_duration};
use crate::text::{clean, clean_lines, json_safe};

/// Exit code: anything else failed (e.g. a query error).
const EXIT_OTHER: u8 = 1;
/// Exit code: bad input, including no database URL (clap's usage errors use the same code).
const EXIT_USAGE: u8 = 2;
/// Exit code: the task does not exist or is in the wrong state for the operation.
const EXIT_TASK: u8 = 3;
/// Exit code: the database cannot be reached.
const EXIT_UNREACHABLE: u8 = 4;

/// How long to wait for a database connection before giving up.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Parser)]
#[command(
    name = "taskq",
    version,
    about = "Inspect and manage a taskq database",
    after_help = "Exit codes: 0 ok, 1 other error, 2 bad input, 3 task (or schedule) not found \
                  or in the wrong state, 4 database unreachable."
)]
struct Cli {
    /// Database URL: mysql://user:password@host:3306/app, or a SQLite file: sqlite://path/to/app.db
    /// (also sqlite:app.db, sqlite:///abs/path.db)
    #[arg(
        long,
        env = "DATABASE_URL",
        global = true,
        hide_env_values = true,
        value_name = "URL"
    )]
    database_url: Option<String>,

    /// Print JSON (for scripts) instead of tables
    #[arg(long, global = true)]
    json: bool,

    /// Who is acting, as recorded in the audit trail (default: cli:$USER@<host name>)
    #[arg(long, global = true, env = "TASKQ_ACTOR", value_name = "NAME")]
    actor: Option<String>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
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
        /// Bulk: only this state (default: pending and running)
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
    /// Serve the web dashboard and JSON API (docs/dashboard.md) until Ctrl-C. Authentication is
    /// required: --token and/or --basic (or TASKQ_WEB_TOKEN / TASKQ_WEB_BASIC), or
    /// --insecure-no-auth. This binary registers no tasks, so the API's enqueue-by-name
    /// answers 404 for every name: mount the dashboard in your own app for that
    Web(WebArgs),
}

#[derive(Debug, Args)]
struct WebArgs {
    /// Address to listen on
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8080")]
    listen: std::net::SocketAddr,
    /// Bearer token (Authorization: Bearer, or on the login page); at least 8 characters
    #[arg(long, env = "TASKQ_WEB_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Basic credentials (the browser asks for them, or the login page)
    #[arg(
        long,
        env = "TASKQ_WEB_BASIC",
        hide_env_values = true,
        value_name = "USER:PASSWORD"
    )]
    basic: Option<String>,
    /// Serve without authentication (only behind something that authenticates)
    #[arg(long, conflicts_with_all = ["token", "basic"])]
    insecure_no_auth: bool,
    /// Refuse every change and hide the controls that make them
    #[arg(long)]
    read_only: bool,
    /// Serve under this path prefix, e.g. /taskq (default: at the root)
    #[arg(long, value_name = "PATH")]
    prefix: Option<String>,
    /// Mark the cookies Secure (when served over HTTPS, e.g. behind a TLS proxy)
    #[arg(long)]
    secure_cookies: bool,
}

#[derive(Debug, Subcommand)]
enum SchedulesAction {
    /// Delete a schedule's row (one removed from the code); a worker that still declares it
    /// writes it again, its ticks starting afresh
    Delete {
        /// Schedule name
        name: String,
    },
}

#[derive(Debug, Args)]
struct ListArgs {
    /// Only this queue
    #[arg(long)]
    queue: Option<String>,
    /// Only this state
    #[arg(long, value_enum)]
    state: Option<StateArg>,
    /// Only this task name
    #[arg(long)]
    name: Option<String>,
    /// Only ids greater than this (the last id of the previous page)
    #[arg(long, value_name = "ID")]
    after_id: Option<u64>,
    /// Page size
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    limit: u32,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum StateArg {
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
enum CancelState {
    Pending,
    Running,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum TerminalState {
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

/// A failure with its exit code and the message printed on stderr.
#[derive(Debug)]
struct Failure {
    code: u8,
    message: String,
}

impl Failure {
    fn new(code: u8, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

impl From<taskq::Error> for Failure {
    /// The message is the error's `Display` alone: taskq's errors already include their cause
    /// (`database error: 1146 (42S02): …`), so printing the source chain too would repeat it.
    fn from(e: taskq::Error) -> Self {
        let code = match &e {
            taskq::Error::NotFound(_)
            | taskq::Error::WrongState { .. }
            | taskq::Error::UniqueHeld { .. } => EXIT_TASK,
            taskq::Error::InvalidName { .. }
            | taskq::Error::InvalidOption(_)
            | taskq::Error::InvalidSchedule(_) => EXIT_USAGE,
            taskq::Error::Connect { .. } | taskq::Error::Open { .. } | taskq::Error::Timeout(_) => {
                EXIT_UNREACHABLE
            }
            taskq::Error::Database(db) if is_connection_error(db) => EXIT_UNREACHABLE,
            _ => EXIT_OTHER,
        };
        Self::new(code, e.to_string())
    }
}

/// Errors that mean the server could not be reached (as opposed to a failing statement).
fn is_connection_error(e: &sqlx::Error) -> bool {
    matches!(
        e,
        sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed
    )
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let Some(url) = cli.database_url.clone() else {
        eprintln!(
            "taskq: error: no database: set DATABASE_URL or pass --database-url \
             mysql://user:password@host:3306/database (or sqlite://path/to/app.db)"
        );
        return ExitCode::from(EXIT_USAGE);
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("taskq: error: cannot start the async runtime: {e}");
            return ExitCode::from(EXIT_OTHER);
        }
    };
    match runtime.block_on(run(&cli, &url)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            // Errors can quote stored text (a name, a queue): printed like it.
            eprintln!("taskq: error: {}", clean_lines(&f.message).join("\n  "));
            ExitCode::from(f.code)
        }
    }
}

/// A pool on either backend: the [`Client`] is backend-neutral; only `migrate` and closing
/// need the concrete pool.
enum Pool {
    MySql(MySqlPool),
    Sqlite(SqlitePool),
}

impl Pool {
    fn client(&self) -> Client {
        match self {
            Pool::MySql(p) => Client::new(p.clone()),
            Pool::Sqlite(p) => Client::new(p.clone()),
        }
    }

    async fn close(&self) {
        match self {
            Pool::MySql(p) => p.close().await,
            Pool::Sqlite(p) => p.close().await,
        }
    }
}

/// Whether `url` names a SQLite database (`sqlite:` scheme, any case).
fn is_sqlite_url(url: &str) -> bool {
    url.get(..7)
        .is_some_and(|s| s.eq_ignore_ascii_case("sqlite:"))
}

/// Opens the database of `url`. A SQLite file must exist unless `create` (`taskq migrate`
/// creates it): a mistyped path is an error naming it rather than a new empty database.
async fn connect(url: &str, max_connections: u32, create: bool) -> Result<Pool, Failure> {
    if is_sqlite_url(url) {
        return connect_sqlite(url, create).await.map(Pool::Sqlite);
    }
    connect_mysql(url, max_connections).await.map(Pool::MySql)
}

async fn connect_sqlite(url: &str, create: bool) -> Result<SqlitePool, Failure> {
    // sqlx's parser accepts the `sqlite:` prefix in lower case only.
    let url = format!("sqlite:{}", &url[7..]);
    let options = SqliteConnectOptions::from_str(&url)
        .map_err(|e| Failure::new(EXIT_USAGE, format!("invalid SQLite URL {url:?}: {e}")))?;
    let path = options.get_filename();
    let in_memory = path.as_os_str().is_empty() || path.to_string_lossy().contains(":memory:");
    if !create && !in_memory && !path.exists() {
        return Err(Failure::new(
            EXIT_UNREACHABLE,
            format!(
                "no SQLite database at {}: check the path (relative paths start from the \
                 current directory), or create it with `taskq migrate --database-url {url}`",
                path.display()
            ),
        ));
    }
    Ok(taskq::sqlite::connect(&url).await?)
}

async fn connect_mysql(url: &str, max_connections: u32) -> Result<MySqlPool, Failure> {
    let scheme = url.split_once("://").map(|(s, _)| s.to_ascii_lowercase());
    if !matches!(scheme.as_deref(), Some("mysql" | "mariadb")) {
        return Err(Failure::new(
            EXIT_USAGE,
            "invalid database URL: expected mysql://user:password@host:port/database or \
             sqlite://path/to/app.db",
        ));
    }
    let options = MySqlConnectOptions::from_str(url)
        .map_err(|e| Failure::new(EXIT_USAGE, format!("invalid database URL: {e}")))?;
    let target = match options.get_socket() {
        Some(socket) => socket.display().to_string(),
        None => format!("{}:{}", options.get_host(), options.get_port()),
    };
    // taskq's sentence for the failure: what went wrong and what to check.
    let unreachable = |e: sqlx::Error| {
        Failure::from(taskq::Error::Connect {
            target: target.clone(),
            source: e,
        })
    };
    // One direct connection first: a pool would retry until its timeout and then report only
    // "pool timed out", hiding the cause (connection refused, unknown host, access denied...).
    match tokio::time::timeout(CONNECT_TIMEOUT, options.connect()).await {
        Ok(Ok(conn)) => {
            let _ = conn.close().await;
        }
        Ok(Err(e)) => return Err(unreachable(e)),
        Err(_) => {
            return Err(Failure::new(
                EXIT_UNREACHABLE,
                format!(
                    "cannot connect to the database at {target} (no answer within {}s): is the \
                     host reachable from here (firewall, VPN, container port mapping)?",
                    CONNECT_TIMEOUT.as_secs()
                ),
            ));
        }
    }
    MySqlPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(CONNECT_TIMEOUT)
        .connect_with(options)
        .await
        .map_err(unreachable)
}

async fn run(cli: &Cli, url: &str) -> Result<(), Failure> {
    let max = if matches!(cli.command, Command::Web(_)) {
        8
    } else {
        2
    };
    let pool = connect(url, max, matches!(cli.command, Command::Migrate)).await?;
    let actor = cli.actor.clone().unwrap_or_else(default_actor);
    let client = pool.client().with_actor(actor);
    let result = match &cli.command {
        Command::Migrate => migrate(&pool, cli.json).await,
        Command::Stats => stats(&client, cli.json).await,
        Command::Names { queue } => names(&client, queue.as_deref(), cli.json).await,
        Command::List(args) => list(&client, args, cli.json).await,
        Command::Show { id } => show(&client, TaskId(*id), cli.json).await,
        Command::Retry {
            id,
            queue,
            name,
            older_than,
            dry_run,
            ..
        } => match id {
            Some(id) => retry_one(&client, TaskId(*id), cli.json).await,
            None if name.is_none() && older_than.is_none() && !dry_run => {
                retry_dead(&client, queue.as_deref(), cli.json).await
            }
            None => {
                let filter = taskq::client::BulkFilter {
                    queue: queue.clone(),
                    name: name.clone(),
                    state: None,
                    older_than: *older_than,
                };
                retry_where(&client, &filter, *dry_run, cli.json).await
            }
        },
        Command::Cancel {
            id,
            queue,
            name,
            state,
            older_than,
            dry_run,
        } => match id {
            Some(id) => cancel(&client, TaskId(*id), cli.json).await,
            None => {
                let filter = taskq::client::BulkFilter {
                    queue: queue.clone(),
                    name: name.clone(),
                    state: state.map(|s| match s {
                        CancelState::Pending => TaskState::Pending,
                        CancelState::Running => TaskState::Running,
                    }),
                    older_than: *older_than,
                };
                cancel_where(&client, &filter, *dry_run, cli.json).await
            }
        },
        Command::Reschedule { id, delay, at } => {
            reschedule(&client, TaskId(*id), *delay, *at, cli.json).await
        }
        Command::Priority { id, priority } => {
            set_priority(&client, TaskId(*id), *priority, cli.json).await
        }
        Command::Pause { queue } => pause(&client, queue, true, cli.json).await,
        Command::Resume { queue } => pause(&client, queue, false, cli.json).await,
        Command::Paused => paused(&client, cli.json).await,
        Command::Queues => queues(&client, cli.json).await,
        Command::Limit { queue, limit, .. } => set_limit(&client, queue, *limit, cli.json).await,
        Command::RateLimit { queue, rate, .. } => {
            set_rate_limit(&client, queue, *rate, cli.json).await
        }
        Command::Workers { all } => workers(&client, *all, cli.json).await,
        Command::Audit {
            task,
            queue,
            before_id,
            limit,
        } => {
            let filter = taskq::client::AuditFilter {
                task: task.map(TaskId),
                queue: queue.clone(),
                before_id: *before_id,
                limit: Some(*limit),
            };
            audit(&client, &filter, cli.json).await
        }
        Command::Schedules { action: None } => schedules(&client, cli.json).await,
        Command::Schedules {
            action: Some(SchedulesAction::Delete { name }),
        } => delete_schedule(&client, name, cli.json).await,
        Command::Purge { older_than, state } => {
            purge(&client, state.map(Into::into), *older_than, cli.json).await
        }
        Command::Web(args) => web(client, args).await,
    };
    pool.close().await;
    result
}

/// `taskq web`: serves the dashboard until Ctrl-C (or SIGTERM).
async fn web(client: Client, args: &WebArgs) -> Result<(), Failure> {
    let mut builder = taskq_web::Dashboard::builder_with_client(client)
        .read_only(args.read_only)
        .secure_cookies(args.secure_cookies);
    if let Some(token) = &args.token {
        builder = builder.bearer_token(token.clone());
    }
    if let Some(basic) = &args.basic {
        let Some((user, password)) = basic.split_once(':') else {
            return Err(Failure::new(EXIT_USAGE, "--basic takes USER:PASSWORD"));
        };
        builder = builder.basic_auth(user, password);
    }
    if args.insecure_no_auth {
        builder = builder.insecure_no_auth();
    }
    let dashboard = builder
        .build()
        .map_err(|e| Failure::new(EXIT_USAGE, e.to_string()))?;
    let prefix = args.prefix.as_deref().map(|p| p.trim_end_matches('/'));
    let app = match prefix {
        Some(p) if !p.is_empty() => {
            if !p.starts_with('/') {
                return Err(Failure::new(EXIT_USAGE, "--prefix must start with /"));
            }
            axum::Router::new().nest(p, dashboard.router())
        }
        _ => dashboard.router(),
    };
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| Failure::new(EXIT_OTHER, format!("cannot listen on {}: {e}", args.listen)))?;
    let addr = listener
        .local_addr()
        .map_err(|e| Failure::new(EXIT_OTHER, e.to_string()))?;
    println!(
        "taskq web: serving the dashboard at http://{addr}{}{}",
        prefix.unwrap_or(""),
        if prefix.is_some_and(|p| !p.is_empty()) {
            ""
        } else {
            "/"
        }
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown_signal())
        .await
        .map_err(|e| Failure::new(EXIT_OTHER, format!("server error: {e}")))?;
    Ok(())
}

/// Ctrl-C, or SIGTERM on Unix.
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = async {
                match term.as_mut() {
                    Some(t) => { t.recv().await; }
                    None => std::future::pending::<()>().await,
                }
            } => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// The actor of the audit trail when `--actor` is not given: `cli:<user>@<host>`.
fn default_actor() -> String {
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

async fn migrate(pool: &Pool, json: bool) -> Result<(), Failure> {
    match pool {
        Pool::MySql(p) => taskq::migrate(p).await?,
        Pool::Sqlite(p) => taskq::migrate(p).await?,
    }
    if json {
        print_json(&serde_json::json!({ "migrated": true }));
    } else {
        println!("migrations applied");
    }
    Ok(())
}

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

async fn stats(client: &Client, json: bool) -> Result<(), Failure> {
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

async fn names(client: &Client, queue: Option<&str>, json: bool) -> Result<(), Failure> {
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

async fn list(client: &Client, args: &ListArgs, json: bool) -> Result<(), Failure> {
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

async fn show(client: &Client, id: TaskId, json: bool) -> Result<(), Failure> {
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

async fn audit(
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

/// The payload as JSON, or as a (lossy) string when it is not valid JSON.
fn payload_value(task: &TaskInfo) -> serde_json::Value {
    task.payload_json().unwrap_or_else(|_| {
        serde_json::Value::String(String::from_utf8_lossy(&task.payload).into_owned())
    })
}

async fn retry_one(client: &Client, id: TaskId, json: bool) -> Result<(), Failure> {
    client.retry_dead(id).await?;
    if json {
        print_json(&serde_json::json!({ "id": id, "state": TaskState::Pending }));
    } else {
        println!("task {id}: dead -> pending");
    }
    Ok(())
}

async fn retry_dead(client: &Client, queue: Option<&str>, json: bool) -> Result<(), Failure> {
    let n = client.retry_all_dead(queue).await?;
    if json {
        print_json(&serde_json::json!({ "retried": n }));
    } else {
        let scope = queue.map_or_else(String::new, |q| format!(" in queue {q}"));
        println!("retried {n} dead task{}{scope}", plural(n));
    }
    Ok(())
}

async fn retry_where(
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

async fn cancel_where(
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

async fn cancel(client: &Client, id: TaskId, json: bool) -> Result<(), Failure> {
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

async fn reschedule(
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

async fn set_priority(
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

async fn pause(client: &Client, queue: &str, pause: bool, json: bool) -> Result<(), Failure> {
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

async fn paused(client: &Client, json: bool) -> Result<(), Failure> {
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

/// A rate limit as `N/PERIOD`.
fn fmt_rate(r: &taskq::client::RateLimit) -> String {
    if r.period.subsec_nanos() == 0 {
        format!("{}/{}", r.max, format_duration(r.period))
    } else {
        format!("{}/{}ms", r.max, r.period.as_millis())
    }
}

async fn set_limit(
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

async fn set_rate_limit(
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

async fn queues(client: &Client, json: bool) -> Result<(), Failure> {
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

/// How long past its next tick a schedule must be before it is shown as overdue: the
/// workers' missed-tick grace (a tick reached later than that counts as missed).
const OVERDUE_AFTER: TimeDelta =
    TimeDelta::seconds(taskq::limits::MISSED_TICK_GRACE.as_secs() as i64);

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

async fn workers(client: &Client, all: bool, json: bool) -> Result<(), Failure> {
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

async fn schedules(client: &Client, json: bool) -> Result<(), Failure> {
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

async fn delete_schedule(client: &Client, name: &str, json: bool) -> Result<(), Failure> {
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

async fn purge(
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

/// An RFC 3339 time (`2025-03-14T09:30:00Z`, any offset), as UTC. Used as a clap value parser.
fn parse_time(input: &str) -> Result<DateTime<Utc>, String> {
    DateTime::parse_from_rfc3339(input.trim())
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| {
            format!("invalid time {input:?}: {e} (expected RFC 3339, e.g. 2025-03-14T09:30:00Z)")
        })
}

fn print_json<T: Serialize + ?Sized>(value: &T) {
    match serde_json::to_string_pretty(value) {
        Ok(s) => println!("{}", json_safe(&s)),
        Err(e) => eprintln!("taskq: error: cannot encode JSON: {e}"),
    }
}

/// Prints an aligned table; a header starting with `>` is right-aligned (numbers). Cells
/// are stored text: each is printed on one line with its controls escaped ([`clean`]).
fn print_table(headers: &[&str], rows: Vec<Vec<String>>) {
    let rows: Vec<Vec<String>> = rows
        .into_iter()
        .map(|r| r.into_iter().map(|c| clean(&c).into_owned()).collect())
        .collect();
    let right: Vec<bool> = headers.iter().map(|h| h.starts_with('>')).collect();
    let headers: Vec<String> = headers
        .iter()
        .map(|h| h.trim_start_matches('>').to_owned())
        .collect();
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let render = |cells: &[String]| {
        let last = cells.len().saturating_sub(1);
        let mut line = String::new();
        for (i, cell) in cells.iter().enumerate() {
            let pad = widths[i].saturating_sub(cell.chars().count());
            if i > 0 {
                line.push_str("  ");
            }
            if right[i] {
                line.push_str(&" ".repeat(pad));
                line.push_str(cell);
            } else {
                line.push_str(cell);
                if i < last {
                    line.push_str(&" ".repeat(pad));
                }
            }
        }
        line
    };
    println!("{}", render(&headers));
    for row in &rows {
        println!("{}", render(row));
    }
}

fn fmt_time(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S%.3fZ").to_string()
}

/// A non-negative `Duration` like [`fmt_delta`].
fn fmt_std(d: Duration) -> String {
    fmt_delta(TimeDelta::from_std(d).unwrap_or(TimeDelta::MAX))
}

fn secs_f64(d: TimeDelta) -> f64 {
    d.num_microseconds()
        .map_or(d.num_seconds() as f64, |us| us as f64 / 1e6)
}

/// A non-negative span as its two largest units: `3d4h`, `2h5m`, `4m10s`, `12s`, `0.4s`.
fn fmt_delta(d: TimeDelta) -> String {
    let d = d.max(TimeDelta::zero());
    let secs = d.num_seconds();
    if secs < 10 {
        return format!("{:.1}s", secs_f64(d));
    }
    let (days, h, m, s) = (secs / 86_400, secs / 3_600 % 24, secs / 60 % 60, secs % 60);
    if days > 0 {
        format!("{days}d{h}h")
    } else if h > 0 {
        format!("{h}h{m}m")
    } else if m > 0 {
        format!("{m}m{s}s")
    } else {
        format!("{s}s")
    }
}

/// The first line of `s`, cut to `max` characters.
fn one_line(s: &str, max: usize) -> String {
    let line = s.lines().next().unwrap_or("");
    let more = line.chars().count() > max || s.lines().nth(1).is_some();
    let mut out: String = line.chars().take(max).collect();
    if more {
        out.push('…');
    }
    out
}

fn plural(n: u64) -> &'static str {
    if n == 1 { "" } else { "s" }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn deltas_are_compact() {
        assert_eq!(fmt_delta(TimeDelta::milliseconds(400)), "0.4s");
        assert_eq!(fmt_delta(TimeDelta::seconds(12)), "12s");
        assert_eq!(fmt_delta(TimeDelta::seconds(250)), "4m10s");
        assert_eq!(fmt_delta(TimeDelta::seconds(7_500)), "2h5m");
        assert_eq!(
            fmt_delta(TimeDelta::seconds(3 * 86_400 + 4 * 3_600)),
            "3d4h"
        );
        assert_eq!(fmt_delta(TimeDelta::seconds(-5)), "0.0s");
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

    #[test]
    fn errors_are_cut_to_one_line() {
        assert_eq!(one_line("short", 60), "short");
        assert_eq!(one_line("a\nb", 60), "a…");
        assert_eq!(one_line("abcdef", 3), "abc…");
    }
}
