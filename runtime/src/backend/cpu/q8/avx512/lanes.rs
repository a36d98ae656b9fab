//! Decode kernels with the weight rows in the vector lanes (AVX-512): 16 Q2_K or Q3_K weight
//! rows against the two Q8_K planes of one token (`q8x2`), with the integer sums and f32
//! expressions of the scalar kernels, so that every row gets the bits of
//! [`super::super::q8_dot_fn`] summed over the planes in plane order.
//!
//! Algorithm (steps as written for Q2_K). Lane `r` of every vector belongs to weight row `r` of
//! a group of 16, so a block's sums come out whole in the lanes, with no horizontal reduction
//! (`rows.rs` reduces each block's lanes per row and plane), and the activation side is a
//! broadcast:
//!
//! 1. Per block, each row's bytes `0 .. 64` (the 16 scale bytes and code bytes `0 .. 48`) and
//!    `20 .. 84` (code bytes `4 .. 64`, then `d` and `dmin`) are loaded as 16 32-bit words and
//!    the 16 × 16 words transposed (`unpack` 32 / 64-bit, then two `shuffle_i32x4` stages), so
//!    that vector `q` holds code word `q` (bytes `4q .. 4q + 4` of the 64 code bytes) of all 16
//!    rows, and likewise the scale words and the `(d, dmin)` word.
//! 2. Code word `q` holds, at bits `2j .. 2j + 2` of its four bytes, the elements
//!    `128·(q / 8) + 32j + 4·(q mod 8) ..` + 4 (Q2_K's order), all in sub-block
//!    `8·(q / 8) + 2j + (q mod 8) / 4`. Shift and mask give the codes; per plane four `vpdpbusd`
//!    with the broadcast activation words add a sub-block's 16 products into an i32 per row
//!    (|sum| ≤ 16·3·128, so also its own low i16), and one `vpdpwssd` by the row's scale of that
//!    sub-block (low i16 of the lane, high half zero) adds `sc_j·Σ_16 q·x8` into one of four
//!    accumulators chosen by `j`: `S = Σ_j sc_j·Σ_16 q·x8`, exact. The mins `M = Σ_j m_j·bsum_j`:
//!    eight `vpdpwssd` per plane of the rows' min pairs `(m_2t, m_2t+1)` (16-bit halves of a
//!    lane) with the broadcast pair `(bsum_2t, bsum_2t+1)`.
//! 3. Per plane `d8·(d·f32(S) − dmin·f32(M))` is evaluated in the 16 lanes with the scalar
//!    helper's operations in its order (`mul`/`sub`, no FMA), added into the plane's f32
//!    accumulator, blocks in order from `+0.0`; a row's result is its plane accumulators added in
//!    plane order.
//!
//! Q3_K ([`q3_block`]): the 3-bit codes `q + 4·hbit` through `vpdpbusd` per sub-block, then
//! `vpdpwssd` by the signed 6-bit scale, no mins; the 16 scales decoded at once, four bytes per
//! lane by nibble selects.
//!
//! Prefill of a few tokens, or of an expert's share of a prompt ([`interleaved_tokens`]): each
//! block of a group of 16 rows is unpacked once into the tile kernels' effective weights with the
//! words in the lanes ([`q2_unpack`], [`q3_unpack`]), then meets up to eight activation rows per
//! pass (one `vpdpbusd` per word and row, the row's word a broadcast) and the tile epilogue's f32
//! expressions per row: no activation row is padded to a 16-row tile, nothing is packed.
//!
//! While a group is computed the next one's bytes are prefetched into L2 in address order (a
//! group is 21 KiB at 4096 elements, two do not fit L1). Fewer than 16 rows go to `rows.rs`.
//! Weights in the interleaved layout (`super::interleave_rows`) hold each group's block words
//! already in step 1's order, so [`interleaved`] replaces the loads and the transpose by 21
//! (Q2_K) or 27 (Q3_K, and its 16 `d`) plain loads per block and runs the same block functions
//! ([`q2_block`], [`q3_block`]), for one or two planes.

#![allow(non_snake_case)] // the kernels keep ggml's type names (q2_K)

use super::{row_blocks, rows_lengths, BlockQ8K};
use crate::ggml_type::GgmlType;
use std::arch::x86_64::*;

/// Weight rows per group: the i32 lanes of a vector.
pub(crate) const LANES: usize = 16;

/// `y[i] = dot(row_i, x_0) + dot(row_i, x_1)` for the whole groups of 16 rows of `w` and two
/// planes (`Q8RowsFn`'s contract for Q2_K, `B` = 84, or Q3_K, `B` = 110); returns the rows done
/// (a multiple of 16, or all of them after a failed length check), the rest left to the caller.
/// One plane goes to the caller whole: there `rows.rs`'s groups of eight are faster.
///
/// # Safety
/// The CPU has the features of `vnni::detected` (checked by the caller).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn two_planes<const B: usize>(
    w: &[u8],
    x: &[BlockQ8K],
    planes: usize,
    y: &mut [f32],
) -> usize {
    if planes != 2 {
        return 0;
    }
    let Some((nb, rb)) = rows_lengths(w, x, planes, y, B) else {
        return y.len();
    };
    let n = y.len() - y.len() % LANES;
    for g in (0..n).step_by(LANES) {
        let ahead = super::clamped(w, (g + LANES) * rb, (g + 2 * LANES) * rb);
        let rows = &w[g * rb..(g + LANES) * rb];
        let v = if B == 110 {
            q3_group::<2>(rows, rb, x, nb, ahead)
        } else {
            q2_group::<2>(rows, rb, x, nb, ahead)
        };
        y[g..g + LANES].copy_from_slice(&v);
    }
    n
}

/// `y[i] = Σ_p dot(row_i, x_p)` for the rows of `w` in the interleaved layout
/// ([`super::super::interleave_rows`]; Q2_K, `B` = 84, or Q3_K, `B` = 110) and one or two
/// planes: `Q8RowsFn`'s contract, the rows a whole number of groups of 16 (else NaN in every
/// `y[i]`). The group's block words are plain loads, one stream in address order; each row gets
/// the bits of [`two_planes`] (the same block functions).
///
/// # Safety
/// The CPU has the features of `vnni::detected` (checked by the caller).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn interleaved<const B: usize>(w: &[u8], x: &[BlockQ8K], planes: usize, y: &mut [f32]) {
    let whole = y.len().is_multiple_of(LANES);
    if !super::lengths_ok(whole, y, |rows| {
        format!("interleaved rows: {rows} rows are not whole groups of {LANES}")
    }) {
        return;
    }
    let Some((nb, rb)) = rows_lengths(w, x, planes, y, B) else {
        return;
    };
    for g in (0..y.len()).step_by(LANES) {
        let ahead = super::clamped(w, (g + LANES) * rb, (g + 2 * LANES) * rb);
        let group = &w[g * rb..(g + LANES) * rb];
        let v = match (B, planes) {
            (110, 1) => q3_interleaved::<1>(group, x, nb, ahead),
            (110, _) => q3_interleaved::<2>(group, x, nb, ahead),
            (_, 1) => q2_interleaved::<1>(group, x, nb, ahead),
            _ => q2_interleaved::<2>(group, x, nb, ahead),
        };
        y[g..g + LANES].copy_from_slice(&v);
    }
}

/// The interleaved decode kernel of `ty` (Q2_K, Q3_K) on a CPU with the features of
/// `vnni::detected`, or None.
pub(crate) fn interleaved_fn(ty: GgmlType) -> Option<super::Q8RowsFn> {
    if !super::vnni::detected() {
        return None;
    }
    // SAFETY: (both wrappers) the features were detected just above.
    fn q2(w: &[u8], x: &[BlockQ8K], planes: usize, y: &mut [f32]) {
        // SAFETY: the features this kernel enables were detected before the wrapper was handed out.
        unsafe { interleaved::<84>(w, x, planes, y) }
    }
    fn q3(w: &[u8], x: &[BlockQ8K], planes: usize, y: &mut [f32]) {
        // SAFETY: the features this kernel enables were detected before the wrapper was handed out.
        unsafe { interleaved::<110>(w, x, planes, y) }
    }
    match ty {
        GgmlType::Q2_K => Some(q2),
        GgmlType::Q3_K => Some(q3),
        _ => None,
    }
}

/// Activation rows (token planes) that meet an unpacked block per pass of
/// [`interleaved_tokens`] (their i32 and f32 accumulators stay in registers).
const TOKEN_ROWS: usize = 8;

/// `y[i·m + j] = Σ_p dot(row_i, x_{j,p})` for the rows of `w` in the interleaved layout (Q2_K,
/// `B` = 84, or Q3_K, `B` = 110; whole groups of 16) and `m = tokens` activation rows of
/// `planes` planes each (`x` token-major, then plane-major: plane `p` of token `j` is blocks
/// `(j·planes + p)·nb ..`): [`super::Q8TokensFn`]'s contract. Each block of a group is unpacked
/// once, 16 rows at once ([`q2_unpack`], [`q3_unpack`]: the tile kernels' effective weights,
/// word `k` of the 16 rows one vector), and then meets the activation rows up to
/// [`TOKEN_ROWS`] at a time ([`unpacked_pass`]): one `vpdpbusd` per row and word with the
/// row's word broadcast from memory, the block's value by the tile epilogue's expressions, lane
/// by lane, added into the row's f32 accumulator (blocks in order from `+0.0`). No activation
/// row is padded, and every output has the bits of the scalar kernel summed over the planes in
/// plane order.
///
/// # Safety
/// The CPU has the features of `vnni::detected` (checked by the caller).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn interleaved_tokens<const B: usize>(
    w: &[u8],
    x: &[BlockQ8K],
    planes: usize,
    tokens: usize,
    y: &mut [f32],
) {
    let arows = tokens * planes;
    let nb = x.len().checked_div(arows).unwrap_or(0);
    let rb = nb * B;
    let n = w.len().checked_div(rb).unwrap_or(0);
    let ok = (1..=super::MAX_PLANES).contains(&planes)
        && tokens > 0
        && x.len() == arows * nb
        && n * rb == w.len()
        && n.is_multiple_of(LANES)
        && y.len() == n * tokens;
    let (wl, xl) = (w.len(), x.len());
    if !super::lengths_ok(ok || (nb == 0 && w.is_empty()), y, |outs| {
        format!(
            "interleaved tokens: weight bytes {wl} / x blocks {xl} / {tokens} tokens × {planes} \
             planes / outputs {outs} (block {B} bytes, whole groups of {LANES} rows)"
        )
    }) {
        return;
    }
    if nb == 0 {
        // No blocks: every dot is +0.0.
        y.fill(0.0);
        return;
    }
    let mut acc = vec![_mm512_setzero_ps(); arows];
    let mut unpacked = [0u8; 64 * 64];
    let mut lanes = [0f32; LANES];
    for g in (0..n).step_by(LANES) {
        let ahead = super::clamped(w, (g + LANES) * rb, (g + 2 * LANES) * rb);
        let group = &w[g * rb..(g + LANES) * rb];
        acc.fill(_mm512_setzero_ps());
        for (b, blk) in group.chunks_exact(LANES * B).enumerate() {
            super::prefetch_l2(super::clamped(ahead, b * LANES * B, (b + 1) * LANES * B));
            let sc = if B == 110 {
                q3_unpack(blk, &mut unpacked)
            } else {
                q2_unpack(blk, &mut unpacked)
            };
            let mut a0 = 0;
            while a0 < arows {
                let take = match arows - a0 {
                    TOKEN_ROWS.. => TOKEN_ROWS,
                    4..TOKEN_ROWS => 4,
                    2 | 3 => 2,
                    _ => 1,
                };
                let ys: &[BlockQ8K] = &x[a0 * nb + b..];
                let out = &mut acc[a0..a0 + take];
                let mins = B != 110;
                match (mins, take) {
                    (true, 8) => unpacked_pass::<8, true>(&unpacked, &sc, ys, nb, out),
                    (true, 4) => unpacked_pass::<4, true>(&unpacked, &sc, ys, nb, out),
                    (true, 2) => unpacked_pass::<2, true>(&unpacked, &sc, ys, nb, out),
                    (true, _) => unpacked_pass::<1, true>(&unpacked, &sc, ys, nb, out),
                    (false, 8) => unpacked_pass::<8, false>(&unpacked, &sc, ys, nb, out),
                    (false, 4) => unpacked_pass::<4, false>(&unpacked, &sc, ys, nb, out),
                    (false, 2) => unpacked_pass::<2, false>(&unpacked, &sc, ys, nb, out),
                    (false, _) => unpacked_pass::<1, false>(&unpacked, &sc, ys, nb, out),
                }
                a0 += take;
            }
        }
        for j in 0..tokens {
            // Plane dots added in plane order, as `planes_added`.
            let mut sum = acc[j * planes];
            for a in &acc[j * planes + 1..(j + 1) * planes] {
                sum = _mm512_add_ps(sum, *a);
            }
            // SAFETY: 16 f32 into a [f32; 16].
            unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), sum) };
            for (i, &v) in lanes.iter().enumerate() {
                y[(g + i) * tokens + j] = v;
            }
        }
    }
}

/// One unpacked block of 16 rows (`unpacked`, word `k` of the rows at `64k`; its scales `sc`)
/// against the `A` activation rows whose block is `ys[a·nb]`: the integer sums `S` by one
/// `vpdpbusd` per word and row, then the tile kernels' epilogue per row with the weight rows in
/// the lanes — `MINS` (Q2_K): `d8·(d·f32(S) − dmin·f32(M))`, `M = Σ_j m_j·bsum_j` by eight
/// `vpdpwssd`; else (Q3_K's biased weights) `d8·(d·f32(S − 127·Σ bsum))` — added into `acc`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn unpacked_pass<const A: usize, const MINS: bool>(
    unpacked: &[u8; 64 * 64],
    sc: &LaneScales,
    ys: &[BlockQ8K],
    nb: usize,
    acc: &mut [__m512],
) {
    let rows: [&BlockQ8K; A] = std::array::from_fn(|a| &ys[a * nb]);
    let mut s = [_mm512_setzero_si512(); A];
    for k in 0..64 {
        let wk = load64(unpacked, 64 * k);
        for (sa, y) in s.iter_mut().zip(&rows) {
            *sa = _mm512_dpbusd_epi32(*sa, wk, word(&y.qs, k));
        }
    }
    let d = f32x16(&sc.d);
    for ((sa, y), acc) in s.iter().zip(&rows).zip(acc.iter_mut()) {
        let v = if MINS {
            let mut m = _mm512_setzero_si512();
            for (t, mins) in sc.mins.iter().enumerate() {
                m = _mm512_dpwssd_epi32(m, i32x16(mins), word(&y.bsums, t));
            }
            _mm512_sub_ps(
                _mm512_mul_ps(d, _mm512_cvtepi32_ps(*sa)),
                _mm512_mul_ps(f32x16(&sc.dmin), _mm512_cvtepi32_ps(m)),
            )
        } else {
            let total: i32 = y.bsums.iter().map(|&v| i32::from(v)).sum();
            let sum = _mm512_add_epi32(*sa, _mm512_set1_epi32(-127 * total));
            _mm512_mul_ps(d, _mm512_cvtepi32_ps(sum))
        };
        *acc = _mm512_add_ps(*acc, _mm512_mul_ps(_mm512_set1_ps(y.d), v));
    }
}

/// 16 f32 lanes from an array.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn f32x16(v: &[f32; LANES]) -> __m512 {
    // SAFETY: 16 readable f32.
    unsafe { _mm512_loadu_ps(v.as_ptr()) }
}

/// 16 i32 lanes from an array.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn i32x16(v: &[i32; LANES]) -> __m512i {
    // SAFETY: 16 readable i32.
    unsafe { _mm512_loadu_si512(v.as_ptr().cast()) }
}

/// The many-token kernel of `ty` (Q2_K, Q3_K) for the interleaved layout on a CPU with the
/// features of `vnni::detected`, or None.
pub(crate) fn interleaved_tokens_fn(ty: GgmlType) -> Option<super::Q8TokensFn> {
    if !super::vnni::detected() {
        return None;
    }
    // SAFETY: (both wrappers) the features were detected just above.
    fn q2(w: &[u8], x: &[BlockQ8K], planes: usize, tokens: usize, y: &mut [f32]) {
        // SAFETY: the features this kernel enables were detected before the wrapper was handed out.
        unsafe { interleaved_tokens::<84>(w, x, planes, tokens, y) }
    }
    fn q3(w: &[u8], x: &[BlockQ8K], planes: usize, tokens: usize, y: &mut [f32]) {
        // SAFETY: the features this kernel enables were detected before the wrapper was handed out.
        unsafe { interleaved_tokens::<110>(w, x, planes, tokens, y) }
    }
    match ty {
        GgmlType::Q2_K => Some(q2),
        GgmlType::Q3_K => Some(q3),
        _ => None,
    }
}

/// [`q2_group`] on an interleaved group: word `k` of block `b` is 64 bytes at `1344b + 64k`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn q2_interleaved<const P: usize>(
    g: &[u8],
    x: &[BlockQ8K],
    nb: usize,
    ahead: &[u8],
) -> [f32; LANES] {
    let planes: [&[BlockQ8K]; P] = std::array::from_fn(|p| &x[p * nb..(p + 1) * nb]);
    let mut acc = [_mm512_setzero_ps(); P];
    for (b, blk) in g.chunks_exact(LANES * 84).take(nb).enumerate() {
        super::prefetch_l2(super::clamped(ahead, b * LANES * 84, (b + 1) * LANES * 84));
        // Loaded up front: measured faster here than loads where used (Q3_K: the reverse).
        let words: [__m512i; 21] = std::array::from_fn(|k| load64(blk, 64 * k));
        q2_block::<P>(&|k| words[k], planes.map(|p| &p[b]), &mut acc);
    }
    planes_added(acc)
}

/// [`q3_group`] on an interleaved group: the 27 words of block `b` at `1760b + 64k`, then the
/// 16 `d` (f16) at `1760b + 1728`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn q3_interleaved<const P: usize>(
    g: &[u8],
    x: &[BlockQ8K],
    nb: usize,
    ahead: &[u8],
) -> [f32; LANES] {
    let planes: [&[BlockQ8K]; P] = std::array::from_fn(|p| &x[p * nb..(p + 1) * nb]);
    planes_added(q3_blocks::<P, CHAINS>(g, planes, nb, ahead))
}

/// The f32 accumulators (blocks in order from `+0.0`) of the interleaved Q3_K group `g` against
/// the `P` activation rows `rows`, with `C` i32 chains per row ([`CHAINS`]).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn q3_blocks<const P: usize, const C: usize>(
    g: &[u8],
    rows: [&[BlockQ8K]; P],
    nb: usize,
    ahead: &[u8],
) -> [__m512; P] {
    let mut acc = [_mm512_setzero_ps(); P];
    for (b, blk) in g.chunks_exact(LANES * 110).take(nb).enumerate() {
        super::prefetch_l2(super::clamped(
            ahead,
            b * LANES * 110,
            (b + 1) * LANES * 110,
        ));
        let d = &blk[64 * Q3_WORDS..64 * Q3_WORDS + 32];
        // SAFETY: 32 readable bytes (a bounds-checked slice); loadu needs no alignment.
        let d = _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(d.as_ptr().cast()) });
        // The `hmask` words (each read at four shifts) loaded up front, the rest where used:
        // measured faster than either all up front or all where used.
        let hmask: [__m512i; 8] = std::array::from_fn(|k| load64(blk, 64 * k));
        let words = |k: usize| if k < 8 { hmask[k] } else { load64(blk, 64 * k) };
        q3_block::<P, C>(&words, d, rows.map(|r| &r[b]), &mut acc);
    }
    acc
}

/// The 64 bytes of `s` from `at` as 16 32-bit words.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn load64(s: &[u8], at: usize) -> __m512i {
    let s = &s[at..at + 64];
    // SAFETY: `s` has exactly 64 readable bytes; loadu needs no alignment.
    unsafe { _mm512_loadu_si512(s.as_ptr().cast()) }
}

/// Stages 1 and 2 of the 16 × 16 word transpose: `u[4g + k]`, in 128-bit chunk `c`, holds word
/// `4c + k` of rows `4g .. 4g + 4`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn quads(v: &[__m512i; 16]) -> [__m512i; 16] {
    let mut u = [_mm512_setzero_si512(); 16];
    for g in 0..4 {
        let r = 4 * g;
        let t0 = _mm512_unpacklo_epi32(v[r], v[r + 1]);
        let t1 = _mm512_unpackhi_epi32(v[r], v[r + 1]);
        let t2 = _mm512_unpacklo_epi32(v[r + 2], v[r + 3]);
        let t3 = _mm512_unpackhi_epi32(v[r + 2], v[r + 3]);
        u[r] = _mm512_unpacklo_epi64(t0, t2);
        u[r + 1] = _mm512_unpackhi_epi64(t0, t2);
        u[r + 2] = _mm512_unpacklo_epi64(t1, t3);
        u[r + 3] = _mm512_unpackhi_epi64(t1, t3);
    }
    u
}

/// Word `i` (`4c + k`) of all 16 rows from the stage-2 quads `u`: chunk `g` of the result is
/// chunk `c` of `u[4g + k]`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn column(u: &[__m512i; 16], i: usize) -> __m512i {
    let (c, k) = (i / 4, i % 4);
    // Chunks (c of u[k], c of u[4 + k]) and (c of u[8 + k], c of u[12 + k]) side by side.
    let (lo, hi) = match c {
        0 | 1 => (
            _mm512_shuffle_i32x4::<0x44>(u[k], u[4 + k]),
            _mm512_shuffle_i32x4::<0x44>(u[8 + k], u[12 + k]),
        ),
        _ => (
            _mm512_shuffle_i32x4::<0xee>(u[k], u[4 + k]),
            _mm512_shuffle_i32x4::<0xee>(u[8 + k], u[12 + k]),
        ),
    };
    match c % 2 {
        0 => _mm512_shuffle_i32x4::<0x88>(lo, hi),
        _ => _mm512_shuffle_i32x4::<0xdd>(lo, hi),
    }
}

/// The full 16 × 16 word transpose: result `i`, lane `r` = `v[r]`, lane `i`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn transpose(v: &[__m512i; 16]) -> [__m512i; 16] {
    let u = quads(v);
    let mut out = [_mm512_setzero_si512(); 16];
    for k in 0..4 {
        let a = _mm512_shuffle_i32x4::<0x44>(u[k], u[4 + k]);
        let b = _mm512_shuffle_i32x4::<0x44>(u[8 + k], u[12 + k]);
        let c = _mm512_shuffle_i32x4::<0xee>(u[k], u[4 + k]);
        let d = _mm512_shuffle_i32x4::<0xee>(u[8 + k], u[12 + k]);
        out[k] = _mm512_shuffle_i32x4::<0x88>(a, b);
        out[4 + k] = _mm512_shuffle_i32x4::<0xdd>(a, b);
        out[8 + k] = _mm512_shuffle_i32x4::<0x88>(c, d);
        out[12 + k] = _mm512_shuffle_i32x4::<0xdd>(c, d);
    }
    out
}

/// `vpshufb` indices that put bytes `lo` and `hi` (< 4; `hi` None: zero) of each 32-bit lane
/// into bytes 0 and 2 of that lane and zero bytes 1 and 3 (index bit 7).
const fn pick(lo: usize, hi: Option<usize>) -> [u8; 64] {
    let mut t = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        let lane = i / 4 * 4 % 16;
        t[i] = match (i % 4, hi) {
            (0, _) => (lane + lo) as u8,
            (2, Some(hi)) => (lane + hi) as u8,
            _ => 0x80,
        };
        i += 1;
    }
    t
}

/// Byte `m` of each lane alone (a row's scale in the low 16-bit half, the high half zero: the
/// `vpdpwssd` that scales a sub-block's i32 sum, held in the low half, multiplies the sum's
/// sign half by it).
static PICK_LOW: [[u8; 64]; 4] = [pick(0, None), pick(1, None), pick(2, None), pick(3, None)];
/// Byte `m` of each lane twice (a row's scale in both 16-bit halves, for `_mm512_mullo_epi16`).
static PICK_TWICE: [[u8; 64]; 4] = [
    pick(0, Some(0)),
    pick(1, Some(1)),
    pick(2, Some(2)),
    pick(3, Some(3)),
];
/// Bytes `m`, `m + 1` of each lane (a row's two mins, one per 16-bit half).
static PICK_PAIR: [[u8; 64]; 2] = [pick(0, Some(1)), pick(2, Some(3))];

/// The 64 bytes of a table as a vector.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn table(t: &[u8; 64]) -> __m512i {
    load64(t, 0)
}

/// The 32-bit word `k` of the array `words` broadcast to every lane (`k` checked against the
/// array's size, a constant).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn word<T, const A: usize>(words: &[T; A], k: usize) -> __m512i {
    assert!(
        4 * k + 4 <= std::mem::size_of::<[T; A]>(),
        "word {k} outside the array"
    );
    // SAFETY: the 4 bytes at `4k` lie inside `words` (asserted); unaligned reads are allowed.
    let w =
        unsafe { std::ptr::read_unaligned(words.as_ptr().cast::<u8>().add(4 * k).cast::<i32>()) };
    _mm512_set1_epi32(w)
}

/// Each row's result: its plane accumulators (lanes of `acc`) added in plane order.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn planes_added<const P: usize>(acc: [__m512; P]) -> [f32; LANES] {
    let mut sum = acc[0];
    for a in &acc[1..] {
        sum = _mm512_add_ps(sum, *a);
    }
    let mut out = [0f32; LANES];
    // SAFETY: 16 f32 into a [f32; 16].
    unsafe { _mm512_storeu_ps(out.as_mut_ptr(), sum) };
    out
}

/// Q2_K, 16 rows (`rb` bytes each, `nb` blocks) × `P` planes.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn q2_group<const P: usize>(
    w: &[u8],
    rb: usize,
    x: &[BlockQ8K],
    nb: usize,
    ahead: &[u8],
) -> [f32; LANES] {
    let rows = row_blocks::<84, LANES>(w, rb, nb);
    let planes: [&[BlockQ8K]; P] = std::array::from_fn(|p| &x[p * nb..(p + 1) * nb]);
    let mut acc = [_mm512_setzero_ps(); P];
    for b in 0..nb {
        super::prefetch_l2(super::clamped(ahead, b * LANES * 84, (b + 1) * LANES * 84));
        let head = transpose(&std::array::from_fn(|r| load64(&rows[r][b][..64], 0)));
        let tail = quads(&std::array::from_fn(|r| load64(&rows[r][b][20..], 0)));
        // Words 0 .. 16 from the first load, 16 .. 21 (bytes 64 .. 84) from the second's
        // columns 11 .. 16.
        let words = |k: usize| {
            if k < 16 {
                head[k]
            } else {
                column(&tail, k - 5)
            }
        };
        q2_block::<P>(&words, planes.map(|p| &p[b]), &mut acc);
    }
    planes_added(acc)
}

/// Steps 2 and 3 for one Q2_K block of 16 rows, `words(k)` giving word `k` of every row's block
/// (the 16 scale bytes in words 0 .. 4, the 64 code bytes in 4 .. 20, `(d, dmin)` in 20; taken
/// where used, so that no more vectors are live than the arithmetic needs), against the block
/// `ys` of each plane, added into the plane accumulators `acc`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn q2_block<const P: usize>(
    words: &impl Fn(usize) -> __m512i,
    ys: [&BlockQ8K; P],
    acc: &mut [__m512; P],
) {
    // The scale words with the mins cleared: scale `j` is the low nibble of byte `j`.
    let scales: [__m512i; 4] =
        std::array::from_fn(|k| _mm512_and_si512(words(k), _mm512_set1_epi8(0x0f)));
    let mut parts = [[_mm512_setzero_si512(); CHAINS]; P];
    q2_quarter::<0, 0, P>(words, &scales, ys, &mut parts);
    q2_quarter::<0, 1, P>(words, &scales, ys, &mut parts);
    q2_quarter::<1, 0, P>(words, &scales, ys, &mut parts);
    q2_quarter::<1, 1, P>(words, &scales, ys, &mut parts);
    let mut s = [_mm512_setzero_si512(); P];
    for (s, c) in s.iter_mut().zip(&parts) {
        *s = chains_added(c);
    }
    q2_value(words, ys, s, acc);
}

/// Step 3 of a Q2_K block for `P` activation rows, from their exact sums `s` (`S`): the mins
/// `M = Σ_j m_j·bsum_j` by eight `vpdpwssd` per row, then `d8·(d·f32(S) − dmin·f32(M))` added
/// into each row's accumulator, as `value_dmin`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn q2_value<const P: usize>(
    words: &impl Fn(usize) -> __m512i,
    ys: [&BlockQ8K; P],
    s: [__m512i; P],
    acc: &mut [__m512; P],
) {
    let mut m = [_mm512_setzero_si512(); P];
    for t in 0..8 {
        let pick = table(&PICK_PAIR[t % 2]);
        let mins = _mm512_srli_epi16::<4>(_mm512_shuffle_epi8(words(t / 2), pick));
        for p in 0..P {
            m[p] = _mm512_dpwssd_epi32(m[p], mins, word(&ys[p].bsums, t));
        }
    }
    let dd = words(20);
    let d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dd));
    let dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(dd)));
    for p in 0..P {
        let v = _mm512_sub_ps(
            _mm512_mul_ps(d, _mm512_cvtepi32_ps(s[p])),
            _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(m[p])),
        );
        acc[p] = _mm512_add_ps(acc[p], _mm512_mul_ps(_mm512_set1_ps(ys[p].d), v));
    }
}

/// Step 2 for code words `8N + 4H .. 8N + 4H + 4` (they share sub-block `8N + 2j + H` at every
/// shift `j`): their effective weights dotted with each plane into `s`. Code word `q` is block
/// word `4 + q`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn q2_quarter<const N: usize, const H: usize, const P: usize>(
    words: &impl Fn(usize) -> __m512i,
    scales: &[__m512i; 4],
    ys: [&BlockQ8K; P],
    s: &mut [[__m512i; CHAINS]; P],
) {
    let m3 = _mm512_set1_epi8(3);
    let cw: [__m512i; 4] = std::array::from_fn(|i| words(4 + 8 * N + 4 * H + i));
    for j in 0..4 {
        let sub = 8 * N + 2 * j + H;
        let sc = _mm512_shuffle_epi8(scales[sub / 4], table(&PICK_LOW[sub % 4]));
        let mut part = [_mm512_setzero_si512(); P];
        for (i, &c) in cw.iter().enumerate() {
            let q = _mm512_and_si512(srl16(c, 2 * j), m3);
            let kx = 32 * N + 8 * j + 4 * H + i;
            for p in 0..P {
                part[p] = _mm512_dpbusd_epi32(part[p], q, word(&ys[p].qs, kx));
            }
        }
        for (sp, &part) in s.iter_mut().zip(&part) {
            sp[j] = _mm512_dpwssd_epi32(sp[j], part, sc);
        }
    }
}

/// Independent i32 accumulators per activation row for a block's scaled sub-block sums, when
/// the block meets one or two rows (decode): shift `j` of a quarter adds into chain `j`, so
/// consecutive `vpdpwssd` do not wait on each other's latency (one chain per block bounded the
/// kernels). Against more rows ([`interleaved_tokens`]) the rows' own accumulators are
/// independent chains, and one per row keeps them in registers. The chains are added at the
/// block's end: exact i32 sums, in any order the same integers.
const CHAINS: usize = 4;

/// The block's sum of the `C` accumulators of one activation row (i32 adds, like the chains').
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn chains_added<const C: usize>(c: &[__m512i; C]) -> __m512i {
    let mut sum = c[0];
    for &v in &c[1..] {
        sum = _mm512_add_epi32(sum, v);
    }
    sum
}

/// `v`'s 16-bit lanes shifted right by `n` (a constant after inlining; 0, 2, 4 or 6).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn srl16(v: __m512i, n: usize) -> __m512i {
    match n {
        0 => v,
        2 => _mm512_srli_epi16::<2>(v),
        4 => _mm512_srli_epi16::<4>(v),
        _ => _mm512_srli_epi16::<6>(v),
    }
}

/// The 32-bit words of a row that start two bytes into word `w` of the columns `c` (`c[w]`'s
/// high half, then `c[w + 1]`'s low half).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn straddle(c: &[__m512i], w: usize) -> __m512i {
    _mm512_or_si512(
        _mm512_srli_epi32::<16>(c[w]),
        _mm512_slli_epi32::<16>(c[w + 1]),
    )
}

/// Q3_K, 16 rows (`rb` bytes each, `nb` blocks) × `P` planes. Per block each row's bytes
/// `0 .. 64` (`hmask`, then code bytes `0 .. 32`) and `46 .. 110` are loaded; of the second, the
/// words two bytes off give code words `8 ..`, the three scale words and `d`. Sub-block `j`'s
/// signed scale `sc_j − 32` (low four bits in scale byte `j mod 8`, nibble `j / 8`, high two in
/// byte `8 + j mod 4`, pair `j / 4`) sits in both 16-bit halves of its row's lane; the 3-bit codes
/// `q3 = q + 4·hbit` (the high bit of element `32k + l` is bit `k` of `hmask[l]`) go through
/// `maddubs` with the broadcast activation word and `vpdpwssd` by that scale, and the `− 4` of
/// `q3 − 4` is `− 4·Σ_j s_j·bsum_j`, eight `vpdpwssd` per plane of the scale pairs.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn q3_group<const P: usize>(
    w: &[u8],
    rb: usize,
    x: &[BlockQ8K],
    nb: usize,
    ahead: &[u8],
) -> [f32; LANES] {
    let rows = row_blocks::<110, LANES>(w, rb, nb);
    let planes: [&[BlockQ8K]; P] = std::array::from_fn(|p| &x[p * nb..(p + 1) * nb]);
    let mut acc = [_mm512_setzero_ps(); P];
    for b in 0..nb {
        super::prefetch_l2(super::clamped(
            ahead,
            b * LANES * 110,
            (b + 1) * LANES * 110,
        ));
        let head = transpose(&std::array::from_fn(|r| load64(&rows[r][b][..64], 0)));
        let tail = quads(&std::array::from_fn(|r| load64(&rows[r][b][46..], 0)));
        // Columns 4 .. 16 of the second load: words 46 + 4·(4 + i) .. of each row; the words two
        // bytes into them are block words 16 .. 27, and `d` is the high half of the last.
        let cols: [__m512i; 12] = std::array::from_fn(|i| column(&tail, 4 + i));
        let words = |k: usize| {
            if k < 16 {
                head[k]
            } else {
                straddle(&cols, k - 16)
            }
        };
        let d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(cols[11])));
        q3_block::<P, CHAINS>(&words, d, planes.map(|p| &p[b]), &mut acc);
    }
    planes_added(acc)
}

/// Whole 32-bit words of a Q3_K block (110 bytes: `hmask` in words 0 .. 8, the code bytes in
/// 8 .. 24, the 12 scale bytes in 24 .. 27, then `d`).
const Q3_WORDS: usize = 27;

/// [`q3_group`]'s work on one block of 16 rows, `words(k)` giving word `k` of every row's block
/// (where used, as for [`q2_block`]) and `d` their `d`, against the block `ys` of each plane,
/// added into `acc`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn q3_block<const P: usize, const C: usize>(
    words: &impl Fn(usize) -> __m512i,
    d: __m512,
    ys: [&BlockQ8K; P],
    acc: &mut [__m512; P],
) {
    // `six[v]`: the 6-bit scales `4v .. 4v + 4` of each row, one per byte of its lane. Scale
    // bytes 0 .. 8 (words 24, 25) hold the low four bits of scale `m` (low nibble of byte `m`)
    // and `m + 8` (high nibble); bits `2k .. 2k + 2` of byte `8 + m` (word 26) the high two of
    // scale `m + 4k`. Each is a nibble select (`c ? a : b` bitwise, imm 0xE4, `c` = 0x0f) of
    // the low bits and the high bits shifted to bits 4, 5, then the other bits cleared.
    let six = q3_six(words);
    // `sc[j]`: `sc_j − 32` as the low i16 of each lane, the high half zero.
    let sc: [__m512i; 16] = std::array::from_fn(|j| {
        let raw = _mm512_shuffle_epi8(six[j / 4], table(&PICK_LOW[j % 4]));
        _mm512_maskz_sub_epi16(0x5555_5555, raw, _mm512_set1_epi16(32))
    });
    let mut parts = [[_mm512_setzero_si512(); C]; P];
    q3_quarter::<0, 0, P, C>(words, &sc, ys, &mut parts);
    q3_quarter::<0, 1, P, C>(words, &sc, ys, &mut parts);
    q3_quarter::<1, 0, P, C>(words, &sc, ys, &mut parts);
    q3_quarter::<1, 1, P, C>(words, &sc, ys, &mut parts);
    let mut s = [_mm512_setzero_si512(); P];
    for (s, c) in s.iter_mut().zip(&parts) {
        *s = chains_added(c);
    }
    let mut corr = [_mm512_setzero_si512(); P];
    for t in 0..8 {
        // (s_2t, s_2t+1) in the low and high halves of each lane.
        let pair = _mm512_or_si512(sc[2 * t], _mm512_slli_epi32::<16>(sc[2 * t + 1]));
        for p in 0..P {
            corr[p] = _mm512_dpwssd_epi32(corr[p], pair, word(&ys[p].bsums, t));
        }
    }
    for p in 0..P {
        let sum = _mm512_sub_epi32(s[p], _mm512_slli_epi32::<2>(corr[p]));
        // d8·(d·S), as `value_d`.
        let v = _mm512_mul_ps(d, _mm512_cvtepi32_ps(sum));
        acc[p] = _mm512_add_ps(acc[p], _mm512_mul_ps(_mm512_set1_ps(ys[p].d), v));
    }
}

/// The 6-bit scales of a Q3_K block of 16 rows: vector `v` holds scales `4v .. 4v + 4` of each
/// row, one per byte of its lane (the decode [`q3_block`]'s note describes).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn q3_six(words: &impl Fn(usize) -> __m512i) -> [__m512i; 4] {
    let (l0, l1, h) = (words(24), words(25), words(26));
    let (m0f, m3f) = (_mm512_set1_epi8(0x0f), _mm512_set1_epi8(0x3f));
    [
        (l0, _mm512_slli_epi32::<4>(h)),
        (l1, _mm512_slli_epi32::<2>(h)),
        (_mm512_srli_epi32::<4>(l0), h),
        (_mm512_srli_epi32::<4>(l1), _mm512_srli_epi32::<2>(h)),
    ]
    .map(|(lo, hi)| _mm512_and_si512(_mm512_ternarylogic_epi32::<0xe4>(lo, hi, m0f), m3f))
}

/// The scales of a block of 16 interleaved rows that the tile kernels' epilogue needs, lane `r`
/// for row `r`: `d`, `dmin` (Q2_K; zero for Q3_K) and the eight min pairs (Q2_K: word `t` holds
/// `m_2t` in its low and `m_2t+1` in its high 16 bits; zero for Q3_K).
pub(crate) struct LaneScales {
    pub(crate) d: [f32; LANES],
    pub(crate) dmin: [f32; LANES],
    pub(crate) mins: [[i32; LANES]; 8],
}

/// The 16 f32 lanes of `v` as an array.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn f32_lanes(v: __m512) -> [f32; LANES] {
    let mut out = [0f32; LANES];
    // SAFETY: 16 f32 into a [f32; 16].
    unsafe { _mm512_storeu_ps(out.as_mut_ptr(), v) };
    out
}

/// The 16 i32 lanes of `v` as an array.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn i32_lanes(v: __m512i) -> [i32; LANES] {
    let mut out = [0i32; LANES];
    // SAFETY: 16 i32 into a [i32; 16].
    unsafe { _mm512_storeu_si512(out.as_mut_ptr().cast(), v) };
    out
}

/// Stores `v` as the 64 bytes of `out` from `at` (checked).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn store64(out: &mut [u8], at: usize, v: __m512i) {
    let out = &mut out[at..at + 64];
    // SAFETY: 64 writable bytes (a bounds-checked slice); storeu needs no alignment.
    unsafe { _mm512_storeu_si512(out.as_mut_ptr().cast(), v) }
}

/// The tile kernels' unpacking of one interleaved Q2_K block of 16 rows (`blk`, 1344 bytes:
/// `vnni::q2_prep`'s effective weights `q·sc` for every row at once): word `k` (codes `4k ..
/// 4k + 4`, element order) of row `r` into `out[64k + 4r ..]`, as [`q2_block_scaled`] scales
/// them; the scales as [`q2_value`] reads them.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) fn q2_unpack(blk: &[u8], out: &mut [u8; 64 * 64]) -> LaneScales {
    let words = |k: usize| load64(blk, 64 * k);
    let (m3, m15) = (_mm512_set1_epi8(3), _mm512_set1_epi32(0x000f_000f));
    for q0 in [0, 4, 8, 12] {
        let (n, h) = (q0 / 8, (q0 / 4) % 2);
        let cw: [__m512i; 4] = std::array::from_fn(|i| words(4 + q0 + i));
        for j in 0..4 {
            let sub = 8 * n + 2 * j + h;
            let sc = _mm512_and_si512(
                _mm512_shuffle_epi8(words(sub / 4), table(&PICK_TWICE[sub % 4])),
                m15,
            );
            for (i, &c) in cw.iter().enumerate() {
                let wq = _mm512_mullo_epi16(_mm512_and_si512(srl16(c, 2 * j), m3), sc);
                store64(out, 64 * (32 * n + 8 * j + 4 * h + i), wq);
            }
        }
    }
    let mins = std::array::from_fn(|t| {
        let pick = table(&PICK_PAIR[t % 2]);
        i32_lanes(_mm512_srli_epi16::<4>(_mm512_shuffle_epi8(
            words(t / 2),
            pick,
        )))
    });
    let dd = words(20);
    LaneScales {
        d: f32_lanes(_mm512_cvtph_ps(_mm512_cvtepi32_epi16(dd))),
        dmin: f32_lanes(_mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<
            16,
        >(dd)))),
        mins,
    }
}

/// Byte `m` of each 32-bit lane in all four of its bytes.
static REPLICATE: [[u8; 64]; 4] = [replicate(0), replicate(1), replicate(2), replicate(3)];

const fn replicate(m: usize) -> [u8; 64] {
    let mut t = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        t[i] = (i / 4 * 4 % 16 + m) as u8;
        i += 1;
    }
    t
}

/// The tile kernels' unpacking of one interleaved Q3_K block of 16 rows (`blk`, 1760 bytes:
/// `vnni::q3_prep`'s biased effective weights `(q3 − 4)·(sc − 32) + 127`, in 3 ..= 255, for
/// every row at once): word `k` of row `r` into `out[64k + 4r ..]`; `d` of each row.
///
/// Per sub-block, two `vpshufb` tables hold each row's four values for the low code bits `v`:
/// `(v − 4)·s + 127` (high bit clear) and `v·s + 127` (set), `s = sc − 32`, built by byte adds
/// (exact mod 256, and every value fits a byte); the index is `v` plus the row's place in its
/// 128-bit lane, and the high bit picks the table by a masked shuffle.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) fn q3_unpack(blk: &[u8], out: &mut [u8; 64 * 64]) -> LaneScales {
    let words = |k: usize| load64(blk, 64 * k);
    let six = q3_six(&words);
    let (m3, c127, c32) = (
        _mm512_set1_epi8(3),
        _mm512_set1_epi8(127),
        _mm512_set1_epi8(32),
    );
    // Byte `p` of a 128-bit lane belongs to the row whose table bytes start at `p & 12`.
    let rowsel = _mm512_set4_epi32(0x0c0c_0c0c, 0x0808_0808, 0x0404_0404, 0);
    for (n, h) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
        let cw: [__m512i; 4] = std::array::from_fn(|i| words(8 + 8 * n + 4 * h + i));
        let hm: [__m512i; 4] = std::array::from_fn(|i| words(4 * h + i));
        for j in 0..4 {
            let sub = 8 * n + 2 * j + h;
            let s = _mm512_sub_epi8(
                _mm512_shuffle_epi8(six[sub / 4], table(&REPLICATE[sub % 4])),
                c32,
            );
            let s2 = _mm512_add_epi8(s, s);
            let s4 = _mm512_add_epi8(s2, s2);
            // Byte `v` of each lane: 127 − 4s + v·s.
            let t0 = _mm512_sub_epi8(c127, s4);
            let t0 = _mm512_mask_add_epi8(t0, 0xaaaa_aaaa_aaaa_aaaa, t0, s);
            let t0 = _mm512_mask_add_epi8(t0, 0xcccc_cccc_cccc_cccc, t0, s2);
            let t1 = _mm512_add_epi8(t0, s4);
            let bit = _mm512_set1_epi8((1u8 << (4 * n + j)) as i8);
            for i in 0..4 {
                // (c >> 2j) & 3 | rowsel.
                let idx = _mm512_ternarylogic_epi32::<0xea>(srl16(cw[i], 2 * j), m3, rowsel);
                let high = _mm512_test_epi8_mask(hm[i], bit);
                let e = _mm512_mask_shuffle_epi8(_mm512_shuffle_epi8(t0, idx), high, t1, idx);
                store64(out, 64 * (32 * n + 8 * j + 4 * h + i), e);
            }
        }
    }
    let d = &blk[64 * Q3_WORDS..64 * Q3_WORDS + 32];
    // SAFETY: 32 readable bytes (a bounds-checked slice); loadu needs no alignment.
    let d = _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(d.as_ptr().cast()) });
    LaneScales {
        d: f32_lanes(d),
        dmin: [0.0; LANES],
        mins: [[0; LANES]; 8],
    }
}

/// [`q3_block`]'s products for code words `8N + 4H .. 8N + 4H + 4` (sub-block `8N + 2j + H` at
/// shift `j`, as for Q2_K): code word `q` is block word `8 + q`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn q3_quarter<const N: usize, const H: usize, const P: usize, const C: usize>(
    words: &impl Fn(usize) -> __m512i,
    sc: &[__m512i; 16],
    ys: [&BlockQ8K; P],
    s: &mut [[__m512i; C]; P],
) {
    let m3 = _mm512_set1_epi8(3);
    let cw: [__m512i; 4] = std::array::from_fn(|i| words(8 + 8 * N + 4 * H + i));
    for j in 0..4 {
        let sub = 8 * N + 2 * j + H;
        let bit = _mm512_set1_epi8((1u8 << (4 * N + j)) as i8);
        let mut part = [_mm512_setzero_si512(); P];
        for (i, &c) in cw.iter().enumerate() {
            let low = _mm512_and_si512(srl16(c, 2 * j), m3);
            // The high bits of elements 128N + 32j + l: bit 4N + j of hmask bytes l.
            let high = _mm512_test_epi8_mask(words(4 * H + i), bit);
            let q3 = _mm512_mask_add_epi8(low, high, low, _mm512_set1_epi8(4));
            let kx = 32 * N + 8 * j + 4 * H + i;
            for p in 0..P {
                part[p] = _mm512_dpbusd_epi32(part[p], q3, word(&ys[p].qs, kx));
            }
        }
        for (sp, &part) in s.iter_mut().zip(&part) {
            sp[j % C] = _mm512_dpwssd_epi32(sp[j % C], part, sc[sub]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The transpose moves lane `i` of vector `r` to lane `r` of vector `i`, and `column` picks
    /// the same vectors from the quads.
    #[test]
    fn transpose_and_column_move_every_word() {
        if !super::super::vnni::detected() {
            println!("note: no AVX-512 VNNI on this CPU: transpose check skipped");
            return;
        }
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        fn check() {
            let words: [[i32; 16]; 16] =
                std::array::from_fn(|r| std::array::from_fn(|i| (100 * r + i) as i32));
            // SAFETY: 16 i32 = 64 readable bytes each.
            let v: [__m512i; 16] =
                std::array::from_fn(|r| unsafe { _mm512_loadu_si512(words[r].as_ptr().cast()) });
            let t = transpose(&v);
            let u = quads(&v);
            for i in 0..16 {
                let mut got = [0i32; 16];
                let mut col = [0i32; 16];
                // SAFETY: 64 writable bytes each.
                unsafe { _mm512_storeu_si512(got.as_mut_ptr().cast(), t[i]) };
                // SAFETY: 64 writable bytes.
                unsafe { _mm512_storeu_si512(col.as_mut_ptr().cast(), column(&u, i)) };
                let want: [i32; 16] = std::array::from_fn(|r| words[r][i]);
                assert_eq!(got, want, "vector {i}");
                assert_eq!(col, want, "column {i}");
            }
        }
        // SAFETY: the features were detected above.
        unsafe { check() }
    }
}
