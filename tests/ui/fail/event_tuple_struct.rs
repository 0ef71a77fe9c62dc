// A tuple struct has no field names for `key`.
#[derive(serde::Serialize)]
#[taskq::event(topic = "orders.placed", key = order_id)]
struct OrderPlaced(i64, i64);

// A unit struct has no fields at all.
#[derive(serde::Serialize)]
#[taskq::event(topic = "orders.placed", key = order_id)]
struct Ping;

fn main() {}
