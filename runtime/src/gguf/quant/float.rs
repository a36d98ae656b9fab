//! The plain float element formats: F32, F16 and BF16 (block size 1).
//!
//! Each element is widened exactly: F32 is copied, BF16 is the 16 bits placed on top of an f32
//! (ggml `ggml_compute_bf16_to_fp32` in `ggml/src/ggml-impl.h`), and F16 is converted without
//! branching on the value class, so that a row converts in SIMD registers: the exponent and
//! mantissa bits are moved into f32 position and the value is rescaled by `2^112`
//! (`2^(127 − 15)`, the bias difference), which is exact for normals and subnormals alike; the
//! Inf/NaN codes are selected apart (NaNs come out quiet, as from F16C `vcvtph2ps`). A unit test
//! checks all 65 536 codes bit for bit against `half` (ggml `GGML_FP16_TO_FP32`). All values
//! little-endian.

use super::ElemFormat;

/// IEEE binary32, 4 bytes little-endian.
pub(super) struct F32;

impl ElemFormat<4> for F32 {
    #[inline(always)]
    fn decode(elem: &[u8; 4]) -> f32 {
        f32::from_le_bytes(*elem)
    }
}

/// IEEE binary16, 2 bytes little-endian.
pub(super) struct F16;

impl ElemFormat<2> for F16 {
    #[inline(always)]
    fn decode(elem: &[u8; 2]) -> f32 {
        f16_bits_to_f32(u16::from_le_bytes(*elem))
    }
}

/// Exact IEEE binary16 → binary32 widening (see the module doc).
#[inline(always)]
fn f16_bits_to_f32(h: u16) -> f32 {
    let h = u32::from(h);
    let sign = (h & 0x8000) << 16;
    let em = h & 0x7fff;
    let two_pow_112 = f32::from_bits((112 + 127) << 23);
    let finite = f32::from_bits(em << 13) * two_pow_112;
    let quiet = if em > 0x7c00 { 0x0040_0000 } else { 0 };
    let inf_nan = f32::from_bits((em << 13) | 0x7f80_0000 | quiet);
    let magnitude = if em >= 0x7c00 { inf_nan } else { finite };
    f32::from_bits(magnitude.to_bits() | sign)
}

/// bfloat16 (the top half of a binary32), 2 bytes little-endian.
pub(super) struct BF16;

impl ElemFormat<2> for BF16 {
    #[inline(always)]
    fn decode(elem: &[u8; 2]) -> f32 {
        f32::from_bits(u32::from(u16::from_le_bytes(*elem)) << 16)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_widening_equals_half_for_every_code() {
        for h in 0..=u16::MAX {
            let want = half::f16::from_bits(h).to_f32().to_bits();
            assert_eq!(f16_bits_to_f32(h).to_bits(), want, "f16 {h:#06x}");
        }
    }

    /// Values fixed by the IEEE formats themselves.
    #[test]
    fn widening_is_exact() {
        assert_eq!(F16::decode(&0x3c00u16.to_le_bytes()), 1.0);
        assert_eq!(F16::decode(&0x0001u16.to_le_bytes()), 2f32.powi(-24));
        assert_eq!(F16::decode(&0xfbffu16.to_le_bytes()), -65504.0);
        assert_eq!(F16::decode(&0x8000u16.to_le_bytes()).to_bits(), 0x8000_0000);
        assert_eq!(BF16::decode(&0x3f80u16.to_le_bytes()), 1.0);
        assert_eq!(
            BF16::decode(&0x0001u16.to_le_bytes()).to_bits(),
            0x0001_0000
        );
        assert_eq!(F32::decode(&(-2.5f32).to_le_bytes()), -2.5);
    }
}
