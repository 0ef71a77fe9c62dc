//! Compile-time checks of `cron`, `timezone` and `missed_ticks`, with the parser the runtime
//! uses again when the worker is built (`taskq-grammar`: same crate, same words).

pub use taskq_grammar::cron::check as check_expression;
pub use taskq_grammar::missed::{Missed, parse as parse_missed};

/// Checks a time zone: `UTC`, a fixed offset (`+02:00`) or an IANA name (`Europe/Paris`).
pub fn check_timezone(tz: &str) -> Result<(), String> {
    taskq_grammar::zone::parse(tz).map(|_| ())
}
