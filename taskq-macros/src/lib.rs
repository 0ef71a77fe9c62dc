//! The `#[task]` attribute macro for taskq (placeholder until the macro lands).
use proc_macro::TokenStream;

/// Placeholder: passes the item through unchanged.
#[proc_macro_attribute]
pub fn task(_attr: TokenStream, item: TokenStream) -> TokenStream {
    item
}
