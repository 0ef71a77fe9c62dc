//! The task actions (run now, reschedule, priority, delete, one action over checked tasks) and
//! the event key actions (retry, skip, replay) in the pages and the API, each audited and
//! refused in read-only mode and without the CSRF token, and the audit entries of queue
//! limits, on both backends.

mod support;

use std::time::Duration;

use axum::http::{Method, StatusCode};
use support::{Cred, Resp, TOKEN, send};
use taskq::client::AuditFilter;
use taskq::{Task, TaskContext, TaskError, TaskId, TaskState};
use taskq_tests::backends::{Db, TestBackend};
use taskq_web::Dashboard;

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Job {
    n: u32,
}

impl Task for Job {
    const NAME: &'static str = "job";
    const QUEUE: &'static str = "jobs";
    async fn run(self, _cx: TaskContext) -> Result<(), TaskError> {
        Ok(())
    }
}

struct App {
    router: axum::Router,
}

impl App {
    fn new<B: TestBackend>(db: &Db<B>, read_only: bool) -> Self {
        let router = Dashboard::builder(db.pool.clone())
            .bearer_token(TOKEN)
            .read_only(read_only)
            .build()
            .unwrap()
            .router();
        Self { router }
    }

    async fn get(&self, path: &str) -> Resp {
        send(
            &self.router,
            Method::GET,
            path,
            Cred::Bearer(TOKEN),
            &[],
            None,
        )
        .await
    }

    /// A form POST with the CSRF cookie and field (`fields` may repeat a name).
    async fn post_form(&self, path: &str, fields: &[(&str, &str)]) -> Resp {
        support::post_form(
            &self.router,
            // The events page always has a form (replay a key), unless read-only.
            &["/events", "/tasks", "/bulk?action=retry"],
            path,
            fields,
        )
        .await
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

async fn enqueue<B: TestBackend>(db: &Db<B>, n: u32) -> u64 {
    Job { n }.enqueue(&db.pool).await.unwrap().id.0
}

/// The newest audit entry of task `id`: (actor, action, detail).
async fn last_audit<B: TestBackend>(db: &Db<B>, id: u64) -> (String, String, serde_json::Value) {
    let e = db
        .client()
        .audit(&AuditFilter {
            task: Some(TaskId(id)),
            ..Default::default()
        })
        .await
        .unwrap();
    let e = e
        .first()
        .unwrap_or_else(|| panic!("no audit entry for task {id}"));
    (e.actor.clone(), e.action.clone(), e.detail.clone())
}

async fn seconds_until_due<B: TestBackend>(db: &Db<B>, id: u64) -> i64 {
    let t = db.client().get(TaskId(id)).await.unwrap();
    (t.run_at - db.server_now().await).num_seconds()
}

/// Run now, reschedule (a delay and a UTC time), priority and delete from the task page's
/// forms: the rows change, each action is in the audit trail with the page's actor, the page
/// confirms; delete refuses a running task (409) and the task page offers the forms of a
/// pending task only.
async fn task_page_actions_change_the_task_and_are_audited<B: TestBackend>(db: Db<B>) {
    let app = App::new(&db, false);
    let id = enqueue(&db, 1).await;
    let page = app.get(&format!("/tasks/{id}")).await.body;
    for form in [
        format!(r#"action="../tasks/{id}/run-now""#),
        r#"id="reschedule""#.into(),
        r#"id="priority""#.into(),
        format!(r#"action="../tasks/{id}/delete""#),
    ] {
        assert!(page.contains(&form), "{form}: {page}");
    }

    let r = app
        .post_form(&format!("/tasks/{id}/reschedule"), &[("when", "2h")])
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
    assert!((7150..=7200).contains(&seconds_until_due(&db, id).await));
    let (actor, action, detail) = last_audit(&db, id).await;
    assert_eq!(
        (actor.as_str(), action.as_str()),
        ("web:token", "reschedule")
    );
    assert_eq!(detail["delay_ms"], 7_200_000);
    let page = app.get(&format!("/tasks/{id}")).await;
    assert_eq!(page.status, StatusCode::OK);

    let r = app
        .post_form(
            &format!("/tasks/{id}/reschedule"),
            &[("when", "2031-01-02 03:04")],
        )
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
    let t = db.client().get(TaskId(id)).await.unwrap();
    assert_eq!(t.run_at.to_rfc3339(), "2031-01-02T03:04:00+00:00");
    let r = app
        .post_form(&format!("/tasks/{id}/reschedule"), &[("when", "soonish")])
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);

    let r = app.post_form(&format!("/tasks/{id}/run-now"), &[]).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
    assert!(seconds_until_due(&db, id).await <= 0);
    assert_eq!(last_audit(&db, id).await.1, "run_now");

    let r = app
        .post_form(&format!("/tasks/{id}/priority"), &[("priority", "-7")])
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
    assert_eq!(db.client().get(TaskId(id)).await.unwrap().priority, -7);
    let (_, action, detail) = last_audit(&db, id).await;
    assert_eq!(
        (action.as_str(), &detail["priority"]),
        ("priority", &serde_json::json!(-7))
    );
    assert_eq!(
        app.post_form(&format!("/tasks/{id}/priority"), &[("priority", "high")])
            .await
            .status,
        StatusCode::BAD_REQUEST
    );

    // A running task: no run-now or delete; delete is refused, the row stays.
    let running = enqueue(&db, 2).await;
    db.exec(&format!(
        "UPDATE taskq_tasks SET state = 'running', attempt = 1, lease_epoch = 1, worker_id = 'w', lease_until = {} WHERE id = {running}",
        db.from_now(Duration::from_secs(60))
    ))
    .await;
    let page = app.get(&format!("/tasks/{running}")).await.body;
    assert!(
        !page.contains("/run-now\"") && !page.contains("/delete\""),
        "{page}"
    );
    let r = app
        .post_form(&format!("/tasks/{running}/delete"), &[])
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.body);
    assert_eq!(db.count(&format!("id = {running}")).await, 1);

    let r = app.post_form(&format!("/tasks/{id}/delete"), &[]).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert!(r.body.contains(&format!("Deleted task {id}.")));
    assert_eq!(db.count(&format!("id = {id}")).await, 0);
    let (actor, action, detail) = last_audit(&db, id).await;
    assert_eq!((actor.as_str(), action.as_str()), ("web:token", "delete"));
    assert_eq!(
        detail,
        serde_json::json!({"name": "job", "state": "pending"})
    );
    let trail = db
        .client()
        .audit(&AuditFilter {
            queue: Some("jobs".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        trail[0].action, "delete",
        "the entry keeps the deleted task's queue"
    );
}

/// The task list's checkboxes: one action over the checked ids, each applied and audited on
/// its own, the page saying what happened to each; the same through the API.
async fn checked_tasks_take_one_action_each<B: TestBackend>(db: Db<B>) {
    let app = App::new(&db, false);
    let a = enqueue(&db, 1).await;
    let b = enqueue(&db, 2).await;
    let c = enqueue(&db, 3).await;
    let list = app.get("/tasks").await.body;
    assert!(
        list.contains(r#"<form method="post" action="./tasks/selected" id="select-many">"#)
            && list.contains(&format!(r#"<input type="checkbox" name="id" value="{a}""#))
            && list.contains(r#"<button type="submit" name="action" value="delete" class="danger">Delete</button>"#),
        "{list}"
    );
    let (sa, sb) = (a.to_string(), b.to_string());
    let r = app
        .post_form(
            "/tasks/selected",
            &[("action", "cancel"), ("id", &sa), ("id", &sb)],
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert!(r.body.contains(r#"data-ok="2""#), "{}", r.body);
    for id in [a, b] {
        assert_eq!(
            db.client().get(TaskId(id)).await.unwrap().state,
            TaskState::Canceled
        );
        assert_eq!(last_audit(&db, id).await.1, "cancel");
    }
    assert_eq!(
        db.client().get(TaskId(c)).await.unwrap().state,
        TaskState::Pending
    );
    // Retry of a canceled task fails for that task only; delete works on finished tasks.
    let sc = c.to_string();
    let r = app
        .post_form(
            "/tasks/selected",
            &[("action", "delete"), ("id", &sa), ("id", &sc)],
        )
        .await;
    assert!(r.body.contains(r#"data-ok="2""#), "{}", r.body);
    assert_eq!(db.count(&format!("id IN ({a}, {c})")).await, 0);
    let r = app
        .post_form("/tasks/selected", &[("action", "retry"), ("id", &sb)])
        .await;
    assert!(
        r.body.contains(r#"data-ok="0""#)
            && r.body
                .contains(&format!(r#"<tr data-id="{b}" class="error">"#)),
        "{}",
        r.body
    );
    for bad in [
        vec![("action", "retry")],
        vec![("action", "explode"), ("id", sb.as_str())],
        vec![("action", "retry"), ("id", "x")],
    ] {
        assert_eq!(
            app.post_form("/tasks/selected", &bad).await.status,
            StatusCode::BAD_REQUEST,
            "{bad:?}"
        );
    }

    // The API.
    let d = enqueue(&db, 4).await;
    let e = enqueue(&db, 5).await;
    let r = app
        .api_post(
            "/api/v1/tasks/selected",
            serde_json::json!({"action": "run_now", "ids": [d, e, b]}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let j = r.json();
    assert_eq!(j["done"].as_array().unwrap().len(), 2, "{j}");
    assert_eq!(j["failed"][0]["id"], b);
    assert_eq!(j["failed"][0]["code"], "wrong_state");
    assert_eq!(
        last_audit(&db, d).await,
        (
            "api:token".into(),
            "run_now".into(),
            serde_json::Value::Null
        )
    );
}

/// The API's task actions, with their errors.
async fn api_task_actions_change_the_task_and_are_audited<B: TestBackend>(db: Db<B>) {
    let app = App::new(&db, false);
    let id = enqueue(&db, 1).await;
    let r = app
        .api_post(
            &format!("/api/v1/tasks/{id}/reschedule"),
            serde_json::json!({"delay_ms": 60_000}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert!((50..=60).contains(&seconds_until_due(&db, id).await));
    assert_eq!(last_audit(&db, id).await.0, "api:token");
    let r = app
        .api_post(
            &format!("/api/v1/tasks/{id}/reschedule"),
            serde_json::json!({"run_at": "2031-01-02T03:04:05Z"}),
        )
        .await;
    assert_eq!(r.json()["run_at"], "2031-01-02T03:04:05Z", "{}", r.body);
    for body in [
        serde_json::json!({}),
        serde_json::json!({"delay_ms": 1, "run_at": "2031-01-02T03:04:05Z"}),
    ] {
        let r = app
            .api_post(&format!("/api/v1/tasks/{id}/reschedule"), body)
            .await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
    }
    let r = app
        .api_post(
            &format!("/api/v1/tasks/{id}/run-now"),
            serde_json::json!({}),
        )
        .await;
    assert_eq!(r.json()["result"], "due_now", "{}", r.body);
    assert!(seconds_until_due(&db, id).await <= 0);
    let r = app
        .api_post(
            &format!("/api/v1/tasks/{id}/priority"),
            serde_json::json!({"priority": 9}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(db.client().get(TaskId(id)).await.unwrap().priority, 9);
    let r = app
        .api_post(&format!("/api/v1/tasks/{id}/delete"), serde_json::json!({}))
        .await;
    assert_eq!(r.json()["result"], "deleted", "{}", r.body);
    assert_eq!(last_audit(&db, id).await.1, "delete");
    let r = app
        .api_post(
            &format!("/api/v1/tasks/{id}/run-now"),
            serde_json::json!({}),
        )
        .await;
    assert_eq!(
        (r.status, r.json()["error"]["code"].clone()),
        (StatusCode::NOT_FOUND, "not_found".into())
    );
}

/// Read-only: no action form is shown, and every action (page and API) is refused with 403,
/// changing nothing.
async fn read_only_refuses_every_task_action<B: TestBackend>(db: Db<B>) {
    let app = App::new(&db, true);
    let id = enqueue(&db, 1).await;
    let page = app.get(&format!("/tasks/{id}")).await.body;
    assert!(!page.contains("<form method=\"post\""), "{page}");
    let list = app.get("/tasks").await.body;
    assert!(
        !list.contains("checkbox") && !list.contains("select-many"),
        "{list}"
    );
    let s = id.to_string();
    for (path, fields) in [
        (format!("/tasks/{id}/run-now"), vec![]),
        (format!("/tasks/{id}/reschedule"), vec![("when", "1h")]),
        (format!("/tasks/{id}/priority"), vec![("priority", "3")]),
        (format!("/tasks/{id}/delete"), vec![]),
        (
            "/tasks/selected".to_owned(),
            vec![("action", "delete"), ("id", s.as_str())],
        ),
    ] {
        assert_eq!(
            app.post_form(&path, &fields).await.status,
            StatusCode::FORBIDDEN,
            "{path}"
        );
        let api = app
            .api_post(
                &format!("/api/v1{path}"),
                serde_json::json!({"priority": 1, "delay_ms": 1, "action": "delete", "ids": [id]}),
            )
            .await;
        assert_eq!(api.status, StatusCode::FORBIDDEN, "api {path}");
    }
    let t = db.client().get(TaskId(id)).await.unwrap();
    assert_eq!((t.state, t.priority), (TaskState::Pending, 0));
    assert!(
        db.client()
            .audit(&AuditFilter::default())
            .await
            .unwrap()
            .is_empty()
    );
}

/// Every task action's form needs the CSRF token: without the cookie and field, with the
/// cookie only, or with a wrong field, it is refused (403) and changes nothing.
async fn task_actions_need_the_csrf_token<B: TestBackend>(db: Db<B>) {
    let app = App::new(&db, false);
    let id = enqueue(&db, 1).await;
    let token = app
        .get("/tasks")
        .await
        .set_cookie("taskq_csrf")
        .expect("a CSRF cookie");
    let wrong = "0".repeat(64);
    let s = id.to_string();
    for (path, fields) in [
        (format!("/tasks/{id}/run-now"), String::new()),
        (format!("/tasks/{id}/reschedule"), "when=1h".to_owned()),
        (format!("/tasks/{id}/priority"), "priority=3".to_owned()),
        (format!("/tasks/{id}/delete"), String::new()),
        (
            "/tasks/selected".to_owned(),
            format!("action=delete&id={s}"),
        ),
    ] {
        let cookie = format!("taskq_csrf={token}");
        for (headers, body) in [
            (vec![], fields.clone()),
            (vec![("cookie", cookie.as_str())], fields.clone()),
            (
                vec![("cookie", cookie.as_str())],
                format!("{fields}&csrf={wrong}"),
            ),
            (vec![], format!("{fields}&csrf={token}")),
        ] {
            let r = send(
                &app.router,
                Method::POST,
                &path,
                Cred::Bearer(TOKEN),
                &headers,
                Some(("application/x-www-form-urlencoded", body.clone())),
            )
            .await;
            assert_eq!(r.status, StatusCode::FORBIDDEN, "{path} {headers:?} {body}");
        }
    }
    let t = db.client().get(TaskId(id)).await.unwrap();
    assert_eq!((t.state, t.priority), (TaskState::Pending, 0));
    assert!(
        db.client()
            .audit(&AuditFilter::default())
            .await
            .unwrap()
            .is_empty()
    );
}

/// Queue limits and rate limits are recorded in the audit trail, set and cleared.
async fn queue_limits_are_audited<B: TestBackend>(db: Db<B>) {
    let c = db.client().with_actor("ops:alice");
    c.set_queue_limit("jobs", Some(3)).await.unwrap();
    c.set_queue_rate_limit("jobs", Some((10, Duration::from_secs(60))))
        .await
        .unwrap();
    c.set_queue_limit("jobs", None).await.unwrap();
    c.set_queue_rate_limit("jobs", None).await.unwrap();
    assert!(c.set_queue_limit("jobs", Some(0)).await.is_err());
    let trail = c
        .audit(&AuditFilter {
            queue: Some("jobs".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    let got: Vec<(&str, &str, String)> = trail
        .iter()
        .map(|e| (e.actor.as_str(), e.action.as_str(), e.detail.to_string()))
        .collect();
    assert_eq!(
        got,
        [
            (
                "ops:alice",
                "rate_limit",
                r#"{"rate_limit":null}"#.to_owned()
            ),
            (
                "ops:alice",
                "limit",
                r#"{"concurrency_limit":null}"#.to_owned()
            ),
            (
                "ops:alice",
                "rate_limit",
                r#"{"rate_limit":{"max":10,"period_ms":60000}}"#.to_owned()
            ),
            (
                "ops:alice",
                "limit",
                r#"{"concurrency_limit":3}"#.to_owned()
            ),
        ]
    );
    // The audit page shows them.
    let page = App::new(&db, false).get("/audit?queue=jobs").await.body;
    assert_eq!(
        page.matches(r#"<tr data-action="limit">"#).count(),
        2,
        "{page}"
    );
}

// ------------------------------------------------------------------------ event key actions

/// An event for the event key actions: a poison one is rejected by [`relay_all`]'s sink.
#[derive(Debug, Clone, serde::Serialize)]
#[taskq::event(topic = "orders.<placed>", key = order)]
struct OrderPlaced {
    order: String,
    poison: bool,
}

const TOPIC: &str = "orders.<placed>";
/// A key with markup and quotes: escaped wherever a page shows it.
const KEY: &str = r#"<k&"1>"#;

/// Publishes `KEY`: a poison event then a good one; and key `b`: one good event.
async fn publish_orders<B: TestBackend>(db: &Db<B>) {
    use taskq::outbox::Event;
    for (order, poison) in [(KEY, true), (KEY, false), ("b", false)] {
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
}

/// Relays until nothing is left to send, with a sink that rejects poison events (strict: the
/// key is held); how many poison events the sink was handed.
async fn relay_all<B: TestBackend>(db: &Db<B>) -> usize {
    use taskq::outbox::{FnSink, Message, Outcome, Relay};
    let handed = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let h = handed.clone();
    let sink = FnSink::new(move |batch: Vec<Message>| {
        let poison = batch
            .iter()
            .filter(|m| String::from_utf8_lossy(&m.payload).contains("\"poison\":true"))
            .count();
        h.fetch_add(poison, std::sync::atomic::Ordering::SeqCst);
        async move {
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
        }
    });
    let relay = Relay::builder(db.pool.clone(), sink).build().unwrap();
    while relay.run_once().await.unwrap().published > 0 {}
    handed.load(std::sync::atomic::Ordering::SeqCst)
}

/// `KEY`'s events: (seq, state).
async fn key_events<B: TestBackend>(db: &Db<B>) -> Vec<(u64, &'static str)> {
    db.client()
        .event_list(TOPIC, KEY, 0, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|e| (e.seq, e.state.as_str()))
        .collect()
}

async fn is_held<B: TestBackend>(db: &Db<B>) -> bool {
    let k = db.client().event_key(TOPIC, KEY).await.unwrap().unwrap();
    k.held_at.is_some()
}

/// Every audit entry: (actor, action, detail), newest first.
async fn audit_trail<B: TestBackend>(db: &Db<B>) -> Vec<(String, String, serde_json::Value)> {
    db.client()
        .audit(&AuditFilter::default())
        .await
        .unwrap()
        .into_iter()
        .map(|e| (e.actor, e.action, e.detail))
        .collect()
}

/// The Events page's actions: a held key shows Retry and Skip (its topic and key escaped in
/// the forms), and a Replay form is there. Retry releases the key (the relay sends the event
/// again), Skip marks the event dead and the key goes on, Replay makes the key's events
/// pending again; each redirects to the page, which confirms once, and is audited with the
/// page's actor. Retry of a key that is not held is 409, an unknown key 404 (both escaped,
/// nothing audited).
async fn event_page_actions_change_the_key_and_are_audited<B: TestBackend>(db: Db<B>) {
    let app = App::new(&db, false);
    publish_orders(&db).await;
    assert_eq!(relay_all(&db).await, 1, "the poison event, rejected");
    assert!(is_held(&db).await);
    assert_eq!(key_events(&db).await, [(1, "pending"), (2, "pending")]);

    let page = app.get("/events").await.body;
    let start = page.find(r#"<table id="held-event-keys">"#).expect(&page);
    let held = &page[start..start + page[start..].find("</table>").unwrap()];
    for form in [
        r#"action="./events/retry""#,
        r#"action="./events/skip""#,
        r#"<input type="hidden" name="topic" value="orders.&lt;placed&gt;">"#,
        r#"<input type="hidden" name="key" value="&lt;k&amp;&quot;1&gt;">"#,
    ] {
        assert!(held.contains(form), "{form}: {held}");
    }
    assert!(
        page.contains(
            r#"<form method="post" action="./events/replay" class="filters" id="replay-key">"#
        ),
        "{page}"
    );
    assert!(!page.contains(KEY) && !page.contains("<placed>"), "{page}");

    // Retry: the hold ends, the relay sends the event again (rejected again: held again).
    let r = app
        .post_form("/events/retry", &[("topic", TOPIC), ("key", KEY)])
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
    assert_eq!(r.headers["location"], "../events");
    let flash = r.set_cookie("taskq_flash").expect("a flash cookie");
    assert_eq!(flash, "event_retried.1");
    assert!(!is_held(&db).await);
    assert_eq!(
        audit_trail(&db).await[0],
        (
            "web:token".to_owned(),
            "event_retry".to_owned(),
            serde_json::json!({"topic": TOPIC, "key": KEY})
        )
    );
    let confirmed = send(
        &app.router,
        Method::GET,
        "/events",
        Cred::Bearer(TOKEN),
        &[("cookie", &format!("taskq_flash={flash}"))],
        None,
    )
    .await;
    assert!(
        confirmed.body.contains(
            r#"<p class="flash" id="event-done">Retried: the relays send the held event again.</p>"#
        ),
        "{}",
        confirmed.body
    );
    assert_eq!(
        confirmed.set_cookie("taskq_flash").as_deref(),
        Some(""),
        "shown once"
    );
    assert_eq!(relay_all(&db).await, 1, "the held event went out again");
    assert!(is_held(&db).await);

    // Skip: the event is dead, the key goes on (its second event is delivered).
    let r = app
        .post_form("/events/skip", &[("topic", TOPIC), ("key", KEY)])
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
    assert_eq!(
        r.set_cookie("taskq_flash").as_deref(),
        Some("event_skipped.1")
    );
    assert_eq!(key_events(&db).await, [(1, "dead"), (2, "pending")]);
    assert_eq!(audit_trail(&db).await[0].1, "event_skip");
    assert_eq!(relay_all(&db).await, 0);
    assert_eq!(key_events(&db).await, [(1, "dead"), (2, "delivered")]);
    let k = db.client().event_key(TOPIC, KEY).await.unwrap().unwrap();
    assert_eq!((k.done_seq, k.next_seq, k.held_at), (2, 2, None));

    // Replay from seq 2: that event becomes pending again, then from 0: both.
    let r = app
        .post_form(
            "/events/replay",
            &[("topic", TOPIC), ("key", KEY), ("from_seq", "2")],
        )
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
    assert_eq!(
        r.set_cookie("taskq_flash").as_deref(),
        Some("event_replayed.1")
    );
    assert_eq!(key_events(&db).await, [(1, "dead"), (2, "pending")]);
    let (actor, action, detail) = audit_trail(&db).await.remove(0);
    assert_eq!(
        (actor.as_str(), action.as_str()),
        ("web:token", "event_replay")
    );
    assert_eq!(
        detail,
        serde_json::json!({"topic": TOPIC, "key": KEY, "from_seq": 2, "events": 1})
    );
    assert_eq!(relay_all(&db).await, 0);
    assert_eq!(key_events(&db).await, [(1, "dead"), (2, "delivered")]);
    let r = app
        .post_form(
            "/events/replay",
            &[("topic", TOPIC), ("key", KEY), ("from_seq", "")],
        )
        .await;
    assert_eq!(
        r.set_cookie("taskq_flash").as_deref(),
        Some("event_replayed.2")
    );
    assert_eq!(key_events(&db).await, [(1, "pending"), (2, "pending")]);
    let confirmed = send(
        &app.router,
        Method::GET,
        "/events",
        Cred::Bearer(TOKEN),
        &[("cookie", "taskq_flash=event_replayed.2")],
        None,
    )
    .await;
    assert!(
        confirmed
            .body
            .contains("Replayed: 2 events are pending again"),
        "{}",
        confirmed.body
    );

    // Not held, unknown, bad input: refused, escaped, nothing audited.
    let before = audit_trail(&db).await.len();
    let r = app
        .post_form("/events/retry", &[("topic", TOPIC), ("key", "b")])
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.body);
    assert!(r.body.contains("is not held"), "{}", r.body);
    let r = app
        .post_form("/events/skip", &[("topic", TOPIC), ("key", "<no&such>")])
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.body);
    assert!(
        r.body.contains("&lt;no&amp;such&gt;") && !r.body.contains("<no&such>"),
        "{}",
        r.body
    );
    let r = app
        .post_form(
            "/events/replay",
            &[("topic", TOPIC), ("key", KEY), ("from_seq", "-1")],
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
    let r = app.post_form("/events/retry", &[("topic", TOPIC)]).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
    assert_eq!(audit_trail(&db).await.len(), before);
    assert_eq!(key_events(&db).await, [(1, "pending"), (2, "pending")]);
}

/// `POST api/v1/events/{retry,skip,replay}`: the same changes, audited with the API's actor;
/// 409 `not_held`, 404 for an unknown key, 400 for a body that is not the documented one.
async fn api_event_key_actions_change_the_key_and_are_audited<B: TestBackend>(db: Db<B>) {
    let app = App::new(&db, false);
    publish_orders(&db).await;
    relay_all(&db).await;
    let key = serde_json::json!({"topic": TOPIC, "key": KEY});

    let r = app.api_post("/api/v1/events/retry", key.clone()).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(
        r.json(),
        serde_json::json!({"topic": TOPIC, "key": KEY, "result": "retried"})
    );
    assert!(!is_held(&db).await);
    assert_eq!(
        audit_trail(&db).await[0],
        (
            "api:token".to_owned(),
            "event_retry".to_owned(),
            key.clone()
        )
    );
    let r = app.api_post("/api/v1/events/retry", key.clone()).await;
    assert_eq!(
        (r.status, r.json()["error"]["code"].clone()),
        (StatusCode::CONFLICT, "not_held".into())
    );
    relay_all(&db).await;
    assert!(is_held(&db).await);

    let r = app.api_post("/api/v1/events/skip", key.clone()).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.json()["result"], "skipped");
    assert_eq!(key_events(&db).await, [(1, "dead"), (2, "pending")]);
    assert_eq!(audit_trail(&db).await[0].1, "event_skip");
    relay_all(&db).await;

    let r = app
        .api_post(
            "/api/v1/events/replay",
            serde_json::json!({"topic": TOPIC, "key": KEY, "from_seq": 1}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(
        r.json(),
        serde_json::json!({"topic": TOPIC, "key": KEY, "result": "replayed", "events": 2})
    );
    assert_eq!(key_events(&db).await, [(1, "pending"), (2, "pending")]);
    let (actor, action, detail) = audit_trail(&db).await.remove(0);
    assert_eq!(
        (actor.as_str(), action.as_str()),
        ("api:token", "event_replay")
    );
    assert_eq!(detail["events"], 2);

    let before = audit_trail(&db).await.len();
    let r = app
        .api_post(
            "/api/v1/events/skip",
            serde_json::json!({"topic": TOPIC, "key": "nope"}),
        )
        .await;
    assert_eq!(
        (r.status, r.json()["error"]["code"].clone()),
        (StatusCode::NOT_FOUND, "not_found".into())
    );
    for bad in [
        serde_json::json!({"topic": TOPIC, "key": KEY, "from_seq": 1}),
        serde_json::json!({"topic": TOPIC}),
        serde_json::json!({"topic": TOPIC, "key": ""}),
        serde_json::json!({"topic": TOPIC, "key": KEY, "extra": 1}),
        serde_json::json!({"topic": TOPIC, "key": null}),
        serde_json::json!({"topic": "t".repeat(256), "key": KEY}),
    ] {
        let r = app.api_post("/api/v1/events/retry", bad.clone()).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{bad}: {}", r.body);
    }
    let r = app
        .api_post(
            "/api/v1/events/replay",
            serde_json::json!({"topic": TOPIC, "key": KEY, "from_seq": u64::MAX}),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
    assert_eq!(audit_trail(&db).await.len(), before);
}

/// Read-only: the Events page shows no action, and every event action (page and API) is
/// refused (403), changing nothing; without the CSRF token a page action is refused too.
async fn event_key_actions_are_refused_read_only_and_without_the_csrf_token<B: TestBackend>(
    db: Db<B>,
) {
    publish_orders(&db).await;
    relay_all(&db).await;
    let ro = App::new(&db, true);
    let page = ro.get("/events").await.body;
    assert!(page.contains(r#"<table id="held-event-keys">"#), "{page}");
    assert!(
        !page.contains("<form method=\"post\"") && !page.contains("<th>Actions</th>"),
        "{page}"
    );
    let rw = App::new(&db, false);
    let nonce = rw.get("/events").await.set_cookie("taskq_csrf").unwrap();
    let wrong = "0".repeat(64);
    let fields = support::form(&[("topic", TOPIC), ("key", KEY), ("from_seq", "1")]);
    for path in ["/events/retry", "/events/skip", "/events/replay"] {
        let f = [("topic", TOPIC), ("key", KEY), ("from_seq", "1")];
        assert_eq!(
            ro.post_form(path, &f).await.status,
            StatusCode::FORBIDDEN,
            "{path}"
        );
        let api = ro
            .api_post(
                &format!("/api/v1{path}"),
                serde_json::json!({"topic": TOPIC, "key": KEY}),
            )
            .await;
        assert_eq!(
            (api.status, api.json()["error"]["code"].clone()),
            (StatusCode::FORBIDDEN, "read_only".into()),
            "api {path}"
        );
        let cookie = format!("taskq_csrf={nonce}");
        for (headers, body) in [
            (vec![], fields.clone()),
            (vec![("cookie", cookie.as_str())], fields.clone()),
            (
                vec![("cookie", cookie.as_str())],
                format!("{fields}&csrf={wrong}"),
            ),
        ] {
            let r = send(
                &rw.router,
                Method::POST,
                path,
                Cred::Bearer(TOKEN),
                &headers,
                Some(("application/x-www-form-urlencoded", body.clone())),
            )
            .await;
            assert_eq!(r.status, StatusCode::FORBIDDEN, "{path} {headers:?} {body}");
        }
    }
    assert!(is_held(&db).await);
    assert_eq!(key_events(&db).await, [(1, "pending"), (2, "pending")]);
    assert!(audit_trail(&db).await.is_empty());
}

taskq_tests::conformance!(
    event_page_actions_change_the_key_and_are_audited,
    api_event_key_actions_change_the_key_and_are_audited,
    event_key_actions_are_refused_read_only_and_without_the_csrf_token,
    task_page_actions_change_the_task_and_are_audited,
    checked_tasks_take_one_action_each,
    api_task_actions_change_the_task_and_are_audited,
    read_only_refuses_every_task_action,
    task_actions_need_the_csrf_token,
    queue_limits_are_audited,
);
