//! Shape and dtype inference: the type of an op's output from its operands and attributes, one
//! rule per op following the semantics table of `ops.rs`.
//!
//! Algorithm note. Inference is local: a rule sees only its operands (activation types, or the
//! GGUF `WeightRef` of weight operands, ggml `ne` order) and its attributes, and either returns
//! the output type or says which operand breaks which constraint. Shapes are row-major with
//! symbolic `T` (tokens) and `S` (cached keys) axes; two axes agree only when they are the same
//! symbol or the same fixed extent. The builder runs a rule as each node is added (so a bad
//! model file fails at the node that reads the bad weight), and the verifier re-runs every rule
//! after every stage and compares with the stored type. The fused ops (`phase`, `wkb`, `kqkv`)
//! follow the contract written on their `types::Attrs` variants; that a `kqkv` reads its layer's
//! cache only after the write is a graph property, checked by `verify`.

use crate::config::ExpertLayout;
use crate::ir::{dtype_name, Graph, NodeId, NodeKind, TensorType};
use crate::ops::Op;
use crate::types::{Attrs, DType, Dim, Shape, WeightRef};

/// One operand as a rule sees it.
#[derive(Clone, Copy, Debug)]
pub enum Operand<'a> {
    /// An activation value of this type.
    Value(&'a TensorType),
    /// A GGUF weight.
    Weight(&'a WeightRef),
}

/// Why an op's operands or attributes do not fit its signature.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum InferError {
    /// Wrong number of operands.
    #[error("`{op}` takes {expected} operands, found {found}")]
    Arity {
        /// Op name.
        op: &'static str,
        /// Expected count (or counts).
        expected: String,
        /// Operands present.
        found: usize,
    },
    /// An activation where a weight must be.
    #[error("`{op}` operand {pos} must be a weight")]
    ExpectedWeight {
        /// Op name.
        op: &'static str,
        /// Operand position.
        pos: usize,
    },
    /// A weight where an activation must be.
    #[error("`{op}` operand {pos} must be an activation value, found weight `{weight}`")]
    ExpectedValue {
        /// Op name.
        op: &'static str,
        /// Operand position.
        pos: usize,
        /// The weight's GGUF name.
        weight: String,
    },
    /// An operand whose own type was never inferred.
    #[error("`{op}` operand {pos} has no inferred type")]
    UntypedOperand {
        /// Op name.
        op: &'static str,
        /// Operand position.
        pos: usize,
    },
    /// Wrong element type.
    #[error("`{op}` operand {pos} must be {expected}, found {found}")]
    DType {
        /// Op name.
        op: &'static str,
        /// Operand position.
        pos: usize,
        /// Required dtype.
        expected: &'static str,
        /// Dtype present.
        found: &'static str,
    },
    /// Wrong number of axes of an activation.
    #[error("`{op}` operand {pos} must have rank {expected}, found shape {found}")]
    Rank {
        /// Op name.
        op: &'static str,
        /// Operand position.
        pos: usize,
        /// Required rank (`2`, `≥ 1`).
        expected: &'static str,
        /// Shape present.
        found: Shape,
    },
    /// Wrong number of `ne` axes of a weight.
    #[error("`{op}` weight `{weight}` must have {expected} dimensions, found ne {found:?}")]
    WeightRank {
        /// Op name.
        op: &'static str,
        /// The weight's GGUF name.
        weight: String,
        /// Required number of `ne` entries.
        expected: usize,
        /// `ne` present.
        found: Vec<usize>,
    },
    /// Two extents that must agree do not.
    #[error("`{op}`: {what}")]
    Mismatch {
        /// Op name.
        op: &'static str,
        /// Which extents, and their values.
        what: String,
    },
    /// Attributes of the wrong kind for the op.
    #[error("`{op}` cannot take attributes {found}")]
    Attrs {
        /// Op name.
        op: &'static str,
        /// The attributes present, as JSON.
        found: String,
    },
    /// An input node without its declared type.
    #[error("input has no declared type")]
    UndeclaredInput,
}

/// Type of node `n` from its operands' stored types: the declared type for an input, `None` for
/// a weight, the rule's result for an op.
///
/// Errors: [`InferError`] for an op whose operands break its rule, or an input with no type.
pub fn infer_node(g: &Graph, n: NodeId) -> Result<Option<TensorType>, InferError> {
    let Some(node) = g.node(n) else {
        return Ok(None);
    };
    match &node.kind {
        NodeKind::Input { .. } => node.ty.clone().map(Some).ok_or(InferError::UndeclaredInput),
        NodeKind::Weight(_) => Ok(None),
        NodeKind::Op { op, attrs } => {
            let operands = g.operands(n);
            let mut args = Vec::with_capacity(operands.len());
            for (pos, a) in operands.iter().enumerate() {
                let Some(an) = g.node(*a) else {
                    return Err(InferError::UntypedOperand { op: op.name(), pos });
                };
                match (&an.kind, &an.ty) {
                    (NodeKind::Weight(w), _) => args.push(Operand::Weight(w)),
                    (_, Some(ty)) => args.push(Operand::Value(ty)),
                    (_, None) => return Err(InferError::UntypedOperand { op: op.name(), pos }),
                }
            }
            infer_op(*op, attrs, &args).map(Some)
        }
    }
}

/// Output type of `op` with `attrs` over `args` (the semantics table of `ops.rs`).
///
/// Errors: [`InferError`] naming the operand and the constraint it breaks.
pub fn infer_op(op: Op, attrs: &Attrs, args: &[Operand<'_>]) -> Result<TensorType, InferError> {
    let r = Rule { op, args };
    let name = op.name();
    let fixed;
    let expected: &[usize] = match (op, attrs) {
        (Op::MoeFfn, Attrs::Moe { layout, .. }) => match layout {
            ExpertLayout::FusedGateUp => &[5],
            ExpertLayout::SplitGateUp => &[6],
        },
        (Op::Phase, Attrs::Phase { .. }) => &[4],
        (Op::Wkb, Attrs::Wkb { .. }) => &[2],
        (Op::Kqkv, Attrs::Kqkv { .. }) => &[2, 3],
        (Op::MoeFfn | Op::Phase | Op::Wkb | Op::Kqkv, _) => return Err(r.bad_attrs(attrs)),
        _ => {
            fixed = [op.arity().unwrap_or(args.len())];
            &fixed
        }
    };
    if !expected.contains(&args.len()) {
        let counts: Vec<String> = expected.iter().map(usize::to_string).collect();
        return Err(InferError::Arity {
            op: name,
            expected: counts.join(" or "),
            found: args.len(),
        });
    }
    match (op, attrs) {
        (Op::Embed, Attrs::None) => {
            let w = r.weight(0, 2)?;
            let ids = r.value(1, DType::I32)?;
            r.rank(1, ids, 1, "1")?;
            Ok(TensorType::f32(Shape(vec![
                ids.shape.0[0],
                Dim::Fixed(w.ne[0]),
            ])))
        }
        (Op::RmsNorm, Attrs::Eps(_)) => {
            let x = r.value(0, DType::F32)?;
            r.min_rank(0, x, 1)?;
            let w = r.weight(1, 1)?;
            r.same(last(x), Dim::Fixed(w.ne[0]), "x last axis", "weight ne[0]")?;
            Ok(x.clone())
        }
        (Op::MatMul, Attrs::None) => {
            let w = r.weight(0, 2)?;
            let x = r.value(1, DType::F32)?;
            r.rank(1, x, 2, "2")?;
            r.same(
                x.shape.0[1],
                Dim::Fixed(w.ne[0]),
                "x last axis",
                "weight ne[0]",
            )?;
            Ok(TensorType::f32(Shape(vec![
                x.shape.0[0],
                Dim::Fixed(w.ne[1]),
            ])))
        }
        (Op::HeadMatMul, Attrs::None) => {
            let w = r.weight(0, 3)?;
            let x = r.value(1, DType::F32)?;
            r.rank(1, x, 3, "3")?;
            r.same(x.shape.0[1], Dim::Fixed(w.ne[2]), "x heads", "weight ne[2]")?;
            r.same(
                x.shape.0[2],
                Dim::Fixed(w.ne[0]),
                "x last axis",
                "weight ne[0]",
            )?;
            Ok(TensorType::f32(Shape(vec![
                x.shape.0[0],
                x.shape.0[1],
                Dim::Fixed(w.ne[1]),
            ])))
        }
        (Op::Slice, Attrs::Slice { offset, len }) => {
            let x = r.any_value(0)?;
            r.min_rank(0, x, 1)?;
            let n = r.fixed_last(0, x)?;
            if *len == 0 || offset.checked_add(*len).is_none_or(|end| end > n) {
                return Err(r.mismatch(format!(
                    "slice [{offset}, {offset}+{len}) is empty or outside the last axis of {n}"
                )));
            }
            Ok(with_last(x, *len))
        }
        (Op::Concat, Attrs::None) => {
            let a = r.any_value(0)?;
            let b = r.value(1, a.dtype)?;
            r.min_rank(0, a, 1)?;
            r.rank(1, b, a.shape.0.len(), "equal to operand 0's")?;
            let k = a.shape.0.len() - 1;
            for i in 0..k {
                r.same(a.shape.0[i], b.shape.0[i], "a axis", "b axis")?;
            }
            let n1 = r.fixed_last(0, a)?;
            let n2 = r.fixed_last(1, b)?;
            Ok(with_last(a, n1 + n2))
        }
        (Op::Reshape, Attrs::Reshape(shape)) => {
            let x = r.any_value(0)?;
            if shape.0.is_empty() || !same_numel(&x.shape, shape) {
                return Err(r.mismatch(format!(
                    "cannot reshape {} to {shape}: element counts differ",
                    x.shape
                )));
            }
            Ok(TensorType {
                dtype: x.dtype,
                shape: shape.clone(),
            })
        }
        (Op::RopeYarn, Attrs::Rope(y)) => {
            let x = r.value(0, DType::F32)?;
            r.rank(0, x, 3, "3")?;
            r.positions(1, x.shape.0[0])?;
            let d = r.fixed_last(0, x)?;
            if y.n_rot == 0 || y.n_rot % 2 != 0 || y.n_rot > d {
                return Err(r.mismatch(format!(
                    "n_rot {} must be even, positive and at most the head width {d}",
                    y.n_rot
                )));
            }
            Ok(x.clone())
        }
        (Op::AttnTemperature, Attrs::Temperature(t)) => {
            let x = r.value(0, DType::F32)?;
            r.min_rank(0, x, 1)?;
            r.positions(1, x.shape.0[0])?;
            if t.length == 0 {
                return Err(r.mismatch("temperature length must be positive".into()));
            }
            Ok(x.clone())
        }
        (Op::Scale, Attrs::Scale(_)) | (Op::Silu, Attrs::None) | (Op::Softmax, Attrs::None) => {
            let x = r.value(0, DType::F32)?;
            r.min_rank(0, x, 1)?;
            Ok(x.clone())
        }
        (Op::Add | Op::Mul, Attrs::None) => {
            let a = r.value(0, DType::F32)?;
            let b = r.value(1, DType::F32)?;
            if a.shape != b.shape {
                return Err(
                    r.mismatch(format!("operand shapes {} and {} differ", a.shape, b.shape))
                );
            }
            Ok(a.clone())
        }
        (Op::CacheWrite, Attrs::CacheWrite { .. }) => {
            let kv = r.value(0, DType::F32)?;
            r.rank(0, kv, 2, "2")?;
            r.positions(1, kv.shape.0[0])?;
            let w = r.fixed_last(0, kv)?;
            Ok(TensorType::f32(Shape(vec![Dim::Keys, Dim::Fixed(w)])))
        }
        (Op::ScoresQk, Attrs::None) => {
            let q = r.value(0, DType::F32)?;
            let k = r.value(1, DType::F32)?;
            r.rank(0, q, 3, "3")?;
            r.rank(1, k, 2, "2")?;
            r.same(q.shape.0[2], k.shape.0[1], "q last axis", "k last axis")?;
            Ok(TensorType::f32(Shape(vec![
                q.shape.0[0],
                q.shape.0[1],
                k.shape.0[0],
            ])))
        }
        (Op::CausalMask, Attrs::None) => {
            let s = r.value(0, DType::F32)?;
            r.rank(0, s, 3, "3")?;
            r.positions(1, s.shape.0[0])?;
            Ok(s.clone())
        }
        (Op::WeightedSum, Attrs::WeightedSum { len }) => {
            let p = r.value(0, DType::F32)?;
            let v = r.value(1, DType::F32)?;
            r.rank(0, p, 3, "3")?;
            r.rank(1, v, 2, "2")?;
            r.same(p.shape.0[2], v.shape.0[0], "p keys", "v rows")?;
            let w = r.fixed_last(1, v)?;
            if *len == 0 || *len > w {
                return Err(r.mismatch(format!("len {len} must be in 1..={w}")));
            }
            Ok(TensorType::f32(Shape(vec![
                p.shape.0[0],
                p.shape.0[1],
                Dim::Fixed(*len),
            ])))
        }
        (Op::TopK, Attrs::TopK { k }) => {
            let p = r.value(0, DType::F32)?;
            r.rank(0, p, 2, "2")?;
            let e = r.fixed_last(0, p)?;
            if *k == 0 || *k > e {
                return Err(r.mismatch(format!("k {k} must be in 1..={e}")));
            }
            Ok(TensorType::i32(Shape(vec![p.shape.0[0], Dim::Fixed(*k)])))
        }
        (Op::GatherRenorm, Attrs::GatherRenorm { .. }) => {
            let p = r.value(0, DType::F32)?;
            let ids = r.value(1, DType::I32)?;
            r.rank(0, p, 2, "2")?;
            r.rank(1, ids, 2, "2")?;
            r.same(p.shape.0[0], ids.shape.0[0], "p tokens", "ids tokens")?;
            Ok(TensorType::f32(ids.shape.clone()))
        }
        (Op::MoeFfn, Attrs::Moe { n_ff, layout, .. }) => {
            let h = r.value(0, DType::F32)?;
            let ids = r.value(1, DType::I32)?;
            let wts = r.value(2, DType::F32)?;
            r.rank(0, h, 2, "2")?;
            r.rank(1, ids, 2, "2")?;
            if wts.shape != ids.shape {
                return Err(r.mismatch(format!(
                    "expert weights {} and expert ids {} differ",
                    wts.shape, ids.shape
                )));
            }
            r.same(h.shape.0[0], ids.shape.0[0], "h tokens", "ids tokens")?;
            let d = r.fixed_last(0, h)?;
            let (gate_up, down_pos) = match layout {
                ExpertLayout::FusedGateUp => (vec![(3, 2 * n_ff)], 4),
                ExpertLayout::SplitGateUp => (vec![(3, *n_ff), (4, *n_ff)], 5),
            };
            let down = r.weight(down_pos, 3)?;
            let n_expert = down.ne[2];
            for (pos, rows) in gate_up {
                let w = r.weight(pos, 3)?;
                r.ne(w, [d, rows, n_expert])?;
            }
            r.ne(down, [*n_ff, d, n_expert])?;
            Ok(h.clone())
        }
        (
            Op::Phase,
            Attrs::Phase {
                rope,
                temperature,
                n_head,
                nope,
                rope_dim,
                kv_lora,
                ..
            },
        ) => {
            let q = r.value(0, DType::F32)?;
            r.rank(0, q, 3, "3")?;
            r.same(q.shape.0[1], Dim::Fixed(*n_head), "q heads", "n_head")?;
            r.same(
                q.shape.0[2],
                Dim::Fixed(nope + rope_dim),
                "q last axis",
                "nope + rope_dim",
            )?;
            let kv_a = r.value(1, DType::F32)?;
            r.rank(1, kv_a, 2, "2")?;
            r.same(kv_a.shape.0[0], q.shape.0[0], "kv_a tokens", "q tokens")?;
            r.same(
                kv_a.shape.0[1],
                Dim::Fixed(kv_lora + rope_dim),
                "kv_a last axis",
                "kv_lora + rope_dim",
            )?;
            let w = r.weight(2, 1)?;
            r.ne(w, [*kv_lora])?;
            r.positions(3, q.shape.0[0])?;
            if *kv_lora == 0 {
                return Err(r.mismatch("kv_lora must be positive".into()));
            }
            if rope.n_rot == 0 || rope.n_rot % 2 != 0 || rope.n_rot > *rope_dim {
                return Err(r.mismatch(format!(
                    "n_rot {} must be even, positive and at most rope_dim {rope_dim}",
                    rope.n_rot
                )));
            }
            if temperature.as_ref().is_some_and(|t| t.length == 0) {
                return Err(r.mismatch("temperature length must be positive".into()));
            }
            Ok(q.clone())
        }
        (
            Op::Wkb,
            Attrs::Wkb {
                n_head,
                in_dim,
                out_dim,
                rope_tail,
            },
        ) => {
            let x = r.value(0, DType::F32)?;
            r.rank(0, x, 3, "3")?;
            r.same(x.shape.0[1], Dim::Fixed(*n_head), "x heads", "n_head")?;
            r.same(
                x.shape.0[2],
                Dim::Fixed(in_dim + rope_tail),
                "x last axis",
                "in_dim + rope_tail",
            )?;
            let w = r.weight(1, 3)?;
            r.ne(w, [*in_dim, *out_dim, *n_head])?;
            Ok(TensorType::f32(Shape(vec![
                x.shape.0[0],
                x.shape.0[1],
                Dim::Fixed(out_dim + rope_tail),
            ])))
        }
        (
            Op::Kqkv,
            Attrs::Kqkv {
                n_head,
                kv_lora,
                rope_dim,
                ..
            },
        ) => {
            let q = r.value(0, DType::F32)?;
            r.rank(0, q, 3, "3")?;
            r.same(q.shape.0[1], Dim::Fixed(*n_head), "q_abs heads", "n_head")?;
            let width = Dim::Fixed(kv_lora + rope_dim);
            r.same(q.shape.0[2], width, "q_abs last axis", "kv_lora + rope_dim")?;
            r.positions(1, q.shape.0[0])?;
            if *kv_lora == 0 {
                return Err(r.mismatch("kv_lora must be positive".into()));
            }
            if args.len() == 3 {
                let cache = r.value(2, DType::F32)?;
                r.rank(2, cache, 2, "2")?;
                r.same(cache.shape.0[0], Dim::Keys, "cache rows", "keys")?;
                r.same(cache.shape.0[1], width, "cache width", "kv_lora + rope_dim")?;
            }
            Ok(TensorType::f32(Shape(vec![
                q.shape.0[0],
                q.shape.0[1],
                Dim::Fixed(*kv_lora),
            ])))
        }
        _ => Err(r.bad_attrs(attrs)),
    }
}

/// True when two shapes have the same element count for every `T` and `S`: equal products of
/// fixed extents and the same number of `T` and of `S` axes.
pub fn same_numel(a: &Shape, b: &Shape) -> bool {
    let count = |s: &Shape| {
        let mut fixed: u128 = 1;
        let (mut t, mut k) = (0, 0);
        for d in &s.0 {
            match d {
                Dim::Fixed(n) => fixed = fixed.saturating_mul(*n as u128),
                Dim::Tokens => t += 1,
                Dim::Keys => k += 1,
            }
        }
        (fixed, t, k)
    };
    count(a) == count(b)
}

fn last(x: &TensorType) -> Dim {
    x.shape.0.last().copied().unwrap_or(Dim::Fixed(1))
}

fn with_last(x: &TensorType, n: usize) -> TensorType {
    let mut shape = x.shape.clone();
    if let Some(l) = shape.0.last_mut() {
        *l = Dim::Fixed(n);
    }
    TensorType {
        dtype: x.dtype,
        shape,
    }
}

/// Operand access with the op's name attached to every error.
struct Rule<'a, 'b> {
    op: Op,
    args: &'a [Operand<'b>],
}

impl<'a, 'b> Rule<'a, 'b> {
    fn any_value(&self, pos: usize) -> Result<&'b TensorType, InferError> {
        match self.args.get(pos) {
            Some(Operand::Value(t)) => Ok(t),
            Some(Operand::Weight(w)) => Err(InferError::ExpectedValue {
                op: self.op.name(),
                pos,
                weight: w.name.clone(),
            }),
            None => Err(InferError::UntypedOperand {
                op: self.op.name(),
                pos,
            }),
        }
    }

    fn value(&self, pos: usize, dtype: DType) -> Result<&'b TensorType, InferError> {
        let t = self.any_value(pos)?;
        if t.dtype != dtype {
            return Err(InferError::DType {
                op: self.op.name(),
                pos,
                expected: dtype_name(dtype),
                found: dtype_name(t.dtype),
            });
        }
        Ok(t)
    }

    fn weight(&self, pos: usize, dims: usize) -> Result<&'b WeightRef, InferError> {
        match self.args.get(pos) {
            Some(Operand::Weight(w)) if w.ne.len() == dims => Ok(w),
            Some(Operand::Weight(w)) => Err(InferError::WeightRank {
                op: self.op.name(),
                weight: w.name.clone(),
                expected: dims,
                found: w.ne.clone(),
            }),
            _ => Err(InferError::ExpectedWeight {
                op: self.op.name(),
                pos,
            }),
        }
    }

    fn rank(
        &self,
        pos: usize,
        x: &TensorType,
        n: usize,
        expected: &'static str,
    ) -> Result<(), InferError> {
        if x.shape.0.len() == n {
            Ok(())
        } else {
            Err(InferError::Rank {
                op: self.op.name(),
                pos,
                expected,
                found: x.shape.clone(),
            })
        }
    }

    fn min_rank(&self, pos: usize, x: &TensorType, n: usize) -> Result<(), InferError> {
        if x.shape.0.len() >= n {
            Ok(())
        } else {
            Err(InferError::Rank {
                op: self.op.name(),
                pos,
                expected: "≥ 1",
                found: x.shape.clone(),
            })
        }
    }

    fn fixed_last(&self, pos: usize, x: &TensorType) -> Result<usize, InferError> {
        x.shape.last_fixed().ok_or_else(|| {
            self.mismatch(format!(
                "operand {pos} shape {} must end in a fixed axis",
                x.shape
            ))
        })
    }

    /// `pos` operand is a `[T]` i32 position vector whose length matches `tokens`.
    fn positions(&self, pos: usize, tokens: Dim) -> Result<(), InferError> {
        let p = self.value(pos, DType::I32)?;
        self.rank(pos, p, 1, "1")?;
        self.same(tokens, p.shape.0[0], "tokens", "positions")
    }

    fn same(&self, a: Dim, b: Dim, a_what: &str, b_what: &str) -> Result<(), InferError> {
        if a == b {
            Ok(())
        } else {
            Err(self.mismatch(format!("{a_what} {a} differs from {b_what} {b}")))
        }
    }

    fn ne<const N: usize>(&self, w: &WeightRef, want: [usize; N]) -> Result<(), InferError> {
        if w.ne == want {
            Ok(())
        } else {
            Err(self.mismatch(format!(
                "weight `{}` has ne {:?}, expected {want:?}",
                w.name, w.ne
            )))
        }
    }

    fn mismatch(&self, what: String) -> InferError {
        InferError::Mismatch {
            op: self.op.name(),
            what,
        }
    }

    fn bad_attrs(&self, attrs: &Attrs) -> InferError {
        InferError::Attrs {
            op: self.op.name(),
            found: serde_json::to_string(attrs).unwrap_or_else(|e| e.to_string()),
        }
    }
}
