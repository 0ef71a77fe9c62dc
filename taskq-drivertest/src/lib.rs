//! taskq's driver test suite: the behaviour of the driver seam (`taskq_driver::driver`),
//! written once and run by every driver, the way River proves its drivers with
//! `riverdrivertest`.
//!
//! Each `pub async fn <behaviour>(d: D)` takes a driver handle `D: Driver` on an empty
//! database with taskq's schema, inserts what it needs through the seam's own producer path
//! ([`Enqueue::task_insert`](taskq_driver::driver::Enqueue::task_insert) and
//! [`task_insert_rows`](taskq_driver::driver::Enqueue::task_insert_rows), on a connection from
//! `d.pool().acquire()`), calls the operations under test and asserts what they return and
//! the rows they leave (states, attempts, epochs, times, counts) as read back through the seam.
//! No SQL here: a test that needs time to pass waits on the database clock
//! ([`Enqueue::db_clock_us`](taskq_driver::driver::Enqueue::db_clock_us)), and leases meant to
//! expire are a microsecond long.
//!
//! The tests run from taskq's `tests` crate (`tests/driver.rs`), once per driver, on a fresh
//! database each:
//!
//! ```text
//! TASKQ_REQUIRE_MYSQL=1 cargo test -p taskq-tests --test driver
//! ```
//!
//! Where the drivers differ in a way the documentation allows, the test says so in a
//! `DRIVERS DIFFER:` comment and asserts what both must do; where they disagree with the
//! documentation, a `DISAGREES:` comment marks the assertion.

mod actions;
mod batches;
mod claims;
mod clock;
mod enqueue;
mod events;
pub mod fixtures;
mod history;
mod leases;
mod ordered;
mod pending;
mod queues;
mod reads;
mod schedules;
mod support;
mod unique;
mod workers;
mod workflows;

pub use actions::*;
pub use batches::*;
pub use claims::*;
pub use clock::*;
pub use enqueue::*;
pub use events::*;
pub use history::*;
pub use leases::*;
pub use ordered::*;
pub use pending::*;
pub use queues::*;
pub use reads::*;
pub use schedules::*;
pub use unique::*;
pub use workers::*;
pub use workflows::*;
