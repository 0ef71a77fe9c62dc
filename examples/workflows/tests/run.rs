//! docs/workflows.md shows this crate's program verbatim, and the program runs end to end on a
//! SQLite file: one workflow succeeds step by step, each step reading what the steps it runs after
//! returned, the other fails at `mail` and still tidies up.

use std::process::Command;

use taskq_tests::backends::SqliteFile;

const GUIDE: &str = include_str!("../../../docs/workflows.md");
const MAIN_RS: &str = include_str!("../src/main.rs");

#[test]
fn the_page_shows_this_program_verbatim() {
    let block = format!("```rust\n{MAIN_RS}```");
    assert!(
        GUIDE.contains(&block),
        "docs/workflows.md must contain examples/workflows/src/main.rs verbatim in a ```rust block"
    );
}

#[test]
fn the_program_runs_both_workflows_to_their_end() {
    let file = SqliteFile::new();
    let out = Command::new(env!("CARGO_BIN_EXE_example-workflows"))
        .env("DATABASE_URL", format!("sqlite://{}", file.path.display()))
        .output()
        .expect("run the program");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let pos = |line: &str| {
        stdout
            .find(line)
            .unwrap_or_else(|| panic!("missing {line:?} in:\n{stdout}"))
    };
    // Each workflow's steps in dependency order.
    for day in ["2026-12-01", "2026-12-02"] {
        let fetch = pos(&format!("fetch: orders of {day}"));
        assert!(fetch < pos(&format!("render: report of {day}")));
        assert!(fetch < pos(&format!("price: orders of {day}")));
        assert!(pos(&format!("tidy: scratch files of {day}")) > fetch);
    }
    // Each step read what the step it runs after returned.
    pos("render: report of 2026-12-01 (3 orders)");
    pos("price: orders of 2026-12-01: 245");
    let mail = pos("mail: report of 2026-12-01 to ops@example.com, total 245");
    assert!(mail > pos("render: report of 2026-12-01"));
    assert!(mail > pos("price: orders of 2026-12-01"));
    assert!(pos("tidy: scratch files of 2026-12-01") > mail);
    assert!(!stdout.contains("mail: report of 2026-12-02"));
    let summary = &stdout[pos("report-2026-12-01: succeeded")..];
    for line in [
        "report-2026-12-01: succeeded",
        "report-2026-12-02: failed",
        r#"  fetch  succeeded {"day":"2026-12-01","totals":[120,80,45]}"#,
        "  price  succeeded 245",
        "  mail   dead\n",
        "  tidy   succeeded\n",
        "total of 2026-12-01: Some(245)",
    ] {
        assert!(summary.contains(line), "missing {line:?} in:\n{summary}");
    }
}
