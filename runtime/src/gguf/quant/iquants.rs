//! The i-quants: 256-element super-blocks whose groups of 8 (or 4) values are indices into a
//! fixed lattice grid, with separate sign bits (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S), a
//! ternary grid plus a shift (IQ1_S, IQ1_M), or a non-linear 4-bit codebook (IQ4_XS).
//!
//! Layouts from llama.cpp `ggml/src/ggml-common.h` (`block_iq2_xxs` … `block_iq4_xs`),
//! arithmetic from `ggml-quants.c` (`dequantize_row_iq2_xxs` l.2488, `_iq2_xs` l.2516,
//! `_iq2_s` l.2543, `_iq3_xxs` l.2575, `_iq3_s` l.2607, `_iq1_s` l.2650, `_iq1_m` l.2675,
//! `_iq4_xs` l.2743 at MODEL.md's [LCPP] commit). Each super-block is eight 32-element
//! sub-blocks with their own scale. The f32 expressions keep ggml's shape, e.g.
//! `db = d·(0.5 + s)·0.25` and `y = db·grid[j]·(±1)` — the sign is applied last, which is an
//! exact negation.

#![allow(non_camel_case_types)] // the format types keep ggml's names (Q2_K, IQ2_XXS)

use super::grids::{
    IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS,
    KVALUES_IQ4NL,
};
use super::{f16_at, BlockFormat};

/// The IQ1_S/IQ1_M grid shift `IQ1S_DELTA = IQ1M_DELTA` (`ggml-common.h`).
const IQ1_DELTA: f32 = 0.125;

/// Writes `db·grid[j]`, negated where bit `j` of `signs` is set, for the 8 bytes of one row of
/// an IQ2 grid.
#[inline(always)]
fn put_signed8(y: &mut [f32], db: f32, grid: u64, signs: u8) {
    let g = grid.to_le_bytes();
    for j in 0..8 {
        let v = db * f32::from(g[j]);
        y[j] = if signs & (1 << j) != 0 { -v } else { v };
    }
}

/// Writes `db·grid[j]`, negated where bit `j` of `signs` is set, for the 4 bytes of one row of
/// an IQ3 grid.
#[inline(always)]
fn put_signed4(y: &mut [f32], db: f32, grid: u32, signs: u8) {
    let g = grid.to_le_bytes();
    for j in 0..4 {
        let v = db * f32::from(g[j]);
        y[j] = if signs & (1 << j) != 0 { -v } else { v };
    }
}

#[inline(always)]
fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

#[inline(always)]
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// IQ2_XXS: `d` f16 @0, then per sub-block 8 bytes @`2 + 8ib`: four `iq2xxs_grid` indices and a
/// u32 holding four 7-bit `ksigns_iq2xs` indices and the 4-bit scale `s` (top bits);
/// `db = d·(0.5 + s)·0.25`.
pub(super) struct IQ2_XXS;

impl BlockFormat<256, 66> for IQ2_XXS {
    #[inline(always)]
    fn decode(b: &[u8; 66], y: &mut [f32; 256]) {
        let d = f16_at(b, 0);
        for ib in 0..8 {
            let at = 2 + 8 * ib;
            let aux = u32_at(b, at + 4);
            let db = d * (0.5 + (aux >> 28) as f32) * 0.25;
            for l in 0..4 {
                let grid = IQ2XXS_GRID[usize::from(b[at + l])];
                let signs = KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize];
                put_signed8(&mut y[32 * ib + 8 * l..], db, grid, signs);
            }
        }
    }
}

/// IQ2_XS: `d` f16 @0, `qs[32]` u16 @2 (9-bit `iq2xs_grid` index, 7-bit sign index), `scales[8]`
/// @66 (two 4-bit scales per sub-block, one per 16 elements); `db = d·(0.5 + s)·0.25`.
pub(super) struct IQ2_XS;

impl BlockFormat<256, 74> for IQ2_XS {
    #[inline(always)]
    fn decode(b: &[u8; 74], y: &mut [f32; 256]) {
        let d = f16_at(b, 0);
        for ib in 0..8 {
            let sc = b[66 + ib];
            let db = [
                d * (0.5 + f32::from(sc & 0x0f)) * 0.25,
                d * (0.5 + f32::from(sc >> 4)) * 0.25,
            ];
            for l in 0..4 {
                let q = u16_at(b, 2 + 2 * (4 * ib + l));
                let grid = IQ2XS_GRID[usize::from(q & 511)];
                let signs = KSIGNS_IQ2XS[usize::from(q >> 9)];
                put_signed8(&mut y[32 * ib + 8 * l..], db[l / 2], grid, signs);
            }
        }
    }
}

/// IQ2_S: `d` f16 @0, `qs[32]` @2 (low 8 bits of the `iq2s_grid` index), `signs[32]` @34 (one
/// explicit sign byte per 8 elements), `qh[8]` @66 (two high index bits per group),
/// `scales[8]` @74 (as IQ2_XS).
pub(super) struct IQ2_S;

impl BlockFormat<256, 82> for IQ2_S {
    #[inline(always)]
    fn decode(b: &[u8; 82], y: &mut [f32; 256]) {
        let d = f16_at(b, 0);
        for ib in 0..8 {
            let sc = b[74 + ib];
            let db = [
                d * (0.5 + f32::from(sc & 0x0f)) * 0.25,
                d * (0.5 + f32::from(sc >> 4)) * 0.25,
            ];
            let qh = usize::from(b[66 + ib]);
            for l in 0..4 {
                let idx = usize::from(b[2 + 4 * ib + l]) | ((qh << (8 - 2 * l)) & 0x300);
                let signs = b[34 + 4 * ib + l];
                put_signed8(&mut y[32 * ib + 8 * l..], db[l / 2], IQ2S_GRID[idx], signs);
            }
        }
    }
}

/// IQ3_XXS: `d` f16 @0, `qs[64]` @2 (`iq3xxs_grid` indices, 4 values each), then per sub-block
/// a u32 @`66 + 4ib` with four 7-bit sign indices and the 4-bit scale `s`;
/// `db = d·(0.5 + s)·0.5`.
pub(super) struct IQ3_XXS;

impl BlockFormat<256, 98> for IQ3_XXS {
    #[inline(always)]
    fn decode(b: &[u8; 98], y: &mut [f32; 256]) {
        let d = f16_at(b, 0);
        for ib in 0..8 {
            let aux = u32_at(b, 66 + 4 * ib);
            let db = d * (0.5 + (aux >> 28) as f32) * 0.5;
            for l in 0..4 {
                let signs = KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize];
                let g1 = IQ3XXS_GRID[usize::from(b[2 + 8 * ib + 2 * l])];
                let g2 = IQ3XXS_GRID[usize::from(b[2 + 8 * ib + 2 * l + 1])];
                let out = 32 * ib + 8 * l;
                put_signed4(&mut y[out..], db, g1, signs);
                put_signed4(&mut y[out + 4..], db, g2, signs >> 4);
            }
        }
    }
}

/// IQ3_S: `d` f16 @0, `qs[64]` @2 (low 8 bits of the `iq3s_grid` index), `qh[8]` @66 (ninth
/// index bit, one byte per sub-block), `signs[32]` @74, `scales[4]` @106 (two 4-bit scales per
/// byte, one per sub-block); `db = d·(1 + 2s)`.
pub(super) struct IQ3_S;

impl BlockFormat<256, 110> for IQ3_S {
    #[inline(always)]
    fn decode(b: &[u8; 110], y: &mut [f32; 256]) {
        let d = f16_at(b, 0);
        for ib in 0..8 {
            let sc = b[106 + ib / 2] >> (4 * (ib % 2));
            let db = d * (1 + 2 * i32::from(sc & 0x0f)) as f32;
            let qh = usize::from(b[66 + ib]);
            for l in 0..4 {
                let q1 = usize::from(b[2 + 8 * ib + 2 * l]) | ((qh << (8 - 2 * l)) & 256);
                let q2 = usize::from(b[2 + 8 * ib + 2 * l + 1]) | ((qh << (7 - 2 * l)) & 256);
                let signs = b[74 + 4 * ib + l];
                let out = 32 * ib + 8 * l;
                put_signed4(&mut y[out..], db, IQ3S_GRID[q1], signs);
                put_signed4(&mut y[out + 4..], db, IQ3S_GRID[q2], signs >> 4);
            }
        }
    }
}

/// Writes `dl·(grid[j] + delta)` for one row of `iq1s_grid` (int8 values −1, 0, +1).
#[inline(always)]
fn put_iq1(y: &mut [f32], dl: f32, grid: u64, delta: f32) {
    let g = grid.to_le_bytes();
    for j in 0..8 {
        y[j] = dl * (f32::from(g[j] as i8) + delta);
    }
}

/// IQ1_S: `d` f16 @0, `qs[32]` @2 (low 8 bits of the `iq1s_grid` index), `qh[8]` u16 @34 (per
/// sub-block: four 3-bit high index parts, a 3-bit scale `s` in bits 12..15, the delta sign in
/// bit 15); `dl = d·(2s + 1)`, `y = dl·(grid + ±0.125)`.
pub(super) struct IQ1_S;

impl BlockFormat<256, 50> for IQ1_S {
    #[inline(always)]
    fn decode(b: &[u8; 50], y: &mut [f32; 256]) {
        let d = f16_at(b, 0);
        for ib in 0..8 {
            let qh = u16_at(b, 34 + 2 * ib);
            let dl = d * (2 * i32::from((qh >> 12) & 7) + 1) as f32;
            let delta = if qh & 0x8000 != 0 {
                -IQ1_DELTA
            } else {
                IQ1_DELTA
            };
            for l in 0..4 {
                let idx = usize::from(b[2 + 4 * ib + l]) | (usize::from((qh >> (3 * l)) & 7) << 8);
                put_iq1(&mut y[32 * ib + 8 * l..], dl, IQ1S_GRID[idx], delta);
            }
        }
    }
}

/// IQ1_M: `qs[32]` @0 (low 8 bits of the `iq1s_grid` index), `qh[16]` @32 (per 8 elements a
/// nibble: 3 high index bits and the delta sign in bit 3), `scales[8]` @48 as four u16 (3-bit
/// scales, two per 16 elements of a sub-block, and the f16 `d` split over the top nibbles:
/// `sc0>>12 | (sc1>>8)&0xf0 | (sc2>>4)&0xf00 | sc3&0xf000`); `y = d·(2s + 1)·(grid ± 0.125)`.
pub(super) struct IQ1_M;

impl BlockFormat<256, 56> for IQ1_M {
    #[inline(always)]
    fn decode(b: &[u8; 56], y: &mut [f32; 256]) {
        let sc: [u16; 4] = std::array::from_fn(|k| u16_at(b, 48 + 2 * k));
        let d_bits =
            (sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000);
        let d = half::f16::from_bits(d_bits).to_f32();
        for ib in 0..8 {
            let s = sc[ib / 2] >> (6 * (ib % 2));
            let dl = [
                d * (2 * i32::from(s & 7) + 1) as f32,
                d * (2 * i32::from((s >> 3) & 7) + 1) as f32,
            ];
            for l in 0..4 {
                let nibble = usize::from(b[32 + 2 * ib + l / 2] >> (4 * (l % 2))) & 0x0f;
                let idx = usize::from(b[4 * ib + l]) | ((nibble & 7) << 8);
                let delta = if nibble & 8 != 0 {
                    -IQ1_DELTA
                } else {
                    IQ1_DELTA
                };
                put_iq1(&mut y[32 * ib + 8 * l..], dl[l / 2], IQ1S_GRID[idx], delta);
            }
        }
    }
}

/// IQ4_XS: `d` f16 @0, `scales_h` u16 @2 (2 high scale bits per sub-block), `scales_l[4]` @4
/// (4 low scale bits per sub-block), `qs[128]` @8 (per sub-block 16 bytes: low nibbles are
/// elements 0..16, high nibbles 16..32); `y = d·(ls − 32)·kvalues_iq4nl[q]`.
pub(super) struct IQ4_XS;

impl BlockFormat<256, 136> for IQ4_XS {
    #[inline(always)]
    fn decode(b: &[u8; 136], y: &mut [f32; 256]) {
        let d = f16_at(b, 0);
        let scales_h = u16_at(b, 2);
        for ib in 0..8 {
            let lo = (b[4 + ib / 2] >> (4 * (ib % 2))) & 0x0f;
            let hi = ((scales_h >> (2 * ib)) & 3) as u8;
            let dl = d * (i32::from(lo | (hi << 4)) - 32) as f32;
            for j in 0..16 {
                let q = b[8 + 16 * ib + j];
                y[32 * ib + j] = dl * f32::from(KVALUES_IQ4NL[usize::from(q & 0x0f)]);
                y[32 * ib + j + 16] = dl * f32::from(KVALUES_IQ4NL[usize::from(q >> 4)]);
            }
        }
    }
}
