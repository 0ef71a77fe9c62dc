//! Parsing and validation of the attribute arguments: `#[task(queue = "orders", ...)]`.
//!
//! This module parses the list of keys and assembles [`TaskAttrs`]; `unique` parses the options
//! inside `unique(...)`, `values` checks each key's value (literal type, range, grammar).

mod ordered;
mod unique;
mod values;

use std::time::Duration;

use proc_macro2::{Span, TokenStream};
use syn::ext::IdentExt;
use syn::parse::{ParseStream, Parser};
use syn::{Expr, Ident, Token, parenthesized};

use crate::cron::Missed;
use crate::duration::BackoffSpec;

use ordered::{ordered_by, ordered_conflicts, ordered_dead_after};
use unique::unique_options;
pub use unique::{HoldSpec, UNIQUE_HELP, UniqueSpec};
use values::{
    backoff, check_name, cron, example, max_attempts, max_snoozes, missed_ticks, priority,
    string_value, target, timeout, timezone, ttl,
};

/// Longest queue name in bytes (the column is `VARCHAR(64)`; matches `taskq::MAX_QUEUE_LEN`).
pub const MAX_QUEUE_LEN: usize = 64;
/// Longest task name in bytes (matches `taskq::MAX_NAME_LEN`).
pub const MAX_NAME_LEN: usize = 255;

/// Every accepted key with an example value, in documentation order.
pub const KEYS: &[(&str, &str)] = &[
    ("name", "name = \"order_export\""),
    ("queue", "queue = \"orders\""),
    ("max_attempts", "max_attempts = 5"),
    ("priority", "priority = -1"),
    ("timeout", "timeout = \"30s\""),
    ("backoff", "backoff = \"exponential(1s, 10m)\""),
    ("cron", "cron = \"0 */5 * * * *\""),
    ("timezone", "timezone = \"Europe/Paris\""),
    ("missed_ticks", "missed_ticks = \"latest\""),
    ("max_snoozes", "max_snoozes = 10"),
    ("ttl", "ttl = \"1h\""),
    ("unique", "unique(by = [order_id], while = \"running\")"),
    ("ordered_by", "ordered_by = [account]"),
    ("ordered_dead_after", "ordered_dead_after = 5"),
    ("on_dead", "on_dead = notify_ops"),
    ("on_success", "on_success = next_step"),
];

/// The validated attribute arguments; `None` means "use the `Task` trait's default".
#[derive(Debug, Default, Clone, PartialEq)]
pub struct TaskAttrs {
    /// Stable task name stored in the row.
    pub name: Option<String>,
    /// Queue.
    pub queue: Option<String>,
    /// Attempts before `dead` (at least 1).
    pub max_attempts: Option<u32>,
    /// Default priority (lower runs first).
    pub priority: Option<i16>,
    /// Per-attempt timeout (non-zero).
    pub timeout: Option<Duration>,
    /// Retry backoff.
    pub backoff: Option<BackoffSpec>,
    /// Recurring schedule: a validated cron expression (trimmed).
    pub cron: Option<String>,
    /// Time zone of `cron`.
    pub timezone: Option<String>,
    /// Missed-tick policy of `cron`.
    pub missed_ticks: Option<Missed>,
    /// Snoozes that do not count as an attempt.
    pub max_snoozes: Option<u32>,
    /// Time to live from enqueue (non-zero, at most `MAX_DELAY`).
    pub ttl: Option<Duration>,
    /// Unique task declaration (the `by` names are checked against the signature later).
    pub unique: Option<UniqueSpec>,
    /// `ordered_by = [..]`: payload parameter names of the order key (checked against the
    /// signature later).
    pub ordered_by: Option<Vec<Ident>>,
    /// The JSON names of `ordered_by`, once checked against the signature.
    pub ordered_fields: Option<Vec<String>>,
    /// `ordered_dead_after = n`: a death after `n` attempts lets the key go on.
    pub ordered_dead_after: Option<u32>,
    /// `on_dead = path`: the follow-up task enqueued when this one dies.
    pub on_dead: Option<Target>,
    /// `on_success = path`: the follow-up task enqueued when this one succeeds.
    pub on_success: Option<Target>,
}

/// The target of `on_dead` / `on_success`: the path of a `#[task]` fn (or of its struct).
#[derive(Clone)]
pub struct Target {
    /// As written.
    pub path: syn::Path,
}

impl Target {
    /// The path of the target's payload struct: the last segment in PascalCase, with the
    /// span of the user's tokens.
    pub fn struct_path(&self) -> syn::Path {
        let mut path = self.path.clone();
        if let Some(last) = path.segments.last_mut() {
            let name = crate::naming::pascal_case(&last.ident.unraw().to_string());
            last.ident = Ident::new(&name, last.ident.span());
        }
        path
    }

    /// The last segment, without `r#`.
    pub fn last(&self) -> String {
        self.path
            .segments
            .last()
            .map(|s| s.ident.unraw().to_string())
            .unwrap_or_default()
    }
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let p = &self.path;
        write!(f, "Target({})", quote::quote!(#p))
    }
}

impl PartialEq for Target {
    fn eq(&self, other: &Self) -> bool {
        format!("{self:?}") == format!("{other:?}")
    }
}

/// What follows a key: `= value`, nothing, or a parenthesized list.
enum Value {
    Expr(Expr),
    Bare,
    List(TokenStream),
}

/// Parses and validates the tokens inside `#[task(...)]`.
///
/// Syntax errors stop at the first one; every semantic error (unknown or duplicated key, wrong
/// literal type, out-of-range value) is collected and returned together.
pub fn parse_attrs(tokens: TokenStream) -> syn::Result<TaskAttrs> {
    let entries = parse_entries.parse2(tokens)?;
    let mut attrs = TaskAttrs::default();
    let mut seen: Vec<String> = Vec::new();
    let mut seen_spans: Vec<(String, Span)> = Vec::new();
    let mut only_with_cron: Vec<Ident> = Vec::new();
    let mut errors: Option<syn::Error> = None;
    let mut push = |e: syn::Error| match &mut errors {
        Some(all) => all.combine(e),
        None => errors = Some(e),
    };
    for (key, value) in entries {
        let k = key.unraw().to_string();
        if !KEYS.iter().any(|(known, _)| *known == k) {
            push(unknown_key(&key, &k));
            continue;
        }
        if seen.contains(&k) {
            push(syn::Error::new(
                key.span(),
                format!("duplicate `{k}` attribute: give each attribute at most once"),
            ));
            continue;
        }
        seen.push(k.clone());
        seen_spans.push((k.clone(), key.span()));
        let value = match (k.as_str(), value) {
            ("unique", Value::Bare) => {
                attrs.unique = Some(UniqueSpec::default());
                continue;
            }
            ("unique", Value::List(tokens)) => {
                match unique_options.parse2(tokens) {
                    Ok(u) => attrs.unique = Some(u),
                    Err(e) => push(e),
                }
                continue;
            }
            ("unique", Value::Expr(_)) => {
                push(syn::Error::new(
                    key.span(),
                    format!("`unique` is not `key = value`: {UNIQUE_HELP}"),
                ));
                continue;
            }
            (_, Value::Expr(e)) => e,
            (_, _) => {
                push(syn::Error::new(
                    key.span(),
                    format!("`{k}` needs a value: `{}`", example(&k)),
                ));
                continue;
            }
        };
        let result = match k.as_str() {
            "name" => string_value(&k, &value).and_then(|s| {
                check_name(&s, "task name", MAX_NAME_LEN).map(|v| attrs.name = Some(v))
            }),
            "queue" => string_value(&k, &value).and_then(|s| {
                check_name(&s, "queue name", MAX_QUEUE_LEN).map(|v| attrs.queue = Some(v))
            }),
            "max_attempts" => max_attempts(&value).map(|v| attrs.max_attempts = Some(v)),
            "priority" => priority(&value).map(|v| attrs.priority = Some(v)),
            "timeout" => timeout(&value).map(|v| attrs.timeout = Some(v)),
            "backoff" => backoff(&value).map(|v| attrs.backoff = Some(v)),
            "cron" => cron(&value).map(|v| attrs.cron = Some(v)),
            "timezone" => {
                only_with_cron.push(key.clone());
                timezone(&value).map(|v| attrs.timezone = Some(v))
            }
            "missed_ticks" => {
                only_with_cron.push(key.clone());
                missed_ticks(&value).map(|v| attrs.missed_ticks = Some(v))
            }
            "max_snoozes" => max_snoozes(&value).map(|v| attrs.max_snoozes = Some(v)),
            "ttl" => ttl(&value).map(|v| attrs.ttl = Some(v)),
            "ordered_by" => ordered_by(&value).map(|v| attrs.ordered_by = Some(v)),
            "ordered_dead_after" => {
                ordered_dead_after(&k, &value).map(|v| attrs.ordered_dead_after = Some(v))
            }
            "on_dead" => target(&k, &value).map(|v| attrs.on_dead = Some(v)),
            "on_success" => target(&k, &value).map(|v| attrs.on_success = Some(v)),
            _ => unreachable!("every key of KEYS is handled"),
        };
        if let Err(e) = result {
            push(e);
        }
    }
    if !seen.iter().any(|k| k == "cron") {
        for key in only_with_cron {
            push(syn::Error::new(
                key.span(),
                format!(
                    "`{}` only applies to a recurring task: add `cron = \"...\"`, e.g. `cron = \"0 3 * * *\"`",
                    key.unraw()
                ),
            ));
        }
    }
    for e in ordered_conflicts(&attrs, &seen_spans) {
        push(e);
    }
    match errors {
        Some(e) => Err(e),
        None => Ok(attrs),
    }
}

/// `key = value` pairs, bare keys and `key(...)` lists, separated by commas (a trailing comma
/// is fine).
fn parse_entries(input: ParseStream<'_>) -> syn::Result<Vec<(Ident, Value)>> {
    let mut out = Vec::new();
    while !input.is_empty() {
        if !input.peek(Ident::peek_any) {
            return Err(input.error(format!(
                "expected `key = value`, e.g. `#[taskq::task(queue = \"orders\", max_attempts = 5)]`; known keys: {}",
                key_list()
            )));
        }
        let key = input.call(Ident::parse_any)?;
        let k = key.unraw().to_string();
        let value = if input.peek(Token![=]) {
            input.parse::<Token![=]>()?;
            Value::Expr(input.parse()?)
        } else if input.peek(syn::token::Paren) {
            let inner;
            parenthesized!(inner in input);
            Value::List(inner.parse()?)
        } else if input.is_empty() || input.peek(Token![,]) {
            if !KEYS.iter().any(|(known, _)| *known == k) {
                return Err(unknown_key(&key, &k));
            }
            Value::Bare
        } else {
            return Err(input.error(format!("expected `=`, `,` or `(...)` after `{k}`")));
        };
        out.push((key, value));
        if input.is_empty() {
            break;
        }
        input.parse::<Token![,]>()?;
    }
    Ok(out)
}

/// "did you mean `x`? " for the known name closest to `k`, if close enough.
pub(crate) fn closest<'a>(k: &str, known: impl Iterator<Item = &'a str>) -> String {
    known
        .map(|name| (name, edit_distance(k, name)))
        .filter(|(_, d)| *d <= 2)
        .min_by_key(|(_, d)| *d)
        .map(|(name, _)| format!("did you mean `{name}`? "))
        .unwrap_or_default()
}

fn key_list() -> String {
    KEYS.iter()
        .map(|(k, _)| format!("`{k}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn unknown_key(key: &Ident, k: &str) -> syn::Error {
    let suggestion = closest(k, KEYS.iter().map(|(known, _)| *known));
    syn::Error::new(
        key.span(),
        format!(
            "unknown `#[taskq::task]` attribute `{k}`; {suggestion}expected one of {}",
            key_list()
        ),
    )
}

/// Levenshtein distance, for "did you mean".
pub(crate) fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur.push(sub.min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests;
