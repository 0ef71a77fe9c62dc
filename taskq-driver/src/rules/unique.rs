//! Unique key derivation: how a unique task's identity is computed from its name, its payload
//! and, for a window, the database clock. Written once here; taskq's `Unique` declares what to
//! select and how long to hold it, and calls these.
//!
//! The identity is a SHA-256 of the task name and the selected payload (canonical JSON: object
//! keys sorted, no whitespace); for a window, a second SHA-256 of that, the period and the
//! window's number (`floor(clock / period)`).

use serde_json::Value;
use sha2::{Digest, Sha256};

/// Why the fields of a unique declaration cannot be selected from a payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SelectError<'f> {
    /// The payload is not a JSON object, so it has no fields.
    NotObject,
    /// This field is not in the payload.
    Missing(&'f str),
}

/// The part of `payload` that makes two tasks of one name the same: all of it (`fields`
/// `None`), or these top-level fields of its JSON object (an empty list: none, the name alone
/// is the identity). A field listed twice counts once.
pub fn select<'f>(payload: Value, fields: Option<&[&'f str]>) -> Result<Value, SelectError<'f>> {
    let Some(fields) = fields else {
        return Ok(payload);
    };
    let Value::Object(mut obj) = payload else {
        return Err(SelectError::NotObject);
    };
    let mut picked = serde_json::Map::new();
    for &f in fields {
        match obj.remove(f) {
            Some(v) => {
                picked.insert(f.to_owned(), v);
            }
            None if picked.contains_key(f) => {}
            None => return Err(SelectError::Missing(f)),
        }
    }
    Ok(Value::Object(picked))
}

/// The identity of the task `name` with the selected payload `selected` (see [`select`]),
/// before any window.
pub fn base_key(name: &str, selected: &Value) -> [u8; 32] {
    let mut material = String::from("taskq.unique.v1\0");
    material.push_str(name);
    material.push('\0');
    canonical_json(selected, &mut material);
    Sha256::digest(material.as_bytes()).into()
}

/// The identity for the window of `period_us` that the database clock `clock_us` (µs since the
/// Unix epoch) is in: windows are consecutive periods counted from the epoch.
pub fn window_key(base: &[u8; 32], period_us: i64, clock_us: i64) -> [u8; 32] {
    let window = clock_us.div_euclid(period_us);
    let mut h = Sha256::new();
    h.update(b"taskq.unique.v1.window\0");
    h.update(base);
    h.update(period_us.to_be_bytes());
    h.update(window.to_be_bytes());
    h.finalize().into()
}

/// When the window of `period_us` that `clock_us` is in ends (µs since the Unix epoch).
pub fn window_end_us(period_us: i64, clock_us: i64) -> i64 {
    (clock_us.div_euclid(period_us) + 1).saturating_mul(period_us)
}

/// Compact JSON with object keys sorted, so equal values give equal text whatever the order
/// their maps serialized in.
pub fn canonical_json(v: &Value, out: &mut String) {
    match v {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                canonical_json(v, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical_json(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(s: &str) -> Value {
        serde_json::from_str(s).unwrap()
    }

    fn key(name: &str, fields: Option<&[&str]>, payload: &str) -> [u8; 32] {
        base_key(name, &select(json(payload), fields).unwrap())
    }

    #[test]
    fn canonical_json_sorts_keys_at_every_level() {
        let mut s = String::new();
        canonical_json(&json(r#"{"b":[{"y":1,"x":"é\n"}],"a":null}"#), &mut s);
        assert_eq!(s, r#"{"a":null,"b":[{"x":"é\n","y":1}]}"#);
    }

    #[test]
    fn identity_depends_on_name_and_selected_fields_only() {
        assert_eq!(
            key("t", None, r#"{"a":1,"b":2}"#),
            key("t", None, r#"{"b":2,"a":1}"#)
        );
        assert_ne!(
            key("t", None, r#"{"a":1,"b":2}"#),
            key("u", None, r#"{"a":1,"b":2}"#)
        );
        assert_ne!(
            key("t", None, r#"{"a":1,"b":2}"#),
            key("t", None, r#"{"a":1,"b":3}"#)
        );
        let a: &[&str] = &["a"];
        assert_eq!(
            key("t", Some(a), r#"{"a":1,"b":2}"#),
            key("t", Some(a), r#"{"a":1,"b":3}"#)
        );
        assert_ne!(
            key("t", Some(a), r#"{"a":1,"b":2}"#),
            key("t", Some(a), r#"{"a":2,"b":2}"#)
        );
        // No fields: the name alone.
        assert_eq!(
            key("t", Some(&[]), r#"{"a":1}"#),
            key("t", Some(&[]), r#"{"a":2}"#)
        );
        assert_ne!(
            key("t", Some(&[]), r#"{"a":1}"#),
            key("u", Some(&[]), r#"{"a":1}"#)
        );
        // A number and the same digits as a string are different payloads.
        assert_ne!(key("t", None, "1"), key("t", None, "\"1\""));
    }

    #[test]
    fn selection_errors_name_the_field() {
        assert_eq!(
            select(json(r#"{"a":1}"#), Some(&["nope"])),
            Err(SelectError::Missing("nope"))
        );
        assert_eq!(
            select(json("[1]"), Some(&["a"])),
            Err(SelectError::NotObject)
        );
        assert_eq!(select(json("[1]"), None), Ok(json("[1]")));
        // A field listed twice is fine.
        assert_eq!(
            select(json(r#"{"a":1,"b":2}"#), Some(&["a", "a"])),
            Ok(json(r#"{"a":1}"#))
        );
    }

    #[test]
    fn windows_are_numbered_on_the_given_clock() {
        let base = key("t", None, "{}");
        let ten = 10_000_000;
        assert_eq!(
            window_key(&base, ten, 10_000_000),
            window_key(&base, ten, 19_999_999)
        );
        assert_ne!(
            window_key(&base, ten, 19_999_999),
            window_key(&base, ten, 20_000_000)
        );
        assert_eq!(window_end_us(ten, 19_999_999), 20_000_000);
        assert_eq!(window_end_us(ten, 20_000_000), 30_000_000);
        assert_ne!(window_key(&base, ten, 10_000_000), base);
        // Another period is another identity, even in window 0 of both.
        assert_ne!(window_key(&base, ten, 0), window_key(&base, 2 * ten, 0));
        // Before the epoch, windows count down (floor, not truncation).
        assert_eq!(window_end_us(ten, -1), 0);
        assert_ne!(window_key(&base, ten, -1), window_key(&base, ten, 0));
    }
}
