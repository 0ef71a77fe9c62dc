//! The row types of the backend seam (see `taskq_driver::rows`).

pub(crate) use taskq_driver::rows::*;
