//! Output: aligned tables, JSON, and the formats of times, spans and rates. Stored text is
//! escaped on the way out (see `text.rs`).

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use serde::Serialize;

use crate::duration::format_duration;
use crate::text::{clean, json_safe};

/// A rate limit as `N/PERIOD`.
pub fn fmt_rate(r: &taskq::client::RateLimit) -> String {
    if r.period.subsec_nanos() == 0 {
        format!("{}/{}", r.max, format_duration(r.period))
    } else {
        format!("{}/{}ms", r.max, r.period.as_millis())
    }
}

pub fn print_json<T: Serialize + ?Sized>(value: &T) {
    match serde_json::to_string_pretty(value) {
        Ok(s) => println!("{}", json_safe(&s)),
        Err(e) => eprintln!("taskq: error: cannot encode JSON: {e}"),
    }
}

/// Prints an aligned table; a header starting with `>` is right-aligned (numbers). Cells
/// are stored text: each is printed on one line with its controls escaped ([`clean`]).
pub fn print_table(headers: &[&str], rows: Vec<Vec<String>>) {
    let rows: Vec<Vec<String>> = rows
        .into_iter()
        .map(|r| r.into_iter().map(|c| clean(&c).into_owned()).collect())
        .collect();
    let right: Vec<bool> = headers.iter().map(|h| h.starts_with('>')).collect();
    let headers: Vec<String> = headers
        .iter()
        .map(|h| h.trim_start_matches('>').to_owned())
        .collect();
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let render = |cells: &[String]| {
        let last = cells.len().saturating_sub(1);
        let mut line = String::new();
        for (i, cell) in cells.iter().enumerate() {
            let pad = widths[i].saturating_sub(cell.chars().count());
            if i > 0 {
                line.push_str("  ");
            }
            if right[i] {
                line.push_str(&" ".repeat(pad));
                line.push_str(cell);
            } else {
                line.push_str(cell);
                if i < last {
                    line.push_str(&" ".repeat(pad));
                }
            }
        }
        line
    };
    println!("{}", render(&headers));
    for row in &rows {
        println!("{}", render(row));
    }
}

pub fn fmt_time(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S%.3fZ").to_string()
}

/// A non-negative `Duration` like [`fmt_delta`].
pub fn fmt_std(d: Duration) -> String {
    fmt_delta(TimeDelta::from_std(d).unwrap_or(TimeDelta::MAX))
}

pub fn secs_f64(d: TimeDelta) -> f64 {
    d.num_microseconds()
        .map_or(d.num_seconds() as f64, |us| us as f64 / 1e6)
}

/// A non-negative span as its two largest units: `3d4h`, `2h5m`, `4m10s`, `12s`, `0.4s`.
pub fn fmt_delta(d: TimeDelta) -> String {
    let d = d.max(TimeDelta::zero());
    let secs = d.num_seconds();
    if secs < 10 {
        return format!("{:.1}s", secs_f64(d));
    }
    let (days, h, m, s) = (secs / 86_400, secs / 3_600 % 24, secs / 60 % 60, secs % 60);
    if days > 0 {
        format!("{days}d{h}h")
    } else if h > 0 {
        format!("{h}h{m}m")
    } else if m > 0 {
        format!("{m}m{s}s")
    } else {
        format!("{s}s")
    }
}

/// The first line of `s`, cut to `max` characters.
pub fn one_line(s: &str, max: usize) -> String {
    let line = s.lines().next().unwrap_or("");
    let more = line.chars().count() > max || s.lines().nth(1).is_some();
    let mut out: String = line.chars().take(max).collect();
    if more {
        out.push('…');
    }
    out
}

pub fn plural(n: u64) -> &'static str {
    if n == 1 { "" } else { "s" }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deltas_are_compact() {
        assert_eq!(fmt_delta(TimeDelta::milliseconds(400)), "0.4s");
        assert_eq!(fmt_delta(TimeDelta::seconds(12)), "12s");
        assert_eq!(fmt_delta(TimeDelta::seconds(250)), "4m10s");
        assert_eq!(fmt_delta(TimeDelta::seconds(7_500)), "2h5m");
        assert_eq!(
            fmt_delta(TimeDelta::seconds(3 * 86_400 + 4 * 3_600)),
            "3d4h"
        );
        assert_eq!(fmt_delta(TimeDelta::seconds(-5)), "0.0s");
    }

    #[test]
    fn errors_are_cut_to_one_line() {
        assert_eq!(one_line("short", 60), "short");
        assert_eq!(one_line("a\nb", 60), "a…");
        assert_eq!(one_line("abcdef", 3), "abc…");
    }
}
