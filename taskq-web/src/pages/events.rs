//! The events page (the outbox): per topic the events not delivered yet and the age of the
//! oldest (the lag), and the keys a rejected event holds back; and its actions (unless the
//! dashboard is read-only): retry or skip a held key's event, replay a key, each audited
//! with the page's actor.

use std::fmt::Write as _;

use axum::Extension;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode};
use axum::response::Response;
use serde::Deserialize;

use super::{failure, nonblank, see_other};
use crate::AppState;
use crate::auth::FLASH_MARK;
use crate::ctx::Ctx;
use crate::event_actions::{KeyAction, KeyDone, MAX_SEQ};
use crate::html::{age, button, csrf_field, error_page, esc, page, respond, time};
use crate::stats::EVENTS_HELD_SHOWN as HELD_SHOWN;

pub(super) async fn events(State(st): State<AppState>, Extension(ctx): Extension<Ctx>) -> Response {
    let (topics, held) = match tokio::try_join!(
        st.client.event_stats(),
        st.client.event_keys_held(None, HELD_SHOWN)
    ) {
        Ok(v) => v,
        Err(e) => return failure(&ctx, &e),
    };
    let mut b = String::from(
        "<h1>Events</h1><p>Events published with <code>publish_tx</code> wait here until a relay has delivered them to the broker. Per topic: the events not delivered yet, and the age of the oldest (how far the relays are behind, database clock).</p>",
    );
    // The confirmation of the action that redirected here: shown once.
    let done = ctx
        .flash
        .as_deref()
        .and_then(|f| f.split_once('.'))
        .and_then(|(what, n)| match what {
            "event_retried" => Some("Retried: the relays send the held event again.".to_owned()),
            "event_skipped" => {
                Some("Skipped: the held event is dead; the key goes on with its next event.".to_owned())
            }
            "event_replayed" => Some(format!(
                "Replayed: {n} event{} pending again; the relays send them again, in order, with their message ids.",
                if n == "1" { " is" } else { "s are" }
            )),
            _ => None,
        });
    if let Some(f) = &done {
        let _ = write!(b, r#"<p class="flash" id="event-done">{}</p>"#, esc(f));
    }
    if topics.is_empty() {
        b.push_str(r#"<p id="no-events">No event is pending and no key is held.</p>"#);
    } else {
        b.push_str(r#"<table id="event-topics"><tr><th>Topic</th><th>Pending</th><th>Lag</th><th>Oldest pending</th><th>Held keys</th></tr>"#);
        for t in &topics {
            let _ = write!(
                b,
                r#"<tr><td>{}</td><td class="n">{}</td><td class="n">{}</td><td>{}</td><td class="n">{}</td></tr>"#,
                esc(&t.topic),
                t.pending,
                if t.pending == 0 {
                    "—".to_owned()
                } else {
                    age(t.lag.as_secs() as i64)
                },
                t.oldest_pending_at
                    .as_ref()
                    .map_or_else(|| "—".into(), time),
                t.held_keys
            );
        }
        b.push_str("</table>");
    }
    if !held.is_empty() {
        b.push_str(
            r#"<h2>Held event keys</h2><p>The broker rejected an event of each of these keys; none of the key's events go out until an operator retries the event (after fixing its cause), skips it (it is marked dead and the key goes on) or replays the key (here, or with <code>taskq events retry</code>, <code>skip</code>, <code>replay</code>). Each action is recorded in the audit trail.</p><table id="held-event-keys"><tr><th>Topic</th><th>Key</th><th>Seq</th><th>Held since</th><th>Error</th>"#,
        );
        b.push_str(if ctx.read_only {
            "</tr>"
        } else {
            "<th>Actions</th></tr>"
        });
        for k in &held {
            let _ = write!(
                b,
                r#"<tr><td>{}</td><td><code>{}</code></td><td class="n">{}</td><td>{}</td><td>{}</td>"#,
                esc(&k.topic),
                esc(&k.key),
                k.seq,
                time(&k.since),
                esc(&k.error)
            );
            if !ctx.read_only {
                let fields = [("topic", k.topic.as_str()), ("key", k.key.as_str())];
                let _ = write!(
                    b,
                    "<td>{}{}</td>",
                    button(&ctx, "events/retry", &fields, "Retry", ""),
                    button(&ctx, "events/skip", &fields, "Skip", "danger")
                );
            }
            b.push_str("</tr>");
        }
        b.push_str("</table>");
    }
    if !ctx.read_only {
        let _ = write!(
            b,
            r#"<h2>Replay a key</h2><p>The key's delivered and dead events from the given seq on (blank: every stored one) become pending again and go out again in order, with their original message ids (JetStream drops ids still in its duplicate window); a hold ends. Recorded in the audit trail.</p><form method="post" action="{}events/replay" class="filters" id="replay-key">{}<input name="topic" placeholder="topic" aria-label="topic" required><input name="key" placeholder="key" aria-label="key" required><input name="from_seq" type="number" min="0" placeholder="from seq" aria-label="from seq"><button type="submit" class="danger">Replay</button></form>"#,
            esc(&ctx.root),
            csrf_field(&ctx)
        );
    }
    let mut r = respond(StatusCode::OK, page(&ctx, "Events", &b, None));
    if done.is_some() {
        r.headers_mut()
            .insert(FLASH_MARK, HeaderValue::from_static(""));
    }
    r
}

/// The form of an event key action (`csrf` is checked by the guard).
#[derive(Deserialize)]
pub(super) struct KeyForm {
    #[serde(default)]
    topic: String,
    #[serde(default)]
    key: String,
    from_seq: Option<String>,
}

pub(super) async fn event_retry(
    State(st): State<AppState>,
    Extension(ctx): Extension<Ctx>,
    axum::Form(f): axum::Form<KeyForm>,
) -> Response {
    key_action(&st, &ctx, &f, KeyAction::Retry).await
}

pub(super) async fn event_skip(
    State(st): State<AppState>,
    Extension(ctx): Extension<Ctx>,
    axum::Form(f): axum::Form<KeyForm>,
) -> Response {
    key_action(&st, &ctx, &f, KeyAction::Skip).await
}

pub(super) async fn event_replay(
    State(st): State<AppState>,
    Extension(ctx): Extension<Ctx>,
    axum::Form(f): axum::Form<KeyForm>,
) -> Response {
    let from = match nonblank(&f.from_seq).map(str::parse::<u64>) {
        None => 0,
        Some(Ok(n)) if n <= MAX_SEQ => n,
        Some(_) => {
            return error_page(
                &ctx,
                StatusCode::BAD_REQUEST,
                &format!(
                    "from seq: a whole number from 0 to {MAX_SEQ} (blank: every stored event)"
                ),
            );
        }
    };
    key_action(&st, &ctx, &f, KeyAction::Replay(from)).await
}

/// Applies `action` to the form's key as the page's actor; a `303 See Other` to the events
/// page with the confirmation, or an error page.
async fn key_action(st: &AppState, ctx: &Ctx, f: &KeyForm, action: KeyAction) -> Response {
    if f.topic.is_empty() || f.key.is_empty() {
        return error_page(ctx, StatusCode::BAD_REQUEST, "topic and key: required");
    }
    let c = st.client.clone().with_actor(ctx.actor.clone());
    let flash = match action.apply(&c, &f.topic, &f.key).await {
        Ok(KeyDone::Retried) => "event_retried.1".to_owned(),
        Ok(KeyDone::Skipped) => "event_skipped.1".to_owned(),
        Ok(KeyDone::Replayed(n)) => format!("event_replayed.{n}"),
        Ok(KeyDone::NotHeld) => {
            return error_page(
                ctx,
                StatusCode::CONFLICT,
                &format!(
                    "key {:?} of topic {:?} is not held: nothing to retry or skip",
                    f.key, f.topic
                ),
            );
        }
        Ok(KeyDone::NoSuchKey) => {
            return error_page(
                ctx,
                StatusCode::NOT_FOUND,
                &format!(
                    "no event was published on key {:?} of topic {:?}",
                    f.key, f.topic
                ),
            );
        }
        Err(e) => return failure(ctx, &e),
    };
    let mut r = see_other(&format!("{}events", ctx.root));
    if let Ok(v) = HeaderValue::from_str(&flash) {
        r.headers_mut().insert(FLASH_MARK, v);
    }
    r
}
