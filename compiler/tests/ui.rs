//! Diagnostics of the `model!` DSL (trybuild): each error case has its `.stderr` (unknown op,
//! wrong arity, unknown weight, visible shape mismatch, misused names, and an attribute of the
//! wrong type, which rustc reports at the attribute through the builder's signature); a
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
    t.compile_fail("tests/ui/attr_type.rs");
}
