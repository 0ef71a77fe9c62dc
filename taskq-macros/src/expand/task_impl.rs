//! The `Task` impl: the constants the attribute sets, `run` (extracting the injected
//! parameters, calling the handler, recording its `Ok` value as the task's output and
//! converting its error), `required_data`, `schedule`,
//! the follow-up hooks (`on_dead`, `on_success`); and the `FollowUpFrom` impl that makes a task
//! with one payload parameter a follow-up target.

use proc_macro2::{Literal, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{Attribute, Ident, ItemFn};

use super::{duration_tokens, unique::unique_tokens};
use crate::attr::{Target, TaskAttrs};
use crate::cron::Missed;
use crate::duration::BackoffSpec;
use crate::sig::{Handler, ParamKind};

/// The `impl ::taskq::Task` block.
pub fn generate(
    f: &ItemFn,
    attrs: &TaskAttrs,
    h: &Handler,
    ty: &Ident,
    cfgs: &[&Attribute],
    unique_fields: Option<&Option<Vec<String>>>,
) -> TokenStream {
    let fn_ident = &f.sig.ident;
    let fn_name = fn_ident.unraw().to_string();

    // ---- Task impl ----
    let name = attrs.name.clone().unwrap_or_else(|| fn_name.clone());
    let queue = attrs
        .queue
        .as_ref()
        .map(|q| quote!(const QUEUE: &'static str = #q;));
    let max_attempts = attrs.max_attempts.map(|n| {
        let n = Literal::u32_suffixed(n);
        quote!(const MAX_ATTEMPTS: u32 = #n;)
    });
    let priority = attrs.priority.map(|n| {
        let n = Literal::i16_suffixed(n);
        quote!(const PRIORITY: i16 = #n;)
    });
    let unique = attrs
        .unique
        .as_ref()
        .map(|spec| unique_tokens(spec, unique_fields.and_then(Option::as_ref)));
    let ordered = super::ordered::ordered_tokens(attrs);
    let timeout = attrs.timeout.map(|d| {
        let d = duration_tokens(d);
        quote!(const TIMEOUT: ::core::option::Option<::core::time::Duration> = ::core::option::Option::Some(#d);)
    });
    let max_snoozes = attrs.max_snoozes.map(|n| {
        let n = Literal::u32_suffixed(n);
        quote!(const MAX_SNOOZES: u32 = #n;)
    });
    let ttl = attrs.ttl.map(|d| {
        let d = duration_tokens(d);
        quote!(const TTL: ::core::option::Option<::core::time::Duration> = ::core::option::Option::Some(#d);)
    });
    let backoff = attrs.backoff.map(|b| {
        let b = match b {
            BackoffSpec::Exponential { base, max } => {
                let (base, max) = (duration_tokens(base), duration_tokens(max));
                quote!(::taskq::Backoff::exponential(#base, #max))
            }
            BackoffSpec::Constant(d) => {
                let d = duration_tokens(d);
                quote!(::taskq::Backoff::constant(#d))
            }
        };
        quote!(const BACKOFF: ::taskq::Backoff = #b;)
    });

    let on_dead = attrs.on_dead.as_ref().map(|t| {
        follow_up_hook(
            t,
            quote!(ON_DEAD),
            quote!(::taskq::followup::OnDead),
            quote!(::taskq::DeadTask),
        )
    });
    let on_success = attrs.on_success.as_ref().map(|t| {
        follow_up_hook(
            t,
            quote!(ON_SUCCESS),
            quote!(::taskq::followup::OnSuccess),
            quote!(::taskq::SucceededTask),
        )
    });

    let schedule = attrs.cron.as_ref().map(|expr| {
        let tz = attrs.timezone.as_ref().map(|tz| quote!(.timezone(#tz)));
        let missed = attrs.missed_ticks.map(|m| {
            let m = match m {
                Missed::Latest => quote!(::taskq::schedule::MissedTicks::Latest),
                Missed::Skip => quote!(::taskq::schedule::MissedTicks::Skip),
                Missed::All(n) => {
                    let n = Literal::u32_suffixed(n);
                    quote!(::taskq::schedule::MissedTicks::All(#n))
                }
            };
            quote!(.missed_ticks(#m))
        });
        quote! {
            fn schedule() -> ::core::option::Option<::taskq::schedule::Schedule<Self>> {
                ::core::option::Option::Some(
                    ::taskq::schedule::Schedule::new(#expr, Self {}) #tz #missed
                )
            }
        }
    });

    let mut extract = Vec::new();
    let mut args = Vec::new();
    let mut requirements = Vec::new();
    for (i, p) in h.params.iter().enumerate() {
        match &p.kind {
            ParamKind::Payload { ident, .. } => args.push(quote!(self.#ident)),
            ParamKind::Injected => {
                let var = format_ident!("__taskq_inject_{}", i);
                let pty = &p.ty;
                extract.push(quote_spanned! {pty.span()=>
                    let #var = match <#pty as ::taskq::context::FromTaskContext>::from_task_context(&__taskq_cx) {
                        ::core::result::Result::Ok(v) => v,
                        ::core::result::Result::Err(e) => return ::core::result::Result::Err(e),
                    };
                });
                requirements.push(quote_spanned! {pty.span()=>
                    if let ::core::option::Option::Some(r) = <#pty as ::taskq::context::FromTaskContext>::requirement() {
                        __taskq_required.push(r);
                    }
                });
                args.push(quote!(#var));
            }
        }
    }
    let required_data = (!requirements.is_empty()).then(|| {
        quote! {
            fn required_data() -> ::std::vec::Vec<::taskq::__private::DataRequirement> {
                let mut __taskq_required = ::std::vec::Vec::new();
                #(#requirements)*
                __taskq_required
            }
        }
    });
    let into_result = quote_spanned! {h.ret_span=>
        __TaskqOutput::__taskq_into(__taskq_out, &__taskq_cx)
    };
    // An output type that is not serde is reported on it first, with what to do (the
    // conversion below reports it too, on the whole return type). Only when the return type
    // is written `Result<T, ..>`: an alias hides `T` from the macro.
    let output_check = ok_type(f).map(|ok| {
        quote_spanned! {ok.span()=>
            __taskq_assert_output::<#ok>();
        }
    });
    // The `run` signature carries the fn name's span so that a handler future that is not
    // `Send` is reported on the handler.
    let run_sig = quote_spanned! {fn_ident.span()=>
        fn run(self, __taskq_cx: ::taskq::TaskContext)
            -> impl ::core::future::Future<Output = ::core::result::Result<(), ::taskq::TaskError>>
            + ::core::marker::Send
    };

    quote! {
        #(#cfgs)*
        #[automatically_derived]
        impl ::taskq::Task for #ty {
            const NAME: &'static str = #name;
            #queue
            #max_attempts
            #priority
            #timeout
            #backoff
            #max_snoozes
            #ttl
            #unique
            #ordered
            #on_dead
            #on_success

            #run_sig {
                #[diagnostic::on_unimplemented(
                    message = "`{Self}` is not a valid return type for a taskq handler",
                    label = "expected `Result<T, E>` where `T: Serialize` and `E: Into<taskq::TaskError>`",
                    note = "return `Result<T, E>`: `T` is the task's output (`()` for none), stored as JSON, so it implements serde's `Serialize` (e.g. `#[derive(serde::Serialize)]`); `E` is `taskq::TaskError` or your own error type `E: std::error::Error + Send + Sync + 'static`"
                )]
                trait __TaskqOutput {
                    fn __taskq_into(
                        self,
                        cx: &::taskq::TaskContext,
                    ) -> ::core::result::Result<(), ::taskq::TaskError>;
                }
                impl<T, E> __TaskqOutput for ::core::result::Result<T, E>
                where
                    T: ::taskq::__private::serde::Serialize + 'static,
                    E: ::core::convert::Into<::taskq::TaskError>,
                {
                    fn __taskq_into(
                        self,
                        cx: &::taskq::TaskContext,
                    ) -> ::core::result::Result<(), ::taskq::TaskError> {
                        match self {
                            // `()` records nothing (`TaskContext::set_output`).
                            ::core::result::Result::Ok(output) => cx.set_output(&output),
                            ::core::result::Result::Err(e) => {
                                ::core::result::Result::Err(::core::convert::Into::into(e))
                            }
                        }
                    }
                }
                #[diagnostic::on_unimplemented(
                    message = "`{Self}` cannot be a task's output",
                    label = "the `Ok` value of a handler is its output, stored as JSON",
                    note = "an output type implements serde's `Serialize` (e.g. `#[derive(serde::Serialize)]`) and is `'static`; return `Result<(), E>` to store none"
                )]
                trait __TaskqOutputValue {}
                impl<T: ::taskq::__private::serde::Serialize + 'static> __TaskqOutputValue for T {}
                #[allow(dead_code)]
                fn __taskq_assert_output<T: __TaskqOutputValue>() {}
                #output_check
                async move {
                    #(#extract)*
                    let __taskq_out = #fn_ident(#(#args),*).await;
                    #into_result
                }
            }

            #required_data
            #schedule
        }
    }
}

/// The `T` of a return type written `Result<T, ..>` (any path ending in `Result`), unless it
/// is `()`.
fn ok_type(f: &ItemFn) -> Option<&syn::Type> {
    let syn::ReturnType::Type(_, ty) = &f.sig.output else {
        return None;
    };
    let syn::Type::Path(tp) = &**ty else {
        return None;
    };
    let last = tp.path.segments.last()?;
    if last.ident != "Result" {
        return None;
    }
    let syn::PathArguments::AngleBracketed(args) = &last.arguments else {
        return None;
    };
    match args.args.first()? {
        syn::GenericArgument::Type(syn::Type::Tuple(t)) if t.elems.is_empty() => None,
        syn::GenericArgument::Type(ok) => Some(ok),
        _ => None,
    }
}

/// A task whose only payload parameter has type `P` can be the follow-up target of a task
/// that hands it a `P` (`on_dead`: `DeadTask`, `on_success`: `SucceededTask`).
pub fn follow_up_from(h: &Handler, ty: &Ident, cfgs: &[&Attribute]) -> Option<TokenStream> {
    let payload: Vec<_> = h.payload().collect();
    match payload.as_slice() {
        [(ident, fty, _)] => Some(quote! {
            #(#cfgs)*
            #[automatically_derived]
            impl ::taskq::__private::FollowUpFrom<#fty> for #ty {
                fn __taskq_follow_up(ended: #fty) -> Self {
                    Self { #ident: ended }
                }
            }
        }),
        _ => None,
    }
}

/// `const ON_DEAD` / `const ON_SUCCESS`: a hook building the target's payload struct from the
/// ended task. Spanned on the target's path, so that a target that is not a task taking that
/// type is reported there.
fn follow_up_hook(
    t: &Target,
    konst: TokenStream,
    hook: TokenStream,
    ended: TokenStream,
) -> TokenStream {
    let target = t.struct_path();
    let span = t.path.span();
    let build = quote_spanned! {span=>
        <#target as ::taskq::__private::FollowUpFrom<#ended>>::__taskq_follow_up(
            ::core::clone::Clone::clone(__taskq_ended),
        )
    };
    quote! {
        const #konst: ::core::option::Option<#hook> = ::core::option::Option::Some(
            |__taskq_ended: &#ended| {
                ::core::option::Option::Some(::taskq::followup::FollowUp::new(#build))
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use quote::quote;

    use super::super::expand;
    use super::super::tests::expand_str;

    #[test]
    fn defaults_leave_trait_defaults_and_name_overrides() {
        let out = expand_str(
            quote!(name = "exports.v1"),
            quote!(
                async fn order_export(id: i64) -> Result<(), taskq::TaskError> {
                    Ok(())
                }
            ),
        );
        assert!(
            out.contains("const NAME : & 'static str = \"exports.v1\""),
            "{out}"
        );
        for absent in [
            "const QUEUE",
            "const MAX_ATTEMPTS",
            "const PRIORITY",
            "const TIMEOUT",
            "const BACKOFF",
            "const MAX_SNOOZES",
            "const TTL",
            "const UNIQUE",
            "fn required_data",
        ] {
            assert!(!out.contains(absent), "unexpected {absent:?} in\n{out}");
        }
        // private fn → private struct and fields
        assert!(out.contains("struct OrderExport { # [doc = \"Payload parameter `id` of `order_export`.\"] id : i64 , }"), "{out}");
    }

    #[test]
    fn cron_generates_a_schedule_and_rejects_payload() {
        let out = expand_str(
            quote!(
                cron = "0 3 * * *",
                timezone = "Europe/Paris",
                missed_ticks = "all(5)"
            ),
            quote!(
                async fn nightly(cx: TaskContext) -> Result<(), E> {
                    Ok(())
                }
            ),
        );
        assert!(
            out.contains(
                "fn schedule () -> :: core :: option :: Option < :: taskq :: schedule :: Schedule < Self >>"
            ),
            "{out}"
        );
        assert!(
            out.contains(":: taskq :: schedule :: Schedule :: new (\"0 3 * * *\" , Self { }) . timezone (\"Europe/Paris\") . missed_ticks (:: taskq :: schedule :: MissedTicks :: All (5u32))"),
            "{out}"
        );
        let plain = expand_str(
            quote!(),
            quote!(
                async fn t() -> Result<(), E> {
                    Ok(())
                }
            ),
        );
        assert!(!plain.contains("fn schedule"), "{plain}");
        let e = expand(
            quote!(cron = "@daily"),
            quote!(
                async fn report(day: u32, region: String) -> Result<(), E> {
                    Ok(())
                }
            ),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("cannot take payload parameters"), "{e}");
        assert!(e.contains("`day`, `region`"), "{e}");
        assert!(
            e.contains("WorkerBuilder::cron(\"<expression>\", Report { .. })"),
            "{e}"
        );
    }

    #[test]
    fn follow_up_hooks_and_targets() {
        let out = expand_str(
            quote!(on_dead = ops::notify_ops, on_success = next_step),
            quote!(
                async fn export(order_id: i64) -> Result<(), E> {
                    Ok(())
                }
            ),
        );
        for needle in [
            "const ON_DEAD : :: core :: option :: Option < :: taskq :: followup :: OnDead >",
            "< ops :: NotifyOps as :: taskq :: __private :: FollowUpFrom < :: taskq :: DeadTask >> :: __taskq_follow_up",
            "const ON_SUCCESS : :: core :: option :: Option < :: taskq :: followup :: OnSuccess >",
            "< NextStep as :: taskq :: __private :: FollowUpFrom < :: taskq :: SucceededTask >>",
            // one payload parameter: it can be a target itself
            "impl :: taskq :: __private :: FollowUpFrom < i64 > for Export",
            "Self { order_id : ended }",
        ] {
            assert!(out.contains(needle), "missing {needle:?} in\n{out}");
        }
        let two = expand_str(
            quote!(),
            quote!(
                async fn t(a: u8, b: u8) -> Result<(), E> {
                    Ok(())
                }
            ),
        );
        assert!(!two.contains("FollowUpFrom"), "{two}");
        for (attr, key) in [
            (quote!(on_dead = notify), "on_dead"),
            (quote!(on_success = self::Notify), "on_success"),
        ] {
            let e = expand(
                attr,
                quote!(
                    async fn notify(d: taskq::DeadTask) -> Result<(), E> {
                        Ok(())
                    }
                ),
            )
            .unwrap_err()
            .to_string();
            assert!(e.contains(&format!("`{key}` names `notify` itself")), "{e}");
        }
        // another module's `notify` is another task
        assert!(
            expand(
                quote!(on_dead = other::notify),
                quote!(
                    async fn notify(d: taskq::DeadTask) -> Result<(), E> {
                        Ok(())
                    }
                ),
            )
            .is_ok()
        );
    }
}
