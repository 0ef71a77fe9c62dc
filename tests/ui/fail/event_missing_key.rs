// `key` left out.
#[derive(serde::Serialize)]
#[taskq::event(topic = "orders.placed")]
struct OrderPlaced {
    order_id: i64,
}

// Neither: both are reported.
#[derive(serde::Serialize)]
#[taskq::event]
struct OrderShipped {
    order_id: i64,
}

fn main() {}
