//! The `taskq` binary on a SQLite file (no server): every command takes `sqlite://path` and
//! `sqlite:path` like a `mysql://` URL. Tasks are enqueued with the library into the same
//! file; the CLI's output and the rows it changes are checked.

use std::path::{Path, PathBuf};
use std::process::Command;

use sqlx::SqlitePool;
use taskq::{Client, Task, TaskContext, TaskError, TaskId, TaskState};

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Ping {
    n: u32,
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

/// A fresh directory in the temp directory, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        use std::hash::{BuildHasher, RandomState};
        let n = RandomState::new().hash_one(std::thread::current().id());
        let dir = std::env::temp_dir().join(format!("taskq-cli-{}-{n:016x}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[derive(Debug)]
struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Out {
    fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {self:?}"))
    }

    #[track_caller]
    fn ok(self) -> Self {
        assert_eq!(self.code, 0, "{self:?}");
        self
    }
}

/// Runs `taskq ARGS` in `cwd` with `--database-url url`.
async fn taskq(cwd: &Path, url: &str, args: &[&str]) -> Out {
    let mut all = vec!["--database-url".to_owned(), url.to_owned()];
    all.extend(args.iter().map(|s| (*s).to_owned()));
    let cwd = cwd.to_owned();
    tokio::task::spawn_blocking(move || {
        let out = Command::new(env!("CARGO_BIN_EXE_taskq"))
            .args(&all)
            .current_dir(cwd)
            .env_remove("DATABASE_URL")
            .output()
            .expect("run the taskq binary");
        Out {
            code: out.status.code().expect("exited normally"),
            stdout: String::from_utf8(out.stdout).unwrap(),
            stderr: String::from_utf8(out.stderr).unwrap(),
        }
    })
    .await
    .unwrap()
}

/// The stdout line of a table whose cells start with `cells`.
fn row<'a>(stdout: &'a str, cells: &[&str]) -> Option<&'a str> {
    stdout.lines().find(|l| {
        let words: Vec<&str> = l.split_whitespace().collect();
        words.len() >= cells.len() && words[..cells.len()] == *cells
    })
}

async fn ping(pool: &SqlitePool, n: u32) -> TaskId {
    Ping { n }.enqueue(pool).await.unwrap().id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_commands_work_on_a_sqlite_file() {
    let dir = TempDir::new();
    let file = dir.0.join("app.db");
    let url = format!("sqlite://{}", file.display());
    let d = &dir.0;

    // A command other than migrate does not create a database at a mistyped path.
    let missing = taskq(d, &url, &["stats"]).await;
    assert_eq!(missing.code, 4, "{missing:?}");
    assert!(
        missing
            .stderr
            .contains(&format!("no SQLite database at {}", file.display()))
            && missing.stderr.contains("taskq migrate"),
        "{missing:?}"
    );
    assert!(!file.exists());

    let out = taskq(d, &url, &["migrate"]).await.ok();
    assert!(out.stdout.contains("migrations applied"), "{out:?}");
    assert!(file.exists());
    let again = taskq(d, &url, &["migrate", "--json"]).await.ok();
    assert_eq!(again.json(), serde_json::json!({ "migrated": true }));
    let empty = taskq(d, &url, &["stats"]).await.ok();
    assert!(empty.stdout.contains("no tasks"), "{empty:?}");

    // Enqueue with the library into the same file.
    let pool = taskq::sqlite::open(&file).await.unwrap();
    let client = Client::new(pool.clone());
    let ids = [
        ping(&pool, 1).await,
        ping(&pool, 2).await,
        ping(&pool, 3).await,
    ];
    let pong = Pong(7).enqueue(&pool).await.unwrap().id;

    let list = taskq(d, &url, &["list"]).await.ok();
    assert_eq!(list.stdout.lines().count(), 5, "{}", list.stdout); // header + 4
    assert!(
        row(
            &list.stdout,
            &[&ids[0].to_string(), "default", "ping", "pending"]
        )
        .is_some()
    );
    assert!(
        row(
            &list.stdout,
            &[&pong.to_string(), "other", "pong", "pending"]
        )
        .is_some()
    );
    let other = taskq(d, &url, &["list", "--json", "--queue", "other"])
        .await
        .ok();
    let v = other.json();
    assert_eq!(v.as_array().unwrap().len(), 1, "{v}");
    assert_eq!(v[0]["id"], pong.0);
    let pong_json = taskq(d, &url, &["show", "--json", &pong.to_string()])
        .await
        .ok();
    assert_eq!(
        pong_json.json()["payload"],
        serde_json::json!(7),
        "{pong_json:?}"
    );

    let show = taskq(d, &url, &["show", &ids[1].to_string()]).await.ok();
    assert!(show.stdout.contains("ping"), "{}", show.stdout);
    assert!(
        show.stdout.contains("\"n\": 2") || show.stdout.contains("\"n\":2"),
        "{}",
        show.stdout
    );
    let shown = taskq(d, &url, &["show", "--json", &ids[1].to_string()])
        .await
        .ok();
    assert_eq!(shown.json()["state"], "pending");
    let none = taskq(d, &url, &["show", "987654"]).await;
    assert_eq!(none.code, 3, "{none:?}");

    let stats = taskq(d, &url, &["stats"]).await.ok();
    assert!(
        row(&stats.stdout, &["default", "pending", "3"]).is_some(),
        "{}",
        stats.stdout
    );
    assert!(
        row(&stats.stdout, &["other", "pending", "1"]).is_some(),
        "{}",
        stats.stdout
    );
    let json = taskq(d, &url, &["stats", "--json"]).await.ok().json();
    assert!(json["now"].is_string(), "{json}");
    let age = json["counts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["queue"] == "default" && c["state"] == "pending")
        .unwrap()["oldest_pending_age_secs"]
        .as_f64()
        .unwrap();
    assert!((0.0..60.0).contains(&age), "{age}");

    // pause / paused / resume, with the audit trail.
    let out = taskq(d, &url, &["--actor", "ops:ada", "pause", "mail"])
        .await
        .ok();
    assert!(out.stdout.contains("queue mail: paused"), "{out:?}");
    assert_eq!(client.paused_queues().await.unwrap()[0].0, "mail");
    let paused = taskq(d, &url, &["paused", "--json"]).await.ok();
    assert_eq!(paused.json()[0]["queue"], "mail");
    let out = taskq(d, &url, &["resume", "mail"]).await.ok();
    assert!(out.stdout.contains("queue mail: running"), "{out:?}");
    assert!(client.paused_queues().await.unwrap().is_empty());

    // limit / rate-limit / queues.
    taskq(d, &url, &["limit", "default", "3"]).await.ok();
    taskq(d, &url, &["rate-limit", "default", "10/1m"])
        .await
        .ok();
    let queues = taskq(d, &url, &["queues", "--json"]).await.ok().json();
    let default = queues
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["queue"] == "default")
        .unwrap_or_else(|| panic!("{queues}"))
        .clone();
    assert_eq!(default["concurrency_limit"], 3, "{default}");

    // cancel one, make another dead and retry it, purge the canceled one.
    let out = taskq(d, &url, &["cancel", &ids[0].to_string()]).await.ok();
    assert!(out.stdout.contains("canceled"), "{out:?}");
    assert_eq!(client.get(ids[0]).await.unwrap().state, TaskState::Canceled);
    let old = chrono::Utc::now().timestamp_micros() - 3_600_000_000;
    sqlx::query(
        "UPDATE taskq_tasks SET state = 'dead', attempt = 3, last_error = 'boom',
           finished_at = ? WHERE id = ?",
    )
    .bind(old)
    .bind(ids[1].0 as i64)
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("UPDATE taskq_tasks SET finished_at = ? WHERE id = ?")
        .bind(old)
        .bind(ids[0].0 as i64)
        .execute(&pool)
        .await
        .unwrap();
    let dead = taskq(d, &url, &["list", "--json", "--state", "dead"])
        .await
        .ok();
    assert_eq!(dead.json()[0]["last_error"], "boom");
    taskq(d, &url, &["retry", &ids[1].to_string()]).await.ok();
    let t = client.get(ids[1]).await.unwrap();
    assert_eq!((t.state, t.attempt), (TaskState::Pending, 0));
    let purged = taskq(d, &url, &["purge", "--older-than", "30m", "--json"])
        .await
        .ok();
    assert_eq!(purged.json()["purged"], 1, "{purged:?}");
    assert!(matches!(
        client.get(ids[0]).await,
        Err(taskq::Error::NotFound(_))
    ));

    // A worker on the file: listed live, runs the two pending pings, listed stopped after.
    let none = taskq(d, &url, &["workers", "--json"]).await.ok().json();
    assert_eq!(none["workers"], serde_json::json!([]), "{none}");
    let worker = taskq_tests::RunningWorker::spawn(
        taskq_tests::fast_worker(&pool)
            .register::<Ping>()
            .queue("default", 2),
    );
    taskq_tests::wait_until(std::time::Duration::from_secs(20), "pings done", || async {
        let done = taskq(d, &url, &["list", "--json", "--state", "succeeded"]).await;
        done.code == 0 && done.json().as_array().is_some_and(|a| a.len() == 2)
    })
    .await;
    let live = taskq(d, &url, &["workers", "--json"]).await.ok().json();
    assert_eq!(live["workers"][0]["id"], worker.id.as_str(), "{live}");
    assert_eq!(live["workers"][0]["alive"], true, "{live}");
    assert_eq!(
        live["workers"][0]["queues"],
        serde_json::json!({"default": 2}),
        "{live}"
    );
    worker.stop().await;
    let all = taskq(d, &url, &["workers", "--all", "--json"])
        .await
        .ok()
        .json();
    assert!(all["workers"][0]["stopped_at"].is_string(), "{all}");
    let audit = taskq(d, &url, &["audit", "--json", "--queue", "mail"])
        .await
        .ok()
        .json();
    assert_eq!(audit[1]["action"], "pause", "{audit}");
    assert_eq!(audit[1]["actor"], "ops:ada", "{audit}");
    pool.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relative_sqlite_path_without_slashes_works() {
    let dir = TempDir::new();
    taskq(&dir.0, "sqlite:rel.db", &["migrate"]).await.ok();
    assert!(dir.0.join("rel.db").exists());
    let pool = taskq::sqlite::open(dir.0.join("rel.db")).await.unwrap();
    ping(&pool, 1).await;
    let stats = taskq(&dir.0, "sqlite:rel.db", &["stats"]).await.ok();
    assert!(
        row(&stats.stdout, &["default", "pending", "1"]).is_some(),
        "{stats:?}"
    );
    let upper = taskq(&dir.0, "SQLITE://rel.db", &["list", "--json"])
        .await
        .ok();
    assert_eq!(upper.json().as_array().unwrap().len(), 1);
    pool.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sqlite_file_that_cannot_be_created_is_a_readable_error() {
    let dir = TempDir::new();
    let out = taskq(&dir.0, "sqlite:///nonexistent-dir/sub/app.db", &["migrate"]).await;
    assert_eq!(out.code, 4, "{out:?}");
    assert!(
        out.stderr.starts_with(
            "taskq: error: cannot open the SQLite database /nonexistent-dir/sub/app.db:"
        ) && out.stderr.contains("does its directory exist"),
        "{out:?}"
    );
    assert_eq!(out.stderr.lines().count(), 1, "{out:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_serves_the_dashboard_of_a_sqlite_file() {
    if !taskq_tests::loopback_or_skip() {
        return;
    }
    let dir = TempDir::new();
    let file = dir.0.join("web.db");
    let url = format!("sqlite://{}", file.display());
    taskq(&dir.0, &url, &["migrate"]).await.ok();
    let pool = taskq::sqlite::open(&file).await.unwrap();
    ping(&pool, 1).await;
    let mut child = Command::new(env!("CARGO_BIN_EXE_taskq"))
        .args(["web", "--listen", "127.0.0.1:0", "--database-url", &url])
        .env("TASKQ_WEB_TOKEN", "sqlite-token")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
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
    let Some(addr) = line
        .trim()
        .strip_prefix("taskq web: serving the dashboard at http://")
        .and_then(|rest| rest.strip_suffix('/'))
        .map(str::to_owned)
    else {
        let _ = child.kill();
        let out = child.wait_with_output().unwrap();
        panic!(
            "unexpected first line {line:?}; stderr: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
    s.write_all(
        format!("GET /api/v1/queues HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer sqlite-token\r\nConnection: close\r\n\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(out.contains("\"queue\":\"default\""), "{out}");
    pool.close().await;
}

/// Retitles the terminal, clears it, writes fake coloured text over the line (CR, C1 CSI).
const HOSTILE: &str = "\u{1b}]0;pwned\u{7}\u{1b}[2J\u{1b}[31mFAKE\r\u{9b}32mok\u{7f}";

fn terminal_controls(out: &str) -> Vec<char> {
    out.chars()
        .filter(|&c| c.is_control() && c != '\n' && c != '\t')
        .collect()
}

/// On a SQLite file too, `show` and `list` (and `--json`) print stored control characters
/// escaped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_control_characters_are_escaped_on_a_sqlite_file() {
    let dir = TempDir::new();
    let file = dir.0.join("app.db");
    let url = format!("sqlite://{}", file.display());
    let d = &dir.0;
    taskq(d, &url, &["migrate"]).await.ok();
    let pool = taskq::sqlite::open(&file).await.unwrap();
    let id = ping(&pool, 1).await;
    let error = format!("boom {HOSTILE}\nsecond line");
    sqlx::query(
        "UPDATE taskq_tasks SET state = 'dead', name = ?1, last_error = ?2, worker_id = ?1,
           finished_at = updated_at WHERE id = ?3",
    )
    .bind(format!("name{HOSTILE}"))
    .bind(&error)
    .bind(id.0 as i64)
    .execute(&pool)
    .await
    .unwrap();
    let escaped = r"\u{1b}]0;pwned\u{7}\u{1b}[2J\u{1b}[31mFAKE\r\u{9b}32mok\u{7f}";
    let show = taskq(d, &url, &["show", &id.to_string()]).await.ok();
    assert_eq!(
        terminal_controls(&show.stdout),
        Vec::<char>::new(),
        "{show:?}"
    );
    assert!(
        show.stdout.contains(&format!(
            "last_error:      boom {escaped}\n                 second line\n"
        )),
        "{}",
        show.stdout
    );
    let list = taskq(d, &url, &["list"]).await.ok();
    assert_eq!(
        terminal_controls(&list.stdout),
        Vec::<char>::new(),
        "{list:?}"
    );
    assert!(
        list.stdout.contains(&format!("name{escaped}")),
        "{}",
        list.stdout
    );
    let json = taskq(d, &url, &["show", "--json", &id.to_string()])
        .await
        .ok();
    assert_eq!(
        terminal_controls(&json.stdout),
        Vec::<char>::new(),
        "{json:?}"
    );
    assert_eq!(json.json()["last_error"], error.as_str());
    pool.close().await;
}

/// On a SQLite file: a worker that stopped beating two heartbeat intervals ago (well within
/// its lease) is LOST in `taskq workers`, a task it holds says `worker lost` in `taskq show`,
/// and `taskq names` marks a name no live worker handles.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_workers_and_unhandled_names_on_a_sqlite_file() {
    let dir = TempDir::new();
    let file = dir.0.join("app.db");
    let url = format!("sqlite://{}", file.display());
    let d = &dir.0;
    taskq(d, &url, &["migrate"]).await.ok();
    let pool = taskq::sqlite::open(&file).await.unwrap();
    // Heartbeat 10 s, lease 30 s; `w-lost` last beat 25 s ago, `w-live` 1 s ago.
    sqlx::query(
        "INSERT INTO taskq_workers (worker_id, host, pid, queues, concurrency, lease_us,
           heartbeat_us, names, started_at, last_seen_at)
         SELECT 'w-lost', 'h', 7, '{\"default\":2}', 2, 30000000, 10000000, '[\"ping\"]',
                c.us - 60000000, c.us - 25000000 FROM taskq_clock AS c
         UNION ALL
         SELECT 'w-live', 'h', 8, '{\"other\":1}', 1, 30000000, 10000000, '[\"pong\"]',
                c.us - 60000000, c.us - 1000000 FROM taskq_clock AS c",
    )
    .execute(&pool)
    .await
    .unwrap();
    let held = ping(&pool, 1).await;
    sqlx::query(
        "UPDATE taskq_tasks SET state = 'running', attempt = 1, lease_epoch = 1,
           worker_id = 'w-lost', lease_until = (SELECT us FROM taskq_clock) + 5000000
         WHERE id = ?1",
    )
    .bind(held.0 as i64)
    .execute(&pool)
    .await
    .unwrap();
    ping(&pool, 2).await;
    Pong(3).enqueue(&pool).await.unwrap();

    let out = taskq(d, &url, &["workers"]).await.ok();
    let lost = row(&out.stdout, &["w-lost", "h", "7"]).unwrap_or_else(|| panic!("{out:?}"));
    assert!(
        lost.contains(" 25s ago ") && lost.ends_with("LOST"),
        "{lost}"
    );
    let live = row(&out.stdout, &["w-live"]).unwrap();
    assert!(live.ends_with("alive"), "{live}");
    let json = taskq(d, &url, &["workers", "--json"]).await.ok().json();
    let w = &json["workers"].as_array().unwrap();
    assert_eq!(
        w.iter()
            .map(|w| (w["id"].as_str().unwrap(), w["status"].as_str().unwrap()))
            .collect::<Vec<_>>(),
        [("w-live", "alive"), ("w-lost", "lost")]
    );

    let show = taskq(d, &url, &["show", &held.to_string()]).await.ok();
    assert!(
        show.stdout
            .contains("\nworker:          LOST: worker lost, no heartbeat for 25s"),
        "{}",
        show.stdout
    );

    // `ping` in `default`: its only worker is lost. `pong` in `other`: handled.
    let names = taskq(d, &url, &["names"]).await.ok();
    let pings = row(&names.stdout, &["default", "ping", "1", "1"]).unwrap();
    assert!(pings.ends_with("NO LIVE WORKER"), "{pings}");
    let pongs = row(&names.stdout, &["other", "pong", "1", "1"]).unwrap();
    assert!(pongs.ends_with("1 live worker"), "{pongs}");
    pool.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_keys_lists_the_heads_that_hold_their_key_on_a_sqlite_file() {
    let dir = TempDir::new();
    let file = dir.0.join("app.db");
    let url = format!("sqlite://{}", file.display());
    let d = &dir.0;
    taskq(d, &url, &["migrate"]).await.ok();
    let pool = taskq::sqlite::open(&file).await.unwrap();

    // Key "acct-7": a head and two tasks behind it; key "acct-8": a head alone.
    let mut seven = Vec::new();
    for n in 0..3 {
        seven.push(
            Ping { n }
                .with_order_key("acct-7")
                .enqueue(&pool)
                .await
                .unwrap()
                .id,
        );
    }
    let eight = Ping { n: 9 }
        .with_order_key("acct-8")
        .enqueue(&pool)
        .await
        .unwrap()
        .id;
    let client = Client::new(pool.clone());
    for (id, want) in [
        (seven[0], TaskState::Pending),
        (seven[1], TaskState::Waiting),
        (seven[2], TaskState::Waiting),
        (eight, TaskState::Pending),
    ] {
        assert_eq!(client.get(id).await.unwrap().state, want, "{id}");
    }
    // Heads that have not failed hold nothing back.
    let none = taskq(d, &url, &["held-keys"]).await.ok();
    assert!(
        none.stdout.contains("no order key is held back"),
        "{none:?}"
    );

    // The head of acct-7 failed once and waits for its next attempt (as a write-back of a
    // failed attempt leaves it): its key is held back, with two tasks waiting.
    sqlx::query(
        "UPDATE taskq_tasks SET attempt = 1, last_error = 'upstream 503',
           run_at = run_at + 3600000000 WHERE id = ?1",
    )
    .bind(seven[0].0 as i64)
    .execute(&pool)
    .await
    .unwrap();
    let json = taskq(d, &url, &["held-keys", "--json"]).await.ok().json();
    let keys = json["held_keys"].as_array().unwrap();
    assert_eq!(keys.len(), 1, "{json}");
    let k = &keys[0];
    assert_eq!(k["head"].as_u64(), Some(seven[0].0), "{json}");
    assert_eq!(k["queue"], "default");
    assert_eq!(k["name"], "ping");
    assert_eq!(k["state"], "pending");
    assert_eq!(k["attempt"], 1);
    assert_eq!(k["waiting"], 2);
    assert_eq!(k["last_error"], "upstream 503");
    let key = k["order_key"].as_str().unwrap().to_owned();
    assert_eq!(key.len(), 64, "{key}");

    let table = taskq(d, &url, &["held-keys"]).await.ok();
    let line = row(
        &table.stdout,
        &[
            "default",
            &key[..16],
            &seven[0].to_string(),
            "ping",
            "pending",
            "1",
            "2",
        ],
    )
    .unwrap_or_else(|| panic!("{}", table.stdout));
    assert!(line.ends_with("upstream 503"), "{line}");
    // Another queue's keys only.
    let other = taskq(d, &url, &["held-keys", "--queue", "other"])
        .await
        .ok();
    assert!(
        other.stdout.contains("no order key is held back"),
        "{other:?}"
    );
    pool.close().await;
}

/// An order event for the `taskq events` tests: a poison one is rejected by the test's sink.
#[derive(Debug, Clone, serde::Serialize)]
#[taskq::event(topic = "orders.placed", key = order)]
struct OrderPlaced {
    order: String,
    poison: bool,
}

/// One relay round on a sink that rejects poison events (holding their key) and delivers the
/// rest.
async fn relay_round(pool: &SqlitePool) {
    let sink = taskq::outbox::FnSink::new(|batch: Vec<taskq::outbox::Message>| async move {
        let mut held: Vec<String> = Vec::new();
        batch
            .into_iter()
            .map(|m| {
                let poison = String::from_utf8_lossy(&m.payload).contains("\"poison\":true");
                if held.contains(&m.key) {
                    taskq::outbox::Outcome::Held
                } else if poison {
                    held.push(m.key.clone());
                    taskq::outbox::Outcome::Rejected("message\ttoo large".into())
                } else {
                    taskq::outbox::Outcome::Delivered
                }
            })
            .collect()
    });
    let relay = taskq::outbox::Relay::builder(pool.clone(), sink)
        .build()
        .unwrap();
    while relay.run_once().await.unwrap().published > 0 {}
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_stats_held_replay_skip_and_prune_on_a_sqlite_file() {
    use taskq::outbox::Event;
    let dir = TempDir::new();
    let file = dir.0.join("app.db");
    let url = format!("sqlite://{}", file.display());
    let d = &dir.0;
    taskq(d, &url, &["migrate"]).await.ok();
    let pool = taskq::sqlite::open(&file).await.unwrap();

    let none = taskq(d, &url, &["events", "stats"]).await.ok();
    assert!(none.stdout.contains("no event is pending"), "{none:?}");
    for (order, poison) in [("a-1", true), ("a-1", false), ("b-2", false)] {
        let mut tx = taskq::sqlite::begin(&pool).await.unwrap();
        OrderPlaced {
            order: order.into(),
            poison,
        }
        .publish_tx(&mut tx)
        .await
        .unwrap();
        tx.commit().await.unwrap();
    }
    let stats = taskq(d, &url, &["events", "stats", "--json"])
        .await
        .ok()
        .json();
    let t = &stats["topics"][0];
    assert_eq!(
        (t["topic"].as_str(), t["pending"].as_u64()),
        (Some("orders.placed"), Some(3)),
        "{stats}"
    );
    let table = taskq(d, &url, &["events", "stats"]).await.ok();
    assert!(
        row(&table.stdout, &["orders.placed", "3"]).is_some(),
        "{table:?}"
    );

    relay_round(&pool).await;
    let held = taskq(d, &url, &["events", "held", "--json"])
        .await
        .ok()
        .json();
    let keys = held["held_keys"].as_array().unwrap();
    assert_eq!(keys.len(), 1, "{held}");
    assert_eq!(keys[0]["key"], "a-1");
    assert_eq!(keys[0]["seq"], 1);
    assert_eq!(keys[0]["error"], "message\ttoo large");
    let table = taskq(d, &url, &["events", "held"]).await.ok();
    let line =
        row(&table.stdout, &["orders.placed", "a-1", "1"]).unwrap_or_else(|| panic!("{table:?}"));
    assert!(
        line.ends_with("message\\ttoo large"),
        "stored text is escaped: {line}"
    );
    let stats = taskq(d, &url, &["events", "stats"]).await.ok();
    assert!(
        row(&stats.stdout, &["orders.placed", "2"]).is_some_and(|l| l.ends_with(" 1")),
        "{stats:?}"
    );

    // Skip the rejected event: the key goes on. Skipping it again: nothing is held (exit 3).
    let skip = taskq(
        d,
        &url,
        &[
            "--actor",
            "ops:cli",
            "events",
            "skip",
            "--topic",
            "orders.placed",
            "--key",
            "a-1",
        ],
    )
    .await
    .ok();
    assert!(
        skip.stdout
            .contains("skipped the held event of key \"a-1\""),
        "{skip:?}"
    );
    let again = taskq(
        d,
        &url,
        &["events", "skip", "--topic", "orders.placed", "--key", "a-1"],
    )
    .await;
    assert_eq!(again.code, 3, "{again:?}");
    relay_round(&pool).await;
    let client = Client::new(pool.clone());
    assert_eq!(
        client
            .event_stats()
            .await
            .unwrap()
            .iter()
            .map(|t| t.pending)
            .sum::<u64>(),
        0
    );

    // Replay b-2 from seq 1, then a time range.
    let r = taskq(
        d,
        &url,
        &[
            "--actor",
            "ops:cli",
            "events",
            "replay",
            "--topic",
            "orders.placed",
            "--key",
            "b-2",
            "--from-seq",
            "1",
            "--json",
        ],
    )
    .await
    .ok()
    .json();
    assert_eq!(r["replayed"], 1, "{r}");
    relay_round(&pool).await;
    let r = taskq(
        d,
        &url,
        &[
            "events",
            "replay",
            "--topic",
            "orders.placed",
            "--since",
            "2000-01-01T00:00:00Z",
            "--until",
            "2999-01-01T00:00:00Z",
        ],
    )
    .await
    .ok();
    // Delivered and dead events alike: the skipped poison comes back (and holds its key again).
    assert!(
        r.stdout
            .contains("replaying 3 events of topic \"orders.placed\" published from"),
        "{r:?}"
    );
    let bad = taskq(d, &url, &["events", "replay", "--topic", "orders.placed"]).await;
    assert_eq!(bad.code, 2, "--key or --since is required: {bad:?}");
    relay_round(&pool).await;
    let held = taskq(
        d,
        &url,
        &["events", "held", "--topic", "orders.placed", "--json"],
    )
    .await
    .ok()
    .json();
    assert_eq!(held["held_keys"][0]["key"], "a-1", "{held}");
    // Every action is in the audit trail with its actor.
    let audit = taskq(d, &url, &["audit", "--json"]).await.ok().json();
    let entries = audit.as_array().unwrap();
    let acts: Vec<(&str, &str)> = entries
        .iter()
        .map(|e| (e["action"].as_str().unwrap(), e["actor"].as_str().unwrap()))
        .collect();
    assert_eq!(
        acts[1..],
        [("event_replay", "ops:cli"), ("event_skip", "ops:cli")],
        "{audit}"
    );
    assert_eq!(acts[0].0, "event_replay_range");

    // Retention: nothing published a day ago yet; then every delivered event (by publish
    // time: no time is kept per delivered event).
    let p = taskq(d, &url, &["events", "prune", "--older-than", "1d"])
        .await
        .ok();
    assert!(
        p.stdout
            .contains("pruned 0 delivered events published more than 1d ago"),
        "{p:?}"
    );
    sqlx::query("UPDATE taskq_events SET created_at = created_at - 3 * 86400000000")
        .execute(&pool)
        .await
        .unwrap();
    let p = taskq(
        d,
        &url,
        &["events", "prune", "--older-than", "1d", "--json"],
    )
    .await
    .ok()
    .json();
    assert_eq!(
        p["pruned"], 1,
        "b-2 (a-1's second event waits behind the held first): {p}"
    );
    pool.close().await;
}

/// `taskq events show TOPIC KEY`: a held key's state (seqs, hold at its seq with the escaped
/// error, lease) and its events by seq (id, seq, state, message id, times), as a table and
/// `--json`, paged with `--after-seq`/`--limit`; a leased key shows its owner and lease end;
/// an unknown key exits 3.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_show_lists_a_key_s_state_and_events_on_a_sqlite_file() {
    use taskq::outbox::Event;
    let dir = TempDir::new();
    let file = dir.0.join("app.db");
    let url = format!("sqlite://{}", file.display());
    let d = &dir.0;
    taskq(d, &url, &["migrate"]).await.ok();
    let pool = taskq::sqlite::open(&file).await.unwrap();
    for (order, poison) in [
        ("a-1", true),
        ("a-1", false),
        ("a-1", false),
        ("b-2", false),
    ] {
        let mut tx = taskq::sqlite::begin(&pool).await.unwrap();
        OrderPlaced {
            order: order.into(),
            poison,
        }
        .publish_tx(&mut tx)
        .await
        .unwrap();
        tx.commit().await.unwrap();
    }
    relay_round(&pool).await;

    let show = |args: &'static [&'static str]| {
        let mut all = vec!["events", "show", "orders.placed"];
        all.extend_from_slice(args);
        let d = d.to_owned();
        let url = url.clone();
        async move { taskq(&d, &url, &all).await }
    };
    let a = show(&["a-1", "--json"]).await.ok().json();
    let k = &a["key"];
    assert_eq!(
        (
            k["topic"].as_str(),
            k["key"].as_str(),
            k["next_seq"].as_u64(),
            k["done_seq"].as_u64(),
            k["held_seq"].as_u64(),
            k["failures"].as_u64(),
            k["last_error"].as_str(),
            k["leased"].as_bool(),
        ),
        (
            Some("orders.placed"),
            Some("a-1"),
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
    let events = a["events"].as_array().unwrap();
    let seqs: Vec<(u64, &str)> = events
        .iter()
        .map(|e| (e["seq"].as_u64().unwrap(), e["state"].as_str().unwrap()))
        .collect();
    assert_eq!(
        seqs,
        [(1, "pending"), (2, "pending"), (3, "pending")],
        "{a}"
    );
    assert!(a["next_after_seq"].is_null(), "{a}");
    let ids: Vec<u64> = events.iter().map(|e| e["id"].as_u64().unwrap()).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{a}");
    for e in events {
        let m = e["message_id"].as_str().unwrap();
        assert!(
            m.len() == 32 && m.bytes().all(|b| b.is_ascii_hexdigit()),
            "{e}"
        );
        assert!(e["created_at"].is_string() && e["dead_at"].is_null(), "{e}");
    }

    // The table: the key's fields (stored text escaped), then one row per event.
    let t = show(&["a-1"]).await.ok();
    assert!(t.stdout.contains("next_seq:    3"), "{t:?}");
    assert!(t.stdout.contains("held:        at seq 1 since "), "{t:?}");
    assert!(
        t.stdout.contains("last_error:  message\\ttoo large"),
        "{t:?}"
    );
    let msg1 = events[0]["message_id"].as_str().unwrap();
    let id1 = ids[0].to_string();
    assert!(
        row(&t.stdout, &[&id1, "1", "pending", msg1]).is_some(),
        "{t:?}"
    );

    // Paging.
    let p1 = show(&["a-1", "--limit", "2", "--json"]).await.ok().json();
    assert_eq!(p1["events"].as_array().unwrap().len(), 2, "{p1}");
    assert_eq!(p1["next_after_seq"], 2, "{p1}");
    let p1 = show(&["a-1", "--limit", "2"]).await.ok();
    assert!(p1.stderr.contains("next page with --after-seq 2"), "{p1:?}");
    let p2 = show(&["a-1", "--after-seq", "2", "--limit", "2", "--json"])
        .await
        .ok()
        .json();
    assert_eq!(p2["events"][0]["seq"], 3, "{p2}");
    assert_eq!(p2["events"].as_array().unwrap().len(), 1, "{p2}");
    assert!(p2["next_after_seq"].is_null(), "{p2}");

    // A delivered key, leased (as by a relay): owner and lease end shown.
    sqlx::query(
        "UPDATE taskq_event_keys SET lease_owner = 'relay-x',
             lease_until = (SELECT us FROM taskq_clock) + 60000000 WHERE event_key = 'b-2'",
    )
    .execute(&pool)
    .await
    .unwrap();
    let b = show(&["b-2", "--json"]).await.ok().json();
    assert_eq!(
        (
            b["key"]["done_seq"].as_u64(),
            b["key"]["lease_owner"].as_str(),
            b["key"]["leased"].as_bool(),
            b["key"]["held_seq"].is_null(),
        ),
        (Some(1), Some("relay-x"), Some(true), true),
        "{b}"
    );
    assert!(b["key"]["lease_until"].is_string(), "{b}");
    assert_eq!(b["events"][0]["state"], "delivered", "{b}");
    assert!(b["events"][0]["dead_at"].is_null(), "{b}");
    let bt = show(&["b-2"]).await.ok();
    assert!(bt.stdout.contains("lease_owner: relay-x\n"), "{bt:?}");
    assert!(bt.stdout.contains("held:        no"), "{bt:?}");

    let missing = show(&["nope"]).await;
    assert_eq!(missing.code, 3, "{missing:?}");
    assert!(
        missing
            .stderr
            .contains("no event was published on key \"nope\" of topic \"orders.placed\""),
        "{missing:?}"
    );
    pool.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workflows_are_listed_shown_and_canceled_on_a_sqlite_file() {
    use taskq::workflow::Workflow;
    let dir = TempDir::new();
    let file = dir.0.join("wf.db");
    let url = format!("sqlite://{}", file.display());
    let d = &dir.0;
    let pool = taskq::sqlite::connect(&url).await.unwrap();
    taskq::migrate(&pool).await.unwrap();
    let first = Workflow::new("nightly")
        .step("fetch", Ping { n: 1 })
        .step_after("render", Ping { n: 2 }, ["fetch"])
        .cleanup_after("tidy", Pong(3), ["render"])
        .enqueue(&pool)
        .await
        .unwrap();
    let second = Workflow::new("hourly")
        .step("only", Ping { n: 4 })
        .enqueue(&pool)
        .await
        .unwrap();

    let list = taskq(d, &url, &["workflows", "list"]).await.ok();
    let id1 = first.id.to_string();
    let id2 = second.id.to_string();
    assert!(
        row(
            &list.stdout,
            &[
                &id1, "nightly", "running", "3", "1", "pending,", "2", "waiting"
            ]
        )
        .is_some(),
        "{list:?}"
    );
    assert!(
        row(
            &list.stdout,
            &[&id2, "hourly", "running", "1", "1", "pending"]
        )
        .is_some(),
        "{list:?}"
    );
    let pos = |s: &str| list.stdout.find(s).unwrap();
    assert!(pos("hourly") < pos("nightly"), "newest first: {list:?}");
    let json = taskq(
        d,
        &url,
        &["--json", "workflows", "list", "--name", "nightly"],
    )
    .await
    .ok()
    .json();
    let rows = json["workflows"].as_array().unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["id"], first.id.0);
    assert_eq!(rows[0]["state"], "running");
    assert_eq!(rows[0]["counts"]["waiting"], 2);

    let show = taskq(d, &url, &["workflows", "show", &id1]).await.ok();
    let render = first.task("render").unwrap().to_string();
    assert!(
        row(
            &show.stdout,
            &["render", &render, "ping", "default", "waiting", "fetch"]
        )
        .is_some(),
        "{show:?}"
    );
    assert!(
        show.stdout.contains("(cleanup: whatever their end)"),
        "{show:?}"
    );

    let cancel = taskq(d, &url, &["workflows", "cancel", &id1]).await.ok();
    assert!(
        cancel.stdout.contains(&format!(
            "workflow {id1} canceled: 3 steps canceled, 0 running"
        )),
        "{cancel:?}"
    );
    let client = Client::new(pool.clone());
    let after = client.workflow(first.id).await.unwrap();
    assert_eq!(after.state, taskq::workflow::WorkflowState::Canceled);
    let audit = taskq(d, &url, &["--json", "audit"]).await.ok().json();
    assert!(
        audit.to_string().contains("workflow_cancel"),
        "the cancel is audited: {audit}"
    );
    let missing = taskq(d, &url, &["workflows", "show", "999"]).await;
    assert_eq!(missing.code, 3, "{missing:?}");
    assert!(
        missing.stderr.contains("workflow 999 not found"),
        "{missing:?}"
    );
    pool.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_are_listed_shown_and_canceled_on_a_sqlite_file() {
    use taskq::batch::Batch;
    let dir = TempDir::new();
    let file = dir.0.join("batch.db");
    let url = format!("sqlite://{}", file.display());
    let d = &dir.0;
    let pool = taskq::sqlite::connect(&url).await.unwrap();
    taskq::migrate(&pool).await.unwrap();
    let first = Batch::new("import")
        .add_all([Ping { n: 1 }, Ping { n: 2 }, Ping { n: 3 }])
        .on_complete(Pong(9))
        .enqueue(&pool)
        .await
        .unwrap();
    let second = Batch::new("export")
        .add(Ping { n: 4 })
        .open()
        .enqueue(&pool)
        .await
        .unwrap();
    let (id1, id2) = (first.id.to_string(), second.id.to_string());

    let list = taskq(d, &url, &["batches", "list"]).await.ok();
    assert!(
        row(
            &list.stdout,
            &[&id1, "import", "running", "3", "0", "0", "3"]
        )
        .is_some(),
        "{list:?}"
    );
    assert!(
        row(&list.stdout, &[&id2, "export", "open", "1", "0", "0", "1"]).is_some(),
        "{list:?}"
    );
    let pos = |s: &str| list.stdout.find(s).unwrap();
    assert!(pos("export") < pos("import"), "newest first: {list:?}");
    let json = taskq(d, &url, &["--json", "batches", "list", "--name", "import"])
        .await
        .ok()
        .json();
    let rows = json["batches"].as_array().unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(
        (
            rows[0]["id"].as_u64(),
            rows[0]["state"].as_str(),
            rows[0]["pending"].as_u64()
        ),
        (Some(first.id.0), Some("running"), Some(3))
    );

    let show = taskq(d, &url, &["batches", "show", &id1]).await.ok();
    let member = first.tasks[1].to_string();
    assert!(
        row(&show.stdout, &[&member, "ping", "default", "pending"]).is_some(),
        "{show:?}"
    );
    let callback = first.on_complete.unwrap().to_string();
    assert!(
        show.stdout
            .contains(&format!("on_complete task: {callback}")),
        "{show:?}"
    );

    let cancel = taskq(d, &url, &["batches", "cancel", &id1]).await.ok();
    assert!(
        cancel.stdout.contains(&format!(
            "batch {id1} canceled: 3 members canceled, 0 running members asked to cancel, 1 callbacks canceled"
        )),
        "{cancel:?}"
    );
    let after = Client::new(pool.clone()).batch(first.id).await.unwrap();
    assert_eq!(
        (after.state, after.failed),
        (taskq::batch::BatchState::Canceled, 3)
    );
    let audit = taskq(d, &url, &["--json", "audit"]).await.ok().json();
    assert!(
        audit.to_string().contains("batch_cancel"),
        "the cancel is audited: {audit}"
    );
    let missing = taskq(d, &url, &["batches", "show", "999"]).await;
    assert_eq!(missing.code, 3, "{missing:?}");
    assert!(
        missing.stderr.contains("batch 999 not found"),
        "{missing:?}"
    );
    pool.close().await;
}
