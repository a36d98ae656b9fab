//! YaRN RoPE frequencies (Peng et al. 2023, "YaRN: Efficient Context Window Extension of Large
//! Language Models"), computed the way transformers' `_compute_yarn_parameters`
//! (`modeling_rope_utils.py`, `truncate=True`) computes them, in the same f32 operations, so the
//! oracle's rotation angles `pos · θ_i` match the reference to the ulp. MODEL.md §2.3 gives the
//! formulas:
//!
//! ```text
//! corr(n)   = n_rot · ln(L0 / (2π n)) / (2 ln base)                   (f64)
//! low, high = max(floor(corr(β_fast)), 0), min(ceil(corr(β_slow)), n_rot − 1)
//! ramp_i    = clamp((i − low) / (high − low), 0, 1)      (high += 0.001 when equal)
//! extra_i   = 1 / base^(2i / n_rot)      inter_i = 1 / (s · base^(2i / n_rot))
//! θ_i       = inter_i · ramp_i + extra_i · (1 − ramp_i)   i = 0 .. n_rot/2
//! ```
//!
//! With `factor ≤ 1` the frequencies are plain RoPE's `extra_i`.

use aubier_compiler::config::YarnParams;

/// `θ_i` for `i in 0..n_rot/2`, in radians per position (f32, as transformers stores `inv_freq`).
/// `n_rot` must be even and positive (the lowering checks it before calling).
pub fn yarn_inv_freq(p: &YarnParams) -> Vec<f32> {
    let half = p.n_rot / 2;
    let dim = p.n_rot as f32;
    // `base ** (arange(0, dim, 2) / dim)` in f32; pow rounded once from f64.
    let pos_freq: Vec<f32> = (0..half)
        .map(|i| {
            let e = (2 * i) as f32 / dim;
            (p.freq_base as f64).powf(e as f64) as f32
        })
        .collect();
    let extra: Vec<f32> = pos_freq.iter().map(|&f| 1.0 / f).collect();
    if p.factor <= 1.0 {
        return extra;
    }
    let inter: Vec<f32> = pos_freq.iter().map(|&f| 1.0 / (p.factor * f)).collect();
    let corr = |n_rot: f64| {
        (p.n_rot as f64 * (p.original_context as f64 / (n_rot * 2.0 * std::f64::consts::PI)).ln())
            / (2.0 * (p.freq_base as f64).ln())
    };
    let low = corr(p.beta_fast as f64).floor().max(0.0);
    let mut high = corr(p.beta_slow as f64).ceil().min(p.n_rot as f64 - 1.0);
    if low == high {
        high += 0.001;
    }
    let (low, span) = (low as f32, (high - low) as f32);
    (0..half)
        .map(|i| {
            let ramp = ((i as f32 - low) / span).clamp(0.0, 1.0);
            let extra_factor = 1.0 - ramp;
            inter[i] * (1.0 - extra_factor) + extra[i] * extra_factor
        })
        .collect()
}
