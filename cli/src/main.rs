//! `taskq`: the operator command-line tool for a taskq database.
//!
//! Shows queue statistics and pending tasks per name, lists and shows tasks, retries dead tasks,
//! cancels, reschedules and reprioritizes pending ones, purges old terminal tasks, pauses and
//! limits queues, lists recurring schedules and live workers, shows the audit trail of operator
//! actions (which it records with `--actor`, default `cli:$USER@<host>`), shows and replays
//! events (the outbox: `taskq events`), lists, shows and cancels workflows (`taskq workflows`) and batches (`taskq batches`),
//! applies migrations,
//! and serves the web dashboard (`taskq web`), without writing SQL. Human-readable tables by
//! default, `--json` for scripts. Exit codes: 0 success, 1 other error, 2 bad input, 3 task not
//! found or in the wrong state, 4 database unreachable.
//! See `docs/operations.md`.
//!
//! Modules: `args` (the command line), `connect` (the database from its URL), `failure` (exit
//! codes), one module per group of commands (`tasks`, `queues`, `workers`, `schedules`,
//! `stats`, `events`, `workflows`, `batches`, `audit`, `migrate`, `web`), and the output: `render` (tables, JSON, times),
//! `text` (escaping of stored text) and `duration` (`7d`, `90s`).

mod args;
mod audit;
mod batches;
mod connect;
mod duration;
mod events;
mod failure;
mod migrate;
mod queues;
mod render;
mod schedules;
mod stats;
mod tasks;
mod text;
mod web;
mod workers;
mod workflows;

use std::process::ExitCode;

use clap::Parser;
use taskq::{TaskId, TaskState};

use crate::args::{CancelState, Cli, Command, SchedulesAction};
use crate::audit::{audit, default_actor};
use crate::connect::connect;
use crate::failure::{EXIT_OTHER, EXIT_USAGE, Failure};
use crate::migrate::migrate;
use crate::queues::{pause, paused, queues, set_limit, set_rate_limit};
use crate::schedules::{delete_schedule, schedules};
use crate::stats::{names, stats};
use crate::tasks::{
    cancel, cancel_where, list, purge, reschedule, retry_dead, retry_one, retry_where,
    set_priority, show,
};
use crate::text::clean_lines;
use crate::web::web;
use crate::workers::workers;

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
        Command::HeldKeys { queue, limit } => {
            stats::held_keys(&client, queue.as_deref(), *limit, cli.json).await
        }
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
                        CancelState::Waiting => TaskState::Waiting,
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
        Command::Events { action } => events::run(&client, action, cli.json).await,
        Command::Workflows { action } => workflows::run(&client, action, cli.json).await,
        Command::Batches { action } => batches::run(&client, action, cli.json).await,
        Command::Web(args) => web(client, args).await,
    };
    pool.close().await;
    result
}
