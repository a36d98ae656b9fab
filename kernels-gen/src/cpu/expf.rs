//! `e^x` for f32, the oracle's `exp` (and through it the fast path's): deterministic — the same
//! IEEE f64 operations on every platform, instead of the C library's `expf`, whose last bit
//! varies between libraries and their FMA / non-FMA variants — so that a vector version with the
//! same operations (the runtime's AVX-512 softmax and SiLU) gives the same bits.
//!
//! Algorithm (Tang's table method, as in most libms): in f64, `k = round(x · 32/ln 2)` (ties to
//! even), `r = x − k · (ln 2 / 32)` (|r| ≤ ln 2 / 64), `e^r` by its degree-4 Taylor polynomial
//! (truncation below 1.3e-12 relative), times `2^(j/32)` from a 32-entry table (`j = k mod
//! 32`) and `2^⌊k/32⌋` by exponent bits, rounded once to f32. The f64 result is within ~1e-12
//! relative of `e^x`, so the f32 result is the correctly rounded one except within 1e-12 of a
//! rounding boundary (at most 0.5 + 2e-5 ULP). `x > 128` gives +∞, `x < −128` gives `+0.0`
//! (what the f64 path would round to; the bounds keep `k` small), NaN gives NaN. The table and
//! constants are correctly rounded f64 (mpmath at 200 bits).

/// `2^(j/32)` for `j in 0..32`.
pub const EXP_TABLE: [f64; 32] = [
    f64::from_bits(0x3ff0000000000000),
    f64::from_bits(0x3ff059b0d3158574),
    f64::from_bits(0x3ff0b5586cf9890f),
    f64::from_bits(0x3ff11301d0125b51),
    f64::from_bits(0x3ff172b83c7d517b),
    f64::from_bits(0x3ff1d4873168b9aa),
    f64::from_bits(0x3ff2387a6e756238),
    f64::from_bits(0x3ff29e9df51fdee1),
    f64::from_bits(0x3ff306fe0a31b715),
    f64::from_bits(0x3ff371a7373aa9cb),
    f64::from_bits(0x3ff3dea64c123422),
    f64::from_bits(0x3ff44e086061892d),
    f64::from_bits(0x3ff4bfdad5362a27),
    f64::from_bits(0x3ff5342b569d4f82),
    f64::from_bits(0x3ff5ab07dd485429),
    f64::from_bits(0x3ff6247eb03a5585),
    f64::from_bits(0x3ff6a09e667f3bcd),
    f64::from_bits(0x3ff71f75e8ec5f74),
    f64::from_bits(0x3ff7a11473eb0187),
    f64::from_bits(0x3ff82589994cce13),
    f64::from_bits(0x3ff8ace5422aa0db),
    f64::from_bits(0x3ff93737b0cdc5e5),
    f64::from_bits(0x3ff9c49182a3f090),
    f64::from_bits(0x3ffa5503b23e255d),
    f64::from_bits(0x3ffae89f995ad3ad),
    f64::from_bits(0x3ffb7f76f2fb5e47),
    f64::from_bits(0x3ffc199bdd85529c),
    f64::from_bits(0x3ffcb720dcef9069),
    f64::from_bits(0x3ffd5818dcfba487),
    f64::from_bits(0x3ffdfc97337b9b5f),
    f64::from_bits(0x3ffea4afa2a490da),
    f64::from_bits(0x3fff50765b6e4540),
];
/// `32 / ln 2`.
pub const EXP_INV_LN2_N: f64 = f64::from_bits(0x40471547652b82fe);
/// `ln 2 / 32`.
pub const EXP_LN2_N: f64 = f64::from_bits(0x3f962e42fefa39ef);
/// The Taylor coefficients `1/2`, `1/6`, `1/24` (the first two are 1).
pub const EXP_C2: f64 = 0.5;
pub const EXP_C3: f64 = f64::from_bits(0x3fc5555555555555);
pub const EXP_C4: f64 = f64::from_bits(0x3fa5555555555555);
/// Above this `e^x` is +∞ (and the f64 path is not taken).
pub const EXP_HI: f32 = 128.0;
/// Below this `e^x` is `+0.0` (and the f64 path is not taken).
pub const EXP_LO: f32 = -128.0;

/// `e^x` (module note: within 0.50002 ULP, the same bits on every platform).
pub fn expf(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    if x > EXP_HI {
        return f32::INFINITY;
    }
    if x < EXP_LO {
        return 0.0;
    }
    let xd = f64::from(x);
    let kd = (xd * EXP_INV_LN2_N).round_ties_even();
    let r = xd - kd * EXP_LN2_N;
    let p = (((r * EXP_C4 + EXP_C3) * r + EXP_C2) * r + 1.0) * r + 1.0;
    // |k| ≤ 5910: exact in i64, and 2^⌊k/32⌋ a normal f64.
    let k = kd as i64;
    let s = f64::from_bits((((k >> 5) + 1023) as u64) << 52);
    ((p * EXP_TABLE[(k & 31) as usize]) * s) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against f64's `exp` rounded to f32 (the correctly rounded value but for double rounding
    /// at a boundary): at most one ULP apart anywhere, equal on nearly all inputs; the special
    /// values and the overflow / underflow edges.
    #[test]
    fn expf_is_within_one_ulp_of_the_f64_exp() {
        let mut differ = 0usize;
        let mut n = 0usize;
        // Every 97th f32 bit pattern from −128 to 128 (about 22 million values).
        for bits in (0u32..=u32::MAX).step_by(97) {
            let x = f32::from_bits(bits);
            if !(EXP_LO..=EXP_HI).contains(&x) {
                continue;
            }
            n += 1;
            let want = f64::from(x).exp() as f32;
            let got = expf(x);
            if got.to_bits() != want.to_bits() {
                differ += 1;
                let ulps = (i64::from(got.to_bits()) - i64::from(want.to_bits())).abs();
                assert!(
                    ulps <= 1 || (want == 0.0 && got.to_bits() <= 1),
                    "expf({x:e}) = {got:e}, f64 gives {want:e}"
                );
            }
        }
        assert!(n > 10_000_000, "{n} values");
        assert!(
            differ * 100_000 < n,
            "{differ} of {n} differ from the f64 rounding"
        );
        assert_eq!(expf(0.0).to_bits(), 1f32.to_bits());
        assert_eq!(expf(-0.0).to_bits(), 1f32.to_bits());
        assert_eq!(expf(1.0), std::f32::consts::E);
        assert!(expf(f32::NAN).is_nan());
        assert_eq!(expf(f32::INFINITY), f32::INFINITY);
        assert_eq!(expf(f32::NEG_INFINITY).to_bits(), 0);
        assert!(expf(88.72283).is_finite() && expf(88.7229).is_infinite());
        assert!(expf(-103.0) > 0.0 && expf(-104.0) == 0.0);
        assert_eq!(expf(128.5), f32::INFINITY);
        assert_eq!(expf(-128.5).to_bits(), 0);
    }
}
