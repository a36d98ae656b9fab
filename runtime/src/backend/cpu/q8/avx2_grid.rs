//! AVX2 grid kernels: many weight rows against many packed Q8_K activation rows ([`Q8Tiles`]),
//! Q2_K, Q3_K and Q6_K, with the integer sums and the f32 expression of the scalar kernels, so
//! that every output has the single-row kernel's bits — the contract of the AVX-512 grid
//! (`avx512/grid.rs`) on 256-bit integer arithmetic, without `vpdpbusd`.
//!
//! Algorithm. Weight rows go 16 at a time; block by block, the 16 rows' block is unpacked (once
//! per call, just before its products, so that it stays in L1) into their u8 codes in element
//! order (Q2_K `q` in 0..=3, Q3_K `q3 = q + 4·hbit` in 0..=7, Q6_K 0..=63: the AVX2 kernels'
//! unpacking) and the 16 sub-block scales (each an i32 word of two equal i16) and the eight
//! words of two i16 that multiply the activation block sums
//! (Q2_K: the mins, `M` apart; Q3_K: `−4·(sc − 32)`, Q6_K: `−32·sc`, both added into `S`).
//! Activation rows come in the tile layout's groups of 16 (`tiles.rs`: word `k` of the 16 rows'
//! block in one 64-byte tile row), taken as two halves of eight lanes (a last group of at most
//! [`HALF`] rows computes one half). For each block, group and [`RM`] weight rows (the register
//! tile: `RM` weight rows × 16 activation rows, one i32 lane per pair), per 16-element sub-block:
//! - per weight row, its four words of the sub-block broadcast, each `maddubs`ed with the
//!   activation rows' word (u8 × i8 neighbour pairs into i16) and the four summed in i16
//!   (|4·2·7·127| < 2^15; Q6_K, |2·2·63·127| < 2^15, in two sums of two words), then one `madd`
//!   by the scale word (the pair sums times the scale, widened to i32) added into the pair's
//!   lane: each activation vector is loaded once for `RM` weight rows, each weight word once
//!   for 16 activation rows, and no horizontal sum is left (lane `t` ends as the pair's sum);
//! - the block sums' term by eight `madd`s of the tile layout's pair words with the row's words;
//! - the scalar helper's expression lane by lane (`d8·(d·f32(S) − dmin·f32(M))` or
//!   `d8·(d·f32(S))`), added into the pair's f32 accumulator, blocks in order from `+0.0`.
//!
//! Learnt from llamafile's tinyBLAS (`llamafile/sgemm.cpp`: a register tile of weight rows ×
//! activation columns, each loaded operand reused across the other side) and ggml's repacked
//! K-quant GEMMs for AVX2 (`ggml-cpu/arch/x86/repack.cpp`: products summed per sub-block before
//! the scale `madd`); the code is our own.

use super::avx2::{
    f16_at, load16, load32, planes2, q2k_scales_mins, q3k_codes, q3k_scales, q6k_codes,
};
use super::shared::{clamped, lengths_ok, prefetch_l2};
use super::tiles::{Q8Tiles, Tile, Unpacked, GROUP, HALF};
use super::types::Q8GridFn;
use crate::ggml_type::GgmlType;
use std::arch::x86_64::*;

/// Weight rows of the register tile.
const RM: usize = 4;

/// The AVX2 grid kernel of `ty` (Q2_K, Q3_K, Q6_K), or None (another type, or the CPU lacks
/// AVX2, FMA or F16C).
pub(super) fn grid_fn(ty: GgmlType) -> Option<Q8GridFn> {
    if !super::avx2::detected() {
        return None;
    }
    // SAFETY: (every wrapper below) `kernel` enables AVX2, FMA and F16C, which `detected()`
    // just found; the wrapper is handed out only after that.
    macro_rules! wrap {
        ($b:literal, $mins:literal, $wide:literal, $unpack:ident) => {{
            #[target_feature(enable = "avx2,fma,f16c")]
            fn kernel(w: &[u8], x: &Q8Tiles, y: &mut [f32]) {
                grid::<$b, $mins, $wide>(w, x, y, |b, dst| $unpack(b, dst))
            }
            fn w(w: &[u8], x: &Q8Tiles, y: &mut [f32]) {
                // SAFETY: see above.
                unsafe { kernel(w, x, y) }
            }
            w as Q8GridFn
        }};
    }
    match ty {
        GgmlType::Q2_K => Some(wrap!(84, true, false, q2_unpack)),
        GgmlType::Q3_K => Some(wrap!(110, false, false, q3_unpack)),
        GgmlType::Q6_K => Some(wrap!(210, false, true, q6_unpack)),
        _ => None,
    }
}

/// The weight rows of a grid call with block bytes `bytes`: `Some(n)`, or None after filling
/// `y` with NaN when the lengths disagree (`debug_assert` in debug builds) — see
/// [`Q8GridFn`].
pub(super) fn grid_rows(w: &[u8], x: &Q8Tiles, y: &mut [f32], bytes: usize) -> Option<usize> {
    let rows = x.rows();
    let n = y.len().checked_div(rows).unwrap_or(0);
    let ok = n * rows == y.len() && w.len() == n * x.blocks() * bytes;
    let (wl, nb) = (w.len(), x.blocks());
    lengths_ok(ok, y, |outs| {
        format!(
            "Q8_K grid: weight bytes {wl} / packed rows {rows} of {nb} blocks / outputs {outs} \
             (block {bytes} bytes)"
        )
    })
    .then_some(n)
}

/// One weight row's block beside its codes: the 16 sub-block scales (two equal i16 per i32),
/// the eight words of two i16 that multiply the block sums, `d` and `dmin` (Q2_K).
#[derive(Clone, Copy)]
struct RowScales {
    sc: [i32; 16],
    sums: [i32; 8],
    d: f32,
    dmin: f32,
}

impl RowScales {
    const ZERO: RowScales = RowScales {
        sc: [0; 16],
        sums: [0; 8],
        d: 0.0,
        dmin: 0.0,
    };

    /// Scales `sc` and block-sum multipliers `sums`, each 16 i16 lanes in sub-block order, as
    /// words of two i16: `sc[j]` in both halves of word `j`, `sums[2i]` and `sums[2i + 1]` in
    /// word `i` (the lane order of `sums` is already that).
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    fn new(sc: __m256i, sums: __m256i, d: f32, dmin: f32) -> RowScales {
        let mut s = RowScales {
            d,
            dmin,
            ..RowScales::ZERO
        };
        // In-lane interleaves: `lo` = [s0 s0 .. s3 s3 | s8 s8 .. s11 s11], `hi` the rest.
        let (lo, hi) = (_mm256_unpacklo_epi16(sc, sc), _mm256_unpackhi_epi16(sc, sc));
        let words = [
            _mm256_permute2x128_si256::<0x20>(lo, hi),
            _mm256_permute2x128_si256::<0x31>(lo, hi),
        ];
        for (dst, v) in s.sc.as_chunks_mut::<8>().0.iter_mut().zip(words) {
            // SAFETY: 32 writable bytes (an array of eight i32).
            unsafe { _mm256_storeu_si256(dst.as_mut_ptr().cast(), v) };
        }
        // SAFETY: as above.
        unsafe { _mm256_storeu_si256(s.sums.as_mut_ptr().cast(), sums) };
        s
    }
}

/// Stores the codes of the two halves of a block, `half(0)` then `half(1)` (four vectors of 32
/// codes each, element order), into `dst`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn store_codes(dst: &mut [u8; 256], mut half: impl FnMut(usize) -> [__m256i; 4]) {
    for (n, d) in dst.as_chunks_mut::<128>().0.iter_mut().enumerate() {
        for (d, v) in d.as_chunks_mut::<32>().0.iter_mut().zip(half(n)) {
            // SAFETY: 32 writable bytes (an array of 32).
            unsafe { _mm256_storeu_si256(d.as_mut_ptr().cast(), v) };
        }
    }
}

/// Signed scales `sc` (Q3_K, Q6_K: 16 i16 lanes) whose codes are offset by `−2^K`: the block
/// sums' multipliers are `−2^K·sc`, added into `S`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn offset_scales<const K: i32>(sc: __m256i, d: f32) -> RowScales {
    let sums = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16::<K>(sc));
    RowScales::new(sc, sums, d, 0.0)
}

/// Q2_K: codes `q` (0..=3), scales `sc`, the mins for `M`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn q2_unpack(b: &[u8; 84], dst: &mut [u8; 256]) -> RowScales {
    store_codes(dst, |n| planes2(load32(&b[16 + 32 * n..])));
    let (bytes, mins) = q2k_scales_mins(b);
    let sc = _mm256_cvtepu8_epi16(_mm256_castsi256_si128(bytes));
    RowScales::new(sc, mins, f16_at(b, 80), f16_at(b, 82))
}

/// Q3_K: codes `q3` (0..=7), scales `sc − 32`, and `−4·(sc − 32)` for the block sums.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn q3_unpack(b: &[u8; 110], dst: &mut [u8; 256]) -> RowScales {
    store_codes(dst, |n| q3k_codes(b, n));
    offset_scales::<2>(q3k_scales(b), f16_at(b, 108))
}

/// Q6_K: codes (0..=63), scales `sc` (i8), and `−32·sc` for the block sums.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn q6_unpack(b: &[u8; 210], dst: &mut [u8; 256]) -> RowScales {
    store_codes(dst, |n| q6k_codes(b, n));
    offset_scales::<5>(_mm256_cvtepi8_epi16(load16(&b[192..208])), f16_at(b, 208))
}

/// The grid loop (module note) for blocks of `B` bytes, `unpack` writing a block's codes and
/// returning its scales; `MINS` selects Q2_K's expression, else Q3_K's and Q6_K's; `WIDE` the
/// sums of two words in i16 (Q6_K's codes), else of four.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn grid<const B: usize, const MINS: bool, const WIDE: bool>(
    w: &[u8],
    x: &Q8Tiles,
    y: &mut [f32],
    mut unpack: impl FnMut(&[u8; B], &mut [u8; 256]) -> RowScales,
) {
    let Some(n) = grid_rows(w, x, y, B) else {
        return;
    };
    let groups = x.groups();
    if y.is_empty() {
        return;
    }
    SCRATCH.with_borrow_mut(|s| {
        s.fit(groups);
        grid_in::<B, MINS, WIDE>(w, x, y, n, &mut unpack, s);
    });
}

/// A thread's buffers of [`grid`], kept from call to call (fresh ones per call cost 3–4 % of
/// the kernel's time in `memset` and `memcpy`): one block of a row group's codes and scales
/// (6 KiB, in L1 while it is used) and the accumulators.
struct Scratch {
    codes: Unpacked,
    sc: [RowScales; GROUP],
    acc: Vec<[[__m256; 2]; GROUP]>,
}

impl Scratch {
    /// At least `groups` groups of accumulators.
    fn fit(&mut self, groups: usize) {
        if self.acc.len() < groups {
            // SAFETY: an all-zero `__m256` is eight `+0.0` (a plain value, no feature needed).
            self.acc
                .resize(groups, [[unsafe { std::mem::zeroed() }; 2]; GROUP]);
        }
    }
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = const {
        std::cell::RefCell::new(Scratch {
            codes: Unpacked([0; GROUP * 256]),
            sc: [RowScales::ZERO; GROUP],
            acc: Vec::new(),
        })
    };
}

/// [`grid`]'s loop for its `n` weight rows, in the buffers `s` (fitted to the call).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn grid_in<const B: usize, const MINS: bool, const WIDE: bool>(
    w: &[u8],
    x: &Q8Tiles,
    y: &mut [f32],
    n: usize,
    unpack: &mut impl FnMut(&[u8; B], &mut [u8; 256]) -> RowScales,
    s: &mut Scratch,
) {
    let (rows, nb, groups) = (x.rows(), x.blocks(), x.groups());
    // Block `b` of the row group's 16 rows is unpacked just before it is used (row `r`'s codes
    // at `codes`' row `r`, its scales at `sc[r]`), so that the stores and the reads of the codes
    // stay in L1 (the whole row group unpacked first, 90 KiB at 4096 columns, cost a quarter
    // of the time at 8 activation rows). Rows past a last group's end keep stale codes (of this
    // call or an earlier one), whose pairs are computed and never stored.
    let (codes, sc) = (&mut s.codes, &mut s.sc);
    let acc = &mut s.acc[..groups];
    for r0 in (0..n).step_by(GROUP) {
        let nr = GROUP.min(n - r0);
        for g in acc.iter_mut() {
            *g = [[_mm256_setzero_ps(); 2]; GROUP];
        }
        let group = w[r0 * nb * B..(r0 + nr) * nb * B].as_chunks::<B>().0;
        // The next row group's weights, prefetched into L2 a block's share at a time while this
        // group is computed.
        let next = clamped(w, (r0 + GROUP) * nb * B, (r0 + 2 * GROUP) * nb * B);
        for b in 0..nb {
            for (r, block) in group.iter().skip(b).step_by(nb).enumerate() {
                let dst: &mut [u8; 256] = codes.row(r).try_into().expect("256 bytes");
                sc[r] = unpack(block, dst);
            }
            prefetch_l2(clamped(next, b * GROUP * B, (b + 1) * GROUP * B));
            let rows_b = codes.0.as_chunks::<256>().0;
            for (g, accg) in acc.iter_mut().enumerate() {
                let gb = g * nb + b;
                let tiles: &[Tile; 4] = x.tiles[gb * 4..gb * 4 + 4].try_into().expect("4 tiles");
                let half = rows - g * GROUP <= HALF;
                for r in (0..nr).step_by(RM) {
                    let w4: &[[u8; 256]; RM] = rows_b[r..r + RM].try_into().expect("RM rows");
                    let s4: &[RowScales; RM] = sc[r..r + RM].try_into().expect("RM rows");
                    let a4: &mut [[__m256; 2]; RM] =
                        (&mut accg[r..r + RM]).try_into().expect("RM rows");
                    let s = half_sums::<0, WIDE>(w4, s4, tiles);
                    epilogue::<MINS>(s, 0, s4, x, gb, a4);
                    if !half {
                        let s = half_sums::<1, WIDE>(w4, s4, tiles);
                        epilogue::<MINS>(s, 1, s4, x, gb, a4);
                    }
                }
            }
        }
        let mut lanes = [0f32; GROUP];
        for (g, accg) in acc.iter().enumerate() {
            let t0 = g * GROUP;
            let valid = GROUP.min(rows - t0);
            for (r, v) in accg.iter().enumerate().take(nr) {
                for (dst, h) in lanes.as_chunks_mut::<HALF>().0.iter_mut().zip(v) {
                    // SAFETY: 8 f32 into an array of 8.
                    unsafe { _mm256_storeu_ps(dst.as_mut_ptr(), *h) };
                }
                let at = (r0 + r) * rows + t0;
                y[at..at + valid].copy_from_slice(&lanes[..valid]);
            }
        }
    }
}

/// The integer sums of one block for the [`RM`] weight rows `w` (codes, with scales `sc`) and
/// half `HI` of a group's activation rows (`tiles`, the block's four tiles): lane `t` of `[r]`
/// is `Σ_j sc_j · Σ_{16} q·x8` of weight row `r` and activation row `8·HI + t`, without the
/// block sums' term (module note). One half at a time: the `RM` accumulators and a sub-block's
/// four activation vectors stay in registers (both halves at once spilled them).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn half_sums<const HI: usize, const WIDE: bool>(
    w: &[[u8; 256]; RM],
    sc: &[RowScales; RM],
    tiles: &[Tile; 4],
) -> [__m256i; RM] {
    let mut acc = [_mm256_setzero_si256(); RM];
    for (c, tile) in tiles.iter().enumerate() {
        for q in 0..4 {
            // Sub-block `j`: words `4j .. 4j + 4`, rows `4q .. 4q + 4` of tile `c`.
            let j = 4 * c + q;
            let mut xv = [_mm256_setzero_si256(); 4];
            for (i, v) in xv.iter_mut().enumerate() {
                let at = 64 * (4 * q + i) + 32 * HI;
                // SAFETY: 32 readable bytes of the 1024 of a tile (`at + 32 ≤ 1024`).
                *v = unsafe { _mm256_loadu_si256(tile.0[at..at + 32].as_ptr().cast()) };
            }
            for ((wr, s), a) in w.iter().zip(sc).zip(acc.iter_mut()) {
                let mut p = [_mm256_setzero_si256(); 4];
                for (i, (pi, xi)) in p.iter_mut().zip(&xv).enumerate() {
                    let at = 4 * (4 * j + i);
                    let word = i32::from_le_bytes([wr[at], wr[at + 1], wr[at + 2], wr[at + 3]]);
                    *pi = _mm256_maddubs_epi16(_mm256_set1_epi32(word), *xi);
                }
                let scale = _mm256_set1_epi32(s.sc[j]);
                let v = if WIDE {
                    _mm256_add_epi32(
                        _mm256_madd_epi16(_mm256_add_epi16(p[0], p[1]), scale),
                        _mm256_madd_epi16(_mm256_add_epi16(p[2], p[3]), scale),
                    )
                } else {
                    let t = _mm256_add_epi16(
                        _mm256_add_epi16(p[0], p[1]),
                        _mm256_add_epi16(p[2], p[3]),
                    );
                    _mm256_madd_epi16(t, scale)
                };
                *a = _mm256_add_epi32(*a, v);
            }
        }
    }
    acc
}

/// Adds block `gb`'s values for half `h` of one activation group into `acc`, from the integer
/// sums `s` of [`half_sums`] and the rows' scales `sc` (module note).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn epilogue<const MINS: bool>(
    s: [__m256i; RM],
    h: usize,
    sc: &[RowScales; RM],
    x: &Q8Tiles,
    gb: usize,
    acc: &mut [[__m256; 2]; RM],
) {
    let lanes = HALF * h..HALF * h + HALF;
    // SAFETY: (loads) 8 lanes read from an array of 16 (`lanes` is inside it).
    let d8 = unsafe { _mm256_loadu_ps(x.d8[gb][lanes.clone()].as_ptr()) };
    let mut pairs = [_mm256_setzero_si256(); 8];
    for (p, words) in pairs.iter_mut().zip(&x.pairs[gb]) {
        // SAFETY: as above.
        *p = unsafe { _mm256_loadu_si256(words[lanes.clone()].as_ptr().cast()) };
    }
    for ((sr, r), a) in s.iter().zip(sc).zip(acc.iter_mut()) {
        let mut m = _mm256_setzero_si256();
        for (p, &v) in pairs.iter().zip(&r.sums) {
            m = _mm256_add_epi32(m, _mm256_madd_epi16(*p, _mm256_set1_epi32(v)));
        }
        let d = _mm256_set1_ps(r.d);
        let v = if MINS {
            _mm256_sub_ps(
                _mm256_mul_ps(d, _mm256_cvtepi32_ps(*sr)),
                _mm256_mul_ps(_mm256_set1_ps(r.dmin), _mm256_cvtepi32_ps(m)),
            )
        } else {
            _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_add_epi32(*sr, m)))
        };
        a[h] = _mm256_add_ps(a[h], _mm256_mul_ps(d8, v));
    }
}

#[cfg(test)]
mod tests {
    use super::super::{q8_dot_fn_scalar, quantize_row_q8k, BlockQ8K, QK_K};
    use super::*;

    /// A block of `ty` with every byte `0xff` (the largest codes: Q2_K 3, Q3_K 7, Q6_K 63), its
    /// scale bytes set to `scales`, and `d` (and Q2_K's `dmin`) 1.0.
    fn extreme_block(ty: GgmlType, scales: u8) -> Vec<u8> {
        let mut b = vec![0xffu8; ty.type_size()];
        let (scale_bytes, d_at) = match ty {
            GgmlType::Q2_K => (0..0, 80),
            GgmlType::Q3_K => (96..108, 108),
            _ => (192..208, 208),
        };
        b[scale_bytes].fill(scales);
        let one = half::f16::ONE.to_le_bytes();
        b[d_at..d_at + 2].copy_from_slice(&one);
        if ty == GgmlType::Q2_K {
            b[82..84].copy_from_slice(&one);
        }
        b
    }

    /// The widest integer sums the kernels meet: the largest codes against activations at ±127
    /// (Q6_K's two-word i16 sums reach 2·2·63·127 = 32004, Q3_K's four-word ones 7112), with
    /// scales at both ends, over a group and a half of activation rows (both halves, and the
    /// half-group path): every pair has the scalar kernel's bits.
    #[test]
    fn extreme_codes_and_activations_match_the_scalar_kernel() {
        let (nb, rows) = (2, 24);
        let x: Vec<f32> = (0..rows * nb * QK_K)
            .map(|i| match (i / (nb * QK_K)) % 3 {
                0 => 1.0,
                1 => -1.0,
                _ => [1.0, -1.0][i / 2 % 2],
            })
            .collect();
        let mut xq = vec![BlockQ8K::ZERO; rows * nb];
        quantize_row_q8k(&x, &mut xq).unwrap();
        assert!(xq.iter().all(|b| b.qs.iter().all(|q| q.abs() == 127)));
        let tiles = Q8Tiles::pack(&xq, rows).unwrap();
        for (ty, scales) in [
            (GgmlType::Q2_K, vec![0xff]),
            (GgmlType::Q3_K, vec![0xff, 0x00]),
            (GgmlType::Q6_K, vec![0x7f, 0x80]),
        ] {
            let Some(grid) = grid_fn(ty) else {
                println!("note: no AVX2 on this CPU, {ty}: skipped");
                continue;
            };
            let w: Vec<u8> = scales
                .iter()
                .flat_map(|&s| (0..nb).flat_map(move |_| extreme_block(ty, s)))
                .collect();
            let n = scales.len();
            let mut y = vec![1.5f32; n * rows];
            grid(&w, &tiles, &mut y);
            let slow = q8_dot_fn_scalar(ty).unwrap();
            let rb = w.len() / n;
            for i in 0..n {
                for j in 0..rows {
                    let want = slow(&w[i * rb..(i + 1) * rb], &xq[j * nb..(j + 1) * nb]);
                    let got = y[i * rows + j];
                    assert_eq!(got.to_bits(), want.to_bits(), "{ty} ({i}, {j})");
                }
            }
        }
    }
}
