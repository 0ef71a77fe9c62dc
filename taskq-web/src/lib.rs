//! # taskq-web
//!
//! A web dashboard and a JSON HTTP API for [taskq], as an [`axum::Router`] that mounts
//! under any path prefix of an axum app (or runs on its own: `taskq web` in the CLI).
//!
//! - **Pages** (server-rendered HTML, no JavaScript): an overview (tasks per queue and state,
//!   tasks finished and attempts failed per minute, oldest due pending task, queue limits,
//!   paused queues, workers; it refreshes itself), task lists filtered by queue, name and state with keyset pagination, a task
//!   page, workflows (a list, and a workflow's steps and graph), batches (a list, and a
//!   batch's counters, callbacks and members), and the actions: retry a dead
//!   task, cancel, pause and resume a queue, cancel a workflow or retry its failed steps,
//!   cancel or seal a batch, and
//!   bulk retry / cancel / purge by filter behind a confirmation page that shows the count
//!   first.
//! - **API** under `api/v1/` (JSON; described by the OpenAPI 3 document at
//!   `api/v1/openapi.json`): queue stats, list and get tasks, workflows and batches, cancel,
//!   retry, seal,
//!   pause, resume, and
//!   enqueue a task by name with a JSON payload, checked against the tasks registered in the
//!   serving binary ([`taskq::registry::registration`]).
//! - **Safety**: authentication is on unless turned off explicitly
//!   ([`DashboardBuilder::insecure_no_auth`]); failed sign-ins are throttled and logged;
//!   sessions are signed with a random (or configured) secret, capped in lifetime and ended by
//!   logout; every change, in every mode, must come from the same origin (`Origin` /
//!   `Sec-Fetch-Site`), API changes must be JSON, and form POSTs carry a CSRF token bound to
//!   the session; only the allowed `Host` names are answered; a read-only mode hides and
//!   refuses every change; everything read from the database is HTML-escaped; page sizes are
//!   capped and bulk changes run through taskq's batched bulk APIs.
//!
//! ```no_run
//! use axum::Router;
//!
//! # async fn demo(pool: sqlx::MySqlPool) -> Result<(), Box<dyn std::error::Error>> {
//! let dashboard = taskq_web::Dashboard::builder(pool)
//!     .bearer_token(std::env::var("TASKQ_WEB_TOKEN")?)
//!     .build()?;
//! let app: Router = Router::new()
//!     // .route("/", ...) your own routes
//!     .nest("/ops/taskq", dashboard.router());
//! # let _ = app;
//! # Ok(()) }
//! ```
//!
//! See `docs/dashboard.md` in the repository for the full guide.

mod actions;
mod api;
mod auth;
mod batches;
mod batches_api;
mod ctx;
mod event_actions;
mod html;
mod json;
mod pages;
mod stats;
mod views;
mod views_api;
mod workflows;
mod workflows_api;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use taskq::Client;

pub use api::api_routes;

/// Default number of tasks on one page of a list.
pub const DEFAULT_PAGE_SIZE: u32 = 50;
/// Largest page size [`DashboardBuilder::max_page_size`] accepts.
pub const MAX_PAGE_SIZE: u32 = 1_000;

/// Longest [`DashboardBuilder::session_ttl`].
pub const MAX_SESSION_TTL: Duration = Duration::from_secs(30 * 86_400);
/// Fewest bytes of a [`DashboardBuilder::session_secret`].
pub const MIN_SESSION_SECRET_LEN: usize = auth::MIN_SECRET_LEN;

/// Default of [`DashboardBuilder::terminal_counts_max_age`].
pub const DEFAULT_TERMINAL_COUNTS_MAX_AGE: Duration = Duration::from_secs(30);

/// Why a [`DashboardBuilder`] was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(String);

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "invalid dashboard configuration: {}", self.0)
    }
}

impl std::error::Error for ConfigError {}

/// Configuration of a [`Dashboard`]; see [`Dashboard::builder`].
#[derive(Debug, Clone)]
#[must_use = "a DashboardBuilder does nothing until build() is called"]
pub struct DashboardBuilder {
    client: Client,
    token: Option<String>,
    basic: Option<(String, String)>,
    no_auth: bool,
    read_only: bool,
    page_size: u32,
    max_page_size: u32,
    throughput_minutes: u32,
    terminal_max_age: Duration,
    refresh: Duration,
    secure_cookies: bool,
    session_ttl: Duration,
    session_secret: Option<Vec<u8>>,
    allowed_hosts: Option<Vec<String>>,
}

/// The dashboard and API: build it with [`Dashboard::builder`], serve [`Dashboard::router`].
/// Cheap to clone.
#[derive(Debug, Clone)]
pub struct Dashboard {
    inner: Arc<Inner>,
}

/// What every handler reads.
#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) client: Client,
    pub(crate) auth: auth::Auth,
    pub(crate) read_only: bool,
    pub(crate) page_size: u32,
    pub(crate) max_page_size: u32,
    pub(crate) throughput_minutes: u32,
    pub(crate) refresh_secs: u64,
    /// Longest time the overview reuses the terminal counts for.
    pub(crate) terminal_max_age: Duration,
    pub(crate) terminal: stats::TerminalCache,
    /// The due tasks no live worker handles, reused as long as the terminal counts.
    pub(crate) unhandled: stats::UnhandledCache,
}

pub(crate) type AppState = Arc<Inner>;

impl Dashboard {
    /// Starts a configuration on `pool` (a pool on the database taskq uses — a `MySqlPool`, or
    /// with taskq's `sqlite` feature a `SqlitePool`; a handful of connections is plenty).
    ///
    /// Authentication is required by default: give a [`bearer_token`](DashboardBuilder::bearer_token)
    /// and/or [`basic_auth`](DashboardBuilder::basic_auth) credentials, or turn it off with
    /// [`insecure_no_auth`](DashboardBuilder::insecure_no_auth); otherwise
    /// [`build`](DashboardBuilder::build) fails.
    pub fn builder<DB: taskq::Backend>(pool: sqlx::Pool<DB>) -> DashboardBuilder {
        Self::builder_with_client(Client::new(pool))
    }

    /// Like [`builder`](Self::builder), from a [`Client`].
    pub fn builder_with_client(client: Client) -> DashboardBuilder {
        DashboardBuilder {
            client,
            token: None,
            basic: None,
            no_auth: false,
            read_only: false,
            page_size: DEFAULT_PAGE_SIZE,
            max_page_size: 200,
            throughput_minutes: 15,
            terminal_max_age: DEFAULT_TERMINAL_COUNTS_MAX_AGE,
            refresh: Duration::from_secs(5),
            secure_cookies: false,
            session_ttl: Duration::from_secs(12 * 3600),
            session_secret: None,
            allowed_hosts: None,
        }
    }

    /// The router: pages at its root (`/`, `/tasks`, `/tasks/{id}`, ...) and the API under
    /// `/api/v1`. Serve it as it is, or mount it with `Router::nest("/some/prefix", ..)`:
    /// every link, redirect and form action it emits is relative, so it works under any
    /// prefix (including behind a proxy that strips one).
    pub fn router(&self) -> Router {
        let state = self.inner.clone();
        // `layer`, not `route_layer`: unknown paths under the dashboard get its guard too
        // (no probing without credentials) and its own 404 (an error page, a JSON error).
        let pages =
            pages::routes()
                .fallback(pages::not_found)
                .layer(axum::middleware::from_fn_with_state(
                    state.clone(),
                    auth::guard,
                ));
        let api =
            api::router()
                .fallback(api::not_found)
                .layer(axum::middleware::from_fn_with_state(
                    state.clone(),
                    auth::api_guard,
                ));
        Router::new()
            .merge(pages)
            .nest("/api/v1", api)
            .with_state(state)
    }

    /// Whether this dashboard refuses every change.
    pub fn is_read_only(&self) -> bool {
        self.inner.read_only
    }
}

impl DashboardBuilder {
    /// Accepts `Authorization: Bearer <token>` (API and pages), and the token on the login
    /// page (which then sets a session cookie).
    pub fn bearer_token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// Accepts HTTP Basic credentials (`Authorization: Basic ..`; browsers ask for them), and
    /// the same user and password on the login page.
    pub fn basic_auth(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.basic = Some((user.into(), password.into()));
        self
    }

    /// Serves everything without authentication. Only for a dashboard that something else
    /// protects (an authenticating proxy, an auth layer of your app around the router, a
    /// loopback-only listener on a single-user machine). Changes are still refused from
    /// other sites (origin checks, JSON-only API changes, CSRF tokens), and unless
    /// [`allowed_hosts`](Self::allowed_hosts) says otherwise only the loopback host names are
    /// answered.
    pub fn insecure_no_auth(mut self) -> Self {
        self.no_auth = true;
        self
    }

    /// Refuses every change (403) and shows no control that would make one.
    pub fn read_only(mut self, read_only: bool) -> Self {
        self.read_only = read_only;
        self
    }

    /// Tasks per list page when the request does not say (default [`DEFAULT_PAGE_SIZE`]).
    pub fn page_size(mut self, n: u32) -> Self {
        self.page_size = n;
        self
    }

    /// Most tasks one list page or API call returns, whatever the request asks (default 200,
    /// at most [`MAX_PAGE_SIZE`]).
    pub fn max_page_size(mut self, n: u32) -> Self {
        self.max_page_size = n;
        self
    }

    /// Minutes of finished-task counts the overview shows (default 15, 1 to 60).
    pub fn throughput_minutes(mut self, minutes: u32) -> Self {
        self.throughput_minutes = minutes;
        self
    }

    /// How long the overview and `GET /api/v1/queues` reuse the counts of terminal tasks
    /// (`succeeded`, `dead`, `canceled`, `expired`) before counting them again (default
    /// [`DEFAULT_TERMINAL_COUNTS_MAX_AGE`]; zero counts them on every request). Counting
    /// them reads every terminal task's index entry (about 0.2 to 0.5 s per million tasks), so
    /// one request counts and the others, and those within the age, reuse its result; the
    /// page says when they were counted. Pending and running counts are always exact and
    /// current.
    pub fn terminal_counts_max_age(mut self, age: Duration) -> Self {
        self.terminal_max_age = age;
        self
    }

    /// How often the overview reloads itself (default 5 s; zero turns it off).
    pub fn refresh_interval(mut self, every: Duration) -> Self {
        self.refresh = every;
        self
    }

    /// Marks the cookies `Secure` (sent over HTTPS only). Turn it on when the dashboard is
    /// served over HTTPS, directly or through a proxy.
    pub fn secure_cookies(mut self, secure: bool) -> Self {
        self.secure_cookies = secure;
        self
    }

    /// How long a login-page session lasts from sign-in (default 12 hours, at most
    /// [`MAX_SESSION_TTL`]); a session cookie claiming more is refused.
    pub fn session_ttl(mut self, ttl: Duration) -> Self {
        self.session_ttl = ttl;
        self
    }

    /// The secret that signs session cookies and CSRF tokens: at least
    /// [`MIN_SESSION_SECRET_LEN`] bytes, e.g. 32 random bytes from a secret store. Replicas
    /// behind one load balancer must share it to accept each other's sessions. Default: a
    /// random secret per process (sessions end when it restarts). Session keys are derived
    /// from the secret *and* the credentials, so changing the token or password ends every
    /// session.
    pub fn session_secret(mut self, secret: impl AsRef<[u8]>) -> Self {
        self.session_secret = Some(secret.as_ref().to_vec());
        self
    }

    /// The `Host` names (`dash.example.com`, or with a port, `dash.example.com:8443`) the
    /// dashboard answers; any other gets 421, which defeats DNS rebinding. An `Origin` naming
    /// one of them also counts as same-origin for changes (for a proxy that rewrites `Host`),
    /// so list only names that serve this dashboard.
    /// Default: with authentication off, the loopback names only (`localhost`, `127.0.0.1`,
    /// `[::1]`, any port); with authentication on, any name.
    pub fn allowed_hosts<I, S>(mut self, hosts: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.allowed_hosts = Some(hosts.into_iter().map(Into::into).collect());
        self
    }

    /// Checks the configuration.
    pub fn build(self) -> Result<Dashboard, ConfigError> {
        if self.token.as_deref().is_some_and(|t| t.trim().len() < 8) {
            return Err(ConfigError(
                "the bearer token must have at least 8 characters".into(),
            ));
        }
        if let Some((user, password)) = &self.basic
            && (user.is_empty() || user.contains(':') || password.is_empty())
        {
            return Err(ConfigError(
                "basic auth needs a user without ':' and a non-empty password".into(),
            ));
        }
        let has_credentials = self.token.is_some() || self.basic.is_some();
        if !has_credentials && !self.no_auth {
            return Err(ConfigError(
                "no credentials: set bearer_token(..) and/or basic_auth(..), or opt out explicitly with insecure_no_auth()".into(),
            ));
        }
        if has_credentials && self.no_auth {
            return Err(ConfigError(
                "insecure_no_auth() together with credentials: choose one".into(),
            ));
        }
        if self.page_size == 0 || self.max_page_size == 0 || self.max_page_size > MAX_PAGE_SIZE {
            return Err(ConfigError(format!(
                "page sizes must be between 1 and {MAX_PAGE_SIZE}"
            )));
        }
        if !(1..=60).contains(&self.throughput_minutes) {
            return Err(ConfigError(
                "throughput_minutes must be between 1 and 60".into(),
            ));
        }
        if self.session_ttl.is_zero() || self.session_ttl > MAX_SESSION_TTL {
            return Err(ConfigError(
                "session_ttl must be between 1 s and 30 days".into(),
            ));
        }
        if let Some(secret) = &self.session_secret
            && secret.len() < MIN_SESSION_SECRET_LEN
        {
            return Err(ConfigError(format!(
                "the session secret must have at least {MIN_SESSION_SECRET_LEN} bytes"
            )));
        }
        let hosts = match &self.allowed_hosts {
            Some(list) if list.is_empty() => {
                return Err(ConfigError(
                    "allowed_hosts must name at least one host".into(),
                ));
            }
            Some(list) => auth::Hosts::Only(
                list.iter()
                    .map(|h| auth::HostPattern::parse(h))
                    .collect::<Result<_, _>>()
                    .map_err(ConfigError)?,
            ),
            None if self.no_auth => auth::Hosts::Loopback,
            None => auth::Hosts::Any,
        };
        Ok(Dashboard {
            inner: Arc::new(Inner {
                client: self.client,
                auth: auth::Auth::new(auth::AuthConfig {
                    token: self.token,
                    basic: self.basic,
                    secure: self.secure_cookies,
                    session_ttl: self.session_ttl,
                    secret: self.session_secret,
                    hosts,
                }),
                read_only: self.read_only,
                page_size: self.page_size.min(self.max_page_size),
                max_page_size: self.max_page_size,
                throughput_minutes: self.throughput_minutes,
                refresh_secs: self.refresh.as_secs(),
                terminal_max_age: self.terminal_max_age,
                terminal: stats::TerminalCache::default(),
                unhandled: stats::UnhandledCache::default(),
            }),
        })
    }
}
