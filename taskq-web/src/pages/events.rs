//! The events page (the outbox): per topic the events not delivered yet and the age of the
//! oldest (the lag), and the keys a rejected event holds back. Read-only: replays and the
//! retry or skip of a held key are operator actions of the CLI (`taskq events`) and
//! `taskq::Client`, audited there.

use std::fmt::Write as _;

use axum::Extension;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;

use super::failure;
use crate::AppState;
use crate::ctx::Ctx;
use crate::html::{age, esc, page, respond, time};
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
            r#"<h2>Held event keys</h2><p>The broker rejected an event of each of these keys; none of the key's events go out until an operator retries the event (<code>taskq events retry</code>), skips it (<code>taskq events skip</code>) or replays the key (<code>taskq events replay</code>).</p><table id="held-event-keys"><tr><th>Topic</th><th>Key</th><th>Seq</th><th>Held since</th><th>Error</th></tr>"#,
        );
        for k in &held {
            let _ = write!(
                b,
                r#"<tr><td>{}</td><td><code>{}</code></td><td class="n">{}</td><td>{}</td><td>{}</td></tr>"#,
                esc(&k.topic),
                esc(&k.key),
                k.seq,
                time(&k.since),
                esc(&k.error)
            );
        }
        b.push_str("</table>");
    }
    respond(StatusCode::OK, page(&ctx, "Events", &b, None))
}
