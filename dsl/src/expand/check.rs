//! Checking: everything about a description that is visible before any config or weight exists.
//!
//! Algorithm note. One walk in program order with a stack of scopes (the function body, each
//! `for` body). Each use of a name resolves to the innermost binding of that name; each binding
//! records whether a later assignment targets it (so the generator writes `let mut` exactly where
//! needed). Ops are looked up in the op table (`tables::OPS`, the compiler's own table); fused ops
//! are refused, fixed arity is enforced, weight paths are checked against the architecture's
//! GGUF tensor names, and elementwise ops refuse weights. A small static type — dtype and a
//! symbolic shape, each known or not — flows from `input` declarations through elementwise ops,
//! `reshape` and `split`; where both operands of an elementwise op have known ranks, dtypes or
//! literal extents that differ, that is an error now rather than when the graph is built. Every
//! other shape rule is left to the compiler's `infer`, which sees the real dims. All errors are
//! collected (not just the first) and returned as one combined `syn::Error`.

use super::parse::{Expr, ModelDef, Param, Stmt};
use super::tables::{self, BLOCK_WEIGHTS, GLOBAL_WEIGHTS};
use std::collections::BTreeMap;
use syn::Ident;

/// What the generator needs from the check: for each binding, in the order bindings are
/// introduced (`input`, then each name of each `let`), whether it is reassigned.
pub struct Checked {
    pub mutated: Vec<bool>,
    pub weights: Ident,
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Dt {
    I32,
    F32,
}

/// One axis as far as the macro can tell.
#[derive(Clone, PartialEq, Debug)]
enum SDim {
    Tokens,
    Keys,
    Lit(u64),
    /// A Rust expression: its value is known only when the graph is built.
    Opaque,
}

/// The static type of a tensor expression.
#[derive(Clone, PartialEq, Debug)]
enum Kind {
    Weight,
    Value {
        dtype: Option<Dt>,
        dims: Option<Vec<SDim>>,
    },
}

const UNKNOWN: Kind = Kind::Value {
    dtype: None,
    dims: None,
};

struct Checker {
    weights: Ident,
    scopes: Vec<BTreeMap<String, usize>>,
    kinds: Vec<Kind>,
    mutated: Vec<bool>,
    errors: Option<syn::Error>,
}

/// Checks `m`; `Err` holds every diagnostic found.
pub fn check(m: &ModelDef) -> syn::Result<Checked> {
    let weights: Vec<&Ident> = m
        .params
        .iter()
        .filter_map(|p| match p {
            Param::Weights { name } => Some(name),
            Param::Rust { .. } => None,
        })
        .collect();
    let weights = match weights.as_slice() {
        [one] => (*one).clone(),
        [] => {
            return Err(syn::Error::new(
                m.name.span(),
                "the model needs a weight-map parameter: add `w: weights`",
            ))
        }
        [_, second, ..] => {
            return Err(syn::Error::new(
                second.span(),
                "only one `weights` parameter is allowed",
            ))
        }
    };
    let mut c = Checker {
        weights,
        scopes: vec![BTreeMap::new()],
        kinds: Vec::new(),
        mutated: Vec::new(),
        errors: None,
    };
    c.stmts(&m.body);
    match c.errors {
        Some(e) => Err(e),
        None => Ok(Checked {
            mutated: c.mutated,
            weights: c.weights,
        }),
    }
}

impl Checker {
    fn error(&mut self, e: syn::Error) {
        match &mut self.errors {
            Some(all) => all.combine(e),
            None => self.errors = Some(e),
        }
    }

    fn bind(&mut self, name: &Ident, kind: Kind) {
        let id = self.kinds.len();
        self.kinds.push(kind);
        self.mutated.push(false);
        if let Some(scope) = self.scopes.last_mut() {
            scope.insert(name.to_string(), id);
        }
    }

    fn lookup(&self, name: &Ident) -> Option<usize> {
        let key = name.to_string();
        self.scopes.iter().rev().find_map(|s| s.get(&key).copied())
    }

    fn stmts(&mut self, stmts: &[Stmt]) {
        for s in stmts {
            self.stmt(s);
        }
    }

    fn stmt(&mut self, s: &Stmt) {
        match s {
            Stmt::Input { name, dims, dtype } => {
                let dt = match dtype.to_string().as_str() {
                    "i32" => Some(Dt::I32),
                    "f32" => Some(Dt::F32),
                    _ => {
                        self.error(syn::Error::new(
                            dtype.span(),
                            format!("unknown dtype `{dtype}`: inputs are `i32` or `f32`"),
                        ));
                        None
                    }
                };
                if self.lookup(name).is_some() && self.scopes.len() == 1 {
                    self.error(syn::Error::new(
                        name.span(),
                        format!("`{name}` is already bound"),
                    ));
                }
                let dims = dims.iter().map(sdim).collect();
                self.bind(
                    name,
                    Kind::Value {
                        dtype: dt,
                        dims: Some(dims),
                    },
                );
            }
            Stmt::Let {
                names,
                tuple,
                value,
            } => match tuple {
                None => {
                    let kind = self.expr(value);
                    if let Some(name) = names.first() {
                        self.bind(name, kind);
                    }
                }
                Some(span) => {
                    let kinds = self.split(names.len(), *span, value);
                    for (name, kind) in names.iter().zip(kinds) {
                        self.bind(name, kind);
                    }
                }
            },
            Stmt::Assign { name, value } => {
                let kind = self.expr(value);
                match self.lookup(name) {
                    Some(id) => {
                        self.mutated[id] = true;
                        if self.kinds[id] != kind {
                            self.kinds[id] = UNKNOWN;
                        }
                    }
                    None => self.error(syn::Error::new(
                        name.span(),
                        format!(
                            "cannot assign to `{name}`: no such value (bind it with `let` first)"
                        ),
                    )),
                }
            }
            Stmt::For { body, .. } => {
                self.scopes.push(BTreeMap::new());
                self.stmts(body);
                self.scopes.pop();
            }
            Stmt::Output { value, .. } => {
                if self.expr(value) == Kind::Weight {
                    self.error(value.error("an output must be an activation value, not a weight"));
                }
            }
        }
    }

    /// `let (a, b, …) = split(x; [n_a, n_b, …]);`
    fn split(&mut self, n: usize, tuple_span: proc_macro2::Span, value: &Expr) -> Vec<Kind> {
        let unknown = vec![UNKNOWN; n];
        let Expr::Call(call) = value else {
            self.error(syn::Error::new(
                tuple_span,
                "a tuple `let` takes `split(x; [n0, n1, …])`",
            ));
            return unknown;
        };
        if call.op != "split" {
            self.error(value.error(format!(
                "a tuple `let` takes `split(x; [n0, n1, …])`, not `{}`",
                call.op
            )));
            return unknown;
        }
        if call.operands.len() != 1 {
            self.error(value.error(format!(
                "`split` takes 1 operand, found {}",
                call.operands.len()
            )));
            return unknown;
        }
        let widths = match call.attrs.as_slice() {
            [syn::Expr::Array(a)] => &a.elems,
            _ => {
                self.error(value.error(
                    "`split` takes its widths as one array attribute: `split(x; [n0, n1, …])`",
                ));
                return unknown;
            }
        };
        if widths.len() != n {
            self.error(value.error(format!(
                "`split` into {} widths is bound to {n} names",
                widths.len()
            )));
            return unknown;
        }
        let x = self.operand(&call.operands[0], "split", 0);
        widths
            .iter()
            .map(|w| match &x {
                Kind::Value { dtype, dims } => Kind::Value {
                    dtype: *dtype,
                    dims: dims.as_ref().map(|d| {
                        let mut d = d.clone();
                        if let Some(last) = d.last_mut() {
                            *last = sdim(w);
                        }
                        d
                    }),
                },
                Kind::Weight => UNKNOWN,
            })
            .collect()
    }

    /// Checks an operand of `op` at `pos`; weights are refused for elementwise ops by the caller.
    fn operand(&mut self, e: &Expr, op: &str, pos: usize) -> Kind {
        let k = self.expr(e);
        if k == Kind::Weight && op == "split" {
            self.error(e.error(format!(
                "`split` operand {pos} must be a value, not a weight"
            )));
        }
        k
    }

    fn expr(&mut self, e: &Expr) -> Kind {
        match e {
            Expr::Value(name) => match self.lookup(name) {
                Some(id) => self.kinds[id].clone(),
                None => {
                    let msg = if *name == self.weights {
                        format!("`{name}` is the weight map, not a value: name a tensor, e.g. `{name}.token_embd`")
                    } else {
                        format!("unknown value `{name}`")
                    };
                    self.error(syn::Error::new(name.span(), msg));
                    UNKNOWN
                }
            },
            Expr::Weight(w) => {
                if w.root != self.weights {
                    let (root, name) = (&w.root, &w.name);
                    self.error(w.error(format!(
                        "`{root}.{name}` is not a tensor: weights are `{}.NAME` or `{}.blk[l].NAME`, \
                         and scalars are attributes written after `;` in an op call",
                        self.weights, self.weights
                    )));
                    return UNKNOWN;
                }
                let name = w.name.to_string();
                match &w.block {
                    Some(_) if !BLOCK_WEIGHTS.contains(&name.as_str()) => {
                        let hint = if GLOBAL_WEIGHTS.contains(&name.as_str()) {
                            format!("; `{name}` is model-wide: write `{}.{name}`", self.weights)
                        } else {
                            did_you_mean(&name, BLOCK_WEIGHTS.iter().copied())
                        };
                        self.error(w.error(format!("unknown per-layer weight `{name}`{hint}")));
                    }
                    None if !GLOBAL_WEIGHTS.contains(&name.as_str()) => {
                        let hint = if BLOCK_WEIGHTS.contains(&name.as_str()) {
                            format!(
                                "; `{name}` is per-layer: write `{}.blk[l].{name}`",
                                self.weights
                            )
                        } else {
                            did_you_mean(&name, GLOBAL_WEIGHTS.iter().copied())
                        };
                        self.error(w.error(format!("unknown weight `{name}`{hint}")));
                    }
                    _ => {}
                }
                Kind::Weight
            }
            Expr::Paren(inner) => self.expr(inner),
            Expr::Binary { op, lhs, rhs } => {
                let a = self.expr(lhs);
                let b = self.expr(rhs);
                self.elementwise(op.op_name(), &[(lhs, a), (rhs, b)], e)
            }
            Expr::Match { arms, .. } => {
                let mut kinds = arms.iter().map(|(_, body)| self.expr(body));
                let first = kinds.next().unwrap_or(UNKNOWN);
                kinds.fold(first, |acc, k| if acc == k { acc } else { UNKNOWN })
            }
            Expr::Call(call) => {
                let name = call.op.to_string();
                if name == "split" {
                    self.error(e.error(
                        "`split` gives several values: bind them with `let (a, b, …) = split(x; [n_a, n_b, …]);`",
                    ));
                    return UNKNOWN;
                }
                let Some(sig) = tables::op(&name) else {
                    let hint = did_you_mean(
                        &name,
                        tables::OPS.iter().filter(|o| !o.fused).map(|o| o.name),
                    );
                    self.error(syn::Error::new(
                        call.op.span(),
                        format!("unknown op `{name}`{hint}"),
                    ));
                    for o in &call.operands {
                        self.expr(o);
                    }
                    return UNKNOWN;
                };
                if sig.fused {
                    self.error(syn::Error::new(
                        call.op.span(),
                        format!("`{name}` is a fused op, made only by the fusion passes; describe the model with primitive ops"),
                    ));
                    return UNKNOWN;
                }
                match sig.arity {
                    Some(n) if n != call.operands.len() => {
                        self.error(e.error(format!(
                            "`{name}` takes {n} operand{}, found {}",
                            if n == 1 { "" } else { "s" },
                            call.operands.len()
                        )));
                    }
                    None if call.operands.is_empty() => {
                        self.error(e.error(format!("`{name}` takes at least one operand")));
                    }
                    _ => {}
                }
                let kinds: Vec<(&Expr, Kind)> = call
                    .operands
                    .iter()
                    .enumerate()
                    .map(|(i, o)| (o, self.operand(o, &name, i)))
                    .collect();
                if sig.elementwise {
                    return self.elementwise(sig.name, &kinds, e);
                }
                if name == "reshape" {
                    return self.reshape(call, kinds.first().map(|(_, k)| k.clone()));
                }
                UNKNOWN
            }
        }
    }

    fn reshape(&mut self, call: &super::parse::Call, x: Option<Kind>) -> Kind {
        let dims = match call.attrs.as_slice() {
            [syn::Expr::Array(a)] => a.elems.iter().map(sdim).collect(),
            _ => {
                self.error(syn::Error::new_spanned(
                    &call.tokens,
                    "`reshape` takes its new shape as one array attribute: `reshape(x; [T, n, …])`",
                ));
                return UNKNOWN;
            }
        };
        let dtype = match x {
            Some(Kind::Value { dtype, .. }) => dtype,
            _ => None,
        };
        Kind::Value {
            dtype,
            dims: Some(dims),
        }
    }

    /// An elementwise op: no weights; operands agree in dtype and shape where both are known.
    fn elementwise(&mut self, op: &str, operands: &[(&Expr, Kind)], whole: &Expr) -> Kind {
        for (i, (e, k)) in operands.iter().enumerate() {
            if *k == Kind::Weight {
                self.error(e.error(format!(
                    "`{op}` operand {i} is a weight; weights are read by ops such as `mat_mul`, \
                     elementwise ops take values"
                )));
                return UNKNOWN;
            }
        }
        let Some((_, first)) = operands.first() else {
            return UNKNOWN;
        };
        let mut out = first.clone();
        for (i, (_, k)) in operands.iter().enumerate().skip(1) {
            if let Some(why) = conflict(first, k) {
                self.error(whole.error(format!(
                    "shape mismatch in `{op}`: operand 0 is {} but operand {i} is {} ({why})",
                    describe(first),
                    describe(k)
                )));
                return UNKNOWN;
            }
            out = meet(&out, k);
        }
        out
    }
}

/// Why two static types cannot be the same type, if they visibly cannot.
fn conflict(a: &Kind, b: &Kind) -> Option<String> {
    let (
        Kind::Value {
            dtype: da,
            dims: sa,
        },
        Kind::Value {
            dtype: db,
            dims: sb,
        },
    ) = (a, b)
    else {
        return None;
    };
    if let (Some(x), Some(y)) = (da, db) {
        if x != y {
            return Some("dtypes differ".into());
        }
    }
    let (Some(sa), Some(sb)) = (sa, sb) else {
        return None;
    };
    if sa.len() != sb.len() {
        return Some(format!("rank {} vs rank {}", sa.len(), sb.len()));
    }
    for (i, (x, y)) in sa.iter().zip(sb).enumerate() {
        let differ = match (x, y) {
            (SDim::Opaque, _) | (_, SDim::Opaque) => false,
            _ => x != y,
        };
        if differ {
            return Some(format!("axis {i} differs"));
        }
    }
    None
}

/// The more precise of two compatible static types.
fn meet(a: &Kind, b: &Kind) -> Kind {
    match (a, b) {
        (
            Kind::Value {
                dtype: da,
                dims: sa,
            },
            Kind::Value {
                dtype: db,
                dims: sb,
            },
        ) => Kind::Value {
            dtype: da.or(*db),
            dims: sa.clone().or_else(|| sb.clone()),
        },
        _ => UNKNOWN,
    }
}

fn describe(k: &Kind) -> String {
    match k {
        Kind::Weight => "a weight".into(),
        Kind::Value { dtype, dims } => {
            let dt = match dtype {
                Some(Dt::I32) => "i32",
                Some(Dt::F32) => "f32",
                None => "",
            };
            let shape = match dims {
                None => "[?]".to_string(),
                Some(d) => {
                    let parts: Vec<String> = d
                        .iter()
                        .map(|x| match x {
                            SDim::Tokens => "T".to_string(),
                            SDim::Keys => "S".to_string(),
                            SDim::Lit(n) => n.to_string(),
                            SDim::Opaque => "_".to_string(),
                        })
                        .collect();
                    format!("[{}]", parts.join(", "))
                }
            };
            format!("{dt}{shape}")
        }
    }
}

/// `T`, `S`, an integer literal, or an expression known only at build time.
fn sdim(e: &syn::Expr) -> SDim {
    match e {
        syn::Expr::Path(p) if p.path.is_ident("T") => SDim::Tokens,
        syn::Expr::Path(p) if p.path.is_ident("S") => SDim::Keys,
        syn::Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Int(i),
            ..
        }) => i.base10_parse().map_or(SDim::Opaque, SDim::Lit),
        _ => SDim::Opaque,
    }
}

fn did_you_mean<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> String {
    tables::suggest(name, candidates)
        .map(|s| format!("; did you mean `{s}`?"))
        .unwrap_or_default()
}
