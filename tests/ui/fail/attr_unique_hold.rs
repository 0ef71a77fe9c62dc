use taskq::TaskError;

#[taskq::task(unique(while = "finished"))]
async fn a(id: i64) -> Result<(), TaskError> {
    let _ = id;
    Ok(())
}

#[taskq::task(unique(period = "10"))]
async fn b(id: i64) -> Result<(), TaskError> {
    let _ = id;
    Ok(())
}

#[taskq::task(unique(period = "0s"))]
async fn c(id: i64) -> Result<(), TaskError> {
    let _ = id;
    Ok(())
}

#[taskq::task(unique(while = "running", period = "10m"))]
async fn d(id: i64) -> Result<(), TaskError> {
    let _ = id;
    Ok(())
}

fn main() {}
