//! What a page knows about its request, [`Ctx`] (built by the page guard, `auth::guard`, read
//! by the layout in `html` and every page), with the types it is made of. A module of its own
//! so that `html` (which renders it) and `auth` (which builds it, and renders error pages with
//! `html`) do not import each other.

use std::net::IpAddr;

/// Who is signing in: an IP address, or every client at once when the server does not say.
pub(crate) type ClientKey = Option<IpAddr>;

/// A session cookie that checked out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Session {
    /// Its random id (what logout ends, and what the CSRF token of its forms is bound to).
    pub id: String,
    /// When it ends, unix seconds.
    pub expires: u64,
}

/// How a request was authenticated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Via {
    /// Not authenticated (or authentication is off).
    Open,
    /// `Authorization: Bearer`.
    Bearer,
    /// `Authorization: Basic`.
    Basic,
    /// The login-session cookie.
    Session,
}

/// What a page handler knows about its request (set by `auth::guard`).
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
    /// The session of a request authenticated by its cookie (what logout ends).
    pub session: Option<Session>,
    /// Who is asking, for the sign-in throttle.
    pub client: ClientKey,
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
    /// Where the login form returns to: the page that asked for it (a path within the
    /// dashboard, `/tasks?state=dead`), or the `next` parameter of `/login`.
    pub next: Option<String>,
}
