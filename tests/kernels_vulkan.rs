//! The Vulkan dialect of the GPU kernels (`aubier_kernels_gen::gpu::glsl`) on a real Vulkan
//! device: lavapipe (Mesa's Vulkan on the CPU) in CI, which installs it with `spirv-tools`, so a
//! machine without either fails these tests instead of skipping them.
//!
//! * Every checked-in `kernels-gen/generated/vulkan/*.comp` (the bundled model's GPU plan)
//!   compiles to SPIR-V through the runtime's in-process compiler, passes `spirv-val
//!   --target-env vulkan1.3`, and every f32/f64 add, subtract, multiply and divide in it carries
//!   `NoContraction` (`spirv-dis`), so no driver may fuse them into an FMA.
//! * Through the device executor (`aubier_tests::kernels::vulkan`: the ABI of the module note
//!   of `glsl.rs`: device addresses in push constants, then that of the extents `T`, `S`): the
//!   float types' conversions on gguf-py's rows bit for bit with `gguf.quants.dequantize`, and the device
//!   math (bit for bit with `gpu::math` on a sweep with NaN, ±∞, ±0 and subnormals; sin and cos
//!   on their domain |x| < 2²⁴).
//! * One plan step at a time against the oracle for every step kind: the same cases as the
//!   CPU-execution targets `kernels_steps` and `kernels_fused` (`aubier_tests::kernels::{steps,
//!   fused}`), their kernels built at the device's subgroup size, with capped proptest case
//!   counts (shader compiles are the cost on lavapipe: a pipeline is made once per distinct
//!   source and lane) and the fixed cases (the real shapes, KQKV over 1 key and over 262 144
//!   keys). gguf-py's blocks of every block type run through their mat-vec kernel on one-hot
//!   rows first, which gives back every weight: the dequant functions bit for bit with gguf-py
//!   up to the sign of a zero. The tiled mat-mat form gives its mat-vec's bits at T = 2, 5 and
//!   64 (`steps::mat_mat_matches_mat_vec`). Every step kind (`exec::kind`: the kernel's name and weight types)
//!   of the bundled model's plans — the GPU target with its fusions, each fusion flag off, the
//!   oracle target — must have run on the device with a grid of work (a weight product's
//!   mat-vec runs at T = 1, its mat-mat at T > 1: each form counts apart), so a new step kind
//!   cannot go untested. With
//!   `--nocapture` the test prints per group its time and per step kind its kernel runs,
//!   pipelines made and device seconds.
//!
//! Tolerances: bit-exact where Vulkan's operations are exact (`+ − ·`, conversions, the device
//! math's sequence); the plan steps are held to the same a-priori bounds against the oracle as
//! on the CPU execution (`aubier_tests::kernels::bounds`, `fused`), with Vulkan's division
//! (2.5 ulp) and square root (4.5 ulp, from `1/inversesqrt`) in them (`vulkan::VULKAN_OPS`):
//! each division adds `4u`, each root `8u` to the device's side, as derived in `bounds.rs`.

use aubier_kernels_gen::gpu::cpu_exec::Arg;
use aubier_kernels_gen::gpu::emit::WARP;
use aubier_kernels_gen::gpu::ir::{bx, ci, tid, Kb, Kernel, ParamKind, Size};
use aubier_kernels_gen::gpu::math;
use aubier_kernels_gen::gpu::quant::supported_types;
use aubier_runtime::backend::vulkan_device::compile_glsl;
use aubier_runtime::gguf::GgufFile;
use aubier_tests::kernels::exec::{bundled_step_kinds, Exec};
use aubier_tests::kernels::vulkan::device;
use aubier_tests::kernels::{fused, steps};
use proptest::prelude::*;
use proptest::test_runner::TestRunner;
use std::collections::BTreeSet;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::Instant;

fn work_dir(test: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("kernels_vulkan_{test}"));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    dir
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

/// The float types' device conversions (F32, F16, BF16: rows with ±∞, NaN, subnormals) bit for
/// bit with gguf-py. The block types' dequant functions are checked bit for bit (up to the sign
/// of a zero) by `steps::mat_mul_gguf_py` in the step cases, through their mat-vec kernels: a
/// kernel of their own would cost lavapipe a second compile of each type's tables (minutes for
/// IQ1_S and IQ1_M).
#[test]
fn float_conversions_match_gguf_py_bit_for_bit_on_the_device() {
    let path = aubier_tests::data_dir().join("quants/quant_vectors.gguf");
    let file = GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let blocks = steps::block_types();
    for &ty in supported_types().iter().filter(|t| !blocks.contains(t)) {
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
        device().run(&k, &mut [Arg::Weight(bytes), Arg::F32(&mut got)], 1, 1);
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
    device().run(
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

/// The tiled mat-mat form computes its mat-vec's bits on the device at T = 2, 5 and 64, for
/// the dense weight types of the synth mixes and the float types, at the device's subgroup size.
#[test]
fn mat_mat_matches_mat_vec_bit_for_bit_on_the_device() {
    let x = device();
    for ty in steps::MAT_MAT_TYPES {
        steps::mat_mat_matches_mat_vec(x, ty, x.widths()[0]);
    }
}

/// Runs the property `f` on `cases` cases of `strategy` (a short shrink: each step compiles new
/// kernels), panicking with the smallest failing case.
fn prop<S: Strategy>(cases: u32, strategy: S, f: impl Fn(S::Value)) {
    let config = ProptestConfig {
        cases,
        max_shrink_iters: 32,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    TestRunner::new(config)
        .run(&strategy, |c| {
            f(c);
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{e}"));
}

/// A group of device cases: its name and what it runs.
type Group = (String, Box<dyn Fn() + Send + Sync>);

/// The device groups, the costliest first: gguf-py's blocks of every type (a group per type:
/// the IQ1 and IQ2_S kernels take lavapipe the longest to compile), the property tests with
/// their case counts, the fixed cases.
fn groups() -> Vec<Group> {
    let x = device();
    let mut g: Vec<Group> = Vec::new();
    let mut add = |name: &str, f: Box<dyn Fn() + Send + Sync>| g.push((name.to_string(), f));
    let mut types = steps::block_types();
    let costliest = ["IQ1_M", "IQ1_S", "IQ2_S", "IQ2_XS"];
    types.sort_by_key(|t| {
        costliest
            .iter()
            .position(|c| c == t)
            .unwrap_or(costliest.len())
    });
    for ty in types {
        let f = move || {
            // One-hot rows: T = n tokens, the mat-mat form; one token: the mat-vec form.
            steps::gguf_py_weights_through_mat_vec(x, ty, x.widths()[0]);
            steps::mat_mul_gguf_py(x, ty, (1, 11, x.widths()[0]));
            prop(1, steps::every_type_cases(x), |c| {
                steps::mat_mul_gguf_py(x, ty, c)
            })
        };
        add(&format!("mat_mul {ty} (gguf-py blocks)"), Box::new(f));
    }
    add(
        "phase",
        Box::new(|| prop(3, fused::phase_cases(x), |c| fused::phase(x, c))),
    );
    add(
        "kqkv",
        Box::new(|| prop(3, fused::kqkv_cases(x), |c| fused::kqkv(x, c))),
    );
    add(
        "mat_mul quant",
        Box::new(|| prop(6, steps::mat_mul_quant_cases(x), |c| steps::mat_mul(x, c))),
    );
    add(
        "kqkv over 262 144 keys",
        Box::new(|| fused::kqkv(x, fused::kqkv_longest_window(x))),
    );
    add(
        "phase at the real shape",
        Box::new(|| fused::phase(x, fused::phase_real_shape(x))),
    );
    add(
        "wkb at the real shapes",
        Box::new(|| {
            fused::wkb_real_shapes(x)
                .into_iter()
                .for_each(|c| fused::wkb(x, c))
        }),
    );
    add(
        "wkb at the bundled model's shapes",
        Box::new(|| {
            // At T = 2 (the mat-mat forms) and T = 1 (the mat-vec forms).
            for c in fused::wkb_bundled_shapes(x) {
                fused::wkb(x, c);
                fused::wkb(x, fused::WkbCase { t: 1, ..c });
            }
        }),
    );
    add(
        "mat_mul over a 1900-token prefill",
        Box::new(|| steps::mat_mul(x, steps::mat_mul_long_prefill(x))),
    );
    add(
        "kqkv over 1 key",
        Box::new(|| fused::kqkv(x, fused::kqkv_single_key(x))),
    );
    add(
        "wkb f32",
        Box::new(|| prop(3, fused::wkb_f32_cases(x), |c| fused::wkb(x, c))),
    );
    add(
        "wkb quant",
        Box::new(|| prop(3, fused::wkb_quant_cases(x), |c| fused::wkb(x, c))),
    );
    add(
        "wkb out k-quant",
        Box::new(|| prop(3, fused::wkb_out_kquant_cases(x), |c| fused::wkb(x, c))),
    );
    add(
        "mat_mul f32",
        Box::new(|| {
            // One token (the mat-vec form), then the sampled cases (mostly the mat-mat form).
            let one = steps::MatMulCase {
                ty: "F32",
                n_in: 37,
                n_out: 9,
                t: 1,
                seed: 3,
                warp: x.widths()[0],
            };
            steps::mat_mul(x, one);
            prop(3, steps::mat_mul_f32_cases(x), |c| steps::mat_mul(x, c))
        }),
    );
    add(
        "rms_norm and softmax",
        Box::new(|| {
            prop(3, steps::rows_cases(x), |c| {
                steps::rms_norm_and_softmax(x, c)
            })
        }),
    );
    add(
        "elementwise",
        Box::new(|| prop(3, steps::rows_cases(x), |c| steps::elementwise(x, c))),
    );
    add(
        "router",
        Box::new(|| prop(3, steps::router_cases(x), |c| steps::router(x, c))),
    );
    add("moe ffn", Box::new(|| steps::moe_ffn(x)));
    add(
        "moe mat-mat against the mat-vec",
        Box::new(|| steps::moe_mat_mat_matches_mat_vec(x, "Q2_K", "Q4_K", x.widths()[0])),
    );
    for ty in steps::EMBED_TYPES {
        add(
            &format!("embed {ty}/silu/concat/rope"),
            Box::new(move || steps::embed_silu_concat_rope(x, ty)),
        );
    }
    add(
        "softmax over keys",
        Box::new(|| steps::softmax_over_keys(x)),
    );
    add("argmax", Box::new(|| steps::argmax(x)));
    g
}

/// The message of a caught panic.
fn message(e: Box<dyn std::any::Any + Send>) -> String {
    e.downcast_ref::<String>()
        .cloned()
        .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "a panic without a message".into())
}

/// Runs every group of [`groups`] on the device, one thread per lane (a failing group does not
/// stop the others), prints what each group and each step kind cost, then fails on any failed
/// group and on any step kind of the bundled plans that no group ran.
#[test]
fn every_step_kind_against_the_oracle_on_the_device() {
    let x = device();
    let start = Instant::now();
    let queue = Mutex::new(groups().into_iter());
    let done = Mutex::new(Vec::new());
    std::thread::scope(|sc| {
        for lane in 0..x.lanes() {
            let (queue, done) = (&queue, &done);
            sc.spawn(move || {
                x.pin(lane);
                loop {
                    let Some((name, group)) = queue.lock().expect("queue").next() else {
                        break;
                    };
                    let t0 = Instant::now();
                    let r = catch_unwind(AssertUnwindSafe(group)).map_err(message);
                    let secs = t0.elapsed().as_secs_f64();
                    done.lock().expect("results").push((name, secs, r));
                }
            });
        }
    });
    let done = done.into_inner().expect("results");
    let info = x.info();
    println!(
        "device {} (subgroup {}), {} lanes, {:.1} s in all",
        info.name,
        info.subgroup_size,
        x.lanes(),
        start.elapsed().as_secs_f64()
    );
    for (name, secs, r) in &done {
        let state = if r.is_ok() { "ok" } else { "FAILED" };
        println!("  group {name:<40} {secs:>7.1} s  {state}");
    }
    let stats = x.stats();
    let planned = bundled_step_kinds();
    println!(
        "  {:<28} {:>5} {:>9} {:>9}  in the bundled plans",
        "step kind", "runs", "pipelines", "device s"
    );
    for (kind, s) in &stats {
        let mark = if planned.contains(kind) { "yes" } else { "" };
        println!(
            "  {kind:<28} {:>5} {:>9} {:>9.2}  {mark}",
            s.runs, s.pipelines, s.secs
        );
    }
    let failed: Vec<String> = done
        .iter()
        .filter_map(|(name, _, r)| r.as_ref().err().map(|e| format!("{name}: {e}")))
        .collect();
    assert!(
        failed.is_empty(),
        "failed on the device:\n{}",
        failed.join("\n\n")
    );
    let ran: BTreeSet<String> = stats
        .into_iter()
        .filter(|(_, s)| s.runs > 0)
        .map(|(kind, _)| kind)
        .collect();
    let missing: Vec<String> = planned.difference(&ran).cloned().collect();
    assert!(
        missing.is_empty(),
        "step kinds of the bundled plans with no case on the device: {missing:?}"
    );
}
