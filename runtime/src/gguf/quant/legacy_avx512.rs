//! AVX-512 dots of Q4_0 and Q8_0 rows (and, many rows at once, F32 rows) with f32 activations
//! that compute the scalar dot's operations in its order (the module note of `crate::gguf::quant`),
//! so the same bits: they replace the scalar kernels behind [`super::dot_fn`] and
//! [`super::dot_rows`] where the CPU has AVX-512F (the oracle's `attn_k_b` at decode is 8,192
//! Q4_0 rows of 64 elements per layer; the router at decode 128 F32 rows of 4096).
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
    if !crate::isa::isa().avx512f {
        return None;
    }
    match ty {
        GgmlType::Q4_0 => Some(dot_q4_0),
        GgmlType::Q8_0 => Some(dot_q8_0),
        _ => None,
    }
}

/// `y[r] = dot(row_r, x)` for `y.len()` rows of `rb` bytes back to back at `src`, each row
/// `n / 32` blocks; the bits of [`dot_fn`]'s kernel on each row.
///
/// # Safety
/// `src` points to `y.len() · rb` readable bytes, each row as [`super::DotFn`]'s `row`, `x` to
/// `n` readable f32, and the CPU has AVX-512F (checked by [`dots_fn`]).
pub(super) type DotsFn =
    unsafe fn(src: *const u8, rb: usize, x: *const f32, n: usize, y: &mut [f32]);

/// The many-row AVX-512 dot of `ty` (Q4_0, Q8_0, F32) when the CPU has AVX-512F, else None:
/// rows four at a time, each with its own accumulator (a single row's chain of dependent adds
/// bounds the one-row kernel on 64-element rows).
pub(super) fn dots_fn(ty: GgmlType) -> Option<DotsFn> {
    if !crate::isa::isa().avx512f {
        return None;
    }
    match ty {
        GgmlType::Q4_0 => Some(dots_q4_0),
        GgmlType::Q8_0 => Some(dots_q8_0),
        GgmlType::F32 => Some(dots_f32),
        _ => None,
    }
}

/// The block's two vectors of weights: elements `0 .. 16` and `16 .. 32`.
type Weights = (__m512, __m512);

/// `Σ w·x` over the `n / 32` blocks of `B` bytes of each of the `R` rows, `weights` giving a
/// block's weights; the rows' sums are independent chains, each in the one-row order.
///
/// # Safety
/// Each `rows[r]` points to `n / 32 · B` readable bytes, `x` to `n` readable f32, and the CPU has
/// AVX-512F.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn dot_blocks<const B: usize, const R: usize>(
    rows: [*const u8; R],
    x: *const f32,
    n: usize,
    weights: impl Fn(&[u8; B]) -> Weights,
) -> [f32; R] {
    let mut out = [0f32; R];
    if n == 0 {
        return out;
    }
    // SAFETY: the caller guarantees n readable f32.
    let x = unsafe { std::slice::from_raw_parts(x, n) };
    let mut blocks: [&[[u8; B]]; R] = [&[]; R];
    for (b, &row) in blocks.iter_mut().zip(&rows) {
        // SAFETY: the caller guarantees n / 32 · B readable bytes per row.
        *b = unsafe { std::slice::from_raw_parts(row, n / 32 * B) }
            .as_chunks::<B>()
            .0;
    }
    let mut acc = [_mm256_setzero_ps(); R];
    for (i, xb) in x.chunks_exact(32).enumerate() {
        // SAFETY: 32 readable f32 in `xb`.
        let (x0, x1) = unsafe {
            (
                _mm512_loadu_ps(xb.as_ptr()),
                _mm512_loadu_ps(xb.as_ptr().add(16)),
            )
        };
        for (a, bl) in acc.iter_mut().zip(&blocks) {
            let (w0, w1) = weights(&bl[i]);
            for p in [_mm512_mul_ps(w0, x0), _mm512_mul_ps(w1, x1)] {
                *a = _mm256_add_ps(*a, _mm512_castps512_ps256(p));
                *a = _mm256_add_ps(*a, upper_half(p));
            }
        }
    }
    for (o, a) in out.iter_mut().zip(acc) {
        let mut l = [0f32; 8];
        // SAFETY: 8 f32 into an [f32; 8].
        unsafe { _mm256_storeu_ps(l.as_mut_ptr(), a) };
        *o = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
    }
    out
}

/// [`DotsFn`] by `dot` on four rows at a time, then one.
///
/// # Safety
/// [`DotsFn`]'s contract; `dot` is safe to call with `R` of its rows.
#[inline(always)]
unsafe fn by_fours(
    src: *const u8,
    rb: usize,
    y: &mut [f32],
    four: impl Fn([*const u8; 4]) -> [f32; 4],
    one: impl Fn(*const u8) -> f32,
) {
    // SAFETY: (every `add`) row `r` starts `r · rb` bytes into `src`, inside its y.len() rows.
    let row = |r: usize| unsafe { src.add(r * rb) };
    let whole = y.len() / 4 * 4;
    for (c, ys) in y[..whole].chunks_exact_mut(4).enumerate() {
        ys.copy_from_slice(&four(std::array::from_fn(|i| row(4 * c + i))));
    }
    for (r, v) in y.iter_mut().enumerate().skip(whole) {
        *v = one(row(r));
    }
}

/// `R` Q4_0 rows against `x` ([`dot_blocks`]'s contract).
#[target_feature(enable = "avx512f")]
unsafe fn q4_0_rows<const R: usize>(rows: [*const u8; R], x: *const f32, n: usize) -> [f32; R] {
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
    unsafe { dot_blocks::<18, R>(rows, x, n, weights) }
}

/// `R` Q8_0 rows against `x` ([`dot_blocks`]'s contract).
#[target_feature(enable = "avx512f")]
unsafe fn q8_0_rows<const R: usize>(rows: [*const u8; R], x: *const f32, n: usize) -> [f32; R] {
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
    unsafe { dot_blocks::<34, R>(rows, x, n, weights) }
}

/// `R` F32 rows against `x` ([`dot_blocks`]'s contract, a "block" being 32 f32): the scalar
/// dot's products `w·x` in the same lanes and order.
#[target_feature(enable = "avx512f")]
unsafe fn f32_rows<const R: usize>(rows: [*const u8; R], x: *const f32, n: usize) -> [f32; R] {
    let weights = |b: &[u8; 128]| {
        // SAFETY: bytes 0 .. 64 and 64 .. 128 of the block; loadu needs no alignment.
        unsafe {
            (
                _mm512_loadu_ps(b.as_ptr().cast()),
                _mm512_loadu_ps(b[64..].as_ptr().cast()),
            )
        }
    };
    // SAFETY: forwarded contract.
    unsafe { dot_blocks::<128, R>(rows, x, n, weights) }
}

/// # Safety
/// [`super::DotFn`]'s contract, and the CPU has AVX-512F (checked by [`dot_fn`]).
#[target_feature(enable = "avx512f")]
unsafe extern "C" fn dot_q4_0(row: *const u8, x: *const f32, n: usize) -> f32 {
    // SAFETY: forwarded contract.
    unsafe { q4_0_rows::<1>([row], x, n)[0] }
}

/// # Safety
/// [`super::DotFn`]'s contract, and the CPU has AVX-512F (checked by [`dot_fn`]).
#[target_feature(enable = "avx512f")]
unsafe extern "C" fn dot_q8_0(row: *const u8, x: *const f32, n: usize) -> f32 {
    // SAFETY: forwarded contract.
    unsafe { q8_0_rows::<1>([row], x, n)[0] }
}

/// # Safety
/// [`DotsFn`]'s contract (AVX-512F checked by [`dots_fn`]).
#[target_feature(enable = "avx512f")]
unsafe fn dots_q4_0(src: *const u8, rb: usize, x: *const f32, n: usize, y: &mut [f32]) {
    // SAFETY: forwarded contract, each row pointer inside `src`'s rows.
    unsafe {
        by_fours(
            src,
            rb,
            y,
            |r| q4_0_rows::<4>(r, x, n),
            |r| q4_0_rows::<1>([r], x, n)[0],
        )
    }
}

/// # Safety
/// [`DotsFn`]'s contract (AVX-512F checked by [`dots_fn`]). Rows whose length is not a whole
/// number of 32 elements go through the scalar dot (the tail's lanes), row by row.
#[target_feature(enable = "avx512f")]
unsafe fn dots_f32(src: *const u8, rb: usize, x: *const f32, n: usize, y: &mut [f32]) {
    if !n.is_multiple_of(32) {
        let one = super::scalar_dot_fn(GgmlType::F32).expect("F32 has a scalar dot");
        for (r, v) in y.iter_mut().enumerate() {
            // SAFETY: forwarded contract: row `r` is `rb` bytes (`n` f32) at `src + r·rb`.
            *v = unsafe { one(src.add(r * rb), x, n) };
        }
        return;
    }
    // SAFETY: forwarded contract, each row pointer inside `src`'s rows.
    unsafe {
        by_fours(
            src,
            rb,
            y,
            |r| f32_rows::<4>(r, x, n),
            |r| f32_rows::<1>([r], x, n)[0],
        )
    }
}

/// # Safety
/// [`DotsFn`]'s contract (AVX-512F checked by [`dots_fn`]).
#[target_feature(enable = "avx512f")]
unsafe fn dots_q8_0(src: *const u8, rb: usize, x: *const f32, n: usize, y: &mut [f32]) {
    // SAFETY: forwarded contract, each row pointer inside `src`'s rows.
    unsafe {
        by_fours(
            src,
            rb,
            y,
            |r| q8_0_rows::<4>(r, x, n),
            |r| q8_0_rows::<1>([r], x, n)[0],
        )
    }
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
            let sampler = crate::gguf::quant::random::BlockSampler::new(ty).expect("sampler");
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

    /// The many-row dots give each row the scalar dot's bits: 1 to 9 rows (whole fours and
    /// the rest), rows of 1 to 3 blocks.
    #[test]
    fn avx512_many_row_dots_are_the_scalar_dots() {
        let mut rng = ChaCha8Rng::seed_from_u64(6);
        for ty in [GgmlType::Q4_0, GgmlType::Q8_0] {
            let Some(dots) = dots_fn(ty) else {
                println!("note: no AVX-512F on this CPU: {ty} check skipped");
                continue;
            };
            let scalar = super::super::scalar_dot_fn(ty).expect("scalar kernel");
            let sampler = crate::gguf::quant::random::BlockSampler::new(ty).expect("sampler");
            for (rows, blocks) in (1..10).flat_map(|r| (1..4).map(move |b| (r, b))) {
                let n = 32 * blocks;
                let rb = ty.row_size(n).expect("size");
                let mut src = vec![0u8; rb * rows];
                for row in src.chunks_exact_mut(rb) {
                    let scale = rng.random_range(0.01..4.0);
                    sampler.fill_row(&mut rng, scale, n, row).expect("row");
                }
                let x: Vec<f32> = (0..n).map(|_| rng.random_range(-3.0f32..3.0)).collect();
                let mut y = vec![f32::NAN; rows];
                // SAFETY: `src` holds `rows` rows of n / 32 blocks, `x` n f32.
                unsafe { dots(src.as_ptr(), rb, x.as_ptr(), n, &mut y) };
                for (r, (row, v)) in src.chunks_exact(rb).zip(&y).enumerate() {
                    // SAFETY: as above, one row.
                    let want = unsafe { scalar(row.as_ptr(), x.as_ptr(), n) };
                    assert_eq!(v.to_bits(), want.to_bits(), "{ty}, row {r} of {rows}, {n}");
                }
            }
        }
    }

    /// The F32 many-row dot gives each row the scalar dot's bits: 1 to 9 rows, lengths whole
    /// 32s (the vector path) and not (the scalar fallback), values of many magnitudes.
    #[test]
    fn avx512_f32_row_dots_are_the_scalar_dots() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let Some(dots) = dots_fn(GgmlType::F32) else {
            println!("note: no AVX-512F on this CPU: F32 check skipped");
            return;
        };
        let scalar = super::super::scalar_dot_fn(GgmlType::F32).expect("scalar kernel");
        for (rows, n) in (1..10).flat_map(|r| [1, 7, 32, 40, 64, 96, 4096].map(move |n| (r, n))) {
            let mut value = || rng.random_range(-3.0f32..3.0) * 10f32.powi(rng.random_range(-4..4));
            let src: Vec<u8> = (0..rows * n).flat_map(|_| value().to_le_bytes()).collect();
            let x: Vec<f32> = (0..n).map(|_| value()).collect();
            let mut y = vec![f32::NAN; rows];
            // SAFETY: `src` holds `rows` rows of `n` f32, `x` n f32.
            unsafe { dots(src.as_ptr(), 4 * n, x.as_ptr(), n, &mut y) };
            for (r, (row, v)) in src.chunks_exact(4 * n).zip(&y).enumerate() {
                // SAFETY: as above, one row.
                let want = unsafe { scalar(row.as_ptr(), x.as_ptr(), n) };
                assert_eq!(
                    v.to_bits(),
                    want.to_bits(),
                    "row {r} of {rows}, {n} elements"
                );
            }
        }
    }
}
