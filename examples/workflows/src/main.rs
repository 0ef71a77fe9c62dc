use std::time::Duration;

use serde::{Deserialize, Serialize};
use taskq::workflow::{Workflow, WorkflowId};
use taskq::{Client, TaskContext, TaskError};

/// A day's orders: what `fetch` returns to the steps after it.
#[derive(Debug, Serialize, Deserialize)]
struct Orders {
    day: String,
    totals: Vec<u32>,
}

/// Reads a day's orders (here: made up). What it returns is its output, stored with its
/// success.
#[taskq::task(queue = "reports")]
async fn fetch_orders(day: String) -> Result<Orders, TaskError> {
    println!("fetch: orders of {day}");
    Ok(Orders {
        day,
        totals: vec![120, 80, 45],
    })
}

/// Renders the report from the orders `fetch` returned; runs after `fetch`.
#[taskq::task(queue = "reports")]
async fn render_report(cx: TaskContext) -> Result<(), TaskError> {
    let orders: Orders = cx
        .step_output("fetch")
        .await?
        .expect("fetch returns orders");
    let n = orders.totals.len();
    println!("render: report of {} ({n} orders)", orders.day);
    Ok(())
}

/// Prices the orders `fetch` returned; runs after `fetch`, beside `render`. Returns the total.
#[taskq::task(queue = "reports")]
async fn price_orders(cx: TaskContext) -> Result<u32, TaskError> {
    let orders: Orders = cx
        .step_output("fetch")
        .await?
        .expect("fetch returns orders");
    let total = orders.totals.iter().sum();
    println!("price: orders of {}: {total}", orders.day);
    Ok(total)
}

/// Mails the report with the total `price` returned; runs once both `render` and `price` have
/// succeeded. It fails for good on a day without a recipient, to show what a failure does.
#[taskq::task(queue = "reports", max_attempts = 1)]
async fn mail_report(day: String, to: Option<String>, cx: TaskContext) -> Result<(), TaskError> {
    let total: u32 = cx.step_output("price").await?.unwrap_or_default();
    match to {
        Some(to) => {
            println!("mail: report of {day} to {to}, total {total}");
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
        .step_after("render", RenderReport {}, ["fetch"])
        .step_after("price", PriceOrders {}, ["fetch"])
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
        let _ = client.wait_workflow(id, Duration::from_secs(60)).await;
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
            let output = s.output.as_deref().unwrap_or("");
            println!(
                "{}",
                format!("  {:<6} {:<9} {output}", s.step, s.state).trim_end()
            );
        }
    }
    // A task's output, awaited by id (here it has ended already).
    let price = good.task("price").expect("a step of the workflow");
    let total: Option<u32> = client.wait_output(price, Duration::from_secs(5)).await?;
    println!("total of 2026-12-01: {total:?}");
    Ok(())
}
