//! The GPU kernels of the unfused plan steps, through their CPU execution, against the CPU oracle:
//! the cases of `aubier_tests::kernels::steps` (one plan step at a time, the kernels from
//! `gpu::steps::for_step` and bound by `launch::launches` on the plan the oracle runs, so the
//! mapping is tested with them) on the [`Cpu`] executor, its kernels built for warps of 8, 32
//! and 64 lanes (sampled by the property tests, one width per case of the fixed ones); then the
//! bundled model's plans: `generate` (deterministic, deduplicated), the mapping at every width,
//! and the binding of every kernel parameter.
//!
//! Tolerances: those of `aubier_tests::kernels::bounds` with the CPU's correctly rounded
//! division and square root (bit-exact where both sides run the same operations in the same
//! order; dots `2(n + 2)·u·Σ|w·x| + A`; RMSNorm `(n + 10)·u·|ref| + A`; softmax
//! `(2n + 16)·u·|ref| + A`; SiLU `8u·|ref| + A`; RoPE `8u·(|x0| + |x1|)`; the expert FFN
//! through its activations' dot bounds), derived in that module's note.

use aubier_compiler::ops::Op;
use aubier_compiler::types::DType;
use aubier_compiler::{CompileOptions, Target};
use aubier_kernels_gen::gpu::emit::WARP;
use aubier_tests::kernels::exec::{bundled_plan, Cpu};
use aubier_tests::kernels::steps::*;
use aubier_tests::kernels::WARPS;
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    #[test]
    fn mat_mul_f32(c in mat_mul_f32_cases(&Cpu)) {
        mat_mul(&Cpu, c);
    }

    #[test]
    fn mat_mul_quant(c in mat_mul_quant_cases(&Cpu)) {
        mat_mul(&Cpu, c);
    }

    #[test]
    fn mat_mul_every_type_on_gguf_py_blocks(c in every_type_cases(&Cpu)) {
        mat_mul_every_type(&Cpu, c);
    }

    #[test]
    fn rms_norm_and_softmax_match_oracle(c in rows_cases(&Cpu)) {
        rms_norm_and_softmax(&Cpu, c);
    }

    #[test]
    fn elementwise_steps_match_oracle(c in rows_cases(&Cpu)) {
        elementwise(&Cpu, c);
    }

    #[test]
    fn router_top_k_and_renorm(c in router_cases(&Cpu)) {
        router(&Cpu, c);
    }
}

/// Every block type's weights through its mat-vec kernel, one width per type.
#[test]
fn mat_vec_gives_back_gguf_py_weights() {
    for (i, ty) in block_types().into_iter().enumerate() {
        gguf_py_weights_through_mat_vec(&Cpu, ty, WARPS[i % WARPS.len()]);
    }
}

/// The mat-mat form computes its mat-vec's bits at T = 2, 5 and 64, for every type of
/// [`MAT_MAT_TYPES`] at every width of [`WARPS`].
#[test]
fn mat_mat_matches_mat_vec_bit_for_bit() {
    for ty in MAT_MAT_TYPES {
        for warp in WARPS {
            mat_mat_matches_mat_vec(&Cpu, ty, warp);
        }
    }
}

/// The routed experts' mat-mat forms compute the mat-vecs' bits at T = 2, 5 and 64 (gate/up
/// Q2_K, down Q4_K; then IQ2_XXS and Q6_K at another width).
#[test]
fn moe_mat_mat_matches_mat_vec_bit_for_bit() {
    moe_mat_mat_matches_mat_vec(&Cpu, "Q2_K", "Q4_K", WARPS[0]);
    moe_mat_mat_matches_mat_vec(&Cpu, "IQ2_XXS", "Q6_K", WARPS[1]);
}

#[test]
fn moe_ffn_matches_oracle() {
    moe_ffn(&Cpu);
}

#[test]
fn embed_silu_concat_rope_match_oracle() {
    for ty in EMBED_TYPES {
        embed_silu_concat_rope(&Cpu, ty);
    }
}

#[test]
fn softmax_over_keys_matches_oracle() {
    softmax_over_keys(&Cpu);
}

#[test]
fn argmax_matches_a_plain_scan() {
    argmax(&Cpu);
}

/// The bundled model's plan for `target`, `edit` applied to its config first.
fn plan_for(
    target: Target,
    edit: impl FnOnce(&mut aubier_compiler::config::Mistral4Config),
) -> aubier_compiler::plan::Plan {
    bundled_plan(
        &CompileOptions {
            target,
            ..CompileOptions::default()
        },
        edit,
    )
}

/// `generate` covers every step of both plans, is deterministic, shares one kernel across the
/// layers, and names the fused kernels; a graph edit (dropping the query temperature) changes the
/// PHASE kernel and nothing that does not depend on it.
#[test]
fn generate_on_the_bundled_model() {
    use aubier_kernels_gen::gpu::{generate, plan_kernels};
    for target in [Target::Oracle, Target::Gpu] {
        let plan = plan_for(target, |_| {});
        let a = generate(&plan).expect("generate");
        let b = generate(&plan).expect("generate again");
        assert_eq!(a, b, "generation is deterministic");
        let hip = a.iter().filter(|f| f.path.starts_with("hip/")).count();
        let cuda = a.iter().filter(|f| f.path.starts_with("cuda/")).count();
        assert_eq!(hip, cuda);
        let kernels = plan_kernels(&plan, WARP).expect("kernels");
        assert_eq!(kernels.len(), hip);
        let launches: usize = kernels.iter().map(|(_, uses)| uses.len()).sum();
        assert!(
            launches > kernels.len(),
            "layers share kernels: {} kernels for {launches} launches",
            kernels.len()
        );
        let has = |p: &str| a.iter().any(|f| f.path.starts_with(&format!("hip/{p}_")));
        let fused = target == Target::Gpu;
        for p in [
            "phase",
            "wkb_in",
            "wkb_in_mm",
            "wkb_out",
            "wkb_out_mm",
            "kqkv_split",
            "kqkv_merge",
        ] {
            assert_eq!(has(p), fused, "{p} kernels in a {target:?} plan");
        }
        for p in [
            "embed",
            "rms_norm",
            "mat_mul",
            "mat_mul_mm",
            "softmax",
            "top_k",
            "gather_renorm",
            "moe_gate_up",
            "moe_down",
            "moe_route",
            "moe_gate_up_mm",
            "moe_down_mm",
            "moe_combine",
            "add",
        ] {
            assert!(has(p), "{p} kernel missing");
        }
    }
    let with = plan_kernels(&plan_for(Target::Gpu, |_| {}), WARP).expect("kernels");
    let without =
        plan_kernels(&plan_for(Target::Gpu, |c| c.temperature = None), WARP).expect("kernels");
    let names = |ks: &[(aubier_kernels_gen::gpu::ir::Kernel, Vec<usize>)]| -> Vec<String> {
        ks.iter().map(|(k, _)| k.name.clone()).collect()
    };
    let (a, b) = (names(&with), names(&without));
    let changed: Vec<&String> = a.iter().filter(|n| !b.contains(n)).collect();
    assert!(!changed.is_empty(), "the edit changes a kernel");
    assert!(
        changed.iter().all(|n| n.starts_with("phase_")),
        "only PHASE depends on the temperature: {changed:?}"
    );
}

/// Every step of both bundled plans maps to kernels at every tested width, launched by the same
/// steps; a kernel's name depends on its width, and HIP/CUDA refuse the non-32 ones.
#[test]
fn bundled_plans_map_at_every_width() {
    use aubier_kernels_gen::gpu::{plan_kernels, render, GenError};
    for target in [Target::Oracle, Target::Gpu] {
        let plan = plan_for(target, |_| {});
        let at32 = plan_kernels(&plan, WARP).expect("32 lanes");
        for warp in WARPS.into_iter().filter(|&w| w != WARP) {
            let ks = plan_kernels(&plan, warp).expect("kernels");
            assert_eq!(ks.len(), at32.len(), "{target:?} at {warp} lanes");
            for ((k, uses), (k32, uses32)) in ks.iter().zip(&at32) {
                assert_eq!(k.warp, warp);
                assert_eq!(uses, uses32);
                assert_ne!(k.name, k32.name);
                let r = render(&aubier_kernels_gen::gpu::emit::Hip, k, &[]);
                assert!(matches!(r, Err(GenError::Warp { .. })), "{}", k.name);
            }
        }
    }
}

/// `launch::launches` binds every parameter of every kernel of the bundled model's plans (fused
/// and unfused): weights to weight operands (an experts table to a stacked expert tensor), f32 /
/// i32 buffers to values of that type, the cache to a layer of the model, scratch only to the
/// named scratch parameters; every step but an in-place reshape launches something.
#[test]
fn launches_bind_every_parameter_of_the_bundled_plans() {
    use aubier_compiler::plan::{Operand, Storage};
    use aubier_kernels_gen::gpu::ir::ParamKind;
    use aubier_kernels_gen::gpu::launch::{launches, Arg};
    for target in [Target::Oracle, Target::Gpu] {
        let plan = plan_for(target, |_| {});
        for (i, step) in plan.steps.iter().enumerate() {
            let ls = launches(&plan, i, 32).unwrap_or_else(|e| panic!("{e}"));
            let in_place = step.op == Op::Reshape
                && matches!(step.args[0], Operand::Value(v) if plan.values[v].storage == plan.values[step.out].storage);
            assert_eq!(ls.is_empty(), in_place, "step {i} ({})", step.op.name());
            for l in &ls {
                assert_eq!(l.args.len(), l.kernel.params.len());
                for ((name, kind), arg) in l.kernel.params.iter().zip(&l.args) {
                    let what = format!("step {i} kernel {} param {name}: {arg:?}", l.kernel.name);
                    let value_dtype = |v: usize| plan.values[v].dtype;
                    match (kind, arg) {
                        (ParamKind::Weight { .. } | ParamKind::Experts { .. }, Arg::Operand(o)) => {
                            assert!(matches!(step.args[*o], Operand::Weight(_)), "{what}")
                        }
                        (ParamKind::F32 { .. }, Arg::Operand(o)) => match step.args[*o] {
                            Operand::Value(v) => assert_eq!(value_dtype(v), DType::F32, "{what}"),
                            Operand::Weight(_) => panic!("{what}"),
                        },
                        (ParamKind::I32 { .. }, Arg::Operand(o)) => match step.args[*o] {
                            Operand::Value(v) => assert_eq!(value_dtype(v), DType::I32, "{what}"),
                            Operand::Weight(_) => panic!("{what}"),
                        },
                        (ParamKind::F32 { .. }, Arg::Output) => {
                            assert_eq!(value_dtype(step.out), DType::F32, "{what}")
                        }
                        (ParamKind::I32 { .. }, Arg::Output) => {
                            assert_eq!(value_dtype(step.out), DType::I32, "{what}")
                        }
                        (ParamKind::F32 { .. }, Arg::Cache(layer)) => {
                            assert!(*layer < plan.config.n_layer, "{what}");
                            assert_eq!(name, "cache", "{what}");
                        }
                        (ParamKind::F32 { .. }, Arg::Scratch { name: s, .. }) => {
                            assert!(s == "act" || s == "part", "{what}")
                        }
                        (ParamKind::I32 { .. }, Arg::Scratch { name: s, .. }) => {
                            assert_eq!(s, "route", "{what}")
                        }
                        _ => panic!("{what}"),
                    }
                }
            }
            if let Some(Storage::KvCache { .. }) = plan.values.get(step.out).map(|v| v.storage) {
                assert!(ls
                    .iter()
                    .any(|l| l.args.iter().any(|a| matches!(a, Arg::Cache(_)))));
            }
        }
    }
}
