//! The a-priori error bound of every unfused step kind against the oracle, fixed before running
//! (ARCHITECTURE.md § numerics), with `u = 2⁻²⁴` and `A = 2⁻¹⁴⁶` ([`super::A`]). Both sides are
//! first-order bounds of two computations of the same formula in different orders; where the
//! two sides run the same IEEE operations in the same order the bound is 0 (bit-exact).
//!
//! - copies, `embed` (exact dequantization), `slice`, `concat`, `reshape`, `scale` and `mul` /
//!   `add` (one correctly rounded operation), `causal_mask`: exact.
//! - a dot of `n` terms in two orders (oracle: 8 lanes; GPU: `W` lanes × chunks + butterfly, or
//!   sequential): `2(n + 2)·u·Σ|w_i·x_i|` (Higham §3.1, each side) — `mat_mul`,
//!   `head_mat_mul`, `scores_qk` (`n` = the row width), `weighted_sum` (`n` = the keys).
//! - RoPE elements `x0·c − x1·s`: `c`, `s` from two `sin`/`cos` implementations (≤ 1 ulp each)
//!   and two roundings of each product and of the sum: `8u·(|x0| + |x1|)·|af|`.
//! - `attn_temperature` `x·f`, `f` from two `ln` implementations (each within 1 ulp): `4u·|ref|`.
//! - the executor's division and square root ([`Ops`]): the oracle's are correctly rounded
//!   (`u` relative); an executor whose division errs by `(1 + δ)·u` and whose root by
//!   `(1 + ρ)·u` (δ = [`Ops::div_excess`], ρ = [`Ops::sqrt_excess`]; 0 and 0 on the CPU, 4 and 8
//!   under Vulkan's 2.5 ulp division and `sqrt` inherited from `1/inversesqrt`, 2 + 2.5 ulp)
//!   adds `δ·u` per division and `ρ·u` per root to its side, scaled by how the error propagates:
//!   - SiLU `a / (1 + e^(−a))`: two `exp` implementations and the roundings, `8u`, plus `δ·u`;
//!   - softmax `e_i / Σ e`: the sum of `n` exponentials in two orders, `exp` within 2 ulps each
//!     side, `(2n + 16)·u`, plus `δ·u`;
//!   - RMSNorm `(x · 1/√(Σx²/n + ε)) · w` ([`rms_norm_rel`]): per side `Σx²` errs by `n·u`
//!     relative (`n − 1` adds, the squares), `/n` by `(1 + δ)·u`, `+ ε` by `u`; the root halves
//!     that and adds `(1 + ρ)·u`, the reciprocal `(1 + δ)·u`, the two products `2u`:
//!     `((n + 2 + δ)/2 + 4 + ρ + δ)·u`; both sides: `(n + 10 + 1.5δ + ρ)·u·|ref|`;
//!   - `gather_renorm` `p / Σp · scale` (the sum in the same order): bit-exact when the division
//!     is correctly rounded on both sides; else the quotients differ by `(2 + δ)·u` relative and
//!     the products round once each: `(4 + δ)·u·|ref|`;
//!   - the routed-expert FFN ([`moe_bound`]).
//!
//! The cosine of a row must be ≥ `1 − 1e-5` where the bound is not 0 (1e-6 for the element-wise
//! SiLU and RoPE), 1 where it is.

use super::case::{Ops, StepIn};
use super::{as_f32, A, U};
use aubier_compiler::config::ExpertLayout;
use aubier_compiler::ops::Op;
use aubier_compiler::plan::{Operand, Storage};
use aubier_compiler::types::{Attrs, Dim};

/// The bound of one step's output: per element, the row length of the cosine check and its
/// tolerance.
pub struct Bound {
    /// `|got − ref|` allowed, per element.
    pub per_element: Vec<f64>,
    /// Elements per row of the cosine check.
    pub row: usize,
    /// The cosine of each finite, nonzero row must be ≥ `1 − cos_tol`.
    pub cos_tol: f64,
}

/// `2(n + 2)·u·Σ|w·x| + A`: a dot of `n = w.len()` terms in two orders.
pub fn dot_bound(w: &[f32], x: &[f32]) -> f64 {
    let s: f64 = w
        .iter()
        .zip(x)
        .map(|(a, b)| (*a as f64 * *b as f64).abs())
        .sum();
    2.0 * (w.len() as f64 + 2.0) * U * s + A
}

/// Dot bounds of `y[r, c] = a[c, :]·b[r, :]` (rows of `w` in both), `cols` columns a row of `y`:
/// a mat-vec (`a` the weight), the scores `q·K_j` (`a` the keys).
fn row_dots(a: &[f32], b: &[f32], w: usize, cols: usize) -> Vec<f64> {
    (0..b.len() / w * cols)
        .map(|e| {
            let (r, c) = (e / cols, e % cols);
            dot_bound(&a[c * w..(c + 1) * w], &b[r * w..(r + 1) * w])
        })
        .collect()
}

/// Bound of one RoPE output element from its pair `(x0, x1)` and the attention factor.
pub fn rope_bound(x0: f32, x1: f32, af: f32) -> f64 {
    8.0 * U * (x0.abs() as f64 + x1.abs() as f64) * af.abs() as f64 + A
}

/// The relative bound (times `|ref|`) of an RMSNorm over rows of `n` on an executor with `ops`
/// against the oracle (the module note).
pub fn rms_norm_rel(n: usize, ops: Ops) -> f64 {
    (n as f64 + 10.0 + 1.5 * ops.div_excess() + ops.sqrt_excess()) * U
}

/// Dot bounds of a per-head product `y[t, h, o] = W[h][o]·x[t, h, :n_in]` (`W` dequantized, ne
/// `{n_in, n_out, heads}`; rows of `x` hold `xw ≥ n_in` elements), in `y`'s order.
pub fn head_bounds(
    wv: &[f32],
    x: &[f32],
    heads: usize,
    n_in: usize,
    n_out: usize,
    xw: usize,
) -> Vec<f64> {
    let rows = x.len() / (heads * xw);
    let mut b = Vec::with_capacity(rows * heads * n_out);
    for r in 0..rows {
        for h in 0..heads {
            let xs = &x[(r * heads + h) * xw..(r * heads + h) * xw + n_in];
            for o in 0..n_out {
                b.push(dot_bound(
                    &wv[(h * n_out + o) * n_in..(h * n_out + o + 1) * n_in],
                    xs,
                ));
            }
        }
    }
    b
}

/// The routed-expert FFN `y[t] = Σ_j w_j · down_e · (silu(gate_e·h) ⊙ up_e·h)` (`e = ids[t, j]`):
/// `act = silu(g)·u` with `g`, `u` dots of `d` terms (bounds `bg`, `bu`); SiLU's derivative is
/// ≤ 1.1 in magnitude, so `|Δact| ≤ 1.1·bg·|u| + |silu(g)|·bu + (8 + δ)·u·|act|`; the down dot of
/// `n_ff` terms adds `2(n_ff + 2)·u·Σ|down·act|` and `Σ_f |down_f|·|Δact_f|`, weighted by `w`,
/// and the weighted accumulation over the `k` experts `4u·w·Σ|down·act|`.
#[allow(clippy::too_many_arguments)]
pub fn moe_bound(
    ops: Ops,
    h: &[f32],
    ids: &[i32],
    wts: &[f32],
    gate: &[f32],
    up: Option<&[f32]>,
    down: &[f32],
    (d, n_ff, k): (usize, usize, usize),
) -> Vec<f64> {
    let t = h.len() / d;
    let mut bound = vec![0f64; t * d];
    for ti in 0..t {
        let hr = &h[ti * d..(ti + 1) * d];
        for j in 0..k {
            let (e, wj) = (ids[ti * k + j] as usize, wts[ti * k + j] as f64);
            let mut a = vec![0f64; n_ff];
            let mut da = vec![0f64; n_ff];
            for f in 0..n_ff {
                let (gr, ur) = match up {
                    None => {
                        let g0 = (e * 2 * n_ff + f) * d;
                        let u0 = (e * 2 * n_ff + n_ff + f) * d;
                        (&gate[g0..g0 + d], &gate[u0..u0 + d])
                    }
                    Some(up) => {
                        let r0 = (e * n_ff + f) * d;
                        (&gate[r0..r0 + d], &up[r0..r0 + d])
                    }
                };
                let gv: f64 = gr.iter().zip(hr).map(|(x, y)| *x as f64 * *y as f64).sum();
                let uv: f64 = ur.iter().zip(hr).map(|(x, y)| *x as f64 * *y as f64).sum();
                let sg = gv / (1.0 + (-gv).exp());
                a[f] = sg * uv;
                da[f] = 1.1 * dot_bound(gr, hr) * uv.abs()
                    + sg.abs() * dot_bound(ur, hr)
                    + (8.0 + ops.div_excess()) * U * a[f].abs()
                    + A;
            }
            for o in 0..d {
                let dr = &down[(e * d + o) * n_ff..(e * d + o + 1) * n_ff];
                let mag: f64 = dr.iter().zip(&a).map(|(x, y)| (*x as f64 * y).abs()).sum();
                let prop: f64 = dr.iter().zip(&da).map(|(x, y)| (*x as f64).abs() * y).sum();
                bound[ti * d + o] +=
                    wj * (2.0 * (n_ff as f64 + 2.0) * U * mag + prop) + 4.0 * U * wj * mag + A;
            }
        }
    }
    bound
}

/// The bound of step `at` run on an executor with `ops`, from the oracle's values of its
/// operands (the module note). Panics for a fused step (their cases hold their own bounds) and
/// for `cache_write` / `top_k` (compared exactly by `check_step`).
pub fn step_bound(ops: Ops, at: StepIn<'_>) -> Bound {
    let (pb, i, vals, cache, t, s) = (at.pb, at.i, at.vals, at.cache, at.t, at.s);
    let plan = pb.plan();
    let step = &plan.steps[i];
    let operand = |j: usize| -> Vec<f32> {
        match step.args[j] {
            Operand::Value(v) => match plan.values[v].storage {
                Storage::KvCache { .. } => cache.to_vec(),
                Storage::Slot(_) => as_f32(&vals[v]),
            },
            Operand::Weight(w) => pb.weights[w].values(),
        }
    };
    let ne = |j: usize| match step.args[j] {
        Operand::Weight(w) => pb.weights[w].ne.clone(),
        Operand::Value(_) => panic!("operand {j} of step {i} is not a weight"),
    };
    let want = as_f32(&vals[step.out]);
    let row = match plan.values[step.out].shape.0.last() {
        Some(Dim::Fixed(n)) => *n,
        Some(Dim::Keys) => s,
        _ => 1,
    };
    let rel = |r: f64| -> Vec<f64> { want.iter().map(|w| r * (*w as f64).abs() + A).collect() };
    let exact = || Bound {
        per_element: vec![0.0; want.len()],
        row,
        cos_tol: 0.0,
    };
    let loose = |per_element: Vec<f64>, cos_tol: f64| Bound {
        per_element,
        row,
        cos_tol,
    };
    match (step.op, &step.attrs) {
        (
            Op::Embed
            | Op::Slice
            | Op::Concat
            | Op::Reshape
            | Op::Scale
            | Op::Add
            | Op::Mul
            | Op::CausalMask,
            _,
        ) => exact(),
        (Op::MatMul, _) => loose(row_dots(&operand(0), &operand(1), ne(0)[0], row), 1e-5),
        (Op::HeadMatMul, _) => {
            let ne = ne(0);
            loose(
                head_bounds(&operand(0), &operand(1), ne[2], ne[0], ne[1], ne[0]),
                1e-5,
            )
        }
        (Op::ScoresQk, _) => {
            let k = operand(1);
            loose(row_dots(&k, &operand(0), k.len() / s, s), 1e-5)
        }
        (Op::WeightedSum, _) => {
            let (p, v) = (operand(0), operand(1));
            let w = v.len() / s;
            let b = (0..want.len())
                .map(|e| {
                    let (r, c) = (e / row, e % row);
                    let col: Vec<f32> = (0..s).map(|j| v[j * w + c]).collect();
                    dot_bound(&p[r * s..(r + 1) * s], &col)
                })
                .collect();
            loose(b, 1e-5)
        }
        (Op::RmsNorm, _) => loose(rel(rms_norm_rel(row, ops)), 1e-5),
        (Op::Softmax, _) => loose(rel((2.0 * row as f64 + 16.0 + ops.div_excess()) * U), 1e-5),
        (Op::Silu, _) => loose(rel((8.0 + ops.div_excess()) * U), 1e-6),
        (Op::AttnTemperature, _) => loose(rel(4.0 * U), 1e-5),
        (Op::RopeYarn, Attrs::Rope(p)) => {
            let x = operand(0);
            let b = (0..want.len())
                .map(|e| {
                    if e % row < p.n_rot {
                        let q = e - e % row + e % row / 2 * 2;
                        rope_bound(x[q], x[q + 1], p.attn_factor)
                    } else {
                        0.0
                    }
                })
                .collect();
            loose(b, 1e-6)
        }
        (Op::GatherRenorm, Attrs::GatherRenorm { renorm, .. }) => {
            if !renorm || ops.exact_div() {
                exact()
            } else {
                loose(rel((4.0 + ops.div_excess()) * U), 1e-6)
            }
        }
        (Op::MoeFfn, Attrs::Moe { n_ff, layout, .. }) => {
            let ids: Vec<i32> = match step.args[1] {
                Operand::Value(v) => vals[v].iter().map(|&b| b as i32).collect(),
                Operand::Weight(_) => panic!("moe ids must be a value"),
            };
            let k = ids.len() / t;
            let (up, down) = match layout {
                ExpertLayout::FusedGateUp => (None, operand(4)),
                ExpertLayout::SplitGateUp => (Some(operand(4)), operand(5)),
            };
            let b = moe_bound(
                ops,
                &operand(0),
                &ids,
                &operand(2),
                &operand(3),
                up.as_deref(),
                &down,
                (row, *n_ff, k),
            );
            loose(b, 1e-5)
        }
        (op, _) => panic!("step {i} ({}): no generic bound", op.name()),
    }
}
