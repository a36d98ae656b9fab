//! Grid kernels: many weight rows against many packed Q8_K activation rows ([`Q8Tiles`]), with
//! the integer sums and f32 expressions of the scalar kernels, so every output has the
//! single-row kernel's bits. Two backends compute the integer sums: Intel AMX's tile unit
//! (`tdpbusd`, `amx.rs`) where the CPU and OS have it, else AVX-512 VNNI (`vpdpbusd`).
//!
//! Algorithm. Weight rows go 16 at a time (a `C` tile's rows), activation rows 16 at a time (its
//! columns; [`Q8Tiles`] holds them as `B` tiles: tile `c` of a group and block, row `rr`, holds
//! each activation row's codes `64c + 4rr .. 64c + 4rr + 4` as one 32-bit word, lane `t` for row
//! `t`). The 16 weight rows are unpacked block by block, each block just before its products (so
//! that it stays in L1), into the u8 effective weights of the VNNI kernels (`vnni.rs`; Q2_K
//! `q·sc`, Q3_K `(q3 − 4)·(sc − 32) + 127`), 256 bytes per block in element order: once per
//! weight block for all activation rows of the call. Then for each 256-element block and
//! activation group:
//! - the block's integer sum for all 16 × 16 (weight row, activation row) pairs (Q3_K: before
//!   its `−127·Σ x8` offset): AMX loads the 16 unpacked rows once per block as four `A` tiles
//!   and runs `tdpbusd` (u8 × i8, four products into each i32, exact) four times per group into
//!   a `C` tile (two groups at a time), which is stored; VNNI, for each of the 64 words `k` of
//!   the block, loads the group's tile row once and `vpdpbusd`s each weight row's broadcast word
//!   `k` with it into that row's 16 lanes, so lane `t` of row `r` ends as the pair's whole sum;
//! - epilogue: per weight row, 16 lanes of AVX-512 compute the block's value exactly as the
//!   scalar helper does per pair (`d8·(d·f32(S) − dmin·f32(M))` with `M = Σ_j m_j·bsum_j` by
//!   eight `vpdpwssd`, or `d8·(d·f32(S))`), added into the pair's f32 accumulator, blocks in
//!   order from `+0.0`.
//!
//! Interleaved weight rows (the fast store's experts) are unpacked on the VNNI backend 16 rows at
//! once with their words in the lanes (`lanes::q2_unpack`, `lanes::q3_unpack`) and kept in that
//! order (word `k` of row `r` at `64k + 4r`) for the broadcasts; a block's scales are kept lane
//! by lane (`LaneScales`: a per-row struct filled from the lanes compiles to scatters). A last
//! group of at most [`HALF`] activation rows goes through the VNNI backend at 256 bits (the tile
//! row's first eight lanes), for no more than half a group's cost.

use super::avx2_grid::grid_rows;
use super::avx2_many::q2_prep;
use super::lanes::{q2_unpack, q3_unpack, LaneScales};
use super::tiles::{CBuf, Q8Tiles, Unpacked, GROUP, HALF};
use super::vnni::q3_prep;
use super::Q8GridFn;
use crate::ggml_type::GgmlType;
use std::arch::x86_64::*;

/// The grid kernel of `ty` (Q2_K, Q3_K) on this CPU, or None (another type, or neither AMX nor
/// the AVX-512 features of `vnni::detected`).
pub(crate) fn grid_fn(ty: GgmlType) -> Option<Q8GridFn> {
    backend_kernel::<false>(ty)
}

/// [`grid_fn`] for weight rows in the interleaved layout (`super::interleave_rows`): a group of
/// 16 rows is one row group here, and each row's block is gathered from the group's words before
/// it is unpacked; the same bits.
pub(crate) fn grid_interleaved_fn(ty: GgmlType) -> Option<Q8GridFn> {
    backend_kernel::<true>(ty)
}

/// The kernel of the CPU's backend for rows in their own layout or interleaved (`IL`).
fn backend_kernel<const IL: bool>(ty: GgmlType) -> Option<Q8GridFn> {
    if crate::isa::isa().amx {
        kernel::<true, IL>(ty)
    } else if super::vnni::detected() {
        kernel::<false, IL>(ty)
    } else {
        None
    }
}

/// The VNNI grid kernel of `ty` even on a CPU with AMX (for tests), or None.
#[cfg(test)]
pub(crate) fn vnni_grid_fn(ty: GgmlType) -> Option<Q8GridFn> {
    super::vnni::detected()
        .then(|| kernel::<false, false>(ty))
        .flatten()
}

/// The kernel of `ty` with the AMX (`AMX`) or the VNNI backend, for rows in their own layout or
/// interleaved (`IL`); the caller has checked that the backend's features (and, for AMX, the OS
/// permission) are there.
fn kernel<const AMX: bool, const IL: bool>(ty: GgmlType) -> Option<Q8GridFn> {
    // SAFETY: (every wrapper below) `kernel` enables exactly the AVX-512 features of
    // `vnni::detected()`, which `grid_fn` saw (`amx::detected()` includes them), and the AMX
    // instructions run only when `amx::detected()` saw them and got the OS permission.
    macro_rules! wrap {
        ($b:literal, $mins:literal, $prep:ident, $lanes:ident) => {{
            #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
            fn kernel<const AMX: bool, const IL: bool>(w: &[u8], x: &Q8Tiles, y: &mut [f32]) {
                let unpack = |block: &[u8; $b], dst: &mut [u8]| {
                    let p = $prep(block);
                    for (k, v) in p.w.iter().enumerate() {
                        let dst = &mut dst[32 * k..32 * k + 32];
                        // SAFETY: 32 writable bytes (a bounds-checked slice).
                        unsafe { _mm256_storeu_si256(dst.as_mut_ptr().cast(), *v) };
                    }
                    p.into()
                };
                let lanes = |g: &[u8], dst: &mut [u8; GROUP * 256]| $lanes(g, dst);
                grid::<$b, $mins, AMX, IL>(w, x, y, unpack, lanes)
            }
            fn w<const AMX: bool, const IL: bool>(w: &[u8], x: &Q8Tiles, y: &mut [f32]) {
                // SAFETY: see above.
                unsafe { kernel::<AMX, IL>(w, x, y) }
            }
            w::<AMX, IL> as Q8GridFn
        }};
    }
    match ty {
        GgmlType::Q2_K => Some(wrap!(84, true, q2_prep, q2_unpack)),
        GgmlType::Q3_K => Some(wrap!(110, false, q3_prep, q3_unpack)),
        _ => None,
    }
}

/// A weight block's scales for the epilogue: `d`, `dmin` and the 16 mins as eight i32 words of
/// two i16 (Q2_K), or `d` alone (Q3_K).
#[derive(Clone, Copy)]
struct Scales {
    d: f32,
    dmin: f32,
    mins: [i32; 8],
}

impl Scales {
    const ZERO: Scales = Scales {
        d: 0.0,
        dmin: 0.0,
        mins: [0; 8],
    };
}

impl LaneScales {
    const ZERO: LaneScales = LaneScales {
        d: [0.0; GROUP],
        dmin: [0.0; GROUP],
        mins: [[0; GROUP]; 8],
    };

    /// Row `r`'s scales.
    fn set(&mut self, r: usize, s: Scales) {
        self.d[r] = s.d;
        self.dmin[r] = s.dmin;
        for (m, v) in self.mins.iter_mut().zip(s.mins) {
            m[r] = v;
        }
    }
}

impl From<super::avx2_many::Q2> for Scales {
    fn from(p: super::avx2_many::Q2) -> Scales {
        let mut mins = [0i32; 8];
        // SAFETY: 32 bytes into an [i32; 8].
        unsafe { _mm256_storeu_si256(mins.as_mut_ptr().cast(), p.mins) };
        Scales {
            d: p.d,
            dmin: p.dmin,
            mins,
        }
    }
}

impl From<super::vnni::Q3> for Scales {
    fn from(p: super::vnni::Q3) -> Scales {
        Scales {
            d: p.d,
            ..Scales::ZERO
        }
    }
}

/// The grid loop (module note) for blocks of `B` bytes, `unpack` writing a block's effective
/// weights (256 bytes) and returning its scales, `lanes` the same for an interleaved block of 16
/// rows with the words in the lanes; `MINS` selects Q2_K's epilogue, else Q3_K's; `AMX` the
/// backend; `IL` weight rows in the interleaved layout.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn grid<const B: usize, const MINS: bool, const AMX: bool, const IL: bool>(
    w: &[u8],
    x: &Q8Tiles,
    y: &mut [f32],
    mut unpack: impl FnMut(&[u8; B], &mut [u8]) -> Scales,
    mut lanes: impl FnMut(&[u8], &mut [u8; GROUP * 256]) -> LaneScales,
) {
    let Some(n) = grid_rows(w, x, y, B) else {
        return;
    };
    if IL
        && !super::lengths_ok(n.is_multiple_of(GROUP), y, |outs| {
            format!("Q8_K grid: {n} interleaved rows ({outs} outputs) are not whole groups")
        })
    {
        return;
    }
    let (rows, nb, groups) = (x.rows(), x.blocks(), x.groups());
    if y.is_empty() {
        return;
    }
    // Block `b` of the row group's 16 rows is unpacked just before its products, into `a` (4
    // KiB, the 16 rows' 256 bytes in a row: row-major rows of 4096 elements lie 4 KiB apart and
    // would share the L1 cache sets) and `sc`, so that both stay in L1 (the whole row group
    // unpacked first is 72 KiB at 4096 columns). Interleaved rows on the VNNI backend are
    // unpacked with their words in the lanes, 16 rows at once ([`q2_unpack`]); AMX loads
    // row-by-row tiles.
    let in_lanes = IL && !AMX;
    let mut a = Unpacked([0; GROUP * 256]);
    let mut sc = LaneScales::ZERO;
    let mut c = CBuf([[0; GROUP * GROUP]; 2]);
    let mut acc = vec![[_mm512_setzero_ps(); GROUP]; groups];
    if AMX {
        // SAFETY: the CPU has AMX and the OS granted it (checked before this kernel was handed
        // out).
        unsafe { super::amx::configure() };
    }
    for r0 in (0..n).step_by(GROUP) {
        let nr = GROUP.min(n - r0);
        for g in acc.iter_mut() {
            *g = [_mm512_setzero_ps(); GROUP];
        }
        let group = &w[r0 * nb * B..(r0 + nr) * nb * B];
        // Rows past a last group's end: zero codes and scales (no block of the group writes
        // them; interleaved groups are whole).
        a.0[256 * nr..].fill(0);
        for r in nr..GROUP {
            sc.set(r, Scales::ZERO);
        }
        // The next row group's weights, prefetched into L2 a block's share at a time while this
        // group is computed (its unpacking would wait on reads from memory otherwise).
        let next = super::clamped(w, (r0 + GROUP) * nb * B, (r0 + 2 * GROUP) * nb * B);
        for b in 0..nb {
            if IL {
                // The interleaved layout keeps a block of the 16 rows together.
                let g = &group[b * GROUP * B..(b + 1) * GROUP * B];
                if in_lanes {
                    sc = lanes(g, &mut a.0);
                } else {
                    // Row `r`'s block, gathered from the 16 rows' block (module note of
                    // `lanes.rs`'s layout): whole words at `64k + 4r`, the rest at
                    // `64·⌊B/4⌋ + r·(B mod 4)`.
                    let (words, rest) = (B / 4, B % 4);
                    let mut block = [0u8; B];
                    for r in 0..GROUP {
                        for k in 0..words {
                            let at = 64 * k + 4 * r;
                            block[4 * k..4 * k + 4].copy_from_slice(&g[at..at + 4]);
                        }
                        let at = 64 * words + r * rest;
                        block[4 * words..].copy_from_slice(&g[at..at + rest]);
                        let s = unpack(&block, a.row(r));
                        sc.set(r, s);
                    }
                }
            } else {
                let rows_b = group.as_chunks::<B>().0.iter().skip(b).step_by(nb);
                for (r, block) in rows_b.enumerate() {
                    let s = unpack(block, a.row(r));
                    sc.set(r, s);
                }
            }
            super::prefetch_l2(super::clamped(next, b * GROUP * B, (b + 1) * GROUP * B));
            if AMX {
                // SAFETY: as above.
                unsafe { super::amx::load_weights(&a) };
            }
            let mut g = 0;
            while g < groups {
                let done = if AMX {
                    // SAFETY: as above; groups `g` (and `g + 1`) exist in `x`.
                    unsafe { super::amx::sums(x, g, b, &mut c) }
                } else {
                    let (a, half) = (&a, rows - g * GROUP <= HALF);
                    match (in_lanes, half) {
                        (true, true) => vnni_sums::<__m256i, true>(a, b, x, g, &mut c),
                        (true, false) => vnni_sums::<__m512i, true>(a, b, x, g, &mut c),
                        (false, true) => vnni_sums::<__m256i, false>(a, b, x, g, &mut c),
                        (false, false) => vnni_sums::<__m512i, false>(a, b, x, g, &mut c),
                    }
                    1
                };
                for (h, cg) in c.0.iter().enumerate().take(done) {
                    epilogue::<MINS>(cg, x, (g + h) * nb + b, &sc, nr, &mut acc[g + h]);
                }
                g += done;
            }
        }
        let mut lanes = [0f32; GROUP];
        for (g, accg) in acc.iter().enumerate() {
            let t0 = g * GROUP;
            let valid = GROUP.min(rows - t0);
            for (r, v) in accg.iter().enumerate().take(nr) {
                // SAFETY: 16 f32 into a [f32; 16].
                unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), *v) };
                let at = (r0 + r) * rows + t0;
                y[at..at + valid].copy_from_slice(&lanes[..valid]);
            }
        }
    }
    if AMX {
        // SAFETY: releases this thread's tile state (AMX granted, see above).
        unsafe { super::amx::release() };
    }
}

/// A vector of i32 lanes for [`vnni_sums`]: all 16 of a tile row (`__m512i`) or its first
/// [`HALF`] (`__m256i`, for a last group of at most that many activation rows).
trait SumLanes: Copy {
    fn zero() -> Self;
    /// The first lanes of the 64-byte tile row at `row`.
    fn load(row: &[u8]) -> Self;
    /// `acc + Σ_4 u8(word) · i8(x)` per lane.
    fn dpbusd(acc: Self, word: i32, x: Self) -> Self;
    /// The lanes into `dst` (16 i32), the rest of it zero.
    fn store(self, dst: &mut [i32]);
}

impl SumLanes for __m512i {
    #[inline(always)]
    fn zero() -> Self {
        // SAFETY: AVX-512F (every caller is compiled with the features of `vnni::detected`).
        unsafe { _mm512_setzero_si512() }
    }
    #[inline(always)]
    fn load(row: &[u8]) -> Self {
        let row = &row[..64];
        // SAFETY: 64 readable bytes; loadu needs no alignment.
        unsafe { _mm512_loadu_si512(row.as_ptr().cast()) }
    }
    #[inline(always)]
    fn dpbusd(acc: Self, word: i32, x: Self) -> Self {
        // SAFETY: AVX-512 VNNI, as above.
        unsafe { _mm512_dpbusd_epi32(acc, _mm512_set1_epi32(word), x) }
    }
    #[inline(always)]
    fn store(self, dst: &mut [i32]) {
        let dst = &mut dst[..GROUP];
        // SAFETY: 16 i32 into a slice of 16.
        unsafe { _mm512_storeu_si512(dst.as_mut_ptr().cast(), self) }
    }
}

impl SumLanes for __m256i {
    #[inline(always)]
    fn zero() -> Self {
        // SAFETY: AVX (as above).
        unsafe { _mm256_setzero_si256() }
    }
    #[inline(always)]
    fn load(row: &[u8]) -> Self {
        let row = &row[..32];
        // SAFETY: 32 readable bytes; loadu needs no alignment.
        unsafe { _mm256_loadu_si256(row.as_ptr().cast()) }
    }
    #[inline(always)]
    fn dpbusd(acc: Self, word: i32, x: Self) -> Self {
        // SAFETY: AVX-512 VNNI with VL, as above.
        unsafe { _mm256_dpbusd_epi32(acc, _mm256_set1_epi32(word), x) }
    }
    #[inline(always)]
    fn store(self, dst: &mut [i32]) {
        let dst = &mut dst[..GROUP];
        // SAFETY: 16 i32 into a slice of 16 (the lanes past `HALF` zero).
        unsafe { _mm512_storeu_si512(dst.as_mut_ptr().cast(), _mm512_zextsi256_si512(self)) }
    }
}

/// The VNNI backend's integer sums of block `b` for activation group `g` into `c.0[0]` (row `r`
/// of the block's 16 unpacked weight rows `a`, row by row or with the words in the lanes (`WL`);
/// lane `t` for activation row `t`, in the lanes of `V`; module note).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn vnni_sums<V: SumLanes, const WL: bool>(
    a: &Unpacked,
    b: usize,
    x: &Q8Tiles,
    g: usize,
    c: &mut CBuf,
) {
    let nb = x.blocks();
    let tiles = &x.tiles[(g * nb + b) * 4..(g * nb + b) * 4 + 4];
    let mut acc = [V::zero(); GROUP];
    for (ci, tile) in tiles.iter().enumerate() {
        for rr in 0..GROUP {
            let xv = V::load(&tile.0[64 * rr..]);
            let k = GROUP * ci + rr;
            for (r, acc_r) in acc.iter_mut().enumerate() {
                let at = if WL { 64 * k + 4 * r } else { 256 * r + 4 * k };
                let word = &a.0[at..at + 4];
                // SAFETY: 4 readable bytes (a bounds-checked slice); unaligned reads are allowed.
                let word = unsafe { std::ptr::read_unaligned(word.as_ptr().cast::<i32>()) };
                *acc_r = V::dpbusd(*acc_r, word, xv);
            }
        }
    }
    for (dst, v) in c.0[0].chunks_exact_mut(GROUP).zip(acc) {
        v.store(dst);
    }
}

/// Adds block `gb`'s values for one activation group (the `C` tile `c`) into `acc`, one zmm of
/// 16 activation rows per weight row with scales `sc` (module note).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn epilogue<const MINS: bool>(
    c: &[i32; GROUP * GROUP],
    x: &Q8Tiles,
    gb: usize,
    sc: &LaneScales,
    nr: usize,
    acc: &mut [__m512; GROUP],
) {
    // SAFETY: (loads) each reads 16 lanes from an array of 16.
    let d8 = unsafe { _mm512_loadu_ps(x.d8[gb].as_ptr()) };
    let pairs: [__m512i; 8] =
        // SAFETY: 16 lanes read from an array of 16 (AVX-512F detected by the caller's dispatch).
        std::array::from_fn(|i| unsafe { _mm512_loadu_si512(x.pairs[gb][i].as_ptr().cast()) });
    // SAFETY: 16 lanes read from an array of 16 (AVX-512F detected by the caller's dispatch).
    let neg127 = unsafe { _mm512_loadu_si512(x.neg127[gb].as_ptr().cast()) };
    for (r, (a, cr)) in acc
        .iter_mut()
        .zip(c.chunks_exact(GROUP))
        .enumerate()
        .take(nr)
    {
        // SAFETY: 16 lanes read from an array of 16 (AVX-512F detected by the caller's dispatch).
        let sum = unsafe { _mm512_loadu_si512(cr.as_ptr().cast()) };
        let d = _mm512_set1_ps(sc.d[r]);
        let v = if MINS {
            let mut m = _mm512_setzero_si512();
            for (p, mn) in pairs.iter().zip(&sc.mins) {
                m = _mm512_dpwssd_epi32(m, *p, _mm512_set1_epi32(mn[r]));
            }
            _mm512_sub_ps(
                _mm512_mul_ps(d, _mm512_cvtepi32_ps(sum)),
                _mm512_mul_ps(_mm512_set1_ps(sc.dmin[r]), _mm512_cvtepi32_ps(m)),
            )
        } else {
            _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_add_epi32(sum, neg127)))
        };
        *a = _mm512_add_ps(*a, _mm512_mul_ps(d8, v));
    }
}
