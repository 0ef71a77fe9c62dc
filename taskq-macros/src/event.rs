//! `#[taskq::event(topic = "...", key = field | key = [f1, f2])]`: implements
//! `taskq::outbox::Event` for a struct with named fields.
//!
//! The struct is emitted unchanged; the impl's `topic()` returns the literal and `key()` the
//! `Display` of the key field, or of each key field joined with `':'`. Every misuse is a compile
//! error on the tokens at fault, and a failed expansion still emits the struct (no cascade of
//! "cannot find type" errors).

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::ext::IdentExt;
use syn::parse::{ParseStream, Parser};
use syn::spanned::Spanned;
use syn::{Expr, Fields, Ident, Item, ItemStruct, Lit, LitStr, Token};

use crate::attr::closest;

/// The longest topic in bytes (the events' `topic` column; matches the runtime's check).
pub const MAX_TOPIC_LEN: usize = 255;

/// The accepted arguments with an example each.
const ARGS: &[(&str, &str)] = &[
    ("topic", "topic = \"orders.placed\""),
    ("key", "key = order_id` or `key = [tenant, order_id]"),
];

const USAGE: &str = "`#[taskq::event(topic = \"orders.placed\", key = order_id)]`";

/// The validated arguments.
#[derive(Debug)]
struct EventArgs {
    topic: String,
    key: Vec<Ident>,
}

/// The macro's entry point: the struct and its `Event` impl, or the errors followed by the item
/// as written.
pub fn expand_or_error(attr: TokenStream, item: TokenStream) -> TokenStream {
    match expand(attr, item.clone()) {
        Ok(out) => out,
        Err(e) => {
            let mut out = e.to_compile_error();
            out.extend(item);
            out
        }
    }
}

/// Parses and validates the arguments and the item (collecting every error), then generates.
pub fn expand(attr: TokenStream, item: TokenStream) -> syn::Result<TokenStream> {
    let item: Item = syn::parse2(item)?;
    let strukt = match item {
        Item::Struct(s) => Ok(s),
        other => Err(syn::Error::new(
            keyword_span(&other),
            format!(
                "`#[taskq::event]` can only be applied to a struct with named fields (the event's \
                 payload), e.g. {USAGE} on `struct OrderPlaced {{ order_id: i64, .. }}`"
            ),
        )),
    };
    match (parse_args(attr), strukt) {
        (Ok(args), Ok(s)) => {
            check_fields(&s, &args)?;
            Ok(generate(&s, &args))
        }
        (Err(mut e), Ok(s)) => {
            // Report the struct's own shape too, when it is wrong.
            if let Err(shape) = named_fields(&s) {
                e.combine(shape);
            }
            Err(e)
        }
        (Err(mut a), Err(s)) => {
            a.combine(s);
            Err(a)
        }
        (Ok(_), Err(e)) => Err(e),
    }
}

fn keyword_span(item: &Item) -> Span {
    match item {
        Item::Enum(i) => i.enum_token.span,
        Item::Fn(i) => i.sig.fn_token.span,
        Item::Union(i) => i.union_token.span,
        Item::Type(i) => i.type_token.span,
        Item::Trait(i) => i.trait_token.span,
        Item::Impl(i) => i.impl_token.span,
        Item::Mod(i) => i.mod_token.span,
        Item::Const(i) => i.const_token.span,
        Item::Static(i) => i.static_token.span,
        other => other.span(),
    }
}

/// The struct's named fields, or an error saying why there are none.
fn named_fields(s: &ItemStruct) -> syn::Result<Vec<&Ident>> {
    match &s.fields {
        Fields::Named(f) => Ok(f.named.iter().filter_map(|f| f.ident.as_ref()).collect()),
        Fields::Unnamed(f) => Err(syn::Error::new(
            f.span(),
            format!(
                "`#[taskq::event]` needs a struct with named fields: the key names fields \
                 (`key = order_id`), so a tuple struct cannot be an event; write \
                 `struct {} {{ order_id: i64, .. }}`",
                s.ident.unraw()
            ),
        )),
        Fields::Unit => Err(syn::Error::new(
            s.ident.span(),
            format!(
                "`#[taskq::event]` needs a struct with named fields: `{}` has none to take the \
                 key from; add the aggregate's id, e.g. `struct {} {{ order_id: i64 }}`",
                s.ident.unraw(),
                s.ident.unraw()
            ),
        )),
    }
}

/// Every key field exists, once.
fn check_fields(s: &ItemStruct, args: &EventArgs) -> syn::Result<()> {
    let fields = named_fields(s)?;
    let names: Vec<String> = fields.iter().map(|f| f.unraw().to_string()).collect();
    let mut errors: Option<syn::Error> = None;
    let mut push = |e: syn::Error| match &mut errors {
        Some(all) => all.combine(e),
        None => errors = Some(e),
    };
    let mut seen: Vec<String> = Vec::new();
    for k in &args.key {
        let name = k.unraw().to_string();
        if seen.contains(&name) {
            push(syn::Error::new(
                k.span(),
                format!("`key` lists `{name}` twice: name each field once"),
            ));
            continue;
        }
        seen.push(name.clone());
        if !names.contains(&name) {
            let suggestion = closest(&name, names.iter().map(String::as_str));
            let list = names
                .iter()
                .map(|n| format!("`{n}`"))
                .collect::<Vec<_>>()
                .join(", ");
            push(syn::Error::new(
                k.span(),
                format!(
                    "`key` names `{name}`, which is not a field of `{}`; {suggestion}its fields: {list}",
                    s.ident.unraw()
                ),
            ));
        }
    }
    match errors {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

fn generate(s: &ItemStruct, args: &EventArgs) -> TokenStream {
    let ident = &s.ident;
    let (impl_generics, ty_generics, where_clause) = s.generics.split_for_impl();
    let topic = LitStr::new(&args.topic, Span::call_site());
    // Each field's `Display`, spanned at the key as written, so a field that has none is
    // reported there.
    let parts = args
        .key
        .iter()
        .map(|k| quote_spanned!(k.span()=> &self.#k as &dyn ::std::fmt::Display));
    let fmt = LitStr::new(&vec!["{}"; args.key.len()].join(":"), Span::call_site());
    let key = quote!(::std::format!(#fmt, #(#parts),*));
    quote! {
        #s

        #[automatically_derived]
        impl #impl_generics ::taskq::outbox::Event for #ident #ty_generics #where_clause {
            fn topic(&self) -> &str {
                #topic
            }

            fn key(&self) -> ::std::string::String {
                #key
            }
        }
    }
}

/// `key = value` pairs separated by commas; every semantic error collected.
fn parse_args(tokens: TokenStream) -> syn::Result<EventArgs> {
    let entries = parse_entries.parse2(tokens)?;
    let mut topic: Option<String> = None;
    let mut key: Option<Vec<Ident>> = None;
    let mut seen: Vec<String> = Vec::new();
    let mut unknown: Vec<String> = Vec::new();
    let mut errors: Option<syn::Error> = None;
    let mut push = |e: syn::Error| match &mut errors {
        Some(all) => all.combine(e),
        None => errors = Some(e),
    };
    for (name, value) in entries {
        let k = name.unraw().to_string();
        if !ARGS.iter().any(|(a, _)| *a == k) {
            unknown.push(k.clone());
            let suggestion = closest(&k, ARGS.iter().map(|(a, _)| *a));
            push(syn::Error::new(
                name.span(),
                format!(
                    "unknown `#[taskq::event]` argument `{k}`; {suggestion}expected `topic` and \
                     `key`, e.g. {USAGE}"
                ),
            ));
            continue;
        }
        if seen.contains(&k) {
            push(syn::Error::new(
                name.span(),
                format!("duplicate `{k}` argument: give it once"),
            ));
            continue;
        }
        seen.push(k.clone());
        match k.as_str() {
            "topic" => match topic_value(&value) {
                Ok(t) => topic = Some(t),
                Err(e) => push(e),
            },
            _ => match key_value(&value) {
                Ok(v) => key = Some(v),
                Err(e) => push(e),
            },
        }
    }
    // A misspelt argument already said what is missing.
    let misspelt = |arg: &str| {
        unknown
            .iter()
            .any(|u: &String| crate::attr::edit_distance(u, arg) <= 2)
    };
    if !seen.iter().any(|k| k == "topic") && !misspelt("topic") {
        push(syn::Error::new(
            Span::call_site(),
            format!(
                "`#[taskq::event]` needs a `topic`: the subject, topic or stream the event is \
                 published to, e.g. {USAGE}"
            ),
        ));
    }
    if !seen.iter().any(|k| k == "key") && !misspelt("key") {
        push(syn::Error::new(
            Span::call_site(),
            format!(
                "`#[taskq::event]` needs a `key`: the field (or fields) that identify the \
                 aggregate, whose events are delivered in commit order, e.g. {USAGE} or \
                 `key = [tenant, order_id]`"
            ),
        ));
    }
    match (errors, topic, key) {
        (Some(e), _, _) => Err(e),
        (None, Some(topic), Some(key)) => Ok(EventArgs { topic, key }),
        (None, _, _) => unreachable!("a missing argument is an error"),
    }
}

fn parse_entries(input: ParseStream<'_>) -> syn::Result<Vec<(Ident, Expr)>> {
    let mut out = Vec::new();
    while !input.is_empty() {
        if !input.peek(Ident::peek_any) {
            return Err(input.error(format!("expected `name = value`, e.g. {USAGE}")));
        }
        let name = input.call(Ident::parse_any)?;
        if !input.peek(Token![=]) {
            let k = name.unraw().to_string();
            let help = ARGS
                .iter()
                .find(|(a, _)| *a == k)
                .map(|(_, e)| format!("`{e}`"))
                .unwrap_or_else(|| USAGE.to_owned());
            return Err(syn::Error::new(
                name.span(),
                format!("expected `=` and a value after `{k}`, e.g. {help}"),
            ));
        }
        input.parse::<Token![=]>()?;
        out.push((name, input.parse()?));
        if input.is_empty() {
            break;
        }
        input.parse::<Token![,]>()?;
    }
    Ok(out)
}

fn peel(expr: &Expr) -> &Expr {
    match expr {
        Expr::Group(g) => peel(&g.expr),
        other => other,
    }
}

/// `topic = "..."`: a string literal of 1 to 255 bytes, no control characters, no surrounding
/// whitespace (the runtime's rules, checked here so a bad topic fails to compile).
fn topic_value(value: &Expr) -> syn::Result<String> {
    let Expr::Lit(syn::ExprLit {
        lit: Lit::Str(lit), ..
    }) = peel(value)
    else {
        return Err(syn::Error::new(
            value.span(),
            "`topic` expects a string literal, e.g. `topic = \"orders.placed\"` (checked at \
             compile time; for a topic known only at run time, implement \
             `taskq::outbox::Event` by hand)",
        ));
    };
    let topic = lit.value();
    let reason = if topic.is_empty() {
        "must not be empty".to_owned()
    } else if topic.len() > MAX_TOPIC_LEN {
        format!(
            "is {} bytes long, the limit is {MAX_TOPIC_LEN}",
            topic.len()
        )
    } else if topic.chars().any(char::is_control) {
        "must not contain control characters".to_owned()
    } else if topic.trim() != topic {
        "must not start or end with whitespace".to_owned()
    } else {
        return Ok(topic);
    };
    Err(syn::Error::new(lit.span(), format!("the topic {reason}")))
}

/// `key = field` or `key = [f1, f2]`: field names (identifiers).
fn key_value(value: &Expr) -> syn::Result<Vec<Ident>> {
    let help = "`key` names the struct's fields (identifiers, not strings): `key = order_id`, or \
                `key = [tenant, order_id]` for several (joined with ':')";
    let ident = |e: &Expr| match peel(e) {
        Expr::Path(p) if p.qself.is_none() && p.attrs.is_empty() => p
            .path
            .get_ident()
            .cloned()
            .ok_or_else(|| syn::Error::new(e.span(), help)),
        other => Err(syn::Error::new(other.span(), help)),
    };
    match peel(value) {
        Expr::Array(a) if a.elems.is_empty() => Err(syn::Error::new(
            a.span(),
            format!("`key` lists no field; {help}"),
        )),
        Expr::Array(a) => a.elems.iter().map(ident).collect(),
        other => ident(other).map(|i| vec![i]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expand_str(attr: TokenStream, item: TokenStream) -> String {
        expand_or_error(attr, item).to_string()
    }

    #[test]
    fn one_field_key() {
        let out = expand_str(
            quote!(topic = "orders.placed", key = order_id),
            quote!(
                struct OrderPlaced {
                    order_id: i64,
                    total_cents: i64,
                }
            ),
        );
        assert!(out.contains("struct OrderPlaced"), "{out}");
        assert!(
            out.contains("impl :: taskq :: outbox :: Event for OrderPlaced"),
            "{out}"
        );
        assert!(out.contains("\"orders.placed\""), "{out}");
        assert!(
            out.contains(
                ":: std :: format ! (\"{}\" , & self . order_id as & dyn :: std :: fmt :: Display)"
            ),
            "{out}"
        );
    }

    #[test]
    fn several_fields_joined_with_colons() {
        let out = expand_str(
            quote!(key = [tenant, r#type], topic = "t"),
            quote!(
                struct E {
                    tenant: String,
                    r#type: u8,
                }
            ),
        );
        assert!(out.contains("\"{}:{}\""), "{out}");
        assert!(out.contains("& self . tenant"), "{out}");
        assert!(out.contains("& self . r#type"), "{out}");
    }

    #[test]
    fn generics_are_kept() {
        let out = expand_str(
            quote!(topic = "t", key = id),
            quote!(
                struct E<T: Clone> {
                    id: T,
                }
            ),
        );
        assert!(
            out.contains("impl < T : Clone > :: taskq :: outbox :: Event for E < T >"),
            "{out}"
        );
    }

    #[test]
    fn errors_are_collected_and_the_item_kept() {
        let out = expand_str(
            quote!(topik = "t", key = "id", topic = ""),
            quote!(
                struct E {
                    id: u8,
                }
            ),
        );
        assert!(out.contains("did you mean `topic`?"), "{out}");
        assert!(!out.contains("needs a `topic`"), "no cascade: {out}");
        assert!(out.contains("identifiers, not strings"), "{out}");
        assert!(out.contains("the topic must not be empty"), "{out}");
        assert!(out.contains("struct E"), "{out}");
        assert!(!out.contains("impl"), "{out}");
    }

    #[test]
    fn missing_arguments() {
        let out = expand_str(
            quote!(),
            quote!(
                struct E {
                    id: u8,
                }
            ),
        );
        assert!(out.contains("needs a `topic`"), "{out}");
        assert!(out.contains("needs a `key`"), "{out}");
    }

    #[test]
    fn topic_rules() {
        let long = "a".repeat(256);
        for (topic, reason) in [
            ("", "must not be empty"),
            (long.as_str(), "is 256 bytes long, the limit is 255"),
            ("a\nb", "control characters"),
            (" a", "whitespace"),
        ] {
            let out = expand_str(
                quote!(topic = #topic, key = id),
                quote!(
                    struct E {
                        id: u8,
                    }
                ),
            );
            assert!(out.contains(reason), "{topic:?}: {out}");
        }
        let ok = "a".repeat(255);
        let out = expand_str(
            quote!(topic = #ok, key = id),
            quote!(
                struct E {
                    id: u8,
                }
            ),
        );
        assert!(out.contains("impl"), "{out}");
    }

    #[test]
    fn wrong_items() {
        for item in [
            quote!(
                enum E {
                    A,
                }
            ),
            quote!(
                fn e() {}
            ),
        ] {
            let out = expand_str(quote!(topic = "t", key = id), item);
            assert!(out.contains("can only be applied to a struct"), "{out}");
        }
        let out = expand_str(
            quote!(topic = "t", key = id),
            quote!(
                struct E(u8);
            ),
        );
        assert!(out.contains("a tuple struct cannot be an event"), "{out}");
        let out = expand_str(
            quote!(topic = "t", key = id),
            quote!(
                struct E;
            ),
        );
        assert!(out.contains("has none to take the key from"), "{out}");
    }

    #[test]
    fn key_fields_are_checked() {
        let out = expand_str(
            quote!(topic = "t", key = [order, order_id, order_id]),
            quote!(
                struct E {
                    order_id: u8,
                    tenant: u8,
                }
            ),
        );
        assert!(
            out.contains("`key` names `order`, which is not a field of `E`"),
            "{out}"
        );
        assert!(out.contains("`key` lists `order_id` twice"), "{out}");
        let out = expand_str(
            quote!(topic = "t", key = []),
            quote!(
                struct E {
                    id: u8,
                }
            ),
        );
        assert!(out.contains("`key` lists no field"), "{out}");
    }
}
