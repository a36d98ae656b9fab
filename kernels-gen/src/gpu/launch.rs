//! Launches: what a GPU backend binds to each parameter of each kernel of a plan step.
//!
//! Algorithm note. [`launches`] takes the kernels of a step ([`super::steps::for_step`]) and
//! resolves every kernel parameter by its name against the step's operand list, whose order each
//! op fixes (`mat_mul(w, x)`, `phase(q, kv_a, w_norm, pos)`, …: [`operand_names`]). A parameter
//! named like an operand reads that operand; `cache` is the latent-cache layer the step names
//! (an operand of `cache_write` / `scores_qk` / an unfused `kqkv`, the `layer` attribute of
//! `phase` and a fused `kqkv`); `act`, `part` and `route` are scratch shared by the kernels of the
//! step (the routed experts' activations, KQKV's split partials and the experts' products per
//! slot, the MoE mat-mat's slot lists), sized by the parameter's length; any
//! other written parameter is the step's output. A parameter that resolves to nothing is an
//! error naming the kernel and the parameter, so a builder change cannot silently bind the wrong
//! buffer.

use super::ir::{Kernel, ParamKind, Size};
use super::steps::for_step;
use super::GenError;
use aubier_compiler::ops::Op;
use aubier_compiler::plan::{Operand, Plan, Storage};
use aubier_compiler::types::Attrs;

/// What one kernel parameter is bound to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Arg {
    /// The step's operand `i` (a value, or a weight: raw GGUF bytes, or for an experts
    /// parameter the per-expert address table of that weight).
    Operand(usize),
    /// The step's output value.
    Output,
    /// Layer `n` of the latent KV cache (`[capacity, kv_lora + rope_dim]` f32).
    Cache(usize),
    /// Scratch of the step named by the parameter, `len` 4-byte elements at `(T, S)` (i32 for
    /// `route`, else f32); the kernels of one step that name the same scratch share it.
    Scratch {
        /// Parameter name (`act`, `part`, `route`).
        name: String,
        /// Elements.
        len: Size,
    },
}

/// One kernel launch of a step: the kernel and, per parameter in order, its binding.
#[derive(Clone, Debug)]
pub struct Launch {
    /// The kernel.
    pub kernel: Kernel,
    /// One per `kernel.params` entry.
    pub args: Vec<Arg>,
}

/// Names of the operands of `op`, in plan order, as the kernels' parameters name them.
/// `experts_split` selects `moe_ffn`'s operand list with separate gate and up tensors.
fn operand_names(op: Op, experts_split: bool) -> &'static [&'static str] {
    match op {
        Op::Embed => &["w", "ids"],
        Op::RmsNorm => &["x", "w"],
        Op::MatMul | Op::HeadMatMul => &["w", "x"],
        Op::Wkb => &["x", "w"],
        Op::Slice | Op::Reshape | Op::Scale | Op::Silu => &["a"],
        Op::Concat | Op::Add | Op::Mul => &["a", "b"],
        Op::RopeYarn | Op::AttnTemperature | Op::CausalMask => &["x", "pos"],
        Op::Softmax => &["x"],
        Op::CacheWrite => &["kv", "pos"],
        Op::ScoresQk => &["q", "k"],
        Op::WeightedSum => &["p", "v"],
        Op::TopK => &["p"],
        Op::GatherRenorm => &["p", "ids"],
        Op::MoeFfn if experts_split => &["h", "ids", "wts", "gate", "up", "down"],
        Op::MoeFfn => &["h", "ids", "wts", "gate", "down"],
        Op::Phase => &["q", "kv_a", "w_norm", "pos"],
        Op::Kqkv => &["q", "pos", "cache"],
    }
}

/// The kernels of step `idx` of `plan`, built for reductions over `warp` lanes and named by
/// content, with every parameter bound ([`Arg`]); empty for a step that needs no kernel (a
/// reshape in place).
///
/// Errors: those of [`for_step`]; [`GenError::Step`] when a parameter resolves to nothing or the
/// latent-cache layer of the step cannot be found.
pub fn launches(plan: &Plan, idx: usize, warp: u32) -> Result<Vec<Launch>, GenError> {
    let step = plan.steps.get(idx).ok_or_else(|| GenError::Step {
        step: idx,
        op: "?",
        detail: "no such step".into(),
    })?;
    let kernels = for_step(plan, idx, warp)?;
    let err = |detail: String| GenError::Step {
        step: idx,
        op: step.op.name(),
        detail,
    };
    let split = matches!(&step.attrs, Attrs::Moe { layout, .. }
        if *layout == aubier_compiler::config::ExpertLayout::SplitGateUp);
    let names = operand_names(step.op, split);
    let cache_layer = || -> Result<usize, GenError> {
        match &step.attrs {
            Attrs::Phase { layer, .. } | Attrs::Kqkv { layer, .. } => return Ok(*layer),
            _ => {}
        }
        let values = step.args.iter().filter_map(|a| match a {
            Operand::Value(v) => Some(*v),
            Operand::Weight(_) => None,
        });
        values
            .chain([step.out])
            .find_map(|v| match plan.values.get(v).map(|v| v.storage) {
                Some(Storage::KvCache { layer }) => Some(layer),
                _ => None,
            })
            .ok_or_else(|| err("no latent-cache layer among its operands".into()))
    };
    kernels
        .into_iter()
        .map(|kernel| {
            let args = kernel
                .params
                .iter()
                .map(|(name, kind)| {
                    let operand = names
                        .iter()
                        .position(|n| n == name)
                        .filter(|&i| i < step.args.len());
                    let writes = matches!(
                        kind,
                        ParamKind::F32 { writes: true, .. } | ParamKind::I32 { writes: true, .. }
                    );
                    match (name.as_str(), operand, kind) {
                        ("cache", _, _) => cache_layer().map(Arg::Cache),
                        (_, Some(i), _) => Ok(Arg::Operand(i)),
                        ("act" | "part", None, ParamKind::F32 { len: Some(len), .. })
                        | ("route", None, ParamKind::I32 { len: Some(len), .. }) => {
                            Ok(Arg::Scratch {
                                name: name.clone(),
                                len: len.clone(),
                            })
                        }
                        (_, None, _) if writes => Ok(Arg::Output),
                        _ => Err(err(format!(
                            "kernel `{}`: parameter `{name}` names no operand of the step",
                            kernel.name
                        ))),
                    }
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Launch {
                kernel: super::name_by_content(kernel),
                args,
            })
        })
        .collect()
}
