//! `aubier-dsl`: the proc-macro language the model is described in (ARCHITECTURE.md § dsl).
//!
//! `model! { fn name(cfg: &Config, w: weights) { … } }` expands into
//! `fn name(cfg: &Config, w: &BTreeMap<String, WeightRef>) -> Result<Graph, CompileError>`, a
//! function that builds the model's `aubier_compiler::ir::Graph` through
//! `aubier_compiler::builder::Builder`. The grammar is in `expand/parse.rs`; an example is
//! `compiler/src/model/mistral4.rs`.
//!
//! One source of truth for ops: the op table's rows live in `compiler/src/op_table.in`. The
//! compiler `include!`s it under the `op_table!` macro that generates `enum Op`; this crate
//! `include!`s the same file under its own `op_table!` that keeps names, arity and flags as a
//! constant (`expand/tables.rs`). A proc-macro crate cannot depend on the crate whose IR it
//! emits, and including the file (rather than parsing `ops.rs` at expansion time, or generating
//! a copy) keeps the table compile-time checked in both crates with no build script. Unknown
//! ops, wrong arity, unknown weights and visible shape mismatches are compile errors at their
//! spans; attribute types are checked by rustc against the builder's per-op signatures.

mod expand;

/// Describes a model as a function that builds its compiler graph; see the crate docs.
#[proc_macro]
pub fn model(input: proc_macro::TokenStream) -> proc_macro::TokenStream {
    expand::expand(input.into()).into()
}
