//! The GPU kernels of the unfused plan steps, through their CPU execution, against the CPU oracle
//! on one-step plans: the kernels come from `gpu::steps::for_step` on the same plan the oracle
//! runs, so the step → kernel mapping is tested with them. A representative set: quantized
//! mat-vec for several ggml types, RMSNorm, softmax (fixed rows and rows of `S`), router top-k +
//! gather_renorm, the routed-expert SwiGLU FFN (fused gate/up), embedding lookup, SiLU, RoPE, and
//! a concat copy; then `generate` on the bundled model's plan (deterministic, deduplicated). The
//! kernels are built for warps of 8, 32 and 64 lanes (sampled by the property tests, one width
//! per case of the fixed ones) and run at that width.
//!
//! Tolerances (as in `kernels_fused.rs`, `u = 2⁻²⁴`, `A = 2⁻¹⁴⁶`): bit-exact where both sides run
//! the same operations in the same order (copies, embed, top_k, gather_renorm, SiLU, RoPE up to
//! sin/cos); a dot of `n` terms `2(n + 2)·u·Σ|w·x| + A`; RMSNorm `(n + 8)·u·|ref| + A`; softmax
//! `(2n + 16)·u·|ref| + A` (sum of `n` exponentials in two orders, exp within 2 ulps each side);
//! SiLU `8u·|ref| + A` (two exp implementations); RoPE `8u·(|x0| + |x1|)`; the expert FFN
//! `2(n_ff + 2)·u·Σ_f |down·act| + …` with `act` carrying its own dot bound (see `moe_bounds`).

#[path = "kernels_common.rs"]
mod common;

use aubier_compiler::config::{ExpertLayout, YarnParams};
use aubier_compiler::ops::Op;
use aubier_compiler::types::{Attrs, DType, Dim};
use aubier_kernels_gen::gpu::cpu_exec::Arg;
use aubier_kernels_gen::gpu::emit::WARP;
use aubier_kernels_gen::gpu::steps::for_step;
use common::*;
use proptest::prelude::*;
use rand::{Rng, SeedableRng};

const A: f64 = 8.0 * 1.401_298_464_324_817e-45;

fn vals(seed: u64, n: usize, scale: f32) -> Vec<f32> {
    let mut g = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|_| special(g.random::<f32>(), g.random_range(0..100u8), scale))
        .collect()
}

fn dot_bound(w: &[f32], x: &[f32]) -> f64 {
    let s: f64 = w
        .iter()
        .zip(x)
        .map(|(a, b)| (*a as f64 * *b as f64).abs())
        .sum();
    2.0 * (w.len() as f64 + 2.0) * U * s + A
}

fn mat_mul_case(ty: &str, n_in: usize, n_out: usize, t: usize, seed: u64, warp: u32) {
    let w = if ty == "F32" {
        W::f32(vec![n_in, n_out], &vals(seed ^ 1, n_in * n_out, 1.0))
    } else {
        W::random(ty, vec![n_in, n_out], seed, 0.5)
    };
    mat_mul_of(w, t, seed, warp);
}

/// The mat-vec kernel of `w`'s type, for warps of `warp` lanes, against the oracle on `t` random
/// activation rows.
fn mat_mul_of(w: W, t: usize, seed: u64, warp: u32) {
    let (ty, n_in, n_out) = (w.ty.clone(), w.ne[0], w.ne[1]);
    let x = vals(seed, t * n_in, 2.0);
    let mut pb = PlanB::default();
    let xv = pb.value(DType::F32, vec![Dim::Tokens, fx(n_in)], false);
    let wo = pb.weight(w.clone());
    let y = pb.step(
        Op::MatMul,
        Attrs::None,
        vec![wo, v(xv)],
        DType::F32,
        vec![Dim::Tokens, fx(n_out)],
    );
    let want = as_f32(&run_oracle(&pb, &[(xv, f32s(&x))], t, 1, &mut [])[y]);
    let ks = for_step(&pb.plan(), 0, warp).expect("kernels");
    assert_eq!(ks.len(), 1);
    let mut xa = x.clone();
    let mut got = vec![0f32; t * n_out];
    run_gpu(
        &ks[0],
        &mut [Arg::Weight(&w.bytes), Arg::F32(&mut xa), Arg::F32(&mut got)],
        t,
        1,
    );
    let wv = w.values();
    let bound: Vec<f64> = (0..t * n_out)
        .map(|i| {
            let (ti, o) = (i / n_out, i % n_out);
            dot_bound(
                &wv[o * n_in..(o + 1) * n_in],
                &x[ti * n_in..(ti + 1) * n_in],
            )
        })
        .collect();
    check(
        &format!("mat_mul {ty} warp {warp}"),
        &got,
        &want,
        &bound,
        n_out,
        1e-5,
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    #[test]
    fn mat_mul_f32(n_in in 1usize..70, n_out in 1usize..20, t in 1usize..4, seed in any::<u64>(),
                   warp in warps()) {
        mat_mul_case("F32", n_in, n_out, t, seed, warp);
    }

    #[test]
    fn mat_mul_quant(ty in prop::sample::select(vec!["F16", "Q4_0", "Q5_0", "Q8_0", "IQ4_NL", "Q2_K", "Q3_K",
                                                      "Q4_K", "Q5_K", "Q6_K", "IQ2_XXS", "IQ2_XS"]),
                     blocks in 1usize..3, n_out in 1usize..12, t in 1usize..3, seed in any::<u64>(),
                     warp in warps()) {
        mat_mul_case(ty, 256 * blocks, n_out, t, seed, warp);
    }

    /// Every block-quantized type with a device function, on gguf-py's own blocks (`q.<TYPE>` of
    /// the quant vectors fixture), so the types the random sampler cannot make (IQ1, IQ3, IQ2_S,
    /// IQ4_XS, …) are covered too. The float types are left out here: their fixture rows hold
    /// ±inf, NaN and values near f32::MAX on purpose, where whether a sum overflows depends on its
    /// order; F32 and F16 are covered on random rows above.
    #[test]
    fn mat_mul_every_type_on_gguf_py_blocks(t in 1usize..3, seed in any::<u64>(), warp in warps()) {
        let path = aubier_tests::data_dir().join("quants/quant_vectors.gguf");
        let file = aubier_runtime::gguf::GgufFile::open(&path).expect("quant vectors");
        let floats = ["F32", "F16", "BF16"];
        for ty in aubier_kernels_gen::gpu::quant::supported_types().iter().filter(|t| !floats.contains(t)) {
            let q = file.tensor(&format!("q.{ty}")).expect("fixture tensor");
            let w = W { ty: ty.to_string(), ne: q.ne.clone(), bytes: file.tensor_data(q).to_vec() };
            mat_mul_of(w, t, seed, warp);
        }
    }

    #[test]
    fn rms_norm_and_softmax(n in 1usize..600, rows in 1usize..4, seed in any::<u64>(), warp in warps()) {
        let x = vals(seed, rows * n, 3.0);
        let wn = vals(seed ^ 7, n, 1.0);
        let mut pb = PlanB::default();
        let xv = pb.value(DType::F32, vec![Dim::Tokens, fx(n)], false);
        let wo = pb.weight(W::f32(vec![n], &wn));
        let y = pb.step(Op::RmsNorm, Attrs::Eps(1e-6), vec![v(xv), wo], DType::F32, vec![Dim::Tokens, fx(n)]);
        pb.step(Op::Softmax, Attrs::None, vec![v(xv)], DType::F32, vec![Dim::Tokens, fx(n)]);
        let bufs = run_oracle(&pb, &[(xv, f32s(&x))], rows, 1, &mut []);
        let plan = pb.plan();

        let k = &for_step(&plan, 0, warp).expect("rms_norm")[0];
        let (mut xa, mut got) = (x.clone(), vec![0f32; x.len()]);
        let wb: Vec<u8> = wn.iter().flat_map(|f| f.to_le_bytes()).collect();
        run_gpu(k, &mut [Arg::F32(&mut xa), Arg::Weight(&wb), Arg::F32(&mut got)], rows, 1);
        let want = as_f32(&bufs[y]);
        let b: Vec<f64> = want.iter().map(|w| (n as f64 + 8.0) * U * (*w as f64).abs() + A).collect();
        check("rms_norm", &got, &want, &b, n, 1e-5);

        let k = &for_step(&plan, 1, warp).expect("softmax")[0];
        let mut got = vec![0f32; x.len()];
        run_gpu(k, &mut [Arg::F32(&mut xa), Arg::F32(&mut got)], rows, 1);
        let want = as_f32(&bufs[y + 1]);
        let b: Vec<f64> = want.iter().map(|w| (2.0 * n as f64 + 16.0) * U * (*w as f64).abs() + A).collect();
        check("softmax", &got, &want, &b, n, 1e-5);
    }

    #[test]
    fn router_top_k_and_renorm(e in 1usize..140, k in 1usize..6, rows in 1usize..4, seed in any::<u64>(),
                               ties in any::<bool>(), warp in warps()) {
        let k = k.min(e);
        let mut p = vals(seed, rows * e, 1.0);
        if ties {
            for x in p.iter_mut() {
                *x = (*x * 4.0).round();
            }
        }
        let mut pb = PlanB::default();
        let pv = pb.value(DType::F32, vec![Dim::Tokens, fx(e)], false);
        let ids = pb.step(Op::TopK, Attrs::TopK { k }, vec![v(pv)], DType::I32, vec![Dim::Tokens, fx(k)]);
        pb.step(Op::GatherRenorm, Attrs::GatherRenorm { renorm: true, scale: 1.5 }, vec![v(pv), v(ids)],
                DType::F32, vec![Dim::Tokens, fx(k)]);
        let bufs = run_oracle(&pb, &[(pv, f32s(&p))], rows, 1, &mut []);
        let plan = pb.plan();
        let kt = &for_step(&plan, 0, warp).expect("top_k")[0];
        let mut pa = p.clone();
        let mut got_ids = vec![0i32; rows * k];
        run_gpu(kt, &mut [Arg::F32(&mut pa), Arg::I32(&mut got_ids)], rows, 1);
        let want_ids: Vec<i32> = bufs[ids].iter().map(|&b| b as i32).collect();
        prop_assert_eq!(&got_ids, &want_ids);
        if want_ids.iter().all(|&i| i >= 0) {
            let kg = &for_step(&plan, 1, warp).expect("gather_renorm")[0];
            let mut got = vec![0f32; rows * k];
            run_gpu(kg, &mut [Arg::F32(&mut pa), Arg::I32(&mut got_ids), Arg::F32(&mut got)], rows, 1);
            let want = as_f32(&bufs[ids + 1]);
            check("gather_renorm", &got, &want, &vec![0.0; got.len()], k, 0.0);
        }
    }
}

/// Routed experts, fused gate/up, Q2_K gate/up and Q4_K down (the real model's type mix), one
/// case per warp width.
#[test]
fn moe_ffn_matches_oracle() {
    for (t, seed, warp) in [(1usize, 3u64, 8u32), (3, 4, 32), (2, 5, 64)] {
        let (d, n_ff, n_exp, k) = (256usize, 48usize, 6usize, 2usize);
        let gu = W::random("Q2_K", vec![d, 2 * n_ff, n_exp], seed, 0.3);
        let dn = W::f32(vec![n_ff, d, n_exp], &vals(seed ^ 9, n_ff * d * n_exp, 0.5));
        let h = vals(seed ^ 5, t * d, 1.0);
        let mut g = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let ids: Vec<i32> = (0..t * k)
            .map(|i| ((i / k * 3 + i % k * 2 + g.random_range(0..2)) % n_exp) as i32)
            .collect();
        let wts: Vec<f32> = (0..t * k).map(|_| g.random::<f32>()).collect();
        let mut pb = PlanB::default();
        let hv = pb.value(DType::F32, vec![Dim::Tokens, fx(d)], false);
        let iv = pb.value(DType::I32, vec![Dim::Tokens, fx(k)], false);
        let wv = pb.value(DType::F32, vec![Dim::Tokens, fx(k)], false);
        let gw = pb.weight(gu.clone());
        let dw = pb.weight(dn.clone());
        let y = pb.step(
            Op::MoeFfn,
            Attrs::Moe {
                layer: 0,
                n_ff,
                layout: ExpertLayout::FusedGateUp,
            },
            vec![v(hv), v(iv), v(wv), gw, dw],
            DType::F32,
            vec![Dim::Tokens, fx(d)],
        );
        let bufs = run_oracle(
            &pb,
            &[(hv, f32s(&h)), (iv, i32s(&ids)), (wv, f32s(&wts))],
            t,
            1,
            &mut [],
        );
        let want = as_f32(&bufs[y]);
        let ks = for_step(&pb.plan(), 0, warp).expect("moe kernels");
        assert_eq!(ks.len(), 2);
        let eb = |w: &W| w.row_bytes() * w.ne[1];
        let gu_e: Vec<&[u8]> = gu.bytes.chunks(eb(&gu)).collect();
        let dn_e: Vec<&[u8]> = dn.bytes.chunks(eb(&dn)).collect();
        let (mut ha, mut ia, mut wa) = (h.clone(), ids.clone(), wts.clone());
        let mut act = vec![0f32; t * k * n_ff];
        run_gpu(
            &ks[0],
            &mut [
                Arg::F32(&mut ha),
                Arg::I32(&mut ia),
                Arg::Experts(&gu_e),
                Arg::F32(&mut act),
            ],
            t,
            1,
        );
        let mut got = vec![0f32; t * d];
        run_gpu(
            &ks[1],
            &mut [
                Arg::I32(&mut ia),
                Arg::F32(&mut wa),
                Arg::Experts(&dn_e),
                Arg::F32(&mut act),
                Arg::F32(&mut got),
            ],
            t,
            1,
        );

        // Bound: act = silu(g)·u with g, u dots of d terms (bounds bg, bu); silu's derivative is
        // ≤ 1.1 in magnitude, so |Δact| ≤ 1.1·bg·|u| + |silu(g)|·bu + 8u|act|; then the down dot of
        // n_ff terms adds 2(n_ff + 2)·u·Σ|down·act| and Σ_f |down_f|·|Δact_f|, weighted by w.
        let (guv, dnv) = (gu.values(), dn.values());
        let mut bound = vec![0f64; t * d];
        for ti in 0..t {
            let hr = &h[ti * d..(ti + 1) * d];
            for j in 0..k {
                let (e, wj) = (ids[ti * k + j] as usize, wts[ti * k + j] as f64);
                let mut a = vec![0f64; n_ff];
                let mut da = vec![0f64; n_ff];
                for f in 0..n_ff {
                    let gr = &guv[(e * 2 * n_ff + f) * d..(e * 2 * n_ff + f + 1) * d];
                    let ur = &guv[(e * 2 * n_ff + n_ff + f) * d..(e * 2 * n_ff + n_ff + f + 1) * d];
                    let gv: f64 = gr.iter().zip(hr).map(|(x, y)| *x as f64 * *y as f64).sum();
                    let uv: f64 = ur.iter().zip(hr).map(|(x, y)| *x as f64 * *y as f64).sum();
                    let sg = gv / (1.0 + (-gv).exp());
                    a[f] = sg * uv;
                    da[f] = 1.1 * dot_bound(gr, hr) * uv.abs()
                        + sg.abs() * dot_bound(ur, hr)
                        + 8.0 * U * a[f].abs()
                        + A;
                }
                for o in 0..d {
                    let dr = &dnv[(e * d + o) * n_ff..(e * d + o + 1) * n_ff];
                    let mag: f64 = dr.iter().zip(&a).map(|(x, y)| (*x as f64 * y).abs()).sum();
                    let prop: f64 = dr.iter().zip(&da).map(|(x, y)| (*x as f64).abs() * y).sum();
                    bound[ti * d + o] +=
                        wj * (2.0 * (n_ff as f64 + 2.0) * U * mag + prop) + 4.0 * U * wj * mag + A;
                }
            }
        }
        check("moe_ffn", &got, &want, &bound, d, 1e-5);
    }
}

/// Embedding lookup (IQ2_XXS table), SiLU, a concat copy and RoPE with YaRN.
#[test]
fn embed_silu_concat_rope_match_oracle() {
    let (d, vocab, t) = (256usize, 7usize, 3usize);
    let table = W::random("IQ2_XXS", vec![d, vocab], 21, 0.7);
    let ids = vec![6i32, 0, 3];
    let mut pb = PlanB::default();
    let iv = pb.value(DType::I32, vec![Dim::Tokens], false);
    let tw = pb.weight(table.clone());
    let e = pb.step(
        Op::Embed,
        Attrs::None,
        vec![tw, v(iv)],
        DType::F32,
        vec![Dim::Tokens, fx(d)],
    );
    let s = pb.step(
        Op::Silu,
        Attrs::None,
        vec![v(e)],
        DType::F32,
        vec![Dim::Tokens, fx(d)],
    );
    let c = pb.step(
        Op::Concat,
        Attrs::None,
        vec![v(e), v(s)],
        DType::F32,
        vec![Dim::Tokens, fx(2 * d)],
    );
    let pv = pb.value(DType::I32, vec![Dim::Tokens], false);
    let rope = YarnParams {
        n_rot: 64,
        freq_base: 10000.0,
        factor: 128.0,
        original_context: 8192,
        beta_fast: 32.0,
        beta_slow: 1.0,
        attn_factor: 1.0,
        log_multiplier: 0.1,
    };
    let r = pb.step(
        Op::RopeYarn,
        Attrs::Rope(rope),
        vec![v(e), v(pv)],
        DType::F32,
        vec![Dim::Tokens, fx(d)],
    );
    let pos = vec![5i32, 70_000, 262_143];
    let bufs = run_oracle(
        &pb,
        &[(iv, i32s(&ids)), (pv, i32s(&pos))],
        t,
        262_144,
        &mut [],
    );
    let plan = pb.plan();
    let run1 = |i: usize, args: &mut [Arg<'_>]| {
        run_gpu(
            &for_step(&plan, i, WARP).expect("kernels")[0],
            args,
            t,
            262_144,
        )
    };

    let mut ia = ids.clone();
    let mut eg = vec![0f32; t * d];
    run1(
        0,
        &mut [
            Arg::Weight(&table.bytes),
            Arg::I32(&mut ia),
            Arg::F32(&mut eg),
        ],
    );
    check("embed", &eg, &as_f32(&bufs[e]), &vec![0.0; t * d], d, 0.0);

    let mut sg = vec![0f32; t * d];
    run1(1, &mut [Arg::F32(&mut eg), Arg::F32(&mut sg)]);
    let sw = as_f32(&bufs[s]);
    let b: Vec<f64> = sw.iter().map(|w| 8.0 * U * (*w as f64).abs() + A).collect();
    check("silu", &sg, &sw, &b, d, 1e-6);

    let mut cg = vec![0f32; t * 2 * d];
    let mut sw2 = sw.clone();
    run1(
        2,
        &mut [Arg::F32(&mut eg), Arg::F32(&mut sw2), Arg::F32(&mut cg)],
    );
    check(
        "concat",
        &cg,
        &as_f32(&bufs[c]),
        &vec![0.0; t * 2 * d],
        2 * d,
        0.0,
    );

    let mut pa = pos.clone();
    let mut rg = vec![0f32; t * d];
    run1(
        3,
        &mut [Arg::F32(&mut eg), Arg::I32(&mut pa), Arg::F32(&mut rg)],
    );
    let b: Vec<f64> = (0..t * d)
        .map(|i| {
            let p = i / 2 * 2;
            if i % d < 64 {
                8.0 * U * (eg[p].abs() as f64 + eg[p + 1].abs() as f64) + A
            } else {
                0.0
            }
        })
        .collect();
    check("rope_yarn", &rg, &as_f32(&bufs[r]), &b, d, 1e-6);
}

/// Softmax over rows of `S` (the unfused attention's), across a block boundary of keys, at every
/// sampled width.
#[test]
fn softmax_over_keys() {
    let (t, heads, s) = (2usize, 3usize, 700usize);
    let x = vals(77, t * heads * s, 4.0);
    let mut pb = PlanB::default();
    let xv = pb.value(DType::F32, vec![Dim::Tokens, fx(heads), Dim::Keys], false);
    let y = pb.step(
        Op::Softmax,
        Attrs::None,
        vec![v(xv)],
        DType::F32,
        vec![Dim::Tokens, fx(heads), Dim::Keys],
    );
    let bufs = run_oracle(&pb, &[(xv, f32s(&x))], t, s, &mut []);
    let want = as_f32(&bufs[y]);
    let b: Vec<f64> = want
        .iter()
        .map(|w| (2.0 * s as f64 + 16.0) * U * (*w as f64).abs() + A)
        .collect();
    for warp in WARPS {
        let k = &for_step(&pb.plan(), 0, warp).expect("softmax")[0];
        let (mut xa, mut got) = (x.clone(), vec![0f32; x.len()]);
        run_gpu(k, &mut [Arg::F32(&mut xa), Arg::F32(&mut got)], t, s);
        check(
            &format!("softmax over S, warp {warp}"),
            &got,
            &want,
            &b,
            s,
            1e-5,
        );
    }
}

/// The bundled model's plan, unfused (CPU oracle target) or fused (GPU target), with `edit`
/// applied to its config first (a graph edit, as a user makes one).
fn bundled_plan(
    target: aubier_compiler::Target,
    edit: impl FnOnce(&mut aubier_compiler::config::Mistral4Config),
) -> aubier_compiler::plan::Plan {
    let path = common_models_dir().join("ms4-tiny256-q2k.gguf");
    let file = aubier_runtime::gguf::GgufFile::open(&path).expect("bundled model");
    let mut cfg = aubier_runtime::model::read_config(&file).expect("config");
    let weights = aubier_runtime::model::weight_refs(&file, &cfg).expect("weights");
    edit(&mut cfg);
    let opts = aubier_compiler::CompileOptions {
        target,
        ..Default::default()
    };
    aubier_compiler::compile(&cfg, &weights, &opts).expect("compile")
}

fn common_models_dir() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("models")
}

/// `generate` covers every step of both plans, is deterministic, shares one kernel across the
/// layers, and names the fused kernels; a graph edit (dropping the query temperature) changes the
/// PHASE kernel and nothing that does not depend on it.
#[test]
fn generate_on_the_bundled_model() {
    use aubier_compiler::Target;
    use aubier_kernels_gen::gpu::{generate, plan_kernels};
    for target in [Target::Oracle, Target::Gpu] {
        let plan = bundled_plan(target, |_| {});
        let a = generate(&plan).expect("generate");
        let b = generate(&plan).expect("generate again");
        assert_eq!(a, b, "generation is deterministic");
        let hip = a.iter().filter(|f| f.path.starts_with("hip/")).count();
        let cuda = a.iter().filter(|f| f.path.starts_with("cuda/")).count();
        assert_eq!(hip, cuda);
        let kernels = plan_kernels(&plan, WARP).expect("kernels");
        assert_eq!(kernels.len(), hip);
        let launches: usize = kernels.iter().map(|(_, uses)| uses.len()).sum();
        assert!(
            launches > kernels.len(),
            "layers share kernels: {} kernels for {launches} launches",
            kernels.len()
        );
        let has = |p: &str| a.iter().any(|f| f.path.starts_with(&format!("hip/{p}_")));
        let fused = target == Target::Gpu;
        for p in ["phase", "wkb_in", "wkb_out", "kqkv_split", "kqkv_merge"] {
            assert_eq!(has(p), fused, "{p} kernels in a {target:?} plan");
        }
        for p in [
            "embed",
            "rms_norm",
            "mat_mul",
            "softmax",
            "top_k",
            "gather_renorm",
            "moe_gate_up",
            "moe_down",
            "add",
        ] {
            assert!(has(p), "{p} kernel missing");
        }
    }
    let with = plan_kernels(&bundled_plan(Target::Gpu, |_| {}), WARP).expect("kernels");
    let without =
        plan_kernels(&bundled_plan(Target::Gpu, |c| c.temperature = None), WARP).expect("kernels");
    let names = |ks: &[(aubier_kernels_gen::gpu::ir::Kernel, Vec<usize>)]| -> Vec<String> {
        ks.iter().map(|(k, _)| k.name.clone()).collect()
    };
    let (a, b) = (names(&with), names(&without));
    let changed: Vec<&String> = a.iter().filter(|n| !b.contains(n)).collect();
    assert!(!changed.is_empty(), "the edit changes a kernel");
    assert!(
        changed.iter().all(|n| n.starts_with("phase_")),
        "only PHASE depends on the temperature: {changed:?}"
    );
}

/// Every step of both bundled plans maps to kernels at every tested width, launched by the same
/// steps; a kernel's name depends on its width, and HIP/CUDA refuse the non-32 ones.
#[test]
fn bundled_plans_map_at_every_width() {
    use aubier_compiler::Target;
    use aubier_kernels_gen::gpu::{plan_kernels, render, GenError};
    for target in [Target::Oracle, Target::Gpu] {
        let plan = bundled_plan(target, |_| {});
        let at32 = plan_kernels(&plan, WARP).expect("32 lanes");
        for warp in WARPS.into_iter().filter(|&w| w != WARP) {
            let ks = plan_kernels(&plan, warp).expect("kernels");
            assert_eq!(ks.len(), at32.len(), "{target:?} at {warp} lanes");
            for ((k, uses), (k32, uses32)) in ks.iter().zip(&at32) {
                assert_eq!(k.warp, warp);
                assert_eq!(uses, uses32);
                assert_ne!(k.name, k32.name);
                let r = render(&aubier_kernels_gen::gpu::emit::Hip, k, &[]);
                assert!(matches!(r, Err(GenError::Warp { .. })), "{}", k.name);
            }
        }
    }
}

/// Device argmax (greedy sampling) against a plain first-maximum scan, with ties, NaN and −∞.
#[test]
fn argmax_matches_a_plain_scan() {
    let (n, rows) = (1000usize, 4usize);
    let mut x: Vec<f32> = vals(31, rows * n, 1.0)
        .iter()
        .map(|v| (v * 8.0).round())
        .collect();
    x[3] = f32::NAN;
    x[n + 700] = 1e30;
    x[n + 999] = 1e30;
    for v in &mut x[2 * n..3 * n] {
        *v = f32::NEG_INFINITY;
    }
    for v in &mut x[3 * n..4 * n] {
        *v = f32::NAN;
    }
    let want: Vec<i32> = x
        .chunks(n)
        .map(|r| {
            let mut best: Option<(usize, f32)> = None;
            for (i, &v) in r.iter().enumerate() {
                if !v.is_nan() && best.is_none_or(|(_, b)| v > b) {
                    best = Some((i, v));
                }
            }
            best.map_or(-1, |(i, _)| i as i32)
        })
        .collect();
    let k = aubier_kernels_gen::gpu::steps::argmax(
        "argmax",
        n,
        &aubier_kernels_gen::gpu::ir::Size::Tokens,
        WARP,
    )
    .expect("kernel");
    let mut got = vec![0i32; rows];
    run_gpu(&k, &mut [Arg::F32(&mut x), Arg::I32(&mut got)], rows, 1);
    assert_eq!(got, want);
    assert_eq!(&want[1..4], &[700, 0, -1]);
}

/// `launch::launches` binds every parameter of every kernel of the bundled model's plans (fused
/// and unfused): weights to weight operands (an experts table to a stacked expert tensor), f32 /
/// i32 buffers to values of that type, the cache to a layer of the model, scratch only to the
/// named scratch parameters; every step but an in-place reshape launches something.
#[test]
fn launches_bind_every_parameter_of_the_bundled_plans() {
    use aubier_compiler::plan::{Operand, Storage};
    use aubier_compiler::Target;
    use aubier_kernels_gen::gpu::ir::ParamKind;
    use aubier_kernels_gen::gpu::launch::{launches, Arg};
    for target in [Target::Oracle, Target::Gpu] {
        let plan = bundled_plan(target, |_| {});
        for (i, step) in plan.steps.iter().enumerate() {
            let ls = launches(&plan, i, 32).unwrap_or_else(|e| panic!("{e}"));
            let in_place = step.op == Op::Reshape
                && matches!(step.args[0], Operand::Value(v) if plan.values[v].storage == plan.values[step.out].storage);
            assert_eq!(ls.is_empty(), in_place, "step {i} ({})", step.op.name());
            for l in &ls {
                assert_eq!(l.args.len(), l.kernel.params.len());
                for ((name, kind), arg) in l.kernel.params.iter().zip(&l.args) {
                    let what = format!("step {i} kernel {} param {name}: {arg:?}", l.kernel.name);
                    let value_dtype = |v: usize| plan.values[v].dtype;
                    match (kind, arg) {
                        (ParamKind::Weight { .. } | ParamKind::Experts { .. }, Arg::Operand(o)) => {
                            assert!(matches!(step.args[*o], Operand::Weight(_)), "{what}")
                        }
                        (ParamKind::F32 { .. }, Arg::Operand(o)) => match step.args[*o] {
                            Operand::Value(v) => assert_eq!(value_dtype(v), DType::F32, "{what}"),
                            Operand::Weight(_) => panic!("{what}"),
                        },
                        (ParamKind::I32 { .. }, Arg::Operand(o)) => match step.args[*o] {
                            Operand::Value(v) => assert_eq!(value_dtype(v), DType::I32, "{what}"),
                            Operand::Weight(_) => panic!("{what}"),
                        },
                        (ParamKind::F32 { .. }, Arg::Output) => {
                            assert_eq!(value_dtype(step.out), DType::F32, "{what}")
                        }
                        (ParamKind::I32 { .. }, Arg::Output) => {
                            assert_eq!(value_dtype(step.out), DType::I32, "{what}")
                        }
                        (ParamKind::F32 { .. }, Arg::Cache(layer)) => {
                            assert!(*layer < plan.config.n_layer, "{what}");
                            assert_eq!(name, "cache", "{what}");
                        }
                        (ParamKind::F32 { .. }, Arg::Scratch { name: s, .. }) => {
                            assert!(s == "act" || s == "part", "{what}")
                        }
                        _ => panic!("{what}"),
                    }
                }
            }
            if let Some(Storage::KvCache { .. }) = plan.values.get(step.out).map(|v| v.storage) {
                assert!(ls
                    .iter()
                    .any(|l| l.args.iter().any(|a| matches!(a, Arg::Cache(_)))));
            }
        }
    }
}
