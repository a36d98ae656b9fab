//! The helpers every Q8_K kernel file shares: the block loop, the f32 value expressions and the
//! scale unpacking of the `q8` module doc's table, the length checks and the prefetch hints. They
//! sit apart from the parent module so that the kernel files import them without importing it.

use super::block::BlockQ8K;
use super::types::{Q8DotFn, MAX_PLANES};

/// The row loop shared by every kernel: checks `row.len() == x.len() · B` (NaN otherwise, see
/// [`Q8DotFn`]) and adds `block(weights, activations)` over the blocks in order.
#[inline(always)]
pub(super) fn dot_blocks<const B: usize>(
    row: &[u8],
    x: &[BlockQ8K],
    mut block: impl FnMut(&[u8; B], &BlockQ8K) -> f32,
) -> f32 {
    debug_assert_eq!(row.len(), x.len() * B, "Q8_K dot: row bytes ≠ blocks · {B}");
    if row.len() != x.len() * B {
        return f32::NAN;
    }
    let (blocks, _) = row.as_chunks::<B>();
    let mut acc = 0.0f32;
    for (w, y) in blocks.iter().zip(x) {
        acc += block(w, y);
    }
    acc
}

/// `d8·(d·f32(S) − dmin·f32(M))` (Q2_K, Q4_K, Q5_K).
#[inline(always)]
pub(super) fn value_dmin(d8: f32, d: f32, dmin: f32, s: i32, m: i32) -> f32 {
    d8 * (d * s as f32 - dmin * m as f32)
}

/// `d8·(d·f32(S))` (Q3_K, Q6_K).
#[inline(always)]
pub(super) fn value_d(d8: f32, d: f32, s: i32) -> f32 {
    d8 * (d * s as f32)
}

/// `0.125·(d8·(d·f32(S)))` (IQ2_XXS, IQ2_XS).
#[inline(always)]
pub(super) fn value_iq2(d8: f32, d: f32, s: i32) -> f32 {
    0.125 * (d8 * (d * s as f32))
}

/// `d8·(((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7)))`, `p_k = d_k·f32(S_k)`, for the
/// eight 32-element blocks of Q4_0/Q8_0 (scales `d`, integer sums `s`).
#[inline(always)]
pub(super) fn value_legacy(d8: f32, d: &[f32; 8], s: &[i32; 8]) -> f32 {
    let p: [f32; 8] = std::array::from_fn(|k| d[k] * s[k] as f32);
    d8 * (((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7])))
}

/// The 16 six-bit Q3_K scales (still offset by 32) from their 12 packed bytes: scale `j` has
/// its low four bits in byte `j % 8` (nibble `j / 8`) and its high two in byte `8 + j % 4`
/// (pair `j / 4`); done four scales per u32.
#[inline(always)]
pub(super) fn q3_k_raw_scales(s: &[u8]) -> [u8; 16] {
    let a = |i: usize| u32::from_le_bytes([s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]]);
    let (a0, a1, a2) = (a(0), a(1), a(2));
    let (lo, hi) = (0x0f0f_0f0f_u32, 0x0303_0303_u32);
    let w = [
        (a0 & lo) | ((a2 & hi) << 4),
        (a1 & lo) | (((a2 >> 2) & hi) << 4),
        ((a0 >> 4) & lo) | (((a2 >> 4) & hi) << 4),
        ((a1 >> 4) & lo) | (((a2 >> 6) & hi) << 4),
    ];
    let mut out = [0u8; 16];
    for (o, v) in out.chunks_exact_mut(4).zip(w) {
        o.copy_from_slice(&v.to_le_bytes());
    }
    out
}

/// The eight 6-bit scales and eight 6-bit mins of Q4_K/Q5_K from their 12 packed bytes (ggml
/// `get_scale_min_k4`): `j < 4` in the low six bits of bytes `j` / `j + 4`, `j ≥ 4` split into a
/// nibble of byte `j + 4` and the top two bits of byte `j − 4` / `j`.
#[inline(always)]
pub(super) fn k4_scales_mins(q: &[u8]) -> ([u8; 8], [u8; 8]) {
    let a = |i: usize| u32::from_le_bytes([q[4 * i], q[4 * i + 1], q[4 * i + 2], q[4 * i + 3]]);
    let (u0, u1, u2) = (a(0), a(1), a(2));
    let (m6, m4, m2) = (0x3f3f_3f3f_u32, 0x0f0f_0f0f_u32, 0x0303_0303_u32);
    let sc_hi = (u2 & m4) | (((u0 >> 6) & m2) << 4);
    let m_hi = ((u2 >> 4) & m4) | (((u1 >> 6) & m2) << 4);
    let join = |lo: u32, hi: u32| {
        let mut o = [0u8; 8];
        o[..4].copy_from_slice(&lo.to_le_bytes());
        o[4..].copy_from_slice(&hi.to_le_bytes());
        o
    };
    (join(u0 & m6, sc_hi), join(u1 & m6, m_hi))
}

/// The end of every kernel's length check: `ok`, or else NaN in every `y` entry, after a
/// `debug_assert` (debug builds) with the message `what(y.len())`.
#[inline(always)]
pub(super) fn lengths_ok(ok: bool, y: &mut [f32], what: impl FnOnce(usize) -> String) -> bool {
    debug_assert!(ok, "{}", what(y.len()));
    if !ok {
        y.fill(f32::NAN);
    }
    ok
}

/// The length check of a [`Q8DotManyFn`] with `bytes` per weight block: `Some(nb)`, the blocks
/// per activation row, or None after filling `y` with NaN (`debug_assert` in debug builds).
///
/// [`Q8DotManyFn`]: super::Q8DotManyFn
#[inline(always)]
pub(super) fn many_blocks(
    row: &[u8],
    x: &[BlockQ8K],
    y: &mut [f32],
    bytes: usize,
) -> Option<usize> {
    let nb = row.len() / bytes;
    let ok = row.len() == nb * bytes && x.len() == nb * y.len();
    let (r, n) = (row.len(), x.len());
    lengths_ok(ok, y, |rows| {
        format!("Q8_K dot: row bytes {r} / x blocks {n} / rows {rows} (block {bytes} bytes)")
    })
    .then_some(nb)
}

/// The contract of a [`Q8DotManyFn`] kept by the single-row kernel `dot` (`bytes` per weight
/// block) once per activation row, after [`many_blocks`]' length check.
///
/// [`Q8DotManyFn`]: super::Q8DotManyFn
#[inline(always)]
pub(super) fn each_row(dot: Q8DotFn, bytes: usize, row: &[u8], x: &[BlockQ8K], y: &mut [f32]) {
    let Some(nb) = many_blocks(row, x, y, bytes) else {
        return;
    };
    for (j, o) in y.iter_mut().enumerate() {
        *o = dot(row, &x[j * nb..(j + 1) * nb]);
    }
}

/// The length check of a [`Q8RowsFn`] with `bytes` per weight block: `Some((nb, row bytes))`,
/// or None after filling `y` with NaN (`debug_assert` in debug builds).
///
/// [`Q8RowsFn`]: super::Q8RowsFn
#[inline(always)]
pub(super) fn rows_lengths(
    w: &[u8],
    x: &[BlockQ8K],
    planes: usize,
    y: &mut [f32],
    bytes: usize,
) -> Option<(usize, usize)> {
    let nb = x.len() / planes.max(1);
    let rb = nb * bytes;
    let ok =
        (1..=MAX_PLANES).contains(&planes) && x.len() == planes * nb && w.len() == y.len() * rb;
    let (wl, n) = (w.len(), x.len());
    lengths_ok(ok, y, |rows| {
        format!(
            "Q8_K rows: weight bytes {wl} / x blocks {n} / planes {planes} / rows {rows} \
             (block {bytes} bytes)"
        )
    })
    .then_some((nb, rb))
}

/// The `R` rows' blocks (`nb` of `B` bytes each) of the group `w` (`rb` bytes per row).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) fn row_blocks<const B: usize, const R: usize>(
    w: &[u8],
    rb: usize,
    nb: usize,
) -> [&[[u8; B]]; R] {
    std::array::from_fn(|r| {
        let (blocks, _) = w[r * rb..(r + 1) * rb].as_chunks::<B>();
        &blocks[..nb]
    })
}

/// `w[from .. to]`, both ends clamped to `w.len()` (empty past the end).
#[inline(always)]
pub(super) fn clamped(w: &[u8], from: usize, to: usize) -> &[u8] {
    &w[from.min(w.len())..to.min(w.len())]
}

/// Asks the CPU to start loading `bytes` into L1 (one hint per 64-byte line): the weight rows
/// after the next ones, while these are dotted. A hint, never a fault. The loop over `chunks`
/// stays a loop (one hint per iteration): unrolled into bursts of back-to-back `prefetcht0`,
/// the same hints slow the streams down.
#[inline(always)]
pub(super) fn prefetch(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    prefetch_hint::<{ std::arch::x86_64::_MM_HINT_T0 }>(bytes);
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

/// [`prefetch`] into L2 (`_MM_HINT_T1`): for rows further ahead than L1 holds next to the rows
/// being read.
#[inline(always)]
pub(super) fn prefetch_l2(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    prefetch_hint::<{ std::arch::x86_64::_MM_HINT_T1 }>(bytes);
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch_hint<const HINT: i32>(bytes: &[u8]) {
    for line in bytes.chunks(64) {
        // SAFETY: `_mm_prefetch` only hints the cache; the address is inside a live slice.
        unsafe { std::arch::x86_64::_mm_prefetch::<HINT>(line.as_ptr().cast()) };
    }
}
