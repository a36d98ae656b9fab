//! AVX2 multi-row kernels: one weight row against several Q8_K activation rows (the planes of a
//! decoded token, the tokens of a prompt), each weight block unpacked once for all of them, with
//! the integer sums of the module doc's table and the shared f32 helpers (so every result has the
//! scalar bits). The block loop, the unpacked block ([`Wide`]) and the per-row reductions are
//! shared with the AVX-512 VNNI kernels (`avx512/vnni.rs`), which replace the `madd` + `add`
//! below by one `vpdpwssd`.
//!
//! Algorithm. A block is unpacked into eight `__m256i` of u8 codes (lane `i` of vector `k` for
//! element `32k + i`), eight i16 scale vectors (`[s_2k ×8 | s_2k+1 ×8]` for 16-element
//! sub-blocks, `s_k ×16` for 32-element ones) and one i16 vector `sums` that multiplies the
//! activation block sums. Per activation row: `Σ_k madd(maddubs(q_k, x_k), sc_k)` in four
//! independent chains (|pair| ≤ 2·63·127 < 2^15: no saturation), plus `madd(bsums, sums)`:
//!
//! * Q3_K: codes `q3 = q + 4·hbit` (0..=7), scales `sc − 32`, `sums = −4·(sc − 32)` (the `− 4` of
//!   each code through the block sums, |·| ≤ 128), added into `S`.
//! * Q6_K: codes 0..=63, scales `sc`, `sums = −32·sc` (|·| ≤ 4096), added into `S`.
//! * Q4_K, Q5_K: codes 0..=15 resp. 0..=31, per-32 scales, `sums` the mins (`M`, apart).
//!
//! Q2_K instead unpacks to eight vectors of effective weights `q·sc` (≤ 3·15 = 45, a byte; the
//! VNNI kernels' unpacking), taken by `maddubs` and a `madd` by ones: eight vectors fewer to
//! hold, which at two rows decides whether the kernel beats the single-row one.
//!
//! Every `S` and `M` is an exact i32, so the order of the adds does not change it. Fewer than
//! [`MIN_ROWS`] activation rows go to the single-row AVX2 kernel row by row.

#![allow(non_snake_case)] // ggml's type names

use super::avx2::{
    bsums, f16_at, hsum, hsum8, k4_codes, k4_mins, load16, load32, planes2, q2k_scales_mins,
    q3k_codes, q3k_scales, q6k_codes, scale_halves_i16, scale_pair_i16, scale_pair_u8, sum4, x32,
};
use super::block::BlockQ8K;
use super::shared::{each_row, k4_scales_mins, many_blocks, value_d, value_dmin};
use super::types::Q8DotManyFn;
use crate::ggml_type::GgmlType;
use std::arch::x86_64::*;

/// Activation rows from which the multi-row kernels beat the single-row one here
/// (docs/BENCHMARKS.md).
const MIN_ROWS: usize = 3;

/// The multi-row AVX2 kernel of `ty` (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K), or None (no kernel for
/// `ty`, or the CPU lacks AVX2, FMA or F16C).
pub(super) fn many_fn(ty: GgmlType) -> Option<Q8DotManyFn> {
    if !super::avx2::detected() {
        return None;
    }
    // SAFETY: (for every kernel below) `many_fn` hands it out only after `detected()` found
    // its features on this CPU.
    macro_rules! wrap {
        ($ty:path, $b:literal, $prep:path, $rows:ident) => {
            many_kernel!(
                "avx2,fma,f16c",
                MIN_ROWS,
                super::avx2::dot_fn,
                $ty,
                $b,
                $prep,
                $rows
            )
        };
    }
    Some(match ty {
        GgmlType::Q2_K => wrap!(GgmlType::Q2_K, 84, q2_prep, q2_rows),
        GgmlType::Q3_K => wrap!(GgmlType::Q3_K, 110, q3_wide, wide_d),
        GgmlType::Q4_K => wrap!(GgmlType::Q4_K, 144, k4_prep::<144, 16, false>, wide_dmin),
        GgmlType::Q5_K => wrap!(GgmlType::Q5_K, 176, k4_prep::<176, 48, true>, wide_dmin),
        GgmlType::Q6_K => wrap!(GgmlType::Q6_K, 210, q6_prep, wide_d),
        _ => return None,
    })
}

/// A multi-row kernel as a [`Q8DotManyFn`]: [`dot_many`] over weight blocks of `$b` bytes,
/// unpacked by `$prep`, with per-row values `$rows` (for four rows and for one), compiled with
/// the target features `$features`; fewer than `$min` activation rows go row by row to the
/// single-row kernel `$single($ty)`. The caller hands it out only where the CPU has `$features`.
macro_rules! many_kernel {
    ($features:literal, $min:expr, $single:expr, $ty:path, $b:literal, $prep:path, $rows:ident) => {{
        #[target_feature(enable = $features)]
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
            if y.len() < $min {
                return match $single($ty) {
                    Some(dot) => each_row(dot, $b, row, x, y),
                    None => y.fill(f32::NAN),
                };
            }
            // SAFETY: reachable only where the CPU has `$features` (the macro's contract).
            unsafe { kernel(row, x, y) }
        }
        w as Q8DotManyFn
    }};
}
pub(super) use many_kernel;

/// Activation rows per group.
const R: usize = 4;

/// The block loop of every multi-row kernel: checks the lengths ([`many_blocks`]: NaN in every
/// `y[j]` otherwise), then for each weight block in order unpacks it once (`prep`) and adds its
/// value for every activation row `j` (block `b` of row `j` is `x[j·nb + b]`) into `y[j]`,
/// which starts at `+0.0` — the single-row kernels' order. Rows go four at a time (`four`), the
/// last `n mod 4` one at a time (`one`).
#[inline(always)]
pub(super) fn dot_many<const B: usize, P>(
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
/// (Loops, not `array::map`: a closure of intrinsics handed to a function compiled without
/// these features is not inlined, which cost the AVX2 prefill a third of its speed.)
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn reduce<const N: usize>(s: [__m256i; N], m: [__m256i; N]) -> ([i32; N], [i32; N]) {
    let (mut si, mut mi) = ([0i32; N], [0i32; N]);
    if N == 4 {
        let mut v8 = [_mm256_setzero_si256(); 8];
        v8[..N].copy_from_slice(&s);
        v8[4..4 + N].copy_from_slice(&m);
        let v = hsum8(v8);
        si.copy_from_slice(&v[..N]);
        mi.copy_from_slice(&v[4..4 + N]);
    } else {
        for r in 0..N {
            si[r] = hsum(s[r]);
            mi[r] = hsum(m[r]);
        }
    }
    (si, mi)
}

/// `init + Σ_{k<8} step_k` as eight i32 lanes, `acc ← step(acc, k)` in four independent chains
/// (`k mod 4`; the i32 sums are exact in any order), added as `(c0 + c1) + (c2 + c3)`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn chains8(init: __m256i, mut step: impl FnMut(__m256i, usize) -> __m256i) -> __m256i {
    let zero = _mm256_setzero_si256();
    let mut acc = [init, zero, zero, zero];
    for k in 0..8 {
        acc[k % 4] = step(acc[k % 4], k);
    }
    sum4(acc)
}

/// One unpacked block: codes (u8), the i16 scales of each 32 codes, the i16 multipliers of the
/// block sums, `d` and `dmin` (Q4_K, Q5_K).
pub(super) struct Wide {
    pub(super) q: [__m256i; 8],
    pub(super) sc: [__m256i; 8],
    pub(super) sums: __m256i,
    pub(super) d: f32,
    pub(super) dmin: f32,
}

/// `Σ_k madd(maddubs(q_k, x_k), sc_k)` added to `init`, as eight i32 lanes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn madd_chains(init: __m256i, p: &Wide, y: &BlockQ8K) -> __m256i {
    chains8(init, |acc, k| {
        let pairs = _mm256_maddubs_epi16(p.q[k], x32(y, k));
        _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, p.sc[k]))
    })
}

/// Per activation row `r`: `value_dmin(xs[r].d, d, dmin, S, M)` with `S` the lane sum of `s[r]`
/// and `M` that of `madd(mins, bsums)` (Q2_K, Q4_K, Q5_K).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn rows_dmin<const N: usize>(
    xs: [&BlockQ8K; N],
    s: [__m256i; N],
    mins: __m256i,
    d: f32,
    dmin: f32,
) -> [f32; N] {
    let mut m = [_mm256_setzero_si256(); N];
    for r in 0..N {
        m[r] = _mm256_madd_epi16(mins, bsums(xs[r]));
    }
    let (s, m) = reduce(s, m);
    let mut out = [0f32; N];
    for r in 0..N {
        out[r] = value_dmin(xs[r].d, d, dmin, s[r], m[r]);
    }
    out
}

/// Per activation row `r`: `value_d(xs[r].d, d, S)` with `S` the lane sum of `s[r]` (Q3_K, Q6_K).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn rows_d<const N: usize>(xs: [&BlockQ8K; N], s: [__m256i; N], d: f32) -> [f32; N] {
    let (s, _) = reduce(s, [_mm256_setzero_si256(); N]);
    let mut out = [0f32; N];
    for r in 0..N {
        out[r] = value_d(xs[r].d, d, s[r]);
    }
    out
}

/// [`rows_dmin`] of an unpacked block whose `sums` are its mins (Q4_K, Q5_K).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn wide_dmin<const N: usize>(p: &Wide, xs: [&BlockQ8K; N]) -> [f32; N] {
    let mut s = [_mm256_setzero_si256(); N];
    for r in 0..N {
        s[r] = madd_chains(_mm256_setzero_si256(), p, xs[r]);
    }
    rows_dmin(xs, s, p.sums, p.d, p.dmin)
}

/// [`rows_d`] of an unpacked block whose `sums` multiply the block sums into `S` (Q3_K, Q6_K).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn wide_d<const N: usize>(p: &Wide, xs: [&BlockQ8K; N]) -> [f32; N] {
    let mut s = [_mm256_setzero_si256(); N];
    for r in 0..N {
        s[r] = madd_chains(_mm256_madd_epi16(bsums(xs[r]), p.sums), p, xs[r]);
    }
    rows_d(xs, s, p.d)
}

/// One unpacked Q2_K block: the effective weights `q·sc`, the 16 mins as i16, `d`, `dmin`.
pub(super) struct Q2 {
    pub(super) w: [__m256i; 8],
    pub(super) mins: __m256i,
    pub(super) d: f32,
    pub(super) dmin: f32,
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn q2_prep(b: &[u8; 84]) -> Q2 {
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

/// Per activation row: `S = Σ_k madd(maddubs(w_k, x_k), 1)` of the effective weights
/// (|pair| ≤ 2·45·127 < 2^15), `M` of the mins.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn q2_rows<const N: usize>(p: &Q2, xs: [&BlockQ8K; N]) -> [f32; N] {
    let ones = _mm256_set1_epi16(1);
    let mut s = [_mm256_setzero_si256(); N];
    for r in 0..N {
        s[r] = chains8(_mm256_setzero_si256(), |acc, k| {
            let pairs = _mm256_maddubs_epi16(p.w[k], x32(xs[r], k));
            _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, ones))
        });
    }
    rows_dmin(xs, s, p.mins, p.d, p.dmin)
}

/// Q3_K: the codes `q3` (0..=7), the scales `sc − 32`, and `−4·(sc − 32)` for the block sums.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn q3_wide(b: &[u8; 110]) -> Wide {
    let scales = q3k_scales(b);
    let halves = scale_halves_i16(scales);
    let mut q = [_mm256_setzero_si256(); 8];
    let mut sc = [_mm256_setzero_si256(); 8];
    for (n, half) in halves.into_iter().enumerate() {
        for (j, c) in q3k_codes(b, n).into_iter().enumerate() {
            q[4 * n + j] = c;
            sc[4 * n + j] = scale_pair_i16(half, j);
        }
    }
    Wide {
        q,
        sc,
        sums: _mm256_mullo_epi16(scales, _mm256_set1_epi16(-4)),
        d: f16_at(b, 108),
        dmin: 0.0,
    }
}

/// Q6_K: the codes (0..=63), the scales, and `−32·sc` for the block sums.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn q6_prep(b: &[u8; 210]) -> Wide {
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

/// Q4_K and Q5_K: the layout of `avx2::k4_codes`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn k4_prep<const B: usize, const QS: usize, const FIVE: bool>(b: &[u8; B]) -> Wide {
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
