// An event is published as its JSON: it must derive `serde::Serialize`.
#[taskq::event(topic = "orders.placed", key = order_id)]
struct OrderPlaced {
    order_id: i64,
}

fn main() {}
