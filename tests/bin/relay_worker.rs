//! `taskq-relay-worker`: a relay process for the relay's order and fault tests
//! (`tests/outbox_relay.rs`), to be killed, or terminated, by its parent.
//!
//! ```text
//! taskq-relay-worker --url mysql://root@127.0.0.1:3306/taskq_t_… --broker nats \
//!     --address nats://127.0.0.1:4222 --topic taskq_t_….events --id relay-1 \
//!     [--batch 128] [--lease-ms 2000] [--timeout-ms 2000] [--on-rejected hold|dead-letter] \
//!     [--backoff-ms 250] [--backoff-max-ms 2000] [--poll-ms 50]
//! taskq-relay-worker --url sqlite:///tmp/taskq-t-….db --broker rabbitmq \
//!     --address amqp://guest:guest@127.0.0.1:5672/%2f --topic taskq_t_… --id relay-2
//! taskq-relay-worker … --broker redis --address redis://127.0.0.1:6379 --topic taskq_t_…
//! ```
//!
//! Relays the events of `--topic` to the broker (`nats`: JetStream publishes to the subject;
//! `rabbitmq`: the default exchange, routing key = the queue's name; `redis`: `XADD` to the
//! stream key) through a [`Reconnecting`] sink, so that a cut, refused or black-holed
//! connection is replaced: a batch with no answer within `--timeout-ms` is failed and its
//! connection dropped. A key whose batch failed backs off from `--backoff-ms` doubling up to
//! `--backoff-max-ms` (short, for the tests; the relay's default is 1 s up to 1 min). Prints `ready <id>` once the relay is built, runs until SIGTERM/SIGINT
//! (or SIGKILL), exits 0.

use std::time::Duration;

use taskq::Backoff;
use taskq::outbox::{OnRejected, Relay};
use taskq_outbox::nats::{NatsSink, async_nats};
use taskq_outbox::rabbitmq::RabbitSink;
use taskq_outbox::redis::RedisSink;
use taskq_outbox::{Reconnecting, Sink};
use taskq_tests::bins::{AnyPool, Args, open_pool};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let opts = Args::parse();
    let url = opts.required("url").to_owned();
    let address = opts.required("address").to_owned();
    let timeout = opts.ms("timeout-ms", 2000);
    // SQLite: a busy timeout the producers' write transactions do not outlast.
    let pool = open_pool(&url, 4, Some(Duration::from_secs(5))).await;
    match opts.required("broker") {
        "nats" => {
            let sink = Reconnecting::new(move || {
                let address = address.clone();
                async move {
                    // Pings every second: a black-holed connection is noticed by the client
                    // too, not only by the batch timeout.
                    let client = async_nats::ConnectOptions::new()
                        .ping_interval(Duration::from_secs(1))
                        .connection_timeout(Duration::from_secs(2))
                        .connect(address)
                        .await?;
                    Ok::<_, async_nats::ConnectError>(NatsSink::new(async_nats::jetstream::new(
                        client,
                    )))
                }
            })
            .with_timeout(timeout);
            run(pool, sink, &opts).await;
        }
        "rabbitmq" => {
            let sink = Reconnecting::new(move || {
                let address = address.clone();
                async move { RabbitSink::connect(&address, "").await }
            })
            .with_timeout(timeout);
            run(pool, sink, &opts).await;
        }
        "redis" => {
            let sink = Reconnecting::new(move || {
                let address = address.clone();
                async move { RedisSink::connect(&address).await }
            })
            .with_timeout(timeout);
            run(pool, sink, &opts).await;
        }
        other => panic!("unknown --broker {other} (nats, rabbitmq, redis)"),
    }
}

async fn run<S: Sink + 'static>(pool: AnyPool, sink: S, opts: &Args) {
    let builder = match pool {
        AnyPool::MySql(pool) => Relay::builder(pool, sink),
        AnyPool::Sqlite(pool) => Relay::builder(pool, sink),
    };
    let on_rejected = match opts.get("on-rejected").unwrap_or("hold") {
        "hold" => OnRejected::Hold,
        "dead-letter" => OnRejected::DeadLetter,
        other => panic!("unknown --on-rejected {other} (hold, dead-letter)"),
    };
    let id = opts.required("id");
    let relay = builder
        .name(id)
        .topics([opts.required("topic").to_owned()])
        .batch_size(opts.num("batch", 128))
        .lease(opts.ms("lease-ms", 2000))
        .on_rejected(on_rejected)
        .retry_backoff(Backoff::exponential(
            opts.ms("backoff-ms", 250),
            opts.ms("backoff-max-ms", 2000),
        ))
        .poll_interval(opts.ms("poll-ms", 50))
        .build()
        .expect("valid relay settings");
    taskq_tests::bins::ready(id);
    let shutdown = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("a SIGTERM handler");
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    };
    relay.run_until(shutdown).await.expect("the relay ran");
}
