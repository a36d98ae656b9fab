//! The `vulkan` backend's loaded model ([`VulkanModel`]), its runs ([`VulkanRun`]) and the fast
//! store's slots in device memory ([`VulkanSlots`]).
//!
//! Algorithm. Loading makes the bound plan ready on the device ([`DevicePlan`]: the binding's
//! kernels as pipelines, the dense weights in device buffers, the stacked experts in the host
//! store, read in place) and allocates `n_res` slots per MoE layer in device-local buffers of
//! whole slots, each slot one expert's slice of every stacked tensor of its layer, in order, each
//! at an offset a multiple of [`SLOT_ALIGN`] bytes and the slot padded to one ([`slot_layout`]:
//! the kernels load quant blocks as 16/32-bit words, so a weight row must start 4-byte aligned);
//! the budget counts the padded slots. `n_res` comes from the budget, by default what the device heap has left ([`Room`]). Before
//! each step the run writes the expert tables: the slot of every expert the store holds
//! resident, the host store's address of every other one; the step's command buffer copies them
//! to the device before its first launch. Filling a slot (a promotion) is a copy from the host
//! store recorded into the next step's command buffer just before the layer's `moe_ffn`, the
//! first launch that reads the slot.
//!
//! Where no expert is readable in place ([`HostMode::Stage`]), the slots come with a stage
//! area: `n_expert − n_res` slots of the largest layer (the most one layer can miss) in device
//! memory, and a host-visible staging buffer. The run stops before each `moe_ffn`, reads the
//! layer's routed ids back, uploads every routed expert the store does not hold (from the file,
//! through the staging buffer, into the stage area) and points its table entries there; a
//! promotion is such an upload into its slot, before the step. The experts and bytes staged are
//! the run's counters.

use super::context::{Buffer, Location, VulkanContext};
use super::error::VulkanError;
use super::exec::{f32s, i32s, DevicePlan, DeviceRun, Promotion};
use super::host_store::HostMode;
use crate::backend::{
    BackendError, Experts, LoadInput, Loaded, LoadedModel, MemoryUse, Obtained, Output, Run,
    RunCounters, StepInput,
};
use crate::progress::Progress;
use crate::store::{FastBudget, SlotMemory, StoreError};
use aubier_compiler::plan::{MoeLayer, Plan};
use aubier_compiler::types::DType;
use aubier_kernels_gen::gpu::launch::Launch;
use std::any::Any;
use std::sync::{Arc, Mutex, PoisonError};

/// What the `vulkan` backend's binding gives its load: the launches of every step at `width`.
#[derive(Clone, Debug)]
pub(super) struct VulkanBinding {
    /// The subgroup width the kernels were built for.
    pub width: u32,
    /// Per plan step, its launches.
    pub launches: Vec<Vec<Launch>>,
}

/// `Err(BackendError::Device)` for a device error.
fn device_error(e: VulkanError) -> BackendError {
    BackendError::Device {
        backend: "vulkan".into(),
        message: e.to_string(),
    }
}

/// Loads the plan of `input`, bound as `binding`, on the device of `ctx`, its host store reached
/// as `host_mode`; no buffer over `max_buffer_bytes` (the device's largest when `None`).
///
/// Errors: those of [`DevicePlan::new`]; [`VulkanError::Invalid`] for the plan's MoE layers or
/// the budget; those of the slots' buffers.
pub(super) fn load(
    ctx: VulkanContext,
    input: &LoadInput<'_>,
    binding: &VulkanBinding,
    max_buffer_bytes: Option<u64>,
    host_mode: HostMode,
    progress: &mut dyn Progress,
) -> Result<Loaded, VulkanError> {
    let plan = input.plan;
    let max = max_buffer_bytes.unwrap_or(ctx.info().limits.max_buffer_bytes());
    let dp = Arc::new(DevicePlan::new(
        ctx,
        plan,
        &binding.launches,
        input.weights,
        max,
        host_mode,
        progress,
    )?);
    let moe = plan
        .moe_layers()
        .map_err(|e| VulkanError::Invalid(e.to_string()))?;
    let n_expert = moe.first().map_or(0, |l| l.n_expert);
    let per_slot: u64 = moe.iter().map(|l| slot_layout(l).1 as u64).sum();
    let staged = dp.host().mode() == HostMode::Stage;
    let stage = staged.then(|| Stage::of(&moe, max));
    let room = Room::of(&dp, plan, stage);
    let n_res = input
        .budget
        .slots(per_slot, n_expert, || room.slots(per_slot, n_expert))
        .map_err(|e| VulkanError::Invalid(e.to_string()))?;
    if input.budget == FastBudget::Auto {
        room.check(n_expert)
            .map_err(|what| VulkanError::Unsupported {
                device: dp.context().info().index,
                name: dp.context().info().name.clone(),
                what,
            })?;
    }
    let choice = room.say(input.budget, n_res, n_expert, per_slot);
    tracing::info!("{choice}");
    let slots = VulkanSlots::new(&dp, &moe, n_res, max, stage)?;
    let mut table_of = vec![None; plan.weights.len()];
    for (li, l) in moe.iter().enumerate() {
        for (tj, t) in l.tensors.iter().enumerate() {
            table_of[t.weight] = Some((li, tj));
        }
    }
    let model = VulkanModel {
        dp,
        plan: Arc::clone(plan),
        n_expert,
        table_of,
        choice,
        stage_bytes: stage.map(|st| st.bytes(n_res, n_expert)),
    };
    Ok(Loaded {
        model: Arc::new(model),
        slots: Box::new(slots),
    })
}

/// The sizes of a staged host store's buffers ([`HostMode::Stage`]).
#[derive(Clone, Copy, Debug)]
struct Stage {
    /// Bytes of one stage slot: the largest layer's slot ([`slot_layout`]).
    slot_bytes: u64,
    /// Bytes of the host-visible staging buffer: 64 MiB, at least one expert's largest tensor,
    /// at most the largest buffer.
    staging_bytes: u64,
}

impl Stage {
    fn of(moe: &[MoeLayer], max_bytes: u64) -> Stage {
        let slot_bytes = moe.iter().map(|l| slot_layout(l).1).max().unwrap_or(0) as u64;
        let tensor = moe
            .iter()
            .flat_map(|l| &l.tensors)
            .map(|t| t.expert_bytes)
            .max()
            .unwrap_or(0) as u64;
        Stage {
            slot_bytes,
            staging_bytes: (64u64 << 20).min(max_bytes).max(tensor).max(4),
        }
    }

    /// Bytes of the stage area and the staging buffer with `n_res` of `n_expert` resident.
    fn bytes(&self, n_res: usize, n_expert: usize) -> u64 {
        self.slot_bytes * n_expert.saturating_sub(n_res) as u64 + self.staging_bytes
    }
}

/// Device bytes of a session of `kv` tokens: its latent cache and the activation buffers of a
/// pass of up to 512 tokens over it.
fn session_bytes(dp: &DevicePlan, plan: &Plan, kv: usize) -> u64 {
    let cfg = &plan.config;
    (cfg.n_layer as u64)
        .saturating_mul(kv as u64)
        .saturating_mul(cfg.kv_cache_width() as u64 * 4)
        .saturating_add(dp.run_bytes(plan, kv.min(512), kv))
}

/// The device memory left for the fast store at load ([`FastBudget::Auto`]): the largest
/// device-local heap, less what the backend has allocated (dense weights, expert tables), less
/// a session's latent cache and activation buffers at the default context (`min(context, 4096)`
/// tokens, a 512-token prompt pass), less a margin of 1/16 of the heap for what is not counted
/// (pipelines, the driver's own), less — for a staged host store — the stage area and the
/// staging buffer.
#[derive(Clone, Copy, Debug)]
struct Room {
    heap: u64,
    allocated: u64,
    session: u64,
    margin: u64,
    stage: Option<Stage>,
}

impl Room {
    fn of(dp: &DevicePlan, plan: &Plan, stage: Option<Stage>) -> Room {
        let heap = dp.context().info().device_heap().unwrap_or(0);
        Room {
            heap,
            allocated: dp.context().memory_records().0,
            session: session_bytes(dp, plan, plan.config.n_ctx_train.min(4096)),
            margin: heap / 16,
            stage,
        }
    }

    /// Bytes left.
    fn free(&self) -> u64 {
        self.heap
            .saturating_sub(self.allocated)
            .saturating_sub(self.session)
            .saturating_sub(self.margin)
    }

    /// Slots per layer (of `n_expert`) that fit when one slot in every layer takes `per_slot`
    /// bytes; with a staged host store, each slot also spares one of the stage area's.
    fn slots(&self, per_slot: u64, n_expert: usize) -> usize {
        let Some(stage) = self.stage else {
            return match per_slot {
                0 => usize::MAX,
                _ => usize::try_from(self.free() / per_slot).unwrap_or(usize::MAX),
            };
        };
        let Some(left) = self.free().checked_sub(stage.bytes(0, n_expert)) else {
            return 0;
        };
        match per_slot.saturating_sub(stage.slot_bytes) {
            0 => n_expert,
            net => usize::try_from(left / net).unwrap_or(usize::MAX),
        }
    }

    /// `Err` (why) when a staged host store's stage area and staging buffer do not fit even
    /// with no slot.
    fn check(&self, n_expert: usize) -> Result<(), String> {
        let mib = |b: u64| b as f64 / (1 << 20) as f64;
        match self.stage {
            Some(stage) if stage.bytes(0, n_expert) > self.free() => Err(format!(
                "the experts cannot be read from host memory in place, and staging them needs \
                 {:.0} MiB of device memory for one layer's experts and a staging buffer; \
                 {:.0} MiB are left",
                mib(stage.bytes(0, n_expert)),
                mib(self.free())
            )),
            _ => Ok(()),
        }
    }

    /// What the backend chose and why, one sentence.
    fn say(&self, budget: FastBudget, n_res: usize, n_expert: usize, per_slot: u64) -> String {
        let mib = |b: u64| b as f64 / (1 << 20) as f64;
        let why = match budget {
            FastBudget::Auto => format!(
                "the device heap's {:.0} MiB less {:.0} MiB allocated (dense weights, expert \
                 tables), {:.0} MiB for a session (latent cache, activations) and a {:.0} MiB \
                 margin leave {:.0} MiB",
                mib(self.heap),
                mib(self.allocated),
                mib(self.session),
                mib(self.margin),
                mib(self.free())
            ),
            FastBudget::Slots(n) => format!("--n-res {n}"),
            FastBudget::Bytes(b) => format!("--fast-budget {b}"),
        };
        let staged = self.stage.map_or(String::new(), |stage| {
            format!(
                "; the host store is staged (no expert is read in place): the {} missed experts \
                 a layer can route go through a {:.0} MiB stage area and a {:.0} MiB staging \
                 buffer",
                n_expert.saturating_sub(n_res),
                mib(stage.slot_bytes * n_expert.saturating_sub(n_res) as u64),
                mib(stage.staging_bytes)
            )
        });
        format!(
            "vulkan fast store: {n_res} of {n_expert} experts per layer in device memory \
             ({:.0} MiB): {why}{staged}",
            mib(per_slot * n_res as u64)
        )
    }
}

/// A plan loaded on a Vulkan device.
#[derive(Debug)]
pub(super) struct VulkanModel {
    dp: Arc<DevicePlan>,
    plan: Arc<Plan>,
    n_expert: usize,
    /// Per plan weight, `(MoE layer, tensor)` of a stacked expert tensor.
    table_of: Vec<Option<(usize, usize)>>,
    /// What the fast store's size is and why.
    choice: String,
    /// With a staged host store: bytes of the stage area and the staging buffer.
    stage_bytes: Option<u64>,
}

impl LoadedModel for VulkanModel {
    /// Errors: [`BackendError::Device`] when a session of `kv_max` tokens (its latent cache
    /// and the activations of a pass of up to 512 tokens) does not fit in what the device heap
    /// has left, naming both; those of the device's buffers.
    fn open(self: Arc<Self>, kv_max: usize) -> Result<Box<dyn Run>, BackendError> {
        let cfg = &self.plan.config;
        let need = session_bytes(&self.dp, &self.plan, kv_max);
        let left = self.dp.context().heap_left(Location::Device);
        if need > left {
            let mib = |b: u64| b as f64 / (1 << 20) as f64;
            return Err(device_error(VulkanError::Invalid(format!(
                "a session of {kv_max} tokens needs {:.1} MiB of device memory (its latent \
                 cache, the activations of a 512-token pass) and the device heap has {:.1} MiB \
                 left after the weights, the fast store and the open sessions: ask for a \
                 shorter context (--kv-max) or a smaller fast store (--fast-budget, --n-res)",
                mib(need),
                mib(left)
            ))));
        }
        let run = DeviceRun::new(
            &self.dp,
            &self.plan,
            cfg.n_layer,
            kv_max,
            cfg.kv_cache_width(),
        )
        .map_err(device_error)?;
        Ok(Box::new(VulkanRun {
            model: self,
            run,
            staged: (0, 0),
        }))
    }

    fn device(&self) -> Option<String> {
        Some(self.dp.context().info().name.clone())
    }

    fn fast_store_choice(&self) -> Option<String> {
        Some(self.choice.clone())
    }

    fn memory(&self) -> Vec<MemoryUse> {
        let host = self.dp.host();
        let (allocated, _) = self.dp.context().memory_records();
        let mut out = vec![
            MemoryUse {
                what: "dense weights".into(),
                bytes: self.dp.dense_bytes(),
                obtained: Obtained::Allocated,
            },
            MemoryUse {
                what: "expert tables".into(),
                bytes: self.dp.table_bytes(),
                obtained: Obtained::Allocated,
            },
            MemoryUse {
                what: "all device allocations".into(),
                bytes: allocated,
                obtained: Obtained::Allocated,
            },
            MemoryUse {
                what: format!("host store ({:?})", host.mode()).to_lowercase(),
                bytes: host.imported_bytes(),
                obtained: Obtained::Imported,
            },
        ];
        if host.copied_bytes() > 0 {
            out.push(MemoryUse {
                what: "host copy of the experts".into(),
                bytes: host.copied_bytes(),
                obtained: Obtained::Allocated,
            });
        }
        if let Some(bytes) = self.stage_bytes {
            out.push(MemoryUse {
                what: "stage area and staging buffer".into(),
                bytes,
                obtained: Obtained::Allocated,
            });
        }
        out
    }
}

/// A run on the device: its latent cache and buffers ([`DeviceRun`]).
#[derive(Debug)]
pub(super) struct VulkanRun {
    model: Arc<VulkanModel>,
    run: DeviceRun,
    /// Experts and bytes uploaded into the stage area since the run opened.
    staged: (u64, u64),
}

impl Run for VulkanRun {
    fn step(
        &mut self,
        input: &StepInput<'_>,
        experts: &Experts<'_>,
    ) -> Result<Vec<Output>, BackendError> {
        let m = &*self.model;
        let slots = experts.slots_as::<VulkanSlots>("vulkan")?;
        if experts.store.read_ahead_mode().is_some() {
            return Err(BackendError::Binding {
                backend: "vulkan".into(),
                detail: "the read-ahead (--prefetch-budget) runs on the host backends; the GPU \
                         store reads ahead in a later version"
                    .into(),
            });
        }
        m.dp.write_tables(|w| {
            let Some((li, tj)) = m.table_of.get(w).copied().flatten() else {
                return Vec::new();
            };
            (0..m.n_expert)
                .map(|e| {
                    let slot = experts.store.slot_of(li, e);
                    slot.and_then(|s| slots.address(li, s, tj))
                        .or_else(|| m.dp.host().address(w, e))
                        .unwrap_or(0)
                })
                .collect()
        })
        .map_err(device_error)?;
        if slots.stage.is_some() {
            slots.flush().map_err(device_error)?;
        }
        let staged = &mut self.staged;
        let mut stage = |step: usize, ids: &[i32]| {
            let li = slots
                .layers
                .iter()
                .position(|l| l.step == step)
                .ok_or_else(|| VulkanError::Invalid(format!("step {step} is no MoE layer's")))?;
            let mut held = vec![false; slots.slots];
            for e in 0..m.n_expert {
                if let Some(slot) = experts.store.slot_of(li, e) {
                    if let Some(h) = held.get_mut(slot) {
                        *h = true;
                    }
                }
            }
            let free: Vec<usize> = (0..slots.slots).filter(|&s| !held[s]).collect();
            let mut missed = Vec::with_capacity(ids.len());
            for &e in ids {
                let e = usize::try_from(e)
                    .ok()
                    .filter(|&e| e < m.n_expert)
                    .ok_or_else(|| {
                        VulkanError::Invalid(format!(
                            "MoE layer {li}: routed expert {e} outside the {} experts",
                            m.n_expert
                        ))
                    })?;
                if experts.store.slot_of(li, e).is_none() {
                    missed.push(e);
                }
            }
            missed.sort_unstable();
            missed.dedup();
            let bytes = slots.stage(li, &missed, &free)?;
            staged.0 += missed.len() as u64;
            staged.1 += bytes;
            Ok(())
        };
        let mut pending = slots.pending.lock().unwrap_or_else(PoisonError::into_inner);
        let promotions = slots.promotions(&pending).map_err(device_error)?;
        let out = self
            .run
            .run(
                &m.dp,
                &m.plan,
                input.inputs,
                input.tokens,
                input.keys,
                input.last_only,
                input.outputs,
                &promotions,
                slots.stage.is_some().then_some(&mut stage as _),
            )
            .map_err(device_error)?;
        pending.clear();
        Ok(input
            .outputs
            .iter()
            .zip(out)
            .map(
                |(&id, bytes)| match m.plan.values.get(id).map(|v| v.dtype) {
                    Some(DType::I32) => Output::I32(i32s(&bytes)),
                    _ => Output::F32(f32s(&bytes)),
                },
            )
            .collect())
    }

    fn truncate(&mut self, rows: usize) -> Result<(), BackendError> {
        self.run
            .truncate(&self.model.dp, rows)
            .map_err(device_error)
    }

    fn cache_row(&self, layer: usize, pos: usize) -> Result<Vec<f32>, BackendError> {
        self.run
            .cache_row(&self.model.dp, layer, pos)
            .map_err(device_error)
    }

    fn profile(&mut self, on: bool) -> Result<(), BackendError> {
        self.run
            .set_profile(&self.model.dp, on)
            .map_err(device_error)
    }

    fn counters(&self) -> RunCounters {
        let (steps, recordings) = self.run.submissions();
        RunCounters {
            times: self.run.kernel_times().to_vec(),
            steps,
            recordings,
            staged_experts: self.staged.0,
            staged_bytes: self.staged.1,
        }
    }
}

/// Slots of `slot_bytes` in device buffers of whole slots (`per_part` each).
struct WholeSlots {
    parts: Vec<Buffer>,
    per_part: usize,
    slot_bytes: usize,
    slots: usize,
}

impl WholeSlots {
    /// `slots` slots of `slot_bytes`, no buffer over `max_bytes`.
    ///
    /// Errors: those of the buffers.
    fn new(
        ctx: &VulkanContext,
        slots: usize,
        slot_bytes: usize,
        max_bytes: u64,
    ) -> Result<WholeSlots, VulkanError> {
        let per_part = usize::try_from(max_bytes / slot_bytes.max(1) as u64)
            .unwrap_or(usize::MAX)
            .clamp(1, slots.max(1));
        let mut parts = Vec::new();
        let mut left = slots;
        while left > 0 {
            let n = left.min(per_part);
            parts.push(ctx.buffer((n * slot_bytes).max(4) as u64, Location::Device)?);
            left -= n;
        }
        Ok(WholeSlots {
            parts,
            per_part,
            slot_bytes,
            slots,
        })
    }

    /// The buffer and byte offset of byte `offset` of slot `slot` (`None` past the slots).
    fn at(&self, slot: usize, offset: usize) -> Option<(&Buffer, u64)> {
        if slot >= self.slots {
            return None;
        }
        let part = self.parts.get(slot / self.per_part)?;
        Some((
            part,
            ((slot % self.per_part) * self.slot_bytes + offset) as u64,
        ))
    }
}

/// Alignment in bytes of every tensor inside a slot and of every slot: the generated kernels load
/// quant blocks as 32-bit words (16-bit for the types whose blocks are only 2-byte aligned), so
/// every weight row must start at least 4-byte aligned; 16 also suits 128-bit loads.
const SLOT_ALIGN: usize = 16;

/// The layout of one slot of MoE layer `l`: per stacked tensor, in operand order, its weight, the
/// bytes of one expert's slice and its offset within the slot (a multiple of [`SLOT_ALIGN`]); and
/// the slot's bytes (the tensors and their padding, a multiple of [`SLOT_ALIGN`]).
fn slot_layout(l: &MoeLayer) -> (Vec<(usize, usize, usize)>, usize) {
    let mut tensors = Vec::with_capacity(l.tensors.len());
    let mut offset = 0;
    for t in &l.tensors {
        tensors.push((t.weight, t.expert_bytes, offset));
        offset += t.expert_bytes.next_multiple_of(SLOT_ALIGN);
    }
    (tensors, offset)
}

/// The slots of one MoE layer.
struct SlotLayer {
    memory: WholeSlots,
    /// The layer's `moe_ffn` step: the first to read its slots.
    step: usize,
    /// Per stacked tensor: its weight, bytes of one expert, offset within a slot
    /// ([`slot_layout`]).
    tensors: Vec<(usize, usize, usize)>,
}

/// A slot to fill with an expert before the next step reads it.
#[derive(Clone, Copy, Debug)]
struct Pending {
    layer: usize,
    slot: usize,
    expert: usize,
}

/// The fast store's slots in device-local memory. Filling a slot is a copy from the host store
/// recorded into the next step's command buffer, just before the layer's `moe_ffn` (or run at
/// once when the slot is read back).
pub(super) struct VulkanSlots {
    dp: Arc<DevicePlan>,
    layers: Vec<SlotLayer>,
    slots: usize,
    pending: Mutex<Vec<Pending>>,
    /// With a staged host store ([`HostMode::Stage`]).
    stage: Option<StageArea>,
}

/// A staged host store's device memory: the stage area, where a step's missed experts are
/// uploaded, and the host-visible buffer they go through.
struct StageArea {
    /// `n_expert − n_res` slots of the largest layer's expert.
    area: WholeSlots,
    /// Host-visible.
    staging: Buffer,
}

/// A copy of file bytes into device memory, through the staging buffer.
struct Upload<'a> {
    src: &'a [u8],
    dst: &'a Buffer,
    dst_offset: u64,
}

impl std::fmt::Debug for VulkanSlots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VulkanSlots")
            .field("layers", &self.layers.len())
            .field("slots", &self.slots)
            .field("bytes", &self.bytes())
            .finish()
    }
}

impl VulkanSlots {
    /// `slots` slots for every layer of `moe`, in device buffers of at most `max_bytes`.
    ///
    /// Errors: [`VulkanError::Unsupported`] when one slot is over `max_bytes`; those of the
    /// buffers.
    fn new(
        dp: &Arc<DevicePlan>,
        moe: &[MoeLayer],
        slots: usize,
        max_bytes: u64,
        stage: Option<Stage>,
    ) -> Result<VulkanSlots, VulkanError> {
        let ctx = dp.context();
        let mut layers = Vec::with_capacity(moe.len());
        for l in moe {
            let (tensors, slot_bytes) = slot_layout(l);
            if slot_bytes as u64 > max_bytes {
                return Err(VulkanError::Unsupported {
                    device: ctx.info().index,
                    name: ctx.info().name.clone(),
                    what: format!(
                        "one expert of layer {} takes {slot_bytes} bytes, over the {max_bytes} \
                         one buffer may hold",
                        l.layer
                    ),
                });
            }
            layers.push(SlotLayer {
                memory: WholeSlots::new(ctx, slots, slot_bytes, max_bytes)?,
                step: l.step,
                tensors,
            });
        }
        let n_expert = moe.first().map_or(0, |l| l.n_expert);
        let stage = match stage {
            Some(st) => Some(StageArea {
                area: WholeSlots::new(
                    ctx,
                    n_expert.saturating_sub(slots),
                    st.slot_bytes as usize,
                    max_bytes,
                )?,
                staging: ctx.buffer(st.staging_bytes, Location::Host)?,
            }),
            None => None,
        };
        Ok(VulkanSlots {
            dp: Arc::clone(dp),
            layers,
            slots,
            pending: Mutex::new(Vec::new()),
            stage,
        })
    }

    /// The buffer and byte offset of tensor `tensor` of slot `slot` of MoE layer `layer`.
    fn place(&self, layer: usize, slot: usize, tensor: usize) -> Option<(&Buffer, u64, usize)> {
        let l = self.layers.get(layer)?;
        let &(_, bytes, offset) = l.tensors.get(tensor)?;
        let (part, at) = l.memory.at(slot, offset)?;
        Some((part, at, bytes))
    }

    /// The device address of tensor `tensor` of slot `slot` of MoE layer `layer`.
    fn address(&self, layer: usize, slot: usize, tensor: usize) -> Option<u64> {
        let (buf, at, _) = self.place(layer, slot, tensor)?;
        Some(buf.address() + at)
    }

    /// Per tensor of every `pending` fill, what `fill` makes of the layer's `moe_ffn` step, the
    /// tensor's weight, the expert and the slot's place (buffer, offset, bytes).
    ///
    /// Errors: [`VulkanError::Invalid`] for a slot or an expert the store cannot place.
    fn fills<'a, T>(
        &'a self,
        pending: &[Pending],
        mut fill: impl FnMut(usize, usize, usize, (&'a Buffer, u64, usize)) -> Option<T>,
    ) -> Result<Vec<T>, VulkanError> {
        let mut out = Vec::new();
        for p in pending {
            let l = &self.layers[p.layer];
            for (tensor, &(w, _, _)) in l.tensors.iter().enumerate() {
                let place = self.place(p.layer, p.slot, tensor);
                out.push(
                    place
                        .and_then(|at| fill(l.step, w, p.expert, at))
                        .ok_or_else(|| {
                            VulkanError::Invalid(format!(
                                "MoE layer {} slot {} expert {}: no place",
                                p.layer, p.slot, p.expert
                            ))
                        })?,
                );
            }
        }
        Ok(out)
    }

    /// The copies that fill the `pending` slots, from the host store.
    ///
    /// Errors: [`VulkanError::Invalid`] for a slot or an expert the store cannot place.
    fn promotions(&self, pending: &[Pending]) -> Result<Vec<Promotion<'_>>, VulkanError> {
        self.fills(pending, |step, w, e, (dst, dst_offset, bytes)| {
            let (src, src_offset) = self.dp.host().source(w, e)?;
            Some(Promotion {
                step,
                src,
                src_offset,
                dst,
                dst_offset,
                bytes: bytes as u64,
            })
        })
    }

    /// Runs the pending copies now (before a slot is read back, or before a step of a staged
    /// host store): copies from the host store, or uploads from the file when it is staged.
    ///
    /// Errors: [`VulkanError::Invalid`] for a slot or an expert the store cannot place; those
    /// of the submission.
    fn flush(&self) -> Result<(), VulkanError> {
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        match &self.stage {
            Some(stage) => {
                let uploads = self.fills(&pending, |_, w, e, (dst, dst_offset, _)| {
                    Some(Upload {
                        src: self.dp.host().bytes(w, e)?,
                        dst,
                        dst_offset,
                    })
                })?;
                self.upload(stage, &uploads)?;
            }
            None => {
                let promotions = self.promotions(&pending)?;
                self.dp.context().run(|r| {
                    for p in &promotions {
                        r.copy(p.src, p.src_offset, p.dst, p.dst_offset, p.bytes)?;
                    }
                    Ok(())
                })?;
            }
        }
        pending.clear();
        Ok(())
    }

    /// Copies every upload through `stage`'s staging buffer: as many as it holds per
    /// submission.
    ///
    /// Errors: [`VulkanError::Invalid`] for one over the staging buffer; those of the host
    /// copies and the submissions.
    fn upload(&self, stage: &StageArea, uploads: &[Upload<'_>]) -> Result<(), VulkanError> {
        let ctx = self.dp.context();
        let cap = stage.staging.size();
        let mut batch: Vec<(u64, &Upload<'_>)> = Vec::new();
        let mut at = 0u64;
        let submit = |batch: &mut Vec<(u64, &Upload<'_>)>| {
            ctx.run(|r| {
                for &(from, u) in batch.iter() {
                    r.copy(
                        &stage.staging,
                        from,
                        u.dst,
                        u.dst_offset,
                        u.src.len() as u64,
                    )?;
                }
                Ok(())
            })?;
            batch.clear();
            Ok::<_, VulkanError>(())
        };
        for u in uploads {
            let len = u.src.len() as u64;
            if len > cap {
                return Err(VulkanError::Invalid(format!(
                    "an upload of {len} bytes through a staging buffer of {cap}"
                )));
            }
            if at + len > cap {
                submit(&mut batch)?;
                at = 0;
            }
            ctx.upload(&stage.staging, at, u.src)?;
            batch.push((at, u));
            at += len;
        }
        if !batch.is_empty() {
            submit(&mut batch)?;
        }
        Ok(())
    }

    /// Uploads `experts` of MoE layer `layer` (none of them resident) into the stage area, then
    /// into the layer's slots in `free` (those no resident expert holds: a session's store may
    /// use fewer slots than were allocated), and points their table entries there; returns the
    /// bytes uploaded. The stage area's `n_expert − slots` places and the free slots are at
    /// least the experts a layer can miss.
    ///
    /// Errors: [`VulkanError::Invalid`] without a stage area, for more experts than there are
    /// places or one the host store lacks; those of the uploads and the tables.
    fn stage(&self, layer: usize, experts: &[usize], free: &[usize]) -> Result<u64, VulkanError> {
        let bad = |m: String| VulkanError::Invalid(format!("MoE layer {layer}: {m}"));
        let stage = self
            .stage
            .as_ref()
            .ok_or_else(|| bad("no stage area".into()))?;
        let l = self
            .layers
            .get(layer)
            .ok_or_else(|| bad("no such layer".into()))?;
        let staged = stage.area.slots;
        if experts.len() > staged + free.len() {
            return Err(bad(format!(
                "{} experts missed, the stage area and the free slots hold {}",
                experts.len(),
                staged + free.len()
            )));
        }
        let mut uploads = Vec::with_capacity(experts.len() * l.tensors.len());
        let mut entries = Vec::with_capacity(uploads.capacity());
        for (k, &e) in experts.iter().enumerate() {
            for &(w, _, offset) in &l.tensors {
                let (dst, dst_offset) = match k.checked_sub(staged) {
                    None => stage.area.at(k, offset),
                    Some(i) => l.memory.at(free[i], offset),
                }
                .ok_or_else(|| bad(format!("no place for expert {e}")))?;
                let src = self
                    .dp
                    .host()
                    .bytes(w, e)
                    .ok_or_else(|| bad(format!("expert {e} is not in the host store")))?;
                uploads.push(Upload {
                    src,
                    dst,
                    dst_offset,
                });
                entries.push((w, e, dst.address() + dst_offset));
            }
        }
        self.upload(stage, &uploads)?;
        self.dp.set_table_entries(&entries)?;
        Ok(uploads.iter().map(|u| u.src.len() as u64).sum())
    }
}

impl SlotMemory for VulkanSlots {
    fn slots(&self) -> usize {
        self.slots
    }

    fn bytes(&self) -> u64 {
        self.layers
            .iter()
            .flat_map(|l| &l.memory.parts)
            .map(Buffer::size)
            .sum()
    }

    fn slot_bytes(&self) -> u64 {
        self.layers.iter().map(|l| l.memory.slot_bytes as u64).sum()
    }

    fn fill(&mut self, layer: usize, slot: usize, expert: u32) -> Result<(), StoreError> {
        let bad = |reason: String| StoreError::Slot {
            layer,
            slot,
            reason,
        };
        let l = crate::store::slot_layer(&self.layers, self.slots, layer, slot)?;
        for &(w, _, _) in &l.tensors {
            self.dp
                .host()
                .bytes(w, expert as usize)
                .ok_or_else(|| bad(format!("expert {expert} is not in the host store")))?;
        }
        self.pending
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Pending {
                layer,
                slot,
                expert: expert as usize,
            });
        Ok(())
    }

    fn read_back(&self, layer: usize, slot: usize, tensor: usize) -> Result<Vec<u8>, StoreError> {
        let bad = |reason: String| StoreError::Slot {
            layer,
            slot,
            reason,
        };
        self.flush().map_err(|e| bad(e.to_string()))?;
        let (buf, at, bytes) = self
            .place(layer, slot, tensor)
            .ok_or_else(|| bad(format!("no tensor {tensor} in this slot")))?;
        let mut out = vec![0u8; bytes];
        self.dp
            .context()
            .download(buf, at, &mut out)
            .map_err(|e| bad(e.to_string()))?;
        Ok(out)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aubier_compiler::plan::ExpertTensor;

    /// A MoE layer whose stacked tensors take `bytes` per expert each.
    fn layer(bytes: &[usize]) -> MoeLayer {
        MoeLayer {
            step: 0,
            layer: 0,
            n_expert: 8,
            tensors: bytes
                .iter()
                .enumerate()
                .map(|(i, &expert_bytes)| ExpertTensor {
                    arg: i + 1,
                    weight: i,
                    expert_bytes,
                })
                .collect(),
        }
    }

    #[test]
    fn every_tensor_of_every_slot_starts_16_byte_aligned() {
        // Expert bytes that are not multiples of 4: Q3_K (110 B blocks), Q6_K (210 B), Q4_0
        // (18 B) rows of odd counts, and a 1-byte tensor.
        for bytes in [
            vec![110 * 3, 210 * 5, 18 * 7],
            vec![1, 2, 3],
            vec![210, 210],
            vec![16, 33, 64],
        ] {
            let l = layer(&bytes);
            let (tensors, slot_bytes) = slot_layout(&l);
            assert_eq!(
                slot_bytes % SLOT_ALIGN,
                0,
                "{bytes:?}: slot of {slot_bytes}"
            );
            assert!(slot_bytes >= l.expert_bytes());
            assert_eq!(tensors.len(), bytes.len());
            for (j, &(w, n, offset)) in tensors.iter().enumerate() {
                assert_eq!((w, n), (j, bytes[j]));
                for slot in 0..5 {
                    let at = slot * slot_bytes + offset;
                    assert_eq!(
                        at % SLOT_ALIGN,
                        0,
                        "{bytes:?}: slot {slot} tensor {j} at {at}"
                    );
                }
                let end = tensors.get(j + 1).map_or(slot_bytes, |t| t.2);
                assert!(offset + n <= end, "{bytes:?}: tensor {j} overlaps the next");
                assert!(
                    end - (offset + n) < SLOT_ALIGN,
                    "{bytes:?}: more padding than needed"
                );
            }
        }
    }
}
