// `#[inject]` marks a parameter of your own extractor type; misused, each error names the
// parameter and says what to write instead.
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
async fn send_email(
    #[inject] #[payload] to: String,
    #[inject(mailer)] mailer: Mailer,
    #[inject] #[serde(default)] again: Mailer,
) -> Result<(), TaskError> {
    let _ = (to, mailer, again);
    Ok(())
}

fn main() {}
