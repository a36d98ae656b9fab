//! Portable reference kernels: the integer sums of the module doc's table computed element by
//! element in plain Rust, straight from the layouts of `kquants.rs` / `iquants.rs` /
//! `legacy.rs` (element `e` of a k-quant block belongs to 16-element sub-block `e / 16`, or
//! 32-element sub-block `e / 32`), then the shared f32 helpers of `shared.rs`.

#![allow(non_snake_case)] // the kernels keep ggml's type names (q2_K)

use super::block::BlockQ8K;
use super::shared::{
    dot_blocks, k4_scales_mins, q3_k_raw_scales, value_d, value_dmin, value_iq2, value_legacy,
};
use super::types::Q8DotFn;
use crate::ggml_type::GgmlType;
use crate::gguf::quant::f16_at;
use aubier_kernels_gen::quant_grids::{IQ2XS_GRID, IQ2XXS_GRID, KSIGNS_IQ2XS};

/// The scalar kernel of `ty`, or None.
pub(super) fn dot_fn(ty: GgmlType) -> Option<Q8DotFn> {
    Some(match ty {
        GgmlType::Q2_K => q2_K,
        GgmlType::Q3_K => q3_K,
        GgmlType::Q4_K => q4_K,
        GgmlType::Q5_K => q5_K,
        GgmlType::Q6_K => q6_K,
        GgmlType::IQ2_XXS => iq2_xxs,
        GgmlType::IQ2_XS => iq2_xs,
        GgmlType::Q4_0 => q4_0,
        GgmlType::Q8_0 => q8_0,
        _ => return None,
    })
}

fn x8(y: &BlockQ8K, e: usize) -> i32 {
    i32::from(y.qs[e])
}

/// The 16 sub-block dots `Σ_l code·x8` of a Q2_K/Q3_K block: for 32-byte chunk `n` (< 2) of
/// the 2-bit codes, crumb `j` (< 4, bits `2j .. 2j + 2`) of byte `i` (< 32) is element
/// `128n + 32j + i` of sub-block `8n + 2j + i / 16`; `code(n, j, i)` gives its code.
fn crumb_dots(y: &BlockQ8K, code: impl Fn(usize, usize, usize) -> i32) -> [i32; 16] {
    let mut dots = [0i32; 16];
    for n in 0..2 {
        for j in 0..4 {
            for i in 0..32 {
                dots[8 * n + 2 * j + i / 16] += code(n, j, i) * x8(y, 128 * n + 32 * j + i);
            }
        }
    }
    dots
}

fn q2_K(row: &[u8], x: &[BlockQ8K]) -> f32 {
    dot_blocks::<84>(row, x, |b, y| {
        let dots = crumb_dots(y, |n, j, i| i32::from((b[16 + 32 * n + i] >> (2 * j)) & 3));
        let (mut s, mut m) = (0i32, 0i32);
        for (sub, dot) in dots.into_iter().enumerate() {
            s += i32::from(b[sub] & 0x0f) * dot;
            m += i32::from(b[sub] >> 4) * i32::from(y.bsums[sub]);
        }
        value_dmin(y.d, f16_at(b, 80), f16_at(b, 82), s, m)
    })
}

fn q3_K(row: &[u8], x: &[BlockQ8K]) -> f32 {
    dot_blocks::<110>(row, x, |b, y| {
        let scales = q3_k_raw_scales(&b[96..108]);
        // q − 4·!hbit, the high bit of chunk n, crumb j in bit 4n + j of hmask[i].
        let dots = crumb_dots(y, |n, j, i| {
            let low = i32::from((b[32 + 32 * n + i] >> (2 * j)) & 3);
            let high = if b[i] & (1 << (4 * n + j)) != 0 { 0 } else { 4 };
            low - high
        });
        let s: i32 = (0..16)
            .map(|sub| (i32::from(scales[sub]) - 32) * dots[sub])
            .sum();
        value_d(y.d, f16_at(b, 108), s)
    })
}

/// Q4_K and Q5_K: `qs` at `QS`, the fifth bits (Q5_K) in `qh[32]` at 16.
#[inline(always)]
fn k4_block<const B: usize, const QS: usize, const FIVE: bool>(b: &[u8; B], y: &BlockQ8K) -> f32 {
    let (sc, mn) = k4_scales_mins(&b[4..16]);
    let (mut s, mut m) = (0i32, 0i32);
    for r in 0..4 {
        let mut dots = [0i32; 2];
        for l in 0..32 {
            let q = b[QS + 32 * r + l];
            let h = if FIVE { b[16 + l] >> (2 * r) } else { 0 };
            let lo = i32::from((q & 0x0f) | ((h & 1) << 4));
            let hi = i32::from((q >> 4) | ((h & 2) << 3));
            dots[0] += lo * x8(y, 64 * r + l);
            dots[1] += hi * x8(y, 64 * r + 32 + l);
        }
        for (k, dot) in dots.into_iter().enumerate() {
            let j = 2 * r + k;
            s += i32::from(sc[j]) * dot;
            m += i32::from(mn[j]) * (i32::from(y.bsums[2 * j]) + i32::from(y.bsums[2 * j + 1]));
        }
    }
    value_dmin(y.d, f16_at(b, 0), f16_at(b, 2), s, m)
}

fn q4_K(row: &[u8], x: &[BlockQ8K]) -> f32 {
    dot_blocks::<144>(row, x, k4_block::<144, 16, false>)
}

fn q5_K(row: &[u8], x: &[BlockQ8K]) -> f32 {
    dot_blocks::<176>(row, x, k4_block::<176, 48, true>)
}

fn q6_K(row: &[u8], x: &[BlockQ8K]) -> f32 {
    dot_blocks::<210>(row, x, |b, y| {
        let mut dots = [0i32; 16];
        for n in 0..2 {
            for l in 0..32 {
                let (ql0, ql1, h) = (b[64 * n + l], b[64 * n + 32 + l], b[128 + 32 * n + l]);
                let q = [
                    (ql0 & 0x0f) | ((h & 3) << 4),
                    (ql1 & 0x0f) | (((h >> 2) & 3) << 4),
                    (ql0 >> 4) | (((h >> 4) & 3) << 4),
                    (ql1 >> 4) | (((h >> 6) & 3) << 4),
                ];
                for (k, qk) in q.into_iter().enumerate() {
                    let e = 128 * n + 32 * k + l;
                    dots[e / 16] += (i32::from(qk) - 32) * x8(y, e);
                }
            }
        }
        let s: i32 = (0..16).map(|j| i32::from(b[192 + j] as i8) * dots[j]).sum();
        value_d(y.d, f16_at(b, 208), s)
    })
}

/// `Σ_k grid[k]·(±1)·x8[at + k]` over one 8-value grid row, the sign of `k` from bit `k`.
fn signed8(grid: u64, signs: u8, y: &BlockQ8K, at: usize) -> i32 {
    let g = grid.to_le_bytes();
    (0..8)
        .map(|k| {
            let v = i32::from(g[k]) * x8(y, at + k);
            if signs & (1 << k) != 0 {
                -v
            } else {
                v
            }
        })
        .sum()
}

fn iq2_xxs(row: &[u8], x: &[BlockQ8K]) -> f32 {
    dot_blocks::<66>(row, x, |b, y| {
        let mut s = 0i32;
        for ib in 0..8 {
            let at = 2 + 8 * ib;
            let aux = u32::from_le_bytes([b[at + 4], b[at + 5], b[at + 6], b[at + 7]]);
            let dot: i32 = (0..4)
                .map(|l| {
                    let grid = IQ2XXS_GRID[usize::from(b[at + l])];
                    let signs = KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize];
                    signed8(grid, signs, y, 32 * ib + 8 * l)
                })
                .sum();
            s += (2 * (aux >> 28) as i32 + 1) * dot;
        }
        value_iq2(y.d, f16_at(b, 0), s)
    })
}

fn iq2_xs(row: &[u8], x: &[BlockQ8K]) -> f32 {
    dot_blocks::<74>(row, x, |b, y| {
        let mut s = 0i32;
        for ib in 0..8 {
            let sc = b[66 + ib];
            for l in 0..4 {
                let q = u16::from_le_bytes([b[2 + 2 * (4 * ib + l)], b[3 + 2 * (4 * ib + l)]]);
                let grid = IQ2XS_GRID[usize::from(q & 511)];
                let signs = KSIGNS_IQ2XS[usize::from(q >> 9)];
                let scale = if l < 2 { sc & 0x0f } else { sc >> 4 };
                s += (2 * i32::from(scale) + 1) * signed8(grid, signs, y, 32 * ib + 8 * l);
            }
        }
        value_iq2(y.d, f16_at(b, 0), s)
    })
}

fn q4_0(row: &[u8], x: &[BlockQ8K]) -> f32 {
    dot_blocks::<144>(row, x, |b, y| {
        let s: [i32; 8] = std::array::from_fn(|k| {
            (0..16)
                .map(|j| {
                    let q = b[18 * k + 2 + j];
                    (i32::from(q & 0x0f) - 8) * x8(y, 32 * k + j)
                        + (i32::from(q >> 4) - 8) * x8(y, 32 * k + 16 + j)
                })
                .sum()
        });
        value_legacy(y.d, &std::array::from_fn(|k| f16_at(b, 18 * k)), &s)
    })
}

fn q8_0(row: &[u8], x: &[BlockQ8K]) -> f32 {
    dot_blocks::<272>(row, x, |b, y| {
        let s: [i32; 8] = std::array::from_fn(|k| {
            (0..32)
                .map(|j| i32::from(b[34 * k + 2 + j] as i8) * x8(y, 32 * k + j))
                .sum()
        });
        value_legacy(y.d, &std::array::from_fn(|k| f16_at(b, 34 * k)), &s)
    })
}
