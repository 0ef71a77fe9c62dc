//! Runs the example against the local NATS server (`NATS_URL`, default 127.0.0.1:4222) and
//! checks what it printed. Without a NATS server: `SKIPPED nats: ...`, unless
//! `TASKQ_REQUIRE_BROKERS` is set.

use std::process::Command;

#[test]
fn the_example_commits_relays_and_bills_each_order_once() {
    let url = std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
    let addr = url.trim_start_matches("nats://").to_owned();
    if std::net::TcpStream::connect(&addr).is_err() {
        assert!(
            std::env::var_os("TASKQ_REQUIRE_BROKERS").is_none(),
            "no NATS server at {addr}"
        );
        eprintln!(
            "SKIPPED nats: the_example_commits_relays_and_bills_each_order_once: no NATS at {addr}"
        );
        return;
    }
    let out = Command::new(env!("CARGO_BIN_EXE_example-outbox"))
        .env("NATS_URL", &url)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for line in [
        "order 4 rolled back: its event",
        "before the relay: topic orders.placed: 3 pending",
        "relay: every committed event is delivered",
        "seen before, skipped",
        r#"billing has 3 invoices: [(1, "ada", 1250), (2, "bob", 990), (3, "ada", 4200)]"#,
        "done",
    ] {
        assert!(stdout.contains(line), "{line:?} missing in:\n{stdout}");
    }
    assert_eq!(
        stdout.matches("billing: invoiced order").count(),
        3,
        "{stdout}"
    );
}
