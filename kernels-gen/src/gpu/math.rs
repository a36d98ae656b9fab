//! Device math: `exp`, `ln`, `sin`, `cos` written once as a sequence of IEEE operations, in Rust
//! (for [`super::cpu_exec`]) and as device source ([`device_math`], C++ or GLSL from the same
//! constants) for the generated kernels, so all sides compute the same bits. Header-free GPU code has no libm (NVPTX has no `exp`
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

use super::quant::Lang;
use std::fmt::{self, Display, Formatter, Write};

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

/// An f32 literal of exactly `v`, the same in C++ and GLSL: the shortest decimal when a parse
/// through f64 gives `v` back (glslang may parse a literal to f64 and round that to f32; the
/// shortest digits survive the double rounding almost always), else the f64 digits (exactly
/// `v`, always). NaN and ±∞ are the quotients `0/0`, `±1/0`, which compilers fold (a constant
/// initializer cannot call a function).
pub(super) struct ExactF32(pub(super) f32);

impl Display for ExactF32 {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let v = self.0;
        if v.is_nan() {
            return f.write_str("(0.0f / 0.0f)");
        }
        if v.is_infinite() {
            return f.write_str(if v > 0.0 {
                "(1.0f / 0.0f)"
            } else {
                "(-1.0f / 0.0f)"
            });
        }
        let (sign, m) = if v.is_sign_negative() {
            ("-", -v)
        } else {
            ("", v)
        };
        let short = format!("{m:?}");
        let text = if short.parse::<f64>().map(|d| d as f32) == Ok(m) {
            short
        } else {
            format!("{:?}", f64::from(m))
        };
        if sign.is_empty() {
            write!(f, "{text}f")
        } else {
            write!(f, "(-{text}f)")
        }
    }
}

/// The device functions `aubier_exp`, `aubier_ln`, `aubier_sin`, `aubier_cos` (and their
/// helpers `aubier_pow2`, `aubier_sincos`) in language `lang`: one sequence of operations,
/// printed from the same constants as the Rust functions above, every f32 / f64 intermediate
/// uncontracted (C++: the kernels' `#pragma clang fp contract(off)`; GLSL: `precise`).
/// Constants written as quotients in the algorithm (`1/7!`) are folded here, in Rust, in the
/// type the device uses, and printed exactly, so no compiler's constant folding is trusted with
/// them. C++ needs `__device__` defined; GLSL the 64-bit integer extension.
pub fn device_math(lang: Lang) -> String {
    let cpp = lang == Lang::Cpp;
    let (fn_, precise) = if cpp {
        ("__device__ inline ", "")
    } else {
        ("", "precise ")
    };
    let s = |v: f32| ExactF32(v).to_string();
    let d = |v: f64| {
        if cpp {
            format!("{v:?}")
        } else {
            format!("{v:?}lf")
        }
    };
    let (inf, nan) = if cpp {
        ("__builtin_inff()", "__builtin_nanf(\"\")")
    } else {
        (
            "uintBitsToFloat(0x7f800000u)",
            "uintBitsToFloat(0x7fc00000u)",
        )
    };
    let (is_nan, not_finite) = if cpp {
        ("x != x", "!(x - x == 0.0f)")
    } else {
        ("isnan(x)", "isnan(x) || isinf(x)")
    };
    let (rintf, rint) = if cpp {
        ("__builtin_rintf", "__builtin_rint")
    } else {
        ("roundEven", "roundEven")
    };
    let mut t = String::new();
    let pow2 = if cpp {
        "__builtin_bit_cast(float, (k + 127) << 23)"
    } else {
        "intBitsToFloat((k + 127) << 23)"
    };
    let _ = writeln!(t, "{fn_}float aubier_pow2(int k) {{ return {pow2}; }}");
    let _ = writeln!(t, "{fn_}float aubier_exp(float x) {{");
    let _ = writeln!(t, "  if ({is_nan}) return x;");
    let _ = writeln!(t, "  if (x > 88.73f) return {inf};");
    t.push_str("  if (x < -104.0f) return 0.0f;\n");
    let _ = writeln!(
        t,
        "  {precise}float k = {rintf}(x * {});",
        s(std::f32::consts::LOG2_E)
    );
    let _ = writeln!(
        t,
        "  {precise}float r = (x - k * {}) - k * {};",
        s(0.693_359_4),
        s(-2.121_944_4e-4)
    );
    let _ = writeln!(t, "  {precise}float p = {};", s(EXP_TAYLOR[0]));
    for &c in &EXP_TAYLOR[1..] {
        let _ = writeln!(t, "  p = p * r + {};", s(c));
    }
    t.push_str("  int ki = int(k);\n  int k1 = ki / 2;\n");
    let _ = writeln!(
        t,
        "  {precise}float y = p * aubier_pow2(k1) * aubier_pow2(ki - k1);\n  return y;\n}}"
    );

    let _ = writeln!(t, "{fn_}float aubier_ln(float x) {{");
    let _ = writeln!(t, "  if ({is_nan} || x < 0.0f) return {nan};");
    let _ = writeln!(t, "  if (x == 0.0f) return -{inf};");
    let _ = writeln!(t, "  if (x == {inf}) return x;");
    let _ = writeln!(t, "  {precise}double m = double(x);\n  int e = 0;");
    let _ = writeln!(
        t,
        "  while (m >= {}) {{ m *= {}; e += 1; }}",
        d(std::f64::consts::SQRT_2),
        d(0.5)
    );
    let _ = writeln!(
        t,
        "  while (m < {}) {{ m *= {}; e -= 1; }}",
        d(std::f64::consts::FRAC_1_SQRT_2),
        d(2.0)
    );
    let one = d(1.0);
    let _ = writeln!(t, "  {precise}double s = (m - {one}) / (m + {one});");
    let _ = writeln!(t, "  {precise}double s2 = s * s;");
    let _ = writeln!(t, "  {precise}double p = {};", d(1.0 / LN_DENOMINATORS[0]));
    for &c in &LN_DENOMINATORS[1..] {
        let _ = writeln!(t, "  p = p * s2 + {};", d(1.0 / c));
    }
    let _ = writeln!(
        t,
        "  {precise}double y = {} * s * p + double(e) * {};",
        d(2.0),
        d(std::f64::consts::LN_2)
    );
    t.push_str("  return float(y);\n}\n");

    let out = if cpp { "float&" } else { "out float" };
    let _ = writeln!(t, "{fn_}void aubier_sincos(float x, {out} so, {out} co) {{");
    let _ = writeln!(t, "  if ({not_finite}) {{ so = {nan}; co = so; return; }}");
    t.push_str("  if (x == 0.0f) { so = x; co = 1.0f; return; }\n");
    let _ = writeln!(t, "  {precise}double xd = double(x);");
    let _ = writeln!(
        t,
        "  {precise}double k = {rint}(xd * {});",
        d(std::f64::consts::FRAC_2_PI)
    );
    let _ = writeln!(
        t,
        "  {precise}double r = xd - k * {};",
        d(std::f64::consts::FRAC_PI_2)
    );
    let _ = writeln!(t, "  {precise}double r2 = r * r;");
    let (s0, c0) = SINCOS_TAYLOR[0];
    let _ = writeln!(
        t,
        "  {precise}double s = {};\n  {precise}double c = {};",
        d(s0),
        d(c0)
    );
    for &(sd, cd) in &SINCOS_TAYLOR[1..] {
        let _ = writeln!(t, "  s = s * r2 + {}; c = c * r2 + {};", d(sd), d(cd));
    }
    t.push_str("  s = s * r;\n");
    t.push_str(if cpp {
        "  int q = int((long long)k & 3);\n"
    } else {
        "  int q = int(int64_t(k) & 3l);\n"
    });
    t.push_str("  so = float(q == 0 ? s : q == 1 ? c : q == 2 ? -s : -c);\n");
    t.push_str("  co = float(q == 0 ? c : q == 1 ? -s : q == 2 ? -c : s);\n}\n");
    let _ = writeln!(
        t,
        "{fn_}float aubier_sin(float x) {{ float s, c; aubier_sincos(x, s, c); return s; }}"
    );
    let _ = writeln!(
        t,
        "{fn_}float aubier_cos(float x) {{ float s, c; aubier_sincos(x, s, c); return c; }}"
    );
    t
}

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
