//! The kernels of the unfused plan steps and the mapping of every plan step onto kernel
//! builders ([`for_step`]).
//!
//! Algorithm note. Each builder mirrors the oracle lowering of its op (`crate::cpu::lower`) with
//! the GPU's parallel axes: one block per row for row ops (reductions by [`block_reduce`]), one
//! thread per element for elementwise ops (`grid = ceil(n / 256)`), one thread per key for
//! `scores_qk` / `causal_mask`, one thread per row for `top_k` / `gather_renorm` (E = 128 is too
//! short to share), and the warp-per-row mat-vec ([`super::kernels::mat_vec`]) for every product
//! with a weight, the routed experts included (`moe_gate_up`, `moe_down`, reading expert rows
//! through the per-expert address table); a dense weight's product also gets the mat-vec's tiled
//! form for `T > 1` ([`super::kernels::mat_mat`], launched by [`both_forms`]), and the routed
//! experts theirs ([`moe_forms`]: the slots grouped by expert by [`moe_route`], then tiles of one
//! expert's slots through the same K sweep, [`super::kernels::tile_sweep`]). Every builder and [`for_step`] take the warp width
//! (a power of two in 4..=64) the kernels are built for; only the reductions and the mat-vecs'
//! lane-to-row mapping depend on it. Sums whose order the oracle fixes as a plain left-to-
//! right loop (`weighted_sum`, `gather_renorm`, the slot sum of the experts) keep that order.

use super::ir::{
    block_reduce, bx, by, ci, tid, tokens, Expr, IrError, Kb, Kernel, Local, Param, ReduceOp,
    Scalar, Size, Var,
};
use super::kernels::{
    bad, check_dims, chunk_len, kqkv_merge, kqkv_split, mat_mat, mat_mat_row,
    mat_mat_rows_per_warp, mat_mat_tokens, mat_vec, phase, rope_elem, rows_per_block, size_expr,
    stage_row, temperature_factor, tile_sweep, tk, KqkvShape, MatVecShape, PhaseShape, TileRows,
    TileWeight, WeightSpec, BLOCK, MAT_VEC_STAGE_BYTES, R,
};
use super::GenError;
use aubier_compiler::config::{ExpertLayout, QueryTemperature, YarnParams};
use aubier_compiler::ops::Op;
use aubier_compiler::plan::{Operand, Plan, Value};
use aubier_compiler::types::{Attrs, DType, Dim, Shape, WeightRef};

/// The element count of a shape as a launch extent.
pub fn size_of(shape: &Shape) -> Size {
    shape.0.iter().fold(Size::Const(1), |acc, d| {
        let d = match d {
            Dim::Fixed(n) => Size::Const(*n),
            Dim::Tokens => Size::Tokens,
            Dim::Keys => Size::Keys,
        };
        match (acc, d) {
            (Size::Const(1), d) => d,
            (Size::Const(a), Size::Const(b)) => Size::Const(a * b),
            (a, d) => Size::prod(a, d),
        }
    })
}

/// `ceil(n / 256)` blocks.
fn blocks(n: &Size) -> Size {
    Size::ceil_div(n.clone(), BLOCK as usize)
}

/// Global thread index `bx·256 + tid`.
fn gid() -> Expr {
    bx() * ci(BLOCK as usize) + tid()
}

/// `embed`: `y[r, :] = row ids[r] of W` (dequantized), one block per row.
pub fn embed(name: &str, w: &WeightSpec, rows: &Size, warp: u32) -> R {
    let d = w.row_len;
    check_dims(name, &[d])?;
    let note = format!(
        "embed: y[r,:{d}] = dequant(W[ids[r]]) ({}); one block per row",
        w.ggml_type
    );
    let mut kb = Kb::new(name, note, [rows.clone(), Size::Const(1)], BLOCK, warp);
    let wp = kb.param("w", w.kind(name, false)?);
    let ids = kb.input_i32("ids", rows.clone());
    let y = kb.output_f32("y", Some(Size::prod(rows.clone(), Size::Const(d))));
    let buf = kb.local("chunk", 16);
    let id = kb.let_("id", kb.load(ids, bx()));
    kb.for_("c", tid(), ci(d.div_ceil(16)), BLOCK as i32, |kb, c| {
        kb.dequant16(wp, None, id, c.clone(), buf);
        kb.for_("i", 0, chunk_len(d, c.clone()), 1, |kb, i| {
            let v = kb.ldl(buf, i.clone());
            kb.store(y, bx() * ci(d) + c.clone() * 16 + i, v);
        });
    });
    kb.finish()
}

/// `rms_norm`: `y = (x · 1/sqrt(mean(x²) + eps)) · w` per row of `n`; `w` F32 `{n}`.
pub fn rms_norm(name: &str, n: usize, rows: &Size, eps: f32, warp: u32) -> R {
    check_dims(name, &[n])?;
    let note =
        format!("rms_norm over rows of {n} (eps {eps:?}); one block per row, block_reduce of x^2");
    let mut kb = Kb::new(name, note, [rows.clone(), Size::Const(1)], BLOCK, warp);
    let x = kb.input_f32("x", Size::prod(rows.clone(), Size::Const(n)));
    let w = kb.param(
        "w",
        WeightSpec {
            ggml_type: "F32".into(),
            row_len: n,
        }
        .kind(name, false)?,
    );
    let y = kb.output_f32("y", Some(Size::prod(rows.clone(), Size::Const(n))));
    let red = kb.reduce_scratch();
    let base = kb.let_("base", bx() * ci(n));
    let ss = kb.let_("ss", 0.0f32);
    kb.for_("i", tid(), ci(n), BLOCK as i32, |kb, i| {
        let v = kb.load(x, Expr::from(base) + i);
        kb.set(ss, Expr::from(ss) + v.clone() * v);
    });
    block_reduce(&mut kb, ReduceOp::Sum, ss, red);
    let inv = kb.let_(
        "inv",
        Expr::F(1.0) / (Expr::from(ss) / (n as f32) + eps).sqrt(),
    );
    kb.for_("i", tid(), ci(n), BLOCK as i32, |kb, i| {
        let v = kb.load(x, Expr::from(base) + i.clone());
        let wv = kb.load(w, i.clone());
        kb.store(y, Expr::from(base) + i, (v * inv) * wv);
    });
    kb.finish()
}

/// Elementwise ops over `n` elements: `add`, `mul` (two inputs), `scale` (by `c`), `silu`, and
/// `copy` (a `reshape` into another slot).
pub fn elementwise(name: &str, op: Op, n: &Size, c: f32, warp: u32) -> R {
    let binary = matches!(op, Op::Add | Op::Mul);
    let what = match op {
        Op::Add => "a + b".to_string(),
        Op::Mul => "a * b".to_string(),
        Op::Scale => format!("a * {c:?}"),
        Op::Silu => "a / (1 + exp(-a))".to_string(),
        _ => "a".to_string(),
    };
    let note = format!("elementwise y = {what} over {n} elements; one thread per element");
    let mut kb = Kb::new(name, note, [blocks(n), Size::Const(1)], BLOCK, warp);
    let a = kb.input_f32("a", n.clone());
    let b = binary.then(|| kb.input_f32("b", n.clone()));
    let y = kb.output_f32("y", Some(n.clone()));
    let i = kb.let_("i", gid());
    kb.if_(Expr::from(i).lt(size_expr(n)), |kb| {
        let x = kb.load(a, i);
        let v = match (op, b) {
            (Op::Add, Some(b)) => x + kb.load(b, i),
            (Op::Mul, Some(b)) => x * kb.load(b, i),
            (Op::Scale, _) => x * c,
            (Op::Silu, _) => x.clone() / (Expr::F(1.0) + (-x).exp()),
            _ => x,
        };
        kb.store(y, i, v);
    });
    kb.finish()
}

/// `softmax` over rows of `n` (a constant or `S`): `e^(x − max) / Σ e^(x − max)`.
pub fn softmax(name: &str, n: &Size, rows: &Size, warp: u32) -> R {
    let note = format!("softmax over rows of {n}; one block per row, block_reduce of max then sum");
    let mut kb = Kb::new(name, note, [rows.clone(), Size::Const(1)], BLOCK, warp);
    let len = Size::prod(rows.clone(), n.clone());
    let x = kb.input_f32("x", len.clone());
    let y = kb.output_f32("y", Some(len));
    let red = kb.reduce_scratch();
    let ne = size_expr(n);
    let base = kb.let_("base", bx() * ne.clone());
    let m = kb.let_("m", f32::NEG_INFINITY);
    kb.for_("i", tid(), ne.clone(), BLOCK as i32, |kb, i| {
        let v = kb.load(x, Expr::from(base) + i);
        kb.set(m, Expr::from(m).max(v));
    });
    block_reduce(&mut kb, ReduceOp::Max, m, red);
    let sum = kb.let_("sum", 0.0f32);
    kb.for_("i", tid(), ne.clone(), BLOCK as i32, |kb, i| {
        let e = kb.let_("e", (kb.load(x, Expr::from(base) + i.clone()) - m).exp());
        kb.store(y, Expr::from(base) + i, e);
        kb.set(sum, Expr::from(sum) + e);
    });
    block_reduce(&mut kb, ReduceOp::Sum, sum, red);
    kb.for_("i", tid(), ne, BLOCK as i32, |kb, i| {
        let v = kb.load(y, Expr::from(base) + i.clone());
        kb.store(y, Expr::from(base) + i, v / sum);
    });
    kb.finish()
}

/// `rope_yarn` on rows of `d` (`per_tok` rows per token): pairs of the first `n_rot` dims
/// rotated by `pos[t]·θ_i`, the rest copied.
pub fn rope(name: &str, d: usize, per_tok: usize, p: &YarnParams, warp: u32) -> R {
    check_dims(name, &[d, per_tok, p.n_rot])?;
    if !p.n_rot.is_multiple_of(2) || p.n_rot > d {
        return Err(bad(name, "n_rot must be even and at most the row width"));
    }
    let n_rot = p.n_rot;
    let rows = Size::prod(Size::Tokens, Size::Const(per_tok));
    let note = format!("rope_yarn on rows of {d} ({n_rot} rotated); one block per row");
    let mut kb = Kb::new(name, note, [rows.clone(), Size::Const(1)], BLOCK, warp);
    let x = kb.input_f32("x", Size::prod(rows.clone(), Size::Const(d)));
    let pos = kb.input_i32("pos", Size::Tokens);
    let y = kb.output_f32("y", Some(Size::prod(rows, Size::Const(d))));
    let theta = kb.table("theta", crate::cpu::yarn_inv_freq(p));
    let pf = kb.let_("pf", kb.load(pos, bx() / ci(per_tok)).to_f32());
    let base = kb.let_("base", bx() * ci(d));
    kb.for_("j", tid(), ci(d), BLOCK as i32, |kb, j| {
        kb.if_else(
            j.clone().lt(ci(n_rot)),
            |kb| {
                let pair = Expr::from(base) + (j.clone() / 2) * 2;
                let x0 = kb.load(x, pair.clone());
                let x1 = kb.load(x, pair + 1);
                let v = rope_elem(kb, theta, p.attn_factor, pf.into(), j.clone(), x0, x1);
                kb.store(y, Expr::from(base) + j.clone(), v);
            },
            |kb| {
                let v = kb.load(x, Expr::from(base) + j.clone());
                kb.store(y, Expr::from(base) + j.clone(), v);
            },
        );
    });
    kb.finish()
}

/// `attn_temperature`: `y[t, ..] = x[t, ..] · (1 + β ln(1 + floor(pos[t] / L)))`, `per_tok`
/// elements per token.
pub fn temperature(name: &str, per_tok: usize, q: &QueryTemperature, warp: u32) -> R {
    check_dims(name, &[per_tok, q.length])?;
    let note = format!("attn_temperature over {per_tok} elements per token; one block per token");
    let mut kb = Kb::new(name, note, [Size::Tokens, Size::Const(1)], BLOCK, warp);
    let len = Size::prod(Size::Tokens, Size::Const(per_tok));
    let x = kb.input_f32("x", len.clone());
    let pos = kb.input_i32("pos", Size::Tokens);
    let y = kb.output_f32("y", Some(len));
    let p = kb.load(pos, bx());
    let f = temperature_factor(&mut kb, p, q);
    kb.for_("i", tid(), ci(per_tok), BLOCK as i32, |kb, i| {
        let idx = bx() * ci(per_tok) + i;
        let v = kb.load(x, idx.clone());
        kb.store(y, idx, v * f.clone());
    });
    kb.finish()
}

/// `slice` / `concat` as row copies: `y[r, :] = [a[r, off .. off + la], b[r, 0 .. lb]]` with `a`
/// rows of `na` and `b` rows of `lb` (absent when `lb = 0`).
pub fn copy_rows(
    name: &str,
    rows: &Size,
    na: usize,
    off: usize,
    la: usize,
    lb: usize,
    warp: u32,
) -> R {
    check_dims(name, &[na, la, lb + 1])?;
    let w = la + lb;
    let note = format!(
        "row copy: y[r,:{w}] = [a[r,{off}..{}]{}]; one block per row",
        off + la,
        if lb > 0 {
            format!(", b[r,..{lb}]")
        } else {
            String::new()
        }
    );
    let mut kb = Kb::new(name, note, [rows.clone(), Size::Const(1)], BLOCK, warp);
    let a = kb.input_f32("a", Size::prod(rows.clone(), Size::Const(na)));
    let b = (lb > 0).then(|| kb.input_f32("b", Size::prod(rows.clone(), Size::Const(lb))));
    let y = kb.output_f32("y", Some(Size::prod(rows.clone(), Size::Const(w))));
    kb.for_("i", tid(), ci(w), BLOCK as i32, |kb, i| {
        let dst = bx() * ci(w) + i.clone();
        match b {
            Some(b) => kb.if_else(
                i.clone().lt(ci(la)),
                |kb| {
                    let v = kb.load(a, bx() * ci(na) + ci(off) + i.clone());
                    kb.store(y, dst.clone(), v);
                },
                |kb| {
                    let v = kb.load(b, bx() * ci(lb) + i.clone() - ci(la));
                    kb.store(y, dst.clone(), v);
                },
            ),
            None => {
                let v = kb.load(a, bx() * ci(na) + ci(off) + i.clone());
                kb.store(y, dst, v);
            }
        }
    });
    kb.finish()
}

/// `cache_write`: `cache[pos[t], :] = kv[t, :]` (rows of `w`), one block per token.
pub fn cache_write(name: &str, w: usize, warp: u32) -> R {
    check_dims(name, &[w])?;
    let note = format!("cache_write: cache[pos[t],:{w}] = kv[t,:]; one block per token");
    let mut kb = Kb::new(name, note, [Size::Tokens, Size::Const(1)], BLOCK, warp);
    let kv = kb.input_f32("kv", Size::prod(Size::Tokens, Size::Const(w)));
    let pos = kb.input_i32("pos", Size::Tokens);
    let cache = kb.output_f32("cache", None);
    let row = kb.let_("row", kb.load(pos, bx()) * ci(w));
    kb.for_("i", tid(), ci(w), BLOCK as i32, |kb, i| {
        let v = kb.load(kv, bx() * ci(w) + i.clone());
        kb.store(cache, Expr::from(row) + i, v);
    });
    kb.finish()
}

/// `scores_qk`: `y[r, j] = q[r, :] · k[j, :]` (rows of `w`), one thread per key.
pub fn scores_qk(name: &str, w: usize, rows: &Size, warp: u32) -> R {
    check_dims(name, &[w])?;
    let note =
        format!("scores_qk: y[r,j] = q[r,:{w}] . k[j,:]; one thread per key, sequential dot");
    let grid = [blocks(&Size::Keys), rows.clone()];
    let mut kb = Kb::new(name, note, grid, BLOCK, warp);
    let q = kb.input_f32("q", Size::prod(rows.clone(), Size::Const(w)));
    let k = kb.input_f32("k", Size::prod(Size::Keys, Size::Const(w)));
    let y = kb.output_f32("y", Some(Size::prod(rows.clone(), Size::Keys)));
    let j = kb.let_("j", gid());
    kb.if_(Expr::from(j).lt(super::ir::keys()), |kb| {
        let d = kb.let_("dot", 0.0f32);
        kb.for_("i", 0, ci(w), 1, |kb, i| {
            let qv = kb.load(q, by() * ci(w) + i.clone());
            let kv = kb.load(k, Expr::from(j) * ci(w) + i);
            kb.set(d, Expr::from(d) + qv * kv);
        });
        kb.store(y, by() * super::ir::keys() + j, d);
    });
    kb.finish()
}

/// `causal_mask`: `y[r, j] = j > pos[r / per_tok] ? −∞ : x[r, j]`.
pub fn causal_mask(name: &str, per_tok: usize, rows: &Size, warp: u32) -> R {
    check_dims(name, &[per_tok])?;
    let note = "causal_mask: keys after pos[t] set to -inf; one thread per key".to_string();
    let grid = [blocks(&Size::Keys), rows.clone()];
    let mut kb = Kb::new(name, note, grid, BLOCK, warp);
    let len = Size::prod(rows.clone(), Size::Keys);
    let x = kb.input_f32("x", len.clone());
    let pos = kb.input_i32("pos", Size::Tokens);
    let y = kb.output_f32("y", Some(len));
    let j = kb.let_("j", gid());
    kb.if_(Expr::from(j).lt(super::ir::keys()), |kb| {
        let idx = by() * super::ir::keys() + j;
        let p = kb.load(pos, by() / ci(per_tok));
        let v = kb.load(x, idx.clone());
        kb.store(y, idx, p.lt(j).select(f32::NEG_INFINITY, v));
    });
    kb.finish()
}

/// Keys per iteration of [`weighted_sum`]'s loop, written out: lavapipe (gallivm) ends the loops
/// of a shader invocation after 65 535 iterations in all, which one key per iteration passes
/// past 65 535 keys; runs of 64 keys, then the remaining keys one at a time (the same order),
/// take `S/64 + 63` iterations at most (4 096 at 262 144 keys).
const KEY_RUN: usize = 64;

/// `weighted_sum`: `y[r, c] = Σ_j p[r, j] · v[j, c]`, `j` ascending, `c < len`, `v` rows of `w`.
pub fn weighted_sum(name: &str, w: usize, len: usize, rows: &Size, warp: u32) -> R {
    check_dims(name, &[w, len])?;
    let note = format!(
        "weighted_sum: y[r,c] = sum_j p[r,j] v[j,c] for c < {len}, j ascending; one block per row"
    );
    let mut kb = Kb::new(name, note, [rows.clone(), Size::Const(1)], BLOCK, warp);
    let p = kb.input_f32("p", Size::prod(rows.clone(), Size::Keys));
    let v = kb.input_f32("v", Size::prod(Size::Keys, Size::Const(w)));
    let y = kb.output_f32("y", Some(Size::prod(rows.clone(), Size::Const(len))));
    kb.for_("c", tid(), ci(len), BLOCK as i32, |kb, c| {
        let acc = kb.let_("acc", 0.0f32);
        let term = |kb: &mut Kb, j: Expr| {
            let pv = kb.load(p, bx() * super::ir::keys() + j.clone());
            let vv = kb.load(v, j * ci(w) + c.clone());
            kb.set(acc, Expr::from(acc) + pv * vv);
        };
        let whole = super::ir::keys() / ci(KEY_RUN) * ci(KEY_RUN);
        kb.for_("j0", 0, whole.clone(), KEY_RUN as i32, |kb, j0| {
            for i in 0..KEY_RUN {
                term(kb, j0.clone() + ci(i));
            }
        });
        kb.for_("j", whole, super::ir::keys(), 1, term);
        kb.store(y, bx() * ci(len) + c, acc);
    });
    kb.finish()
}

/// `top_k`: per row of `e`, the `k` largest in descending order, ties to the lower id, NaN never
/// picked, −1 when no candidate is left (the oracle's selection passes); one thread per row.
pub fn top_k(name: &str, e: usize, k: usize, rows: &Size, warp: u32) -> R {
    check_dims(name, &[e, k])?;
    let note =
        format!("top_k: {k} of {e} by repeated selection (value desc, id asc); one thread per row");
    let mut kb = Kb::new(name, note, [blocks(rows), Size::Const(1)], BLOCK, warp);
    let p = kb.input_f32("p", Size::prod(rows.clone(), Size::Const(e)));
    let y = kb.output_i32("ids", Size::prod(rows.clone(), Size::Const(k)));
    let r = kb.let_("r", gid());
    kb.if_(Expr::from(r).lt(size_expr(rows)), |kb| {
        let pv = kb.let_("prev_v", f32::INFINITY);
        let pi = kb.let_("prev_i", -1i32);
        kb.for_("j", 0, ci(k), 1, |kb, j| {
            let bv = kb.let_("best_v", f32::INFINITY);
            let bi = kb.let_("best_i", -1i32);
            kb.for_("i", 0, ci(e), 1, |kb, i| {
                let v = kb.let_("v", kb.load(p, Expr::from(r) * ci(e) + i.clone()));
                let cand = Expr::from(v)
                    .lt(pv)
                    .or(Expr::from(v).eq(pv).and(Expr::from(pi).lt(i.clone())));
                let wins = Expr::from(bi).lt(0).or(Expr::from(bv).lt(v));
                kb.if_(cand.and(wins), |kb| {
                    kb.set(bv, v);
                    kb.set(bi, i);
                });
            });
            kb.store(y, Expr::from(r) * ci(k) + j, bi);
            kb.set(pv, bv);
            kb.set(pi, bi);
        });
    });
    kb.finish()
}

/// The expert id at `at` of `ids`, read as at least 0: `top_k` writes −1 where a router row
/// has no number (NaN logits), and a kernel must not form an address before the expert table.
/// The host refuses such a run when it reads the ids back (`check_expert_ids` in the runtime's
/// session), so the value computed from expert 0 is never used.
fn expert_id(kb: &Kb, ids: Param, at: Expr) -> Expr {
    kb.load(ids, at).max(0)
}

/// `gather_renorm`: `y[r, j] = p[r, ids[r, j]] / Σ_j p[r, ids[r, j]] · scale` (without renorm:
/// `p · scale`); one thread per row.
pub fn gather_renorm(
    name: &str,
    e: usize,
    k: usize,
    rows: &Size,
    renorm: bool,
    scale: f32,
    warp: u32,
) -> R {
    check_dims(name, &[e, k])?;
    let note = format!(
        "gather_renorm of {k} of {e} (renorm {renorm}, scale {scale:?}); one thread per row"
    );
    let mut kb = Kb::new(name, note, [blocks(rows), Size::Const(1)], BLOCK, warp);
    let p = kb.input_f32("p", Size::prod(rows.clone(), Size::Const(e)));
    let ids = kb.input_i32("ids", Size::prod(rows.clone(), Size::Const(k)));
    let y = kb.output_f32("y", Some(Size::prod(rows.clone(), Size::Const(k))));
    let r = kb.let_("r", gid());
    kb.if_(Expr::from(r).lt(size_expr(rows)), |kb| {
        let pick = |kb: &Kb, j: Expr| {
            let id = expert_id(kb, ids, Expr::from(r) * ci(k) + j);
            kb.load(p, Expr::from(r) * ci(e) + id)
        };
        let sum = kb.let_("sum", 0.0f32);
        if renorm {
            kb.for_("j", 0, ci(k), 1, |kb, j| {
                let v = pick(kb, j);
                kb.set(sum, Expr::from(sum) + v);
            });
        }
        kb.for_("j", 0, ci(k), 1, |kb, j| {
            let v = pick(kb, j.clone());
            let v = if renorm { v / sum } else { v };
            kb.store(y, Expr::from(r) * ci(k) + j, v * scale);
        });
    });
    kb.finish()
}

/// The routed experts' first half: `act[s, f] = silu(gate_e[f]·h[t]) · (up_e[f + up_off]·h[t])`
/// for slot `s` (token `t = s / k`, expert `e = ids[s]`), one warp per `f`.
pub fn moe_gate_up(
    name: &str,
    gate: &WeightSpec,
    up: Option<&WeightSpec>,
    n_ff: usize,
    k: usize,
    warp: u32,
) -> R {
    let d = gate.row_len;
    check_dims(name, &[d, n_ff, k])?;
    let up_off = if up.is_none() { n_ff } else { 0 };
    let note = format!(
        "moe gate/up: act[s,f] = silu(gate_e[f].h[t]) * (up_e[f].h[t]) over the selected experts ({}); one warp per f{}",
        gate.ggml_type,
        if d * 4 <= MAT_VEC_STAGE_BYTES {
            ", h[t] staged in shared memory"
        } else {
            ""
        }
    );
    let rows = rows_per_block(warp);
    let slots = Size::prod(Size::Tokens, Size::Const(k));
    let grid = [Size::Const(n_ff.div_ceil(rows)), slots.clone()];
    let mut kb = Kb::new(name, note, grid, BLOCK, warp);
    let h = kb.input_f32("h", Size::prod(Size::Tokens, Size::Const(d)));
    let ids = kb.input_i32("ids", slots.clone());
    let wg = kb.param("gate", gate.kind(name, true)?);
    let wu = match up {
        Some(u) => kb.param("up", u.kind(name, true)?),
        None => wg,
    };
    let act = kb.output_f32("act", Some(Size::prod(slots, Size::Const(n_ff))));
    let gb = kb.local("gchunk", 16);
    let ub = kb.local("uchunk", 16);
    let lane = kb.let_("lane", tid() % warp as i32);
    let f = kb.let_("f", bx() * ci(rows) + tid() / warp as i32);
    let fr = kb.let_("fr", Expr::from(f).min(ci(n_ff - 1)));
    let e = kb.let_("e", expert_id(&kb, ids, by()));
    let hb = kb.let_("hb", (by() / ci(k)) * ci(d));
    let staged = stage_row(&mut kb, h, hb, d);
    let g = kb.let_("g", 0.0f32);
    let u = kb.let_("u", 0.0f32);
    kb.for_("c", lane, ci(d.div_ceil(16)), warp as i32, |kb, c| {
        kb.dequant16(wg, Some(e.into()), fr, c.clone(), gb);
        kb.dequant16(
            wu,
            Some(e.into()),
            Expr::from(fr) + ci(up_off),
            c.clone(),
            ub,
        );
        staged.chunk(kb, c, d, |kb, i, x| {
            let xv = kb.let_("xv", x);
            kb.set(g, Expr::from(g) + kb.ldl(gb, i.clone()) * xv);
            kb.set(u, Expr::from(u) + kb.ldl(ub, i) * xv);
        });
    });
    kb.warp_reduce(ReduceOp::Sum, g);
    kb.warp_reduce(ReduceOp::Sum, u);
    kb.if_(
        Expr::from(lane).eq(0).and(Expr::from(f).lt(ci(n_ff))),
        |kb| kb.store(act, by() * ci(n_ff) + f, swiglu(g, u)),
    );
    kb.finish()
}

/// `silu(g) · u` = `g / (1 + e^(−g)) · u`, the routed experts' activation.
fn swiglu(g: Var, u: Var) -> Expr {
    Expr::from(g) / (Expr::F(1.0) + (-Expr::from(g)).exp()) * u
}

/// The routed experts' second half: `y[t, o] = Σ_j w[t, j] · (down_e[o] · act[t·k + j])`, slots
/// in order, one warp per `o`.
pub fn moe_down(name: &str, down: &WeightSpec, d: usize, k: usize, warp: u32) -> R {
    let n_ff = down.row_len;
    check_dims(name, &[d, n_ff, k])?;
    let note = format!(
        "moe down: y[t,o] = sum_j w[t,j] (down_e[o].act[t,j]) ({}); one warp per o{}",
        down.ggml_type,
        if n_ff * 4 <= MAT_VEC_STAGE_BYTES {
            ", each slot's act row staged in shared memory"
        } else {
            ""
        }
    );
    let rows = rows_per_block(warp);
    let slots = Size::prod(Size::Tokens, Size::Const(k));
    let grid = [Size::Const(d.div_ceil(rows)), Size::Tokens];
    let mut kb = Kb::new(name, note, grid, BLOCK, warp);
    let ids = kb.input_i32("ids", slots.clone());
    let wts = kb.input_f32("wts", slots.clone());
    let wd = kb.param("down", down.kind(name, true)?);
    let act = kb.input_f32("act", Size::prod(slots, Size::Const(n_ff)));
    let y = kb.output_f32("y", Some(Size::prod(Size::Tokens, Size::Const(d))));
    let buf = kb.local("chunk", 16);
    let lane = kb.let_("lane", tid() % warp as i32);
    let o = kb.let_("o", bx() * ci(rows) + tid() / warp as i32);
    let orow = kb.let_("orow", Expr::from(o).min(ci(d - 1)));
    let total = kb.let_("total", 0.0f32);
    kb.for_("j", 0, ci(k), 1, |kb, j| {
        let slot = kb.let_("slot", by() * ci(k) + j);
        let e = kb.let_("e", expert_id(kb, ids, slot.into()));
        let ab = kb.let_("ab", Expr::from(slot) * ci(n_ff));
        let staged = stage_row(kb, act, ab, n_ff);
        let acc = kb.let_("acc", 0.0f32);
        kb.for_("c", lane, ci(n_ff.div_ceil(16)), warp as i32, |kb, c| {
            kb.dequant16(wd, Some(e.into()), orow, c.clone(), buf);
            staged.chunk(kb, c, n_ff, |kb, i, av| {
                kb.set(acc, Expr::from(acc) + kb.ldl(buf, i) * av);
            });
        });
        if staged.is_shared() {
            // Every warp is done with this slot's row before the next slot overwrites it.
            kb.barrier();
        }
        kb.warp_reduce(ReduceOp::Sum, acc);
        let wv = kb.load(wts, slot);
        kb.set(total, Expr::from(total) + Expr::from(acc) * wv);
    });
    kb.if_(Expr::from(lane).eq(0).and(Expr::from(o).lt(ci(d))), |kb| {
        kb.store(y, by() * ci(d) + o, total);
    });
    kb.finish()
}

/// Tiles of the MoE mat-mat's route at `T` tokens, `k` slots each, `n_exp` experts and tiles of
/// `tt` rows: at most `ceil(T·k / tt) + n_exp` (each expert's routed rows fill whole tiles but
/// its last).
fn route_tiles(n_exp: usize, k: usize, tt: usize) -> Size {
    Size::sum(Size::ceil_div(tk(k), tt), Size::Const(n_exp))
}

/// Elements of the route scratch ([`moe_route`]): `1 + 3·tiles + T·k`.
fn route_len(n_exp: usize, k: usize, tt: usize) -> Size {
    Size::sum(
        Size::Const(1),
        Size::sum(Size::prod(Size::Const(3), route_tiles(n_exp, k, tt)), tk(k)),
    )
}

/// Index in the route of the slot list's first entry, `1 + 3·tiles`, as a kernel expression.
fn route_slots(n_exp: usize, k: usize, tt: usize) -> Expr {
    ci(1) + ci(3) * size_expr(&route_tiles(n_exp, k, tt))
}

/// The MoE mat-mat's grouping: the `T·k` routed slots (`s = t·k + j`, expert `ids[s]`) listed by
/// expert, and the tiles of up to `TT` = [`mat_mat_tokens`] rows the tiled kernels take. Writes
/// the i32 scratch `route` ([`route_len`]): `route[0]` the number of tiles, `route[1 + 3i ..]`
/// tile `i`'s expert and the first and end positions of its rows in the slot list, which
/// starts at `1 + 3·(ceil(T·k / TT) + E)` and holds each expert's slots in ascending order,
/// experts in ascending order. Ids below 0 count as expert 0 (as [`moe_gate_up`] reads them);
/// ids of `E` or more are routed nowhere.
///
/// Algorithm: one block; thread `i` owns the contiguous slots `i·c .. i·c + c`
/// (`c = ceil(T·k / 256)`). For each expert in turn every thread counts its slots of that
/// expert, a Hillis–Steele scan over the block's counts gives each thread its first position
/// (so the list is in slot order, the same on every run), the threads write their slots there,
/// and threads `0, 1, …` write the expert's `ceil(count / TT)` tiles. Integer work only.
pub fn moe_route(name: &str, n_exp: usize, k: usize, warp: u32) -> R {
    check_dims(name, &[n_exp, k])?;
    let tt = mat_mat_tokens(warp);
    let note = format!(
        "moe route: the T*{k} slots listed by expert ({n_exp} experts, slot order) and cut into tiles of {tt};\n\
         one block, a count and a block scan per expert"
    );
    let grid = [Size::Const(1), Size::Const(1)];
    let mut kb = Kb::new(name, note, grid, BLOCK, warp);
    let ids = kb.input_i32("ids", tk(k));
    let route = kb.output_i32("route", route_len(n_exp, k, tt));
    let scan = kb.shared("scan", Scalar::I32, BLOCK as usize);
    let n = kb.let_("n", tokens() * ci(k));
    let per = kb.let_(
        "per",
        (Expr::from(n) + ci(BLOCK as usize - 1)) / ci(BLOCK as usize),
    );
    let lo = kb.let_("lo", (tid() * per).min(n));
    let hi = kb.let_("hi", (Expr::from(lo) + per).min(n));
    let sl = kb.let_("sl", route_slots(n_exp, k, tt));
    let base = kb.let_("base", 0);
    let nt = kb.let_("nt", 0);
    let v = kb.let_("v", 0);
    kb.for_("e", 0, ci(n_exp), 1, |kb, e| {
        let cnt = kb.let_("cnt", 0);
        kb.for_("s", lo, hi, 1, |kb, s| {
            let hit = expert_id(kb, ids, s).eq(e.clone());
            kb.set(cnt, Expr::from(cnt) + hit);
        });
        kb.sts(scan, tid(), cnt);
        kb.barrier();
        let mut off = 1;
        while off < BLOCK as usize {
            let left = kb.lds(scan, (tid() - ci(off)).max(0));
            let sum = kb.lds(scan, tid()) + ci(off).le(tid()).select(left, 0);
            kb.set(v, sum);
            kb.barrier();
            kb.sts(scan, tid(), v);
            kb.barrier();
            off *= 2;
        }
        let total = kb.let_("total", kb.lds(scan, ci(BLOCK as usize - 1)));
        let pos = kb.let_("pos", Expr::from(base) + kb.lds(scan, tid()) - cnt);
        kb.for_("s", lo, hi, 1, |kb, s| {
            let hit = expert_id(kb, ids, s.clone()).eq(e.clone());
            kb.if_(hit, |kb| {
                kb.store(route, Expr::from(sl) + pos, s);
                kb.set(pos, Expr::from(pos) + 1);
            });
        });
        let tiles = kb.let_("tiles", (Expr::from(total) + ci(tt - 1)) / ci(tt));
        kb.for_("i", tid(), tiles, BLOCK as i32, |kb, i| {
            let at = ci(1) + (Expr::from(nt) + i.clone()) * 3;
            let first = Expr::from(base) + i * ci(tt);
            kb.store(route, at.clone(), e.clone());
            kb.store(route, at.clone() + 1, first.clone());
            kb.store(
                route,
                at + 2,
                (first + ci(tt)).min(Expr::from(base) + total),
            );
        });
        kb.set(base, Expr::from(base) + total);
        kb.set(nt, Expr::from(nt) + tiles);
        // Every thread has read this expert's scan before the next expert's counts overwrite it.
        kb.barrier();
    });
    kb.if_(tid().eq(0), |kb| kb.store(route, 0, nt));
    kb.finish()
}

/// The routed rows of an MoE mat-mat tile: `x` rows of `n_in` elements, row `s` of the slot
/// list at `x[base(s)]`.
struct MoeRows<'a> {
    x: Param,
    n_in: usize,
    base: &'a dyn Fn(Expr) -> Expr,
}

/// What an MoE mat-mat writes for one routed row: `(kb, slot, output row, its sums)`.
type TileStore<'a> = dyn Fn(&mut Kb, Expr, Var, &[Var]) + 'a;

/// The frame both MoE mat-mats share: block row `by` takes tile `by` of `route` (expert `e`,
/// up to `TT` slots; a block past the last tile does nothing), warp `g` of block `bx` the `rpw`
/// output rows `o_r = (bx·rpw + r)·(256 / W) + g` of `n_out` ([`mat_mat_row`]); the weights
/// `weights(e, min(o_r, n_out − 1), r)` of all `r` are swept together over the tile's rows
/// ([`tile_sweep`]), each (output row, tile row)'s accumulators reduced by the butterfly, and
/// lane 0 hands `store(kb, s, o_r, accs)` each slot and its sums (one per weight of row `r`).
fn moe_tile(
    kb: &mut Kb,
    route: Param,
    (n_exp, k, n_out): (usize, usize, usize),
    rows: &MoeRows<'_>,
    rpw: usize,
    weights: &dyn Fn(Var, Var, usize) -> Vec<TileWeight>,
    store: &TileStore<'_>,
) {
    let (warp, tt) = (kb.warp(), mat_mat_tokens(kb.warp()));
    let lane = kb.let_("lane", tid() % warp as i32);
    let mut os = Vec::with_capacity(rpw);
    for r in 0..rpw {
        let o = kb.let_(&format!("o{r}"), mat_mat_row(warp, rpw, r));
        let orow = kb.let_(&format!("orow{r}"), Expr::from(o).min(ci(n_out - 1)));
        os.push((o, orow));
    }
    let sl = kb.let_("sl", route_slots(n_exp, k, tt));
    let used = kb.let_("used", by().lt(kb.load(route, 0)));
    let at = kb.let_("at", ci(1) + by() * 3);
    let read =
        |kb: &Kb, i: usize| Expr::from(used).select(kb.load(route, Expr::from(at) + ci(i)), 0);
    let e = kb.let_("e", read(kb, 0));
    let first = kb.let_("first", read(kb, 1));
    let len = kb.let_("len", read(kb, 2) - first);
    let slot = |kb: &Kb, r: Expr| kb.load(route, Expr::from(sl) + first + r);
    // `len` is the same for the whole block: it takes a tile or leaves at once.
    kb.if_(ci(0).lt(len), |kb| {
        let tile_rows = TileRows {
            valid: &|r| r.lt(len),
            base: &|kb, r| (rows.base)(slot(kb, r)),
        };
        let per_row: Vec<Vec<TileWeight>> = os
            .iter()
            .enumerate()
            .map(|(r, &(_, orow))| weights(e, orow, r))
            .collect();
        let n_w = per_row.first().map_or(0, Vec::len);
        let ws: Vec<TileWeight> = per_row.into_iter().flatten().collect();
        let accs = tile_sweep(kb, lane, rows.x, rows.n_in, &tile_rows, &ws);
        for (r, &(o, _)) in os.iter().enumerate() {
            let of_row = &accs[r * n_w..(r + 1) * n_w];
            for j in 0..tt {
                let sums: Vec<Var> = of_row.iter().map(|a| a[j]).collect();
                for &acc in &sums {
                    kb.warp_reduce(ReduceOp::Sum, acc);
                }
                let ok = Expr::from(lane)
                    .eq(0)
                    .and(Expr::from(o).lt(ci(n_out)))
                    .and(ci(j).lt(len));
                kb.if_(ok, |kb| {
                    let s = slot(kb, ci(j));
                    store(kb, s, o, &sums);
                });
            }
        }
    });
}

/// The tiled form of [`moe_gate_up`] for `T > 1`: the same `act` bits, each expert row read
/// once per tile of up to [`mat_mat_tokens`] of the slots routed to that expert. `route` is
/// [`moe_route`]'s scratch; `grid = (ceil(n_ff / (R·256 / W)), ceil(T·k / TT) + E)` (`R` =
/// [`mat_mat_rows_per_warp`] rows `f` per warp), block row
/// `by` takes tile `by` (blocks past the last tile do nothing).
///
/// Algorithm: [`super::kernels::mat_mat`]'s (`R` rows `f` per warp, the K slices of the tile's
/// rows `h[t]` staged in shared memory, one gate and one up accumulator per `f` and row in each lane
/// summing the lane's chunks in the mat-vec's order, a butterfly per row), the rows being the
/// tile's slots `s` (token `s / k`) and the weights the tile's expert's gate and up rows; each
/// result goes to `act[s]`. Learned from ggml's Vulkan `mul_mm_id` path (`vulkan-shaders/
/// mul_mm.comp` with `MUL_MAT_ID`: the rows of one expert gathered into a tile so each expert
/// weight is read once per tile), with the mat-vec's order of summation kept.
pub fn moe_gate_up_mm(
    name: &str,
    gate: &WeightSpec,
    up: Option<&WeightSpec>,
    n_ff: usize,
    k: usize,
    n_exp: usize,
    warp: u32,
) -> R {
    let d = gate.row_len;
    check_dims(name, &[d, n_ff, k, n_exp])?;
    let up_off = if up.is_none() { n_ff } else { 0 };
    let rpw = mat_mat_rows_per_warp(2, n_ff, warp);
    let (rows, tt) = (rows_per_block(warp) * rpw, mat_mat_tokens(warp));
    let note = format!(
        "moe gate/up mat-mat: act[s,f] = silu(gate_e[f].h[t]) * (up_e[f].h[t]) ({}), tiles of {tt} slots routed to one expert;\n\
         {rpw} f per warp, the tile's h rows staged per K slice, each output's sum in the mat-vec's order",
        gate.ggml_type
    );
    let grid = [Size::Const(n_ff.div_ceil(rows)), route_tiles(n_exp, k, tt)];
    let mut kb = Kb::new(name, note, grid, BLOCK, warp);
    let h = kb.input_f32("h", tk(d));
    let wg = kb.param("gate", gate.kind(name, true)?);
    let wu = match up {
        Some(u) => kb.param("up", u.kind(name, true)?),
        None => wg,
    };
    let act = kb.output_f32("act", Some(Size::prod(tk(k), Size::Const(n_ff))));
    let route = kb.input_i32("route", route_len(n_exp, k, tt));
    let bufs: Vec<(Local, Local)> = (0..rpw)
        .map(|r| {
            (
                kb.local(&format!("gchunk{r}"), 16),
                kb.local(&format!("uchunk{r}"), 16),
            )
        })
        .collect();
    let weights = |e: Var, f: Var, r: usize| {
        vec![
            TileWeight {
                w: wg,
                expert: Some(e.into()),
                row: f.into(),
                buf: bufs[r].0,
            },
            TileWeight {
                w: wu,
                expert: Some(e.into()),
                row: Expr::from(f) + ci(up_off),
                buf: bufs[r].1,
            },
        ]
    };
    let rows_of = MoeRows {
        x: h,
        n_in: d,
        base: &|s| (s / ci(k)) * ci(d),
    };
    moe_tile(
        &mut kb,
        route,
        (n_exp, k, n_ff),
        &rows_of,
        rpw,
        &weights,
        &|kb, s, f, gu| kb.store(act, s * ci(n_ff) + f, swiglu(gu[0], gu[1])),
    );
    kb.finish()
}

/// The tiled form of [`moe_down`]'s products for `T > 1`: `part[s, o] = down_e[o] · act[s]` for
/// each routed slot `s` (expert `e = ids[s]`), each expert row read once per tile of the slots
/// routed to it; [`moe_combine`] then sums the slots. Same tiling as [`moe_gate_up_mm`] (`route`
/// from [`moe_route`], `grid = (ceil(d / (R·256 / W)), ceil(T·k / TT) + E)`, `R` =
/// [`mat_mat_rows_per_warp`]); each `part` has
/// the bits of [`moe_down`]'s per-slot product.
pub fn moe_down_mm(
    name: &str,
    down: &WeightSpec,
    d: usize,
    k: usize,
    n_exp: usize,
    warp: u32,
) -> R {
    let n_ff = down.row_len;
    check_dims(name, &[d, n_ff, k, n_exp])?;
    let rpw = mat_mat_rows_per_warp(1, d, warp);
    let (rows, tt) = (rows_per_block(warp) * rpw, mat_mat_tokens(warp));
    let note = format!(
        "moe down mat-mat: part[s,o] = down_e[o].act[s] ({}), tiles of {tt} slots routed to one expert;\n\
         {rpw} o per warp, the tile's act rows staged per K slice, each output's sum in the mat-vec's order",
        down.ggml_type
    );
    let grid = [Size::Const(d.div_ceil(rows)), route_tiles(n_exp, k, tt)];
    let mut kb = Kb::new(name, note, grid, BLOCK, warp);
    let wd = kb.param("down", down.kind(name, true)?);
    let act = kb.input_f32("act", Size::prod(tk(k), Size::Const(n_ff)));
    let route = kb.input_i32("route", route_len(n_exp, k, tt));
    let part = kb.output_f32("part", Some(Size::prod(tk(k), Size::Const(d))));
    let bufs: Vec<Local> = (0..rpw)
        .map(|r| kb.local(&format!("chunk{r}"), 16))
        .collect();
    let weights = |e: Var, o: Var, r: usize| {
        vec![TileWeight {
            w: wd,
            expert: Some(e.into()),
            row: o.into(),
            buf: bufs[r],
        }]
    };
    let rows_of = MoeRows {
        x: act,
        n_in: n_ff,
        base: &|s| s * ci(n_ff),
    };
    moe_tile(
        &mut kb,
        route,
        (n_exp, k, d),
        &rows_of,
        rpw,
        &weights,
        &|kb, s, o, acc| kb.store(part, s * ci(d) + o, acc[0]),
    );
    kb.finish()
}

/// The slot sum of [`moe_down_mm`]: `y[t, o] = Σ_j part[t·k + j, o] · wts[t·k + j]`, slots in
/// order from 0 (as [`moe_down`] adds them), one thread per output.
pub fn moe_combine(name: &str, d: usize, k: usize, warp: u32) -> R {
    check_dims(name, &[d, k])?;
    let note = format!("moe combine: y[t,o] = sum_j part[t*{k}+j,o] * wts[t*{k}+j], j in order; one thread per output");
    let n = tk(d);
    let mut kb = Kb::new(name, note, [blocks(&n), Size::Const(1)], BLOCK, warp);
    let wts = kb.input_f32("wts", tk(k));
    let part = kb.input_f32("part", Size::prod(tk(k), Size::Const(d)));
    let y = kb.output_f32("y", Some(n.clone()));
    let i = kb.let_("i", gid());
    kb.if_(Expr::from(i).lt(size_expr(&n)), |kb| {
        let t = kb.let_("t", Expr::from(i) / ci(d));
        let o = kb.let_("o", Expr::from(i) % ci(d));
        let total = kb.let_("total", 0.0f32);
        kb.for_("j", 0, ci(k), 1, |kb, j| {
            let slot = kb.let_("slot", Expr::from(t) * ci(k) + j);
            let p = kb.load(part, Expr::from(slot) * ci(d) + o);
            let wv = kb.load(wts, slot);
            kb.set(total, Expr::from(total) + p * wv);
        });
        kb.store(y, i, total);
    });
    kb.finish()
}

/// Greedy sampling on the device: `ids[r] = argmax_i x[r, i]` over rows of `n` (ties to the lower
/// index, NaN never picked, −1 for a row without a number). Not a plan step (the plan's output is
/// the logits); the GPU executor launches it after the `output` mat-vec when sampling greedily,
/// so only one i32 per token crosses to the host. One block per row: each thread scans its
/// strided elements, then thread 0 scans the 256 partials in thread order.
pub fn argmax(name: &str, n: usize, rows: &Size, warp: u32) -> R {
    check_dims(name, &[n])?;
    let note = format!(
        "argmax over rows of {n} (ties to the lower index, NaN skipped); one block per row"
    );
    let mut kb = Kb::new(name, note, [rows.clone(), Size::Const(1)], BLOCK, warp);
    let x = kb.input_f32("x", Size::prod(rows.clone(), Size::Const(n)));
    let y = kb.output_i32("ids", rows.clone());
    let sv = kb.shared("best_v", Scalar::F32, BLOCK as usize);
    let si = kb.shared("best_i", Scalar::I32, BLOCK as usize);
    let bv = kb.let_("bv", f32::NEG_INFINITY);
    let bi = kb.let_("bi", -1i32);
    kb.for_("i", tid(), ci(n), BLOCK as i32, |kb, i| {
        let v = kb.let_("v", kb.load(x, bx() * ci(n) + i.clone()));
        let better = Expr::from(bv)
            .lt(v)
            .or(Expr::from(bi).lt(0).and(!Expr::from(v).is_nan()));
        kb.if_(better, |kb| {
            kb.set(bv, v);
            kb.set(bi, i);
        });
    });
    kb.sts(sv, tid(), bv);
    kb.sts(si, tid(), bi);
    kb.barrier();
    kb.if_(tid().eq(0), |kb| {
        kb.for_("j", 1, ci(BLOCK as usize), 1, |kb, j| {
            let v = kb.let_("pv", kb.lds(sv, j.clone()));
            let i = kb.let_("pi", kb.lds(si, j));
            let take = !Expr::from(i).lt(0);
            let wins = Expr::from(bv)
                .lt(v)
                .or(Expr::from(bv).eq(v).and(Expr::from(i).lt(bi)))
                .or(Expr::from(bi).lt(0));
            kb.if_(take.and(wins), |kb| {
                kb.set(bv, v);
                kb.set(bi, i);
            });
        });
        kb.store(y, bx(), bi);
    });
    kb.finish()
}

// ------------------------------------------------------------------------------- plan mapping

/// Operand access of one step, with errors naming it.
struct At<'p> {
    plan: &'p Plan,
    idx: usize,
    op: Op,
}

impl<'p> At<'p> {
    fn err(&self, detail: impl Into<String>) -> GenError {
        GenError::Step {
            step: self.idx,
            op: self.op.name(),
            detail: detail.into(),
        }
    }

    fn val(&self, i: usize) -> Result<&'p Value, GenError> {
        match self.plan.steps[self.idx].args.get(i) {
            Some(Operand::Value(v)) => self
                .plan
                .values
                .get(*v)
                .ok_or_else(|| self.err(format!("operand {i} is a missing value"))),
            _ => Err(self.err(format!("operand {i} must be a value"))),
        }
    }

    fn wt(&self, i: usize) -> Result<&'p WeightRef, GenError> {
        match self.plan.steps[self.idx].args.get(i) {
            Some(Operand::Weight(w)) => self
                .plan
                .weights
                .get(*w)
                .ok_or_else(|| self.err(format!("operand {i} is a missing weight"))),
            _ => Err(self.err(format!("operand {i} must be a weight"))),
        }
    }

    fn out(&self) -> Result<&'p Value, GenError> {
        let id = self.plan.steps[self.idx].out;
        self.plan
            .values
            .get(id)
            .ok_or_else(|| self.err("the output value is missing"))
    }

    /// `(rows, last)` of a value whose last axis is fixed.
    fn rows_fixed(&self, v: &Value) -> Result<(Size, usize), GenError> {
        match v.shape.0.split_last() {
            Some((Dim::Fixed(n), rest)) if *n > 0 => Ok((size_of(&Shape(rest.to_vec())), *n)),
            _ => Err(self.err(format!("`{}` {} needs a fixed last axis", v.name, v.shape))),
        }
    }

    /// Fixed elements per token of a `[T, ..]` value.
    fn per_token(&self, v: &Value) -> Result<usize, GenError> {
        match v.shape.0.split_first() {
            Some((Dim::Tokens, rest)) => rest
                .iter()
                .map(|d| match d {
                    Dim::Fixed(n) => Ok(*n),
                    _ => Err(self.err(format!(
                        "`{}` {}: inner axes must be fixed",
                        v.name, v.shape
                    ))),
                })
                .product(),
            _ => Err(self.err(format!("`{}` {} must start with T", v.name, v.shape))),
        }
    }
}

fn spec(w: &WeightRef) -> WeightSpec {
    WeightSpec {
        ggml_type: w.ggml_type.clone(),
        row_len: w.ne.first().copied().unwrap_or(0),
    }
}

fn wdim(w: &WeightRef, i: usize) -> usize {
    w.ne.get(i).copied().unwrap_or(1)
}

/// A weight product's two forms: the mat-vec ([`mat_vec`], named `s.name`) launched at `T = 1`
/// and the mat-mat ([`super::kernels::mat_mat`], named `<s.name>_mm`) at `T > 1`; each grid is
/// empty at the other's `T`, so a backend launches both and one of them runs. They compute the
/// same bits, so a one-token run computes what a prefill would.
///
/// Errors: [`IrError`] from either builder.
pub fn both_forms(s: &MatVecShape, warp: u32) -> Result<Vec<Kernel>, IrError> {
    let mut mv = mat_vec(s, warp)?;
    mv.grid[0] = Size::one_token(mv.grid[0].clone());
    let mm_shape = MatVecShape {
        name: format!("{}_mm", s.name),
        ..s.clone()
    };
    let mut mm = mat_mat(&mm_shape, warp)?;
    mm.grid[0] = Size::many_tokens(mm.grid[0].clone());
    Ok(vec![mv, mm])
}

/// The routed experts' kernels in launch order: at `T = 1` the mat-vecs [`moe_gate_up`] and
/// [`moe_down`]; at `T > 1` [`moe_route`], [`moe_gate_up_mm`], [`moe_down_mm`] and
/// [`moe_combine`] (each grid gated by [`Size::one_token`] / [`Size::many_tokens`]). `dims` is
/// `(d, n_ff, k, n_exp)`.
pub fn moe_forms(
    gate: &WeightSpec,
    up: Option<&WeightSpec>,
    down: &WeightSpec,
    (d, n_ff, k, n_exp): (usize, usize, usize, usize),
    warp: u32,
) -> Result<Vec<Kernel>, IrError> {
    let mut ks = vec![
        moe_gate_up("moe_gate_up", gate, up, n_ff, k, warp)?,
        moe_down("moe_down", down, d, k, warp)?,
    ];
    for kr in &mut ks {
        kr.grid[0] = Size::one_token(kr.grid[0].clone());
    }
    let mut mm = vec![
        moe_route("moe_route", n_exp, k, warp)?,
        moe_gate_up_mm("moe_gate_up_mm", gate, up, n_ff, k, n_exp, warp)?,
        moe_down_mm("moe_down_mm", down, d, k, n_exp, warp)?,
        moe_combine("moe_combine", d, k, warp)?,
    ];
    for kr in &mut mm {
        kr.grid[0] = Size::many_tokens(kr.grid[0].clone());
    }
    ks.extend(mm);
    Ok(ks)
}

/// The kernels that implement step `idx` of `plan` for warps of `warp` lanes, in launch order
/// (empty for a `reshape` that stays in its slot). Kernel names are the op's name;
/// [`super::plan_kernels`] makes them unique.
///
/// Errors: [`GenError::Step`] when the step's operands do not fit its op, [`GenError::Kernel`]
/// when a builder refuses the shape or the warp width.
pub fn for_step(plan: &Plan, idx: usize, warp: u32) -> Result<Vec<Kernel>, GenError> {
    let step = plan.steps.get(idx).ok_or_else(|| GenError::Step {
        step: idx,
        op: "?",
        detail: "no such step".into(),
    })?;
    let at = At {
        plan,
        idx,
        op: step.op,
    };
    let name = step.op.name();
    let one = |k: Result<Kernel, IrError>| -> Result<Vec<Kernel>, GenError> { Ok(vec![k?]) };
    let attrs_err = || at.err(format!("unexpected attributes {:?}", step.attrs));
    match (step.op, &step.attrs) {
        (Op::Embed, _) => {
            let w = at.wt(0)?;
            one(embed(name, &spec(w), &size_of(&at.val(1)?.shape), warp))
        }
        (Op::RmsNorm, Attrs::Eps(eps)) => {
            let (rows, n) = at.rows_fixed(at.val(0)?)?;
            one(rms_norm(name, n, &rows, *eps, warp))
        }
        (Op::MatMul, _) => {
            let w = at.wt(0)?;
            let (rows, _) = at.rows_fixed(at.val(1)?)?;
            Ok(both_forms(
                &MatVecShape {
                    name: name.into(),
                    w: spec(w),
                    n_out: wdim(w, 1),
                    heads: 1,
                    tail: 0,
                    rows,
                },
                warp,
            )?)
        }
        (Op::HeadMatMul, _) => {
            let w = at.wt(0)?;
            let x = at.val(1)?;
            let heads = wdim(w, 2);
            let (rows, _) = at.rows_fixed(x)?;
            let rows = match rows {
                Size::Mul(a, b) if *b == Size::Const(heads) => *a,
                Size::Const(n) if n % heads == 0 => Size::Const(n / heads),
                _ => {
                    return Err(at.err(format!(
                        "`{}` {} does not end in {heads} heads",
                        x.name, x.shape
                    )))
                }
            };
            Ok(both_forms(
                &MatVecShape {
                    name: name.into(),
                    w: spec(w),
                    n_out: wdim(w, 1),
                    heads,
                    tail: 0,
                    rows,
                },
                warp,
            )?)
        }
        (
            Op::Wkb,
            Attrs::Wkb {
                n_head,
                out_dim,
                rope_tail,
                ..
            },
        ) => Ok(both_forms(
            &MatVecShape {
                name: format!("wkb_{}", if *rope_tail > 0 { "in" } else { "out" }),
                w: spec(at.wt(1)?),
                n_out: *out_dim,
                heads: *n_head,
                tail: *rope_tail,
                rows: Size::Tokens,
            },
            warp,
        )?),
        (Op::Slice, Attrs::Slice { offset, len }) => {
            let (rows, n) = at.rows_fixed(at.val(0)?)?;
            one(copy_rows(name, &rows, n, *offset, *len, 0, warp))
        }
        (Op::Concat, _) => {
            let (rows, n1) = at.rows_fixed(at.val(0)?)?;
            let (_, n2) = at.rows_fixed(at.val(1)?)?;
            one(copy_rows(name, &rows, n1, 0, n1, n2, warp))
        }
        (Op::Reshape, _) => {
            let x = at.val(0)?;
            if x.storage == at.out()?.storage {
                return Ok(Vec::new());
            }
            if x.dtype != DType::F32 {
                return Err(at.err("only f32 reshapes into another slot are copied"));
            }
            one(elementwise(
                "copy",
                Op::Reshape,
                &size_of(&x.shape),
                0.0,
                warp,
            ))
        }
        (Op::RopeYarn, Attrs::Rope(p)) => {
            let x = at.val(0)?;
            let (_, d) = at.rows_fixed(x)?;
            one(rope(name, d, at.per_token(x)? / d, p, warp))
        }
        (Op::AttnTemperature, Attrs::Temperature(q)) => {
            let x = at.val(0)?;
            one(temperature(name, at.per_token(x)?, q, warp))
        }
        (Op::Scale | Op::Add | Op::Mul | Op::Silu, a) => {
            let c = match a {
                Attrs::Scale(c) => *c,
                _ => 0.0,
            };
            one(elementwise(
                name,
                step.op,
                &size_of(&at.val(0)?.shape),
                c,
                warp,
            ))
        }
        (Op::Softmax, _) => {
            let x = at.val(0)?;
            let (rows, n) = match x.shape.0.split_last() {
                Some((Dim::Keys, rest)) => (size_of(&Shape(rest.to_vec())), Size::Keys),
                _ => {
                    let (r, n) = at.rows_fixed(x)?;
                    (r, Size::Const(n))
                }
            };
            one(softmax(name, &n, &rows, warp))
        }
        (Op::CacheWrite, _) => {
            let (_, w) = at.rows_fixed(at.val(0)?)?;
            one(cache_write(name, w, warp))
        }
        (Op::ScoresQk, _) => {
            let (rows, w) = at.rows_fixed(at.val(0)?)?;
            one(scores_qk(name, w, &rows, warp))
        }
        (Op::CausalMask, _) => {
            let x = at.val(0)?;
            let rows = size_of(&Shape(
                x.shape.0[..x.shape.0.len().saturating_sub(1)].to_vec(),
            ));
            let per_tok = match x.shape.0.as_slice() {
                [Dim::Tokens, mid @ .., Dim::Keys] => mid
                    .iter()
                    .map(|d| match d {
                        Dim::Fixed(n) => Ok(*n),
                        _ => Err(at.err("inner axes must be fixed")),
                    })
                    .product::<Result<usize, GenError>>()?,
                _ => return Err(at.err(format!("`{}` {} must be [T, .., S]", x.name, x.shape))),
            };
            one(causal_mask(name, per_tok, &rows, warp))
        }
        (Op::WeightedSum, Attrs::WeightedSum { len }) => {
            let p = at.val(0)?;
            let rows = size_of(&Shape(
                p.shape.0[..p.shape.0.len().saturating_sub(1)].to_vec(),
            ));
            let (_, w) = at.rows_fixed(at.val(1)?)?;
            one(weighted_sum(name, w, *len, &rows, warp))
        }
        (Op::TopK, Attrs::TopK { k }) => {
            let (rows, e) = at.rows_fixed(at.val(0)?)?;
            one(top_k(name, e, *k, &rows, warp))
        }
        (Op::GatherRenorm, Attrs::GatherRenorm { renorm, scale }) => {
            let (rows, e) = at.rows_fixed(at.val(0)?)?;
            let (_, k) = at.rows_fixed(at.val(1)?)?;
            one(gather_renorm(name, e, k, &rows, *renorm, *scale, warp))
        }
        (Op::MoeFfn, Attrs::Moe { n_ff, layout, .. }) => {
            let (_, d) = at.rows_fixed(at.val(0)?)?;
            let (_, k) = at.rows_fixed(at.val(1)?)?;
            let (gate, up, down) = match layout {
                ExpertLayout::FusedGateUp => (spec(at.wt(3)?), None, at.wt(4)?),
                ExpertLayout::SplitGateUp => (spec(at.wt(3)?), Some(spec(at.wt(4)?)), at.wt(5)?),
            };
            let n_exp = wdim(at.wt(3)?, 2);
            Ok(moe_forms(
                &gate,
                up.as_ref(),
                &spec(down),
                (d, *n_ff, k, n_exp),
                warp,
            )?)
        }
        (
            Op::Phase,
            Attrs::Phase {
                rope,
                temperature,
                eps,
                n_head,
                nope,
                rope_dim,
                kv_lora,
                ..
            },
        ) => one(phase(
            &PhaseShape {
                name: name.into(),
                heads: *n_head,
                nope: *nope,
                kv_lora: *kv_lora,
                rope_dim: *rope_dim,
                rope: rope.clone(),
                eps: *eps,
                temperature: temperature.clone(),
            },
            warp,
        )),
        (
            Op::Kqkv,
            Attrs::Kqkv {
                n_head,
                kv_lora,
                rope_dim,
                kq_scale,
                ..
            },
        ) => {
            let s = KqkvShape {
                name: name.into(),
                heads: *n_head,
                width: kv_lora + rope_dim,
                kv_lora: *kv_lora,
                kq_scale: *kq_scale,
            };
            Ok(vec![kqkv_split(&s, warp)?, kqkv_merge(&s, warp)?])
        }
        _ => Err(attrs_err()),
    }
}
