//! The k-quants: 256-element super-blocks of 16 or 8 sub-blocks with quantized sub-block
//! scales (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K).
//!
//! Layouts from llama.cpp `ggml/src/ggml-common.h` (`block_q2_K` … `block_q6_K`), arithmetic
//! from `ggml-quants.c` (`dequantize_row_q2_K` l.961, `_q3_K` l.1305, `_q4_K` l.1529, `_q5_K`,
//! `_q6_K` l.1939 at MODEL.md's [LCPP] commit). Element order: the super-block is two (Q2_K,
//! Q3_K, Q6_K) or four (Q4_K, Q5_K) runs, and inside a run the bit planes of one stretch of `qs`
//! bytes come one after another (shift 0 first). The f32 expressions keep ggml's shape:
//! `dl = d·sc`, `ml = dmin·m`, then `y = dl·q − ml` (Q6_K: `y = d·sc·q`).

#![allow(non_camel_case_types)] // the format types keep ggml's names (Q2_K, IQ2_XXS)

use super::{f16_at, BlockFormat};

/// Q2_K: `scales[16]` @0 (low nibble scale, high nibble min), `qs[64]` @16 (2-bit),
/// `d` f16 @80, `dmin` f16 @82.
pub(super) struct Q2_K;

impl BlockFormat<256, 84> for Q2_K {
    #[inline(always)]
    fn decode(b: &[u8; 84], y: &mut [f32; 256]) {
        let d = f16_at(b, 80);
        let dmin = f16_at(b, 82);
        for n in 0..2 {
            let q = &b[16 + 32 * n..16 + 32 * n + 32];
            for j in 0..4 {
                let shift = 2 * j;
                for h in 0..2 {
                    let sc = b[8 * n + 2 * j + h];
                    let dl = d * f32::from(sc & 0x0f);
                    let ml = dmin * f32::from(sc >> 4);
                    let out = 128 * n + 32 * j + 16 * h;
                    for l in 0..16 {
                        let v = (q[16 * h + l] >> shift) & 3;
                        y[out + l] = dl * f32::from(v) - ml;
                    }
                }
            }
        }
    }
}

/// The 16 signed 6-bit scales of Q3_K from its 12 packed bytes: scale `j` has its low four
/// bits in `scales[j % 8]` (nibble `j / 8`) and its high two bits in `scales[8 + j % 4]`
/// (bit pair `j / 4`); the stored value is offset by 32.
#[inline(always)]
fn q3_k_scales(s: &[u8]) -> [i32; 16] {
    std::array::from_fn(|j| {
        let lo = (s[j % 8] >> (4 * (j / 8))) & 0x0f;
        let hi = (s[8 + j % 4] >> (2 * (j / 4))) & 0x03;
        i32::from(lo | (hi << 4)) - 32
    })
}

/// Q3_K: `hmask[32]` @0 (high bits), `qs[64]` @32 (low 2 bits), `scales[12]` @96 (6-bit,
/// packed), `d` f16 @108; `y = d·(sc − 32)·(q − 4·!hbit)`.
pub(super) struct Q3_K;

impl BlockFormat<256, 110> for Q3_K {
    #[inline(always)]
    fn decode(b: &[u8; 110], y: &mut [f32; 256]) {
        let d_all = f16_at(b, 108);
        let scales = q3_k_scales(&b[96..108]);
        let hmask = &b[0..32];
        for n in 0..2 {
            let q = &b[32 + 32 * n..32 + 32 * n + 32];
            for j in 0..4 {
                let shift = 2 * j;
                let m = 1u8 << (4 * n + j);
                for h in 0..2 {
                    let dl = d_all * scales[8 * n + 2 * j + h] as f32;
                    let out = 128 * n + 32 * j + 16 * h;
                    for l in 0..16 {
                        let low = i32::from((q[16 * h + l] >> shift) & 3);
                        let high = if hmask[16 * h + l] & m != 0 { 0 } else { 4 };
                        y[out + l] = dl * (low - high) as f32;
                    }
                }
            }
        }
    }
}

/// Scale and min `j` (0..8) of Q4_K/Q5_K from their 12 packed 6-bit bytes (ggml
/// `get_scale_min_k4`, `ggml-quants.c` l.880).
#[inline(always)]
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Q4_K: `d` f16 @0, `dmin` f16 @2, `scales[12]` @4, `qs[128]` @16; four runs of 64 elements,
/// low nibbles of 32 bytes then their high nibbles; `y = d·sc·q − dmin·m`.
pub(super) struct Q4_K;

impl BlockFormat<256, 144> for Q4_K {
    #[inline(always)]
    fn decode(b: &[u8; 144], y: &mut [f32; 256]) {
        let d = f16_at(b, 0);
        let min = f16_at(b, 2);
        let scales = &b[4..16];
        for r in 0..4 {
            let (sc1, m1) = scale_min_k4(2 * r, scales);
            let (sc2, m2) = scale_min_k4(2 * r + 1, scales);
            let (d1, m1) = (d * f32::from(sc1), min * f32::from(m1));
            let (d2, m2) = (d * f32::from(sc2), min * f32::from(m2));
            let q = &b[16 + 32 * r..16 + 32 * r + 32];
            for l in 0..32 {
                y[64 * r + l] = d1 * f32::from(q[l] & 0x0f) - m1;
                y[64 * r + 32 + l] = d2 * f32::from(q[l] >> 4) - m2;
            }
        }
    }
}

/// Q5_K: `d` f16 @0, `dmin` f16 @2, `scales[12]` @4, `qh[32]` @16, `qs[128]` @48; as Q4_K with
/// a fifth bit from `qh` (bit `2r` for the low-nibble run, `2r + 1` for the high one).
pub(super) struct Q5_K;

impl BlockFormat<256, 176> for Q5_K {
    #[inline(always)]
    fn decode(b: &[u8; 176], y: &mut [f32; 256]) {
        let d = f16_at(b, 0);
        let min = f16_at(b, 2);
        let scales = &b[4..16];
        let qh = &b[16..48];
        for r in 0..4 {
            let (sc1, m1) = scale_min_k4(2 * r, scales);
            let (sc2, m2) = scale_min_k4(2 * r + 1, scales);
            let (d1, m1) = (d * f32::from(sc1), min * f32::from(m1));
            let (d2, m2) = (d * f32::from(sc2), min * f32::from(m2));
            let u1 = 1u8 << (2 * r);
            let u2 = 2u8 << (2 * r);
            let ql = &b[48 + 32 * r..48 + 32 * r + 32];
            for l in 0..32 {
                let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
                let h2 = if qh[l] & u2 != 0 { 16 } else { 0 };
                y[64 * r + l] = d1 * f32::from((ql[l] & 0x0f) + h1) - m1;
                y[64 * r + 32 + l] = d2 * f32::from((ql[l] >> 4) + h2) - m2;
            }
        }
    }
}

/// Q6_K: `ql[128]` @0 (low 4 bits), `qh[64]` @128 (high 2 bits), `scales[16]` int8 @192,
/// `d` f16 @208; `y = d·sc·(q − 32)`, evaluated as `(d·sc)·q`.
pub(super) struct Q6_K;

impl BlockFormat<256, 210> for Q6_K {
    #[inline(always)]
    fn decode(b: &[u8; 210], y: &mut [f32; 256]) {
        let d = f16_at(b, 208);
        for n in 0..2 {
            let ql = &b[64 * n..64 * n + 64];
            let qh = &b[128 + 32 * n..128 + 32 * n + 32];
            let sc = &b[192 + 8 * n..192 + 8 * n + 8];
            let out = &mut y[128 * n..128 * n + 128];
            for l in 0..32 {
                let is = l / 16;
                let h = qh[l];
                let q1 = i32::from((ql[l] & 0x0f) | ((h & 3) << 4)) - 32;
                let q2 = i32::from((ql[l + 32] & 0x0f) | (((h >> 2) & 3) << 4)) - 32;
                let q3 = i32::from((ql[l] >> 4) | (((h >> 4) & 3) << 4)) - 32;
                let q4 = i32::from((ql[l + 32] >> 4) | (((h >> 6) & 3) << 4)) - 32;
                out[l] = d * f32::from(sc[is] as i8) * q1 as f32;
                out[l + 32] = d * f32::from(sc[is + 2] as i8) * q2 as f32;
                out[l + 64] = d * f32::from(sc[is + 4] as i8) * q3 as f32;
                out[l + 96] = d * f32::from(sc[is + 6] as i8) * q4 as f32;
            }
        }
    }
}
