// `#[taskq::task]` gives each payload struct the `with_*` enqueue options as inherent methods
// (tests/ui/pass/no_warnings.rs calls them without an import). A hand-written `impl Task` has
// them as the trait's provided methods only: called without the trait in scope, rustc names
// the import that brings them.
use taskq::TaskError;

#[derive(serde::Serialize, serde::Deserialize)]
struct OrderExport {
    order_id: i64,
}

impl taskq::Task for OrderExport {
    const NAME: &'static str = "order_export";
    async fn run(self, _cx: taskq::TaskContext) -> Result<(), TaskError> {
        Ok(())
    }
}

fn main() {
    let _ = OrderExport { order_id: 1 }.with_delay(std::time::Duration::from_secs(60));
}
