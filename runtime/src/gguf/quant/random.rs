//! Random but valid quant blocks, for synthetic models (`aubier synth`).
//!
//! Algorithm. A block is drawn in two steps.
//! 1. *Unit block*: every byte comes from the RNG, then the fields that carry scales are fixed
//!    so that the block is valid and centred: the f16 super-scale `d` (and `dmin`) is set to 1.0;
//!    the sub-block scales of the asymmetric K-quants are drawn small and their mins set to the
//!    mean code times the scale (`Q2_K`: scale 1..=10, min = round(1.5·scale), codes 0..3;
//!    `Q4_K`: scale 1..=8, min = round(7.5·scale); `Q5_K`: scale 1..=4, min = round(15.5·scale)),
//!    so each sub-block dequantizes to values of mean ≈ 0; `Q4_1` / `Q5_1` (`x = d·q + m`) get
//!    `m = −7.5·d` / `−15.5·d`, the mean code; `Q6_K`'s int8 scales are drawn in
//!    ±1..=16. Symmetric formats (`Q4_0`, `Q5_0`, `Q8_0`, `IQ4_NL`, `Q3_K`, `IQ2_XXS`, `IQ2_XS`)
//!    keep their random codes, scales, grid indices and signs as drawn: every bit pattern of
//!    those fields is a valid block.
//! 2. *Scaling*: dequantization is linear in `d` and `dmin`, so writing `d = dmin = σ / u`,
//!    where `u` is the RMS of unit blocks of the type (measured once, with the crate's own
//!    bit-exact dequantizer, over [`CALIBRATION_BLOCKS`] blocks of a fixed seed), gives blocks
//!    whose values have RMS ≈ σ. `d` is stored as f16: σ / u must lie in f16's normal range,
//!    which [`BlockSampler::fill_row`] checks.
//!
//! Float types (`F32`, `F16`) hold N(0, σ²) draws (Box–Muller). Everything is a pure function of
//! the RNG state, so a seeded RNG gives the same bytes on every machine.

use super::dequantize_row;
use crate::ggml_type::GgmlType;
use half::f16;
use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Blocks dequantized to measure a type's unit RMS.
pub const CALIBRATION_BLOCKS: usize = 256;

/// Errors of [`BlockSampler`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RandomBlockError {
    /// The type has no random-block generator.
    #[error("no random-block generator for ggml type {0} (supported: {SUPPORTED_NAMES})")]
    Unsupported(GgmlType),
    /// The row is not a whole number of blocks, or `out` does not hold exactly one row.
    #[error("{ty}: {bytes} bytes is not a whole row of {n} elements")]
    BadRow {
        /// The type.
        ty: GgmlType,
        /// Elements asked for.
        n: usize,
        /// Bytes given.
        bytes: usize,
    },
    /// σ / unit RMS does not fit an f16 normal number, or σ is not positive and finite.
    #[error(
        "{ty}: a standard deviation of {std} needs a block scale of {scale}, outside f16's normal range"
    )]
    ScaleOutOfRange {
        /// The type.
        ty: GgmlType,
        /// Requested RMS.
        std: f32,
        /// The scale it would need.
        scale: f32,
    },
}

const SUPPORTED: &[GgmlType] = &[
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::IQ4_NL,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::IQ2_XXS,
    GgmlType::IQ2_XS,
];
const SUPPORTED_NAMES: &str =
    "F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ2_XXS, IQ2_XS";

/// Whether [`BlockSampler::new`] accepts `ty`.
pub fn is_supported(ty: GgmlType) -> bool {
    SUPPORTED.contains(&ty)
}

/// Draws rows of one ggml type with a requested RMS.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockSampler {
    ty: GgmlType,
    /// RMS of unit blocks (1.0 for float types).
    unit_rms: f32,
}

impl BlockSampler {
    /// A sampler for `ty`, its unit RMS measured over [`CALIBRATION_BLOCKS`] blocks.
    ///
    /// Errors: [`RandomBlockError::Unsupported`].
    pub fn new(ty: GgmlType) -> Result<BlockSampler, RandomBlockError> {
        if !is_supported(ty) {
            return Err(RandomBlockError::Unsupported(ty));
        }
        if matches!(ty, GgmlType::F32 | GgmlType::F16) {
            return Ok(BlockSampler { ty, unit_rms: 1.0 });
        }
        let mut rng = ChaCha8Rng::seed_from_u64(0x5eed_b10c);
        let (qk, size) = (ty.block_size(), ty.type_size());
        let mut block = vec![0u8; size];
        let mut values = vec![0f32; qk];
        let mut sum_sq = 0f64;
        for _ in 0..CALIBRATION_BLOCKS {
            unit_block(ty, &mut rng, &mut block);
            dequantize_row(ty, &block, &mut values).map_err(|_| RandomBlockError::BadRow {
                ty,
                n: qk,
                bytes: size,
            })?;
            sum_sq += values
                .iter()
                .map(|&v| f64::from(v) * f64::from(v))
                .sum::<f64>();
        }
        let unit_rms = (sum_sq / (CALIBRATION_BLOCKS * qk) as f64).sqrt() as f32;
        Ok(BlockSampler { ty, unit_rms })
    }

    /// The type drawn.
    pub fn ggml_type(&self) -> GgmlType {
        self.ty
    }

    /// Fills `out` with one row of `n` elements whose values have RMS ≈ `std` (exactly N(0, std²)
    /// draws for float types). `out.len()` must be `ggml_row_size(ty, n)`.
    ///
    /// Errors: [`RandomBlockError::BadRow`]; [`RandomBlockError::ScaleOutOfRange`] when
    /// `std / unit RMS` is not an f16 normal number (or `std` is not positive and finite).
    pub fn fill_row(
        &self,
        rng: &mut impl RngCore,
        std: f32,
        n: usize,
        out: &mut [u8],
    ) -> Result<(), RandomBlockError> {
        let ty = self.ty;
        if ty.row_size(n) != Some(out.len()) {
            return Err(RandomBlockError::BadRow {
                ty,
                n,
                bytes: out.len(),
            });
        }
        let scale = std / self.unit_rms;
        let normal = std.is_finite()
            && std > 0.0
            && (f16::MIN_POSITIVE.to_f32()..=f16::MAX.to_f32()).contains(&scale);
        match ty {
            GgmlType::F32 => {
                for c in out.chunks_exact_mut(4) {
                    c.copy_from_slice(&(std * normal_draw(rng)).to_le_bytes());
                }
                return Ok(());
            }
            GgmlType::F16 => {
                for c in out.chunks_exact_mut(2) {
                    c.copy_from_slice(&f16::from_f32(std * normal_draw(rng)).to_le_bytes());
                }
                return Ok(());
            }
            _ if !normal => {
                return Err(RandomBlockError::ScaleOutOfRange { ty, std, scale });
            }
            _ => {}
        }
        let d = f16::from_f32(scale).to_le_bytes();
        let m = additive_min(ty).map(|(at, mean)| (at, f16::from_f32(-mean * scale).to_le_bytes()));
        for block in out.chunks_exact_mut(ty.type_size()) {
            unit_block(ty, rng, block);
            for &at in scale_fields(ty) {
                block[at..at + 2].copy_from_slice(&d);
            }
            if let Some((at, m)) = m {
                block[at..at + 2].copy_from_slice(&m);
            }
        }
        Ok(())
    }
}

/// Byte offsets of the f16 fields that multiply the whole block (`d`, and `dmin` where the type
/// has one); ggml's block structs (`ggml/src/ggml-common.h`).
fn scale_fields(ty: GgmlType) -> &'static [usize] {
    match ty {
        GgmlType::Q2_K => &[80, 82],
        GgmlType::Q3_K => &[108],
        GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q6_K => &[208],
        _ => &[0],
    }
}

/// The f16 additive min `m` of `Q4_1` / `Q5_1` (`x = d·q + m`): its byte offset and the mean
/// code it cancels.
fn additive_min(ty: GgmlType) -> Option<(usize, f32)> {
    match ty {
        GgmlType::Q4_1 => Some((2, 7.5)),
        GgmlType::Q5_1 => Some((2, 15.5)),
        _ => None,
    }
}

/// Step 1 of the module doc: random codes, centred sub-block scales, unit super-scales.
fn unit_block(ty: GgmlType, rng: &mut impl RngCore, block: &mut [u8]) {
    rng.fill_bytes(block);
    let one = f16::ONE.to_le_bytes();
    for &at in scale_fields(ty) {
        block[at..at + 2].copy_from_slice(&one);
    }
    if let Some((at, mean)) = additive_min(ty) {
        block[at..at + 2].copy_from_slice(&f16::from_f32(-mean).to_le_bytes());
    }
    match ty {
        GgmlType::Q2_K => {
            // scales[16] at 0: low nibble = scale, high nibble = min.
            for b in &mut block[..16] {
                let sc = 1 + *b % 10;
                let m = (u16::from(sc) * 3).div_ceil(2) as u8;
                *b = sc | (m << 4);
            }
        }
        GgmlType::Q4_K | GgmlType::Q5_K => {
            let (max_sc, mean_code_x2) = if ty == GgmlType::Q4_K {
                (8u8, 15u16)
            } else {
                (4u8, 31u16)
            };
            let mut sc = [0u8; 8];
            let mut m = [0u8; 8];
            for j in 0..8 {
                sc[j] = 1 + block[4 + j] % max_sc;
                m[j] = (u16::from(sc[j]) * mean_code_x2).div_ceil(2) as u8;
            }
            pack_scale_min_k4(&sc, &m, &mut block[4..16]);
        }
        GgmlType::Q6_K => {
            // scales[16] int8 at 192: ±1..=16.
            for b in &mut block[192..208] {
                let mag = 1 + (*b & 15) as i8;
                let s = if *b & 0x80 != 0 { -mag } else { mag };
                *b = s as u8;
            }
        }
        _ => {}
    }
}

/// Packs eight 6-bit (scale, min) pairs the way ggml's `get_scale_min_k4` unpacks them.
fn pack_scale_min_k4(sc: &[u8; 8], m: &[u8; 8], q: &mut [u8]) {
    for j in 0..4 {
        q[j] = (sc[j] & 63) | ((sc[j + 4] >> 4) << 6);
        q[j + 4] = (m[j] & 63) | ((m[j + 4] >> 4) << 6);
        q[j + 8] = (sc[j + 4] & 15) | ((m[j + 4] & 15) << 4);
    }
}

/// One N(0, 1) draw (Box–Muller, the cosine branch).
fn normal_draw(rng: &mut impl RngCore) -> f32 {
    let u1: f64 = 1.0 - rng.random::<f64>(); // (0, 1]
    let u2: f64 = rng.random::<f64>();
    ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every supported type: rows dequantize to finite values whose RMS is within 10% of the
    /// request and whose mean is small against it, over 64 blocks; same seed, same bytes.
    #[test]
    fn rows_have_the_requested_rms_and_are_deterministic() {
        for &ty in SUPPORTED {
            let s = BlockSampler::new(ty).unwrap();
            let n = 64 * ty.block_size().max(4);
            let mut row = vec![0u8; ty.row_size(n).unwrap()];
            s.fill_row(&mut ChaCha8Rng::seed_from_u64(7), 0.02, n, &mut row)
                .unwrap();
            let mut again = vec![0u8; row.len()];
            s.fill_row(&mut ChaCha8Rng::seed_from_u64(7), 0.02, n, &mut again)
                .unwrap();
            assert_eq!(row, again, "{ty}");
            let mut v = vec![0f32; n];
            dequantize_row(ty, &row, &mut v).unwrap();
            assert!(v.iter().all(|x| x.is_finite()), "{ty}");
            let mean = v.iter().map(|&x| f64::from(x)).sum::<f64>() / n as f64;
            let rms = (v.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>() / n as f64).sqrt();
            assert!((rms / 0.02 - 1.0).abs() < 0.1, "{ty}: rms {rms}");
            assert!(mean.abs() < 0.2 * 0.02, "{ty}: mean {mean}");
        }
    }

    #[test]
    fn refuses_unsupported_types_bad_rows_and_scales() {
        assert_eq!(
            BlockSampler::new(GgmlType::IQ1_S),
            Err(RandomBlockError::Unsupported(GgmlType::IQ1_S))
        );
        let s = BlockSampler::new(GgmlType::Q2_K).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        assert!(matches!(
            s.fill_row(&mut rng, 1.0, 256, &mut [0u8; 83]),
            Err(RandomBlockError::BadRow { .. })
        ));
        assert!(matches!(
            s.fill_row(&mut rng, 1e30, 256, &mut [0u8; 84]),
            Err(RandomBlockError::ScaleOutOfRange { .. })
        ));
        assert!(matches!(
            s.fill_row(&mut rng, f32::NAN, 256, &mut [0u8; 84]),
            Err(RandomBlockError::ScaleOutOfRange { .. })
        ));
    }
}
