//! HTML building blocks: escaping, URL encoding, the page layout, value formatting.
//!
//! Every value that is not a literal of this crate goes through [`esc`] (text and attribute
//! values alike, always inside double quotes) or [`url`] (query-string parts) before it is
//! written into a page.

use std::fmt::Write as _;

use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use chrono::{DateTime, Utc};

use crate::ctx::{Ctx, Via};

/// Escapes text for an HTML text node or a double-quoted attribute value.
pub(crate) fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            '`' => out.push_str("&#96;"),
            c => out.push(c),
        }
    }
    out
}

/// Percent-encodes a query-string value (the result is also safe inside an attribute).
pub(crate) fn url(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

/// A hidden CSRF field for a form.
pub(crate) fn csrf_field(ctx: &Ctx) -> String {
    format!(
        r#"<input type="hidden" name="csrf" value="{}">"#,
        esc(&ctx.csrf)
    )
}

/// A one-button POST form to `{root}{action}` with the given hidden fields.
pub(crate) fn button(
    ctx: &Ctx,
    action: &str,
    fields: &[(&str, &str)],
    label: &str,
    class: &str,
) -> String {
    let mut f = format!(
        r#"<form method="post" action="{}{}" class="inline">"#,
        esc(&ctx.root),
        esc(action)
    );
    f.push_str(&csrf_field(ctx));
    for (k, v) in fields {
        let _ = write!(
            f,
            r#"<input type="hidden" name="{}" value="{}">"#,
            esc(k),
            esc(v)
        );
    }
    let _ = write!(
        f,
        r#"<button type="submit" class="{}">{}</button></form>"#,
        esc(class),
        esc(label)
    );
    f
}

/// A stored time as stored (database clock, UTC), to the second.
pub(crate) fn time(t: &DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

/// A stored time with microseconds, as stored.
pub(crate) fn time_us(t: &DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S%.6f UTC").to_string()
}

/// How long before `now` `t` was, as a muted span next to an absolute time: `12s ago`, or
/// `in 3m 05s` for a time ahead of `now`.
pub(crate) fn rel(t: &DateTime<Utc>, now: &DateTime<Utc>) -> String {
    let secs = (*now - *t).num_seconds();
    if secs >= 0 {
        format!(r#"<span class="ago">{} ago</span>"#, age(secs))
    } else {
        format!(r#"<span class="ago">in {}</span>"#, age(-secs))
    }
}

/// An absolute time (to the second) with how long ago it was: `2026-12-01 12:00:00 UTC 12s ago`.
pub(crate) fn when(t: &DateTime<Utc>, now: &DateTime<Utc>) -> String {
    format!("{} {}", time(t), rel(t, now))
}

/// An optional time with microseconds and its age, `—` when absent.
pub(crate) fn opt_when(t: &Option<DateTime<Utc>>, now: &DateTime<Utc>) -> String {
    t.as_ref()
        .map_or_else(|| "—".into(), |t| format!("{} {}", time_us(t), rel(t, now)))
}

/// A run time: `0.8 ms`, `412 ms`, `3.20 s`, `2m 05s`.
pub(crate) fn run_time(d: std::time::Duration) -> String {
    let ms = d.as_secs_f64() * 1_000.0;
    if ms < 10.0 {
        format!("{ms:.1} ms")
    } else if ms < 1_000.0 {
        format!("{ms:.0} ms")
    } else if ms < 60_000.0 {
        format!("{:.2} s", ms / 1_000.0)
    } else {
        age(d.as_secs() as i64)
    }
}

/// An optional time, `—` when absent.
pub(crate) fn opt_time(t: &Option<DateTime<Utc>>) -> String {
    t.as_ref().map_or_else(|| "—".into(), time_us)
}

/// A short human duration: `42s`, `3m 05s`, `2h 10m`, `3d 4h`.
pub(crate) fn age(secs: i64) -> String {
    let s = secs.max(0);
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m {:02}s", s / 60, s % 60),
        3600..86_400 => format!("{}h {:02}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d {}h", s / 86_400, (s % 86_400) / 3600),
    }
}

/// At most `n` characters of `s` (escaped), with an ellipsis when cut.
pub(crate) fn truncate(s: &str, n: usize) -> String {
    let mut it = s.chars();
    let head: String = it.by_ref().take(n).collect();
    if it.next().is_some() {
        format!("{}…", esc(&head))
    } else {
        esc(&head)
    }
}

const CSS: &str = r#"
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#1d1d1f;background:#fafafa}
header{background:#24292f;color:#fff;padding:8px 16px;display:flex;gap:16px;align-items:center;flex-wrap:wrap}
header a{color:#fff;text-decoration:none;font-weight:600}
header form{margin:0}
main{padding:16px;max-width:1400px}
table{border-collapse:collapse;background:#fff;margin:8px 0 16px}
th,td{border:1px solid #d0d7de;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f3f4f6}
td.n{text-align:right;font-variant-numeric:tabular-nums}
pre{background:#fff;border:1px solid #d0d7de;padding:8px;white-space:pre-wrap;word-break:break-all;max-height:480px;overflow:auto}
.inline{display:inline}
.state-dead{color:#b3261e;font-weight:600}.state-running{color:#0550ae}.state-succeeded{color:#1a7f37}
.badge{border-radius:4px;padding:1px 6px;background:#eee}
.paused{background:#fff3cd;color:#7a5d00}
.lost{color:#b3261e;font-weight:600}
.ago{color:#57606a;font-size:12px;margin-left:4px}
.flash{background:#e6f4ea;border:1px solid #1a7f37;padding:6px 10px;margin-bottom:12px}
.error{background:#fde7e9;border:1px solid #b3261e;padding:6px 10px;margin-bottom:12px}
button{cursor:pointer}button.danger{color:#b3261e}
.legend{display:flex;gap:16px;align-items:center;margin:4px 0}.legend span.bar{width:16px;margin-right:4px;vertical-align:middle}
.bar{display:inline-block;height:10px;background:#1a7f37}.bar.dead{background:#b3261e}.bar.canceled{background:#888}.bar.failed{background:#d97706}
dl{display:grid;grid-template-columns:max-content auto;gap:4px 16px}dt{font-weight:600}dd{margin:0}
form.filters input,form.filters select{margin-right:8px}
.bar.running{background:#0550ae}.wf-bar{display:inline-flex;width:120px;background:#eee;vertical-align:middle}
.wf-open{color:#7a5d00}.wf-running{color:#0550ae}.wf-succeeded{color:#1a7f37}.wf-failed{color:#b3261e;font-weight:600}.wf-canceled{color:#57606a}
.badge.cleanup{background:#ddf4ff}.badge.by-dep{background:#fde7e9}
.wf-graph{display:flex;flex-direction:column;gap:8px;margin:8px 0 16px}
.wf-level{display:flex;gap:8px;flex-wrap:wrap;align-items:flex-start}.wf-level-n{color:#57606a;width:24px}
.wf-step{background:#fff;border:1px solid #d0d7de;border-radius:4px;padding:4px 8px}.wf-step-dead{border-color:#b3261e}.wf-step-succeeded{border-color:#1a7f37}.wf-step-running{border-color:#0550ae}
td.nw{white-space:nowrap}
"#;

/// A complete page: `title` and `body` (already escaped HTML), with the navigation.
/// `refresh` adds a `<meta http-equiv="refresh">` (no script) and leaves out the header's
/// task-id field, so that a reload never wipes something being typed: a page that refreshes
/// has no field at all (only one-button forms), its forms are on pages of their own.
pub(crate) fn page(ctx: &Ctx, title: &str, body: &str, refresh: Option<u64>) -> String {
    let root = esc(&ctx.root);
    let home = esc(&ctx.home);
    let mut h = String::with_capacity(body.len() + 2048);
    h.push_str("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">");
    h.push_str("<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">");
    if let Some(secs) = refresh {
        let _ = write!(h, "<meta http-equiv=\"refresh\" content=\"{secs}\">");
    }
    let _ = write!(
        h,
        "<title>{} · taskq</title><style>{CSS}</style></head><body><header>",
        esc(title)
    );
    let _ = write!(
        h,
        r#"<a href="{home}">taskq</a><a href="{root}tasks">Tasks</a><a href="{root}tasks?state=running">Running</a><a href="{root}scheduled">Scheduled</a><a href="{root}retrying">Retrying</a><a href="{root}tasks?state=dead">Dead</a><a href="{root}workflows">Workflows</a><a href="{root}batches">Batches</a><a href="{root}schedules">Schedules</a><a href="{root}unhandled">Unhandled</a><a href="{root}events">Events</a><a href="{root}audit">Audit</a>"#
    );
    // A page that reloads itself carries no field to type into: the reload would wipe it.
    if refresh.is_none() {
        let _ = write!(
            h,
            r#"<form method="get" action="{root}tasks"><input name="id" placeholder="task id" size="10" aria-label="task id"> <button type="submit">Go</button></form>"#
        );
    }
    if ctx.read_only {
        h.push_str(r#"<span class="badge paused">read-only</span>"#);
    }
    if ctx.via == Via::Session {
        h.push_str(&button(ctx, "logout", &[], "Log out", ""));
    }
    h.push_str("</header><main>");
    h.push_str(body);
    h.push_str("</main></body></html>");
    h
}

/// A page response with a status.
pub(crate) fn respond(status: StatusCode, html: String) -> Response {
    (status, Html(html)).into_response()
}

/// An error page: `message` is escaped here.
pub(crate) fn error_page(ctx: &Ctx, status: StatusCode, message: &str) -> Response {
    let body = format!(
        r#"<h1>{}</h1><p class="error">{}</p><p><a href="{}">Back to the overview</a></p>"#,
        status.as_u16(),
        esc(message),
        esc(&ctx.home)
    );
    respond(status, page(ctx, "Error", &body, None))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup_and_quotes() {
        assert_eq!(
            esc(r#"<script>alert('x')</script>"&"#),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&quot;&amp;"
        );
        assert_eq!(url("a b&c=d/é"), "a+b%26c%3Dd%2F%C3%A9");
        assert_eq!(truncate("<abc>", 2), "&lt;a…");
        assert_eq!(age(59), "59s");
        assert_eq!(age(61), "1m 01s");
        assert_eq!(age(3 * 86_400 + 7200), "3d 2h");
    }
}
