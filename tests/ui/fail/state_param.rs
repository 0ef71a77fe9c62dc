use taskq::TaskError;

#[derive(Clone)]
struct Pool;

// taskq's shared values are `Data<T>`; `State<T>` is axum's extractor (and taskq's former name).
struct State<T>(T);

#[taskq::task]
async fn send_email(to: String, db: State<Pool>) -> Result<(), TaskError> {
    let _ = (to, db.0);
    Ok(())
}

fn main() {}
