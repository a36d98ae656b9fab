//! The expansion of `model!`, kept free of the `proc_macro` API so that it can also be compiled
//! into tests (the compiler's expansion snapshot includes this module by path).
//!
//! Algorithm note: parse (syntax only, `parse.rs`) → check (names, op table, arity, weights,
//! visible shape mismatches; `check.rs`) → generate (builder calls; `generate.rs`). Diagnostics
//! are spanned `syn::Error`s, never panics; when the check fails the function's signature is
//! still emitted around the errors, so callers type-check and only the real error is reported.

mod check;
mod generate;
mod parse;
mod tables;

use proc_macro2::TokenStream;

/// Expands the tokens inside `model! { … }` into the graph-building function, or into
/// `compile_error!`s at the offending spans.
pub fn expand(input: TokenStream) -> TokenStream {
    let model: parse::ModelDef = match syn::parse2(input) {
        Ok(m) => m,
        Err(e) => return e.to_compile_error(),
    };
    match check::check(&model) {
        Ok(checked) => generate::generate(&model, &checked),
        Err(e) => {
            let sig = generate::signature(&model);
            let errors = e.to_compile_error();
            quote::quote!(#sig { #errors })
        }
    }
}
