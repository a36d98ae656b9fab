//! AVX2 kernels: the integer sums of the module doc's table with 256-bit integer arithmetic,
//! then the same f32 helpers as the scalar kernels (so the two agree bit for bit).
//!
//! Algorithm. 32 weight codes are unpacked into the 32 bytes of a `__m256i` (shifts and masks;
//! Q6_K's two high bits are moved into place with 16-bit shifts and the mask `0x30`), so that
//! lane `i` holds the code of element `32k + i`, matching the 32 activation codes `qs[32k..]`.
//! `_mm256_maddubs_epi16(codes u8, x8 i8)` multiplies and adds neighbour pairs into 16 i16 (no
//! saturation: |pair| ≤ 2·128·127 = 32512 < 2^15, Q8_0's |q| ≤ 128 being the largest code), and
//! `_mm256_madd_epi16(pairs, scales)` multiplies each 8-pair half by its sub-block scale and
//! widens to i32 (lanes 0..8 hold elements 0..16 of the 32, lanes 8..16 elements 16..32, so a
//! 16-element sub-block is one 128-bit half). Signed codes are made unsigned first and their
//! offset is subtracted with the activation block sums (Q6_K: `Σ (q − 32)·x = Σ q·x −
//! 32·bsum`), or handled by a second `maddubs` (Q3_K's `− 4·!hbit`), or by moving the sign onto
//! the activations (`_mm256_sign_epi8`, Q8_0 and the IQ2 grids, whose ±1 sign bytes come from
//! a table built at compile time from `KSIGNS_IQ2XS`). The i32 lanes are summed once per block;
//! the f16 block scales are widened with F16C (exact, like `half`). Every load is from a
//! bounds-checked slice or a fixed-size array. Idioms follow llama.cpp's
//! `ggml-cpu/arch/x86/quants.c`; the code is our own.

#![allow(non_snake_case)] // the kernels keep ggml's type names (q2_K)

use super::block::BlockQ8K;
use super::shared::{
    dot_blocks, k4_scales_mins, q3_k_raw_scales, value_d, value_dmin, value_iq2, value_legacy,
};
use super::types::Q8DotFn;
use crate::ggml_type::GgmlType;
use aubier_kernels_gen::quant_grids::{IQ2XS_GRID, IQ2XXS_GRID, KSIGNS_IQ2XS};
use std::arch::x86_64::*;

/// Whether the CPU has AVX2, FMA and F16C (F16C, for the f16 block scales, is on every AVX2
/// CPU).
pub(super) fn detected() -> bool {
    crate::isa::isa().avx2
}

/// The AVX2 kernel of `ty`, or None when `ty` has none or the CPU lacks the features of
/// [`detected`].
pub(super) fn dot_fn(ty: GgmlType) -> Option<Q8DotFn> {
    if !detected() {
        return None;
    }
    // SAFETY: (for every wrapper below) the wrappers call `#[target_feature(enable =
    // "avx2,fma,f16c")]` functions; they are only handed out here, after the features were
    // detected.
    macro_rules! wrap {
        ($f:ident) => {{
            fn w(row: &[u8], x: &[BlockQ8K]) -> f32 {
                // SAFETY: see above — reachable only after AVX2, FMA and F16C were detected.
                unsafe { $f(row, x) }
            }
            w as Q8DotFn
        }};
    }
    Some(match ty {
        GgmlType::Q2_K => wrap!(q2_K),
        GgmlType::Q3_K => wrap!(q3_K),
        GgmlType::Q4_K => wrap!(q4_K),
        GgmlType::Q5_K => wrap!(q5_K),
        GgmlType::Q6_K => wrap!(q6_K),
        GgmlType::IQ2_XXS => wrap!(iq2_xxs),
        GgmlType::IQ2_XS => wrap!(iq2_xs),
        GgmlType::Q4_0 => wrap!(q4_0),
        GgmlType::Q8_0 => wrap!(q8_0),
        _ => return None,
    })
}

/// The first 32 bytes of `s` (bounds-checked slice, then an unaligned load).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn load32(s: &[u8]) -> __m256i {
    let s = &s[..32];
    // SAFETY: `s` has exactly 32 readable bytes; loadu needs no alignment.
    unsafe { _mm256_loadu_si256(s.as_ptr().cast()) }
}

/// The first 16 bytes of `s`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn load16(s: &[u8]) -> __m128i {
    let s = &s[..16];
    // SAFETY: `s` has exactly 16 readable bytes; loadu needs no alignment.
    unsafe { _mm_loadu_si128(s.as_ptr().cast()) }
}

/// Activation codes `qs[32k .. 32k + 32]`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn x32(y: &BlockQ8K, k: usize) -> __m256i {
    let s = &y.qs[32 * k..32 * k + 32];
    // SAFETY: `s` has exactly 32 readable bytes; loadu needs no alignment.
    unsafe { _mm256_loadu_si256(s.as_ptr().cast()) }
}

/// The 16 block sums as i16 lanes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn bsums(y: &BlockQ8K) -> __m256i {
    // SAFETY: `bsums` is 16 i16 = 32 readable bytes; loadu needs no alignment.
    unsafe { _mm256_loadu_si256(y.bsums.as_ptr().cast()) }
}

/// Sum of the eight i32 lanes (exact: wrapping adds of values whose total fits i32).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn hsum(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}

/// The f16 at bytes `at .. at + 2` of `b`, widened to f32 (exact, as `gguf::quant::f16_at`).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn f16_at(b: &[u8], at: usize) -> f32 {
    let bits = u16::from_le_bytes([b[at], b[at + 1]]);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
}

/// i16 lanes `[s[i] ×8 | s[i + 1] ×8]`, the scales of the two 16-element halves of 32 codes
/// at sub-blocks `i`, `i + 1`, from `bytes`: 16 unsigned scale bytes in both 128-bit lanes.
/// One in-lane byte shuffle: the scale lands in the low byte of each i16, the high byte is
/// zeroed (index bit 7).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn scale_pair_u8(bytes: __m256i, i: usize) -> __m256i {
    let word = |idx: usize| (0x8000 | idx) as i16;
    let pick = _mm256_set_m128i(_mm_set1_epi16(word(i + 1)), _mm_set1_epi16(word(i)));
    _mm256_shuffle_epi8(bytes, pick)
}

/// The 16 signed sub-block scales `s` as i16 lanes (`[s0..s8 | s8..s16]`, sign-extended
/// once), split into the two 128-bit halves, each copied to both lanes: the operands of
/// [`scale_pair_i16`]. (For signed scales this beats a byte shuffle plus a shift per use.)
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn scale_halves_i16(s: __m256i) -> [__m256i; 2] {
    [
        _mm256_permute4x64_epi64::<0x44>(s),
        _mm256_permute4x64_epi64::<0xee>(s),
    ]
}

/// i16 lanes `[s[8n + 2j] ×8 | s[8n + 2j + 1] ×8]` from half `n` of [`scale_halves_i16`].
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn scale_pair_i16(half: __m256i, j: usize) -> __m256i {
    let word = |i: usize| (((2 * i + 1) << 8) | (2 * i)) as i16;
    let pick = _mm256_set_m128i(_mm_set1_epi16(word(2 * j + 1)), _mm_set1_epi16(word(2 * j)));
    _mm256_shuffle_epi8(half, pick)
}

/// `(a0 + a1) + (a2 + a3)` of four i32 accumulators.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn sum4(a: [__m256i; 4]) -> __m256i {
    _mm256_add_epi32(_mm256_add_epi32(a[0], a[1]), _mm256_add_epi32(a[2], a[3]))
}

/// `madd(maddubs(q, x), scales)`: eight i32 lanes of scaled pair products.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn dot32(q: __m256i, x: __m256i, scales: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(q, x), scales)
}

/// The four 2-bit planes of 32 code bytes `q`: plane `j` holds bits `2j .. 2j + 2` of each
/// byte (Q2_K and Q3_K low bits: plane `j` of the 32 bytes at `32n` is group `4n + j`).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn planes2(q: __m256i) -> [__m256i; 4] {
    let m3 = _mm256_set1_epi8(3);
    [
        _mm256_and_si256(q, m3),
        _mm256_and_si256(_mm256_srli_epi16::<2>(q), m3),
        _mm256_and_si256(_mm256_srli_epi16::<4>(q), m3),
        _mm256_and_si256(_mm256_srli_epi16::<6>(q), m3),
    ]
}

/// Q2_K: the 16 scales (low nibbles of bytes 0..16) as bytes in both 128-bit lanes (the
/// operand of [`scale_pair_u8`]), and the 16 mins (high nibbles) as i16 lanes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn q2k_scales_mins(b: &[u8; 84]) -> (__m256i, __m256i) {
    let raw = load16(&b[0..16]);
    let m4 = _mm_set1_epi8(0x0f);
    let scales = _mm256_broadcastsi128_si256(_mm_and_si128(raw, m4));
    let mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(raw), m4));
    (scales, mins)
}

/// Q3_K: the 16 signed sub-block scales `sc − 32` as i16 lanes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn q3k_scales(b: &[u8; 110]) -> __m256i {
    let raw = q3_k_raw_scales(&b[96..108]);
    _mm256_cvtepi8_epi16(_mm_sub_epi8(load16(&raw), _mm_set1_epi8(32)))
}

/// Q3_K: 0xff in the bytes of 32-element group `k` (< 8) whose high bit (bit `k` of
/// `hmask[l]`, `hmask` = bytes 0..32) is set, 0 elsewhere.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn q3k_high(hmask: __m256i, k: usize) -> __m256i {
    let bit = _mm256_set1_epi8((1u8 << k) as i8);
    _mm256_cmpeq_epi8(_mm256_and_si256(hmask, bit), bit)
}

/// Q3_K codes `q3 = q + 4·hbit` (0..=7) of groups `4n .. 4n + 4`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn q3k_codes(b: &[u8; 110], n: usize) -> [__m256i; 4] {
    let hmask = load32(&b[0..32]);
    let four = _mm256_set1_epi8(4);
    let mut planes = planes2(load32(&b[32 + 32 * n..]));
    for (j, p) in planes.iter_mut().enumerate() {
        *p = _mm256_or_si256(*p, _mm256_and_si256(q3k_high(hmask, 4 * n + j), four));
    }
    planes
}

/// Q4_K/Q5_K: the eight mins `mn` as i16 lanes, each repeated for its two 16-sums.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn k4_mins(mn: [u8; 8]) -> __m256i {
    let mins = _mm_shuffle_epi8(
        _mm_set1_epi64x(i64::from_le_bytes(mn)),
        _mm_set_epi64x(0x0707_0606_0505_0404, 0x0303_0202_0101_0000),
    );
    _mm256_cvtepu8_epi16(mins)
}

/// Q4_K and Q5_K codes (0..=15 resp. 0..=31) of groups `2r` and `2r + 1`: `qs` at `QS`, the
/// fifth bits (Q5_K, bits `2r` and `2r + 1`) in `qh[32]` at 16.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn k4_codes<const B: usize, const QS: usize, const FIVE: bool>(
    b: &[u8; B],
    r: usize,
) -> [__m256i; 2] {
    let m4 = _mm256_set1_epi8(0x0f);
    let q = load32(&b[QS + 32 * r..]);
    let lo = _mm256_and_si256(q, m4);
    let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4);
    if !FIVE {
        return [lo, hi];
    }
    let qh = load32(&b[16..48]);
    let sixteen = _mm256_set1_epi8(16);
    let fifth = |bit: u8| {
        let bit = _mm256_set1_epi8((bit << (2 * r)) as i8);
        _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit), sixteen)
    };
    [_mm256_or_si256(lo, fifth(1)), _mm256_or_si256(hi, fifth(2))]
}

/// Q6_K codes (0..=63) of groups `4n .. 4n + 4`: low four bits from `ql` (bytes `64n ..
/// 64n + 64`), high two from `qh` (bytes `128 + 32n ..`, bits `2j .. 2j + 2` for group `j`).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn q6k_codes(b: &[u8; 210], n: usize) -> [__m256i; 4] {
    let (m4, m30) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi8(0x30));
    let ql0 = load32(&b[64 * n..]);
    let ql1 = load32(&b[64 * n + 32..]);
    let qh = load32(&b[128 + 32 * n..]);
    [
        _mm256_or_si256(
            _mm256_and_si256(ql0, m4),
            _mm256_and_si256(_mm256_slli_epi16::<4>(qh), m30),
        ),
        _mm256_or_si256(
            _mm256_and_si256(ql1, m4),
            _mm256_and_si256(_mm256_slli_epi16::<2>(qh), m30),
        ),
        _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), m4),
            _mm256_and_si256(qh, m30),
        ),
        _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m4),
            _mm256_and_si256(_mm256_srli_epi16::<2>(qh), m30),
        ),
    ]
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q2_K(row: &[u8], x: &[BlockQ8K]) -> f32 {
    dot_blocks::<84>(row, x, |b, y| {
        let (scale_bytes, mins) = q2k_scales_mins(b);
        let m = hsum(_mm256_madd_epi16(mins, bsums(y)));
        let mut acc = [_mm256_setzero_si256(); 4];
        for n in 0..2 {
            for (j, p) in planes2(load32(&b[16 + 32 * n..])).into_iter().enumerate() {
                let k = 4 * n + j;
                let d = dot32(p, x32(y, k), scale_pair_u8(scale_bytes, 2 * k));
                acc[j] = _mm256_add_epi32(acc[j], d);
            }
        }
        let s = hsum(sum4(acc));
        value_dmin(y.d, f16_at(b, 80), f16_at(b, 82), s, m)
    })
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q3_K(row: &[u8], x: &[BlockQ8K]) -> f32 {
    dot_blocks::<110>(row, x, |b, y| {
        let halves = scale_halves_i16(q3k_scales(b));
        let hmask = load32(&b[0..32]);
        let four = _mm256_set1_epi8(4);
        let mut acc = [_mm256_setzero_si256(); 4];
        for (n, half) in halves.into_iter().enumerate() {
            for (j, p) in planes2(load32(&b[32 + 32 * n..])).into_iter().enumerate() {
                let k = 4 * n + j;
                let minus4 = _mm256_andnot_si256(q3k_high(hmask, k), four);
                let xv = x32(y, k);
                let pairs = _mm256_sub_epi16(
                    _mm256_maddubs_epi16(p, xv),
                    _mm256_maddubs_epi16(minus4, xv),
                );
                let d = _mm256_madd_epi16(pairs, scale_pair_i16(half, j));
                acc[j] = _mm256_add_epi32(acc[j], d);
            }
        }
        let s = hsum(sum4(acc));
        value_d(y.d, f16_at(b, 108), s)
    })
}

/// Q4_K and Q5_K: the layout of [`k4_codes`].
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn k4_block<const B: usize, const QS: usize, const FIVE: bool>(b: &[u8; B], y: &BlockQ8K) -> f32 {
    let (sc, mn) = k4_scales_mins(&b[4..16]);
    // M = Σ_j m_j·(bsum_2j + bsum_2j+1).
    let m = hsum(_mm256_madd_epi16(k4_mins(mn), bsums(y)));
    let mut acc = [_mm256_setzero_si256(); 2];
    for r in 0..4 {
        let [lo, hi] = k4_codes::<B, QS, FIVE>(b, r);
        let d0 = dot32(lo, x32(y, 2 * r), _mm256_set1_epi16(i16::from(sc[2 * r])));
        let d1 = dot32(
            hi,
            x32(y, 2 * r + 1),
            _mm256_set1_epi16(i16::from(sc[2 * r + 1])),
        );
        acc[0] = _mm256_add_epi32(acc[0], d0);
        acc[1] = _mm256_add_epi32(acc[1], d1);
    }
    let s = hsum(_mm256_add_epi32(acc[0], acc[1]));
    value_dmin(y.d, f16_at(b, 0), f16_at(b, 2), s, m)
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q4_K(row: &[u8], x: &[BlockQ8K]) -> f32 {
    dot_blocks::<144>(row, x, |b, y| k4_block::<144, 16, false>(b, y))
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q5_K(row: &[u8], x: &[BlockQ8K]) -> f32 {
    dot_blocks::<176>(row, x, |b, y| k4_block::<176, 48, true>(b, y))
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q6_K(row: &[u8], x: &[BlockQ8K]) -> f32 {
    dot_blocks::<210>(row, x, |b, y| {
        let scales = _mm256_cvtepi8_epi16(load16(&b[192..208]));
        let halves = scale_halves_i16(scales);
        let mut acc = [_mm256_setzero_si256(); 4];
        for (n, half) in halves.into_iter().enumerate() {
            for (j, c) in q6k_codes(b, n).into_iter().enumerate() {
                let k = 4 * n + j;
                let d = dot32(c, x32(y, k), scale_pair_i16(half, j));
                acc[j] = _mm256_add_epi32(acc[j], d);
            }
        }
        let sum_qx = hsum(sum4(acc));
        let sum_x = hsum(_mm256_madd_epi16(scales, bsums(y)));
        value_d(y.d, f16_at(b, 208), sum_qx - 32 * sum_x)
    })
}

/// `KSIGNS_IQ2XS[i]` spread over eight bytes: byte `k` is −1 (0xff) where bit `k` is set,
/// +1 elsewhere — the operand of `_mm256_sign_epi8` for 8 activations.
static SIGN_BYTES: [u64; 128] = sign_bytes(&KSIGNS_IQ2XS);

const fn sign_bytes(ksigns: &[u8; 128]) -> [u64; 128] {
    let mut out = [0u64; 128];
    let mut i = 0;
    while i < 128 {
        let mut k = 0;
        while k < 8 {
            let byte: u64 = if ksigns[i] & (1 << k) != 0 {
                0xff
            } else {
                0x01
            };
            out[i] |= byte << (8 * k);
            k += 1;
        }
        i += 1;
    }
    out
}

/// `Σ` of scaled grid·sign·x8 products over one 32-element group: four grid rows (codes,
/// elements `8l .. 8l + 8`), four `KSIGNS_IQ2XS` indices, the activations, and the i16
/// scales of its two 16-element halves. |x8| ≤ 127, so the sign flip is exact.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn iq2_group(grid: [u64; 4], signs: [usize; 4], xv: __m256i, scales: __m256i) -> __m256i {
    let g = _mm256_set_epi64x(
        grid[3] as i64,
        grid[2] as i64,
        grid[1] as i64,
        grid[0] as i64,
    );
    let sb = signs.map(|i| SIGN_BYTES[i] as i64);
    let s = _mm256_set_epi64x(sb[3], sb[2], sb[1], sb[0]);
    dot32(g, _mm256_sign_epi8(xv, s), scales)
}

#[target_feature(enable = "avx2,fma,f16c")]
fn iq2_xxs(row: &[u8], x: &[BlockQ8K]) -> f32 {
    dot_blocks::<66>(row, x, |b, y| {
        let mut acc = _mm256_setzero_si256();
        for ib in 0..8 {
            let at = 2 + 8 * ib;
            let aux = u32::from_le_bytes([b[at + 4], b[at + 5], b[at + 6], b[at + 7]]);
            let grid = std::array::from_fn(|l| IQ2XXS_GRID[usize::from(b[at + l])]);
            let signs = std::array::from_fn(|l| ((aux >> (7 * l)) & 127) as usize);
            let scale = _mm256_set1_epi16((2 * (aux >> 28) + 1) as i16);
            acc = _mm256_add_epi32(acc, iq2_group(grid, signs, x32(y, ib), scale));
        }
        value_iq2(y.d, f16_at(b, 0), hsum(acc))
    })
}

#[target_feature(enable = "avx2,fma,f16c")]
fn iq2_xs(row: &[u8], x: &[BlockQ8K]) -> f32 {
    dot_blocks::<74>(row, x, |b, y| {
        let mut acc = _mm256_setzero_si256();
        for ib in 0..8 {
            let q: [u16; 4] = std::array::from_fn(|l| {
                let at = 2 + 2 * (4 * ib + l);
                u16::from_le_bytes([b[at], b[at + 1]])
            });
            let grid = q.map(|v| IQ2XS_GRID[usize::from(v & 511)]);
            let signs = q.map(|v| usize::from(v >> 9));
            let sc = b[66 + ib];
            let scale = _mm256_set_m128i(
                _mm_set1_epi16(2 * i16::from(sc >> 4) + 1),
                _mm_set1_epi16(2 * i16::from(sc & 0x0f) + 1),
            );
            acc = _mm256_add_epi32(acc, iq2_group(grid, signs, x32(y, ib), scale));
        }
        value_iq2(y.d, f16_at(b, 0), hsum(acc))
    })
}

/// The eight i32 lane sums of `v[0..8]`, in order (a transpose-and-add tree).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn hsum8(v: [__m256i; 8]) -> [i32; 8] {
    let mut out = [0i32; 8];
    // SAFETY: `out` is 8 i32 = 32 writable bytes; storeu needs no alignment.
    unsafe { _mm256_storeu_si256(out.as_mut_ptr().cast(), sum_lanes8(v)) };
    out
}

/// The eight i32 lane sums of `v[0..8]` as the lanes of one vector: [`hsum8`] before the store.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn sum_lanes8(v: [__m256i; 8]) -> __m256i {
    let a01 = _mm256_hadd_epi32(v[0], v[1]);
    let a23 = _mm256_hadd_epi32(v[2], v[3]);
    let a45 = _mm256_hadd_epi32(v[4], v[5]);
    let a67 = _mm256_hadd_epi32(v[6], v[7]);
    // Per 128-bit half: [Σv0, Σv1, Σv2, Σv3] of that half's lanes (resp. v4..v8).
    let b0 = _mm256_hadd_epi32(a01, a23);
    let b1 = _mm256_hadd_epi32(a45, a67);
    _mm256_add_epi32(
        _mm256_permute2x128_si256::<0x20>(b0, b1),
        _mm256_permute2x128_si256::<0x31>(b0, b1),
    )
}

/// The f16 scales at bytes `k · BK` (k < 8) of `b`, widened to f32 at once.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn legacy_scales<const B: usize, const BK: usize>(b: &[u8; B]) -> [f32; 8] {
    let h = |k: usize| i16::from_le_bytes([b[BK * k], b[BK * k + 1]]);
    let v = _mm_set_epi16(h(7), h(6), h(5), h(4), h(3), h(2), h(1), h(0));
    let mut out = [0f32; 8];
    // SAFETY: `out` is 8 f32 = 32 writable bytes; storeu needs no alignment.
    unsafe { _mm256_storeu_ps(out.as_mut_ptr(), _mm256_cvtph_ps(v)) };
    out
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q4_0(row: &[u8], x: &[BlockQ8K]) -> f32 {
    dot_blocks::<144>(row, x, |b, y| {
        let m4 = _mm_set1_epi8(0x0f);
        let ones = _mm256_set1_epi16(1);
        let v: [__m256i; 8] = std::array::from_fn(|k| {
            let raw = load16(&b[18 * k + 2..]);
            let lo = _mm_and_si128(raw, m4);
            let hi = _mm_and_si128(_mm_srli_epi16::<4>(raw), m4);
            dot32(_mm256_set_m128i(hi, lo), x32(y, k), ones)
        });
        let s = hsum8(v);
        // Σ (q − 8)·x8 = Σ q·x8 − 8·(bsum_2k + bsum_2k+1).
        let pair = _mm256_madd_epi16(bsums(y), ones);
        let mut p = [0i32; 8];
        // SAFETY: `p` is 8 i32 = 32 writable bytes; storeu needs no alignment.
        unsafe { _mm256_storeu_si256(p.as_mut_ptr().cast(), pair) };
        let s = std::array::from_fn(|k| s[k] - 8 * p[k]);
        value_legacy(y.d, &legacy_scales::<144, 18>(b), &s)
    })
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q8_0(row: &[u8], x: &[BlockQ8K]) -> f32 {
    dot_blocks::<272>(row, x, |b, y| {
        let ones = _mm256_set1_epi16(1);
        let v: [__m256i; 8] = std::array::from_fn(|k| {
            let q = load32(&b[34 * k + 2..]);
            // |q|·sign(q)·x8: |−128| is 128 as u8, and 2·128·127 < 2^15.
            let pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(q), _mm256_sign_epi8(x32(y, k), q));
            _mm256_madd_epi16(pairs, ones)
        });
        value_legacy(y.d, &legacy_scales::<272, 34>(b), &hsum8(v))
    })
}
