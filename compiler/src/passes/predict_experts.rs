//! Expert prediction: layer `L`'s router applied to the residual stream `d` layers before it
//! (the lead, [`crate::CompileOptions::prefetch_lead`]), so that its experts can be fetched while
//! the layers in between run.
//!
//! Algorithm note. For every `moe_ffn` of layer `L ≥ 1` the pass reads the routing chain that
//! feeds its ids, `top_k(softmax(mat_mul(ffn_gate_inp, rms_norm(x', ffn_norm))))` (`x'` the
//! residual after layer `L`'s attention). With lead `d` and `a = max(L − d + 1, 1)` (the anchor
//! layer), it takes the residual `x` at the end of layer `a − 1`: the operand of the `rms_norm`
//! by `blk.a.attn_norm`. It adds copies of the four ops, with the same weights and attributes
//! (ε, `k`), over `x` in place of `x'`, and lists the copy of the `top_k` as the graph output
//! `predicted_ids.L` ([T, k] i32). The copies and their two weights are anchored before that
//! `rms_norm` ([`crate::ir::Graph::schedule_before`]), so the schedule runs the prediction before
//! layer `a`'s attention: between the prediction and layer `L`'s `moe_ffn` run layers `a .. L − 1`
//! whole and layer `L`'s attention, that is `L − a + 1 = d` layers' attention (a copy issued
//! there has `d` layers of time), except for `L < d`, whose lead is `L` (the residual before layer
//! 1's attention: layer 0 has no residual before it to read). Lead 1 is layer `L`'s router on
//! the residual at the end of layer `L − 1`. No existing node changes: the other steps and
//! outputs compute what they computed before, bit for bit. This is the "pre-gate" of Hwang et
//! al., "Pre-gated MoE" (ISCA 2024), computed here with layer `L`'s own router rather than a
//! trained pre-gate. Returns the number of layers given a prediction; a layer whose chain is not
//! of that form (another model) gets none.

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

/// Adds the prediction of every MoE layer `L ≥ 1`, `lead` layers ahead (the module note; `lead`
/// ≥ 1, checked by [`crate::compile`]: 0 is taken as 1); returns how many it added.
///
/// Errors: [`CompileError::Verify`] when a copied op does not type over the new operand (a pass
/// bug: `x` and `x'` have the same type).
pub fn run(g: &mut Graph, lead: usize) -> Result<usize, CompileError> {
    let moes: Vec<NodeId> =
        g.g.node_indices()
            .filter(|&n| g.node(n).and_then(|x| x.op()) == Some(Op::MoeFfn))
            .collect();
    let mut added = 0;
    for moe in moes {
        let Some(r) = router_of(g, moe).filter(|r| r.layer >= 1) else {
            continue;
        };
        let Some((anchor, x)) = attn_norm_input(g, anchor_layer(r.layer, lead)) else {
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

/// The layer before whose attention layer `layer`'s prediction runs at lead `lead`:
/// `max(layer − lead + 1, 1)` (the module note).
pub fn anchor_layer(layer: usize, lead: usize) -> usize {
    (layer + 1).saturating_sub(lead.max(1)).max(1)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builder::Builder;
    use crate::config::ExpertLayout;
    use crate::types::{DType, Dim, Shape, WeightRef};
    use std::collections::BTreeMap;

    const LAYERS: usize = 4;
    const D: usize = 8;
    const EXPERTS: usize = 4;
    const FF: usize = 4;

    /// `LAYERS` layers of Mistral 4's shape over an input residual: an attention stand-in
    /// (`attn_output` over the attention norm, added to the residual), then the routing chain
    /// and a `moe_ffn`, added to the residual.
    fn layers() -> Graph {
        let mut ws = BTreeMap::new();
        let mut put = |name: String, ne: &[usize]| {
            let w = WeightRef {
                name: name.clone(),
                ggml_type: "F32".into(),
                ne: ne.to_vec(),
            };
            ws.insert(name, w);
        };
        for l in 0..LAYERS {
            put(format!("blk.{l}.attn_norm.weight"), &[D]);
            put(format!("blk.{l}.attn_output.weight"), &[D, D]);
            put(format!("blk.{l}.ffn_norm.weight"), &[D]);
            put(format!("blk.{l}.ffn_gate_inp.weight"), &[D, EXPERTS]);
            put(
                format!("blk.{l}.ffn_gate_up_exps.weight"),
                &[D, 2 * FF, EXPERTS],
            );
            put(format!("blk.{l}.ffn_down_exps.weight"), &[FF, D, EXPERTS]);
        }
        let mut b = Builder::new(&ws);
        let build = |b: &mut Builder<'_>| -> Result<(), CompileError> {
            let shape = Shape(vec![Dim::Tokens, Dim::Fixed(D)]);
            let mut x = b.input("x", DType::F32, shape)?;
            for l in 0..LAYERS {
                let w = |b: &mut Builder<'_>, n: &str| b.weight(&format!("blk.{l}.{n}.weight"));
                let norm = w(b, "attn_norm")?;
                let a = b.rms_norm(x, norm, 1e-6)?;
                let out = w(b, "attn_output")?;
                let a = b.mat_mul(out, a)?;
                let x2 = b.add(x, a)?;
                let norm = w(b, "ffn_norm")?;
                let h = b.rms_norm(x2, norm, 1e-6)?;
                let gate = w(b, "ffn_gate_inp")?;
                let logits = b.mat_mul(gate, h)?;
                let p = b.softmax(logits)?;
                let ids = b.top_k(p, 2)?;
                let wts = b.gather_renorm(p, ids, true, 1.0)?;
                let gu = w(b, "ffn_gate_up_exps")?;
                let down = w(b, "ffn_down_exps")?;
                let y = b.moe_ffn(&[h, ids, wts, gu, down], l, FF, ExpertLayout::FusedGateUp)?;
                x = b.add(x2, y)?;
            }
            b.output("out", x)
        };
        build(&mut b).unwrap();
        b.finish().unwrap()
    }

    /// Per predicted layer `L`: the layer whose attention norm the prediction is anchored
    /// before, checked to read the same residual as that norm, its `top_k` and its routing
    /// norm anchored there too.
    fn anchors(g: &Graph) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        for (name, ids) in &g.outputs {
            let Some(l) = name.strip_prefix(PREDICTED_IDS_PREFIX) else {
                continue;
            };
            let l: usize = l.parse().unwrap();
            let anchor = g.schedule_before[ids];
            let (_, a) = args_of(g, anchor, Op::RmsNorm, 2).unwrap();
            let at = (0..LAYERS)
                .find(|&k| weight_of(g, a[1]).unwrap().name == format!("blk.{k}.attn_norm.weight"))
                .unwrap();
            let (_, p) = args_of(g, *ids, Op::TopK, 1).unwrap();
            let (_, m) = args_of(g, p[0], Op::Softmax, 1).unwrap();
            let (_, n) = args_of(g, m[0], Op::MatMul, 2).unwrap();
            assert_eq!(
                weight_of(g, n[0]).unwrap().name,
                format!("blk.{l}.ffn_gate_inp.weight")
            );
            let (_, x) = args_of(g, n[1], Op::RmsNorm, 2).unwrap();
            assert_eq!(x[0], a[0], "layer {l}: not the residual its anchor reads");
            assert_eq!(g.schedule_before[&n[1]], anchor);
            out.push((l, at));
        }
        out.sort_unstable();
        out
    }

    #[test]
    fn a_lead_of_d_anchors_layer_l_before_the_attention_of_layer_l_minus_d_plus_1() {
        let mut g = layers();
        assert_eq!(run(&mut g, 1).unwrap(), LAYERS - 1);
        assert_eq!(anchors(&g), [(1, 1), (2, 2), (3, 3)]);
        let mut g = layers();
        assert_eq!(run(&mut g, 2).unwrap(), LAYERS - 1);
        // Layer 1 has no residual two layers back: its lead is 1.
        assert_eq!(anchors(&g), [(1, 1), (2, 1), (3, 2)]);
        let mut g = layers();
        run(&mut g, 3).unwrap();
        assert_eq!(anchors(&g), [(1, 1), (2, 1), (3, 1)]);
        crate::verify::verify(&g).unwrap();
    }

    #[test]
    fn the_anchor_layer_is_clamped_to_the_first_with_a_residual_before_it() {
        assert_eq!(anchor_layer(5, 1), 5);
        assert_eq!(anchor_layer(5, 2), 4);
        assert_eq!(anchor_layer(5, 5), 1);
        assert_eq!(anchor_layer(5, 9), 1);
        assert_eq!(anchor_layer(1, 0), 1);
    }
}
