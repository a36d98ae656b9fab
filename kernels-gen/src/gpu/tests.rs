//! Tests of the kernel IR, its CPU execution and the emitters: faults the execution must catch,
//! the reduction tree it must follow, and every builder's kernel printed in both dialects and
//! compiled with clang-19 (HIP for gfx1201, gfx1100, gfx942; CUDA to PTX for sm_90) when clang-19
//! is installed (CI installs it; elsewhere the compile test says it was skipped).

use super::cpu_exec::{self, Arg, ExecError};
use super::emit::{Cuda, Hip};
use super::ir::{block_reduce, ci, tid, Expr, Kb, Kernel, ReduceOp, Scalar, Size};
use super::kernels::*;
use super::steps;
use aubier_compiler::config::{QueryTemperature, YarnParams};
use aubier_compiler::ops::Op;

fn no_dequant(_: &str, _: &[u8], _: usize, _: &mut [f32; 16]) -> Result<(), String> {
    Err("no quant types in this test".into())
}

fn yarn() -> YarnParams {
    YarnParams {
        n_rot: 64,
        freq_base: 10000.0,
        factor: 128.0,
        original_context: 8192,
        beta_fast: 32.0,
        beta_slow: 1.0,
        attn_factor: 1.0,
        log_multiplier: 0.1,
    }
}

/// One kernel of every builder for warps of `warp` lanes, at the real model's shapes, with the
/// weight types of a 2-bit file.
fn every_kernel(warp: u32) -> Vec<Kernel> {
    let w = |ty: &str, n: usize| WeightSpec {
        ggml_type: ty.into(),
        row_len: n,
    };
    let kq = KqkvShape {
        name: "kqkv".into(),
        heads: 32,
        width: 320,
        kv_lora: 256,
        kq_scale: 0.194_975,
    };
    let rows = Size::Tokens;
    let mut out = vec![
        phase(
            &PhaseShape {
                name: "phase".into(),
                heads: 32,
                nope: 64,
                kv_lora: 256,
                rope_dim: 64,
                rope: yarn(),
                eps: 1e-6,
                temperature: Some(QueryTemperature {
                    scale: 0.1,
                    length: 8192,
                }),
            },
            warp,
        ),
        kqkv_split(&kq, warp),
        kqkv_merge(&kq, warp),
        steps::embed("embed", &w("Q4_K", 4096), &rows, warp),
        steps::rms_norm("rms_norm", 4096, &rows, 1e-6, warp),
        steps::elementwise(
            "add",
            Op::Add,
            &Size::prod(Size::Tokens, Size::Const(4096)),
            0.0,
            warp,
        ),
        steps::elementwise(
            "silu",
            Op::Silu,
            &Size::prod(Size::Tokens, Size::Const(4096)),
            0.0,
            warp,
        ),
        steps::softmax("softmax", &Size::Const(128), &rows, warp),
        steps::softmax(
            "softmax_s",
            &Size::Keys,
            &Size::prod(Size::Tokens, Size::Const(32)),
            warp,
        ),
        steps::rope("rope", 64, 32, &yarn(), warp),
        steps::temperature(
            "temperature",
            32 * 320,
            &QueryTemperature {
                scale: 0.1,
                length: 8192,
            },
            warp,
        ),
        steps::copy_rows("concat", &rows, 256, 0, 256, 64, warp),
        steps::cache_write("cache_write", 320, warp),
        steps::scores_qk(
            "scores_qk",
            320,
            &Size::prod(Size::Tokens, Size::Const(32)),
            warp,
        ),
        steps::causal_mask(
            "causal_mask",
            32,
            &Size::prod(Size::Tokens, Size::Const(32)),
            warp,
        ),
        steps::weighted_sum(
            "weighted_sum",
            320,
            256,
            &Size::prod(Size::Tokens, Size::Const(32)),
            warp,
        ),
        steps::top_k("top_k", 128, 4, &rows, warp),
        steps::gather_renorm("gather_renorm", 128, 4, &rows, true, 1.0, warp),
        steps::moe_gate_up("moe_gate_up", &w("IQ2_XXS", 4096), None, 2048, 4, warp),
        steps::moe_down("moe_down", &w("Q2_K", 2048), 4096, 4, warp),
        steps::moe_route("moe_route", 128, 4, warp),
        steps::moe_gate_up_mm(
            "moe_gate_up_mm",
            &w("IQ2_XXS", 4096),
            None,
            2048,
            4,
            128,
            warp,
        ),
        steps::moe_down_mm("moe_down_mm", &w("Q2_K", 2048), 4096, 4, 128, warp),
        steps::moe_combine("moe_combine", 4096, 4, warp),
        steps::argmax("argmax", 131_072, &rows, warp),
    ];
    for ty in [
        "F32", "F16", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "Q2_K", "Q3_K", "IQ2_XXS", "IQ2_XS",
        "IQ3_XXS", "IQ4_XS", "IQ1_S",
    ] {
        let s = MatVecShape {
            name: format!("mat_mul_{}", ty.to_ascii_lowercase()),
            w: w(ty, 4096),
            n_out: 1024,
            heads: 1,
            tail: 0,
            rows: Size::Tokens,
        };
        out.push(mat_vec(&s, warp));
        out.push(mat_mat(&s, warp));
    }
    let wkb_in = MatVecShape {
        name: "wkb_in".into(),
        w: w("Q8_0", 64),
        n_out: 256,
        heads: 32,
        tail: 64,
        rows: Size::Tokens,
    };
    out.push(mat_vec(&wkb_in, warp));
    out.push(mat_mat(&wkb_in, warp));
    out.into_iter().map(|k| k.expect("builder")).collect()
}

/// The warp widths a kernel may be built for.
const WIDTHS: [u32; 5] = [4, 8, 16, 32, 64];

/// A stand-in for a quant type's dequant in the mat-mat test: element `i` of chunk `c` made from
/// one byte of the row, with mixed signs and exponents (so a different order of summation shows
/// in the bits).
fn bytes_dequant(_: &str, row: &[u8], c: usize, out: &mut [f32; 16]) -> Result<(), String> {
    for (i, o) in out.iter_mut().enumerate() {
        let b = row[(16 * c + i) * 7 % row.len()];
        *o = (f32::from(b) - 127.5) * 2f32.powi((b % 9) as i32 - 4);
    }
    Ok(())
}

/// Deterministic values in about ±`scale` with varied exponents, from `seed`.
fn mixed_vals(seed: u64, n: usize, scale: f32) -> Vec<f32> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let u = (x >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            u * scale * 2f32.powi((x % 5) as i32 - 2)
        })
        .collect()
}

/// Runs `k` on weight bytes `w` and `x` at `T = t`; `y` starts as a NaN pattern no kernel writes.
fn run_product(k: &Kernel, w: &[u8], x: &[f32], y_len: usize, t: usize) -> Vec<u32> {
    let mut x = x.to_vec();
    let mut y = vec![f32::from_bits(0x7fc0_dead); y_len];
    cpu_exec::run(
        k,
        &mut [Arg::Weight(w), Arg::F32(&mut x), Arg::F32(&mut y)],
        t,
        1,
        &bytes_dequant,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    y.iter().map(|v| v.to_bits()).collect()
}

/// The mat-mat computes the mat-vec's bits for every output at T = 2, 5 and 64 (partial and
/// whole token tiles, several K slices, rows past a block's end, one and several rows per warp,
/// F32 rows that are not whole chunks, several heads with a copied tail), at every warp width; every output is written. The
/// values make the order of summation visible: the mat-vec's bits differ between widths.
#[test]
fn mat_mat_matches_the_mat_vec_bit_for_bit() {
    let mut by_width: Vec<Vec<u32>> = Vec::new();
    let shapes = [
        ("F32", 1000, 20, 1, 0),
        ("Q8_0", 1536, 37, 1, 0),
        ("Q8_0", 64, 24, 3, 5),
        // Several blocks of several rows per warp, the last block part full.
        ("Q8_0", 32, 2085, 1, 0),
    ];
    for warp in WIDTHS {
        for (i, &(ty, n_in, n_out, heads, tail)) in shapes.iter().enumerate() {
            let s = MatVecShape {
                name: "mm".into(),
                w: WeightSpec {
                    ggml_type: ty.into(),
                    row_len: n_in,
                },
                n_out,
                heads,
                tail,
                rows: Size::Tokens,
            };
            let (mv, mm) = (
                mat_vec(&s, warp).expect("mv"),
                mat_mat(&s, warp).expect("mm"),
            );
            let w: Vec<u8> = if ty == "F32" {
                mixed_vals(i as u64 + 3, n_in * n_out * heads, 1.0)
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect()
            } else {
                let rb = n_in / 32 * 34;
                (0..rb * n_out * heads)
                    .map(|j| (j * 131 % 251) as u8)
                    .collect()
            };
            for t in [2, 5, 64] {
                let x = mixed_vals(t as u64 * 31 + i as u64, t * heads * (n_in + tail), 3.0);
                let y_len = t * heads * (n_out + tail);
                let want = run_product(&mv, &w, &x, y_len, t);
                let got = run_product(&mm, &w, &x, y_len, t);
                assert!(
                    want.iter().all(|&b| b != 0x7fc0_dead),
                    "{ty} warp {warp} T {t}: the mat-vec left outputs unwritten"
                );
                for (j, (g, e)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(
                        g, e,
                        "{ty} [{n_out}x{n_in}] x{heads} tail {tail}, warp {warp}, T {t}: output {j}: \
                         mat-mat {:e}, mat-vec {:e}",
                        f32::from_bits(*g),
                        f32::from_bits(*e)
                    );
                }
                if (i, t) == (0, 64) {
                    by_width.push(want);
                }
            }
        }
    }
    assert!(
        by_width.windows(2).any(|p| p[0] != p[1]),
        "every width gave the same bits: the case cannot tell orders of summation apart"
    );
}

/// The routed experts' mat-mat forms ([`steps::moe_route`], [`steps::moe_gate_up_mm`],
/// [`steps::moe_down_mm`], [`steps::moe_combine`]) compute the mat-vecs' `act` and `y` bits at
/// T = 2, 5 and 64 at every warp width: one expert takes every token (many full tiles), two
/// share the other slot, three stay empty, one id is negative (read as expert 0); K spans
/// several slices, output rows end inside a block at some widths, and a warp takes one or
/// several rows.
#[test]
fn moe_mat_mat_matches_the_mat_vec_bit_for_bit() {
    let (d, n_ff, k, n_exp) = (544usize, 160usize, 2usize, 6usize);
    let spec = |n| WeightSpec {
        ggml_type: "Q8_0".into(),
        row_len: n,
    };
    let bytes = |n: usize, rows: usize, seed: usize| -> Vec<Vec<u8>> {
        (0..n_exp)
            .map(|e| {
                (0..n / 32 * 34 * rows)
                    .map(|j| ((j * 131 + e * 71 + seed) % 251) as u8)
                    .collect()
            })
            .collect()
    };
    let (gu, dn) = (bytes(d, 2 * n_ff, 1), bytes(n_ff, d, 2));
    let gu: Vec<&[u8]> = gu.iter().map(|v| v.as_slice()).collect();
    let dn: Vec<&[u8]> = dn.iter().map(|v| v.as_slice()).collect();
    let run = |k: &Kernel, args: &mut [Arg<'_>], t: usize| {
        cpu_exec::run(k, args, t, 1, &bytes_dequant).unwrap_or_else(|e| panic!("{e}"));
    };
    for warp in WIDTHS {
        let gate_up = steps::moe_gate_up("gu", &spec(d), None, n_ff, k, warp).expect("gu");
        let down = steps::moe_down("dn", &spec(n_ff), d, k, warp).expect("dn");
        let route = steps::moe_route("route", n_exp, k, warp).expect("route");
        let gate_up_mm =
            steps::moe_gate_up_mm("gu_mm", &spec(d), None, n_ff, k, n_exp, warp).expect("gu mm");
        let down_mm = steps::moe_down_mm("dn_mm", &spec(n_ff), d, k, n_exp, warp).expect("dn mm");
        let combine = steps::moe_combine("combine", d, k, warp).expect("combine");
        for t in [2usize, 5, 64] {
            let mut ids: Vec<i32> = (0..t * k)
                .map(|s| if s % k == 0 { 1 } else { [3, 4][s / k % 2] })
                .collect();
            ids[k * (t - 1)] = -1;
            let mut h = mixed_vals(t as u64 * 7 + 1, t * d, 2.0);
            let mut wts = mixed_vals(t as u64 * 5 + 2, t * k, 1.0);
            let unwritten = f32::from_bits(0x7fc0_dead);
            let mut act = vec![unwritten; t * k * n_ff];
            let mut y = vec![unwritten; t * d];
            let mut ids_mv = ids.clone();
            run(
                &gate_up,
                &mut [
                    Arg::F32(&mut h),
                    Arg::I32(&mut ids_mv),
                    Arg::Experts(&gu),
                    Arg::F32(&mut act),
                ],
                t,
            );
            run(
                &down,
                &mut [
                    Arg::I32(&mut ids_mv),
                    Arg::F32(&mut wts),
                    Arg::Experts(&dn),
                    Arg::F32(&mut act),
                    Arg::F32(&mut y),
                ],
                t,
            );
            let route_len = route.params[1].1.clone();
            let route_len = match route_len {
                super::ir::ParamKind::I32 { len: Some(l), .. } => l.eval(t, 1).expect("len"),
                other => panic!("route is {other:?}"),
            };
            let mut routes = vec![i32::MIN; route_len];
            let mut act_mm = vec![unwritten; t * k * n_ff];
            let mut part = vec![unwritten; t * k * d];
            let mut y_mm = vec![unwritten; t * d];
            run(&route, &mut [Arg::I32(&mut ids), Arg::I32(&mut routes)], t);
            run(
                &gate_up_mm,
                &mut [
                    Arg::F32(&mut h),
                    Arg::Experts(&gu),
                    Arg::F32(&mut act_mm),
                    Arg::I32(&mut routes),
                ],
                t,
            );
            run(
                &down_mm,
                &mut [
                    Arg::Experts(&dn),
                    Arg::F32(&mut act_mm),
                    Arg::I32(&mut routes),
                    Arg::F32(&mut part),
                ],
                t,
            );
            run(
                &combine,
                &mut [Arg::F32(&mut wts), Arg::F32(&mut part), Arg::F32(&mut y_mm)],
                t,
            );
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
            for (what, want, got) in [("act", &act, &act_mm), ("y", &y, &y_mm)] {
                let (want, got) = (bits(want), bits(got));
                for (j, (g, e)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        *e != 0x7fc0_dead && g == e,
                        "warp {warp} T {t}: {what}[{j}]: mat-mat {:e}, mat-vec {:e}",
                        f32::from_bits(*g),
                        f32::from_bits(*e)
                    );
                }
            }
        }
    }
}

/// A weight product's mat-vec launches at T = 1 alone and its mat-mat at T > 1 alone.
#[test]
fn both_forms_split_the_runs_by_length() {
    let s = MatVecShape {
        name: "mat_mul".into(),
        w: WeightSpec {
            ggml_type: "Q8_0".into(),
            row_len: 256,
        },
        n_out: 100,
        heads: 1,
        tail: 0,
        rows: Size::Tokens,
    };
    let ks = steps::both_forms(&s, 32).expect("forms");
    let blocks = |k: &Kernel, t: usize| {
        k.grid
            .iter()
            .map(|g| g.eval(t, 1).expect("grid"))
            .product::<usize>()
    };
    assert_eq!(ks.len(), 2);
    assert_eq!(
        (ks[0].name.as_str(), ks[1].name.as_str()),
        ("mat_mul", "mat_mul_mm")
    );
    // The mat-vec: 100 rows in blocks of 8 warps; the mat-mat: 4 rows per warp, 32 per block,
    // and a block row per 8 tokens.
    assert_eq!((blocks(&ks[0], 1), blocks(&ks[1], 1)), (13, 0));
    assert_eq!((blocks(&ks[0], 2), blocks(&ks[1], 2)), (0, 4));
    assert_eq!((blocks(&ks[0], 64), blocks(&ks[1], 64)), (0, 4 * 8));
}

#[test]
fn every_builder_type_checks_at_every_width() {
    for warp in WIDTHS {
        let ks = every_kernel(warp);
        assert!(ks.len() > 30);
        for k in &ks {
            assert_eq!(k.warp, warp);
            k.check().expect("checked");
        }
    }
}

/// A butterfly sum over all of `v` (its length a power of two): every lane ends with the same
/// bits, lane 0's are returned.
fn butterfly(v: &[f32]) -> f32 {
    let mut cur = v.to_vec();
    let mut off = cur.len() / 2;
    while off > 0 {
        cur = (0..cur.len()).map(|l| cur[l] + cur[l ^ off]).collect();
        off /= 2;
    }
    cur[0]
}

/// The documented tree of `block_reduce` (sum) for `xs.len()` threads in warps of `w` lanes.
fn block_reduce_tree(xs: &[f32], w: usize) -> f32 {
    let mut parts: Vec<f32> = xs.chunks(w).map(butterfly).collect();
    if parts.len() == 1 {
        return parts[0];
    }
    while parts.len() > w {
        parts.resize(parts.len().div_ceil(w) * w, 0.0);
        parts = parts.chunks(w).map(butterfly).collect();
    }
    parts.resize(w, 0.0);
    butterfly(&parts)
}

/// A one-block kernel: `y[tid] = block_reduce(op, x[tid])`.
fn block_reduce_kernel(block: u32, warp: u32, op: ReduceOp) -> Kernel {
    let n = block as usize;
    let mut kb = Kb::new("red", "test", [Size::Const(1), Size::Const(1)], block, warp);
    let x = kb.input_f32("x", Size::Const(n));
    let y = kb.output_f32("y", Some(Size::Const(n)));
    let sh = kb.reduce_scratch();
    let v = kb.let_("v", kb.load(x, tid()));
    block_reduce(&mut kb, op, v, sh);
    kb.store(y, tid(), v);
    kb.finish().expect("kernel")
}

/// Runs a one-block kernel with parameters `x` (input) and `y` (output, as long as `x`).
fn run_xy(k: &Kernel, xs: &mut [f32]) -> Result<Vec<f32>, ExecError> {
    let mut out = vec![0f32; xs.len()];
    cpu_exec::run(
        k,
        &mut [Arg::F32(xs), Arg::F32(&mut out)],
        1,
        1,
        &no_dequant,
    )?;
    Ok(out)
}

/// The block reduction follows the documented tree at every width, including more partials
/// than a warp has lanes (block 256 in warps of 4: 64 → 16 → 4 → 1), and every thread gets the
/// total. Values chosen so that a different association gives different bits.
#[test]
fn block_reduce_follows_the_tree_at_every_width() {
    for warp in WIDTHS {
        for block in [64u32, 128, 192, 256] {
            if !block.is_multiple_of(warp) {
                continue;
            }
            let n = block as usize;
            let mut xs: Vec<f32> = (0..n)
                .map(|i| 1.0 + (i as f32) * 1e-7 * (i % 7) as f32)
                .collect();
            xs[5] = 1e8;
            xs[n - 51] = -1e8;
            let want = block_reduce_tree(&xs, warp as usize);
            let k = block_reduce_kernel(block, warp, ReduceOp::Sum);
            let out = run_xy(&k, &mut xs).expect("run");
            for (t, o) in out.iter().enumerate() {
                assert_eq!(
                    o.to_bits(),
                    want.to_bits(),
                    "warp {warp} block {block} thread {t}"
                );
            }

            let mut xs: Vec<f32> = (0..n).map(|i| ((i * 37) % n) as f32 - 9.0).collect();
            xs[n / 3] = f32::NEG_INFINITY;
            let k = block_reduce_kernel(block, warp, ReduceOp::Max);
            let out = run_xy(&k, &mut xs).expect("run");
            let max = (n - 1) as f32 - 9.0;
            assert!(
                out.iter().all(|&o| o == max),
                "max: warp {warp} block {block}"
            );
        }
    }
}

/// A width that is not a power of two in 4..=64, or wider than the block, is refused by the
/// checker, the builders, the plan mapping and the CPU execution.
#[test]
fn bad_widths_are_refused() {
    for (block, warp) in [(96, 12), (256, 2), (256, 128), (32, 64), (256, 0), (100, 8)] {
        let kb = Kb::new("w", "test", [Size::Const(1), Size::Const(1)], block, warp);
        assert!(kb.finish().is_err(), "block {block} warp {warp}");
    }
    assert!(steps::rms_norm("rms_norm", 64, &Size::Tokens, 1e-6, 24).is_err());
    assert!(steps::rms_norm("rms_norm", 64, &Size::Tokens, 1e-6, 512).is_err());
    let mut k = block_reduce_kernel(64, 8, ReduceOp::Sum);
    k.warp = 6;
    let e = run_xy(&k, &mut [0f32; 64]).expect_err("a 6-lane warp");
    assert!(matches!(e, ExecError::Invalid(_)), "{e}");
}

/// A warp reduction spans the kernel's own width: at width 8, lanes 0..8 form one group (legal
/// under `tid < 8`, each lane ends with its group's sum); at width 32 the same branch is a fault.
#[test]
fn warp_reduce_spans_the_kernel_width() {
    let build = |warp: u32| {
        let mut kb = Kb::new("wr", "test", [Size::Const(1), Size::Const(1)], 64, warp);
        let x = kb.input_f32("x", Size::Const(64));
        let y = kb.output_f32("y", Some(Size::Const(64)));
        let v = kb.let_("v", kb.load(x, tid()));
        kb.if_(tid().lt(ci(8)), |kb| kb.warp_reduce(ReduceOp::Sum, v));
        kb.store(y, tid(), v);
        kb.finish().expect("kernel")
    };
    let mut xs: Vec<f32> = (0..64).map(|i| i as f32).collect();
    let out = run_xy(&build(8), &mut xs).expect("whole 8-lane group");
    assert!(out[..8].iter().all(|&o| o == 28.0), "{out:?}");
    assert_eq!(&out[8..], &xs[8..]);
    let e = run_xy(&build(32), &mut xs).expect_err("part of a 32-lane warp");
    assert!(matches!(e, ExecError::Fault { .. }), "{e}");
}

/// HIP and CUDA print 32-lane kernels only; a kernel of another width is an error, and kernels
/// of different widths get different names.
#[test]
fn emitters_refuse_other_widths_and_names_include_the_width() {
    let k8 = block_reduce_kernel(64, 8, ReduceOp::Sum);
    for r in [
        super::render(&Hip, &k8, &[]),
        super::render(&Cuda, &k8, &[]),
    ] {
        assert!(
            matches!(r, Err(super::GenError::Warp { warp: 8, .. })),
            "{r:?}"
        );
    }
    let k32 = block_reduce_kernel(64, super::emit::WARP, ReduceOp::Sum);
    assert!(super::render(&Hip, &k32, &[]).is_ok());
    let names: Vec<String> = WIDTHS
        .iter()
        .map(|&w| super::name_by_content(block_reduce_kernel(64, w, ReduceOp::Sum)).name)
        .collect();
    for (i, a) in names.iter().enumerate() {
        assert!(!names[i + 1..].contains(a), "{names:?}");
    }
}

#[test]
fn execution_catches_out_of_bounds_and_divergent_barriers() {
    let mut kb = Kb::new("oob", "test", [Size::Const(2), Size::Const(1)], 32, 32);
    let x = kb.input_f32("x", Size::Const(32));
    let y = kb.output_f32("y", Some(Size::Const(32)));
    let v = kb.load(x, super::ir::bx() * 32 + tid());
    kb.store(y, tid(), v);
    let k = kb.finish().expect("kernel");
    let (mut a, mut b) = (vec![0f32; 32], vec![0f32; 32]);
    let e = cpu_exec::run(
        &k,
        &mut [Arg::F32(&mut a), Arg::F32(&mut b)],
        1,
        1,
        &no_dequant,
    )
    .expect_err("block 1 reads past x");
    assert!(matches!(e, ExecError::OutOfBounds { index: 32, .. }), "{e}");

    let mut kb = Kb::new("div", "test", [Size::Const(1), Size::Const(1)], 64, 32);
    kb.if_(tid().lt(ci(10)), |kb| kb.barrier());
    let k = kb.finish().expect("kernel");
    let e = cpu_exec::run(&k, &mut [], 1, 1, &no_dequant).expect_err("divergent barrier");
    assert!(matches!(e, ExecError::Fault { .. }), "{e}");

    let mut kb = Kb::new("bind", "test", [Size::Const(1), Size::Const(1)], 32, 32);
    kb.input_f32("x", Size::prod(Size::Tokens, Size::Const(4)));
    let k = kb.finish().expect("kernel");
    let mut short = vec![0f32; 7];
    let e = cpu_exec::run(&k, &mut [Arg::F32(&mut short)], 2, 1, &no_dequant).expect_err("short");
    assert!(matches!(e, ExecError::Binding { .. }), "{e}");
}

#[test]
fn ill_typed_kernels_are_refused() {
    let mut kb = Kb::new("bad", "test", [Size::Const(1), Size::Const(1)], 32, 32);
    let v = kb.let_("v", 1.0f32);
    kb.set(v, tid());
    assert!(kb.finish().is_err());
    let kb = Kb::new(
        "bad_block",
        "test",
        [Size::Const(1), Size::Const(1)],
        48,
        32,
    );
    assert!(kb.finish().is_err());
    let mut kb = Kb::new("bad_mix", "test", [Size::Const(1), Size::Const(1)], 32, 32);
    kb.let_("v", Expr::F(1.0) + tid());
    assert!(kb.finish().is_err());
}

/// A vector shared load reads elements `4·idx .. 4·idx + 4` into its four registers (the
/// staging writes element `j` with value `j`, so each register must hold its own index), a read
/// past the array's end is caught, and an array that is not f32 of a length that is a multiple
/// of 4 is refused.
#[test]
fn vector_shared_loads_read_four_consecutive_elements() {
    let mut kb = Kb::new("ld4", "test", [Size::Const(1), Size::Const(1)], 32, 32);
    let x = kb.input_f32("x", Size::Const(32));
    let y = kb.output_f32("y", Some(Size::Const(128)));
    let s = kb.shared("s", Scalar::F32, 128);
    kb.for_("j", tid(), ci(128), 32, |kb, j| {
        let v = j.clone().to_f32() + kb.load(x, 0);
        kb.sts(s, j, v);
    });
    kb.barrier();
    // Thread t reads vector 31 − t: elements 124 − 4t .. 128 − 4t.
    let q = kb.lds4("q", s, ci(31) - tid());
    for (c, v) in q.iter().enumerate() {
        kb.store(y, tid() * 4 + ci(c), *v);
    }
    let k = kb.finish().expect("kernel");
    let mut xs = vec![0f32; 32];
    let mut out = vec![0f32; 128];
    cpu_exec::run(
        &k,
        &mut [Arg::F32(&mut xs), Arg::F32(&mut out)],
        1,
        1,
        &no_dequant,
    )
    .expect("run");
    for t in 0..32 {
        for c in 0..4 {
            assert_eq!(
                out[4 * t + c],
                (4 * (31 - t) + c) as f32,
                "thread {t}, element {c}"
            );
        }
    }
    for warp in [4, 8, 16, 32, 64] {
        assert_eq!(mat_mat_tokens(warp) % 4, 0, "tokens per tile at W = {warp}");
    }

    let mut kb = Kb::new("ld4_oob", "test", [Size::Const(1), Size::Const(1)], 32, 32);
    let y = kb.output_f32("y", Some(Size::Const(32)));
    let s = kb.shared("s", Scalar::F32, 8);
    let q = kb.lds4("q", s, tid());
    kb.store(y, tid(), q[0]);
    let k = kb.finish().expect("kernel");
    let mut out = vec![0f32; 32];
    let e = cpu_exec::run(&k, &mut [Arg::F32(&mut out)], 1, 1, &no_dequant)
        .expect_err("thread 2 reads past s");
    assert!(matches!(e, ExecError::OutOfBounds { index: 8, .. }), "{e}");

    for (ty, len) in [(Scalar::F32, 6), (Scalar::I32, 8)] {
        let mut kb = Kb::new("ld4_bad", "test", [Size::Const(1), Size::Const(1)], 32, 32);
        let s = kb.shared("s", ty, len);
        kb.lds4("q", s, 0);
        assert!(kb.finish().is_err(), "{ty:?} × {len}");
    }
}

/// Rows per warp of a mat-mat: 8 weight rows at `W ≤ 8` and 4 above (gate and up counting as
/// two), never more than one block needs to cover the product's rows.
#[test]
fn mat_mat_rows_per_warp_follow_the_width_and_the_product() {
    assert_eq!(mat_mat_rows_per_warp(1, 4096, 8), 8);
    assert_eq!(mat_mat_rows_per_warp(2, 2048, 8), 4);
    assert_eq!(mat_mat_rows_per_warp(1, 4096, 32), 4);
    assert_eq!(mat_mat_rows_per_warp(2, 2048, 32), 2);
    assert_eq!(mat_mat_rows_per_warp(1, 4096, 64), 4);
    // 8 rows: one block of 32 warps (W = 8) covers them with one row each.
    assert_eq!(mat_mat_rows_per_warp(1, 8, 8), 1);
    // 37 rows at W = 8: two rows per warp cover 64.
    assert_eq!(mat_mat_rows_per_warp(1, 37, 8), 2);
}

fn clang() -> Option<&'static str> {
    std::process::Command::new("clang-19")
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|_| "clang-19")
}

/// Every builder's kernel compiles for the three AMD targets and to PTX.
#[test]
fn every_kernel_compiles_with_clang() {
    let Some(cc) = clang() else {
        panic!("clang-19 could not be run; the GPU emitter tests need it: apt-get install -y clang-19 lld-19");
    };
    let dir = std::env::temp_dir().join(format!("aubier-gpu-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    // One translation unit per dialect keeps the test short: the kernels have distinct names.
    let ks = every_kernel(super::emit::WARP);
    let mut failures = Vec::new();
    for (i, k) in ks.iter().enumerate() {
        let hip = super::render(&Hip, k, &[]).expect("hip");
        let cu = super::render(&Cuda, k, &[]).expect("cuda");
        let hp = dir.join(format!("k{i}.hip"));
        let cp = dir.join(format!("k{i}.cu"));
        std::fs::write(&hp, hip).expect("write");
        std::fs::write(&cp, cu).expect("write");
        for arch in ["gfx1201", "gfx1100", "gfx942"] {
            let out = std::process::Command::new(cc)
                .args([
                    "-x",
                    "hip",
                    &format!("--offload-arch={arch}"),
                    "-nogpuinc",
                    "-nogpulib",
                ])
                .args([
                    "--cuda-device-only",
                    "--no-gpu-bundle-output",
                    "-O3",
                    "-fuse-ld=lld",
                ])
                .arg(&hp)
                .arg("-o")
                .arg(dir.join(format!("k{i}_{arch}.co")))
                .output()
                .expect("clang runs");
            if !out.status.success() {
                failures.push(format!(
                    "{} {arch}:\n{}",
                    k.name,
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
        }
        let out = std::process::Command::new(cc)
            .args([
                "-x",
                "cuda",
                "--cuda-gpu-arch=sm_90",
                "-nocudainc",
                "-nocudalib",
            ])
            .args([
                "--cuda-device-only",
                "-Xclang",
                "-target-feature",
                "-Xclang",
                "+ptx80",
                "-O3",
                "-S",
            ])
            .arg(&cp)
            .arg("-o")
            .arg(dir.join(format!("k{i}.ptx")))
            .output()
            .expect("clang runs");
        if !out.status.success() {
            failures.push(format!(
                "{} cuda:\n{}",
                k.name,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        if !failures.is_empty() {
            break;
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Every builder's kernel renders as a Vulkan GLSL compute shader with the ABI's push constants
/// (8 bytes per parameter, then the address of the extents `T`, `S`) and the reduction width of
/// the IR.
#[test]
fn every_kernel_renders_as_glsl() {
    use super::glsl::{push_constant_bytes, render_glsl};
    for k in [8, 32, 64].into_iter().flat_map(every_kernel) {
        let text = render_glsl(&k, &["header".to_string()]).expect("renders");
        assert!(text.starts_with("#version 460\n"), "{}", k.name);
        assert!(text.contains(&format!("layout(local_size_x = {}) in;", k.block)));
        assert!(text.contains("  AubierI32 extents;\n} args;"), "{}", k.name);
        assert_eq!(push_constant_bytes(&k), 8 * k.params.len() as u32 + 8);
    }
}

/// The C++ device math ([`super::math::device_math`]), compiled for the host with clang-19 as the
/// kernels compile it (`#pragma clang fp contract(off)`, `__device__` empty), gives the bits of
/// the Rust functions on a sweep of f32 bit patterns with NaN, ±∞, ±0 and subnormals (the GLSL
/// text is held to the same on lavapipe by `tests/kernels_vulkan.rs`).
#[test]
fn cpp_device_math_matches_the_rust_functions_bit_for_bit() {
    use super::math::{cos, device_math, exp, ln, sin};
    use super::quant::Lang;
    let Some(cc) = clang() else {
        panic!("clang-19 could not be run; the GPU emitter tests need it: apt-get install -y clang-19 lld-19");
    };
    let dir = std::env::temp_dir().join(format!("aubier-gpu-math-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let src = dir.join("math.cpp");
    let program = format!(
        "#include <cstdio>\n#pragma clang fp contract(off)\n#define __device__\n{}\
         int main() {{\n  float x;\n  while (std::fread(&x, 4, 1, stdin) == 1) {{\n    \
         float y[4] = {{aubier_exp(x), aubier_ln(x), aubier_sin(x), aubier_cos(x)}};\n    \
         std::fwrite(y, 4, 4, stdout);\n  }}\n  return 0;\n}}\n",
        device_math(Lang::Cpp)
    );
    std::fs::write(&src, program).expect("write");
    let bin = dir.join("math");
    let out = std::process::Command::new(cc.replace("clang", "clang++"))
        .args(["-std=c++17", "-O2", "-ffp-contract=off", "-Wall", "-Werror"])
        .arg(&src)
        .arg("-o")
        .arg(&bin)
        .output()
        .expect("clang++ runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Every 65 537th bit pattern covers each sign, exponent and a spread of significands.
    let mut xs: Vec<f32> = (0..=u32::MAX).step_by(65_537).map(f32::from_bits).collect();
    xs.extend([
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        1e-45,
        88.73,
        -104.0,
    ]);
    let input = dir.join("x.f32");
    let bytes: Vec<u8> = xs.iter().flat_map(|x| x.to_le_bytes()).collect();
    std::fs::write(&input, bytes).expect("write");
    let out = std::process::Command::new(&bin)
        .stdin(std::fs::File::open(&input).expect("input"))
        .output()
        .expect("runs");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.status.success());
    let got: Vec<u32> = out
        .stdout
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert_eq!(got.len(), 4 * xs.len());
    let same = |a: f32, b: u32| (a.is_nan() && f32::from_bits(b).is_nan()) || a.to_bits() == b;
    let mut bad = Vec::new();
    for (i, &x) in xs.iter().enumerate() {
        // sin and cos are defined on |x| < 2^24 (the reduction's domain).
        let trig = x.abs() < 16_777_216.0 || !x.is_finite();
        let want = [exp(x), ln(x), sin(x), cos(x)];
        for (j, w) in want.into_iter().enumerate() {
            if (j < 2 || trig) && !same(w, got[4 * i + j]) {
                bad.push(format!(
                    "f{j}({x:e}) = {:e}, want {w:e}",
                    f32::from_bits(got[4 * i + j])
                ));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "{} mismatches: {:?}",
        bad.len(),
        &bad[..bad.len().min(10)]
    );
}

/// KQKV's head groups change no bit: the split kernel's partials with `g` heads per block equal
/// those of one head per block, for every head, at every warp width, over two splits and
/// partly masked tiles — 8 heads with staged queries read as 4-row vectors, 6 with one load
/// per row, 4 with the queries read in place (too wide to stage). The widths are those
/// [`kqkv_heads`] picks for the first two shapes.
#[test]
fn kqkv_head_groups_keep_every_bit() {
    let (t, s) = (2, 1100);
    for (heads, width, kv_lora, g) in [(8, 40, 24, 8), (6, 21, 13, 6), (4, 1200, 900, 4)] {
        let shape = KqkvShape {
            name: "kqkv".into(),
            heads,
            width,
            kv_lora,
            kq_scale: 0.19,
        };
        let q = mixed_vals(31 + heads as u64, t * heads * width, 4.0);
        let cache = mixed_vals(77 + heads as u64, s * width, 4.0);
        let pos: Vec<i32> = (0..t).map(|i| (s - t + i) as i32).collect();
        let parts = s.div_ceil(KQKV_SPLIT) * t * heads * (kv_lora + 2);
        for warp in WIDTHS {
            if width < 100 {
                assert_eq!(kqkv_heads(&shape, warp), g, "{heads} heads, warp {warp}");
            }
            let run = |g: usize| {
                let k = kqkv_split_heads(&shape, warp, g).expect("kernel");
                let (mut q, mut pos, mut cache) = (q.clone(), pos.clone(), cache.clone());
                let mut part = vec![f32::from_bits(0x7fc0_dead); parts];
                cpu_exec::run(
                    &k,
                    &mut [
                        Arg::F32(&mut q),
                        Arg::I32(&mut pos),
                        Arg::F32(&mut cache),
                        Arg::F32(&mut part),
                    ],
                    t,
                    s,
                    &no_dequant,
                )
                .unwrap_or_else(|e| panic!("{e}"));
                part.iter().map(|v| v.to_bits()).collect::<Vec<u32>>()
            };
            let one = run(1);
            assert!(
                one.iter().all(|&b| b != 0x7fc0_dead),
                "every partial written"
            );
            assert!(one == run(g), "{heads} heads, {g} per block, warp {warp}");
        }
    }
}
