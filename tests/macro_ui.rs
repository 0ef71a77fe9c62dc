//! Compile-time diagnostics of `#[taskq::task]` (trybuild). Regenerate the expected output
//! with `TRYBUILD=overwrite cargo test -p taskq-tests --test macro_ui`, then read every
//! `.stderr`: each must be a message a user can act on.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("ui/pass/*.rs");
    t.compile_fail("ui/fail/*.rs");
}
