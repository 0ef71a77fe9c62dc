//! `ordered_by = [..]` and `ordered_dead_after = n`, and what cannot go with them.

use proc_macro2::Span;
use syn::spanned::Spanned;
use syn::{Expr, Ident};

use super::TaskAttrs;
use super::values::{int_value, peel};

/// `ordered_by = [a, b]`: payload parameter names (identifiers).
pub(super) fn ordered_by(value: &Expr) -> syn::Result<Vec<Ident>> {
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
pub(super) fn ordered_conflicts(attrs: &TaskAttrs, spans: &[(String, Span)]) -> Vec<syn::Error> {
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

/// `ordered_dead_after = n`: 1 to `u32::MAX` attempts.
pub(super) fn ordered_dead_after(k: &str, value: &Expr) -> syn::Result<u32> {
    let (n, span) = int_value(k, value)?;
    u32::try_from(n).ok().filter(|n| *n >= 1).ok_or_else(|| {
        syn::Error::new(
            span,
            "`ordered_dead_after` must be between 1 and 4294967295 attempts",
        )
    })
}
