// A key field must implement `Display`.
#[derive(serde::Serialize)]
struct OrderId(i64);

#[derive(serde::Serialize)]
#[taskq::event(topic = "orders.placed", key = order_id)]
struct OrderPlaced {
    order_id: OrderId,
}

#[derive(serde::Serialize)]
#[taskq::event(topic = "orders.placed", key = [tenant, order_id])]
struct TenantOrderPlaced {
    tenant: String,
    order_id: OrderId,
}

fn main() {}
