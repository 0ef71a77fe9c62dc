//! `unique(by = [..])`: the JSON names of the identity's payload fields, checked against the
//! handler's parameters, and the `Task::UNIQUE` constant.

use proc_macro2::TokenStream;
use quote::quote;
use syn::ext::IdentExt;
use syn::{Attribute, ItemFn};

use super::duration_tokens;
use crate::attr::{HoldSpec, UniqueSpec};
use crate::sig::Handler;

/// The JSON names of the payload fields of `unique(by = [..])` (`None`: the whole payload),
/// each checked against the handler's parameters.
pub fn unique_fields(
    f: &ItemFn,
    spec: &UniqueSpec,
    h: &Handler,
) -> syn::Result<Option<Vec<String>>> {
    let Some(by) = &spec.by else {
        return Ok(None);
    };
    let fn_name = f.sig.ident.unraw().to_string();
    let payload: Vec<(String, &[Attribute])> = h
        .payload()
        .map(|(ident, _, serde_attrs)| (ident.unraw().to_string(), serde_attrs))
        .collect();
    let listed = || {
        if payload.is_empty() {
            format!(
                "`{fn_name}` has no payload parameters (`by = []` makes the task name alone the identity)"
            )
        } else {
            let names: Vec<String> = payload.iter().map(|(n, _)| format!("`{n}`")).collect();
            format!("payload parameters of `{fn_name}`: {}", names.join(", "))
        }
    };
    let mut errors: Option<syn::Error> = None;
    let mut push = |e: syn::Error| match &mut errors {
        Some(all) => all.combine(e),
        None => errors = Some(e),
    };
    let mut out: Vec<String> = Vec::new();
    let mut seen: Vec<String> = Vec::new();
    for ident in by {
        let name = ident.unraw().to_string();
        if seen.contains(&name) {
            push(syn::Error::new(
                ident.span(),
                format!("`{name}` is listed twice in `by`"),
            ));
            continue;
        }
        seen.push(name.clone());
        let Some((_, serde_attrs)) = payload.iter().find(|(n, _)| *n == name) else {
            let injected = f.sig.inputs.iter().any(|arg| match arg {
                syn::FnArg::Typed(t) => {
                    matches!(&*t.pat, syn::Pat::Ident(p) if p.ident.unraw() == name)
                }
                syn::FnArg::Receiver(_) => false,
            });
            let msg = if injected {
                format!(
                    "`{name}` is injected by the worker, not part of the payload, so it cannot be part of a unique identity; {}",
                    listed()
                )
            } else {
                let suggestion = payload
                    .iter()
                    .map(|(n, _)| (n, crate::attr::edit_distance(&name, n)))
                    .filter(|(_, d)| *d <= 2)
                    .min_by_key(|(_, d)| *d)
                    .map(|(n, _)| format!("did you mean `{n}`? "))
                    .unwrap_or_default();
                format!(
                    "`by` names `{name}`, which is not a parameter of `{fn_name}`; {suggestion}{}",
                    listed()
                )
            };
            push(syn::Error::new(ident.span(), msg));
            continue;
        };
        match json_name(&name, serde_attrs) {
            Ok(json) => out.push(json),
            Err(reason) => push(syn::Error::new(
                ident.span(),
                format!("`{name}` cannot be part of a unique identity: {reason}"),
            )),
        }
    }
    match errors {
        Some(e) => Err(e),
        None => Ok(Some(out)),
    }
}

/// The JSON name of a payload field given its `#[serde(...)]` attributes, or why it is not
/// always serialized under one name.
pub(super) fn json_name(name: &str, serde_attrs: &[Attribute]) -> Result<String, String> {
    let mut json = name.to_owned();
    for attr in serde_attrs {
        let mut problem = None;
        let _ = attr.parse_nested_meta(|meta| {
            let path = meta
                .path
                .get_ident()
                .map(|i| i.to_string())
                .unwrap_or_default();
            match path.as_str() {
                "rename" => {
                    if meta.input.peek(syn::Token![=]) {
                        let lit: syn::LitStr = meta.value()?.parse()?;
                        json = lit.value();
                    } else {
                        meta.parse_nested_meta(|inner| {
                            let lit: syn::LitStr = inner.value()?.parse()?;
                            if inner.path.is_ident("serialize") {
                                json = lit.value();
                            }
                            Ok(())
                        })?;
                    }
                }
                "flatten" | "skip" | "skip_serializing" | "skip_serializing_if" => {
                    problem = Some(format!(
                        "it is `#[serde({path})]`, so it is not always serialized as one field"
                    ));
                    if meta.input.peek(syn::Token![=]) {
                        let _: syn::Expr = meta.value()?.parse()?;
                    }
                }
                _ => {
                    if meta.input.peek(syn::Token![=]) {
                        let _: syn::Expr = meta.value()?.parse()?;
                    } else if meta.input.peek(syn::token::Paren) {
                        let _g: proc_macro2::Group = meta.input.parse()?;
                    }
                }
            }
            Ok(())
        });
        if let Some(p) = problem {
            return Err(p);
        }
    }
    Ok(json)
}

/// The `Task::UNIQUE` value for `spec`, with the JSON names of its `by` fields.
pub(super) fn unique_tokens(spec: &UniqueSpec, fields: Option<&Vec<String>>) -> TokenStream {
    let base = match fields {
        None => quote!(::taskq::unique::Unique::payload()),
        Some(names) => quote!(::taskq::unique::Unique::fields(&[#(#names),*])),
    };
    let hold = match spec.hold {
        HoldSpec::Pending => quote!(),
        HoldSpec::Running => quote!(.while_running()),
        HoldSpec::Window(d) => {
            let d = duration_tokens(d);
            quote!(.period(#d))
        }
    };
    quote!(const UNIQUE: ::core::option::Option<::taskq::unique::Unique> = ::core::option::Option::Some(#base #hold);)
}

#[cfg(test)]
mod tests {
    use quote::quote;

    use proc_macro2::TokenStream;

    use super::super::expand;
    use super::super::tests::expand_str;

    #[test]
    fn unique_declarations() {
        let f = quote!(
            async fn t(
                a: u32,
                #[serde(rename = "bee")] b: String,
                cx: TaskContext,
            ) -> Result<(), E> {
                Ok(())
            }
        );
        let out = expand_str(quote!(unique), f.clone());
        assert!(
            out.contains("const UNIQUE : :: core :: option :: Option < :: taskq :: unique :: Unique > = :: core :: option :: Option :: Some (:: taskq :: unique :: Unique :: payload ())"),
            "{out}"
        );
        assert!(
            !out.contains("with_unique"),
            "the enqueue options are taskq's one list, invoked, not written out: {out}"
        );
        let out = expand_str(quote!(unique(by = [b, a], while = "running")), f.clone());
        assert!(
            out.contains(
                ":: taskq :: unique :: Unique :: fields (& [\"bee\" , \"a\"]) . while_running ()"
            ),
            "{out}"
        );
        let out = expand_str(quote!(unique(by = [], period = "1h")), f.clone());
        assert!(
            out.contains(":: taskq :: unique :: Unique :: fields (& []) . period (:: core :: time :: Duration :: from_millis (3600000u64))"),
            "{out}"
        );
        let errors = |attr: TokenStream, f: TokenStream| -> Vec<String> {
            expand(attr, f)
                .unwrap_err()
                .into_iter()
                .map(|e| e.to_string())
                .collect()
        };
        let e = errors(quote!(unique(by = [aa, cx, a, a, zzz])), f.clone());
        assert_eq!(e.len(), 4, "{e:?}");
        assert!(e[0].contains("`by` names `aa`, which is not a parameter of `t`; did you mean `a`? payload parameters of `t`: `a`, `b`"), "{e:?}");
        assert!(e[1].contains("`cx` is injected by the worker"), "{e:?}");
        assert!(e[2].contains("`a` is listed twice"), "{e:?}");
        assert!(!e[3].contains("did you mean"), "{e:?}");
        let e = errors(
            quote!(unique(by = [a])),
            quote!(
                async fn t(
                    #[serde(skip_serializing_if = "Option::is_none")] a: Option<u32>,
                ) -> Result<(), E> {
                    Ok(())
                }
            ),
        );
        assert!(
            e[0].contains(
                "`a` cannot be part of a unique identity: it is `#[serde(skip_serializing_if)]`"
            ),
            "{e:?}"
        );
        let e = errors(
            quote!(unique(by = [a])),
            quote!(
                async fn t() -> Result<(), E> {
                    Ok(())
                }
            ),
        );
        assert!(e[0].contains("`t` has no payload parameters"), "{e:?}");
    }
}
