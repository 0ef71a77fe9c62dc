//! Tasks defined in a module other than the test's: they must register through `inventory`
//! and run when the worker is built from another module.

use std::sync::{Arc, Mutex};

use taskq::{CancelSignal, Data, ResultExt, TaskContext, TaskError};

/// One run of a billing handler: (task id, attempt, invoice id, memo).
pub type Charge = (u64, u32, u64, String);

/// What the billing handlers saw.
#[derive(Clone, Default)]
pub struct Ledger(pub Arc<Mutex<Vec<Charge>>>);

/// The application's own error type; `?` converts it into a retryable `TaskError`.
#[derive(Debug)]
pub struct ChargeError(pub String);

impl std::fmt::Display for ChargeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "charge failed: {}", self.0)
    }
}

impl std::error::Error for ChargeError {}

/// Charges an invoice (idempotently: it may run more than once).
#[taskq::task(queue = "macro_billing", max_attempts = 3, backoff = "constant(0s)")]
pub async fn charge_invoice(
    invoice_id: u64,
    memo: String,
    cx: TaskContext,
    Data(ledger): Data<Ledger>,
    cancel: CancelSignal,
) -> Result<(), ChargeError> {
    assert!(!cancel.is_canceled());
    ledger
        .0
        .lock()
        .unwrap()
        .push((cx.id().0, cx.attempt(), invoice_id, memo.clone()));
    if memo == "always fails" {
        return Err(ChargeError(format!(
            "card declined for invoice {invoice_id}"
        )));
    }
    Ok(())
}

/// Fails permanently on bad input: the task goes straight to `dead`.
#[taskq::task(queue = "macro_billing", max_attempts = 3)]
pub async fn parse_amount(raw: String) -> Result<(), TaskError> {
    let _cents: i64 = raw.parse().permanent()?;
    Ok(())
}
