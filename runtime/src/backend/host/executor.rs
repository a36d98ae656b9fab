//! The host executor: runs a bound [`Plan`]'s steps in order on all cores, each by its
//! cranelift kernels ([`CpuProgram`]) or by a kernel of the backend's own ([`StepKernel`])
//! (ARCHITECTURE.md § runtime, backends).
//!
//! Algorithm, per [`Executor::run_rows`] of `T` tokens over `S` keys:
//! 1. bind: each buffer slot grows to the largest value placed in it at this `(T, S)` (slots only
//!    grow, so a session allocates once per high-water mark); the plan inputs (`tokens`, `pos`) are
//!    copied into their slots; weights are the caller's byte views of the GGUF map, checked against
//!    the byte length their type and shape take; latent-cache values point at the cache layers;
//! 2. for each step in order: validate its index operands ([`aubier_kernels_gen::cpu::IndexCheck`]:
//!    token ids below the vocabulary, expert ids below the expert count, cache positions below
//!    `S`) — generated code trusts them — then run its kernels one after the other;
//! 3. a kernel's work items `0..W` are split into contiguous ranges run on the current rayon pool.
//!    Each output element belongs to exactly one work item and is computed start to finish in a
//!    fixed order inside it, so the bits of every result are the same for any thread count and any
//!    split (tested with 1- and 2-thread pools).
//!
//! When the caller reads only the last position's logits, the steps of [`Plan::last_rows`] run as
//! one-token steps on the last row of each whole input (their outputs one row each).
//!
//! i32 values (ids, positions) live in the same 4-byte slot buffers as f32 values, as bit patterns.
//!
//! Expert weights (the stacked tensors of a `moe_ffn` step, [`MoeLayer`]) are passed as
//! per-expert address tables, rebuilt before each such step: expert `e` is read from its slot
//! when the store holds it resident ([`Placement`]), else from its slice of the weight view (the
//! host store). The copy's length is checked; its bytes equal the file's (the store's contract),
//! so the placement never changes a bit of the result.

use super::kernel::{HostKernel, StepIo, StepKernel, WeightRows};
use super::memory::{DenseCopies, HostSlots};
use crate::backend::ExecError;
use crate::kv_cache::LatentKvCache;
use crate::store::expert_store::{AheadCopy, ExpertStore, PageAhead, ReadAheadMode};
use aubier_compiler::ops::Op;
use aubier_compiler::plan::{LastRows, MoeLayer, Operand, Plan, Storage, ValueId};
use aubier_compiler::types::{DType, Dim};
use aubier_kernels_gen::cpu::{CpuProgram, Extent, IndexBound, Kernel, StepArgs};
use rayon::prelude::*;
use std::time::Instant;

/// Rows of an `embed` step read from the file per run of its kernels ([`embed_from_file`]).
const EMBED_RUN: usize = 64;

/// The file behind the weight views, read without mapping its pages.
pub(crate) trait WeightFile: std::fmt::Debug {
    /// Copies bytes `offset .. offset + out.len()` of `view` (a weight view) into `out` without
    /// making `view`'s pages resident in this process (`pread` through the page cache).
    ///
    /// Errors: the range not inside `view`, or the read's I/O error.
    fn read(&self, view: &[u8], offset: usize, out: &mut [u8]) -> std::io::Result<()>;
}

/// Where the resident experts of a run are: the store's membership and its slots.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Placement<'a> {
    /// Which expert holds which slot.
    pub store: &'a ExpertStore,
    /// The slots.
    pub slots: &'a HostSlots,
    /// How the read-ahead's copies ([`ExpertStore::read_ahead`]) of a one-token run are made:
    /// at once, before the next step ([`ReadAheadMode::Sync`]), or by the slot memory's copy
    /// worker ([`HostSlots::copy_later`]), beside the run and past its end
    /// ([`ReadAheadMode::Background`]); `None`: no read-ahead.
    pub ahead: Option<ReadAheadMode>,
}

/// Starts reading `first`, then each expert of `ids` that is not resident in MoE layer `li`'s
/// slots and is not one of `loading`, from the file into the page cache, as one piece of advice
/// ([`HostSlots::read_ahead_host`]).
fn read_host_ahead(
    p: Placement<'_>,
    li: usize,
    ids: &[i32],
    loading: &[AheadCopy],
    mut first: Vec<u32>,
) {
    first.extend(ids.iter().filter_map(|&e| {
        let loaded = loading.iter().any(|c| c.expert as i32 == e);
        (e >= 0 && !loaded && p.store.slot_of(li, e as usize).is_none()).then_some(e as u32)
    }));
    p.slots.read_ahead_host(li, first);
}

/// What a run executes: the plan, the program compiled from it, the backend's kernel of every
/// step, and the raw GGUF bytes of every plan weight (`weights[w]` for `plan.weights[w]`).
#[derive(Debug)]
pub(crate) struct Bound<'a, K> {
    /// The plan.
    pub plan: &'a Plan,
    /// Its cranelift lowering (the steps bound to cranelift kernels, and the checks of every
    /// unfused step).
    pub program: &'a CpuProgram,
    /// The kernel of each step.
    pub kernels: &'a [HostKernel<K>],
    /// Weight bytes, by `WeightId`.
    pub weights: &'a [&'a [u8]],
    /// The backend's copies of dense weights.
    pub copies: &'a DenseCopies,
    /// The plan's MoE layers ([`Plan::moe_layers`]).
    pub moe: &'a [MoeLayer],
    /// The resident experts; `None` reads every expert from `weights`.
    pub experts: Option<Placement<'a>>,
    /// The file `weights` are mapped from. An `embed` step reads its tokens' rows of the
    /// [n_vocab, d] table from it ([`WeightFile::read`]) instead of through the map: each row
    /// read through the map faults in whole pages (and the kernel maps cached neighbours around
    /// them, ≈ 64 KiB per row), which would stay resident for the rest of the process (≈ 98 MB
    /// after a 512-token prompt on the real vocabulary). `None`: the table is read in place.
    pub file: Option<&'a dyn WeightFile>,
}

impl<K> Clone for Bound<'_, K> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<K> Copy for Bound<'_, K> {}

/// Per-session execution state: the slot buffers and the scratch of the steps.
#[derive(Debug)]
pub(crate) struct Executor<K: StepKernel> {
    slots: Vec<Vec<f32>>,
    /// Values placed in each slot (to size it).
    slot_values: Vec<Vec<ValueId>>,
    /// `(value, layer, width)` of every latent-cache value.
    cache_values: Vec<(ValueId, usize, usize)>,
    scratch: Vec<f32>,
    /// Per-expert address tables of the current step, one per stacked expert tensor.
    tables: Vec<Vec<u64>>,
    /// `(T, S)` of the last successful binding.
    extents: (usize, usize),
    /// The steps the plan may run for the last position alone ([`Plan::last_rows`]).
    rows: LastRows,
    /// Whether the last binding runs them so (its `last_only` named the head's value).
    last: bool,
    /// Buffers of the backend's own kernels.
    buffers: K::Buffers,
    /// The rows an `embed` step read from the file, and their ids in that buffer.
    embed_rows: EmbedRows,
    /// Wall time spent in each step since the last [`Executor::reset_step_times`].
    times: Vec<StepTime>,
    /// Successful runs since then.
    runs: u64,
    /// `(value, L)`: the plan's `predicted_ids.L` outputs ([`Plan::predicted_ids`]).
    predicted: Vec<(ValueId, usize)>,
}

/// Wall time spent in one plan step, split by the kind of run (`T > 1`: prefill, `T = 1`: decode).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct StepTime {
    /// Seconds in runs of more than one token.
    pub prefill_s: f64,
    /// Seconds in runs of one token.
    pub decode_s: f64,
    /// Runs of the step.
    pub runs: u64,
}

impl<K: StepKernel> Executor<K> {
    /// Prepares execution of `plan` (compiled as `program`); no buffer is allocated yet.
    ///
    /// Errors: [`ExecError::ProgramMismatch`]; [`ExecError::Value`] for a value in a slot past
    /// `n_slots` or a latent-cache value not shaped `[S, w]`; [`ExecError::Input`] for an input
    /// that is not an i32 `[T]` value in a slot.
    pub fn new(plan: &Plan, program: &CpuProgram) -> Result<Self, ExecError> {
        if plan.steps.len() != program.steps().len() {
            return Err(ExecError::ProgramMismatch {
                plan: plan.steps.len(),
                program: program.steps().len(),
            });
        }
        let mut slot_values = vec![Vec::new(); plan.n_slots];
        let mut cache_values = Vec::new();
        for (id, v) in plan.values.iter().enumerate() {
            let bad = |detail: String| ExecError::Value {
                value: id,
                name: v.name.clone(),
                detail,
            };
            match v.storage {
                Storage::Slot(n) => slot_values
                    .get_mut(n)
                    .ok_or_else(|| bad(format!("slot {n} ≥ n_slots {}", plan.n_slots)))?
                    .push(id),
                Storage::KvCache { layer } => match v.shape.0.as_slice() {
                    [Dim::Keys, Dim::Fixed(w)] if v.dtype == DType::F32 => {
                        cache_values.push((id, layer, *w))
                    }
                    _ => {
                        return Err(bad(format!(
                            "a latent-cache value must be f32 [S, w], not {:?} {}",
                            v.dtype, v.shape
                        )))
                    }
                },
            }
        }
        for (name, id) in &plan.inputs {
            let v = plan.values.get(*id).ok_or_else(|| ExecError::Input {
                name: name.clone(),
                detail: format!("value {id} does not exist"),
            })?;
            if v.dtype != DType::I32
                || v.shape.0 != [Dim::Tokens]
                || !matches!(v.storage, Storage::Slot(_))
            {
                return Err(ExecError::Input {
                    name: name.clone(),
                    detail: format!(
                        "must be an i32 [T] value in a slot, not {:?} {}",
                        v.dtype, v.shape
                    ),
                });
            }
        }
        Ok(Self {
            slots: vec![Vec::new(); plan.n_slots],
            slot_values,
            cache_values,
            scratch: Vec::new(),
            tables: Vec::new(),
            extents: (0, 0),
            rows: plan.last_rows(),
            last: false,
            buffers: K::Buffers::default(),
            embed_rows: EmbedRows::default(),
            times: vec![StepTime::default(); plan.steps.len()],
            runs: 0,
            predicted: plan
                .predicted_ids()
                .into_iter()
                .map(|(l, v)| (v, l))
                .collect(),
        })
    }

    /// Wall time spent in each plan step (index = step index) since the executor was made or
    /// [`Executor::reset_step_times`] was last called.
    pub fn step_times(&self) -> &[StepTime] {
        &self.times
    }

    /// Zeroes [`Executor::step_times`] and [`Executor::runs`].
    pub fn reset_step_times(&mut self) {
        self.times.fill(StepTime::default());
        self.runs = 0;
    }

    /// Runs every step of `bound.plan` for `T = t` tokens over `S = s` keys; with `last_only`
    /// (the output head's value: a caller that samples from the last position only), computes
    /// only the last token's row of that value and of every value only it needs
    /// ([`Plan::last_rows`]): those steps run for `T = 1` on the last row of each whole input,
    /// their values' slots are sized for that row, and [`Executor::f32_value`] returns it.
    ///
    /// `inputs` gives each plan input by name (`tokens`, `pos`), `t` i32 each; `cache` is the
    /// session's latent cache (rows written at `pos`, rows `0..s` read).
    ///
    /// Errors: [`ExecError::Input`], [`ExecError::WeightCount`] / [`ExecError::WeightSize`],
    /// [`ExecError::Cache`] when the cache's layers, width or capacity do not fit,
    /// [`ExecError::Extents`] unless `1 ≤ t ≤ s`, [`ExecError::Index`] before a step whose index
    /// operands are out of range (steps before it have run; cache rows may have been written),
    /// [`ExecError::ExpertTable`] when an expert operand is not a weight of `n_expert` slices or a
    /// slot copy has the wrong length; [`ExecError::Value`] when `last_only` is not the output
    /// head's value ([`Plan::output_head`]).
    pub fn run_rows(
        &mut self,
        bound: Bound<'_, K>,
        cache: &mut LatentKvCache,
        inputs: &[(&str, &[i32])],
        t: usize,
        s: usize,
        last_only: Option<ValueId>,
    ) -> Result<(), ExecError> {
        let Bound {
            plan,
            program,
            kernels,
            weights,
            ..
        } = bound;
        if program.steps().len() != plan.steps.len()
            || kernels.len() != plan.steps.len()
            || self.slots.len() != plan.n_slots
        {
            return Err(ExecError::ProgramMismatch {
                plan: plan.steps.len(),
                program: program.steps().len().min(kernels.len()),
            });
        }
        if t == 0 || t > s {
            return Err(ExecError::Extents {
                t,
                s,
                detail: "need 1 ≤ T ≤ S",
            });
        }
        self.check_weights(plan, program, weights)?;
        self.check_cache(cache, s)?;
        self.bind(plan, t, s, last_only)?;
        self.bind_inputs(plan, inputs, t)?;
        for i in 0..plan.steps.len() {
            self.check_indices(plan, program, i, t, s)?;
            let started = Instant::now();
            if t == 1 {
                self.read_routed_ahead(&bound, i, s)?;
            }
            self.run_step(&bound, cache, i, t, s)?;
            if t == 1 {
                self.read_ahead(&bound, i, s)?;
            }
            let spent = started.elapsed().as_secs_f64();
            let time = &mut self.times[i];
            if t > 1 {
                time.prefill_s += spent;
            } else {
                time.decode_s += spent;
            }
            time.runs += 1;
        }
        self.runs += 1;
        Ok(())
    }

    /// After step `i` of a one-token run: when it made a layer's `predicted_ids` and the
    /// placement reads ahead, asks the store which predicted experts to load into that layer's
    /// slots ([`ExpertStore::read_ahead`]) and has the copies made: at once, each published when
    /// made ([`ReadAheadMode::Sync`]), or queued on the slot memory's worker, the store holding each
    /// copy's ticket and publishing it once the ticket says done ([`ReadAheadMode::Background`]);
    /// the step never waits for them. With [`PageAhead::Host`] or [`PageAhead::All`] the other
    /// predicted experts that are not resident are read ahead from the file into the page cache
    /// ([`HostSlots::read_ahead_host`], on the memory's advice worker: the step does not wait for
    /// it either), so that the disk reads them while the layers before theirs run; with
    /// [`PageAhead::All`] so are the loaded experts, asked for before their copies are queued,
    /// so that the disk reads them in parallel rather than as the copy worker reaches each.
    ///
    /// Errors: [`ExecError::Value`] when the predicted ids are not an i32 value in a slot.
    fn read_ahead(&self, bound: &Bound<'_, K>, i: usize, s: usize) -> Result<(), ExecError> {
        let Some((p, sink)) = bound.experts.and_then(|p| Some((p, p.ahead?))) else {
            return Ok(());
        };
        let out = bound.plan.steps[i].out;
        let Some(&(value, layer)) = self.predicted.iter().find(|(v, _)| *v == out) else {
            return Ok(());
        };
        let Some(li) = bound.moe.iter().position(|l| l.layer == layer) else {
            return Ok(());
        };
        let ids = self.i32_view(bound.plan, value, 1, s)?;
        let copies = p.store.read_ahead(li, &ids);
        let page_ahead = p.store.page_ahead();
        if page_ahead != PageAhead::Off {
            let copied = match page_ahead {
                PageAhead::All => copies.iter().map(|c| c.expert).collect(),
                _ => Vec::new(),
            };
            read_host_ahead(p, li, &ids, &copies, copied);
        }
        for copy in copies {
            match sink {
                ReadAheadMode::Sync => {
                    // SAFETY: the store took this slot for the copy and publishes it only after
                    // it; no kernel reads an unpublished slot.
                    let done = unsafe { p.slots.fill_unread(copy) };
                    p.store.publish(copy, done);
                }
                ReadAheadMode::Background => {
                    // SAFETY: as above: the store publishes the slot only once the ticket says
                    // the copy ended.
                    let ticket = unsafe { p.slots.copy_later(copy) };
                    p.store.queued(copy, ticket);
                }
            }
        }
        Ok(())
    }

    /// Before step `i` of a one-token run, when it is a `moe_ffn` and the placement reads
    /// ahead with [`PageAhead::Host`] or [`PageAhead::All`]: starts reading every routed expert
    /// that is not resident from the file into the page cache at once ([`HostSlots::read_ahead_host`]), so that the disk serves them in
    /// parallel rather than as the kernel faults them in, one page run after another.
    ///
    /// Errors: [`ExecError::Value`] when the step's ids are not an i32 value in a slot.
    fn read_routed_ahead(&self, bound: &Bound<'_, K>, i: usize, s: usize) -> Result<(), ExecError> {
        let Some(p) = bound
            .experts
            .filter(|p| p.ahead.is_some() && p.store.page_ahead() != PageAhead::Off)
        else {
            return Ok(());
        };
        let Some(li) = bound.moe.iter().position(|l| l.step == i) else {
            return Ok(());
        };
        let plan = bound.plan;
        let ids = plan.steps[i].args.iter().find_map(|a| match a {
            Operand::Value(v) if plan.values[*v].dtype == DType::I32 => Some(*v),
            _ => None,
        });
        let Some(ids) = ids else {
            return Ok(());
        };
        read_host_ahead(p, li, &self.i32_view(plan, ids, 1, s)?, &[], Vec::new());
        Ok(())
    }

    /// Successful runs since the executor was made or [`Executor::reset_step_times`].
    pub fn runs(&self) -> u64 {
        self.runs
    }

    /// Copies each plan input (`t` i32 values, given by name in `inputs`) into its slot.
    fn bind_inputs(
        &mut self,
        plan: &Plan,
        inputs: &[(&str, &[i32])],
        t: usize,
    ) -> Result<(), ExecError> {
        for (name, id) in &plan.inputs {
            let data = inputs
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, d)| *d)
                .ok_or_else(|| ExecError::Input {
                    name: name.clone(),
                    detail: "not given".into(),
                })?;
            if data.len() != t {
                return Err(ExecError::Input {
                    name: name.clone(),
                    detail: format!("{} values given for T = {t}", data.len()),
                });
            }
            let Storage::Slot(n) = plan.values[*id].storage else {
                unreachable!("checked by Executor::new");
            };
            for (dst, &v) in self.slots[n].iter_mut().zip(data) {
                *dst = f32::from_bits(v as u32);
            }
        }
        Ok(())
    }

    /// Validates the index operands of step `i` ([`aubier_kernels_gen::cpu::IndexCheck`]) before
    /// it runs: generated code and the CPU kernels trust them.
    fn check_indices(
        &self,
        plan: &Plan,
        program: &CpuProgram,
        i: usize,
        t: usize,
        s: usize,
    ) -> Result<(), ExecError> {
        let step = &plan.steps[i];
        for check in &program.steps()[i].checks {
            let id = match step.args.get(check.arg) {
                Some(Operand::Value(id)) => *id,
                _ => {
                    return Err(ExecError::Value {
                        value: usize::MAX,
                        name: format!("operand {} of step {i}", check.arg),
                        detail: "an index operand must be a value".into(),
                    })
                }
            };
            let bound = match check.bound {
                IndexBound::Below(n) => n,
                IndexBound::Keys => s,
            };
            let ids = self.i32_view(plan, id, t, s)?;
            if let Some((index, &bad)) = ids
                .iter()
                .enumerate()
                .find(|(_, &v)| v < 0 || v as usize >= bound)
            {
                return Err(ExecError::Index {
                    step: i,
                    op: step.op.name(),
                    what: check.what,
                    index,
                    id: bad as i64,
                    bound,
                });
            }
        }
        Ok(())
    }

    /// Runs step `i` with its bound kernel: binds its operand, output and scratch addresses and
    /// its expert tables, then runs the cranelift kernels or the backend's own kernel.
    fn run_step<'w>(
        &mut self,
        bound: &Bound<'w, K>,
        cache: &mut LatentKvCache,
        i: usize,
        t: usize,
        s: usize,
    ) -> Result<(), ExecError> {
        let (plan, weights) = (bound.plan, bound.weights);
        let (step, cs) = (&plan.steps[i], &bound.program.steps()[i]);
        let scratch = cs.scratch.eval(t, s).ok_or(ExecError::Extents {
            t,
            s,
            detail: "scratch size overflows",
        })?;
        if self.scratch.len() < scratch {
            self.scratch.resize(scratch, 0.0);
        }
        // A last-row step runs for one token, the last, into row 0 of its output.
        let last = self.last && self.rows.step(i);
        let t_step = if last { 1 } else { t };
        let mut args = StepArgs::new(t_step, s, 0, 0);
        for (j, a) in step.args.iter().enumerate() {
            args.args[j] = match a {
                Operand::Value(v) => {
                    let base = self.value_ptr(plan, cache, *v, s)?;
                    let row = if last {
                        self.rows.operand_row(plan, i, *v, t)
                    } else {
                        0
                    };
                    // SAFETY: `row` is 0 or the start of the last of the `t` rows of a `[T, ..]`
                    // value made for every row, whose slot `bind` sized for `t` rows.
                    unsafe { base.add(row) as *const u8 }
                }
                Operand::Weight(w) => weights[*w].as_ptr(),
            };
        }
        let kernel = &bound.kernels[i];
        // A kernel of the backend's may read the experts as rows; the cranelift kernels read
        // the tables.
        let slices = matches!(kernel, HostKernel::Own(k) if k.reads_expert_slices());
        let expert_slices = self.expert_tables(bound, i, &mut args, slices)?;
        args.out = self.value_ptr(plan, cache, step.out, s)? as *mut u8;
        args.scratch = if scratch > 0 {
            self.scratch.as_mut_ptr()
        } else {
            std::ptr::null_mut()
        };
        match (kernel, step.op, bound.file, step.args.first()) {
            (HostKernel::Own(k), ..) => {
                let io = StepIo {
                    plan,
                    index: i,
                    step,
                    args: &args,
                    t: t_step,
                    s,
                    weights,
                    copies: bound.copies,
                    expert_slices: &expert_slices,
                };
                k.run(&io, &mut self.buffers)
            }
            (HostKernel::Cranelift, Op::Embed, Some(file), Some(&Operand::Weight(w))) => {
                let table = EmbedTable {
                    bytes: weights[w],
                    rows: plan.weights[w].ne.iter().skip(1).product(),
                    width: plan.values[step.out].shape.numel(1, s),
                };
                let rows = &mut self.embed_rows;
                embed_from_file(&cs.kernels, args, t_step, s, table, file, rows)
                    .map_err(|detail| ExecError::Embed { step: i, detail })
            }
            (HostKernel::Cranelift, ..) => {
                for kernel in &cs.kernels {
                    launch(kernel, args, t_step, s)?;
                }
                Ok(())
            }
        }
    }

    /// Points each stacked expert operand of step `i` (a `moe_ffn` of [`Bound::moe`]) at a table
    /// of per-expert addresses: the slot of a resident expert when its copy is in the file's
    /// layout, else its slice of the weight view. With `slices`, also returns each tensor's
    /// experts as rows for a kernel of the backend's own (which reads copies in its own layout
    /// too).
    fn expert_tables<'w>(
        &mut self,
        bound: &Bound<'w, K>,
        i: usize,
        args: &mut StepArgs,
        slices: bool,
    ) -> Result<Vec<Vec<WeightRows<'w>>>, ExecError> {
        let Some((li, layer)) = bound.moe.iter().enumerate().find(|(_, l)| l.step == i) else {
            return Ok(Vec::new());
        };
        if self.tables.len() < layer.tensors.len() {
            self.tables.resize(layer.tensors.len(), Vec::new());
        }
        let mut all = Vec::new();
        // The slots as the store holds them now, one map for every tensor of the step.
        let map = bound.experts.map(|p| p.store.step_slots(li));
        for (tj, (table, spec)) in self.tables.iter_mut().zip(&layer.tensors).enumerate() {
            let bad = |detail: String| ExecError::ExpertTable {
                step: i,
                arg: spec.arg,
                detail,
            };
            let host = bound.weights[spec.weight];
            if layer.n_expert.checked_mul(spec.expert_bytes) != Some(host.len()) {
                return Err(bad(format!(
                    "{} bytes are not {} experts of {} bytes",
                    host.len(),
                    layer.n_expert,
                    spec.expert_bytes
                )));
            }
            table.clear();
            let mut rows = Vec::new();
            for (e, slice) in host.chunks_exact(spec.expert_bytes.max(1)).enumerate() {
                let copy = bound.experts.zip(map.as_ref()).and_then(|(p, map)| {
                    let slot = (*map.get(e)?)?;
                    p.slots.copy(li, slot as usize, tj)
                });
                let (src, own) = match copy {
                    Some((bytes, own)) if bytes.len() == spec.expert_bytes => (bytes, own),
                    Some((bytes, _)) => {
                        return Err(bad(format!(
                            "the slot copy of expert {e} has {} bytes, not {}",
                            bytes.len(),
                            spec.expert_bytes
                        )))
                    }
                    None => (slice, false),
                };
                // The cranelift kernels read the file's layout.
                table.push(if own { slice.as_ptr() } else { src.as_ptr() } as u64);
                if slices {
                    rows.push(WeightRows {
                        bytes: src,
                        interleaved: own,
                    });
                }
            }
            table.resize(layer.n_expert, host.as_ptr() as u64);
            args.args[spec.arg] = table.as_ptr() as *const u8;
            if slices {
                all.push(rows);
            }
        }
        Ok(all)
    }

    /// The f32 elements of slot value `id` after the last [`Self::run_rows`] (row-major, its shape
    /// at that run's `T`, `S`; at `T = 1` for a value of [`Plan::last_rows`] when that run took
    /// `last_only`).
    ///
    /// Errors: [`ExecError::Value`] for an unknown value, an i32 value or a latent-cache value.
    pub fn f32_value(&self, plan: &Plan, id: ValueId) -> Result<&[f32], ExecError> {
        let (t, s) = self.extents;
        let v = plan.values.get(id).ok_or_else(|| ExecError::Value {
            value: id,
            name: String::new(),
            detail: "does not exist".into(),
        })?;
        if v.dtype != DType::F32 {
            return Err(ExecError::Value {
                value: id,
                name: v.name.clone(),
                detail: "is not f32".into(),
            });
        }
        self.slot_view(plan, id, t, s)
    }

    /// The i32 elements of slot value `id` after the last [`Self::run_rows`].
    ///
    /// Errors: as [`Self::f32_value`], for a value that is not i32.
    pub fn i32_value(&self, plan: &Plan, id: ValueId) -> Result<Vec<i32>, ExecError> {
        let (t, s) = self.extents;
        self.i32_view(plan, id, t, s)
    }

    fn i32_view(
        &self,
        plan: &Plan,
        id: ValueId,
        t: usize,
        s: usize,
    ) -> Result<Vec<i32>, ExecError> {
        let v = &plan.values[id];
        if v.dtype != DType::I32 {
            return Err(ExecError::Value {
                value: id,
                name: v.name.clone(),
                detail: "is not i32".into(),
            });
        }
        Ok(self
            .slot_view(plan, id, t, s)?
            .iter()
            .map(|x| x.to_bits() as i32)
            .collect())
    }

    fn slot_view(&self, plan: &Plan, id: ValueId, t: usize, s: usize) -> Result<&[f32], ExecError> {
        let v = &plan.values[id];
        let Storage::Slot(n) = v.storage else {
            return Err(ExecError::Value {
                value: id,
                name: v.name.clone(),
                detail: "lives in the latent cache, not in a slot".into(),
            });
        };
        let rows = if self.last { self.rows.rows(id, t) } else { t };
        let len = v.shape.numel(rows, s);
        self.slots[n].get(..len).ok_or_else(|| ExecError::Value {
            value: id,
            name: v.name.clone(),
            detail: "has not been computed".into(),
        })
    }

    fn check_weights(
        &self,
        plan: &Plan,
        program: &CpuProgram,
        weights: &[&[u8]],
    ) -> Result<(), ExecError> {
        let expected = program.weight_bytes();
        if weights.len() != expected.len() || plan.weights.len() != expected.len() {
            return Err(ExecError::WeightCount {
                given: weights.len(),
                expected: plan.weights.len(),
            });
        }
        for (index, (w, &n)) in weights.iter().zip(expected).enumerate() {
            if w.len() != n {
                return Err(ExecError::WeightSize {
                    index,
                    name: plan.weights[index].name.clone(),
                    given: w.len(),
                    expected: n,
                });
            }
        }
        Ok(())
    }

    fn check_cache(&self, cache: &LatentKvCache, s: usize) -> Result<(), ExecError> {
        if s > cache.n_ctx() {
            return Err(ExecError::Cache(format!(
                "S = {s} keys exceed its {} positions",
                cache.n_ctx()
            )));
        }
        for &(_, layer, w) in &self.cache_values {
            if layer >= cache.n_layer() || w != cache.width() {
                return Err(ExecError::Cache(format!(
                    "the plan reads layer {layer} with rows of {w}, the cache has {} layers of {}",
                    cache.n_layer(),
                    cache.width()
                )));
            }
        }
        Ok(())
    }

    /// Grows every slot to its largest value at `(t, s)` (with `last_only`, the values of
    /// [`Plan::last_rows`] at one row: only their last row is computed).
    ///
    /// Errors: [`ExecError::Value`] when `last_only` is not the output head's value;
    /// [`ExecError::Extents`] when a size overflows.
    fn bind(
        &mut self,
        plan: &Plan,
        t: usize,
        s: usize,
        last_only: Option<ValueId>,
    ) -> Result<(), ExecError> {
        let last = plan
            .runs_last_rows(last_only)
            .map_err(|v| ExecError::Value {
                value: v,
                name: plan
                    .values
                    .get(v)
                    .map(|x| x.name.clone())
                    .unwrap_or_default(),
                detail: "cannot compute the last row only: it is not the output head's".into(),
            })?;
        for (slot, ids) in self.slots.iter_mut().zip(&self.slot_values) {
            let mut need = 0usize;
            for &id in ids {
                let rows = if last { self.rows.rows(id, t) } else { t };
                let n = Extent::of_dims(&plan.values[id].shape.0)
                    .and_then(|e| e.eval(rows, s))
                    .filter(|n| n.checked_mul(4).is_some_and(|b| b <= isize::MAX as usize))
                    .ok_or(ExecError::Extents {
                        t,
                        s,
                        detail: "a value's size overflows",
                    })?;
                need = need.max(n);
            }
            if slot.len() < need {
                slot.resize(need, 0.0);
            }
        }
        self.extents = (t, s);
        self.last = last;
        Ok(())
    }

    fn value_ptr(
        &mut self,
        plan: &Plan,
        cache: &mut LatentKvCache,
        id: ValueId,
        s: usize,
    ) -> Result<*mut f32, ExecError> {
        match plan.values[id].storage {
            Storage::Slot(n) => Ok(self.slots[n].as_mut_ptr()),
            Storage::KvCache { layer } => cache
                .layer_ptr(layer, s)
                .ok_or_else(|| ExecError::Cache(format!("layer {layer} does not exist"))),
        }
    }
}

/// The argument block shared by the threads of one launch. Every thread only reads it (and
/// copies it), and the memory its pointers reach is partitioned by the work ranges.
struct Shared(StepArgs);

// SAFETY: `StepArgs` holds raw pointers into buffers that outlive the launch; threads read the
// block, and each writes only the output elements of its own work range (module note).
unsafe impl Sync for Shared {}

impl Shared {
    fn with_range(&self, begin: usize, end: usize) -> StepArgs {
        StepArgs {
            begin,
            end,
            ..self.0
        }
    }
}

/// An `embed` step's table: its bytes (`rows` rows) and the elements of an output row.
#[derive(Clone, Copy)]
struct EmbedTable<'a> {
    bytes: &'a [u8],
    rows: usize,
    width: usize,
}

/// The rows an `embed` step read from the file ([`embed_from_file`]): row `j` of a run at
/// `bytes[j · row_bytes ..]` (u64 words, so f32 tables stay aligned), its id `j` in `ids`.
#[derive(Debug, Default)]
struct EmbedRows {
    bytes: Vec<u64>,
    ids: Vec<i32>,
}

/// Runs an `embed` step over its `t` tokens with the table's rows read from `file` rather than
/// through the map: per run of up to [`EMBED_RUN`] tokens, each token's row is copied into
/// `rows` and the step's kernels run on that run with `rows` as a table of those rows and the
/// ids `0 .. n`, so the kernels see the same row bytes (the same bits) and none of the table's
/// pages becomes resident. `args` binds the step for `t` tokens: operand 0 the table, operand
/// 1 the `[T]` ids (already checked below the table's row count), the output `[T, width]`.
///
/// Errors: a table whose bytes are not a whole number of rows, or a failed read (the output is
/// then partly written; the step fails).
fn embed_from_file(
    kernels: &[Kernel],
    args: StepArgs,
    t: usize,
    s: usize,
    table: EmbedTable<'_>,
    file: &dyn WeightFile,
    rows: &mut EmbedRows,
) -> Result<(), String> {
    let rb = match table.bytes.len().checked_div(table.rows) {
        Some(rb) if rb * table.rows == table.bytes.len() => rb,
        _ => {
            return Err(format!(
                "{} bytes are not {} rows",
                table.bytes.len(),
                table.rows
            ))
        }
    };
    // SAFETY: operand 1 is the step's `[T]` i32 ids, bound for `t` rows.
    let ids = unsafe { std::slice::from_raw_parts(args.args[1] as *const i32, t) };
    for (first, run_ids) in (0..t).step_by(EMBED_RUN).zip(ids.chunks(EMBED_RUN)) {
        let n = run_ids.len();
        rows.bytes.resize((n * rb).div_ceil(8), 0);
        // SAFETY: the u64 words as the bytes they hold (every byte pattern is a valid u8).
        let (_, buf, _) = unsafe { rows.bytes.align_to_mut::<u8>() };
        for (&id, dst) in run_ids.iter().zip(buf.chunks_mut(rb.max(1))) {
            let at = usize::try_from(id)
                .ok()
                .filter(|&r| r < table.rows)
                .ok_or_else(|| format!("token id {id} is outside 0..{}", table.rows))?;
            file.read(table.bytes, at * rb, dst)
                .map_err(|e| format!("reading row {at}: {e}"))?;
        }
        rows.ids.clear();
        rows.ids.extend(0..n as i32);
        let mut run = args;
        run.t = n;
        run.args[0] = rows.bytes.as_ptr() as *const u8;
        run.args[1] = rows.ids.as_ptr() as *const u8;
        // SAFETY: rows `first..first + n` of the output, bound for `t` rows.
        run.out = unsafe { (args.out as *mut f32).add(first * table.width) } as *mut u8;
        for kernel in kernels {
            launch(kernel, run, n, s).map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

/// Runs all work items of one kernel, split over the current rayon pool.
fn launch(kernel: &Kernel, args: StepArgs, t: usize, s: usize) -> Result<(), ExecError> {
    let work = kernel.work().eval(t, s).ok_or(ExecError::Extents {
        t,
        s,
        detail: "a kernel's work count overflows",
    })?;
    if work == 0 {
        return Ok(());
    }
    let chunks = work
        .div_ceil(kernel.grain().max(1))
        .min(rayon::current_num_threads() * 4)
        .max(1);
    let shared = Shared(args);
    if chunks == 1 {
        let a = shared.with_range(0, work);
        // SAFETY: `run` bound every operand and output at (t, s), validated index operands and
        // weight sizes, and sized the scratch (Kernel::call's contract).
        unsafe { kernel.call(&a) };
    } else {
        (0..chunks).into_par_iter().for_each(|c| {
            let a = shared.with_range(work * c / chunks, work * (c + 1) / chunks);
            // SAFETY: as above; the ranges are disjoint and cover 0..work.
            unsafe { kernel.call(&a) };
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::kernels::CpuKernel;
    use crate::backend::cpu::{CpuBackend, CpuNumerics};
    use crate::backend::host::{HostBinding, NoKernel};
    use crate::backend::oracle::OracleBackend;
    use crate::backend::{Backend, Binding};
    use crate::ggml_type::GgmlType;
    use crate::gguf::quant;
    use crate::gguf::quant::host_symbols;
    use aubier_compiler::config::{ExpertLayout, Mistral4Config, QueryTemperature, YarnParams};
    use aubier_compiler::ops::Op;
    use aubier_compiler::plan::{OutputHead, Step, Value};
    use aubier_compiler::types::{Attrs, Shape, WeightRef};

    /// `plan` bound to the oracle.
    fn oracle_binding(plan: &Plan) -> Binding {
        OracleBackend.bind(plan).expect("bind")
    }

    /// The host kernels of `binding` (the oracle's, every step on cranelift, or the cpu
    /// backend's), as the executor of the cpu backend's kernels runs them.
    fn kernels(binding: &Binding) -> Vec<HostKernel<CpuKernel>> {
        if let Some(b) = binding.kernels::<HostBinding<CpuKernel>>() {
            return b.kernels.clone();
        }
        let b = binding
            .kernels::<HostBinding<NoKernel>>()
            .expect("a host binding");
        vec![HostKernel::Cranelift; b.kernels.len()]
    }

    /// A run of `plan` as `binding` bound it, every expert read from `weights`, no copies.
    fn test_bound<'a>(
        plan: &'a Plan,
        program: &'a CpuProgram,
        binding: &Binding,
        weights: &'a [&'a [u8]],
        file: Option<&'a dyn WeightFile>,
    ) -> Bound<'a, CpuKernel> {
        Bound {
            plan,
            program,
            kernels: Box::leak(kernels(binding).into_boxed_slice()),
            weights,
            copies: Box::leak(Box::default()),
            moe: Box::leak(plan.moe_layers().expect("moe layers").into_boxed_slice()),
            experts: None,
            file,
        }
    }

    fn config() -> Mistral4Config {
        Mistral4Config {
            arch: "mistral4".into(),
            n_layer: 1,
            n_embd: 32,
            n_vocab: 10,
            n_ctx_train: 16,
            n_head: 2,
            q_lora_rank: 16,
            kv_lora_rank: 8,
            qk_nope_head_dim: 4,
            qk_rope_head_dim: 4,
            v_head_dim: 4,
            rms_norm_eps: 1e-6,
            n_expert: 6,
            n_expert_used: 2,
            n_expert_shared: 1,
            n_ff_exp: 32,
            expert_weights_scale: 1.0,
            expert_weights_norm: true,
            rope: YarnParams {
                n_rot: 4,
                freq_base: 10000.0,
                factor: 1.0,
                original_context: 16,
                beta_fast: 32.0,
                beta_slow: 1.0,
                attn_factor: 1.0,
                log_multiplier: 0.1,
            },
            temperature: None,
            expert_layout: ExpertLayout::FusedGateUp,
        }
    }

    /// Deterministic pseudo-random values in [-1, 1) (a 64-bit LCG; only variety matters).
    fn noise(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    /// Q8_0 blocks (f16 scale + 32 i8) of `n` pseudo-random values.
    fn q8_0(n: usize, seed: u64) -> Vec<u8> {
        let v = noise(n + n / 32, seed);
        let mut out = Vec::new();
        for (b, block) in v[..n].chunks(32).enumerate() {
            let d = half::f16::from_f32(0.01 + 0.02 * v[n + b].abs());
            out.extend(d.to_le_bytes());
            out.extend(block.iter().map(|x| ((x * 127.0) as i8) as u8));
        }
        out
    }

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    /// Appends a value named `v{id}` (in its own slot unless `storage` says otherwise) to
    /// `values`; returns its id.
    fn push_value(
        values: &mut Vec<Value>,
        dtype: DType,
        dims: Vec<Dim>,
        storage: Option<Storage>,
    ) -> ValueId {
        let id = values.len();
        values.push(Value {
            dtype,
            shape: Shape(dims),
            storage: storage.unwrap_or(Storage::Slot(id)),
            name: format!("v{id}"),
        });
        id
    }

    fn step(op: Op, attrs: Attrs, args: Vec<Operand>, out: ValueId) -> Step {
        Step {
            op,
            attrs,
            args,
            out,
        }
    }

    /// Cache write of `kv` at `pos`, then `scores_qk` of `q` (scale 0.35), `causal_mask`,
    /// `softmax` and `weighted_sum` of `len` values into the values `[sc, scs, msk, p, o]`.
    fn attention_steps(
        q: ValueId,
        kv: ValueId,
        pos: ValueId,
        cache: ValueId,
        [sc, scs, msk, p, o]: [ValueId; 5],
        len: usize,
    ) -> Vec<Step> {
        let v = Operand::Value;
        vec![
            step(
                Op::CacheWrite,
                Attrs::CacheWrite { layer: 0 },
                vec![v(kv), v(pos)],
                cache,
            ),
            step(Op::ScoresQk, Attrs::None, vec![v(q), v(cache)], sc),
            step(Op::Scale, Attrs::Scale(0.35), vec![v(sc)], scs),
            step(Op::CausalMask, Attrs::None, vec![v(scs), v(pos)], msk),
            step(Op::Softmax, Attrs::None, vec![v(msk)], p),
            step(
                Op::WeightedSum,
                Attrs::WeightedSum { len },
                vec![v(p), v(cache)],
                o,
            ),
        ]
    }

    /// A hand-built plan touching every unfused op kind: embed, norms, F32 and Q8_0 mat-vecs,
    /// per-head mat-vec, latent cache write/read, attention, router, MoE, residual.
    struct Built {
        plan: Plan,
        weights: Vec<Vec<u8>>,
    }

    fn build() -> Built {
        let mut values: Vec<Value> = Vec::new();
        let mut val = |dtype, dims, storage| push_value(&mut values, dtype, dims, storage);
        let f = Dim::Fixed;
        let (t, s) = (Dim::Tokens, Dim::Keys);
        let tokens = val(DType::I32, vec![t], None);
        let pos = val(DType::I32, vec![t], None);
        let x = val(DType::F32, vec![t, f(32)], None);
        let h = val(DType::F32, vec![t, f(32)], None);
        let q = val(DType::F32, vec![t, f(16)], None);
        let qh = val(DType::F32, vec![t, f(2), f(8)], Some(Storage::Slot(q)));
        let qr = val(DType::F32, vec![t, f(2), f(8)], None);
        let qk = val(DType::F32, vec![t, f(2), f(8)], None);
        let kv = val(DType::F32, vec![t, f(8)], None);
        let cache = val(
            DType::F32,
            vec![s, f(8)],
            Some(Storage::KvCache { layer: 0 }),
        );
        let sc = val(DType::F32, vec![t, f(2), s], None);
        let scs = val(DType::F32, vec![t, f(2), s], None);
        let msk = val(DType::F32, vec![t, f(2), s], None);
        let p = val(DType::F32, vec![t, f(2), s], None);
        let o = val(DType::F32, vec![t, f(2), f(8)], None);
        let logits_r = val(DType::F32, vec![t, f(6)], None);
        let probs = val(DType::F32, vec![t, f(6)], None);
        let ids = val(DType::I32, vec![t, f(2)], None);
        let wts = val(DType::F32, vec![t, f(2)], None);
        let moe = val(DType::F32, vec![t, f(32)], None);
        let y = val(DType::F32, vec![t, f(32)], None);
        let n_values = values.len();

        let wref = |name: &str, ty: &str, ne: Vec<usize>| WeightRef {
            name: name.into(),
            ggml_type: ty.into(),
            ne,
        };
        let weights_meta = vec![
            wref("emb", "F32", vec![32, 10]),
            wref("norm", "F32", vec![32]),
            wref("wq", "Q8_0", vec![32, 16]),
            wref("wkv", "F32", vec![32, 8]),
            wref("kb", "F32", vec![8, 8, 2]),
            wref("router", "F32", vec![32, 6]),
            wref("gate_up", "Q8_0", vec![32, 64, 6]),
            wref("down", "Q8_0", vec![32, 32, 6]),
        ];
        let weights = vec![
            f32_bytes(&noise(320, 1)),
            f32_bytes(
                &noise(32, 2)
                    .iter()
                    .map(|v| 1.0 + 0.1 * v)
                    .collect::<Vec<_>>(),
            ),
            q8_0(512, 3),
            f32_bytes(&noise(256, 4)),
            f32_bytes(&noise(128, 5)),
            f32_bytes(&noise(192, 6)),
            q8_0(32 * 64 * 6, 7),
            q8_0(32 * 32 * 6, 8),
        ];
        let v = Operand::Value;
        let w = Operand::Weight;
        let st = step;
        let mut steps = vec![
            st(Op::Embed, Attrs::None, vec![w(0), v(tokens)], x),
            st(Op::RmsNorm, Attrs::Eps(1e-6), vec![v(x), w(1)], h),
            st(Op::MatMul, Attrs::None, vec![w(2), v(h)], q),
            st(
                Op::Reshape,
                Attrs::Reshape(Shape(vec![t, f(2), f(8)])),
                vec![v(q)],
                qh,
            ),
            st(
                Op::RopeYarn,
                Attrs::Rope(config().rope),
                vec![v(qh), v(pos)],
                qr,
            ),
            st(Op::HeadMatMul, Attrs::None, vec![w(4), v(qr)], qk),
            st(Op::MatMul, Attrs::None, vec![w(3), v(h)], kv),
        ];
        steps.extend(attention_steps(qk, kv, pos, cache, [sc, scs, msk, p, o], 8));
        steps.extend([
            st(Op::MatMul, Attrs::None, vec![w(5), v(h)], logits_r),
            st(Op::Softmax, Attrs::None, vec![v(logits_r)], probs),
            st(Op::TopK, Attrs::TopK { k: 2 }, vec![v(probs)], ids),
            st(
                Op::GatherRenorm,
                Attrs::GatherRenorm {
                    renorm: true,
                    scale: 1.0,
                },
                vec![v(probs), v(ids)],
                wts,
            ),
            st(
                Op::MoeFfn,
                Attrs::Moe {
                    layer: 0,
                    n_ff: 32,
                    layout: ExpertLayout::FusedGateUp,
                },
                vec![v(h), v(ids), v(wts), w(6), w(7)],
                moe,
            ),
            st(Op::Add, Attrs::None, vec![v(x), v(moe)], y),
        ]);
        Built {
            plan: Plan {
                config: config(),
                stages: vec!["hand".into()],
                weights: weights_meta,
                values,
                n_slots: n_values,
                inputs: vec![("tokens".into(), tokens), ("pos".into(), pos)],
                outputs: vec![
                    ("y".into(), y),
                    ("o".into(), o),
                    ("ids".into(), ids),
                    ("q".into(), q),
                ],
                steps,
                output_head: None,
            },
            weights,
        }
    }

    /// Runs `tokens` at positions `p0..` in a rayon pool of `threads`; returns (y, o, ids, q).
    fn run_in_pool(
        b: &Built,
        tokens: &[i32],
        p0: usize,
        threads: usize,
    ) -> Result<Vec<Vec<u32>>, ExecError> {
        let prog = CpuProgram::compile(&b.plan, &host_symbols()).expect("lowering");
        let binding = oracle_binding(&b.plan);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("pool");
        let mut cache = LatentKvCache::new(1, 16, 8).expect("cache");
        let mut exec = Executor::new(&b.plan, &prog)?;
        let views: Vec<&[u8]> = b.weights.iter().map(Vec::as_slice).collect();
        let t = tokens.len();
        // earlier tokens fill the cache first, so the step attends over S > T keys
        let history: Vec<i32> = (0..p0 as i32).map(|i| i % 10).collect();
        let hpos: Vec<i32> = (0..p0 as i32).collect();
        let pos: Vec<i32> = (p0..p0 + t).map(|p| p as i32).collect();
        pool.install(|| {
            if p0 > 0 {
                exec.run_rows(
                    test_bound(&b.plan, &prog, &binding, &views, None),
                    &mut cache,
                    &[("tokens", &history), ("pos", &hpos)],
                    p0,
                    p0,
                    None,
                )?;
            }
            exec.run_rows(
                test_bound(&b.plan, &prog, &binding, &views, None),
                &mut cache,
                &[("tokens", tokens), ("pos", &pos)],
                t,
                p0 + t,
                None,
            )
        })?;
        let mut outs = Vec::new();
        for (name, id) in &b.plan.outputs {
            outs.push(match name.as_str() {
                "ids" => exec
                    .i32_value(&b.plan, *id)?
                    .iter()
                    .map(|&v| v as u32)
                    .collect(),
                _ => exec
                    .f32_value(&b.plan, *id)?
                    .iter()
                    .map(|v| v.to_bits())
                    .collect(),
            });
        }
        Ok(outs)
    }

    /// An attention-only plan (queries and keys are F32 embedding rows, the keys RMS-normed, so
    /// no quantization touches them) over `heads` heads of `w` latent values, `len` of them
    /// weighted; with `scores_out` the raw scores are an output too (which keeps the causal cut
    /// away).
    fn attention_plan(heads: usize, w: usize, len: usize, scores_out: bool) -> Built {
        let mut values: Vec<Value> = Vec::new();
        let mut val = |dtype, dims, storage| push_value(&mut values, dtype, dims, storage);
        let f = Dim::Fixed;
        let (t, s) = (Dim::Tokens, Dim::Keys);
        let tokens = val(DType::I32, vec![t], None);
        let pos = val(DType::I32, vec![t], None);
        let qe = val(DType::F32, vec![t, f(heads * w)], None);
        let q = val(DType::F32, vec![t, f(heads), f(w)], Some(Storage::Slot(qe)));
        let kv_raw = val(DType::F32, vec![t, f(w)], None);
        let kv = val(DType::F32, vec![t, f(w)], None);
        let cache = val(
            DType::F32,
            vec![s, f(w)],
            Some(Storage::KvCache { layer: 0 }),
        );
        let sc = val(DType::F32, vec![t, f(heads), s], None);
        let scs = val(DType::F32, vec![t, f(heads), s], None);
        let msk = val(DType::F32, vec![t, f(heads), s], None);
        let p = val(DType::F32, vec![t, f(heads), s], None);
        let o = val(DType::F32, vec![t, f(heads), f(len)], None);
        let n_values = values.len();
        let vocab = 10;
        let wref = |name: &str, ne: Vec<usize>| WeightRef {
            name: name.into(),
            ggml_type: "F32".into(),
            ne,
        };
        let v = Operand::Value;
        let st = step;
        let mut steps = vec![
            st(
                Op::Embed,
                Attrs::None,
                vec![Operand::Weight(0), v(tokens)],
                qe,
            ),
            st(
                Op::Reshape,
                Attrs::Reshape(Shape(vec![t, f(heads), f(w)])),
                vec![v(qe)],
                q,
            ),
            st(
                Op::Embed,
                Attrs::None,
                vec![Operand::Weight(1), v(tokens)],
                kv_raw,
            ),
            st(
                Op::RmsNorm,
                Attrs::Eps(1e-6),
                vec![v(kv_raw), Operand::Weight(2)],
                kv,
            ),
        ];
        steps.extend(attention_steps(
            q,
            kv,
            pos,
            cache,
            [sc, scs, msk, p, o],
            len,
        ));
        let mut outputs = vec![("p".to_string(), p), ("o".to_string(), o)];
        if scores_out {
            outputs.push(("sc".into(), sc));
        }
        Built {
            plan: Plan {
                config: config(),
                stages: vec!["hand".into()],
                weights: vec![
                    wref("q_emb", vec![heads * w, vocab]),
                    wref("kv_emb", vec![w, vocab]),
                    wref("kv_norm", vec![w]),
                ],
                values,
                n_slots: n_values,
                inputs: vec![("tokens".into(), tokens), ("pos".into(), pos)],
                outputs,
                steps,
                output_head: None,
            },
            weights: vec![
                f32_bytes(&noise(heads * w * vocab, 21)),
                f32_bytes(&noise(w * vocab, 22)),
                f32_bytes(&noise(w, 23)),
            ],
        }
    }

    /// One run of `b` on `tokens` at positions `p0 ..` (the cache holding the `p0` before).
    fn run_at(
        exec: &mut Executor<CpuKernel>,
        b: &Built,
        prog: &CpuProgram,
        binding: &Binding,
        cache: &mut LatentKvCache,
        tokens: &[i32],
        p0: usize,
    ) -> Result<(), ExecError> {
        let views: Vec<&[u8]> = b.weights.iter().map(Vec::as_slice).collect();
        let pos: Vec<i32> = (p0..p0 + tokens.len()).map(|p| p as i32).collect();
        let bound = test_bound(&b.plan, prog, binding, &views, None);
        let t = tokens.len();
        exec.run_rows(
            bound,
            cache,
            &[("tokens", tokens), ("pos", &pos)],
            t,
            p0 + t,
            None,
        )
    }

    /// At one token the cpu backend's F32 `mat_mul` (the router) gives the oracle's bits: the
    /// router logits of a decoded token under `q8x2` equal the oracle's.
    #[test]
    fn the_cpu_router_at_one_token_gives_the_oracles_bits() {
        let mut b = build();
        let router = b
            .plan
            .steps
            .iter()
            .find(|s| s.op == Op::MatMul && s.args.first() == Some(&Operand::Weight(5)))
            .expect("the router step")
            .out;
        b.plan.outputs = vec![("router".into(), router)];
        let prog = CpuProgram::compile(&b.plan, &host_symbols()).expect("lowering");
        let mut outs = Vec::new();
        let cpu = CpuBackend::new(CpuNumerics::Q8x2);
        for backend in [&OracleBackend as &dyn Backend, &cpu] {
            let binding = backend.bind(&b.plan).expect("bind");
            let mut exec = Executor::new(&b.plan, &prog).expect("exec");
            let mut cache = LatentKvCache::new(1, 16, 8).expect("cache");
            for (p0, tokens) in [(0, &[3, 1, 4, 1, 5][..]), (5, &[9][..])] {
                run_at(&mut exec, &b, &prog, &binding, &mut cache, tokens, p0).expect("run");
            }
            let v = exec.f32_value(&b.plan, router).expect("router logits");
            outs.push(v.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
        }
        assert_eq!(outs[0].len(), 6);
        assert_eq!(outs[0], outs[1]);
    }

    /// With `last_only` the head and the steps only it needs run for the last token alone: the
    /// hand plan's FFN output (`moe`, read by the head's residual add) has one row after such a
    /// run, the values the router and the attention make keep every row, and the head's row is
    /// the last row of a run without `last_only`, bit for bit, under the oracle and `q8x2`, in a
    /// prompt over earlier keys and at one token.
    #[test]
    fn the_last_row_steps_run_for_the_last_token_alone() {
        let mut b = build();
        let y = b.plan.outputs[0].1;
        let moe = b
            .plan
            .steps
            .iter()
            .find(|s| s.op == Op::MoeFfn)
            .expect("moe")
            .out;
        let h = b
            .plan
            .steps
            .iter()
            .find(|s| s.op == Op::RmsNorm)
            .expect("norm")
            .out;
        let logits = push_value(
            &mut b.plan.values,
            DType::F32,
            vec![Dim::Tokens, Dim::Fixed(16)],
            None,
        );
        b.plan.n_slots = b.plan.values.len();
        b.plan.steps.push(step(
            Op::MatMul,
            Attrs::None,
            vec![Operand::Weight(2), Operand::Value(y)],
            logits,
        ));
        b.plan.output_head = Some(OutputHead {
            step: b.plan.steps.len() - 1,
            value: logits,
        });
        let ids = b.plan.outputs[2].1;
        b.plan.outputs = vec![("logits".into(), logits), ("ids".into(), ids)];
        let rows = b.plan.last_rows();
        assert!(rows.values[moe] && rows.values[y] && rows.values[logits]);
        assert!(!rows.values[h] && !rows.values[ids]);
        let prog = CpuProgram::compile(&b.plan, &host_symbols()).expect("lowering");
        let cpu = CpuBackend::new(CpuNumerics::Q8x2);
        let views: Vec<&[u8]> = b.weights.iter().map(Vec::as_slice).collect();
        for backend in [&OracleBackend as &dyn Backend, &cpu] {
            let binding = backend.bind(&b.plan).expect("bind");
            let mut runs = Vec::new();
            for last_only in [None, Some(logits)] {
                let mut exec = Executor::new(&b.plan, &prog).expect("exec");
                let mut cache = LatentKvCache::new(1, 16, 8).expect("cache");
                let mut got = Vec::new();
                for (p0, tokens) in [
                    (0, &[3, 1, 4, 1, 5][..]),
                    (5, &[9, 2, 6][..]),
                    (8, &[5][..]),
                ] {
                    let t = tokens.len();
                    let pos: Vec<i32> = (p0..p0 + t).map(|p| p as i32).collect();
                    exec.run_rows(
                        test_bound(&b.plan, &prog, &binding, &views, None),
                        &mut cache,
                        &[("tokens", tokens), ("pos", &pos)],
                        t,
                        p0 + t,
                        last_only,
                    )
                    .expect("run");
                    let head = exec.f32_value(&b.plan, logits).expect("logits");
                    let row: Vec<u32> = head[head.len() - 16..]
                        .iter()
                        .map(|x| x.to_bits())
                        .collect();
                    let one = if last_only.is_some() { 1 } else { t };
                    assert_eq!(head.len(), 16 * one, "{}", backend.name());
                    assert_eq!(exec.f32_value(&b.plan, moe).expect("moe").len(), 32 * one);
                    assert_eq!(exec.f32_value(&b.plan, h).expect("h").len(), 32 * t);
                    assert_eq!(exec.i32_value(&b.plan, ids).expect("ids").len(), 2 * t);
                    got.push(row);
                }
                runs.push(got);
            }
            assert_eq!(runs[0], runs[1], "{}", backend.name());
        }
        // Another value than the head's cannot be asked for its last row alone.
        let mut exec = Executor::new(&b.plan, &prog).expect("exec");
        let mut cache = LatentKvCache::new(1, 16, 8).expect("cache");
        let binding = oracle_binding(&b.plan);
        let err = exec
            .run_rows(
                test_bound(&b.plan, &prog, &binding, &views, None),
                &mut cache,
                &[("tokens", &[1, 2]), ("pos", &[0, 1])],
                2,
                2,
                Some(y),
            )
            .unwrap_err();
        assert!(
            matches!(err, ExecError::Value { value, .. } if value == y),
            "{err}"
        );
    }

    /// The bits of every output of `b` after a 20-token prompt (positions 0–19) and after one
    /// decoded token at 20 (a cache of rows of `cache_w`), under the oracle and under `q8x2`
    /// (which must take `fast` of the plan's steps).
    fn oracle_and_cpu_outputs(b: &Built, fast: usize, cache_w: usize) -> Vec<Vec<Vec<u32>>> {
        let prog = CpuProgram::compile(&b.plan, &host_symbols()).expect("lowering");
        let mut outs = Vec::new();
        let cpu = CpuBackend::new(CpuNumerics::Q8x2);
        for (backend, want) in [(&OracleBackend as &dyn Backend, 0), (&cpu, fast)] {
            let binding = backend.bind(&b.plan).expect("bind");
            let mut exec = Executor::new(&b.plan, &prog).expect("exec");
            let taken = kernels(&binding)
                .iter()
                .filter(|k| matches!(k, HostKernel::Own(_)))
                .count();
            assert_eq!(taken, want, "{}", backend.name());
            let mut cache = LatentKvCache::new(1, 64, cache_w).expect("cache");
            let mut got = Vec::new();
            for (p0, t) in [(0usize, 20usize), (20, 1)] {
                let tokens: Vec<i32> = (0..t).map(|i| ((p0 + i) * 7 % 10) as i32).collect();
                run_at(&mut exec, b, &prog, &binding, &mut cache, &tokens, p0).expect("run");
                for (_, id) in &b.plan.outputs {
                    let v = exec.f32_value(&b.plan, *id).expect("value");
                    got.push(v.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
                }
            }
            outs.push(got);
        }
        outs
    }

    /// The cpu backend's `rms_norm`, `scores_qk`, `scale`, `causal_mask`, `softmax` and
    /// `weighted_sum` give the oracle's bits: at
    /// prefill (with and without the causal cut) and at decode over a longer cache, for widths
    /// and lengths that leave tails in every vector loop.
    #[test]
    fn cpu_attention_steps_give_the_oracles_bits() {
        let (heads, w, len) = (4, 43, 37);
        for scores_out in [false, true] {
            let b = attention_plan(heads, w, len, scores_out);
            // A 20-token prompt (80 score rows: the causal cut), then one token at 20.
            let outs = oracle_and_cpu_outputs(&b, 6, w);
            assert!(outs[0]
                .iter()
                .flatten()
                .all(|&v| f32::from_bits(v).is_finite()));
            assert_eq!(outs[0], outs[1], "scores as an output: {scores_out}");
        }
    }

    /// `embed` of `[T, heads·d]` rows (times 20, so that SiLU meets large magnitudes),
    /// `rope_yarn` (YaRN on, `n_rot` 6 of `d` 10), `attn_temperature` (L = 3, so the factor
    /// changes every third position) and `silu`; outputs the rotated, the scaled and the SiLU
    /// rows.
    fn rope_plan(heads: usize, d: usize) -> Built {
        let mut values: Vec<Value> = Vec::new();
        let mut val = |dtype, dims, storage| push_value(&mut values, dtype, dims, storage);
        let (f, t) = (Dim::Fixed, Dim::Tokens);
        let tokens = val(DType::I32, vec![t], None);
        let pos = val(DType::I32, vec![t], None);
        let qe = val(DType::F32, vec![t, f(heads * d)], None);
        let q = val(DType::F32, vec![t, f(heads), f(d)], Some(Storage::Slot(qe)));
        let r = val(DType::F32, vec![t, f(heads), f(d)], None);
        let o = val(DType::F32, vec![t, f(heads), f(d)], None);
        let g = val(DType::F32, vec![t, f(heads), f(d)], None);
        let n_values = values.len();
        let vocab = 10;
        let rope = YarnParams {
            n_rot: 6,
            factor: 4.0,
            original_context: 8,
            attn_factor: 1.3,
            ..config().rope
        };
        let v = Operand::Value;
        let steps = vec![
            step(
                Op::Embed,
                Attrs::None,
                vec![Operand::Weight(0), v(tokens)],
                qe,
            ),
            step(
                Op::Reshape,
                Attrs::Reshape(Shape(vec![t, f(heads), f(d)])),
                vec![v(qe)],
                q,
            ),
            step(Op::RopeYarn, Attrs::Rope(rope), vec![v(q), v(pos)], r),
            step(
                Op::AttnTemperature,
                Attrs::Temperature(QueryTemperature {
                    scale: 0.1,
                    length: 3,
                }),
                vec![v(r), v(pos)],
                o,
            ),
            step(Op::Silu, Attrs::None, vec![v(o)], g),
        ];
        Built {
            plan: Plan {
                config: config(),
                stages: vec!["hand".into()],
                weights: vec![WeightRef {
                    name: "q_emb".into(),
                    ggml_type: "F32".into(),
                    ne: vec![heads * d, vocab],
                }],
                values,
                n_slots: n_values,
                inputs: vec![("tokens".into(), tokens), ("pos".into(), pos)],
                outputs: vec![("r".into(), r), ("o".into(), o), ("g".into(), g)],
                steps,
                output_head: None,
            },
            weights: vec![f32_bytes(
                &noise(heads * d * vocab, 31)
                    .iter()
                    .map(|v| 20.0 * v)
                    .collect::<Vec<_>>(),
            )],
        }
    }

    /// The cpu backend's `rope_yarn`, `attn_temperature` and `silu` give the oracle's bits over a
    /// prompt (positions 0–19, several temperature factors) and a decoded token at position 20.
    #[test]
    fn cpu_rope_temperature_and_silu_give_the_oracles_bits() {
        let b = rope_plan(3, 10);
        let outs = oracle_and_cpu_outputs(&b, 3, 4);
        let o = &outs[0];
        assert!(o.iter().flatten().all(|&v| f32::from_bits(v).is_finite()));
        // The rotation and the factor changed the values (the prompt's rows 1.. and 3..).
        assert_ne!(o[0], o[1], "the temperature scaled the rows");
        assert_eq!(outs[0], outs[1]);
    }

    #[test]
    fn results_are_bit_identical_for_one_two_and_three_threads() {
        let b = build();
        let tokens = [3, 1, 4, 1, 5, 9, 2];
        let one = run_in_pool(&b, &tokens, 4, 1).expect("1 thread");
        let two = run_in_pool(&b, &tokens, 4, 2).expect("2 threads");
        let three = run_in_pool(&b, &tokens, 4, 3).expect("3 threads");
        assert_eq!(one, two);
        assert_eq!(one, three);
        assert!(one[0].iter().all(|&v| f32::from_bits(v).is_finite()));
    }

    #[test]
    fn quantized_mat_mul_equals_the_quant_dot_bitwise() {
        // Several tokens take the dequantized-row path of the generated mat-vec; the runtime's
        // dot of the same row must give the same bits (documented reduction order).
        let b = build();
        let tokens = [7, 2, 9];
        let outs = run_in_pool(&b, &tokens, 0, 2).expect("run");
        let q: Vec<f32> = outs[3].iter().map(|&v| f32::from_bits(v)).collect();
        // recompute h = rms_norm(embed) in the same f32 order is not needed: read it back instead.
        let prog = CpuProgram::compile(&b.plan, &host_symbols()).expect("lowering");
        let binding = oracle_binding(&b.plan);
        let mut exec = Executor::new(&b.plan, &prog).expect("exec");
        let mut cache = LatentKvCache::new(1, 16, 8).expect("cache");
        let views: Vec<&[u8]> = b.weights.iter().map(Vec::as_slice).collect();
        exec.run_rows(
            test_bound(&b.plan, &prog, &binding, &views, None),
            &mut cache,
            &[("tokens", &tokens), ("pos", &[0, 1, 2])],
            3,
            3,
            None,
        )
        .expect("run");
        let h = exec.f32_value(&b.plan, 3).expect("h");
        let row_bytes = GgmlType::Q8_0.row_size(32).expect("row size");
        for t in 0..3 {
            for o in 0..16 {
                let row = &b.weights[2][o * row_bytes..(o + 1) * row_bytes];
                let want =
                    quant::dot_row(GgmlType::Q8_0, row, &h[t * 32..(t + 1) * 32]).expect("dot");
                assert_eq!(q[t * 16 + o].to_bits(), want.to_bits(), "token {t} row {o}");
            }
        }
    }

    /// A [`WeightFile`] over the views themselves, or one whose reads fail.
    #[derive(Debug)]
    struct ViewFile {
        fail: bool,
    }

    impl WeightFile for ViewFile {
        fn read(&self, view: &[u8], offset: usize, out: &mut [u8]) -> std::io::Result<()> {
            if self.fail {
                return Err(std::io::Error::other("the disk went away"));
            }
            out.copy_from_slice(&view[offset..offset + out.len()]);
            Ok(())
        }
    }

    /// `build()`'s outputs for `tokens` at positions `0..`, its embedding rows read in place or
    /// through `file`.
    fn run_with_file(
        b: &Built,
        tokens: &[i32],
        file: Option<&dyn WeightFile>,
    ) -> Result<Vec<Vec<u32>>, ExecError> {
        let prog = CpuProgram::compile(&b.plan, &host_symbols()).expect("lowering");
        let binding = oracle_binding(&b.plan);
        let mut exec = Executor::new(&b.plan, &prog)?;
        let mut cache = LatentKvCache::new(1, tokens.len(), 8).expect("cache");
        let views: Vec<&[u8]> = b.weights.iter().map(Vec::as_slice).collect();
        let pos: Vec<i32> = (0..tokens.len() as i32).collect();
        let bound = test_bound(&b.plan, &prog, &binding, &views, file);
        let t = tokens.len();
        exec.run_rows(
            bound,
            &mut cache,
            &[("tokens", tokens), ("pos", &pos)],
            t,
            t,
            None,
        )?;
        let ids = exec.i32_value(&b.plan, b.plan.outputs[2].1)?;
        let y = exec.f32_value(&b.plan, b.plan.outputs[0].1)?;
        Ok(vec![
            ids.iter().map(|&v| v as u32).collect(),
            y.iter().map(|v| v.to_bits()).collect(),
        ])
    }

    /// Rows read through a [`WeightFile`] (here more tokens than one run of [`EMBED_RUN`]) give
    /// the bits of the table read in place; a failed read is an `Embed` error of the step.
    #[test]
    fn embedding_rows_read_from_the_file_give_the_in_place_bits() {
        let b = build();
        let tokens: Vec<i32> = (0..EMBED_RUN as i32 + 9)
            .map(|i| (i * 7 + 3) % 10)
            .collect();
        let in_place = run_with_file(&b, &tokens, None).expect("in place");
        let read = run_with_file(&b, &tokens, Some(&ViewFile { fail: false })).expect("read");
        assert_eq!(read, in_place);
        match run_with_file(&b, &tokens, Some(&ViewFile { fail: true })) {
            Err(ExecError::Embed { step: 0, detail }) => {
                assert!(detail.contains("the disk went away"), "{detail}")
            }
            other => panic!("expected an embed error, got {other:?}"),
        }
    }

    #[test]
    fn a_token_id_past_the_vocabulary_is_an_index_error() {
        let b = build();
        match run_in_pool(&b, &[1, 10], 0, 1) {
            Err(ExecError::Index {
                step: 0,
                op: "embed",
                what: "token id",
                index: 1,
                id: 10,
                bound: 10,
            }) => {}
            other => panic!("expected an index error, got {other:?}"),
        }
    }

    #[test]
    fn a_nan_router_selects_no_expert_and_is_refused() {
        let mut b = build();
        // NaN router weights: every probability is NaN, top-k finds no candidate (−1).
        b.weights[5] = f32_bytes(&[f32::NAN; 192]);
        match run_in_pool(&b, &[1, 2], 0, 2) {
            Err(ExecError::Index {
                op: "gather_renorm",
                what: "expert id",
                id: -1,
                bound: 6,
                ..
            }) => {}
            other => panic!("expected the expert-id check to fire, got {other:?}"),
        }
    }

    #[test]
    fn wrong_weight_bytes_and_missing_inputs_are_refused() {
        let mut b = build();
        b.weights[2].pop();
        assert!(matches!(
            run_in_pool(&b, &[1], 0, 1),
            Err(ExecError::WeightSize { index: 2, .. })
        ));
        let b = build();
        let prog = CpuProgram::compile(&b.plan, &host_symbols()).expect("lowering");
        let binding = oracle_binding(&b.plan);
        let mut exec = Executor::new(&b.plan, &prog).expect("exec");
        let mut cache = LatentKvCache::new(1, 16, 8).expect("cache");
        let views: Vec<&[u8]> = b.weights.iter().map(Vec::as_slice).collect();
        let e = exec
            .run_rows(
                test_bound(&b.plan, &prog, &binding, &views, None),
                &mut cache,
                &[("tokens", &[1])],
                1,
                1,
                None,
            )
            .expect_err("pos missing");
        assert!(
            matches!(e, ExecError::Input { ref name, .. } if name == "pos"),
            "{e}"
        );
        let e = exec
            .run_rows(
                test_bound(&b.plan, &prog, &binding, &views, None),
                &mut cache,
                &[("tokens", &[1]), ("pos", &[0])],
                1,
                17,
                None,
            )
            .expect_err("S past the cache");
        assert!(matches!(e, ExecError::Cache(_)), "{e}");
    }
}
