//! Parsing of ages such as `7d`, `12h`, `30m`, `45s`.

use std::time::Duration;

/// Parses `<number><unit>` with unit `s`, `m`, `h`, `d` or `w` (e.g. `7d`, `12h`, `30m`,
/// `45s`); several parts may follow each other (`1h30m`). Used as a clap value parser.
pub fn parse_duration(input: &str) -> Result<Duration, String> {
    let s = input.trim();
    if s.is_empty() {
        return Err("empty duration (expected e.g. 7d, 12h, 30m, 45s)".into());
    }
    let mut total: u64 = 0;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(format!(
                "invalid duration {input:?}: expected a number followed by s, m, h, d or w (e.g. 7d)"
            ));
        }
        let n: u64 = rest[..digits]
            .parse()
            .map_err(|_| format!("invalid duration {input:?}: number too large"))?;
        rest = &rest[digits..];
        let unit_len = rest.chars().next().map_or(0, char::len_utf8);
        let unit: u64 = match &rest[..unit_len] {
            "s" => 1,
            "m" => 60,
            "h" => 3_600,
            "d" => 86_400,
            "w" => 7 * 86_400,
            "" => {
                return Err(format!(
                    "invalid duration {input:?}: missing unit (s, m, h, d or w), e.g. {n}d"
                ));
            }
            other => {
                return Err(format!(
                    "invalid duration {input:?}: unknown unit {other:?} (use s, m, h, d or w)"
                ));
            }
        };
        rest = &rest[unit_len..];
        total = n
            .checked_mul(unit)
            .and_then(|x| total.checked_add(x))
            .ok_or_else(|| format!("invalid duration {input:?}: too large"))?;
    }
    Ok(Duration::from_secs(total))
}

/// Formats whole seconds back in the same units: `7d`, `1d12h`, `1m30s`, `0s`.
pub fn format_duration(d: Duration) -> String {
    let mut secs = d.as_secs();
    if secs == 0 {
        return "0s".into();
    }
    let mut out = String::new();
    for (unit, len) in [("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1)] {
        if secs >= len {
            out.push_str(&format!("{}{unit}", secs / len));
            secs %= len;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: &str) -> u64 {
        parse_duration(s).unwrap().as_secs()
    }

    #[test]
    fn single_units() {
        assert_eq!(secs("45s"), 45);
        assert_eq!(secs("30m"), 1_800);
        assert_eq!(secs("12h"), 43_200);
        assert_eq!(secs("7d"), 604_800);
        assert_eq!(secs("2w"), 1_209_600);
        assert_eq!(secs("0s"), 0);
        assert_eq!(secs(" 5m "), 300);
    }

    #[test]
    fn combined_parts() {
        assert_eq!(secs("1h30m"), 5_400);
        assert_eq!(secs("1d12h"), 129_600);
    }

    #[test]
    fn formats_back() {
        for s in [
            "0s", "45s", "30m", "12h", "7d", "1d12h", "1m30s", "2d3h4m5s",
        ] {
            assert_eq!(format_duration(parse_duration(s).unwrap()), s);
        }
        assert_eq!(format_duration(parse_duration("36h").unwrap()), "1d12h");
        assert_eq!(format_duration(parse_duration("2w").unwrap()), "14d");
    }

    #[test]
    fn rejects_bad_input() {
        for bad in [
            "", "  ", "7", "d", "7x", "7 d", "-1d", "1.5h", "h1", "7dd", "5é",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?} should be rejected");
        }
        assert!(parse_duration("99999999999999999999s").is_err());
        assert!(parse_duration("999999999999999w").is_err());
        assert!(parse_duration("7").unwrap_err().contains("missing unit"));
        assert!(parse_duration("7y").unwrap_err().contains("unknown unit"));
    }
}
