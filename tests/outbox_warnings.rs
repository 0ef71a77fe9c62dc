//! The broker sinks' warnings about what is missing on the broker (issue 37): a RabbitMQ
//! exchange with no queue bound for a routing key (312 NO_ROUTE, the key is held), a missing
//! RabbitMQ exchange (404 NOT_FOUND), a NATS subject no JetStream stream captures. Each names
//! what is missing, and comes at most once per name and interval.
//!
//! One test in its own binary, like `tests/logs.rs`: a `tracing` subscriber set for one thread
//! while another test's threads register the same callsites can miss events (the callsite
//! interest cache races). A broker that does not answer: `SKIPPED <broker>: ...`, unless
//! `TASKQ_REQUIRE_BROKERS` is set.

use taskq_outbox::{Message, Outcome, Sink};
use taskq_tests::brokers::{self, Broker};
use taskq_tests::capture::Capture;

fn msg(id: &str, subject: &str) -> Message {
    Message::new(id, subject, "k", id.as_bytes().to_vec())
}

/// RabbitMQ, no queue bound: a fresh exchange (declared by the sink) with no queue; two
/// batches to one routing key, one to another: one warning per routing key, naming the
/// exchange and the routing key.
async fn rabbitmq_no_binding(capture: &Capture) {
    let Some(url) = brokers::or_skip(Broker::RabbitMq) else {
        return;
    };
    use taskq_outbox::rabbitmq::{RabbitSink, lapin::ExchangeKind};
    let exchange = brokers::fresh_name();
    let sink = RabbitSink::connect(&url, &exchange)
        .await
        .expect("connect to RabbitMQ")
        .declare_exchange(ExchangeKind::Topic)
        .await
        .expect("declare the exchange");
    let unrouted = format!("{exchange}.placed");
    for id in ["a", "b"] {
        let out = sink.publish(&[msg(id, &unrouted)]).await;
        assert!(
            matches!(&out[0], Outcome::Rejected(why) if why.contains("312")),
            "{out:?}"
        );
    }
    let other = format!("{exchange}.shipped");
    assert!(!sink.publish(&[msg("c", &other)]).await[0].is_delivered());
    let w = capture.warnings(&["no queue is bound", &exchange, &unrouted]);
    assert_eq!(w.len(), 1, "once per routing key: {w:#?}");
    assert!(w[0].message.contains("holds its key"), "{w:#?}");
    assert_eq!(w[0].field("exchange"), Some(exchange.as_str()));
    assert_eq!(w[0].field("routing_key"), Some(unrouted.as_str()));
    assert_eq!(
        capture
            .warnings(&["no queue is bound", &exchange, &other])
            .len(),
        1
    );
    sink.channel()
        .exchange_delete(exchange.as_str().into(), Default::default())
        .await
        .ok();
}

/// RabbitMQ, no exchange: a sink on a missing exchange (nothing declared) fails, and warns
/// once naming the exchange and the declare option; a second sink (a reconnect) does not warn
/// again.
async fn rabbitmq_no_exchange(capture: &Capture) {
    let Some(url) = brokers::or_skip(Broker::RabbitMq) else {
        return;
    };
    use taskq_outbox::rabbitmq::RabbitSink;
    let exchange = brokers::fresh_name();
    for id in ["a", "b"] {
        let sink = RabbitSink::connect(&url, &exchange)
            .await
            .expect("connect to RabbitMQ");
        let out = sink.publish(&[msg(id, "orders.placed")]).await;
        assert!(matches!(&out[0], Outcome::Failed(_)), "{out:?}");
    }
    let w = capture.warnings(&["does not exist", &exchange, "declare_exchange"]);
    assert_eq!(w.len(), 1, "once per exchange: {w:#?}");
    assert_eq!(w[0].field("exchange"), Some(exchange.as_str()));
}

/// NATS, no stream: a subject no stream captures fails and warns once naming the subject.
async fn nats_no_stream(capture: &Capture) {
    let Some(url) = brokers::or_skip(Broker::Nats) else {
        return;
    };
    use taskq_outbox::nats::NatsSink;
    let sink = NatsSink::connect(&url).await.expect("connect to NATS");
    let subject = format!("{}.placed", brokers::fresh_name());
    for id in ["a", "b"] {
        let out = sink.publish(&[msg(id, &subject)]).await;
        assert!(matches!(&out[0], Outcome::Failed(_)), "{out:?}");
    }
    let w = capture.warnings(&["no JetStream stream captures", &subject, "ensure_stream"]);
    assert_eq!(w.len(), 1, "once per subject: {w:#?}");
    assert_eq!(w[0].field("subject"), Some(subject.as_str()));
}

// A current-thread runtime: the sinks' futures run on this thread, where the capturing
// subscriber is the default.
#[tokio::test]
async fn broker_sinks_warn_once_naming_the_missing_binding_exchange_or_stream() {
    let capture = Capture::default();
    let _guard = tracing::subscriber::set_default(capture.clone());
    rabbitmq_no_binding(&capture).await;
    rabbitmq_no_exchange(&capture).await;
    nats_no_stream(&capture).await;
    // A delivered message warns about nothing.
    if let Some(url) = brokers::or_skip(Broker::Redis) {
        let before = capture.warnings(&[]).len();
        let sink = taskq_outbox::redis::RedisSink::connect(&url).await.unwrap();
        let stream = brokers::fresh_name();
        assert!(sink.publish(&[msg("a", &stream)]).await[0].is_delivered());
        assert_eq!(capture.warnings(&[]).len(), before);
        let mut conn = taskq_outbox::redis::client::Client::open(url.as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let _: () = taskq_outbox::redis::client::cmd("DEL")
            .arg(&stream)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
}
