//! A small TCP proxy that can cut connections or black-hole them, for "the network drops but
//! the server lives" fault tests.
//!
//! [`ChaosProxy::start`] listens on `127.0.0.1:<random>` and forwards every accepted connection
//! to the upstream address in both directions. The test points its pool at
//! [`ChaosProxy::addr`] and then:
//! - [`cut_all`](ChaosProxy::cut_all) resets every live connection (both sockets are closed with
//!   `SO_LINGER=0`, so each peer sees a TCP RST, as after a network failure);
//! - [`set_refuse`](ChaosProxy::set_refuse) makes new connections fail (accepted and reset at
//!   once) until turned off;
//! - [`start_chaos`](ChaosProxy::start_chaos) cuts random live connections at random intervals
//!   in the background until [`stop_chaos`](ChaosProxy::stop_chaos).
//!
//! It can also model a silent network partition by *black-holing* connections: a black-holed
//! connection stays open, the proxy keeps accepting (and discarding) whatever the client sends,
//! and nothing is forwarded or answered in either direction, so the client's reads simply wait
//! (no error, no EOF) until its own timeout, if it has one:
//! - [`set_black_hole`](ChaosProxy::set_black_hole) black-holes every new connection while on
//!   (such connections are never connected upstream);
//! - [`black_hole_all`](ChaosProxy::black_hole_all) black-holes every live connection at once;
//! - [`black_hole_matching`](ChaosProxy::black_hole_matching) black-holes any connection, live
//!   or future, as soon as its client sends given bytes (e.g. the text of one SQL statement),
//!   while the others keep working;
//! - [`lose_reply_after`](ChaosProxy::lose_reply_after) lets one request through and then
//!   black-holes its connection, so the server runs it but its answer is lost (a claim that
//!   commits while the network fails);
//! - [`heal`](ChaosProxy::heal) ends both modes for what comes next. Connections already
//!   black-holed stay silent (a connection that lived through a partition is dead) until their
//!   client closes them; the proxy then closes its sides and forgets them.
//!
//! A black-holed connection can still be cut. [`stats`](ChaosProxy::stats) counts accepted,
//! refused, cut and black-holed connections. Dropping the proxy stops listening and closes
//! every connection.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch};
use tokio::task::{AbortHandle, JoinHandle};

/// Size of the forwarding buffers (one per direction and connection).
const BUF_SIZE: usize = 16 * 1024;

/// A fragment of SQL only taskq's heartbeat statement contains (`Store::task_heartbeat`), for
/// [`ChaosProxy::black_hole_matching`]: stalls a worker's lease renewals and nothing else.
pub const HEARTBEAT_SQL: &[u8] = b"INTERVAL ? MICROSECOND, t.updated_at";

/// A fragment of SQL only the `UPDATE` of taskq's claim contains (`Store::claim_raw`: the rows
/// it starts), for [`ChaosProxy::lose_reply_after`] with `COMMIT`: a claim that commits and
/// whose answer is lost.
pub const CLAIM_SQL: &[u8] = b"SET t.state = 'running', t.attempt = t.attempt + 1";

/// Counters of a [`ChaosProxy`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProxyStats {
    /// Connections accepted for forwarding (refused ones not included).
    pub accepted: u64,
    /// Connections reset at once because [`ChaosProxy::set_refuse`] was on.
    pub refused: u64,
    /// Accepted connections reset because connecting upstream failed (e.g. server down).
    pub upstream_failed: u64,
    /// Live connections cut by [`ChaosProxy::cut_all`], [`ChaosProxy::cut_random`] or chaos mode.
    pub cut: u64,
    /// Connections black-holed so far, by any of [`ChaosProxy::set_black_hole`],
    /// [`ChaosProxy::black_hole_all`] and [`ChaosProxy::black_hole_matching`] (each connection
    /// counted once).
    pub black_holed: u64,
    /// Connections open right now.
    pub live: u64,
}

/// Sent to a forwarding task to cut its connection; it replies once both sockets are closed.
type CutOrder = oneshot::Sender<()>;

/// One live forwarded connection, as the proxy's registry sees it.
struct Conn {
    /// Tells the forwarding task to reset both sockets.
    cut: oneshot::Sender<CutOrder>,
    /// Whether the connection is black-holed; shared with its forwarding task.
    hole: Arc<Hole>,
    /// Last resort on drop of the proxy.
    abort: AbortHandle,
}

/// The black-hole flag of one connection. Once set it is never cleared.
struct Hole(watch::Sender<bool>);

impl Hole {
    fn new() -> Self {
        Self(watch::Sender::new(false))
    }

    fn is_on(&self) -> bool {
        *self.0.borrow()
    }

    /// Sets the flag; returns whether it was off before (so each connection is counted once).
    fn set(&self) -> bool {
        self.0.send_if_modified(|on| !std::mem::replace(on, true))
    }

    /// Resolves once the flag is set.
    async fn wait(&self) {
        let mut rx = self.0.subscribe();
        // An error would mean the sender is gone, which cannot happen while `self` lives.
        let _ = rx.wait_for(|on| *on).await;
    }
}

struct Inner {
    upstream: SocketAddr,
    refuse: AtomicBool,
    /// [`ChaosProxy::set_black_hole`]: black-hole new connections.
    black_hole_new: AtomicBool,
    /// [`ChaosProxy::black_hole_matching`]: black-hole connections whose client sends these bytes.
    needle: Mutex<Option<Vec<u8>>>,
    /// [`ChaosProxy::lose_reply_after`]: `(arm, trigger)`, taken by the connection it fires on.
    lose_reply: Mutex<Option<(Vec<u8>, Vec<u8>)>>,
    conns: Mutex<HashMap<u64, Conn>>,
    next_id: AtomicU64,
    accepted: AtomicU64,
    refused: AtomicU64,
    upstream_failed: AtomicU64,
    cut: AtomicU64,
    black_holed: AtomicU64,
}

impl Inner {
    /// Cuts the connections whose id `pick` selects and waits until their sockets are closed;
    /// returns how many were cut.
    async fn cut_where(&self, mut pick: impl FnMut(u64) -> bool) -> usize {
        let victims: Vec<Conn> = {
            let mut conns = self.conns.lock().unwrap();
            let ids: Vec<u64> = conns.keys().copied().filter(|id| pick(*id)).collect();
            ids.iter().filter_map(|id| conns.remove(id)).collect()
        };
        let mut acks = Vec::with_capacity(victims.len());
        for conn in victims {
            let (ack_tx, ack_rx) = oneshot::channel();
            if conn.cut.send(ack_tx).is_ok() {
                acks.push(ack_rx);
            }
        }
        let n = acks.len();
        self.cut.fetch_add(n as u64, Ordering::Relaxed);
        for ack in acks {
            // An error only means the task ended (and dropped its sockets) on its own.
            let _ = ack.await;
        }
        n
    }

    /// Black-holes one connection; returns whether it was not black-holed before.
    fn black_hole(&self, hole: &Hole) -> bool {
        let newly = hole.set();
        if newly {
            self.black_holed.fetch_add(1, Ordering::Relaxed);
        }
        newly
    }

    /// [`ChaosProxy::lose_reply_after`] on one client read: whether this chunk is the request
    /// whose answer is to be lost (the mode is then used up). `armed` is the connection's own.
    fn lose_reply_fires(&self, armed: &mut bool, chunk: &[u8]) -> bool {
        let mut mode = self.lose_reply.lock().unwrap();
        let Some((arm, trigger)) = mode.as_ref() else {
            return false;
        };
        let contains = |n: &[u8]| !n.is_empty() && chunk.windows(n.len()).any(|w| w == n);
        if *armed && contains(trigger) {
            *mode = None;
            return true;
        }
        if contains(arm) {
            *armed = true;
        }
        false
    }

    /// Whether the current needle occurs in `chunk`, or across the boundary between the
    /// previous chunk (whose last bytes `tail` keeps) and `chunk`. Updates `tail`.
    fn needle_in(&self, tail: &mut Vec<u8>, chunk: &[u8]) -> bool {
        let needle = self.needle.lock().unwrap();
        let Some(needle) = needle.as_deref().filter(|n| !n.is_empty()) else {
            tail.clear();
            return false;
        };
        tail.extend_from_slice(chunk);
        let found = tail.windows(needle.len()).any(|w| w == needle);
        let keep = needle.len() - 1;
        let drop = tail.len().saturating_sub(keep);
        tail.drain(..drop);
        found
    }
}

/// A TCP proxy in front of one upstream address that can cut, refuse and black-hole
/// connections.
pub struct ChaosProxy {
    addr: SocketAddr,
    inner: Arc<Inner>,
    accept_task: JoinHandle<()>,
    chaos_task: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for ChaosProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChaosProxy")
            .field("addr", &self.addr)
            .field("upstream", &self.inner.upstream)
            .field("stats", &self.stats())
            .finish()
    }
}

impl ChaosProxy {
    /// Starts a proxy on `127.0.0.1:<random port>` forwarding to `upstream`.
    ///
    /// Panics if it cannot bind a local port. Must be called inside a tokio runtime.
    pub async fn start(upstream: SocketAddr) -> ChaosProxy {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .expect("bind the chaos proxy on 127.0.0.1");
        let addr = listener.local_addr().expect("proxy local address");
        let inner = Arc::new(Inner {
            upstream,
            refuse: AtomicBool::new(false),
            black_hole_new: AtomicBool::new(false),
            needle: Mutex::new(None),
            lose_reply: Mutex::new(None),
            conns: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            accepted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            upstream_failed: AtomicU64::new(0),
            cut: AtomicU64::new(0),
            black_holed: AtomicU64::new(0),
        });
        let accept_task = tokio::spawn(accept_loop(listener, Arc::clone(&inner)));
        ChaosProxy {
            addr,
            inner,
            accept_task,
            chaos_task: Mutex::new(None),
        }
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The upstream address connections are forwarded to.
    pub fn upstream(&self) -> SocketAddr {
        self.inner.upstream
    }

    /// `mysql://root@<proxy addr>` (no password, no database), for a MySQL upstream.
    pub fn mysql_url(&self) -> String {
        format!("mysql://root@{}", self.addr)
    }

    /// Abruptly closes (TCP RST to both peers) every live connection, black-holed ones
    /// included, and returns how many were cut, once all their sockets are closed: the next
    /// read or write on a cut client connection fails.
    pub async fn cut_all(&self) -> usize {
        self.inner.cut_where(|_| true).await
    }

    /// Cuts each live connection with probability `probability`, like
    /// [`cut_all`](Self::cut_all); returns how many were cut.
    pub async fn cut_random(&self, probability: f64) -> usize {
        self.inner
            .cut_where(|_| fastrand::f64() < probability)
            .await
    }

    /// While `true`, new connections are accepted and immediately reset, so connecting fails.
    /// Live connections are not affected.
    pub fn set_refuse(&self, refuse: bool) {
        self.inner.refuse.store(refuse, Ordering::SeqCst);
    }

    /// While `true`, new connections are black-holed: accepted and held open, but the proxy
    /// does not even connect upstream, so the client never gets an answer (a MySQL client waits
    /// for the server greeting forever). Live connections are not affected; turning it off (or
    /// [`heal`](Self::heal)) does not revive the connections black-holed meanwhile.
    pub fn set_black_hole(&self, on: bool) {
        self.inner.black_hole_new.store(on, Ordering::SeqCst);
    }

    /// Black-holes every live connection, in both directions at once: from the return of this
    /// call, no byte read from either peer is forwarded (a write already under way may still
    /// complete). Both sockets stay open. Returns how many connections were newly
    /// black-holed.
    pub fn black_hole_all(&self) -> usize {
        let conns = self.inner.conns.lock().unwrap();
        conns
            .values()
            .filter(|c| self.inner.black_hole(&c.hole))
            .count()
    }

    /// From now on, until [`heal`](Self::heal) or a new needle, black-holes any connection,
    /// live or future, whose client sends `needle`: the chunk containing it is not forwarded,
    /// nor is anything after it, in either direction. The needle is also found across two
    /// reads (the last `needle.len() - 1` bytes of each read are kept). An empty needle
    /// matches nothing.
    ///
    /// Meant to stall one kind of SQL statement: its text goes over the wire in
    /// `COM_STMT_PREPARE` (and `COM_QUERY`) packets, so a connection is black-holed when it
    /// prepares the statement (the prepare never gets an answer, so no statement id exists
    /// that a later `COM_STMT_EXECUTE` could carry). A connection that prepared the statement
    /// *before* the needle was set executes it by id, without its text, and is not matched:
    /// set the needle before the client first runs the statement (e.g. before starting the
    /// worker), or cut the live connections after setting it so the client reconnects and
    /// prepares again. Only works on plaintext (non-TLS) connections.
    pub fn black_hole_matching(&self, needle: impl Into<Vec<u8>>) {
        *self.inner.needle.lock().unwrap() = Some(needle.into());
    }

    /// Once: on the first connection whose client sends `arm` and, in a later read, `trigger`,
    /// the chunk holding `trigger` is forwarded upstream and the connection is black-holed at
    /// once, so the server gets the request and runs it but its answer never reaches the
    /// client (which sees silence, as with [`black_hole_matching`](Self::black_hole_matching)).
    /// E.g. `arm` = the text of a statement inside a transaction (sent when it is prepared),
    /// `trigger` = `COMMIT`: the transaction commits and the client never learns it. Like the
    /// needle, the statement must be prepared on a connection after this is set. Plaintext
    /// connections only; [`heal`](Self::heal) cancels it if it has not fired.
    pub fn lose_reply_after(&self, arm: impl Into<Vec<u8>>, trigger: impl Into<Vec<u8>>) {
        *self.inner.lose_reply.lock().unwrap() = Some((arm.into(), trigger.into()));
    }

    /// Ends [`set_black_hole`](Self::set_black_hole) and clears the
    /// [`black_hole_matching`](Self::black_hole_matching) needle, so new connections (and the
    /// live ones not black-holed) work normally. Connections already black-holed stay silent
    /// until their client closes them; the proxy then closes its sides and forgets them.
    pub fn heal(&self) {
        self.inner.black_hole_new.store(false, Ordering::SeqCst);
        *self.inner.needle.lock().unwrap() = None;
        *self.inner.lose_reply.lock().unwrap() = None;
    }

    /// Starts cutting connections in the background: after each pause drawn uniformly from
    /// `interval`, every live connection is cut with probability `probability`. Replaces any
    /// running chaos mode.
    pub fn start_chaos(&self, interval: Range<Duration>, probability: f64) {
        let inner = Arc::clone(&self.inner);
        let lo = interval.start.as_micros();
        let hi = interval.end.as_micros().max(lo + 1);
        let task = tokio::spawn(async move {
            loop {
                let micros = u64::try_from(fastrand::u128(lo..hi)).unwrap_or(u64::MAX);
                tokio::time::sleep(Duration::from_micros(micros)).await;
                inner.cut_where(|_| fastrand::f64() < probability).await;
            }
        });
        if let Some(old) = self.chaos_task.lock().unwrap().replace(task) {
            old.abort();
        }
    }

    /// Stops the background chaos mode, if running.
    pub fn stop_chaos(&self) {
        if let Some(task) = self.chaos_task.lock().unwrap().take() {
            task.abort();
        }
    }

    /// Counters so far.
    pub fn stats(&self) -> ProxyStats {
        ProxyStats {
            accepted: self.inner.accepted.load(Ordering::Relaxed),
            refused: self.inner.refused.load(Ordering::Relaxed),
            upstream_failed: self.inner.upstream_failed.load(Ordering::Relaxed),
            cut: self.inner.cut.load(Ordering::Relaxed),
            black_holed: self.inner.black_holed.load(Ordering::Relaxed),
            live: self.inner.conns.lock().unwrap().len() as u64,
        }
    }

    /// Number of connections open right now (black-holed ones included).
    pub fn live(&self) -> usize {
        self.inner.conns.lock().unwrap().len()
    }
}

impl Drop for ChaosProxy {
    fn drop(&mut self) {
        self.accept_task.abort();
        self.stop_chaos();
        let conns: Vec<Conn> = self
            .inner
            .conns
            .lock()
            .unwrap()
            .drain()
            .map(|(_, c)| c)
            .collect();
        for conn in conns {
            // Aborting drops the task's sockets (a plain close, not a reset).
            conn.abort.abort();
        }
    }
}

async fn accept_loop(listener: TcpListener, inner: Arc<Inner>) {
    loop {
        let client = match listener.accept().await {
            Ok((client, _)) => client,
            Err(_) => {
                // E.g. EMFILE: back off instead of spinning.
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        if inner.refuse.load(Ordering::SeqCst) {
            inner.refused.fetch_add(1, Ordering::Relaxed);
            let _ = client.set_zero_linger();
            drop(client);
            continue;
        }
        inner.accepted.fetch_add(1, Ordering::Relaxed);
        let id = inner.next_id.fetch_add(1, Ordering::Relaxed);
        let (cut_tx, cut_rx) = oneshot::channel();
        let hole = Arc::new(Hole::new());
        if inner.black_hole_new.load(Ordering::SeqCst) {
            inner.black_hole(&hole);
        }
        // Register under the lock before the task can finish and deregister itself.
        let mut conns = inner.conns.lock().unwrap();
        let task = tokio::spawn(forward(
            id,
            client,
            cut_rx,
            Arc::clone(&hole),
            Arc::clone(&inner),
        ));
        conns.insert(
            id,
            Conn {
                cut: cut_tx,
                hole,
                abort: task.abort_handle(),
            },
        );
    }
}

/// Forwards one connection until either side closes or it is cut. A connection black-holed
/// from the start is never connected upstream.
async fn forward(
    id: u64,
    mut client: TcpStream,
    mut cut: oneshot::Receiver<CutOrder>,
    hole: Arc<Hole>,
    inner: Arc<Inner>,
) {
    let _ = client.set_nodelay(true);
    let mut upstream = None;
    if !hole.is_on() {
        let connect = tokio::select! {
            biased;
            order = &mut cut => Err(order.ok()),
            r = TcpStream::connect(inner.upstream) => Ok(r),
        };
        match connect {
            Ok(Ok(stream)) => {
                let _ = stream.set_nodelay(true);
                upstream = Some(stream);
            }
            Ok(Err(_)) => {
                // Upstream down (e.g. the server was killed): behave like it, reset the client.
                inner.upstream_failed.fetch_add(1, Ordering::Relaxed);
                inner.conns.lock().unwrap().remove(&id);
                let _ = client.set_zero_linger();
                return;
            }
            Err(order) => {
                let _ = client.set_zero_linger();
                drop(client);
                if let Some(ack) = order {
                    let _ = ack.send(());
                }
                return;
            }
        }
    }
    // `biased`: once a cut is ordered, no more bytes are forwarded.
    let order = tokio::select! {
        biased;
        order = &mut cut => Some(order),
        () = pump(&mut client, upstream.as_mut(), &hole, &inner) => None,
    };
    match order {
        Some(order) => {
            let _ = client.set_zero_linger();
            if let Some(upstream) = &upstream {
                let _ = upstream.set_zero_linger();
            }
            drop(client);
            drop(upstream);
            if let Ok(ack) = order {
                let _ = ack.send(());
            }
        }
        None => {
            // Plain close of both sockets (on return), after deregistering.
            inner.conns.lock().unwrap().remove(&id);
        }
    }
}

/// Moves bytes both ways until the connection should be closed: the client closed it (or
/// failed), or, while not black-holed, the upstream did.
async fn pump(
    client: &mut TcpStream,
    upstream: Option<&mut TcpStream>,
    hole: &Hole,
    inner: &Inner,
) {
    let (client_r, client_w) = client.split();
    let (upstream_r, upstream_w) = match upstream {
        Some(up) => {
            let (r, w) = up.split();
            (Some(r), Some(w))
        }
        None => (None, None),
    };
    tokio::select! {
        () = client_to_upstream(client_r, upstream_w, hole, inner) => {}
        () = upstream_to_client(upstream_r, client_w, hole) => {}
    }
}

/// Client → upstream. Looks for the needle in what the client sends; once the connection is
/// black-holed, reads and discards everything (so the client's close is still noticed).
/// Returns when the client closes or fails, or when writing upstream fails while not
/// black-holed.
async fn client_to_upstream(
    mut from: ReadHalf<'_>,
    mut to: Option<WriteHalf<'_>>,
    hole: &Hole,
    inner: &Inner,
) {
    let mut buf = vec![0u8; BUF_SIZE];
    let mut tail = Vec::new();
    // `lose_reply_after`: this connection sent the arm bytes.
    let mut armed = false;
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let chunk = &buf[..n];
        if !hole.is_on() && inner.lose_reply_fires(&mut armed, chunk) {
            // Black-holed first, so the answer is never read; the request still goes up.
            inner.black_hole(hole);
            if let Some(up) = to.as_mut() {
                let _ = up.write_all(chunk).await;
            }
            continue;
        }
        if !hole.is_on() && inner.needle_in(&mut tail, chunk) {
            inner.black_hole(hole);
        }
        if hole.is_on() {
            continue;
        }
        // Not black-holed implies connected upstream: only connections black-holed from the
        // start have no upstream.
        let Some(up) = to.as_mut() else { continue };
        if up.write_all(chunk).await.is_err() && !hole.is_on() {
            return;
        }
    }
}

/// Upstream → client, until the connection is black-holed; from then on nothing more is read
/// from the upstream (its bytes stay in the socket buffers) and this never returns, so the
/// client socket stays open. Returns when the upstream closes or fails, or when writing to the
/// client fails, while not black-holed.
async fn upstream_to_client(from: Option<ReadHalf<'_>>, mut to: WriteHalf<'_>, hole: &Hole) {
    if let Some(mut from) = from {
        let mut buf = vec![0u8; BUF_SIZE];
        loop {
            let read = tokio::select! {
                biased;
                () = hole.wait() => break,
                r = from.read(&mut buf) => r,
            };
            if hole.is_on() {
                break;
            }
            let n = match read {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if to.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    }
    std::future::pending().await
}
