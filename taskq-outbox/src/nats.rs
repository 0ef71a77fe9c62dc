//! NATS JetStream (feature `nats`, through `async-nats`).
//!
//! Each message is a JetStream publish to its subject, with the header `Nats-Msg-Id` set to the
//! message id, so the stream drops a second publish of the same id within its duplicate window
//! (2 minutes by default, `duplicate_window` of the stream), the header
//! [`Taskq-Key`](crate::KEY_HEADER) set to the message's key, plus the message's headers.
//! **Delivered** = the stream's publish ack came back (the message is stored in the stream, on
//! disk for a file-backed stream, on a quorum of replicas for a replicated one; a duplicate's
//! ack counts too: the stream has that id already).
//!
//! Publishes are pipelined on the client's one connection, up to [`NatsSink::with_window`]
//! acks outstanding; NATS keeps a connection's order, so one key's messages are stored in batch
//! order. A message larger than the server's `max_payload` (payload plus headers) is refused
//! by the client before it is sent: [`Outcome::Rejected`], and its key's later messages are
//! held. An ack error the stream sends (a message over the stream's `max_msg_size`, a full
//! stream with `discard: new`...) is `Rejected`; no ack in time, a broken connection, no stream
//! answering for the subject (none defined, or JetStream unavailable) are
//! [`Outcome::Failed`].
//!
//! **Setup.** The sink creates no stream unless asked: a subject no stream captures fails
//! (the relay backs off and tries again, for as long as there is none), and the sink logs a
//! warning naming the subject (at most once a minute per subject). Create the stream before
//! starting the relay, or let the sink make sure it exists with [`NatsSink::ensure_stream`].

/// The client crate, at the version this sink is built with.
pub use async_nats;

use std::collections::VecDeque;

use async_nats::jetstream::context::{
    CreateStreamError, PublishAckFuture, PublishError, PublishErrorKind,
};
use async_nats::jetstream::{self, message::PublishMessage};

use crate::{Message, Outcome, Sink, Stopped};

/// Default number of publish acks a batch waits for at once.
pub const DEFAULT_WINDOW: usize = 1024;

/// A JetStream sink.
#[derive(Clone)]
pub struct NatsSink {
    js: jetstream::Context,
    window: usize,
}

impl NatsSink {
    /// Connects to the NATS server at `url` (`nats://127.0.0.1:4222`) with async-nats's
    /// defaults (it reconnects by itself).
    pub async fn connect(url: &str) -> Result<Self, async_nats::ConnectError> {
        let client = async_nats::connect(url).await?;
        Ok(Self::new(jetstream::new(client)))
    }

    /// A sink on your JetStream context (its ack timeout applies).
    pub fn new(js: jetstream::Context) -> Self {
        Self {
            js,
            window: DEFAULT_WINDOW,
        }
    }

    /// At most `window` (≥ 1) publishes of a batch wait for their ack at once; the next one is
    /// sent when the oldest is answered. Keep it at or below the context's
    /// `max_ack_inflight` (5,000 by default).
    pub fn with_window(mut self, window: usize) -> Self {
        self.window = window.max(1);
        self
    }

    /// Makes sure a stream named `name` exists, creating it when there is none: file storage,
    /// capturing `subjects` (such as `["orders.>"]`), the server's defaults otherwise. A stream
    /// of that name that exists already is left as it is (its subjects are not compared).
    /// Opt-in: without it the sink never creates a stream. With [`Reconnecting`], call it in
    /// the connect function, so each connection makes sure again:
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), taskq_outbox::nats::async_nats::Error> {
    /// use taskq_outbox::nats::NatsSink;
    /// let sink = NatsSink::connect("nats://127.0.0.1:4222")
    ///     .await?
    ///     .ensure_stream("ORDERS", ["orders.>"])
    ///     .await?;
    /// # Ok(()) }
    /// ```
    ///
    /// [`Reconnecting`]: crate::Reconnecting
    pub async fn ensure_stream<I, S>(
        self,
        name: &str,
        subjects: I,
    ) -> Result<Self, CreateStreamError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.js
            .get_or_create_stream(jetstream::stream::Config {
                name: name.to_owned(),
                subjects: subjects.into_iter().map(Into::into).collect(),
                storage: jetstream::stream::StorageType::File,
                ..Default::default()
            })
            .await?;
        Ok(self)
    }

    /// The JetStream context.
    pub fn context(&self) -> &jetstream::Context {
        &self.js
    }
}

/// The outcome a publish error of a message to `subject` stands for; a publish no stream
/// answered also logs a warning naming the subject (at most once per [`WARN_EVERY`] per
/// subject).
///
/// [`WARN_EVERY`]: crate::WARN_EVERY
fn outcome_of(e: PublishError, subject: &str) -> Outcome {
    if matches!(e.kind(), PublishErrorKind::StreamNotFound)
        && crate::warning_due(format!("nats stream {subject}"))
    {
        tracing::warn!(
            subject,
            "NATS: no JetStream stream captures subject {subject} (the publish had no \
             responders; or JetStream is not enabled); its messages fail and are retried \
             until a stream takes the subject: create one, or use NatsSink::ensure_stream"
        );
    }
    match e.kind() {
        PublishErrorKind::MaxPayloadExceeded
        | PublishErrorKind::WrongLastMessageId
        | PublishErrorKind::WrongLastSequence => Outcome::Rejected(e.to_string()),
        // No responders: no stream for the subject, or JetStream not answering right now.
        PublishErrorKind::StreamNotFound
        | PublishErrorKind::TimedOut
        | PublishErrorKind::BrokenPipe
        | PublishErrorKind::MaxAckPending => Outcome::Failed(e.to_string()),
        // The stream's own error answer (its source is a `jetstream::Error`): it refused this
        // message, except 503 (JetStream temporarily unavailable). Anything else: transient.
        PublishErrorKind::Other => {
            let js = std::error::Error::source(&e)
                .and_then(|s| s.downcast_ref::<jetstream::Error>())
                .map(|j| j.code());
            match js {
                Some(code) if code != 503 => Outcome::Rejected(e.to_string()),
                _ => Outcome::Failed(e.to_string()),
            }
        }
    }
}

impl Sink for NatsSink {
    async fn publish(&self, batch: &[Message]) -> Vec<Outcome> {
        let mut out: Vec<Option<Outcome>> = vec![None; batch.len()];
        let mut stopped = Stopped::default();
        let mut in_flight: VecDeque<(usize, PublishAckFuture)> = VecDeque::new();
        async fn settle<'a>(
            batch: &'a [Message],
            out: &mut [Option<Outcome>],
            stopped: &mut Stopped<'a>,
            (i, ack): (usize, PublishAckFuture),
        ) {
            let o = match ack.await {
                Ok(_) => Outcome::Delivered,
                Err(e) => outcome_of(e, &batch[i].subject),
            };
            stopped.record(&batch[i], &o);
            out[i] = Some(o);
        }
        for (i, m) in batch.iter().enumerate() {
            while in_flight.len() >= self.window {
                let next = in_flight.pop_front().expect("window ≥ 1");
                settle(batch, &mut out, &mut stopped, next).await;
            }
            if stopped.has(m) {
                out[i] = Some(Outcome::Held);
                continue;
            }
            let mut p = PublishMessage::build()
                .payload(m.payload.clone())
                .message_id(&m.id);
            for (name, value) in m.headers_to_publish() {
                p = p.header(name, value);
            }
            match self.js.send_publish(m.subject.clone(), p).await {
                Ok(ack) => in_flight.push_back((i, ack)),
                Err(e) => {
                    let o = outcome_of(e, &m.subject);
                    stopped.record(m, &o);
                    out[i] = Some(o);
                }
            }
        }
        while let Some(next) = in_flight.pop_front() {
            settle(batch, &mut out, &mut stopped, next).await;
        }
        out.into_iter()
            .map(|o| o.expect("every message has an outcome"))
            .collect()
    }
}
