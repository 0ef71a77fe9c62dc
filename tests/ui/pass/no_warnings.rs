// The expansion compiles without warnings under strict lints, for public and private tasks,
// injected parameters in any position, and every attribute.
#![forbid(unsafe_code)]
#![deny(warnings, missing_docs, unreachable_pub)]
//! A binary that defines tasks.

use std::time::Duration;

use taskq::{CancelSignal, Data, TaskContext, TaskError};

/// Tasks of this binary.
pub mod tasks {
    use super::*;

    /// Shared HTTP client stand-in.
    #[derive(Clone)]
    pub struct Http;

    /// Sends an email.
    #[taskq::task(
        name = "send_email.v1",
        queue = "mail",
        max_attempts = 5,
        priority = -1,
        timeout = "30s",
        backoff = "exponential(1s, 10m)",
        max_snoozes = 5,
        ttl = "1h"
    )]
    pub async fn send_email(
        cx: TaskContext,
        to: String,
        http: Data<Http>,
        subject: Option<String>,
        _stop: CancelSignal,
    ) -> Result<(), TaskError> {
        let _ = (cx.id(), to, http, subject);
        Ok(())
    }
}

#[taskq::task(backoff = "constant(5s)")]
async fn private_task(n: u32) -> Result<(), std::io::Error> {
    let _ = n;
    Ok(())
}

/// A recurring task, public, with every cron attribute and an injected context.
#[taskq::task(
    cron = "0 */5 * * * *",
    timezone = "Europe/Paris",
    missed_ticks = "all(3)",
    queue = "reports"
)]
pub async fn refresh_reports(cx: TaskContext) -> Result<(), TaskError> {
    let _ = cx.id();
    Ok(())
}

#[taskq::task(cron = "@daily")]
async fn private_nightly() -> Result<(), TaskError> {
    Ok(())
}

type Outcome = Result<(), TaskError>;

/// A task's output: what its handler returns.
#[derive(serde::Serialize, serde::Deserialize)]
pub struct Totals {
    /// Orders counted.
    pub orders: u64,
}

/// A public task with an output, and a private one returning it through an alias.
#[taskq::task]
pub async fn count_orders(day: String) -> Result<Totals, TaskError> {
    let _ = day;
    Ok(Totals { orders: 3 })
}

#[taskq::task]
async fn private_output(cx: TaskContext) -> std::io::Result<Vec<String>> {
    let _ = cx.step_output::<Totals>("count").await;
    Ok(vec![cx.name().to_owned()])
}

#[taskq::task]
async fn aliased_result() -> Outcome {
    Ok(())
}

#[taskq::task(unique)]
async fn unique_payload(n: u32) -> Outcome {
    let _ = n;
    Ok(())
}

#[taskq::task(unique(by = [r#type, account], while = "running"))]
async fn unique_fields(account: u64, #[serde(rename = "kind")] r#type: String, note: String) -> Outcome {
    let _ = (account, r#type, note);
    Ok(())
}

#[taskq::task(unique(by = [], period = "10m"))]
async fn unique_window(cx: TaskContext) -> Outcome {
    let _ = cx;
    Ok(())
}

fn main() {
    let email = tasks::SendEmail {
        to: "a@example.com".into(),
        subject: None,
    };
    let _ = email.with_delay(Duration::from_secs(1));
    let _ = PrivateTask { n: 1 }.with_priority(3);
    let _ = AliasedResult {}.enqueue_options();
    let _ = UniquePayload { n: 1 }.with_unique(None);
    let _ = UniqueFields {
        account: 1,
        r#type: "a".into(),
        note: String::new(),
    }
    .with_unique(taskq::unique::Unique::payload());
    let _ = UniqueWindow {}.enqueue_options();
    let _ = CountOrders { day: "d".into() }.enqueue_options();
    let _ = PrivateOutput {}.enqueue_options();
    // Every other enqueue option, as an inherent method of the payload (no `use taskq::Task`).
    let now = chrono::Utc::now();
    let _ = PrivateTask { n: 1 }.with_run_at(now);
    let _ = PrivateTask { n: 1 }.with_idempotency_key("key");
    let _ = PrivateTask { n: 1 }.with_queue("elsewhere");
    let _ = PrivateTask { n: 1 }.with_max_attempts(2);
    let _ = PrivateTask { n: 1 }.with_deadline(now);
    let _ = PrivateTask { n: 1 }.with_ttl(Duration::from_secs(60));
    let _ = PrivateTask { n: 1 }.with_trace_context("00-trace-01");
    let _ = PrivateTask { n: 1 }.with_payload_limit(1024);
    let _ = taskq::registry::registered();
    let _ = <RefreshReports as taskq::Task>::schedule();
    let _ = <PrivateNightly as taskq::Task>::schedule();
}
