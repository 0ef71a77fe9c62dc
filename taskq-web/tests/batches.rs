//! The batch pages and API routes on both backends: a failed batch listed with its counters
//! and progress and shown with its callbacks (linked, with their states) and a paged table of
//! its members (linked, with their states); **Seal batch** and **Cancel batch** from the page
//! and the API change the batch (a cancel writes an audit entry with the request's actor, a
//! seal none); sealing an ended batch is a 409; unknown ids are 404, bad ids 400; a read-only
//! dashboard shows no action and refuses them, and a form without its CSRF token is refused.

mod support;

use std::time::Duration;

use axum::http::{Method, StatusCode};
use serde_json::json;
use support::{Cred, Resp, TOKEN, send};
use taskq::batch::{Batch, BatchEnqueued, BatchId, BatchState};
use taskq::client::AuditFilter;
use taskq::{TaskError, TaskState};
use taskq_tests::RunningWorker;
use taskq_tests::backends::{Db, TestBackend};
use taskq_web::Dashboard;

/// A member that succeeds, or dies at its first failure when `fail`.
#[taskq::task(queue = "bweb", max_attempts = 1)]
async fn bweb_job(label: String, fail: bool) -> Result<(), TaskError> {
    if fail {
        return Err(TaskError::msg(format!("{label} fails")));
    }
    Ok(())
}

/// A task of a queue no worker of these tests serves (it stays where it is).
#[taskq::task(queue = "bweb_idle")]
async fn bweb_idle(label: String) -> Result<(), TaskError> {
    let _ = label;
    Ok(())
}

fn job(label: &str, fail: bool) -> BwebJob {
    BwebJob {
        label: label.into(),
        fail,
    }
}

fn idle(label: &str) -> BwebIdle {
    BwebIdle {
        label: label.into(),
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

    /// A form POST with a CSRF cookie and its field (from the Events page).
    async fn post_form(&self, path: &str) -> Resp {
        support::post_form(&self.router, &["/events"], path, &[]).await
    }

    async fn api_post(&self, path: &str) -> Resp {
        send(
            &self.router,
            Method::POST,
            path,
            Cred::Bearer(TOKEN),
            &[],
            Some(("application/json", "{}".to_owned())),
        )
        .await
    }
}

/// `import <b>7</b>`: three members of `bweb` (the second dies), its callbacks on the idle
/// queue; run by a worker until it has ended (`failed`: `on_complete` pending, `on_success`
/// canceled).
async fn failed_batch<B: TestBackend>(db: &Db<B>) -> BatchEnqueued {
    let b = Batch::new("import <b>7</b>")
        .add(job("a", false))
        .add(job("b", true))
        .add(job("c", false))
        .on_success(idle("success"))
        .on_complete(idle("complete"))
        .enqueue(&db.pool)
        .await
        .unwrap();
    let w = RunningWorker::spawn(db.worker().queue("bweb", 2).register::<BwebJob>());
    let done = db
        .client()
        .wait_batch(b.id, Duration::from_secs(30))
        .await
        .expect("the batch ends");
    w.stop().await;
    assert_eq!(done.state, BatchState::Failed, "{}", B::LABEL);
    b
}

/// An open batch of two idle members with an `on_complete` callback.
async fn open_batch<B: TestBackend>(db: &Db<B>) -> BatchEnqueued {
    Batch::new("open")
        .add(idle("x"))
        .add(idle("y"))
        .on_complete(idle("done"))
        .open()
        .enqueue(&db.pool)
        .await
        .unwrap()
}

/// The audit entries of the batch actions: (actor, action, detail), newest first.
async fn batch_audit<B: TestBackend>(db: &Db<B>) -> Vec<(String, String, serde_json::Value)> {
    db.client()
        .audit(&AuditFilter::default())
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.action.starts_with("batch_"))
        .map(|e| (e.actor, e.action, e.detail))
        .collect()
}

/// The states of batch `id`'s members, in task id order.
async fn member_states<B: TestBackend>(db: &Db<B>, id: BatchId) -> Vec<Option<TaskState>> {
    db.client()
        .batch_members(id, None, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.state)
        .collect()
}

/// The `<tr ...>` row of `body` that starts with `start`, up to its `</tr>`.
fn row<'a>(body: &'a str, start: &str) -> &'a str {
    let at = body
        .find(start)
        .unwrap_or_else(|| panic!("{start} in {body}"));
    let rest = &body[at..];
    &rest[..rest.find("</tr>").unwrap()]
}

/// The list shows the failed batch (escaped name, state, counters, progress) and the nav links
/// it; its page shows its fields and counters, its callbacks linked with their states, its
/// members linked with their states (paged), and no action (it has ended). An open batch's
/// page offers **Seal batch** and **Cancel batch**; the seal from the page makes it `running`
/// (confirmed once, not audited), the cancel cancels its members and its callback (audited as
/// `batch_cancel` by `web:token`), and it then offers nothing. Unknown ids: 404; a bad id: 400.
async fn batch_pages_show_the_counters_and_members_and_their_actions_change_them<B: TestBackend>(
    db: Db<B>,
) {
    use TaskState::*;
    let bad = failed_batch(&db).await;
    let id = bad.id.0;
    let app = App::new(&db, false);

    let list = app.get("/batches").await;
    assert_eq!(list.status, StatusCode::OK, "{}", list.body);
    let r = row(
        &list.body,
        &format!(r#"<tr data-id="{id}" data-state="failed">"#),
    );
    assert!(r.contains("import &lt;b&gt;7&lt;/b&gt;"), "{r}");
    assert!(!list.body.contains("<b>7</b>"), "the name is escaped");
    assert!(
        r.contains(r#"<span class="wf-failed">failed</span>"#),
        "{r}"
    );
    for (k, n) in [
        ("total", 3),
        ("succeeded", 2),
        ("failed", 1),
        ("pending", 0),
    ] {
        assert!(
            r.contains(&format!(r#"data-count="{k}">{n}</td>"#)),
            "{k} {n}: {r}"
        );
    }
    assert!(r.contains("3/3 ended"), "{r}");
    assert!(list.links().iter().any(|l| l == &format!("./batches/{id}")));
    assert!(
        app.get("/")
            .await
            .links()
            .iter()
            .any(|l| l.ends_with("/batches")),
        "the nav links the batches"
    );

    let page = app.get(&format!("/batches/{id}")).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    let b = &page.body;
    assert!(
        b.contains(&format!(
            r#"<h1>Batch {id} <span class="wf-failed">failed</span></h1>"#
        )),
        "{b}"
    );
    assert!(b.contains("<dt>Sealed</dt><dd>yes</dd>"), "{b}");
    for (k, n) in [
        ("total", 3),
        ("succeeded", 2),
        ("failed", 1),
        ("pending", 0),
    ] {
        assert!(
            b.contains(&format!(r#"<td class="n" data-count="{k}">{n}</td>"#)),
            "{k} {n}: {b}"
        );
    }
    let success = row(b, r#"<tr data-callback="on_success">"#);
    let on_success = bad.on_success.unwrap();
    assert!(
        success.contains(&format!(
            r#"<a href="../tasks/{on_success}">{on_success}</a>"#
        )) && success.contains(r#"<td class="state-canceled">canceled</td>"#),
        "{success}"
    );
    let complete = row(b, r#"<tr data-callback="on_complete">"#);
    let on_complete = bad.on_complete.unwrap();
    assert!(
        complete.contains(&format!(r#"<a href="../tasks/{on_complete}">"#))
            && complete.contains(r#"<td class="state-pending">pending</td>"#),
        "{complete}"
    );
    for (task, state) in bad.tasks.iter().zip(["succeeded", "dead", "succeeded"]) {
        let r = row(
            b,
            &format!(r#"<tr data-task="{task}" data-state="{state}">"#),
        );
        assert!(
            r.contains(&format!(r#"<a href="../tasks/{task}">{task}</a>"#))
                && r.contains("<td>bweb_job</td>")
                && r.contains(">bweb</a>"),
            "{r}"
        );
    }
    assert!(!b.contains(r#"id="actions""#), "an ended batch: no action");
    // Members page by task id.
    let first = app.get(&format!("/batches/{id}?limit=2")).await;
    assert!(
        first
            .body
            .contains(&format!(r#"data-task="{}""#, bad.tasks[1]))
    );
    assert!(
        !first
            .body
            .contains(&format!(r#"data-task="{}""#, bad.tasks[2]))
    );
    let next = format!("../batches/{id}?after={}&amp;limit=2", bad.tasks[1]);
    assert!(first.body.contains(&next), "{}", first.body);
    let second = app
        .get(&format!("/batches/{id}?after={}&limit=2", bad.tasks[1]))
        .await
        .body;
    assert!(second.contains(&format!(r#"data-task="{}""#, bad.tasks[2])));
    assert!(!second.contains(&format!(r#"data-task="{}""#, bad.tasks[0])));
    assert!(!second.contains(r#"rel="next""#), "the last page");

    let open = open_batch(&db).await;
    let oid = open.id.0;
    let seal_button = format!(r#"action="../batches/{oid}/seal""#);
    let cancel_button = format!(r#"action="../batches/{oid}/cancel""#);
    let p = app.get(&format!("/batches/{oid}")).await.body;
    assert!(p.contains(r#"<span class="wf-open">open</span>"#), "{p}");
    assert!(p.contains("<dt>Sealed</dt><dd>no</dd>"), "{p}");
    assert!(
        p.contains(&seal_button) && p.contains(">Seal batch</button>"),
        "{p}"
    );
    assert!(
        p.contains(&cancel_button) && p.contains(">Cancel batch</button>"),
        "{p}"
    );

    let r = app.post_form(&format!("/batches/{oid}/seal")).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
    assert_eq!(r.location(), Some(format!("../../batches/{oid}").as_str()));
    let flash = r.set_cookie("taskq_flash").expect("a flash");
    assert_eq!(flash, format!("batch_sealed.{oid}"));
    let sealed = db.client().batch(open.id).await.unwrap();
    assert!(sealed.sealed);
    assert_eq!(sealed.state, BatchState::Running, "{}", B::LABEL);
    assert!(batch_audit(&db).await.is_empty(), "a seal is not audited");
    let cookie = format!("taskq_flash={flash}");
    let shown = send(
        &app.router,
        Method::GET,
        &format!("/batches/{oid}"),
        Cred::Bearer(TOKEN),
        &[("cookie", &cookie)],
        None,
    )
    .await;
    assert!(
        shown.body.contains(r#"id="batch-done""#) && shown.body.contains("Sealed: "),
        "{}",
        shown.body
    );
    assert!(
        shown
            .set_cookie_line("taskq_flash")
            .is_some_and(|l| l.contains("Max-Age=0")),
        "shown once: the flash is cleared"
    );
    let running = app.get(&format!("/batches/{oid}")).await.body;
    assert!(running.contains(r#"<span class="wf-running">running</span>"#));
    assert!(running.contains(&cancel_button), "{running}");
    assert!(!running.contains(&seal_button), "sealed: no seal");

    let r = app.post_form(&format!("/batches/{oid}/cancel")).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
    assert_eq!(
        r.set_cookie("taskq_flash").as_deref(),
        Some(format!("batch_canceled.{oid}").as_str())
    );
    assert_eq!(
        member_states(&db, open.id).await,
        [Some(Canceled), Some(Canceled)]
    );
    assert_eq!(
        db.client()
            .get(open.on_complete.unwrap())
            .await
            .unwrap()
            .state,
        Canceled
    );
    assert_eq!(
        batch_audit(&db).await,
        [(
            "web:token".to_owned(),
            "batch_cancel".to_owned(),
            json!({"batch_id": oid, "canceled": 2, "cancel_requested": 0,
                   "callbacks_canceled": 1})
        )]
    );
    let canceled = app.get(&format!("/batches/{oid}")).await.body;
    assert!(
        canceled.contains(r#"<span class="wf-canceled">canceled</span>"#),
        "{canceled}"
    );
    assert!(!canceled.contains(r#"id="actions""#), "{canceled}");
    assert!(
        row(&canceled, r#"<tr data-callback="on_complete">"#)
            .contains(r#"<td class="state-canceled">canceled</td>"#)
    );
    assert!(
        app.get("/batches")
            .await
            .body
            .contains(&format!(r#"<tr data-id="{oid}" data-state="canceled">"#))
    );
    let named = app.get("/batches?name=open").await.body;
    assert!(named.contains(&format!(r#"data-id="{oid}""#)));
    assert!(!named.contains(&format!(r#"data-id="{id}""#)), "{named}");

    let unknown = id + oid + 100;
    assert_eq!(
        app.get(&format!("/batches/{unknown}")).await.status,
        StatusCode::NOT_FOUND
    );
    for action in ["cancel", "seal"] {
        let r = app.post_form(&format!("/batches/{unknown}/{action}")).await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{action}: {}", r.body);
    }
    // Sealing an ended batch: 409, nothing changed.
    let r = app.post_form(&format!("/batches/{id}/seal")).await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.body);
    assert_eq!(batch_audit(&db).await.len(), 1, "nothing audited for them");
    assert_eq!(
        app.get("/batches/abc").await.status,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        app.get(&format!("/batches/{id}?after=x")).await.status,
        StatusCode::BAD_REQUEST
    );
}

/// The list pages newest first (`next_before`) and filters by name; a batch reads with its
/// counters, callbacks and a page of members (`next_after`; a deleted member has no state);
/// seal and cancel answer what they did and change the batch (the cancel audited as
/// `api:token`); sealing an ended batch is 409 `wrong_state`; unknown ids are 404 `not_found`
/// and bad ids 400, changing nothing.
async fn the_batch_api_lists_reads_seals_and_cancels<B: TestBackend>(db: Db<B>) {
    use TaskState::*;
    let bad = failed_batch(&db).await;
    let open = open_batch(&db).await;
    let app = App::new(&db, false);

    let page = app.get("/api/v1/batches?limit=1").await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    let page = page.json();
    assert_eq!(page["batches"].as_array().unwrap().len(), 1, "{page}");
    let newest = &page["batches"][0];
    assert_eq!(newest["id"], open.id.0);
    assert_eq!(
        (
            newest["name"].clone(),
            newest["state"].clone(),
            newest["sealed"].clone()
        ),
        (json!("open"), json!("open"), json!(false))
    );
    assert_eq!(
        (newest["total"].clone(), newest["pending"].clone()),
        (json!(2), json!(2))
    );
    assert_eq!(newest["on_complete"], open.on_complete.unwrap().0);
    assert!(newest["on_success"].is_null());
    assert_eq!(page["next_before"], open.id.0);
    let next = app
        .get(&format!("/api/v1/batches?limit=1&before={}", open.id))
        .await
        .json();
    assert_eq!(next["batches"][0]["id"], bad.id.0, "{next}");
    assert!(next["next_before"].is_null(), "{next}");
    let named = app.get("/api/v1/batches?name=open").await.json();
    assert_eq!(named["batches"].as_array().unwrap().len(), 1);
    assert_eq!(named["batches"][0]["id"], open.id.0);

    let one = app.get(&format!("/api/v1/batches/{}", bad.id)).await;
    assert_eq!(one.status, StatusCode::OK, "{}", one.body);
    let one = one.json();
    assert_eq!(one["state"], "failed");
    assert_eq!(
        [
            &one["total"],
            &one["succeeded"],
            &one["failed"],
            &one["pending"]
        ],
        [&json!(3), &json!(2), &json!(1), &json!(0)]
    );
    assert!(one["completed_at"].is_string() && one["succeeded_at"].is_null());
    assert_eq!(one["on_success"], bad.on_success.unwrap().0);
    let members = one["members"].as_array().unwrap();
    assert_eq!(members.len(), 3, "{one}");
    assert_eq!(
        members[1],
        json!({"task_id": bad.tasks[1].0, "name": "bweb_job", "queue": "bweb", "state": "dead"})
    );
    assert!(one["next_after"].is_null());
    let paged = app
        .get(&format!("/api/v1/batches/{}?limit=2", bad.id))
        .await
        .json();
    assert_eq!(paged["members"].as_array().unwrap().len(), 2);
    assert_eq!(paged["next_after"], bad.tasks[1].0);
    let rest = app
        .get(&format!(
            "/api/v1/batches/{}?limit=2&after={}",
            bad.id, bad.tasks[1]
        ))
        .await
        .json();
    assert_eq!(rest["members"][0]["task_id"], bad.tasks[2].0, "{rest}");
    assert!(rest["next_after"].is_null());

    let r = app
        .api_post(&format!("/api/v1/batches/{}/seal", open.id))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.json(), json!({"id": open.id.0, "result": "sealed"}));
    assert!(db.client().batch(open.id).await.unwrap().sealed);
    assert!(batch_audit(&db).await.is_empty(), "a seal is not audited");

    let r = app
        .api_post(&format!("/api/v1/batches/{}/cancel", open.id))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(
        r.json(),
        json!({"id": open.id.0, "result": "canceled", "canceled": 2, "cancel_requested": 0,
               "callbacks_canceled": 1})
    );
    assert_eq!(
        member_states(&db, open.id).await,
        [Some(Canceled), Some(Canceled)],
        "{}",
        B::LABEL
    );
    let audit = batch_audit(&db).await;
    assert_eq!(
        audit,
        [(
            "api:token".to_owned(),
            "batch_cancel".to_owned(),
            json!({"batch_id": open.id.0, "canceled": 2, "cancel_requested": 0,
                   "callbacks_canceled": 1})
        )]
    );
    let canceled = app
        .get(&format!("/api/v1/batches/{}", open.id))
        .await
        .json();
    assert_eq!(canceled["state"], "canceled", "{canceled}");
    assert!(canceled["canceled_at"].is_string());
    assert_eq!(canceled["pending"], 0);
    // A deleted member has no state.
    db.client().delete(open.tasks[0]).await.unwrap();
    let o = app
        .get(&format!("/api/v1/batches/{}", open.id))
        .await
        .json();
    assert_eq!(o["members"][0]["task_id"], open.tasks[0].0);
    assert!(o["members"][0]["state"].is_null(), "{o}");
    assert_eq!(o["members"][1]["state"], "canceled");

    for ended in [bad.id, open.id] {
        let r = app.api_post(&format!("/api/v1/batches/{ended}/seal")).await;
        assert_eq!(r.status, StatusCode::CONFLICT, "{ended}: {}", r.body);
        assert_eq!(r.json()["error"]["code"], "wrong_state");
    }

    let unknown = bad.id.0 + open.id.0 + 100;
    for (method, path) in [
        ("get", format!("/api/v1/batches/{unknown}")),
        ("post", format!("/api/v1/batches/{unknown}/cancel")),
        ("post", format!("/api/v1/batches/{unknown}/seal")),
    ] {
        let r = if method == "get" {
            app.get(&path).await
        } else {
            app.api_post(&path).await
        };
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{path}: {}", r.body);
        assert_eq!(r.json()["error"]["code"], "not_found", "{path}");
    }
    for path in [
        "/api/v1/batches/abc",
        "/api/v1/batches/9223372036854775808",
        "/api/v1/batches/1?limit=0",
        "/api/v1/batches/1?after=x",
        "/api/v1/batches?limit=0",
        "/api/v1/batches?before=x",
        "/api/v1/batches?before=9223372036854775808",
    ] {
        let r = app.get(path).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{path}: {}", r.body);
        assert_eq!(r.json()["error"]["code"], "bad_request", "{path}");
    }
    let r = app.api_post("/api/v1/batches/abc/cancel").await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
    assert_eq!(batch_audit(&db).await.len(), 1, "nothing more audited");
}

/// Read-only: the batch page shows no action and every batch action (page and API) is
/// refused (403); without the CSRF token a page action is refused too. Nothing changes and
/// nothing is audited.
async fn batch_actions_are_refused_read_only_and_without_the_csrf_token<B: TestBackend>(db: Db<B>) {
    use TaskState::*;
    let open = open_batch(&db).await;
    let ro = App::new(&db, true);
    let rw = App::new(&db, false);
    let page = ro.get(&format!("/batches/{}", open.id)).await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(
        !page.body.contains("<form method=\"post\"") && !page.body.contains(r#"id="actions""#),
        "{}",
        page.body
    );
    assert!(
        rw.get(&format!("/batches/{}", open.id))
            .await
            .body
            .contains(r#"id="actions""#),
        "the same page offers actions when the dashboard is not read-only"
    );
    let nonce = rw.get("/batches").await.set_cookie("taskq_csrf").unwrap();
    let cookie = format!("taskq_csrf={nonce}");
    let wrong = format!("csrf={}", "0".repeat(64));
    for action in ["seal", "cancel"] {
        let path = format!("/batches/{}/{action}", open.id);
        assert_eq!(
            ro.post_form(&path).await.status,
            StatusCode::FORBIDDEN,
            "{path}"
        );
        let api = ro.api_post(&format!("/api/v1{path}")).await;
        assert_eq!(
            (api.status, api.json()["error"]["code"].clone()),
            (StatusCode::FORBIDDEN, json!("read_only")),
            "api {path}"
        );
        for (headers, body) in [
            (vec![], String::new()),
            (vec![("cookie", cookie.as_str())], String::new()),
            (vec![("cookie", cookie.as_str())], wrong.clone()),
        ] {
            let r = send(
                &rw.router,
                Method::POST,
                &path,
                Cred::Bearer(TOKEN),
                &headers,
                Some(("application/x-www-form-urlencoded", body.clone())),
            )
            .await;
            assert_eq!(r.status, StatusCode::FORBIDDEN, "{path} {headers:?} {body}");
        }
        // An API change must be JSON.
        let r = send(
            &rw.router,
            Method::POST,
            &format!("/api/v1{path}"),
            Cred::Bearer(TOKEN),
            &[],
            Some(("application/x-www-form-urlencoded", String::new())),
        )
        .await;
        assert_eq!(r.status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{path}");
    }
    let b = db.client().batch(open.id).await.unwrap();
    assert_eq!((b.state, b.sealed), (BatchState::Open, false));
    assert_eq!(
        member_states(&db, open.id).await,
        [Some(Pending), Some(Pending)]
    );
    assert!(batch_audit(&db).await.is_empty());
}

taskq_tests::conformance!(
    batch_pages_show_the_counters_and_members_and_their_actions_change_them,
    the_batch_api_lists_reads_seals_and_cancels,
    batch_actions_are_refused_read_only_and_without_the_csrf_token,
);
