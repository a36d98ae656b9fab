//! Diagnostics of the `model!` DSL (trybuild): each error case has its `.stderr`, and a
//! well-formed description compiles and runs.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass.rs");
    t.compile_fail("tests/ui/unknown_op.rs");
    t.compile_fail("tests/ui/wrong_arity.rs");
    t.compile_fail("tests/ui/unknown_weight.rs");
    t.compile_fail("tests/ui/shape_mismatch.rs");
    t.compile_fail("tests/ui/misused_names.rs");
}
