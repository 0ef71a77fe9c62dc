use taskq::TaskError;

/// Not `Serialize`: it cannot be stored as the task's output.
#[derive(Debug)]
struct Totals {
    orders: u64,
}

#[taskq::task]
async fn count_orders(day: String) -> Result<Totals, TaskError> {
    let _ = day;
    Ok(Totals { orders: 3 })
}

fn main() {}
