//! The options inside `unique(...)`: `by`, `while`, `period`.

use std::time::Duration;

use syn::ext::IdentExt;
use syn::parse::ParseStream;
use syn::{Ident, LitStr, Token, bracketed};

use super::closest;
use super::values::MAX_DELAY;
use crate::duration::{DURATION_HELP, parse_duration};

/// The grammar of `unique`, for error messages.
pub const UNIQUE_HELP: &str = "write `unique` (every payload field, held while pending) or \
    `unique(by = [field, ..], while = \"pending\" | \"running\", period = \"10m\")`, each option optional";

/// Options of `unique(...)`, with an example each.
const UNIQUE_KEYS: &[(&str, &str)] = &[
    ("by", "by = [order_id]"),
    ("while", "while = \"running\""),
    ("period", "period = \"10m\""),
];

/// How long a unique task holds its identity (`taskq::unique::UniqueHold`).
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

/// The options inside `unique(...)`.
pub(super) fn unique_options(input: ParseStream<'_>) -> syn::Result<UniqueSpec> {
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
