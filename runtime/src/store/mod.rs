//! The split expert store (ARCHITECTURE.md § runtime, split expert store; the store apart from
//! layout).
//!
//! Contract. Each MoE layer's experts (the plan's [`aubier_compiler::plan::MoeLayer`]s) are split between a **fast
//! store** of slots and a **host store**, the mapped GGUF file read in place. The store
//! ([`expert_store::ExpertStore`]) owns what is a matter of policy: which expert holds which slot
//! (membership, driven by a [`crate::placement::policy::Policy`] per layer), the budget in slots,
//! promotions, the served counts and `--reset exact|none`. The backend that loaded the model owns
//! the memory: [`SlotMemory`] is where a slot's bytes live and in what layout (owned, locked host
//! memory in the cpu backend's interleaved layout; buffers in device memory on a GPU), allocated
//! once per loaded model for its [`FastBudget`]. The store asks the memory to fill a slot with an
//! expert; a backend's run reads, at each step, the slot of every resident expert
//! ([`expert_store::ExpertStore::slot_of`]) and reads every other expert from the host store (the
//! file: in place on the host, imported as host memory on a device).
//!
//! Every expert's bytes are the file's, whichever store serves them, so the logits never depend on
//! the placement.

pub mod copier;
pub mod expert_store;

use crate::placement::hotset::HotSetError;
use crate::placement::policy::PolicyError;
use std::any::Any;

/// The memory behind a loaded model's fast-store slots: `slots()` per MoE layer (the plan's
/// [`aubier_compiler::plan::Plan::moe_layers`], in that order), each able to hold one expert's
/// bytes — its slice of every stacked tensor of the layer — in the layout of the backend that
/// allocated it. Allocated once, when the model is loaded; the expert store fills it.
pub trait SlotMemory: std::fmt::Debug + Send {
    /// Slots per MoE layer.
    fn slots(&self) -> usize;

    /// Bytes allocated for the slots, all layers (what the budget bounds).
    fn bytes(&self) -> u64;

    /// Bytes of one slot in every layer, the backend's padding included: what one more slot per
    /// layer adds to [`SlotMemory::bytes`] (the divisor of a byte budget).
    fn slot_bytes(&self) -> u64;

    /// Writes expert `expert` of MoE layer `layer` into slot `slot` of that layer: the file's
    /// bytes of every tensor of the expert, in the backend's layout.
    ///
    /// Errors: [`StoreError::Slot`] for a layer, slot or expert out of range, or when the copy
    /// fails (its reason).
    fn fill(&mut self, layer: usize, slot: usize, expert: u32) -> Result<(), StoreError>;

    /// Tensor `tensor` (operand order of the layer's
    /// [`aubier_compiler::plan::MoeLayer::tensors`]) of the expert in slot
    /// `slot` of MoE layer `layer`, in the file's layout: for checking that a resident expert's
    /// bytes equal the file's.
    ///
    /// Errors: [`StoreError::Slot`] out of range, or when it cannot be read back.
    fn read_back(&self, layer: usize, slot: usize, tensor: usize) -> Result<Vec<u8>, StoreError>;

    /// Ends the read-ahead's copies into this memory that outlived their step (a backend that
    /// makes them on a worker of its own, [`copier::Copier`]): with `cancel` those not started
    /// are dropped, else made; returns once none is being made. Nothing to do for a memory
    /// whose copies all end within their step (the default).
    fn settle_copies(&self, _cancel: bool) {}

    /// The memory as [`Any`], so the backend that allocated it reads its own type at each step.
    fn as_any(&self) -> &dyn Any;
}

/// How big the fast store is, given when a model is loaded (`--n-res`, `--fast-budget`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum FastBudget {
    /// The backend's default: on the host, every expert resident when their bytes fit in half the
    /// memory available at boot (`MemAvailable` of `/proc/meminfo`; unknown = fits), else as many
    /// slots per layer as fit there.
    #[default]
    Auto,
    /// `n` slots per layer, `0..=n_expert`.
    Slots(usize),
    /// At most this many bytes in all: `n_res = bytes ÷ Σ_layers slot bytes` (an expert's bytes
    /// and the backend's padding, [`SlotMemory::slot_bytes`]), at most `n_expert`.
    Bytes(u64),
}

impl FastBudget {
    /// Slots per layer for layers of `n_expert` experts when one slot in every layer costs
    /// `per_slot` bytes; `auto` is [`FastBudget::Auto`]'s answer (the backend's).
    ///
    /// Errors: [`StoreError::TooManySlots`] for `Slots(n)` above `n_expert`.
    pub fn slots(
        self,
        per_slot: u64,
        n_expert: usize,
        auto: impl FnOnce() -> usize,
    ) -> Result<usize, StoreError> {
        match self {
            FastBudget::Slots(n) if n > n_expert => {
                Err(StoreError::TooManySlots { n_res: n, n_expert })
            }
            FastBudget::Slots(n) => Ok(n),
            FastBudget::Bytes(b) => Ok(slots_within(b, per_slot, n_expert)),
            FastBudget::Auto => Ok(auto().min(n_expert)),
        }
    }
}

/// Slots per layer that fit in `bytes` when one slot in every layer costs `per_slot` bytes, at
/// most `n_expert`.
pub fn slots_within(bytes: u64, per_slot: u64, n_expert: usize) -> usize {
    if per_slot == 0 {
        return n_expert;
    }
    (bytes / per_slot).min(n_expert as u64) as usize
}

/// `MemAvailable` of `/proc/meminfo` in bytes; `None` where it cannot be read.
pub fn available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Errors of building or driving the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// `--n-res` above the experts of a layer.
    #[error("--n-res {n_res} exceeds the {n_expert} experts of a layer")]
    TooManySlots {
        /// Slots asked for.
        n_res: usize,
        /// Experts per layer.
        n_expert: usize,
    },
    /// A session asked for more slots than the model's fast store was allocated with.
    #[error(
        "{n_res} fast-store slots per layer asked for, the model was loaded with {capacity} \
         (its --n-res / --fast-budget)"
    )]
    OverCapacity {
        /// Slots asked for.
        n_res: usize,
        /// Slots the loaded model has.
        capacity: usize,
    },
    /// `--policy min` (needs the future).
    #[error(
        "policy `min` is an offline oracle (it reads the whole trace); use it with `aubier replay`"
    )]
    OfflinePolicy,
    /// The resident set does not fit the model.
    #[error(transparent)]
    HotSet(#[from] HotSetError),
    /// A policy refused its knobs, seed or an access.
    #[error("layer {layer}: {source}")]
    Policy {
        /// 0-based MoE layer.
        layer: usize,
        /// What the policy said.
        source: PolicyError,
    },
    /// A read-ahead budget for a plan that does not predict experts.
    #[error(
        "--prefetch-budget needs the plan's expert predictions (the predict_experts pass: \
         --predict-experts)"
    )]
    NoPrediction,
    /// The plan's MoE steps are not what the store expects (layers, expert counts).
    #[error("plan: {0}")]
    Plan(String),
    /// A routed id is outside the layer's experts.
    #[error("layer {layer}: routed expert id {id} is outside 0..{n_expert}")]
    Routed {
        /// 0-based MoE layer.
        layer: usize,
        /// The id.
        id: i64,
        /// Experts per layer.
        n_expert: usize,
    },
    /// The fast store cannot be allocated.
    #[error("allocating the fast store ({bytes} bytes): {reason}")]
    Alloc {
        /// Bytes asked for.
        bytes: u64,
        /// What the allocator said.
        reason: String,
    },
    /// A slot of the backend's memory cannot be filled or read.
    #[error("MoE layer {layer}, slot {slot}: {reason}")]
    Slot {
        /// MoE layer index.
        layer: usize,
        /// The slot.
        slot: usize,
        /// What went wrong.
        reason: String,
    },
}

/// `layers[layer]` of a backend's slot memory with `slots` slots per layer, after checking that
/// `slot` is one of them: the bounds check of every [`SlotMemory::fill`].
///
/// Errors: [`StoreError::Slot`] naming the layer and slot when either is out of range.
pub fn slot_layer<T>(
    layers: &[T],
    slots: usize,
    layer: usize,
    slot: usize,
) -> Result<&T, StoreError> {
    let bad = |reason: String| StoreError::Slot {
        layer,
        slot,
        reason,
    };
    let l = layers
        .get(layer)
        .ok_or_else(|| bad("no such MoE layer".into()))?;
    if slot >= slots {
        return Err(bad(format!("past the {slots} slots")));
    }
    Ok(l)
}
