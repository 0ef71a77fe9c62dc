//! Signing in and out: the login page (also the body of every 401 of the pages), its form,
//! and the logout action.

use std::fmt::Write as _;

use axum::Extension;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode};
use axum::response::Response;
use serde::Deserialize;

use super::see_other;
use crate::AppState;
use crate::auth::{Ctx, SESSION_MARK};
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
}

pub(super) async fn login_post(
    State(st): State<AppState>,
    Extension(ctx): Extension<Ctx>,
    axum::Form(f): axum::Form<LoginForm>,
) -> Response {
    let ok = st.auth.check_login(
        f.token.as_deref().unwrap_or(""),
        f.user.as_deref().unwrap_or(""),
        f.password.as_deref().unwrap_or(""),
    );
    if !ok {
        return login_page(&ctx, Some("Wrong credentials."), StatusCode::UNAUTHORIZED);
    }
    let mut r = see_other(&ctx.home);
    if let Ok(v) = HeaderValue::from_str(&st.auth.new_session()) {
        r.headers_mut().insert(SESSION_MARK, v);
    }
    r
}

pub(super) async fn logout(Extension(ctx): Extension<Ctx>) -> Response {
    let mut r = see_other(&format!("{}login", ctx.root));
    r.headers_mut()
        .insert(SESSION_MARK, HeaderValue::from_static(""));
    r
}
