//! The 32-element ("legacy") block formats, IQ4_NL, and the FP4 formats MXFP4 and NVFP4.
//!
//! Layouts (llama.cpp `ggml/src/ggml-common.h`, MODEL.md §6) and arithmetic (`ggml-quants.c`
//! `dequantize_row_q4_0` … `dequantize_row_nvfp4`). In the 32-element formats byte `j` of `qs`
//! holds element `j` in its low nibble and element `j + 16` in its high nibble; the NVFP4 block
//! does the same per 16-element sub-block. Every product is `f32(q) · d` in f32, plus `m` in
//! the two formats with a min (`q·d + m`).

#![allow(non_camel_case_types)] // the format types keep ggml's names (Q2_K, IQ2_XXS)

use super::grids::{KVALUES_IQ4NL, KVALUES_MXFP4};
use super::{f16_at, BlockFormat};

/// Q4_0: `d` f16 @0, `qs[16]` @2; `y = (q − 8)·d`.
pub(super) struct Q4_0;

impl BlockFormat<32, 18> for Q4_0 {
    #[inline(always)]
    fn decode(b: &[u8; 18], y: &mut [f32; 32]) {
        let d = f16_at(b, 0);
        for j in 0..16 {
            let q = b[2 + j];
            y[j] = (i32::from(q & 0x0f) - 8) as f32 * d;
            y[j + 16] = (i32::from(q >> 4) - 8) as f32 * d;
        }
    }
}

/// Q4_1: `d` f16 @0, `m` f16 @2, `qs[16]` @4; `y = q·d + m`.
pub(super) struct Q4_1;

impl BlockFormat<32, 20> for Q4_1 {
    #[inline(always)]
    fn decode(b: &[u8; 20], y: &mut [f32; 32]) {
        let d = f16_at(b, 0);
        let m = f16_at(b, 2);
        for j in 0..16 {
            let q = b[4 + j];
            y[j] = f32::from(q & 0x0f) * d + m;
            y[j + 16] = f32::from(q >> 4) * d + m;
        }
    }
}

/// The fifth bits of Q5_0/Q5_1: bit `j` of the little-endian u32 `qh` belongs to element `j`.
#[inline(always)]
fn fifth_bits(qh: u32, j: usize) -> (u8, u8) {
    let lo = (((qh >> j) << 4) & 0x10) as u8;
    let hi = ((qh >> (j + 12)) & 0x10) as u8;
    (lo, hi)
}

/// Q5_0: `d` f16 @0, `qh` u32 @2, `qs[16]` @6; `y = (q − 16)·d` with 5-bit `q`.
pub(super) struct Q5_0;

impl BlockFormat<32, 22> for Q5_0 {
    #[inline(always)]
    fn decode(b: &[u8; 22], y: &mut [f32; 32]) {
        let d = f16_at(b, 0);
        let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
        for j in 0..16 {
            let q = b[6 + j];
            let (h0, h1) = fifth_bits(qh, j);
            y[j] = (i32::from((q & 0x0f) | h0) - 16) as f32 * d;
            y[j + 16] = (i32::from((q >> 4) | h1) - 16) as f32 * d;
        }
    }
}

/// Q5_1: `d` f16 @0, `m` f16 @2, `qh` u32 @4, `qs[16]` @8; `y = q·d + m` with 5-bit `q`.
pub(super) struct Q5_1;

impl BlockFormat<32, 24> for Q5_1 {
    #[inline(always)]
    fn decode(b: &[u8; 24], y: &mut [f32; 32]) {
        let d = f16_at(b, 0);
        let m = f16_at(b, 2);
        let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
        for j in 0..16 {
            let q = b[8 + j];
            let (h0, h1) = fifth_bits(qh, j);
            y[j] = f32::from((q & 0x0f) | h0) * d + m;
            y[j + 16] = f32::from((q >> 4) | h1) * d + m;
        }
    }
}

/// Q8_0: `d` f16 @0, `qs[32]` int8 @2; `y = q·d`.
pub(super) struct Q8_0;

impl BlockFormat<32, 34> for Q8_0 {
    #[inline(always)]
    fn decode(b: &[u8; 34], y: &mut [f32; 32]) {
        let d = f16_at(b, 0);
        for j in 0..32 {
            y[j] = f32::from(b[2 + j] as i8) * d;
        }
    }
}

/// IQ4_NL: `d` f16 @0, `qs[16]` @2; `y = d·kvalues_iq4nl[q]`.
pub(super) struct IQ4_NL;

impl BlockFormat<32, 18> for IQ4_NL {
    #[inline(always)]
    fn decode(b: &[u8; 18], y: &mut [f32; 32]) {
        let d = f16_at(b, 0);
        for j in 0..16 {
            let q = b[2 + j];
            y[j] = d * f32::from(KVALUES_IQ4NL[usize::from(q & 0x0f)]);
            y[j + 16] = d * f32::from(KVALUES_IQ4NL[usize::from(q >> 4)]);
        }
    }
}

/// Half the E8M0 scale `2^(e − 127)`, i.e. `2^(e − 128)`, built from its bits (ggml
/// `ggml_e8m0_to_fp32_half`, `ggml/src/ggml-impl.h`): the two smallest exponents are subnormal.
#[inline(always)]
pub(super) fn e8m0_to_f32_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        u32::from(e - 1) << 23
    };
    f32::from_bits(bits)
}

/// MXFP4 (OCP microscaling): E8M0 exponent byte @0, `qs[16]` @1;
/// `y = kvalues_mxfp4[q] · 2^(e − 128)` (the doubled E2M1 values times half the scale).
pub(super) struct MXFP4;

impl BlockFormat<32, 17> for MXFP4 {
    #[inline(always)]
    fn decode(b: &[u8; 17], y: &mut [f32; 32]) {
        let d = e8m0_to_f32_half(b[0]);
        for j in 0..16 {
            let q = b[1 + j];
            y[j] = f32::from(KVALUES_MXFP4[usize::from(q & 0x0f)]) * d;
            y[j + 16] = f32::from(KVALUES_MXFP4[usize::from(q >> 4)]) * d;
        }
    }
}

/// Half of an unsigned E4M3 scale (bias 7, bit 7 ignored), as ggml `ggml_ue4m3_to_fp32`
/// (`ggml/src/ggml-impl.h`): `0x00` and the NaN code `0x7F` give 0; exponent 0 is subnormal
/// (`man·2^−9`), otherwise `(1 + man/8)·2^(exp − 7)`; the result is halved. Every such value is
/// `m'·2^(e' − 11)` with `m' ≤ 15` and `e' ≥ 1`, so it is built exactly from a power of two.
#[inline(always)]
pub(super) fn ue4m3_to_f32_half(x: u8) -> f32 {
    if x == 0 || x == 0x7f {
        return 0.0;
    }
    let exp = u32::from((x >> 3) & 0x0f);
    let man = u32::from(x & 0x07);
    let (mant, e) = if exp == 0 { (man, 1) } else { (8 + man, exp) };
    // 2^(e − 11) is a normal f32 for e in 1..=15.
    mant as f32 * f32::from_bits((e + 127 - 11) << 23)
}

/// NVFP4: four UE4M3 sub-block scales @0..4, `qs[32]` @4; sub-block `s` (16 elements) uses
/// scale `s` and bytes `qs[8s .. 8s + 8]` (low nibble element `j`, high nibble `j + 8`);
/// `y = kvalues_mxfp4[q] · ue4m3(d_s)/2`.
pub(super) struct NVFP4;

impl BlockFormat<64, 36> for NVFP4 {
    #[inline(always)]
    fn decode(b: &[u8; 36], y: &mut [f32; 64]) {
        for s in 0..4 {
            let d = ue4m3_to_f32_half(b[s]);
            for j in 0..8 {
                let q = b[4 + 8 * s + j];
                y[16 * s + j] = f32::from(KVALUES_MXFP4[usize::from(q & 0x0f)]) * d;
                y[16 * s + j + 8] = f32::from(KVALUES_MXFP4[usize::from(q >> 4)]) * d;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// E8M0 is `2^(e − 127)` by the OCP MX spec; the decoder returns half of it.
    #[test]
    fn e8m0_half_is_a_power_of_two() {
        for e in 0u8..=254 {
            let want = 2f64.powi(i32::from(e) - 128);
            assert_eq!(f64::from(e8m0_to_f32_half(e)), want, "e = {e}");
        }
    }

    /// UE4M3 by its definition (bias 7, subnormal exponent 0), halved; 0x7F (NaN) reads as 0.
    #[test]
    fn ue4m3_half_matches_the_format_definition() {
        for x in 0u8..=255 {
            let exp = i32::from((x >> 3) & 0x0f);
            let man = f64::from(x & 0x07);
            let full = if exp == 0 {
                man * 2f64.powi(-9)
            } else {
                (1.0 + man / 8.0) * 2f64.powi(exp - 7)
            };
            let want = if x == 0x7f { 0.0 } else { full / 2.0 };
            assert_eq!(f64::from(ue4m3_to_f32_half(x)), want, "x = {x:#04x}");
        }
    }
}
