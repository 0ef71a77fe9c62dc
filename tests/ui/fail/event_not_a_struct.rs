// On an enum.
#[derive(serde::Serialize)]
#[taskq::event(topic = "orders.placed", key = order_id)]
enum OrderEvent {
    Placed { order_id: i64 },
}

// On a function.
#[taskq::event(topic = "orders.placed", key = order_id)]
fn order_placed(order_id: i64) {
    let _ = order_id;
}

fn main() {}
