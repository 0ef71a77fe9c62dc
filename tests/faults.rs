//! Fault-injection tests: a private database server the test can kill and restart, and a TCP
//! proxy that cuts connections.
//!
//! Run them with:
//!
//! ```text
//! cargo test -p taskq-tests --test faults
//! ```
//!
//! They need a MariaDB (or MySQL) server binary on the machine — `mariadbd` or `mysqld` on
//! `PATH`, in `/usr/sbin` or `/usr/local/mysql/bin` (override with `TASKQ_MARIADBD`) — plus
//! `mariadb-install-db`/`mysql_install_db` for MariaDB (override with
//! `TASKQ_MARIADB_INSTALL_DB`); on Debian/Ubuntu `apt-get install mariadb-server` provides them.
//! No running service is needed and the shared server is never touched: each test starts its
//! own server on a temporary datadir (~115 MB, removed afterwards) and a free port. Without a
//! server binary the tests print `skipped: no mariadbd/mysqld binary found` and pass; set
//! `TASKQ_REQUIRE_PRIVATE_SERVER=1` to make that a failure (CI).

use std::time::{Duration, Instant};

use sqlx::{Connection, MySqlConnection};
use taskq_tests::proxy::ChaosProxy;
use taskq_tests::server::PrivateServer;

/// A committed row survives SIGKILL of the server and InnoDB crash recovery on restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn private_server_survives_kill_and_restart() {
    let t0 = Instant::now();
    let Some(mut server) = PrivateServer::start_or_skip().await else {
        return;
    };
    eprintln!("private server {server:?} started in {:?}", t0.elapsed());

    let url = server.create_database("faults").await.unwrap();
    assert_eq!(url, server.database_url("faults"));
    let mut conn = MySqlConnection::connect(&url).await.unwrap();
    sqlx::raw_sql(
        "CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(20)) ENGINE=InnoDB;
         INSERT INTO t VALUES (1, 'one'), (2, 'two'), (3, 'three');",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    // An uncommitted transaction that the crash must roll back.
    let mut open = MySqlConnection::connect(&url).await.unwrap();
    sqlx::raw_sql("BEGIN; INSERT INTO t VALUES (4, 'uncommitted');")
        .execute(&mut open)
        .await
        .unwrap();

    let pid = server.pid().expect("server running");
    let t1 = Instant::now();
    server.kill().await;
    eprintln!("killed pid {pid} in {:?}", t1.elapsed());
    assert!(!server.is_running());
    assert!(
        sqlx::query("SELECT 1").execute(&mut conn).await.is_err(),
        "a connection to a killed server must fail"
    );
    assert!(
        MySqlConnection::connect(&url).await.is_err(),
        "connecting to a killed server must fail"
    );

    let t2 = Instant::now();
    server.restart().await.unwrap();
    eprintln!("restarted (crash recovery) in {:?}", t2.elapsed());
    assert_ne!(server.pid(), Some(pid));

    let mut conn = MySqlConnection::connect(&url).await.unwrap();
    let rows: Vec<(i32, String)> = sqlx::query_as("SELECT id, v FROM t ORDER BY id")
        .fetch_all(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        rows,
        vec![
            (1, "one".to_owned()),
            (2, "two".to_owned()),
            (3, "three".to_owned())
        ]
    );
    conn.close().await.unwrap();

    // A graceful stop and a start again work too.
    let t3 = Instant::now();
    server.stop().await;
    eprintln!("graceful stop in {:?}", t3.elapsed());
    assert!(!server.is_running());
    server.restart().await.unwrap();
    let mut conn = MySqlConnection::connect(&url).await.unwrap();
    let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM t")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(n, 3);

    let dir = server.root_dir().to_owned();
    drop(server);
    assert!(!dir.exists(), "datadir {dir:?} removed on drop");
}

/// Cutting connections through the proxy breaks live connections but not new ones; refusing
/// makes connects fail; chaos mode cuts connections in the background.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_cuts_connections() {
    let Some(server) = PrivateServer::start_or_skip().await else {
        return;
    };
    let proxy = ChaosProxy::start(server.addr()).await;
    let url = format!("{}/mysql", proxy.mysql_url());

    let mut conn = MySqlConnection::connect(&url).await.unwrap();
    let one: i32 = sqlx::query_scalar("SELECT 1")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(one, 1);
    assert_eq!(proxy.live(), 1);

    assert_eq!(proxy.cut_all().await, 1);
    let err = sqlx::query_scalar::<_, i32>("SELECT 1")
        .fetch_one(&mut conn)
        .await
        .expect_err("a query on a cut connection must fail");
    eprintln!("query on a cut connection: {err}");
    drop(conn);

    let mut conn = MySqlConnection::connect(&url).await.unwrap();
    let two: i32 = sqlx::query_scalar("SELECT 2")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(two, 2);

    proxy.set_refuse(true);
    let err = MySqlConnection::connect(&url)
        .await
        .expect_err("connecting while refusing must fail");
    eprintln!("connect while refusing: {err}");
    // The live connection is not affected by refusing.
    sqlx::query("SELECT 1").execute(&mut conn).await.unwrap();
    proxy.set_refuse(false);
    MySqlConnection::connect(&url)
        .await
        .unwrap()
        .close()
        .await
        .unwrap();

    // Chaos mode: with probability 1 every ~20 ms, a busy connection is cut soon.
    proxy.start_chaos(Duration::from_millis(10)..Duration::from_millis(30), 1.0);
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut failed = false;
    while Instant::now() < deadline {
        if sqlx::query("SELECT 1").execute(&mut conn).await.is_err() {
            failed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert!(failed, "chaos mode cut the connection within 5 s");
    proxy.stop_chaos();
    let mut conn = MySqlConnection::connect(&url).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    sqlx::query("SELECT 1").execute(&mut conn).await.unwrap();

    let stats = proxy.stats();
    eprintln!("proxy stats: {stats:?}");
    assert_eq!(stats.accepted, 4, "{stats:?}");
    assert_eq!(stats.refused, 1, "{stats:?}");
    assert!(stats.cut >= 2, "{stats:?}");
    assert_eq!(stats.live, 1, "{stats:?}");

    // Dropping the proxy closes the remaining connection.
    drop(proxy);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(sqlx::query("SELECT 1").execute(&mut conn).await.is_err());
}
