//! KQKV: latent attention as one fused node.
//!
//! Algorithm note. Matches, per layer, the unfused attention the model description builds over
//! the latent KV cache (names: H heads, C = kv_lora_rank, R = qk_rope_head_dim, T tokens):
//!
//! ```text
//! cache = cache_write(kv, pos) {layer}                          // [S, C+R]
//! o_lat = weighted_sum(softmax(causal_mask(scale(scores_qk(q_abs, cache); kq_scale), pos)),
//!                      cache; len = C)                          // [T, H, C]
//! ```
//!
//! and replaces `o_lat` with `kqkv(q_abs, pos, cache) {layer, n_head, kv_lora, rope_dim,
//! kq_scale}`: `o_lat[t,h] = Σ_j softmax_j(mask_j(kq_scale · q_abs[t,h]·K_j)) · K_j[:C]` over the
//! keys K_j, j in 0..=max(pos), of that layer's cache, key j visible iff j ≤ pos[t] — exactly the
//! four ops it replaces. Legality: both cache reads are the same `cache_write`, the mask and the
//! write use the same `pos`, and the scores, scale, mask and softmax have no other reader (so
//! nothing else needs them). The third operand is the write's view, kept only to order the read
//! after the write while the cache is still written by a `cache_write`; `fuse_phase` drops it
//! when it replaces the write. The replaced ops are removed here; their other operands are left
//! for DCE. Returns the number of `kqkv` nodes made.

use super::{add_typed, args_of, name_of};
use crate::error::CompileError;
use crate::ir::{Graph, NodeId};
use crate::ops::Op;
use crate::types::{Attrs, Dim};

const STAGE: &str = "fuse_kqkv";

/// The matched subgraph of one layer.
struct Attention {
    o_lat: NodeId,
    /// scores_qk, scale, causal_mask, softmax: removed once `o_lat` is replaced.
    chain: [NodeId; 4],
    q_abs: NodeId,
    pos: NodeId,
    cache: NodeId,
    attrs: Attrs,
}

/// Fuses every matching attention; returns how many `kqkv` nodes it made.
///
/// Errors: [`CompileError::Verify`] (stage `fuse_kqkv`) if a replacement fails its rule (a pass
/// bug).
pub fn run(g: &mut Graph) -> Result<usize, CompileError> {
    let candidates: Vec<NodeId> =
        g.g.node_indices()
            .filter(|&n| g.node(n).and_then(|x| x.op()) == Some(Op::WeightedSum))
            .collect();
    let mut made = 0;
    for n in candidates {
        let Some(m) = matches(g, n) else { continue };
        let name = name_of(g, m.o_lat);
        let args = [m.q_abs, m.pos, m.cache];
        let k = add_typed(g, STAGE, Op::Kqkv, m.attrs, &args, name)?;
        g.replace_uses(m.o_lat, k);
        g.g.remove_node(m.o_lat);
        for c in m.chain.iter().rev() {
            g.g.remove_node(*c);
        }
        made += 1;
    }
    Ok(made)
}

/// The attention ending at `weighted_sum` node `n`, when it has the shape of the note.
fn matches(g: &Graph, n: NodeId) -> Option<Attention> {
    let sole_user = |x: NodeId, user: NodeId| g.users(x) == [user];
    let (ws_attrs, ws) = args_of(g, n, Op::WeightedSum, 2)?;
    let &Attrs::WeightedSum { len } = ws_attrs else {
        return None;
    };
    let (p, cache) = (ws[0], ws[1]);
    let (_, sm) = args_of(g, p, Op::Softmax, 1)?;
    let (_, cm) = args_of(g, sm[0], Op::CausalMask, 2)?;
    let (sc_attrs, sc) = args_of(g, cm[0], Op::Scale, 1)?;
    let &Attrs::Scale(kq_scale) = sc_attrs else {
        return None;
    };
    let (_, qk) = args_of(g, sc[0], Op::ScoresQk, 2)?;
    let (q_abs, pos) = (qk[0], cm[1]);
    let (cw_attrs, cw) = args_of(g, cache, Op::CacheWrite, 2)?;
    let &Attrs::CacheWrite { layer } = cw_attrs else {
        return None;
    };
    if qk[1] != cache || cw[1] != pos {
        return None;
    }
    let chain = [sc[0], cm[0], sm[0], p];
    let users = [cm[0], sm[0], p, n];
    if !chain.iter().zip(users).all(|(&c, u)| sole_user(c, u)) {
        return None;
    }
    let q_ty = g.node(q_abs)?.ty.as_ref()?;
    let (Dim::Fixed(n_head), Dim::Fixed(width)) = (*q_ty.shape.0.get(1)?, *q_ty.shape.0.get(2)?)
    else {
        return None;
    };
    let rope_dim = width.checked_sub(len)?;
    Some(Attention {
        o_lat: n,
        chain,
        q_abs,
        pos,
        cache,
        attrs: Attrs::Kqkv {
            layer,
            n_head,
            kv_lora: len,
            rope_dim,
            kq_scale,
        },
    })
}
