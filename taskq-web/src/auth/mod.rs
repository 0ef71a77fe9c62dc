//! Authentication (bearer token, basic credentials, login sessions), CSRF tokens, the origin
//! checks of every change, read-only refusals, and the per-request page context: one
//! middleware for the pages ([`guard`]) and one for the API ([`api_guard`]).
//!
//! - [`keys`]: the secret, session cookies and their ending, CSRF tokens bound to the session;
//! - [`origin`]: the `Host` names answered and the same-origin check of changes;
//! - [`throttle`]: failed sign-ins slowed down per client and overall;
//! - [`paths`]: links and cookie paths relative to the page asked for.

mod keys;
mod origin;
mod paths;
mod throttle;

use std::net::SocketAddr;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, OriginalUri, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;

use crate::AppState;
use crate::ctx::{Ctx, Session, Via};
pub(crate) use keys::MIN_SECRET_LEN;
use keys::{Keys, ct_eq, hex, random_bytes};
pub(crate) use origin::{HostPattern, Hosts};
use paths::{cookie_path, home_link, relative_root};
use throttle::{ClientKey, Throttle};

/// Name of the CSRF cookie: a random nonce; the forms' `csrf` field is a MAC of it and of the
/// session (or credential) the request is authenticated by.
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
/// Largest plain-text error body turned into an error page or a JSON error.
const ERROR_LIMIT: usize = 4 * 1024;

/// What [`Auth::new`] is made from.
pub(crate) struct AuthConfig {
    pub token: Option<String>,
    pub basic: Option<(String, String)>,
    pub secure: bool,
    pub session_ttl: Duration,
    /// The configured session secret (replicas that share it accept each other's sessions);
    /// `None`: a random one for this process.
    pub secret: Option<Vec<u8>>,
    pub hosts: Hosts,
}

/// The configured credentials, keys, host names and sign-in throttle.
pub(crate) struct Auth {
    token: Option<String>,
    basic: Option<(String, String)>,
    secure: bool,
    session_ttl: Duration,
    keys: Keys,
    throttle: Throttle,
    hosts: Hosts,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth")
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("basic_user", &self.basic.as_ref().map(|b| &b.0))
            .field("secure", &self.secure)
            .field("hosts", &self.hosts)
            .finish()
    }
}

/// Why a sign-in attempt got no answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Throttled(pub Duration);

impl Auth {
    pub(crate) fn new(c: AuthConfig) -> Self {
        let parts = [
            c.token.as_deref().unwrap_or(""),
            c.basic.as_ref().map_or("", |b| b.0.as_str()),
            c.basic.as_ref().map_or("", |b| b.1.as_str()),
        ];
        Self {
            keys: Keys::new(c.secret.as_deref(), &parts, c.session_ttl),
            token: c.token,
            basic: c.basic,
            secure: c.secure,
            session_ttl: c.session_ttl,
            throttle: Throttle::default(),
            hosts: c.hosts,
        }
    }

    fn enabled(&self) -> bool {
        self.token.is_some() || self.basic.is_some()
    }

    /// Checks an `Authorization` header (throttled: a locked-out client is not checked).
    fn check_header(
        &self,
        value: &HeaderValue,
        client: ClientKey,
    ) -> Result<Option<Via>, Throttled> {
        self.throttle.check(client).map_err(Throttled)?;
        let via = self.header_via(value);
        self.record(client, via.is_some(), "Authorization header");
        Ok(via)
    }

    fn header_via(&self, value: &HeaderValue) -> Option<Via> {
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

    /// Checks the fields of the login form (throttled: a locked-out client is not checked).
    pub(crate) fn check_login(
        &self,
        client: ClientKey,
        token: &str,
        user: &str,
        password: &str,
    ) -> Result<bool, Throttled> {
        self.throttle.check(client).map_err(Throttled)?;
        let by_token = self
            .token
            .as_deref()
            .is_some_and(|t| !token.is_empty() && ct_eq(token.as_bytes(), t.as_bytes()));
        let by_basic = self.basic.as_ref().is_some_and(|(u, p)| {
            !user.is_empty()
                && ct_eq(user.as_bytes(), u.as_bytes()) & ct_eq(password.as_bytes(), p.as_bytes())
        });
        let ok = by_token || by_basic;
        self.record(client, ok, "login form");
        Ok(ok)
    }

    /// Counts a sign-in attempt for the throttle; failures are logged at WARN.
    fn record(&self, client: ClientKey, ok: bool, how: &str) {
        if ok {
            self.throttle.succeeded(client);
            return;
        }
        let (failures, locked) = self.throttle.failed(client);
        let who = client.map_or_else(|| "unknown".to_owned(), |ip| ip.to_string());
        if locked {
            tracing::warn!(
                client = %who, failures, via = how,
                "taskq-web: failed sign-in; this client is throttled"
            );
        } else {
            tracing::warn!(client = %who, failures, via = how, "taskq-web: failed sign-in");
        }
    }

    /// A new session cookie value.
    pub(crate) fn new_session(&self) -> String {
        self.keys.new_session()
    }

    /// Ends `session` (logout).
    pub(crate) fn end_session(&self, session: &Session) {
        self.keys.end_session(session);
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

    /// What a form's CSRF token is bound to besides the nonce.
    fn csrf_binding(&self, via: Via, session: Option<&Session>) -> String {
        match (via, session) {
            (Via::Session, Some(s)) => format!("session:{}", s.id),
            (Via::Basic, _) => {
                format!("basic:{}", self.basic.as_ref().map_or("", |b| b.0.as_str()))
            }
            (Via::Bearer, _) => "bearer".into(),
            _ => "anonymous".into(),
        }
    }
}

/// The client address the server recorded (`ConnectInfo<SocketAddr>`), if any.
fn client_of(req: &Request) -> ClientKey {
    req.extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip())
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

/// A path within the dashboard that the login form may return to: absolute within the
/// dashboard (`/tasks?state=dead`), no scheme, host or backslash, no dot segment (`.` or `..`,
/// plain or percent-encoded: a browser resolves `/%2e%2e/` as `/../`, which would take the
/// redirect out of the dashboard's prefix), not the login pages.
pub(crate) fn safe_next(s: &str) -> Option<String> {
    let path = s.split(['?', '#']).next().unwrap_or_default();
    let ok = s.starts_with('/')
        && !s.starts_with("//")
        && s.len() <= 2048
        && !s
            .bytes()
            .any(|b| b == b'\\' || b.is_ascii_control() || b.is_ascii_whitespace())
        && !path.split('/').any(is_dot_segment)
        && !matches!(path, "/login" | "/logout");
    ok.then(|| s.to_owned())
}

/// Whether a path segment is `.` or `..` once `%2e` / `%2E` are read as dots (as the URL
/// standard's path parser does).
fn is_dot_segment(seg: &str) -> bool {
    let seg = seg.to_ascii_lowercase().replace("%2e", ".");
    seg == "." || seg == ".."
}

/// Where a login page served for `inner` (with `query`) returns to.
fn next_of(inner: &str, query: Option<&str>) -> Option<String> {
    if inner == "/login" {
        let q = query?;
        let next = form_urlencoded::parse(q.as_bytes())
            .find(|(k, _)| k == "next")
            .map(|(_, v)| v.into_owned())?;
        return safe_next(&next);
    }
    match query {
        Some(q) => safe_next(&format!("{inner}?{q}")),
        None => safe_next(inner),
    }
}

/// Answers `status` with a short plain-text sentence (turned into the dashboard's error page
/// or a JSON error by the guards).
fn refuse(status: StatusCode, why: impl Into<String>) -> Response {
    (status, [(header::CACHE_CONTROL, "no-store")], why.into()).into_response()
}

/// Paths of the pages that change nothing but must be reachable while signed out or
/// read-only.
fn is_login_path(inner: &str) -> bool {
    inner == "/login" || inner == "/logout"
}

/// The 421 of a request for a host name the dashboard does not answer.
fn wrong_host() -> Response {
    refuse(
        StatusCode::MISDIRECTED_REQUEST,
        "this dashboard does not answer that host name (see allowed_hosts / --allowed-host)",
    )
}

/// The sentence of a refused cross-site change.
fn cross_site_refusal(why: &str) -> String {
    format!("cross-site request refused ({why}): changes must come from the dashboard's own pages")
}

fn too_many(retry: Duration) -> Response {
    let secs = retry.as_secs().max(1);
    let mut r = refuse(
        StatusCode::TOO_MANY_REQUESTS,
        format!("too many failed sign-ins: try again in {secs} s"),
    );
    if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
        r.headers_mut().insert(header::RETRY_AFTER, v);
    }
    r
}

/// The message of a plain-text error response (an extractor's rejection, a refusal), if `r`
/// is one; `None` leaves `r` as it is.
async fn plain_error(r: Response) -> Result<(StatusCode, HeaderMap, String), Response> {
    let is_plain = r
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/plain"));
    if !(r.status().is_client_error() || r.status().is_server_error()) || !is_plain {
        return Err(r);
    }
    let (parts, body) = r.into_parts();
    let text = match axum::body::to_bytes(body, ERROR_LIMIT).await {
        Ok(b) => String::from_utf8_lossy(&b).into_owned(),
        Err(_) => parts
            .status
            .canonical_reason()
            .unwrap_or("error")
            .to_owned(),
    };
    Ok((parts.status, parts.headers, text))
}

/// Middleware of the pages: host check, CSRF cookie, authentication (a login page on
/// failure), for every POST the same-origin check, the read-only refusal and the CSRF check;
/// passes a [`Ctx`] to the handlers and turns their plain-text failures into error pages.
pub(crate) async fn guard(State(st): State<AppState>, req: Request, next: Next) -> Response {
    if !st.auth.hosts.allows(req.headers(), req.uri()) {
        let mut r = wrong_host();
        security_headers(r.headers_mut());
        return r;
    }
    let inner = req.uri().path().to_owned();
    let original = req
        .extensions()
        .get::<OriginalUri>()
        .map_or_else(|| inner.clone(), |o| o.path().to_owned());
    let path = cookie_path(&inner, &original);
    let (nonce, minted) = match cookie(req.headers(), CSRF_COOKIE) {
        Some(t) if is_token(t) => (t.to_owned(), false),
        _ => (hex(&random_bytes()), true),
    };
    let client = client_of(&req);
    let mut via = Via::Open;
    let mut session = None;
    let mut throttled = None;
    if st.auth.enabled() {
        match req.headers().get(header::AUTHORIZATION) {
            Some(h) => match st.auth.check_header(h, client) {
                Ok(v) => via = v.unwrap_or(Via::Open),
                Err(t) => throttled = Some(t),
            },
            None => {
                session = cookie(req.headers(), SESSION_COOKIE)
                    .and_then(|v| st.auth.keys.check_session(v));
                if session.is_some() {
                    via = Via::Session;
                }
            }
        }
    }
    let csrf = st
        .auth
        .keys
        .csrf_token(&st.auth.csrf_binding(via, session.as_ref()), &nonce);
    let ctx = Ctx {
        actor: st.auth.actor("web", via),
        root: relative_root(&inner, &original),
        home: home_link(&inner, &original),
        csrf: csrf.clone(),
        via,
        session,
        client,
        read_only: st.read_only,
        login_token: st.auth.token.is_some(),
        login_basic: st.auth.basic.is_some(),
        flash: cookie(req.headers(), FLASH_COOKIE)
            .filter(|v| is_flash(v))
            .map(str::to_owned),
        next: next_of(&inner, req.uri().query()),
    };
    let signed_in = !st.auth.enabled() || via != Via::Open;
    let resp = if let Some(Throttled(retry)) = throttled {
        too_many(retry)
    } else if !signed_in && !is_login_path(&inner) {
        let mut r = crate::pages::login_page(&ctx, None, StatusCode::UNAUTHORIZED);
        if st.auth.basic.is_some() {
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Basic realm=\"taskq\", charset=\"UTF-8\""),
            );
        }
        r
    } else if req.method() == Method::POST {
        if let Some(why) = origin::cross_site(req.headers(), req.uri(), &st.auth.hosts) {
            refuse(StatusCode::FORBIDDEN, cross_site_refusal(&why))
        } else if st.read_only && !is_login_path(&inner) {
            refuse(StatusCode::FORBIDDEN, "the dashboard is read-only")
        } else {
            match check_csrf(req, &csrf, minted).await {
                Ok(mut req) => {
                    req.extensions_mut().insert(ctx.clone());
                    next.run(req).await
                }
                Err(r) => r,
            }
        }
    } else if req.method() == Method::GET || req.method() == Method::HEAD {
        let mut req = req;
        req.extensions_mut().insert(ctx.clone());
        next.run(req).await
    } else {
        refuse(StatusCode::METHOD_NOT_ALLOWED, "method not allowed")
    };
    let mut resp = match plain_error(resp).await {
        Ok((status, headers, text)) => {
            let mut r = crate::html::error_page(&ctx, status, text.trim());
            if let Some(v) = headers.get(header::RETRY_AFTER) {
                r.headers_mut().insert(header::RETRY_AFTER, v.clone());
            }
            r
        }
        Err(r) => r,
    };
    if minted {
        let c = st.auth.cookie(CSRF_COOKIE, &nonce, &path, None);
        resp.headers_mut().append(header::SET_COOKIE, c);
    }
    // Session cookies set by the login handler carry a placeholder path: fill it in.
    if let Some(v) = resp.headers_mut().remove(SESSION_MARK) {
        let value = v.to_str().unwrap_or("");
        let max_age = if value.is_empty() {
            0
        } else {
            st.auth.session_ttl.as_secs()
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

/// Reads the form body of a POST and compares its `csrf` field with the request's token in
/// constant time; on success returns the request with its body restored.
async fn check_csrf(req: Request, token: &str, minted: bool) -> Result<Request, Response> {
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
        Some(t) if ct_eq(t.as_bytes(), token.as_bytes()) => {
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

/// Headers every API response gets: no caching, no sniffing, a policy that allows nothing
/// (a JSON document opened in a browser runs nothing and cannot be framed).
fn api_security_headers(h: &mut HeaderMap) {
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("default-src 'none'; frame-ancestors 'none'; sandbox"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
}

/// Middleware of the API: host check; `Authorization` header only (bearer token or basic
/// credentials; no cookies, so a browser's session cannot be used across sites), throttled;
/// for every POST, whatever the authentication mode, the same-origin check, the read-only
/// refusal and a JSON content type (which neither a cross-site form nor a cross-site
/// `fetch` without a CORS preflight can send); plain-text failures become JSON errors.
pub(crate) async fn api_guard(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let mut resp = api_check(&st, req, next).await;
    if let Ok((status, headers, text)) = plain_error_ref(&mut resp).await {
        let code = match status {
            StatusCode::NOT_FOUND => "not_found",
            StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
            StatusCode::UNSUPPORTED_MEDIA_TYPE => "json_required",
            StatusCode::PAYLOAD_TOO_LARGE => "too_large",
            StatusCode::UNPROCESSABLE_ENTITY => "invalid",
            StatusCode::TOO_MANY_REQUESTS => "too_many_requests",
            StatusCode::MISDIRECTED_REQUEST => "wrong_host",
            s if s.is_server_error() => "internal",
            _ => "bad_request",
        };
        let mut r = crate::json::error(status, code, text.trim());
        for h in [header::RETRY_AFTER, header::WWW_AUTHENTICATE, header::ALLOW] {
            if let Some(v) = headers.get(&h) {
                r.headers_mut().insert(h, v.clone());
            }
        }
        resp = r;
    }
    api_security_headers(resp.headers_mut());
    resp
}

/// Replaces a plain-text error in place by an empty body and returns its parts.
async fn plain_error_ref(resp: &mut Response) -> Result<(StatusCode, HeaderMap, String), ()> {
    let r = std::mem::replace(resp, Response::new(Body::empty()));
    match plain_error(r).await {
        Ok(parts) => Ok(parts),
        Err(r) => {
            *resp = r;
            Err(())
        }
    }
}

async fn api_check(st: &AppState, req: Request, next: Next) -> Response {
    if !st.auth.hosts.allows(req.headers(), req.uri()) {
        return wrong_host();
    }
    let client = client_of(&req);
    let via = if st.auth.enabled() {
        match req.headers().get(header::AUTHORIZATION) {
            Some(h) => match st.auth.check_header(h, client) {
                Ok(v) => v,
                Err(Throttled(retry)) => return too_many(retry),
            },
            None => None,
        }
    } else {
        Some(Via::Open)
    };
    let Some(via) = via else {
        let mut r = crate::json::error(
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
    if req.method() != Method::GET && req.method() != Method::HEAD {
        if let Some(why) = origin::cross_site(req.headers(), req.uri(), &st.auth.hosts) {
            return crate::json::error(
                StatusCode::FORBIDDEN,
                "cross_site",
                &cross_site_refusal(&why),
            );
        }
        if st.read_only {
            return crate::json::error(
                StatusCode::FORBIDDEN,
                "read_only",
                "the dashboard is read-only",
            );
        }
        let json = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| {
                let essence = v.split(';').next().unwrap_or("").trim();
                essence.eq_ignore_ascii_case("application/json")
            });
        if !json {
            return crate::json::error(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "json_required",
                "a change must send Content-Type: application/json",
            );
        }
    }
    let mut req = req;
    req.extensions_mut()
        .insert(ApiActor(st.auth.actor("api", via)));
    next.run(req).await
}

/// Who the audit trail records for an API request's actions (`api:token`, `api:basic:<user>`,
/// `api:open`).
#[derive(Debug, Clone)]
pub(crate) struct ApiActor(pub String);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn login_returns_only_to_paths_within_the_dashboard() {
        assert_eq!(
            safe_next("/tasks?state=dead").as_deref(),
            Some("/tasks?state=dead")
        );
        assert_eq!(safe_next("/tasks/5").as_deref(), Some("/tasks/5"));
        // Dots inside a segment or in the query are not dot segments.
        assert_eq!(safe_next("/queues/a..b").as_deref(), Some("/queues/a..b"));
        assert_eq!(
            safe_next("/tasks?name=../x").as_deref(),
            Some("/tasks?name=../x")
        );
        for bad in [
            "//evil.example/x",
            "https://evil.example",
            "/\\evil.example",
            "tasks",
            "/login",
            "/login?next=/x",
            "/logout",
            "/a b",
            "/a\nb",
            // Issue 34 S5: dot segments, plain or percent-encoded in any case mix.
            "/%2e%2e/%2e%2e/x",
            "/%2E%2e/x",
            "/.%2e/x",
            "/%2e./x",
            "/tasks/../../x",
            "/..",
            "/./x",
            "/%2e/x",
            "/tasks/%2e%2e?x=1",
        ] {
            assert_eq!(safe_next(bad), None, "{bad:?}");
        }
        assert_eq!(
            next_of("/login", Some("next=%2Ftasks%3Fstate%3Ddead")).as_deref(),
            Some("/tasks?state=dead")
        );
        assert_eq!(next_of("/login", Some("next=%2F%2Fevil")), None);
        assert_eq!(
            next_of("/tasks", Some("q=1")).as_deref(),
            Some("/tasks?q=1")
        );
    }
}
