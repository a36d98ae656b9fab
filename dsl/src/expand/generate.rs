//! Generation: the checked description → a Rust function that drives
//! `aubier_compiler::builder::Builder`.
//!
//! Algorithm note. The function keeps the description's name, docs, visibility and parameters
//! (the `weights` parameter becomes `&BTreeMap<String, WeightRef>`) and returns
//! `Result<Graph, CompileError>`. Each statement becomes Rust statements in the same order:
//! `input` → `b.input(..)?`; `let` → a block that evaluates nested operands into temporaries
//! first (`b` is borrowed mutably by every call, so calls cannot nest) and ends in one builder
//! call, then `b.name(..)` with the binding's name (prefixed `blk.{l}.` inside a layer loop);
//! `for` → a Rust `for`; `match` → a Rust `match` whose arms are such blocks; `output` →
//! `b.output(..)?`. An op call `op(a, b; x, y)` becomes `b.op(a, b, x, y)?` (`moe_ffn`, being
//! variadic, gets its operands as a slice), so rustc checks the attributes against the builder's
//! typed signature, at the attribute's span. Weights become `b.weight("<GGUF name>")?`. The
//! builder and temporaries use mixed-site hygiene, so they cannot clash with the description's
//! names.

use super::check::Checked;
use super::parse::{Call, Expr, ModelDef, Param, Stmt, WeightPath};
use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::{Ident, LitStr};

/// The generated function for `m`.
pub fn generate(m: &ModelDef, checked: &Checked) -> TokenStream {
    let mut g = Gen {
        b: Ident::new("b", Span::mixed_site()),
        mutated: &checked.mutated,
        next_binding: 0,
        loop_vars: Vec::new(),
    };
    let body = g.stmts(&m.body);
    let b = &g.b;
    let w = &checked.weights;
    let sig = signature(m);
    quote! {
        #sig {
            let mut #b = ::aubier_compiler::builder::Builder::new(#w);
            #body
            #b.finish()
        }
    }
}

/// `#[attrs] vis fn name(params) -> Result<Graph, CompileError>`, also used for the stub emitted
/// around diagnostics.
pub fn signature(m: &ModelDef) -> TokenStream {
    let attrs = &m.attrs;
    let vis = &m.vis;
    let name = &m.name;
    let params = m.params.iter().map(|p| match p {
        Param::Rust { name, ty } => quote!(#name: #ty),
        Param::Weights { name } => quote! {
            #name: &::std::collections::BTreeMap<::std::string::String, ::aubier_compiler::types::WeightRef>
        },
    });
    quote! {
        #(#attrs)*
        #vis fn #name(#(#params),*) -> ::core::result::Result<::aubier_compiler::ir::Graph, ::aubier_compiler::error::CompileError>
    }
}

struct Gen<'a> {
    b: Ident,
    mutated: &'a [bool],
    next_binding: usize,
    loop_vars: Vec<Ident>,
}

/// Statements being accumulated for one DSL statement, with their temporaries.
struct Block {
    stmts: Vec<TokenStream>,
    next_tmp: usize,
}

impl Block {
    fn new() -> Self {
        Block {
            stmts: Vec::new(),
            next_tmp: 0,
        }
    }

    fn tmp(&mut self) -> Ident {
        let t = Ident::new(&format!("t{}", self.next_tmp), Span::mixed_site());
        self.next_tmp += 1;
        t
    }
}

impl Gen<'_> {
    fn stmts(&mut self, stmts: &[Stmt]) -> TokenStream {
        stmts.iter().map(|s| self.stmt(s)).collect()
    }

    /// `mut` when the next binding, in the checker's order, is reassigned; nothing otherwise.
    fn mut_kw(&mut self) -> TokenStream {
        let m = self
            .mutated
            .get(self.next_binding)
            .copied()
            .unwrap_or(false);
        self.next_binding += 1;
        if m {
            quote!(mut)
        } else {
            TokenStream::new()
        }
    }

    /// The dump name of binding `name`: `"x"`, or `format!("blk.{}.x", l)` inside a layer loop.
    fn node_name(&self, name: &Ident) -> TokenStream {
        match self.loop_vars.last() {
            None => {
                let s = LitStr::new(&name.to_string(), name.span());
                quote!(#s)
            }
            Some(l) => {
                let s = LitStr::new(&format!("blk.{{}}.{name}"), name.span());
                quote!(::std::format!(#s, #l))
            }
        }
    }

    fn stmt(&mut self, s: &Stmt) -> TokenStream {
        let b = self.b.clone();
        match s {
            Stmt::Input { name, dims, dtype } => {
                let m = self.mut_kw();
                let dt = if dtype == "i32" {
                    quote!(::aubier_compiler::types::DType::I32)
                } else {
                    quote!(::aubier_compiler::types::DType::F32)
                };
                let shape = shape(dims.iter());
                let s = LitStr::new(&name.to_string(), name.span());
                quote! { let #m #name = #b.input(#s, #dt, #shape)?; }
            }
            Stmt::Let {
                names,
                tuple: None,
                value,
            } => {
                let m = self.mut_kw();
                let Some(name) = names.first() else {
                    return TokenStream::new();
                };
                let value = self.block_expr(value);
                let label = self.node_name(name);
                quote! {
                    let #m #name = #value;
                    #b.name(#name, #label);
                }
            }
            Stmt::Let {
                names,
                tuple: Some(_),
                value,
            } => {
                let muts: Vec<TokenStream> = names.iter().map(|_| self.mut_kw()).collect();
                let value = self.split(value);
                let labels: Vec<TokenStream> = names.iter().map(|n| self.node_name(n)).collect();
                quote! {
                    let (#(#muts #names),*) = #value;
                    #(#b.name(#names, #labels);)*
                }
            }
            Stmt::Assign { name, value } => {
                let value = self.block_expr(value);
                let label = self.node_name(name);
                quote! {
                    #name = #value;
                    #b.name(#name, #label);
                }
            }
            Stmt::For { var, range, body } => {
                self.loop_vars.push(var.clone());
                let body = self.stmts(body);
                self.loop_vars.pop();
                quote! { for #var in #range { #body } }
            }
            Stmt::Output { name, value } => {
                let value = self.block_expr(value);
                let name = if name.value().contains('{') {
                    quote!(::std::format!(#name))
                } else {
                    quote!(::std::string::String::from(#name))
                };
                let v = Ident::new("value", Span::mixed_site());
                quote! {
                    let #v = #value;
                    #b.output(#name, #v)?;
                }
            }
        }
    }

    /// `e` as one Rust expression: a block of temporaries ending in the last builder call, or the
    /// call alone when there are none.
    fn block_expr(&mut self, e: &Expr) -> TokenStream {
        let mut blk = Block::new();
        let v = self.expr(e, &mut blk);
        if blk.stmts.is_empty() {
            v
        } else {
            let stmts = &blk.stmts;
            quote!({ #(#stmts)* #v })
        }
    }

    /// `e` as an expression of type `NodeId`; nested operands go to temporaries in `blk`.
    fn expr(&mut self, e: &Expr, blk: &mut Block) -> TokenStream {
        let b = self.b.clone();
        match e {
            Expr::Value(name) => quote!(#name),
            Expr::Paren(inner) => self.expr(inner, blk),
            Expr::Weight(w) => {
                let name = weight_name(w);
                quote!(#b.weight(#name)?)
            }
            Expr::Binary { op, lhs, rhs } => {
                let l = self.operand(lhs, blk);
                let r = self.operand(rhs, blk);
                let method = Ident::new(op.op_name(), op.span());
                quote!(#b.#method(#l, #r)?)
            }
            Expr::Match {
                kw,
                scrutinee,
                arms,
            } => {
                let arms = arms.iter().map(|(pat, body)| {
                    let body = self.block_expr(body);
                    quote!(#pat => #body,)
                });
                let arms: Vec<TokenStream> = arms.collect();
                quote_spanned!(kw.span=> match #scrutinee { #(#arms)* })
            }
            Expr::Call(call) => self.call(call, blk),
        }
    }

    /// An operand: a bound name as is, anything else evaluated into a temporary first.
    fn operand(&mut self, e: &Expr, blk: &mut Block) -> TokenStream {
        match e {
            Expr::Value(name) => quote!(#name),
            Expr::Paren(inner) => self.operand(inner, blk),
            _ => {
                let v = self.expr(e, blk);
                let t = blk.tmp();
                blk.stmts.push(quote!(let #t = #v;));
                quote!(#t)
            }
        }
    }

    fn call(&mut self, call: &Call, blk: &mut Block) -> TokenStream {
        let b = self.b.clone();
        let operands: Vec<TokenStream> =
            call.operands.iter().map(|o| self.operand(o, blk)).collect();
        let attrs: Vec<TokenStream> = if call.op == "reshape" {
            call.attrs
                .iter()
                .map(|a| match a {
                    syn::Expr::Array(arr) => shape(arr.elems.iter()),
                    other => quote!(#other),
                })
                .collect()
        } else {
            call.attrs.iter().map(|a| quote!(#a)).collect()
        };
        let op = &call.op;
        if call.op == "moe_ffn" {
            quote!(#b.#op(&[#(#operands),*], #(#attrs),*)?)
        } else {
            quote!(#b.#op(#(#operands,)* #(#attrs),*)?)
        }
    }

    /// `split(x; [n0, n1, …])` → a tuple of slices at running offsets.
    fn split(&mut self, e: &Expr) -> TokenStream {
        let b = self.b.clone();
        let mut blk = Block::new();
        let Expr::Call(call) = e else {
            return TokenStream::new();
        };
        let (Some(x), [syn::Expr::Array(widths)]) = (call.operands.first(), call.attrs.as_slice())
        else {
            return TokenStream::new();
        };
        let x = self.operand(x, &mut blk);
        let mut slices = Vec::new();
        let mut offset = quote!(0);
        for (i, w) in widths.elems.iter().enumerate() {
            let n = format_ident!("n{}", i, span = Span::mixed_site());
            blk.stmts.push(quote!(let #n: usize = #w;));
            slices.push(quote!(#b.slice(#x, #offset, #n)?));
            offset = if i == 0 {
                quote!(#n)
            } else {
                quote!(#offset + #n)
            };
        }
        let stmts = &blk.stmts;
        quote!({ #(#stmts)* (#(#slices),*) })
    }
}

/// A shape literal `[T, S, expr…]` → `Shape(vec![Dim::…])`.
fn shape<'a>(dims: impl Iterator<Item = &'a syn::Expr>) -> TokenStream {
    let dims = dims.map(|d| match d {
        syn::Expr::Path(p) if p.path.is_ident("T") => quote!(::aubier_compiler::types::Dim::Tokens),
        syn::Expr::Path(p) if p.path.is_ident("S") => quote!(::aubier_compiler::types::Dim::Keys),
        other => quote!(::aubier_compiler::types::Dim::Fixed(#other)),
    });
    quote!(::aubier_compiler::types::Shape(::std::vec![#(#dims),*]))
}

/// The GGUF tensor name of a weight path: `"token_embd.weight"` or
/// `format!("blk.{}.attn_q_a.weight", l)`.
fn weight_name(w: &WeightPath) -> TokenStream {
    let name = &w.name;
    match &w.block {
        None => {
            let s = LitStr::new(&format!("{name}.weight"), name.span());
            quote!(#s)
        }
        Some((_, index)) => {
            let s = LitStr::new(&format!("blk.{{}}.{name}.weight"), name.span());
            quote!(&::std::format!(#s, #index))
        }
    }
}
