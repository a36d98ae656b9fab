//! Tests of the CPU oracle lowering: every lowered op against a plain-Rust f64 reference on random
//! inputs of odd sizes (proptest), the hard error on fused ops, operand validation, and the
//! independence of results from how the work is split.
//!
//! Tolerances are a-priori floating-point error bounds, stated per op before running: with unit
//! roundoff `u = 2⁻²⁴`, an f32 sum of `n` terms (any order) errs by at most `n·u·Σ|term|`
//! (Higham, *Accuracy and Stability of Numerical Algorithms*, §3.1); each libm call and each
//! rounded operation adds about one `u` relative. Test quant weights add one rounding per
//! dequantized element.

use super::*;
use aubier_compiler::config::{ExpertLayout, Mistral4Config, QueryTemperature, YarnParams};
use aubier_compiler::ops::Op;
use aubier_compiler::plan::{Operand, Plan, Step, Storage, Value};
use aubier_compiler::types::{Attrs, DType, Dim, Shape, WeightRef};
use proptest::prelude::*;

const U: f64 = 1.0 / (1u64 << 24) as f64;

// ---------------------------------------------------------------- test quant type `TQ8`
// Block of 4 elements in 8 bytes: f32 scale (LE), then 4 × i8; x = scale · q.

const TQ8_ELEMS: usize = 4;
const TQ8_BYTES: usize = 8;

fn tq8_scale(b: &[u8]) -> f32 {
    f32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

unsafe extern "C" fn tq8_dot(row: *const u8, x: *const f32, n: usize) -> f32 {
    // SAFETY: HostDotFn contract: n / 4 blocks of 8 bytes at `row`, n f32 at `x`.
    let (r, x) = unsafe {
        (
            std::slice::from_raw_parts(row, n / TQ8_ELEMS * TQ8_BYTES),
            std::slice::from_raw_parts(x, n),
        )
    };
    let mut acc = 0f32;
    for (b, xb) in r.chunks_exact(TQ8_BYTES).zip(x.chunks_exact(TQ8_ELEMS)) {
        let d = tq8_scale(b);
        for j in 0..TQ8_ELEMS {
            acc += (d * (b[4 + j] as i8) as f32) * xb[j];
        }
    }
    acc
}

unsafe extern "C" fn tq8_dequant(row: *const u8, y: *mut f32, n: usize) {
    // SAFETY: HostDequantFn contract.
    let (r, y) = unsafe {
        (
            std::slice::from_raw_parts(row, n / TQ8_ELEMS * TQ8_BYTES),
            std::slice::from_raw_parts_mut(y, n),
        )
    };
    for (b, yb) in r.chunks_exact(TQ8_BYTES).zip(y.chunks_exact_mut(TQ8_ELEMS)) {
        let d = tq8_scale(b);
        for j in 0..TQ8_ELEMS {
            yb[j] = d * (b[4 + j] as i8) as f32;
        }
    }
}

fn host() -> HostSymbols {
    HostSymbols::new().with(
        "TQ8",
        QuantKernels {
            block_elems: TQ8_ELEMS,
            block_bytes: TQ8_BYTES,
            dot: tq8_dot,
            dequant: tq8_dequant,
        },
    )
}

/// A weight tensor for a test: bytes plus its exact f64 values.
#[derive(Clone, Debug)]
struct Tensor {
    ty: &'static str,
    ne: Vec<usize>,
    bytes: Vec<u8>,
    vals: Vec<f64>,
}

impl Tensor {
    fn f32(ne: Vec<usize>, vals: &[f32]) -> Self {
        Self {
            ty: "F32",
            ne,
            bytes: vals.iter().flat_map(|v| v.to_le_bytes()).collect(),
            vals: vals.iter().map(|&v| v as f64).collect(),
        }
    }

    /// TQ8 from per-block scales and i8 quants.
    fn tq8(ne: Vec<usize>, scales: &[f32], qs: &[i8]) -> Self {
        let mut bytes = Vec::new();
        let mut vals = Vec::new();
        for (b, d) in scales.iter().enumerate() {
            bytes.extend(d.to_le_bytes());
            for &q in &qs[b * TQ8_ELEMS..(b + 1) * TQ8_ELEMS] {
                bytes.push(q as u8);
                vals.push(*d as f64 * q as f64);
            }
        }
        Self {
            ty: "TQ8",
            ne,
            bytes,
            vals,
        }
    }

    fn weight_ref(&self, name: &str) -> WeightRef {
        WeightRef {
            name: name.into(),
            ggml_type: self.ty.into(),
            ne: self.ne.clone(),
        }
    }
}

// ---------------------------------------------------------------- plan building and execution

fn config() -> Mistral4Config {
    Mistral4Config {
        arch: "mistral4".into(),
        n_layer: 1,
        n_embd: 8,
        n_vocab: 16,
        n_ctx_train: 64,
        n_head: 2,
        q_lora_rank: 8,
        kv_lora_rank: 8,
        qk_nope_head_dim: 4,
        qk_rope_head_dim: 4,
        v_head_dim: 4,
        rms_norm_eps: 1e-6,
        n_expert: 4,
        n_expert_used: 2,
        n_expert_shared: 1,
        n_ff_exp: 4,
        expert_weights_scale: 1.0,
        expert_weights_norm: true,
        rope: YarnParams {
            n_rot: 4,
            freq_base: 10000.0,
            factor: 1.0,
            original_context: 64,
            beta_fast: 32.0,
            beta_slow: 1.0,
            attn_factor: 1.0,
            log_multiplier: 0.1,
        },
        temperature: None,
        expert_layout: ExpertLayout::FusedGateUp,
    }
}

fn fx(n: usize) -> Dim {
    Dim::Fixed(n)
}

/// A one-step plan: values `0..n_in` are the inputs, the last value is the output.
struct OneStep {
    values: Vec<Value>,
    weights: Vec<Tensor>,
    op: Op,
    attrs: Attrs,
    args: Vec<Operand>,
}

impl OneStep {
    fn new(op: Op, attrs: Attrs) -> Self {
        Self {
            values: Vec::new(),
            weights: Vec::new(),
            op,
            attrs,
            args: Vec::new(),
        }
    }

    /// Adds an input value (own slot) as the next operand.
    fn input(mut self, dtype: DType, dims: Vec<Dim>) -> Self {
        let id = self.values.len();
        self.values.push(Value {
            dtype,
            shape: Shape(dims),
            storage: Storage::Slot(id),
            name: format!("in{id}"),
        });
        self.args.push(Operand::Value(id));
        self
    }

    /// Adds a weight as the next operand.
    fn weight(mut self, t: Tensor) -> Self {
        self.args.push(Operand::Weight(self.weights.len()));
        self.weights.push(t);
        self
    }

    /// Finishes with the output value.
    fn output(
        mut self,
        dtype: DType,
        dims: Vec<Dim>,
        storage: Option<Storage>,
    ) -> (Plan, Vec<Tensor>) {
        let id = self.values.len();
        self.values.push(Value {
            dtype,
            shape: Shape(dims),
            storage: storage.unwrap_or(Storage::Slot(id)),
            name: "out".into(),
        });
        let weights = self
            .weights
            .iter()
            .enumerate()
            .map(|(i, t)| t.weight_ref(&format!("w{i}")))
            .collect();
        let plan = Plan {
            config: config(),
            stages: vec!["test".into()],
            weights,
            n_slots: id + 1,
            inputs: Vec::new(),
            outputs: vec![("out".into(), id)],
            values: self.values,
            steps: vec![Step {
                op: self.op,
                attrs: self.attrs,
                args: self.args,
                out: id,
            }],
            output_head: None,
        };
        (plan, self.weights)
    }
}

/// Raw 4-byte buffers, one per value.
type Bufs = Vec<Vec<u32>>;

fn f32s(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn i32s(v: &[i32]) -> Vec<u32> {
    v.iter().map(|&x| x as u32).collect()
}

fn as_f32(v: &[u32]) -> Vec<f32> {
    v.iter().map(|&b| f32::from_bits(b)).collect()
}

/// Compiles and runs a plan's steps at `T = t`, `S = s`, splitting every kernel's work into
/// `chunks` contiguous ranges; returns every value's buffer.
fn exec(
    plan: &Plan,
    weights: &[Tensor],
    inputs: &[Vec<u32>],
    t: usize,
    s: usize,
    chunks: usize,
) -> Bufs {
    exec_placed(plan, weights, inputs, t, s, chunks, &|w, e, bytes| {
        weights[w].bytes[e * bytes..].as_ptr()
    })
}

/// Where expert `e` (second argument) of weight `w` (first) lives, given its slice length in bytes.
type Place<'a> = dyn Fn(usize, usize, usize) -> *const u8 + 'a;

/// [`exec`] with the expert tables of `moe_ffn` filled by `place`.
fn exec_placed(
    plan: &Plan,
    weights: &[Tensor],
    inputs: &[Vec<u32>],
    t: usize,
    s: usize,
    chunks: usize,
    place: &Place<'_>,
) -> Bufs {
    let prog = CpuProgram::compile(plan, &host()).expect("lowering");
    assert_eq!(prog.weight_bytes().len(), weights.len());
    for (w, &n) in weights.iter().zip(prog.weight_bytes()) {
        assert_eq!(w.bytes.len(), n, "test weight size");
    }
    let mut bufs: Bufs = plan
        .values
        .iter()
        .map(|v| vec![0u32; v.shape.numel(t, s)])
        .collect();
    for (i, data) in inputs.iter().enumerate() {
        assert_eq!(bufs[i].len(), data.len(), "input {i} size");
        bufs[i].clone_from(data);
    }
    for (step, cs) in plan.steps.iter().zip(prog.steps()) {
        let mut scratch = vec![0f32; cs.scratch.eval(t, s).expect("scratch")];
        let tables: Vec<(usize, Vec<u64>)> = cs
            .expert_tables
            .iter()
            .map(|tab| {
                let Operand::Weight(w) = step.args[tab.arg] else {
                    panic!("an expert table operand must be a weight");
                };
                assert_eq!(weights[w].bytes.len(), tab.n_expert * tab.expert_bytes);
                let addrs = (0..tab.n_expert)
                    .map(|e| place(w, e, tab.expert_bytes) as u64)
                    .collect();
                (tab.arg, addrs)
            })
            .collect();
        for kernel in &cs.kernels {
            let work = kernel.work().eval(t, s).expect("work");
            let n = chunks.clamp(1, work.max(1));
            for c in 0..n {
                let mut a = StepArgs::new(t, s, work * c / n, work * (c + 1) / n);
                for (j, op) in step.args.iter().enumerate() {
                    a.args[j] = match op {
                        Operand::Value(v) => bufs[*v].as_ptr() as *const u8,
                        Operand::Weight(w) => weights[*w].bytes.as_ptr(),
                    };
                }
                for (arg, addrs) in &tables {
                    a.args[*arg] = addrs.as_ptr() as *const u8;
                }
                a.out = bufs[step.out].as_mut_ptr() as *mut u8;
                a.scratch = scratch.as_mut_ptr();
                // SAFETY: buffers are sized by the values' shapes at (t, s), inputs are valid ids,
                // every expert table entry addresses `expert_bytes` bytes of that expert.
                unsafe { kernel.call(&a) };
            }
        }
    }
    bufs
}

/// `(arg, n_expert)` of every expert table of the plan's first step.
fn prog_tables(plan: &Plan) -> Vec<(usize, usize)> {
    let prog = CpuProgram::compile(plan, &host()).expect("lowering");
    prog.steps()[0]
        .expert_tables
        .iter()
        .map(|t| (t.arg, t.n_expert))
        .collect()
}

fn lower_err(plan: &Plan) -> LowerError {
    CpuProgram::compile(plan, &host()).expect_err("must not lower")
}

/// Asserts `|got − want| ≤ bound` element-wise (and equal NaN positions); prints the worst element.
fn check(what: &str, got: &[f32], want: &[f64], bound: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for i in 0..got.len() {
        let (g, w) = (got[i] as f64, want[i]);
        if w.is_nan() || g.is_nan() {
            assert!(w.is_nan() && g.is_nan(), "{what}[{i}]: got {g}, want {w}");
            continue;
        }
        if w.is_infinite() || g.is_infinite() {
            assert_eq!(g, w, "{what}[{i}]");
            continue;
        }
        let err = (g - w).abs();
        assert!(
            err <= bound[i],
            "{what}[{i}]: got {g}, want {w}, |err| {err:e} > bound {:e}",
            bound[i]
        );
    }
}

// ---------------------------------------------------------------- strategies

fn vals(n: usize) -> impl Strategy<Value = Vec<f32>> {
    prop::collection::vec(-2.0f32..2.0, n)
}

/// A weight with ggml `ne` from the values `src` (cycled): F32 as is, or TQ8 with quants
/// `src·60` and scales `|src|·0.02 + 0.001` (`ne[0]` must then be a multiple of 4).
fn make_tensor(ne: Vec<usize>, quant: bool, src: &[f32]) -> Tensor {
    let n: usize = ne.iter().product();
    let v: Vec<f32> = src.iter().cycle().take(n).copied().collect();
    if quant {
        let sc: Vec<f32> = v
            .iter()
            .take(n / TQ8_ELEMS)
            .map(|x| x.abs() * 0.02 + 0.001)
            .collect();
        let q: Vec<i8> = v.iter().map(|x| (x * 60.0) as i8).collect();
        Tensor::tq8(ne, &sc, &q)
    } else {
        Tensor::f32(ne, &v)
    }
}

/// Sizes that exercise the 8-lane and 4-lane tails.
fn odd() -> impl Strategy<Value = usize> {
    prop_oneof![Just(1usize), Just(3), Just(7), Just(8), Just(9), 1usize..70]
}

fn cfg() -> ProptestConfig {
    ProptestConfig {
        cases: 40,
        ..ProptestConfig::default()
    }
}

/// f64 dot and its error bound `(n + extra)·u·Σ|w x|`.
fn dot_ref(w: &[f64], x: &[f32], extra: f64) -> (f64, f64) {
    let mut s = 0.0;
    let mut a = 0.0;
    for (wi, xi) in w.iter().zip(x) {
        s += wi * *xi as f64;
        a += (wi * *xi as f64).abs();
    }
    (s, (w.len() as f64 + extra) * U * a + 1e-30)
}

// ---------------------------------------------------------------- ops

proptest! {
    #![proptest_config(cfg())]

    #[test]
    fn mat_mul_matches_f64(n_in in odd(), n_out in 1usize..9, t in 1usize..4, quant in any::<bool>(),
                           seed_x in vals(3 * 70), ws in vals(72 * 9)) {
        let n_in = if quant { n_in.div_ceil(4) * 4 } else { n_in };
        let w = make_tensor(vec![n_in, n_out], quant, &ws);
        let x: Vec<f32> = seed_x.iter().cycle().take(t * n_in).copied().collect();
        let (plan, ws) = OneStep::new(Op::MatMul, Attrs::None)
            .weight(w.clone())
            .input(DType::F32, vec![Dim::Tokens, fx(n_in)])
            .output(DType::F32, vec![Dim::Tokens, fx(n_out)], None);
        let bufs = exec(&plan, &ws, &[f32s(&x)], t, 1, 3);
        let got = as_f32(&bufs[1]);
        let (mut want, mut bound) = (vec![], vec![]);
        for ti in 0..t {
            for o in 0..n_out {
                let (v, b) = dot_ref(&w.vals[o * n_in..(o + 1) * n_in], &x[ti * n_in..(ti + 1) * n_in], 6.0);
                want.push(v);
                bound.push(b);
            }
        }
        check("mat_mul", &got, &want, &bound);
    }

    #[test]
    fn head_mat_mul_matches_f64(n_in in 1usize..12, n_out in 1usize..6, heads in 1usize..4, t in 1usize..4,
                                quant in any::<bool>(), xs in vals(3 * 3 * 48), ws in vals(48 * 6 * 3)) {
        let n_in = if quant { n_in.div_ceil(4) * 4 } else { n_in };
        let w = make_tensor(vec![n_in, n_out, heads], quant, &ws);
        let x: Vec<f32> = xs.iter().cycle().take(t * heads * n_in).copied().collect();
        let (plan, wts) = OneStep::new(Op::HeadMatMul, Attrs::None)
            .weight(w.clone())
            .input(DType::F32, vec![Dim::Tokens, fx(heads), fx(n_in)])
            .output(DType::F32, vec![Dim::Tokens, fx(heads), fx(n_out)], None);
        let got = as_f32(&exec(&plan, &wts, &[f32s(&x)], t, 1, 2)[1]);
        let (mut want, mut bound) = (vec![], vec![]);
        for ti in 0..t {
            for h in 0..heads {
                for o in 0..n_out {
                    let r = h * n_out + o;
                    let xi = (ti * heads + h) * n_in;
                    let (v, b) = dot_ref(&w.vals[r * n_in..(r + 1) * n_in], &x[xi..xi + n_in], 6.0);
                    want.push(v);
                    bound.push(b);
                }
            }
        }
        check("head_mat_mul", &got, &want, &bound);
    }

    #[test]
    fn rms_norm_matches_f64(n in odd(), rows in 1usize..5, xs in vals(5 * 70), ws in vals(70)) {
        let x = &xs[..rows * n];
        let wv = &ws[..n];
        let eps = 1e-6f32;
        let (plan, wts) = OneStep::new(Op::RmsNorm, Attrs::Eps(eps))
            .input(DType::F32, vec![Dim::Tokens, fx(n)])
            .weight(Tensor::f32(vec![n], wv))
            .output(DType::F32, vec![Dim::Tokens, fx(n)], None);
        let got = as_f32(&exec(&plan, &wts, &[f32s(x)], rows, 1, 2)[1]);
        let (mut want, mut bound) = (vec![], vec![]);
        for r in x.chunks(n) {
            let ms = r.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / n as f64;
            let inv = 1.0 / (ms + eps as f64).sqrt();
            for (i, &v) in r.iter().enumerate() {
                let y = v as f64 * inv * wv[i] as f64;
                want.push(y);
                // sum of squares n·u, mean/eps/sqrt/div 4u (halved by the sqrt), two products 2u.
                bound.push((n as f64 + 8.0) * U * y.abs() + 1e-30);
            }
        }
        check("rms_norm", &got, &want, &bound);
    }

    #[test]
    fn embed_reads_rows(d in 1usize..20, vocab in 1usize..9, t in 1usize..6, quant in any::<bool>(),
                        ids_seed in prop::collection::vec(any::<u32>(), 6), ws in vals(20 * 9)) {
        let d = if quant { d.div_ceil(4) * 4 } else { d };
        let w = make_tensor(vec![d, vocab], quant, &ws);
        let ids: Vec<i32> = ids_seed[..t].iter().map(|&v| (v as usize % vocab) as i32).collect();
        let (plan, wts) = OneStep::new(Op::Embed, Attrs::None)
            .weight(w.clone())
            .input(DType::I32, vec![Dim::Tokens])
            .output(DType::F32, vec![Dim::Tokens, fx(d)], None);
        let prog = CpuProgram::compile(&plan, &host()).expect("lowering");
        prop_assert_eq!(&prog.steps()[0].checks, &vec![IndexCheck { arg: 1, bound: IndexBound::Below(vocab), what: "token id" }]);
        let got = as_f32(&exec(&plan, &wts, &[i32s(&ids)], t, 1, 2)[1]);
        let want: Vec<f64> = ids.iter().flat_map(|&i| w.vals[i as usize * d..(i as usize + 1) * d].to_vec()).collect();
        // F32 rows are copied; TQ8 rows pay one rounding of d·q.
        let bound: Vec<f64> = want.iter().map(|v| U * v.abs()).collect();
        check("embed", &got, &want, &bound);
    }

    #[test]
    fn slice_concat_reshape_move_bits(n1 in odd(), n2 in odd(), rows in 1usize..5, xs in vals(5 * 140)) {
        let a: Vec<f32> = xs[..rows * n1].to_vec();
        let b: Vec<f32> = xs[rows * n1..rows * (n1 + n2)].to_vec();
        let (plan, w) = OneStep::new(Op::Concat, Attrs::None)
            .input(DType::F32, vec![Dim::Tokens, fx(n1)])
            .input(DType::F32, vec![Dim::Tokens, fx(n2)])
            .output(DType::F32, vec![Dim::Tokens, fx(n1 + n2)], None);
        let cat = as_f32(&exec(&plan, &w, &[f32s(&a), f32s(&b)], rows, 1, 3)[2]);
        for r in 0..rows {
            prop_assert_eq!(&cat[r * (n1 + n2)..r * (n1 + n2) + n1], &a[r * n1..(r + 1) * n1]);
            prop_assert_eq!(&cat[r * (n1 + n2) + n1..(r + 1) * (n1 + n2)], &b[r * n2..(r + 1) * n2]);
        }
        let (plan, w) = OneStep::new(Op::Slice, Attrs::Slice { offset: n1, len: n2 })
            .input(DType::F32, vec![Dim::Tokens, fx(n1 + n2)])
            .output(DType::F32, vec![Dim::Tokens, fx(n2)], None);
        let back = as_f32(&exec(&plan, &w, &[f32s(&cat)], rows, 1, 2)[1]);
        prop_assert_eq!(back, b);
        let shape = Shape(vec![Dim::Tokens, fx(1), fx(n1 + n2)]);
        let (plan, w) = OneStep::new(Op::Reshape, Attrs::Reshape(shape.clone()))
            .input(DType::F32, vec![Dim::Tokens, fx(n1 + n2)])
            .output(DType::F32, shape.0, None);
        let same = as_f32(&exec(&plan, &w, &[f32s(&cat)], rows, 1, 5)[1]);
        prop_assert_eq!(same, cat);
    }

    #[test]
    fn elementwise_ops_match_f64(n in 1usize..300, xs in vals(300), ys in vals(300), c in -3.0f32..3.0) {
        let (x, y) = (&xs[..n], &ys[..n]);
        for op in [Op::Add, Op::Mul, Op::Scale, Op::Silu] {
            let attrs = if op == Op::Scale { Attrs::Scale(c) } else { Attrs::None };
            let mut b = OneStep::new(op, attrs).input(DType::F32, vec![Dim::Tokens, fx(n)]);
            let mut inputs = vec![f32s(x)];
            if matches!(op, Op::Add | Op::Mul) {
                b = b.input(DType::F32, vec![Dim::Tokens, fx(n)]);
                inputs.push(f32s(y));
            }
            let (plan, w) = b.output(DType::F32, vec![Dim::Tokens, fx(n)], None);
            let bufs = exec(&plan, &w, &inputs, 1, 1, 3);
            let got = as_f32(&bufs[inputs.len()]);
            let want: Vec<f64> = (0..n).map(|i| {
                let (a, b) = (x[i] as f64, y[i] as f64);
                match op {
                    Op::Add => a + b,
                    Op::Mul => a * b,
                    Op::Scale => a * c as f64,
                    _ => a / (1.0 + (-a).exp()),
                }
            }).collect();
            // one rounding (add/mul/scale); silu: exp 1u + add 1u + div 0.5u, rounded up to 4u.
            let k = if op == Op::Silu { 4.0 } else { 1.0 };
            let bound: Vec<f64> = want.iter().map(|v| k * U * v.abs() + 1e-30).collect();
            check(op.name(), &got, &want, &bound);
        }
    }

    #[test]
    fn softmax_matches_f64(n in odd(), rows in 1usize..4, xs in vals(4 * 70), keys in any::<bool>()) {
        let x: Vec<f32> = xs[..rows * n].iter().map(|v| v * 2.0).collect();
        let last = if keys { Dim::Keys } else { fx(n) };
        let (plan, w) = OneStep::new(Op::Softmax, Attrs::None)
            .input(DType::F32, vec![Dim::Tokens, last])
            .output(DType::F32, vec![Dim::Tokens, last], None);
        let got = as_f32(&exec(&plan, &w, &[f32s(&x)], rows, n, 2)[1]);
        let (mut want, mut bound) = (vec![], vec![]);
        for r in x.chunks(n) {
            let m = r.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
            let s: f64 = r.iter().map(|&v| (v as f64 - m).exp()).sum();
            for &v in r {
                let y = (v as f64 - m).exp() / s;
                want.push(y);
                // x − m rounded (|x − m|·u in the exponent), exp 1u, sum n·u, divide 0.5u.
                bound.push((n as f64 + 4.0 + 2.0 * (v as f64 - m).abs()) * U * y + 1e-30);
            }
        }
        check("softmax", &got, &want, &bound);
    }

    #[test]
    fn rope_yarn_matches_f64(heads in 1usize..4, half_rot in 1usize..9, extra in 0usize..5, t in 1usize..5,
                             p0 in 0i32..300, factor in prop_oneof![Just(1.0f32), Just(4.0), Just(40.0)],
                             xs in vals(4 * 3 * 22)) {
        let n_rot = 2 * half_rot;
        let d = n_rot + extra;
        let params = YarnParams { n_rot, freq_base: 10000.0, factor, original_context: 64, beta_fast: 32.0,
            beta_slow: 1.0, attn_factor: 1.25, log_multiplier: 0.1 };
        let x: Vec<f32> = xs.iter().cycle().take(t * heads * d).copied().collect();
        let pos: Vec<i32> = (0..t as i32).map(|i| p0 + 7 * i).collect();
        let (plan, w) = OneStep::new(Op::RopeYarn, Attrs::Rope(params.clone()))
            .input(DType::F32, vec![Dim::Tokens, fx(heads), fx(d)])
            .input(DType::I32, vec![Dim::Tokens])
            .output(DType::F32, vec![Dim::Tokens, fx(heads), fx(d)], None);
        let got = as_f32(&exec(&plan, &w, &[f32s(&x), i32s(&pos)], t, 1, 2)[2]);
        let theta = yarn_inv_freq(&params);
        let (mut want, mut bound) = (vec![], vec![]);
        for (r, row) in x.chunks(d).enumerate() {
            let p = pos[r / heads];
            for i in 0..d {
                if i < n_rot {
                    let pair = i / 2;
                    // The angle is an f32 product, as transformers forms it (`inv_freq @ pos`).
                    let ang = (theta[pair] * p as f32) as f64;
                    let (c, s) = (ang.cos() * 1.25, ang.sin() * 1.25);
                    let (x0, x1) = (row[2 * pair] as f64, row[2 * pair + 1] as f64);
                    let y = if i.is_multiple_of(2) { x0 * c - x1 * s } else { x1 * c + x0 * s };
                    want.push(y);
                    // cos/sin 1u each, the attn_factor product, two products and a sum.
                    bound.push(6.0 * U * 1.25 * (x0.abs() + x1.abs()) + 1e-30);
                } else {
                    want.push(row[i] as f64);
                    bound.push(0.0);
                }
            }
        }
        check("rope_yarn", &got, &want, &bound);
    }

    #[test]
    fn attn_temperature_matches_f64(width in odd(), t in 1usize..5, p0 in 0i32..500, xs in vals(5 * 70)) {
        let q = QueryTemperature { scale: 0.1, length: 64 };
        let x = &xs[..t * width];
        let pos: Vec<i32> = (0..t as i32).map(|i| p0 + 50 * i).collect();
        let (plan, w) = OneStep::new(Op::AttnTemperature, Attrs::Temperature(q))
            .input(DType::F32, vec![Dim::Tokens, fx(width)])
            .input(DType::I32, vec![Dim::Tokens])
            .output(DType::F32, vec![Dim::Tokens, fx(width)], None);
        let got = as_f32(&exec(&plan, &w, &[f32s(x), i32s(&pos)], t, 1, 2)[2]);
        let (mut want, mut bound) = (vec![], vec![]);
        for (ti, row) in x.chunks(width).enumerate() {
            let f = 1.0 + 0.1f32 as f64 * (1.0 + (pos[ti] / 64) as f64).ln();
            for &v in row {
                want.push(v as f64 * f);
                // ln 1u, the products and sums 3u, β's rounding to f32 inside ln's term: 5u.
                bound.push(5.0 * U * (v as f64 * f).abs() + 1e-30);
            }
        }
        check("attn_temperature", &got, &want, &bound);
    }

    #[test]
    fn attention_ops_match_f64(w in odd(), len_cut in 0usize..4, heads in 1usize..4, t in 1usize..4,
                               past in 0usize..6, xs in vals(3 * 3 * 70), ks in vals(9 * 70)) {
        // scores_qk, causal_mask and weighted_sum over a cache of S = past + T keys.
        let s = past + t;
        let q = &xs[..t * heads * w];
        let k = &ks[..s * w];
        let pos: Vec<i32> = (0..t).map(|i| (past + i) as i32).collect();
        let (plan, wt) = OneStep::new(Op::ScoresQk, Attrs::None)
            .input(DType::F32, vec![Dim::Tokens, fx(heads), fx(w)])
            .input(DType::F32, vec![Dim::Keys, fx(w)])
            .output(DType::F32, vec![Dim::Tokens, fx(heads), Dim::Keys], None);
        let scores = as_f32(&exec(&plan, &wt, &[f32s(q), f32s(k)], t, s, 3)[2]);
        let (mut want, mut bound) = (vec![], vec![]);
        for r in 0..t * heads {
            for j in 0..s {
                let qd: Vec<f64> = q[r * w..(r + 1) * w].iter().map(|&v| v as f64).collect();
                let (v, b) = dot_ref(&qd, &k[j * w..(j + 1) * w], 4.0);
                want.push(v);
                bound.push(b);
            }
        }
        check("scores_qk", &scores, &want, &bound);

        let (plan, wt) = OneStep::new(Op::CausalMask, Attrs::None)
            .input(DType::F32, vec![Dim::Tokens, fx(heads), Dim::Keys])
            .input(DType::I32, vec![Dim::Tokens])
            .output(DType::F32, vec![Dim::Tokens, fx(heads), Dim::Keys], None);
        let masked = as_f32(&exec(&plan, &wt, &[f32s(&scores), i32s(&pos)], t, s, 2)[2]);
        for r in 0..t * heads {
            for j in 0..s {
                let expect = if j > pos[r / heads] as usize { f32::NEG_INFINITY } else { scores[r * s + j] };
                prop_assert_eq!(masked[r * s + j].to_bits(), expect.to_bits());
            }
        }

        let len = w.saturating_sub(len_cut).max(1);
        let p: Vec<f32> = masked.iter().map(|v| if v.is_finite() { (v * 0.1).exp() } else { 0.0 }).collect();
        let (plan, wt) = OneStep::new(Op::WeightedSum, Attrs::WeightedSum { len })
            .input(DType::F32, vec![Dim::Tokens, fx(heads), Dim::Keys])
            .input(DType::F32, vec![Dim::Keys, fx(w)])
            .output(DType::F32, vec![Dim::Tokens, fx(heads), fx(len)], None);
        let o = as_f32(&exec(&plan, &wt, &[f32s(&p), f32s(k)], t, s, 2)[2]);
        let (mut want, mut bound) = (vec![], vec![]);
        for r in 0..t * heads {
            for i in 0..len {
                let terms: Vec<f64> = (0..s).map(|j| p[r * s + j] as f64 * k[j * w + i] as f64).collect();
                want.push(terms.iter().sum());
                bound.push((s as f64 + 1.0) * U * terms.iter().map(|v| v.abs()).sum::<f64>() + 1e-30);
            }
        }
        check("weighted_sum", &o, &want, &bound);
    }

    #[test]
    fn cache_write_places_rows(w in odd(), t in 1usize..5, past in 0usize..5, xs in vals(5 * 70)) {
        let s = past + t;
        let kv = &xs[..t * w];
        let pos: Vec<i32> = (0..t).map(|i| (past + i) as i32).collect();
        let (plan, wt) = OneStep::new(Op::CacheWrite, Attrs::CacheWrite { layer: 0 })
            .input(DType::F32, vec![Dim::Tokens, fx(w)])
            .input(DType::I32, vec![Dim::Tokens])
            .output(DType::F32, vec![Dim::Keys, fx(w)], Some(Storage::KvCache { layer: 0 }));
        let prog = CpuProgram::compile(&plan, &host()).expect("lowering");
        prop_assert_eq!(prog.steps()[0].checks[0].bound, IndexBound::Keys);
        let cache = as_f32(&exec(&plan, &wt, &[f32s(kv), i32s(&pos)], t, s, 2)[2]);
        prop_assert!(cache[..past * w].iter().all(|&v| v == 0.0));
        prop_assert_eq!(&cache[past * w..], kv);
    }

    #[test]
    fn top_k_and_gather_renorm_match_reference(e in 1usize..20, k in 1usize..6, t in 1usize..4,
                                                raw in prop::collection::vec(0u8..6, 60), scale in 0.5f32..2.0,
                                                renorm in any::<bool>()) {
        // Few distinct values, so ties are common.
        let k = k.min(e);
        let p: Vec<f32> = raw.iter().cycle().take(t * e).map(|&v| v as f32 * 0.125 + 0.01).collect();
        let (plan, w) = OneStep::new(Op::TopK, Attrs::TopK { k })
            .input(DType::F32, vec![Dim::Tokens, fx(e)])
            .output(DType::I32, vec![Dim::Tokens, fx(k)], None);
        let ids: Vec<i32> = exec(&plan, &w, &[f32s(&p)], t, 1, 2)[1].iter().map(|&b| b as i32).collect();
        for r in 0..t {
            let mut order: Vec<usize> = (0..e).collect();
            // descending by value, ties to the lower id
            order.sort_by(|&a, &b| p[r * e + b].total_cmp(&p[r * e + a]).then(a.cmp(&b)));
            let want: Vec<i32> = order[..k].iter().map(|&i| i as i32).collect();
            prop_assert_eq!(&ids[r * k..(r + 1) * k], &want[..]);
        }
        let (plan, w) = OneStep::new(Op::GatherRenorm, Attrs::GatherRenorm { renorm, scale })
            .input(DType::F32, vec![Dim::Tokens, fx(e)])
            .input(DType::I32, vec![Dim::Tokens, fx(k)])
            .output(DType::F32, vec![Dim::Tokens, fx(k)], None);
        let got = as_f32(&exec(&plan, &w, &[f32s(&p), i32s(&ids)], t, 1, 2)[2]);
        let (mut want, mut bound) = (vec![], vec![]);
        for r in 0..t {
            let picked: Vec<f64> = ids[r * k..(r + 1) * k].iter().map(|&i| p[r * e + i as usize] as f64).collect();
            let sum: f64 = picked.iter().sum();
            for v in picked {
                let y = if renorm { v / sum } else { v } * scale as f64;
                want.push(y);
                bound.push((k as f64 + 2.0) * U * y.abs() + 1e-30);
            }
        }
        check("gather_renorm", &got, &want, &bound);
    }

    #[test]
    fn moe_ffn_matches_f64(d4 in 1usize..5, n_ff in odd(), n_expert in 1usize..6, k in 1usize..4, t in 1usize..4,
                           fused in any::<bool>(), quant in any::<bool>(), xs in vals(4 * 16),
                           ws in vals(3 * 16 * 70 * 5), ids_seed in prop::collection::vec(any::<u32>(), 12),
                           rw in prop::collection::vec(0.05f32..1.0, 12), copy_mask in any::<u8>()) {
        let d = 4 * d4;
        let n_ff = if quant { n_ff.div_ceil(4) * 4 } else { n_ff };
        let k = k.min(n_expert);
        let h = &xs[..t * d];
        let ids: Vec<i32> = ids_seed[..t * k].iter().map(|&v| (v as usize % n_expert) as i32).collect();
        let wts = &rw[..t * k];
        let mk = |ne: Vec<usize>, off: usize| make_tensor(ne, quant, &ws[off..]);
        // Down rows have n_ff elements: TQ8 needs n_ff % 4 == 0, which holds when quant.
        let down = mk(vec![n_ff, d, n_expert], 11);
        let layout = if fused { ExpertLayout::FusedGateUp } else { ExpertLayout::SplitGateUp };
        let mut b = OneStep::new(Op::MoeFfn, Attrs::Moe { layer: 0, n_ff, layout })
            .input(DType::F32, vec![Dim::Tokens, fx(d)])
            .input(DType::I32, vec![Dim::Tokens, fx(k)])
            .input(DType::F32, vec![Dim::Tokens, fx(k)]);
        // gate(e, f) and up(e, f) as f64 rows of d.
        let (gate_rows, up_rows): (Vec<Vec<f64>>, Vec<Vec<f64>>);
        if fused {
            let gu = mk(vec![d, 2 * n_ff, n_expert], 0);
            gate_rows = (0..n_expert * n_ff).map(|i| { let (e, f) = (i / n_ff, i % n_ff); gu.vals[(e * 2 * n_ff + f) * d..][..d].to_vec() }).collect();
            up_rows = (0..n_expert * n_ff).map(|i| { let (e, f) = (i / n_ff, i % n_ff); gu.vals[(e * 2 * n_ff + n_ff + f) * d..][..d].to_vec() }).collect();
            b = b.weight(gu);
        } else {
            let g = mk(vec![d, n_ff, n_expert], 0);
            let u = mk(vec![d, n_ff, n_expert], 5);
            gate_rows = g.vals.chunks(d).map(|c| c.to_vec()).collect();
            up_rows = u.vals.chunks(d).map(|c| c.to_vec()).collect();
            b = b.weight(g).weight(u);
        }
        let (plan, wt) = b.weight(down.clone()).output(DType::F32, vec![Dim::Tokens, fx(d)], None);
        let inputs = [f32s(h), i32s(&ids), f32s(wts)];
        let bufs = exec(&plan, &wt, &inputs, t, 1, 3);
        let got = as_f32(&bufs[3]);
        // The experts picked by `copy_mask` are read from private copies of their bytes (a fast
        // store), the others from the stacked tensor: the bits must not change.
        let copies: Vec<Vec<Vec<u8>>> = wt
            .iter()
            .map(|w| w.bytes.chunks(w.bytes.len() / n_expert).map(<[u8]>::to_vec).collect())
            .collect();
        let placed = exec_placed(&plan, &wt, &inputs, t, 1, 2, &|w, e, bytes| {
            if copy_mask >> e & 1 == 1 { copies[w][e].as_ptr() } else { wt[w].bytes[e * bytes..].as_ptr() }
        });
        prop_assert_eq!(&placed[3], &bufs[3]);
        // Tables rotated by one expert read expert e + 1 for id e: the same as ids + 1.
        let rot = |e: usize| (e + 1) % n_expert;
        let rotated = exec_placed(&plan, &wt, &inputs, t, 1, 2, &|w, e, bytes| wt[w].bytes[rot(e) * bytes..].as_ptr());
        let ids_rot: Vec<i32> = ids.iter().map(|&e| rot(e as usize) as i32).collect();
        let shifted = exec(&plan, &wt, &[f32s(h), i32s(&ids_rot), f32s(wts)], t, 1, 2);
        prop_assert_eq!(&rotated[3], &shifted[3]);
        let n_tables = if fused { 2 } else { 3 };
        prop_assert_eq!(prog_tables(&plan), (0..n_tables).map(|i| (3 + i, n_expert)).collect::<Vec<_>>());
        let (mut want, mut bound) = (vec![], vec![]);
        let gamma_f = (n_ff as f64 + 6.0) * U;
        for ti in 0..t {
            let hx = &h[ti * d..(ti + 1) * d];
            // per slot: act_f and an error bound on it
            let mut acts = vec![];
            for j in 0..k {
                let e = ids[ti * k + j] as usize;
                let mut a = vec![];
                for f in 0..n_ff {
                    let (g, gb) = dot_ref(&gate_rows[e * n_ff + f], hx, 6.0);
                    let (u, ub) = dot_ref(&up_rows[e * n_ff + f], hx, 6.0);
                    let sg = g / (1.0 + (-g).exp());
                    // |silu'| ≤ 1.1; silu 4u; product 1u.
                    let err = 1.1 * gb * u.abs() + sg.abs() * ub + 5.0 * U * (sg * u).abs();
                    a.push((sg * u, err));
                }
                acts.push((e, wts[ti * k + j] as f64, a));
            }
            for o in 0..d {
                let (mut y, mut err, mut mag) = (0.0, 0.0, 0.0);
                for (e, w, a) in &acts {
                    let row = &down.vals[(e * d + o) * n_ff..][..n_ff];
                    let dot: f64 = row.iter().zip(a).map(|(r, (v, _))| r * v).sum();
                    let dmag: f64 = row.iter().zip(a).map(|(r, (v, _))| (r * v).abs()).sum();
                    let prop: f64 = row.iter().zip(a).map(|(r, (_, ev))| r.abs() * ev).sum();
                    y += w * dot;
                    err += w.abs() * (prop + gamma_f * dmag);
                    mag += (w * dot).abs();
                }
                want.push(y);
                // second-order terms covered by the factor 2, stated before running.
                bound.push(2.0 * (err + (k as f64 + 1.0) * U * mag) + 1e-30);
            }
        }
        check("moe_ffn", &got, &want, &bound);
    }
}

// ---------------------------------------------------------------- bit-level properties

/// The documented reduction order of the oracle's dot (and of `aubier_runtime::gguf::quant`).
fn dot8(w: &[f32], x: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    for i in 0..w.len() {
        acc[i % 8] += w[i] * x[i];
    }
    ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))
}

proptest! {
    #![proptest_config(cfg())]

    #[test]
    fn f32_mat_mul_follows_the_documented_reduction_order(n_in in odd(), n_out in 1usize..5, xs in vals(70), ws in vals(70 * 5)) {
        let w = Tensor::f32(vec![n_in, n_out], &ws[..n_in * n_out]);
        let x = &xs[..n_in];
        let (plan, wt) = OneStep::new(Op::MatMul, Attrs::None)
            .weight(w)
            .input(DType::F32, vec![Dim::Tokens, fx(n_in)])
            .output(DType::F32, vec![Dim::Tokens, fx(n_out)], None);
        let got = as_f32(&exec(&plan, &wt, &[f32s(x)], 1, 1, 1)[1]);
        for o in 0..n_out {
            prop_assert_eq!(got[o].to_bits(), dot8(&ws[o * n_in..(o + 1) * n_in], x).to_bits());
        }
    }

    #[test]
    fn results_do_not_depend_on_the_work_split(chunks in 2usize..13, t in 1usize..4, xs in vals(3 * 24), ws in vals(24 * 2 * 6 * 3)) {
        let (d, n_ff, n_expert, k) = (8usize, 6usize, 3usize, 2usize);
        let gu = Tensor::f32(vec![d, 2 * n_ff, n_expert], &ws[..d * 2 * n_ff * n_expert]);
        let down = Tensor::f32(vec![n_ff, d, n_expert], &ws[..n_ff * d * n_expert]);
        let ids: Vec<i32> = (0..t * k).map(|i| (i % n_expert) as i32).collect();
        let wts: Vec<f32> = (0..t * k).map(|i| 0.3 + 0.1 * i as f32).collect();
        let (plan, wt) = OneStep::new(Op::MoeFfn, Attrs::Moe { layer: 0, n_ff, layout: ExpertLayout::FusedGateUp })
            .input(DType::F32, vec![Dim::Tokens, fx(d)])
            .input(DType::I32, vec![Dim::Tokens, fx(k)])
            .input(DType::F32, vec![Dim::Tokens, fx(k)])
            .weight(gu)
            .weight(down)
            .output(DType::F32, vec![Dim::Tokens, fx(d)], None);
        let inputs = [f32s(&xs[..t * d]), i32s(&ids), f32s(&wts)];
        let one = exec(&plan, &wt, &inputs, t, 1, 1);
        let many = exec(&plan, &wt, &inputs, t, 1, chunks);
        prop_assert_eq!(&one[3], &many[3]);
    }
}

#[test]
fn split_gate_up_equals_fused_bitwise() {
    let (d, n_ff, n_expert, t, k) = (8usize, 5usize, 3usize, 2usize, 2usize);
    let gate: Vec<f32> = (0..d * n_ff * n_expert)
        .map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.05)
        .collect();
    let up: Vec<f32> = (0..d * n_ff * n_expert)
        .map(|i| ((i * 17 % 29) as f32 - 14.0) * 0.04)
        .collect();
    let mut fused = Vec::new();
    for e in 0..n_expert {
        fused.extend_from_slice(&gate[e * n_ff * d..(e + 1) * n_ff * d]);
        fused.extend_from_slice(&up[e * n_ff * d..(e + 1) * n_ff * d]);
    }
    let down: Vec<f32> = (0..n_ff * d * n_expert)
        .map(|i| ((i * 13 % 19) as f32 - 9.0) * 0.03)
        .collect();
    let h: Vec<f32> = (0..t * d).map(|i| (i as f32 * 0.37).sin()).collect();
    let ids = [2, 0, 1, 2];
    let wts = [0.6f32, 0.4, 0.75, 0.25];
    let base = |layout| {
        OneStep::new(
            Op::MoeFfn,
            Attrs::Moe {
                layer: 0,
                n_ff,
                layout,
            },
        )
        .input(DType::F32, vec![Dim::Tokens, fx(d)])
        .input(DType::I32, vec![Dim::Tokens, fx(k)])
        .input(DType::F32, vec![Dim::Tokens, fx(k)])
    };
    let (pf, wf) = base(ExpertLayout::FusedGateUp)
        .weight(Tensor::f32(vec![d, 2 * n_ff, n_expert], &fused))
        .weight(Tensor::f32(vec![n_ff, d, n_expert], &down))
        .output(DType::F32, vec![Dim::Tokens, fx(d)], None);
    let (ps, wsplit) = base(ExpertLayout::SplitGateUp)
        .weight(Tensor::f32(vec![d, n_ff, n_expert], &gate))
        .weight(Tensor::f32(vec![d, n_ff, n_expert], &up))
        .weight(Tensor::f32(vec![n_ff, d, n_expert], &down))
        .output(DType::F32, vec![Dim::Tokens, fx(d)], None);
    let inputs = [f32s(&h), i32s(&ids), f32s(&wts)];
    assert_eq!(
        exec(&pf, &wf, &inputs, t, 1, 2)[3],
        exec(&ps, &wsplit, &inputs, t, 1, 3)[3]
    );
}

// ---------------------------------------------------------------- errors

#[test]
fn fused_ops_are_a_hard_error() {
    for op in [Op::Phase, Op::Wkb, Op::Kqkv] {
        let (plan, _) = OneStep::new(op, Attrs::None)
            .input(DType::F32, vec![Dim::Tokens, fx(4)])
            .output(DType::F32, vec![Dim::Tokens, fx(4)], None);
        match lower_err(&plan) {
            LowerError::FusedOp { step: 0, op: name } => assert_eq!(name, op.name()),
            e => panic!("{op:?}: expected FusedOp, got {e}"),
        }
    }
}

#[test]
fn mismatched_operands_are_rejected_with_the_step() {
    // mat_mul whose activation width differs from the weight's ne[0]
    let (plan, _) = OneStep::new(Op::MatMul, Attrs::None)
        .weight(Tensor::f32(vec![4, 3], &[0.0; 12]))
        .input(DType::F32, vec![Dim::Tokens, fx(5)])
        .output(DType::F32, vec![Dim::Tokens, fx(3)], None);
    let e = lower_err(&plan);
    assert!(
        matches!(
            e,
            LowerError::Invalid {
                step: 0,
                op: "mat_mul",
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("ne[0] = 4"), "{e}");

    // output too small for what the op writes
    let (plan, _) = OneStep::new(Op::Add, Attrs::None)
        .input(DType::F32, vec![Dim::Tokens, fx(5)])
        .input(DType::F32, vec![Dim::Tokens, fx(5)])
        .output(DType::F32, vec![Dim::Tokens, fx(4)], None);
    assert!(matches!(
        lower_err(&plan),
        LowerError::Invalid { op: "add", .. }
    ));

    // token ids of the wrong dtype
    let (plan, _) = OneStep::new(Op::Embed, Attrs::None)
        .weight(Tensor::f32(vec![4, 3], &[0.0; 12]))
        .input(DType::F32, vec![Dim::Tokens])
        .output(DType::F32, vec![Dim::Tokens, fx(4)], None);
    assert!(lower_err(&plan).to_string().contains("expected I32"));

    // wrong attributes
    let (plan, _) = OneStep::new(Op::RmsNorm, Attrs::None)
        .input(DType::F32, vec![Dim::Tokens, fx(4)])
        .weight(Tensor::f32(vec![4], &[1.0; 4]))
        .output(DType::F32, vec![Dim::Tokens, fx(4)], None);
    assert!(lower_err(&plan).to_string().contains("Eps"));

    // an output sharing an operand's slot
    let (mut plan, _) = OneStep::new(Op::Silu, Attrs::None)
        .input(DType::F32, vec![Dim::Tokens, fx(4)])
        .output(DType::F32, vec![Dim::Tokens, fx(4)], None);
    plan.values[1].storage = Storage::Slot(0);
    assert!(lower_err(&plan).to_string().contains("shares storage"));

    // cache_write whose output is not the cache of its layer
    let (plan, _) = OneStep::new(Op::CacheWrite, Attrs::CacheWrite { layer: 1 })
        .input(DType::F32, vec![Dim::Tokens, fx(4)])
        .input(DType::I32, vec![Dim::Tokens])
        .output(
            DType::F32,
            vec![Dim::Keys, fx(4)],
            Some(Storage::KvCache { layer: 0 }),
        );
    assert!(lower_err(&plan).to_string().contains("layer 1"));
}

#[test]
fn weights_without_host_kernels_are_rejected_by_name() {
    let mut t = Tensor::f32(vec![4, 2], &[0.0; 8]);
    t.ty = "Q2_K";
    let (plan, _) = OneStep::new(Op::MatMul, Attrs::None)
        .weight(t)
        .input(DType::F32, vec![Dim::Tokens, fx(4)])
        .output(DType::F32, vec![Dim::Tokens, fx(2)], None);
    let e = lower_err(&plan);
    assert!(
        matches!(&e, LowerError::Weight { name, .. } if name == "w0"),
        "{e}"
    );
    assert!(e.to_string().contains("Q2_K"));

    // a row that is not a whole number of blocks
    let (plan, _) = OneStep::new(Op::MatMul, Attrs::None)
        .weight(Tensor {
            ty: "TQ8",
            ne: vec![6, 1],
            bytes: vec![],
            vals: vec![],
        })
        .input(DType::F32, vec![Dim::Tokens, fx(6)])
        .output(DType::F32, vec![Dim::Tokens, fx(1)], None);
    assert!(lower_err(&plan).to_string().contains("not a whole number"));
}

// ---------------------------------------------------------------- YaRN frequencies

#[test]
fn yarn_frequencies_follow_model_md() {
    // MODEL.md §2.3 for the real model: dim 64, base 1e4, s = 128, L0 = 8192 → low 12, high 25.
    let p = YarnParams {
        n_rot: 64,
        freq_base: 10000.0,
        factor: 128.0,
        original_context: 8192,
        beta_fast: 32.0,
        beta_slow: 1.0,
        attn_factor: 1.0,
        log_multiplier: 0.1,
    };
    let theta = yarn_inv_freq(&p);
    assert_eq!(theta.len(), 32);
    for (i, &th) in theta.iter().enumerate() {
        let extra = 10000f64.powf(-(2.0 * i as f64) / 64.0);
        let ramp = ((i as f64 - 12.0) / 13.0).clamp(0.0, 1.0);
        let want = extra / 128.0 * ramp + extra * (1.0 - ramp);
        assert!(
            ((th as f64) - want).abs() <= 4.0 * U * want,
            "θ_{i} = {th}, want {want}"
        );
    }
    // pure extrapolation below `low`, pure interpolation from `high` on
    assert_eq!(theta[0], 1.0);
    assert!(
        (theta[31] as f64 - 10000f64.powf(-62.0 / 64.0) / 128.0).abs()
            <= 2.0 * U * theta[31] as f64
    );
    // factor 1: plain RoPE
    let plain = yarn_inv_freq(&YarnParams { factor: 1.0, ..p });
    for (i, &th) in plain.iter().enumerate() {
        let want = 10000f64.powf(-(2.0 * i as f64) / 64.0);
        assert!(((th as f64) - want).abs() <= 2.0 * U * want);
    }
}
