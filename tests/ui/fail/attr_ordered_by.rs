use taskq::TaskError;

// `ordered_by` names a parameter that does not exist (a near miss).
#[taskq::task(queue = "ledger", ordered_by = [acount])]
async fn post_entry(account: i64, amount: i64) -> Result<(), TaskError> {
    let _ = (account, amount);
    Ok(())
}

// `ordered_by` with `unique`: refused.
#[taskq::task(queue = "ledger", ordered_by = [account], unique)]
async fn post_once(account: i64) -> Result<(), TaskError> {
    let _ = account;
    Ok(())
}

// `ordered_dead_after` without `ordered_by`, and with `max_attempts`.
#[taskq::task(ordered_dead_after = 3, max_attempts = 5)]
async fn lenient(account: i64) -> Result<(), TaskError> {
    let _ = account;
    Ok(())
}

// `ordered_by` takes identifiers, not strings.
#[taskq::task(ordered_by = ["account"])]
async fn quoted(account: i64) -> Result<(), TaskError> {
    let _ = account;
    Ok(())
}

fn main() {}
