//! Expert prediction: layer `l + 1`'s router applied to the residual stream at the end of layer
//! `l`, before layer `l + 1`'s attention, so that its experts can be fetched one layer ahead.
//!
//! Algorithm note. For every `moe_ffn` of layer `L ≥ 1` the pass reads the routing chain that
//! feeds its ids, `top_k(softmax(mat_mul(ffn_gate_inp, rms_norm(x', ffn_norm))))` (`x'` the
//! residual after layer `L`'s attention), and the residual `x` at the end of layer `L − 1`: the
//! operand of the `rms_norm` by `blk.L.attn_norm`. It adds copies of the four ops, with the same
//! weights and attributes (ε, `k`), over `x` in place of `x'`, and lists the copy of the `top_k`
//! as the graph output `predicted_ids.L` ([T, k] i32). The copies and their two weights are
//! anchored before that `rms_norm` ([`crate::ir::Graph::schedule_before`]), so the schedule runs
//! the prediction before layer `L`'s attention. No existing node changes: the other steps and
//! outputs compute what they computed before, bit for bit. This is the "pre-gate" of Hwang et
//! al., "Pre-gated MoE" (ISCA 2024), computed here with the next layer's own router rather than
//! a trained pre-gate. Returns the number of layers given a prediction; a layer whose chain is
//! not of that form (another model) gets none.

use super::{add_typed, args_of, op_of, weight_of};
use crate::error::CompileError;
use crate::ir::{Graph, NodeId};
use crate::ops::Op;
use crate::plan::PREDICTED_IDS_PREFIX;
use crate::types::Attrs;

/// Stage name of the pass.
const STAGE: &str = "predict_experts";

/// The routing chain of one `moe_ffn`: its layer, the nodes to copy (in operand order) and the
/// weights they read.
struct Router {
    layer: usize,
    norm: (Attrs, NodeId),
    gate: (Attrs, NodeId),
    softmax: Attrs,
    top_k: Attrs,
}

/// Adds the prediction of every MoE layer `L ≥ 1`; returns how many it added.
///
/// Errors: [`CompileError::Verify`] when a copied op does not type over the new operand (a pass
/// bug: `x` and `x'` have the same type).
pub fn run(g: &mut Graph) -> Result<usize, CompileError> {
    let moes: Vec<NodeId> =
        g.g.node_indices()
            .filter(|&n| g.node(n).and_then(|x| x.op()) == Some(Op::MoeFfn))
            .collect();
    let mut added = 0;
    for moe in moes {
        let Some(r) = router_of(g, moe).filter(|r| r.layer >= 1) else {
            continue;
        };
        let Some((anchor, x)) = attn_norm_input(g, r.layer) else {
            continue;
        };
        let l = r.layer;
        let norm = add_typed(
            g,
            STAGE,
            Op::RmsNorm,
            r.norm.0,
            &[x, r.norm.1],
            format!("blk.{l}.pred_ffn_norm"),
        )?;
        let logits = add_typed(
            g,
            STAGE,
            Op::MatMul,
            r.gate.0,
            &[r.gate.1, norm],
            format!("blk.{l}.pred_router_logits"),
        )?;
        let probs = add_typed(
            g,
            STAGE,
            Op::Softmax,
            r.softmax,
            &[logits],
            format!("blk.{l}.pred_router_probs"),
        )?;
        let name = format!("{PREDICTED_IDS_PREFIX}{l}");
        let ids = add_typed(g, STAGE, Op::TopK, r.top_k, &[probs], name.clone())?;
        g.outputs.push((name, ids));
        for n in [r.norm.1, r.gate.1, norm, logits, probs, ids] {
            g.schedule_before.insert(n, anchor);
        }
        added += 1;
    }
    Ok(added)
}

/// The routing chain feeding `moe`'s ids, when it is `top_k(softmax(mat_mul(w_gate,
/// rms_norm(x', w_norm))))` with `rms_norm` output the `moe_ffn`'s own input.
fn router_of(g: &Graph, moe: NodeId) -> Option<Router> {
    let (_, attrs) = op_of(g, moe)?;
    let Attrs::Moe { layer, .. } = *attrs else {
        return None;
    };
    let moe_args = g.operands(moe);
    let (h, ids) = (*moe_args.first()?, *moe_args.get(1)?);
    let (top_k, a) = args_of(g, ids, Op::TopK, 1)?;
    let (softmax, a) = args_of(g, a[0], Op::Softmax, 1)?;
    let (gate, a) = args_of(g, a[0], Op::MatMul, 2)?;
    weight_of(g, a[0])?;
    let gate = (gate.clone(), a[0]);
    if a[1] != h {
        return None;
    }
    let (norm, n) = args_of(g, h, Op::RmsNorm, 2)?;
    weight_of(g, n[1])?;
    Some(Router {
        layer,
        norm: (norm.clone(), n[1]),
        gate,
        softmax: softmax.clone(),
        top_k: top_k.clone(),
    })
}

/// Layer `layer`'s attention norm (the `rms_norm` by weight `blk.{layer}.attn_norm`) and its
/// input, the residual at the end of layer `layer − 1`.
fn attn_norm_input(g: &Graph, layer: usize) -> Option<(NodeId, NodeId)> {
    let want = format!("blk.{layer}.attn_norm.weight");
    g.g.node_indices().find_map(|n| {
        let (_, a) = args_of(g, n, Op::RmsNorm, 2)?;
        (weight_of(g, a[1])?.name == want).then_some((n, a[0]))
    })
}
