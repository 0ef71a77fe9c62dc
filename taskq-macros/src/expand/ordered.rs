//! `ordered_by = [..]`: the JSON names of the order key's payload fields, checked against the
//! handler's parameters, and the `Task::ORDERED` constant.

use proc_macro2::{Literal, TokenStream};
use quote::quote;
use syn::ItemFn;
use syn::ext::IdentExt;

use super::unique::json_name;
use crate::attr::TaskAttrs;
use crate::sig::Handler;

/// The JSON names of `ordered_by`'s fields, each checked against the handler's payload
/// parameters (every error collected).
pub fn ordered_fields(f: &ItemFn, by: &[syn::Ident], h: &Handler) -> syn::Result<Vec<String>> {
    let fn_name = f.sig.ident.unraw().to_string();
    let payload: Vec<(String, &[syn::Attribute])> = h
        .payload()
        .map(|(ident, _, serde_attrs)| (ident.unraw().to_string(), serde_attrs))
        .collect();
    let listed = if payload.is_empty() {
        format!(
            "`{fn_name}` has no payload parameters (`ordered_by = []` orders every task of the queue declared so)"
        )
    } else {
        let names: Vec<String> = payload.iter().map(|(n, _)| format!("`{n}`")).collect();
        format!("payload parameters of `{fn_name}`: {}", names.join(", "))
    };
    let mut errors: Option<syn::Error> = None;
    let mut push = |e: syn::Error| match &mut errors {
        Some(all) => all.combine(e),
        None => errors = Some(e),
    };
    let mut out = Vec::new();
    for ident in by {
        let name = ident.unraw().to_string();
        if out.iter().any(|(n, _): &(String, String)| *n == name) {
            push(syn::Error::new(
                ident.span(),
                format!("`{name}` is listed twice in `ordered_by`"),
            ));
            continue;
        }
        let Some((_, serde_attrs)) = payload.iter().find(|(n, _)| *n == name) else {
            let suggestion = payload
                .iter()
                .map(|(n, _)| (n, crate::attr::edit_distance(&name, n)))
                .filter(|(_, d)| *d <= 2)
                .min_by_key(|(_, d)| *d)
                .map(|(n, _)| format!("did you mean `{n}`? "))
                .unwrap_or_default();
            push(syn::Error::new(
                ident.span(),
                format!(
                    "`ordered_by` names `{name}`, which is not a payload parameter of `{fn_name}` (an injected parameter cannot make an order key); {suggestion}{listed}"
                ),
            ));
            continue;
        };
        match json_name(&name, serde_attrs) {
            Ok(json) => out.push((name, json)),
            Err(reason) => push(syn::Error::new(
                ident.span(),
                format!("`{name}` cannot be part of an order key: {reason}"),
            )),
        }
    }
    match errors {
        Some(e) => Err(e),
        None => Ok(out.into_iter().map(|(_, json)| json).collect()),
    }
}

/// The `Task::ORDERED` constant, when the task is ordered.
pub(super) fn ordered_tokens(attrs: &TaskAttrs) -> Option<TokenStream> {
    let fields = attrs.ordered_fields.as_ref()?;
    let dead_after = attrs.ordered_dead_after.map(|n| {
        let n = Literal::u32_suffixed(n);
        quote!(.dead_after(#n))
    });
    Some(quote!(
        const ORDERED: ::core::option::Option<::taskq::ordered::Ordered> =
            ::core::option::Option::Some(::taskq::ordered::Ordered::by(&[#(#fields),*]) #dead_after);
    ))
}
