//! Validation of the handler's signature and classification of its parameters into payload
//! fields and injected values.

use proc_macro2::Span;
use syn::spanned::Spanned;
use syn::{Attribute, FnArg, Ident, ItemFn, Pat, PathArguments, ReturnType, Type};

/// Last path segments of taskq's own extractors: an unmarked parameter of one of these types is
/// injected, every other unmarked one is payload. This is only the default classification (a
/// macro sees tokens, not traits); the value is extracted through `FromTaskContext` whatever
/// the type, and a payload type that implements `FromTaskContext` but not `Serialize` is a
/// compile error that asks for `#[inject]` (see `expand::payload`).
pub const INJECTED_TYPES: &[&str] = &["TaskContext", "CancelSignal", "Data"];

/// Last path segment of taskq's former name for `Data` (and of axum's extractor): a parameter
/// of this type without `#[payload]` or `#[inject]` is an error that names `Data<T>`.
const FORMER_DATA_NAME: &str = "State";

/// One parameter of the handler.
#[derive(Clone)]
pub struct Param {
    /// Its type as written.
    pub ty: Type,
    /// Payload field or injected value.
    pub kind: ParamKind,
}

/// How a parameter gets its value when the task runs.
#[derive(Clone)]
pub enum ParamKind {
    /// Serialized in the payload struct as a field of this name.
    Payload {
        /// Field name (the parameter's name without `mut` or `r#`).
        ident: Ident,
        /// `#[serde(...)]` attributes moved from the parameter to the field.
        serde_attrs: Vec<Attribute>,
    },
    /// Extracted from the task context through `FromTaskContext`.
    Injected,
}

/// What the code generator needs to know about the handler.
#[derive(Clone)]
pub struct Handler {
    /// Parameters in declaration order.
    pub params: Vec<Param>,
    /// Span of the return type (for spanned conversion checks).
    pub ret_span: Span,
}

impl Handler {
    /// The payload parameters.
    pub fn payload(&self) -> impl Iterator<Item = (&Ident, &Type, &[Attribute])> {
        self.params.iter().filter_map(|p| match &p.kind {
            ParamKind::Payload { ident, serde_attrs } => {
                Some((ident, &p.ty, serde_attrs.as_slice()))
            }
            ParamKind::Injected => None,
        })
    }
}

/// Removes the attributes the macro consumes (`#[inject]`, `#[payload]`, `#[serde(...)]`) from
/// the parameters, so that the function can be emitted as the user wrote it even when the
/// signature has errors. Returns each parameter's consumed attributes, in order.
pub fn strip_param_attrs(f: &mut ItemFn) -> Vec<Vec<Attribute>> {
    f.sig
        .inputs
        .iter_mut()
        .map(|arg| {
            let attrs = match arg {
                FnArg::Typed(t) => &mut t.attrs,
                FnArg::Receiver(r) => &mut r.attrs,
            };
            let (ours, theirs): (Vec<_>, Vec<_>) =
                std::mem::take(attrs).into_iter().partition(|a| {
                    ["inject", "payload", "serde"]
                        .iter()
                        .any(|n| a.path().is_ident(n))
                });
            *attrs = theirs;
            ours
        })
        .collect()
}

/// Checks the signature and classifies the parameters. `consumed` is what
/// [`strip_param_attrs`] returned. Every problem found is reported, combined.
pub fn analyze(f: &ItemFn, consumed: &[Vec<Attribute>]) -> syn::Result<Handler> {
    let sig = &f.sig;
    let mut errors = Errors::default();
    let name = &sig.ident;

    if sig.asyncness.is_none() {
        errors.push(syn::Error::new(
            sig.fn_token.span,
            format!("`#[taskq::task]` handlers must be async: write `async fn {name}`"),
        ));
    }
    if let Some(c) = &sig.constness {
        errors.push(syn::Error::new(
            c.span,
            "a task handler cannot be a `const fn`",
        ));
    }
    if let Some(u) = &sig.unsafety {
        errors.push(syn::Error::new(
            u.span,
            "a task handler cannot be an `unsafe fn`",
        ));
    }
    if let Some(abi) = &sig.abi {
        errors.push(syn::Error::new(
            abi.span(),
            "a task handler cannot have an `extern` ABI",
        ));
    }
    if let Some(v) = &sig.variadic {
        errors.push(syn::Error::new(
            v.span(),
            "a task handler cannot be variadic",
        ));
    }
    if !sig.generics.params.is_empty() || sig.generics.where_clause.is_some() {
        let span = if sig.generics.params.is_empty() {
            sig.generics.where_clause.span()
        } else {
            sig.generics.span()
        };
        errors.push(syn::Error::new(
            span,
            "a task handler cannot have generic or lifetime parameters: its payload is decoded from JSON into one concrete type; use concrete, owned types",
        ));
    }

    let mut params = Vec::new();
    for (arg, attrs) in sig.inputs.iter().zip(consumed) {
        let pt = match arg {
            FnArg::Receiver(r) => {
                errors.push(syn::Error::new(
                    r.self_token.span,
                    "a task handler cannot take `self`: write a free `async fn` (the macro generates the payload struct from its parameters)",
                ));
                continue;
            }
            FnArg::Typed(pt) => pt,
        };
        let marker = |n: &str| attrs.iter().find(|a| a.path().is_ident(n));
        let serde_attrs: Vec<Attribute> = attrs
            .iter()
            .filter(|a| a.path().is_ident("serde"))
            .cloned()
            .collect();
        for a in attrs.iter().filter(|a| !a.path().is_ident("serde")) {
            if !matches!(a.meta, syn::Meta::Path(_)) {
                errors.push(syn::Error::new(
                    a.meta.span(),
                    format!(
                        "`#[{}]` takes no arguments",
                        a.path()
                            .get_ident()
                            .map(Ident::to_string)
                            .unwrap_or_default()
                    ),
                ));
            }
        }
        let ty = (*pt.ty).clone();
        let injected = match (marker("inject"), marker("payload")) {
            (Some(_), Some(p)) => {
                errors.push(syn::Error::new(
                    p.span(),
                    "a parameter cannot be both `#[inject]` and `#[payload]`",
                ));
                continue;
            }
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) => {
                if let Some(e) = former_data_name(pt, &ty) {
                    errors.push(e);
                    continue;
                }
                is_injected_type(&ty)
            }
        };
        if let Type::ImplTrait(it) = &ty {
            errors.push(syn::Error::new(
                it.span(),
                "`impl Trait` parameters are generic, which a task handler cannot be; use a concrete type",
            ));
            continue;
        }
        if injected {
            if let Some(a) = serde_attrs.first() {
                errors.push(syn::Error::new(
                    a.span(),
                    "`#[serde(...)]` only applies to payload parameters, not to injected ones",
                ));
            }
            params.push(Param {
                ty,
                kind: ParamKind::Injected,
            });
            continue;
        }
        let ident = match &*pt.pat {
            Pat::Ident(pi) if pi.by_ref.is_none() && pi.subpat.is_none() => pi.ident.clone(),
            other => {
                errors.push(syn::Error::new(
                    other.span(),
                    "payload parameters must be plain identifiers (`order_id: i64`): the name becomes the payload field's name; destructure inside the body instead",
                ));
                continue;
            }
        };
        if let Type::Reference(r) = &ty {
            errors.push(syn::Error::new(
                r.span(),
                format!(
                    "payload parameter `{}` cannot be a reference: payloads are decoded from JSON into owned values; use {}",
                    ident,
                    owned_suggestion(r)
                ),
            ));
            continue;
        }
        params.push(Param {
            ty,
            kind: ParamKind::Payload { ident, serde_attrs },
        });
    }

    let ret_span = match &sig.output {
        ReturnType::Default => {
            errors.push(syn::Error::new(
                name.span(),
                format!(
                    "task handler `{name}` must return `Result<T, E>` where `T: Serialize` is its output (`()` for none) and `E: Into<taskq::TaskError>`; add `-> Result<(), taskq::TaskError>`"
                ),
            ));
            Span::call_site()
        }
        ReturnType::Type(_, ty) => {
            if let Err(e) = check_return_type(ty) {
                errors.push(e);
            }
            ty.span()
        }
    };

    errors.finish(Handler { params, ret_span })
}

/// Whether the type's last path segment is one of [`INJECTED_TYPES`].
pub fn is_injected_type(ty: &Type) -> bool {
    match ty {
        Type::Path(tp) if tp.qself.is_none() => tp
            .path
            .segments
            .last()
            .is_some_and(|s| INJECTED_TYPES.iter().any(|n| s.ident == n)),
        Type::Group(g) => is_injected_type(&g.elem),
        Type::Paren(p) => is_injected_type(&p.elem),
        _ => false,
    }
}

/// The error for a parameter typed `State<T>` (taskq's shared values are `Data<T>`), if it is
/// one.
fn former_data_name(pt: &syn::PatType, ty: &Type) -> Option<syn::Error> {
    let Type::Path(tp) = ty else { return None };
    let last = tp.path.segments.last()?;
    if tp.qself.is_some() || last.ident != FORMER_DATA_NAME {
        return None;
    }
    let inner = match &last.arguments {
        PathArguments::AngleBracketed(a) => tidy_tokens(&a.args),
        _ => "T".to_owned(),
    };
    let param = match &*pt.pat {
        Pat::Ident(pi) => format!("{}: ", pi.ident),
        _ => String::new(),
    };
    Some(syn::Error::new(
        ty.span(),
        format!(
            "taskq injects shared values as `taskq::Data<T>`, not `State<T>`: write \
             `{param}Data<{inner}>` (with `use taskq::Data;`) and register the value with \
             `WorkerBuilder::data`; if `State` is a payload type of yours, mark the parameter \
             `#[payload]`"
        ),
    ))
}

/// Tokens as a person would write them (`sqlx::Pool<MySql>`, not `sqlx :: Pool < MySql >`).
fn tidy_tokens(t: &impl quote::ToTokens) -> String {
    quote::quote!(#t)
        .to_string()
        .replace(" :: ", "::")
        .replace(":: ", "::")
        .replace(" < ", "<")
        .replace(" <", "<")
        .replace("< ", "<")
        .replace(" >", ">")
        .replace(" ,", ",")
}

fn owned_suggestion(r: &syn::TypeReference) -> String {
    match &*r.elem {
        Type::Path(p) if p.path.is_ident("str") => "`String`".into(),
        Type::Slice(s) => {
            let elem = &s.elem;
            format!("`Vec<{}>`", quote::quote!(#elem))
        }
        Type::Path(p) if p.path.is_ident("Path") => "`PathBuf`".into(),
        other => format!("`{}`", quote::quote!(#other)),
    }
}

/// Rejects return types that cannot be `Result<T, E>`. A path may be an alias, so it is left to
/// the type checker (the generated code checks it, `T: Serialize` included, with a span on the
/// return type).
fn check_return_type(ty: &Type) -> syn::Result<()> {
    let wrong = |span: Span| {
        syn::Error::new(
            span,
            "a task handler must return `Result<T, E>` where `T: Serialize` is its output (`()` for none) and `E: Into<taskq::TaskError>` (e.g. `Result<(), taskq::TaskError>`)",
        )
    };
    match ty {
        Type::Group(g) => check_return_type(&g.elem),
        Type::Paren(p) => check_return_type(&p.elem),
        Type::Path(_) => Ok(()),
        other => Err(wrong(other.span())),
    }
}

/// Accumulates errors with `syn::Error::combine`.
#[derive(Default)]
struct Errors(Option<syn::Error>);

impl Errors {
    fn push(&mut self, e: syn::Error) {
        match &mut self.0 {
            Some(all) => all.combine(e),
            None => self.0 = Some(e),
        }
    }
    fn finish<T>(self, value: T) -> syn::Result<T> {
        match self.0 {
            Some(e) => Err(e),
            None => Ok(value),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use syn::parse_quote;

    fn run(mut f: ItemFn) -> syn::Result<Handler> {
        let consumed = strip_param_attrs(&mut f);
        analyze(&f, &consumed)
    }

    fn errors(f: ItemFn) -> Vec<String> {
        match run(f) {
            Ok(_) => panic!("expected errors"),
            Err(e) => e.into_iter().map(|e| e.to_string()).collect(),
        }
    }

    #[test]
    fn classifies_payload_and_injected_params() {
        let h = run(parse_quote! {
            async fn order_export(
                order_id: i64,
                mut note: String,
                cx: TaskContext,
                db: taskq::Data<Pool>,
                stop: CancelSignal,
                #[inject] mailer: Mailer,
                #[payload] state: State,
                #[serde(default)] r#type: u8,
            ) -> Result<(), MyError> { Ok(()) }
        })
        .unwrap();
        let payload: Vec<String> = h.payload().map(|(i, _, _)| i.to_string()).collect();
        assert_eq!(payload, ["order_id", "note", "state", "r#type"]);
        let injected = h
            .params
            .iter()
            .filter(|p| matches!(p.kind, ParamKind::Injected));
        assert_eq!(injected.count(), 4);
        let serde_attrs = h.payload().map(|(_, _, a)| a.len()).collect::<Vec<_>>();
        assert_eq!(serde_attrs, [0, 0, 0, 1]);
    }

    #[test]
    fn strips_consumed_attrs_and_keeps_others() {
        let mut f: ItemFn = parse_quote! {
            async fn t(#[inject] a: A, #[cfg(test)] #[serde(default)] b: u8) -> Result<(), E> { Ok(()) }
        };
        let consumed = strip_param_attrs(&mut f);
        assert_eq!(consumed[0].len(), 1);
        assert_eq!(consumed[1].len(), 1);
        let kept: Vec<usize> = f
            .sig
            .inputs
            .iter()
            .map(|a| match a {
                FnArg::Typed(t) => t.attrs.len(),
                FnArg::Receiver(_) => 0,
            })
            .collect();
        assert_eq!(kept, [0, 1]);
    }

    #[test]
    fn state_params_name_data_unless_marked() {
        let e = errors(parse_quote!(
            async fn t(id: u64, db: taskq::State<sqlx::Pool<MySql>>, s: State) -> Result<(), E> {
                Ok(())
            }
        ));
        assert_eq!(
            e,
            [
                "taskq injects shared values as `taskq::Data<T>`, not `State<T>`: write \
                 `db: Data<sqlx::Pool<MySql>>` (with `use taskq::Data;`) and register the value \
                 with `WorkerBuilder::data`; if `State` is a payload type of yours, mark the \
                 parameter `#[payload]`",
                "taskq injects shared values as `taskq::Data<T>`, not `State<T>`: write \
                 `s: Data<T>` (with `use taskq::Data;`) and register the value with \
                 `WorkerBuilder::data`; if `State` is a payload type of yours, mark the \
                 parameter `#[payload]`",
            ]
        );
        // Marked, it is what the marker says.
        let h = run(parse_quote!(
            async fn t(#[payload] s: State, #[inject] a: State<A>) -> Result<(), E> {
                Ok(())
            }
        ))
        .unwrap();
        let kinds: Vec<bool> = h
            .params
            .iter()
            .map(|p| matches!(p.kind, ParamKind::Injected))
            .collect();
        assert_eq!(kinds, [false, true]);
    }

    #[test]
    fn rejects_non_async() {
        let e = errors(parse_quote!(
            fn t() -> Result<(), E> {
                Ok(())
            }
        ));
        assert_eq!(
            e,
            ["`#[taskq::task]` handlers must be async: write `async fn t`"]
        );
    }

    #[test]
    fn rejects_self_generics_references_and_patterns() {
        let e = errors(parse_quote!(
            async fn t(&self) -> Result<(), E> {
                Ok(())
            }
        ));
        assert!(e[0].contains("cannot take `self`"), "{e:?}");
        let e = errors(parse_quote!(
            async fn t<T>(x: T) -> Result<(), E> {
                Ok(())
            }
        ));
        assert!(e[0].contains("cannot have generic"), "{e:?}");
        let e = errors(parse_quote!(
            async fn t(x: i32) -> Result<(), E>
            where
                i32: Copy,
            {
                Ok(())
            }
        ));
        assert!(e[0].contains("cannot have generic"), "{e:?}");
        let e = errors(parse_quote!(
            async fn t(s: &str) -> Result<(), E> {
                Ok(())
            }
        ));
        assert!(
            e[0].contains("cannot be a reference") && e[0].contains("use `String`"),
            "{e:?}"
        );
        let e = errors(parse_quote!(
            async fn t(s: &[u8]) -> Result<(), E> {
                Ok(())
            }
        ));
        assert!(e[0].contains("use `Vec<u8>`"), "{e:?}");
        let e = errors(parse_quote!(
            async fn t((a, b): (i32, i32)) -> Result<(), E> {
                Ok(())
            }
        ));
        assert!(e[0].contains("plain identifiers"), "{e:?}");
        let e = errors(parse_quote!(
            async fn t(x: impl Send) -> Result<(), E> {
                Ok(())
            }
        ));
        assert!(e[0].contains("`impl Trait`"), "{e:?}");
        // injected parameters may use any pattern
        assert!(
            run(parse_quote!(
                async fn t(_: TaskContext) -> Result<(), E> {
                    Ok(())
                }
            ))
            .is_ok()
        );
    }

    #[test]
    fn checks_the_return_type() {
        let e = errors(parse_quote!(
            async fn t() {}
        ));
        assert!(e[0].contains("must return `Result<T, E>`"), "{e:?}");
        let e = errors(parse_quote!(
            async fn t() -> (i32, E) {
                todo!()
            }
        ));
        assert!(e[0].contains("must return `Result<T, E>`"), "{e:?}");
        for ok in [
            parse_quote!(
                async fn t() -> Result<(), E> {
                    todo!()
                }
            ),
            parse_quote!(
                async fn t() -> std::io::Result<()> {
                    todo!()
                }
            ),
            parse_quote!(
                async fn t() -> MyAlias {
                    todo!()
                }
            ),
            // `T` is the task's output
            parse_quote!(
                async fn t() -> Result<Report, E> {
                    todo!()
                }
            ),
        ] {
            assert!(run(ok).is_ok());
        }
    }

    #[test]
    fn reports_every_error_at_once() {
        let e = errors(parse_quote!(
            fn t<T>(&self, s: &str) {}
        ));
        assert_eq!(e.len(), 5, "{e:?}");
    }

    #[test]
    fn marker_attrs_take_no_arguments() {
        let e = errors(parse_quote!(
            async fn t(#[inject(x)] a: A) -> Result<(), E> {
                Ok(())
            }
        ));
        assert!(e[0].contains("`#[inject]` takes no arguments"), "{e:?}");
        let e = errors(parse_quote!(
            async fn t(#[serde(default)] cx: TaskContext) -> Result<(), E> {
                Ok(())
            }
        ));
        assert!(e[0].contains("only applies to payload"), "{e:?}");
    }
}
