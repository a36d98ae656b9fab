//! The `cpu` backend: hand-written SIMD kernels for the steps that dominate a token
//! ([`kernels`]: quantized products over Q8_K activations, f32 GEMM, attention and elementwise
//! steps in vector lanes), the cranelift kernel of the oracle lowering for every other step.
//!
//! Contract. Plans are compiled for [`Target::Cpu`] (latent attention fused into `kqkv`, the
//! rest unfused). Binding gives every step a kernel: its own where [`kernels::kernel_for`] has
//! one, else the step's cranelift kernel (a step the oracle lowers), recorded as such; a fused
//! step other than `kqkv` is refused by name. The kernels dispatch once per process on the CPU's
//! ISA tier ([`isa`]: AMX, AVX-512 VNNI, AVX2 or scalar), each tier with the bits of the scalar
//! kernel. Numerics: [`CpuNumerics`].

pub(crate) mod exact;
pub(crate) mod kernels;
mod layout;
pub mod q8;

use super::host::{self, HostBinding, HostKernel, StepIo, StepKernel, WeightRows};
use super::oracle::cranelift_step;
use super::{
    Backend, BackendError, BindError, Binding, BoundStep, ExecError, KernelChoice, LoadInput,
    Loaded,
};
use crate::progress::Progress;
use aubier_compiler::plan::Plan;
use aubier_compiler::Target;
use aubier_kernels_gen::cpu::StepArgs;
use kernels::{CpuBuffers, CpuKernel, WeightProduct, ROPE_MAX_PAIRS};

/// How the `cpu` backend quantizes the activations of its weight products.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CpuNumerics {
    /// One Q8_K plane per activation row, as llama.cpp's CPU backend.
    Q8,
    /// Two Q8_K planes, the value and its rounding residual (about 15 significant bits; twice the
    /// integer work), except the output head's input (one plane). The default.
    #[default]
    Q8x2,
}

impl CpuNumerics {
    /// Q8_K planes per activation row.
    pub fn planes(self) -> usize {
        match self {
            CpuNumerics::Q8 => 1,
            CpuNumerics::Q8x2 => 2,
        }
    }
}

impl std::str::FromStr for CpuNumerics {
    type Err = String;

    /// `q8` or `q8x2`.
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "q8" => Ok(CpuNumerics::Q8),
            "q8x2" => Ok(CpuNumerics::Q8x2),
            _ => Err(format!("unknown CPU numerics `{s}` (expected q8x2 or q8)")),
        }
    }
}

impl std::fmt::Display for CpuNumerics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CpuNumerics::Q8 => "q8",
            CpuNumerics::Q8x2 => "q8x2",
        })
    }
}

/// The ISA tier the `cpu` backend's kernels run on here ([`crate::isa::Isa::tier`]): `amx`,
/// `avx512-vnni`, `avx2` or `scalar`.
pub fn isa() -> &'static str {
    crate::isa::isa().tier()
}

/// The `cpu` backend with its numerics.
#[derive(Clone, Copy, Debug)]
pub struct CpuBackend {
    numerics: CpuNumerics,
    /// Whether it copies weights into its own layout ([`layout`]).
    copies: bool,
}

impl Default for CpuBackend {
    fn default() -> Self {
        CpuBackend::new(CpuNumerics::default())
    }
}

impl CpuBackend {
    /// The backend with `numerics`, copying weights into its layout (the product path).
    pub fn new(numerics: CpuNumerics) -> Self {
        CpuBackend {
            numerics,
            copies: true,
        }
    }

    /// This backend with its copies on (the default) or off: off, its slots hold experts in the
    /// file's layout and its kernels read every dense weight in place (the same bits, slower
    /// decode; for tests of the layout).
    pub fn with_copies(self, copies: bool) -> Self {
        CpuBackend { copies, ..self }
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> String {
        format!("cpu ({})", self.numerics)
    }

    fn target(&self) -> Target {
        Target::Cpu
    }

    fn bind(&self, plan: &Plan) -> Result<Binding, BindError> {
        let isa = isa();
        let mut kernels = Vec::with_capacity(plan.steps.len());
        let mut steps = Vec::with_capacity(plan.steps.len());
        for (i, step) in plan.steps.iter().enumerate() {
            let refuse = |reason: String| BindError {
                backend: self.name(),
                step: i,
                op: step.op.name(),
                reason,
            };
            match kernels::kernel_for(plan, i, self.numerics.planes()) {
                Some(k) => {
                    steps.push(BoundStep {
                        choice: KernelChoice {
                            kernel: k.name(),
                            variant: k.variant(isa),
                        },
                        one_token_matches_prefill: k.one_token_matches_prefill(),
                    });
                    kernels.push(HostKernel::Own(k));
                }
                None if step.op.is_fused() => {
                    return Err(refuse(format!(
                        "the cpu backend has no kernel for a fused `{}` of these operands (it \
                         fuses latent attention only: compile for the cpu target)",
                        step.op.name()
                    )))
                }
                None if !step.op.has_oracle() => {
                    return Err(refuse(
                        "the op has neither a cpu kernel nor an oracle lowering".into(),
                    ))
                }
                None => {
                    steps.push(cranelift_step(plan, i));
                    kernels.push(HostKernel::Cranelift);
                }
            }
        }
        Ok(Binding::new(self.name(), steps, HostBinding { kernels }))
    }

    fn load(
        &self,
        input: &LoadInput<'_>,
        progress: &mut dyn Progress,
    ) -> Result<Loaded, BackendError> {
        let layout = if self.copies {
            let moe = input
                .plan
                .moe_layers()
                .map_err(|e| crate::store::StoreError::Plan(e.to_string()))?;
            layout::host_layout(input.plan, &moe)
        } else {
            host::HostLayout::default()
        };
        host::load::<CpuKernel>(&self.name(), input, layout, progress)
    }
}

impl StepKernel for CpuKernel {
    type Buffers = CpuBuffers;

    fn run(&self, io: &StepIo<'_, '_>, buf: &mut CpuBuffers) -> Result<(), ExecError> {
        run(self, io, buf)
    }

    fn reads_expert_slices(&self) -> bool {
        matches!(self, CpuKernel::Moe(_))
    }

    fn name(&self) -> &'static str {
        CpuKernel::name(self)
    }
}

/// Runs `kernel` on the step of `io`.
///
/// Errors: [`ExecError::Value`] when an operand is not what the kernel was bound for;
/// [`ExecError::Index`] for a `kqkv` position outside the keys.
fn run(kernel: &CpuKernel, io: &StepIo<'_, '_>, buf: &mut CpuBuffers) -> Result<(), ExecError> {
    let (args, t, s) = (io.args, io.t, io.s);
    match *kernel {
        CpuKernel::MatMul(m) => {
            let w = io.weight(0)?;
            match io.copies.get(w) {
                Some((bytes, interleaved)) => {
                    let rows = WeightRows { bytes, interleaved };
                    let (x, y) = product_io(&m, args, t);
                    m.run_rows(rows, x, y, buf);
                }
                None => weight_product(&m, io, buf)?,
            }
        }
        CpuKernel::HeadMatMul(m) => weight_product(&m, io, buf)?,
        CpuKernel::HeadGemm(m) => weight_product(&m, io, buf)?,
        CpuKernel::F32MatMul(m) => weight_product(&m, io, buf)?,
        CpuKernel::Moe(m) => {
            let k = io.arg_numel(1)? / t;
            // SAFETY: h `[T, d]`, ids and weights `[T, k]`, the output `[T, d]` are distinct
            // slots sized by the executor; the ids were checked below the expert count before
            // this step.
            let (h, ids, wts, y) = unsafe {
                (
                    std::slice::from_raw_parts(args.args[0] as *const f32, t * m.width()),
                    std::slice::from_raw_parts(args.args[1] as *const i32, t * k),
                    std::slice::from_raw_parts(args.args[2] as *const f32, t * k),
                    std::slice::from_raw_parts_mut(args.out as *mut f32, t * m.width()),
                )
            };
            m.run(h, ids, wts, io.expert_slices, y, buf);
        }
        CpuKernel::Scores { w } => {
            let rows = io.arg_numel(0)? / w;
            // SAFETY: q `[rows, w]` in its slot, the keys `[S, w]` in the latent cache (checked
            // by the executor), the output `[rows, S]` in its own slot.
            let (q, k, y) = unsafe {
                (
                    std::slice::from_raw_parts(args.args[0] as *const f32, rows * w),
                    std::slice::from_raw_parts(args.args[1] as *const f32, s * w),
                    std::slice::from_raw_parts_mut(args.out as *mut f32, rows * s),
                )
            };
            kernels::scores(q, k, y, w, None);
        }
        CpuKernel::Softmax { n } => {
            // SAFETY: input and output of `numel` elements in distinct slots (the lowering
            // refuses a step whose output aliases an operand).
            let (x, y) = unsafe { unary_io(args, io.out_numel()) };
            kernels::softmax(x, y, n.unwrap_or(s));
        }
        CpuKernel::Scale { c } => {
            // SAFETY: as for the softmax.
            let (x, y) = unsafe { unary_io(args, io.out_numel()) };
            kernels::scale(x, y, c);
        }
        CpuKernel::RmsNorm { n, eps } => {
            let w = io.weight(1)?;
            // SAFETY: as for the softmax.
            let (x, y) = unsafe { unary_io(args, io.out_numel()) };
            let g = buf.f32_weight(&io.weights[w][..n * 4]);
            kernels::rms_norm(x, g, y, eps);
        }
        CpuKernel::CausalMask => {
            // SAFETY: scores and output `[T, .., S]` (`numel` elements) in distinct slots, the
            // positions `[T]` (i32) in theirs (the lowering checked the shapes).
            let (x, pos, y) = unsafe { rows_and_positions(args, io.out_numel(), t) };
            kernels::causal_mask(x, pos, y, s);
        }
        CpuKernel::Silu => {
            // SAFETY: as for the softmax.
            let (x, y) = unsafe { unary_io(args, io.out_numel()) };
            kernels::silu(x, y);
        }
        CpuKernel::Temperature { beta, length } => {
            // SAFETY: input and output `[T, n]` in distinct slots, the positions `[T]` (i32) in
            // theirs (the lowering checked the shapes).
            let (x, pos, y) = unsafe { rows_and_positions(args, io.out_numel(), t) };
            kernels::temperature(x, pos, y, beta, length);
        }
        CpuKernel::Rope {
            d,
            pairs,
            theta,
            af,
        } => {
            // SAFETY: as for the temperature: `[T, rows, d]` in and out, `[T]` positions.
            let (x, pos, y) = unsafe { rows_and_positions(args, io.out_numel(), t) };
            kernels::rope(x, pos, y, d, &theta[..pairs.min(ROPE_MAX_PAIRS)], af);
        }
        CpuKernel::WeightedSum { w, len } => {
            let rows = io.arg_numel(0)? / s;
            // SAFETY: p `[rows, S]` in its slot, the values `[S, w]` in the latent cache, the
            // output `[rows, len]` in its own slot.
            let (p, v, y) = unsafe {
                (
                    std::slice::from_raw_parts(args.args[0] as *const f32, rows * s),
                    std::slice::from_raw_parts(args.args[1] as *const f32, s * w),
                    std::slice::from_raw_parts_mut(args.out as *mut f32, rows * len),
                )
            };
            kernels::weighted_sum(p, v, y, w, len);
        }
        CpuKernel::Kqkv {
            heads,
            w,
            len,
            scale,
        } => latent_attention(io, heads, (w, len), scale, buf)?,
    }
    Ok(())
}

/// `kqkv` over the step of `io`: `heads` query rows of `w` values per token, the keys' first
/// `len` values summed (`widths = (w, len)`), scores scaled by `scale` — the five steps it fuses
/// in their order, each with its unfused kernel's bits, alternating between `buf.att`'s two
/// `[rows, S]` buffers, over runs of tokens ([`ATT_BYTES`]).
///
/// Errors: [`ExecError::Index`] for a position outside the keys.
fn latent_attention(
    io: &StepIo<'_, '_>,
    heads: usize,
    (w, len): (usize, usize),
    scale: f32,
    buf: &mut CpuBuffers,
) -> Result<(), ExecError> {
    let (args, t, s) = (io.args, io.t, io.s);
    let rows = t * heads;
    // SAFETY: q `[T, heads, w]` and the output `[T, heads, len]` in distinct slots, the
    // positions `[T]` (i32) in theirs, the keys `[S, w]` in the latent cache (the binding
    // checked these shapes, the executor the cache's extent).
    let (q, pos, k, y) = unsafe {
        (
            std::slice::from_raw_parts(args.args[0] as *const f32, rows * w),
            std::slice::from_raw_parts(args.args[1] as *const i32, t),
            std::slice::from_raw_parts(args.args[2] as *const f32, s * w),
            std::slice::from_raw_parts_mut(args.out as *mut f32, rows * len),
        )
    };
    if let Some((index, &p)) = pos
        .iter()
        .enumerate()
        .find(|(_, &p)| usize::try_from(p).map_or(true, |p| p >= s))
    {
        return Err(ExecError::Index {
            step: io.index,
            op: io.step.op.name(),
            what: "position",
            index,
            id: i64::from(p),
            bound: s,
        });
    }
    let run = (ATT_BYTES / (2 * 4 * (heads * s).max(1))).clamp(1, t);
    attention_runs(q, pos, k, y, (heads, w, len), scale, run, &mut buf.att);
    Ok(())
}

/// The chain of [`latent_attention`] over runs of `run` tokens: q `[T, heads, w]`, pos `[T]`,
/// k `[S, w]`, y `[T, heads, len]`. Every row is independent, so any `run` gives the bits of one
/// run over all tokens, while `att` holds only `2 · run · heads · S` values.
#[allow(clippy::too_many_arguments)] // the chain's operands, extents and buffers
fn attention_runs(
    q: &[f32],
    pos: &[i32],
    k: &[f32],
    y: &mut [f32],
    (heads, w, len): (usize, usize, usize),
    scale: f32,
    run: usize,
    att: &mut [Vec<f32>; 2],
) {
    let s = k.len() / w.max(1);
    let per_token = heads * s;
    let [a, b] = att;
    a.resize(run * per_token, 0.0);
    b.resize(run * per_token, 0.0);
    for t0 in (0..pos.len()).step_by(run.max(1)) {
        let n = run.min(pos.len() - t0);
        let (a, b) = (&mut a[..n * per_token], &mut b[..n * per_token]);
        let pos = &pos[t0..t0 + n];
        kernels::scores(&q[t0 * heads * w..(t0 + n) * heads * w], k, a, w, Some(pos));
        kernels::scale(a, b, scale);
        kernels::causal_mask(b, pos, a, s);
        kernels::softmax(a, b, s);
        let out = &mut y[t0 * heads * len..(t0 + n) * heads * len];
        kernels::weighted_sum(b, k, out, w, len);
    }
}

/// Bytes of `kqkv`'s two score buffers ([`latent_attention`]): a prefill of 512 tokens over 512
/// keys and 32 heads would take 64 MiB at once, this takes runs of 64 tokens.
const ATT_BYTES: usize = 8 << 20;

/// Runs the weight product `p` of the step (operand 0 its weight, operand 1 its input).
fn weight_product<P: WeightProduct>(
    p: &P,
    io: &StepIo<'_, '_>,
    buf: &mut CpuBuffers,
) -> Result<(), ExecError> {
    let w = io.weight(0)?;
    let (x, y) = product_io(p, io.args, io.t);
    p.run(io.weights[w], x, y, buf);
    Ok(())
}

/// The input `[t, n_in]` and output `[t, n_out]` of a weight product's step.
fn product_io<'a, P: WeightProduct>(
    p: &P,
    args: &StepArgs,
    t: usize,
) -> (&'a [f32], &'a mut [f32]) {
    let (x, y) = (p.input_len(t), p.output_len(t));
    // SAFETY: the executor sized the input's and the output's slots for their values at (T, S)
    // (at least `t` rows); the CPU lowering refused a step whose output aliases an operand, so
    // the two do not overlap; the slots outlive the step that uses these slices.
    unsafe {
        (
            std::slice::from_raw_parts(args.args[1] as *const f32, x),
            std::slice::from_raw_parts_mut(args.out as *mut f32, y),
        )
    }
}

/// Operand 0 and the output (`numel` f32 each) of an elementwise step.
///
/// # Safety
/// `args` holds the step's bound addresses: operand 0 and the output are distinct slots of at
/// least `numel` f32, live while the slices are used.
unsafe fn unary_io<'a>(args: &StepArgs, numel: usize) -> (&'a [f32], &'a mut [f32]) {
    // SAFETY: the caller's contract.
    unsafe {
        (
            std::slice::from_raw_parts(args.args[0] as *const f32, numel),
            std::slice::from_raw_parts_mut(args.out as *mut f32, numel),
        )
    }
}

/// Operand 0 (`numel` f32), operand 1 (`t` i32 positions) and the output (`numel` f32) of an
/// elementwise step by position (`causal_mask`, `attn_temperature`, `rope_yarn`).
///
/// # Safety
/// `args` holds the step's bound addresses: operand 0 and the output are distinct slots of at
/// least `numel` f32, operand 1 a slot of at least `t` i32, live while the slices are used.
unsafe fn rows_and_positions<'a>(
    args: &StepArgs,
    numel: usize,
    t: usize,
) -> (&'a [f32], &'a [i32], &'a mut [f32]) {
    // SAFETY: the caller's contract.
    unsafe {
        (
            std::slice::from_raw_parts(args.args[0] as *const f32, numel),
            std::slice::from_raw_parts(args.args[1] as *const i32, t),
            std::slice::from_raw_parts_mut(args.out as *mut f32, numel),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::attention_runs;

    /// Runs of 1, 2, 3 and 5 tokens give the bits of one run over the whole prompt (the causal
    /// cut included: the prompt's positions end at the last key).
    #[test]
    fn attention_in_runs_of_tokens_gives_the_bits_of_one_run() {
        let (t, s, heads, w, len) = (7usize, 20usize, 3usize, 43usize, 37usize);
        let val = |i: usize| ((i * 7919 % 1000) as f32 / 250.0 - 2.0) * 0.5;
        let q: Vec<f32> = (0..t * heads * w).map(val).collect();
        let k: Vec<f32> = (0..s * w).map(|i| val(i + 13)).collect();
        let pos: Vec<i32> = (0..t).map(|i| (s - t + i) as i32).collect();
        let attend = |run: usize| {
            let mut y = vec![0f32; t * heads * len];
            let mut att = [Vec::new(), Vec::new()];
            attention_runs(&q, &pos, &k, &mut y, (heads, w, len), 0.125, run, &mut att);
            assert!(att[0].len() <= run * heads * s);
            y.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        };
        let whole = attend(t);
        assert!(whole.iter().any(|&b| f32::from_bits(b) != 0.0));
        for run in [1, 2, 3, 5] {
            assert_eq!(attend(run), whole, "runs of {run}");
        }
    }
}
