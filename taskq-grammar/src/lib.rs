//! The text formats taskq reads, parsed in one place so that the `#[task]` macro (at compile
//! time), the runtime (when a worker is built) and the `taskq` CLI accept exactly the same
//! spellings and explain a mistake in the same words.
//!
//! - [`duration`]: `500ms`, `30s`, `5m`, `1h`, `2d`, `1w` and concatenations (`1h30m`); backoff
//!   policies `exponential(<base>, <max>)` / `constant(<delay>)`.
//! - [`cron`]: cron expressions (parsed by [`croner`]), with the wrong field named.
//! - [`zone`]: `UTC`, fixed offsets (`+02:00`) and IANA names (`Europe/Paris`).
//! - [`missed`]: missed-tick policies `latest`, `skip`, `all(N)`.
//!
//! Errors are short reasons without the input; callers add their context ("invalid `timeout`
//! \"30\": …"). Not semver-stable: an implementation detail of taskq.

pub mod cron;
pub mod duration;
pub mod missed;
pub mod zone;
