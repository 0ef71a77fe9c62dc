// The `with_*` enqueue options are provided methods of the `Task` trait, their one home
// (docs/design.md, "One home for the enqueue options"); the macro generates no copies. Called
// without the trait in scope, rustc names the import that brings them.
use taskq::TaskError;

#[taskq::task]
async fn order_export(order_id: i64) -> Result<(), TaskError> {
    let _ = order_id;
    Ok(())
}

fn main() {
    let _ = OrderExport { order_id: 1 }.with_delay(std::time::Duration::from_secs(60));
}
