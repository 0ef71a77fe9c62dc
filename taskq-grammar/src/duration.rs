//! Durations (`500ms`, `30s`, `5m`, `1h`, `2d`, `1w`, `1h30m`) and backoff policies.

use std::time::Duration;

/// What a duration looks like, for error messages.
pub const HELP: &str = "write a number followed by a unit (ms, s, m, h, d or w), e.g. \"500ms\", \"30s\", \"5m\", \"1h\" or \"1h30m\"";

/// Parses `<number><unit>` with unit `ms`, `s`, `m`, `h`, `d` or `w` (a week is 7 days), or a
/// concatenation of such parts (`1h30m`); surrounding whitespace is ignored.
///
/// The error is a short reason, without the input (callers add context).
pub fn parse(text: &str) -> Result<Duration, String> {
    let s = text.trim();
    if s.is_empty() {
        return Err("the duration is empty".into());
    }
    let mut total_ms: u64 = 0;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest.chars().take_while(char::is_ascii_digit).count();
        if digits == 0 {
            return Err(format!("expected a number at `{rest}`"));
        }
        let (num, tail) = rest.split_at(digits);
        let unit_len = tail.chars().take_while(char::is_ascii_alphabetic).count();
        let (unit, tail) = tail.split_at(unit_len);
        let per_unit_ms: u64 = match unit {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            "w" => 7 * 86_400_000,
            "" if tail.is_empty() => {
                return Err(format!("`{num}` has no unit (e.g. \"{num}s\" for seconds)"));
            }
            "" => return Err(format!("unexpected `{tail}` after `{num}`")),
            other => {
                return Err(format!("unknown unit `{other}` (use ms, s, m, h, d or w)"));
            }
        };
        let n: u64 = num
            .parse()
            .map_err(|_| "the number is too large".to_owned())?;
        total_ms = n
            .checked_mul(per_unit_ms)
            .and_then(|ms| total_ms.checked_add(ms))
            .ok_or_else(|| "the duration is too large".to_owned())?;
        rest = tail;
    }
    Ok(Duration::from_millis(total_ms))
}

/// Formats a duration in the units [`parse`] reads, largest first: `7d`, `1d12h`, `1m30s`,
/// `250ms`, `0s` (weeks are written as days). `parse(&format(d)) == d` for whole milliseconds.
pub fn format(d: Duration) -> String {
    let mut ms = d.as_millis();
    if ms == 0 {
        return "0s".into();
    }
    let mut out = String::new();
    for (unit, len) in [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
        ("ms", 1),
    ] {
        if ms >= len {
            out.push_str(&format!("{}{unit}", ms / len));
            ms %= len;
        }
    }
    out
}

/// A backoff policy written as `"exponential(<base>, <max>)"` or `"constant(<delay>)"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackoffSpec {
    /// `base * 2^(attempt-1)` capped at `max` (the runtime adds its default jitter).
    Exponential {
        /// First delay.
        base: Duration,
        /// Cap.
        max: Duration,
    },
    /// The same delay after every failure.
    Constant(Duration),
}

/// What a backoff policy looks like, for error messages.
pub const BACKOFF_HELP: &str = "expected \"exponential(<base>, <max>)\" such as \"exponential(1s, 10m)\", or \"constant(<delay>)\" such as \"constant(5s)\"";

/// Parses a backoff policy; the error is a short reason.
pub fn parse_backoff(text: &str) -> Result<BackoffSpec, String> {
    let s = text.trim();
    let Some(open) = s.find('(') else {
        return Err(format!("`{s}` is not a backoff policy; {BACKOFF_HELP}"));
    };
    let Some(inner) = s[open + 1..].strip_suffix(')') else {
        return Err(format!("missing `)` at the end; {BACKOFF_HELP}"));
    };
    let kind = s[..open].trim();
    let args: Vec<&str> = inner.split(',').map(str::trim).collect();
    let dur = |arg: &str, what: &str| {
        parse(arg).map_err(|e| format!("invalid {what} `{arg}`: {e}; {HELP}"))
    };
    match (kind, args.as_slice()) {
        ("exponential", [base, max]) => {
            let base = dur(base, "base delay")?;
            let max = dur(max, "maximum delay")?;
            if base.is_zero() {
                return Err("the base delay of an exponential backoff must be greater than zero (use \"constant(0s)\" to retry immediately)".into());
            }
            if base > max {
                return Err(format!(
                    "the base delay ({base:?}) is larger than the maximum delay ({max:?})"
                ));
            }
            Ok(BackoffSpec::Exponential { base, max })
        }
        ("constant", [delay]) => Ok(BackoffSpec::Constant(dur(delay, "delay")?)),
        ("exponential", _) => Err(format!(
            "exponential takes two durations, a base and a maximum, e.g. \"exponential(1s, 10m)\" (got {})",
            args.len()
        )),
        ("constant", _) => Err(format!(
            "constant takes one duration, e.g. \"constant(5s)\" (got {})",
            args.len()
        )),
        (other, _) => Err(format!("unknown backoff kind `{other}`; {BACKOFF_HELP}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units_and_concatenations() {
        let ms = |s| parse(s).unwrap().as_millis();
        assert_eq!(ms("500ms"), 500);
        assert_eq!(ms("30s"), 30_000);
        assert_eq!(ms("5m"), 300_000);
        assert_eq!(ms("1h"), 3_600_000);
        assert_eq!(ms("2d"), 172_800_000);
        assert_eq!(ms("2w"), 1_209_600_000);
        assert_eq!(ms("1h30m"), 5_400_000);
        assert_eq!(ms("1d12h"), 129_600_000);
        assert_eq!(ms("1s500ms"), 1_500);
        assert_eq!(ms(" 0s "), 0);
    }

    #[test]
    fn rejects_bad_durations_with_a_reason() {
        for (bad, reason) in [
            ("", "empty"),
            ("  ", "empty"),
            ("30", "no unit"),
            ("s", "expected a number"),
            ("h1", "expected a number"),
            ("-1d", "expected a number"),
            ("1.5s", "unexpected `.5s`"),
            ("10 s", "unexpected ` s`"),
            ("3y", "unknown unit `y`"),
            ("7dd", "unknown unit `dd`"),
            ("5é", "unexpected `é`"),
            ("99999999999999999999s", "too large"),
            ("999999999999999w", "too large"),
        ] {
            let e = parse(bad).unwrap_err();
            assert!(e.contains(reason), "{bad:?}: {e}");
        }
    }

    #[test]
    fn formats_back() {
        for s in [
            "0s", "45s", "30m", "12h", "7d", "1d12h", "1m30s", "2d3h4m5s", "250ms", "1s500ms",
        ] {
            assert_eq!(format(parse(s).unwrap()), s);
        }
        assert_eq!(format(parse("36h").unwrap()), "1d12h");
        assert_eq!(format(parse("2w").unwrap()), "14d");
    }

    #[test]
    fn parses_backoffs() {
        assert_eq!(
            parse_backoff("exponential(1s, 10m)").unwrap(),
            BackoffSpec::Exponential {
                base: Duration::from_secs(1),
                max: Duration::from_secs(600)
            }
        );
        assert_eq!(
            parse_backoff(" constant( 5s ) ").unwrap(),
            BackoffSpec::Constant(Duration::from_secs(5))
        );
        for (bad, reason) in [
            ("linear(1s)", "unknown backoff kind `linear`"),
            ("exponential(1s)", "two durations"),
            ("constant(1s, 2s)", "one duration"),
            ("exponential(10m, 1s)", "larger than the maximum"),
            ("exponential(0s, 1s)", "greater than zero"),
            ("constant(5)", "invalid delay `5`"),
            ("constant(5s", "missing `)`"),
            ("5s", "not a backoff policy"),
        ] {
            let e = parse_backoff(bad).unwrap_err();
            assert!(e.contains(reason), "{bad:?}: {e}");
        }
    }
}
