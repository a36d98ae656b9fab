//! AVX2 decode kernel with the weight rows in the vector lanes: eight Q2_K weight rows against
//! the Q8_K planes of one token (`q8`: one plane; `q8x2`: value and residual), with the integer
//! sums and f32 expressions of the scalar kernels, so that every row gets the bits of
//! [`super::q8_dot_fn`] summed over the planes in plane order.
//!
//! Algorithm. Lane `r` (an i32) of every vector belongs to weight row `r` of a group of eight, so
//! a block's sums come out whole in the lanes, with no horizontal reduction per block and row
//! (`avx2_rows.rs` reduces each block's lanes per row and plane), and the activation side is a
//! broadcast. Per block:
//!
//! 1. The eight rows' 16-byte runs at one offset are transposed into four vectors, vector `k`
//!    holding the run's 32-bit word `k` of every row (each row's run and that of row `r + 4`
//!    make one vector, then the 4 × 4 word transpose of `unpack` 32 / 64-bit inside the 128-bit
//!    lanes): the scale bytes `0 .. 16` once, the code bytes in four runs of four words.
//! 2. Code word `q` (bytes `4q .. 4q + 4` of the 64 code bytes) holds, at bits `2j .. 2j + 2`
//!    of its four bytes, the elements `128·(q / 8) + 32j + 4·(q mod 8) ..` + 4, all in sub-block
//!    `s = 8·(q / 8) + 2j + (q mod 8) / 4`. Shift and mask give the codes (0..=3); per plane
//!    `maddubs` with the broadcast activation word gives two i16 pair sums per row
//!    (|pair| ≤ 2·3·127), the four words of sub-block `s` are added in i16 (≤ 3048), and one
//!    `madd` by the row's scale `sc_s` (both i16 halves of the lane, from a byte shuffle of the
//!    scale words) adds `sc_s·Σ_16 q·x8` into the plane's i32 lanes: `S = Σ_s sc_s·Σ_16 q·x8`,
//!    exact. The mins `M = Σ_s m_s·bsum_s`: per plane eight `madd`s of the rows' min pairs
//!    `(m_2t, m_2t+1)` with the broadcast pair `(bsum_2t, bsum_2t+1)`.
//! 3. Per plane `d8·(d·f32(S) − dmin·f32(M))` is evaluated in the eight lanes with the scalar
//!    helper's operations in its order (`mul` / `sub`, no FMA), added into the plane's f32
//!    accumulator, blocks in order from `+0.0`; a row's result is its plane accumulators added in
//!    plane order.
//!
//! The row loop, the prefetch of the next group and the rows that do not fill a group are
//! `avx2_rows.rs`'s ([`super::avx2_rows::rows_loop`]).

#![allow(non_snake_case)] // ggml's type names

use super::avx2::load16;
use super::avx2_rows::{prefetch_share, q2_group, q3_group, rows_loop, values_d, values_dmin};
use super::block::BlockQ8K;
use super::shared::row_blocks;
use super::types::Q8RowsFn;
use crate::ggml_type::GgmlType;
use std::arch::x86_64::*;

/// Weight rows per group: the i32 lanes of a vector.
const LANES: usize = 8;

/// A decode kernel as a [`Q8RowsFn`]: [`rows_loop`] over blocks of `$b` bytes, groups of eight
/// rows by `$lanes`, the rest by `$one` (`avx2_rows.rs`'s group kernel at one row), one or two
/// planes. Handed out only where the CPU has AVX2, FMA and F16C.
macro_rules! lanes_kernel {
    ($b:literal, $lanes:ident, $one:ident) => {{
        #[target_feature(enable = "avx2,fma,f16c")]
        fn kernel(w: &[u8], x: &[BlockQ8K], planes: usize, y: &mut [f32]) {
            match planes {
                1 => rows_loop::<$b, LANES>(w, x, 1, y, $lanes::<1>, $one::<1, 1>),
                _ => rows_loop::<$b, LANES>(w, x, planes, y, $lanes::<2>, $one::<1, 2>),
            }
        }
        fn rows(w: &[u8], x: &[BlockQ8K], planes: usize, y: &mut [f32]) {
            // SAFETY: handed out only where the CPU has AVX2, FMA and F16C (the macro's
            // contract).
            unsafe { kernel(w, x, planes, y) }
        }
        rows as Q8RowsFn
    }};
}

/// The AVX2 decode kernel of `ty` (Q2_K, Q3_K), or None (no kernel for `ty`, or the CPU lacks
/// AVX2, FMA or F16C): groups of eight rows in the lanes, the rest one row at a time by
/// `avx2_rows.rs`'s group kernels, one or two planes.
pub(super) fn rows_fn(ty: GgmlType) -> Option<Q8RowsFn> {
    if !super::avx2::detected() {
        return None;
    }
    Some(match ty {
        GgmlType::Q2_K => lanes_kernel!(84, q2_lanes, q2_group),
        GgmlType::Q3_K => lanes_kernel!(110, q3_lanes, q3_group),
        _ => return None,
    })
}

/// The four vectors of step 1: vector `k` holds, in lane `r`, the 32-bit word at bytes
/// `at + 4k .. at + 4k + 4` of block `blks[r]`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn words4<const B: usize>(blks: &[&[u8; B]; LANES], at: usize) -> [__m256i; 4] {
    let mut v = [_mm256_setzero_si256(); 4];
    for (r, v) in v.iter_mut().enumerate() {
        *v = _mm256_set_m128i(load16(&blks[r + 4][at..]), load16(&blks[r][at..]));
    }
    // Lanes: [r0 w0, r1 w0, r0 w1, r1 w1 | r4 w0, r5 w0, r4 w1, r5 w1] and the like.
    let t0 = _mm256_unpacklo_epi32(v[0], v[1]);
    let t1 = _mm256_unpackhi_epi32(v[0], v[1]);
    let t2 = _mm256_unpacklo_epi32(v[2], v[3]);
    let t3 = _mm256_unpackhi_epi32(v[2], v[3]);
    [
        _mm256_unpacklo_epi64(t0, t2),
        _mm256_unpackhi_epi64(t0, t2),
        _mm256_unpacklo_epi64(t1, t3),
        _mm256_unpackhi_epi64(t1, t3),
    ]
}

/// Bytes `lo` and `hi` (< 4) of every lane of `v` as the lane's two i16 halves (high bytes
/// zero).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn byte_pair(v: __m256i, lo: usize, hi: usize) -> __m256i {
    let idx = |m: usize| {
        let (a, b) = ((4 * m + lo) as u32, (4 * m + hi) as u32);
        (0x8000_0000 | (b << 16) | 0x8000 | a) as i32
    };
    let pick = _mm256_setr_epi32(
        idx(0),
        idx(1),
        idx(2),
        idx(3),
        idx(0),
        idx(1),
        idx(2),
        idx(3),
    );
    _mm256_shuffle_epi8(v, pick)
}

/// The four codes `qs[at .. at + 4]` (`at` a multiple of 4) as one 32-bit word in every lane.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn broadcast4(qs: &[i8; 256], at: usize) -> __m256i {
    let w: &[i8; 4] = &qs.as_chunks::<4>().0[at / 4];
    // SAFETY: `w` is 4 readable bytes; read_unaligned needs no alignment.
    _mm256_set1_epi32(unsafe { std::ptr::read_unaligned(w.as_ptr().cast::<i32>()) })
}

/// The block sums `bsums[at]`, `bsums[at + 1]` (`at` even) as one 32-bit word in every lane.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn broadcast_bsums(bsums: &[i16; 16], at: usize) -> __m256i {
    let w: &[i16; 2] = &bsums.as_chunks::<2>().0[at / 2];
    // SAFETY: `w` is 4 readable bytes; read_unaligned needs no alignment.
    _mm256_set1_epi32(unsafe { std::ptr::read_unaligned(w.as_ptr().cast::<i32>()) })
}

/// Bits `2J .. 2J + 2` of every byte of `v` (`J` < 4).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn plane2<const J: usize>(v: __m256i) -> __m256i {
    let v = match J {
        0 => v,
        1 => _mm256_srli_epi16::<2>(v),
        2 => _mm256_srli_epi16::<4>(v),
        _ => _mm256_srli_epi16::<6>(v),
    };
    _mm256_and_si256(v, _mm256_set1_epi8(3))
}

/// The f16 pair at bytes `at .. at + 4` of each block as f32 lanes: (first, second).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn f16_pairs<const B: usize>(blks: &[&[u8; B]; LANES], at: usize) -> (__m256, __m256) {
    let w = |r: usize| {
        let b = blks[r];
        i32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
    };
    let v = _mm256_setr_epi32(w(0), w(1), w(2), w(3), w(4), w(5), w(6), w(7));
    // Per 128-bit lane: the four first halves, then the four second halves.
    let split = _mm256_setr_epi8(
        0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15, 0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7,
        10, 11, 14, 15,
    );
    // 64-bit elements [lo firsts, lo seconds, hi firsts, hi seconds] → [firsts | seconds].
    let v = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_shuffle_epi8(v, split));
    (
        _mm256_cvtph_ps(_mm256_castsi256_si128(v)),
        _mm256_cvtph_ps(_mm256_extracti128_si256::<1>(v)),
    )
}

/// The block loop of a group of eight rows in the lanes (`B` bytes per block, `P` planes): for
/// each block in order the next group's share prefetched, then `block`'s values per row (lane)
/// and plane added into the plane's f32 accumulator from `+0.0`; a row's result its plane
/// accumulators added in plane order.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn lanes_group<const B: usize, const P: usize>(
    w: &[u8],
    rb: usize,
    x: &[BlockQ8K],
    nb: usize,
    ahead: &[u8],
    block: impl Fn(&[&[u8; B]; LANES], &[&BlockQ8K; P]) -> [__m256; P],
) -> [f32; LANES] {
    let rows = row_blocks::<B, LANES>(w, rb, nb);
    let planes: [&[BlockQ8K]; P] = std::array::from_fn(|p| &x[p * nb..(p + 1) * nb]);
    let mut acc = [_mm256_setzero_ps(); P];
    for b in 0..nb {
        prefetch_share(ahead, b, LANES * B);
        let blks = rows.map(|r| &r[b]);
        let ys = planes.map(|p| &p[b]);
        let v = block(&blks, &ys);
        for p in 0..P {
            acc[p] = _mm256_add_ps(acc[p], v[p]);
        }
    }
    let mut sum = acc[0];
    for a in &acc[1..] {
        sum = _mm256_add_ps(sum, *a);
    }
    let mut out = [0f32; LANES];
    // SAFETY: `out` is 8 f32 = 32 writable bytes; storeu needs no alignment.
    unsafe { _mm256_storeu_ps(out.as_mut_ptr(), sum) };
    out
}

/// Q2_K, eight rows in the lanes × `P` planes: one group of [`super::avx2_rows::rows_loop`]
/// (`w` the eight rows of `rb` bytes, `nb` blocks; `ahead` the next group, prefetched a block's
/// share per block).
#[target_feature(enable = "avx2,fma,f16c")]
fn q2_lanes<const P: usize>(
    w: &[u8],
    rb: usize,
    x: &[BlockQ8K],
    nb: usize,
    ahead: &[u8],
) -> [f32; LANES] {
    lanes_group::<84, P>(w, rb, x, nb, ahead, |blks, ys| q2_block::<P>(blks, ys))
}

/// One Q2_K block of the eight rows `blks` against the planes `ys`: its value per row (lane) and
/// plane (steps 1–3).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn q2_block<const P: usize>(blks: &[&[u8; 84]; LANES], ys: &[&BlockQ8K; P]) -> [__m256; P] {
    let m4 = _mm256_set1_epi8(0x0f);
    let raw = words4(blks, 0);
    // (A loop, not `array::map`: a closure of intrinsics handed to `map` is not inlined.)
    let mut scales = raw;
    for v in &mut scales {
        *v = _mm256_and_si256(*v, m4);
    }
    let mut s = [_mm256_setzero_si256(); P];
    q2_quad::<0, P>(blks, &scales, ys, &mut s);
    q2_quad::<1, P>(blks, &scales, ys, &mut s);
    q2_quad::<2, P>(blks, &scales, ys, &mut s);
    q2_quad::<3, P>(blks, &scales, ys, &mut s);
    let mut m = [_mm256_setzero_si256(); P];
    for (k, &r) in raw.iter().enumerate() {
        let mins = _mm256_and_si256(_mm256_srli_epi16::<4>(r), m4);
        for t in 0..2 {
            let pair = byte_pair(mins, 2 * t, 2 * t + 1);
            for p in 0..P {
                let bs = broadcast_bsums(&ys[p].bsums, 4 * k + 2 * t);
                m[p] = _mm256_add_epi32(m[p], _mm256_madd_epi16(pair, bs));
            }
        }
    }
    let (d, dmin) = f16_pairs(blks, 80);
    let mut out = [_mm256_setzero_ps(); P];
    for p in 0..P {
        out[p] = values_dmin(_mm256_set1_ps(ys[p].d), d, dmin, s[p], m[p]);
    }
    out
}

/// Code words `4·HQ .. 4·HQ + 4` of a Q2_K block (step 2), with the scale words `scales`
/// (nibbles masked), added into `s`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn q2_quad<const HQ: usize, const P: usize>(
    blks: &[&[u8; 84]; LANES],
    scales: &[__m256i; 4],
    ys: &[&BlockQ8K; P],
    s: &mut [__m256i; P],
) {
    let words = words4(blks, 16 + 16 * HQ);
    let sc = |j: usize| {
        let (w, k) = (sub_index(HQ, j) / 4, sub_index(HQ, j) % 4);
        byte_pair(scales[w], k, k)
    };
    sub_block::<HQ, 0, P>(&words, sc(0), ys, s, |w, _| plane2::<0>(w));
    sub_block::<HQ, 1, P>(&words, sc(1), ys, s, |w, _| plane2::<1>(w));
    sub_block::<HQ, 2, P>(&words, sc(2), ys, s, |w, _| plane2::<2>(w));
    sub_block::<HQ, 3, P>(&words, sc(3), ys, s, |w, _| plane2::<3>(w));
}

/// Sub-block [`sub_index`]`(HQ, J)` of step 2 from the four code words `words` of quad `HQ`:
/// `codes(word, i)` the codes of word `i` at bits `2J ..`, `sc` the rows' scales of the
/// sub-block as i16 pairs (so that `madd` scales both pair sums of a lane), added into `s`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn sub_block<const HQ: usize, const J: usize, const P: usize>(
    words: &[__m256i; 4],
    sc: __m256i,
    ys: &[&BlockQ8K; P],
    s: &mut [__m256i; P],
    codes: impl Fn(__m256i, usize) -> __m256i,
) {
    let (h, half) = (HQ / 2, HQ % 2);
    let mut a16 = [_mm256_setzero_si256(); P];
    for (i, &word) in words.iter().enumerate() {
        let c = codes(word, i);
        let at = 128 * h + 32 * J + 4 * (4 * half + i);
        for p in 0..P {
            let pairs = _mm256_maddubs_epi16(c, broadcast4(&ys[p].qs, at));
            a16[p] = _mm256_add_epi16(a16[p], pairs);
        }
    }
    for p in 0..P {
        s[p] = _mm256_add_epi32(s[p], _mm256_madd_epi16(a16[p], sc));
    }
}

/// The sub-block of the codes at bits `2j ..` of code words `4·hq .. 4·hq + 4` (step 2).
const fn sub_index(hq: usize, j: usize) -> usize {
    8 * (hq / 2) + 2 * j + hq % 2
}

/// Q3_K, eight rows in the lanes × `P` planes: [`q2_lanes`]'s group with [`q3_block`].
#[target_feature(enable = "avx2,fma,f16c")]
fn q3_lanes<const P: usize>(
    w: &[u8],
    rb: usize,
    x: &[BlockQ8K],
    nb: usize,
    ahead: &[u8],
) -> [f32; LANES] {
    lanes_group::<110, P>(w, rb, x, nb, ahead, |blks, ys| q3_block::<P>(blks, ys))
}

/// Bit `k` (< 8) of every byte of `v` at bit 2 (`4·hbit`), other bits zero.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn high_bit(v: __m256i, k: usize) -> __m256i {
    let v = match k {
        0 => _mm256_slli_epi16::<2>(v),
        1 => _mm256_slli_epi16::<1>(v),
        2 => v,
        3 => _mm256_srli_epi16::<1>(v),
        4 => _mm256_srli_epi16::<2>(v),
        5 => _mm256_srli_epi16::<3>(v),
        6 => _mm256_srli_epi16::<4>(v),
        _ => _mm256_srli_epi16::<5>(v),
    };
    _mm256_and_si256(v, _mm256_set1_epi8(4))
}

/// The 16 six-bit Q3_K scales (still offset by 32) of the lanes' blocks from their three packed
/// words `a` (bytes 96 .. 108): word `k` of the result holds scales `4k .. 4k + 4`
/// ([`super::shared::q3_k_raw_scales`]'s rule, four scales per lane and word).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn q3_scale_words(a: [__m256i; 3]) -> [__m256i; 4] {
    let lo = _mm256_set1_epi8(0x0f);
    let hi = _mm256_set1_epi8(0x03);
    let top = |v: __m256i| _mm256_slli_epi32::<4>(_mm256_and_si256(v, hi));
    [
        _mm256_or_si256(_mm256_and_si256(a[0], lo), top(a[2])),
        _mm256_or_si256(
            _mm256_and_si256(a[1], lo),
            top(_mm256_srli_epi32::<2>(a[2])),
        ),
        _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi32::<4>(a[0]), lo),
            top(_mm256_srli_epi32::<4>(a[2])),
        ),
        _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi32::<4>(a[1]), lo),
            top(_mm256_srli_epi32::<6>(a[2])),
        ),
    ]
}

/// One Q3_K block of the eight rows `blks` against the planes `ys`: codes `q3 = q + 4·hbit`
/// (0..=7; |pair| ≤ 2·7·127, four words ≤ 7112 in i16), scales `s = sc − 32`, and the `− 4` as
/// `Σ_s (−4·s_s)·bsum_s` per plane; the value `d8·(d·f32(S))` per row (lane) and plane.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn q3_block<const P: usize>(blks: &[&[u8; 110]; LANES], ys: &[&BlockQ8K; P]) -> [__m256; P] {
    // Bytes 92 .. 108: the last code word, then the three scale words.
    let packed = words4(blks, 92);
    let raw = q3_scale_words([packed[1], packed[2], packed[3]]);
    let mut s = [_mm256_setzero_si256(); P];
    for (k, &sw) in raw.iter().enumerate() {
        for t in 0..2 {
            // (−4·s_2t, −4·s_2t+1) = 128 − 4·sc.
            let pair = _mm256_sub_epi16(
                _mm256_set1_epi16(128),
                _mm256_slli_epi16::<2>(byte_pair(sw, 2 * t, 2 * t + 1)),
            );
            for p in 0..P {
                let bs = broadcast_bsums(&ys[p].bsums, 4 * k + 2 * t);
                s[p] = _mm256_add_epi32(s[p], _mm256_madd_epi16(pair, bs));
            }
        }
    }
    let hmask = [words4(blks, 0), words4(blks, 16)];
    q3_quad::<0, P>(blks, &raw, &hmask[0], ys, &mut s);
    q3_quad::<1, P>(blks, &raw, &hmask[1], ys, &mut s);
    q3_quad::<2, P>(blks, &raw, &hmask[0], ys, &mut s);
    q3_quad::<3, P>(blks, &raw, &hmask[1], ys, &mut s);
    // The word at bytes 106 .. 110: its second half is `d`.
    let (_, d) = f16_pairs(blks, 106);
    let mut out = [_mm256_setzero_ps(); P];
    for p in 0..P {
        out[p] = values_d(_mm256_set1_ps(ys[p].d), d, s[p]);
    }
    out
}

/// Code words `4·HQ .. 4·HQ + 4` of a Q3_K block with their high bits (`high`, the hmask words
/// of the same bytes `l`), the raw scale words `raw`, added into `s`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn q3_quad<const HQ: usize, const P: usize>(
    blks: &[&[u8; 110]; LANES],
    raw: &[__m256i; 4],
    high: &[__m256i; 4],
    ys: &[&BlockQ8K; P],
    s: &mut [__m256i; P],
) {
    let words = words4(blks, 32 + 16 * HQ);
    // The signed scales `sc − 32` as i16 pairs.
    let sc = |j: usize| {
        let (w, k) = (sub_index(HQ, j) / 4, sub_index(HQ, j) % 4);
        let pair = byte_pair(raw[w], k, k);
        _mm256_sub_epi16(pair, _mm256_set1_epi16(32))
    };
    let h = 4 * (HQ / 2);
    sub_block::<HQ, 0, P>(&words, sc(0), ys, s, |w, i| {
        _mm256_or_si256(plane2::<0>(w), high_bit(high[i], h))
    });
    sub_block::<HQ, 1, P>(&words, sc(1), ys, s, |w, i| {
        _mm256_or_si256(plane2::<1>(w), high_bit(high[i], h + 1))
    });
    sub_block::<HQ, 2, P>(&words, sc(2), ys, s, |w, i| {
        _mm256_or_si256(plane2::<2>(w), high_bit(high[i], h + 2))
    });
    sub_block::<HQ, 3, P>(&words, sc(3), ys, s, |w, i| {
        _mm256_or_si256(plane2::<3>(w), high_bit(high[i], h + 3))
    });
}
