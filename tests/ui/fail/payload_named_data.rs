// A payload type of yours named like one of taskq's extractors is injected by default; the
// error says to mark it `#[payload]`.
use taskq::TaskError;

#[derive(Clone, serde::Serialize, serde::Deserialize)]
struct Data {
    rows: Vec<u32>,
}

#[taskq::task]
async fn import_rows(data: Data) -> Result<(), TaskError> {
    let _ = data.rows;
    Ok(())
}

fn main() {}
