//! The Vulkan executor: a compiled plan's GPU kernels run on one device.
//!
//! Algorithm. At load ([`DevicePlan::new`]): every step's launches (the binding's, kernels built
//! for the device's subgroup width) are printed as GLSL, compiled to SPIR-V in process (cached
//! on disk by source) and made into one pipeline per distinct kernel; every plan weight is
//! uploaded once into a device buffer of its own (addressed by device address, so no tensor is
//! bound to `maxStorageBufferRange`); a stacked expert tensor goes into buffers of whole
//! experts, each within the device's largest buffer (`maxMemoryAllocationSize`,
//! `maxBufferSize`), and is read through a table of its experts' addresses ([`ExpertTables`]),
//! which the host writes before each step (an expert's slot when resident, else its bytes in
//! the host store) and the step's command buffer copies into device memory first. Per session ([`DeviceRun`]):
//! one device buffer per plan slot, grown to the largest value placed in it; the latent KV
//! cache, one buffer per layer; the step scratch; a host-visible buffer of the run's arguments
//! (the extents `T`, `S` and every launch's workgroup counts). A run of `T` tokens over `S` keys
//! writes its inputs, extents and counts into host-visible memory, then submits one command
//! buffer and waits once — no host wait inside a step: the copy of the inputs, every launch of
//! every step in plan order (push constants: the bound buffers' addresses and that of the
//! extents; indirect dispatches; a barrier between launches; with profiling on, a timestamp
//! after every launch) and the copies of the requested outputs into the staging buffer. That
//! command buffer is recorded once per shape (tokens, head, outputs) and buffer set, and
//! replayed while they stay: every decode step after a request's first replays it. Where the
//! host store cannot be read in place ([`HostMode::Stage`]), a run is split before every
//! `moe_ffn`: one command buffer per segment, and between two of them the host reads the
//! layer's routed expert ids back and has the caller upload the missed experts and rewrite
//! their table entries ([`DeviceRun::run`]'s `stage`). Slot and
//! scratch buffers grow to at least twice their size when they must, so a window growing a key
//! at a time makes few of them anew. When only the last position's logits are wanted, the steps
//! only they need ([`Plan::last_rows`]: the last layer's FFN, the final norm, the head) run for
//! that row alone (each whole input's address advanced to its last row, extents `[1, S]`).
//!
//! Contract. Inputs are checked by the caller (the session): token ids below the vocabulary,
//! positions below `S ≤` the cache's capacity. Routed-expert ids come from the device's `top_k`;
//! the caller reads them back and refuses a step whose ids are outside the experts.

use super::context::{
    Buffer, Location, Pipeline, Recording, Timestamps, VulkanContext, INDIRECT_BYTES,
};
use super::device::Limits;
use super::error::VulkanError;
use super::host_store::{HostMode, HostStore};
use super::shader::compile_glsl;
use crate::backend::KernelTime;
use crate::progress::{Count, Progress};
use crate::weights::Weights;
use aubier_compiler::plan::{LastRows, Operand, Plan, Storage, ValueId};
use aubier_compiler::types::Dim;
use aubier_kernels_gen::gpu::glsl;
use aubier_kernels_gen::gpu::ir::{Kernel, ParamKind};
use aubier_kernels_gen::gpu::launch::{Arg, Launch};
use std::collections::HashMap;
use std::sync::Arc;

/// Bytes of one host staging copy while uploading weights.
const UPLOAD_CHUNK: usize = 64 << 20;

/// One launch of a step on the device.
struct DeviceLaunch {
    kernel: Kernel,
    /// Index into [`DevicePlan::pipelines`].
    pipeline: usize,
    args: Vec<Arg>,
    /// The plan weights bound to its weight and expert parameters.
    weights: Vec<usize>,
}

/// A plan made ready on a device: pipelines, weights, expert tables (shared by every session).
pub(crate) struct DevicePlan {
    ctx: VulkanContext,
    /// Per plan step, its launches.
    steps: Vec<Vec<DeviceLaunch>>,
    /// One per distinct kernel, with the kernel's name.
    pipelines: Vec<(String, Pipeline)>,
    /// Per plan weight, its bytes on the device.
    weights: Vec<DeviceWeight>,
    /// The address tables of the stacked expert tensors.
    tables: ExpertTables,
    /// The stacked expert tensors in host memory the device reads.
    host: HostStore,
    /// Per MoE layer, its `moe_ffn` step and the value of its routed expert ids (`[T, k]` i32),
    /// in step order: where a staged run ([`HostMode::Stage`]) stops to upload the misses.
    moe_ids: Vec<(usize, ValueId)>,
    /// The steps a run for the last position's logits runs for that position alone.
    rows: LastRows,
}

/// A plan weight on the device.
enum DeviceWeight {
    /// Read whole by its address, in device memory.
    Dense(Buffer),
    /// Stacked experts, read through their table ([`ExpertTables`]): each expert from its
    /// fast-store slot or from the host store ([`HostStore`]).
    Experts,
}

impl DeviceWeight {
    /// Bytes in device memory.
    fn size(&self) -> u64 {
        match self {
            DeviceWeight::Dense(b) => b.size(),
            DeviceWeight::Experts => 0,
        }
    }
}

/// The address tables of every stacked expert tensor (`n_expert` `u64` each, back to back): the
/// host writes them into `host` before a step, the step's command buffer copies them into
/// `device` before its first launch, and the kernels read `device`.
struct ExpertTables {
    /// Host-visible.
    host: Buffer,
    /// Device-local.
    device: Buffer,
    /// Per plan weight, the byte offset of its table.
    at: Vec<Option<u64>>,
    /// Entries per table.
    n_expert: usize,
}

impl std::fmt::Debug for DevicePlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DevicePlan")
            .field("device", &self.ctx.info().name)
            .field("pipelines", &self.pipelines.len())
            .field("weights", &self.weights.len())
            .finish()
    }
}

impl DevicePlan {
    /// Makes `plan` ready on `ctx`: the kernels of `launches` (per step, built for the device's
    /// subgroup width) compiled and made pipelines; the dense weights of `weights` uploaded into
    /// device memory and the stacked experts placed in the host store ([`HostStore`], in
    /// `host_mode`), no buffer over `max_bytes` (the device's own limit, or a lower one). The
    /// shader builds (counted in shaders), the host store's copy and the upload are steps of
    /// `progress`.
    ///
    /// Errors: [`VulkanError::Invalid`] when a kernel cannot be printed (naming it) or the
    /// launches do not fit the plan; [`VulkanError::Unsupported`] when a kernel's workgroup or
    /// shared memory is over the device's limits, or a dense weight or one expert is over
    /// `max_bytes`; [`VulkanError::Compile`] from the shader compiler; those of the host store;
    /// [`VulkanError::Vk`] from the driver (e.g. out of device memory for the weights).
    pub(crate) fn new(
        ctx: VulkanContext,
        plan: &Plan,
        launches: &[Vec<Launch>],
        weights: &Arc<Weights>,
        max_bytes: u64,
        host_mode: HostMode,
        progress: &mut dyn Progress,
    ) -> Result<Self, VulkanError> {
        let mut sources: HashMap<String, usize> = HashMap::new();
        let mut steps = Vec::with_capacity(plan.steps.len());
        let header = ["Generated by aubier's vulkan backend at load; not checked in.".into()];
        if launches.len() != plan.steps.len() {
            return Err(VulkanError::Invalid(format!(
                "{} bound steps for a plan of {}",
                launches.len(),
                plan.steps.len()
            )));
        }
        let mut builds: Vec<(String, &Kernel)> = Vec::new();
        for ls in launches {
            let mut out = Vec::with_capacity(ls.len());
            for l in ls {
                fits(&ctx.info().limits, &l.kernel).map_err(|what| VulkanError::Unsupported {
                    device: ctx.info().index,
                    name: ctx.info().name.clone(),
                    what,
                })?;
                let source = glsl::render_glsl(&l.kernel, &header)
                    .map_err(|e| VulkanError::Invalid(format!("printing a kernel: {e}")))?;
                let pipeline = match sources.get(&source) {
                    Some(&p) => p,
                    None => {
                        sources.insert(source.clone(), builds.len());
                        builds.push((source, &l.kernel));
                        builds.len() - 1
                    }
                };
                out.push(DeviceLaunch {
                    kernel: l.kernel.clone(),
                    pipeline,
                    args: l.args.clone(),
                    weights: launch_weights(&plan.steps[steps.len()].args, l),
                });
            }
            steps.push(out);
        }
        progress.step(
            "compiling shaders",
            Count::Items(builds.len() as u64, "shaders"),
        );
        let mut pipelines = Vec::with_capacity(builds.len());
        for (source, kernel) in builds {
            let spirv = compile_glsl(&source, &kernel.name)?;
            let p = ctx.pipeline(&spirv, glsl::push_constant_bytes(kernel))?;
            pipelines.push((kernel.name.clone(), p));
            progress.advance(1);
        }
        if weights.len() != plan.weights.len() {
            return Err(VulkanError::Invalid(format!(
                "{} weights for a plan of {}",
                weights.len(),
                plan.weights.len()
            )));
        }
        let moe = plan
            .moe_layers()
            .map_err(|e| VulkanError::Invalid(e.to_string()))?;
        let mut experts = vec![false; plan.weights.len()];
        for t in moe.iter().flat_map(|l| &l.tensors) {
            experts[t.weight] = true;
        }
        let mut moe_ids = Vec::with_capacity(moe.len());
        for l in &moe {
            match plan.steps[l.step].args.get(1) {
                Some(&Operand::Value(ids)) => moe_ids.push((l.step, ids)),
                _ => {
                    return Err(VulkanError::Invalid(format!(
                        "step {}: a moe_ffn whose second operand is not its expert ids",
                        l.step
                    )))
                }
            }
        }
        moe_ids.sort_unstable();
        let host = HostStore::new(&ctx, weights, &moe, max_bytes, host_mode, progress)?;
        let weights = upload_weights(&ctx, plan, &weights.views(), &experts, max_bytes, progress)?;
        let n_expert = plan.config.n_expert.max(1);
        let mut at = vec![None; weights.len()];
        let mut table_bytes = 0u64;
        for (w, dw) in weights.iter().enumerate() {
            if let DeviceWeight::Experts = dw {
                at[w] = Some(table_bytes);
                table_bytes += 8 * n_expert as u64;
            }
        }
        let table_bytes = table_bytes.max(8);
        let tables = ExpertTables {
            host: ctx.buffer(table_bytes, Location::Host)?,
            device: ctx.buffer(table_bytes, Location::Device)?,
            at,
            n_expert,
        };
        tracing::info!(
            device = %ctx.info().name,
            subgroup = ctx.info().subgroup_size,
            pipelines = pipelines.len(),
            weight_bytes = weights.iter().map(DeviceWeight::size).sum::<u64>(),
            "plan made ready on the Vulkan device"
        );
        Ok(DevicePlan {
            ctx,
            steps,
            pipelines,
            weights,
            tables,
            host,
            moe_ids,
            rows: plan.last_rows(),
        })
    }

    /// The device's context.
    pub(crate) fn context(&self) -> &VulkanContext {
        &self.ctx
    }

    /// Bytes of a run's activation buffers at `T = t`, `S = s`: every plan slot at its largest
    /// value and every named scratch at its largest use (what [`DeviceRun`] allocates for such a
    /// step before any growth).
    pub(crate) fn run_bytes(&self, plan: &Plan, t: usize, s: usize) -> u64 {
        let mut slots = vec![0u64; plan.n_slots];
        for v in &plan.values {
            if let Storage::Slot(n) = v.storage {
                let e = elements(&v.shape.0, t, s).unwrap_or(0) as u64 * 4;
                if let Some(slot) = slots.get_mut(n) {
                    *slot = (*slot).max(e);
                }
            }
        }
        let mut scratch: HashMap<&str, u64> = HashMap::new();
        for a in self.steps.iter().flatten().flat_map(|l| &l.args) {
            if let Arg::Scratch { name, len } = a {
                let e = len.eval(t, s).unwrap_or(0) as u64 * 4;
                let n = scratch.entry(name).or_default();
                *n = (*n).max(e);
            }
        }
        slots.iter().sum::<u64>() + scratch.values().sum::<u64>()
    }

    /// The host store.
    pub(crate) fn host(&self) -> &HostStore {
        &self.host
    }

    /// Bytes of the dense weights in device memory.
    pub(crate) fn dense_bytes(&self) -> u64 {
        self.weights.iter().map(DeviceWeight::size).sum()
    }

    /// Bytes of the expert tables (host-visible and device-local).
    pub(crate) fn table_bytes(&self) -> u64 {
        self.tables.host.size() + self.tables.device.size()
    }

    /// Writes the expert tables for the next step: `table(w)` gives the `n_expert` addresses of
    /// every weight read as experts.
    ///
    /// Errors: [`VulkanError::Invalid`] for a table of the wrong length; those of the upload.
    pub(crate) fn write_tables(
        &self,
        mut table: impl FnMut(usize) -> Vec<u64>,
    ) -> Result<(), VulkanError> {
        let mut bytes = vec![0u8; self.tables.host.size() as usize];
        for (w, at) in self.tables.at.iter().enumerate() {
            let Some(at) = at else { continue };
            let entries = table(w);
            let at = *at as usize;
            let end = at + 8 * entries.len();
            let dst = bytes.get_mut(at..end).ok_or_else(|| {
                VulkanError::Invalid(format!("the table of weight {w} overflows"))
            })?;
            for (d, a) in dst.chunks_exact_mut(8).zip(entries) {
                d.copy_from_slice(&a.to_le_bytes());
            }
        }
        self.ctx.upload(&self.tables.host, 0, &bytes)
    }

    /// Points entry `e` of the table of weight `w` at `address`, for every `(w, e, address)` of
    /// `entries`, in the device's copy too (a staged run, between two segments).
    ///
    /// Errors: [`VulkanError::Invalid`] for a weight without a table or an entry past it; those
    /// of the upload and the copy's submission.
    pub(crate) fn set_table_entries(
        &self,
        entries: &[(usize, usize, u64)],
    ) -> Result<(), VulkanError> {
        let mut at = Vec::with_capacity(entries.len());
        for &(w, e, address) in entries {
            let base =
                self.tables.at.get(w).copied().flatten().ok_or_else(|| {
                    VulkanError::Invalid(format!("weight {w} has no expert table"))
                })?;
            if e >= self.tables.n_expert {
                return Err(VulkanError::Invalid(format!(
                    "expert {e} of weight {w}: the table has {}",
                    self.tables.n_expert
                )));
            }
            let offset = base + 8 * e as u64;
            self.ctx
                .upload(&self.tables.host, offset, &address.to_le_bytes())?;
            at.push(offset);
        }
        let t = &self.tables;
        self.ctx.run(|r| {
            for &offset in &at {
                r.copy(&t.host, offset, &t.device, offset, 8)?;
            }
            Ok(())
        })
    }
}

/// The plan weights launch `l` of a step with operands `operands` reads: those bound to its
/// weight and expert parameters.
fn launch_weights(operands: &[Operand], l: &Launch) -> Vec<usize> {
    l.kernel
        .params
        .iter()
        .zip(&l.args)
        .filter_map(|((_, kind), arg)| match (kind, arg) {
            (ParamKind::Weight { .. } | ParamKind::Experts { .. }, Arg::Operand(i)) => {
                match operands.get(*i) {
                    Some(&Operand::Weight(w)) => Some(w),
                    _ => None,
                }
            }
            _ => None,
        })
        .collect()
}

/// `Ok` when kernel `k`'s workgroup and shared memory fit within `l` (a model of other
/// dimensions can ask for more than a small device has); else what does not fit.
fn fits(l: &Limits, k: &Kernel) -> Result<(), String> {
    let invocations = l.max_compute_work_group_size[0].min(l.max_compute_work_group_invocations);
    let shared: usize = k.shared.iter().map(|(_, _, len)| 4 * len).sum();
    if k.block > invocations {
        Err(format!(
            "kernel `{}` takes workgroups of {} invocations, more than the device's {invocations}",
            k.name, k.block
        ))
    } else if shared > l.max_compute_shared_memory_size as usize {
        Err(format!(
            "kernel `{}` takes {shared} bytes of shared memory, more than the device's {}",
            k.name, l.max_compute_shared_memory_size
        ))
    } else {
        Ok(())
    }
}

/// Uploads every dense weight into one buffer of its own (one byte for an empty tensor, never
/// read); a stacked expert tensor (`experts[w]`) stays in the host store. The upload is a step
/// of `progress`, counted in bytes.
///
/// Errors: [`VulkanError::Unsupported`] for a dense weight over `max_bytes`; those of the
/// buffers and uploads.
fn upload_weights(
    ctx: &VulkanContext,
    plan: &Plan,
    weights: &[&[u8]],
    experts: &[bool],
    max_bytes: u64,
    progress: &mut dyn Progress,
) -> Result<Vec<DeviceWeight>, VulkanError> {
    let dense = weights.iter().zip(experts).filter(|(_, &stacked)| !stacked);
    progress.step(
        "uploading dense weights",
        Count::Bytes(dense.map(|(b, _)| b.len() as u64).sum()),
    );
    let mut out = Vec::with_capacity(weights.len());
    for (w, (bytes, &stacked)) in weights.iter().zip(experts).enumerate() {
        if stacked {
            out.push(DeviceWeight::Experts);
            continue;
        }
        let name = plan.weights.get(w).map_or("?", |pw| pw.name.as_str());
        if bytes.len() as u64 > max_bytes {
            let info = ctx.info();
            return Err(VulkanError::Unsupported {
                device: info.index,
                name: info.name.clone(),
                what: format!(
                    "`{name}`: {} bytes is over the {max_bytes} bytes one buffer may hold on \
                     this device",
                    bytes.len()
                ),
            });
        }
        let buf = ctx.buffer(bytes.len().max(1) as u64, Location::Device)?;
        for (i, chunk) in bytes.chunks(UPLOAD_CHUNK).enumerate() {
            ctx.upload(&buf, (i * UPLOAD_CHUNK) as u64, chunk)?;
            progress.advance(chunk.len() as u64);
        }
        out.push(DeviceWeight::Dense(buf));
    }
    Ok(out)
}

/// Elements of `dims` at `T = t`, `S = s` (`None` on overflow).
fn elements(dims: &[Dim], t: usize, s: usize) -> Option<usize> {
    dims.iter().try_fold(1usize, |n, d| {
        n.checked_mul(match d {
            Dim::Fixed(k) => *k,
            Dim::Tokens => t,
            Dim::Keys => s,
        })
    })
}

/// One session's device state: slot buffers, the latent KV cache, scratch, staging, the run's
/// arguments in host-visible memory and the command buffer of the last run.
pub(crate) struct DeviceRun {
    slots: Vec<Option<Buffer>>,
    /// Per layer, `[capacity, width]` f32.
    cache: Vec<Buffer>,
    capacity: usize,
    width: usize,
    scratch: HashMap<String, Buffer>,
    /// Host-visible staging of the inputs, then of the outputs.
    staging: Option<Buffer>,
    /// Host-visible arguments of a run: the extents `[T, S]`, those of a step run for the last
    /// position alone `[1, S]`, then one `VkDispatchIndirectCommand` per launch of the plan, in
    /// order.
    args: Buffer,
    /// Launches of the plan.
    n_launches: usize,
    /// Bumped whenever a buffer a recording names is made anew.
    generation: u64,
    /// The command buffers of the last run (one per segment) and what they were recorded for.
    recorded: Option<(RecordKey, Vec<Recording>)>,
    /// Runs submitted, and command buffers recorded for them.
    runs: u64,
    recordings: u64,
    /// With profiling on: the timestamp pool (one before the first launch, one after each).
    profile: Option<Timestamps>,
    /// GPU seconds per pipeline since profiling started.
    kernel_times: Vec<KernelTime>,
}

/// Bytes of the extents at the start of [`DeviceRun`]'s arguments: `[T, S, 1, S]` as i32.
const EXTENTS_BYTES: usize = 16;

/// What a recorded command buffer depends on besides its buffers' contents: a run of the same
/// key replays it (every decode step of a session after the first, while no buffer grows).
#[derive(Clone, Debug, PartialEq, Eq)]
struct RecordKey {
    /// Tokens (the inputs' and outputs' copies, the last-row steps' input rows).
    t: usize,
    /// Whether the steps of [`Plan::last_rows`] run for the last position alone.
    last: bool,
    /// The values read back and their bytes.
    reads: Vec<(ValueId, usize)>,
    /// [`DeviceRun::generation`] at recording.
    generation: u64,
}

/// A copy of an expert's bytes into its fast-store slot, recorded into a step's command buffer
/// just before the first launch of step `step` (the layer's `moe_ffn`, the first to read the
/// slot), so that no earlier launch waits for it.
#[derive(Clone, Copy)]
pub(crate) struct Promotion<'a> {
    /// The plan step that reads the slot first.
    pub step: usize,
    /// The expert's bytes (the host store).
    pub src: &'a Buffer,
    /// Their offset in `src`.
    pub src_offset: u64,
    /// The slot's buffer.
    pub dst: &'a Buffer,
    /// The slot's offset in `dst`.
    pub dst_offset: u64,
    /// Bytes.
    pub bytes: u64,
}

/// A staged run's call before a `moe_ffn` ([`DeviceRun::run`]): `(step, ids)` → the routed
/// experts made readable and their table entries set.
pub(crate) type StageFn<'a> = dyn FnMut(usize, &[i32]) -> Result<(), VulkanError> + 'a;

/// What a recording moves besides the launches: the inputs' and outputs' copies.
struct Reading<'a> {
    t: usize,
    last: bool,
    input_at: &'a [(ValueId, usize, usize)],
    reads: &'a [Readback],
    inputs_len: usize,
}

impl std::fmt::Debug for DeviceRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceRun")
            .field("layers", &self.cache.len())
            .field("capacity", &self.capacity)
            .finish()
    }
}

/// An output of a run: the value and the bytes to read (the last row only for a value of
/// [`Plan::last_rows`] in a run for the last position).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Readback {
    value: ValueId,
    bytes: usize,
}

impl DeviceRun {
    /// Device state for `plan` with a latent cache of `n_layer` layers of `capacity` rows of
    /// `width` f32, zeroed.
    ///
    /// Errors: [`VulkanError::Vk`] (out of device memory), [`VulkanError::Invalid`] for a cache
    /// of no bytes or one whose size overflows.
    pub(crate) fn new(
        dp: &DevicePlan,
        plan: &Plan,
        n_layer: usize,
        capacity: usize,
        width: usize,
    ) -> Result<Self, VulkanError> {
        let bytes = capacity
            .checked_mul(width)
            .and_then(|n| n.checked_mul(4))
            .ok_or_else(|| VulkanError::Invalid("the latent cache's size overflows".into()))?;
        let cache = (0..n_layer)
            .map(|_| dp.ctx.buffer(bytes as u64, Location::Device))
            .collect::<Result<Vec<_>, _>>()?;
        let n_launches = dp.steps.iter().map(Vec::len).sum::<usize>();
        let args = dp.ctx.buffer(
            (EXTENTS_BYTES + INDIRECT_BYTES * n_launches) as u64,
            Location::Host,
        )?;
        let mut run = DeviceRun {
            slots: (0..plan.n_slots).map(|_| None).collect(),
            cache,
            capacity,
            width,
            scratch: HashMap::new(),
            staging: None,
            args,
            n_launches,
            generation: 0,
            recorded: None,
            runs: 0,
            recordings: 0,
            profile: None,
            kernel_times: Vec::new(),
        };
        run.reset(dp)?;
        Ok(run)
    }

    /// Zeroes the latent cache (a new request).
    ///
    /// Errors: [`VulkanError::Vk`] when the submission fails.
    pub(crate) fn reset(&mut self, dp: &DevicePlan) -> Result<(), VulkanError> {
        self.truncate(dp, 0)
    }

    /// Keeps rows `0..rows` of every layer of the latent cache and zeroes the others (a new
    /// request reusing a prefix of the previous one); `rows ≥ capacity` keeps every row.
    ///
    /// Errors: [`VulkanError::Vk`] when the submission fails.
    pub(crate) fn truncate(&mut self, dp: &DevicePlan, rows: usize) -> Result<(), VulkanError> {
        let offset = (rows.min(self.capacity) * self.width * 4) as u64;
        dp.ctx.run(|r| {
            for c in &self.cache {
                r.fill_from(c, offset, 0)?;
            }
            Ok(())
        })
    }

    /// Starts (`true`, the times zeroed) or stops timing every launch on the GPU.
    ///
    /// Errors: [`VulkanError::Unsupported`] when the device has no timestamps.
    pub(crate) fn set_profile(&mut self, dp: &DevicePlan, on: bool) -> Result<(), VulkanError> {
        self.profile = if on {
            Some(dp.ctx.timestamps(self.n_launches as u32 + 1)?)
        } else {
            None
        };
        self.generation += 1;
        self.kernel_times = dp
            .steps
            .iter()
            .enumerate()
            .flat_map(|(step, ls)| {
                ls.iter().map(move |l| KernelTime {
                    step,
                    kernel: dp.pipelines[l.pipeline].0.clone(),
                    weights: l.weights.clone(),
                    ..KernelTime::default()
                })
            })
            .collect();
        Ok(())
    }

    /// GPU time per launch of the plan (step and kernel) since profiling started, in plan order.
    pub(crate) fn kernel_times(&self) -> &[KernelTime] {
        &self.kernel_times
    }

    /// `(runs, recordings)`: runs submitted, and command buffers recorded for them.
    pub(crate) fn submissions(&self) -> (u64, u64) {
        (self.runs, self.recordings)
    }

    /// Row `pos` of cache layer `layer` (`width` f32), read back (for tests and traces).
    ///
    /// Errors: [`VulkanError::Invalid`] outside the cache; those of the download.
    pub(crate) fn cache_row(
        &self,
        dp: &DevicePlan,
        layer: usize,
        pos: usize,
    ) -> Result<Vec<f32>, VulkanError> {
        let buf = self
            .cache
            .get(layer)
            .ok_or_else(|| VulkanError::Invalid(format!("no cache layer {layer}")))?;
        let mut bytes = vec![0u8; self.width * 4];
        dp.ctx
            .download(buf, (pos * self.width * 4) as u64, &mut bytes)?;
        Ok(f32s(&bytes))
    }

    /// Runs every step of `plan` for `T = t` tokens over `S = s` keys: `inputs` (each plan input
    /// by name, `t` i32) copied in, `outputs` read back as raw 4-byte elements. When
    /// `last_only` names the output head's value, the steps only it needs ([`Plan::last_rows`]:
    /// the last layer's FFN, the final norm, the head) run for the last token alone and that
    /// value's read-back is its one row. The host writes the inputs, the extents and every
    /// launch's workgroup counts, then submits the command buffer of the last run when it was
    /// recorded for the same tokens, head and outputs over the same buffers (a decode step after
    /// the first), else records it anew. With `stage` (the host store of [`HostMode::Stage`])
    /// the run is one command buffer per segment, split before every `moe_ffn`; before the
    /// segment that starts at such a step, its expert ids (`T·k` i32, row-major) are read back
    /// and given to `stage(step, ids)`, which makes every expert they name readable and points
    /// its table entries at it ([`DevicePlan::set_table_entries`]).
    ///
    /// Errors: [`VulkanError::Invalid`] for a missing input, `t = 0`, `t > s`, `s` past the
    /// cache, sizes that overflow, a grid past the device's limits or a value that is not in a
    /// slot; [`VulkanError::Vk`] from the driver.
    #[allow(clippy::too_many_arguments)] // the run's operands, extents and outputs
    pub(crate) fn run(
        &mut self,
        dp: &DevicePlan,
        plan: &Plan,
        inputs: &[(&str, &[i32])],
        t: usize,
        s: usize,
        last_only: Option<ValueId>,
        outputs: &[ValueId],
        promotions: &[Promotion<'_>],
        mut stage: Option<&mut StageFn<'_>>,
    ) -> Result<Vec<Vec<u8>>, VulkanError> {
        let bad = |m: String| VulkanError::Invalid(m);
        if t == 0 || t > s || s > self.capacity {
            return Err(bad(format!(
                "T = {t}, S = {s}: need 1 ≤ T ≤ S ≤ the cache's {} rows",
                self.capacity
            )));
        }
        let last = plan.runs_last_rows(last_only).map_err(|v| {
            bad(format!(
                "value {v} cannot be computed for the last row only: it is not the output head's"
            ))
        })?;
        self.size_slots(dp, plan, t, s, last)?;
        self.size_scratch(dp, t, s)?;
        // Staging: inputs first, then outputs.
        let mut input_bytes = Vec::new();
        let mut input_at = Vec::new();
        for (name, id) in &plan.inputs {
            let (_, data) = inputs
                .iter()
                .find(|(n, _)| n == name)
                .ok_or_else(|| bad(format!("plan input `{name}` missing")))?;
            if data.len() != t {
                return Err(bad(format!(
                    "plan input `{name}`: {} values for T = {t}",
                    data.len()
                )));
            }
            input_at.push((*id, input_bytes.len(), data.len() * 4));
            input_bytes.extend(data.iter().flat_map(|v| v.to_le_bytes()));
        }
        let mut reads = Vec::new();
        for &v in outputs {
            let value = plan
                .values
                .get(v)
                .ok_or_else(|| bad(format!("no value {v}")))?;
            let mut n =
                elements(&value.shape.0, t, s).ok_or_else(|| bad("size overflow".into()))?;
            if last && dp.rows.rows(v, t) == 1 {
                n /= t;
            }
            reads.push(Readback {
                value: v,
                bytes: n * 4,
            });
        }
        let out_total: usize = reads.iter().map(|r| r.bytes).sum();
        let staging_bytes = (input_bytes.len() + out_total).max(4) as u64;
        if self
            .staging
            .as_ref()
            .is_none_or(|b| b.size() < staging_bytes)
        {
            self.staging = Some(dp.ctx.buffer(staging_bytes, Location::Host)?);
            self.generation += 1;
        }
        let extent = |x: usize| i32::try_from(x).map_err(|_| bad(format!("{x} exceeds i32")));
        let mut args = Vec::with_capacity(EXTENTS_BYTES + INDIRECT_BYTES * self.n_launches);
        for x in [t, s, 1, s] {
            args.extend(extent(x)?.to_le_bytes());
        }
        // Per launch, whether it has work (a grid of no workgroups dispatches nothing).
        let mut live = Vec::with_capacity(self.n_launches);
        for (i, ls) in dp.steps.iter().enumerate() {
            for l in ls {
                let groups = groups(dp, plan, i, l, t, s, last && dp.rows.step(i))?;
                live.push(!groups.contains(&0));
                args.extend(groups.iter().flat_map(|g| g.to_le_bytes()));
            }
        }
        dp.ctx.upload(&self.args, 0, &args)?;
        let staging = self.staging.as_ref().expect("made above");
        dp.ctx.upload(staging, 0, &input_bytes)?;
        let key = RecordKey {
            t,
            last,
            reads: reads.iter().map(|r| (r.value, r.bytes)).collect(),
            generation: self.generation,
        };
        let reading = Reading {
            t,
            last,
            input_at: &input_at,
            reads: &reads,
            inputs_len: input_bytes.len(),
        };
        let mut starts = vec![0];
        if stage.is_some() {
            starts.extend(dp.moe_ids.iter().map(|&(step, _)| step));
        }
        let segments: Vec<_> = starts
            .iter()
            .zip(starts.iter().skip(1).chain([&dp.steps.len()]))
            .map(|(&a, &b)| a..b)
            .collect();
        let fresh;
        let recs = if promotions.is_empty() {
            if self.recorded.as_ref().is_none_or(|(k, _)| *k != key) {
                self.recorded = None;
                let recs = segments
                    .iter()
                    .map(|r| self.record(dp, plan, &reading, &[], r.clone()))
                    .collect::<Result<Vec<_>, _>>()?;
                self.recorded = Some((key, recs));
                self.recordings += segments.len() as u64;
            }
            &self.recorded.as_ref().expect("recorded above").1
        } else {
            // A step with promotions records its copies once, and keeps the recording of its
            // shape without them for the steps after it.
            fresh = segments
                .iter()
                .map(|r| self.record(dp, plan, &reading, promotions, r.clone()))
                .collect::<Result<Vec<_>, _>>()?;
            self.recordings += segments.len() as u64;
            &fresh
        };
        for (rec, range) in recs.iter().zip(&segments) {
            if let Some(stage) = stage.as_mut().filter(|_| range.start > 0) {
                let &(step, ids) = dp
                    .moe_ids
                    .iter()
                    .find(|(step, _)| *step == range.start)
                    .ok_or_else(|| bad(format!("no moe_ffn at step {}", range.start)))?;
                let n = elements(&plan.values[ids].shape.0, t, s)
                    .ok_or_else(|| bad("size overflow".into()))?;
                let mut bytes = vec![0u8; 4 * n];
                dp.ctx
                    .download(self.value_buffer(plan, ids)?, 0, &mut bytes)?;
                stage(step, &i32s(&bytes))?;
            }
            dp.ctx.replay(rec)?;
        }
        self.runs += 1;
        if let Some(ts) = &self.profile {
            let times = dp.ctx.read_timestamps(ts, self.n_launches as u32 + 1)?;
            for ((kt, &live), w) in self
                .kernel_times
                .iter_mut()
                .zip(&live)
                .zip(times.windows(2))
            {
                if !live {
                    continue;
                }
                let spent = w[1] - w[0];
                if t > 1 {
                    kt.prefill_s += spent;
                } else {
                    kt.decode_s += spent;
                }
                kt.launches += 1;
            }
        }
        let staging = self.staging.as_ref().expect("made above");
        let mut at = input_bytes.len() as u64;
        let mut out = Vec::with_capacity(reads.len());
        for rb in &reads {
            let mut bytes = vec![0u8; rb.bytes];
            dp.ctx.download(staging, at, &mut bytes)?;
            at += rb.bytes as u64;
            out.push(bytes);
        }
        Ok(out)
    }

    /// Records the segment `steps` of a run of `t` tokens: when it starts the run, the tables'
    /// and the inputs' copies; every launch of its steps in plan order (workgroup counts and
    /// extents read from [`DeviceRun::args`] when it runs) with the promotions before their
    /// step; when it ends the run, the outputs' copies into the staging buffer after the
    /// inputs' bytes.
    fn record(
        &self,
        dp: &DevicePlan,
        plan: &Plan,
        reading: &Reading<'_>,
        promotions: &[Promotion<'_>],
        steps: std::ops::Range<usize>,
    ) -> Result<Recording, VulkanError> {
        let &Reading {
            t,
            last: last_rows,
            input_at,
            reads,
            inputs_len,
        } = reading;
        let staging = self.staging.as_ref().expect("made before recording");
        let (first, last) = (steps.start == 0, steps.end == dp.steps.len());
        dp.ctx.record(|r| {
            if first {
                let tables = &dp.tables;
                r.copy(&tables.host, 0, &tables.device, 0, tables.host.size())?;
                for &(id, at, len) in input_at {
                    r.copy(
                        staging,
                        at as u64,
                        self.value_buffer(plan, id)?,
                        0,
                        len as u64,
                    )?;
                }
                if let Some(ts) = &self.profile {
                    r.reset_timestamps(ts);
                    r.timestamp(ts, 0)?;
                }
            }
            let mut launch: usize = dp.steps[..steps.start].iter().map(Vec::len).sum();
            for (i, ls) in dp
                .steps
                .iter()
                .enumerate()
                .take(steps.end)
                .skip(steps.start)
            {
                for p in promotions.iter().filter(|p| p.step == i) {
                    r.copy(p.src, p.src_offset, p.dst, p.dst_offset, p.bytes)?;
                }
                for l in ls {
                    let push = self.push_constants(dp, plan, i, l, t, last_rows)?;
                    let counts = EXTENTS_BYTES + INDIRECT_BYTES * launch;
                    r.dispatch_indirect(
                        &dp.pipelines[l.pipeline].1,
                        &self.args,
                        counts as u64,
                        &push,
                    )?;
                    launch += 1;
                    if let Some(ts) = &self.profile {
                        r.timestamp(ts, launch as u32)?;
                    }
                }
            }
            let mut at = inputs_len as u64;
            for rb in reads.iter().filter(|_| last) {
                r.copy(
                    self.value_buffer(plan, rb.value)?,
                    0,
                    staging,
                    at,
                    rb.bytes as u64,
                )?;
                at += rb.bytes as u64;
            }
            Ok(())
        })
    }

    /// Grows every slot buffer to the largest value placed in it at `(t, s)` (the values of
    /// [`Plan::last_rows`] one row when `last`), to at least twice its size, so that a cache
    /// window growing by a token at a time makes few buffers anew.
    fn size_slots(
        &mut self,
        dp: &DevicePlan,
        plan: &Plan,
        t: usize,
        s: usize,
        last: bool,
    ) -> Result<(), VulkanError> {
        let mut need = vec![0usize; plan.n_slots];
        for (id, v) in plan.values.iter().enumerate() {
            if let Storage::Slot(n) = v.storage {
                let rows = if last { dp.rows.rows(id, t) } else { t };
                let e = elements(&v.shape.0, rows, s)
                    .ok_or_else(|| VulkanError::Invalid(format!("`{}`: size overflow", v.name)))?;
                let slot = need
                    .get_mut(n)
                    .ok_or_else(|| VulkanError::Invalid(format!("`{}`: slot {n}", v.name)))?;
                *slot = (*slot).max(e * 4);
            }
        }
        for (slot, bytes) in self.slots.iter_mut().zip(need) {
            if bytes > 0 && slot.as_ref().is_none_or(|b| b.size() < bytes as u64) {
                let size = slot.as_ref().map_or(0, |b| 2 * b.size()).max(bytes as u64);
                *slot = Some(dp.ctx.buffer(size, Location::Device)?);
                self.generation += 1;
            }
        }
        Ok(())
    }

    /// Grows each named scratch to what its launches need at `(t, s)`, to at least twice its
    /// size.
    fn size_scratch(&mut self, dp: &DevicePlan, t: usize, s: usize) -> Result<(), VulkanError> {
        let mut need: HashMap<&str, usize> = HashMap::new();
        for l in dp.steps.iter().flatten() {
            for a in &l.args {
                if let Arg::Scratch { name, len } = a {
                    let e = len.eval(t, s).ok_or_else(|| {
                        VulkanError::Invalid(format!("scratch `{name}` overflows"))
                    })?;
                    let n = need.entry(name).or_default();
                    *n = (*n).max(e * 4);
                }
            }
        }
        for (name, bytes) in need {
            let old = self.scratch.get(name).map(Buffer::size);
            if old.is_none_or(|size| size < bytes as u64) {
                let size = old.map_or(0, |b| 2 * b).max(bytes.max(4) as u64);
                let b = dp.ctx.buffer(size, Location::Device)?;
                self.scratch.insert(name.to_string(), b);
                self.generation += 1;
            }
        }
        Ok(())
    }

    /// The buffer of value `id`: its slot's, or its cache layer's.
    fn value_buffer(&self, plan: &Plan, id: ValueId) -> Result<&Buffer, VulkanError> {
        let v = plan
            .values
            .get(id)
            .ok_or_else(|| VulkanError::Invalid(format!("no value {id}")))?;
        match v.storage {
            Storage::Slot(n) => self.slots.get(n).and_then(Option::as_ref),
            Storage::KvCache { layer } => self.cache.get(layer),
        }
        .ok_or_else(|| VulkanError::Invalid(format!("value `{}` has no buffer", v.name)))
    }

    /// The push constants of launch `l` of step `i`: its buffers' addresses, then that of its
    /// extents. With `last`, a step of [`Plan::last_rows`] runs for the last of `t` tokens
    /// alone: the address of each whole token-indexed input advanced to its last row
    /// ([`LastRows::operand_row`]), the extents `[1, S]`.
    fn push_constants(
        &self,
        dp: &DevicePlan,
        plan: &Plan,
        i: usize,
        l: &DeviceLaunch,
        t: usize,
        last: bool,
    ) -> Result<Vec<u8>, VulkanError> {
        let last_row = last && dp.rows.step(i);
        let step = &plan.steps[i];
        let bad = |m: String| VulkanError::Invalid(format!("step {i} ({}): {m}", step.op.name()));
        let mut push = Vec::with_capacity(8 * l.args.len() + 8);
        for ((name, kind), arg) in l.kernel.params.iter().zip(&l.args) {
            let address = match arg {
                Arg::Operand(o) => match step.args.get(*o) {
                    Some(Operand::Value(v)) => {
                        let base = self.value_buffer(plan, *v)?.address();
                        if last_row {
                            base + 4 * dp.rows.operand_row(plan, i, *v, t) as u64
                        } else {
                            base
                        }
                    }
                    Some(Operand::Weight(w)) => match (kind, dp.weights.get(*w)) {
                        (ParamKind::Experts { .. }, Some(DeviceWeight::Experts)) => {
                            let at = dp.tables.at[*w].ok_or_else(|| {
                                bad(format!("`{name}`: weight {w} has no expert table"))
                            })?;
                            dp.tables.device.address() + at
                        }
                        (ParamKind::Experts { .. }, Some(DeviceWeight::Dense(_))) => {
                            return Err(bad(format!("`{name}`: weight {w} has no expert table")))
                        }
                        (_, Some(DeviceWeight::Dense(b))) => b.address(),
                        (_, Some(DeviceWeight::Experts)) => {
                            return Err(bad(format!("`{name}`: weight {w} is split by experts")))
                        }
                        (_, None) => return Err(bad(format!("`{name}`: no weight {w}"))),
                    },
                    None => return Err(bad(format!("`{name}`: no operand {o}"))),
                },
                Arg::Output => self.value_buffer(plan, step.out)?.address(),
                Arg::Cache(layer) => self
                    .cache
                    .get(*layer)
                    .ok_or_else(|| bad(format!("no cache layer {layer}")))?
                    .address(),
                Arg::Scratch { name, .. } => self
                    .scratch
                    .get(name)
                    .ok_or_else(|| bad(format!("no scratch `{name}`")))?
                    .address(),
            };
            push.extend(address.to_le_bytes());
        }
        let extents = self.args.address() + if last_row { 8 } else { 0 };
        push.extend(extents.to_le_bytes());
        Ok(push)
    }
}

/// The workgroup counts of launch `l` of step `i` at `T = t` (1 for a step of
/// [`Plan::last_rows`] run for the last position, `last_row`), `S = s`.
///
/// Errors: [`VulkanError::Invalid`] when the grid overflows or exceeds the device's
/// `maxComputeWorkGroupCount`.
#[allow(clippy::too_many_arguments)] // the launch and its extents
fn groups(
    dp: &DevicePlan,
    plan: &Plan,
    i: usize,
    l: &DeviceLaunch,
    t: usize,
    s: usize,
    last_row: bool,
) -> Result<[u32; 3], VulkanError> {
    let bad =
        |m: String| VulkanError::Invalid(format!("step {i} ({}): {m}", plan.steps[i].op.name()));
    let run_t = if last_row { 1 } else { t };
    let max = dp.ctx.info().limits.max_compute_work_group_count;
    let mut groups = [1u32; 3];
    for ((g, size), m) in groups.iter_mut().zip(&l.kernel.grid).zip(max) {
        let n = size
            .eval(run_t, s)
            .ok_or_else(|| bad("grid overflows".into()))?;
        *g = u32::try_from(n).ok().filter(|&n| n <= m).ok_or_else(|| {
            bad(format!(
                "{n} workgroups exceed maxComputeWorkGroupCount {m}"
            ))
        })?;
    }
    Ok(groups)
}

/// Little-endian f32s of `bytes`.
pub(crate) fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Little-endian i32s of `bytes`.
pub(crate) fn i32s(bytes: &[u8]) -> Vec<i32> {
    bytes
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use aubier_kernels_gen::gpu::ir::{ci, tid, Kb, Scalar, Size};

    /// A kernel of `block` invocations with `shared` f32 of shared memory.
    fn kernel(block: u32, shared: usize) -> Kernel {
        let mut kb = Kb::new(
            "probe",
            "a probe",
            [Size::Const(1), Size::Const(1)],
            block,
            8,
        );
        let y = kb.output_f32("y", Some(Size::Const(block as usize)));
        let s = kb.shared("s", Scalar::F32, shared);
        kb.sts(s, tid(), 1.0f32);
        let v = kb.lds(s, ci(0));
        kb.store(y, tid(), v);
        kb.finish().expect("probe kernel")
    }

    #[test]
    fn vulkan_kernels_over_the_devices_workgroup_or_shared_memory_are_named() {
        let l = Limits {
            max_storage_buffer_range: 1 << 27,
            max_compute_shared_memory_size: 1 << 15,
            max_compute_work_group_invocations: 256,
            max_compute_work_group_size: [1024, 1024, 64],
            max_compute_work_group_count: [65535; 3],
            max_push_constants_size: 128,
            max_memory_allocation_size: None,
            max_buffer_size: None,
            min_imported_host_pointer_alignment: None,
        };
        assert_eq!(fits(&l, &kernel(256, 8192)), Ok(()));
        let e = fits(&l, &kernel(512, 8)).unwrap_err();
        assert!(
            e.contains("workgroups of 512 invocations, more than the device's 256"),
            "{e}"
        );
        let e = fits(&l, &kernel(256, 8193)).unwrap_err();
        assert!(
            e.contains("32772 bytes of shared memory, more than the device's 32768"),
            "{e}"
        );
    }
}
