//! Code generation: from the validated attributes and signature to the emitted items.
//!
//! `expand` parses and validates (the checks that need both the attributes and the signature
//! are here; the `unique(by = [..])` fields are checked in `unique`); `generate` assembles the
//! items in this order: the function itself, the payload check and struct (`payload`), the
//! `Task` impl and the follow-up conversion (`task_impl`), the inherent enqueue helpers
//! (`inherent`) and the inventory registration.

mod inherent;
mod ordered;
mod payload;
mod task_impl;
mod unique;

use proc_macro2::{Literal, TokenStream};
use quote::quote;
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{Attribute, Ident, Item, ItemFn};

use crate::attr::{TaskAttrs, parse_attrs};
use crate::sig::{Handler, analyze, strip_param_attrs};

pub use unique::unique_fields;

/// The macro's entry point: the expansion, or the errors followed by the function itself (with
/// the macro's parameter attributes removed) so that one mistake does not also produce a
/// cascade of "cannot find function" errors.
pub fn expand_or_error(attr: TokenStream, item: TokenStream) -> TokenStream {
    match expand(attr, item.clone()) {
        Ok(out) => out,
        Err(e) => {
            let mut out = e.to_compile_error();
            match syn::parse2::<ItemFn>(item.clone()) {
                Ok(mut f) => {
                    strip_param_attrs(&mut f);
                    out.extend(quote!(#f));
                }
                Err(_) => out.extend(item),
            }
            out
        }
    }
}

/// Parses the attribute arguments and the item, validates both (collecting every error) and
/// generates the task.
pub fn expand(attr: TokenStream, item: TokenStream) -> syn::Result<TokenStream> {
    let mut f = match syn::parse2::<Item>(item)? {
        Item::Fn(f) => f,
        other => {
            return Err(syn::Error::new(
                item_keyword_span(&other),
                "`#[taskq::task]` can only be applied to a free `async fn`",
            ));
        }
    };
    let attrs = parse_attrs(attr);
    let consumed = strip_param_attrs(&mut f);
    let handler = analyze(&f, &consumed);
    match (attrs, handler) {
        (Ok(mut attrs), Ok(handler)) => {
            check_cron_payload(&f, &attrs, &handler)?;
            if let Some(by) = &attrs.ordered_by {
                attrs.ordered_fields = Some(ordered::ordered_fields(&f, by, &handler)?);
            }
            check_follow_up_targets(&f, &attrs)?;
            let unique = match &attrs.unique {
                Some(spec) => Some(unique_fields(&f, spec, &handler)?),
                None => None,
            };
            Ok(generate(&f, &attrs, &handler, unique.as_ref()))
        }
        (Err(mut a), Err(h)) => {
            a.combine(h);
            Err(a)
        }
        (Err(e), _) | (_, Err(e)) => Err(e),
    }
}

/// A `cron` task is enqueued by the scheduler with no arguments, so it cannot take payload
/// parameters; the error points at the first one and names them all.
fn check_cron_payload(f: &ItemFn, attrs: &TaskAttrs, h: &Handler) -> syn::Result<()> {
    if attrs.cron.is_none() {
        return Ok(());
    }
    let payload: Vec<(&Ident, &syn::Type)> = h.payload().map(|(i, t, _)| (i, t)).collect();
    let Some((first, first_ty)) = payload.first() else {
        return Ok(());
    };
    let names = payload
        .iter()
        .map(|(i, _)| format!("`{}`", i.unraw()))
        .collect::<Vec<_>>()
        .join(", ");
    let span = first
        .span()
        .join(first_ty.span())
        .unwrap_or_else(|| first.span());
    Err(syn::Error::new(
        span,
        format!(
            "a `cron` task is enqueued by the scheduler without arguments, so it cannot take payload \
             parameters, but `{}` has {names}; inject what it needs (`TaskContext`, `Data<T>`, \
             `#[inject]`), or schedule a task with a payload on the worker: \
             `WorkerBuilder::cron(\"<expression>\", {} {{ .. }})`",
            f.sig.ident.unraw(),
            pascal_case(&f.sig.ident.unraw().to_string()),
        ),
    ))
}

/// A task cannot be its own `on_dead` / `on_success` target: every success would enqueue
/// another run forever, and (the target taking a `DeadTask`) every death of the follow-up
/// would enqueue another.
fn check_follow_up_targets(f: &ItemFn, attrs: &TaskAttrs) -> syn::Result<()> {
    let own = pascal_case(&f.sig.ident.unraw().to_string());
    let mut errors: Option<syn::Error> = None;
    for (key, target) in [
        ("on_dead", &attrs.on_dead),
        ("on_success", &attrs.on_success),
    ] {
        let Some(t) = target else { continue };
        let prefix_is_self = t
            .path
            .segments
            .iter()
            .rev()
            .skip(1)
            .all(|s| s.ident == "self");
        if t.path.leading_colon.is_none() && prefix_is_self && pascal_case(&t.last()) == own {
            let why = if key == "on_dead" {
                "the follow-up's own death would enqueue another, without end"
            } else {
                "each success would enqueue another run, without end"
            };
            let e = syn::Error::new_spanned(
                &t.path,
                format!(
                    "`{key}` names `{}` itself: a task cannot be its own follow-up ({why}); name another `#[taskq::task]` fn",
                    f.sig.ident.unraw()
                ),
            );
            match &mut errors {
                Some(all) => all.combine(e),
                None => errors = Some(e),
            }
        }
    }
    match errors {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

fn item_keyword_span(item: &Item) -> proc_macro2::Span {
    match item {
        Item::Struct(s) => s.struct_token.span,
        Item::Enum(e) => e.enum_token.span,
        Item::Impl(i) => i.impl_token.span,
        Item::Mod(m) => m.mod_token.span,
        Item::Trait(t) => t.trait_token.span,
        Item::Const(c) => c.const_token.span,
        Item::Static(s) => s.static_token.span,
        other => other.span(),
    }
}

pub use crate::naming::pascal_case;

fn filter_attrs<'a>(attrs: &'a [Attribute], name: &'a str) -> impl Iterator<Item = &'a Attribute> {
    attrs.iter().filter(move |a| a.path().is_ident(name))
}

/// Generates the function, the payload struct, its `Task` impl, the inherent enqueue helpers
/// and the inventory registration.
pub fn generate(
    f: &ItemFn,
    attrs: &TaskAttrs,
    h: &Handler,
    unique_fields: Option<&Option<Vec<String>>>,
) -> TokenStream {
    let fn_ident = &f.sig.ident;
    let fn_name = fn_ident.unraw().to_string();
    let struct_name = pascal_case(&fn_name);
    let ty = Ident::new(&struct_name, fn_ident.span());
    let cfgs: Vec<&Attribute> = filter_attrs(&f.attrs, "cfg").collect();

    let payload = payload::generate(f, h, &ty, &cfgs);
    let task_impl = task_impl::generate(f, attrs, h, &ty, &cfgs, unique_fields);
    let follow_up_from = task_impl::follow_up_from(h, &ty, &cfgs);
    let inherent = inherent::generate(&ty, &cfgs);

    quote! {
        #f

        #payload

        #task_impl

        #follow_up_from

        #inherent

        #(#cfgs)*
        const _: () = {
            ::taskq::__private::inventory::submit! {
                ::taskq::registry::Registration::of::<#ty>()
            }
        };
    }
}

fn duration_tokens(d: std::time::Duration) -> TokenStream {
    let ms = Literal::u64_suffixed(d.as_millis() as u64);
    quote!(::core::time::Duration::from_millis(#ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn expand_str(attr: TokenStream, item: TokenStream) -> String {
        expand(attr, item).unwrap().to_string()
    }

    #[test]
    fn pascal_case_names() {
        assert_eq!(pascal_case("order_export"), "OrderExport");
        assert_eq!(pascal_case("send_email_v2"), "SendEmailV2");
        assert_eq!(pascal_case("__private_thing"), "PrivateThing");
        assert_eq!(pascal_case("x"), "X");
        assert_eq!(pascal_case("already_Mixed"), "AlreadyMixed");
    }

    #[test]
    fn generates_struct_impl_helpers_and_registration() {
        let out = expand_str(
            quote!(
                queue = "orders",
                max_attempts = 5,
                priority = -2,
                timeout = "30s",
                backoff = "exponential(1s, 10m)",
                max_snoozes = 7,
                ttl = "1h"
            ),
            quote! {
                /// Exports an order.
                pub async fn order_export(order_id: i64, note: String, cx: TaskContext, db: Data<Pool>) -> Result<(), MyErr> { Ok(()) }
            },
        );
        for needle in [
            "pub async fn order_export",
            "pub struct OrderExport",
            "pub order_id : i64",
            "pub note : String",
            "impl :: taskq :: Task for OrderExport",
            "const NAME : & 'static str = \"order_export\"",
            "const QUEUE : & 'static str = \"orders\"",
            "const MAX_ATTEMPTS : u32 = 5u32",
            "const PRIORITY : i16 = - 2i16",
            "Duration :: from_millis (30000u64)",
            ":: taskq :: Backoff :: exponential (:: core :: time :: Duration :: from_millis (1000u64) , :: core :: time :: Duration :: from_millis (600000u64))",
            "fn required_data",
            "< Data < Pool > as :: taskq :: context :: FromTaskContext > :: requirement ()",
            "order_export (self . order_id , self . note , __taskq_inject_2 , __taskq_inject_3)",
            "inventory :: submit !",
            "Registration :: of :: < OrderExport > ()",
            "pub async fn enqueue_tx",
            "pub async fn enqueue <",
            // the enqueue options: taskq's one list, expanded as inherent `pub` methods
            ":: taskq :: __private :: enqueue_options ! ([pub] links = \"taskq\") ;",
            "const MAX_SNOOZES : u32 = 7u32",
            "const TTL : :: core :: option :: Option < :: core :: time :: Duration > = :: core :: option :: Option :: Some (:: core :: time :: Duration :: from_millis (3600000u64))",
            "# [doc = r\" Exports an order.\"]",
        ] {
            assert!(out.contains(needle), "missing {needle:?} in\n{out}");
        }
        // The list itself is written once in taskq: the macro only invokes it.
        assert!(!out.contains("with_delay"), "{out}");
    }

    #[test]
    fn raw_identifiers() {
        let out = expand_str(
            quote!(),
            quote!(
                async fn r#move(r#type: u8) -> Result<(), E> {
                    Ok(())
                }
            ),
        );
        assert!(out.contains("struct Move"), "{out}");
        assert!(out.contains("\"move\""), "{out}");
        assert!(out.contains("r#type : u8"), "{out}");
    }

    #[test]
    fn cfg_attrs_are_copied() {
        let out = expand_str(
            quote!(),
            quote!(
                #[cfg(feature = "x")]
                async fn t() -> Result<(), E> {
                    Ok(())
                }
            ),
        );
        assert_eq!(out.matches("# [cfg (feature = \"x\")]").count(), 6, "{out}");
    }

    #[test]
    fn attribute_and_signature_errors_are_combined() {
        let errors: Vec<String> = expand(
            quote!(max_attempts = 0),
            quote!(
                fn t() {}
            ),
        )
        .unwrap_err()
        .into_iter()
        .map(|e| e.to_string())
        .collect();
        assert_eq!(errors.len(), 3, "{errors:?}");
    }

    #[test]
    fn errors_still_emit_the_function() {
        let out = expand_or_error(
            quote!(bogus = 1),
            quote!(
                async fn t(#[inject] a: A) -> Result<(), E> {
                    Ok(())
                }
            ),
        )
        .to_string();
        assert!(out.contains("compile_error"), "{out}");
        assert!(out.contains("async fn t (a : A)"), "{out}");
        let out = expand_or_error(
            quote!(),
            quote!(
                struct S;
            ),
        )
        .to_string();
        assert!(
            out.contains("can only be applied to a free `async fn`"),
            "{out}"
        );
    }
}
