//! Property tests of the fused GPU kernels (PHASE, WKB in/out, KQKV split + merge) through their
//! CPU execution (`aubier_kernels_gen::gpu::cpu_exec`, the GPU's order of reduction), against the
//! CPU oracle running the equivalent *unfused* ops (`slice`, `rope_yarn`, `concat`,
//! `attn_temperature`, `rms_norm`, `cache_write`, `head_mat_mul`, `scores_qk`, `scale`,
//! `causal_mask`, `softmax`, `weighted_sum`). Shapes are random (heads 1..64, odd widths, keys
//! from 1 to 262 144 — the long ones in one dedicated case), values random with ±0, subnormals and
//! large magnitudes; shrinking is on. Each case builds its kernels for warps of 8, 32 or 64 lanes
//! (sampled; the fixed cases take one width each) and runs them at that width.
//!
//! Tolerances (ARCHITECTURE.md § numerics), fixed before running, with `u = 2⁻²⁴` and `A = 2⁻¹⁴⁶`
//! (eight subnormal ulps: products of subnormals round in absolute, not relative, terms):
//! - copies and `x·f` with the same `f`: exact; with a temperature factor `f` computed by two
//!   `ln` implementations (each within 1 ulp): `4u·|ref|` (two roundings of `x·f`, two of `f`);
//! - RoPE elements `x0·c − x1·s`: `c`, `s` from two `sin`/`cos` implementations (≤ 1 ulp each)
//!   and two roundings of each product and of the sum: `8u·(|x0| + |x1|)·|af|` (times `f`, plus
//!   `4u·|ref|`, when the query temperature applies);
//! - RMSNorm: the sum of the `C` squares in two orders errs by `≤ C·u·Σx²` each, so `1/√(mean+ε)`
//!   by `≤ (C/2 + 2)·u` relative each; with the two products: `(C + 8)·u·|ref|`;
//! - a dot of `n` terms in two orders (oracle: 8 lanes; GPU: `W` lanes × chunks + butterfly):
//!   `2(n + 2)·u·Σ|w_i·x_i|` (Higham §3.1, each side);
//! - KQKV output column `c`: scores `s_j` are dots of `W` terms, so each errs by
//!   `E_j ≤ 2(W + 2)·u·kq·Σ|q·K_j|`; a softmax weight then moves by a factor `≤ e^(2E) − 1`
//!   (`E = max E_j`, numerator and denominator) and the two sums over `S` keys err by
//!   `2(S + 16)·u` relative to `Σ p_j·|K_jc|` (exp within 2 ulps, the rescalings, the division):
//!   `|Δo_c| ≤ (2(e^(2E) − 1) + 2(S + 16)·u)·Σ_j p_j·|K_jc| + A`. Because the oracle's own sums are
//!   sequential over `S` keys, this is loose for long windows, so KQKV is also checked against the
//!   exact (f64) value with the GPU's error alone: its sums have depth `d = 128 + 2·8 + ceil(S/1024)`
//!   (tile, tile rescales, merge), so `|Δo_c| ≤ (2(e^(E) − 1) + 2(d + 16)·u)·Σ_j p_j·|K_jc| + u·|o_c| + A`.
//!
//! Per row (a head's vector, a cache row) the cosine similarity must be ≥ 1 − 1e-5 when the row is
//! finite and nonzero; NaN and ±∞ positions must match exactly.

#[path = "kernels_common.rs"]
mod common;

use aubier_compiler::config::{QueryTemperature, YarnParams};
use aubier_compiler::ops::Op;
use aubier_compiler::types::{Attrs, DType, Dim};
use aubier_kernels_gen::gpu::cpu_exec::Arg;
use aubier_kernels_gen::gpu::ir::Size;
use aubier_kernels_gen::gpu::kernels::{
    kqkv_merge, kqkv_scratch, kqkv_split, mat_vec, phase, KqkvShape, MatVecShape, PhaseShape,
    WeightSpec, KQKV_SPLIT, KQKV_TILE,
};
use common::*;
use proptest::prelude::*;
use rand::{Rng, SeedableRng};

const A: f64 = 8.0 * 1.401_298_464_324_817e-45;

fn rng(seed: u64) -> rand_chacha::ChaCha8Rng {
    rand_chacha::ChaCha8Rng::seed_from_u64(seed)
}

/// `n` values with the special classes of [`special`] at magnitude `scale`: none, all (`100`), or
/// all but the large magnitudes (`96`).
fn draw(r: &mut impl Rng, n: usize, scale: f32, classes: u8) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let class = if classes > 0 {
                r.random_range(0..classes)
            } else {
                0
            };
            special(r.random::<f32>(), class, scale)
        })
        .collect()
}

fn yarn(n_rot: usize, on: bool) -> YarnParams {
    YarnParams {
        n_rot,
        freq_base: 10000.0,
        factor: if on { 128.0 } else { 1.0 },
        original_context: 8192,
        beta_fast: 32.0,
        beta_slow: 1.0,
        attn_factor: 1.0,
        log_multiplier: 0.1,
    }
}

/// Bound of one RoPE output element from its pair.
fn rope_bound(x0: f32, x1: f32, af: f32) -> f64 {
    8.0 * U * (x0.abs() as f64 + x1.abs() as f64) * af.abs() as f64 + A
}

/// One PHASE case: shape, positions `start..start + t`, flags and seed.
#[derive(Clone, Copy, Debug)]
struct PhaseCase {
    heads: usize,
    nope: usize,
    kv_lora: usize,
    rope_dim: usize,
    t: usize,
    start: usize,
    temp: bool,
    yarn_on: bool,
    seed: u64,
    warp: u32,
}

fn run_phase(case: PhaseCase) {
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

    // Oracle: the unfused ops of the model description.
    let mut pb = PlanB::default();
    let qv = pb.value(DType::F32, vec![Dim::Tokens, fx(heads), fx(n + r)], false);
    let kvv = pb.value(DType::F32, vec![Dim::Tokens, fx(c + r)], false);
    let pv = pb.value(DType::I32, vec![Dim::Tokens], false);
    let w = pb.weight(W::f32(vec![c], &wn));
    let th = |k| vec![Dim::Tokens, fx(heads), fx(k)];
    let q_nope = pb.step(
        Op::Slice,
        Attrs::Slice { offset: 0, len: n },
        vec![v(qv)],
        DType::F32,
        th(n),
    );
    let q_pe = pb.step(
        Op::Slice,
        Attrs::Slice { offset: n, len: r },
        vec![v(qv)],
        DType::F32,
        th(r),
    );
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
    let tk = |k| vec![Dim::Tokens, fx(k)];
    let c_kv = pb.step(
        Op::Slice,
        Attrs::Slice { offset: 0, len: c },
        vec![v(kvv)],
        DType::F32,
        tk(c),
    );
    let k_pe = pb.step(
        Op::Slice,
        Attrs::Slice { offset: c, len: r },
        vec![v(kvv)],
        DType::F32,
        tk(r),
    );
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
    let mut cache_ref = vec![0f32; s * (c + r)];
    let bufs = run_oracle(
        &pb,
        &[(qv, f32s(&q)), (kvv, f32s(&kv)), (pv, i32s(&pos))],
        t,
        s,
        &mut cache_ref,
    );
    let q2_ref = as_f32(&bufs[q2]);

    // GPU kernel, CPU execution.
    let k = phase(
        &PhaseShape {
            name: "phase".into(),
            heads,
            nope: n,
            kv_lora: c,
            rope_dim: r,
            rope: rope.clone(),
            eps: 1e-5,
            temperature: temperature.clone(),
        },
        warp,
    )
    .expect("phase kernel");
    let wbytes: Vec<u8> = wn.iter().flat_map(|x| x.to_le_bytes()).collect();
    let (mut qa, mut kva, mut pa) = (q.clone(), kv.clone(), pos.clone());
    let mut cache = vec![0f32; s * (c + r)];
    let mut q2g = vec![0f32; q.len()];
    run_gpu(
        &k,
        &mut [
            Arg::F32(&mut qa),
            Arg::F32(&mut kva),
            Arg::Weight(&wbytes),
            Arg::I32(&mut pa),
            Arg::F32(&mut cache),
            Arg::F32(&mut q2g),
        ],
        t,
        s,
    );

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
    check("phase q2", &q2g, &q2_ref, &bq, n + r, 1e-5);
    let mut got = Vec::new();
    let mut want = Vec::new();
    let mut bc = Vec::new();
    for (ti, &p) in pos.iter().enumerate() {
        let row = p as usize * (c + r);
        got.extend_from_slice(&cache[row..row + c + r]);
        want.extend_from_slice(&cache_ref[row..row + c + r]);
        for d in 0..c + r {
            bc.push(if d < c {
                (c as f64 + 8.0) * U * (cache_ref[row + d] as f64).abs() + A
            } else {
                let p = ti * (c + r) + c + (d - c) / 2 * 2;
                rope_bound(kv[p], kv[p + 1], rope.attn_factor)
            });
        }
    }
    check("phase cache rows", &got, &want, &bc, c + r, 1e-5);
}

/// Dot-product bounds `2(n + 2)·u·Σ|w·x| + A` of a per-head product `y[t,h,o] = W[h][o]·x[t,h]`.
fn head_bounds(
    wv: &[f32],
    x: &[f32],
    t: usize,
    heads: usize,
    n_in: usize,
    n_out: usize,
    xw: usize,
) -> Vec<f64> {
    let mut b = Vec::with_capacity(t * heads * n_out);
    for ti in 0..t {
        for h in 0..heads {
            for o in 0..n_out {
                let row = &wv[(h * n_out + o) * n_in..(h * n_out + o + 1) * n_in];
                let xs = &x[(ti * heads + h) * xw..(ti * heads + h) * xw + n_in];
                let sum: f64 = row
                    .iter()
                    .zip(xs)
                    .map(|(a, b)| (*a as f64 * *b as f64).abs())
                    .sum();
                b.push(2.0 * (n_in as f64 + 2.0) * U * sum + A);
            }
        }
    }
    b
}

/// One WKB case: weight type, shape, tokens, seed and the magnitude of `x`.
#[derive(Clone, Copy, Debug)]
struct WkbCase {
    ty: &'static str,
    heads: usize,
    n_in: usize,
    n_out: usize,
    tail: usize,
    t: usize,
    seed: u64,
    scale: f32,
    warp: u32,
}

/// WKB: IN when `tail > 0` (x = [q_nope, q_pe], y = [W·q_nope, q_pe]), OUT when `tail = 0`.
fn run_wkb(case: WkbCase) {
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
    let x = draw(&mut g, t * heads * xw, scale, 100);
    let w = if ty == "F32" {
        W::f32(
            vec![n_in, n_out, heads],
            &draw(&mut g, n_in * n_out * heads, 1.0, 100),
        )
    } else {
        W::random(ty, vec![n_in, n_out, heads], seed, 0.5)
    };
    let wv = w.values();

    let mut pb = PlanB::default();
    let xv = pb.value(DType::F32, vec![Dim::Tokens, fx(heads), fx(xw)], false);
    let wo = pb.weight(w.clone());
    let th = |k| vec![Dim::Tokens, fx(heads), fx(k)];
    let out = if tail > 0 {
        let q_nope = pb.step(
            Op::Slice,
            Attrs::Slice {
                offset: 0,
                len: n_in,
            },
            vec![v(xv)],
            DType::F32,
            th(n_in),
        );
        let q_pe = pb.step(
            Op::Slice,
            Attrs::Slice {
                offset: n_in,
                len: tail,
            },
            vec![v(xv)],
            DType::F32,
            th(tail),
        );
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
    let bufs = run_oracle(&pb, &[(xv, f32s(&x))], t, 1, &mut []);
    let want = as_f32(&bufs[out]);

    let k = mat_vec(
        &MatVecShape {
            name: "wkb".into(),
            w: WeightSpec {
                ggml_type: ty.into(),
                row_len: n_in,
            },
            n_out,
            heads,
            tail,
            rows: Size::Tokens,
        },
        warp,
    )
    .expect("wkb kernel");
    let mut xa = x.clone();
    let mut y = vec![0f32; t * heads * (n_out + tail)];
    run_gpu(
        &k,
        &mut [Arg::Weight(&w.bytes), Arg::F32(&mut xa), Arg::F32(&mut y)],
        t,
        1,
    );

    let dots = head_bounds(&wv, &x, t, heads, n_in, n_out, xw);
    let mut bound = Vec::with_capacity(y.len());
    for (i, _) in y.iter().enumerate() {
        let (row, col) = (i / (n_out + tail), i % (n_out + tail));
        bound.push(if col < n_out {
            dots[row * n_out + col]
        } else {
            0.0
        });
    }
    check(
        &format!("wkb {ty} warp {warp}"),
        &y,
        &want,
        &bound,
        n_out + tail,
        1e-5,
    );
}

/// One KQKV case: shape, `S` keys (positions `S − T..S`), seed, magnitude, a NaN query.
#[derive(Clone, Copy, Debug)]
struct KqkvCase {
    heads: usize,
    c: usize,
    r: usize,
    t: usize,
    s: usize,
    seed: u64,
    scale: f32,
    nan_head: bool,
    warp: u32,
}

/// KQKV against `scores_qk → scale → causal_mask → softmax → weighted_sum`.
fn run_kqkv(case: KqkvCase) {
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

    let mut pb = PlanB::default();
    let qv = pb.value(DType::F32, vec![Dim::Tokens, fx(heads), fx(w)], false);
    let kv = pb.value(DType::F32, vec![Dim::Keys, fx(w)], false);
    let pv = pb.value(DType::I32, vec![Dim::Tokens], false);
    let ths = vec![Dim::Tokens, fx(heads), Dim::Keys];
    let sc = pb.step(
        Op::ScoresQk,
        Attrs::None,
        vec![v(qv), v(kv)],
        DType::F32,
        ths.clone(),
    );
    let sc = pb.step(
        Op::Scale,
        Attrs::Scale(kq),
        vec![v(sc)],
        DType::F32,
        ths.clone(),
    );
    let sc = pb.step(
        Op::CausalMask,
        Attrs::None,
        vec![v(sc), v(pv)],
        DType::F32,
        ths.clone(),
    );
    let p = pb.step(Op::Softmax, Attrs::None, vec![v(sc)], DType::F32, ths);
    let o = pb.step(
        Op::WeightedSum,
        Attrs::WeightedSum { len: c },
        vec![v(p), v(kv)],
        DType::F32,
        vec![Dim::Tokens, fx(heads), fx(c)],
    );
    let bufs = run_oracle(
        &pb,
        &[(qv, f32s(&q)), (kv, f32s(&cache)), (pv, i32s(&pos))],
        t,
        s,
        &mut [],
    );
    let want = as_f32(&bufs[o]);

    let shape = KqkvShape {
        name: "kqkv".into(),
        heads,
        width: w,
        kv_lora: c,
        kq_scale: kq,
    };
    let split = kqkv_split(&shape, warp).expect("split kernel");
    let merge = kqkv_merge(&shape, warp).expect("merge kernel");
    let mut part = vec![0f32; kqkv_scratch(&shape).eval(t, s).expect("scratch")];
    let (mut qa, mut pa, mut ca) = (q.clone(), pos.clone(), cache.clone());
    run_gpu(
        &split,
        &mut [
            Arg::F32(&mut qa),
            Arg::I32(&mut pa),
            Arg::F32(&mut ca),
            Arg::F32(&mut part),
        ],
        t,
        s,
    );
    let mut got = vec![0f32; t * heads * c];
    run_gpu(&merge, &mut [Arg::F32(&mut part), Arg::F32(&mut got)], t, s);

    // f64 softmax weights: for the oracle comparison's bound, and for an exact reference.
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
            let rel = 2.0 * (2.0 * e_max).exp_m1() + 2.0 * (s as f64 + 16.0) * U;
            let rel_gpu = 2.0 * e_max.exp_m1() + 2.0 * (depth + 16.0) * U;
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
    check("kqkv vs oracle", &got, &want, &bound, c, 1e-5);
    // Against the exact value the GPU's own error is bounded by the depth of its summation tree
    // (a term passes ≤ 128 adds in its tile, ≤ 2 per tile rescale, ≤ ceil(S/1024) in the merge),
    // not by the oracle's sequential S-term sums; `val as f32` adds half an ulp, inside `A + 2u`.
    let tight: Vec<f64> = tight
        .iter()
        .zip(&exact)
        .map(|(b, e)| b + U * (*e as f64).abs())
        .collect();
    check("kqkv vs exact", &got, &exact, &tight, c, 1e-5);
}

fn cfg(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        ..ProptestConfig::default()
    }
}

fn heads() -> impl Strategy<Value = usize> {
    prop_oneof![4 => 1usize..5, 1 => 5usize..65, 1 => Just(64usize)]
}

proptest! {
    #![proptest_config(cfg(64))]

    #[test]
    fn phase_matches_oracle(heads in heads(), nope in 1usize..10, kv_lora in 1usize..40,
                            half in 1usize..9, t in 1usize..4, start in 0usize..40000,
                            temp in any::<bool>(), yarn_on in any::<bool>(), seed in any::<u64>(),
                            warp in warps()) {
        run_phase(PhaseCase { heads, nope, kv_lora, rope_dim: 2 * half, t, start, temp, yarn_on, seed, warp });
    }

    #[test]
    fn wkb_f32_matches_oracle(heads in heads(), n_in in 1usize..40, n_out in 1usize..40,
                              tail in prop_oneof![Just(0usize), 1usize..9], t in 1usize..4,
                              seed in any::<u64>(), big in any::<bool>(), warp in warps()) {
        run_wkb(WkbCase { ty: "F32", heads, n_in, n_out, tail, t, seed, scale: if big { 1e12 } else { 2.0 }, warp });
    }
}

proptest! {
    #![proptest_config(cfg(32))]

    #[test]
    fn wkb_quant_matches_oracle(ty in prop::sample::select(vec!["F16", "Q8_0", "Q4_0", "IQ4_NL"]),
                                heads in 1usize..6, n_out in 1usize..20, tail in prop_oneof![Just(0usize), Just(8usize)],
                                t in 1usize..3, seed in any::<u64>(), warp in warps()) {
        run_wkb(WkbCase { ty, heads, n_in: 64, n_out, tail, t, seed, scale: 2.0, warp });
    }

    #[test]
    fn wkb_out_kquant_matches_oracle(ty in prop::sample::select(vec!["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ2_XXS", "IQ2_XS"]),
                                     heads in 1usize..4, n_out in 1usize..12, t in 1usize..3, seed in any::<u64>(),
                                     warp in warps()) {
        run_wkb(WkbCase { ty, heads, n_in: 256, n_out, tail: 0, t, seed, scale: 2.0, warp });
    }

    #[test]
    fn kqkv_matches_oracle(heads in heads(), c in 1usize..24, r in 0usize..9, t in 1usize..4,
                           s in prop_oneof![1usize..40, 1000usize..1100, 2040usize..2100],
                           seed in any::<u64>(), scale in prop_oneof![Just(1.0f32), Just(8.0f32)],
                           nan_head in prop::bool::weighted(0.1), warp in warps()) {
        let s = s.max(t);
        let heads = if heads * t * s > 40_000 { 1 + 40_000 / (t * s) } else { heads };
        run_kqkv(KqkvCase { heads, c, r, t, s, seed, scale, nan_head, warp });
    }
}

/// The real model's PHASE shape (H = 32, N = R = 64, C = 256) with YaRN and temperature, in
/// 8-lane warps (32 partials in RMSNorm's block reduction: two shared-memory rounds).
#[test]
fn phase_real_shape() {
    run_phase(PhaseCase {
        heads: 32,
        nope: 64,
        kv_lora: 256,
        rope_dim: 64,
        t: 2,
        start: 9000,
        temp: true,
        yarn_on: true,
        seed: 7,
        warp: 8,
    });
}

/// The real model's WKB shapes (IN: 64 → 256 with the 64-wide tail, 32 lanes; OUT: 256 → 128,
/// 64 lanes).
#[test]
fn wkb_real_shapes() {
    run_wkb(WkbCase {
        ty: "Q8_0",
        heads: 32,
        n_in: 64,
        n_out: 256,
        tail: 64,
        t: 1,
        seed: 11,
        scale: 2.0,
        warp: 32,
    });
    run_wkb(WkbCase {
        ty: "Q2_K",
        heads: 32,
        n_in: 256,
        n_out: 128,
        tail: 0,
        t: 1,
        seed: 12,
        scale: 2.0,
        warp: 64,
    });
}

/// The longest window: 262 144 keys, every key visible to the last position (32 lanes).
#[test]
fn kqkv_longest_window() {
    run_kqkv(KqkvCase {
        heads: 1,
        c: 4,
        r: 2,
        t: 1,
        s: 262_144,
        seed: 5,
        scale: 1.0,
        nan_head: false,
        warp: 32,
    });
}

/// One key (the first token of a sequence), in 8-lane warps.
#[test]
fn kqkv_single_key() {
    run_kqkv(KqkvCase {
        heads: 3,
        c: 5,
        r: 2,
        t: 1,
        s: 1,
        seed: 9,
        scale: 1.0,
        nan_head: false,
        warp: 8,
    });
}
