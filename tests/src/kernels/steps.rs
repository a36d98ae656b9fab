//! Cases of the unfused plan steps, each a small plan checked one step at a time against the
//! oracle ([`check_steps`]) on an executor: quantized mat-vec (random blocks of the sampled
//! types, and gguf-py's blocks of every type with a device function: every weight exactly
//! through one-hot rows, then random rows), RMSNorm and softmax (fixed rows and rows of `S`),
//! router top-k + gather_renorm (with ties), the routed-expert SwiGLU FFN (fused gate/up),
//! embedding lookup + SiLU + concat + RoPE with YaRN, the element-wise steps (`add`, `mul`,
//! `scale`, `silu`, a `reshape` copy), and greedy argmax (not a plan step: against a plain
//! scan). Values carry ±0, subnormals and large magnitudes ([`super::special`]).

use super::exec::{check_step, check_steps, one_step, run_step, warps, width, Exec, StepIn};
use super::{as_f32, f32s, fx, i32s, rng, run_oracle, v, vals, yarn, PlanB, W};
use aubier_compiler::config::ExpertLayout;
use aubier_compiler::ops::Op;
use aubier_compiler::plan::ValueId;
use aubier_compiler::types::{Attrs, DType, Dim};
use aubier_kernels_gen::gpu::cpu_exec::Arg;
use proptest::prelude::*;
use rand::Rng;

/// A mat-vec case: weight type and shape, activation rows, seed, warp width.
#[derive(Clone, Copy, Debug)]
pub struct MatMulCase {
    pub ty: &'static str,
    pub n_in: usize,
    pub n_out: usize,
    pub t: usize,
    pub seed: u64,
    pub warp: u32,
}

/// F32 weights of odd shapes.
pub fn mat_mul_f32_cases(x: &dyn Exec) -> impl Strategy<Value = MatMulCase> {
    (1usize..70, 1usize..20, 1usize..4, any::<u64>(), warps(x)).prop_map(
        |(n_in, n_out, t, seed, warp)| MatMulCase {
            ty: "F32",
            n_in,
            n_out,
            t,
            seed,
            warp,
        },
    )
}

/// Random blocks of the types the runtime's sampler makes, one or two 256-element blocks a row.
pub fn mat_mul_quant_cases(x: &dyn Exec) -> impl Strategy<Value = MatMulCase> {
    let types = vec![
        "F16", "Q4_0", "Q5_0", "Q8_0", "IQ4_NL", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ2_XXS",
        "IQ2_XS",
    ];
    (
        prop::sample::select(types),
        1usize..3,
        1usize..12,
        1usize..3,
        any::<u64>(),
        warps(x),
    )
        .prop_map(|(ty, blocks, n_out, t, seed, warp)| MatMulCase {
            ty,
            n_in: 256 * blocks,
            n_out,
            t,
            seed,
            warp,
        })
}

/// An F32 mat-vec over a prefill of 1900 tokens of 4096: more loop iterations than lavapipe
/// lets one invocation run (65 535) had a kernel looped over the tokens.
pub fn mat_mul_long_prefill(x: &dyn Exec) -> MatMulCase {
    MatMulCase {
        ty: "F32",
        n_in: 4096,
        n_out: 4,
        t: 1900,
        seed: 19,
        warp: x.widths()[0],
    }
}

/// The mat-vec step of a random weight of the case's type.
pub fn mat_mul(x: &dyn Exec, c: MatMulCase) {
    let w = if c.ty == "F32" {
        W::f32(
            vec![c.n_in, c.n_out],
            &vals(c.seed ^ 1, c.n_in * c.n_out, 1.0),
        )
    } else {
        W::random(c.ty, vec![c.n_in, c.n_out], c.seed, 0.5)
    };
    mat_mul_of(x, w, c.t, c.seed, c.warp);
}

/// A plan of one mat-vec step of `w` and its activation value.
fn mat_mul_plan(w: W) -> (PlanB, ValueId) {
    let (n_in, n_out) = (w.ne[0], w.ne[1]);
    let mut pb = PlanB::default();
    let xv = pb.value(DType::F32, vec![Dim::Tokens, fx(n_in)], false);
    let wo = pb.weight(w);
    pb.step(
        Op::MatMul,
        Attrs::None,
        vec![wo, v(xv)],
        DType::F32,
        vec![Dim::Tokens, fx(n_out)],
    );
    (pb, xv)
}

/// The mat-vec step of `w` on `t` random activation rows.
fn mat_mul_of(x: &dyn Exec, w: W, t: usize, seed: u64, warp: u32) {
    let what = format!("mat_mul {}", w.ty);
    let xs = vals(seed, t * w.ne[0], 2.0);
    let (pb, xv) = mat_mul_plan(w);
    check_steps(x, &what, &pb, &[(xv, f32s(&xs))], (t, 1), &mut [], warp);
}

/// The weight types of [`mat_mat_matches_mat_vec`]: those of the `aubier synth --quant` mixes'
/// dense weights and the float types.
pub const MAT_MAT_TYPES: [&str; 8] = [
    "F32", "F16", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q6_K", "IQ2_XXS",
];

/// The mat-mat of a random `[37, 1024]` weight of type `ty` computes its mat-vec's bits for
/// every output at `T` = 2, 5 and 64 (a partial tile, a tile and a half, eight tiles; two K
/// slices at widths up to 32), both built for warps of `warp` lanes and run on `x` (the form a
/// plan step launches is chosen by `T`, so here each is built and launched directly).
pub fn mat_mat_matches_mat_vec(x: &dyn Exec, ty: &str, warp: u32) {
    use aubier_kernels_gen::gpu::ir::Size;
    use aubier_kernels_gen::gpu::kernels::{mat_mat, mat_vec, MatVecShape, WeightSpec};
    let (n_in, n_out) = (1024, 37);
    let w = if ty == "F32" {
        W::f32(vec![n_in, n_out], &vals(5, n_in * n_out, 1.0))
    } else {
        W::random(ty, vec![n_in, n_out], 5, 0.5)
    };
    let s = MatVecShape {
        name: format!("mat_mul_{}", ty.to_ascii_lowercase()),
        w: WeightSpec {
            ggml_type: ty.into(),
            row_len: n_in,
        },
        n_out,
        heads: 1,
        tail: 0,
        rows: Size::Tokens,
    };
    let mv = mat_vec(&s, warp).unwrap_or_else(|e| panic!("{e}"));
    let mm = mat_mat(&s, warp).unwrap_or_else(|e| panic!("{e}"));
    for t in [2, 5, 64] {
        let xs = vals(t as u64, t * n_in, 2.0);
        let run = |k: &aubier_kernels_gen::gpu::ir::Kernel| {
            let mut xv = xs.clone();
            let mut y = vec![f32::from_bits(0x7fc0_dead); t * n_out];
            let mut args = [Arg::Weight(&w.bytes), Arg::F32(&mut xv), Arg::F32(&mut y)];
            x.run(k, &mut args, t, 1);
            y.iter().map(|v| v.to_bits()).collect::<Vec<u32>>()
        };
        let (want, got) = (run(&mv), run(&mm));
        for (i, (g, e)) in got.iter().zip(&want).enumerate() {
            assert!(
                *e != 0x7fc0_dead && g == e,
                "{ty} warp {warp} T {t}: y[{}, {}]: mat-mat {:e} ({g:#010x}), mat-vec {:e} ({e:#010x})",
                i / n_out,
                i % n_out,
                f32::from_bits(*g),
                f32::from_bits(*e)
            );
        }
    }
}

/// The routed experts' mat-mat kernels (`moe_route`, `moe_gate_up_mm`, `moe_down_mm`,
/// `moe_combine`) compute the mat-vecs' (`moe_gate_up`, `moe_down`) `act` and `y` bits at
/// T = 2, 5 and 64: gate/up rows of `gate_ty` (fused), down rows of `down_ty`, 6 experts, 2
/// slots a token, expert 4 routed by every token's first slot (8 full tiles at T = 64), experts
/// 1 and 2 alternating in the second, experts 0, 3 and 5 empty; K of 768 (several slices).
pub fn moe_mat_mat_matches_mat_vec(x: &dyn Exec, gate_ty: &str, down_ty: &str, warp: u32) {
    use aubier_kernels_gen::gpu::ir::{Kernel, ParamKind};
    use aubier_kernels_gen::gpu::kernels::WeightSpec;
    use aubier_kernels_gen::gpu::steps::{
        moe_combine, moe_down, moe_down_mm, moe_gate_up, moe_gate_up_mm, moe_route,
    };
    let (d, n_ff, k, n_exp) = (768usize, 256usize, 2usize, 6usize);
    let gu = W::random(gate_ty, vec![d, 2 * n_ff, n_exp], 17, 0.3);
    let dn = W::random(down_ty, vec![n_ff, d, n_exp], 19, 0.5);
    let gu_e: Vec<&[u8]> = gu.bytes.chunks(gu.row_bytes() * 2 * n_ff).collect();
    let dn_e: Vec<&[u8]> = dn.bytes.chunks(dn.row_bytes() * d).collect();
    let spec = |ty: &str, n| WeightSpec {
        ggml_type: ty.into(),
        row_len: n,
    };
    let (gs, ds) = (spec(gate_ty, d), spec(down_ty, n_ff));
    let ok = |k: Result<Kernel, _>| k.unwrap_or_else(|e| panic!("{e}"));
    let gate_up = ok(moe_gate_up("moe_gate_up", &gs, None, n_ff, k, warp));
    let down = ok(moe_down("moe_down", &ds, d, k, warp));
    let route = ok(moe_route("moe_route", n_exp, k, warp));
    let gate_up_mm = ok(moe_gate_up_mm(
        "moe_gate_up_mm",
        &gs,
        None,
        n_ff,
        k,
        n_exp,
        warp,
    ));
    let down_mm = ok(moe_down_mm("moe_down_mm", &ds, d, k, n_exp, warp));
    let combine = ok(moe_combine("moe_combine", d, k, warp));
    let route_len = match &route.params[1].1 {
        ParamKind::I32 { len: Some(l), .. } => l.clone(),
        other => panic!("route is {other:?}"),
    };
    for t in [2usize, 5, 64] {
        let ids: Vec<i32> = (0..t * k)
            .map(|s| if s % k == 0 { 4 } else { [1, 2][s / k % 2] })
            .collect();
        let h = vals(t as u64 + 40, t * d, 1.0);
        let wts = vals(t as u64 + 50, t * k, 1.0);
        let unwritten = f32::from_bits(0x7fc0_dead);
        let (mut hv, mut iv, mut wv) = (h.clone(), ids.clone(), wts.clone());
        let mut act = vec![unwritten; t * k * n_ff];
        let mut y = vec![unwritten; t * d];
        let mut args = [
            Arg::F32(&mut hv),
            Arg::I32(&mut iv),
            Arg::Experts(&gu_e),
            Arg::F32(&mut act),
        ];
        x.run(&gate_up, &mut args, t, 1);
        let mut args = [
            Arg::I32(&mut iv),
            Arg::F32(&mut wv),
            Arg::Experts(&dn_e),
            Arg::F32(&mut act),
            Arg::F32(&mut y),
        ];
        x.run(&down, &mut args, t, 1);
        let (mut hv, mut iv, mut wv) = (h.clone(), ids.clone(), wts.clone());
        let mut routes = vec![i32::MIN; route_len.eval(t, 1).expect("route length")];
        let mut act_mm = vec![unwritten; t * k * n_ff];
        let mut part = vec![unwritten; t * k * d];
        let mut y_mm = vec![unwritten; t * d];
        x.run(
            &route,
            &mut [Arg::I32(&mut iv), Arg::I32(&mut routes)],
            t,
            1,
        );
        let mut args = [
            Arg::F32(&mut hv),
            Arg::Experts(&gu_e),
            Arg::F32(&mut act_mm),
            Arg::I32(&mut routes),
        ];
        x.run(&gate_up_mm, &mut args, t, 1);
        let mut args = [
            Arg::Experts(&dn_e),
            Arg::F32(&mut act_mm),
            Arg::I32(&mut routes),
            Arg::F32(&mut part),
        ];
        x.run(&down_mm, &mut args, t, 1);
        let mut args = [Arg::F32(&mut wv), Arg::F32(&mut part), Arg::F32(&mut y_mm)];
        x.run(&combine, &mut args, t, 1);
        for (what, want, got) in [("act", &act, &act_mm), ("y", &y, &y_mm)] {
            for (i, (g, e)) in got.iter().zip(want.iter()).enumerate() {
                let (g, e) = (g.to_bits(), e.to_bits());
                assert!(
                    e != 0x7fc0_dead && g == e,
                    "{gate_ty}/{down_ty} warp {warp} T {t}: {what}[{i}]: mat-mat {:e} ({g:#010x}), \
                     mat-vec {:e} ({e:#010x})",
                    f32::from_bits(g),
                    f32::from_bits(e)
                );
            }
        }
    }
}

/// `(t, seed, warp)` of [`mat_mul_gguf_py`].
pub fn every_type_cases(x: &dyn Exec) -> impl Strategy<Value = (usize, u64, u32)> {
    (1usize..3, any::<u64>(), warps(x))
}

/// Every block-quantized type with a device function, so the types the random sampler cannot
/// make (IQ1, IQ3, IQ2_S, IQ4_XS, …) are covered too. The float types are left out: their
/// fixture rows hold ±inf, NaN and values near f32::MAX on purpose, where whether a sum
/// overflows depends on its order; F32 and F16 are covered on random rows by the other mat-vec
/// cases.
pub fn block_types() -> Vec<&'static str> {
    let floats = ["F32", "F16", "BF16"];
    aubier_kernels_gen::gpu::quant::supported_types()
        .iter()
        .copied()
        .filter(|t| !floats.contains(t))
        .collect()
}

/// [`mat_mul_gguf_py`] of every type of [`block_types`].
pub fn mat_mul_every_type(x: &dyn Exec, c: (usize, u64, u32)) {
    for ty in block_types() {
        mat_mul_gguf_py(x, ty, c);
    }
}

/// gguf-py's blocks of `ty` (`q.<TYPE>` of the quant vectors fixture, `ne = [n, rows]`) and its
/// dequantized values (`ref.<TYPE>`, `gguf.quants.dequantize`).
fn gguf_py(ty: &str) -> (W, Vec<f32>) {
    let path = crate::data_dir().join("quants/quant_vectors.gguf");
    let file = aubier_runtime::gguf::GgufFile::open(&path).expect("quant vectors");
    let q = file.tensor(&format!("q.{ty}")).expect("fixture tensor");
    let r = file
        .tensor(&format!("ref.{ty}"))
        .expect("fixture reference");
    let w = W {
        ty: ty.to_string(),
        ne: q.ne.clone(),
        bytes: file.tensor_data(q).to_vec(),
    };
    let want = file
        .tensor_data(r)
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    (w, want)
}

/// The mat-vec step of `ty` on gguf-py's blocks, on `t` random rows against the oracle.
pub fn mat_mul_gguf_py(x: &dyn Exec, ty: &str, (t, seed, warp): (usize, u64, u32)) {
    mat_mul_of(x, gguf_py(ty).0, t, seed, warp);
}

/// The mat-vec kernel of `ty` on gguf-py's blocks (`ne = [n, rows]`) and the `n` one-hot rows
/// of the identity: each output is one weight plus signed zeros, so it must be gguf-py's
/// dequantized weight bit for bit up to the sign of a zero — on a device, its dequant function
/// against gguf-py's, through the kernel the oracle cases run.
pub fn gguf_py_weights_through_mat_vec(x: &dyn Exec, ty: &str, warp: u32) {
    let (w, want) = gguf_py(ty);
    let (n, rows) = (w.ne[0], w.ne[1]);
    let (pb, xv) = mat_mul_plan(w);
    let eye: Vec<f32> = (0..n * n)
        .map(|i| if i / n == i % n { 1.0 } else { 0.0 })
        .collect();
    let vals = pb.buffers(&[(xv, f32s(&eye))], n, 1);
    let got = as_f32(&run_step(x, one_step(&pb, &vals, &[], n, 1), warp).out);
    for (i, g) in got.iter().enumerate() {
        let (col, row) = (i / rows, i % rows);
        let e = want[row * n + col];
        assert!(
            e.is_finite() && (g.to_bits() == e.to_bits() || (*g == 0.0 && e == 0.0)),
            "{ty} warp {warp}: weight [{row}, {col}]: got {g:e} ({:#010x}), gguf-py {e:e} ({:#010x})",
            g.to_bits(),
            e.to_bits()
        );
    }
}

/// A row-op case: row width, rows, seed, warp width.
#[derive(Clone, Copy, Debug)]
pub struct RowsCase {
    pub n: usize,
    pub rows: usize,
    pub seed: u64,
    pub warp: u32,
}

/// Rows of 1..600 elements (across the 256-thread block), 1..4 rows.
pub fn rows_cases(x: &dyn Exec) -> impl Strategy<Value = RowsCase> {
    (1usize..600, 1usize..4, any::<u64>(), warps(x)).prop_map(|(n, rows, seed, warp)| RowsCase {
        n,
        rows,
        seed,
        warp,
    })
}

/// RMSNorm and softmax over rows of `n`.
pub fn rms_norm_and_softmax(x: &dyn Exec, c: RowsCase) {
    let xs = vals(c.seed, c.rows * c.n, 3.0);
    let wn = vals(c.seed ^ 7, c.n, 1.0);
    let mut pb = PlanB::default();
    let xv = pb.value(DType::F32, vec![Dim::Tokens, fx(c.n)], false);
    let wo = pb.weight(W::f32(vec![c.n], &wn));
    let row = vec![Dim::Tokens, fx(c.n)];
    pb.step(
        Op::RmsNorm,
        Attrs::Eps(1e-6),
        vec![v(xv), wo],
        DType::F32,
        row.clone(),
    );
    pb.step(Op::Softmax, Attrs::None, vec![v(xv)], DType::F32, row);
    let inputs = [(xv, f32s(&xs))];
    check_steps(x, "rows", &pb, &inputs, (c.rows, 1), &mut [], c.warp);
}

/// The element-wise steps over rows of `n`: `add`, `mul`, `scale` by `1.7`, `silu`, and a
/// `reshape` into another slot (a copy).
pub fn elementwise(x: &dyn Exec, c: RowsCase) {
    let (a, b) = (
        vals(c.seed, c.rows * c.n, 3.0),
        vals(!c.seed, c.rows * c.n, 3.0),
    );
    let mut pb = PlanB::default();
    let row = vec![Dim::Tokens, fx(c.n)];
    let av = pb.value(DType::F32, row.clone(), false);
    let bv = pb.value(DType::F32, row.clone(), false);
    for (op, attrs, args) in [
        (Op::Add, Attrs::None, vec![v(av), v(bv)]),
        (Op::Mul, Attrs::None, vec![v(av), v(bv)]),
        (Op::Scale, Attrs::Scale(1.7), vec![v(av)]),
        (Op::Silu, Attrs::None, vec![v(av)]),
        (Op::Reshape, Attrs::None, vec![v(av)]),
    ] {
        pb.step(op, attrs, args, DType::F32, row.clone());
    }
    let inputs = [(av, f32s(&a)), (bv, f32s(&b))];
    check_steps(x, "elementwise", &pb, &inputs, (c.rows, 1), &mut [], c.warp);
}

/// A router case: experts, experts used, rows, seed, whether the logits tie, warp width.
#[derive(Clone, Copy, Debug)]
pub struct RouterCase {
    pub e: usize,
    pub k: usize,
    pub rows: usize,
    pub seed: u64,
    pub ties: bool,
    pub warp: u32,
}

/// 1..140 experts (across a 32-expert boundary), 1..6 used.
pub fn router_cases(x: &dyn Exec) -> impl Strategy<Value = RouterCase> {
    (
        1usize..140,
        1usize..6,
        1usize..4,
        any::<u64>(),
        any::<bool>(),
        warps(x),
    )
        .prop_map(|(e, k, rows, seed, ties, warp)| RouterCase {
            e,
            k: k.min(e),
            rows,
            seed,
            ties,
            warp,
        })
}

/// Router top-k (ids equal to the oracle's) and gather_renorm with renormalisation and a scale,
/// the latter only where every id is a real expert (a NaN row gives −1, which the host refuses).
pub fn router(x: &dyn Exec, c: RouterCase) {
    let mut p = vals(c.seed, c.rows * c.e, 1.0);
    if c.ties {
        for x in p.iter_mut() {
            *x = (*x * 4.0).round();
        }
    }
    let mut pb = PlanB::default();
    let pv = pb.value(DType::F32, vec![Dim::Tokens, fx(c.e)], false);
    let ids = pb.step(
        Op::TopK,
        Attrs::TopK { k: c.k },
        vec![v(pv)],
        DType::I32,
        vec![Dim::Tokens, fx(c.k)],
    );
    pb.step(
        Op::GatherRenorm,
        Attrs::GatherRenorm {
            renorm: true,
            scale: 1.5,
        },
        vec![v(pv), v(ids)],
        DType::F32,
        vec![Dim::Tokens, fx(c.k)],
    );
    let vals = run_oracle(&pb, &[(pv, f32s(&p))], c.rows, 1, &mut []);
    let steps = if vals[ids].iter().all(|&i| i as i32 >= 0) {
        2
    } else {
        1
    };
    for i in 0..steps {
        let at = StepIn {
            i,
            ..one_step(&pb, &vals, &[], c.rows, 1)
        };
        check_step(x, "router", at, &[], c.warp);
    }
}

/// Routed experts, fused gate/up: Q2_K gate/up, down F32 (rows of 48) and Q3_K / Q4_K (rows of
/// 256; Q2_K / Q3_K are the bundled model's types), at one token (the mat-vec forms) and two
/// or three (the mat-mat forms), one width each.
pub fn moe_ffn(x: &dyn Exec) {
    // One token runs the mat-vec forms, more the mat-mat forms: the bundled model's down type
    // (Q3_K) in both.
    let cases = [
        (1usize, 3u64, "F32"),
        (1, 6, "Q3_K"),
        (3, 4, "Q3_K"),
        (2, 5, "Q4_K"),
    ];
    for (i, (t, seed, down)) in cases.into_iter().enumerate() {
        let (d, n_exp, k) = (256usize, 6usize, 2usize);
        let n_ff = if down == "F32" { 48 } else { 256 };
        let gu = W::random("Q2_K", vec![d, 2 * n_ff, n_exp], seed, 0.3);
        let dn = if down == "F32" {
            W::f32(vec![n_ff, d, n_exp], &vals(seed ^ 9, n_ff * d * n_exp, 0.5))
        } else {
            W::random(down, vec![n_ff, d, n_exp], seed ^ 9, 0.5)
        };
        let h = vals(seed ^ 5, t * d, 1.0);
        let mut g = rng(seed);
        let ids: Vec<i32> = (0..t * k)
            .map(|i| ((i / k * 3 + i % k * 2 + g.random_range(0..2)) % n_exp) as i32)
            .collect();
        let wts: Vec<f32> = (0..t * k).map(|_| g.random::<f32>()).collect();
        let mut pb = PlanB::default();
        let hv = pb.value(DType::F32, vec![Dim::Tokens, fx(d)], false);
        let iv = pb.value(DType::I32, vec![Dim::Tokens, fx(k)], false);
        let wv = pb.value(DType::F32, vec![Dim::Tokens, fx(k)], false);
        let gw = pb.weight(gu);
        let dw = pb.weight(dn);
        pb.step(
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
        let inputs = [(hv, f32s(&h)), (iv, i32s(&ids)), (wv, f32s(&wts))];
        check_steps(x, "moe_ffn", &pb, &inputs, (t, 1), &mut [], width(x, i));
    }
}

/// The types of [`embed_silu_concat_rope`]'s table: the bundled model's and an IQ2 one.
pub const EMBED_TYPES: [&str; 2] = ["Q2_K", "IQ2_XXS"];

/// Embedding lookup (a table of `ty`), SiLU, a concat copy and RoPE with YaRN at positions up
/// to 262 143.
pub fn embed_silu_concat_rope(x: &dyn Exec, ty: &str) {
    let (d, vocab, t) = (256usize, 7usize, 3usize);
    let table = W::random(ty, vec![d, vocab], 21, 0.7);
    let ids = vec![6i32, 0, 3];
    let mut pb = PlanB::default();
    let iv = pb.value(DType::I32, vec![Dim::Tokens], false);
    let tw = pb.weight(table);
    let row = |n| vec![Dim::Tokens, fx(n)];
    let e = pb.step(Op::Embed, Attrs::None, vec![tw, v(iv)], DType::F32, row(d));
    let s = pb.step(Op::Silu, Attrs::None, vec![v(e)], DType::F32, row(d));
    pb.step(
        Op::Concat,
        Attrs::None,
        vec![v(e), v(s)],
        DType::F32,
        row(2 * d),
    );
    let pv = pb.value(DType::I32, vec![Dim::Tokens], false);
    pb.step(
        Op::RopeYarn,
        Attrs::Rope(yarn(64, true)),
        vec![v(e), v(pv)],
        DType::F32,
        row(d),
    );
    let pos = vec![5i32, 70_000, 262_143];
    let inputs = [(iv, i32s(&ids)), (pv, i32s(&pos))];
    check_steps(
        x,
        &format!("embed {ty}/silu/concat/rope"),
        &pb,
        &inputs,
        (t, 262_144),
        &mut [],
        width(x, 1),
    );
}

/// Softmax over rows of `S` (the unfused attention's), across a block boundary of keys, at
/// every width of the executor.
pub fn softmax_over_keys(x: &dyn Exec) {
    let (t, heads, s) = (2usize, 3usize, 700usize);
    let xs = vals(77, t * heads * s, 4.0);
    let mut pb = PlanB::default();
    let shape = vec![Dim::Tokens, fx(heads), Dim::Keys];
    let xv = pb.value(DType::F32, shape.clone(), false);
    pb.step(Op::Softmax, Attrs::None, vec![v(xv)], DType::F32, shape);
    for warp in x.widths() {
        let inputs = [(xv, f32s(&xs))];
        check_steps(x, "softmax over S", &pb, &inputs, (t, s), &mut [], warp);
    }
}

/// Device argmax (greedy sampling; not a plan step) against a plain first-maximum scan, with
/// ties, NaN and −∞.
pub fn argmax(x: &dyn Exec) {
    let (n, rows) = (1000usize, 4usize);
    let mut xs: Vec<f32> = vals(31, rows * n, 1.0)
        .iter()
        .map(|v| (v * 8.0).round())
        .collect();
    xs[3] = f32::NAN;
    xs[n + 700] = 1e30;
    xs[n + 999] = 1e30;
    for v in &mut xs[2 * n..3 * n] {
        *v = f32::NEG_INFINITY;
    }
    for v in &mut xs[3 * n..4 * n] {
        *v = f32::NAN;
    }
    let want: Vec<i32> = xs
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
        width(x, 1),
    )
    .expect("kernel");
    let mut got = vec![0i32; rows];
    x.run(&k, &mut [Arg::F32(&mut xs), Arg::I32(&mut got)], rows, 1);
    assert_eq!(got, want);
    assert_eq!(&want[1..4], &[700, 0, -1]);
}
