//! Compile-time checks of `cron`, `timezone` and `missed_ticks`, with the same parser
//! (`croner`) and time zone database (`chrono-tz`) as taskq's runtime, which checks them again
//! when the worker is built (`taskq::schedule`; keep the two in step).

use std::str::FromStr;

use chrono::{FixedOffset, TimeZone, Utc};
use croner::Cron;

/// What a cron expression looks like, for error messages.
pub const CRON_HELP: &str = "write 5 fields (minute hour day-of-month month day-of-week), e.g. \
    \"0 3 * * *\" for 03:00 every day, or 6 with a leading seconds field, e.g. \"0 */5 * * * *\" \
    for every five minutes";

/// Longest expression (matches `taskq::MAX_EXPRESSION_LEN`).
const MAX_EXPRESSION_LEN: usize = 255;
/// Most ticks run after missed ones (matches `taskq::MAX_CATCH_UP_TICKS`).
const MAX_CATCH_UP_TICKS: u32 = 1000;

/// Checks a cron expression: it parses and has a tick after 2000-01-01. Returns it trimmed.
pub fn check_expression(expression: &str) -> Result<String, String> {
    let trimmed = expression.trim();
    if trimmed.len() > MAX_EXPRESSION_LEN {
        return Err(format!(
            "the expression is {} bytes long, the limit is {MAX_EXPRESSION_LEN}",
            trimmed.len()
        ));
    }
    let cron =
        Cron::from_str(trimmed).map_err(|e| format!("{}; {CRON_HELP}", diagnose(trimmed, &e)))?;
    let start = Utc
        .with_ymd_and_hms(2000, 1, 1, 0, 0, 0)
        .single()
        .expect("a valid date");
    if cron.find_next_occurrence(&start, false).is_err() {
        return Err("the expression never matches a date (such as the 30th of February)".into());
    }
    Ok(trimmed.to_owned())
}

/// Why croner rejected `expression`, in a user's terms: which field is wrong when one field
/// alone is (each field is tried in an otherwise all-`*` expression of the same length).
fn diagnose(expression: &str, error: &croner::errors::CronError) -> String {
    let reason = |e: &croner::errors::CronError| {
        let text = e.to_string();
        text.strip_prefix("Component error: ")
            .or_else(|| text.strip_prefix("Invalid pattern: "))
            .unwrap_or(&text)
            .trim_end_matches('.')
            .to_owned()
    };
    let fields: Vec<&str> = expression.split_whitespace().collect();
    let names: &[&str] = match fields.len() {
        5 => &["minute", "hour", "day-of-month", "month", "day-of-week"],
        6 => &[
            "second",
            "minute",
            "hour",
            "day-of-month",
            "month",
            "day-of-week",
        ],
        7 => &[
            "second",
            "minute",
            "hour",
            "day-of-month",
            "month",
            "day-of-week",
            "year",
        ],
        _ => return reason(error),
    };
    if !expression.contains('@') {
        for (i, field) in fields.iter().enumerate() {
            let mut probe = vec!["*"; fields.len()];
            probe[i] = field;
            if let Err(e) = Cron::from_str(&probe.join(" ")) {
                return format!(
                    "its {} field {field:?} is invalid ({})",
                    names[i],
                    reason(&e)
                );
            }
        }
    }
    reason(error)
}

/// Checks a time zone: `UTC`, a fixed offset (`+02:00`) or an IANA name (`Europe/Paris`).
pub fn check_timezone(tz: &str) -> Result<(), String> {
    let tz = tz.trim();
    if tz.eq_ignore_ascii_case("utc") || tz == "Z" {
        return Ok(());
    }
    if let Some(rest) = tz.strip_prefix('+').or_else(|| tz.strip_prefix('-')) {
        let digits: String = rest.chars().filter(|c| *c != ':').collect();
        let ok = matches!(digits.len(), 2 | 4) && digits.chars().all(|c| c.is_ascii_digit());
        let (h, m) = if ok {
            let h: i32 = digits[..2].parse().unwrap_or(99);
            let m: i32 = match &digits[2..] {
                "" => 0,
                m => m.parse().unwrap_or(99),
            };
            (h, m)
        } else {
            (99, 99)
        };
        return if h <= 23 && m <= 59 && FixedOffset::east_opt(h * 3600 + m * 60).is_some() {
            Ok(())
        } else {
            Err(format!(
                "invalid UTC offset {tz:?}: expected +HH:MM or -HH:MM, e.g. \"+02:00\""
            ))
        };
    }
    chrono_tz::Tz::from_str(tz).map(|_| ()).map_err(|_| {
        format!(
            "unknown time zone {tz:?}: expected \"UTC\", an offset such as \"+02:00\", or an IANA \
             name such as \"Europe/Paris\""
        )
    })
}

/// A missed-tick policy as the macro emits it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Missed {
    /// `MissedTicks::Latest`.
    Latest,
    /// `MissedTicks::Skip`.
    Skip,
    /// `MissedTicks::All(n)`.
    All(u32),
}

/// Parses `latest`, `skip` or `all(N)`.
pub fn parse_missed(s: &str) -> Result<Missed, String> {
    let s = s.trim();
    match s {
        "latest" => return Ok(Missed::Latest),
        "skip" => return Ok(Missed::Skip),
        _ => {}
    }
    let expected = "expected \"latest\" (run the latest missed tick once), \"skip\" (run none) or \"all(N)\" (run each, at most the N latest)";
    let n = s
        .strip_prefix("all(")
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| format!("unknown policy {s:?}: {expected}"))?;
    let n: u32 = n
        .trim()
        .parse()
        .map_err(|_| format!("`all(N)` needs a whole number, found {n:?}"))?;
    if n == 0 || n > MAX_CATCH_UP_TICKS {
        return Err(format!(
            "`all({n})` is out of range: 1 ..= {MAX_CATCH_UP_TICKS} (use \"skip\" to run none)"
        ));
    }
    Ok(Missed::All(n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expressions() {
        assert_eq!(check_expression(" 0 3 * * * ").unwrap(), "0 3 * * *");
        assert!(check_expression("0 */5 * * * *").is_ok());
        assert!(check_expression("@daily").is_ok());
        let e = check_expression("0 25 * * *").unwrap_err();
        assert!(e.contains("5 fields"), "{e}");
        assert!(e.contains("its hour field \"25\" is invalid"), "{e}");
        assert!(check_expression("* * *").is_err());
        assert!(
            check_expression("0 0 30 2 *")
                .unwrap_err()
                .contains("never matches")
        );
    }

    #[test]
    fn timezones() {
        for ok in [
            "UTC",
            "utc",
            "+02:00",
            "-0530",
            "+07",
            "Europe/Paris",
            "America/New_York",
        ] {
            assert!(check_timezone(ok).is_ok(), "{ok}");
        }
        assert!(
            check_timezone("Europe/Pariss")
                .unwrap_err()
                .contains("unknown time zone")
        );
        assert!(
            check_timezone("+24:00")
                .unwrap_err()
                .contains("invalid UTC offset")
        );
        assert!(check_timezone("+2").is_err());
    }

    #[test]
    fn missed_policies() {
        assert_eq!(parse_missed("latest").unwrap(), Missed::Latest);
        assert_eq!(parse_missed("skip").unwrap(), Missed::Skip);
        assert_eq!(parse_missed("all(12)").unwrap(), Missed::All(12));
        assert!(parse_missed("all(0)").unwrap_err().contains("out of range"));
        assert!(parse_missed("none").unwrap_err().contains("unknown policy"));
    }
}
