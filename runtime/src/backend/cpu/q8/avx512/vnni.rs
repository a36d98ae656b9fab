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
    bsums, f16_at, hsum, hsum8, k4_codes, k4_mins, load16, load32, planes2, q2k_scales_mins,
    q3k_codes, q3k_scales, q6k_codes, scale_halves_i16, scale_pair_i16, scale_pair_u8, sum4, x32,
};
use super::{
    dot_blocks, each_row, k4_scales_mins, many_blocks, value_d, value_dmin, BlockQ8K, Q8DotFn,
    Q8DotManyFn,
};
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
    // The kernel of a type: [`dot_many`] with its block bytes `$b`, unpacking `$prep` and
    // per-row values `$rows` (for four rows and for one); `$ty` is the type, for the row-by-row
    // path below `MIN_ROWS`.
    // SAFETY: (for every wrapper below) `kernel` enables exactly the features that
    // `detected()` just found on this CPU.
    macro_rules! wrap {
        ($ty:path, $b:literal, $prep:path, $rows:ident) => {{
            #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
            fn kernel(row: &[u8], x: &[BlockQ8K], y: &mut [f32]) {
                dot_many::<$b, _>(
                    row,
                    x,
                    y,
                    |b| $prep(b),
                    |p, xs| $rows(p, xs),
                    |p, xs| $rows(p, xs),
                )
            }
            fn w(row: &[u8], x: &[BlockQ8K], y: &mut [f32]) {
                if y.len() < MIN_ROWS {
                    return by_row($ty, $b, row, x, y);
                }
                // SAFETY: see above — reachable only after the features were detected.
                unsafe { kernel(row, x, y) }
            }
            w as Q8DotManyFn
        }};
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

/// The path below [`MIN_ROWS`]: the single-row kernel of `ty` (`bytes` per weight block) once
/// per activation row. Where [`detected`] holds (AVX2 included), that kernel is this module's
/// [`dot_fn`], else the AVX2 one: the kernel [`super::super::q8_dot_fn`] hands out.
fn by_row(ty: GgmlType, bytes: usize, row: &[u8], x: &[BlockQ8K], y: &mut [f32]) {
    match dot_fn(ty).or_else(|| super::avx2::dot_fn(ty)) {
        Some(dot) => each_row(dot, bytes, row, x, y),
        None => y.fill(f32::NAN),
    }
}

/// Activation rows per group.
const R: usize = 4;

/// The block loop of every multi-row kernel: checks the lengths ([`many_blocks`]: NaN in every
/// `y[j]` otherwise), then for each weight block in order unpacks it once (`prep`) and adds its
/// value for every activation row `j` (block `b` of row `j` is `x[j·nb + b]`) into `y[j]`,
/// which starts at `+0.0` — the single-row kernels' order. Rows go four at a time (`four`), the
/// last `n mod 4` one at a time (`one`).
#[inline(always)]
fn dot_many<const B: usize, P>(
    row: &[u8],
    x: &[BlockQ8K],
    y: &mut [f32],
    mut prep: impl FnMut(&[u8; B]) -> P,
    mut four: impl FnMut(&P, [&BlockQ8K; R]) -> [f32; R],
    mut one: impl FnMut(&P, [&BlockQ8K; 1]) -> [f32; 1],
) {
    let Some(nb) = many_blocks(row, x, y, B) else {
        return;
    };
    y.fill(0.0);
    let n = y.len();
    let full = n - n % R;
    let (blocks, _) = row.as_chunks::<B>();
    for (b, w) in blocks.iter().enumerate() {
        let p = prep(w);
        for j0 in (0..full).step_by(R) {
            let v = four(&p, std::array::from_fn(|r| &x[(j0 + r) * nb + b]));
            for (o, v) in y[j0..j0 + R].iter_mut().zip(v) {
                *o += v;
            }
        }
        for (j, o) in y.iter_mut().enumerate().skip(full) {
            *o += one(&p, [&x[j * nb + b]])[0];
        }
    }
}

/// The lane sums of `s[r]` and `m[r]` for each of `N` (1 or 4) rows: one tree for four rows.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn reduce<const N: usize>(s: [__m256i; N], m: [__m256i; N]) -> ([i32; N], [i32; N]) {
    if N == 4 {
        let v = hsum8(std::array::from_fn(|i| if i < 4 { s[i] } else { m[i - 4] }));
        (
            std::array::from_fn(|i| v[i]),
            std::array::from_fn(|i| v[4 + i]),
        )
    } else {
        (s.map(|v| hsum(v)), m.map(|v| hsum(v)))
    }
}

/// Per activation row `y` of `xs`: `value_dmin(y.d, d, dmin, S, M)` with `S` the lane sum of
/// `s(y)` and `M` that of `madd(mins, bsums)` (Q2_K, Q4_K, Q5_K).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn rows_dmin<const N: usize>(
    xs: [&BlockQ8K; N],
    s: impl Fn(&BlockQ8K) -> __m256i,
    mins: __m256i,
    d: f32,
    dmin: f32,
) -> [f32; N] {
    let m = xs.map(|y| _mm256_madd_epi16(mins, bsums(y)));
    let (s, m) = reduce(xs.map(s), m);
    std::array::from_fn(|r| value_dmin(xs[r].d, d, dmin, s[r], m[r]))
}

/// Per activation row `y` of `xs`: `value_d(y.d, d, S)` with `S` the lane sum of `s(y)` (Q3_K,
/// Q6_K).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn rows_d<const N: usize>(
    xs: [&BlockQ8K; N],
    s: impl Fn(&BlockQ8K) -> __m256i,
    d: f32,
) -> [f32; N] {
    let (s, _) = reduce(xs.map(s), [_mm256_setzero_si256(); N]);
    std::array::from_fn(|r| value_d(xs[r].d, d, s[r]))
}

/// `init + Σ_{k<8} step_k` as eight i32 lanes, `acc ← step(acc, k)` in four independent chains
/// (`k mod 4`; `vpdpbusd`/`vpdpwssd` have a latency of several cycles; the i32 sums are exact
/// in any order), added as `(c0 + c1) + (c2 + c3)`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn chains8(init: __m256i, mut step: impl FnMut(__m256i, usize) -> __m256i) -> __m256i {
    let zero = _mm256_setzero_si256();
    let mut acc = [init, zero, zero, zero];
    for k in 0..8 {
        acc[k % 4] = step(acc[k % 4], k);
    }
    sum4(acc)
}

/// `init + Σ_k dpbusd(w[k], qs[32k .. 32k + 32])` as eight i32 lanes.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn dp8(init: __m256i, w: &[__m256i; 8], y: &BlockQ8K) -> __m256i {
    chains8(init, |acc, k| _mm256_dpbusd_epi32(acc, w[k], x32(y, k)))
}

/// One unpacked Q2_K block: the effective weights `q·sc`, the 16 mins as i16, `d`, `dmin`.
pub(crate) struct Q2 {
    pub(crate) w: [__m256i; 8],
    pub(crate) mins: __m256i,
    pub(crate) d: f32,
    pub(crate) dmin: f32,
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
pub(crate) fn q2_prep(b: &[u8; 84]) -> Q2 {
    let (scale_bytes, mins) = q2k_scales_mins(b);
    let mut w = [_mm256_setzero_si256(); 8];
    for n in 0..2 {
        for (j, p) in planes2(load32(&b[16 + 32 * n..])).into_iter().enumerate() {
            let k = 4 * n + j;
            w[k] = _mm256_mullo_epi16(p, scale_pair_u8(scale_bytes, 2 * k));
        }
    }
    Q2 {
        w,
        mins,
        d: f16_at(b, 80),
        dmin: f16_at(b, 82),
    }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn q2_rows<const N: usize>(p: &Q2, xs: [&BlockQ8K; N]) -> [f32; N] {
    let s = |y: &BlockQ8K| dp8(_mm256_setzero_si256(), &p.w, y);
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
    let s = |y: &BlockQ8K| {
        let correction = _mm256_dpwssd_epi32(_mm256_setzero_si256(), bsums(y), minus127);
        dp8(correction, &p.w, y)
    };
    rows_d(xs, s, p.d)
}

/// One unpacked Q4_K, Q5_K or Q6_K block: codes (u8), the i16 scales of each 32 codes, the i16
/// multipliers of the block sums (Q6_K: `−32·sc`; Q4_K/Q5_K: the mins, each for two sums),
/// `d` and `dmin` (Q4_K/Q5_K).
struct Wide {
    q: [__m256i; 8],
    sc: [__m256i; 8],
    sums: __m256i,
    d: f32,
    dmin: f32,
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
fn q6_prep(b: &[u8; 210]) -> Wide {
    let scales = _mm256_cvtepi8_epi16(load16(&b[192..208]));
    let halves = scale_halves_i16(scales);
    let mut q = [_mm256_setzero_si256(); 8];
    let mut sc = [_mm256_setzero_si256(); 8];
    for (n, half) in halves.into_iter().enumerate() {
        for (j, c) in q6k_codes(b, n).into_iter().enumerate() {
            q[4 * n + j] = c;
            sc[4 * n + j] = scale_pair_i16(half, j);
        }
    }
    Wide {
        q,
        sc,
        sums: _mm256_mullo_epi16(scales, _mm256_set1_epi16(-32)),
        d: f16_at(b, 208),
        dmin: 0.0,
    }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn q6_rows<const N: usize>(p: &Wide, xs: [&BlockQ8K; N]) -> [f32; N] {
    let s = |y: &BlockQ8K| {
        let offset = _mm256_dpwssd_epi32(_mm256_setzero_si256(), bsums(y), p.sums);
        dp8w(offset, p, y)
    };
    rows_d(xs, s, p.d)
}

/// Q4_K and Q5_K: the layout of `avx2::k4_codes`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn k4_prep<const B: usize, const QS: usize, const FIVE: bool>(b: &[u8; B]) -> Wide {
    let (scales, mn) = k4_scales_mins(&b[4..16]);
    let mut q = [_mm256_setzero_si256(); 8];
    for r in 0..4 {
        [q[2 * r], q[2 * r + 1]] = k4_codes::<B, QS, FIVE>(b, r);
    }
    Wide {
        q,
        sc: scales.map(|s| _mm256_set1_epi16(i16::from(s))),
        sums: k4_mins(mn),
        d: f16_at(b, 0),
        dmin: f16_at(b, 2),
    }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn k4_rows<const N: usize>(p: &Wide, xs: [&BlockQ8K; N]) -> [f32; N] {
    let s = |y: &BlockQ8K| dp8w(_mm256_setzero_si256(), p, y);
    rows_dmin(xs, s, p.sums, p.d, p.dmin)
}
