//! Signing in and out: the login page (also the body of every 401 of the pages), its form,
//! and the logout action.

use std::fmt::Write as _;

use axum::Extension;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use serde::Deserialize;

use super::see_other;
use crate::AppState;
use crate::auth::{SESSION_MARK, Throttled, safe_next};
use crate::ctx::Ctx;
use crate::html::{csrf_field, esc, page, respond};

/// The login page (also the body of every 401 of the pages).
pub(crate) fn login_page(ctx: &Ctx, error: Option<&str>, status: StatusCode) -> Response {
    let mut b = String::from("<h1>Sign in</h1>");
    if let Some(e) = error {
        let _ = write!(b, r#"<p class="error">{}</p>"#, esc(e));
    }
    if !ctx.login_token && !ctx.login_basic {
        b.push_str("<p>Authentication is off.</p>");
    } else {
        let _ = write!(
            b,
            r#"<form method="post" action="{}login">{}"#,
            esc(&ctx.root),
            csrf_field(ctx)
        );
        if let Some(next) = &ctx.next {
            let _ = write!(
                b,
                r#"<input type="hidden" name="next" value="{}">"#,
                esc(next)
            );
        }
        if ctx.login_token {
            b.push_str(r#"<p><label>Token <input type="password" name="token" autocomplete="current-password"></label></p>"#);
        }
        if ctx.login_basic {
            b.push_str(r#"<p><label>User <input name="user" autocomplete="username"></label> <label>Password <input type="password" name="password" autocomplete="current-password"></label></p>"#);
        }
        b.push_str(r#"<p><button type="submit">Sign in</button></p></form>"#);
    }
    respond(status, page(ctx, "Sign in", &b, None))
}

pub(super) async fn login_get(Extension(ctx): Extension<Ctx>) -> Response {
    login_page(&ctx, None, StatusCode::OK)
}

#[derive(Deserialize, Default)]
pub(super) struct LoginForm {
    token: Option<String>,
    user: Option<String>,
    password: Option<String>,
    /// The page that asked for the login (a path within the dashboard).
    next: Option<String>,
}

pub(super) async fn login_post(
    State(st): State<AppState>,
    Extension(ctx): Extension<Ctx>,
    axum::Form(f): axum::Form<LoginForm>,
) -> Response {
    let checked = st.auth.check_login(
        ctx.client,
        f.token.as_deref().unwrap_or(""),
        f.user.as_deref().unwrap_or(""),
        f.password.as_deref().unwrap_or(""),
    );
    let mut ctx = ctx;
    ctx.next = f.next.as_deref().and_then(safe_next);
    match checked {
        Ok(true) => {}
        Ok(false) => {
            return login_page(&ctx, Some("Wrong credentials."), StatusCode::UNAUTHORIZED);
        }
        Err(Throttled(retry)) => {
            let secs = retry.as_secs().max(1);
            let mut r = login_page(
                &ctx,
                Some(&format!(
                    "Too many failed sign-ins from here: try again in {secs} s."
                )),
                StatusCode::TOO_MANY_REQUESTS,
            );
            if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
                r.headers_mut().insert(header::RETRY_AFTER, v);
            }
            return r;
        }
    }
    // Back to the page that asked (the login page is at the dashboard's root level, so
    // `./tasks/5` names `/tasks/5` within it), or the overview.
    let target = match ctx.next.as_deref().map(|n| &n[1..]) {
        Some(rest) if !rest.is_empty() && !rest.starts_with('?') => format!("{}{rest}", ctx.root),
        _ => ctx.home.clone(),
    };
    let mut r = see_other(&target);
    if let Ok(v) = HeaderValue::from_str(&st.auth.new_session()) {
        r.headers_mut().insert(SESSION_MARK, v);
    }
    r
}

/// Ends the session (in this process: every later request with its cookie is refused, even
/// one that kept the cookie) and clears the cookie.
pub(super) async fn logout(State(st): State<AppState>, Extension(ctx): Extension<Ctx>) -> Response {
    if let Some(session) = &ctx.session {
        st.auth.end_session(session);
    }
    let mut r = see_other(&format!("{}login", ctx.root));
    r.headers_mut()
        .insert(SESSION_MARK, HeaderValue::from_static(""));
    r
}
