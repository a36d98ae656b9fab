//! Snapshot (insta + prettyplease) of what `model!` expands the Mistral Small 4 description
//! into, so that any change to the macro or to the description shows as a readable diff.
//!
//! The expansion code is compiled into this test from `dsl/src/expand/` by path: a proc-macro
//! crate exports only its macros, and the module is written against proc_macro2 so it runs here.

#[path = "../../dsl/src/expand/mod.rs"]
mod expand;

#[test]
fn mistral4_expansion() {
    let src = include_str!("../src/model/mistral4.rs");
    let file = syn::parse_file(src).expect("mistral4.rs parses");
    let tokens = file
        .items
        .iter()
        .find_map(|item| match item {
            syn::Item::Macro(m) if m.mac.path.is_ident("model") => Some(m.mac.tokens.clone()),
            _ => None,
        })
        .expect("mistral4.rs holds a model! invocation");
    let expanded = expand::expand(tokens);
    let file: syn::File = syn::parse2(expanded).expect("the expansion is a Rust item");
    insta::assert_snapshot!("mistral4_expansion", prettyplease::unparse(&file));
}
