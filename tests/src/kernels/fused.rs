//! Cases of the fused GPU kernels (PHASE, WKB in/out, KQKV split + merge). Each case builds the
//! *unfused* ops of the model description (`slice`, `rope_yarn`, `concat`, `attn_temperature`,
//! `rms_norm`, `cache_write`, `head_mat_mul`, `scores_qk`, `scale`, `causal_mask`, `softmax`,
//! `weighted_sum`) as a plan for the oracle, checks every one of those steps' own kernels one at
//! a time against it ([`check_steps`]: the fusion-off plans' kernels), then runs the fused step
//! (a one-step plan of `phase` / `wkb` / `kqkv`, through `for_step` and `launches`) and holds
//! it to the oracle's result of the whole chain. Shapes are random (heads 1..64, odd widths,
//! keys from 1 to 262 144 — the long ones in one dedicated case), values random with ±0,
//! subnormals and large magnitudes.
//!
//! Bounds of the fused kernels (those of the unfused steps are [`super::bounds`]'), with
//! `u = 2⁻²⁴`, `A = 2⁻¹⁴⁶`, δ = the executor's [`Ops::div_excess`]:
//! - PHASE: the query part is RoPE and the temperature `x·f` (`f` from two `ln`
//!   implementations, each within 1 ulp: `4u·|ref|`; RoPE times `f`); the cache rows RMSNorm
//!   ([`rms_norm_rel`]) and RoPE;
//! - WKB: per-head dots of `n_in` terms, `2(n + 2)·u·Σ|w·x|`; the tail is copied;
//! - KQKV output column `c`: scores `s_j` are dots of `W` terms, so each errs by
//!   `E_j ≤ 2(W + 2)·u·kq·Σ|q·K_j|`; a softmax weight then moves by a factor `≤ e^(2E) − 1`
//!   (`E = max E_j`, numerator and denominator) and the two sums over `S` keys err by
//!   `2(S + 16)·u` relative to `Σ p_j·|K_jc|` (exp within 2 ulps, the rescalings, the division),
//!   plus `δ·u` for the merge's division: `|Δo_c| ≤ (2(e^(2E) − 1) + (2(S + 16) + δ)·u)·Σ_j
//!   p_j·|K_jc| + A`. Because the oracle's own sums are sequential over `S` keys, this is loose
//!   for long windows, so KQKV is also checked against the exact (f64) value with the GPU's error
//!   alone: its sums have depth `d = 128 + 2·8 + ceil(S/1024)` (tile, tile rescales, merge), so
//!   `|Δo_c| ≤ (2(e^(E) − 1) + (2(d + 16) + δ)·u)·Σ_j p_j·|K_jc| + u·|o_c| + A`.
//!
//! Per row (a head's vector, a cache row) the cosine similarity must be ≥ 1 − 1e-5 when the row
//! is finite and nonzero; NaN and ±∞ positions must match exactly.

use super::bounds::{head_bounds, rms_norm_rel, rope_bound};
use super::exec::{check_steps, one_step, run_step, warps, width, Exec};
use super::{as_f32, check, draw, f32s, fx, i32s, rng, v, yarn, PlanB, A, U, W};
use aubier_compiler::config::QueryTemperature;
use aubier_compiler::ops::Op;
use aubier_compiler::types::{Attrs, DType, Dim};
use aubier_kernels_gen::gpu::kernels::{KQKV_SPLIT, KQKV_TILE};
use proptest::prelude::*;

/// Heads: mostly few, sometimes up to 64, and 64 itself.
fn heads() -> impl Strategy<Value = usize> {
    prop_oneof![4 => 1usize..5, 1 => 5usize..65, 1 => Just(64usize)]
}

/// One PHASE case: shape, positions `start..start + t`, flags and seed.
#[derive(Clone, Copy, Debug)]
pub struct PhaseCase {
    pub heads: usize,
    pub nope: usize,
    pub kv_lora: usize,
    pub rope_dim: usize,
    pub t: usize,
    pub start: usize,
    pub temp: bool,
    pub yarn_on: bool,
    pub seed: u64,
    pub warp: u32,
}

/// Odd shapes, positions up to 40 000, with and without temperature and YaRN.
pub fn phase_cases(x: &dyn Exec) -> impl Strategy<Value = PhaseCase> {
    (
        (heads(), 1usize..10, 1usize..40, 1usize..9, 1usize..4),
        (0usize..40000, any::<bool>(), any::<bool>(), any::<u64>()),
        warps(x),
    )
        .prop_map(
            |((heads, nope, kv_lora, half, t), (start, temp, yarn_on, seed), warp)| PhaseCase {
                heads,
                nope,
                kv_lora,
                rope_dim: 2 * half,
                t,
                start,
                temp,
                yarn_on,
                seed,
                warp,
            },
        )
}

/// The real model's PHASE shape (H = 32, N = R = 64, C = 256) with YaRN and temperature, at the
/// executor's first width (8 lanes on the CPU: 32 partials in RMSNorm's block reduction, two
/// shared-memory rounds).
pub fn phase_real_shape(x: &dyn Exec) -> PhaseCase {
    PhaseCase {
        heads: 32,
        nope: 64,
        kv_lora: 256,
        rope_dim: 64,
        t: 2,
        start: 9000,
        temp: true,
        yarn_on: true,
        seed: 7,
        warp: width(x, 0),
    }
}

/// PHASE against `slice`, `rope_yarn`, `concat`, `attn_temperature`, `rms_norm`,
/// `cache_write`.
pub fn phase(x: &dyn Exec, case: PhaseCase) {
    let PhaseCase {
        heads,
        nope,
        kv_lora,
        rope_dim,
        t,
        start,
        temp,
        yarn_on,
        seed,
        warp,
    } = case;
    let (n, c, r) = (nope, kv_lora, rope_dim);
    let s = start + t;
    let mut g = rng(seed);
    let q = draw(&mut g, t * heads * (n + r), 2.0, 100);
    let kv = draw(&mut g, t * (c + r), 2.0, 100);
    let wn: Vec<f32> = draw(&mut g, c, 1.5, 0);
    let pos: Vec<i32> = (0..t).map(|i| (start + i) as i32).collect();
    let rope = yarn(r, yarn_on);
    let temperature = temp.then_some(QueryTemperature {
        scale: 0.1,
        length: 3,
    });
    let th = |k| vec![Dim::Tokens, fx(heads), fx(k)];
    let tk = |k| vec![Dim::Tokens, fx(k)];

    // Oracle: the unfused ops of the model description.
    let mut pb = PlanB::default();
    let qv = pb.value(DType::F32, th(n + r), false);
    let kvv = pb.value(DType::F32, tk(c + r), false);
    let pv = pb.value(DType::I32, vec![Dim::Tokens], false);
    let w = pb.weight(W::f32(vec![c], &wn));
    let q_nope = pb.slice(qv, 0, n, th(n));
    let q_pe = pb.slice(qv, n, r, th(r));
    let q_pe = pb.step(
        Op::RopeYarn,
        Attrs::Rope(rope.clone()),
        vec![v(q_pe), v(pv)],
        DType::F32,
        th(r),
    );
    let mut q2 = pb.step(
        Op::Concat,
        Attrs::None,
        vec![v(q_nope), v(q_pe)],
        DType::F32,
        th(n + r),
    );
    if let Some(qt) = &temperature {
        q2 = pb.step(
            Op::AttnTemperature,
            Attrs::Temperature(qt.clone()),
            vec![v(q2), v(pv)],
            DType::F32,
            th(n + r),
        );
    }
    let c_kv = pb.slice(kvv, 0, c, tk(c));
    let k_pe = pb.slice(kvv, c, r, tk(r));
    let cn = pb.step(
        Op::RmsNorm,
        Attrs::Eps(1e-5),
        vec![v(c_kv), w],
        DType::F32,
        tk(c),
    );
    let kr = pb.step(
        Op::RopeYarn,
        Attrs::Rope(rope.clone()),
        vec![v(k_pe), v(pv)],
        DType::F32,
        tk(r),
    );
    let kvc = pb.step(
        Op::Concat,
        Attrs::None,
        vec![v(cn), v(kr)],
        DType::F32,
        tk(c + r),
    );
    pb.step(
        Op::CacheWrite,
        Attrs::CacheWrite { layer: 0 },
        vec![v(kvc), v(pv)],
        DType::F32,
        vec![Dim::Keys, fx(c + r)],
    );
    let inputs = [(qv, f32s(&q)), (kvv, f32s(&kv)), (pv, i32s(&pos))];
    let mut cache_ref = vec![0f32; s * (c + r)];
    let bufs = check_steps(
        x,
        "phase's steps",
        &pb,
        &inputs,
        (t, s),
        &mut cache_ref,
        warp,
    );
    let q2_ref = as_f32(&bufs[q2]);

    // The fused step.
    let mut pf = PlanB::default();
    let fq = pf.value(DType::F32, th(n + r), false);
    let fkv = pf.value(DType::F32, tk(c + r), false);
    let fpos = pf.value(DType::I32, vec![Dim::Tokens], false);
    let fw = pf.weight(W::f32(vec![c], &wn));
    pf.step(
        Op::Phase,
        Attrs::Phase {
            layer: 0,
            rope: rope.clone(),
            temperature: temperature.clone(),
            eps: 1e-5,
            n_head: heads,
            nope: n,
            rope_dim: r,
            kv_lora: c,
        },
        vec![v(fq), v(fkv), fw, v(fpos)],
        DType::F32,
        th(n + r),
    );
    let fin = [(fq, f32s(&q)), (fkv, f32s(&kv)), (fpos, i32s(&pos))];
    let zero = vec![0f32; s * (c + r)];
    let vals = pf.buffers(&fin, t, s);
    let got = run_step(x, one_step(&pf, &vals, &zero, t, s), warp);
    let q2g = as_f32(&got.out);

    // Bounds.
    let f = |p: i32| match &temperature {
        Some(qt) => 1.0 + qt.scale as f64 * (1.0 + (p as usize / qt.length) as f64).ln(),
        None => 1.0,
    };
    let mut bq = vec![0f64; q.len()];
    for (ti, &p) in pos.iter().enumerate() {
        let fv = f(p);
        for h in 0..heads {
            let base = (ti * heads + h) * (n + r);
            for d in 0..n + r {
                let i = base + d;
                let rel = if temperature.is_some() {
                    4.0 * U * (q2_ref[i] as f64).abs()
                } else {
                    0.0
                };
                bq[i] = if d < n {
                    rel + if temperature.is_some() { A } else { 0.0 }
                } else {
                    let p = base + n + (d - n) / 2 * 2;
                    rope_bound(q[p], q[p + 1], rope.attn_factor) * fv + rel
                };
            }
        }
    }
    let what = format!("phase q2, warp {warp}");
    check(&what, &q2g, &q2_ref, &bq, n + r, 1e-5);
    let mut gc = Vec::new();
    let mut want = Vec::new();
    let mut bc = Vec::new();
    for (ti, &p) in pos.iter().enumerate() {
        let row = p as usize * (c + r);
        gc.extend_from_slice(&got.cache[row..row + c + r]);
        want.extend_from_slice(&cache_ref[row..row + c + r]);
        for d in 0..c + r {
            bc.push(if d < c {
                rms_norm_rel(c, x.ops()) * (cache_ref[row + d] as f64).abs() + A
            } else {
                let p = ti * (c + r) + c + (d - c) / 2 * 2;
                rope_bound(kv[p], kv[p + 1], rope.attn_factor)
            });
        }
    }
    let what = format!("phase cache rows, warp {warp}");
    check(&what, &gc, &want, &bc, c + r, 1e-5);
}

/// One WKB case: weight type, shape, tokens, seed and the magnitude of `x`.
#[derive(Clone, Copy, Debug)]
pub struct WkbCase {
    pub ty: &'static str,
    pub heads: usize,
    pub n_in: usize,
    pub n_out: usize,
    pub tail: usize,
    pub t: usize,
    pub seed: u64,
    pub scale: f32,
    pub warp: u32,
}

/// F32 weights of odd shapes, IN (a tail) and OUT, `x` of magnitude 2 or 1e12.
pub fn wkb_f32_cases(x: &dyn Exec) -> impl Strategy<Value = WkbCase> {
    (
        (heads(), 1usize..40, 1usize..40),
        (prop_oneof![Just(0usize), 1usize..9], 1usize..4),
        (any::<u64>(), any::<bool>(), warps(x)),
    )
        .prop_map(
            |((heads, n_in, n_out), (tail, t), (seed, big, warp))| WkbCase {
                ty: "F32",
                heads,
                n_in,
                n_out,
                tail,
                t,
                seed,
                scale: if big { 1e12 } else { 2.0 },
                warp,
            },
        )
}

/// 32-element-block types on 64-element rows, IN and OUT.
pub fn wkb_quant_cases(x: &dyn Exec) -> impl Strategy<Value = WkbCase> {
    (
        prop::sample::select(vec!["F16", "Q8_0", "Q4_0", "IQ4_NL"]),
        (1usize..6, 1usize..20),
        prop_oneof![Just(0usize), Just(8usize)],
        (1usize..3, any::<u64>(), warps(x)),
    )
        .prop_map(|(ty, (heads, n_out), tail, (t, seed, warp))| WkbCase {
            ty,
            heads,
            n_in: 64,
            n_out,
            tail,
            t,
            seed,
            scale: 2.0,
            warp,
        })
}

/// 256-element-block types, OUT.
pub fn wkb_out_kquant_cases(x: &dyn Exec) -> impl Strategy<Value = WkbCase> {
    (
        prop::sample::select(vec![
            "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ2_XXS", "IQ2_XS",
        ]),
        (1usize..4, 1usize..12),
        (1usize..3, any::<u64>(), warps(x)),
    )
        .prop_map(|(ty, (heads, n_out), (t, seed, warp))| WkbCase {
            ty,
            heads,
            n_in: 256,
            n_out,
            tail: 0,
            t,
            seed,
            scale: 2.0,
            warp,
        })
}

/// The real model's WKB shapes: IN 64 → 256 with the 64-wide tail (Q8_0, the executor's second
/// width), OUT 256 → 128 (Q2_K, its third).
pub fn wkb_real_shapes(x: &dyn Exec) -> [WkbCase; 2] {
    [
        WkbCase {
            ty: "Q8_0",
            heads: 32,
            n_in: 64,
            n_out: 256,
            tail: 64,
            t: 1,
            seed: 11,
            scale: 2.0,
            warp: width(x, 1),
        },
        WkbCase {
            ty: "Q2_K",
            heads: 32,
            n_in: 256,
            n_out: 128,
            tail: 0,
            t: 1,
            seed: 12,
            scale: 2.0,
            warp: width(x, 2),
        },
    ]
}

/// The bundled model's WKB shapes and type (4 heads, Q4_0): IN 32 → 64 with the 32-wide tail,
/// OUT 64 → 32, the executor's first width.
pub fn wkb_bundled_shapes(x: &dyn Exec) -> [WkbCase; 2] {
    let case = |n_in, n_out, tail, seed| WkbCase {
        ty: "Q4_0",
        heads: 4,
        n_in,
        n_out,
        tail,
        t: 2,
        seed,
        scale: 2.0,
        warp: width(x, 0),
    };
    [case(32, 64, 32, 13), case(64, 32, 0, 14)]
}

/// WKB: IN when `tail > 0` (x = [q_nope, q_pe], y = [W·q_nope, q_pe]: `slice`, `slice`,
/// `head_mat_mul`, `concat`), OUT when `tail = 0` (`head_mat_mul`).
pub fn wkb(x: &dyn Exec, case: WkbCase) {
    let WkbCase {
        ty,
        heads,
        n_in,
        n_out,
        tail,
        t,
        seed,
        scale,
        warp,
    } = case;
    let mut g = rng(seed);
    let xw = n_in + tail;
    let xs = draw(&mut g, t * heads * xw, scale, 100);
    let w = if ty == "F32" {
        W::f32(
            vec![n_in, n_out, heads],
            &draw(&mut g, n_in * n_out * heads, 1.0, 100),
        )
    } else {
        W::random(ty, vec![n_in, n_out, heads], seed, 0.5)
    };
    let wv = w.values();
    let th = |k| vec![Dim::Tokens, fx(heads), fx(k)];

    let mut pb = PlanB::default();
    let xv = pb.value(DType::F32, th(xw), false);
    let wo = pb.weight(w.clone());
    let out = if tail > 0 {
        let q_nope = pb.slice(xv, 0, n_in, th(n_in));
        let q_pe = pb.slice(xv, n_in, tail, th(tail));
        let ql = pb.step(
            Op::HeadMatMul,
            Attrs::None,
            vec![wo, v(q_nope)],
            DType::F32,
            th(n_out),
        );
        pb.step(
            Op::Concat,
            Attrs::None,
            vec![v(ql), v(q_pe)],
            DType::F32,
            th(n_out + tail),
        )
    } else {
        pb.step(
            Op::HeadMatMul,
            Attrs::None,
            vec![wo, v(xv)],
            DType::F32,
            th(n_out),
        )
    };
    let inputs = [(xv, f32s(&xs))];
    let bufs = check_steps(
        x,
        &format!("wkb {ty}'s steps"),
        &pb,
        &inputs,
        (t, 1),
        &mut [],
        warp,
    );
    let want = as_f32(&bufs[out]);

    let mut pf = PlanB::default();
    let fx_ = pf.value(DType::F32, th(xw), false);
    let fw = pf.weight(w);
    pf.step(
        Op::Wkb,
        Attrs::Wkb {
            n_head: heads,
            in_dim: n_in,
            out_dim: n_out,
            rope_tail: tail,
        },
        vec![v(fx_), fw],
        DType::F32,
        th(n_out + tail),
    );
    let vals = pf.buffers(&[(fx_, f32s(&xs))], t, 1);
    let y = as_f32(&run_step(x, one_step(&pf, &vals, &[], t, 1), warp).out);

    let dots = head_bounds(&wv, &xs, heads, n_in, n_out, xw);
    let bound: Vec<f64> = (0..y.len())
        .map(|i| {
            let (row, col) = (i / (n_out + tail), i % (n_out + tail));
            if col < n_out {
                dots[row * n_out + col]
            } else {
                0.0
            }
        })
        .collect();
    let what = format!("wkb {ty} warp {warp}");
    check(&what, &y, &want, &bound, n_out + tail, 1e-5);
}

/// One KQKV case: shape, `S` keys (positions `S − T..S`), seed, magnitude, a NaN query.
#[derive(Clone, Copy, Debug)]
pub struct KqkvCase {
    pub heads: usize,
    pub c: usize,
    pub r: usize,
    pub t: usize,
    pub s: usize,
    pub seed: u64,
    pub scale: f32,
    pub nan_head: bool,
    pub warp: u32,
}

/// Odd widths, keys in 1..40 or across one and two 1024-key splits, `heads·T·S ≤ 40 000`.
pub fn kqkv_cases(x: &dyn Exec) -> impl Strategy<Value = KqkvCase> {
    (
        (heads(), 1usize..24, 0usize..9, 1usize..4),
        prop_oneof![1usize..40, 1000usize..1100, 2040usize..2100],
        (any::<u64>(), prop_oneof![Just(1.0f32), Just(8.0f32)]),
        (prop::bool::weighted(0.1), warps(x)),
    )
        .prop_map(|((heads, c, r, t), s, (seed, scale), (nan_head, warp))| {
            let s = s.max(t);
            let heads = if heads * t * s > 40_000 {
                1 + 40_000 / (t * s)
            } else {
                heads
            };
            KqkvCase {
                heads,
                c,
                r,
                t,
                s,
                seed,
                scale,
                nan_head,
                warp,
            }
        })
}

/// The longest window: 262 144 keys, every key visible to the last position (the executor's
/// second width).
pub fn kqkv_longest_window(x: &dyn Exec) -> KqkvCase {
    KqkvCase {
        heads: 1,
        c: 4,
        r: 2,
        t: 1,
        s: 262_144,
        seed: 5,
        scale: 1.0,
        nan_head: false,
        warp: width(x, 1),
    }
}

/// One key (the first token of a sequence), at the executor's first width.
pub fn kqkv_single_key(x: &dyn Exec) -> KqkvCase {
    KqkvCase {
        heads: 3,
        c: 5,
        r: 2,
        t: 1,
        s: 1,
        seed: 9,
        scale: 1.0,
        nan_head: false,
        warp: width(x, 0),
    }
}

/// KQKV against `scores_qk → scale → causal_mask → softmax → weighted_sum`.
pub fn kqkv(x: &dyn Exec, case: KqkvCase) {
    let KqkvCase {
        heads,
        c,
        r,
        t,
        s,
        seed,
        scale,
        nan_head,
        warp,
    } = case;
    let w = c + r;
    let kq = 0.19;
    let mut g = rng(seed);
    // No large magnitudes here: a score of 1e30 makes the bound (through e^(2E)) infinite, and
    // the test would check nothing; ±0 and subnormals stay.
    let mut q = draw(&mut g, t * heads * w, scale, 96);
    if nan_head {
        q[0] = f32::NAN;
    }
    let cache = draw(&mut g, s * w, scale, 96);
    let pos: Vec<i32> = (0..t).map(|i| (s - t + i) as i32).collect();
    let thw = |k| vec![Dim::Tokens, fx(heads), fx(k)];

    let mut pb = PlanB::default();
    let qv = pb.value(DType::F32, thw(w), false);
    let kv = pb.value(DType::F32, vec![Dim::Keys, fx(w)], false);
    let pv = pb.value(DType::I32, vec![Dim::Tokens], false);
    let ths = vec![Dim::Tokens, fx(heads), Dim::Keys];
    let mut sc = pb.step(
        Op::ScoresQk,
        Attrs::None,
        vec![v(qv), v(kv)],
        DType::F32,
        ths.clone(),
    );
    for (op, attrs, extra) in [
        (Op::Scale, Attrs::Scale(kq), None),
        (Op::CausalMask, Attrs::None, Some(pv)),
        (Op::Softmax, Attrs::None, None),
    ] {
        let args = std::iter::once(sc).chain(extra).map(v).collect();
        sc = pb.step(op, attrs, args, DType::F32, ths.clone());
    }
    let o = pb.step(
        Op::WeightedSum,
        Attrs::WeightedSum { len: c },
        vec![v(sc), v(kv)],
        DType::F32,
        thw(c),
    );
    let inputs = [(qv, f32s(&q)), (kv, f32s(&cache)), (pv, i32s(&pos))];
    let bufs = check_steps(x, "kqkv's steps", &pb, &inputs, (t, s), &mut [], warp);
    let want = as_f32(&bufs[o]);

    let mut pf = PlanB::default();
    let fq = pf.value(DType::F32, thw(w), false);
    let fpos = pf.value(DType::I32, vec![Dim::Tokens], false);
    pf.step(
        Op::Kqkv,
        Attrs::Kqkv {
            layer: 0,
            n_head: heads,
            kv_lora: c,
            rope_dim: r,
            kq_scale: kq,
        },
        vec![v(fq), v(fpos)],
        DType::F32,
        thw(c),
    );
    let vals = pf.buffers(&[(fq, f32s(&q)), (fpos, i32s(&pos))], t, s);
    let got = as_f32(&run_step(x, one_step(&pf, &vals, &cache, t, s), warp).out);

    // f64 softmax weights: for the oracle comparison's bound, and for an exact reference.
    let div = x.ops().div_excess() * U;
    let ns = s.div_ceil(KQKV_SPLIT) as f64;
    let depth = (KQKV_TILE + 2 * (KQKV_SPLIT / KQKV_TILE)) as f64 + ns;
    let mut bound = Vec::with_capacity(got.len());
    let (mut exact, mut tight) = (Vec::with_capacity(got.len()), Vec::with_capacity(got.len()));
    for ti in 0..t {
        let last = pos[ti] as usize;
        for h in 0..heads {
            let qr = &q[(ti * heads + h) * w..(ti * heads + h + 1) * w];
            let mut sc = Vec::with_capacity(last + 1);
            let mut e_max = 0f64;
            for j in 0..=last {
                let kr = &cache[j * w..(j + 1) * w];
                let (mut d, mut a) = (0f64, 0f64);
                for (x, y) in qr.iter().zip(kr) {
                    d += *x as f64 * *y as f64;
                    a += (*x as f64 * *y as f64).abs();
                }
                sc.push(d * kq as f64);
                e_max = e_max.max(2.0 * (w as f64 + 2.0) * U * kq as f64 * a);
            }
            let m = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let ps: Vec<f64> = sc.iter().map(|x| (x - m).exp()).collect();
            let tot: f64 = ps.iter().sum();
            let rel = 2.0 * (2.0 * e_max).exp_m1() + 2.0 * (s as f64 + 16.0) * U + div;
            let rel_gpu = 2.0 * e_max.exp_m1() + 2.0 * (depth + 16.0) * U + div;
            for col in 0..c {
                let mag: f64 = (0..=last)
                    .map(|j| ps[j] / tot * (cache[j * w + col] as f64).abs())
                    .sum();
                let val: f64 = (0..=last)
                    .map(|j| ps[j] / tot * cache[j * w + col] as f64)
                    .sum();
                bound.push(rel * mag + A);
                tight.push(rel_gpu * mag + A);
                exact.push(if qr.iter().any(|x| x.is_nan()) {
                    f32::NAN
                } else {
                    val as f32
                });
            }
        }
    }
    check(
        &format!("kqkv vs oracle, warp {warp}"),
        &got,
        &want,
        &bound,
        c,
        1e-5,
    );
    // Against the exact value the GPU's own error is bounded by the depth of its summation tree
    // (a term passes ≤ 128 adds in its tile, ≤ 2 per tile rescale, ≤ ceil(S/1024) in the merge),
    // not by the oracle's sequential S-term sums; `val as f32` adds half an ulp, inside `A + 2u`.
    let tight: Vec<f64> = tight
        .iter()
        .zip(&exact)
        .map(|(b, e)| b + U * (*e as f64).abs())
        .collect();
    check(
        &format!("kqkv vs exact, warp {warp}"),
        &got,
        &exact,
        &tight,
        c,
        1e-5,
    );
}
