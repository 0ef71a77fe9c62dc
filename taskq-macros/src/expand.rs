//! Code generation: from the validated attributes and signature to the emitted items.

use proc_macro2::{Literal, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{Attribute, Ident, Item, ItemFn};

use crate::attr::{HoldSpec, Target, TaskAttrs, UniqueSpec, parse_attrs};
use crate::cron::Missed;
use crate::duration::BackoffSpec;
use crate::sig::{Handler, ParamKind, analyze, strip_param_attrs};

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
        (Ok(attrs), Ok(handler)) => {
            check_cron_payload(&f, &attrs, &handler)?;
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

/// `order_export` → `OrderExport`, `r#type` → `Type`, `send_email_v2` → `SendEmailV2`.
pub fn pascal_case(snake: &str) -> String {
    snake
        .split('_')
        .filter(|w| !w.is_empty())
        .map(|w| {
            let mut c = w.chars();
            match c.next() {
                Some(first) => first.to_uppercase().chain(c).collect::<String>(),
                None => String::new(),
            }
        })
        .collect()
}

fn filter_attrs<'a>(attrs: &'a [Attribute], name: &'a str) -> impl Iterator<Item = &'a Attribute> {
    attrs.iter().filter(move |a| a.path().is_ident(name))
}

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
fn json_name(name: &str, serde_attrs: &[Attribute]) -> Result<String, String> {
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
fn unique_tokens(spec: &UniqueSpec, fields: Option<&Vec<String>>) -> TokenStream {
    let base = match fields {
        None => quote!(::taskq::Unique::payload()),
        Some(names) => quote!(::taskq::Unique::fields(&[#(#names),*])),
    };
    let hold = match spec.hold {
        HoldSpec::Pending => quote!(),
        HoldSpec::Running => quote!(.while_running()),
        HoldSpec::Window(d) => {
            let d = duration_tokens(d);
            quote!(.period(#d))
        }
    };
    quote!(const UNIQUE: ::core::option::Option<::taskq::Unique> = ::core::option::Option::Some(#base #hold);)
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
    let vis = &f.vis;
    let struct_name = pascal_case(&fn_name);
    let ty = Ident::new(&struct_name, fn_ident.span());
    let cfgs: Vec<&Attribute> = filter_attrs(&f.attrs, "cfg").collect();
    let docs: Vec<&Attribute> = filter_attrs(&f.attrs, "doc").collect();

    // ---- payload struct ----
    let generated_note = format!(
        "Task payload generated by `#[taskq::task]` from the `{fn_name}` handler: enqueue it with \
         `enqueue_tx` (in your transaction), `enqueue`, or the `with_*` options."
    );
    let struct_docs = if docs.is_empty() {
        quote!(#[doc = #generated_note])
    } else {
        quote!(#(#docs)* #[doc = ""] #[doc = #generated_note])
    };
    let fields = h.payload().map(|(ident, fty, serde_attrs)| {
        let doc = format!("Payload parameter `{}` of `{fn_name}`.", ident.unraw());
        quote!(#(#serde_attrs)* #[doc = #doc] #vis #ident: #fty)
    });

    // ---- compile-time checks with spans on the user's tokens ----
    let payload_checks = h.payload().map(|(_, fty, _)| {
        quote_spanned! {fty.span()=>
            __taskq_assert_payload::<#fty>();
        }
    });

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
            quote!(::taskq::OnDead),
            quote!(::taskq::DeadTask),
        )
    });
    let on_success = attrs.on_success.as_ref().map(|t| {
        follow_up_hook(
            t,
            quote!(ON_SUCCESS),
            quote!(::taskq::OnSuccess),
            quote!(::taskq::SucceededTask),
        )
    });
    // A task whose only payload parameter has type `P` can be the follow-up target of a task
    // that hands it a `P` (`on_dead`: `DeadTask`, `on_success`: `SucceededTask`).
    let payload: Vec<_> = h.payload().collect();
    let follow_up_from = match payload.as_slice() {
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
    };

    let schedule = attrs.cron.as_ref().map(|expr| {
        let tz = attrs.timezone.as_ref().map(|tz| quote!(.timezone(#tz)));
        let missed = attrs.missed_ticks.map(|m| {
            let m = match m {
                Missed::Latest => quote!(::taskq::MissedTicks::Latest),
                Missed::Skip => quote!(::taskq::MissedTicks::Skip),
                Missed::All(n) => {
                    let n = Literal::u32_suffixed(n);
                    quote!(::taskq::MissedTicks::All(#n))
                }
            };
            quote!(.missed_ticks(#m))
        });
        quote! {
            fn schedule() -> ::core::option::Option<::taskq::Schedule<Self>> {
                ::core::option::Option::Some(
                    ::taskq::Schedule::new(#expr, Self {}) #tz #missed
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
                    let #var = match <#pty as ::taskq::FromTaskContext>::from_task_context(&__taskq_cx) {
                        ::core::result::Result::Ok(v) => v,
                        ::core::result::Result::Err(e) => return ::core::result::Result::Err(e),
                    };
                });
                requirements.push(quote_spanned! {pty.span()=>
                    if let ::core::option::Option::Some(r) = <#pty as ::taskq::FromTaskContext>::requirement() {
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
        __TaskqOutput::__taskq_into(__taskq_out)
    };
    // The `run` signature carries the fn name's span so that a handler future that is not
    // `Send` is reported on the handler.
    let run_sig = quote_spanned! {fn_ident.span()=>
        fn run(self, __taskq_cx: ::taskq::TaskContext)
            -> impl ::core::future::Future<Output = ::core::result::Result<(), ::taskq::TaskError>>
            + ::core::marker::Send
    };

    quote! {
        #f

        // Checked before the struct so that this error, which carries the hints, comes first.
        #(#cfgs)*
        const _: () = {
            #[diagnostic::on_unimplemented(
                message = "`{Self}` cannot be a task payload parameter",
                label = "payload parameters are stored as JSON",
                note = "payload types must implement serde's `Serialize` and `Deserialize` (e.g. `#[derive(serde::Serialize, serde::Deserialize)]`) and be `Send + Sync + 'static`",
                note = "if `{Self}` is a shared value such as a database pool or an HTTP client, take it as `taskq::Data<{Self}>` and register it with `WorkerBuilder::data`"
            )]
            trait __TaskqPayload {}
            impl<T> __TaskqPayload for T where
                T: ::taskq::__private::serde::Serialize
                    + ::core::marker::Send
                    + ::core::marker::Sync
                    + 'static,
            {
            }
            fn __taskq_assert_payload<T: __TaskqPayload>() {}
            #[allow(dead_code)]
            fn __taskq_check_payload() {
                #(#payload_checks)*
            }
        };

        #(#cfgs)*
        #struct_docs
        #[derive(
            ::taskq::__private::serde::Serialize,
            ::taskq::__private::serde::Deserialize,
            ::core::fmt::Debug,
            ::core::clone::Clone,
        )]
        #[serde(crate = "::taskq::__private::serde")]
        #[allow(dead_code)] // constructed by the worker from the stored JSON
        #vis struct #ty {
            #(#fields,)*
        }

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
            #on_dead
            #on_success

            #run_sig {
                #[diagnostic::on_unimplemented(
                    message = "`{Self}` is not a valid return type for a taskq handler",
                    label = "expected `Result<(), E>` where `E: Into<taskq::TaskError>`",
                    note = "return `Result<(), taskq::TaskError>`, or `Result<(), E>` with your own error type `E: std::error::Error + Send + Sync + 'static`"
                )]
                trait __TaskqOutput {
                    fn __taskq_into(self) -> ::core::result::Result<(), ::taskq::TaskError>;
                }
                impl<E> __TaskqOutput for ::core::result::Result<(), E>
                where
                    E: ::core::convert::Into<::taskq::TaskError>,
                {
                    fn __taskq_into(self) -> ::core::result::Result<(), ::taskq::TaskError> {
                        self.map_err(::core::convert::Into::into)
                    }
                }
                async move {
                    #(#extract)*
                    let __taskq_out = #fn_ident(#(#args),*).await;
                    #into_result
                }
            }

            #required_data
            #schedule
        }

        #follow_up_from

        #(#cfgs)*
        #[allow(dead_code)]
        impl #ty {
            /// Inserts this task on the caller's transaction or connection; it becomes visible
            /// to workers when the caller commits (taskq never begins, commits or rolls back).
            pub async fn enqueue_tx<C>(self, conn: &mut C) -> ::taskq::Result<::taskq::Enqueued>
            where
                C: ::taskq::AsConnection + ?::core::marker::Sized,
            {
                ::taskq::Enqueue::new(self).enqueue_tx(conn).await
            }

            /// Inserts this task on its own (autocommit), outside any caller transaction, on
            /// either backend's pool.
            pub async fn enqueue<DB: ::taskq::Backend>(
                self,
                pool: &::taskq::__private::sqlx::Pool<DB>,
            ) -> ::taskq::Result<::taskq::Enqueued> {
                ::taskq::Enqueue::new(self).enqueue(pool).await
            }

            /// Starts an enqueue with options (delay, run-at, priority, idempotency key, unique,
            /// queue, max attempts, deadline).
            pub fn enqueue_options(self) -> ::taskq::Enqueue<Self> {
                ::taskq::Enqueue::new(self)
            }

            /// Runs no earlier than `delay` after the insert (database clock).
            pub fn with_delay(self, delay: ::core::time::Duration) -> ::taskq::Enqueue<Self> {
                ::taskq::Enqueue::new(self).with_delay(delay)
            }

            /// Runs no earlier than this UTC time.
            pub fn with_run_at(
                self,
                at: ::taskq::__private::chrono::DateTime<::taskq::__private::chrono::Utc>,
            ) -> ::taskq::Enqueue<Self> {
                ::taskq::Enqueue::new(self).with_run_at(at)
            }

            /// Overrides the task's default priority (lower runs first).
            pub fn with_priority(self, priority: i16) -> ::taskq::Enqueue<Self> {
                ::taskq::Enqueue::new(self).with_priority(priority)
            }

            /// At most one task with this name and key exists while its row is kept; a
            /// duplicate enqueue returns the existing task's id.
            pub fn with_idempotency_key(
                self,
                key: impl ::core::convert::Into<::std::string::String>,
            ) -> ::taskq::Enqueue<Self> {
                ::taskq::Enqueue::new(self).with_idempotency_key(key)
            }

            /// Makes this enqueue unique (or, with `None`, not unique), replacing the task's
            /// `unique` declaration; see `taskq::Unique`.
            pub fn with_unique(
                self,
                unique: impl ::core::convert::Into<::core::option::Option<::taskq::Unique>>,
            ) -> ::taskq::Enqueue<Self> {
                ::taskq::Enqueue::new(self).with_unique(unique)
            }

            /// Overrides the task's queue.
            pub fn with_queue(
                self,
                queue: impl ::core::convert::Into<::std::string::String>,
            ) -> ::taskq::Enqueue<Self> {
                ::taskq::Enqueue::new(self).with_queue(queue)
            }

            /// Overrides the task's max attempts (at least 1).
            pub fn with_max_attempts(self, n: u32) -> ::taskq::Enqueue<Self> {
                ::taskq::Enqueue::new(self).with_max_attempts(n)
            }

            /// No attempt starts at or after this time: a task not started by then ends
            /// `expired`, never run (replaces `with_ttl` and the task's `ttl`).
            pub fn with_deadline(
                self,
                deadline: ::taskq::__private::chrono::DateTime<::taskq::__private::chrono::Utc>,
            ) -> ::taskq::Enqueue<Self> {
                ::taskq::Enqueue::new(self).with_deadline(deadline)
            }

            /// The deadline as a time to live from the insert (database clock; replaces
            /// `with_deadline` and the task's `ttl`).
            pub fn with_ttl(self, ttl: ::core::time::Duration) -> ::taskq::Enqueue<Self> {
                ::taskq::Enqueue::new(self).with_ttl(ttl)
            }

            /// Records this trace context instead of asking the trace-context hook.
            pub fn with_trace_context(
                self,
                context: impl ::core::convert::Into<::std::string::String>,
            ) -> ::taskq::Enqueue<Self> {
                ::taskq::Enqueue::new(self).with_trace_context(context)
            }

            /// Overrides the payload size limit for this enqueue.
            pub fn with_payload_limit(self, bytes: usize) -> ::taskq::Enqueue<Self> {
                ::taskq::Enqueue::new(self).with_payload_limit(bytes)
            }
        }

        #(#cfgs)*
        const _: () = {
            ::taskq::__private::inventory::submit! {
                ::taskq::registry::Registration::of::<#ty>()
            }
        };
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
                ::core::option::Option::Some(::taskq::FollowUp::new(#build))
            },
        );
    }
}

fn duration_tokens(d: std::time::Duration) -> TokenStream {
    let ms = Literal::u64_suffixed(d.as_millis() as u64);
    quote!(::core::time::Duration::from_millis(#ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expand_str(attr: TokenStream, item: TokenStream) -> String {
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
            "< Data < Pool > as :: taskq :: FromTaskContext > :: requirement ()",
            "order_export (self . order_id , self . note , __taskq_inject_2 , __taskq_inject_3)",
            "inventory :: submit !",
            "Registration :: of :: < OrderExport > ()",
            "pub fn with_delay",
            "pub fn with_idempotency_key",
            "const MAX_SNOOZES : u32 = 7u32",
            "const TTL : :: core :: option :: Option < :: core :: time :: Duration > = :: core :: option :: Option :: Some (:: core :: time :: Duration :: from_millis (3600000u64))",
            "pub fn with_deadline",
            "pub fn with_ttl",
            "# [doc = r\" Exports an order.\"]",
        ] {
            assert!(out.contains(needle), "missing {needle:?} in\n{out}");
        }
    }

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
            out.contains("const UNIQUE : :: core :: option :: Option < :: taskq :: Unique > = :: core :: option :: Option :: Some (:: taskq :: Unique :: payload ())"),
            "{out}"
        );
        assert!(out.contains("pub fn with_unique"), "{out}");
        let out = expand_str(quote!(unique(by = [b, a], while = "running")), f.clone());
        assert!(
            out.contains(":: taskq :: Unique :: fields (& [\"bee\" , \"a\"]) . while_running ()"),
            "{out}"
        );
        let out = expand_str(quote!(unique(by = [], period = "1h")), f.clone());
        assert!(
            out.contains(":: taskq :: Unique :: fields (& []) . period (:: core :: time :: Duration :: from_millis (3600000u64))"),
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
                "fn schedule () -> :: core :: option :: Option < :: taskq :: Schedule < Self >>"
            ),
            "{out}"
        );
        assert!(
            out.contains(":: taskq :: Schedule :: new (\"0 3 * * *\" , Self { }) . timezone (\"Europe/Paris\") . missed_ticks (:: taskq :: MissedTicks :: All (5u32))"),
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
            "const ON_DEAD : :: core :: option :: Option < :: taskq :: OnDead >",
            "< ops :: NotifyOps as :: taskq :: __private :: FollowUpFrom < :: taskq :: DeadTask >> :: __taskq_follow_up",
            "const ON_SUCCESS : :: core :: option :: Option < :: taskq :: OnSuccess >",
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

    #[test]
    fn inject_and_serde_attrs_are_moved() {
        let out = expand_str(
            quote!(),
            quote!(
                async fn t(#[serde(default)] n: u32, #[inject] m: Mailer) -> Result<(), E> {
                    Ok(())
                }
            ),
        );
        assert!(out.contains("async fn t (n : u32 , m : Mailer)"), "{out}");
        assert!(out.contains("# [serde (default)] # [doc"), "{out}");
        assert!(
            out.contains("< Mailer as :: taskq :: FromTaskContext >"),
            "{out}"
        );
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
