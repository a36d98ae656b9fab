//! PHASE: the rotary phase of MLA — YaRN RoPE on every head's q_pe and on the shared k_pe, the
//! Llama-4 query temperature, the RMSNorm of c_kv and the latent-cache write — as one node.
//!
//! Algorithm note. Names: H heads, N = qk_nope_head_dim, R = qk_rope_head_dim, C =
//! kv_lora_rank, T tokens. Matches, per layer, what the description builds (after `fuse_kqkv`):
//!
//! ```text
//! kv    = concat(rms_norm(slice(kv_a, 0, C), w_norm; eps),
//!                reshape(rope_yarn(reshape(slice(kv_a, C, R); [T,1,R]), pos); [T,R]))
//! cache = cache_write(kv, pos) {layer}
//! q_abs = concat(head_mat_mul(W_kb, slice(q, 0, N)), rope_yarn(slice(q, N, R), pos))
//! q_abs = attn_temperature(q_abs, pos)          // only when the file states a temperature
//! o_lat = kqkv(q_abs, pos, cache)
//! ```
//!
//! and rewrites it to
//!
//! ```text
//! q2    = phase(q, kv_a, w_norm, pos) {layer, rope, temperature, eps, n_head, nope, rope_dim, kv_lora}
//! o_lat = kqkv(concat(head_mat_mul(W_kb, slice(q2, 0, N)), slice(q2, N, R)), pos)
//! ```
//!
//! where `q2[t,h,:N] = q[t,h,:N]·f(pos[t])`, `q2[t,h,N:] = rope_yarn(q[t,h,N:], pos[t])·f(pos[t])`
//! (f the temperature factor, 1 without one) and the phase writes `[rms_norm(kv_a[t,:C])·w,
//! rope_yarn(kv_a[t,C:], pos[t])]` into row pos[t] of the layer's latent cache, exactly as the
//! `cache_write` did. Legality: f is a per-token scalar and W_kb is linear, so W_kb·(f·x) =
//! f·(W_kb·x) (a change of rounding order only); q and k use one set of YaRN parameters and the
//! same `pos`; the write's only reader is that one `kqkv` (a `phase` has no cache-view output for
//! unfused readers, so without `fuse_kqkv` nothing matches), and the data dependency phase →
//! head_mat_mul/wkb → kqkv orders the read after the write. The `cache_write` and the old `kqkv`
//! are removed, and the rest of the replaced subgraph when nothing else reads it. Returns the
//! number of `phase` nodes made.

use super::{add_typed, args_of, last_of, name_of, remove_dead, slice_of, weight_of};
use crate::config::YarnParams;
use crate::error::CompileError;
use crate::ir::{Graph, NodeId};
use crate::ops::Op;
use crate::types::{Attrs, Dim};

const STAGE: &str = "fuse_phase";

/// The matched subgraph of one layer.
struct Matched {
    kqkv: NodeId,
    kqkv_attrs: Attrs,
    cache: NodeId,
    q: NodeId,
    kv_a: NodeId,
    w_norm: NodeId,
    w_kb: NodeId,
    pos: NodeId,
    nope: usize,
    rope_dim: usize,
    phase: Attrs,
    /// Names of q_nope, the roped q_pe, head_mat_mul and q_abs, for the rebuilt nodes.
    names: [String; 4],
    /// The replaced nodes, readers before operands, removed when nothing else reads them.
    replaced: Vec<NodeId>,
}

/// Fuses the rotary phase of every matching layer; returns how many `phase` nodes it made.
///
/// Errors: [`CompileError::Verify`] (stage `fuse_phase`) if a rebuilt node fails its rule (a pass
/// bug).
pub fn run(g: &mut Graph) -> Result<usize, CompileError> {
    let candidates: Vec<NodeId> =
        g.g.node_indices()
            .filter(|&n| g.node(n).and_then(|x| x.op()) == Some(Op::Kqkv))
            .collect();
    let mut made = 0;
    for n in candidates {
        let Some(m) = matches(g, n) else { continue };
        let (nope, rope_dim, q_name) = (m.nope, m.rope_dim, name_of(g, m.q));
        let q2_name = if q_name.is_empty() {
            q_name
        } else {
            format!("{q_name}2")
        };
        let [nope_name, pe_name, hm_name, q_abs_name] = m.names;
        let args = [m.q, m.kv_a, m.w_norm, m.pos];
        let q2 = add_typed(g, STAGE, Op::Phase, m.phase, &args, q2_name)?;
        let slice = |offset, len| Attrs::Slice { offset, len };
        let q_nope = add_typed(g, STAGE, Op::Slice, slice(0, nope), &[q2], nope_name)?;
        let q_pe = add_typed(g, STAGE, Op::Slice, slice(nope, rope_dim), &[q2], pe_name)?;
        let hm_args = [m.w_kb, q_nope];
        let q_lat = add_typed(g, STAGE, Op::HeadMatMul, Attrs::None, &hm_args, hm_name)?;
        let concat_args = [q_lat, q_pe];
        let q_abs = add_typed(g, STAGE, Op::Concat, Attrs::None, &concat_args, q_abs_name)?;
        let kqkv_name = name_of(g, m.kqkv);
        let kqkv_args = [q_abs, m.pos];
        let kqkv = add_typed(g, STAGE, Op::Kqkv, m.kqkv_attrs, &kqkv_args, kqkv_name)?;
        g.replace_uses(m.kqkv, kqkv);
        g.g.remove_node(m.kqkv);
        g.g.remove_node(m.cache);
        remove_dead(g, &m.replaced);
        made += 1;
    }
    Ok(made)
}

/// The subgraph of the note around `kqkv` node `n`, when it is there.
fn matches(g: &Graph, n: NodeId) -> Option<Matched> {
    let (kqkv_attrs, k) = args_of(g, n, Op::Kqkv, 3)?;
    let &Attrs::Kqkv {
        layer,
        kv_lora,
        rope_dim,
        ..
    } = kqkv_attrs
    else {
        return None;
    };
    let (q_abs, pos, cache) = (k[0], k[1], k[2]);
    if g.users(cache) != [n] {
        return None;
    }
    // The cache side.
    let (cw_attrs, cw) = args_of(g, cache, Op::CacheWrite, 2)?;
    if *cw_attrs != (Attrs::CacheWrite { layer }) || cw[1] != pos {
        return None;
    }
    let (_, kv) = args_of(g, cw[0], Op::Concat, 2)?;
    let (norm_attrs, norm) = args_of(g, kv[0], Op::RmsNorm, 2)?;
    let &Attrs::Eps(eps) = norm_attrs else {
        return None;
    };
    let (kv_a, 0, c) = slice_of(g, norm[0])? else {
        return None;
    };
    weight_of(g, norm[1])?;
    let (k_rope, k_rope_node, k_in) = reshaped_rope(g, kv[1], pos)?;
    let (_, k_pe) = args_of(g, k_in, Op::Reshape, 1)?;
    let (kv_a2, c2, r) = slice_of(g, k_pe[0])?;
    if kv_a2 != kv_a || c2 != c || c != kv_lora || r != rope_dim || last_of(g, kv_a)? != c + r {
        return None;
    }
    // The query side.
    let (temperature, q_cat, q_tail) = match args_of(g, q_abs, Op::AttnTemperature, 2) {
        Some((Attrs::Temperature(t), a)) if a[1] == pos => (Some(t.clone()), a[0], vec![q_abs]),
        Some(_) => return None,
        None => (None, q_abs, vec![]),
    };
    let (_, cat) = args_of(g, q_cat, Op::Concat, 2)?;
    let (_, hm) = args_of(g, cat[0], Op::HeadMatMul, 2)?;
    let w_kb = hm[0];
    weight_of(g, w_kb)?;
    let (q, 0, nope) = slice_of(g, hm[1])? else {
        return None;
    };
    let (rope_attrs, qr) = args_of(g, cat[1], Op::RopeYarn, 2)?;
    let Attrs::Rope(rope) = rope_attrs else {
        return None;
    };
    let (q2, nope2, r2) = slice_of(g, qr[0])?;
    if qr[1] != pos || q2 != q || nope2 != nope || r2 != r || *rope != k_rope {
        return None;
    }
    let q_ty = g.node(q)?.ty.as_ref()?;
    let (Dim::Fixed(n_head), Dim::Fixed(width)) = (*q_ty.shape.0.get(1)?, *q_ty.shape.0.get(2)?)
    else {
        return None;
    };
    if width != nope + r {
        return None;
    }
    let names = [
        name_of(g, hm[1]),
        name_of(g, cat[1]),
        name_of(g, cat[0]),
        name_of(g, q_abs),
    ];
    let mut replaced = q_tail;
    replaced.extend([q_cat, cat[0], hm[1], cat[1], qr[0], cw[0], kv[0], norm[0]]);
    replaced.extend([kv[1], k_rope_node, k_in, k_pe[0]]);
    Some(Matched {
        kqkv: n,
        kqkv_attrs: kqkv_attrs.clone(),
        cache,
        q,
        kv_a,
        w_norm: norm[1],
        w_kb,
        pos,
        nope,
        rope_dim: r,
        phase: Attrs::Phase {
            layer,
            rope: rope.clone(),
            temperature,
            eps,
            n_head,
            nope,
            rope_dim: r,
            kv_lora: c,
        },
        names,
        replaced,
    })
}

/// `reshape(rope_yarn(x, pos))` at `n`: the rope parameters, the rope node and `x`.
fn reshaped_rope(g: &Graph, n: NodeId, pos: NodeId) -> Option<(YarnParams, NodeId, NodeId)> {
    let (_, outer) = args_of(g, n, Op::Reshape, 1)?;
    match args_of(g, outer[0], Op::RopeYarn, 2)? {
        (Attrs::Rope(y), a) if a[1] == pos => Some((y.clone(), outer[0], a[0])),
        _ => None,
    }
}
