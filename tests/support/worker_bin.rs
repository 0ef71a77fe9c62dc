//! What the worker processes of the fleet tests (`tests/bin/*_worker.rs`) share: their
//! `--key value` arguments, and the pool a worker opens on its `--url` (MySQL or SQLite).

use std::collections::HashMap;
use std::str::FromStr;
use std::time::Duration;

use sqlx::mysql::MySqlPoolOptions;
use taskq::worker::WorkerBuilder;

/// A worker process's arguments: `--key value` pairs.
pub struct WorkerArgs(HashMap<String, String>);

impl WorkerArgs {
    /// The process's arguments (panics on anything but `--key value` pairs).
    pub fn from_env() -> Self {
        let args: Vec<String> = std::env::args().skip(1).collect();
        WorkerArgs(
            args.chunks(2)
                .map(|kv| {
                    let key = kv[0].strip_prefix("--").expect("options are --key value");
                    (key.to_owned(), kv.get(1).expect("a value").clone())
                })
                .collect(),
        )
    }

    /// `--key`'s value, if given.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    /// `--key`'s value; panics when it is missing.
    pub fn required(&self, key: &str) -> &str {
        self.get(key).unwrap_or_else(|| panic!("--{key}"))
    }

    /// `--key` parsed, or `default`.
    pub fn number<T: FromStr>(&self, key: &str, default: T) -> T {
        self.get(key)
            .map_or(default, |v| v.parse().ok().expect("a number"))
    }

    /// `--key` in milliseconds, or `default_ms`.
    pub fn millis(&self, key: &str, default_ms: u64) -> Duration {
        Duration::from_millis(self.number(key, default_ms))
    }
}

/// A worker builder on the database of `url`: a MySQL pool of at most `mysql_connections`
/// connections, or a SQLite pool with taskq's settings (and `sqlite_busy` as its busy timeout,
/// when given: one the worker's short lease survives, see `WorkerBuilder::build`). With
/// `data`, the pool is also the handlers' `Data` of its pool type.
pub async fn worker_builder(
    url: &str,
    mysql_connections: u32,
    sqlite_busy: Option<Duration>,
    data: bool,
) -> WorkerBuilder {
    if url.starts_with("sqlite:") {
        let pool = match sqlite_busy {
            Some(busy) => {
                let opts: sqlx::sqlite::SqliteConnectOptions = url.parse().expect("a SQLite URL");
                taskq::sqlite::connect_with(taskq::sqlite::tune(opts).busy_timeout(busy)).await
            }
            None => taskq::sqlite::connect(url).await,
        }
        .expect("open");
        let builder = taskq::Worker::builder(pool.clone());
        if data { builder.data(pool) } else { builder }
    } else {
        let pool = MySqlPoolOptions::new()
            .max_connections(mysql_connections)
            .connect(url)
            .await
            .expect("connect");
        let builder = taskq::Worker::builder(pool.clone());
        if data { builder.data(pool) } else { builder }
    }
}
