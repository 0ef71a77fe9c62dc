//! The value of each key: its literal type, its range or grammar, and the error that says what
//! was expected.

use std::time::Duration;

use proc_macro2::Span;
use syn::spanned::Spanned;
use syn::{Expr, Lit, LitStr, UnOp};

use super::{KEYS, Target};
use crate::cron::{Missed, check_expression, check_timezone, parse_missed};
use crate::duration::{BACKOFF_HELP, BackoffSpec, DURATION_HELP, parse_backoff, parse_duration};

/// Looks through the invisible groups `macro_rules!` wraps around substituted fragments.
pub(super) fn peel(expr: &Expr) -> &Expr {
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

pub(super) fn example(key: &str) -> &'static str {
    KEYS.iter()
        .find(|(k, _)| *k == key)
        .map(|(_, e)| *e)
        .unwrap_or_default()
}

pub(super) fn string_value(key: &str, value: &Expr) -> syn::Result<LitStr> {
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
pub(super) fn check_name(lit: &LitStr, what: &str, max: usize) -> syn::Result<String> {
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
pub(super) fn int_value(key: &str, value: &Expr) -> syn::Result<(i128, Span)> {
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
pub(super) fn target(key: &str, value: &Expr) -> syn::Result<Target> {
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

pub(super) fn max_attempts(value: &Expr) -> syn::Result<u32> {
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

pub(super) fn priority(value: &Expr) -> syn::Result<i16> {
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

pub(super) fn timeout(value: &Expr) -> syn::Result<Duration> {
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

pub(super) fn max_snoozes(value: &Expr) -> syn::Result<u32> {
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

pub(super) fn ttl(value: &Expr) -> syn::Result<Duration> {
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
pub(super) const MAX_DELAY: Duration = Duration::from_secs(10 * 366 * 24 * 3600);

pub(super) fn backoff(value: &Expr) -> syn::Result<BackoffSpec> {
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

pub(super) fn cron(value: &Expr) -> syn::Result<String> {
    let lit = string_value("cron", value)?;
    check_expression(&lit.value())
        .map_err(|e| syn::Error::new(lit.span(), format!("invalid `cron` {:?}: {e}", lit.value())))
}

pub(super) fn timezone(value: &Expr) -> syn::Result<String> {
    let lit = string_value("timezone", value)?;
    check_timezone(&lit.value())
        .map(|()| lit.value().trim().to_owned())
        .map_err(|e| syn::Error::new(lit.span(), format!("invalid `timezone`: {e}")))
}

pub(super) fn missed_ticks(value: &Expr) -> syn::Result<Missed> {
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
