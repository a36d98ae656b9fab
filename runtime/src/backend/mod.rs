//! Backends: what executes a compiled [`Plan`] (ARCHITECTURE.md § runtime, the backend seam).
//!
//! Contract. A [`Backend`] fixes the compile target of the plans it runs ([`Backend::target`]:
//! which fusions `Auto` turns on) and
//! 1. *binds* a compiled plan ([`Backend::bind`]): it chooses a kernel for every step, or refuses
//!    the plan naming the first step it cannot run and why ([`BindError`]) — never a silent
//!    fallback to another backend. The [`Binding`] records each choice ([`KernelChoice`], which
//!    `aubier gen --plan --backend` prints) with the facts of that kernel (whether a one-token run
//!    computes the bits a prefill would), and carries what the backend will run, in its own type;
//! 2. *loads* the bound plan over the weights of the mapped file ([`Backend::load`]): what it
//!    needs once per process (compiled code, pipelines, weights on a device) as a
//!    [`LoadedModel`], and the memory of the fast expert store for the budget, as a
//!    [`SlotMemory`] (the store apart from layout: [`crate::store`]);
//! 3. *opens* runs ([`LoadedModel::open`]): one per session, its latent KV cache and buffers;
//!    [`Run::step`] executes the plan for `T` tokens, reading each resident expert from the slot
//!    the store gives it and every other one from the host store (the mapped file), and returns
//!    the plan outputs asked for. Kernel times and counters come back in one backend-neutral
//!    type ([`RunCounters`]).
//!
//! The engine and the session hold these as trait objects; nothing outside a backend's folder
//! names its types. The backends a process knows are in one public registry ([`registry`]):
//! the built-in `oracle` ([`oracle`]: the cranelift lowering of the unfused plan, f32, the
//! numerics reference), `cpu` ([`cpu`]: SIMD kernels over Q8_K activations, the product path on
//! the host) and `vulkan` (the generated GPU kernels, PHASE / WKB / KQKV fused, on a Vulkan
//! device); a new backend is its folder plus one registration, from this crate or any other.
//! `oracle` and `cpu` share the host executor (`host`).

pub mod cpu;
pub(crate) mod host;
pub mod oracle;
pub mod registry;
mod vulkan;
pub mod vulkan_device;

use crate::kv_cache::KvCacheError;
use crate::progress::Progress;
use crate::store::expert_store::ExpertStore;
use crate::store::{FastBudget, SlotMemory, StoreError};
use crate::weights::Weights;
use aubier_compiler::plan::{Plan, ValueId};
use aubier_compiler::Target;
use aubier_kernels_gen::cpu::LowerError;
use serde::Serialize;
use std::any::Any;
use std::sync::Arc;

/// A backend: the compile target of its plans, the binding of a compiled plan to kernels, and
/// the loading of a bound plan.
pub trait Backend: std::fmt::Debug + Send + Sync {
    /// The backend and its options as reports print them (`oracle`, `cpu (q8x2)`,
    /// `vulkan (device 0, subgroup 8)`).
    fn name(&self) -> String;

    /// The compile target of the plans this backend runs.
    fn target(&self) -> Target;

    /// Chooses a kernel for every step of `plan` (compiled for [`Backend::target`], or with the
    /// fusions the backend has kernels for).
    ///
    /// Errors: [`BindError`] naming the first step the backend has no kernel for.
    fn bind(&self, plan: &Plan) -> Result<Binding, BindError>;

    /// Makes the bound plan ready to run: once per process. Each long step (code generation,
    /// shader builds, weight copies and uploads) is reported to `progress` as it starts, with
    /// its count as it goes.
    ///
    /// Errors: [`BackendError`]: a binding this backend did not make, no device, code or
    /// pipelines it cannot build, memory it cannot allocate.
    fn load(
        &self,
        input: &LoadInput<'_>,
        progress: &mut dyn Progress,
    ) -> Result<Loaded, BackendError>;
}

/// What [`Backend::load`] loads.
#[derive(Clone, Copy, Debug)]
pub struct LoadInput<'a> {
    /// The compiled plan.
    pub plan: &'a Arc<Plan>,
    /// The backend's binding of it.
    pub binding: &'a Binding,
    /// Its weights in the mapped file.
    pub weights: &'a Arc<Weights>,
    /// The fast expert store's size; `Auto` is the backend's default.
    pub budget: FastBudget,
}

/// A loaded model: what a backend made of a bound plan, and the memory of its fast store.
#[derive(Debug)]
pub struct Loaded {
    /// Shared by every session.
    pub model: Arc<dyn LoadedModel>,
    /// The fast store's slots, allocated for the budget, filled by the sessions' stores.
    pub slots: Box<dyn SlotMemory>,
}

/// A bound plan made ready by its backend, shared by every run on it.
pub trait LoadedModel: std::fmt::Debug + Send + Sync {
    /// A run with an empty latent KV cache of `kv_max` tokens.
    ///
    /// Errors: [`BackendError`] when its memory cannot be allocated.
    fn open(self: Arc<Self>, kv_max: usize) -> Result<Box<dyn Run>, BackendError>;

    /// The device it runs on, for reports (`None` on the host).
    fn device(&self) -> Option<String> {
        None
    }

    /// What the backend chose for the fast store's size, and why (printed by `aubier run`);
    /// `None` when it says nothing.
    fn fast_store_choice(&self) -> Option<String> {
        None
    }

    /// The memory it holds besides the fast store's slots, by what it is and how it was
    /// obtained.
    fn memory(&self) -> Vec<MemoryUse> {
        Vec::new()
    }
}

/// Memory a loaded model holds ([`LoadedModel::memory`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MemoryUse {
    /// What it holds (`dense weight copies`, `weights`, `expert tables`, …).
    pub what: String,
    /// Bytes.
    pub bytes: u64,
    /// How it was obtained.
    pub obtained: Obtained,
}

/// How a backend obtained memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Obtained {
    /// Allocated by the backend (host memory it owns, or device memory).
    Allocated,
    /// Host memory imported into a device (the mapped file, read in place by the kernels).
    Imported,
}

/// One session's execution state on a [`LoadedModel`]: its latent KV cache and buffers.
pub trait Run: std::fmt::Debug + Send {
    /// Runs every step of the plan for `input` (`T` tokens over `S` cached keys), each resident
    /// expert read from its slot in `experts`, every other one from the host store; returns the
    /// values of `input.outputs`, in order.
    ///
    /// Errors: [`BackendError`]; cache rows of the step may have been written.
    fn step(
        &mut self,
        input: &StepInput<'_>,
        experts: &Experts<'_>,
    ) -> Result<Vec<Output>, BackendError>;

    /// Keeps rows `0..rows` of every layer of the latent cache and zeroes the others.
    ///
    /// Errors: [`BackendError`] when the device fails.
    fn truncate(&mut self, rows: usize) -> Result<(), BackendError>;

    /// Row `pos` of latent-cache layer `layer` (`kv_lora_rank + qk_rope_head_dim` f32).
    ///
    /// Errors: [`BackendError`] outside the cache, or when it cannot be read back.
    fn cache_row(&self, layer: usize, pos: usize) -> Result<Vec<f32>, BackendError>;

    /// Starts (`true`: the counters zeroed) or stops timing kernels. Host backends time every
    /// step always; a device times its launches only while profiling.
    ///
    /// Errors: [`BackendError`] when the device cannot time launches.
    fn profile(&mut self, on: bool) -> Result<(), BackendError>;

    /// Kernel times and counters since the run opened or profiling started.
    fn counters(&self) -> RunCounters;
}

/// One step's inputs ([`Run::step`]).
#[derive(Clone, Copy, Debug)]
pub struct StepInput<'a> {
    /// Every plan input by name (`tokens`, `pos`): `T` i32 each; ids below the vocabulary and
    /// positions below `keys` (the session checks both).
    pub inputs: &'a [(&'a str, &'a [i32])],
    /// Tokens in the step (`T`, ≥ 1).
    pub tokens: usize,
    /// Cached keys after the step (`S`, `T ≤ S ≤` the run's capacity).
    pub keys: usize,
    /// The plan values to return, in order.
    pub outputs: &'a [ValueId],
    /// The output head's value, computed and returned for the last token alone
    /// ([`Plan::output_head`]), and with it every step only it needs ([`Plan::last_rows`]: the
    /// last layer's FFN, the final norm); `None` computes every row.
    pub last_only: Option<ValueId>,
}

/// Where the experts of a step are: the store's membership and the memory of its slots.
#[derive(Clone, Copy, Debug)]
pub struct Experts<'a> {
    /// Which expert holds which slot ([`ExpertStore::slot_of`]).
    pub store: &'a ExpertStore,
    /// The slots, the memory this backend allocated at load.
    pub slots: &'a dyn SlotMemory,
}

impl<'a> Experts<'a> {
    /// The slots as the memory type `T` the backend `backend` allocated at load.
    ///
    /// Errors: [`BackendError::Binding`] when the slots are another backend's memory.
    pub fn slots_as<T: Any>(&self, backend: &str) -> Result<&'a T, BackendError> {
        self.slots
            .as_any()
            .downcast_ref::<T>()
            .ok_or_else(|| BackendError::Binding {
                backend: backend.to_string(),
                detail: "the slot memory of another backend".into(),
            })
    }
}

/// A plan output read back after a step: f32 or i32 elements, row-major.
#[derive(Clone, Debug, PartialEq)]
pub enum Output {
    /// An f32 value (the logits).
    F32(Vec<f32>),
    /// An i32 value (routed expert ids).
    I32(Vec<i32>),
}

/// Time spent in one kernel of one plan step.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct KernelTime {
    /// The plan step.
    pub step: usize,
    /// The kernel (the binding's kernel name on the host; the pipeline's on a device).
    pub kernel: String,
    /// Seconds in runs of more than one token (prefill).
    pub prefill_s: f64,
    /// Seconds in runs of one token (decode).
    pub decode_s: f64,
    /// Runs of it.
    pub launches: u64,
    /// The plan weights it reads (indices into `Plan::weights`): every weight operand of the
    /// step on the host, those bound to its weight and expert parameters on a device.
    pub weights: Vec<usize>,
}

/// A run's counters ([`Run::counters`]).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RunCounters {
    /// Time per (step, kernel): host wall time, or device time from timestamps while
    /// profiling.
    pub times: Vec<KernelTime>,
    /// Steps run.
    pub steps: u64,
    /// Command buffers recorded for them on a device that replays them (0 on the host).
    pub recordings: u64,
    /// Routed experts that were neither resident nor readable in place, uploaded to the device
    /// during the steps (the vulkan backend's staged host store; counted once per step and
    /// layer), and their bytes.
    pub staged_experts: u64,
    /// Bytes of those uploads.
    pub staged_bytes: u64,
}

/// The kernel a backend chose for one step, as printed by `aubier gen --plan --backend`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct KernelChoice {
    /// The kernel (`cranelift`, `q8_mat_mul`, `latent_attention`, `glsl`, …).
    pub kernel: &'static str,
    /// Its variant on this machine: ISA, Q8_K planes, weight layout, subgroup width (empty when
    /// it has none).
    pub variant: String,
}

/// One bound step: the recorded choice and the facts of its kernel.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BoundStep {
    /// The choice, for display.
    pub choice: KernelChoice,
    /// Whether the kernel computes a token's results (its latent cache rows, its outputs) with
    /// the same bits in a run of one token as in a run of several, as the kernel's code
    /// establishes it: true for code that computes each row the same whatever the run's length
    /// (cranelift, the GPU kernels, the cpu backend's elementwise kernels); false where a
    /// one-token run takes other code (the cpu backend's decode kernels, its f32 dot in place
    /// of sgemm).
    pub one_token_matches_prefill: bool,
}

/// A plan bound to a backend: one [`BoundStep`] per plan step, in plan order, and what the
/// backend runs, in its own type.
#[derive(Clone)]
pub struct Binding {
    /// The backend that made it ([`Backend::name`]).
    pub backend: String,
    /// Per plan step, in order.
    pub steps: Vec<BoundStep>,
    kernels: Arc<dyn Any + Send + Sync>,
}

impl std::fmt::Debug for Binding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Binding")
            .field("backend", &self.backend)
            .field("steps", &self.steps)
            .finish_non_exhaustive()
    }
}

impl Binding {
    /// A binding by `backend` of `steps`, with `kernels`: what the backend runs, read back by
    /// its [`Backend::load`] through [`Binding::kernels`].
    pub fn new(backend: String, steps: Vec<BoundStep>, kernels: impl Any + Send + Sync) -> Binding {
        Binding {
            backend,
            steps,
            kernels: Arc::new(kernels),
        }
    }

    /// What the backend runs, when it is a `K` (the type its `bind` gave).
    pub fn kernels<K: Any>(&self) -> Option<&K> {
        self.kernels.downcast_ref()
    }

    /// Whether a run of one token computes the same bits for it (its latent cache rows, its
    /// logits, its routing) as a run of several tokens does, so that rows written by decode
    /// steps are those a prefill would write: every step's kernel says so
    /// ([`BoundStep::one_token_matches_prefill`]). `tests/prefix_cache.rs` checks it on the
    /// bundled model for each backend; the prompt cache (`crate::session`) keeps only rows a
    /// cold prefill would write again.
    pub fn one_token_runs_match_prefill(&self) -> bool {
        self.steps.iter().all(|s| s.one_token_matches_prefill)
    }
}

/// A backend refused a plan.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("backend `{backend}` cannot run step {step} (`{op}`): {reason}")]
pub struct BindError {
    /// The backend (`oracle`, `cpu`, `vulkan`).
    pub backend: String,
    /// Index of the step in the plan.
    pub step: usize,
    /// The step's op.
    pub op: &'static str,
    /// Why.
    pub reason: String,
}

/// Errors of loading and running a bound plan.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The host executor failed a step.
    #[error(transparent)]
    Exec(#[from] ExecError),
    /// The cranelift lowering refused the plan.
    #[error(transparent)]
    Lower(#[from] LowerError),
    /// The latent cache cannot be allocated.
    #[error(transparent)]
    KvCache(#[from] KvCacheError),
    /// The fast store's memory cannot be allocated or filled.
    #[error("expert store: {0}")]
    Store(#[from] StoreError),
    /// The binding was made by another backend, or for another plan.
    #[error("backend `{backend}`: {detail}")]
    Binding {
        /// The backend loading it.
        backend: String,
        /// What is wrong.
        detail: String,
    },
    /// A device backend failed: no device, a shader its compiler refused, a driver error (its
    /// own words).
    #[error("{backend} backend: {message}")]
    Device {
        /// The backend.
        backend: String,
        /// What it said.
        message: String,
    },
}

/// Errors of running a bound plan on the host (the executor of `oracle` and `cpu`). Each names the step,
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
