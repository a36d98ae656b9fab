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
//!   layer for routing traces; with the opt-in `predict_experts` pass also `predicted_ids.L`
//!   [T, k] i32 for every MoE layer `L ≥ 1`, layer `L`'s router applied before its attention (or,
//!   with a lead `d` above 1, before layer `max(L − d + 1, 1)`'s):
//!   [`Plan::predicted_ids`]);
//! - fused steps (`phase`, `wkb`, `kqkv`, made by the fusion passes for a GPU target; attributes
//!   and semantics on their `types::Attrs` variants) are steps like any other. A `phase` also
//!   writes rows `pos` of its layer's latent cache (its output is the query, in a slot); the
//!   `kqkv` of that layer reads the cache and comes after the phase in `steps`, because it reads
//!   the phase's output through the `wkb` (or unfused head_mat_mul/concat) between them. The CPU
//!   oracle refuses fused steps;
//! - `output_head` names the step a compiler pass found to be the output head (`mark_head`): its
//!   rows are computed independently, so a backend may run it for the last position only, and with
//!   it every step that feeds only such steps ([`Plan::last_rows`]: the last layer's FFN and the
//!   final norm when only the last position's logits are read);
//! - [`Plan::moe_layers`] reads the experts of every `moe_ffn` step off the plan (tensors, expert
//!   count, bytes per expert): what the split expert store places and the backends address.

use crate::config::Mistral4Config;
use crate::ggml_type::GgmlType;
use crate::ops::Op;
use crate::types::{Attrs, DType, Dim, Shape, WeightRef};
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

impl Step {
    /// Its weight operands (indices into [`Plan::weights`]), in operand order.
    pub fn weights(&self) -> impl Iterator<Item = usize> + '_ {
        self.args.iter().filter_map(|a| match *a {
            Operand::Weight(w) => Some(w),
            Operand::Value(_) => None,
        })
    }
}

/// The compiled model: the single thing every backend executes.
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

/// The steps a run computes for its last position alone when only the last row of the output
/// head is read ([`Plan::last_rows`]), and the values they make (one row each).
///
/// Such a step runs as a one-token step (`T = 1`, extents `[1, S]`); a token-indexed operand made
/// by a step that runs for every position (or a plan input) is read from its last row
/// ([`LastRows::operand_row`]); one made by such a step is its one row.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LastRows {
    /// Per step of [`Plan::steps`]: it runs for the last position alone.
    pub steps: Vec<bool>,
    /// Per value of [`Plan::values`]: made by such a step, so one row.
    pub values: Vec<bool>,
}

impl LastRows {
    /// Whether step `i` runs for the last position alone.
    pub fn step(&self, i: usize) -> bool {
        self.steps.get(i).copied().unwrap_or(false)
    }

    /// Rows of value `v` in a run of `t` tokens: 1 when a last-row step makes it, else `t`.
    pub fn rows(&self, v: ValueId, t: usize) -> usize {
        if self.values.get(v).copied().unwrap_or(false) {
            1
        } else {
            t
        }
    }

    /// The element offset at which step `i` reads its operand value `v` in a run of `t`
    /// tokens: the start of the last of the `t` rows when step `i` runs for the last position
    /// and `v` is a token-indexed value made for every position (`[T, ..]` without `S`, which
    /// [`Plan::last_rows`] requires of such operands), else 0.
    pub fn operand_row(&self, plan: &Plan, i: usize, v: ValueId, t: usize) -> usize {
        match plan.values.get(v) {
            Some(value)
                if self.step(i)
                    && self.rows(v, t) == t
                    && value.shape.0.first() == Some(&Dim::Tokens) =>
            {
                (t - 1) * value.shape.numel(1, 0)
            }
            _ => 0,
        }
    }
}

/// One stacked expert tensor of a `moe_ffn` step (ggml `ne = {ne0, ne1, n_expert}`): expert `e`
/// is bytes `e · expert_bytes .. (e + 1) · expert_bytes` of the tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct ExpertTensor {
    /// Operand index of the tensor in its step's `args`.
    pub arg: usize,
    /// The weight.
    pub weight: WeightId,
    /// Bytes of one expert's slice: the ggml row size of `ne0` elements times `ne1`.
    pub expert_bytes: usize,
}

/// The experts of one `moe_ffn` step ([`Plan::moe_layers`]): what the split expert store places
/// and what a backend addresses expert by expert.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MoeLayer {
    /// Index of the `moe_ffn` step in [`Plan::steps`].
    pub step: usize,
    /// The model layer (`Attrs::Moe::layer`).
    pub layer: usize,
    /// Experts of every tensor (`ne[2]`).
    pub n_expert: usize,
    /// The stacked tensors in operand order (`ffn_gate_up_exps`, or `ffn_gate_exps` and
    /// `ffn_up_exps`; then `ffn_down_exps`): every weight operand of the step.
    pub tensors: Vec<ExpertTensor>,
}

impl MoeLayer {
    /// Bytes of one expert over all its tensors (a fast-store slot).
    pub fn expert_bytes(&self) -> usize {
        self.tensors.iter().map(|t| t.expert_bytes).sum()
    }
}

/// A plan whose MoE steps are not what [`Plan::moe_layers`] reads.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("plan step {step}: {detail}")]
pub struct PlanError {
    /// The step at fault.
    pub step: usize,
    /// What is wrong.
    pub detail: String,
}

/// Name prefix of the expert predictions' outputs, `predicted_ids.{L}`
/// ([`crate::passes::predict_experts`] writes them, [`Plan::predicted_ids`] reads them).
pub const PREDICTED_IDS_PREFIX: &str = "predicted_ids.";

impl Plan {
    /// Whether a run given `last_only` computes [`Plan::last_rows`] for the last position alone:
    /// `Ok(false)` for `None`, `Ok(true)` for the output head's value.
    ///
    /// Errors: `Err(v)` for another value `v` (only the head's rows may be left out).
    pub fn runs_last_rows(&self, last_only: Option<ValueId>) -> Result<bool, ValueId> {
        match last_only {
            None => Ok(false),
            Some(v) if self.output_head.is_some_and(|h| h.value == v) => Ok(true),
            Some(v) => Err(v),
        }
    }

    /// The steps that may run for the last position alone when a run reads only the last row
    /// of the output head ([`Plan::output_head`]) and every other plan output whole: empty
    /// flags when the plan has no head.
    ///
    /// Algorithm: one backward walk over the schedule (every consumer of a value comes after
    /// it). A value needs all its rows when it is a plan output other than the head's or some
    /// step that runs for every position reads it. A step runs for the last position when its
    /// output does not need all rows and it is row-wise: it writes no latent cache
    /// (`cache_write`, `phase` write every row they are given), its output is `[T, ..]` with no
    /// other `T`, and every token-indexed operand is `[T, ..]` with no other `T` and no `S` (so
    /// its last row is a fixed offset). Every op of the IR computes output row `t` from row `t`
    /// of its token-indexed operands alone (ops.rs); the attention reads other positions only
    /// through the latent cache, which the steps that write it fill for every row first. A
    /// forward walk then returns a `reshape` to every position when its input was made for
    /// every position (a reshape shares its input's buffer). llama.cpp does the same for the
    /// last layer (`inp_out_ids`: the rows after its attention are those it outputs).
    pub fn last_rows(&self) -> LastRows {
        let n = self.steps.len();
        let mut rows = LastRows {
            steps: vec![false; n],
            values: vec![false; self.values.len()],
        };
        let Some(head) = self.output_head else {
            return rows;
        };
        let tokens_first = |v: &Value| {
            let dims = &v.shape.0;
            dims.first() == Some(&Dim::Tokens) && !dims[1..].contains(&Dim::Tokens)
        };
        let mut all_rows = vec![false; self.values.len()];
        for (_, v) in &self.outputs {
            if *v != head.value {
                if let Some(a) = all_rows.get_mut(*v) {
                    *a = true;
                }
            }
        }
        for i in (0..n).rev() {
            let step = &self.steps[i];
            let operands = || {
                step.args.iter().filter_map(|a| match a {
                    Operand::Value(v) => self.values.get(*v).map(|value| (*v, value)),
                    Operand::Weight(_) => None,
                })
            };
            let row_wise = !matches!(step.op, Op::CacheWrite | Op::Phase)
                && self.values.get(step.out).is_some_and(tokens_first)
                && operands().all(|(_, v)| {
                    !v.shape.0.contains(&Dim::Tokens)
                        || (tokens_first(v) && !v.shape.0.contains(&Dim::Keys))
                });
            let last = row_wise && !all_rows.get(step.out).copied().unwrap_or(true);
            if last {
                rows.steps[i] = true;
            } else {
                for (v, _) in operands() {
                    all_rows[v] = true;
                }
            }
        }
        for (i, step) in self.steps.iter().enumerate() {
            if step.op == Op::Reshape && rows.steps[i] {
                rows.steps[i] = match step.args.first() {
                    Some(Operand::Value(v)) => rows.values.get(*v).copied().unwrap_or(false),
                    _ => false,
                };
            }
            if rows.steps[i] {
                rows.values[step.out] = true;
            }
        }
        rows
    }

    /// The expert predictions of [`crate::passes::predict_experts`]: `(L, value)` for every
    /// output `predicted_ids.L` ([T, k] i32, the top-k of layer `L`'s router applied to the
    /// residual at the end of layer `L − 1`, or earlier with
    /// [`crate::CompileOptions::prefetch_lead`] above 1), in layer order; empty for a plan compiled without
    /// [`crate::CompileOptions::predict_experts`].
    pub fn predicted_ids(&self) -> Vec<(usize, ValueId)> {
        let mut out: Vec<(usize, ValueId)> = self
            .outputs
            .iter()
            .filter_map(|(name, v)| {
                let layer = name.strip_prefix(PREDICTED_IDS_PREFIX)?.parse().ok()?;
                Some((layer, *v))
            })
            .collect();
        out.sort_unstable();
        out
    }

    /// The experts of every `moe_ffn` step, in layer order. Every weight operand of such a step is
    /// a stacked expert tensor; all of them have the same expert count.
    ///
    /// Errors: [`PlanError`] naming the step when it lacks `Moe` attributes, repeats a layer, has
    /// a weight that is not `{ne0, ne1, n_expert}` of a known ggml type with whole blocks per row,
    /// or an expert count other than the first step's.
    pub fn moe_layers(&self) -> Result<Vec<MoeLayer>, PlanError> {
        let mut layers: Vec<MoeLayer> = Vec::new();
        for (i, step) in self.steps.iter().enumerate() {
            if step.op != Op::MoeFfn {
                continue;
            }
            let bad = |detail: String| PlanError { step: i, detail };
            let Attrs::Moe { layer, .. } = step.attrs else {
                return Err(bad("a moe_ffn step without Moe attributes".into()));
            };
            if layers.iter().any(|l| l.layer == layer) {
                return Err(bad(format!("layer {layer} has two moe_ffn steps")));
            }
            let mut tensors = Vec::new();
            let mut n_expert = None;
            for (arg, a) in step.args.iter().enumerate() {
                let Operand::Weight(weight) = *a else {
                    continue;
                };
                let w = self.weights.get(weight).ok_or_else(|| {
                    bad(format!("operand {arg} is weight {weight}, not in the plan"))
                })?;
                let [ne0, ne1, n] = w.ne[..] else {
                    return Err(bad(format!("`{}` has ne {:?}, not 3 dims", w.name, w.ne)));
                };
                let row = GgmlType::from_name(&w.ggml_type)
                    .and_then(|ty| ty.row_size(ne0))
                    .ok_or_else(|| {
                        bad(format!(
                            "`{}`: rows of {ne0} {} elements are not whole blocks of a known type",
                            w.name, w.ggml_type
                        ))
                    })?;
                let expert_bytes = row
                    .checked_mul(ne1)
                    .ok_or_else(|| bad(format!("`{}`: an expert's bytes overflow", w.name)))?;
                if *n_expert.get_or_insert(n) != n {
                    return Err(bad(format!(
                        "`{}` has {n} experts, another tensor {n_expert:?}",
                        w.name
                    )));
                }
                tensors.push(ExpertTensor {
                    arg,
                    weight,
                    expert_bytes,
                });
            }
            let n_expert =
                n_expert.ok_or_else(|| bad("a moe_ffn step without expert weights".into()))?;
            if let Some(first) = layers.first() {
                if first.n_expert != n_expert {
                    return Err(bad(format!(
                        "layer {layer} has {n_expert} experts, layer {} has {}",
                        first.layer, first.n_expert
                    )));
                }
            }
            layers.push(MoeLayer {
                step: i,
                layer,
                n_expert,
                tensors,
            });
        }
        layers.sort_by_key(|l| l.layer);
        Ok(layers)
    }
}
