//! Retry policy: [`Backoff`], a rule of the bottom layer (`taskq_driver::rules::backoff`).

pub use taskq_driver::rules::backoff::Backoff;
pub(crate) use taskq_driver::rules::backoff::problem;
