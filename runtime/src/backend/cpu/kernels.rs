//! The `cpu` backend's step kernels: `mat_mul`, `head_mat_mul` and `moe_ffn` over activations
//! quantized to Q8_K with the integer SIMD dots of [`super::q8`] (what llama.cpp's CPU backend
//! does: `from_float` to `vec_dot_type`, then `vec_dot` per weight row), f32 GEMM where a weight
//! is F32 or its rows are not whole Q8_K blocks, and the attention and elementwise steps in f32
//! vector lanes with the oracle's bits ([`super::exact`]). [`kernel_for`] says which steps they
//! take; every other step runs its cranelift kernel.
//!
//! Algorithm.
//! - Activations: each row is quantized once per step to one Q8_K plane (`q8`) or two (`q8x2`:
//!   the value, then its rounding residual `x − d·q`); a dot is the sum of the plane dots, in
//!   plane order. Under `q8x2` the plan's output head ([`Plan::output_head`]) takes one plane:
//!   its rounding reaches the logits without passing through another layer.
//! - `mat_mul`, `y[t, r] = W[r, :] · x[t, :]`: output rows in chunks over the rayon pool; a
//!   chunk's weight rows against the quantized rows one tile of `TOKEN_TILE` tokens at a time
//!   (each weight block unpacked once per tile), or, where the CPU has them (AMX, AVX-512 VNNI;
//!   AVX2 for Q2_K, Q3_K, Q6_K) and there are at least `GRID_MIN_ROWS` activation rows, the tile
//!   kernels over packed
//!   activations; at one token the decode kernel (groups of rows, both planes at once).
//!   `head_mat_mul`: the same per (head, rows), each head against its own input rows.
//! - `moe_ffn`: `(token, slot)` pairs grouped by expert (slot order inside a group), the `h` rows
//!   gathered in that order; work items of (expert, `MOE_ROWS` rows) compute
//!   `silu(gate · h) · (up · h)`, the results are quantized, then `down · act`; the output sums
//!   the slots in slot order, `y = Σ_j w[t, j] · part[t, j]`, as the oracle does.
//! - Interleaved copies: Q2_K / Q3_K experts and dense weights the store copied in the layout of
//!   [`super::q8::interleave_rows`] go to the interleaved kernels, with the same bits.
//! - F32 products (the router, `attn_k_b`'s 64-element rows dequantized exactly): one
//!   `matrixmultiply::sgemm` per product or head at prefill, the oracle's dot per row at one
//!   token.
//! - `kqkv` (latent attention, fused by the compiler for the cpu target): scores, scale, causal
//!   mask, softmax and weighted sum, each the oracle's operations in its order; the scores of
//!   keys after a token's position are not computed (the mask replaces them), and the weighted
//!   sum stops at a row block's last nonzero weight.
//!
//! Numerics: not the oracle's. One plane rounds each activation to 8 bits per 256-element block
//! (error ≤ 1/254 of the block's largest magnitude); two planes to about 1/64,516; the dots are
//! exact integer sums combined in f32 per block. Results do not depend on the thread count nor on
//! the number of rows a multi-row kernel takes. Verdicts of `aubier quality` against the oracle:
//! docs/BENCHMARKS.md.

use super::q8::{
    deinterleave_rows, q8_grid_cost_rows, quantize_row_q8k, type_kernels, BlockQ8K, Q8DotManyFn,
    Q8GridFn, Q8RowsFn, Q8Tiles, Q8TokensFn, INTERLEAVE_ROWS, Q8_TILE_ROWS,
};
use crate::ggml_type::GgmlType;
use aubier_compiler::config::ExpertLayout;
use aubier_compiler::ops::Op;
use aubier_compiler::plan::{Operand, Plan};
use aubier_compiler::types::{Attrs, Dim, WeightRef};
use rayon::prelude::*;

use super::exact::{self, SharedOut};
pub(crate) use super::exact::{
    causal_mask, rms_norm, rope, scale, scores, silu, silu_mul, softmax, temperature, weighted_sum,
    ROPE_MAX_PAIRS,
};
use crate::backend::host::WeightRows;

/// `$f(args)` inside a function compiled for the widest vectors of [`exact::Width::detected`]
/// (AVX-512F, else AVX2), as `exact`'s generic `lanes_call!`, so that its inlined element loops
/// vectorize that wide; the same IEEE operations either way.
macro_rules! wide_call {
    ($f:ident($($a:ident: $t:ty),* $(,)?)) => {{
        #[cfg(target_arch = "x86_64")]
        {
            #[target_feature(enable = "avx512f")]
            fn with_avx512($($a: $t),*) {
                $f($($a),*)
            }
            #[target_feature(enable = "avx2,fma,f16c")]
            fn with_avx2($($a: $t),*) {
                $f($($a),*)
            }
            match exact::Width::detected() {
                // SAFETY: the CPU has AVX-512F (detected).
                exact::Width::Avx512 => unsafe { with_avx512($($a),*) },
                // SAFETY: the CPU has AVX2, FMA and F16C (detected).
                exact::Width::Avx2 => unsafe { with_avx2($($a),*) },
                exact::Width::Arrays => $f($($a),*),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            $f($($a),*)
        }
    }};
}

/// Elements of one Q8_K block.
const QK: usize = 256;
/// Activation rows dotted against a chunk of weight rows before the next rows (prefill).
const TOKEN_TILE: usize = 32;
/// Gate/up or down rows per work item of `moe_ffn` (a multiple of the tile kernels' 16). At
/// decode a layer's four experts make 32 gate/up and 64 down items; 64 rows per item measured
/// 9.6 ms of expert time per token on the synthetic model against 8.0 ms for 256 (Zen 4, two
/// threads).
const MOE_ROWS: usize = 256;
/// Tokens per packed tile of activations for the tile kernels (128 rows under `q8x2`: at 4096
/// elements 512 KiB of codes, which stay in L2 while a chunk of weight rows passes).
const GRID_TOKENS: usize = 64;
/// Activation rows (tokens × planes) from which the tile kernels beat the multi-row ones
/// (measured: `cargo bench -p aubier-runtime --bench q8_dot`, `q8_prefill/Q2_K`; AMX on
/// Sapphire Rapids: equal at 2 rows, slower at 4, 2.4× faster at 8; VNNI on Zen 4: 0.5× at 4,
/// equal at 8, 1.9× at 16; AVX2 on Zen 4 under `--cpu-isa avx2`: Q2_K 0.69× at 4, 1.20× at 8,
/// 1.31× at 16, Q3_K and Q6_K 0.90× / 1.6× / 1.8×).
const GRID_MIN_ROWS: usize = 8;
/// The cost model that picks between the tile kernel and the many-token kernel for interleaved
/// rows of `ty`, in units of one activation row's share of the tile kernel's `vpdpbusd` work:
/// `(u, v, w)` with the tile kernel's time `u + c` for a call that costs `c` activation rows
/// ([`q8_grid_cost_rows`]; `u` the weight unpacking, paid once per block) and the many-token
/// kernel's `v + w·r` for `r` activation rows (it unpacks the same way but pads no row). Fitted
/// on Zen 4, one thread, 4096-element rows in 256-row items, 1–64 tokens × 2 planes: Q2_K tile
/// kernel 150 / 166 GMAC/s at 16 / 32 rows, many-token kernel 152 / 168 / 174 at 16 / 32 / 64;
/// Q3_K 153 / 181 and 150 / 174 / 187. Other types have no many-token kernel.
fn tokens_model(ty: GgmlType) -> (f64, f64, f64) {
    match ty {
        GgmlType::Q2_K => (4.1, 2.7, 1.05),
        GgmlType::Q3_K => (7.4, 5.75, 1.08),
        _ => (0.0, 0.0, f64::INFINITY),
    }
}

/// Weight rows per parallel work item of a tiled `mat_mul` (a multiple of 16).
const GRID_ROWS: usize = 64;
const _: () =
    assert!(MOE_ROWS.is_multiple_of(Q8_TILE_ROWS) && GRID_ROWS.is_multiple_of(Q8_TILE_ROWS));

/// A weight the cpu backend can read: its rows' byte length and multi-row dot kernel, and the Q8_K planes
/// of the activations it is dotted with (1: `q8`; 2: `q8x2`, value and residual).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Rows {
    ty: GgmlType,
    row_bytes: usize,
    many: Q8DotManyFn,
    /// The decode kernel: many weight rows against one token's planes.
    decode: Q8RowsFn,
    /// The tile kernel ([`super::q8::q8_grid_fn`]), when the CPU has one for the type.
    grid: Option<Q8GridFn>,
    /// The decode, tile and many-token kernels of the interleaved layout, where the CPU has
    /// them.
    interleaved: Option<(Q8RowsFn, Q8GridFn, Q8TokensFn)>,
    planes: usize,
}

/// Quantized activations packed for the tile kernels ([`pack`]): the first tokens of the
/// activations (the rest, at most one, [`tail_token`], go to the decode kernel).
struct Packed {
    planes: usize,
    tiles: Vec<Q8Tiles>,
}

/// Whether the last of `t` tokens of `planes` planes (packed [`GRID_TOKENS`] to a tile) goes to
/// the decode kernel instead of the tile kernel: when it alone makes the tile kernel compute at
/// least another half group of activation rows ([`q8_grid_cost_rows`]; AVX2 and AVX-512 VNNI: a
/// token alone in a last half group of 8 rows). The decode kernel's one token costs less than
/// the half group (AVX2, one thread: a half group of Q2_K at ~100 G multiply-adds/s against two
/// planes at ~56 in the decode kernel); an expert's share of a 512-token prompt is ~16 tokens,
/// so a quarter of the experts have such a token. The same bits either way.
fn tail_token(t: usize, planes: usize) -> bool {
    if t < 2 {
        return false;
    }
    let rows = ((t - 1) % GRID_TOKENS + 1) * planes;
    q8_grid_cost_rows(rows) - q8_grid_cost_rows(rows - planes) >= Q8_TILE_ROWS / 2
}

/// The `t` tokens of `xq` (each `planes` runs of blocks) packed for the tile kernels,
/// [`GRID_TOKENS`] tokens per tile (tiles in parallel), but for a last token that
/// [`tail_token`] leaves to the decode kernel.
fn pack(xq: &[BlockQ8K], t: usize, planes: usize) -> Packed {
    let per_token = xq.len() / t.max(1);
    let t = t - usize::from(tail_token(t, planes));
    let tiles = xq[..t * per_token]
        .par_chunks((GRID_TOKENS * per_token).max(1))
        .map(|c| {
            Q8Tiles::pack(c, c.len() / per_token * planes)
                .expect("whole tokens of whole rows by construction")
        })
        .collect();
    Packed { planes, tiles }
}

/// `dst[j]` = the sum of `src[planes·j ..][..planes]` in plane order (one or two planes).
fn sum_planes(planes: usize, src: &[f32], dst: &mut [f32]) {
    if planes == 1 {
        dst.copy_from_slice(src);
    } else {
        for (v, p) in dst.iter_mut().zip(src.chunks_exact(2)) {
            *v = p[0] + p[1];
        }
    }
}

impl Packed {
    /// `y[i·T + t] = row_i · x_t` for the weight rows `w` (back to back, `row_bytes` each) and
    /// the `T = y.len() / rows` tokens of `x` (each `planes` runs of blocks): the packed ones by
    /// the tile kernel `grid`, the rest by the decode kernel `decode` (the same layout's): the
    /// bits of [`Rows::dot_many`] on each row (both kernels give the single-row bits per plane,
    /// and the planes are added in plane order).
    fn product(
        &self,
        (grid, decode): (Q8GridFn, Q8RowsFn),
        w: &[u8],
        row_bytes: usize,
        x: &[BlockQ8K],
        y: &mut [f32],
    ) {
        let n = w.len() / row_bytes;
        let t = y.len() / n.max(1);
        let mut tmp = Vec::new();
        let mut t0 = 0;
        for p in &self.tiles {
            let rows = p.rows();
            let tt = rows / self.planes;
            tmp.resize(n * rows, 0.0);
            grid(w, p, &mut tmp);
            for (src, dst) in tmp.chunks_exact(rows).zip(y.chunks_exact_mut(t)) {
                sum_planes(self.planes, src, &mut dst[t0..t0 + tt]);
            }
            t0 += tt;
        }
        let per_token = x.len() / t.max(1);
        for (j, xj) in x.chunks_exact(per_token.max(1)).enumerate().skip(t0) {
            tmp.resize(n, 0.0);
            decode(w, xj, self.planes, &mut tmp[..n]);
            for (v, dst) in tmp.iter().zip(y.chunks_exact_mut(t)) {
                dst[j] = *v;
            }
        }
    }
}

impl Rows {
    /// `w` as rows of `ne[0]` elements, when `ne` has `dims` entries, `ne[0]` is a whole number of
    /// Q8_K blocks and the type has a Q8_K dot.
    fn of(w: &WeightRef, dims: usize, planes: usize) -> Option<Rows> {
        let ty = GgmlType::from_name(&w.ggml_type)?;
        let n = *w.ne.first()?;
        if w.ne.len() != dims || n == 0 || n % QK != 0 {
            return None;
        }
        let k = type_kernels(ty)?;
        Some(Rows {
            ty,
            row_bytes: ty.row_size(n)?,
            many: k.many,
            decode: k.rows,
            grid: k.grid,
            interleaved: k.interleaved,
            planes,
        })
    }

    /// `Q2_K, 2 planes, avx512-vnni, tile kernels, interleaved copies`: the type, the planes, the
    /// CPU's ISA tier `isa`, and the kernel families found for the type on it.
    fn describe(&self, isa: &str) -> String {
        let planes = if self.planes == 1 { "plane" } else { "planes" };
        let mut s = format!("{}, {} {planes}, {isa}", self.ty, self.planes);
        if self.grid.is_some() {
            s.push_str(", tile kernels");
        }
        if self.interleaved.is_some() {
            s.push_str(", interleaved copies");
        }
        s
    }

    /// Whether `m` tokens against interleaved rows go to the many-token kernel rather than the
    /// tile kernel: when [`tokens_model`] predicts it faster.
    fn prefers_tokens(&self, m: usize) -> bool {
        let rows = m * self.planes;
        let (u, v, w) = tokens_model(self.ty);
        self.interleaved.is_some() && v + w * (rows as f64) < u + q8_grid_cost_rows(rows) as f64
    }

    /// `y[j] = row · x_j` for `y.len()` consecutive quantized activation rows in `x` (each
    /// `planes` runs of blocks; the multi-row kernel returns the single-row bits per plane, and
    /// the plane dots are added in plane order).
    fn dot_many(&self, row: &[u8], x: &[BlockQ8K], y: &mut [f32]) {
        if self.planes == 1 {
            (self.many)(row, x, y);
            return;
        }
        let per_row = x.len() / y.len().max(1);
        let mut tmp = [0f32; 2 * TOKEN_TILE];
        for (ys, xs) in y.chunks_mut(TOKEN_TILE).zip(x.chunks(TOKEN_TILE * per_row)) {
            let planes = &mut tmp[..2 * ys.len()];
            (self.many)(row, xs, planes);
            sum_planes(2, planes, ys);
        }
    }

    /// `y[i·m + j] = row_{r0 + i} · x_j` for rows `r0..r1` of `bytes` and the `m = y.len() /
    /// (r1 − r0)` tokens of `x` (each `planes` runs of blocks): by the tile kernel when `packed`
    /// holds `x` and the weight has one, by the decode kernel at one token, else row by row with
    /// the multi-row kernel. Either way each value has the bits of [`Rows::dot_many`].
    fn product(
        &self,
        bytes: &[u8],
        r0: usize,
        r1: usize,
        x: &[BlockQ8K],
        packed: Option<&Packed>,
        y: &mut [f32],
    ) {
        if let (Some(grid), Some(p)) = (self.grid, packed) {
            let w = self.rows(bytes, r0, r1);
            p.product((grid, self.decode), w, self.row_bytes, x, y);
            return;
        }
        let m = y.len() / (r1 - r0).max(1);
        if m == 1 {
            (self.decode)(self.rows(bytes, r0, r1), x, self.planes, y);
            return;
        }
        for (r, yr) in (r0..r1).zip(y.chunks_exact_mut(m.max(1))) {
            self.dot_many(self.row(bytes, r), x, yr);
        }
    }

    /// [`Rows::product`] for rows that may be in the interleaved layout: there the
    /// interleaved tile kernel, decode kernel (one token) or many-token kernel takes whole
    /// groups of rows in place, and any other case (a cut inside a group, no such kernels) reads
    /// the groups deinterleaved. The same bits.
    fn layout_product(
        &self,
        e: WeightRows<'_>,
        r0: usize,
        r1: usize,
        x: &[BlockQ8K],
        packed: Option<&Packed>,
        y: &mut [f32],
    ) {
        if !e.interleaved {
            return self.product(e.bytes, r0, r1, x, packed, y);
        }
        let m = y.len() / (r1 - r0).max(1);
        let whole = r0.is_multiple_of(INTERLEAVE_ROWS) && r1.is_multiple_of(INTERLEAVE_ROWS);
        match (self.interleaved, packed) {
            (Some((decode, grid, _)), Some(p)) if whole && self.grid.is_some() => {
                let w = self.rows(e.bytes, r0, r1);
                p.product((grid, decode), w, self.row_bytes, x, y)
            }
            (Some((decode, _, _)), _) if whole && m == 1 => {
                decode(self.rows(e.bytes, r0, r1), x, self.planes, y)
            }
            (Some((_, _, tokens)), None) if whole => {
                tokens(self.rows(e.bytes, r0, r1), x, self.planes, m, y)
            }
            _ => {
                let (g0, g1) = (
                    r0 / INTERLEAVE_ROWS * INTERLEAVE_ROWS,
                    r1.div_ceil(INTERLEAVE_ROWS) * INTERLEAVE_ROWS,
                );
                let src = self.rows(e.bytes, g0, g1);
                let mut own = vec![0u8; src.len()];
                deinterleave_rows(self.ty, src, &mut own, self.row_bytes)
                    .expect("whole groups of whole rows, as the store interleaved them");
                self.product(&own, r0 - g0, r1 - g0, x, packed, y);
            }
        }
    }

    /// Row `r` of `bytes` (all rows of one matrix).
    fn row<'w>(&self, bytes: &'w [u8], r: usize) -> &'w [u8] {
        self.rows(bytes, r, r + 1)
    }

    /// Rows `r0..r1` of `bytes`.
    fn rows<'w>(&self, bytes: &'w [u8], r0: usize, r1: usize) -> &'w [u8] {
        &bytes[r0 * self.row_bytes..r1 * self.row_bytes]
    }
}

/// A product of a quantized weight with an f32 input the cpu backend runs (`mat_mul`,
/// `head_mat_mul`).
pub(crate) trait WeightProduct {
    /// Input and output elements per token.
    fn per_token(&self) -> (usize, usize);
    /// Input elements at `t` tokens.
    fn input_len(&self, t: usize) -> usize {
        t * self.per_token().0
    }
    /// Output elements at `t` tokens.
    fn output_len(&self, t: usize) -> usize {
        t * self.per_token().1
    }
    /// The product of the raw weight bytes `w` with the input `x` into `y`.
    fn run(&self, w: &[u8], x: &[f32], y: &mut [f32], buf: &mut CpuBuffers);
}

/// A `mat_mul` the cpu backend runs: `W{n_in, n_out}`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct QuantMatMul {
    n_in: usize,
    n_out: usize,
    w: Rows,
}

/// A `head_mat_mul` the cpu backend runs: `W{n_in, n_out, H}`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct QuantHeadMatMul {
    n_in: usize,
    n_out: usize,
    heads: usize,
    w: Rows,
}

/// A `head_mat_mul` whose rows are not whole Q8_K blocks (`attn_k_b`, 64 elements): at more
/// than one token, the weight dequantized to f32 (exactly, as the oracle does) and one f32 GEMM
/// per head; at one token the type's dot per row (the oracle's bits).
#[derive(Clone, Copy, Debug)]
pub(crate) struct F32HeadGemm {
    n_in: usize,
    n_out: usize,
    heads: usize,
    ty: GgmlType,
}

/// Rows of an F32 `mat_mul` per work item at one token (the router's 128 rows: four items).
const F32_DECODE_ROWS: usize = 32;

/// A `mat_mul` of an F32 weight (the router, `ffn_gate_inp`): at more than one token one f32 GEMM,
/// at one token the oracle's dot per row, rows in parallel.
#[derive(Clone, Copy, Debug)]
pub(crate) struct F32MatMul {
    n_in: usize,
    n_out: usize,
}

/// A `moe_ffn` the cpu backend runs (operands as the oracle's: h, ids, weights, then gate/up and
/// down expert tables).
#[derive(Clone, Copy, Debug)]
pub(crate) struct QuantMoe {
    d: usize,
    n_ff: usize,
    gate: Rows,
    up: Rows,
    down: Rows,
    /// First up row inside an expert's gate/up slice (`n_ff` when fused, else 0 of its own).
    up_off: usize,
    fused: bool,
}

/// A step kernel of the `cpu` backend.
#[derive(Clone, Copy, Debug)]
pub(crate) enum CpuKernel {
    MatMul(QuantMatMul),
    HeadMatMul(QuantHeadMatMul),
    HeadGemm(F32HeadGemm),
    F32MatMul(F32MatMul),
    Moe(QuantMoe),
    /// `scores_qk` over latent-cache rows of `w` values.
    Scores {
        w: usize,
    },
    /// `weighted_sum` of the first `len` of latent-cache rows of `w` values.
    WeightedSum {
        w: usize,
        len: usize,
    },
    /// `softmax` over a last axis of `n` elements (None: `S`, the keys).
    Softmax {
        n: Option<usize>,
    },
    /// `scale` by `c`.
    Scale {
        c: f32,
    },
    /// `causal_mask` of `[T, .., S]` scores by `[T]` positions.
    CausalMask,
    /// `rms_norm` by an F32 weight of `n` elements.
    RmsNorm {
        n: usize,
        eps: f32,
    },
    /// `silu`.
    Silu,
    /// `attn_temperature` by β and the length `L` (positive).
    Temperature {
        beta: f32,
        length: i64,
    },
    /// `rope_yarn` of rows of `d` values: the first `pairs` pairs by `theta[..pairs]`
    /// (`yarn_inv_freq`, as the oracle's lowering), cos and sin scaled by `af`.
    Rope {
        d: usize,
        pairs: usize,
        theta: [f32; ROPE_MAX_PAIRS],
        af: f32,
    },
    /// `kqkv`: `heads` query rows of `w` values per token against latent-cache rows of `w`
    /// values, scores scaled by `scale`, causal by the positions, softmax over the keys, the
    /// weighted sum of each key's first `len` values.
    Kqkv {
        heads: usize,
        w: usize,
        len: usize,
        scale: f32,
    },
}

impl CpuKernel {
    /// The kernel's name, for the binding's record and the kernel times.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            CpuKernel::MatMul(_) => "q8_mat_mul",
            CpuKernel::HeadMatMul(_) => "q8_head_mat_mul",
            CpuKernel::HeadGemm(_) => "f32_head_gemm",
            CpuKernel::F32MatMul(_) => "f32_mat_mul",
            CpuKernel::Moe(_) => "q8_moe_ffn",
            CpuKernel::Scores { .. } => "scores_qk",
            CpuKernel::WeightedSum { .. } => "weighted_sum",
            CpuKernel::Softmax { .. } => "softmax",
            CpuKernel::Scale { .. } => "scale",
            CpuKernel::CausalMask => "causal_mask",
            CpuKernel::RmsNorm { .. } => "rms_norm",
            CpuKernel::Silu => "silu",
            CpuKernel::Temperature { .. } => "attn_temperature",
            CpuKernel::Rope { .. } => "rope_yarn",
            CpuKernel::Kqkv { .. } => "latent_attention",
        }
    }

    /// The kernel's variant on this CPU (`isa`: the Q8_K kernels' tier, [`super::isa`]), for
    /// the binding's record.
    pub(crate) fn variant(&self, isa: &str) -> String {
        let width = exact::Width::detected().name();
        let lanes = || format!("f32 lanes ({width}), the oracle's bits");
        match self {
            CpuKernel::MatMul(m) => m.w.describe(isa),
            CpuKernel::HeadMatMul(m) => m.w.describe(isa),
            CpuKernel::HeadGemm(m) => format!(
                "{} dequantized; sgemm per head at prefill, the oracle's dot at one token",
                m.ty
            ),
            CpuKernel::F32MatMul(_) => {
                "sgemm at prefill, the oracle's dot per row at one token".into()
            }
            CpuKernel::Moe(m) => format!(
                "gate {}; up {}; down {}",
                m.gate.describe(isa),
                m.up.describe(isa),
                m.down.describe(isa)
            ),
            CpuKernel::Kqkv { .. } => format!("{}; masked keys skipped", lanes()),
            _ => lanes(),
        }
    }

    /// Whether a one-token run of the kernel computes the bits a run of several tokens computes
    /// for that token ([`crate::backend::BoundStep::one_token_matches_prefill`]): the lane
    /// kernels compute each row by the oracle's operations whatever the run's length; the weight
    /// products take other code at one token (the decode kernels, the f32 dot in place of
    /// sgemm), so they do not claim it.
    pub(crate) fn one_token_matches_prefill(&self) -> bool {
        !matches!(
            self,
            CpuKernel::MatMul(_)
                | CpuKernel::HeadMatMul(_)
                | CpuKernel::HeadGemm(_)
                | CpuKernel::F32MatMul(_)
                | CpuKernel::Moe(_)
        )
    }
}

/// The `cpu` backend's kernel for step `i` of `plan` with `planes` Q8_K planes per activation
/// row, or None when the step keeps its cranelift kernel (module note). A `kqkv` whose operands
/// do not have the fused node's shapes gets none (and the backend refuses it).
pub(crate) fn kernel_for(plan: &Plan, i: usize, planes: usize) -> Option<CpuKernel> {
    let step = plan.steps.get(i)?;
    let weight = |a: Option<&Operand>| match a {
        Some(Operand::Weight(w)) => plan.weights.get(*w),
        _ => None,
    };
    let value_shape = |a: Option<&Operand>| match a {
        Some(Operand::Value(v)) => plan.values.get(*v).map(|v| v.shape.0.as_slice()),
        _ => None,
    };
    // The row width of a `[S, w]` f32 operand (the latent cache).
    let cache_width = |a: Option<&Operand>| match value_shape(a)? {
        [Dim::Keys, Dim::Fixed(w)] if *w > 0 => Some(*w),
        _ => None,
    };
    match (step.op, &step.attrs) {
        (Op::MatMul, _) => {
            let w = weight(step.args.first())?;
            // The output head's rounding reaches the logits without passing through another
            // layer: one plane is enough there (module note).
            let head = plan.output_head.is_some_and(|h| h.step == i);
            let planes = if head { 1 } else { planes };
            if w.ggml_type == "F32" {
                return match w.ne.as_slice() {
                    &[n_in, n_out] if n_in > 0 => {
                        Some(CpuKernel::F32MatMul(F32MatMul { n_in, n_out }))
                    }
                    _ => None,
                };
            }
            let rows = Rows::of(w, 2, planes)?;
            Some(CpuKernel::MatMul(QuantMatMul {
                n_in: w.ne[0],
                n_out: w.ne[1],
                w: rows,
            }))
        }
        (Op::HeadMatMul, _) => {
            let w = weight(step.args.first())?;
            if let Some(rows) = Rows::of(w, 3, planes) {
                return Some(CpuKernel::HeadMatMul(QuantHeadMatMul {
                    n_in: w.ne[0],
                    n_out: w.ne[1],
                    heads: w.ne[2],
                    w: rows,
                }));
            }
            let ty = GgmlType::from_name(&w.ggml_type)?;
            let (n_in, n_out, heads) = match w.ne.as_slice() {
                &[i, o, h] => (i, o, h),
                _ => return None,
            };
            // Whole rows of whole blocks of a type with a dequantizer.
            ty.row_size(n_in)?;
            if !crate::gguf::quant::is_supported(ty) {
                return None;
            }
            Some(CpuKernel::HeadGemm(F32HeadGemm {
                n_in,
                n_out,
                heads,
                ty,
            }))
        }
        (Op::MoeFfn, Attrs::Moe { n_ff, layout, .. }) => {
            let fused = *layout == ExpertLayout::FusedGateUp;
            let g = weight(step.args.get(3))?;
            let (u, dn) = if fused {
                (g, weight(step.args.get(4))?)
            } else {
                (weight(step.args.get(4))?, weight(step.args.get(5))?)
            };
            if *n_ff == 0 || n_ff % QK != 0 {
                return None;
            }
            Some(CpuKernel::Moe(QuantMoe {
                d: g.ne[0],
                n_ff: *n_ff,
                gate: Rows::of(g, 3, planes)?,
                up: Rows::of(u, 3, planes)?,
                down: Rows::of(dn, 3, planes)?,
                up_off: if fused { *n_ff } else { 0 },
                fused,
            }))
        }
        (Op::ScoresQk, _) => Some(CpuKernel::Scores {
            w: cache_width(step.args.get(1))?,
        }),
        (Op::Softmax, _) => match plan.values.get(step.out)?.shape.0.last()? {
            Dim::Fixed(n) => Some(CpuKernel::Softmax { n: Some(*n) }),
            Dim::Keys => Some(CpuKernel::Softmax { n: None }),
            _ => None,
        },
        (Op::Scale, Attrs::Scale(c)) => Some(CpuKernel::Scale { c: *c }),
        (Op::RmsNorm, Attrs::Eps(eps)) => {
            let w = weight(step.args.get(1))?;
            match w.ne.as_slice() {
                &[n] if n > 0 && w.ggml_type == "F32" => Some(CpuKernel::RmsNorm { n, eps: *eps }),
                _ => None,
            }
        }
        (Op::CausalMask, _) => Some(CpuKernel::CausalMask),
        (Op::Silu, _) => Some(CpuKernel::Silu),
        (Op::AttnTemperature, Attrs::Temperature(q)) => Some(CpuKernel::Temperature {
            beta: q.scale,
            length: i64::try_from(q.length).ok().filter(|&l| l > 0)?,
        }),
        (Op::RopeYarn, Attrs::Rope(p)) => {
            let d = match value_shape(step.args.first())?.last()? {
                Dim::Fixed(d) => *d,
                _ => return None,
            };
            let pairs = p.n_rot / 2;
            if p.n_rot == 0 || p.n_rot % 2 != 0 || p.n_rot > d || pairs > ROPE_MAX_PAIRS {
                return None;
            }
            let mut theta = [0f32; ROPE_MAX_PAIRS];
            theta[..pairs].copy_from_slice(&aubier_kernels_gen::cpu::yarn_inv_freq(p));
            Some(CpuKernel::Rope {
                d,
                pairs,
                theta,
                af: p.attn_factor,
            })
        }
        (Op::WeightedSum, Attrs::WeightedSum { len }) => Some(CpuKernel::WeightedSum {
            w: cache_width(step.args.get(1))?,
            len: *len,
        }),
        (
            Op::Kqkv,
            &Attrs::Kqkv {
                n_head,
                kv_lora,
                rope_dim,
                kq_scale,
                ..
            },
        ) => {
            let w = cache_width(step.args.get(2))?;
            let q_ok = matches!(
                value_shape(step.args.first())?,
                [Dim::Tokens, Dim::Fixed(h), Dim::Fixed(qw)] if *h == n_head && *qw == w
            );
            let pos_ok = matches!(value_shape(step.args.get(1))?, [Dim::Tokens]);
            (q_ok && pos_ok && n_head > 0 && kv_lora + rope_dim == w).then_some(CpuKernel::Kqkv {
                heads: n_head,
                w,
                len: kv_lora,
                scale: kq_scale,
            })
        }
        _ => None,
    }
}

/// Buffers of the `cpu` backend's kernels, grown to their high-water mark and kept by the executor.
#[derive(Debug, Default)]
pub(crate) struct CpuBuffers {
    xq: Vec<BlockQ8K>,
    aq: Vec<BlockQ8K>,
    hg: Vec<BlockQ8K>,
    /// `moe_ffn`'s gate/up activations `[slots, n_ff]`, then, once they are quantized, its
    /// down-projection outputs `[slots, d]` (one buffer: the first is dead when the second is
    /// written).
    ffn: Vec<f32>,
    yt: Vec<f32>,
    wf: Vec<f32>,
    /// `kqkv`'s scores and weights `[rows, S]`, two buffers the chain alternates between.
    pub(crate) att: [Vec<f32>; 2],
}

impl CpuBuffers {
    /// The f32 values of the weight bytes `bytes` ([`f32_view`], copied into these buffers when
    /// misaligned).
    pub(crate) fn f32_weight<'a>(&'a mut self, bytes: &'a [u8]) -> &'a [f32] {
        f32_view(bytes, &mut self.wf)
    }
}

/// Quantizes the rows of `n` elements of `x` into `q` (grown as needed), rows in parallel: per
/// row `planes · n / 256` blocks, the value's plane, then (`planes = 2`) the plane of its
/// residual `x − d·qs`, whose step is at most 1/254 of the first's.
fn quantize_rows(x: &[f32], n: usize, planes: usize, q: &mut Vec<BlockQ8K>) {
    let nb = n / QK;
    let rows = x.len() / n;
    if q.len() < rows * planes * nb {
        q.resize(rows * planes * nb, BlockQ8K::ZERO);
    }
    q[..rows * planes * nb]
        .par_chunks_mut(planes * nb)
        .zip(x.par_chunks(n))
        .with_min_len(8)
        .for_each(|(qr, xr)| {
            let (hi, lo) = qr.split_at_mut(nb);
            quantize_row_q8k(xr, hi).expect("row lengths are whole blocks by construction");
            if planes == 2 {
                let mut r = [0f32; QK];
                for ((b, xb), lb) in hi.iter().zip(xr.chunks_exact(QK)).zip(lo.chunks_mut(1)) {
                    let r = &mut r;
                    wide_call!(residual(b: &BlockQ8K, xb: &[f32], r: &mut [f32; QK]));
                    quantize_row_q8k(r, lb).expect("one block");
                }
            }
        });
}

impl WeightProduct for QuantMatMul {
    fn per_token(&self) -> (usize, usize) {
        (self.n_in, self.n_out)
    }

    /// `y[t, r] = W[r, :] · q8(x[t, :])`: `w` the raw `n_out` rows, `x` `[T, n_in]`, `y`
    /// `[T, n_out]` (T = `x.len() / n_in`).
    fn run(&self, w: &[u8], x: &[f32], y: &mut [f32], buf: &mut CpuBuffers) {
        let rows = WeightRows {
            bytes: w,
            interleaved: false,
        };
        self.run_rows(rows, x, y, buf);
    }
}

impl QuantMatMul {
    /// [`WeightProduct::run`] for rows in the file's layout or interleaved (the fast store's
    /// copy of a dense weight, [`Rows::layout_product`]): the same bits either way.
    pub(crate) fn run_rows(
        &self,
        w: WeightRows<'_>,
        x: &[f32],
        y: &mut [f32],
        buf: &mut CpuBuffers,
    ) {
        let (n_in, n_out) = (self.n_in, self.n_out);
        let t = x.len() / n_in;
        let nb = self.w.planes * n_in / QK;
        quantize_rows(x, n_in, self.w.planes, &mut buf.xq);
        let xq = &buf.xq[..t * nb];
        // Interleaved rows go in whole groups.
        let unit = if w.interleaved { INTERLEAVE_ROWS } else { 1 };
        let chunk = n_out
            .div_ceil(rayon::current_num_threads() * 8)
            .clamp(1, 256)
            .next_multiple_of(unit);
        if t == 1 {
            y[..n_out]
                .par_chunks_mut(chunk)
                .enumerate()
                .for_each(|(c, ys)| {
                    let r0 = c * chunk;
                    self.w.layout_product(w, r0, r0 + ys.len(), xq, None, ys);
                });
            return;
        }
        // Row-major by weight row into `yt` [n_out, T], each chunk then written into `y` by its
        // work item while it is still in L2 (a separate transpose of all of `yt` afterwards took
        // 4–5 ms of a 4096-row product at 512 tokens). A chunk of weight rows meets the
        // activations one tile of `TOKEN_TILE` rows at a time, so both stay in L2 while they are
        // dotted; with a tile kernel, `GRID_ROWS` rows against all packed tiles.
        if buf.yt.len() < n_out * t {
            buf.yt.resize(n_out * t, 0.0);
        }
        let packed = (self.w.grid.is_some() && t * self.w.planes >= GRID_MIN_ROWS)
            .then(|| pack(xq, t, self.w.planes));
        let out = SharedOut::new(&mut y[..t * n_out]);
        let out = &out;
        if packed.is_some() || w.interleaved {
            let per_item = if packed.is_some() {
                GRID_ROWS
            } else {
                chunk.min(64).next_multiple_of(unit)
            };
            buf.yt[..n_out * t]
                .par_chunks_mut(per_item * t)
                .enumerate()
                .for_each(|(c, ys)| {
                    let r0 = c * per_item;
                    let r1 = r0 + ys.len() / t;
                    self.w.layout_product(w, r0, r1, xq, packed.as_ref(), ys);
                    scatter_tokens(ys, r0, t, n_out, out);
                });
        } else {
            let chunk = chunk.min(64);
            buf.yt[..n_out * t]
                .par_chunks_mut(chunk * t)
                .enumerate()
                .for_each(|(c, ys)| {
                    for t0 in (0..t).step_by(TOKEN_TILE) {
                        let t1 = (t0 + TOKEN_TILE).min(t);
                        for (i, yr) in ys.chunks_mut(t).enumerate() {
                            let row = self.w.row(w.bytes, c * chunk + i);
                            self.w.dot_many(row, &xq[t0 * nb..t1 * nb], &mut yr[t0..t1]);
                        }
                    }
                    scatter_tokens(ys, c * chunk, t, n_out, out);
                });
        }
    }
}

/// Side of [`scatter_tokens`]' transpose blocks (16 × 16 floats: each block row one cache line).
const SCATTER_BLOCK: usize = 16;

/// Writes `ys` (`[rows, T]`, the outputs `r0 ..` of one work item) into `out`, whose token rows
/// are `stride` floats apart: element `(i, tok)` to `tok · stride + r0 + i`. By blocks of
/// [`SCATTER_BLOCK`] rows × tokens through a local tile, so that both the reads of `ys` and the
/// writes of `out` go a cache line at a time (element-wise, one side's accesses are
/// `T` or `stride` floats apart, power-of-two strides that keep landing in the same L1 sets).
/// The whole destination range is bounds-checked once.
///
/// # Panics
/// If `ys` is not whole rows of `T` or a destination lies outside `out`.
fn scatter_tokens(ys: &[f32], r0: usize, t: usize, stride: usize, out: &SharedOut) {
    if t == 0 || ys.is_empty() {
        return;
    }
    let rows = ys.len() / t;
    assert!(
        rows * t == ys.len() && (t - 1) * stride + r0 + rows <= out.1 && rows <= stride,
        "cpu backend scatter of {rows} x {t} at {r0} (stride {stride}) outside {}",
        out.1
    );
    let width = exact::Width::detected();
    let mut tile = [[0f32; SCATTER_BLOCK]; SCATTER_BLOCK];
    for t0 in (0..t).step_by(SCATTER_BLOCK) {
        let tn = SCATTER_BLOCK.min(t - t0);
        for i0 in (0..rows).step_by(SCATTER_BLOCK) {
            let rn = SCATTER_BLOCK.min(rows - i0);
            if width != exact::Width::Arrays && rn == SCATTER_BLOCK && tn == SCATTER_BLOCK {
                let (src, dst) = (
                    ys.as_ptr().wrapping_add(i0 * t + t0),
                    out.0.wrapping_add(t0 * stride + r0 + i0),
                );
                // SAFETY: rows `i0 .. i0 + 16` of `ys` hold tokens `t0 .. t0 + 16`
                // (`t0 + 16 ≤ T`); the destination runs are those of the tile path below,
                // inside `out` and this work item's own; the width's features detected.
                unsafe {
                    if width == exact::Width::Avx512 {
                        transpose16(src, t, dst, stride)
                    } else {
                        transpose16_avx2(src, t, dst, stride)
                    }
                };
                continue;
            }
            for i in 0..rn {
                for (k, &v) in ys[(i0 + i) * t + t0..][..tn].iter().enumerate() {
                    tile[k][i] = v;
                }
            }
            for (k, tr) in tile.iter().enumerate().take(tn) {
                // SAFETY: `t0 + k < T` and `i0 + rn ≤ rows ≤ stride`, so the run lies inside
                // `out` (checked above); the (token, output) pairs of outputs `r0 ..` belong to
                // this work item only.
                unsafe {
                    let dst = out.0.add((t0 + k) * stride + r0 + i0);
                    if rn == SCATTER_BLOCK {
                        // A whole line by value (inline stores, not a `memcpy` call).
                        dst.cast::<[f32; SCATTER_BLOCK]>().write_unaligned(*tr);
                    } else {
                        std::ptr::copy_nonoverlapping(tr.as_ptr(), dst, rn);
                    }
                }
            }
        }
    }
}

/// Transposes the 16 × 16 block whose row `i` is `src[i·ld ..][..16]` into `dst`, row `k` at
/// `dst[k·stride ..][..16]`: in registers, by 32-bit and 64-bit interleaves within 128-bit lanes
/// and two rounds of 128-bit lane shuffles (64 shuffles for 16 loads and 16 stores).
///
/// # Safety
/// The CPU has AVX-512F; the 16 source and 16 destination runs are readable / writable and do
/// not overlap.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn transpose16(src: *const f32, ld: usize, dst: *mut f32, stride: usize) {
    use std::arch::x86_64::*;
    // SAFETY: the caller's contract (every load and store below is one of the 16 runs).
    unsafe {
        let r: [__m512; 16] = std::array::from_fn(|i| _mm512_loadu_ps(src.add(i * ld)));
        // a[2j], a[2j + 1]: rows 2j, 2j + 1 interleaved by 32 bits (elements 0–1, 2–3 of a lane).
        let a: [__m512d; 16] = std::array::from_fn(|n| {
            let (x, y) = (r[n & !1], r[n | 1]);
            _mm512_castps_pd(if n % 2 == 0 {
                _mm512_unpacklo_ps(x, y)
            } else {
                _mm512_unpackhi_ps(x, y)
            })
        });
        // b[4g + c], lane L: rows 4g .. 4g + 4 of column 4L + c.
        let b: [__m512; 16] = std::array::from_fn(|n| {
            let (g, c) = (n / 4, n % 4);
            let (x, y) = (a[4 * g + c / 2], a[4 * g + c / 2 + 2]);
            _mm512_castpd_ps(if c % 2 == 0 {
                _mm512_unpacklo_pd(x, y)
            } else {
                _mm512_unpackhi_pd(x, y)
            })
        });
        for c in 0..4 {
            let (x, y, z, w) = (b[c], b[4 + c], b[8 + c], b[12 + c]);
            let e0 = _mm512_shuffle_f32x4::<0x44>(x, y);
            let e1 = _mm512_shuffle_f32x4::<0xee>(x, y);
            let f0 = _mm512_shuffle_f32x4::<0x44>(z, w);
            let f1 = _mm512_shuffle_f32x4::<0xee>(z, w);
            let out = [
                _mm512_shuffle_f32x4::<0x88>(e0, f0),
                _mm512_shuffle_f32x4::<0xdd>(e0, f0),
                _mm512_shuffle_f32x4::<0x88>(e1, f1),
                _mm512_shuffle_f32x4::<0xdd>(e1, f1),
            ];
            for (l, v) in out.into_iter().enumerate() {
                _mm512_storeu_ps(dst.add((4 * l + c) * stride), v);
            }
        }
    }
}

/// [`transpose16`] with AVX2: four 8 × 8 blocks, each by 32-bit interleaves, 64-bit shuffles
/// within 128-bit lanes and a round of 128-bit lane permutes (24 shuffles for 8 loads and 8
/// stores).
///
/// # Safety
/// The CPU has AVX2; the runs as [`transpose16`]'s.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn transpose16_avx2(src: *const f32, ld: usize, dst: *mut f32, stride: usize) {
    use std::arch::x86_64::*;
    for (i0, k0) in [(0, 0), (0, 8), (8, 0), (8, 8)] {
        // SAFETY: the caller's contract (every load and store below is inside one of the runs).
        unsafe {
            let r: [__m256; 8] =
                std::array::from_fn(|i| _mm256_loadu_ps(src.add((i0 + i) * ld + k0)));
            // a[2j], a[2j + 1]: rows 2j, 2j + 1 interleaved by 32 bits.
            let a: [__m256; 8] = std::array::from_fn(|n| {
                let (x, y) = (r[n & !1], r[n | 1]);
                if n % 2 == 0 {
                    _mm256_unpacklo_ps(x, y)
                } else {
                    _mm256_unpackhi_ps(x, y)
                }
            });
            // b[4g + c]: rows 4g .. 4g + 4 of columns c (low lane) and c + 4 (high lane).
            let b: [__m256; 8] = std::array::from_fn(|n| {
                let (g, c) = (n / 4, n % 4);
                let (x, y) = (a[4 * g + c / 2], a[4 * g + c / 2 + 2]);
                if c % 2 == 0 {
                    _mm256_shuffle_ps::<0x44>(x, y)
                } else {
                    _mm256_shuffle_ps::<0xee>(x, y)
                }
            });
            for c in 0..4 {
                let lo = _mm256_permute2f128_ps::<0x20>(b[c], b[4 + c]);
                let hi = _mm256_permute2f128_ps::<0x31>(b[c], b[4 + c]);
                _mm256_storeu_ps(dst.add((k0 + c) * stride + i0), lo);
                _mm256_storeu_ps(dst.add((k0 + c + 4) * stride + i0), hi);
            }
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn transpose16(_: *const f32, _: usize, _: *mut f32, _: usize) {
    unreachable!("no AVX-512 width off x86_64")
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn transpose16_avx2(_: *const f32, _: usize, _: *mut f32, _: usize) {
    unreachable!("no AVX2 width off x86_64")
}

/// `y = Σ_j w_j · part_j` per element, `j` in order from `+0.0` (each product rounded, then
/// added: the oracle's `moe_ffn` sum), for the `k` rows `part[pos[j]·d ..][..d]`.
#[inline(always)]
fn weighted_rows(y: &mut [f32], part: &[f32], pos: &[usize], w: &[f32]) {
    let d = y.len();
    y.fill(0.0);
    for (&p, &wj) in pos.iter().zip(w) {
        for (o, &v) in y.iter_mut().zip(&part[p * d..(p + 1) * d]) {
            *o += v * wj;
        }
    }
}

/// The residual `r = x − d · q` of a quantized block (`x` its 256 inputs).
#[inline(always)]
fn residual(b: &BlockQ8K, x: &[f32], r: &mut [f32; QK]) {
    for ((ri, &xi), &qi) in r.iter_mut().zip(x).zip(&b.qs) {
        *ri = xi - b.d * f32::from(qi);
    }
}

impl WeightProduct for QuantHeadMatMul {
    /// `[H, n_in]` in, `[H, n_out]` out.
    fn per_token(&self) -> (usize, usize) {
        (self.heads * self.n_in, self.heads * self.n_out)
    }

    /// `y[t, h, o] = W[h][o, :] · q8(x[t, h, :])`: `w` the raw `H · n_out` rows (head-major).
    fn run(&self, w: &[u8], x: &[f32], y: &mut [f32], buf: &mut CpuBuffers) {
        let (n_in, n_out, heads) = (self.n_in, self.n_out, self.heads);
        let t = x.len() / (heads * n_in);
        let nb = self.w.planes * n_in / QK;
        quantize_rows(x, n_in, self.w.planes, &mut buf.xq);
        let xq = &buf.xq[..t * heads * nb];
        if t == 1 {
            // One token: head `h`'s input is already rows `h·nb ..` and its outputs `y[h·n_out ..]`.
            y[..heads * n_out]
                .par_chunks_mut(n_out.max(1))
                .enumerate()
                .for_each(|(h, yh)| {
                    let xh = &xq[h * nb..(h + 1) * nb];
                    self.w.product(w, h * n_out, (h + 1) * n_out, xh, None, yh);
                });
            return;
        }
        // Each head's rows gathered token by token, and packed for the tile kernel when there are
        // enough of them.
        let per_head: Vec<(Vec<BlockQ8K>, Option<Packed>)> = (0..heads)
            .into_par_iter()
            .map(|h| {
                let mut xh: Vec<BlockQ8K> = Vec::with_capacity(t * nb);
                for tok in 0..t {
                    xh.extend_from_slice(&xq[(tok * heads + h) * nb..(tok * heads + h + 1) * nb]);
                }
                let grid = self.w.grid.is_some() && t * self.w.planes >= GRID_MIN_ROWS;
                let packed = grid.then(|| pack(&xh, t, self.w.planes));
                (xh, packed)
            })
            .collect();
        let out = SharedOut::new(&mut y[..t * heads * n_out]);
        let chunks = n_out.div_ceil(MOE_ROWS);
        (0..heads * chunks).into_par_iter().for_each(|item| {
            let (h, o0) = (item / chunks, (item % chunks) * MOE_ROWS);
            let o1 = (o0 + MOE_ROWS).min(n_out);
            let (xh, packed) = &per_head[h];
            let mut v = vec![0f32; (o1 - o0) * t];
            let (r0, r1) = (h * n_out + o0, h * n_out + o1);
            self.w.product(w, r0, r1, xh, packed.as_ref(), &mut v);
            // Output (token, head, o) is at `(tok·heads + h)·n_out + o`: token rows of
            // `heads · n_out`, this item's outputs from `h·n_out + o0`.
            scatter_tokens(&v, h * n_out + o0, t, heads * n_out, &out);
        });
    }
}

/// The little-endian f32 values of `bytes` (a whole number of 4): read in place when 4-byte
/// aligned, else copied into `copy`.
fn f32_view<'a>(bytes: &'a [u8], copy: &'a mut Vec<f32>) -> &'a [f32] {
    // SAFETY: `align_to` only reinterprets the aligned middle of `bytes`; every bit pattern is a
    // valid f32.
    let (head, v, _) = unsafe { bytes.align_to::<f32>() };
    if head.is_empty() && v.len() == bytes.len() / 4 {
        return v;
    }
    copy.clear();
    copy.extend(
        bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
    );
    &copy[..]
}

impl WeightProduct for F32MatMul {
    fn per_token(&self) -> (usize, usize) {
        (self.n_in, self.n_out)
    }

    /// `y[t, r] = W[r, :] · x[t, :]` in f32. At one token each output is
    /// [`crate::gguf::quant::dot_row`] of its row ([`crate::gguf::quant::dot_rows`], chunks of
    /// [`F32_DECODE_ROWS`] rows in parallel): the oracle's value, the same dot in the same order.
    /// At more: `x [T, n_in] × Wᵀ [n_in, n_out]` by `matrixmultiply::sgemm` (the weight read in
    /// place when 4-byte aligned, else copied into `buf.wf`).
    fn run(&self, w: &[u8], x: &[f32], y: &mut [f32], buf: &mut CpuBuffers) {
        let (n_in, n_out) = (self.n_in, self.n_out);
        let t = x.len() / n_in;
        if t == 1 {
            y[..n_out]
                .par_chunks_mut(F32_DECODE_ROWS)
                .zip(w[..n_in * n_out * 4].par_chunks(F32_DECODE_ROWS * n_in * 4))
                .for_each(|(ys, ws)| {
                    crate::gguf::quant::dot_rows(GgmlType::F32, ws, x, ys)
                        .expect("whole F32 rows, checked by plan_fast_steps")
                });
            return;
        }
        let wf = f32_view(&w[..n_in * n_out * 4], &mut buf.wf);
        // B = Wᵀ [n_in, n_out]: element (i, r) at wf[r·n_in + i].
        gemm(t, n_in, n_out, x, n_in, wf, 1, n_in, &mut y[..t * n_out]);
    }
}

impl WeightProduct for F32HeadGemm {
    /// `[H, n_in]` in, `[H, n_out]` out.
    fn per_token(&self) -> (usize, usize) {
        (self.heads * self.n_in, self.heads * self.n_out)
    }

    /// `y[t, h, o] = W[h][o, :] · x[t, h, :]` in f32. At one token each output is
    /// [`crate::gguf::quant::dot_row`] of its row ([`crate::gguf::quant::dot_rows`], heads in
    /// parallel): the oracle's value, which dequantizes the row and takes the dot in the same
    /// order. At more: `w` dequantized into `buf.wf` (rows in parallel), then per head (in
    /// parallel) `x_h [T, n_in] × W_hᵀ [n_in, n_out]` by `matrixmultiply::sgemm`.
    fn run(&self, w: &[u8], x: &[f32], y: &mut [f32], buf: &mut CpuBuffers) {
        let (n_in, n_out, heads) = (self.n_in, self.n_out, self.heads);
        let t = x.len() / (heads * n_in);
        let rows = heads * n_out;
        let rb = w.len() / rows.max(1);
        if t == 1 {
            y[..rows]
                .par_chunks_mut(n_out.max(1))
                .zip(w.par_chunks((rb * n_out).max(1)))
                .zip(x.par_chunks(n_in.max(1)))
                .for_each(|((yh, wh), xh)| {
                    crate::gguf::quant::dot_rows(self.ty, wh, xh, yh).expect(
                        "whole rows of a type with a dot kernel, checked by plan_fast_steps",
                    )
                });
            return;
        }
        if buf.wf.len() < rows * n_in {
            buf.wf.resize(rows * n_in, 0.0);
        }
        buf.wf[..rows * n_in]
            .par_chunks_mut(n_in)
            .zip(w.par_chunks(rb.max(1)))
            .for_each(|(dst, src)| {
                crate::gguf::quant::dequantize_row(self.ty, src, dst)
                    .expect("whole rows of a type with a dequantizer, checked by plan_fast_steps")
            });
        let wf = &buf.wf[..rows * n_in];
        assert!(
            x.len() == t * heads * n_in && y.len() >= t * heads * n_out,
            "head_mat_mul extents"
        );
        let out = SharedOut::new(&mut y[..t * heads * n_out]);
        (0..heads).into_par_iter().for_each(|h| {
            // SAFETY: A = x_h [T, n_in] (row stride H·n_in from x[h·n_in]), B = W_hᵀ [n_in,
            // n_out] (element (i, o) at wf[(h·n_out + o)·n_in + i]), C = y_h [T, n_out] (row stride
            // H·n_out from y[h·n_out]); all inside the slices (extents asserted above), and the
            // heads write disjoint C elements; beta = 0.
            unsafe {
                matrixmultiply::sgemm(
                    t,
                    n_in,
                    n_out,
                    1.0,
                    x.as_ptr().add(h * n_in),
                    (heads * n_in) as isize,
                    1,
                    wf.as_ptr().add(h * n_out * n_in),
                    1,
                    n_in as isize,
                    0.0,
                    out.base().add(h * n_out),
                    (heads * n_out) as isize,
                    1,
                );
            }
        });
    }
}

impl QuantMoe {
    /// The model width `d` (elements of an `h` and an output row).
    pub(crate) fn width(&self) -> usize {
        self.d
    }

    /// `y[t] = Σ_j w[t, j] · down_e(silu(gate_e · h[t]) ⊙ (up_e · h[t]))`, `e = ids[t, j]`.
    ///
    /// `h` `[T, d]`, `ids` and `wts` `[T, k]` (ids already checked below the expert count),
    /// `tables[0]` the gate (or fused gate/up) slice of each expert, then the up slices when split,
    /// then the down slices; `y` `[T, d]`.
    pub(crate) fn run(
        &self,
        h: &[f32],
        ids: &[i32],
        wts: &[f32],
        tables: &[Vec<WeightRows<'_>>],
        y: &mut [f32],
        buf: &mut CpuBuffers,
    ) {
        let (d, n_ff) = (self.d, self.n_ff);
        let t = h.len() / d;
        let k = ids.len() / t.max(1);
        let slots = t * k;
        let (gate_t, up_t, down_t) = if self.fused {
            (&tables[0], &tables[0], &tables[1])
        } else {
            (&tables[0], &tables[1], &tables[2])
        };
        let n_expert = gate_t.len();
        // The slots grouped by expert (slot order inside a group): group position p holds slot
        // order[p]; expert e owns positions start[e]..start[e + 1].
        let mut start = vec![0usize; n_expert + 1];
        for &e in ids {
            start[e as usize + 1] += 1;
        }
        for e in 0..n_expert {
            start[e + 1] += start[e];
        }
        let mut order = vec![0usize; slots];
        let mut pos_of = vec![0usize; slots];
        let mut fill = start.clone();
        for (slot, &e) in ids.iter().enumerate() {
            let p = fill[e as usize];
            fill[e as usize] += 1;
            order[p] = slot;
            pos_of[slot] = p;
        }
        let used: Vec<usize> = (0..n_expert).filter(|&e| start[e + 1] > start[e]).collect();

        let planes = self.gate.planes;
        quantize_rows(h, d, planes, &mut buf.xq);
        let (nb_d, nb_f) = (planes * d / QK, planes * n_ff / QK);
        // The quantized h row of each group position's token.
        if buf.hg.len() < slots * nb_d {
            buf.hg.resize(slots * nb_d, BlockQ8K::ZERO);
        }
        let hq = &buf.xq[..t * nb_d];
        buf.hg[..slots * nb_d]
            .par_chunks_mut(nb_d)
            .zip(order.par_iter())
            .for_each(|(dst, &slot)| {
                let tok = slot / k;
                dst.copy_from_slice(&hq[tok * nb_d..(tok + 1) * nb_d]);
            });
        let hg = &buf.hg[..slots * nb_d];
        if buf.ffn.len() < slots * n_ff.max(d) {
            buf.ffn.resize(slots * n_ff.max(d), 0.0);
        }
        let items = |n: usize| -> Vec<(usize, usize)> {
            used.iter()
                .flat_map(|&e| (0..n.div_ceil(MOE_ROWS)).map(move |c| (e, c * MOE_ROWS)))
                .collect()
        };
        // Each used expert's group packed for the tile kernels, when a weight has one and the
        // group has enough rows for them to pay ([`GRID_MIN_ROWS`]).
        // (The many-token kernel takes an interleaved expert's group instead where the cost
        // model of `Rows::prefers_tokens` predicts it faster.)
        let packs = |x: &[BlockQ8K], nb: usize, any: bool, w: &Rows, t: &[WeightRows<'_>]| {
            (0..n_expert)
                .into_par_iter()
                .map(|e| {
                    let (p0, p1) = (start[e], start[e + 1]);
                    let tokens = t[e].interleaved && w.prefers_tokens(p1 - p0);
                    (any && !tokens && (p1 - p0) * planes >= GRID_MIN_ROWS)
                        .then(|| pack(&x[p0 * nb..p1 * nb], p1 - p0, planes))
                })
                .collect::<Vec<Option<Packed>>>()
        };
        let hp = packs(
            hg,
            nb_d,
            self.gate.grid.or(self.up.grid).is_some(),
            &self.gate,
            gate_t,
        );
        {
            let act = SharedOut::new(&mut buf.ffn[..slots * n_ff]);
            items(n_ff).into_par_iter().for_each(|(e, f0)| {
                let (p0, p1, f1) = (start[e], start[e + 1], (f0 + MOE_ROWS).min(n_ff));
                let (x, m) = (&hg[p0 * nb_d..p1 * nb_d], p1 - p0);
                let mut gv = vec![0f32; (f1 - f0) * m];
                let mut uv = vec![0f32; (f1 - f0) * m];
                self.gate
                    .layout_product(gate_t[e], f0, f1, x, hp[e].as_ref(), &mut gv);
                let (u0, u1) = (self.up_off + f0, self.up_off + f1);
                self.up
                    .layout_product(up_t[e], u0, u1, x, hp[e].as_ref(), &mut uv);
                silu_mul(&mut gv, &uv);
                // (group position, f) pairs are disjoint across work items.
                scatter_tokens(&gv, p0 * n_ff + f0, m, n_ff, &act);
            });
        }
        drop(hp);
        quantize_rows(&buf.ffn[..slots * n_ff], n_ff, planes, &mut buf.aq);
        let aq = &buf.aq[..slots * nb_f];
        let ap = packs(aq, nb_f, self.down.grid.is_some(), &self.down, down_t);
        {
            let part = SharedOut::new(&mut buf.ffn[..slots * d]);
            items(d).into_par_iter().for_each(|(e, o0)| {
                let (p0, p1, o1) = (start[e], start[e + 1], (o0 + MOE_ROWS).min(d));
                let (x, m) = (&aq[p0 * nb_f..p1 * nb_f], p1 - p0);
                let mut v = vec![0f32; (o1 - o0) * m];
                self.down
                    .layout_product(down_t[e], o0, o1, x, ap[e].as_ref(), &mut v);
                // (group position, o) pairs are disjoint across work items.
                scatter_tokens(&v, p0 * d + o0, m, d, &part);
            });
        }
        let part = &buf.ffn[..slots * d];
        y[..t * d]
            .par_chunks_mut(d)
            .enumerate()
            .for_each(|(tok, yr)| {
                let (pos, w) = (
                    &pos_of[tok * k..(tok + 1) * k],
                    &wts[tok * k..(tok + 1) * k],
                );
                wide_call!(weighted_rows(yr: &mut [f32], part: &[f32], pos: &[usize], w: &[f32]));
            });
    }
}

/// Below this many rows, a GEMM is split over its output columns instead of its rows, so that
/// no task packs the whole right-hand matrix again.
const GEMM_COLUMN_SPLIT_ROWS: usize = 64;

/// One task's block of `C`: rows `r0 .. r0 + rows`, columns `c0 .. c0 + cols`.
#[derive(Clone, Copy, Debug)]
struct Block {
    r0: usize,
    rows: usize,
    c0: usize,
    cols: usize,
}

/// The blocks of an `[m, n]` product: row blocks, or column blocks below
/// [`GEMM_COLUMN_SPLIT_ROWS`] rows.
fn split(m: usize, n: usize) -> Vec<Block> {
    let threads = rayon::current_num_threads();
    if m < GEMM_COLUMN_SPLIT_ROWS {
        let cols = n.div_ceil(threads * 2).max(1);
        (0..n)
            .step_by(cols)
            .map(|c0| Block {
                r0: 0,
                rows: m,
                c0,
                cols: cols.min(n - c0),
            })
            .collect()
    } else {
        let rows = m.div_ceil(threads * 4).max(1);
        (0..m)
            .step_by(rows)
            .map(|r0| Block {
                r0,
                rows: rows.min(m - r0),
                c0: 0,
                cols: n,
            })
            .collect()
    }
}

/// `C[m, n] = A[m, k] × B[k, n]` by `matrixmultiply::sgemm` over the rayon pool, one task per
/// block of [`split`]. Strides in elements: `A` row `rsa` (column 1), `B` row `rsb` / column
/// `csb`, `C` row `n` (column 1). Every element is the same sum in the same order whatever the
/// blocks (sgemm's order along `k` does not depend on the block of `C` it computes).
#[allow(clippy::too_many_arguments)]
fn gemm(
    m: usize,
    k: usize,
    n: usize,
    a: &[f32],
    rsa: usize,
    b: &[f32],
    rsb: usize,
    csb: usize,
    c: &mut [f32],
) {
    let last = |rows: usize, rs: usize, cols: usize, cs: usize| {
        if rows == 0 || cols == 0 {
            0
        } else {
            (rows - 1) * rs + (cols - 1) * cs + 1
        }
    };
    assert!(
        a.len() >= last(m, rsa, k, 1) && b.len() >= last(k, rsb, n, csb) && c.len() >= m * n,
        "gemm extents"
    );
    if m == 0 || n == 0 {
        return;
    }
    let out = SharedOut::new(&mut c[..m * n]);
    split(m, n).into_par_iter().for_each(|blk| {
        // SAFETY: A rows r0.. and B columns c0.. are inside the slices (extents asserted above,
        // blocks inside `[m, n]` by construction); C block (r0.., c0..) is inside `c` and
        // disjoint from every other task's; beta = 0, so C is only written.
        unsafe {
            matrixmultiply::sgemm(
                blk.rows,
                k,
                blk.cols,
                1.0,
                a.as_ptr().add(blk.r0 * rsa),
                rsa as isize,
                1,
                b.as_ptr().add(blk.c0 * csb),
                rsb as isize,
                csb as isize,
                0.0,
                out.base().add(blk.r0 * n + blk.c0),
                n as isize,
                1,
            );
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::q8::{q8_dot_fn, q8_grid_fn, q8_interleaved_fn, q8_rows_fn_by_row};
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn noise(n: usize, seed: u64) -> Vec<f32> {
        let mut r = ChaCha8Rng::seed_from_u64(seed);
        (0..n).map(|_| r.random_range(-1.0f32..1.0)).collect()
    }

    /// An f32 sum of `n` products is within `n · eps · Σ|a·b|` of the exact value (Higham,
    /// *Accuracy and Stability*, §3.1, for any summation order); the f64 reference is exact to
    /// far below that.
    fn check(got: f32, terms: &[(f32, f32)]) {
        let exact: f64 = terms.iter().map(|&(a, b)| a as f64 * b as f64).sum();
        let mag: f64 = terms
            .iter()
            .map(|&(a, b)| (a as f64 * b as f64).abs())
            .sum();
        let bound = terms.len() as f64 * f32::EPSILON as f64 * mag;
        assert!(
            (got as f64 - exact).abs() <= bound,
            "{got} vs {exact} (bound {bound})"
        );
    }

    /// `scatter_tokens` puts element `(i, tok)` of `[rows, T]` at `tok·stride + r0 + i` and
    /// nothing else, for whole 16 × 16 blocks (the register transpose), partial ones and both.
    #[test]
    fn scatter_tokens_is_the_element_transpose() {
        for (rows, t, r0, stride) in [
            (16, 16, 0, 16),
            (64, 48, 3, 80),
            (21, 37, 5, 40),
            (1, 1, 0, 1),
        ] {
            let ys: Vec<f32> = (0..rows * t).map(|v| v as f32 + 0.5).collect();
            let mut y = vec![-1.0f32; t * stride];
            let out = SharedOut::new(&mut y);
            scatter_tokens(&ys, r0, t, stride, &out);
            let mut want = vec![-1.0f32; t * stride];
            for i in 0..rows {
                for tok in 0..t {
                    want[tok * stride + r0 + i] = ys[i * t + tok];
                }
            }
            assert_eq!(y, want, "{rows} x {t} at {r0}, stride {stride}");
        }
    }

    /// Both register transposes (where the CPU has their features) put element `(i, k)` of a
    /// 16 × 16 block read with leading dimension `ld` at `k·stride + i`, and nothing else.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn register_transposes_are_the_element_transpose() {
        let (ld, stride) = (37, 21);
        let src: Vec<f32> = (0..16 * ld).map(|v| v as f32 + 0.25).collect();
        let mut want = vec![-1.0f32; 16 * stride];
        for i in 0..16 {
            for k in 0..16 {
                want[k * stride + i] = src[i * ld + k];
            }
        }
        let isa = crate::isa::isa();
        for (name, has, f) in [
            (
                "avx2",
                isa.avx2,
                transpose16_avx2 as unsafe fn(*const f32, usize, *mut f32, usize),
            ),
            ("avx512", isa.avx512f, transpose16),
        ] {
            if !has {
                println!("note: no {name} on this CPU: its transpose unchecked");
                continue;
            }
            let mut dst = vec![-1.0f32; 16 * stride];
            // SAFETY: the CPU has the features (just checked); 16 runs of 16 inside each buffer.
            unsafe { f(src.as_ptr(), ld, dst.as_mut_ptr(), stride) };
            assert_eq!(dst, want, "{name}");
        }
    }

    /// Every (token, head, o) of a fast `head_mat_mul` is the single-row kernel's dot of head
    /// `h`'s row `o` with that token's head-`h` input, planes added in order: at one token (the
    /// decode kernel), with and without the tile kernel (where the CPU has one), below and above
    /// its `GRID_MIN_ROWS`.
    #[test]
    fn head_mat_mul_dots_each_head_row_with_its_own_head() {
        let (n_in, n_out, heads) = (512, 70, 3);
        let ty = GgmlType::Q2_K;
        let rb = ty.row_size(n_in).unwrap();
        let mut w = vec![0u8; rb * n_out * heads];
        let sampler = crate::gguf::quant::random::BlockSampler::new(ty).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(4);
        for row in w.chunks_exact_mut(rb) {
            sampler.fill_row(&mut rng, 0.5, n_in, row).unwrap();
        }
        let dot = q8_dot_fn(ty).unwrap();
        for (t, planes) in [(1, 1), (1, 2), (2, 1), (9, 1), (5, 2)] {
            for grid in [None, q8_grid_fn(ty)] {
                let x = noise(t * heads * n_in, 5);
                let op = QuantHeadMatMul {
                    n_in,
                    n_out,
                    heads,
                    w: rows(ty, n_in, grid, planes),
                };
                let mut y = vec![f32::NAN; op.output_len(t)];
                op.run(&w, &x, &mut y, &mut CpuBuffers::default());
                let mut xq = Vec::new();
                quantize_rows(&x, n_in, planes, &mut xq);
                let nb = n_in / QK;
                for r in 0..t * heads {
                    let h = r % heads;
                    for o in 0..n_out {
                        let row = &w[(h * n_out + o) * rb..(h * n_out + o + 1) * rb];
                        let xr = &xq[r * planes * nb..(r + 1) * planes * nb];
                        let want = xr
                            .chunks_exact(nb)
                            .map(|p| dot(row, p))
                            .reduce(|a, b| a + b)
                            .unwrap();
                        assert_eq!(
                            y[r * n_out + o].to_bits(),
                            want.to_bits(),
                            "t {t} planes {planes} grid {} row {r} o {o}",
                            grid.is_some()
                        );
                    }
                }
            }
        }
    }

    /// `n` random rows of `ty` with `k` elements each, back to back.
    fn matrix(ty: GgmlType, n: usize, k: usize, seed: u64) -> Vec<u8> {
        let rb = ty.row_size(k).unwrap();
        let mut w = vec![0u8; rb * n];
        let sampler = crate::gguf::quant::random::BlockSampler::new(ty).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        for row in w.chunks_exact_mut(rb) {
            sampler.fill_row(&mut rng, 0.5, k, row).unwrap();
        }
        w
    }

    /// `experts` fused gate/up matrices (Q2_K, `2·n_ff` rows of `d`) and down matrices (Q3_K,
    /// `d` rows of `n_ff`), seeds from `seed`.
    fn expert_matrices(d: usize, n_ff: usize, experts: usize, seed: u64) -> [Vec<Vec<u8>>; 2] {
        let (q2, q3) = (GgmlType::Q2_K, GgmlType::Q3_K);
        [
            (0..experts)
                .map(|e| matrix(q2, 2 * n_ff, d, seed + e as u64))
                .collect(),
            (0..experts)
                .map(|e| matrix(q3, d, n_ff, seed + 10 + e as u64))
                .collect(),
        ]
    }

    /// `moe_ffn`'s expert tables over [`expert_matrices`] (or their [`interleaved`] copies).
    fn expert_tables(m: &[Vec<Vec<u8>>; 2], interleaved: bool) -> Vec<Vec<WeightRows<'_>>> {
        m.iter()
            .map(|t| {
                t.iter()
                    .map(|v| WeightRows {
                        bytes: v,
                        interleaved,
                    })
                    .collect()
            })
            .collect()
    }

    /// [`expert_matrices`] in the interleaved layout, as the fast store copies them.
    fn interleaved(m: &[Vec<Vec<u8>>; 2], d: usize, n_ff: usize) -> [Vec<Vec<u8>>; 2] {
        let il = |ty: GgmlType, k: usize, v: &Vec<u8>| {
            let mut out = vec![0u8; v.len()];
            crate::backend::cpu::q8::interleave_rows(ty, v, &mut out, ty.row_size(k).unwrap())
                .unwrap();
            out
        };
        [
            m[0].iter().map(|v| il(GgmlType::Q2_K, d, v)).collect(),
            m[1].iter().map(|v| il(GgmlType::Q3_K, n_ff, v)).collect(),
        ]
    }

    fn rows(ty: GgmlType, k: usize, grid: Option<Q8GridFn>, planes: usize) -> Rows {
        Rows {
            ty,
            row_bytes: ty.row_size(k).unwrap(),
            many: type_kernels(ty).unwrap().many,
            decode: type_kernels(ty).unwrap().rows,
            grid,
            interleaved: type_kernels(ty).unwrap().interleaved,
            planes,
        }
    }

    /// Experts in the fast store's interleaved layout give a `moe_ffn` the bits of the file's
    /// layout: at one token (the interleaved decode kernel), a few (the many-token kernel) and many
    /// (the interleaved tile kernel, where the CPU has tile kernels), one and two planes.
    #[test]
    fn interleaved_experts_give_the_same_bits() {
        let (q2, q3) = (GgmlType::Q2_K, GgmlType::Q3_K);
        if q8_interleaved_fn(q2).is_none() {
            println!("note: no AVX-512 VNNI on this CPU: interleaved checks skipped");
            return;
        }
        let (d, n_ff, experts, k) = (512, 256, 5, 2);
        let own = expert_matrices(d, n_ff, experts, 20);
        let il = interleaved(&own, d, n_ff);
        for planes in [1, 2] {
            for t in [1, 2, 8, 70] {
                let x = noise(t * d, 50 + t as u64);
                let ids: Vec<i32> = (0..t * k)
                    .map(|i| ((i * 3 + i / 4) % experts) as i32)
                    .collect();
                let wts = noise(t * k, 60);
                let run = |m: &[Vec<Vec<u8>>; 2], interleaved: bool| {
                    let moe = QuantMoe {
                        d,
                        n_ff,
                        gate: rows(q2, d, q8_grid_fn(q2), planes),
                        up: rows(q2, d, q8_grid_fn(q2), planes),
                        down: rows(q3, n_ff, q8_grid_fn(q3), planes),
                        up_off: n_ff,
                        fused: true,
                    };
                    let mut y = vec![f32::NAN; t * d];
                    let tables = expert_tables(m, interleaved);
                    moe.run(&x, &ids, &wts, &tables, &mut y, &mut CpuBuffers::default());
                    y
                };
                let (a, b) = (run(&own, false), run(&il, true));
                assert!(
                    a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
                    "planes {planes} tokens {t}"
                );
                assert!(a.iter().all(|v| v.is_finite()));
            }
        }
    }

    /// A dense `mat_mul` weight in the interleaved layout (the store's copy) gives the bits of
    /// the file's layout: at one token (decode kernel, chunks of whole groups), at a few tokens
    /// (the many-token kernel) and with the tile kernel, one and two planes, for row counts
    /// whose parallel chunks are not multiples of 16 in the file's layout (320 = `kv_a`).
    #[test]
    fn interleaved_dense_weights_give_the_same_bits() {
        if q8_interleaved_fn(GgmlType::Q2_K).is_none() {
            println!("note: no AVX-512 VNNI on this CPU: interleaved checks skipped");
            return;
        }
        let d = 512;
        for (ty, n_out) in [
            (GgmlType::Q2_K, 320),
            (GgmlType::Q3_K, 48),
            (GgmlType::Q2_K, 1040),
        ] {
            let own = matrix(ty, n_out, d, 80 + n_out as u64);
            let mut il = vec![0u8; own.len()];
            crate::backend::cpu::q8::interleave_rows(ty, &own, &mut il, ty.row_size(d).unwrap())
                .unwrap();
            for planes in [1, 2] {
                let m = QuantMatMul {
                    n_in: d,
                    n_out,
                    w: rows(ty, d, q8_grid_fn(ty), planes),
                };
                for t in [1, 2, 3, 8, 70] {
                    let x = noise(t * d, 90 + t as u64);
                    let (mut a, mut b) = (vec![f32::NAN; t * n_out], vec![f32::NAN; t * n_out]);
                    m.run(&own, &x, &mut a, &mut CpuBuffers::default());
                    let copy = WeightRows {
                        bytes: &il,
                        interleaved: true,
                    };
                    m.run_rows(copy, &x, &mut b, &mut CpuBuffers::default());
                    assert!(a.iter().all(|v| v.is_finite()), "{ty} {n_out} t {t}");
                    assert!(
                        a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
                        "{ty} {n_out} rows, planes {planes}, tokens {t}"
                    );
                }
            }
        }
    }

    /// The tile kernels change no bit of a `mat_mul` or a `moe_ffn`: the same outputs with and
    /// without them, at one token (decode) and at token counts below and above
    /// `GRID_MIN_ROWS` and `GRID_TOKENS`, one and two planes, with a last token that goes to
    /// the decode kernel (`tail_token`: 65 tokens leave one alone in the last tile; 23 tokens
    /// give four of the five experts 9 tokens each). Skipped with a note where the CPU has no tile
    /// kernel.
    #[test]
    fn tile_kernels_give_the_multi_row_bits() {
        let (q2, q3) = (GgmlType::Q2_K, GgmlType::Q3_K);
        let (Some(g2), Some(g3)) = (q8_grid_fn(q2), q8_grid_fn(q3)) else {
            println!("note: no AMX on this CPU or OS: tile checks skipped");
            return;
        };
        let (d, n_ff, n_out, experts, k) = (512, 256, 40, 5, 2);
        let w = matrix(q2, n_out, d, 7);
        let bytes = expert_matrices(d, n_ff, experts, 10);
        let tables = expert_tables(&bytes, false);
        assert!(tail_token(65, 1) && tail_token(65, 2) && tail_token(9, 2) && !tail_token(8, 2));
        for planes in [1, 2] {
            for t in [1, 3, 8, 23, 65, 70] {
                let x = noise(t * d, 30 + t as u64);
                let ids: Vec<i32> = (0..t * k)
                    .map(|i| ((i * 7 + i / 5) % experts) as i32)
                    .collect();
                let wts = noise(t * k, 40);
                let run = |tiles: bool| {
                    let mm = QuantMatMul {
                        n_in: d,
                        n_out,
                        w: rows(q2, d, tiles.then_some(g2), planes),
                    };
                    let mut y = vec![f32::NAN; t * n_out];
                    mm.run(&w, &x, &mut y, &mut CpuBuffers::default());
                    let moe = QuantMoe {
                        d,
                        n_ff,
                        gate: rows(q2, d, tiles.then_some(g2), planes),
                        up: rows(q2, d, tiles.then_some(g2), planes),
                        down: rows(q3, n_ff, tiles.then_some(g3), planes),
                        up_off: n_ff,
                        fused: true,
                    };
                    let mut m = vec![f32::NAN; t * d];
                    moe.run(&x, &ids, &wts, &tables, &mut m, &mut CpuBuffers::default());
                    (y, m)
                };
                let (with, without) = (run(true), run(false));
                for (what, a, b) in [
                    ("mat_mul", &with.0, &without.0),
                    ("moe", &with.1, &without.1),
                ] {
                    assert!(
                        a.iter().all(|v| v.is_finite()),
                        "{what} t {t} planes {planes}"
                    );
                    let same = a.iter().zip(b).all(|(p, q)| p.to_bits() == q.to_bits());
                    assert!(same, "{what} t {t} planes {planes}");
                }
            }
        }
    }

    /// The decode kernels change no bit of a one-token `mat_mul` or `moe_ffn`: the same outputs
    /// as with their row-by-row fallback (the multi-row kernel per weight row), one and two
    /// planes, row counts that do and do not fill the kernels' groups.
    #[test]
    fn decode_kernels_give_the_row_by_row_bits() {
        let (q2, q3) = (GgmlType::Q2_K, GgmlType::Q3_K);
        let (d, n_ff, experts, k) = (512, 256, 5, 3);
        let bytes = expert_matrices(d, n_ff, experts, 50);
        let tables = expert_tables(&bytes, false);
        let x = noise(d, 70);
        let (ids, wts) = (vec![4, 1, 3], noise(k, 71));
        for planes in [1, 2] {
            for (ty, n_out) in [(q2, 8), (q2, 37), (q3, 41)] {
                let w = matrix(ty, n_out, d, 72);
                let run = |fallback: bool| {
                    let mut r = rows(ty, d, None, planes);
                    if fallback {
                        r.decode = q8_rows_fn_by_row(ty).unwrap();
                    }
                    let mm = QuantMatMul {
                        n_in: d,
                        n_out,
                        w: r,
                    };
                    let mut y = vec![f32::NAN; n_out];
                    mm.run(&w, &x, &mut y, &mut CpuBuffers::default());
                    y
                };
                let (a, b) = (run(false), run(true));
                assert!(
                    a.iter().all(|v| v.is_finite()),
                    "{ty} {n_out} planes {planes}"
                );
                assert!(
                    a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits()),
                    "mat_mul {ty} {n_out} planes {planes}"
                );
            }
            let run = |fallback: bool| {
                let r = |ty, k| {
                    let mut r = rows(ty, k, None, planes);
                    if fallback {
                        r.decode = q8_rows_fn_by_row(ty).unwrap();
                    }
                    r
                };
                let moe = QuantMoe {
                    d,
                    n_ff,
                    gate: r(q2, d),
                    up: r(q2, d),
                    down: r(q3, n_ff),
                    up_off: n_ff,
                    fused: true,
                };
                let mut m = vec![f32::NAN; d];
                moe.run(&x, &ids, &wts, &tables, &mut m, &mut CpuBuffers::default());
                m
            };
            let (a, b) = (run(false), run(true));
            assert!(a.iter().all(|v| v.is_finite()), "moe planes {planes}");
            assert!(
                a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits()),
                "moe planes {planes}"
            );
        }
    }

    /// The f32 `head_mat_mul` (a Q4_0 weight of 64-element rows, as `attn_k_b`): every output
    /// is the matrix product of its head's dequantized rows with its head's input, to f32
    /// summation accuracy.
    #[test]
    fn head_gemm_is_each_heads_matrix_product() {
        let (n_in, n_out, heads, t) = (64, 40, 3, 5);
        let ty = GgmlType::Q4_0;
        let w = matrix(ty, heads * n_out, n_in, 12);
        let mut wf = vec![0f32; heads * n_out * n_in];
        crate::gguf::quant::dequantize_row(ty, &w, &mut wf).unwrap();
        let x = noise(t * heads * n_in, 13);
        let op = F32HeadGemm {
            n_in,
            n_out,
            heads,
            ty,
        };
        let mut y = vec![f32::NAN; op.output_len(t)];
        op.run(&w, &x, &mut y, &mut CpuBuffers::default());
        for tok in 0..t {
            for h in 0..heads {
                for o in 0..n_out {
                    let terms: Vec<_> = (0..n_in)
                        .map(|i| {
                            let xi = x[(tok * heads + h) * n_in + i];
                            (wf[(h * n_out + o) * n_in + i], xi)
                        })
                        .collect();
                    check(y[(tok * heads + h) * n_out + o], &terms);
                }
            }
        }
    }

    /// At one token the f32 `head_mat_mul` gives each output the type's dot of its row with its
    /// head's input bit for bit ([`crate::gguf::quant::dot_row`], the oracle's value: the
    /// executor's `quantized_mat_mul_equals_the_quant_dot_bitwise`), for Q4_0 and Q8_0.
    #[test]
    fn head_gemm_at_one_token_is_the_row_dot() {
        let (n_in, n_out, heads) = (64, 40, 3);
        for ty in [GgmlType::Q4_0, GgmlType::Q8_0] {
            let w = matrix(ty, heads * n_out, n_in, 16);
            let x = noise(heads * n_in, 17);
            let op = F32HeadGemm {
                n_in,
                n_out,
                heads,
                ty,
            };
            let mut y = vec![f32::NAN; op.output_len(1)];
            op.run(&w, &x, &mut y, &mut CpuBuffers::default());
            let rb = ty.row_size(n_in).unwrap();
            for h in 0..heads {
                for o in 0..n_out {
                    let r = h * n_out + o;
                    let xh = &x[h * n_in..(h + 1) * n_in];
                    let want =
                        crate::gguf::quant::dot_row(ty, &w[r * rb..(r + 1) * rb], xh).unwrap();
                    assert_eq!(y[r].to_bits(), want.to_bits(), "{ty} head {h} row {o}");
                }
            }
        }
    }

    /// The f32 `mat_mul` (the router's F32 weight), read in place and from a misaligned copy:
    /// every output is the matrix product to f32 summation accuracy.
    #[test]
    fn f32_mat_mul_is_the_matrix_product() {
        let (n_in, n_out, t) = (48, 7, 5);
        let w = noise(n_in * n_out, 14);
        let x = noise(t * n_in, 15);
        let bytes: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
        let mut shifted = vec![0u8; 1];
        shifted.extend_from_slice(&bytes);
        let op = F32MatMul { n_in, n_out };
        for raw in [&bytes[..], &shifted[1..]] {
            let mut y = vec![f32::NAN; op.output_len(t)];
            op.run(raw, &x, &mut y, &mut CpuBuffers::default());
            for tok in 0..t {
                for r in 0..n_out {
                    let terms: Vec<_> = (0..n_in)
                        .map(|i| (w[r * n_in + i], x[tok * n_in + i]))
                        .collect();
                    check(y[tok * n_out + r], &terms);
                }
            }
        }
    }

    #[test]
    fn two_planes_hold_the_activation_to_a_254th_of_one_plane_step() {
        let mut x = noise(3 * QK, 6);
        x[7] = 40.0;
        x[QK + 3] = -1e-3;
        x[2 * QK..].fill(0.0);
        let mut q = Vec::new();
        quantize_rows(&x, 3 * QK, 2, &mut q);
        let (hi, lo) = q.split_at(3);
        for b in 0..3 {
            let step = hi[b].d;
            assert!(lo[b].d <= step / 254.0 * (1.0 + 1e-6), "block {b}");
            for i in 0..QK {
                let v = hi[b].d * f32::from(hi[b].qs[i]) + lo[b].d * f32::from(lo[b].qs[i]);
                let err = (v - x[b * QK + i]).abs();
                assert!(
                    err <= lo[b].d / 2.0 + 4.0 * f32::EPSILON * x[b * QK + i].abs(),
                    "block {b} element {i}: {err}"
                );
            }
        }
        assert_eq!((hi[2].d, lo[2].d), (0.0, 0.0));
    }
}
