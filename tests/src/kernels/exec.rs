//! Executors of the GPU kernels and one plan step at a time against the oracle.
//!
//! An [`Exec`] runs a kernel over its grid with its parameters bound as the CPU execution binds
//! them: [`Cpu`] is that execution (`cpu_exec`, the GPU's order of reduction) at the warp widths
//! of [`WARPS`]; [`super::vulkan::Device`] is a Vulkan device at its subgroup width. A case
//! builds its kernels for one of [`Exec::widths`] (sampled by [`warps`], or picked by
//! [`width`]), runs them through the executor, and holds the result to the bound of
//! [`super::bounds`] against the oracle, with the executor's division and square-root accuracy
//! ([`Ops`]) in the bound.
//!
//! [`check_steps`] runs a plan on the oracle, then each step's kernels (`launch::launches`, so
//! the step → kernel mapping and the parameter binding are tested with them) on the oracle's
//! values of its operands, and compares each output with the oracle's.

pub use super::case::{Ops, StepIn};
use super::{as_f32, bounds, check, run_gpu, run_oracle, PlanB, WARPS};
use aubier_compiler::plan::{Operand, Storage, ValueId};
use aubier_compiler::types::DType;
use aubier_compiler::{compile, CompileOptions};
use aubier_kernels_gen::gpu::cpu_exec::Arg;
use aubier_kernels_gen::gpu::ir::{Kernel, ParamKind};
use aubier_kernels_gen::gpu::launch::{self, launches};
use aubier_kernels_gen::gpu::plan_kernels;
use proptest::strategy::{BoxedStrategy, Strategy};
use std::collections::BTreeSet;

/// What runs the kernels of a case.
pub trait Exec: Sync {
    /// The warp widths kernels are built for here.
    fn widths(&self) -> Vec<u32>;

    /// Runs `k` over its grid at `T = t`, `S = s`, with `args` bound as [`cpu_exec::run`]
    /// binds them, and leaves what it wrote in the f32 / i32 arguments; panics naming the
    /// kernel when it cannot.
    ///
    /// [`cpu_exec::run`]: aubier_kernels_gen::gpu::cpu_exec::run
    fn run(&self, k: &Kernel, args: &mut [Arg<'_>], t: usize, s: usize);

    /// The accuracy of its division and square root.
    fn ops(&self) -> Ops;
}

/// The CPU execution of the kernel IR at every width of [`WARPS`].
pub struct Cpu;

impl Exec for Cpu {
    fn widths(&self) -> Vec<u32> {
        WARPS.to_vec()
    }

    fn run(&self, k: &Kernel, args: &mut [Arg<'_>], t: usize, s: usize) {
        run_gpu(k, args, t, s);
    }

    /// Rust's f32 `/` and `sqrt`.
    fn ops(&self) -> Ops {
        Ops::CORRECTLY_ROUNDED
    }
}

/// One of `x`'s widths per case, for the property tests.
pub fn warps(x: &dyn Exec) -> BoxedStrategy<u32> {
    proptest::sample::select(x.widths()).boxed()
}

/// `x`'s width `i` (cyclically), for the fixed cases: one width each.
pub fn width(x: &dyn Exec, i: usize) -> u32 {
    let w = x.widths();
    w[i % w.len()]
}

/// The step kind of a kernel: the name `for_step` gives it (without the content hash
/// `plan_kernels` and `launches` append) and the ggml types of its weights, e.g.
/// `mat_mul Q4_K`, `moe_down Q2_K`, `kqkv_split`.
pub fn kind(k: &Kernel) -> String {
    let base = match k.name.rsplit_once('_') {
        Some((base, hash)) if hash.len() == 8 && hash.bytes().all(|b| b.is_ascii_hexdigit()) => {
            base
        }
        _ => &k.name,
    };
    let mut tys: Vec<&str> = k
        .params
        .iter()
        .filter_map(|(_, kind)| match kind {
            ParamKind::Weight { ggml_type, .. } | ParamKind::Experts { ggml_type, .. } => {
                Some(ggml_type.as_str())
            }
            _ => None,
        })
        .collect();
    tys.dedup();
    std::iter::once(base)
        .chain(tys)
        .collect::<Vec<_>>()
        .join(" ")
}

/// The bundled model's plan under `opts` (its config read from the file, `edit` applied first,
/// as a user's graph edit is).
pub fn bundled_plan(
    opts: &CompileOptions,
    edit: impl FnOnce(&mut aubier_compiler::config::Mistral4Config),
) -> aubier_compiler::plan::Plan {
    let path = crate::models_dir().join("ms4-tiny256-q2k.gguf");
    let file = aubier_runtime::gguf::GgufFile::open(&path).expect("bundled model");
    let mut cfg = aubier_runtime::model::read_config(&file).expect("config");
    let weights = aubier_runtime::model::weight_refs(&file, &cfg).expect("weights");
    edit(&mut cfg);
    compile(&cfg, &weights, opts).expect("compile")
}

/// The compile options of the bundled plans a GPU backend runs: the GPU target with its
/// fusions, the same with each fusion flag off, and the oracle target (every fusion off).
pub fn bundled_plan_options() -> Vec<CompileOptions> {
    use aubier_compiler::{Fusion, Target};
    let gpu = CompileOptions {
        target: Target::Gpu,
        ..CompileOptions::default()
    };
    vec![
        gpu.clone(),
        CompileOptions {
            fuse_phase: Fusion::Off,
            ..gpu.clone()
        },
        CompileOptions {
            fuse_wkb: Fusion::Off,
            ..gpu.clone()
        },
        CompileOptions {
            fuse_kqkv: Fusion::Off,
            ..gpu
        },
        CompileOptions {
            target: Target::Oracle,
            ..CompileOptions::default()
        },
    ]
}

/// Every step kind ([`kind`]) of the bundled plans of [`bundled_plan_options`].
pub fn bundled_step_kinds() -> BTreeSet<String> {
    bundled_plan_options()
        .iter()
        .flat_map(|o| plan_kernels(&bundled_plan(o, |_| {}), 32).expect("kernels"))
        .map(|(k, _)| kind(&k))
        .collect()
}

/// What the kernels of one step wrote: its output value's bits (empty when the output is the
/// cache) and the latent cache.
pub struct Written {
    /// The output value.
    pub out: Vec<u32>,
    /// The cache after the step.
    pub cache: Vec<f32>,
}

/// An f32 output is first filled with this NaN, an i32 one with `i32::MIN`, so an element no
/// kernel writes fails the comparison.
const UNWRITTEN: u32 = 0x7fc0_dead;

/// One parameter's buffer while a kernel runs (copies, so that two parameters bound to the same
/// value never alias).
enum Buf<'a> {
    F(Vec<f32>),
    I(Vec<i32>),
    W(&'a [u8]),
    E(Vec<&'a [u8]>),
}

/// Step 0 of `pb`'s plan on `vals` and `cache` at `T = t`, `S = s`.
pub fn one_step<'a>(
    pb: &'a PlanB,
    vals: &'a [Vec<u32>],
    cache: &'a [f32],
    t: usize,
    s: usize,
) -> StepIn<'a> {
    StepIn {
        pb,
        i: 0,
        vals,
        cache,
        t,
        s,
    }
}

/// Runs the kernels of step `at` on `x`, built for warps of `warp` lanes and bound as
/// [`launches`] binds them: operands from `at.vals`, the latent cache starting as `at.cache`,
/// scratch shared by the step's kernels starting at zero, the output starting unwritten.
pub fn run_step(x: &dyn Exec, at: StepIn<'_>, warp: u32) -> Written {
    let (pb, i, vals, cache, t, s) = (at.pb, at.i, at.vals, at.cache, at.t, at.s);
    let plan = pb.plan();
    let step = &plan.steps[i];
    let in_cache = |v: ValueId| matches!(plan.values[v].storage, Storage::KvCache { .. });
    let out_dtype = plan.values[step.out].dtype;
    let mut out = if in_cache(step.out) {
        Vec::new()
    } else {
        let fill = match out_dtype {
            DType::I32 => i32::MIN as u32,
            _ => UNWRITTEN,
        };
        vec![fill; vals[step.out].len()]
    };
    let mut cache = cache.to_vec();
    let mut scratch: Vec<(String, Vec<u32>)> = Vec::new();
    let value = |v: ValueId, out: &[u32], cache: &[f32]| -> Buf<'static> {
        let bits: &[u32] = if v == step.out { out } else { &vals[v] };
        match (in_cache(v), plan.values[v].dtype) {
            (true, _) => Buf::F(cache.to_vec()),
            (false, DType::I32) => Buf::I(bits.iter().map(|&b| b as i32).collect()),
            (false, _) => Buf::F(as_f32(bits)),
        }
    };
    for l in launches(&plan, i, warp).unwrap_or_else(|e| panic!("{e}")) {
        let mut bufs: Vec<Buf<'_>> = l
            .args
            .iter()
            .zip(&l.kernel.params)
            .map(|(a, (_, kind))| match a {
                launch::Arg::Operand(j) => match step.args[*j] {
                    Operand::Value(v) => value(v, &out, &cache),
                    Operand::Weight(w) => {
                        let w = &pb.weights[w];
                        match kind {
                            ParamKind::Experts { .. } => {
                                Buf::E(w.bytes.chunks(w.row_bytes() * w.ne[1]).collect())
                            }
                            _ => Buf::W(&w.bytes),
                        }
                    }
                },
                launch::Arg::Output => value(step.out, &out, &cache),
                launch::Arg::Cache(_) => Buf::F(cache.clone()),
                launch::Arg::Scratch { name, len } => {
                    let bits = scratch
                        .iter()
                        .find(|(n, _)| n == name)
                        .map(|(_, b)| b.clone())
                        .unwrap_or_else(|| vec![0; len.eval(t, s).expect("scratch")]);
                    match kind {
                        ParamKind::I32 { .. } => Buf::I(bits.iter().map(|&b| b as i32).collect()),
                        _ => Buf::F(as_f32(&bits)),
                    }
                }
            })
            .collect();
        let mut args: Vec<Arg<'_>> = bufs
            .iter_mut()
            .map(|b| match b {
                Buf::F(v) => Arg::F32(v),
                Buf::I(v) => Arg::I32(v),
                Buf::W(w) => Arg::Weight(w),
                Buf::E(e) => Arg::Experts(e),
            })
            .collect();
        x.run(&l.kernel, &mut args, t, s);
        drop(args);
        for ((a, (name, kind)), b) in l.args.iter().zip(&l.kernel.params).zip(bufs) {
            let writes = matches!(
                kind,
                ParamKind::F32 { writes: true, .. } | ParamKind::I32 { writes: true, .. }
            );
            if !writes {
                continue;
            }
            match (a, b) {
                (launch::Arg::Output, Buf::I(v)) => out = v.iter().map(|&x| x as u32).collect(),
                (launch::Arg::Output, Buf::F(v)) if !in_cache(step.out) => {
                    out = v.iter().map(|x| x.to_bits()).collect()
                }
                (launch::Arg::Output | launch::Arg::Cache(_), Buf::F(v)) => cache = v,
                (launch::Arg::Scratch { name, .. }, Buf::F(v)) => {
                    scratch.retain(|(n, _)| n != name);
                    scratch.push((name.clone(), v.iter().map(|x| x.to_bits()).collect()));
                }
                (launch::Arg::Scratch { name, .. }, Buf::I(v)) => {
                    scratch.retain(|(n, _)| n != name);
                    scratch.push((name.clone(), v.iter().map(|&x| x as u32).collect()));
                }
                (a, _) => panic!("kernel `{}` writes `{name}`, bound to {a:?}", l.kernel.name),
            }
        }
    }
    Written { out, cache }
}

/// Runs step `at` on `x` ([`run_step`]) and checks its output against the oracle's
/// (`at.vals`, or `cache_after` when the step writes the cache) under the bound of its op
/// ([`bounds::step_bound`]); i32 outputs must be equal. `what` names the case in a failure.
pub fn check_step(x: &dyn Exec, what: &str, at: StepIn<'_>, cache_after: &[f32], warp: u32) {
    let StepIn { pb, i, vals, .. } = at;
    let plan = pb.plan();
    let step = &plan.steps[i];
    let name = format!("{what}: step {i} ({}), warp {warp}", step.op.name());
    let got = run_step(x, at, warp);
    let to_cache = matches!(plan.values[step.out].storage, Storage::KvCache { .. });
    if to_cache {
        let row = plan.values[step.out].shape.0.last().map_or(1, |d| match d {
            aubier_compiler::types::Dim::Fixed(n) => *n,
            _ => 1,
        });
        let zero = vec![0.0; cache_after.len()];
        check(&name, &got.cache, cache_after, &zero, row, 0.0);
        return;
    }
    if plan.values[step.out].dtype == DType::I32 {
        let g: Vec<i32> = got.out.iter().map(|&b| b as i32).collect();
        let w: Vec<i32> = vals[step.out].iter().map(|&b| b as i32).collect();
        assert_eq!(g, w, "{name}");
        return;
    }
    let b = bounds::step_bound(x.ops(), at);
    check(
        &name,
        &as_f32(&got.out),
        &as_f32(&vals[step.out]),
        &b.per_element,
        b.row,
        b.cos_tol,
    );
}

/// One plan step at a time against the oracle: runs `pb`'s plan on the oracle with `inputs`
/// and the cache `cache` (updated in place), then every step on `x` through [`check_step`].
/// Returns the oracle's values. A plan here writes the cache in at most one step, and no other
/// step reads it, so every step's cache before is `cache` as given.
pub fn check_steps(
    x: &dyn Exec,
    what: &str,
    pb: &PlanB,
    inputs: &[(ValueId, Vec<u32>)],
    (t, s): (usize, usize),
    cache: &mut [f32],
    warp: u32,
) -> Vec<Vec<u32>> {
    let plan = pb.plan();
    let cache_steps = plan
        .steps
        .iter()
        .filter(|st| {
            let vs = st.args.iter().filter_map(|a| match a {
                Operand::Value(v) => Some(*v),
                Operand::Weight(_) => None,
            });
            vs.chain([st.out])
                .any(|v| matches!(plan.values[v].storage, Storage::KvCache { .. }))
        })
        .count();
    assert!(
        cache_steps <= 1,
        "{what}: {cache_steps} steps touch the cache"
    );
    let before = cache.to_vec();
    let vals = run_oracle(pb, inputs, t, s, cache);
    for i in 0..plan.steps.len() {
        let at = StepIn {
            pb,
            i,
            vals: &vals,
            cache: &before,
            t,
            s,
        };
        check_step(x, what, at, cache, warp);
    }
    vals
}
