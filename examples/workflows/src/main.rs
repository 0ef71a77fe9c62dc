use std::time::Duration;

use taskq::workflow::{Workflow, WorkflowId, WorkflowState};
use taskq::{Client, TaskError};

/// Reads a day's orders (here: prints).
#[taskq::task(queue = "reports")]
async fn fetch_orders(day: String) -> Result<(), TaskError> {
    println!("fetch: orders of {day}");
    Ok(())
}

/// Renders the report; runs after `fetch`.
#[taskq::task(queue = "reports")]
async fn render_report(day: String) -> Result<(), TaskError> {
    println!("render: report of {day}");
    Ok(())
}

/// Prices the orders; runs after `fetch`, beside `render`.
#[taskq::task(queue = "reports")]
async fn price_orders(day: String) -> Result<(), TaskError> {
    println!("price: orders of {day}");
    Ok(())
}

/// Mails the report; runs once both `render` and `price` have succeeded. It fails for good
/// on a day without a recipient, to show what a failure does.
#[taskq::task(queue = "reports", max_attempts = 1)]
async fn mail_report(day: String, to: Option<String>) -> Result<(), TaskError> {
    match to {
        Some(to) => {
            println!("mail: report of {day} to {to}");
            Ok(())
        }
        None => Err(TaskError::permanent(format!("no recipient for {day}"))),
    }
}

/// Removes the day's scratch files; runs after `mail` however it ended.
#[taskq::task(queue = "reports")]
async fn tidy_up(day: String) -> Result<(), TaskError> {
    println!("tidy: scratch files of {day}");
    Ok(())
}

/// fetch → (render, price) → mail, and tidy after mail whatever happened.
fn report(day: &str, to: Option<&str>) -> Workflow {
    let day = day.to_string();
    Workflow::new(format!("report-{day}"))
        .step("fetch", FetchOrders { day: day.clone() })
        .step_after("render", RenderReport { day: day.clone() }, ["fetch"])
        .step_after("price", PriceOrders { day: day.clone() }, ["fetch"])
        .step_after(
            "mail",
            MailReport {
                day: day.clone(),
                to: to.map(String::from),
            },
            ["render", "price"],
        )
        .cleanup_after("tidy", TidyUp { day }, ["mail"])
}

/// Resolves once every workflow of `ids` has ended (or cannot be read).
async fn ended(client: Client, ids: [WorkflowId; 2]) {
    for id in ids {
        while client
            .workflow(id)
            .await
            .is_ok_and(|w| w.state == WorkflowState::Running)
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| "sqlite://workflows.db".into());
    let pool = taskq::sqlite::connect(&url).await?;
    taskq::migrate(&pool).await?;

    // Both workflows in one transaction: committed together, or neither.
    let mut tx = taskq::sqlite::begin(&pool).await?;
    let good = report("2026-12-01", Some("ops@example.com"))
        .enqueue_tx(&mut tx)
        .await?;
    let bad = report("2026-12-02", None).enqueue_tx(&mut tx).await?;
    tx.commit().await?;

    let client = Client::new(pool.clone());
    // A service runs its worker until SIGTERM; this program stops it once both have ended.
    taskq::Worker::builder(pool.clone())
        .register_all()
        .shutdown_signal(ended(client.clone(), [good.id, bad.id]))
        .build()?
        .run()
        .await?;

    for id in [good.id, bad.id] {
        let wf = client.workflow(id).await?;
        println!("{}: {}", wf.name, wf.state);
        for s in client.workflow_steps(id).await? {
            println!("  {:<6} {}", s.step, s.state);
        }
    }
    Ok(())
}
