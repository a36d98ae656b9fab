//! The `vulkan` backend's loaded model ([`VulkanModel`]), its runs ([`VulkanRun`]) and the fast
//! store's slots in device memory ([`VulkanSlots`]).
//!
//! Algorithm. Loading makes the bound plan ready on the device ([`DevicePlan`]: the binding's
//! kernels as pipelines, the weights in device buffers) and allocates `n_res` slots per MoE
//! layer in device-local buffers of whole slots, each slot one expert's slice of every stacked
//! tensor of its layer, back to back. Before each step the run writes the expert tables: the
//! slot of every expert the store holds resident, the host store's copy of every other one; the
//! step's command buffer copies them to the device before its first launch. Filling a slot
//! uploads the expert's bytes from the mapped file.

use super::context::{Buffer, Location, VulkanContext};
use super::exec::{f32s, DevicePlan, DeviceRun};
use super::{VulkanBinding, VulkanError};
use crate::backend::{
    BackendError, Experts, LoadInput, Loaded, LoadedModel, Output, Run, RunCounters, StepInput,
};
use crate::store::{SlotMemory, StoreError};
use crate::weights::Weights;
use aubier_compiler::plan::{MoeLayer, Plan};
use aubier_compiler::types::DType;
use std::any::Any;
use std::sync::Arc;

/// `Err(BackendError::Device)` for a device error.
fn device_error(e: VulkanError) -> BackendError {
    BackendError::Device {
        backend: "vulkan".into(),
        message: e.to_string(),
    }
}

/// Loads the plan of `input`, bound as `binding`, on the device of `ctx`; no buffer over
/// `max_buffer_bytes` (the device's largest when `None`).
///
/// Errors: those of [`DevicePlan::new`]; [`VulkanError::Invalid`] for the plan's MoE layers or
/// the budget; those of the slots' buffers.
pub(super) fn load(
    ctx: VulkanContext,
    input: &LoadInput<'_>,
    binding: &VulkanBinding,
    max_buffer_bytes: Option<u64>,
) -> Result<Loaded, VulkanError> {
    let plan = input.plan;
    let max = max_buffer_bytes.unwrap_or(ctx.info().limits.max_buffer_bytes());
    let views = input.weights.views();
    let dp = Arc::new(DevicePlan::new(ctx, plan, &binding.launches, &views, max)?);
    let moe = plan
        .moe_layers()
        .map_err(|e| VulkanError::Invalid(e.to_string()))?;
    let n_expert = moe.first().map_or(0, |l| l.n_expert);
    let per_slot: u64 = moe.iter().map(|l| l.expert_bytes() as u64).sum();
    // Every expert is in device memory already (the host store of this backend): the slots
    // hold what a budget asks for, none by default.
    let n_res = input
        .budget
        .slots(per_slot, n_expert, || 0)
        .map_err(|e| VulkanError::Invalid(e.to_string()))?;
    let slots = VulkanSlots::new(&dp, Arc::clone(input.weights), &moe, n_res, max)?;
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
    };
    Ok(Loaded {
        model: Arc::new(model),
        slots: Box::new(slots),
    })
}

/// A plan loaded on a Vulkan device.
#[derive(Debug)]
pub(super) struct VulkanModel {
    dp: Arc<DevicePlan>,
    plan: Arc<Plan>,
    n_expert: usize,
    /// Per plan weight, `(MoE layer, tensor)` of a stacked expert tensor.
    table_of: Vec<Option<(usize, usize)>>,
}

impl LoadedModel for VulkanModel {
    fn open(self: Arc<Self>, kv_max: usize) -> Result<Box<dyn Run>, BackendError> {
        let cfg = &self.plan.config;
        let run = DeviceRun::new(
            &self.dp,
            &self.plan,
            cfg.n_layer,
            kv_max,
            cfg.kv_cache_width(),
        )
        .map_err(device_error)?;
        Ok(Box::new(VulkanRun { model: self, run }))
    }

    fn device(&self) -> Option<String> {
        Some(self.dp.context().info().name.clone())
    }
}

/// A run on the device: its latent cache and buffers ([`DeviceRun`]).
#[derive(Debug)]
pub(super) struct VulkanRun {
    model: Arc<VulkanModel>,
    run: DeviceRun,
}

impl Run for VulkanRun {
    fn step(
        &mut self,
        input: &StepInput<'_>,
        experts: &Experts<'_>,
    ) -> Result<Vec<Output>, BackendError> {
        let m = &*self.model;
        let slots = experts
            .slots
            .as_any()
            .downcast_ref::<VulkanSlots>()
            .ok_or_else(|| BackendError::Binding {
                backend: "vulkan".into(),
                detail: "the slot memory of another backend".into(),
            })?;
        m.dp.write_tables(|w| {
            let Some((li, tj)) = m.table_of.get(w).copied().flatten() else {
                return Vec::new();
            };
            (0..m.n_expert)
                .map(|e| {
                    let slot = experts.store.slot_of(li, e);
                    slot.and_then(|s| slots.address(li, s, tj))
                        .or_else(|| m.dp.host_expert(w, e))
                        .unwrap_or(0)
                })
                .collect()
        })
        .map_err(device_error)?;
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
            )
            .map_err(device_error)?;
        Ok(input
            .outputs
            .iter()
            .zip(out)
            .map(
                |(&id, bytes)| match m.plan.values.get(id).map(|v| v.dtype) {
                    Some(DType::I32) => Output::I32(
                        bytes
                            .chunks_exact(4)
                            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                            .collect(),
                    ),
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
        }
    }
}

/// The slots of one MoE layer: buffers of whole slots.
struct SlotLayer {
    parts: Vec<Buffer>,
    /// Slots per part.
    per_part: usize,
    slot_bytes: usize,
    /// Per stacked tensor: its weight, bytes of one expert, offset within a slot.
    tensors: Vec<(usize, usize, usize)>,
}

/// The fast store's slots in device-local memory.
pub(super) struct VulkanSlots {
    dp: Arc<DevicePlan>,
    weights: Arc<Weights>,
    layers: Vec<SlotLayer>,
    slots: usize,
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
        weights: Arc<Weights>,
        moe: &[MoeLayer],
        slots: usize,
        max_bytes: u64,
    ) -> Result<VulkanSlots, VulkanError> {
        let ctx = dp.context();
        let mut layers = Vec::with_capacity(moe.len());
        for l in moe {
            let slot_bytes = l.expert_bytes();
            let mut tensors = Vec::with_capacity(l.tensors.len());
            let mut offset = 0;
            for t in &l.tensors {
                tensors.push((t.weight, t.expert_bytes, offset));
                offset += t.expert_bytes;
            }
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
            layers.push(SlotLayer {
                parts,
                per_part,
                slot_bytes,
                tensors,
            });
        }
        Ok(VulkanSlots {
            dp: Arc::clone(dp),
            weights,
            layers,
            slots,
        })
    }

    /// The buffer and byte offset of tensor `tensor` of slot `slot` of MoE layer `layer`.
    fn place(&self, layer: usize, slot: usize, tensor: usize) -> Option<(&Buffer, u64, usize)> {
        let l = self.layers.get(layer)?;
        let &(_, bytes, offset) = l.tensors.get(tensor)?;
        if slot >= self.slots {
            return None;
        }
        let part = l.parts.get(slot / l.per_part)?;
        let at = (slot % l.per_part) * l.slot_bytes + offset;
        Some((part, at as u64, bytes))
    }

    /// The device address of tensor `tensor` of slot `slot` of MoE layer `layer`.
    fn address(&self, layer: usize, slot: usize, tensor: usize) -> Option<u64> {
        let (buf, at, _) = self.place(layer, slot, tensor)?;
        Some(buf.address() + at)
    }
}

impl SlotMemory for VulkanSlots {
    fn slots(&self) -> usize {
        self.slots
    }

    fn bytes(&self) -> u64 {
        self.layers
            .iter()
            .flat_map(|l| &l.parts)
            .map(Buffer::size)
            .sum()
    }

    fn fill(&mut self, layer: usize, slot: usize, expert: u32) -> Result<(), StoreError> {
        let bad = |reason: String| StoreError::Slot {
            layer,
            slot,
            reason,
        };
        let n = self.layers.get(layer).map_or(0, |l| l.tensors.len());
        if n == 0 {
            return Err(bad("no such MoE layer".into()));
        }
        for tensor in 0..n {
            let (w, _, _) = self.layers[layer].tensors[tensor];
            let (buf, at, bytes) = self
                .place(layer, slot, tensor)
                .ok_or_else(|| bad(format!("past the {} slots", self.slots)))?;
            let src = self
                .weights
                .view(w)
                .and_then(|v| v.get(expert as usize * bytes..))
                .and_then(|v| v.get(..bytes))
                .ok_or_else(|| bad(format!("expert {expert} is outside its tensor")))?;
            self.dp
                .context()
                .upload(buf, at, src)
                .map_err(|e| bad(e.to_string()))?;
        }
        Ok(())
    }

    fn read_back(&self, layer: usize, slot: usize, tensor: usize) -> Result<Vec<u8>, StoreError> {
        let bad = |reason: String| StoreError::Slot {
            layer,
            slot,
            reason,
        };
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
