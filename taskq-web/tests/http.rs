//! HTTP-level tests of the dashboard and API against a real database: every route, status
//! codes, authentication, CSRF, read-only mode, mounting under a prefix, keyset pagination,
//! enqueue by name, escaping, and the OpenAPI document.

mod support;

use std::collections::BTreeSet;

use axum::Router;
use axum::http::{Method, StatusCode, header};
use serde_json::json;
use support::{Cred, TOKEN, app, send};
use taskq_tests::TestDb;
use taskq_web::Dashboard;

/// A task the serving (test) binary registers, for enqueue-by-name.
#[taskq::task(queue = "web_mail", max_attempts = 4)]
async fn web_send_mail(to: String, count: u32) -> Result<(), taskq::TaskError> {
    let _ = (to, count);
    Ok(())
}

/// Inserts a task row directly (any name, queue, payload, state), finished now when terminal.
async fn insert(db: &TestDb, queue: &str, name: &str, payload: &str, state: &str) -> u64 {
    let done = sqlx::query(
        "INSERT INTO taskq_tasks (queue, name, payload, state, max_attempts, attempt, run_at, created_at, updated_at, finished_at)
         VALUES (?, ?, ?, ?, 3, 1, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6),
                 IF(? IN ('succeeded', 'dead', 'canceled', 'expired'), UTC_TIMESTAMP(6), NULL))",
    )
    .bind(queue)
    .bind(name)
    .bind(payload.as_bytes())
    .bind(state)
    .bind(state)
    .execute(&db.pool)
    .await
    .unwrap();
    done.last_insert_id()
}

async fn state_of(db: &TestDb, id: u64) -> Option<String> {
    sqlx::query_scalar("SELECT CAST(state AS CHAR) FROM taskq_tasks WHERE id = ?")
        .bind(id)
        .fetch_optional(&db.pool)
        .await
        .unwrap()
}

fn token_app() -> impl FnOnce(taskq_web::DashboardBuilder) -> taskq_web::DashboardBuilder {
    |b| b.bearer_token(TOKEN)
}

#[tokio::test]
async fn configuration_requires_credentials_or_an_explicit_opt_out() {
    let Some(db) = TestDb::new_or_skip().await else {
        return;
    };
    let b = || Dashboard::builder(db.pool.clone());
    let e = b().build().unwrap_err().to_string();
    assert!(e.contains("insecure_no_auth"), "{e}");
    assert!(b().insecure_no_auth().build().is_ok());
    assert!(b().bearer_token("short").build().is_err());
    assert!(b().bearer_token(TOKEN).insecure_no_auth().build().is_err());
    assert!(b().basic_auth("ops", "").build().is_err());
    assert!(b().basic_auth("a:b", "pw").build().is_err());
    assert!(b().basic_auth("ops", "pw").build().is_ok());
    assert!(
        b().bearer_token(TOKEN)
            .max_page_size(5_000)
            .build()
            .is_err()
    );
    let open = b().insecure_no_auth().build().unwrap().router();
    let r = send(&open, Method::GET, "/api/v1/queues", Cred::None, &[], None).await;
    assert_eq!(r.status, StatusCode::OK);
}

#[tokio::test]
async fn authentication_of_pages_and_api() {
    let Some(a) = app(|b| b.bearer_token(TOKEN).basic_auth("ops", "pa55word")).await else {
        return;
    };
    let r = &a.router;
    for path in ["/", "/tasks", "/tasks/1", "/bulk?action=retry"] {
        let none = send(r, Method::GET, path, Cred::None, &[], None).await;
        assert_eq!(none.status, StatusCode::UNAUTHORIZED, "{path}");
        assert!(
            none.body.contains("Sign in"),
            "{path}: the 401 is the login page"
        );
        assert!(
            none.headers[header::WWW_AUTHENTICATE]
                .to_str()
                .unwrap()
                .starts_with("Basic")
        );
        for bad in [
            Cred::Bearer("wrong-token-123"),
            Cred::Basic("ops", "nope"),
            Cred::Basic("x", "pa55word"),
        ] {
            assert_eq!(
                send(r, Method::GET, path, bad, &[], None).await.status,
                StatusCode::UNAUTHORIZED,
                "{path}"
            );
        }
    }
    for good in [Cred::Bearer(TOKEN), Cred::Basic("ops", "pa55word")] {
        assert_eq!(
            send(r, Method::GET, "/", good, &[], None).await.status,
            StatusCode::OK
        );
        assert_eq!(
            send(r, Method::GET, "/api/v1/queues", good, &[], None)
                .await
                .status,
            StatusCode::OK
        );
    }
    let api = send(r, Method::GET, "/api/v1/tasks", Cred::None, &[], None).await;
    assert_eq!(api.status, StatusCode::UNAUTHORIZED);
    assert_eq!(api.json()["error"]["code"], "unauthorized");
    assert_eq!(
        send(
            r,
            Method::GET,
            "/api/v1/tasks",
            Cred::Bearer("nope-nope-nope"),
            &[],
            None
        )
        .await
        .status,
        StatusCode::UNAUTHORIZED
    );
    // A POST must be JSON, whatever the credentials (browsers resend Basic credentials).
    a.db.count("1").await;
    insert(&a.db, "q1", "t", "{}", "pending").await;
    let basic_form = send(
        r,
        Method::POST,
        "/api/v1/queues/q1/pause",
        Cred::Basic("ops", "pa55word"),
        &[],
        Some(("application/x-www-form-urlencoded", String::new())),
    )
    .await;
    assert_eq!(basic_form.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let client = taskq::Client::new(a.db.pool.clone());
    assert!(client.paused_queues().await.unwrap().is_empty());
    let basic_json = send(
        r,
        Method::POST,
        "/api/v1/queues/q1/pause",
        Cred::Basic("ops", "pa55word"),
        &[],
        Some(("application/json", String::new())),
    )
    .await;
    assert_eq!(basic_json.status, StatusCode::OK);
    assert_eq!(client.paused_queues().await.unwrap()[0].0, "q1");

    // Token only: the 401 page has no Basic challenge.
    let Some(t) = app(token_app()).await else {
        return;
    };
    let none = send(&t.router, Method::GET, "/", Cred::None, &[], None).await;
    assert_eq!(none.status, StatusCode::UNAUTHORIZED);
    assert!(none.headers.get(header::WWW_AUTHENTICATE).is_none());
    assert!(none.body.contains("name=\"token\""));
}

#[tokio::test]
async fn login_page_sets_a_session_cookie_and_logout_ends_it() {
    let Some(a) = app(token_app()).await else {
        return;
    };
    let r = &a.router;
    let login = send(r, Method::GET, "/login", Cred::None, &[], None).await;
    assert_eq!(login.status, StatusCode::OK);
    let nonce = login.set_cookie("taskq_csrf").unwrap();
    let csrf = login.csrf_field().unwrap();
    let cookie = format!("taskq_csrf={nonce}");
    let post = |fields: Vec<(&'static str, String)>, cookie: String| {
        let body = fields
            .iter()
            .map(|(k, v)| {
                format!(
                    "{k}={}",
                    form_urlencoded::byte_serialize(v.as_bytes()).collect::<String>()
                )
            })
            .collect::<Vec<_>>()
            .join("&");
        async move {
            send(
                r,
                Method::POST,
                "/login",
                Cred::None,
                &[("cookie", &cookie)],
                Some(("application/x-www-form-urlencoded", body)),
            )
            .await
        }
    };
    // Without the CSRF field: refused.
    let no_csrf = post(vec![("token", TOKEN.into())], cookie.clone()).await;
    assert_eq!(no_csrf.status, StatusCode::FORBIDDEN);
    let wrong = post(
        vec![("token", "wrong-token-1".into()), ("csrf", csrf.clone())],
        cookie.clone(),
    )
    .await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    assert!(wrong.body.contains("Wrong credentials"));
    assert!(wrong.set_cookie("taskq_session").is_none());
    let ok = post(
        vec![("token", TOKEN.into()), ("csrf", csrf.clone())],
        cookie.clone(),
    )
    .await;
    assert_eq!(ok.status, StatusCode::SEE_OTHER);
    assert_eq!(ok.location(), Some("./"));
    let line = ok.set_cookie_line("taskq_session").unwrap();
    assert!(
        line.contains("HttpOnly") && line.contains("SameSite=Strict") && line.contains("Path=/"),
        "{line}"
    );
    let session = ok.set_cookie("taskq_session").unwrap();
    let both = format!("taskq_session={session}; {cookie}");
    let page = send(r, Method::GET, "/", Cred::None, &[("cookie", &both)], None).await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(page.body.contains("Log out"));
    // The API does not take the session cookie.
    let api = send(
        r,
        Method::GET,
        "/api/v1/queues",
        Cred::None,
        &[("cookie", &both)],
        None,
    )
    .await;
    assert_eq!(api.status, StatusCode::UNAUTHORIZED);
    // A forged session is refused.
    let forged = format!("taskq_session=00.99999999999.{}; {cookie}", "0".repeat(64));
    assert_eq!(
        send(
            r,
            Method::GET,
            "/",
            Cred::None,
            &[("cookie", &forged)],
            None
        )
        .await
        .status,
        StatusCode::UNAUTHORIZED
    );
    // Logout clears the cookie (with the token of the signed-in pages' forms: the login
    // page's token was bound to no session and is refused).
    let stale = send(
        r,
        Method::POST,
        "/logout",
        Cred::None,
        &[("cookie", &both)],
        Some(("application/x-www-form-urlencoded", format!("csrf={csrf}"))),
    )
    .await;
    assert_eq!(stale.status, StatusCode::FORBIDDEN);
    let signed_in_csrf = page.csrf_field().unwrap();
    let out = send(
        r,
        Method::POST,
        "/logout",
        Cred::None,
        &[("cookie", &both)],
        Some((
            "application/x-www-form-urlencoded",
            format!("csrf={signed_in_csrf}"),
        )),
    )
    .await;
    assert_eq!(out.status, StatusCode::SEE_OTHER);
    assert_eq!(out.set_cookie("taskq_session").as_deref(), Some(""));
    assert!(
        out.set_cookie_line("taskq_session")
            .unwrap()
            .contains("Max-Age=0")
    );
}

#[tokio::test]
async fn every_form_post_needs_the_csrf_token() {
    let Some(a) = app(token_app()).await else {
        return;
    };
    let client = taskq::Client::new(a.db.pool.clone());
    let dead = insert(&a.db, "q1", "t", "{}", "dead").await;
    let (cookie, token) = a.csrf("/").await;
    let cases: Vec<(String, Vec<(&str, &str)>)> = vec![
        ("/queues/pause".into(), vec![("queue", "q1")]),
        (format!("/tasks/{dead}/retry"), vec![]),
        (format!("/tasks/{dead}/cancel"), vec![]),
        ("/bulk".into(), vec![("action", "retry")]),
    ];
    for (path, fields) in &cases {
        // No cookie, no field.
        let r = a.post_raw(path, fields, None).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{path}");
        // Cookie but no field.
        let r = a.post_raw(path, fields, Some(&cookie)).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{path}");
        // Cookie and a wrong field.
        let mut wrong = fields.clone();
        let other = "0".repeat(64);
        wrong.push(("csrf", &other));
        let r = a.post_raw(path, &wrong, Some(&cookie)).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{path}");
        // The cookie's value as the field (the old double-submit pairing).
        let mut same = fields.clone();
        same.push(("csrf", &cookie));
        let r = a.post_raw(path, &same, Some(&cookie)).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{path}");
        // Field but no cookie.
        let mut only_field = fields.clone();
        only_field.push(("csrf", &token));
        let r = a.post_raw(path, &only_field, None).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{path}");
        assert!(r.body.contains("CSRF"));
    }
    // Nothing changed.
    assert!(client.paused_queues().await.unwrap().is_empty());
    assert_eq!(state_of(&a.db, dead).await.as_deref(), Some("dead"));
    // With the right token it works.
    let r = a.post_form("/queues/pause", &[("queue", "q1")]).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER);
    assert_eq!(client.paused_queues().await.unwrap().len(), 1);
    // Every form on the pages carries the token bound to the cookie set with them (not the
    // cookie's value itself).
    let page = a.get(&format!("/tasks/{dead}")).await;
    let cookie = page.set_cookie("taskq_csrf").unwrap();
    let field = page.csrf_field().unwrap();
    assert_ne!(field, cookie);
    assert_eq!(
        page.body
            .matches(&format!("name=\"csrf\" value=\"{field}\""))
            .count(),
        page.body.matches("name=\"csrf\"").count()
    );
    assert_eq!(
        page.body.matches("method=\"post\"").count(),
        page.body.matches("name=\"csrf\"").count()
    );
}

#[tokio::test]
async fn read_only_mode_hides_and_refuses_every_change() {
    let Some(a) = app(|b| b.bearer_token(TOKEN).read_only(true)).await else {
        return;
    };
    let client = taskq::Client::new(a.db.pool.clone());
    let dead = insert(&a.db, "q1", "t", "{}", "dead").await;
    let pending = insert(&a.db, "q1", "t", "{}", "pending").await;
    for path in [
        "/".to_owned(),
        "/tasks?state=dead".into(),
        format!("/tasks/{dead}"),
        format!("/tasks/{pending}"),
    ] {
        let r = a.get(&path).await;
        assert_eq!(r.status, StatusCode::OK, "{path}");
        assert!(
            !r.body.contains("method=\"post\""),
            "{path} shows a mutation control"
        );
        assert!(!r.body.contains("bulk"), "{path} links to bulk actions");
        assert!(r.body.contains("read-only"));
    }
    assert_eq!(
        a.get("/bulk?action=retry").await.status,
        StatusCode::FORBIDDEN
    );
    for (path, fields) in [
        (format!("/tasks/{dead}/retry"), vec![]),
        (format!("/tasks/{pending}/cancel"), vec![]),
        ("/queues/pause".into(), vec![("queue", "q1")]),
        ("/bulk".into(), vec![("action", "retry")]),
    ] {
        assert_eq!(
            a.post_form(&path, &fields).await.status,
            StatusCode::FORBIDDEN,
            "{path}"
        );
    }
    for path in [
        format!("/api/v1/tasks/{dead}/retry"),
        format!("/api/v1/tasks/{pending}/cancel"),
        "/api/v1/queues/q1/pause".into(),
        "/api/v1/queues/q1/resume".into(),
        "/api/v1/tasks".into(),
    ] {
        let r = a
            .api_post(
                &path,
                json!({"name": "web_send_mail", "payload": {"to": "a", "count": 1}}),
            )
            .await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{path}");
        assert_eq!(r.json()["error"]["code"], "read_only");
    }
    assert_eq!(state_of(&a.db, dead).await.as_deref(), Some("dead"));
    assert_eq!(state_of(&a.db, pending).await.as_deref(), Some("pending"));
    assert!(client.paused_queues().await.unwrap().is_empty());
    assert_eq!(a.db.count("1").await, 2);
    // Reads still work.
    assert_eq!(a.get("/api/v1/tasks").await.status, StatusCode::OK);
}

/// Resolves a relative reference against a request path (RFC 3986 for the forms the pages use).
fn resolve(base: &str, rel: &str) -> String {
    let (rel_path, query) = match rel.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (rel, None),
    };
    let mut segs: Vec<&str> = base.split('/').collect();
    segs.pop(); // the last segment of the base is replaced
    for s in rel_path.split('/') {
        match s {
            "." => {}
            ".." => {
                if segs.len() > 1 {
                    segs.pop();
                }
            }
            s => segs.push(s),
        }
    }
    let mut out = segs.join("/");
    let dir = rel_path.ends_with('/')
        || rel_path.ends_with("/.")
        || rel_path == "."
        || rel_path.ends_with("..");
    if dir && !out.ends_with('/') {
        out.push('/');
    }
    let out = out.replace("//", "/");
    let out = if rel_path.is_empty() {
        base.to_owned()
    } else {
        out
    };
    match query {
        Some(q) => format!("{out}?{q}"),
        None => out,
    }
}

#[tokio::test]
async fn mounted_under_a_prefix_every_link_resolves() {
    let Some(db) = TestDb::new_or_skip().await else {
        return;
    };
    let dashboard = Dashboard::builder(db.pool.clone())
        .bearer_token(TOKEN)
        .build()
        .unwrap();
    let router = Router::new()
        .route("/", axum::routing::get(|| async { "the app" }))
        .nest("/ops/taskq", dashboard.router());
    let dead = insert(&db, "mail", "send", "{\"a\":1}", "dead").await;
    insert(&db, "mail", "send", "{}", "pending").await;
    let get = |p: String| {
        let router = router.clone();
        async move { send(&router, Method::GET, &p, Cred::Bearer(TOKEN), &[], None).await }
    };
    let mut seen = BTreeSet::new();
    for page in [
        "/ops/taskq".to_owned(),
        "/ops/taskq/tasks".into(),
        "/ops/taskq/tasks?state=dead".into(),
        format!("/ops/taskq/tasks/{dead}"),
    ] {
        let r = get(page.clone()).await;
        assert_eq!(r.status, StatusCode::OK, "{page}");
        let cookie = r.set_cookie_line("taskq_csrf").unwrap();
        assert!(cookie.contains("Path=/ops/taskq;"), "{cookie}");
        let path_only = page.split('?').next().unwrap();
        for link in r.links() {
            assert!(
                !link.starts_with('/') && !link.contains("://"),
                "{page}: {link} is not relative"
            );
            let target = resolve(path_only, &link);
            assert!(
                target.starts_with("/ops/taskq"),
                "{page}: {link} resolves to {target}"
            );
            seen.insert((
                target,
                r.body
                    .contains(&format!("action=\"{}\"", link.replace('&', "&amp;"))),
            ));
        }
    }
    // Every GET link resolves to a page that answers 200; every form action is a served route.
    for (target, is_action) in &seen {
        let target = if target.ends_with("/bulk") {
            format!("{target}?action=retry") // the bulk form's GET, with its select's first choice
        } else if *is_action && !target.ends_with("/tasks") {
            continue; // POST-only actions are exercised elsewhere
        } else {
            target.clone()
        };
        let r = get(target.clone()).await;
        assert_eq!(r.status, StatusCode::OK, "{target}");
    }
    assert!(
        seen.iter()
            .any(|(t, _)| t == &format!("/ops/taskq/tasks/{dead}"))
    );
    assert!(seen.iter().any(|(t, _)| t == "/ops/taskq"));
    // Redirects are relative too: a retry from the mounted page lands on the task page.
    let list = get("/ops/taskq/bulk?action=retry".into()).await;
    let nonce = list.set_cookie("taskq_csrf").unwrap();
    let token = list.csrf_field().unwrap();
    let r = send(
        &router,
        Method::POST,
        &format!("/ops/taskq/tasks/{dead}/retry"),
        Cred::Bearer(TOKEN),
        &[("cookie", &format!("taskq_csrf={nonce}"))],
        Some(("application/x-www-form-urlencoded", format!("csrf={token}"))),
    )
    .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER);
    let to = resolve(
        &format!("/ops/taskq/tasks/{dead}/retry"),
        r.location().unwrap(),
    );
    assert_eq!(to, format!("/ops/taskq/tasks/{dead}"));
    assert_eq!(
        r.set_cookie_line("taskq_flash").as_deref(),
        Some(
            format!(
                "taskq_flash=retried.{dead}; Path=/ops/taskq; HttpOnly; SameSite=Strict; Max-Age=60"
            )
            .as_str()
        )
    );
    assert_eq!(state_of(&db, dead).await.as_deref(), Some("pending"));
    // The app's own routes and the API under the prefix.
    assert_eq!(get("/".into()).await.body, "the app");
    assert_eq!(
        get("/ops/taskq/api/v1/queues".into()).await.status,
        StatusCode::OK
    );
    // Search by id redirects relative to the list page.
    let r = get(format!("/ops/taskq/tasks?id={dead}")).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER);
    assert_eq!(
        resolve("/ops/taskq/tasks", r.location().unwrap()),
        format!("/ops/taskq/tasks/{dead}")
    );
}

#[tokio::test]
async fn keyset_pagination_visits_every_matching_task_once() {
    let Some(a) = app(|b| b.bearer_token(TOKEN).max_page_size(7)).await else {
        return;
    };
    let mut ids = vec![];
    for i in 0..40 {
        let queue = if i % 3 == 0 { "other" } else { "main" };
        let state = if i % 4 == 0 { "dead" } else { "pending" };
        ids.push((insert(&a.db, queue, "t", "{}", state).await, queue, state));
    }
    let want = |q: Option<&str>, s: Option<&str>| -> Vec<u64> {
        ids.iter()
            .filter(|(_, queue, state)| {
                q.is_none_or(|q| q == *queue) && s.is_none_or(|s| s == *state)
            })
            .map(|(id, _, _)| *id)
            .collect()
    };
    for (q, s) in [
        (None, None),
        (Some("main"), None),
        (Some("main"), Some("dead")),
        (None, Some("pending")),
    ] {
        for newest in [true, false] {
            // API: follow next_after.
            let mut got = vec![];
            let mut after: Option<u64> = None;
            loop {
                let mut url = format!(
                    "/api/v1/tasks?order={}&limit=100",
                    if newest { "newest" } else { "oldest" }
                );
                if let Some(q) = q {
                    url.push_str(&format!("&queue={q}"));
                }
                if let Some(s) = s {
                    url.push_str(&format!("&state={s}"));
                }
                if let Some(a) = after {
                    url.push_str(&format!("&after={a}"));
                }
                let page = a.get(&url).await.json();
                let tasks = page["tasks"].as_array().unwrap();
                assert!(tasks.len() <= 7, "the page size is capped");
                got.extend(tasks.iter().map(|t| t["id"].as_u64().unwrap()));
                match page["next_after"].as_u64() {
                    Some(n) => after = Some(n),
                    None => break,
                }
            }
            let mut expected = want(q, s);
            if newest {
                expected.reverse();
            }
            assert_eq!(got, expected, "api {q:?} {s:?} newest={newest}");

            // Pages: follow the "Next page" links.
            let mut got = vec![];
            let mut url = format!("/tasks?order={}", if newest { "newest" } else { "oldest" });
            if let Some(q) = q {
                url.push_str(&format!("&queue={q}"));
            }
            if let Some(s) = s {
                url.push_str(&format!("&state={s}"));
            }
            loop {
                let r = a.get(&url).await;
                assert_eq!(r.status, StatusCode::OK);
                let links = r.links();
                got.extend(
                    links
                        .iter()
                        .filter_map(|l| l.strip_prefix("./tasks/"))
                        .filter_map(|id| id.parse::<u64>().ok()),
                );
                let next = r
                    .body
                    .split("rel=\"next\" href=\"")
                    .nth(1)
                    .map(|rest| rest[..rest.find('"').unwrap()].replace("&amp;", "&"));
                match next {
                    Some(n) => url = format!("/{}", n.trim_start_matches("./")),
                    None => break,
                }
            }
            assert_eq!(got, expected, "pages {q:?} {s:?} newest={newest}");
        }
    }
    // Search by id.
    let r = a.get(&format!("/tasks?id={}", ids[3].0)).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER);
    assert_eq!(r.location(), Some(format!("./tasks/{}", ids[3].0).as_str()));
    assert_eq!(a.get("/tasks?id=abc").await.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        a.get("/tasks?state=bogus").await.status,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        a.get("/api/v1/tasks?state=bogus").await.status,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        a.get("/api/v1/tasks?after=x").await.status,
        StatusCode::BAD_REQUEST
    );
}

#[tokio::test]
async fn enqueue_by_name_checks_the_registered_tasks() {
    let Some(a) = app(token_app()).await else {
        return;
    };
    // Unknown name: 404, nothing inserted.
    let r = a
        .api_post(
            "/api/v1/tasks",
            json!({"name": "no_such_task", "payload": {}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(r.json()["error"]["code"], "unknown_task");
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no_such_task")
    );
    // A payload that does not decode: 422 with serde's message, nothing inserted.
    for (payload, needle) in [
        (json!({"to": "a@example.com"}), "missing field `count`"),
        (
            json!({"to": "a@example.com", "count": "three"}),
            "invalid type",
        ),
        (json!([1, 2]), "invalid type"),
    ] {
        let r = a
            .api_post(
                "/api/v1/tasks",
                json!({"name": "web_send_mail", "payload": payload}),
            )
            .await;
        assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.body);
        assert_eq!(r.json()["error"]["code"], "invalid_payload");
        let msg = r.json()["error"]["message"].as_str().unwrap().to_owned();
        assert!(msg.contains(needle), "{msg}");
    }
    // A body that is not the request shape: 400.
    let r = send(
        &a.router,
        Method::POST,
        "/api/v1/tasks",
        Cred::Bearer(TOKEN),
        &[],
        Some(("application/json", "{not json".into())),
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    let r = a
        .api_post(
            "/api/v1/tasks",
            json!({"name": "web_send_mail", "bogus": 1}),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    // An invalid option: 422.
    let r = a
        .api_post(
            "/api/v1/tasks",
            json!({"name": "web_send_mail", "payload": {"to": "x", "count": 1}, "max_attempts": 0}),
        )
        .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(a.db.count("1").await, 0, "nothing was inserted");

    // A good payload: 201 and the row, on the task's queue with its settings.
    let r = a
        .api_post(
            "/api/v1/tasks",
            json!({"name": "web_send_mail", "payload": {"to": "a@example.com", "count": 3}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let id = r.json()["id"].as_u64().unwrap();
    assert_eq!(r.json()["queue"], "web_mail");
    let (queue, name, payload, max_attempts): (String, String, Vec<u8>, u32) =
        sqlx::query_as("SELECT queue, name, payload, max_attempts FROM taskq_tasks WHERE id = ?")
            .bind(id)
            .fetch_one(&a.db.pool)
            .await
            .unwrap();
    assert_eq!(
        (queue.as_str(), name.as_str(), max_attempts),
        ("web_mail", "web_send_mail", 4)
    );
    let trail = taskq::Client::new(a.db.pool.clone())
        .audit(&taskq::client::AuditFilter {
            task: Some(taskq::TaskId(id)),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        (
            trail.len(),
            trail[0].actor.as_str(),
            trail[0].action.as_str()
        ),
        (1, "api:token", "enqueue")
    );
    let payload: serde_json::Value = serde_json::from_slice(&payload).unwrap();
    assert_eq!(payload, json!({"to": "a@example.com", "count": 3}));
    // Overrides and idempotency.
    let body = json!({"name": "web_send_mail", "payload": {"to": "b", "count": 1}, "queue": "urgent",
                      "priority": -5, "idempotency_key": "k1", "delay_ms": 60000});
    let r = a.api_post("/api/v1/tasks", body.clone()).await;
    assert_eq!(r.status, StatusCode::CREATED);
    let id2 = r.json()["id"].as_u64().unwrap();
    assert_eq!(a.db.count(&format!("id = {id2} AND queue = 'urgent' AND priority = -5 AND idempotency_key = 'k1' AND run_at > UTC_TIMESTAMP(6) + INTERVAL 50 SECOND")).await, 1);
    let again = a.api_post("/api/v1/tasks", body).await;
    assert_eq!(again.status, StatusCode::OK);
    assert_eq!(again.json()["duplicate"], true);
    assert_eq!(again.json()["id"].as_u64(), Some(id2));
    assert_eq!(a.db.count("1").await, 2);
    // The registered names are listed.
    let names = a.get("/api/v1/task-names").await.json();
    assert!(
        names["tasks"]
            .as_array()
            .unwrap()
            .contains(&json!({"name": "web_send_mail", "queue": "web_mail"}))
    );
}

/// An event for the event actions' routes.
#[derive(serde::Serialize)]
struct Noted;

impl taskq::outbox::Event for Noted {
    fn topic(&self) -> &str {
        "http.noted"
    }
    fn key(&self) -> String {
        "k1".into()
    }
}

#[tokio::test]
async fn the_openapi_document_lists_exactly_the_served_routes() {
    let Some(a) = app(token_app()).await else {
        return;
    };
    let doc = a.get("/api/v1/openapi.json").await;
    assert_eq!(doc.status, StatusCode::OK);
    let doc = doc.json();
    assert_eq!(doc["openapi"].as_str().map(|v| &v[..2]), Some("3."));
    let mut documented = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            documented.insert((method.clone(), path.clone()));
        }
    }
    let served: BTreeSet<(String, String)> = taskq_web::api_routes()
        .into_iter()
        .map(|(m, p)| (m.to_owned(), p.to_owned()))
        .collect();
    assert_eq!(documented, served);
    // And each documented route is served (not the router's 404/405): handlers answer JSON.
    let pending = insert(&a.db, "q", "t", "{}", "pending").await;
    // Delete gets a task of its own (the routes after it act on `pending`).
    let doomed = insert(&a.db, "q", "t", "{}", "pending").await;
    // An event key for the event actions (not held: retry and skip answer 409).
    {
        use taskq::outbox::Event;
        let mut tx = a.db.pool.begin().await.unwrap();
        Noted.publish_tx(&mut tx).await.unwrap();
        tx.commit().await.unwrap();
    }
    // A workflow for the workflow routes (canceled, then retried with no dead step).
    let workflow = taskq::workflow::Workflow::new("http")
        .step(
            "mail",
            WebSendMail {
                to: "x".into(),
                count: 1,
            },
        )
        .enqueue(&a.db.pool)
        .await
        .unwrap()
        .id
        .0;
    // An open batch for the batch routes (read, canceled, then sealed: 409, it has ended).
    let batch = taskq::batch::Batch::new("http")
        .add(WebSendMail {
            to: "x".into(),
            count: 1,
        })
        .open()
        .enqueue(&a.db.pool)
        .await
        .unwrap()
        .id
        .0;
    for (method, path) in &documented {
        let id = if path == "/tasks/{id}/delete" {
            doomed
        } else if path.starts_with("/workflows/") {
            workflow
        } else if path.starts_with("/batches/") {
            batch
        } else {
            pending
        };
        let body = match path.as_str() {
            "/tasks/{id}/priority" => json!({"priority": 1}),
            "/tasks/{id}/reschedule" => json!({"delay_ms": 1000}),
            "/tasks/selected" => json!({"action": "run_now", "ids": [pending]}),
            "/events/retry" | "/events/skip" | "/events/replay" => {
                json!({"topic": "http.noted", "key": "k1"})
            }
            _ => json!({"name": "web_send_mail", "payload": {"to": "x", "count": 1}}),
        };
        let path = path
            .replace("{id}", &id.to_string())
            .replace("{queue}", "q");
        let url = format!("/api/v1{path}");
        let r = if method == "get" {
            a.get(&url).await
        } else {
            a.api_post(&url, body).await
        };
        assert!(
            r.headers
                .get(header::CONTENT_TYPE)
                .is_some_and(|v| v.to_str().unwrap().starts_with("application/json")),
            "{method} {url}: {} {}",
            r.status,
            r.body
        );
        assert!(
            r.status.is_success() || r.status == StatusCode::CONFLICT,
            "{method} {url}: {} {}",
            r.status,
            r.body
        );
        r.json();
    }
    // A route that is not documented is not served.
    assert_eq!(a.get("/api/v1/nope").await.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn everything_from_the_database_is_escaped() {
    let Some(a) = app(token_app()).await else {
        return;
    };
    let evil = [
        "<script>alert(1)</script>",
        "\"><img src=x onerror=alert(1)>",
        "'><svg onload=alert(1)>",
        "javascript:alert(1)",
    ];
    let name = evil[0];
    let queue = evil[1];
    let payload = json!({"html": evil[0], "attr": evil[1], "single": evil[2]}).to_string();
    let id = insert(&a.db, queue, name, &payload, "dead").await;
    let raw_id = insert(
        &a.db,
        evil[2],
        evil[1],
        "not json <script>alert(2)</script>",
        "running",
    )
    .await;
    sqlx::query("UPDATE taskq_tasks SET last_error = ?, worker_id = ?, idempotency_key = ?, trace_context = ? WHERE id IN (?, ?)")
        .bind(format!("boom {} {}", evil[0], evil[1]))
        .bind(evil[1])
        .bind(evil[2])
        .bind(evil[0])
        .bind(id)
        .bind(raw_id)
        .execute(&a.db.pool)
        .await
        .unwrap();
    let attempts = json!([{"attempt": 1, "epoch": 1, "worker": evil[1], "started_at": "2026-01-01 00:00:00.000000",
        "finished_at": "2026-01-01 00:00:01.500000", "outcome": "failed", "error": format!("attempt {}", evil[0])}]);
    sqlx::query("UPDATE taskq_tasks SET attempts = ? WHERE id = ?")
        .bind(attempts.to_string())
        .bind(id)
        .execute(&a.db.pool)
        .await
        .unwrap();
    taskq::Client::new(a.db.pool.clone())
        .pause_queue(queue)
        .await
        .unwrap();
    sqlx::query("INSERT INTO taskq_workers (worker_id, host, pid, queues, concurrency, lease_us, heartbeat_us, started_at, last_seen_at) VALUES (?, ?, 1, ?, 1, 30000000, 5000000, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))")
        .bind(evil[0])
        .bind(evil[1])
        .bind(json!({ evil[1]: 2 }).to_string())
        .execute(&a.db.pool)
        .await
        .unwrap();
    let q = form_urlencoded::byte_serialize(queue.as_bytes()).collect::<String>();
    let n = form_urlencoded::byte_serialize(name.as_bytes()).collect::<String>();
    for path in [
        "/".to_owned(),
        "/tasks".into(),
        "/tasks?state=dead".into(),
        format!("/tasks?queue={q}&name={n}"),
        format!("/tasks/{id}"),
        format!("/tasks/{raw_id}"),
        format!("/bulk?action=retry&queue={q}&name={n}"),
        format!("/tasks?state={n}"),
        format!("/bulk?action={n}"),
    ] {
        let r = a.get(&path).await;
        assert!(
            r.status == StatusCode::OK || r.status == StatusCode::BAD_REQUEST,
            "{path}: {}",
            r.status
        );
        for e in &evil[..3] {
            assert!(!r.body.contains(e), "{path} contains {e} unescaped");
        }
        assert!(!r.body.contains("<script"), "{path}");
        assert!(!r.body.contains("<img"), "{path}");
        assert!(!r.body.contains("<svg"), "{path}");
        assert!(!r.body.contains("alert(2)</script>"), "{path}");
        let csp = r.headers[header::CONTENT_SECURITY_POLICY].to_str().unwrap();
        assert!(csp.contains("default-src 'none'"), "{csp}");
    }
    let page = a.get(&format!("/tasks/{id}")).await.body;
    assert!(page.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
    assert!(
        page.contains("attempt &lt;script&gt;alert(1)&lt;/script&gt;"),
        "the attempt's error, escaped"
    );
    assert!(page.contains("1.500 s"), "the attempt's duration");
    assert!(page.contains("&quot;&gt;&lt;img src=x onerror=alert(1)&gt;"));
    let overview = a.get("/").await.body;
    assert!(
        overview.contains("&quot;&gt;&lt;img src=x onerror=alert(1)&gt;"),
        "the queue is shown, escaped"
    );
    assert!(
        overview.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
        "the worker is shown, escaped"
    );
    // The API returns the same strings intact (JSON, not HTML).
    let t = a.get(&format!("/api/v1/tasks/{id}")).await;
    assert_eq!(t.headers[header::CONTENT_TYPE], "application/json");
    assert_eq!(t.json()["name"], evil[0]);
    assert_eq!(t.json()["payload"]["attr"], evil[1]);
}

#[tokio::test]
async fn task_actions_and_queue_controls() {
    let Some(a) = app(token_app()).await else {
        return;
    };
    let dead = insert(&a.db, "q1", "t", "{}", "dead").await;
    let pending = insert(&a.db, "q1", "t", "{}", "pending").await;
    let running = insert(&a.db, "q1", "t", "{}", "running").await;
    let done = insert(&a.db, "q1", "t", "{}", "succeeded").await;

    let page = a.get(&format!("/tasks/{dead}")).await;
    assert!(
        page.body
            .contains(&format!("action=\"../tasks/{dead}/retry\""))
    );
    assert!(!page.body.contains("/cancel\""));
    let page = a.get(&format!("/tasks/{pending}")).await;
    assert!(
        page.body
            .contains(&format!("action=\"../tasks/{pending}/cancel\""))
    );
    assert_eq!(a.get("/tasks/999999").await.status, StatusCode::NOT_FOUND);
    assert_eq!(a.get("/tasks/abc").await.status, StatusCode::BAD_REQUEST);

    let r = a.post_form(&format!("/tasks/{dead}/retry"), &[]).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER);
    let trail = taskq::Client::new(a.db.pool.clone())
        .audit(&taskq::client::AuditFilter {
            task: Some(taskq::TaskId(dead)),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        (trail[0].actor.as_str(), trail[0].action.as_str()),
        ("web:token", "retry")
    );
    let page = a.get(&format!("/tasks/{dead}")).await.body;
    assert!(
        page.contains("<td>web:token</td><td>retry</td>"),
        "the task page shows the audit trail"
    );
    assert_eq!(r.location(), Some(format!("../../tasks/{dead}").as_str()));
    let flash = r.set_cookie("taskq_flash").unwrap();
    assert_eq!(flash, format!("retried.{dead}"));
    assert_eq!(state_of(&a.db, dead).await.as_deref(), Some("pending"));
    // The page it lands on shows the confirmation once and clears the cookie; a reload (no
    // cookie any more) shows the page without it, and so does another task's page.
    let with_flash = |path: String| {
        let cookie = format!("taskq_flash={flash}");
        let router = a.router.clone();
        async move {
            send(
                &router,
                Method::GET,
                &path,
                Cred::Bearer(TOKEN),
                &[("cookie", &cookie)],
                None,
            )
            .await
        }
    };
    let landed = with_flash(format!("/tasks/{dead}")).await;
    assert!(
        landed
            .body
            .contains("<p class=\"flash\">Moved back to pending.</p>")
    );
    assert_eq!(
        landed.set_cookie_line("taskq_flash").as_deref(),
        Some("taskq_flash=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0")
    );
    let reloaded = a.get(&format!("/tasks/{dead}")).await;
    assert!(!reloaded.body.contains("class=\"flash\""));
    assert_eq!(reloaded.set_cookie_line("taskq_flash"), None);
    let other = with_flash(format!("/tasks/{pending}")).await;
    assert!(!other.body.contains("class=\"flash\""));
    assert_eq!(
        other.set_cookie_line("taskq_flash"),
        None,
        "kept for its own page"
    );
    // The old query flag shows nothing.
    assert!(
        !a.get(&format!("/tasks/{dead}?done=retried"))
            .await
            .body
            .contains("Moved back")
    );
    assert_eq!(
        a.post_form(&format!("/tasks/{done}/retry"), &[])
            .await
            .status,
        StatusCode::CONFLICT
    );
    assert_eq!(
        a.post_form("/tasks/999999/retry", &[]).await.status,
        StatusCode::NOT_FOUND
    );

    let r = a.post_form(&format!("/tasks/{pending}/cancel"), &[]).await;
    assert_eq!(
        r.location(),
        Some(format!("../../tasks/{pending}").as_str())
    );
    assert_eq!(
        r.set_cookie("taskq_flash"),
        Some(format!("canceled.{pending}"))
    );
    assert_eq!(state_of(&a.db, pending).await.as_deref(), Some("canceled"));
    let r = a.post_form(&format!("/tasks/{running}/cancel"), &[]).await;
    assert_eq!(
        r.location(),
        Some(format!("../../tasks/{running}").as_str())
    );
    assert_eq!(
        r.set_cookie("taskq_flash"),
        Some(format!("cancel_requested.{running}"))
    );
    assert_eq!(
        a.db.count(&format!(
            "id = {running} AND cancel_requested_at IS NOT NULL"
        ))
        .await,
        1
    );
    assert_eq!(
        a.post_form(&format!("/tasks/{done}/cancel"), &[])
            .await
            .status,
        StatusCode::CONFLICT
    );

    let client = taskq::Client::new(a.db.pool.clone());
    let r = a.post_form("/queues/pause", &[("queue", "q1")]).await;
    assert_eq!(
        (r.status, r.location()),
        (StatusCode::SEE_OTHER, Some("../"))
    );
    assert_eq!(client.paused_queues().await.unwrap()[0].0, "q1");
    assert!(a.get("/").await.body.contains("paused</span>"));
    a.post_form("/queues/resume", &[("queue", "q1")]).await;
    assert!(client.paused_queues().await.unwrap().is_empty());
    assert_eq!(
        a.post_form("/queues/pause", &[("queue", "")]).await.status,
        StatusCode::BAD_REQUEST
    );

    // The same through the API.
    let d2 = insert(&a.db, "q2", "t", "{}", "dead").await;
    let r = a
        .api_post(&format!("/api/v1/tasks/{d2}/retry"), json!({}))
        .await;
    assert_eq!(
        (r.status, r.json()["state"].clone()),
        (StatusCode::OK, json!("pending"))
    );
    assert_eq!(
        a.api_post(&format!("/api/v1/tasks/{d2}/retry"), json!({}))
            .await
            .json()["error"]["code"],
        "wrong_state"
    );
    let r = a
        .api_post(&format!("/api/v1/tasks/{d2}/cancel"), json!({}))
        .await;
    assert_eq!(r.json()["result"], "canceled");
    let trail = taskq::Client::new(a.db.pool.clone())
        .audit(&taskq::client::AuditFilter {
            task: Some(taskq::TaskId(d2)),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        (trail[0].actor.as_str(), trail[0].action.as_str()),
        ("api:token", "cancel")
    );
    assert_eq!(
        a.api_post(&format!("/api/v1/tasks/{d2}/cancel"), json!({}))
            .await
            .status,
        StatusCode::CONFLICT
    );
    assert_eq!(
        a.api_post("/api/v1/tasks/999999/cancel", json!({}))
            .await
            .status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        a.api_post("/api/v1/tasks/abc/cancel", json!({}))
            .await
            .status,
        StatusCode::BAD_REQUEST
    );
    let r = a.api_post("/api/v1/queues/q2/pause", json!({})).await;
    assert_eq!(r.json(), json!({"queue": "q2", "paused": true}));
    let stats = a.get("/api/v1/queues").await.json();
    let q2 = stats["queues"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["queue"] == "q2")
        .unwrap()
        .clone();
    assert_eq!(q2["paused"], true);
    assert_eq!(q2["counts"]["canceled"], 1);
    let r = a.api_post("/api/v1/queues/q2/resume", json!({})).await;
    assert_eq!(r.json()["was_paused"], true);
    let t = a.get(&format!("/api/v1/tasks/{running}")).await.json();
    assert_eq!(
        (t["state"].clone(), t["payload"].clone()),
        (json!("running"), json!({}))
    );
    assert_eq!(t["attempts"], json!([]));
    assert_eq!(
        a.get("/api/v1/tasks/999999").await.status,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn bulk_actions_show_the_count_before_they_run() {
    let Some(a) = app(token_app()).await else {
        return;
    };
    let mut q1 = vec![];
    for _ in 0..3 {
        q1.push(insert(&a.db, "q1", "t", "{}", "dead").await);
    }
    let q2 = [
        insert(&a.db, "q2", "t", "{}", "dead").await,
        insert(&a.db, "q2", "u", "{}", "dead").await,
    ];
    let p = insert(&a.db, "q3", "t", "{}", "pending").await;

    let confirm = a.get("/bulk?action=retry&queue=q1&name=&older_than=").await;
    assert_eq!(confirm.status, StatusCode::OK);
    assert!(
        confirm.body.contains("data-count=\"3\""),
        "{}",
        confirm.body
    );
    assert!(confirm.body.contains("action=\"./bulk\""));
    assert_eq!(
        a.db.count("state = 'dead'").await,
        5,
        "the confirmation changes nothing"
    );
    let r = a
        .post_form("/bulk", &[("action", "retry"), ("queue", "q1")])
        .await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(r.body.contains("<b>3</b>"), "{}", r.body);
    for id in &q1 {
        assert_eq!(state_of(&a.db, *id).await.as_deref(), Some("pending"));
    }
    assert_eq!(a.db.count("state = 'dead'").await, 2);

    // Retry by name, older-than filter.
    let none = a.get("/bulk?action=retry&name=u&older_than=1d").await;
    assert!(
        none.body.contains("data-count=\"0\"")
            && !none.body.contains("method=\"post\" action=\"./bulk\"")
    );
    assert!(
        a.get("/bulk?action=retry&name=u")
            .await
            .body
            .contains("data-count=\"1\"")
    );

    // Cancel pending.
    let c = a.get("/bulk?action=cancel&queue=q3").await;
    assert!(c.body.contains("data-count=\"1\""));
    a.post_form("/bulk", &[("action", "cancel"), ("queue", "q3")])
        .await;
    assert_eq!(state_of(&a.db, p).await.as_deref(), Some("canceled"));

    // Purge dead (every queue).
    assert!(
        a.get("/bulk?action=purge")
            .await
            .body
            .contains("data-count=\"2\"")
    );
    assert_eq!(
        a.get("/bulk?action=purge&queue=q2").await.status,
        StatusCode::BAD_REQUEST
    );
    assert!(
        a.get("/bulk?action=purge&older_than=1h")
            .await
            .body
            .contains("data-count=\"0\"")
    );
    let r = a.post_form("/bulk", &[("action", "purge")]).await;
    assert!(r.body.contains("Deleted <b>2</b>"), "{}", r.body);
    for id in q2 {
        assert_eq!(state_of(&a.db, id).await, None);
    }
    assert_eq!(
        a.get("/bulk?action=explode").await.status,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        a.get("/bulk?action=retry&older_than=soon").await.status,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        a.get("/bulk?action=retry&state=pending").await.status,
        StatusCode::BAD_REQUEST
    );
}

#[tokio::test]
async fn overview_shows_counts_throughput_age_and_refreshes() {
    let Some(a) = app(|b| b.bearer_token(TOKEN).throughput_minutes(5)).await else {
        return;
    };
    for _ in 0..4 {
        insert(&a.db, "mail", "t", "{}", "succeeded").await;
    }
    insert(&a.db, "mail", "t", "{}", "dead").await;
    let old = insert(&a.db, "mail", "t", "{}", "pending").await;
    sqlx::query(
        "UPDATE taskq_tasks SET run_at = UTC_TIMESTAMP(6) - INTERVAL 125 SECOND WHERE id = ?",
    )
    .bind(old)
    .execute(&a.db.pool)
    .await
    .unwrap();
    // Finished 3 minutes ago.
    let earlier = insert(&a.db, "mail", "t", "{}", "succeeded").await;
    sqlx::query(
        "UPDATE taskq_tasks SET finished_at = UTC_TIMESTAMP(6) - INTERVAL 190 SECOND WHERE id = ?",
    )
    .bind(earlier)
    .execute(&a.db.pool)
    .await
    .unwrap();
    let r = a.get("/").await;
    assert_eq!(r.status, StatusCode::OK);
    let b = &r.body;
    assert!(b.contains("<meta http-equiv=\"refresh\" content=\"5\">"));
    assert!(
        b.contains("href=\"./tasks?queue=mail&amp;state=succeeded\">5</a>"),
        "{b}"
    );
    assert!(b.contains("href=\"./tasks?queue=mail&amp;state=dead\">1</a>"));
    assert!(b.contains("due for 2m 0"), "oldest pending age: {b}");
    let row0 = b.split("<td>last 60 s</td>").nth(1).unwrap();
    assert!(
        row0.starts_with("<td class=\"n\">4</td><td class=\"n\">1</td>"),
        "{row0}"
    );
    let row3 = b.split("<td>3 min ago</td>").nth(1).unwrap();
    assert!(row3.starts_with("<td class=\"n\">1</td>"), "{row3}");
    assert!(!b.contains("<td>5 min ago</td>"), "5 rows: minutes 0 to 4");
    let r = a.get("/?refresh=0").await;
    assert!(!r.body.contains("http-equiv=\"refresh\""));
    let api = a.get("/api/v1/queues").await.json();
    let per: i64 = api["finished_per_minute"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["state"] == "succeeded")
        .map(|p| p["count"].as_i64().unwrap())
        .sum();
    assert_eq!(per, 5);
}

#[tokio::test]
async fn served_on_a_real_listener_under_a_prefix() {
    let Some(served) = support::serve("/ops/taskq", |b| b).await else {
        return;
    };
    insert(&served.db, "q", "t", "{}", "pending").await;
    let (status, body) = support::raw_get(
        served.addr,
        "/ops/taskq/api/v1/queues",
        &format!("Bearer {TOKEN}"),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"queue\":\"q\""), "{body}");
    let (status, _) = support::raw_get(served.addr, "/ops/taskq", "Bearer wrong-wrong").await;
    assert_eq!(status, 401);
    let (status, body) =
        support::raw_get(served.addr, "/ops/taskq", &format!("Bearer {TOKEN}")).await;
    assert_eq!(status, 200);
    assert!(body.contains("href=\"./taskq/tasks\""));
    assert!(served.url("/").ends_with("/ops/taskq/"));
}

/// Sets the attempt history of task `id`: `(outcome, ended seconds ago, error)` per entry.
async fn set_attempts(db: &TestDb, id: u64, entries: &[(&str, i64, Option<&str>)]) {
    let json: Vec<String> = entries
        .iter()
        .enumerate()
        .map(|(i, (outcome, ago, error))| {
            format!(
                "JSON_OBJECT('attempt', {n}, 'epoch', {n}, 'worker', 'w1', \
                 'started_at', DATE_FORMAT(UTC_TIMESTAMP(6) - INTERVAL {s} SECOND, '%Y-%m-%d %H:%i:%s.%f'), \
                 'finished_at', DATE_FORMAT(UTC_TIMESTAMP(6) - INTERVAL {ago} SECOND, '%Y-%m-%d %H:%i:%s.%f'), \
                 'outcome', '{outcome}', 'error', {})",
                error.map_or("NULL".to_owned(), |e| format!("'{e}'")),
                n = i + 1,
                s = ago + 1,
            )
        })
        .collect();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE taskq_tasks SET attempts = JSON_ARRAY({}) WHERE id = ?",
        json.join(", ")
    )))
    .bind(id)
    .execute(&db.pool)
    .await
    .unwrap();
}

/// The cells of the overview's throughput row for `label` (`last 60 s`, `2 min ago`), after
/// the label.
fn throughput_row<'b>(body: &'b str, label: &str) -> &'b str {
    let row = body
        .split(&format!("<td>{label}</td>"))
        .nth(1)
        .unwrap_or_else(|| panic!("no throughput row {label}: {body}"));
    row.split("</tr>").next().unwrap()
}

#[tokio::test]
async fn overview_shows_failed_attempts_limits_and_when_terminal_counts_were_taken() {
    let Some(a) = app(|b| b.bearer_token(TOKEN).throughput_minutes(5)).await else {
        return;
    };
    let client = taskq::Client::new(a.db.pool.clone());
    // Dead after a failure and a timeout in the last minute; a lost lease 2 min ago on a task
    // pending again; a succeeded task whose first attempt panicked 3 min ago.
    let dead = insert(&a.db, "mail", "t", "{}", "dead").await;
    set_attempts(
        &a.db,
        dead,
        &[
            ("failed", 20, Some("smtp 421")),
            ("timed_out", 5, Some("timed out after 1s")),
        ],
    )
    .await;
    let again = insert(&a.db, "mail", "t", "{}", "pending").await;
    set_attempts(&a.db, again, &[("lease_lost", 130, Some("lease expired"))]).await;
    let ok = insert(&a.db, "billing", "t", "{}", "succeeded").await;
    set_attempts(
        &a.db,
        ok,
        &[("panicked", 190, Some("kaboom")), ("succeeded", 10, None)],
    )
    .await;
    client.set_queue_limit("mail", Some(3)).await.unwrap();
    client
        .set_queue_rate_limit("mail", Some((100, std::time::Duration::from_secs(60))))
        .await
        .unwrap();
    client.pause_queue("billing").await.unwrap();

    let b = a.get("/").await.body;
    assert!(
        b.contains("<th>failed attempts</th><th>lease lost</th>"),
        "{b}"
    );
    let row0 = throughput_row(&b, "last 60 s");
    assert!(
        row0.contains(r#"<td class="n failed">2</td><td class="n lease-lost">0</td>"#),
        "{row0}"
    );
    let row2 = throughput_row(&b, "2 min ago");
    assert!(
        row2.contains(r#"<td class="n failed">0</td><td class="n lease-lost">1</td>"#),
        "{row2}"
    );
    let row3 = throughput_row(&b, "3 min ago");
    assert!(
        row3.contains(r#"<td class="n failed">1</td><td class="n lease-lost">0</td>"#),
        "{row3}"
    );
    // Limits and the paused flag, per queue.
    let mail = b.split("<tr data-queue=\"mail\">").nth(1).unwrap();
    let mail = mail.split("</tr>").next().unwrap();
    assert!(
        mail.contains(r#"<span class="limit-concurrency">at most 3 running</span>"#),
        "{mail}"
    );
    assert!(
        mail.contains(
            r#"<span class="limit-rate">100 per 1 min (0 started in this window)</span>"#
        ),
        "{mail}"
    );
    assert!(mail.contains("<td>active</td>"), "{mail}");
    let billing = b.split("<tr data-queue=\"billing\">").nth(1).unwrap();
    let billing = billing.split("</tr>").next().unwrap();
    assert!(billing.contains("<td>—</td><td><span class=\"badge paused\">paused</span>"));
    assert!(b.contains("id=\"counts-note\""), "{b}");

    // The API: the same numbers.
    let api = a.get("/api/v1/queues").await.json();
    let mut failed: Vec<(String, i64, i64)> = api["failed_attempts_per_minute"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["outcome"].as_str().unwrap().to_owned(),
                p["minutes_ago"].as_i64().unwrap(),
                p["count"].as_i64().unwrap(),
            )
        })
        .collect();
    failed.sort();
    assert_eq!(
        failed,
        vec![
            ("failed".into(), 0, 1),
            ("lease_lost".into(), 2, 1),
            ("panicked".into(), 3, 1),
            ("timed_out".into(), 0, 1)
        ]
    );
    let queues = api["queues"].as_array().unwrap();
    let mail = queues.iter().find(|q| q["queue"] == "mail").unwrap();
    assert_eq!(mail["concurrency_limit"], 3);
    assert_eq!(mail["rate_limit"], json!({"max": 100, "period_ms": 60000}));
    assert_eq!(mail["paused"], false);
    assert_eq!(mail["counts"]["dead"], 1);
    assert_eq!(mail["counts"]["pending"], 1);
    let billing = queues.iter().find(|q| q["queue"] == "billing").unwrap();
    assert_eq!(billing["paused"], true);
    assert_eq!(billing["concurrency_limit"], serde_json::Value::Null);
    assert_eq!(billing["counts"]["succeeded"], 1);
    assert!(api["terminal_counts_at"].is_string());

    // The task page: a succeeded attempt has no error block, a failed one shows its error.
    let page = a.get(&format!("/tasks/{ok}")).await.body;
    let attempts = page.split("<table id=\"attempts\">").nth(1).unwrap();
    let attempts = attempts.split("</table>").next().unwrap();
    assert!(
        attempts.contains("<td>panicked</td><td><pre>kaboom</pre></td>"),
        "{attempts}"
    );
    assert!(
        attempts.contains("<td>succeeded</td><td>—</td>"),
        "{attempts}"
    );
    assert!(!attempts.contains("<pre></pre>"), "{attempts}");
}

#[tokio::test]
async fn terminal_counts_are_reused_until_their_maximum_age_or_an_action() {
    let Some(a) = app(|b| {
        b.bearer_token(TOKEN)
            .terminal_counts_max_age(std::time::Duration::from_secs(3600))
    })
    .await
    else {
        return;
    };
    let dead = insert(&a.db, "q", "t", "{}", "dead").await;
    let counts = |body: serde_json::Value| {
        let q = body["queues"]
            .as_array()
            .unwrap()
            .iter()
            .find(|q| q["queue"] == "q")
            .cloned()
            .unwrap();
        (
            q["counts"]["pending"].as_i64().unwrap(),
            q["counts"]["dead"].as_i64().unwrap(),
            q["counts"]["succeeded"].as_i64().unwrap(),
        )
    };
    let first = a.get("/api/v1/queues").await.json();
    assert_eq!(counts(first.clone()), (0, 1, 0));
    // Changes made elsewhere: pending shows at once, terminal counts keep their time.
    insert(&a.db, "q", "t", "{}", "succeeded").await;
    insert(&a.db, "q", "t", "{}", "pending").await;
    let second = a.get("/api/v1/queues").await.json();
    assert_eq!(counts(second.clone()), (1, 1, 0));
    assert_eq!(second["terminal_counts_at"], first["terminal_counts_at"]);
    let page = a.get("/").await.body;
    assert!(
        page.contains("href=\"./tasks?queue=q&amp;state=succeeded\">0</a>"),
        "cached: {page}"
    );
    // An action of the dashboard counts again.
    let r = a.post_form(&format!("/tasks/{dead}/retry"), &[]).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER);
    let third = a.get("/api/v1/queues").await.json();
    assert_eq!(counts(third.clone()), (2, 0, 1));
    assert_ne!(third["terminal_counts_at"], first["terminal_counts_at"]);

    // With a maximum age of zero every request counts.
    let Some(fresh) = app(|b| {
        b.bearer_token(TOKEN)
            .terminal_counts_max_age(std::time::Duration::ZERO)
    })
    .await
    else {
        return;
    };
    insert(&fresh.db, "q", "t", "{}", "dead").await;
    assert_eq!(counts(fresh.get("/api/v1/queues").await.json()), (0, 1, 0));
    insert(&fresh.db, "q", "t", "{}", "dead").await;
    assert_eq!(counts(fresh.get("/api/v1/queues").await.json()), (0, 2, 0));
}

// A silent network needs a TCP connection: MySQL only (the `sqlite` tests have none).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_database_gives_504_within_the_client_deadline() {
    use std::time::{Duration, Instant};
    if !taskq_tests::loopback_or_skip() {
        return;
    }
    let Some(db) = TestDb::new_or_skip().await else {
        return;
    };
    let upstream = format!("{}:{}", db.options.get_host(), db.options.get_port())
        .parse()
        .expect("the test server is addressed by IP");
    let proxy = taskq_tests::proxy::ChaosProxy::start(upstream).await;
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(4)
        .connect_lazy_with(db.options.clone().port(proxy.addr().port()));
    let client = taskq::Client::new(pool).with_timeout(Duration::from_millis(500));
    let router = Dashboard::builder_with_client(client)
        .bearer_token(TOKEN)
        .build()
        .unwrap()
        .router();
    let id = insert(&db, "mail", "send", "{}", "pending").await;
    let get = |p: String| {
        let router = router.clone();
        async move { send(&router, Method::GET, &p, Cred::Bearer(TOKEN), &[], None).await }
    };
    assert_eq!(
        get(format!("/api/v1/tasks/{id}")).await.status,
        StatusCode::OK
    );
    proxy.set_black_hole(true);
    proxy.black_hole_all();
    for path in [
        format!("/api/v1/tasks/{id}"),
        format!("/tasks/{id}"),
        "/".into(),
    ] {
        let asked = Instant::now();
        let r = tokio::time::timeout(Duration::from_secs(10), get(path.clone()))
            .await
            .unwrap_or_else(|_| panic!("{path} still waits after 10 s"));
        assert_eq!(r.status, StatusCode::GATEWAY_TIMEOUT, "{path}: {}", r.body);
        assert!(
            r.body.contains("did not answer within 500ms"),
            "{path}: {}",
            r.body
        );
        assert!(
            asked.elapsed() < Duration::from_secs(5),
            "{path}: {:?}",
            asked.elapsed()
        );
    }
    let r = get(format!("/api/v1/tasks/{id}")).await;
    assert_eq!(r.json()["error"]["code"], "timeout");
}
