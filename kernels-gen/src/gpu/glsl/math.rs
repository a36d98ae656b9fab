//! The device math of [`crate::gpu::math`] as GLSL: the operations of `DEVICE_MATH`, in its
//! order, every f32 / f64 intermediate a `precise` variable (no contraction). Constants that the
//! C text writes as quotients (`1.0f / 5040.0f`, folded by clang in f32) are folded here, in
//! Rust, with the same types, and printed exactly, so no compiler's constant folding (glslang
//! folds in f64) is trusted with them.

use super::ConstF;
use crate::gpu::math::{EXP_TAYLOR, LN_DENOMINATORS, SINCOS_TAYLOR};
use std::fmt::Write;

/// An f64 literal that parses to exactly `v` (finite).
fn d(v: f64) -> String {
    format!("{v:?}lf")
}

/// An f32 literal that parses to exactly `v` (finite).
fn s(v: f32) -> String {
    ConstF(v).to_string()
}

/// The GLSL text of `aubier_exp`, `aubier_ln`, `aubier_sin`, `aubier_cos` (and their helpers).
pub(super) fn glsl() -> String {
    let mut t = String::new();
    t.push_str("float aubier_pow2(int k) { return intBitsToFloat((k + 127) << 23); }\n");
    t.push_str("float aubier_exp(float x) {\n");
    t.push_str("  if (isnan(x)) return x;\n");
    t.push_str("  if (x > 88.73f) return uintBitsToFloat(0x7f800000u);\n");
    t.push_str("  if (x < -104.0f) return 0.0f;\n");
    let _ = writeln!(
        t,
        "  precise float k = roundEven(x * {});",
        s(std::f32::consts::LOG2_E)
    );
    let _ = writeln!(
        t,
        "  precise float r = (x - k * {}) - k * {};",
        s(0.693_359_4),
        s(-2.121_944_4e-4)
    );
    let _ = writeln!(t, "  precise float p = {};", s(EXP_TAYLOR[0]));
    for &c in &EXP_TAYLOR[1..] {
        let _ = writeln!(t, "  p = p * r + {};", s(c));
    }
    t.push_str("  int ki = int(k);\n  int k1 = ki / 2;\n");
    t.push_str("  precise float y = p * aubier_pow2(k1) * aubier_pow2(ki - k1);\n  return y;\n}\n");

    t.push_str("float aubier_ln(float x) {\n");
    t.push_str("  if (isnan(x) || x < 0.0f) return uintBitsToFloat(0x7fc00000u);\n");
    t.push_str("  if (x == 0.0f) return uintBitsToFloat(0xff800000u);\n");
    t.push_str("  if (x == uintBitsToFloat(0x7f800000u)) return x;\n");
    t.push_str("  precise double m = double(x);\n  int e = 0;\n");
    let _ = writeln!(
        t,
        "  while (m >= {}) {{ m *= 0.5lf; e += 1; }}",
        d(std::f64::consts::SQRT_2)
    );
    let _ = writeln!(
        t,
        "  while (m < {}) {{ m *= 2.0lf; e -= 1; }}",
        d(std::f64::consts::FRAC_1_SQRT_2)
    );
    t.push_str("  precise double s = (m - 1.0lf) / (m + 1.0lf);\n");
    t.push_str("  precise double s2 = s * s;\n");
    let _ = writeln!(t, "  precise double p = {};", d(1.0 / LN_DENOMINATORS[0]));
    for &c in &LN_DENOMINATORS[1..] {
        let _ = writeln!(t, "  p = p * s2 + {};", d(1.0 / c));
    }
    let _ = writeln!(
        t,
        "  precise double y = 2.0lf * s * p + double(e) * {};",
        d(std::f64::consts::LN_2)
    );
    t.push_str("  return float(y);\n}\n");

    t.push_str("void aubier_sincos(float x, out float so, out float co) {\n");
    t.push_str(
        "  if (isnan(x) || isinf(x)) { so = uintBitsToFloat(0x7fc00000u); co = so; return; }\n",
    );
    t.push_str("  if (x == 0.0f) { so = x; co = 1.0f; return; }\n");
    t.push_str("  precise double xd = double(x);\n");
    let _ = writeln!(
        t,
        "  precise double k = roundEven(xd * {});",
        d(std::f64::consts::FRAC_2_PI)
    );
    let _ = writeln!(
        t,
        "  precise double r = xd - k * {};",
        d(std::f64::consts::FRAC_PI_2)
    );
    t.push_str("  precise double r2 = r * r;\n");
    let (s0, c0) = SINCOS_TAYLOR[0];
    let _ = writeln!(
        t,
        "  precise double s = {};\n  precise double c = {};",
        d(s0),
        d(c0)
    );
    for &(sd, cd) in &SINCOS_TAYLOR[1..] {
        let _ = writeln!(t, "  s = s * r2 + {}; c = c * r2 + {};", d(sd), d(cd));
    }
    t.push_str("  s = s * r;\n");
    t.push_str("  int q = int(int64_t(k) & 3l);\n");
    t.push_str("  so = float(q == 0 ? s : q == 1 ? c : q == 2 ? -s : -c);\n");
    t.push_str("  co = float(q == 0 ? c : q == 1 ? -s : q == 2 ? -c : s);\n}\n");
    t.push_str("float aubier_sin(float x) { float s, c; aubier_sincos(x, s, c); return s; }\n");
    t.push_str("float aubier_cos(float x) { float s, c; aubier_sincos(x, s, c); return c; }\n");
    t
}
