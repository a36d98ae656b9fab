//! The host backends' shared machinery (`oracle`, `cpu`): the executor that runs a bound plan's
//! steps on the CPU cores ([`executor`]), the kernels' contract ([`kernel`]), their loaded model
//! and runs (here), and their memory ([`memory`]: the fast store's slots, copies of dense
//! weights).
//!
//! Contract. A host backend binds each step to its cranelift kernels or to a kernel of its own
//! ([`StepKernel`], the `cpu` backend's SIMD kernels; the oracle has none: [`NoKernel`]), as a
//! [`HostBinding`]; its `load` calls [`load`] with the layout of its copies ([`HostLayout`]:
//! which expert tensors and dense weights it copies, and in what [`CopyLayout`]). Cranelift code
//! is generated only for the steps bound to cranelift kernels; the other unfused steps get their
//! index checks alone. A run ([`HostRun`]) keeps the latent KV cache in host memory and reads each
//! resident expert from its slot, every other one from the mapped file in place.

pub(crate) mod executor;
pub(crate) mod kernel;
pub(crate) mod memory;
#[cfg(test)]
mod read_ahead_tests;

use super::{
    BackendError, ExecError, Experts, KernelTime, LoadInput, Loaded, LoadedModel, MemoryUse,
    Obtained, Output, Run, RunCounters, StepInput,
};
use crate::gguf::quant::host_symbols;
use crate::kv_cache::LatentKvCache;
use crate::progress::{Count, Progress};
use crate::store::{available_memory, slots_within};
use crate::weights::Weights;
use aubier_compiler::ops::Op;
use aubier_compiler::plan::{MoeLayer, Operand, Plan};
use aubier_compiler::types::DType;
use aubier_kernels_gen::cpu::{CpuProgram, LowerError, Lowering};
use executor::{Bound, Executor};
pub(crate) use kernel::{HostBinding, HostKernel, NoKernel, StepIo, StepKernel, WeightRows};
pub(crate) use memory::{CopyLayout, HostLayout};
use memory::{DenseCopies, HostSlots};
use std::sync::Arc;

/// Loads a plan bound to the host kernels `K` ([`HostBinding`]) for the backend `backend`:
/// generates the cranelift code of the steps bound to it, allocates the fast store's slots for
/// `input.budget` (`Auto`: every expert when they fit in half the available memory, else as
/// many slots as fit there) and the copies `layout` names, and maps the pages of the weights
/// every token reads in full; each of these a step of `progress`, the copies and the mapping
/// counted in bytes.
///
/// Errors: [`BackendError::Binding`] for a binding of another kind or length;
/// [`BackendError::Lower`]; [`BackendError::Store`] for the plan's MoE steps, the budget or an
/// allocation.
pub(crate) fn load<K: StepKernel>(
    backend: &str,
    input: &LoadInput<'_>,
    layout: HostLayout,
    progress: &mut dyn Progress,
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
    progress.step("generating host code", Count::Time);
    let program = program(plan, &binding.kernels)?;
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
    progress.step("allocating the fast store", Count::Time);
    let slots = HostSlots::new(Arc::clone(input.weights), &moe, n_res, &layout.experts)?;
    let copies = DenseCopies::new(input.weights, &layout.dense, progress)?;
    map_dense_weights(plan, input.weights, &moe, &copies, progress);
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

/// The cranelift lowering of `plan` bound to `kernels`: code for the steps bound to cranelift
/// kernels, the index checks alone for the other unfused steps, nothing for fused ones.
///
/// Errors: [`LowerError`] for a step the lowering refuses.
fn program<K>(plan: &Plan, kernels: &[HostKernel<K>]) -> Result<CpuProgram, LowerError> {
    CpuProgram::compile_steps(plan, &host_symbols(), |i| {
        match (&kernels[i], plan.steps[i].op.is_fused()) {
            (HostKernel::Cranelift, _) => Lowering::Code,
            (HostKernel::Own(_), false) => Lowering::Checks,
            (HostKernel::Own(_), true) => Lowering::Skip,
        }
    })
}

/// Maps the pages of every weight a token reads in full (everything but the stacked experts,
/// which the slots copy or the kernels read a few of, the dense weights the backend copied, and
/// the embedding tables, whose rows the executor reads from the file) at load, so that the
/// first request does not fault them in page by page ([`Weights::populate_pages`]); they stay
/// mapped from the first request on either way, so this moves no peak. The embedding tables are
/// only read ahead into the page cache ([`Weights::prefetch_pages`]), so that a token's row is
/// not a wait on the disk. The mapping is a step of `progress`, counted in bytes.
fn map_dense_weights(
    plan: &Plan,
    weights: &Weights,
    moe: &[MoeLayer],
    copies: &DenseCopies,
    progress: &mut dyn Progress,
) {
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
    let views: Vec<&[u8]> = (0..plan.weights.len())
        .filter(|&w| !expert(w) && !copies.holds(w) && !embeds.contains(&w))
        .filter_map(|w| weights.view(w))
        .collect();
    progress.step(
        "mapping dense weights",
        Count::Bytes(views.iter().map(|v| v.len() as u64).sum()),
    );
    let mut bytes = 0;
    for view in views {
        bytes += weights.populate_pages(view);
        progress.advance(view.len() as u64);
    }
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
        let slots = experts.slots_as::<HostSlots>("host")?;
        let weights = m.weights.views();
        let (exec, cache) = (&mut self.exec, &mut self.cache);
        let store = experts.store;
        // The read-ahead's copies of a one-token run, when the store reads ahead: made at once
        // in sync mode, else by the slot memory's worker, which the run does not wait for.
        let ahead = store.read_ahead_mode().filter(|_| input.tokens == 1);
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
                    store,
                    slots,
                    ahead,
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
                    weights: m.plan.steps[step].weights().collect(),
                })
                .collect(),
            steps: self.exec.runs(),
            ..RunCounters::default()
        }
    }
}

impl executor::WeightFile for Weights {
    fn read(&self, view: &[u8], offset: usize, out: &mut [u8]) -> std::io::Result<()> {
        Weights::read(self, view, offset, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::kernels::CpuKernel;
    use crate::backend::cpu::CpuBackend;
    use crate::backend::oracle::OracleBackend;
    use crate::backend::{Backend, Binding};
    use crate::gguf::GgufFile;
    use aubier_compiler::{compile, CompileOptions};

    /// The bundled model's plan for `backend`, and its binding.
    fn bound(backend: &dyn Backend) -> (Plan, Binding) {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/ms4-tiny256-q2k.gguf");
        let file = GgufFile::open(&path).expect("bundled model");
        let cfg = crate::model::read_config(&file).expect("config");
        let refs = crate::model::weight_refs(&file, &cfg).expect("weights");
        let opts = CompileOptions {
            target: backend.target(),
            ..CompileOptions::default()
        };
        let plan = compile(&cfg, &refs, &opts).expect("plan");
        let binding = backend.bind(&plan).expect("bind");
        (plan, binding)
    }

    /// Per step of `plan`, whether `program` has code for it, against whether `kernels` binds it
    /// to cranelift (a `reshape` is bound to cranelift and has no code: it is in place).
    fn check<K>(plan: &Plan, kernels: &[HostKernel<K>]) -> usize {
        let p = program(plan, kernels).expect("program");
        let mut coded = 0;
        for (i, (s, k)) in p.steps().iter().zip(kernels).enumerate() {
            let cranelift = matches!(k, HostKernel::Cranelift);
            let has_code = !s.kernels.is_empty();
            let in_place = plan.steps[i].op == Op::Reshape;
            assert!(
                has_code == cranelift || (cranelift && in_place),
                "step {i} ({}): code {has_code}, bound to cranelift {cranelift}",
                plan.steps[i].op.name()
            );
            coded += usize::from(has_code);
        }
        coded
    }

    /// Cranelift code is generated for exactly the steps bound to cranelift kernels: every step
    /// on the oracle, on the cpu backend only those without a kernel of its own.
    #[test]
    fn cranelift_code_only_for_the_steps_bound_to_it() {
        let (plan, binding) = bound(&OracleBackend);
        let oracle = binding
            .kernels::<HostBinding<NoKernel>>()
            .expect("a host binding");
        let all = check(&plan, &oracle.kernels);
        let (plan, binding) = bound(&CpuBackend::default());
        let cpu = binding
            .kernels::<HostBinding<CpuKernel>>()
            .expect("a host binding");
        let own = cpu
            .kernels
            .iter()
            .filter(|k| matches!(k, HostKernel::Own(_)))
            .count();
        assert!(own > 0);
        let some = check(&plan, &cpu.kernels);
        assert!(
            0 < some && some < all,
            "cpu {some} coded steps, oracle {all}"
        );
    }
}
