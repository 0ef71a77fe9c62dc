//! Authentication (bearer token, basic credentials, login sessions), CSRF tokens, read-only
//! refusals, and the per-request page context: one middleware for the pages
//! ([`guard`]) and one for the API ([`api_guard`]).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::{OriginalUri, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use sha2::{Digest, Sha256};

use crate::AppState;

/// Name of the CSRF cookie (double-submit: its value must come back in the `csrf` field).
pub(crate) const CSRF_COOKIE: &str = "taskq_csrf";
/// Name of the one-shot cookie that carries an action's confirmation (`retried.<id>`) from a
/// POST's redirect to the page it lands on, which shows it once and clears it.
pub(crate) const FLASH_COOKIE: &str = "taskq_flash";
/// How long a flash cookie lives if the page it was meant for is never opened.
const FLASH_MAX_AGE: u64 = 60;
/// Name of the login-session cookie.
pub(crate) const SESSION_COOKIE: &str = "taskq_session";
/// Largest form body the guard reads (forms here are a few short fields).
const FORM_LIMIT: usize = 16 * 1024;

/// The configured credentials.
pub(crate) struct Auth {
    token: Option<String>,
    basic: Option<(String, String)>,
    secure: bool,
    session_ttl: Duration,
    /// MAC key of session cookies, derived from the credentials: changing them ends every
    /// session, and every replica with the same configuration accepts the same cookies.
    key: [u8; 32],
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth")
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("basic_user", &self.basic.as_ref().map(|b| &b.0))
            .field("secure", &self.secure)
            .finish()
    }
}

/// How a request was authenticated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Via {
    /// Authentication is off.
    Open,
    /// `Authorization: Bearer`.
    Bearer,
    /// `Authorization: Basic`.
    Basic,
    /// The login-session cookie.
    Session,
}

/// What a page handler knows about its request (set by [`guard`]).
#[derive(Debug, Clone)]
pub(crate) struct Ctx {
    /// The dashboard's root relative to this page (`./`, `../`, `./taskq/`): every link is
    /// `{root}tasks...`.
    pub root: String,
    /// A link to the overview relative to this page (`./`, `../`, `./taskq`, `../../taskq`):
    /// `{root}` itself would name the mount point with a trailing slash, which a router
    /// nested with axum's `nest("/ops/taskq", ..)` does not match.
    pub home: String,
    /// This request's CSRF token, for the hidden field of every form.
    pub csrf: String,
    /// How the request was authenticated (a logout button is shown for sessions).
    pub via: Via,
    /// Who the audit trail records for this request's actions (`web:token`,
    /// `web:basic:<user>`, `web:session`, `web:open`).
    pub actor: String,
    /// The dashboard is read-only.
    pub read_only: bool,
    /// Which login fields to offer.
    pub login_token: bool,
    /// Which login fields to offer.
    pub login_basic: bool,
    /// The flash cookie's value (`<what>.<task id>`), if the request carries a well-formed one.
    pub flash: Option<String>,
}

impl Auth {
    pub(crate) fn new(
        token: Option<String>,
        basic: Option<(String, String)>,
        secure: bool,
        session_ttl: Duration,
    ) -> Self {
        let mut h = Sha256::new();
        h.update(b"taskq-web session key\0");
        for part in [
            token.as_deref().unwrap_or(""),
            basic.as_ref().map_or("", |b| b.0.as_str()),
            basic.as_ref().map_or("", |b| b.1.as_str()),
        ] {
            h.update((part.len() as u64).to_be_bytes());
            h.update(part.as_bytes());
        }
        Self {
            key: h.finalize().into(),
            token,
            basic,
            secure,
            session_ttl,
        }
    }

    fn enabled(&self) -> bool {
        self.token.is_some() || self.basic.is_some()
    }

    /// Checks an `Authorization` header.
    fn check_header(&self, value: &HeaderValue) -> Option<Via> {
        let value = value.to_str().ok()?;
        let (scheme, rest) = value.split_once(' ')?;
        let rest = rest.trim();
        if scheme.eq_ignore_ascii_case("bearer") {
            let token = self.token.as_deref()?;
            return ct_eq(rest.as_bytes(), token.as_bytes()).then_some(Via::Bearer);
        }
        if scheme.eq_ignore_ascii_case("basic") {
            let (user, password) = self.basic.as_ref()?;
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(rest)
                .ok()?;
            let expected = format!("{user}:{password}");
            return ct_eq(&decoded, expected.as_bytes()).then_some(Via::Basic);
        }
        None
    }

    /// Checks the fields of the login form.
    pub(crate) fn check_login(&self, token: &str, user: &str, password: &str) -> bool {
        let by_token = self
            .token
            .as_deref()
            .is_some_and(|t| !token.is_empty() && ct_eq(token.as_bytes(), t.as_bytes()));
        let by_basic = self.basic.as_ref().is_some_and(|(u, p)| {
            !user.is_empty()
                && ct_eq(user.as_bytes(), u.as_bytes()) & ct_eq(password.as_bytes(), p.as_bytes())
        });
        by_token || by_basic
    }

    /// A session cookie value: `<expiry unix seconds>.<hex HMAC-SHA256 of it>`.
    pub(crate) fn new_session(&self) -> String {
        let expires = unix_now() + self.session_ttl.as_secs();
        let msg = expires.to_string();
        format!("{msg}.{}", hex(&hmac(&self.key, msg.as_bytes())))
    }

    fn check_session(&self, value: &str) -> bool {
        let Some((msg, mac)) = value.split_once('.') else {
            return false;
        };
        let Ok(expires) = msg.parse::<u64>() else {
            return false;
        };
        let expected = hex(&hmac(&self.key, msg.as_bytes()));
        ct_eq(mac.as_bytes(), expected.as_bytes()) && expires > unix_now()
    }

    /// `Set-Cookie` for a cookie of this dashboard.
    pub(crate) fn cookie(
        &self,
        name: &str,
        value: &str,
        path: &str,
        max_age: Option<u64>,
    ) -> HeaderValue {
        let mut c = format!("{name}={value}; Path={path}; HttpOnly; SameSite=Strict");
        if let Some(age) = max_age {
            c.push_str(&format!("; Max-Age={age}"));
        }
        if self.secure {
            c.push_str("; Secure");
        }
        HeaderValue::from_str(&c).unwrap_or_else(|_| HeaderValue::from_static("taskq_invalid=1"))
    }

    /// The audit-trail actor of a request authenticated `via` (`{channel}:token`, ...).
    pub(crate) fn actor(&self, channel: &str, via: Via) -> String {
        match via {
            Via::Open => format!("{channel}:open"),
            Via::Bearer => format!("{channel}:token"),
            Via::Basic => format!(
                "{channel}:basic:{}",
                self.basic.as_ref().map_or("", |b| b.0.as_str())
            ),
            Via::Session => format!("{channel}:session"),
        }
    }

    pub(crate) fn session_max_age(&self) -> u64 {
        self.session_ttl.as_secs()
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Constant-time equality of two byte strings of any lengths (compares their SHA-256 digests,
/// so neither the length nor the first differing byte shows in the timing).
pub(crate) fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    let (ha, hb) = (Sha256::digest(a), Sha256::digest(b));
    ha.iter()
        .zip(hb.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

/// HMAC-SHA256 (RFC 2104).
fn hmac(key: &[u8; 32], msg: &[u8]) -> [u8; 32] {
    let mut ipad = [0x36u8; 64];
    let mut opad = [0x5cu8; 64];
    for (i, k) in key.iter().enumerate() {
        ipad[i] ^= k;
        opad[i] ^= k;
    }
    let inner = Sha256::new()
        .chain_update(ipad)
        .chain_update(msg)
        .finalize();
    Sha256::new()
        .chain_update(opad)
        .chain_update(inner)
        .finalize()
        .into()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// 32 random bytes from the operating system, hex-encoded.
fn random_token() -> String {
    let mut b = [0u8; 32];
    getrandom::fill(&mut b).expect("the operating system provides random bytes");
    hex(&b)
}

/// The value of cookie `name` in the request, if any.
pub(crate) fn cookie<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

fn is_token(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The dashboard root relative to the page at `inner` (the path within the dashboard) when
/// the browser asked for `original`: `./` at depth one, one `../` per level deeper; at the
/// mount point without a trailing slash (`/ops/taskq`), `./taskq/`.
pub(crate) fn relative_root(inner: &str, original: &str) -> String {
    if inner == "/" || inner.is_empty() {
        if original.ends_with('/') {
            return "./".into();
        }
        let last = original.rsplit('/').next().unwrap_or("");
        return format!("./{last}/");
    }
    let depth = inner.trim_start_matches('/').matches('/').count();
    if depth == 0 {
        "./".into()
    } else {
        "../".repeat(depth)
    }
}

/// The link to the overview from the page at `inner` (see [`Ctx::home`]).
pub(crate) fn home_link(inner: &str, original: &str) -> String {
    let root = relative_root(inner, original);
    let prefix = mount_prefix(inner, original);
    let last = prefix.rsplit('/').next().unwrap_or("");
    if last.is_empty() || (inner == "/" && original.ends_with('/')) {
        return root;
    }
    if inner == "/" {
        format!("./{last}")
    } else {
        format!("{root}../{last}")
    }
}

/// The path the dashboard is mounted at (`""` at the root; without a trailing slash).
fn mount_prefix<'a>(inner: &str, original: &'a str) -> &'a str {
    let prefix = if inner == "/" && !original.ends_with('/') {
        original
    } else {
        original.strip_suffix(inner).unwrap_or("")
    };
    prefix.trim_end_matches('/')
}

/// The path the dashboard is mounted at, for the cookies' `Path` (`/` when unknown or odd).
fn cookie_path(inner: &str, original: &str) -> String {
    let prefix = mount_prefix(inner, original);
    if prefix.is_empty()
        || !prefix.starts_with('/')
        || prefix
            .bytes()
            .any(|b| b == b';' || b == b',' || b.is_ascii_whitespace() || b.is_ascii_control())
    {
        "/".into()
    } else {
        prefix.to_owned()
    }
}

/// Answers `status` with a short plain-text sentence.
fn refuse(status: StatusCode, why: &'static str) -> Response {
    (status, [(header::CACHE_CONTROL, "no-store")], why).into_response()
}

/// Paths of the pages that change nothing but must be reachable while signed out or
/// read-only.
fn is_login_path(inner: &str) -> bool {
    inner == "/login" || inner == "/logout"
}

/// Middleware of the pages: CSRF cookie, authentication (a login page on failure), CSRF check
/// of every POST, read-only refusals; passes a [`Ctx`] to the handlers.
pub(crate) async fn guard(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let inner = req.uri().path().to_owned();
    let original = req
        .extensions()
        .get::<OriginalUri>()
        .map_or_else(|| inner.clone(), |o| o.path().to_owned());
    let path = cookie_path(&inner, &original);
    let (csrf, minted) = match cookie(req.headers(), CSRF_COOKIE) {
        Some(t) if is_token(t) => (t.to_owned(), false),
        _ => (random_token(), true),
    };
    let mut via = Via::Open;
    if st.auth.enabled() {
        via = match req.headers().get(header::AUTHORIZATION) {
            Some(h) => st.auth.check_header(h),
            None => cookie(req.headers(), SESSION_COOKIE)
                .filter(|v| st.auth.check_session(v))
                .map(|_| Via::Session),
        }
        .unwrap_or(Via::Open);
    }
    let ctx = Ctx {
        actor: st.auth.actor("web", via),
        root: relative_root(&inner, &original),
        home: home_link(&inner, &original),
        csrf: csrf.clone(),
        via,
        read_only: st.read_only,
        login_token: st.auth.token.is_some(),
        login_basic: st.auth.basic.is_some(),
        flash: cookie(req.headers(), FLASH_COOKIE)
            .filter(|v| is_flash(v))
            .map(str::to_owned),
    };
    let signed_in = !st.auth.enabled() || via != Via::Open;
    let mut resp = if !signed_in && !is_login_path(&inner) {
        let mut r = crate::pages::login_page(&ctx, None, StatusCode::UNAUTHORIZED);
        if st.auth.basic.is_some() {
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Basic realm=\"taskq\", charset=\"UTF-8\""),
            );
        }
        r
    } else if req.method() == Method::POST {
        if st.read_only && !is_login_path(&inner) {
            refuse(StatusCode::FORBIDDEN, "the dashboard is read-only")
        } else {
            match check_csrf(req, &csrf, minted).await {
                Ok(mut req) => {
                    req.extensions_mut().insert(ctx);
                    next.run(req).await
                }
                Err(r) => r,
            }
        }
    } else if req.method() == Method::GET || req.method() == Method::HEAD {
        let mut req = req;
        req.extensions_mut().insert(ctx);
        next.run(req).await
    } else {
        refuse(StatusCode::METHOD_NOT_ALLOWED, "method not allowed")
    };
    if minted {
        let c = st.auth.cookie(CSRF_COOKIE, &csrf, &path, None);
        resp.headers_mut().append(header::SET_COOKIE, c);
    }
    // Session cookies set by the login handler carry a placeholder path: fill it in.
    if let Some(v) = resp.headers_mut().remove(SESSION_MARK) {
        let value = v.to_str().unwrap_or("");
        let max_age = if value.is_empty() {
            0
        } else {
            st.auth.session_max_age()
        };
        let c = st.auth.cookie(SESSION_COOKIE, value, &path, Some(max_age));
        resp.headers_mut().append(header::SET_COOKIE, c);
    }
    // Flash cookies set or consumed by a handler, likewise.
    if let Some(v) = resp.headers_mut().remove(FLASH_MARK) {
        let value = v.to_str().unwrap_or("");
        let (value, max_age) = if is_flash(value) {
            (value, FLASH_MAX_AGE)
        } else {
            ("", 0)
        };
        let c = st.auth.cookie(FLASH_COOKIE, value, &path, Some(max_age));
        resp.headers_mut().append(header::SET_COOKIE, c);
    }
    security_headers(resp.headers_mut());
    resp
}

/// Internal response header a handler uses to ask [`guard`] for a flash cookie (value:
/// `<what>.<task id>`, or empty to clear it); never sent to the client.
pub(crate) const FLASH_MARK: &str = "x-taskq-set-flash";

/// A flash value: `<lowercase word>.<digits>`.
fn is_flash(v: &str) -> bool {
    v.split_once('.').is_some_and(|(what, id)| {
        !what.is_empty()
            && what.len() <= 32
            && what.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
            && !id.is_empty()
            && id.len() <= 20
            && id.bytes().all(|b| b.is_ascii_digit())
    })
}

/// Internal response header the login/logout handlers use to ask [`guard`] for a session
/// cookie (value: the session, or empty to clear it); never sent to the client.
pub(crate) const SESSION_MARK: &str = "x-taskq-set-session";

/// Reads the form body of a POST and compares its `csrf` field with the cookie's token in
/// constant time; on success returns the request with its body restored.
async fn check_csrf(req: Request, cookie_token: &str, minted: bool) -> Result<Request, Response> {
    let refused = || {
        refuse(
            StatusCode::FORBIDDEN,
            "CSRF check failed: reload the page and submit the form again",
        )
    };
    if minted {
        return Err(refused()); // no CSRF cookie came with the request
    }
    let (parts, body) = req.into_parts();
    let bytes: Bytes = axum::body::to_bytes(body, FORM_LIMIT)
        .await
        .map_err(|_| refuse(StatusCode::PAYLOAD_TOO_LARGE, "form too large"))?;
    let field = form_field(&bytes, "csrf");
    match field {
        Some(t) if ct_eq(t.as_bytes(), cookie_token.as_bytes()) => {
            Ok(Request::from_parts(parts, Body::from(bytes)))
        }
        _ => Err(refused()),
    }
}

/// The first value of `name` in an `application/x-www-form-urlencoded` body.
fn form_field(body: &[u8], name: &str) -> Option<String> {
    form_urlencoded::parse(body)
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
}

/// Headers every page gets: no caching, no framing, no sniffing, and a content security
/// policy that allows no script at all (the pages have none), as a second line behind the
/// escaping.
fn security_headers(h: &mut HeaderMap) {
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
}

/// Middleware of the API: `Authorization` header only (bearer token or basic credentials; no
/// cookies, so a browser's session cannot be used across sites), read-only refusals, and for
/// a POST authenticated by Basic (which browsers resend on their own) a JSON content type,
/// which a cross-site form cannot send.
pub(crate) async fn api_guard(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let via = if st.auth.enabled() {
        req.headers()
            .get(header::AUTHORIZATION)
            .and_then(|h| st.auth.check_header(h))
    } else {
        Some(Via::Open)
    };
    let Some(via) = via else {
        let mut r = crate::api::error(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "missing or wrong credentials: send Authorization: Bearer <token> (or Basic)",
        );
        r.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer realm=\"taskq\""),
        );
        return r;
    };
    if req.method() == Method::POST {
        if st.read_only {
            return crate::api::error(
                StatusCode::FORBIDDEN,
                "read_only",
                "the dashboard is read-only",
            );
        }
        let json = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/json"));
        if via == Via::Basic && !json {
            return crate::api::error(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "json_required",
                "a POST authenticated with Basic credentials must send Content-Type: application/json",
            );
        }
    }
    let mut req = req;
    req.extensions_mut()
        .insert(ApiActor(st.auth.actor("api", via)));
    let mut resp = next.run(req).await;
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

/// Who the audit trail records for an API request's actions (`api:token`, `api:basic:<user>`,
/// `api:open`).
#[derive(Debug, Clone)]
pub(crate) struct ApiActor(pub String);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roots_are_relative_to_the_page() {
        assert_eq!(relative_root("/", "/"), "./");
        assert_eq!(relative_root("/", "/ops/taskq"), "./taskq/");
        assert_eq!(relative_root("/", "/ops/taskq/"), "./");
        assert_eq!(relative_root("/tasks", "/ops/taskq/tasks"), "./");
        assert_eq!(relative_root("/tasks/5", "/ops/taskq/tasks/5"), "../");
        assert_eq!(
            relative_root("/tasks/5/retry", "/x/tasks/5/retry"),
            "../../"
        );
        assert_eq!(home_link("/", "/"), "./");
        assert_eq!(home_link("/tasks", "/tasks"), "./");
        assert_eq!(home_link("/tasks/5", "/tasks/5"), "../");
        assert_eq!(home_link("/", "/ops/taskq"), "./taskq");
        assert_eq!(home_link("/tasks", "/ops/taskq/tasks"), "./../taskq");
        assert_eq!(home_link("/tasks/5", "/ops/taskq/tasks/5"), "../../taskq");
        assert_eq!(cookie_path("/", "/ops/taskq"), "/ops/taskq");
        assert_eq!(cookie_path("/tasks/5", "/ops/taskq/tasks/5"), "/ops/taskq");
        assert_eq!(cookie_path("/tasks", "/tasks"), "/");
        assert_eq!(cookie_path("/", "/"), "/");
        assert_eq!(cookie_path("/", "/a;b"), "/");
    }

    #[test]
    fn sessions_and_comparisons() {
        let a = Auth::new(
            Some("token-123".into()),
            None,
            false,
            Duration::from_secs(60),
        );
        let s = a.new_session();
        assert!(a.check_session(&s));
        assert!(!a.check_session(&s.replace('.', ".0")));
        let other = Auth::new(
            Some("token-124".into()),
            None,
            false,
            Duration::from_secs(60),
        );
        assert!(!other.check_session(&s));
        let expired = format!("1.{}", hex(&hmac(&a.key, b"1")));
        assert!(!a.check_session(&expired));
        assert!(ct_eq(b"abc", b"abc"));
        assert!(!ct_eq(b"abc", b"abd"));
        assert!(!ct_eq(b"abc", b"abcd"));
        assert!(a.check_login("token-123", "", ""));
        assert!(!a.check_login("", "", ""));
        assert!(!a.check_login("token-12", "", ""));
    }
}
