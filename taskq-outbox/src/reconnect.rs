//! [`Reconnecting`]: a sink that replaces its connection when it fails or stops answering.
//!
//! A lapin channel or connection that closed, or a redis `MultiplexedConnection` that dropped,
//! never works again; a connection that a network partition black-holed stays silent (no error,
//! no answer) until a heartbeat notices, minutes later. `Reconnecting` wraps any sink made by a
//! connect function of yours:
//!
//! - it connects lazily, on the first batch, and again on the first batch after a failure;
//! - a batch that takes longer than the timeout is abandoned: every message is
//!   [`Outcome::Failed`] (it may or may not have reached the broker; publishing it again with
//!   the same id is what the relay does);
//! - after a timed-out batch, or a batch with a [`Outcome::Failed`] message, the sink is dropped,
//!   and the next batch connects anew; a failed connect is a batch of `Failed` (the relay's
//!   per-key backoff spaces the attempts);
//! - a batch whose publish is dropped before it ends (the caller's own deadline, such as the
//!   relay's `publish_timeout`, fired first) counts as timed out: its connection is replaced too.
//!
//! ```ignore
//! use taskq_outbox::{Reconnecting, redis::RedisSink};
//! let sink = Reconnecting::new(move || RedisSink::connect("redis://127.0.0.1:6379"))
//!     .with_timeout(std::time::Duration::from_secs(5));
//! ```

use std::fmt::Display;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::{Message, Outcome, Sink};

/// Default bound of one connect and of one batch's publish.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// A sink that connects with a function of yours and connects again after a failure or a
/// batch with no answer in time (see the [module](self)).
pub struct Reconnecting<S, F> {
    connect: F,
    timeout: Duration,
    /// The current sink (none before the first batch and after a failure) and its generation.
    slot: tokio::sync::Mutex<(u64, Option<Arc<S>>)>,
    connects: AtomicU64,
    /// The generation of a connection whose batch was dropped mid-publish (0: none): the next
    /// batch replaces it rather than wait on it again.
    abandoned: Arc<AtomicU64>,
}

/// Marks a connection abandoned when the publish holding it is dropped before it ends.
struct Abandon {
    abandoned: Arc<AtomicU64>,
    generation: u64,
    armed: bool,
}

impl Drop for Abandon {
    fn drop(&mut self) {
        if self.armed {
            self.abandoned.store(self.generation, Ordering::Relaxed);
        }
    }
}

impl<S, F, Fut, E> Reconnecting<S, F>
where
    S: Sink,
    F: Fn() -> Fut + Send + Sync,
    Fut: Future<Output = Result<S, E>> + Send,
    E: Display,
{
    /// A sink that calls `connect` for its first batch and after each failure, with the
    /// [`DEFAULT_TIMEOUT`].
    pub fn new(connect: F) -> Self {
        Self {
            connect,
            timeout: DEFAULT_TIMEOUT,
            slot: tokio::sync::Mutex::new((0, None)),
            connects: AtomicU64::new(0),
            abandoned: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Bounds one connect, and one batch's publish, to `timeout`: a batch that takes longer is
    /// all [`Outcome::Failed`] and its connection is replaced. Set it well above the time a
    /// batch takes when the broker is healthy.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// How many connections were made so far (successful connects).
    pub fn connects(&self) -> u64 {
        self.connects.load(Ordering::Relaxed)
    }

    /// The current sink, connecting first if there is none; or why not.
    async fn current(&self) -> Result<(u64, Arc<S>), String> {
        let mut slot = self.slot.lock().await;
        if slot.1.is_some() && slot.0 == self.abandoned.load(Ordering::Relaxed) {
            slot.1 = None;
        }
        if let Some(sink) = &slot.1 {
            return Ok((slot.0, Arc::clone(sink)));
        }
        match tokio::time::timeout(self.timeout, (self.connect)()).await {
            Ok(Ok(sink)) => {
                let sink = Arc::new(sink);
                slot.0 += 1;
                slot.1 = Some(Arc::clone(&sink));
                self.connects.fetch_add(1, Ordering::Relaxed);
                Ok((slot.0, sink))
            }
            Ok(Err(e)) => Err(format!("connecting: {e}")),
            Err(_) => Err(format!("connecting: no answer within {:?}", self.timeout)),
        }
    }
}

impl<S, F, Fut, E> Sink for Reconnecting<S, F>
where
    S: Sink,
    F: Fn() -> Fut + Send + Sync,
    Fut: Future<Output = Result<S, E>> + Send,
    E: Display,
{
    async fn publish(&self, batch: &[Message]) -> Vec<Outcome> {
        if batch.is_empty() {
            return Vec::new();
        }
        let (generation, sink) = match self.current().await {
            Ok(current) => current,
            Err(why) => return vec![Outcome::Failed(why); batch.len()],
        };
        let mut guard = Abandon {
            abandoned: Arc::clone(&self.abandoned),
            generation,
            armed: true,
        };
        let published = tokio::time::timeout(self.timeout, sink.publish(batch)).await;
        guard.armed = false;
        let (out, broken) = match published {
            Ok(out) => {
                let broken = out.iter().any(|o| matches!(o, Outcome::Failed(_)));
                (out, broken)
            }
            Err(_) => {
                let why = format!("no answer within {:?}", self.timeout);
                (vec![Outcome::Failed(why); batch.len()], true)
            }
        };
        if broken {
            let mut slot = self.slot.lock().await;
            // Another batch may have replaced it already.
            if slot.0 == generation {
                slot.1 = None;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Bytes, PerMessageSink};
    use std::sync::atomic::AtomicUsize;

    fn msg(id: &str) -> Message {
        Message::new(id, "s", "k", Bytes::from_static(b"x"))
    }

    #[tokio::test]
    async fn a_failed_batch_makes_the_next_one_connect_again() {
        let made = Arc::new(AtomicUsize::new(0));
        let m = Arc::clone(&made);
        let sink = Reconnecting::new(move || {
            let n = m.fetch_add(1, Ordering::SeqCst);
            async move {
                // The first connection fails every message; the second delivers.
                Ok::<_, String>(PerMessageSink::new(move |_m: Message| async move {
                    if n == 0 {
                        Outcome::Failed("broken pipe".into())
                    } else {
                        Outcome::Delivered
                    }
                }))
            }
        });
        assert!(matches!(
            sink.publish(&[msg("a")]).await[0],
            Outcome::Failed(_)
        ));
        assert_eq!(sink.publish(&[msg("a")]).await, [Outcome::Delivered]);
        assert_eq!(sink.publish(&[msg("b")]).await, [Outcome::Delivered]);
        assert_eq!(made.load(Ordering::SeqCst), 2);
        assert_eq!(sink.connects(), 2);
    }

    #[tokio::test]
    async fn a_batch_with_no_answer_in_time_is_failed_and_its_connection_replaced() {
        let made = Arc::new(AtomicUsize::new(0));
        let m = Arc::clone(&made);
        let sink = Reconnecting::new(move || {
            let n = m.fetch_add(1, Ordering::SeqCst);
            async move {
                Ok::<_, String>(PerMessageSink::new(move |_m: Message| async move {
                    if n == 0 {
                        std::future::pending::<()>().await;
                    }
                    Outcome::Delivered
                }))
            }
        })
        .with_timeout(Duration::from_millis(50));
        let out = sink.publish(&[msg("a"), msg("b")]).await;
        assert!(
            out.iter().all(|o| matches!(o, Outcome::Failed(_))),
            "{out:?}"
        );
        assert_eq!(sink.publish(&[msg("a")]).await, [Outcome::Delivered]);
        assert_eq!(made.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_batch_dropped_by_its_caller_mid_publish_replaces_its_connection() {
        // The caller's deadline (the relay's publish_timeout) is shorter than the sink's own.
        let made = Arc::new(AtomicUsize::new(0));
        let m = Arc::clone(&made);
        let sink = Reconnecting::new(move || {
            let n = m.fetch_add(1, Ordering::SeqCst);
            async move {
                Ok::<_, String>(PerMessageSink::new(move |_m: Message| async move {
                    if n == 0 {
                        std::future::pending::<()>().await;
                    }
                    Outcome::Delivered
                }))
            }
        })
        .with_timeout(Duration::from_secs(3600));
        let dropped =
            tokio::time::timeout(Duration::from_millis(50), sink.publish(&[msg("a")])).await;
        assert!(dropped.is_err());
        assert_eq!(sink.publish(&[msg("a")]).await, [Outcome::Delivered]);
        assert_eq!(made.load(Ordering::SeqCst), 2);
        assert_eq!(sink.connects(), 2);
    }

    #[tokio::test]
    async fn a_failed_connect_fails_the_batch_and_is_tried_again() {
        let made = Arc::new(AtomicUsize::new(0));
        let m = Arc::clone(&made);
        let sink = Reconnecting::new(move || {
            let n = m.fetch_add(1, Ordering::SeqCst);
            async move {
                if n == 0 {
                    return Err("connection refused".to_owned());
                }
                Ok(PerMessageSink::new(|_m: Message| async {
                    Outcome::Delivered
                }))
            }
        });
        let out = sink.publish(&[msg("a")]).await;
        assert!(
            matches!(&out[0], Outcome::Failed(why) if why.contains("refused")),
            "{out:?}"
        );
        assert_eq!(sink.publish(&[msg("a")]).await, [Outcome::Delivered]);
        assert_eq!(sink.connects(), 1);
    }
}
