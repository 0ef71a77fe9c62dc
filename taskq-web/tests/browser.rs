//! The dashboard in a real browser: headless Chromium driven over WebDriver (Debian's
//! `chromium` and `chromium-driver`), against a dashboard served on a loopback port and a
//! real worker.
//!
//! - An operator signs in, sees a dead task, opens it, retries it, watches it succeed, and
//!   pauses its queue; every step is checked on the page and in the database, and
//!   screenshotted (see `support::browser::screenshot_dir`; `TASKQ_UPDATE_SCREENSHOTS=1`
//!   refreshes the ones in `docs/dashboard/`).
//! - Markup and script stored in names, queues, payloads and errors is shown as text and
//!   never runs.
//! - A page on another origin, opened in the same browser, tries every change of a dashboard
//!   served without authentication (forms, `fetch` in every mode); none happens.
//! - An operator retries a failed workflow's dead step from its page and it succeeds.
//!
//! Without chromedriver or Chromium installed the tests say they were skipped and pass, unless
//! `TASKQ_REQUIRE_BROWSER=1` (CI) makes that a failure.

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::Value;
use support::browser::Browser;
use support::rows::{Row, insert_row, state_of_row};
use support::{TOKEN, serve, serve_with};
use taskq::TaskError;
use taskq_tests::backends::{Db, TestBackend};
use taskq_tests::{RunningWorker, fast_worker, wait_until};

/// Whether the (pretend) payment gateway declines charges.
static GATEWAY_DOWN: AtomicBool = AtomicBool::new(true);

/// Charges an order: fails (and, with one attempt, dies) while the gateway is down.
#[taskq::task(queue = "billing", max_attempts = 1)]
async fn charge_card(order: u64, cents: u64) -> Result<(), TaskError> {
    if GATEWAY_DOWN.load(Ordering::SeqCst) {
        return Err(TaskError::msg(format!(
            "payment gateway answered 503 Service Unavailable for order {order} ({cents} cents)"
        )));
    }
    Ok(())
}

/// Mails a receipt: always succeeds.
#[taskq::task(queue = "mail")]
async fn send_receipt(order: u64) -> Result<(), TaskError> {
    let _ = order;
    Ok(())
}

/// The cells of the overview's row for `queue`, keyed by the column heading
/// (`pending`, `dead`, `Status`, ...).
async fn queue_row(b: &Browser, queue: &str) -> serde_json::Map<String, Value> {
    let v = b
        .eval(&format!(
            r#"const t = document.getElementById('queues');
               const r = t && [...t.rows].find(r => r.dataset.queue === {q});
               if (!r) return null;
               const out = {{}};
               [...t.rows[0].cells].forEach((h, i) => out[h.innerText.trim()] = r.cells[i].innerText.trim());
               return out;"#,
            q = serde_json::to_string(queue).unwrap()
        ))
        .await;
    match v {
        Value::Object(m) => m,
        other => panic!("no overview row for queue {queue:?}: {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_retries_a_dead_task_and_pauses_its_queue_in_chromium() {
    let Some(b) =
        Browser::start("an_operator_retries_a_dead_task_and_pauses_its_queue_in_chromium").await
    else {
        return;
    };
    // Mounted under a prefix, as in an app that serves other routes; the overview reloads
    // itself, but not while the test clicks.
    let Some(served) = serve("/ops/taskq", |d| {
        d.refresh_interval(Duration::from_secs(60))
    })
    .await
    else {
        return;
    };
    let db = &served.db;
    let worker = RunningWorker::spawn(
        fast_worker(&db.pool)
            .register::<ChargeCard>()
            .register::<SendReceipt>(),
    );
    for order in 1040..1043 {
        SendReceipt { order }.enqueue(&db.pool).await.unwrap();
    }
    let id = ChargeCard {
        order: 1042,
        cents: 1999,
    }
    .enqueue(&db.pool)
    .await
    .unwrap()
    .id
    .0;
    wait_until(Duration::from_secs(15), "the charge to die", || async {
        state_of_row(db, id).await.as_deref() == Some("dead")
            && db.count("state = 'succeeded'").await == 3
    })
    .await;

    // Signed out, every page is the sign-in form.
    let text = b.open(&served.url("")).await;
    assert!(text.contains("Sign in"), "{text}");
    assert!(
        !text.contains("billing"),
        "nothing is shown before signing in: {text}"
    );
    b.screenshot("login.png").await;
    b.type_into("input[name=token]", "not-the-token").await;
    b.click("main form button[type=submit]").await;
    assert!(b.text().await.contains("Wrong credentials."));
    b.type_into("input[name=token]", TOKEN).await;
    b.click("main form button[type=submit]").await;
    b.wait_path("/ops/taskq").await; // sign-in leads to the overview
    let text = b.text().await;
    assert!(text.contains("Overview"), "{text}");
    assert!(text.contains("Log out"), "a session shows a log-out button");

    // The overview: the dead charge and the receipts, from the database.
    let billing = queue_row(&b, "billing").await;
    assert_eq!(billing["dead"], "1", "{billing:?}");
    assert_eq!(billing["pending"], "0", "{billing:?}");
    assert_eq!(billing["Status"], "active", "{billing:?}");
    let mail = queue_row(&b, "mail").await;
    assert_eq!(mail["succeeded"], "3", "{mail:?}");
    b.screenshot("overview.png").await;

    // The dead count links to the dead tasks of the queue; the list links to the task.
    b.click(r#"tr[data-queue="billing"] a[href$="state=dead"]"#)
        .await;
    b.wait_path("/ops/taskq/tasks").await;
    let rows = b
        .eval("return [...document.querySelectorAll('#tasks tr')].slice(1).map(r => r.cells[1].innerText + ' ' + r.cells[3].innerText + ' ' + r.cells[4].innerText)")
        .await;
    assert_eq!(rows, serde_json::json!([format!("{id} charge_card dead")]));
    b.screenshot("tasks-dead.png").await;
    b.click(&format!("#tasks a[href$=\"tasks/{id}\"]")).await;
    b.wait_path(&format!("/ops/taskq/tasks/{id}")).await;
    assert_eq!(b.text_of("h1 span").await, "dead");
    assert!(
        b.text_of("#last-error")
            .await
            .contains("503 Service Unavailable for order 1042"),
    );
    let payload = b.text_of("#payload").await;
    assert!(
        payload.contains("\"order\": 1042") && payload.contains("\"cents\": 1999"),
        "pretty JSON payload: {payload}"
    );
    b.screenshot("task-dead.png").await;

    // The gateway is back: retry from the task page (a form POST with its CSRF token) and
    // watch the task succeed, opening the task again as a person would.
    GATEWAY_DOWN.store(false, Ordering::SeqCst);
    b.click(&format!("form[action$=\"tasks/{id}/retry\"] button"))
        .await;
    b.wait_path(&format!("/ops/taskq/tasks/{id}")).await;
    assert!(b.text().await.contains("Moved back to pending."));
    // The confirmation shows once: reloading the page does not repeat it.
    let reloaded = b.open(&served.url(&format!("/tasks/{id}"))).await;
    assert!(!reloaded.contains("Moved back to pending."), "{reloaded}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let state = b.text_of("h1 span").await;
        if state == "succeeded" {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the page still shows {state} after 15 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        b.open(&served.url(&format!("/tasks/{id}"))).await;
    }
    assert_eq!(state_of_row(db, id).await.as_deref(), Some("succeeded"));
    let outcomes: String = sqlx::query_scalar(
        "SELECT CAST(JSON_EXTRACT(attempts, '$[*].outcome') AS CHAR) FROM taskq_tasks WHERE id = ?",
    )
    .bind(id)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(&outcomes).unwrap(),
        serde_json::json!(["failed", "succeeded"]),
        "one failed attempt, one after the retry"
    );
    let audit: Vec<(String, String)> =
        sqlx::query_as("SELECT actor, action FROM taskq_audit WHERE task_id = ? ORDER BY id")
            .bind(id)
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(audit, [("web:session".to_owned(), "retry".to_owned())]);
    let page = b.text().await;
    assert!(
        page.contains("web:session"),
        "the page shows who retried it: {page}"
    );
    assert_eq!(
        b.eval("return document.querySelectorAll('#attempts tr').length - 1")
            .await,
        2,
        "both attempts are listed"
    );
    assert!(
        b.client
            .find(fantoccini::Locator::Css(&format!(
                "form[action$=\"tasks/{id}/retry\"]"
            )))
            .await
            .is_err(),
        "no Retry button on a succeeded task"
    );
    b.open(&served.url(&format!("/tasks/{id}"))).await;
    b.screenshot("task-succeeded.png").await;

    // Pause the queue from the overview.
    b.click("header a").await; // the "taskq" home link
    b.wait_path("/ops/taskq").await;
    b.click(r#"tr[data-queue="billing"] form[action$="queues/pause"] button"#)
        .await;
    b.wait_path("/ops/taskq").await;
    let billing = queue_row(&b, "billing").await;
    let status = billing["Status"].as_str().unwrap();
    assert!(status.starts_with("paused since"), "{billing:?}");
    let paused: Option<bool> =
        sqlx::query_scalar("SELECT paused_at IS NOT NULL FROM taskq_queues WHERE queue = ?")
            .bind("billing")
            .fetch_optional(&db.pool)
            .await
            .unwrap();
    assert_eq!(paused, Some(true), "taskq_queues has billing paused");
    let audit: Vec<(String, String)> = sqlx::query_as(
        "SELECT actor, action FROM taskq_audit WHERE queue = ? AND task_id IS NULL ORDER BY id",
    )
    .bind("billing")
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(audit, [("web:session".to_owned(), "pause".to_owned())]);
    // The pause holds: a new charge waits, and the overview shows it waiting. A running worker
    // sees a pause when it next reads the queues' controls, once per poll ceiling (100 ms for
    // this worker; semantics.md, "Pausing a queue"): a charge enqueued before that could still
    // be claimed, so give it ten.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let waiting = ChargeCard {
        order: 1043,
        cents: 500,
    }
    .enqueue(&db.pool)
    .await
    .unwrap()
    .id
    .0;
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(state_of_row(db, waiting).await.as_deref(), Some("pending"));
    b.client.refresh().await.unwrap();
    let billing = queue_row(&b, "billing").await;
    assert_eq!(billing["pending"], "1", "{billing:?}");
    assert_eq!(billing["succeeded"], "1", "{billing:?}");
    assert!(
        b.client
            .find(fantoccini::Locator::Css(
                r#"tr[data-queue="billing"] form[action$="queues/resume"] button"#
            ))
            .await
            .is_ok(),
        "a paused queue offers Resume"
    );
    b.screenshot("queue-paused.png").await;

    // A form whose CSRF token does not match the cookie is refused, and changes nothing.
    b.eval(
        r#"const f = document.querySelector('tr[data-queue="billing"] form[action$="queues/resume"]');
           f.querySelector('input[name=csrf]').value = '0'.repeat(64);
           document.documentElement.dataset.taskqTestOld = '1';
           f.submit(); return null;"#,
    )
    .await;
    wait_until(Duration::from_secs(10), "the refusal page", || async {
        b.text().await.contains("CSRF check failed")
    })
    .await;
    let paused: Option<bool> =
        sqlx::query_scalar("SELECT paused_at IS NOT NULL FROM taskq_queues WHERE queue = ?")
            .bind("billing")
            .fetch_optional(&db.pool)
            .await
            .unwrap();
    assert_eq!(paused, Some(true), "still paused after a forged resume");

    b.quit().await;
    worker.stop().await;
}

/// A task name no worker registers (the unhandled view).
#[taskq::task(queue = "exports")]
async fn legacy_export(batch: u64) -> Result<(), TaskError> {
    let _ = batch;
    Ok(())
}

/// Sets columns of task `id` (`sets`: SQL assignments, in the backend's dialect).
async fn set_row<B: TestBackend>(db: &Db<B>, id: u64, sets: &str) {
    assert_eq!(
        db.exec(&format!("UPDATE taskq_tasks SET {sets} WHERE id = {id}"))
            .await,
        1
    );
}

/// The operator's views and the task actions, in a signed-in browser, on each backend: a
/// worker killed without a goodbye shows lost (and its running task says so), the scheduled,
/// retrying, schedules, unhandled and audit views list what the database holds, the overview
/// shows run times and a legend, and priority, run now, reschedule, select-many cancel and
/// delete work from their forms, each checked in the database and the audit trail. The MySQL
/// run takes the screenshots.
async fn operator_views_and_task_actions<B: TestBackend>(test: &str, screenshots: bool) {
    let Some(b) = Browser::start(test).await else {
        return;
    };
    let Some(db) = B::create().await else {
        return;
    };
    let dashboard = taskq_web::Dashboard::builder(db.pool.clone())
        .bearer_token(TOKEN)
        .refresh_interval(Duration::from_secs(60))
        .build()
        .unwrap();
    let app = axum::Router::new().nest("/ops/taskq", dashboard.router());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    let url = |path: &str| format!("http://{addr}/ops/taskq{path}");
    let shot = |name: &'static str| {
        let b = &b;
        async move {
            if screenshots {
                b.screenshot(name).await;
            }
        }
    };
    let s = Duration::from_secs;
    // A worker of `billing` killed 25 s ago (heartbeat 10 s, lease 30 s), holding a charge.
    db.exec(&format!(
        "INSERT INTO taskq_workers (worker_id, host, pid, queues, concurrency, lease_us,
           heartbeat_us, names, started_at, last_seen_at)
         VALUES ('billing-7f3a', 'app-2', 4711, '{{\"billing\":4}}', 4, 30000000, 10000000,
                 '[\"charge_card\"]', {}, {})",
        db.ago(s(3600)),
        db.ago(s(25))
    ))
    .await;
    let held = ChargeCard {
        order: 2001,
        cents: 4200,
    }
    .enqueue(&db.pool)
    .await
    .unwrap()
    .id
    .0;
    set_row(&db, held, &format!(
        "state = 'running', attempt = 1, lease_epoch = 1, worker_id = 'billing-7f3a', attempted_at = {}, lease_until = {}",
        db.ago(s(40)),
        db.from_now(s(5))
    ))
    .await;
    // Receipts: three that ran 120, 180 and 950 ms (the run times), one due in 2 h, one
    // charge waiting for its second attempt.
    for (order, ms) in [(3001u64, 120u64), (3002, 180), (3003, 950)] {
        let id = SendReceipt { order }.enqueue(&db.pool).await.unwrap().id.0;
        set_row(&db, id, &format!(
            "state = 'succeeded', attempt = 1, lease_epoch = 1, attempted_at = {}, finished_at = {}",
            db.ago(Duration::from_millis(30_000 + ms)),
            db.ago(s(30))
        ))
        .await;
    }
    let scheduled = SendReceipt { order: 3004 }
        .enqueue(&db.pool)
        .await
        .unwrap()
        .id
        .0;
    set_row(
        &db,
        scheduled,
        &format!("run_at = {}", db.from_now(s(7200))),
    )
    .await;
    let retrying = ChargeCard {
        order: 2002,
        cents: 990,
    }
    .enqueue(&db.pool)
    .await
    .unwrap()
    .id
    .0;
    set_row(&db, retrying, &format!(
        "attempt = 1, max_attempts = 5, run_at = {}, last_error = 'card issuer timed out after 10 s'",
        db.from_now(s(300))
    ))
    .await;
    // A task name no worker registers, due for 10 minutes; two more receipts to select.
    let legacy = LegacyExport { batch: 7 }
        .enqueue(&db.pool)
        .await
        .unwrap()
        .id
        .0;
    set_row(&db, legacy, &format!("run_at = {}", db.ago(s(600)))).await;
    let mut picked = vec![];
    for order in [3005, 3006] {
        picked.push(SendReceipt { order }.enqueue(&db.pool).await.unwrap().id.0);
    }
    db.exec(&format!(
        "INSERT INTO taskq_schedules (name, task_name, queue, expression, timezone, missed_ticks,
           watermark, last_tick, last_worker_id, next_tick, declared_at, created_at, updated_at)
         VALUES ('nightly_report', 'nightly_report', 'reports', '0 0 3 * * *', 'Europe/Paris',
                 'latest', {now}, {last}, 'reports-1', {next}, {now}, {now}, {now})",
        now = db.now(),
        last = db.ago(s(3 * 3600)),
        next = db.from_now(s(21 * 3600)),
    ))
    .await;

    b.open(&url("")).await;
    b.type_into("input[name=token]", TOKEN).await;
    b.click("main form button[type=submit]").await;
    b.wait_path("/ops/taskq").await;

    // Overview: the lost worker, the run times, the legend, no field to type into.
    let worker = b.text_of(r#"tr[data-worker="billing-7f3a"]"#).await;
    assert!(
        worker.contains("lost") && (25..=40).any(|n| worker.contains(&format!("{n}s ago"))),
        "{worker}"
    );
    let receipts = b
        .text_of(r#"#run-times tr[data-name="send_receipt"]"#)
        .await;
    assert!(
        receipts.contains("180 ms") && receipts.contains("950 ms"),
        "p50, p95: {receipts}"
    );
    assert!(b.text_of("#legend").await.contains("failed attempts"));
    assert_eq!(
        b.eval(
            "return [...document.querySelectorAll('input')].filter(i => i.type !== 'hidden').length"
        )
        .await,
        0,
        "the refreshing overview has no field to type into"
    );
    shot("overview-operator.png").await;

    // The running task of the lost worker says so.
    b.open(&url("/tasks?state=running")).await;
    assert!(b.text_of("#tasks").await.contains("running worker lost"));
    shot("tasks-worker-lost.png").await;

    // Each view from the header.
    for (view, table, expect, name) in [
        (
            "scheduled",
            "#scheduled",
            scheduled.to_string(),
            "scheduled.png",
        ),
        (
            "retrying",
            "#retrying",
            "card issuer timed out".to_owned(),
            "retrying.png",
        ),
        (
            "schedules",
            "#schedules",
            "0 0 3 * * *".to_owned(),
            "schedules.png",
        ),
        (
            "unhandled",
            "#unhandled",
            "legacy_export".to_owned(),
            "unhandled.png",
        ),
    ] {
        b.click(&format!("header a[href$=\"{view}\"]")).await;
        b.wait_path(&format!("/ops/taskq/{view}")).await;
        let text = b.text_of(table).await;
        assert!(text.contains(&expect), "{view}: {text}");
        shot(name).await;
    }
    b.open(&url("/schedules")).await;
    let schedule = b.text_of(r#"tr[data-schedule="nightly_report"]"#).await;
    assert!(
        schedule.contains("Europe/Paris") && schedule.contains("3h 00m ago"),
        "{schedule}"
    );

    // Task actions on the scheduled receipt: priority, run now, reschedule.
    b.open(&url(&format!("/tasks/{scheduled}"))).await;
    shot("task-actions.png").await;
    b.eval("document.querySelector('#priority input[name=priority]').value = '-5'; return null")
        .await;
    b.click("#priority button").await;
    assert!(b.text().await.contains("Priority changed."));
    b.click(&format!(
        "form[action$=\"tasks/{scheduled}/run-now\"] button"
    ))
    .await;
    assert!(b.text().await.contains("Due now"));
    let t = db.client().get(taskq::TaskId(scheduled)).await.unwrap();
    assert!(t.run_at <= db.server_now().await, "due now");
    b.type_into("#reschedule input[name=when]", "2031-01-02 03:04")
        .await;
    b.click("#reschedule button").await;
    assert!(b.text().await.contains("Rescheduled."));
    let t = db.client().get(taskq::TaskId(scheduled)).await.unwrap();
    assert_eq!(
        (t.priority, t.run_at.to_rfc3339()),
        (-5, "2031-01-02T03:04:00+00:00".to_owned())
    );

    // Check two pending receipts on the list and cancel them.
    b.open(&url("/tasks?state=pending&name=send_receipt")).await;
    for id in &picked {
        b.eval(&format!(
            "document.querySelector('#tasks input[name=id][value=\"{id}\"]').checked = true; return null"
        ))
        .await;
    }
    shot("tasks-selected.png").await;
    b.click(r#"#select-many button[value="cancel"]"#).await;
    assert_eq!(
        b.eval("return document.getElementById('selected-done').dataset.ok")
            .await,
        "2"
    );
    for id in &picked {
        assert_eq!(
            db.count(&format!("id = {id} AND state = 'canceled'")).await,
            1
        );
    }
    shot("selected-done.png").await;

    // Delete one of them from its page.
    b.open(&url(&format!("/tasks/{}", picked[0]))).await;
    b.click(&format!(
        "form[action$=\"tasks/{}/delete\"] button",
        picked[0]
    ))
    .await;
    assert!(
        b.text()
            .await
            .contains(&format!("Deleted task {}.", picked[0]))
    );
    assert_eq!(db.count(&format!("id = {}", picked[0])).await, 0);

    // The audit trail: every action, by the session, in the database and on the page.
    b.click(r#"header a[href$="audit"]"#).await;
    b.wait_path("/ops/taskq/audit").await;
    let mut audit = db
        .client()
        .audit(&taskq::client::AuditFilter::default())
        .await
        .unwrap();
    audit.reverse();
    let actions: Vec<(&str, &str)> = audit
        .iter()
        .map(|e| (e.actor.as_str(), e.action.as_str()))
        .collect();
    let by = "web:session";
    assert_eq!(
        actions,
        [
            (by, "priority"),
            (by, "run_now"),
            (by, "reschedule"),
            (by, "cancel"),
            (by, "cancel"),
            (by, "delete")
        ]
    );
    let page = b.text_of("#audit").await;
    assert!(
        page.contains("run_now") && page.contains("delete") && page.contains(by),
        "{page}"
    );
    shot("audit.png").await;

    b.quit().await;
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_views_and_task_actions_in_chromium_on_mysql() {
    operator_views_and_task_actions::<sqlx::MySql>(
        "the_operator_views_and_task_actions_in_chromium_on_mysql",
        true,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_views_and_task_actions_in_chromium_on_sqlite() {
    operator_views_and_task_actions::<sqlx::Sqlite>(
        "the_operator_views_and_task_actions_in_chromium_on_sqlite",
        false,
    )
    .await;
}

/// Whether the (pretend) printer is out of paper: `print_report` dies while it is.
static PRINTER_DOWN: AtomicBool = AtomicBool::new(true);

/// A report step that succeeds.
#[taskq::task(queue = "reports")]
async fn report_step(day: String) -> Result<(), TaskError> {
    let _ = day;
    Ok(())
}

/// Prints the report: fails (and, with one attempt, dies) while the printer is down.
#[taskq::task(queue = "reports", max_attempts = 1)]
async fn print_report(day: String) -> Result<(), TaskError> {
    if PRINTER_DOWN.load(Ordering::SeqCst) {
        return Err(TaskError::msg(format!(
            "printer out of paper: report of {day}"
        )));
    }
    Ok(())
}

/// A failed workflow in a signed-in browser: the Workflows page (from the header) lists it
/// failed with its steps per state; its page shows each step's state, the one its failure
/// canceled and the cleanup step; **Retry failed steps** (a real form POST with its CSRF
/// token) moves the dead step back, and with the printer fixed the workflow succeeds, every
/// step of it, as the page then shows. Checked in the database and the audit trail, and
/// screenshotted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_retries_a_failed_workflow_in_chromium() {
    let Some(b) = Browser::start("an_operator_retries_a_failed_workflow_in_chromium").await else {
        return;
    };
    let Some(served) = serve("/ops/taskq", |d| d).await else {
        return;
    };
    let db = &served.db;
    let worker = RunningWorker::spawn(
        fast_worker(&db.pool)
            .register::<ReportStep>()
            .register::<PrintReport>(),
    );
    let step = |day: &str| ReportStep { day: day.into() };
    let wf = taskq::workflow::Workflow::new("report-2026-12-04")
        .step("fetch", step("2026-12-04"))
        .step_after(
            "print",
            PrintReport {
                day: "2026-12-04".into(),
            },
            ["fetch"],
        )
        .step_after("price", step("2026-12-04"), ["fetch"])
        .step_after("mail", step("2026-12-04"), ["print", "price"])
        .cleanup_after("tidy", step("2026-12-04"), ["mail"])
        .enqueue(&db.pool)
        .await
        .unwrap();
    let client = taskq::Client::new(db.pool.clone());
    let failed = client
        .wait_workflow(wf.id, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(failed.state, taskq::workflow::WorkflowState::Failed);

    b.open(&served.url("")).await;
    b.type_into("input[name=token]", TOKEN).await;
    b.click("main form button[type=submit]").await;
    b.wait_path("/ops/taskq").await;
    b.click(r#"header a[href$="workflows"]"#).await;
    b.wait_path("/ops/taskq/workflows").await;
    let row = b
        .text_of(&format!(r#"#workflows tr[data-id="{}"]"#, wf.id))
        .await;
    assert!(
        row.contains("report-2026-12-04") && row.contains("failed") && row.contains("5/5 ended"),
        "{row}"
    );
    b.screenshot("workflows.png").await;
    b.click(&format!(r#"#workflows a[href$="workflows/{}"]"#, wf.id))
        .await;
    b.wait_path(&format!("/ops/taskq/workflows/{}", wf.id))
        .await;
    let states = || async {
        b.eval(
            "return [...document.querySelectorAll('#steps tr[data-step]')].map(r => r.dataset.step + ' ' + r.dataset.state)",
        )
        .await
    };
    assert_eq!(
        states().await,
        serde_json::json!([
            "fetch succeeded",
            "print dead",
            "price succeeded",
            "mail canceled",
            "tidy succeeded"
        ])
    );
    let mail = b.text_of(r#"#steps tr[data-step="mail"]"#).await;
    assert!(
        mail.contains("print, price") && mail.contains("canceled by a dependency"),
        "{mail}"
    );
    assert!(
        b.text_of(r#"#steps tr[data-step="tidy"]"#)
            .await
            .contains("cleanup")
    );
    assert!(b.text_of("#graph").await.contains("print"));
    b.screenshot("workflow-failed.png").await;

    PRINTER_DOWN.store(false, Ordering::SeqCst);
    b.click(&format!(
        r#"form[action$="workflows/{}/retry"] button"#,
        wf.id
    ))
    .await;
    b.wait_path(&format!("/ops/taskq/workflows/{}", wf.id))
        .await;
    assert!(
        b.text_of("#workflow-done")
            .await
            .contains("its dead steps are pending again"),
    );
    let done = client
        .wait_workflow(wf.id, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(
        (done.state, done.counts.succeeded),
        (taskq::workflow::WorkflowState::Succeeded, 5)
    );
    b.open(&served.url(&format!("/workflows/{}", wf.id))).await;
    assert_eq!(b.text_of("h1 span").await, "succeeded");
    assert_eq!(
        states().await,
        serde_json::json!([
            "fetch succeeded",
            "print succeeded",
            "price succeeded",
            "mail succeeded",
            "tidy succeeded"
        ])
    );
    b.screenshot("workflow-succeeded.png").await;
    let audit = client
        .audit(&taskq::client::AuditFilter::default())
        .await
        .unwrap();
    assert!(
        audit
            .iter()
            .any(|e| e.action == "workflow_retry" && e.actor == "web:session"),
        "{audit:?}"
    );

    b.quit().await;
    worker.stop().await;
}

/// What the stored values try to do; none of it may happen.
const SCRIPT: &str = "<script>window.__pwned=1;alert('script')</script>";
const ATTR: &str = r#""><img src=x onerror="window.__pwned=1;alert('img')">"#;
const JS_LINK: &str = "javascript:window.__pwned=1;alert('link')";
const CLOSE_PRE: &str =
    r#"</pre><svg onload="window.__pwned=1"></svg><a href="javascript:window.__pwned=1">x</a>"#;

/// Asserts that nothing injected runs or exists in the current page, and that every value in
/// `literal` is on it as text.
async fn assert_inert(b: &Browser, page: &str, literal: &[&str]) {
    assert_eq!(b.open_dialog().await, None, "{page}: a dialog opened");
    assert_eq!(
        b.eval("return typeof window.__pwned").await,
        "undefined",
        "{page}: an injected script ran"
    );
    let injected = b
        .eval(
            "return [...document.querySelectorAll('script, img, svg, iframe, object, embed, [onerror], [onload], [onclick]')].map(e => e.outerHTML)",
        )
        .await;
    assert_eq!(
        injected,
        serde_json::json!([]),
        "{page}: markup from the database became elements"
    );
    let bad_links = b
        .eval(
            "return [...document.querySelectorAll('a[href], form[action]')].map(e => new URL(e.getAttribute('href') ?? e.getAttribute('action'), location.href).href).filter(u => !u.startsWith(location.origin + '/'))",
        )
        .await;
    assert_eq!(
        bad_links,
        serde_json::json!([]),
        "{page}: a link or form leaves the dashboard"
    );
    let text = b.text().await;
    for l in literal {
        assert!(
            text.contains(l),
            "{page}: {l:?} is not shown as text:\n{text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_markup_is_shown_as_text_and_never_runs_in_chromium() {
    let Some(b) = Browser::start("stored_markup_is_shown_as_text_and_never_runs_in_chromium").await
    else {
        return;
    };
    let Some(served) = serve("", |d| d.refresh_interval(Duration::ZERO)).await else {
        return;
    };
    let db = &served.db;
    let payload = serde_json::json!({"note": SCRIPT, "html": ATTR, "link": JS_LINK}).to_string();
    let error = format!("{CLOSE_PRE}{SCRIPT}{ATTR}");
    let dead = insert_row(
        db,
        Row {
            queue: SCRIPT,
            name: ATTR,
            payload: &payload,
            state: "dead",
            last_error: Some(&error),
            worker_id: Some(ATTR),
        },
    )
    .await;
    let not_json = insert_row(
        db,
        Row {
            queue: JS_LINK,
            name: JS_LINK,
            payload: CLOSE_PRE,
            state: "pending",
            ..Row::default()
        },
    )
    .await;

    // Sign in with the token (the session cookie carries on).
    b.open(&served.url("/login")).await;
    b.type_into("input[name=token]", TOKEN).await;
    b.click("main form button[type=submit]").await;
    b.wait_path("/").await;

    b.open(&served.url("/")).await;
    assert_inert(&b, "overview", &[SCRIPT, JS_LINK]).await;
    // The queue link carries the name percent-encoded in its query, and leads to its list.
    b.click(r#"#queues a[href^="./tasks?queue=javascript"]"#)
        .await;
    b.wait_path("/tasks").await;
    assert_inert(&b, "list of the javascript: queue", &[JS_LINK]).await;
    assert_eq!(
        b.eval("return new URLSearchParams(location.search).get('queue')")
            .await,
        JS_LINK
    );

    b.open(&served.url("/tasks")).await;
    assert_inert(&b, "task list", &[SCRIPT, ATTR, JS_LINK, CLOSE_PRE]).await;
    b.open(&served.url(&format!("/tasks?queue={}", urlencode(SCRIPT))))
        .await;
    assert_inert(&b, "filtered list", &[SCRIPT, ATTR]).await;
    assert_eq!(
        b.eval("return document.querySelector('input[name=queue]').value")
            .await,
        SCRIPT,
        "the filter field holds the queue name as typed"
    );

    b.open(&served.url(&format!("/tasks/{dead}"))).await;
    assert_inert(&b, "dead task page", &[SCRIPT, ATTR, JS_LINK, CLOSE_PRE]).await;
    assert_eq!(b.text_of("#last-error").await, error);
    b.screenshot("escaping.png").await;
    b.open(&served.url(&format!("/tasks/{not_json}"))).await;
    assert_inert(
        &b,
        "task page with a non-JSON payload",
        &[CLOSE_PRE, JS_LINK],
    )
    .await;
    assert_eq!(b.text_of("#payload").await, CLOSE_PRE);

    // Nothing the pages did changed the rows.
    assert_eq!(state_of_row(db, dead).await.as_deref(), Some("dead"));
    assert_eq!(state_of_row(db, not_json).await.as_deref(), Some("pending"));
    b.quit().await;
}

fn urlencode(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

/// The two browser tests above, by name.
const BROWSER_TESTS: [&str; 2] = [
    "an_operator_retries_a_dead_task_and_pauses_its_queue_in_chromium",
    "stored_markup_is_shown_as_text_and_never_runs_in_chromium",
];

/// This test binary running only the browser tests, in a new network namespace without a
/// loopback interface (`unshare -n`), with `tmpdir` as `$TMPDIR`; `None` (after saying why)
/// when this machine cannot make such a namespace or has no browser to find.
fn without_loopback(tmpdir: &std::path::Path, require: bool) -> Option<std::process::Output> {
    let exe = std::env::current_exe().unwrap();
    // As root: a new network namespace; otherwise a user namespace too (`-r`), where allowed.
    let root = std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.trim_ascii() == b"0");
    let mut cmd = std::process::Command::new("unshare");
    cmd.args(if root { &["-n"][..] } else { &["-r", "-n"] })
        .arg(&exe)
        .args(BROWSER_TESTS)
        .args(["--exact", "--test-threads", "2"])
        .env("TMPDIR", tmpdir)
        .env_remove("TASKQ_REQUIRE_MYSQL")
        .env_remove("TASKQ_REQUIRE_PRIVATE_SERVER");
    if require {
        cmd.env("TASKQ_REQUIRE_BROWSER", "1");
    } else {
        cmd.env_remove("TASKQ_REQUIRE_BROWSER");
    }
    let out = match cmd.output() {
        Ok(out) => out,
        Err(e) => {
            eprintln!("SKIPPED unshare: cannot run unshare ({e})");
            return None;
        }
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    if stderr.starts_with("unshare:") {
        // No permission to make namespaces (a container without CAP_SYS_ADMIN).
        eprintln!("SKIPPED unshare: {}", stderr.trim());
        return None;
    }
    if stderr.contains("SKIPPED browser:") {
        eprintln!("SKIPPED browser: no browser installed; nothing to check without loopback");
        return None;
    }
    Some(out)
}

/// On a machine with Chromium and chromedriver but no loopback interface (`unshare -n`), the
/// browser tests say `SKIPPED loopback:` and pass, leaving nothing in `$TMPDIR`; with
/// `TASKQ_REQUIRE_BROWSER=1` they fail, saying why, and still leave nothing.
#[test]
fn browser_tests_skip_without_a_loopback_interface_and_leave_nothing_behind() {
    let tmp = std::env::temp_dir().join(format!("taskq-noloop-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let left = || -> Vec<_> {
        std::fs::read_dir(&tmp)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .collect()
    };
    let Some(out) = without_loopback(&tmp, false) else {
        let _ = std::fs::remove_dir_all(&tmp);
        return;
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("test result: ok. 2 passed"), "{stdout}");
    for test in BROWSER_TESTS {
        let line = stderr
            .lines()
            .find(|l| l.starts_with(&format!("SKIPPED loopback: {test}: ")))
            .unwrap_or_else(|| panic!("no SKIPPED line for {test}:\n{stderr}"));
        assert!(line.contains("no usable loopback interface"), "{line}");
    }
    assert_eq!(left(), Vec::<std::path::PathBuf>::new(), "left in $TMPDIR");

    let out = without_loopback(&tmp, true).expect("the namespace worked a moment ago");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{stdout}");
    assert!(stdout.contains("2 failed"), "{stdout}");
    assert!(
        stdout.contains("no usable loopback interface")
            && stdout.contains("TASKQ_REQUIRE_BROWSER=1 requires the browser tests"),
        "{stdout}"
    );
    assert_eq!(left(), Vec::<std::path::PathBuf>::new(), "left in $TMPDIR");
    std::fs::remove_dir_all(&tmp).unwrap();
}

/// A browser test that fails mid-way (a panic while the browser runs) still ends Chromium and
/// removes its profile folder, as does one that quits; Chromium's own temporary folders are
/// inside that folder, not in `$TMPDIR`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_browser_test_leaves_no_profile_or_process_behind() {
    const TEST: &str = "a_failing_browser_test_leaves_no_profile_or_process_behind";
    let Some(b) = Browser::start(TEST).await else {
        return;
    };
    b.open("about:blank").await;
    let dir = b.profile().path().to_owned();
    assert!(
        dir.join("profile").is_dir(),
        "Chromium writes its profile there"
    );
    // chromedriver, the browser and its helpers (renderers, GPU, network, storage...).
    let pids = b.profile().processes();
    assert!(pids.len() >= 3, "Chromium runs: {pids:?}");
    let scoped = std::fs::read_dir(dir.join("tmp"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("org.chromium."))
        .count();
    assert!(
        scoped > 0,
        "Chromium's temporary folders are in the profile's tmp/"
    );
    let failed = tokio::spawn(async move {
        let _b = b;
        panic!("a deliberate failure while the browser runs");
    })
    .await;
    assert!(failed.unwrap_err().is_panic());
    assert!(!dir.exists(), "{} is removed", dir.display());
    let running = |pid: &&u32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            s.rsplit_once(')')
                .is_some_and(|(_, r)| !r.trim_start().starts_with('Z'))
        })
    };
    // Killed processes can take a moment to exit on a loaded machine (CI runs the browser tests
    // side by side): they must all be gone within 10 s.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut left: Vec<&u32> = pids.iter().filter(running).collect();
    while !left.is_empty() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        left = pids.iter().filter(running).collect();
    }
    assert_eq!(
        left,
        Vec::<&u32>::new(),
        "no process of that browser is left after 10 s"
    );
    // Not written again by a process still exiting.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!dir.exists(), "{} stays removed", dir.display());

    let b = Browser::start(TEST).await.unwrap();
    let dir = b.profile().path().to_owned();
    b.quit().await;
    assert!(!dir.exists(), "{} is removed after quit", dir.display());
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!dir.exists(), "{} stays removed after quit", dir.display());
}

/// The attacker's page: a text/plain form that spells JSON, `fetch` without CORS (simple
/// requests), `fetch` with a JSON content type (preflighted), and the pages' own forms, each
/// aimed at the dashboard at `dash`; it reports to its own server after each attempt, so the
/// test knows the script ran.
fn evil_page(dash: &str, pending: u64, dead: u64) -> String {
    format!(
        r#"<!doctype html><html><body>
<iframe name="sink" style="display:none"></iframe>
<form id="plain" method="post" enctype="text/plain" target="sink" action="{dash}/api/v1/tasks">
<input name='{{"name":"send_receipt","payload":{{"order":666,"x":"' value='"}}}}'></form>
<form id="pause" method="post" target="sink" action="{dash}/queues/pause">
<input name="queue" value="billing"></form>
<form id="retry" method="post" target="sink" action="{dash}/tasks/{dead}/retry"></form>
<script>
const report = (what) => fetch('/report?' + what).catch(() => {{}});
const attempt = async (what, url, init) => {{
  try {{ const r = await fetch(url, init); await report(what + '=' + r.type + ':' + r.status); }}
  catch (e) {{ await report(what + '=error'); }}
}};
(async () => {{
  document.getElementById('plain').submit();
  await new Promise(r => setTimeout(r, 300));
  document.getElementById('pause').submit();
  await new Promise(r => setTimeout(r, 300));
  document.getElementById('retry').submit();
  await new Promise(r => setTimeout(r, 300));
  const text = {{method: 'POST', mode: 'no-cors', headers: {{'Content-Type': 'text/plain'}}}};
  await attempt('enqueue_plain', '{dash}/api/v1/tasks', {{...text, body: '{{"name":"send_receipt","payload":{{"order":667}}}}'}});
  await attempt('cancel_plain', '{dash}/api/v1/tasks/{pending}/cancel', {{...text, body: '{{}}'}});
  await attempt('retry_plain', '{dash}/api/v1/tasks/{dead}/retry', {{...text, body: '{{}}'}});
  await attempt('pause_plain', '{dash}/api/v1/queues/billing/pause', {{...text, body: '{{}}'}});
  const json = {{method: 'POST', headers: {{'Content-Type': 'application/json'}}, body: '{{}}'}};
  await attempt('cancel_json', '{dash}/api/v1/tasks/{pending}/cancel', json);
  await attempt('read_tasks', '{dash}/api/v1/tasks', {{}});
  await report('done=1');
}})();
</script></body></html>"#
    )
}

/// A dashboard served without authentication (the loopback-only, single-user setup) and a
/// page on another origin in the same browser: the page tries every change the dashboard
/// offers; none happens, and the page cannot read the API either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_on_another_origin_changes_nothing_in_chromium() {
    let Some(b) = Browser::start("a_page_on_another_origin_changes_nothing_in_chromium").await
    else {
        return;
    };
    let Some(served) = serve_with("", |d| d.insecure_no_auth()).await else {
        return;
    };
    let db = &served.db;
    let pending = SendReceipt { order: 1 }
        .enqueue(&db.pool)
        .await
        .unwrap()
        .id
        .0;
    let dead = insert_row(
        db,
        Row {
            queue: "billing",
            name: "charge_card",
            payload: r#"{"order":2,"cents":5}"#,
            state: "dead",
            ..Row::default()
        },
    )
    .await;
    let count = || async {
        sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM taskq_tasks")
            .fetch_one(&db.pool)
            .await
            .unwrap()
    };
    let before = count().await;

    // The attacker's site: another origin (`localhost` vs `127.0.0.1`, another port).
    let dash = format!("http://{}", served.addr);
    let reports = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let page = evil_page(&dash, pending, dead);
    let evil = {
        let reports = reports.clone();
        axum::Router::new()
            .route(
                "/",
                axum::routing::get(move || {
                    let page = page.clone();
                    async move { axum::response::Html(page) }
                }),
            )
            .route(
                "/report",
                axum::routing::get(move |uri: axum::http::Uri| {
                    let reports = reports.clone();
                    async move {
                        reports
                            .lock()
                            .unwrap()
                            .push(uri.query().unwrap_or("").to_owned());
                    }
                }),
            )
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let evil_port = listener.local_addr().unwrap().port();
    let evil_server = tokio::spawn(async move {
        axum::serve(listener, evil).await.unwrap();
    });

    b.open(&format!("http://localhost:{evil_port}/")).await;
    let watched = reports.clone();
    wait_until(
        Duration::from_secs(20),
        "the attacker's script finishes",
        || {
            let reports = watched.clone();
            async move { reports.lock().unwrap().iter().any(|r| r == "done=1") }
        },
    )
    .await;
    let seen = reports.lock().unwrap().clone();
    // Every attempt was made; the simple requests went out (opaque answers), the preflighted
    // and the read failed in the browser.
    for what in [
        "enqueue_plain",
        "cancel_plain",
        "retry_plain",
        "pause_plain",
    ] {
        assert!(
            seen.iter().any(|r| r == &format!("{what}=opaque:0")),
            "{what}: {seen:?}"
        );
    }
    assert!(seen.iter().any(|r| r == "cancel_json=error"), "{seen:?}");
    assert!(seen.iter().any(|r| r == "read_tasks=error"), "{seen:?}");

    // Nothing changed.
    let client = taskq::Client::new(db.pool.clone());
    assert_eq!(count().await, before, "a task was enqueued");
    assert_eq!(
        state_of_row(db, pending).await.as_deref(),
        Some("pending"),
        "the pending task was canceled"
    );
    assert_eq!(
        state_of_row(db, dead).await.as_deref(),
        Some("dead"),
        "the dead task was retried"
    );
    assert!(
        client.paused_queues().await.unwrap().is_empty(),
        "a queue was paused"
    );

    // The same browser on the dashboard's own pages can change things (the refusals above
    // are about the origin, not a broken dashboard).
    b.open(&format!("{dash}/tasks/{dead}")).await;
    b.click("form[action$='retry'] button").await;
    wait_until(
        Duration::from_secs(10),
        "a retry from the dashboard's own page",
        || async { state_of_row(db, dead).await.as_deref() == Some("pending") },
    )
    .await;
    evil_server.abort();
}
