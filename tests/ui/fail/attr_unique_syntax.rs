use taskq::TaskError;

#[taskq::task(unique = true)]
async fn a(id: i64) -> Result<(), TaskError> {
    let _ = id;
    Ok(())
}

#[taskq::task(unique(bye = [id]))]
async fn b(id: i64) -> Result<(), TaskError> {
    let _ = id;
    Ok(())
}

#[taskq::task(unique, queue = "q", unique(while = "running"))]
async fn c(id: i64) -> Result<(), TaskError> {
    let _ = id;
    Ok(())
}

fn main() {}
