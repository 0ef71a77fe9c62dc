//! The program is `src/main.rs`. This library holds only the Rust snippets of
//! docs/outbox.md, compiled as doctests of this crate (which has the outbox's every feature),
//! so that each one a reader copies compiles.

/// The Rust snippets of docs/outbox.md.
#[cfg(doctest)]
pub mod doc_snippets {
    #[doc = include_str!("../../../docs/outbox.md")]
    pub struct Outbox;
}
