//! The bottom of taskq: what its runtime and its database drivers share, with no SQL and no
//! runtime in it.
//!
//! - [`state`]: a task's id and state, the vocabulary of every row.
//! - [`read`]: what the runtime reads back and hands to users as it is (a task row, counts per
//!   queue and state or per name, a schedule row), and the rules that derive more from a row.
//! - [`rows`]: the typed rows the runtime and the drivers exchange (a task to insert, a claimed
//!   task, an attempt's outcome to write back, an expired lease to reap...).
//! - [`event`]: the rows of events and the relay's keys (the outbox), and their rules.
//! - [`budget`]: how many bytes one multi-row statement carries, one rule for every driver.
//! - [`rules`]: the other decisions every driver makes the same way (what a queue's limits
//!   let a claim take).
//! - [`pool`]: how the runtime wants a worker's pools set up.
//! - [`driver`]: the seam itself, one trait per table or job; every driver implements them all.
//! - [`dynamic`]: the seam as trait objects, implemented for every driver: how the runtime,
//!   compiled once, calls the driver of whichever pool it is given.
//!
//! Users depend on `taskq`, which re-exports what they name (`taskq::TaskId`,
//! `taskq::client::TaskInfo`...). Everything else here is taskq's internal interface: not
//! semver-stable.

pub mod budget;
pub mod driver;
pub mod dynamic;
pub mod event;
pub mod pool;
pub mod read;
pub mod rows;
pub mod rules;
pub mod state;
