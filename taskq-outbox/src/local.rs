//! The brokers' URLs on their standard local ports (NATS with JetStream, RabbitMQ with the
//! `guest` user and the default vhost, Redis), as a development machine or a CI runner with
//! the brokers' default configuration serves them. taskq's tests (`TASKQ_TEST_*_URL`) and
//! benchmark (`TASKQ_BENCH_*_URL`) connect to these unless their environment variable names
//! another; they are defaults for trying things out, not for production.

/// NATS (JetStream enabled) on its default port.
pub const NATS_URL: &str = "nats://127.0.0.1:4222";
/// RabbitMQ on its default port, user `guest` (allowed from localhost only by default), vhost `/`.
pub const AMQP_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";
/// Redis on its default port, database 0.
pub const REDIS_URL: &str = "redis://127.0.0.1:6379";
