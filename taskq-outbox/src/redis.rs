//! Redis Streams (feature `redis`, through the `redis` crate).
//!
//! Each message is one `XADD <subject> * id <message id> key <key> payload <bytes> h:Taskq-Key
//! <key>` plus one field `h:<name>` per header, the stream being the message's subject and the
//! entry id Redis's own (`*`). The key is in two fields: `key` (as before) and
//! `h:`[`Taskq-Key`](crate::KEY_HEADER), the header every broker sink sends; a header of the
//! message with that name is left out, so there is one such field. The batch goes as pipelines of up to [`RedisSink::with_window`] commands
//! on one multiplexed connection; Redis runs a connection's commands in order, so one key's
//! entries are appended in batch order. **Delivered** = the `XADD` reply (an entry id) came
//! back: the entry is in the memory of the server that answered, and only as durable as its
//! persistence (AOF with `appendfsync always`/`everysec`, or RDB snapshots) and replication
//! (asynchronous: a failover can lose acknowledged entries). A Redis with neither (`--save ""
//! --appendonly no`, as on the machine the tests ran on) keeps nothing on disk: a restart
//! loses every delivered message.
//!
//! Redis has no duplicate window: a message published twice is two entries with the same `id`
//! field, and consumers drop the second (an inbox). Only a command error about the entry
//! itself (`WRONGTYPE`: the subject's key is not a stream) is [`Outcome::Rejected`]; every
//! other error, a connection error or one about the server, its configuration or the
//! credentials (`OOM`, `LOADING`, `READONLY`, `MISCONF`, `NOAUTH`, `WRONGPASS`, `NOPERM`, `ERR`,
//! a code this sink does not know...), is [`Outcome::Failed`]: tried again, never
//! dead-lettered.

/// The client crate, at the version this sink is built with.
pub use ::redis as client;

use redis::aio::MultiplexedConnection;

use crate::{Message, Outcome, Sink, Stopped};

/// Default number of `XADD`s per pipeline.
pub const DEFAULT_WINDOW: usize = 512;

/// A Redis Streams sink.
#[derive(Clone)]
pub struct RedisSink {
    conn: MultiplexedConnection,
    window: usize,
}

impl RedisSink {
    /// Connects to the Redis server at `url` (`redis://127.0.0.1:6379`).
    pub async fn connect(url: &str) -> redis::RedisResult<Self> {
        let client = redis::Client::open(url)?;
        Ok(Self::new(client.get_multiplexed_async_connection().await?))
    }

    /// A sink on your connection.
    pub fn new(conn: MultiplexedConnection) -> Self {
        Self {
            conn,
            window: DEFAULT_WINDOW,
        }
    }

    /// At most `window` (≥ 1) `XADD`s per pipeline: a batch goes as pipelines of that many,
    /// one after the other.
    pub fn with_window(mut self, window: usize) -> Self {
        self.window = window.max(1);
        self
    }
}

/// Whether a command error is about the entry itself, so that sending it again would fail
/// the same way: only `WRONGTYPE` (the subject names a key that is not a stream). Every
/// other error may go away once the server, its configuration or the connection is fixed:
/// a connection error, the server's state (`OOM`, `LOADING`, `BUSY`, `READONLY`, `MISCONF`:
/// snapshots failing), the credentials or the ACL (`NOAUTH`, `WRONGPASS`, `NOPERM`), a
/// generic `ERR`, and any code this sink does not know.
fn about_the_entry(e: &redis::RedisError) -> bool {
    matches!(e.code(), Some("WRONGTYPE"))
}

/// `Rejected` for an error about the entry, else `Failed` (tried again after a backoff), so
/// an outage or a misconfiguration never dead-letters or holds the events sent meanwhile.
fn outcome_of(e: &redis::RedisError) -> Outcome {
    if about_the_entry(e) {
        Outcome::Rejected(e.to_string())
    } else {
        Outcome::Failed(e.to_string())
    }
}

/// The `XADD` of one message.
fn xadd(m: &Message) -> redis::Cmd {
    let mut c = redis::cmd("XADD");
    c.arg(&m.subject)
        .arg("*")
        .arg("id")
        .arg(&m.id)
        .arg("key")
        .arg(&m.key)
        .arg("payload")
        .arg(&m.payload[..]);
    for (name, value) in m.headers_to_publish() {
        c.arg(format!("h:{name}")).arg(value);
    }
    c
}

impl Sink for RedisSink {
    async fn publish(&self, batch: &[Message]) -> Vec<Outcome> {
        let mut out: Vec<Option<Outcome>> = vec![None; batch.len()];
        let mut stopped = Stopped::default();
        let mut conn = self.conn.clone();
        let mut start = 0;
        while start < batch.len() {
            let end = (start + self.window).min(batch.len());
            let mut pipe = redis::pipe();
            pipe.ignore_errors();
            let mut sent = Vec::new();
            for (i, m) in batch.iter().enumerate().take(end).skip(start) {
                if stopped.has(m) {
                    out[i] = Some(Outcome::Held);
                } else {
                    pipe.add_command(xadd(m));
                    sent.push(i);
                }
            }
            start = end;
            if sent.is_empty() {
                continue;
            }
            let replies: redis::RedisResult<Vec<redis::RedisResult<String>>> =
                pipe.query_async(&mut conn).await;
            match replies {
                Ok(replies) if replies.len() == sent.len() => {
                    for (i, r) in sent.into_iter().zip(replies) {
                        let o = match r {
                            Ok(_entry_id) => Outcome::Delivered,
                            Err(e) => outcome_of(&e),
                        };
                        stopped.record(&batch[i], &o);
                        out[i] = Some(o);
                    }
                }
                Ok(replies) => {
                    let why = format!("{} replies to {} XADDs", replies.len(), sent.len());
                    for i in sent {
                        let o = Outcome::Failed(why.clone());
                        stopped.record(&batch[i], &o);
                        out[i] = Some(o);
                    }
                }
                // The pipeline as a whole failed (connection): any prefix of it may have run.
                Err(e) => {
                    for i in sent {
                        let o = Outcome::Failed(e.to_string());
                        stopped.record(&batch[i], &o);
                        out[i] = Some(o);
                    }
                }
            }
        }
        out.into_iter()
            .map(|o| o.expect("every message has an outcome"))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server_error(code: &str) -> redis::RedisError {
        redis::make_extension_error(code.to_owned(), Some("the server's words".to_owned()))
    }

    /// Issue 34 S3: only an error about the entry itself is `Rejected`; an error about the
    /// server, the connection or the credentials is `Failed` (tried again), whatever its code.
    #[test]
    fn only_an_error_about_the_entry_is_rejected() {
        assert!(matches!(
            outcome_of(&server_error("WRONGTYPE")),
            Outcome::Rejected(_)
        ));
        for code in [
            "MISCONF",
            "NOAUTH",
            "WRONGPASS",
            "NOPERM",
            "ERR",
            "OOM",
            "LOADING",
            "READONLY",
            "EXECABORT",
            "NOREPLICAS",
            "SOMETHINGNEW",
        ] {
            assert!(
                matches!(outcome_of(&server_error(code)), Outcome::Failed(_)),
                "{code}"
            );
        }
    }
}
