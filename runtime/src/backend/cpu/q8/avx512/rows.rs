//! Decode kernels (AVX-512, 512-bit vectors): many Q2_K, Q3_K or Q6_K weight rows against the
//! Q8_K planes of one token (`q8`: one plane; `q8x2`: value and residual), with the integer sums
//! and f32 expressions of the scalar kernels, so that every row gets the bits of
//! [`super::super::q8_dot_fn`] summed over the planes in plane order.
//!
//! Algorithm. A group of `R = 8 / P` weight rows (`P` the planes) is walked block by block, so
//! that each weight block is unpacked once for all planes and the group's sums are reduced
//! together rather than block by block and row by row:
//!
//! 1. The activation codes of block `b` are loaded once per group, per plane four `__m512i`:
//!    vector `j` is `qs[32j .. 32j + 32]` then `qs[128 + 32j .. 128 + 32j + 32]`, the element
//!    order in which Q2_K and Q3_K store the 2-bit codes of one 64-byte run (bits `2j .. 2j + 2`
//!    of byte `l` are element `32j + l`, of byte `32 + l` element `128 + 32j + l`). So each
//!    128-bit lane of vector `j` is one 16-element sub-block: `2j`, `2j + 1`, `8 + 2j`, `9 + 2j`.
//! 2. Each row's block is unpacked once (shift and mask per `j`) and dotted with every plane:
//!    * Q2_K: codes times the lane's 4-bit scale (`_mm512_mullo_epi16` by the scale as an i16:
//!      `q·sc ≤ 45`, no carry between the bytes), then `vpdpbusd` per plane; the mins
//!      `M = Σ_j m_j·bsum_j` by one `madd` per plane.
//!    * Q3_K: codes `q3 = q + 4·hbit` (0..=7), `maddubs` per plane (|pair| ≤ 2·7·127) and
//!      `vpdpwssd` by the lane's signed scale `sc − 32`; the `− 4` is `− 4·Σ_j s_j·bsum_j`, one
//!      `madd` per plane that starts the accumulator.
//!    * Q6_K: the same with the 6-bit codes (|pair| ≤ 2·63·127), the signed 8-bit scales and
//!      `− 32·Σ_j sc_j·bsum_j`; its `ql` and `qh` bytes hold Q2_K's element order per
//!      128-element half (vector `j` from two 32-byte runs of `ql` and the 64 `qh` bytes).
//! 3. The group's eight exact i32 sums (`R` rows × `P` planes; Q2_K also its eight mins) are
//!    reduced by one transpose-and-add tree into the i32 lanes `r·P + p`, converted to f32
//!    (round to nearest) and turned into the block's value by the scalar f32 expression
//!    lane-wise (`mul`/`sub` in the same order, no FMA): `d8·(d·S − dmin·M)` (Q2_K), `d8·(d·S)`
//!    (Q3_K, Q6_K); each lane adds it into its f32 accumulator, blocks in order from `+0.0`.
//!    Row `r`'s result is its plane accumulators added in plane order.
//!
//! While a group is computed, the next group's bytes are prefetched in address order, one
//! block's share per block step (a group's rows are `R` strided streams, which the hardware
//! prefetchers follow badly): into L1 when two groups fit it, else into L2 (the Q6_K head's
//! 27 KiB groups). Rows that do not fill a group go one at a time through the same code (`R = 1`).

#![allow(non_snake_case)] // the kernels keep ggml's type names (q2_K)

use super::avx2::{bsums, load16, load32, sum_lanes8};
// The group kernels keep their own block loop: `avx2_rows::group_blocks` is compiled for AVX2,
// so a closure of AVX-512 intrinsics handed to it is not inlined (decode measured 13 % slower).
use super::avx2_rows::{
    f16_bits, finish, lanes, load8, prefetch_share, rows_kernel, rows_loop, values_d, values_dmin,
    widen,
};
use super::vnni::detected;
use super::{q3_k_raw_scales, row_blocks, BlockQ8K, Q8RowsFn};
use crate::ggml_type::GgmlType;
use std::arch::x86_64::*;

/// The AVX-512 decode kernel of `ty` (Q2_K, Q3_K, Q6_K), or None (no kernel for `ty`, or the CPU
/// lacks a feature of `vnni::detected`).
pub(crate) fn rows_fn(ty: GgmlType) -> Option<Q8RowsFn> {
    if !detected() {
        return None;
    }
    Some(match ty {
        GgmlType::Q2_K => rows_kernel!(
            "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni",
            84,
            q2_group,
            after_lanes::<84>
        ),
        GgmlType::Q3_K => rows_kernel!(
            "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni",
            110,
            q3_group,
            after_lanes::<110>
        ),
        GgmlType::Q6_K => rows_kernel!(
            "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni",
            210,
            q6_group
        ),
        _ => return None,
    })
}

/// Whole groups of 16 rows at two planes by `lanes.rs` (Q2_K, `B` = 84, or Q3_K, `B` = 110):
/// the rows it left (weights and outputs) for this module's groups, or None when none are left.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn after_lanes<'a, const B: usize>(
    w: &'a [u8],
    x: &[BlockQ8K],
    planes: usize,
    y: &'a mut [f32],
) -> Option<(&'a [u8], &'a mut [f32])> {
    // SAFETY: this function's features are those `lanes` requires.
    let done = unsafe { super::lanes::two_planes::<B>(w, x, planes, y) };
    if done == y.len() {
        return None;
    }
    let rb = w.len() / y.len();
    Some((&w[done * rb..], &mut y[done..]))
}

/// Q3_K, `R` rows × `P` planes.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn q3_group<const R: usize, const P: usize>(
    w: &[u8],
    rb: usize,
    x: &[BlockQ8K],
    nb: usize,
    ahead: &[u8],
) -> [f32; R] {
    signed_group::<110, R, P>(w, rb, x, nb, ahead)
}

/// Q6_K, `R` rows × `P` planes.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn q6_group<const R: usize, const P: usize>(
    w: &[u8],
    rb: usize,
    x: &[BlockQ8K],
    nb: usize,
    ahead: &[u8],
) -> [f32; R] {
    signed_group::<210, R, P>(w, rb, x, nb, ahead)
}

/// Vector `j` (< 4) of step 1: `qs[32j .. 32j + 32]` then `qs[128 + 32j .. 128 + 32j + 32]`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn x64(y: &BlockQ8K, j: usize) -> __m512i {
    let lo = load32_i8(&y.qs[32 * j..32 * j + 32]);
    let hi = load32_i8(&y.qs[128 + 32 * j..128 + 32 * j + 32]);
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
}

/// The 32 codes of `s` as a vector.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn load32_i8(s: &[i8]) -> __m256i {
    let s = &s[..32];
    // SAFETY: `s` has exactly 32 readable bytes; loadu needs no alignment.
    unsafe { _mm256_loadu_si256(s.as_ptr().cast()) }
}

/// The 64 bytes of `s` as a vector.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn load64(s: &[u8]) -> __m512i {
    let s = &s[..64];
    // SAFETY: `s` has exactly 64 readable bytes; loadu needs no alignment.
    unsafe { _mm512_loadu_si512(s.as_ptr().cast()) }
}

/// The 2-bit codes of vector `j` (step 1's order) from the 64 code bytes `q`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn crumbs(q: __m512i, j: usize) -> __m512i {
    let s = match j {
        0 => q,
        1 => _mm512_srli_epi16::<2>(q),
        2 => _mm512_srli_epi16::<4>(q),
        _ => _mm512_srli_epi16::<6>(q),
    };
    _mm512_and_si512(s, _mm512_set1_epi8(3))
}

/// The sub-block of 128-bit lane `l` of vector `j` (step 1).
const fn sub_block(j: usize, l: usize) -> usize {
    [2 * j, 2 * j + 1, 8 + 2 * j, 9 + 2 * j][l]
}

/// Per vector `j`: `base | sub_block(j, l)` in every i16 of lane `l`.
const fn by_sub_block(base: u16) -> [[u16; 32]; 4] {
    let mut t = [[0u16; 32]; 4];
    let mut j = 0;
    while j < 4 {
        let mut i = 0;
        while i < 32 {
            t[j][i] = base | sub_block(j, i / 8) as u16;
            i += 1;
        }
        j += 1;
    }
    t
}

/// Per vector `j`: the `vpshufb` indices that put byte `sub_block(j, l)` of a 16-byte lane into
/// the low byte of each i16 of lane `l` and zero its high byte (index bit 7).
static Q2_SCALE_PICK: [[u16; 32]; 4] = by_sub_block(0x8000);

/// Per vector `j`: the `vpermw` indices that put i16 `sub_block(j, l)` in every i16 of lane `l`.
static SCALE_PICK16: [[u16; 32]; 4] = by_sub_block(0);

/// Per vector `j`: the Q3_K high-bit mask bit of its two halves, `1 << j` in bytes 0..32 and
/// `1 << (4 + j)` in bytes 32..64 (groups `j` and `4 + j` of the 32-byte `hmask`).
static Q3_HIGH_BIT: [[u8; 64]; 4] = {
    let mut t = [[0u8; 64]; 4];
    let mut j = 0;
    while j < 4 {
        let mut i = 0;
        while i < 64 {
            t[j][i] = if i < 32 { 1 << j } else { 1 << (4 + j) };
            i += 1;
        }
        j += 1;
    }
    t
};

/// The 32 i16 of `t` as a vector.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn table16(t: &[u16; 32]) -> __m512i {
    // SAFETY: `t` is 32 u16 = 64 readable bytes; loadu needs no alignment.
    unsafe { _mm512_loadu_si512(t.as_ptr().cast()) }
}

/// The 16 i32 lanes of `v` added pairwise into 8 (low half + high half; exact).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn fold(v: __m512i) -> __m256i {
    _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64::<1>(v))
}

/// Q2_K, `R` rows × `P` planes (`R·P ≤ 8`).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn q2_group<const R: usize, const P: usize>(
    w: &[u8],
    rb: usize,
    x: &[BlockQ8K],
    nb: usize,
    ahead: &[u8],
) -> [f32; R] {
    let rows = row_blocks::<84, R>(w, rb, nb);
    let planes: [&[BlockQ8K]; P] = std::array::from_fn(|p| &x[p * nb..(p + 1) * nb]);
    let pick: [__m512i; 4] = std::array::from_fn(|j| table16(&Q2_SCALE_PICK[j]));
    let m4 = _mm_set1_epi8(0x0f);
    let mut acc = _mm256_setzero_ps();
    for b in 0..nb {
        prefetch_share(ahead, b, R * 84);
        let ys: [&BlockQ8K; P] = planes.map(|p| &p[b]);
        let xv: [[__m512i; 4]; P] = ys.map(|y| std::array::from_fn(|j| x64(y, j)));
        let bs: [__m256i; P] = ys.map(|y| bsums(y));
        let mut s = [_mm256_setzero_si256(); 8];
        let mut m = [_mm256_setzero_si256(); 8];
        for r in 0..R {
            let blk = &rows[r][b];
            let raw = load16(&blk[0..16]);
            let scales = _mm512_broadcast_i32x4(_mm_and_si128(raw, m4));
            let mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(raw), m4));
            let q = load64(&blk[16..80]);
            let mut acc_p = [_mm512_setzero_si512(); P];
            for j in 0..4 {
                let wj = _mm512_mullo_epi16(crumbs(q, j), _mm512_shuffle_epi8(scales, pick[j]));
                for p in 0..P {
                    acc_p[p] = _mm512_dpbusd_epi32(acc_p[p], wj, xv[p][j]);
                }
            }
            for p in 0..P {
                s[r * P + p] = fold(acc_p[p]);
                m[r * P + p] = _mm256_madd_epi16(mins, bs[p]);
            }
        }
        let d8 = load8(lanes::<R, P, f32>(|_, p| ys[p].d));
        let d = widen(lanes::<R, P, u16>(|r, _| f16_bits(&rows[r][b], 80)));
        let dmin = widen(lanes::<R, P, u16>(|r, _| f16_bits(&rows[r][b], 82)));
        let value = values_dmin(d8, d, dmin, sum_lanes8(s), sum_lanes8(m));
        acc = _mm256_add_ps(acc, value);
    }
    finish::<R, P>(acc)
}

/// One Q3_K or Q6_K block unpacked for [`signed_group`]: the codes of the four vectors of step
/// 1 (u8), the 16 signed sub-block scales (i16), the i16 multipliers of the block sums that
/// start the accumulator, and the f16 `d` at byte `d_at`.
struct Signed {
    codes: [__m512i; 4],
    scales: __m256i,
    offset: __m256i,
}

/// Q3_K: codes `q3 = q + 4·hbit` (0..=7), scales `sc − 32`, offset `−4·s` (the `− 4` of
/// `q3 − 4`).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn q3_unpack(blk: &[u8]) -> Signed {
    let raw = q3_k_raw_scales(&blk[96..108]);
    let scales = _mm256_cvtepi8_epi16(_mm_sub_epi8(load16(&raw), _mm_set1_epi8(32)));
    let hmask = _mm512_broadcast_i64x4(load32(&blk[0..32]));
    let q = load64(&blk[32..96]);
    let codes = std::array::from_fn(|j| {
        let c = crumbs(q, j);
        let hbit = _mm512_test_epi8_mask(hmask, load64(&Q3_HIGH_BIT[j]));
        _mm512_mask_add_epi8(c, hbit, c, _mm512_set1_epi8(4))
    });
    Signed {
        codes,
        scales,
        offset: _mm256_mullo_epi16(scales, _mm256_set1_epi16(-4)),
    }
}

/// Q6_K: codes `q` (0..=63: the low four bits from `ql`, the high two from `qh`), scales `sc`
/// (i8), offset `−32·sc` (the `− 32` of `q − 32`). Vector `j` of step 1 takes `ql` bytes `32·(j
/// mod 2)` of each half (low nibbles for `j < 2`, high for `j ≥ 2`) and bits `2j .. 2j + 2` of
/// that half's 32 `qh` bytes (ggml's `block_q6_K` order, as `avx2::q6k_codes`).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn q6_unpack(blk: &[u8]) -> Signed {
    let halves = |at: usize| {
        _mm512_inserti64x4::<1>(
            _mm512_castsi256_si512(load32(&blk[at..])),
            load32(&blk[64 + at..]),
        )
    };
    let (ql0, ql1) = (halves(0), halves(32));
    let qh = load64(&blk[128..192]);
    let (m4, m30) = (_mm512_set1_epi8(0x0f), _mm512_set1_epi8(0x30));
    let high = [
        _mm512_slli_epi16::<4>(qh),
        _mm512_slli_epi16::<2>(qh),
        qh,
        _mm512_srli_epi16::<2>(qh),
    ];
    let low = [
        ql0,
        ql1,
        _mm512_srli_epi16::<4>(ql0),
        _mm512_srli_epi16::<4>(ql1),
    ];
    let codes = std::array::from_fn(|j| {
        _mm512_or_si512(_mm512_and_si512(low[j], m4), _mm512_and_si512(high[j], m30))
    });
    let scales = _mm256_cvtepi8_epi16(load16(&blk[192..208]));
    Signed {
        codes,
        scales,
        offset: _mm256_mullo_epi16(scales, _mm256_set1_epi16(-32)),
    }
}

/// Q3_K (`B` = 110) or Q6_K (`B` = 210), `R` rows × `P` planes (`R·P ≤ 8`): per row and plane
/// `S = Σ_j s_j·Σ_16 c·x8 + Σ_j offset_j·bsum_j` (`maddubs`: |pair| ≤ 2·63·127; `vpdpwssd` by
/// the lane's scale), then `d8·(d·S)` as `value_d`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn signed_group<const B: usize, const R: usize, const P: usize>(
    w: &[u8],
    rb: usize,
    x: &[BlockQ8K],
    nb: usize,
    ahead: &[u8],
) -> [f32; R] {
    let rows = row_blocks::<B, R>(w, rb, nb);
    let planes: [&[BlockQ8K]; P] = std::array::from_fn(|p| &x[p * nb..(p + 1) * nb]);
    let pick: [__m512i; 4] = std::array::from_fn(|j| table16(&SCALE_PICK16[j]));
    let mut acc = _mm256_setzero_ps();
    for b in 0..nb {
        prefetch_share(ahead, b, R * B);
        let ys: [&BlockQ8K; P] = planes.map(|p| &p[b]);
        let xv: [[__m512i; 4]; P] = ys.map(|y| std::array::from_fn(|j| x64(y, j)));
        let bs: [__m256i; P] = ys.map(|y| bsums(y));
        let mut s = [_mm256_setzero_si256(); 8];
        for r in 0..R {
            let u = if B == 210 {
                q6_unpack(&rows[r][b])
            } else {
                q3_unpack(&rows[r][b])
            };
            let scales = _mm512_zextsi256_si512(u.scales);
            let mut acc_p: [__m512i; P] =
                bs.map(|v| _mm512_zextsi256_si512(_mm256_madd_epi16(v, u.offset)));
            for j in 0..4 {
                let sj = _mm512_permutexvar_epi16(pick[j], scales);
                for p in 0..P {
                    let pairs = _mm512_maddubs_epi16(u.codes[j], xv[p][j]);
                    acc_p[p] = _mm512_dpwssd_epi32(acc_p[p], pairs, sj);
                }
            }
            for p in 0..P {
                s[r * P + p] = fold(acc_p[p]);
            }
        }
        let d8 = load8(lanes::<R, P, f32>(|_, p| ys[p].d));
        let d = widen(lanes::<R, P, u16>(|r, _| f16_bits(&rows[r][b], B - 2)));
        acc = _mm256_add_ps(acc, values_d(d8, d, sum_lanes8(s)));
    }
    finish::<R, P>(acc)
}
