//! Backends: what executes a compiled [`Plan`] (ARCHITECTURE.md § runtime, backends).
//!
//! Contract. A backend fixes the compile target of the plans it runs ([`Backend::target`]: which
//! fusions `Auto` turns on) and *binds* a compiled plan: it chooses a kernel for every step, or
//! refuses the plan naming the first step it cannot run and why ([`BindError`]) — never a silent
//! fallback to another backend. The choice is recorded in the [`Binding`] (the kernel and its
//! variant per step: ISA, planes, layout), which `aubier gen --plan --backend` prints and the
//! executor runs.
//!
//! Backends of this build ([`BackendKind`], `--backend`):
//! - `oracle` ([`oracle`]): the cranelift lowering of the unfused plan, f32 activations; the
//!   numerics reference.
//! - `cpu` ([`cpu`]): hand-written SIMD kernels (AVX2 / AVX-512 VNNI / AMX) over activations
//!   quantized to Q8_K, latent attention fused; the steps without a kernel of their own take the
//!   cranelift kernel, recorded as such. Its numerics ([`cpu::CpuNumerics`]) are an option of
//!   the backend.
//! - `vulkan` ([`vulkan`]): the generated GPU kernels of the GPU target (PHASE, WKB and KQKV
//!   fused) as GLSL compute shaders on a Vulkan device, the latent cache in device memory.
//! - `auto`, the default of the library and of the command line (the product path): `vulkan`
//!   on a hardware GPU when the machine has one, else `cpu` — a software Vulkan device
//!   (lavapipe) only when named.
//!
//! [`vulkan`] is the device layer of a Vulkan backend to come (devices, buffers, pipelines,
//! GLSL compiled to SPIR-V); it is not a `--backend` yet.
//!
//! The backends read weights through the contract here too: [`ExpertSource`] (where the split
//! expert store keeps its copies) and [`WeightFile`] (the mapped file read without mapping);
//! [`ExecError`] is how a run fails.

pub mod cpu;
pub mod oracle;
pub mod vulkan;

use aubier_compiler::plan::{Plan, ValueId, WeightId};
use aubier_compiler::{CompileOptions, Target};
use serde::Serialize;

/// A backend: the compile target of its plans and the binding of a compiled plan to kernels.
pub trait Backend: std::fmt::Debug + Send + Sync {
    /// The compile target of the plans this backend runs.
    fn target(&self) -> Target;

    /// Chooses a kernel for every step of `plan` (compiled for [`Backend::target`], or with the
    /// fusions the backend has kernels for).
    ///
    /// Errors: [`BindError`] naming the first step the backend has no kernel for.
    fn bind(&self, plan: &Plan) -> Result<Binding, BindError>;
}

/// A backend of this build, as `--backend` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendKind {
    /// The cranelift oracle ([`oracle::OracleBackend`]).
    Oracle,
    /// The CPU kernels ([`cpu::CpuBackend`]) with the given numerics.
    Cpu(cpu::CpuNumerics),
    /// The GPU kernels on a Vulkan device ([`vulkan::VulkanBackend`]).
    Vulkan(vulkan::DeviceChoice),
    /// `Vulkan` on the first hardware GPU when there is one, else `Cpu` with its default
    /// numerics ([`BackendKind::resolve`]).
    Auto,
}

impl Default for BackendKind {
    /// The product path: [`BackendKind::Auto`].
    fn default() -> Self {
        BackendKind::Auto
    }
}

impl BackendKind {
    /// `Auto` made concrete: `Vulkan` on the first hardware Vulkan device when the machine has
    /// one (a software device such as lavapipe is never chosen), else `Cpu` with its default
    /// numerics. Every other kind is itself.
    pub fn resolve(self) -> BackendKind {
        match self {
            BackendKind::Auto => match vulkan::device::select(None, false) {
                Ok(d) => BackendKind::Vulkan(vulkan::DeviceChoice {
                    index: Some(d.index),
                }),
                Err(_) => BackendKind::Cpu(cpu::CpuNumerics::default()),
            },
            k => k,
        }
    }

    /// The backend itself (`Auto` [resolved](BackendKind::resolve) first).
    pub fn backend(self) -> Box<dyn Backend> {
        match self.resolve() {
            BackendKind::Oracle => Box::new(oracle::OracleBackend),
            BackendKind::Cpu(numerics) => Box::new(cpu::CpuBackend::new(numerics)),
            BackendKind::Vulkan(device) => Box::new(vulkan::VulkanBackend { device }),
            BackendKind::Auto => Box::new(cpu::CpuBackend::new(cpu::CpuNumerics::default())),
        }
    }

    /// The compile options of a plan for this backend: its target, every fusion `Auto`.
    pub fn compile_options(self) -> CompileOptions {
        CompileOptions {
            target: self.backend().target(),
            ..CompileOptions::default()
        }
    }
}

impl std::fmt::Display for BackendKind {
    /// `oracle`, `cpu (q8x2)` / `cpu (q8)`, `vulkan` / `vulkan (device N)`, `auto`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BackendKind::Oracle => f.write_str("oracle"),
            BackendKind::Cpu(n) => write!(f, "cpu ({n})"),
            BackendKind::Vulkan(vulkan::DeviceChoice { index: None }) => f.write_str("vulkan"),
            BackendKind::Vulkan(vulkan::DeviceChoice { index: Some(i) }) => {
                write!(f, "vulkan (device {i})")
            }
            BackendKind::Auto => f.write_str("auto"),
        }
    }
}

/// The kernel a backend chose for one step, as printed by `aubier gen --plan --backend`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct KernelChoice {
    /// The kernel (`cranelift`, `q8_mat_mul`, `latent_attention`, …).
    pub kernel: &'static str,
    /// Its variant on this machine: ISA, Q8_K planes, weight layout (empty when it has none).
    pub variant: String,
}

/// How the host executor runs one step.
#[derive(Clone, Debug)]
pub(crate) enum HostKernel {
    /// The step's cranelift kernels.
    Cranelift,
    /// A kernel of the CPU backend.
    Cpu(Box<cpu::CpuKernel>),
    /// Kernels of a device backend, which the host executor does not run.
    Device,
}

/// One bound step: the recorded choice and what runs it.
#[derive(Clone, Debug)]
pub struct BoundStep {
    /// The choice, for display.
    pub choice: KernelChoice,
    pub(crate) kernel: HostKernel,
}

/// A plan bound to a backend: one [`BoundStep`] per plan step, in plan order.
#[derive(Clone, Debug)]
pub struct Binding {
    /// The backend that made it.
    pub backend: BackendKind,
    /// Per plan step, in order.
    pub steps: Vec<BoundStep>,
}

impl Binding {
    /// Whether a run of one token computes the same bits for it (its latent cache rows, its
    /// logits, its routing) as a run of several tokens does, so that rows written by decode
    /// steps are those a prefill would write. True for the cranelift kernels (`oracle`) and the
    /// Vulkan kernels, which compute a token's row by the same code whatever the run's length;
    /// false as soon as a step takes a `cpu` kernel, whose one-token runs take other kernels
    /// (the decode kernels; the oracle's dot instead of sgemm for the F32 products) and differ
    /// in the last bits. `tests/prefix_cache.rs` checks all three on the bundled model (Vulkan
    /// on lavapipe, as CI runs it; a hardware GPU runs the same shaders, untested here). The
    /// prompt cache (`crate::session`) keeps only rows a cold prefill would write again.
    pub fn one_token_runs_match_prefill(&self) -> bool {
        self.steps
            .iter()
            .all(|s| !matches!(s.kernel, HostKernel::Cpu(_)))
    }
}

/// A backend refused a plan.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("backend `{backend}` cannot run step {step} (`{op}`): {reason}")]
pub struct BindError {
    /// The backend (`oracle`, `cpu`).
    pub backend: &'static str,
    /// Index of the step in the plan.
    pub step: usize,
    /// The step's op.
    pub op: &'static str,
    /// Why.
    pub reason: String,
}

/// Errors of running a bound plan (the host executor, `crate::executor`). Each names the step,
/// value, weight or input at fault.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// The program was not compiled from this plan.
    #[error("the plan has {plan} steps but the compiled program has {program}")]
    ProgramMismatch {
        /// Steps in the plan.
        plan: usize,
        /// Steps in the program.
        program: usize,
    },
    /// A plan value is malformed (missing, bad slot, bad cache shape).
    #[error("plan value {value} (`{name}`): {detail}")]
    Value {
        /// Value id.
        value: ValueId,
        /// Its name.
        name: String,
        /// What is wrong.
        detail: String,
    },
    /// A plan input is missing, or has the wrong length or shape.
    #[error("plan input `{name}`: {detail}")]
    Input {
        /// Input name (`tokens`, `pos`).
        name: String,
        /// What is wrong.
        detail: String,
    },
    /// The number of weight views differs from the plan's weights.
    #[error("{given} weight views were given, the plan reads {expected}")]
    WeightCount {
        /// Views given.
        given: usize,
        /// Weights in the plan.
        expected: usize,
    },
    /// A weight view has the wrong byte length.
    #[error("weight {index} (`{name}`): {given} bytes given, the program reads {expected}")]
    WeightSize {
        /// Weight id.
        index: usize,
        /// GGUF tensor name.
        name: String,
        /// Bytes given.
        given: usize,
        /// Bytes the program reads.
        expected: usize,
    },
    /// The latent cache does not fit the plan or the step.
    #[error("latent KV cache: {0}")]
    Cache(String),
    /// An index operand is out of range (a token id past the vocabulary, a NaN-poisoned router
    /// that selected no expert, a position past `S`).
    #[error("step {step} (`{op}`): {what} {id} at index {index} is outside 0..{bound}")]
    Index {
        /// Step index in the plan.
        step: usize,
        /// The op's name.
        op: &'static str,
        /// What the ids are.
        what: &'static str,
        /// Offending element's index in the operand.
        index: usize,
        /// Its value.
        id: i64,
        /// The exclusive upper bound.
        bound: usize,
    },
    /// An expert-table operand does not fit its weight (a plan/program mismatch).
    #[error("step {step}: expert table of operand {arg}: {detail}")]
    ExpertTable {
        /// Step index in the plan.
        step: usize,
        /// Operand index.
        arg: usize,
        /// What is wrong.
        detail: String,
    },
    /// An `embed` step could not read its rows from the file.
    #[error("step {step} (`embed`): {detail}")]
    Embed {
        /// Step index in the plan.
        step: usize,
        /// What went wrong.
        detail: String,
    },
    /// The step is bound to a device backend's kernels, which the host executor cannot run.
    #[error("step {step} is bound to device kernels; the host executor cannot run it")]
    DeviceStep {
        /// Step index in the plan.
        step: usize,
    },
    /// `T` and `S` are inconsistent or their buffers overflow the address space.
    #[error("a step of T = {t} tokens over S = {s} keys: {detail}")]
    Extents {
        /// Tokens.
        t: usize,
        /// Keys.
        s: usize,
        /// What is wrong.
        detail: &'static str,
    },
}

/// Where the fast-store copies of experts live (the split expert store, `crate::store`).
pub trait ExpertSource: std::fmt::Debug {
    /// The fast-store copy of expert `expert` of the stacked weight `weight`: its
    /// `row_bytes · ne[1]` bytes, equal to the file's; `None` when the expert is not resident
    /// (it is then read from the host alias, the weight view).
    fn fast_copy(&self, weight: WeightId, expert: usize) -> Option<&[u8]>;

    /// Whether the fast copies of `weight` are in the interleaved layout
    /// ([`crate::backend::cpu::q8::interleave_rows`]): only the fast `moe_ffn` reads them then, and the
    /// oracle's kernels read those experts from the host alias.
    fn interleaved(&self, weight: WeightId) -> bool {
        let _ = weight;
        false
    }

    /// A copy of the dense weight `weight`, which the fast `mat_mul` reads instead of the weight
    /// view, and whether it is interleaved ([`crate::backend::cpu::q8::interleave_rows`] over all its
    /// rows; else the file's bytes); `None` reads the view.
    fn dense_copy(&self, weight: WeightId) -> Option<(&[u8], bool)> {
        let _ = weight;
        None
    }
}

/// The file behind the weight views, read without mapping its pages.
pub trait WeightFile: std::fmt::Debug {
    /// Copies bytes `offset .. offset + out.len()` of `view` (a weight view) into `out` without
    /// making `view`'s pages resident in this process (`pread` through the page cache).
    ///
    /// Errors: the range not inside `view`, or the read's I/O error.
    fn read(&self, view: &[u8], offset: usize, out: &mut [u8]) -> std::io::Result<()>;
}
