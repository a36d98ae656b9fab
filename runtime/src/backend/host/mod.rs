//! The host backends' shared machinery (`oracle`, `cpu`): the executor that runs a bound plan's
//! steps on the CPU cores ([`executor`]), their loaded model and runs, and their memory
//! ([`memory`]: the fast store's slots, copies of dense weights).
//!
//! Contract. A host backend binds each step to its cranelift kernels or to a kernel of its own
//! ([`StepKernel`], the `cpu` backend's SIMD kernels; the oracle has none: [`NoKernel`]), as a
//! [`HostBinding`]; its `load` calls [`load`] with the layout of its copies ([`HostLayout`]:
//! which expert tensors and dense weights it copies, and in what [`CopyLayout`]). Cranelift code
//! is generated only for the steps bound to cranelift kernels; the other unfused steps get their
//! index checks alone. A run ([`HostRun`]) keeps the latent KV cache in host memory and reads each
//! resident expert from its slot, every other one from the mapped file in place.

pub(crate) mod executor;
pub(crate) mod memory;

use super::{
    BackendError, ExecError, Experts, KernelTime, LoadInput, Loaded, LoadedModel, MemoryUse,
    Obtained, Output, Run, RunCounters, StepInput,
};
use crate::gguf::quant::host_symbols;
use crate::kv_cache::LatentKvCache;
use crate::store::{available_memory, slots_within};
use crate::weights::Weights;
use aubier_compiler::ops::Op;
use aubier_compiler::plan::{MoeLayer, Operand, Plan, Step, WeightId};
use aubier_compiler::types::DType;
use aubier_kernels_gen::cpu::{CpuProgram, Lowering, StepArgs};
use executor::{Bound, Executor};
use memory::{DenseCopies, HostSlots};
use std::sync::Arc;

/// A host backend's kernel of its own for one step, run by the executor in place of the step's
/// cranelift kernels.
pub(crate) trait StepKernel: std::fmt::Debug + Clone + Send + Sync + 'static {
    /// Buffers the kernels keep between steps (one set per run).
    type Buffers: std::fmt::Debug + Default + Send;

    /// Runs the step of `io`.
    ///
    /// Errors: [`ExecError`] when an operand is not what the kernel was bound for, or an index
    /// operand is out of range.
    fn run(&self, io: &StepIo<'_, '_>, buf: &mut Self::Buffers) -> Result<(), ExecError>;

    /// Whether it reads the step's experts as rows ([`StepIo::expert_slices`]).
    fn reads_expert_slices(&self) -> bool;

    /// The kernel's name, for times and reports (`q8_mat_mul`, …).
    fn name(&self) -> &'static str;
}

/// No kernel: the oracle's binding, every step on cranelift.
#[derive(Clone, Copy, Debug)]
pub(crate) enum NoKernel {}

impl StepKernel for NoKernel {
    type Buffers = ();

    fn run(&self, _: &StepIo<'_, '_>, _: &mut ()) -> Result<(), ExecError> {
        match *self {}
    }

    fn reads_expert_slices(&self) -> bool {
        match *self {}
    }

    fn name(&self) -> &'static str {
        match *self {}
    }
}

/// How the executor runs one step.
#[derive(Clone, Debug)]
pub(crate) enum HostKernel<K> {
    /// The step's cranelift kernels.
    Cranelift,
    /// A kernel of the backend's own.
    Own(K),
}

/// What a host backend's [`super::Backend::bind`] gives its load: the kernel of every step.
#[derive(Clone, Debug)]
pub(crate) struct HostBinding<K> {
    /// Per plan step, in order.
    pub kernels: Vec<HostKernel<K>>,
}

/// A weight's bytes as a kernel reads them: the file's view or a copy, in the file's layout or
/// in the backend's own (the `cpu` backend's interleaved rows).
#[derive(Clone, Copy, Debug)]
pub(crate) struct WeightRows<'a> {
    pub bytes: &'a [u8],
    /// In the backend's own layout ([`CopyLayout`]); else the file's.
    pub interleaved: bool,
}

/// What a kernel of one step reads and writes: the step's bound operand and output addresses
/// (`args`, sized by the executor for `(T, S)`), the plan, the weights, the backend's copies of
/// dense weights and the expert rows the executor resolved.
pub(crate) struct StepIo<'a, 'w> {
    pub plan: &'a Plan,
    pub index: usize,
    pub step: &'a Step,
    pub args: &'a StepArgs,
    /// Tokens this step runs for (1 for the output head of a last-position-only run).
    pub t: usize,
    /// Keys.
    pub s: usize,
    pub weights: &'a [&'w [u8]],
    /// The backend's copies of dense weights.
    pub copies: &'a DenseCopies,
    /// Per stacked expert tensor of the step, each expert's rows (slot copy or file slice).
    pub expert_slices: &'a [Vec<WeightRows<'w>>],
}

impl StepIo<'_, '_> {
    /// Elements of the step's output at these extents.
    pub fn out_numel(&self) -> usize {
        self.plan.values[self.step.out].shape.numel(self.t, self.s)
    }

    /// Elements of value operand `i`.
    ///
    /// Errors: [`ExecError::Value`] when operand `i` is not a value.
    pub fn arg_numel(&self, i: usize) -> Result<usize, ExecError> {
        match self.step.args.get(i) {
            Some(&Operand::Value(v)) => Ok(self.plan.values[v].shape.numel(self.t, self.s)),
            _ => Err(ExecError::Value {
                value: usize::MAX,
                name: format!("operand {i} of step {}", self.index),
                detail: "expected a value".into(),
            }),
        }
    }

    /// The weight of operand `i`.
    ///
    /// Errors: [`ExecError::Value`] when operand `i` is not a weight.
    pub fn weight(&self, i: usize) -> Result<usize, ExecError> {
        match self.step.args.get(i) {
            Some(&Operand::Weight(w)) => Ok(w),
            _ => Err(ExecError::Value {
                value: usize::MAX,
                name: format!("operand {i} of step {}", self.index),
                detail: "expected a weight".into(),
            }),
        }
    }
}

/// The layout of a host backend's copy of a weight's bytes (an expert in a slot, a dense weight)
/// when it is not the file's.
pub(crate) trait CopyLayout: std::fmt::Debug + Send + Sync {
    /// Writes `src` (the file's bytes) into `dst` (as many bytes) in this layout.
    ///
    /// Errors: why `src` cannot take this layout.
    fn write(&self, src: &[u8], dst: &mut [u8]) -> Result<(), String>;

    /// Writes `src` (in this layout) into `dst` in the file's layout.
    ///
    /// Errors: why it cannot.
    fn read(&self, src: &[u8], dst: &mut [u8]) -> Result<(), String>;
}

/// What a host backend copies, and in what layout (`None`: the file's bytes).
#[derive(Debug, Default)]
pub(crate) struct HostLayout {
    /// Per MoE layer (plan order), per stacked tensor: the layout of its slot copies.
    pub experts: Vec<Vec<Option<Arc<dyn CopyLayout>>>>,
    /// Dense weights the backend's kernels read from a copy.
    pub dense: Vec<(WeightId, Option<Arc<dyn CopyLayout>>)>,
}

/// Loads a plan bound to the host kernels `K` ([`HostBinding`]) for the backend `backend`:
/// generates the cranelift code of the steps bound to it, allocates the fast store's slots for
/// `input.budget` (`Auto`: every expert when they fit in half the available memory, else as
/// many slots as fit there) and the copies `layout` names, and maps the pages of the weights
/// every token reads in full.
///
/// Errors: [`BackendError::Binding`] for a binding of another kind or length;
/// [`BackendError::Lower`]; [`BackendError::Store`] for the plan's MoE steps, the budget or an
/// allocation.
pub(crate) fn load<K: StepKernel>(
    backend: &str,
    input: &LoadInput<'_>,
    layout: HostLayout,
) -> Result<Loaded, BackendError> {
    let plan = input.plan;
    let bad = |detail: String| BackendError::Binding {
        backend: backend.to_string(),
        detail,
    };
    let binding: &HostBinding<K> = input
        .binding
        .kernels()
        .ok_or_else(|| bad(format!("a binding of `{}`", input.binding.backend)))?;
    if binding.kernels.len() != plan.steps.len() {
        return Err(bad(format!(
            "{} bound steps for a plan of {}",
            binding.kernels.len(),
            plan.steps.len()
        )));
    }
    let program = CpuProgram::compile_steps(plan, &host_symbols(), |i| {
        match (&binding.kernels[i], plan.steps[i].op.is_fused()) {
            (HostKernel::Cranelift, _) => Lowering::Code,
            (HostKernel::Own(_), false) => Lowering::Checks,
            (HostKernel::Own(_), true) => Lowering::Skip,
        }
    })?;
    let moe = plan
        .moe_layers()
        .map_err(|e| crate::store::StoreError::Plan(e.to_string()))?;
    let n_expert = moe.first().map_or(0, |l| l.n_expert);
    let per_slot: u64 = moe.iter().map(|l| l.expert_bytes() as u64).sum();
    let n_res = input.budget.slots(per_slot, n_expert, || {
        available_memory().map_or(n_expert, |avail| {
            slots_within(avail / 2, per_slot, n_expert)
        })
    })?;
    let slots = HostSlots::new(Arc::clone(input.weights), &moe, n_res, &layout.experts)?;
    let copies = DenseCopies::new(input.weights, &layout.dense)?;
    map_dense_weights(plan, input.weights, &moe, &copies);
    tracing::info!(
        steps = plan.steps.len(),
        cranelift_steps = program
            .steps()
            .iter()
            .filter(|s| !s.kernels.is_empty())
            .count(),
        slots = n_res,
        dense_copy_bytes = copies.bytes(),
        backend,
        "model loaded on the host"
    );
    let model = HostModel {
        plan: Arc::clone(plan),
        weights: Arc::clone(input.weights),
        program,
        kernels: binding.kernels.clone(),
        copies,
        moe,
    };
    Ok(Loaded {
        model: Arc::new(model),
        slots: Box::new(slots),
    })
}

/// Maps the pages of every weight a token reads in full (everything but the stacked experts,
/// which the slots copy or the kernels read a few of, the dense weights the backend copied, and
/// the embedding tables, whose rows the executor reads from the file) at load, so that the
/// first request does not fault them in page by page ([`Weights::populate_pages`]); they stay
/// mapped from the first request on either way, so this moves no peak. The embedding tables are
/// only read ahead into the page cache ([`Weights::prefetch_pages`]), so that a token's row is
/// not a wait on the disk.
fn map_dense_weights(plan: &Plan, weights: &Weights, moe: &[MoeLayer], copies: &DenseCopies) {
    let embeds: Vec<usize> = plan
        .steps
        .iter()
        .filter(|s| s.op == Op::Embed)
        .filter_map(|s| match s.args.first() {
            Some(&Operand::Weight(w)) => Some(w),
            _ => None,
        })
        .collect();
    let expert = |w: usize| moe.iter().flat_map(|l| &l.tensors).any(|t| t.weight == w);
    let bytes: usize = (0..plan.weights.len())
        .filter(|&w| !expert(w) && !copies.holds(w) && !embeds.contains(&w))
        .filter_map(|w| weights.view(w))
        .map(|view| weights.populate_pages(view))
        .sum();
    let ahead: usize = embeds
        .iter()
        .filter_map(|&w| weights.view(w))
        .map(|view| weights.prefetch_pages(view))
        .sum();
    tracing::debug!(
        bytes,
        ahead,
        "dense weights mapped, embedding tables read ahead"
    );
}

/// A plan loaded on the host.
#[derive(Debug)]
pub(crate) struct HostModel<K> {
    plan: Arc<Plan>,
    weights: Arc<Weights>,
    program: CpuProgram,
    kernels: Vec<HostKernel<K>>,
    copies: DenseCopies,
    moe: Vec<MoeLayer>,
}

impl<K: StepKernel> LoadedModel for HostModel<K> {
    fn memory(&self) -> Vec<MemoryUse> {
        vec![MemoryUse {
            what: "dense weight copies".into(),
            bytes: self.copies.bytes(),
            obtained: Obtained::Allocated,
        }]
    }

    fn open(self: Arc<Self>, kv_max: usize) -> Result<Box<dyn Run>, BackendError> {
        let cfg = &self.plan.config;
        let cache = LatentKvCache::new(cfg.n_layer, kv_max, cfg.kv_cache_width())?;
        let exec = Executor::new(&self.plan, &self.program)?;
        Ok(Box::new(HostRun {
            model: self,
            exec: Box::new(exec),
            cache,
        }))
    }
}

/// A run on the host: the executor's buffers and the latent cache in host memory.
#[derive(Debug)]
pub(crate) struct HostRun<K: StepKernel> {
    model: Arc<HostModel<K>>,
    exec: Box<Executor<K>>,
    cache: LatentKvCache,
}

impl<K: StepKernel> Run for HostRun<K> {
    fn step(
        &mut self,
        input: &StepInput<'_>,
        experts: &Experts<'_>,
    ) -> Result<Vec<Output>, BackendError> {
        let m = &*self.model;
        let slots = experts
            .slots
            .as_any()
            .downcast_ref::<HostSlots>()
            .ok_or_else(|| BackendError::Binding {
                backend: "host".into(),
                detail: "the slot memory of another backend".into(),
            })?;
        let weights = m.weights.views();
        let (exec, cache) = (&mut self.exec, &mut self.cache);
        // On a worker of the rayon pool, so that the run's parallel steps fork from a worker
        // (its own deque) rather than inject each step from outside the pool and block the
        // caller on a latch; the other workers spin for the run's length (`pool::run_hot`).
        crate::pool::run_hot(|| {
            let bound = Bound {
                plan: &m.plan,
                program: &m.program,
                kernels: &m.kernels,
                weights: &weights,
                copies: &m.copies,
                moe: &m.moe,
                experts: Some(executor::Placement {
                    store: experts.store,
                    slots,
                }),
                file: Some(&*m.weights),
            };
            exec.run_rows(
                bound,
                cache,
                input.inputs,
                input.tokens,
                input.keys,
                input.last_only,
            )
        })?;
        input
            .outputs
            .iter()
            .map(|&id| {
                Ok(match m.plan.values.get(id).map(|v| v.dtype) {
                    Some(DType::I32) => Output::I32(exec.i32_value(&m.plan, id)?),
                    _ => Output::F32(exec.f32_value(&m.plan, id)?.to_vec()),
                })
            })
            .collect()
    }

    fn truncate(&mut self, rows: usize) -> Result<(), BackendError> {
        self.cache.truncate(rows);
        Ok(())
    }

    fn cache_row(&self, layer: usize, pos: usize) -> Result<Vec<f32>, BackendError> {
        self.cache
            .row(layer, pos)
            .map(<[f32]>::to_vec)
            .ok_or_else(|| ExecError::Cache(format!("no row {pos} of layer {layer}")).into())
    }

    fn profile(&mut self, on: bool) -> Result<(), BackendError> {
        if on {
            self.exec.reset_step_times();
        }
        Ok(())
    }

    fn counters(&self) -> RunCounters {
        let m = &*self.model;
        RunCounters {
            times: self
                .exec
                .step_times()
                .iter()
                .enumerate()
                .map(|(step, t)| KernelTime {
                    step,
                    kernel: match &m.kernels[step] {
                        HostKernel::Cranelift => "cranelift",
                        HostKernel::Own(k) => k.name(),
                    }
                    .to_string(),
                    prefill_s: t.prefill_s,
                    decode_s: t.decode_s,
                    launches: t.runs,
                })
                .collect(),
            steps: self.exec.runs(),
            recordings: 0,
        }
    }
}

impl executor::WeightFile for Weights {
    fn read(&self, view: &[u8], offset: usize, out: &mut [u8]) -> std::io::Result<()> {
        Weights::read(self, view, offset, out)
    }
}
