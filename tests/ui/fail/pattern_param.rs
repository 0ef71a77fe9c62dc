use taskq::TaskError;

#[taskq::task]
async fn move_point((x, y): (i32, i32), _: String) -> Result<(), TaskError> {
    let _ = (x, y);
    Ok(())
}

fn main() {}
