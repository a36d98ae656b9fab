//! AVX-512 dots of Q4_0 and Q8_0 rows with f32 activations that compute the scalar dot's
//! operations in its order (the module note of `crate::quant`), so the same bits: they replace
//! the scalar kernels behind [`super::dot_fn`] where the CPU has AVX-512F (the oracle's
//! `attn_k_b` at decode is 8,192 Q4_0 rows of 64 elements per layer).
//!
//! Algorithm, per 32-element block: the codes widened to i32 in two vectors (elements `0 .. 16`
//! and `16 .. 32`; Q4_0's low nibbles then its high nibbles, minus 8), converted to f32 (exact)
//! and multiplied by the block's `d` (the decoder's `f32(q) · d`), then by `x` (one rounding
//! each). The eight-lane accumulator (lane `l` holds the elements `i ≡ l mod 8`) takes the four
//! eight-element halves in element order, each one f32 add per lane, as the scalar loop does;
//! the final reduction is the scalar one.

use crate::ggml_type::GgmlType;
use std::arch::x86_64::*;

/// The AVX-512 dot of `ty` (Q4_0, Q8_0) when the CPU has AVX-512F, else None.
pub(super) fn dot_fn(ty: GgmlType) -> Option<super::DotFn> {
    if !is_x86_feature_detected!("avx512f") {
        return None;
    }
    match ty {
        GgmlType::Q4_0 => Some(dot_q4_0),
        GgmlType::Q8_0 => Some(dot_q8_0),
        _ => None,
    }
}

/// The block's two vectors of weights: elements `0 .. 16` and `16 .. 32`.
type Weights = (__m512, __m512);

/// `Σ w·x` over the `n / 32` blocks of `B` bytes at `row`, `weights` giving a block's weights.
///
/// # Safety
/// [`super::DotFn`]'s contract, and the CPU has AVX-512F.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn dot_blocks<const B: usize>(
    row: *const u8,
    x: *const f32,
    n: usize,
    weights: impl Fn(&[u8; B]) -> Weights,
) -> f32 {
    if n == 0 {
        return 0.0;
    }
    // SAFETY: the caller guarantees n / 32 · B readable bytes and n readable f32.
    let (blocks, x) = unsafe {
        (
            std::slice::from_raw_parts(row, n / 32 * B),
            std::slice::from_raw_parts(x, n),
        )
    };
    let mut acc = _mm256_setzero_ps();
    for (b, xb) in blocks.as_chunks::<B>().0.iter().zip(x.chunks_exact(32)) {
        let (w0, w1) = weights(b);
        // SAFETY: 32 readable f32 in `xb`.
        let (x0, x1) = unsafe {
            (
                _mm512_loadu_ps(xb.as_ptr()),
                _mm512_loadu_ps(xb.as_ptr().add(16)),
            )
        };
        for p in [_mm512_mul_ps(w0, x0), _mm512_mul_ps(w1, x1)] {
            acc = _mm256_add_ps(acc, _mm512_castps512_ps256(p));
            acc = _mm256_add_ps(acc, upper_half(p));
        }
    }
    let mut a = [0f32; 8];
    // SAFETY: 8 f32 into an [f32; 8].
    unsafe { _mm256_storeu_ps(a.as_mut_ptr(), acc) };
    ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]))
}

/// The upper eight lanes of `p` (AVX-512F only: `vextractf32x8` needs AVX-512DQ).
#[target_feature(enable = "avx512f")]
#[inline]
fn upper_half(p: __m512) -> __m256 {
    _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(p)))
}

/// The block's `d`, widened from f16 (exact, as the decoder's `f16_at`).
#[inline(always)]
fn d_of<const B: usize>(b: &[u8; B]) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32()
}

/// # Safety
/// [`super::DotFn`]'s contract, and the CPU has AVX-512F (checked by [`dot_fn`]).
#[target_feature(enable = "avx512f")]
unsafe extern "C" fn dot_q4_0(row: *const u8, x: *const f32, n: usize) -> f32 {
    let weights = |b: &[u8; 18]| {
        let d = _mm512_set1_ps(d_of(b));
        // SAFETY: bytes 2 .. 18 of the block.
        let qs = unsafe { _mm_loadu_si128(b[2..].as_ptr().cast()) };
        let q = _mm512_cvtepu8_epi32(qs);
        let eight = _mm512_set1_epi32(8);
        let lo = _mm512_sub_epi32(_mm512_and_si512(q, _mm512_set1_epi32(0x0f)), eight);
        let hi = _mm512_sub_epi32(_mm512_srli_epi32::<4>(q), eight);
        (
            _mm512_mul_ps(_mm512_cvtepi32_ps(lo), d),
            _mm512_mul_ps(_mm512_cvtepi32_ps(hi), d),
        )
    };
    // SAFETY: forwarded contract.
    unsafe { dot_blocks::<18>(row, x, n, weights) }
}

/// # Safety
/// [`super::DotFn`]'s contract, and the CPU has AVX-512F (checked by [`dot_fn`]).
#[target_feature(enable = "avx512f")]
unsafe extern "C" fn dot_q8_0(row: *const u8, x: *const f32, n: usize) -> f32 {
    let weights = |b: &[u8; 34]| {
        let d = _mm512_set1_ps(d_of(b));
        // SAFETY: bytes 2 .. 18 and 18 .. 34 of the block.
        let (q0, q1) = unsafe {
            (
                _mm_loadu_si128(b[2..].as_ptr().cast()),
                _mm_loadu_si128(b[18..].as_ptr().cast()),
            )
        };
        (
            _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q0)), d),
            _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q1)), d),
        )
    };
    // SAFETY: forwarded contract.
    unsafe { dot_blocks::<34>(row, x, n, weights) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// Against the scalar kernels bit for bit: random blocks (every code, scales of many
    /// magnitudes), rows of 1 to 9 blocks.
    #[test]
    fn avx512_dots_are_the_scalar_dots() {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        for ty in [GgmlType::Q4_0, GgmlType::Q8_0] {
            let Some(fast) = dot_fn(ty) else {
                println!("note: no AVX-512F on this CPU: {ty} check skipped");
                continue;
            };
            let scalar = super::super::scalar_dot_fn(ty).expect("scalar kernel");
            let sampler = crate::quant::random::BlockSampler::new(ty).expect("sampler");
            for blocks in 1..10 {
                let n = 32 * blocks;
                let mut row = vec![0u8; ty.row_size(n).expect("size")];
                for _ in 0..50 {
                    let scale = rng.random_range(0.01..4.0);
                    sampler.fill_row(&mut rng, scale, n, &mut row).expect("row");
                    let x: Vec<f32> = (0..n).map(|_| rng.random_range(-3.0f32..3.0)).collect();
                    // SAFETY: `row` holds n / 32 blocks, `x` n f32.
                    let (a, b) = unsafe {
                        (
                            fast(row.as_ptr(), x.as_ptr(), n),
                            scalar(row.as_ptr(), x.as_ptr(), n),
                        )
                    };
                    assert_eq!(a.to_bits(), b.to_bits(), "{ty}, {n} elements");
                }
            }
        }
    }
}
