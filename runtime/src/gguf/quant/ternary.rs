//! The ternary formats TQ1_0 and TQ2_0 (values `{−1, 0, +1}·d`, from BitNet b1.58-style models).
//!
//! Layouts from llama.cpp `ggml/src/ggml-common.h` (`block_tq1_0`, `block_tq2_0`), arithmetic
//! from `ggml-quants.c` (`dequantize_row_tq1_0`, `dequantize_row_tq2_0`): `y = f32(t − 1)·d`
//! with the trit `t ∈ {0, 1, 2}`.
//!
//! TQ1_0 packs five trits per byte as a base-3 fixed-point fraction: the byte is
//! `⌈v·256/243⌉` for the 5-trit number `v`, so multiplying the byte by `3^k` (mod 256) brings
//! trit `k` to the top and `(byte·3) >> 8` reads it. The first 32 `qs` bytes give 5 × 32
//! elements (trit-major), the next 16 give 5 × 16, and the 4 `qh` bytes give 4 × 4.

#![allow(non_camel_case_types)] // the format types keep ggml's names (Q2_K, IQ2_XXS)

use super::{f16_at, BlockFormat};

/// Powers of three that rotate a TQ1_0 byte to its k-th trit.
const POW3: [u8; 5] = [1, 3, 9, 27, 81];

/// The trit at the top of a TQ1_0 byte after rotation by `3^k`, as a signed value −1, 0, +1.
#[inline(always)]
fn trit(byte: u8, pow: u8) -> i16 {
    let q = byte.wrapping_mul(pow);
    ((u16::from(q) * 3) >> 8) as i16 - 1
}

/// TQ1_0: `qs[48]` @0 (5 trits per byte), `qh[4]` @48 (4 trits per byte), `d` f16 @52.
pub(super) struct TQ1_0;

impl BlockFormat<256, 54> for TQ1_0 {
    #[inline(always)]
    fn decode(b: &[u8; 54], y: &mut [f32; 256]) {
        let d = f16_at(b, 52);
        let mut i = 0;
        for (start, width) in [(0, 32), (32, 16)] {
            for &pow in &POW3 {
                for &byte in &b[start..start + width] {
                    y[i] = f32::from(trit(byte, pow)) * d;
                    i += 1;
                }
            }
        }
        for &pow in &POW3[..4] {
            for &byte in &b[48..52] {
                y[i] = f32::from(trit(byte, pow)) * d;
                i += 1;
            }
        }
    }
}

/// TQ2_0: `qs[64]` @0 (2-bit trits, four planes per 32 bytes), `d` f16 @64.
pub(super) struct TQ2_0;

impl BlockFormat<256, 66> for TQ2_0 {
    #[inline(always)]
    fn decode(b: &[u8; 66], y: &mut [f32; 256]) {
        let d = f16_at(b, 64);
        for half in 0..2 {
            for plane in 0..4 {
                let out = 128 * half + 32 * plane;
                for m in 0..32 {
                    let t = i16::from((b[32 * half + m] >> (2 * plane)) & 3) - 1;
                    y[out + m] = f32::from(t) * d;
                }
            }
        }
    }
}
