use taskq::{TaskContext, TaskError};

// A misspelled payload parameter.
#[taskq::task(unique(by = [ordr_id]))]
async fn export(order_id: i64, note: String) -> Result<(), TaskError> {
    let _ = (order_id, note);
    Ok(())
}

// An injected parameter is not part of the payload.
#[taskq::task(unique(by = [order_id, cx]))]
async fn ship(order_id: i64, cx: TaskContext) -> Result<(), TaskError> {
    let _ = (order_id, cx);
    Ok(())
}

// A field that serde may leave out.
#[taskq::task(unique(by = [coupon]))]
async fn bill(order_id: i64, #[serde(skip_serializing_if = "Option::is_none")] coupon: Option<String>) -> Result<(), TaskError> {
    let _ = (order_id, coupon);
    Ok(())
}

// Names, not strings.
#[taskq::task(unique(by = ["order_id"]))]
async fn notify(order_id: i64) -> Result<(), TaskError> {
    let _ = order_id;
    Ok(())
}

fn main() {}
