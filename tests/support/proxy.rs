//! A small TCP proxy that can cut connections, for "the network drops but the server lives"
//! fault tests.
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
//! [`stats`](ChaosProxy::stats) counts accepted, refused and cut connections. Dropping the proxy
//! stops listening and closes every connection.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::{AbortHandle, JoinHandle};

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
    /// Connections open right now.
    pub live: u64,
}

/// Sent to a forwarding task to cut its connection; it replies once both sockets are closed.
type CutOrder = oneshot::Sender<()>;

/// One live forwarded connection.
struct Conn {
    /// Tells the forwarding task to reset both sockets.
    cut: oneshot::Sender<CutOrder>,
    /// Last resort on drop of the proxy.
    abort: AbortHandle,
}

struct Inner {
    upstream: SocketAddr,
    refuse: AtomicBool,
    conns: Mutex<HashMap<u64, Conn>>,
    next_id: AtomicU64,
    accepted: AtomicU64,
    refused: AtomicU64,
    upstream_failed: AtomicU64,
    cut: AtomicU64,
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
}

/// A TCP proxy in front of one upstream address that can cut and refuse connections.
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
            conns: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            accepted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            upstream_failed: AtomicU64::new(0),
            cut: AtomicU64::new(0),
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

    /// Abruptly closes (TCP RST to both peers) every live connection and returns how many were
    /// cut, once all their sockets are closed: the next read or write on a cut client connection
    /// fails.
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
            live: self.inner.conns.lock().unwrap().len() as u64,
        }
    }

    /// Number of connections open right now.
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
        // Register under the lock before the task can finish and deregister itself.
        let mut conns = inner.conns.lock().unwrap();
        let task = tokio::spawn(forward(id, client, cut_rx, Arc::clone(&inner)));
        conns.insert(
            id,
            Conn {
                cut: cut_tx,
                abort: task.abort_handle(),
            },
        );
    }
}

/// Forwards one connection until either side closes or it is cut.
async fn forward(
    id: u64,
    mut client: TcpStream,
    mut cut: oneshot::Receiver<CutOrder>,
    inner: Arc<Inner>,
) {
    let _ = client.set_nodelay(true);
    let connect = tokio::select! {
        biased;
        order = &mut cut => Err(order.ok()),
        r = TcpStream::connect(inner.upstream) => Ok(r),
    };
    let mut upstream = match connect {
        Ok(Ok(upstream)) => upstream,
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
    };
    let _ = upstream.set_nodelay(true);
    // `biased`: once a cut is ordered, no more bytes are forwarded.
    tokio::select! {
        biased;
        order = &mut cut => {
            let _ = client.set_zero_linger();
            let _ = upstream.set_zero_linger();
            drop(client);
            drop(upstream);
            if let Ok(ack) = order {
                let _ = ack.send(());
            }
        }
        _ = tokio::io::copy_bidirectional(&mut client, &mut upstream) => {
            inner.conns.lock().unwrap().remove(&id);
        }
    }
}
