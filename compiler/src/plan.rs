//! The `Plan`: the scheduled, buffer-assigned list of steps that every backend executes
//! (ARCHITECTURE.md § compiler). It is the contract between `compiler` (which produces it from the
//! graph after the pass pipeline) and `kernels-gen` / `runtime` (which lower and run it).
//!
//! Execution model for one `Session::step` of `T` tokens at positions `pos[0..T]`:
//! - `inputs` are bound first (`tokens` [T] i32, `pos` [T] i32);
//! - `steps` run in order; each reads its `args` (values or weights) and writes `out`;
//! - a value lives in its [`Storage`]: a buffer slot (two values share a slot only when their live
//!   ranges do not overlap, so an executor allocates one buffer per slot, sized for the largest value
//!   placed in it; a `reshape` output shares its input's slot), or a layer of the latent KV cache
//!   (the output of `cache_write`, shape [S, kv_lora_rank + qk_rope_head_dim]);
//! - `outputs` are read after the last step (`logits` [T, n_vocab]; `router_ids.L` [T, k] i32 per
//!   layer for routing traces);
//! - fused steps (`phase`, `wkb`, `kqkv`, made by the fusion passes for a GPU target; attributes
//!   and semantics on their `types::Attrs` variants) are steps like any other. A `phase` also
//!   writes rows `pos` of its layer's latent cache (its output is the query, in a slot); the
//!   `kqkv` of that layer reads the cache and comes after the phase in `steps`, because it reads
//!   the phase's output through the `wkb` (or unfused head_mat_mul/concat) between them. The CPU
//!   oracle refuses fused steps;
//! - `output_head` names the step a compiler pass found to be the output head (`mark_head`): its
//!   rows are computed independently, so a backend may run it for the last position only.

use crate::config::Mistral4Config;
use crate::ops::Op;
use crate::types::{Attrs, DType, Shape, WeightRef};
use serde::{Deserialize, Serialize};

/// Index into [`Plan::values`].
pub type ValueId = usize;
/// Index into [`Plan::weights`].
pub type WeightId = usize;

/// One activation value of the plan.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Value {
    /// Element type.
    pub dtype: DType,
    /// Symbolic shape, row-major.
    pub shape: Shape,
    /// Where the value's elements live (see the module note on sharing).
    pub storage: Storage,
    /// A readable name for dumps (`blk.3.q_pe`, …); empty when anonymous.
    pub name: String,
}

/// Where a value lives during execution.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Storage {
    /// Buffer slot `n` of [`Plan::n_slots`].
    Slot(usize),
    /// Rows `0..S` of layer `layer` of the latent KV cache.
    KvCache { layer: usize },
}

/// An operand of a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Operand {
    /// An activation value.
    Value(ValueId),
    /// A GGUF weight.
    Weight(WeightId),
}

/// One scheduled operation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Step {
    /// The operation (see `ops.rs` for the semantics of each).
    pub op: Op,
    /// Its attributes.
    pub attrs: Attrs,
    /// Operands, in the op's order.
    pub args: Vec<Operand>,
    /// The value written.
    pub out: ValueId,
}

/// The compiled model: the single thing both backends execute.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// Hyper-parameters the plan was compiled for.
    pub config: Mistral4Config,
    /// Stages the pipeline ran, in order (for the manifest and dumps).
    pub stages: Vec<String>,
    /// Weights read, each once.
    pub weights: Vec<WeightRef>,
    /// Every value.
    pub values: Vec<Value>,
    /// Number of distinct buffer slots.
    pub n_slots: usize,
    /// Named inputs bound before the first step.
    pub inputs: Vec<(String, ValueId)>,
    /// Named outputs read after the last step.
    pub outputs: Vec<(String, ValueId)>,
    /// The schedule.
    pub steps: Vec<Step>,
    /// The output head, when the `mark_head` pass found one.
    #[serde(default)]
    pub output_head: Option<OutputHead>,
}

/// The output head of a plan ([`crate::passes::mark_head`]): a `mat_mul` of a weight and a
/// `[T, n]` value whose result is a plan output and read by no step. Row `t` of its output
/// depends on row `t` of its input alone, so the step may run for the last position only when
/// only that row is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputHead {
    /// Index of the head's step in [`Plan::steps`].
    pub step: usize,
    /// The value it writes (a plan output).
    pub value: ValueId,
}
