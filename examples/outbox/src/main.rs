//! The outbox end to end, on SQLite files and a NATS JetStream server (nothing else):
//!
//! 1. **Order service** (`orders.db`): each order's row and its `OrderPlaced` event are
//!    written in one transaction (`publish_tx`). One order's transaction rolls back: neither
//!    its row nor its event exists.
//! 2. **Relay**: delivers the committed events to JetStream (stream `TASKQ_EXAMPLE_ORDERS`,
//!    subjects `orders.>`, created here), in commit order per order, each with its stable
//!    message id as `Nats-Msg-Id`.
//! 3. **Billing consumer** (`billing.db`, its own database): pulls the messages and, in one
//!    transaction per message, records the message id in its inbox and writes the invoice only
//!    the first time; a redelivered message changes nothing.
//!
//! ```sh
//! cargo run -p example-outbox                     # NATS at nats://127.0.0.1:4222
//! NATS_URL=nats://host:4222 cargo run -p example-outbox
//! ```
//!
//! The databases go to a fresh directory under the system's temporary directory (printed,
//! removed at the end), or to `EXAMPLE_DIR` (kept). The stream is deleted at the end.

use std::time::Duration;

use futures_util::StreamExt;
use taskq::Client;
use taskq::inbox::{Inbox, Seen};
use taskq::outbox::nats::NatsSink;
use taskq::outbox::nats::async_nats::{self, jetstream};
use taskq::outbox::{Event, Relay};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// An order was placed: published on `orders.placed`, keyed by the order (its events reach
/// the broker in commit order).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[taskq::event(topic = "orders.placed", key = order_id)]
struct OrderPlaced {
    order_id: i64,
    customer: String,
    total_cents: i64,
}

const STREAM: &str = "TASKQ_EXAMPLE_ORDERS";

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let nats_url = std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
    let (dir, temporary) = match std::env::var_os("EXAMPLE_DIR") {
        Some(d) => (std::path::PathBuf::from(d), false),
        None => {
            let name = format!("taskq-outbox-example-{:08x}", fastrand::u32(..));
            (std::env::temp_dir().join(name), true)
        }
    };
    std::fs::create_dir_all(&dir)?;
    println!("databases in {}", dir.display());

    // JetStream: a stream for the order events (replaced if a former run left one).
    let nats = async_nats::connect(&nats_url)
        .await
        .map_err(|e| format!("cannot connect to NATS at {nats_url} (set NATS_URL): {e}"))?;
    let js = jetstream::new(nats);
    js.delete_stream(STREAM).await.ok();
    let config = jetstream::stream::Config {
        name: STREAM.into(),
        subjects: vec!["orders.>".into()],
        ..Default::default()
    };
    // A busy server can refuse a creation for a moment (nats-server 2.9 answered "error creating
    // store for stream" while another client deleted streams): try up to three times.
    let mut tries = 0;
    let stream = loop {
        match js.create_stream(config.clone()).await {
            Ok(stream) => break stream,
            Err(e) if tries < 2 => {
                tries += 1;
                eprintln!("creating the JetStream stream failed ({e}); trying again");
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
            Err(e) => {
                return Err(format!(
                    "cannot create the JetStream stream (is JetStream enabled?): {e}"
                )
                .into());
            }
        }
    };
    println!("stream {STREAM} created (subjects orders.>)");

    let orders = order_service(&dir).await?;
    relay(&orders, NatsSink::new(js.clone())).await?;
    let result = billing(&dir, &stream).await;
    js.delete_stream(STREAM).await.ok();
    result?;
    orders.close().await;
    if temporary {
        std::fs::remove_dir_all(&dir).ok();
    }
    println!("done");
    Ok(())
}

/// The order service: orders and their events, committed together.
async fn order_service(dir: &std::path::Path) -> Result<sqlx::SqlitePool, BoxError> {
    let pool =
        taskq::sqlite::connect(&format!("sqlite://{}", dir.join("orders.db").display())).await?;
    taskq::migrate(&pool).await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS orders (
             id INTEGER PRIMARY KEY, customer TEXT NOT NULL, total_cents INTEGER NOT NULL)",
    )
    .execute(&pool)
    .await?;
    let placed = [
        (1, "ada", 1_250),
        (2, "bob", 990),
        (3, "ada", 4_200),
        (4, "cy", 15),
    ];
    for (order_id, customer, total_cents) in placed {
        // BEGIN IMMEDIATE: the order and its event in one transaction.
        let mut tx = taskq::sqlite::begin(&pool).await?;
        sqlx::query("INSERT INTO orders (id, customer, total_cents) VALUES (?, ?, ?)")
            .bind(order_id)
            .bind(customer)
            .bind(total_cents)
            .execute(&mut *tx)
            .await?;
        let event = OrderPlaced {
            order_id,
            customer: customer.into(),
            total_cents,
        };
        let published = event.publish_tx(&mut tx).await?;
        if order_id == 4 {
            // Payment declined: the transaction rolls back, and the event with it.
            tx.rollback().await?;
            println!(
                "order 4 rolled back: its event {} was never committed",
                published.message_id
            );
            continue;
        }
        tx.commit().await?;
        println!(
            "order {order_id} committed with event {} (topic {}, key {}, seq {})",
            published.message_id,
            event.topic(),
            event.key(),
            published.seq
        );
    }
    Ok(pool)
}

/// The relay: rounds until every committed event is delivered; the operator's view before
/// and after.
async fn relay(pool: &sqlx::SqlitePool, sink: NatsSink) -> Result<(), BoxError> {
    let client = Client::new(pool.clone());
    for t in client.event_stats().await? {
        println!(
            "before the relay: topic {}: {} pending, oldest {:.1}s old",
            t.topic,
            t.pending,
            t.lag.as_secs_f64()
        );
    }
    let relay = Relay::builder(pool.clone(), sink)
        .topics(["orders.placed"])
        .build()?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let round = relay.run_once().await?;
        if round.published > 0 {
            println!(
                "relay round: {} keys, {} published, {} delivered",
                round.keys, round.published, round.delivered
            );
        }
        let pending: u64 = client.event_stats().await?.iter().map(|t| t.pending).sum();
        if pending == 0 {
            break;
        }
        if tokio::time::Instant::now() > deadline {
            return Err(format!("{pending} events still pending after 30 s").into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!("relay: every committed event is delivered");
    Ok(())
}

/// The billing consumer: its own database, an invoice per order, once per message id.
async fn billing(
    dir: &std::path::Path,
    stream: &jetstream::stream::Stream,
) -> Result<(), BoxError> {
    let pool =
        taskq::sqlite::connect(&format!("sqlite://{}", dir.join("billing.db").display())).await?;
    taskq::migrate(&pool).await?; // the inbox's table
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS invoices (
             order_id INTEGER PRIMARY KEY, customer TEXT NOT NULL, amount_cents INTEGER NOT NULL)",
    )
    .execute(&pool)
    .await?;
    let inbox = Inbox::new("billing");
    let consumer = stream
        .create_consumer(jetstream::consumer::pull::Config {
            durable_name: Some("billing".into()),
            ..Default::default()
        })
        .await?;
    let mut messages = consumer
        .fetch()
        .max_messages(100)
        .expires(Duration::from_secs(1))
        .messages()
        .await?;
    let mut first = None;
    while let Some(m) = messages.next().await {
        let m = m?;
        let id = message_id(&m)?;
        match handle(&pool, &inbox, &id, &m.payload).await {
            Ok(()) => m.ack().await?,
            // A lost conflict, or the database unreachable for now: `handle` rolled its
            // transaction back, so nothing of the message took effect. Nak it: JetStream
            // delivers it again to a later pull of the consumer `billing` (this example pulls
            // once; a long-running consumer pulls again), and the next message goes on.
            Err(e) if is_retryable(&*e) => {
                eprintln!("billing: message {id} failed ({e}); nak for redelivery");
                m.ack_with(jetstream::AckKind::Nak(None)).await?;
                continue;
            }
            Err(e) => return Err(e),
        }
        first.get_or_insert((id, m.payload.clone()));
    }
    // At-least-once: the same message can come again (a lost ack, a relay's re-publish).
    if let Some((id, payload)) = first {
        println!("a redelivery of {id}:");
        handle(&pool, &inbox, &id, &payload).await?;
    }
    let invoices: Vec<(i64, String, i64)> =
        sqlx::query_as("SELECT order_id, customer, amount_cents FROM invoices ORDER BY order_id")
            .fetch_all(&pool)
            .await?;
    println!("billing has {} invoices: {invoices:?}", invoices.len());
    pool.close().await;
    Ok(())
}

/// Whether a delivery that failed with `e` may succeed when redelivered: a database error
/// that `taskq::Error::is_retryable()` says so of. Anything else (a payload that does not
/// parse, a constraint broken) would fail again.
fn is_retryable(e: &(dyn std::error::Error + Send + Sync + 'static)) -> bool {
    e.downcast_ref::<taskq::Error>()
        .is_some_and(taskq::Error::is_retryable)
}

fn message_id(m: &jetstream::Message) -> Result<String, BoxError> {
    m.headers
        .as_ref()
        .and_then(|h| h.get("Nats-Msg-Id"))
        .map(|v| v.to_string())
        .ok_or_else(|| "a message without Nats-Msg-Id".into())
}

/// One message in one transaction: the inbox record and the invoice commit together. Database
/// errors are returned as `taskq::Error`, which classifies them; on an error the transaction is
/// dropped, which rolls it back.
async fn handle(
    pool: &sqlx::SqlitePool,
    inbox: &Inbox,
    id: &str,
    payload: &[u8],
) -> Result<(), BoxError> {
    let order: OrderPlaced = serde_json::from_slice(payload)?;
    let mut tx = taskq::sqlite::begin(pool).await?;
    match inbox.record_tx(&mut tx, id).await? {
        Seen::First => {
            sqlx::query("INSERT INTO invoices (order_id, customer, amount_cents) VALUES (?, ?, ?)")
                .bind(order.order_id)
                .bind(&order.customer)
                .bind(order.total_cents)
                .execute(&mut *tx)
                .await
                .map_err(taskq::Error::from)?;
            println!(
                "billing: invoiced order {} ({} cents) for message {id}",
                order.order_id, order.total_cents
            );
        }
        Seen::Again => println!("billing: message {id} seen before, skipped"),
    }
    tx.commit().await.map_err(taskq::Error::from)?;
    Ok(())
}
