//! Device math: `exp`, `ln`, `sin`, `cos` written once as a sequence of IEEE operations, in Rust
//! (for [`super::cpu_exec`]) and as C++ source ([`DEVICE_MATH`]) for the generated kernels, so
//! both sides compute the same bits. Header-free GPU code has no libm (NVPTX has no `exp`
//! instruction at all, and the hardware `sin` is coarse for the large RoPE angles), hence these.
//!
//! Algorithm note.
//! - `exp(x)` (f32): `k = rint(x·log2 e)`, `r = (x − k·C1) − k·C2` (Cody–Waite split of ln 2: `C1`
//!   has 9 significant bits so `k·C1` is exact for `|k| ≤ 2¹⁵`), `e^r` by the degree-7 Taylor
//!   polynomial in Horner form (|r| ≤ 0.347: truncation < 0.1 ulp), scaled by `2^k` as two exact
//!   powers of two. NaN → NaN, `x > 88.73` → +∞, `x < −104` → +0.
//! - `ln(x)`, `sin(x)`, `cos(x)`: in f64, rounded once to f32: `ln` from `x = m·2^e`,
//!   `m ∈ [√½, √2)`, `ln m = 2·atanh((m−1)/(m+1))` (series to the 15th power); `sin`/`cos` by
//!   reduction `r = x − k·π/2` in f64 (exact enough for `|x| < 2²⁴`) and Taylor series to degree
//!   15/14 on `|r| ≤ π/4`. Error well below one f32 ulp before the final rounding.

/// `e^x` for f32, bit-identical to the device's `aubier_exp`.
pub fn exp(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    if x > 88.73 {
        return f32::INFINITY;
    }
    if x < -104.0 {
        return 0.0;
    }
    let k = (x * std::f32::consts::LOG2_E).round_ties_even();
    let r = (x - k * 0.693_359_4) - k * -2.121_944_4e-4;
    let mut p = EXP_TAYLOR[0];
    for c in &EXP_TAYLOR[1..] {
        p = p * r + c;
    }
    let ki = k as i32;
    let k1 = ki / 2;
    let k2 = ki - k1;
    p * pow2(k1) * pow2(k2)
}

/// `2^k` for `k` in −126..=127 (an exact power of two).
fn pow2(k: i32) -> f32 {
    f32::from_bits(((k + 127) as u32) << 23)
}

/// `ln x` for f32, bit-identical to the device's `aubier_ln`.
pub fn ln(x: f32) -> f32 {
    if x.is_nan() || x < 0.0 {
        return f32::NAN;
    }
    if x == 0.0 {
        return f32::NEG_INFINITY;
    }
    if x == f32::INFINITY {
        return x;
    }
    let mut m = x as f64;
    let mut e = 0i32;
    while m >= std::f64::consts::SQRT_2 {
        m *= 0.5;
        e += 1;
    }
    while m < std::f64::consts::FRAC_1_SQRT_2 {
        m *= 2.0;
        e -= 1;
    }
    let s = (m - 1.0) / (m + 1.0);
    let s2 = s * s;
    let mut p = 1.0 / LN_DENOMINATORS[0];
    for d in &LN_DENOMINATORS[1..] {
        p = p * s2 + 1.0 / d;
    }
    (2.0 * s * p + e as f64 * std::f64::consts::LN_2) as f32
}

/// The Horner coefficients of `sin r / r` and `cos r` in `r²`, highest degree first:
/// `(−1/15!, −1/14!)`, `(1/13!, 1/12!)`, …, `(1, 1)`.
pub(super) const SINCOS_TAYLOR: [(f64, f64); 8] = [
    (-1.0 / 1_307_674_368_000.0, -1.0 / 87_178_291_200.0),
    (1.0 / 6_227_020_800.0, 1.0 / 479_001_600.0),
    (-1.0 / 39_916_800.0, -1.0 / 3_628_800.0),
    (1.0 / 362_880.0, 1.0 / 40_320.0),
    (-1.0 / 5_040.0, -1.0 / 720.0),
    (1.0 / 120.0, 1.0 / 24.0),
    (-1.0 / 6.0, -0.5),
    (1.0, 1.0),
];

/// The Horner coefficients of `e^r` (f32), highest degree first: `1/7!`, `1/6!`, …, `1`, `1`.
pub(super) const EXP_TAYLOR: [f32; 8] = [
    1.0 / 5040.0,
    1.0 / 720.0,
    1.0 / 120.0,
    1.0 / 24.0,
    1.0 / 6.0,
    0.5,
    1.0,
    1.0,
];

/// The odd denominators of `atanh(s)/s` in `s²`, highest first (`ln`'s series).
pub(super) const LN_DENOMINATORS: [f64; 8] = [15.0, 13.0, 11.0, 9.0, 7.0, 5.0, 3.0, 1.0];

/// `(sin r, cos r)` for `|r| ≤ π/4`, in f64.
fn sincos_kernel(r: f64) -> (f64, f64) {
    let r2 = r * r;
    let (mut s, mut c) = SINCOS_TAYLOR[0];
    for &(sd, cd) in &SINCOS_TAYLOR[1..] {
        s = s * r2 + sd;
        c = c * r2 + cd;
    }
    (s * r, c)
}

/// `(sin x, cos x)` in f64 after reduction by π/2; `(±0, 1)` for `x = ±0`, whose reduction
/// would give `+0` for `−0` (IEEE `−0 − (−0) = +0`) and which devices without signed-zero
/// preservation for f64 round otherwise.
fn sincos(x: f32) -> (f64, f64) {
    if x == 0.0 {
        return (x as f64, 1.0);
    }
    let xd = x as f64;
    let k = (xd * std::f64::consts::FRAC_2_PI).round_ties_even();
    let r = xd - k * std::f64::consts::FRAC_PI_2;
    let (s, c) = sincos_kernel(r);
    match (k as i64).rem_euclid(4) {
        0 => (s, c),
        1 => (c, -s),
        2 => (-s, -c),
        _ => (-c, s),
    }
}

/// `sin x` for f32, bit-identical to the device's `aubier_sin` (NaN/±∞ → NaN).
pub fn sin(x: f32) -> f32 {
    if !x.is_finite() {
        return f32::NAN;
    }
    sincos(x).0 as f32
}

/// `cos x` for f32, bit-identical to the device's `aubier_cos` (NaN/±∞ → NaN).
pub fn cos(x: f32) -> f32 {
    if !x.is_finite() {
        return f32::NAN;
    }
    sincos(x).1 as f32
}

/// The C++ text of the device math functions (dialect-neutral; needs `__device__` defined).
pub const DEVICE_MATH: &str = r#"__device__ inline float aubier_pow2(int k) { return __builtin_bit_cast(float, (k + 127) << 23); }
__device__ inline float aubier_exp(float x) {
  if (x != x) return x;
  if (x > 88.73f) return __builtin_inff();
  if (x < -104.0f) return 0.0f;
  float k = __builtin_rintf(x * 1.44269502f);
  float r = (x - k * 0.693359375f) - k * -2.12194442e-4f;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  int ki = (int)k;
  int k1 = ki / 2;
  return p * aubier_pow2(k1) * aubier_pow2(ki - k1);
}
__device__ inline float aubier_ln(float x) {
  if (x != x || x < 0.0f) return __builtin_nanf("");
  if (x == 0.0f) return -__builtin_inff();
  if (x == __builtin_inff()) return x;
  double m = (double)x;
  int e = 0;
  while (m >= 1.4142135623730951) { m *= 0.5; e += 1; }
  while (m < 0.7071067811865476) { m *= 2.0; e -= 1; }
  double s = (m - 1.0) / (m + 1.0);
  double s2 = s * s;
  double p = 1.0 / 15.0;
  p = p * s2 + 1.0 / 13.0; p = p * s2 + 1.0 / 11.0; p = p * s2 + 1.0 / 9.0; p = p * s2 + 1.0 / 7.0;
  p = p * s2 + 1.0 / 5.0; p = p * s2 + 1.0 / 3.0; p = p * s2 + 1.0;
  return (float)(2.0 * s * p + (double)e * 0.6931471805599453);
}
__device__ inline void aubier_sincos(float x, float* so, float* co) {
  if (!(x - x == 0.0f)) { *so = __builtin_nanf(""); *co = __builtin_nanf(""); return; }
  if (x == 0.0f) { *so = x; *co = 1.0f; return; }
  double xd = (double)x;
  double k = __builtin_rint(xd * 0.6366197723675814);
  double r = xd - k * 1.5707963267948966;
  double r2 = r * r;
  double s = -1.0 / 1307674368000.0, c = -1.0 / 87178291200.0;
  s = s * r2 + 1.0 / 6227020800.0; c = c * r2 + 1.0 / 479001600.0;
  s = s * r2 + -1.0 / 39916800.0; c = c * r2 + -1.0 / 3628800.0;
  s = s * r2 + 1.0 / 362880.0; c = c * r2 + 1.0 / 40320.0;
  s = s * r2 + -1.0 / 5040.0; c = c * r2 + -1.0 / 720.0;
  s = s * r2 + 1.0 / 120.0; c = c * r2 + 1.0 / 24.0;
  s = s * r2 + -1.0 / 6.0; c = c * r2 + -0.5;
  s = s * r2 + 1.0; c = c * r2 + 1.0;
  s = s * r;
  long long q = ((long long)k) & 3;
  double sv = q == 0 ? s : q == 1 ? c : q == 2 ? -s : -c;
  double cv = q == 0 ? c : q == 1 ? -s : q == 2 ? -c : s;
  *so = (float)sv; *co = (float)cv;
}
__device__ inline float aubier_sin(float x) { float s, c; aubier_sincos(x, &s, &c); return s; }
__device__ inline float aubier_cos(float x) { float s, c; aubier_sincos(x, &s, &c); return c; }
"#;

#[cfg(test)]
mod tests {
    use super::*;

    /// Distance in ulps between two finite f32 of the same sign.
    fn ulps(a: f32, b: f32) -> u32 {
        (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs() as u32
    }

    #[test]
    fn exp_is_within_two_ulps_of_libm() {
        let mut x = -103.0f32;
        while x < 88.7 {
            let (g, w) = (exp(x), (x as f64).exp() as f32);
            assert!(
                ulps(g, w) <= 2 || (w as f64) < 1e-37,
                "exp({x}) = {g}, want {w}"
            );
            x += 0.0137;
        }
        assert!(exp(f32::NAN).is_nan());
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(-0.0), 1.0);
    }

    #[test]
    fn ln_sin_cos_are_within_one_ulp_of_f64() {
        for i in 1..20000 {
            let x = i as f32 * 0.731;
            assert!(ulps(ln(x), (x as f64).ln() as f32) <= 1, "ln({x})");
            let a = i as f32 * 13.17;
            let (s, c) = ((a as f64).sin() as f32, (a as f64).cos() as f32);
            assert!(
                ulps(sin(a), s) <= 1 || (s.abs() < 1e-6 && (sin(a) - s).abs() < 1e-12),
                "sin({a})"
            );
            assert!(
                ulps(cos(a), c) <= 1 || (c.abs() < 1e-6 && (cos(a) - c).abs() < 1e-12),
                "cos({a})"
            );
        }
        assert!(ln(-1.0).is_nan());
        assert_eq!(ln(0.0), f32::NEG_INFINITY);
        assert_eq!(ln(1.0), 0.0);
        assert!(sin(f32::INFINITY).is_nan());
    }
}
