//! Cron expressions, parsed by [`croner`]: 5 fields, 6 with leading seconds, 7 with a trailing
//! year, and the `@daily`-style nicknames.

use std::str::FromStr;

use chrono::{TimeZone, Utc};
use croner::Cron;

/// What a cron expression looks like, for error messages.
pub const HELP: &str = "write 5 fields (minute hour day-of-month month day-of-week), e.g. \
    \"0 3 * * *\" for 03:00 every day, or 6 with a leading seconds field, e.g. \"0 */5 * * * *\" \
    for every five minutes";

/// Longest expression, in bytes.
pub const MAX_EXPRESSION_LEN: usize = 255;

/// Parses a cron expression; returns it with its surrounding whitespace trimmed. The error
/// names the wrong field when one field alone is wrong, and ends with [`HELP`].
pub fn parse(expression: &str) -> Result<(Cron, String), String> {
    let trimmed = expression.trim();
    if trimmed.len() > MAX_EXPRESSION_LEN {
        return Err(format!(
            "the expression is {} bytes long, the limit is {MAX_EXPRESSION_LEN}",
            trimmed.len()
        ));
    }
    if trimmed.chars().any(char::is_control) {
        return Err("the expression must not contain control characters".into());
    }
    let cron = Cron::from_str(trimmed).map_err(|e| format!("{}; {HELP}", diagnose(trimmed, &e)))?;
    Ok((cron, trimmed.to_owned()))
}

/// [`parse`], then checks that the expression matches some date after 2000-01-01 (not, say,
/// only the 30th of February).
pub fn check(expression: &str) -> Result<String, String> {
    let (cron, trimmed) = parse(expression)?;
    let start = Utc
        .with_ymd_and_hms(2000, 1, 1, 0, 0, 0)
        .single()
        .expect("a valid date");
    if cron.find_next_occurrence(&start, false).is_err() {
        return Err("the expression never matches a date (such as the 30th of February)".into());
    }
    Ok(trimmed)
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
    const FIELDS: [&str; 7] = [
        "second",
        "minute",
        "hour",
        "day-of-month",
        "month",
        "day-of-week",
        "year",
    ];
    let names: &[&str] = match fields.len() {
        5 => &FIELDS[1..6],
        6 => &FIELDS[..6],
        7 => &FIELDS,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expressions() {
        assert_eq!(check(" 0 3 * * * ").unwrap(), "0 3 * * *");
        assert!(check("0 */5 * * * *").is_ok());
        assert!(check("0 0 12 1 1 * 2030").is_ok());
        assert!(check("@daily").is_ok());
        let e = check("0 25 * * *").unwrap_err();
        assert!(e.contains("5 fields"), "{e}");
        assert!(e.contains("its hour field \"25\" is invalid"), "{e}");
        let e = parse("61 * * * *").unwrap_err();
        assert!(e.contains("its minute field \"61\" is invalid"), "{e}");
        let e = parse("0 0 25 * * *").unwrap_err();
        assert!(e.contains("its hour field \"25\" is invalid"), "{e}");
        assert!(parse("* * *").is_err());
        assert!(parse("").is_err());
        assert!(parse("0 3 * * *\n").is_ok());
        assert!(parse("0 3\t* * *\u{7}").unwrap_err().contains("control"));
        assert!(
            parse(&"1 ".repeat(200))
                .unwrap_err()
                .contains("limit is 255")
        );
        assert!(check("0 0 30 2 *").unwrap_err().contains("never matches"));
    }
}
