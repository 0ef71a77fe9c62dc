//! The operator's views (scheduled, retrying, schedules, audit trail, unhandled names) on the
//! pages and the API, on both backends.

mod support;

use std::time::Duration;

use axum::http::{Method, StatusCode};
use support::{Cred, Resp, TOKEN, send};
use taskq::{Task, TaskContext, TaskError};
use taskq_tests::backends::{Db, TestBackend};
use taskq_web::Dashboard;

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Report {
    n: u32,
}

impl Task for Report {
    const NAME: &'static str = "report";
    const QUEUE: &'static str = "reports";
    async fn run(self, _cx: TaskContext) -> Result<(), TaskError> {
        Ok(())
    }
}

struct App {
    router: axum::Router,
}

impl App {
    fn new<B: TestBackend>(db: &Db<B>) -> Self {
        let router = Dashboard::builder(db.pool.clone())
            .bearer_token(TOKEN)
            .build()
            .unwrap()
            .router();
        Self { router }
    }

    async fn get(&self, path: &str) -> Resp {
        let r = send(
            &self.router,
            Method::GET,
            path,
            Cred::Bearer(TOKEN),
            &[],
            None,
        )
        .await;
        assert_eq!(r.status, StatusCode::OK, "{path}: {}", r.body);
        r
    }

    async fn api_post(&self, path: &str, body: serde_json::Value) -> Resp {
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

/// The ids in the `<table id="{table}">` of a page, in order (from the task links of its rows).
fn ids_in(body: &str, table: &str) -> Vec<u64> {
    let Some(start) = body.find(&format!(r#"<table id="{table}">"#)) else {
        return vec![];
    };
    let t = &body[start..start + body[start..].find("</table>").unwrap()];
    t.split("<tr><td><a href=\"")
        .skip(1)
        .map(|r| {
            let link = &r[..r.find('"').unwrap()];
            link.rsplit('/').next().unwrap().parse().unwrap()
        })
        .collect()
}

/// Scheduled (two due later, one due now that is in neither list), retrying (one failed
/// attempt, due later), paging through both with the `(run_at, id)` cursor, in the pages and
/// the API; the nav links every view.
async fn scheduled_and_retrying_tasks_are_listed_soonest_first<B: TestBackend>(db: Db<B>) {
    let mut ids = vec![];
    for n in 0..4 {
        ids.push(Report { n }.enqueue(&db.pool).await.unwrap().id.0);
    }
    let [due, later, soon, retry] = ids[..] else {
        unreachable!()
    };
    db.exec(&format!(
        "UPDATE taskq_tasks SET run_at = {} WHERE id = {later}",
        db.from_now(Duration::from_secs(7200))
    ))
    .await;
    db.exec(&format!(
        "UPDATE taskq_tasks SET run_at = {} WHERE id = {soon}",
        db.from_now(Duration::from_secs(600))
    ))
    .await;
    db.exec(&format!(
        "UPDATE taskq_tasks SET run_at = {}, attempt = 1, last_error = 'gateway down' WHERE id = {retry}",
        db.from_now(Duration::from_secs(300))
    ))
    .await;
    let app = App::new(&db);

    let page = app.get("/scheduled").await.body;
    // The retry waiting 5 min is scheduled too (its attempt count says it is a retry).
    assert_eq!(ids_in(&page, "scheduled"), [retry, soon, later], "{page}");
    assert!(page.contains(r#"<span class="ago">in 9m 5"#), "{page}");
    let first = app.get("/scheduled?limit=2").await;
    assert_eq!(ids_in(&first.body, "scheduled"), [retry, soon]);
    let next = first
        .links()
        .into_iter()
        .find(|l| l.contains("after="))
        .expect("a next page");
    let second = app
        .get(&format!("/{}", next.trim_start_matches("./")))
        .await;
    assert_eq!(ids_in(&second.body, "scheduled"), [later], "{next}");
    assert!(
        app.get("/scheduled?queue=other")
            .await
            .body
            .contains("No matching tasks."),
        "the queue filter"
    );
    let page = app.get("/retrying").await.body;
    assert_eq!(ids_in(&page, "retrying"), [retry], "{page}");
    assert!(
        page.contains("gateway down") && page.contains("1/"),
        "{page}"
    );
    assert!(!page.contains(&format!(">{due}<")));

    let api = app.get("/api/v1/scheduled?limit=2").await.json();
    assert_eq!(api["tasks"][1]["id"], soon, "{api}");
    let after = api["next_after"].as_str().expect("a cursor").to_owned();
    let api = app
        .get(&format!("/api/v1/scheduled?after={after}"))
        .await
        .json();
    assert_eq!(api["tasks"].as_array().unwrap().len(), 1, "{api}");
    assert_eq!(api["tasks"][0]["id"], later);
    assert!(api["next_after"].is_null());
    let api = app.get("/api/v1/retrying").await.json();
    assert_eq!(api["tasks"][0]["id"], retry, "{api}");
    assert_eq!(api["tasks"][0]["attempt"], 1);
    let bad = send(
        &app.router,
        Method::GET,
        "/api/v1/scheduled?after=nope",
        Cred::Bearer(TOKEN),
        &[],
        None,
    )
    .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{}", bad.body);

    let overview = app.get("/").await;
    for view in ["scheduled", "retrying", "schedules", "audit", "unhandled"] {
        assert!(
            overview
                .links()
                .iter()
                .any(|l| l.ends_with(&format!("/{view}"))),
            "the nav links {view}: {:?}",
            overview.links()
        );
    }
}

/// Schedules: expression, zone, last and next fire with their ages, paused (its queue is) and
/// overdue (next fire long past), in the page and the API.
async fn schedules_show_their_fires_pause_and_overdue<B: TestBackend>(db: Db<B>) {
    db.exec(&format!(
        "INSERT INTO taskq_schedules (name, task_name, queue, expression, timezone, missed_ticks,
           watermark, last_tick, last_worker_id, next_tick, declared_at, created_at, updated_at)
         VALUES ('nightly', 'report', 'reports', '0 3 * * *', 'Europe/Paris', 'latest',
                 {now}, {last}, 'w-1', {next}, {now}, {now}, {now}),
                ('stale', 'cleanup', 'maint', '*/5 * * * *', 'UTC', 'skip',
                 {now}, NULL, NULL, {past}, {now}, {now}, {now})",
        now = db.now(),
        last = db.ago(Duration::from_secs(3600)),
        next = db.from_now(Duration::from_secs(7200)),
        past = db.ago(Duration::from_secs(3600)),
    ))
    .await;
    db.client().pause_queue("reports").await.unwrap();
    let app = App::new(&db);
    let page = app.get("/schedules").await.body;
    let row = |name: &str| -> String {
        let start = page
            .find(&format!(r#"<tr data-schedule="{name}">"#))
            .unwrap_or_else(|| panic!("no row of {name}: {page}"));
        page[start..start + page[start..].find("</tr>").unwrap()].to_owned()
    };
    let nightly = row("nightly");
    assert!(
        nightly.contains("<code>0 3 * * *</code>")
            && nightly.contains("Europe/Paris")
            && nightly.contains(r#"<span class="ago">1h 00m ago</span>"#)
            && nightly.contains(r#"<span class="ago">in 1h 59m</span>"#)
            && nightly.contains(r#"<span class="badge paused">paused</span>"#)
            && !nightly.contains("overdue"),
        "{nightly}"
    );
    let stale = row("stale");
    assert!(
        stale.contains(r#"<span class="lost">overdue</span>"#) && !stale.contains("paused"),
        "{stale}"
    );
    let api = app.get("/api/v1/schedules").await.json();
    let s = &api["schedules"];
    assert_eq!(
        (
            s[0]["name"].as_str(),
            s[0]["expression"].as_str(),
            s[0]["paused"].as_bool(),
            s[0]["overdue"].as_bool()
        ),
        (Some("nightly"), Some("0 3 * * *"), Some(true), Some(false)),
        "{api}"
    );
    assert_eq!(
        (s[1]["overdue"].as_bool(), s[1]["paused"].as_bool()),
        (Some(true), Some(false))
    );
    assert!(s[0]["last_tick"].is_string() && s[1]["last_tick"].is_null());
}

/// The audit trail: actions taken through the API show newest first with their actor, filter
/// by queue and by task, and page by id, in the page and the API. Unhandled names: due tasks of
/// a name no alive worker registers.
async fn the_audit_trail_and_unhandled_names_are_listed<B: TestBackend>(db: Db<B>) {
    let id = Report { n: 1 }.enqueue(&db.pool).await.unwrap().id.0;
    let app = App::new(&db);
    // Queue `other` has a row (the dashboard does not pause a queue nothing names).
    db.exec(&format!(
        "INSERT INTO taskq_queues (queue, updated_at) VALUES ('other', {})",
        db.now()
    ))
    .await;
    for path in [
        "/api/v1/queues/reports/pause".to_owned(),
        "/api/v1/queues/reports/resume".to_owned(),
        format!("/api/v1/tasks/{id}/cancel"),
        "/api/v1/queues/other/pause".to_owned(),
    ] {
        let r = app.api_post(&path, serde_json::json!({})).await;
        assert!(r.status.is_success(), "{path}: {}", r.body);
    }
    let page = app.get("/audit").await.body;
    let actions: Vec<&str> = page
        .split(r#"<tr data-action=""#)
        .skip(1)
        .map(|r| &r[..r.find('"').unwrap()])
        .collect();
    assert_eq!(actions, ["pause", "cancel", "resume", "pause"], "{page}");
    assert!(
        page.contains("<td>api:token</td>") && page.contains(" ago</span>"),
        "{page}"
    );
    let page = app.get("/audit?queue=reports").await.body;
    assert_eq!(page.matches(r#"<tr data-action=""#).count(), 3, "{page}");
    let page = app.get(&format!("/audit?task={id}")).await.body;
    assert_eq!(
        page.matches(r#"<tr data-action="cancel""#).count(),
        1,
        "{page}"
    );
    assert_eq!(page.matches(r#"<tr data-action=""#).count(), 1, "{page}");
    let api = app.get("/api/v1/audit?limit=2").await.json();
    let e = api["entries"].as_array().unwrap();
    assert_eq!(
        (e.len(), e[0]["action"].as_str()),
        (2, Some("pause")),
        "{api}"
    );
    assert_eq!(e[0]["actor"], "api:token");
    let before = api["next_before"].as_u64().expect("a next page");
    let api = app
        .get(&format!("/api/v1/audit?before={before}"))
        .await
        .json();
    let rest: Vec<&str> = api["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert_eq!(rest, ["resume", "pause"], "{api}");

    // Unhandled: two due `report` tasks, no worker at all.
    for n in 0..2 {
        Report { n }.enqueue(&db.pool).await.unwrap();
    }
    let page = app.get("/unhandled").await.body;
    assert!(
        page.contains(r#"<tr data-name="report">"#)
            && page.contains(r#">report</a></td><td class="n">2</td><td class="n">2</td>"#)
            && page.contains("<td>none</td>"),
        "{page}"
    );
    let api = app.get("/api/v1/unhandled").await.json();
    assert_eq!(api["unhandled"][0]["name"], "report", "{api}");
    assert_eq!(api["unhandled"][0]["due"], 2);
    assert!(api["counted_at"].is_string());
}

/// The overview: a legend on the per-minute bars, p50/p95 run time per task name (page and
/// API), times with their ages; it reloads itself but carries no field to type into (the bulk
/// form moved to `/bulk`, the task-id field is left out while it refreshes); the task page
/// shows `attempted_at`.
async fn the_overview_shows_run_times_a_legend_and_no_field_to_wipe<B: TestBackend>(db: Db<B>) {
    let mut ids = vec![];
    for n in 0..4 {
        ids.push(Report { n }.enqueue(&db.pool).await.unwrap().id.0);
    }
    // Three successes that ran 1, 2 and 4 s, a minute ago.
    for (id, secs) in ids.iter().zip([1u64, 2, 4]) {
        db.exec(&format!(
            "UPDATE taskq_tasks SET state = 'succeeded', attempt = 1, lease_epoch = 1,
               attempted_at = {}, finished_at = {}, updated_at = {} WHERE id = {id}",
            db.ago(Duration::from_secs(60 + secs)),
            db.ago(Duration::from_secs(60)),
            db.ago(Duration::from_secs(60)),
        ))
        .await;
    }
    let app = App::new(&db);
    let page = app.get("/").await.body;
    assert!(
        page.contains(r#"<meta http-equiv="refresh""#),
        "it refreshes"
    );
    assert!(page.contains(r#"<p class="legend" id="legend">"#), "{page}");
    for what in ["succeeded", "dead", "canceled", "failed attempts"] {
        assert!(
            page.contains(&format!("</span>{what}</span>")),
            "legend of {what}: {page}"
        );
    }
    let start = page
        .find(r#"<tr data-name="report">"#)
        .unwrap_or_else(|| panic!("{page}"));
    let row = &page[start..start + page[start..].find("</tr>").unwrap()];
    assert!(
        row.contains(r#"<td class="n">3</td><td class="n">2.00 s</td><td class="n">4.00 s</td><td class="n">4.00 s</td>"#),
        "p50 2 s, p95 4 s: {row}"
    );
    assert!(page.contains(r#"<span class="ago">"#), "ages next to times");
    // Nothing to type into while it refreshes; the forms are elsewhere.
    let fields: Vec<&str> = page
        .split("<input")
        .skip(1)
        .filter(|f| !f.trim_start().starts_with(r#"type="hidden""#))
        .collect();
    assert!(fields.is_empty(), "fields on a refreshing page: {fields:?}");
    assert!(!page.contains("<select"));
    assert!(
        page.contains(r#"<a href="./bulk" id="bulk-link">"#),
        "{page}"
    );
    let bulk = app.get("/bulk").await.body;
    assert!(
        bulk.contains(r#"<form method="get" action="./bulk" class="filters" id="bulk-form">"#),
        "{bulk}"
    );
    let still = app.get("/?refresh=0").await.body;
    assert!(!still.contains("http-equiv") && still.contains(r#"<input name="id""#));

    let api = app.get("/api/v1/queues").await.json();
    let rt = &api["run_times"][0];
    assert_eq!(
        (rt["name"].as_str(), rt["count"].as_u64()),
        (Some("report"), Some(3)),
        "{api}"
    );
    let p50 = rt["p50_ms"].as_f64().unwrap();
    let p95 = rt["p95_ms"].as_f64().unwrap();
    assert!(
        (1_999.0..=2_001.0).contains(&p50) && (3_999.0..=4_001.0).contains(&p95),
        "{api}"
    );

    let task = app.get(&format!("/tasks/{}", ids[0])).await.body;
    assert!(
        task.contains("<dt>Attempted at</dt><dd>")
            && task.contains(r#"<span class="ago">1m 01s ago</span>"#),
        "{task}"
    );
    let pending = app.get(&format!("/tasks/{}", ids[3])).await.body;
    assert!(
        pending.contains("<dt>Attempted at</dt><dd>—</dd>"),
        "{pending}"
    );
}

/// Order keys held back by a failed head show on the overview with the head, its attempt,
/// error (escaped) and the count waiting behind; heads that have not failed do not.
async fn held_order_keys_show_on_the_overview<B: TestBackend>(db: Db<B>) {
    let mut acct1 = vec![];
    for n in 0..3 {
        acct1.push(
            Report { n }
                .with_order_key("acct-1")
                .enqueue(&db.pool)
                .await
                .unwrap()
                .id
                .0,
        );
    }
    Report { n: 9 }
        .with_order_key("acct-2")
        .enqueue(&db.pool)
        .await
        .unwrap();
    let app = App::new(&db);
    let page = app.get("/?refresh=0").await.body;
    assert!(!page.contains(r#"<table id="held-keys">"#), "{page}");

    let head = acct1[0];
    db.exec(&format!(
        "UPDATE taskq_tasks SET run_at = {}, attempt = 1, last_error = 'gateway <down>' WHERE id = {head}",
        db.from_now(Duration::from_secs(300))
    ))
    .await;
    let page = app.get("/?refresh=0").await.body;
    let start = page.find(r#"<table id="held-keys">"#).expect(&page);
    let table = &page[start..start + page[start..].find("</table>").unwrap()];
    assert_eq!(table.matches("<tr><td>").count(), 1, "{table}");
    assert!(
        table.contains(&format!(
            r#">{head}</a></td><td>report</td><td>pending</td><td class="n">1</td><td class="n">2</td><td>gateway &lt;down&gt;</td></tr>"#
        )),
        "{table}"
    );
    assert!(table.contains("<tr><td>reports</td><td><code>"), "{table}");
}

/// An order event for the Events page: a poison one is rejected by the test's sink.
#[derive(Debug, Clone, serde::Serialize)]
#[taskq::event(topic = "orders.placed", key = order)]
struct OrderPlaced {
    order: String,
    poison: bool,
}

/// The Events page and `GET api/v1/events`: per-topic pending count and lag, and the keys a
/// rejected event holds (key and error escaped); behind the dashboard's authentication.
async fn events_show_pending_topics_and_held_keys<B: TestBackend>(db: Db<B>) {
    use taskq::outbox::{Event, FnSink, Message, Outcome, Relay};
    let app = App::new(&db);
    let page = app.get("/events").await.body;
    assert!(page.contains(r#"<p id="no-events">"#), "{page}");
    assert!(
        page.contains(r#"<a href="./events">Events</a>"#),
        "the menu links it: {page}"
    );
    for (order, poison) in [("<k&1>", true), ("<k&1>", false), ("b", false)] {
        let mut tx = db.begin().await;
        OrderPlaced {
            order: order.into(),
            poison,
        }
        .publish_tx(&mut tx)
        .await
        .unwrap();
        tx.commit().await.unwrap();
    }
    let sink = FnSink::new(|batch: Vec<Message>| async move {
        let mut held: Vec<String> = Vec::new();
        batch
            .into_iter()
            .map(|m| {
                if held.contains(&m.key) {
                    Outcome::Held
                } else if String::from_utf8_lossy(&m.payload).contains("\"poison\":true") {
                    held.push(m.key.clone());
                    Outcome::Rejected("too <big>".into())
                } else {
                    Outcome::Delivered
                }
            })
            .collect()
    });
    let relay = Relay::builder(db.pool.clone(), sink).build().unwrap();
    while relay.run_once().await.unwrap().published > 0 {}

    let page = app.get("/events").await.body;
    let start = page.find(r#"<table id="event-topics">"#).expect(&page);
    let topics = &page[start..start + page[start..].find("</table>").unwrap()];
    assert!(
        topics.contains(r#"<tr><td>orders.placed</td><td class="n">2</td>"#),
        "{topics}"
    );
    assert!(topics.ends_with(r#"<td class="n">1</td></tr>"#), "{topics}");
    let start = page.find(r#"<table id="held-event-keys">"#).expect(&page);
    let held = &page[start..start + page[start..].find("</table>").unwrap()];
    assert!(
        held.contains(
            r#"<tr><td>orders.placed</td><td><code>&lt;k&amp;1&gt;</code></td><td class="n">1</td>"#
        ),
        "{held}"
    );
    assert!(
        held.contains("<td>too &lt;big&gt;</td><td><form"),
        "the error, then the actions: {held}"
    );
    assert!(
        !page.contains("<k&1>") && !page.contains("too <big>"),
        "{page}"
    );

    let api = app.get("/api/v1/events").await.json();
    assert_eq!(api["topics"][0]["topic"], "orders.placed", "{api}");
    assert_eq!(api["topics"][0]["pending"], 2, "{api}");
    assert_eq!(api["topics"][0]["held_keys"], 1, "{api}");
    assert!(api["topics"][0]["lag"].as_f64().is_some(), "{api}");
    assert_eq!(api["held_keys"][0]["key"], "<k&1>", "{api}");
    assert_eq!(api["held_keys"][0]["error"], "too <big>", "{api}");

    // Without credentials: refused, page and API alike.
    for path in ["/events", "/api/v1/events"] {
        let r = send(&app.router, Method::GET, path, Cred::None, &[], None).await;
        assert!(
            matches!(r.status, StatusCode::UNAUTHORIZED | StatusCode::SEE_OTHER),
            "{path}: {}",
            r.status
        );
        assert!(!r.body.contains("orders.placed"), "{path}");
    }
}

taskq_tests::conformance!(
    events_show_pending_topics_and_held_keys,
    held_order_keys_show_on_the_overview,
    the_overview_shows_run_times_a_legend_and_no_field_to_wipe,
    scheduled_and_retrying_tasks_are_listed_soonest_first,
    schedules_show_their_fires_pause_and_overdue,
    the_audit_trail_and_unhandled_names_are_listed,
);
