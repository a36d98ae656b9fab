//! The Vulkan dialect of the GPU kernels (`aubier_kernels_gen::gpu::glsl`) on a real Vulkan
//! device: lavapipe (Mesa's Vulkan on the CPU) in CI, which installs it with `spirv-tools`, so a
//! machine without either fails these tests instead of skipping them.
//!
//! * Every checked-in `kernels-gen/generated/vulkan/*.comp` (the bundled model's GPU plan)
//!   compiles to SPIR-V through the runtime's in-process compiler, passes `spirv-val
//!   --target-env vulkan1.3`, and every f32/f64 add, subtract, multiply and divide in it carries
//!   `NoContraction` (`spirv-dis`), so no driver may fuse them into an FMA.
//! * Kernels run through `VulkanContext` under the ABI of the module note of `glsl.rs` (device
//!   addresses in push constants, then that of the extents `T`, `S`) on the inputs of the
//!   CPU-execution tests, and are judged by the CPU execution of the same IR (`cpu_exec`): the dequant function of every
//!   supported type on gguf-py's blocks (bit for bit with `gguf.quants.dequantize`), the device
//!   math (bit for bit with `gpu::math` on a sweep with NaN, ±∞, ±0 and subnormals; sin and cos
//!   on their domain |x| < 2²⁴), and the
//!   plan steps whose kernels have no subgroup reduction: embedding lookup, SiLU, concat, RoPE
//!   with YaRN, router top-k and gather_renorm.
//!
//! Tolerances: bit-exact where Vulkan's operations are exact (`+ − ·`, conversions, the device
//! math's sequence); Vulkan lets a division be 2.5 ulp, so SiLU gets `4u·|ref|` and
//! gather_renorm `4u·|ref|` (`u = 2⁻²⁴`). Kernels with subgroup reductions (mat-vec, norms,
//! softmax, the fused kernels) are not run: their reduction width is the IR's 32 and lavapipe's
//! subgroup is 8, and the butterfly is the IR's only when they agree.

#[path = "kernels_common.rs"]
mod common;

use aubier_compiler::config::YarnParams;
use aubier_compiler::ops::Op;
use aubier_compiler::types::{Attrs, DType, Dim};
use aubier_kernels_gen::gpu::cpu_exec::Arg;
use aubier_kernels_gen::gpu::emit::WARP;
use aubier_kernels_gen::gpu::glsl::{push_constant_bytes, render_glsl};
use aubier_kernels_gen::gpu::ir::{bx, ci, tid, Kb, Kernel, ParamKind, Size, Stmt};
use aubier_kernels_gen::gpu::math;
use aubier_kernels_gen::gpu::quant::supported_types;
use aubier_kernels_gen::gpu::steps::for_step;
use aubier_runtime::backend::vulkan::context::{Buffer, Location, VulkanContext};
use aubier_runtime::backend::vulkan::device::select;
use aubier_runtime::backend::vulkan::shader::compile_glsl;
use aubier_runtime::gguf::GgufFile;
use common::*;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

const A: f64 = 8.0 * 1.401_298_464_324_817e-45;

/// A context on the device `select` picks, software allowed (lavapipe without a GPU).
fn context() -> VulkanContext {
    let device = select(None, true)
        .unwrap_or_else(|e| panic!("these tests need a Vulkan device (CI installs lavapipe): {e}"));
    VulkanContext::new(device.index)
        .unwrap_or_else(|e| panic!("opening device {} ({}): {e}", device.index, device.name))
}

fn work_dir(test: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("kernels_vulkan_{test}"));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    dir
}

/// Whether `body` holds a subgroup reduction.
fn reduces(body: &[Stmt]) -> bool {
    body.iter().any(|s| match s {
        Stmt::WarpReduce(..) => true,
        Stmt::For { body, .. } => reduces(body),
        Stmt::If(_, a, b) => reduces(a) || reduces(b),
        _ => false,
    })
}

/// Runs `k` on the device over its grid at `T = t`, `S = s`, with `args` bound as the CPU
/// execution binds them, and copies the written f32 / i32 buffers back into `args`. A kernel
/// with subgroup reductions must have been built for the device's subgroup size.
fn run_vulkan(ctx: &VulkanContext, k: &Kernel, args: &mut [Arg<'_>], t: usize, s: usize) {
    let subgroup = ctx.info().subgroup_size;
    assert!(
        !reduces(&k.body) || k.warp == subgroup,
        "kernel `{}` reduces over {} lanes; the device's subgroup has {subgroup}",
        k.name,
        k.warp
    );
    assert_eq!(args.len(), k.params.len(), "{}: arguments", k.name);
    let source = render_glsl(k, &[]).unwrap_or_else(|e| panic!("{e}"));
    let spirv = compile_glsl(&source, &format!("{}.comp", k.name))
        .unwrap_or_else(|e| panic!("{}: {e}\n{source}", k.name));
    let pipeline = ctx
        .pipeline(&spirv, push_constant_bytes(k))
        .unwrap_or_else(|e| panic!("{}: {e}", k.name));
    let upload = |bytes: &[u8]| -> Buffer {
        let buf = ctx
            .buffer(bytes.len().max(4) as u64, Location::Device)
            .expect("buffer");
        if !bytes.is_empty() {
            ctx.upload(&buf, 0, bytes).expect("upload");
        }
        buf
    };
    // Buffers live until the dispatch is done; `experts` holds each expert's own buffer.
    let mut bufs = Vec::new();
    let mut experts = Vec::new();
    for a in args.iter() {
        let bytes: Vec<u8> = match a {
            Arg::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Arg::I32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Arg::Weight(b) => b.to_vec(),
            Arg::Experts(list) => {
                let own: Vec<Buffer> = list.iter().map(|b| upload(b)).collect();
                let table = own.iter().flat_map(|b| b.address().to_le_bytes()).collect();
                experts.push(own);
                table
            }
        };
        bufs.push(upload(&bytes));
    }
    let mut push: Vec<u8> = bufs
        .iter()
        .flat_map(|b| b.address().to_le_bytes())
        .collect();
    let extents: Vec<u8> = [t as i32, s as i32]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    let extents = upload(&extents);
    push.extend_from_slice(&extents.address().to_le_bytes());
    let grid = k.grid.clone().map(|g| g.eval(t, s).expect("grid") as u32);
    if grid.contains(&0) {
        return;
    }
    ctx.dispatch(&pipeline, [grid[0], grid[1], 1], &push)
        .unwrap_or_else(|e| panic!("{}: {e}", k.name));
    for (a, buf) in args.iter_mut().zip(&bufs) {
        let n = match a {
            Arg::F32(v) => v.len(),
            Arg::I32(v) => v.len(),
            _ => continue,
        };
        let mut bytes = vec![0u8; 4 * n];
        if n > 0 {
            ctx.download(buf, 0, &mut bytes).expect("download");
        }
        let words = bytes.chunks_exact(4).map(|w| [w[0], w[1], w[2], w[3]]);
        match a {
            Arg::F32(v) => v
                .iter_mut()
                .zip(words)
                .for_each(|(x, w)| *x = f32::from_le_bytes(w)),
            Arg::I32(v) => v
                .iter_mut()
                .zip(words)
                .for_each(|(x, w)| *x = i32::from_le_bytes(w)),
            _ => {}
        }
    }
}

/// Runs `tool args…`, panicking with the install hint when it is missing.
fn tool(name: &str, args: &[&str]) -> std::process::Output {
    Command::new(name).args(args).output().unwrap_or_else(|e| {
        panic!("{name}: {e}; install it: `apt-get install -y spirv-tools` (CI does)")
    })
}

/// The result ids of the f32 / f64 `OpFAdd`, `OpFSub`, `OpFMul`, `OpFDiv` of a disassembly that
/// lack a `NoContraction` decoration.
fn contractable(dis: &str) -> Vec<String> {
    let decorated: BTreeSet<&str> = dis
        .lines()
        .filter_map(|l| l.trim().strip_prefix("OpDecorate "))
        .filter_map(|l| l.strip_suffix(" NoContraction"))
        .collect();
    dis.lines()
        .filter_map(|l| {
            let (id, op) = l.trim().split_once(" = ")?;
            let name = op.split_whitespace().next()?;
            ["OpFAdd", "OpFSub", "OpFMul", "OpFDiv"]
                .contains(&name)
                .then_some(id)
        })
        .filter(|id| !decorated.contains(id))
        .map(str::to_string)
        .collect()
}

#[test]
fn generated_vulkan_kernels_compile_validate_and_never_contract() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../kernels-gen/generated/vulkan");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e} (run `aubier gen`)", dir.display()))
        .map(|e| e.expect("entry").path())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "{} holds no kernels", dir.display());
    let work = work_dir("validate");
    for f in &files {
        let source = std::fs::read_to_string(f).expect("source");
        let name = f.file_name().expect("name").to_string_lossy().into_owned();
        let words = compile_glsl(&source, &name).unwrap_or_else(|e| panic!("{name}: {e}"));
        let spv = work.join(name.replace(".comp", ".spv"));
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        std::fs::write(&spv, bytes).expect("write");
        let spv = spv.to_str().expect("utf-8 path");
        let val = tool("spirv-val", &["--target-env", "vulkan1.3", spv]);
        assert!(
            val.status.success(),
            "{name}: spirv-val: {}",
            String::from_utf8_lossy(&val.stderr)
        );
        let dis = tool("spirv-dis", &[spv]);
        assert!(dis.status.success(), "{name}: spirv-dis failed");
        let dis = String::from_utf8_lossy(&dis.stdout);
        let loose = contractable(&dis);
        assert!(loose.is_empty(), "{name}: contractable float ops {loose:?}");
    }
}

/// One row per block; thread `t` decodes chunks `t, t + 32, …` of its row with `Dequant16` and
/// stores them: a whole weight dequantized by the device functions.
fn dequant_kernel(ty: &str, row_bytes: usize, row_len: usize, rows: usize) -> Kernel {
    let mut kb = Kb::new(
        format!("dequant_{}", ty.to_ascii_lowercase()),
        "dequantize every row",
        [Size::Const(rows), Size::Const(1)],
        32,
        WARP,
    );
    let w = kb.param(
        "w",
        ParamKind::Weight {
            ggml_type: ty.into(),
            row_bytes,
            row_len,
        },
    );
    let y = kb.output_f32("y", Some(Size::Const(rows * row_len)));
    let chunk = kb.local("chunk", 16);
    kb.for_("c", tid(), ci(row_len / 16), 32, |kb, c| {
        kb.dequant16(w, None, bx(), c.clone(), chunk);
        for j in 0..16 {
            let at = bx() * ci(row_len) + c.clone() * 16 + j;
            let val = kb.ldl(chunk, j);
            kb.store(y, at, val);
        }
    });
    kb.finish().expect("dequant kernel")
}

#[test]
fn dequant_functions_match_gguf_py_bit_for_bit_on_the_device() {
    let ctx = context();
    let path = aubier_tests::data_dir().join("quants/quant_vectors.gguf");
    let file = GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    for &ty in supported_types() {
        let q = file.tensor(&format!("q.{ty}")).expect("q tensor");
        let r = file.tensor(&format!("ref.{ty}")).expect("ref tensor");
        let (row_len, row_bytes) = (q.row_len(), q.row_bytes());
        let bytes = file.tensor_data(q);
        let rows = bytes.len() / row_bytes;
        let want: Vec<f32> = file
            .tensor_data(r)
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let k = dequant_kernel(ty, row_bytes, row_len, rows);
        let mut got = vec![0f32; rows * row_len];
        run_vulkan(
            &ctx,
            &k,
            &mut [Arg::Weight(bytes), Arg::F32(&mut got)],
            1,
            1,
        );
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                "{ty}: element {i}: got {g:e} ({:#010x}), gguf-py {w:e} ({:#010x})",
                g.to_bits(),
                w.to_bits()
            );
        }
    }
}

/// A device math function of `gpu::math`.
type Unary = fn(f32) -> f32;

#[test]
fn device_math_matches_the_cpu_bit_for_bit() {
    let mut x: Vec<f32> = vec![
        0.0,
        -0.0,
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::MIN_POSITIVE,
        f32::from_bits(1),
        -f32::from_bits(0x0000_ffff),
        f32::MAX,
        f32::MIN,
        88.72,
        88.74,
        -103.9,
        -104.1,
        1.0,
        -1.0,
        16_777_215.0,
        -262_143.0,
    ];
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    while x.len() < 4096 {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1);
        let u = (state >> 40) as f32 / (1u64 << 24) as f32;
        let class = (state >> 8) as u8 % 4;
        x.push(match class {
            0 => (u - 0.5) * 200.0,
            1 => (u - 0.5) * 2.0,
            2 => u * 300_000.0,
            _ => f32::from_bits((state >> 3) as u32),
        });
    }
    let n = x.len();
    let mut kb = Kb::new(
        "math",
        "exp, ln, sin, cos",
        [Size::Const(n / 64), Size::Const(1)],
        64,
        WARP,
    );
    let xp = kb.input_f32("x", Size::Const(n));
    let outs: Vec<_> = ["e", "l", "s", "c"]
        .iter()
        .map(|name| kb.output_f32(name, Some(Size::Const(n))))
        .collect();
    let i = kb.let_("i", bx() * 64 + tid());
    let v = kb.load(xp, i);
    kb.store(outs[0], i, v.clone().exp());
    kb.store(outs[1], i, v.clone().ln());
    kb.store(outs[2], i, v.clone().sin());
    kb.store(outs[3], i, v.cos());
    let k = kb.finish().expect("math kernel");
    let mut xa = x.clone();
    let mut got = vec![vec![0f32; n]; 4];
    let [e, l, s, c] = &mut got[..] else {
        unreachable!()
    };
    run_vulkan(
        &context(),
        &k,
        &mut [
            Arg::F32(&mut xa),
            Arg::F32(e),
            Arg::F32(l),
            Arg::F32(s),
            Arg::F32(c),
        ],
        1,
        1,
    );
    let fns: [(&str, Unary); 4] = [
        ("exp", math::exp),
        ("ln", math::ln),
        ("sin", math::sin),
        ("cos", math::cos),
    ];
    for ((name, f), out) in fns.iter().zip(&got) {
        // sin and cos reduce |x| < 2²⁴ exactly (math.rs); past 2⁶³ their quadrant is C's
        // undefined float → int64 conversion on both sides.
        let domain =
            |x: f32| matches!(*name, "exp" | "ln") || !x.is_finite() || x.abs() < 16_777_216.0;
        for (&xi, &g) in x.iter().zip(out).filter(|(x, _)| domain(**x)) {
            let w = f(xi);
            assert!(
                g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                "{name}({xi:e}): device {g:e}, cpu {w:e}"
            );
        }
    }
}

/// Embedding lookup (IQ2_XXS table), SiLU, a concat copy and RoPE with YaRN: the kernels of
/// `embed_silu_concat_rope_match_oracle` (kernels_steps.rs), on the device against their CPU
/// execution.
#[test]
fn embed_silu_concat_rope_match_the_cpu_execution() {
    let ctx = context();
    let (d, vocab, t) = (256usize, 7usize, 3usize);
    let table = W::random("IQ2_XXS", vec![d, vocab], 21, 0.7);
    let ids = vec![6i32, 0, 3];
    let pos = vec![5i32, 70_000, 262_143];
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
    pb.step(
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
    pb.step(
        Op::RopeYarn,
        Attrs::Rope(rope),
        vec![v(e), v(pv)],
        DType::F32,
        vec![Dim::Tokens, fx(d)],
    );
    let plan = pb.plan();
    let kernel = |i: usize| {
        for_step(&plan, i, ctx.info().subgroup_size)
            .expect("kernels")
            .remove(0)
    };
    let s_big = 262_144;

    let (mut ia, mut ib) = (ids.clone(), ids.clone());
    let (mut eg, mut ev) = (vec![0f32; t * d], vec![0f32; t * d]);
    let k = kernel(0);
    run_gpu(
        &k,
        &mut [
            Arg::Weight(&table.bytes),
            Arg::I32(&mut ia),
            Arg::F32(&mut eg),
        ],
        t,
        s_big,
    );
    run_vulkan(
        &ctx,
        &k,
        &mut [
            Arg::Weight(&table.bytes),
            Arg::I32(&mut ib),
            Arg::F32(&mut ev),
        ],
        t,
        s_big,
    );
    check("embed", &ev, &eg, &vec![0.0; t * d], d, 0.0);

    let (mut sg, mut sv) = (vec![0f32; t * d], vec![0f32; t * d]);
    let k = kernel(1);
    run_gpu(
        &k,
        &mut [Arg::F32(&mut eg.clone()), Arg::F32(&mut sg)],
        t,
        s_big,
    );
    run_vulkan(
        &ctx,
        &k,
        &mut [Arg::F32(&mut eg.clone()), Arg::F32(&mut sv)],
        t,
        s_big,
    );
    let b: Vec<f64> = sg.iter().map(|w| 4.0 * U * (*w as f64).abs() + A).collect();
    check("silu", &sv, &sg, &b, d, 1e-6);

    let (mut cg, mut cv) = (vec![0f32; 2 * t * d], vec![0f32; 2 * t * d]);
    let k = kernel(2);
    run_gpu(
        &k,
        &mut [
            Arg::F32(&mut eg.clone()),
            Arg::F32(&mut sg.clone()),
            Arg::F32(&mut cg),
        ],
        t,
        s_big,
    );
    run_vulkan(
        &ctx,
        &k,
        &mut [
            Arg::F32(&mut eg.clone()),
            Arg::F32(&mut sg.clone()),
            Arg::F32(&mut cv),
        ],
        t,
        s_big,
    );
    check("concat", &cv, &cg, &vec![0.0; 2 * t * d], 2 * d, 0.0);

    let (mut rg, mut rv) = (vec![0f32; t * d], vec![0f32; t * d]);
    let k = kernel(3);
    run_gpu(
        &k,
        &mut [
            Arg::F32(&mut eg.clone()),
            Arg::I32(&mut pos.clone()),
            Arg::F32(&mut rg),
        ],
        t,
        s_big,
    );
    run_vulkan(
        &ctx,
        &k,
        &mut [
            Arg::F32(&mut eg.clone()),
            Arg::I32(&mut pos.clone()),
            Arg::F32(&mut rv),
        ],
        t,
        s_big,
    );
    check("rope_yarn", &rv, &rg, &vec![0.0; t * d], d, 0.0);
}

/// Router top-k and gather_renorm (with ties and across a 32-expert boundary), on the device
/// against their CPU execution.
#[test]
fn router_top_k_and_renorm_match_the_cpu_execution() {
    let ctx = context();
    for (case, (e, k, rows)) in [
        (8usize, 4usize, 3usize),
        (128, 4, 2),
        (139, 5, 3),
        (3, 1, 1),
    ]
    .into_iter()
    .enumerate()
    {
        let mut state = 0x2545_f491_4f6c_dd1du64 ^ case as u64;
        let p: Vec<f32> = (0..rows * e)
            .map(|i| {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1);
                let u = (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
                if case % 2 == 1 && i % 3 == 0 {
                    (u * 4.0).round()
                } else {
                    u
                }
            })
            .collect();
        let mut pb = PlanB::default();
        let pv = pb.value(DType::F32, vec![Dim::Tokens, fx(e)], false);
        let ids = pb.step(
            Op::TopK,
            Attrs::TopK { k },
            vec![v(pv)],
            DType::I32,
            vec![Dim::Tokens, fx(k)],
        );
        pb.step(
            Op::GatherRenorm,
            Attrs::GatherRenorm {
                renorm: true,
                scale: 1.5,
            },
            vec![v(pv), v(ids)],
            DType::F32,
            vec![Dim::Tokens, fx(k)],
        );
        let plan = pb.plan();
        let kt = &for_step(&plan, 0, ctx.info().subgroup_size).expect("top_k")[0];
        let (mut ig, mut iv) = (vec![0i32; rows * k], vec![0i32; rows * k]);
        run_gpu(
            kt,
            &mut [Arg::F32(&mut p.clone()), Arg::I32(&mut ig)],
            rows,
            1,
        );
        run_vulkan(
            &ctx,
            kt,
            &mut [Arg::F32(&mut p.clone()), Arg::I32(&mut iv)],
            rows,
            1,
        );
        assert_eq!(iv, ig, "top_k e={e} k={k}");
        let kg = &for_step(&plan, 1, ctx.info().subgroup_size).expect("gather_renorm")[0];
        let (mut gg, mut gv) = (vec![0f32; rows * k], vec![0f32; rows * k]);
        run_gpu(
            kg,
            &mut [
                Arg::F32(&mut p.clone()),
                Arg::I32(&mut ig.clone()),
                Arg::F32(&mut gg),
            ],
            rows,
            1,
        );
        run_vulkan(
            &ctx,
            kg,
            &mut [
                Arg::F32(&mut p.clone()),
                Arg::I32(&mut ig),
                Arg::F32(&mut gv),
            ],
            rows,
            1,
        );
        let b: Vec<f64> = gg.iter().map(|w| 4.0 * U * (*w as f64).abs() + A).collect();
        check("gather_renorm", &gv, &gg, &b, k, 1e-6);
    }
}
