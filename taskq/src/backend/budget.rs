//! The statement byte budget (see `taskq_driver::budget`).

pub(crate) use taskq_driver::budget::*;
