//! Lost workers and tasks no live worker handles, on the overview, the task page and the API,
//! on both backends.

mod support;

use std::time::Duration;

use axum::http::{Method, StatusCode};
use support::{Cred, TOKEN, send};
use taskq::{Task, TaskContext, TaskError};
use taskq_tests::backends::{Db, TestBackend};
use taskq_web::Dashboard;

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Known;

impl Task for Known {
    const NAME: &'static str = "known";
    const QUEUE: &'static str = "orders";
    async fn run(self, _cx: TaskContext) -> Result<(), TaskError> {
        Ok(())
    }
}

/// A task name no worker registers.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Ghost;

impl Task for Ghost {
    const NAME: &'static str = "ghost";
    const QUEUE: &'static str = "orders";
    async fn run(self, _cx: TaskContext) -> Result<(), TaskError> {
        Ok(())
    }
}

/// Two workers of `orders` that register `known`, heartbeat 10 s, lease 30 s: `w-lost` last
/// beat 25 s ago (two beats missed, its lease not over: it was shown alive before), `w-live`
/// 1 s ago. `w-lost` holds a running task. Two `ghost` tasks are due: no worker registers the
/// name. The overview lists `w-lost` as lost with its last beat's age and the ghosts under
/// "Tasks no live worker handles"; the task page says the worker is lost; the API says the
/// same.
async fn lost_workers_and_unhandled_tasks_show_on_the_dashboard_and_api<B: TestBackend>(db: Db<B>) {
    db.exec(&format!(
        "INSERT INTO taskq_workers (worker_id, host, pid, queues, concurrency, lease_us,
           heartbeat_us, names, started_at, last_seen_at)
         VALUES ('w-lost', 'box-1', 7, '{{\"orders\":2}}', 2, 30000000, 10000000, '[\"known\"]',
                 {started}, {lost}),
                ('w-live', 'box-2', 8, '{{\"orders\":1}}', 1, 30000000, 10000000, '[\"known\"]',
                 {started}, {live})",
        started = db.ago(Duration::from_secs(60)),
        lost = db.ago(Duration::from_secs(25)),
        live = db.ago(Duration::from_secs(1)),
    ))
    .await;
    let held = Known.enqueue(&db.pool).await.unwrap().id.0;
    db.exec(&format!(
        "UPDATE taskq_tasks SET state = 'running', attempt = 1, lease_epoch = 1,
           worker_id = 'w-lost', lease_until = {} WHERE id = {held}",
        db.from_now(Duration::from_secs(5))
    ))
    .await;
    for _ in 0..2 {
        Ghost.enqueue(&db.pool).await.unwrap();
    }
    let router = Dashboard::builder(db.pool.clone())
        .bearer_token(TOKEN)
        .build()
        .unwrap()
        .router();
    let get = |path: String| {
        let router = router.clone();
        async move {
            let r = send(&router, Method::GET, &path, Cred::Bearer(TOKEN), &[], None).await;
            assert_eq!(r.status, StatusCode::OK, "{path}: {}", r.body);
            r
        }
    };

    let overview = get("/".into()).await.body;
    let row = |id: &str| -> String {
        let start = overview
            .find(&format!(r#"<tr data-worker="{id}">"#))
            .unwrap_or_else(|| panic!("no row of {id}: {overview}"));
        let end = start + overview[start..].find("</tr>").unwrap();
        overview[start..end].to_owned()
    };
    let lost = row("w-lost");
    assert!(
        lost.contains(r#"<td><span class="lost">lost</span></td>"#)
            && (lost.contains(">25s ago<") || lost.contains(">26s ago<")),
        "{lost}"
    );
    let live = row("w-live");
    assert!(
        live.contains("<td>alive</td>") && (live.contains(">1s ago<") || live.contains(">2s ago<")),
        "{live}"
    );
    assert!(overview.contains("<th>Last beat</th>"), "{overview}");
    let section = &overview[overview
        .find("<h2>Tasks no live worker handles</h2>")
        .unwrap_or_else(|| panic!("no unhandled section: {overview}"))..];
    assert!(
        section.contains(r#">ghost</a></td><td class="n">2</td>"#)
            && !section[..section.find("</table>").unwrap()].contains(">known<"),
        "{section}"
    );

    let page = get(format!("/tasks/{held}")).await.body;
    assert!(
        page.contains(r#"<span id="worker-lost">worker lost: no heartbeat for 2"#)
            && page.contains("s (it beats every 10s). The task stays claimed until its lease ends"),
        "{page}"
    );
    assert!(
        page.contains(r#"w-lost — <span class="lost">lost</span>"#),
        "{page}"
    );

    // The task list marks the running task of the lost worker, in the page and the API.
    let list = get("/tasks?state=running".into()).await.body;
    assert!(
        list.contains(r#"running <span class="lost worker-lost">worker lost</span>"#),
        "{list}"
    );
    let listed = get("/api/v1/tasks?state=running".into()).await.json();
    assert_eq!(listed["tasks"][0]["worker_status"], "lost", "{listed}");
    assert!(
        !get("/tasks?state=pending".into())
            .await
            .body
            .contains("worker lost")
    );
    // The last beat: absolute, then relative.
    assert!(
        lost.contains(" UTC <span class=\"ago\">25s ago</span>")
            || lost.contains(" UTC <span class=\"ago\">26s ago</span>"),
        "{lost}"
    );

    let api = get("/api/v1/workers".into()).await.json();
    assert_eq!(api["workers"][0]["lost_after_ms"], 20_000, "{api}");
    let statuses: Vec<(&str, &str, u64)> = api["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| {
            (
                w["id"].as_str().unwrap(),
                w["status"].as_str().unwrap(),
                w["last_seen_ago_ms"].as_u64().unwrap() / 1000,
            )
        })
        .collect();
    assert!(
        matches!(
            statuses[..],
            [("w-live", "alive", 1..=2), ("w-lost", "lost", 25..=26)]
        ),
        "{api}"
    );
    let unhandled: Vec<(&str, &str, u64)> = api["unhandled"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| {
            (
                u["queue"].as_str().unwrap(),
                u["name"].as_str().unwrap(),
                u["due"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(unhandled, [("orders", "ghost", 2)], "{api}");
    let task = get(format!("/api/v1/tasks/{held}")).await.json();
    assert_eq!(task["worker_status"], "lost", "{task}");
}

taskq_tests::conformance!(lost_workers_and_unhandled_tasks_show_on_the_dashboard_and_api);
