//! The `#[task]` and `#[event]` attribute macros for taskq. Use them through the `taskq` crate
//! (`#[taskq::task]`, `#[taskq::event]`); see `taskq::task`, `taskq::event`, `docs/macro.md`
//! and `docs/outbox.md` for the user guide.
//!
//! This crate is a thin shell: parsing and validation live in `attr` (the attribute
//! arguments) and `sig` (the function signature), code generation in `expand`; all three are
//! plain functions over `proc_macro2` tokens so unit tests can call them directly.
//!
//! Set `TASKQ_MACROS_DEBUG=1` while compiling to print every expansion to stderr.
use proc_macro::TokenStream;

mod attr;
mod cron;
mod duration;
mod event;
mod expand;
mod naming;
mod sig;

/// Turns an `async fn` into a taskq task: payload struct, `Task` impl, enqueue helpers and
/// registration. See the `taskq` crate documentation.
#[proc_macro_attribute]
pub fn task(attr: TokenStream, item: TokenStream) -> TokenStream {
    let out = expand::expand_or_error(attr.into(), item.into());
    if std::env::var_os("TASKQ_MACROS_DEBUG").is_some_and(|v| v == "1") {
        eprintln!("#[taskq::task] expansion:\n{out}\n");
    }
    out.into()
}

/// Implements `taskq::outbox::Event` for a struct: `#[taskq::event(topic = "orders.placed",
/// key = order_id)]` (or `key = [tenant, order_id]`, joined with `':'`). See the `taskq` crate
/// documentation.
#[proc_macro_attribute]
pub fn event(attr: TokenStream, item: TokenStream) -> TokenStream {
    let out = event::expand_or_error(attr.into(), item.into());
    if std::env::var_os("TASKQ_MACROS_DEBUG").is_some_and(|v| v == "1") {
        eprintln!("#[taskq::event] expansion:\n{out}\n");
    }
    out.into()
}
