//! The inbox: a consumer of broker messages records each message id in its own transaction,
//! and handles the message only the first time (see [`Inbox`]).

use std::time::Duration;

use sqlx::{Pool, Transaction};

use crate::backend::Backend;
use crate::defaults::validate_name;
use crate::error::{Error, Result};
use crate::task::enqueue::conn_of;

/// The longest consumer name (`taskq_inbox.consumer`), in bytes.
pub const MAX_CONSUMER_LEN: usize = 128;
/// The longest message id (`taskq_inbox.message_id`), in bytes.
pub const MAX_MESSAGE_ID_LEN: usize = 255;
/// Records deleted per statement by [`Inbox::purge_older_than`].
const PURGE_BATCH: u32 = 1_000;

/// Whether a consumer had recorded a message id before ([`Inbox::record_tx`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// The first record of this id: handle the message (in the same transaction).
    First,
    /// A committed record of this id exists: a redelivery; skip the message (and commit or
    /// roll back: either way nothing changes).
    Again,
}

/// A consumer's inbox: the message ids it has handled, in the table `taskq_inbox` of the
/// database its handlers write to (MySQL / MariaDB, or SQLite).
///
/// Brokers deliver at least once: a message can arrive twice (a redelivery after a lost ack,
/// a relay that published again after a crash). Record the id in the transaction that writes
/// the message's effects, and write them only the first time: the record and the effects
/// commit together or not at all, so each message id takes effect once per consumer.
///
/// ```no_run
/// # async fn f(pool: sqlx::MySqlPool, message_id: &str) -> Result<(), Box<dyn std::error::Error>> {
/// use taskq::inbox::{Inbox, Seen};
///
/// let inbox = Inbox::new("billing");
/// let mut tx = pool.begin().await?;
/// if inbox.record_tx(&mut tx, message_id).await? == Seen::First {
///     // sqlx::query!("INSERT INTO invoices ...").execute(&mut *tx).await?;
/// }
/// tx.commit().await?; // then ack the message to the broker
/// # Ok(()) }
/// ```
///
/// Two deliveries of one id at once: on MySQL / MariaDB the second `record_tx` waits until the
/// first's transaction ends (a row lock), then answers [`Seen::Again`] if it committed and
/// [`Seen::First`] if it rolled back (so the message is handled once either way); it waits at
/// most `innodb_lock_wait_timeout` (50 s by default), then fails with the server's lock wait
/// timeout (error 1205). When the first rolls back while two or more wait, expect InnoDB to
/// pick one of them as a deadlock victim (error 1213) and roll its transaction back: it did in
/// 298 of 300 measured cases. Both errors are conflicts: [`Error::is_conflict`] and
/// [`Error::is_retryable`] return `true` for them. On either, roll the transaction back and
/// nack the message (or leave it unacked) so the broker redelivers it: the message is never
/// handled twice. On SQLite the transactions take turns on the file's write lock (begin them
/// with `taskq::sqlite::begin`), with the same answers.
///
/// Records are kept until [`purge_older_than`](Self::purge_older_than) deletes them: keep them
/// longer than a message can be redelivered (the broker's redelivery horizon, a relay's
/// replay), or a late copy is handled again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inbox {
    consumer: String,
}

impl Inbox {
    /// The inbox of `consumer`: a name for the consuming service (or one of its handlers),
    /// 1 to 128 bytes, no control characters, no surrounding whitespace. Several consumers
    /// share the table; each sees only its own records. An invalid name is reported by the
    /// first call.
    pub fn new(consumer: impl Into<String>) -> Self {
        Self {
            consumer: consumer.into(),
        }
    }

    /// The consumer's name.
    pub fn consumer(&self) -> &str {
        &self.consumer
    }

    /// Records `message_id` (1 to 255 bytes, compared byte for byte) in the caller's
    /// transaction and says whether this consumer had recorded it before: [`Seen::First`] or
    /// [`Seen::Again`]. See [`Inbox`] for concurrent records of one id.
    ///
    /// It takes a transaction, not a connection: a record autocommitted on its own, before the
    /// message's effects, would lose the message if the process stopped in between (its
    /// redelivery would answer [`Seen::Again`]).
    pub async fn record_tx<DB: Backend>(
        &self,
        tx: &mut Transaction<'_, DB>,
        message_id: &str,
    ) -> Result<Seen> {
        validate_name("inbox consumer", &self.consumer, MAX_CONSUMER_LEN)?;
        validate_message_id(message_id)?;
        let first = conn_of(tx)
            .inbox_record(&self.consumer, message_id)
            .await
            .map_err(Error::Database)?;
        Ok(if first { Seen::First } else { Seen::Again })
    }

    /// Deletes this consumer's records first seen more than `age` ago (database clock), in
    /// statements of at most 1,000 rows each (autocommitted one by one); how many.
    pub async fn purge_older_than<DB: Backend>(
        &self,
        pool: &Pool<DB>,
        age: Duration,
    ) -> Result<u64> {
        validate_name("inbox consumer", &self.consumer, MAX_CONSUMER_LEN)?;
        let age_us = i64::try_from(age.as_micros()).unwrap_or(i64::MAX);
        let mut conn = pool.acquire().await?;
        let mut total = 0;
        loop {
            let n = conn_of(&mut conn)
                .inbox_prune(&self.consumer, age_us, PURGE_BATCH)
                .await
                .map_err(Error::Database)?;
            total += n;
            if n < u64::from(PURGE_BATCH) {
                return Ok(total);
            }
        }
    }
}

/// A message id is 1 to 255 bytes; anything else is accepted as the broker gave it.
fn validate_message_id(id: &str) -> Result<()> {
    let reason = if id.is_empty() {
        "must not be empty".to_owned()
    } else if id.len() > MAX_MESSAGE_ID_LEN {
        format!(
            "is {} bytes long, the limit is {MAX_MESSAGE_ID_LEN}",
            id.len()
        )
    } else {
        return Ok(());
    };
    Err(Error::InvalidName {
        what: "message id",
        value: id.chars().take(80).collect(),
        reason,
    })
}
