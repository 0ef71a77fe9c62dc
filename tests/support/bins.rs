//! What the worker processes of `tests/bin` share, and what the tests use to run them.
//!
//! In a binary: [`Args::parse`] reads `--key value` options, [`open_pool`] opens a MySQL or
//! SQLite pool by the URL's scheme, [`ready`] prints the `ready <id>` line the test waits for.
//! In a test: [`spawn_ready`] starts a binary and waits for that line, [`signal`] sends it a
//! signal (`KILL`, `TERM`, `STOP`, `CONT`).

use std::collections::HashMap;
use std::io::Write as _;
use std::path::Path;
use std::process::Stdio;
use std::str::FromStr;
use std::time::Duration;

use sqlx::mysql::MySqlPoolOptions;
use sqlx::{MySqlPool, SqlitePool};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{ChildStdout, Command};

/// `--key value` options of a worker binary.
#[derive(Debug, Clone, Default)]
pub struct Args(HashMap<String, String>);

impl Args {
    /// The process's arguments (after the program name), as `--key value` pairs; panics on
    /// anything else.
    pub fn parse() -> Self {
        Self::from_args(std::env::args().skip(1))
    }

    /// `args` as `--key value` pairs; panics on anything else.
    pub fn from_args(args: impl IntoIterator<Item = String>) -> Self {
        let args: Vec<String> = args.into_iter().collect();
        Self(
            args.chunks(2)
                .map(|kv| {
                    let key = kv[0].strip_prefix("--").expect("options are --key value");
                    let value = kv.get(1).unwrap_or_else(|| panic!("--{key} needs a value"));
                    (key.to_owned(), value.clone())
                })
                .collect(),
        )
    }

    /// The value of `--key`, if given.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    /// The value of `--key`; panics when missing.
    pub fn required(&self, key: &str) -> &str {
        self.get(key)
            .unwrap_or_else(|| panic!("--{key} is required"))
    }

    /// `--key` parsed, or `default`.
    pub fn num<T: FromStr>(&self, key: &str, default: T) -> T
    where
        T::Err: std::fmt::Debug,
    {
        self.get(key)
            .map_or(default, |v| v.parse().expect("a number"))
    }

    /// `--key` as milliseconds, or `default_ms`.
    pub fn ms(&self, key: &str, default_ms: u64) -> Duration {
        Duration::from_millis(self.num(key, default_ms))
    }
}

/// A pool on either backend, by the URL's scheme.
#[derive(Debug, Clone)]
pub enum AnyPool {
    /// `mysql://…`
    MySql(MySqlPool),
    /// `sqlite:…`
    Sqlite(SqlitePool),
}

/// Opens `url`: a MySQL pool of `max` connections, or a SQLite pool through taskq's tuning
/// (WAL, …) with `sqlite_busy` as busy timeout when given.
pub async fn open_pool(url: &str, max: u32, sqlite_busy: Option<Duration>) -> AnyPool {
    if url.starts_with("sqlite:") {
        let opts: sqlx::sqlite::SqliteConnectOptions = url.parse().expect("a SQLite URL");
        let mut opts = taskq::sqlite::tune(opts);
        if let Some(busy) = sqlite_busy {
            opts = opts.busy_timeout(busy);
        }
        AnyPool::Sqlite(
            taskq::sqlite::connect_with(opts)
                .await
                .expect("open the SQLite file"),
        )
    } else {
        AnyPool::MySql(
            MySqlPoolOptions::new()
                .max_connections(max)
                .connect(url)
                .await
                .expect("connect"),
        )
    }
}

/// Logs to stderr (inherited by the test) when `RUST_LOG` is set, e.g.
/// `RUST_LOG=taskq=debug cargo test --test ordered_fleet`; silent otherwise.
pub fn logs() {
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .try_init();
    }
}

/// Prints `ready <id>` and flushes: the line [`spawn_ready`] waits for.
pub fn ready(id: &str) {
    println!("ready {id}");
    std::io::stdout().flush().ok();
}

/// Starts `exe` with `args` (stdout piped, stderr inherited, killed when dropped) and waits at
/// most 30 s for its `ready <id>` line; returns the child and the rest of its stdout.
pub async fn spawn_ready(
    exe: &Path,
    args: &[&str],
    id: &str,
) -> (tokio::process::Child, Lines<BufReader<ChildStdout>>) {
    let mut child = Command::new(exe)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {}: {e}", exe.display()));
    let mut lines = BufReader::new(child.stdout.take().expect("piped stdout")).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .unwrap_or_else(|_| panic!("{} is ready within 30 s", exe.display()))
        .expect("read the child's stdout")
        .unwrap_or_default();
    assert_eq!(line, format!("ready {id}"), "{}", exe.display());
    (child, lines)
}

/// Sends `sig` (`KILL`, `TERM`, `STOP`, `CONT`, …) to process `pid` with `kill(1)`.
pub fn signal(pid: u32, sig: &str) {
    let status = std::process::Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{sig} {pid}");
}
