//! The Prometheus exporter serves taskq's metrics, with bounded labels.

use std::time::Duration;

use example_metrics::{BuildReport, install_exporter, scrape};
use taskq::{Task, TaskContext, TaskError};
use taskq_tests::{RunningWorker, TestDb, fast_worker, wait_until};

/// Snoozes on its first run, succeeds on the second.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Nap;

impl Task for Nap {
    const NAME: &'static str = "nap";
    const QUEUE: &'static str = "naps";
    async fn run(self, cx: TaskContext) -> Result<(), TaskError> {
        if cx.snoozes() == 0 {
            return Err(TaskError::snooze(Duration::from_millis(20)));
        }
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrape_shows_task_outcomes() {
    let Some(db) = TestDb::new_or_skip().await else {
        return;
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    install_exporter(addr).unwrap();
    let mut ids = Vec::new();
    for day in 1..=6 {
        ids.push(
            BuildReport {
                day,
                fail_first: day <= 2,
            }
            .enqueue(&db.pool)
            .await
            .unwrap()
            .id,
        );
    }
    // Past its deadline before any worker runs: expires instead of running.
    BuildReport {
        day: 7,
        fail_first: false,
    }
    .with_deadline(chrono::Utc::now() - chrono::Duration::hours(1))
    .enqueue(&db.pool)
    .await
    .unwrap();
    Nap.enqueue(&db.pool).await.unwrap();
    let w = RunningWorker::spawn(
        fast_worker(&db.pool)
            .register::<BuildReport>()
            .register::<Nap>()
            .backlog_metrics(Duration::from_millis(100)),
    );
    wait_until(Duration::from_secs(20), "all succeeded", || async {
        db.count("state = 'succeeded'").await == 7 && db.count("state = 'expired'").await == 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await; // a backlog refresh
    w.stop().await;
    let body = scrape(addr).await.unwrap();
    let line = |prefix: &str| {
        body.lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no line starting with {prefix} in:\n{body}"))
            .rsplit(' ')
            .next()
            .unwrap()
            .parse::<f64>()
            .unwrap()
    };
    assert_eq!(
        line(r#"taskq_enqueued_total{queue="reports",task="build_report"}"#),
        7.0
    );
    assert_eq!(
        line(r#"taskq_expired_total{queue="reports",task="build_report"}"#),
        1.0
    );
    assert_eq!(line(r#"taskq_snoozed_total{queue="naps",task="nap"}"#), 1.0);
    assert_eq!(
        line(r#"taskq_completed_total{queue="naps",task="nap",outcome="succeeded"}"#),
        1.0
    );
    assert_eq!(
        line(r#"taskq_backlog{queue="reports",state="expired"}"#),
        1.0
    );
    assert_eq!(
        line(r#"taskq_completed_total{queue="reports",task="build_report",outcome="succeeded"}"#),
        6.0
    );
    assert_eq!(
        line(r#"taskq_completed_total{queue="reports",task="build_report",outcome="retried"}"#),
        2.0
    );
    assert_eq!(line(r#"taskq_claimed_total{queue="reports"}"#), 8.0);
    assert_eq!(
        line(r#"taskq_backlog{queue="reports",state="succeeded"}"#),
        6.0
    );
    assert_eq!(line(r#"taskq_in_flight{queue="reports"}"#), 0.0);
    assert!(body.contains("taskq_handler_duration_seconds"));
    assert!(body.contains("taskq_queue_wait_seconds"));
    // Labels are only queue, task, outcome, state (plus the exporter's quantile / le):
    // never task ids or payloads.
    for l in body.lines().filter(|l| l.starts_with("taskq_")) {
        let Some(labels) = l.split_once('{').map(|(_, r)| r.split_once('}').unwrap().0) else {
            continue;
        };
        for kv in labels.split("\",") {
            let key = kv.split('=').next().unwrap().trim_start_matches(',');
            assert!(
                ["queue", "task", "outcome", "state", "quantile", "le"].contains(&key),
                "label {key} in {l}"
            );
        }
    }
    assert!(!ids.is_empty() && !body.contains("upstream not ready"));
}
