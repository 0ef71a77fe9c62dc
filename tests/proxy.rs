//! The test proxy's black-hole modes ([`ChaosProxy::black_hole_all`],
//! [`ChaosProxy::black_hole_matching`], [`ChaosProxy::set_black_hole`], [`ChaosProxy::heal`]),
//! against the shared test server, plus one test against a local TCP peer the test controls
//! (to see exactly which bytes reach the upstream).
//!
//! "Silent" is checked as: a query (or connect) does not complete within [`SILENCE`], while
//! the proxy still counts the connection as live, i.e. the client got neither an answer nor an
//! error nor an EOF.

use std::str::FromStr;
use std::time::Duration;

use sqlx::mysql::MySqlConnectOptions;
use sqlx::{ConnectOptions, MySqlConnection};
use taskq_tests::proxy::ChaosProxy;
use taskq_tests::{TestDb, wait_until};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::timeout;

/// How long a black-holed operation must stay unanswered.
const SILENCE: Duration = Duration::from_secs(1);

/// A proxy in front of the test server, and connect options that go through it (the test
/// server's user and password, the proxy's address); `None` (the test skips) when no MySQL
/// server answers.
async fn proxy_to_server() -> Option<(TestDb, ChaosProxy, MySqlConnectOptions)> {
    // Makes sure the server runs (and gives the tests a database to run in).
    let db = TestDb::empty_or_skip().await?;
    let server = MySqlConnectOptions::from_str(&taskq_tests::server_url())
        .expect("the test server URL parses");
    let upstream = tokio::net::lookup_host((server.get_host(), server.get_port()))
        .await
        .expect("resolve the test server")
        .next()
        .expect("the test server has an address");
    let proxy = ChaosProxy::start(upstream).await;
    let options = db
        .options
        .clone()
        .host(&proxy.addr().ip().to_string())
        .port(proxy.addr().port())
        .disable_statement_logging();
    Some((db, proxy, options))
}

/// `SELECT <n>` on `conn`, bounded by [`SILENCE`]: `None` if no answer came in time.
async fn select(conn: &mut MySqlConnection, n: i32) -> Option<i32> {
    let sql = sqlx::AssertSqlSafe(format!("SELECT {n}"));
    timeout(SILENCE, sqlx::query_scalar(sql).fetch_one(conn))
        .await
        .ok()
        .map(|r| r.expect("the query succeeds when it answers"))
}

/// `black_hole_all` silences a live connection without closing it; after `heal` new
/// connections work while the black-holed one stays silent until its client drops it, which
/// the proxy notices (it deregisters the connection). A black-holed connection can be cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn black_hole_all_silences_live_connections_without_closing_them() {
    let Some((_db, proxy, options)) = proxy_to_server().await else {
        return;
    };
    let mut a = options.connect().await.unwrap();
    assert_eq!(select(&mut a, 1).await, Some(1));
    assert_eq!(proxy.live(), 1);

    assert_eq!(proxy.black_hole_all(), 1);
    assert_eq!(proxy.black_hole_all(), 0, "already black-holed");
    assert_eq!(
        select(&mut a, 2).await,
        None,
        "no answer through the black hole"
    );
    let stats = proxy.stats();
    assert_eq!(
        (stats.black_holed, stats.live, stats.cut),
        (1, 1, 0),
        "{stats:?}"
    );

    proxy.heal();
    let mut b = options.connect().await.unwrap();
    assert_eq!(
        select(&mut b, 3).await,
        Some(3),
        "a new connection works after heal"
    );
    assert_eq!(select(&mut a, 4).await, None, "the old one stays silent");
    assert_eq!(proxy.live(), 2);

    // The client gives up on the dead connection: the proxy closes and forgets it.
    drop(a);
    wait_until(
        Duration::from_secs(5),
        "the dropped connection deregistered",
        || async { proxy.live() == 1 },
    )
    .await;
    assert_eq!(select(&mut b, 5).await, Some(5));

    // Black-holed connections are still cut (reset): the client then fails at once.
    let mut c = options.connect().await.unwrap();
    assert_eq!(proxy.black_hole_all(), 2);
    assert_eq!(proxy.cut_all().await, 2);
    let r = timeout(SILENCE, sqlx::query("SELECT 6").execute(&mut c)).await;
    assert!(
        matches!(r, Ok(Err(_))),
        "a cut black-holed connection fails at once: {r:?}"
    );
    let stats = proxy.stats();
    assert_eq!(
        (stats.accepted, stats.black_holed, stats.cut, stats.live),
        (3, 3, 2, 0),
        "{stats:?}"
    );
}

/// `black_hole_matching` silences exactly the connections that send the needle, live ones
/// and new ones, while the others keep working; `heal` clears the needle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn black_hole_matching_silences_only_the_connection_sending_the_needle() {
    let Some((_db, proxy, options)) = proxy_to_server().await else {
        return;
    };
    let mut a = options.connect().await.unwrap();
    let mut b = options.connect().await.unwrap();
    assert_eq!(select(&mut a, 1).await, Some(1));
    assert_eq!(select(&mut b, 1).await, Some(1));

    proxy.black_hole_matching(b"SELECT 4242".to_vec());
    assert_eq!(
        select(&mut a, 4242).await,
        None,
        "the matching statement hangs"
    );
    assert_eq!(
        select(&mut b, 1).await,
        Some(1),
        "another live connection works"
    );
    let mut c = options.connect().await.unwrap();
    assert_eq!(select(&mut c, 1).await, Some(1), "a new connection works");
    let stats = proxy.stats();
    assert_eq!((stats.black_holed, stats.live), (1, 3), "{stats:?}");
    assert_eq!(
        select(&mut a, 1).await,
        None,
        "the matched connection stays silent"
    );

    // New connections are matched too.
    assert_eq!(select(&mut c, 4242).await, None);
    assert_eq!(proxy.stats().black_holed, 2);
    assert_eq!(select(&mut b, 2).await, Some(2));

    proxy.heal();
    assert_eq!(
        select(&mut b, 4242).await,
        Some(4242),
        "no needle after heal"
    );
    assert_eq!(select(&mut a, 3).await, None, "still silent after heal");
    let stats = proxy.stats();
    assert_eq!((stats.black_holed, stats.live), (2, 3), "{stats:?}");
}

/// `set_black_hole(true)`: connecting does not complete (no server greeting ever arrives)
/// and the socket is held open; after `heal`, connecting works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_black_hole_stalls_new_connections_until_healed() {
    let Some((_db, proxy, options)) = proxy_to_server().await else {
        return;
    };
    let mut live = options.connect().await.unwrap();

    proxy.set_black_hole(true);
    let r = timeout(SILENCE, options.connect()).await;
    assert!(
        r.is_err(),
        "connecting through the black hole must hang: {r:?}"
    );
    // At the TCP level: accepted, then neither data nor EOF nor reset.
    let mut raw = TcpStream::connect(proxy.addr()).await.unwrap();
    let mut byte = [0u8; 1];
    let r = timeout(SILENCE, raw.read(&mut byte)).await;
    assert!(
        r.is_err(),
        "a black-holed socket stays open and silent: {r:?}"
    );
    assert_eq!(proxy.live(), 2, "the raw socket and the live connection");
    assert_eq!(
        select(&mut live, 1).await,
        Some(1),
        "live connections not affected"
    );

    proxy.heal();
    let mut conn = options.connect().await.unwrap();
    assert_eq!(select(&mut conn, 2).await, Some(2));
    let r = timeout(SILENCE, raw.read(&mut byte)).await;
    assert!(r.is_err(), "still silent after heal: {r:?}");

    drop(raw);
    wait_until(
        Duration::from_secs(5),
        "the raw socket deregistered",
        || async { proxy.live() == 2 },
    )
    .await;
    let stats = proxy.stats();
    assert_eq!(
        (stats.accepted, stats.black_holed, stats.cut, stats.refused),
        (4, 2, 0, 0),
        "{stats:?}"
    );
}

/// Against a local peer: the needle is found across two reads (the first part was already
/// forwarded, the chunk completing it is not), nothing the upstream sends afterwards reaches
/// the client, and a connection black-holed by `set_black_hole` never connects upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn needle_split_across_reads_is_found_and_upstream_replies_are_dropped() {
    if !taskq_tests::loopback_or_skip() {
        return;
    }
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy = ChaosProxy::start(listener.local_addr().unwrap()).await;
    let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
    let (mut server, _) = timeout(Duration::from_secs(5), listener.accept())
        .await
        .expect("the proxy connects upstream")
        .unwrap();
    let mut buf = [0u8; 64];

    // Forwarding works both ways before the needle.
    client.write_all(b"hello").await.unwrap();
    server.read_exact(&mut buf[..5]).await.unwrap();
    assert_eq!(&buf[..5], b"hello");
    server.write_all(b"hi").await.unwrap();
    client.read_exact(&mut buf[..2]).await.unwrap();
    assert_eq!(&buf[..2], b"hi");

    proxy.black_hole_matching(b"NEEDLE".to_vec());
    client.write_all(b"xxNEE").await.unwrap();
    // The upstream reads the first part: it went through as a chunk of its own.
    server.read_exact(&mut buf[..5]).await.unwrap();
    assert_eq!(&buf[..5], b"xxNEE");
    client.write_all(b"DLEyy").await.unwrap();
    let r = timeout(SILENCE, server.read(&mut buf)).await;
    assert!(
        r.is_err(),
        "the chunk completing the needle is not forwarded: {r:?}"
    );
    assert_eq!(proxy.stats().black_holed, 1);

    // Upstream → client stops as well; both sockets stay open.
    server.write_all(b"answer").await.unwrap();
    let r = timeout(SILENCE, client.read(&mut buf)).await;
    assert!(r.is_err(), "nothing reaches the client: {r:?}");
    client.write_all(b"more").await.unwrap();
    let r = timeout(Duration::from_millis(200), server.read(&mut buf)).await;
    assert!(r.is_err(), "nothing more reaches the upstream: {r:?}");
    assert_eq!(proxy.live(), 1);

    // The client closes: the proxy closes the upstream side too (EOF there) and forgets it.
    drop(client);
    let n = timeout(Duration::from_secs(5), server.read(&mut buf))
        .await
        .expect("the upstream sees the close")
        .unwrap_or(0);
    assert_eq!(n, 0, "EOF, no late bytes");
    assert_eq!(proxy.live(), 0);

    // Black-holed from the start: no upstream connection at all.
    proxy.set_black_hole(true);
    let _held = TcpStream::connect(proxy.addr()).await.unwrap();
    let r = timeout(SILENCE, listener.accept()).await;
    assert!(r.is_err(), "no upstream connection: {r:?}");
    let stats = proxy.stats();
    assert_eq!((stats.black_holed, stats.live), (2, 1), "{stats:?}");
}
