//! Per-op lowering: checks one plan step against its op's contract (`compiler::ops` table) and
//! returns its kernels as emission closures plus the metadata the executor needs (parallel work,
//! scratch, index checks).
//!
//! Every check here protects memory: the generated code trusts that each operand holds the
//! element count its shape gives at `T`, `S`, that the output holds what the op writes, and that
//! weights hold whole rows. Element counts are compared symbolically ([`Extent`]: a constant times
//! powers of `T` and `S`), so a plan accepted here is valid for every `T` and `S`.
//!
//! The parallel axis of each kernel is chosen so that one work item owns a disjoint set of output
//! elements and computes each of them start to finish in a fixed order:
//! - `mat_mul`, `head_mat_mul`: output rows of the weight (for all tokens: one weight row is read
//!   once per call and reused across the `T` tokens);
//! - `moe_ffn`: first `(token, slot, ffn row)` → `silu(gate·h) ⊙ (up·h)` into scratch, then
//!   `(token, output row)` → `Σ_slot w · (down · act)` in slot order;
//! - row ops (`rms_norm`, `softmax`, `slice`, `concat`, `rope_yarn`, attention ops, `top_k`, …):
//!   rows; elementwise ops: elements.

use super::emit::{Extent, Kb, WeightType};
use super::host::{HostSymbols, MATH_COS, MATH_LN, MATH_SIN};
use super::rope::yarn_inv_freq;
use super::{ExpertTable, IndexBound, IndexCheck, LowerError, MAX_ARGS};
use aubier_compiler::config::ExpertLayout;
use aubier_compiler::ops::Op;
use aubier_compiler::plan::{Operand, Plan, Step, Storage, Value};
use aubier_compiler::types::{Attrs, DType, Dim, WeightRef};
use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::types::{F32, F32X4, I64};
use cranelift_codegen::ir::{InstBuilder, MemFlagsData};

/// A kernel's emission: fills the body of `fn(*const StepArgs)`.
pub(crate) type Emit<'p> = Box<dyn for<'a, 'f> FnOnce(&mut Kb<'a, 'f>) + 'p>;

/// What the executor needs of a kernel besides its code.
#[derive(Clone, Copy, Debug)]
pub(crate) struct KernelMeta {
    pub name: &'static str,
    pub work: Extent,
    pub grain: usize,
}

/// A kernel before code generation.
pub(crate) struct KernelSpec<'p> {
    pub meta: KernelMeta,
    pub emit: Emit<'p>,
}

/// A step before code generation.
pub(crate) struct StepSpec<'p> {
    pub kernels: Vec<KernelSpec<'p>>,
    pub scratch: Extent,
    pub checks: Vec<IndexCheck>,
    pub expert_tables: Vec<ExpertTable>,
}

/// Row layout of one plan weight.
#[derive(Clone, Debug)]
pub(crate) struct WeightInfo {
    pub name: String,
    pub ty: WeightType,
    /// ggml `ne`, `ne[0]` contiguous.
    pub ne: Vec<usize>,
    /// Bytes of one `ne[0]` row.
    pub row_bytes: usize,
    /// Bytes of the whole tensor.
    pub total_bytes: usize,
}

impl WeightInfo {
    pub fn new(w: &WeightRef, host: &HostSymbols) -> Result<Self, LowerError> {
        let err = |detail: String| LowerError::Weight {
            name: w.name.clone(),
            detail,
        };
        let n0 = *w.ne.first().ok_or_else(|| err("empty ne".into()))?;
        if w.ne.contains(&0) {
            return Err(err(format!("ne {:?} has a zero extent", w.ne)));
        }
        let (ty, row_bytes) = if w.ggml_type == "F32" {
            (WeightType::F32, n0.checked_mul(4))
        } else {
            let k = host.get(&w.ggml_type).ok_or_else(|| {
                err(format!(
                    "ggml type {} has no host dot/dequantize kernels",
                    w.ggml_type
                ))
            })?;
            let rb = k.row_bytes(n0).ok_or_else(|| {
                err(format!(
                    "ne[0] = {n0} is not a whole number of {}-element {} blocks",
                    k.block_elems, w.ggml_type
                ))
            })?;
            (WeightType::Quant(w.ggml_type.clone()), Some(rb))
        };
        let row_bytes = row_bytes.ok_or_else(|| err("row size overflows usize".into()))?;
        let total_bytes = w.ne[1..]
            .iter()
            .try_fold(row_bytes, |acc, &n| acc.checked_mul(n))
            .ok_or_else(|| err("byte size overflows usize".into()))?;
        Ok(Self {
            name: w.name.clone(),
            ty,
            ne: w.ne.clone(),
            row_bytes,
            total_bytes,
        })
    }

    /// `ne` padded/trimmed to `k` axes: extra trailing axes must be 1.
    fn dims<const K: usize>(&self) -> Option<[usize; K]> {
        if self.ne.is_empty() {
            return None;
        }
        if self.ne.iter().skip(K).any(|&n| n != 1) {
            return None;
        }
        Some(std::array::from_fn(|i| {
            self.ne.get(i).copied().unwrap_or(1)
        }))
    }
}

/// The plan and its weight layouts.
pub(crate) struct Cx<'p> {
    pub plan: &'p Plan,
    pub weights: &'p [WeightInfo],
}

/// One step being lowered: error helpers and operand accessors.
struct St<'c, 'p> {
    cx: &'c Cx<'p>,
    idx: usize,
    step: &'p Step,
}

type R<T> = Result<T, LowerError>;

impl<'c, 'p> St<'c, 'p> {
    fn err(&self, detail: impl Into<String>) -> LowerError {
        LowerError::Invalid {
            step: self.idx,
            op: self.step.op.name(),
            detail: detail.into(),
        }
    }

    fn arity(&self, n: usize) -> R<()> {
        if self.step.args.len() != n {
            return Err(self.err(format!(
                "takes {n} operands, the step has {}",
                self.step.args.len()
            )));
        }
        Ok(())
    }

    fn value_by_id(&self, id: usize, what: &str) -> R<&'p Value> {
        self.cx
            .plan
            .values
            .get(id)
            .ok_or_else(|| self.err(format!("{what} is value {id}, which does not exist")))
    }

    /// Operand `i`, which must be a value of `dtype`.
    fn val(&self, i: usize, dtype: DType) -> R<&'p Value> {
        match self.step.args.get(i) {
            Some(Operand::Value(id)) => {
                let v = self.value_by_id(*id, &format!("operand {i}"))?;
                if v.dtype != dtype {
                    return Err(self.err(format!(
                        "operand {i} (`{}`) is {:?}, expected {dtype:?}",
                        v.name, v.dtype
                    )));
                }
                Ok(v)
            }
            Some(Operand::Weight(w)) => Err(self.err(format!(
                "operand {i} must be an activation value, got weight {w}"
            ))),
            None => Err(self.err(format!("operand {i} is missing"))),
        }
    }

    /// Operand `i`, which must be a weight.
    fn wt(&self, i: usize) -> R<&'c WeightInfo> {
        match self.step.args.get(i) {
            Some(Operand::Weight(id)) => self.cx.weights.get(*id).ok_or_else(|| {
                self.err(format!("operand {i} is weight {id}, which does not exist"))
            }),
            Some(Operand::Value(v)) => {
                Err(self.err(format!("operand {i} must be a GGUF weight, got value {v}")))
            }
            None => Err(self.err(format!("operand {i} is missing"))),
        }
    }

    /// A weight's `ne` as exactly `K` axes.
    fn wdims<const K: usize>(&self, w: &WeightInfo) -> R<[usize; K]> {
        w.dims::<K>().ok_or_else(|| {
            self.err(format!(
                "weight `{}` has ne {:?}, expected {K} axes",
                w.name, w.ne
            ))
        })
    }

    /// The output value, which must be of `dtype`.
    fn out(&self, dtype: DType) -> R<&'p Value> {
        let v = self.value_by_id(self.step.out, "the output")?;
        if v.dtype != dtype {
            return Err(self.err(format!(
                "output `{}` is {:?}, expected {dtype:?}",
                v.name, v.dtype
            )));
        }
        Ok(v)
    }

    fn numel(&self, v: &Value) -> R<Extent> {
        Extent::of_dims(&v.shape.0)
            .ok_or_else(|| self.err(format!("`{}`: element count overflows", v.name)))
    }

    /// `(rows, n)` of a value whose last axis is the fixed `n`.
    fn rows_fixed(&self, v: &Value) -> R<(Extent, usize)> {
        let n = v.shape.last_fixed().filter(|&n| n > 0).ok_or_else(|| {
            self.err(format!(
                "`{}` {}: the last axis must be a fixed, nonzero extent",
                v.name, v.shape
            ))
        })?;
        let rows = self
            .numel(v)?
            .div_fixed(n)
            .ok_or_else(|| self.err(format!("`{}` {}: not whole rows", v.name, v.shape)))?;
        Ok((rows, n))
    }

    /// Rows of a value whose last axis is `S` (its element count over `S`).
    fn rows_keys(&self, v: &Value) -> R<Extent> {
        if v.shape.0.last() != Some(&Dim::Keys) {
            return Err(self.err(format!("`{}` {}: the last axis must be S", v.name, v.shape)));
        }
        self.numel(v)?
            .div_keys()
            .ok_or_else(|| self.err(format!("`{}`: not whole rows", v.name)))
    }

    /// `(rows, n)` for a last axis that is fixed or `S` (softmax rows).
    fn rows_any(&self, v: &Value) -> R<(Extent, Dim)> {
        match v.shape.0.last() {
            Some(Dim::Keys) => Ok((self.rows_keys(v)?, Dim::Keys)),
            _ => self.rows_fixed(v).map(|(r, n)| (r, Dim::Fixed(n))),
        }
    }

    /// Rows per token of `x` whose first axis is the tokens axis of `pos` (`[T]`).
    fn per_token(&self, x: &Value, pos: &Value, row_len: usize) -> R<usize> {
        if pos.shape.0.len() != 1 || x.shape.0.first() != pos.shape.0.first() {
            return Err(self.err(format!(
                "`{}` {} and positions `{}` {} must share their first (token) axis",
                x.name, x.shape, pos.name, pos.shape
            )));
        }
        let per = Extent::of_dims(&x.shape.0[1..])
            .and_then(|e| e.div_fixed(row_len))
            .filter(|e| e.tokens == 0 && e.keys == 0)
            .ok_or_else(|| {
                self.err(format!(
                    "`{}` {}: the axes after the first must be fixed",
                    x.name, x.shape
                ))
            })?;
        Ok(per.fixed)
    }

    /// The output must hold exactly `numel` elements with last axis `last`.
    fn expect_out(&self, out: &Value, numel: Extent, last: Option<Dim>) -> R<()> {
        let got = self.numel(out)?;
        if got != numel || (last.is_some() && out.shape.0.last().copied() != last) {
            return Err(self.err(format!(
                "output `{}` has shape {}, which does not match its operands",
                out.name, out.shape
            )));
        }
        Ok(())
    }

    /// The output lives in a slot no operand uses (kernels read operands while writing it).
    fn no_alias(&self, out: &Value) -> R<()> {
        for (i, a) in self.step.args.iter().enumerate() {
            if let Operand::Value(id) = a {
                let v = self.value_by_id(*id, &format!("operand {i}"))?;
                if v.storage == out.storage {
                    return Err(self.err(format!(
                        "output `{}` shares storage {:?} with operand {i} `{}`",
                        out.name, out.storage, v.name
                    )));
                }
            }
        }
        Ok(())
    }
}

fn kernel<'p>(
    name: &'static str,
    work: Extent,
    grain: usize,
    emit: impl for<'a, 'f> FnOnce(&mut Kb<'a, 'f>) + 'p,
) -> KernelSpec<'p> {
    KernelSpec {
        meta: KernelMeta { name, work, grain },
        emit: Box::new(emit),
    }
}

fn single<'p>(kernel: KernelSpec<'p>) -> StepSpec<'p> {
    StepSpec {
        kernels: vec![kernel],
        scratch: Extent::fixed(0),
        checks: Vec::new(),
        expert_tables: Vec::new(),
    }
}

/// Longest quantized row (f32 elements) that a mat-vec kernel dequantizes into a stack buffer
/// once per weight row and reuses across the `T` tokens (64 KiB); longer rows call the host dot
/// per token. Both give the same bits: the quant dot is documented as the 8-lane reduction of the
/// bit-exact dequantized row, which is what `Kb::dot_f32` computes.
pub(crate) const ROW_BUF_MAX: usize = 16384;

/// Work items per call below which splitting elementwise work does not pay.
const ELEMENT_GRAIN: usize = 4096;
/// The same for short rows (norms, rope, masks).
const ROW_GRAIN: usize = 64;

/// Lowers one step (see the module note).
pub(crate) fn lower_step<'p>(cx: &Cx<'p>, idx: usize, step: &'p Step) -> R<StepSpec<'p>> {
    let st = St { cx, idx, step };
    let op = step.op;
    if op.is_fused() || !op.has_oracle() {
        return Err(LowerError::FusedOp {
            step: idx,
            op: op.name(),
        });
    }
    if step.args.len() > MAX_ARGS {
        return Err(st.err(format!("{} operands, at most {MAX_ARGS}", step.args.len())));
    }
    let out_dtype = match op {
        Op::TopK => DType::I32,
        Op::Reshape => match step.args.first() {
            Some(Operand::Value(id)) => st.value_by_id(*id, "operand 0")?.dtype,
            _ => DType::F32,
        },
        _ => DType::F32,
    };
    let out = st.out(out_dtype)?;
    if op != Op::Reshape {
        st.no_alias(out)?;
    }
    match op {
        Op::Embed => embed(&st, out),
        Op::RmsNorm => rms_norm(&st, out),
        Op::MatMul => mat_mul(&st, out),
        Op::HeadMatMul => head_mat_mul(&st, out),
        Op::Slice => slice(&st, out),
        Op::Concat => concat(&st, out),
        Op::Reshape => reshape(&st, out),
        Op::RopeYarn => rope(&st, out),
        Op::AttnTemperature => temperature(&st, out),
        Op::Scale | Op::Add | Op::Mul | Op::Silu => elementwise(&st, out),
        Op::Softmax => softmax(&st, out),
        Op::CacheWrite => cache_write(&st, out),
        Op::ScoresQk => scores_qk(&st, out),
        Op::CausalMask => causal_mask(&st, out),
        Op::WeightedSum => weighted_sum(&st, out),
        Op::TopK => top_k(&st, out),
        Op::GatherRenorm => gather_renorm(&st, out),
        Op::MoeFfn => moe_ffn(&st, out),
        Op::Phase | Op::Wkb | Op::Kqkv => Err(LowerError::FusedOp {
            step: idx,
            op: op.name(),
        }),
    }
}

/// `embed`: `out[r] = row ids[r] of W{D, V}` (dequantized).
fn embed<'p>(st: &St<'_, 'p>, out: &Value) -> R<StepSpec<'p>> {
    st.arity(2)?;
    let w = st.wt(0)?;
    let [d, vocab] = st.wdims::<2>(w)?;
    let ids = st.val(1, DType::I32)?;
    let n_ids = st.numel(ids)?;
    st.expect_out(
        out,
        n_ids
            .times(Extent::fixed(d))
            .ok_or_else(|| st.err("overflow"))?,
        Some(Dim::Fixed(d)),
    )?;
    let (ty, rb) = (w.ty.clone(), w.row_bytes);
    let mut spec = single(kernel("embed", n_ids, 1, move |k| {
        let (table, ids, y) = (k.arg(0), k.arg(1), k.out());
        let n = k.ic(d);
        k.for_range(k.begin, k.end, |k, r| {
            let ip = k.at(ids, r, 4);
            let id = k.ld_i32(ip);
            let src = k.at(table, id, rb);
            let dst = k.at(y, r, d * 4);
            k.dequant_row(&ty, src, dst, n);
        });
    }));
    spec.checks.push(IndexCheck {
        arg: 1,
        bound: IndexBound::Below(vocab),
        what: "token id",
    });
    Ok(spec)
}

/// The f32 operand `i` of length `n` that is either an F32 weight `{n}` or a value of `n` elements.
fn vector_operand(st: &St<'_, '_>, i: usize, n: usize) -> R<()> {
    match st.step.args.get(i) {
        Some(Operand::Weight(_)) => {
            let w = st.wt(i)?;
            let [len] = st.wdims::<1>(w)?;
            if w.ty != WeightType::F32 || len != n {
                return Err(st.err(format!(
                    "weight `{}` must be F32 {{{n}}}, got {:?} {:?}",
                    w.name, w.ty, w.ne
                )));
            }
        }
        _ => {
            let v = st.val(i, DType::F32)?;
            if st.numel(v)? != Extent::fixed(n) {
                return Err(st.err(format!("`{}` must hold {n} elements", v.name)));
            }
        }
    }
    Ok(())
}

/// `rms_norm`: `y = (x · 1/sqrt(mean(x²) + eps)) · w` per row (transformers `Mistral4RMSNorm`).
fn rms_norm<'p>(st: &St<'_, 'p>, out: &Value) -> R<StepSpec<'p>> {
    st.arity(2)?;
    let x = st.val(0, DType::F32)?;
    let (rows, n) = st.rows_fixed(x)?;
    vector_operand(st, 1, n)?;
    let Attrs::Eps(eps) = st.step.attrs else {
        return Err(st.err("attributes must be Eps"));
    };
    st.expect_out(out, st.numel(x)?, Some(Dim::Fixed(n)))?;
    Ok(single(kernel("rms_norm", rows, ROW_GRAIN, move |k| {
        let (xb, wb, yb) = (k.arg(0), k.arg(1), k.out());
        let nv = k.ic(n);
        k.for_range(k.begin, k.end, |k, r| {
            let xp = k.at(xb, r, n * 4);
            let yp = k.at(yb, r, n * 4);
            let ss = k.dot_f32(xp, xp, nv);
            let nf = k.fc(n as f32);
            let mean = k.b.ins().fdiv(ss, nf);
            let e = k.fc(eps);
            let var = k.b.ins().fadd(mean, e);
            let root = k.b.ins().sqrt(var);
            let one = k.fc(1.0);
            let inv = k.b.ins().fdiv(one, root);
            k.for_n(nv, |k, i| {
                let xi = k.at(xp, i, 4);
                let wi = k.at(wb, i, 4);
                let yi = k.at(yp, i, 4);
                let xv = k.ld(xi);
                let wv = k.ld(wi);
                let scaled = k.b.ins().fmul(xv, inv);
                let y = k.b.ins().fmul(scaled, wv);
                k.st(yi, y);
            });
        });
    })))
}

/// `mat_mul`: `y[t, o] = W[o, :] · x[t, :]` with `W{in, out}`; work = output rows.
fn mat_mul<'p>(st: &St<'_, 'p>, out: &Value) -> R<StepSpec<'p>> {
    st.arity(2)?;
    let w = st.wt(0)?;
    let [n_in, n_out] = st.wdims::<2>(w)?;
    let x = st.val(1, DType::F32)?;
    let (rows, xin) = st.rows_fixed(x)?;
    if xin != n_in {
        return Err(st.err(format!(
            "`{}` rows have {xin} elements, weight `{}` expects ne[0] = {n_in}",
            x.name, w.name
        )));
    }
    let numel = rows
        .times(Extent::fixed(n_out))
        .ok_or_else(|| st.err("overflow"))?;
    st.expect_out(out, numel, Some(Dim::Fixed(n_out)))?;
    let (ty, rb) = (w.ty.clone(), w.row_bytes);
    Ok(single(kernel(
        "mat_mul",
        Extent::fixed(n_out),
        1,
        move |k| {
            let (wb, xb, yb) = (k.arg(0), k.arg(1), k.out());
            let n_tok = k.extent(rows);
            let nv = k.ic(n_in);
            let buf = row_buffer(k, &ty, n_in);
            k.for_range(k.begin, k.end, |k, r| {
                let row = k.at(wb, r, rb);
                let (rty, rrow) = stage_row(k, &ty, buf, row, nv);
                k.for_n(n_tok, |k, t| {
                    let xp = k.at(xb, t, n_in * 4);
                    let d = k.dot_row(&rty, rrow, xp, nv);
                    let yt = k.at(yb, t, n_out * 4);
                    let yp = k.at(yt, r, 4);
                    k.st(yp, d);
                });
            });
        },
    )))
}

/// `head_mat_mul`: `y[t, h, o] = W[h][o, :] · x[t, h, :]` with `W{in, out, H}`; work = `H · out`.
fn head_mat_mul<'p>(st: &St<'_, 'p>, out: &Value) -> R<StepSpec<'p>> {
    st.arity(2)?;
    let w = st.wt(0)?;
    let [n_in, n_out, heads] = st.wdims::<3>(w)?;
    let x = st.val(1, DType::F32)?;
    let (rows, xin) = st.rows_fixed(x)?;
    let xs = &x.shape.0;
    if xin != n_in || xs.len() < 2 || xs[xs.len() - 2] != Dim::Fixed(heads) {
        return Err(st.err(format!(
            "`{}` {} must end in [{heads}, {n_in}] for weight `{}` ne {:?}",
            x.name, x.shape, w.name, w.ne
        )));
    }
    let tokens = rows
        .div_fixed(heads)
        .ok_or_else(|| st.err("rows not whole heads"))?;
    let numel = rows
        .times(Extent::fixed(n_out))
        .ok_or_else(|| st.err("overflow"))?;
    st.expect_out(out, numel, Some(Dim::Fixed(n_out)))?;
    let (ty, rb) = (w.ty.clone(), w.row_bytes);
    let work = Extent::fixed(heads * n_out);
    Ok(single(kernel("head_mat_mul", work, 1, move |k| {
        let (wb, xb, yb) = (k.arg(0), k.arg(1), k.out());
        let n_tok = k.extent(tokens);
        let nv = k.ic(n_in);
        let buf = row_buffer(k, &ty, n_in);
        k.for_range(k.begin, k.end, |k, r| {
            let row = k.at(wb, r, rb);
            let (rty, row) = stage_row(k, &ty, buf, row, nv);
            let h = k.div_c(r, n_out);
            let ho = k.mul_c(h, n_out);
            let o = k.b.ins().isub(r, ho);
            k.for_n(n_tok, |k, t| {
                let th = k.mul_c(t, heads);
                let xi = k.add(th, h);
                let xp = k.at(xb, xi, n_in * 4);
                let d = k.dot_row(&rty, row, xp, nv);
                let yrow = k.at(yb, xi, n_out * 4);
                let yp = k.at(yrow, o, 4);
                k.st(yp, d);
            });
        });
    })))
}

/// A stack buffer for one dequantized row of a quantized weight (see [`ROW_BUF_MAX`]).
fn row_buffer(
    k: &mut Kb<'_, '_>,
    ty: &WeightType,
    n: usize,
) -> Option<cranelift_codegen::ir::Value> {
    matches!(ty, WeightType::Quant(_))
        .then_some(())
        .filter(|_| n <= ROW_BUF_MAX)
        .map(|_| k.stack_f32(n))
}

/// The row the per-token dots read: the dequantized copy in `buf` (as F32) when there is one,
/// else the weight row itself.
fn stage_row(
    k: &mut Kb<'_, '_>,
    ty: &WeightType,
    buf: Option<cranelift_codegen::ir::Value>,
    row: cranelift_codegen::ir::Value,
    n: cranelift_codegen::ir::Value,
) -> (WeightType, cranelift_codegen::ir::Value) {
    match buf {
        Some(b) => {
            k.dequant_row(ty, row, b, n);
            (WeightType::F32, b)
        }
        None => (ty.clone(), row),
    }
}

/// `slice`: `y[r, :] = x[r, offset .. offset + len]`.
fn slice<'p>(st: &St<'_, 'p>, out: &Value) -> R<StepSpec<'p>> {
    st.arity(1)?;
    let x = st.val(0, DType::F32)?;
    let (rows, n) = st.rows_fixed(x)?;
    let Attrs::Slice { offset, len } = st.step.attrs else {
        return Err(st.err("attributes must be Slice"));
    };
    if len == 0 || offset.checked_add(len).is_none_or(|e| e > n) {
        return Err(st.err(format!(
            "slice {offset}..{offset}+{len} outside rows of {n}"
        )));
    }
    let numel = rows
        .times(Extent::fixed(len))
        .ok_or_else(|| st.err("overflow"))?;
    st.expect_out(out, numel, Some(Dim::Fixed(len)))?;
    Ok(single(kernel("slice", rows, ROW_GRAIN, move |k| {
        let (xb, yb) = (k.arg(0), k.out());
        let lv = k.ic(len);
        k.for_range(k.begin, k.end, |k, r| {
            let row = k.at(xb, r, n * 4);
            let src = k.add_c(row, offset * 4);
            let dst = k.at(yb, r, len * 4);
            k.copy_f32(dst, src, lv);
        });
    })))
}

/// `concat`: `y[r, :] = [a[r, :], b[r, :]]`.
fn concat<'p>(st: &St<'_, 'p>, out: &Value) -> R<StepSpec<'p>> {
    st.arity(2)?;
    let a = st.val(0, DType::F32)?;
    let b = st.val(1, DType::F32)?;
    let (rows, n1) = st.rows_fixed(a)?;
    let (rows_b, n2) = st.rows_fixed(b)?;
    if rows != rows_b {
        return Err(st.err(format!(
            "`{}` {} and `{}` {} have different row counts",
            a.name, a.shape, b.name, b.shape
        )));
    }
    let w = n1 + n2;
    let numel = rows
        .times(Extent::fixed(w))
        .ok_or_else(|| st.err("overflow"))?;
    st.expect_out(out, numel, Some(Dim::Fixed(w)))?;
    Ok(single(kernel("concat", rows, ROW_GRAIN, move |k| {
        let (ab, bb, yb) = (k.arg(0), k.arg(1), k.out());
        let (v1, v2) = (k.ic(n1), k.ic(n2));
        k.for_range(k.begin, k.end, |k, r| {
            let dst = k.at(yb, r, w * 4);
            let src_a = k.at(ab, r, n1 * 4);
            k.copy_f32(dst, src_a, v1);
            let dst_b = k.add_c(dst, n1 * 4);
            let src_b = k.at(bb, r, n2 * 4);
            k.copy_f32(dst_b, src_b, v2);
        });
    })))
}

/// `reshape`: the same elements; a copy only when the output lives elsewhere.
fn reshape<'p>(st: &St<'_, 'p>, out: &Value) -> R<StepSpec<'p>> {
    st.arity(1)?;
    let x = st.val(0, out.dtype)?;
    let numel = st.numel(x)?;
    st.expect_out(out, numel, None)?;
    if let Attrs::Reshape(shape) = &st.step.attrs {
        if shape != &out.shape {
            return Err(st.err(format!(
                "attribute shape {shape} differs from the output's {}",
                out.shape
            )));
        }
    }
    if x.storage == out.storage {
        return Ok(StepSpec {
            kernels: Vec::new(),
            scratch: Extent::fixed(0),
            checks: Vec::new(),
            expert_tables: Vec::new(),
        });
    }
    Ok(single(kernel("reshape", numel, ELEMENT_GRAIN, move |k| {
        let (xb, yb) = (k.arg(0), k.out());
        let src = k.at(xb, k.begin, 4);
        let dst = k.at(yb, k.begin, 4);
        let n = k.b.ins().isub(k.end, k.begin);
        k.copy_f32(dst, src, n);
    })))
}

/// `rope_yarn`: rotates adjacent pairs `(x[2i], x[2i+1])` of the first `n_rot` dims of each row
/// by `pos · θ_i` ([`yarn_inv_freq`]); cos/sin scaled by `attn_factor`; other dims copied.
fn rope<'p>(st: &St<'_, 'p>, out: &Value) -> R<StepSpec<'p>> {
    st.arity(2)?;
    let x = st.val(0, DType::F32)?;
    let pos = st.val(1, DType::I32)?;
    let (rows, d) = st.rows_fixed(x)?;
    let per_tok = st.per_token(x, pos, d)?;
    let Attrs::Rope(p) = &st.step.attrs else {
        return Err(st.err("attributes must be Rope"));
    };
    if p.n_rot == 0 || !p.n_rot.is_multiple_of(2) || p.n_rot > d {
        return Err(st.err(format!(
            "n_rot {} must be even, positive and ≤ {d}",
            p.n_rot
        )));
    }
    st.expect_out(out, st.numel(x)?, Some(Dim::Fixed(d)))?;
    let theta = yarn_inv_freq(p);
    let (n_rot, af) = (p.n_rot, p.attn_factor);
    Ok(single(kernel("rope_yarn", rows, ROW_GRAIN, move |k| {
        let (xb, pb, yb) = (k.arg(0), k.arg(1), k.out());
        k.for_range(k.begin, k.end, |k, r| {
            let t = k.div_c(r, per_tok);
            let pp = k.at(pb, t, 4);
            let pi = k.ld_i32(pp);
            let pf = k.b.ins().fcvt_from_sint(F32, pi);
            let xp = k.at(xb, r, d * 4);
            let yp = k.at(yb, r, d * 4);
            let afv = k.fc(af);
            for (i, &th) in theta.iter().enumerate() {
                let thv = k.fc(th);
                let ang = k.b.ins().fmul(thv, pf);
                let c0 = k.math(MATH_COS, ang);
                let s0 = k.math(MATH_SIN, ang);
                let c = k.b.ins().fmul(c0, afv);
                let s = k.b.ins().fmul(s0, afv);
                let x0 = k.ld_off(xp, 8 * i);
                let x1 = k.ld_off(xp, 8 * i + 4);
                let a = k.b.ins().fmul(x0, c);
                let bq = k.b.ins().fmul(x1, s);
                let y0 = k.b.ins().fsub(a, bq);
                let cq = k.b.ins().fmul(x1, c);
                let dq = k.b.ins().fmul(x0, s);
                let y1 = k.b.ins().fadd(cq, dq);
                k.st_off(yp, y0, 8 * i);
                k.st_off(yp, y1, 8 * i + 4);
            }
            if n_rot < d {
                let src = k.add_c(xp, n_rot * 4);
                let dst = k.add_c(yp, n_rot * 4);
                let rest = k.ic(d - n_rot);
                k.copy_f32(dst, src, rest);
            }
        });
    })))
}

/// `attn_temperature`: `y[t, ..] = x[t, ..] · (1 + β ln(1 + floor(pos[t] / L)))` (transformers
/// `get_llama_4_attn_scale`).
fn temperature<'p>(st: &St<'_, 'p>, out: &Value) -> R<StepSpec<'p>> {
    st.arity(2)?;
    let x = st.val(0, DType::F32)?;
    let pos = st.val(1, DType::I32)?;
    let per_tok = st.per_token(x, pos, 1)?;
    let Attrs::Temperature(q) = &st.step.attrs else {
        return Err(st.err("attributes must be Temperature"));
    };
    if q.length == 0 {
        return Err(st.err("temperature length must be positive"));
    }
    st.expect_out(out, st.numel(x)?, x.shape.0.last().copied())?;
    let tokens = st.numel(pos)?;
    let (beta, len) = (q.scale, q.length);
    Ok(single(kernel("attn_temperature", tokens, 1, move |k| {
        let (xb, pb, yb) = (k.arg(0), k.arg(1), k.out());
        let nv = k.ic(per_tok);
        k.for_range(k.begin, k.end, |k, t| {
            let pp = k.at(pb, t, 4);
            let p = k.ld_i32(pp);
            let lv = k.ic(len);
            let fl = k.b.ins().sdiv(p, lv);
            let flf = k.b.ins().fcvt_from_sint(F32, fl);
            let one = k.fc(1.0);
            let arg = k.b.ins().fadd(one, flf);
            let ln = k.math(MATH_LN, arg);
            let bv = k.fc(beta);
            let bl = k.b.ins().fmul(bv, ln);
            let f = k.b.ins().fadd(one, bl);
            let xp = k.at(xb, t, per_tok * 4);
            let yp = k.at(yb, t, per_tok * 4);
            k.for_n(nv, |k, i| {
                let xi = k.at(xp, i, 4);
                let yi = k.at(yp, i, 4);
                let v = k.ld(xi);
                let y = k.b.ins().fmul(v, f);
                k.st(yi, y);
            });
        });
    })))
}

/// `scale`, `add`, `mul`, `silu`: one element per work item, `f32x4` where it applies.
fn elementwise<'p>(st: &St<'_, 'p>, out: &Value) -> R<StepSpec<'p>> {
    let op = st.step.op;
    let binary = matches!(op, Op::Add | Op::Mul);
    st.arity(if binary { 2 } else { 1 })?;
    let a = st.val(0, DType::F32)?;
    let numel = st.numel(a)?;
    if binary {
        let b = st.val(1, DType::F32)?;
        if st.numel(b)? != numel {
            return Err(st.err(format!(
                "`{}` {} and `{}` {} differ in size",
                a.name, a.shape, b.name, b.shape
            )));
        }
    }
    let c = match (op, &st.step.attrs) {
        (Op::Scale, Attrs::Scale(c)) => *c,
        (Op::Scale, _) => return Err(st.err("attributes must be Scale")),
        _ => 0.0,
    };
    st.expect_out(out, numel, None)?;
    let name = op.name();
    Ok(single(kernel(name, numel, ELEMENT_GRAIN, move |k| {
        let xa = k.arg(0);
        let xb = if binary { k.arg(1) } else { xa };
        let yb = k.out();
        let apply = |k: &mut Kb<'_, '_>,
                     x: cranelift_codegen::ir::Value,
                     y: cranelift_codegen::ir::Value,
                     vec: bool| {
            match op {
                Op::Add => k.b.ins().fadd(x, y),
                Op::Mul => k.b.ins().fmul(x, y),
                _ => {
                    let cv = k.fc(c);
                    let cv = if vec { k.b.ins().splat(F32X4, cv) } else { cv };
                    k.b.ins().fmul(x, cv)
                }
            }
        };
        let count = k.b.ins().isub(k.end, k.begin);
        let split = if op == Op::Silu {
            k.begin
        } else {
            let mask = k.b.ins().iconst(I64, !3i64);
            let n4 = k.b.ins().band(count, mask);
            let split = k.add(k.begin, n4);
            k.for_step(k.begin, split, 4, |k, i| {
                let pa = k.at(xa, i, 4);
                let pb = k.at(xb, i, 4);
                let py = k.at(yb, i, 4);
                let va = k.ld4(pa);
                let vb = k.ld4(pb);
                let y = apply(k, va, vb, true);
                k.st4(py, y);
            });
            split
        };
        k.for_range(split, k.end, |k, i| {
            let pa = k.at(xa, i, 4);
            let pb = k.at(xb, i, 4);
            let py = k.at(yb, i, 4);
            let va = k.ld(pa);
            let y = if op == Op::Silu {
                k.silu(va)
            } else {
                let vb = k.ld(pb);
                apply(k, va, vb, false)
            };
            k.st(py, y);
        });
    })))
}

/// `softmax` over the last axis (fixed or `S`): `e^(x − max) / Σ e^(x − max)`.
fn softmax<'p>(st: &St<'_, 'p>, out: &Value) -> R<StepSpec<'p>> {
    st.arity(1)?;
    let x = st.val(0, DType::F32)?;
    let (rows, last) = st.rows_any(x)?;
    st.expect_out(out, st.numel(x)?, Some(last))?;
    let row_len = Extent::of_dim(last);
    Ok(single(kernel("softmax", rows, 1, move |k| {
        let (xb, yb) = (k.arg(0), k.out());
        let n = k.extent(row_len);
        k.for_range(k.begin, k.end, |k, r| {
            let off = k.mul(r, n);
            let xp = k.at(xb, off, 4);
            let yp = k.at(yb, off, 4);
            let ninf = k.fc(f32::NEG_INFINITY);
            let m = k.var(F32, ninf);
            k.for_n(n, |k, i| {
                let p = k.at(xp, i, 4);
                let v = k.ld(p);
                let cur = k.get(m);
                let mx = k.b.ins().fmax(cur, v);
                k.set(m, mx);
            });
            let mx = k.get(m);
            let zero = k.fc(0.0);
            let sum = k.var(F32, zero);
            k.for_n(n, |k, i| {
                let p = k.at(xp, i, 4);
                let v = k.ld(p);
                let dv = k.b.ins().fsub(v, mx);
                let e = k.math(super::host::MATH_EXP, dv);
                let q = k.at(yp, i, 4);
                k.st(q, e);
                let acc = k.get(sum);
                let acc = k.b.ins().fadd(acc, e);
                k.set(sum, acc);
            });
            let total = k.get(sum);
            k.for_n(n, |k, i| {
                let q = k.at(yp, i, 4);
                let e = k.ld(q);
                let y = k.b.ins().fdiv(e, total);
                k.st(q, y);
            });
        });
    })))
}

/// `cache_write`: `cache[pos[t], :] = kv[t, :]`; the output is the layer's `[S, w]` view.
fn cache_write<'p>(st: &St<'_, 'p>, out: &Value) -> R<StepSpec<'p>> {
    st.arity(2)?;
    let kv = st.val(0, DType::F32)?;
    let pos = st.val(1, DType::I32)?;
    let Attrs::CacheWrite { layer } = st.step.attrs else {
        return Err(st.err("attributes must be CacheWrite"));
    };
    if out.storage != (Storage::KvCache { layer }) {
        return Err(st.err(format!(
            "output `{}` must live in the latent cache of layer {layer}, not {:?}",
            out.name, out.storage
        )));
    }
    let (rows, w) = st.rows_fixed(kv)?;
    if st.numel(pos)? != rows {
        return Err(st.err(format!(
            "`{}` has one row per position, but {} vs {}",
            kv.name, kv.shape, pos.shape
        )));
    }
    let keys = Extent::of_dim(Dim::Keys)
        .times(Extent::fixed(w))
        .ok_or_else(|| st.err("overflow"))?;
    st.expect_out(out, keys, Some(Dim::Fixed(w)))?;
    let mut spec = single(kernel("cache_write", rows, 1, move |k| {
        let (kb, pb, yb) = (k.arg(0), k.arg(1), k.out());
        let wv = k.ic(w);
        k.for_range(k.begin, k.end, |k, r| {
            let pp = k.at(pb, r, 4);
            let p = k.ld_i32(pp);
            let src = k.at(kb, r, w * 4);
            let dst = k.at(yb, p, w * 4);
            k.copy_f32(dst, src, wv);
        });
    }));
    spec.checks.push(IndexCheck {
        arg: 1,
        bound: IndexBound::Keys,
        what: "position",
    });
    Ok(spec)
}

/// A latent-cache operand `[S, w]`.
fn keys_operand(st: &St<'_, '_>, i: usize) -> R<usize> {
    let k = st.val(i, DType::F32)?;
    let w = match k.shape.0.as_slice() {
        [Dim::Keys, Dim::Fixed(w)] if *w > 0 => *w,
        _ => return Err(st.err(format!("`{}` {} must be [S, w]", k.name, k.shape))),
    };
    Ok(w)
}

/// `scores_qk`: `s[r, j] = q[r, :] · k[j, :]` for rows `r` of `q` (`T·H`) and keys `j < S`.
fn scores_qk<'p>(st: &St<'_, 'p>, out: &Value) -> R<StepSpec<'p>> {
    st.arity(2)?;
    let q = st.val(0, DType::F32)?;
    let (rows, w) = st.rows_fixed(q)?;
    let kw = keys_operand(st, 1)?;
    if kw != w {
        return Err(st.err(format!("query width {w} differs from key width {kw}")));
    }
    let numel = rows
        .times(Extent::of_dim(Dim::Keys))
        .ok_or_else(|| st.err("overflow"))?;
    st.expect_out(out, numel, Some(Dim::Keys))?;
    Ok(single(kernel("scores_qk", rows, 1, move |k| {
        let (qb, kb, yb) = (k.arg(0), k.arg(1), k.out());
        let wv = k.ic(w);
        let s = k.s;
        k.for_range(k.begin, k.end, |k, r| {
            let qp = k.at(qb, r, w * 4);
            let ro = k.mul(r, s);
            let yr = k.at(yb, ro, 4);
            k.for_n(s, |k, j| {
                let kp = k.at(kb, j, w * 4);
                let d = k.dot_f32(qp, kp, wv);
                let yp = k.at(yr, j, 4);
                k.st(yp, d);
            });
        });
    })))
}

/// `causal_mask`: `y[t, h, j] = j > pos[t] ? −∞ : s[t, h, j]`.
fn causal_mask<'p>(st: &St<'_, 'p>, out: &Value) -> R<StepSpec<'p>> {
    st.arity(2)?;
    let x = st.val(0, DType::F32)?;
    let pos = st.val(1, DType::I32)?;
    let rows = st.rows_keys(x)?;
    let per_tok = rows
        .div_tokens()
        .filter(|e| e.tokens == 0 && e.keys == 0)
        .filter(|_| pos.shape.0.len() == 1 && x.shape.0.first() == pos.shape.0.first())
        .map(|e| e.fixed)
        .ok_or_else(|| {
            st.err(format!(
                "`{}` {} must be [T, fixed.., S] with positions `{}` {} = [T]",
                x.name, x.shape, pos.name, pos.shape
            ))
        })?;
    st.expect_out(out, st.numel(x)?, Some(Dim::Keys))?;
    Ok(single(kernel("causal_mask", rows, ROW_GRAIN, move |k| {
        let (xb, pb, yb) = (k.arg(0), k.arg(1), k.out());
        let s = k.s;
        let ninf = k.fc(f32::NEG_INFINITY);
        k.for_range(k.begin, k.end, |k, r| {
            let t = k.div_c(r, per_tok);
            let pp = k.at(pb, t, 4);
            let p = k.ld_i32(pp);
            let off = k.mul(r, s);
            let xr = k.at(xb, off, 4);
            let yr = k.at(yb, off, 4);
            k.for_n(s, |k, j| {
                let xp = k.at(xr, j, 4);
                let v = k.ld(xp);
                let future = k.b.ins().icmp(IntCC::SignedGreaterThan, j, p);
                let y = k.b.ins().select(future, ninf, v);
                let yp = k.at(yr, j, 4);
                k.st(yp, y);
            });
        });
    })))
}

/// `weighted_sum`: `y[r, :] = Σ_j p[r, j] · v[j, 0..len]`, `j` ascending.
fn weighted_sum<'p>(st: &St<'_, 'p>, out: &Value) -> R<StepSpec<'p>> {
    st.arity(2)?;
    let p = st.val(0, DType::F32)?;
    let rows = st.rows_keys(p)?;
    let w = keys_operand(st, 1)?;
    let Attrs::WeightedSum { len } = st.step.attrs else {
        return Err(st.err("attributes must be WeightedSum"));
    };
    if len == 0 || len > w {
        return Err(st.err(format!("len {len} must be in 1..={w}")));
    }
    let numel = rows
        .times(Extent::fixed(len))
        .ok_or_else(|| st.err("overflow"))?;
    st.expect_out(out, numel, Some(Dim::Fixed(len)))?;
    Ok(single(kernel("weighted_sum", rows, 1, move |k| {
        let (pb, vb, yb) = (k.arg(0), k.arg(1), k.out());
        let s = k.s;
        let len4 = len & !3;
        k.for_range(k.begin, k.end, |k, r| {
            let yp = k.at(yb, r, len * 4);
            let zero = k.fc(0.0);
            let zv = k.b.ins().splat(F32X4, zero);
            for i in (0..len4).step_by(4) {
                k.st_off(yp, zv, 4 * i);
            }
            for i in len4..len {
                k.st_off(yp, zero, 4 * i);
            }
            let ro = k.mul(r, s);
            let pr = k.at(pb, ro, 4);
            k.for_n(s, |k, j| {
                let pp = k.at(pr, j, 4);
                let pj = k.ld(pp);
                let pv = k.b.ins().splat(F32X4, pj);
                let vp = k.at(vb, j, w * 4);
                let l4 = k.ic(len4);
                let zero_i = k.ic(0);
                k.for_step(zero_i, l4, 4, |k, i| {
                    let a = k.at(vp, i, 4);
                    let y = k.at(yp, i, 4);
                    let va = k.ld4(a);
                    let prod = k.b.ins().fmul(pv, va);
                    let acc = k.ld4(y);
                    let sum = k.b.ins().fadd(acc, prod);
                    k.st4(y, sum);
                });
                let lv = k.ic(len);
                k.for_range(l4, lv, |k, i| {
                    let a = k.at(vp, i, 4);
                    let y = k.at(yp, i, 4);
                    let va = k.ld(a);
                    let prod = k.b.ins().fmul(pj, va);
                    let acc = k.ld(y);
                    let sum = k.b.ins().fadd(acc, prod);
                    k.st(y, sum);
                });
            });
        });
    })))
}

/// `top_k`: per row, the `k` largest in descending order, ties to the lower id. Selection pass
/// `j` takes the first maximum (in id order) among the elements strictly after pass `j − 1`'s pick
/// in the order (value desc, id asc); NaN is never picked, and a pass with no candidate writes −1
/// (which the consumer's index check rejects).
fn top_k<'p>(st: &St<'_, 'p>, out: &Value) -> R<StepSpec<'p>> {
    st.arity(1)?;
    let p = st.val(0, DType::F32)?;
    let (rows, e) = st.rows_fixed(p)?;
    let Attrs::TopK { k: kk } = st.step.attrs else {
        return Err(st.err("attributes must be TopK"));
    };
    if kk == 0 || kk > e {
        return Err(st.err(format!("k = {kk} must be in 1..={e}")));
    }
    let numel = rows
        .times(Extent::fixed(kk))
        .ok_or_else(|| st.err("overflow"))?;
    st.expect_out(out, numel, Some(Dim::Fixed(kk)))?;
    Ok(single(kernel("top_k", rows, ROW_GRAIN, move |k| {
        let (pb, yb) = (k.arg(0), k.out());
        let ev = k.ic(e);
        k.for_range(k.begin, k.end, |k, r| {
            let pr = k.at(pb, r, e * 4);
            let yr = k.at(yb, r, kk * 4);
            let inf = k.fc(f32::INFINITY);
            let minus1 = k.b.ins().iconst(I64, -1);
            let prev_v = k.var(F32, inf);
            let prev_i = k.var(I64, minus1);
            for j in 0..kk {
                let best_v = k.var(F32, inf);
                let best_i = k.var(I64, minus1);
                k.for_n(ev, |k, i| {
                    let pp = k.at(pr, i, 4);
                    let v = k.ld(pp);
                    let (pv, pi) = (k.get(prev_v), k.get(prev_i));
                    let below = k.b.ins().fcmp(FloatCC::LessThan, v, pv);
                    let tie = k.b.ins().fcmp(FloatCC::Equal, v, pv);
                    let later = k.b.ins().icmp(IntCC::SignedGreaterThan, i, pi);
                    let tie_later = k.b.ins().band(tie, later);
                    let cand = k.b.ins().bor(below, tie_later);
                    let (bv, bi) = (k.get(best_v), k.get(best_i));
                    let none = k.b.ins().icmp_imm_s(IntCC::SignedLessThan, bi, 0);
                    let better = k.b.ins().fcmp(FloatCC::GreaterThan, v, bv);
                    let wins = k.b.ins().bor(none, better);
                    let take = k.b.ins().band(cand, wins);
                    let nv = k.b.ins().select(take, v, bv);
                    let ni = k.b.ins().select(take, i, bi);
                    k.set(best_v, nv);
                    k.set(best_i, ni);
                });
                let (bv, bi) = (k.get(best_v), k.get(best_i));
                let yp = k.add_c(yr, 4 * j);
                k.st_i32(yp, bi);
                k.set(prev_v, bv);
                k.set(prev_i, bi);
            }
        });
    })))
}

/// `gather_renorm`: `y[t, j] = p[t, ids[t, j]] / Σ_j p[t, ids[t, j]] · scale` (renorm off:
/// `p · scale`).
fn gather_renorm<'p>(st: &St<'_, 'p>, out: &Value) -> R<StepSpec<'p>> {
    st.arity(2)?;
    let p = st.val(0, DType::F32)?;
    let ids = st.val(1, DType::I32)?;
    let (rows, e) = st.rows_fixed(p)?;
    let (rows_i, kk) = st.rows_fixed(ids)?;
    if rows != rows_i {
        return Err(st.err("probabilities and ids differ in row count"));
    }
    let Attrs::GatherRenorm { renorm, scale } = st.step.attrs else {
        return Err(st.err("attributes must be GatherRenorm"));
    };
    st.expect_out(out, st.numel(ids)?, Some(Dim::Fixed(kk)))?;
    let mut spec = single(kernel("gather_renorm", rows, ROW_GRAIN, move |k| {
        let (pb, ib, yb) = (k.arg(0), k.arg(1), k.out());
        k.for_range(k.begin, k.end, |k, r| {
            let pr = k.at(pb, r, e * 4);
            let ir = k.at(ib, r, kk * 4);
            let yr = k.at(yb, r, kk * 4);
            let mut picked = Vec::with_capacity(kk);
            for j in 0..kk {
                let ip = k.add_c(ir, 4 * j);
                let id = k.ld_i32(ip);
                let pp = k.at(pr, id, 4);
                picked.push(k.ld(pp));
            }
            let sc = k.fc(scale);
            let denom = if renorm {
                let mut sum = k.fc(0.0);
                for &v in &picked {
                    sum = k.b.ins().fadd(sum, v);
                }
                Some(sum)
            } else {
                None
            };
            for (j, &v) in picked.iter().enumerate() {
                let w = match denom {
                    Some(d) => k.b.ins().fdiv(v, d),
                    None => v,
                };
                let y = k.b.ins().fmul(w, sc);
                let yp = k.add_c(yr, 4 * j);
                k.st(yp, y);
            }
        });
    }));
    spec.checks.push(IndexCheck {
        arg: 1,
        bound: IndexBound::Below(e),
        what: "expert id",
    });
    Ok(spec)
}

/// `moe_ffn`: `y[t] = Σ_j w[t, j] · down_e(silu(gate_e · h[t]) ⊙ (up_e · h[t]))`, `e = ids[t, j]`,
/// reading only the selected experts' rows.
///
/// Algorithm note. The expert tensors are not read through their base address: each of them
/// (`ffn_gate_up_exps`, or `ffn_gate_exps` + `ffn_up_exps`, and `ffn_down_exps`) is an operand
/// holding a table of `n_expert` addresses ([`ExpertTable`]), one per expert, so the runtime can
/// serve an expert from a fast-store copy or from the mapped file. Row `r` of expert `e` is at
/// `table[e] + r · row_bytes`, the same bytes the stacked tensor holds at row `e · ne1 + r`; the
/// dot kernels and the reduction order are unchanged, so the bits do not depend on where an
/// expert lives. Kernel 1 (`gate_up`): one work item per (token, slot, f) computes
/// `silu(gate row f · h) · (up row f · h)` into the scratch; kernel 2 (`down`): one work item
/// per (token, output row) sums the slots' `w · (down row · act)` in slot order.
fn moe_ffn<'p>(st: &St<'_, 'p>, out: &Value) -> R<StepSpec<'p>> {
    let Attrs::Moe { n_ff, layout, .. } = st.step.attrs else {
        return Err(st.err("attributes must be Moe"));
    };
    let h = st.val(0, DType::F32)?;
    let ids = st.val(1, DType::I32)?;
    let wts = st.val(2, DType::F32)?;
    let (rows, d) = st.rows_fixed(h)?;
    let (rows_i, kk) = st.rows_fixed(ids)?;
    if rows_i != rows || st.numel(wts)? != st.numel(ids)? {
        return Err(st.err("h, ids and weights must have one row per token"));
    }
    // (gate tensor, up tensor, down tensor); with fused gate/up, up is rows n_ff.. of each expert
    let (gate, up, down) = match layout {
        ExpertLayout::FusedGateUp => {
            st.arity(5)?;
            let gu = st.wt(3)?;
            let [n0, n1, _] = st.wdims::<3>(gu)?;
            if n0 != d || n1 != 2 * n_ff {
                return Err(st.err(format!(
                    "`{}` ne {:?} must be {{{d}, {}, n_expert}}",
                    gu.name,
                    gu.ne,
                    2 * n_ff
                )));
            }
            (gu, gu, st.wt(4)?)
        }
        ExpertLayout::SplitGateUp => {
            st.arity(6)?;
            let (g, u) = (st.wt(3)?, st.wt(4)?);
            for w in [g, u] {
                let [n0, n1, _] = st.wdims::<3>(w)?;
                if n0 != d || n1 != n_ff {
                    return Err(st.err(format!(
                        "`{}` ne {:?} must be {{{d}, {n_ff}, n_expert}}",
                        w.name, w.ne
                    )));
                }
            }
            if g.ne != u.ne || g.ty != u.ty {
                return Err(st.err("gate and up experts differ in shape or type"));
            }
            (g, u, st.wt(5)?)
        }
    };
    let n_expert = st.wdims::<3>(gate)?[2];
    let [dn0, dn1, dn2] = st.wdims::<3>(down)?;
    if dn0 != n_ff || dn1 != d || dn2 != n_expert {
        return Err(st.err(format!(
            "`{}` ne {:?} must be {{{n_ff}, {d}, {n_expert}}}",
            down.name, down.ne
        )));
    }
    st.expect_out(out, st.numel(h)?, Some(Dim::Fixed(d)))?;
    let up_arg = if layout == ExpertLayout::FusedGateUp {
        3
    } else {
        4
    };
    let up_off = if layout == ExpertLayout::FusedGateUp {
        n_ff
    } else {
        0
    };
    let down_arg = up_arg + 1;
    let (gty, grb) = (gate.ty.clone(), gate.row_bytes);
    let (uty, urb) = (up.ty.clone(), up.row_bytes);
    let (dty, drb) = (down.ty.clone(), down.row_bytes);
    let slots = rows
        .times(Extent::fixed(kk))
        .ok_or_else(|| st.err("overflow"))?;
    let act = slots
        .times(Extent::fixed(n_ff))
        .ok_or_else(|| st.err("overflow"))?;
    let outs = rows
        .times(Extent::fixed(d))
        .ok_or_else(|| st.err("overflow"))?;

    let gate_up = kernel("moe_ffn.gate_up", act, 1, move |k| {
        let (hb, ib, gb, ub, sb) = (k.arg(0), k.arg(1), k.arg(3), k.arg(up_arg), k.scratch());
        let dv = k.ic(d);
        k.for_range(k.begin, k.end, |k, i| {
            let slot = k.div_c(i, n_ff);
            let so = k.mul_c(slot, n_ff);
            let f = k.b.ins().isub(i, so);
            let t = k.div_c(slot, kk);
            let ip = k.at(ib, slot, 4);
            let e = k.ld_i32(ip);
            let hp = k.at(hb, t, d * 4);
            let gbase = expert_addr(k, gb, e);
            let gp = k.at(gbase, f, grb);
            let ubase = expert_addr(k, ub, e);
            let urow = k.add_c(f, up_off);
            let up_p = k.at(ubase, urow, urb);
            let g = k.dot_row(&gty, gp, hp, dv);
            let u = k.dot_row(&uty, up_p, hp, dv);
            let sg = k.silu(g);
            let a = k.b.ins().fmul(sg, u);
            let ap = k.at(sb, i, 4);
            k.st(ap, a);
        });
    });
    let down_k = kernel("moe_ffn.down", outs, 1, move |k| {
        let (ib, wb, db, sb, yb) = (k.arg(1), k.arg(2), k.arg(down_arg), k.scratch(), k.out());
        let fv = k.ic(n_ff);
        k.for_range(k.begin, k.end, |k, i| {
            let t = k.div_c(i, d);
            let td = k.mul_c(t, d);
            let o = k.b.ins().isub(i, td);
            let zero = k.fc(0.0);
            let acc = k.var(F32, zero);
            for j in 0..kk {
                let tk = k.mul_c(t, kk);
                let slot = k.add_c(tk, j);
                let ip = k.at(ib, slot, 4);
                let e = k.ld_i32(ip);
                let wp = k.at(wb, slot, 4);
                let w = k.ld(wp);
                let dbase = expert_addr(k, db, e);
                let rp = k.at(dbase, o, drb);
                let ap = k.at(sb, slot, n_ff * 4);
                let dot = k.dot_row(&dty, rp, ap, fv);
                let c = k.b.ins().fmul(dot, w);
                let cur = k.get(acc);
                let sum = k.b.ins().fadd(cur, c);
                k.set(acc, sum);
            }
            let total = k.get(acc);
            let yp = k.at(yb, i, 4);
            k.st(yp, total);
        });
    });
    let table = |arg: usize, w: &WeightInfo| ExpertTable {
        arg,
        n_expert,
        expert_bytes: w.row_bytes * w.ne[1],
    };
    let mut expert_tables = vec![table(3, gate)];
    if layout == ExpertLayout::SplitGateUp {
        expert_tables.push(table(4, up));
    }
    expert_tables.push(table(down_arg, down));
    Ok(StepSpec {
        kernels: vec![gate_up, down_k],
        scratch: act,
        checks: vec![IndexCheck {
            arg: 1,
            bound: IndexBound::Below(n_expert),
            what: "expert id",
        }],
        expert_tables,
    })
}

/// The address of expert `e`'s slice: entry `e` (a `u64`) of the per-expert table at `table`.
fn expert_addr(
    k: &mut Kb<'_, '_>,
    table: cranelift_codegen::ir::Value,
    e: cranelift_codegen::ir::Value,
) -> cranelift_codegen::ir::Value {
    let p = k.at(table, e, 8);
    k.b.ins().load(I64, MemFlagsData::new().with_notrap(), p, 0)
}
