//! Time zones a schedule is read in: `UTC`, fixed offsets, IANA names.

use std::str::FromStr;

use chrono::FixedOffset;

/// A parsed time zone.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Zone {
    /// UTC (`UTC`, `utc`, `Z`).
    Utc,
    /// A fixed offset (`+02:00`, `-0530`, `+07`).
    Fixed(FixedOffset),
    /// An IANA zone (`Europe/Paris`), daylight saving included.
    Named(chrono_tz::Tz),
}

/// Parses `UTC`, `+HH:MM` / `-HH:MM` / `+HHMM` / `+HH` or an IANA name; returns the zone and
/// its canonical spelling (`UTC`, `+02:00`, `Europe/Paris`).
pub fn parse(s: &str) -> Result<(Zone, String), String> {
    let s = s.trim();
    if s.eq_ignore_ascii_case("utc") || s == "Z" {
        return Ok((Zone::Utc, "UTC".to_owned()));
    }
    if let Some(offset) = parse_offset(s) {
        let offset = offset?;
        return Ok((Zone::Fixed(offset), offset.to_string()));
    }
    match chrono_tz::Tz::from_str(s) {
        Ok(tz) => Ok((Zone::Named(tz), tz.name().to_owned())),
        Err(_) => Err(format!(
            "unknown time zone {s:?}: expected \"UTC\", an offset such as \"+02:00\", or an IANA \
             name such as \"Europe/Paris\""
        )),
    }
}

/// `+HH:MM`, `-HH:MM`, `+HHMM` or `+HH`; `None` when `s` does not look like an offset.
fn parse_offset(s: &str) -> Option<Result<FixedOffset, String>> {
    let (sign, rest) = match s.as_bytes().first()? {
        b'+' => (1, &s[1..]),
        b'-' => (-1, &s[1..]),
        _ => return None,
    };
    let bad = || {
        Some(Err(format!(
            "invalid UTC offset {s:?}: expected +HH:MM or -HH:MM, e.g. \"+02:00\""
        )))
    };
    let digits: String = rest.chars().filter(|c| *c != ':').collect();
    if digits.is_empty() || !digits.chars().all(|c| c.is_ascii_digit()) {
        return bad();
    }
    let (h, m) = match digits.len() {
        2 => (&digits[..2], "0"),
        4 => (&digits[..2], &digits[2..]),
        _ => return bad(),
    };
    let (h, m): (i32, i32) = (h.parse().ok()?, m.parse().ok()?);
    if h > 23 || m > 59 {
        return Some(Err(format!(
            "invalid UTC offset {s:?}: out of range (at most ±23:59)"
        )));
    }
    Some(
        FixedOffset::east_opt(sign * (h * 3600 + m * 60))
            .ok_or_else(|| format!("invalid UTC offset {s:?}: out of range (at most ±23:59)")),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zones() {
        for (ok, canonical) in [
            ("UTC", "UTC"),
            ("utc", "UTC"),
            ("Z", "UTC"),
            ("+02:00", "+02:00"),
            ("-0530", "-05:30"),
            ("+07", "+07:00"),
            ("Europe/Paris", "Europe/Paris"),
            ("America/New_York", "America/New_York"),
        ] {
            assert_eq!(parse(ok).unwrap().1, canonical, "{ok}");
        }
        assert!(
            parse("Europe/Pariss")
                .unwrap_err()
                .contains("unknown time zone")
        );
        let e = parse("+24:00").unwrap_err();
        assert!(
            e.contains("invalid UTC offset") && e.contains("out of range"),
            "{e}"
        );
        assert!(parse("+25:00").unwrap_err().contains("out of range"));
        assert!(parse("+2").unwrap_err().contains("invalid UTC offset"));
        assert!(parse("+2:0:0").is_err());
        assert!(parse("+ab").is_err());
    }
}
