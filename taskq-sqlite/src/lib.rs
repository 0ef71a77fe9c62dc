//! taskq's SQLite driver: [`SqliteDriver`], the handle that implements the seam's traits
//! (`taskq_driver::driver`) over this crate's statements, with the connection setup
//! ([`connect`]) and the schema's migrations ([`migrate`](mod@migrate)). The statements
//! themselves are private, one module per table or job (used by taskq's `sqlite` feature).
#![doc = include_str!("../README.md")]

mod batches;
mod clock;
pub mod connect;
mod conv;
mod driver;
mod enqueue;
mod events;
mod history;
mod identities;
mod inbox;
mod lease;
pub mod migrate;
mod order;
mod queues;
mod schedules;
mod tasks;
mod workers;
mod workflows;

#[cfg(test)]
mod tests;

pub use connect::{begin_immediate, connect_options, connect_options_from_url, open, tune};
pub use driver::{SqliteDriver, is_busy, is_refused};
pub use migrate::{migrate, migrator};
