//! The workflow pages and API routes on both backends: a failed workflow listed with its
//! progress and shown with its steps (states, what each runs after, the cleanup and
//! canceled-by-a-dependency markers, links to the tasks); **Retry failed steps** and **Cancel
//! workflow** from the page and the API change the rows and write audit entries with the
//! request's actor; unknown ids are 404, bad ids 400; a read-only dashboard shows no action
//! and refuses them, and a form without its CSRF token is refused.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::http::{Method, StatusCode};
use serde_json::json;
use support::{Cred, Resp, TOKEN, send};
use taskq::client::AuditFilter;
use taskq::workflow::{Workflow, WorkflowEnqueued, WorkflowId, WorkflowState};
use taskq::{Data, TaskError, TaskState};
use taskq_tests::RunningWorker;
use taskq_tests::backends::{Db, TestBackend};
use taskq_web::Dashboard;

/// Whether [`wfweb_flaky`] fails: closed (it fails) until opened.
#[derive(Clone, Default)]
struct Gate(Arc<AtomicBool>);

impl Gate {
    fn is_open(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
    fn open(&self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// A step that succeeds.
#[taskq::task(queue = "wfweb")]
async fn wfweb_step(label: String) -> Result<(), TaskError> {
    let _ = label;
    Ok(())
}

/// A step that dies at its first failure while its gate is closed.
#[taskq::task(queue = "wfweb", max_attempts = 1)]
async fn wfweb_flaky(label: String, gate: Data<Gate>) -> Result<(), TaskError> {
    let _ = label;
    if gate.is_open() {
        Ok(())
    } else {
        Err(TaskError::msg("the printer is out of paper"))
    }
}

/// A step of a queue no worker of these tests serves (it stays where it is).
#[taskq::task(queue = "wfweb_idle")]
async fn wfweb_idle(label: String) -> Result<(), TaskError> {
    let _ = label;
    Ok(())
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

    /// A form POST with a CSRF cookie and its field (from the Events page, which always has
    /// a form unless the dashboard is read-only).
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

/// A worker of the `wfweb` queue.
fn worker<B: TestBackend>(db: &Db<B>, gate: &Gate) -> RunningWorker {
    RunningWorker::spawn(
        db.worker()
            .queue("wfweb", 2)
            .register::<WfwebStep>()
            .register::<WfwebFlaky>()
            .data(gate.clone()),
    )
}

/// `fetch` → `render` (dies while `gate` is closed) → `mail`, and `tidy`, a cleanup step after
/// `render`; run by a worker until it has ended.
async fn run_report<B: TestBackend>(db: &Db<B>, gate: &Gate) -> WorkflowEnqueued {
    let wf = Workflow::new("report <b>7</b>")
        .step(
            "fetch",
            WfwebStep {
                label: "fetch".into(),
            },
        )
        .step_after(
            "render",
            WfwebFlaky {
                label: "render".into(),
            },
            ["fetch"],
        )
        .step_after(
            "mail",
            WfwebStep {
                label: "mail".into(),
            },
            ["render"],
        )
        .cleanup_after(
            "tidy",
            WfwebStep {
                label: "tidy".into(),
            },
            ["render"],
        )
        .enqueue(&db.pool)
        .await
        .unwrap();
    settle(db, gate, wf.id).await;
    wf
}

/// Runs a worker until workflow `id` has ended.
async fn settle<B: TestBackend>(db: &Db<B>, gate: &Gate, id: WorkflowId) -> WorkflowState {
    let w = worker(db, gate);
    let done = db
        .client()
        .wait_workflow(id, Duration::from_secs(30))
        .await
        .expect("the workflow ends");
    w.stop().await;
    done.state
}

/// Two steps on a queue no worker serves: `a`, and `b` after it.
async fn idle_workflow<B: TestBackend>(db: &Db<B>) -> WorkflowEnqueued {
    Workflow::new("idle")
        .step("a", WfwebIdle { label: "a".into() })
        .step_after("b", WfwebIdle { label: "b".into() }, ["a"])
        .enqueue(&db.pool)
        .await
        .unwrap()
}

/// The audit entries of the workflow actions: (actor, action, detail), newest first.
async fn workflow_audit<B: TestBackend>(db: &Db<B>) -> Vec<(String, String, serde_json::Value)> {
    db.client()
        .audit(&AuditFilter::default())
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.action.starts_with("workflow_"))
        .map(|e| (e.actor, e.action, e.detail))
        .collect()
}

/// The steps of workflow `id` by name and state.
async fn step_states<B: TestBackend>(db: &Db<B>, id: WorkflowId) -> Vec<(String, TaskState)> {
    db.client()
        .workflow_steps(id)
        .await
        .unwrap()
        .into_iter()
        .map(|s| (s.step, s.state))
        .collect()
}

fn named(v: &[(&str, TaskState)]) -> Vec<(String, TaskState)> {
    v.iter().map(|(n, s)| ((*n).to_owned(), *s)).collect()
}

/// The list shows the failed workflow (escaped name, state, progress per state) and the nav
/// links it; its page shows each step's state, what it runs after, the markers and the task
/// links, the graph by level, and **Retry failed steps** but no cancel (it has ended). The
/// retry from the page moves `render` back to pending (audited as `workflow_retry` by
/// `web:token`), the page then confirms it once; after a worker ran it, the workflow has
/// succeeded and offers no action. **Cancel workflow** on a workflow that has not run cancels
/// both its steps (audited). Markup in names is escaped. Unknown ids: 404 pages; a bad id: 400.
async fn workflow_pages_show_the_steps_and_their_actions_change_them<B: TestBackend>(db: Db<B>) {
    use TaskState::*;
    let gate = Gate::default();
    let wf = run_report(&db, &gate).await;
    let id = wf.id.0;
    let app = App::new(&db, false);

    let list = app.get("/workflows").await;
    assert_eq!(list.status, StatusCode::OK, "{}", list.body);
    let row = format!(r#"<tr data-id="{id}" data-state="failed">"#);
    assert!(list.body.contains(&row), "{}: {}", B::LABEL, list.body);
    assert!(list.body.contains("report &lt;b&gt;7&lt;/b&gt;"));
    assert!(!list.body.contains("<b>7</b>"), "the name is escaped");
    for (state, n) in [
        ("waiting", 0),
        ("succeeded", 2),
        ("dead", 1),
        ("canceled", 1),
    ] {
        assert!(
            list.body
                .contains(&format!(r#"data-count="{state}">{n}</td>"#)),
            "{state} {n}: {}",
            list.body
        );
    }
    assert!(list.body.contains("4/4 ended"), "{}", list.body);
    assert!(
        list.links()
            .iter()
            .any(|l| l == &format!("./workflows/{id}"))
    );
    assert!(
        app.get("/")
            .await
            .links()
            .iter()
            .any(|l| l.ends_with("/workflows")),
        "the nav links the workflows"
    );

    let page = app.get(&format!("/workflows/{id}")).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    let b = &page.body;
    assert!(
        b.contains(r#"<span class="wf-failed">failed</span>"#),
        "{b}"
    );
    for (step, state) in [
        ("fetch", "succeeded"),
        ("render", "dead"),
        ("mail", "canceled"),
        ("tidy", "succeeded"),
    ] {
        assert!(
            b.contains(&format!(r#"<tr data-step="{step}" data-state="{state}">"#)),
            "{step} {state}: {b}"
        );
        let task = wf.task(step).unwrap();
        assert!(
            page.links().contains(&format!("../tasks/{task}")),
            "{step} links its task"
        );
    }
    let mail_row = b.split(r#"<tr data-step="mail""#).nth(1).unwrap();
    let mail_row = &mail_row[..mail_row.find("</tr>").unwrap()];
    assert!(
        mail_row.contains("<td>render</td>") && mail_row.contains("canceled by a dependency"),
        "{mail_row}"
    );
    let tidy_row = b.split(r#"<tr data-step="tidy""#).nth(1).unwrap();
    let tidy_row = &tidy_row[..tidy_row.find("</tr>").unwrap()];
    assert!(tidy_row.contains(r#"class="badge cleanup""#), "{tidy_row}");
    assert!(!tidy_row.contains("canceled by a dependency"));
    // The graph: fetch on level 0, render on 1, mail and tidy on 2.
    let graph = &b[b.find(r#"id="graph""#).unwrap()..b.find(r#"<table id="steps""#).unwrap()];
    let level_of = |step: &str| {
        let at = graph
            .find(&format!(r#"data-step="{step}""#))
            .unwrap_or_else(|| panic!("{step} in the graph: {graph}"));
        let open = graph[..at].rfind("data-level=\"").unwrap() + 12;
        graph[open..open + 1].parse::<u32>().unwrap()
    };
    assert_eq!(
        ["fetch", "render", "mail", "tidy"].map(level_of),
        [0, 1, 2, 2]
    );
    let retry_button = format!(r#"action="../workflows/{id}/retry""#);
    let cancel_button = format!(r#"action="../workflows/{id}/cancel""#);
    assert!(
        b.contains(&retry_button) && b.contains(">Retry failed steps</button>"),
        "{b}"
    );
    assert!(!b.contains(&cancel_button), "an ended workflow: no cancel");

    gate.open();
    let r = app.post_form(&format!("/workflows/{id}/retry")).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
    assert_eq!(r.location(), Some(format!("../../workflows/{id}").as_str()));
    let flash = r.set_cookie("taskq_flash").expect("a flash");
    assert_eq!(flash, format!("workflow_retried.{id}"));
    assert_eq!(
        step_states(&db, wf.id).await,
        named(&[
            ("fetch", Succeeded),
            ("render", Pending),
            ("mail", Canceled),
            ("tidy", Succeeded)
        ]),
        "{}",
        B::LABEL
    );
    let render = wf.task("render").unwrap();
    assert_eq!(
        workflow_audit(&db).await,
        [(
            "web:token".to_owned(),
            "workflow_retry".to_owned(),
            json!({"workflow_id": id, "retried": 1, "task_ids": [render.0]})
        )]
    );
    let cookie = format!("taskq_flash={flash}");
    let shown = send(
        &app.router,
        Method::GET,
        &format!("/workflows/{id}"),
        Cred::Bearer(TOKEN),
        &[("cookie", &cookie)],
        None,
    )
    .await;
    assert!(
        shown.body.contains(r#"id="workflow-done""#),
        "{}",
        shown.body
    );
    assert!(
        shown
            .body
            .contains("Retried: its dead steps are pending again.")
    );
    assert!(
        shown
            .set_cookie_line("taskq_flash")
            .is_some_and(|l| l.contains("Max-Age=0")),
        "shown once: the flash is cleared"
    );
    let running = app.get(&format!("/workflows/{id}")).await.body;
    assert!(running.contains(r#"<span class="wf-running">running</span>"#));
    assert!(
        running.contains(&cancel_button) && running.contains(">Cancel workflow</button>"),
        "{running}"
    );
    assert!(!running.contains(&retry_button), "no dead step: no retry");

    assert_eq!(settle(&db, &gate, wf.id).await, WorkflowState::Succeeded);
    let done = app.get(&format!("/workflows/{id}")).await.body;
    assert!(
        done.contains(r#"<span class="wf-succeeded">succeeded</span>"#),
        "{done}"
    );
    assert!(done.contains(r#"<tr data-step="mail" data-state="succeeded">"#));
    assert!(!done.contains(r#"id="actions""#), "{done}");

    let idle = idle_workflow(&db).await;
    let r = app
        .post_form(&format!("/workflows/{}/cancel", idle.id))
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
    assert_eq!(
        step_states(&db, idle.id).await,
        named(&[("a", Canceled), ("b", Canceled)])
    );
    let canceled = app.get(&format!("/workflows/{}", idle.id)).await.body;
    assert!(canceled.contains(r#"<span class="wf-canceled">canceled</span>"#));
    let audit = workflow_audit(&db).await;
    assert_eq!(
        (audit[0].0.as_str(), audit[0].1.as_str()),
        ("web:token", "workflow_cancel")
    );
    assert_eq!(audit[0].2["workflow_id"], idle.id.0);
    assert_eq!(audit[0].2["canceled"], 2);
    let list = app.get("/workflows").await.body;
    assert!(list.contains(&format!(
        r#"<tr data-id="{}" data-state="canceled">"#,
        idle.id
    )));

    // Markup in a workflow's name and a step's name is shown as text.
    let evil = [
        "<script>alert(1)</script>",
        r#""><img src=x onerror=alert(1)>"#,
    ];
    let marked = Workflow::new(evil[0])
        .step(evil[1], WfwebIdle { label: "x".into() })
        .enqueue(&db.pool)
        .await
        .unwrap();
    for path in ["/workflows".to_owned(), format!("/workflows/{}", marked.id)] {
        let body = app.get(&path).await.body;
        assert!(
            body.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
            "{path}: {body}"
        );
        for e in evil {
            assert!(!body.contains(e), "{path}: {e} unescaped");
        }
    }
    assert!(
        app.get(&format!("/workflows/{}", marked.id))
            .await
            .body
            .contains("&quot;&gt;&lt;img src=x onerror=alert(1)&gt;")
    );

    let unknown = id + idle.id.0 + marked.id.0 + 100;
    assert_eq!(
        app.get(&format!("/workflows/{unknown}")).await.status,
        StatusCode::NOT_FOUND
    );
    for action in ["cancel", "retry"] {
        let r = app
            .post_form(&format!("/workflows/{unknown}/{action}"))
            .await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{action}: {}", r.body);
    }
    assert_eq!(
        workflow_audit(&db).await.len(),
        2,
        "nothing audited for them"
    );
    assert_eq!(
        app.get("/workflows/abc").await.status,
        StatusCode::BAD_REQUEST
    );
}

/// The list pages newest first (`next_before`), filters by name; a workflow reads with its
/// steps; retry and cancel answer what they did, change the rows and are audited as
/// `api:token`; unknown ids are 404 `not_found` and bad ids 400, changing nothing.
async fn the_workflow_api_lists_reads_cancels_and_retries<B: TestBackend>(db: Db<B>) {
    use TaskState::*;
    let gate = Gate::default();
    let report = run_report(&db, &gate).await;
    let idle = idle_workflow(&db).await;
    let app = App::new(&db, false);

    let page = app.get("/api/v1/workflows?limit=1").await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    let page = page.json();
    assert_eq!(page["workflows"].as_array().unwrap().len(), 1, "{page}");
    let newest = &page["workflows"][0];
    assert_eq!(newest["id"], idle.id.0);
    assert_eq!(
        (newest["name"].clone(), newest["state"].clone()),
        (json!("idle"), json!("running"))
    );
    assert_eq!(newest["counts"]["pending"], 1);
    assert_eq!(newest["counts"]["waiting"], 1);
    assert!(newest["canceled_at"].is_null());
    assert_eq!(page["next_before"], idle.id.0);
    let next = app
        .get(&format!("/api/v1/workflows?limit=1&before={}", idle.id))
        .await
        .json();
    assert_eq!(next["workflows"][0]["id"], report.id.0, "{next}");
    assert_eq!(next["workflows"][0]["state"], "failed");
    assert!(next["next_before"].is_null(), "{next}");
    let named_page = app.get("/api/v1/workflows?name=idle").await.json();
    assert_eq!(named_page["workflows"].as_array().unwrap().len(), 1);
    assert_eq!(named_page["workflows"][0]["id"], idle.id.0);

    let one = app.get(&format!("/api/v1/workflows/{}", report.id)).await;
    assert_eq!(one.status, StatusCode::OK, "{}", one.body);
    let one = one.json();
    assert_eq!(one["state"], "failed");
    assert_eq!(
        one["counts"],
        json!({"waiting": 0, "pending": 0, "running": 0, "succeeded": 2, "dead": 1,
               "canceled": 1, "expired": 0})
    );
    let steps = one["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 4);
    let mail = &steps[2];
    assert_eq!(
        (
            mail["step"].clone(),
            mail["state"].clone(),
            mail["after"].clone()
        ),
        (json!("mail"), json!("canceled"), json!(["render"]))
    );
    assert_eq!(mail["canceled_by_dependency"], true);
    assert_eq!(mail["task_id"], report.task("mail").unwrap().0);
    assert_eq!(
        (mail["name"].clone(), mail["queue"].clone()),
        (json!("wfweb_step"), json!("wfweb"))
    );
    assert_eq!(steps[3]["runs_after_failure"], true);
    assert_eq!(steps[3]["canceled_by_dependency"], false);

    gate.open();
    let r = app
        .api_post(&format!("/api/v1/workflows/{}/retry", report.id))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(
        r.json(),
        json!({"id": report.id.0, "result": "retried", "retried": 1})
    );
    let render = report.task("render").unwrap();
    assert_eq!(db.client().get(render).await.unwrap().state, Pending);
    assert_eq!(
        workflow_audit(&db).await[0],
        (
            "api:token".to_owned(),
            "workflow_retry".to_owned(),
            json!({"workflow_id": report.id.0, "retried": 1, "task_ids": [render.0]})
        )
    );
    assert_eq!(
        settle(&db, &gate, report.id).await,
        WorkflowState::Succeeded,
        "{}",
        B::LABEL
    );

    let r = app
        .api_post(&format!("/api/v1/workflows/{}/cancel", idle.id))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(
        r.json(),
        json!({"id": idle.id.0, "result": "canceled", "canceled": 2, "cancel_requested": 0})
    );
    assert_eq!(
        step_states(&db, idle.id).await,
        named(&[("a", Canceled), ("b", Canceled)])
    );
    let audit = workflow_audit(&db).await;
    assert_eq!(
        (audit[0].0.as_str(), audit[0].1.as_str()),
        ("api:token", "workflow_cancel")
    );
    assert_eq!(
        audit[0].2,
        json!({"workflow_id": idle.id.0, "canceled": 2, "cancel_requested": 0})
    );
    let canceled = app
        .get(&format!("/api/v1/workflows/{}", idle.id))
        .await
        .json();
    assert_eq!(canceled["state"], "canceled");
    assert!(canceled["canceled_at"].is_string(), "{canceled}");

    let unknown = report.id.0 + idle.id.0 + 100;
    let before = workflow_audit(&db).await.len();
    for (method, path) in [
        ("get", format!("/api/v1/workflows/{unknown}")),
        ("post", format!("/api/v1/workflows/{unknown}/cancel")),
        ("post", format!("/api/v1/workflows/{unknown}/retry")),
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
        "/api/v1/workflows/abc",
        "/api/v1/workflows/9223372036854775808",
        "/api/v1/workflows?limit=0",
        "/api/v1/workflows?before=x",
        "/api/v1/workflows?before=9223372036854775808",
    ] {
        let r = app.get(path).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{path}: {}", r.body);
        assert_eq!(r.json()["error"]["code"], "bad_request", "{path}");
    }
    let r = app.api_post("/api/v1/workflows/abc/retry").await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
    assert_eq!(workflow_audit(&db).await.len(), before, "nothing audited");
}

/// Read-only: the workflow page shows no action and every workflow action (page and API) is
/// refused (403); without the CSRF token a page action is refused too. Nothing changes and
/// nothing is audited.
async fn workflow_actions_are_refused_read_only_and_without_the_csrf_token<B: TestBackend>(
    db: Db<B>,
) {
    use TaskState::*;
    let gate = Gate::default();
    let report = run_report(&db, &gate).await;
    let idle = idle_workflow(&db).await;
    let ro = App::new(&db, true);
    let rw = App::new(&db, false);
    for wf in [&report, &idle] {
        let page = ro.get(&format!("/workflows/{}", wf.id)).await;
        assert_eq!(page.status, StatusCode::OK);
        assert!(
            !page.body.contains("<form method=\"post\"") && !page.body.contains(r#"id="actions""#),
            "{}",
            page.body
        );
        assert!(
            rw.get(&format!("/workflows/{}", wf.id))
                .await
                .body
                .contains(r#"id="actions""#),
            "the same page offers an action when the dashboard is not read-only"
        );
    }
    let nonce = rw.get("/workflows").await.set_cookie("taskq_csrf").unwrap();
    let cookie = format!("taskq_csrf={nonce}");
    let wrong = format!("csrf={}", "0".repeat(64));
    for (wf, action) in [(&report, "retry"), (&idle, "cancel")] {
        let path = format!("/workflows/{}/{action}", wf.id);
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
    assert_eq!(
        step_states(&db, report.id).await,
        named(&[
            ("fetch", Succeeded),
            ("render", Dead),
            ("mail", Canceled),
            ("tidy", Succeeded)
        ])
    );
    assert_eq!(
        step_states(&db, idle.id).await,
        named(&[("a", Pending), ("b", Waiting)])
    );
    assert!(workflow_audit(&db).await.is_empty());
}

taskq_tests::conformance!(
    workflow_pages_show_the_steps_and_their_actions_change_them,
    the_workflow_api_lists_reads_cancels_and_retries,
    workflow_actions_are_refused_read_only_and_without_the_csrf_token,
);
