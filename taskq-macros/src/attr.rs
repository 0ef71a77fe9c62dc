//! Parsing and validation of the attribute arguments: `#[task(queue = "orders", ...)]`.

use std::time::Duration;

use proc_macro2::{Span, TokenStream};
use syn::ext::IdentExt;
use syn::parse::{ParseStream, Parser};
use syn::spanned::Spanned;
use syn::{Expr, Ident, Lit, LitStr, Token, UnOp};
use syn::{bracketed, parenthesized};

use crate::cron::{Missed, check_expression, check_timezone, parse_missed};
use crate::duration::{BACKOFF_HELP, BackoffSpec, DURATION_HELP, parse_backoff, parse_duration};

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

/// The grammar of `unique`, for error messages.
pub const UNIQUE_HELP: &str = "write `unique` (every payload field, held while pending) or \
    `unique(by = [field, ..], while = \"pending\" | \"running\", period = \"10m\")`, each option optional";

/// Options of `unique(...)`, with an example each.
const UNIQUE_KEYS: &[(&str, &str)] = &[
    ("by", "by = [order_id]"),
    ("while", "while = \"running\""),
    ("period", "period = \"10m\""),
];

/// How long a unique task holds its identity (`taskq::UniqueHold`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HoldSpec {
    /// `while = "pending"` (the default).
    #[default]
    Pending,
    /// `while = "running"`.
    Running,
    /// `period = "10m"`.
    Window(Duration),
}

/// `unique` / `unique(...)`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct UniqueSpec {
    /// `by = [..]`: payload parameter names; `None` means every payload field.
    pub by: Option<Vec<Ident>>,
    /// `while` / `period`.
    pub hold: HoldSpec,
}

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
            let name = crate::expand::pascal_case(&last.ident.unraw().to_string());
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
            "ordered_dead_after" => int_value(&k, &value).and_then(|(n, span)| {
                u32::try_from(n)
                    .ok()
                    .filter(|n| *n >= 1)
                    .map(|n| attrs.ordered_dead_after = Some(n))
                    .ok_or_else(|| {
                        syn::Error::new(
                            span,
                            "`ordered_dead_after` must be between 1 and 4294967295 attempts",
                        )
                    })
            }),
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

/// `ordered_by = [a, b]`: payload parameter names (identifiers).
fn ordered_by(value: &Expr) -> syn::Result<Vec<Ident>> {
    let help = "`ordered_by` lists payload parameter names (identifiers, not strings), e.g. \
                `ordered_by = [account]`";
    let Expr::Array(a) = peel(value) else {
        return Err(syn::Error::new(value.span(), help));
    };
    a.elems
        .iter()
        .map(|e| match e {
            Expr::Path(p) if p.qself.is_none() && p.path.get_ident().is_some() => {
                Ok(p.path.get_ident().cloned().expect("checked"))
            }
            other => Err(syn::Error::new(other.span(), help)),
        })
        .collect()
}

/// What cannot go with `ordered_by` / `ordered_dead_after`, each error on the key's span.
fn ordered_conflicts(attrs: &TaskAttrs, spans: &[(String, Span)]) -> Vec<syn::Error> {
    let span = |k: &str| {
        spans
            .iter()
            .find(|(s, _)| s == k)
            .map_or_else(Span::call_site, |(_, sp)| *sp)
    };
    let mut out = Vec::new();
    if attrs.ordered_by.is_some() {
        if attrs.unique.is_some() {
            out.push(syn::Error::new(
                span("ordered_by"),
                "`ordered_by` cannot be combined with `unique`: an ordered task takes its place in its key's order at enqueue, so a duplicate enqueue could not be turned away without breaking that order",
            ));
        }
        if attrs.cron.is_some() {
            out.push(syn::Error::new(
                span("ordered_by"),
                "`ordered_by` cannot be combined with `cron`: a recurring task has no payload to take an order key from",
            ));
        }
    } else if attrs.ordered_dead_after.is_some() {
        out.push(syn::Error::new(
            span("ordered_dead_after"),
            "`ordered_dead_after` only applies to an ordered task: add `ordered_by = [field, ..]`",
        ));
    }
    if attrs.ordered_dead_after.is_some() && attrs.max_attempts.is_some() {
        out.push(syn::Error::new(
            span("ordered_dead_after"),
            "`ordered_dead_after = n` sets the attempts before the task dies and lets its key go on; leave out `max_attempts`",
        ));
    }
    out
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

/// The options inside `unique(...)`.
fn unique_options(input: ParseStream<'_>) -> syn::Result<UniqueSpec> {
    let mut spec = UniqueSpec::default();
    let mut seen: Vec<String> = Vec::new();
    let mut while_span = None;
    let mut period_span = None;
    while !input.is_empty() {
        if !input.peek(Ident::peek_any) {
            return Err(input.error(format!("expected a `unique` option; {UNIQUE_HELP}")));
        }
        let key = input.call(Ident::parse_any)?;
        let k = key.unraw().to_string();
        if !UNIQUE_KEYS.iter().any(|(known, _)| *known == k) {
            let suggestion = closest(&k, UNIQUE_KEYS.iter().map(|(known, _)| *known));
            return Err(syn::Error::new(
                key.span(),
                format!(
                    "unknown `unique` option `{k}`; {suggestion}expected `by`, `while` or `period`"
                ),
            ));
        }
        if seen.contains(&k) {
            return Err(syn::Error::new(
                key.span(),
                format!("duplicate `{k}` in `unique(...)`: give each option at most once"),
            ));
        }
        seen.push(k.clone());
        if !input.peek(Token![=]) {
            let example = UNIQUE_KEYS
                .iter()
                .find(|(known, _)| *known == k)
                .map(|(_, e)| *e);
            return Err(syn::Error::new(
                key.span(),
                format!("`{k}` needs a value: `{}`", example.unwrap_or_default()),
            ));
        }
        input.parse::<Token![=]>()?;
        match k.as_str() {
            "by" => {
                if !input.peek(syn::token::Bracket) {
                    return Err(input.error(
                        "`by` expects a list of payload parameter names, e.g. `by = [order_id, kind]` (`by = []`: the task name alone)",
                    ));
                }
                let inner;
                bracketed!(inner in input);
                let names = inner.parse_terminated(Ident::parse_any, Token![,]).map_err(|e| {
                    syn::Error::new(
                        e.span(),
                        "`by` lists payload parameter names (identifiers, not strings), e.g. `by = [order_id, kind]`",
                    )
                })?;
                spec.by = Some(names.into_iter().collect());
            }
            "while" => {
                let lit: LitStr = input.parse().map_err(|e| {
                    syn::Error::new(e.span(), "`while` expects a string literal: `while = \"pending\"` or `while = \"running\"`")
                })?;
                spec.hold = match lit.value().as_str() {
                    "pending" => HoldSpec::Pending,
                    "running" => HoldSpec::Running,
                    other => {
                        return Err(syn::Error::new(
                            lit.span(),
                            format!(
                                "invalid `while` {other:?}: use \"pending\" (the default: the identity is free again once a worker starts the task) or \"running\" (free again once it finishes); for a time window use `period`"
                            ),
                        ));
                    }
                };
                while_span = Some(key.span());
            }
            "period" => {
                let lit: LitStr = input.parse().map_err(|e| {
                    syn::Error::new(
                        e.span(),
                        "`period` expects a duration string, e.g. `period = \"10m\"`",
                    )
                })?;
                let d = parse_duration(&lit.value()).map_err(|e| {
                    syn::Error::new(
                        lit.span(),
                        format!("invalid `period` {:?}: {e}; {DURATION_HELP}", lit.value()),
                    )
                })?;
                if d.is_zero() {
                    return Err(syn::Error::new(
                        lit.span(),
                        "`period` must be greater than zero",
                    ));
                }
                if d > MAX_DELAY {
                    return Err(syn::Error::new(
                        lit.span(),
                        format!(
                            "`period` must be at most {} days",
                            MAX_DELAY.as_secs() / 86_400
                        ),
                    ));
                }
                spec.hold = HoldSpec::Window(d);
                period_span = Some(lit.span());
            }
            _ => unreachable!("every key of UNIQUE_KEYS is handled"),
        }
        if input.is_empty() {
            break;
        }
        input.parse::<Token![,]>()?;
    }
    if let (Some(span), Some(_)) = (while_span, period_span) {
        return Err(syn::Error::new(
            span,
            "`while` and `period` cannot be combined: with a `period` the identity is held for its whole window (by pending, running and succeeded tasks)",
        ));
    }
    Ok(spec)
}

/// "did you mean `x`? " for the known name closest to `k`, if close enough.
fn closest<'a>(k: &str, known: impl Iterator<Item = &'a str>) -> String {
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

/// Looks through the invisible groups `macro_rules!` wraps around substituted fragments.
fn peel(expr: &Expr) -> &Expr {
    match expr {
        Expr::Group(g) => peel(&g.expr),
        other => other,
    }
}

fn describe(expr: &Expr) -> &'static str {
    match peel(expr) {
        Expr::Lit(l) => match &l.lit {
            Lit::Str(_) => "a string literal",
            Lit::Int(_) => "an integer literal",
            Lit::Float(_) => "a float literal",
            Lit::Bool(_) => "a boolean",
            Lit::Char(_) => "a character literal",
            _ => "another kind of literal",
        },
        Expr::Unary(u) if matches!(u.op, UnOp::Neg(_)) => "a negative number",
        Expr::Path(_) => {
            "a path (constants are not supported: the value is checked at compile time)"
        }
        _ => "an expression (only literals are supported: the value is checked at compile time)",
    }
}

fn example(key: &str) -> &'static str {
    KEYS.iter()
        .find(|(k, _)| *k == key)
        .map(|(_, e)| *e)
        .unwrap_or_default()
}

fn string_value(key: &str, value: &Expr) -> syn::Result<LitStr> {
    match peel(value) {
        Expr::Lit(l) => match &l.lit {
            Lit::Str(s) => Ok(s.clone()),
            _ => Err(wrong_type(key, "a string literal", value)),
        },
        _ => Err(wrong_type(key, "a string literal", value)),
    }
}

fn wrong_type(key: &str, expected: &str, value: &Expr) -> syn::Error {
    syn::Error::new(
        value.span(),
        format!(
            "`{key}` expects {expected}, e.g. `{}`, found {}",
            example(key),
            describe(value)
        ),
    )
}

/// Mirrors the runtime's name validation so a bad name fails to compile instead of failing
/// every enqueue.
fn check_name(lit: &LitStr, what: &str, max: usize) -> syn::Result<String> {
    let value = lit.value();
    let reason = if value.is_empty() {
        Some("must not be empty".to_owned())
    } else if value.len() > max {
        Some(format!("is {} bytes long, the limit is {max}", value.len()))
    } else if value.chars().any(char::is_control) {
        Some("must not contain control characters".to_owned())
    } else if value.trim() != value {
        Some("must not start or end with whitespace".to_owned())
    } else {
        None
    };
    match reason {
        None => Ok(value),
        Some(reason) => Err(syn::Error::new(lit.span(), format!("the {what} {reason}"))),
    }
}

/// An integer literal, possibly negated, as `i128` with the span of the whole value.
fn int_value(key: &str, value: &Expr) -> syn::Result<(i128, Span)> {
    let (negative, lit) = match peel(value) {
        Expr::Unary(u) if matches!(u.op, UnOp::Neg(_)) => (true, peel(&u.expr)),
        other => (false, other),
    };
    match lit {
        Expr::Lit(l) => match &l.lit {
            Lit::Int(i) => {
                let n: i128 = i.base10_parse().map_err(|_| {
                    syn::Error::new(value.span(), format!("`{key}` is out of range"))
                })?;
                Ok((if negative { -n } else { n }, value.span()))
            }
            _ => Err(wrong_type(key, "an integer literal", value)),
        },
        _ => Err(wrong_type(key, "an integer literal", value)),
    }
}

/// `on_dead = notify_ops` / `on_success = path::to::next_step`: a plain path (no generics).
fn target(key: &str, value: &Expr) -> syn::Result<Target> {
    let what = if key == "on_dead" {
        "`taskq::DeadTask`"
    } else {
        "`taskq::SucceededTask`"
    };
    match peel(value) {
        Expr::Path(p) if p.qself.is_none() && p.attrs.is_empty() => {
            if let Some(seg) = p
                .path
                .segments
                .iter()
                .find(|s| !matches!(s.arguments, syn::PathArguments::None))
            {
                return Err(syn::Error::new(
                    seg.span(),
                    format!(
                        "`{key}` names a task without generic arguments, e.g. `{}`",
                        example(key)
                    ),
                ));
            }
            Ok(Target {
                path: p.path.clone(),
            })
        }
        Expr::Lit(l) if matches!(l.lit, Lit::Str(_)) => Err(syn::Error::new(
            value.span(),
            format!(
                "`{key}` expects the path of a `#[taskq::task]` fn, not a string: e.g. `{}` (the task whose only payload parameter is {what})",
                example(key)
            ),
        )),
        _ => Err(syn::Error::new(
            value.span(),
            format!(
                "`{key}` expects the path of a `#[taskq::task]` fn whose only payload parameter is {what}, e.g. `{}`, found {}",
                example(key),
                describe(value)
            ),
        )),
    }
}

fn max_attempts(value: &Expr) -> syn::Result<u32> {
    let (n, span) = int_value("max_attempts", value)?;
    if n < 1 {
        return Err(syn::Error::new(
            span,
            "`max_attempts` must be at least 1: it counts the first run too (use `max_attempts = 1` for no retries)",
        ));
    }
    u32::try_from(n)
        .map_err(|_| syn::Error::new(span, format!("`max_attempts` must be at most {}", u32::MAX)))
}

fn priority(value: &Expr) -> syn::Result<i16> {
    let (n, span) = int_value("priority", value)?;
    i16::try_from(n).map_err(|_| {
        syn::Error::new(
            span,
            format!(
                "`priority` must fit in an i16 ({}..={}); lower values run first",
                i16::MIN,
                i16::MAX
            ),
        )
    })
}

fn timeout(value: &Expr) -> syn::Result<Duration> {
    let lit = string_value("timeout", value)?;
    let d = parse_duration(&lit.value()).map_err(|e| {
        syn::Error::new(
            lit.span(),
            format!("invalid `timeout` {:?}: {e}; {DURATION_HELP}", lit.value()),
        )
    })?;
    if d.is_zero() {
        return Err(syn::Error::new(
            lit.span(),
            "`timeout` must be greater than zero; leave `timeout` out for no per-attempt timeout",
        ));
    }
    Ok(d)
}

fn max_snoozes(value: &Expr) -> syn::Result<u32> {
    let (n, span) = int_value("max_snoozes", value)?;
    u32::try_from(n).map_err(|_| {
        syn::Error::new(
            span,
            format!(
                "`max_snoozes` must be between 0 and {}: the number of snoozes that do not count as an attempt (0: every snooze counts)",
                u32::MAX
            ),
        )
    })
}

fn ttl(value: &Expr) -> syn::Result<Duration> {
    let lit = string_value("ttl", value)?;
    let d = parse_duration(&lit.value()).map_err(|e| {
        syn::Error::new(
            lit.span(),
            format!("invalid `ttl` {:?}: {e}; {DURATION_HELP}", lit.value()),
        )
    })?;
    if d.is_zero() {
        return Err(syn::Error::new(
            lit.span(),
            "`ttl` must be greater than zero; leave `ttl` out for tasks without a deadline",
        ));
    }
    if d > MAX_DELAY {
        return Err(syn::Error::new(
            lit.span(),
            format!(
                "invalid `ttl` {:?}: it exceeds the maximum of {} days that a deadline can be set ahead",
                lit.value(),
                MAX_DELAY.as_secs() / 86_400
            ),
        ));
    }
    Ok(d)
}

/// Longest delay the schema holds from now (`taskq::MAX_DELAY`, 10 × 366 days; the two must
/// stay equal): `run_at = now + delay` must remain a valid `DATETIME`.
const MAX_DELAY: Duration = Duration::from_secs(10 * 366 * 24 * 3600);

fn backoff(value: &Expr) -> syn::Result<BackoffSpec> {
    let lit = string_value("backoff", value)?;
    let spec = backoff_spec(&lit)?;
    let longest = match spec {
        BackoffSpec::Exponential { max, .. } => max,
        BackoffSpec::Constant(d) => d,
    };
    if longest > MAX_DELAY {
        return Err(syn::Error::new(
            lit.span(),
            format!(
                "invalid `backoff` {:?}: its longest delay ({:.1} days) exceeds the maximum of {} \
                 days that a retry can be scheduled ahead",
                lit.value(),
                longest.as_secs_f64() / 86_400.0,
                MAX_DELAY.as_secs() / 86_400
            ),
        ));
    }
    Ok(spec)
}

fn cron(value: &Expr) -> syn::Result<String> {
    let lit = string_value("cron", value)?;
    check_expression(&lit.value())
        .map_err(|e| syn::Error::new(lit.span(), format!("invalid `cron` {:?}: {e}", lit.value())))
}

fn timezone(value: &Expr) -> syn::Result<String> {
    let lit = string_value("timezone", value)?;
    check_timezone(&lit.value())
        .map(|()| lit.value().trim().to_owned())
        .map_err(|e| syn::Error::new(lit.span(), format!("invalid `timezone`: {e}")))
}

fn missed_ticks(value: &Expr) -> syn::Result<Missed> {
    let lit = string_value("missed_ticks", value)?;
    parse_missed(&lit.value())
        .map_err(|e| syn::Error::new(lit.span(), format!("invalid `missed_ticks`: {e}")))
}

fn backoff_spec(lit: &syn::LitStr) -> syn::Result<BackoffSpec> {
    parse_backoff(&lit.value()).map_err(|e| {
        let e = if e.contains(BACKOFF_HELP) {
            e
        } else {
            format!("{e}; {BACKOFF_HELP}")
        };
        syn::Error::new(
            lit.span(),
            format!("invalid `backoff` {:?}: {e}", lit.value()),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use quote::quote;

    fn err(tokens: TokenStream) -> String {
        parse_attrs(tokens).unwrap_err().to_string()
    }

    fn all_errors(tokens: TokenStream) -> Vec<String> {
        parse_attrs(tokens)
            .unwrap_err()
            .into_iter()
            .map(|e| e.to_string())
            .collect()
    }

    #[test]
    fn empty_means_defaults() {
        assert_eq!(parse_attrs(quote!()).unwrap(), TaskAttrs::default());
    }

    #[test]
    fn parses_every_key() {
        let a = parse_attrs(quote!(
            name = "export.v1",
            queue = "orders",
            max_attempts = 5,
            priority = -3,
            timeout = "1m30s",
            backoff = "constant(5s)",
            max_snoozes = 0,
            ttl = "2h",
        ))
        .unwrap();
        assert_eq!(
            a,
            TaskAttrs {
                name: Some("export.v1".into()),
                queue: Some("orders".into()),
                max_attempts: Some(5),
                priority: Some(-3),
                timeout: Some(Duration::from_secs(90)),
                backoff: Some(BackoffSpec::Constant(Duration::from_secs(5))),
                max_snoozes: Some(0),
                ttl: Some(Duration::from_secs(7200)),
                unique: None,
                ..TaskAttrs::default()
            }
        );
    }

    fn names(by: &Option<Vec<Ident>>) -> Option<Vec<String>> {
        by.as_ref()
            .map(|v| v.iter().map(|i| i.unraw().to_string()).collect())
    }

    #[test]
    fn unique_forms() {
        let u = parse_attrs(quote!(unique)).unwrap().unique.unwrap();
        assert_eq!((names(&u.by), u.hold), (None, HoldSpec::Pending));
        let u = parse_attrs(quote!(unique())).unwrap().unique.unwrap();
        assert_eq!((names(&u.by), u.hold), (None, HoldSpec::Pending));
        let u = parse_attrs(quote!(queue = "q", unique(by = [a, r#type], while = "running"),))
            .unwrap()
            .unique
            .unwrap();
        assert_eq!(
            (names(&u.by), u.hold),
            (Some(vec!["a".into(), "type".into()]), HoldSpec::Running)
        );
        let u = parse_attrs(quote!(unique(by = [], period = "10m")))
            .unwrap()
            .unique
            .unwrap();
        assert_eq!(
            (names(&u.by), u.hold),
            (Some(vec![]), HoldSpec::Window(Duration::from_secs(600)))
        );
        let u = parse_attrs(quote!(unique(while = "pending",)))
            .unwrap()
            .unique
            .unwrap();
        assert_eq!(u.hold, HoldSpec::Pending);
    }

    #[test]
    fn unique_misuse() {
        let e = err(quote!(unique(bye = [a])));
        assert!(
            e.contains("unknown `unique` option `bye`; did you mean `by`?"),
            "{e}"
        );
        let e = err(quote!(unique(while = "finished")));
        assert!(e.contains("invalid `while` \"finished\""), "{e}");
        let e = err(quote!(unique(while = running)));
        assert!(e.contains("`while` expects a string literal"), "{e}");
        let e = err(quote!(unique(period = "10")));
        assert!(
            e.contains("invalid `period` \"10\": `10` has no unit"),
            "{e}"
        );
        let e = err(quote!(unique(period = "0s")));
        assert!(e.contains("greater than zero"), "{e}");
        let e = err(quote!(unique(period = "4000d")));
        assert!(e.contains("at most 3660 days"), "{e}");
        let e = err(quote!(unique(while = "running", period = "1m")));
        assert!(e.contains("cannot be combined"), "{e}");
        let e = err(quote!(unique(by = ["a"])));
        assert!(e.contains("identifiers, not strings"), "{e}");
        let e = err(quote!(unique(by = a)));
        assert!(e.contains("`by` expects a list"), "{e}");
        let e = err(quote!(unique(by = [a], by = [b])));
        assert!(e.contains("duplicate `by`"), "{e}");
        let e = err(quote!(unique(by)));
        assert!(e.contains("`by` needs a value"), "{e}");
        let e = err(quote!(unique = true));
        assert!(e.contains("`unique` is not `key = value`"), "{e}");
        let e = err(quote!(unique, unique));
        assert!(e.contains("duplicate `unique`"), "{e}");
        let e = err(quote!(queue("x")));
        assert!(e.contains("`queue` needs a value"), "{e}");
        let e = err(quote!(uniq));
        assert!(e.contains("did you mean `unique`?"), "{e}");
    }

    #[test]
    fn follow_up_targets() {
        let a = parse_attrs(quote!(
            on_dead = notify_ops,
            on_success = crate::flow::next_step
        ))
        .unwrap();
        assert_eq!(format!("{:?}", a.on_dead.unwrap()), "Target(notify_ops)");
        let t = a.on_success.unwrap();
        assert_eq!(t.last(), "next_step");
        let p = t.struct_path();
        assert_eq!(quote!(#p).to_string(), "crate :: flow :: NextStep");
        let e = err(quote!(on_dead = "notify_ops"));
        assert!(
            e.contains("`on_dead` expects the path of a `#[taskq::task]` fn, not a string"),
            "{e}"
        );
        let e = err(quote!(on_success = 3));
        assert!(
            e.contains("whose only payload parameter is `taskq::SucceededTask`"),
            "{e}"
        );
        let e = err(quote!(on_dead = notify::<u8>));
        assert!(e.contains("without generic arguments"), "{e}");
        let e = err(quote!(on_dead = a, on_dead = b));
        assert!(e.contains("duplicate `on_dead`"), "{e}");
        let e = err(quote!(on_dead));
        assert!(
            e.contains("`on_dead` needs a value: `on_dead = notify_ops`"),
            "{e}"
        );
    }

    #[test]
    fn cron_keys() {
        let a = parse_attrs(quote!(
            cron = " 0 */5 * * * * ",
            timezone = "Europe/Paris",
            missed_ticks = "all(3)"
        ))
        .unwrap();
        assert_eq!(a.cron.as_deref(), Some("0 */5 * * * *"));
        assert_eq!(a.timezone.as_deref(), Some("Europe/Paris"));
        assert_eq!(a.missed_ticks, Some(Missed::All(3)));
        assert!(err(quote!(cron = "0 25 * * *")).contains("invalid `cron` \"0 25 * * *\""));
        assert!(err(quote!(cron = 5)).contains("`cron` expects a string literal"));
        assert!(
            err(quote!(cron = "@daily", timezone = "Mars/Olympus"))
                .contains("unknown time zone \"Mars/Olympus\"")
        );
        assert!(
            err(quote!(timezone = "UTC")).contains("`timezone` only applies to a recurring task")
        );
        assert!(err(quote!(missed_ticks = "skip")).contains("`missed_ticks` only applies"));
        assert!(err(quote!(cron = "@daily", missed_ticks = "never")).contains("unknown policy"));
    }

    #[test]
    fn unknown_key_suggests_the_closest() {
        let e = err(quote!(queu = "x"));
        assert!(
            e.contains("unknown `#[taskq::task]` attribute `queu`"),
            "{e}"
        );
        assert!(e.contains("did you mean `queue`?"), "{e}");
        let e = err(quote!(colour = "x"));
        assert!(!e.contains("did you mean"), "{e}");
    }

    #[test]
    fn duplicate_key_is_an_error() {
        let e = err(quote!(queue = "a", queue = "b"));
        assert!(e.contains("duplicate `queue`"), "{e}");
    }

    #[test]
    fn wrong_literal_types() {
        let e = err(quote!(max_attempts = "5"));
        assert!(
            e.contains("`max_attempts` expects an integer literal"),
            "{e}"
        );
        assert!(e.contains("found a string literal"), "{e}");
        let e = err(quote!(queue = 5));
        assert!(e.contains("`queue` expects a string literal"), "{e}");
        let e = err(quote!(queue = QUEUE));
        assert!(e.contains("constants are not supported"), "{e}");
        let e = err(quote!(timeout = 30));
        assert!(
            e.contains("`timeout` expects a string literal, e.g. `timeout = \"30s\"`"),
            "{e}"
        );
    }

    #[test]
    fn values_are_range_checked() {
        assert!(err(quote!(max_attempts = 0)).contains("at least 1"));
        assert!(err(quote!(max_attempts = -1)).contains("at least 1"));
        assert!(err(quote!(max_attempts = 4294967296)).contains("at most"));
        assert!(err(quote!(priority = 40000)).contains("must fit in an i16"));
        assert_eq!(
            parse_attrs(quote!(priority = -32768)).unwrap().priority,
            Some(i16::MIN)
        );
        assert!(err(quote!(queue = "")).contains("the queue name must not be empty"));
        let long = "q".repeat(65);
        assert!(err(quote!(queue = #long)).contains("65 bytes long, the limit is 64"));
        assert!(err(quote!(queue = "a\nb")).contains("control characters"));
        assert!(err(quote!(name = " x")).contains("whitespace"));
        assert!(err(quote!(name = "")).contains("the task name must not be empty"));
        assert!(err(quote!(timeout = "0s")).contains("greater than zero"));
        assert!(err(quote!(timeout = "30")).contains("`30` has no unit"));
        assert!(err(quote!(backoff = "linear(1s)")).contains("unknown backoff kind"));
        assert!(err(quote!(max_snoozes = -1)).contains("between 0 and"));
        assert!(err(quote!(max_snoozes = 4294967296)).contains("between 0 and"));
        assert!(err(quote!(max_snoozes = "5")).contains("expects an integer literal"));
        assert!(err(quote!(ttl = "0s")).contains("`ttl` must be greater than zero"));
        assert!(err(quote!(ttl = 60)).contains("`ttl` expects a string literal"));
        assert!(err(quote!(ttl = "4000d")).contains("exceeds the maximum of 3660 days"));
        assert!(err(quote!(ttl = "1 hour")).contains("invalid `ttl`"));
    }

    #[test]
    fn several_errors_are_reported_together() {
        let errors = all_errors(quote!(queue = "", max_attempts = 0, bogus = 1));
        assert_eq!(errors.len(), 3, "{errors:?}");
    }

    #[test]
    fn syntax_errors() {
        assert!(err(quote!(queue)).contains("`queue` needs a value: `queue = \"orders\"`"));
        assert!(err(quote!("orders")).contains("expected `key = value`"));
        assert!(err(quote!(queue = "a" max_attempts = 1)).contains("expected `,`"));
    }
}
