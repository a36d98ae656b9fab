//! Parsing: tokens → the description's syntax tree. Nothing here knows the op table; names are
//! resolved by `check`.
//!
//! Grammar (`⟨rust-expr⟩`, `⟨rust-pat⟩` and `⟨rust-type⟩` are ordinary Rust, parsed by syn):
//! ```text
//! model  := outer-attrs vis `fn` IDENT `(` param,* `)` `{` stmt* `}`
//! param  := IDENT `:` `weights` | IDENT `:` ⟨rust-type⟩
//! stmt   := `input` IDENT `:` `[` dim,* `]` (`i32`|`f32`) `;`
//!         | `let` IDENT `=` expr `;` | `let` `(` IDENT,+ `)` `=` expr `;`
//!         | IDENT `=` expr `;`
//!         | `for` IDENT `in` ⟨rust-expr⟩ `{` stmt* `}`
//!         | `output` STRING `=` expr `;`
//! expr   := term (`+` term)*          term := atom (`*` atom)*
//! atom   := IDENT                                     a bound value
//!         | IDENT `.` IDENT | IDENT `.` `blk` `[` ⟨rust-expr⟩ `]` `.` IDENT     a weight
//!         | IDENT `(` expr,* [`;` ⟨rust-expr⟩,*] `)`  an op: operands, then attributes
//!         | `match` ⟨rust-expr⟩ `{` (⟨rust-pat⟩ `=>` expr `,`?)* `}`
//!         | `(` expr `)`
//! dim    := `T` | `S` | ⟨rust-expr⟩
//! ```

use proc_macro2::{Group, Span, TokenStream};
use syn::parse::{Parse, ParseStream, Parser};
use syn::punctuated::Punctuated;
use syn::{braced, bracketed, parenthesized, Attribute, Ident, LitStr, Token, Visibility};

/// The whole description: one function.
pub struct ModelDef {
    /// Outer attributes, doc comments included; passed through.
    pub attrs: Vec<Attribute>,
    /// Visibility of the generated function.
    pub vis: Visibility,
    /// Its name.
    pub name: Ident,
    /// Its parameters, in order.
    pub params: Vec<Param>,
    /// The statements of its body.
    pub body: Vec<Stmt>,
}

/// A parameter of the generated function.
pub enum Param {
    /// An ordinary Rust parameter, passed through (`cfg: &Mistral4Config`).
    Rust { name: Ident, ty: Box<syn::Type> },
    /// `w: weights`: the GGUF weight map, and the root of weight paths.
    Weights { name: Ident },
}

/// One statement of the body (see the grammar in the module note).
pub enum Stmt {
    /// `input NAME: [dims] dtype;`
    Input {
        name: Ident,
        dims: Vec<syn::Expr>,
        dtype: Ident,
    },
    /// `let NAME = e;` or, with `tuple` set to the parentheses' span, `let (A, B, …) = e;`.
    Let {
        names: Vec<Ident>,
        tuple: Option<Span>,
        value: Expr,
    },
    /// `NAME = e;` (reassigns an existing binding).
    Assign { name: Ident, value: Expr },
    /// `for VAR in RANGE { … }`, the loop over layers.
    For {
        var: Ident,
        range: syn::Expr,
        body: Vec<Stmt>,
    },
    /// `output "NAME" = e;` (the name may interpolate the loop variable: `"router_ids.{l}"`).
    Output { name: LitStr, value: Expr },
}

/// A tensor expression.
pub enum Expr {
    /// A bound value.
    Value(Ident),
    /// A GGUF weight.
    Weight(WeightPath),
    /// An op call.
    Call(Call),
    /// `a + b` (op `add`) or `a * b` (op `mul`).
    Binary {
        op: BinOp,
        lhs: Box<Expr>,
        rhs: Box<Expr>,
    },
    /// `match scrutinee { pattern => e, … }`: the scrutinee and patterns are Rust, the arms DSL.
    Match {
        kw: Token![match],
        scrutinee: Box<syn::Expr>,
        arms: Vec<(syn::Pat, Expr)>,
    },
    /// `( e )`.
    Paren(Box<Expr>),
}

/// `w.NAME` or `w.blk[l].NAME`.
pub struct WeightPath {
    /// The identifier before the first dot (must be the `weights` parameter).
    pub root: Ident,
    /// `blk` and the layer index expression, for a per-layer weight.
    pub block: Option<(Ident, syn::Expr)>,
    /// The GGUF base name (`attn_q_a`).
    pub name: Ident,
}

/// `op(operands; attributes)`.
pub struct Call {
    /// The op name (or `split`).
    pub op: Ident,
    /// Tensor operands, before the `;`.
    pub operands: Vec<Expr>,
    /// Rust attribute expressions, after the `;`.
    pub attrs: Vec<syn::Expr>,
    /// The op name and its parenthesised arguments, so errors cover the whole call.
    pub tokens: TokenStream,
}

/// A binary operator with the span of its token.
#[derive(Clone, Copy)]
pub enum BinOp {
    /// `+`.
    Add(Span),
    /// `*`.
    Mul(Span),
}

impl BinOp {
    /// The op it stands for.
    pub fn op_name(self) -> &'static str {
        match self {
            BinOp::Add(_) => "add",
            BinOp::Mul(_) => "mul",
        }
    }

    /// The operator token's span.
    pub fn span(self) -> Span {
        match self {
            BinOp::Add(s) | BinOp::Mul(s) => s,
        }
    }
}

impl Expr {
    /// An error covering the expression (its first to last token where they are known).
    pub fn error(&self, msg: impl std::fmt::Display) -> syn::Error {
        match self {
            Expr::Value(i) => syn::Error::new(i.span(), msg),
            Expr::Weight(w) => w.error(msg),
            Expr::Call(c) => syn::Error::new_spanned(&c.tokens, msg),
            Expr::Binary { op, .. } => syn::Error::new(op.span(), msg),
            Expr::Match { kw, .. } => syn::Error::new(kw.span, msg),
            Expr::Paren(e) => e.error(msg),
        }
    }
}

impl WeightPath {
    /// An error covering `w. … .name`.
    pub fn error(&self, msg: impl std::fmt::Display) -> syn::Error {
        let (root, name) = (&self.root, &self.name);
        syn::Error::new_spanned(quote::quote!(#root . #name), msg)
    }
}

impl Parse for ModelDef {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let attrs = input.call(Attribute::parse_outer)?;
        let vis: Visibility = input.parse()?;
        input.parse::<Token![fn]>()?;
        let name: Ident = input.parse()?;
        let content;
        parenthesized!(content in input);
        let mut params = Vec::new();
        while !content.is_empty() {
            let pname: Ident = content.parse()?;
            content.parse::<Token![:]>()?;
            let ty: syn::Type = content.parse()?;
            let is_weights = matches!(&ty, syn::Type::Path(p) if p.qself.is_none() && p.path.is_ident("weights"));
            params.push(if is_weights {
                Param::Weights { name: pname }
            } else {
                Param::Rust {
                    name: pname,
                    ty: Box::new(ty),
                }
            });
            if content.is_empty() {
                break;
            }
            content.parse::<Token![,]>()?;
        }
        let body;
        braced!(body in input);
        let body = parse_stmts(&body)?;
        if !input.is_empty() {
            return Err(input.error("unexpected tokens after the model function"));
        }
        Ok(ModelDef {
            attrs,
            vis,
            name,
            params,
            body,
        })
    }
}

fn parse_stmts(input: ParseStream) -> syn::Result<Vec<Stmt>> {
    let mut out = Vec::new();
    while !input.is_empty() {
        out.push(parse_stmt(input)?);
    }
    Ok(out)
}

fn parse_stmt(input: ParseStream) -> syn::Result<Stmt> {
    if input.peek(Token![let]) {
        input.parse::<Token![let]>()?;
        let (names, tuple) = if input.peek(syn::token::Paren) {
            let content;
            let paren = parenthesized!(content in input);
            let names: Punctuated<Ident, Token![,]> =
                content.parse_terminated(Ident::parse, Token![,])?;
            (names.into_iter().collect(), Some(paren.span.join()))
        } else {
            (vec![input.parse()?], None)
        };
        input.parse::<Token![=]>()?;
        let value = parse_expr(input)?;
        input.parse::<Token![;]>()?;
        return Ok(Stmt::Let {
            names,
            tuple,
            value,
        });
    }
    if input.peek(Token![for]) {
        input.parse::<Token![for]>()?;
        let var: Ident = input.parse()?;
        input.parse::<Token![in]>()?;
        let range = syn::Expr::parse_without_eager_brace(input)?;
        let content;
        braced!(content in input);
        let body = parse_stmts(&content)?;
        return Ok(Stmt::For { var, range, body });
    }
    if input.peek(Ident) {
        let fork = input.fork();
        let kw: Ident = fork.parse()?;
        if kw == "input" && fork.peek(Ident) {
            input.parse::<Ident>()?;
            let name: Ident = input.parse()?;
            input.parse::<Token![:]>()?;
            let content;
            bracketed!(content in input);
            let dims: Punctuated<syn::Expr, Token![,]> =
                content.parse_terminated(syn::Expr::parse, Token![,])?;
            let dtype: Ident = input.parse()?;
            input.parse::<Token![;]>()?;
            return Ok(Stmt::Input {
                name,
                dims: dims.into_iter().collect(),
                dtype,
            });
        }
        if kw == "output" && fork.peek(LitStr) {
            input.parse::<Ident>()?;
            let name: LitStr = input.parse()?;
            input.parse::<Token![=]>()?;
            let value = parse_expr(input)?;
            input.parse::<Token![;]>()?;
            return Ok(Stmt::Output { name, value });
        }
        if fork.peek(Token![=]) && !fork.peek(Token![==]) {
            let name: Ident = input.parse()?;
            input.parse::<Token![=]>()?;
            let value = parse_expr(input)?;
            input.parse::<Token![;]>()?;
            return Ok(Stmt::Assign { name, value });
        }
    }
    Err(input
        .error("expected a statement: `input`, `let`, an assignment `x = ...;`, `for` or `output`"))
}

/// `expr := term (+ term)*`.
pub fn parse_expr(input: ParseStream) -> syn::Result<Expr> {
    let mut lhs = parse_term(input)?;
    while input.peek(Token![+]) {
        let plus: Token![+] = input.parse()?;
        let rhs = parse_term(input)?;
        lhs = Expr::Binary {
            op: BinOp::Add(plus.span),
            lhs: Box::new(lhs),
            rhs: Box::new(rhs),
        };
    }
    Ok(lhs)
}

fn parse_term(input: ParseStream) -> syn::Result<Expr> {
    let mut lhs = parse_atom(input)?;
    while input.peek(Token![*]) {
        let star: Token![*] = input.parse()?;
        let rhs = parse_atom(input)?;
        lhs = Expr::Binary {
            op: BinOp::Mul(star.span),
            lhs: Box::new(lhs),
            rhs: Box::new(rhs),
        };
    }
    Ok(lhs)
}

fn parse_atom(input: ParseStream) -> syn::Result<Expr> {
    if input.peek(syn::token::Paren) {
        let content;
        parenthesized!(content in input);
        let inner = parse_expr(&content)?;
        if !content.is_empty() {
            return Err(content.error("expected `)`"));
        }
        return Ok(Expr::Paren(Box::new(inner)));
    }
    if input.peek(Token![match]) {
        let kw: Token![match] = input.parse()?;
        let scrutinee = syn::Expr::parse_without_eager_brace(input)?;
        let content;
        braced!(content in input);
        let mut arms = Vec::new();
        while !content.is_empty() {
            let pat = syn::Pat::parse_multi_with_leading_vert(&content)?;
            content.parse::<Token![=>]>()?;
            let body = parse_expr(&content)?;
            arms.push((pat, body));
            if content.is_empty() {
                break;
            }
            content.parse::<Token![,]>()?;
        }
        return Ok(Expr::Match {
            kw,
            scrutinee: Box::new(scrutinee),
            arms,
        });
    }
    if !input.peek(Ident) {
        return Err(input.error(
            "expected a tensor expression (a value, a weight `w.…`, an op call, `match` or `( … )`); \
             scalars are attributes, written after `;` in an op call",
        ));
    }
    let first: Ident = input.parse()?;
    if input.peek(syn::token::Paren) {
        let group: Group = input.parse()?;
        let (operands, attrs) = parse_call_args.parse2(group.stream())?;
        return Ok(Expr::Call(Call {
            operands,
            attrs,
            tokens: quote::quote!(#first #group),
            op: first,
        }));
    }
    if input.peek(Token![.]) {
        input.parse::<Token![.]>()?;
        let seg: Ident = input.parse()?;
        if seg == "blk" && input.peek(syn::token::Bracket) {
            let content;
            bracketed!(content in input);
            let index: syn::Expr = content.parse()?;
            input.parse::<Token![.]>()?;
            let name: Ident = input.parse()?;
            return Ok(Expr::Weight(WeightPath {
                root: first,
                block: Some((seg, index)),
                name,
            }));
        }
        return Ok(Expr::Weight(WeightPath {
            root: first,
            block: None,
            name: seg,
        }));
    }
    Ok(Expr::Value(first))
}

/// The inside of an op call's parentheses: operands, then optionally `;` and attributes.
fn parse_call_args(content: ParseStream) -> syn::Result<(Vec<Expr>, Vec<syn::Expr>)> {
    let mut operands = Vec::new();
    while !content.is_empty() {
        if content.peek(Token![;]) {
            content.parse::<Token![;]>()?;
            let attrs: Punctuated<syn::Expr, Token![,]> =
                content.parse_terminated(syn::Expr::parse, Token![,])?;
            return Ok((operands, attrs.into_iter().collect()));
        }
        operands.push(parse_expr(content)?);
        if content.peek(Token![,]) {
            content.parse::<Token![,]>()?;
        } else if !content.is_empty() && !content.peek(Token![;]) {
            return Err(content.error("expected `,`, `;` or `)`"));
        }
    }
    Ok((operands, Vec::new()))
}
