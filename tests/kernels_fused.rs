//! Property tests of the fused GPU kernels (PHASE, WKB in/out, KQKV split + merge) through their
//! CPU execution (`aubier_kernels_gen::gpu::cpu_exec`, the GPU's order of reduction), against the
//! CPU oracle running the equivalent *unfused* ops: the cases of `aubier_tests::kernels::fused`
//! on the [`Cpu`] executor, which also check each unfused op's own kernels one step at a time.
//! Shapes are random (heads 1..64, odd widths, keys from 1 to 262 144 — the long ones in one
//! dedicated case), values random with ±0, subnormals and large magnitudes; shrinking is on.
//! Each case builds its kernels for warps of 8, 32 or 64 lanes (sampled; the fixed cases take
//! one width each) and runs them at that width.
//!
//! Tolerances: those of the module notes of `aubier_tests::kernels::fused` (PHASE, WKB, KQKV
//! against the oracle and against the exact value) and `aubier_tests::kernels::bounds` (the
//! unfused steps), with the CPU's correctly rounded division and square root.

use aubier_tests::kernels::exec::Cpu;
use aubier_tests::kernels::fused::*;
use proptest::prelude::*;

fn cfg(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(cfg(64))]

    #[test]
    fn phase_matches_oracle(c in phase_cases(&Cpu)) {
        phase(&Cpu, c);
    }

    #[test]
    fn wkb_f32_matches_oracle(c in wkb_f32_cases(&Cpu)) {
        wkb(&Cpu, c);
    }
}

proptest! {
    #![proptest_config(cfg(32))]

    #[test]
    fn wkb_quant_matches_oracle(c in wkb_quant_cases(&Cpu)) {
        wkb(&Cpu, c);
    }

    #[test]
    fn wkb_out_kquant_matches_oracle(c in wkb_out_kquant_cases(&Cpu)) {
        wkb(&Cpu, c);
    }

    #[test]
    fn kqkv_matches_oracle(c in kqkv_cases(&Cpu)) {
        kqkv(&Cpu, c);
    }
}

#[test]
fn phase_at_the_real_shape() {
    phase(&Cpu, phase_real_shape(&Cpu));
}

#[test]
fn wkb_at_the_real_shapes() {
    for c in wkb_real_shapes(&Cpu) {
        wkb(&Cpu, c);
    }
}

#[test]
fn wkb_at_the_bundled_models_shapes() {
    for c in wkb_bundled_shapes(&Cpu) {
        wkb(&Cpu, c);
    }
}

#[test]
fn kqkv_over_the_longest_window() {
    kqkv(&Cpu, kqkv_longest_window(&Cpu));
}

#[test]
fn kqkv_over_a_single_key() {
    kqkv(&Cpu, kqkv_single_key(&Cpu));
}

/// The case proptest once shrank a failure to (kept in `kernels_fused.proptest-regressions`
/// under the strategy of the time): one head of one column and no RoPE part over 1000 keys.
#[test]
fn kqkv_regression_one_column_1000_keys() {
    kqkv(
        &Cpu,
        KqkvCase {
            heads: 1,
            c: 1,
            r: 0,
            t: 1,
            s: 1000,
            seed: 1_694_604_876_071_953,
            scale: 8.0,
            nan_head: false,
            warp: 32,
        },
    );
}
