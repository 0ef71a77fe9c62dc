//! Duration and backoff strings of `timeout`, `backoff`, `ttl`, `unique(period)`: the grammar
//! shared with the runtime and the CLI (`taskq-grammar`).

pub use taskq_grammar::duration::{
    BACKOFF_HELP, BackoffSpec, HELP as DURATION_HELP, parse as parse_duration, parse_backoff,
};
