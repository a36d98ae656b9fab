//! Integer dot kernels of weight rows against Q8_K-quantized activations (the cpu backend).
//!
//! Algorithm. An activation row is quantized once to Q8_K ([`quantize_row_q8k`]): 256-element
//! blocks of one f32 scale `d8`, 256 i8 codes `x8[i] = qs[i]` and the 16 i16 sums
//! `bsum[j] = Σ x8[16j .. 16j+16]` (llama.cpp `block_q8_K`, `ggml/src/ggml-common.h`;
//! `quantize_row_q8_K_ref` in `ggml-quants.c`). Every weight row is dotted with it block by
//! block: codes times codes and the integer sub-block scales summed as exact `i32`s, then one
//! fixed f32 expression `value(b)` per block, the blocks added in order into one f32
//! accumulator: `acc = +0.0; for b in 0..nb: acc = acc + value(b)` (left to right).
//!
//! Per type (scales and codes as `kquants.rs` / `iquants.rs` / `legacy.rs` lay them out; `d`,
//! `dmin`: the block's f16 super-scales widened to f32; every `Σ` exact in i32; `f32(s)` the
//! conversion of the integer `s` to f32, round to nearest):
//!
//! | type | integer sums | `value(b)` in f32 |
//! |---|---|---|
//! | Q2_K | `S = Σ_j sc_j·Σ_{16} q·x8`, `M = Σ_j m_j·bsum_j` (j < 16) | `d8·(d·f32(S) − dmin·f32(M))` |
//! | Q3_K | `S = Σ_j (sc_j − 32)·Σ_{16} (q − 4·!hbit)·x8` | `d8·(d·f32(S))` |
//! | Q4_K, Q5_K | `S = Σ_j sc_j·Σ_{32} q·x8`, `M = Σ_j m_j·(bsum_2j + bsum_2j+1)` (j < 8) | `d8·(d·f32(S) − dmin·f32(M))` |
//! | Q6_K | `S = Σ_j sc_j·Σ_{16} (q − 32)·x8` | `d8·(d·f32(S))` |
//! | IQ2_XXS, IQ2_XS | `S = Σ_j (2·s_j + 1)·Σ grid·sign·x8` (j: the 32 or 16 elements of a scale) | `0.125·(d8·(d·f32(S)))` |
//! | Q4_0, Q8_0 | `S_k = Σ_{32} (q − 8)·x8` resp. `Σ_{32} q·x8` for the 8 weight blocks `k` | `d8·(((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7)))`, `p_k = d_k·f32(S_k)` |
//!
//! (`IQ2`: the dequantized value `d·(0.5 + s)·0.25·grid` is `d·(2s + 1)·grid / 8`.)
//!
//! Contract. Every kernel computes these integers and then the same f32 helpers (`shared.rs`)
//! (no FMA contraction: Rust never fuses `a·b + c`), so all give the scalar kernel's bits: the
//! scalar (`scalar.rs`) and AVX2 (`avx2.rs`) single-row kernels; [`q8_dot_many_fn`]'s one
//! weight row against several activation rows (prefill; `avx512/vnni.rs` and, on AVX2,
//! `avx2_many.rs` unpack each weight block once for all of them: Q2_K to Q6_K); the decode kernels of [`q8_rows_fn`] (`avx512/rows.rs`, `avx512/lanes.rs`, `avx2_rows.rs`,
//! `avx2_lanes.rs`:
//! the planes' values added in plane order); and [`q8_grid_fn`]'s many weight rows against many
//! activation rows packed as [`Q8Tiles`] (`tiles.rs`; Q2_K, Q3_K; sums by AMX's `tdpbusd` in
//! `avx512/amx.rs` or by VNNI in `avx512/grid.rs`). The result differs from the f32 oracle
//! [`crate::gguf::quant::dot_row`] by the activation rounding (|x − d8·x8| ≤ d8/2) and by f32 rounding
//! of a different summation order.

mod block;
mod scalar;
mod shared;
mod tiles;
mod types;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx2_grid;
#[cfg(target_arch = "x86_64")]
mod avx2_lanes;
#[cfg(target_arch = "x86_64")]
mod avx2_many;
#[cfg(target_arch = "x86_64")]
mod avx2_rows;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
use avx512::{grid, lanes, rows, vnni};

pub use block::{BlockQ8K, QK_K};
pub use tiles::{Q8Tiles, GROUP as Q8_TILE_ROWS};
pub use types::{Q8DotFn, Q8DotManyFn, Q8GridFn, Q8RowsFn, Q8TokensFn, MAX_PLANES};

use shared::{clamped, each_row, prefetch, prefetch_l2, rows_lengths};

use crate::ggml_type::GgmlType;
use crate::gguf::quant::QuantError;

/// Every Q8_K kernel of one ggml type on this CPU, resolved once per process ([`type_kernels`];
/// the role of ggml's `type_traits_cpu`): the single-row dot, the many-row dot, the decode kernel
/// and, where the CPU has them, the tile kernel and the interleaved layout's decode, tile and
/// many-token kernels. Every kernel gives the bits of the scalar one.
#[derive(Clone, Copy, Debug)]
pub struct TypeKernels {
    /// [`q8_dot_fn`].
    pub dot: Q8DotFn,
    /// [`q8_dot_many_fn`].
    pub many: Q8DotManyFn,
    /// [`q8_rows_fn`].
    pub rows: Q8RowsFn,
    /// [`q8_grid_fn`].
    pub grid: Option<Q8GridFn>,
    /// [`q8_interleaved_fn`], [`q8_grid_interleaved_fn`] and [`q8_interleaved_tokens_fn`], where
    /// the CPU has all three.
    pub interleaved: Option<(Q8RowsFn, Q8GridFn, Q8TokensFn)>,
}

/// The [`TypeKernels`] of `ty`, or None when it has no Q8_K dot (the types of [`q8_dot_fn`]).
pub fn type_kernels(ty: GgmlType) -> Option<&'static TypeKernels> {
    static TABLE: std::sync::OnceLock<Vec<Option<TypeKernels>>> = std::sync::OnceLock::new();
    let at = TYPES.iter().position(|&t| t == ty)?;
    let resolve = |ty: GgmlType| {
        Some(TypeKernels {
            dot: q8_dot_fn(ty)?,
            many: q8_dot_many_fn(ty)?,
            rows: q8_rows_fn(ty)?,
            grid: q8_grid_fn(ty),
            interleaved: q8_interleaved_fn(ty).and_then(|rows| {
                Some((
                    rows,
                    q8_grid_interleaved_fn(ty)?,
                    q8_interleaved_tokens_fn(ty)?,
                ))
            }),
        })
    };
    TABLE
        .get_or_init(|| TYPES.iter().map(|&t| resolve(t)).collect())
        .get(at)?
        .as_ref()
}

/// Quantizes `x` (len = 256 · y.len(), ggml `ne0` order) into `y`, one block per 256 values.
///
/// Rule, per block: `amax = max |x|`. If any element is not finite, `d = NaN` and `qs = 0` (so
/// the dot of any weight row with it is NaN, as in the f32 oracle). Else if `amax == 0`,
/// `d = 0` and `qs = 0`. Else `d = amax / 127` and `qs[i] = round(127 · (x[i] / amax))`, rounded
/// half away from zero and clamped to −127..=127 (`x / amax` first, so tiny `amax` cannot
/// overflow the scale). `bsums` are the exact sums of each 16 codes. Source: llama.cpp
/// `quantize_row_q8_K_ref` (`ggml-quants.c`), which uses the signed max and `-127`; this keeps
/// the codes symmetric.
///
/// # Errors
/// [`QuantError::PartialBlock`] (type `Q8_K`) when `x.len()` is not a multiple of 256;
/// [`QuantError::SourceLength`] (type `Q8_K`, sizes in bytes of 292-byte blocks) when `y` does
/// not hold exactly `x.len() / 256` blocks.
pub fn quantize_row_q8k(x: &[f32], y: &mut [BlockQ8K]) -> Result<(), QuantError> {
    let ty = GgmlType::Q8_K;
    let n = x.len();
    if !n.is_multiple_of(QK_K) {
        return Err(QuantError::PartialBlock {
            ty,
            n,
            block_size: QK_K,
        });
    }
    if y.len() != n / QK_K {
        return Err(QuantError::SourceLength {
            ty,
            n,
            expected: n / QK_K * ty.type_size(),
            actual: y.len() * ty.type_size(),
        });
    }
    let (xs, _) = x.as_chunks::<QK_K>();
    #[cfg(target_arch = "x86_64")]
    if crate::isa::isa().avx512bw {
        // SAFETY: the features `quantize_blocks_avx512` enables were just detected.
        unsafe { quantize_blocks_avx512(xs, y) };
        return Ok(());
    }
    #[cfg(target_arch = "x86_64")]
    if crate::isa::isa().avx2 {
        // SAFETY: the feature `quantize_blocks_avx2` enables was just detected.
        unsafe { quantize_blocks_avx2(xs, y) };
        return Ok(());
    }
    quantize_blocks(xs, y);
    Ok(())
}

/// [`quantize_block`] for each block.
#[inline(always)]
fn quantize_blocks(xs: &[[f32; QK_K]], y: &mut [BlockQ8K]) {
    for (xb, yb) in xs.iter().zip(y.iter_mut()) {
        quantize_block(xb, yb);
    }
}

/// [`quantize_blocks`] compiled for AVX-512 (the same Rust operations, each IEEE-exact per
/// element, so the same bits; only the vector width changes).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
fn quantize_blocks_avx512(xs: &[[f32; QK_K]], y: &mut [BlockQ8K]) {
    quantize_blocks(xs, y);
}

/// [`quantize_blocks`] compiled for AVX2 (as [`quantize_blocks_avx512`]: the same bits).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn quantize_blocks_avx2(xs: &[[f32; QK_K]], y: &mut [BlockQ8K]) {
    quantize_blocks(xs, y);
}

/// One block of [`quantize_row_q8k`].
#[inline(always)]
fn quantize_block(x: &[f32; QK_K], y: &mut BlockQ8K) {
    *y = BlockQ8K::ZERO;
    // Whether every element is finite, and the largest magnitude, in 16 lanes (vector
    // operations; a sequential fold of `max` does not vectorize). `max` of finite values is
    // exact, so the lanes give the fold's value whatever the order.
    let mut lane_max = [0f32; 16];
    let mut lane_bad = [false; 16];
    for c in x.as_chunks::<16>().0 {
        for ((m, bad), &v) in lane_max.iter_mut().zip(&mut lane_bad).zip(c) {
            *m = m.max(v.abs());
            *bad |= !v.is_finite();
        }
    }
    if lane_bad.iter().any(|&b| b) {
        y.d = f32::NAN;
        return;
    }
    let amax = lane_max.iter().fold(0.0f32, |m, &v| m.max(v));
    if amax == 0.0 {
        return;
    }
    y.d = amax / 127.0;
    for (q, &v) in y.qs.iter_mut().zip(x) {
        *q = round_half_away(127.0 * (v / amax)).clamp(-127, 127) as i8;
    }
    let (groups, _) = y.qs.as_chunks::<16>();
    for (s, g) in y.bsums.iter_mut().zip(groups) {
        *s = g.iter().map(|&q| i16::from(q)).sum();
    }
}

/// `t.round() as i32` (half away from zero) for |t| ≤ 128, the codes' range; beyond it the
/// result is that of ±128, and for NaN that of −128. No libm `roundf` call, so that the loop
/// vectorizes: truncate, then step away from zero when the dropped fraction `t − trunc(t)`
/// (exact in f32) is at least one half. The truncation is an unchecked conversion of `t`
/// clamped to ±128: a saturating `as i32` compiles to scalar code per element.
#[inline(always)]
fn round_half_away(t: f32) -> i32 {
    // `max` / `min` return the operand that is not NaN, so `c` is in [−128, 128] (`clamp`
    // would keep a NaN, which the unchecked conversion must not see).
    #[allow(clippy::manual_clamp)]
    let c = t.max(-128.0).min(128.0);
    // SAFETY: `c` is finite and within i32's range.
    let i = unsafe { c.to_int_unchecked::<i32>() };
    let frac = c - i as f32;
    i + i32::from(frac >= 0.5) - i32::from(frac <= -0.5)
}

/// The fastest kernel for `ty` on this CPU, or None when `ty` has no Q8_K kernel. Supported:
/// Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ2_XXS, IQ2_XS, Q4_0, Q8_0. AVX-512 VNNI for Q3_K where
/// [`crate::isa`] reports `avx512_vnni`; else AVX2 where it reports `avx2`; else scalar. Every
/// kernel gives the same bits.
pub fn q8_dot_fn(ty: GgmlType) -> Option<Q8DotFn> {
    #[cfg(target_arch = "x86_64")]
    if let Some(f) = vnni::dot_fn(ty).or_else(|| avx2::dot_fn(ty)) {
        return Some(f);
    }
    q8_dot_fn_scalar(ty)
}

/// The fastest multi-row kernel for `ty` on this CPU (the types of [`q8_dot_fn`]), or None:
/// for Q2_K, Q3_K, Q4_K, Q5_K and Q6_K, each weight block unpacked once for all activation rows,
/// the VNNI kernel where [`crate::isa`] reports `avx512_vnni` (fewer than three rows go row by
/// row), else the AVX2 kernel (`avx2_many.rs`) where it reports `avx2`; else [`q8_dot_fn`]'s
/// kernel once per activation row.
pub fn q8_dot_many_fn(ty: GgmlType) -> Option<Q8DotManyFn> {
    #[cfg(target_arch = "x86_64")]
    if let Some(f) = vnni::many_fn(ty).or_else(|| avx2_many::many_fn(ty)) {
        return Some(f);
    }
    let at = TYPES.iter().position(|&t| t == ty)?;
    Some(BY_ROW[at])
}

/// The grid kernel for `ty` on this CPU, or None: for Q2_K and Q3_K, the AMX backend of
/// `avx512/grid.rs` when the CPU has AMX-TILE and AMX-INT8 (with the AVX-512 features of
/// [`q8_dot_many_fn`]'s VNNI kernels) and Linux grants the tile state (`avx512/amx.rs`), else its
/// AVX-512 VNNI backend when the CPU has those features; on a CPU without AVX-512 VNNI, the AVX2
/// kernel (`avx2_grid.rs`) for Q2_K, Q3_K and Q6_K; None elsewhere, where [`q8_dot_many_fn`]
/// serves.
pub fn q8_grid_fn(ty: GgmlType) -> Option<Q8GridFn> {
    #[cfg(target_arch = "x86_64")]
    return grid::grid_fn(ty).or_else(|| avx2_grid::grid_fn(ty).filter(|_| !vnni::detected()));
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = ty;
        None
    }
}

/// [`q8_grid_fn`] for weight rows in the interleaved layout ([`interleave_rows`]; the rows whole
/// groups of [`INTERLEAVE_ROWS`], else NaN in every `y` entry): the same backends and bits.
pub fn q8_grid_interleaved_fn(ty: GgmlType) -> Option<Q8GridFn> {
    #[cfg(target_arch = "x86_64")]
    return grid::grid_interleaved_fn(ty);
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = ty;
        None
    }
}

/// The activation rows that `rows` of them cost in [`q8_grid_fn`]'s kernels on this CPU: whole
/// groups of [`Q8_TILE_ROWS`], except that the 256-bit backends (AVX-512 VNNI, AVX2) compute a
/// last group of at most half as many rows at half width, at no more than half its cost
/// (`avx512/grid.rs`, `avx2_grid.rs`). `rows` itself where there is no grid kernel.
pub fn q8_grid_cost_rows(rows: usize) -> usize {
    #[cfg(target_arch = "x86_64")]
    {
        let isa = crate::isa::isa();
        let (whole, rest) = (rows / Q8_TILE_ROWS * Q8_TILE_ROWS, rows % Q8_TILE_ROWS);
        if isa.amx || isa.avx2 {
            return match rest {
                0 => whole,
                1..=tiles::HALF if !isa.amx => whole + tiles::HALF,
                _ => whole + Q8_TILE_ROWS,
            };
        }
    }
    rows
}

/// The fastest decode kernel for `ty` on this CPU (the types of [`q8_dot_fn`]), or None: for
/// Q2_K, Q3_K and Q6_K, groups of weight rows, each block unpacked once for both planes, one
/// reduction per group and block — the AVX-512 kernel of `avx512/rows.rs` where [`crate::isa`]
/// reports `avx512_vnni`, else the AVX2 one of `avx2_rows.rs` where it reports `avx2`; else
/// [`q8_dot_many_fn`]'s kernel once per weight row (its planes as activation rows), the row after
/// next prefetched while a row is dotted. Every kernel gives the same bits.
pub fn q8_rows_fn(ty: GgmlType) -> Option<Q8RowsFn> {
    #[cfg(target_arch = "x86_64")]
    if let Some(f) = rows::rows_fn(ty).or_else(|| {
        avx2_lanes::rows_fn(ty)
            .or_else(|| avx2_rows::rows_fn(ty))
            .filter(|_| std::env::var_os("AUBIER_NO_AVX2_ROWS").is_none())
    }) {
        return Some(f);
    }
    q8_rows_fn_by_row(ty)
}

/// The decode fallback of `ty` (the types of [`q8_dot_fn`]), or None: [`q8_dot_many_fn`]'s
/// kernel once per weight row, its planes as activation rows, with the same prefetch and the
/// same bits as [`q8_rows_fn`]'s kernel. For tests and benchmarks (the decode path before the
/// decode kernels).
pub fn q8_rows_fn_by_row(ty: GgmlType) -> Option<Q8RowsFn> {
    let at = TYPES.iter().position(|&t| t == ty)?;
    Some(ROWS_BY_ROW[at])
}

/// `rows_by_row::<T>` for each type `TYPES[T]`.
const ROWS_BY_ROW: [Q8RowsFn; 9] = [
    rows_by_row::<0>,
    rows_by_row::<1>,
    rows_by_row::<2>,
    rows_by_row::<3>,
    rows_by_row::<4>,
    rows_by_row::<5>,
    rows_by_row::<6>,
    rows_by_row::<7>,
    rows_by_row::<8>,
];

/// The decode fallback for `TYPES[T]`: [`q8_dot_many_fn`]'s kernel once per weight row, with
/// the planes as its activation rows, then the plane dots added in plane order.
fn rows_by_row<const T: usize>(w: &[u8], x: &[BlockQ8K], planes: usize, y: &mut [f32]) {
    let ty = TYPES[T];
    let (Some(many), Some(bytes)) = (q8_dot_many_fn(ty), ty.row_size(QK_K)) else {
        y.fill(f32::NAN);
        return;
    };
    let Some((_, rb)) = rows_lengths(w, x, planes, y, bytes) else {
        return;
    };
    let mut parts = [0f32; MAX_PLANES];
    let parts = &mut parts[..planes];
    for (i, o) in y.iter_mut().enumerate() {
        prefetch(clamped(w, (i + 2) * rb, (i + 3) * rb));
        many(&w[i * rb..(i + 1) * rb], x, parts);
        *o = parts[1..].iter().fold(parts[0], |a, &v| a + v);
    }
}

/// The many-token kernel of `ty` for weights in the interleaved layout ([`Q8TokensFn`]), or
/// None: Q2_K and Q3_K where the CPU has AVX-512 VNNI.
pub fn q8_interleaved_tokens_fn(ty: GgmlType) -> Option<Q8TokensFn> {
    #[cfg(target_arch = "x86_64")]
    return lanes::interleaved_tokens_fn(ty);
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = ty;
        None
    }
}

/// Weight rows per group of the interleaved layout ([`interleave_rows`]).
pub const INTERLEAVE_ROWS: usize = 16;

/// The decode kernel of `ty` for weights in the interleaved layout ([`interleave_rows`]), or
/// None: Q2_K and Q3_K where the CPU has AVX-512 VNNI. [`Q8RowsFn`]'s contract with the rows a
/// whole number of groups of [`INTERLEAVE_ROWS`], one or two planes; each row gets the bits of
/// [`q8_rows_fn`] on the rows in their own layout. A group's block words are plain loads (no
/// transpose in registers, one stream in address order).
pub fn q8_interleaved_fn(ty: GgmlType) -> Option<Q8RowsFn> {
    #[cfg(target_arch = "x86_64")]
    return lanes::interleaved_fn(ty);
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = ty;
        None
    }
}

/// `src`'s rows of `ty` (whole groups of [`INTERLEAVE_ROWS`] rows of whole blocks) into `dst` in
/// the interleaved layout, group by group, and per group block by block: the block's whole
/// 32-bit words, word `k` of the 16 rows as 64 bytes (lane `r` for row `r`), then the rows'
/// remaining `block bytes mod 4` bytes in row order (Q3_K: the 16 `d`). A permutation of the
/// bytes (same length), undone by [`deinterleave_rows`]; the layout the lanes decode kernels
/// read without transposing (llama.cpp's CPU "repack" does the like for its own kernels).
///
/// Errors: [`QuantError`] when `ty` has no blocks, `dst` differs in length, or `src` is not
/// whole groups of whole blocks.
pub fn interleave_rows(
    ty: GgmlType,
    src: &[u8],
    dst: &mut [u8],
    row_bytes: usize,
) -> Result<(), QuantError> {
    permute_groups(ty, src, dst, row_bytes, false)
}

/// [`interleave_rows`]'s inverse: interleaved groups `src` back into rows of `ty` in `dst`.
///
/// Errors: as [`interleave_rows`].
pub fn deinterleave_rows(
    ty: GgmlType,
    src: &[u8],
    dst: &mut [u8],
    row_bytes: usize,
) -> Result<(), QuantError> {
    permute_groups(ty, src, dst, row_bytes, true)
}

/// Both directions of the interleaved layout: byte `i` of block `b` of row `r` of a group sits
/// in the interleaved group at `b·16·bytes + (⌊i/4⌋·16 + r)·4 + i mod 4` for its whole words,
/// else at `b·16·bytes + 64·⌊bytes/4⌋ + r·(bytes mod 4) + (i − 4·⌊bytes/4⌋)`. Moved a 32-bit
/// word at a time (a byte at a time, with the word-or-rest choice per byte, the boot's copies
/// into the fast store took 6 s of CPU for the 4-layer, 128-expert file).
fn permute_groups(
    ty: GgmlType,
    src: &[u8],
    dst: &mut [u8],
    row_bytes: usize,
    back: bool,
) -> Result<(), QuantError> {
    let bytes = ty.type_size();
    let group = INTERLEAVE_ROWS * row_bytes;
    if bytes == 0
        || row_bytes == 0
        || !row_bytes.is_multiple_of(bytes)
        || src.len() != dst.len()
        || !src.len().is_multiple_of(group)
    {
        return Err(QuantError::Interleave {
            ty,
            detail: format!(
                "{} bytes into {} are not groups of {INTERLEAVE_ROWS} rows of {row_bytes} bytes \
                 ({bytes}-byte blocks)",
                src.len(),
                dst.len()
            ),
        });
    }
    let nb = row_bytes / bytes;
    let (words, rest) = (bytes / 4, bytes % 4);
    let mv = |d: &mut [u8], d_at: usize, s: &[u8], s_at: usize, len: usize| {
        d[d_at..d_at + len].copy_from_slice(&s[s_at..s_at + len]);
    };
    for (s, d) in src.chunks_exact(group).zip(dst.chunks_exact_mut(group)) {
        for b in 0..nb {
            let block_at = b * INTERLEAVE_ROWS * bytes;
            for r in 0..INTERLEAVE_ROWS {
                let row_at = r * row_bytes + b * bytes;
                for w in 0..words {
                    let (at, from) = (block_at + (w * INTERLEAVE_ROWS + r) * 4, row_at + 4 * w);
                    match back {
                        false => mv(d, at, s, from, 4),
                        true => mv(d, from, s, at, 4),
                    }
                }
                let at = block_at + 4 * words * INTERLEAVE_ROWS + r * rest;
                let from = row_at + 4 * words;
                match back {
                    false => mv(d, at, s, from, rest),
                    true => mv(d, from, s, at, rest),
                }
            }
        }
    }
    Ok(())
}

/// [`prefetch_l2`] of the memory of `s`: at one token, `scores_qk` asks for a work item's key
/// rows of the latent cache (cold: the weights read since the layer's previous token evicted
/// them) before it computes; the stream alone met a new 4 KiB page every three rows of 320 f32.
pub(crate) fn prefetch_l2_of<T>(s: &[T]) {
    // SAFETY: the bytes of a live slice, read as `u8` (no invalid values, no alignment) by
    // cache hints only.
    let bytes = unsafe { std::slice::from_raw_parts(s.as_ptr().cast::<u8>(), size_of_val(s)) };
    prefetch_l2(bytes);
}

/// Every type with a Q8_K kernel, in the order of [`BY_ROW`].
const TYPES: [GgmlType; 9] = [
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::IQ2_XXS,
    GgmlType::IQ2_XS,
    GgmlType::Q4_0,
    GgmlType::Q8_0,
];

/// `by_row::<T>` for each type `TYPES[T]`.
const BY_ROW: [Q8DotManyFn; 9] = [
    by_row::<0>,
    by_row::<1>,
    by_row::<2>,
    by_row::<3>,
    by_row::<4>,
    by_row::<5>,
    by_row::<6>,
    by_row::<7>,
    by_row::<8>,
];

/// The multi-row fallback for `TYPES[T]`: [`q8_dot_fn`]'s kernel once per activation row.
fn by_row<const T: usize>(row: &[u8], x: &[BlockQ8K], y: &mut [f32]) {
    let ty = TYPES[T];
    let (Some(dot), Some(bytes)) = (q8_dot_fn(ty), ty.row_size(QK_K)) else {
        y.fill(f32::NAN);
        return;
    };
    each_row(dot, bytes, row, x, y);
}

/// The portable scalar kernel (for tests and non-x86); the types of [`q8_dot_fn`].
pub fn q8_dot_fn_scalar(ty: GgmlType) -> Option<Q8DotFn> {
    scalar::dot_fn(ty)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::quant::dequantize_row;
    use crate::gguf::quant::random::BlockSampler;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// Bytes of 256 weights of `ty`.
    fn block_bytes(ty: GgmlType) -> usize {
        ty.row_size(QK_K).expect("256 is a whole number of blocks")
    }

    /// A valid random row of `nb` Q8_K blocks' worth of `ty` weights.
    fn weights(ty: GgmlType, nb: usize, rng: &mut ChaCha8Rng) -> Vec<u8> {
        let mut row = vec![0u8; nb * block_bytes(ty)];
        BlockSampler::new(ty)
            .unwrap()
            .fill_row(rng, 0.02, nb * QK_K, &mut row)
            .unwrap();
        row
    }

    /// `nb` blocks' worth of random bytes of `ty` (any scales and codes, f16 NaN/inf included).
    fn random_bytes(ty: GgmlType, nb: usize, rng: &mut ChaCha8Rng) -> Vec<u8> {
        let mut row = vec![0u8; nb * block_bytes(ty)];
        rng.fill(&mut row[..]);
        row
    }

    /// `n` rows of `nb` blocks back to back: sampled blocks, or random bytes.
    fn rows_of(ty: GgmlType, n: usize, nb: usize, sampled: bool, rng: &mut ChaCha8Rng) -> Vec<u8> {
        (0..n)
            .flat_map(|_| {
                if sampled {
                    weights(ty, nb, rng)
                } else {
                    random_bytes(ty, nb, rng)
                }
            })
            .collect()
    }

    /// Activations of `nb` blocks: each block uniform in ±scale with a random scale over
    /// 2^-10 .. 2^10, one outlier in some blocks; block 1 (when present) all zero.
    fn activations(nb: usize, rng: &mut ChaCha8Rng) -> Vec<f32> {
        let mut x = vec![0.0f32; nb * QK_K];
        for (b, xb) in x.chunks_exact_mut(QK_K).enumerate() {
            if b == 1 {
                continue;
            }
            let scale = 2f32.powf(rng.random_range(-10.0..10.0));
            for v in xb.iter_mut() {
                *v = scale * rng.random_range(-1.0f32..1.0);
            }
            if rng.random_bool(0.5) {
                xb[rng.random_range(0..QK_K)] = 20.0 * scale;
            }
        }
        x
    }

    fn quantize(x: &[f32]) -> Vec<BlockQ8K> {
        let mut y = vec![BlockQ8K::ZERO; x.len() / QK_K];
        quantize_row_q8k(x, &mut y).unwrap();
        y
    }

    /// Same bits, or both NaN (a NaN's payload is not part of the contract).
    fn same(a: f32, b: f32) -> bool {
        a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
    }

    #[test]
    fn quantization_is_within_half_a_step_with_exact_bsums() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let x = activations(6, &mut rng);
        let y = quantize(&x);
        for (xb, yb) in x.chunks_exact(QK_K).zip(&y) {
            let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            if amax == 0.0 {
                assert_eq!(yb.d, 0.0);
                assert!(yb.qs.iter().all(|&q| q == 0));
            } else {
                assert_eq!(yb.d, amax / 127.0);
                // qs = round(t), t = fl(fl(x / amax)·127) is within 127·2^-23 of 127·x/amax
                // (two roundings of values ≤ 127), and d is within amax·2^-24/127 of
                // amax/127 (times |qs| ≤ 127), so |d·qs − x| ≤ amax/254 + 2·amax·2^-23,
                // where amax/254 ≤ d/2·(1 + 2^-24).
                let bound = f64::from(yb.d) / 2.0 + 3.0 * f64::from(amax) * f64::from(f32::EPSILON);
                for (&v, &q) in xb.iter().zip(&yb.qs) {
                    assert!((-127..=127).contains(&q));
                    let err = (f64::from(yb.d) * f64::from(q) - f64::from(v)).abs();
                    assert!(err <= bound, "x {v} q {q} d {} err {err}", yb.d);
                }
                // The largest element maps to ±127.
                assert!(yb.qs.iter().any(|&q| q.abs() == 127));
            }
            for (j, &s) in yb.bsums.iter().enumerate() {
                let want: i32 = yb.qs[16 * j..16 * j + 16]
                    .iter()
                    .map(|&q| i32::from(q))
                    .sum();
                assert_eq!(i32::from(s), want);
            }
        }
    }

    #[test]
    fn quantization_of_zero_and_non_finite_blocks() {
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let mut x = vec![0.5f32; 2 * QK_K];
            x[QK_K + 7] = bad;
            let y = quantize(&x);
            assert!(y[0].d > 0.0, "the finite block is unaffected");
            assert!(y[1].d.is_nan(), "{bad}");
            assert!(y[1].qs.iter().all(|&q| q == 0) && y[1].bsums.iter().all(|&s| s == 0));
        }
        let y = quantize(&[-0.0f32; QK_K]);
        assert_eq!(y[0].d.to_bits(), 0.0f32.to_bits());
        assert!(y[0].qs.iter().all(|&q| q == 0) && y[0].bsums.iter().all(|&s| s == 0));
        // Subnormal amax: finite scale, codes still reach ±127.
        let mut x = [0.0f32; QK_K];
        x[3] = -1e-40;
        x[4] = 5e-41;
        let y = quantize(&x);
        assert!(y[0].d.is_finite() && y[0].d > 0.0);
        assert_eq!(y[0].qs[3], -127);
    }

    /// `round_half_away` is `f32::round` on the codes' range: near every half-integer (the
    /// neighbouring f32 values too) and on random values.
    #[test]
    fn round_half_away_matches_f32_round() {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let mut cases: Vec<f32> = vec![0.0, -0.0, 0.49999997, -0.49999997, 1e-30, -1e-30];
        for k in -128..128 {
            let h = k as f32 + 0.5;
            cases.extend([
                h,
                f32::from_bits(h.to_bits() + 1),
                f32::from_bits(h.to_bits() - 1),
            ]);
            cases.push(k as f32);
        }
        cases.extend((0..100_000).map(|_| rng.random_range(-128.0f32..=128.0)));
        for t in cases {
            assert_eq!(round_half_away(t), t.round() as i32, "{t:e}");
        }
        // Outside the codes' range: that of ±128 (NaN: −128's; never undefined).
        for (t, want) in [
            (128.4, 128),
            (1e9, 128),
            (-1e30, -128),
            (f32::INFINITY, 128),
        ] {
            assert_eq!(round_half_away(t), want, "{t:e}");
        }
        assert_eq!(round_half_away(f32::NAN), -128);
    }

    /// The dispatched quantization (AVX-512 or AVX2 where the CPU has it) and the AVX2 one
    /// give the portable loop's bits: random blocks, a block with NaN, one with infinity,
    /// subnormals, zeros, ±ties.
    #[test]
    fn quantization_is_the_same_on_every_path() {
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        let mut x = activations(8, &mut rng);
        x[10] = f32::NAN;
        x[QK_K + 3] = f32::INFINITY;
        for v in &mut x[2 * QK_K..3 * QK_K] {
            *v *= 1e-40;
        }
        x[3 * QK_K..4 * QK_K].fill(0.0);
        for (i, v) in x[4 * QK_K..5 * QK_K].iter_mut().enumerate() {
            *v = (i as f32 - 128.0) * 0.5;
        }
        let (xs, _) = x.as_chunks::<QK_K>();
        let mut want = vec![BlockQ8K::ZERO; 8];
        quantize_blocks(xs, &mut want);
        let mut paths = vec![("dispatched", quantize(&x))];
        if crate::isa::isa().avx2 {
            let mut got = vec![BlockQ8K::ZERO; 8];
            // SAFETY: the CPU has AVX2 (just checked).
            unsafe { quantize_blocks_avx2(xs, &mut got) };
            paths.push(("avx2", got));
        } else {
            println!("note: no AVX2 on this CPU: its quantization path unchecked");
        }
        for (path, got) in paths {
            for (b, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g.d.to_bits(), w.d.to_bits(), "{path} block {b}");
                assert_eq!((g.qs, g.bsums), (w.qs, w.bsums), "{path} block {b}");
            }
        }
    }

    #[test]
    fn quantization_rejects_bad_lengths() {
        let mut y = [BlockQ8K::ZERO; 2];
        assert_eq!(
            quantize_row_q8k(&[0.0; 300], &mut y[..1]),
            Err(QuantError::PartialBlock {
                ty: GgmlType::Q8_K,
                n: 300,
                block_size: 256
            })
        );
        assert_eq!(
            quantize_row_q8k(&[0.0; 256], &mut y),
            Err(QuantError::SourceLength {
                ty: GgmlType::Q8_K,
                n: 256,
                expected: 292,
                actual: 584
            })
        );
        assert_eq!(quantize_row_q8k(&[], &mut []), Ok(()));
    }

    #[test]
    fn supported_types() {
        for &ty in GgmlType::ALL {
            let want = TYPES.contains(&ty);
            assert_eq!(q8_dot_fn(ty).is_some(), want, "{ty}");
            assert_eq!(q8_dot_fn_scalar(ty).is_some(), want, "{ty}");
            assert_eq!(q8_dot_many_fn(ty).is_some(), want, "{ty}");
        }
    }

    /// The scalar kernel against an independent f64 sum over the bit-exact dequantized weights
    /// (`gguf::quant::dequantize_row`, the oracle) and the dequantized activations `d8·qs`.
    ///
    /// Tolerance 1e-5·Σ|w·x8| + 1e-30: the kernel rounds at most 6 times per block (two i32 →
    /// f32 conversions, two products, a difference, the `d8` product) and once per block in the
    /// row sum (≤ 17 blocks), each by ≤ 2^-24 of a magnitude that for these centred blocks stays
    /// within a small factor (≲ 5, the `dmin·m` offsets of Q2_K/Q4_K/Q5_K) of Σ|w·x8|; the
    /// oracle's f32 dequantization adds one such rounding per element. That is about
    /// (6·5 + 17 + 5)·2^-24 ≈ 3e-6 relative; 1e-30 covers an all-zero product.
    #[test]
    fn scalar_matches_the_f64_reference() {
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        for &ty in &TYPES {
            let dot = q8_dot_fn_scalar(ty).unwrap();
            for nb in [1, 2, 16, 17] {
                let row = weights(ty, nb, &mut rng);
                let y = quantize(&activations(nb, &mut rng));
                let mut w = vec![0.0f32; nb * QK_K];
                dequantize_row(ty, &row, &mut w).unwrap();
                let (mut want, mut mag) = (0.0f64, 0.0f64);
                for (i, &wi) in w.iter().enumerate() {
                    let yb = &y[i / QK_K];
                    let x8 = f64::from(yb.d) * f64::from(yb.qs[i % QK_K]);
                    want += f64::from(wi) * x8;
                    mag += (f64::from(wi) * x8).abs();
                }
                let got = f64::from(dot(&row, &y));
                let err = (got - want).abs();
                assert!(
                    err <= 1e-5 * mag + 1e-30,
                    "{ty} nb {nb}: got {got} want {want} err {err} (rel {})",
                    err / mag
                );
            }
        }
    }

    /// The AVX2 kernel of `ty`, or None (with a note) when this CPU lacks AVX2/FMA.
    #[cfg(target_arch = "x86_64")]
    fn avx2_kernel(ty: GgmlType) -> Option<Q8DotFn> {
        let f = avx2::dot_fn(ty);
        if f.is_none() {
            println!("note: no AVX2+FMA on this CPU, {ty}: AVX2 check skipped");
        }
        f
    }

    /// A single-row kernel `fast` of `ty` against the scalar one: the same bits on sampled rows
    /// (finite, non-zero) and on random bytes (any scales and codes; or both NaN), for 1, 2, 3,
    /// 16 and 17 blocks.
    #[cfg(target_arch = "x86_64")]
    fn check_single_row(ty: GgmlType, fast: Q8DotFn, rng: &mut ChaCha8Rng) {
        let slow = q8_dot_fn_scalar(ty).unwrap();
        for nb in [1, 2, 3, 16, 17] {
            for _ in 0..4 {
                let row = weights(ty, nb, rng);
                let y = quantize(&activations(nb, rng));
                let (a, b) = (fast(&row, &y), slow(&row, &y));
                assert_eq!(a.to_bits(), b.to_bits(), "{ty} nb {nb}: {a} vs {b}");
                assert!(a.is_finite() && a != 0.0, "{ty} nb {nb}: {a}");
            }
            let row = random_bytes(ty, nb, rng);
            let y = quantize(&activations(nb, rng));
            let (a, b) = (fast(&row, &y), slow(&row, &y));
            assert!(same(a, b), "{ty} random bytes nb {nb}: {a} vs {b}");
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_matches_scalar_bit_for_bit() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        for &ty in &TYPES {
            if let Some(fast) = avx2_kernel(ty) {
                check_single_row(ty, fast, &mut rng);
            }
        }
    }

    /// The multi-row kernels of `ty` to check: the VNNI and AVX2 ones (each None, with a note,
    /// when this CPU lacks its features) and the dispatched one.
    #[cfg(target_arch = "x86_64")]
    fn many_kernels(ty: GgmlType) -> Vec<Q8DotManyFn> {
        let (vnni, avx2) = (vnni::many_fn(ty), avx2_many::many_fn(ty));
        if vnni.is_none() && TYPES[..5].contains(&ty) {
            println!("note: no AVX-512 VNNI (F/BW/VL) on this CPU, {ty}: VNNI checks skipped");
        }
        if avx2.is_none() && TYPES[..5].contains(&ty) {
            println!("note: no AVX2 (FMA, F16C) on this CPU, {ty}: AVX2 many-row checks skipped");
        }
        vnni.into_iter()
            .chain(avx2)
            .chain(q8_dot_many_fn(ty))
            .collect()
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn many_kernels(ty: GgmlType) -> Vec<Q8DotManyFn> {
        q8_dot_many_fn(ty).into_iter().collect()
    }

    /// The single-row VNNI kernels (Q3_K) against the scalar ones; skipped with a note when this
    /// CPU lacks AVX-512 VNNI.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn vnni_single_row_matches_scalar_bit_for_bit() {
        let mut rng = ChaCha8Rng::seed_from_u64(6);
        for &ty in &TYPES {
            match vnni::dot_fn(ty) {
                Some(fast) => check_single_row(ty, fast, &mut rng),
                None if ty == GgmlType::Q3_K => {
                    println!("note: no AVX-512 VNNI (F/BW/VL) on this CPU: {ty} check skipped");
                }
                None => {}
            }
        }
    }

    /// Every multi-row kernel of `ty` on `row` and `rows` activation rows `x` against the scalar
    /// single-row kernel row by row: the same bits (or both NaN).
    fn check_many(ty: GgmlType, row: &[u8], x: &[BlockQ8K], rows: usize, what: &str) {
        let slow = q8_dot_fn_scalar(ty).unwrap();
        let nb = x.len() / rows;
        let want: Vec<f32> = x.chunks_exact(nb.max(1)).map(|xj| slow(row, xj)).collect();
        let want = if nb == 0 { vec![0.0; rows] } else { want };
        for many in many_kernels(ty) {
            let mut got = vec![1.5f32; rows];
            many(row, x, &mut got);
            for (j, (&a, &b)) in got.iter().zip(&want).enumerate() {
                assert!(
                    same(a, b),
                    "{ty} {what} rows {rows} nb {nb} row {j}: {a} vs {b}"
                );
            }
        }
    }

    #[test]
    fn many_matches_the_single_row_kernel_bit_for_bit() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        for &ty in &TYPES {
            for nb in [1, 2, 16, 17] {
                for rows in [1, 2, 3, 4, 5, 9] {
                    let row = weights(ty, nb, &mut rng);
                    let x = quantize(&activations(nb * rows, &mut rng));
                    check_many(ty, &row, &x, rows, "sampler");
                    let row = random_bytes(ty, nb, &mut rng);
                    check_many(ty, &row, &x, rows, "random bytes");
                }
            }
            // No blocks: every row is +0.0.
            check_many(ty, &[], &[], 3, "empty");
        }
    }

    /// The decode kernels of `ty` to check: the AVX-512 and AVX2 ones (each None, with a note,
    /// when this CPU lacks its features) and the dispatched one.
    fn rows_kernels(ty: GgmlType) -> Vec<Q8RowsFn> {
        #[cfg(target_arch = "x86_64")]
        let (own, avx2) = (
            rows::rows_fn(ty),
            avx2_lanes::rows_fn(ty).or_else(|| avx2_rows::rows_fn(ty)),
        );
        #[cfg(not(target_arch = "x86_64"))]
        let (own, avx2): (Option<Q8RowsFn>, Option<Q8RowsFn>) = (None, None);
        if matches!(ty, GgmlType::Q2_K | GgmlType::Q3_K | GgmlType::Q6_K) {
            if own.is_none() {
                println!(
                    "note: no AVX-512 VNNI (F/BW/VL) on this CPU, {ty}: its decode-kernel \
                     checks skipped"
                );
            }
            if avx2.is_none() {
                println!(
                    "note: no AVX2 (FMA, F16C) on this CPU, {ty}: its decode-kernel checks skipped"
                );
            }
        }
        own.into_iter()
            .chain(avx2)
            .chain(q8_rows_fn(ty))
            .chain(q8_rows_fn_by_row(ty))
            .collect()
    }

    /// Every decode kernel of `ty` on the `n` weight rows `w` and the `planes` planes `x`
    /// against the scalar single-row kernel, row by row and plane by plane, the plane dots
    /// added in plane order: the same bits (or both NaN).
    fn check_rows(ty: GgmlType, w: &[u8], x: &[BlockQ8K], planes: usize, n: usize, what: &str) {
        let slow = q8_dot_fn_scalar(ty).unwrap();
        let nb = x.len() / planes;
        let rb = nb * block_bytes(ty);
        let want: Vec<f32> = (0..n)
            .map(|i| {
                let row = &w[i * rb..(i + 1) * rb];
                let d: Vec<f32> = x.chunks(nb.max(1)).map(|xp| slow(row, xp)).collect();
                let d = if nb == 0 { vec![0.0; planes] } else { d };
                d[1..].iter().fold(d[0], |a, &v| a + v)
            })
            .collect();
        for kernel in rows_kernels(ty) {
            let mut got = vec![1.5f32; n];
            kernel(w, x, planes, &mut got);
            for (i, (&a, &b)) in got.iter().zip(&want).enumerate() {
                assert!(
                    same(a, b),
                    "{ty} {what} planes {planes} rows {n} nb {nb} row {i}: {a} vs {b}"
                );
            }
        }
        // The same rows interleaved, where they are whole groups.
        if let Some(kernel) =
            q8_interleaved_fn(ty).filter(|_| n > 0 && n.is_multiple_of(INTERLEAVE_ROWS))
        {
            let mut packed = vec![0u8; w.len()];
            interleave_rows(ty, w, &mut packed, rb).unwrap();
            let mut back = vec![0u8; w.len()];
            deinterleave_rows(ty, &packed, &mut back, rb).unwrap();
            assert!(back == w, "{ty} interleave round trip");
            let mut got = vec![1.5f32; n];
            kernel(&packed, x, planes, &mut got);
            for (i, (&a, &b)) in got.iter().zip(&want).enumerate() {
                assert!(
                    same(a, b),
                    "{ty} interleaved {what} planes {planes} rows {n} nb {nb} row {i}: {a} vs {b}"
                );
            }
        }
    }

    /// Which ISA variants of the Q8_K kernels ran on this machine and which were skipped, and
    /// why: every variant the CPU has is checked against the scalar kernel (one case per type:
    /// single-row dots, many-row dots, decode rows, interleaved decode, tile kernels); a variant
    /// it lacks is listed as skipped, never passed over in silence. The list is printed with
    /// `--nocapture` (`.ci/run` runs this test so) and in the panic message of a failure.
    #[test]
    fn isa_variants_ran_and_skipped() {
        use std::panic::{catch_unwind, AssertUnwindSafe};
        let here = *crate::isa::isa();
        let mut rng = ChaCha8Rng::seed_from_u64(99);
        let (mut ran, mut skipped, mut failed) = (Vec::new(), Vec::new(), Vec::new());
        let mut variant = |name: &str, present: bool, why: &str, check: &mut dyn FnMut()| {
            if !present {
                skipped.push(format!("{name} ({why})"));
            } else if catch_unwind(AssertUnwindSafe(check)).is_ok() {
                ran.push(name.to_string());
            } else {
                failed.push(name.to_string());
            }
        };
        let (no_avx2, no_vnni, no_amx) = (
            "the CPU lacks AVX2, FMA or F16C",
            "the CPU lacks AVX-512 F/BW/VL/VNNI",
            "the CPU lacks AMX-TILE/AMX-INT8 or the OS refused the tile state",
        );
        let nb = 2;
        let x1 = quantize(&activations(nb, &mut rng));
        let x2 = two_planes(&activations(nb, &mut rng));
        let x5 = quantize(&activations(5 * nb, &mut rng));
        for &ty in &TYPES {
            let row = weights(ty, nb, &mut rng);
            let group: Vec<u8> = (0..INTERLEAVE_ROWS)
                .flat_map(|_| weights(ty, nb, &mut rng))
                .collect();
            variant(&format!("scalar dot {ty}"), true, "", &mut || {
                q8_dot_fn_scalar(ty).expect("every type has a scalar dot");
            });
            #[cfg(target_arch = "x86_64")]
            {
                let dot = avx2::dot_fn(ty);
                variant(
                    &format!("avx2 dot {ty}"),
                    dot.is_some(),
                    no_avx2,
                    &mut || check_single_row(ty, dot.unwrap(), &mut rng),
                );
                let dot = vnni::dot_fn(ty);
                if dot.is_some() || ty == GgmlType::Q3_K {
                    variant(
                        &format!("avx512-vnni dot {ty}"),
                        dot.is_some(),
                        no_vnni,
                        &mut || check_single_row(ty, dot.unwrap(), &mut rng),
                    );
                }
                if TYPES[..5].contains(&ty) {
                    let present = vnni::many_fn(ty).is_some();
                    variant(
                        &format!("avx512-vnni many-row {ty}"),
                        present,
                        no_vnni,
                        &mut || check_many(ty, &row, &x5, 5, "isa report"),
                    );
                    let present = avx2_many::many_fn(ty).is_some();
                    variant(
                        &format!("avx2 many-row {ty}"),
                        present,
                        no_avx2,
                        &mut || check_many(ty, &row, &x5, 5, "isa report"),
                    );
                }
                if matches!(ty, GgmlType::Q2_K | GgmlType::Q3_K | GgmlType::Q6_K) {
                    let present = rows::rows_fn(ty).is_some();
                    variant(
                        &format!("avx512-vnni decode {ty}"),
                        present,
                        no_vnni,
                        &mut || check_rows(ty, &group, &x2, 2, INTERLEAVE_ROWS, "isa report"),
                    );
                    let present = avx2_rows::rows_fn(ty).is_some();
                    variant(&format!("avx2 decode {ty}"), present, no_avx2, &mut || {
                        check_rows(ty, &group, &x2, 2, INTERLEAVE_ROWS, "isa report")
                    });
                }
                if matches!(ty, GgmlType::Q2_K | GgmlType::Q3_K) {
                    let present = q8_interleaved_fn(ty).is_some();
                    variant(
                        &format!("avx512-vnni interleaved decode {ty}"),
                        present,
                        no_vnni,
                        &mut || check_rows(ty, &group, &x1, 1, INTERLEAVE_ROWS, "isa report"),
                    );
                    let tiles = grid::vnni_grid_fn(ty);
                    variant(
                        &format!("avx512-vnni tiles {ty}"),
                        tiles.is_some(),
                        no_vnni,
                        &mut || check_grid(ty, tiles.unwrap(), &row, &x1, 1, 1),
                    );
                    let tiles = q8_grid_fn(ty).filter(|_| here.amx);
                    variant(
                        &format!("amx tiles {ty}"),
                        tiles.is_some(),
                        no_amx,
                        &mut || check_grid(ty, tiles.unwrap(), &row, &x1, 1, 1),
                    );
                }
                if matches!(ty, GgmlType::Q2_K | GgmlType::Q3_K | GgmlType::Q6_K) {
                    let tiles = avx2_grid::grid_fn(ty);
                    variant(
                        &format!("avx2 tiles {ty}"),
                        tiles.is_some(),
                        no_avx2,
                        &mut || check_grid(ty, tiles.unwrap(), &row, &x5, 1, 5),
                    );
                }
            }
        }
        let report = format!(
            "Q8_K kernel ISA variants on this machine ({here:?}):\n  ran ({}): {}\n  skipped ({}): {}",
            ran.len(),
            ran.join(", "),
            skipped.len(),
            if skipped.is_empty() {
                "none".to_string()
            } else {
                skipped.join(", ")
            }
        );
        eprintln!("{report}");
        assert!(
            failed.is_empty(),
            "{report}\n  FAILED: {}",
            failed.join(", ")
        );
        assert!(!ran.is_empty(), "{report}");
    }

    /// Two planes as the cpu backend makes them: the value, then its rounding residual.
    fn two_planes(x: &[f32]) -> Vec<BlockQ8K> {
        let hi = quantize(x);
        let mut r = x.to_vec();
        for ((rb, xb), b) in r.chunks_exact_mut(QK_K).zip(x.chunks_exact(QK_K)).zip(&hi) {
            for ((ri, &xi), &qi) in rb.iter_mut().zip(xb).zip(&b.qs) {
                *ri = xi - b.d * f32::from(qi);
            }
        }
        let mut out = hi;
        out.extend(quantize(&r));
        out
    }

    #[test]
    fn rows_match_the_single_row_kernel_bit_for_bit() {
        let mut rng = ChaCha8Rng::seed_from_u64(12);
        for &ty in &TYPES {
            for nb in [1, 2, 16, 17] {
                // Below, at and past the groups of 4 (two planes), 8 (one plane) and 16 (rows in
                // the lanes).
                for n in [1, 3, 4, 5, 8, 9, 13, 16, 17, 32, 35] {
                    let sampled: Vec<u8> = (0..n).flat_map(|_| weights(ty, nb, &mut rng)).collect();
                    let bytes: Vec<u8> = (0..n)
                        .flat_map(|_| random_bytes(ty, nb, &mut rng))
                        .collect();
                    let a = activations(nb, &mut rng);
                    let one = quantize(&a);
                    let two = two_planes(&a);
                    for (x, planes) in [(&one, 1), (&two, 2)] {
                        check_rows(ty, &sampled, x, planes, n, "sampler");
                        check_rows(ty, &bytes, x, planes, n, "random bytes");
                    }
                    let mut bad = a.clone();
                    bad[nb * QK_K - 1] = f32::NAN;
                    check_rows(ty, &sampled, &two_planes(&bad), 2, n, "NaN activation");
                }
            }
            // No blocks: every row is +0.0; no rows: nothing.
            check_rows(ty, &[], &[], 2, 0, "empty");
        }
    }

    /// The many-token interleaved kernel against the scalar single-row kernel, token by token
    /// and plane by plane (the plane dots added in plane order): the same bits, at token counts
    /// below, at and past its passes of eight activation rows, with sampled and random blocks,
    /// and with a NaN activation.
    #[test]
    fn interleaved_tokens_match_the_single_row_kernel_bit_for_bit() {
        let mut rng = ChaCha8Rng::seed_from_u64(21);
        for ty in [GgmlType::Q2_K, GgmlType::Q3_K] {
            let Some(kernel) = q8_interleaved_tokens_fn(ty) else {
                println!("note: no AVX-512 VNNI on this CPU, {ty}: many-token checks skipped");
                continue;
            };
            let slow = q8_dot_fn_scalar(ty).unwrap();
            for nb in [1, 2, 16] {
                let n = 32;
                let rb = nb * block_bytes(ty);
                for sampled in [true, false] {
                    let w = rows_of(ty, n, nb, sampled, &mut rng);
                    let mut packed = vec![0u8; w.len()];
                    interleave_rows(ty, &w, &mut packed, rb).unwrap();
                    for planes in [1, 2] {
                        for tokens in [1, 2, 3, 4, 5, 9, 13] {
                            let x: Vec<BlockQ8K> = (0..tokens)
                                .flat_map(|j| {
                                    let mut a = activations(nb, &mut rng);
                                    if j == 1 && !sampled {
                                        a[0] = f32::NAN;
                                    }
                                    if planes == 2 {
                                        two_planes(&a)
                                    } else {
                                        quantize(&a)
                                    }
                                })
                                .collect();
                            let mut got = vec![1.5f32; n * tokens];
                            kernel(&packed, &x, planes, tokens, &mut got);
                            for i in 0..n {
                                let row = &w[i * rb..(i + 1) * rb];
                                for j in 0..tokens {
                                    let xj = &x[j * planes * nb..(j + 1) * planes * nb];
                                    let d: Vec<f32> =
                                        xj.chunks(nb).map(|xp| slow(row, xp)).collect();
                                    let want = d[1..].iter().fold(d[0], |a, &v| a + v);
                                    let a = got[i * tokens + j];
                                    assert!(
                                        same(a, want),
                                        "{ty} nb {nb} planes {planes} tokens {tokens} row {i} token {j}: {a} vs {want}"
                                    );
                                }
                            }
                        }
                    }
                }
            }
            // Lengths that disagree: NaN (release) or the debug assertion; no blocks: +0.0.
            let got = std::panic::catch_unwind(|| {
                let mut y = vec![0.0f32; 32];
                kernel(
                    &vec![0u8; 16 * block_bytes(ty)],
                    &[BlockQ8K::ZERO; 2],
                    2,
                    1,
                    &mut y,
                );
                y
            });
            if cfg!(debug_assertions) {
                assert!(got.is_err(), "{ty} rows not whole groups");
            } else {
                assert!(
                    got.unwrap().iter().all(|v| v.is_nan()),
                    "{ty} rows not whole groups"
                );
            }
            let mut y = vec![1.5f32; 4];
            kernel(&[], &[], 2, 2, &mut y);
            assert!(y.iter().all(|&v| v == 0.0), "{ty} no blocks");
        }
    }

    /// A decode call whose lengths or plane count disagree fills `y` with NaN (release) or
    /// panics in the `debug_assert` (debug); no rows with no weights is a no-op.
    #[test]
    fn rows_mismatched_lengths_are_refused() {
        let x = [BlockQ8K::ZERO; 6];
        for &ty in &TYPES {
            for kernel in rows_kernels(ty) {
                let bb = block_bytes(ty);
                // (weight bytes, x blocks, planes, rows): weights one byte short, x not planes ×
                // nb, no planes, three planes, weights for another row count.
                for (len, nx, planes, rows) in [
                    (4 * bb - 1, 4, 2, 2),
                    (2 * bb, 3, 2, 2),
                    (2 * bb, 2, 0, 2),
                    (3 * bb, 3, 3, 3),
                    (3 * bb, 2, 2, 2),
                ] {
                    let w = vec![0u8; len];
                    let got = std::panic::catch_unwind(|| {
                        let mut y = vec![0.0f32; rows];
                        kernel(&w, &x[..nx], planes, &mut y);
                        y
                    });
                    if cfg!(debug_assertions) {
                        assert!(got.is_err(), "{ty} len {len} x {nx} planes {planes}");
                    } else {
                        assert!(got.unwrap().iter().all(|v| v.is_nan()), "{ty} len {len}");
                    }
                }
                let mut y: [f32; 0] = [];
                kernel(&[], &x[..2], 2, &mut y);
            }
        }
    }

    /// A multi-row call whose lengths disagree fills `y` with NaN (release) or panics in the
    /// `debug_assert` (debug); an empty `y` with empty `x` is a no-op.
    #[test]
    fn many_mismatched_lengths_are_refused() {
        let x = [BlockQ8K::ZERO; 6];
        for &ty in &TYPES {
            for many in many_kernels(ty) {
                let bb = block_bytes(ty);
                // (row bytes, x blocks, rows): a row one byte short, x not rows × nb, y empty with x.
                for (len, nx, rows) in [(2 * bb - 1, 4, 2), (2 * bb, 5, 2), (bb, 3, 2), (bb, 1, 0)]
                {
                    let row = vec![0u8; len];
                    let got = std::panic::catch_unwind(|| {
                        let mut y = vec![0.0f32; rows];
                        many(&row, &x[..nx], &mut y);
                        y
                    });
                    if cfg!(debug_assertions) {
                        assert!(got.is_err(), "{ty} len {len} x {nx} rows {rows}");
                    } else {
                        assert!(got.unwrap().iter().all(|v| v.is_nan()), "{ty} len {len}");
                    }
                }
                let mut y: [f32; 0] = [];
                many(&vec![0u8; bb], &[], &mut y);
            }
        }
    }

    #[test]
    fn nan_activations_make_the_dot_nan_and_empty_rows_are_zero() {
        let mut rng = ChaCha8Rng::seed_from_u64(4);
        for &ty in &TYPES {
            let row = weights(ty, 2, &mut rng);
            let mut x = activations(2, &mut rng);
            x[300] = f32::NAN;
            let y = quantize(&x);
            assert!(q8_dot_fn_scalar(ty).unwrap()(&row, &y).is_nan(), "{ty}");
            assert!(q8_dot_fn(ty).unwrap()(&row, &y).is_nan(), "{ty}");
            assert_eq!(q8_dot_fn(ty).unwrap()(&[], &[]).to_bits(), 0);
            assert_eq!(q8_dot_fn_scalar(ty).unwrap()(&[], &[]).to_bits(), 0);
        }
    }

    /// A row whose length disagrees with `x` is refused: `debug_assert` in debug builds, NaN
    /// in release builds; never a read out of bounds.
    #[test]
    fn mismatched_lengths_are_refused() {
        let y = [BlockQ8K::ZERO; 2];
        for &ty in &TYPES {
            for dot in [q8_dot_fn(ty).unwrap(), q8_dot_fn_scalar(ty).unwrap()] {
                for len in [
                    0,
                    block_bytes(ty),
                    3 * block_bytes(ty),
                    2 * block_bytes(ty) - 1,
                ] {
                    let row = vec![0u8; len];
                    let got = std::panic::catch_unwind(|| dot(&row, &y));
                    if cfg!(debug_assertions) {
                        assert!(got.is_err(), "{ty} len {len}");
                    } else {
                        assert!(got.unwrap().is_nan(), "{ty} len {len}");
                    }
                }
            }
        }
    }

    /// The grid kernels of `ty` to check: the dispatched one (AMX where the CPU and OS have
    /// it), the VNNI backend and the AVX2 kernel, each where the CPU has it; none (with a note
    /// for the types that have one) without them.
    fn grid_kernels(ty: GgmlType) -> Vec<Q8GridFn> {
        #[cfg(target_arch = "x86_64")]
        let (vnni, avx2) = (grid::vnni_grid_fn(ty), avx2_grid::grid_fn(ty));
        #[cfg(not(target_arch = "x86_64"))]
        let (vnni, avx2): (Option<Q8GridFn>, Option<Q8GridFn>) = (None, None);
        if vnni.is_none() && matches!(ty, GgmlType::Q2_K | GgmlType::Q3_K) {
            println!("note: no AVX-512 VNNI on this CPU, {ty}: VNNI grid checks skipped");
        }
        if avx2.is_none() && matches!(ty, GgmlType::Q2_K | GgmlType::Q3_K | GgmlType::Q6_K) {
            println!("note: no AVX2 on this CPU, {ty}: AVX2 grid checks skipped");
        }
        q8_grid_fn(ty).into_iter().chain(vnni).chain(avx2).collect()
    }

    /// `n` weight rows of `nb` blocks (sampled, or random bytes) against `rows` activation rows
    /// `x`: the tile kernel gives the scalar single-row bits for every pair (or both NaN).
    fn check_grid(ty: GgmlType, grid: Q8GridFn, w: &[u8], x: &[BlockQ8K], n: usize, rows: usize) {
        let slow = q8_dot_fn_scalar(ty).unwrap();
        let nb = x.len() / rows;
        let tiles = Q8Tiles::pack(x, rows).unwrap();
        let mut y = vec![1.5f32; n * rows];
        grid(w, &tiles, &mut y);
        let rb = nb * block_bytes(ty);
        for i in 0..n {
            for j in 0..rows {
                let want = slow(&w[i * rb..(i + 1) * rb], &x[j * nb..(j + 1) * nb]);
                let got = y[i * rows + j];
                assert!(
                    same(got, want),
                    "{ty} nb {nb} n {n} rows {rows} ({i}, {j}): {got} vs {want}"
                );
            }
        }
    }

    #[test]
    fn grid_matches_the_single_row_kernel_bit_for_bit() {
        let mut rng = ChaCha8Rng::seed_from_u64(8);
        for &ty in &TYPES {
            for grid in grid_kernels(ty) {
                // Weight rows and activation rows below, at and past the 16 of a tile, one and two
                // groups, an odd group count.
                for (nb, n, rows) in [
                    (1, 1, 1),
                    (2, 5, 2),
                    (1, 16, 16),
                    (17, 17, 17),
                    (2, 33, 40),
                    (16, 3, 33),
                    (2, 5, 25),
                ] {
                    let sampled: Vec<u8> = (0..n).flat_map(|_| weights(ty, nb, &mut rng)).collect();
                    let bytes: Vec<u8> = (0..n)
                        .flat_map(|_| random_bytes(ty, nb, &mut rng))
                        .collect();
                    let mut a = activations(nb * rows, &mut rng);
                    let x = quantize(&a);
                    check_grid(ty, grid, &sampled, &x, n, rows);
                    check_grid(ty, grid, &bytes, &x, n, rows);
                    a[nb * QK_K * (rows - 1) + 5] = f32::NAN;
                    check_grid(ty, grid, &sampled, &quantize(&a), n, rows);
                }
            }
        }
    }

    /// The tile kernels' cost in activation rows: whole groups of 16, a last group of at most 8
    /// rows at half a group on the VNNI and AVX2 backends (not on AMX), the rows themselves
    /// without a tile kernel.
    #[test]
    fn grid_cost_rows_round_to_the_groups_computed() {
        let cases = [0, 1, 8, 9, 16, 17, 24, 25, 40];
        let got: Vec<usize> = cases.iter().map(|&r| q8_grid_cost_rows(r)).collect();
        #[cfg(target_arch = "x86_64")]
        let (amx, halves) = (crate::isa::isa().amx, avx2::detected());
        #[cfg(not(target_arch = "x86_64"))]
        let (amx, halves) = (false, false);
        let want = match (amx, halves) {
            (true, _) => [0, 16, 16, 16, 16, 32, 32, 32, 48],
            (false, true) => [0, 8, 8, 16, 16, 24, 24, 32, 40],
            (false, false) => cases,
        };
        assert_eq!(got, want);
    }

    /// The layout of [`interleave_rows`]' docstring, byte by byte, for a type whose blocks are
    /// whole words (Q2_K, 84 bytes) and one with a remainder (Q3_K, 110), and the errors.
    #[test]
    fn interleaved_layout_is_the_documented_permutation() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        for ty in [GgmlType::Q2_K, GgmlType::Q3_K] {
            let (bytes, nb, groups) = (ty.type_size(), 3, 2);
            let row_bytes = nb * bytes;
            let src: Vec<u8> = (0..groups * INTERLEAVE_ROWS * row_bytes)
                .map(|_| rng.random())
                .collect();
            let mut dst = vec![0u8; src.len()];
            interleave_rows(ty, &src, &mut dst, row_bytes).unwrap();
            let (words, rest) = (bytes / 4, bytes % 4);
            for g in 0..groups {
                let group_at = g * INTERLEAVE_ROWS * row_bytes;
                for r in 0..INTERLEAVE_ROWS {
                    for b in 0..nb {
                        let block_at = group_at + b * INTERLEAVE_ROWS * bytes;
                        for i in 0..bytes {
                            let at = if i < 4 * words {
                                block_at + ((i / 4) * INTERLEAVE_ROWS + r) * 4 + i % 4
                            } else {
                                block_at + 4 * words * INTERLEAVE_ROWS + r * rest + i - 4 * words
                            };
                            let from = group_at + r * row_bytes + b * bytes + i;
                            assert_eq!(
                                dst[at], src[from],
                                "{ty} group {g} row {r} block {b} byte {i}"
                            );
                        }
                    }
                }
            }
            let mut back = vec![0u8; src.len()];
            deinterleave_rows(ty, &dst, &mut back, row_bytes).unwrap();
            assert!(back == src, "{ty} round trip");
            let short = &src[..src.len() - 1];
            assert!(interleave_rows(ty, short, &mut dst[..short.len()], row_bytes).is_err());
            assert!(interleave_rows(ty, &src, &mut dst, row_bytes + 1).is_err());
        }
    }

    /// The interleaved grid kernel on interleaved rows gives every pair the bits the grid kernel
    /// gives on the rows in their own layout (one and two groups of 16 rows; sampled blocks and
    /// random bytes, whose `d` may be NaN or infinite).
    #[test]
    fn interleaved_grid_matches_the_grid_bit_for_bit() {
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        for &ty in &TYPES {
            let (Some(grid), Some(il)) = (q8_grid_fn(ty), q8_grid_interleaved_fn(ty)) else {
                continue;
            };
            for (nb, n, rows, sampled) in [
                (1, 16, 1, true),
                (2, 32, 17, true),
                (16, 16, 40, true),
                (2, 32, 24, false),
            ] {
                let w = rows_of(ty, n, nb, sampled, &mut rng);
                let mut packed = vec![0u8; w.len()];
                interleave_rows(ty, &w, &mut packed, nb * block_bytes(ty)).unwrap();
                let tiles = Q8Tiles::pack(&quantize(&activations(nb * rows, &mut rng)), rows);
                let tiles = tiles.unwrap();
                let (mut want, mut got) = (vec![1.5f32; n * rows], vec![2.5f32; n * rows]);
                grid(&w, &tiles, &mut want);
                il(&packed, &tiles, &mut got);
                assert!(
                    want.iter().zip(&got).all(|(&a, &b)| same(a, b)),
                    "{ty} nb {nb} n {n} rows {rows}"
                );
            }
        }
    }

    /// A tile call whose lengths disagree fills `y` with NaN (release) or panics in the
    /// `debug_assert` (debug); no rows at all is a no-op.
    #[test]
    fn grid_mismatched_lengths_are_refused() {
        let x = Q8Tiles::pack(&[BlockQ8K::ZERO; 4], 2).unwrap();
        for &ty in &TYPES {
            for grid in grid_kernels(ty) {
                let bb = block_bytes(ty);
                // (weight bytes, outputs): a row one byte short, outputs not a multiple of the rows.
                for (len, outs) in [(2 * bb - 1, 2), (4 * bb, 3), (2 * bb, 4)] {
                    let w = vec![0u8; len];
                    let got = std::panic::catch_unwind(|| {
                        let mut y = vec![0.0f32; outs];
                        grid(&w, &x, &mut y);
                        y
                    });
                    if cfg!(debug_assertions) {
                        assert!(got.is_err(), "{ty} len {len} outs {outs}");
                    } else {
                        assert!(got.unwrap().iter().all(|v| v.is_nan()), "{ty} len {len}");
                    }
                }
                let mut y: [f32; 0] = [];
                grid(&[], &Q8Tiles::pack(&[], 0).unwrap(), &mut y);
                grid(&[], &x, &mut y);
            }
        }
    }

    #[test]
    fn packing_refuses_a_partial_row() {
        assert!(Q8Tiles::pack(&[BlockQ8K::ZERO; 5], 2).is_none());
        assert!(Q8Tiles::pack(&[BlockQ8K::ZERO; 1], 0).is_none());
        let p = Q8Tiles::pack(&[BlockQ8K::ZERO; 6], 3).unwrap();
        assert_eq!((p.rows(), p.blocks()), (3, 2));
        let empty_rows = Q8Tiles::pack(&[], 4).unwrap();
        assert_eq!((empty_rows.rows(), empty_rows.blocks()), (4, 0));
    }

    proptest::proptest! {
        /// Any element and block count: quantization errs exactly when the lengths disagree.
        #[test]
        fn quantize_arbitrary_lengths_never_panic(n in 0usize..2000, nb in 0usize..9) {
            let x = vec![1.0f32; n];
            let mut y = vec![BlockQ8K::ZERO; nb];
            proptest::prop_assert_eq!(quantize_row_q8k(&x, &mut y).is_ok(), n == nb * QK_K);
        }

        /// Any bytes (scales and codes of every value, f16 NaN/inf included) and any activation
        /// values (NaN, inf, subnormal): no panic (integer overflow panics in debug builds),
        /// and the AVX2 kernel gives the scalar bits.
        #[test]
        fn arbitrary_blocks_never_panic(
            t in 0..TYPES.len(),
            nb in 0usize..4,
            seed in proptest::prelude::any::<u64>(),
            x in proptest::collection::vec(proptest::prelude::any::<f32>(), 4 * QK_K),
        ) {
            let ty = TYPES[t];
            let row = random_bytes(ty, nb, &mut ChaCha8Rng::seed_from_u64(seed));
            let y = quantize(&x[..nb * QK_K]);
            let slow = q8_dot_fn_scalar(ty).unwrap()(&row, &y);
            let fast = q8_dot_fn(ty).unwrap()(&row, &y);
            proptest::prop_assert!(same(slow, fast), "{} {} vs {}", ty, slow, fast);
        }

        /// Any bytes and activation values (NaN, inf, subnormal), 1 to 3 weight rows and 1 to
        /// 20 activation rows: every tile kernel (Q2_K, Q3_K, Q6_K) gives the scalar single-row
        /// bits in every pair.
        #[test]
        fn arbitrary_grids_match_the_scalar_kernel(
            t in proptest::sample::select(vec![0usize, 1, 4]),
            nb in 1usize..3,
            n in 1usize..4,
            rows in 1usize..21,
            seed in proptest::prelude::any::<u64>(),
            x in proptest::collection::vec(proptest::prelude::any::<f32>(), 40 * QK_K),
        ) {
            let ty = TYPES[t];
            for grid in grid_kernels(ty) {
                let mut rng = ChaCha8Rng::seed_from_u64(seed);
                let w: Vec<u8> = (0..n).flat_map(|_| random_bytes(ty, nb, &mut rng)).collect();
                let y = quantize(&x[..nb * rows * QK_K]);
                check_grid(ty, grid, &w, &y, n, rows);
            }
        }

        /// Any bytes and activation values (NaN, inf, subnormal), 1 to 40 weight rows, one or
        /// two planes: every decode kernel gives the scalar bits, plane dots in plane order.
        #[test]
        fn arbitrary_rows_match_the_scalar_kernel(
            t in 0..TYPES.len(),
            nb in 1usize..3,
            n in 1usize..41,
            planes in 1usize..3,
            seed in proptest::prelude::any::<u64>(),
            x in proptest::collection::vec(proptest::prelude::any::<f32>(), 4 * QK_K),
        ) {
            let ty = TYPES[t];
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let w: Vec<u8> = (0..n).flat_map(|_| random_bytes(ty, nb, &mut rng)).collect();
            let y = quantize(&x[..planes * nb * QK_K]);
            check_rows(ty, &w, &y, planes, n, "proptest");
        }

        /// Any bytes and activation values, 1 to 9 activation rows: every multi-row kernel
        /// gives the scalar single-row bits in every row.
        #[test]
        fn arbitrary_many_rows_match_the_scalar_kernel(
            t in 0..TYPES.len(),
            nb in 1usize..3,
            rows in 1usize..10,
            seed in proptest::prelude::any::<u64>(),
            x in proptest::collection::vec(proptest::prelude::any::<f32>(), 18 * QK_K),
        ) {
            let ty = TYPES[t];
            let row = random_bytes(ty, nb, &mut ChaCha8Rng::seed_from_u64(seed));
            let y = quantize(&x[..nb * rows * QK_K]);
            check_many(ty, &row, &y, rows, "proptest");
        }
    }
}
