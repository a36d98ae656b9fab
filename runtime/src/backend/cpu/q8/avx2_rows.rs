//! AVX2 decode kernels: many Q2_K, Q3_K or Q6_K weight rows against the Q8_K planes of one token
//! (`q8`: one plane; `q8x2`: value and residual), with the integer sums and f32 expressions of
//! the scalar kernels, so that every row gets the bits of [`super::q8_dot_fn`] summed over the
//! planes in plane order. The row loop, the lane order and the f32 steps are shared with the
//! AVX-512 decode kernels (`avx512/rows.rs`).
//!
//! Algorithm. A group of `R = 8 / P` weight rows (`P` the planes) is walked block by block:
//!
//! 1. Each row's block is unpacked once, 32 codes at a time in the single-row kernels' layout
//!    (`avx2.rs`: vector `k` holds elements `32k .. 32k + 32`, each 128-bit half one 16-element
//!    sub-block), and every plane takes the 32 codes by `maddubs` (|pair| ≤ 2·63·127) and
//!    `madd` by the sub-block scales as i16 lanes, added into that plane's eight i32 lanes:
//!    * Q2_K: codes 0..=3, scales 0..=15; the mins `M = Σ_j m_j·bsum_j` by one `madd` per plane.
//!    * Q3_K: codes `q3 = q + 4·hbit` (0..=7), scales `sc − 32`; the `− 4` is
//!      `− 4·Σ_j s_j·bsum_j`, one `madd` per plane that starts the lanes.
//!    * Q6_K: codes 0..=63, scales `sc`, and `− 32·Σ_j sc_j·bsum_j` likewise.
//! 2. The group's eight exact i32 sums (`R` rows × `P` planes; Q2_K also its eight mins) are
//!    reduced by one transpose-and-add tree into lanes `r·P + p`, converted to f32 (round to
//!    nearest) and turned into the block's value by the scalar f32 expression lane-wise (`mul` /
//!    `sub` in the same order, no FMA); each lane adds it into its f32 accumulator, blocks in
//!    order from `+0.0`. Row `r`'s result is its plane accumulators added in plane order.
//!
//! While a group is computed, the next group's bytes are prefetched, one block's share per block
//! step, into L1 when two groups fit it, else into L2. Rows that do not fill a group go one at a
//! time through the same code (`R = 1`). Q2_K and Q3_K take this module's row loop and its
//! one-row groups only: their groups of eight rows are `avx2_lanes.rs`'s (the rows in the
//! lanes, no reduction per block).

#![allow(non_snake_case)] // ggml's type names

use super::avx2::{
    bsums, load16, load32, planes2, q2k_scales_mins, q3k_codes, q3k_scales, q6k_codes,
    scale_halves_i16, scale_pair_i16, scale_pair_u8, sum_lanes8, x32,
};
use super::block::BlockQ8K;
use super::shared::{clamped, prefetch, prefetch_l2, row_blocks, rows_lengths};
use super::types::Q8RowsFn;
use crate::ggml_type::GgmlType;
use std::arch::x86_64::*;

/// A decode kernel as a [`Q8RowsFn`], compiled with the target features `$features`: `$before`
/// (if given) first, which computes some rows and hands back the rest, then [`rows_loop`] over
/// blocks of `$b` bytes by `$group` in groups of eight rows at one plane, four at two. The
/// caller hands it out only where the CPU has `$features`.
macro_rules! rows_kernel {
    ($features:literal, $b:literal, $group:ident $(, $before:path)?) => {{
        #[target_feature(enable = $features)]
        fn kernel(w: &[u8], x: &[BlockQ8K], planes: usize, y: &mut [f32]) {
            $(
                let Some((w, y)) = $before(w, x, planes, y) else {
                    return;
                };
            )?
            match planes {
                1 => rows_loop::<$b, 8>(w, x, 1, y, $group::<8, 1>, $group::<1, 1>),
                _ => rows_loop::<$b, 4>(w, x, planes, y, $group::<4, 2>, $group::<1, 2>),
            }
        }
        fn rows(w: &[u8], x: &[BlockQ8K], planes: usize, y: &mut [f32]) {
            // SAFETY: reachable only where the CPU has `$features` (the macro's contract).
            unsafe { kernel(w, x, planes, y) }
        }
        rows as Q8RowsFn
    }};
}
pub(super) use rows_kernel;

/// The AVX2 decode kernel of `ty` (Q6_K; Q2_K and Q3_K have `avx2_lanes.rs`'s), or None (no
/// kernel for `ty`, or the CPU lacks AVX2, FMA or F16C).
pub(super) fn rows_fn(ty: GgmlType) -> Option<Q8RowsFn> {
    if !super::avx2::detected() {
        return None;
    }
    Some(match ty {
        GgmlType::Q6_K => rows_kernel!("avx2,fma,f16c", 210, q6_group),
        _ => return None,
    })
}

/// A kernel's work on one group of `R` consecutive rows (`rb` bytes each, `nb` blocks of `B`
/// bytes) against `P` planes of `nb` blocks: row `r`'s planes added in plane order.
/// `ahead` is the rows `D` groups later, prefetched as this group is computed: at block `b` its
/// bytes `b·R·B .. (b + 1)·R·B`, a block's share in address order.
pub(super) type Group<const R: usize> =
    unsafe fn(&[u8], usize, &[BlockQ8K], usize, &[u8]) -> [f32; R];

/// Groups between the one computed and the one prefetched: the next (further ahead, the
/// prefetched rows no longer fit L1 beside the ones being read).
const D: usize = 1;

/// The row loop of every decode kernel: the length check of [`Q8RowsFn`] (NaN in every `y[i]`
/// otherwise), then groups of `R` rows by `group`, the rest one row at a time by `one`, each
/// handed the rows [`D`] groups (rows) later to prefetch.
///
/// The caller makes sure the CPU has the features of `group` and `one`.
#[inline(always)]
pub(super) fn rows_loop<const B: usize, const R: usize>(
    w: &[u8],
    x: &[BlockQ8K],
    planes: usize,
    y: &mut [f32],
    group: Group<R>,
    one: Group<1>,
) {
    let Some((nb, rb)) = rows_lengths(w, x, planes, y, B) else {
        return;
    };
    let n = y.len();
    let full = n - n % R;
    for g in (0..full).step_by(R) {
        let ahead = clamped(w, (g + D * R) * rb, (g + (D + 1) * R) * rb);
        // SAFETY: the caller checked the CPU has `group`'s features; the rows are in bounds
        // (checked).
        let v = unsafe { group(&w[g * rb..(g + R) * rb], rb, x, nb, ahead) };
        y[g..g + R].copy_from_slice(&v);
    }
    for i in full..n {
        let ahead = clamped(w, (i + D) * rb, (i + D + 1) * rb);
        // SAFETY: as above.
        y[i] = unsafe { one(&w[i * rb..(i + 1) * rb], rb, x, nb, ahead) }[0];
    }
}

/// `f(r, p)` in lane `r·P + p` (lanes past `R·P` zero): the lane order of step 2.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn lanes<const R: usize, const P: usize, T: Copy + Default>(
    f: impl Fn(usize, usize) -> T,
) -> [T; 8] {
    let mut out = [T::default(); 8];
    for r in 0..R {
        for p in 0..P {
            out[r * P + p] = f(r, p);
        }
    }
    out
}

/// The f16 `bits` of each lane widened to f32 (exact).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn widen(bits: [u16; 8]) -> __m256 {
    // SAFETY: `bits` is 8 u16 = 16 readable bytes; loadu needs no alignment.
    _mm256_cvtph_ps(unsafe { _mm_loadu_si128(bits.as_ptr().cast()) })
}

/// The f32 `v` of each lane as a vector.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn load8(v: [f32; 8]) -> __m256 {
    // SAFETY: `v` is 8 f32 = 32 readable bytes; loadu needs no alignment.
    unsafe { _mm256_loadu_ps(v.as_ptr()) }
}

/// The f16 at bytes `at .. at + 2` of `b` as raw bits.
#[inline(always)]
pub(super) fn f16_bits(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

/// Row `r`'s result: its `P` lane accumulators added in plane order.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn finish<const R: usize, const P: usize>(acc: __m256) -> [f32; R] {
    let mut a = [0f32; 8];
    // SAFETY: `a` is 8 f32 = 32 writable bytes; storeu needs no alignment.
    unsafe { _mm256_storeu_ps(a.as_mut_ptr(), acc) };
    std::array::from_fn(|r| {
        let mut v = a[r * P];
        for p in 1..P {
            v += a[r * P + p];
        }
        v
    })
}

/// `d8·(d·S − dmin·M)` lane-wise, as `value_dmin` (Q2_K).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn values_dmin(d8: __m256, d: __m256, dmin: __m256, s: __m256i, m: __m256i) -> __m256 {
    let (s, m) = (_mm256_cvtepi32_ps(s), _mm256_cvtepi32_ps(m));
    _mm256_mul_ps(
        d8,
        _mm256_sub_ps(_mm256_mul_ps(d, s), _mm256_mul_ps(dmin, m)),
    )
}

/// `d8·(d·S)` lane-wise, as `value_d` (Q3_K, Q6_K).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn values_d(d8: __m256, d: __m256, s: __m256i) -> __m256 {
    _mm256_mul_ps(d8, _mm256_mul_ps(d, _mm256_cvtepi32_ps(s)))
}

/// Bytes of a prefetched group beyond which it goes to L2 instead of L1: two groups (the one
/// read and the one prefetched) must fit a 32 KiB L1D for L1 to pay.
const L1_GROUP_MAX: usize = 12 * 1024;

/// The `b`-th share (`share` bytes) of the next group `ahead` prefetched (module note).
#[inline(always)]
pub(super) fn prefetch_share(ahead: &[u8], b: usize, share: usize) {
    let part = clamped(ahead, b * share, (b + 1) * share);
    if ahead.len() > L1_GROUP_MAX {
        prefetch_l2(part);
    } else {
        prefetch(part);
    }
}

/// The block loop of a group kernel: for each block `b` in order, the next group's share
/// prefetched, then `value(blocks, ys)` — block `b` of each of the `R` rows and of each of the
/// `P` planes — the block's value in lane `r·P + p`, added into that lane's f32 accumulator from
/// `+0.0`; row `r`'s result its planes added in plane order ([`finish`]).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn group_blocks<const B: usize, const R: usize, const P: usize>(
    w: &[u8],
    rb: usize,
    x: &[BlockQ8K],
    nb: usize,
    ahead: &[u8],
    mut value: impl FnMut([&[u8; B]; R], [&BlockQ8K; P]) -> __m256,
) -> [f32; R] {
    let rows = row_blocks::<B, R>(w, rb, nb);
    let planes: [&[BlockQ8K]; P] = std::array::from_fn(|p| &x[p * nb..(p + 1) * nb]);
    let mut acc = _mm256_setzero_ps();
    for b in 0..nb {
        prefetch_share(ahead, b, R * B);
        acc = _mm256_add_ps(acc, value(rows.map(|r| &r[b]), planes.map(|p| &p[b])));
    }
    finish::<R, P>(acc)
}

/// Q2_K, `R` rows × `P` planes (`R·P ≤ 8`).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn q2_group<const R: usize, const P: usize>(
    w: &[u8],
    rb: usize,
    x: &[BlockQ8K],
    nb: usize,
    ahead: &[u8],
) -> [f32; R] {
    group_blocks::<84, R, P>(w, rb, x, nb, ahead, |blks, ys| {
        let mut s = [_mm256_setzero_si256(); 8];
        let mut m = [_mm256_setzero_si256(); 8];
        for (r, blk) in blks.into_iter().enumerate() {
            let (scale_bytes, mins) = q2k_scales_mins(blk);
            let mut acc_p = [_mm256_setzero_si256(); P];
            for n in 0..2 {
                for (j, c) in planes2(load32(&blk[16 + 32 * n..])).into_iter().enumerate() {
                    let k = 4 * n + j;
                    let sc = scale_pair_u8(scale_bytes, 2 * k);
                    for p in 0..P {
                        let pairs = _mm256_maddubs_epi16(c, x32(ys[p], k));
                        acc_p[p] = _mm256_add_epi32(acc_p[p], _mm256_madd_epi16(pairs, sc));
                    }
                }
            }
            for p in 0..P {
                s[r * P + p] = acc_p[p];
                m[r * P + p] = _mm256_madd_epi16(mins, bsums(ys[p]));
            }
        }
        let d8 = load8(lanes::<R, P, f32>(|_, p| ys[p].d));
        let d = widen(lanes::<R, P, u16>(|r, _| f16_bits(blks[r], 80)));
        let dmin = widen(lanes::<R, P, u16>(|r, _| f16_bits(blks[r], 82)));
        values_dmin(d8, d, dmin, sum_lanes8(s), sum_lanes8(m))
    })
}

/// Q3_K, `R` rows × `P` planes: codes `q3 = q + 4·hbit`, scales `sc − 32`, offset `−4·s`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn q3_group<const R: usize, const P: usize>(
    w: &[u8],
    rb: usize,
    x: &[BlockQ8K],
    nb: usize,
    ahead: &[u8],
) -> [f32; R] {
    let unpack = |blk: &[u8; 110]| {
        let scales = q3k_scales(blk);
        (scales, _mm256_mullo_epi16(scales, _mm256_set1_epi16(-4)))
    };
    signed_group::<110, R, P>(w, rb, x, nb, ahead, unpack, |blk, n| q3k_codes(blk, n))
}

/// Q6_K, `R` rows × `P` planes: codes 0..=63, scales `sc` (i8), offset `−32·sc`.
#[target_feature(enable = "avx2,fma,f16c")]
fn q6_group<const R: usize, const P: usize>(
    w: &[u8],
    rb: usize,
    x: &[BlockQ8K],
    nb: usize,
    ahead: &[u8],
) -> [f32; R] {
    let unpack = |blk: &[u8; 210]| {
        let scales = _mm256_cvtepi8_epi16(load16(&blk[192..208]));
        (scales, _mm256_mullo_epi16(scales, _mm256_set1_epi16(-32)))
    };
    signed_group::<210, R, P>(w, rb, x, nb, ahead, unpack, |blk, n| q6k_codes(blk, n))
}

/// Q3_K or Q6_K (`B` bytes per block), `R` rows × `P` planes (`R·P ≤ 8`): per row and plane
/// `S = Σ_j s_j·Σ_16 c·x8 + Σ_j offset_j·bsum_j`, then `d8·(d·S)` as `value_d`. `unpack` gives
/// a block's 16 scales and offsets as i16 lanes, `codes(blk, n)` its codes of vectors
/// `4n .. 4n + 4`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn signed_group<const B: usize, const R: usize, const P: usize>(
    w: &[u8],
    rb: usize,
    x: &[BlockQ8K],
    nb: usize,
    ahead: &[u8],
    unpack: impl Fn(&[u8; B]) -> (__m256i, __m256i),
    codes: impl Fn(&[u8; B], usize) -> [__m256i; 4],
) -> [f32; R] {
    group_blocks::<B, R, P>(w, rb, x, nb, ahead, |blks, ys| {
        let mut s = [_mm256_setzero_si256(); 8];
        for (r, blk) in blks.into_iter().enumerate() {
            let (scales, offset) = unpack(blk);
            let mut acc_p = [_mm256_setzero_si256(); P];
            for p in 0..P {
                acc_p[p] = _mm256_madd_epi16(bsums(ys[p]), offset);
            }
            for (n, half) in scale_halves_i16(scales).into_iter().enumerate() {
                for (j, c) in codes(blk, n).into_iter().enumerate() {
                    let sc = scale_pair_i16(half, j);
                    for p in 0..P {
                        let pairs = _mm256_maddubs_epi16(c, x32(ys[p], 4 * n + j));
                        acc_p[p] = _mm256_add_epi32(acc_p[p], _mm256_madd_epi16(pairs, sc));
                    }
                }
            }
            for p in 0..P {
                s[r * P + p] = acc_p[p];
            }
        }
        let d8 = load8(lanes::<R, P, f32>(|_, p| ys[p].d));
        let d = widen(lanes::<R, P, u16>(|r, _| f16_bits(blks[r], B - 2)));
        values_d(d8, d, sum_lanes8(s))
    })
}
