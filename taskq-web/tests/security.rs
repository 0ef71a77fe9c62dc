//! The dashboard under attack, over real HTTP: each attack of the dashboard's security review
//! (cross-site changes with authentication off, DNS rebinding, sessions that outlive logout
//! or are forged, unthrottled password guessing, CSRF tokens paired by someone who can set a
//! cookie, missing headers on the API, pausing a queue that does not exist, bad ids) is sent
//! as an attacker would, and the test asserts the refusal *and* that nothing changed.

mod support;

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use serde_json::Value;
use support::{RawResp, TOKEN, raw};
use taskq::TaskState;
use taskq_tests::TestDb;
use taskq_web::{Dashboard, DashboardBuilder};

/// A task the serving (test) binary registers, for enqueue-by-name.
#[taskq::task(queue = "sec_mail", max_attempts = 4)]
async fn sec_send_mail(to: String) -> Result<(), taskq::TaskError> {
    let _ = to;
    Ok(())
}

const EVIL: &str = "https://evil.example";

/// A dashboard served with exactly `configure`'s configuration (no credentials unless it sets
/// them) on 127.0.0.1, with client addresses, and the database it shows.
struct Served {
    addr: SocketAddr,
    db: TestDb,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl Served {
    fn host(&self) -> String {
        self.addr.to_string()
    }
    fn origin(&self) -> String {
        format!("http://{}", self.addr)
    }
    /// A request from 127.0.0.1 with `Host` set to the served address plus `headers`.
    async fn req(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> RawResp {
        self.req_from(LOCAL, method, path, headers, body).await
    }
    async fn req_from(
        &self,
        from: IpAddr,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> RawResp {
        let host = self.host();
        let mut all = vec![("Host", host.as_str())];
        all.extend_from_slice(headers);
        raw(self.addr, from, method, path, &all, body).await
    }
    fn client(&self) -> taskq::Client {
        taskq::Client::new(self.db.pool.clone())
    }
    async fn count(&self) -> u64 {
        self.client()
            .count(&taskq::client::ListFilter::default())
            .await
            .unwrap()
    }
    async fn state(&self, id: u64) -> TaskState {
        self.client().get(taskq::TaskId(id)).await.unwrap().state
    }
}

const LOCAL: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

async fn serve(configure: impl FnOnce(DashboardBuilder) -> DashboardBuilder) -> Option<Served> {
    logs();
    let db = TestDb::new_or_skip().await?;
    let router = configure(Dashboard::builder(db.pool.clone()))
        .build()
        .expect("valid configuration")
        .router();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let app = router.into_make_service_with_connect_info::<SocketAddr>();
        axum::serve(listener, app).await.unwrap();
    });
    Some(Served { addr, db, server })
}

/// A pending task, a dead task and a running task in queue `sec_mail`.
async fn tasks(s: &Served) -> (u64, u64, u64) {
    let pending = SecSendMail { to: "a".into() }
        .enqueue(&s.db.pool)
        .await
        .unwrap()
        .id
        .0;
    let mut ids = vec![];
    for state in ["dead", "running"] {
        ids.push(
            support::rows::insert_row(
                &s.db,
                support::rows::Row {
                    queue: "sec_mail",
                    name: "sec_send_mail",
                    payload: r#"{"to":"b"}"#,
                    state,
                    ..Default::default()
                },
            )
            .await,
        );
    }
    (pending, ids[0], ids[1])
}

fn json(r: &RawResp) -> Value {
    serde_json::from_str(&r.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", r.body))
}

fn code(r: &RawResp) -> String {
    json(r)["error"]["code"].as_str().unwrap_or("").to_owned()
}

// ------------------------------------------------------------------------- warnings captured

/// Every WARN event's message and `client` field, from every test of this binary (filtered by
/// client address in the test that reads them).
#[derive(Clone, Default)]
struct Warnings(Arc<Mutex<Vec<(String, String)>>>);

#[derive(Default)]
struct Fields {
    message: String,
    client: String,
}

impl tracing::field::Visit for Fields {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        match field.name() {
            "message" => self.message = format!("{value:?}"),
            "client" => self.client = format!("{value:?}"),
            _ => {}
        }
    }
}

impl tracing::Subscriber for Warnings {
    fn enabled(&self, m: &tracing::Metadata<'_>) -> bool {
        *m.level() <= tracing::Level::WARN
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        if *event.metadata().level() == tracing::Level::WARN {
            let mut f = Fields::default();
            event.record(&mut f);
            self.0.lock().unwrap().push((f.message, f.client));
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// The process-wide capture (installed by the first test that serves a dashboard).
fn logs() -> &'static Warnings {
    static W: OnceLock<Warnings> = OnceLock::new();
    W.get_or_init(|| {
        let w = Warnings::default();
        let _ = tracing::subscriber::set_global_default(w.clone());
        w
    })
}

// ---------------------------------------------------------------------------------- attacks

/// With authentication off, a page on another site tries every change the API and the forms
/// offer, the way a browser would send them (text/plain simple requests, `Origin`,
/// `Sec-Fetch-Site`); every one is refused and nothing changes. The same changes from the
/// dashboard's own origin, as JSON, go through.
#[tokio::test]
async fn with_auth_off_other_sites_cannot_change_anything() {
    let Some(s) = serve(|b| b.insecure_no_auth()).await else {
        return;
    };
    let (pending, dead, _) = tasks(&s).await;
    let before = s.count().await;
    let payload = r#"{"name":"sec_send_mail","payload":{"to":"attacker"}}"#;
    let changes = [
        ("/api/v1/tasks", payload),
        (&*format!("/api/v1/tasks/{pending}/cancel"), ""),
        (&*format!("/api/v1/tasks/{dead}/retry"), ""),
        ("/api/v1/queues/sec_mail/pause", ""),
    ]
    .map(|(p, b)| (p.to_owned(), b.to_owned()));
    for (path, body) in &changes {
        // A cross-site simple request: text/plain, with the attacker's Origin.
        let r = s
            .req(
                "POST",
                path,
                &[("Origin", EVIL), ("Content-Type", "text/plain")],
                body,
            )
            .await;
        assert_eq!(r.status, 403, "{path}: {}", r.body);
        assert_eq!(code(&r), "cross_site", "{path}");
        // Even as JSON (a preflighted fetch a careless proxy let through).
        let r = s
            .req(
                "POST",
                path,
                &[
                    ("Origin", EVIL),
                    ("Sec-Fetch-Site", "cross-site"),
                    ("Content-Type", "application/json"),
                ],
                body,
            )
            .await;
        assert_eq!(r.status, 403, "{path}");
        // Sec-Fetch-Site alone (a browser that drops Origin).
        let r = s
            .req(
                "POST",
                path,
                &[
                    ("Sec-Fetch-Site", "same-site"),
                    ("Content-Type", "application/json"),
                ],
                body,
            )
            .await;
        assert_eq!(r.status, 403, "{path}");
        // No Origin at all but not JSON (a form or text/plain from a non-browser): refused.
        let r = s
            .req("POST", path, &[("Content-Type", "text/plain")], body)
            .await;
        assert_eq!(r.status, 415, "{path}");
        assert_eq!(code(&r), "json_required");
        let r = s
            .req(
                "POST",
                path,
                &[("Content-Type", "application/x-www-form-urlencoded")],
                body,
            )
            .await;
        assert_eq!(r.status, 415, "{path}");
    }
    // The page forms: a cross-site form POST with a valid CSRF pair the attacker read from
    // its own visit is refused by origin as well.
    let page = s.req("GET", "/bulk?action=retry", &[], "").await;
    let nonce = page.set_cookie("taskq_csrf").unwrap();
    let field = page.csrf_field().unwrap();
    let cookie = format!("taskq_csrf={nonce}");
    let form_body = format!("queue=sec_mail&csrf={field}");
    let r = s
        .req(
            "POST",
            "/queues/pause",
            &[
                ("Origin", EVIL),
                ("Cookie", &cookie),
                ("Content-Type", "application/x-www-form-urlencoded"),
            ],
            &form_body,
        )
        .await;
    assert_eq!(r.status, 403);
    assert!(r.body.contains("cross-site request refused"), "{}", r.body);
    assert!(r.header("content-type").unwrap().starts_with("text/html"));
    // Nothing changed.
    assert_eq!(s.count().await, before);
    assert_eq!(s.state(pending).await, TaskState::Pending);
    assert_eq!(s.state(dead).await, TaskState::Dead);
    assert!(s.client().paused_queues().await.unwrap().is_empty());
    // The dashboard's own origin, as JSON: accepted.
    let own = s.origin();
    let same = [
        ("Origin", own.as_str()),
        ("Sec-Fetch-Site", "same-origin"),
        ("Content-Type", "application/json"),
    ];
    let r = s.req("POST", "/api/v1/tasks", &same, payload).await;
    assert_eq!(r.status, 201, "{}", r.body);
    let r = s
        .req(
            "POST",
            &format!("/api/v1/tasks/{pending}/cancel"),
            &same,
            "",
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let r = s
        .req("POST", "/api/v1/queues/sec_mail/pause", &same, "{}")
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let r = s
        .req(
            "POST",
            "/queues/resume",
            &[
                ("Origin", own.as_str()),
                ("Cookie", &cookie),
                ("Content-Type", "application/x-www-form-urlencoded"),
            ],
            &form_body,
        )
        .await;
    assert_eq!(r.status, 303, "{}", r.body);
    assert_eq!(s.count().await, before + 1);
    assert_eq!(s.state(pending).await, TaskState::Canceled);
    assert!(s.client().paused_queues().await.unwrap().is_empty());
}

/// DNS rebinding: a page on `evil.example` whose name now resolves to the dashboard's address
/// sends `Host: evil.example`. With authentication off only the loopback names are answered;
/// with `allowed_hosts` only those.
#[tokio::test]
async fn only_the_allowed_host_names_are_answered() {
    let Some(s) = serve(|b| b.insecure_no_auth()).await else {
        return;
    };
    let (pending, _, _) = tasks(&s).await;
    let port = s.addr.port();
    for host in [format!("evil.example:{port}"), "evil.example".into()] {
        for path in [
            "/api/v1/tasks",
            &*format!("/api/v1/tasks/{pending}"),
            "/",
            "/tasks",
        ] {
            let r = raw(s.addr, LOCAL, "GET", path, &[("Host", &host)], "").await;
            assert_eq!(r.status, 421, "{host} {path}");
            assert!(!r.body.contains("sec_send_mail"), "{path} leaked a payload");
        }
    }
    for host in [format!("localhost:{port}"), format!("127.0.0.1:{port}")] {
        let r = raw(
            s.addr,
            LOCAL,
            "GET",
            "/api/v1/tasks",
            &[("Host", &host)],
            "",
        )
        .await;
        assert_eq!(r.status, 200, "{host}");
    }
    drop(s);
    // With authentication on, names are open unless a list is given; then only the list.
    let Some(s) = serve(|b| {
        b.bearer_token(TOKEN)
            .allowed_hosts(["dash.example", "127.0.0.1"])
    })
    .await
    else {
        return;
    };
    let auth = format!("Bearer {TOKEN}");
    for (host, status) in [
        ("dash.example", 200),
        ("DASH.example:8443", 200),
        ("127.0.0.1:1", 200),
        ("evil.example", 421),
        ("localhost", 421),
    ] {
        let r = raw(
            s.addr,
            LOCAL,
            "GET",
            "/api/v1/queues",
            &[("Host", host), ("Authorization", &auth)],
            "",
        )
        .await;
        assert_eq!(r.status, status, "{host}");
    }
    // A configuration that names nothing valid is refused.
    let db = TestDb::new_or_skip().await.unwrap();
    for bad in [vec![], vec!["http://x"], vec!["a b"]] {
        assert!(
            Dashboard::builder(db.pool.clone())
                .bearer_token(TOKEN)
                .allowed_hosts(bad.clone())
                .build()
                .is_err(),
            "{bad:?}"
        );
    }
}

/// Signs in on the login page from `from`; returns the session cookie value.
async fn login(s: &Served, from: IpAddr, token: &str) -> RawResp {
    let page = s.req_from(from, "GET", "/login", &[], "").await;
    let nonce = page.set_cookie("taskq_csrf").unwrap();
    let field = page.csrf_field().unwrap();
    s.req_from(
        from,
        "POST",
        "/login",
        &[
            ("Cookie", &format!("taskq_csrf={nonce}")),
            ("Content-Type", "application/x-www-form-urlencoded"),
        ],
        &format!("token={token}&csrf={field}"),
    )
    .await
}

/// Sessions: logout ends the session even for someone who kept the cookie; a cookie of
/// another dashboard process (another random secret), or of the same secret with other
/// credentials, is refused; replicas sharing a configured secret accept each other's; a
/// cookie past its lifetime or claiming a far expiry is refused.
#[tokio::test]
async fn sessions_end_at_logout_and_cannot_be_forged_or_prolonged() {
    let secret = [42u8; 32];
    let Some(s) = serve(|b| b.bearer_token(TOKEN).session_secret(secret)).await else {
        return;
    };
    let ok = login(&s, LOCAL, TOKEN).await;
    assert_eq!(ok.status, 303, "{}", ok.body);
    let session = ok.set_cookie("taskq_session").unwrap();
    assert!(
        !session.contains(TOKEN) && session.split('.').count() == 3,
        "{session}"
    );
    let cookie = format!("taskq_session={session}");
    let page = s.req("GET", "/", &[("Cookie", &cookie)], "").await;
    assert_eq!(page.status, 200);
    assert!(page.body.contains("Log out"));

    // Another replica with the same secret and credentials accepts it; with another token,
    // or without the configured secret, it does not.
    for (configure, status) in [
        (Some(TOKEN), 200),
        (Some("another-token-42"), 401),
        (None, 401),
    ] {
        let other = serve(move |b| {
            let b = b.bearer_token(configure.unwrap_or(TOKEN));
            match configure {
                Some(_) => b.session_secret(secret),
                None => b,
            }
        })
        .await
        .unwrap();
        let r = other.req("GET", "/", &[("Cookie", &cookie)], "").await;
        assert_eq!(r.status, status, "{configure:?}");
    }

    // Forged cookies: a far issue time with a made-up MAC, the cookie's own MAC on another
    // time, an expiry field in the old format.
    let (id, rest) = session.split_once('.').unwrap();
    let (_, mac) = rest.split_once('.').unwrap();
    for forged in [
        format!("{id}.4102444800.{mac}"),
        format!("{id}.4102444800.{}", "0".repeat(64)),
        format!("4102444800.{mac}"),
    ] {
        let r = s
            .req(
                "GET",
                "/",
                &[("Cookie", &format!("taskq_session={forged}"))],
                "",
            )
            .await;
        assert_eq!(r.status, 401, "{forged}");
    }

    // Logout with the signed-in page's form; the same cookie is refused afterwards.
    let nonce = page.set_cookie("taskq_csrf").unwrap();
    let field = page.csrf_field().unwrap();
    let both = format!("{cookie}; taskq_csrf={nonce}");
    let out = s
        .req(
            "POST",
            "/logout",
            &[
                ("Cookie", &both),
                ("Content-Type", "application/x-www-form-urlencoded"),
            ],
            &format!("csrf={field}"),
        )
        .await;
    assert_eq!(out.status, 303, "{}", out.body);
    let after = s.req("GET", "/", &[("Cookie", &cookie)], "").await;
    assert_eq!(after.status, 401);

    // A session ends by itself after the lifetime.
    let short = serve(|b| b.bearer_token(TOKEN).session_ttl(Duration::from_secs(2)))
        .await
        .unwrap();
    let fresh = login(&short, LOCAL, TOKEN)
        .await
        .set_cookie("taskq_session")
        .unwrap();
    let fresh = format!("taskq_session={fresh}");
    assert_eq!(
        short
            .req("GET", "/", &[("Cookie", &fresh)], "")
            .await
            .status,
        200
    );
    tokio::time::sleep(Duration::from_millis(3_100)).await;
    assert_eq!(
        short
            .req("GET", "/", &[("Cookie", &fresh)], "")
            .await
            .status,
        401
    );

    // Configurations that would weaken sessions are refused.
    let db = TestDb::new_or_skip().await.unwrap();
    let b = || Dashboard::builder(db.pool.clone()).bearer_token(TOKEN);
    assert!(b().session_secret([1u8; 16]).build().is_err());
    assert!(
        b().session_ttl(Duration::from_secs(31 * 86_400))
            .build()
            .is_err()
    );
}

/// Password guessing: a client's first failures are answered, then it is locked out (429,
/// `Retry-After`, even for the right token, which is not checked); another client still signs
/// in; header guesses on the API count too; every failure is logged at WARN.
#[tokio::test]
async fn failed_sign_ins_are_throttled_and_logged() {
    let Some(s) = serve(|b| b.bearer_token(TOKEN)).await else {
        return;
    };
    let guesser: IpAddr = "127.0.0.7".parse().unwrap();
    let mut statuses = vec![];
    for i in 0..8 {
        statuses.push(login(&s, guesser, &format!("wrong-token-{i}")).await.status);
    }
    assert_eq!(statuses, [401, 401, 401, 401, 401, 429, 429, 429]);
    let locked = login(&s, guesser, TOKEN).await;
    assert_eq!(locked.status, 429);
    assert!(locked.header("retry-after").is_some());
    assert!(locked.body.contains("Too many failed sign-ins"));
    assert!(locked.set_cookie("taskq_session").is_none());
    // Another client is not affected.
    let other: IpAddr = "127.0.0.8".parse().unwrap();
    assert_eq!(login(&s, other, TOKEN).await.status, 303);
    // Guesses in the Authorization header, on the API.
    let api_guesser: IpAddr = "127.0.0.9".parse().unwrap();
    let mut statuses = vec![];
    for i in 0..7 {
        let r = s
            .req_from(
                api_guesser,
                "GET",
                "/api/v1/queues",
                &[("Authorization", &format!("Bearer wrong-token-{i}"))],
                "",
            )
            .await;
        statuses.push(r.status);
    }
    assert_eq!(statuses, [401, 401, 401, 401, 401, 429, 429]);
    let r = s
        .req_from(
            api_guesser,
            "GET",
            "/api/v1/queues",
            &[("Authorization", &format!("Bearer {TOKEN}"))],
            "",
        )
        .await;
    assert_eq!(r.status, 429);
    assert_eq!(code(&r), "too_many_requests");
    // Logged: one WARN per failure checked (5 each), naming the client.
    let warnings = logs().0.lock().unwrap().clone();
    for ip in ["127.0.0.7", "127.0.0.9"] {
        let mine: Vec<_> = warnings.iter().filter(|(_, c)| c == ip).collect();
        assert_eq!(mine.len(), 5, "{ip}: {warnings:?}");
        assert!(mine.iter().all(|(m, _)| m.contains("failed sign-in")));
        assert!(mine.last().unwrap().0.contains("throttled"), "{mine:?}");
    }
}

/// Someone who can set cookies on the dashboard's host (a sibling subdomain) pairs their own
/// CSRF cookie with the form token they got on their own visit and submits it in the
/// victim's session: refused, because the token is bound to the session it was served to.
#[tokio::test]
async fn csrf_tokens_are_bound_to_the_session() {
    let Some(s) = serve(|b| b.bearer_token(TOKEN)).await else {
        return;
    };
    let (_, dead, _) = tasks(&s).await;
    let victim = login(&s, LOCAL, TOKEN)
        .await
        .set_cookie("taskq_session")
        .unwrap();
    let attacker = login(&s, LOCAL, TOKEN)
        .await
        .set_cookie("taskq_session")
        .unwrap();
    // The attacker's own pair (from a page served to the attacker's session).
    let page = s
        .req(
            "GET",
            "/bulk?action=retry",
            &[("Cookie", &format!("taskq_session={attacker}"))],
            "",
        )
        .await;
    let nonce = page.set_cookie("taskq_csrf").unwrap();
    let field = page.csrf_field().unwrap();
    // ...planted in the victim's browser: the victim's session, the attacker's CSRF cookie,
    // and the attacker's field in an auto-submitted form.
    let planted = format!("taskq_session={victim}; taskq_csrf={nonce}");
    let form = [
        ("Cookie", planted.as_str()),
        ("Content-Type", "application/x-www-form-urlencoded"),
    ];
    let r = s
        .req(
            "POST",
            &format!("/tasks/{dead}/retry"),
            &form,
            &format!("csrf={field}"),
        )
        .await;
    assert_eq!(r.status, 403, "{}", r.body);
    assert!(r.body.contains("CSRF"));
    // A token served without a session (the login page) does not work in a session either.
    let anon = s.req("GET", "/login", &[], "").await;
    let planted = format!(
        "taskq_session={victim}; taskq_csrf={}",
        anon.set_cookie("taskq_csrf").unwrap()
    );
    let r = s
        .req(
            "POST",
            &format!("/tasks/{dead}/retry"),
            &[
                ("Cookie", &planted),
                ("Content-Type", "application/x-www-form-urlencoded"),
            ],
            &format!("csrf={}", anon.csrf_field().unwrap()),
        )
        .await;
    assert_eq!(r.status, 403);
    assert_eq!(s.state(dead).await, TaskState::Dead);
    // The victim's own page's token works.
    let own = s
        .req(
            "GET",
            "/bulk?action=retry",
            &[("Cookie", &format!("taskq_session={victim}"))],
            "",
        )
        .await;
    let cookie = format!(
        "taskq_session={victim}; taskq_csrf={}",
        own.set_cookie("taskq_csrf").unwrap()
    );
    let r = s
        .req(
            "POST",
            &format!("/tasks/{dead}/retry"),
            &[
                ("Cookie", &cookie),
                ("Content-Type", "application/x-www-form-urlencoded"),
            ],
            &format!("csrf={}", own.csrf_field().unwrap()),
        )
        .await;
    assert_eq!(r.status, 303, "{}", r.body);
    assert_eq!(s.state(dead).await, TaskState::Pending);
}

/// API responses, errors included, carry `nosniff`, a content security policy and no-store;
/// an unknown queue cannot be paused (nothing is created); bad ids and bad parameters get the
/// dashboard's error page on pages and a JSON error on the API.
#[tokio::test]
async fn api_headers_unknown_queues_and_bad_input() {
    let Some(s) = serve(|b| b.bearer_token(TOKEN)).await else {
        return;
    };
    let (pending, _, _) = tasks(&s).await;
    let auth = format!("Bearer {TOKEN}");
    let a = [("Authorization", auth.as_str())];
    for (path, status) in [
        ("/api/v1/queues", 200),
        ("/api/v1/openapi.json", 200),
        ("/api/v1/tasks/abc", 400),
        ("/api/v1/tasks/99999999999999999999999", 400),
        ("/api/v1/tasks/999999", 404),
        ("/api/v1/tasks?limit=abc", 400),
        // Found by fuzzing from the OpenAPI document (docs/dashboard.md).
        ("/api/v1/tasks?limit=0", 400),
        ("/api/v1/tasks?order=", 400),
        ("/api/v1/tasks?state=", 400),
        ("/api/v1/tasks?after=9223372036854775808", 400),
        ("/api/v1/retrying?limit=0", 400),
        ("/api/v1/scheduled?after=", 400),
        // A cursor time outside what the database stores: 400 (negative) or an empty page
        // (past the year 9999), not a 500 from the driver.
        ("/api/v1/retrying?after=-980358573150701993:1", 400),
        ("/api/v1/scheduled?after=999999999999999999:1", 200),
        ("/api/v1/scheduled?after=1:9999999999999999999", 400),
        ("/api/v1/audit?task=9223372036854775808", 400),
        ("/api/v1/audit?limit=0", 400),
        ("/api/v1/nothing-here", 404),
    ] {
        let r = s.req("GET", path, &a, "").await;
        assert_eq!(r.status, status, "{path}: {}", r.body);
        assert_eq!(
            r.header("x-content-type-options"),
            Some("nosniff"),
            "{path}"
        );
        assert!(
            r.header("content-security-policy")
                .is_some_and(|v| v.contains("default-src 'none'")),
            "{path}"
        );
        assert_eq!(r.header("cache-control"), Some("no-store"), "{path}");
        if status >= 400 {
            assert!(
                r.header("content-type")
                    .unwrap()
                    .starts_with("application/json"),
                "{path}: {:?}",
                r.headers
            );
            assert!(json(&r)["error"]["message"].is_string(), "{path}");
        }
    }
    let unauth = s.req("GET", "/api/v1/queues", &[], "").await;
    assert_eq!(unauth.status, 401);
    assert_eq!(unauth.header("x-content-type-options"), Some("nosniff"));

    // Pausing a queue nothing names: 404, nothing created; a known one: paused.
    let json_post = [
        ("Authorization", auth.as_str()),
        ("Content-Type", "application/json"),
    ];
    let r = s
        .req("POST", "/api/v1/queues/sec_mial/pause", &json_post, "{}")
        .await;
    assert_eq!(r.status, 404, "{}", r.body);
    assert_eq!(code(&r), "unknown_queue");
    assert!(s.client().paused_queues().await.unwrap().is_empty());
    assert!(
        s.client()
            .queues()
            .await
            .unwrap()
            .iter()
            .all(|q| q.queue != "sec_mial")
    );
    for (path, body) in [
        (
            format!("/api/v1/tasks/{pending}/reschedule"),
            r#"{"delay_ms": 0, "run_at": null}"#,
        ),
        (
            "/api/v1/tasks/selected".to_owned(),
            r#"{"action": "cancel", "ids": [9223372036854775808]}"#,
        ),
    ] {
        let r = s.req("POST", &path, &json_post, body).await;
        assert_eq!(r.status, 400, "{path} {body}: {}", r.body);
    }
    let long = format!("/api/v1/queues/{}/resume", "q".repeat(65));
    let r = s.req("POST", &long, &json_post, "{}").await;
    assert_eq!(r.status, 422, "{}", r.body);
    let r = s
        .req("POST", "/api/v1/queues/sec_mail/pause", &json_post, "{}")
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(s.client().paused_queues().await.unwrap().len(), 1);

    // Pages: the error page (HTML, with the way back), for bad ids in GETs and POSTs.
    let page = s.req("GET", "/bulk?action=retry", &a, "").await;
    let form = format!("taskq_csrf={}", page.set_cookie("taskq_csrf").unwrap());
    let csrf = page.csrf_field().unwrap();
    for (method, path, status) in [
        ("GET", "/tasks/abc".to_owned(), 400),
        ("GET", "/tasks/99999999999999999999999".to_owned(), 400),
        ("GET", "/tasks/999999".to_owned(), 404),
        ("GET", "/tasks?limit=abc".to_owned(), 400),
        ("POST", "/tasks/abc/retry".to_owned(), 400),
        ("POST", "/tasks/-1/cancel".to_owned(), 400),
        ("POST", "/queues/pause".to_owned(), 404),
    ] {
        let body = if path == "/queues/pause" {
            format!("queue=sec_mial&csrf={csrf}")
        } else {
            format!("csrf={csrf}")
        };
        let r = s
            .req(
                method,
                &path,
                &[
                    ("Authorization", auth.as_str()),
                    ("Cookie", &form),
                    ("Content-Type", "application/x-www-form-urlencoded"),
                ],
                &body,
            )
            .await;
        assert_eq!(r.status, status, "{method} {path}: {}", r.body);
        assert!(
            r.header("content-type").unwrap().starts_with("text/html"),
            "{path}"
        );
        assert!(
            r.body.contains("Back to the overview"),
            "{path}: {}",
            r.body
        );
    }
    assert_eq!(s.client().paused_queues().await.unwrap().len(), 1);
    assert_eq!(s.state(pending).await, TaskState::Pending);
}

/// After signing in, the login form returns to the page that asked for it, and only to a
/// path within the dashboard.
#[tokio::test]
async fn login_returns_to_the_page_that_asked() {
    let Some(s) = serve(|b| b.bearer_token(TOKEN)).await else {
        return;
    };
    let asked = s.req("GET", "/tasks?state=dead", &[], "").await;
    assert_eq!(asked.status, 401);
    assert!(
        asked
            .body
            .contains(r#"name="next" value="/tasks?state=dead""#),
        "{}",
        asked.body
    );
    for (next, location) in [
        ("%2Ftasks%3Fstate%3Ddead", "./tasks?state=dead"),
        ("%2F%2Fevil.example%2Fx", "./"),
        ("https%3A%2F%2Fevil.example", "./"),
        ("%2F%5Cevil.example", "./"),
        ("%2Flogin", "./"),
        // Issue 34 S5: dot segments, plain or percent-encoded (a browser resolves `%2e%2e`
        // as `..`), would take the redirect out of the dashboard's prefix.
        ("%2F%252e%252e%2F%252e%252e%2Fx", "./"),
        ("%2F%252E%252e%2Fx", "./"),
        ("%2F.%252e%2Fx", "./"),
        ("%2Ftasks%2F..%2F..%2Fx", "./"),
        ("%2F.%2Fx", "./"),
    ] {
        let page = s.req("GET", "/login", &[], "").await;
        let r = s
            .req(
                "POST",
                "/login",
                &[
                    (
                        "Cookie",
                        &format!("taskq_csrf={}", page.set_cookie("taskq_csrf").unwrap()),
                    ),
                    ("Content-Type", "application/x-www-form-urlencoded"),
                ],
                &format!(
                    "token={TOKEN}&next={next}&csrf={}",
                    page.csrf_field().unwrap()
                ),
            )
            .await;
        assert_eq!(r.status, 303, "{next}");
        assert_eq!(r.header("location"), Some(location), "{next}");
    }
    // /login?next=... carries it into the form.
    let r = s.req("GET", "/login?next=%2Ftasks%2F5", &[], "").await;
    assert!(r.body.contains(r#"name="next" value="/tasks/5""#));
    let r = s.req("GET", "/login?next=%2F%2Fevil", &[], "").await;
    assert!(!r.body.contains(r#"name="next""#));
}
