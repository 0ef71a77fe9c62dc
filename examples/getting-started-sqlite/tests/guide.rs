//! The SQLite half of docs/getting-started.md is this crate: its program is `src/main.rs`
//! verbatim, its dependency list is this crate's, and the program runs end to end on a
//! SQLite file (no server).

use std::process::Command;

use taskq_tests::backends::SqliteFile;

const GUIDE: &str = include_str!("../../../docs/getting-started.md");
const MAIN_RS: &str = include_str!("../src/main.rs");
const CARGO_TOML: &str = include_str!("../Cargo.toml");

/// The text of every fenced block of `lang` in the guide.
fn blocks(lang: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current: Option<String> = None;
    for line in GUIDE.lines() {
        match &mut current {
            None if line.trim_start().starts_with("```")
                && line.trim_start().trim_start_matches('`') == lang =>
            {
                current = Some(String::new());
            }
            Some(_) if line.trim_start() == "```" => out.push(current.take().unwrap()),
            Some(text) => {
                text.push_str(line);
                text.push('\n');
            }
            None => {}
        }
    }
    out
}

#[test]
fn the_guide_shows_this_program_verbatim() {
    assert!(
        blocks("rust").iter().any(|b| b == MAIN_RS),
        "docs/getting-started.md must contain examples/getting-started-sqlite/src/main.rs verbatim in a ```rust block"
    );
}

#[test]
fn the_guide_lists_exactly_the_dependencies_this_program_builds_with() {
    let toml = blocks("toml");
    let deps = toml
        .iter()
        .find(|b| b.contains("[dependencies]") && b.contains("\"sqlite\""))
        .expect("a [dependencies] block for SQLite");
    let ours: Vec<&str> = CARGO_TOML
        .split("[dependencies]")
        .nth(1)
        .unwrap()
        .split("\n[")
        .next()
        .unwrap()
        .lines()
        .filter(|l| l.contains(" = "))
        .collect();
    let theirs: Vec<&str> = deps.lines().filter(|l| l.contains(" = ")).collect();
    assert_eq!(ours.len(), theirs.len(), "{ours:?} vs {theirs:?}");
    for (o, t) in ours.iter().zip(&theirs) {
        if o.starts_with("taskq ") {
            assert_eq!(
                *t,
                "taskq = { git = \"https://github.com/taskq-rs/taskq\", features = [\"sqlite\"] }"
            );
        } else {
            assert_eq!(o, t);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_program_runs_end_to_end_on_a_sqlite_file() {
    let file = SqliteFile::new();
    let url = format!("sqlite://{}", file.path.display());
    let out = Command::new(env!("CARGO_BIN_EXE_example-getting-started-sqlite"))
        .env("DATABASE_URL", &url)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run the program");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    for line in [
        "signed up users [1, 2]",
        "sending the welcome mail to ada@example.com",
        "sending the welcome mail to grace@example.com",
        "worker stopped: 2 tasks succeeded",
    ] {
        assert!(stdout.contains(line), "missing {line:?} in:\n{stdout}");
    }
    let pool = taskq::sqlite::open(&file.path).await.unwrap();
    let welcomed: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM users WHERE welcomed_at IS NOT NULL")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(welcomed, 2);
    let succeeded: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM taskq_tasks WHERE state = 'succeeded' AND attempt = 1",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(succeeded, 2);
    pool.close().await;
}
