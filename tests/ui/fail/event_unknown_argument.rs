// A misspelt argument.
#[derive(serde::Serialize)]
#[taskq::event(topik = "orders.placed", key = order_id)]
struct Misspelt {
    order_id: i64,
}

// An argument the macro does not have.
#[derive(serde::Serialize)]
#[taskq::event(topic = "orders.placed", key = order_id, queue = "orders")]
struct Extra {
    order_id: i64,
}

// An argument given twice, and one without a value.
#[derive(serde::Serialize)]
#[taskq::event(topic = "orders.placed", topic = "orders.shipped", key = order_id)]
struct Twice {
    order_id: i64,
}

#[derive(serde::Serialize)]
#[taskq::event(topic = "orders.placed", key)]
struct Bare {
    order_id: i64,
}

fn main() {}
