//! The relay: leases keys with pending events, publishes their events to a sink in per-key
//! seq order, and settles each key under its lease epoch.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::Pool;
use taskq_driver::event::{EventClaim, EventLease, EventRange, EventRow, EventSettle, KeyNext};
use taskq_driver::pool::WorkerPool;
use taskq_driver::rows::NameList;
use taskq_outbox::{Message, Outcome, Sink};

use crate::backend::{Backend, Store};
use crate::defaults::validate_name;
use crate::error::{Error, Result};
use crate::retry::{Backoff, problem};

/// What a relay does with an event the sink rejected ([`Outcome::Rejected`]: the broker will
/// never take it as it is).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnRejected {
    /// Strict (the default): the event's key is held with the error; its later events wait
    /// until an operator replays, retries or skips it. Other keys go on.
    #[default]
    Hold,
    /// The event is marked dead (with the error) and its key goes on with the next event.
    DeadLetter,
}

/// The default events per round.
const DEFAULT_BATCH: u32 = 512;
/// The default key lease.
const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// The default poll interval.
const DEFAULT_POLL: Duration = Duration::from_millis(200);
/// After a wake-up, the relay polls this often for a while (the publishing transaction
/// commits after its nudge).
const NUDGE_POLL: Duration = Duration::from_millis(5);
/// How long after a wake-up the relay polls at [`NUDGE_POLL`].
const NUDGE_WINDOW: Duration = Duration::from_millis(100);

/// Builds a [`Relay`] (see [`Relay::builder`]).
#[must_use]
pub struct RelayBuilder<S> {
    store: Store,
    sink: S,
    topics: Option<Vec<String>>,
    batch_size: u32,
    lease: Duration,
    on_rejected: OnRejected,
    retry_backoff: Backoff,
    poll: Duration,
    owner: Option<String>,
}

impl<S: Sink + 'static> RelayBuilder<S> {
    /// Only events of these topics (default: every topic).
    pub fn topics<I, T>(mut self, topics: I) -> Self
    where
        I: IntoIterator<Item = T>,
        T: Into<String>,
    {
        self.topics = Some(topics.into_iter().map(Into::into).collect());
        self
    }

    /// Most events per round, over many keys (default 512; 1..=10,000). Each round leases up
    /// to this many keys and reads up to `batch_size / keys` events of each.
    pub fn batch_size(mut self, n: u32) -> Self {
        self.batch_size = n;
        self
    }

    /// The key lease (default 30 s; at least 1 s), on the database clock, renewed every
    /// third of it while a batch is out. A relay that stops (crash, lost connection) holds its
    /// keys until their leases end; then another takes them.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// What a rejected event does: [`OnRejected::Hold`] (default) or
    /// [`OnRejected::DeadLetter`].
    pub fn on_rejected(mut self, on: OnRejected) -> Self {
        self.on_rejected = on;
        self
    }

    /// The backoff of a key after [`Outcome::Failed`] (or [`Outcome::Held`]): its `n`-th
    /// failure in a row waits `backoff.delay(n)` before any relay tries the key again
    /// (default: 1 s doubling up to 1 min, 25% jitter).
    pub fn retry_backoff(mut self, backoff: Backoff) -> Self {
        self.retry_backoff = backoff;
        self
    }

    /// How often an idle relay looks for events (default 200 ms; 1 ms..=1 h). Events
    /// published in this process wake it at once.
    pub fn poll_interval(mut self, poll: Duration) -> Self {
        self.poll = poll;
        self
    }

    /// The relay's name in `taskq_event_keys.lease_owner` (default `relay-<host>-<pid>-<random>`;
    /// 1..=128 bytes).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.owner = Some(name.into());
        self
    }

    /// Checks the settings.
    pub fn build(self) -> Result<Relay<S>> {
        if !(1..=10_000).contains(&self.batch_size) {
            return Err(Error::Config(format!(
                "relay batch_size {} is outside 1..=10000",
                self.batch_size
            )));
        }
        if self.lease < Duration::from_secs(1) {
            return Err(Error::Config(format!(
                "relay lease {:?} is shorter than 1 s",
                self.lease
            )));
        }
        if !(Duration::from_millis(1)..=Duration::from_secs(3600)).contains(&self.poll) {
            return Err(Error::Config(format!(
                "relay poll interval {:?} is outside 1 ms..=1 h",
                self.poll
            )));
        }
        if let Some(p) = problem(&self.retry_backoff) {
            return Err(Error::Config(format!("relay retry_backoff: {p}")));
        }
        if let Some(topics) = &self.topics {
            if topics.is_empty() {
                return Err(Error::Config("relay topics: an empty list".into()));
            }
            for t in topics {
                validate_name("event topic", t, super::MAX_TOPIC_LEN)?;
            }
        }
        let owner = match self.owner {
            Some(o) => o,
            None => format!(
                "relay-{}-{}-{:08x}",
                host_name(),
                std::process::id(),
                fastrand::u32(..)
            ),
        };
        let owner: String = owner.chars().take(128).collect();
        validate_name("relay name", &owner, 128)?;
        let statement_timeout = (self.lease / 2).max(Duration::from_secs(1));
        let secs = statement_timeout.as_secs() + u64::from(statement_timeout.subsec_nanos() > 0);
        let session_timeout = Duration::from_secs((secs + 1).max(5));
        let store = self.store.worker_store(WorkerPool {
            connections: 3,
            statement_timeout,
            session_timeout,
            idle_limit: session_timeout - Duration::from_secs(1),
        });
        Ok(Relay {
            inner: Arc::new(Inner {
                store,
                sink: self.sink,
                topics: self.topics.map(NameList::new),
                batch_size: self.batch_size,
                lease: self.lease,
                on_rejected: self.on_rejected,
                retry_backoff: self.retry_backoff,
                poll: self.poll,
                owner,
            }),
        })
    }
}

fn host_name() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
        })
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "host".into())
}

/// Delivers events to a sink in per-key commit order: each round leases keys that have
/// pending events (skipping keys another relay holds), reads their events from the lowest
/// undelivered seq, publishes them as one batch, and settles each key under its lease epoch:
/// delivered events are marked delivered; at the first event of a key that was not, the key
/// stops ([`Outcome::Failed`] / [`Outcome::Held`]: backoff, then any relay tries again with the
/// same message id; [`Outcome::Rejected`]: held or dead-lettered, see [`OnRejected`]). Several
/// relays, in one process or many, are safe: a relay that lost a key's lease (it stalled past
/// the lease) cannot settle it, and can only cause duplicates of ids already delivered.
///
/// Cheap to clone; every clone is the same relay (same name and pool).
pub struct Relay<S> {
    inner: Arc<Inner<S>>,
}

impl<S> Clone for Relay<S> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<S> std::fmt::Debug for Relay<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("name", &self.inner.owner)
            .field("batch_size", &self.inner.batch_size)
            .field("lease", &self.inner.lease)
            .field("on_rejected", &self.inner.on_rejected)
            .finish_non_exhaustive()
    }
}

struct Inner<S> {
    store: Store,
    sink: S,
    topics: Option<NameList>,
    batch_size: u32,
    lease: Duration,
    on_rejected: OnRejected,
    retry_backoff: Backoff,
    poll: Duration,
    owner: String,
}

/// What one round did ([`Relay::run_once`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Round {
    /// Keys leased.
    pub keys: usize,
    /// Events handed to the sink.
    pub published: usize,
    /// Events marked delivered.
    pub delivered: usize,
    /// Keys whose lease was lost before the settle (their outcomes were not written).
    pub lost: usize,
}

impl<S: Sink + 'static> Relay<S> {
    /// A relay of `pool`'s events (MySQL / MariaDB or SQLite, like `Worker::builder`) to
    /// `sink`. It opens its own small pool (3 connections) with the same connect options.
    pub fn builder<DB: Backend>(pool: Pool<DB>, sink: S) -> RelayBuilder<S> {
        RelayBuilder {
            store: Store::of(pool),
            sink,
            topics: None,
            batch_size: DEFAULT_BATCH,
            lease: DEFAULT_LEASE,
            on_rejected: OnRejected::Hold,
            retry_backoff: Backoff::exponential(Duration::from_secs(1), Duration::from_secs(60)),
            poll: DEFAULT_POLL,
            owner: None,
        }
    }

    /// The relay's name (its `lease_owner`).
    pub fn name(&self) -> &str {
        &self.inner.owner
    }

    /// Runs forever (see [`run_until`](Self::run_until)).
    pub async fn run(&self) -> Result<()> {
        self.run_until(std::future::pending()).await
    }

    /// Runs rounds until `shutdown` completes (checked between rounds: a round in progress
    /// ends first), then returns. A database error is logged and retried after the poll
    /// interval; the relay does not stop on one.
    pub async fn run_until<F>(&self, shutdown: F) -> Result<()>
    where
        F: Future<Output = ()> + Send,
    {
        let mut shutdown = std::pin::pin!(shutdown);
        let notify = super::notifier();
        let mut fast_until: Option<Instant> = None;
        let mut errors = 0u32;
        tracing::info!(relay = %self.inner.owner, "relay started");
        loop {
            let notified = notify.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            let wait = match self.run_once().await {
                Ok(r) if r.keys > 0 => {
                    errors = 0;
                    // More may be ready at once; look again before waiting.
                    if poll_now(&mut shutdown).await {
                        break;
                    }
                    continue;
                }
                Ok(_) => {
                    errors = 0;
                    match fast_until {
                        Some(t) if Instant::now() < t => NUDGE_POLL,
                        _ => self.inner.poll,
                    }
                }
                Err(e) => {
                    errors += 1;
                    tracing::warn!(relay = %self.inner.owner, error = %e, errors, "relay round failed");
                    self.inner
                        .poll
                        .max(Duration::from_millis(100 * u64::from(errors.min(50))))
                }
            };
            tokio::select! {
                _ = &mut shutdown => break,
                _ = &mut notified => {
                    fast_until = Some(Instant::now() + NUDGE_WINDOW);
                }
                _ = tokio::time::sleep(wait) => {}
            }
        }
        tracing::info!(relay = %self.inner.owner, "relay stopped");
        Ok(())
    }

    /// One round: lease ready keys, publish their events, settle them. What it did.
    pub async fn run_once(&self) -> Result<Round> {
        let i = &*self.inner;
        let lease_us = i64::try_from(i.lease.as_micros()).unwrap_or(i64::MAX);
        let leases = i
            .store
            .event_key_claim(&EventClaim {
                owner: &i.owner,
                topics: i.topics.as_ref(),
                limit: i.batch_size,
                lease_us,
            })
            .await
            .map_err(Error::Database)?;
        if leases.is_empty() {
            return Ok(Round::default());
        }
        let per_key = (i.batch_size as usize / leases.len()).max(1) as u64;
        let ranges: Vec<EventRange> = leases
            .iter()
            .map(|l| EventRange {
                key_hash: l.key_hash,
                after_seq: l.done_seq,
                up_to: l.next_seq.min(l.done_seq.saturating_add(per_key)),
            })
            .collect();
        let rows = match i.store.event_read(&ranges).await {
            Ok(rows) => rows,
            Err(e) => {
                // Give the keys back at once rather than at the end of their leases.
                let back: Vec<EventSettle> = leases
                    .iter()
                    .map(|l| EventSettle {
                        key_hash: l.key_hash,
                        epoch: l.epoch,
                        done_seq: l.done_seq,
                        delivered: Vec::new(),
                        dead: Vec::new(),
                        next: KeyNext::Release,
                    })
                    .collect();
                if let Err(e2) = i.store.event_key_settle(&back).await {
                    tracing::debug!(relay = %i.owner, error = %e2, "relay could not give its keys back");
                }
                return Err(Error::Database(e));
            }
        };
        let batch: Vec<Message> = rows.iter().map(message).collect();
        tracing::debug!(relay = %i.owner, keys = leases.len(), events = batch.len(), "relay round");
        let outcomes = if batch.is_empty() {
            Vec::new()
        } else {
            self.publish_renewing(&leases, &batch, lease_us).await
        };
        let settles = self.settles(&leases, &ranges, &rows, &outcomes);
        let delivered: usize = settles.iter().map(|s| s.delivered.len()).sum();
        let held = i
            .store
            .event_key_settle(&settles)
            .await
            .map_err(Error::Database)?;
        let lost = held.iter().filter(|h| !**h).count();
        if lost > 0 {
            tracing::warn!(relay = %i.owner, keys = lost, "relay lost key leases before settling: their events go out again (same ids)");
        }
        Ok(Round {
            keys: leases.len(),
            published: batch.len(),
            delivered,
            lost,
        })
    }

    /// Publishes `batch`, renewing the leases every third of the lease until the sink answers.
    async fn publish_renewing(
        &self,
        leases: &[EventLease],
        batch: &[Message],
        lease_us: i64,
    ) -> Vec<Outcome> {
        let i = &*self.inner;
        let publish = i.sink.publish(batch);
        let mut publish = std::pin::pin!(publish);
        let every = i.lease / 3;
        let held: Vec<([u8; 32], u64)> = leases.iter().map(|l| (l.key_hash, l.epoch)).collect();
        let mut outcomes = loop {
            tokio::select! {
                out = &mut publish => break out,
                _ = tokio::time::sleep(every) => {
                    match i.store.event_key_renew(&held, lease_us).await {
                        Ok(renewed) if renewed.len() < held.len() => tracing::warn!(
                            relay = %i.owner, lost = held.len() - renewed.len(),
                            "relay lost key leases while publishing"),
                        Ok(_) => tracing::trace!(relay = %i.owner, keys = held.len(), "relay renewed leases"),
                        Err(e) => tracing::warn!(relay = %i.owner, error = %e, "relay lease renewal failed"),
                    }
                }
            }
        };
        outcomes.resize_with(batch.len(), || {
            Outcome::Failed("the sink returned fewer outcomes than messages".into())
        });
        outcomes
    }

    /// What each leased key becomes, from its events' outcomes (in seq order).
    fn settles(
        &self,
        leases: &[EventLease],
        ranges: &[EventRange],
        rows: &[EventRow],
        outcomes: &[Outcome],
    ) -> Vec<EventSettle> {
        let i = &*self.inner;
        leases
            .iter()
            .zip(ranges)
            .map(|(l, r)| {
                let mut s = EventSettle {
                    key_hash: l.key_hash,
                    epoch: l.epoch,
                    done_seq: r.up_to,
                    delivered: Vec::new(),
                    dead: Vec::new(),
                    next: KeyNext::Release,
                };
                let mut stopped_at: Option<u64> = None;
                let mut dead_lettered = false;
                for (row, out) in rows.iter().zip(outcomes).filter(|(e, _)| e.key_hash == l.key_hash) {
                    if let Some(stop) = stopped_at {
                        if out.is_delivered() {
                            tracing::warn!(relay = %i.owner, topic = %l.topic, key = %l.key,
                                seq = row.seq, stopped_at = stop,
                                "the sink delivered an event after an earlier one of its key was not: the broker may hold this key out of order");
                        }
                        continue;
                    }
                    match out {
                        Outcome::Delivered => s.delivered.push(row.id),
                        Outcome::Rejected(err) => match i.on_rejected {
                            OnRejected::DeadLetter => {
                                tracing::warn!(relay = %i.owner, topic = %l.topic, key = %l.key,
                                    seq = row.seq, message_id = %row.message_id, error = %err,
                                    "event rejected by the sink: dead-lettered, its key goes on");
                                s.dead.push((row.id, err.clone()));
                                dead_lettered = true;
                            }
                            OnRejected::Hold => {
                                tracing::error!(relay = %i.owner, topic = %l.topic, key = %l.key,
                                    seq = row.seq, message_id = %row.message_id, error = %err,
                                    "event rejected by the sink: its key is held until an operator replays or skips it");
                                stopped_at = Some(row.seq);
                                s.next = KeyNext::Hold { seq: row.seq, error: err.clone() };
                            }
                        },
                        Outcome::Failed(err) => {
                            let attempt = l.failures.saturating_add(1);
                            let delay = i.retry_backoff.delay_random(attempt);
                            tracing::warn!(relay = %i.owner, topic = %l.topic, key = %l.key,
                                seq = row.seq, error = %err, attempt, ?delay,
                                "event not delivered: its key backs off");
                            stopped_at = Some(row.seq);
                            s.next = KeyNext::Backoff {
                                delay_us: i64::try_from(delay.as_micros()).unwrap_or(i64::MAX),
                                error: err.clone(),
                            };
                        }
                        // Held only behind a dead-lettered event of its key: no failure, the
                        // key goes on at once from here.
                        Outcome::Held if dead_lettered => stopped_at = Some(row.seq),
                        Outcome::Held => {
                            let attempt = l.failures.saturating_add(1);
                            let delay = i.retry_backoff.delay_random(attempt);
                            stopped_at = Some(row.seq);
                            s.next = KeyNext::Backoff {
                                delay_us: i64::try_from(delay.as_micros()).unwrap_or(i64::MAX),
                                error: "held by the sink: an earlier message of its key was not delivered".into(),
                            };
                        }
                    }
                }
                if let Some(stop) = stopped_at {
                    s.done_seq = stop - 1;
                }
                s
            })
            .collect()
    }
}

/// Waits for nothing; whether `shutdown` is already done.
async fn poll_now<F: Future<Output = ()>>(shutdown: &mut std::pin::Pin<&mut F>) -> bool {
    tokio::select! {
        biased;
        _ = shutdown.as_mut() => true,
        _ = std::future::ready(()) => false,
    }
}

fn message(e: &EventRow) -> Message {
    Message {
        id: e.message_id.clone(),
        subject: e.topic.clone(),
        key: e.key.clone(),
        payload: e.payload.clone().into(),
        headers: e.headers.clone(),
    }
}
