//! RabbitMQ (feature `rabbitmq`, through `lapin`).
//!
//! Each message is a `basic.publish` to the sink's exchange with the message's subject as
//! routing key, `mandatory` set, persistent (`delivery_mode` 2), the `message_id` property set
//! to the message id and, in the header table, [`Taskq-Key`](crate::KEY_HEADER) set to the
//! message's key and the message's headers, on one channel in confirm mode.
//! **Delivered** = the broker confirmed it (`basic.ack` of publisher confirms) without
//! returning it: routed to at least one queue, and for a durable queue written to disk (a
//! quorum queue: to a majority of its replicas). A returned message (`mandatory`, routed to no
//! queue) or a `basic.nack` is [`Outcome::Rejected`]; a channel or connection error before the
//! confirm is [`Outcome::Failed`].
//!
//! Publishes are pipelined on the channel, up to [`RabbitSink::with_window`] confirms
//! outstanding; a channel keeps its order, so one key's messages reach a queue in batch order.
//! RabbitMQ closes the whole channel on a message over its `max_message_size` (16 MiB by
//! default since RabbitMQ 4.0, 128 MiB before), which would fail every message in flight with
//! it: the sink refuses a larger payload itself ([`Outcome::Rejected`]) before sending it, up
//! to [`RabbitSink::with_max_message_size`], so that one message holds only its own key.
//!
//! RabbitMQ has no duplicate window: a message published again (after a lost confirm) reaches
//! its queues again with the same `message_id`; consumers drop the second (an inbox).
//!
//! **Setup.** The sink declares nothing unless asked. Declare the exchange and bind its queues
//! before starting the relay (or let the sink declare the exchange with
//! [`RabbitSink::declare_exchange`]; binding queues stays the consumers' or the operator's
//! job). Otherwise:
//!
//! - a missing exchange closes the channel (`404 NOT_FOUND`): every message fails, and the
//!   relay backs off and tries again (with [`Reconnecting`](crate::Reconnecting), on a new
//!   channel) until the exchange exists;
//! - an exchange with no queue bound for a routing key returns the message (`312 NO_ROUTE`):
//!   it is `Rejected`, so a relay in its default strict mode **holds the key** until an
//!   operator releases or replays it (after binding a queue).
//!
//! Either case logs a warning naming the exchange (and routing key), at most once a minute per
//! exchange and routing key.

/// The client crate, at the version this sink is built with.
pub use lapin;

use std::collections::VecDeque;
use std::sync::Arc;

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind};
use lapin::{Confirmation, PublisherConfirm};

use crate::{Message, Outcome, Sink, Stopped};

/// Default number of confirms a batch waits for at once.
pub const DEFAULT_WINDOW: usize = 1024;

/// Default largest payload the sink sends: RabbitMQ 4's default `max_message_size`.
pub const DEFAULT_MAX_MESSAGE_SIZE: usize = 16 * 1024 * 1024;

/// A RabbitMQ sink: one channel in confirm mode.
#[derive(Clone)]
pub struct RabbitSink {
    channel: Channel,
    // Kept so that the connection lives as long as the sink.
    _connection: Option<Arc<Connection>>,
    exchange: String,
    window: usize,
    max_message_size: usize,
}

impl RabbitSink {
    /// Connects to `uri` (`amqp://guest:guest@127.0.0.1:5672/%2f`), opens a channel and puts
    /// it in confirm mode; messages go to `exchange` (`""`: the default exchange, which routes
    /// a message to the queue named by its subject).
    pub async fn connect(uri: &str, exchange: &str) -> lapin::Result<Self> {
        let connection = Connection::connect(uri, ConnectionProperties::default()).await?;
        let channel = connection.create_channel().await?;
        let mut sink = Self::new(channel, exchange).await?;
        sink._connection = Some(Arc::new(connection));
        Ok(sink)
    }

    /// A sink on your channel (put in confirm mode here), publishing to `exchange`.
    pub async fn new(channel: Channel, exchange: &str) -> lapin::Result<Self> {
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        Ok(Self {
            channel,
            _connection: None,
            exchange: exchange.to_owned(),
            window: DEFAULT_WINDOW,
            max_message_size: DEFAULT_MAX_MESSAGE_SIZE,
        })
    }

    /// At most `window` (≥ 1) publishes of a batch wait for their confirm at once.
    pub fn with_window(mut self, window: usize) -> Self {
        self.window = window.max(1);
        self
    }

    /// The largest payload sent (bytes); a larger one is [`Outcome::Rejected`] unsent. Set it
    /// to the server's `max_message_size` (or below).
    pub fn with_max_message_size(mut self, bytes: usize) -> Self {
        self.max_message_size = bytes;
        self
    }

    /// Declares the sink's exchange, durable, of `kind` (`exchange.declare`: nothing changes
    /// when it exists with the same kind and durability; a different one is an error, `406
    /// PRECONDITION_FAILED`, and closes the channel). Opt-in: without it the sink declares
    /// nothing. The default exchange (`""`) always exists: nothing is declared for it. Queues
    /// and their bindings are not declared: until one is bound for a routing key, its
    /// messages are returned and `Rejected` (see the [module](self)). With
    /// [`Reconnecting`](crate::Reconnecting), call it in the connect function, so each new
    /// channel declares again:
    ///
    /// ```no_run
    /// # async fn f() -> taskq_outbox::rabbitmq::lapin::Result<()> {
    /// use taskq_outbox::rabbitmq::{RabbitSink, lapin::ExchangeKind};
    /// let sink = RabbitSink::connect("amqp://guest:guest@127.0.0.1:5672/%2f", "orders")
    ///     .await?
    ///     .declare_exchange(ExchangeKind::Topic)
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub async fn declare_exchange(self, kind: ExchangeKind) -> lapin::Result<Self> {
        if !self.exchange.is_empty() {
            self.channel
                .exchange_declare(
                    ShortString::from(self.exchange.as_str()),
                    kind,
                    ExchangeDeclareOptions {
                        durable: true,
                        ..ExchangeDeclareOptions::default()
                    },
                    FieldTable::default(),
                )
                .await?;
        }
        Ok(self)
    }

    /// The channel.
    pub fn channel(&self) -> &Channel {
        &self.channel
    }

    fn properties(m: &Message) -> BasicProperties {
        let mut table = FieldTable::default();
        for (name, value) in m.headers_to_publish() {
            table.insert(
                ShortString::from(name),
                AMQPValue::LongString(LongString::from(value)),
            );
        }
        BasicProperties::default()
            .with_delivery_mode(2)
            .with_message_id(ShortString::from(m.id.as_str()))
            .with_headers(table)
    }
}

/// The exchange's name in a warning: `""` is the default exchange.
fn exchange_label(exchange: &str) -> String {
    if exchange.is_empty() {
        "\"\" (the default exchange)".to_owned()
    } else {
        exchange.to_owned()
    }
}

/// Logs what a confirm says is missing on the broker: a returned message (312 NO_ROUTE: no
/// queue bound for its routing key) or a channel closed with 404 NOT_FOUND (no such exchange).
fn warn_setup(confirm: &lapin::Result<Confirmation>, exchange: &str, routing_key: &str) {
    match confirm {
        Ok(Confirmation::Ack(Some(returned)) | Confirmation::Nack(Some(returned)))
            if returned.reply_code == 312 =>
        {
            warn_no_route(exchange, routing_key)
        }
        Err(e) => warn_if_no_exchange(e, exchange),
        _ => {}
    }
}

/// At most once per [`WARN_EVERY`] per exchange and routing key.
///
/// [`WARN_EVERY`]: crate::WARN_EVERY
fn warn_no_route(exchange: &str, routing_key: &str) {
    if crate::warning_due(format!("rabbitmq route {exchange}\0{routing_key}")) {
        let label = exchange_label(exchange);
        tracing::warn!(
            exchange,
            routing_key,
            "RabbitMQ: no queue is bound to exchange {label} for routing key {routing_key} \
             (the message was returned, 312 NO_ROUTE); it is Rejected, so the relay holds its \
             key until a queue is bound and an operator releases or replays the key"
        );
    }
}

/// When `e` is the channel closed with 404 NOT_FOUND (a publish to a missing exchange): at
/// most once per [`WARN_EVERY`] per exchange.
///
/// [`WARN_EVERY`]: crate::WARN_EVERY
fn warn_if_no_exchange(e: &lapin::Error, exchange: &str) {
    if is_not_found(e) && crate::warning_due(format!("rabbitmq exchange {exchange}")) {
        let label = exchange_label(exchange);
        tracing::warn!(
            exchange,
            error = %e,
            "RabbitMQ: exchange {label} does not exist (404 NOT_FOUND closed the channel); \
             messages fail and are retried until it does: declare it (and bind its queues) \
             before starting the relay, or create the sink with RabbitSink::declare_exchange"
        );
    }
}

/// Whether the channel was closed with 404 NOT_FOUND (a publish to a missing exchange).
fn is_not_found(e: &lapin::Error) -> bool {
    matches!(e.kind(), lapin::ErrorKind::ProtocolError(amqp) if amqp.get_id() == 404)
}

fn outcome_of(confirm: lapin::Result<Confirmation>) -> Outcome {
    match confirm {
        Ok(Confirmation::Ack(None)) => Outcome::Delivered,
        Ok(Confirmation::Ack(Some(returned))) | Ok(Confirmation::Nack(Some(returned))) => {
            Outcome::Rejected(format!(
                "returned by the broker: {} {}",
                returned.reply_code, returned.reply_text
            ))
        }
        Ok(Confirmation::Nack(None)) => Outcome::Rejected("nacked by the broker".into()),
        Ok(Confirmation::NotRequested) => {
            Outcome::Failed("the channel is not in confirm mode".into())
        }
        Err(e) => Outcome::Failed(e.to_string()),
    }
}

impl Sink for RabbitSink {
    async fn publish(&self, batch: &[Message]) -> Vec<Outcome> {
        let mut out: Vec<Option<Outcome>> = vec![None; batch.len()];
        let mut stopped = Stopped::default();
        let mut in_flight: VecDeque<(usize, PublisherConfirm)> = VecDeque::new();
        let exchange = ShortString::from(self.exchange.as_str());
        let options = BasicPublishOptions {
            mandatory: true,
            ..BasicPublishOptions::default()
        };
        for (i, m) in batch.iter().enumerate() {
            while in_flight.len() >= self.window {
                let (j, confirm) = in_flight.pop_front().expect("window ≥ 1");
                let confirm = confirm.await;
                warn_setup(&confirm, &self.exchange, &batch[j].subject);
                let o = outcome_of(confirm);
                stopped.record(&batch[j], &o);
                out[j] = Some(o);
            }
            if stopped.has(m) {
                out[i] = Some(Outcome::Held);
                continue;
            }
            if m.payload.len() > self.max_message_size {
                let o = Outcome::Rejected(format!(
                    "payload of {} bytes over the sink's max_message_size of {}",
                    m.payload.len(),
                    self.max_message_size
                ));
                stopped.record(m, &o);
                out[i] = Some(o);
                continue;
            }
            let sent = self
                .channel
                .basic_publish(
                    exchange.clone(),
                    ShortString::from(m.subject.as_str()),
                    options,
                    &m.payload,
                    Self::properties(m),
                )
                .await;
            match sent {
                Ok(confirm) => in_flight.push_back((i, confirm)),
                Err(e) => {
                    warn_if_no_exchange(&e, &self.exchange);
                    let o = Outcome::Failed(e.to_string());
                    stopped.record(m, &o);
                    out[i] = Some(o);
                }
            }
        }
        while let Some((j, confirm)) = in_flight.pop_front() {
            let confirm = confirm.await;
            warn_setup(&confirm, &self.exchange, &batch[j].subject);
            let o = outcome_of(confirm);
            stopped.record(&batch[j], &o);
            out[j] = Some(o);
        }
        out.into_iter()
            .map(|o| o.expect("every message has an outcome"))
            .collect()
    }
}
