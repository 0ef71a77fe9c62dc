//! `taskq-bench --dashboard`: the dashboard's page and API times on a large task table.
//!
//! Fills `taskq_tasks` with `--dashboard-tasks` rows (default 1,000,000) in bulk
//! `INSERT … SELECT` statements (8 queues, 12 task names, every state, finished times spread
//! over hours), builds the `taskq-web` router in-process and sends it `--requests` GETs per
//! page through `tower::ServiceExt::oneshot` (the router's own time: authentication, the
//! statements, rendering; no socket). Prints median and p95 per page as a Markdown table and
//! names the pages whose median is over 100 ms (`--keep-db` keeps the database for `EXPLAIN`).

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use sqlx::{MySqlPool, Row};
use tower::ServiceExt as _;

use crate::Res;

const TOKEN: &str = "bench-dashboard-token";

/// Settings of the dashboard measurement.
pub struct DashOpts {
    /// Rows in the task table.
    pub tasks: u64,
    /// Timed requests per page (after 2 untimed ones).
    pub requests: usize,
}

/// Rows per statement of the fill (the digits cross join yields 100,000 numbers).
const CHUNK: u64 = 100_000;

/// Fills the task table with `n` rows of a plausible mix, in statements of 100,000 rows.
async fn fill(pool: &MySqlPool, n: u64) -> Res<()> {
    sqlx::query("CREATE TABLE IF NOT EXISTS bench_digits (d INT PRIMARY KEY)")
        .execute(pool)
        .await?;
    sqlx::query("INSERT IGNORE INTO bench_digits VALUES (0),(1),(2),(3),(4),(5),(6),(7),(8),(9)")
        .execute(pool)
        .await?;
    let mut base = 0;
    while base < n {
        // s.k: the row's state bucket (0..99); created times run from ~n*20 ms ago to now.
        sqlx::query(
            "INSERT INTO taskq_tasks (queue, name, payload, state, priority, attempt, max_attempts,
                 run_at, lease_until, lease_epoch, worker_id, last_error, created_at, updated_at,
                 finished_at, attempts, attempted_at)
             SELECT IF(s.n % 100000 = 99999, 'audit',
                       ELT(1 + s.n % 7, 'default', 'billing', 'mail', 'reports', 'webhooks',
                           'search', 'exports')),
                 IF(s.n % 100000 = 99999, 'rare_audit',
                    ELT(1 + (s.n DIV 7) % 11, 'send_receipt', 'charge_card', 'refund', 'sync_crm',
                        'resize_image', 'index_doc', 'export_csv', 'notify_slack',
                        'deliver_webhook', 'cleanup', 'daily_report')),
                 CONCAT('{\"order_id\":', s.n, ',\"customer\":\"c', s.n % 5000,
                        '\",\"note\":\"', REPEAT('x', 60), '\"}'),
                 CASE WHEN s.k < 70 THEN 'succeeded' WHEN s.k < 85 THEN 'pending'
                      WHEN s.k < 86 THEN 'running' WHEN s.k < 92 THEN 'dead'
                      WHEN s.k < 97 THEN 'canceled' ELSE 'expired' END,
                 0,
                 CASE WHEN s.k < 70 THEN 1 WHEN s.k < 85 THEN IF(s.n % 10 = 1, 1, 0)
                      WHEN s.k < 86 THEN 1 WHEN s.k < 92 THEN 3 ELSE 0 END,
                 3,
                 IF(s.k >= 70 AND s.k < 85 AND s.n % 10 = 0,
                    UTC_TIMESTAMP(6) + INTERVAL (s.n % 7200) SECOND, s.created),
                 IF(s.k = 85, UTC_TIMESTAMP(6) + INTERVAL 30 SECOND, NULL),
                 IF(s.k < 70 OR (s.k >= 85 AND s.k < 92), 1, 0),
                 IF(s.k = 85, 'bench-host:4242:0001', NULL),
                 IF((s.k >= 86 AND s.k < 92) OR (s.k >= 70 AND s.k < 85 AND s.n % 10 = 1),
                    CONCAT('upstream answered 503 Service Unavailable for order ', s.n), NULL),
                 s.created,
                 IF(s.k < 70 OR s.k >= 86, s.created + INTERVAL 1 SECOND, s.created),
                 IF(s.k < 70 OR s.k >= 86, s.created + INTERVAL 1 SECOND, NULL),
                 CASE WHEN s.k < 70 OR (s.k >= 86 AND s.k < 92) THEN
                     CONCAT('[{\"attempt\":1,\"epoch\":1,\"worker\":\"bench-host:4242:0001\",\"started_at\":\"',
                            DATE_FORMAT(s.created, '%Y-%m-%d %H:%i:%s.%f'), '\",\"finished_at\":\"',
                            DATE_FORMAT(s.created + INTERVAL 1 SECOND, '%Y-%m-%d %H:%i:%s.%f'),
                            IF(s.k < 70, '\",\"outcome\":\"succeeded\",\"error\":null}]',
                               CONCAT('\",\"outcome\":\"failed\",\"error\":\"upstream answered 503 for order ',
                                      s.n, '\"}]')))
                 END,
                 IF(s.k < 70 OR (s.k >= 85 AND s.k < 92), s.created, NULL)
             FROM (SELECT d.n, (d.n * 37) % 100 AS k,
                          UTC_TIMESTAMP(6) - INTERVAL ((? - d.n) * 20000) MICROSECOND AS created
                   FROM (SELECT ? + a.d + 10 * b.d + 100 * c.d + 1000 * e.d + 10000 * f.d AS n
                         FROM bench_digits a, bench_digits b, bench_digits c, bench_digits e,
                              bench_digits f) d
                   WHERE d.n < ?) s
             ORDER BY s.n",
        )
        .bind(n)
        .bind(base)
        .bind(n)
        .execute(pool)
        .await?;
        base += CHUNK;
    }
    // An audit trail of 10,000 entries over the 8 queues.
    sqlx::query(
        "INSERT INTO taskq_audit (at, actor, action, task_id, queue, detail)
         SELECT UTC_TIMESTAMP(6) - INTERVAL d.n SECOND, 'web:session',
                ELT(1 + d.n % 4, 'retry', 'cancel', 'pause', 'reschedule'), d.n + 1,
                ELT(1 + d.n % 7, 'default', 'billing', 'mail', 'reports', 'webhooks', 'search',
                    'exports'), NULL
         FROM (SELECT a.d + 10 * b.d + 100 * c.d + 1000 * e.d AS n
               FROM bench_digits a, bench_digits b, bench_digits c, bench_digits e) d",
    )
    .execute(pool)
    .await?;
    sqlx::query("ANALYZE TABLE taskq_tasks")
        .execute(pool)
        .await?;
    Ok(())
}

/// One GET through the router: status, body size, time.
async fn get(router: &axum::Router, path: &str) -> Res<(StatusCode, String, Duration)> {
    let req = Request::builder()
        .uri(path)
        .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
        .body(Body::empty())?;
    let t0 = Instant::now();
    let resp = router.clone().oneshot(req).await?;
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX).await?;
    let took = t0.elapsed();
    Ok((status, String::from_utf8_lossy(&bytes).into_owned(), took))
}

/// Median and p95 of `v`, in milliseconds.
fn median_p95(mut v: Vec<Duration>) -> (f64, f64) {
    v.sort();
    let q = |p: f64| v[((v.len() as f64 - 1.0) * p).round() as usize].as_secs_f64() * 1000.0;
    (q(0.5), q(0.95))
}

/// One measured page: what it is, the request, and a string its body must contain.
struct Case {
    label: &'static str,
    path: String,
    expect: &'static str,
}

/// Runs the measurement in the (empty, migrated) database of `pool` and prints the results.
pub async fn run(pool: &MySqlPool, o: &DashOpts) -> Res<()> {
    eprintln!("[dashboard] filling taskq_tasks with {} rows", o.tasks);
    let t0 = Instant::now();
    fill(pool, o.tasks).await?;
    let fill_secs = t0.elapsed().as_secs_f64();
    let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM taskq_tasks")
        .fetch_one(pool)
        .await?;
    eprintln!("[dashboard] {rows} rows in {fill_secs:.1} s");
    let ids =
        sqlx::query("SELECT CAST(MIN(id) AS UNSIGNED), CAST(MAX(id) AS UNSIGNED) FROM taskq_tasks")
            .fetch_one(pool)
            .await?;
    let (min_id, max_id): (u64, u64) = (ids.try_get(0)?, ids.try_get(1)?);
    let dead_id: u64 = sqlx::query_scalar(
        "SELECT id FROM taskq_tasks WHERE state = 'dead' AND id > ? ORDER BY id LIMIT 1",
    )
    .bind(min_id + (max_id - min_id) / 2)
    .fetch_one(pool)
    .await?;
    // A page 90% of the way down the newest-first list, and near the end of oldest-first.
    let deep = max_id - (max_id - min_id) * 9 / 10;
    let deep_oldest = max_id - 1_000;

    let router = taskq_web::Dashboard::builder(pool.clone())
        .bearer_token(TOKEN)
        .build()?
        .router();
    // The same dashboard counting the terminal states on every request (no reuse).
    let uncached = taskq_web::Dashboard::builder(pool.clone())
        .bearer_token(TOKEN)
        .terminal_counts_max_age(Duration::ZERO)
        .build()?
        .router();
    let cases = vec![
        Case {
            label: "overview",
            path: "/?refresh=0".into(),
            expect: "id=\"queues\"",
        },
        Case {
            label: "overview, terminal counts recounted (terminal_counts_max_age 0)",
            path: "uncached:/?refresh=0".into(),
            expect: "id=\"queues\"",
        },
        Case {
            label: "task list, first page (newest first, 50)",
            path: "/tasks".into(),
            expect: "id=\"tasks\"",
        },
        Case {
            label: "task list, deep keyset page (newest first, 90% down)",
            path: format!("/tasks?after={deep}"),
            expect: "id=\"tasks\"",
        },
        Case {
            label: "task list, deep keyset page (oldest first, near the end)",
            path: format!("/tasks?order=oldest&after={deep_oldest}"),
            expect: "id=\"tasks\"",
        },
        Case {
            label: "filtered: queue + state (billing, dead; 0.9% of rows)",
            path: "/tasks?queue=billing&state=dead".into(),
            expect: "id=\"tasks\"",
        },
        Case {
            label: "filtered: name (charge_card; 9% of rows)",
            path: "/tasks?name=charge_card".into(),
            expect: "id=\"tasks\"",
        },
        Case {
            label: "filtered: queue + state + name (mail, running, refund)",
            path: "/tasks?queue=mail&state=running&name=refund".into(),
            expect: "id=\"tasks\"",
        },
        Case {
            label: "filtered: rare name (10 rows in 1M)",
            path: "/tasks?name=rare_audit".into(),
            expect: "id=\"tasks\"",
        },
        Case {
            label: "filtered: big queue (billing; 14% of rows)",
            path: "/tasks?queue=billing".into(),
            expect: "id=\"tasks\"",
        },
        Case {
            label: "filtered: small queue (10 rows in 1M)",
            path: "/tasks?queue=audit".into(),
            expect: "id=\"tasks\"",
        },
        Case {
            label: "filtered: queue + state with no match (audit, running)",
            path: "/tasks?queue=audit&state=running".into(),
            expect: "No matching tasks",
        },
        Case {
            label: "task page (dead task)",
            path: format!("/tasks/{dead_id}"),
            expect: "id=\"last-error\"",
        },
        Case {
            label: "API: GET /api/v1/tasks (50)",
            path: "/api/v1/tasks?limit=50".into(),
            expect: "\"tasks\"",
        },
        Case {
            label: "API: GET /api/v1/tasks?queue=billing&state=dead",
            path: "/api/v1/tasks?queue=billing&state=dead&limit=50".into(),
            expect: "\"tasks\"",
        },
        Case {
            label: "API: GET /api/v1/queues",
            path: "/api/v1/queues".into(),
            expect: "billing",
        },
        Case {
            label: "API: GET /api/v1/queues, terminal counts recounted",
            path: "uncached:/api/v1/queues".into(),
            expect: "billing",
        },
        Case {
            label: "scheduled (pending, due later; soonest first)",
            path: "/scheduled".into(),
            expect: "id=\"scheduled\"",
        },
        Case {
            label: "scheduled, one queue",
            path: "/scheduled?queue=billing".into(),
            expect: "id=\"scheduled\"",
        },
        Case {
            label: "retrying (pending, attempt > 0)",
            path: "/retrying".into(),
            expect: "id=\"retrying\"",
        },
        Case {
            label: "schedules",
            path: "/schedules".into(),
            expect: "<h1>Schedules</h1>",
        },
        Case {
            label: "audit trail (10,000 entries)",
            path: "/audit".into(),
            expect: "id=\"audit\"",
        },
        Case {
            label: "audit trail, one queue",
            path: "/audit?queue=billing".into(),
            expect: "id=\"audit\"",
        },
        Case {
            label: "names no live worker handles",
            path: "/unhandled".into(),
            expect: "id=\"unhandled\"",
        },
        Case {
            label: "names no live worker handles, counted on every request",
            path: "uncached:/unhandled".into(),
            expect: "id=\"unhandled\"",
        },
        Case {
            label: "API: GET /api/v1/scheduled",
            path: "/api/v1/scheduled?limit=50".into(),
            expect: "next_after",
        },
        Case {
            label: "API: GET /api/v1/retrying",
            path: "/api/v1/retrying?limit=50".into(),
            expect: "next_after",
        },
        Case {
            label: "API: GET /api/v1/audit",
            path: "/api/v1/audit?limit=50".into(),
            expect: "next_before",
        },
        Case {
            label: "bulk retry confirmation (count of billing's dead)",
            path: "/bulk?action=retry&queue=billing".into(),
            expect: "id=\"bulk-count\"",
        },
        Case {
            label: "bulk retry confirmation (count of every dead task)",
            path: "/bulk?action=retry".into(),
            expect: "id=\"bulk-count\"",
        },
        Case {
            label: "bulk purge confirmation (dead, finished > 1h ago)",
            path: "/bulk?action=purge&older_than=1h".into(),
            expect: "id=\"bulk-count\"",
        },
    ];
    let mut out = String::new();
    out += &format!(
        "{rows} tasks; {} requests per row, in-process (tower oneshot), after 2 untimed\n\n",
        o.requests
    );
    out += "| page | request | median ms | p95 ms | body KiB |\n|---|---|--:|--:|--:|\n";
    let mut slow = vec![];
    for c in &cases {
        eprintln!("[dashboard] {}", c.label);
        let mut times = Vec::with_capacity(o.requests);
        let mut size = 0;
        for i in 0..o.requests + 2 {
            let (r, path) = match c.path.strip_prefix("uncached:") {
                Some(p) => (&uncached, p),
                None => (&router, c.path.as_str()),
            };
            let (status, body, took) = get(r, path).await?;
            if status != StatusCode::OK || !body.contains(c.expect) {
                return Err(format!(
                    "{} ({}): {status}, body lacks {:?}: {}",
                    c.label,
                    c.path,
                    c.expect,
                    body.chars().take(400).collect::<String>()
                )
                .into());
            }
            size = body.len();
            if i >= 2 {
                times.push(took);
            }
        }
        let (p50, p95) = median_p95(times);
        out += &format!(
            "| {} | `{}` | {p50:.1} | {p95:.1} | {:.1} |\n",
            c.label,
            c.path.replace('|', "%7C"),
            size as f64 / 1024.0
        );
        if p50 > 100.0 {
            slow.push(c.label);
        }
    }
    println!("{out}");
    if !slow.is_empty() {
        println!("slow (median > 100 ms): {}", slow.join("; "));
    }
    Ok(())
}
