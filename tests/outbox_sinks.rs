//! The outbox's sinks against the real brokers (NATS JetStream, RabbitMQ, Redis Streams): each
//! test publishes to a fresh stream, queue or key and reads back what a consumer gets (count,
//! order per key, ids, headers). A broker that does not answer: `SKIPPED <broker>: ...`, unless
//! `TASKQ_REQUIRE_BROKERS` is set (see `taskq_tests::brokers`).

use std::collections::BTreeMap;

use taskq_outbox::{Bytes, Message, Outcome, Sink};
use taskq_tests::brokers::{self, Broker};

/// `keys` keys × `per_key` messages, interleaved (k0-0, k1-0, k2-0, k0-1, ...), on `subject`.
fn interleaved(subject: &str, keys: usize, per_key: usize) -> Vec<Message> {
    let mut batch = Vec::new();
    for seq in 0..per_key {
        for k in 0..keys {
            batch.push(
                Message::new(
                    format!("k{k}-{seq}"),
                    subject,
                    format!("k{k}"),
                    format!("payload of k{k} #{seq}").into_bytes(),
                )
                .with_header("x-taskq-test", subject),
            );
        }
    }
    batch
}

/// Two keys × two messages on `subject`; `k1`'s first message also carries a header of its
/// own named `taskq-key` (another case of `Taskq-Key`), which the sink's value replaces.
fn keyed(subject: &str) -> Vec<Message> {
    vec![
        Message::new("k0-0", subject, "order-0", b"0".to_vec()).with_header("trace", "t0"),
        Message::new("k1-0", subject, "order-1", b"1".to_vec())
            .with_header("taskq-key", "forged by the event"),
        Message::new("k0-1", subject, "order-0", b"2".to_vec()),
        Message::new("k1-1", subject, "order-1", b"3".to_vec()),
    ]
}

/// Checks `(message id, headers as the consumer got them)` against [`keyed`]'s batch: every
/// message carries exactly one header named `Taskq-Key` in any case, with its key; other
/// headers as published.
fn assert_key_headers(batch: &[Message], got: &[(String, Vec<(String, String)>)]) {
    assert_eq!(got.len(), batch.len(), "{got:?}");
    for (id, headers) in got {
        let m = batch.iter().find(|m| &m.id == id).expect("a published id");
        let named: Vec<&(String, String)> = headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(taskq_outbox::KEY_HEADER))
            .collect();
        assert_eq!(
            named,
            [&(taskq_outbox::KEY_HEADER.to_owned(), m.key.clone())],
            "{id}: {headers:?}"
        );
        for (name, value) in &m.headers {
            if !name.eq_ignore_ascii_case(taskq_outbox::KEY_HEADER) {
                assert!(headers.contains(&(name.clone(), value.clone())), "{id}");
            }
        }
    }
}

/// What a consumer received, as (message id, payload) in arrival order, checked against the
/// batch: every id at most once and, per key, in batch order. Returns the ids per key.
fn per_key(batch: &[Message], received: &[(String, Vec<u8>)]) -> BTreeMap<String, Vec<String>> {
    let by_id: BTreeMap<&str, &Message> = batch.iter().map(|m| (m.id.as_str(), m)).collect();
    let mut keys: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (id, payload) in received {
        let m = by_id
            .get(id.as_str())
            .unwrap_or_else(|| panic!("received {id}, never published"));
        assert_eq!(payload, &m.payload.to_vec(), "payload of {id}");
        keys.entry(m.key.clone()).or_default().push(id.clone());
    }
    keys
}

/// The ids of `batch` per key, in batch order, keeping those `keep` says.
fn expected(batch: &[Message], keep: impl Fn(&Message) -> bool) -> BTreeMap<String, Vec<String>> {
    let mut keys: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for m in batch.iter().filter(|m| keep(m)) {
        keys.entry(m.key.clone()).or_default().push(m.id.clone());
    }
    keys
}

/// a0, b0, a1 (too large), b1, a2, b2: the outcomes a sink must give when a1 is refused.
fn with_a_poison(subject: &str, large: usize) -> Vec<Message> {
    let m = |id: &str, key: &str, payload: Vec<u8>| Message::new(id, subject, key, payload);
    vec![
        m("a0", "a", b"a0".to_vec()),
        m("b0", "b", b"b0".to_vec()),
        m("a1", "a", vec![b'x'; large]),
        m("b1", "b", b"b1".to_vec()),
        m("a2", "a", b"a2".to_vec()),
        m("b2", "b", b"b2".to_vec()),
    ]
}

fn assert_poison_outcomes(out: &[Outcome]) {
    assert_eq!(out.len(), 6);
    assert_eq!(out[0], Outcome::Delivered, "a0");
    assert_eq!(out[1], Outcome::Delivered, "b0");
    assert!(matches!(out[2], Outcome::Rejected(_)), "a1: {:?}", out[2]);
    assert_eq!(out[3], Outcome::Delivered, "b1");
    assert_eq!(out[4], Outcome::Held, "a2 waits behind a1");
    assert_eq!(out[5], Outcome::Delivered, "b2");
}

mod nats {
    use super::*;
    use taskq_outbox::nats::NatsSink;
    use taskq_outbox::nats::async_nats::jetstream::stream;

    /// A sink and a fresh stream taking `<name>.>`; `None` when NATS does not answer.
    async fn setup() -> Option<(NatsSink, stream::Stream, String)> {
        let url = brokers::or_skip(Broker::Nats)?;
        let sink = NatsSink::connect(&url).await.expect("connect to NATS");
        let name = brokers::fresh_name();
        let stream = brokers::create_nats_stream(
            sink.context(),
            stream::Config {
                name: name.clone(),
                subjects: vec![format!("{name}.>")],
                ..Default::default()
            },
        )
        .await;
        Some((sink, stream, name))
    }

    /// Every message of the stream: (Nats-Msg-Id, payload), in stream order, and its
    /// `x-taskq-test` headers.
    async fn read_all(stream: &mut stream::Stream) -> (Vec<(String, Vec<u8>)>, Vec<String>) {
        let count = stream.info().await.expect("stream info").state.messages;
        let mut got = Vec::new();
        let mut tags = Vec::new();
        for seq in 1..=count {
            let m = stream.get_raw_message(seq).await.expect("stored message");
            let id = m
                .headers
                .get("Nats-Msg-Id")
                .expect("Nats-Msg-Id header")
                .to_string();
            if let Some(t) = m.headers.get("x-taskq-test") {
                tags.push(t.to_string());
            }
            got.push((id, m.payload.to_vec()));
        }
        (got, tags)
    }

    async fn drop_stream(sink: &NatsSink, name: &str) {
        sink.context().delete_stream(name).await.ok();
    }

    #[tokio::test]
    async fn nats_stores_each_key_in_batch_order_with_its_id_and_headers() {
        let Some((sink, mut stream, name)) = setup().await else {
            return;
        };
        // A window smaller than the batch: acks are awaited while later messages are sent.
        let sink = sink.with_window(5);
        let batch = interleaved(&format!("{name}.orders"), 3, 20);
        let out = sink.publish(&batch).await;
        assert!(out.iter().all(Outcome::is_delivered), "{out:?}");
        let (got, tags) = read_all(&mut stream).await;
        assert_eq!(got.len(), 60);
        assert_eq!(per_key(&batch, &got), expected(&batch, |_| true));
        assert_eq!(tags.len(), 60, "every message carries its header");
        drop_stream(&sink, &name).await;
    }

    #[tokio::test]
    async fn nats_stores_one_message_per_id_when_a_batch_is_published_twice() {
        let Some((sink, mut stream, name)) = setup().await else {
            return;
        };
        let batch = interleaved(&format!("{name}.orders"), 2, 5);
        assert!(sink.publish(&batch).await.iter().all(Outcome::is_delivered));
        // The relay after a crash between publish and recording: the same ids again.
        let again = sink.publish(&batch).await;
        assert!(again.iter().all(Outcome::is_delivered), "{again:?}");
        let (got, _) = read_all(&mut stream).await;
        assert_eq!(
            got.len(),
            10,
            "the duplicate window dropped the second copies"
        );
        assert_eq!(per_key(&batch, &got), expected(&batch, |_| true));
        drop_stream(&sink, &name).await;
    }

    #[tokio::test]
    async fn nats_rejects_a_message_over_max_payload_and_holds_only_its_key() {
        let Some((sink, mut stream, name)) = setup().await else {
            return;
        };
        let max = sink.context().client().server_info().max_payload;
        let batch = with_a_poison(&format!("{name}.orders"), max + 1);
        let out = sink.publish(&batch).await;
        assert_poison_outcomes(&out);
        let (got, _) = read_all(&mut stream).await;
        let ids: Vec<&str> = got.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(ids, ["a0", "b0", "b1", "b2"]);
        drop_stream(&sink, &name).await;
    }

    #[tokio::test]
    async fn nats_reports_a_subject_no_stream_takes_as_failed() {
        let Some((sink, _stream, name)) = setup().await else {
            return;
        };
        let batch = vec![
            Message::new(
                "n0",
                format!("{name}_nowhere.x"),
                "n",
                Bytes::from_static(b"0"),
            ),
            Message::new(
                "n1",
                format!("{name}_nowhere.x"),
                "n",
                Bytes::from_static(b"1"),
            ),
            Message::new("m0", format!("{name}.x"), "m", Bytes::from_static(b"2")),
        ];
        let out = sink.publish(&batch).await;
        assert!(matches!(out[0], Outcome::Failed(_)), "{out:?}");
        // n1 was in flight already when n0's answer came: it has its own (failed) outcome.
        assert!(!out[1].is_delivered(), "{out:?}");
        assert_eq!(out[2], Outcome::Delivered);
        drop_stream(&sink, &name).await;
    }

    /// Every message carries its key as the header `Taskq-Key`, once (a header of the
    /// message with that name in another case is not published).
    #[tokio::test]
    async fn nats_sends_the_key_as_the_taskq_key_header() {
        let Some((sink, mut stream, name)) = setup().await else {
            return;
        };
        let batch = keyed(&format!("{name}.orders"));
        let out = sink.publish(&batch).await;
        assert!(out.iter().all(Outcome::is_delivered), "{out:?}");
        let mut got = Vec::new();
        let count = stream.info().await.expect("stream info").state.messages;
        for seq in 1..=count {
            let m = stream.get_raw_message(seq).await.expect("stored message");
            let mut headers = Vec::new();
            for (name, values) in m.headers.iter() {
                for v in values {
                    headers.push((name.to_string(), v.to_string()));
                }
            }
            let id = m.headers.get("Nats-Msg-Id").expect("an id").to_string();
            got.push((id, headers));
        }
        assert_key_headers(&batch, &got);
        drop_stream(&sink, &name).await;
    }

    /// `ensure_stream` creates a missing stream for the subjects (so the publish is stored),
    /// and leaves an existing one as it is.
    #[tokio::test]
    async fn nats_ensure_stream_creates_a_missing_stream_and_delivers() {
        let Some(url) = brokers::or_skip(Broker::Nats) else {
            return;
        };
        let name = brokers::fresh_name();
        let sink = NatsSink::connect(&url).await.expect("connect to NATS");
        assert!(
            sink.context().get_stream(&name).await.is_err(),
            "no stream {name} yet"
        );
        let sink = sink
            .ensure_stream(&name, [format!("{name}.>")])
            .await
            .expect("ensure_stream");
        // Again: the stream exists, nothing changes.
        let sink = sink
            .ensure_stream(&name, [format!("{name}.>")])
            .await
            .expect("ensure_stream of an existing stream");
        let batch = keyed(&format!("{name}.orders"));
        let out = sink.publish(&batch).await;
        assert!(out.iter().all(Outcome::is_delivered), "{out:?}");
        let mut stream = sink.context().get_stream(&name).await.expect("the stream");
        let info = stream.info().await.expect("stream info").clone();
        assert_eq!(info.config.subjects, [format!("{name}.>")]);
        assert_eq!(info.config.storage, stream::StorageType::File);
        let (got, _) = read_all(&mut stream).await;
        assert_eq!(per_key(&batch, &got), expected(&batch, |_| true));
        drop_stream(&sink, &name).await;
    }

    /// A key is (subject, key): a failure on one subject holds that subject's key only, not
    /// the same key string on another subject (window 1, so the failure is known before the
    /// next message is sent).
    #[tokio::test]
    async fn nats_holds_a_key_of_one_subject_only() {
        let Some((sink, mut stream, name)) = setup().await else {
            return;
        };
        let sink = sink.with_window(1);
        let batch = vec![
            Message::new(
                "a42",
                format!("{name}_nowhere.a"),
                "42",
                Bytes::from_static(b"0"),
            ),
            Message::new("b42", format!("{name}.b"), "42", Bytes::from_static(b"1")),
        ];
        let out = sink.publish(&batch).await;
        assert!(matches!(out[0], Outcome::Failed(_)), "{out:?}");
        assert_eq!(out[1], Outcome::Delivered, "{out:?}");
        let (got, _) = read_all(&mut stream).await;
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0, "b42");
        drop_stream(&sink, &name).await;
    }
}

mod rabbitmq {
    use super::*;
    use taskq_outbox::rabbitmq::RabbitSink;
    use taskq_outbox::rabbitmq::lapin::ExchangeKind;
    use taskq_outbox::rabbitmq::lapin::options::{
        BasicGetOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
        QueueDeleteOptions,
    };
    use taskq_outbox::rabbitmq::lapin::types::{AMQPValue, FieldTable};

    /// A sink on the default exchange and a fresh durable queue; `None` when RabbitMQ does not
    /// answer.
    async fn setup() -> Option<(RabbitSink, String)> {
        let url = brokers::or_skip(Broker::RabbitMq)?;
        let sink = RabbitSink::connect(&url, "")
            .await
            .expect("connect to RabbitMQ");
        let name = brokers::fresh_name();
        sink.channel()
            .queue_declare(
                name.as_str().into(),
                QueueDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("declare a queue");
        Some((sink, name))
    }

    /// What the queue holds, as a consumer gets it: (message_id, payload), and for each
    /// message whether it is persistent and carries the test header.
    async fn read_all(sink: &RabbitSink, queue: &str) -> (Vec<(String, Vec<u8>)>, usize) {
        let mut got = Vec::new();
        let mut persistent_with_header = 0;
        while let Some(m) = sink
            .channel()
            .basic_get(queue.into(), BasicGetOptions { no_ack: true })
            .await
            .expect("basic.get")
        {
            let p = &m.delivery.properties;
            let id = p
                .message_id()
                .as_ref()
                .expect("message_id property")
                .to_string();
            let header = p.headers().as_ref().and_then(|h| {
                h.inner()
                    .iter()
                    .find(|(k, _)| k.as_str() == "x-taskq-test")
                    .map(|(_, v)| v.clone())
            });
            if *p.delivery_mode() == Some(2) && matches!(header, Some(AMQPValue::LongString(_))) {
                persistent_with_header += 1;
            }
            got.push((id, m.delivery.data.clone()));
        }
        (got, persistent_with_header)
    }

    async fn drop_queue(sink: &RabbitSink, queue: &str) {
        sink.channel()
            .queue_delete(queue.into(), QueueDeleteOptions::default())
            .await
            .ok();
    }

    #[tokio::test]
    async fn rabbitmq_queues_each_key_in_batch_order_persistent_with_its_id() {
        let Some((sink, queue)) = setup().await else {
            return;
        };
        let sink = sink.with_window(5);
        let batch = interleaved(&queue, 3, 20);
        let out = sink.publish(&batch).await;
        assert!(out.iter().all(Outcome::is_delivered), "{out:?}");
        let (got, persistent) = read_all(&sink, &queue).await;
        assert_eq!(got.len(), 60);
        assert_eq!(
            persistent, 60,
            "delivery_mode 2 and the header on every message"
        );
        assert_eq!(per_key(&batch, &got), expected(&batch, |_| true));
        drop_queue(&sink, &queue).await;
    }

    #[tokio::test]
    async fn rabbitmq_rejects_a_message_over_the_size_limit_and_holds_only_its_key() {
        let Some((sink, queue)) = setup().await else {
            return;
        };
        let sink = sink.with_max_message_size(64 * 1024);
        let batch = with_a_poison(&queue, 64 * 1024 + 1);
        let out = sink.publish(&batch).await;
        assert_poison_outcomes(&out);
        let (got, _) = read_all(&sink, &queue).await;
        let ids: Vec<&str> = got.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(ids, ["a0", "b0", "b1", "b2"]);
        drop_queue(&sink, &queue).await;
    }

    #[tokio::test]
    async fn rabbitmq_rejects_a_message_no_queue_takes() {
        let Some((sink, queue)) = setup().await else {
            return;
        };
        // The default exchange routes by queue name: no queue has this one, so the broker
        // returns the mandatory message before confirming it.
        let batch = vec![
            Message::new(
                "u0",
                format!("{queue}_nowhere"),
                "u",
                Bytes::from_static(b"0"),
            ),
            Message::new("q0", queue.clone(), "q", Bytes::from_static(b"1")),
        ];
        let out = sink.publish(&batch).await;
        assert!(
            matches!(&out[0], Outcome::Rejected(why) if why.contains("312")),
            "{out:?}"
        );
        assert_eq!(out[1], Outcome::Delivered);
        let (got, _) = read_all(&sink, &queue).await;
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0, "q0");
        drop_queue(&sink, &queue).await;
    }

    /// Every message carries its key as the header-table entry `Taskq-Key`, once.
    #[tokio::test]
    async fn rabbitmq_sends_the_key_as_the_taskq_key_header() {
        let Some((sink, queue)) = setup().await else {
            return;
        };
        let batch = keyed(&queue);
        let out = sink.publish(&batch).await;
        assert!(out.iter().all(Outcome::is_delivered), "{out:?}");
        let got = read_headers(&sink, &queue).await;
        assert_key_headers(&batch, &got);
        drop_queue(&sink, &queue).await;
    }

    /// Drains the queue: (message_id, header table as text) of each message.
    async fn read_headers(sink: &RabbitSink, queue: &str) -> Vec<(String, Vec<(String, String)>)> {
        let mut got = Vec::new();
        while let Some(m) = sink
            .channel()
            .basic_get(queue.into(), BasicGetOptions { no_ack: true })
            .await
            .expect("basic.get")
        {
            let p = &m.delivery.properties;
            let id = p.message_id().as_ref().expect("message_id").to_string();
            let mut headers = Vec::new();
            for (k, v) in p.headers().as_ref().expect("a header table").inner() {
                let AMQPValue::LongString(v) = v else {
                    panic!("{k}: {v:?}")
                };
                headers.push((k.to_string(), v.to_string()));
            }
            got.push((id, headers));
        }
        got
    }

    /// `declare_exchange` declares the sink's (fresh) exchange, durable, when the sink is made;
    /// a queue bound to it then gets the messages. Without it, nothing is declared.
    #[tokio::test]
    async fn rabbitmq_declare_exchange_declares_a_missing_exchange_and_delivers() {
        let Some(url) = brokers::or_skip(Broker::RabbitMq) else {
            return;
        };
        let exchange = brokers::fresh_name();
        let queue = format!("{exchange}_q");
        // The default: a sink on a missing exchange declares nothing.
        let plain = RabbitSink::connect(&url, &exchange)
            .await
            .expect("connect to RabbitMQ");
        let out = plain
            .publish(&[Message::new("p0", "orders.placed", "o", b"0".to_vec())])
            .await;
        assert!(matches!(&out[0], Outcome::Failed(_)), "{out:?}");
        let sink = RabbitSink::connect(&url, &exchange)
            .await
            .expect("connect to RabbitMQ")
            .declare_exchange(ExchangeKind::Topic)
            .await
            .expect("declare the exchange");
        // It exists now (a passive declare of a missing exchange would close the channel).
        let ch = sink.channel();
        ch.exchange_declare(
            exchange.as_str().into(),
            ExchangeKind::Topic,
            ExchangeDeclareOptions {
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .expect("the exchange exists");
        // Durable: declaring it again durable, same kind, is accepted (a non-durable one
        // would be 406 PRECONDITION_FAILED).
        ch.exchange_declare(
            exchange.as_str().into(),
            ExchangeKind::Topic,
            ExchangeDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .expect("the exchange is durable and a topic exchange");
        ch.queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .expect("declare a queue");
        ch.queue_bind(
            queue.as_str().into(),
            exchange.as_str().into(),
            "orders.#".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("bind the queue");
        let batch = keyed("orders.placed");
        let out = sink.publish(&batch).await;
        assert!(out.iter().all(Outcome::is_delivered), "{out:?}");
        let got = read_headers(&sink, &queue).await;
        assert_key_headers(&batch, &got);
        // The default exchange needs no declaration: nothing is declared, and it goes on.
        let default = RabbitSink::connect(&url, "")
            .await
            .unwrap()
            .declare_exchange(ExchangeKind::Direct)
            .await
            .expect("nothing to declare for the default exchange");
        let out = default
            .publish(&[Message::new("d0", queue.clone(), "d", b"0".to_vec())])
            .await;
        assert_eq!(out, [Outcome::Delivered]);
        drop_queue(&sink, &queue).await;
        ch.exchange_delete(exchange.as_str().into(), Default::default())
            .await
            .ok();
    }

    /// A key is (subject, key): a message of key "42" returned on one routing key does not
    /// hold key "42" on another (window 1, so the refusal is known before the next send).
    #[tokio::test]
    async fn rabbitmq_holds_a_key_of_one_subject_only() {
        let Some((sink, queue)) = setup().await else {
            return;
        };
        let sink = sink.with_window(1);
        let batch = vec![
            Message::new(
                "a42",
                format!("{queue}_nowhere"),
                "42",
                Bytes::from_static(b"0"),
            ),
            Message::new("b42", queue.clone(), "42", Bytes::from_static(b"1")),
        ];
        let out = sink.publish(&batch).await;
        assert!(matches!(&out[0], Outcome::Rejected(_)), "{out:?}");
        assert_eq!(out[1], Outcome::Delivered, "{out:?}");
        let (got, _) = read_all(&sink, &queue).await;
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0, "b42");
        drop_queue(&sink, &queue).await;
    }
}

mod redis {
    use super::*;
    use taskq_outbox::redis::RedisSink;
    use taskq_outbox::redis::client::{self, AsyncCommands, Value};

    /// A sink, a connection for the consumer's side and a fresh key name; `None` when Redis
    /// does not answer.
    async fn setup() -> Option<(RedisSink, client::aio::MultiplexedConnection, String)> {
        let url = brokers::or_skip(Broker::Redis)?;
        let sink = RedisSink::connect(&url).await.expect("connect to Redis");
        let conn = client::Client::open(url.as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .expect("connect to Redis");
        Some((sink, conn, brokers::fresh_name()))
    }

    fn text(v: &Value) -> Vec<u8> {
        match v {
            Value::BulkString(b) => b.clone(),
            Value::SimpleString(s) => s.clone().into_bytes(),
            other => panic!("not a string: {other:?}"),
        }
    }

    /// Every entry of the stream (XRANGE - +): (id field, payload field), in stream order,
    /// and how many carry the test header field.
    async fn read_all(
        conn: &mut client::aio::MultiplexedConnection,
        stream: &str,
    ) -> (Vec<(String, Vec<u8>)>, usize) {
        let entries: Value = client::cmd("XRANGE")
            .arg(stream)
            .arg("-")
            .arg("+")
            .query_async(conn)
            .await
            .expect("XRANGE");
        let Value::Array(entries) = entries else {
            panic!("XRANGE answered {entries:?}")
        };
        let mut got = Vec::new();
        let mut with_header = 0;
        for e in entries {
            let Value::Array(parts) = e else { panic!() };
            let Value::Array(fields) = &parts[1] else {
                panic!()
            };
            let mut map = BTreeMap::new();
            for kv in fields.chunks(2) {
                map.insert(String::from_utf8(text(&kv[0])).unwrap(), text(&kv[1]));
            }
            with_header += usize::from(map.contains_key("h:x-taskq-test"));
            got.push((
                String::from_utf8(map["id"].clone()).unwrap(),
                map["payload"].clone(),
            ));
        }
        (got, with_header)
    }

    #[tokio::test]
    async fn redis_appends_each_key_in_batch_order_with_its_id_and_headers() {
        let Some((sink, mut conn, stream)) = setup().await else {
            return;
        };
        // Pipelines of 7: the batch goes as nine of them, one after the other.
        let sink = sink.with_window(7);
        let batch = interleaved(&stream, 3, 20);
        let out = sink.publish(&batch).await;
        assert!(out.iter().all(Outcome::is_delivered), "{out:?}");
        let (got, with_header) = read_all(&mut conn, &stream).await;
        assert_eq!(got.len(), 60);
        assert_eq!(with_header, 60);
        assert_eq!(per_key(&batch, &got), expected(&batch, |_| true));
        let _: () = conn.del(&stream).await.unwrap();
    }

    /// Every entry carries its key twice: the field `key` (as before) and the field
    /// `h:Taskq-Key`, once (a header of the message named `taskq-key` is not added).
    #[tokio::test]
    async fn redis_sends_the_key_as_the_taskq_key_header_field() {
        let Some((sink, mut conn, stream)) = setup().await else {
            return;
        };
        let batch = keyed(&stream);
        let out = sink.publish(&batch).await;
        assert!(out.iter().all(Outcome::is_delivered), "{out:?}");
        let entries: Value = client::cmd("XRANGE")
            .arg(&stream)
            .arg("-")
            .arg("+")
            .query_async(&mut conn)
            .await
            .expect("XRANGE");
        let Value::Array(entries) = entries else {
            panic!("XRANGE answered {entries:?}")
        };
        let mut got = Vec::new();
        for e in entries {
            let Value::Array(parts) = e else { panic!() };
            let Value::Array(fields) = &parts[1] else {
                panic!()
            };
            let fields: Vec<(String, String)> = fields
                .chunks(2)
                .map(|kv| {
                    (
                        String::from_utf8(text(&kv[0])).unwrap(),
                        String::from_utf8(text(&kv[1])).unwrap(),
                    )
                })
                .collect();
            let field = |name: &str| {
                fields
                    .iter()
                    .find(|(n, _)| n == name)
                    .map(|(_, v)| v.clone())
                    .unwrap()
            };
            let id = field("id");
            let m = batch.iter().find(|m| m.id == id).unwrap();
            assert_eq!(field("key"), m.key, "the key field is kept");
            // The header fields, without their `h:` prefix.
            let headers = fields
                .iter()
                .filter_map(|(n, v)| Some((n.strip_prefix("h:")?.to_owned(), v.clone())))
                .collect();
            got.push((id, headers));
        }
        assert_key_headers(&batch, &got);
        let _: () = conn.del(&stream).await.unwrap();
    }

    #[tokio::test]
    async fn redis_rejects_an_entry_redis_refuses_and_holds_only_its_key() {
        let Some((sink, mut conn, stream)) = setup().await else {
            return;
        };
        // Not a stream: XADD to it is WRONGTYPE, every time.
        let plain = format!("{stream}_plain");
        let _: () = conn.set(&plain, "not a stream").await.unwrap();
        let sink = sink.with_window(2);
        let m = |id: &str, subject: &str, key: &str| {
            Message::new(id, subject, key, id.as_bytes().to_vec())
        };
        let batch = vec![
            m("a0", &stream, "a"),
            m("b0", &stream, "b"),
            m("a1", &plain, "a"),
            m("b1", &stream, "b"),
            // The same subject as a1: a key is (subject, key), and (plain, a) is held.
            m("a2", &plain, "a"),
            m("b2", &stream, "b"),
        ];
        let out = sink.publish(&batch).await;
        assert!(
            matches!(&out[2], Outcome::Rejected(why) if why.contains("WRONGTYPE")),
            "{out:?}"
        );
        assert_poison_outcomes(&out);
        let (got, _) = read_all(&mut conn, &stream).await;
        let ids: Vec<&str> = got.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(ids, ["a0", "b0", "b1", "b2"]);
        let _: () = conn.del(&[&stream, &plain]).await.unwrap();
    }

    /// A key is (subject, key): key "42" refused on one stream does not hold key "42" on
    /// another (pipelines of 1, so the refusal is known before the next entry is sent).
    #[tokio::test]
    async fn redis_holds_a_key_of_one_subject_only() {
        let Some((sink, mut conn, stream)) = setup().await else {
            return;
        };
        let plain = format!("{stream}_plain");
        let _: () = conn.set(&plain, "not a stream").await.unwrap();
        let sink = sink.with_window(1);
        let batch = vec![
            Message::new("a42", plain.clone(), "42", b"0".to_vec()),
            Message::new("b42", stream.clone(), "42", b"1".to_vec()),
        ];
        let out = sink.publish(&batch).await;
        assert!(matches!(&out[0], Outcome::Rejected(_)), "{out:?}");
        assert_eq!(out[1], Outcome::Delivered, "{out:?}");
        let (got, _) = read_all(&mut conn, &stream).await;
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0, "b42");
        let _: () = conn.del(&[&stream, &plain]).await.unwrap();
    }

    /// Issue 34 S3: an error that is not about the entry (here `NOPERM`: the sink's user may
    /// not write that stream, an ACL to fix; likewise `MISCONF`, `NOAUTH`...) is `Failed`, so
    /// the relay backs off and tries again rather than dead-letter or hold every event it
    /// sends meanwhile.
    #[tokio::test]
    async fn redis_fails_rather_than_rejects_an_error_not_about_the_entry() {
        let Some((_, mut conn, stream)) = setup().await else {
            return;
        };
        // A user of its own (this test's name), allowed only the keys `<stream>_ok*`.
        let user = format!("{stream}_user");
        let _: () = client::cmd("ACL")
            .arg("SETUSER")
            .arg(&user)
            .arg("on")
            .arg(">pw")
            .arg(format!("~{stream}_ok*"))
            .arg("+@all")
            .query_async(&mut conn)
            .await
            .expect("ACL SETUSER");
        let url = brokers::or_skip(Broker::Redis).unwrap();
        let url = url.replacen("redis://", &format!("redis://{user}:pw@"), 1);
        let sink = RedisSink::connect(&url).await.expect("connect as the user");
        let ok = format!("{stream}_ok");
        let batch = vec![
            Message::new("a0", &stream, "a", b"x".to_vec()),
            Message::new("b0", &ok, "b", b"x".to_vec()),
        ];
        let out = sink.publish(&batch).await;
        let _: () = client::cmd("ACL")
            .arg("DELUSER")
            .arg(&user)
            .query_async(&mut conn)
            .await
            .unwrap();
        let _: () = conn.del(&[&stream, &ok]).await.unwrap();
        assert!(
            matches!(&out[0], Outcome::Failed(why) if why.to_lowercase().contains("noperm")),
            "{out:?}"
        );
        assert!(out[1].is_delivered(), "{out:?}");
    }
}

/// The relay tests' support (`tests/outbox_relay.rs`) on its own: a destination per broker
/// reads back what a sink published, the ledger checks it, and a private `nats-server`
/// survives a stop and start with its stream, behind a `Reconnecting` sink.
mod support {
    use super::*;
    use std::time::Duration;
    use taskq_outbox::Reconnecting;
    use taskq_tests::brokers::{Destination, Ledger};
    use taskq_tests::nats_server::PrivateNats;

    /// 3 keys × 10 messages on `topic`, and their ledger.
    fn batch(topic: &str) -> (Vec<Message>, Ledger) {
        let mut ledger = Ledger::new();
        let mut batch = Vec::new();
        for seq in 1..=10u64 {
            for k in 0..3 {
                let id = format!("{topic}-k{k}-{seq}");
                ledger.committed(format!("k{k}"), seq, id.clone());
                batch.push(Message::new(
                    id,
                    topic,
                    format!("k{k}"),
                    serde_json::to_vec(&serde_json::json!({"key": format!("k{k}")})).unwrap(),
                ));
            }
        }
        (batch, ledger)
    }

    fn key(m: &brokers::Received) -> String {
        m.json()["key"].as_str().unwrap().to_owned()
    }

    async fn round_trip<S: Sink>(broker: Broker, url: &str, sink: S) {
        let dest = Destination::create(broker, url).await;
        let (batch, mut ledger) = batch(&dest.topic);
        assert!(sink.publish(&batch).await.iter().all(Outcome::is_delivered));
        // Half again (a relay after a lost answer), and one never committed to the ledger.
        assert!(
            sink.publish(&batch[..15])
                .await
                .iter()
                .all(Outcome::is_delivered)
        );
        assert_eq!(
            dest.count().await,
            if broker == Broker::Nats { 30 } else { 45 }
        );
        let got = dest.read_all().await;
        let d = ledger.check(&got, key).expect("what the sink published");
        assert_eq!((d.distinct, d.keys), (30, 3));
        ledger.rolled_back(batch[0].id.clone());
        assert!(ledger.check(&got, key).is_err(), "a rolled-back id is seen");
        dest.delete().await;
    }

    #[tokio::test]
    async fn destinations_read_back_what_each_sink_published() {
        if let Some(url) = brokers::or_skip(Broker::Nats) {
            let sink = taskq_outbox::nats::NatsSink::connect(&url).await.unwrap();
            round_trip(Broker::Nats, &url, sink).await;
        }
        if let Some(url) = brokers::or_skip(Broker::RabbitMq) {
            let sink = taskq_outbox::rabbitmq::RabbitSink::connect(&url, "")
                .await
                .unwrap();
            round_trip(Broker::RabbitMq, &url, sink).await;
        }
        if let Some(url) = brokers::or_skip(Broker::Redis) {
            let sink = taskq_outbox::redis::RedisSink::connect(&url).await.unwrap();
            round_trip(Broker::Redis, &url, sink).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_private_nats_server_restarts_with_its_stream_and_a_reconnecting_sink_follows() {
        let Some(mut nats) = PrivateNats::start_or_skip() else {
            return;
        };
        let url = nats.url();
        let dest = Destination::create(Broker::Nats, &url).await;
        let u = url.clone();
        let sink = Reconnecting::new(move || {
            let u = u.clone();
            async move { taskq_outbox::nats::NatsSink::connect(&u).await }
        })
        .with_timeout(Duration::from_secs(1));
        let (batch, ledger) = batch(&dest.topic);
        assert!(
            sink.publish(&batch[..10])
                .await
                .iter()
                .all(Outcome::is_delivered)
        );
        tokio::task::block_in_place(|| nats.stop());
        let out = sink.publish(&batch[10..]).await;
        assert!(out.iter().all(|o| !o.is_delivered()), "{out:?}");
        tokio::task::block_in_place(|| nats.start());
        let mut delivered = false;
        for _ in 0..50 {
            if sink
                .publish(&batch[10..])
                .await
                .iter()
                .all(Outcome::is_delivered)
            {
                delivered = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(delivered, "the sink reconnected after the restart");
        let got = dest.read_all().await;
        ledger
            .check(&got, key)
            .expect("the stream kept its messages");
        assert!(sink.connects() >= 2);
        dest.delete().await;
    }

    /// Through the chaos proxy: a cut (with new connections refused for a while) and a black
    /// hole each fail a batch, and the next batches go out on a new connection.
    async fn survives_cut_and_black_hole<S, F, Fut, E>(broker: Broker, connect: F)
    where
        S: Sink,
        F: Fn(String) -> Fut + Send + Sync + Clone + 'static,
        Fut: std::future::Future<Output = Result<S, E>> + Send,
        E: std::fmt::Display,
    {
        let Some(url) = brokers::or_skip(broker) else {
            return;
        };
        let upstream = std::net::ToSocketAddrs::to_socket_addrs(&broker.address())
            .unwrap()
            .next()
            .unwrap();
        let proxy = taskq_tests::proxy::ChaosProxy::start(upstream).await;
        let proxied = url.replacen(&broker.address(), &proxy.addr().to_string(), 1);
        let dest = Destination::create(broker, &url).await;
        let sink = Reconnecting::new(move || connect.clone()(proxied.clone()))
            .with_timeout(Duration::from_millis(500));
        let (batch, ledger) = batch(&dest.topic);
        let mut stalls = Vec::new();
        for (i, chunk) in batch.chunks(10).enumerate() {
            match i {
                1 => {
                    proxy.set_refuse(true);
                    proxy.cut_all().await;
                }
                2 => {
                    proxy.set_black_hole(true);
                    proxy.black_hole_all();
                }
                _ => {}
            }
            let start = std::time::Instant::now();
            let mut tries = 0;
            loop {
                tries += 1;
                if sink.publish(chunk).await.iter().all(Outcome::is_delivered) {
                    break;
                }
                assert!(tries < 100, "{broker:?}: chunk {i} never delivered");
                if tries == 3 {
                    // The fault ends.
                    proxy.set_refuse(false);
                    proxy.heal();
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            stalls.push((tries, start.elapsed()));
        }
        assert!(stalls[1].0 > 1 && stalls[2].0 > 1, "{stalls:?}");
        let got = dest.read_all().await;
        ledger
            .check(&got, key)
            .expect("every message once delivered, in order per key");
        dest.delete().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reconnecting_sinks_survive_a_cut_and_a_black_hole() {
        survives_cut_and_black_hole(Broker::Redis, |u: String| async move {
            taskq_outbox::redis::RedisSink::connect(&u).await
        })
        .await;
        survives_cut_and_black_hole(Broker::RabbitMq, |u: String| async move {
            taskq_outbox::rabbitmq::RabbitSink::connect(&u, "").await
        })
        .await;
        survives_cut_and_black_hole(Broker::Nats, |u: String| async move {
            taskq_outbox::nats::NatsSink::connect(&u).await
        })
        .await;
    }
}

/// End to end: events written with `publish_tx` and relayed (`Relay::run_once`) reach each
/// broker with their key in the header `Taskq-Key`, as a consumer reads them.
mod relay_key_header {
    use super::*;
    use taskq::outbox::{Event, Relay};
    use taskq_tests::backends::Db;
    use taskq_tests::brokers::Destination;
    use taskq_tests::drivers::HasDriver;

    #[derive(serde::Serialize)]
    struct Placed {
        #[serde(skip)]
        topic: String,
        order: String,
        n: u32,
    }

    impl Event for Placed {
        fn topic(&self) -> &str {
            &self.topic
        }
        fn key(&self) -> String {
            self.order.clone()
        }
    }

    async fn relayed_to<B: HasDriver, S: Sink + 'static>(
        db: &Db<B>,
        broker: Broker,
        url: &str,
        sink: S,
    ) {
        let dest = Destination::create(broker, url).await;
        let mut tx = db.begin().await;
        for n in 0..3 {
            for order in ["o-1", "o-2"] {
                Placed {
                    topic: dest.topic.clone(),
                    order: order.to_owned(),
                    n,
                }
                .publish_tx(&mut tx)
                .await
                .expect("publish_tx");
            }
        }
        tx.commit().await.expect("commit");
        let relay = Relay::builder(db.pool.clone(), sink)
            .topics([dest.topic.clone()])
            .build()
            .unwrap();
        let round = relay.run_once().await.expect("a round");
        assert_eq!((round.published, round.delivered), (6, 6), "{broker:?}");
        let got = dest.read_all().await;
        dest.delete().await;
        assert_eq!(got.len(), 6, "{broker:?}");
        for m in &got {
            let order = m.json()["order"].as_str().unwrap().to_owned();
            assert_eq!(m.key_header.as_deref(), Some(order.as_str()), "{broker:?}");
        }
    }

    async fn the_relay_sends_each_events_key_as_the_taskq_key_header<B: HasDriver>(db: Db<B>) {
        if let Some(url) = brokers::or_skip(Broker::Nats) {
            let sink = taskq_outbox::nats::NatsSink::connect(&url).await.unwrap();
            relayed_to(&db, Broker::Nats, &url, sink).await;
        }
        if let Some(url) = brokers::or_skip(Broker::RabbitMq) {
            let sink = taskq_outbox::rabbitmq::RabbitSink::connect(&url, "")
                .await
                .unwrap();
            relayed_to(&db, Broker::RabbitMq, &url, sink).await;
        }
        if let Some(url) = brokers::or_skip(Broker::Redis) {
            let sink = taskq_outbox::redis::RedisSink::connect(&url).await.unwrap();
            relayed_to(&db, Broker::Redis, &url, sink).await;
        }
    }

    taskq_tests::conformance!(the_relay_sends_each_events_key_as_the_taskq_key_header);
}
