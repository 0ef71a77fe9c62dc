//! Helpers for the dashboard's HTTP tests: requests through `tower::ServiceExt::oneshot`
//! against a fresh test database, and a dashboard served on an ephemeral port (for tests that
//! drive it with a real HTTP client or browser).

#![allow(dead_code)]

pub mod browser;
pub mod rows;

use std::net::SocketAddr;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, Method, Request, StatusCode, header};
use taskq_tests::TestDb;
use taskq_web::{Dashboard, DashboardBuilder};
use tower::ServiceExt as _;

/// The bearer token the helpers configure.
pub const TOKEN: &str = "test-token-0123456789";

/// A response, read whole.
#[derive(Debug)]
pub struct Resp {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: String,
}

impl Resp {
    /// The value the response sets for cookie `name` (`Set-Cookie: name=value; ...`).
    pub fn set_cookie(&self, name: &str) -> Option<String> {
        self.set_cookie_line(name)
            .map(|l| l.split(';').next().unwrap()[name.len() + 1..].to_owned())
    }
    /// The whole `Set-Cookie` line for `name`.
    pub fn set_cookie_line(&self, name: &str) -> Option<String> {
        self.headers
            .get_all(header::SET_COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .find(|v| v.starts_with(&format!("{name}=")))
            .map(str::to_owned)
    }
    /// The value of the first hidden `csrf` field of the page.
    pub fn csrf_field(&self) -> Option<String> {
        let key = "name=\"csrf\" value=\"";
        let i = self.body.find(key)? + key.len();
        let end = self.body[i..].find('"')?;
        Some(self.body[i..i + end].to_owned())
    }
    pub fn location(&self) -> Option<&str> {
        self.headers
            .get(header::LOCATION)
            .and_then(|v| v.to_str().ok())
    }
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
    /// Every `href="..."` and `action="..."` value in the page (HTML-unescaped `&amp;`).
    pub fn links(&self) -> Vec<String> {
        let mut out = vec![];
        for attr in ["href=\"", "action=\""] {
            let mut rest = self.body.as_str();
            while let Some(i) = rest.find(attr) {
                rest = &rest[i + attr.len()..];
                let end = rest.find('"').unwrap();
                out.push(rest[..end].replace("&amp;", "&"));
                rest = &rest[end..];
            }
        }
        out
    }
}

/// How a test request authenticates.
#[derive(Clone, Copy)]
pub enum Cred<'a> {
    None,
    Bearer(&'a str),
    Basic(&'a str, &'a str),
}

/// A dashboard router on a fresh database.
pub struct App {
    pub db: TestDb,
    pub router: Router,
}

/// A router built by `configure` from a builder on a fresh database (with the bearer token
/// [`TOKEN`] unless `configure` replaces the credentials); `None` (the test skips) when no
/// MySQL server answers.
pub async fn app(configure: impl FnOnce(DashboardBuilder) -> DashboardBuilder) -> Option<App> {
    let db = TestDb::new_or_skip().await?;
    let router = configure(Dashboard::builder(db.pool.clone()))
        .build()
        .expect("valid dashboard configuration")
        .router();
    Some(App { db, router })
}

/// A new client address (10.x.y.z) for each call.
fn next_client() -> SocketAddr {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    SocketAddr::from(([10, (n >> 16) as u8, (n >> 8) as u8, n as u8], 40000))
}

/// A request through `router` (one `oneshot` call), with `Host: localhost` unless `headers`
/// name one.
pub async fn send(
    router: &Router,
    method: Method,
    path: &str,
    cred: Cred<'_>,
    headers: &[(&str, &str)],
    body: Option<(&str, String)>,
) -> Resp {
    let mut req = Request::builder().method(method).uri(path);
    match cred {
        Cred::None => {}
        Cred::Bearer(t) => req = req.header(header::AUTHORIZATION, format!("Bearer {t}")),
        Cred::Basic(u, p) => {
            use base64::Engine as _;
            let v = base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"));
            req = req.header(header::AUTHORIZATION, format!("Basic {v}"));
        }
    }
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        req = req.header(header::HOST, "localhost");
    }
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let mut req = match body {
        Some((ct, b)) => req.header(header::CONTENT_TYPE, ct).body(Body::from(b)),
        None => req.body(Body::empty()),
    }
    .unwrap();
    // Each request from its own client address, as the throttle sees it: these tests are not
    // about throttling (tests/security.rs is), and share one router.
    req.extensions_mut()
        .insert(axum::extract::ConnectInfo(next_client()));
    let resp = router.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .unwrap();
    Resp {
        status,
        headers,
        body: String::from_utf8_lossy(&bytes).into_owned(),
    }
}

impl App {
    /// GET with the bearer token.
    pub async fn get(&self, path: &str) -> Resp {
        send(
            &self.router,
            Method::GET,
            path,
            Cred::Bearer(TOKEN),
            &[],
            None,
        )
        .await
    }

    /// The CSRF cookie a GET of `page` sets (a nonce) and the token of the page's forms.
    /// (`page` may have no form: the bulk confirmation page, which always has one, is asked
    /// then.)
    pub async fn csrf(&self, page: &str) -> (String, String) {
        for p in [page, "/bulk?action=retry"] {
            let r = self.get(p).await;
            let cookie = r
                .set_cookie("taskq_csrf")
                .expect("the page sets a CSRF cookie");
            if let Some(field) = r.csrf_field() {
                return (cookie, field);
            }
        }
        (
            self.get(page).await.set_cookie("taskq_csrf").unwrap(),
            String::new(),
        ) // read-only
    }

    /// A form POST with the bearer token, a CSRF cookie and its token in the form.
    pub async fn post_form(&self, path: &str, fields: &[(&str, &str)]) -> Resp {
        let (cookie, token) = self.csrf("/").await;
        let mut all: Vec<(&str, &str)> = fields.to_vec();
        all.push(("csrf", &token));
        self.post_raw(path, &all, Some(&cookie)).await
    }

    /// A form POST with the bearer token and the given CSRF cookie (if any); `fields` as is.
    pub async fn post_raw(
        &self,
        path: &str,
        fields: &[(&str, &str)],
        cookie: Option<&str>,
    ) -> Resp {
        let body = form(fields);
        let c = cookie.map(|c| format!("taskq_csrf={c}"));
        let mut headers = vec![];
        if let Some(c) = &c {
            headers.push(("cookie", c.as_str()));
        }
        send(
            &self.router,
            Method::POST,
            path,
            Cred::Bearer(TOKEN),
            &headers,
            Some(("application/x-www-form-urlencoded", body)),
        )
        .await
    }

    /// A JSON POST to the API with the bearer token.
    pub async fn api_post(&self, path: &str, body: serde_json::Value) -> Resp {
        send(
            &self.router,
            Method::POST,
            path,
            Cred::Bearer(TOKEN),
            &[],
            Some(("application/json", body.to_string())),
        )
        .await
    }
}

/// A form POST through `router` with the bearer token [`TOKEN`], the CSRF cookie and the
/// form's CSRF field (`fields` may repeat a name). The pair comes from the first of `pages`
/// that has a form; a read-only dashboard has none, and then any field does (the change is
/// refused before the check).
pub async fn post_form(
    router: &Router,
    pages: &[&str],
    path: &str,
    fields: &[(&str, &str)],
) -> Resp {
    let mut pair = None;
    for p in pages {
        let page = send(router, Method::GET, p, Cred::Bearer(TOKEN), &[], None).await;
        let nonce = page.set_cookie("taskq_csrf").expect("a CSRF cookie");
        if let Some(field) = page.csrf_field() {
            pair = Some((nonce, field));
            break;
        }
        pair.get_or_insert((nonce, String::new()));
    }
    let (nonce, token) = pair.expect("a page");
    let mut body = form(fields);
    if !body.is_empty() {
        body.push('&');
    }
    body.push_str(&format!("csrf={token}"));
    let cookie = format!("taskq_csrf={nonce}");
    send(
        router,
        Method::POST,
        path,
        Cred::Bearer(TOKEN),
        &[("cookie", &cookie)],
        Some(("application/x-www-form-urlencoded", body)),
    )
    .await
}

/// `application/x-www-form-urlencoded` encoding of `fields`.
pub fn form(fields: &[(&str, &str)]) -> String {
    fields
        .iter()
        .map(|(k, v)| {
            format!(
                "{}={}",
                form_urlencoded::byte_serialize(k.as_bytes()).collect::<String>(),
                form_urlencoded::byte_serialize(v.as_bytes()).collect::<String>()
            )
        })
        .collect::<Vec<_>>()
        .join("&")
}

/// A dashboard served over HTTP on an ephemeral loopback port, against a fresh test database;
/// the server stops when this is dropped.
pub struct Served {
    /// Its address (`http://{addr}{prefix}/` is the overview).
    pub addr: SocketAddr,
    /// The mount prefix (`""` at the root).
    pub prefix: String,
    /// The database it shows.
    pub db: TestDb,
    server: tokio::task::JoinHandle<()>,
}

impl Served {
    /// `http://127.0.0.1:port{prefix}{path}`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}{}", self.addr, self.prefix, path)
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// Serves a dashboard configured by `configure` (bearer token [`TOKEN`] by default), mounted
/// under `prefix` (`""`: at the root), on `127.0.0.1:0`; `None` (the test skips) when no MySQL
/// server answers.
pub async fn serve(
    prefix: &str,
    configure: impl FnOnce(DashboardBuilder) -> DashboardBuilder,
) -> Option<Served> {
    serve_with(prefix, |b| configure(b.bearer_token(TOKEN))).await
}

/// Like [`serve`], with exactly `configure`'s credentials (none unless it sets them).
pub async fn serve_with(
    prefix: &str,
    configure: impl FnOnce(DashboardBuilder) -> DashboardBuilder,
) -> Option<Served> {
    let db = TestDb::new_or_skip().await?;
    let dashboard = configure(Dashboard::builder(db.pool.clone()))
        .build()
        .expect("valid dashboard configuration");
    let router = if prefix.is_empty() {
        dashboard.router()
    } else {
        Router::new().nest(prefix, dashboard.router())
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let app = router.into_make_service_with_connect_info::<SocketAddr>();
        axum::serve(listener, app).await.unwrap();
    });
    Some(Served {
        addr,
        prefix: prefix.to_owned(),
        db,
        server,
    })
}

/// A plain HTTP/1.1 GET over a TCP stream (no client library): status and body.
pub async fn raw_get(addr: SocketAddr, path: &str, auth: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: {auth}\r\nConnection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.unwrap();
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status = text[9..12].parse().unwrap();
    let body = text.split_once("\r\n\r\n").map_or("", |x| x.1).to_owned();
    (status, body)
}

/// A response read off the wire by [`raw`]: status, headers (names lowercase), body.
#[derive(Debug)]
pub struct RawResp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl RawResp {
    /// The first value of header `name` (lowercase).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
    /// The value the response sets for cookie `name`.
    pub fn set_cookie(&self, name: &str) -> Option<String> {
        self.headers
            .iter()
            .filter(|(k, _)| k == "set-cookie")
            .find_map(|(_, v)| v.strip_prefix(&format!("{name}=")))
            .map(|v| v.split(';').next().unwrap_or("").to_owned())
    }
    /// The value of the first hidden `csrf` field of the page.
    pub fn csrf_field(&self) -> Option<String> {
        let key = "name=\"csrf\" value=\"";
        let i = self.body.find(key)? + key.len();
        let end = self.body[i..].find('"')?;
        Some(self.body[i..i + end].to_owned())
    }
}

/// One HTTP/1.1 request written by hand over TCP from `from` (an address on the loopback
/// network, e.g. `127.0.0.2`, to look like another client), with exactly the headers given
/// (`Host` included: none is added), so that tests can send what browsers and attackers
/// send.
pub async fn raw(
    addr: SocketAddr,
    from: std::net::IpAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> RawResp {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(from, 0)).unwrap();
    let mut s = socket.connect(addr).await.unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str(&format!(
        "Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    ));
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.unwrap();
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines.next().unwrap_or("")[9..12].parse().unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    RawResp {
        status,
        headers,
        body: body.to_owned(),
    }
}
