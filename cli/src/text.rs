//! Stored text made safe to print on a terminal.
//!
//! Task names, queues, payloads, errors and worker ids come from the database, written by
//! programs (and, through errors, by whatever those programs called). A terminal interprets
//! control characters in them: ESC starts sequences that retitle the window, clear the screen
//! or colour what follows, CR moves back over text already printed, BEL rings, C1 controls
//! (U+0080..U+009F, e.g. U+009B, a one-character CSI) act like ESC sequences on many
//! terminals, and the bidirectional overrides reorder what follows. Every piece of stored text
//! the CLI prints goes through [`clean`] (one line), [`clean_lines`] (multi-line text, e.g. an
//! error in `taskq show`) or [`json_safe`] (`--json` output and pretty-printed payloads).

use std::borrow::Cow;
use std::fmt::Write as _;

/// Whether a terminal would act on `c` rather than show it: C0 controls, DEL, C1 controls,
/// and the Unicode bidirectional marks, embeddings, overrides and isolates.
pub fn is_terminal_control(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
        )
}

/// `s` on one line with every terminal control written as an escape: `\n`, `\r`, `\t`, or
/// `\u{1b}` (Rust's notation) for the others. Text without any is returned as is.
pub fn clean(s: &str) -> Cow<'_, str> {
    if !s.chars().any(is_terminal_control) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if is_terminal_control(c) => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// Multi-line text as its lines, each [`clean`]ed: lines end at `\n` (a `\r\n` counts as one
/// line end; any other `\r` is escaped). Tabs are kept, as they only move right.
pub fn clean_lines(s: &str) -> Vec<String> {
    s.split('\n')
        .map(|line| {
            let line = line.strip_suffix('\r').unwrap_or(line);
            line.split('\t')
                .map(|part| clean(part).into_owned())
                .collect::<Vec<_>>()
                .join("\t")
        })
        .collect()
}

/// JSON text with the characters JSON allows unescaped in strings but a terminal acts on (DEL,
/// C1 controls, bidirectional controls) written as `\u00XX` escapes: the same JSON value,
/// safe to print. (`serde_json` escapes C0 controls already; outside strings JSON text has
/// none of these characters, so every one replaced is inside a string.)
pub fn json_safe(json: &str) -> Cow<'_, str> {
    if !json.chars().any(is_terminal_control) {
        return Cow::Borrowed(json);
    }
    let mut out = String::with_capacity(json.len() + 8);
    for c in json.chars() {
        if is_terminal_control(c) && c != '\n' {
            let _ = write!(out, "\\u{:04x}", c as u32);
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOSTILE: &str = "\u{1b}]0;pwned\u{7}\u{1b}[2J\u{1b}[31mFAKE\rok\u{9b}31m\u{7f}\u{202e}x";

    #[test]
    fn controls_become_visible_escapes() {
        let c = clean(HOSTILE);
        assert_eq!(
            c,
            r"\u{1b}]0;pwned\u{7}\u{1b}[2J\u{1b}[31mFAKE\rok\u{9b}31m\u{7f}\u{202e}x"
        );
        assert!(!c.chars().any(is_terminal_control));
        assert_eq!(clean("plain – text ✓"), "plain – text ✓");
        assert!(matches!(clean("plain"), Cow::Borrowed(_)));
        assert_eq!(clean("a\nb\tc"), r"a\nb\tc");
    }

    #[test]
    fn lines_keep_their_breaks_and_tabs_but_not_carriage_returns() {
        assert_eq!(
            clean_lines("first\r\nsecond\tcol\rover\n\u{1b}[1Athird"),
            ["first", "second\tcol\\rover", "\\u{1b}[1Athird"]
        );
    }

    #[test]
    fn json_stays_the_same_value() {
        let v = serde_json::json!({ "e": HOSTILE });
        let text = serde_json::to_string_pretty(&v).unwrap();
        let safe = json_safe(&text);
        assert!(
            !safe
                .chars()
                .any(|c| is_terminal_control(c) && c != '\n' && c != ' ')
        );
        let back: serde_json::Value = serde_json::from_str(&safe).unwrap();
        assert_eq!(back, v);
    }
}
