// `topic` left out.
#[derive(serde::Serialize)]
#[taskq::event(key = order_id)]
struct OrderPlaced {
    order_id: i64,
}

fn main() {}
