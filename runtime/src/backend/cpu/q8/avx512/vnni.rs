//! AVX-512 VNNI kernels (256-bit vectors, AVX-512 VL): one weight row against one or several
//! Q8_K activation rows, with the same integer sums and the same f32 helpers as the scalar
//! kernels (so every result has the scalar bits).
//!
//! Algorithm. Each 256-element weight block is unpacked once, then dotted with every activation
//! row in turn (four at a time; the i32 lanes of four rows summed by one transpose-and-add tree,
//! each row's value through the shared f32 helper). Q2_K and Q3_K unpack into eight `__m256i` of
//! u8 "effective weights" with the sub-block scale multiplied in (lane `i` of vector `k` for
//! element `32k + i`: the low 128-bit half is sub-block `2k`, the high half `2k + 1`), and
//! `vpdpbusd` (`_mm256_dpbusd_epi32`: u8 × i8, four products added into each i32 lane, no
//! saturation) takes a row's 256 products in eight instructions.
//!
//! * Q2_K: `w = q·sc ≤ 3·15 = 45`, a byte, by `_mm256_mullo_epi16` of the code bytes by the scale
//!   as an i16 (a lane `lo + 256·hi` gives `lo·sc + 256·hi·sc`, both ≤ 45: no carry, no
//!   overflow); `S = Σ w·x8`; `M = Σ_j m_j·bsum_j` one `madd` per row.
//! * Q3_K: `w = (q3 − 4)·(sc − 32) + 127` in 3..=255 (`q3 = q + 4·hbit` in 0..=7), looked up
//!   (`pshufb`) in a per-half table `[(i − 4)·s + 127; i < 8]` (16-bit arithmetic, packed with
//!   unsigned saturation, exact); `Σ w·x8 = S + 127·Σ_j bsum_j`, so `S` is the `vpdpbusd` sum
//!   plus one `vpdpwssd` of the block sums by −127. Every sum is below 2^24 in magnitude.
//! * Q6_K, Q4_K, Q5_K (scaled codes too wide for a byte): the codes unpacked once (u8, 0..=63
//!   resp. 0..=31) with their i16 scale vectors; per row `_mm256_maddubs_epi16` (|pair| ≤
//!   2·63·127 < 2^15) then `vpdpwssd` by the scales. Q6_K's `− 32` is one more `vpdpwssd` of the
//!   block sums by `−32·sc` (|·| ≤ 4096, an i16); the Q4_K/Q5_K mins as in AVX2.
//!
//! The single-row Q3_K kernel ([`dot_fn`]) keeps the AVX2 layout (`maddubs` per 32 codes, four
//! accumulators) but takes `q3` as the code and the `− 4` through the block sums
//! (`− 4·Σ_j s_j·bsum_j`, `|4·s| ≤ 128`), and fuses each scale `madd` and add into one
//! `vpdpwssd`; Q2_K keeps the AVX2 single-row kernel. Fewer than [`MIN_ROWS`] activation rows go
//! to the single-row kernel of [`super::super::q8_dot_fn`] row by row (unpacking a block for one
//! or two rows costs more than it saves). Every path gives the single-row bits.

#![allow(non_snake_case)] // the kernels keep ggml's type names (q2_K)

use super::avx2::{
    bsums, f16_at, hsum, q3k_codes, q3k_scales, scale_halves_i16, scale_pair_i16, sum4, x32,
};
use super::avx2_many::{
    chains8, dot_many, k4_prep, many_kernel, q2_prep, q6_prep, rows_d, rows_dmin, Wide, Q2,
};
use super::{dot_blocks, each_row, value_d, BlockQ8K, Q8DotFn, Q8DotManyFn};
use crate::ggml_type::GgmlType;
use std::arch::x86_64::*;

/// Whether this CPU has every feature the kernels enable (AVX2, FMA, F16C for the shared AVX2
/// helpers; AVX-512 F, BW, VL and VNNI for `vpdpbusd` on 256-bit vectors).
pub(crate) fn detected() -> bool {
    crate::isa::isa().avx512_vnni
}

/// The single-row VNNI kernel of `ty` (Q3_K only: for Q2_K the AVX2 kernel is faster),
/// or None (no kernel for `ty`, or the CPU lacks a feature).
pub(crate) fn dot_fn(ty: GgmlType) -> Option<Q8DotFn> {
    if ty != GgmlType::Q3_K || !detected() {
        return None;
    }
    fn w(row: &[u8], x: &[BlockQ8K]) -> f32 {
        // SAFETY: `q3_K_one` enables exactly the features that `detected()` just found on
        // this CPU; `w` is only handed out after that.
        unsafe { q3_K_one(row, x) }
    }
    Some(w)
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn q3_K_one(row: &[u8], x: &[BlockQ8K]) -> f32 {
    dot_blocks::<110>(row, x, |b, y| {
        let scales = q3k_scales(b);
        let halves = scale_halves_i16(scales);
        let minus4 = _mm256_mullo_epi16(scales, _mm256_set1_epi16(-4));
        let zero = _mm256_setzero_si256();
        let mut acc = [
            _mm256_dpwssd_epi32(zero, bsums(y), minus4),
            zero,
            zero,
            zero,
        ];
        for (n, half) in halves.into_iter().enumerate() {
            for (j, q3) in q3k_codes(b, n).into_iter().enumerate() {
                let pairs = _mm256_maddubs_epi16(q3, x32(y, 4 * n + j));
                acc[j] = _mm256_dpwssd_epi32(acc[j], pairs, scale_pair_i16(half, j));
            }
        }
        value_d(y.d, f16_at(b, 108), hsum(sum4(acc)))
    })
}

/// Activation rows from which the multi-row kernels beat the single-row one (Q2_K and Q3_K;
/// docs/BENCHMARKS.md).
const MIN_ROWS: usize = 3;

/// The multi-row VNNI kernel of `ty`, or None (no kernel for `ty`, or the CPU lacks a feature).
pub(crate) fn many_fn(ty: GgmlType) -> Option<Q8DotManyFn> {
    if !detected() {
        return None;
    }
    // SAFETY: (for every kernel below) `many_fn` hands it out only after `detected()` found
    // its features on this CPU.
    macro_rules! wrap {
        ($ty:path, $b:literal, $prep:path, $rows:ident) => {
            many_kernel!(
                "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni",
                MIN_ROWS,
                single,
                $ty,
                $b,
                $prep,
                $rows
            )
        };
    }
    Some(match ty {
        GgmlType::Q2_K => wrap!(GgmlType::Q2_K, 84, q2_prep, q2_rows),
        GgmlType::Q3_K => wrap!(GgmlType::Q3_K, 110, q3_prep, q3_rows),
        GgmlType::Q4_K => wrap!(GgmlType::Q4_K, 144, k4_prep::<144, 16, false>, k4_rows),
        GgmlType::Q5_K => wrap!(GgmlType::Q5_K, 176, k4_prep::<176, 48, true>, k4_rows),
        GgmlType::Q6_K => wrap!(GgmlType::Q6_K, 210, q6_prep, q6_rows),
        _ => return None,
    })
}

/// The kernel of the rows below [`MIN_ROWS`]: the single-row kernel `q8_dot_fn` hands out
/// where [`detected`] holds (this module's for Q3_K, else the AVX2 one).
fn single(ty: GgmlType) -> Option<Q8DotFn> {
    dot_fn(ty).or_else(|| super::avx2::dot_fn(ty))
}

/// `init + Σ_k dpbusd(w[k], qs[32k .. 32k + 32])` as eight i32 lanes.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn dp8(init: __m256i, w: &[__m256i; 8], y: &BlockQ8K) -> __m256i {
    chains8(init, |acc, k| _mm256_dpbusd_epi32(acc, w[k], x32(y, k)))
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn q2_rows<const N: usize>(p: &Q2, xs: [&BlockQ8K; N]) -> [f32; N] {
    let mut s = [_mm256_setzero_si256(); N];
    for r in 0..N {
        s[r] = dp8(_mm256_setzero_si256(), &p.w, xs[r]);
    }
    rows_dmin(xs, s, p.mins, p.d, p.dmin)
}

/// One unpacked Q3_K block: the effective weights `(q3 − 4)·(sc − 32) + 127`, and `d`.
pub(crate) struct Q3 {
    pub(crate) w: [__m256i; 8],
    pub(crate) d: f32,
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
pub(crate) fn q3_prep(b: &[u8; 110]) -> Q3 {
    let halves = scale_halves_i16(q3k_scales(b));
    let offsets = _mm256_setr_epi16(-4, -3, -2, -1, 0, 1, 2, 3, -4, -3, -2, -1, 0, 1, 2, 3);
    let bias = _mm256_set1_epi16(127);
    let mut w = [_mm256_setzero_si256(); 8];
    for (n, half) in halves.into_iter().enumerate() {
        for (j, q3) in q3k_codes(b, n).into_iter().enumerate() {
            let table =
                _mm256_add_epi16(_mm256_mullo_epi16(scale_pair_i16(half, j), offsets), bias);
            w[4 * n + j] = _mm256_shuffle_epi8(_mm256_packus_epi16(table, table), q3);
        }
    }
    Q3 {
        w,
        d: f16_at(b, 108),
    }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn q3_rows<const N: usize>(p: &Q3, xs: [&BlockQ8K; N]) -> [f32; N] {
    let minus127 = _mm256_set1_epi16(-127);
    let mut s = [_mm256_setzero_si256(); N];
    for r in 0..N {
        let correction = _mm256_dpwssd_epi32(_mm256_setzero_si256(), bsums(xs[r]), minus127);
        s[r] = dp8(correction, &p.w, xs[r]);
    }
    rows_d(xs, s, p.d)
}

/// `init + Σ_k dpwssd(maddubs(q[k], qs[32k ..]), sc[k])` as eight i32 lanes.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn dp8w(init: __m256i, p: &Wide, y: &BlockQ8K) -> __m256i {
    chains8(init, |acc, k| {
        let pairs = _mm256_maddubs_epi16(p.q[k], x32(y, k));
        _mm256_dpwssd_epi32(acc, pairs, p.sc[k])
    })
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn q6_rows<const N: usize>(p: &Wide, xs: [&BlockQ8K; N]) -> [f32; N] {
    let mut s = [_mm256_setzero_si256(); N];
    for r in 0..N {
        let offset = _mm256_dpwssd_epi32(_mm256_setzero_si256(), bsums(xs[r]), p.sums);
        s[r] = dp8w(offset, p, xs[r]);
    }
    rows_d(xs, s, p.d)
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn k4_rows<const N: usize>(p: &Wide, xs: [&BlockQ8K; N]) -> [f32; N] {
    let mut s = [_mm256_setzero_si256(); N];
    for r in 0..N {
        s[r] = dp8w(_mm256_setzero_si256(), p, xs[r]);
    }
    rows_dmin(xs, s, p.sums, p.d, p.dmin)
}
