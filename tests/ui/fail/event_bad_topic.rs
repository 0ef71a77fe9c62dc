// An empty topic.
#[derive(serde::Serialize)]
#[taskq::event(topic = "", key = order_id)]
struct Empty {
    order_id: i64,
}

// Control characters, surrounding whitespace, not a string literal.
#[derive(serde::Serialize)]
#[taskq::event(topic = "orders\tplaced", key = order_id)]
struct Tab {
    order_id: i64,
}

#[derive(serde::Serialize)]
#[taskq::event(topic = " orders.placed", key = order_id)]
struct Space {
    order_id: i64,
}

const TOPIC: &str = "orders.placed";

#[derive(serde::Serialize)]
#[taskq::event(topic = TOPIC, key = order_id)]
struct Constant {
    order_id: i64,
}

fn main() {}

// Longer than 255 bytes.
#[derive(serde::Serialize)]
#[taskq::event(topic = "oooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooo", key = order_id)]
struct Long {
    order_id: i64,
}
