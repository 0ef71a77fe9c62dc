//! The axum example: a request enqueues in its transaction, the in-process worker sends the
//! mail with injected state, and one signal shuts both down.

use std::time::Duration;

use example_axum_service::{Outbox, WelcomeMail, health_routes, serve, setup};
use sqlx::mysql::MySqlPoolOptions;
use taskq_tests::proxy::ChaosProxy;
use taskq_tests::{TestDb, wait_until};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn post(addr: std::net::SocketAddr, body: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "POST /signups HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

/// `GET path`: the status code and the body.
async fn get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    let code = out[9..12].parse().unwrap();
    let body = out.split("\r\n\r\n").nth(1).unwrap_or("").to_owned();
    (code, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signup_enqueues_mail_and_shutdown_stops_both() {
    let Some(db) = TestDb::new_or_skip().await else {
        return;
    };
    setup(&db.pool).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let outbox = Outbox::default();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let service = tokio::spawn(serve(db.pool.clone(), outbox.clone(), listener, stop_rx));

    wait_until(Duration::from_secs(10), "the service is ready", || async {
        get(addr, "/healthz").await.0 == 200
    })
    .await;
    let (_, body) = get(addr, "/healthz").await;
    let health: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(health["ready"], true, "{body}");
    assert_eq!(health["phase"], "running", "{body}");

    for i in 0..3 {
        let resp = post(addr, &format!(r#"{{"email":"u{i}@example.com"}}"#)).await;
        assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
        assert!(resp.contains("\"task_id\""), "{resp}");
    }
    // A bad request writes neither a user nor a task.
    let resp = post(addr, r#"{"mail":"x"}"#).await;
    assert!(resp.starts_with("HTTP/1.1 422"), "{resp}");

    wait_until(Duration::from_secs(10), "3 users welcomed", || async {
        sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM users WHERE welcomed_at IS NOT NULL")
            .fetch_one(&db.pool)
            .await
            .unwrap()
            == 3
    })
    .await;
    let _ = stop_tx.send(true);
    let report = tokio::time::timeout(Duration::from_secs(15), service)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(report.stats.succeeded, 3);
    assert!(report.released.is_empty());
    let users: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM users WHERE welcomed_at IS NOT NULL")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(users, 3);
    assert_eq!(db.count("state = 'succeeded'").await, 3);
    assert_eq!(db.count("1=1").await, 3);
    // The handler reached the provider over HTTP through the injected reqwest::Client: one
    // message per user, keyed for idempotency.
    let messages = outbox.messages.lock().unwrap().clone();
    assert_eq!(messages.len(), 3);
    assert_eq!(messages["welcome-1"], ("u0@example.com".to_owned(), 1));
    assert!(messages.values().all(|(_, n)| *n == 1));
    // The server no longer accepts connections.
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
}

/// `/healthz` answers 200 while the worker's database round trips succeed, 503 (with the
/// reason in the body) once none succeeded for a lease, and 200 again after the database is
/// back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_is_503_while_the_database_is_unreachable() {
    let Some(db) = TestDb::new_or_skip().await else {
        return;
    };
    setup(&db.pool).await.unwrap();
    let upstream = format!("{}:{}", db.options.get_host(), db.options.get_port())
        .parse()
        .unwrap();
    let proxy = ChaosProxy::start(upstream).await;
    let pool = MySqlPoolOptions::new()
        .max_connections(8)
        .connect_lazy_with(db.options.clone().port(proxy.addr().port()));
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let worker = taskq::Worker::builder(pool.clone())
        .register::<WelcomeMail>()
        .data(pool.clone())
        .data(reqwest::Client::new())
        .data(example_axum_service::MailApi {
            base_url: "http://127.0.0.1:9".into(),
        })
        .lease(Duration::from_secs(1))
        .shutdown_signal(async move {
            let _ = stop_rx.wait_for(|s| *s).await;
        })
        .build()
        .unwrap();
    let health = worker.health();
    let worker = tokio::spawn(worker.run());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, health_routes(health)).await });

    wait_until(Duration::from_secs(10), "200", || async {
        get(addr, "/healthz").await.0 == 200
    })
    .await;
    proxy.set_refuse(true);
    proxy.cut_all().await;
    wait_until(Duration::from_secs(10), "503", || async {
        get(addr, "/healthz").await.0 == 503
    })
    .await;
    let (_, body) = get(addr, "/healthz").await;
    let status: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(status["ready"], false, "{body}");
    assert_eq!(status["live"], true, "{body}");
    assert!(
        status["last_db_ok_ms_ago"].as_u64().unwrap() >= 1000,
        "{body}"
    );
    proxy.set_refuse(false);
    wait_until(Duration::from_secs(10), "200 again", || async {
        get(addr, "/healthz").await.0 == 200
    })
    .await;
    let _ = stop_tx.send(true);
    worker.await.unwrap().unwrap();
    assert_eq!(
        get(addr, "/healthz").await.0,
        503,
        "a stopped worker is not ready"
    );
}
