// `key` names a field the struct does not have (a near miss).
#[derive(serde::Serialize)]
#[taskq::event(topic = "orders.placed", key = oder_id)]
struct OrderPlaced {
    order_id: i64,
    total_cents: i64,
}

// One of several key fields is unknown, another is listed twice.
#[derive(serde::Serialize)]
#[taskq::event(topic = "orders.placed", key = [tenant, account, tenant])]
struct TenantOrderPlaced {
    tenant: String,
    order_id: i64,
}

// `key` takes identifiers, not strings, and at least one.
#[derive(serde::Serialize)]
#[taskq::event(topic = "orders.placed", key = "order_id")]
struct Quoted {
    order_id: i64,
}

#[derive(serde::Serialize)]
#[taskq::event(topic = "orders.placed", key = [])]
struct NoKey {
    order_id: i64,
}

fn main() {}
