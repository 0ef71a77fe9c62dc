//! The relay: leases keys with pending events, publishes their events to a sink in per-key
//! seq order, and settles each key under its lease epoch; rounds overlap (publish one while
//! the one before is settled and the next read).

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::Pool;
use taskq_driver::event::{
    EventClaim, EventLease, EventRange, EventRow, EventSettle, KeyNext, share_budget,
};
use taskq_driver::pool::WorkerPool;
use taskq_driver::rows::NameList;
use taskq_outbox::{Message, Outcome, Sink};

use crate::backend::{Backend, Store};
use crate::defaults::validate_name;
use crate::error::{Error, Result};
use crate::retry::{Backoff, problem};

use super::stats::{Counted, Counters, RelayStats};

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
    publish_timeout: Option<Duration>,
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

    /// Most events per round, i.e. handed to the sink in one `publish` (default 512;
    /// 1..=10,000). A round leases ready keys, oldest ready first, until their backlogs (a
    /// key's undelivered events) add up to this many, and at most this many keys; it shares
    /// the batch among them by backlog: a key with a short backlog gets all of it, the rest
    /// goes evenly to the keys with longer ones. So one key with a long backlog fills a round
    /// alone, and many keys of a few events each share one.
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

    /// How long the relay waits for the sink's answer to one batch (default: two thirds of
    /// the lease; 1 ms..=24 h). A sink that has not answered by then (a half-open connection,
    /// a broker stuck under flow control, a function that never returns) is given up on: its
    /// publish is dropped, every message of the batch counts as [`Outcome::Failed`] (it may or
    /// may not have reached the broker), the keys back off and their leases end (the relay
    /// stops renewing them), so any relay can take them after the backoff.
    pub fn publish_timeout(mut self, timeout: Duration) -> Self {
        self.publish_timeout = Some(timeout);
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
        let publish_timeout = self.publish_timeout.unwrap_or(self.lease - self.lease / 3);
        if !(Duration::from_millis(1)..=Duration::from_secs(24 * 3600)).contains(&publish_timeout) {
            return Err(Error::Config(format!(
                "relay publish_timeout {publish_timeout:?} is outside 1 ms..=24 h"
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
        let pool_spec = WorkerPool {
            connections: 3,
            statement_timeout,
            session_timeout,
            idle_limit: session_timeout - Duration::from_secs(1),
        };
        let store = self.store.worker_store(pool_spec);
        Ok(Relay {
            inner: Arc::new(Inner {
                store: Mutex::new(store),
                base: self.store,
                pool_spec,
                sink: self.sink,
                topics: self.topics.map(NameList::new),
                batch_size: self.batch_size,
                lease: self.lease,
                on_rejected: self.on_rejected,
                retry_backoff: self.retry_backoff,
                poll: self.poll,
                publish_timeout,
                owner,
                leased: Mutex::new(HashMap::new()),
                narrow: Mutex::new(HashSet::new()),
                narrow_all: AtomicBool::new(false),
                lost: Mutex::new(HashSet::new()),
                dead_carried: Mutex::new(HashMap::new()),
                renewal_running: AtomicBool::new(false),
                claim_found_none: AtomicBool::new(false),
                counters: Counters::default(),
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
/// pending events (skipping keys another relay holds) until their backlogs fill
/// [`batch_size`](RelayBuilder::batch_size), reads their events from the lowest undelivered
/// seq (the batch shared among the keys by backlog), publishes them as one batch, and settles
/// the keys, each under its lease epoch (on MySQL in one transaction of four statements for
/// the whole round, five when it dead-lettered events; keys a publisher holds at that moment
/// one at a time after it). A running relay overlaps rounds: it publishes one while it
/// settles the one before and reads the next, which reads on the keys of the one published
/// when they have more events (under the same leases; a key whose events were not all
/// delivered is taken out of it before it goes out).
/// On each key: its `done_seq` moves past its delivered events (the key's row records
/// delivery; no event row is written); at the first event of a key that was not, the key
/// stops ([`Outcome::Failed`] / [`Outcome::Held`]: backoff, then any relay tries again with the
/// same message id; [`Outcome::Rejected`]: held or dead-lettered, see [`OnRejected`]). Several
/// relays, in one process or many, are safe: a relay that lost a key's lease (it stalled past
/// the lease) cannot settle it, and can only cause duplicates of ids already delivered. A
/// sink that reports an event delivered after an earlier one of its key was not (the broker
/// may hold the key out of order) makes the relay read that key one event per round from then
/// on. A read or settle that fails on a database error gives the round's keys back at once.
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
    /// The relay's own pool; replaced by a fresh one when a call on it got no answer in time
    /// (its connection may be black-holed: see [`Inner::within`]).
    store: Mutex<Store>,
    /// The user's pool, whose connect options the relay's pool has.
    base: Store,
    pool_spec: WorkerPool,
    sink: S,
    topics: Option<NameList>,
    batch_size: u32,
    lease: Duration,
    on_rejected: OnRejected,
    retry_backoff: Backoff,
    poll: Duration,
    /// How long a sink's publish may take (see [`RelayBuilder::publish_timeout`]).
    publish_timeout: Duration,
    owner: String,
    /// The keys this relay holds leases on (hash → epoch), renewed together every third of
    /// the lease: the round being published, the one read ahead, none settled.
    leased: Mutex<HashMap<[u8; 32], u64>>,
    /// Keys read one event per round: the sink once reported an event of theirs delivered
    /// after an earlier one of the same key was not (see [`NARROW_LIMIT`]).
    narrow: Mutex<HashSet<[u8; 32]>>,
    /// Every key read one event per round (more than [`NARROW_LIMIT`] keys broke order).
    narrow_all: AtomicBool,
    /// Leases found lost (a settle or a renewal refused under their epochs: another relay or
    /// an operator took the key), `(hash, epoch)`: a round that carried such a key over drops
    /// it before it goes out.
    lost: Mutex<HashSet<([u8; 32], u64)>>,
    /// Dead marks of kept leases whose settle failed, `(hash, epoch)` → events: the next
    /// settle of the same lease (the next round's, or the give-back) writes them, since it
    /// moves `done_seq` past them.
    dead_carried: Mutex<DeadCarried>,
    /// A renewal is running: the next one waits for the one after it rather than piling up
    /// on the pool behind it.
    renewal_running: AtomicBool,
    /// The last claim leased no key: a round that reads on keys it holds asks the next claim
    /// to probe first ([`EventClaim::probe`]).
    claim_found_none: AtomicBool,
    /// What the relay has done ([`Relay::stats`]).
    counters: Counters,
}

/// Dead-lettered events (id, rejection) per lease `(hash, epoch)`.
type DeadCarried = HashMap<([u8; 32], u64), Vec<(u64, String)>>;

impl<S> Inner<S> {
    /// The relay's pool.
    fn store(&self) -> Store {
        lock(&self.store).clone()
    }

    /// Runs `call` (a call on `store`, the relay's pool) with a client-side deadline: a
    /// connection black-holed by a network partition answers nothing and is never closed, and
    /// the server closing the session reaches no one. On no answer in time the call is
    /// dropped and the relay's pool replaced by a fresh one (the old one, with the silent
    /// connection, is dropped: a dropped call's connection would otherwise hold a slot of it
    /// while sqlx pings it), and the call fails like a database error. Every relay call is
    /// safe to lose: leases, renewals and settles are fenced by their epochs.
    async fn within<T>(
        &self,
        store: &Store,
        limit: Duration,
        call: impl Future<Output = sqlx::Result<T>>,
    ) -> Result<T> {
        match tokio::time::timeout(limit, call).await {
            Ok(r) => r.map_err(Error::Database),
            Err(_) => {
                let mut current = lock(&self.store);
                if current.same(store) {
                    *current = self.base.worker_store(self.pool_spec);
                    tracing::warn!(relay = %self.owner, ?limit,
                        "relay database call got no answer in time: its pool is replaced");
                }
                Err(Error::Database(sqlx::Error::Io(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no answer within {limit:?}; the relay's pool was replaced"),
                ))))
            }
        }
    }
}

/// How many keys the relay remembers as read one event per round before it reads every key
/// one event per round.
const NARROW_LIMIT: usize = 10_000;

/// A round leased and read, not yet published.
struct Prepared {
    leases: Vec<EventLease>,
    /// Per lease: carried over from the round published before this one (the same lease,
    /// read on from that round's last seq; see [`Relay::carry_over`]).
    carried: Vec<bool>,
    ranges: Vec<EventRange>,
    rows: Vec<EventRow>,
}

/// A key of the round being published that the next round reads on: its lease (with
/// `done_seq` set to the last seq of the round being published) and that seq.
type Carry = EventLease;

/// What the settles need of an event handed to the sink (its message has the rest).
struct Sent {
    id: u64,
    key_hash: [u8; 32],
    seq: u64,
}

/// A round published, not yet settled (its events' payloads dropped).
struct Published {
    leases: Vec<EventLease>,
    ranges: Vec<EventRange>,
    settles: Vec<EventSettle>,
    published: usize,
    /// Events the sink delivered that the settles count as done (their keys' `done_seq`).
    delivered: usize,
}

/// The rounds in flight of a running relay: at most one published and being settled and one
/// read ahead (two batches of events in memory at most). A key is in both only when the
/// round read ahead carried it over (see [`Relay::carry_over`]): its events there follow
/// the ones being settled, under the same lease.
#[derive(Default)]
struct Pipeline {
    settling: Option<Published>,
    ready: Option<Prepared>,
}

/// What one round did ([`Relay::run_once`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Round {
    /// Keys leased.
    pub keys: usize,
    /// Events handed to the sink.
    pub published: usize,
    /// Events the sink delivered that the settle recorded as delivered (their keys'
    /// `done_seq` moved past them).
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
            publish_timeout: None,
        }
    }

    /// What this relay (and its clones) has done since it was built: rounds, events
    /// published, delivered, failed, held and dead-lettered, leases lost, database errors.
    /// The same counts are metrics (`taskq_relay_*`, see `taskq::metrics`).
    pub fn stats(&self) -> RelayStats {
        self.inner.counters.snapshot()
    }

    /// The relay's name (its `lease_owner`).
    pub fn name(&self) -> &str {
        &self.inner.owner
    }

    /// Runs forever (see [`run_until`](Self::run_until)).
    pub async fn run(&self) -> Result<()> {
        self.run_until(std::future::pending()).await
    }

    /// Runs rounds until `shutdown` completes, then returns. Rounds overlap: while the sink
    /// publishes one round, the relay settles the round before it and leases and reads the
    /// next, so the database and the broker work at the same time; at most two rounds' events
    /// are in memory. The next round reads on the keys of the one being published that have
    /// more events, under the same leases; it is published only after that one, and a key
    /// whose events there were not all delivered is taken out of it first (its lease ends
    /// with the first round's settle, as always).
    /// `shutdown` is checked between steps: the round being published ends and is settled,
    /// and the keys of the round read ahead are given back at once. A database error is
    /// logged and retried after the poll interval (the keys of the rounds in flight are
    /// settled or given back first); the relay does not stop on one.
    pub async fn run_until<F>(&self, shutdown: F) -> Result<()>
    where
        F: Future<Output = ()> + Send,
    {
        let mut shutdown = std::pin::pin!(shutdown);
        let notify = super::notifier();
        let mut fast_until: Option<Instant> = None;
        let mut errors = 0u32;
        let mut st = Pipeline::default();
        let mut next_renew = Instant::now() + self.renew_every();
        tracing::info!(relay = %self.inner.owner, "relay started");
        loop {
            let notified = notify.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            let wait = match self.step(&mut st, &mut next_renew).await {
                Ok(keys) if keys > 0 => {
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
                    self.inner.counters.error();
                    tracing::warn!(relay = %self.inner.owner, error = %e, errors, "relay round failed");
                    self.flush(&mut st).await;
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
        self.flush(&mut st).await;
        tracing::info!(relay = %self.inner.owner, "relay stopped");
        Ok(())
    }

    /// One round, alone: lease ready keys, read, publish their events, settle them. What it
    /// did. (A running relay overlaps rounds; see [`run_until`](Self::run_until).)
    pub async fn run_once(&self) -> Result<Round> {
        let mut next_renew = Instant::now() + self.renew_every();
        let Some(p) = self.renewing(self.prepare(&[]), &mut next_renew).await? else {
            return Ok(Round::default());
        };
        let published = self.renewing(self.publish(p), &mut next_renew).await;
        self.renewing(self.settle(published), &mut next_renew).await
    }

    /// One step of a running relay: publish the round read ahead (or a fresh one) while
    /// settling the round before it and reading the next. How many keys it published.
    async fn step(&self, st: &mut Pipeline, next_renew: &mut Instant) -> Result<usize> {
        let current = match st.ready.take() {
            Some(p) => p,
            None => {
                // Nothing read ahead: settle what is out first (its keys may have more).
                if let Some(s) = st.settling.take() {
                    self.renewing(self.settle(s), next_renew).await?;
                }
                match self.renewing(self.prepare(&[]), next_renew).await? {
                    Some(p) => p,
                    None => return Ok(0),
                }
            }
        };
        let keys = current.leases.len();
        let previous = st.settling.take();
        // The keys of this round with more events than it reads are read on in the next
        // round (published only after this one, and only if this one delivered all of theirs),
        // at most `batch_size - 1` of them: with the key the next round leases afresh, every
        // key of a round gets at least one event of it, so the relay never holds (and renews)
        // a key it reads nothing of. The others are released by this round's settle.
        let carry: Vec<Carry> = current
            .leases
            .iter()
            .zip(&current.ranges)
            .filter(|(l, r)| r.up_to < l.next_seq)
            .take(self.inner.batch_size.saturating_sub(1) as usize)
            .map(|(l, r)| EventLease {
                done_seq: r.up_to,
                ..l.clone()
            })
            .collect();
        // The settle of the round before and the lease and read of the next run at the same
        // time, on connections of their own: neither waits for the other (the lease skips
        // key rows the settle holds, with SKIP LOCKED on MySQL; SQLite takes them in turn).
        let db = async {
            let settled = async {
                match previous {
                    Some(s) => self.settle(s).await.map(|_| ()),
                    None => Ok(()),
                }
            };
            let (settled, next) = tokio::join!(settled, self.prepare(&carry));
            if let Err(e) = settled {
                // The next round is not published: its new keys go back at once (its
                // carried ones end with the round being published, which keeps none).
                if let Ok(Some(n)) = &next {
                    let fresh: Vec<EventLease> = n
                        .leases
                        .iter()
                        .zip(&n.carried)
                        .filter(|(_, c)| !**c)
                        .map(|(l, _)| l.clone())
                        .collect();
                    self.give_back(&fresh).await;
                }
                return Err(e);
            }
            next
        };
        let (mut published, next) = self
            .renewing(
                async { tokio::join!(self.publish(current), db) },
                next_renew,
            )
            .await;
        let next = next.map(|n| n.and_then(|n| self.carry_over(&mut published, n)));
        st.settling = Some(published);
        st.ready = next?;
        Ok(keys)
    }

    /// Decides, once a round is published, which of the keys the next round carried over
    /// from it really go on: a key whose events of this round were all delivered (or
    /// dead-lettered) keeps its lease (its settle becomes [`KeyNext::Keep`]) and the next
    /// round publishes its following events; any other key (failed, held, or its lease
    /// found lost by a settle or renewal meanwhile) is dropped from the next round before
    /// anything of it is sent, and this round's settle ends its lease as usual. So a relay
    /// that lost a key sends at most the one round of it already out. The next round; `None`
    /// when nothing is left of it.
    fn carry_over(&self, published: &mut Published, mut next: Prepared) -> Option<Prepared> {
        let mut keep = vec![true; next.leases.len()];
        for (i, l) in next.leases.iter().enumerate() {
            if !next.carried[i] {
                continue;
            }
            if lock(&self.inner.lost).remove(&(l.key_hash, l.epoch)) {
                keep[i] = false;
                continue;
            }
            let settle = published
                .settles
                .iter_mut()
                .zip(&published.ranges)
                .find(|(s, _)| s.key_hash == l.key_hash && s.epoch == l.epoch);
            match settle {
                Some((s, r)) if s.next == KeyNext::Release && s.done_seq == r.up_to => {
                    s.next = KeyNext::Keep;
                }
                _ => keep[i] = false,
            }
        }
        if keep.iter().all(|k| *k) {
            return Some(next);
        }
        let dropped: HashSet<[u8; 32]> = next
            .leases
            .iter()
            .zip(&keep)
            .filter(|(_, k)| !**k)
            .map(|(l, _)| l.key_hash)
            .collect();
        let mut k = keep.iter();
        next.leases.retain(|_| *k.next().expect("one per lease"));
        let mut k = keep.iter();
        next.carried.retain(|_| *k.next().expect("one per lease"));
        next.ranges.retain(|r| !dropped.contains(&r.key_hash));
        next.rows.retain(|r| !dropped.contains(&r.key_hash));
        (!next.leases.is_empty()).then_some(next)
    }

    /// Settles the round published and gives back the keys of the round read ahead (after an
    /// error, and at shutdown).
    async fn flush(&self, st: &mut Pipeline) {
        if let Some(s) = st.settling.take()
            && let Err(e) = self.settle(s).await
        {
            tracing::warn!(relay = %self.inner.owner, error = %e, "relay could not settle its last round");
        }
        if let Some(p) = st.ready.take() {
            self.give_back(&p.leases).await;
        }
    }

    fn renew_every(&self) -> Duration {
        self.inner.lease / 3
    }

    /// Runs `fut`, renewing every lease this relay holds each third of the lease (on a task
    /// of its own, so `fut` is never held up by a renewal).
    async fn renewing<T>(&self, fut: impl Future<Output = T>, next_renew: &mut Instant) -> T {
        let mut fut = std::pin::pin!(fut);
        loop {
            tokio::select! {
                out = &mut fut => return out,
                _ = tokio::time::sleep_until((*next_renew).into()) => {
                    *next_renew = Instant::now() + self.renew_every();
                    self.spawn_renewal();
                }
            }
        }
    }

    /// Renews every lease this relay holds, on a task of its own, unless the renewal before
    /// is still running (then this one is skipped: renewals never pile up on the pool). A
    /// renewal has a third of the lease to answer.
    fn spawn_renewal(&self) {
        let held: Vec<([u8; 32], u64)> = lock(&self.inner.leased)
            .iter()
            .map(|(h, e)| (*h, *e))
            .collect();
        if held.is_empty() || self.inner.renewal_running.swap(true, Ordering::AcqRel) {
            return;
        }
        let inner = self.inner.clone();
        let lease_us = lease_us(inner.lease);
        tokio::spawn(async move {
            /// Ends the renewal's turn however the task ends.
            struct Done<'a>(&'a AtomicBool);
            impl Drop for Done<'_> {
                fn drop(&mut self) {
                    self.0.store(false, Ordering::Release);
                }
            }
            let _done = Done(&inner.renewal_running);
            let deadline = inner.lease / 3;
            let store = inner.store();
            match inner
                .within(&store, deadline, store.event_key_renew(&held, lease_us))
                .await
            {
                Ok(renewed) => {
                    let renewed: HashSet<[u8; 32]> = renewed.into_iter().collect();
                    // Keys settled meanwhile are no longer leased: not lost.
                    let leased = lock(&inner.leased);
                    let lost: Vec<([u8; 32], u64)> = held
                        .iter()
                        .filter(|(h, e)| !renewed.contains(h) && leased.get(h) == Some(e))
                        .copied()
                        .collect();
                    drop(leased);
                    let lost = note_lost(&inner.lost, lost);
                    if lost > 0 {
                        tracing::warn!(relay = %inner.owner, lost, "relay lost key leases while publishing");
                    } else {
                        tracing::trace!(relay = %inner.owner, keys = held.len(), "relay renewed leases");
                    }
                }
                Err(e) => {
                    tracing::warn!(relay = %inner.owner, error = %e, "relay lease renewal failed")
                }
            }
        });
    }

    /// Leases ready keys and reads their events, and reads on the keys of `carry` (leased
    /// already: see [`carry_over`](Self::carry_over)): `None` when there is nothing to read.
    /// New keys are leased for at least half the batch even when the carried keys could fill
    /// it, so a key with a long backlog cannot keep the others waiting; the carried keys and
    /// the new ones are at most `batch_size` keys, so each gets at least one event. A read that fails
    /// gives the new keys back at once (the carried ones end with the round they came from).
    async fn prepare(&self, carry: &[Carry]) -> Result<Option<Prepared>> {
        let i = &*self.inner;
        let batch = u64::from(i.batch_size);
        let carried: u64 = carry
            .iter()
            .map(|l| l.next_seq.saturating_sub(l.done_seq))
            .sum();
        let claim = EventClaim {
            owner: &i.owner,
            topics: i.topics.as_ref(),
            limit: i
                .batch_size
                .saturating_sub(u32::try_from(carry.len()).unwrap_or(u32::MAX))
                .max(1),
            events: batch.saturating_sub(carried).max(batch / 2),
            lease_us: lease_us(i.lease),
            // Reading on held keys after a claim that found none (a backlog on few keys): most
            // likely none again, and the claim is on the way to the read.
            probe: !carry.is_empty() && i.claim_found_none.load(Ordering::Relaxed),
        };
        let store = i.store();
        let fresh = i
            .within(&store, i.lease, store.event_key_claim(&claim))
            .await?;
        i.claim_found_none
            .store(fresh.is_empty(), Ordering::Relaxed);
        // A carried key leased afresh here was released meanwhile (an operator's replay or
        // release ended the old lease): the old lease is lost, the new one reads it.
        let fresh_keys: HashSet<[u8; 32]> = fresh.iter().map(|l| l.key_hash).collect();
        let (carry, lost): (Vec<&Carry>, Vec<&Carry>) = carry
            .iter()
            .partition(|c| !fresh_keys.contains(&c.key_hash));
        // Counted here: a carried lease is not settled again (a lease of a round being
        // published that a renewal finds lost is counted by that round's settle).
        i.counters.leases_lost(note_lost(
            &i.lost,
            lost.iter().map(|c| (c.key_hash, c.epoch)),
        ));
        if fresh.is_empty() && carry.is_empty() {
            return Ok(None);
        }
        lock(&i.leased).extend(fresh.iter().map(|l| (l.key_hash, l.epoch)));
        let carried_flags: Vec<bool> = carry
            .iter()
            .map(|_| true)
            .chain(fresh.iter().map(|_| false))
            .collect();
        let leases: Vec<EventLease> = carry.iter().map(|c| (*c).clone()).chain(fresh).collect();
        let backlogs: Vec<u64> = leases
            .iter()
            .map(|l| l.next_seq.saturating_sub(l.done_seq))
            .collect();
        let caps: Vec<Option<u64>> = if i.narrow_all.load(Ordering::Relaxed) {
            vec![Some(1); leases.len()]
        } else {
            let narrow = lock(&i.narrow);
            leases
                .iter()
                .map(|l| narrow.contains(&l.key_hash).then_some(1))
                .collect()
        };
        let shares = share_budget(&backlogs, &caps, u64::from(i.batch_size));
        let ranges: Vec<EventRange> = leases
            .iter()
            .zip(shares)
            .map(|(l, n)| EventRange {
                key_hash: l.key_hash,
                after_seq: l.done_seq,
                up_to: l.done_seq.saturating_add(n),
            })
            .collect();
        match i.within(&store, i.lease, store.event_read(&ranges)).await {
            Ok(rows) => Ok(Some(Prepared {
                leases,
                carried: carried_flags,
                ranges,
                rows,
            })),
            Err(e) => {
                self.give_back(&leases[carry.len()..]).await;
                Err(e)
            }
        }
    }

    /// Publishes a round's events; what each key becomes. The rows' strings and payloads
    /// move into the messages (no copy); what the settles need of a row stays in a [`Sent`].
    async fn publish(&self, p: Prepared) -> Published {
        let i = &*self.inner;
        let mut sent = Vec::with_capacity(p.rows.len());
        let batch: Vec<Message> = p
            .rows
            .into_iter()
            .map(|e| {
                sent.push(Sent {
                    id: e.id,
                    key_hash: e.key_hash,
                    seq: e.seq,
                });
                message(e)
            })
            .collect();
        tracing::debug!(relay = %i.owner, keys = p.leases.len(), events = batch.len(), "relay round");
        let mut outcomes = if batch.is_empty() {
            Vec::new()
        } else {
            match tokio::time::timeout(i.publish_timeout, i.sink.publish(&batch)).await {
                Ok(outcomes) => outcomes,
                Err(_) => {
                    let why = format!("the sink did not answer within {:?}", i.publish_timeout);
                    tracing::warn!(relay = %i.owner, keys = p.leases.len(), events = batch.len(),
                        timeout = ?i.publish_timeout,
                        "the sink did not answer in time: the batch counts as failed, its keys back off");
                    vec![Outcome::Failed(why); batch.len()]
                }
            }
        };
        outcomes.resize_with(batch.len(), || {
            Outcome::Failed("the sink returned fewer outcomes than messages".into())
        });
        let (settles, delivered) = self.settles(&p.leases, &p.ranges, &sent, &batch, &outcomes);
        Published {
            leases: p.leases,
            ranges: p.ranges,
            settles,
            published: batch.len(),
            delivered,
        }
    }

    /// Settles a published round under its epochs. A settle that fails on a database error
    /// gives the keys back at once (their events go out again, with their ids). Keys the next
    /// round carried over ([`KeyNext::Keep`]) stay leased either way: the next round's settle
    /// records them (its `done_seq` covers this round's events of theirs, all delivered).
    async fn settle(&self, p: Published) -> Result<Round> {
        let i = &*self.inner;
        let mut settles = p.settles;
        let carried = take_dead(&i.dead_carried, &mut settles);
        let ending: Vec<EventLease> = p
            .leases
            .iter()
            .zip(&settles)
            .filter(|(_, s)| s.next != KeyNext::Keep)
            .map(|(l, _)| l.clone())
            .collect();
        forget(&i.leased, &ending);
        let delivered = p.delivered;
        let store = i.store();
        let held = match i
            .within(&store, i.lease, store.event_key_settle(&settles))
            .await
        {
            Ok(held) => held,
            Err(e) => {
                // A kept lease stays with the next round, whose settle moves `done_seq` past
                // this round's events: it must write this round's dead marks too. A lease
                // given back moves `done_seq` to where this round started: only the marks
                // carried to this round from the one before go with it.
                keep_dead(
                    &i.dead_carried,
                    settles.into_iter().zip(carried).map(|(mut s, n)| {
                        if s.next != KeyNext::Keep {
                            s.dead.truncate(n);
                        }
                        s
                    }),
                );
                self.give_back(&ending).await;
                return Err(e);
            }
        };
        let lost = note_lost(
            &i.lost,
            p.leases
                .iter()
                .zip(&held)
                .filter(|(_, h)| !**h)
                .map(|(l, _)| (l.key_hash, l.epoch)),
        );
        if lost > 0 {
            tracing::warn!(relay = %i.owner, keys = lost, "relay lost key leases before settling: their events go out again (same ids)");
        }
        i.counters.leases_lost(lost);
        i.counters.round(p.published, delivered);
        Ok(Round {
            keys: p.leases.len(),
            published: p.published,
            delivered,
            lost,
        })
    }

    /// Ends the leases of `leases` at once, nothing done (a key with events is ready again).
    async fn give_back(&self, leases: &[EventLease]) {
        let i = &*self.inner;
        forget(&i.leased, leases);
        let mut back: Vec<EventSettle> = leases
            .iter()
            .map(|l| EventSettle {
                key_hash: l.key_hash,
                epoch: l.epoch,
                done_seq: l.done_seq,
                dead: Vec::new(),
                next: KeyNext::Release,
            })
            .collect();
        // A carried lease's `done_seq` is past the round before it, whose dead marks may not
        // be written yet (its settle failed).
        take_dead(&i.dead_carried, &mut back);
        let store = i.store();
        if let Err(e) = i
            .within(&store, i.lease, store.event_key_settle(&back))
            .await
        {
            tracing::warn!(relay = %i.owner, error = %e, keys = back.len(),
                "relay could not give its keys back: they return when their leases end");
        }
    }

    /// From now on, reads `key_hash` one event per round (every key, once more than
    /// [`NARROW_LIMIT`] keys are): with a single event of a key in flight, the broker cannot
    /// store a later one before it.
    fn narrow(&self, key_hash: [u8; 32]) {
        let i = &*self.inner;
        let mut narrow = lock(&i.narrow);
        if narrow.len() >= NARROW_LIMIT {
            if !i.narrow_all.swap(true, Ordering::Relaxed) {
                tracing::warn!(relay = %i.owner, keys = narrow.len(),
                    "the sink broke the order of too many keys: the relay sends every key one event per round from now on");
            }
            return;
        }
        narrow.insert(key_hash);
    }

    /// What each leased key becomes, from its events' outcomes (in seq order), and how many
    /// events the settles record as delivered.
    fn settles(
        &self,
        leases: &[EventLease],
        ranges: &[EventRange],
        sent: &[Sent],
        batch: &[Message],
        outcomes: &[Outcome],
    ) -> (Vec<EventSettle>, usize) {
        let i = &*self.inner;
        let mut delivered = 0;
        // Each lease's events (positions in the batch, in batch order: seq order), in one pass.
        let at: HashMap<[u8; 32], usize> = leases
            .iter()
            .enumerate()
            .map(|(n, l)| (l.key_hash, n))
            .collect();
        let mut of_lease: Vec<Vec<usize>> = vec![Vec::new(); leases.len()];
        for (n, e) in sent.iter().enumerate() {
            if let Some(&l) = at.get(&e.key_hash) {
                of_lease[l].push(n);
            }
        }
        let settles = leases
            .iter()
            .zip(ranges)
            .zip(&of_lease)
            .map(|((l, r), events)| {
                let mut s = EventSettle {
                    key_hash: l.key_hash,
                    epoch: l.epoch,
                    done_seq: r.up_to,
                    dead: Vec::new(),
                    next: KeyNext::Release,
                };
                let mut stopped_at: Option<u64> = None;
                let mut dead_lettered = false;
                let mut order_broken = false;
                for (row, out, msg) in events.iter().map(|&n| (&sent[n], &outcomes[n], &batch[n])) {
                    if let Some(stop) = stopped_at {
                        if out.is_delivered() && !order_broken {
                            order_broken = true;
                            tracing::warn!(relay = %i.owner, topic = %l.topic, key = %l.key,
                                seq = row.seq, stopped_at = stop,
                                "the sink delivered an event after an earlier one of its key was not: the broker may hold this key out of order; the relay sends this key one event per round from now on");
                            self.narrow(l.key_hash);
                        }
                        continue;
                    }
                    match out {
                        Outcome::Delivered => delivered += 1,
                        Outcome::Rejected(err) => match i.on_rejected {
                            OnRejected::DeadLetter => {
                                tracing::warn!(relay = %i.owner, topic = %l.topic, key = %l.key,
                                    seq = row.seq, message_id = %msg.id, error = %err,
                                    "event rejected by the sink: dead-lettered, its key goes on");
                                s.dead.push((row.id, err.clone()));
                                dead_lettered = true;
                                i.counters.event(Counted::Dead);
                            }
                            OnRejected::Hold => {
                                tracing::error!(relay = %i.owner, topic = %l.topic, key = %l.key,
                                    seq = row.seq, message_id = %msg.id, error = %err,
                                    "event rejected by the sink: its key is held until an operator replays or skips it");
                                stopped_at = Some(row.seq);
                                s.next = KeyNext::Hold { seq: row.seq, error: err.clone() };
                                i.counters.event(Counted::Held);
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
                            i.counters.event(Counted::Failed);
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
                            i.counters.event(Counted::Failed);
                        }
                    }
                }
                if let Some(stop) = stopped_at {
                    s.done_seq = stop - 1;
                }
                s
            })
            .collect();
        (settles, delivered)
    }
}

/// Locks a relay's map or set (a poisoned lock is still usable: it holds plain data).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Records leases found lost; how many.
fn note_lost(
    lost: &Mutex<HashSet<([u8; 32], u64)>>,
    leases: impl IntoIterator<Item = ([u8; 32], u64)>,
) -> usize {
    let mut m = lock(lost);
    let before = m.len();
    // Bounded: a relay that lost this many leases without carrying any over forgets them.
    if before > NARROW_LIMIT {
        m.clear();
    }
    let mut n = 0;
    for l in leases {
        m.insert(l);
        n += 1;
    }
    n
}

/// Puts the dead marks carried for their leases first in `settles`' (and forgets them); how
/// many each got.
fn take_dead(carried: &Mutex<DeadCarried>, settles: &mut [EventSettle]) -> Vec<usize> {
    let mut m = lock(carried);
    settles
        .iter_mut()
        .map(|s| match m.remove(&(s.key_hash, s.epoch)) {
            Some(mut dead) => {
                let n = dead.len();
                dead.append(&mut s.dead);
                s.dead = dead;
                n
            }
            None => 0,
        })
        .collect()
}

/// Keeps the dead marks of settles that failed, for the next settle of their leases.
fn keep_dead(carried: &Mutex<DeadCarried>, settles: impl IntoIterator<Item = EventSettle>) {
    // Bounded by the leases held: every kept lease is settled again (by the next round or
    // a give-back), which takes its entry.
    let mut m = lock(carried);
    for s in settles.into_iter().filter(|s| !s.dead.is_empty()) {
        m.entry((s.key_hash, s.epoch)).or_default().extend(s.dead);
    }
}

/// Drops `leases` from the leases a relay renews.
fn forget(leased: &Mutex<HashMap<[u8; 32], u64>>, leases: &[EventLease]) {
    let mut m = lock(leased);
    for l in leases {
        if m.get(&l.key_hash) == Some(&l.epoch) {
            m.remove(&l.key_hash);
        }
    }
}

fn lease_us(lease: Duration) -> i64 {
    i64::try_from(lease.as_micros()).unwrap_or(i64::MAX)
}

/// Waits for nothing; whether `shutdown` is already done.
async fn poll_now<F: Future<Output = ()>>(shutdown: &mut std::pin::Pin<&mut F>) -> bool {
    tokio::select! {
        biased;
        _ = shutdown.as_mut() => true,
        _ = std::future::ready(()) => false,
    }
}

/// The message of an event (its strings and payload moved, not copied).
fn message(e: EventRow) -> Message {
    Message {
        id: e.message_id,
        subject: e.topic,
        key: e.key,
        payload: e.payload.into(),
        headers: e.headers,
    }
}
