// An extractor of your own (it implements `FromTaskContext`, not serde) without `#[inject]`
// is classified as payload by the macro (a macro sees names, not traits); the error says to
// mark it, pointing at the parameter.
use taskq::TaskError;
use taskq::context::FromTaskContext;

#[derive(Clone)]
struct Mailer;

impl FromTaskContext for Mailer {
    fn from_task_context(_: &taskq::TaskContext) -> Result<Self, TaskError> {
        Ok(Mailer)
    }
}

#[taskq::task]
async fn send_email(to: String, mailer: Mailer) -> Result<(), TaskError> {
    let _ = (to, mailer);
    Ok(())
}

fn main() {}
