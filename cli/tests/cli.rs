//! The `taskq` binary run as a process against a fresh database: exit codes, output, rows.

use std::process::Command;

use taskq::{
    Client, Task, TaskContext, TaskError, TaskId, TaskState, schedule::Schedule, unique::Unique,
};
use taskq_tests::TestDb;

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Ping {
    n: u32,
    tag: String,
}

impl Task for Ping {
    const NAME: &'static str = "ping";
    async fn run(self, _cx: TaskContext) -> Result<(), TaskError> {
        Ok(())
    }
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Pong(u32);

impl Task for Pong {
    const NAME: &'static str = "pong";
    const QUEUE: &'static str = "other";
    async fn run(self, _cx: TaskContext) -> Result<(), TaskError> {
        Ok(())
    }
}

/// What one run of the binary gave.
#[derive(Debug)]
struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Out {
    fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {}", self.stdout))
    }
}

fn url(db: &TestDb) -> String {
    format!("{}/{}", taskq_tests::server_url(), db.name)
}

/// Runs `taskq ARGS` with `DATABASE_URL` set to `url` (unset when `None`).
async fn taskq(url: Option<String>, args: &[&str]) -> Out {
    let args: Vec<String> = args.iter().map(|s| (*s).to_owned()).collect();
    tokio::task::spawn_blocking(move || {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_taskq"));
        cmd.args(&args).env_remove("DATABASE_URL");
        if let Some(url) = url {
            cmd.env("DATABASE_URL", url);
        }
        let out = cmd.output().expect("run the taskq binary");
        Out {
            code: out.status.code().expect("exited normally"),
            stdout: String::from_utf8(out.stdout).expect("utf-8 stdout"),
            stderr: String::from_utf8(out.stderr).expect("utf-8 stderr"),
        }
    })
    .await
    .unwrap()
}

async fn exec(db: &TestDb, sql: &str, id: TaskId) {
    sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()))
        .bind(id.0)
        .execute(&db.pool)
        .await
        .unwrap();
}

async fn ping(db: &TestDb, n: u32) -> TaskId {
    Ping {
        n,
        tag: format!("t{n}"),
    }
    .enqueue(&db.pool)
    .await
    .unwrap()
    .id
}

async fn make_dead(db: &TestDb, id: TaskId) {
    exec(
        db,
        "UPDATE taskq_tasks SET state = 'dead', attempt = 3, lease_epoch = 3,
           last_error = 'boom: upstream said no', finished_at = UTC_TIMESTAMP(6) WHERE id = ?",
        id,
    )
    .await;
}

async fn make_running(db: &TestDb, id: TaskId) {
    exec(
        db,
        "UPDATE taskq_tasks SET state = 'running', attempt = 1, lease_epoch = 1,
           worker_id = 'w-1', lease_until = UTC_TIMESTAMP(6) + INTERVAL 30 SECOND WHERE id = ?",
        id,
    )
    .await;
}

/// The stdout line of a table whose cells start with `cells`.
fn row<'a>(stdout: &'a str, cells: &[&str]) -> Option<&'a str> {
    stdout.lines().find(|l| {
        let words: Vec<&str> = l.split_whitespace().collect();
        words.len() >= cells.len() && words[..cells.len()] == *cells
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_shows_counts_ages_and_leases() {
    let Some(db) = TestDb::new_or_skip().await else {
        return;
    };
    let empty = taskq(Some(url(&db)), &["stats"]).await;
    assert_eq!(empty.code, 0, "{empty:?}");
    assert!(empty.stdout.contains("no tasks"), "{empty:?}");

    for n in 0..3 {
        ping(&db, n).await;
    }
    let run = Pong(1).enqueue(&db.pool).await.unwrap().id;
    Pong(2).enqueue(&db.pool).await.unwrap();
    make_running(&db, run).await;
    make_dead(&db, ping(&db, 9).await).await;

    let out = taskq(Some(url(&db)), &["stats"]).await;
    assert_eq!(out.code, 0, "{out:?}");
    assert!(out.stdout.contains("QUEUE"), "{}", out.stdout);
    assert!(
        row(&out.stdout, &["default", "pending", "3"]).is_some(),
        "{}",
        out.stdout
    );
    assert!(
        row(&out.stdout, &["default", "dead", "1"]).is_some(),
        "{}",
        out.stdout
    );
    assert!(
        row(&out.stdout, &["other", "pending", "1"]).is_some(),
        "{}",
        out.stdout
    );
    let running = row(&out.stdout, &["other", "running", "1"]).expect("running row");
    assert!(
        running.contains(" in ") && !running.contains("EXPIRED"),
        "{running}"
    );

    let json = taskq(Some(url(&db)), &["stats", "--json"]).await;
    assert_eq!(json.code, 0, "{json:?}");
    let v = json.json();
    assert!(v["now"].is_string());
    let counts = v["counts"].as_array().unwrap();
    assert_eq!(counts.len(), 4);
    let find = |q: &str, s: &str| {
        counts
            .iter()
            .find(|c| c["queue"] == q && c["state"] == s)
            .unwrap_or_else(|| panic!("no {q}/{s} in {v}"))
    };
    assert_eq!(find("default", "pending")["count"], 3);
    let age = find("default", "pending")["oldest_pending_age_secs"]
        .as_f64()
        .unwrap();
    assert!((0.0..60.0).contains(&age), "{age}");
    let lease = find("other", "running")["earliest_lease_expires_in_secs"]
        .as_f64()
        .unwrap();
    assert!(lease > 0.0 && lease <= 30.0, "{lease}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_shows_pending_tasks_per_name_so_an_unhandled_one_stands_out() {
    let Some(db) = TestDb::new_or_skip().await else {
        return;
    };
    let u = || Some(url(&db));
    let empty = taskq(u(), &["names"]).await;
    assert_eq!(empty.code, 0, "{empty:?}");
    assert!(empty.stdout.contains("no pending tasks"), "{empty:?}");

    // ping: 3 due, 1 scheduled, 1 running and 1 dead (neither counted).
    for n in 0..3 {
        ping(&db, n).await;
    }
    let later = ping(&db, 3).await;
    exec(
        &db,
        "UPDATE taskq_tasks SET run_at = UTC_TIMESTAMP(6) + INTERVAL 1 HOUR WHERE id = ?",
        later,
    )
    .await;
    make_running(&db, ping(&db, 4).await).await;
    make_dead(&db, ping(&db, 5).await).await;
    Pong(1).enqueue(&db.pool).await.unwrap();
    // Two tasks of a name no worker handles, due for two hours.
    for _ in 0..2 {
        sqlx::query(
            "INSERT INTO taskq_tasks (queue, name, payload, state, max_attempts, run_at, created_at, updated_at)
             VALUES ('default', 'nobody_handles_this', '{}', 'pending', 5,
                     UTC_TIMESTAMP(6) - INTERVAL 2 HOUR, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))",
        )
        .execute(&db.pool)
        .await
        .unwrap();
    }
    // Only scheduled tasks of this name: nothing due yet.
    let scheduled = Pong(2).enqueue(&db.pool).await.unwrap().id;
    exec(
        &db,
        "UPDATE taskq_tasks SET name = 'report', run_at = UTC_TIMESTAMP(6) + INTERVAL 3 HOUR WHERE id = ?",
        scheduled,
    )
    .await;

    let out = taskq(u(), &["names"]).await;
    assert_eq!(out.code, 0, "{out:?}");
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert!(lines[0].starts_with("database clock: "), "{}", out.stdout);
    assert_eq!(
        lines[1].split_whitespace().collect::<Vec<_>>(),
        [
            "QUEUE", "NAME", "PENDING", "DUE", "OLDEST", "DUE", "HANDLED", "BY"
        ],
        "{}",
        out.stdout
    );
    assert_eq!(lines.len(), 6, "{}", out.stdout); // clock, header, 4 rows
    let unhandled = row(&out.stdout, &["default", "nobody_handles_this", "2", "2"])
        .unwrap_or_else(|| panic!("{}", out.stdout));
    assert!(
        unhandled.contains(" 2h0m ") && unhandled.ends_with("NO LIVE WORKER"),
        "{unhandled}"
    );
    assert!(
        out.stderr
            .contains("NO LIVE WORKER: no alive worker works this queue")
    );
    let pings = row(&out.stdout, &["default", "ping", "4", "3"])
        .unwrap_or_else(|| panic!("{}", out.stdout));
    assert!(pings.ends_with("NO LIVE WORKER"), "{pings}"); // seconds old, no worker
    assert!(
        row(&out.stdout, &["other", "pong", "1", "1"]).is_some(),
        "{}",
        out.stdout
    );
    let report = row(&out.stdout, &["other", "report", "1", "0"])
        .unwrap_or_else(|| panic!("{}", out.stdout));
    assert!(
        report.contains("due in 2h5") || report.contains("due in 3h0m"),
        "{report}"
    );

    let other = taskq(u(), &["names", "--queue", "other"]).await;
    assert_eq!(other.code, 0, "{other:?}");
    assert_eq!(other.stdout.lines().count(), 4, "{}", other.stdout);
    assert!(
        row(&other.stdout, &["default"]).is_none(),
        "{}",
        other.stdout
    );

    let json = taskq(u(), &["names", "--json"]).await;
    assert_eq!(json.code, 0, "{json:?}");
    let v = json.json();
    assert!(v["now"].is_string());
    let names = v["names"].as_array().unwrap();
    assert_eq!(names.len(), 4, "{v}");
    let first = &names[0];
    assert_eq!(first["queue"], "default");
    assert_eq!(first["name"], "nobody_handles_this");
    assert_eq!(first["pending"], 2);
    assert_eq!(first["due"], 2);
    assert!(first["oldest_run_at"].is_string());
    let age = first["oldest_due_age_secs"].as_f64().unwrap();
    assert!((7_200.0..7_260.0).contains(&age), "{age}");
    assert_eq!(first["live_workers"], 0);
    let report = names.iter().find(|n| n["name"] == "report").unwrap();
    assert_eq!(report["due"], 0);
    assert!(report.get("oldest_due_age_secs").is_none(), "{report}");

    // A live worker of `default` that registers `ping` (and an older worker's row, with no
    // names recorded, in `other`: taken to register every name) handles those.
    sqlx::query(
        "INSERT INTO taskq_workers (worker_id, host, pid, queues, concurrency, lease_us,
           heartbeat_us, names, started_at, last_seen_at)
         VALUES ('w-ping', 'h', 1, '{\"default\":1}', 1, 30000000, 10000000, '[\"ping\"]',
                 UTC_TIMESTAMP(6), UTC_TIMESTAMP(6)),
                ('w-old', 'h', 2, '{\"other\":1}', 1, 30000000, 10000000, NULL,
                 UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let out = taskq(u(), &["names"]).await;
    let pings = row(&out.stdout, &["default", "ping", "4", "3"]).unwrap();
    assert!(pings.ends_with("1 live worker"), "{pings}");
    let pongs = row(&out.stdout, &["other", "pong", "1", "1"]).unwrap();
    assert!(pongs.ends_with("1 live worker"), "{pongs}");
    let unhandled = row(&out.stdout, &["default", "nobody_handles_this"]).unwrap();
    assert!(unhandled.ends_with("NO LIVE WORKER"), "{unhandled}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_filters_and_pages() {
    let Some(db) = TestDb::new_or_skip().await else {
        return;
    };
    let mut ids = Vec::new();
    for n in 0..4 {
        ids.push(ping(&db, n).await);
    }
    let pong = Pong(1).enqueue(&db.pool).await.unwrap().id;
    make_dead(&db, ids[1]).await;
    let u = || Some(url(&db));

    let all = taskq(u(), &["list"]).await;
    assert_eq!(all.code, 0, "{all:?}");
    assert_eq!(all.stdout.lines().count(), 6, "{}", all.stdout); // header + 5
    assert!(all.stdout.lines().next().unwrap().contains("LAST ERROR"));
    let dead_line = row(
        &all.stdout,
        &[&ids[1].to_string(), "default", "ping", "dead"],
    )
    .unwrap();
    assert!(dead_line.contains("boom: upstream said no"), "{dead_line}");

    let other = taskq(u(), &["list", "--queue", "other"]).await;
    assert_eq!(other.stdout.lines().count(), 2, "{}", other.stdout);
    assert!(row(&other.stdout, &[&pong.to_string(), "other", "pong"]).is_some());

    let ids_of = |out: &Out| -> Vec<u64> {
        out.json()
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["id"].as_u64().unwrap())
            .collect()
    };
    let dead = taskq(u(), &["list", "--state", "dead", "--json"]).await;
    assert_eq!(ids_of(&dead), [ids[1].0]);
    assert_eq!(dead.json()[0]["last_error"], "boom: upstream said no");
    let by_name = taskq(u(), &["--json", "list", "--name", "pong"]).await;
    assert_eq!(ids_of(&by_name), [pong.0]);
    let pending_default = ["list", "--json", "--queue", "default", "--state", "pending"];
    assert_eq!(
        ids_of(&taskq(u(), &pending_default).await),
        [ids[0].0, ids[2].0, ids[3].0]
    );

    let page1 = taskq(u(), &["list", "--json", "--limit", "2"]).await;
    assert_eq!(ids_of(&page1), [ids[0].0, ids[1].0]);
    let page1_table = taskq(u(), &["list", "--limit", "2"]).await;
    assert!(
        page1_table
            .stderr
            .contains(&format!("--after-id {}", ids[1])),
        "{page1_table:?}"
    );
    let after = ids[1].to_string();
    let page2 = taskq(
        u(),
        &["list", "--json", "--limit", "2", "--after-id", &after],
    )
    .await;
    assert_eq!(ids_of(&page2), [ids[2].0, ids[3].0]);
    let none = taskq(u(), &["list", "--name", "nope"]).await;
    assert_eq!(none.code, 0);
    assert!(none.stdout.contains("no matching tasks"));
    assert_eq!(
        taskq(u(), &["list", "--json", "--name", "nope"])
            .await
            .json(),
        serde_json::json!([])
    );

    for bad in [
        &["list", "--state", "sleeping"][..],
        &["list", "--limit", "0"],
        &["list", "--after-id", "x"],
    ] {
        let out = taskq(u(), bad).await;
        assert_eq!(out.code, 2, "{bad:?}: {out:?}");
        assert!(out.stderr.contains("invalid value"), "{out:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_prints_every_field_the_error_and_the_payload() {
    let Some(db) = TestDb::new_or_skip().await else {
        return;
    };
    let id = ping(&db, 7).await;
    make_dead(&db, id).await;
    let out = taskq(Some(url(&db)), &["show", &id.to_string()]).await;
    assert_eq!(out.code, 0, "{out:?}");
    for field in [
        "id:",
        "queue:",
        "name:",
        "state:",
        "priority:",
        "attempt:",
        "snoozes:",
        "run_at:",
        "deadline:",
        "lease_until:",
        "lease_epoch:",
        "worker_id:",
        "idempotency_key:",
        "unique_key:",
        "created_at:",
        "updated_at:",
        "finished_at:",
        "last_error:",
        "payload:",
    ] {
        assert!(
            out.stdout.lines().any(|l| l.starts_with(field)),
            "{field} missing in\n{}",
            out.stdout
        );
    }
    assert!(
        out.stdout.contains("state:           dead"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("attempt:         3 of 20"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout
            .contains("last_error:      boom: upstream said no")
    );
    // Attempt 3 of 20 and no exhausted note: the handler's error was permanent.
    assert!(
        out.stdout
            .contains("state:           dead\ndead:            permanent error\n"),
        "{}",
        out.stdout
    );
    // Pretty-printed payload: one field per line.
    assert!(out.stdout.contains("\n    \"n\": 7,\n"), "{}", out.stdout);
    assert!(out.stdout.contains("\"tag\": \"t7\""), "{}", out.stdout);

    let json = taskq(Some(url(&db)), &["show", "--json", &id.to_string()]).await;
    assert_eq!(json.code, 0, "{json:?}");
    let v = json.json();
    assert_eq!(v["id"], id.0);
    assert_eq!(v["state"], "dead");
    assert_eq!(v["lease_epoch"], 3);
    assert_eq!(v["payload"], serde_json::json!({ "n": 7, "tag": "t7" }));
    assert_eq!(v["dead_reason"], "permanent error");

    let missing = taskq(Some(url(&db)), &["show", "987654321"]).await;
    assert_eq!(missing.code, 3, "{missing:?}");
    assert!(
        missing.stderr.contains("task 987654321 not found"),
        "{missing:?}"
    );
    assert_eq!(taskq(Some(url(&db)), &["show", "abc"]).await.code, 2);
    assert_eq!(taskq(Some(url(&db)), &["show"]).await.code, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_and_retry_of_a_unique_task() {
    let Some(db) = TestDb::new_or_skip().await else {
        return;
    };
    let by_n = Unique::fields(&["n"]).while_running();
    let enqueue = |tag: &str| {
        Ping {
            n: 1,
            tag: tag.into(),
        }
        .with_unique(by_n)
        .enqueue(&db.pool)
    };
    let first = enqueue("a").await.unwrap().id;
    let out = taskq(Some(url(&db)), &["show", &first.to_string()]).await;
    let line = out
        .stdout
        .lines()
        .find(|l| l.starts_with("unique_key:"))
        .unwrap_or_default()
        .to_owned();
    assert!(
        line.ends_with(" (held)") && line.len() > 64,
        "{}",
        out.stdout
    );
    // It dies (freeing its identity, as the worker's write-back does) and a new one takes it.
    make_dead(&db, first).await;
    exec(&db, "DELETE FROM taskq_unique WHERE task_id = ?", first).await;
    let second = enqueue("b").await.unwrap();
    assert!(!second.duplicate);
    let out = taskq(Some(url(&db)), &["retry", &first.to_string()]).await;
    assert_eq!(out.code, 3, "{out:?}");
    assert!(
        out.stderr.contains(&format!(
            "task {first} cannot be retried: its unique identity is held by task {}",
            second.id
        )),
        "{out:?}"
    );
    let out = taskq(Some(url(&db)), &["show", &first.to_string()]).await;
    assert!(out.stdout.contains("(not held)"), "{}", out.stdout);
    assert!(
        out.stdout.contains("state:           dead"),
        "{}",
        out.stdout
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_moves_dead_tasks_back_to_pending() {
    let Some(db) = TestDb::new_or_skip().await else {
        return;
    };
    let client = Client::new(db.pool.clone());
    let u = || Some(url(&db));
    let dead = ping(&db, 1).await;
    make_dead(&db, dead).await;
    let out = taskq(u(), &["retry", &dead.to_string()]).await;
    assert_eq!(out.code, 0, "{out:?}");
    assert!(out.stdout.contains("pending"), "{out:?}");
    let t = client.get(dead).await.unwrap();
    assert_eq!(
        (t.state, t.attempt, t.lease_epoch),
        (TaskState::Pending, 0, 4)
    );
    assert!(t.finished_at.is_none());

    // Not dead any more: wrong state.
    let again = taskq(u(), &["retry", &dead.to_string()]).await;
    assert_eq!(again.code, 3, "{again:?}");
    assert!(
        again.stderr.contains("is pending, expected dead"),
        "{again:?}"
    );
    assert_eq!(taskq(u(), &["retry", "987654321"]).await.code, 3);

    // Bulk, one queue then all.
    let mut default_dead = Vec::new();
    for n in 0..3 {
        let id = ping(&db, n).await;
        make_dead(&db, id).await;
        default_dead.push(id);
    }
    let pong = Pong(1).enqueue(&db.pool).await.unwrap().id;
    make_dead(&db, pong).await;
    let other = taskq(u(), &["retry", "--dead", "--queue", "other"]).await;
    assert_eq!(other.code, 0, "{other:?}");
    assert!(
        other.stdout.contains("retried 1 dead task in queue other"),
        "{other:?}"
    );
    assert_eq!(client.get(pong).await.unwrap().state, TaskState::Pending);
    assert_eq!(db.count("state = 'dead'").await, 3);
    let all = taskq(u(), &["retry", "--dead", "--json"]).await;
    assert_eq!(all.code, 0, "{all:?}");
    assert_eq!(all.json(), serde_json::json!({ "retried": 3 }));
    for id in default_dead {
        let t = client.get(id).await.unwrap();
        assert_eq!(
            (t.state, t.attempt, t.lease_epoch),
            (TaskState::Pending, 0, 4)
        );
    }

    for bad in [
        &["retry"][..],
        &["retry", "1", "--dead"],
        &["retry", "1", "--queue", "q"],
        &["retry", "--queue", "q"],
    ] {
        assert_eq!(taskq(u(), bad).await.code, 2, "{bad:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_pending_now_and_running_by_request() {
    let Some(db) = TestDb::new_or_skip().await else {
        return;
    };
    let client = Client::new(db.pool.clone());
    let pending = ping(&db, 1).await;
    let running = ping(&db, 2).await;
    make_running(&db, running).await;

    let out = taskq(Some(url(&db)), &["cancel", &pending.to_string()]).await;
    assert_eq!(out.code, 0, "{out:?}");
    assert!(out.stdout.contains("canceled"), "{out:?}");
    let t = client.get(pending).await.unwrap();
    assert_eq!(t.state, TaskState::Canceled);
    assert!(t.finished_at.is_some());

    let requested = taskq(Some(url(&db)), &["cancel", &running.to_string()]).await;
    assert_eq!(requested.code, 0, "{requested:?}");
    assert!(
        requested.stdout.contains("running; cancel requested"),
        "{requested:?}"
    );
    assert_eq!(client.get(running).await.unwrap().state, TaskState::Running);
    let again = taskq(Some(url(&db)), &["--json", "cancel", &running.to_string()]).await;
    assert_eq!(
        again.json(),
        serde_json::json!({ "id": running.0, "state": "running", "cancel_requested": true })
    );

    let refused = taskq(Some(url(&db)), &["cancel", &pending.to_string()]).await;
    assert_eq!(refused.code, 3, "{refused:?}");
    assert!(
        refused
            .stderr
            .contains("is canceled, expected pending or running"),
        "{refused:?}"
    );

    let missing = taskq(Some(url(&db)), &["--json", "cancel", "987654321"]).await;
    assert_eq!(missing.code, 3, "{missing:?}");
    assert!(missing.stdout.is_empty());

    let id = ping(&db, 3).await;
    let json = taskq(Some(url(&db)), &["cancel", "--json", &id.to_string()]).await;
    assert_eq!(
        json.json(),
        serde_json::json!({ "id": id.0, "state": "canceled" })
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_deletes_old_terminal_tasks_and_prints_the_count() {
    let Some(db) = TestDb::new_or_skip().await else {
        return;
    };
    let age = |state: &str, days: u32| {
        format!(
            "UPDATE taskq_tasks SET state = '{state}',
               finished_at = UTC_TIMESTAMP(6) - INTERVAL {days} DAY WHERE id = ?"
        )
    };
    let mut ids = Vec::new();
    for (n, (state, days)) in [
        ("succeeded", 10),
        ("succeeded", 9),
        ("dead", 10),
        ("canceled", 8),
        ("succeeded", 2),
        ("running", 30),
    ]
    .into_iter()
    .enumerate()
    {
        let id = ping(&db, n as u32).await;
        exec(&db, &age(state, days), id).await;
        ids.push(id);
    }
    let pending = ping(&db, 99).await;
    let u = || Some(url(&db));

    let dead_only = taskq(u(), &["purge", "--older-than", "7d", "--state", "dead"]).await;
    assert_eq!(dead_only.code, 0, "{dead_only:?}");
    assert!(
        dead_only.stdout.contains("purged 1 dead task"),
        "{dead_only:?}"
    );
    assert_eq!(db.count("state = 'dead'").await, 0);

    let rest = taskq(u(), &["purge", "--older-than", "7d", "--json"]).await;
    assert_eq!(rest.code, 0, "{rest:?}");
    assert_eq!(rest.json(), serde_json::json!({ "purged": 3 }));
    // Left: the recent succeeded task, the running one and the pending one.
    let left: Vec<u64> = sqlx::query_scalar("SELECT id FROM taskq_tasks ORDER BY id")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(left, [ids[4].0, ids[5].0, pending.0]);

    let none = taskq(u(), &["purge", "--older-than", "3d"]).await;
    assert!(none.stdout.contains("purged 0 terminal tasks"), "{none:?}");
    let hours = taskq(u(), &["purge", "--older-than", "36h"]).await;
    assert!(
        hours.stdout.contains("purged 1 terminal task "),
        "{hours:?}"
    );
    assert_eq!(db.count("1 = 1").await, 2);

    for bad in [
        &["purge"][..],
        &["purge", "--older-than", "7"],
        &["purge", "--older-than", "7y"],
        &["purge", "--older-than", "7d", "--state", "pending"],
    ] {
        let out = taskq(u(), bad).await;
        assert_eq!(out.code, 2, "{bad:?}: {out:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_applies_the_schema() {
    let Some(db) = TestDb::empty_or_skip().await else {
        return;
    };
    let out = taskq(Some(url(&db)), &["migrate"]).await;
    assert_eq!(out.code, 0, "{out:?}");
    assert!(out.stdout.contains("migrations applied"), "{out:?}");
    assert_eq!(db.count("1 = 1").await, 0); // the table exists
    let again = taskq(Some(url(&db)), &["migrate", "--json"]).await;
    assert_eq!(again.json(), serde_json::json!({ "migrated": true }));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_url_flag_and_connection_errors() {
    let Some(db) = TestDb::new_or_skip().await else {
        return;
    };
    // --database-url wins over the environment.
    let flag = taskq(
        Some("mysql://root@127.0.0.1:1/x".into()),
        &["--database-url", &url(&db), "stats"],
    )
    .await;
    assert_eq!(flag.code, 0, "{flag:?}");

    let unreachable = taskq(
        None,
        &["--database-url", "mysql://root@127.0.0.1:1/x", "stats"],
    )
    .await;
    assert_eq!(unreachable.code, 4, "{unreachable:?}");
    assert_eq!(
        unreachable.stderr,
        "taskq: error: cannot connect to the database at 127.0.0.1:1 (connection refused): is \
         the server running, and are the host and port in the database URL right?\n",
        "{unreachable:?}"
    );
    assert!(unreachable.stdout.is_empty());
    let env = taskq(Some("mysql://root@127.0.0.1:1/x".into()), &["list"]).await;
    assert_eq!(env.code, 4, "{env:?}");

    let missing = taskq(None, &["stats"]).await;
    assert_eq!(missing.code, 2, "{missing:?}");
    // One line in the documented form, no usage text.
    assert_eq!(
        missing.stderr,
        "taskq: error: no database: set DATABASE_URL or pass --database-url \
         mysql://user:password@host:3306/database (or sqlite://path/to/app.db)\n",
        "{missing:?}"
    );
    assert!(missing.stdout.is_empty());
    let bad_url = taskq(Some("postgres://nope".into()), &["stats"]).await;
    assert_eq!(bad_url.code, 2, "{bad_url:?}");
    assert!(
        bad_url.stderr.contains("invalid database URL"),
        "{bad_url:?}"
    );

    assert_eq!(taskq(None, &["frobnicate"]).await.code, 2);
    assert_eq!(taskq(None, &[]).await.code, 2);
    let help = taskq(None, &["--help"]).await;
    assert_eq!(help.code, 0);
    for cmd in [
        "migrate",
        "stats",
        "names",
        "list",
        "show",
        "retry",
        "cancel",
        "reschedule",
        "priority",
        "purge",
        "schedules",
    ] {
        assert!(help.stdout.contains(cmd), "{cmd} missing in help");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_and_resume_a_queue() {
    let Some(db) = TestDb::new_or_skip().await else {
        return;
    };
    let client = Client::new(db.pool.clone());
    let out = taskq(Some(url(&db)), &["pause", "mail"]).await;
    assert_eq!(out.code, 0, "{out:?}");
    assert!(out.stdout.contains("queue mail: paused"), "{out:?}");
    assert_eq!(client.paused_queues().await.unwrap()[0].0, "mail");
    let listed = taskq(Some(url(&db)), &["paused", "--json"]).await;
    assert_eq!(listed.json()[0]["queue"], "mail");
    let out = taskq(Some(url(&db)), &["resume", "mail"]).await;
    assert!(out.stdout.contains("queue mail: running"), "{out:?}");
    assert!(client.paused_queues().await.unwrap().is_empty());
    let again = taskq(Some(url(&db)), &["resume", "mail", "--json"]).await;
    assert_eq!(again.json()["changed"], false);
    let bad = taskq(Some(url(&db)), &["pause", ""]).await;
    assert_eq!(bad.code, 2, "{bad:?}");
    assert!(bad.stderr.contains("invalid queue"), "{bad:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limit_rate_limit_and_queues() {
    let Some(db) = TestDb::new_or_skip().await else {
        return;
    };
    let client = Client::new(db.pool.clone());
    ping(&db, 1).await;
    let running = ping(&db, 2).await;
    make_running(&db, running).await;
    let out = taskq(Some(url(&db)), &["limit", "default", "3"]).await;
    assert_eq!(out.code, 0, "{out:?}");
    assert!(
        out.stdout
            .contains("queue default: at most 3 running at once"),
        "{out:?}"
    );
    let out = taskq(Some(url(&db)), &["rate-limit", "default", "10/1m"]).await;
    assert_eq!(out.code, 0, "{out:?}");
    assert!(out.stdout.contains("at most 10 starts per 1m"), "{out:?}");
    let out = taskq(Some(url(&db)), &["pause", "mail"]).await;
    assert_eq!(out.code, 0, "{out:?}");
    let info = client.queues().await.unwrap();
    let default = info.iter().find(|q| q.queue == "default").unwrap();
    assert_eq!(default.concurrency_limit, Some(3));
    assert_eq!(
        default.rate_limit.map(|r| (r.max, r.period.as_secs())),
        Some((10, 60))
    );
    assert_eq!((default.pending, default.running), (1, 1));

    let table = taskq(Some(url(&db)), &["queues"]).await;
    assert_eq!(table.code, 0, "{table:?}");
    assert!(
        row(
            &table.stdout,
            &["default", "active", "3", "10/1m", "(0", "used)", "1/3", "1"]
        )
        .is_some(),
        "{table:?}"
    );
    assert!(
        row(&table.stdout, &["mail", "paused", "since"]).is_some(),
        "{table:?}"
    );
    let json = taskq(Some(url(&db)), &["queues", "--json"]).await.json();
    let default = json
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["queue"] == "default")
        .unwrap()
        .clone();
    assert_eq!(default["concurrency_limit"], 3);
    assert_eq!(default["rate_limit"]["max"], 10);
    assert_eq!(default["rate_limit"]["period_ms"], 60_000);
    assert_eq!(default["running"], 1);

    let out = taskq(Some(url(&db)), &["limit", "default", "--clear"]).await;
    assert_eq!(out.code, 0, "{out:?}");
    assert!(out.stdout.contains("no concurrency limit"), "{out:?}");
    let out = taskq(
        Some(url(&db)),
        &["rate-limit", "default", "--clear", "--json"],
    )
    .await;
    assert_eq!(out.json()["rate_limit"], serde_json::Value::Null);
    let info = client.queues().await.unwrap();
    let default = info.iter().find(|q| q.queue == "default").unwrap();
    assert_eq!(
        (default.concurrency_limit, default.rate_limit),
        (None, None)
    );

    // Bad input: exit code 2, nothing written.
    for args in [
        &["limit", "default", "0"][..],
        &["limit", "default"],
        &["limit", "default", "3", "--clear"],
        &["rate-limit", "default", "0/1m"],
        &["rate-limit", "default", "10"],
        &["rate-limit", "default", "10/0s"],
    ] {
        let bad = taskq(Some(url(&db)), args).await;
        assert_eq!(bad.code, 2, "{args:?}: {bad:?}");
    }
    let info = client.queues().await.unwrap();
    let default = info.iter().find(|q| q.queue == "default").unwrap();
    assert_eq!(
        (default.concurrency_limit, default.rate_limit),
        (None, None)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_without_taskq_tables_is_reported_once_with_the_fix() {
    let Some(db) = TestDb::empty_or_skip().await else {
        return;
    };
    for args in [
        &["show", "1"][..],
        &["stats"],
        &["list"],
        &["retry", "--dead"],
    ] {
        let out = taskq(Some(url(&db)), args).await;
        assert_eq!(out.code, 1, "{args:?}: {out:?}");
        assert!(out.stdout.is_empty(), "{args:?}: {out:?}");
        assert_eq!(out.stderr.lines().count(), 1, "{args:?}: {out:?}");
        assert!(
            out.stderr
                .starts_with("taskq: error: database error: 1146 (42S02): Table '"),
            "{args:?}: {out:?}"
        );
        assert_eq!(
            out.stderr.matches("doesn't exist").count(),
            1,
            "{args:?}: {out:?}"
        );
        assert!(
            out.stderr.ends_with(
                "(taskq's tables are missing: run taskq::migrate(&pool) at start-up, or `taskq \
                 migrate`)\n"
            ),
            "{args:?}: {out:?}"
        );
    }
    let unknown_db = taskq(
        Some(format!(
            "{}/taskq_no_such_database",
            taskq_tests::server_url()
        )),
        &["stats"],
    )
    .await;
    assert_eq!(unknown_db.code, 4, "{unknown_db:?}");
    assert!(
        unknown_db.stderr.contains(
            "(1049 (42000): Unknown database 'taskq_no_such_database'): create it (CREATE \
             DATABASE), or fix the database name at the end of the URL"
        ),
        "{unknown_db:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_says_why_a_dead_task_died() {
    let Some(db) = TestDb::new_or_skip().await else {
        return;
    };
    let dead = |attempt: u32, max: u32, error: &str| {
        let sql = format!(
            "UPDATE taskq_tasks SET state = 'dead', attempt = {attempt}, max_attempts = {max},
               last_error = '{error}', finished_at = UTC_TIMESTAMP(6) WHERE id = ?"
        );
        let db = &db;
        async move {
            let id = ping(db, attempt).await;
            exec(db, &sql, id).await;
            id
        }
    };
    for (id, line) in [
        (
            dead(5, 5, "HTTP 503 (attempts exhausted: 5/5)").await,
            "dead:            attempts exhausted (5/5)",
        ),
        (
            dead(5, 5, "order 7 does not exist").await,
            "dead:            permanent error",
        ),
        (
            dead(1, 5, "payload does not decode as Ping: missing field `tag`").await,
            "dead:            payload does not decode",
        ),
        (
            dead(3, 3, "lease expired (worker w-1, attempt 3)").await,
            "dead:            attempts exhausted (3/3)",
        ),
    ] {
        let out = taskq(Some(url(&db)), &["show", &id.to_string()]).await;
        assert_eq!(out.code, 0, "{out:?}");
        assert!(
            out.stdout.lines().any(|l| l == line),
            "{line:?} missing in\n{}",
            out.stdout
        );
    }
    // Only dead tasks get the line.
    let pending = ping(&db, 1).await;
    let out = taskq(Some(url(&db)), &["show", &pending.to_string()]).await;
    assert!(!out.stdout.contains("dead:"), "{}", out.stdout);
    let json = taskq(Some(url(&db)), &["show", "--json", &pending.to_string()]).await;
    assert_eq!(json.json().get("dead_reason"), None);
}

/// `taskq schedules`: a schedule declared by a real worker shows its expression, time zone and
/// next tick (ahead); the row a removed schedule left behind shows as overdue and can be
/// deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_lists_next_ticks_and_overdue_ones() {
    let Some(db) = TestDb::new_or_skip().await else {
        return;
    };
    let client = Client::new(db.pool.clone());
    let empty = taskq(Some(url(&db)), &["schedules"]).await;
    assert_eq!(empty.code, 0, "{empty:?}");
    assert!(empty.stdout.contains("no schedules"), "{empty:?}");

    let ping = Ping {
        n: 1,
        tag: "hourly".into(),
    };
    let w = taskq_tests::RunningWorker::spawn(
        taskq_tests::fast_worker(&db.pool).schedule(
            Schedule::new("0 * * * *", ping)
                .name("hourly_ping")
                .timezone("Europe/Paris"),
        ),
    );
    taskq_tests::wait_until(
        std::time::Duration::from_secs(10),
        "the schedule is declared",
        || async { client.schedules().await.unwrap().len() == 1 },
    )
    .await;
    w.stop().await;
    sqlx::query(
        "INSERT INTO taskq_schedules (name, task_name, queue, expression, timezone,
           missed_ticks, watermark, last_tick, last_worker_id, next_tick, declared_at,
           created_at, updated_at)
         VALUES ('retired', 'pong', 'other', '*/5 * * * *', 'UTC', 'skip',
           UTC_TIMESTAMP() - INTERVAL 1 DAY, UTC_TIMESTAMP() - INTERVAL 1 DAY, 'w-old',
           UTC_TIMESTAMP() - INTERVAL 1 DAY + INTERVAL 5 MINUTE, UTC_TIMESTAMP() - INTERVAL 2 DAY,
           UTC_TIMESTAMP() - INTERVAL 2 DAY, UTC_TIMESTAMP() - INTERVAL 1 DAY)",
    )
    .execute(&db.pool)
    .await
    .unwrap();

    let out = taskq(Some(url(&db)), &["schedules"]).await;
    assert_eq!(out.code, 0, "{out:?}");
    for header in [
        "NAME",
        "QUEUE",
        "TASK",
        "EXPRESSION",
        "TIMEZONE",
        "LAST TICK",
        "NEXT TICK",
    ] {
        assert!(out.stdout.contains(header), "{header}: {}", out.stdout);
    }
    let hourly = row(
        &out.stdout,
        &[
            "hourly_ping",
            "default",
            "ping",
            "0",
            "*",
            "*",
            "*",
            "*",
            "Europe/Paris",
            "latest",
        ],
    )
    .unwrap_or_else(|| panic!("{}", out.stdout));
    assert!(hourly.contains("(in "), "{hourly}");
    let retired = row(&out.stdout, &["retired", "other", "pong", "*/5"])
        .unwrap_or_else(|| panic!("{}", out.stdout));
    assert!(retired.contains("OVERDUE"), "{retired}");
    assert!(
        out.stderr.contains("taskq schedules delete NAME"),
        "{out:?}"
    );

    let json = taskq(Some(url(&db)), &["schedules", "--json"]).await.json();
    let list = json["schedules"].as_array().unwrap();
    assert_eq!(list.len(), 2, "{json}");
    assert_eq!(
        (
            &list[0]["name"],
            &list[0]["expression"],
            &list[0]["timezone"],
            &list[0]["overdue"]
        ),
        (
            &serde_json::json!("hourly_ping"),
            &serde_json::json!("0 * * * *"),
            &serde_json::json!("Europe/Paris"),
            &serde_json::json!(false)
        )
    );
    let next_in = list[0]["next_tick_in_secs"].as_f64().unwrap();
    assert!(next_in > 0.0 && next_in <= 3600.0, "{json}");
    let next: chrono::DateTime<chrono::Utc> =
        serde_json::from_value(list[0]["next_tick"].clone()).unwrap();
    assert_eq!(next.timestamp() % 3600, 0, "the next full hour: {next}");
    assert_eq!(list[1]["name"], "retired");
    assert_eq!(list[1]["overdue"], true);
    assert_eq!(list[1]["last_worker_id"], "w-old");

    let del = taskq(Some(url(&db)), &["schedules", "delete", "retired"]).await;
    assert_eq!(del.code, 0, "{del:?}");
    assert!(del.stdout.contains("schedule retired: deleted"), "{del:?}");
    let again = taskq(Some(url(&db)), &["schedules", "delete", "retired"]).await;
    assert_eq!(again.code, 3, "{again:?}");
    assert!(
        again.stderr.contains("no schedule named \"retired\""),
        "{again:?}"
    );
    let names: Vec<String> = client
        .schedules()
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(names, ["hourly_ping"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reschedule_and_priority_of_a_pending_task() {
    let Some(db) = TestDb::new_or_skip().await else {
        return;
    };
    let client = Client::new(db.pool.clone());
    let id = ping(&db, 1).await;
    let sid = id.to_string();
    let u = || Some(url(&db));

    let out = taskq(u(), &["reschedule", &sid, "--in", "10m"]).await;
    assert_eq!(out.code, 0, "{out:?}");
    assert!(
        out.stdout.starts_with(&format!("task {id}: due at ")),
        "{out:?}"
    );
    let now = client.db_now().await.unwrap();
    let ahead = (client.get(id).await.unwrap().run_at - now).num_seconds();
    assert!((595..=600).contains(&ahead), "{ahead}");

    let out = taskq(
        u(),
        &[
            "--json",
            "reschedule",
            &sid,
            "--at",
            "2031-05-06T09:08:09+02:00",
        ],
    )
    .await;
    assert_eq!(out.code, 0, "{out:?}");
    let v = out.json();
    assert_eq!(
        (v["id"].as_u64(), &v["state"]),
        (Some(id.0), &serde_json::json!("pending"))
    );
    assert_eq!(v["run_at"], "2031-05-06T07:08:09Z");
    assert_eq!(
        client.get(id).await.unwrap().run_at.to_rfc3339(),
        "2031-05-06T07:08:09+00:00"
    );
    let out = taskq(u(), &["reschedule", &sid, "--in", "0s"]).await;
    assert_eq!(out.code, 0, "{out:?}");
    assert!(client.get(id).await.unwrap().run_at <= client.db_now().await.unwrap());

    let out = taskq(u(), &["priority", &sid, "-5"]).await;
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(out.stdout.trim(), format!("task {id}: priority -5"));
    let out = taskq(u(), &["priority", "--json", &sid, "12"]).await;
    assert_eq!(
        out.json(),
        serde_json::json!({ "id": id.0, "priority": 12 })
    );
    assert_eq!(client.get(id).await.unwrap().priority, 12);

    // Bad input: exit 2, nothing changed.
    let before = client.get(id).await.unwrap();
    for bad in [
        &["reschedule", &sid][..],
        &[
            "reschedule",
            &sid,
            "--in",
            "1m",
            "--at",
            "2031-05-06T07:08:09Z",
        ],
        &["reschedule", &sid, "--in", "7"],
        &["reschedule", &sid, "--at", "tomorrow"],
        &["reschedule", &sid, "--in", "600w"], // beyond 10 years
        &["reschedule", &sid, "--at", "2999-01-01T00:00:00Z"],
        &["priority", &sid, "40000"],
        &["priority", &sid],
    ] {
        let out = taskq(u(), bad).await;
        assert_eq!(out.code, 2, "{bad:?}: {out:?}");
        assert!(out.stdout.is_empty(), "{bad:?}: {out:?}");
    }
    let after = client.get(id).await.unwrap();
    assert_eq!(
        (after.run_at, after.priority),
        (before.run_at, before.priority)
    );

    // Not pending, or unknown: exit 3.
    let running = ping(&db, 2).await;
    make_running(&db, running).await;
    for args in [
        &["reschedule", &running.to_string(), "--in", "1m"][..],
        &["priority", &running.to_string(), "1"],
    ] {
        let out = taskq(u(), args).await;
        assert_eq!(out.code, 3, "{out:?}");
        assert!(
            out.stderr.contains("is running, expected pending"),
            "{out:?}"
        );
    }
    let missing = taskq(u(), &["priority", "987654321", "1"]).await;
    assert_eq!(missing.code, 3, "{missing:?}");
    assert!(missing.stderr.contains("not found"), "{missing:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_and_snoozed_tasks_are_visible() {
    let Some(db) = TestDb::new_or_skip().await else {
        return;
    };
    let expired = ping(&db, 1).await;
    exec(
        &db,
        "UPDATE taskq_tasks SET state = 'expired', snoozes = 3,
           deadline = UTC_TIMESTAMP(6) - INTERVAL 1 HOUR,
           finished_at = UTC_TIMESTAMP(6) - INTERVAL 30 MINUTE WHERE id = ?",
        expired,
    )
    .await;
    let pending = ping(&db, 2).await;
    let u = || Some(url(&db));

    let list = taskq(u(), &["list", "--state", "expired"]).await;
    assert_eq!(list.code, 0, "{list:?}");
    assert!(
        list.stdout.lines().next().unwrap().contains("SNOOZES"),
        "{list:?}"
    );
    assert!(
        row(
            &list.stdout,
            &[
                &expired.to_string(),
                "default",
                "ping",
                "expired",
                "0/20",
                "3"
            ]
        )
        .is_some(),
        "{}",
        list.stdout
    );
    assert_eq!(list.stdout.lines().count(), 2, "{}", list.stdout);

    let show = taskq(u(), &["show", &expired.to_string()]).await;
    assert!(
        show.stdout.contains("state:           expired"),
        "{}",
        show.stdout
    );
    assert!(
        show.stdout.contains("snoozes:         3"),
        "{}",
        show.stdout
    );
    let deadline = show
        .stdout
        .lines()
        .find(|l| l.starts_with("deadline:"))
        .unwrap();
    assert!(deadline.ends_with('Z'), "{deadline}");
    let none = taskq(u(), &["show", &pending.to_string()]).await;
    assert!(
        none.stdout.contains("deadline:        -"),
        "{}",
        none.stdout
    );
    let json = taskq(u(), &["show", "--json", &expired.to_string()])
        .await
        .json();
    assert_eq!(
        (json["state"].as_str(), json["snoozes"].as_u64()),
        (Some("expired"), Some(3))
    );
    assert!(json["deadline"].is_string(), "{json}");

    let stats = taskq(u(), &["stats"]).await;
    assert!(
        row(&stats.stdout, &["default", "expired", "1"]).is_some(),
        "{}",
        stats.stdout
    );

    let purge = taskq(u(), &["purge", "--older-than", "10m", "--state", "expired"]).await;
    assert_eq!(purge.code, 0, "{purge:?}");
    assert!(purge.stdout.contains("purged 1 expired task"), "{purge:?}");
    assert_eq!(db.count("1 = 1").await, 1);
}

/// `taskq workers`: the live workers with their queues and running tasks; `--all` adds the
/// stopped and gone ones; `--json` gives every field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_lists_live_workers_with_their_running_tasks() {
    let Some(db) = TestDb::new_or_skip().await else {
        return;
    };
    let empty = taskq(Some(url(&db)), &["workers"]).await;
    assert_eq!(empty.code, 0, "{empty:?}");
    assert!(empty.stdout.contains("no live workers"), "{empty:?}");

    let add = |id: &'static str, seen_ago_secs: u32, stopped: bool| {
        let pool = db.pool.clone();
        async move {
            sqlx::query(
                "INSERT INTO taskq_workers (worker_id, host, pid, queues, concurrency, lease_us,
                   heartbeat_us, started_at, last_seen_at, stopped_at)
                 VALUES (?, 'box-1', 4242, '{\"default\":4,\"mail\":2}', 6, 30000000, 10000000,
                   UTC_TIMESTAMP(6) - INTERVAL 3600 SECOND,
                   UTC_TIMESTAMP(6) - INTERVAL ? SECOND,
                   IF(?, UTC_TIMESTAMP(6) - INTERVAL ? SECOND, NULL))",
            )
            .bind(id)
            .bind(seen_ago_secs)
            .bind(stopped)
            .bind(seen_ago_secs)
            .execute(&pool)
            .await
            .unwrap();
        }
    };
    add("w-1", 2, false).await;
    // Heartbeat 10 s, lease 30 s: seen 25 s ago is two beats missed, within the lease.
    add("w-lost", 25, false).await;
    add("w-gone", 300, false).await;
    add("w-stopped", 60, true).await;
    for n in 0..3 {
        let id = ping(&db, n).await;
        make_running(&db, id).await; // worker_id = 'w-1'
    }

    let out = taskq(Some(url(&db)), &["workers"]).await;
    assert_eq!(out.code, 0, "{out:?}");
    let line = row(
        &out.stdout,
        &["w-1", "box-1", "4242", "default:4,mail:2", "3/6"],
    )
    .unwrap_or_else(|| panic!("{}", out.stdout));
    assert!(line.ends_with("alive"), "{line}");
    assert!(
        line.contains(" 2.0s ago ") || line.contains(" 2.1s ago "),
        "{line}"
    );
    // Not stopped but not beating: LOST, listed by default, with its last beat's age.
    let lost = row(&out.stdout, &["w-lost", "box-1", "4242"]).unwrap();
    assert!(
        lost.contains(" 25s ago ") && lost.ends_with("LOST"),
        "{lost}"
    );
    let gone = row(&out.stdout, &["w-gone", "box-1", "4242"]).unwrap();
    assert!(gone.contains("5m") && gone.ends_with("LOST"), "{gone}");
    assert!(!out.stdout.contains("w-stopped"), "{}", out.stdout);
    assert!(
        out.stderr
            .contains("LOST: no heartbeat for two of its heartbeat intervals"),
        "{out:?}"
    );

    let all = taskq(Some(url(&db)), &["workers", "--all"]).await;
    assert_eq!(all.code, 0, "{all:?}");
    let stopped = row(&all.stdout, &["w-stopped"]).unwrap();
    assert!(stopped.contains("stopped 1m"), "{stopped}");

    let json = taskq(Some(url(&db)), &["workers", "--all", "--json"])
        .await
        .json();
    let list = json["workers"].as_array().unwrap();
    assert_eq!(list.len(), 4, "{json}");
    let w1 = list.iter().find(|w| w["id"] == "w-1").unwrap();
    assert_eq!(w1["host"], "box-1");
    assert_eq!(w1["pid"], 4242);
    assert_eq!(w1["queues"], serde_json::json!({"default": 4, "mail": 2}));
    assert_eq!(w1["concurrency"], 6);
    assert_eq!(w1["running"], 3);
    assert_eq!(w1["alive"], true);
    assert_eq!(w1["status"], "alive");
    assert!(w1["names"].is_null(), "a row without names: {w1}");
    assert_eq!(w1["lease_ms"], 30000);
    assert_eq!(w1["heartbeat_ms"], 10000);
    assert!(w1["stopped_at"].is_null());
    let ago = w1["last_seen_secs_ago"].as_f64().unwrap();
    assert!((1.5..30.0).contains(&ago), "{ago}");
    assert!(w1["uptime_secs"].as_f64().unwrap() >= 3599.0);
    let lost = list.iter().find(|w| w["id"] == "w-lost").unwrap();
    assert_eq!(lost["alive"], false);
    assert_eq!(lost["status"], "lost");
    let ago = lost["last_seen_ago_ms"].as_u64().unwrap();
    assert!((25_000..30_000).contains(&ago), "{lost}");
    let gone = list.iter().find(|w| w["id"] == "w-gone").unwrap();
    assert_eq!(gone["status"], "lost");
    assert_eq!(gone["running"], 0);
    let stopped = list.iter().find(|w| w["id"] == "w-stopped").unwrap();
    assert_eq!(stopped["alive"], false);
    assert_eq!(stopped["status"], "stopped");
    assert!(stopped["stopped_at"].is_string());
    let not_stopped = taskq(Some(url(&db)), &["workers", "--json"]).await.json();
    assert_eq!(not_stopped["workers"].as_array().unwrap().len(), 3);

    // A task held by the lost worker says so in `show`; one held by the live worker too.
    let held = ping(&db, 40).await;
    exec(
        &db,
        "UPDATE taskq_tasks SET state = 'running', attempt = 1, lease_epoch = 1,
           worker_id = 'w-lost', lease_until = UTC_TIMESTAMP(6) + INTERVAL 5 SECOND WHERE id = ?",
        held,
    )
    .await;
    let show = taskq(Some(url(&db)), &["show", &held.to_string()]).await;
    assert_eq!(show.code, 0, "{show:?}");
    let line = show
        .stdout
        .lines()
        .find(|l| l.starts_with("worker: "))
        .unwrap_or_else(|| panic!("{}", show.stdout));
    assert!(
        line.contains(
            "LOST: worker lost, no heartbeat for 25s (heartbeat every 10s); its lease ends in"
        ),
        "{line}"
    );
    let json = taskq(Some(url(&db)), &["show", "--json", &held.to_string()])
        .await
        .json();
    assert_eq!(json["worker_status"], "lost");
    let alive = ping(&db, 41).await;
    make_running(&db, alive).await; // worker_id = 'w-1'
    let show = taskq(Some(url(&db)), &["show", &alive.to_string()]).await;
    assert!(
        show.stdout
            .contains("\nworker:          alive (last beat 2."),
        "{}",
        show.stdout
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_cancel_and_retry_by_filter_with_dry_runs() {
    let Some(db) = TestDb::new_or_skip().await else {
        return;
    };
    let client = Client::new(db.pool.clone());
    let u = || Some(url(&db));
    let pending: Vec<TaskId> = [ping(&db, 1).await, ping(&db, 2).await].into();
    let running = ping(&db, 3).await;
    make_running(&db, running).await;
    let pong = Pong(1).enqueue(&db.pool).await.unwrap().id;
    exec(
        &db,
        "UPDATE taskq_tasks SET created_at = UTC_TIMESTAMP(6) - INTERVAL 2 HOUR WHERE id = ?",
        pending[0],
    )
    .await;

    let dry = taskq(u(), &["cancel", "--name", "ping", "--dry-run"]).await;
    assert_eq!(dry.code, 0, "{dry:?}");
    assert!(
        dry.stdout.contains(
            "dry run: would cancel 2 pending tasks and request the cancel of 1 running task"
        ),
        "{dry:?}"
    );
    assert_eq!(
        db.count("state = 'pending'").await,
        3,
        "a dry run changes nothing"
    );
    let old = taskq(
        u(),
        &[
            "--json",
            "cancel",
            "--state",
            "pending",
            "--older-than",
            "1h",
        ],
    )
    .await;
    assert_eq!(
        old.json(),
        serde_json::json!({ "canceled": 1, "cancel_requested": 0, "dry_run": false })
    );
    assert_eq!(
        client.get(pending[0]).await.unwrap().state,
        TaskState::Canceled
    );
    let by_name = taskq(u(), &["cancel", "--name", "ping"]).await;
    assert!(
        by_name
            .stdout
            .contains("canceled 1 pending task; requested the cancel of 1 running task"),
        "{by_name:?}"
    );
    assert_eq!(
        client.get(pending[1]).await.unwrap().state,
        TaskState::Canceled
    );
    assert_eq!(client.get(running).await.unwrap().state, TaskState::Running);
    assert_eq!(client.get(pong).await.unwrap().state, TaskState::Pending);
    for bad in [
        &["cancel"][..],
        &["cancel", "1", "--queue", "q"],
        &["cancel", "--state", "dead"],
        &["cancel", "--dry-run"],
    ] {
        assert_eq!(taskq(u(), bad).await.code, 2, "{bad:?}");
    }

    // Retry by filter.
    make_dead(&db, pong).await;
    for &id in &pending {
        make_dead(&db, id).await;
    }
    let dry = taskq(u(), &["retry", "--dead", "--name", "ping", "--dry-run"]).await;
    assert!(
        dry.stdout.contains("dry run: would retry 2 dead tasks"),
        "{dry:?}"
    );
    assert_eq!(db.count("state = 'dead'").await, 3);
    let old = taskq(u(), &["--json", "retry", "--dead", "--older-than", "1h"]).await;
    assert_eq!(
        old.json(),
        serde_json::json!({ "retried": 1, "dry_run": false })
    );
    assert_eq!(
        client.get(pending[0]).await.unwrap().state,
        TaskState::Pending
    );
    let named = taskq(u(), &["retry", "--dead", "--name", "pong"]).await;
    assert!(named.stdout.contains("retried 1 dead task"), "{named:?}");
    assert_eq!(client.get(pong).await.unwrap().state, TaskState::Pending);
    assert_eq!(db.count("state = 'dead'").await, 1);
    assert_eq!(taskq(u(), &["retry", "--name", "ping"]).await.code, 2);
}

#[tokio::test]
async fn web_serves_the_dashboard_and_refuses_to_start_without_credentials() {
    let Some(db) = TestDb::new_or_skip().await else {
        return;
    };
    let no_auth = taskq(Some(url(&db)), &["web", "--listen", "127.0.0.1:0"]).await;
    assert_eq!(no_auth.code, 2, "{no_auth:?}");
    assert!(
        no_auth.stderr.contains("insecure_no_auth"),
        "{}",
        no_auth.stderr
    );
    let bad_basic = taskq(Some(url(&db)), &["web", "--basic", "nocolon"]).await;
    assert_eq!(bad_basic.code, 2, "{bad_basic:?}");
    // No authentication on an address others reach: refused, unless asked for twice, and
    // then only with the host names to answer.
    let public = ["web", "--listen", "0.0.0.0:0", "--insecure-no-auth"];
    let refused = taskq(Some(url(&db)), &public).await;
    assert_eq!(refused.code, 2, "{refused:?}");
    assert!(
        refused.stderr.contains("--allow-public-no-auth"),
        "{}",
        refused.stderr
    );
    let twice = [&public[..], &["--allow-public-no-auth"]].concat();
    let no_hosts = taskq(Some(url(&db)), &twice).await;
    assert_eq!(no_hosts.code, 2, "{no_hosts:?}");
    assert!(
        no_hosts.stderr.contains("--allowed-host"),
        "{}",
        no_hosts.stderr
    );

    ping(&db, 1).await;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_taskq"))
        .args([
            "web",
            "--listen",
            "127.0.0.1:0",
            "--prefix",
            "/ops",
            "--read-only",
        ])
        .env("DATABASE_URL", url(&db))
        .env("TASKQ_WEB_TOKEN", "cli-token-123")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let line = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line).unwrap();
        line
    })
    .await
    .unwrap();
    let addr = line
        .trim()
        .strip_prefix("taskq web: serving the dashboard at http://")
        .and_then(|rest| rest.strip_suffix("/ops"))
        .unwrap_or_else(|| panic!("unexpected first line: {line}"))
        .to_owned();
    let get_as = |host: String, path: &'static str, auth: &'static str| {
        let addr = addr.clone();
        async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
            let req = format!(
                "{path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: {auth}\r\nContent-Type: application/json\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            );
            s.write_all(req.as_bytes()).await.unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).await.unwrap();
            out
        }
    };
    let get = |path: &'static str, auth: &'static str| get_as(addr.clone(), path, auth);
    // Only the listen address's names are answered (DNS rebinding).
    let port = addr.rsplit(':').next().unwrap().to_owned();
    let rebound = get_as(
        format!("evil.example:{port}"),
        "GET /ops/api/v1/queues",
        "Bearer cli-token-123",
    )
    .await;
    assert!(rebound.starts_with("HTTP/1.1 421"), "{rebound}");
    let local = get_as(
        format!("localhost:{port}"),
        "GET /ops/api/v1/queues",
        "Bearer cli-token-123",
    )
    .await;
    assert!(local.starts_with("HTTP/1.1 200"), "{local}");
    let stats = get("GET /ops/api/v1/queues", "Bearer cli-token-123").await;
    assert!(stats.starts_with("HTTP/1.1 200"), "{stats}");
    assert!(stats.contains("\"queue\":\"default\""), "{stats}");
    let refused = get("GET /ops/api/v1/queues", "Bearer wrong-token").await;
    assert!(refused.starts_with("HTTP/1.1 401"), "{refused}");
    let read_only = get(
        "POST /ops/api/v1/queues/default/pause",
        "Bearer cli-token-123",
    )
    .await;
    assert!(read_only.starts_with("HTTP/1.1 403"), "{read_only}");
    let page = get("GET /ops", "Bearer cli-token-123").await;
    assert!(
        page.starts_with("HTTP/1.1 200") && page.contains("./ops/tasks"),
        "{page}"
    );
    child.kill().unwrap();
    child.wait().unwrap();
}

/// `taskq show` prints the attempt history as a table (and in `--json`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_prints_the_attempts() {
    let Some(db) = TestDb::new_or_skip().await else {
        return;
    };
    let id = ping(&db, 1).await;
    let none = taskq(Some(url(&db)), &["show", &id.to_string()]).await;
    assert!(
        none.stdout.contains("attempts:        none ended yet"),
        "{none:?}"
    );
    make_dead(&db, id).await;
    exec(
        &db,
        r#"UPDATE taskq_tasks SET attempts = '[
          {"attempt": 1, "epoch": 1, "worker": "w-1", "started_at": "2025-01-02 03:04:05.000000",
           "finished_at": "2025-01-02 03:04:07.500000", "outcome": "timed_out", "error": "timed out after 2s"},
          {"attempt": 2, "epoch": 2, "worker": "w-2", "started_at": "2025-01-02 03:05:00.000000",
           "finished_at": "2025-01-02 03:05:30.000000", "outcome": "lease_lost",
           "error": "lease expired (worker w-2, attempt 2)"},
          {"attempt": 3, "epoch": 3, "worker": "w-1", "started_at": "2025-01-02 03:06:00.000000",
           "finished_at": "2025-01-02 03:06:00.250000", "outcome": "failed", "error": "boom\\nsecond line"}
        ]' WHERE id = ?"#,
        id,
    )
    .await;
    let out = taskq(Some(url(&db)), &["show", &id.to_string()]).await;
    assert_eq!(out.code, 0, "{out:?}");
    let table = out
        .stdout
        .split("attempts:\n")
        .nth(1)
        .expect("attempts table");
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "#", "EPOCH", "WORKER", "STARTED", "FINISHED", "TOOK", "OUTCOME", "ERROR"
        ]
    );
    let words = |cells: &[&str]| -> Vec<String> {
        let line = row(table, cells).unwrap_or_else(|| panic!("{cells:?} in\n{table}"));
        line.split_whitespace().map(str::to_owned).collect()
    };
    assert_eq!(
        words(&["1", "1", "w-1"])[3..],
        [
            "2025-01-02",
            "03:04:05.000Z",
            "2025-01-02",
            "03:04:07.500Z",
            "2.5s",
            "timed_out",
            "timed",
            "out",
            "after",
            "2s"
        ]
    );
    let second = words(&["2", "2", "w-2"]);
    assert_eq!(second[7..10], ["30s", "lease_lost", "lease"]);
    assert_eq!(
        second.join(" ").rsplit_once("lease_lost ").unwrap().1,
        "lease expired (worker w-2, attempt 2)"
    );
    let third = words(&["3", "3", "w-1"]);
    assert_eq!(
        third[7..],
        ["0.2s", "failed", "boom…"],
        "first line of the error"
    );

    let json = taskq(Some(url(&db)), &["show", "--json", &id.to_string()]).await;
    let attempts = &json.json()["attempts"];
    assert_eq!(attempts.as_array().unwrap().len(), 3);
    assert_eq!(attempts[1]["outcome"], "lease_lost");
    assert_eq!(attempts[1]["worker_id"], "w-2");
    assert_eq!(attempts[2]["error"], "boom\nsecond line");
}

/// Actions taken with the CLI are recorded with `--actor` (default `cli:<user>@<host>`);
/// `taskq audit` lists them newest first, by task or queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_lists_cli_actions_with_their_actor() {
    let Some(db) = TestDb::new_or_skip().await else {
        return;
    };
    let id = ping(&db, 1).await;
    let out = taskq(
        Some(url(&db)),
        &["--actor", "ops:carol", "cancel", &id.to_string()],
    )
    .await;
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(taskq(Some(url(&db)), &["pause", "mail"]).await.code, 0);
    // A refused action leaves no entry.
    assert_eq!(
        taskq(Some(url(&db)), &["cancel", &id.to_string()])
            .await
            .code,
        3
    );

    let out = taskq(Some(url(&db)), &["audit"]).await;
    assert_eq!(out.code, 0, "{out:?}");
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{}", out.stdout);
    let header: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(
        header,
        ["ID", "AT", "ACTOR", "ACTION", "TASK", "QUEUE", "DETAIL"]
    );
    let pause: Vec<&str> = lines[1].split_whitespace().collect();
    assert!(
        pause[3].starts_with("cli:") && pause[3].contains('@'),
        "{pause:?}"
    );
    assert_eq!(pause[4..], ["pause", "-", "mail", "-"]);
    let cancel: Vec<&str> = lines[2].split_whitespace().collect();
    assert_eq!(
        cancel[3..],
        ["ops:carol", "cancel", &id.to_string(), "default", "-"]
    );

    let json = taskq(
        Some(url(&db)),
        &["audit", "--json", "--task", &id.to_string()],
    )
    .await;
    let v = json.json();
    assert_eq!(v.as_array().unwrap().len(), 1, "{v}");
    assert_eq!(v[0]["actor"], "ops:carol");
    assert_eq!(v[0]["action"], "cancel");
    assert_eq!(v[0]["task_id"], id.0);
    let mail = taskq(Some(url(&db)), &["audit", "--json", "--queue", "mail"]).await;
    assert_eq!(mail.json()[0]["action"], "pause");
    let page = taskq(Some(url(&db)), &["audit", "--limit", "1"]).await;
    assert!(
        page.stderr.contains("next page with --before-id"),
        "{page:?}"
    );
    let none = taskq(Some(url(&db)), &["audit", "--queue", "nope"]).await;
    assert_eq!(none.stdout.trim(), "no audit entries");
}

/// What a hostile stored string tries: retitle the terminal (OSC … BEL), clear the screen,
/// print fake coloured text over what is already on the line (CR), and the same with a C1
/// CSI (U+009B), DEL and a right-to-left override.
const HOSTILE: &str =
    "\u{1b}]0;pwned\u{7}\u{1b}[2J\u{1b}[31mFAKE OK\r\u{9b}32mstate: succeeded\u{7f}\u{202e}";

/// Whether `out` has a character a terminal acts on (anything but text, newlines and tabs).
fn terminal_controls(out: &str) -> Vec<char> {
    out.chars()
        .filter(|&c| {
            (c.is_control() && c != '\n' && c != '\t')
                || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
        })
        .collect()
}

/// Stored text with control characters (error, name, queue, payload, worker id) is printed
/// with the controls escaped by `show`, `list`, `names`, `stats`, `workers`, `audit` and their
/// `--json` forms (which still decode to the stored strings); a multi-line error keeps its
/// lines in `show`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_control_characters_are_escaped_in_every_output() {
    let Some(db) = TestDb::new_or_skip().await else {
        return;
    };
    let u = || Some(url(&db));
    let error = format!("first line {HOSTILE}\r\nsecond line\n\u{1b}[1Athird line");
    let dead = ping(&db, 1).await;
    let pending = ping(&db, 2).await;
    let payload = serde_json::json!({ "note": HOSTILE }).to_string();
    for (id, state) in [(dead, "dead"), (pending, "pending")] {
        sqlx::query(
            "UPDATE taskq_tasks SET state = ?, name = ?, queue = ?, last_error = ?,
               payload = ?, worker_id = ?, finished_at = IF(? = 'dead', UTC_TIMESTAMP(6), NULL)
             WHERE id = ?",
        )
        .bind(state)
        .bind(format!("name{HOSTILE}"))
        .bind(format!("queue{HOSTILE}"))
        .bind(&error)
        .bind(if state == "dead" {
            payload.as_bytes().to_vec()
        } else {
            HOSTILE.as_bytes().to_vec()
        })
        .bind(format!("worker{HOSTILE}"))
        .bind(state)
        .bind(id.0)
        .execute(&db.pool)
        .await
        .unwrap();
    }
    sqlx::query(
        "INSERT INTO taskq_workers (worker_id, host, pid, queues, concurrency, lease_us,
           heartbeat_us, started_at, last_seen_at)
         VALUES (?, ?, 1, ?, 1, 30000000, 10000000, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))",
    )
    .bind(format!("worker{HOSTILE}"))
    .bind(format!("host{HOSTILE}"))
    .bind(serde_json::json!({ format!("queue{HOSTILE}"): 1 }).to_string())
    .execute(&db.pool)
    .await
    .unwrap();

    let escaped =
        r"\u{1b}]0;pwned\u{7}\u{1b}[2J\u{1b}[31mFAKE OK\r\u{9b}32mstate: succeeded\u{7f}\u{202e}";
    let show = taskq(u(), &["show", &dead.to_string()]).await;
    assert_eq!(show.code, 0, "{show:?}");
    assert_eq!(
        terminal_controls(&show.stdout),
        Vec::<char>::new(),
        "{show:?}"
    );
    assert!(
        show.stdout.contains(&format!("\nlast_error:      first line {escaped}\n                 second line\n                 \\u{{1b}}[1Athird line\n")),
        "{}",
        show.stdout
    );
    assert!(
        show.stdout
            .contains(&format!("name:            name{escaped}\n")),
        "{}",
        show.stdout
    );
    assert!(
        show.stdout
            .contains(&format!("worker_id:       worker{escaped}\n")),
        "{}",
        show.stdout
    );
    // The pretty payload: still JSON, its C1/DEL/bidi characters as JSON escapes.
    assert!(
        show.stdout.contains(r#""note": "\u001b]0;pwned\u0007\u001b[2J\u001b[31mFAKE OK\r\u009b32mstate: succeeded\u007f\u202e""#),
        "{}",
        show.stdout
    );
    let raw = taskq(u(), &["show", &pending.to_string()]).await;
    assert_eq!(
        terminal_controls(&raw.stdout),
        Vec::<char>::new(),
        "{raw:?}"
    );
    assert!(
        raw.stdout.contains(&format!("(not valid JSON) {escaped}")),
        "{}",
        raw.stdout
    );

    for args in [
        &["list"][..],
        &["names"],
        &["stats"],
        &["workers"],
        &["audit"],
        &[
            "list",
            "--state",
            "dead",
            "--name",
            &format!("name{HOSTILE}"),
        ],
    ] {
        let out = taskq(u(), args).await;
        assert_eq!(out.code, 0, "{args:?}: {out:?}");
        assert_eq!(
            terminal_controls(&out.stdout),
            Vec::<char>::new(),
            "{args:?}: {}",
            out.stdout
        );
        assert_eq!(
            terminal_controls(&out.stderr),
            Vec::<char>::new(),
            "{args:?}: {}",
            out.stderr
        );
        if args[0] != "audit" {
            assert!(
                out.stdout.contains(&format!("queue{escaped}")),
                "{args:?}: {}",
                out.stdout
            );
        }
    }
    let list = taskq(u(), &["list"]).await;
    assert!(
        list.stdout.contains(&format!("first line {escaped}…")),
        "{}",
        list.stdout
    );

    // --json: no raw control on the terminal, and the same strings once decoded.
    for args in [
        &["show", "--json", &dead.to_string()][..],
        &["list", "--json"],
        &["names", "--json"],
        &["workers", "--json"],
    ] {
        let out = taskq(u(), args).await;
        assert_eq!(out.code, 0, "{args:?}: {out:?}");
        assert_eq!(
            terminal_controls(&out.stdout),
            Vec::<char>::new(),
            "{args:?}: {}",
            out.stdout
        );
        let v = out.json();
        let text = v.to_string();
        assert!(text.contains(r"\u001b]0;pwned"), "{args:?}: {text}");
    }
    let v = taskq(u(), &["show", "--json", &dead.to_string()])
        .await
        .json();
    assert_eq!(v["last_error"], error.as_str());
    assert_eq!(v["name"], format!("name{HOSTILE}"));
    assert_eq!(v["payload"]["note"], HOSTILE);

    // An error message quoting stored text is escaped too.
    let missing = taskq(u(), &["schedules", "delete", &format!("s{HOSTILE}")]).await;
    assert_eq!(
        terminal_controls(&missing.stderr),
        Vec::<char>::new(),
        "{missing:?}"
    );
}

/// An order event for `taskq events show`: a poison one is rejected by [`relay_round`]'s sink.
#[derive(Debug, Clone, serde::Serialize)]
#[taskq::event(topic = "orders.placed", key = order)]
struct OrderPlaced {
    order: String,
    poison: bool,
}

/// Relays until nothing is left, with a sink that rejects poison events (holding their key)
/// and delivers the rest.
async fn relay_round(pool: &sqlx::MySqlPool) {
    use taskq::outbox::{FnSink, Message, Outcome, Relay};
    let sink = FnSink::new(|batch: Vec<Message>| async move {
        let mut held: Vec<String> = Vec::new();
        batch
            .into_iter()
            .map(|m| {
                if held.contains(&m.key) {
                    Outcome::Held
                } else if String::from_utf8_lossy(&m.payload).contains("\"poison\":true") {
                    held.push(m.key.clone());
                    Outcome::Rejected("message\ttoo large".into())
                } else {
                    Outcome::Delivered
                }
            })
            .collect()
    });
    let relay = Relay::builder(pool.clone(), sink).build().unwrap();
    while relay.run_once().await.unwrap().published > 0 {}
}

/// `taskq events show TOPIC KEY` on MySQL/MariaDB: a held key's state and its events by seq,
/// as a table and `--json`, paged; a leased key shows its owner and lease end; an unknown key
/// exits 3. (The same on a SQLite file: `tests/sqlite.rs`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_show_lists_a_key_s_state_and_events() {
    use taskq::outbox::Event;
    let Some(db) = TestDb::new_or_skip().await else {
        return;
    };
    for (order, poison) in [
        ("a-1", true),
        ("a-1", false),
        ("a-1", false),
        ("b-2", false),
    ] {
        let mut tx = db.pool.begin().await.unwrap();
        OrderPlaced {
            order: order.into(),
            poison,
        }
        .publish_tx(&mut tx)
        .await
        .unwrap();
        tx.commit().await.unwrap();
    }
    relay_round(&db.pool).await;
    let u = url(&db);
    let show = |args: &'static [&'static str]| {
        let mut all = vec!["events", "show", "orders.placed"];
        all.extend_from_slice(args);
        let u = u.clone();
        async move { taskq(Some(u), &all).await }
    };

    let a = show(&["a-1", "--json"]).await;
    assert_eq!(a.code, 0, "{a:?}");
    let a = a.json();
    let k = &a["key"];
    assert_eq!(
        (
            k["next_seq"].as_u64(),
            k["done_seq"].as_u64(),
            k["held_seq"].as_u64(),
            k["failures"].as_u64(),
            k["last_error"].as_str(),
            k["leased"].as_bool(),
        ),
        (
            Some(3),
            Some(0),
            Some(1),
            Some(1),
            Some("message\ttoo large"),
            Some(false)
        ),
        "{a}"
    );
    assert!(
        k["held_at"].is_string() && k["lease_until"].is_null(),
        "{a}"
    );
    let seqs: Vec<(u64, &str)> = a["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["seq"].as_u64().unwrap(), e["state"].as_str().unwrap()))
        .collect();
    assert_eq!(
        seqs,
        [(1, "pending"), (2, "pending"), (3, "pending")],
        "{a}"
    );
    let first = &a["events"][0];
    let t = show(&["a-1"]).await;
    assert_eq!(t.code, 0, "{t:?}");
    assert!(t.stdout.contains("held:        at seq 1 since "), "{t:?}");
    assert!(
        t.stdout.contains("last_error:  message\\ttoo large"),
        "{t:?}"
    );
    let line = format!(
        "{} 1 pending {}",
        first["id"],
        first["message_id"].as_str().unwrap()
    );
    assert!(
        t.stdout.lines().any(|l| l
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
            .starts_with(&line)),
        "{line}: {t:?}"
    );

    let p1 = show(&["a-1", "--limit", "2", "--json"]).await.json();
    assert_eq!(p1["events"].as_array().unwrap().len(), 2, "{p1}");
    assert_eq!(p1["next_after_seq"], 2, "{p1}");
    let p2 = show(&["a-1", "--after-seq", "2", "--json"]).await.json();
    assert_eq!(p2["events"][0]["seq"], 3, "{p2}");
    assert_eq!(p2["events"].as_array().unwrap().len(), 1, "{p2}");

    sqlx::query(
        "UPDATE taskq_event_keys SET lease_owner = 'relay-x',
             lease_until = UTC_TIMESTAMP(6) + INTERVAL 1 MINUTE WHERE event_key = 'b-2'",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let b = show(&["b-2", "--json"]).await.json();
    assert_eq!(
        (
            b["key"]["done_seq"].as_u64(),
            b["key"]["lease_owner"].as_str(),
            b["key"]["leased"].as_bool(),
        ),
        (Some(1), Some("relay-x"), Some(true)),
        "{b}"
    );
    assert!(b["key"]["lease_until"].is_string(), "{b}");
    assert_eq!(b["events"][0]["state"], "delivered", "{b}");

    let missing = show(&["nope"]).await;
    assert_eq!(missing.code, 3, "{missing:?}");
}
