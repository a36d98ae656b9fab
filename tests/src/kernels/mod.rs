//! The kernel tests shared by the test targets `kernels_steps` and `kernels_fused` (the GPU
//! kernels through their CPU execution, `aubier_kernels_gen::gpu::cpu_exec`) and `kernels_vulkan`
//! (the same cases on a Vulkan device): small hand-built plans run by the CPU oracle
//! (`aubier_kernels_gen::cpu`), the kernels `gpu::steps::for_step` maps their steps to, run by an
//! executor ([`exec::Exec`]: the CPU execution at the sampled warp widths, or the device at its
//! subgroup width), and the comparison of the two under an a-priori error bound (ARCHITECTURE.md
//! § numerics: `|x − y| ≤ A + k·u·|ref|` per element, NaN/Inf positions equal, per-row cosine;
//! the worst element is reported). [`steps`] and [`fused`] hold the cases and their strategies,
//! [`bounds`] the bound of every step kind with its derivation.

pub mod bounds;
mod case;
pub mod exec;
pub mod fused;
pub mod steps;
pub mod vulkan;

use aubier_compiler::config::{ExpertLayout, Mistral4Config, YarnParams};
use aubier_compiler::ops::Op;
use aubier_compiler::plan::{Operand, Plan, Step, Storage, Value, ValueId};
use aubier_compiler::types::{Attrs, DType, Dim, Shape, WeightRef};
use aubier_kernels_gen::cpu::{CpuProgram, StepArgs};
use aubier_kernels_gen::gpu::cpu_exec::{self, Arg};
use aubier_kernels_gen::gpu::ir::Kernel;
use aubier_runtime::ggml_type::GgmlType;
use aubier_runtime::gguf::quant::dequantize_row;
use rand::{Rng, SeedableRng};

/// The warp widths the CPU execution builds and runs the kernels at: lavapipe's 8, CUDA's 32,
/// AMD wave64's 64.
pub const WARPS: [u32; 3] = [8, 32, 64];

/// Unit roundoff of f32.
pub const U: f64 = 1.0 / (1u64 << 24) as f64;

/// The absolute term of every bound: eight subnormal ulps (`2⁻¹⁴⁶`), since products of
/// subnormals round in absolute, not relative, terms.
pub const A: f64 = 8.0 * 1.401_298_464_324_817e-45;

/// A weight: ggml type, `ne` and raw bytes.
#[derive(Clone, Debug)]
pub struct W {
    pub ty: String,
    pub ne: Vec<usize>,
    pub bytes: Vec<u8>,
}

impl W {
    /// An F32 weight.
    pub fn f32(ne: Vec<usize>, vals: &[f32]) -> W {
        W {
            ty: "F32".into(),
            ne,
            bytes: vals.iter().flat_map(|v| v.to_le_bytes()).collect(),
        }
    }

    /// A random valid weight of `ty` (rows of `ne[0]`, RMS `std`), from the runtime's sampler.
    pub fn random(ty: &str, ne: Vec<usize>, seed: u64, std: f32) -> W {
        let t = GgmlType::from_name(ty).expect("type");
        let sampler = aubier_runtime::gguf::quant::random::BlockSampler::new(t).expect("sampler");
        let rb = t.row_size(ne[0]).expect("row size");
        let rows: usize = ne[1..].iter().product();
        let mut bytes = vec![0u8; rb * rows];
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        for r in bytes.chunks_exact_mut(rb) {
            sampler.fill_row(&mut rng, std, ne[0], r).expect("fill");
        }
        W {
            ty: ty.into(),
            ne,
            bytes,
        }
    }

    /// Row bytes.
    pub fn row_bytes(&self) -> usize {
        GgmlType::from_name(&self.ty)
            .and_then(|t| t.row_size(self.ne[0]))
            .expect("row size")
    }

    /// Every element, dequantized (row-major over `ne`).
    pub fn values(&self) -> Vec<f32> {
        let t = GgmlType::from_name(&self.ty).expect("type");
        let rb = self.row_bytes();
        let mut out = vec![0f32; self.bytes.len() / rb * self.ne[0]];
        for (r, o) in self
            .bytes
            .chunks_exact(rb)
            .zip(out.chunks_exact_mut(self.ne[0]))
        {
            dequantize_row(t, r, o).expect("dequantize");
        }
        out
    }
}

/// A config for hand-built plans (only `plan.config` needs one; the steps carry their shapes).
pub fn config() -> Mistral4Config {
    Mistral4Config {
        arch: "mistral4".into(),
        n_layer: 1,
        n_embd: 8,
        n_vocab: 16,
        n_ctx_train: 64,
        n_head: 1,
        q_lora_rank: 8,
        kv_lora_rank: 8,
        qk_nope_head_dim: 4,
        qk_rope_head_dim: 4,
        v_head_dim: 4,
        rms_norm_eps: 1e-6,
        n_expert: 4,
        n_expert_used: 2,
        n_expert_shared: 0,
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

/// RoPE over the first `n_rot` dims, base 10 000, with YaRN (factor 128 over an original context
/// of 8192) when `on`.
pub fn yarn(n_rot: usize, on: bool) -> YarnParams {
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

/// A plan under construction; every value gets its own slot except latent-cache values.
#[derive(Default)]
pub struct PlanB {
    pub values: Vec<Value>,
    pub weights: Vec<W>,
    pub steps: Vec<Step>,
}

pub fn fx(n: usize) -> Dim {
    Dim::Fixed(n)
}

impl PlanB {
    /// A new value.
    pub fn value(&mut self, dtype: DType, dims: Vec<Dim>, cache: bool) -> ValueId {
        let id = self.values.len();
        self.values.push(Value {
            dtype,
            shape: Shape(dims),
            storage: if cache {
                Storage::KvCache { layer: 0 }
            } else {
                Storage::Slot(id)
            },
            name: format!("v{id}"),
        });
        id
    }

    /// A weight operand.
    pub fn weight(&mut self, w: W) -> Operand {
        self.weights.push(w);
        Operand::Weight(self.weights.len() - 1)
    }

    /// A step writing a new f32 (or `dtype`) value of `dims`.
    pub fn step(
        &mut self,
        op: Op,
        attrs: Attrs,
        args: Vec<Operand>,
        dtype: DType,
        dims: Vec<Dim>,
    ) -> ValueId {
        let out = self.value(dtype, dims, op == Op::CacheWrite);
        self.steps.push(Step {
            op,
            attrs,
            args,
            out,
        });
        out
    }

    /// A `slice` step: `len` elements from `offset` of each row of `x`, into a new f32 value of
    /// `dims`.
    pub fn slice(&mut self, x: ValueId, offset: usize, len: usize, dims: Vec<Dim>) -> ValueId {
        self.step(
            Op::Slice,
            Attrs::Slice { offset, len },
            vec![v(x)],
            DType::F32,
            dims,
        )
    }

    /// Every value's bits at `T = t`, `S = s`: zeros, then `inputs` by id.
    pub fn buffers(&self, inputs: &[(ValueId, Vec<u32>)], t: usize, s: usize) -> Vec<Vec<u32>> {
        let mut bufs: Vec<Vec<u32>> = self
            .values
            .iter()
            .map(|val| vec![0u32; val.shape.numel(t, s)])
            .collect();
        for (id, data) in inputs {
            assert_eq!(bufs[*id].len(), data.len(), "input {id} size");
            bufs[*id].clone_from(data);
        }
        bufs
    }

    /// The plan.
    pub fn plan(&self) -> Plan {
        Plan {
            config: config(),
            stages: vec!["test".into()],
            weights: self
                .weights
                .iter()
                .enumerate()
                .map(|(i, w)| WeightRef {
                    name: format!("w{i}"),
                    ggml_type: w.ty.clone(),
                    ne: w.ne.clone(),
                })
                .collect(),
            n_slots: self.values.len(),
            inputs: Vec::new(),
            outputs: Vec::new(),
            values: self.values.clone(),
            steps: self.steps.clone(),
            output_head: None,
        }
    }
}

pub fn v(id: ValueId) -> Operand {
    Operand::Value(id)
}

pub fn f32s(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

pub fn i32s(v: &[i32]) -> Vec<u32> {
    v.iter().map(|&x| x as u32).collect()
}

pub fn as_f32(v: &[u32]) -> Vec<f32> {
    v.iter().map(|&b| f32::from_bits(b)).collect()
}

/// Runs `pb`'s plan with the CPU oracle at `T = t`, `S = s`; `inputs` fill values by id;
/// `cache` is the latent cache layer (rows of its value's width). Returns every value's bits.
pub fn run_oracle(
    pb: &PlanB,
    inputs: &[(ValueId, Vec<u32>)],
    t: usize,
    s: usize,
    cache: &mut [f32],
) -> Vec<Vec<u32>> {
    let plan = pb.plan();
    let host = aubier_runtime::gguf::quant::host_symbols();
    let prog = CpuProgram::compile(&plan, &host).expect("oracle lowering");
    let mut bufs = pb.buffers(inputs, t, s);
    for (step, cs) in plan.steps.iter().zip(prog.steps()) {
        let mut scratch = vec![0f32; cs.scratch.eval(t, s).expect("scratch")];
        // Per-expert address tables for the operands the step reads through one.
        let tables: Vec<(usize, Vec<u64>)> = cs
            .expert_tables
            .iter()
            .map(|et| {
                let Operand::Weight(w) = step.args[et.arg] else {
                    panic!("expert table of a value")
                };
                let base = pb.weights[w].bytes.as_ptr() as u64;
                (
                    et.arg,
                    (0..et.n_expert)
                        .map(|e| base + (e * et.expert_bytes) as u64)
                        .collect(),
                )
            })
            .collect();
        for kernel in &cs.kernels {
            let work = kernel.work().eval(t, s).expect("work");
            let mut a = StepArgs::new(t, s, 0, work);
            for (j, op) in step.args.iter().enumerate() {
                a.args[j] = match op {
                    Operand::Value(id) => {
                        if plan.values[*id].storage == (Storage::KvCache { layer: 0 }) {
                            cache.as_ptr() as *const u8
                        } else {
                            bufs[*id].as_ptr() as *const u8
                        }
                    }
                    Operand::Weight(w) => match tables.iter().find(|(arg, _)| *arg == j) {
                        Some((_, tab)) => tab.as_ptr() as *const u8,
                        None => pb.weights[*w].bytes.as_ptr(),
                    },
                };
            }
            a.out = if plan.values[step.out].storage == (Storage::KvCache { layer: 0 }) {
                cache.as_mut_ptr() as *mut u8
            } else {
                bufs[step.out].as_mut_ptr() as *mut u8
            };
            a.scratch = scratch.as_mut_ptr();
            // SAFETY: every buffer is sized by its value's shape at (t, s); the cache holds `s`
            // rows; ids and positions in the inputs are in range (the tests generate them so).
            unsafe { kernel.call(&a) };
        }
    }
    bufs
}

/// The dequant callback of the CPU execution: the runtime's bit-exact row decoder on the blocks
/// that hold chunk `c`.
pub fn dequant16(ty: &str, row: &[u8], c: usize, out: &mut [f32; 16]) -> Result<(), String> {
    let t = GgmlType::from_name(ty).ok_or_else(|| format!("unknown type {ty}"))?;
    let (be, bb) = (t.block_size(), t.type_size());
    let first = 16 * c;
    if be == 1 {
        let src = row
            .get(first * bb..(first + 16) * bb)
            .ok_or("chunk past the row")?;
        return dequantize_row(t, src, out).map_err(|e| e.to_string());
    }
    let b = first / be;
    let src = row.get(b * bb..(b + 1) * bb).ok_or("chunk past the row")?;
    let mut tmp = vec![0f32; be];
    dequantize_row(t, src, &mut tmp).map_err(|e| e.to_string())?;
    out.copy_from_slice(&tmp[first % be..first % be + 16]);
    Ok(())
}

/// Runs a GPU kernel's CPU execution; panics with the kernel's error.
pub fn run_gpu(k: &Kernel, args: &mut [Arg<'_>], t: usize, s: usize) {
    cpu_exec::run(k, args, t, s, &dequant16).unwrap_or_else(|e| panic!("{e}"));
}

/// Compares `got` with `want` element-wise: `|got − want| ≤ bound[i]` for finite pairs, the same
/// NaN and ±∞ positions; then, per row of `row` elements that is all finite with a nonzero
/// reference, cosine similarity ≥ `1 − cos_tol`. Panics naming the worst element.
pub fn check(what: &str, got: &[f32], want: &[f32], bound: &[f64], row: usize, cos_tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let mut worst: Option<(usize, f64)> = None;
    for i in 0..got.len() {
        let (g, w) = (got[i] as f64, want[i] as f64);
        if w.is_nan() || g.is_nan() {
            assert!(
                w.is_nan() && g.is_nan(),
                "{what}[{i}]: got {g}, want {w} (NaN positions differ)"
            );
            continue;
        }
        if w.is_infinite() || g.is_infinite() {
            assert_eq!(g, w, "{what}[{i}]: infinities differ");
            continue;
        }
        let excess = (g - w).abs() / bound[i].max(f64::MIN_POSITIVE);
        if worst.is_none_or(|(_, e)| excess > e) {
            worst = Some((i, excess));
        }
    }
    if let Some((i, e)) = worst {
        assert!(
            e <= 1.0,
            "{what}: worst element {i}: got {}, want {}, |err| {:e} > bound {:e}",
            got[i],
            want[i],
            (got[i] as f64 - want[i] as f64).abs(),
            bound[i]
        );
    }
    for (r, (g, w)) in got
        .chunks(row.max(1))
        .zip(want.chunks(row.max(1)))
        .enumerate()
    {
        if !g.iter().chain(w).all(|x| x.is_finite()) {
            continue;
        }
        let (mut dot, mut ng, mut nw) = (0f64, 0f64, 0f64);
        for (&a, &b) in g.iter().zip(w) {
            dot += a as f64 * b as f64;
            ng += a as f64 * a as f64;
            nw += b as f64 * b as f64;
        }
        if nw == 0.0 || ng == 0.0 || !(nw.is_normal() && ng.is_normal()) {
            continue;
        }
        // 1e-12 covers the f64 rounding of the cosine itself (identical rows give 1 − 2e-16).
        let cos = dot / (ng.sqrt() * nw.sqrt());
        assert!(
            cos >= 1.0 - cos_tol - 1e-12,
            "{what}: row {r} cosine {cos} < 1 − {cos_tol:e}"
        );
    }
}

/// `n` values of [`special`]'s classes (all of them) at magnitude `scale`, from `seed`.
pub fn vals(seed: u64, n: usize, scale: f32) -> Vec<f32> {
    draw(&mut rng(seed), n, scale, 100)
}

/// A ChaCha8 generator from `seed`.
pub fn rng(seed: u64) -> rand_chacha::ChaCha8Rng {
    rand_chacha::ChaCha8Rng::seed_from_u64(seed)
}

/// `n` values with the special classes of [`special`] at magnitude `scale`: none (`0`), all
/// (`100`), or all but the large magnitudes (`96`).
pub fn draw(r: &mut impl Rng, n: usize, scale: f32, classes: u8) -> Vec<f32> {
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

/// A value drawn from `u ∈ [0, 1)` and a magnitude class: normal (±`scale`), ±0, subnormal, or
/// large (±1e15·scale); `class` in 0..100 picks them 88/4/4/4.
pub fn special(u: f32, class: u8, scale: f32) -> f32 {
    let sign = if u < 0.5 { -1.0 } else { 1.0 };
    match class {
        0..=87 => (u * 2.0 - 1.0) * scale,
        88..=91 => sign * 0.0,
        92..=95 => sign * f32::from_bits(1 + (u * 8_000_000.0) as u32),
        _ => sign * (1.0 + u) * 1e15 * scale,
    }
}
