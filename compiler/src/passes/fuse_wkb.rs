//! WKB: the absorbed per-head MLA projections, each one node over all heads.
//!
//! Algorithm note. Names: H heads, N = qk_nope_head_dim, R = qk_rope_head_dim, C =
//! kv_lora_rank, V = v_head_dim, T tokens; `W[h]` is head h's matrix of a weight ne
//! {in, out, H}, as `head_mat_mul` reads it. Two rewrites, in this order:
//!
//! ```text
//! IN:  concat(head_mat_mul(W_kb, a), b)   a [T,H,N], b [T,H,R]
//!        → wkb(x, W_kb) {n_head H, in_dim N, out_dim C, rope_tail R}          // [T,H,C+R]
//!      x = q2 when a = slice(q2, 0, N) and b = slice(q2, N, R) (what `fuse_phase` builds),
//!      else x = concat(a, b);  wkb computes [W_kb[h]·x[t,h,:N], x[t,h,N:]]
//! OUT: head_mat_mul(W_vb, o_lat)          o_lat [T,H,C]
//!        → wkb(o_lat, W_vb) {n_head H, in_dim C, out_dim V, rope_tail 0}      // [T,H,V]
//! ```
//!
//! Legality: per head, per token, wkb IN computes exactly the head_mat_mul rows followed by the
//! copied tail that the concat produces (with x = q2 the slices only re-read q2, so reading q2
//! directly is the same data); wkb OUT is head_mat_mul itself, one launch over all heads. The
//! reshape to [T, H·V] after OUT stays a reshape node. Every `head_mat_mul` left after IN is an
//! OUT match. The replaced nodes are removed when nothing else reads them. Returns the number of
//! `wkb` nodes made.

use super::{add_typed, args_of, last_of, name_of, remove_dead, slice_of, weight_of};
use crate::error::CompileError;
use crate::ir::{Graph, NodeId};
use crate::ops::Op;
use crate::types::{Attrs, Dim};

const STAGE: &str = "fuse_wkb";

/// Fuses every absorbed projection; returns how many `wkb` nodes it made.
///
/// Errors: [`CompileError::Verify`] (stage `fuse_wkb`) if a replacement fails its rule (a pass
/// bug).
pub fn run(g: &mut Graph) -> Result<usize, CompileError> {
    let mut made = 0;
    for n in nodes_of(g, Op::Concat) {
        let Some((hm, w, a, b, attrs)) = match_in(g, n) else {
            continue;
        };
        let x = match (slice_of(g, a), slice_of(g, b)) {
            (Some((y, 0, n_in)), Some((y2, off, tail)))
                if y == y2 && off == n_in && last_of(g, y) == Some(n_in + tail) =>
            {
                y
            }
            _ => add_typed(g, STAGE, Op::Concat, Attrs::None, &[a, b], String::new())?,
        };
        let name = name_of(g, n);
        let k = add_typed(g, STAGE, Op::Wkb, attrs, &[x, w], name)?;
        g.replace_uses(n, k);
        g.g.remove_node(n);
        remove_dead(g, &[hm, a, b]);
        made += 1;
    }
    for n in nodes_of(g, Op::HeadMatMul) {
        let Some((w, x, attrs)) = match_out(g, n) else {
            continue;
        };
        let name = name_of(g, n);
        let k = add_typed(g, STAGE, Op::Wkb, attrs, &[x, w], name)?;
        g.replace_uses(n, k);
        g.g.remove_node(n);
        made += 1;
    }
    Ok(made)
}

fn nodes_of(g: &Graph, op: Op) -> Vec<NodeId> {
    g.g.node_indices()
        .filter(|&n| g.node(n).and_then(|x| x.op()) == Some(op))
        .collect()
}

/// IN at concat node `n`: (head_mat_mul, weight, a, b, wkb attrs).
fn match_in(g: &Graph, n: NodeId) -> Option<(NodeId, NodeId, NodeId, NodeId, Attrs)> {
    let (_, cat) = args_of(g, n, Op::Concat, 2)?;
    let (hm, b) = (cat[0], cat[1]);
    let (
        w,
        a,
        Attrs::Wkb {
            n_head,
            in_dim,
            out_dim,
            ..
        },
    ) = match_out(g, hm)?
    else {
        return None;
    };
    let b_ty = g.node(b)?.ty.as_ref()?;
    if b_ty.shape.0.len() != 3 || b_ty.shape.0[1] != Dim::Fixed(n_head) {
        return None;
    }
    let rope_tail = b_ty.shape.last_fixed()?;
    let attrs = Attrs::Wkb {
        n_head,
        in_dim,
        out_dim,
        rope_tail,
    };
    Some((hm, w, a, b, attrs))
}

/// OUT at head_mat_mul node `n`: (weight, x, wkb attrs with rope_tail 0).
fn match_out(g: &Graph, n: NodeId) -> Option<(NodeId, NodeId, Attrs)> {
    let (_, hm) = args_of(g, n, Op::HeadMatMul, 2)?;
    let ne = &weight_of(g, hm[0])?.ne;
    let &[in_dim, out_dim, n_head] = ne.as_slice() else {
        return None;
    };
    let attrs = Attrs::Wkb {
        n_head,
        in_dim,
        out_dim,
        rope_tail: 0,
    };
    Some((hm[0], hm[1], attrs))
}
