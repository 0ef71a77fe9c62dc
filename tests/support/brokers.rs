//! The message brokers the outbox's sink tests publish to: NATS with JetStream, RabbitMQ and
//! Redis, on this machine's default ports unless `TASKQ_TEST_NATS_URL`, `TASKQ_TEST_AMQP_URL`
//! or `TASKQ_TEST_REDIS_URL` say otherwise.
//!
//! Like the MySQL tests: a test starts with
//!
//! ```ignore
//! let Some(url) = taskq_tests::brokers::or_skip(Broker::Nats) else { return };
//! ```
//!
//! and, when nothing answers at the broker's address, prints `SKIPPED <broker>: <test>: no
//! broker at <address> (...)` to stderr and passes, unless `TASKQ_REQUIRE_BROKERS` is set (CI
//! sets it to 1): then it fails.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// A broker the sink tests use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Broker {
    /// NATS with JetStream.
    Nats,
    /// RabbitMQ.
    RabbitMq,
    /// Redis.
    Redis,
}

impl Broker {
    /// Its name in `SKIPPED` lines.
    pub fn label(self) -> &'static str {
        match self {
            Broker::Nats => "nats",
            Broker::RabbitMq => "rabbitmq",
            Broker::Redis => "redis",
        }
    }

    /// The URL tests connect to: the variable's value, else the local default.
    pub fn url(self) -> String {
        let (var, default) = match self {
            Broker::Nats => ("TASKQ_TEST_NATS_URL", "nats://127.0.0.1:4222"),
            Broker::RabbitMq => (
                "TASKQ_TEST_AMQP_URL",
                "amqp://guest:guest@127.0.0.1:5672/%2f",
            ),
            Broker::Redis => ("TASKQ_TEST_REDIS_URL", "redis://127.0.0.1:6379"),
        };
        std::env::var(var).unwrap_or_else(|_| default.to_owned())
    }

    /// `host:port` of [`url`](Self::url).
    pub fn address(self) -> String {
        let url = self.url();
        let rest = url.split_once("://").map_or(url.as_str(), |(_, r)| r);
        let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
        rest.split('/').next().unwrap_or(rest).to_owned()
    }
}

/// Whether a test without its broker fails instead of skipping: `TASKQ_REQUIRE_BROKERS` is
/// set (to anything).
pub fn required() -> bool {
    std::env::var_os("TASKQ_REQUIRE_BROKERS").is_some()
}

/// Whether something accepts a TCP connection at the broker's address (checked once per test
/// binary and broker, within 3 s).
fn check(broker: Broker) -> Result<(), String> {
    static CHECKS: OnceLock<Mutex<HashMap<Broker, Result<(), String>>>> = OnceLock::new();
    let checks = CHECKS.get_or_init(Default::default);
    let mut checks = checks.lock().unwrap_or_else(|e| e.into_inner());
    checks
        .entry(broker)
        .or_insert_with(|| {
            let address = broker.address();
            let mut last = format!("{address} does not resolve");
            for addr in std::net::ToSocketAddrs::to_socket_addrs(&address)
                .map_err(|e| format!("no broker at {address} ({e})"))?
            {
                match std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(3)) {
                    Ok(_) => return Ok(()),
                    Err(e) => last = e.to_string(),
                }
            }
            Err(format!("no broker at {address} ({last})"))
        })
        .clone()
}

/// The broker's URL when it answers; else prints `SKIPPED <broker>: <test>: ...` and returns
/// `None`, or panics when [`required`].
pub fn or_skip(broker: Broker) -> Option<String> {
    match check(broker) {
        Ok(()) => Some(broker.url()),
        Err(why) if required() => panic!(
            "{}: {why}; TASKQ_REQUIRE_BROKERS is set, so this fails instead of skipping",
            broker.label()
        ),
        Err(why) => {
            let thread = std::thread::current();
            use std::io::Write as _;
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED {}: {}: {why}",
                broker.label(),
                thread.name().unwrap_or("?")
            );
            None
        }
    }
}

/// A fresh name for a stream, queue or key: `taskq_t_<16 hex digits>`.
pub fn fresh_name() -> String {
    format!("taskq_t_{:016x}", fastrand::u64(..))
}
