//! Durations on the command line (`--older-than 7d`, `--in 90s`): the grammar the `#[task]`
//! macro reads too (`taskq-grammar`): `ms`, `s`, `m`, `h`, `d`, `w` and concatenations.

use std::time::Duration;

/// Parses `<number><unit>` (`500ms`, `45s`, `30m`, `12h`, `7d`, `2w`, `1h30m`). Used as a clap
/// value parser; the error names the input and says what to write.
pub fn parse_duration(input: &str) -> Result<Duration, String> {
    taskq_grammar::duration::parse(input).map_err(|reason| {
        format!(
            "invalid duration {input:?}: {reason}; {}",
            taskq_grammar::duration::HELP
        )
    })
}

/// Formats a duration back in the same units: `7d`, `1d12h`, `1m30s`, `0s`.
pub fn format_duration(d: Duration) -> String {
    taskq_grammar::duration::format(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_explains() {
        assert_eq!(parse_duration("7d").unwrap().as_secs(), 604_800);
        assert_eq!(parse_duration("2w").unwrap().as_secs(), 1_209_600);
        assert_eq!(parse_duration("1h30m").unwrap().as_secs(), 5_400);
        assert_eq!(parse_duration("500ms").unwrap().as_millis(), 500);
        let e = parse_duration("7").unwrap_err();
        assert!(
            e.contains("invalid duration \"7\"") && e.contains("has no unit"),
            "{e}"
        );
        assert!(
            parse_duration("7y")
                .unwrap_err()
                .contains("unknown unit `y`")
        );
        assert_eq!(format_duration(parse_duration("36h").unwrap()), "1d12h");
    }
}
